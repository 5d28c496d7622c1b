/* SPDX-License-Identifier: MIT */
/* mxshard/writeback.h - distributed writeback on the CPU (docs/contract.md sections 3, 4).
 *
 * Every data-parallel rank holds an FP32 (or bf16/f16) master shard of each
 * weight: the flat range [start, start+len), unaligned, empty or replicated.
 * Block scales span other ranks' shards, so:
 *
 *   1 plan     mxs_wb_make_plan    validate the batch completely (overlaps
 *                                  included); size the packed buffer;
 *                                  fingerprint the plan
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
 * Partial and apply re-check the batch against its plan in O(n_items)
 * (plan.local_hash: MXS_ERR_PLAN_MISMATCH when it changed) and the packed
 * buffer against the batch's buffers; they do not repeat the overlap sort.
 *
 * Packed buffer (docs/contract.md section 4): in batch order the COMPACT row-wise scales
 * of every item that has a row-wise plane, then the COMPACT column-wise
 * scales of every item that has a column-wise plane, then one status byte:
 *
 *   | w0 row | w2 row | w3 row | w0 col | w1 col | w3 col |S|
 *   ^0                         ^row_region_bytes          ^status_offset
 *   (w1 column-only, w2 row-only, w0/w3 both)        packed_bytes = status_offset + 1
 *
 * The status byte is the group's: partial writes 0; a rank that fails before
 * the reduction writes 1 and still joins it (mxs_host_wb_writeback); after
 * the MAX, nonzero means some rank failed, and apply returns MXS_ERR_REMOTE.
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
    mxs_rounding rounding;   /* MXS_ROUND_CEIL (default) or MXS_ROUND_FLOOR */
    mxs_dtype round_through; /* MXS_F32 (default): none; MXS_BF16: round each master element to bf16
                                first (Transformer Engine's behaviour; makes writeback equal BF16
                                copy-back); MXS_F16: to f16 */
    mxs_wb_mode mode;        /* MXS_WB_FUSED (default) or MXS_WB_STRICT */
} mxs_wb_batch;

/* The plan of a batch (mxs_wb_make_plan). Every field but local_hash is the
 * same on every rank of the group. */
typedef struct mxs_wb_plan {
    int64_t n_items;
    int64_t packed_bytes;     /* size of the packed buffer: exponents + 1 status byte */
    int64_t row_region_bytes; /* row-wise region is [0, row_region_bytes) */
    uint64_t fingerprint;     /* hash of (n_items, shapes, flags, rounding, round-through) */
    int64_t status_offset;    /* the group status byte: packed_bytes - 1 (0 = fine, else a rank failed) */
    uint64_t local_hash;      /* rank-local: hash of the validated batch (pointers, shards, ...) */
} mxs_wb_plan;

/* Where one item's exponents sit in the packed buffer (-1: plane absent). */
typedef struct mxs_wb_slot {
    int64_t row_offset, col_offset;
} mxs_wb_slot;

/* ---- where a block's entry sits (docs/contract.md 4.2 and 9.8) ---------------
 *
 * A weight's entries in a packed buffer form regions (MXFP8: one per plane;
 * NVFP4: one per plane, or one of 16x16 tiles for both planes), each starting
 * at the plan's slot. A region views the weight's blocks as block rows: block
 * row b covers the weight's rows [b*height, (b+1)*height), and block (b, j)
 * is its j-th block - a block column for row-wise blocks and tiles, a column
 * for column-wise blocks. Block (b, j)'s entry is the region's entry
 * b*row_step + j*col_step (mxs_wb_region_entry):
 *
 *   region           height  block_rows     per_row        row_step       col_step
 *   MXFP8 row-wise        1  rows           ceil(cols/32)  ceil(cols/32)  1
 *   MXFP8 col-wise       32  ceil(rows/32)  cols           cols           1
 *   NVFP4 row-wise        1  rows           ceil(cols/16)  ceil(cols/16)  1
 *   NVFP4 col-wise       16  ceil(rows/16)  cols           1              ceil(rows/16)
 *   NVFP4 16x16 tiles    16  ceil(rows/16)  ceil(cols/16)  ceil(cols/16)  1
 *
 * That is each plane's COMPACT scale order (mxs_scale_geom_offset: MXFP8's
 * column-wise plane is k-major, NVFP4's is the row-wise plane of the
 * transpose) and the tiles row-major. A region holds block_rows * per_row
 * entries. mxs_wb_region_make (below) and mxs_nvfp4_wb_region_make
 * (nvfp4_wbplan.h) give the region of a shape. */
typedef struct mxs_wb_region {
    int64_t height;     /* weight rows per block row: 1, 16 or 32 */
    int64_t block_rows; /* ceil(rows / height) */
    int64_t per_row;    /* blocks per block row */
    int64_t row_step;   /* entries from block (b, j) to block (b+1, j) */
    int64_t col_step;   /* entries from block (b, j) to block (b, j+1) */
} mxs_wb_region;

/* The entry of block (b, j), 0 <= b < block_rows and 0 <= j < per_row,
 * counted from the region's first. */
MXS_HD int64_t mxs_wb_region_entry(const mxs_wb_region *g, int64_t b, int64_t j) {
    return b * g->row_step + j * g->col_step;
}

/* The block (b, j) whose entry is e, 0 <= e < block_rows * per_row: the
 * inverse of mxs_wb_region_entry. Every region of mxs_wb_region_make and
 * mxs_nvfp4_wb_region_make is dense, either along its block rows (col_step
 * 1, row_step per_row) or down its columns (row_step 1, col_step
 * block_rows); one division either way. */
MXS_HD void mxs_wb_region_block(const mxs_wb_region *g, int64_t e, int64_t *b, int64_t *j) {
    if (g->col_step == 1 && g->row_step == g->per_row) {
        *b = e / g->row_step;
        *j = e - *b * g->row_step;
    } else {
        *j = e / g->col_step;
        *b = e - *j * g->col_step;
    }
}

/* The region of an MXFP8 weight's `plane` exponents (MXS_ROWWISE or
 * MXS_COLWISE): the COMPACT plane of mxs_scale_geom, whose offset k*M + m
 * (column-wise, block row k = a 32-row group) or m*K + k (row-wise, block
 * row m = a row) puts block (b, j) at b*per_row + j. MXS_ERR_INVALID_ARGUMENT
 * for a NULL out or a bad plane, MXS_ERR_SHAPE, MXS_ERR_OVERFLOW (rows*cols
 * beyond int64). */
MXS_NODISCARD MXS_HD mxs_status mxs_wb_region_make(int64_t rows, int64_t cols, mxs_dirs plane, mxs_wb_region *out) {
    int64_t n;
    mxs_scale_geom g;
    if (!out || !mxs_plane_valid((int)plane)) return MXS_ERR_INVALID_ARGUMENT;
    if (rows < 1 || cols < 1) return MXS_ERR_SHAPE;
    if (!mxs_mul_ok(rows, cols, &n) || !mxs_scale_geom_make(rows, cols, plane, MXS_SCALES_COMPACT, &g))
        return MXS_ERR_OVERFLOW;
    out->height = g.colwise ? MXS_BLOCK : 1;
    out->block_rows = g.colwise ? g.K : g.M;
    out->per_row = g.colwise ? g.M : g.K;
    out->row_step = out->per_row;
    out->col_step = 1;
    return MXS_OK;
}

/* 64-bit FNV-1a over a value's 8 little-endian bytes. */
MXS_HD uint64_t mxs__fnv_u64(uint64_t h, uint64_t v) {
    int k;
    for (k = 0; k < 8; k++) {
        h ^= (v >> (8 * k)) & 0xFFu;
        h *= 0x100000001B3ull;
    }
    return h;
}

/* ---- validation (docs/contract.md section 6) ---------------------------------------------
 *
 * The buffers of a writeback, as byte ranges of this rank's memory:
 *
 *   outputs  every present plane's data plane (rows*cols bytes; may be NULL
 *            when a fragment replaces it) and scale plane (its bytes in the
 *            primary's layout), every fragment (len bytes), and the packed
 *            buffer (plan->packed_bytes bytes)
 *   inputs   every master shard (len elements of master_dtype)
 *
 * Outputs must be pairwise disjoint, within an item and across items (no two
 * items share storage); no master may overlap an output; masters may overlap
 * each other (they are only read). A data plane counts whole, not only the
 * slice this rank writes: the parameter all-gather writes all of it later.
 * A violation is MXS_ERR_ALIASING. mxs_wb_make_plan checks the batch once;
 * every phase checks the packed buffer against the batch (mxs_wb_check_buffer,
 * O(n_items)) and that the batch is still the one planned (plan->local_hash,
 * O(n_items)). Pointers are compared, never dereferenced.
 */

/* One buffer: n bytes at p (n > 0). */
typedef struct mxs__wb_buf {
    const void *p;
    int64_t n;
} mxs__wb_buf;

/* The most outputs one item reports (MXFP8: 6; NVFP4: 8, nvfp4_wbplan.h). */
#define MXS__WB_MAX_OUTS 8

/* The buffers of an item whose shape and shard are checked: its outputs
 * (at most 6: data plane, scale plane and fragment per present plane; NULL
 * and empty ones left out) go to out[] and their count is returned; its
 * master goes to *master (n = 0: none). */
MXS_PRIVATE int mxs__wb_item_bufs(const mxs_wb_item *it, mxs__wb_buf out[MXS__WB_MAX_OUTS], mxs__wb_buf *master) {
    const mxs_tensor *t = &it->primary;
    int n = 0, p;
    for (p = MXS_ROWWISE; p <= MXS_COLWISE; p++) {
        const uint8_t *data = p == MXS_ROWWISE ? t->row_data : t->col_data;
        const uint8_t *scale = p == MXS_ROWWISE ? t->row_scale : t->col_scale;
        const uint8_t *frag = p == MXS_ROWWISE ? it->row_fragment : it->col_fragment;
        mxs_scale_geom g;
        if (!(t->dirs & (unsigned)p)) continue;
        if (data) {
            out[n].p = data;
            out[n++].n = t->rows * t->cols;
        }
        if (scale) {
            mxs_scale_geom_make(t->rows, t->cols, (mxs_dirs)p, t->scale_layout, &g);
            out[n].p = scale;
            out[n++].n = mxs_scale_geom_bytes(&g);
        }
        if (frag && it->len > 0) {
            out[n].p = frag;
            out[n++].n = it->len;
        }
    }
    master->p = it->master;
    master->n = it->master && it->len > 0 ? it->len * mxs_dtype_bytes(it->master_dtype) : 0;
    return n;
}

/* An item's own aliasing rule (MXFP8 and NVFP4): its n outputs pairwise
 * disjoint and its master disjoint from them, else MXS_ERR_ALIASING. */
MXS_NODISCARD MXS_PRIVATE mxs_status mxs__wb_bufs_disjoint(const mxs__wb_buf *out, int n, mxs__wb_buf m) {
    int i, j;
    for (i = 0; i < n; i++) {
        if (mxs__overlap(out[i].p, out[i].n, m.p, m.n)) return MXS_ERR_ALIASING;
        for (j = 0; j < i; j++)
            if (mxs__overlap(out[i].p, out[i].n, out[j].p, out[j].n)) return MXS_ERR_ALIASING;
    }
    return MXS_OK;
}

/* An item's master (MXFP8 and NVFP4), after its primary: the dtype
 * (MXS_ERR_INVALID_ARGUMENT), then shard_status (the shard rule's verdict,
 * returned unless MXS_OK), then a non-NULL master when len > 0
 * (MXS_ERR_INVALID_ARGUMENT) whose byte size fits (MXS_ERR_OVERFLOW). */
MXS_NODISCARD MXS_PRIVATE mxs_status mxs__wb_master_check(const void *master, mxs_dtype dtype, int64_t len,
                                                          mxs_status shard_status) {
    int64_t master_bytes;
    if (!mxs_dtype_valid((int)dtype)) return MXS_ERR_INVALID_ARGUMENT;
    if (shard_status != MXS_OK) return shard_status;
    if (len > 0 && !master) return MXS_ERR_INVALID_ARGUMENT;
    if (!mxs_mul_ok(len, mxs_dtype_bytes(dtype), &master_bytes)) return MXS_ERR_OVERFLOW;
    return MXS_OK;
}

/* The buffers of item i of an item array (mxs__wb_item_bufs of an MXFP8
 * item, or the NVFP4 one): the shared aliasing checks below take one. */
typedef int (*mxs__wb_bufs_fn)(const void *items, int64_t i, mxs__wb_buf out[MXS__WB_MAX_OUTS], mxs__wb_buf *master);

MXS_PRIVATE int mxs__wb_item_bufs_at(const void *items, int64_t i, mxs__wb_buf out[MXS__WB_MAX_OUTS],
                                     mxs__wb_buf *master) {
    return mxs__wb_item_bufs(&((const mxs_wb_item *)items)[i], out, master);
}

/* Validates one item: shape, flags, master dtype, shard, the pointers apply
 * and partial will use, and the item's own buffers (its outputs pairwise
 * disjoint, its master disjoint from them: MXS_ERR_ALIASING). Overlaps with
 * other items are mxs_wb_make_plan's part. */
MXS_NODISCARD MXS_API mxs_status mxs_wb_item_check(const mxs_wb_item *it) {
    const mxs_tensor *t;
    mxs__wb_buf out[MXS__WB_MAX_OUTS], m;
    int n;
    mxs_status s;
    if (!it) return MXS_ERR_INVALID_ARGUMENT;
    t = &it->primary;
    if ((s = mxs_tensor_check_shape(t)) != MXS_OK) return s;
    s = mxs__wb_master_check(it->master, it->master_dtype, it->len,
                             mxs_shard_check(t->rows * t->cols, it->start, it->len));
    if (s != MXS_OK) return s;
    if (it->row_fragment && !(t->dirs & MXS_ROWWISE)) return MXS_ERR_ABSENT_PLANE;
    if (it->col_fragment && !(t->dirs & MXS_COLWISE)) return MXS_ERR_ABSENT_PLANE;
    if ((t->dirs & MXS_ROWWISE) && (!t->row_scale || (!t->row_data && !it->row_fragment))) return MXS_ERR_ABSENT_PLANE;
    if ((t->dirs & MXS_COLWISE) && (!t->col_scale || (!t->col_data && !it->col_fragment))) return MXS_ERR_ABSENT_PLANE;
    n = mxs__wb_item_bufs(it, out, &m);
    return mxs__wb_bufs_disjoint(out, n, m);
}

/* A byte range [lo, hi) of the address space, hi > lo (the end saturates at
 * 2^64 - 1 instead of wrapping). */
typedef struct mxs__span {
    uint64_t lo, hi;
} mxs__span;

MXS_PRIVATE mxs__span mxs__span_of(mxs__wb_buf b) {
    mxs__span s;
    s.lo = (uint64_t)(uintptr_t)b.p;
    s.hi = (uint64_t)b.n > UINT64_MAX - s.lo ? UINT64_MAX : s.lo + (uint64_t)b.n;
    return s;
}

MXS_PRIVATE void mxs__span_sift(mxs__span *a, int64_t root, int64_t n) {
    mxs__span v = a[root];
    int64_t child;
    while ((child = 2 * root + 1) < n) {
        if (child + 1 < n && a[child + 1].lo > a[child].lo) child++;
        if (a[child].lo <= v.lo) break;
        a[root] = a[child];
        root = child;
    }
    a[root] = v;
}

/* Sorts spans by lo: heapsort, in place, O(n log n). */
MXS_PRIVATE void mxs__span_sort(mxs__span *a, int64_t n) {
    int64_t k;
    for (k = n / 2; k-- > 0;) mxs__span_sift(a, k, n);
    for (k = n; k-- > 1;) {
        mxs__span top = a[0];
        a[0] = a[k];
        a[k] = top;
        mxs__span_sift(a, 0, k);
    }
}

/* Whether x overlaps one of n spans that are sorted and pairwise disjoint
 * (so their ends are sorted too): the first span ending after x.lo. */
MXS_PRIVATE int mxs__span_hits_disjoint(const mxs__span *a, int64_t n, mxs__span x) {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (a[mid].hi > x.lo)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo < n && a[lo].lo < x.hi;
}

/* Whether x overlaps one of n spans sorted by lo, reach[k] being the largest
 * end among a[0..k]: of the spans starting before x.hi, one ends after x.lo. */
MXS_PRIVATE int mxs__span_hits_sorted(const mxs__span *a, const uint64_t *reach, int64_t n, mxs__span x) {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (a[mid].lo >= x.hi)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo > 0 && reach[lo - 1] > x.lo;
}

/* Items one overlap pass holds on the stack: MXS__WB_MAX_OUTS outputs + 1
 * master each, about 20 KB. */
#define MXS__WB_CHUNK 128

/* The cross-item part of the aliasing rules, for a batch whose items passed
 * mxs_wb_item_check. Allocation-free: the items are taken MXS__WB_CHUNK at a
 * time; a chunk's outputs are sorted (two outputs sharing a byte are then
 * neighbours) and its masters sorted with their running reach; the chunk's
 * masters and every output and master of every later item are looked up by
 * binary search. Cost O(n log n) for n <= MXS__WB_CHUNK items and
 * O(n^2 / MXS__WB_CHUNK) beyond; measured for the whole mxs_wb_make_plan on
 * one core: about 45 us for 200 items, 0.6 ms for 1000, 7-15 ms for 4000 (a
 * plan is made once per bucket). */
MXS_NODISCARD MXS_PRIVATE mxs_status mxs__wb_overlaps_of(const void *items, int64_t n_items, mxs__wb_bufs_fn bufs) {
    mxs__span outs[MXS__WB_MAX_OUTS * MXS__WB_CHUNK], ms[MXS__WB_CHUNK];
    uint64_t reach[MXS__WB_CHUNK];
    int64_t c0, c1, i, k, no, nm;
    for (c0 = 0; c0 < n_items; c0 = c1) {
        c1 = n_items - c0 > MXS__WB_CHUNK ? c0 + MXS__WB_CHUNK : n_items;
        no = nm = 0;
        for (i = c0; i < c1; i++) {
            mxs__wb_buf o[MXS__WB_MAX_OUTS], m;
            int n = bufs(items, i, o, &m), q;
            for (q = 0; q < n; q++) outs[no++] = mxs__span_of(o[q]);
            if (m.n > 0) ms[nm++] = mxs__span_of(m);
        }
        mxs__span_sort(outs, no);
        for (k = 1; k < no; k++)
            if (outs[k].lo < outs[k - 1].hi) return MXS_ERR_ALIASING; /* two outputs of the chunk */
        mxs__span_sort(ms, nm);
        for (k = 0; k < nm; k++) {
            reach[k] = k > 0 && reach[k - 1] > ms[k].hi ? reach[k - 1] : ms[k].hi;
            if (mxs__span_hits_disjoint(outs, no, ms[k])) return MXS_ERR_ALIASING; /* a master and an output */
        }
        for (i = c1; i < n_items; i++) { /* later items against this chunk */
            mxs__wb_buf o[MXS__WB_MAX_OUTS], m;
            int n = bufs(items, i, o, &m), q;
            for (q = 0; q < n; q++) {
                mxs__span x = mxs__span_of(o[q]);
                if (mxs__span_hits_disjoint(outs, no, x) || mxs__span_hits_sorted(ms, reach, nm, x))
                    return MXS_ERR_ALIASING;
            }
            if (m.n > 0 && mxs__span_hits_disjoint(outs, no, mxs__span_of(m))) return MXS_ERR_ALIASING;
        }
    }
    return MXS_OK;
}

/* The cross-item aliasing rules of an MXFP8 batch (above). */
MXS_NODISCARD MXS_PRIVATE mxs_status mxs__wb_check_overlaps(const mxs_wb_batch *b) {
    return mxs__wb_overlaps_of(b->items, b->n_items, mxs__wb_item_bufs_at);
}

/* Whether [buf, buf + bytes) (not NULL, bytes > 0) is disjoint from every
 * buffer of n_items items (MXFP8 and NVFP4): MXS_OK, else MXS_ERR_ALIASING. */
MXS_NODISCARD MXS_PRIVATE mxs_status mxs__wb_buffer_disjoint(const void *items, int64_t n_items, mxs__wb_bufs_fn bufs,
                                                             const void *buf, int64_t bytes) {
    int64_t i;
    for (i = 0; i < n_items; i++) {
        mxs__wb_buf o[MXS__WB_MAX_OUTS], m;
        int n = bufs(items, i, o, &m), q;
        if (mxs__overlap(buf, bytes, m.p, m.n)) return MXS_ERR_ALIASING;
        for (q = 0; q < n; q++)
            if (mxs__overlap(buf, bytes, o[q].p, o[q].n)) return MXS_ERR_ALIASING;
    }
    return MXS_OK;
}

/* Whether the caller's buffer [buf, buf + bytes) is disjoint from every
 * buffer of the batch (data and scale planes, fragments, masters): MXS_OK,
 * else MXS_ERR_ALIASING. Every phase checks the packed buffer with it; a
 * caller checks any other scratch it hands to a writeback (the CUDA
 * workspace) the same way. NULL buf or bytes <= 0: MXS_OK. Needs a batch
 * that passed mxs_wb_make_plan (else MXS_ERR_INVALID_ARGUMENT for a NULL or
 * malformed batch; items are not re-validated). O(n_items), no allocation. */
MXS_NODISCARD MXS_API mxs_status mxs_wb_check_buffer(const mxs_wb_batch *b, const void *buf, int64_t bytes) {
    if (!b || b->n_items < 0 || (b->n_items > 0 && !b->items)) return MXS_ERR_INVALID_ARGUMENT;
    if (!buf || bytes <= 0) return MXS_OK;
    return mxs__wb_buffer_disjoint(b->items, b->n_items, mxs__wb_item_bufs_at, buf, bytes);
}

/* ---- the plan ------------------------------------------------------------------ */

/* One step of the local hash: FNV-1a over a 64-bit word, then a xor-shift
 * fold (a bijection of h for a fixed word). */
MXS_PRIVATE uint64_t mxs__wb_hash_word(uint64_t h, uint64_t v) {
    h ^= v;
    h *= 0x100000001B3ull;
    return h ^ (h >> 32);
}

/* Field f's contribution to an item's word: a bijection of v (xor-shift,
 * then an odd multiplier of its own), so that changing one field always
 * changes the sum. */
MXS_PRIVATE uint64_t mxs__wb_hash_field(uint64_t v, uint64_t f) {
    return (v ^ (v >> 31)) * (0x9E3779B97F4A7C15ull * (2u * f + 1u));
}

#define MXS__WB_PTR(p) ((uint64_t)(uintptr_t)(p))

/* The fields 0-9 of an item's word that every writeback item has (MXFP8
 * and NVFP4): shape, the flags word (field 2), shard, master pointer and
 * the data and scale pointers of the present planes. */
MXS_PRIVATE uint64_t mxs__wb_hash_item(int64_t rows, int64_t cols, uint64_t flags, int64_t start, int64_t len,
                                       const void *master, unsigned dirs, const void *row_data, const void *row_scale,
                                       const void *col_data, const void *col_scale) {
    const int row = (dirs & MXS_ROWWISE) != 0, col = (dirs & MXS_COLWISE) != 0;
    return mxs__wb_hash_field((uint64_t)rows, 0) + mxs__wb_hash_field((uint64_t)cols, 1) +
           mxs__wb_hash_field(flags, 2) + mxs__wb_hash_field((uint64_t)start, 3) +
           mxs__wb_hash_field((uint64_t)len, 4) + mxs__wb_hash_field(MXS__WB_PTR(master), 5) +
           mxs__wb_hash_field(row ? MXS__WB_PTR(row_data) : 0, 6) +
           mxs__wb_hash_field(row ? MXS__WB_PTR(row_scale) : 0, 7) +
           mxs__wb_hash_field(col ? MXS__WB_PTR(col_data) : 0, 8) +
           mxs__wb_hash_field(col ? MXS__WB_PTR(col_scale) : 0, 9);
}

/* plan->local_hash: a rank-local hash of everything mxs_wb_make_plan
 * validated - the batch options; per item its shape, flags, layout, master
 * dtype, shard, master pointer, the data and scale pointers of its present
 * planes and its fragments - and of the plan's other fields (so an edited
 * plan does not match either). Any single changed field changes it. Not
 * comparable across ranks (pointers and shards differ): that is
 * plan->fingerprint. O(n_items), no allocation. */
MXS_PRIVATE uint64_t mxs__wb_local_hash(const mxs_wb_batch *b, const mxs_wb_plan *plan) {
    uint64_t h = 0xCBF29CE484222325ull;
    int64_t i;
    h = mxs__wb_hash_word(h, (uint64_t)b->n_items);
    h = mxs__wb_hash_word(h, (uint64_t)b->rounding | (uint64_t)b->round_through << 8 | (uint64_t)b->mode << 16);
    for (i = 0; i < b->n_items; i++) {
        const mxs_wb_item *it = &b->items[i];
        const mxs_tensor *t = &it->primary;
        uint64_t w =
            mxs__wb_hash_item(
                t->rows, t->cols, (uint64_t)t->dirs | (uint64_t)t->scale_layout << 8 | (uint64_t)it->master_dtype << 16,
                it->start, it->len, it->master, t->dirs, t->row_data, t->row_scale, t->col_data, t->col_scale) +
            mxs__wb_hash_field(MXS__WB_PTR(it->row_fragment), 10) +
            mxs__wb_hash_field(MXS__WB_PTR(it->col_fragment), 11);
        h = mxs__wb_hash_word(h, w);
    }
    h = mxs__wb_hash_word(h, (uint64_t)plan->n_items);
    h = mxs__wb_hash_word(h, (uint64_t)plan->packed_bytes);
    h = mxs__wb_hash_word(h, (uint64_t)plan->row_region_bytes);
    h = mxs__wb_hash_word(h, plan->fingerprint);
    h = mxs__wb_hash_word(h, (uint64_t)plan->status_offset);
    return h;
}

/* Validates the batch completely - options, every item (mxs_wb_item_check)
 * and the overlaps between items (MXS_ERR_ALIASING) - and computes its plan
 * (and, if `slots` is not NULL, each item's offsets; slots has n_items
 * entries). Writes nothing on error. */
MXS_NODISCARD MXS_API mxs_status mxs_wb_make_plan(const mxs_wb_batch *b, mxs_wb_plan *plan, mxs_wb_slot *slots) {
    int64_t i, row_bytes = 0, col_bytes = 0, total;
    uint64_t h = 0xCBF29CE484222325ull;
    mxs_wb_plan now;
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
    /* the exponents, then the status byte */
    if (!mxs_add_ok(row_bytes, col_bytes, &total) || !mxs_add_ok(total, 1, &total)) return MXS_ERR_OVERFLOW;
    if ((s = mxs__wb_check_overlaps(b)) != MXS_OK) return s;
    if (slots) {
        int64_t ro = 0, co = row_bytes;
        for (i = 0; i < b->n_items; i++)
            mxs__packed_slot(&b->items[i].primary, &ro, &co, &slots[i].row_offset, &slots[i].col_offset);
    }
    now.n_items = b->n_items;
    now.packed_bytes = total;
    now.row_region_bytes = row_bytes;
    now.fingerprint = h;
    now.status_offset = total - 1;
    now.local_hash = mxs__wb_local_hash(b, &now);
    *plan = now;
    return MXS_OK;
}

/* The cheap check every phase runs: `plan` came from mxs_wb_make_plan on
 * this very batch (same options, shapes, shards and pointers; recomputes
 * plan->local_hash, O(n_items), no overlap sort) and is unedited. On a
 * mismatch it re-runs the full validation to name the fault, and returns
 * MXS_ERR_PLAN_MISMATCH when the batch is valid but not the planned one. */
MXS_NODISCARD MXS_PRIVATE mxs_status mxs__wb_check_plan(const mxs_wb_batch *b, const mxs_wb_plan *plan) {
    mxs_wb_plan now;
    mxs_status s;
    if (!b || !plan || b->n_items < 0 || (b->n_items > 0 && !b->items)) return MXS_ERR_INVALID_ARGUMENT;
    if (b->n_items == plan->n_items && mxs__wb_local_hash(b, plan) == plan->local_hash) return MXS_OK;
    if ((s = mxs_wb_make_plan(b, &now, NULL)) != MXS_OK) return s;
    return MXS_ERR_PLAN_MISMATCH;
}

/* What every phase checks before it writes: the batch is the planned one
 * (mxs__wb_check_plan) and `packed` (plan->packed_bytes bytes) is not NULL
 * and overlaps no buffer of the batch (mxs_wb_check_buffer). O(n_items). */
MXS_NODISCARD MXS_PRIVATE mxs_status mxs__wb_check_phase(const mxs_wb_batch *b, const mxs_wb_plan *plan,
                                                         const uint8_t *packed) {
    mxs_status s;
    if ((s = mxs__wb_check_plan(b, plan)) != MXS_OK) return s;
    if (!packed) return MXS_ERR_INVALID_ARGUMENT;
    return mxs_wb_check_buffer(b, packed, plan->packed_bytes);
}

/* Item -> job (wbjob.h): the one place a writeback item becomes the shard
 * job that the host engine and the CUDA kernels run. packed_row /
 * packed_col: the item's exponents in the packed buffer (mxs__packed_slot);
 * mode: MXS__JOB_PARTIAL or MXS__JOB_APPLY. The item is validated. */
MXS_PRIVATE void mxs__wb_job(const mxs_wb_batch *b, const mxs_wb_item *it, int mode, uint8_t *packed_row,
                             uint8_t *packed_col, mxs__job *job) {
    const mxs_tensor *t = &it->primary;
    memset(job, 0, sizeof *job);
    job->rows = t->rows;
    job->cols = t->cols;
    job->lo = it->start;
    job->hi = it->start + it->len;
    job->src = it->master;
    job->src_base = it->start;
    job->src_dtype = it->master_dtype;
    job->round_through = mxs__effective_round_through(it->master_dtype, b->round_through);
    job->rounding = b->rounding;
    job->mode = mode;
    job->cast = mxs__phase_cast(mode, b->mode == MXS_WB_FUSED);
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

/* Partial on a checked batch: zero the packed buffer (its status byte too:
 * 0 = this rank is fine), then every item's partial exponents (and, FUSED,
 * the casts of the blocks wholly inside its shard). */
MXS_PRIVATE void mxs__wb_host_partial(const mxs_wb_batch *b, const mxs_wb_plan *plan, uint8_t *packed) {
    int64_t i, ro = 0, co = plan->row_region_bytes, roff, coff;
    /* packed_bytes is always > 0 and packed never NULL here (checked phase); the test on packed also
     * keeps gcc's -Wnonnull quiet where it inlines a caller's literal NULL past the check */
    if (packed && plan->packed_bytes > 0) memset(packed, 0, (size_t)plan->packed_bytes);
    for (i = 0; i < b->n_items; i++) {
        const mxs_wb_item *it = &b->items[i];
        mxs__host_job job;
        mxs__packed_slot(&it->primary, &ro, &co, &roff, &coff);
        if (it->len == 0) continue;
        mxs__wb_job(b, it, MXS__JOB_PARTIAL, roff >= 0 ? packed + roff : NULL, coff >= 0 ? packed + coff : NULL, &job);
        mxs__host_run(&job);
    }
}

/* Apply on a checked batch: the reduced exponents into every present scale
 * plane (in the primary's layout), then the casts of the shard's blocks the
 * mode leaves to apply. */
MXS_NODISCARD MXS_PRIVATE mxs_status mxs__wb_host_apply(const mxs_wb_batch *b, const mxs_wb_plan *plan,
                                                        const uint8_t *packed) {
    int64_t i, ro = 0, co = plan->row_region_bytes, roff, coff;
    mxs_status s;
    for (i = 0; i < b->n_items; i++) {
        const mxs_wb_item *it = &b->items[i];
        const mxs_tensor *t = &it->primary;
        mxs__host_job job;
        mxs__packed_slot(t, &ro, &co, &roff, &coff);
        if (roff >= 0 && (s = mxs_host_convert_scales(t->rows, t->cols, MXS_ROWWISE, MXS_SCALES_COMPACT, packed + roff,
                                                      t->scale_layout, t->row_scale)) != MXS_OK)
            return s;
        if (coff >= 0 && (s = mxs_host_convert_scales(t->rows, t->cols, MXS_COLWISE, MXS_SCALES_COMPACT, packed + coff,
                                                      t->scale_layout, t->col_scale)) != MXS_OK)
            return s;
        if (it->len == 0) continue;
        /* the engine only reads the exponents in APPLY mode */
        mxs__wb_job(b, it, MXS__JOB_APPLY, roff >= 0 ? (uint8_t *)(uintptr_t)(packed + roff) : NULL,
                    coff >= 0 ? (uint8_t *)(uintptr_t)(packed + coff) : NULL, &job);
        mxs__host_run(&job);
    }
    return MXS_OK;
}

/* Step 2: zero `packed` (plan->packed_bytes bytes, the status byte included)
 * and write this rank's partial exponents; in MXS_WB_FUSED mode also cast
 * the blocks wholly inside each shard. First checks, in O(n_items), that the
 * batch is the one `plan` validated (else the fault, or
 * MXS_ERR_PLAN_MISMATCH) and that `packed` is not NULL and overlaps no
 * buffer of the batch (MXS_ERR_ALIASING); writes nothing on error. */
MXS_NODISCARD MXS_API mxs_status mxs_host_wb_partial(const mxs_wb_batch *b, const mxs_wb_plan *plan, uint8_t *packed) {
    mxs_status s;
    if ((s = mxs__wb_check_phase(b, plan, packed)) != MXS_OK) return s;
    mxs__wb_host_partial(b, plan, packed);
    return MXS_OK;
}

/* Step 4: copy the reduced exponents into every primary's scale planes (all
 * blocks, in each primary's layout, padding 0x00) and cast this rank's shard
 * (MXS_WB_FUSED: only the blocks straddling the shard's edges; the rest was
 * cast by partial). Same checks as partial; then, when the reduced status
 * byte (packed[plan->status_offset]) is not 0 - a rank of the group failed
 * before the reduction - writes nothing and returns MXS_ERR_REMOTE. */
MXS_NODISCARD MXS_API mxs_status mxs_host_wb_apply(const mxs_wb_batch *b, const mxs_wb_plan *plan,
                                                   const uint8_t *packed) {
    mxs_status s;
    if ((s = mxs__wb_check_phase(b, plan, packed)) != MXS_OK) return s;
    if (packed[plan->status_offset] != 0) return MXS_ERR_REMOTE;
    return mxs__wb_host_apply(b, plan, packed);
}

/* All-reduce callback for mxs_host_wb_writeback: MAX over uint8 of `bytes`
 * bytes at `packed`, in place, across the data-parallel group. Return 0 on
 * success. */
typedef int (*mxs_wb_reduce_max_fn)(uint8_t *packed, int64_t bytes, void *user);

/* Steps 2-4 with the caller's reduction: exactly one call of reduce_max on
 * every rank that can size its buffer, so that a failure on one rank never
 * leaves the others waiting in the collective:
 *
 *   checks pass   partial (status byte 0), reduce_max, then apply - unless
 *                 the reduced status byte is not 0 (another rank failed):
 *                 MXS_ERR_REMOTE, apply skipped
 *   checks fail   (any error of partial) the rank still joins: it zeroes
 *                 `packed`, sets the status byte to 1, calls reduce_max once
 *                 and returns its own error. This needs a plan from
 *                 mxs_wb_make_plan and a non-NULL packed buffer; without them
 *                 (NULL plan or packed) it returns at once and cannot join.
 *                 The packed buffer is then the only memory written - even
 *                 when the error is that it overlaps an output.
 *
 * A failing callback gives MXS_ERR_REDUCE and apply does not run. In FUSED
 * mode a rank that reaches the reduction has already written the blocks
 * wholly inside its shards (partial), also when it then skips apply. */
MXS_NODISCARD MXS_API mxs_status mxs_host_wb_writeback(const mxs_wb_batch *b, const mxs_wb_plan *plan, uint8_t *packed,
                                                       mxs_wb_reduce_max_fn reduce_max, void *user) {
    mxs_status s;
    if (!reduce_max) return MXS_ERR_INVALID_ARGUMENT;
    if ((s = mxs__wb_check_phase(b, plan, packed)) != MXS_OK) {
        if (plan && packed && plan->packed_bytes >= 1 && plan->status_offset == plan->packed_bytes - 1) {
            memset(packed, 0, (size_t)plan->packed_bytes);
            packed[plan->status_offset] = 1;
            (void)reduce_max(packed, plan->packed_bytes, user); /* this rank's own error is the one to report */
        }
        return s;
    }
    mxs__wb_host_partial(b, plan, packed);
    if (reduce_max(packed, plan->packed_bytes, user) != 0) return MXS_ERR_REDUCE;
    if (packed[plan->status_offset] != 0) return MXS_ERR_REMOTE;
    return mxs__wb_host_apply(b, plan, packed);
}

MXS_EXTERN_C_END

#endif /* MXSHARD_WRITEBACK_H */
