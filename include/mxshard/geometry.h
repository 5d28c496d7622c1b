/* SPDX-License-Identifier: MIT */
/* mxshard/geometry.h - which blocks a shard touches (docs/contract.md section 3).
 *
 * A rank's shard is the flat range [start, start+len) of a rows x cols
 * weight. In the picture (cols = 80, so Kr = 3 row-wise blocks per row; rows
 * grouped by 32 for the column-wise blocks) the shard starts at r=1,c=50 and
 * ends inside row 33:
 *
 *              c=0        32        64   79
 *   group 0   +----------+----------+-----+
 *     r=0     |          |          |     |
 *     r=1     |          |     #####|#####|  <- row blocks (1,1) and (1,2)
 *     r=2     |##########|##########|#####|     (1,1) straddles the start
 *     ...     |##########|##########|#####|
 *     r=31    |##########|##########|#####|
 *   group 1   +----------+----------+-----+
 *     r=32    |##########|##########|#####|
 *     r=33    |######    |          |     |  <- (33,0) straddles the end
 *             +----------+----------+-----+
 *
 *  - row-wise blocks touched: one contiguous range of block ids
 *    b = r*Kr + c/32, from the block of `start` to the block of `end-1`;
 *    only those two can straddle the shard's edges.
 *  - column-wise blocks touched: per 32-row group, the columns whose 32x1
 *    block holds a shard element: at most two column intervals per group
 *    (group 0 above: [0,80) since rows 2..31 are whole; a group cut by both
 *    edges within less than one row yields [c_a, cols) + [0, c_b]).
 *    Only the groups of `start` and `end-1` can hold straddling blocks.
 *  - data-plane slice: bytes [start, start+len) of every present data plane.
 *
 * All functions are pure, 64-bit and MXS_HOST_DEVICE; callers validate the
 * shard first with mxs_shard_check (no overflow is possible afterwards).
 * Preconditions: rows, cols >= 1 and 0 <= start, start + len <= rows*cols
 * (a checked shape and shard). No function divides by zero or traps on bad
 * input: given cols < 1 (or nranks < 1 for mxs_bucket_shard), the range
 * functions return an empty range and mxs_row_block_of returns -1; other
 * results for unchecked input are unspecified.
 */
#ifndef MXSHARD_GEOMETRY_H
#define MXSHARD_GEOMETRY_H

#include "config.h"
#include "tensor.h"

MXS_EXTERN_C_BEGIN

/* A half-open interval [first, first + count) of indices (blocks, columns). */
typedef struct mxs_range {
    int64_t first, count;
} mxs_range;

/* Validates 0 <= start, 0 <= len, start + len <= elems (MXS_ERR_RANGE). */
MXS_NODISCARD MXS_HD mxs_status mxs_shard_check(int64_t elems, int64_t start, int64_t len) {
    int64_t end;
    if (start < 0 || len < 0 || !mxs_add_ok(start, len, &end) || end > elems) return MXS_ERR_RANGE;
    return MXS_OK;
}

/* Row-wise blocks per row: Kr = ceil(cols/32). */
MXS_HD int64_t mxs_row_blocks_per_row(int64_t cols) { return mxs_ceil_div(cols, MXS_BLOCK); }
/* Column-wise row groups: Kc = ceil(rows/32). */
MXS_HD int64_t mxs_col_groups(int64_t rows) { return mxs_ceil_div(rows, MXS_BLOCK); }

/* Row-wise block id of flat element i >= 0: r*Kr + c/32 (-1 when cols < 1
 * or i < 0). */
MXS_HD int64_t mxs_row_block_of(int64_t cols, int64_t i) {
    if (cols < 1 || i < 0) return -1;
    return (i / cols) * mxs_row_blocks_per_row(cols) + (i % cols) / MXS_BLOCK;
}

/* Flat range [begin, end) of row-wise block b. */
MXS_HD mxs_range mxs_row_block_span(int64_t cols, int64_t b) {
    int64_t kr = mxs_row_blocks_per_row(cols), r, c0, c1;
    mxs_range out;
    out.first = out.count = 0;
    if (kr < 1 || b < 0) return out;
    r = b / kr;
    c0 = (b % kr) * MXS_BLOCK;
    c1 = c0 + MXS_BLOCK < cols ? c0 + MXS_BLOCK : cols;
    out.first = r * cols + c0;
    out.count = c1 - c0;
    return out;
}

/* Row-wise blocks the shard touches (empty range for len == 0). */
MXS_HD mxs_range mxs_shard_row_blocks(int64_t cols, int64_t start, int64_t len) {
    mxs_range out;
    out.first = len > 0 && cols > 0 ? mxs_row_block_of(cols, start) : 0;
    out.count = len > 0 && cols > 0 ? mxs_row_block_of(cols, start + len - 1) - out.first + 1 : 0;
    return out;
}

/* Whether row-wise block b lies entirely inside the shard. */
MXS_HD int mxs_row_block_inside(int64_t cols, int64_t b, int64_t start, int64_t len) {
    mxs_range s = mxs_row_block_span(cols, b);
    return s.first >= start && s.first + s.count <= start + len;
}

/* The 32-row groups the shard touches. */
MXS_HD mxs_range mxs_shard_groups(int64_t cols, int64_t start, int64_t len) {
    mxs_range out;
    out.first = len > 0 && cols > 0 ? (start / cols) / MXS_BLOCK : 0;
    out.count = len > 0 && cols > 0 ? ((start + len - 1) / cols) / MXS_BLOCK - out.first + 1 : 0;
    return out;
}

/* Rows [first, first+count) of group g. */
MXS_HD mxs_range mxs_group_rows(int64_t rows, int64_t g) {
    mxs_range out;
    out.first = g * MXS_BLOCK;
    out.count = (rows - out.first) < MXS_BLOCK ? rows - out.first : MXS_BLOCK;
    return out;
}

/* Columns of group g whose column-wise block holds a shard element: writes
 * up to two intervals to out[] and returns how many (0, 1 or 2). */
MXS_HD int mxs_shard_col_intervals(int64_t rows, int64_t cols, int64_t start, int64_t len, int64_t g,
                                   mxs_range out[2]) {
    mxs_range gr = mxs_group_rows(rows, g);
    int64_t a = gr.first * cols, b = (gr.first + gr.count) * cols;
    int64_t ca, cb;
    if (cols < 1) return 0;
    if (start > a) a = start;
    if (start + len < b) b = start + len;
    if (a >= b) return 0;
    if (b - a >= cols) {
        out[0].first = 0;
        out[0].count = cols;
        return 1;
    }
    ca = a % cols;
    cb = (b - 1) % cols;
    if (ca <= cb) {
        out[0].first = ca;
        out[0].count = cb - ca + 1;
        return 1;
    }
    out[0].first = 0;
    out[0].count = cb + 1;
    out[1].first = ca;
    out[1].count = cols - ca;
    return 2;
}

/* Whether column-wise block (g, c) lies entirely inside the shard: its first
 * element (row 32g) and its last (row min(32g+32, rows)-1) are both inside. */
MXS_HD int mxs_col_block_inside(int64_t rows, int64_t cols, int64_t g, int64_t c, int64_t start, int64_t len) {
    mxs_range gr = mxs_group_rows(rows, g);
    int64_t first = gr.first * cols + c, last = (gr.first + gr.count - 1) * cols + c;
    return first >= start && last < start + len;
}

/* Columns [lo, hi) of row r that lie in the shard (hi <= lo: none). */
MXS_HD mxs_range mxs_shard_row_cols(int64_t cols, int64_t r, int64_t start, int64_t len) {
    int64_t row0 = r * cols;
    int64_t lo = start - row0, hi = start + len - row0;
    mxs_range out;
    lo = lo < 0 ? 0 : lo;
    hi = hi > cols ? cols : hi;
    out.first = lo;
    out.count = hi > lo ? hi - lo : 0;
    return out;
}

/* ---- which blocks a phase casts ------------------------------------------
 *
 * Every phase that writes data bytes casts a selection of the blocks a shard
 * touches (docs/contract.md section 4): quantize casts all of them; the FUSED partial
 * casts the blocks wholly inside the shard (their exponents are final
 * without the reduction) and the FUSED apply casts the others (those that
 * straddle one of the shard's two edges); STRICT casts nothing in partial
 * and everything in apply. One rule, used by the host engine (quantize.h)
 * and by the CUDA kernels:
 *
 *   shard      [==========================)
 *   blocks  |  a  |  b  |  c  |  d  |  e  |  f  |
 *   inside         (b, c, d, e: wholly inside)     partial-fused casts b..e
 *   outside     a                       f          apply-fused casts a, f
 */
enum { MXS__JOB_QUANTIZE = 0, MXS__JOB_PARTIAL = 1, MXS__JOB_APPLY = 2 };
enum { MXS__CAST_NONE = 0, MXS__CAST_ALL = 1, MXS__CAST_INSIDE = 2, MXS__CAST_OUTSIDE = 3 };

/* The selection (MXS__CAST_*) of phase `mode` (MXS__JOB_*); fused: MXS_WB_FUSED. */
MXS_HD int mxs__phase_cast(int mode, int fused) {
    if (mode == MXS__JOB_PARTIAL) return fused ? MXS__CAST_INSIDE : MXS__CAST_NONE;
    if (mode == MXS__JOB_APPLY) return fused ? MXS__CAST_OUTSIDE : MXS__CAST_ALL;
    return MXS__CAST_ALL;
}

/* Whether selection `cast` casts a block that lies wholly inside the shard
 * (inside != 0) or straddles one of its edges (inside == 0). */
MXS_HD int mxs__cast_selected(int cast, int inside) {
    return cast == MXS__CAST_ALL || (cast == MXS__CAST_INSIDE && inside) || (cast == MXS__CAST_OUTSIDE && !inside);
}

/* Distributed-optimizer bucket sharding. Weights are laid back to back in a
 * flat bucket of bucket_elems elements (padded so that nranks divides it);
 * rank q owns bucket elements [q*chunk, (q+1)*chunk), chunk =
 * bucket_elems/nranks. For the weight at bucket offset `offset` with `elems`
 * elements, returns this rank's shard of it as a flat range of the weight
 * (count 0 when the rank owns nothing of it):
 *
 *   bucket  |---- w0 ----|------- w1 -------|-- w2 --|pad|
 *   ranks   |  rank 0   |  rank 1   |  rank 2   |  rank 3 |
 *                        ^ w1's shard on rank 1 starts mid-weight, unaligned
 */
/* The part of the bucket range [lo, hi) that falls in the weight at bucket
 * offset `offset` with `elems` elements, as a flat range of that weight
 * (count 0 when they do not meet). Needs offset >= 0, elems >= 0 and
 * offset + elems <= INT64_MAX; otherwise the result is empty (count 0). */
MXS_HD mxs_range mxs_range_in_weight(int64_t lo, int64_t hi, int64_t offset, int64_t elems) {
    mxs_range out;
    out.first = out.count = 0;
    if (offset < 0 || elems < 0 || elems > INT64_MAX - offset) return out;
    lo = lo > offset ? lo : offset;
    hi = hi < offset + elems ? hi : offset + elems;
    out.first = hi > lo ? lo - offset : 0;
    out.count = hi > lo ? hi - lo : 0;
    return out;
}

/* Rank `rank`'s shard of that weight. Needs nranks >= 1, 0 <= rank < nranks
 * and bucket_elems >= 0 (and the conditions of mxs_range_in_weight);
 * otherwise the result is empty (count 0). No product here can overflow:
 * (rank + 1) * chunk <= bucket_elems. */
MXS_HD mxs_range mxs_bucket_shard(int64_t offset, int64_t elems, int64_t bucket_elems, int64_t nranks, int64_t rank) {
    int64_t chunk;
    mxs_range none;
    none.first = none.count = 0;
    if (nranks < 1 || rank < 0 || rank >= nranks || bucket_elems < 0) return none;
    chunk = bucket_elems / nranks;
    return mxs_range_in_weight(rank * chunk, rank * chunk + chunk, offset, elems);
}

MXS_EXTERN_C_END

#endif /* MXSHARD_GEOMETRY_H */
