/* SPDX-License-Identifier: MIT */
/* cuda/mxs_nvfp4.cu - NVFP4 on the GPU (<mxshard/cuda_nvfp4.h>): quantize,
 * dequantize, scale conversion and the writeback phases.
 *
 * Two kinds of work share every writeback launch (docs/cuda.md "NVFP4"):
 *
 *   warp tiles    one 16-row group x 256 columns per warp (lane = 8
 *                 consecutive columns: 16-byte loads, 32-bit nibble
 *                 stores) on items with cols % 8 == 0: block amaxes and
 *                 multipliers in registers, each element read once
 *   thread units  one output unit per thread, computed from its inputs alone:
 *                 4 scale bytes (apply), a padding unit (quantize), or - on
 *                 items off the tile path - a packed entry, a data byte
 *
 * No two threads ever write the same byte (shard boundaries are even, so a
 * data byte is wholly inside or outside a shard), so nothing needs an
 * ownership rule; only the tensor-amax entries are raised atomically (one
 * MAX per warp, after the partial's memset). Each unit calls the
 * MXS_HOST_DEVICE rules of nvfp4.h (mxs_nvfp4_block_scale, _encode_mult,
 * mxs_e2m1x2_from_f32, entries), so the bytes equal the host path's.
 *
 *   quantize   memset(amax) | amax pass (8 elements per thread; atomicMax on
 *              the f32 bits: amaxes are >= 0 and never NaN, so the bits order
 *              as the values) | tile pass (scales and data; padding units)
 *              - off the tile path: scale pass + cast pass, one unit each
 *   partial    memset(packed) | one kernel: block entries and tensor amaxes
 *   apply      one kernel: every scale byte (units) and the shard's nibbles
 *              in the row-wise plane and the stage, or their fragments
 *              (tiles), S_enc from the reduced tensor-amax entry; *amax
 *              from it too
 *   finish     one kernel: the column-wise plane from the gathered stage
 *              (tiles when rows % 16 == 0, else one unit per byte); the
 *              same kernel serves mxs_cuda_nvfp4_stage_to_col
 *
 * The unprepared calls pass the items as kernel parameters,
 * MXS_CUDA_NVFP4_CHUNK per launch (__grid_constant__); a prepared bucket
 * keeps the same records in its device workspace and launches once per
 * phase. Both are graph-capturable.
 */
#include <cuda_runtime.h>

#include <string.h>

#include <mxshard/cuda_nvfp4.h>

#include "mxs_launch.cuh"
#include "mxs_tile.cuh"

using namespace mxs__cu;

namespace {

constexpr int kNvThreads = 256;
constexpr int kChunk = MXS_CUDA_NVFP4_CHUNK;
constexpr int kNvWarps = kNvThreads / 32; /* warp tiles per CTA */
constexpr int kNvTileCols = 256;          /* columns of a warp tile: 32 lanes x 8 */
constexpr unsigned kFull = 0xFFFFFFFFu;

/* ---- device helpers --------------------------------------------------------- */

/* Effective round-through of a dtype: rt, or MXS_F32 (none) when rt is the
 * dtype itself (bf16 -> bf16 and f16 -> f16 are the identity, as the host's
 * mxs__host_load treats them). */
__host__ __device__ __forceinline__ int nv_eff_rt(int dtype, int rt) {
    return rt != MXS_F32 && rt != dtype ? rt : MXS_F32;
}

/* Source element i, widened and rounded through rt exactly as the host's
 * mxs__host_load. */
__device__ __forceinline__ float nv_load(const void *src, int dtype, int64_t i, int rt) {
    float v = mxs_load_f32(src, (mxs_dtype)dtype, i);
    if (nv_eff_rt(dtype, rt) != MXS_F32) v = mxs_round_through(v, (mxs_dtype)rt);
    return v;
}

/* Grid-stride loop bounds of thread units. */
__device__ __forceinline__ int64_t unit_first() { return (int64_t)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ int64_t unit_stride() { return (int64_t)gridDim.x * blockDim.x; }

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
        if (nv_eff_rt(dtype, rt) != MXS_F32) round_through8(x, rt);
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

/* ---- writeback ------------------------------------------------------------------ */

/* Warp tiles (docs/cuda.md "NVFP4"). On an item whose cols % 8 == 0, the
 * data work of partial and apply runs in warp tiles of one 16-row group x
 * 256 columns: lane l holds columns 8l .. 8l+7 of each row (one 16-byte
 * vector, two for f32), so
 *
 *   lanes     0    1  |  2    3  | ...                31
 *   columns  [8e][8e] | [8e][8e] |                     (32 x 8 = 256)
 *            1x16 row block = a lane pair: its amax by one __shfl_xor
 *   rows     r0 .. r0+15 (16x1 column blocks and 16x16 tiles: per lane,
 *            running maxima over the rows; 16x16: then the pair)
 *
 * and each row's 8 nibbles are one 32-bit store. partial writes the block
 * entries of the groups its shard touches (the memset before it wrote 0
 * everywhere) and raises the item's tensor-amax entry with one atomic MAX per
 * warp; apply casts with multipliers computed once per block (row blocks:
 * the pair splits the 16 rows, then __shfl). finish transposes 16 rows x 256
 * columns per warp (rows % 16 == 0): 8 bytes per column and lane. Everything
 * else - scale bytes, and the data of items off the tile path - runs as one
 * thread per output unit, in the same launch. */

/* One item of a writeback chunk. */
struct alignas(16) NvItem {
    int64_t rows, cols, n, kr, kc;
    int64_t start, len;
    const void *master;
    uint8_t *data[2], *scale[2], *stage; /* data[0], stage: apply's outputs (planes or fragments: kOut*) */
    float *amax;
    mxs_scale_geom geom[2];
    int64_t sbytes[2];                                    /* scale bytes of the present planes (0: absent) */
    int64_t sunits[2];                                    /* apply: units of 4 scale entries (nv_apply_unit) */
    int64_t row_entry, col_entry, tile_entry, amax_entry; /* entry indices (-1: absent) */
    int64_t first_entry, n_entries;                       /* the item's block entries: contiguous */
    int64_t unit0, units;                                 /* this phase's thread units in the chunk */
    int64_t tile0, tiles;                                 /* this phase's warp tiles in the chunk */
    int64_t grp0, ctiles; /* tiles: first row group, column tiles per group (tile t: group grp0 + t / ctiles) */
    int dirs, two_d, dtype;
    int mis;    /* master loads element-aligned only (ld16_elems) */
    int out;    /* apply's outputs data[0] and stage: kOut* bits */
    int finish; /* finish transposes this item (mxs__nvfp4_wb_finishes) */
};

/* NvItem.out: whether an apply output is a fragment (its byte 0 is plane
 * byte start/2) and whether its plane byte 0 is 4-byte aligned (32-bit
 * stores). One word, so that the bucket's records cost the apply kernel no
 * registers over in-place outputs (start is loaded anyway). */
enum { kOutRowFrag = 1, kOutStageFrag = 2, kOutRowSt4 = 4, kOutStageSt4 = 8 };

/* What a launch needs besides its items. */
struct NvHead {
    int64_t n; /* items */
    int rt, pad_;
    int64_t w;             /* entry bytes */
    void *packed;          /* device */
    int64_t status_offset; /* the status byte */
    int64_t units;         /* thread units of the launch */
    int64_t tiles;         /* tiles of the launch (a warp each; finish: a CTA each) */
    int64_t tile_blocks;   /* CTAs of the tiles: ceil(tiles / kNvWarps); the units' CTAs follow */
};

/* A launch with its items as kernel parameters (the unprepared calls). */
struct NvChunk {
    NvHead h;
    NvItem it[kChunk];
};
static_assert(sizeof(NvChunk) <= 32000, "kernel parameters of a chunk must stay under 32 KiB");

enum { PH_PARTIAL = 0, PH_APPLY = 1, PH_FINISH = 2 };

/* The item holding chunk unit u / tile t (starts ascend with the item index;
 * the last item whose start is <= u holds it). */
__device__ __forceinline__ int64_t nv_item_of(const NvHead &C, const NvItem *it, int64_t u, bool tile) {
    int64_t lo = 0, hi = C.n - 1;
    while (lo < hi) {
        const int64_t mid = (lo + hi + 1) / 2;
        if ((tile ? it[mid].tile0 : it[mid].unit0) <= u)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

__device__ __forceinline__ void nv_put(const NvHead &C, int64_t i, float a) {
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
__device__ void nv_raise_atomic(const NvHead &C, int64_t i, float a) {
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

/* The tensor's S_enc from its reduced tensor-amax entry. */
__device__ __forceinline__ float nv_s_enc(const NvHead &C, const NvItem &I) {
    return mxs_nvfp4_global_encode(mxs__nvfp4_entry_value(C.packed, C.w, I.amax_entry));
}

/* Master element at flat index f of the item (f inside the shard). */
__device__ __forceinline__ float nv_master(const NvHead &C, const NvItem &I, int64_t f) {
    return nv_load(I.master, I.dtype, f - I.start, C.rt);
}

/* Load specialisations of the tile kernels: the master (source) dtype DT
 * and the effective round-through RT (MXS_F32: none; never equal to DT) as
 * template constants, so the tile's loads compile without dtype switches;
 * DT = -1 reads both from the launch at run time (a batch mixing dtypes).
 * The bytes are the same either way: only the code differs. */
constexpr int kNvAnyDtype = -1;

/* The 8 elements f .. f+7 of a tile row (0 outside the shard): one vector
 * load when all 8 are inside, else element by element. */
template <int DT, int RT>
__device__ __forceinline__ void nv_load8(const NvHead &C, const NvItem &I, int64_t f, float *x) {
    const int dt = DT >= 0 ? DT : I.dtype, rt = DT >= 0 ? RT : nv_eff_rt(I.dtype, C.rt);
    const int64_t end = I.start + I.len;
    if (f >= I.start && f + 8 <= end) {
        uint4 raw[2];
        if (I.mis)
            ld_vec8<true>(I.master, dt, f - I.start, raw);
        else
            ld_vec8<false>(I.master, dt, f - I.start, raw);
        unpack8(x, raw, dt);
        if (rt != MXS_F32) round_through8(x, rt);
        return;
    }
#pragma unroll
    for (int j = 0; j < 8; j++)
        x[j] = f + j >= I.start && f + j < end ? nv_load(I.master, dt, f + j - I.start, rt) : 0.0f;
}

/* Partial, one warp tile: the block entries of group g, columns c0 .. */
template <int DT, int RT> __device__ void nv_partial_tile(const NvHead &C, const NvItem &I, int64_t t) {
    const int lane = (int)(threadIdx.x & 31u);
    const int64_t g = I.grp0 + t / I.ctiles, c0 = (t % I.ctiles) * kNvTileCols + lane * 8;
    const int64_t r0 = g * MXS_NVFP4_BLOCK, r1 = r0 + MXS_NVFP4_BLOCK < I.rows ? r0 + MXS_NVFP4_BLOCK : I.rows;
    const int64_t end = I.start + I.len;
    const bool active = c0 < I.cols, rowb = I.row_entry >= 0, colb = I.col_entry >= 0;
    float cm[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f}, tm = 0.0f;
#pragma unroll 4
    for (int64_t r = r0; r < r1; r++) {
        if ((r + 1) * I.cols <= I.start || r * I.cols >= end) continue; /* warp-uniform */
        float x[8], a = 0.0f;
        if (active)
            nv_load8<DT, RT>(C, I, r * I.cols + c0, x);
        else
#pragma unroll
            for (int j = 0; j < 8; j++) x[j] = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            a = mxs_amax_step(a, x[j]);
            cm[j] = mxs_amax_step(cm[j], x[j]);
        }
        tm = fmaxf(tm, a);
        if (rowb) {
            const float b = fmaxf(a, __shfl_xor_sync(kFull, a, 1));
            if (active && !(lane & 1) && b > 0.0f) nv_put(C, I.row_entry + r * I.kr + c0 / MXS_NVFP4_BLOCK, b);
        }
    }
    if (I.two_d) {
        const float b = fmaxf(tm, __shfl_xor_sync(kFull, tm, 1));
        if (active && !(lane & 1) && b > 0.0f) nv_put(C, I.tile_entry + g * I.kr + c0 / MXS_NVFP4_BLOCK, b);
    } else if (colb && active) {
#pragma unroll
        for (int j = 0; j < 8; j++)
            if (cm[j] > 0.0f) nv_put(C, I.col_entry + (c0 + j) * I.kc + g, cm[j]);
    }
    for (int o = 16; o > 0; o >>= 1) tm = fmaxf(tm, __shfl_xor_sync(kFull, tm, o));
    if (lane == 0 && tm > 0.0f) nv_raise_atomic(C, I.amax_entry, tm);
}

/* Amax of the shard's elements in row r, columns [c0, c1). */
__device__ float nv_shard_row_amax(const NvHead &C, const NvItem &I, int64_t r, int64_t c0, int64_t c1) {
    int64_t f0 = r * I.cols + c0, f1 = r * I.cols + c1;
    const int64_t end = I.start + I.len;
    float a = 0.0f;
    f0 = f0 > I.start ? f0 : I.start;
    f1 = f1 < end ? f1 : end;
    for (int64_t f = f0; f < f1; f++) a = mxs_amax_step(a, nv_master(C, I, f));
    return a;
}

/* Partial, one thread unit: one block entry of an item off the tile path. */
__device__ void nv_partial_unit(const NvHead &C, const NvItem *it, int64_t u) {
    const NvItem &I = it[nv_item_of(C, it, u, false)];
    const int64_t e = u - I.unit0;
    float a = 0.0f;
    if (I.two_d) { /* tile (R, Cc) */
        const int64_t R = e / I.kr, Cc = e % I.kr, r0 = R * MXS_NVFP4_BLOCK, c0 = Cc * MXS_NVFP4_BLOCK;
        const int64_t r1 = r0 + MXS_NVFP4_BLOCK < I.rows ? r0 + MXS_NVFP4_BLOCK : I.rows;
        const int64_t c1 = c0 + MXS_NVFP4_BLOCK < I.cols ? c0 + MXS_NVFP4_BLOCK : I.cols;
        for (int64_t r = r0; r < r1; r++) a = fmaxf(a, nv_shard_row_amax(C, I, r, c0, c1));
    } else if (I.row_entry >= 0 && e < I.rows * I.kr) { /* row block (r, k) */
        const int64_t r = e / I.kr, c0 = (e % I.kr) * MXS_NVFP4_BLOCK;
        a = nv_shard_row_amax(C, I, r, c0, c0 + MXS_NVFP4_BLOCK < I.cols ? c0 + MXS_NVFP4_BLOCK : I.cols);
    } else { /* column block (c, g): rows 16g.. of column c */
        const int64_t q = I.row_entry >= 0 ? e - I.rows * I.kr : e, c = q / I.kc, r0 = (q % I.kc) * MXS_NVFP4_BLOCK;
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

__device__ __forceinline__ bool nv_remote_failed(const NvHead &C) {
    return static_cast<const uint8_t *>(C.packed)[C.status_offset] != 0;
}

/* Element multiplier of the block whose reduced entry is i. */
__device__ __forceinline__ float nv_mult(const NvHead &C, int64_t i, float s_enc) {
    return mxs__nvfp4_wb_mult(C.packed, C.w, i, s_enc);
}

/* 8 nibbles E2M1(x[j] * e[j]) as 4 bytes, the even index low. */
__device__ __forceinline__ uint32_t nv_cast8(const float *x, const float *e) {
    uint32_t q = 0;
#pragma unroll
    for (int p = 0; p < 4; p++)
        q |= (uint32_t)mxs_e2m1x2_from_f32(__fmul_rn(x[2 * p], e[2 * p]), __fmul_rn(x[2 * p + 1], e[2 * p + 1]))
             << (8 * p);
    return q;
}

/* Bytes q of plane nibbles f .. f+7 (f % 8 == 0) into output d - the plane,
 * or a fragment (frag: plane byte b is fragment byte b - start/2, an integer
 * offset, used only inside the shard; start is even): one 32-bit store when
 * all 8 are inside the shard (and st4: the output's plane byte 0 is 4-byte
 * aligned, hence this address), else the bytes inside it (shard boundaries
 * are even: a byte is wholly inside or out). */
__device__ __forceinline__ void nv_store8(const NvItem &I, uint8_t *d, bool frag, bool st4, int64_t f, uint32_t q) {
    const int64_t end = I.start + I.len, o = (f - (frag ? I.start : 0)) / 2;
    if (st4 && f >= I.start && f + 8 <= end) {
        *reinterpret_cast<uint32_t *>(d + o) = q;
        return;
    }
#pragma unroll
    for (int p = 0; p < 4; p++)
        if (f + 2 * p >= I.start && f + 2 * p < end) d[o + p] = (uint8_t)(q >> (8 * p));
}

/* Apply, one warp tile: the shard's nibbles of group g, columns c0 .. in the
 * row-wise plane and the stage. Rows go in pairs: the lane pair of a 1x16
 * row block computes one multiplier each (lane 2p row i, lane 2p+1 row i+1)
 * and swaps them by __shfl_xor. */
template <int DT, int RT> __device__ void nv_apply_tile(const NvHead &C, const NvItem &I, int64_t t) {
    const int lane = (int)(threadIdx.x & 31u);
    const int64_t g = I.grp0 + t / I.ctiles, c0 = (t % I.ctiles) * kNvTileCols + lane * 8;
    const int64_t r0 = g * MXS_NVFP4_BLOCK, r1 = r0 + MXS_NVFP4_BLOCK < I.rows ? r0 + MXS_NVFP4_BLOCK : I.rows;
    const int64_t end = I.start + I.len, k = c0 / MXS_NVFP4_BLOCK;
    /* the pair's block exists even when only the even lane has columns (cols % 16 == 8) */
    const bool active = c0 < I.cols, block = k * MXS_NVFP4_BLOCK < I.cols;
    const bool do_row = I.data[0] != nullptr, do_stage = I.stage != nullptr;
    const float s_enc = nv_s_enc(C, I);
    float ec[8], et = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; j++) ec[j] = 0.0f;
    if (I.two_d) {
        if (active) et = nv_mult(C, I.tile_entry + g * I.kr + k, s_enc);
    } else if (do_stage && active) {
#pragma unroll
        for (int j = 0; j < 8; j++) ec[j] = nv_mult(C, I.col_entry + (c0 + j) * I.kc + g, s_enc);
    }
#pragma unroll 1
    for (int64_t ri = r0; ri < r1; ri += 2) {
        float mine = et;
        if (!I.two_d && do_row && block) {
            const int64_t r = ri + (lane & 1);
            mine = r < r1 ? nv_mult(C, I.row_entry + r * I.kr + k, s_enc) : 0.0f;
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
                nv_store8(I, I.data[0], I.out & kOutRowFrag, I.out & kOutRowSt4, f, nv_cast8(x, e));
            }
            if (do_stage) {
#pragma unroll
                for (int j = 0; j < 8; j++) e[j] = I.two_d ? er : ec[j];
                nv_store8(I, I.stage, I.out & kOutStageFrag, I.out & kOutStageSt4, f, nv_cast8(x, e));
            }
        }
    }
}

/* Row-wise (or tile) entry and column-wise (or tile) entry of element (r, c). */
__device__ __forceinline__ int64_t nv_row_entry(const NvItem &I, int64_t r, int64_t c) {
    return I.two_d ? I.tile_entry + (r / MXS_NVFP4_BLOCK) * I.kr + c / MXS_NVFP4_BLOCK
                   : I.row_entry + r * I.kr + c / MXS_NVFP4_BLOCK;
}
__device__ __forceinline__ int64_t nv_col_entry(const NvItem &I, int64_t r, int64_t c) {
    return I.two_d ? I.tile_entry + (r / MXS_NVFP4_BLOCK) * I.kr + c / MXS_NVFP4_BLOCK
                   : I.col_entry + c * I.kc + r / MXS_NVFP4_BLOCK;
}

/* Scale entry (m, k) of plane p: its block's packed entry index. */
__device__ __forceinline__ int64_t nv_scale_entry(const NvItem &I, int p, int64_t m, int64_t k) {
    if (I.two_d) {
        int64_t R, Cc;
        mxs_nvfp4_entry_tile((mxs_dirs)(p + 1), m, k, &R, &Cc);
        return I.tile_entry + R * I.kr + Cc;
    }
    return p == 0 ? I.row_entry + m * I.kr + k : I.col_entry + m * I.kc + k;
}

/* Apply, one thread unit: scale entries (m, 4q .. 4q+3) of a plane - in
 * every NVFP4 layout 4 consecutive bytes (COMPACT m*K + k, PADDED m*Kp + k,
 * SWIZZLED k % 4 innermost), so one 32-bit store when whole and aligned;
 * padding entries 0x00. The units run over the stored grid (COMPACT M x K,
 * else Mp x Kp), so every byte of the plane is written once. Or (items off
 * the tile path) a data byte of the shard (row-wise plane and stage). Unit 0
 * of an item also stores its global amax. */
__device__ void nv_apply_unit(const NvHead &C, const NvItem *it, int64_t u) {
    const NvItem &I = it[nv_item_of(C, it, u, false)];
    const float s_enc = nv_s_enc(C, I);
    int64_t e = u - I.unit0;
    if (e == 0) *I.amax = mxs__nvfp4_entry_value(C.packed, C.w, I.amax_entry);
    if (e < I.sunits[0] + I.sunits[1]) {
        const int p = e < I.sunits[0] ? 0 : 1;
        const mxs_scale_geom &G = I.geom[p];
        const int64_t q = p == 0 ? e : e - I.sunits[0];
        const int64_t kdim = G.layout == MXS_SCALES_COMPACT ? G.K : G.Kp, kq = mxs_ceil_div(kdim, 4);
        const int64_t m = q / kq, k0 = 4 * (q % kq), nb = kdim - k0 < 4 ? kdim - k0 : 4;
        uint8_t *d = I.scale[p] + mxs_scale_geom_offset(&G, m, k0);
        uint32_t v = 0;
        for (int b = 0; b < nb; b++)
            if (mxs_scale_geom_is_logical(&G, m, k0 + b))
                v |= (uint32_t)mxs__nvfp4_wb_scale(C.packed, C.w, nv_scale_entry(I, p, m, k0 + b), s_enc) << (8 * b);
        if (nb == 4 && (reinterpret_cast<uintptr_t>(d) & 3u) == 0) {
            *reinterpret_cast<uint32_t *>(d) = v;
        } else {
            for (int b = 0; b < nb; b++) d[b] = (uint8_t)(v >> (8 * b));
        }
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

/* Finish, one CTA tile (rows % 16 == 0, cols % 8 == 0): kFinishGroups
 * 16-row groups x 256 columns. Warp w transposes group w: lane l reads 16
 * rows x 4 bytes (its 8 columns) and leaves each column's 16 nibbles (8
 * bytes) in shared memory; then thread c writes column c's bytes of all the
 * groups - 64 contiguous bytes, whole 32-byte sectors - instead of 8 warps
 * scattering 8-byte pieces at a stride of rows/2 (27 % of the copy ceiling
 * in run 13 before this). Lanes visit their 8 columns rotated by lane so
 * that the shared-memory stores spread over the banks. */
constexpr int kFinishGroups = kNvWarps; /* 8 groups = 128 rows per CTA tile */

__device__ void nv_finish_tile(const NvItem &I, int64_t t, uint2 (*sm)[kNvTileCols]) {
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
    const int64_t c = cb + threadIdx.x;
    if (c < I.cols) {
        uint2 *d = reinterpret_cast<uint2 *>(I.data[1] + (c * I.rows + g0 * MXS_NVFP4_BLOCK) / 2);
        for (int q = 0; q < ng; q++) d[q] = sm[q][threadIdx.x];
    }
    __syncthreads(); /* before the next tile overwrites sm */
}

/* Finish, one thread unit: one byte of a column-wise data plane, from the
 * stage (or the row-wise plane): dst nibble c*rows + r = src nibble r*cols + c. */
__device__ void nv_finish_unit(const NvHead &C, const NvItem *it, int64_t u) {
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

/* A writeback phase: warp tiles, then thread units (partial after a memset
 * of the packed buffer: every entry 0, the status entry included; apply
 * writes nothing when a rank failed). The items are kernel parameters
 * (nv_wb_kernel: a chunk of the unprepared calls) or a device table
 * (nv_wb_table_kernel: a prepared bucket). */
template <int PH, int DT, int RT> __device__ __forceinline__ void nv_wb_body(const NvHead &C, const NvItem *it) {
    __shared__ uint2 fsm[PH == PH_FINISH ? kFinishGroups : 1][kNvTileCols];
    if (PH == PH_APPLY && nv_remote_failed(C)) return;
    const int64_t blocks = C.tile_blocks + mxs_ceil_div(C.units, kNvThreads);
    for (int64_t blk = blockIdx.x; blk < blocks; blk += gridDim.x) {
        if (blk < C.tile_blocks) {
            /* partial, apply: a tile per warp; finish: a tile per CTA */
            const int64_t t = PH == PH_FINISH ? blk : blk * kNvWarps + threadIdx.x / 32;
            if (t >= C.tiles) continue;
            const NvItem &I = it[nv_item_of(C, it, t, true)];
            if (PH == PH_PARTIAL)
                nv_partial_tile<DT, RT>(C, I, t - I.tile0);
            else if (PH == PH_APPLY)
                nv_apply_tile<DT, RT>(C, I, t - I.tile0);
            else
                nv_finish_tile(I, t - I.tile0, fsm);
        } else {
            const int64_t u = (blk - C.tile_blocks) * kNvThreads + threadIdx.x;
            if (u >= C.units) continue;
            if (PH == PH_PARTIAL)
                nv_partial_unit(C, it, u);
            else if (PH == PH_APPLY)
                nv_apply_unit(C, it, u);
            else
                nv_finish_unit(C, it, u);
        }
    }
}

template <int PH, int DT, int RT>
__global__ void __launch_bounds__(kNvThreads) nv_wb_kernel(const __grid_constant__ NvChunk C) {
    nv_wb_body<PH, DT, RT>(C.h, C.it);
}

template <int PH, int DT, int RT>
__global__ void __launch_bounds__(kNvThreads) nv_wb_table_kernel(const __grid_constant__ NvHead H, const NvItem *it) {
    nv_wb_body<PH, DT, RT>(H, it);
}

/* The load specialisations instantiated for the writeback: f32 masters with
 * each round-through, and bf16 / f16 masters without one; anything else
 * (a launch mixing master dtypes, bf16 through f16, ...) runs the run-time
 * variant. */
enum { NV_F32, NV_F32_BF16, NV_F32_F16, NV_BF16, NV_F16, NV_ANY };

/* The specialisation for master dtype dt (-1: mixed) and round-through rt. */
int nv_wb_spec(int dt, int rt) {
    if (dt < 0) return NV_ANY;
    const int e = nv_eff_rt(dt, rt);
    if (dt == MXS_F32) return e == MXS_BF16 ? NV_F32_BF16 : e == MXS_F16 ? NV_F32_F16 : NV_F32;
    if (e != MXS_F32) return NV_ANY;
    return dt == MXS_BF16 ? NV_BF16 : NV_F16;
}

/* Launches phase PH over chunk C (TABLE = false) or the table `it` (true). */
template <int PH, int DT, int RT>
void nv_wb_launch1(unsigned grid, cudaStream_t stream, const NvChunk *C, const NvHead &h, const NvItem *it) {
    if (C)
        nv_wb_kernel<PH, DT, RT><<<grid, kNvThreads, 0, stream>>>(*C);
    else
        nv_wb_table_kernel<PH, DT, RT><<<grid, kNvThreads, 0, stream>>>(h, it);
}

template <int PH>
void nv_wb_launch(int spec, unsigned grid, cudaStream_t stream, const NvChunk *C, const NvHead &h, const NvItem *it) {
    if constexpr (PH == PH_FINISH) { /* finish reads no master: one variant */
        nv_wb_launch1<PH, kNvAnyDtype, kNvAnyDtype>(grid, stream, C, h, it);
        return;
    }
    switch (spec) {
    case NV_F32: nv_wb_launch1<PH, MXS_F32, MXS_F32>(grid, stream, C, h, it); break;
    case NV_F32_BF16: nv_wb_launch1<PH, MXS_F32, MXS_BF16>(grid, stream, C, h, it); break;
    case NV_F32_F16: nv_wb_launch1<PH, MXS_F32, MXS_F16>(grid, stream, C, h, it); break;
    case NV_BF16: nv_wb_launch1<PH, MXS_BF16, MXS_F32>(grid, stream, C, h, it); break;
    case NV_F16: nv_wb_launch1<PH, MXS_F16, MXS_F32>(grid, stream, C, h, it); break;
    default: nv_wb_launch1<PH, kNvAnyDtype, kNvAnyDtype>(grid, stream, C, h, it); break;
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
    uint4 raw[2];
    if (Q.mis)
        ld_vec8<true>(Q.T.src, DT, f, raw);
    else
        ld_vec8<false>(Q.T.src, DT, f, raw);
    unpack8(x, raw, DT);
    if (RT != MXS_F32) round_through8(x, RT);
}

template <int DT, int RT> __device__ void nv_quantize_tile(const NvQuant &Q, int64_t t, float s_enc) {
    const NvTensor &T = Q.T;
    const int lane = (int)(threadIdx.x & 31u);
    const int64_t g = t / Q.ctiles, c0 = (t % Q.ctiles) * kNvTileCols + lane * 8;
    const int64_t r0 = g * MXS_NVFP4_BLOCK, r1 = r0 + MXS_NVFP4_BLOCK < T.rows ? r0 + MXS_NVFP4_BLOCK : T.rows;
    const int64_t k = c0 / MXS_NVFP4_BLOCK;
    const bool active = c0 < T.cols, rowp = T.data[0] != nullptr, colp = T.data[1] != nullptr;
    const bool two_d = T.block == MXS_NVFP4_16X16;
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
            et = mxs_nvfp4_encode_mult(sc, s_enc);
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
                ec[j] = mxs_nvfp4_encode_mult(sc, s_enc);
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
                    er = mxs_nvfp4_encode_mult(sc, s_enc);
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
    const float s_enc = mxs_nvfp4_global_encode(*Q.T.amax);
    const int64_t blocks = Q.tile_blocks + mxs_ceil_div(Q.units, kNvThreads);
    for (int64_t blk = blockIdx.x; blk < blocks; blk += gridDim.x) {
        if (blk < Q.tile_blocks) {
            const int64_t t = blk * kNvWarps + threadIdx.x / 32;
            if (t < Q.tiles) nv_quantize_tile<DT, RT>(Q, t, s_enc);
        } else {
            const int64_t u = (blk - Q.tile_blocks) * kNvThreads + threadIdx.x;
            if (u < Q.units) nv_quantize_pad_unit(Q, u);
        }
    }
}

/* ---- host side ---------------------------------------------------------------------- */

bool nv_aligned_to(const void *p, uintptr_t a) { return p == nullptr || aligned(p, a); }

/* Whether plane byte 0 of an output whose byte 0 is plane nibble `base`
 * (even) is 4-byte aligned: (address - base/2) % 4 == 0, in integers (no
 * pointer outside the output is formed). nv_store8's 32-bit stores are at
 * plane bytes that are multiples of 4. */
int nv_st4(const void *out, int64_t base) {
    return out == nullptr || ((uintptr_t)out - (uintptr_t)(base / 2)) % 4u == 0;
}

/* A finish record transposing src (rows x cols, row-major nibbles) into the
 * column-wise plane dst: finish's kernels, for items and for
 * mxs_cuda_nvfp4_stage_to_col. */
void nv_transpose_record(int64_t rows, int64_t cols, const uint8_t *src, uint8_t *dst, NvItem *I) {
    I->rows = rows;
    I->cols = cols;
    I->n = rows * cols;
    I->dirs = MXS_COLWISE;
    I->data[1] = dst;
    I->stage = const_cast<uint8_t *>(src);
    I->ctiles = mxs_ceil_div(cols, kNvTileCols);
    I->finish = 1;
}

/* Item `in` (validated) as a chunk record, its entries at slot `sl`. */
void nv_item_make(const mxs_nvfp4_wb_item *in, const mxs_nvfp4_wb_slot *sl, NvItem *I) {
    const mxs_nvfp4_tensor *t = &in->primary;
    memset(I, 0, sizeof *I);
    I->rows = t->rows;
    I->cols = t->cols;
    I->n = t->rows * t->cols;
    I->kr = mxs_ceil_div(t->cols, MXS_NVFP4_BLOCK);
    I->kc = mxs_ceil_div(t->rows, MXS_NVFP4_BLOCK);
    I->start = in->start;
    I->len = in->len;
    I->master = in->master;
    I->dirs = (int)t->dirs;
    I->two_d = t->block == MXS_NVFP4_16X16;
    I->dtype = (int)in->master_dtype;
    I->amax = t->amax;
    for (int p = 0; p < 2; p++) {
        if (!(t->dirs & (unsigned)(p + 1))) continue;
        I->data[p] = p == 0 ? t->row_data : t->col_data;
        I->scale[p] = p == 0 ? t->row_scale : t->col_scale;
        mxs_nvfp4_scale_geom_make(t->rows, t->cols, (mxs_dirs)(p + 1), t->scale_layout, &I->geom[p]);
        I->sbytes[p] = mxs_scale_geom_bytes(&I->geom[p]);
        const mxs_scale_geom &G = I->geom[p]; /* nv_apply_unit's grid */
        I->sunits[p] = (G.layout == MXS_SCALES_COMPACT ? G.M : G.Mp) *
                       mxs_ceil_div(G.layout == MXS_SCALES_COMPACT ? G.K : G.Kp, 4);
    }
    const bool row_frag = (t->dirs & MXS_ROWWISE) && in->row_fragment;
    const bool stage_frag = (t->dirs & MXS_COLWISE) && in->stage_fragment;
    if (row_frag) I->data[0] = in->row_fragment; /* fragments win over the planes */
    I->stage = (t->dirs & MXS_COLWISE) ? (stage_frag ? in->stage_fragment : in->col_stage) : nullptr;
    I->finish = mxs__nvfp4_wb_finishes(in);
    I->row_entry = sl->row_entry;
    I->col_entry = sl->col_entry;
    I->tile_entry = sl->tile_entry;
    I->amax_entry = sl->amax_entry;
    I->first_entry = sl->tile_entry >= 0 ? sl->tile_entry : (sl->row_entry >= 0 ? sl->row_entry : sl->col_entry);
    I->n_entries = I->two_d ? I->kc * I->kr
                            : (sl->row_entry >= 0 ? I->rows * I->kr : 0) + (sl->col_entry >= 0 ? I->cols * I->kc : 0);
    I->ctiles = mxs_ceil_div(t->cols, kNvTileCols);
    const int64_t es = mxs_dtype_bytes(in->master_dtype);
    I->mis = in->len > 0 &&
             (reinterpret_cast<uintptr_t>(in->master) - (uintptr_t)(in->start * es)) % 16u != 0; /* vec rule */
    I->out = (row_frag ? kOutRowFrag : 0) | (stage_frag ? kOutStageFrag : 0) |
             (nv_st4(I->data[0], row_frag ? in->start : 0) ? kOutRowSt4 : 0) |
             (nv_st4(I->stage, stage_frag ? in->start : 0) ? kOutStageSt4 : 0);
}

/* CTAs of a phase's tiles: a warp per tile, finish a CTA per tile. */
int64_t nv_tile_blocks(int ph, int64_t tiles) { return ph == PH_FINISH ? tiles : mxs_ceil_div(tiles, kNvWarps); }

/* Thread units and warp tiles of item I in phase ph. */
void nv_item_work(NvItem *I, int ph, int64_t *units, int64_t *tiles) {
    *units = *tiles = 0;
    if (ph == PH_FINISH) {
        if (!I->finish) return;
        const uint8_t *src = I->stage ? I->stage : I->data[0];
        if (I->rows % MXS_NVFP4_BLOCK == 0 && I->cols % 8 == 0 && nv_aligned_to(src, 4) && nv_aligned_to(I->data[1], 8))
            *tiles = mxs_ceil_div(I->rows / MXS_NVFP4_BLOCK, kFinishGroups) * I->ctiles; /* CTA tiles */
        else
            *units = (I->n + 1) / 2;
        return;
    }
    const bool tile_path = I->cols % 8 == 0 && I->len > 0;
    if (tile_path) {
        const int64_t g0 = (I->start / I->cols) / MXS_NVFP4_BLOCK;
        const int64_t g1 = ((I->start + I->len - 1) / I->cols) / MXS_NVFP4_BLOCK;
        I->grp0 = g0;
        *tiles = (g1 - g0 + 1) * I->ctiles;
    }
    if (ph == PH_PARTIAL) {
        if (!tile_path && I->len > 0) *units = I->n_entries;
        return;
    }
    const int64_t db =
        !tile_path && I->len > 0 && (I->data[0] || I->stage) ? (I->start + I->len + 1) / 2 - I->start / 2 : 0;
    *units = I->sunits[0] + I->sunits[1] + db;
}

unsigned nv_grid(int64_t units) { return grid_for(mxs_ceil_div(units, kNvThreads)); }

/* The launch header of a validated batch (units and tiles: 0). */
NvHead nv_head(const mxs_nvfp4_wb_batch *b, const mxs_nvfp4_wb_plan *plan, const void *packed) {
    NvHead h;
    memset(&h, 0, sizeof h);
    h.rt = (int)b->round_through;
    h.w = plan->entry_bytes;
    h.packed = const_cast<void *>(packed);
    h.status_offset = plan->status_offset;
    return h;
}

/* Records of items [i0, i1) for phase ph into it[0 ..), their units and
 * tiles numbered on from h->units / h->tiles; *at: the running entry index
 * (b->n_items before item 0). */
void nv_items_build(const mxs_nvfp4_wb_batch *b, int64_t i0, int64_t i1, int ph, int64_t *at, NvHead *h, NvItem *it) {
    for (int64_t i = i0; i < i1; i++) {
        mxs_nvfp4_wb_slot sl;
        NvItem &I = it[i - i0];
        mxs__nvfp4_packed_slot(&b->items[i].primary, i, at, &sl);
        nv_item_make(&b->items[i], &sl, &I);
        nv_item_work(&I, ph, &I.units, &I.tiles);
        I.unit0 = h->units;
        I.tile0 = h->tiles;
        h->units += I.units;
        h->tiles += I.tiles;
    }
    h->tile_blocks = nv_tile_blocks(ph, h->tiles);
}

int64_t nv_blocks(const NvHead &h) { return h.tile_blocks + mxs_ceil_div(h.units, kNvThreads); }

/* The master dtype of the items [i0, i1) that have a shard (MXS_F32 when
 * none has), or -1 when they differ. */
int nv_master_dtype(const mxs_nvfp4_wb_batch *b, int64_t i0, int64_t i1) {
    int dt = -2;
    for (int64_t i = i0; i < i1; i++) {
        if (b->items[i].len <= 0) continue;
        const int d = (int)b->items[i].master_dtype;
        if (dt == -2) dt = d;
        if (dt != d) return -1;
    }
    return dt == -2 ? (int)MXS_F32 : dt;
}

/* The memset that starts every partial: the whole packed buffer. */
mxs_status nv_zero_packed(void *packed, int64_t bytes, cudaStream_t stream) {
    if (cudaMemsetAsync(packed, 0, (size_t)bytes, stream) == cudaSuccess) return MXS_OK;
    (void)cudaGetLastError();
    return MXS_ERR_CUDA;
}

/* Runs phase ph over the validated batch, chunk by chunk (partial: one
 * memset of the whole packed buffer first). */
mxs_status nv_wb_run(const mxs_nvfp4_wb_batch *b, const mxs_nvfp4_wb_plan *plan, const void *packed, int ph,
                     cudaStream_t stream) {
    NvChunk C;
    int64_t at = b->n_items;
    mxs_status s;
    if ((s = launch_begin()) != MXS_OK) return s;
    if (ph == PH_PARTIAL && (s = nv_zero_packed(const_cast<void *>(packed), plan->packed_bytes, stream)) != MXS_OK)
        return s;
    for (int64_t i0 = 0; i0 < b->n_items; i0 += kChunk) {
        const int64_t i1 = b->n_items - i0 < kChunk ? b->n_items : i0 + kChunk;
        memset(&C, 0, sizeof C);
        C.h = nv_head(b, plan, packed);
        C.h.n = i1 - i0;
        nv_items_build(b, i0, i1, ph, &at, &C.h, C.it);
        const unsigned grid = grid_for(nv_blocks(C.h));
        const int spec = nv_wb_spec(nv_master_dtype(b, i0, i1), (int)b->round_through);
        if (grid > 0) {
            if (ph == PH_PARTIAL)
                nv_wb_launch<PH_PARTIAL>(spec, grid, stream, &C, C.h, nullptr);
            else if (ph == PH_APPLY)
                nv_wb_launch<PH_APPLY>(spec, grid, stream, &C, C.h, nullptr);
            else
                nv_wb_launch<PH_FINISH>(spec, grid, stream, &C, C.h, nullptr);
        }
        if ((s = launch_end()) != MXS_OK) return s;
    }
    return launch_end();
}

/* ---- the prepared bucket ------------------------------------------------------------ */

constexpr int kNvPhases = 3;

/* Copies n records (kernel parameters) to dst: prepare's table stores. */
__global__ void __launch_bounds__(kNvThreads)
    nv_table_store(const __grid_constant__ NvChunk C, NvItem *dst, int64_t n) {
    const uint32_t *src = reinterpret_cast<const uint32_t *>(C.it);
    uint32_t *d = reinterpret_cast<uint32_t *>(dst);
    const int64_t words = n * (int64_t)(sizeof(NvItem) / 4);
    for (int64_t i = threadIdx.x; i < words; i += blockDim.x) d[i] = src[i];
}
static_assert(sizeof(NvItem) % 16 == 0, "table records keep 16-byte alignment");

/* Workspace of a bucket of n items: one record per item and phase. */
mxs_status nv_bucket_bytes(int64_t n, int64_t *bytes) {
    return mxs_mul_ok(n, (int64_t)(kNvPhases * sizeof(NvItem)), bytes) ? MXS_OK : MXS_ERR_OVERFLOW;
}

/* FNV-1a over every field after `check`. */
uint64_t nv_bucket_hash(const mxs_cuda_nvfp4_wb_bucket *bk) {
    uint64_t h = 0xCBF29CE484222325ull;
    h = mxs__fnv_u64(h, (uint64_t)bk->n_items);
    h = mxs__fnv_u64(h, (uint64_t)(uintptr_t)bk->packed);
    h = mxs__fnv_u64(h, (uint64_t)bk->packed_bytes);
    h = mxs__fnv_u64(h, (uint64_t)bk->entry_bytes);
    h = mxs__fnv_u64(h, (uint64_t)bk->status_offset);
    for (int p = 0; p < kNvPhases; p++) {
        h = mxs__fnv_u64(h, (uint64_t)(uintptr_t)bk->table[p]);
        h = mxs__fnv_u64(h, (uint64_t)bk->units[p]);
        h = mxs__fnv_u64(h, (uint64_t)bk->tiles[p]);
    }
    h = mxs__fnv_u64(h, (uint64_t)(int64_t)bk->round_through);
    h = mxs__fnv_u64(h, (uint64_t)(int64_t)bk->load_spec);
    h = mxs__fnv_u64(h, (uint64_t)(int64_t)bk->device);
    return h;
}

/* The header of a prepared bucket's phase. */
NvHead nv_bucket_head(const mxs_cuda_nvfp4_wb_bucket *bk, int ph) {
    NvHead h;
    memset(&h, 0, sizeof h);
    h.n = bk->n_items;
    h.rt = bk->round_through;
    h.w = bk->entry_bytes;
    h.packed = bk->packed;
    h.status_offset = bk->status_offset;
    h.units = bk->units[ph];
    h.tiles = bk->tiles[ph];
    h.tile_blocks = nv_tile_blocks(ph, h.tiles);
    return h;
}

/* A phase call's checks and launches: a prepared, unmodified bucket on the
 * device it was prepared on, no CUDA error pending; partial: the memset,
 * then one kernel; apply, finish: one kernel (none without work). */
mxs_status nv_bucket_run(const mxs_cuda_nvfp4_wb_bucket *bk, int ph, cudaStream_t stream) {
    int device;
    mxs_status s;
    if (!bk || bk->magic != MXS_CUDA_NVFP4_WB_BUCKET_MAGIC || bk->check != nv_bucket_hash(bk))
        return MXS_ERR_INVALID_ARGUMENT;
    if (launch_begin() != MXS_OK) return MXS_ERR_CUDA; /* peek before any other runtime call */
    if (cudaGetDevice(&device) != cudaSuccess) {
        (void)cudaGetLastError();
        return MXS_ERR_CUDA;
    }
    if (device != bk->device) return MXS_ERR_INVALID_ARGUMENT;
    if (ph == PH_PARTIAL && (s = nv_zero_packed(bk->packed, bk->packed_bytes, stream)) != MXS_OK) return s;
    const NvHead h = nv_bucket_head(bk, ph);
    const NvItem *table = static_cast<const NvItem *>(bk->table[ph]);
    const unsigned grid = grid_for(nv_blocks(h));
    if (grid > 0) {
        if (ph == PH_PARTIAL)
            nv_wb_launch<PH_PARTIAL>(bk->load_spec, grid, stream, nullptr, h, table);
        else if (ph == PH_APPLY)
            nv_wb_launch<PH_APPLY>(bk->load_spec, grid, stream, nullptr, h, table);
        else
            nv_wb_launch<PH_FINISH>(bk->load_spec, grid, stream, nullptr, h, table);
    }
    return launch_end();
}

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

mxs_status mxs_cuda_nvfp4_wb_partial(const mxs_nvfp4_wb_batch *b, const mxs_nvfp4_wb_plan *plan, void *packed,
                                     cudaStream_t stream) {
    mxs_status s = mxs__nvfp4_wb_check_phase(b, plan, packed);
    if (s != MXS_OK) return s;
    return nv_wb_run(b, plan, packed, PH_PARTIAL, stream);
}

mxs_status mxs_cuda_nvfp4_wb_apply(const mxs_nvfp4_wb_batch *b, const mxs_nvfp4_wb_plan *plan, const void *packed,
                                   cudaStream_t stream) {
    mxs_status s = mxs__nvfp4_wb_check_phase(b, plan, packed);
    if (s != MXS_OK) return s;
    return nv_wb_run(b, plan, packed, PH_APPLY, stream);
}

mxs_status mxs_cuda_nvfp4_wb_finish(const mxs_nvfp4_wb_batch *b, const mxs_nvfp4_wb_plan *plan, cudaStream_t stream) {
    mxs_status s = mxs__nvfp4_wb_check_plan(b, plan);
    if (s != MXS_OK) return s;
    if (b->n_items == 0) return MXS_OK;
    return nv_wb_run(b, plan, nullptr, PH_FINISH, stream);
}

mxs_status mxs_cuda_nvfp4_stage_to_col(const mxs_nvfp4_tensor *t, const uint8_t *stage, cudaStream_t stream) {
    mxs_status s = mxs_nvfp4_stage_to_col_check(t, stage);
    if (s != MXS_OK) return s;
    if ((s = launch_begin()) != MXS_OK) return s;
    NvChunk C; /* one finish record as a kernel parameter, as in nv_wb_run */
    memset(&C, 0, sizeof C);
    NvItem &I = C.it[0];
    nv_transpose_record(t->rows, t->cols, stage, t->col_data, &I);
    nv_item_work(&I, PH_FINISH, &I.units, &I.tiles);
    C.h.n = 1;
    C.h.units = I.units;
    C.h.tiles = I.tiles;
    C.h.tile_blocks = nv_tile_blocks(PH_FINISH, I.tiles);
    nv_wb_launch<PH_FINISH>(NV_ANY, grid_for(nv_blocks(C.h)), stream, &C, C.h, nullptr);
    return launch_end();
}

size_t mxs_cuda_nvfp4_wb_bucket_size(void) { return sizeof(mxs_cuda_nvfp4_wb_bucket); }

mxs_status mxs_cuda_nvfp4_wb_prepare_bytes(const mxs_nvfp4_wb_batch *b, int64_t *workspace_bytes) {
    mxs_nvfp4_wb_plan plan;
    mxs_status s;
    if (!workspace_bytes) return MXS_ERR_INVALID_ARGUMENT;
    if ((s = mxs_nvfp4_wb_make_plan(b, &plan, NULL)) != MXS_OK) return s;
    return nv_bucket_bytes(b->n_items, workspace_bytes);
}

mxs_status mxs_cuda_nvfp4_wb_prepare(mxs_cuda_nvfp4_wb_bucket *bucket, const mxs_nvfp4_wb_batch *b,
                                     const mxs_nvfp4_wb_plan *plan, void *packed, void *workspace,
                                     int64_t workspace_bytes, cudaStream_t stream) {
    mxs_cuda_nvfp4_wb_bucket bk;
    int64_t need = 0;
    mxs_status s;
    if (!bucket) return MXS_ERR_INVALID_ARGUMENT;
    memset(bucket, 0, sizeof *bucket);
    memset(&bk, 0, sizeof bk);
    /* the planned batch; packed non-NULL, aligned, over no buffer of it */
    if ((s = mxs__nvfp4_wb_check_phase(b, plan, packed)) != MXS_OK) return s;
    if ((s = nv_bucket_bytes(b->n_items, &need)) != MXS_OK) return s;
    if (need > 0 && (!workspace || !aligned(workspace, 16))) return MXS_ERR_INVALID_ARGUMENT;
    if (workspace_bytes < need) return MXS_ERR_BUFFER_SIZE;
    if (mxs__overlap(packed, plan->packed_bytes, workspace, need)) return MXS_ERR_ALIASING;
    if ((s = mxs_nvfp4_wb_check_buffer(b, workspace, need)) != MXS_OK) return s;
    if ((s = launch_begin()) != MXS_OK) return s;
    if (cudaGetDevice(&bk.device) != cudaSuccess) {
        (void)cudaGetLastError();
        return MXS_ERR_CUDA;
    }
    bk.n_items = b->n_items;
    bk.packed = packed;
    bk.packed_bytes = plan->packed_bytes;
    bk.entry_bytes = plan->entry_bytes;
    bk.status_offset = plan->status_offset;
    bk.round_through = (int)b->round_through;
    bk.load_spec = nv_wb_spec(nv_master_dtype(b, 0, b->n_items), (int)b->round_through);
    for (int ph = 0; ph < kNvPhases; ph++) {
        NvItem *dev = static_cast<NvItem *>(workspace) + (int64_t)ph * b->n_items;
        NvHead h = nv_head(b, plan, packed);
        int64_t at = b->n_items;
        NvChunk C; /* ~30 KB: the records travel to the table as kernel parameters */
        for (int64_t i0 = 0; i0 < b->n_items; i0 += kChunk) {
            const int64_t i1 = b->n_items - i0 < kChunk ? b->n_items : i0 + kChunk;
            memset(&C, 0, sizeof C);
            nv_items_build(b, i0, i1, ph, &at, &h, C.it);
            nv_table_store<<<1, kNvThreads, 0, stream>>>(C, dev + i0, i1 - i0);
            if ((s = launch_end()) != MXS_OK) return s;
        }
        bk.table[ph] = b->n_items > 0 ? dev : nullptr;
        bk.units[ph] = h.units;
        bk.tiles[ph] = h.tiles;
    }
    bk.check = nv_bucket_hash(&bk);
    bk.magic = MXS_CUDA_NVFP4_WB_BUCKET_MAGIC;
    *bucket = bk;
    return MXS_OK;
}

mxs_status mxs_cuda_nvfp4_wb_bucket_partial(const mxs_cuda_nvfp4_wb_bucket *bucket, cudaStream_t stream) {
    return nv_bucket_run(bucket, PH_PARTIAL, stream);
}

mxs_status mxs_cuda_nvfp4_wb_bucket_apply(const mxs_cuda_nvfp4_wb_bucket *bucket, cudaStream_t stream) {
    return nv_bucket_run(bucket, PH_APPLY, stream);
}

mxs_status mxs_cuda_nvfp4_wb_bucket_finish(const mxs_cuda_nvfp4_wb_bucket *bucket, cudaStream_t stream) {
    return nv_bucket_run(bucket, PH_FINISH, stream);
}

mxs_status mxs_cuda_nvfp4_wb_bucket_release(mxs_cuda_nvfp4_wb_bucket *bucket) {
    if (!bucket) return MXS_ERR_INVALID_ARGUMENT;
    memset(bucket, 0, sizeof *bucket);
    return MXS_OK;
}

} /* extern "C" */
