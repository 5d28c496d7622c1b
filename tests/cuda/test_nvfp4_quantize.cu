/* SPDX-License-Identifier: MIT */
/* Suite cuda, NVFP4 part 2 (test_nvfp4.cu): quantize (twice on the same
 * buffers), dequantize and scale conversion == the host, over random shapes,
 * every plane set, block shape, layout, source dtype and round-through. */
#include "nvfp4_cases.h"

/* ---- 2 quantize / dequantize / convert ---------------------------------------------- */

static void quantize_case(int64_t rows, int64_t cols, unsigned dirs, int block, int layout, mxs_dtype dtype,
                          mxs_dtype rt, bool mis = false) {
    char ctx[200];
    snprintf(ctx, sizeof ctx, "nvfp4 quantize %lldx%lld dirs=%u block=%d layout=%d %s rt=%s", (long long)rows,
             (long long)cols, dirs, block, layout, dtype_name(dtype), dtype_name(rt));
    Nv T;
    nv_make(T, rows, cols, dirs, block, layout, false, true, mis);
    const int64_t n = rows * cols, esz = mxs_dtype_bytes(dtype);
    for (int round = 0; round < 2; round++) { /* the second one over the first one's bytes */
        std::vector<uint8_t> src = nv_source(n, dtype);
        DevBuf dsrc = dev_alloc(n * esz, esz * rnd_in(0, 3));
        dev_upload(dsrc, src.data(), n * esz);
        mxs_status hs = mxs_host_nvfp4_quantize(&T.h, src.data(), dtype, rt);
        mxs_status ds = mxs_cuda_nvfp4_quantize(&T.d, dsrc.p, dtype, rt, 0);
        CUDA_OK(cudaDeviceSynchronize());
        CHECK(hs == MXS_OK && ds == MXS_OK, "%s: status host %d gpu %d", ctx, hs, ds);
        nv_compare(T, ctx);
        dev_free(dsrc);
    }
    for (int p = 1; p <= 2; p++) {
        if (!(dirs & (unsigned)p)) continue;
        const mxs_dtype dt = (mxs_dtype)(rnd() % 3);
        const int64_t nb = n * mxs_dtype_bytes(dt);
        std::vector<uint8_t> h((size_t)nb, POISON);
        DevBuf d = dev_alloc(nb);
        mxs_status a = mxs_host_nvfp4_dequantize(&T.h, (mxs_dirs)p, h.data(), dt);
        mxs_status b = mxs_cuda_nvfp4_dequantize(&T.d, (mxs_dirs)p, d.p, dt, 0);
        CUDA_OK(cudaDeviceSynchronize());
        CHECK(a == MXS_OK && b == MXS_OK, "%s: dequantize status %d %d", ctx, a, b);
        char what[260];
        snprintf(what, sizeof what, "%s: dequantize plane %d to %s", ctx, p, dtype_name(dt));
        dev_compare(d, h.data(), what);
        dev_free(d);

        const int to = (int)(rnd() % 3);
        const int64_t sb = nv_scale_bytes(rows, cols, to, (mxs_dirs)p);
        std::vector<uint8_t> hc((size_t)sb, POISON);
        DevBuf dc = dev_alloc(sb, rnd_in(0, 3));
        a = mxs_host_nvfp4_convert_scales(rows, cols, (mxs_dirs)p, (mxs_scale_layout)layout,
                                          p == 1 ? T.h.row_scale : T.h.col_scale, (mxs_scale_layout)to, hc.data());
        b = mxs_cuda_nvfp4_convert_scales(rows, cols, (mxs_dirs)p, (mxs_scale_layout)layout,
                                          p == 1 ? T.d.row_scale : T.d.col_scale, (mxs_scale_layout)to, dc.p, 0);
        CUDA_OK(cudaDeviceSynchronize());
        CHECK(a == MXS_OK && b == MXS_OK, "%s: convert status %d %d", ctx, a, b);
        snprintf(what, sizeof what, "%s: convert plane %d %d->%d", ctx, p, layout, to);
        dev_compare(dc, hc.data(), what);
        dev_free(dc);
    }
    nv_free(T);
}

void test_quantize(void) {
    /* every (dirs, block, layout, dtype, round-through): 3*2*3*3*3 = 162 */
    for (int c = 0; c < 2 * 162; c++) {
        const int k = c % 162;
        int64_t rows = rdim(150), cols = rdim(300);
        if (c % 40 == 0) cols = rnd_in(300, 700);
        if (c % 2) cols = 8 * mxs_ceil_div(cols, 8);       /* the warp-tile path */
        if (c % 4 < 2) rows = 16 * mxs_ceil_div(rows, 16); /* ... with a column-wise plane */
        quantize_case(rows, cols, (unsigned)(k % 3 + 1), (k / 3) % 2, (k / 6) % 3, (mxs_dtype)((k / 18) % 3),
                      (mxs_dtype)((k / 54) % 3), c % 5 == 0);
    }
    quantize_case(1024, 2056, MXS_BOTH, MXS_NVFP4_1X16, MXS_SCALES_SWIZZLED, MXS_BF16, MXS_BF16);
    quantize_case(512, 1544, MXS_BOTH, MXS_NVFP4_16X16, MXS_SCALES_PADDED, MXS_F32, MXS_BF16);
    quantize_case(300, 1032, MXS_ROWWISE, MXS_NVFP4_1X16, MXS_SCALES_COMPACT, MXS_F16, MXS_F16, true);
    quantize_case(1, 1, MXS_BOTH, MXS_NVFP4_16X16, MXS_SCALES_SWIZZLED, MXS_BF16, MXS_BF16);
    quantize_case(513, 1000, MXS_BOTH, MXS_NVFP4_16X16, MXS_SCALES_SWIZZLED, MXS_BF16, MXS_BF16);
    quantize_case(1000, 513, MXS_BOTH, MXS_NVFP4_1X16, MXS_SCALES_PADDED, MXS_F32, MXS_F32);
}
