/* cuda/mxs_kernels.cu - the CUDA kernels of mxshard and their C-ABI launchers
 * (declared in <mxshard/cuda.h>).
 *
 * Every scalar rule (E4M3/E8M0 conversions, amax, round-through, scale
 * offsets, shard geometry) is the MXS_HOST_DEVICE function of the host
 * headers: the kernels below only decide WHICH element goes WHERE, and they
 * make the same decisions as the host engine in quantize.h (mxs__host_tile).
 *
 * One engine, one tile shape. A tile is one 32-row group by 128 columns
 * (4 row-wise blocks wide), worked by 128 threads:
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
 * Writeback (partial / apply) runs the same tile over a shard [lo, hi): the
 * batch becomes a table of items, each owning a contiguous range of work
 * units (tiles, then zero-fill or scale-scatter units of 8 KiB, written as
 * 16-byte vectors); a CTA finds its item by binary search over the units'
 * prefix. The table travels in the kernel parameters (__grid_constant__):
 * whole items (WbItem, 512 B) for up to kInlineSmall items; compact
 * records (WbLite, 144 B: pointers, shape, shard, offsets, prefixes and
 * the results of the divisions by cols) for up to kLiteMax (226) items,
 * from which each CTA rebuilds its item in shared memory (wb_expand, the
 * same code the host runs); larger batches are stored into the caller's
 * workspace by one tiny table_store launch per kInlineMax items.
 *
 * Interior tiles - all 32 x 128 elements exist (or all rows of a last
 * group of fewer than 32 rows, for the partial), lie in the range and take
 * the vector path - go to a lean kernel without masks or bounds
 * (interior_tile: ~64 registers instead of ~120, so twice the loads in
 * flight per SM). Launches:
 *   quantize  1 (interior + 0 edge tiles: shapes that are multiples of
 *             32 x 128 on the vector path, COMPACT), else 2 (+ edge kernel)
 *   partial   1, or 2 when the batch has both interior tiles (fused mode)
 *             and tiles for the general kernel (a shard edge that is not a
 *             32-row-group boundary, cols % 128 != 0, no vector path):
 *             interior kernel + general kernel (edge tiles, zero-fill of
 *             the packed buffer outside the touched groups). Without such
 *             tiles the interior launch does the zero-fill too; without
 *             interior tiles the general kernel does everything.
 *   apply     1 general kernel (straddling blocks + scale scatter)
 *   + ceil(n_items / kInlineMax) table_store launches per phase when
 *     n_items > kLiteMax.
 * All index arithmetic is 64-bit.
 */
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <string.h>


#include <mxshard/cuda.h>

namespace {

constexpr int kThreads = 128;
constexpr int kTX = 16;            /* threads across a tile row (8 elements each) */
constexpr int kTY = 8;             /* thread rows */
constexpr int kRPT = 4;            /* rows per thread: kTY * kRPT = 32 */
constexpr int kTileCols = kTX * 8; /* 128 */
constexpr int64_t kChunkBytes = kThreads * 16; /* convert_scales unit */
/* Writeback zero-fill / scale-scatter unit: 4 16-byte vectors per thread.
 * A byte range [p, p + len) is cut into units on the 16-byte grid of the
 * ADDRESS (not of the offset), so every whole vector is an aligned store. */
constexpr int kVecPerThread = 4;
constexpr int64_t kVecChunk = (int64_t)kThreads * 16 * kVecPerThread;

__host__ __device__ inline int64_t vec_units(const void *p, int64_t len) {
    if (len <= 0) return 0;
    const int64_t mis = (int64_t)(reinterpret_cast<uintptr_t>(p) & 15u);
    return (mis + len + kVecChunk - 1) / kVecChunk;
}

constexpr int64_t kMaxGrid = 1 << 30;

int64_t grid_for(int64_t units) { return units < kMaxGrid ? units : kMaxGrid; }

enum { MODE_QUANTIZE = 0, MODE_PARTIAL = 1, MODE_APPLY = 2 };
enum { CAST_NONE = 0, CAST_ALL = 1, CAST_INSIDE = 2, CAST_OUTSIDE = 3 };

/* One weight restricted to the flat range [lo, hi) (the whole tensor for
 * quantize). Mirrors mxs__host_job. */
struct TileJob {
    int64_t rows, cols, lo, hi;
    const void *src; /* src element 0 is flat index src_base */
    int64_t src_base;
    int src_dtype, round_through, rounding;
    unsigned planes;
    int mode, cast;
    int vec; /* fast path: cols % 8 == 0, 16-byte src chunks, 8-byte out chunks */
    int pad; /* write the padding entries of the scale planes (quantize, non-compact) */
    uint8_t *out[2];
    int64_t out_base[2];
    mxs_scale_geom geom[2];
    uint8_t *scale[2]; /* QUANTIZE/PARTIAL: written; APPLY: read */
};

/* Which tiles of an item a launch visits. */
enum { TILES_GROUPS = 0, TILES_EDGE_GROUPS = 1, TILES_EDGE_TILES = 2 };

/* One item of a writeback launch (device copy lives in the workspace). */
struct WbItem {
    TileJob job;
    int64_t unit_begin; /* first work unit of this item in the launch */
    int64_t tile_units, extra_units;
    int64_t T; /* tile columns: ceil(cols/128) */
    int tile_mode;
    int64_t g_first, g_last;   /* TILES_GROUPS: see below; EDGE_GROUPS: g_first, g_last */
    /* Partial: groups [ga, gb) lie wholly inside the shard; their first
     * T_int tile columns are whole 32 x 128 tiles (in a last group of fewer
     * than 32 rows: its rows x 128) on the vector path and go
     * to the interior kernel (int_units of them, from int_begin). The general
     * kernel takes groups [g_first, ga), [gb, g_last] and the tile columns
     * >= T_int of [ga, gb). Without interior tiles ga = gb = g_last + 1. */
    int64_t ga, gb, T_int, int_units, int_begin;
    /* TILES_EDGE_TILES: (g, t) of the (1 or 2) tiles to visit;
     * TILES_EDGE_GROUPS: tile_a[0], tile_b[0]: the (1 or 2) groups to visit */
    int64_t tile_a[2], tile_b[2];
    /* partial: up to 4 packed byte ranges to zero (outside the touched groups) */
    uint8_t *zero_ptr[4];
    int64_t zero_len[4];
    /* apply: scatter of the reduced exponents into the primary's planes */
    uint8_t *dst_scale[2];
    mxs_scale_geom dst_geom[2];
    int64_t scatter_units[2];
};

/* Round-through as the host engine applies it (mxs__host_load): only when it
 * changes the source type. */
__host__ __device__ inline int effective_round_through(int src, int rt) {
    return (rt == MXS_F32 || rt == src) ? MXS_F32 : rt;
}

/* The compact record of a writeback item (144 B instead of the 512 B of
 * WbItem): what cannot be recomputed cheaply - the pointers, the shape and
 * shard, the packed offsets, the unit prefixes and the results of the
 * divisions by cols (shard groups, interior groups, edge tiles). wb_expand
 * rebuilds the WbItem from it with constant divisors and the geometry
 * functions of the headers: on the host for every batch, and per CTA (into
 * shared memory) for batches of up to kLiteMax items, whose compact table
 * travels as ONE __grid_constant__ parameter block. */
enum { LITE_VEC = 1, LITE_FRAG0 = 2, LITE_FRAG1 = 4 };
struct WbLite {
    const void *src;
    uint8_t *out[2];       /* fragment or primary data */
    uint8_t *dst_scale[2]; /* primary scale planes (apply) */
    int64_t rows, cols, start, len;
    int64_t ro, co; /* offsets in the packed buffer */
    int64_t unit_begin, int_begin;
    /* TILES_GROUPS: g_first, g_last, ga, gb; TILES_EDGE_TILES: tile_a[0],
     * tile_a[1], tile_b[0], tile_b[1]; TILES_EDGE_GROUPS: tile_a[0], -,
     * tile_b[0], - */
    int64_t u[4];
    uint8_t dtype, dirs, layout, tile_mode, n_edge, flags, pad_[2];
};
/* Batch-level fields of a compact table. */
struct WbHdr {
    uint8_t *packed;
    int round_through, rounding, fused, pad_;
};

/* Rebuilds the item from its compact record. *w must be zeroed. The same
 * code on host and device, so the items are identical. */
__host__ __device__ inline void wb_expand(const WbLite &L, const WbHdr &H, int mode, WbItem *w) {
    TileJob &J = w->job;
    J.rows = L.rows;
    J.cols = L.cols;
    J.lo = L.start;
    J.hi = L.start + L.len;
    J.src = L.src;
    J.src_base = L.start;
    J.src_dtype = L.dtype;
    J.round_through = effective_round_through(L.dtype, H.round_through);
    J.rounding = H.rounding;
    J.planes = L.dirs;
    J.mode = mode;
    const bool fused = H.fused != 0;
    J.cast = mode == MODE_PARTIAL ? (fused ? CAST_INSIDE : CAST_NONE) : (fused ? CAST_OUTSIDE : CAST_ALL);
    J.out[0] = L.out[0];
    J.out_base[0] = (L.flags & LITE_FRAG0) ? L.start : 0;
    J.out[1] = L.out[1];
    J.out_base[1] = (L.flags & LITE_FRAG1) ? L.start : 0;
    for (int p = 0; p < 2; p++) {
        if (!(L.dirs & (unsigned)(p + 1))) continue;
        mxs_scale_geom_make(L.rows, L.cols, (mxs_dirs)(p + 1), MXS_SCALES_COMPACT, &J.geom[p]);
        J.scale[p] = H.packed + (p == 0 ? L.ro : L.co);
    }
    J.vec = (L.flags & LITE_VEC) ? 1 : 0;
    w->T = mxs_ceil_div(L.cols, kTileCols);
    w->tile_mode = L.tile_mode;
    w->unit_begin = L.unit_begin;
    w->int_begin = L.int_begin;
    if (L.tile_mode == TILES_GROUPS) {
        w->g_first = L.u[0];
        w->g_last = L.u[1];
        w->ga = L.u[2];
        w->gb = L.u[3];
        if (w->gb > w->ga) {
            w->T_int = L.cols / kTileCols;
            w->int_units = (w->gb - w->ga) * w->T_int;
        }
        w->tile_units = (w->g_last - w->g_first + 1) * w->T - w->int_units;
    } else if (L.tile_mode == TILES_EDGE_TILES) {
        w->tile_a[0] = L.u[0];
        w->tile_a[1] = L.u[1];
        w->tile_b[0] = L.u[2];
        w->tile_b[1] = L.u[3];
        w->tile_units = L.n_edge;
    } else {
        w->tile_a[0] = L.u[0];
        w->tile_b[0] = L.u[2];
        w->tile_units = L.n_edge * w->T;
    }
    if (mode == MODE_PARTIAL) {
        /* zero what the touched groups' tiles do not write */
        const int64_t gfirst = w->g_first, gcount = w->g_last - w->g_first + 1;
        uint8_t *packed = H.packed;
        int q = 0;
        if (L.dirs & MXS_ROWWISE) {
            int64_t K = J.geom[0].K, rb = gfirst * MXS_BLOCK;
            int64_t re = (gfirst + gcount) * MXS_BLOCK;
            re = gcount == 0 ? 0 : (re < L.rows ? re : L.rows);
            if (gcount == 0) rb = 0;
            w->zero_ptr[q] = packed + L.ro;
            w->zero_len[q++] = rb * K;
            w->zero_ptr[q] = packed + L.ro + re * K;
            w->zero_len[q++] = (L.rows - re) * K;
        }
        if (L.dirs & MXS_COLWISE) {
            int64_t Kc = J.geom[1].K, gb = gcount == 0 ? 0 : gfirst, ge = gcount == 0 ? 0 : gfirst + gcount;
            w->zero_ptr[q] = packed + L.co;
            w->zero_len[q++] = gb * L.cols;
            w->zero_ptr[q] = packed + L.co + ge * L.cols;
            w->zero_len[q++] = (Kc - ge) * L.cols;
        }
        w->extra_units = 0;
        for (int k = 0; k < q; k++) w->extra_units += vec_units(w->zero_ptr[k], w->zero_len[k]);
    } else {
        for (int p = 0; p < 2; p++) {
            if (!(L.dirs & (unsigned)(p + 1))) continue;
            w->dst_scale[p] = L.dst_scale[p];
            mxs_scale_geom_make(L.rows, L.cols, (mxs_dirs)(p + 1), (mxs_scale_layout)L.layout, &w->dst_geom[p]);
            w->scatter_units[p] = vec_units(w->dst_scale[p], mxs_scale_geom_bytes(&w->dst_geom[p]));
        }
        w->extra_units = w->scatter_units[0] + w->scatter_units[1];
    }
}

/* ---- loads ---------------------------------------------------------------- */

__device__ __forceinline__ float ld_elem(const void *src, int dtype, int64_t i) {
    return mxs_load_f32(src, (mxs_dtype)dtype, i);
}

/* Widens 8 elements loaded as raw 16-byte words (f32: two words). */
__device__ __forceinline__ void unpack8(float *x, const uint4 *raw, int dtype) {
    if (dtype == MXS_F32) {
        x[0] = __uint_as_float(raw[0].x); x[1] = __uint_as_float(raw[0].y);
        x[2] = __uint_as_float(raw[0].z); x[3] = __uint_as_float(raw[0].w);
        x[4] = __uint_as_float(raw[1].x); x[5] = __uint_as_float(raw[1].y);
        x[6] = __uint_as_float(raw[1].z); x[7] = __uint_as_float(raw[1].w);
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

__device__ __forceinline__ bool cast_selected(int cast, bool inside) {
    return cast == CAST_ALL || (cast == CAST_INSIDE && inside) || (cast == CAST_OUTSIDE && !inside);
}

/* ---- the tile --------------------------------------------------------------- */

struct TileSmem {
    float amax[kTY][kTileCols];
    float mult[kTileCols];
};

/* MODE: compile-time job mode; PLANES: compile-time plane set (0: J.planes). */
template <int MODE, unsigned PLANES = 0>
__device__ __forceinline__ void run_tile(const TileJob &J, int64_t g, int64_t t, TileSmem &sm) {
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
    if (do_col && J.cast >= CAST_INSIDE) {
        for (int k = 0; k < (int)nvalid; k++) {
            int64_t first = r0 * cols + c + k, last = r_last * cols + c + k;
            if (first >= lo && last < hi) col_inside |= 1u << k;
        }
    }
    const unsigned col_sel = !do_col ? 0u
                             : J.cast == CAST_ALL ? valid
                             : J.cast == CAST_INSIDE ? col_inside
                             : J.cast == CAST_OUTSIDE ? (valid & ~col_inside) : 0u;

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
        if (MODE == MODE_QUANTIZE || (f >= lo && f + nvalid <= hi)) {
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
            row_cast[i] = (MODE == MODE_QUANTIZE || cast_selected(J.cast, b0 >= lo && b1 <= hi)) ? m : 0u;
        }
        col_cast[i] = m & col_sel;
        const unsigned need = mode == MODE_APPLY ? (row_cast[i] | col_cast[i]) : m;
        if (need == 0u) continue;
        const int64_t e = f - J.src_base;
        if (J.vec && need == 0xFFu) {
            vrow[i] = true;
            if (dtype == MXS_F32) {
                const uint4 *p = reinterpret_cast<const uint4 *>(static_cast<const float *>(J.src) + e);
                raw[i][0] = __ldg(p);
                raw[i][1] = __ldg(p + 1);
            } else {
                raw[i][0] = __ldg(reinterpret_cast<const uint4 *>(static_cast<const uint16_t *>(J.src) + e));
            }
        } else {
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
            if (mode == MODE_APPLY) {
                if (row_cast[i] != 0u) e = J.scale[0][mxs_scale_geom_offset(&G, r, kb)];
            } else {
                float a = 0.0f;
#pragma unroll
                for (int k = 0; k < 8; k++) a = mxs_amax_step(a, x[i][k]);
                a = fmaxf(a, __shfl_xor_sync(0xFFFFFFFFu, a, 1));
                a = fmaxf(a, __shfl_xor_sync(0xFFFFFFFFu, a, 2));
                e = mxs_e8m0_from_amax(a, (mxs_rounding)J.rounding);
                if ((tx & 3) == 0) {
                    if (logical) J.scale[0][mxs_scale_geom_offset(&G, r, kb)] = e;
                    else if (J.pad) J.scale[0][mxs_scale_geom_offset(&G, r, kb)] = 0;
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
        if (mode != MODE_APPLY) {
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
            if (mode == MODE_APPLY) {
                if (cc < cols) e = J.scale[1][mxs_scale_geom_offset(&G, cc, g)];
            } else {
                float a = 0.0f;
#pragma unroll
                for (int y = 0; y < kTY; y++) a = fmaxf(a, sm.amax[y][tid]);
                e = mxs_e8m0_from_amax(a, (mxs_rounding)J.rounding);
                if (cc < cols) J.scale[1][mxs_scale_geom_offset(&G, cc, g)] = e;
                else if (J.pad) J.scale[1][mxs_scale_geom_offset(&G, cc, g)] = 0;
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
    if (J.cast == CAST_NONE) return;
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

/* ---- scale scatter: dst bytes [off0, off0 + n) of a plane in any layout,
 * from src in any layout; padding entries 0x00. Every dst byte once. ---- */
__device__ void scatter_chunk(uint8_t *dst, const mxs_scale_geom &gd, const uint8_t *src, const mxs_scale_geom &gs,
                              int64_t off0, int64_t n) {
    if (gd.layout == MXS_SCALES_COMPACT) {
        for (int64_t o = threadIdx.x; o < n; o += kThreads) {
            int64_t off = off0 + o, m, k;
            if (gs.layout == MXS_SCALES_COMPACT) {
                dst[off] = src[off];
            } else {
                mxs_scale_geom_coords(&gd, off, &m, &k);
                dst[off] = src[mxs_scale_geom_offset(&gs, m, k)];
            }
        }
        return;
    }
    /* PADDED / SWIZZLED: the plane is a multiple of 4 bytes and 4 aligned
     * bytes are (m, k..k+3) - or (m..m+3, k) for the padded column plane. */
    const bool step_m = gd.layout == MXS_SCALES_PADDED && gd.colwise;
    for (int64_t o = threadIdx.x * 4; o < n; o += kThreads * 4) {
        int64_t off = off0 + o, m, k;
        mxs_scale_geom_coords(&gd, off, &m, &k);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int64_t mj = step_m ? m + j : m, kj = step_m ? k : k + j;
            dst[off + j] = mxs_scale_geom_is_logical(&gd, mj, kj) ? src[mxs_scale_geom_offset(&gs, mj, kj)] : 0;
        }
    }
}

/* ---- writeback zero-fill / scale scatter in 16-byte vectors ----
 * Unit `unit` of a range [p, p + len): thread vectors at address offsets
 * v = unit * kVecChunk + (s * kThreads + tid) * 16 from p - (p % 16), i.e.
 * range offsets off = v - p % 16. A vector wholly inside the range is one
 * 16-byte store; the (at most two) partial vectors at the ends are stored
 * byte by byte. Every byte of the range is written exactly once. */
__device__ __forceinline__ void zero_vec_unit(uint8_t *p, int64_t len, int64_t unit) {
    const int64_t mis = (int64_t)(reinterpret_cast<uintptr_t>(p) & 15u);
#pragma unroll
    for (int s = 0; s < kVecPerThread; s++) {
        const int64_t off = unit * kVecChunk + (int64_t)(s * kThreads + threadIdx.x) * 16 - mis;
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
#pragma unroll 1
    for (int s = 0; s < kVecPerThread; s++) {
        const int64_t off = unit * kVecChunk + (int64_t)(s * kThreads + threadIdx.x) * 16 - mis;
        if (off >= 0 && off + 16 <= bytes) {
            uint4 v;
            if (copy) {
                v = ld16_any(src + off);
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
                            const uint32_t b = mxs_scale_geom_is_logical(&gd, mj, kj)
                                                   ? src[mxs_scale_geom_offset(&gs, mj, kj)]
                                                   : 0u;
                            word |= b << (8 * j);
                        }
                    } else {
                        for (int j = 0; j < 4; j++) word |= (uint32_t)scale_byte(gd, src, gs, off + 4 * q + j) << (8 * j);
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

/* ---- kernels ------------------------------------------------------------------ */

/* Quantize, the tiles the interior kernel below does not take: with
 * T_int x G_int interior tiles, first the right strip (groups < G_int,
 * tile columns >= T_int), then every tile of the groups >= G_int. */
template <unsigned PLANES>
__global__ void __launch_bounds__(kThreads) quantize_kernel(const __grid_constant__ TileJob J, int64_t T, int64_t units,
                                                           int64_t G_int, int64_t T_int) {
    __shared__ TileSmem sm;
    const int64_t strip = G_int * (T - T_int);
    for (int64_t u = blockIdx.x; u < units; u += gridDim.x) {
        if (u < strip) run_tile<MODE_QUANTIZE, PLANES>(J, u / (T - T_int), T_int + u % (T - T_int), sm);
        else run_tile<MODE_QUANTIZE, PLANES>(J, G_int + (u - strip) / T, (u - strip) % T, sm);
    }
}

/* An interior tile: all 32 rows and 128 columns exist and lie in [lo, hi),
 * vector path, no padding entries to write. The same tile as run_tile
 * (exponents from the amaxes, every element cast) without masks or bounds:
 * straight-line code, few registers, every load of the tile in flight at
 * once. Serves quantize and the fused partial (its blocks are all inside). */
template <int DTYPE, unsigned PLANES, bool CLIP = false>
__device__ __forceinline__ void interior_tile(const TileJob &J, int64_t g, int64_t t, TileSmem &sm) {
    /* CLIP: the tile may be in the last group with fewer than 32 rows; the
     * missing rows read as 0 and are neither stored nor scaled, as in
     * run_tile (which also counts them as 0 in the column amax). */
    const unsigned planes = PLANES ? PLANES : J.planes;
    const bool do_row = (planes & MXS_ROWWISE) != 0, do_col = (planes & MXS_COLWISE) != 0;
    const int tid = threadIdx.x, tx = tid % kTX, ty = tid / kTX;
    const int64_t cols = J.cols;
    const int64_t r0 = g * MXS_BLOCK + ty, c = t * kTileCols + tx * 8, kb = c / MXS_BLOCK;
    uint4 raw[kRPT][2];
    bool rok[kRPT];
#pragma unroll
    for (int i = 0; i < kRPT; i++) {
        rok[i] = !CLIP || r0 + i * kTY < J.rows;
        const int64_t e = (r0 + i * kTY) * cols + c - J.src_base;
        if (CLIP && !rok[i]) {
            raw[i][0] = raw[i][1] = make_uint4(0u, 0u, 0u, 0u);
        } else if (DTYPE == MXS_F32) {
            const uint4 *p = reinterpret_cast<const uint4 *>(static_cast<const float *>(J.src) + e);
            raw[i][0] = __ldg(p);
            raw[i][1] = __ldg(p + 1);
        } else {
            raw[i][0] = __ldg(reinterpret_cast<const uint4 *>(static_cast<const uint16_t *>(J.src) + e));
        }
    }
    float x[kRPT][8];
#pragma unroll
    for (int i = 0; i < kRPT; i++) {
        unpack8(x[i], raw[i], DTYPE);
        round_through8(x[i], J.round_through);
    }
    float mult_row[kRPT];
    if (do_row) {
#pragma unroll
        for (int i = 0; i < kRPT; i++) {
            float a = 0.0f;
#pragma unroll
            for (int k = 0; k < 8; k++) a = mxs_amax_step(a, x[i][k]);
            a = fmaxf(a, __shfl_xor_sync(0xFFFFFFFFu, a, 1));
            a = fmaxf(a, __shfl_xor_sync(0xFFFFFFFFu, a, 2));
            const uint8_t e = mxs_e8m0_from_amax(a, (mxs_rounding)J.rounding);
            if ((tx & 3) == 0 && rok[i]) J.scale[0][mxs_scale_geom_offset(&J.geom[0], r0 + i * kTY, kb)] = e;
            mult_row[i] = mxs_e8m0_quant_mult(e);
        }
    }
    float mult_col[8];
    if (do_col) {
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
        if (do_row) {
            float m8[8];
#pragma unroll
            for (int k = 0; k < 8; k++) m8[k] = mult_row[i];
            *reinterpret_cast<uint2 *>(J.out[0] + (f - J.out_base[0])) = quantize8(x[i], m8);
        }
        if (do_col) *reinterpret_cast<uint2 *>(J.out[1] + (f - J.out_base[1])) = quantize8(x[i], mult_col);
    }
}

template <int DTYPE, unsigned PLANES>
__global__ void __launch_bounds__(kThreads) quantize_interior_kernel(const __grid_constant__ TileJob J, uint32_t T_int,
                                                                    uint32_t units) {
    __shared__ TileSmem sm;
    for (uint32_t u = blockIdx.x; u < units; u += gridDim.x) {
        const uint32_t g = u / T_int, t = u - g * T_int;
        interior_tile<DTYPE, PLANES>(J, g, t, sm);
    }
}

template <int DTYPE>
void launch_interior(const TileJob &J, uint32_t T_int, uint32_t units, cudaStream_t stream) {
    const unsigned grid = (unsigned)grid_for(units);
    if (J.planes == MXS_ROWWISE)
        quantize_interior_kernel<DTYPE, MXS_ROWWISE><<<grid, kThreads, 0, stream>>>(J, T_int, units);
    else if (J.planes == MXS_COLWISE)
        quantize_interior_kernel<DTYPE, MXS_COLWISE><<<grid, kThreads, 0, stream>>>(J, T_int, units);
    else
        quantize_interior_kernel<DTYPE, MXS_BOTH><<<grid, kThreads, 0, stream>>>(J, T_int, units);
}

/* A table field in the search: GTAB (table in the workspace) through the
 * read-only path, so the ~log2(n) probes of every CTA hit L1 after the
 * first CTAs of an SM; else a parameter (constant bank) read. */
template <bool GTAB> __device__ __forceinline__ int64_t tab_ld(const int64_t *p) {
    if (GTAB) return __ldg(p);
    return *p;
}

/* Partial zero-fill: unit `local` of the item's 4 ranges' units, in order. */
__device__ __forceinline__ void zero_unit(const WbItem &it, int64_t local) {
    for (int q = 0; q < 4; q++) {
        const int64_t nu = vec_units(it.zero_ptr[q], it.zero_len[q]);
        if (local < nu) {
            zero_vec_unit(it.zero_ptr[q], it.zero_len[q], local);
            return;
        }
        local -= nu;
    }
}

/* Unit `local` of item `it` (general kernel). */
template <int MODE, unsigned PLANES>
__device__ __forceinline__ void wb_unit(const WbItem &it, int64_t local, TileSmem &sm) {
    const TileJob &job = it.job;
    if (local < it.tile_units) {
        int64_t g, t;
        if (it.tile_mode == TILES_EDGE_TILES) {
            g = local == 0 ? it.tile_a[0] : it.tile_b[0];
            t = local == 0 ? it.tile_a[1] : it.tile_b[1];
        } else {
            if (it.tile_mode == TILES_EDGE_GROUPS) {
                int64_t gi = local / it.T;
                t = local % it.T;
                g = gi == 0 ? it.tile_a[0] : it.tile_b[0];
            } else {
                const int64_t A = (it.ga - it.g_first) * it.T, B = (it.g_last + 1 - it.gb) * it.T;
                if (local < A) {
                    g = it.g_first + local / it.T;
                    t = local % it.T;
                } else if (local < A + B) {
                    g = it.gb + (local - A) / it.T;
                    t = (local - A) % it.T;
                } else {
                    const int64_t strip = it.T - it.T_int;
                    g = it.ga + (local - A - B) / strip;
                    t = it.T_int + (local - A - B) % strip;
                }
            }
        }
        run_tile<MODE, PLANES>(job, g, t, sm);
        return;
    }
    local -= it.tile_units;
    if (MODE == MODE_PARTIAL) {
        zero_unit(it, local);
    } else {
        int p = local < it.scatter_units[0] ? 0 : 1;
        if (p == 1) local -= it.scatter_units[0];
        scatter_vec_unit(it.dst_scale[p], it.dst_geom[p], job.scale[p], job.geom[p],
                         mxs_scale_geom_bytes(&it.dst_geom[p]), local);
    }
}

/* Interior tile `local` of item `it`. */
template <unsigned PLANES>
__device__ __forceinline__ void wb_interior_unit(const WbItem &it, int64_t local, TileSmem &sm) {
    const int64_t g = it.ga + local / it.T_int, t = local % it.T_int;
    switch (it.job.src_dtype) {
    case MXS_F32: interior_tile<MXS_F32, PLANES, true>(it.job, g, t, sm); break;
    case MXS_BF16: interior_tile<MXS_BF16, PLANES, true>(it.job, g, t, sm); break;
    default: interior_tile<MXS_F16, PLANES, true>(it.job, g, t, sm); break;
    }
}

template <int MODE, unsigned PLANES, bool GTAB>
__device__ __forceinline__ void wb_body(const WbItem *items, int64_t n_items, int64_t units, TileSmem &sm) {
    for (int64_t u = blockIdx.x; u < units; u += gridDim.x) {
        int64_t a = 0, b = n_items - 1; /* last item with unit_begin <= u */
        while (a < b) {
            int64_t mid = (a + b + 1) / 2;
            if (tab_ld<GTAB>(&items[mid].unit_begin) <= u) a = mid;
            else b = mid - 1;
        }
        wb_unit<MODE, PLANES>(items[a], u - items[a].unit_begin, sm);
    }
}

/* The interior tiles of a fused partial (see WbItem::ga): units
 * [0, units). When no item has general-kernel tiles (tile_units == 0, so
 * unit_begin counts zero-fill units only), the partial's zero-fill runs here
 * too, as units [units, units + zero_units): one launch instead of two. */
template <unsigned PLANES, bool GTAB>
__device__ __forceinline__ void wb_interior_body(const WbItem *items, int64_t n_items, int64_t units,
                                                 int64_t zero_units, TileSmem &sm) {
    for (int64_t u = blockIdx.x; u < units + zero_units; u += gridDim.x) {
        if (u >= units) {
            const int64_t z = u - units;
            int64_t a = 0, b = n_items - 1; /* last item with unit_begin <= z */
            while (a < b) {
                int64_t mid = (a + b + 1) / 2;
                if (tab_ld<GTAB>(&items[mid].unit_begin) <= z) a = mid;
                else b = mid - 1;
            }
            zero_unit(items[a], z - tab_ld<GTAB>(&items[a].unit_begin));
            continue;
        }
        int64_t a = 0, b = n_items - 1; /* last item with int_begin <= u */
        while (a < b) {
            int64_t mid = (a + b + 1) / 2;
            if (tab_ld<GTAB>(&items[mid].int_begin) <= u) a = mid;
            else b = mid - 1;
        }
        wb_interior_unit<PLANES>(items[a], u - items[a].int_begin, sm);
    }
}

template <unsigned PLANES>
__global__ void __launch_bounds__(kThreads) wb_interior_kernel(const WbItem *items, int64_t n_items, int64_t units,
                                                               int64_t zero_units) {
    __shared__ TileSmem sm;
    wb_interior_body<PLANES, true>(items, n_items, units, zero_units, sm);
}

/* The item table in the workspace (any batch size)... */
template <int MODE, unsigned PLANES>
__global__ void __launch_bounds__(kThreads, 4) wb_kernel(const WbItem *items, int64_t n_items, int64_t units) {
    __shared__ TileSmem sm;
    wb_body<MODE, PLANES, true>(items, n_items, units, sm);
}

/* ...or, for batches of up to N items, in the kernel parameters (no copy
 * before the launch; __grid_constant__: read in place, never copied). */
template <int N> struct WbInline {
    WbItem items[N];
};
/* Kernel parameters may take 32764 bytes (CUDA 12.1+, Volta+). */
constexpr int kInlineSmall = 4;
constexpr int kInlineMax = (int)(30000 / sizeof(WbItem));
static_assert(sizeof(WbItem) % 4 == 0, "WbItem is copied as 32-bit words");
/* Stores n items of a parameter table into the workspace. */
__global__ void __launch_bounds__(kThreads) table_store(const __grid_constant__ WbInline<kInlineMax> P, WbItem *dst,
                                                        int64_t n) {
    const uint32_t *src = reinterpret_cast<const uint32_t *>(P.items);
    uint32_t *out = reinterpret_cast<uint32_t *>(dst);
    const int64_t words = n * (int64_t)(sizeof(WbItem) / 4);
    for (int64_t k = threadIdx.x; k < words; k += kThreads) out[k] = src[k];
}

template <int MODE, unsigned PLANES, int N>
__global__ void __launch_bounds__(kThreads, 4) wb_kernel_inline(const __grid_constant__ WbInline<N> P, int64_t n_items,
                                                             int64_t units) {
    __shared__ TileSmem sm;
    wb_body<MODE, PLANES, false>(P.items, n_items, units, sm);
}

template <unsigned PLANES, int N>
__global__ void __launch_bounds__(kThreads) wb_interior_kernel_inline(const __grid_constant__ WbInline<N> P,
                                                                     int64_t n_items, int64_t units,
                                                                     int64_t zero_units) {
    __shared__ TileSmem sm;
    wb_interior_body<PLANES, false>(P.items, n_items, units, zero_units, sm);
}

/* ...or, for batches of up to kLiteMax items, as a compact table (WbLite)
 * in the kernel parameters: each CTA rebuilds its item in shared memory
 * (wb_expand, one thread) - no table in the workspace, no extra launch. */
template <int N> struct WbLiteTab {
    WbHdr h;
    WbLite items[N];
};
/* Kernel parameters may take 32764 bytes (CUDA 12.1+, Volta+); the
 * launches below add 24 bytes of scalars. */
constexpr int kLiteMax = (int)((32764 - 64 - sizeof(WbHdr)) / sizeof(WbLite));
static_assert(sizeof(WbLite) == 144, "compact record");
static_assert(kLiteMax >= 200, "a 200-item batch fits one parameter block");

/* last item with (INT ? int_begin : unit_begin) <= u */
template <bool INT>
__device__ __forceinline__ int64_t lite_find(const WbLite *items, int64_t n_items, int64_t u) {
    int64_t a = 0, b = n_items - 1;
    while (a < b) {
        const int64_t mid = (a + b + 1) / 2;
        if ((INT ? items[mid].int_begin : items[mid].unit_begin) <= u) a = mid;
        else b = mid - 1;
    }
    return a;
}

/* Rebuilds item L into the CTA's shared item (every thread calls it). */
__device__ __forceinline__ void lite_load(const WbLite &L, const WbHdr &H, int mode, WbItem &it) {
    __syncthreads(); /* the previous unit is done with `it` */
    uint32_t *w = reinterpret_cast<uint32_t *>(&it);
    for (int k = threadIdx.x; k < (int)(sizeof(WbItem) / 4); k += kThreads) w[k] = 0u;
    __syncthreads();
    if (threadIdx.x == 0) wb_expand(L, H, mode, &it);
    __syncthreads();
}

template <int MODE, unsigned PLANES, int N>
__global__ void __launch_bounds__(kThreads, 4) wb_kernel_lite(const __grid_constant__ WbLiteTab<N> P, int64_t n_items,
                                                           int64_t units) {
    __shared__ TileSmem sm;
    __shared__ WbItem it;
    for (int64_t u = blockIdx.x; u < units; u += gridDim.x) {
        const int64_t a = lite_find<false>(P.items, n_items, u);
        lite_load(P.items[a], P.h, MODE, it);
        wb_unit<MODE, PLANES>(it, u - it.unit_begin, sm);
    }
}

template <unsigned PLANES, int N>
__global__ void __launch_bounds__(kThreads) wb_interior_kernel_lite(const __grid_constant__ WbLiteTab<N> P,
                                                                   int64_t n_items, int64_t units, int64_t zero_units) {
    __shared__ TileSmem sm;
    __shared__ WbItem it;
    for (int64_t u = blockIdx.x; u < units + zero_units; u += gridDim.x) {
        if (u >= units) {
            const int64_t z = u - units;
            lite_load(P.items[lite_find<false>(P.items, n_items, z)], P.h, MODE_PARTIAL, it);
            zero_unit(it, z - it.unit_begin);
            continue;
        }
        lite_load(P.items[lite_find<true>(P.items, n_items, u)], P.h, MODE_PARTIAL, it);
        wb_interior_unit<PLANES>(it, u - it.int_begin, sm);
    }
}

__global__ void __launch_bounds__(kThreads) convert_kernel(uint8_t *dst, mxs_scale_geom gd, const uint8_t *src,
                                                          mxs_scale_geom gs, int64_t bytes, int64_t units) {
    for (int64_t u = blockIdx.x; u < units; u += gridDim.x) {
        int64_t off0 = u * kChunkBytes;
        scatter_chunk(dst, gd, src, gs, off0, bytes - off0 < kChunkBytes ? bytes - off0 : kChunkBytes);
    }
}

__global__ void __launch_bounds__(256) dequantize_kernel(const uint8_t *data, const uint8_t *scale, mxs_scale_geom g,
                                                         int64_t cols, int64_t elems, void *dst, int dtype) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < elems; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / cols, c = i % cols;
        uint8_t e = scale[mxs_scale_geom_offset(&g, mxs_scale_m(&g, r, c), mxs_scale_k(&g, r, c))];
        float v = mxs_dequantize_elem(data[i], e);
        if (dtype == MXS_F32) static_cast<float *>(dst)[i] = v;
        else if (dtype == MXS_BF16) static_cast<uint16_t *>(dst)[i] = mxs_bf16_from_f32(v);
        else static_cast<uint16_t *>(dst)[i] = mxs_f16_from_f32(v);
    }
}

/* ---- host helpers ---------------------------------------------------------------- */


bool aligned(const void *p, uintptr_t a) { return (reinterpret_cast<uintptr_t>(p) % a) == 0; }

mxs_status launch_status() { return cudaGetLastError() == cudaSuccess ? MXS_OK : MXS_ERR_CUDA; }


/* The compact record of one writeback item for `mode` (PARTIAL or APPLY):
 * the divisions by cols happen here, once, on the host. ro / co: the item's
 * offsets in the packed buffer (row-wise, column-wise). */
void lite_make(const mxs_wb_batch *b, const mxs_wb_item *in, int mode, int64_t ro, int64_t co, WbLite *L) {
    const mxs_tensor *t = &in->primary;
    memset(L, 0, sizeof *L);
    L->src = in->master;
    L->out[0] = in->row_fragment ? in->row_fragment : t->row_data;
    L->out[1] = in->col_fragment ? in->col_fragment : t->col_data;
    L->dst_scale[0] = t->row_scale;
    L->dst_scale[1] = t->col_scale;
    L->rows = t->rows;
    L->cols = t->cols;
    L->start = in->start;
    L->len = in->len;
    L->ro = ro;
    L->co = co;
    L->dtype = (uint8_t)in->master_dtype;
    L->dirs = (uint8_t)t->dirs;
    L->layout = (uint8_t)t->scale_layout;
    const bool fused = b->mode == MXS_WB_FUSED;
    bool vec = t->cols % 8 == 0 && in->start % 8 == 0 && (in->len == 0 || aligned(in->master, 16));
    for (int p = 0; p < 2; p++)
        if (t->dirs & (unsigned)(p + 1)) vec = vec && aligned(L->out[p], 8);
    L->flags = (uint8_t)((vec ? LITE_VEC : 0) | (in->row_fragment ? LITE_FRAG0 : 0) | (in->col_fragment ? LITE_FRAG1 : 0));

    const mxs_range gr = mxs_shard_groups(t->cols, in->start, in->len);
    const int64_t g_first = gr.first, g_last = gr.first + gr.count - 1;
    int64_t ga = g_last + 1, gb = g_last + 1;
    if (mode == MODE_PARTIAL && fused && vec && in->len > 0 && t->cols >= kTileCols) {
        int64_t group_elems;
        if (mxs_mul_ok(t->cols, MXS_BLOCK, &group_elems)) {
            int64_t a = mxs_ceil_div(in->start, group_elems), z = (in->start + in->len) / group_elems;
            z = z < t->rows / MXS_BLOCK ? z : t->rows / MXS_BLOCK;
            /* a last group of fewer than 32 rows is wholly inside when the
             * shard runs to the end; the interior kernel clips its rows */
            if (in->start + in->len == t->rows * t->cols) z = mxs_col_groups(t->rows);
            if (z > a) {
                ga = a;
                gb = z;
            }
        }
    }
    if (mode == MODE_PARTIAL || !fused) {
        L->tile_mode = TILES_GROUPS;
        L->u[0] = g_first;
        L->u[1] = g_last;
        L->u[2] = ga;
        L->u[3] = gb;
    } else if (t->dirs == MXS_ROWWISE) {
        /* fused apply, row-only: only the row blocks of start and end-1 can
         * straddle; visit the (at most two) tiles holding them. */
        L->tile_mode = TILES_EDGE_TILES;
        if (in->len > 0) {
            /* a block that does not straddle has nothing to cast: skip its tile */
            const int64_t a = in->start, z = in->start + in->len - 1;
            const bool sa = !mxs_row_block_inside(t->cols, mxs_row_block_of(t->cols, a), in->start, in->len);
            const bool sz = !mxs_row_block_inside(t->cols, mxs_row_block_of(t->cols, z), in->start, in->len);
            int n = 0;
            if (sa) {
                L->u[2 * n] = (a / t->cols) / MXS_BLOCK;
                L->u[2 * n++ + 1] = (a % t->cols) / kTileCols;
            }
            if (sz) {
                L->u[2 * n] = (z / t->cols) / MXS_BLOCK;
                L->u[2 * n++ + 1] = (z % t->cols) / kTileCols;
            }
            if (n == 2 && L->u[0] == L->u[2] && L->u[1] == L->u[3]) n = 1;
            L->n_edge = (uint8_t)n;
        }
    } else {
        /* fused apply with a column-wise plane: the edge groups that hold a
         * straddling block (a row block of start / end-1 or a column block
         * of g_first / g_last), i.e. whose edge is not a group boundary */
        L->tile_mode = TILES_EDGE_GROUPS;
        if (gr.count > 0) {
            const int64_t cols = t->cols, a = in->start, e = in->start + in->len;
            const bool sa = a % cols != 0 || (a / cols) % MXS_BLOCK != 0;
            const bool sz = e % cols != 0 || (e / cols != t->rows && (e / cols) % MXS_BLOCK != 0);
            int n = 0;
            if (gr.count == 1) {
                if (sa || sz) L->u[2 * n++] = g_first;
            } else {
                if (sa) L->u[2 * n++] = g_first;
                if (sz) L->u[2 * n++] = g_last;
            }
            L->n_edge = (uint8_t)n;
        }
    }
}

/* One phase: the item table in the parameters (small batches: whole items;
 * up to kLiteMax items: compact records) or in the workspace. */
template <int MODE, unsigned PLANES>
void wb_launch(const WbInline<kInlineMax> &tab, const WbLiteTab<kLiteMax> *lite, const WbItem *dev,
               int64_t n_items, int64_t int_units, int64_t units, int64_t tile_units, cudaStream_t stream) {
    const bool is_lite = lite != nullptr;
    /* the small parameter table (kInlineSmall items, ~2 KB) whenever it
     * holds the batch: every launch copies its whole parameter block */
    WbInline<kInlineSmall> small;
    if (n_items <= kInlineSmall) memcpy(small.items, tab.items, (size_t)n_items * sizeof(WbItem));
    if (int_units > 0) {
        /* no general-kernel tiles (partial of group-aligned shards): the
         * zero-fill units ride along in the interior launch */
        const int64_t zu = MODE == MODE_PARTIAL && tile_units == 0 ? units : 0;
        const unsigned ig = (unsigned)grid_for(int_units + zu);
        if (n_items <= kInlineSmall)
            wb_interior_kernel_inline<PLANES, kInlineSmall><<<ig, kThreads, 0, stream>>>(small, n_items, int_units, zu);
        else if (is_lite)
            wb_interior_kernel_lite<PLANES, kLiteMax><<<ig, kThreads, 0, stream>>>(*lite, n_items, int_units, zu);
        else
            wb_interior_kernel<PLANES><<<ig, kThreads, 0, stream>>>(dev, n_items, int_units, zu);
        units -= zu;
    }
    if (units == 0) return;
    const unsigned grid = (unsigned)grid_for(units);
    if (n_items <= kInlineSmall) {
        wb_kernel_inline<MODE, PLANES, kInlineSmall><<<grid, kThreads, 0, stream>>>(small, n_items, units);
    } else if (is_lite) {
        wb_kernel_lite<MODE, PLANES, kLiteMax><<<grid, kThreads, 0, stream>>>(*lite, n_items, units);
    } else {
        wb_kernel<MODE, PLANES><<<grid, kThreads, 0, stream>>>(dev, n_items, units);
    }
}

/* The compact table of the last lite batch of each phase, per host thread.
 * A call with the same batch (every item field, the options, the plan and
 * the packed buffer identical, byte for byte - e.g. the same bucket every
 * optimizer step) reuses it: the plan check and the table build (~30 us of
 * host time for 200 items) are pure functions of exactly these bytes. */
struct LiteCache {
    bool valid = false;
    int rounding = 0, round_through = 0, wb_mode = 0;
    uint8_t *packed = nullptr;
    mxs_wb_plan plan;
    int64_t n_items = 0;
    mxs_wb_item items[kLiteMax]; /* static storage: no allocation, nothing can throw */
    int64_t units = 0, int_units = 0, tile_units = 0;
    bool row_only = true;
    WbLiteTab<kLiteMax> tab;

    bool matches(const mxs_wb_batch *b, const mxs_wb_plan *p, const uint8_t *pk) const {
        return valid && n_items == b->n_items && rounding == (int)b->rounding &&
               round_through == (int)b->round_through && wb_mode == (int)b->mode && packed == pk &&
               memcmp(&plan, p, sizeof plan) == 0 &&
               memcmp(items, b->items, (size_t)n_items * sizeof(mxs_wb_item)) == 0;
    }
};

mxs_status wb_run(const mxs_wb_batch *b, const mxs_wb_plan *plan, uint8_t *packed, void *workspace,
                  int64_t workspace_bytes, cudaStream_t stream, int mode) {
    mxs_status s;
    LiteCache *C = nullptr;
    bool hit = false;
    if (b && plan && b->items && b->n_items > kInlineSmall && b->n_items <= kLiteMax) {
        static thread_local LiteCache cache[2];
        C = &cache[mode == MODE_PARTIAL ? 0 : 1];
        hit = C->matches(b, plan, packed);
    }
    if (!hit) {
        if ((s = mxs__wb_check_plan(b, plan)) != MXS_OK) return s;
        if (!packed && plan->packed_bytes > 0) return MXS_ERR_INVALID_ARGUMENT;
    }
    /* = mxs_cuda_wb_workspace_bytes once the plan checked out (no second
     * pass over the batch) */
    if (b->n_items > INT64_MAX / (int64_t)sizeof(WbItem)) return MXS_ERR_OVERFLOW;
    const int64_t need = b->n_items * (int64_t)sizeof(WbItem);
    if (need > 0 && (!workspace || !aligned(workspace, 16))) return MXS_ERR_INVALID_ARGUMENT;
    if (workspace_bytes < need) return MXS_ERR_BUFFER_SIZE;
    if (b->n_items == 0) return MXS_OK;

    /* Everything is valid. Batches of up to kInlineSmall items travel in the
     * kernel parameters as whole items, up to kLiteMax as compact records;
     * larger ones are built in chunks of kInlineMax on the stack and stored
     * into the workspace by one tiny kernel per chunk (parameters again),
     * then read by the one main launch. */
    WbInline<kInlineMax> tab;
    int64_t units = 0, int_units = 0, tile_units = 0;
    bool row_only = true; /* all items row-only: the row-only kernels */
    WbItem *dev = static_cast<WbItem *>(workspace);
    if (hit) {
        units = C->units;
        int_units = C->int_units;
        tile_units = C->tile_units;
        row_only = C->row_only;
    } else {
        if (C) C->valid = false;
        WbHdr h;
        memset(&h, 0, sizeof h);
        h.packed = packed;
        h.round_through = b->round_through;
        h.rounding = b->rounding;
        h.fused = b->mode == MXS_WB_FUSED;
        if (C) C->tab.h = h;
        int64_t ro = 0, co = plan->row_region_bytes;
        for (int64_t i0 = 0; i0 < b->n_items; i0 += kInlineMax) {
            int64_t n = b->n_items - i0 < kInlineMax ? b->n_items - i0 : kInlineMax;
            for (int64_t j = 0; j < n; j++) {
                const mxs_wb_item *it = &b->items[i0 + j];
                const mxs_tensor *t = &it->primary;
                WbLite tmp;
                WbLite &L = C ? C->tab.items[i0 + j] : tmp;
                lite_make(b, it, mode, ro, co, &L);
                WbItem &w = tab.items[j];
                memset(&w, 0, sizeof w);
                L.unit_begin = units;
                L.int_begin = int_units;
                wb_expand(L, h, mode, &w);
                units += w.tile_units + w.extra_units;
                tile_units += w.tile_units;
                int_units += w.int_units;
                if (t->dirs & MXS_ROWWISE) ro += t->rows * mxs_row_blocks_per_row(t->cols);
                if (t->dirs & MXS_COLWISE) co += mxs_col_groups(t->rows) * t->cols;
                row_only = row_only && t->dirs == MXS_ROWWISE;
            }
            if (b->n_items <= kLiteMax) continue;
            /* a tiny kernel stores this chunk into the workspace: unlike a
             * pageable cudaMemcpyAsync it never waits for the stream */
            table_store<<<1, kThreads, 0, stream>>>(tab, dev + i0, n);
            if (cudaGetLastError() != cudaSuccess) return MXS_ERR_CUDA;
        }
        if (C) {
            C->rounding = (int)b->rounding;
            C->round_through = (int)b->round_through;
            C->wb_mode = (int)b->mode;
            C->packed = packed;
            C->plan = *plan;
            memcpy(C->items, b->items, (size_t)b->n_items * sizeof(mxs_wb_item));
            C->n_items = b->n_items;
            C->units = units;
            C->int_units = int_units;
            C->tile_units = tile_units;
            C->row_only = row_only;
            C->valid = true;
        }
    }
    if (units == 0 && int_units == 0) return MXS_OK;
    const WbLiteTab<kLiteMax> *lite = C ? &C->tab : nullptr; /* set exactly for the lite batches */
    if (mode == MODE_PARTIAL) {
        if (row_only) wb_launch<MODE_PARTIAL, MXS_ROWWISE>(tab, lite, dev, b->n_items, int_units, units, tile_units, stream);
        else wb_launch<MODE_PARTIAL, 0>(tab, lite, dev, b->n_items, int_units, units, tile_units, stream);
    } else {
        if (row_only) wb_launch<MODE_APPLY, MXS_ROWWISE>(tab, lite, dev, b->n_items, int_units, units, tile_units, stream);
        else wb_launch<MODE_APPLY, 0>(tab, lite, dev, b->n_items, int_units, units, tile_units, stream);
    }
    return launch_status();
}

} /* namespace */

/* ---- C ABI -------------------------------------------------------------------------- */

extern "C" {

mxs_status mxs_cuda_quantize(const mxs_tensor *dst, const void *src, mxs_dtype src_dtype, mxs_rounding rounding,
                             cudaStream_t stream) {
    mxs_status s = mxs_quantize_check(dst, src, src_dtype, rounding);
    if (s != MXS_OK) return s;
    TileJob J;
    memset(&J, 0, sizeof J);
    J.rows = dst->rows;
    J.cols = dst->cols;
    J.lo = 0;
    J.hi = dst->rows * dst->cols;
    J.src = src;
    J.src_dtype = src_dtype;
    J.round_through = MXS_F32;
    J.rounding = rounding;
    J.planes = dst->dirs;
    J.mode = MODE_QUANTIZE;
    J.cast = CAST_ALL;
    J.pad = dst->scale_layout != MXS_SCALES_COMPACT;
    J.out[0] = dst->row_data;
    J.out[1] = dst->col_data;
    J.scale[0] = dst->row_scale;
    J.scale[1] = dst->col_scale;
    bool vec = dst->cols % 8 == 0 && aligned(src, 16);
    for (int p = 0; p < 2; p++) {
        if (!(dst->dirs & (unsigned)(p + 1))) continue;
        mxs_scale_geom_make(dst->rows, dst->cols, (mxs_dirs)(p + 1), dst->scale_layout, &J.geom[p]);
        vec = vec && aligned(J.out[p], 8);
    }
    J.vec = vec;
    /* Interior tiles (whole 32 x 128 tiles, vector path, and not in the
     * last group when padding entries must be written) go to the lean
     * kernel; the rest, if any, to the general one: each tile is read once,
     * 1 launch for shapes that are multiples of 32 x 128, else 2. */
    const int64_t T = mxs_ceil_div(dst->cols, kTileCols), G = mxs_col_groups(dst->rows), units = G * T;
    int64_t T_int = vec ? dst->cols / kTileCols : 0, G_int = vec ? dst->rows / MXS_BLOCK : 0;
    if (J.pad && G_int == G) G_int--;
    if (G_int * T_int > (int64_t)UINT32_MAX) G_int = T_int = 0;
    if (G_int <= 0 || T_int <= 0) G_int = T_int = 0;
    const int64_t interior = G_int * T_int, rest = units - interior;
    if (interior > 0) {
        if (src_dtype == MXS_F32) launch_interior<MXS_F32>(J, (uint32_t)T_int, (uint32_t)interior, stream);
        else if (src_dtype == MXS_BF16) launch_interior<MXS_BF16>(J, (uint32_t)T_int, (uint32_t)interior, stream);
        else launch_interior<MXS_F16>(J, (uint32_t)T_int, (uint32_t)interior, stream);
        if (cudaGetLastError() != cudaSuccess) return MXS_ERR_CUDA;
    }
    if (rest > 0) {
        const unsigned grid = (unsigned)grid_for(rest);
        if (dst->dirs == MXS_ROWWISE)
            quantize_kernel<MXS_ROWWISE><<<grid, kThreads, 0, stream>>>(J, T, rest, G_int, T_int);
        else if (dst->dirs == MXS_COLWISE)
            quantize_kernel<MXS_COLWISE><<<grid, kThreads, 0, stream>>>(J, T, rest, G_int, T_int);
        else
            quantize_kernel<MXS_BOTH><<<grid, kThreads, 0, stream>>>(J, T, rest, G_int, T_int);
    }
    return launch_status();
}

mxs_status mxs_cuda_dequantize(const mxs_tensor *t, mxs_dirs plane, void *dst, mxs_dtype dst_dtype,
                               cudaStream_t stream) {
    const uint8_t *data, *scale;
    mxs_scale_geom g;
    mxs_status s = mxs_dequantize_check(t, plane, dst, dst_dtype, &data, &scale, &g);
    if (s != MXS_OK) return s;
    const int64_t elems = t->rows * t->cols;
    int64_t blocks = mxs_ceil_div(elems, 256);
    blocks = blocks < 132 * 64 ? blocks : 132 * 64;
    dequantize_kernel<<<(unsigned)blocks, 256, 0, stream>>>(data, scale, g, t->cols, elems, dst, dst_dtype);
    return launch_status();
}

mxs_status mxs_cuda_convert_scales(int64_t rows, int64_t cols, mxs_dirs plane, mxs_scale_layout from,
                                   const uint8_t *src, mxs_scale_layout to, uint8_t *dst, cudaStream_t stream) {
    mxs_scale_geom gs, gd;
    mxs_status s = mxs_convert_scales_check(rows, cols, plane, from, src, to, dst, &gs, &gd);
    if (s != MXS_OK) return s;
    const int64_t bytes = mxs_scale_geom_bytes(&gd);
    const int64_t units = mxs_ceil_div(bytes, kChunkBytes);
    convert_kernel<<<(unsigned)grid_for(units), kThreads, 0, stream>>>(dst, gd, src, gs, bytes, units);
    return launch_status();
}

mxs_status mxs_cuda_wb_workspace_bytes(const mxs_wb_batch *b, int64_t *bytes) {
    mxs_wb_plan plan;
    mxs_status s;
    if (!bytes) return MXS_ERR_INVALID_ARGUMENT;
    if ((s = mxs_wb_make_plan(b, &plan, NULL)) != MXS_OK) return s;
    if (b->n_items > INT64_MAX / (int64_t)sizeof(WbItem)) return MXS_ERR_OVERFLOW;
    *bytes = b->n_items * (int64_t)sizeof(WbItem);
    return MXS_OK;
}

mxs_status mxs_cuda_wb_partial(const mxs_wb_batch *b, const mxs_wb_plan *plan, uint8_t *packed, void *workspace,
                               int64_t workspace_bytes, cudaStream_t stream) {
    return wb_run(b, plan, packed, workspace, workspace_bytes, stream, MODE_PARTIAL);
}

mxs_status mxs_cuda_wb_apply(const mxs_wb_batch *b, const mxs_wb_plan *plan, const uint8_t *packed,
                             void *workspace, int64_t workspace_bytes, cudaStream_t stream) {
    return wb_run(b, plan, const_cast<uint8_t *>(packed), workspace, workspace_bytes, stream, MODE_APPLY);
}

} /* extern "C" */
