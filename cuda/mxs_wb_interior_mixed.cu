/* SPDX-License-Identifier: MIT */
/* cuda/mxs_wb_interior_mixed.cu - the plain interior kernels of buckets
 * with a column-wise plane (the plane set picked per item,
 * wb_interior_unit): no masked tiles, no wide column units,
 * wb_interior_kernel<0, MIS, false, false> with aligned and with
 * element-aligned loads.
 *
 * Every mixed interior kernel inlines each tile once per plane set and
 * master dtype: cicc and ptxas take 20 s (the aligned one here) to 2 x 75 s
 * (masked, wide) for one of them, so the heavy ones have a translation
 * unit each and the units compile in parallel (mxs_wb_list.cuh; numbers:
 * bench/RESULTS.md "Build time, issue 36"). Launched by mxs_writeback.cu
 * (mixed_launch) through wb_interior_launch.
 */
#include "mxs_wb_kernels.cuh"

namespace mxs__cu {

template void wb_interior_launch<0, false, false, false>(const WbLaunch &);
template void wb_interior_launch<0, true, false, false>(const WbLaunch &);

} /* namespace mxs__cu */
