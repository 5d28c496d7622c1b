/* cuda/nccl/mxs_nccl_hooks.h - INTERNAL test hook of libmxshard_nccl.
 *
 * Not installed, not part of the API. The multi-process tests (tests/nccl)
 * use it to prove what the glue puts on the wire: every collective that
 * libmxshard_nccl issues goes through one internal function, which first
 * reports the call to the hook (if set) and then calls NCCL. The tests count
 * events to check "exactly one all-reduce per writeback, uint8 only, no
 * high-precision collective".
 *
 * The hook is process-wide state (one process per rank, as in the tests);
 * set it before and clear it (NULL) after the calls you observe. It is
 * called on the calling thread, after argument validation, right before the
 * NCCL call is made.
 */
#ifndef MXSHARD_NCCL_HOOKS_H
#define MXSHARD_NCCL_HOOKS_H

#include <stddef.h>

#include <nccl.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    MXS_NCCL_OP_ALL_REDUCE = 0, /* ncclAllReduce */
    MXS_NCCL_OP_BROADCAST = 1,  /* ncclBroadcast */
    MXS_NCCL_OP_ALL_GATHER = 2  /* ncclAllGather */
} mxs_nccl_op;

typedef struct mxs_nccl_event {
    mxs_nccl_op op;
    ncclDataType_t type;
    ncclRedOp_t red;  /* reductions only; ncclSum otherwise */
    size_t count;     /* elements of `type` (AllGather: per rank) */
    int root;         /* Broadcast only; -1 otherwise */
} mxs_nccl_event;

typedef void (*mxs_nccl_hook_fn)(const mxs_nccl_event *event, void *user);

/* Installs (fn != NULL) or removes (fn == NULL) the hook. */
void mxs_nccl_set_test_hook(mxs_nccl_hook_fn fn, void *user);

#ifdef __cplusplus
}
#endif

#endif /* MXSHARD_NCCL_HOOKS_H */
