/* SPDX-License-Identifier: MIT */
/* cuda/mxs_nvfp4_tile.cuh - NVFP4 tile helpers shared by the quantize
 * (mxs_nvfp4_quantize.cu) and writeback (mxs_nvfp4_wb_*.cu) kernels: the
 * launch shape, source loads with round-through, the grid-stride unit loop
 * and the 8-element cast of a warp-tile lane.
 *
 * A warp tile is one 16-row group x 256 columns (docs/cuda.md "NVFP4"):
 *
 *   lanes     0    1  |  2    3  | ...                31
 *   columns  [8e][8e] | [8e][8e] |                     (32 x 8 = 256)
 *            1x16 row block = a lane pair: its amax by one __shfl_xor
 *   rows     r0 .. r0+15 (16x1 column blocks and 16x16 tiles: per lane,
 *            running maxima over the rows; 16x16: then the pair)
 *
 * and each row's 8 nibbles are one 32-bit store (nv_cast8). Every rule is
 * an MXS_HOST_DEVICE function of nvfp4.h / formats.h: these helpers only
 * move elements, so the bytes equal the host path's.
 */
#ifndef MXSHARD_CUDA_NVFP4_TILE_CUH
#define MXSHARD_CUDA_NVFP4_TILE_CUH

#include <cuda_runtime.h>

#include <mxshard/cuda_nvfp4.h>

#include "mxs_launch.cuh"
#include "mxs_tile.cuh"

namespace mxs__cu {

constexpr int kNvThreads = 256;
constexpr int kNvWarps = kNvThreads / 32; /* warp tiles per CTA */
constexpr int kNvTileCols = 256;          /* columns of a warp tile: 32 lanes x 8 */
constexpr unsigned kFull = 0xFFFFFFFFu;   /* every lane of the warp (__shfl_xor_sync) */

/* Effective round-through of a dtype: rt, or MXS_F32 (none) when rt is the
 * dtype itself (bf16 -> bf16 and f16 -> f16 are the identity, as the host's
 * mxs__host_load treats them). */
__host__ __device__ __forceinline__ int nv_eff_rt(int dtype, int rt) {
    return rt != MXS_F32 && rt != dtype ? rt : MXS_F32;
}

/* Source element i, widened and rounded through rt exactly as the host's
 * mxs__host_load. */
__device__ __forceinline__ float nv_load(const void *src, int dtype, int64_t i, int rt) {
    float v = mxs_load_f32(src, (mxs_dtype)dtype, i);
    if (nv_eff_rt(dtype, rt) != MXS_F32) v = mxs_round_through(v, (mxs_dtype)rt);
    return v;
}

/* Grid-stride loop bounds of thread units. */
__device__ __forceinline__ int64_t unit_first() { return (int64_t)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ int64_t unit_stride() { return (int64_t)gridDim.x * blockDim.x; }

/* Host: whether p is NULL or a-byte aligned (an absent plane passes). */
inline bool nv_aligned_to(const void *p, uintptr_t a) { return p == nullptr || aligned(p, a); }

/* round_through8 (mxs_tile.cuh) for the NVFP4 tiles: the same rule, a pair
 * at a time (mxs_round_through2: one bf16x2 conversion per pair). */
__device__ __forceinline__ void nv_round_through8(float *x, int rt) {
#pragma unroll
    for (int k = 0; k < 8; k += 2) mxs_round_through2(&x[k], &x[k + 1], (mxs_dtype)rt);
}

/* The 8 source elements e .. e+7 of src (all inside): one 16-byte vector
 * load, two for f32 (ld_vec8; mis: src only element-aligned, ld16_elems),
 * widened and rounded through rt (MXS_F32: none) - every tile's row load. */
__device__ __forceinline__ void nv_vec8_load(const void *src, int dtype, int64_t e, int rt, bool mis, float *x) {
    uint4 raw[2];
    if (mis)
        ld_vec8<true>(src, dtype, e, raw);
    else
        ld_vec8<false>(src, dtype, e, raw);
    unpack8(x, raw, dtype);
    if (rt != MXS_F32) nv_round_through8(x, rt);
}

/* 8 nibbles E2M1(fl32(x[j] * e[j])) as 4 bytes, the even index low
 * (mxs_e2m1x8_from_f32: the packed form of the rule). */
__device__ __forceinline__ uint32_t nv_cast8(const float *x, const float *e) {
    float y[8];
#pragma unroll
    for (int j = 0; j < 8; j++) y[j] = __fmul_rn(x[j], e[j]); /* one rounding, never fused */
    return mxs_e2m1x8_from_f32(y);
}

/* The encode multipliers of one tensor, one per E4M3 scale code:
 * tab[c] = mxs_nvfp4_encode_mult(c, s_enc), filled by the CTA's kNvThreads
 * threads (one code each), then __syncthreads. A block's multiplier is then
 * one shared-memory load instead of the rule's decode and IEEE division:
 * the same value, since the table holds the rule's own results. Every
 * thread of the CTA calls it. */
constexpr int kNvCodes = 256;
__device__ __forceinline__ void nv_mult_table_fill(float *tab, float s_enc) {
    static_assert(kNvThreads == kNvCodes, "one scale code per thread");
    tab[threadIdx.x] = mxs_nvfp4_encode_mult((uint8_t)threadIdx.x, s_enc);
    __syncthreads();
}

} /* namespace mxs__cu */

#endif /* MXSHARD_CUDA_NVFP4_TILE_CUH */
