/* SPDX-License-Identifier: MIT */
/* Suite cuda: mxs_cuda_quantize, mxs_cuda_dequantize and
 * mxs_cuda_convert_scales equal the host path byte for byte (random shapes,
 * planes, dtypes, roundings, layouts, misaligned pointers). */
#include "common.h"

static void test_quantize_case(int64_t rows, int64_t cols, unsigned dirs, mxs_scale_layout layout, mxs_dtype dtype,
                               mxs_rounding rnd_mode, bool misalign) {
    char ctx[200];
    snprintf(ctx, sizeof ctx, "quantize %lldx%lld dirs=%u layout=%d %s round=%d mis=%d", (long long)rows,
             (long long)cols, dirs, (int)layout, dtype_name(dtype), (int)rnd_mode, (int)misalign);
    std::vector<uint8_t> src = rnd_source(rows * cols, dtype);
    DevBuf dsrc = dev_alloc((int64_t)src.size(), misalign ? mxs_dtype_bytes(dtype) : 0);
    dev_upload(dsrc, src.data(), (int64_t)src.size());
    Planes P;
    planes_make(P, rows, cols, dirs, layout, misalign && rnd() % 2);
    mxs_status hs = mxs_host_quantize(&P.h, src.data(), dtype, rnd_mode);
    mxs_status ds = mxs_cuda_quantize(&P.d, dsrc.p, dtype, rnd_mode, 0);
    CUDA_OK(cudaDeviceSynchronize());
    CHECK(hs == MXS_OK && ds == MXS_OK, "%s: status host %d gpu %d", ctx, hs, ds);
    planes_compare(P, ctx);

    /* dequantize every present plane into every dtype */
    for (int p = 1; p <= 2; p++) {
        if (!(dirs & (unsigned)p)) continue;
        for (int dt = 0; dt < 3; dt++) {
            int64_t nb = rows * cols * mxs_dtype_bytes((mxs_dtype)dt);
            std::vector<uint8_t> h((size_t)nb, POISON);
            DevBuf d = dev_alloc(nb);
            mxs_status a = mxs_host_dequantize(&P.h, (mxs_dirs)p, h.data(), (mxs_dtype)dt);
            mxs_status b = mxs_cuda_dequantize(&P.d, (mxs_dirs)p, d.p, (mxs_dtype)dt, 0);
            CUDA_OK(cudaDeviceSynchronize());
            CHECK(a == MXS_OK && b == MXS_OK, "%s: dequantize status %d %d", ctx, a, b);
            char what[260];
            snprintf(what, sizeof what, "%s: dequantize plane %d to %s", ctx, p, dtype_name(dt));
            dev_compare(d, h.data(), what);
            dev_free(d);
        }
    }
    planes_free(P);
    dev_free(dsrc);
}

/* A scale plane full of random bytes (padding too) in layout `from`,
 * converted to every layout. */
static void test_convert_case(int64_t rows, int64_t cols, mxs_dirs plane) {
    for (int from = 0; from < 3; from++) {
        mxs_tensor t;
        memset(&t, 0, sizeof t);
        t.rows = rows;
        t.cols = cols;
        t.dirs = MXS_BOTH;
        t.scale_layout = (mxs_scale_layout)from;
        int64_t sb = mxs_scale_bytes(&t, plane);
        std::vector<uint8_t> src((size_t)sb);
        for (auto &x : src) x = (uint8_t)rnd();
        DevBuf dsrc = dev_alloc(sb, rnd_in(0, 3));
        dev_upload(dsrc, src.data(), sb);
        for (int to = 0; to < 3; to++) {
            t.scale_layout = (mxs_scale_layout)to;
            int64_t db = mxs_scale_bytes(&t, plane);
            std::vector<uint8_t> h((size_t)db, POISON);
            DevBuf d = dev_alloc(db, rnd_in(0, 3));
            mxs_status a = mxs_host_convert_scales(rows, cols, plane, (mxs_scale_layout)from, src.data(),
                                                   (mxs_scale_layout)to, h.data());
            mxs_status b = mxs_cuda_convert_scales(rows, cols, plane, (mxs_scale_layout)from, dsrc.p,
                                                   (mxs_scale_layout)to, d.p, 0);
            CUDA_OK(cudaDeviceSynchronize());
            CHECK(a == MXS_OK && b == MXS_OK, "convert status %d %d", a, b);
            char what[200];
            snprintf(what, sizeof what, "convert %lldx%lld plane %d %d->%d", (long long)rows, (long long)cols,
                     (int)plane, from, to);
            dev_compare(d, h.data(), what);
            dev_free(d);
        }
        dev_free(dsrc);
    }
}

int main(void) {
    require_gpu();
    printf("# quantize: fixed shapes\n");
    static const int64_t shapes[][2] = {{1, 1},   {1, 33},  {33, 1},    {32, 32},   {64, 128}, {65, 129},
                                        {7, 264}, {200, 8}, {129, 136}, {256, 512}, {1, 1000}, {300, 40}};
    for (auto &s : shapes)
        for (unsigned dirs = 1; dirs <= 3; dirs++)
            test_quantize_case(s[0], s[1], dirs, (mxs_scale_layout)(rnd() % 3), (mxs_dtype)(rnd() % 3),
                               (mxs_rounding)(rnd() % 2), false);
    printf("# quantize: random cases\n");
    for (int it = 0; it < 250; it++) {
        int64_t rows, cols;
        rnd_shape(&rows, &cols);
        test_quantize_case(rows, cols, (unsigned)rnd_in(1, 3), (mxs_scale_layout)(rnd() % 3), (mxs_dtype)(rnd() % 3),
                           (mxs_rounding)(rnd() % 2), rnd() % 4 == 0);
    }
    printf("# quantize: a larger weight per dtype (fast path, many tiles)\n");
    for (int dt = 0; dt < 3; dt++)
        test_quantize_case(1000, 1536, MXS_BOTH, MXS_SCALES_SWIZZLED, (mxs_dtype)dt, MXS_ROUND_CEIL, false);
    test_quantize_case(777, 1000, MXS_BOTH, MXS_SCALES_PADDED, MXS_BF16, MXS_ROUND_FLOOR, false);
    printf("# quantize: PADDED / SWIZZLED without padding entries (last group on the interior kernel)\n");
    for (int layout = 1; layout <= 2; layout++)
        for (unsigned dirs = 1; dirs <= 3; dirs++) {
            test_quantize_case(256, 384, dirs, (mxs_scale_layout)layout, (mxs_dtype)(rnd() % 3),
                               (mxs_rounding)(rnd() % 2), false);
            test_quantize_case(128, 228, dirs, (mxs_scale_layout)layout, (mxs_dtype)(rnd() % 3),
                               (mxs_rounding)(rnd() % 2), false);
        }

    printf("# convert_scales\n");
    for (int it = 0; it < 60; it++) {
        int64_t rows, cols;
        rnd_shape(&rows, &cols);
        test_convert_case(rows, cols, (mxs_dirs)rnd_in(1, 2));
    }
    return finish("cuda quantize / dequantize / convert_scales");
}
