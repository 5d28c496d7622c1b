/* SPDX-License-Identifier: MIT */
/* cuda/mxs_nvfp4_wb_finish.cu - the NVFP4 writeback's finish phase on the
 * GPU: the column-wise data plane from the gathered column stage (1x16) or
 * row-wise plane (16x16), a local nibble transpose
 *
 *   col plane nibble c*rows + r  =  stage nibble r*cols + c
 *
 * in CTA tiles when rows % 16 == 0 and cols % 8 == 0 (NvPhase<PH_FINISH>::tile),
 * else one thread per output byte. The same kernel serves
 * mxs_cuda_nvfp4_stage_to_col (one record). Launched by
 * mxs_nvfp4_writeback.cu (nv_wb_launch_finish).
 */
#include "mxs_nvfp4_wb.cuh"

namespace mxs__cu {
/* Finish, one CTA tile (rows % 16 == 0, cols % 8 == 0): kFinishGroups
 * 16-row groups x 256 columns. Warp w transposes group w: lane l reads 16
 * rows x 4 bytes (its 8 columns) and leaves each column's 16 nibbles (8
 * bytes) in shared memory; then the CTA writes each column's bytes of all
 * the groups (64 contiguous bytes when the tile has 8 groups) with
 * consecutive threads on consecutive words of a column: a warp's store is
 * 4 columns x 64 bytes, whole 32-byte sectors. (Run 16's version let
 * thread c write column c's 8 words: each store instruction of a warp then
 * touched 32 sectors for 8 bytes each - L2 at 84 %, DRAM at 15 %, finish
 * at 29 % of the copy ceiling.) Lanes visit their 8 columns rotated by lane
 * so that the shared-memory stores spread over the banks; the pitch
 * kFinishPitch keeps the loads of one store (8 groups x 2 columns per
 * half-warp) on distinct banks. */
template <>
template <int DT, int RT>
__device__ void NvPhase<PH_FINISH>::tile(const NvHead &, const NvItem &I, int64_t t, uint2 (*sm)[kFinishPitch]) {
    const int lane = (int)(threadIdx.x & 31u), warp = (int)(threadIdx.x / 32);
    const int64_t G = I.rows / MXS_NVFP4_BLOCK, RB = mxs_ceil_div(G, kFinishGroups);
    const int64_t g0 = (t % RB) * kFinishGroups, cb = (t / RB) * kNvTileCols;
    const int64_t ng = G - g0 < kFinishGroups ? G - g0 : kFinishGroups;
    const int64_t c0 = cb + lane * 8, g = g0 + warp;
    if (g < G && c0 < I.cols) {
        const uint8_t *src = I.stage ? I.stage : I.data[0];
        uint32_t w[MXS_NVFP4_BLOCK];
#pragma unroll
        for (int i = 0; i < MXS_NVFP4_BLOCK; i++)
            w[i] = __ldg(reinterpret_cast<const uint32_t *>(src + ((g * MXS_NVFP4_BLOCK + i) * I.cols + c0) / 2));
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int jj = (j + lane) & 7; /* rotated: neighbouring lanes hit different banks */
            uint32_t lo = 0, hi = 0;
#pragma unroll
            for (int i = 0; i < 8; i++) {
                lo |= ((w[i] >> (4 * jj)) & 0xFu) << (4 * i);
                hi |= ((w[i + 8] >> (4 * jj)) & 0xFu) << (4 * i);
            }
            sm[warp][lane * 8 + jj] = make_uint2(lo, hi);
        }
    }
    __syncthreads();
    /* word k of the tile's output: column k / ng, group k % ng */
    const int n = (int)ng;
    for (int k = (int)threadIdx.x; k < kNvTileCols * n; k += kNvThreads) {
        const int col = n == kFinishGroups ? k / kFinishGroups : k / n, q = k - col * n;
        const int64_t c = cb + col;
        if (c < I.cols) reinterpret_cast<uint2 *>(I.data[1] + (c * I.rows + g0 * MXS_NVFP4_BLOCK) / 2)[q] = sm[q][col];
    }
    __syncthreads(); /* before the next tile overwrites sm */
}

/* Finish, one thread unit: one byte of a column-wise data plane, from the
 * stage (or the row-wise plane): dst nibble c*rows + r = src nibble r*cols + c. */
template <> __device__ void NvPhase<PH_FINISH>::unit(const NvHead &C, const NvItem *it, int64_t u) {
    const NvItem &I = it[nv_item_of(C, it, u, false)];
    const int64_t b = u - I.unit0, j = 2 * b;
    const uint8_t *src = I.stage ? I.stage : I.data[0];
    const uint8_t lo = mxs_nvfp4_get(src, mxs_nvfp4_data_index(I.rows, I.cols, MXS_ROWWISE, j % I.rows, j / I.rows));
    const uint8_t hi =
        j + 1 < I.n
            ? mxs_nvfp4_get(src, mxs_nvfp4_data_index(I.rows, I.cols, MXS_ROWWISE, (j + 1) % I.rows, (j + 1) / I.rows))
            : 0;
    I.data[1][b] = (uint8_t)(lo | (hi << 4));
}

/* One variant: finish reads no master. */
void nv_wb_launch_finish(unsigned grid, cudaStream_t stream, const NvChunk *C, const NvHead &h, const NvItem *it) {
    nv_wb_launch1<NvPhase<PH_FINISH>, kNvAnyDtype, kNvAnyDtype>(grid, stream, C, h, it);
}

} /* namespace mxs__cu */
