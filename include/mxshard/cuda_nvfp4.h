/* SPDX-License-Identifier: MIT */
/* mxshard/cuda_nvfp4.h - NVFP4 on the GPU (libmxshard_cuda): whole-tensor
 * quantize (copy-back), dequantize, scale-layout conversion and the sharded
 * writeback phases (docs/contract.md section 9, docs/cuda.md "NVFP4").
 *
 * Same conventions as <mxshard/cuda.h>: descriptors in host memory, every
 * data pointer inside them (planes, amax, masters, column stages, packed
 * buffer) device memory; an explicit stream; validated on the host with the
 * host library's own check functions before anything is enqueued (a rejected
 * call enqueues and writes nothing); no allocation, no host synchronisation,
 * no state - every call can be captured in a CUDA graph. The kernels call the
 * MXS_HOST_DEVICE rules of nvfp4.h (E2M1 conversion, S_enc, block scale,
 * encode multiplier, entries): the bytes equal the host path's. On
 * sm_100a/f-class builds the E2M1 conversion is the hardware cvt (nvfp4.h);
 * on Hopper it is the exact software rule.
 *
 * The unprepared writeback calls need no workspace: the per-item work
 * records travel as kernel parameters (up to MXS_CUDA_NVFP4_CHUNK items per
 * launch). The prepared bucket (below) keeps them in a device workspace and
 * runs every phase in one kernel for any number of items. Quantize
 * accumulates the global amax in the tensor's own amax word.
 */
#ifndef MXSHARD_CUDA_NVFP4_H
#define MXSHARD_CUDA_NVFP4_H

#include "cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Items of a writeback batch per kernel launch: a batch of n items takes
 * ceil(n / MXS_CUDA_NVFP4_CHUNK) launches per phase step (1 for n <= 32). */
#define MXS_CUDA_NVFP4_CHUNK 32

/* Whole-tensor quantize into exactly the planes dst->dirs names (and
 * *dst->amax), equal byte for byte to mxs_host_nvfp4_quantize: validated by
 * mxs_nvfp4_quantize_check (same errors). Enqueues, on `stream`: a 4-byte
 * memset of dst->amax, the global-amax pass (atomic MAX into dst->amax), the
 * scale pass (every scale byte of every present plane, padding 0x00) and the
 * cast pass (every data byte; the spare nibble 0). `src` (rows x cols of
 * src_dtype) must be element-aligned device memory. */
MXS_NODISCARD mxs_status mxs_cuda_nvfp4_quantize(const mxs_nvfp4_tensor *dst, const void *src, mxs_dtype src_dtype,
                                                 mxs_dtype round_through, cudaStream_t stream);

/* One plane of t back to rows x cols f32 / bf16 / f16 at dst, equal to
 * mxs_host_nvfp4_dequantize (validated by mxs_nvfp4_dequantize_check). */
MXS_NODISCARD mxs_status mxs_cuda_nvfp4_dequantize(const mxs_nvfp4_tensor *t, mxs_dirs plane, void *dst,
                                                   mxs_dtype dst_dtype, cudaStream_t stream);

/* One NVFP4 scale plane between COMPACT, PADDED and SWIZZLED, equal to
 * mxs_host_nvfp4_convert_scales (validated by mxs_nvfp4_convert_scales_check). */
MXS_NODISCARD mxs_status mxs_cuda_nvfp4_convert_scales(int64_t rows, int64_t cols, mxs_dirs plane,
                                                       mxs_scale_layout from, const uint8_t *src, mxs_scale_layout to,
                                                       uint8_t *dst, cudaStream_t stream);

/* ---- sharded writeback (nvfp4_writeback.h's protocol, on the GPU) ---------
 *
 *   host, once:  mxs_nvfp4_wb_make_plan(&b, &plan, NULL)
 *   every step:  mxs_cuda_nvfp4_wb_partial(&b, &plan, packed, stream)
 *                ncclAllReduce(packed, packed, plan.packed_count,
 *                              plan.entry_bytes == 2 ? ncclBfloat16 : ncclUint32, ncclMax, ...)
 *                mxs_cuda_nvfp4_wb_apply(&b, &plan, packed, stream)
 *                byte all-gather of each row-wise plane and column stage,
 *                  ranges [start/2, ceil((start+len)/2))
 *                mxs_cuda_nvfp4_wb_finish(&b, &plan, stream)
 *   (mxs_nccl_nvfp4_wb_writeback of <mxshard/nccl.h> does partial-reduce-apply)
 *
 * Every phase first runs the host phase checks (the batch is the planned one:
 * O(n_items) hash, else the full validation names the fault or
 * MXS_ERR_PLAN_MISMATCH; packed non-NULL, aligned to plan->entry_bytes and
 * disjoint from every buffer of the batch), then launch_begin's pending-error
 * check (MXS_ERR_CUDA), then launches; MXS_ERR_CUDA when a launch fails. */

/* Step 2: every byte of `packed` (plan->packed_bytes) - each tensor's and
 * each block's partial amax entry (0 where the shard has no element), the
 * status entry 0. Same bytes as mxs_host_nvfp4_wb_partial. A memset of
 * `packed`, then one launch per chunk of items. Writes nothing but `packed`. */
MXS_NODISCARD mxs_status mxs_cuda_nvfp4_wb_partial(const mxs_nvfp4_wb_batch *b, const mxs_nvfp4_wb_plan *plan,
                                                   void *packed, cudaStream_t stream);

/* Step 4, after the MAX reduction: per item the global amax (*amax, its
 * reduced tensor-amax entry), every scale byte of every present plane
 * (padding 0x00) and the cast of the shard into its bytes of the row-wise
 * plane and of the column stage, or into their fragments (row_fragment,
 * stage_fragment: FSDP, contract 9.8) - the bytes of mxs_host_nvfp4_wb_apply.
 * One launch per chunk of items.
 * The host call cannot read the group status byte without a synchronisation,
 * so it never returns MXS_ERR_REMOTE; instead the KERNELS read
 * packed[plan->status_offset] and write nothing when it is not 0 (as the
 * host apply), which also holds inside a replayed graph. */
MXS_NODISCARD mxs_status mxs_cuda_nvfp4_wb_apply(const mxs_nvfp4_wb_batch *b, const mxs_nvfp4_wb_plan *plan,
                                                 const void *packed, cudaStream_t stream);

/* Step 6, after the gather: every column-wise data plane transposed from its
 * gathered column stage (NULL stage, 16x16 with both planes: from the
 * row-wise plane), as mxs_host_nvfp4_wb_finish - which skips items whose
 * column values went to a fragment. One launch per chunk of items (none when
 * no item has a column-wise plane). */
MXS_NODISCARD mxs_status mxs_cuda_nvfp4_wb_finish(const mxs_nvfp4_wb_batch *b, const mxs_nvfp4_wb_plan *plan,
                                                  cudaStream_t stream);

/* Finish's transpose on its own (FSDP: after gathering fragments into a
 * full stage): t->col_data from `stage` (a full ceil(rows*cols/2)-byte
 * column stage; for 16x16 also the gathered row-wise plane), equal to
 * mxs_host_nvfp4_stage_to_col. Validated on the host by
 * mxs_nvfp4_stage_to_col_check (same errors, nothing enqueued on error);
 * then one launch of finish's kernel. Only t->col_data is written. */
MXS_NODISCARD mxs_status mxs_cuda_nvfp4_stage_to_col(const mxs_nvfp4_tensor *t, const uint8_t *stage,
                                                     cudaStream_t stream);

/* ---- the prepared bucket ---------------------------------------------------
 *
 * As <mxshard/cuda.h>'s mxs_cuda_wb_bucket for MXFP8: a distributed
 * optimizer writes the same bucket back every step (same items, pointers and
 * shards; only the master VALUES change). mxs_cuda_nvfp4_wb_prepare
 * validates such a batch once (the planned batch, the packed buffer and the
 * workspace against every buffer of it and each other) and stores the
 * per-item work records of every phase in the caller's device workspace.
 * The phase calls then only launch, for ANY number of items:
 *
 *   partial   a memset of the packed buffer, then ONE kernel
 *   apply     ONE kernel (the global amaxes come from the reduced tensor-amax
 *             entries: no amax pass; fragments as the unprepared apply)
 *   finish    ONE kernel (none when no item has a column-wise plane)
 *
 * with no validation, allocation or synchronisation: graph-capturable.
 *
 *   mxs_cuda_nvfp4_wb_prepare_bytes(&b, &ws_bytes);
 *   mxs_cuda_nvfp4_wb_prepare(&bk, &b, &plan, packed, ws, ws_bytes, stream);
 *   every step: partial -> MAX all-reduce of packed -> apply -> gather -> finish
 *   mxs_cuda_nvfp4_wb_bucket_release(&bk);
 *
 * Re-prepare when anything but master values changes (pointers, shards,
 * shapes, planes, block, layout, master dtype, the items or their order,
 * round_through, the packed buffer or the workspace); a stale bucket writes
 * where the old batch said. The workspace and packed buffer must stay
 * allocated and the workspace untouched while the bucket is in use. A NULL,
 * never-prepared, zeroed, released or modified bucket, or one prepared on
 * another device, is rejected with MXS_ERR_INVALID_ARGUMENT, nothing
 * enqueued. Apply's kernel reads the group status byte itself and writes
 * nothing when it is not 0, as mxs_cuda_nvfp4_wb_apply. */
typedef struct mxs_cuda_nvfp4_wb_bucket {
    /* private: written by mxs_cuda_nvfp4_wb_prepare, read by the phase calls */
    uint64_t magic; /* MXS_CUDA_NVFP4_WB_BUCKET_MAGIC when prepared */
    uint64_t check; /* hash of the fields below: a modified copy is rejected */
    int64_t n_items;
    void *packed; /* device, packed_bytes */
    int64_t packed_bytes, entry_bytes, status_offset;
    const void *table[3]; /* device work records in the workspace: [partial, apply, finish] (NULL: no items) */
    int64_t units[3], tiles[3];
    int round_through;
    int load_spec; /* which kernel specialisation (master dtype, round-through) the phases launch */
    int device;    /* the device it was prepared on */
} mxs_cuda_nvfp4_wb_bucket;

#define MXS_CUDA_NVFP4_WB_BUCKET_MAGIC 0x3462637534766E6Dull /* "mnv4ucb4" */

/* sizeof(mxs_cuda_nvfp4_wb_bucket), for FFI users that allocate it. */
size_t mxs_cuda_nvfp4_wb_bucket_size(void);

/* Device workspace (bytes) a bucket of batch b needs: one record per item
 * and phase (a few hundred bytes each). Validates b (MXS_ERR_*). */
MXS_NODISCARD mxs_status mxs_cuda_nvfp4_wb_prepare_bytes(const mxs_nvfp4_wb_batch *b, int64_t *workspace_bytes);

/* Validates b against plan (the phase checks of partial: the planned batch,
 * `packed` non-NULL, aligned to plan->entry_bytes, over no buffer of the
 * batch) and `workspace` (16-byte aligned device memory of at least
 * mxs_cuda_nvfp4_wb_prepare_bytes bytes: MXS_ERR_BUFFER_SIZE when smaller;
 * over no buffer of the batch nor the packed buffer: MXS_ERR_ALIASING), then
 * stores the records (small kernels on `stream`; the batch descriptors may
 * be freed when it returns) and fills *bucket. On any error *bucket is left
 * zeroed; a launch error after validation (MXS_ERR_CUDA) may have written
 * part of the workspace, nothing else. */
MXS_NODISCARD mxs_status mxs_cuda_nvfp4_wb_prepare(mxs_cuda_nvfp4_wb_bucket *bucket, const mxs_nvfp4_wb_batch *b,
                                                   const mxs_nvfp4_wb_plan *plan, void *packed, void *workspace,
                                                   int64_t workspace_bytes, cudaStream_t stream);

/* The phases of the prepared bucket: the bytes of mxs_cuda_nvfp4_wb_partial /
 * _apply / _finish (and of the host calls). */
MXS_NODISCARD mxs_status mxs_cuda_nvfp4_wb_bucket_partial(const mxs_cuda_nvfp4_wb_bucket *bucket, cudaStream_t stream);
MXS_NODISCARD mxs_status mxs_cuda_nvfp4_wb_bucket_apply(const mxs_cuda_nvfp4_wb_bucket *bucket, cudaStream_t stream);
MXS_NODISCARD mxs_status mxs_cuda_nvfp4_wb_bucket_finish(const mxs_cuda_nvfp4_wb_bucket *bucket, cudaStream_t stream);

/* Zeroes the bucket (rejected until prepared again). Nothing to free. */
MXS_NODISCARD mxs_status mxs_cuda_nvfp4_wb_bucket_release(mxs_cuda_nvfp4_wb_bucket *bucket);

#ifdef __cplusplus
}
#endif

#endif /* MXSHARD_CUDA_NVFP4_H */
