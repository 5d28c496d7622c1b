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
 * every other rank.
 *
 * This file: the invariant on R ranks and the rank-local failure. The R
 * simulated ranks live in nvfp4_writeback_group.h, the one-rank fixture in
 * nvfp4_writeback_fixture.h; fragments are tested in
 * test_nvfp4_writeback_fragments.c, the packed buffer and shard boundaries in
 * test_nvfp4_writeback_packed.c, bad input in test_nvfp4_writeback_validation.c. */
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
#include "nvfp4_writeback_fixture.h"
#include "nvfp4_writeback_group.h"

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
