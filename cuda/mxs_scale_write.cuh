/* SPDX-License-Identifier: MIT */
/* cuda/mxs_scale_write.cuh - the writeback apply's scale writer: every byte
 * of a primary's scale plane that the FUSED partial does not own
 * (mxs__owned_outer / mxs__owned_bytes, geometry.h; STRICT: the whole
 * plane), from the reduced COMPACT exponents of the packed buffer, padding
 * 0x00 - the bytes of mxs__wb_host_scales(owned = 0).
 *
 * Three kinds of work unit, each a CTA writing up to 4 KiB of the plane with
 * coalesced 16-byte stores:
 *
 *   SWZ_ROW   row-wise SWIZZLED: 128 rows x 32 blocks (8 swizzle tiles,
 *             4 KiB contiguous). Thread t reads row 128 mt + t's 32 COMPACT
 *             bytes (one sector), parks them in shared memory as 8 words,
 *             and each thread then stores two 16-byte vectors: vector i of
 *             tile kt is the words (rows 32 q + i, kt) for q = 0..3.
 *
 *      COMPACT rows (K bytes each)           SWIZZLED tile (mt, kt): 512 B
 *      row 128mt+0   |w0|w1|..|w7|            vector i = [row i | row 32+i |
 *      row 128mt+1   |w0|w1|..|w7|                         row 64+i | row 96+i]
 *      ...           (w = 4 blocks)                        (word kt of each)
 *
 *   SWZ_COL   column-wise SWIZZLED: 128 columns x 32 groups (8 tiles).
 *             The 32 COMPACT group rows (cols bytes each) are read as
 *             32-byte pieces, parked as bytes; vector i of tile kt gathers
 *             bytes (group 4 kt + j, column 32 q + i).
 *   LINEAR    COMPACT, PADDED (or a destination not 16-byte aligned): a
 *             4 KiB range of the plane, 16-byte vectors on the address grid
 *             (COMPACT: a copy; PADDED: the row / group is a contiguous
 *             COMPACT row plus zero padding), the ends byte by byte.
 *
 * Owned bytes are skipped by the unit numbering (whole tile rows, whole
 * tiles) or by the range bounds (LINEAR), never written. */
#ifndef MXSHARD_CUDA_SCALE_WRITE_CUH
#define MXSHARD_CUDA_SCALE_WRITE_CUH

#include "mxs_scales.cuh"

namespace mxs__cu {

enum { SCALES_LINEAR = 0, SCALES_SWZ_ROW = 1, SCALES_SWZ_COL = 2 };
constexpr int64_t kScaleChunk = 4096; /* LINEAR: plane bytes per unit */
constexpr int kSwzTilesPerUnit = 8;   /* SWZ_*: swizzle tiles (512 B) per unit */

/* One plane's apply scale work (host-made by scale_write_make). */
struct ScaleWrite {
    uint8_t *dst;
    const uint8_t *src; /* the item's COMPACT plane in the packed buffer */
    mxs_scale_geom gd, gs;
    mxs__owned_span own;
    int kind;
    int64_t units;
    int64_t upr;    /* units per repetition (LINEAR) / tile row (SWZ_ROW) / column tile (SWZ_COL) */
    int64_t ua, ub; /* LINEAR: units of the first segment; SWZ_COL: blocks [0, ua) and [ub, nblk) */
    int64_t ta, tb; /* SWZ_ROW: owned tile rows [ta, tb); SWZ_COL: owned tiles (groups / 4) [ta, tb) */
};

/* The work of writing plane (dst, gd) from src (COMPACT, gs) outside `own`. */
inline ScaleWrite scale_write_make(uint8_t *dst, const uint8_t *src, const mxs_scale_geom &gd,
                                   const mxs_scale_geom &gs, mxs__owned_span own) {
    ScaleWrite w;
    memset(&w, 0, sizeof w);
    w.dst = dst;
    w.src = src;
    w.gd = gd;
    w.gs = gs;
    w.own = own;
    const bool aligned16 = (reinterpret_cast<uintptr_t>(dst) & 15u) == 0;
    const int64_t nblk = mxs_ceil_div(gd.Kp / 4, kSwzTilesPerUnit); /* units across one tile row / column tile */
    if (gd.layout == MXS_SCALES_SWIZZLED && aligned16 && !gd.colwise) {
        w.kind = SCALES_SWZ_ROW;
        w.upr = nblk;
        w.ta = own.begin / (128 * gd.Kp);
        w.tb = own.end / (128 * gd.Kp);
        w.units = (gd.Mp / 128 - (w.tb - w.ta)) * nblk;
    } else if (gd.layout == MXS_SCALES_SWIZZLED && aligned16) {
        w.kind = SCALES_SWZ_COL;
        w.ta = own.begin / 512;
        w.tb = own.end / 512;
        const int64_t na = mxs_ceil_div(w.ta, kSwzTilesPerUnit), nb = w.tb / kSwzTilesPerUnit;
        /* blocks [0, na) and [nb, nblk) hold every tile outside [ta, tb) */
        if (w.tb > w.ta && nb >= na) {
            w.ua = na;
            w.ub = nb;
            w.upr = na + (nblk - nb);
        } else {
            w.ua = nblk;
            w.ub = nblk;
            w.upr = nblk;
        }
        w.units = (gd.Mp / 128) * w.upr;
    } else {
        w.kind = SCALES_LINEAR;
        w.ua = mxs_ceil_div(own.begin, kScaleChunk);
        w.upr = w.ua + mxs_ceil_div(own.stride - own.end, kScaleChunk);
        w.units = own.reps * w.upr;
    }
    return w;
}

/* 16 bytes of the PADDED plane gd at offset off (a row / group: gd's padded
 * width of bytes, the COMPACT row of gs's width, then zeros; rows past the
 * logical ones all zero), off % 16 == 0 on the address grid. */
__device__ __forceinline__ uint4 padded_vec(const mxs_scale_geom &gd, const uint8_t *src, const mxs_scale_geom &gs,
                                            int64_t off) {
    const int64_t W = gd.colwise ? gd.Mp : gd.Kp, Ws = gd.colwise ? gs.M : gs.K, R = gd.colwise ? gs.K : gs.M;
    uint32_t w[4];
#pragma unroll
    for (int q = 0; q < 4; q++) {
        uint32_t word = 0;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int64_t o = off + 4 * q + j, r = o / W, x = o - r * W;
            word |= (r < R && x < Ws ? (uint32_t)src[r * Ws + x] : 0u) << (8 * j);
        }
        w[q] = word;
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

/* LINEAR: plane bytes [s, e) (e - s <= kScaleChunk). */
__device__ __forceinline__ void scale_write_range(const ScaleWrite &w, int64_t s, int64_t e) {
    const int64_t mis = (int64_t)(reinterpret_cast<uintptr_t>(w.dst) & 15u);
    const int64_t base = ((s + mis) & ~(int64_t)15) - mis; /* first vector on the address grid */
    const bool copy = w.gd.layout == MXS_SCALES_COMPACT;
    for (int64_t off = base + (int64_t)threadIdx.x * 16; off < e; off += (int64_t)kThreads * 16) {
        if (off >= s && off + 16 <= e) {
            const uint4 v = copy ? ld16_any(w.src + off) : padded_vec(w.gd, w.src, w.gs, off);
            *reinterpret_cast<uint4 *>(w.dst + off) = v;
        } else {
            for (int j = 0; j < 16; j++)
                if (off + j >= s && off + j < e) w.dst[off + j] = copy ? w.src[off + j] : scale_byte(w.gd, w.src, w.gs, off + j);
        }
    }
}

/* 32 bytes of a COMPACT row at p (n of them exist, the rest read as 0) as
 * 8 little-endian words. */
__device__ __forceinline__ void ld32_row(const uint8_t *p, int64_t n, uint32_t *wd) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    if (n >= 32 && (a & 15u) == 0) {
        const uint4 v0 = __ldg(reinterpret_cast<const uint4 *>(p)), v1 = __ldg(reinterpret_cast<const uint4 *>(p) + 1);
        wd[0] = v0.x, wd[1] = v0.y, wd[2] = v0.z, wd[3] = v0.w, wd[4] = v1.x, wd[5] = v1.y, wd[6] = v1.z, wd[7] = v1.w;
    } else if (n >= 32 && (a & 3u) == 0) {
#pragma unroll
        for (int q = 0; q < 8; q++) wd[q] = __ldg(reinterpret_cast<const uint32_t *>(p) + q);
    } else {
#pragma unroll
        for (int q = 0; q < 8; q++) {
            uint32_t word = 0;
#pragma unroll
            for (int j = 0; j < 4; j++) word |= (4 * q + j < n ? (uint32_t)__ldg(p + 4 * q + j) : 0u) << (8 * j);
            wd[q] = word;
        }
    }
}

/* SWZ_ROW: tile row mt, tiles [8 blk, 8 blk + 8) (clipped at Kp / 4). */
__device__ __forceinline__ void scale_write_swz_row(const ScaleWrite &w, int64_t mt, int64_t blk, uint32_t *sw) {
    const int tid = threadIdx.x;
    const int64_t K = w.gs.K, ktiles = w.gd.Kp / 4, k0 = blk * kSwzTilesPerUnit * 4;
    const int64_t r = mt * 128 + tid;
    uint32_t wd[8];
    if (r < w.gs.M && k0 < K) {
        ld32_row(w.src + r * K + k0, K - k0, wd);
    } else {
#pragma unroll
        for (int q = 0; q < 8; q++) wd[q] = 0u;
    }
    __syncthreads(); /* the previous unit of this CTA is done with sw */
#pragma unroll
    for (int q = 0; q < 8; q++) sw[tid * 9 + q] = wd[q];
    __syncthreads();
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int v = tid + h * kThreads, kl = v / 32, i = v % 32;
        const int64_t kt = blk * kSwzTilesPerUnit + kl;
        if (kt >= ktiles) continue;
        const uint4 out = make_uint4(sw[i * 9 + kl], sw[(32 + i) * 9 + kl], sw[(64 + i) * 9 + kl], sw[(96 + i) * 9 + kl]);
        *reinterpret_cast<uint4 *>(w.dst + (mt * ktiles + kt) * 512 + i * 16) = out;
    }
    __syncthreads(); /* sw is free for the CTA's next unit */
}

/* SWZ_COL: column tile ct, tiles [8 blk, 8 blk + 8) but the owned ones. */
__device__ __forceinline__ void scale_write_swz_col(const ScaleWrite &w, int64_t ct, int64_t blk, uint32_t *sw) {
    const int tid = threadIdx.x;
    const int64_t cols = w.gs.M, groups = w.gs.K, ktiles = w.gd.Kp / 4;
    const int64_t gl = tid / 4, g = blk * kSwzTilesPerUnit * 4 + gl, c0 = ct * 128 + (tid % 4) * 32;
    uint32_t wd[8];
    if (g < groups && c0 < cols) {
        ld32_row(w.src + g * cols + c0, cols - c0, wd);
    } else {
#pragma unroll
        for (int q = 0; q < 8; q++) wd[q] = 0u;
    }
    __syncthreads();
    /* bytes [group gl][column 0..127] at sw word gl * 33 + column / 4 */
#pragma unroll
    for (int q = 0; q < 8; q++) sw[gl * 33 + (tid % 4) * 8 + q] = wd[q];
    __syncthreads();
    const uint8_t *sb = reinterpret_cast<const uint8_t *>(sw);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int v = tid + h * kThreads, kl = v / 32, i = v % 32;
        const int64_t kt = blk * kSwzTilesPerUnit + kl;
        if (kt >= ktiles || (kt >= w.ta && kt < w.tb)) continue;
        uint32_t o[4];
#pragma unroll
        for (int q = 0; q < 4; q++) {
            uint32_t word = 0;
#pragma unroll
            for (int j = 0; j < 4; j++) word |= (uint32_t)sb[(4 * kl + j) * 132 + 32 * q + i] << (8 * j);
            o[q] = word;
        }
        *reinterpret_cast<uint4 *>(w.dst + (ct * ktiles + kt) * 512 + i * 16) = make_uint4(o[0], o[1], o[2], o[3]);
    }
    __syncthreads(); /* sw is free for the CTA's next unit */
}

/* Unit u of the plane's work; sw: kThreads * 9 words of shared memory. */
__device__ __forceinline__ void scale_write_unit(const ScaleWrite &w, int64_t u, uint32_t *sw) {
    if (w.kind == SCALES_SWZ_ROW) {
        const int64_t j = u / w.upr, blk = u - j * w.upr;
        scale_write_swz_row(w, j < w.ta ? j : j + (w.tb - w.ta), blk, sw);
    } else if (w.kind == SCALES_SWZ_COL) {
        const int64_t ct = u / w.upr, x = u - ct * w.upr;
        scale_write_swz_col(w, ct, x < w.ua ? x : x - w.ua + w.ub, sw);
    } else {
        const int64_t rep = u / w.upr, x = u - rep * w.upr, base = rep * w.own.stride;
        int64_t s, e;
        if (x < w.ua) {
            s = base + x * kScaleChunk;
            e = base + w.own.begin;
        } else {
            s = base + w.own.end + (x - w.ua) * kScaleChunk;
            e = base + w.own.stride;
        }
        e = s + kScaleChunk < e ? s + kScaleChunk : e;
        scale_write_range(w, s, e);
    }
}

} /* namespace mxs__cu */

#endif /* MXSHARD_CUDA_SCALE_WRITE_CUH */
