/* SPDX-License-Identifier: MIT */
/* tests/cpu/common.h - helpers shared by the cpu suite: a seeded RNG,
 * poisoned buffers with guard bytes, test data with a wide exponent spread,
 * and a NAIVE reference quantizer written straight from docs/contract.md sections 1-2.
 *
 * The reference deliberately shares nothing with the library beyond the
 * scalar conversions of formats.h (which the oracle vectors pin down):
 * its block amax, multiplier, dequant factor and scale offsets are written
 * out per element from the formulas of docs/contract.md, so a bug in the library's tile
 * engine or in tensor.h's layout code cannot hide behind itself.
 *
 * Self-contained and static inline: any test file may include it.
 */
#ifndef MXSHARD_TESTS_CPU_COMMON_H
#define MXSHARD_TESTS_CPU_COMMON_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <mxshard/mxshard.h>

/* ---- RNG: splitmix64, seeded per test so failures reproduce ------------- */

typedef struct t_rng {
    uint64_t state;
} t_rng;

static inline t_rng t_rng_seed(uint64_t seed) {
    t_rng r;
    r.state = seed * 0x9E3779B97F4A7C15ull + 0x1234567ull;
    return r;
}

static inline uint64_t t_next(t_rng *r) {
    uint64_t z = (r->state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [0, n), n >= 1. */
static inline int64_t t_below(t_rng *r, int64_t n) { return (int64_t)(t_next(r) % (uint64_t)n); }
/* Uniform in [lo, hi]. */
static inline int64_t t_between(t_rng *r, int64_t lo, int64_t hi) { return lo + t_below(r, hi - lo + 1); }

/* A random dimension: small, around a multiple of 32, or 1 - the shapes
 * where edge blocks and padding go wrong. */
static inline int64_t t_rand_dim(t_rng *r, int64_t max) {
    int64_t d;
    switch (t_below(r, 5)) {
    case 0: d = 1; break;
    case 1: d = t_between(r, 1, 40); break;
    case 2: d = 32 * t_between(r, 1, 8) + t_between(r, -1, 1); break;
    case 3: d = 128 * t_between(r, 1, 3) + t_between(r, -2, 2); break;
    default: d = t_between(r, 1, max); break;
    }
    if (d < 1) d = 1;
    return d > max ? max : d;
}

/* ---- poisoned buffers with guard bytes --------------------------------- */

#define T_POISON 0xA5u
#define T_GUARD 64

/* n usable bytes followed by T_GUARD guard bytes, all set to T_POISON. */
static inline uint8_t *t_alloc(size_t n) {
    uint8_t *p = (uint8_t *)malloc(n + T_GUARD);
    if (p) memset(p, T_POISON, n + T_GUARD);
    return p;
}

static inline void t_poison(uint8_t *p, size_t n) { memset(p, T_POISON, n + T_GUARD); }

/* 1 when the guard bytes after p[0..n) are intact. */
static inline int t_guard_ok(const uint8_t *p, size_t n) {
    size_t k;
    for (k = 0; k < T_GUARD; k++)
        if (p[n + k] != T_POISON) return 0;
    return 1;
}

/* 1 when p[0..n) and its guard are all still T_POISON. */
static inline int t_all_poisoned(const uint8_t *p, size_t n) {
    size_t k;
    for (k = 0; k < n + T_GUARD; k++)
        if (p[k] != T_POISON) return 0;
    return 1;
}

/* Index of the first differing byte, or -1. */
static inline int64_t t_first_diff(const uint8_t *a, const uint8_t *b, size_t n) {
    size_t k;
    for (k = 0; k < n; k++)
        if (a[k] != b[k]) return (int64_t)k;
    return -1;
}

/* ---- test data ---------------------------------------------------------- */

/* One f32 with a wide exponent spread around 2^center: mostly normal
 * numbers within +-24 binades, plus zeros, subnormals, infinities, NaNs,
 * very large and very small values. */
static inline float t_rand_f32(t_rng *r, int center) {
    uint32_t sign = (uint32_t)(t_next(r) & 1u) << 31;
    uint32_t mant = (uint32_t)(t_next(r) & 0x7FFFFFu);
    int64_t kind = t_below(r, 100);
    int64_t e;
    if (kind == 0) return mxs_f32_from_bits(sign | 0x7FC00000u | (mant & 0x3FFFFFu)); /* NaN */
    if (kind == 1) return mxs_f32_from_bits(sign | 0x7F800000u);                      /* inf */
    if (kind < 4) return mxs_f32_from_bits(sign);                                     /* +-0 */
    if (kind < 6) return mxs_f32_from_bits(sign | (mant ? mant : 1u));                /* subnormal */
    if (kind < 8)
        e = t_between(r, 1, 254); /* anywhere */
    else
        e = 127 + center + t_between(r, -24, 24);
    if (e < 1) e = 1;
    if (e > 254) e = 254;
    return mxs_f32_from_bits(sign | ((uint32_t)e << 23) | mant);
}

/* Fills n source elements of `dtype`. bf16 keeps the high half of a random
 * f32 (all its specials survive); f16 gets raw codes with a wide exponent
 * spread incl. subnormals, infinities and NaNs. Some whole 32-element runs
 * are NaN, zero, or tiny, to hit all-NaN / empty-amax blocks. */
static inline void t_fill(t_rng *r, void *src, mxs_dtype dtype, int64_t n) {
    int center = (int)t_between(r, -60, 60);
    int64_t i;
    for (i = 0; i < n; i++) {
        int64_t special = (i % 32 == 0) ? t_below(r, 40) : -1;
        float v;
        if (special == 0 || special == 1) {
            /* a run of 32 NaNs or 32 (signed) zeros, fewer at the end */
            int64_t k;
            for (k = 0; k < 32 && i < n; k++, i++) {
                uint32_t z = (uint32_t)(t_next(r) & 1u) << 31;
                if (dtype == MXS_F32)
                    ((float *)src)[i] = mxs_f32_from_bits(special ? z : 0x7FC00001u);
                else if (dtype == MXS_BF16)
                    ((uint16_t *)src)[i] = (uint16_t)(special ? z >> 16 : 0xFFC1u);
                else
                    ((uint16_t *)src)[i] = (uint16_t)(special ? z >> 16 : 0x7E01u);
            }
            i--;
            continue;
        }
        if (dtype == MXS_F16) {
            uint16_t sign = (uint16_t)((t_next(r) & 1u) << 15);
            uint16_t mant = (uint16_t)(t_next(r) & 0x3FFu);
            int64_t kind = t_below(r, 100);
            uint16_t e = (uint16_t)(kind < 3 ? 31 : (kind < 8 ? 0 : t_between(r, 1, 30)));
            ((uint16_t *)src)[i] = (uint16_t)(sign | (e << 10) | mant);
            continue;
        }
        v = t_rand_f32(r, center);
        if (dtype == MXS_F32)
            ((float *)src)[i] = v;
        else
            ((uint16_t *)src)[i] = (uint16_t)(mxs_f32_bits(v) >> 16);
    }
}

/* ---- naive reference (docs/contract.md sections 1 and 2, written out directly) ------ */

static inline float ref_load(const void *src, mxs_dtype dtype, int64_t i) {
    if (dtype == MXS_BF16) return mxs_bf16_to_f32(((const uint16_t *)src)[i]);
    if (dtype == MXS_F16) return mxs_f16_to_f32(((const uint16_t *)src)[i]);
    return ((const float *)src)[i];
}

/* docs/contract.md section 1: e = e8m0_up(fl32(amax * fl32(1/448))) or
 * clamp(e8m0_down(amax) - 8, 0, 254). */
static inline uint8_t ref_exponent(float amax, mxs_rounding r) {
    if (r == MXS_ROUND_CEIL) {
        volatile float recip = 1.0f / 448.0f; /* fl32(1/448) */
        float v = amax * recip;
        return mxs_e8m0_up(v);
    } else {
        int d = (int)mxs_e8m0_down(amax) - 8;
        return (uint8_t)(d < 0 ? 0 : (d > 254 ? 254 : d));
    }
}

/* s = 2^(127-e) (2^-127 is an exact f32 subnormal); NaN for e = 255. */
static inline float ref_mult(uint8_t e) { return e == 255 ? NAN : ldexpf(1.0f, 127 - (int)e); }

/* 2^(e-127); NaN for e = 255. */
static inline float ref_scale_value(uint8_t e) { return e == 255 ? NAN : ldexpf(1.0f, (int)e - 127); }

static inline int64_t ref_cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
static inline int64_t ref_rup(int64_t a, int64_t b) { return ref_cdiv(a, b) * b; }

/* The S[M][K] view of docs/contract.md section 2. */
static inline void ref_mk(int64_t rows, int64_t cols, int plane, int64_t *M, int64_t *K) {
    *M = plane == MXS_ROWWISE ? rows : cols;
    *K = ref_cdiv(plane == MXS_ROWWISE ? cols : rows, 32);
}

/* docs/contract.md section 2 table: bytes of a scale plane. */
static inline int64_t ref_scale_bytes(int64_t rows, int64_t cols, int plane, int layout) {
    int64_t M, K;
    ref_mk(rows, cols, plane, &M, &K);
    if (layout == MXS_SCALES_COMPACT) return M * K;
    return ref_rup(M, 128) * ref_rup(K, 4);
}

/* docs/contract.md section 2: byte of entry (m, k). Compact / padded planes are the
 * table's row-major matrices (column-wise ones are ceil(rows/32) x cols, so
 * entry (m=c, k=i) sits at i*cols + c); swizzled is the literal formula. */
static inline int64_t ref_scale_offset(int64_t rows, int64_t cols, int plane, int layout, int64_t m, int64_t k) {
    int64_t M, K, Mp, Kp;
    ref_mk(rows, cols, plane, &M, &K);
    Mp = ref_rup(M, 128);
    Kp = ref_rup(K, 4);
    if (layout == MXS_SCALES_COMPACT) return plane == MXS_ROWWISE ? m * K + k : k * M + m;
    if (layout == MXS_SCALES_PADDED) return plane == MXS_ROWWISE ? m * Kp + k : k * Mp + m;
    return ((m / 128) * (Kp / 4) + (k / 4)) * 512 + (m % 32) * 16 + ((m % 128) / 32) * 4 + (k % 4);
}

/* Quantizes one plane of a rows x cols source, one block at a time, per
 * element: data gets rows*cols bytes, scale gets ref_scale_bytes bytes
 * (padding 0x00). */
static inline void ref_quantize_plane(int64_t rows, int64_t cols, const void *src, mxs_dtype dtype,
                                      mxs_rounding rounding, int plane, int layout, uint8_t *data, uint8_t *scale) {
    int64_t M, K, m, k, t;
    ref_mk(rows, cols, plane, &M, &K);
    memset(scale, 0, (size_t)ref_scale_bytes(rows, cols, plane, layout));
    for (m = 0; m < M; m++) {
        for (k = 0; k < K; k++) {
            /* block elements: row m, cols 32k.. (row-wise) or col m, rows 32k.. */
            int64_t n = (plane == MXS_ROWWISE ? cols : rows) - 32 * k;
            float amax = 0.0f, s;
            uint8_t e;
            if (n > 32) n = 32;
            for (t = 0; t < n; t++) {
                int64_t i = plane == MXS_ROWWISE ? m * cols + 32 * k + t : (32 * k + t) * cols + m;
                float x = ref_load(src, dtype, i);
                if (!isnan(x) && fabsf(x) > amax) amax = fabsf(x);
            }
            e = ref_exponent(amax, rounding);
            scale[ref_scale_offset(rows, cols, plane, layout, m, k)] = e;
            s = ref_mult(e);
            for (t = 0; t < n; t++) {
                int64_t i = plane == MXS_ROWWISE ? m * cols + 32 * k + t : (32 * k + t) * cols + m;
                data[i] = mxs_e4m3_from_f32(ref_load(src, dtype, i) * s);
            }
        }
    }
}

/* Dequantizes one plane: dst[i] = e4m3_to_f32(q) * 2^(e-127) as f32, then
 * rounded to the destination dtype. */
static inline void ref_dequantize_plane(int64_t rows, int64_t cols, int plane, int layout, const uint8_t *data,
                                        const uint8_t *scale, void *dst, mxs_dtype dtype) {
    int64_t r, c;
    for (r = 0; r < rows; r++) {
        for (c = 0; c < cols; c++) {
            int64_t m = plane == MXS_ROWWISE ? r : c, k = (plane == MXS_ROWWISE ? c : r) / 32;
            uint8_t e = scale[ref_scale_offset(rows, cols, plane, layout, m, k)];
            float v = mxs_e4m3_to_f32(data[r * cols + c]) * ref_scale_value(e);
            int64_t i = r * cols + c;
            if (dtype == MXS_F32)
                ((float *)dst)[i] = v;
            else if (dtype == MXS_BF16)
                ((uint16_t *)dst)[i] = mxs_bf16_from_f32(v);
            else
                ((uint16_t *)dst)[i] = mxs_f16_from_f32(v);
        }
    }
}

/* Compares two arrays of dtype values, NaN equal to any NaN; returns the
 * first differing index or -1. */
static inline int64_t t_first_value_diff(const void *a, const void *b, mxs_dtype dtype, int64_t n) {
    int64_t i;
    for (i = 0; i < n; i++) {
        float x = ref_load(a, dtype, i), y = ref_load(b, dtype, i);
        if (isnan(x) && isnan(y)) continue;
        if (dtype == MXS_F32 ? mxs_f32_bits(x) != mxs_f32_bits(y)
                             : ((const uint16_t *)a)[i] != ((const uint16_t *)b)[i])
            return i;
    }
    return -1;
}

#endif /* MXSHARD_TESTS_CPU_COMMON_H */
