/* SPDX-License-Identifier: MIT */
/* bench/cuda_bench.cu - GPU time of mxshard's kernels against same-mix
 * ceilings measured in the same run, judged against the targets of issue 17
 * ("writeback kernels at the bandwidth limit where training runs them").
 *
 *   cuda_bench [--out FILE.md] [--csv FILE.csv] [--reps N] [--k K]
 *              [--shapes 8192x8192,28672x4096] [--cases LIST] [--no-graph]
 *
 * --cases: a comma list of quantize, dp1, dp8, bucket200, megatron (default:
 * all). --shapes picks the shapes of the first four (default 8192x8192,
 * 16384x6144, 4096x14336, 28672x4096); megatron is one fixed bucket, run
 * once. --out writes the tables as markdown (for bench/RESULTS.md) and,
 * unless --csv names another file, the rows as CSV next to it (FILE.csv).
 * MXS_BENCH_MD=FILE is the old spelling of --out. Progress lines ("[time]
 * case, layout") go to stdout only. Exit status: 0, 1 on an error or a
 * failed byte check, 2 for a bad flag, 77 when there is no CUDA device.
 *
 * Every case runs in every scale layout (COMPACT, PADDED, SWIZZLED); the
 * per-shape cases also for both plane sets (row-only, both). Writeback is f32
 * masters, round-through bf16, FUSED, through the prepared bucket
 * (mxs_cuda_wb_prepare once, then mxs_cuda_wb_bucket_partial + _apply per
 * call); no reduction is timed: one GPU simulates one rank.
 *
 *   quantize   mxs_cuda_quantize of a bf16 weight (the copy-back), one call.
 *   dp1        writeback DP=1 of the whole weight (partial + apply); bytes
 *              checked against mxs_cuda_quantize of the bf16-rounded master.
 *   dp8        one rank of DP=8 (shard n/8), ranks 0..7 in rotation:
 *                "DP=8 aligned"          start r*n/8;
 *                "DP=8 start+13 len-30"  start r*n/8 + 13, len n/8 - 30
 *                  (start, end and len not multiples of 8 or 32); the master
 *                  laid out like the whole weight (pointer = whole master +
 *                  start: address - 4*start is 16-byte aligned, so 16-byte
 *                  loads of the weight's 4-element groups stay aligned);
 *                "DP=8 start+13 len-30, element-aligned master"  the same
 *                  shard from the rank's own 16-byte-aligned shard buffer
 *                  (address - 4*start only 4-byte aligned).
 *              Bytes checked as a group (below).
 *   bucket200  200 weights of rows/200 (+1) rows each (40 or 41 for 8192:
 *              never a multiple of 32), the same total bytes as one weight,
 *              DP=1; bytes checked against 200 quantize calls; also the
 *              one-shot mxs_cuda_wb_partial/apply (validation every call)
 *              and the host time of each phase call.
 *   megatron   the linear weights of 4 transformer layers at hidden 4096 in
 *              ONE flat bucket, back to back in this order; per layer l:
 *                qkv 6144x4096 (both planes), proj 4096x4096 (row-only),
 *                fc1 28672x4096 (both), fc2 4096x14336 (row-only), then one
 *                small dense weight: 1x4096 (row-only), 3x4096 (both),
 *                8x4096 (row-only), 3x4097 (both) for l = 0, 1, 2, 3;
 *              then 4096x128 (both): 21 weights, 873,000,963 elements
 *              (3x4097 makes the total odd, so the equal ranges start at odd
 *              element offsets: rank r of layer 0 at r mod 32).
 *              Sharded as a distributed optimizer does: the bucket padded to
 *              a multiple of DP, rank r owns [r*chunk, (r+1)*chunk) ignoring
 *              weight boundaries, each weight's piece mxs_bucket_shard
 *              (geometry.h); a rank lists all 21 items, len 0 where it owns
 *              nothing (it still writes their scales). Its master shard is
 *              ONE 16-byte-aligned f32 buffer of its chunk; item i's master
 *              points into it, so the alignment follows the shard start.
 *              DP=8 (chunk 109,125,121) and DP=64 (chunk 13,640,641); rows:
 *              rank 3 alone, and ranks 1,3,6,7 (DP=8) / 3,17,42,63 (DP=64) in
 *              rotation (each with its own master buffer). A separate table
 *              gives each rank's shard, ceiling and "structure bound".
 *
 * Same-mix ceiling (bench_mix, bench_util.h): reads the operation's input
 * bytes and writes its output bytes (data planes + scale planes in the
 * layout, padding included), no math, measured in the same run and the same
 * timing mode (ceilings of equal bytes are measured once):
 *   quantize   bf16 n -> per plane n + its scale bytes;
 *   dp1, bucket200  f32 n -> per plane n + its scale bytes (the packed
 *              exponent buffer, an intermediate, is NOT in the ceiling);
 *   dp8        f32 n/8 -> per plane n/8 + ALL its scale bytes (every rank
 *              writes every scale), ranks in rotation;
 *   megatron   the rank's shard f32 -> its shard's data bytes per present
 *              plane (1 B/elem for row-only items, 2 for both) + EVERY scale
 *              byte of the bucket in the layout (all items, all planes):
 *              4*(a1 + a2) + a1 + 2*a2 + S, a1/a2 the shard's elements of
 *              row-only / two-plane items, S all scale bytes.
 *              Structure bound (information, not a target): the ceiling
 *              plus the packed exponent buffer written once and read once
 *              (2 * plan.packed_bytes), at the ceiling's b2b bandwidth - a
 *              rank must zero-fill/write the packed buffer before the
 *              reduction and read it back after, so this is the floor of the
 *              design.
 * % of ceiling = ceiling time / op time; "b2b / ceil" is its inverse.
 *
 * Byte checks, after the timed calls:
 *   dp1, bucket200  the whole arena (planes and gaps) against the quantize
 *              reference.
 *   dp8, megatron   (a) the group: every rank's partial on the zeroed
 *              primaries (megatron: each rank of the DP in turn, from one
 *              scratch shard buffer), the MAX of their packed buffers on the
 *              device, against the reference's COMPACT scales in packed
 *              order (contract 3.2: that MAX is the exponent of the global
 *              amax); (b) each timed rank alone: zeroed primaries, its
 *              partial, the reference exponents in place of the all-reduce,
 *              its apply; then its slice of every present data plane and
 *              EVERY scale plane (padding included) against the reference.
 *              A rank that leaves a scale unwritten fails (b).
 *
 * Targets (issue 17, judged on b2b; the summary lists each with its worst
 * case): see k_targets below.
 */
#include <chrono>
#include <map>
#include <memory>
#include <tuple>

#include <mxshard/cuda.h>
#include <mxshard/mxshard.h>

#include "bench_util.h"

static const char *const k_layout_name[] = {"COMPACT", "PADDED", "SWIZZLED"};
static const mxs_scale_layout k_layouts[] = {MXS_SCALES_COMPACT, MXS_SCALES_PADDED, MXS_SCALES_SWIZZLED};

/* ---- cases and targets -------------------------------------------------- */

enum : unsigned {
    CASE_QUANTIZE = 1u,
    CASE_DP1 = 2u,
    CASE_DP8 = 4u,
    CASE_BUCKET200 = 8u,
    CASE_MEGATRON = 16u,
    CASE_SHAPES = CASE_QUANTIZE | CASE_DP1 | CASE_DP8 | CASE_BUCKET200,
    CASE_ALL = CASE_SHAPES | CASE_MEGATRON,
};

static const struct {
    const char *name;
    unsigned bit;
} k_cases[] = {{"quantize", CASE_QUANTIZE},
               {"dp1", CASE_DP1},
               {"dp8", CASE_DP8},
               {"bucket200", CASE_BUCKET200},
               {"megatron", CASE_MEGATRON}};

/* The case bits of a comma list ("all" = every case); false on an unknown
 * name or an empty list. */
static bool parse_cases(const std::string &list, unsigned *out) {
    unsigned bits = 0;
    size_t pos = 0;
    while (pos <= list.size()) {
        size_t comma = list.find(',', pos);
        std::string name = list.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
        bool known = name == "all";
        if (known) bits |= CASE_ALL;
        for (const auto &c : k_cases)
            if (name == c.name) {
                bits |= c.bit;
                known = true;
            }
        if (!known) return false;
        if (comma == std::string::npos) break;
        pos = comma + 1;
    }
    *out = bits;
    return bits != 0;
}

/* Issue 17's targets. Rows carry a target id and a bound: min_pct (b2b % of
 * the ceiling >= min_pct) or max_x (b2b time / ceiling <= max_x); ratios a
 * max_ratio. */
static const struct {
    const char *id, *text;
} k_targets[] = {
    {"quantize", "quantize bf16 (copy-back), every layout: ≥ 92 % of the same-mix ceiling"},
    {"dp1", "writeback DP=1, one weight, every layout, row-only and both: ≥ 90 %"},
    {"bucket200", "writeback DP=1, 200-weight bucket, every layout: ≥ 85 %"},
    {"dp8", "writeback DP=8 rank (aligned start), every layout: ≥ 80 %"},
    {"dp8-align", "DP=8 rank, start+13 len-30 and element-aligned master: ≤ 1.10x the aligned rank"},
    {"megatron", "Megatron-like bucket, DP=8 and DP=64 rank: ≤ 1.25x its ceiling (shard + all scales)"},
};

/* ---- report ------------------------------------------------------------- */

struct result_row {
    std::string shape, op, planes, layout, shard, api;
    bench_times t, ceil;
    double bytes = 0;      /* the ceiling's bytes (input + outputs) */
    std::string target_id; /* k_targets id, "" for none */
    double min_pct = -1;   /* target: b2b % of ceiling >= min_pct; -1: none */
    double max_x = -1;     /* target: b2b time / ceiling b2b <= max_x; -1: none */
    std::string check;     /* byte check: "ok", "N bytes differ", "" */
    std::string note;
};

struct ratio_row {
    std::string shape, what, target_id;
    double single = -1, b2b = -1, graph = -1;
    double max_ratio = -1; /* target: b2b ratio <= max_ratio; -1: none */
};

struct report {
    std::vector<result_row> rows;
    std::vector<ratio_row> ratios;
    std::vector<std::string> ceilings; /* markdown rows */
    std::vector<std::string> host;     /* markdown rows */
    std::vector<std::string> mega;     /* markdown rows */
    std::vector<std::string> errors;
    double copy_gbs = 0;
    int failed_checks = 0;
    std::chrono::steady_clock::time_point t_start;

    /* A progress line on stdout (not in the markdown). */
    void progress(const std::string &what) const {
        printf("[%7.1f s] %s\n", bench_us_since(t_start) / 1e6, what.c_str());
        fflush(stdout);
    }
};

static double ratio(double a, double b) { return a > 0 && b > 0 ? a / b : -1; }

static std::string row_target(const result_row &r) {
    if (r.min_pct >= 0) return bench_fmt("≥ %.0f %%", r.min_pct);
    if (r.max_x >= 0) return bench_fmt("≤ %.2fx ceil", r.max_x);
    return "–";
}
static std::string row_verdict(const result_row &r) {
    if (r.min_pct >= 0) return bench_pct(r.ceil.b2b, r.t.b2b) >= r.min_pct ? "PASS" : "MISS";
    if (r.max_x >= 0) {
        double x = ratio(r.t.b2b, r.ceil.b2b);
        return x > 0 && x <= r.max_x ? "PASS" : "MISS";
    }
    return "";
}
static std::string ratio_verdict(const ratio_row &q) {
    if (q.max_ratio < 0) return "";
    return q.b2b > 0 && q.b2b <= q.max_ratio ? "PASS" : "MISS";
}

static const char *k_row_header =
    "| shape | op | planes | layout | shard | api | single µs | b2b µs | graph µs | ceiling b2b µs | b2b / ceil | "
    "% ceil single | % ceil b2b | % ceil graph | GB/s b2b | % copy b2b | target (b2b) | verdict | check | note |\n"
    "|---|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|---|\n";

static std::string row_md(const report &R, const result_row &r) {
    double gbs = r.t.b2b > 0 ? r.bytes / r.t.b2b / 1e3 : -1;
    std::string s = "| " + r.shape + " | " + r.op + " | " + r.planes + " | " + r.layout + " | " + r.shard + " | " +
                    r.api + " | " + bench_fmt("%.1f", r.t.single) + " | " + bench_fmt("%.1f", r.t.b2b) + " | " +
                    bench_fmt("%.1f", r.t.graph) + " | " + bench_fmt("%.1f", r.ceil.b2b) + " | " +
                    bench_fmt("%.2fx", ratio(r.t.b2b, r.ceil.b2b)) + " | " +
                    bench_fmt("%.1f %%", bench_pct(r.ceil.single, r.t.single)) + " | " +
                    bench_fmt("%.1f %%", bench_pct(r.ceil.b2b, r.t.b2b)) + " | " +
                    bench_fmt("%.1f %%", bench_pct(r.ceil.b2b, r.t.graph)) + " | " + bench_fmt("%.0f", gbs) + " | " +
                    bench_fmt("%.1f %%", gbs > 0 ? 100.0 * gbs / R.copy_gbs : -1) + " | " + row_target(r) + " | " +
                    row_verdict(r) + " | " + r.check + " | " + r.note + " |\n";
    return s;
}

static const char *k_ratio_header = "| shape | ratio | single | b2b | graph | target (b2b) | verdict |\n"
                                    "|---|---|---:|---:|---:|---|---|\n";

static std::string ratio_md(const ratio_row &q) {
    return "| " + q.shape + " | " + q.what + " | " + bench_fmt("%.2fx", q.single) + " | " + bench_fmt("%.2fx", q.b2b) +
           " | " + bench_fmt("%.2fx", q.graph) + " | " +
           (q.max_ratio < 0 ? std::string("–") : bench_fmt("≤ %.2fx", q.max_ratio)) + " | " + ratio_verdict(q) + " |\n";
}

static const char *k_mega_header =
    "| DP | rank(s) | layout | shard elems (row-only + both) | first item, start mod 32 | ceiling MB | ceiling b2b µs "
    "| single µs | b2b µs | graph µs | b2b / ceil | graph / ceil | structure bound b2b µs | b2b / structure | target "
    "| verdict | check |\n"
    "|---:|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|\n";

/* A result row's labels: operation, planes, layout, shard, API. */
static result_row labelled(const char *op, const std::string &planes, int li, const std::string &shard,
                           const char *api) {
    result_row r;
    r.op = op;
    r.planes = planes;
    r.layout = k_layout_name[li];
    r.shard = shard;
    r.api = api;
    return r;
}
static std::string planes_name(unsigned dirs) { return dirs == 3 ? "both" : "row-only"; }

/* ---- device memory ------------------------------------------------------ */

/* One device allocation, freed with its owner. */
struct dev_buf {
    void *p = nullptr;
    explicit dev_buf(size_t bytes) { CK(cudaMalloc(&p, bytes)); }
    ~dev_buf() { cudaFree(p); }
    dev_buf(const dev_buf &) = delete;
    dev_buf &operator=(const dev_buf &) = delete;
    template <class T> T *as() const { return static_cast<T *>(p); }
};

static mxs_tensor tensor_shape(int64_t rows, int64_t cols, unsigned dirs, mxs_scale_layout layout) {
    return bench_tensor_shape<mxs_tensor>(rows, cols, dirs, layout);
}

/* Bytes for one tensor's planes, each data and scale plane 256-aligned. */
static int64_t tensor_bytes(const mxs_tensor &t) { return bench_planes_bytes(t); }

/* Places t's planes at base + *off and advances *off. */
static void tensor_place(mxs_tensor *t, uint8_t *base, int64_t *off) { bench_planes_place(t, base, off); }

/* All scale bytes of t's present planes in its layout. */
static int64_t tensor_scale_bytes(const mxs_tensor &t) {
    int64_t b = 0;
    for (int pl = 1; pl <= 2; pl++)
        if (t.dirs & (unsigned)pl) b += mxs_scale_bytes(&t, (mxs_dirs)pl);
    return b;
}

static const uint8_t *plane_data(const mxs_tensor &t, int pl) { return pl == 1 ? t.row_data : t.col_data; }
static const uint8_t *plane_scale(const mxs_tensor &t, int pl) { return pl == 1 ? t.row_scale : t.col_scale; }

/* A set of tensors in one zeroed allocation (gaps stay 0, so two arenas of
 * the same shapes compare byte for byte). */
struct arena {
    uint8_t *mem = nullptr;
    int64_t bytes = 0;
    std::vector<mxs_tensor> t;
    arena(const std::vector<mxs_tensor> &shapes) : t(shapes) {
        for (const mxs_tensor &x : t) bytes += tensor_bytes(x);
        CK(cudaMalloc(&mem, (size_t)bytes));
        CK(cudaMemset(mem, 0, (size_t)bytes));
        int64_t off = 0;
        for (mxs_tensor &x : t) tensor_place(&x, mem, &off);
    }
    ~arena() { cudaFree(mem); }
    arena(const arena &) = delete;
    arena &operator=(const arena &) = delete;
};

static int64_t arena_diff(const arena &a, const arena &b, unsigned long long *dcount, cudaStream_t s) {
    return bench_count_diff(a.mem, b.mem, std::min(a.bytes, b.bytes), dcount, s);
}

/* acc[i] = max(acc[i], p[i]): the MAX all-reduce of a group's packed
 * buffers, on one device. */
__global__ void bench_max_into(uint8_t *acc, const uint8_t *p, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        acc[i] = p[i] > acc[i] ? p[i] : acc[i];
}

/* ---- one writeback batch ------------------------------------------------ */

/* A batch with its plan, packed buffer, a prepared bucket and two
 * workspaces (the bucket's, and one for the one-shot calls, which must never
 * overwrite the bucket's work list). Not copyable: the bucket stays where
 * it was prepared. */
struct wb_set {
    std::vector<mxs_wb_item> items;
    mxs_wb_batch b;
    mxs_wb_plan plan;
    uint8_t *packed = nullptr;
    void *ws = nullptr;
    int64_t wsb = 0;
    mxs_cuda_wb_bucket bucket;
    void *bws = nullptr;
    int64_t bwsb = 0;
    bool prepared = false;
    wb_set() { memset(&bucket, 0, sizeof bucket); }
    wb_set(const wb_set &) = delete;
    wb_set &operator=(const wb_set &) = delete;

    void setup(cudaStream_t s) {
        memset(&b, 0, sizeof b);
        b.items = items.data();
        b.n_items = (int64_t)items.size();
        b.round_through = MXS_BF16;
        b.mode = MXS_WB_FUSED;
        MK(mxs_wb_make_plan(&b, &plan, NULL));
        MK(mxs_cuda_wb_workspace_bytes(&b, &wsb));
        CK(cudaMalloc(&packed, (size_t)plan.packed_bytes + 64));
        CK(cudaMalloc(&ws, (size_t)wsb + 64));
        memset(&bucket, 0, sizeof bucket);
        MK(mxs_cuda_wb_prepare_bytes(&b, &bwsb));
        CK(cudaMalloc(&bws, (size_t)bwsb + 64));
        MK(mxs_cuda_wb_prepare(&bucket, &b, &plan, packed, bws, bwsb, s));
        CK(cudaStreamSynchronize(s));
        prepared = true;
    }
    mxs_status oneshot(cudaStream_t s) {
        mxs_status st = mxs_cuda_wb_partial(&b, &plan, packed, ws, wsb, s);
        return st != MXS_OK ? st : mxs_cuda_wb_apply(&b, &plan, packed, ws, wsb, s);
    }
    mxs_status run(cudaStream_t s) {
        mxs_status st = mxs_cuda_wb_bucket_partial(&bucket, s);
        return st != MXS_OK ? st : mxs_cuda_wb_bucket_apply(&bucket, s);
    }
    ~wb_set() {
        if (prepared && mxs_cuda_wb_bucket_release(&bucket) != MXS_OK)
            fprintf(stderr, "cuda_bench: bucket release failed\n");
        cudaFree(bws);
        cudaFree(packed);
        cudaFree(ws);
    }
};

static mxs_wb_item wb_item(const mxs_tensor &t, const float *master, int64_t start, int64_t len) {
    mxs_wb_item it;
    memset(&it, 0, sizeof it);
    it.primary = t;
    it.master = master;
    it.master_dtype = MXS_F32;
    it.start = start;
    it.len = len;
    return it;
}

static std::vector<bench_call> wb_calls(const std::vector<wb_set *> &sets) {
    std::vector<bench_call> calls;
    for (wb_set *p : sets) calls.push_back([p](cudaStream_t s) { return p->run(s); });
    return calls;
}
static std::vector<wb_set *> wb_ptrs(const std::vector<std::unique_ptr<wb_set>> &sets) {
    std::vector<wb_set *> v;
    for (const auto &w : sets) v.push_back(w.get());
    return v;
}

/* ---- the group's exponents and one rank's bytes ------------------------- */

/* The packed buffer after the group's MAX all-reduce, built from the
 * reference: item i's COMPACT scales (ref[i], in the items' layout,
 * converted) at its slot, then the status byte 0. w: any rank's set of the
 * group (the packed layout depends only on shapes and planes). */
static void reduced_exponents(const wb_set &w, const std::vector<mxs_tensor> &ref, uint8_t *reduced, cudaStream_t s) {
    std::vector<mxs_wb_slot> slots(w.items.size());
    mxs_wb_plan p;
    MK(mxs_wb_make_plan(&w.b, &p, slots.data()));
    for (size_t i = 0; i < w.items.size(); i++) {
        const mxs_tensor &r = ref[i];
        const mxs_tensor c = tensor_shape(r.rows, r.cols, r.dirs, MXS_SCALES_COMPACT);
        for (int pl = 1; pl <= 2; pl++) {
            if (!(r.dirs & (unsigned)pl)) continue;
            uint8_t *dst = reduced + (pl == 1 ? slots[i].row_offset : slots[i].col_offset);
            if (r.scale_layout == MXS_SCALES_COMPACT)
                CK(cudaMemcpyAsync(dst, plane_scale(r, pl), (size_t)mxs_scale_bytes(&c, (mxs_dirs)pl),
                                   cudaMemcpyDeviceToDevice, s));
            else
                MK(mxs_cuda_convert_scales(r.rows, r.cols, (mxs_dirs)pl, r.scale_layout, plane_scale(r, pl),
                                           MXS_SCALES_COMPACT, dst, s));
        }
    }
    CK(cudaMemsetAsync(reduced + p.status_offset, 0, 1, s));
}

/* The group check (a): on zeroed primaries (prim, prim_bytes), each rank's
 * partial in turn (run_rank(q, acc) runs rank q's partial and MAXes its
 * packed buffer into acc), against the reduced exponents. Differing bytes. */
static int64_t group_exponents_diff(int nranks, const std::function<void(int, uint8_t *)> &run_rank, uint8_t *prim,
                                    int64_t prim_bytes, const uint8_t *reduced, int64_t packed_bytes,
                                    unsigned long long *dcount, cudaStream_t s) {
    dev_buf acc((size_t)packed_bytes + 64);
    CK(cudaMemsetAsync(prim, 0, (size_t)prim_bytes, s));
    CK(cudaMemsetAsync(acc.p, 0, (size_t)packed_bytes, s));
    for (int q = 0; q < nranks; q++) run_rank(q, acc.as<uint8_t>());
    return bench_count_diff(acc.as<uint8_t>(), reduced, packed_bytes, dcount, s);
}

/* Rank w's partial, its packed buffer MAXed into acc. */
static void partial_into(wb_set &w, uint8_t *acc, cudaStream_t s) {
    MK(mxs_cuda_wb_bucket_partial(&w.bucket, s));
    bench_max_into<<<1024, 256, 0, s>>>(acc, w.packed, w.plan.packed_bytes);
    CK(cudaGetLastError());
}

/* The rank check (b): rank w alone on zeroed primaries (prim, prim_bytes):
 * partial, the reduced exponents in place of the all-reduce, apply; then its
 * slice of each present data plane and every scale plane (padding included)
 * against the reference (ref[i] placed like item i's primary). Differing
 * bytes. */
static int64_t rank_diff(wb_set &w, uint8_t *prim, int64_t prim_bytes, const uint8_t *reduced,
                         const std::vector<mxs_tensor> &ref, unsigned long long *dcount, cudaStream_t s) {
    CK(cudaMemsetAsync(prim, 0, (size_t)prim_bytes, s));
    MK(mxs_cuda_wb_bucket_partial(&w.bucket, s));
    CK(cudaMemcpyAsync(w.packed, reduced, (size_t)w.plan.packed_bytes, cudaMemcpyDeviceToDevice, s));
    MK(mxs_cuda_wb_bucket_apply(&w.bucket, s));
    int64_t d = 0;
    for (size_t i = 0; i < w.items.size(); i++) {
        const mxs_wb_item &it = w.items[i];
        const mxs_tensor &t = it.primary, &r = ref[i];
        for (int pl = 1; pl <= 2; pl++) {
            if (!(t.dirs & (unsigned)pl)) continue;
            if (it.len > 0)
                d += bench_count_diff(plane_data(t, pl) + it.start, plane_data(r, pl) + it.start, it.len, dcount, s);
            d += bench_count_diff(plane_scale(t, pl), plane_scale(r, pl), mxs_scale_bytes(&t, (mxs_dirs)pl), dcount, s);
        }
    }
    return d;
}

static std::string check_text(int64_t group, int64_t ranks) {
    if (group == 0 && ranks == 0) return "ok";
    return std::to_string(group + ranks) + " bytes differ (group exponents " + std::to_string(group) +
           ", rank slices + scales " + std::to_string(ranks) + ")";
}

/* Host time of each phase call (enqueue only: the stream is idle before
 * each call, so no call waits for the GPU), median of `reps`. */
struct host_cost {
    double prepare = -1, partial = -1, apply = -1, oneshot_partial = -1, oneshot_apply = -1;
};

static host_cost measure_host(wb_set &w, cudaStream_t s, int reps) {
    host_cost h;
    std::vector<double> a, b;
    for (int i = 0; i < reps; i++) {
        CK(cudaStreamSynchronize(s));
        auto t0 = std::chrono::steady_clock::now();
        MK(mxs_cuda_wb_partial(&w.b, &w.plan, w.packed, w.ws, w.wsb, s));
        a.push_back(bench_us_since(t0));
        t0 = std::chrono::steady_clock::now();
        MK(mxs_cuda_wb_apply(&w.b, &w.plan, w.packed, w.ws, w.wsb, s));
        b.push_back(bench_us_since(t0));
    }
    h.oneshot_partial = bench_median(a);
    h.oneshot_apply = bench_median(b);
    {
        std::vector<double> p;
        a.clear();
        b.clear();
        for (int i = 0; i < reps; i++) {
            CK(cudaStreamSynchronize(s));
            auto t0 = std::chrono::steady_clock::now();
            MK(mxs_cuda_wb_bucket_partial(&w.bucket, s));
            a.push_back(bench_us_since(t0));
            t0 = std::chrono::steady_clock::now();
            MK(mxs_cuda_wb_bucket_apply(&w.bucket, s));
            b.push_back(bench_us_since(t0));
        }
        h.partial = bench_median(a);
        h.apply = bench_median(b);
        for (int i = 0; i < std::max(3, reps / 10); i++) {
            CK(cudaStreamSynchronize(s));
            MK(mxs_cuda_wb_bucket_release(&w.bucket));
            auto t0 = std::chrono::steady_clock::now();
            MK(mxs_cuda_wb_prepare(&w.bucket, &w.b, &w.plan, w.packed, w.bws, w.bwsb, s));
            p.push_back(bench_us_since(t0));
        }
        h.prepare = bench_median(p);
    }
    CK(cudaStreamSynchronize(s));
    return h;
}

/* Runs one case; a failure becomes an error line and an empty result,
 * unless the CUDA context is broken (then it propagates: stop). */
static bench_times guarded(report &R, const std::string &what, const std::function<bench_times()> &f) {
    try {
        return f();
    } catch (const bench_error &e) {
        if (bench_case_error("cuda_bench", what + ": " + e.what(), &R.errors)) throw;
        return bench_times();
    }
}

static void add_row(report &R, result_row r) {
    if (r.t.graph < 0 && !r.t.graph_why.empty() && r.t.graph_why != "not tried")
        r.note += "; no graph: " + r.t.graph_why;
    std::string line = row_md(R, r);
    fputs(line.c_str(), stdout);
    fflush(stdout);
    R.rows.push_back(r);
}

static std::unique_ptr<dev_buf> dev_alloc(size_t bytes) { return std::unique_ptr<dev_buf>(new dev_buf(bytes)); }

/* ---- one shape ---------------------------------------------------------- */

struct shape_run {
    bench_ctx &B;
    report &R;
    const unsigned cases;
    int64_t rows, cols, n, n8;
    std::string shape;
    std::unique_ptr<dev_buf> src_b, mbf_b, master_b, shards_b, co0_b, co1_b, cs0_b, cs1_b, dcount_b;
    uint16_t *src = nullptr, *mbf = nullptr;
    float *master = nullptr;
    float *shards = nullptr; /* DP=8: rank r's shard of the start+13 cases at shards + r * shard_stride */
    int64_t shard_stride = 0;
    uint8_t *co0 = nullptr, *co1 = nullptr, *cs0 = nullptr, *cs1 = nullptr;
    unsigned long long *dcount = nullptr;
    std::map<std::tuple<int, int, int64_t>, bench_times> ceil_cache; /* (kind, planes, scale bytes) */

    static const int k_bucket_weights = 200;

    /* The 200 weights' shapes: rows/200 (+1) rows each. */
    std::vector<mxs_tensor> bucket_shapes(unsigned dirs, int li) const {
        std::vector<mxs_tensor> v;
        const int nw = k_bucket_weights;
        for (int i = 0; i < nw; i++)
            v.push_back(tensor_shape(rows * (i + 1) / nw - rows * i / nw, cols, dirs, k_layouts[li]));
        return v;
    }

    shape_run(bench_ctx &b, report &r, unsigned cases_, int64_t rows_, int64_t cols_)
        : B(b), R(r), cases(cases_), rows(rows_), cols(cols_) {
        n = rows * cols;
        n8 = n / 8;
        char buf[64];
        snprintf(buf, sizeof buf, "%lldx%lld", (long long)rows, (long long)cols);
        shape = buf;
        if ((cases & (CASE_DP8 | CASE_BUCKET200)) && rows < k_bucket_weights)
            throw bench_error(shape + ": dp8 and bucket200 need at least 200 rows");
        /* the ceilings' scale planes: the largest per-plane share of any case */
        int64_t scale_cap = 0;
        for (unsigned dirs : {1u, 3u})
            for (int li = 0; li < 3; li++) {
                const int planes = dirs == 3 ? 2 : 1;
                int64_t sb = tensor_scale_bytes(tensor_shape(rows, cols, dirs, k_layouts[li]));
                if (cases & CASE_BUCKET200) {
                    int64_t bb = 0;
                    for (const mxs_tensor &x : bucket_shapes(dirs, li)) bb += tensor_scale_bytes(x);
                    sb = std::max(sb, bb);
                }
                scale_cap = std::max(scale_cap, (sb + planes - 1) / planes);
            }
        src_b = dev_alloc((size_t)n * 2 + 256);
        mbf_b = dev_alloc((size_t)n * 2 + 256);
        master_b = dev_alloc((size_t)n * 4 + 256);
        co0_b = dev_alloc((size_t)n + 256);
        co1_b = dev_alloc((size_t)n + 256);
        cs0_b = dev_alloc((size_t)scale_cap + 256);
        cs1_b = dev_alloc((size_t)scale_cap + 256);
        dcount_b = dev_alloc(sizeof(unsigned long long));
        src = src_b->as<uint16_t>();
        mbf = mbf_b->as<uint16_t>();
        master = master_b->as<float>();
        co0 = co0_b->as<uint8_t>();
        co1 = co1_b->as<uint8_t>();
        cs0 = cs0_b->as<uint8_t>();
        cs1 = cs1_b->as<uint8_t>();
        dcount = dcount_b->as<unsigned long long>();
        bench_fill<<<1024, 256, 0, B.s>>>((uint32_t *)src, n / 2, 7, 0);
        bench_fill<<<1024, 256, 0, B.s>>>((uint32_t *)master, n + 64, 11, 1);
        bench_to_bf16<<<1024, 256, 0, B.s>>>(master, mbf, n);
        CK(cudaGetLastError());
        if (cases & CASE_DP8) { /* each rank's start+13 shard in its own 16-byte-aligned buffer */
            shard_stride = (n8 + 63) / 64 * 64;
            shards_b = dev_alloc((size_t)(8 * shard_stride) * 4);
            shards = shards_b->as<float>();
            for (int rank = 0; rank < 8; rank++)
                CK(cudaMemcpyAsync(shards + rank * shard_stride, master + rank * n8 + 13, (size_t)(n8 - 30) * 4,
                                   cudaMemcpyDeviceToDevice, B.s));
        }
        CK(cudaStreamSynchronize(B.s));
    }

    void add(result_row r) {
        r.shape = shape;
        add_row(R, r);
    }
    void add_ratio(const std::string &what, const std::string &target_id, const bench_times &a, const bench_times &b,
                   double max_ratio) {
        ratio_row q;
        q.shape = shape;
        q.what = what;
        q.target_id = target_id;
        q.single = ratio(a.single, b.single);
        q.b2b = ratio(a.b2b, b.b2b);
        q.graph = ratio(a.graph, b.graph);
        q.max_ratio = max_ratio;
        R.ratios.push_back(q);
    }
    bench_times guard(const std::string &what, const std::function<bench_times()> &f) {
        return guarded(R, shape + " " + what, f);
    }

    /* The same-mix ceiling of a case, measured once per (kind, planes, scale
     * bytes): kind 0 bf16 n in (quantize), 1 f32 n in (DP=1 writeback), 2 f32
     * n/8 in (a DP=8 rank, ranks in rotation); out 1 byte per element per
     * plane and scale_total bytes of scales in all (split over the planes). */
    bench_times ceiling(int kind, int planes, int64_t scale_total) {
        const auto key = std::make_tuple(kind, planes, scale_total);
        auto it = ceil_cache.find(key);
        if (it != ceil_cache.end()) return it->second;
        const int64_t per_plane = (scale_total + planes - 1) / planes, step = n8 / 4 * 4;
        std::vector<bench_mix_job> jobs;
        double bytes;
        std::string name;
        char mb[64];
        snprintf(mb, sizeof mb, "%.2f MB", scale_total / 1e6);
        if (kind == 0) {
            jobs.push_back({src, n, 2, planes, co0, co1, cs0, cs1, per_plane});
            bytes = 2.0 * n + planes * (double)n + (double)scale_total;
            name = std::string("bf16 -> %d B/elem + scales ") + mb + " (quantize)";
        } else if (kind == 1) {
            jobs.push_back({master, n, 4, planes, co0, co1, cs0, cs1, per_plane});
            bytes = 4.0 * n + planes * (double)n + (double)scale_total;
            name = std::string("f32 -> %d B/elem + scales ") + mb + " (writeback DP=1)";
        } else {
            for (int r = 0; r < 8; r++)
                jobs.push_back({master + r * step, n8, 4, planes, co0 + r * step, co1 + r * step, cs0, cs1, per_plane});
            bytes = 4.0 * n8 + planes * (double)n8 + (double)scale_total;
            name = std::string("f32 shard n/8 -> %d B/elem + ALL scales ") + mb + " (DP=8 rank)";
        }
        bench_times t = guard("ceiling " + name, [&] { return bench_ceiling(B, jobs, "ceiling"); });
        const bench_ceil_entry e = {name.c_str(), &t, bytes};
        bench_ceiling_rows(shape, planes, &e, 1, R.copy_gbs, &R.ceilings);
        ceil_cache[key] = t;
        return t;
    }

    /* Records a byte check: d differing bytes (0: ok). */
    void checked(result_row &r, int64_t d) {
        r.check = d == 0 ? "ok" : std::to_string(d) + " bytes differ";
        if (d) R.failed_checks++;
    }

    bench_times quantize(unsigned dirs, int li) {
        const int planes = dirs == 3 ? 2 : 1;
        arena a({tensor_shape(rows, cols, dirs, k_layouts[li])});
        const mxs_tensor t = a.t[0];
        const int64_t sb = tensor_scale_bytes(t);
        const uint16_t *in = src;
        std::vector<bench_call> calls = {
            [t, in](cudaStream_t s) { return mxs_cuda_quantize(&t, in, MXS_BF16, MXS_ROUND_CEIL, s); }};
        result_row r = labelled("quantize bf16", planes_name(dirs), li, "whole", "quantize");
        r.ceil = ceiling(0, planes, sb);
        r.t = bench_measure(B, calls, "mxs_cuda_quantize", true);
        r.bytes = 2.0 * n + planes * (double)n + (double)sb;
        r.target_id = "quantize";
        r.min_pct = 92;
        r.note = "1 call";
        add(r);
        return r.t;
    }

    /* DP=1 writeback of the whole weight; bytes checked against quantize of
     * the bf16 copy of the master. */
    bench_times writeback_dp1(unsigned dirs, int li) {
        const int planes = dirs == 3 ? 2 : 1;
        const mxs_tensor shp = tensor_shape(rows, cols, dirs, k_layouts[li]);
        const int64_t sb = tensor_scale_bytes(shp);
        arena a({shp}), ref({shp});
        std::vector<std::unique_ptr<wb_set>> sets;
        sets.emplace_back(new wb_set);
        sets[0]->items.push_back(wb_item(a.t[0], master, 0, n));
        sets[0]->setup(B.s);
        result_row r = labelled("writeback f32 rt-bf16", planes_name(dirs), li, "DP=1", "bucket");
        r.ceil = ceiling(1, planes, sb);
        r.t = bench_measure(B, wb_calls(wb_ptrs(sets)), "writeback DP=1", true);
        r.bytes = 4.0 * n + planes * (double)n + (double)sb;
        r.target_id = "dp1";
        r.min_pct = 90;
        r.note = "partial+apply";
        MK(mxs_cuda_quantize(&ref.t[0], mbf, MXS_BF16, MXS_ROUND_CEIL, B.s));
        checked(r, arena_diff(a, ref, dcount, B.s));
        add(r);
        return r.t;
    }

    /* One rank of DP=8, ranks 0..7 in rotation. kind 0: aligned; 1: start
     * + 13, len - 30, master = whole master + start (address - 4*start
     * 16-byte aligned); 2: the same shard from the rank's own 16-byte-aligned
     * buffer (element-aligned master). Bytes checked as a group (header). */
    bench_times writeback_dp8(unsigned dirs, int li, int kind) {
        static const char *const kind_name[] = {"DP=8 aligned", "DP=8 start+13 len-30",
                                                "DP=8 start+13 len-30, element-aligned master"};
        const int planes = dirs == 3 ? 2 : 1;
        const mxs_tensor shp = tensor_shape(rows, cols, dirs, k_layouts[li]);
        const int64_t sb = tensor_scale_bytes(shp);
        arena a({shp}), ref({shp});
        std::vector<std::unique_ptr<wb_set>> sets;
        for (int rank = 0; rank < 8; rank++) {
            int64_t start = rank * n8, len = n8;
            const float *m = master + start;
            if (kind > 0) {
                start += 13;
                len -= 30;
                m = kind == 1 ? master + start : shards + rank * shard_stride;
            }
            sets.emplace_back(new wb_set);
            sets.back()->items.push_back(wb_item(a.t[0], m, start, len));
            sets.back()->setup(B.s);
        }
        result_row r = labelled("writeback f32 rt-bf16", planes_name(dirs), li, kind_name[kind], "bucket");
        r.ceil = ceiling(2, planes, sb);
        r.t = bench_measure(B, wb_calls(wb_ptrs(sets)), "writeback DP=8", true);
        r.bytes = 4.0 * n8 + planes * (double)n8 + (double)sb;
        if (kind == 0) {
            r.target_id = "dp8";
            r.min_pct = 80;
        }
        r.note = "ranks 0-7 in rotation";
        { /* byte check: the group's exponents, then each rank alone */
            MK(mxs_cuda_quantize(&ref.t[0], mbf, MXS_BF16, MXS_ROUND_CEIL, B.s));
            const int64_t pb = sets[0]->plan.packed_bytes;
            dev_buf reduced((size_t)pb + 64);
            reduced_exponents(*sets[0], ref.t, reduced.as<uint8_t>(), B.s);
            /* the shifted shards (kind > 0) leave 30 elements at every
             * rank boundary uncovered, so the group's MAX is not the whole
             * tensor's there: only the rank check applies */
            int64_t g = kind > 0 ? 0
                                 : group_exponents_diff(
                                       8, [&](int q, uint8_t *acc) { partial_into(*sets[(size_t)q], acc, B.s); }, a.mem,
                                       a.bytes, reduced.as<uint8_t>(), pb, dcount, B.s);
            int64_t d = 0;
            for (auto &w : sets) d += rank_diff(*w, a.mem, a.bytes, reduced.as<uint8_t>(), ref.t, dcount, B.s);
            r.check = check_text(g, d);
            if (kind > 0 && g == 0 && d == 0) r.check = "ok (rank slices + scales; the shifted shards leave gaps)";
            if (g || d) R.failed_checks++;
        }
        add(r);
        return r.t;
    }

    /* 200 weights of rows/200 (+1) rows each, same total as one weight. */
    bench_times bucket(unsigned dirs, int li) {
        const int nw = k_bucket_weights, planes = dirs == 3 ? 2 : 1;
        const std::vector<mxs_tensor> shapes = bucket_shapes(dirs, li);
        int64_t sb = 0;
        for (const mxs_tensor &x : shapes) sb += tensor_scale_bytes(x);
        arena a(shapes), ref(shapes);
        std::vector<std::unique_ptr<wb_set>> sets;
        sets.emplace_back(new wb_set);
        int64_t off = 0;
        for (int i = 0; i < nw; i++) {
            int64_t e = a.t[i].rows * cols;
            sets[0]->items.push_back(wb_item(a.t[i], master + off, 0, e));
            MK(mxs_cuda_quantize(&ref.t[i], mbf + off, MXS_BF16, MXS_ROUND_CEIL, B.s));
            off += e;
        }
        sets[0]->setup(B.s);
        result_row r = labelled("writeback f32 rt-bf16", planes_name(dirs), li, "DP=1, 200 weights", "bucket");
        r.ceil = ceiling(1, planes, sb);
        r.t = bench_measure(B, wb_calls(wb_ptrs(sets)), "writeback bucket", true);
        r.bytes = 4.0 * n + planes * (double)n + (double)sb;
        r.target_id = "bucket200";
        r.min_pct = 85;
        checked(r, arena_diff(a, ref, dcount, B.s));
        host_cost h = measure_host(*sets[0], B.s, 50);
        char note[256];
        const int64_t one = tensor_scale_bytes(tensor_shape(rows, cols, dirs, k_layouts[li]));
        snprintf(note, sizeof note, "%lld..%lld rows per weight; scale bytes %.2f MB (one weight: %.2f MB)",
                 (long long)(rows / nw), (long long)((rows + nw - 1) / nw), sb / 1e6, one / 1e6);
        r.note = note;
        add(r);
        { /* the same batch through the one-shot calls (validation + work list every call) */
            wb_set *p = sets[0].get();
            result_row o = r;
            o.api = "one-shot";
            o.t = bench_measure(B, {[p](cudaStream_t s) { return p->oneshot(s); }}, "one-shot bucket", true);
            o.target_id = "";
            o.min_pct = -1;
            o.check = "";
            o.note = "same batch, mxs_cuda_wb_partial + _apply";
            add(o);
        }
        char line[512];
        snprintf(line, sizeof line, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", shape.c_str(), r.planes.c_str(),
                 r.layout.c_str(), bench_fmt("%.1f", h.prepare).c_str(), bench_fmt("%.1f", h.partial).c_str(),
                 bench_fmt("%.1f", h.apply).c_str(), bench_fmt("%.1f", h.oneshot_partial).c_str(),
                 bench_fmt("%.1f", h.oneshot_apply).c_str());
        R.host.push_back(line);
        return r.t;
    }

    void run_all() {
        printf("\n#### %s\n\n%s", shape.c_str(), k_row_header);
        fflush(stdout);
        for (unsigned dirs : {1u, 3u}) {
            const std::string pn = planes_name(dirs);
            bench_times q[3], w[3];
            if (cases & CASE_QUANTIZE) {
                for (int li = 0; li < 3; li++) {
                    const std::string what = std::string("quantize ") + pn + " " + k_layout_name[li];
                    R.progress(shape + " " + what);
                    q[li] = guard(what, [&] { return quantize(dirs, li); });
                }
                add_ratio("quantize " + pn + ": SWIZZLED / COMPACT", "", q[2], q[0], -1);
                add_ratio("quantize " + pn + ": PADDED / COMPACT", "", q[1], q[0], -1);
            }
            if (cases & CASE_DP1)
                for (int li = 0; li < 3; li++) {
                    const std::string what = std::string("dp1 writeback ") + pn + " " + k_layout_name[li];
                    R.progress(shape + " " + what);
                    w[li] = guard(what, [&] { return writeback_dp1(dirs, li); });
                }
            if (cases & CASE_DP8)
                for (int li = 0; li < 3; li++) {
                    const std::string p = std::string("DP=8 ") + pn + " " + k_layout_name[li] + ": ";
                    R.progress(shape + " dp8 " + pn + " " + k_layout_name[li]);
                    bench_times al = guard(p + "aligned", [&] { return writeback_dp8(dirs, li, 0); });
                    bench_times un = guard(p + "start+13 len-30", [&] { return writeback_dp8(dirs, li, 1); });
                    bench_times ua = guard(p + "start+13 len-30, element-aligned master",
                                           [&] { return writeback_dp8(dirs, li, 2); });
                    add_ratio(p + "start+13 len-30 / aligned", "dp8-align", un, al, 1.10);
                    add_ratio(p + "start+13 len-30, element-aligned master / aligned", "dp8-align", ua, al, 1.10);
                    if (cases & CASE_DP1) add_ratio(p + "aligned / DP=1 (information)", "", al, w[li], -1);
                }
            if (cases & CASE_BUCKET200)
                for (int li = 0; li < 3; li++) {
                    const std::string what = std::string("bucket200 ") + pn + " " + k_layout_name[li];
                    R.progress(shape + " " + what);
                    bench_times bk = guard(what, [&] { return bucket(dirs, li); });
                    if (cases & CASE_DP1)
                        add_ratio(std::string("200-weight bucket ") + pn + " " + k_layout_name[li] +
                                      " / one weight (information)",
                                  "", bk, w[li], -1);
                }
        }
    }
};

/* ---- the Megatron-like bucket ------------------------------------------- */

struct mega_weight {
    std::string name;
    int64_t rows, cols;
    unsigned dirs;
};

/* The bucket, in order (header comment). */
static std::vector<mega_weight> megatron_weights() {
    static const int64_t small[4][2] = {{1, 4096}, {3, 4096}, {8, 4096}, {3, 4097}};
    static const unsigned small_dirs[4] = {1u, 3u, 1u, 3u};
    std::vector<mega_weight> w;
    for (int l = 0; l < 4; l++) {
        const std::string L = "L" + std::to_string(l) + ".";
        w.push_back({L + "qkv", 6144, 4096, 3u});
        w.push_back({L + "proj", 4096, 4096, 1u});
        w.push_back({L + "fc1", 28672, 4096, 3u});
        w.push_back({L + "fc2", 4096, 14336, 1u});
        w.push_back({L + "small", small[l][0], small[l][1], small_dirs[l]});
    }
    w.push_back({"out", 4096, 128, 3u});
    return w;
}

/* What one rank's items hold: a1 / a2 shard elements of row-only / two-plane
 * items; the first item it owns part of and that part's start. */
struct shard_mix {
    int64_t a1 = 0, a2 = 0, first_start = 0;
    int first_item = -1, owned_items = 0;
};

static shard_mix mix_of(const std::vector<mxs_wb_item> &items) {
    shard_mix m;
    for (size_t i = 0; i < items.size(); i++) {
        const mxs_wb_item &it = items[i];
        if (it.len == 0) continue;
        (it.primary.dirs == 3u ? m.a2 : m.a1) += it.len;
        if (m.first_item < 0) {
            m.first_item = (int)i;
            m.first_start = it.start;
        }
        m.owned_items++;
    }
    return m;
}

struct megatron_run {
    bench_ctx &B;
    report &R;
    const std::vector<mega_weight> W;
    std::vector<int64_t> off; /* each weight's bucket offset */
    int64_t total = 0, max_elems = 0, prim_bytes = 0;
    std::unique_ptr<dev_buf> prim_b, ref_b, bf_b, dcount_b;
    std::vector<mxs_tensor> prim, ref; /* placed in the current layout */
    bool placed = false;               /* prim and ref are complete */
    static const uint32_t k_seed = 23;
    const std::string shape = "megatron 4L h4096";

    megatron_run(bench_ctx &b, report &r) : B(b), R(r), W(megatron_weights()) {
        for (const mega_weight &w : W) {
            off.push_back(total);
            total += w.rows * w.cols;
            max_elems = std::max(max_elems, w.rows * w.cols);
        }
        for (int li = 0; li < 3; li++) {
            int64_t pb = 0;
            for (const mega_weight &w : W) pb += tensor_bytes(tensor_shape(w.rows, w.cols, w.dirs, k_layouts[li]));
            prim_bytes = std::max(prim_bytes, pb);
        }
        prim_b = dev_alloc((size_t)prim_bytes);
        ref_b = dev_alloc((size_t)prim_bytes);
        bf_b = dev_alloc((size_t)max_elems * 2 + 256);
        dcount_b = dev_alloc(sizeof(unsigned long long));
    }

    /* Places the primaries and the reference in layout li; the reference is
     * mxs_cuda_quantize of each weight's bf16-rounded master (the fill's
     * bucket elements, generated per weight). */
    void place(int li) {
        placed = false;
        prim.clear();
        ref.clear();
        int64_t po = 0, ro = 0;
        for (const mega_weight &w : W) {
            mxs_tensor t = tensor_shape(w.rows, w.cols, w.dirs, k_layouts[li]), u = t;
            tensor_place(&t, prim_b->as<uint8_t>(), &po);
            tensor_place(&u, ref_b->as<uint8_t>(), &ro);
            prim.push_back(t);
            ref.push_back(u);
        }
        CK(cudaMemsetAsync(ref_b->p, 0, (size_t)prim_bytes, B.s));
        uint16_t *bf = bf_b->as<uint16_t>();
        for (size_t i = 0; i < W.size(); i++) {
            bench_fill_at<<<1024, 256, 0, B.s>>>(bf, W[i].rows * W[i].cols, off[i], k_seed, 1);
            CK(cudaGetLastError());
            MK(mxs_cuda_quantize(&ref[i], bf, MXS_BF16, MXS_ROUND_CEIL, B.s));
        }
        CK(cudaStreamSynchronize(B.s));
        placed = true;
    }

    /* Rank r's items at DP dp (chunk elements per rank): every weight, its
     * piece from mxs_bucket_shard; m is the rank's master shard (chunk f32,
     * element 0 = bucket element r*chunk). */
    std::vector<mxs_wb_item> items(int dp, int64_t chunk, int r, const float *m) const {
        std::vector<mxs_wb_item> v;
        for (size_t i = 0; i < W.size(); i++) {
            const mxs_range g = mxs_bucket_shard(off[i], W[i].rows * W[i].cols, chunk * dp, dp, r);
            const float *p = g.count > 0 ? m + (off[i] + g.first - (int64_t)r * chunk) : nullptr;
            v.push_back(wb_item(prim[i], p, g.count > 0 ? g.first : 0, g.count));
        }
        return v;
    }

    void run(int li, int dp, const std::vector<int> &ranks) {
        const int64_t chunk = (total + dp - 1) / dp; /* the bucket padded to dp * chunk */
        const size_t n_r = ranks.size();
        size_t i3 = 0;
        while (i3 + 1 < n_r && ranks[i3] != 3) i3++;
        std::string rl;
        for (int r : ranks) rl += (rl.empty() ? "" : ",") + std::to_string(r);
        R.progress(shape + " DP=" + std::to_string(dp) + " " + k_layout_name[li] + ": ranks " + rl);

        /* each timed rank's master shard: its own 16-byte-aligned buffer */
        std::vector<std::unique_ptr<dev_buf>> masters;
        std::vector<std::unique_ptr<wb_set>> sets;
        std::vector<shard_mix> mixes;
        for (size_t k = 0; k < n_r; k++) {
            masters.push_back(dev_alloc((size_t)chunk * 4 + 256));
            bench_fill_at<<<1024, 256, 0, B.s>>>(masters[k]->p, chunk, (int64_t)ranks[k] * chunk, k_seed, 0);
            CK(cudaGetLastError());
            sets.emplace_back(new wb_set);
            sets[k]->items = items(dp, chunk, ranks[k], masters[k]->as<float>());
            sets[k]->setup(B.s);
            mixes.push_back(mix_of(sets[k]->items));
        }
        const int64_t S = [&] {
            int64_t s = 0;
            for (const mxs_tensor &t : prim) s += tensor_scale_bytes(t);
            return s;
        }();
        const int64_t pb = sets[0]->plan.packed_bytes;

        /* ceilings: shard f32 in; a1 + 2*a2 data bytes and S scale bytes out
         * (one stream: a1 + a2 bytes as data, a2 + S as 16-byte vectors) */
        dev_buf out((size_t)(2 * chunk + S) + 1024);
        std::vector<bench_mix_job> jobs;
        std::vector<double> bytes;
        for (size_t k = 0; k < n_r; k++) {
            const shard_mix &m = mixes[k];
            const int64_t elems = (m.a1 + m.a2) / 4 * 4;
            uint8_t *o = out.as<uint8_t>();
            jobs.push_back({masters[k]->p, elems, 4, 1, o, nullptr, o + bench_align256(elems), nullptr, m.a2 + S});
            bytes.push_back(4.0 * (m.a1 + m.a2) + m.a1 + 2.0 * m.a2 + (double)S);
        }
        const bench_times c1 = guarded(R, shape + " ceiling", [&] { return bench_ceiling(B, {jobs[i3]}, "ceiling"); });
        const bench_times cr = guarded(R, shape + " ceiling", [&] { return bench_ceiling(B, jobs, "ceiling"); });
        double rot_bytes = 0;
        for (double x : bytes) rot_bytes += x / (double)n_r;
        {
            char nm[160];
            snprintf(nm, sizeof nm, "DP=%d rank 3 shard f32 -> its bytes + ALL scales %.2f MB (mixed planes)", dp,
                     S / 1e6);
            const bench_ceil_entry e1 = {nm, &c1, bytes[i3]};
            bench_ceiling_rows(shape, 0, &e1, 1, R.copy_gbs, &R.ceilings);
            snprintf(nm, sizeof nm, "DP=%d ranks %s in rotation, the same mix", dp, rl.c_str());
            const bench_ceil_entry er = {nm, &cr, rot_bytes};
            bench_ceiling_rows(shape, 0, &er, 1, R.copy_gbs, &R.ceilings);
        }

        /* the op */
        const std::vector<wb_set *> all = wb_ptrs(sets);
        const bench_times t1 = bench_measure(B, wb_calls({all[i3]}), "writeback megatron", true);
        const bench_times tr = bench_measure(B, wb_calls(all), "writeback megatron", true);

        /* byte checks (header): the group's exponents over all dp ranks, from
         * one scratch shard buffer; then each timed rank alone */
        int64_t g = 0;
        std::vector<int64_t> d(n_r, 0);
        {
            dev_buf reduced((size_t)pb + 64);
            reduced_exponents(*sets[0], ref, reduced.as<uint8_t>(), B.s);
            dev_buf scratch((size_t)chunk * 4 + 256);
            g = group_exponents_diff(
                dp,
                [&](int q, uint8_t *acc) {
                    bench_fill_at<<<1024, 256, 0, B.s>>>(scratch.p, chunk, (int64_t)q * chunk, k_seed, 0);
                    CK(cudaGetLastError());
                    wb_set w;
                    w.items = items(dp, chunk, q, scratch.as<float>());
                    w.setup(B.s);
                    partial_into(w, acc, B.s);
                    CK(cudaStreamSynchronize(B.s)); /* w's buffers are freed next */
                },
                prim_b->as<uint8_t>(), prim_bytes, reduced.as<uint8_t>(), pb, dcount_b->as<unsigned long long>(), B.s);
            for (size_t k = 0; k < n_r; k++)
                d[k] = rank_diff(*sets[k], prim_b->as<uint8_t>(), prim_bytes, reduced.as<uint8_t>(), ref,
                                 dcount_b->as<unsigned long long>(), B.s);
        }
        int64_t d_all = 0;
        for (int64_t x : d) d_all += x;
        if (g || d_all) R.failed_checks++;

        auto starts = [&](size_t k) {
            const shard_mix &m = mixes[k];
            if (m.first_item < 0) return std::string("owns nothing");
            return W[(size_t)m.first_item].name + " @" + std::to_string(m.first_start) +
                   " (mod 32 = " + std::to_string(m.first_start % 32) + ")";
        };
        for (int rot = 0; rot < 2; rot++) {
            const bench_times &t = rot ? tr : t1, &c = rot ? cr : c1;
            const double by = rot ? rot_bytes : bytes[i3];
            result_row r = labelled("writeback f32 rt-bf16", "mixed", li,
                                    rot ? "DP=" + std::to_string(dp) + " ranks " + rl + " in rotation"
                                        : "DP=" + std::to_string(dp) + " rank " + std::to_string(ranks[i3]),
                                    "bucket");
            r.shape = shape;
            r.t = t;
            r.ceil = c;
            r.bytes = by;
            r.target_id = "megatron";
            r.max_x = 1.25;
            r.check = check_text(g, rot ? d_all : d[i3]);
            const double sbound = c.b2b > 0 ? c.b2b * (by + 2.0 * (double)pb) / by : -1;
            const shard_mix &m = mixes[i3];
            char note[400];
            if (rot)
                snprintf(note, sizeof note, "%zu ranks; structure bound %s µs (b2b / structure %s)", n_r,
                         bench_fmt("%.1f", sbound).c_str(), bench_fmt("%.2fx", ratio(t.b2b, sbound)).c_str());
            else
                snprintf(note, sizeof note,
                         "%d of %zu items, %lld row-only + %lld both elems, from %s; packed %.2f MB; structure "
                         "bound %s µs (b2b / structure %s)",
                         m.owned_items, W.size(), (long long)m.a1, (long long)m.a2, starts(i3).c_str(), pb / 1e6,
                         bench_fmt("%.1f", sbound).c_str(), bench_fmt("%.2fx", ratio(t.b2b, sbound)).c_str());
            r.note = note;
            add_row(R, r);

            std::string elems, first;
            for (size_t k = 0; k < n_r; k++) {
                if (rot == 0 && k != i3) continue;
                elems +=
                    (elems.empty() ? "" : "; ") + std::to_string(mixes[k].a1) + " + " + std::to_string(mixes[k].a2);
                first += (first.empty() ? "" : "; ") + std::string("r") + std::to_string(ranks[k]) + ": " + starts(k);
            }
            char line[1200];
            snprintf(line, sizeof line,
                     "| %d | %s | %s | %s | %s | %.1f | %s | %s | %s | %s | %s | %s | %s | %s | %s | "
                     "%s | %s |\n",
                     dp, rot ? rl.c_str() : std::to_string(ranks[i3]).c_str(), k_layout_name[li], elems.c_str(),
                     first.c_str(), by / 1e6, bench_fmt("%.1f", c.b2b).c_str(), bench_fmt("%.1f", t.single).c_str(),
                     bench_fmt("%.1f", t.b2b).c_str(), bench_fmt("%.1f", t.graph).c_str(),
                     bench_fmt("%.2fx", ratio(t.b2b, c.b2b)).c_str(), bench_fmt("%.2fx", ratio(t.graph, c.b2b)).c_str(),
                     bench_fmt("%.1f", sbound).c_str(), bench_fmt("%.2fx", ratio(t.b2b, sbound)).c_str(),
                     row_target(r).c_str(), row_verdict(r).c_str(), r.check.c_str());
            R.mega.push_back(line);
        }
    }

    void run_all() {
        printf("\n#### %s: %zu weights, %lld elements\n\n%s", shape.c_str(), W.size(), (long long)total, k_row_header);
        fflush(stdout);
        static const std::vector<int> ranks8 = {1, 3, 6, 7}, ranks64 = {3, 17, 42, 63};
        for (int li = 0; li < 3; li++) {
            R.progress(shape + " " + k_layout_name[li] + ": reference (whole-bucket quantize)");
            guarded(R, shape + " reference " + k_layout_name[li], [&] {
                place(li);
                return bench_times();
            });
            if (!placed) continue;
            for (int dp : {8, 64})
                guarded(R, shape + " DP=" + std::to_string(dp) + " " + k_layout_name[li], [&] {
                    run(li, dp, dp == 8 ? ranks8 : ranks64);
                    return bench_times();
                });
        }
    }
};

/* ---- main --------------------------------------------------------------- */

/* The summary line of one target: PASS / MISS counts and the worst case. */
static std::string target_line(const report &R, const char *id, const char *text) {
    int pass = 0, miss = 0;
    std::string worst = "not run";
    double worst_bad = -1e300; /* larger is worse */
    auto consider = [&](double bad, const std::string &what) {
        if (bad > worst_bad) {
            worst_bad = bad;
            worst = what;
        }
    };
    for (const result_row &r : R.rows) {
        if (r.target_id != id) continue;
        (row_verdict(r) == "PASS" ? pass : miss)++;
        const std::string where = " (" + r.shape + " " + r.planes + " " + r.layout + " " + r.shard + ")";
        if (r.t.b2b <= 0 || r.ceil.b2b <= 0)
            consider(1e300, "not measured" + where);
        else if (r.min_pct >= 0)
            consider(-bench_pct(r.ceil.b2b, r.t.b2b), bench_fmt("%.1f %%", bench_pct(r.ceil.b2b, r.t.b2b)) + where);
        else
            consider(ratio(r.t.b2b, r.ceil.b2b), bench_fmt("%.2fx ceil", ratio(r.t.b2b, r.ceil.b2b)) + where);
    }
    for (const ratio_row &q : R.ratios) {
        if (q.target_id != id) continue;
        (ratio_verdict(q) == "PASS" ? pass : miss)++;
        if (q.b2b <= 0)
            consider(1e300, "not measured (" + q.shape + " " + q.what + ")");
        else
            consider(q.b2b, bench_fmt("%.2fx", q.b2b) + " (" + q.shape + " " + q.what + ")");
    }
    return std::string("| ") + text + " | " + std::to_string(pass) + " | " + std::to_string(miss) + " | " + worst +
           " |\n";
}

static int bench_main(int argc, char **argv) {
    bench_args args;
    bench_ctx B;
    unsigned cases = CASE_ALL;
    for (int i = 1; i < argc; i++) {
        if (std::string(argv[i]) == "--cases" && i + 1 < argc) {
            if (!parse_cases(argv[++i], &cases)) {
                fprintf(stderr, "cuda_bench: --cases takes a comma list of quantize, dp1, dp8, bucket200, megatron\n");
                return 2;
            }
            continue;
        }
        if (!bench_parse_flag(argc, argv, &i, 1, 1, B, &args)) {
            fprintf(stderr,
                    "usage: %s [--out FILE.md] [--csv FILE.csv] [--reps N] [--k K] [--shapes RxC,...] "
                    "[--cases quantize,dp1,dp8,bucket200,megatron] [--no-graph]\n",
                    argv[0]);
            return 2;
        }
    }
    const std::string &only = args.shapes;
    const char *env_md = getenv("MXS_BENCH_MD");
    if (args.out.empty() && env_md && *env_md) args.out = env_md;
    bench_default_csv(&args);

    bench_device dev;
    report R;
    if (!bench_open_device("cuda_bench", B, &dev, &R.t_start)) return 77;
    const cudaDeviceProp &prop = dev.prop;

    std::string case_list;
    for (const auto &c : k_cases)
        if (cases & c.bit) case_list += (case_list.empty() ? "" : ", ") + std::string(c.name);

    /* copy ceiling: 1 GiB device to device, bytes read + written */
    R.copy_gbs = bench_copy_gbs(B);
    const int k8 = (B.b2b_k + 7) / 8 * 8, k4 = (B.b2b_k + 3) / 4 * 4;
    char head[1400];
    snprintf(head, sizeof head,
             "device: %s, %d SMs, L2 %d MiB, CUDA runtime %d, driver %d; library %d\n"
             "copy ceiling (cudaMemcpyAsync D2D, 1 GiB, read + write, b2b): %.0f GB/s\n"
             "cases: %s\n"
             "timing: single = 1 call, L2 flushed (a 3x-L2 read) before it, median of %d; b2b = K = %d calls in a row "
             "(rounded up to a multiple of the rotation: %d for the 8 DP=8 ranks, %d for 4 Megatron ranks) / K, "
             "median of %d windows; graph = each call captured once (cudaStreamCaptureModeGlobal), K replays in a "
             "row / K, median of %d windows\n\n",
             prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20, dev.rt, dev.drv, mxs_cuda_version(),
             R.copy_gbs, case_list.c_str(), B.single_reps, B.b2b_k, k8, k4, B.b2b_reps, B.b2b_reps);
    fputs(head, stdout);

    static const int64_t shapes[][2] = {{8192, 8192}, {16384, 6144}, {4096, 14336}, {28672, 4096}};
    try {
        if (cases & CASE_SHAPES)
            for (auto &sh : shapes) {
                char name[64];
                snprintf(name, sizeof name, "%lldx%lld", (long long)sh[0], (long long)sh[1]);
                if (!only.empty() && ("," + only + ",").find("," + std::string(name) + ",") == std::string::npos)
                    continue;
                try {
                    shape_run S(B, R, cases, sh[0], sh[1]);
                    S.run_all();
                } catch (const bench_error &e) { /* the shape's buffers */
                    if (bench_case_error("cuda_bench", std::string(name) + ": " + e.what(), &R.errors)) throw;
                }
            }
        if (cases & CASE_MEGATRON) {
            try {
                megatron_run M(B, R);
                M.run_all();
            } catch (const bench_error &e) { /* the bucket's buffers */
                if (bench_case_error("cuda_bench", std::string("megatron: ") + e.what(), &R.errors)) throw;
            }
        }
    } catch (const bench_error &e) {
        bench_run_stopped("cuda_bench", e, &R.errors);
    }
    R.progress("done measuring");

    /* ---- tables ---- */
    std::string rows;
    for (auto &r : R.rows) rows += row_md(R, r);
    std::string md = bench_md_head("", head, R.ceilings, k_row_header, rows);
    printf("\n");
    bench_emit(&md, "\n### Ratios\n\n");
    bench_emit(&md, k_ratio_header);
    for (auto &q : R.ratios) bench_emit(&md, ratio_md(q));
    if (!R.mega.empty()) {
        bench_emit(&md, "\n### Megatron-like bucket, one rank (4 layers at hidden 4096 + 5 small weights, 21 items)\n\n"
                        "Ceiling: the rank's shard f32 in, its shard's data bytes per present plane and EVERY scale "
                        "byte of the bucket out. Structure bound: the ceiling plus the packed exponent buffer "
                        "written once and read once (2 x packed bytes), at the ceiling's b2b bandwidth.\n\n");
        bench_emit(&md, k_mega_header);
        for (auto &l : R.mega) bench_emit(&md, l);
    }
    if (!R.host.empty()) {
        bench_emit(&md,
                   "\n### Host cost per phase, 200-item bucket (µs per call, enqueue only, median of 50)\n\n"
                   "| shape | planes | layout | prepare | bucket partial | bucket apply | one-shot partial | one-shot "
                   "apply |\n|---|---|---|---:|---:|---:|---:|---:|\n");
        for (auto &l : R.host) bench_emit(&md, l);
        bench_emit(&md, "\nTarget for bucket partial / apply: ≤ 5 µs each.\n");
    }

    bench_emit(&md,
               "\n### Targets (issue 17, judged on b2b)\n\n| target | PASS | MISS | worst |\n|---|---:|---:|---|\n");
    for (auto &tg : k_targets) bench_emit(&md, target_line(R, tg.id, tg.text));
    bench_emit_end(&md, R.errors, R.failed_checks, R.t_start);

    if (!bench_write_md("cuda_bench", args.out, md)) return 1;
    if (!args.csv.empty()) {
        FILE *f = bench_open_out("cuda_bench", args.csv);
        if (!f) return 1;
        fprintf(f, "kind,shape,op,planes,layout,shard,api,single_us,b2b_us,graph_us,ceil_single_us,ceil_b2b_us,"
                   "pct_ceil_single,pct_ceil_b2b,pct_ceil_graph,b2b_over_ceil,bytes,target_id,target,verdict,check\n");
        for (auto &r : R.rows)
            fprintf(f, "op,%s,%s,%s,%s,%s,%s,%.2f,%.2f,%.2f,%.2f,%.2f,%.1f,%.1f,%.1f,%.3f,%.0f,%s,%s,%s,%s\n",
                    bench_csvq(r.shape).c_str(), bench_csvq(r.op).c_str(), bench_csvq(r.planes).c_str(),
                    bench_csvq(r.layout).c_str(), bench_csvq(r.shard).c_str(), bench_csvq(r.api).c_str(), r.t.single,
                    r.t.b2b, r.t.graph, r.ceil.single, r.ceil.b2b, bench_pct(r.ceil.single, r.t.single),
                    bench_pct(r.ceil.b2b, r.t.b2b), bench_pct(r.ceil.b2b, r.t.graph), ratio(r.t.b2b, r.ceil.b2b),
                    r.bytes, bench_csvq(r.target_id).c_str(),
                    bench_csvq(r.min_pct >= 0 ? bench_fmt(">=%.0f%%", r.min_pct)
                               : r.max_x >= 0 ? bench_fmt("<=%.2fx", r.max_x)
                                              : "")
                        .c_str(),
                    bench_csvq(row_verdict(r)).c_str(), bench_csvq(r.check).c_str());
        for (auto &q : R.ratios)
            fprintf(f, "ratio,%s,%s,,,,,%.4f,%.4f,%.4f,,,,,,,,%s,%s,%s,\n", bench_csvq(q.shape).c_str(),
                    bench_csvq(q.what).c_str(), q.single, q.b2b, q.graph, bench_csvq(q.target_id).c_str(),
                    bench_csvq(q.max_ratio < 0 ? "" : bench_fmt("<=%.2fx", q.max_ratio)).c_str(),
                    bench_csvq(ratio_verdict(q)).c_str());
        fclose(f);
    }
    return R.failed_checks || !R.errors.empty() ? 1 : 0;
}

int main(int argc, char **argv) {
    try {
        return bench_main(argc, argv);
    } catch (const std::exception &e) {
        fprintf(stderr, "cuda_bench: %s\n", e.what());
        return 1;
    }
}
