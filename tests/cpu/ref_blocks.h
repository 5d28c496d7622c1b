/* SPDX-License-Identifier: MIT */
/* tests/cpu/ref_blocks.h - an independent statement of "this element's block
 * lies wholly inside the shard [start, end)", written from docs/contract.md section 2
 * without the library's geometry.h, for the writeback tests' poison checks
 * (fused partial may cast exactly those blocks). */
#ifndef MXSHARD_TESTS_REF_BLOCKS_H
#define MXSHARD_TESTS_REF_BLOCKS_H

#include <stdint.h>

/* Row-wise (1x32) block of flat element f. */
static inline int ref_row_block_inside(int64_t cols, int64_t f, int64_t start, int64_t end) {
    int64_t r = f / cols, c0 = (f % cols) / 32 * 32;
    int64_t c1 = c0 + 32 < cols ? c0 + 32 : cols;
    return r * cols + c0 >= start && r * cols + c1 <= end;
}

/* Column-wise (32x1) block of flat element f. */
static inline int ref_col_block_inside(int64_t rows, int64_t cols, int64_t f, int64_t start, int64_t end) {
    int64_t r0 = (f / cols) / 32 * 32, c = f % cols;
    int64_t r1 = r0 + 32 < rows ? r0 + 32 : rows;
    return r0 * cols + c >= start && (r1 - 1) * cols + c < end;
}

#endif /* MXSHARD_TESTS_REF_BLOCKS_H */
