/* SPDX-License-Identifier: MIT */
/* bench/nvfp4_bench_shapes.cuh - part of bench/nvfp4_bench.cu: the cases of
 * one weight shape (quantize, writeback DP=1 and DP=8 rank, finish, for
 * every block shape, layout and plane set; the top comment of nvfp4_bench.cu
 * says what each runs and checks), their same-mix ceilings, the repetition
 * counts cut per case and the time budget.
 * Included once, into nvfp4_bench.cu's one translation unit: bench_util.h
 * defines its kernels in every file that includes it. */
#ifndef MXSHARD_BENCH_NVFP4_BENCH_SHAPES_CUH
#define MXSHARD_BENCH_NVFP4_BENCH_SHAPES_CUH

#include <chrono>
#include <memory>

#include <mxshard/cuda_nvfp4.h>
#include <mxshard/mxshard.h>

#include "nvfp4_bench.cuh"
#include "nvfp4_floor.cuh"

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
    unsigned *floor_amax = nullptr; /* the two-pass floor's pass-1 words, one per rank */
    mxs_range shard[k_dp];
    bench_times ceil_q[3], ceil_w[3], ceil_d[3], ceil_copy;
    bench_times floor_q[3], floor_w[3], floor_d[3]; /* two-pass floors (nvfp4_floor.cuh), by plane count */

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
        CK(cudaMalloc(&floor_amax, k_dp * sizeof(unsigned)));
        CK(cudaMemset(floor_amax, 0, k_dp * sizeof(unsigned)));
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
        cudaFree(floor_amax);
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
            int64_t dbytes = 0, dsrc = 0; /* dsrc: the 8 shards' source bytes */
            for (int k = 0; k < k_dp; k++) {
                /* input from the shard's first element and output at its first
                 * byte, rounded down to the 16-byte load (4 f32) */
                const int64_t f = shard[k].first / 4 * 4, o = f / 2;
                d.push_back(bench_fp4_job{{master + f, shard[k].count, 4, planes, co0 + o, co1 + o, cs0, cs1, sc}});
                dbytes += 4 * shard[k].count + planes * (shard[k].count / 2 + sc);
                dsrc += 4 * shard[k].count;
            }
            guard("ceiling bf16", [&] { ceil_q[planes] = bench_ceiling_fp4(B, {q}, "ceiling bf16"); });
            guard("ceiling f32", [&] { ceil_w[planes] = bench_ceiling_fp4(B, {w}, "ceiling f32"); });
            guard("ceiling f32 DP=8", [&] { ceil_d[planes] = bench_ceiling_fp4(B, d, "ceiling f32 DP=8"); });
            guard("floor bf16", [&] { floor_q[planes] = nv_floor_two_pass(B, {q}, floor_amax, "floor bf16"); });
            guard("floor f32", [&] { floor_w[planes] = nv_floor_two_pass(B, {w}, floor_amax, "floor f32"); });
            guard("floor f32 DP=8", [&] { floor_d[planes] = nv_floor_two_pass(B, d, floor_amax, "floor f32 DP=8"); });
            const bench_ceil_entry list[] = {
                {"bf16 -> %d x (nibbles + scales) (quantize)", &ceil_q[planes], 2.0 * n + planes * (double)(half + sc)},
                {"f32 -> %d x (nibbles + scales) (writeback DP=1)", &ceil_w[planes],
                 4.0 * n + planes * (double)(half + sc)},
                {"f32 shard -> %d x (its nibbles + all scales) (DP=8 rank)", &ceil_d[planes], (double)dbytes / k_dp},
                {"2-pass floor: bf16 read twice -> %d x (nibbles + scales) (quantize)", &floor_q[planes],
                 4.0 * n + planes * (double)(half + sc)},
                {"2-pass floor: f32 read twice -> %d x (nibbles + scales) (writeback DP=1)", &floor_w[planes],
                 8.0 * n + planes * (double)(half + sc)},
                {"2-pass floor: f32 shard twice -> %d x (its nibbles + all scales) (DP=8)", &floor_d[planes],
                 (double)(dbytes + dsrc) / k_dp},
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
            r.floor = floor_q[planes];
            r.alu_us = alu_us((double)planes * n);
            r.bytes = 2.0 * n + planes * (double)half + (double)sbytes;
            r.note = "bf16 in; amax + scale + cast passes";
            sum.q = bench_pct(r.ceil.b2b, r.t.b2b);
            sum.q_alu = bench_pct(r.alu_us, r.t.b2b);
            sum.q_fl = bench_pct(r.floor.b2b, r.t.b2b);
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
            r.floor = floor_w[planes];
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
            sum.w1_fl = bench_pct(r.floor.b2b, r.t.b2b);
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
            r.floor = floor_d[planes];
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
            sum.w8_fl = bench_pct(r.floor.b2b, r.t.b2b);
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

#endif /* MXSHARD_BENCH_NVFP4_BENCH_SHAPES_CUH */
