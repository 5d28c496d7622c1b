/* SPDX-License-Identifier: MIT */
/* mxshard/nvfp4.h - the NVFP4 format: E2M1 elements, E4M3 block scales, one
 * f32 global amax; blocks, planes and scale layouts (docs/contract.md
 * section 9, pictures in docs/format.md section 6).
 *
 *   E2M1 element   s ee m      values 0, 0.5, 1, 1.5, 2, 3, 4, 6 (and -),
 *                              no inf, no NaN; two per byte, the element
 *                              with the even flat index in the low nibble
 *   E4M3 scale     one per block of 16 elements (mxs_e4m3_from_f32)
 *   f32 amax       one per tensor: the global amax the scales derive from
 *
 * Every rule here is MXS_HOST_DEVICE, one definition for the host and the
 * CUDA kernels. The element conversion is integer code; the scale rules are
 * single, separately rounded f32 multiplies and divisions (no add, so no
 * FMA contraction can change them). Build without fast-math or FTZ.
 *
 * Planes. The row-wise plane is the rows x cols weight, flat index
 * i = r*cols + c, packed; its blocks are 1x16 along a row. The column-wise
 * plane is the TRANSPOSE, cols x rows, flat index j = c*rows + r, packed, with
 * 1x16 blocks along its rows (16x1 blocks of the weight) - exactly the row-wise
 * plane of the transposed weight, as Transformer Engine stores it (FP4 GEMM
 * operands are K-major). Each data plane takes ceil(rows*cols/2) bytes; when
 * rows*cols is odd the high nibble of the last byte is 0.
 *
 * Block shapes. MXS_NVFP4_1X16: one scale per 1x16 block of each plane.
 * MXS_NVFP4_16X16: one scale per 16x16 tile of the weight, stored as the
 * ordinary per-row 1x16 scales repeated over the tile's rows - in both
 * planes, so a 2D tensor is an ordinary NVFP4 tensor to a GEMM, and the
 * column-wise plane is the exact nibble transpose of the row-wise plane.
 *
 * Scale planes: S[M][K] with M = rows, K = ceil(cols/16) (row-wise) or
 * M = cols, K = ceil(rows/16) (column-wise: the row-wise plane of the
 * transpose), Mp = round_up(M, 128), Kp = round_up(K, 4):
 *
 *   COMPACT    m*K + k                                              M*K bytes
 *   PADDED     m*Kp + k         (TE's NVFP4 scale_inv shape)        Mp*Kp
 *   SWIZZLED   ((m/128)*(Kp/4) + k/4)*512 + (m%32)*16 + ((m%128)/32)*4 + k%4
 *                               (cuBLAS block-scaled FP4, as MXFP8)  Mp*Kp
 *
 * The offsets are tensor.h's mxs_scale_geom_offset with colwise = 0 (one
 * definition of each layout); padding entries are 0x00.
 */
#ifndef MXSHARD_NVFP4_H
#define MXSHARD_NVFP4_H

#include "config.h"
#include "formats.h"
#include "geometry.h"
#include "status.h"
#include "tensor.h"

/* On the architectures that have it (sm_100a/f, sm_110, sm_120 families) the
 * device element conversion is the instruction cvt.rn.satfinite.e2m1x2.f32;
 * everywhere else (the host, Hopper) the integer rule below. The two agree on
 * every input (docs/contract.md section 9.2); a NaN is folded to 0x7 after the
 * instruction so that holds whatever sign the hardware gives it. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000 && defined(__CUDA_ARCH_FAMILY_SPECIFIC__)
#if __CUDA_ARCH_FAMILY_SPECIFIC__ >= 1000 && __CUDA_ARCH_FAMILY_SPECIFIC__ < 1300
#define MXS_DEVICE_CVT_FP4 1
#endif
#endif

MXS_EXTERN_C_BEGIN

#define MXS_NVFP4_BLOCK 16        /* elements per NVFP4 block */
#define MXS_E2M1_MAX 6.0f         /* largest E2M1 magnitude */
#define MXS_E2M1_MAX_CODE 0x7u    /* +6 */
#define MXS_NVFP4_ENC_MAX 2688.0f /* E4M3 max * E2M1 max = 448 * 6 */

/* Block shape of an NVFP4 tensor. 0 (1x16) is the default. */
typedef enum { MXS_NVFP4_1X16 = 0, MXS_NVFP4_16X16 = 1 } mxs_nvfp4_block;

/* ---- E2M1 element -------------------------------------------------------- */

/* f32 -> E2M1 nibble: round to nearest, ties to even, satfinite.
 * |x| <= 0.25 -> signed zero (0x0 / 0x8), finite beyond 6 and +-inf -> +-6,
 * any NaN -> +6 (0x7). Exactly __nv_cvt_float_to_fp4(x, __NV_E2M1,
 * cudaRoundNearest) and cvt.rn.satfinite.e2m1x2.f32.
 *
 * The software rule (the host, Hopper) is mxs__e2m1_sw_bits: one f32
 * addition rounds onto the grid and leaves the nibble in the sum's low bits.
 *
 *   t  = max(min(x, 6), -6)        (NaN -> +6: min returns the number)
 *   E  = 0 for |t| < 2, 1 for [2, 4), 2 for [4, 6]: the E2M1 grid spacing
 *        there is 2^(E-1), and the code is linear in the value: 2|t|,
 *        |t| + 2, |t|/2 + 4 = n + 2E with n = |t| / spacing
 *   E  is the exponent field of t * 2^-127 (subnormal, field 0, below 2;
 *        formed as t * 2^-21 * 2^-106 so no constant is subnormal)
 *   C  = +-2^(1+E) with mantissa 256 + 2E (+ 512 when t < 0), the sign of
 *        t: bits X + (X >> 22), X = sign | (128 + E) << 23 (one OR: 128 + E
 *        = 128 | E)
 *   s  = fl32(t * 2^-21 + C)
 *
 * The ulp of C is 2^(E-22), i.e. the spacing in units of t * 2^-21, so the
 * addition rounds |t| to n multiples of the spacing, to nearest even (C's
 * mantissa is even, so an even multiple is an even n and, 2E being even, an
 * even code: E2M1's tie rule), and bits(s) = bits(C) + n: the low 16 bits of
 * bits(s) are code | 256 | sign << 9 (code = n + 2E <= 7). Near a binade
 * edge t * 2^-127 may round up into the next E; the coarser grid then gives
 * the same value (2 or 4). No intermediate is subnormal unless |t| < 2^-105
 * or it only feeds E, so flushing subnormals (FTZ / DAZ) changes nothing.
 * Equal to the boundary count (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5 as f32
 * bit patterns) for all 2^32 inputs: tests/cpu/test_e2m1.c (host)
 * and tests/cuda/test_nvfp4_e2m1.cu (device, and the 8-wide packing below). */
MXS_HD uint32_t mxs__e2m1_sw_bits(float x) {
    const float two_m21 = mxs_f32_from_bits(0x35000000u), two_m106 = mxs_f32_from_bits(0x0A800000u);
    float t, tn;
    uint32_t xb;
#if defined(__CUDA_ARCH__)
    t = fmaxf(fminf(x, MXS_E2M1_MAX), -MXS_E2M1_MAX); /* one instruction each */
#else
    t = x < MXS_E2M1_MAX ? x : MXS_E2M1_MAX; /* a NaN compares false: 6 */
    t = t > -MXS_E2M1_MAX ? t : -MXS_E2M1_MAX;
#endif
    tn = t * two_m21; /* exact, or below 2^-126 where the code is 0 */
    xb = mxs_f32_bits(tn * two_m106);
#if defined(__CUDA_ARCH__)
    /* (xb & 0xFF800000) | 128 << 23 as one LOP3 (the compiler makes two) */
    asm("lop3.b32 %0, %1, 0xFF800000, 0x40000000, 0xEA;" : "=r"(xb) : "r"(xb));
#else
    xb = (xb & 0xFF800000u) | (128u << 23);
#endif
    return mxs_f32_bits(tn + mxs_f32_from_bits(xb + (xb >> 22)));
}

/* The nibble from mxs__e2m1_sw_bits: code in bits 0..2, the sign (bit 9) to bit 3. */
MXS_HD uint8_t mxs__e2m1_sw(float x) {
    uint32_t v = mxs__e2m1_sw_bits(x);
    return (uint8_t)((v & 0x7u) | ((v >> 6) & 0x8u));
}

MXS_HD uint8_t mxs_e2m1_from_f32(float x) {
#if defined(MXS_DEVICE_CVT_FP4)
    unsigned short r;
    asm("{ .reg .b8 t;\n\t cvt.rn.satfinite.e2m1x2.f32 t, %1, %1;\n\t mov.b16 %0, {t, 0};\n\t}" : "=h"(r) : "f"(x));
    return (uint8_t)(x != x ? MXS_E2M1_MAX_CODE : (r & 0xFu));
#else
    return mxs__e2m1_sw(x);
#endif
}

/* Two conversions packed into one byte: `even` (the element with the even
 * flat index) in the low nibble, `odd` in the high one. */
MXS_HD uint8_t mxs_e2m1x2_from_f32(float even, float odd) {
#if defined(MXS_DEVICE_CVT_FP4)
    unsigned short r;
    /* cvt ... d, a, b puts a in the high nibble and b in the low one */
    asm("{ .reg .b8 t;\n\t cvt.rn.satfinite.e2m1x2.f32 t, %1, %2;\n\t mov.b16 %0, {t, 0};\n\t}"
        : "=h"(r)
        : "f"(odd), "f"(even));
    if (even != even) r = (unsigned short)((r & 0xF0u) | MXS_E2M1_MAX_CODE);
    if (odd != odd) r = (unsigned short)((r & 0x0Fu) | (MXS_E2M1_MAX_CODE << 4));
    return (uint8_t)r;
#else
    return (uint8_t)(mxs__e2m1_sw(even) | (mxs__e2m1_sw(odd) << 4));
#endif
}

/* Eight conversions packed little-endian into 32 bits, x[0] in the low
 * nibble (a row of 8 elements, one 32-bit store). On Hopper the software
 * rule's sums are merged a pair at a time - bits(s_even) + (bits(s_odd) << 4)
 * holds both codes and both signs (bits 9, 13) in its low 16 bits, since the
 * 256 | 4096 of the two sums is in neither - then two halves per word
 * (PRMT), the signs moved down by one shift, one LOP3, one PRMT: about 1.4
 * instructions an element for the packing; 9.5 with the multiply and the
 * rule (sm_90 SASS; run 13's rule and packing: 15.4). */
MXS_HD uint32_t mxs_e2m1x8_from_f32(const float *x) {
#if defined(MXS_DEVICE_CVT_FP4)
    return (uint32_t)mxs_e2m1x2_from_f32(x[0], x[1]) | ((uint32_t)mxs_e2m1x2_from_f32(x[2], x[3]) << 8) |
           ((uint32_t)mxs_e2m1x2_from_f32(x[4], x[5]) << 16) | ((uint32_t)mxs_e2m1x2_from_f32(x[6], x[7]) << 24);
#elif defined(__CUDA_ARCH__)
    uint32_t w[4], lo, hi;
    int p;
    for (p = 0; p < 4; p++) w[p] = mxs__e2m1_sw_bits(x[2 * p]) + (mxs__e2m1_sw_bits(x[2 * p + 1]) << 4);
    lo = __byte_perm(w[0], w[1], 0x5410); /* pair 0 in bits 0..15, pair 1 in 16..31 */
    hi = __byte_perm(w[2], w[3], 0x5410);
    /* codes from lo, the signs (bits 9, 13) from lo >> 6: one LOP3 select
     * each (0x00770077 ? lo : lo >> 6; the compiler makes two) */
    asm("lop3.b32 %0, %1, %2, 0x00770077, 0xE4;" : "=r"(lo) : "r"(lo), "r"(lo >> 6));
    asm("lop3.b32 %0, %1, %2, 0x00770077, 0xE4;" : "=r"(hi) : "r"(hi), "r"(hi >> 6));
    return __byte_perm(lo, hi, 0x6420); /* bytes 0 and 2 of each */
#else
    uint32_t q = 0;
    int j;
    for (j = 0; j < 8; j++) q |= (uint32_t)mxs__e2m1_sw(x[j]) << (4 * j);
    return q;
#endif
}

/* E2M1 nibble (low 4 bits of n) -> f32, exact. 0x8 decodes to -0.0. */
MXS_HD float mxs_e2m1_to_f32(uint8_t n) {
    uint32_t sign = (uint32_t)(n & 0x8u) << 28;
    uint32_t e = (n >> 1) & 3u, m = n & 1u;
    /* e = 0: m * 0.5 (0x3F000000 or 0); else (1 + m/2) * 2^(e-1) */
    uint32_t mag = e == 0u ? (m ? 0x3F000000u : 0u) : ((e + 126u) << 23) | (m << 22);
    return mxs_f32_from_bits(sign | mag);
}

/* Nibble i (flat index) of a packed plane, and its store. mxs_nvfp4_put is
 * a read-modify-write of one byte: two writers of the two nibbles of one byte
 * must not run concurrently. */
MXS_HD uint8_t mxs_nvfp4_get(const uint8_t *data, int64_t i) {
    return (uint8_t)((data[i >> 1] >> ((unsigned)(i & 1) * 4u)) & 0xFu);
}
MXS_HD void mxs_nvfp4_put(uint8_t *data, int64_t i, uint8_t n) {
    unsigned sh = (unsigned)(i & 1) * 4u;
    data[i >> 1] = (uint8_t)((data[i >> 1] & ~(0xFu << sh)) | ((unsigned)(n & 0xFu) << sh));
}

/* ---- scales (docs/contract.md section 9.3) -------------------------------- */

/* Global encode scale of a tensor whose global amax is `amax`:
 *   S_enc = amax > 0 ? min(fl32(2688 / max(amax, FLT_MIN)), FLT_MAX) : 1.
 * 1 for amax 0 (and for a NaN, which a library amax never is); FLT_MAX for
 * every amax below 2688/FLT_MAX (~7.9e-36; the FLT_MIN clamp never changes
 * the result, it only keeps a zero divisor out); 0 for amax = +inf. */
MXS_HD float mxs_nvfp4_global_encode(float amax) {
    const float flt_min = mxs_f32_from_bits(0x00800000u), flt_max = mxs_f32_from_bits(0x7F7FFFFFu);
    float s;
    if (!(amax > 0.0f)) return 1.0f;
    s = MXS_NVFP4_ENC_MAX / (amax > flt_min ? amax : flt_min); /* fmaxf(amax, FLT_MIN) */
    return s < flt_max ? s : flt_max;                          /* never NaN here */
}

/* Block decode scale, E4M3 (RN, satfinite):
 *   s = E4M3(min(fl32(block_amax * fl32(S_enc * fl32(1/6))), FLT_MAX)).
 * A NaN product (block_amax = inf with S_enc = 0) becomes FLT_MAX, as fminf
 * does, hence 448 (0x7E). Monotonic in block_amax; 0 -> 0x00. */
MXS_HD uint8_t mxs_nvfp4_block_scale(float block_amax, float s_enc) {
    const float flt_max = mxs_f32_from_bits(0x7F7FFFFFu);
    float k = s_enc * (1.0f / 6.0f);
    float s = block_amax * k;
    s = s < flt_max ? s : flt_max; /* fminf(s, FLT_MAX): NaN -> FLT_MAX */
    return mxs_e4m3_from_f32(s);
}

/* Element encode multiplier of a block with stored scale code `scale`:
 *   e = d > 0 ? min(fl32(1 / fl32(d * fl32(1 / S_enc))), FLT_MAX) : FLT_MAX,
 * d = e4m3_to_f32(scale). A NaN scale code (never produced) gives FLT_MAX. */
MXS_HD float mxs_nvfp4_encode_mult(uint8_t scale, float s_enc) {
    const float flt_max = mxs_f32_from_bits(0x7F7FFFFFu);
    float d = mxs_e4m3_to_f32(scale);
    float dec = 1.0f / s_enc;
    float e = 1.0f / (d * dec);
    if (!(d > 0.0f)) return flt_max;
    return e < flt_max ? e : flt_max;
}

/* One element: E2M1(fl32(x * e)). */
MXS_HD uint8_t mxs_nvfp4_quantize_elem(float x, float e) { return mxs_e2m1_from_f32(x * e); }

/* Dequantization factor of a block, as Transformer Engine's dequantize:
 *   f = fl32(fl32(d * amax) * fl32(1/2688)), d = e4m3_to_f32(scale),
 * amax = the tensor's global amax. */
MXS_HD float mxs_nvfp4_decode_mult(uint8_t scale, float amax) {
    return (mxs_e4m3_to_f32(scale) * amax) * (1.0f / MXS_NVFP4_ENC_MAX);
}

/* x' = fl32(e2m1_to_f32(n) * f). A NaN result (NaN scale code, or 0 * inf)
 * is returned as 0x7FC00000: NaN payloads of a multiply differ between CPUs
 * and GPUs. */
MXS_HD float mxs_nvfp4_dequantize_elem(uint8_t n, float f) {
    float v = mxs_e2m1_to_f32(n) * f;
    return v != v ? mxs_f32_from_bits(0x7FC00000u) : v;
}

/* ---- geometry ------------------------------------------------------------ */

MXS_HD int mxs_nvfp4_block_valid(int b) { return b == MXS_NVFP4_1X16 || b == MXS_NVFP4_16X16; }

/* Bytes of one packed data plane: ceil(rows*cols/2); 0 on overflow or a
 * shape below 1x1 (callers check the shape first). */
MXS_HD int64_t mxs_nvfp4_data_plane_bytes(int64_t rows, int64_t cols) {
    int64_t n;
    if (rows < 1 || cols < 1 || !mxs_mul_ok(rows, cols, &n)) return 0;
    return n / 2 + (n & 1);
}

/* Flat nibble index of weight element (r, c) in a plane: r*cols + c in the
 * row-wise plane, c*rows + r in the (transposed) column-wise plane. */
MXS_HD int64_t mxs_nvfp4_data_index(int64_t rows, int64_t cols, mxs_dirs plane, int64_t r, int64_t c) {
    return plane == MXS_COLWISE ? c * rows + r : r * cols + c;
}

/* Geometry of one NVFP4 scale plane in one layout: M, K as in the header
 * comment, colwise = 0 (the column-wise plane is the row-wise plane of the
 * transpose), so mxs_scale_geom_offset / _coords / _bytes / _is_logical of
 * tensor.h apply unchanged. Returns 0 when a size overflows int64. Needs
 * rows, cols >= 1. */
MXS_HD int mxs_nvfp4_scale_geom_make(int64_t rows, int64_t cols, mxs_dirs plane, mxs_scale_layout layout,
                                     mxs_scale_geom *g) {
    int64_t bytes;
    g->colwise = 0;
    g->layout = (int)layout;
    g->M = plane == MXS_COLWISE ? cols : rows;
    g->K = mxs_ceil_div(plane == MXS_COLWISE ? rows : cols, MXS_NVFP4_BLOCK);
    g->Mp = g->M > INT64_MAX - 127 ? INT64_MAX : mxs_round_up(g->M, 128);
    g->Kp = mxs_round_up(g->K, 4);
    return g->M <= INT64_MAX - 127 && mxs_mul_ok(g->Mp, g->Kp, &bytes);
}

/* The scale entry (m, k) of weight element (r, c) in a plane: (r, c/16)
 * row-wise, (c, r/16) column-wise - for both block shapes (16x16 tiles store
 * their scale in every row's entry). */
MXS_HD int64_t mxs_nvfp4_scale_m(mxs_dirs plane, int64_t r, int64_t c) { return plane == MXS_COLWISE ? c : r; }
MXS_HD int64_t mxs_nvfp4_scale_k(mxs_dirs plane, int64_t r, int64_t c) {
    return (plane == MXS_COLWISE ? r : c) / MXS_NVFP4_BLOCK;
}

/* The 16x16 tile (row tile, column tile) that scale entry (m, k) of a plane
 * belongs to under MXS_NVFP4_16X16: (m/16, k) row-wise, (k, m/16)
 * column-wise - the two planes share every tile's scale. */
MXS_HD void mxs_nvfp4_entry_tile(mxs_dirs plane, int64_t m, int64_t k, int64_t *tile_r, int64_t *tile_c) {
    *tile_r = plane == MXS_COLWISE ? k : m / MXS_NVFP4_BLOCK;
    *tile_c = plane == MXS_COLWISE ? m / MXS_NVFP4_BLOCK : k;
}

/* ---- shards and buckets (docs/contract.md section 9.8) --------------------
 *
 * Two elements share a byte, so an NVFP4 shard boundary must not fall inside
 * a byte: a non-empty shard [start, start+len) of an n-element weight starts
 * at an even flat index and ends at an even one or at n. Then every byte of a
 * data plane (and of the column stage) belongs to exactly one shard of a
 * partition, and the parameter all-gather is an ordinary byte all-gather of
 * the ranges [start/2, ceil((start+len)/2)).
 *
 *   nibbles   | 0  1 | 2  3 | 4  5 | 6  7 | 8  9 |10  -|   n = 11
 *   even cut  |<-- rank 0 -->|<------- rank 1 ------->|   start 4: bytes 0-1 | 2-5
 *   odd cut   |<-- rank 0 ------>|<---- rank 1 ------>|   start 5: byte 2 shared,
 *                                                         rejected (MXS_ERR_RANGE)
 *
 * A bucket whose weights start at even offsets and whose length is a multiple
 * of 2*nranks (mxs_nvfp4_bucket_place / _elems) only ever yields such shards
 * (mxs_nvfp4_bucket_shard). */

/* mxs_shard_check, then the even rule: MXS_ERR_RANGE when a non-empty shard
 * starts at an odd index, or ends at an odd index other than elems. */
MXS_NODISCARD MXS_HD mxs_status mxs_nvfp4_shard_check(int64_t elems, int64_t start, int64_t len) {
    mxs_status s = mxs_shard_check(elems, start, len);
    if (s != MXS_OK || len == 0) return s;
    if ((start & 1) || (((start + len) & 1) && start + len != elems)) return MXS_ERR_RANGE;
    return MXS_OK;
}

/* Bucket offset at which the next weight goes when the previous one ends at
 * `end` (>= 0): round_up(end, 2). */
MXS_HD int64_t mxs_nvfp4_bucket_place(int64_t end) { return end + (end & 1); }

/* Padded bucket length for `used` elements over nranks ranks:
 * round_up(used, 2*nranks), so every rank's chunk is even. -1 when nranks < 1,
 * used < 0 or the result overflows. */
MXS_HD int64_t mxs_nvfp4_bucket_elems(int64_t used, int64_t nranks) {
    int64_t m;
    if (nranks < 1 || used < 0 || !mxs_mul_ok(nranks, 2, &m) || used > INT64_MAX - (m - 1)) return -1;
    return mxs_round_up(used, m);
}

/* Rank `rank`'s shard of the weight at bucket offset `offset` with `elems`
 * elements (mxs_bucket_shard), after checking that the bucket can only give
 * even boundaries: offset even and bucket_elems a multiple of 2*nranks
 * (else MXS_ERR_RANGE); MXS_ERR_INVALID_ARGUMENT for a NULL out, nranks < 1,
 * rank outside [0, nranks), elems < 1 or a weight outside the bucket. */
MXS_NODISCARD MXS_HD mxs_status mxs_nvfp4_bucket_shard(int64_t offset, int64_t elems, int64_t bucket_elems,
                                                       int64_t nranks, int64_t rank, mxs_range *out) {
    if (!out || nranks < 1 || rank < 0 || rank >= nranks || offset < 0 || elems < 1 || bucket_elems < 0 ||
        offset > bucket_elems || elems > bucket_elems - offset)
        return MXS_ERR_INVALID_ARGUMENT;
    if ((offset & 1) || nranks > INT64_MAX / 2 || bucket_elems % (2 * nranks) != 0) return MXS_ERR_RANGE;
    *out = mxs_bucket_shard(offset, elems, bucket_elems, nranks, rank);
    return MXS_OK;
}

/* ---- the descriptor ------------------------------------------------------ */

typedef struct mxs_nvfp4_tensor {
    int64_t rows, cols;
    unsigned dirs;                 /* MXS_ROWWISE | MXS_COLWISE */
    mxs_scale_layout scale_layout; /* applies to both scale planes */
    mxs_nvfp4_block block;         /* MXS_NVFP4_1X16 (0) or MXS_NVFP4_16X16 */
    uint8_t *row_data, *row_scale; /* NULL when the row-wise plane is absent */
    uint8_t *col_data, *col_scale; /* transposed; NULL when absent */
    float *amax;                   /* the tensor's global amax (one f32); required */
} mxs_nvfp4_tensor;                /* more fields may follow; zero means default */

/* Shape of one scale plane: outer x inner = M x K (compact) or Mp x Kp
 * (padded, swizzled; the swizzled plane is Mp*Kp bytes in 512-byte tiles).
 * MXS_ERR_INVALID_ARGUMENT for a bad plane/layout, MXS_ERR_SHAPE, MXS_ERR_OVERFLOW. */
MXS_NODISCARD MXS_HD mxs_status mxs_nvfp4_scale_shape(int64_t rows, int64_t cols, mxs_dirs plane,
                                                      mxs_scale_layout layout, int64_t *outer, int64_t *inner) {
    mxs_scale_geom g;
    int64_t n;
    if (!outer || !inner || !mxs_plane_valid((int)plane) || !mxs_layout_valid((int)layout))
        return MXS_ERR_INVALID_ARGUMENT;
    if (rows < 1 || cols < 1) return MXS_ERR_SHAPE;
    if (!mxs_mul_ok(rows, cols, &n) || !mxs_nvfp4_scale_geom_make(rows, cols, plane, layout, &g))
        return MXS_ERR_OVERFLOW;
    *outer = layout == MXS_SCALES_COMPACT ? g.M : g.Mp;
    *inner = layout == MXS_SCALES_COMPACT ? g.K : g.Kp;
    return MXS_OK;
}

/* Checks shape, flags, layout, block shape and sizes (not pointers). */
MXS_NODISCARD MXS_API mxs_status mxs_nvfp4_tensor_check_shape(const mxs_nvfp4_tensor *t) {
    int64_t elems;
    mxs_scale_geom g;
    if (!t) return MXS_ERR_INVALID_ARGUMENT;
    if (t->dirs == 0u || (t->dirs & ~(unsigned)MXS_BOTH) != 0u) return MXS_ERR_INVALID_ARGUMENT;
    if (!mxs_layout_valid((int)t->scale_layout) || !mxs_nvfp4_block_valid((int)t->block))
        return MXS_ERR_INVALID_ARGUMENT;
    if (t->rows < 1 || t->cols < 1) return MXS_ERR_SHAPE;
    if (!mxs_mul_ok(t->rows, t->cols, &elems)) return MXS_ERR_OVERFLOW;
    if (!mxs_nvfp4_scale_geom_make(t->rows, t->cols, MXS_ROWWISE, t->scale_layout, &g)) return MXS_ERR_OVERFLOW;
    if (!mxs_nvfp4_scale_geom_make(t->rows, t->cols, MXS_COLWISE, t->scale_layout, &g)) return MXS_ERR_OVERFLOW;
    return MXS_OK;
}

/* Full check: the shape, a non-NULL amax, and non-NULL data and scale
 * pointers for every plane `dirs` names (else MXS_ERR_ABSENT_PLANE). */
MXS_NODISCARD MXS_API mxs_status mxs_nvfp4_tensor_check(const mxs_nvfp4_tensor *t) {
    mxs_status s = mxs_nvfp4_tensor_check_shape(t);
    if (s != MXS_OK) return s;
    if (!t->amax) return MXS_ERR_INVALID_ARGUMENT;
    if ((t->dirs & MXS_ROWWISE) && (!t->row_data || !t->row_scale)) return MXS_ERR_ABSENT_PLANE;
    if ((t->dirs & MXS_COLWISE) && (!t->col_data || !t->col_scale)) return MXS_ERR_ABSENT_PLANE;
    return MXS_OK;
}

/* Bytes of one packed data plane, -1 when t is invalid. */
MXS_API int64_t mxs_nvfp4_data_bytes(const mxs_nvfp4_tensor *t) {
    if (mxs_nvfp4_tensor_check_shape(t) != MXS_OK) return -1;
    return mxs_nvfp4_data_plane_bytes(t->rows, t->cols);
}

/* Bytes of the plane's scales in t's layout; -1 when t is invalid, `plane`
 * is not MXS_ROWWISE or MXS_COLWISE, or t does not have that plane. */
MXS_API int64_t mxs_nvfp4_scale_bytes(const mxs_nvfp4_tensor *t, mxs_dirs plane) {
    mxs_scale_geom g;
    if (mxs_nvfp4_tensor_check_shape(t) != MXS_OK || !mxs_plane_valid((int)plane)) return -1;
    if (!(t->dirs & (unsigned)plane)) return -1;
    mxs_nvfp4_scale_geom_make(t->rows, t->cols, plane, t->scale_layout, &g);
    return mxs_scale_geom_bytes(&g);
}

/* Bytes of the whole tensor's storage: data + scales of every present plane
 * + 4 (the amax). Row-only: about 1/2 + 1/16 bytes per element. -1 when
 * invalid or on overflow. */
MXS_API int64_t mxs_nvfp4_storage_bytes(const mxs_nvfp4_tensor *t) {
    int64_t total = 4, data = mxs_nvfp4_data_bytes(t);
    int p;
    if (data < 0) return -1;
    for (p = MXS_ROWWISE; p <= MXS_COLWISE; p++) {
        if (t->dirs & (unsigned)p) {
            int64_t sb = mxs_nvfp4_scale_bytes(t, (mxs_dirs)p);
            if (!mxs_add_ok(total, data, &total) || !mxs_add_ok(total, sb, &total)) return -1;
        }
    }
    return total;
}

MXS_EXTERN_C_END

#endif /* MXSHARD_NVFP4_H */
