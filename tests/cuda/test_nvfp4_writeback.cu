/* SPDX-License-Identifier: MIT */
/* Suite cuda, NVFP4 parts 3 and 4 (test_nvfp4.cu): the sharded writeback on
 * R simulated ranks (test_nvfp4_group.cu) - in place and fragments, larger
 * weights, 70 items, a remote failure, graphs, prepared buckets. */
#include "nvfp4_cases.h"

/* ---- 3 the sharded writeback on R simulated ranks ------------------------------------ */

void test_writeback(void) {
    for (int it = 0; it < 140; it++) {
        Group *g = new Group();
        const int R = 1 + it % MAXR, sh = (it / MAXR) % SH_KINDS;
        group_make(*g, R, sh, (int)rnd_in(1, 3));
        group_fill(*g);
        group_step(*g, nullptr, 0); /* update 1: poisoned outputs */
        group_fill(*g);
        group_step(*g, nullptr, 0); /* update 2: the same buffers, stale bytes */
        CHECK(g->reductions == 2, "%s: two reductions for two updates", g->what);
        group_free(*g);
        delete g;
    }
    CHECK(g_frags > 60, "only %d fragments", g_frags);
}

/* Larger weights: many warp tiles per item, partial groups and lanes at
 * shard edges inside them. */
void test_large(void) {
    for (int it = 0; it < 8; it++) {
        Group *g = new Group();
        group_make(*g, 1 + it % 3, it % SH_KINDS, (int)rnd_in(1, 2), 700);
        group_fill(*g);
        group_step(*g, nullptr, 0);
        group_fill(*g);
        group_step(*g, nullptr, 0);
        group_free(*g);
        delete g;
    }
}
/* ---- prepared buckets ------------------------------------------------------------- */
/* Prepared buckets == host, direct and in graphs (one launch per phase for
 * 1..70 items, counted on the captured graphs), then the misuse the bucket
 * calls can see. */
void test_buckets(void) {
    cudaStream_t st;
    CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    for (int it = 0; it < 12; it++) {
        Group *g = new Group();
        const int kind = it % 3; /* 70 small items; 1-2 large ones; 1-3 mixed */
        group_make(*g, 1 + it % 3, it % SH_KINDS, kind == 0 ? MAXW : (int)rnd_in(1, kind == 1 ? 2 : 3),
                   kind == 0 ? 24 : (kind == 1 ? 700 : 90));
        bucket_prepare(*g);
        for (int u = 0; u < 2; u++) {
            group_fill(*g);
            group_step(*g, nullptr, 0);
        }
        graph_steps(*g, st, 2);
        group_free(*g);
        delete g;
    }
    CUDA_OK(cudaStreamDestroy(st));

    Group *g = new Group();
    group_make(*g, 1, SH_REPLICA, 3, 90, false);
    group_fill(*g);
    int64_t need = 0;
    expect(mxs_cuda_nvfp4_wb_prepare_bytes(&g->db[0], &need), MXS_OK, "workspace bytes");
    DevBuf ws = dev_alloc(need + 64);
    mxs_cuda_nvfp4_wb_bucket bk, zero;
    memset(&zero, 0, sizeof zero);
    void *pk = g->dpacked[0].p;
    expect(mxs_cuda_nvfp4_wb_prepare(&bk, &g->db[0], &g->dplan[0], pk, ws.p, need - 1, 0), MXS_ERR_BUFFER_SIZE,
           "workspace too small");
    CHECK(memcmp(&bk, &zero, sizeof bk) == 0, "a failed prepare leaves the bucket zeroed");
    expect(mxs_cuda_nvfp4_wb_prepare(&bk, &g->db[0], &g->dplan[0], pk, ws.p + 8, need, 0), MXS_ERR_INVALID_ARGUMENT,
           "workspace not 16-byte aligned");
    expect(mxs_cuda_nvfp4_wb_prepare(&bk, &g->db[0], &g->dplan[0], pk, nullptr, need, 0), MXS_ERR_INVALID_ARGUMENT,
           "NULL workspace");
    expect(mxs_cuda_nvfp4_wb_prepare(&bk, &g->db[0], &g->dplan[0], nullptr, ws.p, need, 0), MXS_ERR_INVALID_ARGUMENT,
           "NULL packed");
    expect(mxs_cuda_nvfp4_wb_prepare(&bk, &g->db[0], &g->dplan[0], pk, (uint8_t *)g->rw[0][0].dmaster.p, need, 0),
           MXS_ERR_ALIASING, "workspace over a master");
    DevBuf both = dev_alloc(need + g->dplan[0].packed_bytes + 64);
    expect(mxs_cuda_nvfp4_wb_prepare(&bk, &g->db[0], &g->dplan[0], both.p + 64, both.p + 64, need, 0), MXS_ERR_ALIASING,
           "workspace over the packed buffer");
    mxs_nvfp4_wb_batch other = g->db[0];
    other.round_through = g->db[0].round_through == MXS_BF16 ? MXS_F32 : MXS_BF16;
    expect(mxs_cuda_nvfp4_wb_prepare(&bk, &other, &g->dplan[0], pk, ws.p, need, 0), MXS_ERR_PLAN_MISMATCH,
           "a batch changed since its plan");
    CUDA_OK(cudaDeviceSynchronize());
    group_compare(*g, "rejected prepares write nothing");
    expect(mxs_cuda_nvfp4_wb_bucket_partial(&zero, 0), MXS_ERR_INVALID_ARGUMENT, "never-prepared bucket");
    expect(mxs_cuda_nvfp4_wb_bucket_apply(nullptr, 0), MXS_ERR_INVALID_ARGUMENT, "NULL bucket");
    expect(mxs_cuda_nvfp4_wb_prepare(&bk, &g->db[0], &g->dplan[0], pk, ws.p, need, 0), MXS_OK, "prepare");
    mxs_cuda_nvfp4_wb_bucket edited = bk;
    edited.n_items++;
    expect(mxs_cuda_nvfp4_wb_bucket_apply(&edited, 0), MXS_ERR_INVALID_ARGUMENT, "modified bucket");
    edited = bk;
    edited.table[1] = nullptr;
    expect(mxs_cuda_nvfp4_wb_bucket_finish(&edited, 0), MXS_ERR_INVALID_ARGUMENT, "modified table pointer");
    expect(mxs_cuda_nvfp4_wb_bucket_release(&bk), MXS_OK, "release");
    expect(mxs_cuda_nvfp4_wb_bucket_partial(&bk, 0), MXS_ERR_INVALID_ARGUMENT, "released bucket");
    expect(mxs_cuda_nvfp4_wb_bucket_release(nullptr), MXS_ERR_INVALID_ARGUMENT, "release NULL");
    CHECK(mxs_cuda_nvfp4_wb_bucket_size() == sizeof(mxs_cuda_nvfp4_wb_bucket), "bucket size");
    CUDA_OK(cudaDeviceSynchronize());
    group_compare(*g, "rejected bucket calls write nothing");
    dev_free(ws);
    dev_free(both);
    group_free(*g);
    delete g;
}

/* A batch of 70 items: three launch chunks per phase. */
void test_many_items(void) {
    for (int it = 0; it < 4; it++) {
        Group *g = new Group();
        group_make(*g, 1 + it % 2 * 2, it % SH_KINDS, MAXW, 24);
        for (int u = 0; u < 2; u++) {
            group_fill(*g);
            group_step(*g, nullptr, 0);
        }
        group_free(*g);
        delete g;
    }
}

/* A remote failure: the reduced status byte is 1 - the device apply writes
 * nothing (as the host apply, which returns MXS_ERR_REMOTE). */
void test_remote_failure(void) {
    for (int it = 0; it < 6; it++) {
        Group *g = new Group();
        group_make(*g, 2, it % SH_KINDS, 2);
        group_fill(*g);
        for (int q = 0; q < g->R; q++) {
            expect(mxs_host_nvfp4_wb_partial(&g->hb[q], &g->hplan[q], g->hpacked[q].data()), MXS_OK, "host partial");
            run_phase(*g, q, 0, nullptr, 0);
        }
        group_reduce(*g, true);
        for (int q = 0; q < g->R; q++) {
            expect(mxs_host_nvfp4_wb_apply(&g->hb[q], &g->hplan[q], g->hpacked[q].data()), MXS_ERR_REMOTE,
                   "host apply after a remote failure");
            run_phase(*g, q, 1, nullptr, 0); /* MXS_OK: it cannot read the byte, its kernels do */
        }
        group_compare(*g, "apply after a remote failure writes nothing");
        group_free(*g);
        delete g;
    }
}

/* ---- 4 graphs ---------------------------------------------------------------------- */

void test_graphs(void) {
    cudaStream_t st;
    CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    for (int it = 0; it < 8; it++) {
        Group *g = new Group();
        group_make(*g, 1 + it % 3, it % SH_KINDS, (int)rnd_in(1, 3));
        graph_steps(*g, st, 3);
        group_free(*g);
        delete g;
    }
    CUDA_OK(cudaStreamDestroy(st));
}
