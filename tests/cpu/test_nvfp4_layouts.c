/* SPDX-License-Identifier: MIT */
/* docs/contract.md section 9.5: NVFP4 scale layouts. Scale shapes and sizes,
 * the swizzled offsets against the literal formula and their inverse, layout
 * conversion round trips (equal to quantize in each layout), and zero padding
 * entries. */
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

/* ---- scale layouts --------------------------------------------------------- */

Test(nvfp4, scale_shapes_and_sizes) {
    int64_t o, i;
    mxs_nvfp4_tensor t;
    cr_assert_eq(mxs_nvfp4_scale_shape(300, 70, MXS_ROWWISE, MXS_SCALES_COMPACT, &o, &i), MXS_OK);
    cr_assert(o == 300 && i == 5);
    cr_assert_eq(mxs_nvfp4_scale_shape(300, 70, MXS_ROWWISE, MXS_SCALES_PADDED, &o, &i), MXS_OK);
    cr_assert(o == 384 && i == 8);
    cr_assert_eq(mxs_nvfp4_scale_shape(300, 70, MXS_COLWISE, MXS_SCALES_COMPACT, &o, &i), MXS_OK);
    cr_assert(o == 70 && i == 19);
    cr_assert_eq(mxs_nvfp4_scale_shape(300, 70, MXS_COLWISE, MXS_SCALES_SWIZZLED, &o, &i), MXS_OK);
    cr_assert(o == 128 && i == 20);
    cr_assert_eq(mxs_nvfp4_scale_shape(1, 1, MXS_ROWWISE, MXS_SCALES_PADDED, &o, &i), MXS_OK);
    cr_assert(o == 128 && i == 4);
    cr_assert_eq(mxs_nvfp4_scale_shape(0, 1, MXS_ROWWISE, MXS_SCALES_PADDED, &o, &i), MXS_ERR_SHAPE);
    cr_assert_eq(mxs_nvfp4_scale_shape(1, 1, MXS_BOTH, MXS_SCALES_PADDED, &o, &i), MXS_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mxs_nvfp4_scale_shape(1, 1, MXS_ROWWISE, (mxs_scale_layout)3, &o, &i), MXS_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mxs_nvfp4_scale_shape(INT64_MAX / 2, 3, MXS_ROWWISE, MXS_SCALES_COMPACT, &o, &i), MXS_ERR_OVERFLOW);
    cr_assert_eq(mxs_nvfp4_scale_shape(INT64_MAX - 100, 1, MXS_ROWWISE, MXS_SCALES_COMPACT, &o, &i), MXS_ERR_OVERFLOW,
                 "round_up(M, 128) overflows");
    cr_assert_eq(mxs_nvfp4_scale_shape(1, INT64_MAX - 100, MXS_COLWISE, MXS_SCALES_PADDED, &o, &i), MXS_ERR_OVERFLOW);
    /* a 2^31-element weight is normal: 64-bit sizes */
    cr_assert_eq(mxs_nvfp4_scale_shape(262144, 8192, MXS_ROWWISE, MXS_SCALES_SWIZZLED, &o, &i), MXS_OK);
    cr_assert(o == 262144 && i == 512);
    cr_assert_eq(mxs_nvfp4_data_plane_bytes(262144, 8192), (int64_t)1 << 30);
    cr_assert_eq(mxs_nvfp4_data_plane_bytes(3, 3), 5);
    cr_assert_eq(mxs_nvfp4_data_plane_bytes(0, 3), 0);
    memset(&t, 0, sizeof t);
    t.rows = 300;
    t.cols = 70;
    t.dirs = MXS_BOTH;
    t.scale_layout = MXS_SCALES_PADDED;
    cr_assert_eq(mxs_nvfp4_data_bytes(&t), 10500);
    cr_assert_eq(mxs_nvfp4_scale_bytes(&t, MXS_ROWWISE), 384 * 8);
    cr_assert_eq(mxs_nvfp4_scale_bytes(&t, MXS_COLWISE), 128 * 20);
    cr_assert_eq(mxs_nvfp4_scale_bytes(&t, MXS_BOTH), -1);
    cr_assert_eq(mxs_nvfp4_storage_bytes(&t), 4 + 2 * 10500 + 384 * 8 + 128 * 20);
    t.dirs = MXS_ROWWISE;
    cr_assert_eq(mxs_nvfp4_scale_bytes(&t, MXS_COLWISE), -1);
    t.block = (mxs_nvfp4_block)2;
    cr_assert_eq(mxs_nvfp4_data_bytes(&t), -1);
    t.block = MXS_NVFP4_16X16;
    t.rows = INT64_MAX / 2;
    cr_assert_eq(mxs_nvfp4_tensor_check_shape(&t), MXS_ERR_OVERFLOW);
    /* index helpers */
    cr_assert_eq(mxs_nvfp4_data_index(3, 5, MXS_ROWWISE, 2, 4), 14);
    cr_assert_eq(mxs_nvfp4_data_index(3, 5, MXS_COLWISE, 2, 4), 14);
    cr_assert_eq(mxs_nvfp4_data_index(3, 5, MXS_COLWISE, 1, 2), 7);
    cr_assert_eq(mxs_nvfp4_scale_m(MXS_COLWISE, 40, 3), 3);
    cr_assert_eq(mxs_nvfp4_scale_k(MXS_COLWISE, 40, 3), 2);
    cr_assert_eq(mxs_nvfp4_scale_k(MXS_ROWWISE, 40, 33), 2);
}

Test(nvfp4, swizzle_matches_the_literal_formula_and_its_inverse) {
    static const int64_t dims[][2] = {{1, 1}, {130, 70}, {300, 1}, {1, 300}, {256, 128}, {17, 255}};
    int d, p, l;
    for (d = 0; d < 6; d++)
        for (p = MXS_ROWWISE; p <= MXS_COLWISE; p++)
            for (l = 0; l < 3; l++) {
                mxs_scale_geom g;
                int64_t m, k, off, mm, kk, bytes;
                uint8_t *seen;
                cr_assert(mxs_nvfp4_scale_geom_make(dims[d][0], dims[d][1], (mxs_dirs)p, (mxs_scale_layout)l, &g));
                bytes = mxs_scale_geom_bytes(&g);
                cr_assert_eq(bytes, ref_sbytes(dims[d][0], dims[d][1], p, l));
                seen = calloc((size_t)bytes, 1);
                for (m = 0; m < (l ? g.Mp : g.M); m++)
                    for (k = 0; k < (l ? g.Kp : g.K); k++) {
                        off = mxs_scale_geom_offset(&g, m, k);
                        if (m < g.M && k < g.K) cr_assert_eq(off, ref_soff(dims[d][0], dims[d][1], p, l, m, k));
                        cr_assert(off >= 0 && off < bytes);
                        cr_assert_eq(seen[off], 0, "offset %lld used twice", (long long)off);
                        seen[off] = 1;
                        mxs_scale_geom_coords(&g, off, &mm, &kk);
                        cr_assert(mm == m && kk == k);
                    }
                free(seen);
            }
}

Test(nvfp4, layout_conversion_round_trips_and_matches_quantize_in_each_layout) {
    t_rng rng = t_rng_seed(3);
    int it;
    for (it = 0; it < 24; it++) {
        int64_t rows = rand_dim16(&rng, 300), cols = rand_dim16(&rng, 300);
        int block = it % 2, p, from, to;
        float *src = alloc_src(MXS_F32, rows * cols);
        fx q[3];
        t_fill(&rng, src, MXS_F32, rows * cols);
        for (from = 0; from < 3; from++) {
            fx_make(&q[from], rows, cols, MXS_BOTH, block, from);
            cr_assert_eq(mxs_host_nvfp4_quantize(&q[from].t, src, MXS_F32, MXS_F32), MXS_OK);
        }
        for (p = 0; p < 2; p++)
            for (from = 0; from < 3; from++)
                for (to = 0; to < 3; to++) {
                    uint8_t *dst = t_alloc((size_t)q[to].sbytes[p]), *back = t_alloc((size_t)q[from].sbytes[p]);
                    cr_assert_eq(mxs_host_nvfp4_convert_scales(rows, cols, (mxs_dirs)(p + 1), (mxs_scale_layout)from,
                                                               q[from].scale[p], (mxs_scale_layout)to, dst),
                                 MXS_OK);
                    cr_assert_eq(t_first_diff(dst, q[to].scale[p], (size_t)q[to].sbytes[p]), -1,
                                 "%lldx%lld plane %d %d -> %d", (long long)rows, (long long)cols, p + 1, from, to);
                    cr_assert(t_guard_ok(dst, (size_t)q[to].sbytes[p]));
                    cr_assert_eq(mxs_host_nvfp4_convert_scales(rows, cols, (mxs_dirs)(p + 1), (mxs_scale_layout)to, dst,
                                                               (mxs_scale_layout)from, back),
                                 MXS_OK);
                    cr_assert_eq(t_first_diff(back, q[from].scale[p], (size_t)q[from].sbytes[p]), -1);
                    free(dst);
                    free(back);
                }
        /* data does not depend on the layout */
        for (p = 0; p < 2; p++) {
            cr_assert_eq(t_first_diff(q[0].data[p], q[1].data[p], (size_t)q[0].dbytes), -1);
            cr_assert_eq(t_first_diff(q[0].data[p], q[2].data[p], (size_t)q[0].dbytes), -1);
        }
        for (from = 0; from < 3; from++) fx_free(&q[from]);
        free(src);
    }
}

Test(nvfp4, padding_scale_entries_are_zero) {
    float src[3 * 20];
    fx f;
    mxs_scale_geom g;
    int64_t off, m, k;
    int j;
    for (j = 0; j < 60; j++) src[j] = 1.0f + (float)j;
    fx_make(&f, 3, 20, MXS_BOTH, MXS_NVFP4_16X16, MXS_SCALES_SWIZZLED);
    cr_assert_eq(mxs_host_nvfp4_quantize(&f.t, src, MXS_F32, MXS_F32), MXS_OK);
    cr_assert(mxs_nvfp4_scale_geom_make(3, 20, MXS_ROWWISE, MXS_SCALES_SWIZZLED, &g));
    for (off = 0; off < mxs_scale_geom_bytes(&g); off++) {
        mxs_scale_geom_coords(&g, off, &m, &k);
        if (m >= 3 || k >= 2)
            cr_assert_eq(f.scale[0][off], 0, "padding (%lld,%lld) - rows 3..15 of the last tile included", (long long)m,
                         (long long)k);
        else
            cr_assert_neq(f.scale[0][off], 0);
    }
    fx_free(&f);
}
