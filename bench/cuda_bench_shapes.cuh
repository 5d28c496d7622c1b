/* SPDX-License-Identifier: MIT */
/* bench/cuda_bench_shapes.cuh - part of bench/cuda_bench.cu: the cases of
 * one weight shape (quantize, dp1, dp8, bucket200; the top comment of
 * cuda_bench.cu says what each runs and checks) and their same-mix
 * ceilings, measured once per mix.
 * Included once, into cuda_bench.cu's one translation unit: bench_util.h
 * defines its kernels in every file that includes it. */
#ifndef MXSHARD_BENCH_CUDA_BENCH_SHAPES_CUH
#define MXSHARD_BENCH_CUDA_BENCH_SHAPES_CUH

#include <map>
#include <memory>
#include <tuple>

#include <mxshard/cuda.h>
#include <mxshard/mxshard.h>

#include "cuda_bench.cuh"
#include "cuda_bench_wb.cuh"

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
     * buffer (element-aligned master). Bytes checked as a group
     * (cuda_bench.cu's top comment). */
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

#endif /* MXSHARD_BENCH_CUDA_BENCH_SHAPES_CUH */
