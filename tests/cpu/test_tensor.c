/* SPDX-License-Identifier: MIT */
/* docs/contract.md section 2: planes, scale-plane sizes and the three scale layouts. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <mxshard/mxshard.h>

#include "common.h"

static const int layouts[3] = {MXS_SCALES_COMPACT, MXS_SCALES_PADDED, MXS_SCALES_SWIZZLED};
static const int planes[2] = {MXS_ROWWISE, MXS_COLWISE};

/* Shapes: the fixed awkward ones, then random ones. */
static void shape_at(t_rng *rng, int idx, int64_t *rows, int64_t *cols) {
    static const int64_t fixed[][2] = {{1, 1},    {1, 31},    {1, 32},   {1, 33},  {31, 1},   {32, 1},
                                       {33, 1},   {33, 65},   {128, 4},  {129, 5}, {1000, 3}, {3, 1000},
                                       {256, 96}, {127, 127}, {1, 4097}, {4097, 1}};
    const int nfixed = (int)(sizeof fixed / sizeof fixed[0]);
    if (idx < nfixed) {
        *rows = fixed[idx][0];
        *cols = fixed[idx][1];
    } else {
        *rows = t_rand_dim(rng, 700);
        *cols = t_rand_dim(rng, 700);
    }
}

static mxs_tensor shape_tensor(int64_t rows, int64_t cols, unsigned dirs, int layout) {
    mxs_tensor t;
    memset(&t, 0, sizeof t);
    t.rows = rows;
    t.cols = cols;
    t.dirs = dirs;
    t.scale_layout = (mxs_scale_layout)layout;
    return t;
}

Test(tensor, scale_bytes_match_the_spec_table_for_every_layout_and_plane) {
    t_rng rng = t_rng_seed(21);
    int idx, l, p;
    for (idx = 0; idx < 400; idx++) {
        int64_t rows, cols;
        shape_at(&rng, idx, &rows, &cols);
        if (idx >= 300) { /* tall and wide */
            rows = idx & 1 ? t_between(&rng, 1, 3) : t_between(&rng, 100000, 3000000);
            cols = idx & 1 ? t_between(&rng, 100000, 3000000) : t_between(&rng, 1, 3);
        }
        for (l = 0; l < 3; l++) {
            mxs_tensor both = shape_tensor(rows, cols, MXS_BOTH, layouts[l]);
            for (p = 0; p < 2; p++) {
                mxs_tensor one = shape_tensor(rows, cols, (unsigned)planes[p], layouts[l]);
                mxs_tensor other = shape_tensor(rows, cols, (unsigned)planes[1 - p], layouts[l]);
                int64_t want = ref_scale_bytes(rows, cols, planes[p], layouts[l]);
                cr_assert_eq(mxs_scale_bytes(&both, (mxs_dirs)planes[p]), want, "%ldx%ld layout %d plane %d",
                             (long)rows, (long)cols, layouts[l], planes[p]);
                cr_assert_eq(mxs_scale_bytes(&one, (mxs_dirs)planes[p]), want);
                cr_assert_eq(mxs_scale_bytes(&other, (mxs_dirs)planes[p]), -1, "an absent plane has no scales");
            }
        }
    }
    /* the table, spelled out once: 33 x 65 */
    {
        mxs_tensor t = shape_tensor(33, 65, MXS_BOTH, MXS_SCALES_COMPACT);
        cr_assert_eq(mxs_scale_bytes(&t, MXS_ROWWISE), 33 * 3);
        cr_assert_eq(mxs_scale_bytes(&t, MXS_COLWISE), 2 * 65);
        t.scale_layout = MXS_SCALES_PADDED;
        cr_assert_eq(mxs_scale_bytes(&t, MXS_ROWWISE), 128 * 4);
        cr_assert_eq(mxs_scale_bytes(&t, MXS_COLWISE), 4 * 128);
        t.scale_layout = MXS_SCALES_SWIZZLED;
        cr_assert_eq(mxs_scale_bytes(&t, MXS_ROWWISE), 128 * 4);
        cr_assert_eq(mxs_scale_bytes(&t, MXS_COLWISE), 128 * 4);
    }
}

Test(tensor, scale_geometry_is_the_spec_s_m_by_k_view) {
    t_rng rng = t_rng_seed(22);
    int idx, l, p;
    for (idx = 0; idx < 300; idx++) {
        int64_t rows, cols, M, K;
        shape_at(&rng, idx, &rows, &cols);
        for (l = 0; l < 3; l++) {
            for (p = 0; p < 2; p++) {
                mxs_scale_geom g;
                cr_assert(mxs_scale_geom_make(rows, cols, (mxs_dirs)planes[p], (mxs_scale_layout)layouts[l], &g));
                ref_mk(rows, cols, planes[p], &M, &K);
                cr_assert_eq(g.M, M);
                cr_assert_eq(g.K, K);
                cr_assert_eq(g.Mp, ref_rup(M, 128));
                cr_assert_eq(g.Kp, ref_rup(K, 4));
                cr_assert_eq(mxs_scale_geom_bytes(&g), ref_scale_bytes(rows, cols, planes[p], layouts[l]));
            }
        }
    }
}

/* docs/contract.md section 2.3: a plane's scales are allocated as S[M][K]
 * row-wise and k-major, K x M, column-wise (ceil(rows/32) x cols compact);
 * PADDED and SWIZZLED round M up to 128 and K to 4. */
Test(tensor, scale_shape_is_m_by_k_row_wise_and_k_by_m_column_wise) {
    t_rng rng = t_rng_seed(24);
    int idx, l, p;
    for (idx = 0; idx < 300; idx++) {
        int64_t rows, cols;
        shape_at(&rng, idx, &rows, &cols);
        for (l = 0; l < 3; l++) {
            for (p = 0; p < 2; p++) {
                int64_t M, K, outer = -1, inner = -1;
                ref_mk(rows, cols, planes[p], &M, &K);
                if (layouts[l] != MXS_SCALES_COMPACT) {
                    M = ref_rup(M, 128);
                    K = ref_rup(K, 4);
                }
                cr_assert_eq(
                    mxs_scale_shape(rows, cols, (mxs_dirs)planes[p], (mxs_scale_layout)layouts[l], &outer, &inner),
                    MXS_OK);
                cr_assert_eq(outer, planes[p] == MXS_ROWWISE ? M : K, "%ldx%ld layout %d plane %d", (long)rows,
                             (long)cols, layouts[l], planes[p]);
                cr_assert_eq(inner, planes[p] == MXS_ROWWISE ? K : M);
                cr_assert_eq(outer * inner, ref_scale_bytes(rows, cols, planes[p], layouts[l]));
            }
        }
    }
}

/* Bad arguments, no shape and sizes beyond int64 are errors that write
 * nothing; 64-bit shapes are normal. */
Test(tensor, scale_shape_of_a_bad_plane_layout_or_size_is_an_error) {
    int64_t o = -7, i = -7;
    cr_assert_eq(mxs_scale_shape(33, 65, MXS_ROWWISE, MXS_SCALES_COMPACT, NULL, &i), MXS_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mxs_scale_shape(33, 65, MXS_ROWWISE, MXS_SCALES_COMPACT, &o, NULL), MXS_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mxs_scale_shape(33, 65, MXS_BOTH, MXS_SCALES_COMPACT, &o, &i), MXS_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mxs_scale_shape(33, 65, MXS_ROWWISE, (mxs_scale_layout)3, &o, &i), MXS_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mxs_scale_shape(0, 65, MXS_ROWWISE, MXS_SCALES_PADDED, &o, &i), MXS_ERR_SHAPE);
    cr_assert_eq(mxs_scale_shape(33, -1, MXS_COLWISE, MXS_SCALES_PADDED, &o, &i), MXS_ERR_SHAPE);
    cr_assert_eq(mxs_scale_shape(INT64_MAX / 2, 3, MXS_ROWWISE, MXS_SCALES_COMPACT, &o, &i), MXS_ERR_OVERFLOW);
    cr_assert_eq(mxs_scale_shape(INT64_MAX - 100, 1, MXS_ROWWISE, MXS_SCALES_COMPACT, &o, &i), MXS_ERR_OVERFLOW,
                 "round_up(M, 128) overflows");
    cr_assert_eq(mxs_scale_shape(1, INT64_MAX - 100, MXS_COLWISE, MXS_SCALES_PADDED, &o, &i), MXS_ERR_OVERFLOW);
    cr_assert(o == -7 && i == -7, "nothing written");
    cr_assert_eq(mxs_scale_shape(33, 65, MXS_COLWISE, MXS_SCALES_COMPACT, &o, &i), MXS_OK);
    cr_assert(o == 2 && i == 65);
    cr_assert_eq(mxs_scale_shape(33, 65, MXS_COLWISE, MXS_SCALES_SWIZZLED, &o, &i), MXS_OK);
    cr_assert(o == 4 && i == 128);
    cr_assert_eq(mxs_scale_shape(262144, 8192, MXS_ROWWISE, MXS_SCALES_SWIZZLED, &o, &i), MXS_OK);
    cr_assert(o == 262144 && i == 256);
}

Test(tensor, scale_offset_is_the_spec_formula_in_every_layout) {
    t_rng rng = t_rng_seed(23);
    int idx, l, p;
    long checked = 0;
    for (idx = 0; idx < 120; idx++) {
        int64_t rows, cols, m, k;
        shape_at(&rng, idx, &rows, &cols);
        for (l = 0; l < 3; l++) {
            for (p = 0; p < 2; p++) {
                mxs_scale_geom g;
                int64_t mend, kend;
                mxs_scale_geom_make(rows, cols, (mxs_dirs)planes[p], (mxs_scale_layout)layouts[l], &g);
                mend = layouts[l] == MXS_SCALES_COMPACT ? g.M : g.Mp;
                kend = layouts[l] == MXS_SCALES_COMPACT ? g.K : g.Kp;
                for (m = 0; m < mend; m++) {
                    for (k = 0; k < kend; k++) {
                        int64_t want = ref_scale_offset(rows, cols, planes[p], layouts[l], m, k);
                        int64_t got = mxs_scale_geom_offset(&g, m, k);
                        if (got != want)
                            cr_assert_fail("%ldx%ld layout %d plane %d (m=%ld,k=%ld): offset %ld, the contract "
                                           "(docs/contract.md) says %ld",
                                           (long)rows, (long)cols, layouts[l], planes[p], (long)m, (long)k, (long)got,
                                           (long)want);
                        checked++;
                    }
                }
            }
        }
    }
    cr_assert_gt(checked, 100000);
}

Test(tensor, scale_offset_steps_by_m_step_inside_16_row_runs) {
    t_rng rng = t_rng_seed(25);
    int idx, l, p;
    long checked = 0;
    for (idx = 0; idx < 120; idx++) {
        int64_t rows, cols, m0, k, i;
        shape_at(&rng, idx, &rows, &cols);
        for (l = 0; l < 3; l++)
            for (p = 0; p < 2; p++) {
                mxs_scale_geom g;
                int64_t mend, kend, step;
                mxs_scale_geom_make(rows, cols, (mxs_dirs)planes[p], (mxs_scale_layout)layouts[l], &g);
                mend = layouts[l] == MXS_SCALES_COMPACT ? g.M : g.Mp;
                kend = layouts[l] == MXS_SCALES_COMPACT ? g.K : g.Kp;
                step = mxs_scale_geom_m_step(&g);
                for (m0 = 0; m0 < mend; m0 += 16)
                    for (k = 0; k < kend; k++)
                        for (i = 0; i < 16 && m0 + i < mend; i++) {
                            cr_assert_eq(mxs_scale_geom_offset(&g, m0 + i, k),
                                         mxs_scale_geom_offset(&g, m0, k) + i * step,
                                         "%ldx%ld layout %d plane %d (m0=%ld, i=%ld, k=%ld)", (long)rows, (long)cols,
                                         layouts[l], planes[p], (long)m0, (long)i, (long)k);
                            checked++;
                        }
            }
    }
    cr_assert_gt(checked, 100000);
}

Test(tensor, scale_block_of_element_is_its_row_block_or_column_block) {
    t_rng rng = t_rng_seed(24);
    int idx;
    for (idx = 0; idx < 2000; idx++) {
        int64_t rows = t_rand_dim(&rng, 5000), cols = t_rand_dim(&rng, 5000);
        int64_t r = t_below(&rng, rows), c = t_below(&rng, cols);
        mxs_scale_geom gr, gc;
        mxs_scale_geom_make(rows, cols, MXS_ROWWISE, MXS_SCALES_COMPACT, &gr);
        mxs_scale_geom_make(rows, cols, MXS_COLWISE, MXS_SCALES_COMPACT, &gc);
        cr_assert_eq(mxs_scale_m(&gr, r, c), r);
        cr_assert_eq(mxs_scale_k(&gr, r, c), c / 32);
        cr_assert_eq(mxs_scale_m(&gc, r, c), c);
        cr_assert_eq(mxs_scale_k(&gc, r, c), r / 32);
    }
}

Test(tensor, scale_coords_invert_offset_over_whole_planes) {
    t_rng rng = t_rng_seed(25);
    int idx, l, p;
    for (idx = 0; idx < 120; idx++) {
        int64_t rows, cols;
        shape_at(&rng, idx, &rows, &cols);
        for (l = 0; l < 3; l++) {
            for (p = 0; p < 2; p++) {
                mxs_scale_geom g;
                int64_t bytes, off, mend, kend;
                uint8_t *seen;
                mxs_scale_geom_make(rows, cols, (mxs_dirs)planes[p], (mxs_scale_layout)layouts[l], &g);
                bytes = mxs_scale_geom_bytes(&g);
                mend = layouts[l] == MXS_SCALES_COMPACT ? g.M : g.Mp;
                kend = layouts[l] == MXS_SCALES_COMPACT ? g.K : g.Kp;
                cr_assert_eq(mend * kend, bytes);
                seen = calloc((size_t)bytes, 1);
                cr_assert_not_null(seen);
                for (off = 0; off < bytes; off++) {
                    int64_t m = -1, k = -1;
                    mxs_scale_geom_coords(&g, off, &m, &k);
                    if (m < 0 || m >= mend || k < 0 || k >= kend || mxs_scale_geom_offset(&g, m, k) != off)
                        cr_assert_fail("%ldx%ld layout %d plane %d: byte %ld -> (%ld,%ld) is not its entry", (long)rows,
                                       (long)cols, layouts[l], planes[p], (long)off, (long)m, (long)k);
                    if (seen[m * kend + k]++) cr_assert_fail("entry (%ld,%ld) at two offsets", (long)m, (long)k);
                }
                free(seen); /* bytes offsets, each to a distinct entry of mend*kend == bytes: a bijection */
            }
        }
    }
}

/* Writes a plane in layout `layout` from the logical matrix `logical`
 * (COMPACT bytes), with `pad` in every padding entry. */
static void layout_from_logical(int64_t rows, int64_t cols, int plane, int layout, const uint8_t *logical, uint8_t pad,
                                uint8_t *out) {
    int64_t M, K, m, k;
    ref_mk(rows, cols, plane, &M, &K);
    memset(out, pad, (size_t)ref_scale_bytes(rows, cols, plane, layout));
    for (m = 0; m < M; m++)
        for (k = 0; k < K; k++)
            out[ref_scale_offset(rows, cols, plane, layout, m, k)] =
                logical[ref_scale_offset(rows, cols, plane, MXS_SCALES_COMPACT, m, k)];
}

Test(tensor, convert_scales_between_every_pair_of_layouts_writes_padding_as_zero) {
    t_rng rng = t_rng_seed(26);
    int idx, p, from, to;
    for (idx = 0; idx < 150; idx++) {
        int64_t rows, cols;
        shape_at(&rng, idx, &rows, &cols);
        for (p = 0; p < 2; p++) {
            int64_t cbytes = ref_scale_bytes(rows, cols, planes[p], MXS_SCALES_COMPACT), k;
            int64_t maxb = ref_scale_bytes(rows, cols, planes[p], MXS_SCALES_PADDED);
            uint8_t *logical = malloc((size_t)cbytes), *src = malloc((size_t)maxb), *want = malloc((size_t)maxb);
            uint8_t *dst = t_alloc((size_t)maxb);
            cr_assert(logical && src && want && dst);
            for (k = 0; k < cbytes; k++) logical[k] = (uint8_t)t_next(&rng);
            for (from = 0; from < 3; from++) {
                /* source padding is garbage: it must be ignored */
                layout_from_logical(rows, cols, planes[p], from, logical, 0x5C, src);
                for (to = 0; to < 3; to++) {
                    int64_t nb = ref_scale_bytes(rows, cols, planes[p], to), d;
                    layout_from_logical(rows, cols, planes[p], to, logical, 0x00, want);
                    t_poison(dst, (size_t)nb);
                    cr_assert_eq(mxs_host_convert_scales(rows, cols, (mxs_dirs)planes[p], (mxs_scale_layout)from, src,
                                                         (mxs_scale_layout)to, dst),
                                 MXS_OK);
                    d = t_first_diff(dst, want, (size_t)nb);
                    cr_assert_eq(d, -1, "%ldx%ld plane %d %d->%d: byte %ld is 0x%02x, want 0x%02x", (long)rows,
                                 (long)cols, planes[p], from, to, (long)d, d >= 0 ? dst[d] : 0, d >= 0 ? want[d] : 0);
                    cr_assert(t_guard_ok(dst, (size_t)nb), "wrote past the plane's %ld bytes", (long)nb);
                }
            }
            free(logical), free(src), free(want), free(dst);
        }
    }
}

Test(tensor, convert_scales_round_trips_compact_padded_swizzled_compact) {
    t_rng rng = t_rng_seed(27);
    int idx, p;
    for (idx = 0; idx < 200; idx++) {
        int64_t rows, cols;
        shape_at(&rng, idx, &rows, &cols);
        for (p = 0; p < 2; p++) {
            int64_t cb = ref_scale_bytes(rows, cols, planes[p], MXS_SCALES_COMPACT);
            int64_t pb = ref_scale_bytes(rows, cols, planes[p], MXS_SCALES_PADDED), k;
            uint8_t *compact = malloc((size_t)cb), *padded = t_alloc((size_t)pb), *swz = t_alloc((size_t)pb);
            uint8_t *back = t_alloc((size_t)cb), *padded2 = t_alloc((size_t)pb);
            mxs_dirs pl = (mxs_dirs)planes[p];
            cr_assert(compact && padded && swz && back && padded2);
            for (k = 0; k < cb; k++) compact[k] = (uint8_t)t_next(&rng);
            cr_assert_eq(
                mxs_host_convert_scales(rows, cols, pl, MXS_SCALES_COMPACT, compact, MXS_SCALES_PADDED, padded),
                MXS_OK);
            cr_assert_eq(mxs_host_convert_scales(rows, cols, pl, MXS_SCALES_PADDED, padded, MXS_SCALES_SWIZZLED, swz),
                         MXS_OK);
            cr_assert_eq(mxs_host_convert_scales(rows, cols, pl, MXS_SCALES_SWIZZLED, swz, MXS_SCALES_COMPACT, back),
                         MXS_OK);
            cr_assert_eq(mxs_host_convert_scales(rows, cols, pl, MXS_SCALES_SWIZZLED, swz, MXS_SCALES_PADDED, padded2),
                         MXS_OK);
            cr_assert_eq(t_first_diff(back, compact, (size_t)cb), -1, "compact -> padded -> swizzled -> compact");
            cr_assert_eq(t_first_diff(padded2, padded, (size_t)pb), -1, "padded -> swizzled -> padded");
            cr_assert(t_guard_ok(padded, (size_t)pb) && t_guard_ok(swz, (size_t)pb) && t_guard_ok(back, (size_t)cb) &&
                      t_guard_ok(padded2, (size_t)pb));
            /* every byte written: padded is exactly the logical entries plus 0x00 padding */
            layout_from_logical(rows, cols, planes[p], MXS_SCALES_PADDED, compact, 0x00, padded2);
            cr_assert_eq(t_first_diff(padded, padded2, (size_t)pb), -1, "padded plane is not fully determined");
            free(compact), free(padded), free(swz), free(back), free(padded2);
        }
    }
}

Test(tensor, row_only_storage_is_1_plus_1_over_32_bytes_per_element_bidirectional_2_plus_2_over_32) {
    t_rng rng = t_rng_seed(28);
    int idx, l;
    for (idx = 0; idx < 500; idx++) {
        int64_t rows = 32 * t_between(&rng, 1, 300), cols = 32 * t_between(&rng, 1, 300), elems = rows * cols;
        mxs_tensor row = shape_tensor(rows, cols, MXS_ROWWISE, MXS_SCALES_COMPACT);
        mxs_tensor col = shape_tensor(rows, cols, MXS_COLWISE, MXS_SCALES_COMPACT);
        mxs_tensor both = shape_tensor(rows, cols, MXS_BOTH, MXS_SCALES_COMPACT);
        cr_assert_eq(mxs_tensor_storage_bytes(&row) * 32, elems * 33);
        cr_assert_eq(mxs_tensor_storage_bytes(&col) * 32, elems * 33);
        cr_assert_eq(mxs_tensor_storage_bytes(&both) * 32, elems * 66);
        cr_assert_eq(mxs_tensor_storage_bytes(&both), 2 * mxs_tensor_storage_bytes(&row));
        cr_assert_eq(mxs_data_bytes(&row), elems);
    }
    for (idx = 0; idx < 300; idx++) {
        int64_t rows = t_rand_dim(&rng, 3000), cols = t_rand_dim(&rng, 3000);
        for (l = 0; l < 3; l++) {
            mxs_tensor row = shape_tensor(rows, cols, MXS_ROWWISE, layouts[l]);
            mxs_tensor both = shape_tensor(rows, cols, MXS_BOTH, layouts[l]);
            int64_t rs = ref_scale_bytes(rows, cols, MXS_ROWWISE, layouts[l]);
            int64_t cs = ref_scale_bytes(rows, cols, MXS_COLWISE, layouts[l]);
            cr_assert_eq(mxs_tensor_storage_bytes(&row), rows * cols + rs);
            cr_assert_eq(mxs_tensor_storage_bytes(&both), 2 * rows * cols + rs + cs);
        }
    }
}
