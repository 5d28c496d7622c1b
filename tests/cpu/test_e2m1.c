/* SPDX-License-Identifier: MIT */
/* docs/contract.md section 9.2, exhaustively: the host E2M1 rule
 * (mxs_e2m1_from_f32 = mxs__e2m1_sw, nvfp4.h) against the boundary count for
 * every one of the 2^32 f32 bit patterns, in four quarters (Criterion runs
 * them on parallel jobs; built with -O3 whatever the build type, about 6 s of
 * CPU a quarter). The boundary count is the rule's definition written out:
 * the code is the number of boundaries 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5
 * that |x| has passed - strictly for the ties that go down (0.25, 1.25,
 * 2.5, 5: even code below), inclusively for those that go up (0.75, 1.75,
 * 3.5) - compared as f32 bit patterns (monotonic for non-negative floats);
 * the sign bit, and NaN -> 0x7. The device rule and the 8-wide packing are
 * checked the same way on the GPU (tests/cuda/test_nvfp4.cu). */
#include <criterion/criterion.h>
#include <stdint.h>

#include <mxshard/mxshard.h>

static uint32_t boundary_count(uint32_t u) {
    uint32_t a = u & 0x7FFFFFFFu;
    uint32_t q = (uint32_t)(a > 0x3E800000u)    /* > 0.25 */
                 + (uint32_t)(a >= 0x3F400000u) /* >= 0.75 */
                 + (uint32_t)(a > 0x3FA00000u)  /* > 1.25 */
                 + (uint32_t)(a >= 0x3FE00000u) /* >= 1.75 */
                 + (uint32_t)(a > 0x40200000u)  /* > 2.5 */
                 + (uint32_t)(a >= 0x40600000u) /* >= 3.5 */
                 + (uint32_t)(a > 0x40A00000u); /* > 5 (inf included) */
    uint32_t is_nan = 0u - (uint32_t)(a > 0x7F800000u);
    q |= (u >> 28) & 0x8u;
    return (0x7u & is_nan) | (q & ~is_nan);
}

#define CHUNK 4096

/* Mismatches over bit patterns [first, first + count), count % CHUNK == 0;
 * *first_bad: the first pattern that differs. */
static uint64_t mismatches(uint64_t first, uint64_t count, uint32_t *first_bad) {
    static uint32_t got[CHUNK], want[CHUNK];
    uint64_t bad = 0, b;
    uint32_t i;
    for (b = first; b < first + count; b += CHUNK) {
        for (i = 0; i < CHUNK; i++) got[i] = mxs_e2m1_from_f32(mxs_f32_from_bits((uint32_t)(b + i)));
        for (i = 0; i < CHUNK; i++) want[i] = boundary_count((uint32_t)(b + i));
        for (i = 0; i < CHUNK; i++)
            if (got[i] != want[i] && bad++ == 0) *first_bad = (uint32_t)(b + i);
    }
    return bad;
}

static void quarter(uint64_t q) {
    uint32_t first_bad = 0;
    uint64_t bad = mismatches(q << 30, (uint64_t)1 << 30, &first_bad);
    cr_assert_eq(bad, 0, "%llu patterns in quarter %llu differ, the first 0x%08X: rule %X, boundary count %X",
                 (unsigned long long)bad, (unsigned long long)q, first_bad,
                 mxs_e2m1_from_f32(mxs_f32_from_bits(first_bad)), boundary_count(first_bad));
}

Test(e2m1, rule_equals_the_boundary_count_for_every_pattern_0_of_4, .timeout = 600) { quarter(0); }
Test(e2m1, rule_equals_the_boundary_count_for_every_pattern_1_of_4, .timeout = 600) { quarter(1); }
Test(e2m1, rule_equals_the_boundary_count_for_every_pattern_2_of_4, .timeout = 600) { quarter(2); }
Test(e2m1, rule_equals_the_boundary_count_for_every_pattern_3_of_4, .timeout = 600) { quarter(3); }

Test(e2m1, eight_wide_packing_puts_element_j_in_nibble_j) {
    /* every 61st pattern and its next 7, plus the ties and specials */
    static const uint32_t special[8] = {0x3E800000u, 0xBF400000u, 0x3FA00000u, 0x7FC00000u,
                                        0xFF800000u, 0x80000000u, 0x40A00000u, 0xFFFFFFFFu};
    float x[8];
    uint64_t u;
    uint32_t want = 0;
    int j;
    for (j = 0; j < 8; j++) {
        x[j] = mxs_f32_from_bits(special[j]);
        want |= boundary_count(special[j]) << (4 * j);
    }
    cr_assert_eq(mxs_e2m1x8_from_f32(x), want);
    for (u = 0; u + 8 <= 0xFFFFFFFFull; u += 61 * 8) {
        want = 0;
        for (j = 0; j < 8; j++) {
            x[j] = mxs_f32_from_bits((uint32_t)(u + (uint64_t)j * 7919u));
            want |= (uint32_t)mxs_e2m1_from_f32(x[j]) << (4 * j);
        }
        cr_assert_eq(mxs_e2m1x8_from_f32(x), want, "at 0x%08llX", (unsigned long long)u);
    }
}
