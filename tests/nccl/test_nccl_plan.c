/* SPDX-License-Identifier: MIT */
/* tests/nccl/test_nccl_plan.c - group plan of test_nccl: a plan mismatch is
 * detected on every rank, and rejected arguments never hang the group. */
#define _POSIX_C_SOURCE 200809L
#include "nccl_cases.h"

static int wire_quiet(void) { return g_wire.all_reduce + g_wire.broadcast + g_wire.all_gather == 0; }

/* mxs_nccl_wb_check_plan: OK when all ranks agree, MXS_ERR_PLAN_MISMATCH on
 * EVERY rank when one rank's batch differs (shape; rounding). */
void test_plan_mismatch(mxs_rank *r) {
    const char *name = "plan_mismatch_detected_on_every_rank";
    long before = test_begin(r, name);
    wspec s[3] = {{64, 96, MXS_BOTH, MXS_SCALES_COMPACT, 0},
                  {33, 47, MXS_ROWWISE, MXS_SCALES_SWIZZLED, 0},
                  {5, 3, MXS_COLWISE, MXS_SCALES_PADDED, 0}};
    weight *w = weights_new(r, s, 3, SHARD_UNEVEN, 3u, NULL, NULL, NULL);
    void *scratch = dev_alloc(r, 32);
    int last = r->rank == r->nranks - 1, i, k;
    for (k = 0; k < 4; k++) {
        mxs_wb_item items[3];
        mxs_wb_batch b;
        mxs_wb_plan plan;
        mxs_status st, want = MXS_OK;
        memset(items, 0, sizeof items);
        for (i = 0; i < 3; i++) {
            items[i].primary = w[i].dev;
            items[i].master = w[i].shard_dev;
            items[i].start = w[i].start;
            items[i].len = w[i].len;
        }
        memset(&b, 0, sizeof b);
        b.items = items;
        b.n_items = 3;
        if (k == 1) { /* the last rank's weight 0 has one column fewer (a larger shape would make its
                       * planes overrun their buffers: the plan would reject that as aliasing) */
            want = MXS_ERR_PLAN_MISMATCH;
            if (last) {
                items[0].primary.cols -= 1;
                items[0].start = items[0].len = 0;
            }
        } else if (k == 2) { /* the last rank rounds differently */
            want = MXS_ERR_PLAN_MISMATCH;
            if (last) b.rounding = MXS_ROUND_FLOOR;
        } else if (k == 3) { /* the last rank's batch is shorter */
            want = MXS_ERR_PLAN_MISMATCH;
            if (last) b.n_items = 2;
        }
        ST(r, mxs_wb_make_plan(&b, &plan, NULL), MXS_OK);
        wire_reset();
        st = mxs_nccl_wb_check_plan(&plan, scratch, r->comm, r->stream);
        wire_stop();
        MXS_CHECK(r, st == want, "case %d: mxs_nccl_wb_check_plan -> %s (want %s)", k, mxs_status_str(st),
                  mxs_status_str(want));
        MXS_CHECK(r, g_wire.all_reduce == 1 && g_wire.broadcast + g_wire.all_gather == 0,
                  "case %d: plan check used %d all-reduces", k, g_wire.all_reduce);
    }
    cudaFree(scratch);
    weights_free(w, 3, 1);
    test_end(r, name, before);
}

/* Every rank passes the same bad arguments: each call returns the error,
 * no rank hangs (a writeback joins the one all-reduce when it can, a
 * gather issues nothing), and the communicator stays usable. */
void test_rejects_before_enqueue(mxs_rank *r) {
    const char *name = "invalid_arguments_never_hang_the_group";
    long before = test_begin(r, name);
    wspec s[2] = {{70, 130, MXS_ROWWISE, MXS_SCALES_COMPACT, 0}, {33, 47, MXS_BOTH, MXS_SCALES_SWIZZLED, 0}};
    weight *w = weights_new(r, s, 2, SHARD_UNEVEN, 11u, NULL, NULL, NULL);
    mxs_wb_item items[2];
    mxs_wb_batch b, other;
    mxs_wb_plan plan, other_plan;
    int64_t ws_bytes = 0, starts[2 * MXS_LAUNCH_MAX_RANKS], lens[2 * MXS_LAUNCH_MAX_RANKS];
    void *ws, *packed;
    mxs_tensor ts[2];
    int i, q;
    memset(items, 0, sizeof items);
    for (i = 0; i < 2; i++) {
        items[i].primary = w[i].dev;
        items[i].master = w[i].shard_dev;
        items[i].start = w[i].start;
        items[i].len = w[i].len;
        ts[i] = w[i].dev;
        for (q = 0; q < r->nranks; q++) {
            starts[i * r->nranks + q] = w[i].starts[q];
            lens[i * r->nranks + q] = w[i].lens[q];
        }
    }
    memset(&b, 0, sizeof b);
    b.items = items;
    b.n_items = 2;
    other = b;
    other.n_items = 1;
    wb_buffers(r, &b, &plan, &ws_bytes, &ws, &packed);
    ST(r, mxs_wb_make_plan(&other, &other_plan, NULL), MXS_OK);
    /* Writeback: what makes joining impossible returns at once (no
     * collective); a rank-local failure joins the one all-reduce (zeros,
     * status byte 1) and returns its own error - here on every rank. */
    wire_reset();
    ST(r, mxs_nccl_wb_writeback(&b, &plan, NULL, ws, ws_bytes, r->comm, r->stream), MXS_ERR_INVALID_ARGUMENT);
    ST(r, mxs_nccl_wb_writeback(&b, &plan, (uint8_t *)packed, ws, ws_bytes, NULL, r->stream), MXS_ERR_INVALID_ARGUMENT);
    ST(r, mxs_nccl_wb_writeback(&b, NULL, (uint8_t *)packed, ws, ws_bytes, r->comm, r->stream),
       MXS_ERR_INVALID_ARGUMENT);
    ST(r, mxs_nccl_wb_bucket_writeback(NULL, r->comm, r->stream), MXS_ERR_INVALID_ARGUMENT);
    wire_stop();
    MXS_CHECK(r, wire_quiet(), "a writeback that cannot join issued %d all-reduces", g_wire.all_reduce);
    wire_reset();
    ST(r, mxs_nccl_wb_writeback(&b, &plan, (uint8_t *)packed, ws, ws_bytes - 1, r->comm, r->stream),
       MXS_ERR_BUFFER_SIZE);
    ST(r, mxs_nccl_wb_writeback(&b, &other_plan, (uint8_t *)packed, ws, ws_bytes, r->comm, r->stream),
       MXS_ERR_PLAN_MISMATCH);
    wire_stop();
    CU(r, cudaStreamSynchronize(r->stream));
    MXS_CHECK(r,
              g_wire.all_reduce == 2 && g_wire.broadcast + g_wire.all_gather == 0 && g_wire.non_u8 == 0 &&
                  g_wire.reduce_not_max == 0 && g_wire.reduce_elems == plan.packed_bytes + other_plan.packed_bytes,
              "failing writebacks issued %d all-reduces of %lld bytes (want 2 of %lld)", g_wire.all_reduce,
              g_wire.reduce_elems, (long long)(plan.packed_bytes + other_plan.packed_bytes));
    /* Gather: every argument is validated before anything is enqueued */
    wire_reset();
    ts[1].col_data = NULL;
    ST(r, mxs_nccl_gather_planes(ts, 2, starts, lens, r->comm, r->stream), MXS_ERR_ABSENT_PLANE);
    ts[1] = w[1].dev;
    lens[0] = w[0].elems + 1;
    ST(r, mxs_nccl_gather_planes(ts, 2, starts, lens, r->comm, r->stream), MXS_ERR_RANGE);
    ST(r, mxs_nccl_gather_bucket(w[0].dev.row_data, (int64_t)r->nranks * 3 + 1, r->comm, r->stream),
       MXS_ERR_INVALID_ARGUMENT);
    ST(r, mxs_nccl_gather_bytes(w[0].dev.row_data, w[0].elems, 0, w[0].starts, w[0].lens, r->comm, r->stream),
       MXS_ERR_INVALID_ARGUMENT);
    wire_stop();
    MXS_CHECK(r, wire_quiet(), "a rejected gather issued %d all-reduces, %d broadcasts, %d all-gathers",
              g_wire.all_reduce, g_wire.broadcast, g_wire.all_gather);
    /* the communicator is still in step: a real writeback + gather works */
    weights_update(r, w, 2, 4u, MXS_F32, MXS_ROUND_CEIL);
    writeback(r, w, 2, MXS_ROUND_CEIL, MXS_F32, MXS_WB_FUSED);
    gather_planes(r, w, 2);
    check_full(r, w, 2, "after rejected calls");
    cudaFree(ws);
    cudaFree(packed);
    weights_free(w, 2, 1);
    test_end(r, name, before);
}
