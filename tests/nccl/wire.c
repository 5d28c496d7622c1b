/* SPDX-License-Identifier: MIT */
/* tests/nccl/wire.c - counts the collectives of the process (see wire.h). */
#include "wire.h"

#include <string.h>

wire g_wire;
static int g_wire_on;

void wire_reset(void) {
    memset(&g_wire, 0, sizeof g_wire);
    g_wire_on = 1;
}

void wire_stop(void) { g_wire_on = 0; }

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
    if (g_wire_on) {
        g_wire.all_reduce++;
        g_wire.reduce_elems += (long long)count;
        if (datatype != ncclUint8) g_wire.non_u8++;
        if (op != ncclMax) g_wire.reduce_not_max++;
    }
    return pncclAllReduce(sendbuff, recvbuff, count, datatype, op, comm, stream);
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
    if (g_wire_on) {
        g_wire.broadcast++;
        g_wire.bcast_bytes += (long long)count;
        if (datatype != ncclUint8) g_wire.non_u8++;
    }
    return pncclBroadcast(sendbuff, recvbuff, count, datatype, root, comm, stream);
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
    if (g_wire_on) {
        g_wire.all_gather++;
        g_wire.gather_elems += (long long)sendcount;
        if (datatype != ncclUint8) g_wire.non_u8++;
    }
    return pncclAllGather(sendbuff, recvbuff, sendcount, datatype, comm, stream);
}
