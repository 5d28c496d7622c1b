/* SPDX-License-Identifier: MIT */
/* bench/cuda_bench.cuh - what the parts of bench/cuda_bench.cu share: the
 * scale layouts every case runs in, the case bits of --cases, and the
 * report (result and ratio rows, their markdown, a case run behind a guard).
 * Included once, into cuda_bench.cu's one translation unit: bench_util.h
 * defines its kernels in every file that includes it. */
#ifndef MXSHARD_BENCH_CUDA_BENCH_CUH
#define MXSHARD_BENCH_CUDA_BENCH_CUH

#include <chrono>

#include <mxshard/mxshard.h>

#include "bench_util.h"

static const char *const k_layout_name[] = {"COMPACT", "PADDED", "SWIZZLED"};
static const mxs_scale_layout k_layouts[] = {MXS_SCALES_COMPACT, MXS_SCALES_PADDED, MXS_SCALES_SWIZZLED};

/* ---- the cases: bits of --cases ------------------------------------------ */

enum : unsigned {
    CASE_QUANTIZE = 1u,
    CASE_DP1 = 2u,
    CASE_DP8 = 4u,
    CASE_BUCKET200 = 8u,
    CASE_MEGATRON = 16u,
    CASE_SHAPES = CASE_QUANTIZE | CASE_DP1 | CASE_DP8 | CASE_BUCKET200,
    CASE_ALL = CASE_SHAPES | CASE_MEGATRON,
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

#endif /* MXSHARD_BENCH_CUDA_BENCH_CUH */
