/* SPDX-License-Identifier: MIT */
/* cuda/mxs_wb_scales.cu - the fused apply's kernel: every scale plane of
 * the bucket written in its layout (mxs_scale_write.cuh) and the blocks
 * that straddle a shard edge (mxs_wb_edges.cuh). A translation unit of its
 * own, like every writeback kernel (mxs_wb_list.cuh), so that it compiles
 * in parallel with the others; launched by mxs_writeback.cu through
 * wb_scales_launch.
 */
#include "mxs_wb_kernels.cuh"

namespace mxs__cu {

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

void wb_scales_launch(const WbLaunch &L) {
    wb_scales_kernel<<<L.grid, kThreads, 0, L.stream>>>(L.items, L.n_items, L.units);
}

} /* namespace mxs__cu */
