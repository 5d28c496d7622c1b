/* SPDX-License-Identifier: MIT */
/* mxshard/nvfp4_quantize.h - whole-tensor NVFP4 quantize (copy-back),
 * dequantize and scale-layout conversion on the CPU (docs/contract.md
 * section 9).
 *
 *   mxs_host_nvfp4_quantize(dst, src, src_dtype, round_through)
 *       Quantizes a whole rows x cols source (f32, bf16 or f16) into exactly
 *       the planes dst->dirs names, with dst's block shape and scale layout,
 *       and writes the global amax to *dst->amax. round_through = MXS_BF16
 *       rounds every source value to bf16 first, as Transformer Engine's
 *       master-weight cast does; MXS_F32 means no rounding.
 *   mxs_host_nvfp4_dequantize(t, plane, dst, dst_dtype)
 *       One plane back to the rows x cols weight (un-transposed for the
 *       column-wise plane) in f32 / bf16 / f16.
 *   mxs_host_nvfp4_convert_scales(rows, cols, plane, from, src, to, dst)
 *       One scale plane between COMPACT, PADDED and SWIZZLED.
 *
 * The engine (mxs__nvfp4_host_*) walks the weight in 16x16 tiles, so both
 * planes' block amaxes (1x16 and 16x1, or the tile's) come out of one read
 * of the tile; a first pass computes the global amax.
 */
#ifndef MXSHARD_NVFP4_QUANTIZE_H
#define MXSHARD_NVFP4_QUANTIZE_H

#include <string.h>

#include "config.h"
#include "formats.h"
#include "nvfp4.h"
#include "quantize.h"
#include "status.h"
#include "tensor.h"

MXS_EXTERN_C_BEGIN

/* ---- engine (private) ---------------------------------------------------- */

typedef struct mxs__nvfp4_job {
    int64_t rows, cols;
    unsigned planes; /* MXS_ROWWISE | MXS_COLWISE */
    int block;       /* mxs_nvfp4_block */
    const void *src;
    mxs_dtype src_dtype, round_through;
    float s_enc;
    mxs_scale_geom geom[2]; /* [0] row-wise, [1] column-wise */
    uint8_t *data[2], *scale[2];
} mxs__nvfp4_job;

/* Global amax of n source elements: maxNum of |x| over the (rounded-through)
 * values, NaN ignored, 0 when there is none (docs/contract.md section 9.4). */
MXS_PRIVATE float mxs__nvfp4_host_amax(const void *src, mxs_dtype dtype, int64_t n, mxs_dtype rt) {
    float buf[256], amax = 0.0f;
    int64_t i, k;
    for (i = 0; i < n; i += 256) {
        int64_t m = n - i < 256 ? n - i : 256;
        mxs__host_load(buf, src, dtype, i, m, rt);
        for (k = 0; k < m; k++) amax = mxs_amax_step(amax, buf[k]);
    }
    return amax;
}

/* Casts n values x[0], x[stride], ... with multiplier e into nibbles
 * idx, idx+1, ... of a packed plane: whole bytes where two nibbles of the run
 * share one, a read-modify-write only at an odd start or end. */
MXS_PRIVATE void mxs__nvfp4_cast_run(uint8_t *data, int64_t idx, const float *x, int64_t stride, int64_t n, float e) {
    int64_t k = 0;
    if ((idx & 1) && n > 0) {
        mxs_nvfp4_put(data, idx, mxs_nvfp4_quantize_elem(x[0], e));
        k = 1;
    }
    for (; k + 1 < n; k += 2) data[(idx + k) >> 1] = mxs_e2m1x2_from_f32(x[k * stride] * e, x[(k + 1) * stride] * e);
    if (k < n) mxs_nvfp4_put(data, idx + k, mxs_nvfp4_quantize_elem(x[k * stride], e));
}

/* amax of n values x[0], x[stride], ... (maxNum, NaN ignored). */
MXS_PRIVATE float mxs__nvfp4_amax_run(const float *x, int64_t stride, int64_t n) {
    float amax = 0.0f;
    int64_t k;
    for (k = 0; k < n; k++) amax = mxs_amax_step(amax, x[k * stride]);
    return amax;
}

/* Tile (row tile g, column tile t): rows 16g.., cols 16t.. */
MXS_PRIVATE void mxs__nvfp4_host_tile(const mxs__nvfp4_job *job, int64_t g, int64_t t) {
    float x[MXS_NVFP4_BLOCK][MXS_NVFP4_BLOCK];
    const int64_t r0 = g * MXS_NVFP4_BLOCK, c0 = t * MXS_NVFP4_BLOCK;
    const int64_t nr = job->rows - r0 < MXS_NVFP4_BLOCK ? job->rows - r0 : MXS_NVFP4_BLOCK;
    const int64_t nc = job->cols - c0 < MXS_NVFP4_BLOCK ? job->cols - c0 : MXS_NVFP4_BLOCK;
    const int two_d = job->block == MXS_NVFP4_16X16;
    uint8_t tile_scale = 0;
    float tile_e = 0.0f;
    int64_t i, j;

    for (i = 0; i < nr; i++) {
        mxs__host_load(x[i], job->src, job->src_dtype, (r0 + i) * job->cols + c0, nc, job->round_through);
        for (j = nc; j < MXS_NVFP4_BLOCK; j++) x[i][j] = 0.0f;
    }
    if (two_d) { /* one scale for the tile: the amax over its nr x nc elements */
        float amax = 0.0f;
        for (i = 0; i < nr; i++) amax = mxs_amax_step(amax, mxs__nvfp4_amax_run(x[i], 1, nc));
        tile_scale = mxs_nvfp4_block_scale(amax, job->s_enc);
        tile_e = mxs_nvfp4_encode_mult(tile_scale, job->s_enc);
    }
    if (job->planes & MXS_ROWWISE) { /* 1x16 blocks: tile row i is one block */
        for (i = 0; i < nr; i++) {
            uint8_t sc = two_d ? tile_scale : mxs_nvfp4_block_scale(mxs__nvfp4_amax_run(x[i], 1, nc), job->s_enc);
            float e = two_d ? tile_e : mxs_nvfp4_encode_mult(sc, job->s_enc);
            job->scale[0][mxs_scale_geom_offset(&job->geom[0], r0 + i, t)] = sc;
            mxs__nvfp4_cast_run(job->data[0], (r0 + i) * job->cols + c0, x[i], 1, nc, e);
        }
    }
    if (job->planes & MXS_COLWISE) { /* 16x1 blocks: tile column j is one block of the transpose */
        for (j = 0; j < nc; j++) {
            uint8_t sc = two_d ? tile_scale
                               : mxs_nvfp4_block_scale(mxs__nvfp4_amax_run(&x[0][j], MXS_NVFP4_BLOCK, nr), job->s_enc);
            float e = two_d ? tile_e : mxs_nvfp4_encode_mult(sc, job->s_enc);
            job->scale[1][mxs_scale_geom_offset(&job->geom[1], c0 + j, g)] = sc;
            mxs__nvfp4_cast_run(job->data[1], (c0 + j) * job->rows + r0, &x[0][j], MXS_NVFP4_BLOCK, nr, e);
        }
    }
}

/* Quantizes the validated tensor with the global amax `amax`: scales (padding
 * 0x00), packed data (the spare nibble 0), *dst->amax = amax. */
MXS_PRIVATE void mxs__nvfp4_host_quantize_with(mxs_nvfp4_tensor *dst, const void *src, mxs_dtype src_dtype,
                                               mxs_dtype round_through, float amax) {
    mxs__nvfp4_job job;
    int64_t elems = dst->rows * dst->cols, g, t, gr, tc;
    int p;
    memset(&job, 0, sizeof job);
    job.rows = dst->rows;
    job.cols = dst->cols;
    job.planes = dst->dirs;
    job.block = (int)dst->block;
    job.src = src;
    job.src_dtype = src_dtype;
    job.round_through = round_through;
    job.s_enc = mxs_nvfp4_global_encode(amax);
    job.data[0] = dst->row_data;
    job.data[1] = dst->col_data;
    job.scale[0] = dst->row_scale;
    job.scale[1] = dst->col_scale;
    for (p = 0; p < 2; p++) {
        if (!(dst->dirs & (unsigned)(p + 1))) continue;
        mxs_nvfp4_scale_geom_make(dst->rows, dst->cols, (mxs_dirs)(p + 1), dst->scale_layout, &job.geom[p]);
        if (dst->scale_layout != MXS_SCALES_COMPACT) /* padding entries are 0x00 */
            memset(job.scale[p], 0, (size_t)mxs_scale_geom_bytes(&job.geom[p]));
    }
    gr = mxs_ceil_div(dst->rows, MXS_NVFP4_BLOCK);
    tc = mxs_ceil_div(dst->cols, MXS_NVFP4_BLOCK);
    for (g = 0; g < gr; g++)
        for (t = 0; t < tc; t++) mxs__nvfp4_host_tile(&job, g, t);
    for (p = 0; p < 2; p++)
        if ((dst->dirs & (unsigned)(p + 1)) && (elems & 1)) job.data[p][elems >> 1] &= 0x0Fu; /* spare nibble */
    *dst->amax = amax;
}

/* ---- public API ---------------------------------------------------------- */

/* Validates an NVFP4 quantize request (shared by the host and CUDA paths):
 * the arguments, the tensor (mxs_nvfp4_tensor_check) and the buffers. Every
 * output dst names - each data plane (mxs_nvfp4_data_bytes), each scale plane
 * (mxs_nvfp4_scale_bytes) and the 4-byte amax - must not overlap `src`
 * (rows*cols elements of src_dtype) nor another output: MXS_ERR_ALIASING.
 * Pointers are compared, never dereferenced. */
MXS_NODISCARD MXS_API mxs_status mxs_nvfp4_quantize_check(const mxs_nvfp4_tensor *dst, const void *src,
                                                          mxs_dtype src_dtype, mxs_dtype round_through) {
    const void *out[5] = {NULL, NULL, NULL, NULL, NULL};
    int64_t bytes[5] = {0, 0, 0, 0, 0}, elems, src_bytes;
    int n = 0, p;
    mxs_status s;
    if (!dst || !src || !mxs_dtype_valid((int)src_dtype) || !mxs_dtype_valid((int)round_through))
        return MXS_ERR_INVALID_ARGUMENT;
    if ((s = mxs_nvfp4_tensor_check(dst)) != MXS_OK) return s;
    elems = dst->rows * dst->cols;
    if (!mxs_mul_ok(elems, mxs_dtype_bytes(src_dtype), &src_bytes)) return MXS_ERR_OVERFLOW;
    for (p = MXS_ROWWISE; p <= MXS_COLWISE; p++) {
        if (!(dst->dirs & (unsigned)p)) continue;
        out[n] = p == MXS_ROWWISE ? dst->row_data : dst->col_data;
        bytes[n++] = mxs_nvfp4_data_bytes(dst);
        out[n] = p == MXS_ROWWISE ? dst->row_scale : dst->col_scale;
        bytes[n++] = mxs_nvfp4_scale_bytes(dst, (mxs_dirs)p);
    }
    out[n] = dst->amax;
    bytes[n++] = (int64_t)sizeof(float);
    return mxs__outputs_disjoint(out, bytes, n, src, src_bytes);
}

/* Quantizes the whole rows x cols `src` into exactly the planes dst->dirs
 * names (docs/contract.md section 9): global amax of the (rounded-through)
 * source -> S_enc -> E4M3 block scales (1x16, or 16x16 tiles repeated over
 * their rows) -> E2M1 elements; writes *dst->amax. Validates everything
 * first (mxs_nvfp4_quantize_check): MXS_ERR_INVALID_ARGUMENT (NULL
 * dst/src/amax, bad dtype/round_through/dirs/layout/block), MXS_ERR_SHAPE,
 * MXS_ERR_OVERFLOW, MXS_ERR_ABSENT_PLANE, MXS_ERR_ALIASING; a rejected call
 * writes nothing. Padding scale entries are 0x00; when rows*cols is odd the
 * high nibble of each plane's last byte is 0. */
MXS_NODISCARD MXS_API mxs_status mxs_host_nvfp4_quantize(mxs_nvfp4_tensor *dst, const void *src, mxs_dtype src_dtype,
                                                         mxs_dtype round_through) {
    mxs_status s = mxs_nvfp4_quantize_check(dst, src, src_dtype, round_through);
    if (s != MXS_OK) return s;
    mxs__nvfp4_host_quantize_with(dst, src, src_dtype, round_through,
                                  mxs__nvfp4_host_amax(src, src_dtype, dst->rows * dst->cols, round_through));
    return MXS_OK;
}

/* Validates a dequantize request (shared by the host and CUDA paths) and
 * returns the plane's data/scale pointers and scale geometry. dst (rows*cols
 * elements of dst_dtype) must not overlap what it reads: the data plane, the
 * scale plane or the amax (MXS_ERR_ALIASING). A NULL amax is
 * MXS_ERR_INVALID_ARGUMENT; a plane t lacks, MXS_ERR_ABSENT_PLANE. */
MXS_NODISCARD MXS_API mxs_status mxs_nvfp4_dequantize_check(const mxs_nvfp4_tensor *t, mxs_dirs plane, const void *dst,
                                                            mxs_dtype dst_dtype, const uint8_t **data,
                                                            const uint8_t **scale, mxs_scale_geom *g) {
    int64_t elems, dst_bytes;
    mxs_status s;
    if (!t || !dst || !data || !scale || !g || !mxs_dtype_valid((int)dst_dtype) || !mxs_plane_valid((int)plane))
        return MXS_ERR_INVALID_ARGUMENT;
    if ((s = mxs_nvfp4_tensor_check_shape(t)) != MXS_OK) return s;
    if (!t->amax) return MXS_ERR_INVALID_ARGUMENT;
    if (!(t->dirs & (unsigned)plane)) return MXS_ERR_ABSENT_PLANE;
    *data = plane == MXS_ROWWISE ? t->row_data : t->col_data;
    *scale = plane == MXS_ROWWISE ? t->row_scale : t->col_scale;
    if (!*data || !*scale) return MXS_ERR_ABSENT_PLANE;
    elems = t->rows * t->cols;
    if (!mxs_mul_ok(elems, mxs_dtype_bytes(dst_dtype), &dst_bytes)) return MXS_ERR_OVERFLOW;
    mxs_nvfp4_scale_geom_make(t->rows, t->cols, plane, t->scale_layout, g);
    if (mxs__overlap(dst, dst_bytes, *data, mxs_nvfp4_data_plane_bytes(t->rows, t->cols)) ||
        mxs__overlap(dst, dst_bytes, *scale, mxs_scale_geom_bytes(g)) ||
        mxs__overlap(dst, dst_bytes, t->amax, (int64_t)sizeof(float)))
        return MXS_ERR_ALIASING;
    return MXS_OK;
}

/* Dequantizes one plane of t into dst, the rows x cols weight in row-major
 * order (the column-wise plane is transposed back), as f32 or bf16/f16
 * rounded to nearest even: x' = fl32(e2m1_to_f32(q) * fl32(fl32(d * amax) *
 * fl32(1/2688))) with d the block's E4M3 scale and amax = *t->amax (TE's
 * dequantize). Scales are read in t's layout. */
MXS_NODISCARD MXS_API mxs_status mxs_host_nvfp4_dequantize(const mxs_nvfp4_tensor *t, mxs_dirs plane, void *dst,
                                                           mxs_dtype dst_dtype) {
    mxs_scale_geom g;
    const uint8_t *data, *scale;
    int64_t r, c;
    float amax;
    mxs_status s = mxs_nvfp4_dequantize_check(t, plane, dst, dst_dtype, &data, &scale, &g);
    if (s != MXS_OK) return s;
    amax = *t->amax;
    for (r = 0; r < t->rows; r++) {
        for (c = 0; c < t->cols; c++) {
            int64_t i = r * t->cols + c;
            uint8_t sc =
                scale[mxs_scale_geom_offset(&g, mxs_nvfp4_scale_m(plane, r, c), mxs_nvfp4_scale_k(plane, r, c))];
            uint8_t q = mxs_nvfp4_get(data, mxs_nvfp4_data_index(t->rows, t->cols, plane, r, c));
            float v = mxs_nvfp4_dequantize_elem(q, mxs_nvfp4_decode_mult(sc, amax));
            mxs__store_elem(dst, dst_dtype, i, v);
        }
    }
    return MXS_OK;
}

/* Validates a scale-conversion request (shared by the host and CUDA paths)
 * and returns both geometries: plane and layouts valid, rows, cols >= 1, no
 * overflow, src and dst not overlapping (MXS_ERR_ALIASING). */
MXS_NODISCARD MXS_API mxs_status mxs_nvfp4_convert_scales_check(int64_t rows, int64_t cols, mxs_dirs plane,
                                                                mxs_scale_layout from, const uint8_t *src,
                                                                mxs_scale_layout to, const uint8_t *dst,
                                                                mxs_scale_geom *gs, mxs_scale_geom *gd) {
    int64_t outer, inner;
    mxs_status s;
    if (!src || !dst || !gs || !gd || !mxs_plane_valid((int)plane) || !mxs_layout_valid((int)from) ||
        !mxs_layout_valid((int)to))
        return MXS_ERR_INVALID_ARGUMENT;
    if ((s = mxs_nvfp4_scale_shape(rows, cols, plane, from, &outer, &inner)) != MXS_OK) return s;
    mxs_nvfp4_scale_geom_make(rows, cols, plane, from, gs);
    mxs_nvfp4_scale_geom_make(rows, cols, plane, to, gd);
    if (mxs__overlap(src, mxs_scale_geom_bytes(gs), dst, mxs_scale_geom_bytes(gd))) return MXS_ERR_ALIASING;
    return MXS_OK;
}

/* Converts one NVFP4 scale plane of a rows x cols tensor from layout `from`
 * (src) to layout `to` (dst). Every dst byte is written once: logical
 * entries are copied, padding entries become 0x00 (source padding is
 * ignored). */
MXS_NODISCARD MXS_API mxs_status mxs_host_nvfp4_convert_scales(int64_t rows, int64_t cols, mxs_dirs plane,
                                                               mxs_scale_layout from, const uint8_t *src,
                                                               mxs_scale_layout to, uint8_t *dst) {
    mxs_scale_geom gs, gd;
    mxs_status s = mxs_nvfp4_convert_scales_check(rows, cols, plane, from, src, to, dst, &gs, &gd);
    if (s != MXS_OK) return s;
    mxs__convert_scales_with(&gs, src, &gd, dst);
    return MXS_OK;
}

MXS_EXTERN_C_END

#endif /* MXSHARD_NVFP4_QUANTIZE_H */
