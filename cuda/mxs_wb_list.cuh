/* SPDX-License-Identifier: MIT */
/* cuda/mxs_wb_list.cuh - the writeback work list and the launchers of its
 * kernels: what the host side (mxs_writeback.cu, which builds the list and
 * picks the kernels) and the kernel translation units (mxs_wb_*.cu, which
 * instantiate them) share.
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
 * mxs_scale_write.cuh) are numbered apart (int_begin) for their own kernel.
 * The interior tiles of a fused partial - the whole 128-column tiles of
 * every touched group on the vector path, masked in the groups a shard edge
 * cuts - have their own unit range (int_begin) and go to the lean interior
 * kernel. The kernels: mxs_wb_kernels.cuh.
 *
 * Each kernel instantiation is launched through a launcher of its own,
 * explicitly instantiated in exactly one kernel translation unit; the host
 * side sees only the declarations below, so it compiles no kernel, and the
 * instantiations (most of the library's build time: ptxas) compile in
 * parallel. A launcher the host side calls but no unit instantiates is an
 * undefined hidden symbol: the library does not link.
 */
#ifndef MXSHARD_CUDA_WB_LIST_CUH
#define MXSHARD_CUDA_WB_LIST_CUH

#include "mxs_launch.cuh"
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

/* Kernel parameters may take 32764 bytes (CUDA 12.1+, Volta+): the work
 * list travels to the workspace in parameter blocks of kStoreItems items
 * (no pageable host copy, no host buffer that must outlive the call). */
constexpr int kStoreItems = (int)(30000 / sizeof(WbItem));
static_assert(kStoreItems >= 1, "one item per parameter block at least");
struct WbStore {
    WbItem items[kStoreItems];
};
static_assert(sizeof(WbItem) % 4 == 0, "WbItem is copied as 32-bit words");

/* One launch of a writeback kernel: grid CTAs of kThreads on `stream` over
 * the work list `items` (n_items records). units: the kernel's units;
 * zero_units: the partial's zero-fill units riding along in an interior
 * launch (wb_interior_kernel); status: the group status byte the partial
 * zeroes (NULL: none). */
struct WbLaunch {
    unsigned grid;
    cudaStream_t stream;
    const WbItem *items;
    int64_t n_items, units, zero_units;
    uint8_t *status;
};

/* The launchers (hidden: not part of the library's ABI), one kernel each:
 *   wb_interior_launch  wb_interior_kernel<PLANES, MIS, EDGES, WCOL>
 *                       (mxs_wb_interior_*.cu)
 *   wb_general_launch   wb_kernel<MODE, PLANES, MIS> (mxs_wb_general.cu)
 *   wb_scales_launch    wb_scales_kernel (mxs_wb_scales.cu) */
template <unsigned PLANES, bool MIS, bool EDGES, bool WCOL> MXS__CU_INTERNAL void wb_interior_launch(const WbLaunch &L);
template <int MODE, unsigned PLANES, bool MIS> MXS__CU_INTERNAL void wb_general_launch(const WbLaunch &L);
MXS__CU_INTERNAL void wb_scales_launch(const WbLaunch &L);

} /* namespace mxs__cu */

#endif /* MXSHARD_CUDA_WB_LIST_CUH */
