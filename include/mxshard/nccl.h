/* SPDX-License-Identifier: MIT */
/* mxshard/nccl.h - NCCL glue (libmxshard_nccl): writeback with exactly one
 * uint8 MAX all-reduce, the quantized-byte gather, and a plan check.
 *
 * Link with libmxshard_nccl (meson: mxshard_nccl_dep = libmxshard_cuda +
 * NCCL + the CUDA runtime).
 *
 * All calls run on the caller's communicator and stream, enqueue work and
 * return (asynchronous, like NCCL itself), except mxs_nccl_wb_check_plan
 * (synchronises `stream` to read the verdict) and the writeback (after its
 * all-reduce it reads the one group status byte: a 1-byte copy and a
 * synchronisation of `stream`). Failures map to MXS_ERR_NCCL (an NCCL call
 * failed) and MXS_ERR_CUDA (a CUDA runtime call failed); nothing prints or
 * aborts. Like any collective, each call must be made by every rank of
 * `comm`, in the same order, with the same plan / shapes / shard tables.
 *
 * Never hang the group. Gather calls validate every argument before
 * anything is enqueued: a rejected call issues no collective, so ranks that
 * all pass the same (bad) arguments all return the same error. The
 * writeback goes further: a rank that fails locally (its batch no longer
 * matches its plan, a workspace too small or misaligned, an overlap, a
 * failed launch, ...) still joins the group's one all-reduce - with a
 * zero-filled packed buffer whose trailing status byte is 1 - and returns
 * its own error; every other rank sees the 1 after the reduction, skips
 * apply and returns MXS_ERR_REMOTE. Only what makes joining impossible
 * returns at once: a NULL plan or bucket, a NULL packed buffer, an invalid
 * communicator. Ranks whose PLANS differ cannot meet in one all-reduce
 * (different sizes): check plans once with mxs_nccl_wb_check_plan. A
 * failing rank's packed buffer is still written (zeros, then the reduced
 * bytes) - also when its failure was that the buffer overlaps another one
 * (MXS_ERR_ALIASING): joining is what keeps the group alive.
 *
 *   per rank                                     collectives
 *   --------                                     -----------
 *   mxs_wb_make_plan       (host, no comm)
 *   mxs_nccl_wb_check_plan (opt-in, once)        1 x AllReduce u64 MAX (32 B)
 *   mxs_nccl_wb_writeback  partial -> reduce ->  1 x AllReduce u8  MAX
 *   (or _bucket_writeback) status -> apply           (plan->packed_bytes)
 *   mxs_nccl_gather_planes / _gather_bucket      Broadcasts / 1 AllGather, u8
 *   mxs_cuda_convert_scales (optional swizzle)   none
 */
#ifndef MXSHARD_NCCL_H
#define MXSHARD_NCCL_H

#include <nccl.h>

#include "cuda.h"
#include "cuda_nvfp4.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The version libmxshard_nccl was built as (compare with MXS_VERSION_CODE,
 * as mxs_cuda_version()). */
int mxs_nccl_glue_version(void);

/* Steps 2-4 of docs/contract.md section 4 for a prepared bucket (mxs_cuda_wb_prepare):
 * mxs_cuda_wb_bucket_partial, then exactly one ncclAllReduce(packed,
 * packed, packed_bytes, ncclUint8, ncclMax, comm, stream), then the group
 * status byte (1 byte to the host, `stream` synchronised): 0 ->
 * mxs_cuda_wb_bucket_apply; else MXS_ERR_REMOTE and no apply. No
 * high-precision value is ever communicated. No validation of the batch:
 * the bucket was validated when prepared. */
MXS_NODISCARD mxs_status mxs_nccl_wb_bucket_writeback(const mxs_cuda_wb_bucket *bucket, ncclComm_t comm,
                                                      cudaStream_t stream);

/* One-shot: mxs_cuda_wb_prepare into `workspace` (at least
 * mxs_cuda_wb_prepare_bytes(b) bytes, 16-byte aligned) and
 * mxs_nccl_wb_bucket_writeback - the batch is validated once per call.
 * `packed` holds plan->packed_bytes bytes of device memory. A rank whose
 * prepare fails joins the all-reduce as described above and returns the
 * prepare's error. */
MXS_NODISCARD mxs_status mxs_nccl_wb_writeback(const mxs_wb_batch *b, const mxs_wb_plan *plan, uint8_t *packed,
                                               void *workspace, int64_t workspace_bytes, ncclComm_t comm,
                                               cudaStream_t stream);

/* Opt-in: compares plan->fingerprint and sizes across the ranks with one
 * tiny reduction; returns MXS_ERR_PLAN_MISMATCH on every rank when any two
 * ranks disagree. `scratch` is >= 32 bytes of device memory. Synchronises
 * `stream`.
 *
 * How: every rank contributes x = {fp, ~fp, sz, ~sz} as ncclUint64 with
 * ncclMax, where fp = plan->fingerprint and sz = a 64-bit hash of
 * (n_items, packed_bytes, row_region_bytes). For any value v, max over ranks
 * of v equals this rank's v and max of ~v equals ~v exactly when every rank
 * holds the same v; so every rank reaches the same verdict from one
 * all-reduce. */
MXS_NODISCARD mxs_status mxs_nccl_wb_check_plan(const mxs_wb_plan *plan, void *scratch, ncclComm_t comm,
                                                cudaStream_t stream);

/* ---- gather (docs/contract.md section 4, step 5) ------------------------------------
 *
 * After the writeback every rank has the complete scale planes (apply writes
 * all blocks), but only its own shard's slice of each data plane. The gather
 * completes the data planes: every byte range is sent by exactly one owner,
 * in place, with ncclBroadcast (uint8) inside ncclGroupStart/End (at most
 * MXS_NCCL_GROUP_OPS operations per group). Only planes the tensor HAS are
 * gathered; nothing else is read or written.
 *
 * Shard table. Every rank passes the same table of every rank's shard (in a
 * distributed optimizer it is deterministic): for weight i and rank q,
 * starts[i*nranks + q] and lens[i*nranks + q], in elements (= bytes of a data
 * plane). Shards may be empty, unaligned, replicated or overlapping; sorted
 * by (start, rank), each rank sends only what no earlier shard covers:
 *
 *   flat index   0         10        20        30        40      48
 *   rank 0 shard [===================)                              [0,20)
 *   rank 1 shard           [===================)                    [10,30)
 *   rank 2 shard                                                    empty
 *   rank 3 shard                             [===================)  [28,48)
 *   sent by      |rank 0 ------------|rank 1 --|rank 3 ----------|
 *                [0,20)               [20,30)   [30,48): [28,30) lies in two
 *                                               shards and is sent once, by rank 1
 *
 *   segment of rank q = [max(start_q, M_q), start_q + len_q), where M_q is
 *   the largest shard end among the non-empty shards ordered before q;
 *   (an interval starting at or before start_q that reaches past start_q
 *   covers everything between, so the part of q's shard already covered is
 *   exactly [start_q, M_q)). Bytes in no shard are not touched.
 */
#ifndef MXS_NCCL_GROUP_OPS
#define MXS_NCCL_GROUP_OPS 128 /* collectives per ncclGroupStart/End batch */
#endif

/* The part of rank q's shard that rank q sends: [*seg_start, *seg_start +
 * *seg_len) (seg_len 0: nothing). starts/lens are the nranks entries of one
 * weight (already validated). Pure host function, also used by the tests. */
static inline void mxs_gather_segment(const int64_t *starts, const int64_t *lens, int nranks, int q, int64_t *seg_start,
                                      int64_t *seg_len) {
    int64_t lo = starts[q], hi = starts[q] + lens[q];
    int p;
    if (lens[q] > 0) {
        for (p = 0; p < nranks; p++) {
            int earlier = starts[p] < starts[q] || (starts[p] == starts[q] && p < q);
            int64_t end = starts[p] + lens[p];
            if (p != q && lens[p] > 0 && earlier && end > lo) lo = end;
        }
    }
    *seg_start = lo < hi ? lo : 0;
    *seg_len = lo < hi ? hi - lo : 0;
}

/* Generic gather of one flat device buffer of `elems` elements of
 * `elem_bytes` bytes each, where rank q holds [starts[q], starts[q]+lens[q])
 * (nranks entries; in elements). Issues one ncclBroadcast per non-empty
 * segment, as uint8. Used for the data planes, and by callers that gather a
 * bf16 weight for copy-back (elem_bytes = 2). */
MXS_NODISCARD mxs_status mxs_nccl_gather_bytes(void *buf, int64_t elems, int64_t elem_bytes, const int64_t *starts,
                                               const int64_t *lens, ncclComm_t comm, cudaStream_t stream);

/* Gathers every PRESENT data plane (row_data if dirs has MXS_ROWWISE,
 * col_data if MXS_COLWISE) of n_weights tensors in place, with the shard
 * table above (n_weights * nranks entries each). A present plane must have a
 * non-NULL data pointer (MXS_ERR_ABSENT_PLANE; FSDP fragments are the
 * caller's to gather). Scale planes are not touched. */
MXS_NODISCARD mxs_status mxs_nccl_gather_planes(const mxs_tensor *weights, int64_t n_weights, const int64_t *starts,
                                                const int64_t *lens, ncclComm_t comm, cudaStream_t stream);

/* Fast path for a distributed-optimizer bucket whose quantized data plane is
 * one contiguous device buffer sharded like its master bucket
 * (mxs_bucket_shard): rank q owns bytes [q*chunk, (q+1)*chunk), chunk =
 * bucket_bytes / nranks. One in-place ncclAllGather (uint8). bucket_bytes
 * must be a multiple of nranks (MXS_ERR_INVALID_ARGUMENT otherwise).
 *
 *   bucket  |-- w0 row data --|---- w1 row data ----|-- w2 --|pad|
 *           |   rank 0 chunk   |   rank 1 chunk   |  rank 2 chunk  |
 */
MXS_NODISCARD mxs_status mxs_nccl_gather_bucket(uint8_t *bucket, int64_t bucket_bytes, ncclComm_t comm,
                                                cudaStream_t stream);

/* ---- NVFP4 (<mxshard/cuda_nvfp4.h>, docs/contract.md section 9.8) ---------------------
 *
 *   mxs_nccl_nvfp4_wb_writeback   partial -> reduce ->   1 x AllReduce ncclMax of
 *                                 status -> apply          plan->packed_count entries:
 *                                                          ncclBfloat16 (2-byte entries,
 *                                                          bf16 round-through) or ncclUint32
 *   mxs_nccl_nvfp4_gather         Broadcasts, uint8, of the shards' byte ranges
 *   then mxs_cuda_nvfp4_wb_finish (local) */

/* Steps 2-4 of the NVFP4 writeback: mxs_cuda_nvfp4_wb_partial, exactly one
 * ncclAllReduce(packed, packed, plan->packed_count, ncclBfloat16 or
 * ncclUint32 (plan->entry_bytes 2 or 4), ncclMax, comm, stream) - NCCL has no
 * 16-bit unsigned type; the 2-byte entries are bf16 patterns of non-negative,
 * non-NaN amaxes, for which bf16 MAX is exactly uint16 MAX - the group status byte
 * (1 byte to the host, `stream` synchronised): 0 -> mxs_cuda_nvfp4_wb_apply;
 * else MXS_ERR_REMOTE. A rank whose partial fails (its validation or its
 * launch) still joins the all-reduce with a zeroed buffer whose status entry
 * is all 1 bytes and returns its error, as mxs_host_nvfp4_wb_writeback does.
 * Returns at once (no collective) only when joining is impossible: a NULL
 * plan or packed buffer, a packed buffer not aligned to plan->entry_bytes, a
 * plan whose sizes are inconsistent, an invalid communicator
 * (MXS_ERR_INVALID_ARGUMENT / MXS_ERR_NCCL). */
MXS_NODISCARD mxs_status mxs_nccl_nvfp4_wb_writeback(const mxs_nvfp4_wb_batch *b, const mxs_nvfp4_wb_plan *plan,
                                                     void *packed, ncclComm_t comm, cudaStream_t stream);

/* Step 5: the parameter all-gather of n_items NVFP4 items after apply: the
 * row-wise data plane (when the primary has one) and the column stage (when
 * not NULL) of every item, in place. Shard table as mxs_nccl_gather_planes
 * (starts/lens[i*nranks + q], in ELEMENTS, the same on every rank); every
 * shard must satisfy mxs_nvfp4_shard_check (even boundaries: MXS_ERR_RANGE).
 * Rank q sends the bytes [lo/2, ceil(hi/2)) of its element segment [lo, hi)
 * (mxs_gather_segment): with even boundaries every byte has one owner. One
 * ncclBroadcast (uint8) per non-empty segment and buffer, grouped. Validates
 * everything before issuing any collective. */
MXS_NODISCARD mxs_status mxs_nccl_nvfp4_gather(const mxs_nvfp4_wb_item *items, int64_t n_items, const int64_t *starts,
                                               const int64_t *lens, ncclComm_t comm, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* MXSHARD_NCCL_H */
