/* SPDX-License-Identifier: MIT */
/* Suite cpu / writeback: the writeback API one rank at a time (docs/contract.md section 4
 * steps 1, 2 and 4, and section 6 for bad input). The whole-group invariant
 * runs in test_sim.c. Outputs are poisoned (0xA5, sometimes 0x5A) before
 * every call and followed by guard bytes; comparisons are byte for byte.
 *
 * This file: plan, partial and apply, each on its own, and bad input. The
 * fixture lives in writeback_fixture.h; the one-call entry point and repeated
 * updates are tested in test_writeback_updates.c.
 */
#include <criterion/criterion.h>
#include <stdio.h>

#include <mxshard/mxshard.h>

#include "sim.h"
#include "cpu/ref_blocks.h"
#include "writeback_fixture.h"

/* ---- independent reference pieces ------------------------------------------------ */

/* This rank's partial exponents, compact layout, computed directly from
 * docs/contract.md section 3: e8m0 of the amax over the block's elements inside the
 * shard, 0x00 when the shard misses the block. */
static void expected_partial(const mxs_wb_item *it, const float *full, mxs_rounding rnd, mxs_dirs plane, uint8_t *out) {
    const int64_t rows = it->primary.rows, cols = it->primary.cols;
    const int64_t kr = (cols + 31) / 32, kc = (rows + 31) / 32;
    int64_t nblk = plane == MXS_ROWWISE ? rows * kr : kc * cols, b, f;
    float *amax = (float *)calloc((size_t)nblk, sizeof(float));
    char *hit = (char *)calloc((size_t)nblk, 1);
    for (f = it->start; f < it->start + it->len; f++) {
        int64_t r = f / cols, c = f % cols;
        b = plane == MXS_ROWWISE ? r * kr + c / 32 : (r / 32) * cols + c;
        amax[b] = mxs_amax_step(amax[b], full[f]);
        hit[b] = 1;
    }
    for (b = 0; b < nblk; b++) out[b] = hit[b] ? mxs_e8m0_from_amax(amax[b], rnd) : 0x00;
    free(amax);
    free(hit);
}

/* ---- plan ------------------------------------------------------------------------- */

/* docs/contract.md section 4 step 1: compact row-wise scales of every item with a row
 * plane, in batch order, then the compact column-wise scales, then the one
 * status byte. */
Test(writeback, plan_packed_layout_is_rows_in_batch_order_then_columns) {
    mxs_sim_rng rng = {42};
    int iter;
    /* every plane gets its own bytes (planes of a batch must not overlap);
     * the plan only compares the pointers */
    const size_t plane_max = 300 * 300, arena_bytes = 9 * 4 * plane_max;
    uint8_t *arena = (uint8_t *)malloc(arena_bytes);
    cr_assert(arena != NULL);
    for (iter = 0; iter < 300; iter++) {
        mxs_wb_item items[9];
        mxs_wb_slot slots[9];
        mxs_wb_batch b;
        mxs_wb_plan plan = {0};
        int n = (int)mxs_sim_range_i(&rng, 0, 9), k;
        int64_t ro = 0, co = 0, colbytes = 0;
        memset(items, 0, sizeof items);
        memset(&b, 0, sizeof b);
        for (k = 0; k < n; k++) {
            mxs_tensor *t = &items[k].primary;
            uint8_t *mine = arena + (size_t)k * 4 * plane_max;
            t->rows = mxs_sim_range_i(&rng, 1, 300);
            t->cols = mxs_sim_range_i(&rng, 1, 300);
            t->dirs = (unsigned)mxs_sim_range_i(&rng, 1, 3);
            t->scale_layout = (mxs_scale_layout)mxs_sim_range_i(&rng, 0, 2);
            t->row_data = (t->dirs & 1u) ? mine : NULL;
            t->row_scale = (t->dirs & 1u) ? mine + plane_max : NULL;
            t->col_data = (t->dirs & 2u) ? mine + 2 * plane_max : NULL;
            t->col_scale = (t->dirs & 2u) ? mine + 3 * plane_max : NULL;
            if (t->dirs & 1u) ro += t->rows * ((t->cols + 31) / 32);
            if (t->dirs & 2u) colbytes += ((t->rows + 31) / 32) * t->cols;
        }
        b.items = items;
        b.n_items = n;
        cr_assert_eq(mxs_wb_make_plan(&b, &plan, slots), MXS_OK);
        cr_assert_eq(plan.n_items, n);
        cr_assert_eq(plan.row_region_bytes, ro);
        cr_assert_eq(plan.packed_bytes, ro + colbytes + 1);
        cr_assert_eq(plan.status_offset, ro + colbytes);
        co = ro;
        ro = 0;
        for (k = 0; k < n; k++) {
            const mxs_tensor *t = &items[k].primary;
            if (t->dirs & 1u) {
                cr_assert_eq(slots[k].row_offset, ro, "item %d row slot", k);
                ro += t->rows * ((t->cols + 31) / 32);
            } else {
                cr_assert_eq(slots[k].row_offset, -1);
            }
            if (t->dirs & 2u) {
                cr_assert_eq(slots[k].col_offset, co, "item %d col slot", k);
                co += ((t->rows + 31) / 32) * t->cols;
            } else {
                cr_assert_eq(slots[k].col_offset, -1);
            }
        }
    }
    free(arena);
}

/* docs/contract.md section 4.2: a plane's region is its COMPACT exponents -
 * block (b, j) of block row b (one row, or one 32-row group) is entry
 * b*row_step + j*col_step: row block (r, k) at r*ceil(cols/32) + k, column
 * block (g, c) at g*cols + c - and holds block_rows * per_row entries, the
 * bytes the plan gives the plane; mxs_wb_region_block maps each entry back
 * to its block. Random shapes: 1-element dimensions, block multiples and
 * the sizes beside them. */
Test(writeback, region_entry_of_a_block_is_its_compact_exponent_offset) {
    static const int64_t dims[] = {1, 2, 31, 32, 33, 63, 64, 65, 95, 96, 97};
    mxs_sim_rng rng = {34};
    int iter, p;
    for (iter = 0; iter < 400; iter++) {
        const int64_t rows = iter & 1 ? dims[mxs_sim_range_i(&rng, 0, 10)] : mxs_sim_range_i(&rng, 1, 300);
        const int64_t cols = iter & 2 ? dims[mxs_sim_range_i(&rng, 0, 10)] : mxs_sim_range_i(&rng, 1, 300);
        const int64_t kr = (cols + 31) / 32, kc = (rows + 31) / 32;
        for (p = MXS_ROWWISE; p <= MXS_COLWISE; p++) {
            const int row = p == MXS_ROWWISE;
            mxs_wb_region g = {0, 0, 0, 0, 0};
            int64_t b, j;
            cr_assert_eq(mxs_wb_region_make(rows, cols, (mxs_dirs)p, &g), MXS_OK);
            cr_assert_eq(g.height, row ? 1 : 32);
            cr_assert_eq(g.block_rows, row ? rows : kc, "%ldx%ld plane %d", (long)rows, (long)cols, p);
            cr_assert_eq(g.per_row, row ? kr : cols);
            cr_assert_eq(g.block_rows * g.per_row, row ? rows * kr : kc * cols, "the plane's compact bytes");
            for (b = 0; b < g.block_rows; b++)
                for (j = 0; j < g.per_row; j++) {
                    const int64_t e = mxs_wb_region_entry(&g, b, j);
                    int64_t bb = -1, jj = -1;
                    mxs_wb_region_block(&g, e, &bb, &jj); /* the inverse */
                    if (e != (row ? b * kr + j : b * cols + j) || bb != b || jj != j)
                        cr_assert_fail("%ldx%ld plane %d: block (%ld, %ld) at entry %ld, which maps back to (%ld, %ld)",
                                       (long)rows, (long)cols, p, (long)b, (long)j, (long)e, (long)bb, (long)jj);
                }
        }
    }
}

/* A region of no shape is an error, and *out is left alone. */
Test(writeback, region_of_a_bad_shape_or_plane_is_an_error) {
    mxs_wb_region g = {0, 0, 0, 0, 0}, before = {0, 0, 0, 0, 0};
    memset(&g, 0x5A, sizeof g);
    before = g;
    cr_assert_eq(mxs_wb_region_make(4, 4, MXS_ROWWISE, NULL), MXS_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mxs_wb_region_make(4, 4, MXS_BOTH, &g), MXS_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mxs_wb_region_make(4, 4, (mxs_dirs)0, &g), MXS_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mxs_wb_region_make(0, 4, MXS_ROWWISE, &g), MXS_ERR_SHAPE);
    cr_assert_eq(mxs_wb_region_make(4, -1, MXS_COLWISE, &g), MXS_ERR_SHAPE);
    cr_assert_eq(mxs_wb_region_make(INT64_MAX / 2, 3, MXS_ROWWISE, &g), MXS_ERR_OVERFLOW);
    cr_assert_eq(mxs_wb_region_make(3, INT64_MAX / 2, MXS_COLWISE, &g), MXS_ERR_OVERFLOW);
    cr_assert_eq(memcmp(&g, &before, sizeof g), 0);
    /* 64-bit: a 2^40-element weight's last column block */
    cr_assert_eq(mxs_wb_region_make((int64_t)1 << 20, (int64_t)1 << 20, MXS_COLWISE, &g), MXS_OK);
    cr_assert_eq(mxs_wb_region_entry(&g, g.block_rows - 1, g.per_row - 1), ((int64_t)1 << 35) - 1);
}

/* Every rank computes the same plan from shapes and flags alone; a different
 * batch (shape, flags, count, rounding, round-through) changes the
 * fingerprint. */
Test(writeback, plan_depends_only_on_shapes_flags_and_options) {
    static const item_spec a[] = {
        {45, 70, MXS_BOTH, 100, 1900, 0}, {33, 40, MXS_ROWWISE, 5, 995, 0}, {64, 33, MXS_COLWISE, 30, 1970, 1}};
    static const item_spec other_shards[] = {
        {45, 70, MXS_BOTH, 0, 0, 2}, {33, 40, MXS_ROWWISE, 0, 1320, 1}, {64, 33, MXS_COLWISE, 2000, 112, 0}};
    fixture f1, f2;
    mxs_wb_plan p1 = {0}, p2 = {0};
    mxs_wb_item saved;
    fixture_init(&f1, a, 3, MXS_SCALES_COMPACT, MXS_ROUND_CEIL, MXS_WB_FUSED, POISON_A, 1);
    fixture_init(&f2, other_shards, 3, MXS_SCALES_SWIZZLED, MXS_ROUND_CEIL, MXS_WB_STRICT, POISON_A, 2);
    cr_assert_eq(mxs_wb_make_plan(&f1.batch, &p1, NULL), MXS_OK);
    cr_assert_eq(mxs_wb_make_plan(&f2.batch, &p2, NULL), MXS_OK);
    cr_assert_eq(p1.fingerprint, p2.fingerprint, "shards, masters, layouts, mode and pointers are rank-local");
    cr_assert_eq(p1.packed_bytes, p2.packed_bytes);

#define CHANGED(stmt, undo)                                                                                            \
    do {                                                                                                               \
        stmt;                                                                                                          \
        cr_assert_eq(mxs_wb_make_plan(&f2.batch, &p2, NULL), MXS_OK, "%s", #stmt);                                     \
        cr_assert_neq(p1.fingerprint, p2.fingerprint, "fingerprint must change: %s", #stmt);                           \
        undo;                                                                                                          \
    } while (0)
    saved = f2.items[0];
    CHANGED(f2.items[0].primary.rows = 46, f2.items[0] = saved);
    CHANGED(f2.items[0].primary.cols = 71, f2.items[0] = saved);
    CHANGED((f2.items[0].primary.rows = 70, f2.items[0].primary.cols = 45), f2.items[0] = saved);
    CHANGED((f2.items[0].primary.dirs = MXS_ROWWISE, f2.items[0].col_fragment = NULL), f2.items[0] = saved);
    CHANGED(f2.batch.n_items = 2, f2.batch.n_items = 3);
    CHANGED(f2.batch.rounding = MXS_ROUND_FLOOR, f2.batch.rounding = MXS_ROUND_CEIL);
    CHANGED(f2.batch.round_through = MXS_BF16, f2.batch.round_through = MXS_F32);
    CHANGED(f2.batch.round_through = MXS_F16, f2.batch.round_through = MXS_F32);
#undef CHANGED
    cr_assert_eq(mxs_wb_make_plan(&f2.batch, &p2, NULL), MXS_OK);
    cr_assert_eq(p1.fingerprint, p2.fingerprint);
    fixture_free(&f1);
    fixture_free(&f2);
}

/* ---- partial ------------------------------------------------------------------------ */

static const item_spec partial_specs[][3] = {
    {{45, 70, MXS_BOTH, 100, 1900, 0}, {33, 40, MXS_ROWWISE, 5, 995, 0}, {64, 33, MXS_COLWISE, 30, 1970, 0}},
    {{97, 65, MXS_BOTH, 31, 3000, 1}, {1, 300, MXS_ROWWISE, 33, 200, 2}, {70, 1, MXS_BOTH, 3, 60, 2}},
    {{32, 32, MXS_BOTH, 0, 1024, 0}, {40, 40, MXS_COLWISE, 0, 0, 0}, {129, 3, MXS_BOTH, 96, 290, 1}},
};

/* Checks the data bytes of item k, plane p after partial: STRICT writes none;
 * FUSED writes exactly the elements of blocks wholly inside the shard, with
 * their final bytes; the primary plane outside the slice is never touched. */
static int64_t partial_data_violations(const fixture *fx, int k, int p, const item_spec *sp) {
    const int64_t rows = sp->rows, cols = sp->cols, end = sp->start + sp->len;
    const uint8_t *ref = p ? fx->ref[k].col_data : fx->ref[k].row_data;
    const uint8_t *prim = fx->data[k][p].p;
    int64_t f, bad = 0;
    for (f = 0; f < rows * cols; f++)
        if ((sp->fragment || f < sp->start || f >= end) && prim[f] != fx->poison) bad++;
    for (f = sp->start; f < end; f++) {
        uint8_t got = sp->fragment ? fx->frag[k][p].p[f - sp->start] : prim[f];
        int written = fx->batch.mode == MXS_WB_FUSED && (p ? ref_col_block_inside(rows, cols, f, sp->start, end)
                                                           : ref_row_block_inside(cols, f, sp->start, end));
        if (written ? got != ref[f] : got != fx->poison) bad++;
    }
    return bad;
}

static void check_partial(mxs_wb_mode mode) {
    int set, k, p, pz, rnd;
    for (set = 0; set < 3; set++)
        for (pz = 0; pz < 2; pz++)
            for (rnd = 0; rnd < 2; rnd++) {
                fixture fx;
                mxs_wb_plan plan = {0};
                mxs_wb_slot slots[3];
                uint8_t *expect;
                int64_t fused_written = 0;
                fixture_init(&fx, partial_specs[set], 3, (mxs_scale_layout)(set % 3), (mxs_rounding)rnd, mode,
                             pz ? POISON_B : POISON_A, 10u + (uint64_t)set);
                cr_assert_eq(mxs_wb_make_plan(&fx.batch, &plan, slots), MXS_OK);
                fixture_alloc_packed(&fx, plan.packed_bytes);
                cr_assert_eq(mxs_host_wb_partial(&fx.batch, &plan, fx.packed.p), MXS_OK);
                expect = (uint8_t *)malloc((size_t)plan.packed_bytes + 1);
                for (k = 0; k < 3; k++) {
                    if (slots[k].row_offset >= 0)
                        expected_partial(&fx.items[k], fx.full[k], (mxs_rounding)rnd, MXS_ROWWISE,
                                         expect + slots[k].row_offset);
                    if (slots[k].col_offset >= 0)
                        expected_partial(&fx.items[k], fx.full[k], (mxs_rounding)rnd, MXS_COLWISE,
                                         expect + slots[k].col_offset);
                }
                expect[plan.status_offset] = 0; /* partial: this rank is fine */
                cr_assert_eq(memcmp(expect, fx.packed.p, (size_t)plan.packed_bytes), 0, "partial exponents (set %d)",
                             set);
                free(expect);
                for (k = 0; k < 3; k++)
                    for (p = 0; p < 2; p++) {
                        if (!fx.data[k][p].p) continue;
                        cr_assert_eq(partial_data_violations(&fx, k, p, &partial_specs[set][k]), 0,
                                     "mode %d set %d item %d plane %d", mode, set, k, p);
                        cr_assert_eq(buf_count_not(&fx.scale[k][p], fx.poison), 0, "partial wrote a scale plane");
                        if (fx.frag[k][p].p) fused_written += buf_count_not(&fx.frag[k][p], fx.poison);
                    }
                cr_assert_eq(fixture_guards(&fx), 0);
                if (mode == MXS_WB_STRICT) cr_assert_eq(fused_written, 0);
                fixture_free(&fx);
            }
}

Test(writeback, strict_partial_writes_no_data_byte) { check_partial(MXS_WB_STRICT); }
Test(writeback, fused_partial_writes_only_blocks_wholly_inside_the_shard) { check_partial(MXS_WB_FUSED); }

/* ---- apply ------------------------------------------------------------------------- */

/* Apply with the group's reduced exponents (here: the whole-tensor compact
 * scales, which is what the MAX over a covering set of shards yields)
 * writes every scale byte in the primary's layout and the shard's slice,
 * nothing else; the result equals whole-tensor quantize on the slice. */
Test(writeback, apply_writes_all_scales_and_only_the_shard_slice) {
    int set, mode, rnd, k, p;
    for (set = 0; set < 3; set++)
        for (mode = 0; mode < 2; mode++)
            for (rnd = 0; rnd < 2; rnd++) {
                fixture fx;
                mxs_wb_plan plan = {0};
                mxs_wb_slot slots[3];
                mxs_scale_layout lay = (mxs_scale_layout)((set + mode) % 3);
                fixture_init(&fx, partial_specs[set], 3, lay, (mxs_rounding)rnd, (mxs_wb_mode)mode, POISON_A,
                             20u + (uint64_t)set);
                cr_assert_eq(mxs_wb_make_plan(&fx.batch, &plan, slots), MXS_OK);
                fixture_alloc_packed(&fx, plan.packed_bytes);
                cr_assert_eq(mxs_host_wb_partial(&fx.batch, &plan, fx.packed.p), MXS_OK);
                /* the "reduction": the global exponents */
                for (k = 0; k < 3; k++) {
                    mxs_tensor whole = fx.ref[k];
                    whole.scale_layout = MXS_SCALES_COMPACT;
                    if (slots[k].row_offset >= 0) whole.row_scale = fx.packed.p + slots[k].row_offset;
                    if (slots[k].col_offset >= 0) whole.col_scale = fx.packed.p + slots[k].col_offset;
                    whole.row_data = whole.row_data ? (uint8_t *)malloc((size_t)(whole.rows * whole.cols)) : NULL;
                    whole.col_data = whole.col_data ? (uint8_t *)malloc((size_t)(whole.rows * whole.cols)) : NULL;
                    cr_assert_eq(mxs_host_quantize(&whole, fx.full[k], MXS_F32, (mxs_rounding)rnd), MXS_OK);
                    free(whole.row_data);
                    free(whole.col_data);
                }
                cr_assert_eq(mxs_host_wb_apply(&fx.batch, &plan, fx.packed.p), MXS_OK);
                for (k = 0; k < 3; k++) {
                    const item_spec *sp = &partial_specs[set][k];
                    int64_t elems = sp->rows * sp->cols, f;
                    for (p = 0; p < 2; p++) {
                        const uint8_t *ref_d, *ref_s;
                        if (!fx.data[k][p].p) continue;
                        ref_d = p ? fx.ref[k].col_data : fx.ref[k].row_data;
                        ref_s = p ? fx.ref[k].col_scale : fx.ref[k].row_scale;
                        cr_assert_eq(memcmp(fx.scale[k][p].p, ref_s, (size_t)fx.scale[k][p].n), 0,
                                     "scales of item %d plane %d", k, p);
                        for (f = 0; f < elems; f++) {
                            int in = f >= sp->start && f < sp->start + sp->len;
                            uint8_t got = fx.data[k][p].p[f];
                            if (in && !sp->fragment)
                                cr_assert_eq(got, ref_d[f], "item %d plane %d elem %lld", k, p, (long long)f);
                            else
                                cr_assert_eq(got, POISON_A, "outside the slice: item %d plane %d elem %lld", k, p,
                                             (long long)f);
                        }
                        if (sp->fragment)
                            cr_assert_eq(memcmp(fx.frag[k][p].p, ref_d + sp->start, (size_t)sp->len), 0,
                                         "fragment of item %d plane %d", k, p);
                    }
                }
                cr_assert_eq(fixture_guards(&fx), 0);
                fixture_free(&fx);
            }
}

/* ---- errors: caught before any write ---------------------------------------------------- */

enum { FX_ROW = 0, FX_BOTH = 1, FX_COL = 2 };

static const item_spec err_specs[] = {
    {33, 40, MXS_ROWWISE, 5, 995, 0}, {45, 70, MXS_BOTH, 100, 1900, 0}, {64, 33, MXS_COLWISE, 30, 1970, 1}};

/* Applies one corruption to the fixture's batch (the second item where it
 * is about an item, so a non-validating implementation would already have
 * written the first). */
typedef void (*corrupt_fn)(fixture *fx);

static void c_dtype(fixture *fx) { fx->items[1].master_dtype = (mxs_dtype)7; }
static void c_dtype_neg(fixture *fx) { fx->items[1].master_dtype = (mxs_dtype)-1; }
static void c_range_end(fixture *fx) { fx->items[1].len = 45 * 70 - 100 + 1; }
static void c_start_neg(fixture *fx) { fx->items[1].start = -1; }
static void c_start_past(fixture *fx) {
    fx->items[1].start = 45 * 70 + 1;
    fx->items[1].len = 0;
}
static void c_len_neg(fixture *fx) { fx->items[1].len = -5; }
static void c_overflow(fixture *fx) {
    fx->items[1].start = INT64_MAX - 3;
    fx->items[1].len = 10;
}
static void c_null_master(fixture *fx) { fx->items[1].master = NULL; }
static void c_frag_absent(fixture *fx) { fx->items[0].col_fragment = fx->data[1][1].p; }
static void c_frag_absent_row(fixture *fx) { fx->items[2].row_fragment = fx->data[1][0].p; }
static void c_null_row_scale(fixture *fx) { fx->items[1].primary.row_scale = NULL; }
static void c_null_col_scale(fixture *fx) { fx->items[2].primary.col_scale = NULL; }
static void c_null_data(fixture *fx) { fx->items[1].primary.col_data = NULL; }
static void c_null_data_row(fixture *fx) { fx->items[0].primary.row_data = NULL; }
static void c_rows0(fixture *fx) { fx->items[1].primary.rows = 0; }
static void c_cols_neg(fixture *fx) { fx->items[1].primary.cols = -3; }
static void c_dirs0(fixture *fx) { fx->items[1].primary.dirs = 0; }
static void c_dirs4(fixture *fx) { fx->items[1].primary.dirs = 4; }
static void c_layout(fixture *fx) { fx->items[1].primary.scale_layout = (mxs_scale_layout)3; }
static void c_shape_overflow(fixture *fx) {
    fx->items[1].primary.rows = INT64_MAX / 2;
    fx->items[1].primary.cols = 4;
}
static void c_rounding(fixture *fx) { fx->batch.rounding = (mxs_rounding)2; }
static void c_mode(fixture *fx) { fx->batch.mode = (mxs_wb_mode)2; }
static void c_rt(fixture *fx) { fx->batch.round_through = (mxs_dtype)3; }
static void c_n_neg(fixture *fx) { fx->batch.n_items = -1; }
static void c_items_null(fixture *fx) { fx->batch.items = NULL; }

typedef struct {
    const char *name;
    corrupt_fn fn;
    mxs_status want;
} corruption;

static const corruption corruptions[] = {
    {"bad master dtype", c_dtype, MXS_ERR_INVALID_ARGUMENT},
    {"negative master dtype", c_dtype_neg, MXS_ERR_INVALID_ARGUMENT},
    {"range past the end", c_range_end, MXS_ERR_RANGE},
    {"start < 0", c_start_neg, MXS_ERR_RANGE},
    {"start past the end, len 0", c_start_past, MXS_ERR_RANGE},
    {"len < 0", c_len_neg, MXS_ERR_RANGE},
    {"start + len overflows", c_overflow, MXS_ERR_RANGE},
    {"NULL master with len > 0", c_null_master, MXS_ERR_INVALID_ARGUMENT},
    {"column fragment for a row-only primary", c_frag_absent, MXS_ERR_ABSENT_PLANE},
    {"row fragment for a column-only primary", c_frag_absent_row, MXS_ERR_ABSENT_PLANE},
    {"flagged row plane with NULL scale", c_null_row_scale, MXS_ERR_ABSENT_PLANE},
    {"flagged column plane with NULL scale (fragment given)", c_null_col_scale, MXS_ERR_ABSENT_PLANE},
    {"NULL column data without a fragment", c_null_data, MXS_ERR_ABSENT_PLANE},
    {"NULL row data without a fragment", c_null_data_row, MXS_ERR_ABSENT_PLANE},
    {"rows = 0", c_rows0, MXS_ERR_SHAPE},
    {"cols < 0", c_cols_neg, MXS_ERR_SHAPE},
    {"dirs = 0", c_dirs0, MXS_ERR_INVALID_ARGUMENT},
    {"dirs = 4", c_dirs4, MXS_ERR_INVALID_ARGUMENT},
    {"bad scale layout", c_layout, MXS_ERR_INVALID_ARGUMENT},
    {"rows*cols overflows", c_shape_overflow, MXS_ERR_OVERFLOW},
    {"bad rounding", c_rounding, MXS_ERR_INVALID_ARGUMENT},
    {"bad mode", c_mode, MXS_ERR_INVALID_ARGUMENT},
    {"bad round-through", c_rt, MXS_ERR_INVALID_ARGUMENT},
    {"n_items < 0", c_n_neg, MXS_ERR_INVALID_ARGUMENT},
    {"NULL items with n_items > 0", c_items_null, MXS_ERR_INVALID_ARGUMENT},
};

/* Every corruption is reported by plan, partial and apply with its code,
 * and not one output byte (packed buffer, data, scales, fragments, the plan
 * struct) changes. */
Test(writeback, bad_input_is_caught_before_any_write) {
    size_t c;
    int mode;
    for (mode = 0; mode < 2; mode++)
        for (c = 0; c < sizeof corruptions / sizeof corruptions[0]; c++) {
            fixture fx;
            mxs_wb_plan good = {0}, out;
            mxs_status s;
            fixture_init(&fx, err_specs, 3, MXS_SCALES_PADDED, MXS_ROUND_CEIL, (mxs_wb_mode)mode, POISON_A, 61);
            cr_assert_eq(mxs_wb_make_plan(&fx.batch, &good, NULL), MXS_OK);
            fixture_alloc_packed(&fx, good.packed_bytes);
            corruptions[c].fn(&fx);
            memset(&out, POISON_A, sizeof out);
            s = mxs_wb_make_plan(&fx.batch, &out, NULL);
            cr_assert_eq(s, corruptions[c].want, "plan, %s: got %s", corruptions[c].name, mxs_status_str(s));
            {
                mxs_wb_plan poisoned;
                memset(&poisoned, POISON_A, sizeof poisoned);
                cr_assert_eq(memcmp(&out, &poisoned, sizeof out), 0, "plan written on error: %s", corruptions[c].name);
            }
            s = mxs_host_wb_partial(&fx.batch, &good, fx.packed.p);
            cr_assert_eq(s, corruptions[c].want, "partial, %s: got %s", corruptions[c].name, mxs_status_str(s));
            s = mxs_host_wb_apply(&fx.batch, &good, fx.packed.p);
            cr_assert_eq(s, corruptions[c].want, "apply, %s: got %s", corruptions[c].name, mxs_status_str(s));
            cr_assert_eq(fixture_touched(&fx), 0, "bytes written despite: %s", corruptions[c].name);
            fixture_free(&fx);
        }
}

/* NULL batch, plan or packed buffer. */
Test(writeback, null_arguments_are_rejected_before_any_write) {
    fixture fx;
    mxs_wb_plan plan = {0};
    fixture_init(&fx, err_specs, 3, MXS_SCALES_COMPACT, MXS_ROUND_CEIL, MXS_WB_FUSED, POISON_A, 62);
    cr_assert_eq(mxs_wb_make_plan(&fx.batch, &plan, NULL), MXS_OK);
    fixture_alloc_packed(&fx, plan.packed_bytes);
    cr_assert_eq(mxs_wb_make_plan(NULL, &plan, NULL), MXS_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mxs_wb_make_plan(&fx.batch, NULL, NULL), MXS_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mxs_host_wb_partial(NULL, &plan, fx.packed.p), MXS_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mxs_host_wb_partial(&fx.batch, NULL, fx.packed.p), MXS_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mxs_host_wb_partial(&fx.batch, &plan, NULL), MXS_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mxs_host_wb_apply(NULL, &plan, fx.packed.p), MXS_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mxs_host_wb_apply(&fx.batch, NULL, fx.packed.p), MXS_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mxs_host_wb_apply(&fx.batch, &plan, NULL), MXS_ERR_INVALID_ARGUMENT);
    cr_assert_eq(fixture_touched(&fx), 0);
    fixture_free(&fx);
}

/* A batch changed after planning (or a plan edited) no longer matches its
 * plan: partial and apply refuse with MXS_ERR_PLAN_MISMATCH, writing nothing. */
Test(writeback, batch_changed_after_planning_is_a_plan_mismatch) {
    int c;
    for (c = 0; c < 9; c++) {
        fixture fx;
        mxs_wb_plan plan = {0};
        fixture_init(&fx, err_specs, 3, MXS_SCALES_SWIZZLED, MXS_ROUND_CEIL, MXS_WB_FUSED, POISON_A, 63);
        cr_assert_eq(mxs_wb_make_plan(&fx.batch, &plan, NULL), MXS_OK);
        fixture_alloc_packed(&fx, plan.packed_bytes);
        switch (c) {
        case 0: fx.items[1].primary.rows = 44; break;
        case 1: fx.items[1].primary.dirs = MXS_ROWWISE; break;
        case 2: fx.items[0].primary.cols = 41; break;
        case 3: fx.batch.n_items = 2; break;
        case 4: fx.batch.rounding = MXS_ROUND_FLOOR; break;
        case 5: fx.batch.round_through = MXS_BF16; break;
        case 6: plan.fingerprint ^= 1u; break;
        case 7: plan.packed_bytes += 1; break;
        default: plan.row_region_bytes -= 1; break;
        }
        cr_assert_eq(mxs_host_wb_partial(&fx.batch, &plan, fx.packed.p), MXS_ERR_PLAN_MISMATCH, "case %d", c);
        cr_assert_eq(mxs_host_wb_apply(&fx.batch, &plan, fx.packed.p), MXS_ERR_PLAN_MISMATCH, "case %d", c);
        cr_assert_eq(fixture_touched(&fx), 0, "case %d", c);
        fixture_free(&fx);
    }
}
