/* SPDX-License-Identifier: MIT */
/* cuda/mxs_nvfp4_wb_partial.cu - the NVFP4 writeback's partial phase on
 * the GPU: every block entry and tensor-amax entry of this rank's shard into
 * the packed buffer (the memset before the launch zeroed every entry).
 *
 *   warp tile   per row, each lane's amax of its 8 elements, the pair's 1x16
 *               block amax by one __shfl_xor; per lane running maxima of
 *               its 8 columns over the 16 rows (16x1 blocks; 16x16: then the
 *               pair); the item's tensor-amax entry raised by one atomic MAX
 *               per warp
 *   thread unit one block entry of an item off the tile path (cols % 8 != 0)
 *
 * A partial entry is the maxNum of |x| over the shard's elements of its
 * block (0 when there are none), which is what the host's raise-by-segments
 * leaves. Launched by mxs_nvfp4_writeback.cu (nv_wb_launch_partial).
 */
#include "mxs_nvfp4_wb.cuh"

namespace mxs__cu {

static __device__ __forceinline__ void nv_put(const NvHead &C, int64_t i, float a) {
    const uint32_t v = mxs_nvfp4_amax_entry(a, C.w);
    if (C.w == 2)
        static_cast<uint16_t *>(C.packed)[i] = (uint16_t)v;
    else
        static_cast<uint32_t *>(C.packed)[i] = v;
}

/* entry i = max(entry i, entry of a), atomically (the tensor-amax entries,
 * raised by many warps; zeroed by the memset before the launch): atomicMax
 * on 4-byte entries, a 16-bit CAS loop on 2-byte ones (compute capability
 * 7.0+), so no byte outside the entry is touched. Reads first: once the max
 * is there, a warp leaves after one load. */
static __device__ void nv_raise_atomic(const NvHead &C, int64_t i, float a) {
    const uint32_t v = mxs_nvfp4_amax_entry(a, C.w);
    if (C.w == 4) {
        unsigned *p = static_cast<unsigned *>(C.packed) + i;
        if (__ldcg(p) < v) atomicMax(p, v);
        return;
    }
    unsigned short *p = static_cast<unsigned short *>(C.packed) + i;
    unsigned short old = __ldcg(p);
    while (old < v) {
        const unsigned short seen = atomicCAS(p, old, (unsigned short)v);
        if (seen == old) break;
        old = seen;
    }
}

/* Partial, one row of a warp tile: its 8 elements x into the running
 * column maxima cm and the tile maximum tm, and (rowb) the pair's 1x16 row
 * entry. Every lane of the warp calls it (__shfl_xor). */
static __device__ __forceinline__ void nv_partial_row(const NvHead &C, const NvItem &I, int64_t r, int64_t c0, int lane,
                                                      bool active, bool rowb, const float *x, float *cm, float &tm) {
    float a = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        a = mxs_amax_step(a, x[j]);
        cm[j] = mxs_amax_step(cm[j], x[j]);
    }
    tm = fmaxf(tm, a);
    if (rowb) {
        const float b = fmaxf(a, __shfl_xor_sync(kFull, a, 1));
        if (active && !(lane & 1) && b > 0.0f) nv_put(C, NV_ROW_ENTRY(I, r, c0 / MXS_NVFP4_BLOCK), b);
    }
}

/* Partial, one warp tile: the block entries of group g, columns c0 .. A
 * group wholly inside the shard (all but at most two per shard) loads two
 * rows per step, unrolled twice: four rows' vector loads in flight per lane
 * before the first is used (one row per step left the loads' latency
 * exposed: long-scoreboard stalls, run 13); a group a shard edge cuts goes
 * row by row with element masks. */
template <>
template <int DT, int RT>
__device__ void NvPhase<PH_PARTIAL>::tile(const NvHead &C, const NvItem &I, int64_t t, uint2 (*)[kFinishPitch]) {
    const int lane = (int)(threadIdx.x & 31u);
    const NvWarpTile w = nv_warp_tile(I, t);
    const int64_t g = w.g, c0 = w.c0, r0 = w.r0, r1 = w.r1;
    const int64_t end = I.start + I.len;
    const bool active = c0 < I.cols, rowb = I.row_entry >= 0, colb = I.col_entry >= 0;
    float cm[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f}, tm = 0.0f;
    if (I.start <= r0 * I.cols && r1 * I.cols <= end) { /* warp-uniform */
#pragma unroll 2
        for (int64_t r = r0; r < r1; r += 2) {
            const bool two = r + 1 < r1; /* warp-uniform; false only for an odd last group */
            float x0[8], x1[8];
#pragma unroll
            for (int j = 0; j < 8; j++) x0[j] = x1[j] = 0.0f;
            if (active) {
                nv_vec8<DT, RT>(C, I, r * I.cols + c0, x0);
                if (two) nv_vec8<DT, RT>(C, I, (r + 1) * I.cols + c0, x1);
            }
            nv_partial_row(C, I, r, c0, lane, active, rowb, x0, cm, tm);
            if (two) nv_partial_row(C, I, r + 1, c0, lane, active, rowb, x1, cm, tm);
        }
    } else {
#pragma unroll 4
        for (int64_t r = r0; r < r1; r++) {
            if ((r + 1) * I.cols <= I.start || r * I.cols >= end) continue; /* warp-uniform */
            float x[8];
            if (active)
                nv_load8<DT, RT>(C, I, r * I.cols + c0, x);
            else
#pragma unroll
                for (int j = 0; j < 8; j++) x[j] = 0.0f;
            nv_partial_row(C, I, r, c0, lane, active, rowb, x, cm, tm);
        }
    }
    if (I.two_d) {
        const float b = fmaxf(tm, __shfl_xor_sync(kFull, tm, 1));
        if (active && !(lane & 1) && b > 0.0f) nv_put(C, NV_TILE_ENTRY(I, g, c0 / MXS_NVFP4_BLOCK), b);
    } else if (colb && active) {
#pragma unroll
        for (int j = 0; j < 8; j++)
            if (cm[j] > 0.0f) nv_put(C, NV_COL_ENTRY(I, g, c0 + j), cm[j]);
    }
    for (int o = 16; o > 0; o >>= 1) tm = fmaxf(tm, __shfl_xor_sync(kFull, tm, o));
    if (lane == 0 && tm > 0.0f) nv_raise_atomic(C, I.amax_entry, tm);
}

/* Amax of the shard's elements in row r, columns [c0, c1). */
static __device__ float nv_shard_row_amax(const NvHead &C, const NvItem &I, int64_t r, int64_t c0, int64_t c1) {
    int64_t f0 = r * I.cols + c0, f1 = r * I.cols + c1;
    const int64_t end = I.start + I.len;
    float a = 0.0f;
    f0 = f0 > I.start ? f0 : I.start;
    f1 = f1 < end ? f1 : end;
    for (int64_t f = f0; f < f1; f++) a = mxs_amax_step(a, nv_master(C, I, f));
    return a;
}

/* Partial, one thread unit: one block entry of an item off the tile path. */
template <> __device__ void NvPhase<PH_PARTIAL>::unit(const NvHead &C, const NvItem *it, int64_t u) {
    const NvItem &I = it[nv_item_of(C, it, u, false)];
    const int64_t e = u - I.unit0;
    float a = 0.0f;
    /* the item's regions in entry order (row-wise then column-wise, or the tiles): e's block */
    const mxs_wb_region rg = nv_region(I, MXS_ROWWISE, MXS_NVFP4_1X16);
    int64_t b, j;
    if (I.two_d) { /* tile (R, Cc) = (b, j) */
        const mxs_wb_region tg = nv_region(I, MXS_ROWWISE, MXS_NVFP4_16X16);
        mxs_wb_region_block(&tg, e, &b, &j);
        const int64_t r0 = b * MXS_NVFP4_BLOCK, c0 = j * MXS_NVFP4_BLOCK;
        const int64_t r1 = r0 + MXS_NVFP4_BLOCK < I.rows ? r0 + MXS_NVFP4_BLOCK : I.rows;
        const int64_t c1 = c0 + MXS_NVFP4_BLOCK < I.cols ? c0 + MXS_NVFP4_BLOCK : I.cols;
        for (int64_t r = r0; r < r1; r++) a = fmaxf(a, nv_shard_row_amax(C, I, r, c0, c1));
    } else if (I.row_entry >= 0 && e < rg.block_rows * rg.per_row) { /* row block (r, k) = (b, j) */
        mxs_wb_region_block(&rg, e, &b, &j);
        const int64_t c0 = j * MXS_NVFP4_BLOCK;
        a = nv_shard_row_amax(C, I, b, c0, c0 + MXS_NVFP4_BLOCK < I.cols ? c0 + MXS_NVFP4_BLOCK : I.cols);
    } else { /* column block (g, c) = (b, j): rows 16g.. of column c */
        const mxs_wb_region cg = nv_region(I, MXS_COLWISE, MXS_NVFP4_1X16);
        mxs_wb_region_block(&cg, I.row_entry >= 0 ? e - rg.block_rows * rg.per_row : e, &b, &j);
        const int64_t c = j, r0 = b * MXS_NVFP4_BLOCK;
        const int64_t r1 = r0 + MXS_NVFP4_BLOCK < I.rows ? r0 + MXS_NVFP4_BLOCK : I.rows;
        for (int64_t r = r0; r < r1; r++) {
            const int64_t f = r * I.cols + c;
            if (f >= I.start && f < I.start + I.len) a = mxs_amax_step(a, nv_master(C, I, f));
        }
    }
    if (a > 0.0f) {
        nv_put(C, I.first_entry + e, a);
        nv_raise_atomic(C, I.amax_entry, a);
    }
}

void nv_wb_launch_partial(int spec, unsigned grid, cudaStream_t stream, const NvChunk *C, const NvHead &h,
                          const NvItem *it) {
    nv_wb_launch_spec<NvPhase<PH_PARTIAL>>(spec, grid, stream, C, h, it);
}

} /* namespace mxs__cu */
