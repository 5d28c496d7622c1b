/* SPDX-License-Identifier: MIT */
/* cuda/mxs_nvfp4_wb_apply.cu - the NVFP4 writeback's apply phase on the
 * GPU: from the reduced packed buffer, every scale byte of every present
 * plane, the global amax, and the shard's nibbles of the row-wise plane and
 * of the column stage (or of their fragments).
 *
 *   warp tile   the multipliers come from the reduced entries once per
 *               block (a 1x16 row block's lane pair computes alternate rows
 *               and swaps them by __shfl_xor), then each row is loaded,
 *               multiplied and converted once per plane: 8 nibbles, one
 *               32-bit store
 *   thread unit 16 stored scale entries (m, k0 .. k0+15) of a plane - 4
 *               words of 4 consecutive bytes in COMPACT, PADDED and
 *               SWIZZLED, a 32-bit store each - or, on items off the tile
 *               path, one data byte
 *
 * S_enc comes from the item's reduced tensor-amax entry (contract section
 * 9.8), so apply needs no amax pass. The kernel reads the group status byte
 * first and writes nothing when it is set. Launched by
 * mxs_nvfp4_writeback.cu (nv_wb_launch_apply).
 */
#include "mxs_nvfp4_wb.cuh"

namespace mxs__cu {
/* Element multiplier of the block whose reduced entry is i. */
static __device__ __forceinline__ float nv_mult(const NvHead &C, int64_t i, float s_enc) {
    return mxs__nvfp4_wb_mult(C.packed, C.w, i, s_enc);
}

/* The one store of apply's nibbles: bytes q of plane nibbles f .. f+7
 * (f % 8 == 0) into output d - the plane, or a fragment (frag: plane byte
 * b is fragment byte b - start/2, an integer offset, used only inside the
 * shard; start is even) - for the shard [start, start + len): one 32-bit
 * store when all 8 are inside it (and st4: the output's plane byte 0 is
 * 4-byte aligned, hence this address), else the bytes inside it (shard
 * boundaries are even: a byte is wholly inside or out). A group wholly
 * inside the shard passes its row's output byte as d and f = start = 0,
 * len = 8. start and len by reference: read from the item as the stores go
 * (the machine code of the two helpers this one replaced, issue 36). */
static __device__ __forceinline__ void nv_put8(uint8_t *d, bool frag, bool st4, int64_t f, uint32_t q,
                                               const int64_t &start, const int64_t &len) {
    const int64_t end = start + len, o = (f - (frag ? start : 0)) / 2;
    if (st4 && f >= start && f + 8 <= end) {
        *reinterpret_cast<uint32_t *>(d + o) = q;
        return;
    }
#pragma unroll
    for (int p = 0; p < 4; p++)
        if (f + 2 * p >= start && f + 2 * p < end) d[o + p] = (uint8_t)(q >> (8 * p));
}

/* The rows of apply's warp tile (NvPhase<PH_APPLY>::tile) in a group that
 * a shard edge cuts: rows outside the shard skipped, element-wise loads and
 * byte stores where 8 nibbles straddle the edge. Rows go in pairs: the lane
 * pair of a 1x16 row block computes one multiplier each (lane 2p row i,
 * lane 2p+1 row i+1) and swaps them by __shfl_xor. */
template <int DT, int RT>
static __device__ __forceinline__ void nv_apply_rows(const NvHead &C, const NvItem &I, int64_t c0, int64_t r0,
                                                     int64_t r1, float s_enc, const float *ec, float et) {
    const int lane = (int)(threadIdx.x & 31u);
    const int64_t end = I.start + I.len, k = c0 / MXS_NVFP4_BLOCK;
    /* the pair's block exists even when only the even lane has columns (cols % 16 == 8) */
    const bool active = c0 < I.cols, block = k * MXS_NVFP4_BLOCK < I.cols;
    const bool do_row = I.data[0] != nullptr, do_stage = I.stage != nullptr;
#pragma unroll 1
    for (int64_t ri = r0; ri < r1; ri += 2) {
        float mine = et;
        if (!I.two_d && do_row && block) {
            const int64_t r = ri + (lane & 1);
            mine = r < r1 ? nv_mult(C, NV_ROW_ENTRY(I, r, k), s_enc) : 0.0f;
        }
        const float other = __shfl_xor_sync(kFull, mine, 1);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int64_t r = ri + h, f = r * I.cols + c0;
            if (r >= r1 || !active || f + 8 <= I.start || f >= end) continue;
            const float er = I.two_d ? et : ((lane & 1) == h ? mine : other);
            float x[8], e[8];
            nv_load8<DT, RT>(C, I, f, x);
            if (do_row) {
#pragma unroll
                for (int j = 0; j < 8; j++) e[j] = er;
                nv_put8(I.data[0], I.out & kOutRowFrag, I.out & kOutRowSt4, f, nv_cast8(x, e), I.start, I.len);
            }
            if (do_stage) {
#pragma unroll
                for (int j = 0; j < 8; j++) e[j] = I.two_d ? er : ec[j];
                nv_put8(I.stage, I.out & kOutStageFrag, I.out & kOutStageSt4, f, nv_cast8(x, e), I.start, I.len);
            }
        }
    }
}

/* The rows of a warp tile whose group lies wholly inside the shard (all
 * but at most two groups of a shard): nv_apply_rows without the shard-edge
 * tests - one vector load per row, every 8 nibbles whole bytes inside the
 * shard - and with the addresses hoisted: the item's fields are read once,
 * and the master and output pointers advance by one row per step (cols
 * elements, cols / 2 bytes) instead of being recomputed from the flat index
 * (run 18: 9 % fewer instructions with both planes). The same multipliers,
 * conversions and stores. An inactive lane (c0 >= cols) forms its pointers
 * at column 0 and never uses them. */
template <int DT, int RT>
static __device__ __forceinline__ void nv_apply_whole(const NvHead &C, const NvItem &I, int64_t c0, int64_t r0,
                                                      int64_t r1, float s_enc, const float *ec, float et) {
    const int lane = (int)(threadIdx.x & 31u);
    const int dt = DT >= 0 ? DT : I.dtype, rt = DT >= 0 ? RT : nv_eff_rt(I.dtype, C.rt);
    const int64_t cols = I.cols, start = I.start, k = c0 / MXS_NVFP4_BLOCK;
    const bool active = c0 < cols, block = k * MXS_NVFP4_BLOCK < cols, two_d = I.two_d, mis = I.mis;
    const int out = I.out;
    const int64_t f0 = r0 * cols + (active ? c0 : 0), es = mxs_dtype_bytes((mxs_dtype)dt);
    const uint8_t *src = static_cast<const uint8_t *>(I.master) + (f0 - start) * es;
    uint8_t *drow = I.data[0] ? I.data[0] + (f0 - (out & kOutRowFrag ? start : 0)) / 2 : nullptr;
    uint8_t *dstg = I.stage ? I.stage + (f0 - (out & kOutStageFrag ? start : 0)) / 2 : nullptr;
    const bool row4 = out & kOutRowSt4, stg4 = out & kOutStageSt4;
    const int64_t sstep = cols * es, dstep = cols / 2; /* cols % 8 == 0 on the tile path */
    const int64_t e0 = I.row_entry;                    /* row r's 1x16 entry: e0 + block (r, k) of rg */
    const mxs_wb_region rg = nv_region(I, MXS_ROWWISE, MXS_NVFP4_1X16);
#pragma unroll 1
    for (int64_t ri = r0; ri < r1; ri += 2) {
        float mine = et;
        if (!two_d && drow && block) {
            const int64_t r = ri + (lane & 1);
            mine = r < r1 ? nv_mult(C, e0 + mxs_wb_region_entry(&rg, r, k), s_enc) : 0.0f;
        }
        const float other = __shfl_xor_sync(kFull, mine, 1);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            if (ri + h >= r1 || !active) continue;
            const float er = two_d ? et : ((lane & 1) == h ? mine : other);
            float x[8], e[8];
            nv_vec8_load(src + h * sstep, dt, 0, rt, mis, x);
            if (drow) {
#pragma unroll
                for (int j = 0; j < 8; j++) e[j] = er;
                nv_put8(drow + h * dstep, false, row4, 0, nv_cast8(x, e), 0, 8);
            }
            if (dstg) {
#pragma unroll
                for (int j = 0; j < 8; j++) e[j] = two_d ? er : ec[j];
                nv_put8(dstg + h * dstep, false, stg4, 0, nv_cast8(x, e), 0, 8);
            }
        }
        src += 2 * sstep;
        if (drow) drow += 2 * dstep;
        if (dstg) dstg += 2 * dstep;
    }
}

/* Apply, one warp tile: the shard's nibbles of group g, columns c0 .. in the
 * row-wise plane and the stage; the column (16x1) or tile multipliers once,
 * then the rows (nv_apply_rows). */
template <>
template <int DT, int RT>
__device__ void NvPhase<PH_APPLY>::tile(const NvHead &C, const NvItem &I, int64_t t, uint2 (*)[kFinishPitch]) {
    const NvWarpTile w = nv_warp_tile(I, t);
    const int64_t g = w.g, c0 = w.c0, r0 = w.r0, r1 = w.r1;
    const int64_t k = c0 / MXS_NVFP4_BLOCK;
    const bool active = c0 < I.cols;
    const float s_enc = nv_s_enc(C, I);
    float ec[8], et = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; j++) ec[j] = 0.0f;
    if (I.two_d) {
        if (active) et = nv_mult(C, NV_TILE_ENTRY(I, g, k), s_enc);
    } else if (I.stage != nullptr && active) {
#pragma unroll
        for (int j = 0; j < 8; j++) ec[j] = nv_mult(C, NV_COL_ENTRY(I, g, c0 + j), s_enc);
    }
    if (I.start <= r0 * I.cols && r1 * I.cols <= I.start + I.len) /* warp-uniform */
        nv_apply_whole<DT, RT>(C, I, c0, r0, r1, s_enc, ec, et);
    else
        nv_apply_rows<DT, RT>(C, I, c0, r0, r1, s_enc, ec, et);
}

/* Row-wise (or tile) entry and column-wise (or tile) entry of element (r, c). */
static __device__ __forceinline__ int64_t nv_row_entry(const NvItem &I, int64_t r, int64_t c) {
    return I.two_d ? NV_TILE_ENTRY(I, r / MXS_NVFP4_BLOCK, c / MXS_NVFP4_BLOCK)
                   : NV_ROW_ENTRY(I, r, c / MXS_NVFP4_BLOCK);
}
static __device__ __forceinline__ int64_t nv_col_entry(const NvItem &I, int64_t r, int64_t c) {
    return I.two_d ? NV_TILE_ENTRY(I, r / MXS_NVFP4_BLOCK, c / MXS_NVFP4_BLOCK)
                   : NV_COL_ENTRY(I, r / MXS_NVFP4_BLOCK, c);
}

/* Scale entry (m, k) of plane p: its block's packed entry index. */
static __device__ __forceinline__ int64_t nv_scale_entry(const NvItem &I, int p, int64_t m, int64_t k) {
    if (I.two_d) {
        int64_t R, Cc;
        mxs_nvfp4_entry_tile((mxs_dirs)(p + 1), m, k, &R, &Cc);
        return NV_TILE_ENTRY(I, R, Cc);
    }
    /* stored row m of the column-wise plane is column m: block (g, c) = (k, m) */
    return p == 0 ? NV_ROW_ENTRY(I, m, k) : NV_COL_ENTRY(I, k, m);
}

/* Scale unit q of plane p: row m of the stored grid and its first entry
 * k0 = kNvScaleUnit * (q % kq) (units run row by row, kq to a stored row).
 * One 32-bit division when q and kq fit 32 bits, else the 64-bit one: the
 * same quotient. */
static __device__ __forceinline__ void nv_scale_unit_at(int64_t q, int64_t kq, int64_t *m, int64_t *k0) {
    if ((((uint64_t)q | (uint64_t)kq) >> 32) == 0) {
        const uint32_t a = (uint32_t)q, b = (uint32_t)kq, d = a / b;
        *m = d;
        *k0 = kNvScaleUnit * (int64_t)(a - d * b);
    } else {
        *m = q / kq;
        *k0 = kNvScaleUnit * (q % kq);
    }
}

/* Stored entries (m, k0 .. k0+nb-1), nb <= 4, of plane p: one word - in
 * every NVFP4 layout 4 consecutive bytes (COMPACT m*K + k, PADDED m*Kp + k,
 * SWIZZLED k % 4 innermost) - one 32-bit store when whole and aligned;
 * padding entries 0x00. When all 4 are logical they are 4 consecutive
 * packed entries (a stored row's entries run contiguous in k in every plane
 * but the column-wise one of 16x16 tiles: nv_scale_entry's k term is + k),
 * read without per-entry tests. */
static __device__ __forceinline__ void nv_scale_word(const NvHead &C, const NvItem &I, int p, int64_t m, int64_t k0,
                                                     int nb, float s_enc) {
    const mxs_scale_geom &G = I.geom[p];
    uint8_t *d = I.scale[p] + mxs_scale_geom_offset(&G, m, k0);
    uint32_t v = 0;
    if (m < G.M && k0 + 4 <= G.K && (p == 0 || !I.two_d)) { /* nb == 4, all logical, contiguous */
        const int64_t i0 = nv_scale_entry(I, p, m, k0);
#pragma unroll
        for (int b = 0; b < 4; b++) v |= (uint32_t)mxs__nvfp4_wb_scale(C.packed, C.w, i0 + b, s_enc) << (8 * b);
    } else {
        for (int b = 0; b < nb; b++)
            if (mxs_scale_geom_is_logical(&G, m, k0 + b))
                v |= (uint32_t)mxs__nvfp4_wb_scale(C.packed, C.w, nv_scale_entry(I, p, m, k0 + b), s_enc) << (8 * b);
    }
    if (nb == 4 && (reinterpret_cast<uintptr_t>(d) & 3u) == 0) {
        *reinterpret_cast<uint32_t *>(d) = v;
    } else {
        for (int b = 0; b < nb; b++) d[b] = (uint8_t)(v >> (8 * b));
    }
}

/* Apply, one thread unit: the stored entries (m, k0 .. k0+15) of a plane,
 * as up to 4 words (nv_scale_word). The units run over the stored grid
 * (COMPACT M x K, else Mp x Kp), so every byte of the plane is written
 * once. Or (items off the tile path) a data byte of the shard (row-wise
 * plane and stage). Unit 0 of an item also stores its global amax. */
template <> __device__ void NvPhase<PH_APPLY>::unit(const NvHead &C, const NvItem *it, int64_t u) {
    const NvItem &I = it[nv_item_of(C, it, u, false)];
    const float s_enc = nv_s_enc(C, I);
    int64_t e = u - I.unit0;
    if (e == 0) *I.amax = mxs__nvfp4_entry_value(C.packed, C.w, I.amax_entry);
    if (e < I.sunits[0] + I.sunits[1]) {
        const int p = e < I.sunits[0] ? 0 : 1;
        const int64_t kdim = nv_scale_kdim(I.geom[p]);
        int64_t m, k0;
        nv_scale_unit_at(p == 0 ? e : e - I.sunits[0], mxs_ceil_div(kdim, kNvScaleUnit), &m, &k0);
#pragma unroll 1
        for (int64_t k = k0; k < k0 + kNvScaleUnit && k < kdim; k += 4)
            nv_scale_word(C, I, p, m, k, kdim - k < 4 ? (int)(kdim - k) : 4, s_enc);
        return;
    }
    e -= I.sunits[0] + I.sunits[1]; /* a data byte: nibbles 2b, 2b+1 */
    const int64_t b = I.start / 2 + e, j = 2 * b;
    float x[2] = {0.0f, 0.0f}, er[2] = {0.0f, 0.0f}, ec[2] = {0.0f, 0.0f};
    const int both = j + 1 < I.n; /* else the spare nibble (0) */
    for (int h = 0; h <= both; h++) {
        const int64_t f = j + h, r = f / I.cols, c = f % I.cols;
        x[h] = nv_master(C, I, f);
        if (I.data[0] || I.two_d) er[h] = nv_mult(C, nv_row_entry(I, r, c), s_enc);
        if (I.stage) ec[h] = I.two_d ? er[h] : nv_mult(C, nv_col_entry(I, r, c), s_enc);
    }
    if (I.data[0]) /* plane byte b: fragment byte b - start/2 */
        I.data[0][b - (I.out & kOutRowFrag ? I.start / 2 : 0)] =
            both ? mxs_e2m1x2_from_f32(x[0] * er[0], x[1] * er[1])
                 : (uint8_t)(mxs_nvfp4_quantize_elem(x[0], er[0]) & 0xFu);
    if (I.stage)
        I.stage[b - (I.out & kOutStageFrag ? I.start / 2 : 0)] =
            both ? mxs_e2m1x2_from_f32(x[0] * ec[0], x[1] * ec[1])
                 : (uint8_t)(mxs_nvfp4_quantize_elem(x[0], ec[0]) & 0xFu);
}

void nv_wb_launch_apply(int spec, unsigned grid, cudaStream_t stream, const NvChunk *C, const NvHead &h,
                        const NvItem *it) {
    nv_wb_launch_spec<NvPhase<PH_APPLY>>(spec, grid, stream, C, h, it);
}

} /* namespace mxs__cu */
