/* SPDX-License-Identifier: MIT */
/* cuda/mxs_wb_kernels.cuh - the writeback kernels (partial / apply) over
 * the work list of mxs_wb_list.cuh, and their launchers. Included by the
 * kernel translation units alone (mxs_wb_general.cu, mxs_wb_scales.cu,
 * mxs_wb_interior_*.cu), each of which explicitly instantiates the
 * launchers of its kernels; mxs_writeback.cu builds the list and calls the
 * launchers.
 *
 * A CTA finds the item of its unit with one binary search over unit_begin
 * (find_item; int_begin for the interior and scale units).
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

#include "mxs_wb_list.cuh"

namespace mxs__cu {

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

/* The launchers (declared in mxs_wb_list.cuh), one kernel each. */
template <unsigned PLANES, bool MIS, bool EDGES, bool WCOL> void wb_interior_launch(const WbLaunch &L) {
    wb_interior_kernel<PLANES, MIS, EDGES, WCOL>
        <<<L.grid, kThreads, 0, L.stream>>>(L.items, L.n_items, L.units, L.zero_units, L.status);
}

template <int MODE, unsigned PLANES, bool MIS> void wb_general_launch(const WbLaunch &L) {
    wb_kernel<MODE, PLANES, MIS><<<L.grid, kThreads, 0, L.stream>>>(L.items, L.n_items, L.units, L.status);
}

} /* namespace mxs__cu */

#endif /* MXSHARD_CUDA_WB_KERNELS_CUH */
