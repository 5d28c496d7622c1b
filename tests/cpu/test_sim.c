/* SPDX-License-Identifier: MIT */
/* Suite cpu / sim: the docs/contract.md section 4 invariant through a simulated
 * data-parallel group (harness/sim.h). Every rank holds its own primaries;
 * shards come from distributed-optimizer buckets, full replicas, overlapping
 * and random cuts. After partial -> one uint8 MAX reduction -> apply ->
 * byte all-gather, every rank's data and scale bytes must equal a
 * whole-tensor mxs_host_quantize of the full master.
 */
#define _POSIX_C_SOURCE 200809L
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>

#include <mxshard/mxshard.h>

#include "sim.h"
#include "cpu/ref_blocks.h"

/* ---- checks between phases ----------------------------------------------------- */

enum { AFTER_PARTIAL = 0, AFTER_APPLY = 1 };

/* Violations of the write rules on rank q, weight w, one plane, after
 * partial or apply (data poisoned with MXS_SIM_POISON before partial):
 *  - the rank's primary plane is untouched outside [start, start+len), and
 *    wholly untouched when the output goes to a fragment;
 *  - after STRICT partial: no byte of the slice/fragment written;
 *  - after FUSED partial: exactly the elements of blocks wholly inside the
 *    shard hold their final bytes, every other one is untouched;
 *  - after apply: the whole slice/fragment holds the final bytes. */
static int64_t plane_violations(const mxs_sim *sim, int q, int w, mxs_dirs plane, int phase) {
    const mxs_sim_rank *rk = &sim->ranks[q];
    const mxs_sim_weight *wt = &sim->weights[w];
    const mxs_range sh = rk->shard[w];
    const int64_t elems = wt->rows * wt->cols, end = sh.first + sh.count;
    const uint8_t *prim = plane == MXS_ROWWISE ? rk->primary[w].row_data : rk->primary[w].col_data;
    const uint8_t *frag = plane == MXS_ROWWISE ? rk->row_fragment[w] : rk->col_fragment[w];
    const uint8_t *ref = plane == MXS_ROWWISE ? sim->reference[w].row_data : sim->reference[w].col_data;
    const int inplace = sim->desc.output == MXS_SIM_INPLACE;
    int64_t f, bad = 0;
    for (f = 0; f < elems; f++)
        if ((!inplace || f < sh.first || f >= end) && prim[f] != MXS_SIM_POISON) bad++;
    for (f = sh.first; f < end; f++) {
        uint8_t got = inplace ? prim[f] : frag[f - sh.first];
        int written;
        if (phase == AFTER_APPLY)
            written = 1;
        else if (sim->desc.mode == MXS_WB_STRICT)
            written = 0;
        else if (plane == MXS_ROWWISE)
            written = ref_row_block_inside(wt->cols, f, sh.first, end);
        else
            written = ref_col_block_inside(wt->rows, wt->cols, f, sh.first, end);
        if (written ? got != ref[f] : got != MXS_SIM_POISON) bad++;
    }
    return bad;
}

static int64_t all_violations(const mxs_sim *sim, int phase) {
    int64_t bad = 0;
    int q, w;
    for (q = 0; q < sim->desc.nranks; q++)
        for (w = 0; w < sim->desc.n_weights; w++) {
            if (sim->weights[w].dirs & MXS_ROWWISE) bad += plane_violations(sim, q, w, MXS_ROWWISE, phase);
            if (sim->weights[w].dirs & MXS_COLWISE) bad += plane_violations(sim, q, w, MXS_COLWISE, phase);
        }
    return bad;
}

/* The rank's batch still names the storage it was given; absent planes stay
 * NULL (a row-only primary never gains a column plane). */
static int64_t pointer_violations(const mxs_sim *sim) {
    int64_t bad = 0;
    int q, w;
    for (q = 0; q < sim->desc.nranks; q++)
        for (w = 0; w < sim->desc.n_weights; w++) {
            const mxs_tensor *a = &sim->ranks[q].items[w].primary, *p = &sim->ranks[q].primary[w];
            int frag = sim->desc.output == MXS_SIM_FRAGMENT;
            bad += a->row_scale != p->row_scale || a->col_scale != p->col_scale;
            bad += a->row_data != (frag ? NULL : p->row_data) || a->col_data != (frag ? NULL : p->col_data);
            bad += a->dirs != sim->weights[w].dirs || p->dirs != sim->weights[w].dirs;
            if (!(p->dirs & MXS_COLWISE)) bad += p->col_data != NULL || p->col_scale != NULL;
            if (!(p->dirs & MXS_ROWWISE)) bad += p->row_data != NULL || p->row_scale != NULL;
        }
    return bad;
}

static int64_t present_planes(const mxs_sim *sim) {
    int64_t n = 0;
    int w;
    for (w = 0; w < sim->desc.n_weights; w++) n += (sim->weights[w].dirs & 1u) + ((sim->weights[w].dirs >> 1) & 1u);
    return n;
}

/* Runs `updates` writebacks with checks after every phase. */
static void run_invariant(const mxs_sim_desc *d, int updates, const char *what) {
    mxs_sim sim;
    int u;
    mxs_status s = mxs_sim_create(&sim, d);
    cr_assert_eq(s, MXS_OK, "%s: sim create: %s", what, mxs_status_str(s));
    for (u = 0; u < updates; u++) {
        mxs_sim_stats before;
        int64_t packed = sim.ranks[0].plan.packed_bytes;
        if (u > 0) mxs_sim_update(&sim);
        cr_assert_eq(mxs_sim_reference(&sim), MXS_OK);
        mxs_sim_poison_data(&sim, MXS_SIM_POISON);
        before = sim.stats;

        cr_assert_eq(mxs_sim_plan(&sim), MXS_OK, "%s: plan", what);
        s = mxs_sim_partial(&sim);
        cr_assert_eq(s, MXS_OK, "%s: partial: %s", what, mxs_status_str(s));
        cr_assert_eq(all_violations(&sim, AFTER_PARTIAL), 0, "%s update %d: partial wrote outside its rules", what, u);
        cr_assert_eq(mxs_sim_reduce(&sim), MXS_OK);
        s = mxs_sim_apply(&sim);
        cr_assert_eq(s, MXS_OK, "%s: apply: %s", what, mxs_status_str(s));
        cr_assert_eq(all_violations(&sim, AFTER_APPLY), 0, "%s update %d: apply wrote outside the slice or wrong bytes",
                     what, u);
        /* the writeback's only collective: one uint8 MAX of the packed buffer */
        cr_assert_eq(sim.stats.reduce_calls - before.reduce_calls, 1, "%s: reductions per writeback", what);
        cr_assert_eq(sim.stats.reduce_bytes - before.reduce_bytes, packed, "%s: reduced bytes", what);
        cr_assert_eq(sim.stats.highprec_calls, before.highprec_calls, "%s: high-precision exchange", what);
        cr_assert_eq(sim.stats.highprec_bytes, before.highprec_bytes, "%s: high-precision bytes", what);

        cr_assert_eq(mxs_sim_gather(&sim), MXS_OK);
        cr_assert_eq(sim.stats.gather_u8_calls - before.gather_u8_calls, present_planes(&sim),
                     "%s: one byte all-gather per present plane", what);
        cr_assert_eq(mxs_sim_compare(&sim, 0), 0, "%s update %d: ranks differ from whole-tensor quantize", what, u);
        cr_assert_eq(pointer_violations(&sim), 0, "%s: storage pointers changed or a plane appeared", what);
        cr_assert_eq(mxs_sim_guard_damage(&sim), 0, "%s: guard bytes overwritten", what);

        if (d->copyback && d->round_through == MXS_BF16) {
            cr_assert_eq(mxs_sim_copyback_bf16(&sim), MXS_OK);
            cr_assert_eq(mxs_sim_compare_banks(&sim), 0, "%s update %d: writeback != BF16 copy-back", what, u);
            cr_assert_eq(sim.stats.reduce_calls - before.reduce_calls, 1);
            cr_assert_eq(mxs_sim_guard_damage(&sim), 0);
        }
    }
    mxs_sim_destroy(&sim);
}

/* ---- random configurations ------------------------------------------------------ */

static int64_t pick_dim(mxs_sim_rng *rng) {
    static const int64_t edge[] = {1, 2, 31, 32, 33, 63, 64, 65, 96, 97, 128, 129};
    if (mxs_sim_range_i(rng, 0, 40) == 0) return mxs_sim_range_i(rng, 150, 700);
    switch (mxs_sim_range_i(rng, 0, 3)) {
    case 0: return edge[mxs_sim_range_i(rng, 0, 11)];
    case 1: return mxs_sim_range_i(rng, 1, 8);
    default: return mxs_sim_range_i(rng, 1, 150);
    }
}

/* n weights; with n >= 3 the batch holds row-only, column-only and
 * bidirectional primaries. */
static void random_weights(mxs_sim_rng *rng, mxs_sim_weight *w, int n) {
    int k;
    for (k = 0; k < n; k++) {
        w[k].name = "w";
        w[k].rows = pick_dim(rng);
        w[k].cols = pick_dim(rng);
        w[k].dirs = (unsigned)mxs_sim_range_i(rng, 1, 3);
    }
    if (n >= 3) {
        int first = (int)mxs_sim_range_i(rng, 0, n - 3);
        w[first].dirs = MXS_ROWWISE;
        w[first + 1].dirs = MXS_COLWISE;
        w[first + 2].dirs = MXS_BOTH;
    }
}

static void random_desc(mxs_sim_rng *rng, mxs_sim_desc *d, mxs_sim_weight *w, int nranks, int sharding) {
    int n = (int)mxs_sim_range_i(rng, 1, 5);
    random_weights(rng, w, n);
    memset(d, 0, sizeof *d);
    d->nranks = nranks;
    d->n_weights = n;
    d->weights = w;
    d->sharding = (mxs_sim_sharding)sharding;
    d->overlap = mxs_sim_range_i(rng, 1, 200);
    d->scale_layout = (mxs_scale_layout)mxs_sim_range_i(rng, 0, 2);
    d->master_dtype = (mxs_dtype)mxs_sim_range_i(rng, 0, 2);
    d->rounding = (mxs_rounding)mxs_sim_range_i(rng, 0, 1);
    d->round_through = mxs_sim_range_i(rng, 0, 4) == 0 ? MXS_F16 : (mxs_dtype)mxs_sim_range_i(rng, 0, 1);
    d->mode = (mxs_wb_mode)mxs_sim_range_i(rng, 0, 1);
    d->output = (mxs_sim_output)mxs_sim_range_i(rng, 0, 2);
    d->copyback = d->round_through == MXS_BF16;
    d->specials = 1;
    d->seed = mxs_sim_next(rng);
}

static void describe(char *buf, size_t n, const mxs_sim_desc *d, int iter) {
    static const char *sh[] = {"bucket", "replica", "overlap", "random"};
    static const char *lay[] = {"compact", "padded", "swizzled"};
    static const char *dt[] = {"f32", "bf16", "f16"};
    int k, used = snprintf(buf, n, "#%d ranks=%d %s layout=%s master=%s rt=%s %s %s out=%d [", iter, d->nranks,
                           sh[d->sharding], lay[d->scale_layout], dt[d->master_dtype], dt[d->round_through],
                           d->rounding ? "floor" : "ceil", d->mode ? "strict" : "fused", (int)d->output);
    for (k = 0; k < d->n_weights && used > 0 && (size_t)used < n; k++)
        used += snprintf(buf + used, n - (size_t)used, " %lldx%lld/%u", (long long)d->weights[k].rows,
                         (long long)d->weights[k].cols, d->weights[k].dirs);
    if (used > 0 && (size_t)used < n) snprintf(buf + used, n - (size_t)used, " ]");
}

/* docs/contract.md section 4 invariant: random shapes, DP sizes 1-8, every sharding,
 * layout, rounding, master dtype, round-through, mode and output, two
 * consecutive updates with changed masters. */
Test(sim, invariant_random_configurations, .timeout = 240) {
    mxs_sim_rng rng = {0x1234567ull};
    int iter;
    for (iter = 0; iter < 3200; iter++) {
        mxs_sim_weight w[5];
        mxs_sim_desc d;
        char what[512];
        random_desc(&rng, &d, w, 1 + iter % 8, (iter / 8) % 4);
        describe(what, sizeof what, &d, iter);
        run_invariant(&d, 2, what);
    }
}

/* Every DP size with distributed-optimizer buckets: the layer shapes are
 * not multiples of 32, so shards start mid-block and some ranks own nothing
 * of a weight. */
Test(sim, invariant_bucket_layer_every_dp_size) {
    static const mxs_sim_weight layer[] = {
        {"q", 96, 96, MXS_BOTH},    {"k", 40, 96, MXS_ROWWISE}, {"v", 40, 96, MXS_COLWISE},
        {"o", 96, 96, MXS_ROWWISE}, {"up", 256, 96, MXS_BOTH},  {"down", 96, 256, MXS_ROWWISE},
        {"tiny", 1, 1, MXS_BOTH},   {"col", 37, 1, MXS_BOTH},
    };
    int n, mode;
    for (n = 1; n <= 8; n++)
        for (mode = 0; mode < 2; mode++) {
            mxs_sim_desc d;
            char what[64];
            memset(&d, 0, sizeof d);
            d.nranks = n;
            d.n_weights = 8;
            d.weights = layer;
            d.sharding = MXS_SIM_BUCKET;
            d.scale_layout = MXS_SCALES_SWIZZLED;
            d.round_through = MXS_BF16;
            d.mode = (mxs_wb_mode)mode;
            d.copyback = 1;
            d.seed = (uint64_t)n * 77u + (uint64_t)mode;
            snprintf(what, sizeof what, "layer ranks=%d mode=%d", n, mode);
            run_invariant(&d, 2, what);
        }
}

/* The bucket sharding really does produce unaligned starts and empty
 * shards (otherwise the tests above would prove less than they claim). */
Test(sim, bucket_shards_are_unaligned_and_sometimes_empty) {
    static const mxs_sim_weight ws[] = {{"a", 33, 45, MXS_BOTH}, {"b", 3, 7, MXS_ROWWISE}, {"c", 70, 33, MXS_COLWISE}};
    mxs_sim_desc d;
    mxs_sim sim;
    int q, w, unaligned = 0, empty = 0;
    int64_t covered[3] = {0, 0, 0};
    memset(&d, 0, sizeof d);
    d.nranks = 7;
    d.n_weights = 3;
    d.weights = ws;
    cr_assert_eq(mxs_sim_create(&sim, &d), MXS_OK);
    cr_assert_eq(sim.bucket_elems % 7, 0);
    for (q = 0; q < 7; q++)
        for (w = 0; w < 3; w++) {
            mxs_range r = sim.ranks[q].shard[w];
            unaligned += r.count > 0 && r.first % 32 != 0;
            empty += r.count == 0;
            covered[w] += r.count;
        }
    for (w = 0; w < 3; w++) cr_assert_eq(covered[w], ws[w].rows * ws[w].cols, "bucket shards tile weight %d", w);
    cr_assert_gt(unaligned, 0);
    cr_assert_gt(empty, 0);
    mxs_sim_destroy(&sim);
}

/* Writeback with bf16 round-through equals copy-back of the bf16-rounded
 * weight, byte for byte, for f32, bf16 and f16 masters; the copy-back is the
 * only path that moves high-precision values. */
Test(sim, writeback_round_through_bf16_equals_bf16_copyback) {
    static const mxs_sim_weight ws[] = {
        {"a", 65, 70, MXS_ROWWISE}, {"b", 33, 129, MXS_BOTH}, {"c", 1, 300, MXS_COLWISE}};
    int dt, lay, rnd;
    for (dt = 0; dt < 3; dt++)
        for (lay = 0; lay < 3; lay++)
            for (rnd = 0; rnd < 2; rnd++) {
                mxs_sim_desc d;
                mxs_sim sim;
                memset(&d, 0, sizeof d);
                d.nranks = 5;
                d.n_weights = 3;
                d.weights = ws;
                d.scale_layout = (mxs_scale_layout)lay;
                d.master_dtype = (mxs_dtype)dt;
                d.rounding = (mxs_rounding)rnd;
                d.round_through = MXS_BF16;
                d.copyback = 1;
                d.specials = 1;
                d.seed = 99u + (uint64_t)(dt * 6 + lay * 2 + rnd);
                cr_assert_eq(mxs_sim_create(&sim, &d), MXS_OK);
                cr_assert_eq(mxs_sim_writeback(&sim), MXS_OK);
                cr_assert_eq(sim.stats.highprec_bytes, 0);
                cr_assert_eq(mxs_sim_copyback_bf16(&sim), MXS_OK);
                cr_assert_eq(mxs_sim_compare_banks(&sim), 0, "dtype %d layout %d rounding %d", dt, lay, rnd);
                cr_assert_eq(sim.stats.gather_bf16_calls, 3);
                cr_assert_eq(sim.stats.gather_bf16_bytes, 2 * (65 * 70 + 33 * 129 + 300));
                cr_assert_eq(sim.stats.highprec_bytes, sim.stats.gather_bf16_bytes);
                cr_assert_eq(mxs_sim_reference(&sim), MXS_OK);
                cr_assert_eq(mxs_sim_compare(&sim, 1), 0);
                mxs_sim_destroy(&sim);
            }
}

/* Without round-through, an f32 master generally does NOT equal the bf16
 * copy-back: the equality above is the round-through's doing, and the
 * comparison can fail. */
Test(sim, without_round_through_copyback_differs) {
    static const mxs_sim_weight ws[] = {{"a", 64, 64, MXS_ROWWISE}};
    mxs_sim_desc d;
    mxs_sim sim;
    memset(&d, 0, sizeof d);
    d.nranks = 3;
    d.n_weights = 1;
    d.weights = ws;
    d.copyback = 1;
    d.seed = 5;
    cr_assert_eq(mxs_sim_create(&sim, &d), MXS_OK);
    cr_assert_eq(mxs_sim_writeback(&sim), MXS_OK);
    cr_assert_eq(mxs_sim_copyback_bf16(&sim), MXS_OK);
    cr_assert_gt(mxs_sim_compare_banks(&sim), 0);
    mxs_sim_destroy(&sim);
}

/* The comparison itself can fail: one flipped byte on one rank is seen. */
Test(sim, compare_detects_a_single_wrong_byte) {
    static const mxs_sim_weight ws[] = {{"a", 40, 50, MXS_BOTH}};
    mxs_sim_desc d;
    mxs_sim sim;
    memset(&d, 0, sizeof d);
    d.nranks = 4;
    d.n_weights = 1;
    d.weights = ws;
    d.seed = 6;
    cr_assert_eq(mxs_sim_create(&sim, &d), MXS_OK);
    cr_assert_eq(mxs_sim_writeback(&sim), MXS_OK);
    cr_assert_eq(mxs_sim_reference(&sim), MXS_OK);
    cr_assert_eq(mxs_sim_compare(&sim, 0), 0);
    sim.ranks[2].primary[0].col_scale[7] ^= 1u;
    cr_assert_eq(mxs_sim_compare(&sim, 0), 1);
    sim.ranks[2].primary[0].col_scale[7] ^= 1u;
    sim.ranks[3].primary[0].row_data[1999] ^= 0x80u;
    cr_assert_eq(mxs_sim_compare(&sim, 0), 1);
    sim.ranks[3].primary[0].row_data[1999] ^= 0x80u;
    sim.ranks[0].primary[0].row_data[2000] ^= 1u; /* the guard byte right after the plane */
    cr_assert_eq(mxs_sim_guard_damage(&sim), 1);
    sim.ranks[0].primary[0].row_data[2000] ^= 1u;
    mxs_sim_destroy(&sim);
}

/* Ranks whose batches differ (here: one rank's primary is bidirectional
 * where the others' are row-only) are caught by the plan fingerprints. */
Test(sim, ranks_with_different_plans_are_caught) {
    static const mxs_sim_weight ws[] = {{"a", 40, 50, MXS_ROWWISE}, {"b", 9, 9, MXS_BOTH}};
    mxs_sim_desc d;
    mxs_sim sim;
    memset(&d, 0, sizeof d);
    d.nranks = 3;
    d.n_weights = 2;
    d.weights = ws;
    d.seed = 8;
    cr_assert_eq(mxs_sim_create(&sim, &d), MXS_OK);
    cr_assert_eq(mxs_sim_plan(&sim), MXS_OK);
    sim.ranks[1].primary[1].dirs = MXS_ROWWISE;
    cr_assert_eq(mxs_sim_plan(&sim), MXS_ERR_PLAN_MISMATCH);
    cr_assert_neq(sim.ranks[1].plan.fingerprint, sim.ranks[0].plan.fingerprint);
    sim.ranks[1].primary[1].dirs = MXS_BOTH;
    cr_assert_eq(mxs_sim_plan(&sim), MXS_OK);
    mxs_sim_destroy(&sim);
}

/* ---- one thread per rank through mxs_host_wb_writeback ------------------------- */

/* A real group runs the ranks concurrently and the reduction is a
 * collective call inside mxs_host_wb_writeback's callback. Each thread is a
 * rank; the callback is an in-memory MAX all-reduce behind two barriers. */
typedef struct {
    mxs_sim *sim;
    pthread_barrier_t barrier;
    pthread_mutex_t lock;
    int calls[64];
    int64_t max_bytes_seen;
} group_ctx;

typedef struct {
    group_ctx *group;
    int rank;
    mxs_status status;
} rank_ctx;

static int thread_reduce_max(uint8_t *packed, int64_t bytes, void *user) {
    rank_ctx *rc = (rank_ctx *)user;
    group_ctx *g = rc->group;
    pthread_mutex_lock(&g->lock);
    g->calls[rc->rank]++;
    if (bytes > g->max_bytes_seen) g->max_bytes_seen = bytes;
    pthread_mutex_unlock(&g->lock);
    (void)packed;
    pthread_barrier_wait(&g->barrier); /* every rank's partial is done */
    if (rc->rank == 0) mxs_sim_reduce(g->sim);
    pthread_barrier_wait(&g->barrier); /* the reduced buffer is everywhere */
    return 0;
}

static void *rank_main(void *arg) {
    rank_ctx *rc = (rank_ctx *)arg;
    mxs_sim_rank *rk = &rc->group->sim->ranks[rc->rank];
    rc->status = mxs_host_wb_writeback(&rk->batch, &rk->plan, rk->packed, thread_reduce_max, rc);
    return NULL;
}

Test(sim, threads_through_host_writeback_callback) {
    static const mxs_sim_weight ws[] = {
        {"a", 70, 45, MXS_BOTH}, {"b", 1, 77, MXS_ROWWISE}, {"c", 33, 33, MXS_COLWISE}, {"d", 128, 31, MXS_ROWWISE}};
    int n, u;
    for (n = 1; n <= 6; n++) {
        mxs_sim_desc d;
        mxs_sim sim;
        group_ctx g;
        rank_ctx rc[8];
        pthread_t th[8];
        int q;
        memset(&d, 0, sizeof d);
        d.nranks = n;
        d.n_weights = 4;
        d.weights = ws;
        d.sharding = n % 2 ? MXS_SIM_BUCKET : MXS_SIM_OVERLAP;
        d.overlap = 50;
        d.scale_layout = MXS_SCALES_PADDED;
        d.mode = n % 3 ? MXS_WB_FUSED : MXS_WB_STRICT;
        d.seed = 1000u + (uint64_t)n;
        cr_assert_eq(mxs_sim_create(&sim, &d), MXS_OK);
        memset(&g, 0, sizeof g);
        g.sim = &sim;
        pthread_barrier_init(&g.barrier, NULL, (unsigned)n);
        pthread_mutex_init(&g.lock, NULL);
        for (u = 0; u < 2; u++) {
            if (u > 0) mxs_sim_update(&sim);
            for (q = 0; q < n; q++) {
                rc[q].group = &g;
                rc[q].rank = q;
                rc[q].status = MXS_ERR_UNSUPPORTED;
                pthread_create(&th[q], NULL, rank_main, &rc[q]);
            }
            for (q = 0; q < n; q++) pthread_join(th[q], NULL);
            for (q = 0; q < n; q++) {
                cr_assert_eq(rc[q].status, MXS_OK, "rank %d: %s", q, mxs_status_str(rc[q].status));
                cr_assert_eq(g.calls[q], u + 1, "exactly one reduction per writeback on rank %d", q);
            }
            cr_assert_eq(g.max_bytes_seen, sim.ranks[0].plan.packed_bytes);
            cr_assert_eq(mxs_sim_gather(&sim), MXS_OK);
            cr_assert_eq(mxs_sim_reference(&sim), MXS_OK);
            cr_assert_eq(mxs_sim_compare(&sim, 0), 0, "ranks=%d update %d", n, u);
        }
        cr_assert_eq(sim.stats.highprec_bytes, 0);
        cr_assert_eq(mxs_sim_guard_damage(&sim), 0);
        pthread_barrier_destroy(&g.barrier);
        pthread_mutex_destroy(&g.lock);
        mxs_sim_destroy(&sim);
    }
}

/* A rank-local failure never hangs the group (docs/contract.md section 6): one rank's
 * batch goes bad after planning (a changed shard, a NULL master) while the
 * others are fine. Every rank still calls the reduction exactly once; the
 * failing rank returns its own error, every other rank MXS_ERR_REMOTE; no
 * rank runs apply (no scale byte is written anywhere; STRICT: no data byte
 * either). With the batch repaired, the next writeback is exact again. */
Test(sim, one_rank_failing_locally_fails_every_rank_and_hangs_none) {
    static const mxs_sim_weight ws[] = {
        {"a", 70, 45, MXS_BOTH}, {"b", 1, 77, MXS_ROWWISE}, {"c", 33, 33, MXS_COLWISE}, {"d", 128, 31, MXS_ROWWISE}};
    int n, fault;
    for (n = 2; n <= 6; n++)
        for (fault = 0; fault < 2; fault++) {
            mxs_sim_desc d;
            mxs_sim sim;
            group_ctx g;
            rank_ctx rc[8];
            pthread_t th[8];
            const int bad = (n + fault) % n;
            mxs_status want_bad = fault ? MXS_ERR_INVALID_ARGUMENT : MXS_ERR_PLAN_MISMATCH;
            int q, w;
            memset(&d, 0, sizeof d);
            d.nranks = n;
            d.n_weights = 4;
            d.weights = ws;
            d.sharding = MXS_SIM_REPLICA; /* every rank owns something of every weight */
            d.scale_layout = MXS_SCALES_SWIZZLED;
            d.mode = fault ? MXS_WB_STRICT : MXS_WB_FUSED;
            d.seed = 2000u + (uint64_t)n;
            cr_assert_eq(mxs_sim_create(&sim, &d), MXS_OK);
            memset(&g, 0, sizeof g);
            g.sim = &sim;
            pthread_barrier_init(&g.barrier, NULL, (unsigned)n);
            pthread_mutex_init(&g.lock, NULL);
            if (fault == 0)
                sim.ranks[bad].items[0].start += 1, sim.ranks[bad].items[0].len -= 1; /* changed after planning */
            else
                sim.ranks[bad].items[2].master = NULL; /* broken after planning */
            for (q = 0; q < n; q++) {
                rc[q].group = &g;
                rc[q].rank = q;
                rc[q].status = MXS_OK;
                pthread_create(&th[q], NULL, rank_main, &rc[q]);
            }
            for (q = 0; q < n; q++) pthread_join(th[q], NULL);
            for (q = 0; q < n; q++) {
                mxs_status want = q == bad ? want_bad : MXS_ERR_REMOTE;
                cr_assert_eq(rc[q].status, want, "ranks=%d bad=%d rank %d: %s", n, bad, q,
                             mxs_status_str(rc[q].status));
                cr_assert_eq(g.calls[q], 1, "rank %d joined the reduction %d times", q, g.calls[q]);
                for (w = 0; w < 4; w++) {
                    const mxs_tensor *t = &sim.ranks[q].primary[w];
                    int64_t k, elems = t->rows * t->cols, written = 0;
                    if (t->row_scale)
                        for (k = 0; k < mxs_scale_bytes(t, MXS_ROWWISE); k++)
                            written += t->row_scale[k] != MXS_SIM_POISON;
                    if (t->col_scale)
                        for (k = 0; k < mxs_scale_bytes(t, MXS_COLWISE); k++)
                            written += t->col_scale[k] != MXS_SIM_POISON;
                    cr_assert_eq(written, 0, "rank %d weight %d: apply ran", q, w);
                    if (d.mode == MXS_WB_STRICT || q == bad) {
                        for (k = 0; k < elems; k++) {
                            if (t->row_data) written += t->row_data[k] != MXS_SIM_POISON;
                            if (t->col_data) written += t->col_data[k] != MXS_SIM_POISON;
                        }
                        cr_assert_eq(written, 0, "rank %d weight %d: data written", q, w);
                    }
                }
            }
            /* repaired: the same group, the same plans, exact again */
            mxs_sim_build_items(&sim, bad);
            for (q = 0; q < n; q++) {
                rc[q].status = MXS_ERR_UNSUPPORTED;
                pthread_create(&th[q], NULL, rank_main, &rc[q]);
            }
            for (q = 0; q < n; q++) pthread_join(th[q], NULL);
            for (q = 0; q < n; q++) {
                cr_assert_eq(rc[q].status, MXS_OK, "after repair, rank %d: %s", q, mxs_status_str(rc[q].status));
                cr_assert_eq(g.calls[q], 2);
            }
            cr_assert_eq(mxs_sim_gather(&sim), MXS_OK);
            cr_assert_eq(mxs_sim_reference(&sim), MXS_OK);
            cr_assert_eq(mxs_sim_compare(&sim, 0), 0, "ranks=%d after repair", n);
            cr_assert_eq(mxs_sim_guard_damage(&sim), 0);
            pthread_barrier_destroy(&g.barrier);
            pthread_mutex_destroy(&g.lock);
            mxs_sim_destroy(&sim);
        }
}
