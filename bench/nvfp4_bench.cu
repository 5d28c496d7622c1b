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
 * Two-pass floor (issue 36; nvfp4_floor.cuh), measured in the same run and
 * the same way: NVFP4's scales need the tensor amax before any element is
 * cast, so the source is read twice - an amax pass (read the input, reduce
 * it to one word) and then the one-pass ceiling's kernel, two launches per
 * call. Bytes: the one-pass ceiling's plus the input once more:
 *   quantize   2 x bf16 n + planes * (n/2 + scales)
 *   DP=1       2 x f32 n + planes * (n/2 + scales)
 *   DP=8 rank  2 x f32 n/8 + planes * (n/16 + ALL scales), ranks in rotation
 *   finish     none (no amax: its row shows "–")
 * Every quantize and writeback row gives its b2b time as % of the one-pass
 * ceiling and of the two-pass floor (floor time / op time, both b2b); the
 * summary the same per operation. The floor is what the issue's targets for
 * NVFP4 quantize / writeback are set against.
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
 * the bench's master, then rank 3 of DP=8) of 1x16 row-only COMPACT; the
 * same with both planes and finish - and exits: `ncu ... nvfp4_bench --profile` profiles exactly
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

/* The parts, one translation unit (bench_util.h defines its kernels in
 * every file that includes it): the configurations, report, tensors and
 * writeback batch (nvfp4_bench.cuh), the per-shape cases
 * (nvfp4_bench_shapes.cuh) and their two-pass floor (nvfp4_floor.cuh). */
#include "nvfp4_bench.cuh"
#include "nvfp4_bench_shapes.cuh"

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
        nv_wb r(a.t, master, 3 * (n / 8), n / 8, dirs == MXS_BOTH ? stage : nullptr); /* a DP=8 rank */
        MK(r.step(B.s));
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
    char head[2000];
    snprintf(head, sizeof head,
             "device: %s, %d SMs, L2 %d MiB, CUDA runtime %d, driver %d; library %d; NVFP4 E2M1 conversion: %s\n"
             "copy ceiling (cudaMemcpyAsync D2D, 1 GiB, read + write, b2b): %.0f GB/s\n"
             "instruction ceiling (fl32(x * e) + E2M1 + packing only, full occupancy, no memory): %.1f G elements/s "
             "(mxs_e2m1x8_from_f32, the kernels' path); run 13's rule: %.1f G elements/s\n"
             "2-pass floor: an amax pass (read the input once, reduce to one word) then the one-pass ceiling's "
             "kernel, two launches per call, timed like the ceilings (the input read twice: NVFP4 needs the tensor "
             "amax before any cast)\n"
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
    bench_emit(&md, "\n### NVFP4 summary: % of the same-mix ceiling (b2b; memory / ALU) and of the two-pass "
                    "floor, reduced bytes per step\n\n");
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
                   "pct_ceil_single,pct_ceil_b2b,pct_ceil_graph,bytes,reduced_ours,reduced_te,check,floor_single_us,"
                   "floor_b2b_us,pct_floor_single,pct_floor_b2b\n");
        for (auto &r : R.rows)
            fprintf(f,
                    "%s,%s,%s,%s,%s,%s,%.2f,%.2f,%.2f,%.2f,%.2f,%.1f,%.1f,%.1f,%.0f,%lld,%lld,%s,%.2f,%.2f,%.1f,%.1f\n",
                    bench_csvq(r.shape).c_str(), bench_csvq(r.block).c_str(), bench_csvq(r.layout).c_str(),
                    bench_csvq(r.planes).c_str(), bench_csvq(r.op).c_str(), bench_csvq(r.shard).c_str(), r.t.single,
                    r.t.b2b, r.t.graph, r.ceil.single, r.ceil.b2b, bench_pct(r.ceil.single, r.t.single),
                    bench_pct(r.ceil.b2b, r.t.b2b), bench_pct(r.ceil.b2b, r.t.graph), r.bytes, (long long)r.ours,
                    (long long)r.te, bench_csvq(r.check).c_str(), r.floor.single, r.floor.b2b,
                    bench_pct(r.floor.single, r.t.single), bench_pct(r.floor.b2b, r.t.b2b));
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
