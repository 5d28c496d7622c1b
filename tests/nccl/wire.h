/* SPDX-License-Identifier: MIT */
/* tests/nccl/wire.h - what libmxshard_nccl puts on the wire, seen from the
 * outside.
 *
 * wire.c defines ncclAllReduce, ncclBroadcast and ncclAllGather in the test
 * executable. NCCL exports those names as weak aliases of its profiling
 * entry points (pncclAllReduce, ...), so every call the library makes -
 * static or shared (the linker exports the executable's definitions of
 * symbols that a shared library in the link references) - lands in wire.c
 * first, which counts it while counting is on and forwards it to the
 * pnccl* function. The library itself has no hook and no state. The counter
 * is test state: one process per rank, one thread. */
#ifndef MXS_TESTS_NCCL_WIRE_H
#define MXS_TESTS_NCCL_WIRE_H

#include <nccl.h>

typedef struct wire {
    int all_reduce, broadcast, all_gather;
    int non_u8; /* collectives whose datatype is not ncclUint8 */
    int reduce_not_max;
    long long reduce_elems, bcast_bytes, gather_elems;
} wire;

extern wire g_wire;

/* Zeroes the counters and starts counting. */
void wire_reset(void);
/* Stops counting (the counters keep their values). */
void wire_stop(void);

#endif
