/* SPDX-License-Identifier: MIT */
/* Suite cuda: a weight of more than 2^31 elements (65568 x 32768 bf16,
 * row-only). The bytes past element 2^31 - the rows where 32-bit indexing
 * would wrap - must equal the host path: quantize, then a writeback whose
 * shard starts below 2^31 (unaligned) and runs to the end. */
#include "common.h"

__global__ void fill_bf16(uint16_t *p, int64_t n, uint64_t seed) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        uint64_t h = (uint64_t)i * 0x9E3779B97F4A7C15ull + seed;
        h ^= h >> 31;
        h *= 0xBF58476D1CE4E5B9ull;
        h ^= h >> 29;
        /* finite bf16 of varied magnitude: sign, exponent 100..150, mantissa */
        uint32_t e = 100u + (uint32_t)((h >> 8) % 51u) + (uint32_t)(((uint64_t)i / 32) % 7);
        p[i] = (uint16_t)(((h & 1u) << 15) | (e << 7) | ((h >> 20) & 0x7Fu));
    }
}

int main(void) {
    require_gpu();
    const int64_t rows = 65568, cols = 32768, n = rows * cols, K = cols / 32;
    size_t free_b = 0, total_b = 0;
    CUDA_OK(cudaMemGetInfo(&free_b, &total_b));
    const size_t need = (size_t)n * 3 + (size_t)(rows * K) * 2 + (64u << 20);
    if (free_b < need) {
        printf("1..0 # skip: needs %zu MiB of device memory, %zu free\n", need >> 20, free_b >> 20);
        return 77;
    }
    uint16_t *src;
    uint8_t *data, *scale, *packed, *ws;
    CUDA_OK(cudaMalloc(&src, (size_t)n * 2));
    CUDA_OK(cudaMalloc(&data, (size_t)n));
    CUDA_OK(cudaMalloc(&scale, (size_t)(rows * K)));
    CUDA_OK(cudaMalloc(&packed, (size_t)(rows * K) + 1)); /* the exponents + the group status byte */
    fill_bf16<<<132 * 16, 256>>>(src, n, 12345);
    CUDA_OK(cudaMemset(data, POISON, (size_t)n));
    CUDA_OK(cudaMemset(scale, POISON, (size_t)(rows * K)));

    mxs_tensor t = row_only(rows, cols, MXS_SCALES_COMPACT, data, scale);
    CHECK(mxs_cuda_quantize(&t, src, MXS_BF16, MXS_ROUND_CEIL, 0) == MXS_OK, "quantize status");
    CUDA_OK(cudaDeviceSynchronize());

    /* rows r0.. hold every element from 2^31 - 8 rows on */
    const int64_t r0 = (((int64_t)1 << 31) / cols) - 8, sub_rows = rows - r0, sub_n = sub_rows * cols;
    std::vector<uint16_t> hsrc((size_t)sub_n);
    CUDA_OK(cudaMemcpy(hsrc.data(), src + r0 * cols, (size_t)sub_n * 2, cudaMemcpyDeviceToHost));
    std::vector<uint8_t> hdata((size_t)sub_n, POISON), hscale((size_t)(sub_rows * K), POISON);
    mxs_tensor h = t;
    h.rows = sub_rows;
    h.row_data = hdata.data();
    h.row_scale = hscale.data();
    CHECK(mxs_host_quantize(&h, hsrc.data(), MXS_BF16, MXS_ROUND_CEIL) == MXS_OK, "host quantize");
    std::vector<uint8_t> gdata((size_t)sub_n), gscale((size_t)(sub_rows * K));
    CUDA_OK(cudaMemcpy(gdata.data(), data + r0 * cols, (size_t)sub_n, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(gscale.data(), scale + r0 * K, (size_t)(sub_rows * K), cudaMemcpyDeviceToHost));
    CHECK(memcmp(gdata.data(), hdata.data(), (size_t)sub_n) == 0, "quantize data past 2^31 differs");
    CHECK(memcmp(gscale.data(), hscale.data(), (size_t)(sub_rows * K)) == 0, "quantize scales past 2^31 differ");

    /* writeback: bf16 master = the source itself, shard [2^31 - 12345, n) */
    const int64_t start = ((int64_t)1 << 31) - 12345, len = n - start;
    for (int mode = 0; mode < 2; mode++) {
        mxs_wb_item it;
        memset(&it, 0, sizeof it);
        it.primary = t;
        it.master = src + start;
        it.master_dtype = MXS_BF16;
        it.start = start;
        it.len = len;
        mxs_wb_batch b;
        memset(&b, 0, sizeof b);
        b.items = &it;
        b.n_items = 1;
        b.mode = (mxs_wb_mode)mode;
        b.round_through = MXS_BF16;
        mxs_wb_plan plan;
        int64_t wsb;
        CHECK(mxs_wb_make_plan(&b, &plan, NULL) == MXS_OK, "plan");
        CHECK(plan.packed_bytes == rows * K + 1, "packed buffer: %lld bytes", (long long)plan.packed_bytes);
        CHECK(mxs_cuda_wb_workspace_bytes(&b, &wsb) == MXS_OK, "ws");
        CUDA_OK(cudaMalloc(&ws, (size_t)wsb));
        /* the rows the shard touches start with the quantize output; poison them */
        const int64_t wr0 = start / cols, wsub_rows = rows - wr0, wsub_n = wsub_rows * cols;
        CUDA_OK(cudaMemset(data + wr0 * cols, POISON, (size_t)wsub_n));
        CHECK(mxs_cuda_wb_partial(&b, &plan, packed, ws, wsb, 0) == MXS_OK, "partial");
        CHECK(mxs_cuda_wb_apply(&b, &plan, packed, ws, wsb, 0) == MXS_OK, "apply");
        CUDA_OK(cudaDeviceSynchronize());
        /* host: the same shard on the sub-tensor of rows wr0.. */
        std::vector<uint16_t> wsrc((size_t)wsub_n);
        CUDA_OK(cudaMemcpy(wsrc.data(), src + wr0 * cols, (size_t)wsub_n * 2, cudaMemcpyDeviceToHost));
        std::vector<uint8_t> wdata((size_t)wsub_n, POISON), wscale((size_t)(wsub_rows * K), POISON);
        mxs_wb_item hi = it;
        hi.primary.rows = wsub_rows;
        hi.primary.row_data = wdata.data();
        hi.primary.row_scale = wscale.data();
        hi.master = wsrc.data() + (start - wr0 * cols);
        hi.start = start - wr0 * cols;
        mxs_wb_batch hb = b;
        hb.items = &hi;
        mxs_wb_plan hplan;
        CHECK(mxs_wb_make_plan(&hb, &hplan, NULL) == MXS_OK, "host plan");
        std::vector<uint8_t> hpacked((size_t)hplan.packed_bytes);
        CHECK(mxs_host_wb_partial(&hb, &hplan, hpacked.data()) == MXS_OK, "host partial");
        CHECK(mxs_host_wb_apply(&hb, &hplan, hpacked.data()) == MXS_OK, "host apply");
        std::vector<uint8_t> g2((size_t)wsub_n), s2((size_t)(wsub_rows * K));
        CUDA_OK(cudaMemcpy(g2.data(), data + wr0 * cols, (size_t)wsub_n, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(s2.data(), scale + wr0 * K, (size_t)(wsub_rows * K), cudaMemcpyDeviceToHost));
        CHECK(memcmp(g2.data(), wdata.data(), (size_t)wsub_n) == 0, "writeback (mode %d) data past 2^31 differs", mode);
        CHECK(memcmp(s2.data(), wscale.data(), (size_t)(wsub_rows * K)) == 0, "writeback (mode %d) scales differ",
              mode);
        /* and the rows before the shard got zero exponents from this single rank */
        std::vector<uint8_t> s0((size_t)K);
        CUDA_OK(cudaMemcpy(s0.data(), scale, (size_t)K, cudaMemcpyDeviceToHost));
        bool zero = true;
        for (auto x : s0) zero = zero && x == 0;
        CHECK(zero, "writeback (mode %d): row 0 scales (outside the shard) are not 0x00", mode);
        CUDA_OK(cudaFree(ws));
    }
    cudaFree(src);
    cudaFree(data);
    cudaFree(scale);
    cudaFree(packed);
    return finish("cuda > 2^31 elements");
}
