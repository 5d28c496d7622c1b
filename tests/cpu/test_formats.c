/* SPDX-License-Identifier: MIT */
/* docs/contract.md section 1: every oracle vector, and the NaN / inf rules. */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mxshard/mxshard.h>

#include "common.h"

static FILE *open_vectors(const char *name) {
    char path[1024];
    const char *dir = getenv("MXS_VECTORS_DIR");
    snprintf(path, sizeof path, "%s/%s", dir ? dir : MXS_VECTORS_DIR, name);
    return fopen(path, "r");
}

Test(formats, e4m3_from_f32_matches_every_oracle_vector) {
    FILE *f = open_vectors("e4m3_from_f32.txt");
    char line[256];
    long n = 0, bad = 0;
    cr_assert_not_null(f, "tests/vectors/e4m3_from_f32.txt is missing");
    while (fgets(line, sizeof line, f)) {
        unsigned bits, want;
        if (line[0] == '#' || sscanf(line, "%x %x", &bits, &want) != 2) continue;
        n++;
        if (mxs_e4m3_from_f32(mxs_f32_from_bits(bits)) != want) bad++;
    }
    fclose(f);
    cr_assert_gt(n, 100000, "only %ld vectors read", n);
    cr_assert_eq(bad, 0, "%ld of %ld E4M3 conversions differ from the oracle", bad, n);
}

Test(formats, e8m0_up_and_down_match_every_oracle_vector) {
    FILE *f = open_vectors("e8m0_from_f32.txt");
    char line[256];
    long n = 0, bad = 0;
    cr_assert_not_null(f, "tests/vectors/e8m0_from_f32.txt is missing");
    while (fgets(line, sizeof line, f)) {
        unsigned bits, up, down;
        if (line[0] == '#' || sscanf(line, "%x %x %x", &bits, &up, &down) != 3) continue;
        n++;
        if (mxs_e8m0_up(mxs_f32_from_bits(bits)) != up || mxs_e8m0_down(mxs_f32_from_bits(bits)) != down) bad++;
    }
    fclose(f);
    cr_assert_gt(n, 50000, "only %ld vectors read", n);
    cr_assert_eq(bad, 0, "%ld of %ld E8M0 conversions differ from the oracle", bad, n);
}

/* Reads every "F32BITS UP DOWN" line of e8m0_from_f32.txt. */
static long read_e8m0_vectors(uint32_t **bits, uint8_t **up, uint8_t **down) {
    FILE *f = open_vectors("e8m0_from_f32.txt");
    char line[256];
    long n = 0, cap = 1 << 17;
    *bits = malloc((size_t)cap * sizeof **bits);
    *up = malloc((size_t)cap);
    *down = malloc((size_t)cap);
    if (!f || !*bits || !*up || !*down) return -1;
    while (fgets(line, sizeof line, f)) {
        unsigned b, u, d;
        if (line[0] == '#' || sscanf(line, "%x %x %x", &b, &u, &d) != 3) continue;
        if (n == cap) {
            cap *= 2;
            *bits = realloc(*bits, (size_t)cap * sizeof **bits);
            *up = realloc(*up, (size_t)cap);
            *down = realloc(*down, (size_t)cap);
            if (!*bits || !*up || !*down) return -1;
        }
        (*bits)[n] = b;
        (*up)[n] = (uint8_t)u;
        (*down)[n] = (uint8_t)d;
        n++;
    }
    fclose(f);
    return n;
}

Test(formats, e4m3_to_f32_decodes_every_code_like_the_oracle) {
    FILE *f = open_vectors("e4m3_to_f32.txt");
    char line[256];
    int seen[256] = {0};
    long n = 0, bad = 0;
    cr_assert_not_null(f, "tests/vectors/e4m3_to_f32.txt is missing");
    while (fgets(line, sizeof line, f)) {
        unsigned q, bits;
        float got, want;
        if (line[0] == '#' || sscanf(line, "%x %x", &q, &bits) != 2) continue;
        cr_assert_lt(q, 256u);
        n++;
        seen[q] = 1;
        got = mxs_e4m3_to_f32((uint8_t)q);
        want = mxs_f32_from_bits(bits);
        if (isnan(want) ? !isnan(got) : mxs_f32_bits(got) != bits) bad++;
    }
    fclose(f);
    cr_assert_eq(n, 256, "expected all 256 codes, read %ld", n);
    for (n = 0; n < 256; n++) cr_assert(seen[n], "code 0x%02lx missing from the vectors", n);
    cr_assert_eq(bad, 0, "%ld codes decode differently from the oracle", bad);
    cr_assert(isnan(mxs_e4m3_to_f32(0x7F)) && isnan(mxs_e4m3_to_f32(0xFF)));
}

Test(formats, e4m3_encode_of_decode_is_identity_for_every_non_nan_code) {
    unsigned q;
    for (q = 0; q < 256; q++) {
        uint8_t back = mxs_e4m3_from_f32(mxs_e4m3_to_f32((uint8_t)q));
        if ((q & 0x7F) == 0x7F)
            cr_assert_eq(back, MXS_E4M3_NAN, "NaN code 0x%02x re-encodes to 0x%02x", q, back);
        else
            cr_assert_eq(back, q, "code 0x%02x re-encodes to 0x%02x", q, back);
    }
}

Test(formats, e4m3_infinities_saturate_to_plus_minus_448) {
    cr_assert_eq(mxs_e4m3_from_f32(INFINITY), 0x7E);
    cr_assert_eq(mxs_e4m3_from_f32(-INFINITY), 0xFE);
    cr_assert_eq(mxs_e4m3_from_f32(448.0f), 0x7E);
    cr_assert_eq(mxs_e4m3_from_f32(-448.0f), 0xFE);
    cr_assert_eq(mxs_e4m3_from_f32(464.0f), 0x7E, "the 448/480 midpoint saturates");
    cr_assert_eq(mxs_e4m3_from_f32(480.0f), 0x7E);
    cr_assert_eq(mxs_e4m3_from_f32(FLT_MAX), 0x7E);
    cr_assert_eq(mxs_e4m3_from_f32(-FLT_MAX), 0xFE);
    cr_assert_eq(mxs_e4m3_to_f32(0x7E), 448.0f);
}

Test(formats, e4m3_any_nan_becomes_0x7f) {
    const uint32_t nans[] = {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFF800001u,
                             0x7FFFFFFFu, 0xFFFFFFFFu, 0x7FA00000u, 0xFFBFFFFFu};
    size_t k;
    for (k = 0; k < sizeof nans / sizeof nans[0]; k++)
        cr_assert_eq(mxs_e4m3_from_f32(mxs_f32_from_bits(nans[k])), MXS_E4M3_NAN, "NaN 0x%08x", nans[k]);
}

Test(formats, e4m3_signed_zero_keeps_its_sign) {
    cr_assert_eq(mxs_e4m3_from_f32(0.0f), 0x00);
    cr_assert_eq(mxs_e4m3_from_f32(-0.0f), 0x80);
    cr_assert_eq(mxs_e4m3_from_f32(-1e-30f), 0x80, "a negative value that rounds to zero is -0");
    cr_assert_eq(mxs_e4m3_from_f32(ldexpf(1.0f, -10)), 0x00, "half the smallest subnormal ties to even 0");
    cr_assert_eq(mxs_e4m3_from_f32(ldexpf(1.5f, -10)), 0x01);
}

Test(formats, e8m0_from_amax_ceil_is_e8m0_up_of_amax_times_fl32_reciprocal_of_448) {
    uint32_t *bits;
    uint8_t *up, *down;
    long n = read_e8m0_vectors(&bits, &up, &down), i, bad = 0;
    volatile float recip = 1.0f / 448.0f;
    cr_assert_gt(n, 50000, "e8m0 vectors unreadable");
    cr_assert_eq(mxs_f32_bits(recip), 0x3B124925u, "fl32(1/448)");
    for (i = 0; i < n; i++) {
        float amax = mxs_f32_from_bits(bits[i]);
        if (isnan(amax)) continue;
        if (mxs_e8m0_from_amax(amax, MXS_ROUND_CEIL) != mxs_e8m0_up(amax * recip)) bad++;
    }
    /* spot values: 448 * 2^k is exactly representable -> exactly 2^k */
    cr_assert_eq(mxs_e8m0_from_amax(448.0f, MXS_ROUND_CEIL), 127);
    cr_assert_eq(mxs_e8m0_from_amax(449.0f, MXS_ROUND_CEIL), 128);
    cr_assert_eq(mxs_e8m0_from_amax(0.0f, MXS_ROUND_CEIL), 0);
    cr_assert_eq(mxs_e8m0_from_amax(INFINITY, MXS_ROUND_CEIL), 0xFE);
    cr_assert_eq(mxs_e8m0_from_amax(FLT_MAX, MXS_ROUND_CEIL), 247, "FLT_MAX/448 = 1.14 * 2^119 -> 2^120");
    free(bits), free(up), free(down);
    cr_assert_eq(bad, 0, "%ld of %ld CEIL exponents differ", bad, n);
}

Test(formats, e8m0_from_amax_floor_is_clamped_e8m0_down_minus_8) {
    uint32_t *bits;
    uint8_t *up, *down;
    long n = read_e8m0_vectors(&bits, &up, &down), i, bad = 0;
    cr_assert_gt(n, 50000, "e8m0 vectors unreadable");
    for (i = 0; i < n; i++) {
        float amax = mxs_f32_from_bits(bits[i]);
        int want = (int)down[i] - 8;
        if (isnan(amax)) continue;
        want = want < 0 ? 0 : (want > 254 ? 254 : want);
        if (mxs_e8m0_from_amax(amax, MXS_ROUND_FLOOR) != want) bad++;
    }
    cr_assert_eq(mxs_e8m0_from_amax(448.0f, MXS_ROUND_FLOOR), 127);
    cr_assert_eq(mxs_e8m0_from_amax(511.0f, MXS_ROUND_FLOOR), 127);
    cr_assert_eq(mxs_e8m0_from_amax(512.0f, MXS_ROUND_FLOOR), 128);
    cr_assert_eq(mxs_e8m0_from_amax(0.0f, MXS_ROUND_FLOOR), 0);
    cr_assert_eq(mxs_e8m0_from_amax(INFINITY, MXS_ROUND_FLOOR), 0xFE - 8);
    free(bits), free(up), free(down);
    cr_assert_eq(bad, 0, "%ld of %ld FLOOR exponents differ", bad, n);
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

Test(formats, e8m0_from_amax_is_monotonic_and_maps_zero_to_0x00) {
    uint32_t *bits;
    uint8_t *up, *down;
    long n = read_e8m0_vectors(&bits, &up, &down), i, m = 0;
    int r;
    cr_assert_gt(n, 50000, "e8m0 vectors unreadable");
    /* non-negative, non-NaN inputs: their bit patterns order like the floats */
    for (i = 0; i < n; i++)
        if ((bits[i] & 0x80000000u) == 0 && bits[i] <= 0x7F800000u) bits[m++] = bits[i];
    qsort(bits, (size_t)m, sizeof *bits, cmp_u32);
    cr_assert_gt(m, 50000);
    for (r = MXS_ROUND_CEIL; r <= MXS_ROUND_FLOOR; r++) {
        uint8_t prev = mxs_e8m0_from_amax(0.0f, (mxs_rounding)r);
        cr_assert_eq(prev, 0x00, "amax 0 must map to 0x00 (rounding %d)", r);
        for (i = 0; i < m; i++) {
            uint8_t e = mxs_e8m0_from_amax(mxs_f32_from_bits(bits[i]), (mxs_rounding)r);
            cr_assert_geq(e, prev, "rounding %d: not monotonic at 0x%08x", r, bits[i]);
            cr_assert_neq(e, 0xFF, "rounding %d: a finite amax gave the NaN scale", r);
            prev = e;
        }
    }
    free(bits), free(up), free(down);
}

Test(formats, quant_multiplier_bits_for_every_exponent) {
    int e;
    for (e = 0; e < 256; e++) {
        uint32_t got = mxs_f32_bits(mxs_e8m0_quant_mult((uint8_t)e));
        if (e <= 253)
            cr_assert_eq(got, (uint32_t)(254 - e) << 23, "e=%d", e);
        else if (e == 254)
            cr_assert_eq(got, 0x00400000u, "e=254 is 2^-127");
        else
            cr_assert(isnan(mxs_e8m0_quant_mult(255)), "e=255 is NaN");
    }
    cr_assert_eq(mxs_e8m0_quant_mult(127), 1.0f);
    cr_assert_eq(mxs_e8m0_quant_mult(0), ldexpf(1.0f, 127));
}

Test(formats, dequant_factor_is_two_to_the_e_minus_127) {
    int e, q;
    for (e = 0; e < 255; e++) {
        float f = mxs_e8m0_to_f32((uint8_t)e);
        cr_assert_eq(mxs_f32_bits(f), mxs_f32_bits(ldexpf(1.0f, e - 127)), "e=%d", e);
        cr_assert_eq(f * mxs_e8m0_quant_mult((uint8_t)e), 1.0f, "multiplier and factor are inverse, e=%d", e);
    }
    cr_assert(isnan(mxs_e8m0_to_f32(255)));
    /* x' = e4m3_to_f32(q) * 2^(e-127), in f32, for every (q, e) */
    for (e = 0; e < 256; e++) {
        for (q = 0; q < 256; q++) {
            float got = mxs_dequantize_elem((uint8_t)q, (uint8_t)e);
            float want = mxs_e4m3_to_f32((uint8_t)q) * (e == 255 ? NAN : ldexpf(1.0f, e - 127));
            if (isnan(want))
                cr_assert(isnan(got), "q=0x%02x e=%d", q, e);
            else
                cr_assert_eq(mxs_f32_bits(got), mxs_f32_bits(want), "q=0x%02x e=%d", q, e);
        }
    }
}

Test(formats, quantize_elem_is_e4m3_of_fl32_product) {
    t_rng rng = t_rng_seed(11);
    int k;
    for (k = 0; k < 200000; k++) {
        float x = t_rand_f32(&rng, (int)t_between(&rng, -130, 130));
        uint8_t e = (uint8_t)t_below(&rng, 255);
        float s = mxs_e8m0_quant_mult(e);
        cr_assert_eq(mxs_quantize_elem(x, s), mxs_e4m3_from_f32(x * ldexpf(1.0f, 127 - e)), "x=0x%08x e=%d",
                     mxs_f32_bits(x), e);
    }
}

Test(formats, bf16_round_trips_every_code) {
    uint32_t h;
    for (h = 0; h < 65536; h++) {
        float f = mxs_bf16_to_f32((uint16_t)h);
        cr_assert_eq(mxs_f32_bits(f), h << 16, "bf16 0x%04x widens exactly", h);
        if ((h & 0x7FFFu) > 0x7F80u) {
            uint16_t back = mxs_bf16_from_f32(f);
            cr_assert((back & 0x7FFFu) > 0x7F80u, "NaN 0x%04x stays NaN (got 0x%04x)", h, back);
        } else {
            cr_assert_eq(mxs_bf16_from_f32(f), h, "bf16 0x%04x", h);
        }
    }
}

Test(formats, bf16_rounds_to_nearest_even_at_every_midpoint) {
    uint32_t h, sign;
    for (sign = 0; sign < 2; sign++) {
        for (h = 0; h < 0x7F80u; h++) { /* every finite magnitude, incl. the midpoint to inf */
            uint32_t s = sign << 31, mid = s | (h << 16) | 0x8000u;
            uint16_t even = (uint16_t)((sign << 15) | ((h & 1u) ? h + 1 : h));
            cr_assert_eq(mxs_bf16_from_f32(mxs_f32_from_bits(mid)), even, "tie above 0x%04x", h);
            cr_assert_eq(mxs_bf16_from_f32(mxs_f32_from_bits(mid - 1)), (uint16_t)((sign << 15) | h));
            cr_assert_eq(mxs_bf16_from_f32(mxs_f32_from_bits(mid + 1)), (uint16_t)((sign << 15) | (h + 1)));
        }
    }
}

/* Independent f16 decode: sign * m * 2^(e-25) with the implicit bit. */
static float f16_value(uint16_t h) {
    int e = (h >> 10) & 31, m = h & 1023;
    float v;
    if (e == 31)
        v = m ? NAN : INFINITY;
    else if (e == 0)
        v = ldexpf((float)m, -24);
    else
        v = ldexpf((float)(m | 1024), e - 25);
    return (h & 0x8000u) ? -v : v;
}

Test(formats, f16_round_trips_every_code) {
    uint32_t h;
    for (h = 0; h < 65536; h++) {
        float f = mxs_f16_to_f32((uint16_t)h), want = f16_value((uint16_t)h);
        if ((h & 0x7FFFu) > 0x7C00u) {
            uint16_t back = mxs_f16_from_f32(f);
            cr_assert(isnan(f), "f16 NaN 0x%04x widens to NaN", h);
            cr_assert((back & 0x7FFFu) > 0x7C00u, "NaN 0x%04x stays NaN (got 0x%04x)", h, back);
        } else {
            cr_assert_eq(mxs_f32_bits(f), mxs_f32_bits(want), "f16 0x%04x widens exactly", h);
            cr_assert_eq(mxs_f16_from_f32(f), h, "f16 0x%04x", h);
        }
    }
}

Test(formats, f16_rounds_to_nearest_even_at_every_midpoint) {
    uint32_t h, sign;
    for (sign = 0; sign < 2; sign++) {
        for (h = 0; h < 0x7C00u; h++) { /* every finite magnitude; 0x7BFF's upper tie overflows to inf */
            uint16_t lo = (uint16_t)((sign << 15) | h), hi = (uint16_t)((sign << 15) | (h + 1));
            float a = f16_value(lo), b = h + 1 == 0x7C00u ? (sign ? -65536.0f : 65536.0f) : f16_value(hi);
            float mid = (float)(((double)a + (double)b) / 2); /* 12 significant bits: exact */
            uint32_t mb = mxs_f32_bits(mid);
            cr_assert_eq(mxs_f16_from_f32(mid), (h & 1u) ? hi : lo, "tie above 0x%04x", lo);
            cr_assert_eq(mxs_f16_from_f32(mxs_f32_from_bits(mb - 1)), lo, "just below the tie above 0x%04x", lo);
            cr_assert_eq(mxs_f16_from_f32(mxs_f32_from_bits(mb + 1)), hi, "just above the tie above 0x%04x", lo);
        }
    }
    cr_assert_eq(mxs_f16_from_f32(1e10f), 0x7C00);
    cr_assert_eq(mxs_f16_from_f32(-INFINITY), 0xFC00);
    cr_assert_eq(mxs_f16_from_f32(ldexpf(1.0f, -26)), 0x0000, "below half the smallest subnormal");
    cr_assert_eq(mxs_f16_from_f32(-ldexpf(1.0f, -25)), 0x8000, "tie to even zero keeps the sign");
}

Test(formats, amax_ignores_nan_and_all_nan_block_has_scale_0x00) {
    float amax = 0.0f;
    const float vals[] = {NAN, -3.0f, -NAN, 2.0f, NAN};
    size_t k;
    for (k = 0; k < sizeof vals / sizeof vals[0]; k++) amax = mxs_amax_step(amax, vals[k]);
    cr_assert_eq(amax, 3.0f, "NaNs are ignored, |-3| wins");
    amax = 0.0f;
    for (k = 0; k < 32; k++) amax = mxs_amax_step(amax, k & 1 ? NAN : -NAN);
    cr_assert_eq(mxs_f32_bits(amax), 0u, "an all-NaN block has amax +0");
    cr_assert_eq(mxs_amax_step(0.0f, -INFINITY), INFINITY);
    {
        /* through the public quantize: an all-NaN 1x32 block, both planes */
        float src[32];
        uint8_t rd[32], rs[1], cd[32], cs[32];
        mxs_tensor t;
        int r;
        for (k = 0; k < 32; k++) src[k] = k % 3 ? NAN : -NAN;
        for (r = MXS_ROUND_CEIL; r <= MXS_ROUND_FLOOR; r++) {
            memset(&t, 0, sizeof t);
            t.rows = 1;
            t.cols = 32;
            t.dirs = MXS_BOTH;
            t.row_data = rd, t.row_scale = rs, t.col_data = cd, t.col_scale = cs;
            memset(rs, 0xA5, sizeof rs);
            cr_assert_eq(mxs_host_quantize(&t, src, MXS_F32, (mxs_rounding)r), MXS_OK);
            cr_assert_eq(rs[0], 0x00, "all-NaN row block: scale 0x00, got 0x%02x", rs[0]);
            for (k = 0; k < 32; k++) {
                cr_assert_eq(cs[k], 0x00, "single-NaN column block: scale 0x00");
                cr_assert_eq(rd[k], MXS_E4M3_NAN);
                cr_assert_eq(cd[k], MXS_E4M3_NAN);
            }
        }
    }
}
