/* SPDX-License-Identifier: MIT */
/* cuda/mxs_wb_interior_row.cu - the interior kernels of row-only buckets:
 * wb_interior_kernel<MXS_ROWWISE, MIS, EDGES, false> for the four
 * combinations of element-aligned loads (MIS) and masked tiles (EDGES).
 *
 * One translation unit per group of interior instantiations, so that they
 * compile in parallel (mxs_wb_list.cuh); launched by mxs_writeback.cu
 * (phase_launch) through wb_interior_launch.
 */
#include "mxs_wb_kernels.cuh"

namespace mxs__cu {

template void wb_interior_launch<MXS_ROWWISE, false, false, false>(const WbLaunch &);
template void wb_interior_launch<MXS_ROWWISE, false, true, false>(const WbLaunch &);
template void wb_interior_launch<MXS_ROWWISE, true, false, false>(const WbLaunch &);
template void wb_interior_launch<MXS_ROWWISE, true, true, false>(const WbLaunch &);

} /* namespace mxs__cu */
