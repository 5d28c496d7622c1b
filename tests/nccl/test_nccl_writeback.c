/* SPDX-License-Identifier: MIT */
/* tests/nccl/test_nccl_writeback.c - group writeback of test_nccl: writeback
 * + gather == quantize(full) for every sharding scheme and plane set, a
 * bucket prepared once serving every update, and a rank-local failure that
 * never hangs the group. docs/contract.md section 4. */
#define _POSIX_C_SOURCE 200809L
#include "nccl_cases.h"

static int count_empty_unaligned(const weight *w, int n, int nranks, int *unaligned) {
    int i, q, empty = 0;
    *unaligned = 0;
    for (i = 0; i < n; i++)
        for (q = 0; q < nranks; q++) {
            empty += w[i].lens[q] == 0;
            *unaligned += w[i].lens[q] > 0 && (w[i].starts[q] % 32 != 0 || w[i].starts[q] % w[i].spec.cols != 0);
        }
    return empty;
}

/* docs/contract.md section 4 invariant for one sharding scheme and two consecutive
 * updates with changed masters: writeback + gather == quantize(full). */
void run_writeback_case(mxs_rank *r, const char *name, const wspec *specs, int n, int scheme, mxs_wb_mode mode,
                        mxs_rounding rnd, int want_empty) {
    long before = test_begin(r, name);
    weight *w = weights_new(r, specs, n, scheme, 1234u + (uint64_t)n, NULL, NULL, NULL);
    int u, unaligned, empty = count_empty_unaligned(w, n, r->nranks, &unaligned);
    mxs_rank_log(r, "  %d weights, %s shards: %d empty, %d unaligned (table of all ranks), mode %s", n,
                 scheme_name[scheme], empty, unaligned, mode == MXS_WB_STRICT ? "strict" : "fused");
    if (want_empty) MXS_CHECK(r, empty > 0 && unaligned > 0, "the sharding has no empty or no unaligned shard");
    for (u = 0; u < 2; u++) {
        char label[64];
        weights_update(r, w, n, 100u * (uint64_t)u + 17u * (uint64_t)scheme + (uint64_t)mode, MXS_F32, rnd);
        writeback(r, w, n, rnd, MXS_F32, mode);
        check_local(r, w, n);
        gather_planes(r, w, n);
        snprintf(label, sizeof label, "update %d", u + 1);
        check_full(r, w, n, label);
    }
    weights_free(w, n, 1);
    test_end(r, name, before);
}

void test_writeback_dirs(mxs_rank *r, unsigned dirs, const char *name) {
    wspec s[N_DIRS_SHAPES];
    int i;
    for (i = 0; i < N_DIRS_SHAPES; i++) {
        s[i] = dirs_shapes[i];
        s[i].dirs = dirs;
    }
    run_writeback_case(r, name, s, N_DIRS_SHAPES, SHARD_BUCKET, MXS_WB_FUSED, MXS_ROUND_CEIL, 1);
}

/* The batch of this rank's shards of w (items[] has n entries). */
static void batch_of(weight *w, int n, mxs_wb_item *items, mxs_wb_batch *b, mxs_rounding rnd, mxs_wb_mode mode) {
    int i;
    memset(items, 0, sizeof(mxs_wb_item) * (size_t)n);
    for (i = 0; i < n; i++) {
        items[i].primary = w[i].dev;
        items[i].master = w[i].shard_dev;
        items[i].master_dtype = MXS_F32;
        items[i].start = w[i].start;
        items[i].len = w[i].len;
    }
    memset(b, 0, sizeof *b);
    b->items = items;
    b->n_items = n;
    b->rounding = rnd;
    b->mode = mode;
}

/* A bucket prepared once serves every update (new master values, same
 * pointers): mxs_nccl_wb_bucket_writeback, one uint8 MAX all-reduce each. */
void test_bucket_writeback_updates(mxs_rank *r) {
    const char *name = "bucket_prepared_once_serves_every_update";
    long before = test_begin(r, name);
    wspec s[N_DIRS_SHAPES];
    mxs_wb_item items[N_DIRS_SHAPES];
    mxs_wb_batch b;
    mxs_wb_plan plan;
    mxs_cuda_wb_bucket bk;
    int64_t ws_bytes = 0;
    void *ws, *packed;
    weight *w;
    int u;
    mixed_specs(s, N_DIRS_SHAPES);
    w = weights_new(r, s, N_DIRS_SHAPES, SHARD_BUCKET, 4242u, NULL, NULL, NULL);
    batch_of(w, N_DIRS_SHAPES, items, &b, MXS_ROUND_CEIL, MXS_WB_FUSED);
    wb_buffers(r, &b, &plan, &ws_bytes, &ws, &packed);
    ST(r, mxs_cuda_wb_prepare(&bk, &b, &plan, (uint8_t *)packed, ws, ws_bytes, r->stream), MXS_OK);
    for (u = 0; u < 3; u++) {
        mxs_status st;
        weights_update(r, w, N_DIRS_SHAPES, 777u + (uint64_t)u, MXS_F32, MXS_ROUND_CEIL);
        wire_reset();
        st = mxs_nccl_wb_bucket_writeback(&bk, r->comm, r->stream);
        wire_stop();
        MXS_CHECK(r, st == MXS_OK, "mxs_nccl_wb_bucket_writeback: %s", mxs_status_str(st));
        CU(r, cudaStreamSynchronize(r->stream));
        MXS_CHECK(r,
                  g_wire.all_reduce == 1 && g_wire.broadcast + g_wire.all_gather == 0 && g_wire.non_u8 == 0 &&
                      g_wire.reduce_not_max == 0 && g_wire.reduce_elems == plan.packed_bytes,
                  "bucket writeback: %d all-reduces of %lld bytes (want 1 of %lld, uint8 MAX)", g_wire.all_reduce,
                  g_wire.reduce_elems, (long long)plan.packed_bytes);
        check_local(r, w, N_DIRS_SHAPES);
        gather_planes(r, w, N_DIRS_SHAPES);
        check_full(r, w, N_DIRS_SHAPES, u == 0 ? "update 1" : u == 1 ? "update 2" : "update 3");
    }
    ST(r, mxs_cuda_wb_bucket_release(&bk), MXS_OK);
    cudaFree(ws);
    cudaFree(packed);
    weights_free(w, N_DIRS_SHAPES, 1);
    test_end(r, name, before);
}

/* A rank-local failure never hangs the group: the last rank's workspace is
 * one byte short. It still joins the one all-reduce (zeros, status byte 1)
 * and returns MXS_ERR_BUFFER_SIZE; every other rank returns MXS_ERR_REMOTE
 * and skips apply (its scale planes stay untouched); afterwards the
 * communicator is in step (a correct writeback + gather works). */
void test_group_never_hangs(mxs_rank *r) {
    const char *name = "rank_local_failure_never_hangs_the_group";
    long before = test_begin(r, name);
    wspec s[N_DIRS_SHAPES];
    mxs_wb_item items[N_DIRS_SHAPES];
    mxs_wb_batch b;
    mxs_wb_plan plan;
    int64_t ws_bytes = 0;
    void *ws, *packed;
    weight *w;
    int last = r->rank == r->nranks - 1, i, p;
    mxs_status st, want = last ? MXS_ERR_BUFFER_SIZE : MXS_ERR_REMOTE;
    mixed_specs(s, N_DIRS_SHAPES);
    w = weights_new(r, s, N_DIRS_SHAPES, SHARD_UNEVEN, 31337u, NULL, NULL, NULL);
    weights_update(r, w, N_DIRS_SHAPES, 9u, MXS_F32, MXS_ROUND_CEIL);
    batch_of(w, N_DIRS_SHAPES, items, &b, MXS_ROUND_CEIL, MXS_WB_FUSED);
    wb_buffers(r, &b, &plan, &ws_bytes, &ws, &packed);
    wire_reset();
    st = mxs_nccl_wb_writeback(&b, &plan, (uint8_t *)packed, ws, last ? ws_bytes - 1 : ws_bytes, r->comm, r->stream);
    wire_stop();
    CU(r, cudaStreamSynchronize(r->stream));
    MXS_CHECK(r, st == want, "writeback with a failing last rank -> %s (want %s)", mxs_status_str(st),
              mxs_status_str(want));
    MXS_CHECK(r, g_wire.all_reduce == 1 && g_wire.reduce_elems == plan.packed_bytes,
              "the failing group issued %d all-reduces of %lld bytes (want 1 of %lld)", g_wire.all_reduce,
              g_wire.reduce_elems, (long long)plan.packed_bytes);
    for (i = 0; i < N_DIRS_SHAPES; i++)
        for (p = 0; p < 2; p++) {
            uint8_t *got;
            int64_t k, touched = 0;
            if (!has_plane(&w[i], p)) continue;
            got = download(r, dev_scale(&w[i], p), w[i].scale_bytes[p]);
            for (k = 0; k < w[i].scale_bytes[p]; k++) touched += got[k] != 0xCD;
            MXS_CHECK(r, touched == 0, "weight %d plane %d: %lld scale bytes written although apply was skipped", i, p,
                      (long long)touched);
            free(got);
        }
    /* the communicator is still in step */
    weights_update(r, w, N_DIRS_SHAPES, 10u, MXS_F32, MXS_ROUND_CEIL);
    writeback(r, w, N_DIRS_SHAPES, MXS_ROUND_CEIL, MXS_F32, MXS_WB_FUSED);
    gather_planes(r, w, N_DIRS_SHAPES);
    check_full(r, w, N_DIRS_SHAPES, "after the failed writeback");
    cudaFree(ws);
    cudaFree(packed);
    weights_free(w, N_DIRS_SHAPES, 1);
    test_end(r, name, before);
}
