/* SPDX-License-Identifier: MIT */
/* bench/nvfp4_bench.cu - GPU time of the NVFP4 kernels (<mxshard/cuda_nvfp4.h>,
 * issue 18 item 5) against same-mix ceilings measured in the same run.
 *
 *   nvfp4_bench [--out FILE.md] [--csv FILE.csv] [--shapes 8192x8192,4096x14336]
 *               [--reps N] [--k K] [--budget SECONDS] [--no-graph]
 *   nvfp4_bench --profile [--shapes RxC]   (the unit of a profiler run)
 *
 * --out writes the tables as markdown and, unless --csv names another file,
 * the rows as CSV next to it (FILE.csv). Exit status: 0, 1 on an error or a
 * failed byte check, 2 for a bad flag, 77 when there is no CUDA device.
 *
 * Cases, for each shape (default 8192x8192 and 4096x14336), block shape
 * (1x16, 16x16), scale layout (COMPACT, PADDED, SWIZZLED) and plane set
 * (row-only, both):
 *   quantize   mxs_cuda_nvfp4_quantize of a bf16 weight (amax, scale and
 *              cast passes; one call)
 *   writeback  one rank's mxs_cuda_nvfp4_wb_partial + _apply of an f32
 *              master shard, round-through bf16 (uint16 entries), the MAX
 *              reduction EXCLUDED (DP=1 needs none; a DP=8 rank applies its
 *              own partial amaxes, as if reduced - the same work); DP=1 (the
 *              whole weight) and one rank of DP=8 (ranks 0..7 in rotation,
 *              even shards from mxs_nvfp4_bucket_shard). Bytes checked after
 *              timing: DP=1 partial + apply (+ finish); DP=8 all eight
 *              partials, a MAX over the eight packed buffers on the device,
 *              eight applies into one primary (the shared buffer stands in
 *              for the gather), finish - against mxs_cuda_nvfp4_quantize of
 *              the f32 master rounded through bf16 (data, scales, amax).
 *   finish     (both planes) mxs_cuda_nvfp4_wb_finish, the local nibble
 *              transpose after the gather (whole plane, the same at any DP):
 *              from the column stage (1x16) or the row-wise plane (16x16,
 *              which needs no stage and gathers half the bytes).
 *
 * Ceilings (bench_mix FP4, bench_util.h): read the input, write its packed
 * nibbles (half a byte per element per plane) and all scale bytes per plane
 * (COMPACT size; equal to PADDED / SWIZZLED for the default shapes):
 *   quantize   bf16 n -> planes * (n/2 + scales)
 *   DP=1       f32 n -> planes * (n/2 + scales)
 *   DP=8 rank  f32 n/8 -> planes * (n/16 + ALL scales) (every rank writes
 *              every scale), ranks in rotation
 *   finish     cudaMemcpyAsync of ceil(n/2) bytes (read + write)
 * The packed entry buffer (an intermediate) is in no ceiling. % of ceiling =
 * ceiling time / op time, in the same timing mode (graph: against the b2b
 * ceiling).
 *
 * Instruction (ALU) ceiling, measured in the same run (nv_alu_ceiling): the
 * kernels' per-element work without memory - fl32(x * e), the E2M1 rule and
 * the packing of 8 nibbles into a word (mxs_e2m1x8_from_f32, what nv_cast8
 * runs) - at full occupancy on values made in registers, as elements per
 * second; an operation's ALU ceiling is its conversions (quantize, DP=1:
 * n per plane; DP=8 rank: n/8 per plane; finish converts nothing) at that
 * rate. The same kernel with the run-13 rule (the seven-compare-free
 * addition with an integer code, 4 pairs a word; kept here only to measure)
 * gives the previous ceiling. These kernels have had no speed work yet (docs/cuda.md "NVFP4"):
 * the numbers are a baseline, not a target.
 *
 * Reduced bytes per step (beside every writeback row): ours = plan.packed_bytes,
 * ONE MAX all-reduce of 2-byte entries (the block / tile amax's bf16 pattern;
 * 1x16: one per block of each present plane, 16x16: one per tile for either
 * plane set) plus the status entry. 2 bytes is what the NCCL glue sends
 * (mxs_nccl_nvfp4_wb_writeback: ncclBfloat16, exact for these patterns); the
 * Python package on gloo widens each entry to int32 (twice the bytes). TE's
 * sharded NVFP4 master cast (16x16 only): 4 bytes per 16x16 tile (fp32 amax)
 * plus 4 bytes per tensor (the global amax), in TWO all-reduces (as issue 18
 * reads TE's quantize_master_weights); no sharded 1x16 path ("n/a").
 *
 * --profile runs each kernel of interest once on the first shape - both
 * instruction-ceiling kernels; quantize, writeback partial + apply (DP=1,
 * the bench's master) of 1x16 row-only COMPACT; the same with both planes
 * and finish - and exits: `ncu ... nvfp4_bench --profile` profiles exactly
 * those launches (scripts: .gpu-prebuilt run script, RESULTS run 16).
 *
 * Timing: bench_measure (bench_util.h) - single (L2 flushed), b2b, graph -
 * with the repetition counts cut per case so a case takes about 0.3 s
 * (slow kernels get fewer repetitions, never fewer than 3 windows), and a
 * wall-clock budget (--budget, default 75 s): cases past it are skipped
 * and listed. The kernels come from the library's own NVFP4 object files
 * (mxs_cuda_nvfp4_srcs, bench/meson.build), so building this bench does not
 * compile the MXFP8 writeback kernels.
 */
#include <chrono>
#include <memory>

#include <mxshard/cuda.h>
#include <mxshard/cuda_nvfp4.h>
#include <mxshard/mxshard.h>

#include "bench_util.h"
#include "nvfp4_alu.cuh"

static const char *const k_layout_name[] = {"COMPACT", "PADDED", "SWIZZLED"};
static const mxs_scale_layout k_layouts[] = {MXS_SCALES_COMPACT, MXS_SCALES_PADDED, MXS_SCALES_SWIZZLED};
static const char *const k_block_name[] = {"1x16", "16x16"};
static const int k_dp = 8;

/* ---- report --------------------------------------------------------------- */

struct nv_row {
    std::string shape, block, layout, planes, op, shard;
    bench_times t, ceil;
    double alu_us = -1;         /* instruction ceiling (conversions at the measured rate); -1: none */
    double bytes = 0;           /* the ceiling's bytes (input + outputs) */
    int64_t ours = -1, te = -1; /* reduced bytes per step; -1: not a writeback row / n.a. */
    std::string check, note;
};

/* One (shape, block, layout, planes) configuration's results, for the
 * summary table: % of ceiling (b2b) per operation. */
struct nv_summary {
    std::string shape, block, layout, planes;
    double q = -1, w1 = -1, w8 = -1, fin = -1;
    double q_alu = -1, w1_alu = -1, w8_alu = -1; /* % of the instruction ceiling */
    int64_t ours = -1, te = -1;
    std::string check;
};

struct nv_report {
    std::vector<nv_row> rows;
    std::vector<nv_summary> summary;
    std::vector<std::string> ceilings, errors, skipped;
    double copy_gbs = 0;
    double alu_gps = 0, alu_prev_gps = 0; /* conversions per second / 1e9: this rule, run 13's */
    int failed_checks = 0;
};

static std::string fmt_bytes(int64_t v) { return v < 0 ? std::string("n/a") : std::to_string((long long)v); }

static const char *k_row_header =
    "| shape | block | layout | planes | op | shard | single µs | b2b µs | graph µs | ceiling b2b µs | % ceil single "
    "| % ceil b2b | % ceil graph | ALU ceiling µs | % ALU ceil b2b | GB/s b2b | reduced B/step, ours (1 all-reduce) "
    "| TE B/step (2 all-reduces) | check | note |\n"
    "|---|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|\n";

static std::string row_md(const nv_row &r) {
    double gbs = r.t.b2b > 0 ? r.bytes / r.t.b2b / 1e3 : -1;
    bool wb = r.op == "writeback";
    return "| " + r.shape + " | " + r.block + " | " + r.layout + " | " + r.planes + " | " + r.op + " | " + r.shard +
           " | " + bench_fmt("%.1f", r.t.single) + " | " + bench_fmt("%.1f", r.t.b2b) + " | " +
           bench_fmt("%.1f", r.t.graph) + " | " + bench_fmt("%.1f", r.ceil.b2b) + " | " +
           bench_fmt("%.1f %%", bench_pct(r.ceil.single, r.t.single)) + " | " +
           bench_fmt("%.1f %%", bench_pct(r.ceil.b2b, r.t.b2b)) + " | " +
           bench_fmt("%.1f %%", bench_pct(r.ceil.b2b, r.t.graph)) + " | " + bench_fmt("%.1f", r.alu_us) + " | " +
           bench_fmt("%.1f %%", bench_pct(r.alu_us, r.t.b2b)) + " | " + bench_fmt("%.0f", gbs) + " | " +
           (wb ? fmt_bytes(r.ours) : std::string("")) + " | " + (wb ? fmt_bytes(r.te) : std::string("")) + " | " +
           r.check + " | " + r.note + " |\n";
}

static const char *k_summary_header =
    "| shape | block | layout | planes | quantize | writeback DP=1 | writeback DP=8 rank | finish | reduced B/step "
    "ours (1 x uint16 MAX) | TE (2 x fp32 MAX) | checks |\n"
    "|---|---|---|---|---:|---:|---:|---:|---:|---:|---|\n";

/* "memory % / ALU %" of one summary cell. */
static std::string two_pct(double mem, double alu) {
    return bench_fmt("%.0f %%", mem) + (alu >= 0 ? " / " + bench_fmt("%.0f %%", alu) : std::string(""));
}

static std::string summary_md(const nv_summary &s) {
    return "| " + s.shape + " | " + s.block + " | " + s.layout + " | " + s.planes + " | " + two_pct(s.q, s.q_alu) +
           " | " + two_pct(s.w1, s.w1_alu) + " | " + two_pct(s.w8, s.w8_alu) + " | " + bench_fmt("%.0f %%", s.fin) +
           " | " + fmt_bytes(s.ours) + " | " + fmt_bytes(s.te) + " | " + s.check + " |\n";
}

/* ---- NVFP4 tensors in device memory ------------------------------------------ */

static mxs_nvfp4_tensor nv_shape(int64_t rows, int64_t cols, unsigned dirs, mxs_scale_layout layout,
                                 mxs_nvfp4_block block) {
    mxs_nvfp4_tensor t = bench_tensor_shape<mxs_nvfp4_tensor>(rows, cols, dirs, layout);
    t.block = block;
    return t;
}

/* Data and scale plane of every present plane, each 256-aligned, then the
 * amax (256 bytes, so arenas of one shape compare whole). */
static int64_t nv_tensor_bytes(const mxs_nvfp4_tensor &t) { return 256 + bench_planes_bytes(t); }

static void nv_tensor_place(mxs_nvfp4_tensor *t, uint8_t *base, int64_t *off) {
    bench_planes_place(t, base, off);
    t->amax = (float *)(base + *off);
    *off += 256;
}

/* One NVFP4 tensor in one zeroed allocation. */
struct nv_arena {
    uint8_t *mem = nullptr;
    int64_t bytes = 0;
    mxs_nvfp4_tensor t;
    explicit nv_arena(const mxs_nvfp4_tensor &shape) : t(shape) {
        bytes = nv_tensor_bytes(t);
        CK(cudaMalloc(&mem, (size_t)bytes));
        CK(cudaMemset(mem, 0, (size_t)bytes));
        int64_t off = 0;
        nv_tensor_place(&t, mem, &off);
    }
    ~nv_arena() { cudaFree(mem); }
    nv_arena(const nv_arena &) = delete;
    nv_arena &operator=(const nv_arena &) = delete;
};

static int64_t nv_arena_diff(const nv_arena &a, const nv_arena &b, unsigned long long *dcount, cudaStream_t s) {
    return bench_count_diff(a.mem, b.mem, std::min(a.bytes, b.bytes), dcount, s);
}

/* acc[i] = max(acc[i], x[i]) over uint16 entries: the MAX all-reduce of the
 * DP=8 byte check, done on one device. */
__global__ void nv_max_u16(uint16_t *acc, const uint16_t *x, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        acc[i] = x[i] > acc[i] ? x[i] : acc[i];
}

/* ---- one rank's writeback batch ------------------------------------------------ */

/* One item, its plan and packed buffer. Not copyable: the batch points at
 * the item. */
struct nv_wb {
    mxs_nvfp4_wb_item item;
    mxs_nvfp4_wb_batch b;
    mxs_nvfp4_wb_plan plan;
    void *packed = nullptr;
    nv_wb(const mxs_nvfp4_tensor &t, const float *master, int64_t start, int64_t len, uint8_t *stage) {
        memset(&item, 0, sizeof item);
        item.primary = t;
        item.master = master;
        item.master_dtype = MXS_F32;
        item.start = start;
        item.len = len;
        item.col_stage = stage;
        memset(&b, 0, sizeof b);
        b.items = &item;
        b.n_items = 1;
        b.round_through = MXS_BF16; /* TE's master cast: 2-byte entries */
        MK(mxs_nvfp4_wb_make_plan(&b, &plan, NULL));
        CK(cudaMalloc(&packed, (size_t)plan.packed_bytes + 64));
    }
    ~nv_wb() { cudaFree(packed); }
    nv_wb(const nv_wb &) = delete;
    nv_wb &operator=(const nv_wb &) = delete;
    mxs_status step(cudaStream_t s) { /* partial + apply, no reduction */
        mxs_status st = mxs_cuda_nvfp4_wb_partial(&b, &plan, packed, s);
        return st != MXS_OK ? st : mxs_cuda_nvfp4_wb_apply(&b, &plan, packed, s);
    }
};

/* TE's reduced bytes per step for one weight (16x16 only): 4 per tile + 4. */
static int64_t te_bytes(int64_t rows, int64_t cols, mxs_nvfp4_block block) {
    if (block != MXS_NVFP4_16X16) return -1;
    return 4 * mxs_ceil_div(rows, MXS_NVFP4_BLOCK) * mxs_ceil_div(cols, MXS_NVFP4_BLOCK) + 4;
}

/* ---- one shape --------------------------------------------------------------------- */

struct nv_shape_run {
    bench_ctx &B;
    nv_report &R;
    std::chrono::steady_clock::time_point t_start;
    double budget_s;
    int64_t rows, cols, n, half;
    std::string shape;
    uint16_t *src = nullptr;
    float *master = nullptr;
    uint8_t *co0 = nullptr, *co1 = nullptr, *cs0 = nullptr, *cs1 = nullptr, *stage = nullptr;
    unsigned long long *dcount = nullptr;
    mxs_range shard[k_dp];
    bench_times ceil_q[3], ceil_w[3], ceil_d[3], ceil_copy;

    nv_shape_run(bench_ctx &b, nv_report &r, std::chrono::steady_clock::time_point t0, double budget, int64_t rows_,
                 int64_t cols_)
        : B(b), R(r), t_start(t0), budget_s(budget), rows(rows_), cols(cols_) {
        n = rows * cols;
        half = mxs_nvfp4_data_plane_bytes(rows, cols);
        char buf[64];
        snprintf(buf, sizeof buf, "%lldx%lld", (long long)rows, (long long)cols);
        shape = buf;
        int64_t sc = 0; /* the largest scale plane of any layout, for the ceilings' scale stores */
        for (int pl = 1; pl <= 2; pl++) {
            const mxs_nvfp4_tensor t = nv_shape(rows, cols, MXS_BOTH, MXS_SCALES_SWIZZLED, MXS_NVFP4_1X16);
            sc = std::max(sc, mxs_nvfp4_scale_bytes(&t, (mxs_dirs)pl) + 256);
        }
        CK(cudaMalloc(&src, (size_t)n * 2 + 256));
        CK(cudaMalloc(&master, (size_t)n * 4 + 256));
        CK(cudaMalloc(&co0, (size_t)half + 256));
        CK(cudaMalloc(&co1, (size_t)half + 256));
        CK(cudaMalloc(&cs0, (size_t)sc));
        CK(cudaMalloc(&cs1, (size_t)sc));
        CK(cudaMalloc(&stage, (size_t)half + 256));
        CK(cudaMalloc(&dcount, sizeof(unsigned long long)));
        bench_fill<<<1024, 256, 0, B.s>>>((uint32_t *)src, n / 2, 7, 0);
        bench_fill<<<1024, 256, 0, B.s>>>((uint32_t *)master, n + 64, 11, 1);
        CK(cudaGetLastError());
        CK(cudaStreamSynchronize(B.s));
        const int64_t bucket = mxs_nvfp4_bucket_elems(n, k_dp); /* even shards for any shape */
        for (int k = 0; k < k_dp; k++) MK(mxs_nvfp4_bucket_shard(0, n, bucket, k_dp, k, &shard[k]));
    }
    ~nv_shape_run() {
        cudaFree(src);
        cudaFree(master);
        cudaFree(co0);
        cudaFree(co1);
        cudaFree(cs0);
        cudaFree(cs1);
        cudaFree(stage);
        cudaFree(dcount);
    }

    bool over_budget() const { return bench_us_since(t_start) / 1e6 > budget_s; }

    /* The instruction ceiling of `conversions` E2M1 conversions, µs. */
    double alu_us(double conversions) const { return R.alu_gps > 0 ? conversions / R.alu_gps / 1e3 : -1; }

    /* Repetition counts for a case whose call takes about t_us: about
     * 0.1 s of single calls, of b2b windows and of graph windows each. */
    bench_ctx tuned(double t_us) const {
        bench_ctx c = B;
        double t = std::max(t_us, 1.0);
        c.single_reps = std::max(3, std::min(B.single_reps, (int)(100000.0 / (t + 100.0))));
        c.b2b_k = std::max(2, std::min(B.b2b_k, (int)(20000.0 / t)));
        c.b2b_reps = std::max(3, std::min(B.b2b_reps, (int)(100000.0 / (c.b2b_k * t))));
        c.warmup = 1;
        return c;
    }

    /* One timed probe of the rotation's first call (after one untimed call). */
    double probe(const std::vector<bench_call> &calls, const char *what) {
        bench_must(calls[0](B.s), what);
        CK(cudaEventRecord(B.ev0, B.s));
        bench_must(calls[0](B.s), what);
        CK(cudaEventRecord(B.ev1, B.s));
        return 1000.0 * B.elapsed_ms();
    }

    bench_times measure(const std::vector<bench_call> &calls, const char *what, bool graph) {
        bench_ctx c = tuned(probe(calls, what));
        return bench_measure(c, calls, what, graph);
    }

    void add(nv_row r) {
        r.shape = shape;
        if (r.t.graph < 0 && !r.t.graph_why.empty() && r.t.graph_why != "not tried")
            r.note += std::string(r.note.empty() ? "" : "; ") + "no graph: " + r.t.graph_why;
        fputs(row_md(r).c_str(), stdout);
        fflush(stdout);
        R.rows.push_back(r);
    }

    void checked(nv_row &r, int64_t d) {
        r.check = d == 0 ? "ok" : std::to_string((long long)d) + " bytes differ";
        if (d) R.failed_checks++;
    }

    /* Runs one case; a failure becomes an error line, unless the CUDA
     * context is broken (then it propagates: stop). */
    void guard(const std::string &what, const std::function<void()> &f) {
        if (over_budget()) {
            R.skipped.push_back(shape + " " + what);
            return;
        }
        try {
            f();
        } catch (const bench_error &e) {
            if (bench_case_error("nvfp4_bench", shape + " " + what + ": " + e.what(), &R.errors)) throw;
        }
    }

    void ceilings() {
        printf("\n#### %s\n\n%s", shape.c_str(), bench_ceil_header);
        for (int planes = 1; planes <= 2; planes++) {
            const mxs_nvfp4_tensor one = nv_shape(rows, cols, MXS_ROWWISE, MXS_SCALES_COMPACT, MXS_NVFP4_1X16);
            /* the row-wise count for both planes (equal to the column-wise one
             * when rows and cols are multiples of 16, as the default shapes) */
            const int64_t sc = mxs_nvfp4_scale_bytes(&one, MXS_ROWWISE);
            bench_fp4_job q{{src, n, 2, planes, co0, co1, cs0, cs1, sc}};
            bench_fp4_job w{{master, n, 4, planes, co0, co1, cs0, cs1, sc}};
            std::vector<bench_fp4_job> d;
            int64_t dbytes = 0;
            for (int k = 0; k < k_dp; k++) {
                /* input from the shard's first element and output at its first
                 * byte, rounded down to the 16-byte load (4 f32) */
                const int64_t f = shard[k].first / 4 * 4, o = f / 2;
                d.push_back(bench_fp4_job{{master + f, shard[k].count, 4, planes, co0 + o, co1 + o, cs0, cs1, sc}});
                dbytes += 4 * shard[k].count + planes * (shard[k].count / 2 + sc);
            }
            guard("ceiling bf16", [&] { ceil_q[planes] = bench_ceiling_fp4(B, {q}, "ceiling bf16"); });
            guard("ceiling f32", [&] { ceil_w[planes] = bench_ceiling_fp4(B, {w}, "ceiling f32"); });
            guard("ceiling f32 DP=8", [&] { ceil_d[planes] = bench_ceiling_fp4(B, d, "ceiling f32 DP=8"); });
            const bench_ceil_entry list[] = {
                {"bf16 -> %d x (nibbles + scales) (quantize)", &ceil_q[planes], 2.0 * n + planes * (double)(half + sc)},
                {"f32 -> %d x (nibbles + scales) (writeback DP=1)", &ceil_w[planes],
                 4.0 * n + planes * (double)(half + sc)},
                {"f32 shard -> %d x (its nibbles + all scales) (DP=8 rank)", &ceil_d[planes], (double)dbytes / k_dp},
            };
            bench_ceiling_rows(shape, planes, list, sizeof list / sizeof list[0], R.copy_gbs, &R.ceilings);
        }
        guard("ceiling copy", [&] {
            uint8_t *a = co0, *b = co1;
            const int64_t bytes = half;
            ceil_copy = bench_measure(B, {[a, b, bytes](cudaStream_t s) {
                                          return cudaMemcpyAsync(b, a, (size_t)bytes, cudaMemcpyDeviceToDevice, s) ==
                                                         cudaSuccess
                                                     ? MXS_OK
                                                     : MXS_ERR_CUDA;
                                      }},
                                      "ceiling copy", false);
        });
        {
            char line[400];
            double gbs = ceil_copy.b2b > 0 ? 2.0 * half / ceil_copy.b2b / 1e3 : -1;
            snprintf(line, sizeof line,
                     "| %s | copy of one packed plane, ceil(n/2) B (finish) | %.1f | %.1f | %.1f | %.0f | %.1f %% |\n",
                     shape.c_str(), 2.0 * half / 1e6, ceil_copy.single, ceil_copy.b2b, gbs, 100.0 * gbs / R.copy_gbs);
            R.ceilings.push_back(line);
            fputs(line, stdout);
        }
        printf("\n%s", k_row_header);
        fflush(stdout);
    }

    nv_row labelled(const char *op, int bi, int li, unsigned dirs, const std::string &shard_name) const {
        nv_row r;
        r.block = k_block_name[bi];
        r.layout = k_layout_name[li];
        r.planes = dirs == MXS_BOTH ? "both" : "row-only";
        r.op = op;
        r.shard = shard_name;
        return r;
    }

    /* The column stage an item needs: 1x16 with a column-wise plane; 16x16
     * with both planes transposes the gathered row-wise plane instead. */
    uint8_t *stage_for(unsigned dirs, mxs_nvfp4_block block) const {
        return (dirs & MXS_COLWISE) && block == MXS_NVFP4_1X16 ? stage : nullptr;
    }

    /* One configuration: quantize, writeback DP=1, writeback DP=8 rank,
     * finish (both planes). */
    void config(int bi, int li, unsigned dirs) {
        const mxs_nvfp4_block block = bi ? MXS_NVFP4_16X16 : MXS_NVFP4_1X16;
        const int planes = dirs == MXS_BOTH ? 2 : 1;
        const mxs_nvfp4_tensor shp = nv_shape(rows, cols, dirs, k_layouts[li], block);
        const std::string name =
            std::string(k_block_name[bi]) + " " + k_layout_name[li] + " " + (planes == 2 ? "both" : "row-only");
        int64_t sbytes = 0;
        for (int pl = 1; pl <= 2; pl++)
            if (dirs & (unsigned)pl) sbytes += mxs_nvfp4_scale_bytes(&shp, (mxs_dirs)pl);
        nv_summary sum;
        sum.shape = shape;
        sum.block = k_block_name[bi];
        sum.layout = k_layout_name[li];
        sum.planes = planes == 2 ? "both" : "row-only";
        sum.te = te_bytes(rows, cols, block);
        std::vector<std::string> checks;

        guard(name + " quantize", [&] {
            nv_arena a(shp);
            const mxs_nvfp4_tensor t = a.t;
            const uint16_t *in = src;
            nv_row r = labelled("quantize", bi, li, dirs, "whole");
            r.t = measure({[t, in](cudaStream_t s) { return mxs_cuda_nvfp4_quantize(&t, in, MXS_BF16, MXS_F32, s); }},
                          "mxs_cuda_nvfp4_quantize", true);
            r.ceil = ceil_q[planes];
            r.alu_us = alu_us((double)planes * n);
            r.bytes = 2.0 * n + planes * (double)half + (double)sbytes;
            r.note = "bf16 in; amax + scale + cast passes";
            sum.q = bench_pct(r.ceil.b2b, r.t.b2b);
            sum.q_alu = bench_pct(r.alu_us, r.t.b2b);
            add(r);
        });

        /* the reference: whole-tensor quantize of the master rounded through bf16 */
        std::unique_ptr<nv_arena> ref;
        guard(name + " reference", [&] {
            ref.reset(new nv_arena(shp));
            MK(mxs_cuda_nvfp4_quantize(&ref->t, master, MXS_F32, MXS_BF16, B.s));
            CK(cudaStreamSynchronize(B.s));
        });

        guard(name + " writeback DP=1", [&] {
            nv_arena a(shp);
            std::unique_ptr<nv_wb> w(new nv_wb(a.t, master, 0, n, stage_for(dirs, block)));
            nv_wb *p = w.get();
            nv_row r = labelled("writeback", bi, li, dirs, "DP=1");
            r.t = measure({[p](cudaStream_t s) { return p->step(s); }}, "nvfp4 writeback DP=1", true);
            r.ceil = ceil_w[planes];
            r.alu_us = alu_us((double)planes * n);
            r.bytes = 4.0 * n + planes * (double)half + (double)sbytes;
            r.ours = p->plan.packed_bytes;
            r.te = sum.te;
            r.note = "partial + apply (no reduction needed at DP=1)";
            sum.ours = r.ours;
            if (ref) {
                MK(p->step(B.s));
                if (dirs & MXS_COLWISE) MK(mxs_cuda_nvfp4_wb_finish(&p->b, &p->plan, B.s));
                checked(r, nv_arena_diff(a, *ref, dcount, B.s));
                checks.push_back("DP=1 " + r.check);
            }
            sum.w1 = bench_pct(r.ceil.b2b, r.t.b2b);
            sum.w1_alu = bench_pct(r.alu_us, r.t.b2b);
            add(r);
        });

        guard(name + " writeback DP=8", [&] {
            nv_arena a(shp);
            std::vector<std::unique_ptr<nv_wb>> ranks;
            std::vector<bench_call> calls;
            for (int k = 0; k < k_dp; k++) {
                ranks.emplace_back(
                    new nv_wb(a.t, master + shard[k].first, shard[k].first, shard[k].count, stage_for(dirs, block)));
                nv_wb *p = ranks.back().get();
                calls.push_back([p](cudaStream_t s) { return p->step(s); });
            }
            nv_row r = labelled("writeback", bi, li, dirs, "DP=8 rank");
            r.t = measure(calls, "nvfp4 writeback DP=8", true);
            r.ceil = ceil_d[planes];
            r.alu_us = alu_us((double)planes * n / k_dp);
            r.bytes = 4.0 * (double)n / k_dp + planes * (double)half / k_dp + (double)sbytes;
            r.ours = ranks[0]->plan.packed_bytes;
            r.te = sum.te;
            r.note = "partial + apply of 1 rank (ranks 0-7 in rotation; shard n/8, even)";
            if (ref) { /* 8 partials, MAX on the device, 8 applies into one primary, finish */
                const int64_t cnt = ranks[0]->plan.packed_count;
                if (ranks[0]->plan.entry_bytes != 2) bench_fail(__FILE__, __LINE__, "DP=8 check", "entries not 2 B");
                for (auto &w : ranks) MK(mxs_cuda_nvfp4_wb_partial(&w->b, &w->plan, w->packed, B.s));
                uint16_t *acc = (uint16_t *)ranks[0]->packed;
                for (int k = 1; k < k_dp; k++)
                    nv_max_u16<<<256, 256, 0, B.s>>>(acc, (const uint16_t *)ranks[k]->packed, cnt);
                CK(cudaGetLastError());
                for (auto &w : ranks) MK(mxs_cuda_nvfp4_wb_apply(&w->b, &w->plan, acc, B.s));
                if (dirs & MXS_COLWISE) MK(mxs_cuda_nvfp4_wb_finish(&ranks[0]->b, &ranks[0]->plan, B.s));
                checked(r, nv_arena_diff(a, *ref, dcount, B.s));
                checks.push_back("DP=8 " + r.check);
            }
            sum.w8 = bench_pct(r.ceil.b2b, r.t.b2b);
            sum.w8_alu = bench_pct(r.alu_us, r.t.b2b);
            add(r);
        });

        if (dirs & MXS_COLWISE)
            guard(name + " finish", [&] {
                nv_arena a(shp);
                std::unique_ptr<nv_wb> w(new nv_wb(a.t, master, 0, n, stage_for(dirs, block)));
                nv_wb *p = w.get();
                MK(p->step(B.s));
                nv_row r = labelled("finish", bi, li, dirs, "any DP");
                r.t = measure({[p](cudaStream_t s) { return mxs_cuda_nvfp4_wb_finish(&p->b, &p->plan, s); }},
                              "nvfp4 finish", true);
                r.ceil = ceil_copy;
                r.bytes = 2.0 * (double)half;
                r.note = block == MXS_NVFP4_1X16 ? "column stage -> column-wise plane (local transpose)"
                                                 : "row-wise plane -> column-wise plane (no stage; local transpose)";
                sum.fin = bench_pct(r.ceil.b2b, r.t.b2b);
                add(r);
            });

        std::string c;
        for (auto &x : checks) c += (c.empty() ? "" : ", ") + x;
        sum.check = c.empty() ? "–" : c;
        if (sum.q >= 0 || sum.w1 >= 0 || sum.w8 >= 0 || sum.fin >= 0) R.summary.push_back(sum);
    }

    void run_all() {
        ceilings();
        for (int bi = 0; bi < 2; bi++)
            for (unsigned dirs : {(unsigned)MXS_ROWWISE, (unsigned)MXS_BOTH})
                for (int li = 0; li < 3; li++) config(bi, li, dirs);
    }
};

/* ---- --profile ------------------------------------------------------------------- */

/* Each kernel of interest once (see the top comment); byte checks are the
 * timed run's business. */
static void nv_profile(bench_ctx &B, int64_t rows, int64_t cols) {
    const int64_t n = rows * cols;
    uint32_t *sink = nullptr;
    uint16_t *src = nullptr;
    float *master = nullptr;
    uint8_t *stage = nullptr;
    CK(cudaMalloc(&sink, (size_t)B.sms * 8 * 256 * 4));
    CK(cudaMalloc(&src, (size_t)n * 2 + 256));
    CK(cudaMalloc(&master, (size_t)n * 4 + 256));
    CK(cudaMalloc(&stage, (size_t)mxs_nvfp4_data_plane_bytes(rows, cols) + 256));
    bench_fill<<<1024, 256, 0, B.s>>>((uint32_t *)src, n / 2, 7, 0);
    bench_fill<<<1024, 256, 0, B.s>>>((uint32_t *)master, n + 64, 11, 1);
    nv_alu_ceiling<0><<<B.sms * 8, 256, 0, B.s>>>(sink, 256, 0.75f);
    nv_alu_ceiling<1><<<B.sms * 8, 256, 0, B.s>>>(sink, 256, 0.75f);
    CK(cudaGetLastError());
    for (unsigned dirs : {(unsigned)MXS_ROWWISE, (unsigned)MXS_BOTH}) {
        nv_arena a(nv_shape(rows, cols, dirs, MXS_SCALES_COMPACT, MXS_NVFP4_1X16));
        MK(mxs_cuda_nvfp4_quantize(&a.t, src, MXS_BF16, MXS_F32, B.s));
        nv_wb w(a.t, master, 0, n, dirs == MXS_BOTH ? stage : nullptr);
        MK(w.step(B.s));
        if (dirs == MXS_BOTH) MK(mxs_cuda_nvfp4_wb_finish(&w.b, &w.plan, B.s));
        CK(cudaStreamSynchronize(B.s));
    }
    CK(cudaFree(sink));
    CK(cudaFree(src));
    CK(cudaFree(master));
    CK(cudaFree(stage));
}

/* ---- main ------------------------------------------------------------------------ */

static bool parse_shape(const std::string &s, int64_t *r, int64_t *c) {
    long long a = 0, b = 0;
    char x = 0, tail = 0;
    if (sscanf(s.c_str(), "%lld%c%lld%c", &a, &x, &b, &tail) != 3 || x != 'x' || a < 1 || b < 1) return false;
    *r = a;
    *c = b;
    return true;
}

static int bench_main(int argc, char **argv) {
    bench_args args;
    args.shapes = "8192x8192,4096x14336";
    double budget = 75;
    bool profile = false;
    bench_ctx B;
    B.single_reps = 20;
    B.b2b_k = 10;
    B.b2b_reps = 7;
    for (int i = 1; i < argc; i++) {
        if (bench_parse_flag(argc, argv, &i, 3, 2, B, &args)) continue;
        if (std::string(argv[i]) == "--budget" && i + 1 < argc)
            budget = atof(argv[++i]);
        else if (std::string(argv[i]) == "--profile")
            profile = true;
        else {
            fprintf(stderr,
                    "usage: %s [--out FILE.md] [--csv FILE.csv] [--shapes RxC,...] [--reps N] [--k K] "
                    "[--budget SECONDS] [--no-graph] | --profile [--shapes RxC]\n",
                    argv[0]);
            return 2;
        }
    }
    const std::string &shapes_arg = args.shapes;
    std::vector<std::pair<int64_t, int64_t>> shapes;
    for (size_t p = 0; p <= shapes_arg.size();) {
        size_t q = shapes_arg.find(',', p);
        if (q == std::string::npos) q = shapes_arg.size();
        int64_t r, c;
        if (!parse_shape(shapes_arg.substr(p, q - p), &r, &c)) {
            fprintf(stderr, "nvfp4_bench: bad shape '%s' in --shapes (want RxC,...)\n",
                    shapes_arg.substr(p, q - p).c_str());
            return 2;
        }
        shapes.push_back({r, c});
        p = q + 1;
    }
    bench_default_csv(&args);

    std::chrono::steady_clock::time_point t_start;
    bench_device dev;
    if (!bench_open_device("nvfp4_bench", B, &dev, &t_start)) return 77;
    const cudaDeviceProp &prop = dev.prop;
    if (profile) {
        try {
            nv_profile(B, shapes[0].first, shapes[0].second);
        } catch (const bench_error &e) {
            fprintf(stderr, "nvfp4_bench --profile: %s\n", e.what());
            return 1;
        }
        return 0;
    }
    nv_report R;

    { /* copy ceiling: 1 GiB device to device, bytes read + written */
        bench_ctx c = B;
        c.single_reps = 5;
        c.b2b_reps = 5;
        c.b2b_k = 5;
        R.copy_gbs = bench_copy_gbs(c);
        R.alu_gps = nv_alu_gps<0>(c);
        R.alu_prev_gps = nv_alu_gps<1>(c);
    }
    char head[1700];
    snprintf(head, sizeof head,
             "device: %s, %d SMs, L2 %d MiB, CUDA runtime %d, driver %d; library %d; NVFP4 E2M1 conversion: %s\n"
             "copy ceiling (cudaMemcpyAsync D2D, 1 GiB, read + write, b2b): %.0f GB/s\n"
             "instruction ceiling (fl32(x * e) + E2M1 + packing only, full occupancy, no memory): %.1f G elements/s "
             "(mxs_e2m1x8_from_f32, the kernels' path); run 13's rule: %.1f G elements/s\n"
             "timing: single = 1 call, L2 flushed before it, median of <= %d; b2b = K <= %d calls in a row / K "
             "(K rounded up to a multiple of 8 for the DP=8 ranks), median of <= %d windows; graph = each call "
             "captured once, K replays / K; repetitions cut per case to ~0.3 s (at least 3 single calls, 3 "
             "windows); budget %.0f s\n"
             "writeback: f32 master, round-through bf16 (2-byte entries), the MAX reduction excluded; reduced "
             "B/step = the one uint16 MAX all-reduce's bytes (ncclBfloat16 in the NCCL glue; the Python package "
             "on gloo widens to int32: x2); TE = 4 B per 16x16 tile + 4 B per tensor in two fp32 all-reduces "
             "(16x16 only)\n\n",
             prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20, dev.rt, dev.drv, mxs_cuda_version(),
             prop.major >= 10 ? "hardware cvt where built for sm_100a/f, else software" : "software (exact rule)",
             R.copy_gbs, R.alu_gps, R.alu_prev_gps, B.single_reps, B.b2b_k, B.b2b_reps, budget);
    fputs(head, stdout);

    try {
        for (auto &sh : shapes) {
            nv_shape_run S(B, R, t_start, budget, sh.first, sh.second);
            S.run_all();
        }
    } catch (const bench_error &e) {
        bench_run_stopped("nvfp4_bench", e, &R.errors);
    }

    std::string rows;
    for (auto &r : R.rows) rows += row_md(r);
    std::string md = bench_md_head(" (NVFP4)", head, R.ceilings, k_row_header, rows);
    printf("\n");
    bench_emit(&md, "\n### NVFP4 summary: % of the same-mix ceiling (b2b), reduced bytes per step\n\n");
    bench_emit(&md, k_summary_header);
    for (auto &s : R.summary) bench_emit(&md, summary_md(s));
    if (!R.skipped.empty()) {
        bench_emit(&md, "\n### Skipped (time budget)\n\n");
        for (auto &s : R.skipped) bench_emit(&md, "* " + s + "\n");
    }
    bench_emit_end(&md, R.errors, R.failed_checks, t_start);

    if (!bench_write_md("nvfp4_bench", args.out, md)) return 1;
    if (!args.csv.empty()) {
        FILE *f = bench_open_out("nvfp4_bench", args.csv);
        if (!f) return 1;
        fprintf(f, "shape,block,layout,planes,op,shard,single_us,b2b_us,graph_us,ceil_single_us,ceil_b2b_us,"
                   "pct_ceil_single,pct_ceil_b2b,pct_ceil_graph,bytes,reduced_ours,reduced_te,check\n");
        for (auto &r : R.rows)
            fprintf(f, "%s,%s,%s,%s,%s,%s,%.2f,%.2f,%.2f,%.2f,%.2f,%.1f,%.1f,%.1f,%.0f,%lld,%lld,%s\n",
                    bench_csvq(r.shape).c_str(), bench_csvq(r.block).c_str(), bench_csvq(r.layout).c_str(),
                    bench_csvq(r.planes).c_str(), bench_csvq(r.op).c_str(), bench_csvq(r.shard).c_str(), r.t.single,
                    r.t.b2b, r.t.graph, r.ceil.single, r.ceil.b2b, bench_pct(r.ceil.single, r.t.single),
                    bench_pct(r.ceil.b2b, r.t.b2b), bench_pct(r.ceil.b2b, r.t.graph), r.bytes, (long long)r.ours,
                    (long long)r.te, bench_csvq(r.check).c_str());
        fclose(f);
    }
    return R.failed_checks || !R.errors.empty() ? 1 : 0;
}

int main(int argc, char **argv) {
    try {
        return bench_main(argc, argv);
    } catch (const std::exception &e) {
        fprintf(stderr, "nvfp4_bench: %s\n", e.what());
        return 1;
    }
}
