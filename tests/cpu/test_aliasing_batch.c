/* SPDX-License-Identifier: MIT */
/* docs/contract.md section 6, the buffer rules of a writeback batch: every
 * overlap between the batch's own buffers is MXS_ERR_ALIASING from the plan,
 * and from partial and apply for a batch changed after planning; a fragment
 * over the packed buffer is caught by partial and apply; the plan validates
 * once and later phases re-check cheaply (local_hash); the group status byte
 * makes a rank-local failure fail every rank instead of hanging one.
 *
 * Every buffer is a slice of one poisoned arena, checked byte for byte after
 * every rejected call.
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <mxshard/mxshard.h>

#include "common.h"
#include "snapshot.h"

/* 1 when the n bytes at p all hold T_POISON. */
static int poisoned(const uint8_t *p, size_t n) {
    size_t k;
    for (k = 0; k < n; k++)
        if (p[k] != T_POISON) return 0;
    return 1;
}

/* ---- a small writeback batch in one arena ------------------------------------ */

/* Three items, every buffer a slice of one poisoned arena (so the tests can
 * aim any pointer anywhere and still check every byte afterwards):
 *   item 0: 45 x 70 both planes, in place, shard [100, 2000)
 *   item 1: 33 x 40 row-only, in place, shard [5, 1000)
 *   item 2: 64 x 33 column-only, fragment (col_data NULL), shard [30, 2000) */
#define AR_BYTES (256 * 1024)
typedef struct {
    uint8_t *arena;
    mxs_wb_item items[3];
    mxs_wb_batch batch;
    uint8_t *packed; /* inside the arena too, after the plan */
} wfx;

static void wfx_init(wfx *f, mxs_wb_mode mode) {
    uint8_t *a;
    float *m;
    int64_t i;
    memset(f, 0, sizeof *f);
    f->arena = a = t_alloc(AR_BYTES);
    cr_assert_not_null(a);
    /* masters: f32 values, at the end of the arena */
    m = (float *)(void *)(a + 192 * 1024);
    for (i = 0; i < 3 * 4096; i++) m[i] = (float)((i * 7919) % 1000) * 0.01f - 5.0f;
    f->items[0].primary.rows = 45, f->items[0].primary.cols = 70, f->items[0].primary.dirs = MXS_BOTH;
    f->items[0].primary.row_data = a + 0, f->items[0].primary.row_scale = a + 4096;
    f->items[0].primary.col_data = a + 8192, f->items[0].primary.col_scale = a + 12288;
    f->items[0].master = m, f->items[0].start = 100, f->items[0].len = 1900;
    f->items[1].primary.rows = 33, f->items[1].primary.cols = 40, f->items[1].primary.dirs = MXS_ROWWISE;
    f->items[1].primary.row_data = a + 16384, f->items[1].primary.row_scale = a + 20480;
    f->items[1].master = m + 4096, f->items[1].start = 5, f->items[1].len = 995;
    f->items[2].primary.rows = 64, f->items[2].primary.cols = 33, f->items[2].primary.dirs = MXS_COLWISE;
    f->items[2].primary.col_scale = a + 24576;
    f->items[2].col_fragment = a + 28672;
    f->items[2].master = m + 8192, f->items[2].start = 30, f->items[2].len = 1970;
    for (i = 0; i < 3; i++) f->items[i].primary.scale_layout = MXS_SCALES_SWIZZLED, f->items[i].master_dtype = MXS_F32;
    f->batch.items = f->items;
    f->batch.n_items = 3;
    f->batch.mode = mode;
    f->packed = a + 128 * 1024;
}

/* One way to break the batch; `want` is what plan, partial and apply say. */
typedef struct {
    const char *what;
    void (*fn)(wfx *f);
} wcase;

static void w_rowdata_is_coldata(wfx *f) { f->items[0].primary.col_data = f->items[0].primary.row_data; }
static void w_scale_in_own_data(wfx *f) { f->items[0].primary.row_scale = f->items[0].primary.row_data + 3149; }
static void w_scale_in_other_data(wfx *f) { f->items[2].primary.col_scale = f->items[1].primary.row_data + 1000; }
static void w_shared_scale(wfx *f) { f->items[1].primary.row_scale = f->items[0].primary.row_scale; }
static void w_shared_data(wfx *f) { f->items[1].primary.row_data = f->items[0].primary.col_data + 7; }
static void w_master_in_own_plane(wfx *f) { f->items[1].master = f->items[1].primary.row_data + 1200; }
static void w_master_in_other_scale(wfx *f) { f->items[2].master = f->items[0].primary.col_scale; }
static void w_master_over_fragment(wfx *f) { f->items[0].master = f->items[2].col_fragment - 4 * 1900 + 4; }
static void w_fragment_in_other_data(wfx *f) { f->items[2].col_fragment = f->items[0].primary.row_data + 2000; }
static void w_fragment_in_own_data(wfx *f) {
    f->items[0].row_fragment = f->items[0].primary.row_data + 100; /* the slice itself: use NULL for in place */
}
static void w_fragments_overlap(wfx *f) { f->items[0].col_fragment = f->items[2].col_fragment + 1969; }
static void w_fragment_over_scale(wfx *f) { f->items[0].row_fragment = f->items[1].primary.row_scale - 1899; }

static const wcase wcases[] = {
    {"row_data == col_data", w_rowdata_is_coldata},
    {"scale plane inside its own data plane", w_scale_in_own_data},
    {"scale plane inside another item's data plane (outside its slice)", w_scale_in_other_data},
    {"two items share a scale plane", w_shared_scale},
    {"two items' data planes overlap", w_shared_data},
    {"master inside its own data plane (outside the slice)", w_master_in_own_plane},
    {"master over another item's scale plane", w_master_in_other_scale},
    {"master over a fragment", w_master_over_fragment},
    {"fragment inside another item's data plane", w_fragment_in_other_data},
    {"fragment inside its own (kept) data plane", w_fragment_in_own_data},
    {"two fragments overlap by one byte", w_fragments_overlap},
    {"fragment over another item's scale plane", w_fragment_over_scale},
};

/* Every overlap between the batch's own buffers is found by the plan; a
 * batch changed that way after planning is refused by partial and apply with
 * the same code; nothing is written, the plan struct included. */
Test(aliasing, plan_rejects_every_overlap_in_the_batch) {
    size_t c;
    int mode;
    for (mode = 0; mode < 2; mode++)
        for (c = 0; c < sizeof wcases / sizeof wcases[0]; c++) {
            wfx f;
            mxs_wb_plan good, out, poisoned;
            wfx_init(&f, (mxs_wb_mode)mode);
            cr_assert_eq(mxs_wb_make_plan(&f.batch, &good, NULL), MXS_OK, "the fixture is valid");
            wcases[c].fn(&f);
            {
                snap_t before = snap(f.arena, AR_BYTES);
                memset(&out, 0xA5, sizeof out);
                memset(&poisoned, 0xA5, sizeof poisoned);
                cr_assert_eq(mxs_wb_make_plan(&f.batch, &out, NULL), MXS_ERR_ALIASING, "plan: %s", wcases[c].what);
                cr_assert_eq(memcmp(&out, &poisoned, sizeof out), 0, "plan written on error: %s", wcases[c].what);
                cr_assert_eq(mxs_host_wb_partial(&f.batch, &good, f.packed), MXS_ERR_ALIASING, "partial: %s",
                             wcases[c].what);
                cr_assert_eq(mxs_host_wb_apply(&f.batch, &good, f.packed), MXS_ERR_ALIASING, "apply: %s",
                             wcases[c].what);
                cr_assert(snap_same(&before), "bytes written despite: %s", wcases[c].what);
                snap_free(&before);
            }
            free(f.arena);
        }
}

/* What is allowed: masters that overlap each other (both only read), and any
 * pointer of a plane the primary does not have. */
Test(aliasing, overlapping_masters_and_absent_plane_decoys_are_fine) {
    wfx f;
    mxs_wb_plan plan;
    wfx_init(&f, MXS_WB_FUSED);
    f.items[1].master = f.items[0].master; /* same values reused */
    f.items[2].master = (const float *)f.items[0].master + 1;
    f.items[1].primary.col_data = f.items[0].primary.row_data; /* row-only item: decoys */
    f.items[1].primary.col_scale = f.items[0].primary.row_scale;
    f.items[2].primary.row_data = f.items[2].primary.col_scale; /* column-only item */
    f.items[2].primary.row_scale = f.packed;
    cr_assert_eq(mxs_wb_make_plan(&f.batch, &plan, NULL), MXS_OK);
    cr_assert_eq(mxs_host_wb_partial(&f.batch, &plan, f.packed), MXS_OK);
    cr_assert_eq(mxs_host_wb_apply(&f.batch, &plan, f.packed), MXS_OK);
    free(f.arena);
}

/* 4: a fragment overlapping the packed buffer (FUSED, where partial writes
 * fragments): the plan cannot see the packed buffer, partial and apply can;
 * they write nothing. */
Test(aliasing, fragment_overlapping_packed_is_rejected) {
    int mode;
    for (mode = 0; mode < 2; mode++) {
        wfx f;
        mxs_wb_plan plan;
        snap_t before;
        wfx_init(&f, (mxs_wb_mode)mode);
        f.items[2].col_fragment = f.packed + 10;
        cr_assert_eq(mxs_wb_make_plan(&f.batch, &plan, NULL), MXS_OK);
        before = snap(f.arena, AR_BYTES);
        cr_assert_eq(mxs_host_wb_partial(&f.batch, &plan, f.packed), MXS_ERR_ALIASING);
        cr_assert_eq(mxs_host_wb_apply(&f.batch, &plan, f.packed), MXS_ERR_ALIASING);
        /* packed over a master or a data plane (outside every slice) too */
        cr_assert_eq(mxs_host_wb_partial(&f.batch, &plan, (uint8_t *)(uintptr_t)f.items[1].master + 3),
                     MXS_ERR_ALIASING);
        cr_assert_eq(mxs_host_wb_partial(&f.batch, &plan, f.items[0].primary.col_data + 3000), MXS_ERR_ALIASING);
        cr_assert(snap_same(&before), "a rejected partial/apply wrote something");
        snap_free(&before);
        free(f.arena);
    }
}

/* ---- validate once, re-check cheaply ------------------------------------------ */

/* After the plan, changing anything it validated - a pointer, a shard, a
 * layout, a dtype, the mode, the order of items - is MXS_ERR_PLAN_MISMATCH
 * from partial and apply (each change alone keeps the batch valid), and
 * nothing is written. Master values, absent planes' pointers and a copy of
 * the item array are not changes. */
Test(aliasing, batch_changed_after_planning_is_caught_by_the_local_hash) {
    int c;
    for (c = 0; c < 15; c++) {
        wfx f;
        mxs_wb_plan plan;
        mxs_wb_item copy[3];
        uint8_t *spare;
        wfx_init(&f, MXS_WB_FUSED);
        spare = f.arena + 160 * 1024; /* unused bytes of the arena */
        cr_assert_eq(mxs_wb_make_plan(&f.batch, &plan, NULL), MXS_OK);
        switch (c) {
        case 0: f.items[0].master = (const float *)f.items[0].master + 1; break;
        case 1: f.items[0].start = 101; break;
        case 2: f.items[1].len = 994; break;
        case 3: f.items[0].primary.row_data = spare; break;
        case 4: f.items[0].primary.col_scale = spare; break;
        case 5: f.items[1].primary.row_scale = spare; break;
        case 6: f.items[2].col_fragment = spare; break;
        case 7: f.items[1].row_fragment = spare; break;
        case 8: f.items[2].primary.col_data = spare; break;
        case 9: f.items[0].primary.scale_layout = MXS_SCALES_PADDED; break;
        case 10: f.items[2].master_dtype = MXS_BF16; break;
        case 11: f.batch.mode = MXS_WB_STRICT; break;
        case 12: { /* two items swapped: same shapes in a different order would fool a fingerprint */
            mxs_wb_item t = f.items[0];
            f.items[0] = f.items[1];
            f.items[1] = t;
            break;
        }
        case 13: f.items[0].primary.dirs = MXS_ROWWISE; break;
        default:
            f.items[1].primary.cols = 39;
            f.items[1].len = 900;
            break;
        }
        {
            snap_t before = snap(f.arena, AR_BYTES);
            mxs_status s = mxs_host_wb_partial(&f.batch, &plan, f.packed);
            const mxs_status want = MXS_ERR_PLAN_MISMATCH;
            cr_assert_eq(s, want, "case %d: partial gave %s", c, mxs_status_str(s));
            s = mxs_host_wb_apply(&f.batch, &plan, f.packed);
            cr_assert_eq(s, want, "case %d: apply gave %s", c, mxs_status_str(s));
            cr_assert(snap_same(&before), "case %d: written despite the mismatch", c);
            snap_free(&before);
            /* a fresh plan accepts the changed batch */
            cr_assert_eq(mxs_wb_make_plan(&f.batch, &plan, NULL), MXS_OK, "case %d", c);
            cr_assert_eq(mxs_host_wb_partial(&f.batch, &plan, f.packed), MXS_OK, "case %d", c);
        }
        free(f.arena);

        /* not changes */
        wfx_init(&f, MXS_WB_FUSED);
        cr_assert_eq(mxs_wb_make_plan(&f.batch, &plan, NULL), MXS_OK);
        ((float *)(uintptr_t)f.items[0].master)[5] = 123.0f;
        f.items[1].primary.col_data = f.arena + 1; /* absent plane */
        memcpy(copy, f.items, sizeof copy);
        f.batch.items = copy;
        cr_assert_eq(mxs_host_wb_partial(&f.batch, &plan, f.packed), MXS_OK);
        cr_assert_eq(mxs_host_wb_apply(&f.batch, &plan, f.packed), MXS_OK);
        free(f.arena);
    }
}

/* ---- the group status byte ------------------------------------------------------ */

typedef struct {
    int calls;
    int64_t bytes;
    int64_t nonzero; /* bytes other than the status byte that were not 0 at the call */
    uint8_t status;  /* the status byte at the call */
    uint8_t set_to;  /* the "reduction" result for the status byte (another rank's MAX) */
    int64_t status_offset;
} grp_log;

static int grp_reduce(uint8_t *packed, int64_t bytes, void *user) {
    grp_log *g = (grp_log *)user;
    int64_t k;
    g->calls++;
    g->bytes = bytes;
    g->status = packed[g->status_offset];
    g->nonzero = 0;
    for (k = 0; k < bytes; k++) g->nonzero += k != g->status_offset && packed[k] != 0;
    if (g->set_to > packed[g->status_offset]) packed[g->status_offset] = g->set_to;
    return 0;
}

/* One rank's view of the protocol (the whole group runs in test_sim.c):
 * partial writes status 0; a remote failure (status byte raised by the MAX)
 * makes this rank skip apply with MXS_ERR_REMOTE; a local failure still joins
 * the one reduction with zeros and status 1, and returns its own error. */
Test(aliasing, writeback_status_byte_protocol) {
    int mode;
    for (mode = 0; mode < 2; mode++) {
        wfx f;
        mxs_wb_plan plan;
        grp_log g;
        snap_t before;
        /* fine everywhere */
        wfx_init(&f, (mxs_wb_mode)mode);
        cr_assert_eq(mxs_wb_make_plan(&f.batch, &plan, NULL), MXS_OK);
        memset(&g, 0, sizeof g);
        g.status_offset = plan.status_offset;
        cr_assert_eq(mxs_host_wb_writeback(&f.batch, &plan, f.packed, grp_reduce, &g), MXS_OK);
        cr_assert_eq(g.calls, 1);
        cr_assert_eq(g.bytes, plan.packed_bytes);
        cr_assert_eq(g.status, 0);
        free(f.arena);

        /* another rank failed: apply skipped, no scale byte written */
        wfx_init(&f, (mxs_wb_mode)mode);
        cr_assert_eq(mxs_wb_make_plan(&f.batch, &plan, NULL), MXS_OK);
        memset(&g, 0, sizeof g);
        g.status_offset = plan.status_offset;
        g.set_to = 1;
        cr_assert_eq(mxs_host_wb_writeback(&f.batch, &plan, f.packed, grp_reduce, &g), MXS_ERR_REMOTE);
        cr_assert_eq(g.calls, 1);
        cr_assert(poisoned(f.items[0].primary.row_scale, 512) && poisoned(f.items[0].primary.col_scale, 512) &&
                      poisoned(f.items[1].primary.row_scale, 512) && poisoned(f.items[2].primary.col_scale, 512),
                  "apply ran after a remote failure");
        if (mode == MXS_WB_STRICT)
            cr_assert(t_all_poisoned(f.arena, 32 * 1024), "STRICT: no data or scale byte before apply");
        /* apply on its own reads the status byte the same way */
        before = snap(f.arena, AR_BYTES);
        cr_assert_eq(f.packed[plan.status_offset], 1);
        cr_assert_eq(mxs_host_wb_apply(&f.batch, &plan, f.packed), MXS_ERR_REMOTE);
        cr_assert(snap_same(&before));
        snap_free(&before);
        free(f.arena);

        /* this rank fails before the reduction: it still joins once, with zeros
         * and status 1, and returns its own error; the primaries are untouched */
        wfx_init(&f, (mxs_wb_mode)mode);
        cr_assert_eq(mxs_wb_make_plan(&f.batch, &plan, NULL), MXS_OK);
        f.items[0].start = 99; /* changed after planning */
        memset(&g, 0, sizeof g);
        g.status_offset = plan.status_offset;
        cr_assert_eq(mxs_host_wb_writeback(&f.batch, &plan, f.packed, grp_reduce, &g), MXS_ERR_PLAN_MISMATCH);
        cr_assert_eq(g.calls, 1, "a failing rank joins the reduction exactly once");
        cr_assert_eq(g.bytes, plan.packed_bytes);
        cr_assert_eq(g.status, 1);
        cr_assert_eq(g.nonzero, 0, "the failing rank contributes zeros");
        cr_assert(t_all_poisoned(f.arena, 32 * 1024), "the failing rank wrote its primaries");
        free(f.arena);

        /* a failure that leaves no buffer to join with returns at once */
        wfx_init(&f, (mxs_wb_mode)mode);
        cr_assert_eq(mxs_wb_make_plan(&f.batch, &plan, NULL), MXS_OK);
        memset(&g, 0, sizeof g);
        g.status_offset = plan.status_offset;
        cr_assert_eq(mxs_host_wb_writeback(&f.batch, NULL, f.packed, grp_reduce, &g), MXS_ERR_INVALID_ARGUMENT);
        cr_assert_eq(mxs_host_wb_writeback(&f.batch, &plan, NULL, grp_reduce, &g), MXS_ERR_INVALID_ARGUMENT);
        cr_assert_eq(g.calls, 0);
        cr_assert_eq(mxs_host_wb_writeback(&f.batch, &plan, f.packed, NULL, NULL), MXS_ERR_INVALID_ARGUMENT);
        cr_assert(poisoned(f.arena, 128 * 1024 + 1024), "nothing written");
        /* a NULL batch with a usable plan and buffer still joins */
        cr_assert_eq(mxs_host_wb_writeback(NULL, &plan, f.packed, grp_reduce, &g), MXS_ERR_INVALID_ARGUMENT);
        cr_assert_eq(g.calls, 1);
        cr_assert_eq(g.status, 1);
        free(f.arena);
    }
}
