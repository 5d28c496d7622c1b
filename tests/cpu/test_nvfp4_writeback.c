/* SPDX-License-Identifier: MIT */
/* docs/contract.md section 9.8: the NVFP4 sharded writeback. R simulated
 * ranks (1..5) in one process, each with its own primaries, master shards,
 * column stages and packed buffer: partial -> ONE MAX reduction of the packed
 * entries (by hand, counted) -> apply -> byte gather by the shards' byte
 * ranges (by hand) -> finish. Every rank's primary must equal a whole-tensor
 * mxs_host_nvfp4_quantize byte for byte (data, scales, amax), over random
 * shapes, shardings (bucket, random even cuts, replicas, overlaps, empty),
 * plane sets, block shapes, layouts, master dtypes and round-throughs, on two
 * updates of the same buffers. Outputs are poisoned and guarded; rejected
 * calls write nothing; a rank-local failure turns into MXS_ERR_REMOTE on
 * every other rank. */
#define _POSIX_C_SOURCE 200809L
#include <criterion/criterion.h>
#include <pthread.h>
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
static int64_t rdim(t_rng *r, int64_t max) {
    int64_t d;
    switch (t_below(r, 4)) {
    case 0: d = 1; break;
    case 1: d = t_between(r, 1, 40); break;
    case 2: d = 16 * t_between(r, 1, 6) + t_between(r, -1, 1); break;
    default: d = t_between(r, 1, max); break;
    }
    return d < 1 ? 1 : (d > max ? max : d);
}

static int64_t even_between(t_rng *r, int64_t lo, int64_t hi) { /* an even value in [lo, hi], lo, hi even */
    return lo + 2 * t_below(r, (hi - lo) / 2 + 1);
}

static void set_primary(mxs_nvfp4_tensor *t, const wspec *w, uint8_t *data[2], uint8_t *scale[2], uint8_t *amax) {
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
static void make_shards(group *g, t_rng *rng, int64_t used) {
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

static void group_make(group *g, t_rng *rng, int R, int sharding) {
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

static void group_free(group *g) {
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
static void group_fill(group *g, t_rng *rng) {
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

static void group_poison(group *g) {
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
static void group_reduce(group *g) {
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
static void check_amax_entries(group *g) {
    mxs_nvfp4_wb_slot sl[MAXW];
    mxs_nvfp4_wb_plan plan;
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
static void byte_range(mxs_range s, int64_t *b0, int64_t *b1) {
    *b0 = s.first / 2;
    *b1 = (s.first + s.count + 1) / 2;
}

/* The parameter all-gather, by hand: every rank's byte range of the row-wise
 * plane and of the column stage to every other rank. */
static void group_gather(group *g) {
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

static uint32_t amax_bits(const uint8_t *p) {
    float a;
    memcpy(&a, p, 4);
    return mxs_f32_bits(a);
}

/* After apply (poisoned before partial): the complete scales and the amax of
 * the reference; the shard's bytes of the row-wise plane and of the stage
 * written (row-wise: the reference's bytes), every other data byte poisoned;
 * the column-wise data plane and absent planes untouched. */
static void check_after_apply(const group *g) {
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
static void check_final(const group *g) {
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
static void group_step(group *g, int poisoned) {
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

Test(nvfp4_writeback, equals_whole_tensor_quantize_on_every_rank, .timeout = 120) {
    t_rng rng = t_rng_seed(0x4E5646);
    int it, n = 0, combos = 0, k, no_stage = 0, wide = 0;
    static const int ncombo = 3 * 2 * 3 * 3 * 3; /* dirs x block x layout x master dtype x round-through */
    unsigned char seen[3 * 2 * 3 * 3 * 3];
    memset(seen, 0, sizeof seen);
    for (it = 0; it < 1500; it++) {
        group g;
        int R = 1 + it % MAXR, sh = (it / MAXR) % SH_KINDS;
        snprintf(what, sizeof what, "case %d (R=%d, %s)", it, R, sh_name[sh]);
        group_make(&g, &rng, R, sh);
        snprintf(what, sizeof what,
                 "case %d (R=%d, %s, rt %d, w0 %ldx%ld dirs %u block %d layout %d dtype %d stage %d)", it, R,
                 sh_name[sh], (int)g.rt, (long)g.w[0].rows, (long)g.w[0].cols, g.w[0].dirs, g.w[0].block, g.w[0].layout,
                 (int)g.w[0].mdt, g.w[0].stage);
        /* update 1: poisoned outputs; update 2: the same buffers, stale bytes, same plan */
        group_fill(&g, &rng);
        group_poison(&g);
        group_step(&g, 1);
        group_fill(&g, &rng);
        group_step(&g, 0);
        cr_assert_eq(g.reduce_calls, 2);
        cr_assert_eq(g.reduce_entries, 2 * g.plan[0].packed_count);
        for (k = 0; k < g.nw; k++) {
            const wspec *w = &g.w[k];
            seen[(((((int)w->dirs - 1) * 2 + w->block) * 3 + w->layout) * 3 + (int)w->mdt) * 3 + (int)g.rt] = 1;
            no_stage += !w->stage;
            wide += w->cols > MXS__NVFP4_WB_COLS;
        }
        n += g.nw;
        group_free(&g);
    }
    for (k = 0; k < ncombo; k++) combos += seen[k];
    cr_assert_eq(combos, ncombo, "every plane set, block, layout, dtype and round-through is met");
    cr_assert(no_stage > 50 && wide > 50, "%d weights without a stage, %d with several column passes", no_stage, wide);
    cr_assert_gt(n, 1500);
}

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

/* A fixture: one rank, items with poisoned, guarded buffers. */
typedef struct one {
    mxs_nvfp4_wb_item items[3];
    mxs_nvfp4_wb_batch batch;
    uint8_t *bufs[3][8];
    int64_t sizes[3][8];
    uint8_t *packed;
    int64_t packed_bytes;
} one;

/* Item k: rows x cols, dirs, block, layout COMPACT, f32 master of the whole
 * weight, stage. Buffers: 0 row data, 1 row scale, 2 col data, 3 col scale,
 * 4 stage, 5 amax, 6 master, 7 a spare output (a fragment, when a test gives
 * one). */
static void one_item(one *o, int k, int64_t rows, int64_t cols, unsigned dirs, int block) {
    mxs_nvfp4_wb_item *it = &o->items[k];
    mxs_nvfp4_tensor both;
    int64_t db = (rows * cols + 1) / 2, i;
    int b;
    memset(&both, 0, sizeof both);
    both.rows = rows;
    both.cols = cols;
    both.dirs = MXS_BOTH;
    both.scale_layout = MXS_SCALES_SWIZZLED; /* room for any layout */
    o->sizes[k][0] = o->sizes[k][2] = o->sizes[k][4] = db;
    o->sizes[k][1] = mxs_nvfp4_scale_bytes(&both, MXS_ROWWISE);
    o->sizes[k][3] = mxs_nvfp4_scale_bytes(&both, MXS_COLWISE);
    o->sizes[k][5] = 4;
    o->sizes[k][6] = rows * cols * 4;
    o->sizes[k][7] = db;
    for (b = 0; b < 8; b++) o->bufs[k][b] = t_alloc((size_t)o->sizes[k][b]);
    for (i = 0; i < rows * cols; i++) ((float *)(void *)o->bufs[k][6])[i] = (float)((i * 37) % 23) - 11.0f;
    memset(it, 0, sizeof *it);
    it->primary.rows = rows;
    it->primary.cols = cols;
    it->primary.dirs = dirs;
    it->primary.block = (mxs_nvfp4_block)block;
    it->primary.row_data = o->bufs[k][0];
    it->primary.row_scale = o->bufs[k][1];
    it->primary.col_data = o->bufs[k][2];
    it->primary.col_scale = o->bufs[k][3];
    it->col_stage = (dirs & MXS_COLWISE) ? o->bufs[k][4] : NULL;
    it->primary.amax = (float *)(void *)o->bufs[k][5];
    it->master = o->bufs[k][6];
    it->master_dtype = MXS_F32;
    it->start = 0;
    it->len = rows * cols;
}

static void one_make(one *o) {
    memset(o, 0, sizeof *o);
    one_item(o, 0, 20, 33, MXS_BOTH, MXS_NVFP4_1X16);
    one_item(o, 1, 17, 40, MXS_ROWWISE, MXS_NVFP4_16X16);
    one_item(o, 2, 9, 5, MXS_COLWISE, MXS_NVFP4_1X16);
    o->batch.items = o->items;
    o->batch.n_items = 3;
    o->batch.round_through = MXS_BF16;
    o->packed_bytes = 4096;
    o->packed = t_alloc((size_t)o->packed_bytes);
}

static void one_free(one *o) {
    int k, b;
    for (k = 0; k < 3; k++)
        for (b = 0; b < 8; b++) free(o->bufs[k][b]);
    free(o->packed);
}

static int one_untouched(const one *o) { /* every output still poisoned (masters are inputs) */
    int k, b;
    for (k = 0; k < 3; k++)
        for (b = 0; b < 8; b++)
            if (b != 6 && !t_all_poisoned(o->bufs[k][b], (size_t)o->sizes[k][b])) return 0;
    return 1;
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

/* ---- validation --------------------------------------------------------------- */

typedef struct mutation {
    const char *name;
    mxs_status want;
} mutation;

/* Applies mutation k to a fresh fixture (after its plan was made). */
static void mutate(one *o, int k, mxs_nvfp4_wb_plan *plan) {
    mxs_nvfp4_wb_item *a = &o->items[0], *c = &o->items[2];
    switch (k) {
    case 0: o->batch.round_through = (mxs_dtype)7; break;
    case 1: a->primary.rows = 0; break;
    case 2: a->primary.rows = a->primary.cols = INT64_MAX / 2; break;
    case 3: a->primary.dirs = 0; break;
    case 4: a->primary.dirs = 4; break;
    case 5: a->primary.scale_layout = (mxs_scale_layout)9; break;
    case 6: a->primary.block = (mxs_nvfp4_block)5; break;
    case 7: a->primary.amax = NULL; break;
    case 8: a->primary.row_scale = NULL; break;
    case 9: a->col_stage = NULL; break;                    /* 1x16 with a column-wise plane needs its stage */
    case 10: o->items[1].col_stage = o->bufs[1][4]; break; /* stage for a row-only primary */
    case 11: a->master = NULL; break;
    case 12: a->master_dtype = (mxs_dtype)9; break;
    case 13: a->start = -2; break;
    case 14: a->len += 2; break;
    case 15: a->start = 3, a->len = 100; break;
    case 16: a->col_stage = (uint8_t *)(uintptr_t)a->master + 16; break; /* stage inside the master */
    case 17: a->primary.row_scale = a->primary.col_data + 8; break;
    case 18:
        a->master = o->items[1].primary.row_data;
        a->len = 8;
        break;                                         /* another item's output */
    case 19: c->primary.amax = a->primary.amax; break; /* two items, one amax */
    case 20: c->col_stage = o->items[1].primary.row_scale; break;
    case 21: plan->packed_bytes += 2; break;                    /* an edited plan */
    case 22: a->master = (const uint8_t *)a->master + 4; break; /* valid, not planned */
    case 23: o->batch.n_items = 2; break;
    /* fragments (contract 9.8): a = 20 x 33 1x16 both planes, whole shard;
     * items[1] 16x16 row-only; c 1x16 column-only */
    case 24: c->row_fragment = o->bufs[2][7]; break;            /* no row-wise plane */
    case 25: o->items[1].stage_fragment = o->bufs[1][7]; break; /* no column-wise plane */
    case 26: a->primary.row_data = NULL; break;                 /* no row data, no fragment */
    case 27:
        a->stage_fragment = o->bufs[0][7];
        a->primary.row_data = NULL; /* the row-wise plane still needs data or a fragment */
        break;
    case 28: a->row_fragment = (uint8_t *)(uintptr_t)a->master + 12; break; /* over the master */
    case 29: a->row_fragment = a->primary.col_scale + 3; break;             /* over a scale plane */
    case 30: a->stage_fragment = o->items[1].primary.row_data + 1; break;   /* over another item's data */
    case 31:
        a->row_fragment = o->bufs[0][7];
        a->stage_fragment = o->bufs[0][7] + 100; /* 330-byte fragments: the two overlap */
        break;
    case 32: a->row_fragment = a->primary.row_data; break; /* the item's own slice of its kept plane */
    case 33:
        a->row_fragment = o->bufs[0][7]; /* with fragments, an odd start is still odd */
        a->start = 3;
        a->len = 100;
        break;
    case 34: /* a fragment over the amax of another item */
        a->stage_fragment = (uint8_t *)(void *)o->items[2].primary.amax;
        break;
    case 35: a->primary.col_data = NULL; break;                 /* column values in place: col_data needed */
    case 36: o->items[2].stage_fragment = o->bufs[2][7]; break; /* valid, but not planned */
    default: break;
    }
}

static const mutation mutations[] = {
    {"bad round-through", MXS_ERR_INVALID_ARGUMENT},
    {"rows 0", MXS_ERR_SHAPE},
    {"rows*cols overflows", MXS_ERR_OVERFLOW},
    {"dirs 0", MXS_ERR_INVALID_ARGUMENT},
    {"dirs 4", MXS_ERR_INVALID_ARGUMENT},
    {"bad layout", MXS_ERR_INVALID_ARGUMENT},
    {"bad block", MXS_ERR_INVALID_ARGUMENT},
    {"NULL amax", MXS_ERR_INVALID_ARGUMENT},
    {"NULL row scale", MXS_ERR_ABSENT_PLANE},
    {"NULL stage (1x16)", MXS_ERR_ABSENT_PLANE},
    {"stage of a row-only primary", MXS_ERR_ABSENT_PLANE},
    {"NULL master", MXS_ERR_INVALID_ARGUMENT},
    {"bad master dtype", MXS_ERR_INVALID_ARGUMENT},
    {"negative start", MXS_ERR_RANGE},
    {"shard past the end", MXS_ERR_RANGE},
    {"odd start", MXS_ERR_RANGE},
    {"stage inside the master", MXS_ERR_ALIASING},
    {"row scales over column data", MXS_ERR_ALIASING},
    {"master over another item's data", MXS_ERR_ALIASING},
    {"two items share an amax", MXS_ERR_ALIASING},
    {"stage over another item's scales", MXS_ERR_ALIASING},
    {"edited plan", MXS_ERR_PLAN_MISMATCH},
    {"batch changed after planning", MXS_ERR_PLAN_MISMATCH},
    {"item count changed", MXS_ERR_PLAN_MISMATCH},
    {"row fragment without a row-wise plane", MXS_ERR_ABSENT_PLANE},
    {"stage fragment without a column-wise plane", MXS_ERR_ABSENT_PLANE},
    {"NULL row data and no row fragment", MXS_ERR_ABSENT_PLANE},
    {"a stage fragment does not replace the row data", MXS_ERR_ABSENT_PLANE},
    {"row fragment over the master", MXS_ERR_ALIASING},
    {"row fragment over a scale plane", MXS_ERR_ALIASING},
    {"stage fragment over another item's data", MXS_ERR_ALIASING},
    {"two fragments overlap", MXS_ERR_ALIASING},
    {"row fragment inside the item's own kept plane", MXS_ERR_ALIASING},
    {"odd start with a fragment", MXS_ERR_RANGE},
    {"stage fragment over another item's amax", MXS_ERR_ALIASING},
    {"NULL column data without a stage fragment", MXS_ERR_ABSENT_PLANE},
    {"a fragment added after planning", MXS_ERR_PLAN_MISMATCH},
};

Test(nvfp4_writeback, bad_input_is_rejected_before_any_write) {
    int k;
    for (k = 0; k < (int)(sizeof mutations / sizeof mutations[0]); k++) {
        one o;
        mxs_nvfp4_wb_plan plan, p2;
        mxs_status s;
        one_make(&o);
        cr_assert_eq(mxs_nvfp4_wb_make_plan(&o.batch, &plan, NULL), MXS_OK);
        mutate(&o, k, &plan);
        if (mutations[k].want != MXS_ERR_PLAN_MISMATCH) {
            s = mxs_nvfp4_wb_make_plan(&o.batch, &p2, NULL);
            cr_assert_eq(s, mutations[k].want, "%s: make_plan gave %s", mutations[k].name, mxs_status_str(s));
        }
        s = mxs_host_nvfp4_wb_partial(&o.batch, &plan, o.packed);
        cr_assert_eq(s, mutations[k].want, "%s: partial gave %s", mutations[k].name, mxs_status_str(s));
        s = mxs_host_nvfp4_wb_apply(&o.batch, &plan, o.packed);
        cr_assert_eq(s, mutations[k].want, "%s: apply gave %s", mutations[k].name, mxs_status_str(s));
        s = mxs_host_nvfp4_wb_finish(&o.batch, &plan);
        cr_assert_eq(s, mutations[k].want, "%s: finish gave %s", mutations[k].name, mxs_status_str(s));
        cr_assert(one_untouched(&o), "%s: an output was written", mutations[k].name);
        cr_assert(t_all_poisoned(o.packed, (size_t)o.packed_bytes), "%s: packed written", mutations[k].name);
        one_free(&o);
    }
}

Test(nvfp4_writeback, bad_packed_buffers_and_null_arguments) {
    one o;
    mxs_nvfp4_wb_plan plan;
    one_make(&o);
    cr_assert_eq(mxs_nvfp4_wb_make_plan(NULL, &plan, NULL), MXS_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mxs_nvfp4_wb_make_plan(&o.batch, NULL, NULL), MXS_ERR_INVALID_ARGUMENT);
    o.batch.n_items = -1;
    cr_assert_eq(mxs_nvfp4_wb_make_plan(&o.batch, &plan, NULL), MXS_ERR_INVALID_ARGUMENT);
    o.batch.n_items = 3;
    o.batch.items = NULL;
    cr_assert_eq(mxs_nvfp4_wb_make_plan(&o.batch, &plan, NULL), MXS_ERR_INVALID_ARGUMENT);
    o.batch.items = o.items;
    cr_assert_eq(mxs_nvfp4_wb_make_plan(&o.batch, &plan, NULL), MXS_OK);
    cr_assert_eq(mxs_host_nvfp4_wb_partial(&o.batch, &plan, NULL), MXS_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mxs_host_nvfp4_wb_partial(&o.batch, &plan, o.packed + 1), MXS_ERR_INVALID_ARGUMENT); /* misaligned */
    cr_assert_eq(mxs_host_nvfp4_wb_partial(&o.batch, NULL, o.packed), MXS_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mxs_host_nvfp4_wb_apply(&o.batch, &plan, o.packed + 1), MXS_ERR_INVALID_ARGUMENT);
    /* the packed buffer over an output, over a master */
    cr_assert_eq(mxs_host_nvfp4_wb_partial(&o.batch, &plan, o.items[0].primary.col_scale), MXS_ERR_ALIASING);
    cr_assert_eq(mxs_host_nvfp4_wb_apply(&o.batch, &plan, (void *)(uintptr_t)o.items[2].master), MXS_ERR_ALIASING);
    cr_assert(one_untouched(&o));
    cr_assert(t_all_poisoned(o.packed, (size_t)o.packed_bytes));
    cr_assert_eq(mxs_nvfp4_wb_check_buffer(&o.batch, o.items[1].col_stage, 4), MXS_OK); /* absent plane: ignored */
    cr_assert_eq(mxs_nvfp4_wb_check_buffer(&o.batch, o.packed, 4), MXS_OK);
    cr_assert_eq(mxs_host_nvfp4_wb_writeback(&o.batch, &plan, o.packed, NULL, NULL), MXS_ERR_INVALID_ARGUMENT);
    one_free(&o);
}

Test(nvfp4_writeback, apply_after_a_failed_rank_writes_nothing) {
    one o;
    mxs_nvfp4_wb_plan plan;
    one_make(&o);
    cr_assert_eq(mxs_nvfp4_wb_make_plan(&o.batch, &plan, NULL), MXS_OK);
    cr_assert_eq(mxs_host_nvfp4_wb_partial(&o.batch, &plan, o.packed), MXS_OK);
    cr_assert(one_untouched(&o));
    o.packed[plan.status_offset] = 1; /* as after a MAX with a failed rank */
    cr_assert_eq(mxs_host_nvfp4_wb_apply(&o.batch, &plan, o.packed), MXS_ERR_REMOTE);
    cr_assert(one_untouched(&o));
    o.packed[plan.status_offset] = 0;
    cr_assert_eq(mxs_host_nvfp4_wb_apply(&o.batch, &plan, o.packed), MXS_OK);
    cr_assert_eq(mxs_host_nvfp4_wb_finish(&o.batch, &plan), MXS_OK);
    one_free(&o);
}

/* ---- a rank-local failure: threads, one reduction each ---------------------- */

typedef struct tgroup {
    int R, fail_rank, fail_cb;
    pthread_barrier_t bar;
    void *bufs[MAXR];
    int64_t count, entry;
    int calls[MAXR];
    one o[MAXR];
    mxs_nvfp4_wb_plan plan[MAXR];
    mxs_status got[MAXR];
} tgroup;

typedef struct targ {
    tgroup *g;
    int q;
} targ;

static int t_reduce(void *packed, int64_t count, int64_t entry, void *user) {
    targ *a = (targ *)user;
    tgroup *g = a->g;
    int64_t i;
    int q;
    g->calls[a->q]++;
    g->bufs[a->q] = packed;
    g->count = count;
    g->entry = entry;
    pthread_barrier_wait(&g->bar);
    if (a->q == 0)
        for (i = 0; i < count; i++) {
            uint32_t m = 0;
            for (q = 0; q < g->R; q++) {
                uint32_t v = entry == 2 ? ((uint16_t *)g->bufs[q])[i] : ((uint32_t *)g->bufs[q])[i];
                m = v > m ? v : m;
            }
            for (q = 0; q < g->R; q++) {
                if (entry == 2)
                    ((uint16_t *)g->bufs[q])[i] = (uint16_t)m;
                else
                    ((uint32_t *)g->bufs[q])[i] = m;
            }
        }
    pthread_barrier_wait(&g->bar);
    return g->fail_cb;
}

static void *t_rank(void *p) {
    targ *a = (targ *)p;
    tgroup *g = a->g;
    g->got[a->q] = mxs_host_nvfp4_wb_writeback(&g->o[a->q].batch, &g->plan[a->q], g->o[a->q].packed, t_reduce, a);
    return NULL;
}

static void run_group(tgroup *g) {
    pthread_t th[MAXR];
    targ args[MAXR];
    int q;
    cr_assert_eq(pthread_barrier_init(&g->bar, NULL, (unsigned)g->R), 0);
    for (q = 0; q < g->R; q++) {
        args[q].g = g;
        args[q].q = q;
        cr_assert_eq(pthread_create(&th[q], NULL, t_rank, &args[q]), 0);
    }
    for (q = 0; q < g->R; q++) pthread_join(th[q], NULL);
    pthread_barrier_destroy(&g->bar);
}

Test(nvfp4_writeback, a_rank_local_failure_gives_remote_on_every_other_rank) {
    int R, round;
    for (R = 2; R <= 4; R++)
        for (round = 0; round < 3; round++) { /* 0: all fine; 1: rank R-1 fails; 2: the callback fails */
            tgroup *g = (tgroup *)calloc(1, sizeof *g);
            int q;
            cr_assert_not_null(g);
            g->R = R;
            g->fail_cb = round == 2;
            for (q = 0; q < R; q++) { /* row-major thirds of every weight, even cuts */
                int k;
                one_make(&g->o[q]);
                for (k = 0; k < 3; k++) {
                    int64_t n = g->o[q].items[k].len, lo = (n * q / R) & ~(int64_t)1,
                            hi = q == R - 1 ? n : (n * (q + 1) / R) & ~(int64_t)1;
                    g->o[q].items[k].start = lo;
                    g->o[q].items[k].len = hi - lo;
                    g->o[q].items[k].master = g->o[q].bufs[k][6] + 4 * lo;
                }
                cr_assert_eq(mxs_nvfp4_wb_make_plan(&g->o[q].batch, &g->plan[q], NULL), MXS_OK);
            }
            if (round == 1) g->o[R - 1].items[1].start += 1; /* changed after planning, and odd */
            run_group(g);
            for (q = 0; q < R; q++) {
                cr_assert_eq(g->calls[q], 1, "R=%d: rank %d reduced %d times", R, q, g->calls[q]);
                if (round == 0) {
                    cr_assert_eq(g->got[q], MXS_OK, "R=%d rank %d: %s", R, q, mxs_status_str(g->got[q]));
                    cr_assert_eq(g->o[q].packed[g->plan[q].status_offset], 0);
                } else if (round == 1) {
                    cr_assert_eq(g->got[q], q == R - 1 ? MXS_ERR_RANGE : MXS_ERR_REMOTE, "R=%d rank %d: %s", R, q,
                                 mxs_status_str(g->got[q]));
                    cr_assert_eq(g->o[q].packed[g->plan[q].status_offset], 1);
                    cr_assert(one_untouched(&g->o[q]), "R=%d rank %d wrote an output", R, q);
                } else {
                    cr_assert_eq(g->got[q], MXS_ERR_REDUCE);
                    cr_assert(one_untouched(&g->o[q]));
                }
            }
            if (round == 0) { /* the gather by hand, finish, and the whole-tensor reference */
                int k, p;
                for (k = 0; k < 3; k++)
                    for (q = 0; q < R; q++)
                        for (p = 0; p < R; p++) {
                            const mxs_nvfp4_wb_item *src = &g->o[p].items[k];
                            int64_t b0 = src->start / 2, b1 = (src->start + src->len + 1) / 2;
                            if (p == q || src->len == 0) continue;
                            if (src->primary.dirs & MXS_ROWWISE)
                                memcpy(g->o[q].items[k].primary.row_data + b0, src->primary.row_data + b0,
                                       (size_t)(b1 - b0));
                            if (src->col_stage)
                                memcpy(g->o[q].items[k].col_stage + b0, src->col_stage + b0, (size_t)(b1 - b0));
                        }
                for (q = 0; q < R; q++) cr_assert_eq(mxs_host_nvfp4_wb_finish(&g->o[q].batch, &g->plan[q]), MXS_OK);
                for (k = 0; k < 3; k++) {
                    uint8_t *rd[2], *rs[2], ra[4];
                    mxs_nvfp4_tensor ref = g->o[0].items[k].primary;
                    const int64_t db = g->o[0].sizes[k][0];
                    for (p = 0; p < 2; p++) {
                        rd[p] = t_alloc((size_t)db);
                        rs[p] = t_alloc((size_t)g->o[0].sizes[k][1 + 2 * p]);
                    }
                    ref.row_data = rd[0];
                    ref.col_data = rd[1];
                    ref.row_scale = rs[0];
                    ref.col_scale = rs[1];
                    ref.amax = (float *)(void *)ra;
                    cr_assert_eq(mxs_host_nvfp4_quantize(&ref, g->o[0].bufs[k][6], MXS_F32, MXS_BF16), MXS_OK);
                    for (q = 0; q < R; q++) {
                        const mxs_nvfp4_tensor *t = &g->o[q].items[k].primary;
                        cr_assert_eq(amax_bits((const uint8_t *)t->amax), amax_bits(ra));
                        if (t->dirs & MXS_ROWWISE) {
                            cr_assert_eq(t_first_diff(t->row_data, rd[0], (size_t)db), -1);
                            cr_assert_eq(t_first_diff(t->row_scale, rs[0], (size_t)g->o[0].sizes[k][1]), -1);
                        }
                        if (t->dirs & MXS_COLWISE) {
                            cr_assert_eq(t_first_diff(t->col_data, rd[1], (size_t)db), -1);
                            cr_assert_eq(t_first_diff(t->col_scale, rs[1], (size_t)g->o[0].sizes[k][3]), -1);
                        }
                    }
                    for (p = 0; p < 2; p++) {
                        free(rd[p]);
                        free(rs[p]);
                    }
                }
            }
            for (q = 0; q < R; q++) one_free(&g->o[q]);
            free(g);
        }
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
