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
 *   - one piece of state: for batches of 5..226 items the writeback
 *     launchers keep, per host thread and phase, the last compact item
 *     table they built (static storage). A call whose batch, plan and
 *     packed pointer are byte-for-byte those of the previous call (the same
 *     bucket every optimizer step) reuses it and skips the host-side plan
 *     check and table build (~30 us for 200 items); any difference rebuilds.
 *     The bytes written never depend on it (tested).
 */
#ifndef MXSHARD_CUDA_H
#define MXSHARD_CUDA_H

#include <cuda_runtime_api.h>

#include "mxshard.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Whole-tensor quantize (the BF16 copy-back path): one fused pass that reads
 * `src` (rows x cols of src_dtype) once and writes exactly the planes
 * dst->dirs names, scales in dst->scale_layout (padding 0x00). Equal byte for
 * byte to mxs_host_quantize. */
mxs_status mxs_cuda_quantize(const mxs_tensor *dst, const void *src, mxs_dtype src_dtype, mxs_rounding rounding,
                             cudaStream_t stream);

/* One plane of t back to f32 / bf16 / f16 (rows x cols elements at dst). */
mxs_status mxs_cuda_dequantize(const mxs_tensor *t, mxs_dirs plane, void *dst, mxs_dtype dst_dtype,
                               cudaStream_t stream);

/* One scale plane between COMPACT, PADDED and SWIZZLED (src and dst must not
 * overlap; padding written as 0x00). */
mxs_status mxs_cuda_convert_scales(int64_t rows, int64_t cols, mxs_dirs plane, mxs_scale_layout from,
                                   const uint8_t *src, mxs_scale_layout to, uint8_t *dst, cudaStream_t stream);

/* Device workspace (bytes) that mxs_cuda_wb_partial / _apply need for batch b. */
mxs_status mxs_cuda_wb_workspace_bytes(const mxs_wb_batch *b, int64_t *bytes);

/* Writeback step 2 for the whole batch: zero `packed` (plan->packed_bytes,
 * device) and write this rank's partial exponents; MXS_WB_FUSED also casts
 * the blocks wholly inside each shard (reads each shard exactly once). Same
 * bytes as mxs_host_wb_partial. Launches: 1 kernel, or 2 when the batch has
 * both whole interior tiles (fused mode) and shard edges that are not 32-row
 * group boundaries; plus, for batches of more than ~58 items, one small
 * table-copy kernel per ~58 items (the item table goes to the workspace). */
mxs_status mxs_cuda_wb_partial(const mxs_wb_batch *b, const mxs_wb_plan *plan, uint8_t *packed, void *workspace,
                               int64_t workspace_bytes, cudaStream_t stream);

/* Writeback step 4 for the whole batch: reduced exponents -> every primary's
 * scale planes (all blocks, in each layout), and the cast of this rank's
 * shard (MXS_WB_FUSED: only the blocks straddling the shard's edges). Same
 * bytes as mxs_host_wb_apply. Launches: 1 kernel, plus the table-copy
 * kernels of mxs_cuda_wb_partial for large batches. */
mxs_status mxs_cuda_wb_apply(const mxs_wb_batch *b, const mxs_wb_plan *plan, const uint8_t *packed,
                             void *workspace, int64_t workspace_bytes, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* MXSHARD_CUDA_H */
