/* SPDX-License-Identifier: MIT */
/* docs/contract.md section 9: NVFP4. The E2M1 oracle vectors (every line),
 * the E2M1 decode and packing order, the scale formulas on hand-computed
 * cases, and whole-tensor quantize / dequantize / scale-layout conversion
 * against a naive reference written from the contract's formulas, over
 * random shapes (1-element dims, non-multiples of 16), every plane set, both
 * block shapes, every layout, every source dtype and round-through. Every
 * output is poisoned and followed by guard bytes; rejected calls must leave
 * every output poisoned.
 *
 * This file: E2M1 and the scale formulas. The reference lives in nvfp4_ref.h,
 * the fixture in nvfp4_fixture.h; whole-tensor quantize and dequantize are
 * tested in test_nvfp4_quantize.c, the scale layouts in test_nvfp4_layouts.c,
 * rejected input in test_nvfp4_rejected.c. */
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
#include "nvfp4_fixture.h"
#include "nvfp4_ref.h"

static FILE *open_vectors(const char *name) {
    char path[1024];
    const char *dir = getenv("MXS_VECTORS_DIR");
    snprintf(path, sizeof path, "%s/%s", dir ? dir : MXS_VECTORS_DIR, name);
    return fopen(path, "r");
}

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
