/* SPDX-License-Identifier: MIT */
/* cuda/nccl/mxs_nccl_version.c - mxs_nccl_glue_version(): the version
 * libmxshard_nccl was built as (see mxs_cuda_version() in cuda/mxs_version.c). */
#include <mxshard/nccl.h>

int mxs_nccl_glue_version(void) { return MXS_VERSION_CODE; }
