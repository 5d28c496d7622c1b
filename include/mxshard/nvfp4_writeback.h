/* SPDX-License-Identifier: MIT */
/* mxshard/nvfp4_writeback.h - NVFP4 sharded writeback on the CPU
 * (docs/contract.md section 9.8, pictures in docs/writeback.md "NVFP4").
 *
 * Every data-parallel rank holds a master shard [start, start+len) of each
 * weight (even boundaries: mxs_nvfp4_shard_check) and the whole NVFP4
 * primary. Every block scale depends on the tensor's GLOBAL amax, so nothing
 * can be cast before one exchange of block amaxes:
 *
 *   1 plan     mxs_nvfp4_wb_make_plan    validate the batch completely
 *                                        (overlaps included); size the
 *                                        packed buffer; fingerprint
 *   2 partial  mxs_host_nvfp4_wb_partial zero the buffer, write this rank's
 *                                        partial amax of every block its
 *                                        shard touches (0 elsewhere) and of
 *                                        each tensor
 *   3 reduce   (caller)                  ONE all-reduce, MAX over uint16
 *                                        (bf16 round-through) or uint32, of
 *                                        plan.packed_count entries - e.g.
 *                                        ncclAllReduce(p, p, n, ncclBfloat16, ncclMax)
 *   4 apply    mxs_host_nvfp4_wb_apply   global amax = the reduced tensor
 *                                        amax entry (= the max of the reduced
 *                                        block amaxes: no second
 *                                        reduction); every block's E4M3
 *                                        scale into complete scale planes;
 *                                        cast the shard into its bytes of the
 *                                        row-wise plane and of the column
 *                                        stage
 *   5 gather   (caller)                  byte all-gather of the row-wise plane
 *                                        and of the column stage, by the
 *                                        ranges [start/2, ceil(end/2))
 *   6 finish   mxs_host_nvfp4_wb_finish  local nibble transpose: column stage
 *                                        -> the transposed column-wise plane
 *
 * The column stage. The column-wise plane is the TRANSPOSE (nvfp4.h): a
 * rank's row-major shard lands on a strided set of its nibbles, sharing bytes
 * with other ranks along every column. So apply writes the column-wise VALUES
 * (quantized with the column-wise block scales) in row-major order into the
 * caller's stage buffer (item.col_stage, ceil(rows*cols/2) bytes, the same
 * nibble positions as the row-wise plane); the stage is gathered exactly like
 * the row-wise plane and finish transposes it. Byte-exact for both block
 * shapes. With 16x16 tiles both planes use the tile's multiplier, so the
 * column-wise nibbles equal the row-wise ones: a primary with both planes may
 * leave col_stage NULL and finish transposes the gathered row-wise plane
 * (half the gather bytes).
 *
 * Fragments (FSDP, docs/contract.md 9.8). A rank that keeps only its shard
 * gives item.row_fragment / item.stage_fragment: apply writes the shard's
 * bytes of the row-wise plane / of the stage there instead, fragment byte 0
 * = plane byte start/2 (mxs_nvfp4_fragment_bytes bytes, same nibbles), and
 * primary.row_data / col_stage (and col_data) may be NULL. The caller
 * gathers the fragments into full planes; finish skips such items and
 * mxs_host_nvfp4_stage_to_col transposes a gathered stage.
 *
 * The batch, its plan, the packed buffer (one entry per block amax and per
 * tensor amax, then the status entry) and the validation: nvfp4_wbplan.h.
 *
 * There is no fused mode: the global amax gates every scale, so no element
 * can be cast before the reduction. Nothing outside the shard's bytes of the
 * row-wise plane and of the stage is written before finish; finish writes
 * the whole column-wise data plane from local data.
 */
#ifndef MXSHARD_NVFP4_WRITEBACK_H
#define MXSHARD_NVFP4_WRITEBACK_H

#include <string.h>

#include "config.h"
#include "formats.h"
#include "geometry.h"
#include "nvfp4.h"
#include "nvfp4_quantize.h"
#include "nvfp4_wbplan.h"
#include "quantize.h"
#include "status.h"
#include "tensor.h"
#include "writeback.h"

MXS_EXTERN_C_BEGIN

/* ---- the engine ------------------------------------------------------------------ */

#define MXS__NVFP4_WB_COLS 256 /* columns per pass: a multiple of 16 */

/* n nibbles idx, idx+1, ... of a packed plane from x[k] * e[k]: whole bytes
 * where a pair shares one, a read-modify-write only at an odd start or end. */
MXS_PRIVATE void mxs__nvfp4_wb_cast(uint8_t *data, int64_t idx, const float *x, const float *e, int64_t n) {
    int64_t k = 0;
    if ((idx & 1) && n > 0) {
        mxs_nvfp4_put(data, idx, mxs_nvfp4_quantize_elem(x[0], e[0]));
        k = 1;
    }
    for (; k + 1 < n; k += 2) data[(idx + k) >> 1] = mxs_e2m1x2_from_f32(x[k] * e[k], x[k + 1] * e[k + 1]);
    if (k < n) mxs_nvfp4_put(data, idx + k, mxs_nvfp4_quantize_elem(x[k], e[k]));
}

/* One item's shard, walked by 16-row groups and MXS__NVFP4_WB_COLS-column
 * passes so that every block is met whole within a pass. apply = 0: raise
 * the block entries by the shard's elements (partial); apply = 1: cast the
 * shard with the reduced entries and S_enc into the row-wise plane and the
 * column stage - or their fragments, where plane nibble i is fragment
 * nibble i - start (an integer offset: the same nibble position, start
 * being even). */
MXS_PRIVATE void mxs__nvfp4_wb_walk(const mxs_nvfp4_wb_item *it, mxs_dtype rt, void *packed, int64_t w,
                                    const mxs_nvfp4_wb_slot *sl, int apply, float s_enc) {
    float x[MXS__NVFP4_WB_COLS], erow[MXS__NVFP4_WB_COLS], ecol[MXS__NVFP4_WB_COLS];
    const mxs_nvfp4_tensor *t = &it->primary;
    const int64_t rows = t->rows, cols = t->cols, start = it->start, end = it->start + it->len;
    /* the entries: row-wise blocks or tiles (rg, from row_first), column-wise blocks (cg) */
    const mxs_wb_region rg = mxs__nvfp4_wb_region(rows, cols, MXS_ROWWISE, t->block);
    const mxs_wb_region cg = mxs__nvfp4_wb_region(rows, cols, MXS_COLWISE, t->block);
    const int two_d = t->block == MXS_NVFP4_16X16;
    const int64_t row_first = two_d ? sl->tile_entry : sl->row_entry;
    uint8_t *const row_out = it->row_fragment ? it->row_fragment : t->row_data;
    uint8_t *const col_out = it->stage_fragment ? it->stage_fragment : it->col_stage;
    const int64_t row_base = it->row_fragment ? start : 0, col_base = it->stage_fragment ? start : 0;
    const int do_row = (t->dirs & MXS_ROWWISE) != 0, do_col = (t->dirs & MXS_COLWISE) != 0 && col_out;
    const int64_t r_first = start / cols, r_last = (end - 1) / cols;
    int64_t g, cc, r, j;
    for (g = r_first / MXS_NVFP4_BLOCK; g <= r_last / MXS_NVFP4_BLOCK; g++) {
        const int64_t r0 = g * MXS_NVFP4_BLOCK > r_first ? g * MXS_NVFP4_BLOCK : r_first;
        const int64_t r1 =
            g * MXS_NVFP4_BLOCK + MXS_NVFP4_BLOCK < r_last + 1 ? g * MXS_NVFP4_BLOCK + MXS_NVFP4_BLOCK : r_last + 1;
        for (cc = 0; cc < cols; cc += MXS__NVFP4_WB_COLS) {
            const int64_t nc = cols - cc < MXS__NVFP4_WB_COLS ? cols - cc : MXS__NVFP4_WB_COLS;
            if (apply && do_col && !two_d) /* 16x1 blocks (c, g) of this pass */
                for (j = 0; j < nc; j++)
                    ecol[j] = mxs__nvfp4_wb_mult(packed, w, sl->col_entry + mxs_wb_region_entry(&cg, g, cc + j), s_enc);
            for (r = r0; r < r1; r++) {
                mxs_range seg = mxs_shard_row_cols(cols, r, start, it->len);
                const int64_t lo = seg.first > cc ? seg.first : cc;
                const int64_t hi = seg.first + seg.count < cc + nc ? seg.first + seg.count : cc + nc;
                const int64_t rb = r / rg.height; /* r's block row: r, or its tile row g */
                int64_t n = hi - lo, k0, k1, k;
                if (n <= 0) continue;
                mxs__host_load(x, it->master, it->master_dtype, r * cols + lo - start, n, rt);
                k0 = lo / MXS_NVFP4_BLOCK;
                k1 = (hi - 1) / MXS_NVFP4_BLOCK;
                for (k = k0; k <= k1; k++) { /* the row's 1x16 blocks (or tiles) met in [lo, hi) */
                    const int64_t a = k * MXS_NVFP4_BLOCK > lo ? k * MXS_NVFP4_BLOCK : lo;
                    const int64_t bnd =
                        k * MXS_NVFP4_BLOCK + MXS_NVFP4_BLOCK < hi ? k * MXS_NVFP4_BLOCK + MXS_NVFP4_BLOCK : hi;
                    const int64_t ent = row_first + mxs_wb_region_entry(&rg, rb, k);
                    if (!apply) {
                        if (two_d || do_row)
                            mxs__nvfp4_entry_raise(packed, w, ent, mxs__nvfp4_amax_run(x + (a - lo), 1, bnd - a));
                    } else if (two_d || do_row) {
                        const float e = mxs__nvfp4_wb_mult(packed, w, ent, s_enc);
                        for (j = a; j < bnd; j++) erow[j - lo] = e;
                    }
                }
                if (!apply) {
                    if (!two_d && (t->dirs & MXS_COLWISE))
                        for (j = 0; j < n; j++)
                            mxs__nvfp4_entry_raise(packed, w, sl->col_entry + mxs_wb_region_entry(&cg, g, lo + j),
                                                   mxs_amax_step(0.0f, x[j])); /* |x|, NaN -> 0 */
                    continue;
                }
                if (do_row) mxs__nvfp4_wb_cast(row_out, r * cols + lo - row_base, x, erow, n);
                if (do_col)
                    mxs__nvfp4_wb_cast(col_out, r * cols + lo - col_base, x, two_d ? erow : ecol + (lo - cc), n);
            }
        }
    }
    if (apply && end == rows * cols && ((rows * cols) & 1)) { /* the spare nibble of the last byte is 0 */
        if (do_row) row_out[(rows * cols - row_base) >> 1] &= 0x0Fu;
        if (do_col) col_out[(rows * cols - col_base) >> 1] &= 0x0Fu;
    }
}

/* Max over n entries from index first. */
MXS_PRIVATE float mxs__nvfp4_wb_region_max(const void *packed, int64_t w, int64_t first, int64_t n) {
    float m = 0.0f;
    int64_t i;
    for (i = 0; i < n; i++) {
        float a = mxs__nvfp4_entry_value(packed, w, first + i);
        m = a > m ? a : m;
    }
    return m;
}

/* Partial on a checked batch: zero the packed buffer (status entry included),
 * then every item's partial block amaxes and, as their max, its tensor amax
 * entry. */
MXS_PRIVATE void mxs__nvfp4_wb_host_partial(const mxs_nvfp4_wb_batch *b, const mxs_nvfp4_wb_plan *plan, void *packed) {
    const int64_t w = plan->entry_bytes;
    int64_t i, at = b->n_items;
    if (!packed) return; /* never (checked); keeps gcc's -Wnonnull quiet where a NULL is inlined */
    memset(packed, 0, (size_t)plan->packed_bytes);
    for (i = 0; i < b->n_items; i++) {
        const mxs_nvfp4_wb_item *it = &b->items[i];
        const mxs_nvfp4_tensor *t = &it->primary;
        const int64_t first = at;
        mxs_nvfp4_wb_slot sl;
        mxs__nvfp4_packed_slot(t, i, &at, &sl);
        if (it->len <= 0) continue;
        mxs__nvfp4_wb_walk(it, b->round_through, packed, w, &sl, 0, 0.0f);
        mxs__nvfp4_entry_raise(packed, w, sl.amax_entry, mxs__nvfp4_wb_region_max(packed, w, first, at - first));
    }
}

/* Apply on a checked batch whose status byte is 0: per item the global amax,
 * *amax, every scale (padding 0x00), then the cast of the shard. */
MXS_PRIVATE void mxs__nvfp4_wb_host_apply(const mxs_nvfp4_wb_batch *b, const mxs_nvfp4_wb_plan *plan,
                                          const void *packed) {
    const int64_t w = plan->entry_bytes;
    int64_t i, at = b->n_items;
    for (i = 0; i < b->n_items; i++) {
        const mxs_nvfp4_wb_item *it = &b->items[i];
        const mxs_nvfp4_tensor *t = &it->primary;
        const int64_t kr = mxs_ceil_div(t->cols, MXS_NVFP4_BLOCK), kc = mxs_ceil_div(t->rows, MXS_NVFP4_BLOCK);
        const mxs_wb_region rg = mxs__nvfp4_wb_region(t->rows, t->cols, MXS_ROWWISE, t->block);
        const mxs_wb_region cg = mxs__nvfp4_wb_region(t->rows, t->cols, MXS_COLWISE, t->block);
        mxs_scale_geom gr, gc;
        mxs_nvfp4_wb_slot sl;
        float amax, s_enc;
        int64_t m, k, q;
        mxs__nvfp4_packed_slot(t, i, &at, &sl);
        mxs_nvfp4_scale_geom_make(t->rows, t->cols, MXS_ROWWISE, t->scale_layout, &gr);
        mxs_nvfp4_scale_geom_make(t->rows, t->cols, MXS_COLWISE, t->scale_layout, &gc);
        amax = mxs__nvfp4_entry_value(packed, w, sl.amax_entry); /* the reduced tensor amax */
        s_enc = mxs_nvfp4_global_encode(amax);
        *t->amax = amax;
        if (t->scale_layout != MXS_SCALES_COMPACT) { /* padding entries are 0x00 */
            if (t->dirs & MXS_ROWWISE) memset(t->row_scale, 0, (size_t)mxs_scale_geom_bytes(&gr));
            if (t->dirs & MXS_COLWISE) memset(t->col_scale, 0, (size_t)mxs_scale_geom_bytes(&gc));
        }
        if (sl.tile_entry >= 0) { /* one scale per tile, repeated over its rows in both planes */
            for (m = 0; m < kc; m++)
                for (k = 0; k < kr; k++) {
                    uint8_t sc = mxs__nvfp4_wb_scale(packed, w, sl.tile_entry + mxs_wb_region_entry(&rg, m, k), s_enc);
                    if (t->dirs & MXS_ROWWISE)
                        for (q = m * MXS_NVFP4_BLOCK; q < t->rows && q < (m + 1) * MXS_NVFP4_BLOCK; q++)
                            t->row_scale[mxs_scale_geom_offset(&gr, q, k)] = sc;
                    if (t->dirs & MXS_COLWISE)
                        for (q = k * MXS_NVFP4_BLOCK; q < t->cols && q < (k + 1) * MXS_NVFP4_BLOCK; q++)
                            t->col_scale[mxs_scale_geom_offset(&gc, q, m)] = sc;
                }
        }
        if (sl.row_entry >= 0)
            for (m = 0; m < t->rows; m++)
                for (k = 0; k < kr; k++)
                    t->row_scale[mxs_scale_geom_offset(&gr, m, k)] =
                        mxs__nvfp4_wb_scale(packed, w, sl.row_entry + mxs_wb_region_entry(&rg, m, k), s_enc);
        if (sl.col_entry >= 0)
            for (m = 0; m < t->cols; m++)
                for (k = 0; k < kc; k++)
                    t->col_scale[mxs_scale_geom_offset(&gc, m, k)] =
                        mxs__nvfp4_wb_scale(packed, w, sl.col_entry + mxs_wb_region_entry(&cg, k, m), s_enc);
        if (it->len > 0) mxs__nvfp4_wb_walk(it, b->round_through, (void *)(uintptr_t)packed, w, &sl, 1, s_enc);
    }
}

/* The column-wise plane (cols x rows, packed) from the row-major nibbles of
 * src (rows x cols, packed): dst nibble c*rows + r = src nibble r*cols + c;
 * the spare nibble is 0. */
MXS_PRIVATE void mxs__nvfp4_transpose(uint8_t *MXS_RESTRICT dst, const uint8_t *MXS_RESTRICT src, int64_t rows,
                                      int64_t cols) {
    const int64_t n = rows * cols;
    int64_t j, r = 0, c = 0;
    for (j = 0; j < n; j += 2) {
        uint8_t lo = mxs_nvfp4_get(src, mxs_nvfp4_data_index(rows, cols, MXS_ROWWISE, r, c)), hi = 0;
        if (++r == rows) {
            r = 0;
            c++;
        }
        if (j + 1 < n) {
            hi = mxs_nvfp4_get(src, mxs_nvfp4_data_index(rows, cols, MXS_ROWWISE, r, c));
            if (++r == rows) {
                r = 0;
                c++;
            }
        }
        dst[j >> 1] = (uint8_t)(lo | (hi << 4));
    }
}

/* ---- public API ---------------------------------------------------------------- */

/* Step 2: zero `packed` (plan->packed_bytes bytes, aligned to
 * plan->entry_bytes) and write this rank's partial block amaxes. Checks first,
 * in O(n_items), that the batch is the planned one (else the fault, or
 * MXS_ERR_PLAN_MISMATCH) and that packed is not NULL, is aligned
 * (MXS_ERR_INVALID_ARGUMENT) and overlaps no buffer of the batch
 * (MXS_ERR_ALIASING). Writes nothing but `packed`, and nothing on error. */
MXS_NODISCARD MXS_API mxs_status mxs_host_nvfp4_wb_partial(const mxs_nvfp4_wb_batch *b, const mxs_nvfp4_wb_plan *plan,
                                                           void *packed) {
    mxs_status s;
    if ((s = mxs__nvfp4_wb_check_phase(b, plan, packed)) != MXS_OK) return s;
    mxs__nvfp4_wb_host_partial(b, plan, packed);
    return MXS_OK;
}

/* Step 4, after the MAX reduction of `packed`: same checks as partial; then,
 * when the status byte (((uint8_t *)packed)[plan->status_offset]) is not 0,
 * writes nothing and returns MXS_ERR_REMOTE. Otherwise, for every item: the
 * global amax (its reduced tensor-amax entry) into *amax, every E4M3 scale
 * of every present plane in the primary's layout (padding 0x00), and the
 * cast of this rank's shard into bytes [start/2, ceil((start+len)/2)) of the
 * row-wise plane and of the column stage - or into all the bytes of their
 * fragments. */
MXS_NODISCARD MXS_API mxs_status mxs_host_nvfp4_wb_apply(const mxs_nvfp4_wb_batch *b, const mxs_nvfp4_wb_plan *plan,
                                                         const void *packed) {
    mxs_status s;
    if ((s = mxs__nvfp4_wb_check_phase(b, plan, packed)) != MXS_OK) return s;
    if (((const uint8_t *)packed)[plan->status_offset] != 0) return MXS_ERR_REMOTE;
    mxs__nvfp4_wb_host_apply(b, plan, packed);
    return MXS_OK;
}

/* Step 6, after the gather: the column-wise data plane of every item that
 * has one, transposed from its gathered column stage (or, with a NULL stage,
 * from its gathered row-wise plane: 16x16). Local; checks that the batch is
 * the planned one. Only the column-wise data planes are written. Items whose
 * column-wise values went to a fragment (a stage fragment; 16x16 without a
 * stage: a row fragment) are skipped: the caller gathers the fragments into
 * a full stage (or row-wise plane) and calls mxs_host_nvfp4_stage_to_col. */
MXS_NODISCARD MXS_API mxs_status mxs_host_nvfp4_wb_finish(const mxs_nvfp4_wb_batch *b, const mxs_nvfp4_wb_plan *plan) {
    int64_t i;
    mxs_status s;
    if ((s = mxs__nvfp4_wb_check_plan(b, plan)) != MXS_OK) return s;
    for (i = 0; i < b->n_items; i++) {
        const mxs_nvfp4_wb_item *it = &b->items[i];
        const mxs_nvfp4_tensor *t = &it->primary;
        if (mxs__nvfp4_wb_finishes(it))
            mxs__nvfp4_transpose(t->col_data, it->col_stage ? it->col_stage : t->row_data, t->rows, t->cols);
    }
    return MXS_OK;
}

/* What mxs_host_nvfp4_stage_to_col (and the CUDA one) checks before writing:
 * t's shape (mxs_nvfp4_tensor_check_shape), a column-wise plane with its
 * data (MXS_ERR_ABSENT_PLANE; nothing else of t is read or needed), a
 * non-NULL stage (MXS_ERR_INVALID_ARGUMENT) and the stage and the
 * column-wise data plane disjoint (ceil(rows*cols/2) bytes each:
 * MXS_ERR_ALIASING). */
MXS_NODISCARD MXS_API mxs_status mxs_nvfp4_stage_to_col_check(const mxs_nvfp4_tensor *t, const uint8_t *stage) {
    int64_t dbytes;
    mxs_status s;
    if ((s = mxs_nvfp4_tensor_check_shape(t)) != MXS_OK) return s;
    if (!(t->dirs & MXS_COLWISE) || !t->col_data) return MXS_ERR_ABSENT_PLANE;
    if (!stage) return MXS_ERR_INVALID_ARGUMENT;
    dbytes = mxs_nvfp4_data_plane_bytes(t->rows, t->cols);
    return mxs__overlap(stage, dbytes, t->col_data, dbytes) ? MXS_ERR_ALIASING : MXS_OK;
}

/* Finish's transpose on its own, for a caller that gathered fragments (FSDP):
 * t->col_data (the whole column-wise data plane, the spare nibble 0) from
 * `stage`, a full ceil(rows*cols/2)-byte column stage in row-major nibble
 * order - for a 16x16 primary also its gathered row-wise plane. No batch or
 * plan; validated by mxs_nvfp4_stage_to_col_check, nothing written on
 * error. Only t->col_data is written. */
MXS_NODISCARD MXS_API mxs_status mxs_host_nvfp4_stage_to_col(const mxs_nvfp4_tensor *t, const uint8_t *stage) {
    mxs_status s;
    if ((s = mxs_nvfp4_stage_to_col_check(t, stage)) != MXS_OK) return s;
    mxs__nvfp4_transpose(t->col_data, stage, t->rows, t->cols);
    return MXS_OK;
}

/* Reduction callback of mxs_host_nvfp4_wb_writeback: MAX over `count`
 * unsigned entries of `entry_bytes` (2: uint16, 4: uint32) at `packed`, in
 * place, across the data-parallel group. Return 0 on success. */
typedef int (*mxs_nvfp4_wb_reduce_max_fn)(void *packed, int64_t count, int64_t entry_bytes, void *user);

/* Steps 2-4 with the caller's reduction, exactly one call of reduce_max on
 * every rank that can size its buffer (writeback.h's protocol):
 *
 *   checks pass   partial (status 0), reduce_max, apply - unless the reduced
 *                 status byte is not 0: MXS_ERR_REMOTE, apply skipped
 *   checks fail   zero packed, set every byte of the status entry to 1, call
 *                 reduce_max once, return this rank's error. Needs a plan
 *                 and a non-NULL packed buffer aligned to its entry size
 *                 (else it returns at once and cannot join). packed is then
 *                 the only memory written.
 *
 * A failing callback gives MXS_ERR_REDUCE (apply not run). The caller then
 * gathers and calls mxs_host_nvfp4_wb_finish. */
MXS_NODISCARD MXS_API mxs_status mxs_host_nvfp4_wb_writeback(const mxs_nvfp4_wb_batch *b, const mxs_nvfp4_wb_plan *plan,
                                                             void *packed, mxs_nvfp4_wb_reduce_max_fn reduce_max,
                                                             void *user) {
    mxs_status s;
    if (!reduce_max) return MXS_ERR_INVALID_ARGUMENT;
    if ((s = mxs__nvfp4_wb_check_phase(b, plan, packed)) != MXS_OK) {
        if (plan && packed && (plan->entry_bytes == 2 || plan->entry_bytes == 4) && plan->packed_count >= 1 &&
            plan->packed_bytes == plan->packed_count * plan->entry_bytes &&
            plan->status_offset == plan->packed_bytes - 1 &&
            (uint64_t)(uintptr_t)packed % (uint64_t)plan->entry_bytes == 0) {
            memset(packed, 0, (size_t)plan->packed_bytes);
            memset((uint8_t *)packed + plan->packed_bytes - plan->entry_bytes, 1, (size_t)plan->entry_bytes);
            (void)reduce_max(packed, plan->packed_count, plan->entry_bytes, user); /* report this rank's own error */
        }
        return s;
    }
    mxs__nvfp4_wb_host_partial(b, plan, packed);
    if (reduce_max(packed, plan->packed_count, plan->entry_bytes, user) != 0) return MXS_ERR_REDUCE;
    if (((const uint8_t *)packed)[plan->status_offset] != 0) return MXS_ERR_REMOTE;
    mxs__nvfp4_wb_host_apply(b, plan, packed);
    return MXS_OK;
}

MXS_EXTERN_C_END

#endif /* MXSHARD_NVFP4_WRITEBACK_H */
