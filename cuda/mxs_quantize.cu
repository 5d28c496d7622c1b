/* SPDX-License-Identifier: MIT */
/* cuda/mxs_quantize.cu - whole-tensor kernels of libmxshard_cuda and their
 * C-ABI launchers (<mxshard/cuda.h>): quantize (the BF16 copy-back),
 * dequantize and scale-layout conversion.
 *
 * Quantize runs the tile of mxs_tile.cuh over the whole tensor, on the job
 * mxs__quantize_job builds (the host path builds the same one). Interior
 * tiles (whole 32 x 128 tiles on the vector path, not in the last group
 * when padding entries must be written) go to the lean interior kernel,
 * the rest to the general one: each tile is read once; 1 launch for shapes
 * that are multiples of 32 x 128 on the vector path with COMPACT scales (in
 * PADDED / SWIZZLED: multiples of 128 x 128, no padding entries; see
 * kInteriorLastGroup), else 2.
 */
#include <cuda_runtime.h>

#include <string.h>

#include <mxshard/cuda.h>

#include "mxs_launch.cuh"
#include "mxs_scales.cuh"
#include "mxs_tile.cuh"

using namespace mxs__cu;

namespace {

/* The last group's whole tiles go to the interior kernel too when the
 * PADDED / SWIZZLED planes have no padding entries (M a multiple of 128 and
 * K of 4 in every present plane: rows and cols multiples of 128), so there
 * is nothing for the general kernel's last-group tiles to zero: such shapes
 * take one launch in every layout, as with COMPACT. false: the last group
 * always goes to the general kernel when J.pad. */
constexpr bool kInteriorLastGroup = true;

bool has_padding_entries(const mxs__job &J) {
    for (int p = 0; p < 2; p++)
        if ((J.planes & (unsigned)(p + 1)) && (J.geom[p].Mp != J.geom[p].M || J.geom[p].Kp != J.geom[p].K)) return true;
    return false;
}

/* ---- kernels ------------------------------------------------------------------ */

/* Quantize, the tiles the interior kernel below does not take: with
 * T_int x G_int interior tiles, first the right strip (groups < G_int,
 * tile columns >= T_int), then every tile of the groups >= G_int. */
template <unsigned PLANES>
__global__ void __launch_bounds__(kThreads)
    quantize_kernel(const __grid_constant__ mxs__job J, int64_t T, int64_t units, int64_t G_int, int64_t T_int) {
    __shared__ TileSmem sm;
    const int64_t strip = G_int * (T - T_int);
    for (int64_t u = blockIdx.x; u < units; u += gridDim.x) {
        if (u < strip)
            run_tile<MXS__JOB_QUANTIZE, PLANES>(J, u / (T - T_int), T_int + u % (T - T_int), sm);
        else
            run_tile<MXS__JOB_QUANTIZE, PLANES>(J, G_int + (u - strip) / T, (u - strip) % T, sm);
    }
}

template <int DTYPE, unsigned PLANES>
__global__ void __launch_bounds__(kThreads)
    quantize_interior_kernel(const __grid_constant__ mxs__job J, uint32_t T_int, uint32_t units) {
    __shared__ TileSmem sm;
    for (uint32_t u = blockIdx.x; u < units; u += gridDim.x) {
        const uint32_t g = u / T_int, t = u - g * T_int;
        interior_tile<DTYPE, PLANES>(J, g, t, sm);
    }
}

template <int DTYPE> void launch_interior(const mxs__job &J, uint32_t T_int, uint32_t units, cudaStream_t stream) {
    const unsigned grid = grid_for(units);
    if (J.planes == MXS_ROWWISE)
        quantize_interior_kernel<DTYPE, MXS_ROWWISE><<<grid, kThreads, 0, stream>>>(J, T_int, units);
    else if (J.planes == MXS_COLWISE)
        quantize_interior_kernel<DTYPE, MXS_COLWISE><<<grid, kThreads, 0, stream>>>(J, T_int, units);
    else
        quantize_interior_kernel<DTYPE, MXS_BOTH><<<grid, kThreads, 0, stream>>>(J, T_int, units);
}

/* Scale-layout conversion: the scatterer of mxs_scales.cuh over the whole
 * destination plane (bytes in layout gd), one unit per CTA. */
__global__ void __launch_bounds__(kThreads) convert_kernel(uint8_t *dst, mxs_scale_geom gd, const uint8_t *src,
                                                           mxs_scale_geom gs, int64_t bytes, int64_t units) {
    for (int64_t u = blockIdx.x; u < units; u += gridDim.x) scatter_vec_unit(dst, gd, src, gs, bytes, u);
}

__global__ void __launch_bounds__(kDequantThreads)
    dequantize_kernel(const uint8_t *data, const uint8_t *scale, mxs_scale_geom g, int64_t cols, int64_t elems,
                      void *dst, int dtype) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < elems; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / cols, c = i % cols;
        uint8_t e = scale[mxs_scale_geom_offset(&g, mxs_scale_m(&g, r, c), mxs_scale_k(&g, r, c))];
        float v = mxs_dequantize_elem(data[i], e);
        if (dtype == MXS_F32)
            static_cast<float *>(dst)[i] = v;
        else if (dtype == MXS_BF16)
            static_cast<uint16_t *>(dst)[i] = mxs_bf16_from_f32(v);
        else
            static_cast<uint16_t *>(dst)[i] = mxs_f16_from_f32(v);
    }
}

} /* namespace */

/* ---- C ABI -------------------------------------------------------------------------- */

extern "C" {

mxs_status mxs_cuda_quantize(const mxs_tensor *dst, const void *src, mxs_dtype src_dtype, mxs_rounding rounding,
                             cudaStream_t stream) {
    mxs_status s = mxs_quantize_check(dst, src, src_dtype, rounding);
    if (s != MXS_OK) return s;
    if ((s = launch_begin()) != MXS_OK) return s;
    mxs__job J;
    mxs__quantize_job(dst, src, src_dtype, rounding, &J);
    bool vec = dst->cols % 8 == 0 && aligned(src, 16);
    for (int p = 0; p < 2; p++)
        if (dst->dirs & (unsigned)(p + 1)) vec = vec && aligned(J.out[p], 8);
    J.vec = vec;
    /* Interior tiles (whole 32 x 128 tiles, vector path, and not in the
     * last group when padding entries must be written) go to the lean
     * kernel; the rest, if any, to the general one. */
    const int64_t T = mxs_ceil_div(dst->cols, kTileCols), G = mxs_col_groups(dst->rows), units = G * T;
    int64_t T_int = vec ? dst->cols / kTileCols : 0, G_int = vec ? dst->rows / MXS_BLOCK : 0;
    if (J.pad && G_int == G && (!kInteriorLastGroup || has_padding_entries(J))) G_int--;
    if (G_int * T_int > (int64_t)UINT32_MAX) G_int = T_int = 0;
    if (G_int <= 0 || T_int <= 0) G_int = T_int = 0;
    const int64_t interior = G_int * T_int, rest = units - interior;
    if (interior > 0) {
        if (src_dtype == MXS_F32)
            launch_interior<MXS_F32>(J, (uint32_t)T_int, (uint32_t)interior, stream);
        else if (src_dtype == MXS_BF16)
            launch_interior<MXS_BF16>(J, (uint32_t)T_int, (uint32_t)interior, stream);
        else
            launch_interior<MXS_F16>(J, (uint32_t)T_int, (uint32_t)interior, stream);
        if ((s = launch_end()) != MXS_OK) return s;
    }
    if (rest > 0) {
        const unsigned grid = grid_for(rest);
        if (dst->dirs == MXS_ROWWISE)
            quantize_kernel<MXS_ROWWISE><<<grid, kThreads, 0, stream>>>(J, T, rest, G_int, T_int);
        else if (dst->dirs == MXS_COLWISE)
            quantize_kernel<MXS_COLWISE><<<grid, kThreads, 0, stream>>>(J, T, rest, G_int, T_int);
        else
            quantize_kernel<MXS_BOTH><<<grid, kThreads, 0, stream>>>(J, T, rest, G_int, T_int);
    }
    return launch_end();
}

mxs_status mxs_cuda_dequantize(const mxs_tensor *t, mxs_dirs plane, void *dst, mxs_dtype dst_dtype,
                               cudaStream_t stream) {
    const uint8_t *data, *scale;
    mxs_scale_geom g;
    int device, sms;
    mxs_status s = mxs_dequantize_check(t, plane, dst, dst_dtype, &data, &scale, &g);
    if (s != MXS_OK) return s;
    if ((s = launch_begin()) != MXS_OK) return s;
    if ((s = device_sms(&device, &sms)) != MXS_OK) return s;
    const int64_t elems = t->rows * t->cols, cap = (int64_t)sms * kDequantCtasPerSm;
    int64_t blocks = mxs_ceil_div(elems, kDequantThreads);
    blocks = blocks < cap ? blocks : cap;
    dequantize_kernel<<<grid_for(blocks), kDequantThreads, 0, stream>>>(data, scale, g, t->cols, elems, dst, dst_dtype);
    return launch_end();
}

mxs_status mxs_cuda_convert_scales(int64_t rows, int64_t cols, mxs_dirs plane, mxs_scale_layout from,
                                   const uint8_t *src, mxs_scale_layout to, uint8_t *dst, cudaStream_t stream) {
    mxs_scale_geom gs, gd;
    mxs_status s = mxs_convert_scales_check(rows, cols, plane, from, src, to, dst, &gs, &gd);
    if (s != MXS_OK) return s;
    if ((s = launch_begin()) != MXS_OK) return s;
    const int64_t bytes = mxs_scale_geom_bytes(&gd);
    const int64_t units = vec_units(dst, bytes);
    if (units == 0) return MXS_OK;
    convert_kernel<<<grid_for(units), kThreads, 0, stream>>>(dst, gd, src, gs, bytes, units);
    return launch_end();
}

} /* extern "C" */
