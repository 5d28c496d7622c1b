/* SPDX-License-Identifier: MIT */
/* cuda/mxs_wb_general.cu - the general writeback kernels (run_tile: the
 * tile column past the last multiple of 128, items off the vector path,
 * STRICT partials and applies, and the partial's zero-fill):
 * wb_kernel<MODE, PLANES, MIS> for both phases, row-only (MXS_ROWWISE) and
 * per-item planes (0), aligned and element-aligned loads.
 *
 * A translation unit apart from the interior kernels, so that they compile
 * in parallel (mxs_wb_list.cuh); launched by mxs_writeback.cu (wb_launch)
 * through wb_general_launch.
 */
#include "mxs_wb_kernels.cuh"

namespace mxs__cu {

template void wb_general_launch<MXS__JOB_PARTIAL, MXS_ROWWISE, false>(const WbLaunch &);
template void wb_general_launch<MXS__JOB_PARTIAL, MXS_ROWWISE, true>(const WbLaunch &);
template void wb_general_launch<MXS__JOB_PARTIAL, 0, false>(const WbLaunch &);
template void wb_general_launch<MXS__JOB_PARTIAL, 0, true>(const WbLaunch &);
template void wb_general_launch<MXS__JOB_APPLY, MXS_ROWWISE, false>(const WbLaunch &);
template void wb_general_launch<MXS__JOB_APPLY, MXS_ROWWISE, true>(const WbLaunch &);
template void wb_general_launch<MXS__JOB_APPLY, 0, false>(const WbLaunch &);
template void wb_general_launch<MXS__JOB_APPLY, 0, true>(const WbLaunch &);

} /* namespace mxs__cu */
