/* SPDX-License-Identifier: MIT */
/* docs/contract.md section 6, the buffer rules on batches of many items: the
 * chunked overlap pass of the plan finds an overlap planted in the same
 * chunk, across chunks or at a chunk boundary, and its verdict on random
 * batches (1..300 items) equals a brute-force check of every pair of buffers.
 * Buffers the plan only compares by address are still real memory: slices of
 * arenas.
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <mxshard/mxshard.h>

#include "common.h"

/* ---- many items: the chunked overlap pass ------------------------------------------ */

/* 300 items (more than two chunks of the overlap pass), every buffer its own
 * slice of one arena. One overlap planted between items i and j - in the
 * same chunk, across chunks, at a chunk boundary - of each kind is found;
 * masters overlapping across chunks are allowed. */
#define MANY 300
typedef struct {
    mxs_wb_item items[MANY];
    mxs_wb_batch batch;
    uint8_t *arena;
} many_t;

static void many_init(many_t *m) {
    int64_t i, at = 0;
    memset(m, 0, sizeof *m);
    m->arena = (uint8_t *)malloc((size_t)MANY * 8192);
    cr_assert_not_null(m->arena);
    for (i = 0; i < MANY; i++) {
        mxs_wb_item *it = &m->items[i];
        mxs_tensor *t = &it->primary;
        t->rows = 16 + i % 13, t->cols = 30 + i % 7; /* data <= 1008 bytes, scales <= 512 */
        t->dirs = i % 3 == 0 ? MXS_ROWWISE : MXS_BOTH;
        t->scale_layout = (mxs_scale_layout)(i % 3);
        t->row_data = m->arena + at, at += 1024;
        t->row_scale = m->arena + at, at += 512 + (i % 3 ? 512 : 0);
        if (t->dirs & MXS_COLWISE) {
            t->col_data = m->arena + at, at += 1024;
            t->col_scale = m->arena + at, at += 1024;
        }
        it->start = i % 17, it->len = 300;
        if (i % 5 == 2) {
            it->row_fragment = m->arena + at, at += 300;
            if (t->dirs & MXS_COLWISE) it->col_fragment = m->arena + at, at += 300;
        }
        it->master = m->arena + at, at += 1200;
        cr_assert_leq(at, (int64_t)MANY * 8192);
    }
    m->batch.items = m->items;
    m->batch.n_items = MANY;
}

Test(aliasing, overlaps_are_found_across_chunks_of_many_items) {
    static const int pairs[][2] = {{3, 5}, {3, 140}, {3, 299}, {127, 128}, {130, 250}, {0, 256}, {200, 201}};
    many_t *m = (many_t *)malloc(sizeof *m);
    mxs_wb_plan plan;
    size_t p;
    int kind;
    cr_assert_not_null(m);
    many_init(m);
    cr_assert_eq(mxs_wb_make_plan(&m->batch, &plan, NULL), MXS_OK);
    for (p = 0; p < sizeof pairs / sizeof pairs[0]; p++)
        for (kind = 0; kind < 5; kind++) {
            int i = pairs[p][0], j = pairs[p][1];
            mxs_wb_item save_i = m->items[i], save_j = m->items[j];
            mxs_status want = MXS_ERR_ALIASING, got;
            switch (kind) {
            case 0: /* output on output: onto the last byte of i's row data */
                m->items[j].primary.row_scale =
                    m->items[i].primary.row_data + m->items[i].primary.rows * m->items[i].primary.cols - 1;
                break;
            case 1: m->items[i].primary.row_data = m->items[j].primary.row_scale + 1; break; /* out-out */
            case 2: m->items[j].master = m->items[i].primary.row_scale; break;               /* later master */
            case 3: m->items[i].master = m->items[j].primary.row_data + 500; break;          /* chunk master */
            default:
                m->items[j].master = m->items[i].master;
                want = MXS_OK;
                break; /* master-master */
            }
            got = mxs_wb_make_plan(&m->batch, &plan, NULL);
            cr_assert_eq(got, want, "items %d, %d, kind %d: %s", i, j, kind, mxs_status_str(got));
            m->items[i] = save_i;
            m->items[j] = save_j;
        }
    cr_assert_eq(mxs_wb_make_plan(&m->batch, &plan, NULL), MXS_OK);
    free(m->arena);
    free(m);
}

/* Random batches (1..300 items) with buffers placed back to back or, now and
 * then, on top of an earlier one: the plan's verdict equals a brute-force
 * check of every pair of buffers under the rules of docs/writeback.md. */
typedef struct {
    uint64_t lo, hi;
    int item, master;
} bf_span;

static int brute_force_aliasing(const bf_span *s, int n) {
    int a, b;
    for (a = 0; a < n; a++)
        for (b = 0; b < a; b++) {
            if (s[a].master && s[b].master) continue; /* inputs may share */
            if (s[a].lo < s[b].hi && s[b].lo < s[a].hi) return 1;
        }
    return 0;
}

Test(aliasing, random_batches_agree_with_brute_force) {
    t_rng rng = t_rng_seed(4242);
    const size_t arena_bytes = 8u << 20;
    uint8_t *arena = (uint8_t *)malloc(arena_bytes);
    mxs_wb_item *items = (mxs_wb_item *)calloc(300, sizeof *items);
    bf_span *spans = (bf_span *)calloc(300 * 7, sizeof *spans);
    int iter, verdicts[2] = {0, 0};
    cr_assert(arena && items && spans);
    for (iter = 0; iter < 400; iter++) {
        int n = (int)t_between(&rng, 1, iter % 4 == 0 ? 300 : 40), ns = 0, k;
        int64_t at = 0;
        int64_t p_overlap = 2 + 7 * (int64_t)n; /* about one planted overlap every other batch */
        mxs_wb_batch b;
        mxs_wb_plan plan;
        mxs_status got;
        memset(items, 0, 300 * sizeof *items);
        for (k = 0; k < n; k++) {
            mxs_wb_item *it = &items[k];
            mxs_tensor *t = &it->primary;
            int q;
            t->rows = t_between(&rng, 1, 40), t->cols = t_between(&rng, 1, 40);
            t->dirs = (unsigned)t_between(&rng, 1, 3);
            t->scale_layout = (mxs_scale_layout)t_below(&rng, 3);
            it->master_dtype = (mxs_dtype)t_below(&rng, 3);
            it->start = t_below(&rng, t->rows * t->cols + 1);
            it->len = t_below(&rng, t->rows * t->cols - it->start + 1);
            for (q = 0; q < 7; q++) { /* 0 row data, 1 row scale, 2 row fragment, 3-5 the same for columns, 6 master */
                int plane = q < 3 ? MXS_ROWWISE : MXS_COLWISE, role = q % 3;
                int64_t bytes;
                uint8_t *ptr;
                if (q < 6 && !(t->dirs & (unsigned)plane)) continue;
                if (q == 6)
                    bytes = it->len * mxs_dtype_bytes(it->master_dtype); /* 0: master stays NULL */
                else if (role == 0)
                    bytes = t->rows * t->cols;
                else if (role == 1)
                    bytes = mxs_scale_bytes(t, (mxs_dirs)plane);
                else
                    bytes = t_below(&rng, 3) == 0 ? it->len : 0; /* a fragment now and then */
                if (bytes == 0) continue;
                if (ns > 0 && t_below(&rng, p_overlap) == 0) { /* on top of an earlier buffer */
                    const bf_span *o = &spans[t_below(&rng, ns)];
                    int64_t off =
                        (int64_t)(o->lo - (uint64_t)(uintptr_t)arena) + t_below(&rng, (int64_t)(o->hi - o->lo));
                    if (t_below(&rng, 2)) off -= t_below(&rng, bytes); /* or ending inside it */
                    ptr = arena + (off < 0 ? 0 : off);
                } else {
                    ptr = arena + at;
                    at += bytes + t_below(&rng, 3); /* touching, or a small gap */
                }
                cr_assert_lt(at, (int64_t)arena_bytes - 8192);
                if (q == 6)
                    it->master = ptr;
                else if (q == 0)
                    t->row_data = ptr;
                else if (q == 1)
                    t->row_scale = ptr;
                else if (q == 2)
                    it->row_fragment = ptr;
                else if (q == 3)
                    t->col_data = ptr;
                else if (q == 4)
                    t->col_scale = ptr;
                else
                    it->col_fragment = ptr;
                spans[ns].lo = (uint64_t)(uintptr_t)ptr;
                spans[ns].hi = spans[ns].lo + (uint64_t)bytes;
                spans[ns].item = k;
                spans[ns].master = q == 6;
                ns++;
            }
        }
        memset(&b, 0, sizeof b);
        b.items = items;
        b.n_items = n;
        got = mxs_wb_make_plan(&b, &plan, NULL);
        cr_assert(got == MXS_OK || got == MXS_ERR_ALIASING, "iter %d: %s", iter, mxs_status_str(got));
        cr_assert_eq(got == MXS_ERR_ALIASING, brute_force_aliasing(spans, ns), "iter %d (%d items): plan says %s", iter,
                     n, mxs_status_str(got));
        verdicts[got == MXS_ERR_ALIASING]++;
    }
    cr_assert_gt(verdicts[0], 50, "enough clean batches");
    cr_assert_gt(verdicts[1], 50, "enough batches with an overlap");
    free(arena);
    free(items);
    free(spans);
}
