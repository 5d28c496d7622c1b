/* SPDX-License-Identifier: MIT */
/* mxshard/status.h - status codes (docs/contract.md section 6).
 *
 * Every fallible call returns an mxs_status. MXS_OK is 0; every other code
 * names the fault, and mxs_status_str() explains it in one sentence. The
 * library never aborts and never prints, and a call that returns an error
 * has written none of its outputs.
 */
#ifndef MXSHARD_STATUS_H
#define MXSHARD_STATUS_H

#include "config.h"

MXS_EXTERN_C_BEGIN

typedef enum {
    MXS_OK = 0,
    MXS_ERR_INVALID_ARGUMENT = 1, /* NULL pointer, unknown enum value, bad flag set */
    MXS_ERR_SHAPE = 2,            /* rows or cols < 1 */
    MXS_ERR_OVERFLOW = 3,         /* a size or index does not fit in int64 */
    MXS_ERR_ABSENT_PLANE = 4,     /* a plane was asked for that the tensor does not have */
    MXS_ERR_RANGE = 5,            /* shard or range outside the tensor */
    MXS_ERR_BUFFER_SIZE = 6,      /* a caller-given buffer is smaller than required */
    MXS_ERR_CUDA = 7,             /* a CUDA runtime call failed */
    MXS_ERR_NCCL = 8,             /* an NCCL call failed */
    MXS_ERR_PLAN_MISMATCH = 9,    /* the batch changed since its plan, or ranks disagree on it */
    MXS_ERR_UNSUPPORTED = 10,     /* valid request this build cannot serve */
    MXS_ERR_ALIASING = 11,        /* an output overlaps an input or another output */
    MXS_ERR_REDUCE = 12,          /* the caller's reduction callback reported a failure */
    MXS_ERR_REMOTE = 13           /* another rank of the group failed; this rank skipped apply */
} mxs_status;

MXS_API const char *mxs_status_str(mxs_status s) {
    switch (s) {
    case MXS_OK: return "MXS_OK: success";
    case MXS_ERR_INVALID_ARGUMENT:
        return "MXS_ERR_INVALID_ARGUMENT: a required pointer is NULL, or an enum value, flag set or option is "
               "not one mxshard defines";
    case MXS_ERR_SHAPE: return "MXS_ERR_SHAPE: rows and cols must both be at least 1";
    case MXS_ERR_OVERFLOW: return "MXS_ERR_OVERFLOW: a size or index computation overflows int64";
    case MXS_ERR_ABSENT_PLANE:
        return "MXS_ERR_ABSENT_PLANE: the call needs a plane the tensor does not have (its flag is unset or its "
               "data/scale pointer is NULL); mxshard never allocates one";
    case MXS_ERR_RANGE:
        return "MXS_ERR_RANGE: a shard or range lies outside the tensor (need 0 <= start, start + len <= rows*cols)";
    case MXS_ERR_BUFFER_SIZE: return "MXS_ERR_BUFFER_SIZE: a caller-given buffer is smaller than the call needs";
    case MXS_ERR_CUDA: return "MXS_ERR_CUDA: a CUDA runtime call or kernel launch failed";
    case MXS_ERR_NCCL: return "MXS_ERR_NCCL: an NCCL call failed";
    case MXS_ERR_PLAN_MISMATCH:
        return "MXS_ERR_PLAN_MISMATCH: the writeback plan does not match the batch (the batch changed after "
               "mxs_wb_make_plan, or the plan was edited or made for another batch), or it differs between ranks";
    case MXS_ERR_UNSUPPORTED: return "MXS_ERR_UNSUPPORTED: this build of mxshard cannot serve the request";
    case MXS_ERR_ALIASING: return "MXS_ERR_ALIASING: an output buffer overlaps an input or another output";
    case MXS_ERR_REDUCE:
        return "MXS_ERR_REDUCE: the caller's MAX reduction callback failed; apply did not run (in fused mode the "
               "blocks wholly inside the shard were already written)";
    case MXS_ERR_REMOTE:
        return "MXS_ERR_REMOTE: another rank of the group failed before the reduction (the packed buffer's status "
               "byte is set); this rank skipped apply (in fused mode the blocks wholly inside the shard were "
               "already written)";
    }
    return "mxs_status: unknown status code";
}

MXS_EXTERN_C_END

#endif /* MXSHARD_STATUS_H */
