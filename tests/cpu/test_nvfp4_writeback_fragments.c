/* SPDX-License-Identifier: MIT */
/* docs/contract.md section 9.8: the NVFP4 writeback with fragments (FSDP).
 * On the R simulated ranks of nvfp4_writeback_group.h, a second batch per
 * rank over the same masters and shards puts, per plane at random, the
 * row-wise values or the column stage into a guarded fragment: partial equals
 * the in-place partial, apply fills the fragments with the in-place apply's
 * bytes, and the gathered fragments (then mxs_host_nvfp4_stage_to_col) give
 * the whole-tensor quantize's planes, on two updates. On one rank:
 * mxs_host_nvfp4_stage_to_col's checks, and empty shards with fragments. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mxshard/mxshard.h>
#include <mxshard/nvfp4_writeback.h>

#include "common.h"
#include "nvfp4_writeback_fixture.h"
#include "nvfp4_writeback_group.h"

/* ---- fragments (FSDP) ------------------------------------------------------------ */

/* A fragment with T_GUARD poisoned bytes before and after it. */
static uint8_t *frag_alloc(int64_t n) {
    uint8_t *p = t_alloc((size_t)(n + T_GUARD));
    cr_assert_not_null(p);
    return p + T_GUARD;
}

static void frag_free(uint8_t *f) {
    if (f) free(f - T_GUARD);
}

static int frag_guards_ok(const uint8_t *f, int64_t n) {
    return t_all_poisoned(f - T_GUARD, 0) && t_guard_ok(f, (size_t)n);
}

/* One rank's second batch over the same masters and shards: fresh poisoned
 * outputs, and per plane at random a fragment (the replaced pointer then
 * NULL or kept: the fragment wins) or the in-place plane. */
typedef struct fside {
    mxs_nvfp4_wb_item items[MAXW];
    mxs_nvfp4_wb_batch batch;
    mxs_nvfp4_wb_plan plan;
    uint8_t *frag[MAXW][2]; /* row, stage; NULL: none */
    uint8_t *data[MAXW][2], *scale[MAXW][2], *stage[MAXW], *amax[MAXW];
} fside;

/* The spec's rule, written out: the column-wise values go to a fragment. */
static int col_to_fragment(const mxs_nvfp4_wb_item *it) {
    return it->stage_fragment != NULL || (it->col_stage == NULL && it->row_fragment != NULL);
}

static void fside_make(fside *f, const group *g, int q, t_rng *rng) {
    int w, p;
    memset(f, 0, sizeof *f);
    for (w = 0; w < g->nw; w++) {
        const wspec *s = &g->w[w];
        const mxs_range sh = g->rb[q][w].shard;
        const int64_t fb = mxs_nvfp4_fragment_bytes(sh.first, sh.count);
        mxs_nvfp4_wb_item *it = &f->items[w];
        cr_assert_eq(fb, sh.count > 0 ? (sh.first + sh.count + 1) / 2 - sh.first / 2 : 0);
        for (p = 0; p < 2; p++) {
            f->data[w][p] = t_alloc((size_t)g->dbytes[w]);
            f->scale[w][p] = t_alloc((size_t)g->sbytes[w][p]);
        }
        f->stage[w] = t_alloc((size_t)g->dbytes[w]);
        f->amax[w] = t_alloc(4);
        *it = g->items[q][w]; /* master, dtype, shard */
        set_primary(&it->primary, s, f->data[w], f->scale[w], f->amax[w]);
        it->col_stage = g->items[q][w].col_stage ? f->stage[w] : NULL;
        if ((s->dirs & MXS_ROWWISE) && t_below(rng, 4)) {
            it->row_fragment = f->frag[w][0] = frag_alloc(fb);
            if (t_next(rng) & 1) it->primary.row_data = NULL;
        }
        if ((s->dirs & MXS_COLWISE) && t_below(rng, 4)) {
            it->stage_fragment = f->frag[w][1] = frag_alloc(fb);
            if (t_next(rng) & 1) it->col_stage = NULL;
        }
        if ((s->dirs & MXS_COLWISE) && col_to_fragment(it) && (t_next(rng) & 1)) it->primary.col_data = NULL;
    }
    f->batch.items = f->items;
    f->batch.n_items = g->nw;
    f->batch.round_through = g->rt;
    cr_assert_eq(mxs_nvfp4_wb_make_plan(&f->batch, &f->plan, NULL), MXS_OK, "%s: rank %d: fragment plan", what, q);
    cr_assert_eq(f->plan.fingerprint, g->plan[q].fingerprint, "%s: fragments leave the fingerprint alone", what);
    cr_assert_eq(f->plan.packed_bytes, g->plan[q].packed_bytes);
}

static void fside_free(fside *f, int nw) {
    int w, p;
    for (w = 0; w < nw; w++) {
        for (p = 0; p < 2; p++) {
            free(f->data[w][p]);
            free(f->scale[w][p]);
            frag_free(f->frag[w][p]);
        }
        free(f->stage[w]);
        free(f->amax[w]);
    }
}

/* Where the in-place apply of rank q put the stage values of weight w: its
 * stage, or (16x16 without one) its row-wise plane - the same nibbles. */
static const uint8_t *inplace_stage(const group *g, int q, int w) {
    return g->items[q][w].col_stage ? g->rb[q][w].stage : g->rb[q][w].data[0];
}

/* After the fragment batch's apply: the fragments hold the in-place apply's
 * bytes [start/2, ceil(end/2)) (guards intact), the scales and amax are the
 * in-place ones, every replaced or unwritten output is still poisoned. */
static void fside_check_apply(const fside *f, const group *g, int q, int first) {
    int w, p;
    for (w = 0; w < g->nw; w++) {
        const wspec *s = &g->w[w];
        const mxs_nvfp4_wb_item *it = &f->items[w];
        const mxs_range sh = g->rb[q][w].shard;
        const int64_t fb = mxs_nvfp4_fragment_bytes(sh.first, sh.count), b0 = sh.first / 2;
        cr_assert_eq(amax_bits(f->amax[w]), amax_bits(g->rb[q][w].amax), "%s: rank %d w%d amax", what, q, w);
        for (p = 0; p < 2; p++) {
            if (s->dirs & (unsigned)(p + 1)) {
                cr_assert_eq(t_first_diff(f->scale[w][p], g->rb[q][w].scale[p], (size_t)g->sbytes[w][p]), -1,
                             "%s: rank %d w%d plane %d: scales with fragments", what, q, w, p);
                cr_assert(t_guard_ok(f->scale[w][p], (size_t)g->sbytes[w][p]));
            } else {
                cr_assert(t_all_poisoned(f->scale[w][p], (size_t)g->sbytes[w][p]));
                cr_assert(t_all_poisoned(f->data[w][p], (size_t)g->dbytes[w]));
            }
            if (f->frag[w][p]) {
                const uint8_t *want = p == 0 ? g->rb[q][w].data[0] : inplace_stage(g, q, w);
                cr_assert_eq(t_first_diff(f->frag[w][p], want + b0, (size_t)fb), -1,
                             "%s: rank %d w%d %s fragment (%ld bytes) differs from the in-place bytes at %ld", what, q,
                             w, p ? "stage" : "row", (long)fb,
                             (long)t_first_diff(f->frag[w][p], want + b0, (size_t)fb));
                cr_assert(frag_guards_ok(f->frag[w][p], fb), "%s: rank %d w%d: fragment guards", what, q, w);
            }
        }
        if (first || col_to_fragment(it)) /* apply never writes column data (finish did in update 1) */
            cr_assert(t_all_poisoned(f->data[w][1], (size_t)g->dbytes[w]), "%s: rank %d w%d column data", what, q, w);
        if (s->dirs & MXS_ROWWISE) { /* the fresh row-wise plane: the shard's bytes in place, or nothing */
            int64_t k, b1 = b0 + fb;
            for (k = 0; k < g->dbytes[w]; k++) {
                const int in = !f->frag[w][0] && k >= b0 && k < b1;
                cr_assert_eq(f->data[w][0][k], in ? g->rb[q][w].data[0][k] : T_POISON,
                             "%s: rank %d w%d row byte %ld (fragment %d)", what, q, w, (long)k, f->frag[w][0] != NULL);
            }
        }
        {
            int64_t k, b1 = b0 + fb;
            const int written = !f->frag[w][1] && it->col_stage;
            for (k = 0; k < g->dbytes[w]; k++) {
                const int in = written && k >= b0 && k < b1;
                cr_assert_eq(f->stage[w][k], in ? inplace_stage(g, q, w)[k] : T_POISON,
                             "%s: rank %d w%d stage byte %ld", what, q, w, (long)k);
            }
            cr_assert(t_guard_ok(f->stage[w], (size_t)g->dbytes[w]));
        }
    }
}

/* Rank p's bytes of weight w's row-wise plane (plane = 0) or stage (1), as
 * written by its fragment batch, copied into `full` at [start/2, ceil(end/2)). */
static void fside_gather(const fside *f, const group *g, int p, int w, int plane, uint8_t *full) {
    const mxs_nvfp4_wb_item *it = &f->items[w];
    const mxs_range sh = g->rb[p][w].shard;
    const int64_t fb = mxs_nvfp4_fragment_bytes(sh.first, sh.count), b0 = sh.first / 2;
    const uint8_t *src;
    if (fb == 0) return;
    if (plane == 1 && !f->frag[w][1] && !it->col_stage) plane = 0; /* 16x16: the row-wise nibbles */
    if (f->frag[w][plane])
        src = f->frag[w][plane];
    else
        src = (plane == 0 ? f->data[w][0] : f->stage[w]) + b0;
    memcpy(full + b0, src, (size_t)fb);
}

/* Steps 1-6 with fragments on every rank: partial equals the in-place
 * partial, apply fills the fragments with the in-place bytes; the gathered
 * fragments are the whole-tensor quantize's row-wise plane, and
 * mxs_host_nvfp4_stage_to_col of the gathered stage its column-wise plane
 * (and equals finish's transpose of the in-place stage). */
static void check_fragments(group *g, fside *fs, t_rng *rng, int make) {
    int q, w, p;
    for (q = 0; q < g->R; q++) {
        uint8_t *pk = t_alloc((size_t)g->plan[q].packed_bytes), *pk2 = t_alloc((size_t)g->plan[q].packed_bytes);
        mxs_status s;
        if (make) fside_make(&fs[q], g, q, rng);
        cr_assert_eq(mxs_host_nvfp4_wb_partial(&fs[q].batch, &fs[q].plan, pk), MXS_OK);
        cr_assert_eq(mxs_host_nvfp4_wb_partial(&g->batch[q], &g->plan[q], pk2), MXS_OK);
        cr_assert_eq(t_first_diff(pk, pk2, (size_t)g->plan[q].packed_bytes), -1, "%s: partial with fragments", what);
        s = mxs_host_nvfp4_wb_apply(&fs[q].batch, &fs[q].plan, g->packed[q]); /* the reduced buffer */
        cr_assert_eq(s, MXS_OK, "%s: rank %d: apply with fragments: %s", what, q, mxs_status_str(s));
        fside_check_apply(&fs[q], g, q, make);
        cr_assert_eq(mxs_host_nvfp4_wb_finish(&fs[q].batch, &fs[q].plan), MXS_OK);
        for (w = 0; w < g->nw; w++) /* finish skips items whose column values are in fragments */
            if (col_to_fragment(&fs[q].items[w]) && fs[q].items[w].primary.col_data)
                cr_assert(t_all_poisoned(fs[q].data[w][1], (size_t)g->dbytes[w]), "%s: finish skips fragments", what);
        free(pk);
        free(pk2);
    }
    for (w = 0; w < g->nw; w++) {
        uint8_t *full = t_alloc((size_t)g->dbytes[w]), *col = t_alloc((size_t)g->dbytes[w]);
        mxs_nvfp4_tensor t = g->items[0][w].primary;
        t.col_data = col;
        if (g->w[w].dirs & MXS_ROWWISE) {
            for (p = 0; p < g->R; p++) fside_gather(&fs[p], g, p, w, 0, full);
            cr_assert_eq(t_first_diff(full, g->ref[w].row_data, (size_t)g->dbytes[w]), -1,
                         "%s: w%d: gathered row fragments == whole-tensor quantize", what, w);
        }
        if (g->w[w].dirs & MXS_COLWISE) {
            t_poison(full, (size_t)g->dbytes[w]);
            for (p = 0; p < g->R; p++) fside_gather(&fs[p], g, p, w, 1, full);
            cr_assert_eq(mxs_host_nvfp4_stage_to_col(&t, full), MXS_OK);
            cr_assert_eq(t_first_diff(col, g->ref[w].col_data, (size_t)g->dbytes[w]), -1,
                         "%s: w%d: stage_to_col of the gathered stage fragments == whole-tensor quantize", what, w);
            for (q = 0; q < g->R; q++) { /* the standalone transpose == finish */
                t_poison(col, (size_t)g->dbytes[w]);
                cr_assert_eq(mxs_host_nvfp4_stage_to_col(&t, inplace_stage(g, q, w)), MXS_OK);
                cr_assert_eq(t_first_diff(col, g->rb[q][w].data[1], (size_t)g->dbytes[w]), -1);
            }
            cr_assert(t_guard_ok(col, (size_t)g->dbytes[w]) && t_guard_ok(full, (size_t)g->dbytes[w]));
        }
        free(full);
        free(col);
    }
}

Test(nvfp4_writeback, fragments_hold_the_in_place_bytes_of_the_shard, .timeout = 120) {
    t_rng rng = t_rng_seed(0xF4A6);
    int it, q, frags = 0, nulls = 0, empty = 0;
    for (it = 0; it < 600; it++) {
        group g;
        fside *fs = (fside *)calloc(MAXR, sizeof *fs);
        int R = 1 + it % MAXR, sh = (it / MAXR) % SH_KINDS, w;
        cr_assert_not_null(fs);
        snprintf(what, sizeof what, "fragments case %d (R=%d, %s)", it, R, sh_name[sh]);
        group_make(&g, &rng, R, sh);
        group_fill(&g, &rng);
        group_poison(&g);
        group_step(&g, 1);
        check_fragments(&g, fs, &rng, 1);
        group_fill(&g, &rng); /* update 2: the same fragments, stale bytes */
        group_step(&g, 0);
        check_fragments(&g, fs, &rng, 0);
        for (q = 0; q < R; q++)
            for (w = 0; w < g.nw; w++) {
                frags += (fs[q].frag[w][0] != NULL) + (fs[q].frag[w][1] != NULL);
                nulls += !fs[q].items[w].primary.row_data + !fs[q].items[w].primary.col_data;
                empty += g.rb[q][w].shard.count == 0 && (fs[q].frag[w][0] || fs[q].frag[w][1]);
            }
        for (q = 0; q < R; q++) fside_free(&fs[q], g.nw);
        free(fs);
        group_free(&g);
    }
    cr_assert(frags > 1000 && nulls > 300 && empty > 20, "%d fragments, %d NULL data planes, %d empty", frags, nulls,
              empty);
}

/* ---- fragments on one rank ---------------------------------------------------- */

Test(nvfp4_writeback, stage_to_col_checks_everything_before_writing) {
    one o;
    mxs_nvfp4_tensor t;
    uint8_t *stage;
    one_make(&o);
    t = o.items[0].primary; /* 20 x 33, both planes */
    stage = o.bufs[0][7];
    cr_assert_eq(mxs_host_nvfp4_stage_to_col(NULL, stage), MXS_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mxs_host_nvfp4_stage_to_col(&t, NULL), MXS_ERR_INVALID_ARGUMENT);
    t.rows = 0;
    cr_assert_eq(mxs_host_nvfp4_stage_to_col(&t, stage), MXS_ERR_SHAPE);
    t = o.items[0].primary;
    t.col_data = NULL;
    cr_assert_eq(mxs_host_nvfp4_stage_to_col(&t, stage), MXS_ERR_ABSENT_PLANE);
    cr_assert_eq(mxs_host_nvfp4_stage_to_col(&o.items[1].primary, stage), MXS_ERR_ABSENT_PLANE); /* row-only */
    t = o.items[0].primary;
    cr_assert_eq(mxs_host_nvfp4_stage_to_col(&t, t.col_data + 329), MXS_ERR_ALIASING);
    cr_assert_eq(mxs_host_nvfp4_stage_to_col(&t, t.col_data), MXS_ERR_ALIASING);
    cr_assert(one_untouched(&o));
    /* nothing but col_data is needed or written: no amax, no scales, no row data */
    t.amax = NULL;
    t.row_data = t.row_scale = t.col_scale = NULL;
    cr_assert_eq(mxs_host_nvfp4_stage_to_col(&t, stage), MXS_OK);
    cr_assert(t_guard_ok(t.col_data, 330) && t_all_poisoned(o.bufs[0][0], 330) && t_all_poisoned(o.bufs[0][7], 330));
    one_free(&o);
}

Test(nvfp4_writeback, empty_shards_with_fragments_write_no_data) {
    one o;
    mxs_nvfp4_wb_plan plan;
    uint8_t *rf = frag_alloc(0), *sf = frag_alloc(0);
    one_make(&o);
    o.items[0].start = 7; /* empty: any start */
    o.items[0].len = 0;
    o.items[0].row_fragment = rf;
    o.items[0].stage_fragment = sf;
    o.items[0].primary.row_data = o.items[0].primary.col_data = NULL;
    o.items[0].col_stage = NULL;
    cr_assert_eq(mxs_nvfp4_fragment_bytes(7, 0), 0);
    cr_assert_eq(mxs_nvfp4_fragment_bytes(6, 5), 3);
    cr_assert_eq(mxs_nvfp4_fragment_bytes(6, 4), 2);
    cr_assert_eq(mxs_nvfp4_wb_make_plan(&o.batch, &plan, NULL), MXS_OK);
    cr_assert_eq(mxs_host_nvfp4_wb_partial(&o.batch, &plan, o.packed), MXS_OK);
    cr_assert_eq(mxs_host_nvfp4_wb_apply(&o.batch, &plan, o.packed), MXS_OK);
    cr_assert_eq(mxs_host_nvfp4_wb_finish(&o.batch, &plan), MXS_OK);
    cr_assert(frag_guards_ok(rf, 0) && frag_guards_ok(sf, 0));
    cr_assert(t_all_poisoned(o.bufs[0][0], 330) && t_all_poisoned(o.bufs[0][2], 330) &&
              t_all_poisoned(o.bufs[0][4], 330));
    cr_assert(!t_all_poisoned(o.bufs[0][1], (size_t)o.sizes[0][1])); /* the scales: complete, as always */
    /* the packed buffer over a fragment */
    o.items[0].start = 0;
    o.items[0].len = 2;
    o.items[0].row_fragment = (uint8_t *)(void *)o.packed;
    cr_assert_eq(mxs_nvfp4_wb_make_plan(&o.batch, &plan, NULL), MXS_OK);
    cr_assert_eq(mxs_host_nvfp4_wb_apply(&o.batch, &plan, o.packed), MXS_ERR_ALIASING);
    cr_assert_eq(mxs_nvfp4_wb_check_buffer(&o.batch, o.packed, 1), MXS_ERR_ALIASING);
    frag_free(rf);
    frag_free(sf);
    one_free(&o);
}
