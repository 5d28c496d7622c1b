/* SPDX-License-Identifier: MIT */
/* tests/cpu/nvfp4_ref.h - a NAIVE NVFP4 reference written straight from
 * docs/contract.md section 9, for the nvfp4 tests: E2M1 by nearest-value
 * search, the global encode scale, block scales and multipliers, the scale
 * offsets of every layout, and one whole plane quantized block by block. It
 * shares nothing with the library beyond the scalar conversions of formats.h
 * (pinned by the oracle vectors) and common.h's ref_load / ref_rup.
 */
#ifndef MXSHARD_TESTS_CPU_NVFP4_REF_H
#define MXSHARD_TESTS_CPU_NVFP4_REF_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include <mxshard/mxshard.h>
#include <mxshard/nvfp4_quantize.h>

#include "common.h"

/* ---- naive reference (docs/contract.md section 9, written out) ----------- */

/* E2M1 by nearest-value search over the 8 magnitudes, ties to the even code
 * (the even mantissa), saturating beyond 6; NaN -> 0x7. */
static inline uint8_t ref_e2m1(float x) {
    static const double mag[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
    double a = fabs((double)x);
    int k, best = 0;
    if (isnan(x)) return 0x7;
    if (a >= 6.0) {
        best = 7;
    } else {
        for (k = 1; k < 8; k++) {
            double db = fabs(a - mag[best]), dk = fabs(a - mag[k]);
            if (dk < db || (dk == db && (k & 1) == 0)) best = k;
        }
    }
    return (uint8_t)(best | (signbit(x) ? 8 : 0));
}

static inline float ref_s_enc(float amax) { return amax > 0 ? fminf(2688.0f / fmaxf(amax, FLT_MIN), FLT_MAX) : 1.0f; }
static inline uint8_t ref_scale(float bamax, float s_enc) {
    return mxs_e4m3_from_f32(fminf(bamax * (s_enc * (1.0f / 6.0f)), FLT_MAX));
}
static inline float ref_e(uint8_t sc, float s_enc) {
    float d = mxs_e4m3_to_f32(sc);
    return d > 0 ? fminf(1.0f / (d * (1.0f / s_enc)), FLT_MAX) : FLT_MAX;
}

static inline float ref_value(const void *src, mxs_dtype dtype, mxs_dtype rt, int64_t i) {
    float x = ref_load(src, dtype, i);
    if (rt == MXS_BF16) return mxs_bf16_to_f32(mxs_bf16_from_f32(x));
    if (rt == MXS_F16) return mxs_f16_to_f32(mxs_f16_from_f32(x));
    return x;
}

static inline int64_t ref_cdiv16(int64_t a) { return (a + 15) / 16; }

/* Scale plane of `plane`: M x K with K = ceil(.../16); offsets of contract 9.5. */
static inline void ref_mk4(int64_t rows, int64_t cols, int plane, int64_t *M, int64_t *K) {
    *M = plane == MXS_ROWWISE ? rows : cols;
    *K = ref_cdiv16(plane == MXS_ROWWISE ? cols : rows);
}
static inline int64_t ref_sbytes(int64_t rows, int64_t cols, int plane, int layout) {
    int64_t M, K;
    ref_mk4(rows, cols, plane, &M, &K);
    return layout == MXS_SCALES_COMPACT ? M * K : ref_rup(M, 128) * ref_rup(K, 4);
}
static inline int64_t ref_soff(int64_t rows, int64_t cols, int plane, int layout, int64_t m, int64_t k) {
    int64_t M, K, Kp;
    ref_mk4(rows, cols, plane, &M, &K);
    Kp = ref_rup(K, 4);
    if (layout == MXS_SCALES_COMPACT) return m * K + k;
    if (layout == MXS_SCALES_PADDED) return m * Kp + k;
    return ((m / 128) * (Kp / 4) + (k / 4)) * 512 + (m % 32) * 16 + ((m % 128) / 32) * 4 + (k % 4);
}

/* Amax over rows [r0, r1) x cols [c0, c1) (clipped), NaN ignored. */
static inline float ref_amax_rect(int64_t rows, int64_t cols, const void *src, mxs_dtype dt, mxs_dtype rt, int64_t r0,
                                  int64_t r1, int64_t c0, int64_t c1) {
    float amax = 0.0f;
    int64_t r, c;
    if (r1 > rows) r1 = rows;
    if (c1 > cols) c1 = cols;
    for (r = r0; r < r1; r++)
        for (c = c0; c < c1; c++) {
            float x = ref_value(src, dt, rt, r * cols + c);
            if (!isnan(x) && fabsf(x) > amax) amax = fabsf(x);
        }
    return amax;
}

/* One plane: data (packed from a zeroed buffer) and scales (padding 0). */
static inline void ref_plane(int64_t rows, int64_t cols, const void *src, mxs_dtype dt, mxs_dtype rt, int plane,
                             int block, int layout, float s_enc, uint8_t *data, uint8_t *scale) {
    int64_t M, K, m, k, t;
    ref_mk4(rows, cols, plane, &M, &K);
    memset(data, 0, (size_t)((rows * cols + 1) / 2));
    memset(scale, 0, (size_t)ref_sbytes(rows, cols, plane, layout));
    for (m = 0; m < M; m++) {
        for (k = 0; k < K; k++) {
            float amax;
            uint8_t sc;
            float e;
            int64_t n = (plane == MXS_ROWWISE ? cols : rows) - 16 * k;
            if (n > 16) n = 16;
            if (block == MXS_NVFP4_16X16) { /* the tile of entry (m, k) */
                int64_t tr = plane == MXS_ROWWISE ? m / 16 : k, tc = plane == MXS_ROWWISE ? k : m / 16;
                amax = ref_amax_rect(rows, cols, src, dt, rt, 16 * tr, 16 * tr + 16, 16 * tc, 16 * tc + 16);
            } else if (plane == MXS_ROWWISE) {
                amax = ref_amax_rect(rows, cols, src, dt, rt, m, m + 1, 16 * k, 16 * k + 16);
            } else {
                amax = ref_amax_rect(rows, cols, src, dt, rt, 16 * k, 16 * k + 16, m, m + 1);
            }
            sc = ref_scale(amax, s_enc);
            e = ref_e(sc, s_enc);
            scale[ref_soff(rows, cols, plane, layout, m, k)] = sc;
            for (t = 0; t < n; t++) {
                /* plane element (m, 16k+t): weight (m, 16k+t) row-wise, (16k+t, m) column-wise */
                int64_t r = plane == MXS_ROWWISE ? m : 16 * k + t, c = plane == MXS_ROWWISE ? 16 * k + t : m;
                int64_t j = plane == MXS_ROWWISE ? r * cols + c : c * rows + r;
                uint8_t q = ref_e2m1(ref_value(src, dt, rt, r * cols + c) * e);
                data[j / 2] = (uint8_t)(data[j / 2] | (q << (4 * (j % 2))));
            }
        }
    }
}

/* bam[r*cols + c] = the amax of the block (of `plane` and `block`) that holds
 * weight element (r, c): one pass per block. */
static inline void ref_block_amax_map(int64_t rows, int64_t cols, const void *src, mxs_dtype dt, mxs_dtype rt,
                                      int plane, int block, float *bam) {
    int64_t r0, c0, r, c;
    int64_t h = block == MXS_NVFP4_16X16 || plane == MXS_COLWISE ? 16 : 1;
    int64_t w = block == MXS_NVFP4_16X16 || plane == MXS_ROWWISE ? 16 : 1;
    for (r0 = 0; r0 < rows; r0 += h)
        for (c0 = 0; c0 < cols; c0 += w) {
            float a = ref_amax_rect(rows, cols, src, dt, rt, r0, r0 + h, c0, c0 + w);
            for (r = r0; r < r0 + h && r < rows; r++)
                for (c = c0; c < c0 + w && c < cols; c++) bam[r * cols + c] = a;
        }
}

static inline float ref_global_amax(int64_t n, const void *src, mxs_dtype dt, mxs_dtype rt) {
    return ref_amax_rect(1, n, src, dt, rt, 0, 1, 0, n);
}

#endif /* MXSHARD_TESTS_CPU_NVFP4_REF_H */
