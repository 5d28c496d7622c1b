/* SPDX-License-Identifier: MIT */
/* libmxshard_host: the header-only host API compiled into a shared library,
 * for FFI users (the Python package loads it with ctypes).
 *
 * MXS_API is defined as an exported, non-inline definition before any
 * mxshard header is included, so every public host function (mxs_host_*,
 * mxs_wb_*, mxs_tensor_*, mxs_scale_bytes, mxs_status_str, ...) becomes a real
 * symbol of this library. The library is built with -fvisibility=hidden:
 * only those MXS_API functions and the few below are exported. */
#define MXS_API __attribute__((visibility("default")))
#include <mxshard/mxshard.h>

#define MXS__HOST_EXPORT __attribute__((visibility("default")))

/* Runtime version of the headers this library was built from:
 * MAJOR*10000 + MINOR*100 + PATCH (compare with the header's MXS_VERSION_*). */
MXS__HOST_EXPORT int mxs_host_version(void);
MXS__HOST_EXPORT int mxs_host_version(void) {
    return MXS_VERSION_MAJOR * 10000 + MXS_VERSION_MINOR * 100 + MXS_VERSION_PATCH;
}

/* sizeof / offsetof facts of the structs an FFI mirrors, so a binding can
 * check its own layout at load time. `which`:
 *   0 mxs_tensor   1 mxs_wb_item   2 mxs_wb_batch   3 mxs_wb_plan
 *   4 mxs_wb_slot  5 sizeof(enum)  (mxs_status, mxs_dtype, ...)
 *   6 mxs_wb_region
 *  10 offsetof(mxs_wb_item, master)         11 offsetof(mxs_wb_item, start)
 *  12 offsetof(mxs_wb_item, row_fragment)   13 offsetof(mxs_wb_batch, rounding)
 *  14 offsetof(mxs_wb_plan, fingerprint)    15 offsetof(mxs_tensor, row_data)
 *  16 offsetof(mxs_wb_plan, status_offset)  17 offsetof(mxs_wb_plan, local_hash)
 * NVFP4 (nvfp4.h, nvfp4_wbplan.h, nvfp4_writeback.h; the quantize and writeback entry points
 * are MXS_API, hence exported like the MXFP8 ones):
 *  20 mxs_nvfp4_tensor   21 mxs_nvfp4_wb_item   22 mxs_nvfp4_wb_batch
 *  23 mxs_nvfp4_wb_plan  24 mxs_nvfp4_wb_slot
 *  30 offsetof(mxs_nvfp4_tensor, block)        31 offsetof(mxs_nvfp4_tensor, row_data)
 *  32 offsetof(mxs_nvfp4_tensor, amax)         33 offsetof(mxs_nvfp4_wb_item, master)
 *  34 offsetof(mxs_nvfp4_wb_item, start)       35 offsetof(mxs_nvfp4_wb_item, col_stage)
 *  36 offsetof(mxs_nvfp4_wb_batch, round_through)
 *  37 offsetof(mxs_nvfp4_wb_plan, packed_count) 38 offsetof(mxs_nvfp4_wb_plan, fingerprint)
 *  39 offsetof(mxs_nvfp4_wb_plan, status_offset) 40 offsetof(mxs_nvfp4_wb_plan, local_hash)
 * Returns 0 for any other value. */
MXS__HOST_EXPORT size_t mxs_host_struct_size(int which);
MXS__HOST_EXPORT size_t mxs_host_struct_size(int which) {
    switch (which) {
    case 0: return sizeof(mxs_tensor);
    case 1: return sizeof(mxs_wb_item);
    case 2: return sizeof(mxs_wb_batch);
    case 3: return sizeof(mxs_wb_plan);
    case 4: return sizeof(mxs_wb_slot);
    case 5: return sizeof(mxs_status);
    case 6: return sizeof(mxs_wb_region);
    case 10: return offsetof(mxs_wb_item, master);
    case 11: return offsetof(mxs_wb_item, start);
    case 12: return offsetof(mxs_wb_item, row_fragment);
    case 13: return offsetof(mxs_wb_batch, rounding);
    case 14: return offsetof(mxs_wb_plan, fingerprint);
    case 15: return offsetof(mxs_tensor, row_data);
    case 16: return offsetof(mxs_wb_plan, status_offset);
    case 17: return offsetof(mxs_wb_plan, local_hash);
    case 20: return sizeof(mxs_nvfp4_tensor);
    case 21: return sizeof(mxs_nvfp4_wb_item);
    case 22: return sizeof(mxs_nvfp4_wb_batch);
    case 23: return sizeof(mxs_nvfp4_wb_plan);
    case 24: return sizeof(mxs_nvfp4_wb_slot);
    case 30: return offsetof(mxs_nvfp4_tensor, block);
    case 31: return offsetof(mxs_nvfp4_tensor, row_data);
    case 32: return offsetof(mxs_nvfp4_tensor, amax);
    case 33: return offsetof(mxs_nvfp4_wb_item, master);
    case 34: return offsetof(mxs_nvfp4_wb_item, start);
    case 35: return offsetof(mxs_nvfp4_wb_item, col_stage);
    case 36: return offsetof(mxs_nvfp4_wb_batch, round_through);
    case 37: return offsetof(mxs_nvfp4_wb_plan, packed_count);
    case 38: return offsetof(mxs_nvfp4_wb_plan, fingerprint);
    case 39: return offsetof(mxs_nvfp4_wb_plan, status_offset);
    case 40: return offsetof(mxs_nvfp4_wb_plan, local_hash);
    default: return 0;
    }
}

/* The geometry rules that are MXS_HOST_DEVICE in the headers (static inline,
 * so shared with the kernels but no symbol of their own), exported under
 * mxs_host_* names for FFI users: the Python package asks these instead of
 * working the shapes and the packed layout out again. */

/* mxs_scale_shape (tensor.h). */
MXS__HOST_EXPORT mxs_status mxs_host_scale_shape(int64_t rows, int64_t cols, mxs_dirs plane, mxs_scale_layout layout,
                                                 int64_t *outer, int64_t *inner);
MXS__HOST_EXPORT mxs_status mxs_host_scale_shape(int64_t rows, int64_t cols, mxs_dirs plane, mxs_scale_layout layout,
                                                 int64_t *outer, int64_t *inner) {
    return mxs_scale_shape(rows, cols, plane, layout, outer, inner);
}

/* mxs_nvfp4_scale_shape (nvfp4.h). */
MXS__HOST_EXPORT mxs_status mxs_host_nvfp4_scale_shape(int64_t rows, int64_t cols, mxs_dirs plane,
                                                       mxs_scale_layout layout, int64_t *outer, int64_t *inner);
MXS__HOST_EXPORT mxs_status mxs_host_nvfp4_scale_shape(int64_t rows, int64_t cols, mxs_dirs plane,
                                                       mxs_scale_layout layout, int64_t *outer, int64_t *inner) {
    return mxs_nvfp4_scale_shape(rows, cols, plane, layout, outer, inner);
}

/* mxs_wb_region_make (writeback.h). */
MXS__HOST_EXPORT mxs_status mxs_host_wb_region(int64_t rows, int64_t cols, mxs_dirs plane, mxs_wb_region *out);
MXS__HOST_EXPORT mxs_status mxs_host_wb_region(int64_t rows, int64_t cols, mxs_dirs plane, mxs_wb_region *out) {
    return mxs_wb_region_make(rows, cols, plane, out);
}

/* mxs_nvfp4_wb_region_make (nvfp4_wbplan.h). */
MXS__HOST_EXPORT mxs_status mxs_host_nvfp4_wb_region(int64_t rows, int64_t cols, mxs_dirs plane, mxs_nvfp4_block block,
                                                     mxs_wb_region *out);
MXS__HOST_EXPORT mxs_status mxs_host_nvfp4_wb_region(int64_t rows, int64_t cols, mxs_dirs plane, mxs_nvfp4_block block,
                                                     mxs_wb_region *out) {
    return mxs_nvfp4_wb_region_make(rows, cols, plane, block, out);
}
