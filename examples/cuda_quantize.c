/* SPDX-License-Identifier: MIT */
/* examples/cuda_quantize.c - copy-back on the GPU, checked against the host.
 *
 * Quantizes a bf16 weight on the device into a row-only MXFP8 primary with
 * swizzled scales (mxs_cuda_quantize, one fused pass on a stream), and
 * compares the bytes with mxs_host_quantize. First it checks that the
 * libmxshard_cuda it loaded is the one its headers describe. Without a CUDA
 * device it stops after that check (exit 0), so it also serves as a link test.
 *
 *   cc -std=c11 examples/cuda_quantize.c $(pkg-config --cflags --libs mxshard-cuda) -o cuda_quantize
 *
 * Builds as C11 and as C++ (the test suite compiles both). */
#include <mxshard/cuda.h>

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CUDA_OK(call)                                                                                                  \
    do {                                                                                                               \
        cudaError_t e_ = (call);                                                                                       \
        if (e_ != cudaSuccess) {                                                                                       \
            fprintf(stderr, "%s: %s\n", #call, cudaGetErrorString(e_));                                                \
            return 1;                                                                                                  \
        }                                                                                                              \
    } while (0)

int main(void) {
    const int64_t rows = 300, cols = 4100;
    const size_t elems = (size_t)(rows * cols);
    uint16_t *src = (uint16_t *)malloc(elems * sizeof(uint16_t));
    mxs_tensor host_w, dev_w;
    uint8_t *check_data, *check_scale;
    void *dev_src = NULL;
    size_t scale_bytes;
    cudaStream_t stream;
    mxs_status s;
    int devices = 0, same;
    size_t i;

    /* [version] */
    if (mxs_cuda_version() != MXS_VERSION_CODE) {
        fprintf(stderr, "libmxshard_cuda is version %d, the headers are %d\n", mxs_cuda_version(), MXS_VERSION_CODE);
        return 1;
    }
    /* [/version] */
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        printf("cuda_quantize: libmxshard_cuda %d loaded; no CUDA device, nothing to quantize\n", mxs_cuda_version());
        return 0;
    }
    if (!src) return 1;
    for (i = 0; i < elems; i++) src[i] = mxs_bf16_from_f32((float)(i % 1237) * 0.03125f - 19.0f);

    memset(&host_w, 0, sizeof host_w);
    host_w.rows = rows;
    host_w.cols = cols;
    host_w.dirs = MXS_ROWWISE;
    host_w.scale_layout = MXS_SCALES_SWIZZLED;
    scale_bytes = (size_t)mxs_scale_bytes(&host_w, MXS_ROWWISE);
    host_w.row_data = (uint8_t *)malloc(elems);
    host_w.row_scale = (uint8_t *)malloc(scale_bytes);
    check_data = (uint8_t *)malloc(elems);
    check_scale = (uint8_t *)malloc(scale_bytes);
    if (!host_w.row_data || !host_w.row_scale || !check_data || !check_scale) return 1;
    if ((s = mxs_host_quantize(&host_w, src, MXS_BF16, MXS_ROUND_CEIL)) != MXS_OK) {
        fprintf(stderr, "mxs_host_quantize: %s\n", mxs_status_str(s));
        return 1;
    }

    /* [cuda] */
    dev_w = host_w; /* same shape, planes and layout; device pointers */
    CUDA_OK(cudaMalloc((void **)&dev_w.row_data, elems));
    CUDA_OK(cudaMalloc((void **)&dev_w.row_scale, scale_bytes));
    CUDA_OK(cudaMalloc(&dev_src, elems * sizeof(uint16_t)));
    CUDA_OK(cudaStreamCreate(&stream));
    CUDA_OK(cudaMemcpyAsync(dev_src, src, elems * sizeof(uint16_t), cudaMemcpyHostToDevice, stream));

    s = mxs_cuda_quantize(&dev_w, dev_src, MXS_BF16, MXS_ROUND_CEIL, stream); /* enqueued on stream */
    if (s != MXS_OK) {
        fprintf(stderr, "mxs_cuda_quantize: %s\n", mxs_status_str(s));
        return 1;
    }
    CUDA_OK(cudaMemcpyAsync(check_data, dev_w.row_data, elems, cudaMemcpyDeviceToHost, stream));
    CUDA_OK(cudaMemcpyAsync(check_scale, dev_w.row_scale, scale_bytes, cudaMemcpyDeviceToHost, stream));
    CUDA_OK(cudaStreamSynchronize(stream)); /* faults during the kernel surface here */
    /* [/cuda] */

    same = memcmp(check_data, host_w.row_data, elems) == 0 && memcmp(check_scale, host_w.row_scale, scale_bytes) == 0;
    printf("cuda_quantize: %lld x %lld bf16 -> row-only MXFP8 on the GPU: %s\n", (long long)rows, (long long)cols,
           same ? "identical to the host path" : "MISMATCH");
    CUDA_OK(cudaStreamDestroy(stream));
    CUDA_OK(cudaFree(dev_src));
    CUDA_OK(cudaFree(dev_w.row_data));
    CUDA_OK(cudaFree(dev_w.row_scale));
    free(host_w.row_data);
    free(host_w.row_scale);
    free(check_data);
    free(check_scale);
    free(src);
    return same ? 0 : 1;
}
