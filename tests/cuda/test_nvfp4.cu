/* SPDX-License-Identifier: MIT */
/* Suite cuda: NVFP4 on the GPU (<mxshard/cuda_nvfp4.h>) equals the host
 * library byte for byte.
 *
 *   1 the E2M1 oracle vectors (tests/vectors/e2m1_*.txt) through a kernel
 *     calling nvfp4.h's conversion rules (the path this device compiles);
 *     and the device rule - one element, pairs and the 8-wide packing the
 *     kernels store - against the boundary count for all 2^32 f32 patterns;
 *   2 quantize (twice on the same buffers), dequantize and scale conversion
 *     == the host, over random shapes (1-element dims, non-multiples of 16),
 *     every plane set, block shape, layout, source dtype and round-through;
 *   3 the sharded writeback on R simulated ranks on one GPU: partial (packed
 *     == the host's partial), ONE MAX reduction (on the host, counted), apply,
 *     the byte gather (device copies), finish; every buffer == the host
 *     writeback's after each phase, and every rank's primary == a
 *     whole-tensor host quantize; two updates on the same buffers; poisoned
 *     and guarded outputs; a remote failure writes nothing;
 *   4 partial / apply / finish captured in a CUDA graph and replayed with new
 *     masters give the same bytes;
 *   5 bad input is rejected with nothing written.
 *
 * Fragments (FSDP, contract 9.8) ride along in 3: on a third of the ranks'
 * planes apply writes a fragment (device fragments at random alignments and
 * shard starts: the 32-bit and the byte stores) == the host's fragment, the
 * replaced data pointer NULL or kept; the gather reads the fragments, finish
 * skips those items and mxs_cuda_nvfp4_stage_to_col == the host's transposes
 * the gathered stage - unprepared, prepared and in graphs.
 */
#include "common.h"

#include <mxshard/cuda_nvfp4.h>

#ifndef MXS_VECTORS_DIR
#define MXS_VECTORS_DIR "tests/vectors"
#endif

static FILE *open_vectors(const char *name) {
    char path[1024];
    const char *dir = getenv("MXS_VECTORS_DIR");
    snprintf(path, sizeof path, "%s/%s", dir ? dir : MXS_VECTORS_DIR, name);
    return fopen(path, "r");
}

static void expect(mxs_status got, mxs_status want, const char *what) {
    CHECK(got == want, "%s: status %d (%s), expected %d", what, (int)got, mxs_status_str(got), (int)want);
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

static void test_oracle(void) {
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
static void test_e2m1_exhaustive() {
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

/* ---- NVFP4 tensors on host and device ---------------------------------------------- */

/* Buffers: 0 row data, 1 row scale, 2 col data, 3 col scale, 4 amax. */
struct Nv {
    mxs_nvfp4_tensor h, d;
    std::vector<uint8_t> hb[5];
    DevBuf db[5];
};

static int64_t nv_scale_bytes(int64_t rows, int64_t cols, int layout, mxs_dirs plane) {
    mxs_nvfp4_tensor t;
    memset(&t, 0, sizeof t);
    t.rows = rows;
    t.cols = cols;
    t.dirs = MXS_BOTH;
    t.scale_layout = (mxs_scale_layout)layout;
    return mxs_nvfp4_scale_bytes(&t, plane);
}

/* all_planes: absent planes get (poisoned) buffers too - they must stay
 * untouched; else their pointers are NULL. device: also the device side;
 * mis: its planes at odd offsets (the kernels' byte-store paths). */
static void nv_make(Nv &T, int64_t rows, int64_t cols, unsigned dirs, int block, int layout, bool all_planes,
                    bool device, bool mis = false) {
    uint8_t *hp[5], *dp[5];
    memset(&T.h, 0, sizeof T.h);
    T.h.rows = rows;
    T.h.cols = cols;
    T.h.dirs = dirs;
    T.h.block = (mxs_nvfp4_block)block;
    T.h.scale_layout = (mxs_scale_layout)layout;
    T.d = T.h;
    for (int k = 0; k < 5; k++) {
        const int p = k / 2;
        int64_t n = k == 4       ? 4
                    : k % 2 == 0 ? (rows * cols + 1) / 2
                                 : nv_scale_bytes(rows, cols, layout, (mxs_dirs)(p + 1));
        hp[k] = dp[k] = nullptr;
        if (k < 4 && !all_planes && !(dirs & (unsigned)(p + 1))) continue;
        T.hb[k].assign((size_t)n, POISON);
        hp[k] = T.hb[k].data();
        if (device) {
            T.db[k] = dev_alloc(n, mis && k < 4 ? rnd_in(1, k % 2 == 0 ? 7 : 3) : 0);
            dp[k] = T.db[k].p;
        }
    }
    T.h.row_data = hp[0];
    T.h.row_scale = hp[1];
    T.h.col_data = hp[2];
    T.h.col_scale = hp[3];
    T.h.amax = (float *)(void *)hp[4];
    T.d.row_data = dp[0];
    T.d.row_scale = dp[1];
    T.d.col_data = dp[2];
    T.d.col_scale = dp[3];
    T.d.amax = (float *)(void *)dp[4];
}

static void nv_free(Nv &T) {
    for (int k = 0; k < 5; k++) dev_free(T.db[k]);
}

static const char *buf_names[5] = {"row data", "row scale", "col data", "col scale", "amax"};

/* Device buffers == host buffers (guards included). */
static void nv_compare(const Nv &T, const char *ctx) {
    for (int k = 0; k < 5; k++) {
        if (!T.db[k].base) continue;
        char what[512];
        snprintf(what, sizeof what, "%s: %s", ctx, buf_names[k]);
        dev_compare(T.db[k], T.hb[k].data(), what);
    }
}

/* Dimensions where NVFP4 edges go wrong: 1, small, around multiples of 16. */
static int64_t rdim(int64_t max) {
    int64_t d;
    switch (rnd() % 4) {
    case 0: d = 1; break;
    case 1: d = rnd_in(1, 40); break;
    case 2: d = 16 * rnd_in(1, 6) + rnd_in(-1, 1); break;
    default: d = rnd_in(1, max); break;
    }
    return d < 1 ? 1 : (d > max ? max : d);
}

/* Source data: the suite's wide-range values, or moderate finite ones. */
static std::vector<uint8_t> nv_source(int64_t n, mxs_dtype dtype) {
    if (rnd() % 2) return rnd_source(n, dtype);
    std::vector<uint8_t> v((size_t)(n * mxs_dtype_bytes(dtype)));
    for (int64_t i = 0; i < n; i++) {
        float x = ldexpf((float)rnd_in(-1000, 1000) / 256.0f, (int)rnd_in(-8, 8));
        put_value(v, i, dtype, x);
    }
    return v;
}

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

static void test_quantize(void) {
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

/* ---- 3 the sharded writeback on R simulated ranks ------------------------------------ */

#define MAXR 4
#define MAXW 70 /* a batch of more than 2 launch chunks (MXS_CUDA_NVFP4_CHUNK) */

enum { SH_BUCKET, SH_RANDOM, SH_REPLICA, SH_OVERLAP, SH_KINDS };

struct WSpec {
    int64_t rows, cols, offset;
    unsigned dirs;
    int block, layout, stage;
    mxs_dtype mdt;
};

struct RankW { /* one rank's buffers of one weight: host mirror and device */
    Nv T;
    std::vector<uint8_t> hstage, hmaster;
    DevBuf dstage, dmaster;
    mxs_range shard;
    std::vector<uint8_t> hfrag[2]; /* row, stage fragment (one byte more: never empty, so never NULL) */
    DevBuf dfrag[2];
    bool frag[2];
};

struct Group {
    int R, nw;
    mxs_dtype rt;
    WSpec w[MAXW];
    std::vector<uint8_t> full[MAXW];
    Nv ref[MAXW]; /* host only: whole-tensor quantize */
    RankW rw[MAXR][MAXW];
    mxs_nvfp4_wb_item hit[MAXR][MAXW], dit[MAXR][MAXW];
    mxs_nvfp4_wb_batch hb[MAXR], db[MAXR];
    mxs_nvfp4_wb_plan hplan[MAXR], dplan[MAXR];
    std::vector<uint8_t> hpacked[MAXR];
    DevBuf dpacked[MAXR];
    bool use_bucket; /* device phases through the prepared buckets */
    mxs_cuda_nvfp4_wb_bucket bk[MAXR];
    DevBuf ws[MAXR];
    int64_t reductions;
    char what[200];
};

static int g_combo = 0; /* cycles the weights through every combination */
static int g_frags = 0; /* fragments made (the FSDP path is exercised) */

/* The contract's rule, written out: the item's column-wise values go to a
 * fragment (finish skips it; the caller transposes the gathered stage). */
static bool col_to_fragment(const mxs_nvfp4_wb_item &it) {
    return it.stage_fragment != nullptr || (it.col_stage == nullptr && it.row_fragment != nullptr);
}

static int64_t even_between(int64_t lo, int64_t hi) { return lo + 2 * rnd_in(0, (hi - lo) / 2); }

static void make_shards(Group &g, int sharding, int64_t used) {
    const int64_t bucket = mxs_nvfp4_bucket_elems(used, g.R);
    int64_t cut[MAXR + 1];
    cut[0] = 0;
    cut[g.R] = used + (used & 1);
    for (int q = 1; q < g.R; q++) cut[q] = even_between(0, cut[g.R]);
    for (int q = 2; q < g.R; q++) /* sort the cuts */
        for (int k = q; k > 1 && cut[k] < cut[k - 1]; k--) {
            const int64_t t = cut[k];
            cut[k] = cut[k - 1];
            cut[k - 1] = t;
        }
    for (int q = 0; q < g.R; q++)
        for (int w = 0; w < g.nw; w++) {
            const int64_t elems = g.w[w].rows * g.w[w].cols, chunk = bucket / g.R;
            mxs_range s;
            s.first = s.count = 0;
            if (sharding == SH_BUCKET) {
                mxs_status st = mxs_nvfp4_bucket_shard(g.w[w].offset, elems, bucket, g.R, q, &s);
                CHECK(st == MXS_OK, "%s: bucket shard", g.what);
            } else if (sharding == SH_RANDOM) {
                s = mxs_range_in_weight(cut[q], cut[q + 1], g.w[w].offset, elems);
            } else if (sharding == SH_REPLICA) {
                s.first = 0;
                s.count = elems;
            } else {
                const int64_t widen = 2 * rnd_in(0, 20), lo = q * chunk - widen, hi = (q + 1) * chunk + widen;
                s = mxs_range_in_weight(lo < 0 ? 0 : lo, hi, g.w[w].offset, elems);
            }
            CHECK(mxs_nvfp4_shard_check(elems, s.first, s.count) == MXS_OK, "%s: even shard", g.what);
            g.rw[q][w].shard = s;
        }
}

static void group_make(Group &g, int R, int sharding, int nw, int64_t maxdim = 90, bool allow_mis = true) {
    int64_t used = 0;
    g.R = R;
    g.nw = nw;
    g.reductions = 0;
    g.rt = rnd() % 3 == 0 ? MXS_BF16 : (mxs_dtype)(rnd() % 3);
    for (int w = 0; w < g.nw; w++) {
        WSpec &s = g.w[w];
        const int k = g_combo++ % 54; /* dirs x block x layout x master dtype */
        s.rows = rdim(maxdim);
        s.cols = rdim(maxdim);
        if (maxdim >= 90 && rnd() % 8 == 0) s.cols = rnd_in(200, 600);
        if (rnd() % 2 == 0) s.cols = 8 * mxs_ceil_div(s.cols, 8);   /* the kernels' warp-tile path */
        if (rnd() % 3 == 0) s.rows = 16 * mxs_ceil_div(s.rows, 16); /* finish's warp tiles */
        s.dirs = (unsigned)(k % 3 + 1);
        s.block = (k / 3) % 2;
        s.layout = (k / 6) % 3;
        s.mdt = (mxs_dtype)((k / 18) % 3);
        s.stage = !(s.block == MXS_NVFP4_16X16 && s.dirs == MXS_BOTH && rnd() % 2);
        s.offset = mxs_nvfp4_bucket_place(used);
        used = s.offset + s.rows * s.cols;
        nv_make(g.ref[w], s.rows, s.cols, s.dirs, s.block, s.layout, false, false);
    }
    snprintf(g.what, sizeof g.what, "R=%d sharding %d rt %s w0 %lldx%lld dirs %u block %d layout %d %s stage %d", R,
             sharding, dtype_name(g.rt), (long long)g.w[0].rows, (long long)g.w[0].cols, g.w[0].dirs, g.w[0].block,
             g.w[0].layout, dtype_name(g.w[0].mdt), g.w[0].stage);
    make_shards(g, sharding, used);
    for (int q = 0; q < R; q++) {
        for (int w = 0; w < g.nw; w++) {
            const WSpec &s = g.w[w];
            RankW &b = g.rw[q][w];
            const int64_t db = (s.rows * s.cols + 1) / 2, mb = b.shard.count * mxs_dtype_bytes(s.mdt);
            const bool mis = allow_mis && rnd() % 4 == 0; /* planes, stage and master off their vector grids */
            nv_make(b.T, s.rows, s.cols, s.dirs, s.block, s.layout, true, true, mis);
            b.hstage.assign((size_t)db, POISON);
            b.dstage = dev_alloc(db, mis ? rnd_in(1, 7) : 0);
            b.hmaster.assign((size_t)mb + 1, POISON);
            b.dmaster = dev_alloc(mb, mis ? mxs_dtype_bytes(s.mdt) * rnd_in(1, 7) : 0);
            bool stage = (s.dirs & MXS_COLWISE) && s.stage;
            /* fragments on a third of the planes; the replaced pointers NULL or kept (the fragment wins) */
            const int64_t fb = mxs_nvfp4_fragment_bytes(b.shard.first, b.shard.count);
            b.frag[0] = (s.dirs & MXS_ROWWISE) && rnd() % 3 == 0;
            b.frag[1] = (s.dirs & MXS_COLWISE) && rnd() % 3 == 0;
            for (int p = 0; p < 2; p++) {
                if (!b.frag[p]) continue;
                g_frags++;
                b.hfrag[p].assign((size_t)fb + 1, POISON);
                b.dfrag[p] = dev_alloc(fb, rnd() % 3 == 0 ? rnd_in(1, 7) : 0);
            }
            const bool no_row_data = b.frag[0] && rnd() % 2, no_col_data = rnd() % 2;
            if (b.frag[1] && rnd() % 2) stage = false;
            for (int side = 0; side < 2; side++) {
                mxs_nvfp4_wb_item &it = side ? g.dit[q][w] : g.hit[q][w];
                memset(&it, 0, sizeof it);
                it.primary = side ? b.T.d : b.T.h;
                it.master = side ? (const void *)b.dmaster.p : (const void *)b.hmaster.data();
                it.master_dtype = s.mdt;
                it.start = b.shard.first;
                it.len = b.shard.count;
                it.col_stage = stage ? (side ? b.dstage.p : b.hstage.data()) : nullptr;
                if (b.frag[0]) it.row_fragment = side ? b.dfrag[0].p : b.hfrag[0].data();
                if (b.frag[1]) it.stage_fragment = side ? b.dfrag[1].p : b.hfrag[1].data();
                if (no_row_data) it.primary.row_data = nullptr;
                if (no_col_data && col_to_fragment(it)) it.primary.col_data = nullptr;
            }
        }
        for (int side = 0; side < 2; side++) {
            mxs_nvfp4_wb_batch &bt = side ? g.db[q] : g.hb[q];
            memset(&bt, 0, sizeof bt);
            bt.items = side ? g.dit[q] : g.hit[q];
            bt.n_items = g.nw;
            bt.round_through = g.rt;
            expect(mxs_nvfp4_wb_make_plan(&bt, side ? &g.dplan[q] : &g.hplan[q], NULL), MXS_OK, "plan");
        }
        CHECK(g.dplan[q].fingerprint == g.hplan[0].fingerprint && g.dplan[q].packed_bytes == g.hplan[0].packed_bytes,
              "%s: ranks agree on the plan", g.what);
        g.hpacked[q].assign((size_t)g.hplan[q].packed_bytes, POISON);
        /* 2-byte entries at 2 mod 4 sometimes: the tensor-amax CAS must touch no byte outside (guards) */
        g.dpacked[q] =
            dev_alloc(g.dplan[q].packed_bytes, allow_mis && g.dplan[q].entry_bytes == 2 && rnd() % 2 ? 2 : 0);
    }
}

static void group_free(Group &g) {
    for (int q = 0; q < g.R; q++) {
        for (int w = 0; w < g.nw; w++) {
            nv_free(g.rw[q][w].T);
            dev_free(g.rw[q][w].dstage);
            dev_free(g.rw[q][w].dmaster);
            dev_free(g.rw[q][w].dfrag[0]);
            dev_free(g.rw[q][w].dfrag[1]);
        }
        dev_free(g.dpacked[q]);
        dev_free(g.ws[q]);
    }
}

/* New master values; the reference; every rank's shard uploaded. */
static void group_fill(Group &g) {
    for (int w = 0; w < g.nw; w++) {
        const WSpec &s = g.w[w];
        const int64_t esz = mxs_dtype_bytes(s.mdt);
        g.full[w] = nv_source(s.rows * s.cols, s.mdt);
        expect(mxs_host_nvfp4_quantize(&g.ref[w].h, g.full[w].data(), s.mdt, g.rt), MXS_OK, "reference quantize");
        for (int q = 0; q < g.R; q++) {
            RankW &b = g.rw[q][w];
            memcpy(b.hmaster.data(), g.full[w].data() + b.shard.first * esz, (size_t)(b.shard.count * esz));
            dev_upload(b.dmaster, b.hmaster.data(), b.shard.count * esz);
        }
    }
}

/* Every device buffer of every rank == its host mirror. */
static void group_compare(const Group &g, const char *phase) {
    char ctx[300];
    for (int q = 0; q < g.R; q++) {
        for (int w = 0; w < g.nw; w++) {
            const RankW &b = g.rw[q][w];
            snprintf(ctx, sizeof ctx, "%s: %s: rank %d w%d", g.what, phase, q, w);
            nv_compare(b.T, ctx);
            char what[512];
            snprintf(what, sizeof what, "%s: column stage", ctx);
            dev_compare(b.dstage, b.hstage.data(), what);
            snprintf(what, sizeof what, "%s: master", ctx);
            dev_compare(b.dmaster, b.hmaster.data(), what);
            for (int p = 0; p < 2; p++) {
                if (!b.frag[p]) continue;
                snprintf(what, sizeof what, "%s: %s fragment (shard [%lld, +%lld), device at %lld mod 8)", ctx,
                         p ? "stage" : "row", (long long)b.shard.first, (long long)b.shard.count,
                         (long long)((uintptr_t)b.dfrag[p].p % 8u));
                dev_compare(b.dfrag[p], b.hfrag[p].data(), what);
            }
        }
        snprintf(ctx, sizeof ctx, "%s: %s: rank %d packed", g.what, phase, q);
        dev_compare(g.dpacked[q], g.hpacked[q].data(), ctx);
    }
}

/* Every rank's present planes and amax == the whole-tensor reference. */
static void group_check_reference(const Group &g) {
    char ctx[300];
    for (int q = 0; q < g.R; q++)
        for (int w = 0; w < g.nw; w++)
            for (int k = 0; k < 5; k++) {
                if (k < 4 && !(g.w[w].dirs & (unsigned)(k / 2 + 1))) continue;
                snprintf(ctx, sizeof ctx, "%s: rank %d w%d (%lldx%lld dirs %u block %d) %s == whole-tensor quantize",
                         g.what, q, w, (long long)g.w[w].rows, (long long)g.w[w].cols, g.w[w].dirs, g.w[w].block,
                         buf_names[k]);
                dev_compare(g.rw[q][w].T.db[k], g.ref[w].hb[k].data(), ctx);
            }
}

/* The one MAX reduction: over the host mirrors' packed entries (== the
 * device's, compared after partial), the result uploaded to every rank. */
static void group_reduce(Group &g, bool fail) {
    const int64_t n = g.hplan[0].packed_count, wd = g.hplan[0].entry_bytes;
    g.reductions++;
    for (int64_t i = 0; i < n; i++) {
        uint32_t m = 0;
        for (int q = 0; q < g.R; q++) {
            const uint32_t v = mxs__nvfp4_entry_get(g.hpacked[q].data(), wd, i);
            m = v > m ? v : m;
        }
        for (int q = 0; q < g.R; q++) {
            if (wd == 2)
                ((uint16_t *)(void *)g.hpacked[q].data())[i] = (uint16_t)m;
            else
                ((uint32_t *)(void *)g.hpacked[q].data())[i] = m;
        }
    }
    for (int q = 0; q < g.R; q++) {
        if (fail) g.hpacked[q][(size_t)g.hplan[q].status_offset] = 1; /* some rank failed */
        dev_upload(g.dpacked[q], g.hpacked[q].data(), g.hplan[q].packed_bytes);
    }
}

/* Where rank p's apply put its bytes [start/2, ceil(end/2)) of weight w's
 * row-wise plane (plane 0) or stage (1) - a fragment, or the plane / stage
 * at start/2; the stage of a 16x16 item without one: its row-wise bytes (the
 * same nibbles) - on the host (side 0) or the device (1). */
static uint8_t *applied_bytes(Group &g, int p, int w, int plane, int side) {
    RankW &b = g.rw[p][w];
    const int64_t b0 = b.shard.first / 2;
    if (plane == 1 && !b.frag[1] && !g.hit[p][w].col_stage) plane = 0;
    if (b.frag[plane]) return side ? b.dfrag[plane].p : b.hfrag[plane].data();
    if (plane == 0) return (side ? b.T.db[0].p : b.T.hb[0].data()) + b0;
    return (side ? b.dstage.p : b.hstage.data()) + b0;
}

/* The parameter all-gather, by hand: every rank's bytes [start/2,
 * ceil(end/2)) of the row-wise plane and of the stage (from its fragments
 * where it has them) into every rank's full row-wise plane and stage. */
static void group_gather(Group &g) {
    for (int w = 0; w < g.nw; w++)
        for (int q = 0; q < g.R; q++)
            for (int p = 0; p < g.R; p++) {
                const mxs_range s = g.rw[p][w].shard;
                if (s.count == 0) continue;
                const int64_t b0 = s.first / 2, nb = mxs_nvfp4_fragment_bytes(s.first, s.count);
                RankW &dst = g.rw[q][w];
                for (int plane = 0; plane < 2; plane++) {
                    if (!(g.w[w].dirs & (unsigned)(plane + 1))) continue;
                    uint8_t *hd = (plane == 0 ? dst.T.hb[0].data() : dst.hstage.data()) + b0;
                    uint8_t *dd = (plane == 0 ? dst.T.db[0].p : dst.dstage.p) + b0;
                    const uint8_t *hs = applied_bytes(g, p, w, plane, 0), *ds = applied_bytes(g, p, w, plane, 1);
                    if (hs == hd) continue; /* the rank's own bytes, in place */
                    memcpy(hd, hs, (size_t)nb);
                    CUDA_OK(cudaMemcpy(dd, ds, (size_t)nb, cudaMemcpyDeviceToDevice));
                }
            }
}

/* After finish (which skips them): the column-wise planes of the items whose
 * column values went to fragments, by the standalone transpose of the
 * gathered stage, on the host and the device. */
static void group_stage_to_col(Group &g) {
    for (int q = 0; q < g.R; q++)
        for (int w = 0; w < g.nw; w++) {
            RankW &b = g.rw[q][w];
            if (!(g.w[w].dirs & MXS_COLWISE) || !col_to_fragment(g.hit[q][w])) continue;
            expect(mxs_host_nvfp4_stage_to_col(&b.T.h, b.hstage.data()), MXS_OK, "host stage_to_col");
            expect(mxs_cuda_nvfp4_stage_to_col(&b.T.d, b.dstage.p, 0), MXS_OK, "gpu stage_to_col");
        }
    CUDA_OK(cudaDeviceSynchronize());
}

/* Graphs of one rank's phases (captured once, replayed every step). */
struct RankGraphs {
    cudaGraphExec_t exec[3];
};

static void capture(cudaStream_t st, cudaGraphExec_t *exec, const Group &g, int q, int phase) {
    cudaGraph_t graph;
    mxs_status s;
    CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    if (g.use_bucket)
        s = phase == 0   ? mxs_cuda_nvfp4_wb_bucket_partial(&g.bk[q], st)
            : phase == 1 ? mxs_cuda_nvfp4_wb_bucket_apply(&g.bk[q], st)
                         : mxs_cuda_nvfp4_wb_bucket_finish(&g.bk[q], st);
    else if (phase == 0)
        s = mxs_cuda_nvfp4_wb_partial(&g.db[q], &g.dplan[q], g.dpacked[q].p, st);
    else if (phase == 1)
        s = mxs_cuda_nvfp4_wb_apply(&g.db[q], &g.dplan[q], g.dpacked[q].p, st);
    else
        s = mxs_cuda_nvfp4_wb_finish(&g.db[q], &g.dplan[q], st);
    CUDA_OK(cudaStreamEndCapture(st, &graph));
    expect(s, MXS_OK, "phase under capture");
    if (g.use_bucket) { /* one launch per phase whatever the number of items (partial: + its memset) */
        size_t nodes = 0;
        CUDA_OK(cudaGraphGetNodes(graph, nullptr, &nodes));
        CHECK(nodes <= (phase == 0 ? 2u : 1u), "%s: bucket phase %d: %zu graph nodes for %d items", g.what, phase,
              nodes, g.nw);
    }
    CUDA_OK(cudaGraphInstantiate(exec, graph, 0));
    CUDA_OK(cudaGraphDestroy(graph));
}

/* One device phase of rank q: a direct call, or the replay of its graph. */
static void run_phase(Group &g, int q, int phase, RankGraphs *graphs, cudaStream_t st) {
    if (graphs) {
        CUDA_OK(cudaDeviceSynchronize()); /* uploads ran on the legacy stream */
        CUDA_OK(cudaGraphLaunch(graphs[q].exec[phase], st));
        CUDA_OK(cudaStreamSynchronize(st));
        return;
    }
    mxs_status s = g.use_bucket ? (phase == 0   ? mxs_cuda_nvfp4_wb_bucket_partial(&g.bk[q], 0)
                                   : phase == 1 ? mxs_cuda_nvfp4_wb_bucket_apply(&g.bk[q], 0)
                                                : mxs_cuda_nvfp4_wb_bucket_finish(&g.bk[q], 0))
                   : phase == 0 ? mxs_cuda_nvfp4_wb_partial(&g.db[q], &g.dplan[q], g.dpacked[q].p, 0)
                   : phase == 1 ? mxs_cuda_nvfp4_wb_apply(&g.db[q], &g.dplan[q], g.dpacked[q].p, 0)
                                : mxs_cuda_nvfp4_wb_finish(&g.db[q], &g.dplan[q], 0);
    CUDA_OK(cudaDeviceSynchronize());
    expect(s, MXS_OK, phase == 0 ? "gpu partial" : phase == 1 ? "gpu apply" : "gpu finish");
}

/* One writeback step on every rank, host mirror and device side by side. */
static void group_step(Group &g, RankGraphs *graphs, cudaStream_t st) {
    const int64_t before = g.reductions;
    for (int q = 0; q < g.R; q++) {
        expect(mxs_host_nvfp4_wb_partial(&g.hb[q], &g.hplan[q], g.hpacked[q].data()), MXS_OK, "host partial");
        run_phase(g, q, 0, graphs, st);
    }
    group_compare(g, "after partial");
    group_reduce(g, false);
    for (int q = 0; q < g.R; q++) {
        expect(mxs_host_nvfp4_wb_apply(&g.hb[q], &g.hplan[q], g.hpacked[q].data()), MXS_OK, "host apply");
        run_phase(g, q, 1, graphs, st);
    }
    CHECK(g.reductions - before == 1, "%s: ONE reduction per bucket", g.what);
    group_compare(g, "after apply");
    group_gather(g);
    for (int q = 0; q < g.R; q++) {
        expect(mxs_host_nvfp4_wb_finish(&g.hb[q], &g.hplan[q]), MXS_OK, "host finish");
        run_phase(g, q, 2, graphs, st);
    }
    group_compare(g, "after finish");
    group_stage_to_col(g);
    group_compare(g, "after stage_to_col");
    group_check_reference(g);
}

static void test_writeback(void) {
    for (int it = 0; it < 140; it++) {
        Group *g = new Group();
        const int R = 1 + it % MAXR, sh = (it / MAXR) % SH_KINDS;
        group_make(*g, R, sh, (int)rnd_in(1, 3));
        group_fill(*g);
        group_step(*g, nullptr, 0); /* update 1: poisoned outputs */
        group_fill(*g);
        group_step(*g, nullptr, 0); /* update 2: the same buffers, stale bytes */
        CHECK(g->reductions == 2, "%s: two reductions for two updates", g->what);
        group_free(*g);
        delete g;
    }
    CHECK(g_frags > 60, "only %d fragments", g_frags);
}

/* Larger weights: many warp tiles per item, partial groups and lanes at
 * shard edges inside them. */
static void test_large(void) {
    for (int it = 0; it < 8; it++) {
        Group *g = new Group();
        group_make(*g, 1 + it % 3, it % SH_KINDS, (int)rnd_in(1, 2), 700);
        group_fill(*g);
        group_step(*g, nullptr, 0);
        group_fill(*g);
        group_step(*g, nullptr, 0);
        group_free(*g);
        delete g;
    }
}

/* Every rank's three phases captured (capturing runs nothing), then
 * `updates` writeback steps by graph replay. */
static void graph_steps(Group &g, cudaStream_t st, int updates) {
    RankGraphs graphs[MAXR];
    for (int q = 0; q < g.R; q++)
        for (int ph = 0; ph < 3; ph++) capture(st, &graphs[q].exec[ph], g, q, ph);
    group_compare(g, "after capture");
    for (int u = 0; u < updates; u++) {
        group_fill(g);
        group_step(g, graphs, st);
    }
    for (int q = 0; q < g.R; q++)
        for (int ph = 0; ph < 3; ph++) CUDA_OK(cudaGraphExecDestroy(graphs[q].exec[ph]));
}

/* ---- prepared buckets ------------------------------------------------------------- */

static void bucket_prepare(Group &g) {
    for (int q = 0; q < g.R; q++) {
        int64_t need = -1;
        expect(mxs_cuda_nvfp4_wb_prepare_bytes(&g.db[q], &need), MXS_OK, "bucket workspace bytes");
        CHECK(need > 0 && need % (3 * g.nw) == 0, "%s: workspace %lld: one record per item and phase", g.what,
              (long long)need);
        g.ws[q] = dev_alloc(need > 0 ? need : 16);
        expect(mxs_cuda_nvfp4_wb_prepare(&g.bk[q], &g.db[q], &g.dplan[q], g.dpacked[q].p, g.ws[q].p, need, 0), MXS_OK,
               "bucket prepare");
        CUDA_OK(cudaDeviceSynchronize());
    }
    g.use_bucket = true;
}

/* Prepared buckets == host, direct and in graphs (one launch per phase for
 * 1..70 items, counted on the captured graphs), then the misuse the bucket
 * calls can see. */
static void test_buckets(void) {
    cudaStream_t st;
    CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    for (int it = 0; it < 12; it++) {
        Group *g = new Group();
        const int kind = it % 3; /* 70 small items; 1-2 large ones; 1-3 mixed */
        group_make(*g, 1 + it % 3, it % SH_KINDS, kind == 0 ? MAXW : (int)rnd_in(1, kind == 1 ? 2 : 3),
                   kind == 0 ? 24 : (kind == 1 ? 700 : 90));
        bucket_prepare(*g);
        for (int u = 0; u < 2; u++) {
            group_fill(*g);
            group_step(*g, nullptr, 0);
        }
        graph_steps(*g, st, 2);
        group_free(*g);
        delete g;
    }
    CUDA_OK(cudaStreamDestroy(st));

    Group *g = new Group();
    group_make(*g, 1, SH_REPLICA, 3, 90, false);
    group_fill(*g);
    int64_t need = 0;
    expect(mxs_cuda_nvfp4_wb_prepare_bytes(&g->db[0], &need), MXS_OK, "workspace bytes");
    DevBuf ws = dev_alloc(need + 64);
    mxs_cuda_nvfp4_wb_bucket bk, zero;
    memset(&zero, 0, sizeof zero);
    void *pk = g->dpacked[0].p;
    expect(mxs_cuda_nvfp4_wb_prepare(&bk, &g->db[0], &g->dplan[0], pk, ws.p, need - 1, 0), MXS_ERR_BUFFER_SIZE,
           "workspace too small");
    CHECK(memcmp(&bk, &zero, sizeof bk) == 0, "a failed prepare leaves the bucket zeroed");
    expect(mxs_cuda_nvfp4_wb_prepare(&bk, &g->db[0], &g->dplan[0], pk, ws.p + 8, need, 0), MXS_ERR_INVALID_ARGUMENT,
           "workspace not 16-byte aligned");
    expect(mxs_cuda_nvfp4_wb_prepare(&bk, &g->db[0], &g->dplan[0], pk, nullptr, need, 0), MXS_ERR_INVALID_ARGUMENT,
           "NULL workspace");
    expect(mxs_cuda_nvfp4_wb_prepare(&bk, &g->db[0], &g->dplan[0], nullptr, ws.p, need, 0), MXS_ERR_INVALID_ARGUMENT,
           "NULL packed");
    expect(mxs_cuda_nvfp4_wb_prepare(&bk, &g->db[0], &g->dplan[0], pk, (uint8_t *)g->rw[0][0].dmaster.p, need, 0),
           MXS_ERR_ALIASING, "workspace over a master");
    DevBuf both = dev_alloc(need + g->dplan[0].packed_bytes + 64);
    expect(mxs_cuda_nvfp4_wb_prepare(&bk, &g->db[0], &g->dplan[0], both.p + 64, both.p + 64, need, 0), MXS_ERR_ALIASING,
           "workspace over the packed buffer");
    mxs_nvfp4_wb_batch other = g->db[0];
    other.round_through = g->db[0].round_through == MXS_BF16 ? MXS_F32 : MXS_BF16;
    expect(mxs_cuda_nvfp4_wb_prepare(&bk, &other, &g->dplan[0], pk, ws.p, need, 0), MXS_ERR_PLAN_MISMATCH,
           "a batch changed since its plan");
    CUDA_OK(cudaDeviceSynchronize());
    group_compare(*g, "rejected prepares write nothing");
    expect(mxs_cuda_nvfp4_wb_bucket_partial(&zero, 0), MXS_ERR_INVALID_ARGUMENT, "never-prepared bucket");
    expect(mxs_cuda_nvfp4_wb_bucket_apply(nullptr, 0), MXS_ERR_INVALID_ARGUMENT, "NULL bucket");
    expect(mxs_cuda_nvfp4_wb_prepare(&bk, &g->db[0], &g->dplan[0], pk, ws.p, need, 0), MXS_OK, "prepare");
    mxs_cuda_nvfp4_wb_bucket edited = bk;
    edited.n_items++;
    expect(mxs_cuda_nvfp4_wb_bucket_apply(&edited, 0), MXS_ERR_INVALID_ARGUMENT, "modified bucket");
    edited = bk;
    edited.table[1] = nullptr;
    expect(mxs_cuda_nvfp4_wb_bucket_finish(&edited, 0), MXS_ERR_INVALID_ARGUMENT, "modified table pointer");
    expect(mxs_cuda_nvfp4_wb_bucket_release(&bk), MXS_OK, "release");
    expect(mxs_cuda_nvfp4_wb_bucket_partial(&bk, 0), MXS_ERR_INVALID_ARGUMENT, "released bucket");
    expect(mxs_cuda_nvfp4_wb_bucket_release(nullptr), MXS_ERR_INVALID_ARGUMENT, "release NULL");
    CHECK(mxs_cuda_nvfp4_wb_bucket_size() == sizeof(mxs_cuda_nvfp4_wb_bucket), "bucket size");
    CUDA_OK(cudaDeviceSynchronize());
    group_compare(*g, "rejected bucket calls write nothing");
    dev_free(ws);
    dev_free(both);
    group_free(*g);
    delete g;
}

/* A batch of 70 items: three launch chunks per phase. */
static void test_many_items(void) {
    for (int it = 0; it < 4; it++) {
        Group *g = new Group();
        group_make(*g, 1 + it % 2 * 2, it % SH_KINDS, MAXW, 24);
        for (int u = 0; u < 2; u++) {
            group_fill(*g);
            group_step(*g, nullptr, 0);
        }
        group_free(*g);
        delete g;
    }
}

/* A remote failure: the reduced status byte is 1 - the device apply writes
 * nothing (as the host apply, which returns MXS_ERR_REMOTE). */
static void test_remote_failure(void) {
    for (int it = 0; it < 6; it++) {
        Group *g = new Group();
        group_make(*g, 2, it % SH_KINDS, 2);
        group_fill(*g);
        for (int q = 0; q < g->R; q++) {
            expect(mxs_host_nvfp4_wb_partial(&g->hb[q], &g->hplan[q], g->hpacked[q].data()), MXS_OK, "host partial");
            run_phase(*g, q, 0, nullptr, 0);
        }
        group_reduce(*g, true);
        for (int q = 0; q < g->R; q++) {
            expect(mxs_host_nvfp4_wb_apply(&g->hb[q], &g->hplan[q], g->hpacked[q].data()), MXS_ERR_REMOTE,
                   "host apply after a remote failure");
            run_phase(*g, q, 1, nullptr, 0); /* MXS_OK: it cannot read the byte, its kernels do */
        }
        group_compare(*g, "apply after a remote failure writes nothing");
        group_free(*g);
        delete g;
    }
}

/* ---- 4 graphs ---------------------------------------------------------------------- */

static void test_graphs(void) {
    cudaStream_t st;
    CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    for (int it = 0; it < 8; it++) {
        Group *g = new Group();
        group_make(*g, 1 + it % 3, it % SH_KINDS, (int)rnd_in(1, 3));
        graph_steps(*g, st, 3);
        group_free(*g);
        delete g;
    }
    CUDA_OK(cudaStreamDestroy(st));
}

/* ---- 5 bad input ------------------------------------------------------------------- */

static void test_bad_input(void) {
    /* writeback: one rank, a shard of at least 4 elements */
    Group *g = new Group();
    do {
        if (g->R) group_free(*g);
        delete g;
        g = new Group();
        group_make(*g, 1, SH_REPLICA, 1, 90, false); /* aligned buffers: a packed buffer over them is aligned */
    } while (g->rw[0][0].shard.count < 4);
    group_fill(*g);
    mxs_nvfp4_wb_batch *b = &g->db[0];
    mxs_nvfp4_wb_plan *plan = &g->dplan[0];
    uint8_t *pk = g->dpacked[0].p;
    mxs_nvfp4_wb_item *it = &g->dit[0][0];
    expect(mxs_cuda_nvfp4_wb_partial(b, plan, nullptr, 0), MXS_ERR_INVALID_ARGUMENT, "partial, NULL packed");
    expect(mxs_cuda_nvfp4_wb_partial(b, plan, pk + 1, 0), MXS_ERR_INVALID_ARGUMENT, "partial, misaligned packed");
    expect(mxs_cuda_nvfp4_wb_apply(b, plan, pk + 1, 0), MXS_ERR_INVALID_ARGUMENT, "apply, misaligned packed");
    expect(mxs_cuda_nvfp4_wb_partial(b, nullptr, pk, 0), MXS_ERR_INVALID_ARGUMENT, "partial, NULL plan");
    expect(mxs_cuda_nvfp4_wb_partial(nullptr, plan, pk, 0), MXS_ERR_INVALID_ARGUMENT, "partial, NULL batch");
    expect(mxs_cuda_nvfp4_wb_finish(b, nullptr, 0), MXS_ERR_INVALID_ARGUMENT, "finish, NULL plan");
    /* the packed buffer over an output: the amax, the master */
    expect(mxs_cuda_nvfp4_wb_partial(b, plan, it->primary.amax, 0), MXS_ERR_ALIASING, "partial, packed over amax");
    expect(mxs_cuda_nvfp4_wb_apply(b, plan, g->rw[0][0].dmaster.p, 0), MXS_ERR_ALIASING, "apply, packed over master");
    /* the batch changed since its plan */
    const int64_t start = it->start, len = it->len;
    it->start = start + 1;
    it->len = len - 1;
    expect(mxs_cuda_nvfp4_wb_partial(b, plan, pk, 0), MXS_ERR_RANGE, "partial, odd shard start");
    expect(mxs_cuda_nvfp4_wb_apply(b, plan, pk, 0), MXS_ERR_RANGE, "apply, odd shard start");
    expect(mxs_cuda_nvfp4_wb_finish(b, plan, 0), MXS_ERR_RANGE, "finish, odd shard start");
    it->start = start + 2;
    it->len = len - 2;
    expect(mxs_cuda_nvfp4_wb_partial(b, plan, pk, 0), MXS_ERR_PLAN_MISMATCH, "partial, another shard");
    expect(mxs_cuda_nvfp4_wb_apply(b, plan, pk, 0), MXS_ERR_PLAN_MISMATCH, "apply, another shard");
    expect(mxs_cuda_nvfp4_wb_finish(b, plan, 0), MXS_ERR_PLAN_MISMATCH, "finish, another shard");
    it->start = start;
    it->len = len;
    g->db[0].round_through = g->rt == MXS_BF16 ? MXS_F32 : MXS_BF16;
    expect(mxs_cuda_nvfp4_wb_partial(b, plan, pk, 0), MXS_ERR_PLAN_MISMATCH, "partial, another round-through");
    g->db[0].round_through = g->rt;
    CUDA_OK(cudaDeviceSynchronize());
    group_compare(*g, "rejected writeback calls write nothing");
    CHECK(cudaGetLastError() == cudaSuccess, "rejected calls leave no CUDA error");
    group_free(*g);
    delete g;

    /* quantize / dequantize / convert */
    Nv T;
    nv_make(T, 33, 17, MXS_BOTH, MXS_NVFP4_1X16, MXS_SCALES_PADDED, false, true);
    std::vector<uint8_t> src = nv_source(33 * 17, MXS_F32);
    DevBuf dsrc = dev_alloc(33 * 17 * 4);
    dev_upload(dsrc, src.data(), 33 * 17 * 4);
    mxs_nvfp4_tensor t = T.d;
    expect(mxs_cuda_nvfp4_quantize(&t, dsrc.p, (mxs_dtype)7, MXS_F32, 0), MXS_ERR_INVALID_ARGUMENT, "bad dtype");
    expect(mxs_cuda_nvfp4_quantize(&t, dsrc.p, MXS_F32, (mxs_dtype)9, 0), MXS_ERR_INVALID_ARGUMENT,
           "bad round-through");
    expect(mxs_cuda_nvfp4_quantize(&t, nullptr, MXS_F32, MXS_F32, 0), MXS_ERR_INVALID_ARGUMENT, "NULL source");
    expect(mxs_cuda_nvfp4_quantize(nullptr, dsrc.p, MXS_F32, MXS_F32, 0), MXS_ERR_INVALID_ARGUMENT, "NULL tensor");
    t.scale_layout = (mxs_scale_layout)2;
    t.dirs = 4;
    expect(mxs_cuda_nvfp4_quantize(&t, dsrc.p, MXS_F32, MXS_F32, 0), MXS_ERR_INVALID_ARGUMENT, "bad dirs");
    t = T.d;
    t.dirs = 0;
    expect(mxs_cuda_nvfp4_quantize(&t, dsrc.p, MXS_F32, MXS_F32, 0), MXS_ERR_INVALID_ARGUMENT, "no plane");
    t = T.d;
    t.rows = 0;
    expect(mxs_cuda_nvfp4_quantize(&t, dsrc.p, MXS_F32, MXS_F32, 0), MXS_ERR_SHAPE, "rows 0");
    t = T.d;
    t.col_scale = nullptr;
    expect(mxs_cuda_nvfp4_quantize(&t, dsrc.p, MXS_F32, MXS_F32, 0), MXS_ERR_ABSENT_PLANE, "NULL column scales");
    t = T.d;
    t.amax = nullptr;
    expect(mxs_cuda_nvfp4_quantize(&t, dsrc.p, MXS_F32, MXS_F32, 0), MXS_ERR_INVALID_ARGUMENT, "NULL amax");
    t = T.d;
    expect(mxs_cuda_nvfp4_quantize(&t, t.row_data, MXS_BF16, MXS_F32, 0), MXS_ERR_ALIASING, "source over data");
    t.col_scale = t.row_scale + 1;
    expect(mxs_cuda_nvfp4_quantize(&t, dsrc.p, MXS_F32, MXS_F32, 0), MXS_ERR_ALIASING, "two outputs overlap");
    t = T.d;
    t.dirs = MXS_ROWWISE;
    expect(mxs_cuda_nvfp4_dequantize(&t, MXS_COLWISE, dsrc.p, MXS_F32, 0), MXS_ERR_ABSENT_PLANE, "dequantize absent");
    t = T.d;
    expect(mxs_cuda_nvfp4_dequantize(&t, MXS_ROWWISE, t.row_data, MXS_F32, 0), MXS_ERR_ALIASING,
           "dequantize over data");
    expect(mxs_cuda_nvfp4_convert_scales(33, 17, MXS_ROWWISE, MXS_SCALES_PADDED, t.row_scale, MXS_SCALES_COMPACT,
                                         t.row_scale + 3, 0),
           MXS_ERR_ALIASING, "convert in place");
    expect(mxs_cuda_nvfp4_convert_scales(0, 17, MXS_ROWWISE, MXS_SCALES_PADDED, t.row_scale, MXS_SCALES_COMPACT,
                                         t.col_scale, 0),
           MXS_ERR_SHAPE, "convert rows 0");
    /* the standalone transpose (FSDP): the host's checks, nothing enqueued on error */
    DevBuf stage = dev_alloc((33 * 17 + 1) / 2);
    t = T.d;
    expect(mxs_cuda_nvfp4_stage_to_col(&t, nullptr, 0), MXS_ERR_INVALID_ARGUMENT, "stage_to_col, NULL stage");
    expect(mxs_cuda_nvfp4_stage_to_col(nullptr, stage.p, 0), MXS_ERR_INVALID_ARGUMENT, "stage_to_col, NULL tensor");
    expect(mxs_cuda_nvfp4_stage_to_col(&t, t.col_data + 5, 0), MXS_ERR_ALIASING, "stage_to_col over its output");
    t.dirs = MXS_ROWWISE;
    expect(mxs_cuda_nvfp4_stage_to_col(&t, stage.p, 0), MXS_ERR_ABSENT_PLANE, "stage_to_col, no column plane");
    t = T.d;
    t.col_data = nullptr;
    expect(mxs_cuda_nvfp4_stage_to_col(&t, stage.p, 0), MXS_ERR_ABSENT_PLANE, "stage_to_col, NULL column data");
    t = T.d;
    t.cols = 0;
    expect(mxs_cuda_nvfp4_stage_to_col(&t, stage.p, 0), MXS_ERR_SHAPE, "stage_to_col, cols 0");
    CUDA_OK(cudaDeviceSynchronize());
    nv_compare(T, "rejected quantize and stage_to_col calls write nothing");
    dev_untouched(stage, "stage_to_col reads its stage only");
    dev_free(stage);
    dev_free(dsrc);
    nv_free(T);
}

int main(void) {
    require_gpu();
    test_oracle();
    tap_point("E2M1 oracle vectors through a device kernel");
    test_e2m1_exhaustive();
    tap_point("E2M1 device rule (1, 2 and 8 per call) == the boundary count for all 2^32 f32 patterns");
    test_quantize();
    tap_point("quantize / dequantize / convert_scales == host");
    test_writeback();
    tap_point("sharded writeback on R simulated ranks (in place and fragments) == host == whole-tensor quantize");
    test_large();
    tap_point("larger weights (many warp tiles per item) == host");
    test_many_items();
    tap_point("a batch of 70 items (three launch chunks per phase)");
    test_remote_failure();
    tap_point("a remote failure: apply writes nothing");
    test_graphs();
    tap_point("partial / apply / finish captured in graphs and replayed");
    test_buckets();
    tap_point("prepared buckets == host, one launch per phase, misuse rejected");
    test_bad_input();
    tap_point("bad input rejected, nothing written");
    return tap_done();
}
