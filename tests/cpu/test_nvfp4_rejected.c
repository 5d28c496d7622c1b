/* SPDX-License-Identifier: MIT */
/* docs/contract.md section 9: rejected input to NVFP4 quantize, dequantize
 * and scale conversion writes nothing: every output stays poisoned. */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mxshard/mxshard.h>
#include <mxshard/nvfp4_quantize.h>

#include "common.h"
#include "nvfp4_fixture.h"
#include "nvfp4_ref.h"

/* ---- rejected input writes nothing ---------------------------------------- */

Test(nvfp4, bad_quantize_input_is_rejected_before_any_write) {
    float src[64 * 40];
    fx f;
    mxs_nvfp4_tensor t;
    int j;
    for (j = 0; j < 64 * 40; j++) src[j] = (float)j;
    fx_make(&f, 64, 40, MXS_BOTH, MXS_NVFP4_1X16, MXS_SCALES_PADDED);
#define EXPECT_REJECT(expr, code)                                                                                      \
    do {                                                                                                               \
        t = f.t;                                                                                                       \
        expr;                                                                                                          \
        cr_assert_eq(mxs_host_nvfp4_quantize(&t, src, MXS_F32, MXS_F32), code, "%s", #expr);                           \
        cr_assert(fx_all_poisoned(&f), "%s wrote an output", #expr);                                                   \
    } while (0)
    EXPECT_REJECT(t.dirs = 0, MXS_ERR_INVALID_ARGUMENT);
    EXPECT_REJECT(t.dirs = 4, MXS_ERR_INVALID_ARGUMENT);
    EXPECT_REJECT(t.scale_layout = (mxs_scale_layout)3, MXS_ERR_INVALID_ARGUMENT);
    EXPECT_REJECT(t.block = (mxs_nvfp4_block)2, MXS_ERR_INVALID_ARGUMENT);
    EXPECT_REJECT(t.amax = NULL, MXS_ERR_INVALID_ARGUMENT);
    EXPECT_REJECT(t.rows = 0, MXS_ERR_SHAPE);
    EXPECT_REJECT(t.cols = -1, MXS_ERR_SHAPE);
    EXPECT_REJECT((t.rows = INT64_MAX / 8, t.cols = 16), MXS_ERR_OVERFLOW);
    EXPECT_REJECT(t.row_data = NULL, MXS_ERR_ABSENT_PLANE);
    EXPECT_REJECT(t.col_scale = NULL, MXS_ERR_ABSENT_PLANE);
    EXPECT_REJECT(t.col_data = t.row_data, MXS_ERR_ALIASING);
    EXPECT_REJECT(t.row_scale = t.row_data + 100, MXS_ERR_ALIASING);
    EXPECT_REJECT(t.amax = (float *)(void *)(t.col_scale + 8), MXS_ERR_ALIASING);
    EXPECT_REJECT(t.row_data = (uint8_t *)(void *)(src + 10), MXS_ERR_ALIASING);
    EXPECT_REJECT(t.amax = src + 63 * 40, MXS_ERR_ALIASING);
#undef EXPECT_REJECT
    t = f.t;
    cr_assert_eq(mxs_host_nvfp4_quantize(NULL, src, MXS_F32, MXS_F32), MXS_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mxs_host_nvfp4_quantize(&t, NULL, MXS_F32, MXS_F32), MXS_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mxs_host_nvfp4_quantize(&t, src, (mxs_dtype)3, MXS_F32), MXS_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mxs_host_nvfp4_quantize(&t, src, MXS_F32, (mxs_dtype)-1), MXS_ERR_INVALID_ARGUMENT);
    cr_assert(fx_all_poisoned(&f));
    /* an absent plane's NULL pointers are fine, and its buffers stay untouched */
    t.dirs = MXS_COLWISE;
    t.row_data = NULL;
    t.row_scale = NULL;
    cr_assert_eq(mxs_host_nvfp4_quantize(&t, src, MXS_F32, MXS_F32), MXS_OK);
    cr_assert(t_all_poisoned(f.data[0], (size_t)f.dbytes) && t_all_poisoned(f.scale[0], (size_t)f.sbytes[0]));
    fx_free(&f);
}

Test(nvfp4, bad_dequantize_and_convert_input_is_rejected_before_any_write) {
    float src[20 * 33];
    fx f;
    mxs_nvfp4_tensor t;
    uint8_t *out = t_alloc(20 * 33 * 4), *sc = t_alloc(4096);
    int j;
    for (j = 0; j < 20 * 33; j++) src[j] = (float)j - 300.0f;
    fx_make(&f, 20, 33, MXS_ROWWISE, MXS_NVFP4_16X16, MXS_SCALES_COMPACT);
    cr_assert_eq(mxs_host_nvfp4_quantize(&f.t, src, MXS_F32, MXS_F32), MXS_OK);
    t = f.t;
    cr_assert_eq(mxs_host_nvfp4_dequantize(&t, MXS_COLWISE, out, MXS_F32), MXS_ERR_ABSENT_PLANE);
    cr_assert_eq(mxs_host_nvfp4_dequantize(&t, MXS_BOTH, out, MXS_F32), MXS_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mxs_host_nvfp4_dequantize(&t, MXS_ROWWISE, out, (mxs_dtype)5), MXS_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mxs_host_nvfp4_dequantize(&t, MXS_ROWWISE, NULL, MXS_F32), MXS_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mxs_host_nvfp4_dequantize(NULL, MXS_ROWWISE, out, MXS_F32), MXS_ERR_INVALID_ARGUMENT);
    t.amax = NULL;
    cr_assert_eq(mxs_host_nvfp4_dequantize(&t, MXS_ROWWISE, out, MXS_F32), MXS_ERR_INVALID_ARGUMENT);
    t = f.t;
    t.row_scale = NULL;
    cr_assert_eq(mxs_host_nvfp4_dequantize(&t, MXS_ROWWISE, out, MXS_F32), MXS_ERR_ABSENT_PLANE);
    t = f.t;
    t.rows = 0;
    cr_assert_eq(mxs_host_nvfp4_dequantize(&t, MXS_ROWWISE, out, MXS_F32), MXS_ERR_SHAPE);
    cr_assert(t_all_poisoned(out, 20 * 33 * 4));
    t = f.t;
    cr_assert_eq(mxs_host_nvfp4_dequantize(&t, MXS_ROWWISE, f.data[0] + 3, MXS_BF16), MXS_ERR_ALIASING);
    cr_assert_eq(mxs_host_nvfp4_dequantize(&t, MXS_ROWWISE, f.scale[0], MXS_F32), MXS_ERR_ALIASING);
    cr_assert_eq(mxs_host_nvfp4_dequantize(&t, MXS_ROWWISE, f.amax, MXS_F16), MXS_ERR_ALIASING);
    cr_assert_eq(mxs_host_nvfp4_dequantize(&t, MXS_ROWWISE, out, MXS_F32), MXS_OK);
    cr_assert(t_guard_ok(out, 20 * 33 * 4));
    /* convert */
    cr_assert_eq(mxs_host_nvfp4_convert_scales(20, 33, MXS_ROWWISE, MXS_SCALES_COMPACT, f.scale[0], MXS_SCALES_PADDED,
                                               f.scale[0] + 1),
                 MXS_ERR_ALIASING);
    cr_assert_eq(mxs_host_nvfp4_convert_scales(20, 33, MXS_BOTH, MXS_SCALES_COMPACT, f.scale[0], MXS_SCALES_PADDED, sc),
                 MXS_ERR_INVALID_ARGUMENT);
    cr_assert_eq(
        mxs_host_nvfp4_convert_scales(20, 33, MXS_ROWWISE, (mxs_scale_layout)7, f.scale[0], MXS_SCALES_PADDED, sc),
        MXS_ERR_INVALID_ARGUMENT);
    cr_assert_eq(
        mxs_host_nvfp4_convert_scales(20, 0, MXS_ROWWISE, MXS_SCALES_COMPACT, f.scale[0], MXS_SCALES_PADDED, sc),
        MXS_ERR_SHAPE);
    cr_assert_eq(mxs_host_nvfp4_convert_scales(20, 33, MXS_ROWWISE, MXS_SCALES_COMPACT, NULL, MXS_SCALES_PADDED, sc),
                 MXS_ERR_INVALID_ARGUMENT);
    cr_assert(t_all_poisoned(sc, 4096));
    fx_free(&f);
    free(out);
    free(sc);
}
