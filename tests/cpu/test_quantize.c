/* SPDX-License-Identifier: MIT */
/* docs/contract.md sections 1, 2, 5 and 7: whole-tensor quantize (copy-back) and
 * dequantize against the naive per-element reference of common.h, for every
 * input dtype, both roundings, all three scale layouts and every plane set.
 * Every output is poisoned first and followed by guard bytes, and the
 * pointers of an absent plane are set to poisoned buffers that must stay
 * untouched. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mxshard/mxshard.h>

#include "common.h"

static const char *dtype_name[3] = {"f32", "bf16", "f16"};

/* The awkward shapes, then random ones. */
static void shape_at(t_rng *rng, int idx, int64_t *rows, int64_t *cols) {
    static const int64_t fixed[][2] = {{1, 1},    {1, 2},    {2, 1},     {1, 31},   {1, 32},   {1, 33},     {1, 1000},
                                       {1000, 1}, {31, 1},   {32, 1},    {33, 1},   {33, 65},  {65, 33},    {1000, 3},
                                       {3, 1000}, {32, 32},  {31, 33},   {64, 96},  {96, 64},  {128, 4},    {129, 129},
                                       {256, 96}, {97, 200}, {300, 257}, {5, 4099}, {4099, 5}, {513, 1025}, {1025, 67}};
    const int nfixed = (int)(sizeof fixed / sizeof fixed[0]);
    if (idx < nfixed) {
        *rows = fixed[idx][0];
        *cols = fixed[idx][1];
    } else {
        *rows = t_rand_dim(rng, 300);
        *cols = t_rand_dim(rng, 300);
    }
}

static void *fill_source(t_rng *rng, mxs_dtype dtype, int64_t n) {
    void *src = malloc((size_t)n * (size_t)mxs_dtype_bytes(dtype));
    cr_assert_not_null(src);
    t_fill(rng, src, dtype, n);
    return src;
}

static void describe(char *buf, size_t cap, int64_t rows, int64_t cols, mxs_dtype dtype, int rounding, int layout,
                     unsigned dirs) {
    snprintf(buf, cap, "%ldx%ld src=%s rounding=%s layout=%d dirs=%u", (long)rows, (long)cols, dtype_name[dtype],
             rounding == MXS_ROUND_CEIL ? "ceil" : "floor", layout, dirs);
}

/* Checks one plane's bytes against the reference; reports the first bad
 * byte with the source element behind it. */
static void expect_plane(const char *what, const char *plane_name, const uint8_t *got_data, const uint8_t *got_scale,
                         const uint8_t *ref_data, const uint8_t *ref_scale, int64_t n, int64_t scale_bytes,
                         const void *src, mxs_dtype dtype) {
    int64_t d = t_first_diff(got_data, ref_data, (size_t)n);
    int64_t s = t_first_diff(got_scale, ref_scale, (size_t)scale_bytes);
    cr_assert_eq(d, -1, "%s: %s data byte %ld is 0x%02x, reference 0x%02x (source 0x%08x)", what, plane_name, (long)d,
                 d >= 0 ? got_data[d] : 0, d >= 0 ? ref_data[d] : 0,
                 d >= 0 ? (unsigned)mxs_f32_bits(ref_load(src, dtype, d)) : 0u);
    cr_assert_eq(s, -1, "%s: %s scale byte %ld is 0x%02x, reference 0x%02x", what, plane_name, (long)s,
                 s >= 0 ? got_scale[s] : 0, s >= 0 ? ref_scale[s] : 0);
    cr_assert(t_guard_ok(got_data, (size_t)n), "%s: wrote past the %s data plane", what, plane_name);
    cr_assert(t_guard_ok(got_scale, (size_t)scale_bytes), "%s: wrote past the %s scale plane", what, plane_name);
}

/* Everything for one shape: 3 dtypes x 2 roundings x 3 layouts x 3 plane
 * sets = 54 quantize cases, plus dequantize of both planes into 3 dtypes. */
static long check_shape(t_rng *rng, int64_t rows, int64_t cols, int with_dequant) {
    const int64_t n = rows * cols;
    const char *plane_name[2] = {"row-wise", "column-wise"};
    long cases = 0;
    int dt, rounding, layout, p;
    unsigned dirs;
    for (dt = 0; dt < 3; dt++) {
        void *src = fill_source(rng, (mxs_dtype)dt, n);
        for (rounding = MXS_ROUND_CEIL; rounding <= MXS_ROUND_FLOOR; rounding++) {
            for (layout = 0; layout < 3; layout++) {
                uint8_t *ref_data[2], *ref_scale[2];
                int64_t sb[2];
                for (p = 0; p < 2; p++) {
                    sb[p] = ref_scale_bytes(rows, cols, p + 1, layout);
                    ref_data[p] = malloc((size_t)n);
                    ref_scale[p] = malloc((size_t)sb[p]);
                    cr_assert(ref_data[p] && ref_scale[p]);
                    ref_quantize_plane(rows, cols, src, (mxs_dtype)dt, (mxs_rounding)rounding, p + 1, layout,
                                       ref_data[p], ref_scale[p]);
                }
                for (dirs = MXS_ROWWISE; dirs <= MXS_BOTH; dirs++) {
                    uint8_t *data[2], *scale[2];
                    mxs_tensor t;
                    char what[160];
                    describe(what, sizeof what, rows, cols, (mxs_dtype)dt, rounding, layout, dirs);
                    for (p = 0; p < 2; p++) {
                        data[p] = t_alloc((size_t)n);
                        scale[p] = t_alloc((size_t)sb[p]);
                        cr_assert(data[p] && scale[p]);
                    }
                    memset(&t, 0, sizeof t);
                    t.rows = rows;
                    t.cols = cols;
                    t.dirs = dirs;
                    t.scale_layout = (mxs_scale_layout)layout;
                    /* an absent plane's pointers are set to poisoned buffers:
                     * they must never be touched */
                    t.row_data = data[0], t.row_scale = scale[0];
                    t.col_data = data[1], t.col_scale = scale[1];
                    cr_assert_eq(mxs_host_quantize(&t, src, (mxs_dtype)dt, (mxs_rounding)rounding), MXS_OK, "%s", what);
                    for (p = 0; p < 2; p++) {
                        if (dirs & (unsigned)(p + 1)) {
                            expect_plane(what, plane_name[p], data[p], scale[p], ref_data[p], ref_scale[p], n, sb[p],
                                         src, (mxs_dtype)dt);
                        } else {
                            cr_assert(t_all_poisoned(data[p], (size_t)n), "%s: absent %s data touched", what,
                                      plane_name[p]);
                            cr_assert(t_all_poisoned(scale[p], (size_t)sb[p]), "%s: absent %s scales touched", what,
                                      plane_name[p]);
                        }
                    }
                    cases++;
                    if (dirs == MXS_BOTH && with_dequant && rounding == (int)(cases % 2)) {
                        int dd;
                        for (p = 0; p < 2; p++) {
                            for (dd = 0; dd < 3; dd++) {
                                size_t nb = (size_t)n * (size_t)mxs_dtype_bytes((mxs_dtype)dd);
                                uint8_t *out = t_alloc(nb), *want = malloc(nb);
                                int64_t bad;
                                cr_assert(out && want);
                                cr_assert_eq(mxs_host_dequantize(&t, (mxs_dirs)(p + 1), out, (mxs_dtype)dd), MXS_OK);
                                ref_dequantize_plane(rows, cols, p + 1, layout, data[p], scale[p], want, (mxs_dtype)dd);
                                bad = t_first_value_diff(out, want, (mxs_dtype)dd, n);
                                cr_assert_eq(bad, -1, "%s: dequantize %s -> %s differs at %ld", what, plane_name[p],
                                             dtype_name[dd], (long)bad);
                                cr_assert(t_guard_ok(out, nb), "%s: dequantize wrote past dst", what);
                                free(out), free(want);
                            }
                        }
                    }
                    for (p = 0; p < 2; p++) free(data[p]), free(scale[p]);
                }
                for (p = 0; p < 2; p++) free(ref_data[p]), free(ref_scale[p]);
            }
        }
        free(src);
    }
    return cases;
}

Test(quantize, matches_naive_reference_for_every_dtype_rounding_layout_and_plane_set) {
    t_rng rng = t_rng_seed(41);
    long cases = 0;
    int idx;
    for (idx = 0; idx < 150; idx++) {
        int64_t rows, cols;
        shape_at(&rng, idx, &rows, &cols);
        cases += check_shape(&rng, rows, cols, 0);
    }
    cr_assert_eq(cases, 150 * 54);
}

Test(quantize, dequantize_matches_naive_reference_for_every_output_dtype) {
    t_rng rng = t_rng_seed(42);
    int idx;
    for (idx = 0; idx < 70; idx++) {
        int64_t rows, cols;
        shape_at(&rng, idx, &rows, &cols);
        check_shape(&rng, rows, cols, 1);
    }
}

Test(quantize, dequantize_decodes_every_code_and_every_scale_in_every_layout) {
    t_rng rng = t_rng_seed(43);
    int idx, layout, p, dd;
    for (idx = 0; idx < 60; idx++) {
        int64_t rows = t_rand_dim(&rng, 200), cols = t_rand_dim(&rng, 200), n = rows * cols, k;
        for (layout = 0; layout < 3; layout++) {
            uint8_t *data[2], *scale[2];
            mxs_tensor t;
            memset(&t, 0, sizeof t);
            t.rows = rows, t.cols = cols, t.dirs = MXS_BOTH, t.scale_layout = (mxs_scale_layout)layout;
            for (p = 0; p < 2; p++) {
                int64_t sb = ref_scale_bytes(rows, cols, p + 1, layout);
                data[p] = malloc((size_t)n);
                scale[p] = malloc((size_t)sb);
                cr_assert(data[p] && scale[p]);
                for (k = 0; k < n; k++) data[p][k] = (uint8_t)t_next(&rng);   /* NaN codes included */
                for (k = 0; k < sb; k++) scale[p][k] = (uint8_t)t_next(&rng); /* 0x00 .. 0xFF */
            }
            t.row_data = data[0], t.row_scale = scale[0], t.col_data = data[1], t.col_scale = scale[1];
            for (p = 0; p < 2; p++) {
                for (dd = 0; dd < 3; dd++) {
                    size_t nb = (size_t)n * (size_t)mxs_dtype_bytes((mxs_dtype)dd);
                    uint8_t *out = t_alloc(nb), *want = malloc(nb);
                    int64_t bad;
                    cr_assert(out && want);
                    cr_assert_eq(mxs_host_dequantize(&t, (mxs_dirs)(p + 1), out, (mxs_dtype)dd), MXS_OK);
                    ref_dequantize_plane(rows, cols, p + 1, layout, data[p], scale[p], want, (mxs_dtype)dd);
                    bad = t_first_value_diff(out, want, (mxs_dtype)dd, n);
                    cr_assert_eq(bad, -1, "%ldx%ld layout %d plane %d -> %s: element %ld", (long)rows, (long)cols,
                                 layout, p + 1, dtype_name[dd], (long)bad);
                    cr_assert(t_guard_ok(out, nb));
                    free(out), free(want);
                }
            }
            for (p = 0; p < 2; p++) free(data[p]), free(scale[p]);
        }
    }
}

Test(quantize, a_row_only_tensor_s_column_pointers_are_never_touched) {
    t_rng rng = t_rng_seed(44);
    int idx;
    for (idx = 0; idx < 50; idx++) {
        int64_t rows = t_rand_dim(&rng, 200), cols = t_rand_dim(&rng, 200), n = rows * cols;
        int layout = (int)t_below(&rng, 3);
        int64_t rsb = ref_scale_bytes(rows, cols, MXS_ROWWISE, layout),
                csb = ref_scale_bytes(rows, cols, MXS_COLWISE, layout);
        float *src = fill_source(&rng, MXS_F32, n);
        uint8_t *rd = t_alloc((size_t)n), *rs = t_alloc((size_t)rsb), *cd = t_alloc((size_t)n),
                *cs = t_alloc((size_t)csb);
        uint8_t *out = t_alloc((size_t)n * 4);
        mxs_tensor t;
        memset(&t, 0, sizeof t);
        t.rows = rows, t.cols = cols, t.dirs = MXS_ROWWISE, t.scale_layout = (mxs_scale_layout)layout;
        t.row_data = rd, t.row_scale = rs, t.col_data = cd, t.col_scale = cs;
        cr_assert_eq(mxs_host_quantize(&t, src, MXS_F32, MXS_ROUND_CEIL), MXS_OK);
        cr_assert_eq(mxs_host_dequantize(&t, MXS_ROWWISE, out, MXS_F32), MXS_OK);
        cr_assert_eq(mxs_host_dequantize(&t, MXS_COLWISE, out, MXS_BF16), MXS_ERR_ABSENT_PLANE,
                     "a row-only tensor has no column-wise plane to dequantize");
        cr_assert(t_all_poisoned(cd, (size_t)n), "column data of a row-only tensor was written");
        cr_assert(t_all_poisoned(cs, (size_t)csb), "column scales of a row-only tensor were written");
        cr_assert(t_guard_ok(rd, (size_t)n) && t_guard_ok(rs, (size_t)rsb));
        /* and the mirror image: a column-only tensor's row pointers */
        t_poison(rd, (size_t)n), t_poison(rs, (size_t)rsb);
        t.dirs = MXS_COLWISE;
        cr_assert_eq(mxs_host_quantize(&t, src, MXS_F32, MXS_ROUND_FLOOR), MXS_OK);
        cr_assert(t_all_poisoned(rd, (size_t)n), "row data of a column-only tensor was written");
        cr_assert(t_all_poisoned(rs, (size_t)rsb), "row scales of a column-only tensor were written");
        /* NULL pointers for the absent plane are fine too */
        t.dirs = MXS_ROWWISE, t.col_data = NULL, t.col_scale = NULL;
        cr_assert_eq(mxs_host_quantize(&t, src, MXS_F32, MXS_ROUND_CEIL), MXS_OK);
        free(src), free(rd), free(rs), free(cd), free(cs), free(out);
    }
}

Test(quantize, padded_and_swizzled_quantize_equal_compact_quantize_converted) {
    t_rng rng = t_rng_seed(45);
    int idx, layout, p;
    for (idx = 0; idx < 80; idx++) {
        int64_t rows, cols, n;
        uint8_t *cdata[2], *cscale[2];
        mxs_tensor c;
        void *src;
        mxs_dtype dt = (mxs_dtype)t_below(&rng, 3);
        mxs_rounding rnd = (mxs_rounding)t_below(&rng, 2);
        shape_at(&rng, idx, &rows, &cols);
        n = rows * cols;
        src = fill_source(&rng, dt, n);
        memset(&c, 0, sizeof c);
        c.rows = rows, c.cols = cols, c.dirs = MXS_BOTH, c.scale_layout = MXS_SCALES_COMPACT;
        for (p = 0; p < 2; p++) {
            cdata[p] = t_alloc((size_t)n);
            cscale[p] = t_alloc((size_t)ref_scale_bytes(rows, cols, p + 1, MXS_SCALES_COMPACT));
        }
        c.row_data = cdata[0], c.row_scale = cscale[0], c.col_data = cdata[1], c.col_scale = cscale[1];
        cr_assert_eq(mxs_host_quantize(&c, src, dt, rnd), MXS_OK);
        for (layout = MXS_SCALES_PADDED; layout <= MXS_SCALES_SWIZZLED; layout++) {
            mxs_tensor t = c;
            uint8_t *data[2], *scale[2], *conv[2];
            t.scale_layout = (mxs_scale_layout)layout;
            for (p = 0; p < 2; p++) {
                int64_t sb = ref_scale_bytes(rows, cols, p + 1, layout);
                data[p] = t_alloc((size_t)n);
                scale[p] = t_alloc((size_t)sb);
                conv[p] = t_alloc((size_t)sb);
                cr_assert_eq(mxs_host_convert_scales(rows, cols, (mxs_dirs)(p + 1), MXS_SCALES_COMPACT, cscale[p],
                                                     (mxs_scale_layout)layout, conv[p]),
                             MXS_OK);
            }
            t.row_data = data[0], t.row_scale = scale[0], t.col_data = data[1], t.col_scale = scale[1];
            cr_assert_eq(mxs_host_quantize(&t, src, dt, rnd), MXS_OK);
            for (p = 0; p < 2; p++) {
                int64_t sb = ref_scale_bytes(rows, cols, p + 1, layout);
                cr_assert_eq(t_first_diff(data[p], cdata[p], (size_t)n), -1, "data depends on the scale layout");
                cr_assert_eq(t_first_diff(scale[p], conv[p], (size_t)sb), -1,
                             "%ldx%ld layout %d plane %d: quantize != convert(compact quantize)", (long)rows,
                             (long)cols, layout, p + 1);
                free(data[p]), free(scale[p]), free(conv[p]);
            }
        }
        for (p = 0; p < 2; p++) free(cdata[p]), free(cscale[p]);
        free(src);
    }
}

Test(quantize, repeated_quantize_into_the_same_storage_equals_a_fresh_one) {
    t_rng rng = t_rng_seed(46);
    int idx, p, rep;
    for (idx = 0; idx < 40; idx++) {
        int64_t rows = t_rand_dim(&rng, 200), cols = t_rand_dim(&rng, 200), n = rows * cols;
        int layout = (int)t_below(&rng, 3);
        unsigned dirs = (unsigned)t_between(&rng, 1, 3);
        uint8_t *data[2], *scale[2], *ref_data = malloc((size_t)n), *ref_scale[2];
        int64_t sb[2];
        mxs_tensor t;
        memset(&t, 0, sizeof t);
        t.rows = rows, t.cols = cols, t.dirs = dirs, t.scale_layout = (mxs_scale_layout)layout;
        for (p = 0; p < 2; p++) {
            sb[p] = ref_scale_bytes(rows, cols, p + 1, layout);
            data[p] = t_alloc((size_t)n);
            scale[p] = t_alloc((size_t)sb[p]);
            ref_scale[p] = malloc((size_t)sb[p]);
        }
        t.row_data = data[0], t.row_scale = scale[0], t.col_data = data[1], t.col_scale = scale[1];
        for (rep = 0; rep < 3; rep++) {
            mxs_dtype dt = (mxs_dtype)t_below(&rng, 3);
            mxs_rounding rnd = (mxs_rounding)t_below(&rng, 2);
            void *src = fill_source(&rng, dt, n);
            uint8_t *keep_row = t.row_data;
            cr_assert_eq(mxs_host_quantize(&t, src, dt, rnd), MXS_OK);
            cr_assert_eq(t.row_data, keep_row, "storage pointers are unchanged");
            for (p = 0; p < 2; p++) {
                if (!(dirs & (unsigned)(p + 1))) {
                    cr_assert(t_all_poisoned(data[p], (size_t)n) && t_all_poisoned(scale[p], (size_t)sb[p]));
                    continue;
                }
                ref_quantize_plane(rows, cols, src, dt, rnd, p + 1, layout, ref_data, ref_scale[p]);
                cr_assert_eq(t_first_diff(data[p], ref_data, (size_t)n), -1, "update %d plane %d data", rep, p + 1);
                cr_assert_eq(t_first_diff(scale[p], ref_scale[p], (size_t)sb[p]), -1, "update %d plane %d scales", rep,
                             p + 1);
            }
            free(src);
        }
        for (p = 0; p < 2; p++) free(data[p]), free(scale[p]), free(ref_scale[p]);
        free(ref_data);
    }
}

Test(quantize, hand_computed_blocks) {
    float src[2 * 33];
    uint8_t rd[66 + T_GUARD], rs[4 + T_GUARD];
    mxs_tensor t;
    int k, r;
    for (k = 0; k < 32; k++) src[k] = (float)(k + 1), src[33 + k] = k == 7 ? 500.0f : 1.0f;
    src[32] = -0.75f; /* one-element edge blocks */
    src[65] = 0.0f;
    for (r = MXS_ROUND_CEIL; r <= MXS_ROUND_FLOOR; r++) {
        memset(&t, 0, sizeof t);
        t.rows = 2, t.cols = 33, t.dirs = MXS_ROWWISE, t.row_data = rd, t.row_scale = rs;
        t_poison(rd, 66), t_poison(rs, 4);
        cr_assert_eq(mxs_host_quantize(&t, src, MXS_F32, (mxs_rounding)r), MXS_OK);
        /* row 0, amax 32: CEIL e8m0_up(32/448 = 0.071) = 2^-3; FLOOR 2^(5-8): both e = 124, s = 8 */
        cr_assert_eq(rs[0], 124);
        cr_assert_eq(rd[0], 0x50, "1 * 8 = 2^3");
        cr_assert_eq(rd[2], 0x5C, "3 * 8 = 1.5 * 2^4");
        cr_assert_eq(rd[31], 0x78, "32 * 8 = 2^8");
        /* the edge block holds only -0.75: e = 118 either way, -0.75 * 2^9 = -384 = -1.5 * 2^8 */
        cr_assert_eq(rs[1], 118);
        cr_assert_eq(rd[32], 0xFC);
        /* row 1, amax 500: CEIL 500/448 = 1.12 -> 2^1, e = 128, 500/2 = 250 -> 256 (0x78);
         * FLOOR 2^(8-8), e = 127, 500 saturates to 448 (0x7E) */
        cr_assert_eq(rs[2], r == MXS_ROUND_CEIL ? 128 : 127);
        cr_assert_eq(rd[33 + 7], r == MXS_ROUND_CEIL ? 0x78 : 0x7E);
        cr_assert_eq(rd[33], r == MXS_ROUND_CEIL ? 0x30 : 0x38, "1/2 = 2^-1 (ceil) or 1 (floor)");
        /* an all-zero block: amax 0 -> scale 0x00, data 0x00 */
        cr_assert_eq(rs[3], 0x00);
        cr_assert_eq(rd[65], 0x00);
        cr_assert(t_guard_ok(rd, 66) && t_guard_ok(rs, 4));
    }
}
