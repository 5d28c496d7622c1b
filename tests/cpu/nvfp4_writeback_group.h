/* SPDX-License-Identifier: MIT */
/* tests/cpu/nvfp4_writeback_group.h - R simulated ranks of the NVFP4 sharded
 * writeback (docs/contract.md section 9.8) in one process, for
 * test_nvfp4_writeback.c and test_nvfp4_writeback_fragments.c: each rank with
 * its own primaries, master shards, column stages and packed buffer; random
 * shapes, shardings (bucket, random even cuts, replicas, overlaps), plane
 * sets, block shapes, layouts, master dtypes and round-throughs; the whole-
 * tensor mxs_host_nvfp4_quantize as the reference. group_step runs one
 * writeback: partial -> ONE MAX reduction of the packed entries (by hand,
 * counted) -> apply -> byte gather by the shards' byte ranges (by hand) ->
 * finish, checking what each phase wrote and what it left alone.
 */
#ifndef MXSHARD_TESTS_CPU_NVFP4_WRITEBACK_GROUP_H
#define MXSHARD_TESTS_CPU_NVFP4_WRITEBACK_GROUP_H

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mxshard/mxshard.h>
#include <mxshard/nvfp4_writeback.h>

#include "common.h"

#define MAXR 5
#define MAXW 3

enum { SH_BUCKET, SH_RANDOM, SH_REPLICA, SH_OVERLAP, SH_KINDS };
static const char *sh_name[SH_KINDS] = {"bucket", "random", "replica", "overlap"};

typedef struct wspec {
    int64_t rows, cols, offset; /* offset: in the flat bucket (even) */
    unsigned dirs;
    int block, layout, stage; /* stage 0: col_stage NULL (16x16 with both planes only) */
    mxs_dtype mdt;
} wspec;

typedef struct rbuf { /* one rank's buffers of one weight */
    uint8_t *data[2], *scale[2], *stage, *amax, *master;
    mxs_range shard;
} rbuf;

typedef struct group {
    int R, nw, sharding;
    mxs_dtype rt;
    wspec w[MAXW];
    int64_t dbytes[MAXW], sbytes[MAXW][2];
    void *full[MAXW];
    mxs_nvfp4_tensor ref[MAXW];
    float ref_amax[MAXW];
    rbuf rb[MAXR][MAXW];
    mxs_nvfp4_wb_item items[MAXR][MAXW];
    mxs_nvfp4_wb_batch batch[MAXR];
    mxs_nvfp4_wb_plan plan[MAXR];
    uint8_t *packed[MAXR];
    int64_t reduce_calls, reduce_entries;
} group;

static char what[256];

/* Dimensions where NVFP4 edges go wrong: 1, small, around multiples of 16. */
static inline int64_t rdim(t_rng *r, int64_t max) {
    int64_t d;
    switch (t_below(r, 4)) {
    case 0: d = 1; break;
    case 1: d = t_between(r, 1, 40); break;
    case 2: d = 16 * t_between(r, 1, 6) + t_between(r, -1, 1); break;
    default: d = t_between(r, 1, max); break;
    }
    return d < 1 ? 1 : (d > max ? max : d);
}

static inline int64_t even_between(t_rng *r, int64_t lo, int64_t hi) { /* an even value in [lo, hi], lo, hi even */
    return lo + 2 * t_below(r, (hi - lo) / 2 + 1);
}

static inline void set_primary(mxs_nvfp4_tensor *t, const wspec *w, uint8_t *data[2], uint8_t *scale[2],
                               uint8_t *amax) {
    memset(t, 0, sizeof *t);
    t->rows = w->rows;
    t->cols = w->cols;
    t->dirs = w->dirs;
    t->block = (mxs_nvfp4_block)w->block;
    t->scale_layout = (mxs_scale_layout)w->layout;
    /* absent planes get buffers too: they must stay untouched */
    t->row_data = data[0];
    t->row_scale = scale[0];
    t->col_data = data[1];
    t->col_scale = scale[1];
    t->amax = (float *)(void *)amax;
}

/* Shards of the weights, per rank, by g->sharding; every boundary even. */
static inline void make_shards(group *g, t_rng *rng, int64_t used) {
    int64_t bucket = mxs_nvfp4_bucket_elems(used, g->R), cut[MAXR + 1], q, w;
    cr_assert(bucket >= used && bucket % (2 * g->R) == 0);
    cut[0] = 0;
    cut[g->R] = used + (used & 1);
    for (q = 1; q < g->R; q++) cut[q] = even_between(rng, 0, cut[g->R]);
    for (q = 1; q < g->R; q++) /* sort the cuts */
        for (w = q; w > 1 && cut[w] < cut[w - 1]; w--) {
            int64_t t = cut[w];
            cut[w] = cut[w - 1];
            cut[w - 1] = t;
        }
    for (q = 0; q < g->R; q++)
        for (w = 0; w < g->nw; w++) {
            const int64_t elems = g->w[w].rows * g->w[w].cols, chunk = bucket / g->R;
            mxs_range s;
            if (g->sharding == SH_BUCKET) {
                cr_assert_eq(mxs_nvfp4_bucket_shard(g->w[w].offset, elems, bucket, g->R, q, &s), MXS_OK);
            } else if (g->sharding == SH_RANDOM) {
                s = mxs_range_in_weight(cut[q], cut[q + 1], g->w[w].offset, elems);
            } else if (g->sharding == SH_REPLICA) {
                s.first = 0;
                s.count = elems;
            } else {
                int64_t widen = 2 * t_between(rng, 0, 20), lo = q * chunk - widen, hi = (q + 1) * chunk + widen;
                s = mxs_range_in_weight(lo < 0 ? 0 : lo, hi, g->w[w].offset, elems);
            }
            cr_assert_eq(mxs_nvfp4_shard_check(elems, s.first, s.count), MXS_OK, "%s: shard rule", what);
            g->rb[q][w].shard = s;
        }
}

static inline void group_make(group *g, t_rng *rng, int R, int sharding) {
    int64_t used = 0, q, w;
    memset(g, 0, sizeof *g);
    g->R = R;
    g->sharding = sharding;
    g->nw = (int)t_between(rng, 1, MAXW);
    g->rt = (mxs_dtype)t_below(rng, 3);
    if (t_below(rng, 3) == 0) g->rt = MXS_BF16; /* TE's case, more often */
    for (w = 0; w < g->nw; w++) {
        wspec *s = &g->w[w];
        mxs_nvfp4_tensor both;
        s->rows = rdim(rng, 90);
        s->cols = rdim(rng, 90);
        if (t_below(rng, 8) == 0) s->cols = t_between(rng, 200, 600); /* several column passes */
        s->dirs = (unsigned)t_between(rng, 1, 3);
        s->block = (int)t_below(rng, 2);
        s->layout = (int)t_below(rng, 3);
        s->mdt = (mxs_dtype)t_below(rng, 3);
        s->stage = !(s->block == MXS_NVFP4_16X16 && s->dirs == MXS_BOTH && (t_next(rng) & 1));
        s->offset = mxs_nvfp4_bucket_place(used);
        used = s->offset + s->rows * s->cols;
        memset(&both, 0, sizeof both);
        both.rows = s->rows;
        both.cols = s->cols;
        both.dirs = MXS_BOTH;
        both.scale_layout = (mxs_scale_layout)s->layout;
        g->dbytes[w] = (s->rows * s->cols + 1) / 2;
        g->sbytes[w][0] = mxs_nvfp4_scale_bytes(&both, MXS_ROWWISE);
        g->sbytes[w][1] = mxs_nvfp4_scale_bytes(&both, MXS_COLWISE);
        g->full[w] = malloc((size_t)(s->rows * s->cols) * 4 + 4);
        cr_assert_not_null(g->full[w]);
        {
            uint8_t *d[2], *sc[2];
            int p;
            for (p = 0; p < 2; p++) {
                d[p] = t_alloc((size_t)g->dbytes[w]);
                sc[p] = t_alloc((size_t)g->sbytes[w][p]);
            }
            set_primary(&g->ref[w], s, d, sc, (uint8_t *)(void *)&g->ref_amax[w]);
        }
    }
    make_shards(g, rng, used);
    for (q = 0; q < R; q++) {
        for (w = 0; w < g->nw; w++) {
            rbuf *b = &g->rb[q][w];
            mxs_nvfp4_wb_item *it = &g->items[q][w];
            int p;
            for (p = 0; p < 2; p++) {
                b->data[p] = t_alloc((size_t)g->dbytes[w]);
                b->scale[p] = t_alloc((size_t)g->sbytes[w][p]);
            }
            b->stage = t_alloc((size_t)g->dbytes[w]);
            b->amax = t_alloc(4);
            b->master = t_alloc((size_t)(b->shard.count * mxs_dtype_bytes(g->w[w].mdt)));
            memset(it, 0, sizeof *it);
            set_primary(&it->primary, &g->w[w], b->data, b->scale, b->amax);
            it->master = b->master;
            it->master_dtype = g->w[w].mdt;
            it->start = b->shard.first;
            it->len = b->shard.count;
            it->col_stage = (g->w[w].dirs & MXS_COLWISE) && g->w[w].stage ? b->stage : NULL;
        }
        g->batch[q].items = g->items[q];
        g->batch[q].n_items = g->nw;
        g->batch[q].round_through = g->rt;
        cr_assert_eq(mxs_nvfp4_wb_make_plan(&g->batch[q], &g->plan[q], NULL), MXS_OK, "%s: plan", what);
        g->packed[q] = t_alloc((size_t)g->plan[q].packed_bytes);
        cr_assert_eq(g->plan[q].fingerprint, g->plan[0].fingerprint, "%s: ranks agree on the fingerprint", what);
        cr_assert_eq(g->plan[q].packed_bytes, g->plan[0].packed_bytes);
        cr_assert_eq(g->plan[q].entry_bytes, g->rt == MXS_BF16 ? 2 : 4);
        cr_assert_eq(g->plan[q].status_offset, g->plan[q].packed_bytes - 1);
    }
}

static inline void group_free(group *g) {
    int q, w, p;
    for (w = 0; w < g->nw; w++) {
        free(g->full[w]);
        free(g->ref[w].row_data);
        free(g->ref[w].col_data);
        free(g->ref[w].row_scale);
        free(g->ref[w].col_scale);
    }
    for (q = 0; q < g->R; q++) {
        for (w = 0; w < g->nw; w++) {
            rbuf *b = &g->rb[q][w];
            for (p = 0; p < 2; p++) {
                free(b->data[p]);
                free(b->scale[p]);
            }
            free(b->stage);
            free(b->amax);
            free(b->master);
        }
        free(g->packed[q]);
    }
}

/* New master values; the reference; each rank's shard copied out. */
static inline void group_fill(group *g, t_rng *rng) {
    int q, w;
    for (w = 0; w < g->nw; w++) {
        const wspec *s = &g->w[w];
        const int64_t esz = mxs_dtype_bytes(s->mdt);
        t_fill(rng, g->full[w], s->mdt, s->rows * s->cols);
        if (t_below(rng, 3) == 0) { /* finite data, moderate range, sometimes */
            int64_t i;
            for (i = 0; i < s->rows * s->cols; i++) {
                float v = ldexpf((float)t_between(rng, -1000, 1000) / 256.0f, (int)t_between(rng, -8, 8));
                if (s->mdt == MXS_F32)
                    ((float *)g->full[w])[i] = v;
                else
                    ((uint16_t *)g->full[w])[i] = s->mdt == MXS_BF16 ? mxs_bf16_from_f32(v) : mxs_f16_from_f32(v);
            }
        }
        cr_assert_eq(mxs_host_nvfp4_quantize(&g->ref[w], g->full[w], s->mdt, g->rt), MXS_OK);
        for (q = 0; q < g->R; q++) {
            const rbuf *b = &g->rb[q][w];
            memcpy(b->master, (const uint8_t *)g->full[w] + b->shard.first * esz, (size_t)(b->shard.count * esz));
        }
    }
}

static inline void group_poison(group *g) {
    int q, w, p;
    for (q = 0; q < g->R; q++) {
        for (w = 0; w < g->nw; w++) {
            rbuf *b = &g->rb[q][w];
            for (p = 0; p < 2; p++) {
                t_poison(b->data[p], (size_t)g->dbytes[w]);
                t_poison(b->scale[p], (size_t)g->sbytes[w][p]);
            }
            t_poison(b->stage, (size_t)g->dbytes[w]);
            t_poison(b->amax, 4);
        }
        t_poison(g->packed[q], (size_t)g->plan[q].packed_bytes);
    }
}

/* The one reduction of a writeback: elementwise MAX over the ranks' packed
 * entries (uint16 or uint32), the result on every rank. */
static inline void group_reduce(group *g) {
    const int64_t n = g->plan[0].packed_count, wd = g->plan[0].entry_bytes;
    int64_t i;
    int q;
    g->reduce_calls++;
    g->reduce_entries += n;
    for (i = 0; i < n; i++) {
        uint32_t m = 0;
        for (q = 0; q < g->R; q++) {
            uint32_t v = wd == 2 ? ((uint16_t *)(void *)g->packed[q])[i] : ((uint32_t *)(void *)g->packed[q])[i];
            m = v > m ? v : m;
        }
        for (q = 0; q < g->R; q++) {
            if (wd == 2)
                ((uint16_t *)(void *)g->packed[q])[i] = (uint16_t)m;
            else
                ((uint32_t *)(void *)g->packed[q])[i] = m;
        }
    }
}

/* After the reduction: each item's tensor-amax entry is the max of its
 * reduced block entries, and that is the whole tensor's amax. */
static inline void check_amax_entries(group *g) {
    mxs_nvfp4_wb_slot sl[MAXW];
    mxs_nvfp4_wb_plan plan = {0}; /* (set by the call; gcc -O3 cannot tell once it inlines it) */
    const int64_t wd = g->plan[0].entry_bytes;
    int w;
    cr_assert_eq(mxs_nvfp4_wb_make_plan(&g->batch[0], &plan, sl), MXS_OK);
    for (w = 0; w < g->nw; w++) {
        const int64_t end = w + 1 < g->nw ? (sl[w + 1].tile_entry >= 0  ? sl[w + 1].tile_entry
                                             : sl[w + 1].row_entry >= 0 ? sl[w + 1].row_entry
                                                                        : sl[w + 1].col_entry)
                                          : plan.packed_count - 1;
        const int64_t begin = sl[w].tile_entry >= 0  ? sl[w].tile_entry
                              : sl[w].row_entry >= 0 ? sl[w].row_entry
                                                     : sl[w].col_entry;
        uint32_t m = 0, e;
        int64_t i;
        for (i = begin; i < end; i++) {
            e = wd == 2 ? ((uint16_t *)(void *)g->packed[0])[i] : ((uint32_t *)(void *)g->packed[0])[i];
            m = e > m ? e : m;
        }
        e = wd == 2 ? ((uint16_t *)(void *)g->packed[0])[sl[w].amax_entry]
                    : ((uint32_t *)(void *)g->packed[0])[sl[w].amax_entry];
        cr_assert_eq(sl[w].amax_entry, w);
        cr_assert_eq(e, m, "%s: weight %d: tensor-amax entry %x, max of its block entries %x", what, w, e, m);
        cr_assert_eq(mxs_nvfp4_entry_amax(e, wd), g->ref_amax[w], "%s: weight %d: reduced tensor amax", what, w);
    }
}

/* Bytes [start/2, ceil(end/2)) of a shard: its part of a data plane / stage. */
static inline void byte_range(mxs_range s, int64_t *b0, int64_t *b1) {
    *b0 = s.first / 2;
    *b1 = (s.first + s.count + 1) / 2;
}

/* The parameter all-gather, by hand: every rank's byte range of the row-wise
 * plane and of the column stage to every other rank. */
static inline void group_gather(group *g) {
    int q, p, w;
    for (w = 0; w < g->nw; w++)
        for (q = 0; q < g->R; q++)
            for (p = 0; p < g->R; p++) {
                int64_t b0, b1;
                if (p == q || g->rb[p][w].shard.count == 0) continue;
                byte_range(g->rb[p][w].shard, &b0, &b1);
                if (g->w[w].dirs & MXS_ROWWISE)
                    memcpy(g->rb[q][w].data[0] + b0, g->rb[p][w].data[0] + b0, (size_t)(b1 - b0));
                if (g->items[q][w].col_stage) memcpy(g->rb[q][w].stage + b0, g->rb[p][w].stage + b0, (size_t)(b1 - b0));
            }
}

static inline uint32_t amax_bits(const uint8_t *p) {
    float a;
    memcpy(&a, p, 4);
    return mxs_f32_bits(a);
}

/* After apply (poisoned before partial): the complete scales and the amax of
 * the reference; the shard's bytes of the row-wise plane and of the stage
 * written (row-wise: the reference's bytes), every other data byte poisoned;
 * the column-wise data plane and absent planes untouched. */
static inline void check_after_apply(const group *g) {
    int q, w, p;
    for (q = 0; q < g->R; q++)
        for (w = 0; w < g->nw; w++) {
            const rbuf *b = &g->rb[q][w];
            const wspec *s = &g->w[w];
            int64_t b0, b1, k;
            byte_range(b->shard, &b0, &b1);
            if (b->shard.count == 0) b0 = b1 = 0;
            cr_assert_eq(amax_bits(b->amax), mxs_f32_bits(g->ref_amax[w]), "%s: rank %d w%d amax", what, q, w);
            for (p = 0; p < 2; p++) {
                const uint8_t *rs = p ? g->ref[w].col_scale : g->ref[w].row_scale;
                if (s->dirs & (unsigned)(p + 1)) {
                    cr_assert_eq(t_first_diff(b->scale[p], rs, (size_t)g->sbytes[w][p]), -1,
                                 "%s: rank %d w%d plane %d scales", what, q, w, p);
                } else {
                    cr_assert(t_all_poisoned(b->scale[p], (size_t)g->sbytes[w][p]), "%s: absent scale plane", what);
                    cr_assert(t_all_poisoned(b->data[p], (size_t)g->dbytes[w]), "%s: absent data plane", what);
                }
            }
            if (s->dirs & MXS_COLWISE)
                cr_assert(t_all_poisoned(b->data[1], (size_t)g->dbytes[w]), "%s: col data", what);
            for (k = 0; k < g->dbytes[w]; k++) {
                int in = k >= b0 && k < b1;
                if (s->dirs & MXS_ROWWISE) {
                    if (in)
                        cr_assert_eq(b->data[0][k], g->ref[w].row_data[k], "%s: rank %d w%d row byte %ld", what, q, w,
                                     (long)k);
                    else
                        cr_assert_eq(b->data[0][k], T_POISON, "%s: rank %d w%d row byte %ld outside the shard", what, q,
                                     w, (long)k);
                }
                if (!g->items[q][w].col_stage || in) continue;
                cr_assert_eq(b->stage[k], T_POISON, "%s: rank %d w%d stage byte %ld outside the shard", what, q, w,
                             (long)k);
            }
            if (!g->items[q][w].col_stage) cr_assert(t_all_poisoned(b->stage, (size_t)g->dbytes[w]));
        }
}

/* After gather and finish: every rank's primary equals the reference. */
static inline void check_final(const group *g) {
    int q, w, p;
    for (q = 0; q < g->R; q++)
        for (w = 0; w < g->nw; w++) {
            const rbuf *b = &g->rb[q][w];
            const wspec *s = &g->w[w];
            cr_assert_eq(amax_bits(b->amax), mxs_f32_bits(g->ref_amax[w]));
            for (p = 0; p < 2; p++) {
                const uint8_t *rd = p ? g->ref[w].col_data : g->ref[w].row_data;
                const uint8_t *rs = p ? g->ref[w].col_scale : g->ref[w].row_scale;
                cr_assert(t_guard_ok(b->data[p], (size_t)g->dbytes[w]) &&
                              t_guard_ok(b->scale[p], (size_t)g->sbytes[w][p]),
                          "%s: guard bytes", what);
                if (!(s->dirs & (unsigned)(p + 1))) continue;
                cr_assert_eq(t_first_diff(b->data[p], rd, (size_t)g->dbytes[w]), -1,
                             "%s: rank %d w%d (%ldx%ld dirs %u block %d) plane %d data differs at byte %ld", what, q, w,
                             (long)s->rows, (long)s->cols, s->dirs, s->block, p,
                             (long)t_first_diff(b->data[p], rd, (size_t)g->dbytes[w]));
                cr_assert_eq(t_first_diff(b->scale[p], rs, (size_t)g->sbytes[w][p]), -1);
            }
            cr_assert(t_guard_ok(b->stage, (size_t)g->dbytes[w]) && t_guard_ok(b->amax, 4));
            cr_assert(t_guard_ok(b->master, (size_t)(b->shard.count * mxs_dtype_bytes(s->mdt))));
        }
    for (q = 0; q < g->R; q++) cr_assert(t_guard_ok(g->packed[q], (size_t)g->plan[q].packed_bytes));
}

/* One writeback of the group; `poisoned`: outputs were poisoned before. */
static inline void group_step(group *g, int poisoned) {
    int q, w, p;
    int64_t calls = g->reduce_calls;
    for (q = 0; q < g->R; q++) {
        mxs_status s = mxs_host_nvfp4_wb_partial(&g->batch[q], &g->plan[q], g->packed[q]);
        cr_assert_eq(s, MXS_OK, "%s: partial: %s", what, mxs_status_str(s));
        cr_assert_eq(g->packed[q][g->plan[q].status_offset], 0);
    }
    if (poisoned) /* partial writes only the packed buffer */
        for (q = 0; q < g->R; q++)
            for (w = 0; w < g->nw; w++) {
                for (p = 0; p < 2; p++)
                    cr_assert(t_all_poisoned(g->rb[q][w].data[p], (size_t)g->dbytes[w]) &&
                              t_all_poisoned(g->rb[q][w].scale[p], (size_t)g->sbytes[w][p]));
                cr_assert(t_all_poisoned(g->rb[q][w].stage, (size_t)g->dbytes[w]) &&
                          t_all_poisoned(g->rb[q][w].amax, 4));
            }
    group_reduce(g);
    check_amax_entries(g);
    for (q = 0; q < g->R; q++) {
        mxs_status s = mxs_host_nvfp4_wb_apply(&g->batch[q], &g->plan[q], g->packed[q]);
        cr_assert_eq(s, MXS_OK, "%s: apply: %s", what, mxs_status_str(s));
    }
    cr_assert_eq(g->reduce_calls - calls, 1, "%s: ONE reduction per bucket", what);
    if (poisoned) check_after_apply(g);
    group_gather(g);
    for (q = 0; q < g->R; q++) cr_assert_eq(mxs_host_nvfp4_wb_finish(&g->batch[q], &g->plan[q]), MXS_OK);
    check_final(g);
}

#endif /* MXSHARD_TESTS_CPU_NVFP4_WRITEBACK_GROUP_H */
