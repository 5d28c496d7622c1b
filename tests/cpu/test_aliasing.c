/* SPDX-License-Identifier: MIT */
/* docs/contract.md section 6, the buffer rules: an output that overlaps an input or
 * another output is MXS_ERR_ALIASING, found before anything is written; the
 * writeback plan validates once and later phases re-check cheaply
 * (local_hash); the group status byte makes a rank-local failure fail every
 * rank instead of hanging one; geometry helpers never trap on bad input.
 *
 * Every rejected call runs on poisoned buffers, which are checked byte for
 * byte afterwards. Buffers that the library must never dereference (plan
 * checks only compare addresses) are still real memory: slices of arenas.
 *
 * This file: the issue reproductions for quantize, dequantize and the packed
 * buffer, the geometry helpers and the overlap rule itself. The writeback
 * batch in one arena (its overlaps, the local hash, the status byte) is tested
 * in test_aliasing_batch.c, batches of many items in test_aliasing_many.c.
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <mxshard/mxshard.h>

#include "common.h"
#include "snapshot.h"

/* ==== issue reproductions ================================================= */

/* 1: a 40x70 row-only PADDED primary whose row_scale overlaps the packed
 * buffer. partial and apply (and the group step) reject it; partial and
 * apply write nothing at all. */
Test(aliasing, row_scale_overlapping_packed_is_rejected) {
    const int64_t rows = 40, cols = 70, elems = 40 * 70;
    float *master = (float *)malloc((size_t)elems * sizeof(float));
    int64_t i;
    int mode;
    cr_assert_not_null(master);
    for (i = 0; i < elems; i++) master[i] = (float)(i % 91) - 45.25f;
    for (mode = 0; mode < 2; mode++) {
        uint8_t *arena = t_alloc(4096), *data = t_alloc((size_t)elems);
        mxs_wb_item it;
        mxs_wb_batch b;
        mxs_wb_plan plan;
        memset(&it, 0, sizeof it);
        memset(&b, 0, sizeof b);
        it.primary.rows = rows;
        it.primary.cols = cols;
        it.primary.dirs = MXS_ROWWISE;
        it.primary.scale_layout = MXS_SCALES_PADDED;
        it.primary.row_data = data;
        it.primary.row_scale = arena + 64; /* 512 bytes; packed is [arena, arena + 121) */
        it.master = master;
        it.start = 0;
        it.len = elems;
        b.items = &it;
        b.n_items = 1;
        b.mode = (mxs_wb_mode)mode;
        cr_assert_eq(mxs_wb_make_plan(&b, &plan, NULL), MXS_OK, "the batch alone is fine");
        cr_assert_eq(plan.packed_bytes, 40 * 3 + 1);
        cr_assert_eq(mxs_host_wb_partial(&b, &plan, arena), MXS_ERR_ALIASING);
        cr_assert_eq(mxs_host_wb_apply(&b, &plan, arena), MXS_ERR_ALIASING);
        cr_assert(t_all_poisoned(arena, 4096), "a rejected partial/apply wrote the packed buffer or the scales");
        cr_assert(t_all_poisoned(data, (size_t)elems), "a rejected partial/apply wrote the data plane");
        cr_assert_eq(mxs_wb_check_buffer(&b, arena, plan.packed_bytes), MXS_ERR_ALIASING);
        cr_assert_eq(mxs_wb_check_buffer(&b, arena, 64), MXS_OK, "touching is not overlapping");
        cr_assert_eq(mxs_wb_check_buffer(&b, arena + 64 + 512, 100), MXS_OK);
        cr_assert_eq(mxs_wb_check_buffer(&b, arena + 64 + 511, 100), MXS_ERR_ALIASING);
        /* the packed buffer elsewhere: fine */
        {
            uint8_t *packed = t_alloc((size_t)plan.packed_bytes);
            cr_assert_eq(mxs_host_wb_partial(&b, &plan, packed), MXS_OK);
            cr_assert_eq(mxs_host_wb_apply(&b, &plan, packed), MXS_OK);
            free(packed);
        }
        free(arena);
        free(data);
    }
    free(master);
}

/* 2: dequantize's dst over the scale plane it reads (dst = row_scale + 64). */
Test(aliasing, dequantize_dst_over_its_scales_is_rejected) {
    const int64_t elems = 40 * 70;
    int layout, plane;
    float src[40 * 70];
    int64_t i;
    for (i = 0; i < elems; i++) src[i] = (float)((i * 37) % 101) - 50.5f;
    for (layout = 0; layout < 3; layout++)
        for (plane = MXS_ROWWISE; plane <= MXS_COLWISE; plane++) {
            mxs_tensor t;
            uint8_t *arena = t_alloc(64 * 1024);
            int64_t sb;
            snap_t before;
            memset(&t, 0, sizeof t);
            t.rows = 40, t.cols = 70, t.dirs = MXS_BOTH, t.scale_layout = (mxs_scale_layout)layout;
            t.row_data = arena, t.col_data = arena + 4096;
            t.row_scale = arena + 8192, t.col_scale = arena + 12288;
            cr_assert_eq(mxs_host_quantize(&t, src, MXS_F32, MXS_ROUND_CEIL), MXS_OK);
            sb = mxs_scale_bytes(&t, (mxs_dirs)plane);
            before = snap(arena, 64 * 1024);
            {
                uint8_t *scale = plane == MXS_ROWWISE ? t.row_scale : t.col_scale;
                uint8_t *data = plane == MXS_ROWWISE ? t.row_data : t.col_data;
                cr_assert_eq(mxs_host_dequantize(&t, (mxs_dirs)plane, scale + 64, MXS_F32), MXS_ERR_ALIASING);
                cr_assert_eq(mxs_host_dequantize(&t, (mxs_dirs)plane, scale + sb - 1, MXS_BF16), MXS_ERR_ALIASING);
                cr_assert_eq(mxs_host_dequantize(&t, (mxs_dirs)plane, scale - 2 * elems + 1, MXS_F16), MXS_ERR_ALIASING,
                             "dst ending one byte inside the scales");
                cr_assert_eq(mxs_host_dequantize(&t, (mxs_dirs)plane, data + elems - 1, MXS_F32), MXS_ERR_ALIASING);
                cr_assert(snap_same(&before), "a rejected dequantize wrote something");
                /* touching the scale plane from below is fine (dst right before it) */
                cr_assert_eq(mxs_host_dequantize(&t, (mxs_dirs)plane, arena + 20480, MXS_F32), MXS_OK);
            }
            snap_free(&before);
            free(arena);
        }
}

/* 3: quantize with row_data = (uint8_t *)src + 256, and every other way an
 * output plane can overlap src or another output plane. */
Test(aliasing, quantize_outputs_overlapping_src_or_each_other_are_rejected) {
    const int64_t elems = 40 * 70;
    uint8_t *arena = t_alloc(256 * 1024);
    float *src = (float *)(void *)arena; /* 11200 bytes at the start of the arena */
    int64_t i;
    int layout, c;
    for (i = 0; i < elems; i++) src[i] = (float)(i % 53) * 0.25f - 6.0f;
    for (layout = 0; layout < 3; layout++) {
        mxs_tensor good;
        snap_t before;
        memset(&good, 0, sizeof good);
        good.rows = 40, good.cols = 70, good.dirs = MXS_BOTH, good.scale_layout = (mxs_scale_layout)layout;
        good.row_data = arena + 16384, good.col_data = arena + 32768;
        good.row_scale = arena + 49152, good.col_scale = arena + 65536;
        before = snap(arena, 256 * 1024);
        for (c = 0; c < 9; c++) {
            mxs_tensor t = good;
            const void *s = src;
            mxs_dtype dt = MXS_F32;
            switch (c) {
            case 0: t.row_data = arena + 256; break;                         /* the case */
            case 1: t.col_scale = arena + 11199; break;                      /* last byte of src */
            case 2: t.col_data = t.row_data; break;                          /* two data planes */
            case 3: t.row_scale = t.col_data + elems - 1; break;             /* scale in a data plane */
            case 4: t.col_scale = t.row_scale + 3; break;                    /* two scale planes */
            case 5: s = arena + 16384 - 2 * elems + 2, dt = MXS_BF16; break; /* bf16 src into row_data */
            case 6: t.dirs = MXS_ROWWISE, t.row_scale = t.row_data + 100; break;
            case 7: t.dirs = MXS_COLWISE, t.col_data = arena + 4; break;
            default: t.dirs = MXS_COLWISE, t.col_scale = t.col_data; break;
            }
            cr_assert_eq(mxs_host_quantize(&t, s, dt, MXS_ROUND_CEIL), MXS_ERR_ALIASING, "case %d layout %d", c,
                         layout);
            cr_assert_eq(mxs_quantize_check(&t, s, dt, MXS_ROUND_CEIL), MXS_ERR_ALIASING);
            cr_assert(snap_same(&before), "case %d: a rejected quantize wrote something", c);
        }
        /* absent planes are not looked at: a row-only tensor may keep column
         * pointers that overlap anything */
        {
            mxs_tensor t = good;
            t.dirs = MXS_ROWWISE;
            t.col_data = arena + 256, t.col_scale = t.row_scale;
            cr_assert_eq(mxs_quantize_check(&t, src, MXS_F32, MXS_ROUND_CEIL), MXS_OK);
        }
        /* planes packed back to back (touching, not overlapping) are fine */
        {
            mxs_tensor t = good;
            t.row_data = arena + 11200;
            t.row_scale = t.row_data + elems;
            t.col_data = t.row_scale + mxs_scale_bytes(&good, MXS_ROWWISE);
            t.col_scale = t.col_data + elems;
            cr_assert_eq(mxs_host_quantize(&t, src, MXS_F32, MXS_ROUND_CEIL), MXS_OK);
            cr_assert_eq(memcmp(arena, before.copy, 11200), 0, "src unchanged");
        }
        snap_free(&before);
    }
    free(arena);
}

/* ==== 5: geometry helpers on bad input: no trap, documented results ======== */

Test(aliasing, geometry_helpers_never_divide_by_zero_or_overflow) {
    mxs_range r;
    mxs_range iv[2];
    /* mxs_bucket_shard: nranks 0 or negative, rank outside [0, nranks), negative bucket */
    r = mxs_bucket_shard(0, 100, 400, 0, 0);
    cr_assert(r.first == 0 && r.count == 0);
    r = mxs_bucket_shard(0, 100, 400, -4, 1);
    cr_assert_eq(r.count, 0);
    r = mxs_bucket_shard(0, 100, 400, 4, 4);
    cr_assert_eq(r.count, 0);
    r = mxs_bucket_shard(0, 100, 400, 4, -1);
    cr_assert_eq(r.count, 0);
    r = mxs_bucket_shard(0, 100, -400, 4, 1);
    cr_assert_eq(r.count, 0);
    /* huge offsets: offset + elems would overflow */
    r = mxs_bucket_shard(INT64_MAX - 5, 100, INT64_MAX, 1, 0);
    cr_assert(r.first == 0 && r.count == 0);
    r = mxs_bucket_shard(INT64_MAX - 100, 100, INT64_MAX, 1, 0); /* ends exactly at INT64_MAX */
    cr_assert(r.first == 0 && r.count == 100);
    r = mxs_range_in_weight(0, INT64_MAX, INT64_MAX, 1);
    cr_assert_eq(r.count, 0);
    r = mxs_range_in_weight(0, INT64_MAX, -3, 10);
    cr_assert_eq(r.count, 0);
    r = mxs_range_in_weight(INT64_MAX - 10, INT64_MAX, INT64_MAX - 20, 20);
    cr_assert(r.first == 10 && r.count == 10);
    /* cols < 1 */
    cr_assert_eq(mxs_row_block_of(0, 5), -1);
    cr_assert_eq(mxs_row_block_of(-3, 5), -1);
    cr_assert_eq(mxs_row_block_of(70, -1), -1);
    cr_assert_eq(mxs_row_block_of(70, 75), 3);
    r = mxs_row_block_span(0, 3);
    cr_assert_eq(r.count, 0);
    r = mxs_row_block_span(70, -2);
    cr_assert_eq(r.count, 0);
    r = mxs_shard_row_blocks(0, 0, 10);
    cr_assert_eq(r.count, 0);
    r = mxs_shard_groups(0, 0, 10);
    cr_assert_eq(r.count, 0);
    cr_assert_eq(mxs_shard_col_intervals(10, 0, 0, 10, 0, iv), 0);
    cr_assert_eq(mxs_ceil_div(7, 0), 0);
    cr_assert_eq(mxs_round_up(7, 0), 0);
    cr_assert_eq(mxs_ceil_div(7, 2), 4);
}

/* ==== the overlap rule itself ============================================== */

Test(aliasing, overlap_rule_is_exact_and_overflow_free) {
    uint8_t buf[64];
    const void *top = (const void *)(uintptr_t)(UINTPTR_MAX - 15);
    cr_assert(mxs__overlap(buf, 10, buf + 9, 1));
    cr_assert(!mxs__overlap(buf, 10, buf + 10, 1), "touching");
    cr_assert(!mxs__overlap(buf + 10, 5, buf, 10), "touching, other order");
    cr_assert(mxs__overlap(buf + 3, 1, buf, 64), "inside");
    cr_assert(!mxs__overlap(NULL, 10, buf, 10));
    cr_assert(!mxs__overlap(buf, 0, buf, 10), "empty");
    cr_assert(!mxs__overlap(buf, -5, buf, 10), "negative length is empty");
    cr_assert(mxs__overlap(buf, INT64_MAX, buf + 63, INT64_MAX), "huge lengths do not wrap");
    cr_assert(mxs__overlap(top, 16, top, INT64_MAX), "near the top of the address space");
    cr_assert(!mxs__overlap(buf, 16, top, INT64_MAX));
}
