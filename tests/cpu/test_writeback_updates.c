/* SPDX-License-Identifier: MIT */
/* Suite cpu / writeback: whole updates one rank at a time (docs/contract.md
 * section 4): the callback entry point calls the reduction exactly once; a
 * row-only primary never gains a column plane; fragments equal the in-place
 * slices; repeated updates over the previous bytes agree in FUSED and STRICT
 * (on a simulated group of harness/sim.h); a rank owning nothing contributes
 * zeros. Outputs are poisoned and followed by guard bytes.
 */
#include <criterion/criterion.h>
#include <stdio.h>

#include <mxshard/mxshard.h>

#include "sim.h"
#include "writeback_fixture.h"

/* ---- the callback entry point -------------------------------------------------------- */

typedef struct {
    int calls;
    int64_t bytes;
    const uint8_t *where;
    int fail;
} reduce_log;

static int log_reduce(uint8_t *packed, int64_t bytes, void *user) {
    reduce_log *log = (reduce_log *)user;
    log->calls++;
    log->bytes = bytes;
    log->where = packed;
    return log->fail;
}

/* One rank owning everything: the callback is called exactly once, on the
 * whole packed buffer (uint8, by its type), and the result equals
 * whole-tensor quantize. A failing callback fails the call. */
Test(writeback, host_writeback_calls_the_reduction_exactly_once) {
    static const item_spec whole[] = {
        {45, 70, MXS_BOTH, 0, 3150, 0}, {33, 40, MXS_ROWWISE, 0, 1320, 1}, {64, 33, MXS_COLWISE, 0, 2112, 2}};
    int mode;
    for (mode = 0; mode < 2; mode++) {
        fixture fx;
        mxs_wb_plan plan = {0};
        reduce_log log = {0, 0, NULL, 0};
        int k;
        fixture_init(&fx, whole, 3, MXS_SCALES_PADDED, MXS_ROUND_CEIL, (mxs_wb_mode)mode, POISON_A, 31);
        cr_assert_eq(mxs_wb_make_plan(&fx.batch, &plan, NULL), MXS_OK);
        fixture_alloc_packed(&fx, plan.packed_bytes);
        cr_assert_eq(mxs_host_wb_writeback(&fx.batch, &plan, fx.packed.p, log_reduce, &log), MXS_OK);
        cr_assert_eq(log.calls, 1);
        cr_assert_eq(log.bytes, plan.packed_bytes);
        cr_assert_eq(log.where, fx.packed.p);
        for (k = 0; k < 3; k++) {
            if (fx.data[k][0].p) {
                cr_assert_eq(memcmp(fx.scale[k][0].p, fx.ref[k].row_scale, (size_t)fx.scale[k][0].n), 0);
                cr_assert_eq(memcmp(whole[k].fragment ? fx.frag[k][0].p : fx.data[k][0].p, fx.ref[k].row_data,
                                    (size_t)whole[k].len),
                             0);
            }
            if (fx.data[k][1].p) {
                cr_assert_eq(memcmp(fx.scale[k][1].p, fx.ref[k].col_scale, (size_t)fx.scale[k][1].n), 0);
                cr_assert_eq(memcmp(whole[k].fragment ? fx.frag[k][1].p : fx.data[k][1].p, fx.ref[k].col_data,
                                    (size_t)whole[k].len),
                             0);
            }
        }
        cr_assert_eq(fixture_guards(&fx), 0);
        cr_assert_eq(mxs_host_wb_writeback(&fx.batch, &plan, fx.packed.p, NULL, NULL), MXS_ERR_INVALID_ARGUMENT);
        fixture_free(&fx);

        fixture_init(&fx, whole, 3, MXS_SCALES_PADDED, MXS_ROUND_CEIL, (mxs_wb_mode)mode, POISON_A, 31);
        cr_assert_eq(mxs_wb_make_plan(&fx.batch, &plan, NULL), MXS_OK); /* new buffers: a new plan */
        fixture_alloc_packed(&fx, plan.packed_bytes);
        log.calls = 0;
        log.fail = 1;
        cr_assert_eq(mxs_host_wb_writeback(&fx.batch, &plan, fx.packed.p, log_reduce, &log), MXS_ERR_REDUCE);
        cr_assert_eq(log.calls, 1);
        for (k = 0; k < 3; k++) { /* no apply after a failed reduction: scales untouched */
            if (fx.scale[k][0].p) cr_assert_eq(buf_count_not(&fx.scale[k][0], POISON_A), 0);
            if (fx.scale[k][1].p) cr_assert_eq(buf_count_not(&fx.scale[k][1], POISON_A), 0);
        }
        fixture_free(&fx);
    }
}

/* A row-only primary never gains a column plane: with column pointers set to
 * poisoned decoys but dirs = MXS_ROWWISE, neither the writeback nor the
 * copy-back (mxs_host_quantize) touches them. */
Test(writeback, row_only_primary_never_gains_a_column_plane) {
    static const item_spec whole[] = {{70, 45, MXS_ROWWISE, 0, 3150, 0}};
    int mode;
    for (mode = 0; mode < 2; mode++) {
        fixture fx;
        mxs_wb_plan plan = {0};
        mxs_wb_slot slot;
        reduce_log log = {0, 0, NULL, 0};
        buf_t decoy_data = buf_new(3150, POISON_A), decoy_scale = buf_new(4096, POISON_A);
        uint8_t *rd, *rs;
        fixture_init(&fx, whole, 1, MXS_SCALES_SWIZZLED, MXS_ROUND_FLOOR, (mxs_wb_mode)mode, POISON_A, 41);
        rd = fx.items[0].primary.row_data;
        rs = fx.items[0].primary.row_scale;
        cr_assert_eq(fx.items[0].primary.col_data, NULL);
        fx.items[0].primary.col_data = decoy_data.p;
        fx.items[0].primary.col_scale = decoy_scale.p;
        cr_assert_eq(mxs_wb_make_plan(&fx.batch, &plan, &slot), MXS_OK);
        cr_assert_eq(slot.col_offset, -1);
        cr_assert_eq(plan.packed_bytes, 70 * 2 + 1);
        fixture_alloc_packed(&fx, plan.packed_bytes);
        cr_assert_eq(mxs_host_wb_writeback(&fx.batch, &plan, fx.packed.p, log_reduce, &log), MXS_OK);
        cr_assert_eq(buf_count_not(&decoy_data, POISON_A), 0);
        cr_assert_eq(buf_count_not(&decoy_scale, POISON_A), 0);
        cr_assert_eq(fx.items[0].primary.row_data, rd);
        cr_assert_eq(fx.items[0].primary.row_scale, rs);
        cr_assert_eq(fx.items[0].primary.dirs, MXS_ROWWISE);
        cr_assert_eq(memcmp(rd, fx.ref[0].row_data, 3150), 0);
        /* copy-back into the same primary */
        cr_assert_eq(mxs_host_quantize(&fx.items[0].primary, fx.full[0], MXS_F32, MXS_ROUND_FLOOR), MXS_OK);
        cr_assert_eq(buf_count_not(&decoy_data, POISON_A), 0);
        cr_assert_eq(buf_count_not(&decoy_scale, POISON_A), 0);
        /* asking for a column fragment of a row-only primary is an error, not an allocation */
        fx.items[0].col_fragment = decoy_data.p;
        cr_assert_eq(mxs_wb_make_plan(&fx.batch, &plan, NULL), MXS_ERR_ABSENT_PLANE);
        free(decoy_data.p);
        free(decoy_scale.p);
        fixture_free(&fx);
    }
}

/* FSDP fragments equal the in-place slice byte for byte; a kept data pointer
 * is not written when a fragment is given. */
Test(writeback, fragments_equal_in_place_slices) {
    static const item_spec inplace[] = {{97, 65, MXS_BOTH, 31, 3000, 0}, {1, 300, MXS_ROWWISE, 33, 200, 0}};
    static const item_spec frag[] = {{97, 65, MXS_BOTH, 31, 3000, 2}, {1, 300, MXS_ROWWISE, 33, 200, 1}};
    int mode;
    for (mode = 0; mode < 2; mode++) {
        fixture a, b;
        mxs_wb_plan pa = {0}, pb = {0};
        int k, p;
        fixture_init(&a, inplace, 2, MXS_SCALES_COMPACT, MXS_ROUND_CEIL, (mxs_wb_mode)mode, POISON_A, 51);
        fixture_init(&b, frag, 2, MXS_SCALES_COMPACT, MXS_ROUND_CEIL, (mxs_wb_mode)mode, POISON_A, 51);
        cr_assert_eq(mxs_wb_make_plan(&a.batch, &pa, NULL), MXS_OK);
        cr_assert_eq(mxs_wb_make_plan(&b.batch, &pb, NULL), MXS_OK);
        cr_assert_eq(pa.fingerprint, pb.fingerprint);
        fixture_alloc_packed(&a, pa.packed_bytes);
        fixture_alloc_packed(&b, pb.packed_bytes);
        cr_assert_eq(mxs_host_wb_partial(&a.batch, &pa, a.packed.p), MXS_OK);
        cr_assert_eq(mxs_host_wb_partial(&b.batch, &pb, b.packed.p), MXS_OK);
        cr_assert_eq(memcmp(a.packed.p, b.packed.p, (size_t)pa.packed_bytes), 0);
        cr_assert_eq(mxs_host_wb_apply(&a.batch, &pa, a.packed.p), MXS_OK);
        cr_assert_eq(mxs_host_wb_apply(&b.batch, &pb, b.packed.p), MXS_OK);
        for (k = 0; k < 2; k++)
            for (p = 0; p < 2; p++) {
                if (!a.data[k][p].p) continue;
                cr_assert_eq(memcmp(b.frag[k][p].p, a.data[k][p].p + inplace[k].start, (size_t)inplace[k].len), 0);
                cr_assert_eq(buf_count_not(&b.data[k][p], POISON_A), 0, "data plane written despite a fragment");
                cr_assert_eq(memcmp(a.scale[k][p].p, b.scale[k][p].p, (size_t)a.scale[k][p].n), 0);
            }
        cr_assert_eq(fixture_guards(&a) + fixture_guards(&b), 0);
        fixture_free(&a);
        fixture_free(&b);
    }
}

/* ---- repeated updates, modes agree ------------------------------------------------------- */

/* Writeback over the previous update's bytes (no poison in between), in
 * FUSED and STRICT: identical bytes in both modes, equal to whole-tensor
 * quantize after each of three updates. */
Test(writeback, repeated_updates_in_place_fused_equals_strict) {
    static const mxs_sim_weight ws[] = {
        {"a", 100, 90, MXS_BOTH}, {"b", 31, 200, MXS_ROWWISE}, {"c", 65, 1, MXS_COLWISE}, {"d", 1, 33, MXS_ROWWISE}};
    mxs_sim sims[2];
    int mode, u, q, w;
    for (mode = 0; mode < 2; mode++) {
        mxs_sim_desc d;
        memset(&d, 0, sizeof d);
        d.nranks = 6;
        d.n_weights = 4;
        d.weights = ws;
        d.sharding = MXS_SIM_RANDOM;
        d.scale_layout = MXS_SCALES_SWIZZLED;
        d.master_dtype = MXS_BF16;
        d.round_through = MXS_BF16;
        d.mode = (mxs_wb_mode)mode;
        d.specials = 1;
        d.seed = 71;
        cr_assert_eq(mxs_sim_create(&sims[mode], &d), MXS_OK);
    }
    for (u = 0; u < 3; u++)
        for (mode = 0; mode < 2; mode++) {
            mxs_sim *sim = &sims[mode];
            if (u > 0) mxs_sim_update(sim);
            cr_assert_eq(mxs_sim_writeback(sim), MXS_OK);
            cr_assert_eq(mxs_sim_reference(sim), MXS_OK);
            cr_assert_eq(mxs_sim_compare(sim, 0), 0, "mode %d update %d", mode, u);
            cr_assert_eq(sim->stats.reduce_calls, u + 1);
            cr_assert_eq(sim->stats.highprec_bytes, 0);
            if (mode == 1)
                for (q = 0; q < 6; q++)
                    for (w = 0; w < 4; w++) {
                        const mxs_tensor *a = &sims[0].ranks[q].primary[w], *b = &sims[1].ranks[q].primary[w];
                        int64_t n = a->rows * a->cols;
                        if (a->row_data) cr_assert_eq(memcmp(a->row_data, b->row_data, (size_t)n), 0);
                        if (a->col_data) cr_assert_eq(memcmp(a->col_data, b->col_data, (size_t)n), 0);
                    }
        }
    cr_assert_eq(mxs_sim_guard_damage(&sims[0]) + mxs_sim_guard_damage(&sims[1]), 0);
    mxs_sim_destroy(&sims[0]);
    mxs_sim_destroy(&sims[1]);
}

/* Empty batches and ranks that own nothing: the buffer is still zeroed by
 * partial (so a MAX with other ranks is correct) and apply writes scales. */
Test(writeback, rank_owning_nothing_contributes_zeros) {
    static const item_spec none[] = {{45, 70, MXS_BOTH, 0, 0, 0}, {33, 40, MXS_ROWWISE, 1320, 0, 0}};
    fixture fx;
    mxs_wb_plan plan = {0};
    mxs_wb_batch empty;
    mxs_wb_plan eplan = {0};
    int64_t k;
    fixture_init(&fx, none, 2, MXS_SCALES_COMPACT, MXS_ROUND_CEIL, MXS_WB_FUSED, POISON_A, 81);
    cr_assert_eq(mxs_wb_make_plan(&fx.batch, &plan, NULL), MXS_OK);
    fixture_alloc_packed(&fx, plan.packed_bytes);
    cr_assert_eq(mxs_host_wb_partial(&fx.batch, &plan, fx.packed.p), MXS_OK);
    for (k = 0; k < plan.packed_bytes; k++) cr_assert_eq(fx.packed.p[k], 0);
    cr_assert_eq(buf_count_not(&fx.data[0][0], POISON_A) + buf_count_not(&fx.data[0][1], POISON_A) +
                     buf_count_not(&fx.data[1][0], POISON_A),
                 0);
    cr_assert_eq(fixture_guards(&fx), 0);
    fixture_free(&fx);

    /* an empty batch still has the status byte (a rank may join a group's
     * reduction with nothing to write back) */
    memset(&empty, 0, sizeof empty);
    cr_assert_eq(mxs_wb_make_plan(&empty, &eplan, NULL), MXS_OK);
    cr_assert_eq(eplan.packed_bytes, 1);
    cr_assert_eq(eplan.status_offset, 0);
    cr_assert_eq(mxs_host_wb_partial(&empty, &eplan, NULL), MXS_ERR_INVALID_ARGUMENT);
    {
        uint8_t status = 0xA5;
        cr_assert_eq(mxs_host_wb_partial(&empty, &eplan, &status), MXS_OK);
        cr_assert_eq(status, 0);
        cr_assert_eq(mxs_host_wb_apply(&empty, &eplan, &status), MXS_OK);
    }
}
