/* SPDX-License-Identifier: MIT */
/* bench/nvfp4_alu.cuh - the instruction (ALU) ceiling of bench/nvfp4_bench:
 * the NVFP4 kernels' per-element work without memory traffic, at full
 * occupancy, in elements per second (see nvfp4_bench.cu's top comment). */
#ifndef MXSHARD_BENCH_NVFP4_ALU_CUH
#define MXSHARD_BENCH_NVFP4_ALU_CUH

#include <mxshard/mxshard.h>

#include "bench_util.h"

/* Run 13's E2M1 software rule (the library's before issue 26), kept only so
 * that the bench measures the ceiling it had: v + C with C by v's exponent,
 * the code from integer arithmetic on the sum's bits. */
__device__ __forceinline__ uint32_t run13_e2m1(float x) {
    uint32_t u = __float_as_uint(x), a = u & 0x7FFFFFFFu;
    float v = __uint_as_float(a);
    v = v < 6.0f ? v : 6.0f;
    uint32_t e = __float_as_uint(v) & 0x7F800000u;
    uint32_t c = (e > 0x3F800000u ? e : 0x3F800000u) + (22u << 23);
    uint32_t q = __float_as_uint(v + __uint_as_float(c)) - c + ((c >> 22) - 298u);
    uint32_t is_nan = 0u - (uint32_t)(a > 0x7F800000u);
    q |= (u >> 28) & 0x8u;
    return (0x7u & is_nan) | (q & ~is_nan);
}

/* ITERS rows of 8 conversions per thread: y = fl32(x * e), the rule, the
 * packing; e changes each row (one add per 8 elements) so nothing is hoisted;
 * the words are XORed into one store per thread. x spans [-4, 4) (every E2M1
 * binade, both signs). RULE 0: mxs_e2m1x8_from_f32 (the kernels' nv_cast8);
 * 1: run13_e2m1 in pairs, as run 13's nv_cast8. */
template <int RULE> __global__ void __launch_bounds__(256, 8) nv_alu_ceiling(uint32_t *sink, int iters, float e0) {
    const uint32_t tid = blockIdx.x * blockDim.x + threadIdx.x;
    float x[8];
#pragma unroll
    for (int j = 0; j < 8; j++) x[j] = (float)(((tid * 8u + j) * 2654435761u) >> 8) * 4.76837158203125e-07f - 4.0f;
    uint32_t acc = 0;
    float e = e0;
    for (int k = 0; k < iters; k++) {
        float y[8];
#pragma unroll
        for (int j = 0; j < 8; j++) y[j] = __fmul_rn(x[j], e);
        if (RULE == 0) {
            acc ^= mxs_e2m1x8_from_f32(y);
        } else {
#pragma unroll
            for (int p = 0; p < 4; p++) acc ^= (run13_e2m1(y[2 * p]) | (run13_e2m1(y[2 * p + 1]) << 4)) << (8 * p);
        }
        e = __fadd_rn(e, 0.0009765625f);
    }
    sink[tid] = acc;
}

/* Conversions per second / 1e9 of nv_alu_ceiling<RULE>: 8 CTAs of 256
 * threads per SM (full occupancy), b2b median. */
template <int RULE> static double nv_alu_gps(bench_ctx &B) {
    const int iters = 256;
    const int64_t threads = (int64_t)B.sms * 8 * 256;
    uint32_t *sink = nullptr;
    CK(cudaMalloc(&sink, (size_t)threads * 4));
    const unsigned grid = (unsigned)(B.sms * 8);
    bench_times t = bench_measure(B, {[=](cudaStream_t s) {
                                      nv_alu_ceiling<RULE><<<grid, 256, 0, s>>>(sink, iters, 0.75f);
                                      return cudaGetLastError() == cudaSuccess ? MXS_OK : MXS_ERR_CUDA;
                                  }},
                                  "ALU ceiling", false);
    CK(cudaFree(sink));
    return (double)threads * iters * 8 / t.b2b / 1e3;
}

#endif /* MXSHARD_BENCH_NVFP4_ALU_CUH */
