/* SPDX-License-Identifier: MIT */
/* cuda/mxs_nvfp4_wb.cuh - the NVFP4 writeback work list and its kernel
 * frame, shared by the phase kernels (mxs_nvfp4_wb_partial.cu, _apply.cu,
 * _finish.cu: one translation unit each, so they compile in parallel) and
 * the host side that builds the records and launches them
 * (mxs_nvfp4_writeback.cu).
 *
 * Two kinds of work share every writeback launch (docs/cuda.md "NVFP4"):
 *
 *   warp tiles    one 16-row group x 256 columns per warp (lane = 8
 *                 consecutive columns: 16-byte loads, 32-bit nibble
 *                 stores) on items with cols % 8 == 0: block amaxes and
 *                 multipliers in registers, each element read once
 *                 (finish: a CTA tile of 8 groups)
 *   thread units  one output unit per thread, computed from its inputs alone:
 *                 4 scale bytes (apply), or - on items off the tile path - a
 *                 packed entry, a data byte
 *
 * Each item owns a contiguous range of tiles and of units:
 *
 *   CTAs   | tile CTAs: item 0's tiles, item 1's ... | unit CTAs: item 0's units, ... |
 *          ^0                                        ^NvHead.tile_blocks
 *
 * and a warp (tile) or thread (unit) finds its item with one binary search
 * (nv_item_of). The unprepared calls pass the items as kernel parameters,
 * MXS_CUDA_NVFP4_CHUNK per launch (NvChunk, __grid_constant__); a prepared
 * bucket keeps the same records in its device workspace and launches once
 * per phase (nv_wb_table_kernel).
 *
 * No two threads ever write the same byte (shard boundaries are even, so a
 * data byte is wholly inside or outside a shard); only the tensor-amax
 * entries are raised atomically (one MAX per warp, after the partial's
 * memset).
 */
#ifndef MXSHARD_CUDA_NVFP4_WB_CUH
#define MXSHARD_CUDA_NVFP4_WB_CUH

#include "mxs_launch.cuh"
#include "mxs_nvfp4_tile.cuh"

namespace mxs__cu {

constexpr int kChunk = MXS_CUDA_NVFP4_CHUNK;

/* One item of a writeback chunk. */
struct alignas(16) NvItem {
    int64_t rows, cols, n;
    int64_t start, len;
    const void *master;
    uint8_t *data[2], *scale[2], *stage; /* data[0], stage: apply's outputs (planes or fragments: kOut*) */
    float *amax;
    mxs_scale_geom geom[2];
    int64_t sbytes[2];                                    /* scale bytes of the present planes (0: absent) */
    int64_t sunits[2];                                    /* apply: scale units (kNvScaleUnit entries each) */
    int64_t row_entry, col_entry, tile_entry, amax_entry; /* entry indices (-1: absent) */
    int64_t first_entry, n_entries;                       /* the item's block entries: contiguous */
    int64_t unit0, units;                                 /* this phase's thread units in the chunk */
    int64_t tile0, tiles;                                 /* this phase's warp tiles in the chunk */
    int64_t grp0, ctiles; /* tiles: first row group, column tiles per group (tile t: group grp0 + t / ctiles) */
    int dirs, two_d, dtype;
    int mis;    /* master loads element-aligned only (ld16_elems) */
    int out;    /* apply's outputs data[0] and stage: kOut* bits */
    int finish; /* finish transposes this item (mxs__nvfp4_wb_finishes) */
    int half;   /* partial: a warp tile is half a row group, 8 rows (kNvHalfTiles) */
};

/* NvItem.out: whether an apply output is a fragment (its byte 0 is plane
 * byte start/2) and whether its plane byte 0 is 4-byte aligned (32-bit
 * stores). One word, so that the bucket's records cost the apply kernel no
 * registers over in-place outputs (start is loaded anyway). */
enum { kOutRowFrag = 1, kOutStageFrag = 2, kOutRowSt4 = 4, kOutStageSt4 = 8 };

/* Apply's scale units: kNvScaleUnit stored entries of one stored row
 * each (4 words of 4 bytes), over a stored row of nv_scale_kdim entries. */
constexpr int64_t kNvScaleUnit = 16;
__host__ __device__ __forceinline__ int64_t nv_scale_kdim(const mxs_scale_geom &G) {
    return G.layout == MXS_SCALES_COMPACT ? G.K : G.Kp;
}
__host__ __device__ __forceinline__ int64_t nv_scale_units(const mxs_scale_geom &G) {
    return (G.layout == MXS_SCALES_COMPACT ? G.M : G.Mp) * mxs_ceil_div(nv_scale_kdim(G), kNvScaleUnit);
}

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

/* Finish's CTA tile: kFinishGroups 16-row groups (mxs_nvfp4_wb_finish.cu),
 * parked in shared memory as [group][column] 8-byte words, kFinishPitch
 * words per group: the 2 extra words put the 8 groups of a column on
 * different banks (see the store loop there). */
constexpr int kFinishGroups = kNvWarps; /* 8 groups = 128 rows per CTA tile */
constexpr int kFinishPitch = kNvTileCols + 2;

/* A writeback phase for nv_wb_body: one tile (a warp's; finish: the CTA's,
 * with the shared-memory tile sm) and one thread unit. Declared here, the
 * members defined (explicit specialisations) in the phase's translation
 * unit: mxs_nvfp4_wb_partial.cu, _apply.cu, _finish.cu. */
template <int PH> struct NvPhase {
    static constexpr int kPhase = PH;
    template <int DT, int RT>
    __device__ static void tile(const NvHead &C, const NvItem &I, int64_t t, uint2 (*sm)[kFinishPitch]);
    __device__ static void unit(const NvHead &C, const NvItem *it, int64_t u);
};

/* ---- device helpers ------------------------------------------------------ */

/* Item I's block region of `plane` for `block`: mxs__nvfp4_wb_region, the
 * rule the host writeback and the plan share. Every call site names plane
 * and block as constants, so that the steps fold to ceil(cols/16) and 1
 * (row-wise blocks and the tiles) or 1 and ceil(rows/16) (column-wise
 * blocks): no step is stored in the item record. */
__device__ __forceinline__ mxs_wb_region nv_region(const NvItem &I, mxs_dirs plane, mxs_nvfp4_block block) {
    return mxs__nvfp4_wb_region(I.rows, I.cols, plane, block);
}

/* The packed entry of block (b, j) of the region at `first` (nv_region). */
__device__ __forceinline__ int64_t nv_entry(const NvItem &I, int64_t first, mxs_dirs plane, mxs_nvfp4_block block,
                                            int64_t b, int64_t j) {
    const mxs_wb_region g = nv_region(I, plane, block);
    return first + mxs_wb_region_entry(&g, b, j);
}
/* The three regions: 1x16 row-wise blocks (r, k), 1x16 column-wise blocks
 * (g, c) (block row g: rows 16g.., column c), 16x16 tiles (R, C). */
#define NV_ROW_ENTRY(I, r, k) nv_entry(I, (I).row_entry, MXS_ROWWISE, MXS_NVFP4_1X16, r, k)
#define NV_COL_ENTRY(I, g, c) nv_entry(I, (I).col_entry, MXS_COLWISE, MXS_NVFP4_1X16, g, c)
#define NV_TILE_ENTRY(I, R, C) nv_entry(I, (I).tile_entry, MXS_ROWWISE, MXS_NVFP4_16X16, R, C)

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

/* Where warp tile t of item I lies: row group g, rows [r0, r1), and this
 * lane's first column c0 (lane l: columns c0 .. c0 + 7 of each row). With
 * I.half the tiles of a group are its two halves (rows 16g .. 16g+7, then
 * 16g+8 .. 16g+15), each ctiles tiles wide. */
struct NvWarpTile {
    int64_t g, r0, r1, c0;
};
__device__ __forceinline__ NvWarpTile nv_warp_tile(const NvItem &I, int64_t t) {
    NvWarpTile w;
    const int64_t tr = t / I.ctiles, h = MXS_NVFP4_BLOCK >> I.half; /* tile row, rows per tile */
    w.g = I.grp0 + (tr >> I.half);
    w.c0 = (t - tr * I.ctiles) * kNvTileCols + (int64_t)(threadIdx.x & 31u) * 8;
    w.r0 = w.g * MXS_NVFP4_BLOCK + (tr & I.half) * h;
    w.r1 = w.r0 + h < I.rows ? w.r0 + h : I.rows;
    return w;
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

/* The 8 elements f .. f+7 of a tile row, all inside the shard: one vector
 * load (two for f32). */
template <int DT, int RT>
__device__ __forceinline__ void nv_vec8(const NvHead &C, const NvItem &I, int64_t f, float *x) {
    const int dt = DT >= 0 ? DT : I.dtype, rt = DT >= 0 ? RT : nv_eff_rt(I.dtype, C.rt);
    nv_vec8_load(I.master, dt, f - I.start, rt, I.mis, x);
}

/* The 8 elements f .. f+7 of a tile row (0 outside the shard): one vector
 * load when all 8 are inside, else element by element. */
template <int DT, int RT>
__device__ __forceinline__ void nv_load8(const NvHead &C, const NvItem &I, int64_t f, float *x) {
    const int dt = DT >= 0 ? DT : I.dtype, rt = DT >= 0 ? RT : nv_eff_rt(I.dtype, C.rt);
    const int64_t end = I.start + I.len;
    if (f >= I.start && f + 8 <= end) {
        nv_vec8<DT, RT>(C, I, f, x);
        return;
    }
#pragma unroll
    for (int j = 0; j < 8; j++)
        x[j] = f + j >= I.start && f + j < end ? nv_load(I.master, dt, f + j - I.start, rt) : 0.0f;
}

__device__ __forceinline__ bool nv_remote_failed(const NvHead &C) {
    return static_cast<const uint8_t *>(C.packed)[C.status_offset] != 0;
}

/* ---- the kernels ----------------------------------------------------------
 *
 * A writeback phase: warp tiles, then thread units (partial after a memset
 * of the packed buffer: every entry 0, the status entry included; apply
 * writes nothing when a rank failed). P is the phase, NvPhase<PH_*>.
 * The items are kernel parameters (nv_wb_kernel: a chunk of the unprepared
 * calls) or a device table (nv_wb_table_kernel: a prepared bucket). */
template <class P, int DT, int RT> __device__ __forceinline__ void nv_wb_body(const NvHead &C, const NvItem *it) {
    __shared__ uint2 fsm[P::kPhase == PH_FINISH ? kFinishGroups : 1][kFinishPitch];
    if (P::kPhase == PH_APPLY && nv_remote_failed(C)) return;
    const int64_t blocks = C.tile_blocks + mxs_ceil_div(C.units, kNvThreads);
    for (int64_t blk = blockIdx.x; blk < blocks; blk += gridDim.x) {
        if (blk < C.tile_blocks) {
            /* partial, apply: a tile per warp; finish: a tile per CTA */
            const int64_t t = P::kPhase == PH_FINISH ? blk : blk * kNvWarps + threadIdx.x / 32;
            if (t >= C.tiles) continue;
            const NvItem &I = it[nv_item_of(C, it, t, true)];
            P::template tile<DT, RT>(C, I, t - I.tile0, fsm);
        } else {
            const int64_t u = (blk - C.tile_blocks) * kNvThreads + threadIdx.x;
            if (u >= C.units) continue;
            P::unit(C, it, u);
        }
    }
}

template <class P, int DT, int RT>
__global__ void __launch_bounds__(kNvThreads) nv_wb_kernel(const __grid_constant__ NvChunk C) {
    nv_wb_body<P, DT, RT>(C.h, C.it);
}

template <class P, int DT, int RT>
__global__ void __launch_bounds__(kNvThreads) nv_wb_table_kernel(const __grid_constant__ NvHead H, const NvItem *it) {
    nv_wb_body<P, DT, RT>(H, it);
}

/* The load specialisations instantiated for the writeback: f32 masters with
 * each round-through, and bf16 / f16 masters without one; anything else
 * (a launch mixing master dtypes, bf16 through f16, ...) runs the run-time
 * variant. */
enum { NV_F32, NV_F32_BF16, NV_F32_F16, NV_BF16, NV_F16, NV_ANY };

/* Launches phase P over chunk C (C != NULL) or the table `it` (C == NULL). */
template <class P, int DT, int RT>
void nv_wb_launch1(unsigned grid, cudaStream_t stream, const NvChunk *C, const NvHead &h, const NvItem *it) {
    if (C)
        nv_wb_kernel<P, DT, RT><<<grid, kNvThreads, 0, stream>>>(*C);
    else
        nv_wb_table_kernel<P, DT, RT><<<grid, kNvThreads, 0, stream>>>(h, it);
}

/* ... in load specialisation `spec` (NV_F32 .. NV_ANY). */
template <class P>
void nv_wb_launch_spec(int spec, unsigned grid, cudaStream_t stream, const NvChunk *C, const NvHead &h,
                       const NvItem *it) {
    switch (spec) {
    case NV_F32: nv_wb_launch1<P, MXS_F32, MXS_F32>(grid, stream, C, h, it); break;
    case NV_F32_BF16: nv_wb_launch1<P, MXS_F32, MXS_BF16>(grid, stream, C, h, it); break;
    case NV_F32_F16: nv_wb_launch1<P, MXS_F32, MXS_F16>(grid, stream, C, h, it); break;
    case NV_BF16: nv_wb_launch1<P, MXS_BF16, MXS_F32>(grid, stream, C, h, it); break;
    case NV_F16: nv_wb_launch1<P, MXS_F16, MXS_F32>(grid, stream, C, h, it); break;
    default: nv_wb_launch1<P, kNvAnyDtype, kNvAnyDtype>(grid, stream, C, h, it); break;
    }
}

/* The phase launchers, one per translation unit (hidden: not part of the
 * library's ABI). Each enqueues one kernel of `grid` CTAs over chunk C
 * (C != NULL) or the prepared table `it` with header h. */
MXS__CU_INTERNAL void nv_wb_launch_partial(int spec, unsigned grid, cudaStream_t stream, const NvChunk *C,
                                           const NvHead &h, const NvItem *it);
MXS__CU_INTERNAL void nv_wb_launch_apply(int spec, unsigned grid, cudaStream_t stream, const NvChunk *C,
                                         const NvHead &h, const NvItem *it);
MXS__CU_INTERNAL void nv_wb_launch_finish(unsigned grid, cudaStream_t stream, const NvChunk *C, const NvHead &h,
                                          const NvItem *it);

} /* namespace mxs__cu */

#endif /* MXSHARD_CUDA_NVFP4_WB_CUH */
