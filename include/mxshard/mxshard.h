/* SPDX-License-Identifier: MIT */
/* mxshard/mxshard.h - MXFP8 primary weights under sharded optimizers.
 *
 * Header-only host library (C99 and C++). Include this one header:
 *
 *     #include <mxshard/mxshard.h>
 *
 *   formats.h    f32 <-> E4M3, amax -> E8M0 (CEIL / FLOOR), bf16/f16
 *   status.h     mxs_status, mxs_status_str
 *   tensor.h     mxs_tensor, planes, scale layouts, mxs_scale_bytes
 *   geometry.h   which blocks a shard [start, start+len) touches
 *   quantize.h   mxs_host_quantize (copy-back), dequantize, scale layouts
 *   writeback.h  mxs_wb_make_plan, mxs_host_wb_partial / _apply
 *   nvfp4.h      NVFP4: f32 <-> E2M1, the E4M3 / global scale rules,
 *                mxs_nvfp4_tensor, its planes and scale layouts
 *   nvfp4_quantize.h  mxs_host_nvfp4_quantize / _dequantize / _convert_scales
 *   nvfp4_wbplan.h    mxs_nvfp4_wb_item / _batch, mxs_nvfp4_wb_make_plan, the
 *                     packed entries: the NVFP4 writeback's plan
 *   nvfp4_writeback.h mxs_host_nvfp4_wb_partial / _apply / _finish: the NVFP4
 *                     sharded writeback
 *
 * The compiled CUDA kernels are declared in <mxshard/cuda.h>, the NCCL glue
 * in <mxshard/nccl.h>. See README.md and docs/ for the manual.
 *
 * Nothing here allocates, prints, aborts or keeps global state; every
 * fallible call validates all its arguments before writing anything.
 */
#ifndef MXSHARD_MXSHARD_H
#define MXSHARD_MXSHARD_H

#include "config.h"
#include "formats.h"
#include "status.h"
#include "tensor.h"
#include "geometry.h"
#include "quantize.h"
#include "writeback.h"
#include "nvfp4.h"
#include "nvfp4_quantize.h"
#include "nvfp4_wbplan.h"
#include "nvfp4_writeback.h"

#endif /* MXSHARD_MXSHARD_H */
