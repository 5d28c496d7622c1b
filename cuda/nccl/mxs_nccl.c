/* SPDX-License-Identifier: MIT */
/* cuda/nccl/mxs_nccl.c - NCCL glue of mxshard (see include/mxshard/nccl.h).
 *
 * Host code only: it validates, then enqueues the CUDA kernels of
 * libmxshard_cuda and NCCL collectives on the caller's stream. Every
 * collective goes through mxs__nccl_issue(), the one place that calls NCCL
 * collectives. No state: nothing static, nothing per thread. (The tests
 * see what goes on the wire by interposing NCCL's entry points - NCCL
 * exports them as weak aliases of its pncclXxx profiling names - not
 * through a hook in this library.)
 */
#include <mxshard/nccl.h>

typedef enum {
    MXS__NCCL_ALL_REDUCE = 0, /* ncclAllReduce */
    MXS__NCCL_BROADCAST = 1,  /* ncclBroadcast */
    MXS__NCCL_ALL_GATHER = 2  /* ncclAllGather */
} mxs__nccl_op;

/* The one place that calls NCCL collectives. `send` may be NULL only for
 * MXS__NCCL_BROADCAST on a non-root rank (NCCL ignores it there). */
static ncclResult_t mxs__nccl_issue(mxs__nccl_op op, const void *send, void *recv, size_t count, ncclDataType_t type,
                                    ncclRedOp_t red, int root, ncclComm_t comm, cudaStream_t stream) {
    switch (op) {
    case MXS__NCCL_ALL_REDUCE: return ncclAllReduce(send, recv, count, type, red, comm, stream);
    case MXS__NCCL_BROADCAST: return ncclBroadcast(send, recv, count, type, root, comm, stream);
    case MXS__NCCL_ALL_GATHER: return ncclAllGather(send, recv, count, type, comm, stream);
    }
    return ncclInvalidArgument;
}

/* nranks and rank of `comm`; MXS_ERR_NCCL when NCCL refuses the handle. */
static mxs_status mxs__nccl_comm_info(ncclComm_t comm, int *nranks, int *rank) {
    if (!comm) return MXS_ERR_INVALID_ARGUMENT;
    if (ncclCommCount(comm, nranks) != ncclSuccess) return MXS_ERR_NCCL;
    if (ncclCommUserRank(comm, rank) != ncclSuccess) return MXS_ERR_NCCL;
    if (*nranks < 1 || *rank < 0 || *rank >= *nranks) return MXS_ERR_NCCL;
    return MXS_OK;
}

/* ---- writeback ----------------------------------------------------------- */

/* Whether a packed buffer description can take part in the group's
 * all-reduce: `packed` holds `bytes` bytes ending with the status byte. */
static int mxs__wb_joinable(const uint8_t *packed, int64_t bytes, int64_t status_offset) {
    return bytes > 0 && packed && status_offset == bytes - 1;
}

/* The group's one MAX all-reduce of the packed buffer. */
static mxs_status mxs__wb_reduce(uint8_t *packed, int64_t bytes, ncclComm_t comm, cudaStream_t stream) {
    if (mxs__nccl_issue(MXS__NCCL_ALL_REDUCE, packed, packed, (size_t)bytes, ncclUint8, ncclMax, 0, comm, stream) !=
        ncclSuccess)
        return MXS_ERR_NCCL;
    return MXS_OK;
}

/* A rank-local failure `err` before the reduction: this rank still joins
 * the group's one all-reduce - with zeros (nothing of its batch) and the
 * status byte 1 - so that no other rank waits forever, and every other rank
 * reads the 1 after the reduction and skips apply (MXS_ERR_REMOTE). Returns
 * `err`. */
static mxs_status mxs__wb_join_failed(uint8_t *packed, int64_t bytes, int64_t status_offset, ncclComm_t comm,
                                      cudaStream_t stream, mxs_status err) {
    if (cudaMemsetAsync(packed, 0, (size_t)bytes, stream) != cudaSuccess ||
        cudaMemsetAsync(packed + status_offset, 1, 1, stream) != cudaSuccess)
        (void)cudaGetLastError(); /* our error; the all-reduce is still issued (a hang is worse) */
    (void)mxs__wb_reduce(packed, bytes, comm, stream);
    return err;
}

/* After the reduction: the group status byte (one byte to the host and a
 * synchronisation of `stream`). MXS_ERR_REMOTE when some rank failed. */
static mxs_status mxs__wb_group_status(const uint8_t *packed, int64_t status_offset, cudaStream_t stream) {
    uint8_t group = 0;
    if (cudaMemcpyAsync(&group, packed + status_offset, 1, cudaMemcpyDeviceToHost, stream) != cudaSuccess ||
        cudaStreamSynchronize(stream) != cudaSuccess) {
        (void)cudaGetLastError();
        return MXS_ERR_CUDA;
    }
    return group ? MXS_ERR_REMOTE : MXS_OK;
}

mxs_status mxs_nccl_wb_bucket_writeback(const mxs_cuda_wb_bucket *bucket, ncclComm_t comm, cudaStream_t stream) {
    int nranks, rank;
    mxs_status s;
    /* Nothing can be joined without a trustworthy packed buffer or
     * communicator: those errors return at once (on every rank alike when
     * every rank passes the same bad arguments). */
    if (!bucket || bucket->magic != MXS_CUDA_WB_BUCKET_MAGIC) return MXS_ERR_INVALID_ARGUMENT;
    if ((s = mxs__nccl_comm_info(comm, &nranks, &rank)) != MXS_OK) return s;
    if (!mxs__wb_joinable(bucket->packed, bucket->packed_bytes, bucket->status_offset))
        return bucket->packed_bytes == 0 && bucket->n_items == 0 ? MXS_OK : MXS_ERR_INVALID_ARGUMENT;

    if ((s = mxs_cuda_wb_bucket_partial(bucket, stream)) != MXS_OK)
        return mxs__wb_join_failed(bucket->packed, bucket->packed_bytes, bucket->status_offset, comm, stream, s);
    if ((s = mxs__wb_reduce(bucket->packed, bucket->packed_bytes, comm, stream)) != MXS_OK) return s;
    if ((s = mxs__wb_group_status(bucket->packed, bucket->status_offset, stream)) != MXS_OK) return s;
    return mxs_cuda_wb_bucket_apply(bucket, stream);
}

mxs_status mxs_nccl_wb_writeback(const mxs_wb_batch *b, const mxs_wb_plan *plan, uint8_t *packed, void *workspace,
                                 int64_t workspace_bytes, ncclComm_t comm, cudaStream_t stream) {
    mxs_cuda_wb_bucket bucket;
    int nranks, rank;
    mxs_status s;
    if (!plan) return MXS_ERR_INVALID_ARGUMENT;
    if ((s = mxs__nccl_comm_info(comm, &nranks, &rank)) != MXS_OK) return s;
    if (!mxs__wb_joinable(packed, plan->packed_bytes, plan->status_offset)) {
        /* an empty plan without a status byte: nothing to reduce, nothing to do */
        if (plan->packed_bytes == 0 && plan->n_items == 0) return mxs__wb_check_plan(b, plan);
        return MXS_ERR_INVALID_ARGUMENT;
    }
    /* validation once: the plan check (aliasing included), the buffers */
    s = mxs_cuda_wb_prepare(&bucket, b, plan, packed, workspace, workspace_bytes, stream);
    if (s != MXS_OK) return mxs__wb_join_failed(packed, plan->packed_bytes, plan->status_offset, comm, stream, s);
    return mxs_nccl_wb_bucket_writeback(&bucket, comm, stream);
}

mxs_status mxs_nccl_wb_check_plan(const mxs_wb_plan *plan, void *scratch, ncclComm_t comm, cudaStream_t stream) {
    uint64_t mine[4], all[4], sz = 0xCBF29CE484222325ull;
    int nranks, rank, k;
    mxs_status s;
    if (!plan || !scratch) return MXS_ERR_INVALID_ARGUMENT;
    if ((s = mxs__nccl_comm_info(comm, &nranks, &rank)) != MXS_OK) return s;
    sz = mxs__fnv_u64(sz, (uint64_t)plan->n_items);
    sz = mxs__fnv_u64(sz, (uint64_t)plan->packed_bytes);
    sz = mxs__fnv_u64(sz, (uint64_t)plan->row_region_bytes);
    mine[0] = plan->fingerprint;
    mine[1] = ~plan->fingerprint;
    mine[2] = sz;
    mine[3] = ~sz;
    if (cudaMemcpyAsync(scratch, mine, sizeof mine, cudaMemcpyHostToDevice, stream) != cudaSuccess) return MXS_ERR_CUDA;
    if (mxs__nccl_issue(MXS__NCCL_ALL_REDUCE, scratch, scratch, 4, ncclUint64, ncclMax, 0, comm, stream) != ncclSuccess)
        return MXS_ERR_NCCL;
    if (cudaMemcpyAsync(all, scratch, sizeof all, cudaMemcpyDeviceToHost, stream) != cudaSuccess) return MXS_ERR_CUDA;
    if (cudaStreamSynchronize(stream) != cudaSuccess) return MXS_ERR_CUDA;
    for (k = 0; k < 4; k++)
        if (all[k] != mine[k]) return MXS_ERR_PLAN_MISMATCH;
    return MXS_OK;
}

/* ---- gather ---------------------------------------------------------------- */

/* Batches collectives into ncclGroupStart/End groups of at most
 * MXS_NCCL_GROUP_OPS operations. After the first failure no further
 * operation is issued, but an open group is still closed. */
typedef struct mxs__group {
    ncclComm_t comm;
    cudaStream_t stream;
    int ops;
    ncclResult_t err;
} mxs__group;

static void mxs__group_bcast(mxs__group *g, uint8_t *base, int64_t first_byte, int64_t bytes, int root) {
    if (g->err != ncclSuccess || bytes <= 0) return;
    if (g->ops == 0 && (g->err = ncclGroupStart()) != ncclSuccess) return;
    g->ops++;
    g->err = mxs__nccl_issue(MXS__NCCL_BROADCAST, base + first_byte, base + first_byte, (size_t)bytes, ncclUint8,
                             ncclSum, root, g->comm, g->stream);
    if (g->ops == MXS_NCCL_GROUP_OPS || g->err != ncclSuccess) {
        ncclResult_t end = ncclGroupEnd();
        if (g->err == ncclSuccess) g->err = end;
        g->ops = 0;
    }
}

static mxs_status mxs__group_finish(mxs__group *g) {
    if (g->ops > 0) {
        ncclResult_t end = ncclGroupEnd();
        if (g->err == ncclSuccess) g->err = end;
        g->ops = 0;
    }
    return g->err == ncclSuccess ? MXS_OK : MXS_ERR_NCCL;
}

/* One flat buffer: each rank's segment (mxs_gather_segment), in rank order. */
static void mxs__gather_one(mxs__group *g, uint8_t *buf, int64_t elem_bytes, const int64_t *starts, const int64_t *lens,
                            int nranks) {
    int q;
    for (q = 0; q < nranks; q++) {
        int64_t seg_start, seg_len;
        mxs_gather_segment(starts, lens, nranks, q, &seg_start, &seg_len);
        if (seg_len > 0) mxs__group_bcast(g, buf, seg_start * elem_bytes, seg_len * elem_bytes, q);
    }
}

/* Validates a shard table of nranks entries against a buffer of `elems`. */
static mxs_status mxs__check_table(int64_t elems, const int64_t *starts, const int64_t *lens, int nranks, int *any) {
    int q;
    mxs_status s;
    for (q = 0; q < nranks; q++) {
        if ((s = mxs_shard_check(elems, starts[q], lens[q])) != MXS_OK) return s;
        if (lens[q] > 0) *any = 1;
    }
    return MXS_OK;
}

mxs_status mxs_nccl_gather_bytes(void *buf, int64_t elems, int64_t elem_bytes, const int64_t *starts,
                                 const int64_t *lens, ncclComm_t comm, cudaStream_t stream) {
    int nranks, rank, any = 0;
    int64_t bytes;
    mxs__group g;
    mxs_status s;
    if (!starts || !lens || elems < 0 || elem_bytes < 1) return MXS_ERR_INVALID_ARGUMENT;
    if (!mxs_mul_ok(elems, elem_bytes, &bytes)) return MXS_ERR_OVERFLOW;
    if ((s = mxs__nccl_comm_info(comm, &nranks, &rank)) != MXS_OK) return s;
    if ((s = mxs__check_table(elems, starts, lens, nranks, &any)) != MXS_OK) return s;
    if (any && !buf) return MXS_ERR_INVALID_ARGUMENT;
    g.comm = comm;
    g.stream = stream;
    g.ops = 0;
    g.err = ncclSuccess;
    if (any) mxs__gather_one(&g, (uint8_t *)buf, elem_bytes, starts, lens, nranks);
    return mxs__group_finish(&g);
}

mxs_status mxs_nccl_gather_planes(const mxs_tensor *weights, int64_t n_weights, const int64_t *starts,
                                  const int64_t *lens, ncclComm_t comm, cudaStream_t stream) {
    int nranks, rank;
    int64_t i;
    mxs__group g;
    mxs_status s;
    if (n_weights < 0 || (n_weights > 0 && (!weights || !starts || !lens))) return MXS_ERR_INVALID_ARGUMENT;
    if ((s = mxs__nccl_comm_info(comm, &nranks, &rank)) != MXS_OK) return s;
    if (n_weights > INT64_MAX / nranks) return MXS_ERR_OVERFLOW;
    for (i = 0; i < n_weights; i++) {
        const mxs_tensor *t = &weights[i];
        int any = 0;
        if ((s = mxs_tensor_check_shape(t)) != MXS_OK) return s;
        if ((t->dirs & MXS_ROWWISE) && !t->row_data) return MXS_ERR_ABSENT_PLANE;
        if ((t->dirs & MXS_COLWISE) && !t->col_data) return MXS_ERR_ABSENT_PLANE;
        s = mxs__check_table(t->rows * t->cols, starts + i * nranks, lens + i * nranks, nranks, &any);
        if (s != MXS_OK) return s;
    }
    g.comm = comm;
    g.stream = stream;
    g.ops = 0;
    g.err = ncclSuccess;
    for (i = 0; i < n_weights; i++) {
        const mxs_tensor *t = &weights[i];
        if (t->dirs & MXS_ROWWISE) mxs__gather_one(&g, t->row_data, 1, starts + i * nranks, lens + i * nranks, nranks);
        if (t->dirs & MXS_COLWISE) mxs__gather_one(&g, t->col_data, 1, starts + i * nranks, lens + i * nranks, nranks);
    }
    return mxs__group_finish(&g);
}

mxs_status mxs_nccl_gather_bucket(uint8_t *bucket, int64_t bucket_bytes, ncclComm_t comm, cudaStream_t stream) {
    int nranks, rank;
    int64_t chunk;
    mxs_status s;
    if (bucket_bytes < 0) return MXS_ERR_INVALID_ARGUMENT;
    if ((s = mxs__nccl_comm_info(comm, &nranks, &rank)) != MXS_OK) return s;
    if (bucket_bytes % nranks != 0) return MXS_ERR_INVALID_ARGUMENT;
    chunk = bucket_bytes / nranks;
    if (chunk == 0) return MXS_OK;
    if (!bucket) return MXS_ERR_INVALID_ARGUMENT;
    if (mxs__nccl_issue(MXS__NCCL_ALL_GATHER, bucket + (int64_t)rank * chunk, bucket, (size_t)chunk, ncclUint8, ncclSum,
                        0, comm, stream) != ncclSuccess)
        return MXS_ERR_NCCL;
    return MXS_OK;
}

/* ---- NVFP4 ------------------------------------------------------------------ */

/* Whether an NVFP4 plan's packed buffer can take part in the group's
 * all-reduce (the conditions of mxs_host_nvfp4_wb_writeback). */
static int mxs__nvfp4_joinable(const mxs_nvfp4_wb_plan *plan, const void *packed) {
    return packed && (plan->entry_bytes == 2 || plan->entry_bytes == 4) && plan->packed_count >= 1 &&
           plan->packed_bytes == plan->packed_count * plan->entry_bytes &&
           plan->status_offset == plan->packed_bytes - 1 &&
           (uint64_t)(uintptr_t)packed % (uint64_t)plan->entry_bytes == 0;
}

/* The group's one MAX all-reduce of the packed entries. 4-byte entries:
 * ncclUint32. 2-byte entries: NCCL has no 16-bit unsigned type, so they go as
 * ncclBfloat16 - exact, because every 2-byte entry is the bf16 pattern of a
 * non-negative, non-NaN amax (or 0x0101 in a failed rank's status entry, a
 * positive normal bf16), and for those MAX over the bf16 values is MAX over
 * the uint16 patterns; NCCL reduces bf16 MAX with __hmax / max.bf16 (IEEE
 * maxNum, subnormals kept) on sm_80+. */
static mxs_status mxs__nvfp4_reduce(void *packed, const mxs_nvfp4_wb_plan *plan, ncclComm_t comm, cudaStream_t stream) {
    if (mxs__nccl_issue(MXS__NCCL_ALL_REDUCE, packed, packed, (size_t)plan->packed_count,
                        plan->entry_bytes == 2 ? ncclBfloat16 : ncclUint32, ncclMax, 0, comm, stream) != ncclSuccess)
        return MXS_ERR_NCCL;
    return MXS_OK;
}

mxs_status mxs_nccl_nvfp4_wb_writeback(const mxs_nvfp4_wb_batch *b, const mxs_nvfp4_wb_plan *plan, void *packed,
                                       ncclComm_t comm, cudaStream_t stream) {
    int nranks, rank;
    mxs_status s;
    if (!plan) return MXS_ERR_INVALID_ARGUMENT;
    if ((s = mxs__nccl_comm_info(comm, &nranks, &rank)) != MXS_OK) return s;
    if (!mxs__nvfp4_joinable(plan, packed)) return MXS_ERR_INVALID_ARGUMENT;
    if ((s = mxs_cuda_nvfp4_wb_partial(b, plan, packed, stream)) != MXS_OK) {
        /* join with zeros and a status entry of 1 bytes (its last byte is the status byte) */
        uint8_t *p = (uint8_t *)packed;
        if (cudaMemsetAsync(p, 0, (size_t)plan->packed_bytes, stream) != cudaSuccess ||
            cudaMemsetAsync(p + plan->packed_bytes - plan->entry_bytes, 1, (size_t)plan->entry_bytes, stream) !=
                cudaSuccess)
            (void)cudaGetLastError(); /* our error; the all-reduce is still issued (a hang is worse) */
        (void)mxs__nvfp4_reduce(packed, plan, comm, stream);
        return s;
    }
    if ((s = mxs__nvfp4_reduce(packed, plan, comm, stream)) != MXS_OK) return s;
    if ((s = mxs__wb_group_status((const uint8_t *)packed, plan->status_offset, stream)) != MXS_OK) return s;
    return mxs_cuda_nvfp4_wb_apply(b, plan, packed, stream);
}

/* One NVFP4 buffer (a row-wise plane or a column stage of n elements): each
 * rank's element segment, sent as its bytes [lo/2, ceil(hi/2)). */
static void mxs__nvfp4_gather_one(mxs__group *g, uint8_t *buf, const int64_t *starts, const int64_t *lens, int nranks) {
    int q;
    for (q = 0; q < nranks; q++) {
        int64_t lo, len;
        mxs_gather_segment(starts, lens, nranks, q, &lo, &len);
        if (len > 0) mxs__group_bcast(g, buf, lo / 2, (lo + len + 1) / 2 - lo / 2, q);
    }
}

mxs_status mxs_nccl_nvfp4_gather(const mxs_nvfp4_wb_item *items, int64_t n_items, const int64_t *starts,
                                 const int64_t *lens, ncclComm_t comm, cudaStream_t stream) {
    int nranks, rank, q;
    int64_t i;
    mxs__group g;
    mxs_status s;
    if (n_items < 0 || (n_items > 0 && (!items || !starts || !lens))) return MXS_ERR_INVALID_ARGUMENT;
    if ((s = mxs__nccl_comm_info(comm, &nranks, &rank)) != MXS_OK) return s;
    if (n_items > INT64_MAX / nranks) return MXS_ERR_OVERFLOW;
    for (i = 0; i < n_items; i++) {
        const mxs_nvfp4_tensor *t = &items[i].primary;
        if ((s = mxs_nvfp4_tensor_check_shape(t)) != MXS_OK) return s;
        if ((t->dirs & MXS_ROWWISE) && !t->row_data) return MXS_ERR_ABSENT_PLANE;
        if (items[i].col_stage && !(t->dirs & MXS_COLWISE)) return MXS_ERR_ABSENT_PLANE;
        for (q = 0; q < nranks; q++)
            if ((s = mxs_nvfp4_shard_check(t->rows * t->cols, starts[i * nranks + q], lens[i * nranks + q])) != MXS_OK)
                return s;
    }
    g.comm = comm;
    g.stream = stream;
    g.ops = 0;
    g.err = ncclSuccess;
    for (i = 0; i < n_items; i++) {
        const mxs_nvfp4_wb_item *it = &items[i];
        if (it->primary.dirs & MXS_ROWWISE)
            mxs__nvfp4_gather_one(&g, it->primary.row_data, starts + i * nranks, lens + i * nranks, nranks);
        if (it->col_stage) mxs__nvfp4_gather_one(&g, it->col_stage, starts + i * nranks, lens + i * nranks, nranks);
    }
    return mxs__group_finish(&g);
}
