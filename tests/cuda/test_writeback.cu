/* SPDX-License-Identifier: MIT */
/* Suite cuda: mxs_cuda_wb_partial / mxs_cuda_wb_apply equal
 * mxs_host_wb_partial / mxs_host_wb_apply byte for byte - the packed buffer
 * after partial, the primaries' data and scales, the fragments - for random
 * batches (shapes, planes, layouts, master dtypes, round-through, rounding,
 * FUSED and STRICT) and random shardings (unaligned, empty, overlapping,
 * full) over a simulated data-parallel group: every rank runs partial, the
 * MAX reduction is done here, every rank runs apply. */
#include "common.h"

struct RankItem {
    Planes P;                      /* this rank's primary */
    std::vector<uint8_t> hfrag[2]; /* host fragments */
    DevBuf dfrag[2];
    bool frag[2] = {false, false}, null_data[2] = {false, false};
    DevBuf dmaster;
    int64_t start = 0, len = 0;
};

struct Weight {
    int64_t rows, cols;
    unsigned dirs;
    mxs_scale_layout layout;
    mxs_dtype dtype;
    std::vector<uint8_t> master; /* the whole master, of dtype */
};

static void rnd_shards(int64_t n, int nranks, std::vector<int64_t> &start, std::vector<int64_t> &len) {
    std::vector<int64_t> cut((size_t)nranks + 1);
    cut[0] = 0;
    cut[(size_t)nranks] = n;
    const bool aligned8 = rnd() % 2 == 0; /* shards on 8-element boundaries: the vector path */
    for (int q = 1; q < nranks; q++) cut[(size_t)q] = aligned8 ? rnd_in(0, n / 8) * 8 : rnd_in(0, n);
    std::sort(cut.begin() + 1, cut.end() - 1);
    start.resize((size_t)nranks);
    len.resize((size_t)nranks);
    for (int q = 0; q < nranks; q++) {
        int64_t a = cut[(size_t)q], b = cut[(size_t)q + 1];
        switch (rnd() % 8) {
        case 0: a = a > 0 ? rnd_in(0, a) : a; break; /* overlap the previous rank */
        case 1: b = b < n ? rnd_in(b, n) : b; break; /* overlap the next rank */
        case 2:
            if (rnd() % 4 == 0) {
                a = 0;
                b = n;
            }
            break; /* replicated */
        default: break;
        }
        start[(size_t)q] = a;
        len[(size_t)q] = b - a;
    }
}

static int g_case = 0;
/* test_case(..., big_shapes) with g_short_last: rows = 32 k + 1..8 (a short
 * last group: the interior kernel's 32 x 512 units) */
static bool g_short_last = false;

static void test_case(int nw, int nranks, mxs_wb_mode mode, mxs_rounding rounding, mxs_dtype rt, bool big_shapes) {
    char ctx[200];
    snprintf(ctx, sizeof ctx, "case %d: %d weights, %d ranks, mode %d, round %d, rt %s", g_case++, nw, nranks,
             (int)mode, (int)rounding, dtype_name(rt));
    std::vector<Weight> W((size_t)nw);
    for (auto &w : W) {
        rnd_shape(&w.rows, &w.cols);
        if (big_shapes) {
            w.rows = rnd_in(100, 400);
            w.cols = 8 * rnd_in(16, 80);
        }
        if (big_shapes && g_short_last) w.rows = 32 * rnd_in(0, 6) + rnd_in(1, 8);
        w.dirs = (unsigned)rnd_in(1, 3);
        w.layout = (mxs_scale_layout)(rnd() % 3);
        w.dtype = (mxs_dtype)(rnd() % 3);
        w.master = rnd_source(w.rows * w.cols, w.dtype);
    }
    std::vector<std::vector<RankItem>> R((size_t)nranks, std::vector<RankItem>((size_t)nw));
    for (int i = 0; i < nw; i++) {
        Weight &w = W[(size_t)i];
        std::vector<int64_t> st, ln;
        rnd_shards(w.rows * w.cols, nranks, st, ln);
        for (int q = 0; q < nranks; q++) {
            RankItem &ri = R[(size_t)q][(size_t)i];
            ri.start = st[(size_t)q];
            ri.len = ln[(size_t)q];
            planes_make(ri.P, w.rows, w.cols, w.dirs, w.layout, rnd() % 5 == 0);
            int64_t eb = mxs_dtype_bytes(w.dtype);
            ri.dmaster = dev_alloc(ri.len * eb, rnd() % 5 == 0 ? eb : 0);
            if (ri.len > 0) dev_upload(ri.dmaster, w.master.data() + ri.start * eb, ri.len * eb);
            for (int p = 0; p < 2; p++) {
                if (!(w.dirs & (unsigned)(p + 1)) || rnd() % 3 != 0) continue;
                ri.frag[p] = true;
                ri.hfrag[p].assign((size_t)ri.len + 1, POISON); /* non-NULL even when len = 0 */
                ri.dfrag[p] = dev_alloc(ri.len, rnd() % 4 == 0 ? rnd_in(1, 7) : 0);
                if (rnd() % 2) {
                    ri.null_data[p] = true;
                    if (p == 0)
                        ri.P.h.row_data = ri.P.d.row_data = nullptr;
                    else
                        ri.P.h.col_data = ri.P.d.col_data = nullptr;
                }
            }
        }
    }

    std::vector<std::vector<mxs_wb_item>> hitems((size_t)nranks), ditems((size_t)nranks);
    std::vector<mxs_wb_batch> hb((size_t)nranks), db((size_t)nranks);
    /* a plan binds to its batch's pointers (local_hash): host and device
     * batches each get their own; their cross-rank fingerprints agree */
    std::vector<mxs_wb_plan> plan((size_t)nranks), dplan((size_t)nranks);
    std::vector<std::vector<uint8_t>> hpacked((size_t)nranks);
    std::vector<DevBuf> dpacked((size_t)nranks), dws((size_t)nranks);
    for (int q = 0; q < nranks; q++) {
        for (int i = 0; i < nw; i++) {
            RankItem &ri = R[(size_t)q][(size_t)i];
            mxs_wb_item h, d;
            memset(&h, 0, sizeof h);
            h.primary = ri.P.h;
            h.master = W[(size_t)i].master.data() + ri.start * mxs_dtype_bytes(W[(size_t)i].dtype);
            h.master_dtype = W[(size_t)i].dtype;
            h.start = ri.start;
            h.len = ri.len;
            d = h;
            d.primary = ri.P.d;
            d.master = ri.dmaster.p;
            if (ri.frag[0]) {
                h.row_fragment = ri.hfrag[0].data();
                d.row_fragment = ri.dfrag[0].p;
            }
            if (ri.frag[1]) {
                h.col_fragment = ri.hfrag[1].data();
                d.col_fragment = ri.dfrag[1].p;
            }
            hitems[(size_t)q].push_back(h);
            ditems[(size_t)q].push_back(d);
        }
        memset(&hb[(size_t)q], 0, sizeof(mxs_wb_batch));
        hb[(size_t)q].items = hitems[(size_t)q].data();
        hb[(size_t)q].n_items = nw;
        hb[(size_t)q].rounding = rounding;
        hb[(size_t)q].round_through = rt;
        hb[(size_t)q].mode = mode;
        db[(size_t)q] = hb[(size_t)q];
        db[(size_t)q].items = ditems[(size_t)q].data();
        CHECK(mxs_wb_make_plan(&hb[(size_t)q], &plan[(size_t)q], NULL) == MXS_OK, "%s: plan", ctx);
        CHECK(mxs_wb_make_plan(&db[(size_t)q], &dplan[(size_t)q], NULL) == MXS_OK, "%s: device plan", ctx);
        CHECK(dplan[(size_t)q].fingerprint == plan[(size_t)q].fingerprint &&
                  dplan[(size_t)q].packed_bytes == plan[(size_t)q].packed_bytes,
              "%s: host and device plans agree", ctx);
        hpacked[(size_t)q].assign((size_t)plan[(size_t)q].packed_bytes, POISON);
        dpacked[(size_t)q] = dev_alloc(plan[(size_t)q].packed_bytes, rnd() % 4 == 0 ? rnd_in(1, 3) : 0);
        int64_t wsb = -1;
        CHECK(mxs_cuda_wb_workspace_bytes(&db[(size_t)q], &wsb) == MXS_OK && wsb >= 0, "%s: workspace", ctx);
        dws[(size_t)q] = dev_alloc(wsb);
    }

    auto compare_rank = [&](int q, const char *phase) {
        char what[300];
        for (int i = 0; i < nw; i++) {
            RankItem &ri = R[(size_t)q][(size_t)i];
            static const char *names[4] = {"row data", "row scale", "col data", "col scale"};
            for (int k = 0; k < 4; k++) {
                if (!ri.P.dbuf[k].base) continue;
                if ((k == 0 && ri.null_data[0]) || (k == 2 && ri.null_data[1])) {
                    snprintf(what, sizeof what, "%s: %s rank %d item %d: %s (NULL, unused)", ctx, phase, q, i,
                             names[k]);
                    dev_untouched(ri.P.dbuf[k], what);
                    continue;
                }
                snprintf(what, sizeof what, "%s: %s rank %d item %d (%lldx%lld dirs %u layout %d, shard %lld+%lld): %s",
                         ctx, phase, q, i, (long long)ri.P.h.rows, (long long)ri.P.h.cols, ri.P.h.dirs,
                         (int)ri.P.h.scale_layout, (long long)ri.start, (long long)ri.len, names[k]);
                dev_compare(ri.P.dbuf[k], ri.P.hbuf[k].data(), what);
            }
            for (int p = 0; p < 2; p++) {
                if (!ri.frag[p]) continue;
                snprintf(what, sizeof what, "%s: %s rank %d item %d: fragment %d", ctx, phase, q, i, p);
                dev_compare(ri.dfrag[p], ri.hfrag[p].data(), what);
            }
        }
    };

    /* Two updates with the same buffers and pointers, as in training: the
     * second one has new master values (the one-shot calls re-prepare every
     * time; tests/cuda/test_bucket.cu keeps one prepared bucket). */
    for (int upd = 0; upd < 2; upd++) {
        if (upd > 0) {
            for (int i = 0; i < nw; i++) {
                Weight &w = W[(size_t)i];
                std::vector<uint8_t> fresh = rnd_source(w.rows * w.cols, w.dtype);
                memcpy(w.master.data(), fresh.data(), fresh.size()); /* same host buffer */
                int64_t eb = mxs_dtype_bytes(w.dtype);
                for (int q = 0; q < nranks; q++) {
                    RankItem &ri = R[(size_t)q][(size_t)i];
                    if (ri.len > 0) dev_upload(ri.dmaster, w.master.data() + ri.start * eb, ri.len * eb);
                }
            }
        }
        /* step 2 on every rank */
        for (int q = 0; q < nranks; q++) {
            mxs_status a = mxs_host_wb_partial(&hb[(size_t)q], &plan[(size_t)q], hpacked[(size_t)q].data());
            mxs_status b = mxs_cuda_wb_partial(&db[(size_t)q], &dplan[(size_t)q], dpacked[(size_t)q].p,
                                               dws[(size_t)q].p, dws[(size_t)q].n, 0);
            CUDA_OK(cudaDeviceSynchronize());
            CHECK(a == MXS_OK && b == MXS_OK, "%s: partial status host %d gpu %d", ctx, a, b);
            char what[260];
            snprintf(what, sizeof what, "%s: packed after partial, rank %d", ctx, q);
            dev_compare(dpacked[(size_t)q], hpacked[(size_t)q].data(), what);
            compare_rank(q, "partial");
        }
        /* step 3: MAX over the ranks */
        std::vector<uint8_t> reduced(hpacked[0]);
        for (int q = 1; q < nranks; q++)
            for (size_t k = 0; k < reduced.size(); k++)
                reduced[k] = reduced[k] > hpacked[(size_t)q][k] ? reduced[k] : hpacked[(size_t)q][k];
        /* step 4 on every rank */
        for (int q = 0; q < nranks; q++) {
            hpacked[(size_t)q] = reduced;
            if (!reduced.empty()) dev_upload(dpacked[(size_t)q], reduced.data(), (int64_t)reduced.size());
            mxs_status a = mxs_host_wb_apply(&hb[(size_t)q], &plan[(size_t)q], hpacked[(size_t)q].data());
            mxs_status b = mxs_cuda_wb_apply(&db[(size_t)q], &dplan[(size_t)q], dpacked[(size_t)q].p, dws[(size_t)q].p,
                                             dws[(size_t)q].n, 0);
            CUDA_OK(cudaDeviceSynchronize());
            CHECK(a == MXS_OK && b == MXS_OK, "%s: apply status host %d gpu %d", ctx, a, b);
            char what[260];
            snprintf(what, sizeof what, "%s: packed after apply (read only), rank %d", ctx, q);
            dev_compare(dpacked[(size_t)q], reduced.data(), what);
            compare_rank(q, "apply");
        }
    }

    for (auto &rank : R)
        for (auto &ri : rank) {
            planes_free(ri.P);
            dev_free(ri.dmaster);
            dev_free(ri.dfrag[0]);
            dev_free(ri.dfrag[1]);
        }
    for (int q = 0; q < nranks; q++) {
        dev_free(dpacked[(size_t)q]);
        dev_free(dws[(size_t)q]);
    }
}

int main(void) {
    require_gpu();
    printf("# writeback: random batches and shardings\n");
    for (int it = 0; it < 160; it++)
        test_case((int)rnd_in(1, 4), (int)rnd_in(1, 5), (mxs_wb_mode)(rnd() % 2), (mxs_rounding)(rnd() % 2),
                  (mxs_dtype)(rnd() % 3), false);
    printf("# writeback: larger weights (fast path)\n");
    for (int it = 0; it < 12; it++)
        test_case((int)rnd_in(1, 3), (int)rnd_in(1, 8), (mxs_wb_mode)(it % 2), (mxs_rounding)(rnd() % 2),
                  (mxs_dtype)(rnd() % 3), true);
    printf("# writeback: short last groups (rows %% 32 in 1..8)\n");
    g_short_last = true;
    for (int it = 0; it < 12; it++)
        test_case((int)rnd_in(1, 3), (int)rnd_in(1, 4), it % 3 == 2 ? MXS_WB_STRICT : MXS_WB_FUSED,
                  (mxs_rounding)(rnd() % 2), (mxs_dtype)(rnd() % 3), true);
    g_short_last = false;
    printf("# writeback: a 75-item batch (work list stored in two parameter blocks)\n");
    test_case(75, 3, MXS_WB_FUSED, MXS_ROUND_CEIL, MXS_BF16, false);
    test_case(75, 2, MXS_WB_STRICT, MXS_ROUND_FLOOR, MXS_F32, false);
    printf("# writeback: a 240-item batch (work list stored in five parameter blocks)\n");
    test_case(240, 2, MXS_WB_FUSED, MXS_ROUND_CEIL, MXS_BF16, false);
    test_case(240, 3, MXS_WB_STRICT, MXS_ROUND_FLOOR, MXS_F32, false);
    return finish("cuda writeback");
}
