/* SPDX-License-Identifier: MIT */
/* docs/contract.md section 9: NVFP4. The E2M1 oracle vectors (every line),
 * the E2M1 decode and packing order, the scale formulas on hand-computed
 * cases, and whole-tensor quantize / dequantize / scale-layout conversion
 * against a naive reference written here from the contract's formulas, over
 * random shapes (1-element dims, non-multiples of 16), every plane set, both
 * block shapes, every layout, every source dtype and round-through. Every
 * output is poisoned and followed by guard bytes; rejected calls must leave
 * every output poisoned. */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mxshard/mxshard.h>
#include <mxshard/nvfp4_quantize.h>

#include "common.h"

static FILE *open_vectors(const char *name) {
    char path[1024];
    const char *dir = getenv("MXS_VECTORS_DIR");
    snprintf(path, sizeof path, "%s/%s", dir ? dir : MXS_VECTORS_DIR, name);
    return fopen(path, "r");
}

/* ---- naive reference (docs/contract.md section 9, written out) ----------- */

/* E2M1 by nearest-value search over the 8 magnitudes, ties to the even code
 * (the even mantissa), saturating beyond 6; NaN -> 0x7. */
static uint8_t ref_e2m1(float x) {
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

static float ref_s_enc(float amax) { return amax > 0 ? fminf(2688.0f / fmaxf(amax, FLT_MIN), FLT_MAX) : 1.0f; }
static uint8_t ref_scale(float bamax, float s_enc) {
    return mxs_e4m3_from_f32(fminf(bamax * (s_enc * (1.0f / 6.0f)), FLT_MAX));
}
static float ref_e(uint8_t sc, float s_enc) {
    float d = mxs_e4m3_to_f32(sc);
    return d > 0 ? fminf(1.0f / (d * (1.0f / s_enc)), FLT_MAX) : FLT_MAX;
}

static float ref_value(const void *src, mxs_dtype dtype, mxs_dtype rt, int64_t i) {
    float x = ref_load(src, dtype, i);
    if (rt == MXS_BF16) return mxs_bf16_to_f32(mxs_bf16_from_f32(x));
    if (rt == MXS_F16) return mxs_f16_to_f32(mxs_f16_from_f32(x));
    return x;
}

static int64_t ref_cdiv16(int64_t a) { return (a + 15) / 16; }

/* Scale plane of `plane`: M x K with K = ceil(.../16); offsets of contract 9.5. */
static void ref_mk4(int64_t rows, int64_t cols, int plane, int64_t *M, int64_t *K) {
    *M = plane == MXS_ROWWISE ? rows : cols;
    *K = ref_cdiv16(plane == MXS_ROWWISE ? cols : rows);
}
static int64_t ref_sbytes(int64_t rows, int64_t cols, int plane, int layout) {
    int64_t M, K;
    ref_mk4(rows, cols, plane, &M, &K);
    return layout == MXS_SCALES_COMPACT ? M * K : ref_rup(M, 128) * ref_rup(K, 4);
}
static int64_t ref_soff(int64_t rows, int64_t cols, int plane, int layout, int64_t m, int64_t k) {
    int64_t M, K, Kp;
    ref_mk4(rows, cols, plane, &M, &K);
    Kp = ref_rup(K, 4);
    if (layout == MXS_SCALES_COMPACT) return m * K + k;
    if (layout == MXS_SCALES_PADDED) return m * Kp + k;
    return ((m / 128) * (Kp / 4) + (k / 4)) * 512 + (m % 32) * 16 + ((m % 128) / 32) * 4 + (k % 4);
}

/* Amax over rows [r0, r1) x cols [c0, c1) (clipped), NaN ignored. */
static float ref_amax_rect(int64_t rows, int64_t cols, const void *src, mxs_dtype dt, mxs_dtype rt, int64_t r0,
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
static void ref_plane(int64_t rows, int64_t cols, const void *src, mxs_dtype dt, mxs_dtype rt, int plane, int block,
                      int layout, float s_enc, uint8_t *data, uint8_t *scale) {
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
static void ref_block_amax_map(int64_t rows, int64_t cols, const void *src, mxs_dtype dt, mxs_dtype rt, int plane,
                               int block, float *bam) {
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

static float ref_global_amax(int64_t n, const void *src, mxs_dtype dt, mxs_dtype rt) {
    return ref_amax_rect(1, n, src, dt, rt, 0, 1, 0, n);
}

/* ---- fixtures: a tensor with poisoned, guarded outputs ------------------- */

typedef struct fx {
    mxs_nvfp4_tensor t;
    int64_t dbytes, sbytes[2];
    uint8_t *data[2], *scale[2], *amax;
} fx;

static void fx_make(fx *f, int64_t rows, int64_t cols, unsigned dirs, int block, int layout) {
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

static void fx_free(fx *f) {
    int p;
    for (p = 0; p < 2; p++) {
        free(f->data[p]);
        free(f->scale[p]);
    }
    free(f->amax);
}

static int fx_all_poisoned(const fx *f) {
    int p;
    for (p = 0; p < 2; p++)
        if (!t_all_poisoned(f->data[p], (size_t)f->dbytes) || !t_all_poisoned(f->scale[p], (size_t)f->sbytes[p]))
            return 0;
    return t_all_poisoned(f->amax, sizeof(float));
}

static float fx_amax(const fx *f) {
    float a;
    memcpy(&a, f->amax, sizeof a);
    return a;
}

/* Dimensions where NVFP4 edges go wrong: 1, small, around multiples of 16
 * and 128, and random. */
static int64_t rand_dim16(t_rng *r, int64_t max) {
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

static void *alloc_src(mxs_dtype dtype, int64_t n) {
    void *s = malloc((size_t)n * (size_t)mxs_dtype_bytes(dtype) + 1);
    cr_assert_not_null(s);
    return s;
}

/* Finite values with a moderate exponent spread around 2^center, some
 * zero 16-runs: the data the error bounds are stated for. `narrow` keeps them
 * inside f16's range (for an f16 source or round-through). */
static void fill_finite(t_rng *r, void *src, mxs_dtype dtype, int64_t n, int narrow) {
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

static const char *dtn[3] = {"f32", "bf16", "f16"};

/* ---- E2M1 ---------------------------------------------------------------- */

Test(nvfp4, e2m1_from_f32_matches_every_oracle_vector) {
    FILE *f = open_vectors("e2m1_from_f32.txt");
    char line[256];
    long n = 0, bad = 0, bad_ref = 0, bad_pair = 0;
    cr_assert_not_null(f, "tests/vectors/e2m1_from_f32.txt is missing");
    while (fgets(line, sizeof line, f)) {
        unsigned bits, want;
        float x;
        if (line[0] == '#' || sscanf(line, "%x %x", &bits, &want) != 2) continue;
        n++;
        x = mxs_f32_from_bits(bits);
        if (mxs_e2m1_from_f32(x) != want) bad++;
        if (ref_e2m1(x) != want) bad_ref++; /* the test's own reference agrees with the oracle */
        if (mxs_e2m1x2_from_f32(x, 1.0f) != (uint8_t)(want | 0x20u) ||
            mxs_e2m1x2_from_f32(-3.0f, x) != (uint8_t)(0xDu | (want << 4)))
            bad_pair++;
    }
    fclose(f);
    cr_assert_gt(n, 90000, "only %ld vectors read", n);
    cr_assert_eq(bad, 0, "%ld of %ld E2M1 conversions differ from the oracle", bad, n);
    cr_assert_eq(bad_ref, 0, "%ld of %ld reference conversions differ from the oracle", bad_ref, n);
    cr_assert_eq(bad_pair, 0, "%ld of %ld packed pairs differ", bad_pair, n);
}

Test(nvfp4, e2m1_to_f32_matches_every_oracle_vector) {
    FILE *f = open_vectors("e2m1_to_f32.txt");
    char line[256];
    int n = 0, seen[16] = {0};
    cr_assert_not_null(f, "tests/vectors/e2m1_to_f32.txt is missing");
    while (fgets(line, sizeof line, f)) {
        unsigned q, bits;
        if (line[0] == '#' || sscanf(line, "%x %x", &q, &bits) != 2) continue;
        cr_assert_lt(q, 16u);
        n++;
        seen[q] = 1;
        cr_assert_eq(mxs_f32_bits(mxs_e2m1_to_f32((uint8_t)q)), bits, "code %x", q);
    }
    fclose(f);
    cr_assert_eq(n, 16);
    for (n = 0; n < 16; n++) cr_assert(seen[n]);
}

Test(nvfp4, e2m1_decode_is_exact_for_every_code_and_byte) {
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    int q, b;
    for (q = 0; q < 16; q++) {
        float v = mxs_e2m1_to_f32((uint8_t)q);
        cr_assert_eq(fabsf(v), mag[q & 7], "code %x", q);
        cr_assert_eq(signbit(v) != 0, (q & 8) != 0, "code %x sign", q);
        cr_assert_eq(mxs_e2m1_from_f32(v), q, "code %x does not round-trip", q); /* -0.0 -> 0x8 */
        cr_assert_eq(mxs_e2m1_to_f32((uint8_t)(q | 0xF0)), v, "high bits must be ignored");
    }
    for (b = 0; b < 256; b++) {
        uint8_t byte = (uint8_t)b;
        cr_assert_eq(mxs_nvfp4_get(&byte, 0), b & 0xF);
        cr_assert_eq(mxs_nvfp4_get(&byte, 1), b >> 4);
        cr_assert_eq(mxs_e2m1x2_from_f32(mxs_e2m1_to_f32((uint8_t)(b & 0xF)), mxs_e2m1_to_f32((uint8_t)(b >> 4))), b);
    }
}

Test(nvfp4, e2m1_agrees_with_nearest_even_on_an_f32_sweep) {
    /* every 997th bit pattern (both signs) plus the 7 boundaries and their
     * neighbours */
    static const float edge[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
    uint64_t u;
    long bad = 0;
    int k, d;
    for (u = 0; u <= 0xFFFFFFFFull; u += 997)
        if (mxs_e2m1_from_f32(mxs_f32_from_bits((uint32_t)u)) != ref_e2m1(mxs_f32_from_bits((uint32_t)u))) bad++;
    cr_assert_eq(bad, 0, "%ld sweep values differ from nearest-even", bad);
    for (k = 0; k < 7; k++)
        for (d = -2; d <= 2; d++) {
            float x = mxs_f32_from_bits((uint32_t)((int64_t)mxs_f32_bits(edge[k]) + d));
            cr_assert_eq(mxs_e2m1_from_f32(x), ref_e2m1(x), "boundary %g%+d ulp", (double)edge[k], d);
            cr_assert_eq(mxs_e2m1_from_f32(-x), ref_e2m1(-x));
        }
    /* the ties themselves */
    cr_assert_eq(mxs_e2m1_from_f32(0.25f), 0x0);
    cr_assert_eq(mxs_e2m1_from_f32(-0.25f), 0x8);
    cr_assert_eq(mxs_e2m1_from_f32(0.75f), 0x2);
    cr_assert_eq(mxs_e2m1_from_f32(1.25f), 0x2);
    cr_assert_eq(mxs_e2m1_from_f32(1.75f), 0x4);
    cr_assert_eq(mxs_e2m1_from_f32(2.5f), 0x4);
    cr_assert_eq(mxs_e2m1_from_f32(3.5f), 0x6);
    cr_assert_eq(mxs_e2m1_from_f32(5.0f), 0x6);
    cr_assert_eq(mxs_e2m1_from_f32(INFINITY), 0x7);
    cr_assert_eq(mxs_e2m1_from_f32(-INFINITY), 0xF);
    cr_assert_eq(mxs_e2m1_from_f32(-NAN), 0x7);
    cr_assert_eq(mxs_e2m1_from_f32(mxs_f32_from_bits(0xFFFFFFFFu)), 0x7);
    cr_assert_eq(mxs_e2m1_from_f32(-1e30f), 0xF);
    cr_assert_eq(mxs_e2m1_from_f32(mxs_f32_from_bits(0x80000001u)), 0x8);
}

Test(nvfp4, packing_puts_the_even_flat_index_in_the_low_nibble) {
    float src[3] = {1.0f, -6.0f, 0.5f}; /* amax 6: S_enc = 448, s = 448, elements unchanged */
    fx f;
    uint8_t b = 0xFF;
    cr_assert_eq(mxs_e2m1x2_from_f32(1.0f, -6.0f), 0xF2);
    mxs_nvfp4_put(&b, 0, 0x3);
    cr_assert_eq(b, 0xF3);
    mxs_nvfp4_put(&b, 1, 0x5);
    cr_assert_eq(b, 0x53);
    fx_make(&f, 1, 3, MXS_BOTH, MXS_NVFP4_1X16, MXS_SCALES_COMPACT);
    cr_assert_eq(mxs_host_nvfp4_quantize(&f.t, src, MXS_F32, MXS_F32), MXS_OK);
    cr_assert_eq(f.data[0][0], 0xF2);
    cr_assert_eq(f.data[0][1], 0x01, "odd count: element 2 low, spare high nibble 0");
    /* the column-wise plane of a 1 x 3 weight: the same flat order, but every
     * 16x1 block holds one element, so each is scaled to about +-6 */
    cr_assert_eq(f.data[1][0], 0xF7);
    cr_assert_eq(f.data[1][1], 0x07);
    cr_assert_eq(f.scale[0][0], 0x7E); /* 448 */
    cr_assert_eq(fx_amax(&f), 6.0f);
    cr_assert(t_guard_ok(f.data[0], 2) && t_guard_ok(f.scale[0], 1) && t_guard_ok(f.amax, 4));
    fx_free(&f);
}

/* ---- scale formulas -------------------------------------------------------- */

Test(nvfp4, global_encode_scale_hand_cases) {
    cr_assert_eq(mxs_nvfp4_global_encode(0.0f), 1.0f);
    cr_assert_eq(mxs_nvfp4_global_encode(-0.0f), 1.0f);
    cr_assert_eq(mxs_nvfp4_global_encode(NAN), 1.0f);
    cr_assert_eq(mxs_nvfp4_global_encode(2688.0f), 1.0f);
    cr_assert_eq(mxs_nvfp4_global_encode(448.0f), 6.0f);
    cr_assert_eq(mxs_nvfp4_global_encode(6.0f), 448.0f);
    cr_assert_eq(mxs_nvfp4_global_encode(1.0f), 2688.0f);
    cr_assert_eq(mxs_nvfp4_global_encode(0.5f), 5376.0f);
    cr_assert_eq(mxs_f32_bits(mxs_nvfp4_global_encode(3.0f)), mxs_f32_bits(896.0f));
    cr_assert_eq(mxs_f32_bits(mxs_nvfp4_global_encode(7.0f)), mxs_f32_bits(384.0f));
    cr_assert_eq(mxs_nvfp4_global_encode(INFINITY), 0.0f, "2688/inf = 0 (TE's quantizer gives 1 here)");
    cr_assert_eq(mxs_nvfp4_global_encode(FLT_MAX), 2688.0f / FLT_MAX);
    cr_assert_eq(mxs_nvfp4_global_encode(FLT_MIN), FLT_MAX, "2688/FLT_MIN overflows: clamped");
    cr_assert_eq(mxs_nvfp4_global_encode(1e-40f), FLT_MAX, "subnormal amax");
    cr_assert_eq(mxs_nvfp4_global_encode(7e-36f), FLT_MAX);
    cr_assert_lt(mxs_nvfp4_global_encode(8e-36f), FLT_MAX);
    /* equals the contract's formula on a sweep of positive floats */
    {
        uint32_t u;
        for (u = 1; u < 0x7F800000u; u += 4099)
            cr_assert_eq(mxs_f32_bits(mxs_nvfp4_global_encode(mxs_f32_from_bits(u))),
                         mxs_f32_bits(ref_s_enc(mxs_f32_from_bits(u))), "amax bits %08x", u);
    }
    /* the constants the rules use, bit for bit */
    cr_assert_eq(mxs_f32_bits(1.0f / 6.0f), 0x3E2AAAABu);
    cr_assert_eq(mxs_f32_bits(1.0f / 2688.0f), mxs_f32_bits((float)(1.0 / 2688.0)));
}

Test(nvfp4, block_scale_and_encode_multiplier_hand_cases) {
    /* S_enc = 1: s = fl32(6 * fl32(1/6)) = 1.0 exactly (6 * 0x3E2AAAAB = 1 + 2^-25, rounds to 1) */
    cr_assert_eq(mxs_nvfp4_block_scale(6.0f, 1.0f), 0x38); /* E4M3 1.0 */
    cr_assert_eq(mxs_nvfp4_block_scale(0.0f, 1.0f), 0x00);
    cr_assert_eq(mxs_nvfp4_block_scale(0.0f, FLT_MAX), 0x00);
    cr_assert_eq(mxs_nvfp4_block_scale(2688.0f, 1.0f), 0x7E, "448");
    cr_assert_eq(mxs_nvfp4_block_scale(1e30f, 1.0f), 0x7E, "satfinite");
    cr_assert_eq(mxs_nvfp4_block_scale(INFINITY, 1.0f), 0x7E, "inf -> FLT_MAX -> 448");
    cr_assert_eq(mxs_nvfp4_block_scale(INFINITY, 0.0f), 0x7E, "inf * 0 = NaN -> fminf -> FLT_MAX -> 448");
    cr_assert_eq(mxs_nvfp4_block_scale(1.0f, 0.0f), 0x00);
    cr_assert_eq(mxs_nvfp4_block_scale(3.0f, 2.0f), 0x38, "3 * fl32(2/6) = 1.0");
    cr_assert_eq(mxs_nvfp4_block_scale(1.0f, 1.0f), mxs_e4m3_from_f32(1.0f / 6.0f));
    /* an order-of-operations witness: block_amax * fl32(S_enc * fl32(1/6)) gives 0x0B, while
     * block_amax * (S_enc / 6), (block_amax * fl32(1/6)) * S_enc and (block_amax / 6) * S_enc
     * (the order of TE's master-weight scale kernel) give 0x0A */
    {
        volatile float six = 6.0f, sixth = 1.0f / 6.0f;
        float amax = mxs_f32_from_bits(0x49000204u), ba = mxs_f32_from_bits(0x41C00306u);
        float s_enc = mxs_nvfp4_global_encode(amax);
        cr_assert_eq(mxs_f32_bits(s_enc), mxs_f32_bits(2688.0f / amax));
        cr_assert_eq(mxs_nvfp4_block_scale(ba, s_enc), 0x0B);
        cr_assert_eq(ref_scale(ba, s_enc), 0x0B);
        cr_assert_eq(mxs_e4m3_from_f32(ba * (s_enc / six)), 0x0A);
        cr_assert_eq(mxs_e4m3_from_f32((ba * sixth) * s_enc), 0x0A);
        cr_assert_eq(mxs_e4m3_from_f32((ba / six) * s_enc), 0x0A);
    }
    /* the block amax equal to the global amax gives 448 for any amax */
    {
        float a;
        for (a = 1e-30f; a < 1e30f; a *= 3.7f) cr_assert_eq(mxs_nvfp4_block_scale(a, mxs_nvfp4_global_encode(a)), 0x7E);
    }
    /* e = 1 / (d * (1 / S_enc)) */
    cr_assert_eq(mxs_nvfp4_encode_mult(0x38, 1.0f), 1.0f);
    cr_assert_eq(mxs_nvfp4_encode_mult(0x38, 2.0f), 2.0f);
    cr_assert_eq(mxs_nvfp4_encode_mult(0x40, 1.0f), 0.5f);                                    /* d = 2 */
    cr_assert_eq(mxs_f32_bits(mxs_nvfp4_encode_mult(0x44, 2.0f)), mxs_f32_bits(1.0f / 1.5f)); /* d = 3, 1/S = 0.5 */
    cr_assert_eq(mxs_nvfp4_encode_mult(0x00, 1.0f), FLT_MAX, "d = 0");
    cr_assert_eq(mxs_nvfp4_encode_mult(0x80, 1.0f), FLT_MAX, "d = -0");
    cr_assert_eq(mxs_nvfp4_encode_mult(0x7F, 1.0f), FLT_MAX, "NaN scale code");
    cr_assert_eq(mxs_nvfp4_encode_mult(0x01, FLT_MAX), FLT_MAX, "1/(2^-9 * 1/FLT_MAX) overflows");
    cr_assert_eq(mxs_nvfp4_encode_mult(0x38, 0.0f), 0.0f, "S_enc = 0 (amax inf): 1/(d * inf) = 0");
    /* the library equals the contract's formulas on a grid */
    {
        int sc;
        float s;
        for (s = 1e-30f; s < 1e35f; s *= 5.3f)
            for (sc = 0; sc < 256; sc++) {
                cr_assert_eq(mxs_f32_bits(mxs_nvfp4_encode_mult((uint8_t)sc, s)), mxs_f32_bits(ref_e((uint8_t)sc, s)),
                             "scale %02x S_enc %g", sc, (double)s);
                cr_assert_eq(mxs_nvfp4_block_scale(mxs_e4m3_to_f32((uint8_t)(sc & 0x7E)), s),
                             ref_scale(mxs_e4m3_to_f32((uint8_t)(sc & 0x7E)), s));
            }
    }
    /* quantize_elem: E2M1(fl32(x * e)) */
    cr_assert_eq(mxs_nvfp4_quantize_elem(3.0f, 1.0f), 0x5);
    cr_assert_eq(mxs_nvfp4_quantize_elem(-2688.0f, 1.0f / 448.0f), 0xF);
    cr_assert_eq(mxs_nvfp4_quantize_elem(NAN, 1.0f), 0x7);
    cr_assert_eq(mxs_nvfp4_quantize_elem(1e-3f, FLT_MAX), 0x7, "d = 0 block: nonzero elements saturate");
    cr_assert_eq(mxs_nvfp4_quantize_elem(0.0f, FLT_MAX), 0x0);
}

Test(nvfp4, decode_multiplier_and_dequantize_element) {
    /* f = fl32(fl32(d * amax) * fl32(1/2688)); x' = e2m1 * f */
    cr_assert_eq(mxs_nvfp4_decode_mult(0x38, 2688.0f), 1.0f);
    cr_assert_eq(mxs_nvfp4_decode_mult(0x7E, 2688.0f), 448.0f);
    /* the order is (d * amax) * fl32(1/2688), not d * (amax * fl32(1/2688)): they differ here */
    cr_assert_eq(mxs_f32_bits(mxs_nvfp4_decode_mult(0x31, mxs_f32_from_bits(0x3F8020C5u))), 0x395BA5E5u);
    cr_assert_eq(mxs_nvfp4_decode_mult(0x00, 5.0f), 0.0f);
    cr_assert_eq(mxs_nvfp4_dequantize_elem(0x7, 2.0f), 12.0f);
    cr_assert_eq(mxs_nvfp4_dequantize_elem(0xB, 2.0f), -3.0f);
    cr_assert(signbit(mxs_nvfp4_dequantize_elem(0x8, 2.0f)));
    cr_assert_eq(mxs_f32_bits(mxs_nvfp4_dequantize_elem(0x1, mxs_nvfp4_decode_mult(0x7F, 1.0f))), 0x7FC00000u,
                 "NaN scale -> canonical NaN");
    cr_assert_eq(mxs_f32_bits(mxs_nvfp4_dequantize_elem(0x0, INFINITY)), 0x7FC00000u, "0 * inf -> canonical NaN");
}

Test(nvfp4, hand_computed_tensor) {
    /* 2 x 16, amax 2688 -> S_enc = 1.
     * row 0: amax 2688 -> s = fl32(2688 * fl32(1/6)) = 448.00001 -> 0x7E, d = 448,
     *        e = 1/(448 * 1) = fl32(1/448); 2688 * e = 6 -> 0x7, -1344 * e = -3 -> 0xD,
     *        224 -> 0.5 -> 0x1, 100 -> 0.223 -> 0x0, rest 0.
     * row 1: amax 6 -> s = 1.0 -> 0x38, e = 1; elements E2M1 directly. */
    float src[32];
    const float row1[16] = {6, -6, 0.3f, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5, 5.01f, -0.1f, 4, 3, 2, 1};
    const uint8_t row1_q[16] = {7, 0xF, 1, 0, 2, 2, 4, 4, 6, 6, 7, 8, 6, 5, 4, 2};
    fx f;
    int j;
    memset(src, 0, sizeof src);
    src[0] = 2688.0f;
    src[1] = -1344.0f;
    src[2] = 224.0f;
    src[3] = 100.0f;
    memcpy(src + 16, row1, sizeof row1);
    fx_make(&f, 2, 16, MXS_ROWWISE, MXS_NVFP4_1X16, MXS_SCALES_COMPACT);
    cr_assert_eq(mxs_host_nvfp4_quantize(&f.t, src, MXS_F32, MXS_F32), MXS_OK);
    cr_assert_eq(fx_amax(&f), 2688.0f);
    cr_assert_eq(f.scale[0][0], 0x7E);
    cr_assert_eq(f.scale[0][1], 0x38);
    cr_assert_eq(f.data[0][0], 0xD7);
    cr_assert_eq(f.data[0][1], 0x01);
    for (j = 2; j < 8; j++) cr_assert_eq(f.data[0][j], 0x00);
    for (j = 0; j < 16; j++) cr_assert_eq(mxs_nvfp4_get(f.data[0] + 8, j), row1_q[j], "row 1 element %d", j);
    cr_assert(t_guard_ok(f.data[0], 16) && t_guard_ok(f.scale[0], 2));
    cr_assert(t_all_poisoned(f.data[1], (size_t)f.dbytes) && t_all_poisoned(f.scale[1], (size_t)f.sbytes[1]),
              "a row-only tensor stays row-only");
    /* 16x16 of the same data: one tile, amax 2688, every row scale 0x7E */
    fx_free(&f);
    fx_make(&f, 2, 16, MXS_BOTH, MXS_NVFP4_16X16, MXS_SCALES_COMPACT);
    cr_assert_eq(mxs_host_nvfp4_quantize(&f.t, src, MXS_F32, MXS_F32), MXS_OK);
    cr_assert_eq(f.scale[0][0], 0x7E);
    cr_assert_eq(f.scale[0][1], 0x7E);
    for (j = 0; j < 16; j++) cr_assert_eq(f.scale[1][j], 0x7E, "column-wise entry %d", j);
    fx_free(&f);
}

/* ---- whole-tensor quantize against the reference ------------------------- */

/* Quantizes one random case with the library and the reference; compares
 * every byte and the guards. Returns nothing; asserts. */
static void check_case(t_rng *rng, int64_t rows, int64_t cols, unsigned dirs, int block, int layout, mxs_dtype dt,
                       mxs_dtype rt, int finite) {
    int64_t n = rows * cols;
    void *src = alloc_src(dt, n);
    fx f;
    int p;
    float amax, s_enc;
    uint8_t *rd = malloc((size_t)(n + 1) / 2 + 1), *rs;
    if (finite)
        fill_finite(rng, src, dt, n, dt == MXS_F16 || rt == MXS_F16);
    else
        t_fill(rng, src, dt, n);
    fx_make(&f, rows, cols, dirs, block, layout);
    cr_assert_eq(mxs_host_nvfp4_quantize(&f.t, src, dt, rt), MXS_OK);
    amax = ref_global_amax(n, src, dt, rt);
    s_enc = ref_s_enc(amax);
    cr_assert_eq(mxs_f32_bits(fx_amax(&f)), mxs_f32_bits(amax), "global amax %g vs %g", (double)fx_amax(&f),
                 (double)amax);
    for (p = 0; p < 2; p++) {
        int64_t d;
        if (!(dirs & (unsigned)(p + 1))) {
            cr_assert(t_all_poisoned(f.data[p], (size_t)f.dbytes) && t_all_poisoned(f.scale[p], (size_t)f.sbytes[p]),
                      "absent plane %d written", p + 1);
            continue;
        }
        rs = malloc((size_t)f.sbytes[p] + 1);
        ref_plane(rows, cols, src, dt, rt, p + 1, block, layout, s_enc, rd, rs);
        d = t_first_diff(f.scale[p], rs, (size_t)f.sbytes[p]);
        cr_assert_eq(d, -1, "%lldx%lld plane %d block %d layout %d %s rt %s: scale byte %lld: %02x vs %02x",
                     (long long)rows, (long long)cols, p + 1, block, layout, dtn[dt], dtn[rt], (long long)d,
                     d >= 0 ? f.scale[p][d] : 0, d >= 0 ? rs[d] : 0);
        d = t_first_diff(f.data[p], rd, (size_t)f.dbytes);
        cr_assert_eq(d, -1, "%lldx%lld plane %d block %d layout %d %s rt %s: data byte %lld: %02x vs %02x",
                     (long long)rows, (long long)cols, p + 1, block, layout, dtn[dt], dtn[rt], (long long)d,
                     d >= 0 ? f.data[p][d] : 0, d >= 0 ? rd[d] : 0);
        cr_assert(t_guard_ok(f.data[p], (size_t)f.dbytes) && t_guard_ok(f.scale[p], (size_t)f.sbytes[p]),
                  "guard bytes of plane %d overwritten", p + 1);
        free(rs);
    }
    cr_assert(t_guard_ok(f.amax, sizeof(float)));
    free(rd);
    free(src);
    fx_free(&f);
}

Test(nvfp4, quantize_equals_reference_every_plane_block_layout_dtype, .timeout = 600) {
    t_rng rng = t_rng_seed(18);
    static const int64_t fixed[][2] = {{1, 1},  {1, 2},   {2, 1},   {1, 15},  {1, 16},  {1, 17},  {17, 1},
                                       {16, 1}, {15, 17}, {16, 16}, {33, 47}, {128, 4}, {129, 3}, {31, 130}};
    const int nfixed = (int)(sizeof fixed / sizeof fixed[0]);
    int it;
    for (it = 0; it < 160; it++) {
        int64_t rows = it < nfixed ? fixed[it][0] : rand_dim16(&rng, 200);
        int64_t cols = it < nfixed ? fixed[it][1] : rand_dim16(&rng, 200);
        unsigned dirs = (unsigned)(1 + it % 3);
        int block = (it / 3) % 2, layout = (it / 6) % 3;
        mxs_dtype dt = (mxs_dtype)t_below(&rng, 3), rt = (mxs_dtype)t_below(&rng, 3);
        check_case(&rng, rows, cols, dirs, block, layout, dt, rt, (int)(it % 4 == 0));
    }
}

Test(nvfp4, bf16_round_through_of_f32_equals_the_bf16_source) {
    t_rng rng = t_rng_seed(7);
    int it;
    for (it = 0; it < 12; it++) {
        int64_t rows = rand_dim16(&rng, 100), cols = rand_dim16(&rng, 100), n = rows * cols, i;
        float *x = alloc_src(MXS_F32, n);
        uint16_t *h = alloc_src(MXS_BF16, n);
        fx a, b;
        int p;
        t_fill(&rng, x, MXS_F32, n);
        for (i = 0; i < n; i++) h[i] = mxs_bf16_from_f32(x[i]);
        fx_make(&a, rows, cols, MXS_BOTH, it % 2, it % 3);
        fx_make(&b, rows, cols, MXS_BOTH, it % 2, it % 3);
        cr_assert_eq(mxs_host_nvfp4_quantize(&a.t, x, MXS_F32, MXS_BF16), MXS_OK);
        cr_assert_eq(mxs_host_nvfp4_quantize(&b.t, h, MXS_BF16, MXS_F32), MXS_OK);
        cr_assert_eq(mxs_f32_bits(fx_amax(&a)), mxs_f32_bits(fx_amax(&b)));
        for (p = 0; p < 2; p++) {
            cr_assert_eq(t_first_diff(a.data[p], b.data[p], (size_t)a.dbytes), -1);
            cr_assert_eq(t_first_diff(a.scale[p], b.scale[p], (size_t)a.sbytes[p]), -1);
        }
        fx_free(&a);
        fx_free(&b);
        free(x);
        free(h);
    }
}

Test(nvfp4, nan_is_ignored_by_the_amaxes_and_casts_to_plus_six) {
    float src[32];
    fx f;
    int j;
    for (j = 0; j < 32; j++) src[j] = (float)(j % 7) * 0.5f - 1.5f;
    src[3] = NAN;
    src[20] = -NAN;
    for (j = 16; j < 32; j++)
        if (j != 20) src[j] = j == 21 ? NAN : src[j];
    fx_make(&f, 1, 32, MXS_ROWWISE, MXS_NVFP4_1X16, MXS_SCALES_COMPACT);
    cr_assert_eq(mxs_host_nvfp4_quantize(&f.t, src, MXS_F32, MXS_F32), MXS_OK);
    cr_assert_eq(fx_amax(&f), 1.5f, "NaN ignored by the global amax");
    cr_assert_eq(f.scale[0][0], 0x7E, "block amax 1.5 = global amax -> 448");
    cr_assert_eq(mxs_nvfp4_get(f.data[0], 3), 0x7);
    cr_assert_eq(mxs_nvfp4_get(f.data[0], 20), 0x7, "negative NaN -> +6 too");
    cr_assert_eq(mxs_nvfp4_get(f.data[0], 21), 0x7);
    fx_free(&f);
    /* an all-NaN tensor: amax 0, S_enc 1, scales 0, every element +6 */
    for (j = 0; j < 32; j++) src[j] = NAN;
    fx_make(&f, 2, 16, MXS_BOTH, MXS_NVFP4_16X16, MXS_SCALES_COMPACT);
    cr_assert_eq(mxs_host_nvfp4_quantize(&f.t, src, MXS_F32, MXS_F32), MXS_OK);
    cr_assert_eq(fx_amax(&f), 0.0f);
    cr_assert_eq(f.scale[0][0], 0x00);
    for (j = 0; j < 16; j++) cr_assert_eq(f.data[0][j], 0x77);
    fx_free(&f);
}

/* ---- dequantize ---------------------------------------------------------- */

Test(nvfp4, dequantize_round_trip_is_within_the_block_error_bound) {
    t_rng rng = t_rng_seed(99);
    int it;
    for (it = 0; it < 60; it++) {
        int64_t rows = rand_dim16(&rng, 150), cols = rand_dim16(&rng, 150), n = rows * cols, r, c;
        mxs_dtype dt = (mxs_dtype)(it % 3), rt = (mxs_dtype)((it / 3) % 3);
        int block = (it / 9) % 2, layout = (int)t_below(&rng, 3), p;
        void *src = alloc_src(dt, n);
        float *out = malloc((size_t)n * sizeof(float)), *bam = malloc((size_t)n * sizeof(float)), amax, s_enc;
        uint16_t *out16 = malloc((size_t)n * 2);
        fx f;
        fill_finite(&rng, src, dt, n, dt == MXS_F16 || rt == MXS_F16);
        fx_make(&f, rows, cols, MXS_BOTH, block, layout);
        cr_assert_eq(mxs_host_nvfp4_quantize(&f.t, src, dt, rt), MXS_OK);
        amax = fx_amax(&f);
        s_enc = mxs_nvfp4_global_encode(amax);
        for (p = MXS_ROWWISE; p <= MXS_COLWISE; p++) {
            cr_assert_eq(mxs_host_nvfp4_dequantize(&f.t, (mxs_dirs)p, out, MXS_F32), MXS_OK);
            ref_block_amax_map(rows, cols, src, dt, rt, p, block, bam);
            for (r = 0; r < rows; r++)
                for (c = 0; c < cols; c++) {
                    float x = ref_value(src, dt, rt, r * cols + c), bamax = bam[r * cols + c];
                    double bound;
                    /* contract 9.6: |x' - x| <= bamax * (1 + 2^-4) / 6 + 6 * 2^-10 / S_enc, plus f32 slop */
                    bound = (double)bamax * (1.0625 / 6.0) * (1 + 1e-5) + 6.0 * 0.0009765625 / s_enc * (1 + 1e-5);
                    cr_assert_leq(fabs((double)out[r * cols + c] - (double)x), bound,
                                  "%lldx%lld plane %d block %d (%lld,%lld): x %g x' %g bound %g", (long long)rows,
                                  (long long)cols, p, block, (long long)r, (long long)c, (double)x,
                                  (double)out[r * cols + c], bound);
                }
            /* bf16 / f16 outputs are the f32 output rounded */
            cr_assert_eq(mxs_host_nvfp4_dequantize(&f.t, (mxs_dirs)p, out16, MXS_BF16), MXS_OK);
            for (r = 0; r < n; r++) cr_assert_eq(out16[r], mxs_bf16_from_f32(out[r]));
            cr_assert_eq(mxs_host_nvfp4_dequantize(&f.t, (mxs_dirs)p, out16, MXS_F16), MXS_OK);
            for (r = 0; r < n; r++) cr_assert_eq(out16[r], mxs_f16_from_f32(out[r]));
        }
        fx_free(&f);
        free(src);
        free(out);
        free(bam);
        free(out16);
    }
}

Test(nvfp4, dequantize_follows_te_formula_exactly) {
    t_rng rng = t_rng_seed(5);
    int64_t rows = 37, cols = 45, n = rows * cols, r, c;
    float *src = alloc_src(MXS_F32, n), *out = malloc((size_t)n * sizeof(float));
    fx f;
    t_fill(&rng, src, MXS_F32, n);
    fx_make(&f, rows, cols, MXS_BOTH, MXS_NVFP4_1X16, MXS_SCALES_SWIZZLED);
    cr_assert_eq(mxs_host_nvfp4_quantize(&f.t, src, MXS_F32, MXS_F32), MXS_OK);
    cr_assert_eq(mxs_host_nvfp4_dequantize(&f.t, MXS_COLWISE, out, MXS_F32), MXS_OK);
    for (r = 0; r < rows; r++)
        for (c = 0; c < cols; c++) {
            uint8_t q = mxs_nvfp4_get(f.data[1], c * rows + r);
            uint8_t sc = f.scale[1][ref_soff(rows, cols, MXS_COLWISE, MXS_SCALES_SWIZZLED, c, r / 16)];
            float want = mxs_e2m1_to_f32(q) * ((mxs_e4m3_to_f32(sc) * fx_amax(&f)) * (1.0f / 2688.0f));
            if (isnan(want))
                cr_assert_eq(mxs_f32_bits(out[r * cols + c]), 0x7FC00000u);
            else
                cr_assert_eq(mxs_f32_bits(out[r * cols + c]), mxs_f32_bits(want), "(%lld,%lld)", (long long)r,
                             (long long)c);
        }
    fx_free(&f);
    free(src);
    free(out);
}

/* ---- 16x16 tiles and the transposed plane --------------------------------- */

Test(nvfp4, tile_16x16_scales_repeat_over_rows_and_the_transpose_shares_them) {
    t_rng rng = t_rng_seed(1616);
    int it;
    for (it = 0; it < 30; it++) {
        int64_t rows = rand_dim16(&rng, 140), cols = rand_dim16(&rng, 140), m, k, r, c;
        int layout = it % 3;
        mxs_dtype dt = (mxs_dtype)(it % 3);
        void *src = alloc_src(dt, rows * cols);
        fx f;
        mxs_scale_geom g0, g1;
        t_fill(&rng, src, dt, rows * cols);
        fx_make(&f, rows, cols, MXS_BOTH, MXS_NVFP4_16X16, layout);
        cr_assert_eq(mxs_host_nvfp4_quantize(&f.t, src, dt, MXS_F32), MXS_OK);
        cr_assert(mxs_nvfp4_scale_geom_make(rows, cols, MXS_ROWWISE, (mxs_scale_layout)layout, &g0));
        cr_assert(mxs_nvfp4_scale_geom_make(rows, cols, MXS_COLWISE, (mxs_scale_layout)layout, &g1));
        for (m = 0; m < rows; m++)
            for (k = 0; k < g0.K; k++) {
                /* row m's entry equals row 16*(m/16)'s and the column-wise entry of (column 16k, row tile m/16) */
                uint8_t s = f.scale[0][mxs_scale_geom_offset(&g0, m, k)];
                cr_assert_eq(s, f.scale[0][mxs_scale_geom_offset(&g0, m / 16 * 16, k)]);
                cr_assert_eq(s, f.scale[1][mxs_scale_geom_offset(&g1, 16 * k, m / 16)]);
            }
        for (m = 0; m < cols; m++)
            for (k = 0; k < g1.K; k++) {
                int64_t tr, tc;
                mxs_nvfp4_entry_tile(MXS_COLWISE, m, k, &tr, &tc);
                cr_assert_eq(f.scale[1][mxs_scale_geom_offset(&g1, m, k)],
                             f.scale[0][mxs_scale_geom_offset(&g0, 16 * tr, tc)]);
            }
        /* same tile multiplier for both planes: the column-wise data is the nibble transpose */
        for (r = 0; r < rows; r++)
            for (c = 0; c < cols; c++)
                cr_assert_eq(mxs_nvfp4_get(f.data[0], r * cols + c), mxs_nvfp4_get(f.data[1], c * rows + r),
                             "%lldx%lld (%lld,%lld)", (long long)rows, (long long)cols, (long long)r, (long long)c);
        fx_free(&f);
        free(src);
    }
}

Test(nvfp4, colwise_plane_is_the_rowwise_plane_of_the_transpose) {
    t_rng rng = t_rng_seed(4242);
    int it;
    for (it = 0; it < 30; it++) {
        int64_t rows = rand_dim16(&rng, 130), cols = rand_dim16(&rng, 130), r, c;
        int block = it % 2, layout = (it / 2) % 3;
        float *src = alloc_src(MXS_F32, rows * cols), *tr = alloc_src(MXS_F32, rows * cols);
        fx a, b;
        t_fill(&rng, src, MXS_F32, rows * cols);
        for (r = 0; r < rows; r++)
            for (c = 0; c < cols; c++) tr[c * rows + r] = src[r * cols + c];
        fx_make(&a, rows, cols, MXS_COLWISE, block, layout);
        fx_make(&b, cols, rows, MXS_ROWWISE, block, layout);
        cr_assert_eq(mxs_host_nvfp4_quantize(&a.t, src, MXS_F32, MXS_BF16), MXS_OK);
        cr_assert_eq(mxs_host_nvfp4_quantize(&b.t, tr, MXS_F32, MXS_BF16), MXS_OK);
        cr_assert_eq(mxs_f32_bits(fx_amax(&a)), mxs_f32_bits(fx_amax(&b)));
        cr_assert_eq(a.sbytes[1], b.sbytes[0]);
        cr_assert_eq(t_first_diff(a.data[1], b.data[0], (size_t)a.dbytes), -1, "%lldx%lld block %d", (long long)rows,
                     (long long)cols, block);
        cr_assert_eq(t_first_diff(a.scale[1], b.scale[0], (size_t)a.sbytes[1]), -1);
        fx_free(&a);
        fx_free(&b);
        free(src);
        free(tr);
    }
}

/* ---- scale layouts --------------------------------------------------------- */

Test(nvfp4, scale_shapes_and_sizes) {
    int64_t o, i;
    mxs_nvfp4_tensor t;
    cr_assert_eq(mxs_nvfp4_scale_shape(300, 70, MXS_ROWWISE, MXS_SCALES_COMPACT, &o, &i), MXS_OK);
    cr_assert(o == 300 && i == 5);
    cr_assert_eq(mxs_nvfp4_scale_shape(300, 70, MXS_ROWWISE, MXS_SCALES_PADDED, &o, &i), MXS_OK);
    cr_assert(o == 384 && i == 8);
    cr_assert_eq(mxs_nvfp4_scale_shape(300, 70, MXS_COLWISE, MXS_SCALES_COMPACT, &o, &i), MXS_OK);
    cr_assert(o == 70 && i == 19);
    cr_assert_eq(mxs_nvfp4_scale_shape(300, 70, MXS_COLWISE, MXS_SCALES_SWIZZLED, &o, &i), MXS_OK);
    cr_assert(o == 128 && i == 20);
    cr_assert_eq(mxs_nvfp4_scale_shape(1, 1, MXS_ROWWISE, MXS_SCALES_PADDED, &o, &i), MXS_OK);
    cr_assert(o == 128 && i == 4);
    cr_assert_eq(mxs_nvfp4_scale_shape(0, 1, MXS_ROWWISE, MXS_SCALES_PADDED, &o, &i), MXS_ERR_SHAPE);
    cr_assert_eq(mxs_nvfp4_scale_shape(1, 1, MXS_BOTH, MXS_SCALES_PADDED, &o, &i), MXS_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mxs_nvfp4_scale_shape(1, 1, MXS_ROWWISE, (mxs_scale_layout)3, &o, &i), MXS_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mxs_nvfp4_scale_shape(INT64_MAX / 2, 3, MXS_ROWWISE, MXS_SCALES_COMPACT, &o, &i), MXS_ERR_OVERFLOW);
    cr_assert_eq(mxs_nvfp4_scale_shape(INT64_MAX - 100, 1, MXS_ROWWISE, MXS_SCALES_COMPACT, &o, &i), MXS_ERR_OVERFLOW,
                 "round_up(M, 128) overflows");
    cr_assert_eq(mxs_nvfp4_scale_shape(1, INT64_MAX - 100, MXS_COLWISE, MXS_SCALES_PADDED, &o, &i), MXS_ERR_OVERFLOW);
    /* a 2^31-element weight is normal: 64-bit sizes */
    cr_assert_eq(mxs_nvfp4_scale_shape(262144, 8192, MXS_ROWWISE, MXS_SCALES_SWIZZLED, &o, &i), MXS_OK);
    cr_assert(o == 262144 && i == 512);
    cr_assert_eq(mxs_nvfp4_data_plane_bytes(262144, 8192), (int64_t)1 << 30);
    cr_assert_eq(mxs_nvfp4_data_plane_bytes(3, 3), 5);
    cr_assert_eq(mxs_nvfp4_data_plane_bytes(0, 3), 0);
    memset(&t, 0, sizeof t);
    t.rows = 300;
    t.cols = 70;
    t.dirs = MXS_BOTH;
    t.scale_layout = MXS_SCALES_PADDED;
    cr_assert_eq(mxs_nvfp4_data_bytes(&t), 10500);
    cr_assert_eq(mxs_nvfp4_scale_bytes(&t, MXS_ROWWISE), 384 * 8);
    cr_assert_eq(mxs_nvfp4_scale_bytes(&t, MXS_COLWISE), 128 * 20);
    cr_assert_eq(mxs_nvfp4_scale_bytes(&t, MXS_BOTH), -1);
    cr_assert_eq(mxs_nvfp4_storage_bytes(&t), 4 + 2 * 10500 + 384 * 8 + 128 * 20);
    t.dirs = MXS_ROWWISE;
    cr_assert_eq(mxs_nvfp4_scale_bytes(&t, MXS_COLWISE), -1);
    t.block = (mxs_nvfp4_block)2;
    cr_assert_eq(mxs_nvfp4_data_bytes(&t), -1);
    t.block = MXS_NVFP4_16X16;
    t.rows = INT64_MAX / 2;
    cr_assert_eq(mxs_nvfp4_tensor_check_shape(&t), MXS_ERR_OVERFLOW);
    /* index helpers */
    cr_assert_eq(mxs_nvfp4_data_index(3, 5, MXS_ROWWISE, 2, 4), 14);
    cr_assert_eq(mxs_nvfp4_data_index(3, 5, MXS_COLWISE, 2, 4), 14);
    cr_assert_eq(mxs_nvfp4_data_index(3, 5, MXS_COLWISE, 1, 2), 7);
    cr_assert_eq(mxs_nvfp4_scale_m(MXS_COLWISE, 40, 3), 3);
    cr_assert_eq(mxs_nvfp4_scale_k(MXS_COLWISE, 40, 3), 2);
    cr_assert_eq(mxs_nvfp4_scale_k(MXS_ROWWISE, 40, 33), 2);
}

Test(nvfp4, swizzle_matches_the_literal_formula_and_its_inverse) {
    static const int64_t dims[][2] = {{1, 1}, {130, 70}, {300, 1}, {1, 300}, {256, 128}, {17, 255}};
    int d, p, l;
    for (d = 0; d < 6; d++)
        for (p = MXS_ROWWISE; p <= MXS_COLWISE; p++)
            for (l = 0; l < 3; l++) {
                mxs_scale_geom g;
                int64_t m, k, off, mm, kk, bytes;
                uint8_t *seen;
                cr_assert(mxs_nvfp4_scale_geom_make(dims[d][0], dims[d][1], (mxs_dirs)p, (mxs_scale_layout)l, &g));
                bytes = mxs_scale_geom_bytes(&g);
                cr_assert_eq(bytes, ref_sbytes(dims[d][0], dims[d][1], p, l));
                seen = calloc((size_t)bytes, 1);
                for (m = 0; m < (l ? g.Mp : g.M); m++)
                    for (k = 0; k < (l ? g.Kp : g.K); k++) {
                        off = mxs_scale_geom_offset(&g, m, k);
                        if (m < g.M && k < g.K) cr_assert_eq(off, ref_soff(dims[d][0], dims[d][1], p, l, m, k));
                        cr_assert(off >= 0 && off < bytes);
                        cr_assert_eq(seen[off], 0, "offset %lld used twice", (long long)off);
                        seen[off] = 1;
                        mxs_scale_geom_coords(&g, off, &mm, &kk);
                        cr_assert(mm == m && kk == k);
                    }
                free(seen);
            }
}

Test(nvfp4, layout_conversion_round_trips_and_matches_quantize_in_each_layout) {
    t_rng rng = t_rng_seed(3);
    int it;
    for (it = 0; it < 24; it++) {
        int64_t rows = rand_dim16(&rng, 300), cols = rand_dim16(&rng, 300);
        int block = it % 2, p, from, to;
        float *src = alloc_src(MXS_F32, rows * cols);
        fx q[3];
        t_fill(&rng, src, MXS_F32, rows * cols);
        for (from = 0; from < 3; from++) {
            fx_make(&q[from], rows, cols, MXS_BOTH, block, from);
            cr_assert_eq(mxs_host_nvfp4_quantize(&q[from].t, src, MXS_F32, MXS_F32), MXS_OK);
        }
        for (p = 0; p < 2; p++)
            for (from = 0; from < 3; from++)
                for (to = 0; to < 3; to++) {
                    uint8_t *dst = t_alloc((size_t)q[to].sbytes[p]), *back = t_alloc((size_t)q[from].sbytes[p]);
                    cr_assert_eq(mxs_host_nvfp4_convert_scales(rows, cols, (mxs_dirs)(p + 1), (mxs_scale_layout)from,
                                                               q[from].scale[p], (mxs_scale_layout)to, dst),
                                 MXS_OK);
                    cr_assert_eq(t_first_diff(dst, q[to].scale[p], (size_t)q[to].sbytes[p]), -1,
                                 "%lldx%lld plane %d %d -> %d", (long long)rows, (long long)cols, p + 1, from, to);
                    cr_assert(t_guard_ok(dst, (size_t)q[to].sbytes[p]));
                    cr_assert_eq(mxs_host_nvfp4_convert_scales(rows, cols, (mxs_dirs)(p + 1), (mxs_scale_layout)to, dst,
                                                               (mxs_scale_layout)from, back),
                                 MXS_OK);
                    cr_assert_eq(t_first_diff(back, q[from].scale[p], (size_t)q[from].sbytes[p]), -1);
                    free(dst);
                    free(back);
                }
        /* data does not depend on the layout */
        for (p = 0; p < 2; p++) {
            cr_assert_eq(t_first_diff(q[0].data[p], q[1].data[p], (size_t)q[0].dbytes), -1);
            cr_assert_eq(t_first_diff(q[0].data[p], q[2].data[p], (size_t)q[0].dbytes), -1);
        }
        for (from = 0; from < 3; from++) fx_free(&q[from]);
        free(src);
    }
}

Test(nvfp4, padding_scale_entries_are_zero) {
    float src[3 * 20];
    fx f;
    mxs_scale_geom g;
    int64_t off, m, k;
    int j;
    for (j = 0; j < 60; j++) src[j] = 1.0f + (float)j;
    fx_make(&f, 3, 20, MXS_BOTH, MXS_NVFP4_16X16, MXS_SCALES_SWIZZLED);
    cr_assert_eq(mxs_host_nvfp4_quantize(&f.t, src, MXS_F32, MXS_F32), MXS_OK);
    cr_assert(mxs_nvfp4_scale_geom_make(3, 20, MXS_ROWWISE, MXS_SCALES_SWIZZLED, &g));
    for (off = 0; off < mxs_scale_geom_bytes(&g); off++) {
        mxs_scale_geom_coords(&g, off, &m, &k);
        if (m >= 3 || k >= 2)
            cr_assert_eq(f.scale[0][off], 0, "padding (%lld,%lld) - rows 3..15 of the last tile included", (long long)m,
                         (long long)k);
        else
            cr_assert_neq(f.scale[0][off], 0);
    }
    fx_free(&f);
}

/* ---- rejected input writes nothing ---------------------------------------- */

Test(nvfp4, bad_quantize_input_is_rejected_before_any_write) {
    float src[64 * 40];
    fx f;
    mxs_nvfp4_tensor t;
    int j;
    for (j = 0; j < 64 * 40; j++) src[j] = (float)j;
    fx_make(&f, 64, 40, MXS_BOTH, MXS_NVFP4_1X16, MXS_SCALES_PADDED);
#define EXPECT_REJECT(expr, code)                                                                                      \
    do {                                                                                                               \
        t = f.t;                                                                                                       \
        expr;                                                                                                          \
        cr_assert_eq(mxs_host_nvfp4_quantize(&t, src, MXS_F32, MXS_F32), code, "%s", #expr);                           \
        cr_assert(fx_all_poisoned(&f), "%s wrote an output", #expr);                                                   \
    } while (0)
    EXPECT_REJECT(t.dirs = 0, MXS_ERR_INVALID_ARGUMENT);
    EXPECT_REJECT(t.dirs = 4, MXS_ERR_INVALID_ARGUMENT);
    EXPECT_REJECT(t.scale_layout = (mxs_scale_layout)3, MXS_ERR_INVALID_ARGUMENT);
    EXPECT_REJECT(t.block = (mxs_nvfp4_block)2, MXS_ERR_INVALID_ARGUMENT);
    EXPECT_REJECT(t.amax = NULL, MXS_ERR_INVALID_ARGUMENT);
    EXPECT_REJECT(t.rows = 0, MXS_ERR_SHAPE);
    EXPECT_REJECT(t.cols = -1, MXS_ERR_SHAPE);
    EXPECT_REJECT((t.rows = INT64_MAX / 8, t.cols = 16), MXS_ERR_OVERFLOW);
    EXPECT_REJECT(t.row_data = NULL, MXS_ERR_ABSENT_PLANE);
    EXPECT_REJECT(t.col_scale = NULL, MXS_ERR_ABSENT_PLANE);
    EXPECT_REJECT(t.col_data = t.row_data, MXS_ERR_ALIASING);
    EXPECT_REJECT(t.row_scale = t.row_data + 100, MXS_ERR_ALIASING);
    EXPECT_REJECT(t.amax = (float *)(void *)(t.col_scale + 8), MXS_ERR_ALIASING);
    EXPECT_REJECT(t.row_data = (uint8_t *)(void *)(src + 10), MXS_ERR_ALIASING);
    EXPECT_REJECT(t.amax = src + 63 * 40, MXS_ERR_ALIASING);
#undef EXPECT_REJECT
    t = f.t;
    cr_assert_eq(mxs_host_nvfp4_quantize(NULL, src, MXS_F32, MXS_F32), MXS_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mxs_host_nvfp4_quantize(&t, NULL, MXS_F32, MXS_F32), MXS_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mxs_host_nvfp4_quantize(&t, src, (mxs_dtype)3, MXS_F32), MXS_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mxs_host_nvfp4_quantize(&t, src, MXS_F32, (mxs_dtype)-1), MXS_ERR_INVALID_ARGUMENT);
    cr_assert(fx_all_poisoned(&f));
    /* an absent plane's NULL pointers are fine, and its buffers stay untouched */
    t.dirs = MXS_COLWISE;
    t.row_data = NULL;
    t.row_scale = NULL;
    cr_assert_eq(mxs_host_nvfp4_quantize(&t, src, MXS_F32, MXS_F32), MXS_OK);
    cr_assert(t_all_poisoned(f.data[0], (size_t)f.dbytes) && t_all_poisoned(f.scale[0], (size_t)f.sbytes[0]));
    fx_free(&f);
}

Test(nvfp4, bad_dequantize_and_convert_input_is_rejected_before_any_write) {
    float src[20 * 33];
    fx f;
    mxs_nvfp4_tensor t;
    uint8_t *out = t_alloc(20 * 33 * 4), *sc = t_alloc(4096);
    int j;
    for (j = 0; j < 20 * 33; j++) src[j] = (float)j - 300.0f;
    fx_make(&f, 20, 33, MXS_ROWWISE, MXS_NVFP4_16X16, MXS_SCALES_COMPACT);
    cr_assert_eq(mxs_host_nvfp4_quantize(&f.t, src, MXS_F32, MXS_F32), MXS_OK);
    t = f.t;
    cr_assert_eq(mxs_host_nvfp4_dequantize(&t, MXS_COLWISE, out, MXS_F32), MXS_ERR_ABSENT_PLANE);
    cr_assert_eq(mxs_host_nvfp4_dequantize(&t, MXS_BOTH, out, MXS_F32), MXS_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mxs_host_nvfp4_dequantize(&t, MXS_ROWWISE, out, (mxs_dtype)5), MXS_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mxs_host_nvfp4_dequantize(&t, MXS_ROWWISE, NULL, MXS_F32), MXS_ERR_INVALID_ARGUMENT);
    cr_assert_eq(mxs_host_nvfp4_dequantize(NULL, MXS_ROWWISE, out, MXS_F32), MXS_ERR_INVALID_ARGUMENT);
    t.amax = NULL;
    cr_assert_eq(mxs_host_nvfp4_dequantize(&t, MXS_ROWWISE, out, MXS_F32), MXS_ERR_INVALID_ARGUMENT);
    t = f.t;
    t.row_scale = NULL;
    cr_assert_eq(mxs_host_nvfp4_dequantize(&t, MXS_ROWWISE, out, MXS_F32), MXS_ERR_ABSENT_PLANE);
    t = f.t;
    t.rows = 0;
    cr_assert_eq(mxs_host_nvfp4_dequantize(&t, MXS_ROWWISE, out, MXS_F32), MXS_ERR_SHAPE);
    cr_assert(t_all_poisoned(out, 20 * 33 * 4));
    t = f.t;
    cr_assert_eq(mxs_host_nvfp4_dequantize(&t, MXS_ROWWISE, f.data[0] + 3, MXS_BF16), MXS_ERR_ALIASING);
    cr_assert_eq(mxs_host_nvfp4_dequantize(&t, MXS_ROWWISE, f.scale[0], MXS_F32), MXS_ERR_ALIASING);
    cr_assert_eq(mxs_host_nvfp4_dequantize(&t, MXS_ROWWISE, f.amax, MXS_F16), MXS_ERR_ALIASING);
    cr_assert_eq(mxs_host_nvfp4_dequantize(&t, MXS_ROWWISE, out, MXS_F32), MXS_OK);
    cr_assert(t_guard_ok(out, 20 * 33 * 4));
    /* convert */
    cr_assert_eq(mxs_host_nvfp4_convert_scales(20, 33, MXS_ROWWISE, MXS_SCALES_COMPACT, f.scale[0], MXS_SCALES_PADDED,
                                               f.scale[0] + 1),
                 MXS_ERR_ALIASING);
    cr_assert_eq(mxs_host_nvfp4_convert_scales(20, 33, MXS_BOTH, MXS_SCALES_COMPACT, f.scale[0], MXS_SCALES_PADDED, sc),
                 MXS_ERR_INVALID_ARGUMENT);
    cr_assert_eq(
        mxs_host_nvfp4_convert_scales(20, 33, MXS_ROWWISE, (mxs_scale_layout)7, f.scale[0], MXS_SCALES_PADDED, sc),
        MXS_ERR_INVALID_ARGUMENT);
    cr_assert_eq(
        mxs_host_nvfp4_convert_scales(20, 0, MXS_ROWWISE, MXS_SCALES_COMPACT, f.scale[0], MXS_SCALES_PADDED, sc),
        MXS_ERR_SHAPE);
    cr_assert_eq(mxs_host_nvfp4_convert_scales(20, 33, MXS_ROWWISE, MXS_SCALES_COMPACT, NULL, MXS_SCALES_PADDED, sc),
                 MXS_ERR_INVALID_ARGUMENT);
    cr_assert(t_all_poisoned(sc, 4096));
    fx_free(&f);
    free(out);
    free(sc);
}
