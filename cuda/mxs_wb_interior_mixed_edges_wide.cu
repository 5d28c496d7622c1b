/* SPDX-License-Identifier: MIT */
/* cuda/mxs_wb_interior_mixed_edges_wide.cu - the masked interior kernel of
 * buckets with a column-wise plane whose items have wide column units,
 * aligned loads: wb_interior_kernel<0, false, true, true>, the largest
 * kernel of the library with its element-aligned twin
 * (mxs_wb_interior_mixed_edges_wide_mis.cu).
 *
 * A translation unit of its own so that it compiles in parallel with the
 * other interior kernels (mxs_wb_interior_mixed.cu says why); launched by
 * mxs_writeback.cu (mixed_launch) through wb_interior_launch.
 */
#include "mxs_wb_kernels.cuh"

namespace mxs__cu {

template void wb_interior_launch<0, false, true, true>(const WbLaunch &);

} /* namespace mxs__cu */
