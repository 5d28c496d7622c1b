/* SPDX-License-Identifier: MIT */
/* Links libmxshard_cuda (and libmxshard_nccl when NCCL was found) through
 * mxshard taken as a meson subproject, and checks that each library reports
 * the version of the headers this program was compiled against. Needs no
 * GPU: the version calls touch neither the driver nor a device. */
#include <mxshard/cuda.h>
#ifdef MXS_CONSUMER_NCCL
#include <mxshard/nccl.h>
#endif

#include <stdio.h>

int main(void) {
    if (mxs_cuda_version() != MXS_VERSION_CODE) {
        fprintf(stderr, "libmxshard_cuda %d, headers %d\n", mxs_cuda_version(), MXS_VERSION_CODE);
        return 1;
    }
#ifdef MXS_CONSUMER_NCCL
    if (mxs_nccl_glue_version() != MXS_VERSION_CODE) {
        fprintf(stderr, "libmxshard_nccl %d, headers %d\n", mxs_nccl_glue_version(), MXS_VERSION_CODE);
        return 2;
    }
    printf("mxshard kernels and NCCL glue as a subproject: ok (%d)\n", MXS_VERSION_CODE);
#else
    printf("mxshard kernels as a subproject: ok (%d)\n", MXS_VERSION_CODE);
#endif
    return 0;
}
