/* SPDX-License-Identifier: MIT */
/* cuda/mxs_wb_interior_mixed_edges.cu - the masked interior kernel of
 * buckets with a column-wise plane (a shard edge cuts some item's groups:
 * interior_tile MASK), no wide column units, aligned loads:
 * wb_interior_kernel<0, false, true, false>.
 *
 * A translation unit of its own so that it compiles in parallel with the
 * other interior kernels (mxs_wb_interior_mixed.cu says why); launched by
 * mxs_writeback.cu (mixed_launch) through wb_interior_launch.
 */
#include "mxs_wb_kernels.cuh"

namespace mxs__cu {

template void wb_interior_launch<0, false, true, false>(const WbLaunch &);

} /* namespace mxs__cu */
