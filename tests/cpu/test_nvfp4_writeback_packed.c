/* SPDX-License-Identifier: MIT */
/* docs/contract.md section 9.8: the NVFP4 writeback's packed buffer and shard
 * boundaries, one rank at a time: amax entries order as the amaxes; the plan's
 * slots, sizes and fingerprint on a fixed batch; odd shard boundaries are
 * rejected before any write; the bucket helpers only give even boundaries. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <mxshard/mxshard.h>
#include <mxshard/nvfp4_writeback.h>

#include "common.h"
#include "nvfp4_writeback_fixture.h"

/* ---- the packed buffer -------------------------------------------------------- */

Test(nvfp4_writeback, entries_order_as_the_amaxes) {
    t_rng rng = t_rng_seed(7);
    int i;
    for (i = 0; i < 100000; i++) {
        float a = fabsf(t_rand_f32(&rng, (int)t_between(&rng, -40, 40)));
        float b = fabsf(t_rand_f32(&rng, (int)t_between(&rng, -40, 40)));
        if (a != a || b != b) continue; /* an amax is never NaN */
        cr_assert_eq(a < b, mxs_nvfp4_amax_entry(a, 4) < mxs_nvfp4_amax_entry(b, 4));
        cr_assert_eq(mxs_f32_bits(mxs_nvfp4_entry_amax(mxs_nvfp4_amax_entry(a, 4), 4)), mxs_f32_bits(a));
        a = mxs_bf16_to_f32(mxs_bf16_from_f32(a)); /* bf16 values: 2-byte entries, exact */
        b = mxs_bf16_to_f32(mxs_bf16_from_f32(b));
        cr_assert_eq(a < b, mxs_nvfp4_amax_entry(a, 2) < mxs_nvfp4_amax_entry(b, 2));
        cr_assert_eq(mxs_nvfp4_amax_entry(a, 2), mxs_bf16_from_f32(a));
        cr_assert_eq(mxs_f32_bits(mxs_nvfp4_entry_amax(mxs_nvfp4_amax_entry(a, 2), 2)), mxs_f32_bits(a));
    }
    cr_assert_eq(mxs_nvfp4_wb_entry_bytes(MXS_BF16), 2);
    cr_assert_eq(mxs_nvfp4_wb_entry_bytes(MXS_F32), 4);
    cr_assert_eq(mxs_nvfp4_wb_entry_bytes(MXS_F16), 4);
}

Test(nvfp4_writeback, packed_layout_slots_and_fingerprint) {
    one o;
    mxs_nvfp4_wb_plan plan, plan2;
    mxs_nvfp4_wb_slot sl[3];
    one_make(&o);
    cr_assert_eq(mxs_nvfp4_wb_make_plan(&o.batch, &plan, sl), MXS_OK);
    /* the 3 tensor amaxes; item 0: 1x16 both: 20 x 3 row blocks, then 33 x 2
     * column blocks; item 1: 16x16 row-only: 2 x 3 tiles; item 2: 1x16
     * column-only: 5 x 1; status */
    cr_assert_eq(sl[0].amax_entry, 0);
    cr_assert_eq(sl[1].amax_entry, 1);
    cr_assert_eq(sl[2].amax_entry, 2);
    cr_assert_eq(sl[0].row_entry, 3);
    cr_assert_eq(sl[0].col_entry, 63);
    cr_assert_eq(sl[0].tile_entry, -1);
    cr_assert_eq(sl[1].row_entry, -1);
    cr_assert_eq(sl[1].col_entry, -1);
    cr_assert_eq(sl[1].tile_entry, 129);
    cr_assert_eq(sl[2].row_entry, -1);
    cr_assert_eq(sl[2].col_entry, 135);
    cr_assert_eq(sl[2].tile_entry, -1);
    cr_assert_eq(plan.packed_count, 141);
    cr_assert_eq(plan.entry_bytes, 2);
    cr_assert_eq(plan.packed_bytes, 282);
    cr_assert_eq(plan.status_offset, 281);
    /* the fingerprint ignores shards, pointers and layouts; not shapes, planes, blocks, round-through */
    o.items[0].start = 2;
    o.items[0].len = 100;
    o.items[0].master = o.bufs[0][6] + 8;
    o.items[1].primary.scale_layout = MXS_SCALES_SWIZZLED;
    o.items[2].master_dtype = MXS_BF16;
    cr_assert_eq(mxs_nvfp4_wb_make_plan(&o.batch, &plan2, NULL), MXS_OK);
    cr_assert_eq(plan2.fingerprint, plan.fingerprint);
    cr_assert_neq(plan2.local_hash, plan.local_hash);
    o.items[1].primary.block = MXS_NVFP4_1X16;
    cr_assert_eq(mxs_nvfp4_wb_make_plan(&o.batch, &plan2, NULL), MXS_OK);
    cr_assert_neq(plan2.fingerprint, plan.fingerprint);
    o.items[1].primary.block = MXS_NVFP4_16X16;
    o.batch.round_through = MXS_F32;
    cr_assert_eq(mxs_nvfp4_wb_make_plan(&o.batch, &plan2, NULL), MXS_OK);
    cr_assert_neq(plan2.fingerprint, plan.fingerprint);
    cr_assert_eq(plan2.entry_bytes, 4);
    cr_assert_eq(plan2.packed_bytes, 4 * 141);
    /* an empty batch still has its status entry */
    o.batch.n_items = 0;
    cr_assert_eq(mxs_nvfp4_wb_make_plan(&o.batch, &plan2, NULL), MXS_OK);
    cr_assert_eq(plan2.packed_count, 1);
    cr_assert_eq(plan2.status_offset, 3);
    one_free(&o);
}

/* The amax of the weight's rows [r0, r1) x cols [c0, c1) (f32 master). */
static float block_amax(const float *x, int64_t cols, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    float a = 0.0f;
    int64_t r, c;
    for (r = r0; r < r1; r++)
        for (c = c0; c < c1; c++) a = fabsf(x[r * cols + c]) > a ? fabsf(x[r * cols + c]) : a;
    return a;
}

/* docs/contract.md section 9.8: block (b, j) of a region - block row b of
 * `height` weight rows, its j-th block: a 1x16 block column, a column (16x1
 * blocks) or a tile column - holds that block's amax at the region's entry
 * b*row_step + j*col_step (mxs_wb_region_entry): the COMPACT scale order of
 * its plane ((r, k) at r*ceil(cols/16) + k, (c, g) at c*ceil(rows/16) + g),
 * the tiles row-major. The regions fill the buffer between the tensor amax
 * and the status entry. One rank, the whole weight as its shard, random
 * shapes with 1-element dimensions and non-multiples of 16. */
Test(nvfp4_writeback, region_entry_of_a_block_holds_that_blocks_amax) {
    static const int64_t dims[] = {1, 2, 3, 15, 16, 17, 31, 32, 33, 47, 48, 49};
    t_rng rng = t_rng_seed(34);
    int iter, p;
    for (iter = 0; iter < 120; iter++) {
        const int64_t rows = iter & 2 ? dims[t_below(&rng, 12)] : t_between(&rng, 1, 90);
        const int64_t cols = iter & 4 ? dims[t_below(&rng, 12)] : t_between(&rng, 1, 90);
        const int block = iter & 1 ? MXS_NVFP4_16X16 : MXS_NVFP4_1X16;
        const int64_t kr = (cols + 15) / 16, kc = (rows + 15) / 16;
        int64_t i, filled = 0;
        mxs_nvfp4_wb_plan plan;
        mxs_nvfp4_wb_slot sl;
        const uint32_t *entries;
        float *x;
        one o;
        memset(&o, 0, sizeof o);
        one_item(&o, 0, rows, cols, MXS_BOTH, block);
        x = (float *)(void *)o.bufs[0][6]; /* the master: distinct amaxes per block */
        for (i = 0; i < rows * cols; i++) x[i] = (float)t_between(&rng, -1000000, 1000000);
        o.batch.items = o.items;
        o.batch.n_items = 1;
        o.batch.round_through = MXS_F32; /* 4-byte entries: the amax's f32 bits */
        cr_assert_eq(mxs_nvfp4_wb_make_plan(&o.batch, &plan, &sl), MXS_OK);
        o.packed = t_alloc((size_t)plan.packed_bytes);
        cr_assert_eq(mxs_host_nvfp4_wb_partial(&o.batch, &plan, o.packed), MXS_OK);
        entries = (const uint32_t *)(const void *)o.packed;
        for (p = MXS_ROWWISE; p <= MXS_COLWISE; p++) {
            const int tiles = block == MXS_NVFP4_16X16, col = !tiles && p == MXS_COLWISE;
            const int64_t first = tiles ? sl.tile_entry : col ? sl.col_entry : sl.row_entry;
            mxs_wb_region g = {0, 0, 0, 0, 0};
            int64_t b, j;
            cr_assert_eq(mxs_nvfp4_wb_region_make(rows, cols, (mxs_dirs)p, (mxs_nvfp4_block)block, &g), MXS_OK);
            cr_assert_eq(g.height, tiles || col ? 16 : 1);
            cr_assert_eq(g.block_rows, tiles || col ? kc : rows, "%ldx%ld plane %d block %d", (long)rows, (long)cols, p,
                         block);
            cr_assert_eq(g.per_row, col ? cols : kr);
            for (b = 0; b < g.block_rows; b++) {
                const int64_t r0 = b * g.height, r1 = r0 + g.height < rows ? r0 + g.height : rows;
                for (j = 0; j < g.per_row; j++) {
                    const int64_t c0 = col ? j : 16 * j, c1 = col ? j + 1 : (c0 + 16 < cols ? c0 + 16 : cols);
                    const int64_t at = first + mxs_wb_region_entry(&g, b, j);
                    const int64_t want_at = first + (col ? j * kc + b : b * kr + j);
                    int64_t bb = -1, jj = -1;
                    mxs_wb_region_block(&g, at - first, &bb, &jj); /* the inverse (the kernels' thread units) */
                    if (at != want_at || bb != b || jj != j ||
                        entries[at] != mxs_f32_bits(block_amax(x, cols, r0, r1, c0, c1)))
                        cr_assert_fail("%ldx%ld plane %d block %d: block (%ld, %ld) at entry %ld (back: %ld, %ld), "
                                       "holding %08x",
                                       (long)rows, (long)cols, p, block, (long)b, (long)j, (long)at, (long)bb, (long)jj,
                                       entries[at]);
                }
            }
            if (!tiles || p == MXS_ROWWISE) filled += g.block_rows * g.per_row; /* the tiles serve both planes */
        }
        cr_assert_eq(plan.packed_count, 1 + filled + 1, "the tensor amax, the regions, the status entry");
        one_free(&o);
    }
}

/* A region of no shape, plane or block is an error, and *out is left alone;
 * a 16x16 weight has the one region of tiles for either plane. */
Test(nvfp4_writeback, region_of_a_bad_shape_plane_or_block_is_an_error) {
    mxs_wb_region g = {0, 0, 0, 0, 0}, h = {0, 0, 0, 0, 0}, before = {0, 0, 0, 0, 0};
    memset(&g, 0x5A, sizeof g);
    before = g;
    cr_assert_eq(mxs_nvfp4_wb_region_make(4, 4, MXS_ROWWISE, MXS_NVFP4_1X16, NULL), MXS_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mxs_nvfp4_wb_region_make(4, 4, MXS_BOTH, MXS_NVFP4_1X16, &g), MXS_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mxs_nvfp4_wb_region_make(4, 4, MXS_BOTH, MXS_NVFP4_16X16, &g), MXS_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mxs_nvfp4_wb_region_make(4, 4, MXS_ROWWISE, (mxs_nvfp4_block)2, &g), MXS_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mxs_nvfp4_wb_region_make(0, 4, MXS_ROWWISE, MXS_NVFP4_1X16, &g), MXS_ERR_SHAPE);
    cr_assert_eq(mxs_nvfp4_wb_region_make(4, 0, MXS_COLWISE, MXS_NVFP4_16X16, &g), MXS_ERR_SHAPE);
    cr_assert_eq(mxs_nvfp4_wb_region_make(INT64_MAX / 2, 3, MXS_ROWWISE, MXS_NVFP4_1X16, &g), MXS_ERR_OVERFLOW);
    cr_assert_eq(mxs_nvfp4_wb_region_make(3, INT64_MAX / 2, MXS_COLWISE, MXS_NVFP4_16X16, &g), MXS_ERR_OVERFLOW);
    cr_assert_eq(memcmp(&g, &before, sizeof g), 0);
    cr_assert_eq(mxs_nvfp4_wb_region_make(33, 70, MXS_ROWWISE, MXS_NVFP4_16X16, &g), MXS_OK);
    cr_assert_eq(mxs_nvfp4_wb_region_make(33, 70, MXS_COLWISE, MXS_NVFP4_16X16, &h), MXS_OK);
    cr_assert_eq(memcmp(&g, &h, sizeof g), 0);
    cr_assert(g.height == 16 && g.block_rows == 3 && g.per_row == 5 && g.row_step == 5 && g.col_step == 1);
    /* 64-bit: a 2^40-element weight's last column block */
    cr_assert_eq(mxs_nvfp4_wb_region_make((int64_t)1 << 20, (int64_t)1 << 20, MXS_COLWISE, MXS_NVFP4_1X16, &g), MXS_OK);
    cr_assert_eq(mxs_wb_region_entry(&g, g.block_rows - 1, g.per_row - 1), ((int64_t)1 << 36) - 1);
}

/* ---- odd boundaries and the bucket helpers ------------------------------------ */

Test(nvfp4_writeback, odd_shard_boundaries_are_rejected_before_any_write) {
    one o;
    mxs_nvfp4_wb_plan plan;
    mxs_status s;
    one_make(&o);
    cr_assert_eq(mxs_nvfp4_shard_check(11, 4, 7), MXS_OK); /* ends at n = 11 (odd): fine */
    cr_assert_eq(mxs_nvfp4_shard_check(11, 4, 4), MXS_OK);
    cr_assert_eq(mxs_nvfp4_shard_check(11, 5, 6), MXS_ERR_RANGE); /* odd start */
    cr_assert_eq(mxs_nvfp4_shard_check(11, 4, 3), MXS_ERR_RANGE); /* odd end inside the weight */
    cr_assert_eq(mxs_nvfp4_shard_check(11, 5, 0), MXS_OK);        /* empty: owns no byte */
    cr_assert_eq(mxs_nvfp4_shard_check(11, 12, 0), MXS_ERR_RANGE);
    cr_assert_eq(mxs_nvfp4_wb_make_plan(&o.batch, &plan, NULL), MXS_OK);
    o.items[0].start = 1;
    o.items[0].len = 10;
    cr_assert_eq(mxs_nvfp4_wb_make_plan(&o.batch, &plan, NULL), MXS_ERR_RANGE);
    s = mxs_host_nvfp4_wb_partial(&o.batch, &plan, o.packed);
    cr_assert_eq(s, MXS_ERR_RANGE, "%s", mxs_status_str(s));
    cr_assert_eq(mxs_host_nvfp4_wb_apply(&o.batch, &plan, o.packed), MXS_ERR_RANGE);
    cr_assert_eq(mxs_host_nvfp4_wb_finish(&o.batch, &plan), MXS_ERR_RANGE);
    o.items[0].start = 2;
    o.items[0].len = 9; /* ends at 11 of 660 */
    cr_assert_eq(mxs_nvfp4_wb_make_plan(&o.batch, &plan, NULL), MXS_ERR_RANGE);
    cr_assert(one_untouched(&o));
    cr_assert(t_all_poisoned(o.packed, (size_t)o.packed_bytes));
    o.items[2].start = 2; /* 9 x 5: odd n, a shard to the end */
    o.items[2].len = 43;
    o.items[0].len = 10;
    cr_assert_eq(mxs_nvfp4_wb_make_plan(&o.batch, &plan, NULL), MXS_OK);
    one_free(&o);
}

Test(nvfp4_writeback, bucket_helpers_only_give_even_boundaries) {
    t_rng rng = t_rng_seed(99);
    int it;
    mxs_range s = {0, 0}; /* (set by the calls; -O1 cannot tell) */
    for (it = 0; it < 2000; it++) {
        int64_t n = t_between(&rng, 1, 6), R = t_between(&rng, 1, 9), sizes[6], offs[6], used = 0, bucket, k, q;
        for (k = 0; k < n; k++) {
            sizes[k] = t_between(&rng, 1, 300);
            offs[k] = mxs_nvfp4_bucket_place(used);
            cr_assert_eq(offs[k] % 2, 0);
            cr_assert(offs[k] >= used && offs[k] <= used + 1);
            used = offs[k] + sizes[k];
        }
        bucket = mxs_nvfp4_bucket_elems(used, R);
        cr_assert(bucket >= used && bucket < used + 2 * R && bucket % (2 * R) == 0);
        for (k = 0; k < n; k++) {
            int64_t covered = 0;
            for (q = 0; q < R; q++) {
                cr_assert_eq(mxs_nvfp4_bucket_shard(offs[k], sizes[k], bucket, R, q, &s), MXS_OK);
                cr_assert_eq(mxs_nvfp4_shard_check(sizes[k], s.first, s.count), MXS_OK);
                if (s.count > 0) cr_assert_eq(s.first, covered); /* contiguous, in rank order */
                covered += s.count;
            }
            cr_assert_eq(covered, sizes[k]);
        }
    }
    cr_assert_eq(mxs_nvfp4_bucket_shard(1, 10, 16, 2, 0, &s), MXS_ERR_RANGE); /* odd offset */
    cr_assert_eq(mxs_nvfp4_bucket_shard(0, 10, 18, 4, 0, &s), MXS_ERR_RANGE); /* odd chunk */
    cr_assert_eq(mxs_nvfp4_bucket_shard(0, 10, 16, 2, 2, &s), MXS_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mxs_nvfp4_bucket_shard(0, 20, 16, 2, 0, &s), MXS_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mxs_nvfp4_bucket_shard(0, 10, 16, 2, 0, NULL), MXS_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mxs_nvfp4_bucket_elems(5, 0), -1);
    cr_assert_eq(mxs_nvfp4_bucket_elems(INT64_MAX - 1, 4), -1);
    cr_assert_eq(mxs_nvfp4_bucket_place(7), 8);
    cr_assert_eq(mxs_nvfp4_bucket_place(8), 8);
}
