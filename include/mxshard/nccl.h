/* mxshard/nccl.h - NCCL glue (libmxshard_nccl): writeback with exactly one
 * uint8 MAX all-reduce, the quantized-byte gather, and a plan check.
 *
 * All calls run on the caller's communicator and stream, enqueue work and
 * return (asynchronous, like NCCL itself), except mxs_nccl_wb_check_plan,
 * which synchronises `stream` to read the verdict.
 */
#ifndef MXSHARD_NCCL_H
#define MXSHARD_NCCL_H

#include <nccl.h>

#include "cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Steps 2-4 of SPEC section 4: mxs_cuda_wb_partial, then exactly one
 * ncclAllReduce(packed, packed, plan->packed_bytes, ncclUint8, ncclMax,
 * comm, stream), then mxs_cuda_wb_apply. No high-precision value is ever
 * communicated. */
mxs_status mxs_nccl_wb_writeback(const mxs_wb_batch *b, const mxs_wb_plan *plan, uint8_t *packed, void *workspace,
                                 int64_t workspace_bytes, ncclComm_t comm, cudaStream_t stream);

/* Opt-in: compares plan->fingerprint and sizes across the ranks with one
 * tiny reduction; returns MXS_ERR_PLAN_MISMATCH on every rank when any two
 * ranks disagree. `scratch` is >= 32 bytes of device memory. Synchronises
 * `stream`. */
mxs_status mxs_nccl_wb_check_plan(const mxs_wb_plan *plan, void *scratch, ncclComm_t comm, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* MXSHARD_NCCL_H */
