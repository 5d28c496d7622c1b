/* SPDX-License-Identifier: MIT */
/* docs/contract.md section 6: every rejection rule, one test each. A rejected call
 * returns the code naming the fault and writes none of its outputs: every
 * output buffer is poisoned before the call and checked after it. Plus the
 * 64-bit index math of docs/contract.md section 2 at 2^31 elements and more, checked
 * against exact __int128 arithmetic. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <mxshard/mxshard.h>

#include "common.h"

__extension__ typedef __int128 i128;

/* A valid 40 x 70 bidirectional tensor in a given layout, all four
 * buffers poisoned, plus a valid f32 source. */
typedef struct fixture {
    mxs_tensor t;
    uint8_t *buf[4]; /* row data, row scale, col data, col scale */
    size_t bytes[4];
    float src[40 * 70];
    uint8_t out[40 * 70 * 4 + T_GUARD]; /* dequantize / convert destination */
} fixture;

static fixture *fx_make(mxs_scale_layout layout) {
    fixture *f = calloc(1, sizeof *f);
    int k;
    cr_assert_not_null(f);
    f->t.rows = 40;
    f->t.cols = 70;
    f->t.dirs = MXS_BOTH;
    f->t.scale_layout = layout;
    f->bytes[0] = f->bytes[2] = 40 * 70;
    f->bytes[1] = (size_t)ref_scale_bytes(40, 70, MXS_ROWWISE, layout);
    f->bytes[3] = (size_t)ref_scale_bytes(40, 70, MXS_COLWISE, layout);
    for (k = 0; k < 4; k++) f->buf[k] = t_alloc(f->bytes[k]);
    f->t.row_data = f->buf[0], f->t.row_scale = f->buf[1];
    f->t.col_data = f->buf[2], f->t.col_scale = f->buf[3];
    for (k = 0; k < 40 * 70; k++) f->src[k] = (float)(k % 97) - 48.5f;
    memset(f->out, T_POISON, sizeof f->out);
    return f;
}

static void fx_untouched(const fixture *f, const char *what) {
    size_t k;
    int b;
    for (b = 0; b < 4; b++)
        cr_assert(t_all_poisoned(f->buf[b], f->bytes[b]), "%s: output buffer %d was written", what, b);
    for (k = 0; k < sizeof f->out; k++) cr_assert_eq(f->out[k], T_POISON, "%s: dst byte %zu was written", what, k);
}

static void fx_free(fixture *f) {
    int k;
    for (k = 0; k < 4; k++) free(f->buf[k]);
    free(f);
}

/* Runs quantize on a (possibly broken) copy of the fixture's tensor and
 * checks the status and that nothing was written. */
static void expect_quantize(fixture *f, mxs_tensor *t, const void *src, int dtype, int rounding, mxs_status want,
                            const char *what) {
    mxs_status got = mxs_host_quantize(t, src, (mxs_dtype)dtype, (mxs_rounding)rounding);
    cr_assert_eq(got, want, "%s: got %d (%s), want %d", what, got, mxs_status_str(got), want);
    fx_untouched(f, what);
}

/* ---- mxs_host_quantize -------------------------------------------------- */

Test(errors, quantize_rejects_null_dst_and_null_src) {
    fixture *f = fx_make(MXS_SCALES_PADDED);
    expect_quantize(f, NULL, f->src, MXS_F32, MXS_ROUND_CEIL, MXS_ERR_INVALID_ARGUMENT, "NULL dst");
    expect_quantize(f, &f->t, NULL, MXS_F32, MXS_ROUND_CEIL, MXS_ERR_INVALID_ARGUMENT, "NULL src");
    fx_free(f);
}

Test(errors, quantize_rejects_unknown_dtype) {
    fixture *f = fx_make(MXS_SCALES_COMPACT);
    expect_quantize(f, &f->t, f->src, 7, MXS_ROUND_CEIL, MXS_ERR_INVALID_ARGUMENT, "dtype 7");
    expect_quantize(f, &f->t, f->src, 3, MXS_ROUND_CEIL, MXS_ERR_INVALID_ARGUMENT, "dtype 3");
    expect_quantize(f, &f->t, f->src, -1, MXS_ROUND_CEIL, MXS_ERR_INVALID_ARGUMENT, "dtype -1");
    fx_free(f);
}

Test(errors, quantize_rejects_unknown_rounding) {
    fixture *f = fx_make(MXS_SCALES_COMPACT);
    expect_quantize(f, &f->t, f->src, MXS_F32, 2, MXS_ERR_INVALID_ARGUMENT, "rounding 2");
    expect_quantize(f, &f->t, f->src, MXS_BF16, -1, MXS_ERR_INVALID_ARGUMENT, "rounding -1");
    fx_free(f);
}

Test(errors, quantize_rejects_unknown_scale_layout) {
    fixture *f = fx_make(MXS_SCALES_COMPACT);
    mxs_tensor t = f->t;
    t.scale_layout = (mxs_scale_layout)3;
    expect_quantize(f, &t, f->src, MXS_F32, MXS_ROUND_CEIL, MXS_ERR_INVALID_ARGUMENT, "layout 3");
    t.scale_layout = (mxs_scale_layout)-1;
    expect_quantize(f, &t, f->src, MXS_F32, MXS_ROUND_CEIL, MXS_ERR_INVALID_ARGUMENT, "layout -1");
    fx_free(f);
}

Test(errors, quantize_rejects_dirs_0_4_and_7) {
    fixture *f = fx_make(MXS_SCALES_SWIZZLED);
    const unsigned bad[] = {0u, 4u, 7u, 5u, 0x80000001u};
    size_t k;
    for (k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        mxs_tensor t = f->t;
        t.dirs = bad[k];
        expect_quantize(f, &t, f->src, MXS_F32, MXS_ROUND_CEIL, MXS_ERR_INVALID_ARGUMENT, "bad dirs");
    }
    fx_free(f);
}

Test(errors, quantize_rejects_rows_or_cols_below_1) {
    fixture *f = fx_make(MXS_SCALES_COMPACT);
    const int64_t bad[][2] = {{0, 70}, {40, 0}, {0, 0}, {-1, 70}, {40, -5}, {INT64_MIN, 1}};
    size_t k;
    for (k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        mxs_tensor t = f->t;
        t.rows = bad[k][0];
        t.cols = bad[k][1];
        expect_quantize(f, &t, f->src, MXS_F32, MXS_ROUND_CEIL, MXS_ERR_SHAPE, "rows or cols < 1");
    }
    fx_free(f);
}

Test(errors, quantize_rejects_rows_times_cols_overflow) {
    fixture *f = fx_make(MXS_SCALES_COMPACT);
    const int64_t bad[][2] = {{INT64_MAX / 2, 3},     {3, INT64_MAX / 2},
                              {INT64_MAX, INT64_MAX}, {(int64_t)1 << 32, (int64_t)1 << 31},
                              {INT64_MAX, 1},         {1, INT64_MAX}}; /* the last two: the padded scale M overflows */
    size_t k;
    int l;
    for (l = 0; l < 3; l++) {
        for (k = 0; k < sizeof bad / sizeof bad[0]; k++) {
            mxs_tensor t = f->t;
            t.rows = bad[k][0];
            t.cols = bad[k][1];
            t.scale_layout = (mxs_scale_layout)l;
            expect_quantize(f, &t, f->src, MXS_F32, MXS_ROUND_CEIL, MXS_ERR_OVERFLOW, "size overflow");
        }
    }
    fx_free(f);
}

Test(errors, quantize_rejects_a_flagged_plane_with_null_data_or_scale) {
    fixture *f = fx_make(MXS_SCALES_PADDED);
    int k;
    for (k = 0; k < 4; k++) {
        mxs_tensor t = f->t;
        if (k == 0) t.row_data = NULL;
        if (k == 1) t.row_scale = NULL;
        if (k == 2) t.col_data = NULL;
        if (k == 3) t.col_scale = NULL;
        expect_quantize(f, &t, f->src, MXS_F32, MXS_ROUND_CEIL, MXS_ERR_ABSENT_PLANE,
                        "NULL pointer of a flagged plane");
        t.dirs = k < 2 ? MXS_ROWWISE : MXS_COLWISE;
        expect_quantize(f, &t, f->src, MXS_BF16, MXS_ROUND_FLOOR, MXS_ERR_ABSENT_PLANE, "single plane, NULL pointer");
    }
    fx_free(f);
}

/* ---- mxs_host_dequantize ------------------------------------------------ */

/* Quantizes the fixture for real, then snapshots it: a rejected dequantize
 * must leave both the tensor and dst alone. */
static void expect_dequantize(fixture *f, const mxs_tensor *t, int plane, void *dst, int dtype, mxs_status want,
                              const char *what) {
    mxs_status got = mxs_host_dequantize(t, (mxs_dirs)plane, dst, (mxs_dtype)dtype);
    cr_assert_eq(got, want, "%s: got %d (%s), want %d", what, got, mxs_status_str(got), want);
    fx_untouched(f, what);
}

Test(errors, dequantize_rejects_null_tensor_null_dst_bad_dtype_and_bad_plane) {
    fixture *f = fx_make(MXS_SCALES_COMPACT);
    expect_dequantize(f, NULL, MXS_ROWWISE, f->out, MXS_F32, MXS_ERR_INVALID_ARGUMENT, "NULL tensor");
    expect_dequantize(f, &f->t, MXS_ROWWISE, NULL, MXS_F32, MXS_ERR_INVALID_ARGUMENT, "NULL dst");
    expect_dequantize(f, &f->t, MXS_ROWWISE, f->out, 7, MXS_ERR_INVALID_ARGUMENT, "dtype 7");
    expect_dequantize(f, &f->t, 0, f->out, MXS_F32, MXS_ERR_INVALID_ARGUMENT, "plane 0");
    expect_dequantize(f, &f->t, MXS_BOTH, f->out, MXS_F32, MXS_ERR_INVALID_ARGUMENT, "plane BOTH");
    expect_dequantize(f, &f->t, 4, f->out, MXS_F32, MXS_ERR_INVALID_ARGUMENT, "plane 4");
    fx_free(f);
}

Test(errors, dequantize_rejects_bad_shape_layout_and_dirs) {
    fixture *f = fx_make(MXS_SCALES_COMPACT);
    mxs_tensor t = f->t;
    t.rows = 0;
    expect_dequantize(f, &t, MXS_ROWWISE, f->out, MXS_F32, MXS_ERR_SHAPE, "rows 0");
    t = f->t, t.cols = -3;
    expect_dequantize(f, &t, MXS_ROWWISE, f->out, MXS_F32, MXS_ERR_SHAPE, "cols -3");
    t = f->t, t.rows = INT64_MAX / 2, t.cols = 3;
    expect_dequantize(f, &t, MXS_ROWWISE, f->out, MXS_F32, MXS_ERR_OVERFLOW, "rows*cols overflow");
    t = f->t, t.rows = (int64_t)1 << 31, t.cols = (int64_t)1 << 31; /* 2^62 f32 outputs: 2^64 bytes */
    expect_dequantize(f, &t, MXS_ROWWISE, f->out, MXS_F32, MXS_ERR_OVERFLOW, "output bytes overflow");
    t = f->t, t.scale_layout = (mxs_scale_layout)9;
    expect_dequantize(f, &t, MXS_ROWWISE, f->out, MXS_F32, MXS_ERR_INVALID_ARGUMENT, "layout 9");
    t = f->t, t.dirs = 4;
    expect_dequantize(f, &t, MXS_ROWWISE, f->out, MXS_F32, MXS_ERR_INVALID_ARGUMENT, "dirs 4");
    fx_free(f);
}

Test(errors, dequantize_of_an_absent_plane_is_an_error) {
    fixture *f = fx_make(MXS_SCALES_SWIZZLED);
    mxs_tensor t = f->t;
    t.dirs = MXS_ROWWISE;
    expect_dequantize(f, &t, MXS_COLWISE, f->out, MXS_F32, MXS_ERR_ABSENT_PLANE, "column plane of row-only");
    t.dirs = MXS_COLWISE;
    expect_dequantize(f, &t, MXS_ROWWISE, f->out, MXS_BF16, MXS_ERR_ABSENT_PLANE, "row plane of column-only");
    t = f->t, t.row_data = NULL;
    expect_dequantize(f, &t, MXS_ROWWISE, f->out, MXS_F16, MXS_ERR_ABSENT_PLANE, "NULL row data");
    t = f->t, t.col_scale = NULL;
    expect_dequantize(f, &t, MXS_COLWISE, f->out, MXS_F32, MXS_ERR_ABSENT_PLANE, "NULL column scales");
    fx_free(f);
}

Test(errors, dequantize_rejects_dst_overlapping_the_data) {
    fixture *f = fx_make(MXS_SCALES_COMPACT);
    mxs_status got;
    got = mxs_host_dequantize(&f->t, MXS_ROWWISE, f->buf[0] + 7, MXS_BF16);
    cr_assert_eq(got, MXS_ERR_ALIASING, "dst inside the data plane: %s", mxs_status_str(got));
    got = mxs_host_dequantize(&f->t, MXS_COLWISE, f->buf[2], MXS_F32);
    cr_assert_eq(got, MXS_ERR_ALIASING, "dst == data: %s", mxs_status_str(got));
    fx_untouched(f, "aliasing");
    fx_free(f);
}

/* ---- mxs_host_convert_scales -------------------------------------------- */

static void expect_convert(fixture *f, int64_t rows, int64_t cols, int plane, int from, const uint8_t *src, int to,
                           uint8_t *dst, mxs_status want, const char *what) {
    mxs_status got =
        mxs_host_convert_scales(rows, cols, (mxs_dirs)plane, (mxs_scale_layout)from, src, (mxs_scale_layout)to, dst);
    cr_assert_eq(got, want, "%s: got %d (%s), want %d", what, got, mxs_status_str(got), want);
    fx_untouched(f, what);
}

Test(errors, convert_scales_rejects_null_buffers_bad_plane_and_bad_layouts) {
    fixture *f = fx_make(MXS_SCALES_COMPACT);
    static const uint8_t src[4096];
    expect_convert(f, 40, 70, MXS_ROWWISE, 0, NULL, 2, f->out, MXS_ERR_INVALID_ARGUMENT, "NULL src");
    expect_convert(f, 40, 70, MXS_ROWWISE, 0, src, 2, NULL, MXS_ERR_INVALID_ARGUMENT, "NULL dst");
    expect_convert(f, 40, 70, 0, 0, src, 2, f->out, MXS_ERR_INVALID_ARGUMENT, "plane 0");
    expect_convert(f, 40, 70, MXS_BOTH, 0, src, 2, f->out, MXS_ERR_INVALID_ARGUMENT, "plane BOTH");
    expect_convert(f, 40, 70, 7, 0, src, 2, f->out, MXS_ERR_INVALID_ARGUMENT, "plane 7");
    expect_convert(f, 40, 70, MXS_COLWISE, 3, src, 2, f->out, MXS_ERR_INVALID_ARGUMENT, "from 3");
    expect_convert(f, 40, 70, MXS_COLWISE, 0, src, -1, f->out, MXS_ERR_INVALID_ARGUMENT, "to -1");
    fx_free(f);
}

Test(errors, convert_scales_rejects_bad_shapes_and_overflow) {
    fixture *f = fx_make(MXS_SCALES_COMPACT);
    static const uint8_t src[4096];
    expect_convert(f, 0, 70, MXS_ROWWISE, 0, src, 1, f->out, MXS_ERR_SHAPE, "rows 0");
    expect_convert(f, 40, -1, MXS_ROWWISE, 0, src, 1, f->out, MXS_ERR_SHAPE, "cols -1");
    expect_convert(f, INT64_MAX / 2, 3, MXS_ROWWISE, 0, src, 1, f->out, MXS_ERR_OVERFLOW, "rows*cols overflow");
    expect_convert(f, INT64_MAX, 1, MXS_ROWWISE, 0, src, 2, f->out, MXS_ERR_OVERFLOW, "padded M overflow");
    fx_free(f);
}

Test(errors, convert_scales_rejects_aliasing_src_and_dst) {
    fixture *f = fx_make(MXS_SCALES_COMPACT);
    uint8_t *plane = t_alloc(4096);
    int from, to;
    for (from = 0; from < 3; from++) {
        for (to = 0; to < 3; to++) {
            expect_convert(f, 40, 70, MXS_ROWWISE, from, plane, to, plane, MXS_ERR_ALIASING, "dst == src");
            expect_convert(f, 40, 70, MXS_COLWISE, from, plane + 100, to, plane, MXS_ERR_ALIASING, "dst overlaps src");
            expect_convert(f, 40, 70, MXS_COLWISE, from, plane, to, plane + 100, MXS_ERR_ALIASING, "src overlaps dst");
            cr_assert(t_all_poisoned(plane, 4096), "a rejected convert wrote its buffer");
        }
    }
    free(plane);
    fx_free(f);
}

/* ---- mxs_scale_bytes ----------------------------------------------------- */

Test(errors, scale_bytes_is_minus_1_for_invalid_requests) {
    mxs_tensor t;
    memset(&t, 0, sizeof t);
    t.rows = 40, t.cols = 70, t.dirs = MXS_ROWWISE, t.scale_layout = MXS_SCALES_PADDED;
    cr_assert_eq(mxs_scale_bytes(&t, MXS_ROWWISE), 128 * 4, "sanity");
    cr_assert_eq(mxs_scale_bytes(NULL, MXS_ROWWISE), -1, "NULL tensor");
    cr_assert_eq(mxs_scale_bytes(&t, MXS_COLWISE), -1, "absent plane");
    cr_assert_eq(mxs_scale_bytes(&t, (mxs_dirs)0), -1, "plane 0");
    cr_assert_eq(mxs_scale_bytes(&t, MXS_BOTH), -1, "plane BOTH is not one plane");
    cr_assert_eq(mxs_scale_bytes(&t, (mxs_dirs)4), -1, "plane 4");
    t.dirs = 0;
    cr_assert_eq(mxs_scale_bytes(&t, MXS_ROWWISE), -1, "dirs 0");
    t.dirs = 5;
    cr_assert_eq(mxs_scale_bytes(&t, MXS_ROWWISE), -1, "dirs 5");
    t.dirs = MXS_BOTH, t.scale_layout = (mxs_scale_layout)3;
    cr_assert_eq(mxs_scale_bytes(&t, MXS_ROWWISE), -1, "layout 3");
    t.scale_layout = MXS_SCALES_COMPACT, t.rows = 0;
    cr_assert_eq(mxs_scale_bytes(&t, MXS_ROWWISE), -1, "rows 0");
    t.rows = -4;
    cr_assert_eq(mxs_scale_bytes(&t, MXS_COLWISE), -1, "rows -4");
    t.rows = INT64_MAX / 2, t.cols = 3;
    cr_assert_eq(mxs_scale_bytes(&t, MXS_ROWWISE), -1, "rows*cols overflow");
    t.rows = INT64_MAX, t.cols = 1;
    cr_assert_eq(mxs_scale_bytes(&t, MXS_COLWISE), -1, "scale plane overflow");
    cr_assert_eq(mxs_tensor_storage_bytes(&t), -1);
}

/* ---- mxs_status_str ------------------------------------------------------ */

Test(errors, status_str_names_every_code_distinctly) {
    const char *seen[MXS_ERR_REMOTE + 1];
    int s, k;
    for (s = MXS_OK; s <= MXS_ERR_REMOTE; s++) {
        seen[s] = mxs_status_str((mxs_status)s);
        cr_assert_not_null(seen[s]);
        cr_assert_gt(strlen(seen[s]), 5, "status %d has an empty message", s);
        for (k = 0; k < s; k++) cr_assert_str_neq(seen[k], seen[s], "status %d and %d read the same", k, s);
    }
    for (s = MXS_ERR_REMOTE + 1; s < MXS_ERR_REMOTE + 50; s++) {
        const char *u = mxs_status_str((mxs_status)s);
        cr_assert(u && u[0], "unknown code %d gives a message", s);
        for (k = 0; k <= MXS_ERR_REMOTE; k++) cr_assert_str_neq(u, seen[k], "unknown code %d reads as %d", s, k);
    }
    cr_assert(mxs_status_str((mxs_status)-1) && mxs_status_str((mxs_status)-1)[0]);
}

/* ---- 64-bit index math --------------------------------------------------- */

static const int64_t big_shapes[][2] = {
    {262144, 8192},     {65568, 32768},     {8192, 262144},       {(int64_t)1 << 26, 65536},
    {3000000017LL, 77}, {77, 3000000017LL}, {(int64_t)1 << 31, 1}};

static int64_t exact(i128 v) {
    cr_assert(v >= 0 && v <= (i128)INT64_MAX, "reference value exceeds int64");
    return (int64_t)v;
}

Test(errors, scale_sizes_and_offsets_are_64_bit_beyond_2_pow_31_elements) {
    t_rng rng = t_rng_seed(51);
    size_t s;
    int l, p, k;
    for (s = 0; s < sizeof big_shapes / sizeof big_shapes[0]; s++) {
        const int64_t rows = big_shapes[s][0], cols = big_shapes[s][1];
        mxs_tensor t;
        memset(&t, 0, sizeof t);
        t.rows = rows, t.cols = cols, t.dirs = MXS_BOTH;
        cr_assert_eq(mxs_tensor_elems(&t), exact((i128)rows * cols));
        cr_assert_gt(mxs_tensor_elems(&t), (int64_t)INT32_MAX);
        for (l = 0; l < 3; l++) {
            i128 total = 2 * (i128)rows * cols;
            t.scale_layout = (mxs_scale_layout)l;
            for (p = 0; p < 2; p++) {
                i128 M = p == 0 ? rows : cols, K = ((p == 0 ? (i128)cols : (i128)rows) + 31) / 32;
                i128 Mp = (M + 127) / 128 * 128, Kp = (K + 3) / 4 * 4;
                i128 bytes = l == 0 ? M * K : Mp * Kp;
                mxs_scale_geom g;
                total += bytes;
                cr_assert_eq(mxs_scale_bytes(&t, (mxs_dirs)(p + 1)), exact(bytes), "%ldx%ld layout %d plane %d",
                             (long)rows, (long)cols, l, p + 1);
                cr_assert(mxs_scale_geom_make(rows, cols, (mxs_dirs)(p + 1), (mxs_scale_layout)l, &g));
                for (k = 0; k < 200; k++) {
                    /* random entries, and the corners */
                    i128 m = k == 0 ? (l ? Mp : M) - 1 : t_below(&rng, (int64_t)(l ? Mp : M));
                    i128 kk = k == 0 ? (l ? Kp : K) - 1 : t_below(&rng, (int64_t)(l ? Kp : K));
                    i128 want;
                    int64_t mm, kk2;
                    if (l == 0)
                        want = p == 0 ? m * K + kk : kk * M + m;
                    else if (l == 1)
                        want = p == 0 ? m * Kp + kk : kk * Mp + m;
                    else
                        want =
                            ((m / 128) * (Kp / 4) + (kk / 4)) * 512 + (m % 32) * 16 + ((m % 128) / 32) * 4 + (kk % 4);
                    cr_assert_eq(mxs_scale_geom_offset(&g, (int64_t)m, (int64_t)kk), exact(want));
                    mxs_scale_geom_coords(&g, exact(want), &mm, &kk2);
                    cr_assert(mm == (int64_t)m && kk2 == (int64_t)kk, "coords(offset) at a 64-bit offset");
                }
                /* the plane's last entry is its last byte, in every layout */
                cr_assert_eq(mxs_scale_geom_offset(&g, l ? g.Mp - 1 : g.M - 1, l ? g.Kp - 1 : g.K - 1),
                             exact(bytes - 1));
            }
            cr_assert_eq(mxs_tensor_storage_bytes(&t), exact(total));
        }
    }
}

Test(errors, shard_geometry_is_64_bit_beyond_2_pow_31_elements) {
    t_rng rng = t_rng_seed(52);
    size_t s;
    int k;
    for (s = 0; s < sizeof big_shapes / sizeof big_shapes[0]; s++) {
        const int64_t rows = big_shapes[s][0], cols = big_shapes[s][1];
        const i128 elems = (i128)rows * cols, kr = ((i128)cols + 31) / 32;
        for (k = 0; k < 300; k++) {
            /* a shard somewhere past 2^31, of up to ~2 rows */
            int64_t start = (int64_t)(elems - 1 - t_below(&rng, (int64_t)(elems - ((i128)1 << 31)) + 1));
            int64_t len =
                t_between(&rng, 0, (int64_t)(elems - start < 2 * (i128)cols ? elems - start : 2 * (i128)cols));
            i128 first = (i128)(start / cols) * kr + (start % cols) / 32;
            mxs_range rb = mxs_shard_row_blocks(cols, start, len), rc, grp, span;
            cr_assert_eq(mxs_shard_check(exact(elems), start, len), MXS_OK);
            cr_assert_eq(mxs_row_block_of(cols, start), exact(first));
            span = mxs_row_block_span(cols, exact(first));
            cr_assert_eq(span.first, exact((i128)(start / cols) * cols + (start % cols) / 32 * 32));
            if (len > 0) {
                i128 last = (i128)((start + len - 1) / cols) * kr + ((start + len - 1) % cols) / 32;
                cr_assert_eq(rb.first, exact(first));
                cr_assert_eq(rb.count, exact(last - first + 1));
            }
            rc = mxs_shard_row_cols(cols, start / cols, start, len);
            if (len > 0) {
                cr_assert_eq(rc.first, start % cols);
                cr_assert_eq(rc.count, exact((i128)(cols - start % cols < len ? cols - start % cols : len)));
            }
            grp = mxs_shard_groups(cols, start, len);
            if (len > 0) cr_assert_eq(grp.first, start / cols / 32);
            if (k < 3 && cols <= 100000) {
                /* brute force the column intervals of the shard's first group */
                mxs_range iv[2];
                int64_t g = start / cols / 32, r, c, n, q;
                uint8_t *touched = calloc((size_t)cols, 1), *got = calloc((size_t)cols, 1);
                cr_assert(touched && got);
                for (r = 32 * g; r < rows && r < 32 * g + 32; r++)
                    for (c = 0; c < cols; c++) {
                        i128 i = (i128)r * cols + c;
                        if (i >= start && i < (i128)start + len) touched[c] = 1;
                    }
                n = mxs_shard_col_intervals(rows, cols, start, len, g, iv);
                for (q = 0; q < n; q++)
                    for (c = iv[q].first; c < iv[q].first + iv[q].count; c++) got[c] = 1;
                cr_assert_eq(t_first_diff(got, touched, (size_t)cols), -1, "64-bit column intervals");
                for (c = 0; c < cols; c += 1 + cols / 64) {
                    mxs_range gr = mxs_group_rows(rows, g);
                    i128 a = (i128)gr.first * cols + c, b = (i128)(gr.first + gr.count - 1) * cols + c;
                    cr_assert_eq(mxs_col_block_inside(rows, cols, g, c, start, len),
                                 a >= start && b < (i128)start + len);
                }
                free(touched), free(got);
            }
        }
    }
    /* bucket sharding of weights at bucket offsets past 2^31 */
    for (k = 0; k < 1000; k++) {
        int64_t nranks = t_between(&rng, 1, 64), chunk = t_between(&rng, (int64_t)1 << 28, (int64_t)1 << 34);
        int64_t bucket = chunk * nranks, offset = t_below(&rng, bucket), elems = t_between(&rng, 0, bucket - offset);
        int64_t q, covered = 0;
        for (q = 0; q < nranks; q++) {
            mxs_range sh = mxs_bucket_shard(offset, elems, bucket, nranks, q);
            i128 lo = (i128)q * chunk, hi = lo + chunk;
            lo = lo > offset ? lo : offset;
            hi = hi < (i128)offset + elems ? hi : (i128)offset + elems;
            if (hi > lo) {
                cr_assert_eq(sh.first, exact(lo - offset));
                cr_assert_eq(sh.count, exact(hi - lo));
            } else
                cr_assert_eq(sh.count, 0);
            covered += sh.count;
        }
        cr_assert_eq(covered, elems, "bucket shards of all ranks cover the weight once");
    }
}

Test(errors, adjacent_buffers_are_not_aliasing) {
    /* the overlap test is exact: a dst that starts where src ends is fine */
    int64_t cb = ref_scale_bytes(40, 70, MXS_ROWWISE, MXS_SCALES_COMPACT);
    int64_t pb = ref_scale_bytes(40, 70, MXS_ROWWISE, MXS_SCALES_SWIZZLED);
    uint8_t *mem = t_alloc((size_t)(cb + pb));
    fixture *f = fx_make(MXS_SCALES_COMPACT);
    cr_assert_eq(mxs_host_convert_scales(40, 70, MXS_ROWWISE, MXS_SCALES_COMPACT, mem, MXS_SCALES_SWIZZLED, mem + cb),
                 MXS_OK);
    cr_assert_eq(mxs_host_convert_scales(40, 70, MXS_ROWWISE, MXS_SCALES_SWIZZLED, mem + cb, MXS_SCALES_COMPACT, mem),
                 MXS_OK);
    cr_assert(t_guard_ok(mem, (size_t)(cb + pb)));
    cr_assert_eq(mxs_host_quantize(&f->t, f->src, MXS_F32, MXS_ROUND_CEIL), MXS_OK);
    /* dequantize right behind the row data plane's last byte */
    {
        uint8_t *joint = malloc(40 * 70 + 40 * 70 * 4);
        mxs_tensor t = f->t;
        memcpy(joint, f->buf[0], 40 * 70);
        t.row_data = joint;
        cr_assert_eq(mxs_host_dequantize(&t, MXS_ROWWISE, joint + 40 * 70, MXS_F32), MXS_OK);
        cr_assert_eq(mxs_host_dequantize(&t, MXS_ROWWISE, joint + 40 * 70 - 1, MXS_BF16), MXS_ERR_ALIASING);
        free(joint);
    }
    free(mem);
    fx_free(f);
}
