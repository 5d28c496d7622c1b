/* SPDX-License-Identifier: MIT */
/* mxshard/cuda.h - C ABI of the compiled CUDA kernels (libmxshard_cuda).
 *
 * Link with libmxshard_cuda (meson: mxshard_cuda_dep) and the CUDA runtime.
 * The scalar rules are the MXS_HOST_DEVICE functions of formats.h, tensor.h
 * and geometry.h: the kernels and the host path share one definition of each
 * rule, and their bytes are identical.
 *
 * Conventions (as NCCL's API):
 *   - every data pointer inside the descriptors (mxs_tensor planes, master
 *     shards, fragments, packed buffer, workspace) is DEVICE memory; the
 *     descriptors themselves (mxs_tensor, mxs_wb_batch, its items) are host
 *     memory and may be freed when the call returns;
 *   - every call takes an explicit stream and is asynchronous with respect to
 *     the host: it enqueues work and returns; errors of the launch itself are
 *     reported (MXS_ERR_CUDA), faults during execution surface at the next
 *     synchronisation as usual in CUDA;
 *   - every argument is validated on the host before anything is enqueued; a
 *     rejected call enqueues nothing and writes nothing;
 *   - nothing is allocated: scratch comes from a caller-given device
 *     workspace whose size a query returns;
 *   - no state: nothing static, nothing per thread. The one thing worth
 *     keeping between calls - a writeback bucket's validated work list -
 *     is an explicit object the caller owns (mxs_cuda_wb_bucket, below);
 *   - errors: a call first checks that no CUDA error is already pending on
 *     the calling thread (cudaPeekAtLastError). If one is (an unrelated
 *     earlier launch failed, or the context is broken), it returns
 *     MXS_ERR_CUDA before enqueuing anything and leaves that error pending
 *     for its owner; otherwise the error it reports after its launches is
 *     its own (cudaGetLastError). A phase made of two launches whose second
 *     launch fails has enqueued the first.
 */
#ifndef MXSHARD_CUDA_H
#define MXSHARD_CUDA_H

#include <cuda_runtime_api.h>

#include "mxshard.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The version libmxshard_cuda was built as: MXS_VERSION_CODE of its headers.
 * Differs from this header's MXS_VERSION_CODE when the program links a
 * library other than the one whose headers it was compiled with. */
int mxs_cuda_version(void);

/* Whole-tensor quantize (the BF16 copy-back path): one fused pass that reads
 * `src` (rows x cols of src_dtype) once and writes exactly the planes
 * dst->dirs names, scales in dst->scale_layout (padding 0x00). Equal byte for
 * byte to mxs_host_quantize. */
MXS_NODISCARD mxs_status mxs_cuda_quantize(const mxs_tensor *dst, const void *src, mxs_dtype src_dtype,
                                           mxs_rounding rounding, cudaStream_t stream);

/* One plane of t back to f32 / bf16 / f16 (rows x cols elements at dst). */
MXS_NODISCARD mxs_status mxs_cuda_dequantize(const mxs_tensor *t, mxs_dirs plane, void *dst, mxs_dtype dst_dtype,
                                             cudaStream_t stream);

/* One scale plane between COMPACT, PADDED and SWIZZLED (src and dst must not
 * overlap; padding written as 0x00). */
MXS_NODISCARD mxs_status mxs_cuda_convert_scales(int64_t rows, int64_t cols, mxs_dirs plane, mxs_scale_layout from,
                                                 const uint8_t *src, mxs_scale_layout to, uint8_t *dst,
                                                 cudaStream_t stream);

/* ---- writeback ------------------------------------------------------------
 *
 * The prepared bucket. A distributed optimizer writes the same bucket back
 * every step: same items, same pointers, same shards - only the master
 * VALUES change. mxs_cuda_wb_prepare validates such a batch once (the whole
 * plan check of mxs_wb_make_plan, aliasing included, plus the packed buffer
 * and the workspace against every item) and stores the bucket's work list
 * (per phase, one record per item) in the caller's device workspace; the
 * bucket object (host memory, caller-owned, small) remembers where. The
 * phase calls then only launch kernels: no validation, no host allocation,
 * no synchronisation - they can be captured in a CUDA graph and replayed.
 *
 *   mxs_cuda_wb_bucket bk;                       // host, caller-owned
 *   mxs_cuda_wb_prepare_bytes(&b, &ws_bytes);    // once: workspace size
 *   mxs_cuda_wb_prepare(&bk, &b, &plan, packed, ws, ws_bytes, stream);
 *   every step: (new master values)
 *       mxs_cuda_wb_bucket_partial(&bk, stream);
 *       ncclAllReduce(packed, packed, plan.packed_bytes, ncclUint8, ncclMax, ...);
 *       (read packed[plan.status_offset]: nonzero -> another rank failed)
 *       mxs_cuda_wb_bucket_apply(&bk, stream);
 *   mxs_cuda_wb_bucket_release(&bk);
 *
 * Re-prepare the bucket when anything but master values changes: any
 * item's pointers (primary planes, master, fragments), start, len, shape,
 * planes (dirs), scale layout or master dtype; the number or order of the
 * items; the batch options (rounding, round_through, mode); the packed
 * buffer or the workspace. The bucket cannot see such a change (that is the
 * point: nothing is re-checked per phase); running a stale bucket writes
 * where the old batch said. The workspace and the packed buffer must stay
 * allocated, and the workspace untouched, while the bucket is in use.
 * Misuse the library can see is rejected with MXS_ERR_INVALID_ARGUMENT and
 * nothing enqueued: a NULL, never-prepared, zeroed, released or modified
 * bucket, or a bucket prepared on another device than the current one. */
typedef struct mxs_cuda_wb_bucket {
    /* private: written by mxs_cuda_wb_prepare, read by the phase calls */
    uint64_t magic; /* MXS_CUDA_WB_BUCKET_MAGIC when prepared */
    uint64_t check; /* hash of the fields below: a modified copy is rejected */
    int64_t n_items;
    uint8_t *packed; /* device, packed_bytes */
    int64_t packed_bytes;
    int64_t status_offset; /* the group status byte in packed (-1: none) */
    const void *table[2];  /* device work lists in the workspace: [partial, apply] (NULL: phase not prepared) */
    int64_t units[2], int_units[2], tile_units[2];
    int device;     /* the device it was prepared on */
    int row_only;   /* every item is row-only */
    int misaligned; /* some item's vector loads are only element-aligned */
    int edges;      /* some item's partial has masked interior tiles (a shard edge inside a 32-row group) */
    int wide_cols;  /* some item with a column-wise plane has a short last group in wide interior units */
} mxs_cuda_wb_bucket;

#define MXS_CUDA_WB_BUCKET_MAGIC 0x316B637542736D78ull /* "mxsBuck1" */

/* sizeof(mxs_cuda_wb_bucket), for FFI users that allocate it themselves. */
size_t mxs_cuda_wb_bucket_size(void);

/* Device workspace (bytes) a bucket of batch b needs: its work lists (a few
 * hundred bytes per item and phase). Validates b (MXS_ERR_*). */
MXS_NODISCARD mxs_status mxs_cuda_wb_prepare_bytes(const mxs_wb_batch *b, int64_t *workspace_bytes);

/* Validates b against plan (MXS_ERR_PLAN_MISMATCH when b changed since the
 * plan), `packed` (plan->packed_bytes bytes of device memory; not NULL
 * unless that is 0) and `workspace` (16-byte aligned device memory of at
 * least mxs_cuda_wb_prepare_bytes bytes; MXS_ERR_BUFFER_SIZE when smaller),
 * rejects a packed buffer or workspace that overlaps any item's master,
 * output slice or scale plane, or each other (MXS_ERR_ALIASING), then stores
 * the work lists into the workspace (small kernels on `stream`, asynchronous
 * like every launch; the batch descriptors may be freed when it returns)
 * and fills *bucket. On any error *bucket is left zeroed (unprepared);
 * a launch error after validation (MXS_ERR_CUDA) may have written part of
 * the workspace, nothing else. */
MXS_NODISCARD mxs_status mxs_cuda_wb_prepare(mxs_cuda_wb_bucket *bucket, const mxs_wb_batch *b, const mxs_wb_plan *plan,
                                             uint8_t *packed, void *workspace, int64_t workspace_bytes,
                                             cudaStream_t stream);

/* Writeback step 2 for the prepared bucket: zero the packed buffer (the
 * status byte included) and write this rank's partial exponents;
 * MXS_WB_FUSED also casts the blocks wholly inside each shard (reads each
 * shard exactly once). Same bytes as mxs_host_wb_partial. 1 or 2 kernel
 * launches, nothing else: graph-capturable. */
MXS_NODISCARD mxs_status mxs_cuda_wb_bucket_partial(const mxs_cuda_wb_bucket *bucket, cudaStream_t stream);

/* Writeback step 4 for the prepared bucket: the reduced exponents ->
 * every primary's scale planes (all blocks, in each layout), and the cast of
 * this rank's shard (MXS_WB_FUSED: only the blocks straddling the shard's
 * edges). Same bytes as mxs_host_wb_apply. Does NOT read the group status
 * byte (that would need a synchronisation): the caller checks it after the
 * reduction (mxs_nccl_wb_bucket_writeback does). 1 kernel launch:
 * graph-capturable. */
MXS_NODISCARD mxs_status mxs_cuda_wb_bucket_apply(const mxs_cuda_wb_bucket *bucket, cudaStream_t stream);

/* Zeroes the bucket (it is then rejected until prepared again). Nothing to
 * free: the workspace is the caller's. */
MXS_NODISCARD mxs_status mxs_cuda_wb_bucket_release(mxs_cuda_wb_bucket *bucket);

/* One-shot convenience wrappers: prepare (one phase's work list) into
 * `workspace` and run that phase, every call - the full validation each
 * time (use a bucket to pay it once). Same arguments and errors as
 * mxs_cuda_wb_prepare; workspace_bytes >= mxs_cuda_wb_workspace_bytes(b). */
MXS_NODISCARD mxs_status mxs_cuda_wb_workspace_bytes(const mxs_wb_batch *b, int64_t *bytes);
MXS_NODISCARD mxs_status mxs_cuda_wb_partial(const mxs_wb_batch *b, const mxs_wb_plan *plan, uint8_t *packed,
                                             void *workspace, int64_t workspace_bytes, cudaStream_t stream);
MXS_NODISCARD mxs_status mxs_cuda_wb_apply(const mxs_wb_batch *b, const mxs_wb_plan *plan, const uint8_t *packed,
                                           void *workspace, int64_t workspace_bytes, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* MXSHARD_CUDA_H */
