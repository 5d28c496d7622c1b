/* SPDX-License-Identifier: MIT */
/* examples/copyback.c - copy-back into a row-only MXFP8 primary.
 *
 * After a parameter all-gather every rank holds the full weight in bf16;
 * copy-back re-quantizes it into the existing MXFP8 primary, writing exactly
 * the planes the primary has. Here that is the row-wise plane alone
 * (1 + 1/32 bytes per element), with its scales in the swizzled layout that
 * cuBLAS block-scaled GEMMs read.
 *
 *   cc -std=c99 -Iinclude examples/copyback.c -o copyback && ./copyback
 *
 * Builds as C99 and as C++ (the test suite compiles both). */
#include <mxshard/mxshard.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(void) {
    const int64_t rows = 256, cols = 1000; /* neither needs to be a multiple of 32 */
    uint16_t *gathered_bf16 = (uint16_t *)malloc((size_t)(rows * cols) * sizeof(uint16_t));
    float *back = (float *)malloc((size_t)(rows * cols) * sizeof(float));
    mxs_tensor w;
    mxs_status s;
    int64_t i;
    if (!gathered_bf16 || !back) return 1;
    for (i = 0; i < rows * cols; i++) gathered_bf16[i] = mxs_bf16_from_f32((float)(i % 777) / 64.0f - 6.0f);

    /* [copyback] */
    memset(&w, 0, sizeof w); /* zero means default, for every field */
    w.rows = rows;
    w.cols = cols;
    w.dirs = MXS_ROWWISE;                 /* row-only: 1 + 1/32 bytes per element */
    w.scale_layout = MXS_SCALES_SWIZZLED; /* ready for cuBLAS block-scaled GEMM */
    w.row_data = (uint8_t *)malloc((size_t)(rows * cols));
    w.row_scale = (uint8_t *)malloc((size_t)mxs_scale_bytes(&w, MXS_ROWWISE));
    if (!w.row_data || !w.row_scale) return 1;

    s = mxs_host_quantize(&w, gathered_bf16, MXS_BF16, MXS_ROUND_CEIL);
    if (s != MXS_OK) {
        fprintf(stderr, "mxs_host_quantize: %s\n", mxs_status_str(s));
        return 1;
    }
    /* w.col_data and w.col_scale are still NULL: nothing was created. */
    /* [/copyback] */

    /* The high-precision backward of a row-only weight reads it dequantized. */
    s = mxs_host_dequantize(&w, MXS_ROWWISE, back, MXS_F32);
    if (s != MXS_OK) {
        fprintf(stderr, "mxs_host_dequantize: %s\n", mxs_status_str(s));
        return 1;
    }
    printf("copy-back: %lld x %lld weight, row-only, %lld data + %lld scale bytes; w[0][1] = %g (was %g)\n",
           (long long)rows, (long long)cols, (long long)(rows * cols), (long long)mxs_scale_bytes(&w, MXS_ROWWISE),
           (double)back[1], (double)mxs_bf16_to_f32(gathered_bf16[1]));
    free(w.row_data);
    free(w.row_scale);
    free(back);
    free(gathered_bf16);
    return 0;
}
