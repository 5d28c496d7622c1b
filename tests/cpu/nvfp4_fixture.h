/* SPDX-License-Identifier: MIT */
/* tests/cpu/nvfp4_fixture.h - the fixture and test data of the nvfp4 tests:
 * an NVFP4 tensor whose outputs (both planes, even absent ones, and the amax)
 * are poisoned, guarded buffers; dimensions where NVFP4 edges go wrong; and
 * finite source data with a moderate exponent spread.
 */
#ifndef MXSHARD_TESTS_CPU_NVFP4_FIXTURE_H
#define MXSHARD_TESTS_CPU_NVFP4_FIXTURE_H

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <mxshard/mxshard.h>
#include <mxshard/nvfp4_quantize.h>

#include "common.h"
#include "nvfp4_ref.h"

/* ---- fixtures: a tensor with poisoned, guarded outputs ------------------- */

typedef struct fx {
    mxs_nvfp4_tensor t;
    int64_t dbytes, sbytes[2];
    uint8_t *data[2], *scale[2], *amax;
} fx;

static inline void fx_make(fx *f, int64_t rows, int64_t cols, unsigned dirs, int block, int layout) {
    int p;
    memset(f, 0, sizeof *f);
    f->t.rows = rows;
    f->t.cols = cols;
    f->t.dirs = dirs;
    f->t.block = (mxs_nvfp4_block)block;
    f->t.scale_layout = (mxs_scale_layout)layout;
    f->dbytes = (rows * cols + 1) / 2;
    for (p = 0; p < 2; p++) {
        /* absent planes get buffers too: they must stay untouched */
        f->sbytes[p] = ref_sbytes(rows, cols, p + 1, layout);
        f->data[p] = t_alloc((size_t)f->dbytes);
        f->scale[p] = t_alloc((size_t)f->sbytes[p]);
        cr_assert(f->data[p] && f->scale[p]);
    }
    f->amax = t_alloc(sizeof(float));
    f->t.row_data = f->data[0];
    f->t.row_scale = f->scale[0];
    f->t.col_data = f->data[1];
    f->t.col_scale = f->scale[1];
    f->t.amax = (float *)(void *)f->amax;
}

static inline void fx_free(fx *f) {
    int p;
    for (p = 0; p < 2; p++) {
        free(f->data[p]);
        free(f->scale[p]);
    }
    free(f->amax);
}

static inline int fx_all_poisoned(const fx *f) {
    int p;
    for (p = 0; p < 2; p++)
        if (!t_all_poisoned(f->data[p], (size_t)f->dbytes) || !t_all_poisoned(f->scale[p], (size_t)f->sbytes[p]))
            return 0;
    return t_all_poisoned(f->amax, sizeof(float));
}

static inline float fx_amax(const fx *f) {
    float a;
    memcpy(&a, f->amax, sizeof a);
    return a;
}

/* Dimensions where NVFP4 edges go wrong: 1, small, around multiples of 16
 * and 128, and random. */
static inline int64_t rand_dim16(t_rng *r, int64_t max) {
    int64_t d;
    switch (t_below(r, 5)) {
    case 0: d = 1; break;
    case 1: d = t_between(r, 1, 40); break;
    case 2: d = 16 * t_between(r, 1, 12) + t_between(r, -1, 1); break;
    case 3: d = 128 * t_between(r, 1, 2) + t_between(r, -2, 2); break;
    default: d = t_between(r, 1, max); break;
    }
    if (d < 1) d = 1;
    return d > max ? max : d;
}

static inline void *alloc_src(mxs_dtype dtype, int64_t n) {
    void *s = malloc((size_t)n * (size_t)mxs_dtype_bytes(dtype) + 1);
    cr_assert_not_null(s);
    return s;
}

/* Finite values with a moderate exponent spread around 2^center, some
 * zero 16-runs: the data the error bounds are stated for. `narrow` keeps them
 * inside f16's range (for an f16 source or round-through). */
static inline void fill_finite(t_rng *r, void *src, mxs_dtype dtype, int64_t n, int narrow) {
    int center = narrow ? (int)t_between(r, -3, 3) : (int)t_between(r, -30, 30);
    int64_t i;
    for (i = 0; i < n; i++) {
        float v;
        if (i % 16 == 0 && t_below(r, 20) == 0) {
            int64_t k;
            for (k = 0; k < 16 && i < n; k++, i++) {
                if (dtype == MXS_F32)
                    ((float *)src)[i] = 0.0f;
                else
                    ((uint16_t *)src)[i] = 0;
            }
            i--;
            continue;
        }
        v = ldexpf(1.0f + (float)t_below(r, 1 << 20) / (float)(1 << 20), center + (int)t_between(r, -10, 10));
        if (t_next(r) & 1) v = -v;
        if (dtype == MXS_F32)
            ((float *)src)[i] = v;
        else if (dtype == MXS_BF16)
            ((uint16_t *)src)[i] = mxs_bf16_from_f32(v);
        else
            ((uint16_t *)src)[i] = mxs_f16_from_f32(v);
    }
}

#endif /* MXSHARD_TESTS_CPU_NVFP4_FIXTURE_H */
