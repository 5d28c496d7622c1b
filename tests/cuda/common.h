/* SPDX-License-Identifier: MIT */
/* tests/cuda/common.h - helpers of the `cuda` suite: TAP-ish output, skip
 * without a GPU (exit 77), random data, poisoned + guarded device buffers.
 *
 * Output is TAP: "1..0 # SKIP no CUDA device" (exit 77) without a GPU;
 * failed checks print "# FAIL file:line: ..." and fail the current test
 * point ("not ok N - name").
 *
 * Every device output lives inside a guarded allocation:
 *
 *   | guard 0xA5 x 64+mis | payload (poisoned 0xA5) | guard 0xA5 x 64 |
 *
 * and is compared, guards included, byte for byte with the host path's
 * output, which starts from the same 0xA5 poison.
 */
#ifndef MXS_TESTS_CUDA_COMMON_H
#define MXS_TESTS_CUDA_COMMON_H

#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mxshard/cuda.h>
#include <mxshard/mxshard.h>

#include <algorithm>
#include <vector>

#define POISON 0xA5
#define GUARD 64

/* The suite's state (check counters, TAP points, the random generator) is
 * `inline` (C++17): one object per program, also in a program built from
 * several files (test_nvfp4*.cu, test_wb_paths*.cu), where `static` would
 * give each file a counter and a generator of its own. */
inline int g_failures = 0, g_checks = 0;

#define CUDA_OK(x)                                                                                                     \
    do {                                                                                                               \
        cudaError_t e_ = (x);                                                                                          \
        if (e_ != cudaSuccess) {                                                                                       \
            printf("not ok - %s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));                         \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)

#define CHECK(cond, ...)                                                                                               \
    do {                                                                                                               \
        g_checks++;                                                                                                    \
        if (!(cond)) {                                                                                                 \
            g_failures++;                                                                                              \
            printf("# FAIL %s:%d: ", __FILE__, __LINE__);                                                              \
            printf(__VA_ARGS__);                                                                                       \
            printf("\n");                                                                                              \
            if (g_failures > 20) exit(1);                                                                              \
        }                                                                                                              \
    } while (0)

static inline void require_gpu(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        printf("1..0 # SKIP no CUDA device\n");
        exit(77);
    }
}

/* TAP test points: tap_point(name) closes one (ok when no CHECK failed since
 * the previous point), tap_done() prints the plan and returns the exit
 * status. (finish() is the one-point form of the older programs.) */
inline int g_tap_points = 0, g_tap_failures_before = 0;
static inline void tap_point(const char *name) {
    g_tap_points++;
    printf("%s %d - %s\n", g_failures == g_tap_failures_before ? "ok" : "not ok", g_tap_points, name);
    g_tap_failures_before = g_failures;
}
static inline int tap_done(void) {
    printf("1..%d\n", g_tap_points);
    printf("# %d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}

static inline int finish(const char *name) {
    printf("# %s: %d checks, %d failures\n", name, g_checks, g_failures);
    printf(g_failures ? "not ok - %s\n" : "ok - %s\n", name);
    return g_failures ? 1 : 0;
}

/* ---- random ---- */
inline uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static inline uint64_t rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}
static inline int64_t rnd_in(int64_t lo, int64_t hi) { return lo + (int64_t)(rnd() % (uint64_t)(hi - lo + 1)); }

/* A value with a per-block flavour: varied magnitudes, some specials. */
static inline float rnd_value(int scale_exp) {
    uint64_t r = rnd();
    switch (r % 64) {
    case 0: return mxs_f32_from_bits(0x7FC00000u | (uint32_t)(r >> 40)); /* NaN */
    case 1: return (r & 0x100) ? INFINITY : -INFINITY;
    case 2: return (r & 0x100) ? 0.0f : -0.0f;
    case 3: return mxs_f32_from_bits((uint32_t)(r >> 16) & 0x807FFFFFu); /* f32 subnormal */
    case 4: return mxs_f32_from_bits((uint32_t)(r >> 8));                /* any bits */
    default: break;
    }
    float m = (float)((int64_t)(r >> 40) - (1ll << 23)) / (float)(1 << 23); /* (-1, 1) */
    return ldexpf(m, scale_exp + (int)((r >> 8) % 5) - 2);
}

/* Stores x as element i of the `dtype` bytes v (bf16 / f16: rounded). */
static inline void put_value(std::vector<uint8_t> &v, int64_t i, mxs_dtype dtype, float x) {
    if (dtype == MXS_F32)
        memcpy(&v[(size_t)i * 4], &x, 4);
    else {
        uint16_t h = dtype == MXS_BF16 ? mxs_bf16_from_f32(x) : mxs_f16_from_f32(x);
        memcpy(&v[(size_t)i * 2], &h, 2);
    }
}

/* n source elements of `dtype` (bytes), exponents varying by stretch. */
static inline std::vector<uint8_t> rnd_source(int64_t n, mxs_dtype dtype) {
    std::vector<uint8_t> v((size_t)(n * mxs_dtype_bytes(dtype)));
    int e = 0;
    for (int64_t i = 0; i < n; i++) {
        if (i % 29 == 0) e = (int)rnd_in(-30, 30);
        if (rnd() % 500 == 0) e = (int)rnd_in(-140, 127);
        float x = rnd_value(e);
        put_value(v, i, dtype, x);
    }
    return v;
}

/* ---- guarded device buffers ---- */
struct DevBuf {
    uint8_t *base = nullptr, *p = nullptr;
    int64_t n = 0, mis = 0;
};

static inline DevBuf dev_alloc(int64_t n, int64_t mis = 0) {
    DevBuf b;
    b.n = n;
    b.mis = mis;
    CUDA_OK(cudaMalloc(&b.base, (size_t)(n + 2 * GUARD + mis)));
    CUDA_OK(cudaMemset(b.base, POISON, (size_t)(n + 2 * GUARD + mis)));
    b.p = b.base + GUARD + mis;
    return b;
}
static inline void dev_free(DevBuf &b) {
    if (b.base) cudaFree(b.base);
    b.base = b.p = nullptr;
}
static inline void dev_upload(DevBuf &b, const void *h, int64_t n) {
    CUDA_OK(cudaMemcpy(b.p, h, (size_t)n, cudaMemcpyHostToDevice));
}

/* Compares the payload with `expect` (n bytes) and checks the guards. */
static inline int dev_compare(const DevBuf &b, const uint8_t *expect, const char *what) {
    std::vector<uint8_t> all((size_t)(b.n + 2 * GUARD + b.mis));
    CUDA_OK(cudaMemcpy(all.data(), b.base, all.size(), cudaMemcpyDeviceToHost));
    for (int64_t i = 0; i < GUARD + b.mis; i++)
        if (all[(size_t)i] != POISON) {
            CHECK(0, "%s: guard before the buffer overwritten at -%lld", what, (long long)(GUARD + b.mis - i));
            return 0;
        }
    for (int64_t i = 0; i < GUARD; i++)
        if (all[(size_t)(GUARD + b.mis + b.n + i)] != POISON) {
            CHECK(0, "%s: guard after the buffer overwritten at +%lld", what, (long long)i);
            return 0;
        }
    const uint8_t *got = all.data() + GUARD + b.mis;
    for (int64_t i = 0; i < b.n; i++)
        if (got[i] != expect[i]) {
            CHECK(0, "%s: byte %lld of %lld: gpu 0x%02X host 0x%02X", what, (long long)i, (long long)b.n, got[i],
                  expect[i]);
            return 0;
        }
    g_checks++;
    return 1;
}

static inline int dev_untouched(const DevBuf &b, const char *what) {
    std::vector<uint8_t> ex((size_t)b.n, POISON);
    return dev_compare(b, ex.data(), what);
}

static inline const char *dtype_name(int d) { return d == MXS_F32 ? "f32" : d == MXS_BF16 ? "bf16" : "f16"; }

/* A random shape: tiny, odd, multiples of 8/32/128. */
static inline void rnd_shape(int64_t *rows, int64_t *cols) {
    static const int64_t picks[] = {1, 2, 7, 8, 31, 32, 33, 63, 64, 65, 96, 127, 128, 129, 136, 200, 256, 264};
    *rows = rnd() % 3 == 0 ? picks[rnd() % 18] : rnd_in(1, 150);
    *cols = rnd() % 3 == 0 ? picks[rnd() % 18] : (rnd() % 2 ? rnd_in(1, 300) : 8 * rnd_in(1, 48));
}

/* One tensor's planes on host and device, poisoned. */
struct Planes {
    mxs_tensor h, d;
    std::vector<uint8_t> hbuf[4];
    DevBuf dbuf[4];
};

/* A row-only descriptor over caller-given device planes. */
static inline mxs_tensor row_only(int64_t rows, int64_t cols, mxs_scale_layout layout, uint8_t *data, uint8_t *scale) {
    mxs_tensor t;
    memset(&t, 0, sizeof t);
    t.rows = rows;
    t.cols = cols;
    t.dirs = MXS_ROWWISE;
    t.scale_layout = layout;
    t.row_data = data;
    t.row_scale = scale;
    return t;
}

static inline void planes_make(Planes &P, int64_t rows, int64_t cols, unsigned dirs, mxs_scale_layout layout,
                               bool misalign) {
    memset(&P.h, 0, sizeof P.h);
    P.h.rows = rows;
    P.h.cols = cols;
    P.h.dirs = dirs;
    P.h.scale_layout = layout;
    P.d = P.h;
    for (int p = 0; p < 2; p++) {
        if (!(dirs & (unsigned)(p + 1))) continue;
        int64_t db = rows * cols, sb = mxs_scale_bytes(&P.h, (mxs_dirs)(p + 1));
        P.hbuf[2 * p].assign((size_t)db, POISON);
        P.hbuf[2 * p + 1].assign((size_t)sb, POISON);
        P.dbuf[2 * p] = dev_alloc(db, misalign ? rnd_in(1, 7) : 0);
        P.dbuf[2 * p + 1] = dev_alloc(sb, misalign ? rnd_in(1, 3) : 0);
    }
    P.h.row_data = P.hbuf[0].data();
    P.h.row_scale = P.hbuf[1].data();
    P.h.col_data = P.hbuf[2].data();
    P.h.col_scale = P.hbuf[3].data();
    P.d.row_data = P.dbuf[0].p;
    P.d.row_scale = P.dbuf[1].p;
    P.d.col_data = P.dbuf[2].p;
    P.d.col_scale = P.dbuf[3].p;
    if (!(dirs & MXS_ROWWISE)) P.h.row_data = P.h.row_scale = P.d.row_data = P.d.row_scale = nullptr;
    if (!(dirs & MXS_COLWISE)) P.h.col_data = P.h.col_scale = P.d.col_data = P.d.col_scale = nullptr;
}

static inline int planes_compare(Planes &P, const char *ctx) {
    static const char *names[4] = {"row data", "row scale", "col data", "col scale"};
    int ok = 1;
    for (int k = 0; k < 4; k++) {
        if (!P.dbuf[k].base) continue;
        char what[256];
        snprintf(what, sizeof what, "%s: %s", ctx, names[k]);
        ok &= dev_compare(P.dbuf[k], P.hbuf[k].data(), what);
    }
    return ok;
}

static inline void planes_free(Planes &P) {
    for (int k = 0; k < 4; k++) dev_free(P.dbuf[k]);
}

#endif
