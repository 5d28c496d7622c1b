/* SPDX-License-Identifier: MIT */
/* cuda/mxs_nvfp4_quantize.cu - whole-tensor NVFP4 on the GPU
 * (<mxshard/cuda_nvfp4.h>): quantize, dequantize and scale-layout
 * conversion.
 *
 *   quantize   memset(amax) | amax pass (8 elements per thread; atomicMax on
 *              the f32 bits: amaxes are >= 0 and never NaN, so the bits order
 *              as the values) | tile pass (warp tiles: scales and data;
 *              padding units) - off the tile path (cols % 8 != 0, a
 *              column-wise plane with rows % 16 != 0, misaligned planes):
 *              scale pass + cast pass, one unit each
 *   dequantize one thread per element
 *   convert    one thread per destination scale byte
 *
 * Each unit calls the MXS_HOST_DEVICE rules of nvfp4.h (mxs_nvfp4_block_scale,
 * _encode_mult, mxs_e2m1x2_from_f32, the scale geometry), so the bytes equal
 * mxs_host_nvfp4_quantize's.
 */
#include <cuda_runtime.h>

#include <string.h>

#include <mxshard/cuda_nvfp4.h>

#include "mxs_launch.cuh"
#include "mxs_nvfp4_tile.cuh"

using namespace mxs__cu;

namespace {

/* ---- whole tensor -------------------------------------------------------------- */

struct NvTensor {
    int64_t rows, cols, n;
    unsigned dirs;
    int block, dtype, rt;
    const void *src;
    uint8_t *data[2], *scale[2];
    mxs_scale_geom geom[2];
    int64_t sbytes[2], dbytes;
    float *amax;
};

/* The global amax: 8 elements per thread and step (ld_vec8: one or two
 * 16-byte loads; MIS: src only element-aligned), the last n % 8 one by one. */
template <bool MIS>
__global__ void __launch_bounds__(kNvThreads)
    nv_amax_kernel(const void *src, int dtype, int rt, int64_t n, float *amax) {
    float a = 0.0f;
    const int64_t n8 = n / 8;
    for (int64_t i = unit_first(); i < n8; i += unit_stride()) {
        uint4 raw[2];
        float x[8];
        ld_vec8<MIS>(src, dtype, 8 * i, raw);
        unpack8(x, raw, dtype);
        if (nv_eff_rt(dtype, rt) != MXS_F32) nv_round_through8(x, rt);
#pragma unroll
        for (int j = 0; j < 8; j++) a = mxs_amax_step(a, x[j]);
    }
    for (int64_t i = 8 * n8 + unit_first(); i < n; i += unit_stride()) a = mxs_amax_step(a, nv_load(src, dtype, i, rt));
    for (int o = 16; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(0xFFFFFFFFu, a, o));
    if ((threadIdx.x & 31u) == 0 && a > 0.0f) atomicMax(reinterpret_cast<unsigned *>(amax), mxs_f32_bits(a));
}

/* Amax of the source elements rows [r0, r1) x cols [c0, c1). */
__device__ float nv_src_amax(const NvTensor &T, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    float a = 0.0f;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t c = c0; c < c1; c++) a = mxs_amax_step(a, nv_load(T.src, T.dtype, r * T.cols + c, T.rt));
    return a;
}

/* Scale pass: unit = one scale byte of a present plane (row plane first). */
__global__ void __launch_bounds__(kNvThreads) nv_scale_kernel(const __grid_constant__ NvTensor T, int64_t units) {
    const float s_enc = mxs_nvfp4_global_encode(*T.amax);
    for (int64_t u = unit_first(); u < units; u += unit_stride()) {
        const int p = u < T.sbytes[0] ? 0 : 1;
        const int64_t off = p == 0 ? u : u - T.sbytes[0];
        const mxs_scale_geom &g = T.geom[p];
        int64_t m, k;
        uint8_t sc = 0;
        mxs_scale_geom_coords(&g, off, &m, &k);
        if (mxs_scale_geom_is_logical(&g, m, k)) {
            float a;
            if (T.block == MXS_NVFP4_16X16) {
                int64_t R, C;
                mxs_nvfp4_entry_tile((mxs_dirs)(p + 1), m, k, &R, &C);
                const int64_t r0 = R * MXS_NVFP4_BLOCK, c0 = C * MXS_NVFP4_BLOCK;
                a = nv_src_amax(T, r0, r0 + MXS_NVFP4_BLOCK < T.rows ? r0 + MXS_NVFP4_BLOCK : T.rows, c0,
                                c0 + MXS_NVFP4_BLOCK < T.cols ? c0 + MXS_NVFP4_BLOCK : T.cols);
            } else if (p == 0) { /* 1x16: row m, cols 16k.. */
                const int64_t c0 = k * MXS_NVFP4_BLOCK;
                a = nv_src_amax(T, m, m + 1, c0, c0 + MXS_NVFP4_BLOCK < T.cols ? c0 + MXS_NVFP4_BLOCK : T.cols);
            } else { /* 16x1: column m, rows 16k.. */
                const int64_t r0 = k * MXS_NVFP4_BLOCK;
                a = nv_src_amax(T, r0, r0 + MXS_NVFP4_BLOCK < T.rows ? r0 + MXS_NVFP4_BLOCK : T.rows, m, m + 1);
            }
            sc = mxs_nvfp4_block_scale(a, s_enc);
        }
        T.scale[p][off] = sc;
    }
}

/* Nibble j of plane p (flat index in that plane), from its stored scale. */
__device__ __forceinline__ uint8_t nv_cast_nibble(const NvTensor &T, int p, int64_t j, float s_enc) {
    const mxs_dirs plane = (mxs_dirs)(p + 1);
    const int64_t r = p == 0 ? j / T.cols : j % T.rows, c = p == 0 ? j % T.cols : j / T.rows;
    const uint8_t sc =
        T.scale[p][mxs_scale_geom_offset(&T.geom[p], mxs_nvfp4_scale_m(plane, r, c), mxs_nvfp4_scale_k(plane, r, c))];
    return mxs_nvfp4_quantize_elem(nv_load(T.src, T.dtype, r * T.cols + c, T.rt), mxs_nvfp4_encode_mult(sc, s_enc));
}

/* Cast pass: unit = one data byte of a present plane (row plane first). */
__global__ void __launch_bounds__(kNvThreads)
    nv_cast_kernel(const __grid_constant__ NvTensor T, int64_t per_plane, int64_t units) {
    const float s_enc = mxs_nvfp4_global_encode(*T.amax);
    for (int64_t u = unit_first(); u < units; u += unit_stride()) {
        const int p = (T.dirs & MXS_ROWWISE) && u < per_plane ? 0 : 1;
        const int64_t b = u < per_plane ? u : u - per_plane, j = 2 * b;
        uint8_t lo = nv_cast_nibble(T, p, j, s_enc), hi = j + 1 < T.n ? nv_cast_nibble(T, p, j + 1, s_enc) : 0;
        T.data[p][b] = (uint8_t)((lo & 0xFu) | (hi << 4));
    }
}

__global__ void __launch_bounds__(kNvThreads)
    nv_dequant_kernel(const uint8_t *data, const uint8_t *scale, mxs_scale_geom g, int plane, int64_t rows,
                      int64_t cols, const float *amax_p, void *dst, int dtype) {
    const float amax = *amax_p;
    const int64_t n = rows * cols;
    for (int64_t i = unit_first(); i < n; i += unit_stride()) {
        const int64_t r = i / cols, c = i % cols;
        const uint8_t sc = scale[mxs_scale_geom_offset(&g, mxs_nvfp4_scale_m((mxs_dirs)plane, r, c),
                                                       mxs_nvfp4_scale_k((mxs_dirs)plane, r, c))];
        const uint8_t q = mxs_nvfp4_get(data, mxs_nvfp4_data_index(rows, cols, (mxs_dirs)plane, r, c));
        const float v = mxs_nvfp4_dequantize_elem(q, mxs_nvfp4_decode_mult(sc, amax));
        if (dtype == MXS_F32)
            static_cast<float *>(dst)[i] = v;
        else if (dtype == MXS_BF16)
            static_cast<uint16_t *>(dst)[i] = mxs_bf16_from_f32(v);
        else
            static_cast<uint16_t *>(dst)[i] = mxs_f16_from_f32(v);
    }
}

__global__ void __launch_bounds__(kNvThreads)
    nv_convert_kernel(uint8_t *dst, mxs_scale_geom gd, const uint8_t *src, mxs_scale_geom gs, int64_t bytes) {
    for (int64_t off = unit_first(); off < bytes; off += unit_stride()) {
        int64_t m, k;
        mxs_scale_geom_coords(&gd, off, &m, &k);
        dst[off] = mxs_scale_geom_is_logical(&gd, m, k) ? src[mxs_scale_geom_offset(&gs, m, k)] : 0;
    }
}

/* ---- quantize in warp tiles ---------------------------------------------------------
 *
 * The same warp tile (16 rows x 256 columns, lane = 8 columns) over the whole
 * tensor, for cols % 8 == 0 (and, with a column-wise plane, rows % 16 == 0):
 * the block amaxes come from the source in registers, so every source
 * element is read once per pass instead of once per scale byte and nibble.
 *   1x16 row-wise   per row: the pair's block amax (__shfl_xor), its scale
 *                   byte (even lane), the 8 nibbles: one pass
 *   16x1 / 16x16    pass 1: running column maxima over the 16 rows (16x16:
 *                   then the pair); the scales; pass 2 (the tile again, from
 *                   L1/L2): the casts
 *   column-wise     the lane's 16 nibbles of each of its 8 columns in two
 *   data            32-bit words, one 8-byte store per column
 * A block's element multiplier is a load from the CTA's table of the
 * tensor's multipliers (nv_mult_table_fill), not a division.
 * Padding bytes of PADDED / SWIZZLED scale planes: thread units over the
 * stored grid after the tiles (the tiles write every logical byte). */

struct NvQuant {
    NvTensor T;
    int64_t ctiles, tiles, tile_blocks, units; /* units: padding units of 4 entries, row plane first */
    int64_t punits[2];
    int64_t sstep[2]; /* mxs_scale_geom_m_step of each plane */
    int mis;          /* the source is only element-aligned (ld16_elems) */
};

/* 8 source elements f .. f+7 (all inside), DT / RT as nv_load8's. */
template <int DT, int RT> __device__ __forceinline__ void nv_src8(const NvQuant &Q, int64_t f, float *x) {
    nv_vec8_load(Q.T.src, DT, f, RT, Q.mis, x);
}

/* The rows of a row-only 1x16 tile (its only pass; the common case): the
 * general loop of nv_quantize_tile with the addresses hoisted - the source,
 * data and scale pointers advance a row per step - and a 32-bit row count.
 * The same loads, rules and stores. An inactive lane (c0 >= cols) loads
 * nothing (zeros for its pair's block amax) and forms its pointers at
 * column 0 without using them. */
template <int DT, int RT>
__device__ __forceinline__ void nv_quantize_rows1x16(const NvQuant &Q, int64_t r0, int n, int64_t c0, int64_t k,
                                                     float s_enc, const float *emul) {
    const NvTensor &T = Q.T;
    const int lane = (int)(threadIdx.x & 31u);
    const bool active = c0 < T.cols, store_scale = active && !(lane & 1);
    const int64_t es = DT == MXS_F32 ? 4 : 2, f0 = r0 * T.cols + (active ? c0 : 0);
    const uint8_t *src = static_cast<const uint8_t *>(T.src) + f0 * es;
    uint8_t *drow = T.data[0] + f0 / 2; /* cols % 8 == 0 on the tile path */
    uint8_t *srow = T.scale[0] + mxs_scale_geom_offset(&T.geom[0], r0, active ? k : 0);
    const int64_t sstep = T.cols * es, dstep = T.cols / 2, scstep = Q.sstep[0];
#pragma unroll 4
    for (int i = 0; i < n; i++) {
        float x[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f}, e[8];
        if (active) nv_vec8_load(src, DT, 0, RT, Q.mis, x);
        float a = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; j++) a = mxs_amax_step(a, x[j]);
        a = fmaxf(a, __shfl_xor_sync(kFull, a, 1));
        const uint8_t sc = mxs_nvfp4_block_scale(a, s_enc);
        if (store_scale) *srow = sc;
        if (active) {
#pragma unroll
            for (int j = 0; j < 8; j++) e[j] = emul[sc];
            *reinterpret_cast<uint32_t *>(drow) = nv_cast8(x, e);
        }
        src += sstep;
        drow += dstep;
        srow += scstep;
    }
}

template <int DT, int RT>
__device__ void nv_quantize_tile(const NvQuant &Q, int64_t t, float s_enc, const float *emul) {
    const NvTensor &T = Q.T;
    const int lane = (int)(threadIdx.x & 31u);
    const int64_t g = t / Q.ctiles, c0 = (t % Q.ctiles) * kNvTileCols + lane * 8;
    const int64_t r0 = g * MXS_NVFP4_BLOCK, r1 = r0 + MXS_NVFP4_BLOCK < T.rows ? r0 + MXS_NVFP4_BLOCK : T.rows;
    const int64_t k = c0 / MXS_NVFP4_BLOCK;
    const bool active = c0 < T.cols, rowp = T.data[0] != nullptr, colp = T.data[1] != nullptr;
    const bool two_d = T.block == MXS_NVFP4_16X16;
    if (rowp && !colp && !two_d) {
        nv_quantize_rows1x16<DT, RT>(Q, r0, (int)(r1 - r0), c0, k, s_enc, emul);
        return;
    }
    float ec[8], et = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; j++) ec[j] = 0.0f;
    if (two_d || colp) { /* pass 1 */
        float cm[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        if (active) {
#pragma unroll 4
            for (int64_t r = r0; r < r1; r++) {
                float x[8];
                nv_src8<DT, RT>(Q, r * T.cols + c0, x);
#pragma unroll
                for (int j = 0; j < 8; j++) cm[j] = mxs_amax_step(cm[j], x[j]);
            }
        }
        if (two_d) {
            float tm = 0.0f;
#pragma unroll
            for (int j = 0; j < 8; j++) tm = fmaxf(tm, cm[j]);
            tm = fmaxf(tm, __shfl_xor_sync(kFull, tm, 1));
            const uint8_t sc = mxs_nvfp4_block_scale(tm, s_enc);
            et = emul[sc];
            /* the tile's entry in each of its rows (the pair splits them; also
             * when only the even lane has columns: cols % 16 == 8) ... */
            if (rowp && k * MXS_NVFP4_BLOCK < T.cols) {
                uint8_t *d = T.scale[0] + mxs_scale_geom_offset(&T.geom[0], r0, k);
                for (int64_t r = r0 + (lane & 1); r < r1; r += 2) d[(r - r0) * Q.sstep[0]] = sc;
            }
            if (colp && active) { /* ... and in each of its columns: this lane's 8 */
                uint8_t *d = T.scale[1] + mxs_scale_geom_offset(&T.geom[1], c0, g);
#pragma unroll
                for (int j = 0; j < 8; j++)
                    if (c0 + j < T.cols) d[j * Q.sstep[1]] = sc;
            }
        } else if (active) { /* 16x1 blocks (c, g) */
            uint8_t *d = T.scale[1] + mxs_scale_geom_offset(&T.geom[1], c0, g);
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const uint8_t sc = mxs_nvfp4_block_scale(cm[j], s_enc);
                ec[j] = emul[sc];
                d[j * Q.sstep[1]] = sc;
            }
        }
    }
    uint8_t *const srow = rowp && !two_d && active ? T.scale[0] + mxs_scale_geom_offset(&T.geom[0], r0, k) : nullptr;
#pragma unroll 1
    for (int h = 0; h < 2; h++) { /* pass 2 (the only pass for 1x16 row-only), 8 rows at a time */
        uint32_t cw[8];
#pragma unroll
        for (int j = 0; j < 8; j++) cw[j] = 0u;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int64_t r = r0 + 8 * h + i;
            if (r >= r1) break; /* warp-uniform */
            float x[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f}, e[8];
            if (active) nv_src8<DT, RT>(Q, r * T.cols + c0, x);
            if (rowp) {
                float er = et;
                if (!two_d) {
                    float a = 0.0f;
#pragma unroll
                    for (int j = 0; j < 8; j++) a = mxs_amax_step(a, x[j]);
                    a = fmaxf(a, __shfl_xor_sync(kFull, a, 1));
                    const uint8_t sc = mxs_nvfp4_block_scale(a, s_enc);
                    er = emul[sc];
                    if (active && !(lane & 1)) srow[(r - r0) * Q.sstep[0]] = sc;
                }
                if (active) {
#pragma unroll
                    for (int j = 0; j < 8; j++) e[j] = er;
                    *reinterpret_cast<uint32_t *>(T.data[0] + (r * T.cols + c0) / 2) = nv_cast8(x, e);
                }
            }
            if (colp && active)
#pragma unroll
                for (int j = 0; j < 8; j++)
                    cw[j] |= (uint32_t)mxs_nvfp4_quantize_elem(x[j], two_d ? et : ec[j]) << (4 * i);
        }
        if (colp && active) /* rows % 16 == 0: the group is whole; 8 nibbles = 4 aligned bytes */
#pragma unroll
            for (int j = 0; j < 8; j++)
                *reinterpret_cast<uint32_t *>(T.data[1] + ((c0 + j) * T.rows + r0 + 8 * h) / 2) = cw[j];
    }
}

/* Padding unit: stored-grid entries (m, 4q .. 4q+3) of a PADDED / SWIZZLED
 * plane (4 consecutive bytes, nv_apply_unit's grid); writes 0 to those that
 * are padding. */
__device__ void nv_quantize_pad_unit(const NvQuant &Q, int64_t u) {
    const int p = u < Q.punits[0] ? 0 : 1;
    const mxs_scale_geom &G = Q.T.geom[p];
    const int64_t q = p == 0 ? u : u - Q.punits[0], kq = G.Kp / 4, m = q / kq, k0 = 4 * (q % kq);
    uint8_t *d = Q.T.scale[p] + mxs_scale_geom_offset(&G, m, k0);
    const bool all = m >= G.M || k0 >= G.K;
    if (all && (reinterpret_cast<uintptr_t>(d) & 3u) == 0) {
        *reinterpret_cast<uint32_t *>(d) = 0u;
        return;
    }
    for (int b = 0; b < 4; b++)
        if (all || k0 + b >= G.K) d[b] = 0;
}

template <int DT, int RT>
__global__ void __launch_bounds__(kNvThreads) nv_quantize_kernel(const __grid_constant__ NvQuant Q) {
    __shared__ float emul[kNvCodes]; /* nv_mult_table_fill */
    const float s_enc = mxs_nvfp4_global_encode(*Q.T.amax);
    nv_mult_table_fill(emul, s_enc);
    const int64_t blocks = Q.tile_blocks + mxs_ceil_div(Q.units, kNvThreads);
    for (int64_t blk = blockIdx.x; blk < blocks; blk += gridDim.x) {
        if (blk < Q.tile_blocks) {
            const int64_t t = blk * kNvWarps + threadIdx.x / 32;
            if (t < Q.tiles) nv_quantize_tile<DT, RT>(Q, t, s_enc, emul);
        } else {
            const int64_t u = (blk - Q.tile_blocks) * kNvThreads + threadIdx.x;
            if (u < Q.units) nv_quantize_pad_unit(Q, u);
        }
    }
}

/* ---- host side ---------------------------------------------------------------------- */

unsigned nv_grid(int64_t units) { return grid_for(mxs_ceil_div(units, kNvThreads)); }

} /* namespace */

/* ---- C ABI -------------------------------------------------------------------------- */

extern "C" {

mxs_status mxs_cuda_nvfp4_quantize(const mxs_nvfp4_tensor *dst, const void *src, mxs_dtype src_dtype,
                                   mxs_dtype round_through, cudaStream_t stream) {
    mxs_status s = mxs_nvfp4_quantize_check(dst, src, src_dtype, round_through);
    if (s != MXS_OK) return s;
    if ((s = launch_begin()) != MXS_OK) return s;
    NvTensor T;
    memset(&T, 0, sizeof T);
    T.rows = dst->rows;
    T.cols = dst->cols;
    T.n = dst->rows * dst->cols;
    T.dirs = dst->dirs;
    T.block = (int)dst->block;
    T.dtype = (int)src_dtype;
    T.rt = (int)round_through;
    T.src = src;
    T.amax = dst->amax;
    T.dbytes = mxs_nvfp4_data_plane_bytes(dst->rows, dst->cols);
    for (int p = 0; p < 2; p++) {
        if (!(dst->dirs & (unsigned)(p + 1))) continue;
        T.data[p] = p == 0 ? dst->row_data : dst->col_data;
        T.scale[p] = p == 0 ? dst->row_scale : dst->col_scale;
        mxs_nvfp4_scale_geom_make(dst->rows, dst->cols, (mxs_dirs)(p + 1), dst->scale_layout, &T.geom[p]);
        T.sbytes[p] = mxs_scale_geom_bytes(&T.geom[p]);
    }
    if (cudaMemsetAsync(dst->amax, 0, sizeof(float), stream) != cudaSuccess) {
        (void)cudaGetLastError();
        return MXS_ERR_CUDA;
    }
    int device, sms;
    if ((s = device_sms(&device, &sms)) != MXS_OK) return s;
    const int64_t amax_ctas = mxs_ceil_div(mxs_ceil_div(T.n, 8), kNvThreads);
    const int64_t cap = (int64_t)sms * 8;
    const unsigned amax_grid = grid_for(amax_ctas < cap ? (amax_ctas > 0 ? amax_ctas : 1) : cap);
    const bool mis = !aligned(src, 16);
    if (mis)
        nv_amax_kernel<true><<<amax_grid, kNvThreads, 0, stream>>>(src, T.dtype, T.rt, T.n, T.amax);
    else
        nv_amax_kernel<false><<<amax_grid, kNvThreads, 0, stream>>>(src, T.dtype, T.rt, T.n, T.amax);
    /* the warp tiles (NvQuant) where the shape and the planes' alignment allow */
    const bool tiles = T.cols % 8 == 0 && nv_aligned_to(T.data[0], 4) &&
                       (!T.data[1] || (T.rows % MXS_NVFP4_BLOCK == 0 && nv_aligned_to(T.data[1], 4)));
    if (tiles) {
        NvQuant Q;
        memset(&Q, 0, sizeof Q);
        Q.T = T;
        Q.ctiles = mxs_ceil_div(T.cols, kNvTileCols);
        Q.tiles = mxs_ceil_div(T.rows, MXS_NVFP4_BLOCK) * Q.ctiles;
        Q.tile_blocks = mxs_ceil_div(Q.tiles, kNvWarps);
        for (int p = 0; p < 2; p++)
            if (T.scale[p] && T.geom[p].layout != MXS_SCALES_COMPACT) Q.punits[p] = T.geom[p].Mp * (T.geom[p].Kp / 4);
        Q.units = Q.punits[0] + Q.punits[1];
        for (int p = 0; p < 2; p++) Q.sstep[p] = mxs_scale_geom_m_step(&T.geom[p]);
        Q.mis = mis;
        const unsigned grid = grid_for(Q.tile_blocks + mxs_ceil_div(Q.units, kNvThreads));
        switch (T.dtype * 3 + nv_eff_rt(T.dtype, T.rt)) { /* every (dtype, effective round-through) */
        case MXS_F32 * 3 + MXS_F32: nv_quantize_kernel<MXS_F32, MXS_F32><<<grid, kNvThreads, 0, stream>>>(Q); break;
        case MXS_F32 * 3 + MXS_BF16: nv_quantize_kernel<MXS_F32, MXS_BF16><<<grid, kNvThreads, 0, stream>>>(Q); break;
        case MXS_F32 * 3 + MXS_F16: nv_quantize_kernel<MXS_F32, MXS_F16><<<grid, kNvThreads, 0, stream>>>(Q); break;
        case MXS_BF16 * 3 + MXS_F32: nv_quantize_kernel<MXS_BF16, MXS_F32><<<grid, kNvThreads, 0, stream>>>(Q); break;
        case MXS_BF16 * 3 + MXS_F16: nv_quantize_kernel<MXS_BF16, MXS_F16><<<grid, kNvThreads, 0, stream>>>(Q); break;
        case MXS_F16 * 3 + MXS_F32: nv_quantize_kernel<MXS_F16, MXS_F32><<<grid, kNvThreads, 0, stream>>>(Q); break;
        default: nv_quantize_kernel<MXS_F16, MXS_BF16><<<grid, kNvThreads, 0, stream>>>(Q); break;
        }
        return launch_end();
    }
    const int64_t sunits = T.sbytes[0] + T.sbytes[1];
    nv_scale_kernel<<<nv_grid(sunits), kNvThreads, 0, stream>>>(T, sunits);
    const int planes = (dst->dirs & MXS_ROWWISE ? 1 : 0) + (dst->dirs & MXS_COLWISE ? 1 : 0);
    nv_cast_kernel<<<nv_grid(planes * T.dbytes), kNvThreads, 0, stream>>>(T, T.dbytes, planes * T.dbytes);
    return launch_end();
}

mxs_status mxs_cuda_nvfp4_dequantize(const mxs_nvfp4_tensor *t, mxs_dirs plane, void *dst, mxs_dtype dst_dtype,
                                     cudaStream_t stream) {
    const uint8_t *data, *scale;
    mxs_scale_geom g;
    mxs_status s = mxs_nvfp4_dequantize_check(t, plane, dst, dst_dtype, &data, &scale, &g);
    if (s != MXS_OK) return s;
    if ((s = launch_begin()) != MXS_OK) return s;
    nv_dequant_kernel<<<nv_grid(t->rows * t->cols), kNvThreads, 0, stream>>>(data, scale, g, (int)plane, t->rows,
                                                                             t->cols, t->amax, dst, (int)dst_dtype);
    return launch_end();
}

mxs_status mxs_cuda_nvfp4_convert_scales(int64_t rows, int64_t cols, mxs_dirs plane, mxs_scale_layout from,
                                         const uint8_t *src, mxs_scale_layout to, uint8_t *dst, cudaStream_t stream) {
    mxs_scale_geom gs, gd;
    mxs_status s = mxs_nvfp4_convert_scales_check(rows, cols, plane, from, src, to, dst, &gs, &gd);
    if (s != MXS_OK) return s;
    if ((s = launch_begin()) != MXS_OK) return s;
    const int64_t bytes = mxs_scale_geom_bytes(&gd);
    nv_convert_kernel<<<nv_grid(bytes), kNvThreads, 0, stream>>>(dst, gd, src, gs, bytes);
    return launch_end();
}

} /* extern "C" */
