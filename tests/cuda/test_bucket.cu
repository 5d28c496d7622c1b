/* SPDX-License-Identifier: MIT */
/* Suite cuda: the prepared bucket (mxs_cuda_wb_prepare, _bucket_partial,
 * _bucket_apply, _release).
 *
 *   - one bucket serves many updates (new master values, same pointers):
 *     bytes equal mxs_host_wb_partial / _apply every time;
 *   - re-preparing after a change (shard, layout, pointers, options) gives
 *     the bytes of the changed batch;
 *   - misuse the library can see is rejected, nothing enqueued: NULL,
 *     zeroed, released, modified bucket; workspace too small, misaligned,
 *     NULL; the batch changed since the plan;
 *   - an unrelated CUDA error pending before a call is neither swallowed
 *     nor reported as the call's own;
 *   - partial + apply captured in one CUDA graph, replayed with new master
 *     values, equal the host path.
 *
 * One rank (the MAX reduction over one rank is the identity), so partial
 * and apply can run back to back, in one graph. */
#include "common.h"

static void expect(mxs_status got, mxs_status want, const char *what) {
    CHECK(got == want, "%s: got %d (%s), want %d (%s)", what, (int)got, mxs_status_str(got), (int)want,
          mxs_status_str(want));
}

/* A batch of nw weights on one rank, host and device side by side. */
struct Fixture {
    int nw = 0;
    std::vector<Planes> P;
    std::vector<std::vector<uint8_t>> hmaster; /* this rank's shard, host */
    std::vector<DevBuf> dmaster;
    std::vector<std::vector<uint8_t>> hfrag;
    std::vector<DevBuf> dfrag;
    std::vector<mxs_wb_item> hitems, ditems;
    mxs_wb_batch hb, db;
    mxs_wb_plan plan;
    std::vector<uint8_t> hpacked;
    DevBuf dpacked, ws;
    int64_t wsb = 0;
};

static void fixture_make(Fixture &F, int nw, mxs_wb_mode mode, mxs_dtype rt) {
    F.nw = nw;
    F.P.resize((size_t)nw);
    F.hmaster.resize((size_t)nw);
    F.dmaster.resize((size_t)nw);
    F.hfrag.resize((size_t)nw);
    F.dfrag.resize((size_t)nw);
    F.hitems.assign((size_t)nw, mxs_wb_item());
    F.ditems.assign((size_t)nw, mxs_wb_item());
    for (int i = 0; i < nw; i++) {
        int64_t rows, cols;
        rnd_shape(&rows, &cols);
        if (i % 3 == 0) { /* some weights on the fast path */
            rows = rnd_in(64, 200);
            cols = 8 * rnd_in(16, 40);
        }
        const unsigned dirs = (unsigned)rnd_in(1, 3);
        const mxs_scale_layout layout = (mxs_scale_layout)(rnd() % 3);
        const mxs_dtype dt = (mxs_dtype)(rnd() % 3);
        planes_make(F.P[(size_t)i], rows, cols, dirs, layout, rnd() % 5 == 0);
        const int64_t n = rows * cols, eb = mxs_dtype_bytes(dt);
        int64_t start = rnd_in(0, n), len = rnd_in(0, n - start);
        if (i % 4 == 1) {
            start = 0;
            len = n;
        }
        F.hmaster[(size_t)i] = rnd_source(len, dt);
        F.dmaster[(size_t)i] = dev_alloc(len * eb, rnd() % 4 == 0 ? eb : 0);
        if (len > 0) dev_upload(F.dmaster[(size_t)i], F.hmaster[(size_t)i].data(), len * eb);
        mxs_wb_item h;
        memset(&h, 0, sizeof h);
        h.primary = F.P[(size_t)i].h;
        h.master = F.hmaster[(size_t)i].data();
        h.master_dtype = dt;
        h.start = start;
        h.len = len;
        mxs_wb_item d = h;
        d.primary = F.P[(size_t)i].d;
        d.master = F.dmaster[(size_t)i].p;
        if ((dirs & MXS_ROWWISE) && rnd() % 3 == 0) { /* a row-wise fragment (FSDP) */
            F.hfrag[(size_t)i].assign((size_t)len + 1, POISON);
            F.dfrag[(size_t)i] = dev_alloc(len, rnd_in(0, 7));
            h.row_fragment = F.hfrag[(size_t)i].data();
            d.row_fragment = F.dfrag[(size_t)i].p;
        }
        F.hitems[(size_t)i] = h;
        F.ditems[(size_t)i] = d;
    }
    memset(&F.hb, 0, sizeof F.hb);
    F.hb.items = F.hitems.data();
    F.hb.n_items = nw;
    F.hb.mode = mode;
    F.hb.round_through = rt;
    F.hb.rounding = (mxs_rounding)(rnd() % 2);
    F.db = F.hb;
    F.db.items = F.ditems.data();
    CHECK(mxs_wb_make_plan(&F.db, &F.plan, NULL) == MXS_OK, "plan");
    mxs_wb_plan hplan;
    CHECK(mxs_wb_make_plan(&F.hb, &hplan, NULL) == MXS_OK, "host plan");
    CHECK(hplan.packed_bytes == F.plan.packed_bytes, "host and device plans agree");
    F.hpacked.assign((size_t)F.plan.packed_bytes, POISON);
    F.dpacked = dev_alloc(F.plan.packed_bytes, rnd_in(0, 3));
    CHECK(mxs_cuda_wb_prepare_bytes(&F.db, &F.wsb) == MXS_OK && F.wsb >= 0, "workspace query");
    F.ws = dev_alloc(F.wsb);
}

static void fixture_free(Fixture &F) {
    for (int i = 0; i < F.nw; i++) {
        planes_free(F.P[(size_t)i]);
        dev_free(F.dmaster[(size_t)i]);
        dev_free(F.dfrag[(size_t)i]);
    }
    dev_free(F.dpacked);
    dev_free(F.ws);
}

/* New master values in the same buffers (host and device). */
static void fixture_update(Fixture &F) {
    for (int i = 0; i < F.nw; i++) {
        const mxs_wb_item &h = F.hitems[(size_t)i];
        const int64_t eb = mxs_dtype_bytes(h.master_dtype);
        std::vector<uint8_t> fresh = rnd_source(h.len, h.master_dtype);
        memcpy(F.hmaster[(size_t)i].data(), fresh.data(), fresh.size());
        if (h.len > 0) dev_upload(F.dmaster[(size_t)i], fresh.data(), h.len * eb);
    }
}

/* The host path on the host buffers: partial, (one rank: no reduction), apply. */
static void host_writeback(Fixture &F) {
    mxs_wb_plan hplan;
    CHECK(mxs_wb_make_plan(&F.hb, &hplan, NULL) == MXS_OK, "host plan");
    CHECK(mxs_host_wb_partial(&F.hb, &hplan, F.hpacked.data()) == MXS_OK, "host partial");
    CHECK(mxs_host_wb_apply(&F.hb, &hplan, F.hpacked.data()) == MXS_OK, "host apply");
}

static void compare(Fixture &F, const char *ctx) {
    CUDA_OK(cudaDeviceSynchronize());
    char what[160];
    for (int i = 0; i < F.nw; i++) {
        snprintf(what, sizeof what, "%.100s: item %d", ctx, i);
        planes_compare(F.P[(size_t)i], what);
        if (F.dfrag[(size_t)i].base) {
            snprintf(what, sizeof what, "%.100s: item %d row fragment", ctx, i);
            dev_compare(F.dfrag[(size_t)i], F.hfrag[(size_t)i].data(), what);
        }
    }
    snprintf(what, sizeof what, "%.100s: packed", ctx);
    dev_compare(F.dpacked, F.hpacked.data(), what);
}

/* One bucket, three updates; then a change and a re-prepare. */
static void bucket_serves_updates_and_reprepare(mxs_wb_mode mode, mxs_dtype rt, int nw) {
    Fixture F;
    fixture_make(F, nw, mode, rt);
    mxs_cuda_wb_bucket bk;
    expect(mxs_cuda_wb_prepare(&bk, &F.db, &F.plan, F.dpacked.p, F.ws.p, F.wsb, 0), MXS_OK, "prepare");
    for (int u = 0; u < 3; u++) {
        if (u > 0) fixture_update(F);
        expect(mxs_cuda_wb_bucket_partial(&bk, 0), MXS_OK, "bucket partial");
        expect(mxs_cuda_wb_bucket_apply(&bk, 0), MXS_OK, "bucket apply");
        host_writeback(F);
        char ctx[96];
        snprintf(ctx, sizeof ctx, "%d items, mode %d, update %d", nw, (int)mode, u);
        compare(F, ctx);
    }
    /* a change of every kind a re-prepare must pick up: shards, options */
    for (int i = 0; i < nw; i++) {
        mxs_wb_item &h = F.hitems[(size_t)i], &d = F.ditems[(size_t)i];
        const int64_t len = h.len / 2;
        h.start += h.len - len; /* the tail half of the old shard: same master buffer, offset */
        d.start = h.start;
        h.master = (const uint8_t *)h.master + (h.len - len) * mxs_dtype_bytes(h.master_dtype);
        d.master = (const uint8_t *)d.master + (d.len - len) * mxs_dtype_bytes(d.master_dtype);
        h.len = d.len = len;
        if (h.row_fragment) {
            h.row_fragment = F.hfrag[(size_t)i].data();
            d.row_fragment = F.dfrag[(size_t)i].p;
        }
    }
    F.hb.rounding = F.db.rounding = (mxs_rounding)(1 - (int)F.hb.rounding);
    expect(mxs_cuda_wb_bucket_partial(&bk, 0), MXS_OK, "the stale bucket still runs (it cannot see the change)");
    CUDA_OK(cudaDeviceSynchronize());
    expect(mxs_cuda_wb_prepare(&bk, &F.db, &F.plan, F.dpacked.p, F.ws.p, F.wsb, 0), MXS_ERR_PLAN_MISMATCH,
           "prepare with the old plan after the change");
    CHECK(bk.magic == 0, "a failed prepare leaves the bucket unprepared");
    expect(mxs_cuda_wb_bucket_partial(&bk, 0), MXS_ERR_INVALID_ARGUMENT, "the bucket of a failed prepare");
    expect(mxs_wb_make_plan(&F.db, &F.plan, NULL), MXS_OK, "new plan");
    expect(mxs_cuda_wb_prepare(&bk, &F.db, &F.plan, F.dpacked.p, F.ws.p, F.wsb, 0), MXS_OK, "re-prepare");
    fixture_update(F);
    expect(mxs_cuda_wb_bucket_partial(&bk, 0), MXS_OK, "re-prepared partial");
    expect(mxs_cuda_wb_bucket_apply(&bk, 0), MXS_OK, "re-prepared apply");
    host_writeback(F);
    compare(F, "after re-prepare");
    expect(mxs_cuda_wb_bucket_release(&bk), MXS_OK, "release");
    fixture_free(F);
}

/* Misuse the library can see: rejected, nothing enqueued. */
static void bucket_misuse_rejected(void) {
    Fixture F;
    fixture_make(F, 3, MXS_WB_FUSED, MXS_F32);
    mxs_cuda_wb_bucket bk, zero;
    memset(&zero, 0, sizeof zero);
    expect(mxs_cuda_wb_bucket_partial(NULL, 0), MXS_ERR_INVALID_ARGUMENT, "NULL bucket");
    expect(mxs_cuda_wb_bucket_partial(&zero, 0), MXS_ERR_INVALID_ARGUMENT, "zeroed bucket (partial)");
    expect(mxs_cuda_wb_bucket_apply(&zero, 0), MXS_ERR_INVALID_ARGUMENT, "zeroed bucket (apply)");
    expect(mxs_cuda_wb_prepare(NULL, &F.db, &F.plan, F.dpacked.p, F.ws.p, F.wsb, 0), MXS_ERR_INVALID_ARGUMENT,
           "prepare into NULL");
    expect(mxs_cuda_wb_prepare(&bk, &F.db, &F.plan, F.dpacked.p, F.ws.p, F.wsb - 1, 0), MXS_ERR_BUFFER_SIZE,
           "workspace one byte short");
    expect(mxs_cuda_wb_prepare(&bk, &F.db, &F.plan, F.dpacked.p, NULL, F.wsb, 0), MXS_ERR_INVALID_ARGUMENT,
           "NULL workspace");
    expect(mxs_cuda_wb_prepare(&bk, &F.db, &F.plan, F.dpacked.p, F.ws.p + 8, F.wsb, 0), MXS_ERR_INVALID_ARGUMENT,
           "workspace not 16-byte aligned");
    expect(mxs_cuda_wb_prepare(&bk, &F.db, &F.plan, NULL, F.ws.p, F.wsb, 0), MXS_ERR_INVALID_ARGUMENT, "NULL packed");
    expect(mxs_cuda_wb_prepare(&bk, &F.db, NULL, F.dpacked.p, F.ws.p, F.wsb, 0), MXS_ERR_INVALID_ARGUMENT, "NULL plan");
    F.db.rounding = (mxs_rounding)(1 - (int)F.db.rounding); /* the batch changed since the plan */
    expect(mxs_cuda_wb_prepare(&bk, &F.db, &F.plan, F.dpacked.p, F.ws.p, F.wsb, 0), MXS_ERR_PLAN_MISMATCH,
           "batch changed since the plan");
    F.db.rounding = F.hb.rounding;
    CUDA_OK(cudaDeviceSynchronize());
    dev_untouched(F.ws, "rejected prepares: workspace untouched");
    dev_untouched(F.dpacked, "rejected prepares: packed untouched");

    expect(mxs_cuda_wb_prepare(&bk, &F.db, &F.plan, F.dpacked.p, F.ws.p, F.wsb, 0), MXS_OK, "prepare");
    mxs_cuda_wb_bucket edited = bk;
    edited.units[0] += 1;
    expect(mxs_cuda_wb_bucket_partial(&edited, 0), MXS_ERR_INVALID_ARGUMENT, "modified bucket");
    edited = bk;
    edited.packed += 1;
    expect(mxs_cuda_wb_bucket_apply(&edited, 0), MXS_ERR_INVALID_ARGUMENT, "modified bucket (packed)");
    CUDA_OK(cudaDeviceSynchronize());
    dev_untouched(F.dpacked, "rejected phases: packed untouched");
    for (int i = 0; i < F.nw; i++) {
        char what[64];
        snprintf(what, sizeof what, "rejected phases: item %d untouched", i);
        for (int k = 0; k < 4; k++)
            if (F.P[(size_t)i].dbuf[k].base) dev_untouched(F.P[(size_t)i].dbuf[k], what);
    }
    expect(mxs_cuda_wb_bucket_release(&bk), MXS_OK, "release");
    expect(mxs_cuda_wb_bucket_partial(&bk, 0), MXS_ERR_INVALID_ARGUMENT, "released bucket");
    expect(mxs_cuda_wb_bucket_release(NULL), MXS_ERR_INVALID_ARGUMENT, "release NULL");
    CHECK(mxs_cuda_wb_bucket_size() == sizeof(mxs_cuda_wb_bucket), "mxs_cuda_wb_bucket_size");
    fixture_free(F);
}

__global__ void no_op_kernel(void) {}

/* An error pending before the call (a failed launch of someone else) is
 * left for its owner: the call returns MXS_ERR_CUDA without enqueuing, and
 * cudaGetLastError() still returns the earlier error afterwards. */
static void pending_error_left_to_its_owner(void) {
    Fixture F;
    fixture_make(F, 2, MXS_WB_FUSED, MXS_F32);
    mxs_cuda_wb_bucket bk;
    expect(mxs_cuda_wb_prepare(&bk, &F.db, &F.plan, F.dpacked.p, F.ws.p, F.wsb, 0), MXS_OK, "prepare");
    CUDA_OK(cudaDeviceSynchronize());
    no_op_kernel<<<1, 4096>>>(); /* more threads than a block may have: a non-sticky launch error, now pending */
    const cudaError_t pending = cudaPeekAtLastError(); /* whichever code this runtime gives it */
    CHECK(pending != cudaSuccess, "the bad launch left an error pending");
    expect(mxs_cuda_wb_bucket_partial(&bk, 0), MXS_ERR_CUDA, "partial with an unrelated error pending");
    const cudaError_t after = cudaGetLastError();
    CHECK(after == pending, "the unrelated error is still pending for its owner (%s, was %s)", cudaGetErrorName(after),
          cudaGetErrorName(pending));
    CUDA_OK(cudaDeviceSynchronize());
    dev_untouched(F.dpacked, "nothing enqueued while the error was pending");
    expect(mxs_cuda_wb_bucket_partial(&bk, 0), MXS_OK, "partial once the error is consumed");
    expect(mxs_cuda_wb_bucket_apply(&bk, 0), MXS_OK, "apply");
    CHECK(cudaGetLastError() == cudaSuccess, "a successful call leaves no error");
    host_writeback(F);
    compare(F, "after the pending error");
    fixture_free(F);
}

/* partial + apply captured once in a CUDA graph, replayed with new values. */
static void graph_capture_replays_with_new_masters(mxs_wb_mode mode, int nw) {
    Fixture F;
    fixture_make(F, nw, mode, MXS_BF16);
    cudaStream_t stream;
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    mxs_cuda_wb_bucket bk;
    expect(mxs_cuda_wb_prepare(&bk, &F.db, &F.plan, F.dpacked.p, F.ws.p, F.wsb, stream), MXS_OK, "prepare");
    CUDA_OK(cudaStreamSynchronize(stream));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    mxs_status sp = mxs_cuda_wb_bucket_partial(&bk, stream);
    mxs_status sa = mxs_cuda_wb_bucket_apply(&bk, stream);
    CUDA_OK(cudaStreamEndCapture(stream, &graph));
    expect(sp, MXS_OK, "partial under capture");
    expect(sa, MXS_OK, "apply under capture");
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    for (int u = 0; u < 3; u++) {
        fixture_update(F);
        /* the uploads ran on the legacy stream, which `stream` does not wait for */
        CUDA_OK(cudaDeviceSynchronize());
        CUDA_OK(cudaGraphLaunch(exec, stream));
        CUDA_OK(cudaStreamSynchronize(stream));
        host_writeback(F);
        char ctx[96];
        snprintf(ctx, sizeof ctx, "graph replay %d (%d items, mode %d)", u, nw, (int)mode);
        compare(F, ctx);
    }
    CUDA_OK(cudaGraphExecDestroy(exec));
    CUDA_OK(cudaGraphDestroy(graph));
    CUDA_OK(cudaStreamDestroy(stream));
    fixture_free(F);
}

int main(void) {
    require_gpu();
    bucket_serves_updates_and_reprepare(MXS_WB_FUSED, MXS_BF16, 5);
    bucket_serves_updates_and_reprepare(MXS_WB_STRICT, MXS_F32, 4);
    bucket_serves_updates_and_reprepare(MXS_WB_FUSED, MXS_F16, 80); /* several parameter blocks of records */
    tap_point("bucket_prepared_once_serves_every_update_and_re_prepare_picks_up_changes");
    bucket_misuse_rejected();
    tap_point("bucket_misuse_is_rejected_with_nothing_enqueued");
    if (getenv("MXS_SANITIZER")) {
        /* compute-sanitizer reports the deliberately failed launch as an error */
        printf("ok %d - an_unrelated_pending_cuda_error_is_neither_swallowed_nor_reported_as_ours # SKIP under "
               "compute-sanitizer\n",
               ++g_tap_points);
    } else {
        pending_error_left_to_its_owner();
        tap_point("an_unrelated_pending_cuda_error_is_neither_swallowed_nor_reported_as_ours");
    }
    graph_capture_replays_with_new_masters(MXS_WB_FUSED, 6);
    graph_capture_replays_with_new_masters(MXS_WB_STRICT, 3);
    tap_point("bucket_partial_and_apply_captured_in_a_cuda_graph_replay_with_new_masters");
    return tap_done();
}
