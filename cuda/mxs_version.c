/* SPDX-License-Identifier: MIT */
/* cuda/mxs_version.c - mxs_cuda_version(): the version libmxshard_cuda was
 * built as, so a program can tell a header/library mismatch at run time
 * (compare with MXS_VERSION_CODE from the headers it was compiled against,
 * as NCCL programs compare ncclGetVersion() with NCCL_VERSION_CODE). */
#include <mxshard/cuda.h>

int mxs_cuda_version(void) { return MXS_VERSION_CODE; }
