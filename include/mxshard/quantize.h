/* SPDX-License-Identifier: MIT */
/* mxshard/quantize.h - whole-tensor quantize (copy-back), dequantize and
 * scale-layout conversion on the CPU (docs/contract.md sections 2, 5, 7).
 *
 *   mxs_host_quantize(dst, src, dtype, rounding)
 *       Quantizes a whole rows x cols source (f32, bf16 or f16) into exactly
 *       the planes dst->dirs names, scales in dst->scale_layout. This is the
 *       BF16 copy-back: a row-only primary stays row-only.
 *   mxs_host_dequantize(t, plane, dst, dtype)
 *       One plane back to f32 / bf16 / f16 (the high-precision backward
 *       override of a row-only weight).
 *   mxs_host_convert_scales(rows, cols, plane, from, src, to, dst)
 *       One scale plane between COMPACT, PADDED and SWIZZLED.
 *
 * The engine below (mxs__host_*) walks a weight in 32x32 tiles - one
 * row-wise block column by one 32-row group - so both planes' amaxes come
 * out of one read of the source. The writeback (writeback.h) runs the same
 * engine restricted to a shard.
 */
#ifndef MXSHARD_QUANTIZE_H
#define MXSHARD_QUANTIZE_H

#include <string.h>

#include "config.h"
#include "formats.h"
#include "geometry.h"
#include "status.h"
#include "tensor.h"
#include "wbjob.h"

MXS_EXTERN_C_BEGIN

/* ---- engine (private) ---------------------------------------------------- */

/* One weight processed over the flat range [lo, hi) (the job of wbjob.h,
 * shared with the CUDA kernels).
 *   QUANTIZE: amax -> exponent -> scale[] and cast every element.
 *   PARTIAL : amax -> exponent -> scale[] (the packed buffer, COMPACT);
 *             cast the blocks job->cast selects (fused: wholly inside).
 *   APPLY   : exponent <- scale[] (the reduced packed buffer); cast the
 *             blocks job->cast selects (fused: those straddling an edge). */
typedef mxs__job mxs__host_job;

/* Widen n source elements starting at element idx into dst (f32), applying
 * the round-through. One switch per call, not per element. */
MXS_PRIVATE void mxs__host_load(float *dst, const void *src, mxs_dtype dtype, int64_t idx, int64_t n, mxs_dtype rt) {
    int64_t k;
    switch (dtype) {
    case MXS_BF16: {
        const uint16_t *p = (const uint16_t *)src + idx;
        for (k = 0; k < n; k++) dst[k] = mxs_bf16_to_f32(p[k]);
        if (rt == MXS_F16)
            for (k = 0; k < n; k++) dst[k] = mxs_round_through(dst[k], MXS_F16);
        return; /* bf16 -> bf16 round-through is the identity */
    }
    case MXS_F16: {
        const uint16_t *p = (const uint16_t *)src + idx;
        for (k = 0; k < n; k++) dst[k] = mxs_f16_to_f32(p[k]);
        if (rt == MXS_BF16)
            for (k = 0; k < n; k++) dst[k] = mxs_round_through(dst[k], MXS_BF16);
        return;
    }
    default: {
        const float *p = (const float *)src + idx;
        if (rt == MXS_BF16)
            for (k = 0; k < n; k++) dst[k] = mxs_bf16_to_f32(mxs_bf16_from_f32(p[k]));
        else if (rt == MXS_F16)
            for (k = 0; k < n; k++) dst[k] = mxs_f16_to_f32(mxs_f16_from_f32(p[k]));
        else
            memcpy(dst, p, (size_t)n * sizeof(float));
        return;
    }
    }
}

MXS_PRIVATE void mxs__host_cast_span(uint8_t *MXS_RESTRICT out, const float *MXS_RESTRICT x, int64_t n, float mult) {
    int64_t k;
    if (n == MXS_BLOCK) { /* a constant trip count vectorises even at -O2 */
        for (k = 0; k < MXS_BLOCK; k++) out[k] = mxs_quantize_elem(x[k], mult);
        return;
    }
    for (k = 0; k < n; k++) out[k] = mxs_quantize_elem(x[k], mult);
}

/* Column-wise cast of one tile row: each element has its column's multiplier. */
MXS_PRIVATE void mxs__host_cast_cols(uint8_t *MXS_RESTRICT out, const float *MXS_RESTRICT x,
                                     const float *MXS_RESTRICT mult, int64_t a, int64_t b) {
    int64_t k;
    if (a == 0 && b == MXS_BLOCK) {
        for (k = 0; k < MXS_BLOCK; k++) out[k] = mxs_quantize_elem(x[k], mult[k]);
        return;
    }
    for (k = a; k < b; k++) out[k] = mxs_quantize_elem(x[k], mult[k]);
}

/* lane[j] = maxNum(lane[j], |x[j]|) for 8 lanes: the shape compilers turn
 * into vector max instructions. */
MXS_PRIVATE void mxs__host_max8(float *MXS_RESTRICT lane, const float *MXS_RESTRICT x) {
    int j;
    for (j = 0; j < 8; j++) lane[j] = mxs_amax_step(lane[j], x[j]);
}

/* Amax of one row of the tile (<= 32 elements). A full block is reduced in
 * 8 lanes first; maxNum is associative, so the order does not matter. */
MXS_PRIVATE float mxs__host_amax_span(const float *x, int64_t n) {
    float lane[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f}, amax = 0.0f;
    int64_t k;
    if (n == MXS_BLOCK) {
        for (k = 0; k < MXS_BLOCK; k += 8) mxs__host_max8(lane, x + k);
        for (k = 0; k < 8; k++) amax = mxs_amax_step(amax, lane[k]);
        return amax;
    }
    for (k = 0; k < n; k++) amax = mxs_amax_step(amax, x[k]);
    return amax;
}

/* Tile (group g, block column t): rows 32g.., cols 32t.. */
MXS_PRIVATE void mxs__host_tile(const mxs__host_job *job, int64_t g, int64_t t) {
    float x[MXS_BLOCK][MXS_BLOCK];
    int64_t lo[MXS_BLOCK], hi[MXS_BLOCK];
    float mult_row[MXS_BLOCK], mult_col[MXS_BLOCK];
    int full_row[MXS_BLOCK];
    const int64_t r0 = g * MXS_BLOCK, c0 = t * MXS_BLOCK;
    const int64_t nr = job->rows - r0 < MXS_BLOCK ? job->rows - r0 : MXS_BLOCK;
    const int64_t nc = job->cols - c0 < MXS_BLOCK ? job->cols - c0 : MXS_BLOCK;
    const int do_row = (job->planes & MXS_ROWWISE) != 0, do_col = (job->planes & MXS_COLWISE) != 0;
    int64_t i, j, maxlo = 0, minhi = nc;
    int any = 0, all_rows = 1, need_cast;
    int64_t col_full_lo, col_full_hi; /* columns [lo,hi) whose 32x1 block is wholly inside */

    for (i = 0; i < nr; i++) {
        mxs_range rc = mxs_shard_row_cols(job->cols, r0 + i, job->lo, job->hi - job->lo);
        int64_t l = rc.first - c0, h = rc.first + rc.count - c0;
        l = l < 0 ? 0 : l;
        h = h > nc ? nc : h;
        if (h <= l) {
            l = 0;
            h = 0;
            all_rows = 0;
        } else
            any = 1;
        lo[i] = l;
        hi[i] = h;
        full_row[i] = l == 0 && h == nc;
        if (l > maxlo) maxlo = l;
        if (h < minhi) minhi = h;
    }
    if (!any) return;
    col_full_lo = all_rows ? maxlo : 0;
    col_full_hi = all_rows && minhi > maxlo ? minhi : 0;

    /* Anything to cast in this tile? (APPLY-fused only touches straddlers.) */
    if (job->mode == MXS__JOB_APPLY && job->cast == MXS__CAST_OUTSIDE) {
        need_cast = 0;
        if (do_col && (col_full_hi - col_full_lo) < nc) need_cast = 1;
        for (i = 0; i < nr && do_row && !need_cast; i++) need_cast = hi[i] > lo[i] && !full_row[i];
        if (!need_cast) return;
    }

    for (i = 0; i < nr; i++) {
        int64_t f = (r0 + i) * job->cols + c0;
        for (j = 0; j < lo[i]; j++) x[i][j] = 0.0f;
        if (hi[i] > lo[i])
            mxs__host_load(&x[i][lo[i]], job->src, job->src_dtype, f + lo[i] - job->src_base, hi[i] - lo[i],
                           job->round_through);
        for (j = hi[i]; j < MXS_BLOCK; j++) x[i][j] = 0.0f; /* the column amax runs over 32 */
    }

    /* Exponents: from the amax (QUANTIZE, PARTIAL) or from the reduced
     * buffer (APPLY). Elements outside [lo, hi) were loaded as 0 and do not
     * move an amax (amax >= 0). */
    if (do_row) {
        for (i = 0; i < nr; i++) {
            uint8_t e;
            int64_t off = mxs_scale_geom_offset(&job->geom[0], r0 + i, t);
            if (job->mode == MXS__JOB_APPLY) {
                e = job->scale[0][off];
            } else {
                e = mxs_e8m0_from_amax(mxs__host_amax_span(x[i], nc), job->rounding);
                job->scale[0][off] = e;
            }
            mult_row[i] = mxs_e8m0_quant_mult(e);
        }
    }
    if (do_col) {
        float amax[MXS_BLOCK];
        if (job->mode != MXS__JOB_APPLY) {
            for (j = 0; j < MXS_BLOCK; j++) amax[j] = 0.0f;
            for (i = 0; i < nr; i++)
                for (j = 0; j < MXS_BLOCK; j++) amax[j] = mxs_amax_step(amax[j], x[i][j]);
        }
        for (j = 0; j < nc; j++) {
            uint8_t e;
            int64_t off = mxs_scale_geom_offset(&job->geom[1], c0 + j, g);
            if (job->mode == MXS__JOB_APPLY) {
                e = job->scale[1][off];
            } else {
                e = mxs_e8m0_from_amax(amax[j], job->rounding);
                job->scale[1][off] = e;
            }
            mult_col[j] = mxs_e8m0_quant_mult(e);
        }
    }

    if (job->cast == MXS__CAST_NONE) return;

    for (i = 0; i < nr; i++) {
        int64_t f = (r0 + i) * job->cols + c0;
        if (hi[i] <= lo[i]) continue;
        if (do_row) {
            /* the row-wise block of this tile row is wholly inside iff the row is full */
            if (mxs__cast_selected(job->cast, full_row[i]))
                mxs__host_cast_span(job->out[0] + (f + lo[i] - job->out_base[0]), &x[i][lo[i]], hi[i] - lo[i],
                                    mult_row[i]);
        }
        if (do_col) {
            uint8_t *out = job->out[1] + (f - job->out_base[1]);
            int64_t a = lo[i], b = hi[i];
            /* column j's block is wholly inside iff col_full_lo <= j < col_full_hi */
            if (job->cast == MXS__CAST_INSIDE) {
                a = a > col_full_lo ? a : col_full_lo; /* one contiguous run: vectorises */
                b = b < col_full_hi ? b : col_full_hi;
                mxs__host_cast_cols(out, x[i], mult_col, a, b);
            } else if (job->cast == MXS__CAST_OUTSIDE) {
                for (j = a; j < b; j++)
                    if (mxs__cast_selected(job->cast, j >= col_full_lo && j < col_full_hi))
                        out[j] = mxs_quantize_elem(x[i][j], mult_col[j]);
            } else {
                mxs__host_cast_cols(out, x[i], mult_col, a, b);
            }
        }
    }
}

/* Runs the job over the groups the range touches (APPLY-fused: only the two
 * edge groups can hold straddling blocks). */
MXS_PRIVATE void mxs__host_run(const mxs__host_job *job) {
    mxs_range groups = mxs_shard_groups(job->cols, job->lo, job->hi - job->lo);
    int64_t kr = mxs_row_blocks_per_row(job->cols), g, t;
    for (g = groups.first; g < groups.first + groups.count; g++) {
        if (job->cast == MXS__CAST_OUTSIDE && g != groups.first && g != groups.first + groups.count - 1) continue;
        for (t = 0; t < kr; t++) mxs__host_tile(job, g, t);
    }
}

/* ---- public API ---------------------------------------------------------- */

/* The quantize aliasing rule (MXFP8 and NVFP4): the n outputs out[i] of
 * bytes[i] bytes pairwise disjoint and disjoint from the source, else
 * MXS_ERR_ALIASING. */
MXS_NODISCARD MXS_PRIVATE mxs_status mxs__outputs_disjoint(const void *const *out, const int64_t *bytes, int n,
                                                           const void *src, int64_t src_bytes) {
    int i, j;
    for (i = 0; i < n; i++) {
        if (mxs__overlap(out[i], bytes[i], src, src_bytes)) return MXS_ERR_ALIASING;
        for (j = 0; j < i; j++)
            if (mxs__overlap(out[i], bytes[i], out[j], bytes[j])) return MXS_ERR_ALIASING;
    }
    return MXS_OK;
}

/* Stores v as element i of dst in dst_dtype (F32, BF16 or F16): the
 * dequantize output rule (MXFP8 and NVFP4). */
MXS_PRIVATE void mxs__store_elem(void *dst, mxs_dtype dst_dtype, int64_t i, float v) {
    if (dst_dtype == MXS_F32)
        ((float *)dst)[i] = v;
    else if (dst_dtype == MXS_BF16)
        ((uint16_t *)dst)[i] = mxs_bf16_from_f32(v);
    else
        ((uint16_t *)dst)[i] = mxs_f16_from_f32(v);
}

/* Validates a quantize request (shared by the host and CUDA paths): the
 * arguments, the tensor (mxs_tensor_check) and the buffers. Every output
 * plane the tensor names - each data plane (rows*cols bytes) and each scale
 * plane (mxs_scale_bytes in dst's layout) - must not overlap `src`
 * (rows*cols elements of src_dtype) nor another output plane:
 * MXS_ERR_ALIASING. Pointers are compared, never dereferenced. */
MXS_NODISCARD MXS_API mxs_status mxs_quantize_check(const mxs_tensor *dst, const void *src, mxs_dtype src_dtype,
                                                    mxs_rounding r) {
    const void *out[4] = {NULL, NULL, NULL, NULL};
    int64_t bytes[4] = {0, 0, 0, 0}, elems, src_bytes;
    int n = 0, p;
    mxs_status s;
    if (!dst || !src || !mxs_dtype_valid((int)src_dtype) || !mxs_rounding_valid((int)r))
        return MXS_ERR_INVALID_ARGUMENT;
    if ((s = mxs_tensor_check(dst)) != MXS_OK) return s;
    elems = dst->rows * dst->cols;
    if (!mxs_mul_ok(elems, mxs_dtype_bytes(src_dtype), &src_bytes)) return MXS_ERR_OVERFLOW;
    for (p = MXS_ROWWISE; p <= MXS_COLWISE; p++) {
        if (!(dst->dirs & (unsigned)p)) continue;
        out[n] = p == MXS_ROWWISE ? dst->row_data : dst->col_data;
        bytes[n++] = elems;
        out[n] = p == MXS_ROWWISE ? dst->row_scale : dst->col_scale;
        bytes[n++] = mxs_scale_bytes(dst, (mxs_dirs)p);
    }
    return mxs__outputs_disjoint(out, bytes, n, src, src_bytes);
}

/* Quantizes the whole rows x cols `src` into exactly the planes dst->dirs
 * names (docs/contract.md sections 5 and 7). Validates everything before writing
 * (mxs_quantize_check): MXS_ERR_INVALID_ARGUMENT (NULL dst/src, bad
 * dtype/rounding/dirs/layout), MXS_ERR_SHAPE, MXS_ERR_OVERFLOW,
 * MXS_ERR_ABSENT_PLANE (a named plane has a NULL data or scale pointer),
 * MXS_ERR_ALIASING (an output plane overlaps src or another output plane).
 * Padding entries of PADDED/SWIZZLED scale planes are written as 0x00. */
MXS_NODISCARD MXS_API mxs_status mxs_host_quantize(mxs_tensor *dst, const void *src, mxs_dtype src_dtype,
                                                   mxs_rounding r) {
    mxs__host_job job;
    mxs_status s;
    int p;
    if ((s = mxs_quantize_check(dst, src, src_dtype, r)) != MXS_OK) return s;

    mxs__quantize_job(dst, src, src_dtype, r, &job);
    for (p = 0; p < 2; p++) {
        if (!(dst->dirs & (unsigned)(p + 1))) continue;
        if (dst->scale_layout != MXS_SCALES_COMPACT) /* padding entries are 0x00 */
            memset(job.scale[p], 0, (size_t)mxs_scale_geom_bytes(&job.geom[p]));
    }
    mxs__host_run(&job);
    return MXS_OK;
}

/* Validates a dequantize request (shared by the host and CUDA paths) and
 * returns the plane's data/scale pointers and scale geometry. dst
 * (rows*cols elements of dst_dtype) must not overlap the data plane or the
 * scale plane (in t's layout) it reads: MXS_ERR_ALIASING. */
MXS_NODISCARD MXS_API mxs_status mxs_dequantize_check(const mxs_tensor *t, mxs_dirs plane, const void *dst,
                                                      mxs_dtype dst_dtype, const uint8_t **data, const uint8_t **scale,
                                                      mxs_scale_geom *g) {
    int64_t elems;
    mxs_status s;
    if (!t || !dst || !mxs_dtype_valid((int)dst_dtype) || !mxs_plane_valid((int)plane)) return MXS_ERR_INVALID_ARGUMENT;
    if ((s = mxs_tensor_check_shape(t)) != MXS_OK) return s;
    if (!(t->dirs & (unsigned)plane)) return MXS_ERR_ABSENT_PLANE;
    *data = plane == MXS_ROWWISE ? t->row_data : t->col_data;
    *scale = plane == MXS_ROWWISE ? t->row_scale : t->col_scale;
    if (!*data || !*scale) return MXS_ERR_ABSENT_PLANE;
    elems = t->rows * t->cols;
    if (elems > INT64_MAX / 4) return MXS_ERR_OVERFLOW;
    mxs_scale_geom_make(t->rows, t->cols, plane, t->scale_layout, g);
    if (mxs__overlap(dst, elems * mxs_dtype_bytes(dst_dtype), *data, elems) ||
        mxs__overlap(dst, elems * mxs_dtype_bytes(dst_dtype), *scale, mxs_scale_geom_bytes(g)))
        return MXS_ERR_ALIASING;
    return MXS_OK;
}

/* Dequantizes one plane (MXS_ROWWISE or MXS_COLWISE) of t into dst, rows x
 * cols elements of `dst_dtype` (f32, or bf16/f16 rounded to nearest even):
 * x' = e4m3_to_f32(q) * 2^(e-127), in f32. t's scales are read in its layout. */
MXS_NODISCARD MXS_API mxs_status mxs_host_dequantize(const mxs_tensor *t, mxs_dirs plane, void *dst,
                                                     mxs_dtype dst_dtype) {
    mxs_scale_geom g;
    const uint8_t *data, *scale;
    int64_t r, c;
    mxs_status s = mxs_dequantize_check(t, plane, dst, dst_dtype, &data, &scale, &g);
    if (s != MXS_OK) return s;
    for (r = 0; r < t->rows; r++) {
        int64_t f = r * t->cols;
        for (c = 0; c < t->cols; c++) {
            uint8_t e = scale[mxs_scale_geom_offset(&g, mxs_scale_m(&g, r, c), mxs_scale_k(&g, r, c))];
            float v = mxs_dequantize_elem(data[f + c], e);
            mxs__store_elem(dst, dst_dtype, f + c, v);
        }
    }
    return MXS_OK;
}

/* Converts one scale plane of a rows x cols tensor from layout `from` (src)
 * to layout `to` (dst). Every dst byte is written once: logical entries are
 * copied, padding entries become 0x00 (source padding is ignored). src and
 * dst must not overlap (MXS_ERR_ALIASING). */
/* Validates a scale-conversion request (shared by the host and CUDA paths)
 * and returns both geometries. */
MXS_NODISCARD MXS_API mxs_status mxs_convert_scales_check(int64_t rows, int64_t cols, mxs_dirs plane,
                                                          mxs_scale_layout from, const uint8_t *src,
                                                          mxs_scale_layout to, const uint8_t *dst, mxs_scale_geom *gs,
                                                          mxs_scale_geom *gd) {
    mxs_tensor shape;
    mxs_status s;
    if (!src || !dst || !mxs_plane_valid((int)plane) || !mxs_layout_valid((int)from) || !mxs_layout_valid((int)to))
        return MXS_ERR_INVALID_ARGUMENT;
    memset(&shape, 0, sizeof shape);
    shape.rows = rows;
    shape.cols = cols;
    shape.dirs = MXS_BOTH;
    shape.scale_layout = from;
    if ((s = mxs_tensor_check_shape(&shape)) != MXS_OK) return s;
    mxs_scale_geom_make(rows, cols, plane, from, gs);
    mxs_scale_geom_make(rows, cols, plane, to, gd);
    if (mxs__overlap(src, mxs_scale_geom_bytes(gs), dst, mxs_scale_geom_bytes(gd))) return MXS_ERR_ALIASING;
    return MXS_OK;
}

/* The host scale conversion of checked arguments (MXFP8 and NVFP4): every
 * byte of dst in layout gd, logical entries from src (layout gs), padding
 * entries 0x00. */
MXS_PRIVATE void mxs__convert_scales_with(const mxs_scale_geom *gs, const uint8_t *src, const mxs_scale_geom *gd,
                                          uint8_t *dst) {
    int64_t off, bytes = mxs_scale_geom_bytes(gd), m, k;
    for (off = 0; off < bytes; off++) {
        mxs_scale_geom_coords(gd, off, &m, &k);
        dst[off] = mxs_scale_geom_is_logical(gd, m, k) ? src[mxs_scale_geom_offset(gs, m, k)] : 0;
    }
}

MXS_NODISCARD MXS_API mxs_status mxs_host_convert_scales(int64_t rows, int64_t cols, mxs_dirs plane,
                                                         mxs_scale_layout from, const uint8_t *src, mxs_scale_layout to,
                                                         uint8_t *dst) {
    mxs_scale_geom gs, gd;
    mxs_status s = mxs_convert_scales_check(rows, cols, plane, from, src, to, dst, &gs, &gd);
    if (s != MXS_OK) return s;
    mxs__convert_scales_with(&gs, src, &gd, dst);
    return MXS_OK;
}

MXS_EXTERN_C_END

#endif /* MXSHARD_QUANTIZE_H */
