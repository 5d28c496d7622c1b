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
#include <mxshard/cuda.h>
#include <mxshard/mxshard.h>

/* The parts, one translation unit (bench_util.h defines its kernels in
 * every file that includes it): the shared report (cuda_bench.cuh), device
 * memory and the writeback batch (cuda_bench_wb.cuh), the per-shape cases
 * (cuda_bench_shapes.cuh), the Megatron-like bucket (cuda_bench_megatron.cuh). */
#include "cuda_bench.cuh"
#include "cuda_bench_megatron.cuh"
#include "cuda_bench_shapes.cuh"
#include "cuda_bench_wb.cuh"

/* ---- cases and targets -------------------------------------------------- */

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
