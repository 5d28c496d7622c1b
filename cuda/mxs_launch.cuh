/* SPDX-License-Identifier: MIT */
/* cuda/mxs_launch.cuh - host-side launch utilities of libmxshard_cuda: the
 * named limits, grid sizes, alignment tests and the error protocol every
 * C-ABI launcher follows.
 *
 * Error protocol. The CUDA runtime keeps one "last error" per host thread;
 * a failed launch sets it and cudaGetLastError() reads and clears it. So
 * that an earlier, unrelated error is never reported as ours (and never
 * swallowed either), every launcher, after its host-side validation:
 *   1. launch_begin(): cudaPeekAtLastError(); if an error is already pending
 *      (someone else's failed launch, or a sticky error of a broken
 *      context), the call returns MXS_ERR_CUDA before enqueuing anything
 *      and leaves the error pending for its owner;
 *   2. enqueues its work;
 *   3. launch_end(): cudaGetLastError() - now it can only be ours.
 */
#ifndef MXSHARD_CUDA_LAUNCH_CUH
#define MXSHARD_CUDA_LAUNCH_CUH

#include <cuda_runtime.h>

#include <mxshard/mxshard.h>

/* A function shared between translation units of the library but not part
 * of its ABI (the C functions of <mxshard/cuda.h> are): hidden from the
 * shared object's dynamic symbols. */
#define MXS__CU_INTERNAL __attribute__((visibility("hidden")))

namespace mxs__cu {

/* CTAs per launch. Every kernel loops over its work units with a grid
 * stride, so any cap is correct; 2^30 keeps one CTA per unit for every
 * realistic size (gridDim.x may be up to 2^31 - 1). */
constexpr int64_t kMaxGrid = (int64_t)1 << 30;
/* dequantize: threads per CTA and resident CTAs wanted per SM (grid = SMs x
 * this; grid-stride beyond). */
constexpr int kDequantThreads = 256;
constexpr int kDequantCtasPerSm = 64;

inline unsigned grid_for(int64_t units) { return (unsigned)(units < kMaxGrid ? units : kMaxGrid); }

inline bool aligned(const void *p, uintptr_t a) { return (reinterpret_cast<uintptr_t>(p) % a) == 0; }

/* Step 1 of the error protocol (see above). */
inline mxs_status launch_begin() { return cudaPeekAtLastError() == cudaSuccess ? MXS_OK : MXS_ERR_CUDA; }
/* Step 3: the error of the launches just made, if any (and clears it). */
inline mxs_status launch_end() { return cudaGetLastError() == cudaSuccess ? MXS_OK : MXS_ERR_CUDA; }

/* The current device and its number of SMs. */
inline mxs_status device_sms(int *device, int *sms) {
    if (cudaGetDevice(device) != cudaSuccess ||
        cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, *device) != cudaSuccess) {
        (void)cudaGetLastError(); /* our error: reported by the status, not left pending */
        return MXS_ERR_CUDA;
    }
    if (*sms < 1) *sms = 1;
    return MXS_OK;
}

} /* namespace mxs__cu */

#endif /* MXSHARD_CUDA_LAUNCH_CUH */
