/* SPDX-License-Identifier: MIT */
/* cuda/mxs_scales.cuh - byte ranges in 16-byte vectors: the zero-fill of
 * the packed buffer (writeback partial) and the general scale scatterer
 * (every byte of a scale plane in any layout from a plane in any layout,
 * padding 0x00: the rule of mxs_host_convert_scales), used by
 * mxs_cuda_convert_scales; the writeback apply has its own tile-shaped
 * writer (mxs_scale_write.cuh) over the same per-vector helpers.
 *
 * A byte range [p, p + len) is cut into units of kVecChunk bytes on the
 * 16-byte grid of the ADDRESS (not of the offset), so every whole vector is
 * an aligned store:
 *
 *   address     |. . . p=====|================|================|====p+len . .|
 *   16 B grid   ^            ^                ^                ^            ^
 *               partial head (byte by byte)    whole vectors    partial tail
 *
 * One CTA (kThreads threads) works one unit: kVecPerThread vectors per
 * thread. Every byte of the range is written exactly once.
 */
#ifndef MXSHARD_CUDA_SCALES_CUH
#define MXSHARD_CUDA_SCALES_CUH

#include "mxs_tile.cuh"

namespace mxs__cu {

/* 2 (was 4): twice the CTAs for the same bytes, half the serial chain per
 * thread - the apply's scatter of a few MB fills one wave either way and is
 * latency-bound. Any value >= 1 gives the same bytes. */
constexpr int kVecPerThread = 2;
constexpr int64_t kVecChunk = (int64_t)kThreads * 16 * kVecPerThread; /* bytes per unit */

/* Units of the range [p, p + len). */
__host__ __device__ inline int64_t vec_units(const void *p, int64_t len) {
    if (len <= 0) return 0;
    const int64_t mis = (int64_t)(reinterpret_cast<uintptr_t>(p) & 15u);
    return (mis + len + kVecChunk - 1) / kVecChunk;
}

/* The partial's zero-fill of the packed buffer: a streaming memset, so
 * larger units (kZeroVecsPerThread stores per thread, 32 KiB per CTA):
 * the packed buffer of a DP=64 rank is almost all zeros, and 4 KiB units
 * made it launch-bound (one short-lived CTA per 4 KiB). */
constexpr int kZeroVecsPerThread = 16;
constexpr int64_t kZeroChunk = (int64_t)kThreads * 16 * kZeroVecsPerThread;

__host__ __device__ inline int64_t zero_units(const void *p, int64_t len) {
    if (len <= 0) return 0;
    const int64_t mis = (int64_t)(reinterpret_cast<uintptr_t>(p) & 15u);
    return (mis + len + kZeroChunk - 1) / kZeroChunk;
}

/* ---- writeback zero-fill / scale scatter in 16-byte vectors ----
 * Unit `unit` of a range [p, p + len): thread vectors at address offsets
 * v = unit * chunk + (s * kThreads + tid) * 16 from p - (p % 16), i.e.
 * range offsets off = v - p % 16. A vector wholly inside the range is one
 * 16-byte store; the (at most two) partial vectors at the ends are stored
 * byte by byte. Every byte of the range is written exactly once. */
__device__ __forceinline__ void zero_vec_unit(uint8_t *p, int64_t len, int64_t unit) {
    const int64_t mis = (int64_t)(reinterpret_cast<uintptr_t>(p) & 15u);
#pragma unroll 4
    for (int s = 0; s < kZeroVecsPerThread; s++) {
        const int64_t off = unit * kZeroChunk + (int64_t)(s * kThreads + threadIdx.x) * 16 - mis;
        if (off >= 0 && off + 16 <= len) {
            *reinterpret_cast<uint4 *>(p + off) = make_uint4(0u, 0u, 0u, 0u);
        } else {
            for (int j = 0; j < 16; j++)
                if (off + j >= 0 && off + j < len) p[off + j] = 0;
        }
    }
}

/* 16 bytes from any address: one vector load when 16-aligned, else aligned
 * 32-bit words (each holds a byte of [p, p + 16), so stays inside the
 * allocation) joined by funnel shifts. */
__device__ __forceinline__ uint4 ld16_any(const uint8_t *p) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    if ((a & 15u) == 0) return __ldg(reinterpret_cast<const uint4 *>(p));
    const uint32_t *w = reinterpret_cast<const uint32_t *>(a & ~(uintptr_t)3);
    const unsigned sh = (unsigned)(a & 3u) * 8u;
    const uint32_t w0 = __ldg(w), w1 = __ldg(w + 1), w2 = __ldg(w + 2), w3 = __ldg(w + 3);
    const uint32_t w4 = sh ? __ldg(w + 4) : 0u;
    return make_uint4(__funnelshift_r(w0, w1, sh), __funnelshift_r(w1, w2, sh), __funnelshift_r(w2, w3, sh),
                      __funnelshift_r(w3, w4, sh));
}

/* Destination byte `off` of a scale plane in layout gd, from src in gs
 * (padding entries 0x00): the rule of mxs_host_convert_scales. */
__device__ __forceinline__ uint8_t scale_byte(const mxs_scale_geom &gd, const uint8_t *src, const mxs_scale_geom &gs,
                                              int64_t off) {
    int64_t m, k;
    mxs_scale_geom_coords(&gd, off, &m, &k);
    return mxs_scale_geom_is_logical(&gd, m, k) ? src[mxs_scale_geom_offset(&gs, m, k)] : (uint8_t)0;
}

/* 16 bytes of the PADDED plane gd at offset off, from its COMPACT source gs
 * (a row / group of gd is gd's padded width of bytes: the COMPACT row of
 * gs's width, then zeros; rows past the logical ones all zero). Any off:
 * one division, then a step per byte. Used by scatter_fast_vec and the
 * writeback apply's scale writer (mxs_scale_write.cuh). */
__device__ __forceinline__ uint4 padded_vec(const mxs_scale_geom &gd, const uint8_t *src, const mxs_scale_geom &gs,
                                            int64_t off) {
    const int64_t W = gd.colwise ? gd.Mp : gd.Kp, Ws = gd.colwise ? gs.M : gs.K, R = gd.colwise ? gs.K : gs.M;
    int64_t r = off / W, x = off - r * W; /* one division per vector; then step (and wrap) */
    uint32_t w[4];
#pragma unroll
    for (int q = 0; q < 4; q++) {
        uint32_t word = 0;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            word |= (r < R && x < Ws ? (uint32_t)src[r * Ws + x] : 0u) << (8 * j);
            if (++x == W) {
                x = 0;
                r++;
            }
        }
        w[q] = word;
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

/* Fast scatter (kFastScatter): a whole 16-byte vector at plane offset `off`
 * (off % 16 == 0) of a PADDED or SWIZZLED destination gd, from a COMPACT
 * source gs of the same plane (the packed buffer of the writeback apply).
 * The same bytes as scale_byte for each of the 16 offsets - entry (m, k) of
 * mxs_scale_geom_coords, src[mxs_scale_geom_offset(&gs, m, k)] when logical,
 * else 0 - with one division per vector instead of one per byte:
 *   SWIZZLED  off = (mt * Kp/4 + kt) * 512 + i * 16 + q * 4 + j
 *             -> m = 128 mt + 32 q + i, k = 4 kt + j   (bytes 4q + j)
 *   PADDED    padded_vec (a row / group of the plane is the COMPACT row
 *             plus zero padding). */
constexpr bool kFastScatter = true;
/* COMPACT -> COMPACT scatter (a copy): a thread's kVecPerThread vector loads
 * are issued before its stores (false: one load-store pair at a time). */
constexpr bool kCopyInFlight = true;

/* Offset in the COMPACT plane gs of entry (m, k); -1 for a padding entry. */
__device__ __forceinline__ int64_t compact_at(const mxs_scale_geom &gs, int64_t m, int64_t k) {
    return (m < gs.M && k < gs.K) ? (gs.colwise ? k * gs.M + m : m * gs.K + k) : (int64_t)-1;
}

__device__ __forceinline__ uint4 scatter_fast_vec(const mxs_scale_geom &gd, const uint8_t *src,
                                                  const mxs_scale_geom &gs, int64_t off) {
    /* 1. the 16 source offsets (-1: padding), 2. 16 unconditional loads (a
     * padding entry loads src[0] and is then replaced by 0), so all 16 are
     * in flight together, 3. the 4 words. */
    if (gd.layout == MXS_SCALES_PADDED) return padded_vec(gd, src, gs, off);
    /* SWIZZLED */
    int64_t at[16];
    {
        const int64_t tile = off / 512, i = (off % 512) / 16, ktiles = gd.Kp / 4;
        const int64_t mt = tile / ktiles, k0 = (tile - mt * ktiles) * 4;
#pragma unroll
        for (int q = 0; q < 4; q++)
#pragma unroll
            for (int j = 0; j < 4; j++) at[4 * q + j] = compact_at(gs, mt * 128 + q * 32 + i, k0 + j);
    }
    uint32_t v[16];
#pragma unroll
    for (int b = 0; b < 16; b++) v[b] = src[at[b] >= 0 ? at[b] : 0];
    uint32_t w[4];
#pragma unroll
    for (int q = 0; q < 4; q++) {
        uint32_t word = 0;
#pragma unroll
        for (int j = 0; j < 4; j++) word |= (at[4 * q + j] >= 0 ? v[4 * q + j] : 0u) << (8 * j);
        w[q] = word;
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

/* Unit `unit` of the scatter of a whole scale plane (bytes = its size in
 * layout gd) into dst. COMPACT -> COMPACT is a copy; PADDED / SWIZZLED
 * destinations assemble each 16-byte vector from 4 groups of 4 aligned bytes,
 * each group being (m, k..k+3) - or (m..m+3, k) for the padded column plane
 * (the plane is a multiple of 4 bytes; when dst is not 4-aligned, byte by
 * byte). */
__device__ __forceinline__ void scatter_vec_unit(uint8_t *dst, const mxs_scale_geom &gd, const uint8_t *src,
                                                 const mxs_scale_geom &gs, int64_t bytes, int64_t unit) {
    const int64_t mis = (int64_t)(reinterpret_cast<uintptr_t>(dst) & 15u);
    const bool copy = gd.layout == MXS_SCALES_COMPACT && gs.layout == MXS_SCALES_COMPACT;
    const bool grouped = gd.layout != MXS_SCALES_COMPACT && (mis & 3) == 0;
    const bool step_m = gd.layout == MXS_SCALES_PADDED && gd.colwise;
    const bool fast = kFastScatter && mis == 0 && gd.layout != MXS_SCALES_COMPACT && gs.layout == MXS_SCALES_COMPACT &&
                      gd.colwise == gs.colwise && gd.M == gs.M && gd.K == gs.K;
    if (kCopyInFlight && copy) {
        /* COMPACT -> COMPACT: the thread's kVecPerThread loads first (all in
         * flight together), then the stores; the same bytes as the loop below */
        uint4 v[kVecPerThread];
#pragma unroll
        for (int s = 0; s < kVecPerThread; s++) {
            const int64_t off = unit * kVecChunk + (int64_t)(s * kThreads + threadIdx.x) * 16 - mis;
            v[s] = off >= 0 && off + 16 <= bytes ? ld16_any(src + off) : make_uint4(0u, 0u, 0u, 0u);
        }
#pragma unroll
        for (int s = 0; s < kVecPerThread; s++) {
            const int64_t off = unit * kVecChunk + (int64_t)(s * kThreads + threadIdx.x) * 16 - mis;
            if (off >= 0 && off + 16 <= bytes) {
                *reinterpret_cast<uint4 *>(dst + off) = v[s];
            } else {
                for (int j = 0; j < 16; j++)
                    if (off + j >= 0 && off + j < bytes) dst[off + j] = src[off + j];
            }
        }
        return;
    }
#pragma unroll 1
    for (int s = 0; s < kVecPerThread; s++) {
        const int64_t off = unit * kVecChunk + (int64_t)(s * kThreads + threadIdx.x) * 16 - mis;
        if (off >= 0 && off + 16 <= bytes) {
            uint4 v;
            if (copy) {
                v = ld16_any(src + off);
            } else if (fast) {
                v = scatter_fast_vec(gd, src, gs, off);
            } else {
                uint32_t w[4];
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    uint32_t word = 0;
                    if (grouped) {
                        int64_t m, k;
                        mxs_scale_geom_coords(&gd, off + 4 * q, &m, &k);
#pragma unroll
                        for (int j = 0; j < 4; j++) {
                            const int64_t mj = step_m ? m + j : m, kj = step_m ? k : k + j;
                            const uint32_t b =
                                mxs_scale_geom_is_logical(&gd, mj, kj) ? src[mxs_scale_geom_offset(&gs, mj, kj)] : 0u;
                            word |= b << (8 * j);
                        }
                    } else {
                        for (int j = 0; j < 4; j++)
                            word |= (uint32_t)scale_byte(gd, src, gs, off + 4 * q + j) << (8 * j);
                    }
                    w[q] = word;
                }
                v = make_uint4(w[0], w[1], w[2], w[3]);
            }
            *reinterpret_cast<uint4 *>(dst + off) = v;
        } else {
            for (int j = 0; j < 16; j++)
                if (off + j >= 0 && off + j < bytes)
                    dst[off + j] = copy ? src[off + j] : scale_byte(gd, src, gs, off + j);
        }
    }
}

} /* namespace mxs__cu */

#endif /* MXSHARD_CUDA_SCALES_CUH */
