/* SPDX-License-Identifier: MIT */
/* mxshard/formats.h - the scalar number formats of MXFP8 (docs/contract.md section 1).
 *
 *   E4M3  element   s eeee mmm   bias 7, max finite +-448 (0x7E/0xFE),
 *                                NaN 0x7F/0xFF, no infinities,
 *                                subnormals m * 2^-9 (e = 0)
 *   E8M0  scale     eeeeeeee     value 2^(e-127), 0xFF = NaN, no sign, no zero
 *   bf16 / f16      raw uint16_t bit patterns, round to nearest even
 *
 * Every function here is MXS_HOST_DEVICE: the CUDA kernels include this very
 * header, so host and device agree bit for bit by construction. Only integer
 * operations and single, separately rounded f32 multiplies are used: there is
 * no float add that a compiler could contract with a multiply into an FMA,
 * and nothing depends on the FTZ/DAZ state for correctness of the integer
 * paths (the f32 multiplies do: build without fast-math / FTZ).
 */
#ifndef MXSHARD_FORMATS_H
#define MXSHARD_FORMATS_H

#include "config.h"
#if !defined(__CUDA_ARCH__)
#include <math.h> /* fabsf: a compiler builtin, no libm needed */
#include <string.h>
#endif
#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#endif

/* On sm_89 and newer the device code uses the conversion instructions that
 * docs/contract.md section 1 names as the rules (cvt.rn.satfinite.e4m3x2.f32,
 * cvt.rn.bf16.f32, max.f32); everywhere else the integer code below. The
 * `cuda` test suite checks the two byte for byte, specials included. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define MXS_DEVICE_CVT 1
#endif

MXS_EXTERN_C_BEGIN

/* Input element types. bf16 and f16 are passed as raw uint16_t bits. */
typedef enum { MXS_F32 = 0, MXS_BF16 = 1, MXS_F16 = 2 } mxs_dtype;

/* amax -> E8M0 rounding (docs/contract.md section 1). MXS_ROUND_CEIL is the default. */
typedef enum { MXS_ROUND_CEIL = 0, MXS_ROUND_FLOOR = 1 } mxs_rounding;

#define MXS_BLOCK 32        /* elements per MX block */
#define MXS_E4M3_MAX 448.0f /* largest finite E4M3 */
#define MXS_E4M3_MAX_CODE 0x7Eu
#define MXS_E4M3_NAN 0x7Fu
#define MXS_E8M0_NAN 0xFFu
#define MXS_E8M0_MAX 0xFEu
#define MXS_E4M3_EMAX 8 /* exponent of E4M3's largest binade (448 = 1.75 * 2^8) */

/* ---- bit casts ---------------------------------------------------------- */

MXS_HD uint32_t mxs_f32_bits(float x) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(x);
#else
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
#endif
}

MXS_HD float mxs_f32_from_bits(uint32_t u) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
#endif
}

/* ---- f32 -> E4M3: round to nearest even, satfinite ---------------------- */

/* cvt.rn.satfinite.e4m3x2.f32: |x| >= 448 and +-inf -> +-448, NaN -> 0x7F,
 * -0.0 -> 0x80. Branch-free (selects only), so loops over it vectorise.
 *
 *   normal    (|x| >= 2^-6): keep the f32 exponent and the top 3 mantissa
 *             bits; round the dropped 20 bits to nearest even by adding
 *             0x7FFFF + lsb and truncating (a carry bumps the exponent);
 *             rebias 127 -> 7, i.e. subtract 120 << 3 from (bits >> 20).
 *   subnormal (|x| <  2^-6): q = RNE(|x| / 2^-9). The ulp of 2^14 is 2^-9,
 *             so the f32 sum |x| + 2^14 is rounded (to nearest even) to a
 *             multiple of 2^-9 and its low bits are q. The addend is a bit
 *             pattern, never a product, so no FMA contraction can change it;
 *             a flushed (FTZ) subnormal |x| gives the same q = 0.       */
MXS_HD uint8_t mxs_e4m3_from_f32(float x) {
#if defined(MXS_DEVICE_CVT)
    /* the instruction itself; it gives 0xFF for a negative NaN: fold to 0x7F */
    uint32_t q = (uint32_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
    return (uint8_t)(q == 0xFFu ? MXS_E4M3_NAN : q);
#else
    uint32_t u = mxs_f32_bits(x);
    uint32_t sign = (u >> 24) & 0x80u;
    uint32_t a = u & 0x7FFFFFFFu;
    uint32_t q_norm = ((a + 0x7FFFFu + ((a >> 20) & 1u)) >> 20) - (120u << 3);
    uint32_t q_sub = mxs_f32_bits(mxs_f32_from_bits(a) + 16384.0f) - 0x46800000u; /* 2^14 */
    /* all-ones / all-zeros masks rather than ?: so compilers vectorise */
    uint32_t is_norm = 0u - (uint32_t)(a >= 0x3C800000u); /* >= 2^-6 */
    uint32_t is_sat = 0u - (uint32_t)(a >= 0x43E00000u);  /* >= 448, incl. inf */
    uint32_t is_nan = 0u - (uint32_t)(a > 0x7F800000u);
    uint32_t q = (q_norm & is_norm) | (q_sub & ~is_norm);
    q = ((MXS_E4M3_MAX_CODE & is_sat) | (q & ~is_sat)) | sign;
    return (uint8_t)((MXS_E4M3_NAN & is_nan) | (q & ~is_nan));
#endif
}

/* Four conversions packed little-endian (a in the low byte): what vector
 * stores want. On the device two cvt...e4m3x2 instructions. */
MXS_HD uint32_t mxs_e4m3x4_from_f32(float a, float b, float c, float d) {
#if defined(MXS_DEVICE_CVT)
    uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
    uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(c, d), __NV_SATFINITE, __NV_E4M3);
    uint32_t w = lo | (hi << 16);
    return w ^ (__vcmpeq4(w, 0xFFFFFFFFu) & 0x80808080u); /* 0xFF -> 0x7F */
#else
    return (uint32_t)mxs_e4m3_from_f32(a) | ((uint32_t)mxs_e4m3_from_f32(b) << 8) |
           ((uint32_t)mxs_e4m3_from_f32(c) << 16) | ((uint32_t)mxs_e4m3_from_f32(d) << 24);
#endif
}

/* E4M3 -> f32, exact. 0x7F / 0xFF decode to a quiet NaN. */
MXS_HD float mxs_e4m3_to_f32(uint8_t q) {
    uint32_t sign = (uint32_t)(q & 0x80u) << 24;
    uint32_t e = (q >> 3) & 0xFu;
    uint32_t m = q & 7u;
    if (e == 15u && m == 7u) return mxs_f32_from_bits(sign | 0x7FC00000u);
    if (e == 0u) {
        /* m * 2^-9, exact: a 3-bit integer times a power of two */
        float v = (float)m * 0.001953125f;
        return sign ? -v : v;
    }
    return mxs_f32_from_bits(sign | ((e + 120u) << 23) | (m << 20));
}

/* ---- E8M0 ---------------------------------------------------------------- */

/* e8m0_up(v): smallest E8M0 value >= |v|, saturating (cvt.rp.satfinite.ue8m0):
 * 0 -> 0x00, >= 2^127 or inf -> 0xFE, NaN -> 0xFF. The sign is ignored, as
 * NVIDIA's own host implementation does. */
MXS_HD uint8_t mxs_e8m0_up(float v) {
    uint32_t a = mxs_f32_bits(v) & 0x7FFFFFFFu;
    uint32_t e = a >> 23;
    uint32_t m = a & 0x7FFFFFu;
    if (a > 0x7F800000u) return (uint8_t)MXS_E8M0_NAN;
    if (e == 0u) return (uint8_t)(m > 0x400000u ? 1u : 0u); /* f32 subnormal: 2^-127 or 2^-126 */
    e += (m != 0u);
    return (uint8_t)(e > MXS_E8M0_MAX ? MXS_E8M0_MAX : e);
}

/* e8m0_down(v): largest E8M0 value <= |v| (truncate), saturating
 * (cvt.rz.satfinite.ue8m0): below 2^-127 -> 0x00, inf -> 0xFE, NaN -> 0xFF. */
MXS_HD uint8_t mxs_e8m0_down(float v) {
    uint32_t a = mxs_f32_bits(v) & 0x7FFFFFFFu;
    uint32_t e = a >> 23;
    if (a > 0x7F800000u) return (uint8_t)MXS_E8M0_NAN;
    return (uint8_t)(e > MXS_E8M0_MAX ? MXS_E8M0_MAX : e);
}

/* amax -> block scale exponent (docs/contract.md section 1).
 *   CEIL : e = e8m0_up(fl32(amax * fl32(1/448)))   (TE, hardware cvt.rp)
 *   FLOOR: e = clamp(e8m0_down(amax) - 8, 0, 254)   (OCP MX v1.0)
 * Monotonic in |amax| and maps 0 to 0x00, which is what makes the one-byte
 * MAX reduction of partial exponents exact (docs/contract.md section 3). A NaN amax gives
 * 0xFF with both roundings (the library never produces one: amax ignores NaN). */
MXS_HD uint8_t mxs_e8m0_from_amax(float amax, mxs_rounding r) {
    if (r == MXS_ROUND_FLOOR) {
        uint32_t d = mxs_e8m0_down(amax);
        if (d == MXS_E8M0_NAN) return (uint8_t)MXS_E8M0_NAN;
        return (uint8_t)(d < (uint32_t)MXS_E4M3_EMAX ? 0u : d - (uint32_t)MXS_E4M3_EMAX);
    }
    return mxs_e8m0_up(amax * (1.0f / 448.0f));
}

/* Quantization multiplier s = 2^(127-e): bits (254-e) << 23 for e <= 253,
 * 2^-127 (the f32 subnormal 0x00400000) for e = 254, NaN for e = 255. */
MXS_HD float mxs_e8m0_quant_mult(uint8_t e) {
    uint32_t bits = e <= 253u ? (254u - e) << 23 : (e == 254u ? 0x00400000u : 0x7FC00000u);
    return mxs_f32_from_bits(bits);
}

/* Dequantization factor 2^(e-127): 2^-127 (subnormal) for e = 0, NaN for 255. */
MXS_HD float mxs_e8m0_to_f32(uint8_t e) {
    uint32_t bits = e == 0u ? 0x00400000u : (e == 255u ? 0x7FC00000u : (uint32_t)e << 23);
    return mxs_f32_from_bits(bits);
}

/* One element: E4M3(fl32(x * s)). */
MXS_HD uint8_t mxs_quantize_elem(float x, float quant_mult) { return mxs_e4m3_from_f32(x * quant_mult); }

/* x' = e4m3_to_f32(q) * 2^(e-127), in f32. */
MXS_HD float mxs_dequantize_elem(uint8_t q, uint8_t e) {
    /* NaN results are produced explicitly: the payload a multiply gives a
     * NaN differs between CPUs (the NaN operand's) and GPUs (0x7FFFFFFF).
     * The bits chosen are what x86 gives: E4M3 NaN -> its sign | 0x7FC00000,
     * NaN scale -> 0x7FC00000. */
    if ((q & 0x7Fu) == MXS_E4M3_NAN) return mxs_f32_from_bits(((uint32_t)(q & 0x80u) << 24) | 0x7FC00000u);
    if (e == MXS_E8M0_NAN) return mxs_f32_from_bits(0x7FC00000u);
    return mxs_e4m3_to_f32(q) * mxs_e8m0_to_f32(e);
}

/* Block amax (docs/contract.md section 1): IEEE maxNum of |x| - NaN ignored, like
 * fmaxf - without libm. Start from 0; an all-NaN or empty block stays 0.
 * On the host `a > amax ? a : amax` is exactly that (a NaN compares false)
 * and is what SSE's maxps computes, so loops over it vectorise; on the
 * device fmaxf is one instruction. */
MXS_HD float mxs_amax_step(float amax, float x) {
#if defined(__CUDA_ARCH__)
    return fmaxf(amax, fabsf(x));
#else
    float a = fabsf(x);
    return a > amax ? a : amax;
#endif
}

/* ---- bf16 / f16 ---------------------------------------------------------- */

MXS_HD float mxs_bf16_to_f32(uint16_t h) { return mxs_f32_from_bits((uint32_t)h << 16); }

/* f32 -> bf16, round to nearest even; NaN stays NaN (quiet bit set). */
MXS_HD uint16_t mxs_bf16_from_f32(float x) {
    uint32_t u = mxs_f32_bits(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x0040u);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/* f16 -> f32, exact. */
MXS_HD float mxs_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1Fu;
    uint32_t m = h & 0x3FFu;
    if (e == 0u) {
        float v = (float)m * 5.9604644775390625e-8f; /* m * 2^-24, exact */
        return sign ? -v : v;
    }
    if (e == 31u) return mxs_f32_from_bits(sign | 0x7F800000u | (m << 13));
    return mxs_f32_from_bits(sign | ((e + 112u) << 23) | (m << 13));
}

/* f32 -> f16, round to nearest even, overflow to inf, NaN stays NaN. */
MXS_HD uint16_t mxs_f16_from_f32(float x) {
    uint32_t u = mxs_f32_bits(x);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return (uint16_t)(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
    if (a >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u); /* >= 65520 rounds to inf */
    if (a >= 0x38800000u) {                                  /* >= 2^-14: normal */
        uint32_t h = ((a + 0xFFFu + ((a >> 13) & 1u)) >> 13) - (112u << 10);
        return (uint16_t)(sign | h);
    }
    {
        uint32_t e = a >> 23;
        uint32_t m = (a & 0x7FFFFFu) | (e ? 0x800000u : 0u);
        uint32_t shift = 126u - e; /* value / 2^-24 = m * 2^(e-126); e <= 112 */
        shift = shift > 31u ? 31u : shift;
        return (uint16_t)(sign | ((m + ((1u << (shift - 1u)) - 1u) + ((m >> shift) & 1u)) >> shift));
    }
}

/* Widen element i of a source array of the given dtype. Hot loops should not
 * dispatch per element; they use the typed loaders below via a per-call
 * switch. This one is for cold paths. */
MXS_HD float mxs_load_f32(const void *src, mxs_dtype dtype, int64_t i) {
    switch (dtype) {
    case MXS_BF16: return mxs_bf16_to_f32(((const uint16_t *)src)[i]);
    case MXS_F16: return mxs_f16_to_f32(((const uint16_t *)src)[i]);
    default: return ((const float *)src)[i];
    }
}

/* Round-through (docs/contract.md section 1): round a widened master value to the model
 * dtype first, as Transformer Engine does. MXS_F32 means "no rounding". The
 * result is used as a value: a NaN stays a NaN, its payload unspecified. */
MXS_HD float mxs_round_through(float x, mxs_dtype to) {
#if defined(MXS_DEVICE_CVT)
    /* cvt.rn.bf16.f32 is mxs_bf16_from_f32 for every non-NaN (a NaN stays a
     * NaN; its payload never reaches an E4M3 output) */
    if (to == MXS_BF16) return __bfloat162float(__float2bfloat16_rn(x));
#endif
    if (to == MXS_BF16) return mxs_bf16_to_f32(mxs_bf16_from_f32(x));
    if (to == MXS_F16) return mxs_f16_to_f32(mxs_f16_from_f32(x));
    return x;
}

/* mxs_round_through of two values, *a and *b, in place: the same rule; on
 * sm_89 and newer a bf16 pair is one cvt.rn.bf16x2.f32 (the kernels' loads
 * round 8 elements at a time: 4 conversions instead of 8). */
MXS_HD void mxs_round_through2(float *a, float *b, mxs_dtype to) {
#if defined(MXS_DEVICE_CVT)
    if (to == MXS_BF16) {
        uint32_t w; /* b's bf16 in the high half, a's in the low: each cvt.rn.bf16.f32's value */
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(w) : "f"(*b), "f"(*a));
        *a = mxs_f32_from_bits(w << 16); /* one shift or mask each (__low2float takes two) */
        *b = mxs_f32_from_bits(w & 0xFFFF0000u);
        return;
    }
#endif
    *a = mxs_round_through(*a, to);
    *b = mxs_round_through(*b, to);
}

MXS_HD int mxs_dtype_valid(int dtype) { return dtype == MXS_F32 || dtype == MXS_BF16 || dtype == MXS_F16; }
MXS_HD int64_t mxs_dtype_bytes(mxs_dtype dtype) { return dtype == MXS_F32 ? 4 : 2; }

MXS_EXTERN_C_END

#endif /* MXSHARD_FORMATS_H */
