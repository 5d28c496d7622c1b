/* SPDX-License-Identifier: MIT */
/* tests/cpu/writeback_fixture.h - the one-rank fixture of the writeback tests
 * (test_writeback*.c): up to MAXI items of given shapes, planes, shards and
 * fragments, whose outputs are poisoned (0xA5 or 0x5A) and followed by guard
 * bytes, with the whole f32 master of each weight and its whole-tensor
 * quantize as the reference; counts of touched output and guard bytes.
 */
#ifndef MXSHARD_TESTS_CPU_WRITEBACK_FIXTURE_H
#define MXSHARD_TESTS_CPU_WRITEBACK_FIXTURE_H

#include <criterion/criterion.h>

#include <mxshard/mxshard.h>

#include "sim.h"

#define POISON_A 0xA5u
#define POISON_B 0x5Au
#define GUARD 32

/* ---- a one-rank fixture -------------------------------------------------------- */

/* A buffer with its poison and guard. */
typedef struct {
    uint8_t *p;
    int64_t n;
} buf_t;

static inline buf_t buf_new(int64_t n, uint8_t poison) {
    buf_t b;
    b.n = n;
    b.p = (uint8_t *)malloc((size_t)n + GUARD);
    cr_assert(b.p != NULL);
    memset(b.p, poison, (size_t)n + GUARD);
    return b;
}
static inline int64_t buf_count_not(const buf_t *b, uint8_t v) { /* bytes (guard included) != v */
    int64_t k, bad = 0;
    for (k = 0; k < b->n + GUARD; k++) bad += b->p[k] != v;
    return bad;
}
static inline int64_t guard_bad(const buf_t *b, uint8_t v) {
    int64_t k, bad = 0;
    for (k = b->n; k < b->n + GUARD; k++) bad += b->p[k] != v;
    return bad;
}

#define MAXI 4
typedef struct {
    int n;
    mxs_wb_item items[MAXI];
    mxs_wb_batch batch;
    buf_t data[MAXI][2], scale[MAXI][2], frag[MAXI][2], packed;
    float *full[MAXI];    /* the whole master of each weight, f32 */
    mxs_tensor ref[MAXI]; /* whole-tensor quantize, same layout */
    uint8_t poison;
} fixture;

typedef struct {
    int64_t rows, cols;
    unsigned dirs;
    int64_t start, len;
    int fragment; /* 0 in place, 1 fragment with NULL data, 2 fragment and data kept */
} item_spec;

static inline float value_at(uint64_t seed, int64_t w, int64_t i) {
    uint64_t h = mxs_sim_hash4(seed, (uint64_t)w, (uint64_t)i, 7);
    int e = (int)((mxs_sim_hash4(seed, (uint64_t)w, (uint64_t)(i / 29), 8)) % 30) - 15 - (int)(h % 5);
    float v = ldexpf(1.0f + (float)(h >> 40) * 0x1.0p-24f, e);
    return (h >> 20) & 1 ? -v : v;
}

static inline void fixture_init(fixture *fx, const item_spec *spec, int n, mxs_scale_layout layout, mxs_rounding rnd,
                                mxs_wb_mode mode, uint8_t poison, uint64_t seed) {
    int k, p;
    memset(fx, 0, sizeof *fx);
    fx->n = n;
    fx->poison = poison;
    for (k = 0; k < n; k++) {
        mxs_wb_item *it = &fx->items[k];
        int64_t elems = spec[k].rows * spec[k].cols, i;
        mxs_tensor *t = &it->primary;
        t->rows = spec[k].rows;
        t->cols = spec[k].cols;
        t->dirs = spec[k].dirs;
        t->scale_layout = layout;
        fx->full[k] = (float *)malloc((size_t)elems * sizeof(float));
        for (i = 0; i < elems; i++) fx->full[k][i] = value_at(seed, k, i);
        it->master = fx->full[k] + spec[k].start;
        it->master_dtype = MXS_F32;
        it->start = spec[k].start;
        it->len = spec[k].len;
        fx->ref[k] = *t;
        for (p = 0; p < 2; p++) {
            mxs_dirs plane = p ? MXS_COLWISE : MXS_ROWWISE;
            if (!(t->dirs & (unsigned)plane)) continue;
            fx->data[k][p] = buf_new(elems, poison);
            fx->scale[k][p] = buf_new(mxs_scale_bytes(t, plane), poison);
            if (spec[k].fragment) fx->frag[k][p] = buf_new(spec[k].len, poison);
            if (p == 0) {
                t->row_data = spec[k].fragment == 1 ? NULL : fx->data[k][0].p;
                t->row_scale = fx->scale[k][0].p;
                it->row_fragment = spec[k].fragment ? fx->frag[k][0].p : NULL;
                fx->ref[k].row_data = (uint8_t *)malloc((size_t)elems);
                fx->ref[k].row_scale = (uint8_t *)malloc((size_t)mxs_scale_bytes(t, plane));
            } else {
                t->col_data = spec[k].fragment == 1 ? NULL : fx->data[k][1].p;
                t->col_scale = fx->scale[k][1].p;
                it->col_fragment = spec[k].fragment ? fx->frag[k][1].p : NULL;
                fx->ref[k].col_data = (uint8_t *)malloc((size_t)elems);
                fx->ref[k].col_scale = (uint8_t *)malloc((size_t)mxs_scale_bytes(t, plane));
            }
        }
        cr_assert_eq(mxs_host_quantize(&fx->ref[k], fx->full[k], MXS_F32, rnd), MXS_OK);
    }
    fx->batch.items = fx->items;
    fx->batch.n_items = n;
    fx->batch.rounding = rnd;
    fx->batch.mode = mode;
}

static inline void fixture_alloc_packed(fixture *fx, int64_t bytes) { fx->packed = buf_new(bytes, fx->poison); }

static inline void fixture_free(fixture *fx) {
    int k, p;
    for (k = 0; k < fx->n; k++) {
        for (p = 0; p < 2; p++) {
            free(fx->data[k][p].p);
            free(fx->scale[k][p].p);
            free(fx->frag[k][p].p);
        }
        free(fx->ref[k].row_data);
        free(fx->ref[k].row_scale);
        free(fx->ref[k].col_data);
        free(fx->ref[k].col_scale);
        free(fx->full[k]);
    }
    free(fx->packed.p);
}

/* Every output byte (data, scales, fragments, packed, guards) still poisoned. */
static inline int64_t fixture_touched(const fixture *fx) {
    int64_t bad = 0;
    int k, p;
    for (k = 0; k < fx->n; k++)
        for (p = 0; p < 2; p++) {
            if (fx->data[k][p].p) bad += buf_count_not(&fx->data[k][p], fx->poison);
            if (fx->scale[k][p].p) bad += buf_count_not(&fx->scale[k][p], fx->poison);
            if (fx->frag[k][p].p) bad += buf_count_not(&fx->frag[k][p], fx->poison);
        }
    if (fx->packed.p) bad += buf_count_not(&fx->packed, fx->poison);
    return bad;
}

static inline int64_t fixture_guards(const fixture *fx) {
    int64_t bad = 0;
    int k, p;
    for (k = 0; k < fx->n; k++)
        for (p = 0; p < 2; p++) {
            if (fx->data[k][p].p) bad += guard_bad(&fx->data[k][p], fx->poison);
            if (fx->scale[k][p].p) bad += guard_bad(&fx->scale[k][p], fx->poison);
            if (fx->frag[k][p].p) bad += guard_bad(&fx->frag[k][p], fx->poison);
        }
    if (fx->packed.p) bad += guard_bad(&fx->packed, fx->poison);
    return bad;
}

#endif /* MXSHARD_TESTS_CPU_WRITEBACK_FIXTURE_H */
