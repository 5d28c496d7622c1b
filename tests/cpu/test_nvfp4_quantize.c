/* SPDX-License-Identifier: MIT */
/* docs/contract.md section 9: NVFP4 whole-tensor quantize and dequantize
 * against the naive reference of nvfp4_ref.h, over random shapes (1-element
 * dims, non-multiples of 16), every plane set, both block shapes, every
 * layout, every source dtype and round-through; the bf16 round-through, NaN,
 * the dequantize error bound and formula, 16x16 tiles and the transposed
 * plane. Every output is poisoned and followed by guard bytes. */
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

static const char *dtn[3] = {"f32", "bf16", "f16"};

/* ---- whole-tensor quantize against the reference ------------------------- */

/* Quantizes one random case with the library and the reference; compares
 * every byte and the guards. Returns nothing; asserts. */
static void check_case(t_rng *rng, int64_t rows, int64_t cols, unsigned dirs, int block, int layout, mxs_dtype dt,
                       mxs_dtype rt, int finite) {
    int64_t n = rows * cols;
    void *src = alloc_src(dt, n);
    fx f;
    int p;
    float amax, s_enc;
    uint8_t *rd = malloc((size_t)(n + 1) / 2 + 1), *rs;
    if (finite)
        fill_finite(rng, src, dt, n, dt == MXS_F16 || rt == MXS_F16);
    else
        t_fill(rng, src, dt, n);
    fx_make(&f, rows, cols, dirs, block, layout);
    cr_assert_eq(mxs_host_nvfp4_quantize(&f.t, src, dt, rt), MXS_OK);
    amax = ref_global_amax(n, src, dt, rt);
    s_enc = ref_s_enc(amax);
    cr_assert_eq(mxs_f32_bits(fx_amax(&f)), mxs_f32_bits(amax), "global amax %g vs %g", (double)fx_amax(&f),
                 (double)amax);
    for (p = 0; p < 2; p++) {
        int64_t d;
        if (!(dirs & (unsigned)(p + 1))) {
            cr_assert(t_all_poisoned(f.data[p], (size_t)f.dbytes) && t_all_poisoned(f.scale[p], (size_t)f.sbytes[p]),
                      "absent plane %d written", p + 1);
            continue;
        }
        rs = malloc((size_t)f.sbytes[p] + 1);
        ref_plane(rows, cols, src, dt, rt, p + 1, block, layout, s_enc, rd, rs);
        d = t_first_diff(f.scale[p], rs, (size_t)f.sbytes[p]);
        cr_assert_eq(d, -1, "%lldx%lld plane %d block %d layout %d %s rt %s: scale byte %lld: %02x vs %02x",
                     (long long)rows, (long long)cols, p + 1, block, layout, dtn[dt], dtn[rt], (long long)d,
                     d >= 0 ? f.scale[p][d] : 0, d >= 0 ? rs[d] : 0);
        d = t_first_diff(f.data[p], rd, (size_t)f.dbytes);
        cr_assert_eq(d, -1, "%lldx%lld plane %d block %d layout %d %s rt %s: data byte %lld: %02x vs %02x",
                     (long long)rows, (long long)cols, p + 1, block, layout, dtn[dt], dtn[rt], (long long)d,
                     d >= 0 ? f.data[p][d] : 0, d >= 0 ? rd[d] : 0);
        cr_assert(t_guard_ok(f.data[p], (size_t)f.dbytes) && t_guard_ok(f.scale[p], (size_t)f.sbytes[p]),
                  "guard bytes of plane %d overwritten", p + 1);
        free(rs);
    }
    cr_assert(t_guard_ok(f.amax, sizeof(float)));
    free(rd);
    free(src);
    fx_free(&f);
}

Test(nvfp4, quantize_equals_reference_every_plane_block_layout_dtype, .timeout = 600) {
    t_rng rng = t_rng_seed(18);
    static const int64_t fixed[][2] = {{1, 1},  {1, 2},   {2, 1},   {1, 15},  {1, 16},  {1, 17},  {17, 1},
                                       {16, 1}, {15, 17}, {16, 16}, {33, 47}, {128, 4}, {129, 3}, {31, 130}};
    const int nfixed = (int)(sizeof fixed / sizeof fixed[0]);
    int it;
    for (it = 0; it < 160; it++) {
        int64_t rows = it < nfixed ? fixed[it][0] : rand_dim16(&rng, 200);
        int64_t cols = it < nfixed ? fixed[it][1] : rand_dim16(&rng, 200);
        unsigned dirs = (unsigned)(1 + it % 3);
        int block = (it / 3) % 2, layout = (it / 6) % 3;
        mxs_dtype dt = (mxs_dtype)t_below(&rng, 3), rt = (mxs_dtype)t_below(&rng, 3);
        check_case(&rng, rows, cols, dirs, block, layout, dt, rt, (int)(it % 4 == 0));
    }
}

Test(nvfp4, bf16_round_through_of_f32_equals_the_bf16_source) {
    t_rng rng = t_rng_seed(7);
    int it;
    for (it = 0; it < 12; it++) {
        int64_t rows = rand_dim16(&rng, 100), cols = rand_dim16(&rng, 100), n = rows * cols, i;
        float *x = alloc_src(MXS_F32, n);
        uint16_t *h = alloc_src(MXS_BF16, n);
        fx a, b;
        int p;
        t_fill(&rng, x, MXS_F32, n);
        for (i = 0; i < n; i++) h[i] = mxs_bf16_from_f32(x[i]);
        fx_make(&a, rows, cols, MXS_BOTH, it % 2, it % 3);
        fx_make(&b, rows, cols, MXS_BOTH, it % 2, it % 3);
        cr_assert_eq(mxs_host_nvfp4_quantize(&a.t, x, MXS_F32, MXS_BF16), MXS_OK);
        cr_assert_eq(mxs_host_nvfp4_quantize(&b.t, h, MXS_BF16, MXS_F32), MXS_OK);
        cr_assert_eq(mxs_f32_bits(fx_amax(&a)), mxs_f32_bits(fx_amax(&b)));
        for (p = 0; p < 2; p++) {
            cr_assert_eq(t_first_diff(a.data[p], b.data[p], (size_t)a.dbytes), -1);
            cr_assert_eq(t_first_diff(a.scale[p], b.scale[p], (size_t)a.sbytes[p]), -1);
        }
        fx_free(&a);
        fx_free(&b);
        free(x);
        free(h);
    }
}

Test(nvfp4, nan_is_ignored_by_the_amaxes_and_casts_to_plus_six) {
    float src[32];
    fx f;
    int j;
    for (j = 0; j < 32; j++) src[j] = (float)(j % 7) * 0.5f - 1.5f;
    src[3] = NAN;
    src[20] = -NAN;
    for (j = 16; j < 32; j++)
        if (j != 20) src[j] = j == 21 ? NAN : src[j];
    fx_make(&f, 1, 32, MXS_ROWWISE, MXS_NVFP4_1X16, MXS_SCALES_COMPACT);
    cr_assert_eq(mxs_host_nvfp4_quantize(&f.t, src, MXS_F32, MXS_F32), MXS_OK);
    cr_assert_eq(fx_amax(&f), 1.5f, "NaN ignored by the global amax");
    cr_assert_eq(f.scale[0][0], 0x7E, "block amax 1.5 = global amax -> 448");
    cr_assert_eq(mxs_nvfp4_get(f.data[0], 3), 0x7);
    cr_assert_eq(mxs_nvfp4_get(f.data[0], 20), 0x7, "negative NaN -> +6 too");
    cr_assert_eq(mxs_nvfp4_get(f.data[0], 21), 0x7);
    fx_free(&f);
    /* an all-NaN tensor: amax 0, S_enc 1, scales 0, every element +6 */
    for (j = 0; j < 32; j++) src[j] = NAN;
    fx_make(&f, 2, 16, MXS_BOTH, MXS_NVFP4_16X16, MXS_SCALES_COMPACT);
    cr_assert_eq(mxs_host_nvfp4_quantize(&f.t, src, MXS_F32, MXS_F32), MXS_OK);
    cr_assert_eq(fx_amax(&f), 0.0f);
    cr_assert_eq(f.scale[0][0], 0x00);
    for (j = 0; j < 16; j++) cr_assert_eq(f.data[0][j], 0x77);
    fx_free(&f);
}

/* ---- dequantize ---------------------------------------------------------- */

Test(nvfp4, dequantize_round_trip_is_within_the_block_error_bound) {
    t_rng rng = t_rng_seed(99);
    int it;
    for (it = 0; it < 60; it++) {
        int64_t rows = rand_dim16(&rng, 150), cols = rand_dim16(&rng, 150), n = rows * cols, r, c;
        mxs_dtype dt = (mxs_dtype)(it % 3), rt = (mxs_dtype)((it / 3) % 3);
        int block = (it / 9) % 2, layout = (int)t_below(&rng, 3), p;
        void *src = alloc_src(dt, n);
        float *out = malloc((size_t)n * sizeof(float)), *bam = malloc((size_t)n * sizeof(float)), amax, s_enc;
        uint16_t *out16 = malloc((size_t)n * 2);
        fx f;
        fill_finite(&rng, src, dt, n, dt == MXS_F16 || rt == MXS_F16);
        fx_make(&f, rows, cols, MXS_BOTH, block, layout);
        cr_assert_eq(mxs_host_nvfp4_quantize(&f.t, src, dt, rt), MXS_OK);
        amax = fx_amax(&f);
        s_enc = mxs_nvfp4_global_encode(amax);
        for (p = MXS_ROWWISE; p <= MXS_COLWISE; p++) {
            cr_assert_eq(mxs_host_nvfp4_dequantize(&f.t, (mxs_dirs)p, out, MXS_F32), MXS_OK);
            ref_block_amax_map(rows, cols, src, dt, rt, p, block, bam);
            for (r = 0; r < rows; r++)
                for (c = 0; c < cols; c++) {
                    float x = ref_value(src, dt, rt, r * cols + c), bamax = bam[r * cols + c];
                    double bound;
                    /* contract 9.6: |x' - x| <= bamax * (1 + 2^-4) / 6 + 6 * 2^-10 / S_enc, plus f32 slop */
                    bound = (double)bamax * (1.0625 / 6.0) * (1 + 1e-5) + 6.0 * 0.0009765625 / s_enc * (1 + 1e-5);
                    cr_assert_leq(fabs((double)out[r * cols + c] - (double)x), bound,
                                  "%lldx%lld plane %d block %d (%lld,%lld): x %g x' %g bound %g", (long long)rows,
                                  (long long)cols, p, block, (long long)r, (long long)c, (double)x,
                                  (double)out[r * cols + c], bound);
                }
            /* bf16 / f16 outputs are the f32 output rounded */
            cr_assert_eq(mxs_host_nvfp4_dequantize(&f.t, (mxs_dirs)p, out16, MXS_BF16), MXS_OK);
            for (r = 0; r < n; r++) cr_assert_eq(out16[r], mxs_bf16_from_f32(out[r]));
            cr_assert_eq(mxs_host_nvfp4_dequantize(&f.t, (mxs_dirs)p, out16, MXS_F16), MXS_OK);
            for (r = 0; r < n; r++) cr_assert_eq(out16[r], mxs_f16_from_f32(out[r]));
        }
        fx_free(&f);
        free(src);
        free(out);
        free(bam);
        free(out16);
    }
}

Test(nvfp4, dequantize_follows_te_formula_exactly) {
    t_rng rng = t_rng_seed(5);
    int64_t rows = 37, cols = 45, n = rows * cols, r, c;
    float *src = alloc_src(MXS_F32, n), *out = malloc((size_t)n * sizeof(float));
    fx f;
    t_fill(&rng, src, MXS_F32, n);
    fx_make(&f, rows, cols, MXS_BOTH, MXS_NVFP4_1X16, MXS_SCALES_SWIZZLED);
    cr_assert_eq(mxs_host_nvfp4_quantize(&f.t, src, MXS_F32, MXS_F32), MXS_OK);
    cr_assert_eq(mxs_host_nvfp4_dequantize(&f.t, MXS_COLWISE, out, MXS_F32), MXS_OK);
    for (r = 0; r < rows; r++)
        for (c = 0; c < cols; c++) {
            uint8_t q = mxs_nvfp4_get(f.data[1], c * rows + r);
            uint8_t sc = f.scale[1][ref_soff(rows, cols, MXS_COLWISE, MXS_SCALES_SWIZZLED, c, r / 16)];
            float want = mxs_e2m1_to_f32(q) * ((mxs_e4m3_to_f32(sc) * fx_amax(&f)) * (1.0f / 2688.0f));
            if (isnan(want))
                cr_assert_eq(mxs_f32_bits(out[r * cols + c]), 0x7FC00000u);
            else
                cr_assert_eq(mxs_f32_bits(out[r * cols + c]), mxs_f32_bits(want), "(%lld,%lld)", (long long)r,
                             (long long)c);
        }
    fx_free(&f);
    free(src);
    free(out);
}

/* ---- 16x16 tiles and the transposed plane --------------------------------- */

Test(nvfp4, tile_16x16_scales_repeat_over_rows_and_the_transpose_shares_them) {
    t_rng rng = t_rng_seed(1616);
    int it;
    for (it = 0; it < 30; it++) {
        int64_t rows = rand_dim16(&rng, 140), cols = rand_dim16(&rng, 140), m, k, r, c;
        int layout = it % 3;
        mxs_dtype dt = (mxs_dtype)(it % 3);
        void *src = alloc_src(dt, rows * cols);
        fx f;
        mxs_scale_geom g0, g1;
        t_fill(&rng, src, dt, rows * cols);
        fx_make(&f, rows, cols, MXS_BOTH, MXS_NVFP4_16X16, layout);
        cr_assert_eq(mxs_host_nvfp4_quantize(&f.t, src, dt, MXS_F32), MXS_OK);
        cr_assert(mxs_nvfp4_scale_geom_make(rows, cols, MXS_ROWWISE, (mxs_scale_layout)layout, &g0));
        cr_assert(mxs_nvfp4_scale_geom_make(rows, cols, MXS_COLWISE, (mxs_scale_layout)layout, &g1));
        for (m = 0; m < rows; m++)
            for (k = 0; k < g0.K; k++) {
                /* row m's entry equals row 16*(m/16)'s and the column-wise entry of (column 16k, row tile m/16) */
                uint8_t s = f.scale[0][mxs_scale_geom_offset(&g0, m, k)];
                cr_assert_eq(s, f.scale[0][mxs_scale_geom_offset(&g0, m / 16 * 16, k)]);
                cr_assert_eq(s, f.scale[1][mxs_scale_geom_offset(&g1, 16 * k, m / 16)]);
            }
        for (m = 0; m < cols; m++)
            for (k = 0; k < g1.K; k++) {
                int64_t tr, tc;
                mxs_nvfp4_entry_tile(MXS_COLWISE, m, k, &tr, &tc);
                cr_assert_eq(f.scale[1][mxs_scale_geom_offset(&g1, m, k)],
                             f.scale[0][mxs_scale_geom_offset(&g0, 16 * tr, tc)]);
            }
        /* same tile multiplier for both planes: the column-wise data is the nibble transpose */
        for (r = 0; r < rows; r++)
            for (c = 0; c < cols; c++)
                cr_assert_eq(mxs_nvfp4_get(f.data[0], r * cols + c), mxs_nvfp4_get(f.data[1], c * rows + r),
                             "%lldx%lld (%lld,%lld)", (long long)rows, (long long)cols, (long long)r, (long long)c);
        fx_free(&f);
        free(src);
    }
}

Test(nvfp4, colwise_plane_is_the_rowwise_plane_of_the_transpose) {
    t_rng rng = t_rng_seed(4242);
    int it;
    for (it = 0; it < 30; it++) {
        int64_t rows = rand_dim16(&rng, 130), cols = rand_dim16(&rng, 130), r, c;
        int block = it % 2, layout = (it / 2) % 3;
        float *src = alloc_src(MXS_F32, rows * cols), *tr = alloc_src(MXS_F32, rows * cols);
        fx a, b;
        t_fill(&rng, src, MXS_F32, rows * cols);
        for (r = 0; r < rows; r++)
            for (c = 0; c < cols; c++) tr[c * rows + r] = src[r * cols + c];
        fx_make(&a, rows, cols, MXS_COLWISE, block, layout);
        fx_make(&b, cols, rows, MXS_ROWWISE, block, layout);
        cr_assert_eq(mxs_host_nvfp4_quantize(&a.t, src, MXS_F32, MXS_BF16), MXS_OK);
        cr_assert_eq(mxs_host_nvfp4_quantize(&b.t, tr, MXS_F32, MXS_BF16), MXS_OK);
        cr_assert_eq(mxs_f32_bits(fx_amax(&a)), mxs_f32_bits(fx_amax(&b)));
        cr_assert_eq(a.sbytes[1], b.sbytes[0]);
        cr_assert_eq(t_first_diff(a.data[1], b.data[0], (size_t)a.dbytes), -1, "%lldx%lld block %d", (long long)rows,
                     (long long)cols, block);
        cr_assert_eq(t_first_diff(a.scale[1], b.scale[0], (size_t)a.sbytes[1]), -1);
        fx_free(&a);
        fx_free(&b);
        free(src);
        free(tr);
    }
}
