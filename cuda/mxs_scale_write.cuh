/* SPDX-License-Identifier: MIT */
/* cuda/mxs_scale_write.cuh - the writeback apply's scale writer: every byte
 * of a primary's scale plane from the reduced COMPACT exponents of the
 * packed buffer, padding 0x00 (the bytes of mxs_host_convert_scales).
 *
 * Three kinds of work unit, each a CTA writing a few KiB of the plane with
 * coalesced 16-byte stores:
 *
 *   SWZ_ROW   row-wise SWIZZLED: 128 rows x 64 blocks (16 swizzle tiles,
 *             8 KiB contiguous). Vector i of tile kt is the words (rows
 *             32 q + i, kt) for q = 0..3, so lane i of warp w reads 16 bytes
 *             (4 tiles' words) of each of its 4 rows and stores 4 vectors.
 *
 *      COMPACT rows (K bytes each)           SWIZZLED tile (mt, kt): 512 B
 *      row 128mt+i     |w0|w1|w2|w3|...       vector i = [row i | row 32+i |
 *      row 128mt+32+i  |w0|w1|w2|w3|...                   row 64+i | row 96+i]
 *      ...            (w = 4 blocks)                       (word kt of each)
 *
 *   SWZ_COL   column-wise SWIZZLED: 8 consecutive tiles of the plane (each
 *             128 columns x 4 groups). Each tile's 4 COMPACT group rows are
 *             read as 4-byte words, parked as bytes in shared memory; vector
 *             i of a tile gathers bytes (group j, column 32 q + i).
 *   LINEAR    COMPACT, PADDED (or SWIZZLED at a destination off the
 *             16-byte grid): 16 KiB of the plane, 16-byte vectors on the
 *             address grid (COMPACT: a copy; PADDED: the row / group is a
 *             contiguous COMPACT row plus zero padding; SWIZZLED: entry by
 *             entry), the ends byte by byte.
 *
 * (It replaced the per-vector gather of mxs_scales.cuh in the apply: 16
 * one-byte loads per 16-byte vector from 16 different rows ran the
 * SWIZZLED planes of a Megatron-size bucket at ~7 % of DRAM bandwidth.) */
#ifndef MXSHARD_CUDA_SCALE_WRITE_CUH
#define MXSHARD_CUDA_SCALE_WRITE_CUH

#include "mxs_scales.cuh"

namespace mxs__cu {

enum { SCALES_LINEAR = 0, SCALES_SWZ_ROW = 1, SCALES_SWZ_COL = 2 };
constexpr int64_t kScaleChunk = 4096;   /* LINEAR: plane bytes per unit */
constexpr int kSwzTilesPerUnit = 8;     /* SWZ_COL: swizzle tiles (512 B) per unit, in plane order */
constexpr int kSwzRowTilesPerUnit = 16; /* SWZ_ROW: swizzle tiles per unit (8 KiB) */

/* One plane's apply scale work (host-made by scale_write_make). */
struct ScaleWrite {
    uint8_t *dst;
    const uint8_t *src; /* the item's COMPACT plane in the packed buffer */
    mxs_scale_geom gd, gs;
    int kind;
    int64_t units;
    int64_t upr; /* SWZ_ROW: units per tile row (of 128 rows) */
};

/* The work of writing plane (dst, gd) from src (COMPACT, gs). */
inline ScaleWrite scale_write_make(uint8_t *dst, const uint8_t *src, const mxs_scale_geom &gd,
                                   const mxs_scale_geom &gs) {
    ScaleWrite w;
    memset(&w, 0, sizeof w);
    w.dst = dst;
    w.src = src;
    w.gd = gd;
    w.gs = gs;
    const bool aligned16 = (reinterpret_cast<uintptr_t>(dst) & 15u) == 0;
    if (gd.layout == MXS_SCALES_SWIZZLED && aligned16) {
        if (gd.colwise) {
            /* units of 8 consecutive tiles of the plane, whatever its shape
             * (a 41-row weight has one tile per column tile) */
            w.kind = SCALES_SWZ_COL;
            w.units = mxs_ceil_div((gd.Mp / 128) * (gd.Kp / 4), kSwzTilesPerUnit);
        } else {
            w.kind = SCALES_SWZ_ROW;
            w.upr = mxs_ceil_div(gd.Kp / 4, kSwzRowTilesPerUnit);
            w.units = (gd.Mp / 128) * w.upr;
        }
    } else {
        w.kind = SCALES_LINEAR;
        w.units = mxs_ceil_div(mxs_scale_geom_bytes(&gd), kScaleChunk);
    }
    return w;
}

/* LINEAR: plane bytes [s, e) (e - s <= kScaleChunk). */
__device__ __forceinline__ void scale_write_range(const ScaleWrite &w, int64_t s, int64_t e) {
    const int64_t mis = (int64_t)(reinterpret_cast<uintptr_t>(w.dst) & 15u);
    const int64_t base = ((s + mis) & ~(int64_t)15) - mis; /* first vector on the address grid */
    const bool copy = w.gd.layout == MXS_SCALES_COMPACT;
    for (int64_t off = base + (int64_t)threadIdx.x * 16; off < e; off += (int64_t)kThreads * 16) {
        if (off >= s && off + 16 <= e) {
            uint4 v;
            if (copy) {
                v = ld16_any(w.src + off);
            } else if (w.gd.layout == MXS_SCALES_PADDED) {
                v = padded_vec(w.gd, w.src, w.gs, off);
            } else { /* SWIZZLED at a destination off the 16-byte grid */
                uint32_t q[4];
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    q[k] = 0;
#pragma unroll
                    for (int j = 0; j < 4; j++)
                        q[k] |= (uint32_t)scale_byte(w.gd, w.src, w.gs, off + 4 * k + j) << (8 * j);
                }
                v = make_uint4(q[0], q[1], q[2], q[3]);
            }
            *reinterpret_cast<uint4 *>(w.dst + off) = v;
        } else {
            for (int j = 0; j < 16; j++)
                if (off + j >= s && off + j < e)
                    w.dst[off + j] = copy ? w.src[off + j] : scale_byte(w.gd, w.src, w.gs, off + j);
        }
    }
}

/* SWZ_ROW: tile row mt, tiles [16 blk, 16 blk + 16) (clipped at Kp / 4).
 * No shared memory: lane i of warp w reads, for q = 0..3, the 16 COMPACT
 * bytes of row 128 mt + 32 q + i at blocks 4 (16 blk + 4 w) .. +15 - the
 * words of 4 tiles - and so holds all four words of vector i of those 4
 * tiles: 4 loads then 4 stores per thread, 64 bytes each way in flight. */
__device__ __forceinline__ void scale_write_swz_row(const ScaleWrite &w, int64_t mt, int64_t blk) {
    const int tid = threadIdx.x, i = tid % 32, wq = tid / 32;
    const int64_t K = w.gs.K, ktiles = w.gd.Kp / 4;
    const int64_t kt0 = blk * kSwzRowTilesPerUnit + wq * 4, k0 = kt0 * 4; /* this thread's 4 tiles */
    if (kt0 >= ktiles) return;
    uint32_t wd[4][4]; /* [q][tile] */
#pragma unroll
    for (int q = 0; q < 4; q++) {
        const int64_t r = mt * 128 + q * 32 + i;
        const uint8_t *p = w.src + r * K + k0;
        const int64_t n = r < w.gs.M && k0 < K ? K - k0 : 0; /* bytes of the row from k0 */
        if (n >= 16 && (reinterpret_cast<uintptr_t>(p) & 15u) == 0) {
            const uint4 v = __ldg(reinterpret_cast<const uint4 *>(p));
            wd[q][0] = v.x, wd[q][1] = v.y, wd[q][2] = v.z, wd[q][3] = v.w;
        } else {
#pragma unroll
            for (int t = 0; t < 4; t++) {
                uint32_t word = 0;
#pragma unroll
                for (int j = 0; j < 4; j++) word |= (4 * t + j < n ? (uint32_t)__ldg(p + 4 * t + j) : 0u) << (8 * j);
                wd[q][t] = word;
            }
        }
    }
#pragma unroll
    for (int t = 0; t < 4; t++) {
        if (kt0 + t >= ktiles) break;
        /* = mxs_scale_geom_offset(&w.gd, 128 mt + i, 4 kt): vector i of tile
         * (mt, kt); written out, like the column writer's below (one run with
         * the offset function per vector in both writers measured 3-7 %
         * slower on the SWIZZLED rows, so the plane-order form stays) */
        *reinterpret_cast<uint4 *>(w.dst + (mt * ktiles + kt0 + t) * 512 + i * 16) =
            make_uint4(wd[0][t], wd[1][t], wd[2][t], wd[3][t]);
    }
}

/* SWZ_COL: the plane's tiles [8 u, 8 u + 8) in plane order (tile T is
 * column tile T / (Kp/4), groups 4 (T % (Kp/4)) .. +3). Thread t reads 4
 * bytes of each tile's source - group t / 32, columns 4 (t % 32) .. +3 of
 * the tile's 128 - and parks them in shared memory ([tile][group][column]
 * bytes); then each thread stores two vectors: vector i of a tile gathers
 * bytes (group j, column 32 q + i). */
__device__ __forceinline__ void scale_write_swz_col(const ScaleWrite &w, int64_t u, uint32_t *sw) {
    const int tid = threadIdx.x;
    const int64_t cols = w.gs.M, groups = w.gs.K, ktiles = w.gd.Kp / 4, ntiles = (w.gd.Mp / 128) * ktiles;
    uint32_t wd[kSwzTilesPerUnit];
#pragma unroll
    for (int tl = 0; tl < kSwzTilesPerUnit; tl++) {
        const int64_t T = u * kSwzTilesPerUnit + tl, ct = T / ktiles, kt = T - ct * ktiles;
        const int64_t g = kt * 4 + tid / 32, c = ct * 128 + (tid % 32) * 4;
        uint32_t word = 0;
        if (T < ntiles && g < groups && c < cols) {
            const uint8_t *p = w.src + g * cols + c;
            if (c + 4 <= cols && (reinterpret_cast<uintptr_t>(p) & 3u) == 0) {
                word = __ldg(reinterpret_cast<const uint32_t *>(p));
            } else {
                for (int j = 0; j < 4; j++) word |= (c + j < cols ? (uint32_t)__ldg(p + j) : 0u) << (8 * j);
            }
        }
        wd[tl] = word;
    }
    __syncthreads(); /* the previous unit of this CTA is done with sw */
#pragma unroll
    for (int tl = 0; tl < kSwzTilesPerUnit; tl++) sw[tl * kThreads + tid] = wd[tl];
    __syncthreads();
    const uint8_t *sb = reinterpret_cast<const uint8_t *>(sw);
#pragma unroll
    for (int h = 0; h < kSwzTilesPerUnit * 32 / kThreads; h++) {
        const int v = tid + h * kThreads, tl = v / 32, i = v % 32;
        const int64_t T = u * kSwzTilesPerUnit + tl;
        if (T >= ntiles) continue;
        uint32_t o[4];
#pragma unroll
        for (int q = 0; q < 4; q++) {
            uint32_t word = 0;
#pragma unroll
            for (int j = 0; j < 4; j++) word |= (uint32_t)sb[tl * 512 + j * 128 + 32 * q + i] << (8 * j);
            o[q] = word;
        }
        /* = mxs_scale_geom_offset(&w.gd, 128 ct + i, 4 kt) for T = ct * Kp/4 + kt:
         * the tiles are stored in plane order */
        *reinterpret_cast<uint4 *>(w.dst + T * 512 + i * 16) = make_uint4(o[0], o[1], o[2], o[3]);
    }
    __syncthreads(); /* sw is free for the CTA's next unit */
}

/* Unit u of the plane's work; sw: kThreads * 9 words of shared memory. */
__device__ __forceinline__ void scale_write_unit(const ScaleWrite &w, int64_t u, uint32_t *sw) {
    if (w.kind == SCALES_SWZ_ROW) {
        const int64_t mt = u / w.upr;
        scale_write_swz_row(w, mt, u - mt * w.upr);
    } else if (w.kind == SCALES_SWZ_COL) {
        scale_write_swz_col(w, u, sw);
    } else {
        const int64_t bytes = mxs_scale_geom_bytes(&w.gd), s = u * kScaleChunk;
        scale_write_range(w, s, s + kScaleChunk < bytes ? s + kScaleChunk : bytes);
    }
}

} /* namespace mxs__cu */

#endif /* MXSHARD_CUDA_SCALE_WRITE_CUH */
