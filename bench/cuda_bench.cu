/* bench/cuda_bench.cu - GPU throughput of mxshard's kernels against the
 * device-to-device copy ceiling measured in the same run.
 *
 *   cuda_bench [--reps N]        (MXS_BENCH_MD=file: also write the table there)
 *
 * Each row: median of N (default 30) timed repetitions after warm-up (CUDA
 * events around the call(s), one stream). GB/s counts the MINIMUM bytes the
 * operation must move: its input once, every output once, the packed
 * exponent buffer (written by partial, read by apply: once each) and the
 * scale planes. "% copy" = GB/s / copy GB/s (copy = cudaMemcpyAsync D2D of
 * 1 GiB, bytes read + written). The weights (>= 128 MiB of input) do not fit
 * in the 50 MiB L2, so inputs are not rotated.
 */
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <string>
#include <vector>

#include <mxshard/cuda.h>
#include <mxshard/mxshard.h>

#define CK(x)                                                                                          \
    do {                                                                                               \
        cudaError_t e_ = (x);                                                                          \
        if (e_ != cudaSuccess) {                                                                       \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));        \
            exit(1);                                                                                   \
        }                                                                                              \
    } while (0)
#define MK(x)                                                                                          \
    do {                                                                                               \
        mxs_status s_ = (x);                                                                           \
        if (s_ != MXS_OK) {                                                                            \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, mxs_status_str(s_));            \
            exit(1);                                                                                   \
        }                                                                                              \
    } while (0)

static int g_reps = 30;
static double g_copy_gbs = 0;
static std::string g_md;

template <class F> static double time_us(F &&fn) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    for (int i = 0; i < 3; i++) fn();
    CK(cudaDeviceSynchronize());
    std::vector<float> ms;
    for (int i = 0; i < g_reps; i++) {
        CK(cudaEventRecord(a, 0));
        fn();
        CK(cudaEventRecord(b, 0));
        CK(cudaEventSynchronize(b));
        float t;
        CK(cudaEventElapsedTime(&t, a, b));
        ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return 1000.0 * ms[ms.size() / 2];
}

static void row(const char *shape, const char *variant, double us, double bytes, const char *note = "") {
    double gbs = bytes / us / 1e3;
    char line[400];
    snprintf(line, sizeof line, "| %s | %s | %.1f | %.0f | %.1f %% | %s |\n", shape, variant, us, gbs,
             100.0 * gbs / g_copy_gbs, note);
    fputs(line, stdout);
    fflush(stdout);
    g_md += line;
}

__global__ void fill(uint32_t *p, int64_t n, uint32_t seed, int f32) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u + seed;
        h ^= h >> 15;
        h *= 0x2C1B3C6Du;
        h ^= h >> 12;
        /* finite values, exponents in a moderate range */
        uint32_t v = ((h & 1u) << 31) | ((110u + (h >> 27)) << 23) | ((h >> 4) & 0x7FFFFFu);
        uint32_t w = ((h & 2u) << 30) | ((110u + ((h >> 22) & 31u)) << 23) | ((h >> 1) & 0x7FFFFFu);
        p[i] = f32 ? v : ((v >> 16) | (w & 0xFFFF0000u)); /* f32, or two finite bf16 */
    }
}

struct Primary {
    mxs_tensor t;
    uint8_t *mem = nullptr;
};

static Primary make_primary(int64_t rows, int64_t cols, unsigned dirs) {
    Primary P;
    memset(&P.t, 0, sizeof P.t);
    P.t.rows = rows;
    P.t.cols = cols;
    P.t.dirs = dirs;
    P.t.scale_layout = MXS_SCALES_COMPACT;
    int64_t total = mxs_tensor_storage_bytes(&P.t) + 1024;
    CK(cudaMalloc(&P.mem, (size_t)total));
    uint8_t *p = P.mem;
    for (int pl = 1; pl <= 2; pl++) {
        if (!(dirs & (unsigned)pl)) continue;
        int64_t sb = mxs_scale_bytes(&P.t, (mxs_dirs)pl);
        uint8_t *d = p, *s = p + rows * cols;
        p = s + ((sb + 255) / 256) * 256;
        if (pl == 1) { P.t.row_data = d; P.t.row_scale = s; }
        else { P.t.col_data = d; P.t.col_scale = s; }
    }
    return P;
}

/* partial + apply of one batch (no reduction: one GPU). */
struct Wb {
    std::vector<mxs_wb_item> items;
    mxs_wb_batch b;
    mxs_wb_plan plan;
    uint8_t *packed = nullptr, *ws = nullptr;
    int64_t wsb = 0;
    void setup() {
        memset(&b, 0, sizeof b);
        b.items = items.data();
        b.n_items = (int64_t)items.size();
        b.round_through = MXS_BF16;
        b.mode = MXS_WB_FUSED;
        MK(mxs_wb_make_plan(&b, &plan, NULL));
        MK(mxs_cuda_wb_workspace_bytes(&b, &wsb));
        CK(cudaMalloc(&packed, (size_t)plan.packed_bytes + 16));
        CK(cudaMalloc(&ws, (size_t)wsb + 16));
    }
    void run() {
        MK(mxs_cuda_wb_partial(&b, &plan, packed, ws, wsb, 0));
        MK(mxs_cuda_wb_apply(&b, &plan, packed, ws, wsb, 0));
    }
    void release() {
        cudaFree(packed);
        cudaFree(ws);
    }
};

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) g_reps = atoi(argv[++i]);
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("cuda_bench: no CUDA device\n");
        return 77;
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));

    /* ---- copy ceiling ---- */
    const size_t copy_bytes = (size_t)1 << 30;
    void *ca, *cb;
    CK(cudaMalloc(&ca, copy_bytes));
    CK(cudaMalloc(&cb, copy_bytes));
    CK(cudaMemset(ca, 1, copy_bytes));
    double copy_us = time_us([&] { CK(cudaMemcpyAsync(cb, ca, copy_bytes, cudaMemcpyDeviceToDevice, 0)); });
    g_copy_gbs = 2.0 * (double)copy_bytes / copy_us / 1e3;
    CK(cudaFree(ca));
    CK(cudaFree(cb));
    printf("# %s, %d SMs; D2D copy of 1 GiB: %.1f us, %.0f GB/s (read + write); median of %d reps\n\n", prop.name,
           prop.multiProcessorCount, copy_us, g_copy_gbs, g_reps);
    char hdr[600];
    snprintf(hdr, sizeof hdr, "copy ceiling (cudaMemcpyAsync D2D, 1 GiB): %.0f GB/s on %s\n\n", g_copy_gbs, prop.name);
    g_md += hdr;
    const char *th = "| shape | variant | us | GB/s | % of copy | note |\n|---|---|---|---|---|---|\n";
    fputs(th, stdout);
    g_md += th;

    static const int64_t shapes[][2] = {{8192, 8192}, {16384, 6144}, {4096, 14336}, {28672, 4096}};
    for (auto &s : shapes) {
        const int64_t rows = s[0], cols = s[1], n = rows * cols;
        char shape[64];
        snprintf(shape, sizeof shape, "%lldx%lld", (long long)rows, (long long)cols);
        uint32_t *src, *master;
        CK(cudaMalloc(&src, (size_t)n * 2));
        CK(cudaMalloc(&master, (size_t)n * 4));
        fill<<<1024, 256>>>(src, n / 2, 7, 0);
        fill<<<1024, 256>>>(master, n, 11, 1);
        CK(cudaDeviceSynchronize());
        const double sc = (double)(n / 32);

        /* quantize (bf16 copy-back) */
        for (unsigned dirs : {1u, 3u}) {
            Primary P = make_primary(rows, cols, dirs);
            int planes = dirs == 3 ? 2 : 1;
            double us = time_us([&] { MK(mxs_cuda_quantize(&P.t, src, MXS_BF16, MXS_ROUND_CEIL, 0)); });
            row(shape, dirs == 3 ? "quantize bf16, both" : "quantize bf16, row-only", us,
                2.0 * n + planes * ((double)n + sc), "1 launch");
            cudaFree(P.mem);
        }
        /* writeback: f32 master, fused, one rank's shard at DP = 1, 2, 8 */
        for (unsigned dirs : {1u, 3u}) {
            Primary P = make_primary(rows, cols, dirs);
            int planes = dirs == 3 ? 2 : 1;
            double dp1 = 0;
            for (int dp : {1, 2, 8}) {
                int rank = dp == 8 ? 3 : 0;
                Wb w;
                mxs_wb_item it;
                memset(&it, 0, sizeof it);
                it.primary = P.t;
                it.master_dtype = MXS_F32;
                it.start = n / dp * rank;
                it.len = n / dp;
                it.master = master + it.start;
                w.items.push_back(it);
                w.setup();
                double us = time_us([&] { w.run(); });
                /* master shard once + its cast bytes + packed (write + read) + all scales */
                double bytes = 4.0 * it.len + planes * ((double)it.len + 2 * sc + sc);
                char variant[96], note[96];
                snprintf(variant, sizeof variant, "writeback fused f32, %s, DP=%d rank %d",
                         dirs == 3 ? "both" : "row-only", dp, rank);
                if (dp == 1) {
                    dp1 = us;
                    snprintf(note, sizeof note, "partial+apply");
                } else {
                    snprintf(note, sizeof note, "%.2fx of DP=1 time", us / dp1);
                }
                row(shape, variant, us, bytes, note);
                w.release();
            }
            cudaFree(P.mem);
        }
        /* a 200-weight bucket of the same total size, DP=1, row-only */
        {
            const int nw = 200;
            std::vector<Primary> ps;
            Wb w;
            int64_t off = 0;
            for (int i = 0; i < nw; i++) {
                int64_t r = rows * (i + 1) / nw - rows * i / nw;
                ps.push_back(make_primary(r, cols, MXS_ROWWISE));
                mxs_wb_item it;
                memset(&it, 0, sizeof it);
                it.primary = ps.back().t;
                it.master_dtype = MXS_F32;
                it.start = 0;
                it.len = r * cols;
                it.master = master + off;
                off += r * cols;
                w.items.push_back(it);
            }
            w.setup();
            double us = time_us([&] { w.run(); });
            /* the single weight's DP=1 row-only number for the ratio */
            Primary P = make_primary(rows, cols, MXS_ROWWISE);
            Wb one;
            mxs_wb_item it;
            memset(&it, 0, sizeof it);
            it.primary = P.t;
            it.master = master;
            it.master_dtype = MXS_F32;
            it.len = n;
            one.items.push_back(it);
            one.setup();
            double us1 = time_us([&] { one.run(); });
            char note[96];
            snprintf(note, sizeof note, "%.2fx of one %s weight", us / us1, shape);
            row(shape, "writeback fused f32, row-only, 200-weight bucket", us, 5.0 * n + 3 * sc, note);
            one.release();
            cudaFree(P.mem);
            w.release();
            for (auto &p : ps) cudaFree(p.mem);
        }
        cudaFree(src);
        cudaFree(master);
    }
    const char *md = getenv("MXS_BENCH_MD");
    if (md && *md) {
        FILE *f = fopen(md, "w");
        if (f) {
            fputs(g_md.c_str(), f);
            fclose(f);
        }
    }
    return 0;
}
