/* SPDX-License-Identifier: MIT */
/* docs/contract.md section 6, the buffer rules: an output that overlaps an input or
 * another output is MXS_ERR_ALIASING, found before anything is written; the
 * writeback plan validates once and later phases re-check cheaply
 * (local_hash); the group status byte makes a rank-local failure fail every
 * rank instead of hanging one; geometry helpers never trap on bad input.
 *
 * Every rejected call runs on poisoned buffers, which are checked byte for
 * byte afterwards. Buffers that the library must never dereference (plan
 * checks only compare addresses) are still real memory: slices of arenas.
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <mxshard/mxshard.h>

#include "common.h"

/* A snapshot of a buffer, to prove a rejected call left it alone. */
typedef struct {
    const uint8_t *p;
    uint8_t *copy;
    size_t n;
} snap_t;

static snap_t snap(const void *p, size_t n) {
    snap_t s;
    s.p = (const uint8_t *)p;
    s.n = n;
    s.copy = (uint8_t *)malloc(n);
    cr_assert_not_null(s.copy);
    memcpy(s.copy, p, n);
    return s;
}
static int snap_same(const snap_t *s) { return memcmp(s->p, s->copy, s->n) == 0; }

/* 1 when the n bytes at p all hold T_POISON. */
static int poisoned(const uint8_t *p, size_t n) {
    size_t k;
    for (k = 0; k < n; k++)
        if (p[k] != T_POISON) return 0;
    return 1;
}
static void snap_free(snap_t *s) { free(s->copy); }

/* ==== issue reproductions ================================================= */

/* 1: a 40x70 row-only PADDED primary whose row_scale overlaps the packed
 * buffer. partial and apply (and the group step) reject it; partial and
 * apply write nothing at all. */
Test(aliasing, row_scale_overlapping_packed_is_rejected) {
    const int64_t rows = 40, cols = 70, elems = 40 * 70;
    float *master = (float *)malloc((size_t)elems * sizeof(float));
    int64_t i;
    int mode;
    cr_assert_not_null(master);
    for (i = 0; i < elems; i++) master[i] = (float)(i % 91) - 45.25f;
    for (mode = 0; mode < 2; mode++) {
        uint8_t *arena = t_alloc(4096), *data = t_alloc((size_t)elems);
        mxs_wb_item it;
        mxs_wb_batch b;
        mxs_wb_plan plan;
        memset(&it, 0, sizeof it);
        memset(&b, 0, sizeof b);
        it.primary.rows = rows;
        it.primary.cols = cols;
        it.primary.dirs = MXS_ROWWISE;
        it.primary.scale_layout = MXS_SCALES_PADDED;
        it.primary.row_data = data;
        it.primary.row_scale = arena + 64; /* 512 bytes; packed is [arena, arena + 121) */
        it.master = master;
        it.start = 0;
        it.len = elems;
        b.items = &it;
        b.n_items = 1;
        b.mode = (mxs_wb_mode)mode;
        cr_assert_eq(mxs_wb_make_plan(&b, &plan, NULL), MXS_OK, "the batch alone is fine");
        cr_assert_eq(plan.packed_bytes, 40 * 3 + 1);
        cr_assert_eq(mxs_host_wb_partial(&b, &plan, arena), MXS_ERR_ALIASING);
        cr_assert_eq(mxs_host_wb_apply(&b, &plan, arena), MXS_ERR_ALIASING);
        cr_assert(t_all_poisoned(arena, 4096), "a rejected partial/apply wrote the packed buffer or the scales");
        cr_assert(t_all_poisoned(data, (size_t)elems), "a rejected partial/apply wrote the data plane");
        cr_assert_eq(mxs_wb_check_buffer(&b, arena, plan.packed_bytes), MXS_ERR_ALIASING);
        cr_assert_eq(mxs_wb_check_buffer(&b, arena, 64), MXS_OK, "touching is not overlapping");
        cr_assert_eq(mxs_wb_check_buffer(&b, arena + 64 + 512, 100), MXS_OK);
        cr_assert_eq(mxs_wb_check_buffer(&b, arena + 64 + 511, 100), MXS_ERR_ALIASING);
        /* the packed buffer elsewhere: fine */
        {
            uint8_t *packed = t_alloc((size_t)plan.packed_bytes);
            cr_assert_eq(mxs_host_wb_partial(&b, &plan, packed), MXS_OK);
            cr_assert_eq(mxs_host_wb_apply(&b, &plan, packed), MXS_OK);
            free(packed);
        }
        free(arena);
        free(data);
    }
    free(master);
}

/* 2: dequantize's dst over the scale plane it reads (dst = row_scale + 64). */
Test(aliasing, dequantize_dst_over_its_scales_is_rejected) {
    const int64_t elems = 40 * 70;
    int layout, plane;
    float src[40 * 70];
    int64_t i;
    for (i = 0; i < elems; i++) src[i] = (float)((i * 37) % 101) - 50.5f;
    for (layout = 0; layout < 3; layout++)
        for (plane = MXS_ROWWISE; plane <= MXS_COLWISE; plane++) {
            mxs_tensor t;
            uint8_t *arena = t_alloc(64 * 1024);
            int64_t sb;
            snap_t before;
            memset(&t, 0, sizeof t);
            t.rows = 40, t.cols = 70, t.dirs = MXS_BOTH, t.scale_layout = (mxs_scale_layout)layout;
            t.row_data = arena, t.col_data = arena + 4096;
            t.row_scale = arena + 8192, t.col_scale = arena + 12288;
            cr_assert_eq(mxs_host_quantize(&t, src, MXS_F32, MXS_ROUND_CEIL), MXS_OK);
            sb = mxs_scale_bytes(&t, (mxs_dirs)plane);
            before = snap(arena, 64 * 1024);
            {
                uint8_t *scale = plane == MXS_ROWWISE ? t.row_scale : t.col_scale;
                uint8_t *data = plane == MXS_ROWWISE ? t.row_data : t.col_data;
                cr_assert_eq(mxs_host_dequantize(&t, (mxs_dirs)plane, scale + 64, MXS_F32), MXS_ERR_ALIASING);
                cr_assert_eq(mxs_host_dequantize(&t, (mxs_dirs)plane, scale + sb - 1, MXS_BF16), MXS_ERR_ALIASING);
                cr_assert_eq(mxs_host_dequantize(&t, (mxs_dirs)plane, scale - 2 * elems + 1, MXS_F16), MXS_ERR_ALIASING,
                             "dst ending one byte inside the scales");
                cr_assert_eq(mxs_host_dequantize(&t, (mxs_dirs)plane, data + elems - 1, MXS_F32), MXS_ERR_ALIASING);
                cr_assert(snap_same(&before), "a rejected dequantize wrote something");
                /* touching the scale plane from below is fine (dst right before it) */
                cr_assert_eq(mxs_host_dequantize(&t, (mxs_dirs)plane, arena + 20480, MXS_F32), MXS_OK);
            }
            snap_free(&before);
            free(arena);
        }
}

/* 3: quantize with row_data = (uint8_t *)src + 256, and every other way an
 * output plane can overlap src or another output plane. */
Test(aliasing, quantize_outputs_overlapping_src_or_each_other_are_rejected) {
    const int64_t elems = 40 * 70;
    uint8_t *arena = t_alloc(256 * 1024);
    float *src = (float *)(void *)arena; /* 11200 bytes at the start of the arena */
    int64_t i;
    int layout, c;
    for (i = 0; i < elems; i++) src[i] = (float)(i % 53) * 0.25f - 6.0f;
    for (layout = 0; layout < 3; layout++) {
        mxs_tensor good;
        snap_t before;
        memset(&good, 0, sizeof good);
        good.rows = 40, good.cols = 70, good.dirs = MXS_BOTH, good.scale_layout = (mxs_scale_layout)layout;
        good.row_data = arena + 16384, good.col_data = arena + 32768;
        good.row_scale = arena + 49152, good.col_scale = arena + 65536;
        before = snap(arena, 256 * 1024);
        for (c = 0; c < 9; c++) {
            mxs_tensor t = good;
            const void *s = src;
            mxs_dtype dt = MXS_F32;
            switch (c) {
            case 0: t.row_data = arena + 256; break;                         /* the case */
            case 1: t.col_scale = arena + 11199; break;                      /* last byte of src */
            case 2: t.col_data = t.row_data; break;                          /* two data planes */
            case 3: t.row_scale = t.col_data + elems - 1; break;             /* scale in a data plane */
            case 4: t.col_scale = t.row_scale + 3; break;                    /* two scale planes */
            case 5: s = arena + 16384 - 2 * elems + 2, dt = MXS_BF16; break; /* bf16 src into row_data */
            case 6: t.dirs = MXS_ROWWISE, t.row_scale = t.row_data + 100; break;
            case 7: t.dirs = MXS_COLWISE, t.col_data = arena + 4; break;
            default: t.dirs = MXS_COLWISE, t.col_scale = t.col_data; break;
            }
            cr_assert_eq(mxs_host_quantize(&t, s, dt, MXS_ROUND_CEIL), MXS_ERR_ALIASING, "case %d layout %d", c,
                         layout);
            cr_assert_eq(mxs_quantize_check(&t, s, dt, MXS_ROUND_CEIL), MXS_ERR_ALIASING);
            cr_assert(snap_same(&before), "case %d: a rejected quantize wrote something", c);
        }
        /* absent planes are not looked at: a row-only tensor may keep column
         * pointers that overlap anything */
        {
            mxs_tensor t = good;
            t.dirs = MXS_ROWWISE;
            t.col_data = arena + 256, t.col_scale = t.row_scale;
            cr_assert_eq(mxs_quantize_check(&t, src, MXS_F32, MXS_ROUND_CEIL), MXS_OK);
        }
        /* planes packed back to back (touching, not overlapping) are fine */
        {
            mxs_tensor t = good;
            t.row_data = arena + 11200;
            t.row_scale = t.row_data + elems;
            t.col_data = t.row_scale + mxs_scale_bytes(&good, MXS_ROWWISE);
            t.col_scale = t.col_data + elems;
            cr_assert_eq(mxs_host_quantize(&t, src, MXS_F32, MXS_ROUND_CEIL), MXS_OK);
            cr_assert_eq(memcmp(arena, before.copy, 11200), 0, "src unchanged");
        }
        snap_free(&before);
    }
    free(arena);
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

/* ---- many items: the chunked overlap pass ------------------------------------------ */

/* 300 items (more than two chunks of the overlap pass), every buffer its own
 * slice of one arena. One overlap planted between items i and j - in the
 * same chunk, across chunks, at a chunk boundary - of each kind is found;
 * masters overlapping across chunks are allowed. */
#define MANY 300
typedef struct {
    mxs_wb_item items[MANY];
    mxs_wb_batch batch;
    uint8_t *arena;
} many_t;

static void many_init(many_t *m) {
    int64_t i, at = 0;
    memset(m, 0, sizeof *m);
    m->arena = (uint8_t *)malloc((size_t)MANY * 8192);
    cr_assert_not_null(m->arena);
    for (i = 0; i < MANY; i++) {
        mxs_wb_item *it = &m->items[i];
        mxs_tensor *t = &it->primary;
        t->rows = 16 + i % 13, t->cols = 30 + i % 7; /* data <= 1008 bytes, scales <= 512 */
        t->dirs = i % 3 == 0 ? MXS_ROWWISE : MXS_BOTH;
        t->scale_layout = (mxs_scale_layout)(i % 3);
        t->row_data = m->arena + at, at += 1024;
        t->row_scale = m->arena + at, at += 512 + (i % 3 ? 512 : 0);
        if (t->dirs & MXS_COLWISE) {
            t->col_data = m->arena + at, at += 1024;
            t->col_scale = m->arena + at, at += 1024;
        }
        it->start = i % 17, it->len = 300;
        if (i % 5 == 2) {
            it->row_fragment = m->arena + at, at += 300;
            if (t->dirs & MXS_COLWISE) it->col_fragment = m->arena + at, at += 300;
        }
        it->master = m->arena + at, at += 1200;
        cr_assert_leq(at, (int64_t)MANY * 8192);
    }
    m->batch.items = m->items;
    m->batch.n_items = MANY;
}

Test(aliasing, overlaps_are_found_across_chunks_of_many_items) {
    static const int pairs[][2] = {{3, 5}, {3, 140}, {3, 299}, {127, 128}, {130, 250}, {0, 256}, {200, 201}};
    many_t *m = (many_t *)malloc(sizeof *m);
    mxs_wb_plan plan;
    size_t p;
    int kind;
    cr_assert_not_null(m);
    many_init(m);
    cr_assert_eq(mxs_wb_make_plan(&m->batch, &plan, NULL), MXS_OK);
    for (p = 0; p < sizeof pairs / sizeof pairs[0]; p++)
        for (kind = 0; kind < 5; kind++) {
            int i = pairs[p][0], j = pairs[p][1];
            mxs_wb_item save_i = m->items[i], save_j = m->items[j];
            mxs_status want = MXS_ERR_ALIASING, got;
            switch (kind) {
            case 0: /* output on output: onto the last byte of i's row data */
                m->items[j].primary.row_scale =
                    m->items[i].primary.row_data + m->items[i].primary.rows * m->items[i].primary.cols - 1;
                break;
            case 1: m->items[i].primary.row_data = m->items[j].primary.row_scale + 1; break; /* out-out */
            case 2: m->items[j].master = m->items[i].primary.row_scale; break;               /* later master */
            case 3: m->items[i].master = m->items[j].primary.row_data + 500; break;          /* chunk master */
            default:
                m->items[j].master = m->items[i].master;
                want = MXS_OK;
                break; /* master-master */
            }
            got = mxs_wb_make_plan(&m->batch, &plan, NULL);
            cr_assert_eq(got, want, "items %d, %d, kind %d: %s", i, j, kind, mxs_status_str(got));
            m->items[i] = save_i;
            m->items[j] = save_j;
        }
    cr_assert_eq(mxs_wb_make_plan(&m->batch, &plan, NULL), MXS_OK);
    free(m->arena);
    free(m);
}

/* Random batches (1..300 items) with buffers placed back to back or, now and
 * then, on top of an earlier one: the plan's verdict equals a brute-force
 * check of every pair of buffers under the rules of docs/writeback.md. */
typedef struct {
    uint64_t lo, hi;
    int item, master;
} bf_span;

static int brute_force_aliasing(const bf_span *s, int n) {
    int a, b;
    for (a = 0; a < n; a++)
        for (b = 0; b < a; b++) {
            if (s[a].master && s[b].master) continue; /* inputs may share */
            if (s[a].lo < s[b].hi && s[b].lo < s[a].hi) return 1;
        }
    return 0;
}

Test(aliasing, random_batches_agree_with_brute_force) {
    t_rng rng = t_rng_seed(4242);
    const size_t arena_bytes = 8u << 20;
    uint8_t *arena = (uint8_t *)malloc(arena_bytes);
    mxs_wb_item *items = (mxs_wb_item *)calloc(300, sizeof *items);
    bf_span *spans = (bf_span *)calloc(300 * 7, sizeof *spans);
    int iter, verdicts[2] = {0, 0};
    cr_assert(arena && items && spans);
    for (iter = 0; iter < 400; iter++) {
        int n = (int)t_between(&rng, 1, iter % 4 == 0 ? 300 : 40), ns = 0, k;
        int64_t at = 0;
        int64_t p_overlap = 2 + 7 * (int64_t)n; /* about one planted overlap every other batch */
        mxs_wb_batch b;
        mxs_wb_plan plan;
        mxs_status got;
        memset(items, 0, 300 * sizeof *items);
        for (k = 0; k < n; k++) {
            mxs_wb_item *it = &items[k];
            mxs_tensor *t = &it->primary;
            int q;
            t->rows = t_between(&rng, 1, 40), t->cols = t_between(&rng, 1, 40);
            t->dirs = (unsigned)t_between(&rng, 1, 3);
            t->scale_layout = (mxs_scale_layout)t_below(&rng, 3);
            it->master_dtype = (mxs_dtype)t_below(&rng, 3);
            it->start = t_below(&rng, t->rows * t->cols + 1);
            it->len = t_below(&rng, t->rows * t->cols - it->start + 1);
            for (q = 0; q < 7; q++) { /* 0 row data, 1 row scale, 2 row fragment, 3-5 the same for columns, 6 master */
                int plane = q < 3 ? MXS_ROWWISE : MXS_COLWISE, role = q % 3;
                int64_t bytes;
                uint8_t *ptr;
                if (q < 6 && !(t->dirs & (unsigned)plane)) continue;
                if (q == 6)
                    bytes = it->len * mxs_dtype_bytes(it->master_dtype); /* 0: master stays NULL */
                else if (role == 0)
                    bytes = t->rows * t->cols;
                else if (role == 1)
                    bytes = mxs_scale_bytes(t, (mxs_dirs)plane);
                else
                    bytes = t_below(&rng, 3) == 0 ? it->len : 0; /* a fragment now and then */
                if (bytes == 0) continue;
                if (ns > 0 && t_below(&rng, p_overlap) == 0) { /* on top of an earlier buffer */
                    const bf_span *o = &spans[t_below(&rng, ns)];
                    int64_t off =
                        (int64_t)(o->lo - (uint64_t)(uintptr_t)arena) + t_below(&rng, (int64_t)(o->hi - o->lo));
                    if (t_below(&rng, 2)) off -= t_below(&rng, bytes); /* or ending inside it */
                    ptr = arena + (off < 0 ? 0 : off);
                } else {
                    ptr = arena + at;
                    at += bytes + t_below(&rng, 3); /* touching, or a small gap */
                }
                cr_assert_lt(at, (int64_t)arena_bytes - 8192);
                if (q == 6)
                    it->master = ptr;
                else if (q == 0)
                    t->row_data = ptr;
                else if (q == 1)
                    t->row_scale = ptr;
                else if (q == 2)
                    it->row_fragment = ptr;
                else if (q == 3)
                    t->col_data = ptr;
                else if (q == 4)
                    t->col_scale = ptr;
                else
                    it->col_fragment = ptr;
                spans[ns].lo = (uint64_t)(uintptr_t)ptr;
                spans[ns].hi = spans[ns].lo + (uint64_t)bytes;
                spans[ns].item = k;
                spans[ns].master = q == 6;
                ns++;
            }
        }
        memset(&b, 0, sizeof b);
        b.items = items;
        b.n_items = n;
        got = mxs_wb_make_plan(&b, &plan, NULL);
        cr_assert(got == MXS_OK || got == MXS_ERR_ALIASING, "iter %d: %s", iter, mxs_status_str(got));
        cr_assert_eq(got == MXS_ERR_ALIASING, brute_force_aliasing(spans, ns), "iter %d (%d items): plan says %s", iter,
                     n, mxs_status_str(got));
        verdicts[got == MXS_ERR_ALIASING]++;
    }
    cr_assert_gt(verdicts[0], 50, "enough clean batches");
    cr_assert_gt(verdicts[1], 50, "enough batches with an overlap");
    free(arena);
    free(items);
    free(spans);
}

/* ==== 5: geometry helpers on bad input: no trap, documented results ======== */

Test(aliasing, geometry_helpers_never_divide_by_zero_or_overflow) {
    mxs_range r;
    mxs_range iv[2];
    /* mxs_bucket_shard: nranks 0 or negative, rank outside [0, nranks), negative bucket */
    r = mxs_bucket_shard(0, 100, 400, 0, 0);
    cr_assert(r.first == 0 && r.count == 0);
    r = mxs_bucket_shard(0, 100, 400, -4, 1);
    cr_assert_eq(r.count, 0);
    r = mxs_bucket_shard(0, 100, 400, 4, 4);
    cr_assert_eq(r.count, 0);
    r = mxs_bucket_shard(0, 100, 400, 4, -1);
    cr_assert_eq(r.count, 0);
    r = mxs_bucket_shard(0, 100, -400, 4, 1);
    cr_assert_eq(r.count, 0);
    /* huge offsets: offset + elems would overflow */
    r = mxs_bucket_shard(INT64_MAX - 5, 100, INT64_MAX, 1, 0);
    cr_assert(r.first == 0 && r.count == 0);
    r = mxs_bucket_shard(INT64_MAX - 100, 100, INT64_MAX, 1, 0); /* ends exactly at INT64_MAX */
    cr_assert(r.first == 0 && r.count == 100);
    r = mxs_range_in_weight(0, INT64_MAX, INT64_MAX, 1);
    cr_assert_eq(r.count, 0);
    r = mxs_range_in_weight(0, INT64_MAX, -3, 10);
    cr_assert_eq(r.count, 0);
    r = mxs_range_in_weight(INT64_MAX - 10, INT64_MAX, INT64_MAX - 20, 20);
    cr_assert(r.first == 10 && r.count == 10);
    /* cols < 1 */
    cr_assert_eq(mxs_row_block_of(0, 5), -1);
    cr_assert_eq(mxs_row_block_of(-3, 5), -1);
    cr_assert_eq(mxs_row_block_of(70, -1), -1);
    cr_assert_eq(mxs_row_block_of(70, 75), 3);
    r = mxs_row_block_span(0, 3);
    cr_assert_eq(r.count, 0);
    r = mxs_row_block_span(70, -2);
    cr_assert_eq(r.count, 0);
    r = mxs_shard_row_blocks(0, 0, 10);
    cr_assert_eq(r.count, 0);
    r = mxs_shard_groups(0, 0, 10);
    cr_assert_eq(r.count, 0);
    cr_assert_eq(mxs_shard_col_intervals(10, 0, 0, 10, 0, iv), 0);
    cr_assert_eq(mxs_ceil_div(7, 0), 0);
    cr_assert_eq(mxs_round_up(7, 0), 0);
    cr_assert_eq(mxs_ceil_div(7, 2), 4);
}

/* ==== the overlap rule itself ============================================== */

Test(aliasing, overlap_rule_is_exact_and_overflow_free) {
    uint8_t buf[64];
    const void *top = (const void *)(uintptr_t)(UINTPTR_MAX - 15);
    cr_assert(mxs__overlap(buf, 10, buf + 9, 1));
    cr_assert(!mxs__overlap(buf, 10, buf + 10, 1), "touching");
    cr_assert(!mxs__overlap(buf + 10, 5, buf, 10), "touching, other order");
    cr_assert(mxs__overlap(buf + 3, 1, buf, 64), "inside");
    cr_assert(!mxs__overlap(NULL, 10, buf, 10));
    cr_assert(!mxs__overlap(buf, 0, buf, 10), "empty");
    cr_assert(!mxs__overlap(buf, -5, buf, 10), "negative length is empty");
    cr_assert(mxs__overlap(buf, INT64_MAX, buf + 63, INT64_MAX), "huge lengths do not wrap");
    cr_assert(mxs__overlap(top, 16, top, INT64_MAX), "near the top of the address space");
    cr_assert(!mxs__overlap(buf, 16, top, INT64_MAX));
}
