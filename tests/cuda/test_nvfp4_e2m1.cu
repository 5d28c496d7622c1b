/* SPDX-License-Identifier: MIT */
/* Suite cuda, NVFP4 part 1 (test_nvfp4.cu): the E2M1 oracle vectors
 * (tests/vectors/e2m1_*.txt) through a kernel calling nvfp4.h's conversion
 * rules, and the device rule against the boundary count for all 2^32 f32
 * patterns. */
#include "nvfp4_cases.h"

#ifndef MXS_VECTORS_DIR
#define MXS_VECTORS_DIR "tests/vectors"
#endif

static FILE *open_vectors(const char *name) {
    char path[1024];
    const char *dir = getenv("MXS_VECTORS_DIR");
    snprintf(path, sizeof path, "%s/%s", dir ? dir : MXS_VECTORS_DIR, name);
    return fopen(path, "r");
}

/* ---- 1 the oracle vectors --------------------------------------------------------- */

__global__ void e2m1_kernel(const float *x, int64_t n, uint8_t *one, uint8_t *pair) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        one[i] = mxs_e2m1_from_f32(x[i]);
        pair[i] = mxs_e2m1x2_from_f32(x[i], x[(i + 1) % n]);
    }
}

__global__ void e2m1_decode_kernel(uint32_t *out) {
    if (threadIdx.x < 16) out[threadIdx.x] = mxs_f32_bits(mxs_e2m1_to_f32((uint8_t)threadIdx.x));
}

void test_oracle(void) {
    std::vector<float> x;
    std::vector<uint8_t> want;
    char line[256];
    FILE *f = open_vectors("e2m1_from_f32.txt");
    CHECK(f != nullptr, "cannot open e2m1_from_f32.txt (MXS_VECTORS_DIR)");
    if (f) {
        while (fgets(line, sizeof line, f)) {
            unsigned bits, nib;
            if (line[0] == '#' || sscanf(line, "%x %x", &bits, &nib) != 2) continue;
            x.push_back(mxs_f32_from_bits(bits));
            want.push_back((uint8_t)nib);
        }
        fclose(f);
    }
    const int64_t n = (int64_t)x.size();
    CHECK(n > 1000, "e2m1_from_f32.txt: %lld vectors", (long long)n);
    if (n > 1) {
        float *dx;
        uint8_t *d1, *d2;
        CUDA_OK(cudaMalloc(&dx, (size_t)n * 4));
        CUDA_OK(cudaMalloc(&d1, (size_t)n));
        CUDA_OK(cudaMalloc(&d2, (size_t)n));
        CUDA_OK(cudaMemcpy(dx, x.data(), (size_t)n * 4, cudaMemcpyHostToDevice));
        e2m1_kernel<<<256, 256>>>(dx, n, d1, d2);
        CUDA_OK(cudaGetLastError());
        std::vector<uint8_t> g1((size_t)n), g2((size_t)n);
        CUDA_OK(cudaMemcpy(g1.data(), d1, (size_t)n, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(g2.data(), d2, (size_t)n, cudaMemcpyDeviceToHost));
        int bad = 0;
        for (int64_t i = 0; i < n && bad < 5; i++) {
            const uint8_t pair = (uint8_t)(want[(size_t)i] | (want[(size_t)((i + 1) % n)] << 4));
            if (g1[(size_t)i] != want[(size_t)i] || g2[(size_t)i] != pair ||
                mxs_e2m1_from_f32(x[(size_t)i]) != want[(size_t)i]) {
                bad++;
                CHECK(0, "e2m1(0x%08X): gpu %X pair %02X host %X, oracle %X pair %02X", mxs_f32_bits(x[(size_t)i]),
                      g1[(size_t)i], g2[(size_t)i], mxs_e2m1_from_f32(x[(size_t)i]), want[(size_t)i], pair);
            }
        }
        g_checks++;
        cudaFree(dx);
        cudaFree(d1);
        cudaFree(d2);
    }
    f = open_vectors("e2m1_to_f32.txt");
    CHECK(f != nullptr, "cannot open e2m1_to_f32.txt");
    if (f) {
        uint32_t *dd, got[16];
        CUDA_OK(cudaMalloc(&dd, sizeof got));
        e2m1_decode_kernel<<<1, 32>>>(dd);
        CUDA_OK(cudaMemcpy(got, dd, sizeof got, cudaMemcpyDeviceToHost));
        cudaFree(dd);
        int seen = 0;
        while (fgets(line, sizeof line, f)) {
            unsigned nib, bits;
            if (line[0] == '#' || sscanf(line, "%x %x", &nib, &bits) != 2 || nib > 15) continue;
            seen++;
            CHECK(got[nib] == bits, "e2m1_to_f32(%X): gpu 0x%08X, oracle 0x%08X", nib, got[nib], bits);
        }
        fclose(f);
        CHECK(seen == 16, "e2m1_to_f32.txt: %d codes", seen);
    }
}

/* The E2M1 rule's definition (docs/contract.md 9.2): the number of
 * boundaries |x| has passed, strictly for the ties that go down (0.25, 1.25,
 * 2.5, 5), inclusively for those that go up (0.75, 1.75, 3.5), as f32 bit
 * patterns; the sign; NaN -> 0x7. */
__device__ static uint32_t e2m1_boundary_count(uint32_t u) {
    uint32_t a = u & 0x7FFFFFFFu;
    uint32_t q = (uint32_t)(a > 0x3E800000u) + (uint32_t)(a >= 0x3F400000u) + (uint32_t)(a > 0x3FA00000u) +
                 (uint32_t)(a >= 0x3FE00000u) + (uint32_t)(a > 0x40200000u) + (uint32_t)(a >= 0x40600000u) +
                 (uint32_t)(a > 0x40A00000u);
    uint32_t is_nan = 0u - (uint32_t)(a > 0x7F800000u);
    q |= (u >> 28) & 0x8u;
    return (0x7u & is_nan) | (q & ~is_nan);
}

/* Every f32 pattern, 8 consecutive ones per thread and step: mxs_e2m1_from_f32,
 * mxs_e2m1x2_from_f32 and mxs_e2m1x8_from_f32 against the boundary count;
 * bad[0..2]: mismatches of each, first[0..2]: the first pattern (min). */
__global__ void e2m1_exhaustive_kernel(unsigned long long *bad, unsigned *first, uint64_t groups, uint64_t step) {
    for (uint64_t g = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; g < groups;
         g += (uint64_t)gridDim.x * blockDim.x) {
        const uint32_t u0 = (uint32_t)(g * step * 8);
        float x[8];
        uint32_t want = 0, one = 0, pair = 0;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            x[j] = __uint_as_float(u0 + j);
            want |= e2m1_boundary_count(u0 + j) << (4 * j);
            one |= (uint32_t)mxs_e2m1_from_f32(x[j]) << (4 * j);
        }
#pragma unroll
        for (int p = 0; p < 4; p++) pair |= (uint32_t)mxs_e2m1x2_from_f32(x[2 * p], x[2 * p + 1]) << (8 * p);
        const uint32_t got[3] = {one, pair, mxs_e2m1x8_from_f32(x)};
        for (int k = 0; k < 3; k++)
            if (got[k] != want) {
                atomicAdd(&bad[k], 1ull);
                atomicMin(&first[k], u0);
            }
    }
}

/* Under compute-sanitizer (MXS_SANITIZER) every 2^10th group only: the plain
 * run covers all of them. */
void test_e2m1_exhaustive() {
    const uint64_t groups = getenv("MXS_SANITIZER") ? (uint64_t)1 << 19 : (uint64_t)1 << 29;
    DevBuf dbad = dev_alloc(3 * sizeof(unsigned long long)), dfirst = dev_alloc(3 * sizeof(unsigned));
    CUDA_OK(cudaMemset(dbad.p, 0, 3 * sizeof(unsigned long long)));
    CUDA_OK(cudaMemset(dfirst.p, 0xFF, 3 * sizeof(unsigned)));
    e2m1_exhaustive_kernel<<<4096, 256>>>(reinterpret_cast<unsigned long long *>(dbad.p),
                                          reinterpret_cast<unsigned *>(dfirst.p), groups, ((uint64_t)1 << 29) / groups);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaDeviceSynchronize());
    unsigned long long bad[3];
    unsigned first[3];
    CUDA_OK(cudaMemcpy(bad, dbad.p, sizeof bad, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(first, dfirst.p, sizeof first, cudaMemcpyDeviceToHost));
    static const char *const what[3] = {"mxs_e2m1_from_f32", "mxs_e2m1x2_from_f32", "mxs_e2m1x8_from_f32"};
    for (int k = 0; k < 3; k++)
        CHECK(bad[k] == 0,
              "%s on the device: %llu groups of 8 patterns differ from the boundary count, the first at "
              "0x%08X",
              what[k], bad[k], first[k]);
    dev_free(dbad);
    dev_free(dfirst);
}
