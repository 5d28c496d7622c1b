/* SPDX-License-Identifier: MIT */
/* tools/demo_nvfp4.c - `mxshard-demo --format nvfp4`: the NVFP4 sharded
 * writeback (<mxshard/nvfp4_writeback.h>, docs/contract.md section 9.8) on a
 * simulated data-parallel group on the CPU, and what it stores and moves
 * next to MXFP8 and BF16.
 *
 * The bucket is the demo's Llama-style one (demo_make_bucket), laid out with
 * the NVFP4 bucket helpers so every shard boundary is even (two elements
 * share a byte): each weight starts at mxs_nvfp4_bucket_place(previous end),
 * the bucket is padded to mxs_nvfp4_bucket_elems (a multiple of 2 x ranks)
 * and each rank's shard is mxs_nvfp4_bucket_shard. Every rank holds the whole
 * NVFP4 primary of every weight (TE's padded scale layout) and its FP32 master
 * shard. Per update:
 *
 *   step     new f32 master values (the optimizer's step)
 *   partial  mxs_host_nvfp4_wb_partial on every rank: uint16 block amaxes
 *            (round-through bf16, as TE casts masters)
 *   reduce   ONE MAX all-reduce of the packed uint16 entries (simulated)
 *   apply    mxs_host_nvfp4_wb_apply: global amax locally (no second
 *            reduction), every scale, the cast of the shard
 *   gather   byte all-gather of each row-wise plane (and, for 1x16 weights
 *            with both planes, of the column stage) by the ranges
 *            [start/2, ceil(end/2))
 *   finish   mxs_host_nvfp4_wb_finish: the column-wise planes by a local
 *            nibble transpose (16x16: from the row-wise plane, no stage)
 *   verify   every rank's bytes (data, scales, amax) == mxs_host_nvfp4_quantize
 *            of the whole master rounded through bf16
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mxshard/mxshard.h>

#include "demo.h"

enum { NP_STEP, NP_PARTIAL, NP_REDUCE, NP_APPLY, NP_GATHER, NP_FINISH, NP_VERIFY, NP_COUNT };
static const char *const np_names[NP_COUNT] = {"step", "partial", "reduce", "apply", "gather", "finish", "verify"};

/* One rank: its items (one per weight: the whole primary, its shard), the
 * batch, the plan and the packed buffer. */
typedef struct nv_rank {
    mxs_nvfp4_wb_item *items;
    float *amax;
    mxs_nvfp4_wb_batch batch;
    mxs_nvfp4_wb_plan plan;
    uint16_t *packed;
} nv_rank;

typedef struct nv_demo {
    const demo_opts *o;
    const mxs_sim_weight *w;
    int n, nranks;
    int64_t *offset, bucket_elems, used;
    float **master; /* the whole f32 master of each weight; rank r's shard is a slice of it */
    nv_rank *ranks;
    mxs_nvfp4_tensor *ref; /* whole-tensor quantize, the verification's reference */
    float *ref_amax;
    mxs_nvfp4_wb_slot *slots;
    int64_t reduce_calls, reduce_bytes, gather_calls, gather_bytes;
} nv_demo;

/* Deterministic master value of element i of weight w at update u, the same
 * on every rank: magnitudes over ~16 binades around 2^-6, and a zero
 * 16-element block now and then (a zero block amax). */
static float nv_master_value(uint64_t seed, int w, int u, int64_t i) {
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + (uint64_t)w * 0xBF58476D1CE4E5B9ull +
                 (uint64_t)u * 0x94D049BB133111EBull + (uint64_t)(i / 16) * 0x2545F4914F6CDD1Dull;
    uint64_t y = z + (uint64_t)(i % 16) * 0xD6E8FEB86659FD93ull;
    uint32_t bits;
    z ^= z >> 31;
    z *= 0x7FB5D329728EA185ull;
    if ((z >> 58) == 0) return 0.0f; /* 1 block in 64 */
    y ^= y >> 31;
    y *= 0x7FB5D329728EA185ull;
    y ^= y >> 27;
    y *= 0x81DADEF4BC2E2A3Bull;
    y ^= y >> 33;
    bits = (uint32_t)(y & 0x807FFFFFu) | ((uint32_t)(113 + (y >> 40) % 16) << 23);
    return mxs_f32_from_bits(bits);
}

/* Allocates the planes, scales (calloc) and stage of t / it; 0 when out of memory. */
static int nv_alloc_tensor(mxs_nvfp4_tensor *t, uint8_t **stage) {
    const int64_t db = mxs_nvfp4_data_bytes(t);
    int p;
    for (p = MXS_ROWWISE; p <= MXS_COLWISE; p++) {
        uint8_t **data = p == MXS_ROWWISE ? &t->row_data : &t->col_data;
        uint8_t **scale = p == MXS_ROWWISE ? &t->row_scale : &t->col_scale;
        if (!(t->dirs & (unsigned)p)) continue;
        *data = (uint8_t *)calloc((size_t)db, 1);
        *scale = (uint8_t *)calloc((size_t)mxs_nvfp4_scale_bytes(t, (mxs_dirs)p), 1);
        if (!*data || !*scale) return 0;
    }
    /* the column stage: 1x16 with a column-wise plane (16x16 with both planes
     * transposes the gathered row-wise plane instead) */
    if (stage && (t->dirs & MXS_COLWISE) && !(t->block == MXS_NVFP4_16X16 && (t->dirs & MXS_ROWWISE))) {
        *stage = (uint8_t *)calloc((size_t)db, 1);
        if (!*stage) return 0;
    }
    return 1;
}

static void nv_free_tensor(mxs_nvfp4_tensor *t) {
    free(t->row_data);
    free(t->row_scale);
    free(t->col_data);
    free(t->col_scale);
}

static void nv_destroy(nv_demo *d) {
    int r, w;
    if (d->ranks)
        for (r = 0; r < d->nranks; r++) {
            nv_rank *k = &d->ranks[r];
            if (k->items)
                for (w = 0; w < d->n; w++) {
                    nv_free_tensor(&k->items[w].primary);
                    free(k->items[w].col_stage);
                }
            free(k->items);
            free(k->amax);
            free(k->packed);
        }
    if (d->ref)
        for (w = 0; w < d->n; w++) nv_free_tensor(&d->ref[w]);
    if (d->master)
        for (w = 0; w < d->n; w++) free(d->master[w]);
    free(d->ranks);
    free(d->ref);
    free(d->ref_amax);
    free(d->master);
    free(d->offset);
    free(d->slots);
}

static mxs_nvfp4_tensor nv_shape(const mxs_sim_weight *w, unsigned dirs, mxs_nvfp4_block block) {
    mxs_nvfp4_tensor t;
    memset(&t, 0, sizeof t);
    t.rows = w->rows;
    t.cols = w->cols;
    t.dirs = dirs;
    t.scale_layout = MXS_SCALES_PADDED; /* TE's NVFP4 scale_inv shape */
    t.block = block;
    return t;
}

/* Lays out the bucket with even boundaries, allocates every rank's
 * primaries, stages and packed buffer, plans every rank's batch. */
static mxs_status nv_create(nv_demo *d) {
    int64_t end = 0;
    int r, w;
    mxs_status s;
    d->offset = (int64_t *)calloc((size_t)d->n, sizeof(int64_t));
    d->master = (float **)calloc((size_t)d->n, sizeof(float *));
    d->ranks = (nv_rank *)calloc((size_t)d->nranks, sizeof(nv_rank));
    d->ref = (mxs_nvfp4_tensor *)calloc((size_t)d->n, sizeof(mxs_nvfp4_tensor));
    d->ref_amax = (float *)calloc((size_t)d->n, sizeof(float));
    d->slots = (mxs_nvfp4_wb_slot *)calloc((size_t)d->n, sizeof(mxs_nvfp4_wb_slot));
    if (!d->offset || !d->master || !d->ranks || !d->ref || !d->ref_amax || !d->slots) return MXS_ERR_INVALID_ARGUMENT;
    for (w = 0; w < d->n; w++) {
        const int64_t e = d->w[w].rows * d->w[w].cols;
        d->offset[w] = mxs_nvfp4_bucket_place(end);
        end = d->offset[w] + e;
        d->master[w] = (float *)calloc((size_t)e, sizeof(float));
        d->ref[w] = nv_shape(&d->w[w], d->w[w].dirs, d->o->nvfp4_block);
        d->ref[w].amax = &d->ref_amax[w];
        if (!d->master[w] || !nv_alloc_tensor(&d->ref[w], NULL)) return MXS_ERR_INVALID_ARGUMENT;
    }
    d->used = end;
    d->bucket_elems = mxs_nvfp4_bucket_elems(end, d->nranks);
    if (d->bucket_elems < 0) return MXS_ERR_OVERFLOW;
    for (r = 0; r < d->nranks; r++) {
        nv_rank *k = &d->ranks[r];
        k->items = (mxs_nvfp4_wb_item *)calloc((size_t)d->n, sizeof(mxs_nvfp4_wb_item));
        k->amax = (float *)calloc((size_t)d->n, sizeof(float));
        if (!k->items || !k->amax) return MXS_ERR_INVALID_ARGUMENT;
        for (w = 0; w < d->n; w++) {
            mxs_nvfp4_wb_item *it = &k->items[w];
            mxs_range sh;
            const int64_t e = d->w[w].rows * d->w[w].cols;
            if ((s = mxs_nvfp4_bucket_shard(d->offset[w], e, d->bucket_elems, d->nranks, r, &sh)) != MXS_OK) return s;
            it->primary = nv_shape(&d->w[w], d->w[w].dirs, d->o->nvfp4_block);
            it->primary.amax = &k->amax[w];
            if (!nv_alloc_tensor(&it->primary, &it->col_stage)) return MXS_ERR_INVALID_ARGUMENT;
            it->master = d->master[w] + sh.first; /* this rank's slice */
            it->master_dtype = MXS_F32;
            it->start = sh.first;
            it->len = sh.count;
        }
        k->batch.items = k->items;
        k->batch.n_items = d->n;
        k->batch.round_through = MXS_BF16; /* TE's master cast; 2-byte entries */
        if ((s = mxs_nvfp4_wb_make_plan(&k->batch, &k->plan, r == 0 ? d->slots : NULL)) != MXS_OK) return s;
        k->packed = (uint16_t *)malloc((size_t)k->plan.packed_bytes);
        if (!k->packed) return MXS_ERR_INVALID_ARGUMENT;
    }
    return MXS_OK;
}

/* ---- phases ------------------------------------------------------------------- */

static void nv_step(nv_demo *d, int u) {
    int w;
    int64_t i;
    for (w = 0; w < d->n; w++) {
        const int64_t e = d->w[w].rows * d->w[w].cols;
        for (i = 0; i < e; i++) d->master[w][i] = nv_master_value(d->o->seed, w, u, i);
    }
}

/* Every rank's partial (apply 0) or apply (apply 1), in rank order. */
static mxs_status nv_each_rank(nv_demo *d, int apply) {
    int r;
    mxs_status s;
    for (r = 0; r < d->nranks; r++) {
        nv_rank *k = &d->ranks[r];
        s = apply ? mxs_host_nvfp4_wb_apply(&k->batch, &k->plan, k->packed)
                  : mxs_host_nvfp4_wb_partial(&k->batch, &k->plan, k->packed);
        if (s != MXS_OK) return s;
    }
    return MXS_OK;
}

static mxs_status nv_partial(nv_demo *d) { return nv_each_rank(d, 0); }

/* The one all-reduce: MAX over the uint16 entries of every rank's buffer. */
static mxs_status nv_reduce(nv_demo *d) {
    const int64_t cnt = d->ranks[0].plan.packed_count;
    int64_t i;
    int r;
    for (i = 0; i < cnt; i++) {
        uint16_t m = 0;
        for (r = 0; r < d->nranks; r++) m = d->ranks[r].packed[i] > m ? d->ranks[r].packed[i] : m;
        for (r = 0; r < d->nranks; r++) d->ranks[r].packed[i] = m;
    }
    d->reduce_calls++;
    d->reduce_bytes += d->ranks[0].plan.packed_bytes;
    return MXS_OK;
}

static mxs_status nv_apply(nv_demo *d) { return nv_each_rank(d, 1); }

/* All-gather of one byte buffer of weight w (0: the row-wise plane, 1: the
 * column stage): every rank's bytes [start/2, ceil(end/2)) to every rank. */
static void nv_gather_buffer(nv_demo *d, int w, int which) {
    int src, dst;
    for (src = 0; src < d->nranks; src++) {
        const mxs_nvfp4_wb_item *it = &d->ranks[src].items[w];
        const uint8_t *from = which ? it->col_stage : it->primary.row_data;
        int64_t lo = it->start / 2, hi = (it->start + it->len + 1) / 2;
        if (it->len == 0) continue;
        for (dst = 0; dst < d->nranks; dst++) {
            mxs_nvfp4_wb_item *to = &d->ranks[dst].items[w];
            if (dst != src) memcpy((which ? to->col_stage : to->primary.row_data) + lo, from + lo, (size_t)(hi - lo));
        }
    }
    d->gather_calls++;
    d->gather_bytes += mxs_nvfp4_data_plane_bytes(d->w[w].rows, d->w[w].cols);
}

static mxs_status nv_gather(nv_demo *d) {
    int w;
    for (w = 0; w < d->n; w++) {
        const mxs_nvfp4_wb_item *it = &d->ranks[0].items[w];
        if (it->primary.dirs & MXS_ROWWISE) nv_gather_buffer(d, w, 0);
        if (it->col_stage) nv_gather_buffer(d, w, 1);
    }
    return MXS_OK;
}

static mxs_status nv_finish(nv_demo *d) {
    int r;
    mxs_status s;
    for (r = 0; r < d->nranks; r++)
        if ((s = mxs_host_nvfp4_wb_finish(&d->ranks[r].batch, &d->ranks[r].plan)) != MXS_OK) return s;
    return MXS_OK;
}

static int64_t nv_diff(const uint8_t *a, const uint8_t *b, int64_t n) {
    int64_t k, bad = 0;
    for (k = 0; k < n; k++) bad += a[k] != b[k];
    return bad;
}

/* The reference quantize of every weight, then every rank's bytes against
 * it; mismatching bytes (data, scales, amax), or -1 when the reference
 * failed. */
static int64_t nv_verify(nv_demo *d) {
    int64_t bad = 0;
    int r, w, p;
    for (w = 0; w < d->n; w++)
        if (mxs_host_nvfp4_quantize(&d->ref[w], d->master[w], MXS_F32, MXS_BF16) != MXS_OK) return -1;
    for (r = 0; r < d->nranks; r++)
        for (w = 0; w < d->n; w++) {
            const mxs_nvfp4_tensor *t = &d->ranks[r].items[w].primary, *ref = &d->ref[w];
            for (p = MXS_ROWWISE; p <= MXS_COLWISE; p++) {
                if (!(ref->dirs & (unsigned)p)) continue;
                bad += nv_diff(p == MXS_ROWWISE ? t->row_data : t->col_data,
                               p == MXS_ROWWISE ? ref->row_data : ref->col_data, mxs_nvfp4_data_bytes(ref));
                bad += nv_diff(p == MXS_ROWWISE ? t->row_scale : t->col_scale,
                               p == MXS_ROWWISE ? ref->row_scale : ref->col_scale,
                               mxs_nvfp4_scale_bytes(ref, (mxs_dirs)p));
            }
            bad += nv_diff((const uint8_t *)t->amax, (const uint8_t *)ref->amax, (int64_t)sizeof(float));
        }
    return bad;
}

/* ---- accounting ------------------------------------------------------------------ */

/* Bytes of an MXFP8 primary of w with `dirs` (TE's padded scales). */
static int64_t mx_bytes(const mxs_sim_weight *w, unsigned dirs) {
    mxs_tensor t;
    memset(&t, 0, sizeof t);
    t.rows = w->rows;
    t.cols = w->cols;
    t.dirs = dirs;
    t.scale_layout = MXS_SCALES_PADDED;
    return mxs_tensor_storage_bytes(&t);
}

/* MXFP8 reduction bytes of w in mxshard's packed buffer: one uint8 per
 * 32-element block of each present plane (the compact scale count, as
 * mxs_wb_make_plan sizes it; the bucket adds one status byte). */
static int64_t mx_reduce_bytes(const mxs_sim_weight *w) {
    mxs_tensor t;
    int64_t b = 0;
    int p;
    memset(&t, 0, sizeof t);
    t.rows = w->rows;
    t.cols = w->cols;
    t.dirs = w->dirs;
    t.scale_layout = MXS_SCALES_COMPACT;
    for (p = MXS_ROWWISE; p <= MXS_COLWISE; p++)
        if (w->dirs & (unsigned)p) b += mxs_scale_bytes(&t, (mxs_dirs)p);
    return b;
}

/* NVFP4 entries of weight w in the packed buffer (the plan's slots): its
 * block regions plus its tensor-amax entry. */
static int64_t nv_entries(const nv_demo *d, int w) {
    int64_t first = -1, next;
    const mxs_nvfp4_wb_slot *s = &d->slots[w];
    const int64_t e[3] = {s->tile_entry, s->row_entry, s->col_entry};
    int k;
    for (k = 0; k < 3; k++)
        if (e[k] >= 0 && (first < 0 || e[k] < first)) first = e[k];
    if (w + 1 < d->n) {
        const mxs_nvfp4_wb_slot *t = &d->slots[w + 1];
        const int64_t f[3] = {t->tile_entry, t->row_entry, t->col_entry};
        next = -1;
        for (k = 0; k < 3; k++)
            if (f[k] >= 0 && (next < 0 || f[k] < next)) next = f[k];
    } else {
        next = d->ranks[0].plan.packed_count - 1; /* the status entry */
    }
    return next - first + 1;
}

/* TE's sharded NVFP4 master cast, per weight and step: 4 bytes (fp32 amax)
 * per 16x16 tile in one all-reduce, 4 bytes (the global amax) in a second. */
static int64_t te_nv_bytes(const mxs_sim_weight *w) {
    return 4 * mxs_ceil_div(w->rows, MXS_NVFP4_BLOCK) * mxs_ceil_div(w->cols, MXS_NVFP4_BLOCK) + 4;
}

/* NVFP4 gather bytes of w: the row-wise plane, plus the column stage for
 * 1x16 with both planes. */
static int64_t nv_gather_bytes(const nv_demo *d, int w) {
    const mxs_nvfp4_wb_item *it = &d->ranks[0].items[w];
    const int64_t pb = mxs_nvfp4_data_plane_bytes(d->w[w].rows, d->w[w].cols);
    return ((it->primary.dirs & MXS_ROWWISE) ? pb : 0) + (it->col_stage ? pb : 0);
}

static int64_t mx_gather_bytes(const mxs_sim_weight *w) {
    return w->rows * w->cols * ((w->dirs & MXS_ROWWISE ? 1 : 0) + (w->dirs & MXS_COLWISE ? 1 : 0));
}

static void progress_line(const char *label, const char *phase, int ranks, double ms) {
    printf("%-12s %-8s %3d rank%s %9.1f ms\n", label, phase, ranks, ranks == 1 ? " " : "s", ms);
}

/* ---- the run ------------------------------------------------------------------------ */

static void print_tables(const nv_demo *d) {
    const demo_opts *o = d->o;
    const char *bn = o->nvfp4_block == MXS_NVFP4_16X16 ? "16x16" : "1x16";
    int64_t nv_p = 0, nv_b = 0, mx_p = 0, mx_b = 0, bf = 0, elems = 0, stage = 0;
    int64_t r_nv = 0, r_te = 0, r_mx = 0, r_mxte = 0, g_nv = 0, g_mx = 0, g_bf = 0;
    int w, row_only = 0;
    char b[8][32];
    for (w = 0; w < d->n; w++) elems += d->w[w].rows * d->w[w].cols;
    printf("\n== mxshard-demo summary (NVFP4) ==\n");
    printf("bucket: %d weight%s, %s elements (weights at even offsets, padded to %s = a multiple of 2 x %d "
           "rank%s), distributed-optimizer sharding, every shard boundary even\n",
           d->n, demo_plural(d->n), demo_fmt_int(elems, b[0], sizeof b[0]),
           demo_fmt_int(d->bucket_elems, b[1], sizeof b[1]), d->nranks, demo_plural(d->nranks));
    printf("masters: f32, rounded through bf16; NVFP4: E2M1 elements, E4M3 scales per %s block%s, f32 global "
           "amax; padded (TE) scale layout\n\n",
           bn, o->nvfp4_block == MXS_NVFP4_16X16 ? " (tile; stored per row)" : "");

    printf("memory per rank, primaries (bytes):\n");
    printf("%-10s %13s  %-7s %13s %13s %13s %13s %13s\n", "weight", "shape", "planes", "NVFP4", "NVFP4 bidir", "MXFP8",
           "MXFP8 bidir", "BF16");
    for (w = 0; w < d->n; w++) {
        const mxs_sim_weight *x = &d->w[w];
        mxs_nvfp4_tensor t = nv_shape(x, x->dirs, o->nvfp4_block), tb = nv_shape(x, MXS_BOTH, o->nvfp4_block);
        int64_t a = mxs_nvfp4_storage_bytes(&t), a2 = mxs_nvfp4_storage_bytes(&tb), m = mx_bytes(x, x->dirs),
                m2 = mx_bytes(x, MXS_BOTH), h = 2 * x->rows * x->cols;
        char shape[40];
        snprintf(shape, sizeof shape, "%lld x %lld", (long long)x->rows, (long long)x->cols);
        printf("%-10s %13s  %-7s %13s %13s %13s %13s %13s\n", x->name, shape,
               x->dirs == MXS_ROWWISE ? "row" : "row+col", demo_fmt_int(a, b[0], sizeof b[0]),
               demo_fmt_int(a2, b[1], sizeof b[1]), demo_fmt_int(m, b[2], sizeof b[2]),
               demo_fmt_int(m2, b[3], sizeof b[3]), demo_fmt_int(h, b[4], sizeof b[4]));
        nv_p += a;
        nv_b += a2;
        mx_p += m;
        mx_b += m2;
        bf += h;
        row_only += x->dirs == MXS_ROWWISE;
        if (d->ranks[0].items[w].col_stage) stage += mxs_nvfp4_data_plane_bytes(x->rows, x->cols);
    }
    printf("%-10s %13s  %-7s %13s %13s %13s %13s %13s\n", "total", "", "", demo_fmt_int(nv_p, b[0], sizeof b[0]),
           demo_fmt_int(nv_b, b[1], sizeof b[1]), demo_fmt_int(mx_p, b[2], sizeof b[2]),
           demo_fmt_int(mx_b, b[3], sizeof b[3]), demo_fmt_int(bf, b[4], sizeof b[4]));
    printf("memory: %d of %d weights row-only; NVFP4 %s (bidirectional %s), MXFP8 %s (%s), BF16 %s per rank: NVFP4 is "
           "%.1f%% of MXFP8, %.1f%% of BF16\n",
           row_only, d->n, demo_fmt_mib(nv_p, b[0], sizeof b[0]), demo_fmt_mib(nv_b, b[1], sizeof b[1]),
           demo_fmt_mib(mx_p, b[2], sizeof b[2]), demo_fmt_mib(mx_b, b[3], sizeof b[3]),
           demo_fmt_mib(bf, b[4], sizeof b[4]), mx_p ? 100.0 * (double)nv_p / (double)mx_p : 0.0,
           bf ? 100.0 * (double)nv_p / (double)bf : 0.0);
    if (stage)
        printf("        + %s per rank of NVFP4 column stages (1x16 weights with both planes: writeback scratch)\n",
               demo_fmt_mib(stage, b[0], sizeof b[0]));
    printf("\n");

    printf("on the wire per update (bytes):\n");
    printf("%-10s %13s %13s %13s %13s %13s %13s %13s\n", "weight", "NVFP4 reduce", "TE NVFP4*", "MXFP8 reduce",
           "TE MXFP8**", "NVFP4 gather", "MXFP8 gather", "BF16 gather");
    for (w = 0; w < d->n; w++) {
        const mxs_sim_weight *x = &d->w[w];
        int64_t a = 2 * nv_entries(d, w), t = te_nv_bytes(x), m = mx_reduce_bytes(x),
                mt = demo_te_amax_bytes(x->rows, x->cols, x->dirs), gn = nv_gather_bytes(d, w), gm = mx_gather_bytes(x),
                gb = 2 * x->rows * x->cols;
        printf("%-10s %13s %13s %13s %13s %13s %13s %13s\n", x->name, demo_fmt_int(a, b[0], sizeof b[0]),
               demo_fmt_int(t, b[1], sizeof b[1]), demo_fmt_int(m, b[2], sizeof b[2]),
               demo_fmt_int(mt, b[3], sizeof b[3]), demo_fmt_int(gn, b[4], sizeof b[4]),
               demo_fmt_int(gm, b[5], sizeof b[5]), demo_fmt_int(gb, b[6], sizeof b[6]));
        r_nv += a;
        r_te += t;
        r_mx += m;
        r_mxte += mt;
        g_nv += gn;
        g_mx += gm;
        g_bf += gb;
    }
    r_nv += d->ranks[0].plan.entry_bytes; /* the status entry */
    r_mx += 1;                            /* the status byte */
    printf("%-10s %13s %13s %13s %13s %13s %13s %13s\n", "total", demo_fmt_int(r_nv, b[0], sizeof b[0]),
           demo_fmt_int(r_te, b[1], sizeof b[1]), demo_fmt_int(r_mx, b[2], sizeof b[2]),
           demo_fmt_int(r_mxte, b[3], sizeof b[3]), demo_fmt_int(g_nv, b[4], sizeof b[4]),
           demo_fmt_int(g_mx, b[5], sizeof b[5]), demo_fmt_int(g_bf, b[6], sizeof b[6]));
    printf("collectives per update: NVFP4 ONE MAX all-reduce (%s B, uint16 entries, status entry included) "
           "vs TE* TWO (%s B);\n"
           "  MXFP8 ONE uint8 MAX all-reduce (%s B); BF16 none. ",
           demo_fmt_int(r_nv, b[0], sizeof b[0]), demo_fmt_int(r_te, b[1], sizeof b[1]),
           demo_fmt_int(r_mx, b[2], sizeof b[2]));
    if (o->nvfp4_block == MXS_NVFP4_16X16)
        printf("NVFP4 reduce = %.2fx TE's bytes, %.2fx MXFP8's\n", r_te ? (double)r_nv / (double)r_te : 0.0,
               r_mx ? (double)r_nv / (double)r_mx : 0.0);
    else
        printf("NVFP4 reduce = %.2fx MXFP8's (TE has no sharded 1x16 cast:\n"
               "  its column is its 16x16 cast, for scale; 1x16 reduces one entry per 16 elements of each plane)\n",
               r_mx ? (double)r_nv / (double)r_mx : 0.0);
    printf("  NVFP4 reduce: %s, one 2-byte entry (the bf16 pattern of the block amax) per %s; sent as ncclBfloat16 by "
           "the NCCL glue (exact),\n"
           "  widened to int32 (x2 bytes) by the Python package on gloo. Global amax: local max of the reduced "
           "entries.\n",
           o->nvfp4_block == MXS_NVFP4_16X16 ? "16x16 tiles" : "1x16 blocks of each present plane",
           o->nvfp4_block == MXS_NVFP4_16X16 ? "tile (either plane set)" : "block");
    printf("  NVFP4 gather: %s\n",
           o->nvfp4_block == MXS_NVFP4_16X16
               ? "row-wise planes only; column-wise planes by a local transpose (16x16 tiles share scales)"
               : "row-wise planes + column stages of the weights with both planes; then a local transpose");
    printf(
        "  * TE's sharded NVFP4 master cast (2D 16x16 only): fp32 amax per 16x16 tile, then a per-tensor global\n"
        "    amax, in two all-reduces (as issue 18 reads TE's quantize_master_weights); shown for 16x16 tiles.\n"
        "  ** assumption, as in the MXFP8 demo: one bf16 amax per 32-element block over TE's padded scale shape.\n\n");
    printf("collectives (%d updates): all-reduce MAX uint16 %lld calls, %s bytes; all-gather uint8 %lld calls, %s "
           "bytes\n\n",
           DEMO_UPDATES, (long long)d->reduce_calls, demo_fmt_int(d->reduce_bytes, b[0], sizeof b[0]),
           (long long)d->gather_calls, demo_fmt_int(d->gather_bytes, b[1], sizeof b[1]));
}

int demo_nvfp4_run(const demo_opts *o) {
    mxs_sim_weight *weights = (mxs_sim_weight *)calloc(DEMO_MAX_WEIGHTS, sizeof(mxs_sim_weight));
    nv_demo d;
    int64_t kv, ffn, mismatch = 0;
    double ms[DEMO_UPDATES][NP_COUNT], t0;
    char who[64];
    mxs_status (*const phase_fn[5])(nv_demo *) = {nv_partial, nv_reduce, nv_apply, nv_gather, nv_finish};
    int u, p;
    char label[32];
    mxs_status s;

    if (!weights) {
        fprintf(stderr, "mxshard-demo: out of memory\n");
        return 3;
    }
    memset(&d, 0, sizeof d);
    d.o = o;
    d.nranks = o->ranks;
    d.n = demo_make_bucket(o, weights, &kv, &ffn);
    d.w = weights;
    printf("mxshard-demo: NVFP4 (%s blocks), %d rank%s (simulated, cpu), %d layer%s, hidden %lld, kv %lld, ffn %lld\n",
           o->nvfp4_block == MXS_NVFP4_16X16 ? "16x16" : "1x16", o->ranks, demo_plural(o->ranks), o->layers,
           demo_plural(o->layers), (long long)o->hidden, (long long)kv, (long long)ffn);
    t0 = demo_now_ms();
    if ((s = nv_create(&d)) != MXS_OK) {
        fprintf(stderr, "mxshard-demo: cannot set up the simulated NVFP4 group (%s; out of memory?)\n",
                mxs_status_str(s));
        nv_destroy(&d);
        free(weights);
        return 3;
    }
    progress_line("[setup]", "", o->ranks, demo_now_ms() - t0);

    for (u = 0; u < DEMO_UPDATES; u++) {
        int64_t bad;
        snprintf(label, sizeof label, "[update %d/%d]", u + 1, DEMO_UPDATES);
        t0 = demo_now_ms();
        nv_step(&d, u);
        ms[u][NP_STEP] = demo_now_ms() - t0;
        progress_line(label, "step", o->ranks, ms[u][NP_STEP]);
        for (p = 0; p < 5; p++) {
            t0 = demo_now_ms();
            s = phase_fn[p](&d);
            ms[u][NP_PARTIAL + p] = demo_now_ms() - t0;
            if (s != MXS_OK) {
                fprintf(stderr, "mxshard-demo: %s failed: %s\n", np_names[NP_PARTIAL + p], mxs_status_str(s));
                nv_destroy(&d);
                free(weights);
                return 3;
            }
            progress_line(label, np_names[NP_PARTIAL + p], o->ranks, ms[u][NP_PARTIAL + p]);
        }
        t0 = demo_now_ms();
        bad = nv_verify(&d);
        ms[u][NP_VERIFY] = demo_now_ms() - t0;
        if (bad < 0) {
            fprintf(stderr, "mxshard-demo: verification failed to run (reference quantize)\n");
            nv_destroy(&d);
            free(weights);
            return 3;
        }
        mismatch += bad;
        progress_line(label, "verify", o->ranks, ms[u][NP_VERIFY]);
    }

    print_tables(&d);
    snprintf(who, sizeof who, "%d rank%s", o->ranks, demo_plural(o->ranks));
    demo_print_phase_ms(who, np_names, NP_COUNT, &ms[0][0], 1);
    printf("\n");
    if (!mismatch)
        printf("verified: bit-exact (%d updates x %d rank%s x %d weight%s, data, scales and amax: whole-tensor NVFP4 "
               "quantize of the master rounded through bf16)\n",
               DEMO_UPDATES, o->ranks, demo_plural(o->ranks), d.n, demo_plural(d.n));
    else
        printf("verified: FAILED (%lld mismatching bytes)\n", (long long)mismatch);
    nv_destroy(&d);
    free(weights);
    return mismatch ? 1 : 0;
}
