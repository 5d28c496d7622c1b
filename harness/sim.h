/* SPDX-License-Identifier: MIT */
/* harness/sim.h - a simulated data-parallel group, in one process.
 *
 * N ranks, each with its OWN copy of every MXFP8 primary (as in real
 * training: every data-parallel rank holds the whole quantized weight), its
 * own master shard of every weight, its own packed exponent buffer. The
 * collectives are simulated in memory and counted:
 *
 *   mxs_sim_allreduce_max_u8   elementwise MAX over the ranks' packed
 *                              buffers. The only reduce entry point, and it
 *                              takes uint8_t*: nothing else can be reduced.
 *   byte all-gather            of each PRESENT data plane (parameter sync).
 *   bf16 all-gather            of the bf16-rounded master (copy-back path),
 *                              counted separately as a high-precision exchange.
 *
 * Sharding (how the masters are split):
 *
 *   MXS_SIM_BUCKET   distributed-optimizer bucket: weights back to back in
 *                    one flat bucket, padded so nranks divides it, split
 *                    evenly (mxs_bucket_shard). Starts are unaligned and
 *                    some ranks own nothing of a weight.
 *
 *       bucket  |---- w0 ----|------- w1 -------|-- w2 --|pad|
 *       ranks   |  rank 0   |  rank 1   |  rank 2   |  rank 3 |
 *
 *   MXS_SIM_REPLICA  every rank holds the whole master of every weight.
 *   MXS_SIM_OVERLAP  bucket chunks widened by `overlap` elements on both
 *                    sides: neighbours hold the same elements.
 *   MXS_SIM_RANDOM   contiguous bucket ranges with random cut points (some
 *                    ranks empty, very uneven).
 *
 * Per update, the CPU backend runs the docs/contract.md section 4 protocol phase by
 * phase over all ranks (mxs_sim_partial, mxs_sim_reduce, mxs_sim_apply,
 * mxs_sim_gather), so a caller can time, poison and inspect between phases.
 * Every buffer the sim allocates is poisoned (0xA5) and followed by guard
 * bytes; mxs_sim_guard_damage() counts guard bytes that changed.
 *
 * Header-only; used by tests/cpu/test_sim.c, tests/cpu/test_writeback.c and
 * tools/demo.c. Not part of the installed library.
 */
#ifndef MXSHARD_HARNESS_SIM_H
#define MXSHARD_HARNESS_SIM_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <mxshard/mxshard.h>

#define MXS_SIM_POISON 0xA5u
#define MXS_SIM_GUARD_BYTES 64

/* ---- deterministic randomness (splitmix64) ------------------------------- */

typedef struct mxs_sim_rng {
    uint64_t state;
} mxs_sim_rng;

static inline uint64_t mxs_sim_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static inline uint64_t mxs_sim_next(mxs_sim_rng *r) {
    r->state += 0x9E3779B97F4A7C15ull;
    return mxs_sim_mix(r->state);
}
/* Uniform integer in [lo, hi] (inclusive). */
static inline int64_t mxs_sim_range_i(mxs_sim_rng *r, int64_t lo, int64_t hi) {
    return lo + (int64_t)(mxs_sim_next(r) % (uint64_t)(hi - lo + 1));
}
/* Uniform in [0, 1). */
static inline double mxs_sim_unit(mxs_sim_rng *r) { return (double)(mxs_sim_next(r) >> 11) * 0x1.0p-53; }
/* Hash of a tuple: the same (seed, a, b, c) gives the same value on every rank. */
static inline uint64_t mxs_sim_hash4(uint64_t seed, uint64_t a, uint64_t b, uint64_t c) {
    return mxs_sim_mix(mxs_sim_mix(mxs_sim_mix(seed ^ 0x243F6A8885A308D3ull) ^ a) + b * 0x9E3779B97F4A7C15ull + c);
}

/* ---- descriptors ----------------------------------------------------------- */

typedef struct mxs_sim_weight {
    const char *name;
    int64_t rows, cols;
    unsigned dirs; /* MXS_ROWWISE, MXS_COLWISE or MXS_BOTH */
} mxs_sim_weight;

typedef enum { MXS_SIM_BUCKET = 0, MXS_SIM_REPLICA = 1, MXS_SIM_OVERLAP = 2, MXS_SIM_RANDOM = 3 } mxs_sim_sharding;

/* Where the cast bytes go. */
typedef enum {
    MXS_SIM_INPLACE = 0,      /* into the rank's primary data planes at [start, start+len) */
    MXS_SIM_FRAGMENT = 1,     /* FSDP: into per-rank fragments; the item's data pointers are NULL */
    MXS_SIM_FRAGMENT_KEEP = 2 /* fragments, but the item keeps its data pointers (must stay untouched) */
} mxs_sim_output;

typedef struct mxs_sim_desc {
    int nranks;
    int n_weights;
    const mxs_sim_weight *weights;
    mxs_sim_sharding sharding;
    int64_t overlap; /* MXS_SIM_OVERLAP: elements each chunk reaches into each neighbour */
    mxs_scale_layout scale_layout;
    mxs_dtype master_dtype;
    mxs_rounding rounding;
    mxs_dtype round_through;
    mxs_wb_mode mode;
    mxs_sim_output output;
    int copyback; /* allocate a second bank of primaries for the BF16 copy-back */
    int specials; /* sprinkle 0, -0, NaN, inf, huge and subnormal values into the masters */
    uint64_t seed;
} mxs_sim_desc;

/* Collective traffic, counted by element type. Bytes are the size of one
 * rank's result buffer (what an NCCL call's count * sizeof(type) is). */
typedef struct mxs_sim_stats {
    int64_t reduce_calls, reduce_bytes;           /* MAX all-reduce over uint8 */
    int64_t gather_u8_calls, gather_u8_bytes;     /* byte all-gathers of quantized data planes */
    int64_t gather_bf16_calls, gather_bf16_bytes; /* bf16 all-gathers (copy-back path) */
    int64_t highprec_calls, highprec_bytes;       /* every collective whose element is wider than a byte */
} mxs_sim_stats;

typedef struct mxs_sim_rank {
    mxs_tensor *primary;    /* [n_weights] the rank's primaries as allocated (every present plane) */
    mxs_tensor *copyback;   /* [n_weights] BF16 copy-back bank, or NULL */
    void **master;          /* [n_weights] the rank's master shard: shard[w].count elements */
    mxs_range *shard;       /* [n_weights] the shard [first, first+count) of the weight */
    uint8_t **row_fragment; /* [n_weights] FSDP fragments (NULL for in-place output / absent plane) */
    uint8_t **col_fragment;
    mxs_wb_item *items; /* [n_weights] the batch this rank hands to the library */
    mxs_wb_batch batch;
    mxs_wb_plan plan;
    mxs_wb_slot *slots;
    uint8_t *packed; /* plan.packed_bytes */
} mxs_sim_rank;

typedef struct mxs__sim_alloc_rec {
    uint8_t *ptr;
    int64_t bytes;
} mxs__sim_alloc_rec;

typedef struct mxs_sim {
    mxs_sim_desc desc;
    mxs_sim_weight *weights; /* copy of desc.weights */
    int64_t *offset;         /* [n_weights] bucket offset of each weight */
    int64_t bucket_elems;    /* padded: nranks divides it */
    void **full_master;      /* [n_weights] the whole master (the union of the shards), master dtype */
    mxs_tensor *reference;   /* [n_weights] whole-tensor quantize of full_master (mxs_sim_reference) */
    mxs_sim_rank *ranks;
    mxs_sim_stats stats;
    int64_t step;               /* updates applied */
    mxs__sim_alloc_rec *allocs; /* every buffer, for the guard check */
    int64_t n_allocs, cap_allocs;
    int failed; /* an allocation failed */
} mxs_sim;

/* ---- allocation with poison and guards ------------------------------------ */

static inline uint8_t *mxs__sim_alloc(mxs_sim *sim, int64_t bytes) {
    uint8_t *p;
    if (sim->n_allocs == sim->cap_allocs) {
        int64_t cap = sim->cap_allocs ? 2 * sim->cap_allocs : 64;
        mxs__sim_alloc_rec *a = (mxs__sim_alloc_rec *)realloc(sim->allocs, (size_t)cap * sizeof *a);
        if (!a) {
            sim->failed = 1;
            return NULL;
        }
        sim->allocs = a;
        sim->cap_allocs = cap;
    }
    p = (uint8_t *)malloc((size_t)bytes + MXS_SIM_GUARD_BYTES);
    if (!p) {
        sim->failed = 1;
        return NULL;
    }
    memset(p, MXS_SIM_POISON, (size_t)bytes + MXS_SIM_GUARD_BYTES);
    sim->allocs[sim->n_allocs].ptr = p;
    sim->allocs[sim->n_allocs].bytes = bytes;
    sim->n_allocs++;
    return p;
}

/* Guard bytes (after every buffer) that no longer hold the poison. */
static inline int64_t mxs_sim_guard_damage(const mxs_sim *sim) {
    int64_t a, k, bad = 0;
    for (a = 0; a < sim->n_allocs; a++)
        for (k = 0; k < MXS_SIM_GUARD_BYTES; k++) bad += sim->allocs[a].ptr[sim->allocs[a].bytes + k] != MXS_SIM_POISON;
    return bad;
}

/* ---- master values --------------------------------------------------------- */

/* Initial master value of element i of weight w: magnitudes spread over many
 * binades (block amaxes differ), occasional specials when asked. */
static inline float mxs_sim_init_value(const mxs_sim *sim, int64_t w, int64_t i) {
    uint64_t h = mxs_sim_hash4(sim->desc.seed, (uint64_t)w, (uint64_t)i, 0);
    uint64_t region = mxs_sim_hash4(sim->desc.seed, (uint64_t)w, (uint64_t)(i / 37), 1);
    int e = (int)(region % 41) - 20 - (int)(h % 7); /* region exponent, then a few binades below */
    float mant = 1.0f + (float)((h >> 8) & 0xFFFFFF) * 0x1.0p-24f;
    float v = ldexpf(mant, e);
    if (h & (1ull << 40)) v = -v;
    if (sim->desc.specials) {
        switch ((h >> 48) % 211) {
        case 0: v = 0.0f; break;
        case 1: v = -0.0f; break;
        case 2: v = NAN; break;
        case 3: v = INFINITY; break;
        case 4: v = -INFINITY; break;
        case 5: v = 3.0e38f; break;
        case 6: v = 1.0e-40f; break;
        case 7: v = -448.0f * 1024.0f; break;
        default: break;
        }
    }
    return v;
}

/* One optimizer-like step of element i: x - lr * g(x, i, step). Pure
 * function of (value, index, step), computed in f32 then stored in the
 * master dtype, so ranks holding the same element stay identical. */
static inline float mxs_sim_step_value(const mxs_sim *sim, int64_t w, int64_t i, float x) {
    uint64_t h = mxs_sim_hash4(sim->desc.seed, (uint64_t)w, (uint64_t)i, 1000u + (uint64_t)sim->step);
    float u = (float)(h & 0xFFFF) * 0x1.0p-16f - 0.5f; /* [-0.5, 0.5) */
    float n = (float)((h >> 16) & 0xFFFF) * 0x1.0p-16f - 0.5f;
    float grad = x * u + n * 0x1.0p-12f;
    return x - 0.125f * grad;
}

static inline void mxs__sim_store(void *dst, mxs_dtype dt, int64_t k, float v) {
    if (dt == MXS_BF16)
        ((uint16_t *)dst)[k] = mxs_bf16_from_f32(v);
    else if (dt == MXS_F16)
        ((uint16_t *)dst)[k] = mxs_f16_from_f32(v);
    else
        ((float *)dst)[k] = v;
}

/* ---- sharding --------------------------------------------------------------- */

static inline void mxs__sim_shard_all(mxs_sim *sim) {
    const int n = sim->desc.nranks;
    int64_t cuts[65];
    int q, w;
    if (sim->desc.sharding == MXS_SIM_RANDOM) {
        mxs_sim_rng rng;
        rng.state = sim->desc.seed ^ 0x5EEDull;
        cuts[0] = 0;
        cuts[n] = sim->bucket_elems;
        for (q = 1; q < n; q++) cuts[q] = mxs_sim_range_i(&rng, 0, sim->bucket_elems);
        /* insertion sort of the inner cuts */
        for (q = 2; q < n; q++) {
            int64_t v = cuts[q];
            int k = q - 1;
            while (k >= 1 && cuts[k] > v) {
                cuts[k + 1] = cuts[k];
                k--;
            }
            cuts[k + 1] = v;
        }
    }
    for (q = 0; q < n; q++) {
        for (w = 0; w < sim->desc.n_weights; w++) {
            int64_t elems = sim->weights[w].rows * sim->weights[w].cols, off = sim->offset[w];
            int64_t chunk = sim->bucket_elems / n;
            mxs_range r;
            switch (sim->desc.sharding) {
            case MXS_SIM_REPLICA:
                r.first = 0;
                r.count = elems;
                break;
            case MXS_SIM_OVERLAP: {
                int64_t lo = q * chunk - sim->desc.overlap, hi = (q + 1) * chunk + sim->desc.overlap;
                r = mxs_range_in_weight(lo < 0 ? 0 : lo, hi, off, elems);
                break;
            }
            case MXS_SIM_RANDOM: r = mxs_range_in_weight(cuts[q], cuts[q + 1], off, elems); break;
            default: r = mxs_bucket_shard(off, elems, sim->bucket_elems, n, q); break;
            }
            sim->ranks[q].shard[w] = r;
        }
    }
}

/* ---- lifetime --------------------------------------------------------------- */

static inline void mxs__sim_alloc_tensor(mxs_sim *sim, mxs_tensor *t, const mxs_sim_weight *wt) {
    memset(t, 0, sizeof *t);
    t->rows = wt->rows;
    t->cols = wt->cols;
    t->dirs = wt->dirs;
    t->scale_layout = sim->desc.scale_layout;
    if (wt->dirs & MXS_ROWWISE) {
        t->row_data = mxs__sim_alloc(sim, wt->rows * wt->cols);
        t->row_scale = mxs__sim_alloc(sim, mxs_scale_bytes(t, MXS_ROWWISE));
    }
    if (wt->dirs & MXS_COLWISE) {
        t->col_data = mxs__sim_alloc(sim, wt->rows * wt->cols);
        t->col_scale = mxs__sim_alloc(sim, mxs_scale_bytes(t, MXS_COLWISE));
    }
}

/* Builds rank q's batch from its buffers (items, batch options). */
static inline void mxs_sim_build_items(mxs_sim *sim, int q) {
    mxs_sim_rank *rk = &sim->ranks[q];
    int w;
    for (w = 0; w < sim->desc.n_weights; w++) {
        mxs_wb_item *it = &rk->items[w];
        memset(it, 0, sizeof *it);
        it->primary = rk->primary[w];
        it->master = rk->master[w];
        it->master_dtype = sim->desc.master_dtype;
        it->start = rk->shard[w].first;
        it->len = rk->shard[w].count;
        it->row_fragment = rk->row_fragment[w];
        it->col_fragment = rk->col_fragment[w];
        if (sim->desc.output == MXS_SIM_FRAGMENT) {
            it->primary.row_data = NULL;
            it->primary.col_data = NULL;
        }
    }
    memset(&rk->batch, 0, sizeof rk->batch);
    rk->batch.items = rk->items;
    rk->batch.n_items = sim->desc.n_weights;
    rk->batch.rounding = sim->desc.rounding;
    rk->batch.round_through = sim->desc.round_through;
    rk->batch.mode = sim->desc.mode;
}

static inline void mxs_sim_destroy(mxs_sim *sim) {
    int64_t a;
    int q;
    for (a = 0; a < sim->n_allocs; a++) free(sim->allocs[a].ptr);
    free(sim->allocs);
    if (sim->ranks) {
        for (q = 0; q < sim->desc.nranks; q++) {
            mxs_sim_rank *rk = &sim->ranks[q];
            free(rk->primary);
            free(rk->copyback);
            free(rk->master);
            free(rk->shard);
            free(rk->row_fragment);
            free(rk->col_fragment);
            free(rk->items);
            free(rk->slots);
        }
    }
    free(sim->ranks);
    free(sim->weights);
    free(sim->offset);
    free(sim->full_master);
    free(sim->reference);
    memset(sim, 0, sizeof *sim);
}

/* Creates the group: shards, masters (initial values), primaries (poisoned),
 * fragments, items and plans. Returns MXS_ERR_INVALID_ARGUMENT for a bad
 * descriptor or when memory runs out (sim is then destroyed). */
static inline mxs_status mxs_sim_create(mxs_sim *sim, const mxs_sim_desc *d) {
    int q, w;
    int64_t total = 0;
    memset(sim, 0, sizeof *sim);
    if (!d || d->nranks < 1 || d->nranks > 64 || d->n_weights < 0 || (d->n_weights > 0 && !d->weights))
        return MXS_ERR_INVALID_ARGUMENT;
    sim->desc = *d;
    {
        size_t nw = (size_t)(d->n_weights > 0 ? d->n_weights : 1);
        sim->weights = (mxs_sim_weight *)calloc(nw, sizeof *sim->weights);
        sim->offset = (int64_t *)calloc(nw, sizeof *sim->offset);
        sim->full_master = (void **)calloc(nw, sizeof *sim->full_master);
        sim->reference = (mxs_tensor *)calloc(nw, sizeof *sim->reference);
        sim->ranks = (mxs_sim_rank *)calloc((size_t)d->nranks, sizeof *sim->ranks);
        if (!sim->weights || !sim->offset || !sim->full_master || !sim->reference || !sim->ranks) goto fail;
        if (d->n_weights > 0) memcpy(sim->weights, d->weights, (size_t)d->n_weights * sizeof *sim->weights);
        sim->desc.weights = sim->weights;
        for (q = 0; q < d->nranks; q++) {
            mxs_sim_rank *rk = &sim->ranks[q];
            rk->primary = (mxs_tensor *)calloc(nw, sizeof *rk->primary);
            rk->copyback = d->copyback ? (mxs_tensor *)calloc(nw, sizeof *rk->copyback) : NULL;
            rk->master = (void **)calloc(nw, sizeof *rk->master);
            rk->shard = (mxs_range *)calloc(nw, sizeof *rk->shard);
            rk->row_fragment = (uint8_t **)calloc(nw, sizeof *rk->row_fragment);
            rk->col_fragment = (uint8_t **)calloc(nw, sizeof *rk->col_fragment);
            rk->items = (mxs_wb_item *)calloc(nw, sizeof *rk->items);
            rk->slots = (mxs_wb_slot *)calloc(nw, sizeof *rk->slots);
            if (!rk->primary || (d->copyback && !rk->copyback) || !rk->master || !rk->shard || !rk->row_fragment ||
                !rk->col_fragment || !rk->items || !rk->slots)
                goto fail;
        }
    }
    for (w = 0; w < d->n_weights; w++) {
        const mxs_sim_weight *wt = &sim->weights[w];
        mxs_tensor probe;
        memset(&probe, 0, sizeof probe);
        probe.rows = wt->rows;
        probe.cols = wt->cols;
        probe.dirs = wt->dirs;
        probe.scale_layout = d->scale_layout;
        if (mxs_tensor_check_shape(&probe) != MXS_OK) goto fail;
        sim->offset[w] = total;
        total += wt->rows * wt->cols;
    }
    sim->bucket_elems = mxs_round_up(total > 0 ? total : 1, d->nranks);
    mxs__sim_shard_all(sim);

    for (w = 0; w < d->n_weights; w++) {
        const mxs_sim_weight *wt = &sim->weights[w];
        int64_t i, elems = wt->rows * wt->cols, esz = mxs_dtype_bytes(d->master_dtype);
        sim->full_master[w] = mxs__sim_alloc(sim, elems * esz);
        if (sim->failed) goto fail;
        for (i = 0; i < elems; i++)
            mxs__sim_store(sim->full_master[w], d->master_dtype, i, mxs_sim_init_value(sim, w, i));
        mxs__sim_alloc_tensor(sim, &sim->reference[w], wt);
        for (q = 0; q < d->nranks; q++) {
            mxs_sim_rank *rk = &sim->ranks[q];
            mxs_range sh = rk->shard[w];
            mxs__sim_alloc_tensor(sim, &rk->primary[w], wt);
            if (d->copyback) mxs__sim_alloc_tensor(sim, &rk->copyback[w], wt);
            rk->master[w] = mxs__sim_alloc(sim, sh.count * esz);
            if (sim->failed) goto fail;
            memcpy(rk->master[w], (uint8_t *)sim->full_master[w] + sh.first * esz, (size_t)(sh.count * esz));
            if (d->output != MXS_SIM_INPLACE) {
                if (wt->dirs & MXS_ROWWISE) rk->row_fragment[w] = mxs__sim_alloc(sim, sh.count);
                if (wt->dirs & MXS_COLWISE) rk->col_fragment[w] = mxs__sim_alloc(sim, sh.count);
            }
        }
    }
    if (sim->failed) goto fail;
    for (q = 0; q < d->nranks; q++) {
        mxs_sim_rank *rk = &sim->ranks[q];
        mxs_status s;
        mxs_sim_build_items(sim, q);
        if ((s = mxs_wb_make_plan(&rk->batch, &rk->plan, rk->slots)) != MXS_OK) {
            mxs_sim_destroy(sim);
            return s;
        }
        rk->packed = mxs__sim_alloc(sim, rk->plan.packed_bytes);
        if (sim->failed) goto fail;
    }
    return MXS_OK;
fail:
    mxs_sim_destroy(sim);
    return MXS_ERR_INVALID_ARGUMENT;
}

/* ---- collectives (simulated, counted) -------------------------------------- */

/* All-reduce MAX over uint8: bufs[q] is rank q's buffer of `bytes` bytes; on
 * return every buffer holds the elementwise maximum. The only reduction the
 * sim offers, and its element type is uint8_t. */
static inline void mxs_sim_allreduce_max_u8(mxs_sim *sim, uint8_t *const *bufs, int64_t bytes) {
    int64_t k;
    int q, n = sim->desc.nranks;
    for (k = 0; k < bytes; k++) {
        uint8_t m = 0;
        for (q = 0; q < n; q++) m = bufs[q][k] > m ? bufs[q][k] : m;
        for (q = 0; q < n; q++) bufs[q][k] = m;
    }
    sim->stats.reduce_calls++;
    sim->stats.reduce_bytes += bytes;
}

/* Byte all-gather of one data plane of weight w: every rank's shard slice
 * (from its fragment, or from its own plane at [start, start+len)) lands in
 * every rank's plane. Overlapping slices carry identical bytes. */
static inline void mxs__sim_allgather_plane_u8(mxs_sim *sim, int w, mxs_dirs plane) {
    int src, dst, n = sim->desc.nranks;
    for (src = 0; src < n; src++) {
        const mxs_sim_rank *rs = &sim->ranks[src];
        mxs_range sh = rs->shard[w];
        const uint8_t *from;
        if (sh.count == 0) continue;
        if (plane == MXS_ROWWISE)
            from = rs->row_fragment[w] ? rs->row_fragment[w] : rs->primary[w].row_data + sh.first;
        else
            from = rs->col_fragment[w] ? rs->col_fragment[w] : rs->primary[w].col_data + sh.first;
        for (dst = 0; dst < n; dst++) {
            uint8_t *to =
                (plane == MXS_ROWWISE ? sim->ranks[dst].primary[w].row_data : sim->ranks[dst].primary[w].col_data) +
                sh.first;
            if (to != from) memmove(to, from, (size_t)sh.count);
        }
    }
    sim->stats.gather_u8_calls++;
    sim->stats.gather_u8_bytes += sim->weights[w].rows * sim->weights[w].cols;
}

/* ---- the protocol, one phase over all ranks ---------------------------------- */

/* Step 1 on every rank; MXS_ERR_PLAN_MISMATCH when the fingerprints differ. */
static inline mxs_status mxs_sim_plan(mxs_sim *sim) {
    int q;
    mxs_status s;
    for (q = 0; q < sim->desc.nranks; q++) {
        mxs_sim_rank *rk = &sim->ranks[q];
        mxs_sim_build_items(sim, q);
        if ((s = mxs_wb_make_plan(&rk->batch, &rk->plan, rk->slots)) != MXS_OK) return s;
        if (rk->plan.fingerprint != sim->ranks[0].plan.fingerprint ||
            rk->plan.packed_bytes != sim->ranks[0].plan.packed_bytes)
            return MXS_ERR_PLAN_MISMATCH;
    }
    return MXS_OK;
}

static inline mxs_status mxs_sim_partial(mxs_sim *sim) {
    int q;
    mxs_status s;
    for (q = 0; q < sim->desc.nranks; q++) {
        mxs_sim_rank *rk = &sim->ranks[q];
        if ((s = mxs_host_wb_partial(&rk->batch, &rk->plan, rk->packed)) != MXS_OK) return s;
    }
    return MXS_OK;
}

/* Step 3: the one collective of the writeback. */
static inline mxs_status mxs_sim_reduce(mxs_sim *sim) {
    uint8_t *bufs[64];
    int q;
    for (q = 0; q < sim->desc.nranks; q++) bufs[q] = sim->ranks[q].packed;
    mxs_sim_allreduce_max_u8(sim, bufs, sim->ranks[0].plan.packed_bytes);
    return MXS_OK;
}

static inline mxs_status mxs_sim_apply(mxs_sim *sim) {
    int q;
    mxs_status s;
    for (q = 0; q < sim->desc.nranks; q++) {
        mxs_sim_rank *rk = &sim->ranks[q];
        if ((s = mxs_host_wb_apply(&rk->batch, &rk->plan, rk->packed)) != MXS_OK) return s;
    }
    return MXS_OK;
}

/* Step 5: parameter sync, one byte all-gather per present data plane. */
static inline mxs_status mxs_sim_gather(mxs_sim *sim) {
    int w;
    for (w = 0; w < sim->desc.n_weights; w++) {
        if (sim->weights[w].dirs & MXS_ROWWISE) mxs__sim_allgather_plane_u8(sim, w, MXS_ROWWISE);
        if (sim->weights[w].dirs & MXS_COLWISE) mxs__sim_allgather_plane_u8(sim, w, MXS_COLWISE);
    }
    return MXS_OK;
}

/* Steps 2-5. */
static inline mxs_status mxs_sim_writeback(mxs_sim *sim) {
    mxs_status s;
    if ((s = mxs_sim_partial(sim)) != MXS_OK) return s;
    if ((s = mxs_sim_reduce(sim)) != MXS_OK) return s;
    if ((s = mxs_sim_apply(sim)) != MXS_OK) return s;
    return mxs_sim_gather(sim);
}

/* ---- optimizer step, copy-back, reference ------------------------------------- */

/* One optimizer-like update: every rank changes its own master shard (and
 * the sim its full master) with the same elementwise rule. */
static inline void mxs_sim_update(mxs_sim *sim) {
    const mxs_dtype dt = sim->desc.master_dtype;
    int q, w;
    sim->step++;
    for (w = 0; w < sim->desc.n_weights; w++) {
        int64_t i, elems = sim->weights[w].rows * sim->weights[w].cols;
        for (i = 0; i < elems; i++)
            mxs__sim_store(sim->full_master[w], dt, i,
                           mxs_sim_step_value(sim, w, i, mxs_load_f32(sim->full_master[w], dt, i)));
        for (q = 0; q < sim->desc.nranks; q++) {
            mxs_sim_rank *rk = &sim->ranks[q];
            mxs_range sh = rk->shard[w];
            for (i = 0; i < sh.count; i++)
                mxs__sim_store(rk->master[w], dt, i,
                               mxs_sim_step_value(sim, w, sh.first + i, mxs_load_f32(rk->master[w], dt, i)));
        }
    }
}

/* BF16 copy-back: each rank rounds its master shard to bf16; a bf16
 * all-gather per weight (counted as high precision) assembles the full bf16
 * weight; each rank quantizes it into its copy-back bank's existing planes. */
static inline mxs_status mxs_sim_copyback_bf16(mxs_sim *sim) {
    int q, w;
    mxs_status s = MXS_OK;
    if (!sim->desc.copyback) return MXS_ERR_INVALID_ARGUMENT;
    for (w = 0; w < sim->desc.n_weights && s == MXS_OK; w++) {
        int64_t i, elems = sim->weights[w].rows * sim->weights[w].cols;
        uint16_t *gathered = (uint16_t *)malloc((size_t)elems * sizeof(uint16_t));
        if (!gathered) return MXS_ERR_INVALID_ARGUMENT;
        for (q = 0; q < sim->desc.nranks; q++) { /* each rank contributes its rounded shard */
            const mxs_sim_rank *rk = &sim->ranks[q];
            mxs_range sh = rk->shard[w];
            for (i = 0; i < sh.count; i++)
                gathered[sh.first + i] = mxs_bf16_from_f32(mxs_load_f32(rk->master[w], sim->desc.master_dtype, i));
        }
        sim->stats.gather_bf16_calls++;
        sim->stats.gather_bf16_bytes += elems * 2;
        sim->stats.highprec_calls++;
        sim->stats.highprec_bytes += elems * 2;
        for (q = 0; q < sim->desc.nranks && s == MXS_OK; q++)
            s = mxs_host_quantize(&sim->ranks[q].copyback[w], gathered, MXS_BF16, sim->desc.rounding);
        free(gathered);
    }
    return s;
}

/* Whole-tensor quantize of every full master (with the round-through) into
 * sim->reference: what docs/contract.md section 4's invariant says every rank must hold. */
static inline mxs_status mxs_sim_reference(mxs_sim *sim) {
    int w;
    mxs_status s = MXS_OK;
    for (w = 0; w < sim->desc.n_weights && s == MXS_OK; w++) {
        int64_t i, elems = sim->weights[w].rows * sim->weights[w].cols;
        float *x = (float *)malloc((size_t)elems * sizeof(float));
        if (!x) return MXS_ERR_INVALID_ARGUMENT;
        for (i = 0; i < elems; i++) {
            float v = mxs_load_f32(sim->full_master[w], sim->desc.master_dtype, i);
            if (sim->desc.round_through == MXS_BF16)
                v = mxs_bf16_to_f32(mxs_bf16_from_f32(v));
            else if (sim->desc.round_through == MXS_F16)
                v = mxs_f16_to_f32(mxs_f16_from_f32(v));
            x[i] = v;
        }
        s = mxs_host_quantize(&sim->reference[w], x, MXS_F32, sim->desc.rounding);
        free(x);
    }
    return s;
}

static inline int64_t mxs__sim_diff(const uint8_t *a, const uint8_t *b, int64_t n) {
    int64_t k, bad = 0;
    if (!a || !b) return a == b ? 0 : n;
    for (k = 0; k < n; k++) bad += a[k] != b[k];
    return bad;
}

/* Bytes (data and scales of every present plane) of tensor t that differ
 * from the reference of weight w. */
static inline int64_t mxs_sim_diff_tensor(const mxs_sim *sim, int w, const mxs_tensor *t) {
    const mxs_tensor *ref = &sim->reference[w];
    int64_t elems = ref->rows * ref->cols, bad = 0;
    if (ref->dirs & MXS_ROWWISE) {
        bad += mxs__sim_diff(t->row_data, ref->row_data, elems);
        bad += mxs__sim_diff(t->row_scale, ref->row_scale, mxs_scale_bytes(ref, MXS_ROWWISE));
    }
    if (ref->dirs & MXS_COLWISE) {
        bad += mxs__sim_diff(t->col_data, ref->col_data, elems);
        bad += mxs__sim_diff(t->col_scale, ref->col_scale, mxs_scale_bytes(ref, MXS_COLWISE));
    }
    return bad;
}

/* Mismatching bytes over every rank and weight: bank 0 = primaries (after a
 * writeback and gather), bank 1 = copy-back bank. Call mxs_sim_reference first. */
static inline int64_t mxs_sim_compare(const mxs_sim *sim, int bank) {
    int64_t bad = 0;
    int q, w;
    for (q = 0; q < sim->desc.nranks; q++)
        for (w = 0; w < sim->desc.n_weights; w++)
            bad += mxs_sim_diff_tensor(sim, w, bank ? &sim->ranks[q].copyback[w] : &sim->ranks[q].primary[w]);
    return bad;
}

/* Bytes that differ between the two banks (writeback vs copy-back). */
static inline int64_t mxs_sim_compare_banks(const mxs_sim *sim) {
    int64_t bad = 0, elems;
    int q, w;
    if (!sim->desc.copyback) return -1;
    for (q = 0; q < sim->desc.nranks; q++)
        for (w = 0; w < sim->desc.n_weights; w++) {
            const mxs_tensor *a = &sim->ranks[q].primary[w], *b = &sim->ranks[q].copyback[w];
            elems = a->rows * a->cols;
            if (a->dirs & MXS_ROWWISE)
                bad += mxs__sim_diff(a->row_data, b->row_data, elems) +
                       mxs__sim_diff(a->row_scale, b->row_scale, mxs_scale_bytes(a, MXS_ROWWISE));
            if (a->dirs & MXS_COLWISE)
                bad += mxs__sim_diff(a->col_data, b->col_data, elems) +
                       mxs__sim_diff(a->col_scale, b->col_scale, mxs_scale_bytes(a, MXS_COLWISE));
        }
    return bad;
}

/* Sets every data plane (and fragment) of every rank to `byte`. */
static inline void mxs_sim_poison_data(mxs_sim *sim, uint8_t byte) {
    int q, w;
    for (q = 0; q < sim->desc.nranks; q++)
        for (w = 0; w < sim->desc.n_weights; w++) {
            mxs_sim_rank *rk = &sim->ranks[q];
            int64_t elems = sim->weights[w].rows * sim->weights[w].cols;
            if (rk->primary[w].row_data) memset(rk->primary[w].row_data, byte, (size_t)elems);
            if (rk->primary[w].col_data) memset(rk->primary[w].col_data, byte, (size_t)elems);
            if (rk->row_fragment[w]) memset(rk->row_fragment[w], byte, (size_t)rk->shard[w].count);
            if (rk->col_fragment[w]) memset(rk->col_fragment[w], byte, (size_t)rk->shard[w].count);
        }
}

/* Total storage of one weight's primary (data + scales of present planes). */
static inline int64_t mxs_sim_weight_bytes(const mxs_sim *sim, int w, unsigned dirs) {
    mxs_tensor t;
    memset(&t, 0, sizeof t);
    t.rows = sim->weights[w].rows;
    t.cols = sim->weights[w].cols;
    t.dirs = dirs;
    t.scale_layout = sim->desc.scale_layout;
    return mxs_tensor_storage_bytes(&t);
}

#endif /* MXSHARD_HARNESS_SIM_H */
