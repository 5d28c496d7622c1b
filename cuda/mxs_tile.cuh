/* SPDX-License-Identifier: MIT */
/* cuda/mxs_tile.cuh - tile math: the 32-row x 128-column tile that every
 * kernel of libmxshard_cuda works (quantize, writeback partial and apply).
 *
 * Every scalar rule (E4M3/E8M0 conversions, amax, round-through, scale
 * offsets, shard geometry, which blocks a phase casts) is an MXS_HOST_DEVICE
 * function of the host headers: the tile only decides WHICH element goes
 * WHERE, and it makes the same decisions as the host engine in quantize.h
 * (mxs__host_tile), on the same job (mxs__job, wbjob.h).
 *
 * A tile is one 32-row group by 128 columns (4 row-wise blocks wide),
 * worked by 128 threads:
 *
 *            tx = 0   1   2   3 | 4 ...        15        (16 x 8 = 128 cols)
 *   ty = 0  [8 e][8 e][8 e][8 e]|....                    rows r0+0, +8, +16, +24
 *   ty = 1   ...                                          rows r0+1, +9, ...
 *   ...
 *   ty = 7                                                (8 x 4 = 32 rows)
 *
 *   - a thread loads 8 consecutive elements of 4 rows (16-byte vector loads
 *     on the fast path: 4 independent loads in flight, 8 for f32);
 *   - 4 neighbouring lanes hold one 1x32 row-wise block: amax via __shfl_xor;
 *   - the 32x1 column-wise amaxes go through shared memory (8 partials per
 *     column), one thread per column turns them into the exponent;
 *   - both data planes are row-major, so the stores (8 bytes per thread and
 *     plane) coalesce the same way.
 *
 * The tile of (group g, tile column t) also owns the scale entries
 * (rows 32g..32g+31, k = 4t..4t+3) of the row-wise plane and
 * (cols 128t..128t+127, k = g) of the column-wise plane; since Kp =
 * round_up(K,4) and Mp = round_up(M,128), the padding entries fall in these
 * ranges too (plus the rows / groups past the last group, written by the
 * tiles of the last group), so quantize writes every byte of a PADDED or
 * SWIZZLED plane exactly once, in one launch.
 *
 * run_tile is the general tile (masks for shard edges, short rows and
 * columns, scalar loads off the vector path); interior_tile is the same
 * tile without masks or bounds for tiles that lie wholly inside the range
 * on the vector path (~64 registers instead of ~120: twice the loads in
 * flight per SM). All index arithmetic is 64-bit.
 */
#ifndef MXSHARD_CUDA_TILE_CUH
#define MXSHARD_CUDA_TILE_CUH

#include <cuda_runtime.h>

#include <mxshard/mxshard.h>
#include <mxshard/wbjob.h>

namespace mxs__cu {

constexpr int kThreads = 128;      /* threads per CTA of every tile kernel */
constexpr int kTX = 16;            /* threads across a tile row (8 elements each) */
constexpr int kTY = 8;             /* thread rows */
constexpr int kRPT = 4;            /* rows per thread: kTY * kRPT = 32 */
constexpr int kTileCols = kTX * 8; /* 128 */
static_assert(kTY * kRPT == MXS_BLOCK, "a tile is one 32-row group");
static_assert(kTX * kTY == kThreads, "one thread per 8 x 4 elements");

/* ---- loads ---------------------------------------------------------------- */

__device__ __forceinline__ float ld_elem(const void *src, int dtype, int64_t i) {
    return mxs_load_f32(src, (mxs_dtype)dtype, i);
}

/* Widens 8 elements loaded as raw 16-byte words (f32: two words). */
__device__ __forceinline__ void unpack8(float *x, const uint4 *raw, int dtype) {
    if (dtype == MXS_F32) {
        x[0] = __uint_as_float(raw[0].x);
        x[1] = __uint_as_float(raw[0].y);
        x[2] = __uint_as_float(raw[0].z);
        x[3] = __uint_as_float(raw[0].w);
        x[4] = __uint_as_float(raw[1].x);
        x[5] = __uint_as_float(raw[1].y);
        x[6] = __uint_as_float(raw[1].z);
        x[7] = __uint_as_float(raw[1].w);
        return;
    }
    const uint32_t w[4] = {raw[0].x, raw[0].y, raw[0].z, raw[0].w};
    if (dtype == MXS_BF16) {
#pragma unroll
        for (int k = 0; k < 4; k++) {
            x[2 * k] = mxs_bf16_to_f32((uint16_t)(w[k] & 0xFFFFu));
            x[2 * k + 1] = mxs_bf16_to_f32((uint16_t)(w[k] >> 16));
        }
    } else {
#pragma unroll
        for (int k = 0; k < 4; k++) {
            x[2 * k] = mxs_f16_to_f32((uint16_t)(w[k] & 0xFFFFu));
            x[2 * k + 1] = mxs_f16_to_f32((uint16_t)(w[k] >> 16));
        }
    }
}

/* 16 bytes from a 2-byte aligned address, reading nothing outside them
 * (a master shard may end right there): one vector load when 16-aligned,
 * four 32-bit loads when 4-aligned, else a 16-bit load, three 32-bit loads
 * and a 16-bit load, joined little-endian. The bytes are the memory's, so
 * every value derived from them is the one the aligned load gives. */
__device__ __forceinline__ uint4 ld16_elems(const uint8_t *p) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    if ((a & 15u) == 0) return __ldg(reinterpret_cast<const uint4 *>(p));
    if ((a & 3u) == 0) {
        const uint32_t *w = reinterpret_cast<const uint32_t *>(p);
        return make_uint4(__ldg(w), __ldg(w + 1), __ldg(w + 2), __ldg(w + 3));
    }
    /* a % 4 == 2: bytes p[0..1] | p[2..5] | p[6..9] | p[10..13] | p[14..15] */
    const uint32_t h0 = __ldg(reinterpret_cast<const unsigned short *>(p));
    const uint32_t *w = reinterpret_cast<const uint32_t *>(p + 2);
    const uint32_t w0 = __ldg(w), w1 = __ldg(w + 1), w2 = __ldg(w + 2);
    const uint32_t h1 = __ldg(reinterpret_cast<const unsigned short *>(p + 14));
    return make_uint4(h0 | (w0 << 16), (w0 >> 16) | (w1 << 16), (w1 >> 16) | (w2 << 16), (w2 >> 16) | (h1 << 16));
}

/* The 8 source elements e .. e+7 as raw 16-byte words (f32: two). MIS =
 * false: src + e is 16-byte aligned (the job's vec rule); MIS = true: it is
 * only element-aligned (a shard whose start is not on the 8-element grid of
 * its master's alignment), read with ld16_elems. */
template <bool MIS> __device__ __forceinline__ void ld_vec8(const void *src, int dtype, int64_t e, uint4 *raw) {
    if (dtype == MXS_F32) {
        const float *p = static_cast<const float *>(src) + e;
        if (MIS) {
            raw[0] = ld16_elems(reinterpret_cast<const uint8_t *>(p));
            raw[1] = ld16_elems(reinterpret_cast<const uint8_t *>(p + 4));
        } else {
            raw[0] = __ldg(reinterpret_cast<const uint4 *>(p));
            raw[1] = __ldg(reinterpret_cast<const uint4 *>(p) + 1);
        }
    } else {
        const uint16_t *p = static_cast<const uint16_t *>(src) + e;
        raw[0] = MIS ? ld16_elems(reinterpret_cast<const uint8_t *>(p)) : __ldg(reinterpret_cast<const uint4 *>(p));
    }
}

/* ---- element-aligned loads shared by a half-warp (interior tiles) ----------
 * kShuffleMisLoads: in an interior tile, the 16 lanes of a half-warp load
 * one contiguous row segment (lane tx: bytes [p, p + 16 * 8 / (16 / eb)) -
 * 16 bytes, 32 for f32). When p is only element-aligned (b = p % 16 != 0),
 * each lane loads the ALIGNED 16-byte vectors that start inside its window
 * ([p + 16 - b, +16), and for f32 also [p + 32 - b, +16)); the last one
 * reaches b bytes into the next lane's window (never past the segment: the
 * last lane does not load it). A lane's 16-byte chunk [p, p + 16) is then
 * the bytes b .. b + 15 of (previous aligned vector ++ next aligned vector),
 * the previous one coming from lane tx - 1 by __shfl_up_sync. The first and
 * the last lane of the segment read the chunks they cannot assemble with
 * ld16_elems. Every byte comes from the same address as with ld16_elems, so
 * the values are identical; only the number of load instructions changes
 * (2 or 1 aligned vectors per lane instead of 4 or 5 narrow loads per 16
 * bytes). false: ld16_elems for every lane. */
constexpr bool kShuffleMisLoads = true;

/* Bytes b .. b + 15 of lo ++ hi (b even, 0 < b < 16). */
__device__ __forceinline__ uint4 extract16(const uint4 &lo, const uint4 &hi, int b) {
    const uint32_t c[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    const unsigned sh = (unsigned)(b & 3) * 8u;
    uint32_t r[4];
    switch (b >> 2) {
    case 0:
#pragma unroll
        for (int k = 0; k < 4; k++) r[k] = __funnelshift_r(c[k], c[k + 1], sh);
        break;
    case 1:
#pragma unroll
        for (int k = 0; k < 4; k++) r[k] = __funnelshift_r(c[k + 1], c[k + 2], sh);
        break;
    case 2:
#pragma unroll
        for (int k = 0; k < 4; k++) r[k] = __funnelshift_r(c[k + 2], c[k + 3], sh);
        break;
    default:
#pragma unroll
        for (int k = 0; k < 4; k++) r[k] = __funnelshift_r(c[k + 3], c[k + 4], sh);
        break;
    }
    return make_uint4(r[0], r[1], r[2], r[3]);
}

/* ld_vec8<true> of the 8 elements e .. e+7 for lane tx of a half-warp whose
 * 16 lanes load consecutive 8-element groups of one row segment (see
 * kShuffleMisLoads). Must be called by every lane of the warp (it
 * shuffles); ok = false: this lane's row is absent (raw = 0). */
template <int DTYPE>
__device__ __forceinline__ void ld_vec8_coop(const void *src, int64_t e, bool ok, int tx, uint4 *raw) {
    constexpr int64_t eb = DTYPE == MXS_F32 ? 4 : 2;
    const uint8_t *p = static_cast<const uint8_t *>(src) + e * eb;
    const int b = (int)(reinterpret_cast<uintptr_t>(p) & 15u);
    uint4 a0 = make_uint4(0u, 0u, 0u, 0u), a1 = a0;
    if (ok && b != 0) {
        const uint4 *q = reinterpret_cast<const uint4 *>(p + (16 - b)); /* the first aligned vector after p */
        if (DTYPE == MXS_F32) {
            a0 = __ldg(q);
            if (tx < kTX - 1) a1 = __ldg(q + 1);
        } else if (tx < kTX - 1) {
            a0 = __ldg(q);
        }
    }
    const uint4 last = DTYPE == MXS_F32 ? a1 : a0;
    uint4 prev;
    prev.x = __shfl_up_sync(0xFFFFFFFFu, last.x, 1, kTX);
    prev.y = __shfl_up_sync(0xFFFFFFFFu, last.y, 1, kTX);
    prev.z = __shfl_up_sync(0xFFFFFFFFu, last.z, 1, kTX);
    prev.w = __shfl_up_sync(0xFFFFFFFFu, last.w, 1, kTX);
    if (!ok) {
        raw[0] = raw[1] = make_uint4(0u, 0u, 0u, 0u);
        return;
    }
    if (b == 0) { /* an aligned item in a MIS launch */
        ld_vec8<false>(src, DTYPE, e, raw);
        return;
    }
    if (DTYPE == MXS_F32) {
        raw[0] = tx > 0 ? extract16(prev, a0, b) : ld16_elems(p);
        raw[1] = tx < kTX - 1 ? extract16(a0, a1, b) : ld16_elems(p + 16);
    } else {
        raw[0] = (tx > 0 && tx < kTX - 1) ? extract16(prev, a0, b) : ld16_elems(p);
    }
}

/* The 8 source elements e .. e+7 of one lane of the interior tiles: the
 * cooperative load under MIS (every lane calls it: it shuffles), else one
 * ld_vec8; ok = false: the lane's row or tile column is absent (raw = 0). */
template <int DTYPE, bool MIS>
__device__ __forceinline__ void ld_lane8(const void *src, int64_t e, bool ok, int tx, uint4 *raw) {
    if (MIS && kShuffleMisLoads) {
        ld_vec8_coop<DTYPE>(src, e, ok, tx, raw);
    } else if (!ok) {
        raw[0] = raw[1] = make_uint4(0u, 0u, 0u, 0u);
    } else {
        ld_vec8<MIS>(src, DTYPE, e, raw);
    }
}

/* Round-through of 8 widened master values (mxs_round_through), with the
 * dtype test outside the element loop. */
__device__ __forceinline__ void round_through8(float *x, int rt) {
    if (rt == MXS_BF16) {
#pragma unroll
        for (int k = 0; k < 8; k++) x[k] = mxs_round_through(x[k], MXS_BF16);
    } else if (rt == MXS_F16) {
#pragma unroll
        for (int k = 0; k < 8; k++) x[k] = mxs_round_through(x[k], MXS_F16);
    }
}

/* E4M3(fl32(x[k] * mult[k])) for 8 elements. */
__device__ __forceinline__ uint2 quantize8(const float *x, const float *mult) {
    float v[8];
#pragma unroll
    for (int k = 0; k < 8; k++) v[k] = __fmul_rn(x[k], mult[k]); /* one rounding, never fused */
    return make_uint2(mxs_e4m3x4_from_f32(v[0], v[1], v[2], v[3]), mxs_e4m3x4_from_f32(v[4], v[5], v[6], v[7]));
}

__device__ __forceinline__ void st_bytes(uint8_t *out, uint2 q, unsigned mask, bool vec8) {
    if (vec8 && mask == 0xFFu) {
        *reinterpret_cast<uint2 *>(out) = q;
        return;
    }
#pragma unroll
    for (int k = 0; k < 8; k++)
        if (mask & (1u << k)) out[k] = (uint8_t)((k < 4 ? q.x : q.y) >> (8 * (k & 3)));
}

/* ---- the tile --------------------------------------------------------------- */

/* interior_tile: row-wise scale offsets of a thread's 4 rows as o0 + i * step
 * (see there); false: mxs_scale_geom_offset per row. */
constexpr bool kLinearRowOffsets = true;

struct TileSmem {
    float amax[kTY][kTileCols];
    float mult[kTileCols];
};

/* MODE: compile-time job mode; PLANES: compile-time plane set (0:
 * J.planes); MIS: vector loads may be misaligned (ld_vec8). */
template <int MODE, unsigned PLANES = 0, bool MIS = false>
__device__ __forceinline__ void run_tile(const mxs__job &J, int64_t g, int64_t t, TileSmem &sm) {
    const int tid = threadIdx.x, tx = tid % kTX, ty = tid / kTX;
    const int64_t rows = J.rows, cols = J.cols, lo = J.lo, hi = J.hi;
    const int64_t r0 = g * MXS_BLOCK, c = t * kTileCols + tx * 8;
    const int64_t kb = c / MXS_BLOCK; /* row-wise block column of this thread */
    const unsigned planes = PLANES ? PLANES : J.planes;
    const bool do_row = (planes & MXS_ROWWISE) != 0, do_col = (planes & MXS_COLWISE) != 0;
    constexpr int mode = MODE;
    const int64_t nvalid = c < cols ? (cols - c < 8 ? cols - c : 8) : 0;
    const unsigned valid = (1u << nvalid) - 1u;
    const int64_t r_last = (r0 + MXS_BLOCK < rows ? r0 + MXS_BLOCK : rows) - 1;

    /* Column-wise blocks (g, c+k) wholly inside the shard: first and last
     * element inside (the shard is contiguous). */
    unsigned col_inside = 0;
    if (do_col && J.cast >= MXS__CAST_INSIDE) {
        for (int k = 0; k < (int)nvalid; k++) {
            int64_t first = r0 * cols + c + k, last = r_last * cols + c + k;
            if (first >= lo && last < hi) col_inside |= 1u << k;
        }
    }
    unsigned col_sel = 0u; /* the columns whose block this phase casts */
    if (do_col)
        for (int k = 0; k < (int)nvalid; k++)
            if (mxs__cast_selected(J.cast, (col_inside >> k) & 1u)) col_sel |= 1u << k;

    /* Phase 1 issues every load of the tile (16-byte vectors on the fast
     * path) before any loaded value is used, so all of a thread's loads are
     * in flight together; phase 2 widens them. */
    float x[kRPT][8];
    uint4 raw[kRPT][2];
    bool vrow[kRPT];
    unsigned have[kRPT], row_cast[kRPT], col_cast[kRPT];
    const int dtype = J.src_dtype;
#pragma unroll
    for (int i = 0; i < kRPT; i++) {
        const int64_t r = r0 + ty + i * kTY;
        have[i] = row_cast[i] = col_cast[i] = 0u;
        vrow[i] = false;
#pragma unroll
        for (int k = 0; k < 8; k++) x[i][k] = 0.0f;
        if (r >= rows || nvalid == 0) continue;
        const int64_t f = r * cols + c;
        unsigned m;
        if (MODE == MXS__JOB_QUANTIZE || (f >= lo && f + nvalid <= hi)) {
            m = valid;
        } else {
            m = 0u;
            for (int k = 0; k < (int)nvalid; k++)
                if (f + k >= lo && f + k < hi) m |= 1u << k;
        }
        have[i] = m;
        if (m == 0u) continue;
        if (do_row) {
            /* row-wise block (r, kb): [r*cols + 32kb, r*cols + min(32kb+32, cols)) */
            int64_t b0 = r * cols + kb * MXS_BLOCK;
            int64_t b1 = r * cols + (kb * MXS_BLOCK + MXS_BLOCK < cols ? kb * MXS_BLOCK + MXS_BLOCK : cols);
            row_cast[i] = (MODE == MXS__JOB_QUANTIZE || mxs__cast_selected(J.cast, b0 >= lo && b1 <= hi)) ? m : 0u;
        }
        col_cast[i] = m & col_sel;
        const unsigned need = mode == MXS__JOB_APPLY ? (row_cast[i] | col_cast[i]) : m;
        if (need == 0u) continue;
        const int64_t e = f - J.src_base;
        if (J.vec && need == 0xFFu) {
            vrow[i] = true;
            ld_vec8<MIS>(J.src, dtype, e, raw[i]);
        } else {
            /* unrolled, so that x stays in registers (a dynamic index puts the
             * whole array in local memory: ncu counted 12,000 local requests
             * for apply's two straddling tiles of a DP=8 rank) */
#pragma unroll
            for (int k = 0; k < 8; k++)
                if (need & (1u << k)) x[i][k] = ld_elem(J.src, dtype, e + k);
        }
    }
#pragma unroll
    for (int i = 0; i < kRPT; i++) {
        if (vrow[i]) unpack8(x[i], raw[i], dtype);
        round_through8(x[i], J.round_through);
    }

    /* ---- row-wise exponents ---- */
    float mult_row[kRPT];
    if (do_row) {
        const mxs_scale_geom &G = J.geom[0];
#pragma unroll
        for (int i = 0; i < kRPT; i++) {
            const int64_t r = r0 + ty + i * kTY;
            const bool logical = r < rows && kb < G.K;
            uint8_t e = 0;
            if (mode == MXS__JOB_APPLY) {
                if (row_cast[i] != 0u) e = J.scale[0][mxs_scale_geom_offset(&G, r, kb)];
            } else {
                float a = 0.0f;
#pragma unroll
                for (int k = 0; k < 8; k++) a = mxs_amax_step(a, x[i][k]);
                a = fmaxf(a, __shfl_xor_sync(0xFFFFFFFFu, a, 1));
                a = fmaxf(a, __shfl_xor_sync(0xFFFFFFFFu, a, 2));
                e = mxs_e8m0_from_amax(a, (mxs_rounding)J.rounding);
                if ((tx & 3) == 0) {
                    if (logical)
                        J.scale[0][mxs_scale_geom_offset(&G, r, kb)] = e;
                    else if (J.pad)
                        J.scale[0][mxs_scale_geom_offset(&G, r, kb)] = 0;
                }
            }
            mult_row[i] = mxs_e8m0_quant_mult(e);
        }
        if (J.pad && r0 + MXS_BLOCK >= rows) {
            /* rows past the last group, up to Mp, for k = 4t .. 4t+3 */
            const int64_t rfirst = r0 + MXS_BLOCK, n = (G.Mp - rfirst) * 4;
            for (int64_t idx = tid; idx < n; idx += kThreads)
                J.scale[0][mxs_scale_geom_offset(&G, rfirst + idx / 4, t * 4 + idx % 4)] = 0;
        }
    }

    /* ---- column-wise exponents ---- */
    float mult_col[8];
    if (do_col) {
        const mxs_scale_geom &G = J.geom[1];
        if (mode != MXS__JOB_APPLY) {
#pragma unroll
            for (int k = 0; k < 8; k++) {
                float a = 0.0f;
#pragma unroll
                for (int i = 0; i < kRPT; i++) a = mxs_amax_step(a, x[i][k]);
                sm.amax[ty][tx * 8 + k] = a;
            }
        }
        __syncthreads();
        {
            const int64_t cc = t * kTileCols + tid;
            uint8_t e = 0;
            if (mode == MXS__JOB_APPLY) {
                if (cc < cols) e = J.scale[1][mxs_scale_geom_offset(&G, cc, g)];
            } else {
                float a = 0.0f;
#pragma unroll
                for (int y = 0; y < kTY; y++) a = fmaxf(a, sm.amax[y][tid]);
                e = mxs_e8m0_from_amax(a, (mxs_rounding)J.rounding);
                if (cc < cols)
                    J.scale[1][mxs_scale_geom_offset(&G, cc, g)] = e;
                else if (J.pad)
                    J.scale[1][mxs_scale_geom_offset(&G, cc, g)] = 0;
                if (J.pad && r0 + MXS_BLOCK >= rows)
                    for (int64_t k = g + 1; k < G.Kp; k++) J.scale[1][mxs_scale_geom_offset(&G, cc, k)] = 0;
            }
            sm.mult[tid] = mxs_e8m0_quant_mult(e);
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < 8; k++) mult_col[k] = sm.mult[tx * 8 + k];
        __syncthreads(); /* sm is reused by the next tile of this CTA */
    }

    /* ---- casts ---- */
    if (J.cast == MXS__CAST_NONE) return;
#pragma unroll
    for (int i = 0; i < kRPT; i++) {
        const int64_t r = r0 + ty + i * kTY;
        if (have[i] == 0u) continue;
        const int64_t f = r * cols + c;
        if (row_cast[i]) {
            float m8[8];
#pragma unroll
            for (int k = 0; k < 8; k++) m8[k] = mult_row[i];
            st_bytes(J.out[0] + (f - J.out_base[0]), quantize8(x[i], m8), row_cast[i], J.vec != 0);
        }
        if (col_cast[i]) st_bytes(J.out[1] + (f - J.out_base[1]), quantize8(x[i], mult_col), col_cast[i], J.vec != 0);
    }
}

/* An interior tile: all 128 columns exist, vector path, no padding columns.
 * The same bytes as run_tile without its general masks: straight-line code,
 * few registers, every load of the tile in flight at once. Serves quantize
 * and the fused partial.
 *   CLIP: the tile may be in the last group with fewer than 32 rows; the
 *         missing rows read as 0 and are neither stored nor scaled, as in
 *         run_tile (which also counts them as 0 in the column amax).
 *   MASK: (fused partial) the group is cut by the shard [lo, hi): elements
 *         outside read as 0 and are not stored; a block is cast only when it
 *         lies wholly inside (its exponents still go to the packed buffer,
 *         0x00 for untouched blocks), exactly as run_tile in PARTIAL mode.
 *         Lanes whose 8 elements are all inside load them as on the vector
 *         path (MIS: ld16_elems, never past the shard), the (at most two)
 *         lanes of a row segment cut by an edge element by element.
 */
template <int DTYPE, unsigned PLANES, bool CLIP = false, bool MIS = false, bool MASK = false>
__device__ __forceinline__ void interior_tile(const mxs__job &J, int64_t g, int64_t t, TileSmem &sm) {
    const unsigned planes = PLANES ? PLANES : J.planes;
    const bool do_row = (planes & MXS_ROWWISE) != 0, do_col = (planes & MXS_COLWISE) != 0;
    const int tid = threadIdx.x, tx = tid % kTX, ty = tid / kTX;
    const int64_t cols = J.cols, lo = J.lo, hi = J.hi;
    const int64_t r0 = g * MXS_BLOCK + ty, c = t * kTileCols + tx * 8, kb = c / MXS_BLOCK;
    uint4 raw[kRPT][2];
    bool rok[kRPT];
    unsigned have[kRPT]; /* MASK: the lane's elements inside [lo, hi) */
#pragma unroll
    for (int i = 0; i < kRPT; i++) {
        rok[i] = !CLIP || r0 + i * kTY < J.rows;
        const int64_t f = (r0 + i * kTY) * cols + c;
        if (MASK) {
            unsigned m = 0u;
            if (rok[i]) {
                const int64_t a = lo - f, b = hi - f; /* inside: a <= k < b */
                const int ka = a < 0 ? 0 : a > 8 ? 8 : (int)a, kz = b < 0 ? 0 : b > 8 ? 8 : (int)b;
                m = kz > ka ? ((1u << kz) - 1u) & ~((1u << ka) - 1u) : 0u;
            }
            have[i] = m;
            raw[i][0] = raw[i][1] = make_uint4(0u, 0u, 0u, 0u);
            if (m == 0xFFu) ld_vec8<MIS>(J.src, DTYPE, f - J.src_base, raw[i]);
        } else {
            have[i] = rok[i] ? 0xFFu : 0u;
            ld_lane8<DTYPE, MIS>(J.src, f - J.src_base, rok[i], tx, raw[i]);
        }
    }
    float x[kRPT][8];
#pragma unroll
    for (int i = 0; i < kRPT; i++) {
        unpack8(x[i], raw[i], DTYPE);
        if (MASK && have[i] != 0xFFu && have[i] != 0u) {
            const int64_t e = (r0 + i * kTY) * cols + c - J.src_base;
            for (int k = 0; k < 8; k++) x[i][k] = (have[i] >> k) & 1u ? ld_elem(J.src, DTYPE, e + k) : 0.0f;
        }
        round_through8(x[i], J.round_through);
    }
    float mult_row[kRPT];
    bool row_in[kRPT]; /* MASK: the row block of this lane lies wholly inside */
    if (do_row) {
        /* Within one 32-row group the row-wise offset is linear in the row in
         * every layout (m * K + k, m * Kp + k; SWIZZLED: the group lies in one
         * 128-row block, where m % 32 steps by 16 bytes), so rows r0 + 8 i
         * are at o0 + i * step: two evaluations of mxs_scale_geom_offset
         * instead of four (kLinearRowOffsets; false: one per row). */
        const int64_t o0 = mxs_scale_geom_offset(&J.geom[0], r0, kb);
        const int64_t step = kLinearRowOffsets ? mxs_scale_geom_offset(&J.geom[0], r0 + kTY, kb) - o0 : 0;
#pragma unroll
        for (int i = 0; i < kRPT; i++) {
            float a = 0.0f;
#pragma unroll
            for (int k = 0; k < 8; k++) a = mxs_amax_step(a, x[i][k]);
            a = fmaxf(a, __shfl_xor_sync(0xFFFFFFFFu, a, 1));
            a = fmaxf(a, __shfl_xor_sync(0xFFFFFFFFu, a, 2));
            const uint8_t e = mxs_e8m0_from_amax(a, (mxs_rounding)J.rounding);
            if (MASK) {
                /* = mxs_row_block_inside (geometry.h): the block is the 4
                 * lanes' 32 elements (cols % 128 == 0 here). Calling it costs
                 * the kernel 16 registers (measured); the shuffles do not */
                unsigned full = have[i] == 0xFFu ? 1u : 0u;
                full &= __shfl_xor_sync(0xFFFFFFFFu, full, 1);
                full &= __shfl_xor_sync(0xFFFFFFFFu, full, 2);
                row_in[i] = full != 0u;
            } else {
                row_in[i] = true;
            }
            if ((tx & 3) == 0 && rok[i])
                J.scale[0][kLinearRowOffsets ? o0 + i * step : mxs_scale_geom_offset(&J.geom[0], r0 + i * kTY, kb)] = e;
            mult_row[i] = mxs_e8m0_quant_mult(e);
        }
    }
    float mult_col[8];
    unsigned col_in = 0xFFu; /* MASK: the lane's columns whose 32x1 block lies wholly inside */
    if (do_col) {
        if (MASK) {
            /* = mxs_col_block_inside (geometry.h) for columns c .. c + 7 in
             * closed form: first row's element >= lo, last row's < hi */
            const int64_t rl = ((g * MXS_BLOCK + MXS_BLOCK < J.rows) ? g * MXS_BLOCK + MXS_BLOCK : J.rows) - 1;
            const int64_t a = lo - (g * MXS_BLOCK * cols + c), b = hi - (rl * cols + c);
            const int ka = a < 0 ? 0 : a > 8 ? 8 : (int)a, kz = b < 0 ? 0 : b > 8 ? 8 : (int)b;
            col_in = kz > ka ? ((1u << kz) - 1u) & ~((1u << ka) - 1u) : 0u;
        }
#pragma unroll
        for (int k = 0; k < 8; k++) {
            float a = 0.0f;
#pragma unroll
            for (int i = 0; i < kRPT; i++) a = mxs_amax_step(a, x[i][k]);
            sm.amax[ty][tx * 8 + k] = a;
        }
        __syncthreads();
        {
            float a = 0.0f;
#pragma unroll
            for (int y = 0; y < kTY; y++) a = fmaxf(a, sm.amax[y][tid]);
            const uint8_t e = mxs_e8m0_from_amax(a, (mxs_rounding)J.rounding);
            J.scale[1][mxs_scale_geom_offset(&J.geom[1], t * kTileCols + tid, g)] = e;
            sm.mult[tid] = mxs_e8m0_quant_mult(e);
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < 8; k++) mult_col[k] = sm.mult[tx * 8 + k];
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < kRPT; i++) {
        const int64_t f = (r0 + i * kTY) * cols + c;
        if (!rok[i]) continue;
        if (MASK && have[i] == 0u) continue;
        if (do_row && row_in[i]) {
            float m8[8];
#pragma unroll
            for (int k = 0; k < 8; k++) m8[k] = mult_row[i];
            *reinterpret_cast<uint2 *>(J.out[0] + (f - J.out_base[0])) = quantize8(x[i], m8);
        }
        if (do_col && col_in != 0u) {
            if (MASK)
                st_bytes(J.out[1] + (f - J.out_base[1]), quantize8(x[i], mult_col), col_in, true);
            else
                *reinterpret_cast<uint2 *>(J.out[1] + (f - J.out_base[1])) = quantize8(x[i], mult_col);
        }
    }
}

/* A short interior group: the last group of a weight with at most 8 * RPT
 * rows (RPT = 1: rows % 32 in 1..8; RPT = 2: 9..16), wholly inside the
 * shard, on the vector path. One CTA takes its rows x (4 / RPT) tile
 * columns - tile columns kW tw .. kW tw + kW - 1 below T_int - thread
 * (tx, ty) rows 32 g + ty + 8 j (j < RPT) and 8 elements of each of the kW
 * tile columns: four 16-byte loads in flight per thread (as in a whole
 * tile) instead of RPT, and RPT/4 of the CTAs. The bytes are those of
 * interior_tile<CLIP = true> on each of the kW tiles: rows past the last
 * read as 0 and are neither stored nor scaled; a column amax is the max
 * over the same values (max is order-free: fmaxf of |x|, NaN ignored, from
 * 0). */
template <int DTYPE, unsigned PLANES, bool MIS = false, int RPT = 1>
__device__ __forceinline__ void interior_wide_tile(const mxs__job &J, int64_t g, int64_t tw, int64_t T_int,
                                                   TileSmem &sm) {
    static_assert(RPT == 1 || RPT == 2, "8 or 16 rows");
    const unsigned planes = PLANES ? PLANES : J.planes;
    const bool do_row = (planes & MXS_ROWWISE) != 0, do_col = (planes & MXS_COLWISE) != 0;
    const int tid = threadIdx.x, tx = tid % kTX, ty = tid / kTX;
    const int64_t cols = J.cols, r0 = g * MXS_BLOCK + ty;
    constexpr int kW = 4 / RPT; /* tile columns per CTA */
    uint4 raw[kW][RPT][2];
    bool cok[kW], rok[RPT]; /* cok: the same in the whole CTA */
#pragma unroll
    for (int j = 0; j < RPT; j++) rok[j] = r0 + j * kTY < J.rows;
#pragma unroll
    for (int i = 0; i < kW; i++) {
        const int64_t tc = tw * kW + i;
        cok[i] = tc < T_int;
#pragma unroll
        for (int j = 0; j < RPT; j++)
            ld_lane8<DTYPE, MIS>(J.src, (r0 + j * kTY) * cols + tc * kTileCols + tx * 8 - J.src_base, rok[j] && cok[i],
                                 tx, raw[i][j]);
    }
    float x[kW][RPT][8];
#pragma unroll
    for (int i = 0; i < kW; i++)
#pragma unroll
        for (int j = 0; j < RPT; j++) {
            unpack8(x[i][j], raw[i][j], DTYPE);
            round_through8(x[i][j], J.round_through);
        }
    if (do_col) {
#pragma unroll
        for (int i = 0; i < kW; i++) {
            if (!cok[i]) break; /* CTA-uniform: the syncs below are reached by all or none */
            const int64_t tc = tw * kW + i;
#pragma unroll
            for (int k = 0; k < 8; k++) {
                float a = 0.0f;
#pragma unroll
                for (int j = 0; j < RPT; j++) a = mxs_amax_step(a, x[i][j][k]);
                sm.amax[ty][tx * 8 + k] = a;
            }
            __syncthreads();
            {
                float a = 0.0f;
#pragma unroll
                for (int y = 0; y < kTY; y++) a = fmaxf(a, sm.amax[y][tid]);
                const uint8_t e = mxs_e8m0_from_amax(a, (mxs_rounding)J.rounding);
                J.scale[1][mxs_scale_geom_offset(&J.geom[1], tc * kTileCols + tid, g)] = e;
                sm.mult[tid] = mxs_e8m0_quant_mult(e);
            }
            __syncthreads();
            float mult_col[8];
#pragma unroll
            for (int k = 0; k < 8; k++) mult_col[k] = sm.mult[tx * 8 + k];
            __syncthreads();
#pragma unroll
            for (int j = 0; j < RPT; j++) {
                if (!rok[j]) continue;
                const int64_t f = (r0 + j * kTY) * cols + tc * kTileCols + tx * 8;
                *reinterpret_cast<uint2 *>(J.out[1] + (f - J.out_base[1])) = quantize8(x[i][j], mult_col);
            }
        }
    }
    if (do_row) {
#pragma unroll
        for (int i = 0; i < kW; i++) {
            const int64_t tc = tw * kW + i, c = tc * kTileCols + tx * 8;
#pragma unroll
            for (int j = 0; j < RPT; j++) {
                const int64_t r = r0 + j * kTY;
                float a = 0.0f;
#pragma unroll
                for (int k = 0; k < 8; k++) a = mxs_amax_step(a, x[i][j][k]);
                a = fmaxf(a, __shfl_xor_sync(0xFFFFFFFFu, a, 1));
                a = fmaxf(a, __shfl_xor_sync(0xFFFFFFFFu, a, 2));
                const uint8_t e = mxs_e8m0_from_amax(a, (mxs_rounding)J.rounding);
                if (!(rok[j] && cok[i])) continue;
                if ((tx & 3) == 0) J.scale[0][mxs_scale_geom_offset(&J.geom[0], r, c / MXS_BLOCK)] = e;
                float m8[8];
#pragma unroll
                for (int k = 0; k < 8; k++) m8[k] = mxs_e8m0_quant_mult(e);
                *reinterpret_cast<uint2 *>(J.out[0] + (r * cols + c - J.out_base[0])) = quantize8(x[i][j], m8);
            }
        }
    }
}

} /* namespace mxs__cu */

#endif /* MXSHARD_CUDA_TILE_CUH */
