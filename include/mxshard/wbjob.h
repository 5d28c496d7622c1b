/* SPDX-License-Identifier: MIT */
/* mxshard/wbjob.h - PRIVATE: the shard job that the host engine and the CUDA
 * kernels both run. Not part of the API (names mxs__*; fields may change in
 * any release); included by quantize.h and by the kernels in cuda/.
 *
 * A job is one weight restricted to the flat range [lo, hi) of its
 * rows x cols elements (the whole tensor for quantize):
 *
 *   flat index  0            lo                          hi        rows*cols
 *               |------------[===========================)-----------|
 *   src         element 0 of `src` is flat index src_base (= lo for a
 *               master shard, 0 for quantize)
 *   out[p]      data bytes of plane p (0 row-wise, 1 column-wise): flat
 *               index f goes to out[p][f - out_base[p]] (out_base = lo for a
 *               fragment of len bytes, 0 for a whole data plane)
 *   scale[p]    exponents of plane p in layout geom[p]: written by QUANTIZE
 *               and PARTIAL (the packed buffer, COMPACT), read by APPLY
 *   cast        which blocks get their data bytes written
 *               (mxs__phase_cast / mxs__cast_selected, geometry.h)
 *
 * Who builds a job (one function each, no second derivation):
 *   whole-tensor quantize  mxs__quantize_job   (below; host and CUDA)
 *   writeback item         mxs__wb_job         (writeback.h; host engine and
 *                                               the CUDA prepared bucket)
 *   packed-buffer offsets  mxs__packed_slot    (below; host, CUDA, plan)
 */
#ifndef MXSHARD_WBJOB_H
#define MXSHARD_WBJOB_H

#include <string.h>

#include "config.h"
#include "formats.h"
#include "geometry.h"
#include "tensor.h"

MXS_EXTERN_C_BEGIN

typedef struct mxs__job {
    int64_t rows, cols;
    int64_t lo, hi;
    const void *src; /* src element 0 is flat index src_base */
    int64_t src_base;
    mxs_dtype src_dtype;
    mxs_dtype round_through; /* effective (mxs__effective_round_through) */
    mxs_rounding rounding;
    int mode;        /* MXS__JOB_* (geometry.h) */
    int cast;        /* MXS__CAST_*: mxs__phase_cast(mode, fused) */
    unsigned planes; /* MXS_ROWWISE | MXS_COLWISE */
    int vec;         /* CUDA only: 16-byte source / 8-byte output vectors are allowed */
    int pad;         /* CUDA only: also write the padding entries of PADDED / SWIZZLED scale planes */
    uint8_t *out[2]; /* data bytes per plane [row, col]: out[p][f - out_base[p]] */
    int64_t out_base[2];
    mxs_scale_geom geom[2];
    uint8_t *scale[2]; /* QUANTIZE / PARTIAL: written; APPLY: read */
} mxs__job;

/* The round-through a job applies to a source of `src` dtype: `rt`, except
 * that rounding a value to the type it already has is the identity (MXS_F32:
 * none). Host and kernels then test one field. */
MXS_HD mxs_dtype mxs__effective_round_through(mxs_dtype src, mxs_dtype rt) {
    return (rt == MXS_F32 || rt == src) ? MXS_F32 : rt;
}

/* Where one item's exponents sit in the packed buffer (docs/contract.md section 4), the
 * one rule for every reader and writer of the buffer: the items' COMPACT
 * row-wise planes in batch order from offset 0, then their COMPACT
 * column-wise planes in batch order from row_region_bytes. *row_at and
 * *col_at are the running offsets (start them at 0 and row_region_bytes);
 * the item's offsets go to *row_off / *col_off (-1: plane absent) and the
 * running offsets advance past it. t is a checked shape. */
MXS_HD void mxs__packed_slot(const mxs_tensor *t, int64_t *row_at, int64_t *col_at, int64_t *row_off,
                             int64_t *col_off) {
    *row_off = *col_off = -1;
    if (t->dirs & MXS_ROWWISE) {
        *row_off = *row_at;
        *row_at += t->rows * mxs_row_blocks_per_row(t->cols); /* M*K of the COMPACT row-wise plane */
    }
    if (t->dirs & MXS_COLWISE) {
        *col_off = *col_at;
        *col_at += mxs_col_groups(t->rows) * t->cols; /* K*M of the COMPACT column-wise plane */
    }
}

/* The job of a whole-tensor quantize of `src` into dst (validated). */
MXS_PRIVATE void mxs__quantize_job(const mxs_tensor *dst, const void *src, mxs_dtype src_dtype, mxs_rounding r,
                                   mxs__job *job) {
    int p;
    memset(job, 0, sizeof *job);
    job->rows = dst->rows;
    job->cols = dst->cols;
    job->lo = 0;
    job->hi = dst->rows * dst->cols;
    job->src = src;
    job->src_base = 0;
    job->src_dtype = src_dtype;
    job->round_through = MXS_F32;
    job->rounding = r;
    job->mode = MXS__JOB_QUANTIZE;
    job->cast = mxs__phase_cast(MXS__JOB_QUANTIZE, 0);
    job->planes = dst->dirs;
    job->pad = dst->scale_layout != MXS_SCALES_COMPACT;
    job->out[0] = dst->row_data;
    job->out[1] = dst->col_data;
    job->scale[0] = dst->row_scale;
    job->scale[1] = dst->col_scale;
    for (p = 0; p < 2; p++)
        if (dst->dirs & (unsigned)(p + 1))
            mxs_scale_geom_make(dst->rows, dst->cols, (mxs_dirs)(p + 1), dst->scale_layout, &job->geom[p]);
}

MXS_EXTERN_C_END

#endif /* MXSHARD_WBJOB_H */
