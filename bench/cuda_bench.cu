/* SPDX-License-Identifier: MIT */
/* bench/cuda_bench.cu - GPU time of mxshard's kernels against same-mix
 * ceilings measured in the same run (issue 9, "Speed where users are").
 *
 *   cuda_bench [--out FILE.md] [--csv FILE.csv] [--reps N] [--k K]
 *              [--shapes 8192x8192,28672x4096] [--no-graph]
 *
 * --out writes the tables as markdown (for bench/RESULTS.md) and, unless
 * --csv names another file, the rows as CSV next to it (FILE.csv).
 * MXS_BENCH_MD=FILE is the old spelling of --out. Exit status: 0, 1 on an
 * error or a failed byte check, 77 when there is no CUDA device.
 *
 * Cases, for each shape (8192x8192, 16384x6144, 4096x14336, 28672x4096):
 *   quantize bf16, row-only and both, COMPACT / PADDED / SWIZZLED;
 *   writeback f32 master, round-through bf16, FUSED, DP=1 (partial+apply,
 *     no reduction: one GPU), row-only and both, all three layouts; the
 *     bytes are checked against mxs_cuda_quantize of the bf16 master;
 *   one rank of DP=8 (shard rows*cols/8): aligned start; start + 13 and
 *     len - 30 (start, end and len not multiples of 8 or 32) with the
 *     master pointer at the shard start (not 16-byte aligned), and the same
 *     shard with a 16-byte-aligned master pointer; ranks 0..7 in rotation;
 *   a 200-weight bucket (weights of rows/200 rows: 40 or 41 for 8192, never
 *     a multiple of 32) of the same total bytes as one weight, DP=1; bytes
 *     checked against 200 quantize calls.
 * Writeback goes through the prepared bucket (mxs_cuda_wb_prepare once,
 * then mxs_cuda_wb_bucket_partial + _apply per step); the 200-weight rows
 * also give the one-shot mxs_cuda_wb_partial/apply (validation every call)
 * and the host time of each phase call.
 *
 * Same-mix ceiling: bench_mix (bench_util.h) reads the operation's input
 * bytes and writes its output bytes (data planes + scale planes), no math:
 * quantize bf16 -> 1 or 2 bytes/elem + n/32 scale bytes per plane; writeback
 * f32 -> 1 or 2 bytes/elem + n/32 per plane (the packed exponent buffer, an
 * intermediate, is NOT in the ceiling); a DP=8 rank: its shard's f32 in, its
 * shard's bytes out, and ALL scales (every rank writes every scale). % of
 * ceiling = ceiling time / op time, in the same timing mode. Targets are
 * judged on the back-to-back (b2b) numbers.
 */
#include <chrono>
#include <memory>

#include <mxshard/cuda.h>
#include <mxshard/mxshard.h>

#include "bench_util.h"

static const char *const k_layout_name[] = {"COMPACT", "PADDED", "SWIZZLED"};
static const mxs_scale_layout k_layouts[] = {MXS_SCALES_COMPACT, MXS_SCALES_PADDED, MXS_SCALES_SWIZZLED};

/* ---- report ------------------------------------------------------------- */

struct result_row {
    std::string shape, op, planes, layout, shard, api;
    bench_times t, ceil;
    double bytes = 0;    /* the ceiling's bytes (input + outputs) */
    double min_pct = -1; /* target: b2b % of ceiling >= min_pct; -1: none */
    std::string check;   /* byte check: "ok", "N bytes differ", "" */
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
    std::vector<std::string> errors;
    double copy_gbs = 0;
    int failed_checks = 0;
};

static double ratio(double a, double b) { return a > 0 && b > 0 ? a / b : -1; }

static std::string row_target(const result_row &r) { return r.min_pct < 0 ? "–" : bench_fmt("≥ %.0f %%", r.min_pct); }
static std::string row_verdict(const result_row &r) {
    if (r.min_pct < 0) return "";
    return bench_pct(r.ceil.b2b, r.t.b2b) >= r.min_pct ? "PASS" : "MISS";
}
static std::string ratio_verdict(const ratio_row &q) {
    if (q.max_ratio < 0) return "";
    return q.b2b > 0 && q.b2b <= q.max_ratio ? "PASS" : "MISS";
}

static const char *k_row_header =
    "| shape | op | planes | layout | shard | api | single µs | b2b µs | graph µs | ceiling b2b µs | % ceil single | "
    "% ceil b2b | % ceil graph | GB/s b2b | % copy b2b | target (b2b) | verdict | check | note |\n"
    "|---|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|---|\n";

static std::string row_md(const report &R, const result_row &r) {
    double gbs = r.t.b2b > 0 ? r.bytes / r.t.b2b / 1e3 : -1;
    std::string s = "| " + r.shape + " | " + r.op + " | " + r.planes + " | " + r.layout + " | " + r.shard + " | " +
                    r.api + " | " + bench_fmt("%.1f", r.t.single) + " | " + bench_fmt("%.1f", r.t.b2b) + " | " +
                    bench_fmt("%.1f", r.t.graph) + " | " + bench_fmt("%.1f", r.ceil.b2b) + " | " +
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

/* ---- device memory for tensors ------------------------------------------ */

static mxs_tensor tensor_shape(int64_t rows, int64_t cols, unsigned dirs, mxs_scale_layout layout) {
    return bench_tensor_shape<mxs_tensor>(rows, cols, dirs, layout);
}

/* Bytes for one tensor's planes, each data and scale plane 256-aligned. */
static int64_t tensor_bytes(const mxs_tensor &t) { return bench_planes_bytes(t); }

/* Places t's planes at base + *off and advances *off. */
static void tensor_place(mxs_tensor *t, uint8_t *base, int64_t *off) { bench_planes_place(t, base, off); }

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

static std::vector<bench_call> wb_calls(const std::vector<std::unique_ptr<wb_set>> &sets) {
    std::vector<bench_call> calls;
    for (const auto &w : sets) {
        wb_set *p = w.get();
        calls.push_back([p](cudaStream_t s) { return p->run(s); });
    }
    return calls;
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

/* ---- one shape ---------------------------------------------------------- */

struct shape_run {
    bench_ctx &B;
    report &R;
    int64_t rows, cols, n;
    std::string shape;
    uint16_t *src = nullptr, *mbf = nullptr;
    float *master = nullptr;
    uint8_t *co0 = nullptr, *co1 = nullptr, *cs0 = nullptr, *cs1 = nullptr;
    unsigned long long *dcount = nullptr;
    bench_times ceil_q[3], ceil_w[3], ceil_d[3]; /* [planes] */

    shape_run(bench_ctx &b, report &r, int64_t rows_, int64_t cols_) : B(b), R(r), rows(rows_), cols(cols_) {
        n = rows * cols;
        char buf[64];
        snprintf(buf, sizeof buf, "%lldx%lld", (long long)rows, (long long)cols);
        shape = buf;
        CK(cudaMalloc(&src, (size_t)n * 2));
        CK(cudaMalloc(&mbf, (size_t)n * 2));
        CK(cudaMalloc(&master, (size_t)n * 4 + 256));
        CK(cudaMalloc(&co0, (size_t)n + 256));
        CK(cudaMalloc(&co1, (size_t)n + 256));
        CK(cudaMalloc(&cs0, (size_t)n / 32 + 256));
        CK(cudaMalloc(&cs1, (size_t)n / 32 + 256));
        CK(cudaMalloc(&dcount, sizeof(unsigned long long)));
        bench_fill<<<1024, 256, 0, B.s>>>((uint32_t *)src, n / 2, 7, 0);
        bench_fill<<<1024, 256, 0, B.s>>>((uint32_t *)master, n + 64, 11, 1);
        bench_to_bf16<<<1024, 256, 0, B.s>>>(master, mbf, n);
        CK(cudaGetLastError());
        CK(cudaStreamSynchronize(B.s));
    }
    ~shape_run() {
        cudaFree(src);
        cudaFree(mbf);
        cudaFree(master);
        cudaFree(co0);
        cudaFree(co1);
        cudaFree(cs0);
        cudaFree(cs1);
        cudaFree(dcount);
    }

    void add(result_row r) {
        r.shape = shape;
        if (r.t.graph < 0 && !r.t.graph_why.empty() && r.t.graph_why != "not tried")
            r.note += "; no graph: " + r.t.graph_why;
        std::string line = row_md(R, r);
        fputs(line.c_str(), stdout);
        fflush(stdout);
        R.rows.push_back(r);
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

    /* Runs one case; a failure becomes an error line and an empty result,
     * unless the CUDA context is broken (then it propagates: stop). */
    bench_times guard(const std::string &what, const std::function<bench_times()> &f) {
        try {
            return f();
        } catch (const bench_error &e) {
            if (bench_case_error("cuda_bench", shape + " " + what + ": " + e.what(), &R.errors)) throw;
            return bench_times();
        }
    }

    void ceilings() {
        const int64_t sc = n / 32, n8 = n / 8;
        printf("\n#### %s\n\n%s", shape.c_str(), bench_ceil_header);
        for (int planes = 1; planes <= 2; planes++) {
            bench_mix_job q = {src, n, 2, planes, co0, co1, cs0, cs1, sc};
            bench_mix_job w = {master, n, 4, planes, co0, co1, cs0, cs1, sc};
            std::vector<bench_mix_job> d;
            for (int r = 0; r < 8; r++)
                d.push_back({master + r * n8, n8, 4, planes, co0 + r * n8, co1 + r * n8, cs0, cs1, sc});
            ceil_q[planes] = guard("ceiling bf16", [&] { return bench_ceiling(B, {q}, "ceiling bf16"); });
            ceil_w[planes] = guard("ceiling f32", [&] { return bench_ceiling(B, {w}, "ceiling f32"); });
            ceil_d[planes] = guard("ceiling f32 DP=8", [&] { return bench_ceiling(B, d, "ceiling f32 DP=8"); });
            const bench_ceil_entry list[] = {
                {"bf16 -> %d B/elem + scales (quantize)", &ceil_q[planes], 2.0 * n + planes * (double)(n + sc)},
                {"f32 -> %d B/elem + scales (writeback DP=1)", &ceil_w[planes], 4.0 * n + planes * (double)(n + sc)},
                {"f32 shard n/8 -> %d B/elem + all scales (DP=8 rank)", &ceil_d[planes],
                 4.0 * n8 + planes * (double)(n8 + sc)},
            };
            bench_ceiling_rows(shape, planes, list, sizeof list / sizeof list[0], R.copy_gbs, &R.ceilings);
        }
        printf("\n%s", k_row_header);
        fflush(stdout);
    }

    /* A result row's labels: operation, planes, layout, shard, API. */
    static result_row labelled(const char *op, int planes, int li, const std::string &shard, const char *api) {
        result_row r;
        r.op = op;
        r.planes = planes == 2 ? "both" : "row-only";
        r.layout = k_layout_name[li];
        r.shard = shard;
        r.api = api;
        return r;
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
        const uint16_t *in = src;
        std::vector<bench_call> calls = {
            [t, in](cudaStream_t s) { return mxs_cuda_quantize(&t, in, MXS_BF16, MXS_ROUND_CEIL, s); }};
        result_row r = labelled("quantize bf16", planes, li, "whole", "quantize");
        r.t = bench_measure(B, calls, "mxs_cuda_quantize", true);
        r.ceil = ceil_q[planes];
        r.bytes = 2.0 * n + planes * (double)(n + n / 32);
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
        arena a({shp}), ref({shp});
        std::vector<std::unique_ptr<wb_set>> sets;
        sets.emplace_back(new wb_set);
        sets[0]->items.push_back(wb_item(a.t[0], master, 0, n));
        sets[0]->setup(B.s);
        result_row r = labelled("writeback f32 rt-bf16", planes, li, "DP=1", "bucket");
        r.t = bench_measure(B, wb_calls(sets), "writeback DP=1", true);
        r.ceil = ceil_w[planes];
        r.bytes = 4.0 * n + planes * (double)(n + n / 32);
        r.min_pct = li == 0 ? -1 : 90;
        r.note = "partial+apply";
        MK(mxs_cuda_quantize(&ref.t[0], mbf, MXS_BF16, MXS_ROUND_CEIL, B.s));
        checked(r, arena_diff(a, ref, dcount, B.s));
        add(r);
        return r.t;
    }

    /* One rank of DP=8, ranks 0..7 in rotation. kind 0: aligned; 1: start
     * + 13, len - 30, master at the shard start (pointer 4 mod 16); 2: the
     * same shard, master pointer 16-byte aligned. */
    bench_times writeback_dp8(unsigned dirs, int li, int kind) {
        const int planes = dirs == 3 ? 2 : 1;
        const int64_t n8 = n / 8;
        arena a({tensor_shape(rows, cols, dirs, k_layouts[li])});
        std::vector<std::unique_ptr<wb_set>> sets;
        for (int rank = 0; rank < 8; rank++) {
            int64_t start = rank * n8, len = n8;
            const float *m = master + start;
            if (kind > 0) {
                start += 13;
                len -= 30;
                m = kind == 1 ? master + start : master + rank * n8 + 16;
            }
            sets.emplace_back(new wb_set);
            sets.back()->items.push_back(wb_item(a.t[0], m, start, len));
            sets.back()->setup(B.s);
        }
        static const char *const kind_name[] = {"DP=8 aligned", "DP=8 start+13 len-30",
                                                "DP=8 start+13 len-30, master 16B"};
        result_row r = labelled("writeback f32 rt-bf16", planes, li, kind_name[kind], "bucket");
        r.t = bench_measure(B, wb_calls(sets), "writeback DP=8", true);
        r.ceil = ceil_d[planes];
        r.bytes = 4.0 * n8 + planes * (double)(n8 + n / 32);
        r.note = "ranks 0-7 in rotation";
        add(r);
        return r.t;
    }

    /* 200 weights of rows/200 (+1) rows each, same total as one weight. */
    bench_times bucket(unsigned dirs, int li) {
        const int nw = 200, planes = dirs == 3 ? 2 : 1;
        std::vector<mxs_tensor> shapes;
        for (int i = 0; i < nw; i++)
            shapes.push_back(tensor_shape(rows * (i + 1) / nw - rows * i / nw, cols, dirs, k_layouts[li]));
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
        result_row r = labelled("writeback f32 rt-bf16", planes, li, "DP=1, 200 weights", "bucket");
        r.t = bench_measure(B, wb_calls(sets), "writeback bucket", true);
        r.ceil = ceil_w[planes];
        r.bytes = 4.0 * n + planes * (double)(n + n / 32);
        checked(r, arena_diff(a, ref, dcount, B.s));
        host_cost h = measure_host(*sets[0], B.s, 50);
        char note[256];
        double scale_mb = 0, one_mb = 0;
        for (const mxs_tensor &x : shapes)
            for (int pl = 1; pl <= 2; pl++)
                if (dirs & (unsigned)pl) scale_mb += mxs_scale_bytes(&x, (mxs_dirs)pl) / 1e6;
        const mxs_tensor one = tensor_shape(rows, cols, dirs, k_layouts[li]);
        for (int pl = 1; pl <= 2; pl++)
            if (dirs & (unsigned)pl) one_mb += mxs_scale_bytes(&one, (mxs_dirs)pl) / 1e6;
        snprintf(note, sizeof note, "%lld..%lld rows per weight; scale bytes %.2f MB (one weight: %.2f MB)",
                 (long long)(rows / nw), (long long)((rows + nw - 1) / nw), scale_mb, one_mb);
        r.note = note;
        add(r);
        { /* the same batch through the one-shot calls (validation + work list every call) */
            wb_set *p = sets[0].get();
            result_row o = r;
            o.api = "one-shot";
            o.t = bench_measure(B, {[p](cudaStream_t s) { return p->oneshot(s); }}, "one-shot bucket", true);
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
        ceilings();
        for (unsigned dirs : {1u, 3u}) {
            const char *pn = dirs == 3 ? "both" : "row-only";
            bench_times q[3], w[3];
            for (int li = 0; li < 3; li++)
                q[li] =
                    guard(std::string("quantize ") + pn + " " + k_layout_name[li], [&] { return quantize(dirs, li); });
            add_ratio(std::string("quantize ") + pn + ": SWIZZLED / COMPACT", "q-swz", q[2], q[0], 1.05);
            add_ratio(std::string("quantize ") + pn + ": PADDED / COMPACT", "", q[1], q[0], -1);
            for (int li = 0; li < 3; li++)
                w[li] = guard(std::string("writeback DP=1 ") + pn + " " + k_layout_name[li],
                              [&] { return writeback_dp1(dirs, li); });
            for (int li = 0; li < 3; li++) {
                std::string p = std::string("DP=8 ") + pn + " " + k_layout_name[li] + ": ";
                bench_times al = guard(p + "aligned", [&] { return writeback_dp8(dirs, li, 0); });
                bench_times un = guard(p + "start+13", [&] { return writeback_dp8(dirs, li, 1); });
                bench_times ua = guard(p + "start+13 master 16B", [&] { return writeback_dp8(dirs, li, 2); });
                add_ratio(p + "start+13 / aligned", "dp8-align", un, al, 1.10);
                add_ratio(p + "start+13 (master 16B) / aligned", "dp8-align", ua, al, 1.10);
                add_ratio(p + "start+13 / DP=1", "dp8-dp1", un, w[li], 0.18);
                add_ratio(p + "start+13 (master 16B) / DP=1", "dp8-dp1", ua, w[li], 0.18);
                add_ratio(p + "aligned / DP=1", "", al, w[li], -1);
            }
            for (int li : {0, 2}) {
                bench_times bk =
                    guard(std::string("bucket ") + pn + " " + k_layout_name[li], [&] { return bucket(dirs, li); });
                add_ratio(std::string("200-weight bucket ") + pn + " " + k_layout_name[li] + " / one weight", "bucket",
                          bk, w[li], 1.10);
            }
        }
    }
};

/* ---- main --------------------------------------------------------------- */

static const struct {
    const char *id, *text;
} k_targets[] = {
    {"quantize", "quantize bf16 ≥ 92 % of the same-mix ceiling (every layout)"},
    {"q-swz", "quantize SWIZZLED within 5 % of COMPACT (≤ 1.05x)"},
    {"writeback", "writeback DP=1 PADDED / SWIZZLED ≥ 90 % of the same-mix ceiling"},
    {"dp8-align", "DP=8 rank, start not a multiple of 32: ≤ 1.10x the aligned rank"},
    {"dp8-dp1", "DP=8 rank, start not a multiple of 32: ≤ 0.18x DP=1"},
    {"bucket", "200-weight bucket ≤ 1.10x one weight of the same bytes"},
};

static int bench_main(int argc, char **argv) {
    bench_args args;
    bench_ctx B;
    for (int i = 1; i < argc; i++) {
        if (!bench_parse_flag(argc, argv, &i, 1, 1, B, &args)) {
            fprintf(stderr,
                    "usage: %s [--out FILE.md] [--csv FILE.csv] [--reps N] [--k K] [--shapes RxC,...] "
                    "[--no-graph]\n",
                    argv[0]);
            return 2;
        }
    }
    const std::string &only = args.shapes;
    const char *env_md = getenv("MXS_BENCH_MD");
    if (args.out.empty() && env_md && *env_md) args.out = env_md;
    bench_default_csv(&args);

    std::chrono::steady_clock::time_point t_start;
    bench_device dev;
    if (!bench_open_device("cuda_bench", B, &dev, &t_start)) return 77;
    const cudaDeviceProp &prop = dev.prop;
    report R;

    /* copy ceiling: 1 GiB device to device, bytes read + written */
    R.copy_gbs = bench_copy_gbs(B);
    char head[1024];
    snprintf(head, sizeof head,
             "device: %s, %d SMs, L2 %d MiB, CUDA runtime %d, driver %d; library %d\n"
             "copy ceiling (cudaMemcpyAsync D2D, 1 GiB, read + write, b2b): %.0f GB/s\n"
             "timing: single = 1 call, L2 flushed (a 3x-L2 read) before it, median of %d; b2b = K = %d calls in a row "
             "(rounded up to a multiple of the rotation: 24 for the DP=8 ranks) / K, median of %d windows; graph = "
             "each call captured once (cudaStreamCaptureModeGlobal), K replays in a row / K, median of %d windows\n\n",
             prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20, dev.rt, dev.drv, mxs_cuda_version(),
             R.copy_gbs, B.single_reps, B.b2b_k, B.b2b_reps, B.b2b_reps);
    fputs(head, stdout);

    static const int64_t shapes[][2] = {{8192, 8192}, {16384, 6144}, {4096, 14336}, {28672, 4096}};
    try {
        for (auto &sh : shapes) {
            char name[64];
            snprintf(name, sizeof name, "%lldx%lld", (long long)sh[0], (long long)sh[1]);
            if (!only.empty() && ("," + only + ",").find("," + std::string(name) + ",") == std::string::npos) continue;
            shape_run S(B, R, sh[0], sh[1]);
            S.run_all();
        }
    } catch (const bench_error &e) {
        bench_run_stopped("cuda_bench", e, &R.errors);
    }

    /* ---- tables ---- */
    std::string rows;
    for (auto &r : R.rows) rows += row_md(R, r);
    std::string md = bench_md_head("", head, R.ceilings, k_row_header, rows);
    printf("\n");
    bench_emit(&md, "\n### Ratios\n\n");
    bench_emit(&md, k_ratio_header);
    for (auto &q : R.ratios) bench_emit(&md, ratio_md(q));
    bench_emit(
        &md, "\n### Host cost per phase, 200-item bucket (µs per call, enqueue only, median of 50)\n\n"
             "| shape | planes | layout | prepare | bucket partial | bucket apply | one-shot partial | one-shot apply "
             "|\n|---|---|---|---:|---:|---:|---:|---:|\n");
    for (auto &l : R.host) bench_emit(&md, l);
    bench_emit(&md, "\nTarget for bucket partial / apply: ≤ 5 µs each.\n");

    bench_emit(&md,
               "\n### Targets (issue 9, judged on b2b)\n\n| target | PASS | MISS | worst |\n|---|---:|---:|---|\n");
    for (auto &tg : k_targets) {
        int pass = 0, miss = 0;
        std::string worst;
        double worst_v = 0;
        bool have = false;
        for (auto &r : R.rows) {
            bool is_q = std::string(tg.id) == "quantize" && r.op == "quantize bf16";
            bool is_w = std::string(tg.id) == "writeback" && r.shard == "DP=1" && r.min_pct > 0;
            if (!is_q && !is_w) continue;
            double v = bench_pct(r.ceil.b2b, r.t.b2b);
            (row_verdict(r) == "PASS" ? pass : miss)++;
            if (!have || v < worst_v) {
                have = true;
                worst_v = v;
                worst = bench_fmt("%.1f %%", v) + " (" + r.shape + " " + r.planes + " " + r.layout + ")";
            }
        }
        for (auto &q : R.ratios) {
            if (q.target_id != tg.id) continue;
            (ratio_verdict(q) == "PASS" ? pass : miss)++;
            if (!have || q.b2b > worst_v) {
                have = true;
                worst_v = q.b2b;
                worst = bench_fmt("%.2fx", q.b2b) + " (" + q.shape + " " + q.what + ")";
            }
        }
        char line[600];
        snprintf(line, sizeof line, "| %s | %d | %d | %s |\n", tg.text, pass, miss, worst.c_str());
        bench_emit(&md, line);
    }
    bench_emit_end(&md, R.errors, R.failed_checks, t_start);

    if (!bench_write_md("cuda_bench", args.out, md)) return 1;
    if (!args.csv.empty()) {
        FILE *f = bench_open_out("cuda_bench", args.csv);
        if (!f) return 1;
        fprintf(f, "kind,shape,op,planes,layout,shard,api,single_us,b2b_us,graph_us,ceil_single_us,ceil_b2b_us,"
                   "pct_ceil_single,pct_ceil_b2b,pct_ceil_graph,bytes,target,verdict,check\n");
        for (auto &r : R.rows)
            fprintf(f, "op,%s,%s,%s,%s,%s,%s,%.2f,%.2f,%.2f,%.2f,%.2f,%.1f,%.1f,%.1f,%.0f,%s,%s,%s\n",
                    bench_csvq(r.shape).c_str(), bench_csvq(r.op).c_str(), bench_csvq(r.planes).c_str(),
                    bench_csvq(r.layout).c_str(), bench_csvq(r.shard).c_str(), bench_csvq(r.api).c_str(), r.t.single,
                    r.t.b2b, r.t.graph, r.ceil.single, r.ceil.b2b, bench_pct(r.ceil.single, r.t.single),
                    bench_pct(r.ceil.b2b, r.t.b2b), bench_pct(r.ceil.b2b, r.t.graph), r.bytes,
                    bench_csvq(r.min_pct < 0 ? "" : bench_fmt(">=%.0f%%", r.min_pct)).c_str(),
                    bench_csvq(row_verdict(r)).c_str(), bench_csvq(r.check).c_str());
        for (auto &q : R.ratios)
            fprintf(f, "ratio,%s,%s,,,,,%.4f,%.4f,%.4f,,,,,,,%s,%s,\n", bench_csvq(q.shape).c_str(),
                    bench_csvq(q.what).c_str(), q.single, q.b2b, q.graph,
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
