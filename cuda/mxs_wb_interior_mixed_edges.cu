/* SPDX-License-Identifier: MIT */
/* cuda/mxs_wb_interior_mixed_edges.cu - the masked interior kernels of
 * buckets with a column-wise plane (a shard edge cuts some item's groups:
 * interior_tile MASK), no wide column units: wb_interior_kernel<0, MIS,
 * true, false> with aligned and with element-aligned loads.
 *
 * A translation unit of their own so that they compile in parallel with the
 * other interior kernels (mxs_wb_interior_mixed.cu says why); launched by
 * mxs_writeback.cu (mixed_launch) through wb_interior_launch.
 */
#include "mxs_wb_kernels.cuh"

namespace mxs__cu {

template void wb_interior_launch<0, false, true, false>(const WbLaunch &);
template void wb_interior_launch<0, true, true, false>(const WbLaunch &);

} /* namespace mxs__cu */
