/* SPDX-License-Identifier: MIT */
/* Suite cuda, NVFP4 (test_nvfp4.cu): R simulated ranks on one GPU, the
 * machinery of the sharded writeback cases - a Group of weights with every
 * rank's host mirror and device buffers, their fill, the phases (direct,
 * through prepared buckets, or replayed from graphs), the one MAX
 * reduction, the byte gather and the comparisons. */
#include "nvfp4_cases.h"

/* ---- 3 the sharded writeback on R simulated ranks ------------------------------------ */

static int g_combo = 0; /* cycles the weights through every combination */
int g_frags = 0;        /* fragments made (the FSDP path is exercised) */

/* The contract's rule, written out: the item's column-wise values go to a
 * fragment (finish skips it; the caller transposes the gathered stage). */
static bool col_to_fragment(const mxs_nvfp4_wb_item &it) {
    return it.stage_fragment != nullptr || (it.col_stage == nullptr && it.row_fragment != nullptr);
}

static int64_t even_between(int64_t lo, int64_t hi) { return lo + 2 * rnd_in(0, (hi - lo) / 2); }

static void make_shards(Group &g, int sharding, int64_t used) {
    const int64_t bucket = mxs_nvfp4_bucket_elems(used, g.R);
    int64_t cut[MAXR + 1];
    cut[0] = 0;
    cut[g.R] = used + (used & 1);
    for (int q = 1; q < g.R; q++) cut[q] = even_between(0, cut[g.R]);
    for (int q = 2; q < g.R; q++) /* sort the cuts */
        for (int k = q; k > 1 && cut[k] < cut[k - 1]; k--) {
            const int64_t t = cut[k];
            cut[k] = cut[k - 1];
            cut[k - 1] = t;
        }
    for (int q = 0; q < g.R; q++)
        for (int w = 0; w < g.nw; w++) {
            const int64_t elems = g.w[w].rows * g.w[w].cols, chunk = bucket / g.R;
            mxs_range s;
            s.first = s.count = 0;
            if (sharding == SH_BUCKET) {
                mxs_status st = mxs_nvfp4_bucket_shard(g.w[w].offset, elems, bucket, g.R, q, &s);
                CHECK(st == MXS_OK, "%s: bucket shard", g.what);
            } else if (sharding == SH_RANDOM) {
                s = mxs_range_in_weight(cut[q], cut[q + 1], g.w[w].offset, elems);
            } else if (sharding == SH_REPLICA) {
                s.first = 0;
                s.count = elems;
            } else {
                const int64_t widen = 2 * rnd_in(0, 20), lo = q * chunk - widen, hi = (q + 1) * chunk + widen;
                s = mxs_range_in_weight(lo < 0 ? 0 : lo, hi, g.w[w].offset, elems);
            }
            CHECK(mxs_nvfp4_shard_check(elems, s.first, s.count) == MXS_OK, "%s: even shard", g.what);
            g.rw[q][w].shard = s;
        }
}

void group_make(Group &g, int R, int sharding, int nw, int64_t maxdim, bool allow_mis) {
    int64_t used = 0;
    g.R = R;
    g.nw = nw;
    g.reductions = 0;
    g.rt = rnd() % 3 == 0 ? MXS_BF16 : (mxs_dtype)(rnd() % 3);
    for (int w = 0; w < g.nw; w++) {
        WSpec &s = g.w[w];
        const int k = g_combo++ % 54; /* dirs x block x layout x master dtype */
        s.rows = rdim(maxdim);
        s.cols = rdim(maxdim);
        if (maxdim >= 90 && rnd() % 8 == 0) s.cols = rnd_in(200, 600);
        if (rnd() % 2 == 0) s.cols = 8 * mxs_ceil_div(s.cols, 8);   /* the kernels' warp-tile path */
        if (rnd() % 3 == 0) s.rows = 16 * mxs_ceil_div(s.rows, 16); /* finish's warp tiles */
        s.dirs = (unsigned)(k % 3 + 1);
        s.block = (k / 3) % 2;
        s.layout = (k / 6) % 3;
        s.mdt = (mxs_dtype)((k / 18) % 3);
        s.stage = !(s.block == MXS_NVFP4_16X16 && s.dirs == MXS_BOTH && rnd() % 2);
        s.offset = mxs_nvfp4_bucket_place(used);
        used = s.offset + s.rows * s.cols;
        nv_make(g.ref[w], s.rows, s.cols, s.dirs, s.block, s.layout, false, false);
    }
    snprintf(g.what, sizeof g.what, "R=%d sharding %d rt %s w0 %lldx%lld dirs %u block %d layout %d %s stage %d", R,
             sharding, dtype_name(g.rt), (long long)g.w[0].rows, (long long)g.w[0].cols, g.w[0].dirs, g.w[0].block,
             g.w[0].layout, dtype_name(g.w[0].mdt), g.w[0].stage);
    make_shards(g, sharding, used);
    for (int q = 0; q < R; q++) {
        for (int w = 0; w < g.nw; w++) {
            const WSpec &s = g.w[w];
            RankW &b = g.rw[q][w];
            const int64_t db = (s.rows * s.cols + 1) / 2, mb = b.shard.count * mxs_dtype_bytes(s.mdt);
            const bool mis = allow_mis && rnd() % 4 == 0; /* planes, stage and master off their vector grids */
            nv_make(b.T, s.rows, s.cols, s.dirs, s.block, s.layout, true, true, mis);
            b.hstage.assign((size_t)db, POISON);
            b.dstage = dev_alloc(db, mis ? rnd_in(1, 7) : 0);
            b.hmaster.assign((size_t)mb + 1, POISON);
            b.dmaster = dev_alloc(mb, mis ? mxs_dtype_bytes(s.mdt) * rnd_in(1, 7) : 0);
            bool stage = (s.dirs & MXS_COLWISE) && s.stage;
            /* fragments on a third of the planes; the replaced pointers NULL or kept (the fragment wins) */
            const int64_t fb = mxs_nvfp4_fragment_bytes(b.shard.first, b.shard.count);
            b.frag[0] = (s.dirs & MXS_ROWWISE) && rnd() % 3 == 0;
            b.frag[1] = (s.dirs & MXS_COLWISE) && rnd() % 3 == 0;
            for (int p = 0; p < 2; p++) {
                if (!b.frag[p]) continue;
                g_frags++;
                b.hfrag[p].assign((size_t)fb + 1, POISON);
                b.dfrag[p] = dev_alloc(fb, rnd() % 3 == 0 ? rnd_in(1, 7) : 0);
            }
            const bool no_row_data = b.frag[0] && rnd() % 2, no_col_data = rnd() % 2;
            if (b.frag[1] && rnd() % 2) stage = false;
            for (int side = 0; side < 2; side++) {
                mxs_nvfp4_wb_item &it = side ? g.dit[q][w] : g.hit[q][w];
                memset(&it, 0, sizeof it);
                it.primary = side ? b.T.d : b.T.h;
                it.master = side ? (const void *)b.dmaster.p : (const void *)b.hmaster.data();
                it.master_dtype = s.mdt;
                it.start = b.shard.first;
                it.len = b.shard.count;
                it.col_stage = stage ? (side ? b.dstage.p : b.hstage.data()) : nullptr;
                if (b.frag[0]) it.row_fragment = side ? b.dfrag[0].p : b.hfrag[0].data();
                if (b.frag[1]) it.stage_fragment = side ? b.dfrag[1].p : b.hfrag[1].data();
                if (no_row_data) it.primary.row_data = nullptr;
                if (no_col_data && col_to_fragment(it)) it.primary.col_data = nullptr;
            }
        }
        for (int side = 0; side < 2; side++) {
            mxs_nvfp4_wb_batch &bt = side ? g.db[q] : g.hb[q];
            memset(&bt, 0, sizeof bt);
            bt.items = side ? g.dit[q] : g.hit[q];
            bt.n_items = g.nw;
            bt.round_through = g.rt;
            expect(mxs_nvfp4_wb_make_plan(&bt, side ? &g.dplan[q] : &g.hplan[q], NULL), MXS_OK, "plan");
        }
        CHECK(g.dplan[q].fingerprint == g.hplan[0].fingerprint && g.dplan[q].packed_bytes == g.hplan[0].packed_bytes,
              "%s: ranks agree on the plan", g.what);
        g.hpacked[q].assign((size_t)g.hplan[q].packed_bytes, POISON);
        /* 2-byte entries at 2 mod 4 sometimes: the tensor-amax CAS must touch no byte outside (guards) */
        g.dpacked[q] =
            dev_alloc(g.dplan[q].packed_bytes, allow_mis && g.dplan[q].entry_bytes == 2 && rnd() % 2 ? 2 : 0);
    }
}

void group_free(Group &g) {
    for (int q = 0; q < g.R; q++) {
        for (int w = 0; w < g.nw; w++) {
            nv_free(g.rw[q][w].T);
            dev_free(g.rw[q][w].dstage);
            dev_free(g.rw[q][w].dmaster);
            dev_free(g.rw[q][w].dfrag[0]);
            dev_free(g.rw[q][w].dfrag[1]);
        }
        dev_free(g.dpacked[q]);
        dev_free(g.ws[q]);
    }
}

/* New master values; the reference; every rank's shard uploaded. */
void group_fill(Group &g) {
    for (int w = 0; w < g.nw; w++) {
        const WSpec &s = g.w[w];
        const int64_t esz = mxs_dtype_bytes(s.mdt);
        g.full[w] = nv_source(s.rows * s.cols, s.mdt);
        expect(mxs_host_nvfp4_quantize(&g.ref[w].h, g.full[w].data(), s.mdt, g.rt), MXS_OK, "reference quantize");
        for (int q = 0; q < g.R; q++) {
            RankW &b = g.rw[q][w];
            memcpy(b.hmaster.data(), g.full[w].data() + b.shard.first * esz, (size_t)(b.shard.count * esz));
            dev_upload(b.dmaster, b.hmaster.data(), b.shard.count * esz);
        }
    }
}

/* Every device buffer of every rank == its host mirror. */
void group_compare(const Group &g, const char *phase) {
    char ctx[300];
    for (int q = 0; q < g.R; q++) {
        for (int w = 0; w < g.nw; w++) {
            const RankW &b = g.rw[q][w];
            snprintf(ctx, sizeof ctx, "%s: %s: rank %d w%d", g.what, phase, q, w);
            nv_compare(b.T, ctx);
            char what[512];
            snprintf(what, sizeof what, "%s: column stage", ctx);
            dev_compare(b.dstage, b.hstage.data(), what);
            snprintf(what, sizeof what, "%s: master", ctx);
            dev_compare(b.dmaster, b.hmaster.data(), what);
            for (int p = 0; p < 2; p++) {
                if (!b.frag[p]) continue;
                snprintf(what, sizeof what, "%s: %s fragment (shard [%lld, +%lld), device at %lld mod 8)", ctx,
                         p ? "stage" : "row", (long long)b.shard.first, (long long)b.shard.count,
                         (long long)((uintptr_t)b.dfrag[p].p % 8u));
                dev_compare(b.dfrag[p], b.hfrag[p].data(), what);
            }
        }
        snprintf(ctx, sizeof ctx, "%s: %s: rank %d packed", g.what, phase, q);
        dev_compare(g.dpacked[q], g.hpacked[q].data(), ctx);
    }
}

/* Every rank's present planes and amax == the whole-tensor reference. */
static void group_check_reference(const Group &g) {
    char ctx[300];
    for (int q = 0; q < g.R; q++)
        for (int w = 0; w < g.nw; w++)
            for (int k = 0; k < 5; k++) {
                if (k < 4 && !(g.w[w].dirs & (unsigned)(k / 2 + 1))) continue;
                snprintf(ctx, sizeof ctx, "%s: rank %d w%d (%lldx%lld dirs %u block %d) %s == whole-tensor quantize",
                         g.what, q, w, (long long)g.w[w].rows, (long long)g.w[w].cols, g.w[w].dirs, g.w[w].block,
                         buf_names[k]);
                dev_compare(g.rw[q][w].T.db[k], g.ref[w].hb[k].data(), ctx);
            }
}

/* The one MAX reduction: over the host mirrors' packed entries (== the
 * device's, compared after partial), the result uploaded to every rank. */
void group_reduce(Group &g, bool fail) {
    const int64_t n = g.hplan[0].packed_count, wd = g.hplan[0].entry_bytes;
    g.reductions++;
    for (int64_t i = 0; i < n; i++) {
        uint32_t m = 0;
        for (int q = 0; q < g.R; q++) {
            const uint32_t v = mxs__nvfp4_entry_get(g.hpacked[q].data(), wd, i);
            m = v > m ? v : m;
        }
        for (int q = 0; q < g.R; q++) {
            if (wd == 2)
                ((uint16_t *)(void *)g.hpacked[q].data())[i] = (uint16_t)m;
            else
                ((uint32_t *)(void *)g.hpacked[q].data())[i] = m;
        }
    }
    for (int q = 0; q < g.R; q++) {
        if (fail) g.hpacked[q][(size_t)g.hplan[q].status_offset] = 1; /* some rank failed */
        dev_upload(g.dpacked[q], g.hpacked[q].data(), g.hplan[q].packed_bytes);
    }
}

/* Where rank p's apply put its bytes [start/2, ceil(end/2)) of weight w's
 * row-wise plane (plane 0) or stage (1) - a fragment, or the plane / stage
 * at start/2; the stage of a 16x16 item without one: its row-wise bytes (the
 * same nibbles) - on the host (side 0) or the device (1). */
static uint8_t *applied_bytes(Group &g, int p, int w, int plane, int side) {
    RankW &b = g.rw[p][w];
    const int64_t b0 = b.shard.first / 2;
    if (plane == 1 && !b.frag[1] && !g.hit[p][w].col_stage) plane = 0;
    if (b.frag[plane]) return side ? b.dfrag[plane].p : b.hfrag[plane].data();
    if (plane == 0) return (side ? b.T.db[0].p : b.T.hb[0].data()) + b0;
    return (side ? b.dstage.p : b.hstage.data()) + b0;
}

/* The parameter all-gather, by hand: every rank's bytes [start/2,
 * ceil(end/2)) of the row-wise plane and of the stage (from its fragments
 * where it has them) into every rank's full row-wise plane and stage. */
static void group_gather(Group &g) {
    for (int w = 0; w < g.nw; w++)
        for (int q = 0; q < g.R; q++)
            for (int p = 0; p < g.R; p++) {
                const mxs_range s = g.rw[p][w].shard;
                if (s.count == 0) continue;
                const int64_t b0 = s.first / 2, nb = mxs_nvfp4_fragment_bytes(s.first, s.count);
                RankW &dst = g.rw[q][w];
                for (int plane = 0; plane < 2; plane++) {
                    if (!(g.w[w].dirs & (unsigned)(plane + 1))) continue;
                    uint8_t *hd = (plane == 0 ? dst.T.hb[0].data() : dst.hstage.data()) + b0;
                    uint8_t *dd = (plane == 0 ? dst.T.db[0].p : dst.dstage.p) + b0;
                    const uint8_t *hs = applied_bytes(g, p, w, plane, 0), *ds = applied_bytes(g, p, w, plane, 1);
                    if (hs == hd) continue; /* the rank's own bytes, in place */
                    memcpy(hd, hs, (size_t)nb);
                    CUDA_OK(cudaMemcpy(dd, ds, (size_t)nb, cudaMemcpyDeviceToDevice));
                }
            }
}

/* After finish (which skips them): the column-wise planes of the items whose
 * column values went to fragments, by the standalone transpose of the
 * gathered stage, on the host and the device. */
static void group_stage_to_col(Group &g) {
    for (int q = 0; q < g.R; q++)
        for (int w = 0; w < g.nw; w++) {
            RankW &b = g.rw[q][w];
            if (!(g.w[w].dirs & MXS_COLWISE) || !col_to_fragment(g.hit[q][w])) continue;
            expect(mxs_host_nvfp4_stage_to_col(&b.T.h, b.hstage.data()), MXS_OK, "host stage_to_col");
            expect(mxs_cuda_nvfp4_stage_to_col(&b.T.d, b.dstage.p, 0), MXS_OK, "gpu stage_to_col");
        }
    CUDA_OK(cudaDeviceSynchronize());
}

static void capture(cudaStream_t st, cudaGraphExec_t *exec, const Group &g, int q, int phase) {
    cudaGraph_t graph;
    mxs_status s;
    CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    if (g.use_bucket)
        s = phase == 0   ? mxs_cuda_nvfp4_wb_bucket_partial(&g.bk[q], st)
            : phase == 1 ? mxs_cuda_nvfp4_wb_bucket_apply(&g.bk[q], st)
                         : mxs_cuda_nvfp4_wb_bucket_finish(&g.bk[q], st);
    else if (phase == 0)
        s = mxs_cuda_nvfp4_wb_partial(&g.db[q], &g.dplan[q], g.dpacked[q].p, st);
    else if (phase == 1)
        s = mxs_cuda_nvfp4_wb_apply(&g.db[q], &g.dplan[q], g.dpacked[q].p, st);
    else
        s = mxs_cuda_nvfp4_wb_finish(&g.db[q], &g.dplan[q], st);
    CUDA_OK(cudaStreamEndCapture(st, &graph));
    expect(s, MXS_OK, "phase under capture");
    if (g.use_bucket) { /* one launch per phase whatever the number of items (partial: + its memset) */
        size_t nodes = 0;
        CUDA_OK(cudaGraphGetNodes(graph, nullptr, &nodes));
        CHECK(nodes <= (phase == 0 ? 2u : 1u), "%s: bucket phase %d: %zu graph nodes for %d items", g.what, phase,
              nodes, g.nw);
    }
    CUDA_OK(cudaGraphInstantiate(exec, graph, 0));
    CUDA_OK(cudaGraphDestroy(graph));
}

/* One device phase of rank q: a direct call, or the replay of its graph. */
void run_phase(Group &g, int q, int phase, RankGraphs *graphs, cudaStream_t st) {
    if (graphs) {
        CUDA_OK(cudaDeviceSynchronize()); /* uploads ran on the legacy stream */
        CUDA_OK(cudaGraphLaunch(graphs[q].exec[phase], st));
        CUDA_OK(cudaStreamSynchronize(st));
        return;
    }
    mxs_status s = g.use_bucket ? (phase == 0   ? mxs_cuda_nvfp4_wb_bucket_partial(&g.bk[q], 0)
                                   : phase == 1 ? mxs_cuda_nvfp4_wb_bucket_apply(&g.bk[q], 0)
                                                : mxs_cuda_nvfp4_wb_bucket_finish(&g.bk[q], 0))
                   : phase == 0 ? mxs_cuda_nvfp4_wb_partial(&g.db[q], &g.dplan[q], g.dpacked[q].p, 0)
                   : phase == 1 ? mxs_cuda_nvfp4_wb_apply(&g.db[q], &g.dplan[q], g.dpacked[q].p, 0)
                                : mxs_cuda_nvfp4_wb_finish(&g.db[q], &g.dplan[q], 0);
    CUDA_OK(cudaDeviceSynchronize());
    expect(s, MXS_OK, phase == 0 ? "gpu partial" : phase == 1 ? "gpu apply" : "gpu finish");
}

/* One writeback step on every rank, host mirror and device side by side. */
void group_step(Group &g, RankGraphs *graphs, cudaStream_t st) {
    const int64_t before = g.reductions;
    for (int q = 0; q < g.R; q++) {
        expect(mxs_host_nvfp4_wb_partial(&g.hb[q], &g.hplan[q], g.hpacked[q].data()), MXS_OK, "host partial");
        run_phase(g, q, 0, graphs, st);
    }
    group_compare(g, "after partial");
    group_reduce(g, false);
    for (int q = 0; q < g.R; q++) {
        expect(mxs_host_nvfp4_wb_apply(&g.hb[q], &g.hplan[q], g.hpacked[q].data()), MXS_OK, "host apply");
        run_phase(g, q, 1, graphs, st);
    }
    CHECK(g.reductions - before == 1, "%s: ONE reduction per bucket", g.what);
    group_compare(g, "after apply");
    group_gather(g);
    for (int q = 0; q < g.R; q++) {
        expect(mxs_host_nvfp4_wb_finish(&g.hb[q], &g.hplan[q]), MXS_OK, "host finish");
        run_phase(g, q, 2, graphs, st);
    }
    group_compare(g, "after finish");
    group_stage_to_col(g);
    group_compare(g, "after stage_to_col");
    group_check_reference(g);
}

/* Every rank's three phases captured (capturing runs nothing), then
 * `updates` writeback steps by graph replay. */
void graph_steps(Group &g, cudaStream_t st, int updates) {
    RankGraphs graphs[MAXR];
    for (int q = 0; q < g.R; q++)
        for (int ph = 0; ph < 3; ph++) capture(st, &graphs[q].exec[ph], g, q, ph);
    group_compare(g, "after capture");
    for (int u = 0; u < updates; u++) {
        group_fill(g);
        group_step(g, graphs, st);
    }
    for (int q = 0; q < g.R; q++)
        for (int ph = 0; ph < 3; ph++) CUDA_OK(cudaGraphExecDestroy(graphs[q].exec[ph]));
}

/* ---- prepared buckets ------------------------------------------------------------- */

void bucket_prepare(Group &g) {
    for (int q = 0; q < g.R; q++) {
        int64_t need = -1;
        expect(mxs_cuda_nvfp4_wb_prepare_bytes(&g.db[q], &need), MXS_OK, "bucket workspace bytes");
        CHECK(need > 0 && need % (3 * g.nw) == 0, "%s: workspace %lld: one record per item and phase", g.what,
              (long long)need);
        g.ws[q] = dev_alloc(need > 0 ? need : 16);
        expect(mxs_cuda_nvfp4_wb_prepare(&g.bk[q], &g.db[q], &g.dplan[q], g.dpacked[q].p, g.ws[q].p, need, 0), MXS_OK,
               "bucket prepare");
        CUDA_OK(cudaDeviceSynchronize());
    }
    g.use_bucket = true;
}
