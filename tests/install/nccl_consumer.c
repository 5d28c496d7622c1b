/* SPDX-License-Identifier: MIT */
/* An installed consumer of the NCCL glue: built with nothing but
 * `pkg-config --cflags --libs mxshard-nccl`. Checks that the libraries it
 * loads are the ones its headers describe (no GPU needed). */
#include <mxshard/nccl.h>

#include <stdio.h>

int main(void) {
    int nccl_version = 0;
    if (ncclGetVersion(&nccl_version) != ncclSuccess) {
        fprintf(stderr, "ncclGetVersion failed\n");
        return 1;
    }
    printf("headers %d, libmxshard_cuda %d, libmxshard_nccl %d, NCCL %d\n", MXS_VERSION_CODE, mxs_cuda_version(),
           mxs_nccl_glue_version(), nccl_version);
    if (mxs_cuda_version() != MXS_VERSION_CODE || mxs_nccl_glue_version() != MXS_VERSION_CODE) {
        fprintf(stderr, "header/library version mismatch\n");
        return 1;
    }
    return 0;
}
