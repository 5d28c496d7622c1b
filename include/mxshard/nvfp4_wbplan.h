/* SPDX-License-Identifier: MIT */
/* mxshard/nvfp4_wbplan.h - the plan of an NVFP4 sharded writeback
 * (docs/contract.md section 9.8): the batch and its item, fragments, the
 * packed buffer's entries, validation and mxs_nvfp4_wb_make_plan. The
 * protocol that runs a plan (partial, apply, finish): nvfp4_writeback.h,
 * which includes this header.
 *
 * Packed buffer: an array of plan.entry_bytes-wide unsigned entries
 * (uint16 with round_through = MXS_BF16, else uint32), host byte order:
 *
 *   [ tensor amaxes: one entry per item, item i at entry i ]
 *   then per item in batch order:
 *   1x16 item   [ row blocks: rows x ceil(cols/16) ][ col blocks: cols x ceil(rows/16) ]
 *               (each only if the plane is present; entry (m, k) at m*K + k)
 *   16x16 item  [ tiles: ceil(rows/16) x ceil(cols/16), entry (R, C) at R*TC + C ]
 *               (one region for either plane set: both planes share the tiles)
 *   then one status entry: the last; its last byte is plan.status_offset.
 *
 * A tensor-amax entry is the max of the item's block entries on this rank
 * (0 without a shard), so after the MAX reduction it is the tensor's global
 * amax: the max of the reduced block amaxes, carried by the same reduction
 * (apply reads it instead of scanning every block: the GPU's apply is then
 * one pass with no grid-wide dependency).
 *
 * An entry is the block amax as mxs_nvfp4_amax_entry: the high 16 bits of its
 * f32 pattern (exactly its bf16 pattern: with bf16 round-through every
 * element, hence every amax, is a bf16 value) or all 32 bits. Amaxes are
 * non-negative and never NaN, and for those the bit patterns order as the
 * values, so MAX over the unsigned entries is MAX over the amaxes, exactly.
 */
#ifndef MXSHARD_NVFP4_WBPLAN_H
#define MXSHARD_NVFP4_WBPLAN_H

#include "config.h"
#include "formats.h"
#include "nvfp4.h"
#include "status.h"
#include "tensor.h"
#include "writeback.h"

MXS_EXTERN_C_BEGIN

/* One weight of an NVFP4 writeback batch, as seen by this rank. */
typedef struct mxs_nvfp4_wb_item {
    mxs_nvfp4_tensor primary; /* this rank's whole NVFP4 primary (pointers borrowed; amax required) */
    const void *master;       /* len elements; element 0 is flat index start */
    mxs_dtype master_dtype;   /* MXS_F32 (default), MXS_BF16 or MXS_F16 */
    int64_t start, len;       /* the shard; even boundaries (mxs_nvfp4_shard_check); len = 0: none */
    uint8_t *col_stage;       /* column-wise plane: ceil(rows*cols/2) bytes, the column-wise values
                                 in row-major order (gathered, then transposed by finish). May be
                                 NULL only for a 16x16 primary that also has the row-wise plane,
                                 or with a stage fragment. */
    uint8_t *row_fragment;    /* optional (FSDP): the row-wise plane's bytes of the shard go here
                                 instead of primary.row_data (then optional):
                                 mxs_nvfp4_fragment_bytes(start, len) bytes, byte 0 = plane byte
                                 start/2 */
    uint8_t *stage_fragment;  /* optional (FSDP): the column stage's bytes of the shard go here
                                 instead of col_stage (then optional; so is primary.col_data) */
} mxs_nvfp4_wb_item;

/* A batch; zero-initialise, then set items / n_items. */
typedef struct mxs_nvfp4_wb_batch {
    const mxs_nvfp4_wb_item *items;
    int64_t n_items;
    mxs_dtype round_through; /* MXS_F32 (default): none, uint32 entries; MXS_BF16: round each master
                                element to bf16 first (TE's master cast), uint16 entries; MXS_F16: to
                                f16, uint32 entries */
} mxs_nvfp4_wb_batch;

/* The plan of a batch. Every field but local_hash is the same on every rank. */
typedef struct mxs_nvfp4_wb_plan {
    int64_t n_items;
    int64_t entry_bytes;   /* 2 (uint16) or 4 (uint32): the reduction's element type */
    int64_t packed_count;  /* entries, the status entry included: the reduction's count */
    int64_t packed_bytes;  /* packed_count * entry_bytes */
    uint64_t fingerprint;  /* hash of (n_items, rows, cols, dirs, block per item, round-through) */
    int64_t status_offset; /* packed_bytes - 1: the group status byte (0 fine, 1 a rank failed) */
    uint64_t local_hash;   /* rank-local: hash of the validated batch (pointers, shards, ...) */
} mxs_nvfp4_wb_plan;

/* Where one item's amaxes sit, as ENTRY indices into the packed buffer
 * (-1: region absent). 1x16: row_entry / col_entry; 16x16: tile_entry;
 * amax_entry: the tensor amax (the item's index). */
typedef struct mxs_nvfp4_wb_slot {
    int64_t row_entry, col_entry, tile_entry, amax_entry;
} mxs_nvfp4_wb_slot;

/* ---- fragments ---------------------------------------------------------------
 *
 * A fragment is the shard's byte range of a data plane (or stage), held
 * apart (FSDP: the rank has no full plane):
 *
 *   plane bytes   0   1   2   3   4   5   6   7   8   9  10     (3 x 7: 21 nibbles)
 *   shard         .   .   .   .   .  [10 .. 21)            start = 10, len = 11
 *   fragment                         0   1   2   3   4   5     = plane bytes 5 .. 10
 *                                                              (spare high nibble 0)
 *
 * fragment byte j = plane byte start/2 + j, nibbles in the same positions
 * (start is even); mxs_nvfp4_fragment_bytes(start, len) = ceil((start+len)/2)
 * - start/2 bytes (0 for an empty shard). Nibble i of the plane is nibble
 * i - start of the fragment. */

/* Bytes of a fragment of the shard [start, start+len): 0 when len <= 0. */
MXS_HD int64_t mxs_nvfp4_fragment_bytes(int64_t start, int64_t len) {
    return len > 0 ? (start + len + 1) / 2 - start / 2 : 0;
}

/* Whether the item's column-wise values go to a fragment: a stage fragment,
 * or (16x16 without a stage) a row fragment, finish's source then. Finish
 * skips such an item: its column stage exists only after the caller's
 * gather (mxs_host_nvfp4_stage_to_col). */
MXS_PRIVATE int mxs__nvfp4_wb_col_fragmented(const mxs_nvfp4_wb_item *it) {
    return it->stage_fragment != NULL || (it->col_stage == NULL && it->row_fragment != NULL);
}

/* Whether finish transposes the item: a column-wise plane whose source (the
 * stage, or the row-wise plane) apply wrote in place. */
MXS_PRIVATE int mxs__nvfp4_wb_finishes(const mxs_nvfp4_wb_item *it) {
    return (it->primary.dirs & MXS_COLWISE) && !mxs__nvfp4_wb_col_fragmented(it);
}

/* ---- entries (one rule for every writer and reader) ----------------------- */

/* Entry width for a batch round-through: 2 for MXS_BF16, else 4. */
MXS_HD int64_t mxs_nvfp4_wb_entry_bytes(mxs_dtype round_through) { return round_through == MXS_BF16 ? 2 : 4; }

/* Block amax (>= 0, not NaN) -> entry: its f32 bits, or their high half for
 * 2-byte entries (exact: the amax is a bf16 value then). */
MXS_HD uint32_t mxs_nvfp4_amax_entry(float amax, int64_t entry_bytes) {
    uint32_t u = mxs_f32_bits(amax);
    return entry_bytes == 2 ? u >> 16 : u;
}

/* Entry -> block amax. */
MXS_HD float mxs_nvfp4_entry_amax(uint32_t e, int64_t entry_bytes) {
    return mxs_f32_from_bits(entry_bytes == 2 ? e << 16 : e);
}

MXS_HD uint32_t mxs__nvfp4_entry_get(const void *packed, int64_t w, int64_t i) {
    return w == 2 ? (uint32_t)((const uint16_t *)packed)[i] : ((const uint32_t *)packed)[i];
}

/* The amax entry i holds (a block amax, or a tensor-amax entry: after the
 * reduction the tensor's global amax). */
MXS_HD float mxs__nvfp4_entry_value(const void *packed, int64_t w, int64_t i) {
    return mxs_nvfp4_entry_amax(mxs__nvfp4_entry_get(packed, w, i), w);
}

/* Stored scale code of the block whose reduced entry is i. */
MXS_HD uint8_t mxs__nvfp4_wb_scale(const void *packed, int64_t w, int64_t i, float s_enc) {
    return mxs_nvfp4_block_scale(mxs__nvfp4_entry_value(packed, w, i), s_enc);
}

/* Element multiplier of the block whose reduced entry is i. */
MXS_HD float mxs__nvfp4_wb_mult(const void *packed, int64_t w, int64_t i, float s_enc) {
    return mxs_nvfp4_encode_mult(mxs__nvfp4_wb_scale(packed, w, i, s_enc), s_enc);
}

/* entry i = max(entry i, entry of amax a) */
MXS_HD void mxs__nvfp4_entry_raise(void *packed, int64_t w, int64_t i, float a) {
    uint32_t v = mxs_nvfp4_amax_entry(a, w);
    if (v <= mxs__nvfp4_entry_get(packed, w, i)) return;
    if (w == 2)
        ((uint16_t *)packed)[i] = (uint16_t)v;
    else
        ((uint32_t *)packed)[i] = v;
}

/* The NVFP4 rule of mxs_wb_region's table (writeback.h), for a checked shape
 * (rows, cols >= 1, rows*cols in int64: no product below can overflow):
 * 16x16 blocks give the tiles, whichever the plane (both planes share them);
 * 1x16 blocks the plane's COMPACT scale order, entry (m, k) at m*K + k with
 * (m, k) = (r, k) row-wise and (c, g) column-wise. */
MXS_HD mxs_wb_region mxs__nvfp4_wb_region(int64_t rows, int64_t cols, mxs_dirs plane, mxs_nvfp4_block block) {
    const int64_t kr = mxs_ceil_div(cols, MXS_NVFP4_BLOCK), kc = mxs_ceil_div(rows, MXS_NVFP4_BLOCK);
    const int tiles = block == MXS_NVFP4_16X16, col = !tiles && plane == MXS_COLWISE;
    mxs_wb_region g;
    g.height = tiles || col ? MXS_NVFP4_BLOCK : 1;
    g.block_rows = tiles || col ? kc : rows;
    g.per_row = col ? cols : kr;
    g.row_step = col ? 1 : kr;
    g.col_step = col ? kc : 1;
    return g;
}

/* The region of an NVFP4 weight's `plane` (MXS_ROWWISE or MXS_COLWISE)
 * entries for `block`: with MXS_NVFP4_16X16 the tiles for either plane.
 * MXS_ERR_INVALID_ARGUMENT for a NULL out, a bad plane or block,
 * MXS_ERR_SHAPE, MXS_ERR_OVERFLOW (rows*cols beyond int64). */
MXS_NODISCARD MXS_HD mxs_status mxs_nvfp4_wb_region_make(int64_t rows, int64_t cols, mxs_dirs plane,
                                                         mxs_nvfp4_block block, mxs_wb_region *out) {
    int64_t n;
    if (!out || !mxs_plane_valid((int)plane) || !mxs_nvfp4_block_valid((int)block)) return MXS_ERR_INVALID_ARGUMENT;
    if (rows < 1 || cols < 1) return MXS_ERR_SHAPE;
    if (!mxs_mul_ok(rows, cols, &n)) return MXS_ERR_OVERFLOW;
    *out = mxs__nvfp4_wb_region(rows, cols, plane, block);
    return MXS_OK;
}

/* Where item `index`'s block regions start (a checked shape): row-wise then
 * column-wise blocks for 1x16 (present planes only), the tiles for 16x16;
 * each region is mxs__nvfp4_wb_region's block_rows * per_row entries. The
 * running index *at (n_items for the first item: the tensor amaxes come
 * first) advances past them. */
MXS_HD void mxs__nvfp4_packed_slot(const mxs_nvfp4_tensor *t, int64_t index, int64_t *at, mxs_nvfp4_wb_slot *s) {
    const mxs_wb_region rg = mxs__nvfp4_wb_region(t->rows, t->cols, MXS_ROWWISE, t->block);
    const mxs_wb_region cg = mxs__nvfp4_wb_region(t->rows, t->cols, MXS_COLWISE, t->block);
    s->row_entry = s->col_entry = s->tile_entry = -1;
    s->amax_entry = index;
    if (t->block == MXS_NVFP4_16X16) {
        s->tile_entry = *at;
        *at += rg.block_rows * rg.per_row;
        return;
    }
    if (t->dirs & MXS_ROWWISE) {
        s->row_entry = *at;
        *at += rg.block_rows * rg.per_row;
    }
    if (t->dirs & MXS_COLWISE) {
        s->col_entry = *at;
        *at += cg.block_rows * cg.per_row;
    }
}

/* ---- validation --------------------------------------------------------------
 *
 * Outputs of an item: each present plane's data plane (ceil(rows*cols/2)
 * bytes) and scale plane (its bytes in the primary's layout), the column
 * stage (ceil(rows*cols/2) bytes), the fragments (mxs_nvfp4_fragment_bytes)
 * and the 4-byte amax; inputs: the master (len elements). As for MXFP8 (docs/contract.md section 6): outputs
 * pairwise disjoint within and across items, no master over an output,
 * masters may overlap each other; the packed buffer is checked against all
 * of them by every phase. MXS_ERR_ALIASING. */

/* The outputs of an item whose shape and shard are checked (at most 8; NULL
 * and empty ones left out) and its master (n = 0: none). */
MXS_PRIVATE int mxs__nvfp4_wb_item_bufs(const mxs_nvfp4_wb_item *it, mxs__wb_buf out[MXS__WB_MAX_OUTS],
                                        mxs__wb_buf *master) {
    const mxs_nvfp4_tensor *t = &it->primary;
    const int64_t dbytes = mxs_nvfp4_data_plane_bytes(t->rows, t->cols);
    const int64_t fbytes = mxs_nvfp4_fragment_bytes(it->start, it->len);
    int n = 0, p;
    for (p = MXS_ROWWISE; p <= MXS_COLWISE; p++) {
        const uint8_t *data = p == MXS_ROWWISE ? t->row_data : t->col_data;
        const uint8_t *scale = p == MXS_ROWWISE ? t->row_scale : t->col_scale;
        mxs_scale_geom g;
        if (!(t->dirs & (unsigned)p)) continue;
        if (data) {
            out[n].p = data;
            out[n++].n = dbytes;
        }
        if (scale) {
            mxs_nvfp4_scale_geom_make(t->rows, t->cols, (mxs_dirs)p, t->scale_layout, &g);
            out[n].p = scale;
            out[n++].n = mxs_scale_geom_bytes(&g);
        }
    }
    if (it->col_stage && (t->dirs & MXS_COLWISE)) {
        out[n].p = it->col_stage;
        out[n++].n = dbytes;
    }
    if (it->row_fragment && (t->dirs & MXS_ROWWISE) && fbytes > 0) {
        out[n].p = it->row_fragment;
        out[n++].n = fbytes;
    }
    if (it->stage_fragment && (t->dirs & MXS_COLWISE) && fbytes > 0) {
        out[n].p = it->stage_fragment;
        out[n++].n = fbytes;
    }
    if (t->amax) {
        out[n].p = t->amax;
        out[n++].n = (int64_t)sizeof(float);
    }
    master->p = it->master;
    master->n = it->master && it->len > 0 ? it->len * mxs_dtype_bytes(it->master_dtype) : 0;
    return n;
}

MXS_PRIVATE int mxs__nvfp4_wb_item_bufs_at(const void *items, int64_t i, mxs__wb_buf out[MXS__WB_MAX_OUTS],
                                           mxs__wb_buf *master) {
    return mxs__nvfp4_wb_item_bufs(&((const mxs_nvfp4_wb_item *)items)[i], out, master);
}

/* Validates one item: the primary (as mxs_nvfp4_tensor_check: shape, flags,
 * layout, block, amax, plane pointers - except that a data plane whose
 * bytes go to a fragment may be NULL: row_data with a row fragment, col_data
 * when the column-wise values do), master dtype, shard (with the even rule:
 * MXS_ERR_RANGE), master pointer, the column stage (required for a
 * column-wise plane unless 16x16 with a row-wise plane, or a stage fragment
 * replaces it; refused without a column-wise plane: MXS_ERR_ABSENT_PLANE),
 * the fragments (refused for an absent plane: MXS_ERR_ABSENT_PLANE) and the
 * item's own buffers (MXS_ERR_ALIASING). Overlaps with other items:
 * mxs_nvfp4_wb_make_plan. */
MXS_NODISCARD MXS_API mxs_status mxs_nvfp4_wb_item_check(const mxs_nvfp4_wb_item *it) {
    const mxs_nvfp4_tensor *t;
    mxs__wb_buf out[MXS__WB_MAX_OUTS], m;
    int n;
    mxs_status s;
    if (!it) return MXS_ERR_INVALID_ARGUMENT;
    t = &it->primary;
    if ((s = mxs_nvfp4_tensor_check_shape(t)) != MXS_OK) return s;
    if (!t->amax) return MXS_ERR_INVALID_ARGUMENT;
    if ((t->dirs & MXS_ROWWISE) && (!t->row_scale || (!t->row_data && !it->row_fragment))) return MXS_ERR_ABSENT_PLANE;
    if ((t->dirs & MXS_COLWISE) && (!t->col_scale || (!t->col_data && !mxs__nvfp4_wb_col_fragmented(it))))
        return MXS_ERR_ABSENT_PLANE;
    s = mxs__wb_master_check(it->master, it->master_dtype, it->len,
                             mxs_nvfp4_shard_check(t->rows * t->cols, it->start, it->len));
    if (s != MXS_OK) return s;
    if ((it->row_fragment && !(t->dirs & MXS_ROWWISE)) || (it->stage_fragment && !(t->dirs & MXS_COLWISE)))
        return MXS_ERR_ABSENT_PLANE;
    if (it->col_stage && !(t->dirs & MXS_COLWISE)) return MXS_ERR_ABSENT_PLANE;
    if ((t->dirs & MXS_COLWISE) && !it->col_stage && !it->stage_fragment &&
        !(t->block == MXS_NVFP4_16X16 && (t->dirs & MXS_ROWWISE)))
        return MXS_ERR_ABSENT_PLANE;
    n = mxs__nvfp4_wb_item_bufs(it, out, &m);
    return mxs__wb_bufs_disjoint(out, n, m);
}

/* The cross-item aliasing rules for items that passed mxs_nvfp4_wb_item_check:
 * writeback.h's allocation-free chunked sort and binary searches
 * (mxs__wb_check_overlaps), over NVFP4 items. */
MXS_NODISCARD MXS_PRIVATE mxs_status mxs__nvfp4_wb_check_overlaps(const mxs_nvfp4_wb_batch *b) {
    return mxs__wb_overlaps_of(b->items, b->n_items, mxs__nvfp4_wb_item_bufs_at);
}

/* Whether [buf, buf + bytes) is disjoint from every buffer of the batch
 * (MXS_OK, else MXS_ERR_ALIASING); NULL buf or bytes <= 0: MXS_OK. For a
 * batch that passed mxs_nvfp4_wb_make_plan. O(n_items). */
MXS_NODISCARD MXS_API mxs_status mxs_nvfp4_wb_check_buffer(const mxs_nvfp4_wb_batch *b, const void *buf,
                                                           int64_t bytes) {
    if (!b || b->n_items < 0 || (b->n_items > 0 && !b->items)) return MXS_ERR_INVALID_ARGUMENT;
    if (!buf || bytes <= 0) return MXS_OK;
    return mxs__wb_buffer_disjoint(b->items, b->n_items, mxs__nvfp4_wb_item_bufs_at, buf, bytes);
}

/* ---- the plan ------------------------------------------------------------------ */

/* plan->local_hash (as writeback.h's mxs__wb_local_hash): the batch option;
 * per item its shape, flags, layout, block, master dtype, shard and every
 * pointer (stage, fragments and amax included); the plan's other fields.
 * The fingerprint leaves fragments out: they do not change the packed
 * buffer, and ranks may differ in them. */
MXS_PRIVATE uint64_t mxs__nvfp4_wb_local_hash(const mxs_nvfp4_wb_batch *b, const mxs_nvfp4_wb_plan *plan) {
    uint64_t h = 0xCBF29CE484222325ull ^ 0x4E56465034ull; /* "NVFP4" */
    int64_t i;
    h = mxs__wb_hash_word(h, (uint64_t)b->n_items);
    h = mxs__wb_hash_word(h, (uint64_t)b->round_through);
    for (i = 0; i < b->n_items; i++) {
        const mxs_nvfp4_wb_item *it = &b->items[i];
        const mxs_nvfp4_tensor *t = &it->primary;
        uint64_t w = mxs__wb_hash_item(t->rows, t->cols,
                                       (uint64_t)t->dirs | (uint64_t)t->scale_layout << 8 |
                                           (uint64_t)it->master_dtype << 16 | (uint64_t)t->block << 24,
                                       it->start, it->len, it->master, t->dirs, t->row_data, t->row_scale, t->col_data,
                                       t->col_scale) +
                     mxs__wb_hash_field(MXS__WB_PTR(it->col_stage), 10) + mxs__wb_hash_field(MXS__WB_PTR(t->amax), 11) +
                     mxs__wb_hash_field(MXS__WB_PTR(it->row_fragment), 12) +
                     mxs__wb_hash_field(MXS__WB_PTR(it->stage_fragment), 13);
        h = mxs__wb_hash_word(h, w);
    }
    h = mxs__wb_hash_word(h, (uint64_t)plan->n_items);
    h = mxs__wb_hash_word(h, (uint64_t)plan->entry_bytes);
    h = mxs__wb_hash_word(h, (uint64_t)plan->packed_count);
    h = mxs__wb_hash_word(h, (uint64_t)plan->packed_bytes);
    h = mxs__wb_hash_word(h, plan->fingerprint);
    h = mxs__wb_hash_word(h, (uint64_t)plan->status_offset);
    return h;
}

/* Validates the batch completely - the option, every item
 * (mxs_nvfp4_wb_item_check), the overlaps between items - and computes its
 * plan (and, when `slots` is not NULL, each item's entry offsets; n_items
 * entries). Writes nothing on error. */
MXS_NODISCARD MXS_API mxs_status mxs_nvfp4_wb_make_plan(const mxs_nvfp4_wb_batch *b, mxs_nvfp4_wb_plan *plan,
                                                        mxs_nvfp4_wb_slot *slots) {
    int64_t i, entries = 0, w, bytes;
    uint64_t h = 0xCBF29CE484222325ull;
    mxs_nvfp4_wb_plan now;
    mxs_status s;
    if (!b || !plan || b->n_items < 0 || (b->n_items > 0 && !b->items)) return MXS_ERR_INVALID_ARGUMENT;
    if (!mxs_dtype_valid((int)b->round_through)) return MXS_ERR_INVALID_ARGUMENT;
    w = mxs_nvfp4_wb_entry_bytes(b->round_through);
    h = mxs__fnv_u64(h, 0x4E56465034ull); /* "NVFP4": never equal to an MXFP8 plan's */
    h = mxs__fnv_u64(h, (uint64_t)b->n_items);
    h = mxs__fnv_u64(h, (uint64_t)b->round_through);
    for (i = 0; i < b->n_items; i++) {
        const mxs_nvfp4_tensor *t = &b->items[i].primary;
        mxs_nvfp4_wb_slot sl;
        int64_t at = 1; /* its tensor amax */
        if ((s = mxs_nvfp4_wb_item_check(&b->items[i])) != MXS_OK) return s;
        mxs__nvfp4_packed_slot(t, i, &at, &sl); /* at = 1 + this item's block entries (<= 2*rows*cols) */
        if (!mxs_add_ok(entries, at, &entries)) return MXS_ERR_OVERFLOW;
        h = mxs__fnv_u64(h, (uint64_t)t->rows);
        h = mxs__fnv_u64(h, (uint64_t)t->cols);
        h = mxs__fnv_u64(h, (uint64_t)t->dirs | (uint64_t)t->block << 8);
    }
    /* the tensor amaxes and block amaxes, then the status entry */
    if (!mxs_add_ok(entries, 1, &entries) || !mxs_mul_ok(entries, w, &bytes)) return MXS_ERR_OVERFLOW;
    if ((s = mxs__nvfp4_wb_check_overlaps(b)) != MXS_OK) return s;
    if (slots) {
        int64_t at = b->n_items;
        for (i = 0; i < b->n_items; i++) mxs__nvfp4_packed_slot(&b->items[i].primary, i, &at, &slots[i]);
    }
    now.n_items = b->n_items;
    now.entry_bytes = w;
    now.packed_count = entries;
    now.packed_bytes = bytes;
    now.fingerprint = h;
    now.status_offset = bytes - 1;
    now.local_hash = mxs__nvfp4_wb_local_hash(b, &now);
    *plan = now;
    return MXS_OK;
}

/* The batch is the planned one (local hash, O(n_items)); on a mismatch the
 * full validation names the fault, else MXS_ERR_PLAN_MISMATCH. */
MXS_NODISCARD MXS_PRIVATE mxs_status mxs__nvfp4_wb_check_plan(const mxs_nvfp4_wb_batch *b,
                                                              const mxs_nvfp4_wb_plan *plan) {
    mxs_nvfp4_wb_plan now;
    mxs_status s;
    if (!b || !plan || b->n_items < 0 || (b->n_items > 0 && !b->items)) return MXS_ERR_INVALID_ARGUMENT;
    if (b->n_items == plan->n_items && mxs__nvfp4_wb_local_hash(b, plan) == plan->local_hash) return MXS_OK;
    if ((s = mxs_nvfp4_wb_make_plan(b, &now, NULL)) != MXS_OK) return s;
    return MXS_ERR_PLAN_MISMATCH;
}

/* What partial and apply check before writing: the planned batch, a
 * non-NULL packed buffer aligned to plan->entry_bytes
 * (MXS_ERR_INVALID_ARGUMENT) that overlaps no buffer of the batch. */
MXS_NODISCARD MXS_PRIVATE mxs_status mxs__nvfp4_wb_check_phase(const mxs_nvfp4_wb_batch *b,
                                                               const mxs_nvfp4_wb_plan *plan, const void *packed) {
    mxs_status s;
    if ((s = mxs__nvfp4_wb_check_plan(b, plan)) != MXS_OK) return s;
    if (plan->entry_bytes != 2 && plan->entry_bytes != 4) return MXS_ERR_PLAN_MISMATCH; /* never for a planned batch */
    if (!packed || (uint64_t)(uintptr_t)packed % (uint64_t)plan->entry_bytes != 0) return MXS_ERR_INVALID_ARGUMENT;
    return mxs_nvfp4_wb_check_buffer(b, packed, plan->packed_bytes);
}

MXS_EXTERN_C_END

#endif /* MXSHARD_NVFP4_WBPLAN_H */
