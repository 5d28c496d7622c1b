/* mxshard/writeback.h - distributed writeback on the CPU (SPEC sections 3, 4).
 *
 * Every data-parallel rank holds an FP32 (or bf16/f16) master shard of each
 * weight: the flat range [start, start+len), unaligned, empty or replicated.
 * Block scales span other ranks' shards, so:
 *
 *   1 plan     mxs_wb_make_plan    validate the batch; size the packed
 *                                  exponent buffer; fingerprint the plan
 *   2 partial  mxs_host_wb_partial zero the buffer, write this rank's
 *                                  partial exponents (fused: also cast the
 *                                  blocks wholly inside the shard)
 *   3 reduce   (caller)            ONE all-reduce, MAX over uint8, of the
 *                                  whole packed buffer - e.g.
 *                                  ncclAllReduce(p, p, n, ncclUint8, ncclMax)
 *   4 apply    mxs_host_wb_apply   reduced exponents -> every primary's scale
 *                                  planes (all blocks, in their layout); cast
 *                                  this rank's shard (fused: only the blocks
 *                                  straddling the shard's two edges)
 *   5 gather   (caller)            byte all-gather of each present data plane
 *
 * Packed buffer (SPEC section 4): in batch order the COMPACT row-wise scales
 * of every item that has a row-wise plane, then the COMPACT column-wise
 * scales of every item that has a column-wise plane:
 *
 *   | w0 row | w2 row | w3 row | w0 col | w1 col | w3 col |
 *   ^0                         ^row_region_bytes          ^packed_bytes
 *   (w1 column-only, w2 row-only, w0/w3 both)
 *
 * One byte per block: the MAX over ranks of e8m0(amax over the rank's part)
 * is e8m0(global amax) because the map is monotonic and sends 0 to 0x00.
 *
 * Modes. MXS_WB_FUSED (the default) reads the shard once: partial already
 * writes the final bytes of blocks wholly inside the shard, so the primary's
 * data changes before the reduction. MXS_WB_STRICT writes no data byte
 * before apply. Both give identical bytes.
 *
 * Outputs. Per plane, the cast bytes go in place into the primary's data
 * plane at [start, start+len), or - when the item's fragment pointer for the
 * plane is set - into that caller buffer of len bytes (FSDP). Nothing outside
 * the shard's slice of a data plane is ever written. With a fragment, the
 * primary's data pointer for that plane may be NULL; its scale pointer may
 * not (apply writes every block's scale).
 */
#ifndef MXSHARD_WRITEBACK_H
#define MXSHARD_WRITEBACK_H

#include <string.h>

#include "config.h"
#include "formats.h"
#include "geometry.h"
#include "quantize.h"
#include "status.h"
#include "tensor.h"

MXS_EXTERN_C_BEGIN

typedef enum { MXS_WB_FUSED = 0, MXS_WB_STRICT = 1 } mxs_wb_mode;

/* One weight of a writeback batch, as seen by this rank. */
typedef struct mxs_wb_item {
    mxs_tensor primary;     /* this rank's MXFP8 primary (by value: pointers are borrowed) */
    const void *master;     /* this rank's master shard: len elements; element 0 is flat index start */
    mxs_dtype master_dtype; /* MXS_F32 (default), MXS_BF16 or MXS_F16 */
    int64_t start, len;     /* the shard [start, start+len) of rows*cols; len = 0: owns nothing */
    uint8_t *row_fragment;  /* NULL: in place into primary.row_data + start; else len bytes */
    uint8_t *col_fragment;  /* NULL: in place into primary.col_data + start; else len bytes */
} mxs_wb_item;

/* A batch and its options; zero-initialise, then set items/n_items. */
typedef struct mxs_wb_batch {
    const mxs_wb_item *items;
    int64_t n_items;
    mxs_rounding rounding;  /* MXS_ROUND_CEIL (default) or MXS_ROUND_FLOOR */
    mxs_dtype round_through;/* MXS_F32 (default): none; MXS_BF16: round each master element to bf16
                               first (Transformer Engine's behaviour; makes writeback equal BF16
                               copy-back); MXS_F16: to f16 */
    mxs_wb_mode mode;       /* MXS_WB_FUSED (default) or MXS_WB_STRICT */
} mxs_wb_batch;

/* What every rank must agree on. */
typedef struct mxs_wb_plan {
    int64_t n_items;
    int64_t packed_bytes;     /* size of the packed exponent buffer */
    int64_t row_region_bytes; /* row-wise region is [0, row_region_bytes) */
    uint64_t fingerprint;     /* hash of (n_items, shapes, flags, rounding, round-through) */
} mxs_wb_plan;

/* Where one item's exponents sit in the packed buffer (-1: plane absent). */
typedef struct mxs_wb_slot {
    int64_t row_offset, col_offset;
} mxs_wb_slot;

/* 64-bit FNV-1a over a value's 8 little-endian bytes. */
MXS_HD uint64_t mxs__fnv_u64(uint64_t h, uint64_t v) {
    int k;
    for (k = 0; k < 8; k++) {
        h ^= (v >> (8 * k)) & 0xFFu;
        h *= 0x100000001B3ull;
    }
    return h;
}

/* Validates one item (everything that apply and partial will touch). */
MXS_API mxs_status mxs_wb_item_check(const mxs_wb_item *it) {
    const mxs_tensor *t = &it->primary;
    mxs_status s;
    if ((s = mxs_tensor_check_shape(t)) != MXS_OK) return s;
    if (!mxs_dtype_valid((int)it->master_dtype)) return MXS_ERR_INVALID_ARGUMENT;
    if ((s = mxs_shard_check(t->rows * t->cols, it->start, it->len)) != MXS_OK) return s;
    if (it->len > 0 && !it->master) return MXS_ERR_INVALID_ARGUMENT;
    if (it->row_fragment && !(t->dirs & MXS_ROWWISE)) return MXS_ERR_ABSENT_PLANE;
    if (it->col_fragment && !(t->dirs & MXS_COLWISE)) return MXS_ERR_ABSENT_PLANE;
    if ((t->dirs & MXS_ROWWISE) && (!t->row_scale || (!t->row_data && !it->row_fragment)))
        return MXS_ERR_ABSENT_PLANE;
    if ((t->dirs & MXS_COLWISE) && (!t->col_scale || (!t->col_data && !it->col_fragment)))
        return MXS_ERR_ABSENT_PLANE;
    return MXS_OK;
}

/* Validates the batch and computes its plan (and, if `slots` is not NULL,
 * each item's offsets; slots has n_items entries). Writes nothing on error. */
MXS_API mxs_status mxs_wb_make_plan(const mxs_wb_batch *b, mxs_wb_plan *plan, mxs_wb_slot *slots) {
    int64_t i, row_bytes = 0, col_bytes = 0, total;
    uint64_t h = 0xCBF29CE484222325ull;
    mxs_status s;
    if (!b || !plan || b->n_items < 0 || (b->n_items > 0 && !b->items)) return MXS_ERR_INVALID_ARGUMENT;
    if (!mxs_rounding_valid((int)b->rounding) || !mxs_dtype_valid((int)b->round_through) ||
        (b->mode != MXS_WB_FUSED && b->mode != MXS_WB_STRICT))
        return MXS_ERR_INVALID_ARGUMENT;
    h = mxs__fnv_u64(h, (uint64_t)b->n_items);
    h = mxs__fnv_u64(h, (uint64_t)b->rounding);
    h = mxs__fnv_u64(h, (uint64_t)b->round_through);
    for (i = 0; i < b->n_items; i++) {
        const mxs_tensor *t = &b->items[i].primary;
        mxs_scale_geom g;
        if ((s = mxs_wb_item_check(&b->items[i])) != MXS_OK) return s;
        if (t->dirs & MXS_ROWWISE) {
            mxs_scale_geom_make(t->rows, t->cols, MXS_ROWWISE, MXS_SCALES_COMPACT, &g);
            if (!mxs_add_ok(row_bytes, mxs_scale_geom_bytes(&g), &row_bytes)) return MXS_ERR_OVERFLOW;
        }
        if (t->dirs & MXS_COLWISE) {
            mxs_scale_geom_make(t->rows, t->cols, MXS_COLWISE, MXS_SCALES_COMPACT, &g);
            if (!mxs_add_ok(col_bytes, mxs_scale_geom_bytes(&g), &col_bytes)) return MXS_ERR_OVERFLOW;
        }
        h = mxs__fnv_u64(h, (uint64_t)t->rows);
        h = mxs__fnv_u64(h, (uint64_t)t->cols);
        h = mxs__fnv_u64(h, (uint64_t)t->dirs);
    }
    if (!mxs_add_ok(row_bytes, col_bytes, &total)) return MXS_ERR_OVERFLOW;
    if (slots) {
        int64_t ro = 0, co = row_bytes;
        for (i = 0; i < b->n_items; i++) {
            const mxs_tensor *t = &b->items[i].primary;
            mxs_scale_geom g;
            slots[i].row_offset = slots[i].col_offset = -1;
            if (t->dirs & MXS_ROWWISE) {
                mxs_scale_geom_make(t->rows, t->cols, MXS_ROWWISE, MXS_SCALES_COMPACT, &g);
                slots[i].row_offset = ro;
                ro += mxs_scale_geom_bytes(&g);
            }
            if (t->dirs & MXS_COLWISE) {
                mxs_scale_geom_make(t->rows, t->cols, MXS_COLWISE, MXS_SCALES_COMPACT, &g);
                slots[i].col_offset = co;
                co += mxs_scale_geom_bytes(&g);
            }
        }
    }
    plan->n_items = b->n_items;
    plan->packed_bytes = total;
    plan->row_region_bytes = row_bytes;
    plan->fingerprint = h;
    return MXS_OK;
}

/* Re-derives the plan and checks the caller's copy matches it. */
MXS_API mxs_status mxs__wb_check_plan(const mxs_wb_batch *b, const mxs_wb_plan *plan) {
    mxs_wb_plan now;
    mxs_status s;
    if (!plan) return MXS_ERR_INVALID_ARGUMENT;
    if ((s = mxs_wb_make_plan(b, &now, NULL)) != MXS_OK) return s;
    if (now.fingerprint != plan->fingerprint || now.packed_bytes != plan->packed_bytes ||
        now.row_region_bytes != plan->row_region_bytes || now.n_items != plan->n_items)
        return MXS_ERR_PLAN_MISMATCH;
    return MXS_OK;
}

/* Fills the engine job for item i; `packed` is the packed buffer. */
MXS_API void mxs__wb_job(const mxs_wb_batch *b, const mxs_wb_item *it, int mode, uint8_t *packed_row,
                         uint8_t *packed_col, mxs__host_job *job) {
    const mxs_tensor *t = &it->primary;
    memset(job, 0, sizeof *job);
    job->rows = t->rows;
    job->cols = t->cols;
    job->lo = it->start;
    job->hi = it->start + it->len;
    job->src = it->master;
    job->src_base = it->start;
    job->src_dtype = it->master_dtype;
    job->round_through = b->round_through;
    job->rounding = b->rounding;
    job->mode = mode;
    job->fused = b->mode == MXS_WB_FUSED;
    job->planes = t->dirs;
    job->out[0] = it->row_fragment ? it->row_fragment : t->row_data;
    job->out_base[0] = it->row_fragment ? it->start : 0;
    job->out[1] = it->col_fragment ? it->col_fragment : t->col_data;
    job->out_base[1] = it->col_fragment ? it->start : 0;
    job->scale[0] = packed_row;
    job->scale[1] = packed_col;
    if (t->dirs & MXS_ROWWISE) mxs_scale_geom_make(t->rows, t->cols, MXS_ROWWISE, MXS_SCALES_COMPACT, &job->geom[0]);
    if (t->dirs & MXS_COLWISE) mxs_scale_geom_make(t->rows, t->cols, MXS_COLWISE, MXS_SCALES_COMPACT, &job->geom[1]);
}

/* Step 2: zero `packed` (plan->packed_bytes) and write this rank's partial
 * exponents; in MXS_WB_FUSED mode also cast the blocks wholly inside each
 * shard. Validates the batch against `plan` first. */
MXS_API mxs_status mxs_host_wb_partial(const mxs_wb_batch *b, const mxs_wb_plan *plan, uint8_t *packed) {
    int64_t i, ro = 0, co;
    mxs_status s;
    if ((s = mxs__wb_check_plan(b, plan)) != MXS_OK) return s;
    if (!packed && plan->packed_bytes > 0) return MXS_ERR_INVALID_ARGUMENT;
    if (packed && plan->packed_bytes > 0) memset(packed, 0, (size_t)plan->packed_bytes);
    co = plan->row_region_bytes;
    for (i = 0; i < b->n_items; i++) {
        const mxs_wb_item *it = &b->items[i];
        const mxs_tensor *t = &it->primary;
        mxs__host_job job;
        int64_t rb = 0, cb = 0;
        if (t->dirs & MXS_ROWWISE) rb = t->rows * mxs_row_blocks_per_row(t->cols);
        if (t->dirs & MXS_COLWISE) cb = mxs_col_groups(t->rows) * t->cols;
        mxs__wb_job(b, it, MXS__JOB_PARTIAL, packed + ro, packed + co, &job);
        if (it->len > 0) mxs__host_run(&job);
        ro += rb;
        co += cb;
    }
    return MXS_OK;
}

/* Step 4: copy the reduced exponents into every primary's scale planes (all
 * blocks, in each primary's layout, padding 0x00) and cast this rank's shard
 * (MXS_WB_FUSED: only the blocks straddling the shard's edges; the rest was
 * cast by partial). */
MXS_API mxs_status mxs_host_wb_apply(const mxs_wb_batch *b, const mxs_wb_plan *plan, const uint8_t *packed) {
    int64_t i, ro = 0, co;
    mxs_status s;
    if ((s = mxs__wb_check_plan(b, plan)) != MXS_OK) return s;
    if (!packed && plan->packed_bytes > 0) return MXS_ERR_INVALID_ARGUMENT;
    co = plan->row_region_bytes;
    for (i = 0; i < b->n_items; i++) {
        const mxs_wb_item *it = &b->items[i];
        const mxs_tensor *t = &it->primary;
        mxs__host_job job;
        int64_t rb = 0, cb = 0;
        if (t->dirs & MXS_ROWWISE) {
            rb = t->rows * mxs_row_blocks_per_row(t->cols);
            mxs_host_convert_scales(t->rows, t->cols, MXS_ROWWISE, MXS_SCALES_COMPACT, packed + ro, t->scale_layout,
                                    t->row_scale);
        }
        if (t->dirs & MXS_COLWISE) {
            cb = mxs_col_groups(t->rows) * t->cols;
            mxs_host_convert_scales(t->rows, t->cols, MXS_COLWISE, MXS_SCALES_COMPACT, packed + co, t->scale_layout,
                                    t->col_scale);
        }
        /* the engine only reads the exponents in APPLY mode */
        mxs__wb_job(b, it, MXS__JOB_APPLY, (uint8_t *)(uintptr_t)(packed + ro), (uint8_t *)(uintptr_t)(packed + co),
                    &job);
        if (it->len > 0) mxs__host_run(&job);
        ro += rb;
        co += cb;
    }
    return MXS_OK;
}

/* All-reduce callback for mxs_host_wb_writeback: MAX over uint8 of `bytes`
 * bytes at `packed`, in place, across the data-parallel group. Return 0 on
 * success. */
typedef int (*mxs_wb_reduce_max_fn)(uint8_t *packed, int64_t bytes, void *user);

/* Steps 2-4 with the caller's reduction (one call of reduce_max). A failing
 * callback gives MXS_ERR_REDUCE and apply does not run (in FUSED mode the
 * blocks wholly inside each shard were already written by partial). */
MXS_API mxs_status mxs_host_wb_writeback(const mxs_wb_batch *b, const mxs_wb_plan *plan, uint8_t *packed,
                                         mxs_wb_reduce_max_fn reduce_max, void *user) {
    mxs_status s;
    if (!reduce_max) return MXS_ERR_INVALID_ARGUMENT;
    if ((s = mxs_host_wb_partial(b, plan, packed)) != MXS_OK) return s;
    if (reduce_max(packed, plan->packed_bytes, user) != 0) return MXS_ERR_REDUCE;
    return mxs_host_wb_apply(b, plan, packed);
}

MXS_EXTERN_C_END

#endif /* MXSHARD_WRITEBACK_H */
