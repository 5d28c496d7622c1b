/* SPDX-License-Identifier: MIT */
/* docs/contract.md section 9.8: bad input to the NVFP4 writeback, one rank at
 * a time. Every mutation of a valid batch (shapes, planes, stages, shards,
 * aliasing, fragments, a changed batch or plan) is rejected with its code by
 * make_plan, partial, apply and finish, before any write; bad packed buffers
 * and NULL arguments too; apply after a failed rank writes nothing. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <mxshard/mxshard.h>
#include <mxshard/nvfp4_writeback.h>

#include "common.h"
#include "nvfp4_writeback_fixture.h"

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
