/* SPDX-License-Identifier: MIT */
/* cuda/mxs_wb_kernels.cuh - the writeback work list and its kernels
 * (partial / apply), shared by mxs_writeback.cu (which builds the list and
 * launches them).
 *
 * A prepared bucket is a table of WbItem in the caller's device workspace,
 * one per batch item and phase (built once by mxs_cuda_wb_prepare). Each
 * item owns a contiguous range of work units:
 *
 *   units   | item 0: tiles | zero-fill/scales | item 1: tiles | ... |
 *           ^unit_begin(0)                     ^unit_begin(1)
 *
 * general-kernel tiles (run_tile, mxs_tile.cuh) first, then the partial's
 * zero-fill of the packed buffer outside the touched groups (kZeroChunk
 * units, mxs_scales.cuh); apply's scale writes (ScaleWrite units,
 * mxs_scale_write.cuh) are numbered apart (int_begin) for their own kernel. A CTA finds the item of its unit with one
 * binary search over unit_begin (find_item). The interior tiles of a fused partial
 * - the whole 128-column tiles of every touched group on the vector path,
 * masked in the groups a shard edge cuts - have their own unit range
 * (int_begin) and go to the lean interior kernel.
 *
 * Template parameters: MIS, some item's vector loads are only
 * element-aligned (ld_vec8); EDGES (interior kernel), some item has masked
 * interior tiles. A bucket without them runs kernels without that code (the
 * registers of a kernel are the max over its paths).
 *
 * Launches per phase (mxs_writeback.cu):
 *   partial  1: the interior kernel, the zero-fill riding along, when no
 *            item has general-kernel tiles (cols % 128 != 0, off the vector
 *            path, STRICT) - or only the general kernel, when no item has
 *            interior tiles; 2 (interior, then general with the zero-fill)
 *            when a bucket has both, so that the interior tiles keep the
 *            interior kernel's registers.
 *   apply    1 when fused: wb_scales_kernel (every scale plane, and the
 *            straddling blocks: edge_span_unit, mxs_wb_edges.cuh); a
 *            non-fused (STRICT) apply casts every tile of the shard in the
 *            general kernel after it (2).
 */
#ifndef MXSHARD_CUDA_WB_KERNELS_CUH
#define MXSHARD_CUDA_WB_KERNELS_CUH

#include "mxs_scale_write.cuh"
#include "mxs_scales.cuh"
#include "mxs_tile.cuh"
#include "mxs_wb_edges.cuh"

namespace mxs__cu {

/* One item of a phase's work list (device copy in the workspace). */
struct WbItem {
    mxs__job job;
    int64_t unit_begin; /* first work unit of this item in the launch */
    int64_t tile_units, extra_units;
    int64_t T;               /* tile columns: ceil(cols/128) */
    int64_t g_first, g_last; /* the groups the shard touches (general-kernel tiles) */
    /* Partial: groups [ga, gb) lie wholly inside the shard. On the vector
     * path (fused, cols >= 128) the first T_int tile columns of EVERY
     * touched group [g_first, g_last] are whole 32 x 128 tiles (in a last
     * group of fewer than 32 rows: its rows x 128) and go to the interior
     * kernel (int_units of them, from int_begin), masked (interior_tile
     * MASK) in the groups outside [ga, gb), where the shard's edges cut.
     * The general kernel takes the tile columns >= T_int (cols % 128 != 0).
     * Without interior tiles T_int = 0 and ga = gb = g_last + 1.
     * Apply: int_units / int_begin number the item's scale-write units
     * (sw[0] then sw[1]) and edge units (span[0] then span[1]) for
     * wb_scales_kernel instead. */
    int64_t ga, gb, T_int, int_units, int_begin;
    /* Local interior numbering: [0, wide_from) the groups' tiles, g_first
     * + local / T_int; [wide_from, int_units) the short last group gb - 1
     * (at most kTY rows, wholly inside) in units of 4 tile columns
     * (interior_wide_tile, kWideShortGroups); wide_from = int_units: none.
     * wide_rpt: rows per thread of those units (1: at most 8 rows, in
     * units of 4 tile columns; 2: 9..16 rows, units of 2). */
    int64_t wide_from, wide_rpt;
    /* apply (fused): the (0, 1 or 2) edge spans holding the blocks that
     * straddle a shard edge (mxs_wb_edges.cuh); an unused one is all 0 */
    EdgeSpan span[2];
    /* partial: up to 4 packed byte ranges to zero (outside the touched groups) */
    uint8_t *zero_ptr[4];
    int64_t zero_len[4];
    /* apply: the reduced exponents into the primary's scale planes
     * (mxs_scale_write.cuh) */
    ScaleWrite sw[2];
};
static_assert(sizeof(WbItem) % 8 == 0, "WbItem tables are stored back to back, 8-byte aligned");

/* The one search: the last item whose first unit (unit_begin, or int_begin
 * for the interior units) is <= u. Probes go through the read-only path, so
 * after the first CTAs of an SM they hit L1. */
template <bool INTERIOR> __device__ __forceinline__ int64_t find_item(const WbItem *items, int64_t n_items, int64_t u) {
    int64_t a = 0, b = n_items - 1;
    while (a < b) {
        const int64_t mid = (a + b + 1) / 2;
        if (__ldg(INTERIOR ? &items[mid].int_begin : &items[mid].unit_begin) <= u)
            a = mid;
        else
            b = mid - 1;
    }
    return a;
}

/* Partial zero-fill: unit `local` of the item's 4 ranges' units, in order. */
__device__ __forceinline__ void zero_unit(const WbItem &it, int64_t local) {
    for (int q = 0; q < 4; q++) {
        const int64_t nu = zero_units(it.zero_ptr[q], it.zero_len[q]);
        if (local < nu) {
            zero_vec_unit(it.zero_ptr[q], it.zero_len[q], local);
            return;
        }
        local -= nu;
    }
}

/* Unit `local` of item `it` (general kernel). */
template <int MODE, unsigned PLANES, bool MIS>
__device__ __forceinline__ void wb_unit(const WbItem &it, int64_t local, TileSmem &sm) {
    const mxs__job &job = it.job;
    if (local < it.tile_units) {
        /* the tile columns >= T_int of every touched group */
        const int64_t strip = it.T - it.T_int;
        run_tile<MODE, PLANES, MIS>(job, it.g_first + local / strip, it.T_int + local % strip, sm);
        return;
    }
    local -= it.tile_units;
    if (MODE == MXS__JOB_PARTIAL) zero_unit(it, local); /* apply: its units are tiles only */
}

/* apply's scale writes and straddling blocks: units [0, units) in the
 * int_begin numbering (the item's ScaleWrite units of its two planes, then
 * the units of its edge spans, in order), in a kernel without run_tile, so
 * at the scale writer's own registers. */
__global__ void __launch_bounds__(kThreads)
    wb_scales_kernel(const WbItem *MXS_RESTRICT items, int64_t n_items, int64_t units) {
    __shared__ uint32_t sw[kThreads * 9];
    for (int64_t u = blockIdx.x; u < units; u += gridDim.x) {
        const int64_t a = find_item<true>(items, n_items, u);
        const WbItem &it = items[a];
        const int64_t local = u - it.int_begin, s0 = it.sw[0].units, s1 = it.sw[1].units;
        if (local >= s0 + s1) {
            const int64_t e = local - s0 - s1, e0 = edge_span_units(it.span[0]);
            edge_span_unit(it.job, it.span[e < e0 ? 0 : 1], e < e0 ? e : e - e0);
        } else if (local >= s0)
            scale_write_unit(it.sw[1], local - s0, sw);
        else
            scale_write_unit(it.sw[0], local, sw);
    }
}

/* Interior tile `local` of item `it`. PLANES = 0 (a bucket with both
 * kinds of item) picks the item's plane set here, so that every tile runs
 * code compiled for its planes: the kernel's registers are the max over the
 * three (ptxas: 80 instead of 93 for the runtime-planes tile; with masked
 * tiles 94 instead of 110). dirs is ROWWISE, COLWISE or BOTH (checked at
 * prepare). WCOL: some item with a column-wise plane has wide units (its
 * short last group, interior_wide_tile); without them that code is left
 * out, and with it its registers (the plain kernel: 72 instead of 80). */
template <unsigned PLANES, bool MIS, bool EDGES, bool WCOL>
__device__ __forceinline__ void wb_interior_unit(const WbItem &it, int64_t local, TileSmem &sm) {
    if constexpr (PLANES == 0) {
        switch (it.job.planes) {
        case MXS_ROWWISE: wb_interior_unit<MXS_ROWWISE, MIS, EDGES, WCOL>(it, local, sm); return;
        case MXS_COLWISE: wb_interior_unit<MXS_COLWISE, MIS, EDGES, WCOL>(it, local, sm); return;
        default: wb_interior_unit<MXS_BOTH, MIS, EDGES, WCOL>(it, local, sm); return;
        }
    }
    const int dtype = (int)it.job.src_dtype;
    if ((WCOL || (PLANES & MXS_COLWISE) == 0) && local >= it.wide_from) {
        const int64_t g = it.gb - 1, tw = local - it.wide_from;
        if (it.wide_rpt == 2) {
            switch (dtype) {
            case MXS_F32: interior_wide_tile<MXS_F32, PLANES, MIS, 2>(it.job, g, tw, it.T_int, sm); break;
            case MXS_BF16: interior_wide_tile<MXS_BF16, PLANES, MIS, 2>(it.job, g, tw, it.T_int, sm); break;
            default: interior_wide_tile<MXS_F16, PLANES, MIS, 2>(it.job, g, tw, it.T_int, sm); break;
            }
            return;
        }
        switch (dtype) {
        case MXS_F32: interior_wide_tile<MXS_F32, PLANES, MIS>(it.job, g, tw, it.T_int, sm); break;
        case MXS_BF16: interior_wide_tile<MXS_BF16, PLANES, MIS>(it.job, g, tw, it.T_int, sm); break;
        default: interior_wide_tile<MXS_F16, PLANES, MIS>(it.job, g, tw, it.T_int, sm); break;
        }
        return;
    }
    const int64_t g = it.g_first + local / it.T_int, t = local % it.T_int;
    if (EDGES && (g < it.ga || g >= it.gb)) { /* a group the shard's edge cuts */
        switch (dtype) {
        case MXS_F32: interior_tile<MXS_F32, PLANES, true, MIS, true>(it.job, g, t, sm); break;
        case MXS_BF16: interior_tile<MXS_BF16, PLANES, true, MIS, true>(it.job, g, t, sm); break;
        default: interior_tile<MXS_F16, PLANES, true, MIS, true>(it.job, g, t, sm); break;
        }
        return;
    }
    switch (dtype) {
    case MXS_F32: interior_tile<MXS_F32, PLANES, true, MIS>(it.job, g, t, sm); break;
    case MXS_BF16: interior_tile<MXS_BF16, PLANES, true, MIS>(it.job, g, t, sm); break;
    default: interior_tile<MXS_F16, PLANES, true, MIS>(it.job, g, t, sm); break;
    }
}

/* The general kernel of a phase: units [0, units) of the work list. The
 * partial also writes 0 to the group status byte (status != NULL). */
template <int MODE, unsigned PLANES, bool MIS>
__global__ void __launch_bounds__(kThreads, 4)
    wb_kernel(const WbItem *MXS_RESTRICT items, int64_t n_items, int64_t units, uint8_t *status) {
    __shared__ TileSmem sm;
    if (status && blockIdx.x == 0 && threadIdx.x == 0) *status = 0;
    for (int64_t u = blockIdx.x; u < units; u += gridDim.x) {
        const int64_t a = find_item<false>(items, n_items, u);
        wb_unit<MODE, PLANES, MIS>(items[a], u - items[a].unit_begin, sm);
    }
}

/* The CTAs per SM an interior kernel is compiled for (ptxas then keeps it
 * within 65536 / (kThreads * n) registers). Measured (runs 19-19c in
 * bench/RESULTS.md): 7 for the row-only kernels (72 registers either way,
 * but without an 8-byte stack frame: 262,144 fewer local-memory sectors at
 * 8192^2, 2 % faster), for those with element-aligned loads (88-94
 * registers -> 72: the Megatron-like DP=8 rank 20 % faster despite spills;
 * at 6, 5 % slower again) and for the plain kernel without wide column
 * units (72 without spills); 6 for the plain kernel with them, whose spills
 * at 72 cost more than the 7th CTA gains (DP=1 8192^2: 113 vs 119 µs in
 * ncu), and for the masked kernel with aligned loads (start+13 both planes
 * 4-6 % faster than at 7 on three of four shapes). */
template <unsigned PLANES, bool MIS, bool EDGES, bool WCOL> constexpr int interior_ctas_per_sm() {
    return PLANES == 0 && !MIS && (EDGES || WCOL) ? 6 : 7;
}

/* The interior tiles of a fused partial (see WbItem::ga): units
 * [0, units). When no item has general-kernel tiles (tile_units == 0, so
 * unit_begin counts zero-fill units only), the partial's zero-fill runs here
 * too, as units [units, units + zero_units): one launch instead of two. */
template <unsigned PLANES, bool MIS, bool EDGES, bool WCOL>
__global__ void __launch_bounds__(kThreads, interior_ctas_per_sm<PLANES, MIS, EDGES, WCOL>())
    wb_interior_kernel(const WbItem *MXS_RESTRICT items, int64_t n_items, int64_t units, int64_t zero_units,
                       uint8_t *status) {
    __shared__ TileSmem sm;
    if (status && blockIdx.x == 0 && threadIdx.x == 0) *status = 0;
    for (int64_t u = blockIdx.x; u < units + zero_units; u += gridDim.x) {
        if (u >= units) {
            const int64_t z = u - units, a = find_item<false>(items, n_items, z);
            zero_unit(items[a], z - items[a].unit_begin);
            continue;
        }
        const int64_t a = find_item<true>(items, n_items, u);
        wb_interior_unit<PLANES, MIS, EDGES, WCOL>(items[a], u - items[a].int_begin, sm);
    }
}

/* Kernel parameters may take 32764 bytes (CUDA 12.1+, Volta+): the work
 * list travels to the workspace in parameter blocks of kStoreItems items
 * (no pageable host copy, no host buffer that must outlive the call). */
constexpr int kStoreItems = (int)(30000 / sizeof(WbItem));
static_assert(kStoreItems >= 1, "one item per parameter block at least");
struct WbStore {
    WbItem items[kStoreItems];
};
static_assert(sizeof(WbItem) % 4 == 0, "WbItem is copied as 32-bit words");
__global__ void __launch_bounds__(kThreads) table_store(const __grid_constant__ WbStore P, WbItem *dst, int64_t n) {
    const uint32_t *src = reinterpret_cast<const uint32_t *>(P.items);
    uint32_t *out = reinterpret_cast<uint32_t *>(dst);
    const int64_t words = n * (int64_t)(sizeof(WbItem) / 4);
    for (int64_t k = threadIdx.x; k < words; k += kThreads) out[k] = src[k];
}

} /* namespace mxs__cu */

#endif /* MXSHARD_CUDA_WB_KERNELS_CUH */
