/* SPDX-License-Identifier: MIT */
/* bench/nvfp4_floor.cuh - the two-pass floor of bench/nvfp4_bench (issue
 * 36): the least traffic of an NVFP4 cast, whose scales need the tensor
 * amax before any element is cast, so the source is read twice.
 *
 * One call of the floor is two launches in a row on the stream:
 *   pass 1  nv_floor_amax: reads the source once (coalesced 16-byte loads,
 *           4 in flight per thread, as bench_mix) and reduces it to one
 *           word: the max of |x|'s bits per thread, per warp
 *           (__reduce_max_sync), per CTA (shared memory), then one
 *           atomicMax per CTA. Nothing else is written.
 *   pass 2  bench_mix<., ., true> (bench_util.h), the one-pass ceiling's
 *           kernel: reads the source again and writes the packed nibbles
 *           (half a byte per element per plane) and the scale bytes.
 * Bytes: 2 x source + the one-pass ceiling's outputs (pass 1's one word
 * aside). The launch boundary is the grid-wide barrier the amax needs (every
 * CTA's part of it before any cast), as in the library. Timed like the
 * one-pass ceiling (bench_ceiling_of): the jobs in rotation (the 8 ranks of
 * DP=8: each rank reads its shard twice, so the second read may partly hit
 * the L2, as it may for the library), single (L2 flushed before the pair)
 * and b2b, with two grid shapes - persistent (8 CTAs of 256 per SM) and one
 * pass of 4 vectors per thread - for both launches, the faster pair kept in
 * each mode. Included once, into nvfp4_bench.cu's one translation unit. */
#ifndef MXSHARD_BENCH_NVFP4_FLOOR_CUH
#define MXSHARD_BENCH_NVFP4_FLOOR_CUH

#include "bench_util.h"

/* The max of the bits of |x| over nvec 16-byte vectors of IB-byte elements
 * (bf16 or f32; for finite values the bits order as the magnitudes),
 * atomicMax-ed into *amax once per CTA. blockDim.x == 256. */
template <int IB>
__global__ void __launch_bounds__(256) nv_floor_amax(const uint4 *__restrict__ in, int64_t nvec, unsigned *amax) {
    constexpr int U = 4;
    const uint32_t mask = IB == 2 ? 0x7FFF7FFFu : 0x7FFFFFFFu;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    uint32_t a = 0;
    for (int64_t base = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; base < nvec; base += U * stride) {
        uint4 v[U];
#pragma unroll
        for (int k = 0; k < U; k++) {
            const int64_t j = base + k * stride;
            v[k] = j < nvec ? in[j] : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int k = 0; k < U; k++) {
            const uint32_t w[4] = {v[k].x & mask, v[k].y & mask, v[k].z & mask, v[k].w & mask};
#pragma unroll
            for (int i = 0; i < 4; i++) a = IB == 2 ? max(a, max(w[i] & 0xFFFFu, w[i] >> 16)) : max(a, w[i]);
        }
    }
    a = __reduce_max_sync(0xFFFFFFFFu, a);
    __shared__ uint32_t part[8];
    if ((threadIdx.x & 31u) == 0) part[threadIdx.x >> 5] = a;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int i = 1; i < 8; i++) a = max(a, part[i]);
        if (a) atomicMax(amax, a);
    }
}

/* Times the two-pass floor of the jobs (used in rotation, like a case's
 * calls); amax: one device word per job (pass 1's result, never read). */
static bench_times nv_floor_two_pass(bench_ctx &B, const std::vector<bench_fp4_job> &jobs, unsigned *amax,
                                     const char *what) {
    bench_times best;
    for (int variant = 0; variant < 2; variant++) {
        std::vector<bench_call> calls;
        for (size_t i = 0; i < jobs.size(); i++) {
            const bench_fp4_job j = jobs[i];
            const int64_t nvec = j.elems * j.in_bytes / 16;
            const int64_t nout = std::max(nvec, (j.scale_bytes + 15) / 16);
            const auto grid_of = [&](int64_t v) {
                return variant == 0 ? B.sms * 8
                                    : (int)std::min<int64_t>(std::max<int64_t>(1, (v + 1023) / 1024), 1 << 30);
            };
            const int ga = grid_of(nvec), gm = grid_of(nout);
            unsigned *w = amax + i;
            const uint4 *in = (const uint4 *)j.in;
            calls.push_back([j, ga, gm, w, in, nvec](cudaStream_t s) {
                if (j.in_bytes == 2)
                    nv_floor_amax<2><<<ga, 256, 0, s>>>(in, nvec, w);
                else
                    nv_floor_amax<4><<<ga, 256, 0, s>>>(in, nvec, w);
                if (cudaGetLastError() != cudaSuccess) return MXS_ERR_CUDA;
                return bench_mix_launch(j, gm, s);
            });
        }
        bench_times t = bench_measure(B, calls, what, false);
        if (best.single < 0 || t.single < best.single) best.single = t.single;
        if (best.b2b < 0 || t.b2b < best.b2b) best.b2b = t.b2b;
    }
    return best;
}

#endif /* MXSHARD_BENCH_NVFP4_FLOOR_CUH */
