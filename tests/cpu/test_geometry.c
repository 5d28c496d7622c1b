/* SPDX-License-Identifier: MIT */
/* docs/contract.md section 3: which blocks a shard [start, start+len) touches, checked
 * against brute force over every element of random shapes and shards
 * (unaligned, empty, single-element, whole). */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <mxshard/mxshard.h>

#include "common.h"

#define N_CASES 400

typedef struct shard_case {
    int64_t rows, cols, start, len;
} shard_case;

/* Case idx of a deterministic stream: shapes from t_rand_dim, shards of
 * every kind. */
static shard_case make_case(t_rng *rng, int idx) {
    shard_case sc;
    int64_t elems;
    sc.rows = t_rand_dim(rng, 150);
    sc.cols = t_rand_dim(rng, 150);
    elems = sc.rows * sc.cols;
    switch (idx % 8) {
    case 0: sc.start = t_between(rng, 0, elems), sc.len = 0; break; /* empty, anywhere */
    case 1: sc.start = 0, sc.len = elems; break;                    /* whole */
    case 2: sc.start = t_below(rng, elems), sc.len = 1; break;      /* one element */
    case 3:                                                         /* row-aligned */
        sc.start = t_between(rng, 0, sc.rows) * sc.cols;
        sc.len = t_between(rng, 0, sc.rows - sc.start / sc.cols) * sc.cols;
        break;
    case 4: /* shorter than one row, maybe crossing a row boundary */
        sc.start = t_below(rng, elems);
        sc.len = t_between(rng, 0, sc.cols < elems - sc.start ? sc.cols : elems - sc.start);
        break;
    case 5: sc.start = t_below(rng, elems), sc.len = elems - sc.start; break; /* suffix */
    case 6: sc.start = 0, sc.len = t_between(rng, 0, elems); break;           /* prefix */
    default:
        sc.start = t_between(rng, 0, elems);
        sc.len = t_between(rng, 0, elems - sc.start);
        break;
    }
    return sc;
}

static int in_shard(const shard_case *sc, int64_t i) { return i >= sc->start && i < sc->start + sc->len; }

Test(geometry, shard_check_accepts_exactly_ranges_inside_the_tensor) {
    cr_assert_eq(mxs_shard_check(100, 0, 100), MXS_OK);
    cr_assert_eq(mxs_shard_check(100, 100, 0), MXS_OK, "an empty shard at the end is fine");
    cr_assert_eq(mxs_shard_check(100, 37, 0), MXS_OK);
    cr_assert_eq(mxs_shard_check(100, 0, 101), MXS_ERR_RANGE);
    cr_assert_eq(mxs_shard_check(100, 101, 0), MXS_ERR_RANGE);
    cr_assert_eq(mxs_shard_check(100, -1, 1), MXS_ERR_RANGE);
    cr_assert_eq(mxs_shard_check(100, 1, -1), MXS_ERR_RANGE);
    cr_assert_eq(mxs_shard_check(INT64_MAX, INT64_MAX, INT64_MAX), MXS_ERR_RANGE, "start + len overflows");
    cr_assert_eq(mxs_shard_check(INT64_MAX, INT64_MAX - 5, 5), MXS_OK);
}

Test(geometry, shard_row_blocks_are_exactly_the_row_blocks_holding_shard_elements) {
    t_rng rng = t_rng_seed(31);
    int idx;
    for (idx = 0; idx < N_CASES; idx++) {
        shard_case sc = make_case(&rng, idx);
        int64_t kr = (sc.cols + 31) / 32, nblocks = sc.rows * kr, i, b;
        uint8_t *touched = calloc((size_t)nblocks, 1), *outside = calloc((size_t)nblocks, 1);
        mxs_range rb = mxs_shard_row_blocks(sc.cols, sc.start, sc.len);
        cr_assert(touched && outside);
        cr_assert_eq(mxs_row_blocks_per_row(sc.cols), kr);
        for (i = 0; i < sc.rows * sc.cols; i++) {
            int64_t blk = (i / sc.cols) * kr + (i % sc.cols) / 32;
            cr_assert_eq(mxs_row_block_of(sc.cols, i), blk);
            if (in_shard(&sc, i))
                touched[blk] = 1;
            else
                outside[blk] = 1;
        }
        for (b = 0; b < nblocks; b++) {
            mxs_range span = mxs_row_block_span(sc.cols, b);
            int64_t r = b / kr, c0 = (b % kr) * 32, c1 = c0 + 32 < sc.cols ? c0 + 32 : sc.cols;
            cr_assert_eq(span.first, r * sc.cols + c0, "span of block %ld", (long)b);
            cr_assert_eq(span.count, c1 - c0);
            cr_assert_eq(b >= rb.first && b < rb.first + rb.count, touched[b],
                         "%ldx%ld shard [%ld,+%ld): block %ld touched=%d but range [%ld,+%ld)", (long)sc.rows,
                         (long)sc.cols, (long)sc.start, (long)sc.len, (long)b, touched[b], (long)rb.first,
                         (long)rb.count);
            cr_assert_eq(mxs_row_block_inside(sc.cols, b, sc.start, sc.len), touched[b] && !outside[b],
                         "%ldx%ld shard [%ld,+%ld): block %ld inside?", (long)sc.rows, (long)sc.cols, (long)sc.start,
                         (long)sc.len, (long)b);
        }
        if (sc.len == 0) cr_assert_eq(rb.count, 0);
        free(touched), free(outside);
    }
}

Test(geometry, shard_col_intervals_are_exactly_the_columns_with_a_shard_element_per_group) {
    t_rng rng = t_rng_seed(32);
    int idx;
    for (idx = 0; idx < N_CASES; idx++) {
        shard_case sc = make_case(&rng, idx);
        int64_t kc = (sc.rows + 31) / 32, g, c, r;
        uint8_t *touched = malloc((size_t)sc.cols), *outside = malloc((size_t)sc.cols), *got = malloc((size_t)sc.cols);
        mxs_range groups = mxs_shard_groups(sc.cols, sc.start, sc.len);
        int64_t gmin = -1, gmax = -1;
        cr_assert(touched && outside && got);
        cr_assert_eq(mxs_col_groups(sc.rows), kc);
        for (g = 0; g < kc; g++) {
            mxs_range iv[2], gr = mxs_group_rows(sc.rows, g);
            int n, q, any = 0;
            cr_assert_eq(gr.first, 32 * g);
            cr_assert_eq(gr.count, (32 * g + 32 < sc.rows ? 32 * g + 32 : sc.rows) - 32 * g);
            memset(touched, 0, (size_t)sc.cols);
            memset(outside, 0, (size_t)sc.cols);
            memset(got, 0, (size_t)sc.cols);
            for (r = 32 * g; r < sc.rows && r < 32 * g + 32; r++)
                for (c = 0; c < sc.cols; c++) {
                    if (in_shard(&sc, r * sc.cols + c))
                        touched[c] = 1, any = 1;
                    else
                        outside[c] = 1;
                }
            if (any) {
                if (gmin < 0) gmin = g;
                gmax = g;
            }
            n = mxs_shard_col_intervals(sc.rows, sc.cols, sc.start, sc.len, g, iv);
            cr_assert(n >= 0 && n <= 2);
            for (q = 0; q < n; q++) {
                cr_assert(iv[q].count > 0 && iv[q].first >= 0 && iv[q].first + iv[q].count <= sc.cols,
                          "interval %d of group %ld out of range", q, (long)g);
                for (c = iv[q].first; c < iv[q].first + iv[q].count; c++) {
                    cr_assert_eq(got[c], 0, "column %ld in two intervals", (long)c);
                    got[c] = 1;
                }
            }
            for (c = 0; c < sc.cols; c++) {
                cr_assert_eq(got[c], touched[c], "%ldx%ld shard [%ld,+%ld) group %ld col %ld: interval says %d",
                             (long)sc.rows, (long)sc.cols, (long)sc.start, (long)sc.len, (long)g, (long)c, got[c]);
                cr_assert_eq(mxs_col_block_inside(sc.rows, sc.cols, g, c, sc.start, sc.len), touched[c] && !outside[c],
                             "%ldx%ld shard [%ld,+%ld) col block (%ld,%ld) inside?", (long)sc.rows, (long)sc.cols,
                             (long)sc.start, (long)sc.len, (long)g, (long)c);
            }
        }
        if (gmin < 0)
            cr_assert_eq(groups.count, 0, "an empty shard touches no group");
        else {
            cr_assert_eq(groups.first, gmin);
            cr_assert_eq(groups.count, gmax - gmin + 1);
        }
        free(touched), free(outside), free(got);
    }
}

Test(geometry, shard_row_cols_are_the_shard_columns_of_each_row) {
    t_rng rng = t_rng_seed(33);
    int idx;
    for (idx = 0; idx < N_CASES; idx++) {
        shard_case sc = make_case(&rng, idx);
        int64_t r, c;
        for (r = 0; r < sc.rows; r++) {
            mxs_range rc = mxs_shard_row_cols(sc.cols, r, sc.start, sc.len);
            int64_t lo = -1, hi = -1;
            for (c = 0; c < sc.cols; c++)
                if (in_shard(&sc, r * sc.cols + c)) {
                    if (lo < 0) lo = c;
                    hi = c + 1;
                }
            if (lo < 0)
                cr_assert_eq(rc.count, 0, "row %ld has no shard element", (long)r);
            else {
                cr_assert_eq(rc.first, lo, "row %ld of %ldx%ld shard [%ld,+%ld)", (long)r, (long)sc.rows, (long)sc.cols,
                             (long)sc.start, (long)sc.len);
                cr_assert_eq(rc.count, hi - lo);
            }
        }
    }
}

Test(geometry, bucket_shards_of_all_ranks_tile_every_weight_exactly) {
    t_rng rng = t_rng_seed(34);
    int idx;
    for (idx = 0; idx < 300; idx++) {
        int64_t nranks = t_between(&rng, 1, 9), nw = t_between(&rng, 1, 6), w, q, i, total = 0;
        int64_t elems[6], offset[6], bucket, chunk;
        for (w = 0; w < nw; w++) {
            elems[w] = t_rand_dim(&rng, 500) * t_rand_dim(&rng, 60);
            offset[w] = total;
            total += elems[w];
        }
        bucket = ((total + nranks - 1) / nranks) * nranks; /* padded so nranks divides it */
        if (idx & 1) bucket += nranks * t_between(&rng, 0, 3);
        chunk = bucket / nranks;
        for (w = 0; w < nw; w++) {
            uint8_t *owners = calloc((size_t)elems[w], 1);
            cr_assert_not_null(owners);
            for (q = 0; q < nranks; q++) {
                mxs_range s = mxs_bucket_shard(offset[w], elems[w], bucket, nranks, q);
                int64_t lo = q * chunk > offset[w] ? q * chunk - offset[w] : 0;
                int64_t hi = (q + 1) * chunk - offset[w] < elems[w] ? (q + 1) * chunk - offset[w] : elems[w];
                cr_assert_eq(mxs_shard_check(elems[w], s.first, s.count), MXS_OK);
                if (hi <= lo)
                    cr_assert_eq(s.count, 0, "rank %ld owns nothing of weight %ld", (long)q, (long)w);
                else {
                    cr_assert_eq(s.first, lo, "rank %ld weight %ld", (long)q, (long)w);
                    cr_assert_eq(s.count, hi - lo);
                }
                for (i = s.first; i < s.first + s.count; i++) owners[i]++;
            }
            for (i = 0; i < elems[w]; i++)
                cr_assert_eq(owners[i], 1, "weight %ld element %ld owned by %d ranks", (long)w, (long)i, owners[i]);
            free(owners);
        }
    }
}
