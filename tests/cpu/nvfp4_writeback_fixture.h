/* SPDX-License-Identifier: MIT */
/* tests/cpu/nvfp4_writeback_fixture.h - the one-rank fixture of the NVFP4
 * writeback tests (docs/contract.md section 9.8): three items of fixed shapes
 * and planes whose outputs are poisoned, guarded buffers, and the check that
 * every output is still poisoned after a rejected call.
 */
#ifndef MXSHARD_TESTS_CPU_NVFP4_WRITEBACK_FIXTURE_H
#define MXSHARD_TESTS_CPU_NVFP4_WRITEBACK_FIXTURE_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <mxshard/mxshard.h>
#include <mxshard/nvfp4_writeback.h>

#include "common.h"

/* A fixture: one rank, items with poisoned, guarded buffers. */
typedef struct one {
    mxs_nvfp4_wb_item items[3];
    mxs_nvfp4_wb_batch batch;
    uint8_t *bufs[3][8];
    int64_t sizes[3][8];
    uint8_t *packed;
    int64_t packed_bytes;
} one;

/* Item k: rows x cols, dirs, block, layout COMPACT, f32 master of the whole
 * weight, stage. Buffers: 0 row data, 1 row scale, 2 col data, 3 col scale,
 * 4 stage, 5 amax, 6 master, 7 a spare output (a fragment, when a test gives
 * one). */
static inline void one_item(one *o, int k, int64_t rows, int64_t cols, unsigned dirs, int block) {
    mxs_nvfp4_wb_item *it = &o->items[k];
    mxs_nvfp4_tensor both;
    int64_t db = (rows * cols + 1) / 2, i;
    int b;
    memset(&both, 0, sizeof both);
    both.rows = rows;
    both.cols = cols;
    both.dirs = MXS_BOTH;
    both.scale_layout = MXS_SCALES_SWIZZLED; /* room for any layout */
    o->sizes[k][0] = o->sizes[k][2] = o->sizes[k][4] = db;
    o->sizes[k][1] = mxs_nvfp4_scale_bytes(&both, MXS_ROWWISE);
    o->sizes[k][3] = mxs_nvfp4_scale_bytes(&both, MXS_COLWISE);
    o->sizes[k][5] = 4;
    o->sizes[k][6] = rows * cols * 4;
    o->sizes[k][7] = db;
    for (b = 0; b < 8; b++) o->bufs[k][b] = t_alloc((size_t)o->sizes[k][b]);
    for (i = 0; i < rows * cols; i++) ((float *)(void *)o->bufs[k][6])[i] = (float)((i * 37) % 23) - 11.0f;
    memset(it, 0, sizeof *it);
    it->primary.rows = rows;
    it->primary.cols = cols;
    it->primary.dirs = dirs;
    it->primary.block = (mxs_nvfp4_block)block;
    it->primary.row_data = o->bufs[k][0];
    it->primary.row_scale = o->bufs[k][1];
    it->primary.col_data = o->bufs[k][2];
    it->primary.col_scale = o->bufs[k][3];
    it->col_stage = (dirs & MXS_COLWISE) ? o->bufs[k][4] : NULL;
    it->primary.amax = (float *)(void *)o->bufs[k][5];
    it->master = o->bufs[k][6];
    it->master_dtype = MXS_F32;
    it->start = 0;
    it->len = rows * cols;
}

static inline void one_make(one *o) {
    memset(o, 0, sizeof *o);
    one_item(o, 0, 20, 33, MXS_BOTH, MXS_NVFP4_1X16);
    one_item(o, 1, 17, 40, MXS_ROWWISE, MXS_NVFP4_16X16);
    one_item(o, 2, 9, 5, MXS_COLWISE, MXS_NVFP4_1X16);
    o->batch.items = o->items;
    o->batch.n_items = 3;
    o->batch.round_through = MXS_BF16;
    o->packed_bytes = 4096;
    o->packed = t_alloc((size_t)o->packed_bytes);
}

static inline void one_free(one *o) {
    int k, b;
    for (k = 0; k < 3; k++)
        for (b = 0; b < 8; b++) free(o->bufs[k][b]);
    free(o->packed);
}

static inline int one_untouched(const one *o) { /* every output still poisoned (masters are inputs) */
    int k, b;
    for (k = 0; k < 3; k++)
        for (b = 0; b < 8; b++)
            if (b != 6 && !t_all_poisoned(o->bufs[k][b], (size_t)o->sizes[k][b])) return 0;
    return 1;
}

#endif /* MXSHARD_TESTS_CPU_NVFP4_WRITEBACK_FIXTURE_H */
