/* SPDX-License-Identifier: MIT */
/* bench/cuda_bench_megatron.cuh - part of bench/cuda_bench.cu: the
 * megatron case, the linear weights of 4 transformer layers in one flat
 * bucket sharded as a distributed optimizer does (the top comment of
 * cuda_bench.cu), one rank and ranks in rotation at DP=8 and DP=64.
 * Included once, into cuda_bench.cu's one translation unit: bench_util.h
 * defines its kernels in every file that includes it. */
#ifndef MXSHARD_BENCH_CUDA_BENCH_MEGATRON_CUH
#define MXSHARD_BENCH_CUDA_BENCH_MEGATRON_CUH

#include <memory>

#include <mxshard/cuda.h>
#include <mxshard/mxshard.h>

#include "cuda_bench.cuh"
#include "cuda_bench_wb.cuh"

/* ---- the Megatron-like bucket ------------------------------------------- */

struct mega_weight {
    std::string name;
    int64_t rows, cols;
    unsigned dirs;
};

/* The bucket, in order (cuda_bench.cu's top comment). */
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

        /* byte checks (cuda_bench.cu's top comment): the group's exponents
         * over all dp ranks, from one scratch shard buffer; then each timed
         * rank alone */
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

#endif /* MXSHARD_BENCH_CUDA_BENCH_MEGATRON_CUH */
