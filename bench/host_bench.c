/* SPDX-License-Identifier: MIT */
/* host_bench - CPU quantize throughput (one core), elements per second.
 *
 *   build/bench/host_bench [rows cols reps]
 *
 * Quantizes a rows x cols bf16 weight (default 4096 x 4096) with
 * mxs_host_quantize into row-only and bidirectional primaries, and runs a
 * single-rank fused writeback (f32 master) for both; then NVFP4 host quantize
 * (mxs_host_nvfp4_quantize, bf16 in, COMPACT scales) for 1x16 and 16x16
 * blocks, row-only and both; prints the median of `reps` runs. Timings are CPU wall-clock (CLOCK_MONOTONIC).
 */
#define _POSIX_C_SOURCE 199309L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mxshard/mxshard.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static uint64_t rng(uint64_t *state) {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return *state;
}

/* A random normal-ish weight: magnitudes spread over ~12 binades. */
static float random_weight(uint64_t *state) {
    uint32_t bits = (uint32_t)(rng(state) & 0x807FFFFFu) | ((uint32_t)(115 + rng(state) % 12) << 23);
    return mxs_f32_from_bits(bits);
}

/* NVFP4 host quantize of the bf16 weight into `dirs` (COMPACT scales) with
 * `block`: median seconds of reps runs, -1 on an error. */
static double nvfp4_quantize_time(const uint16_t *bf16, int64_t rows, int64_t cols, unsigned dirs,
                                  mxs_nvfp4_block block, int reps, double *times) {
    mxs_nvfp4_tensor t;
    float amax = 0;
    double med = -1;
    int64_t db, rs, cs;
    int rep, ok;
    memset(&t, 0, sizeof t);
    t.rows = rows;
    t.cols = cols;
    t.dirs = dirs;
    t.scale_layout = MXS_SCALES_COMPACT;
    t.block = block;
    t.amax = &amax;
    db = mxs_nvfp4_data_bytes(&t);
    rs = mxs_nvfp4_scale_bytes(&t, MXS_ROWWISE);
    cs = dirs & MXS_COLWISE ? mxs_nvfp4_scale_bytes(&t, MXS_COLWISE) : 0;
    if (db <= 0 || rs <= 0 || cs < 0) return -1;
    t.row_data = malloc((size_t)db);
    t.row_scale = malloc((size_t)rs);
    if (dirs & MXS_COLWISE) {
        t.col_data = malloc((size_t)db);
        t.col_scale = malloc((size_t)cs);
    }
    ok = t.row_data && t.row_scale && (!(dirs & MXS_COLWISE) || (t.col_data && t.col_scale));
    for (rep = 0; rep < reps && ok; rep++) {
        double t0 = now_s();
        ok = mxs_host_nvfp4_quantize(&t, bf16, MXS_BF16, MXS_F32) == MXS_OK;
        times[rep] = now_s() - t0;
    }
    if (ok) {
        qsort(times, (size_t)reps, sizeof(double), cmp_double);
        med = times[reps / 2];
    }
    free(t.row_data);
    free(t.row_scale);
    free(t.col_data);
    free(t.col_scale);
    return med;
}

typedef struct {
    const char *name;
    double seconds;
} result;

int main(int argc, char **argv) {
    int64_t rows = argc > 1 ? atoll(argv[1]) : 4096, cols = argc > 2 ? atoll(argv[2]) : 4096;
    int reps = argc > 3 ? atoi(argv[3]) : 7, rep, d;
    int64_t n = rows * cols, i;
    float *master = malloc((size_t)n * sizeof(float));
    uint16_t *bf16 = malloc((size_t)n * sizeof(uint16_t));
    double *times = malloc((size_t)reps * sizeof(double));
    result results[8];
    int nres = 0;
    uint64_t state = 0x9E3779B97F4A7C15ull;
    if (!master || !bf16 || !times) return 1;
    for (i = 0; i < n; i++) {
        master[i] = random_weight(&state);
        bf16[i] = mxs_bf16_from_f32(master[i]);
    }
    printf("host_bench: %lld x %lld, one core, median of %d\n", (long long)rows, (long long)cols, reps);
    for (d = MXS_ROWWISE; d <= MXS_BOTH; d += 2) { /* row-only, then both */
        mxs_tensor t;
        mxs_wb_item item;
        mxs_wb_batch batch;
        mxs_wb_plan plan;
        uint8_t *packed;
        memset(&t, 0, sizeof t);
        t.rows = rows;
        t.cols = cols;
        t.dirs = (unsigned)d;
        t.scale_layout = MXS_SCALES_COMPACT;
        t.row_data = malloc((size_t)n);
        t.row_scale = malloc((size_t)mxs_scale_bytes(&t, MXS_ROWWISE));
        if (d & MXS_COLWISE) {
            t.col_data = malloc((size_t)n);
            t.col_scale = malloc((size_t)mxs_scale_bytes(&t, MXS_COLWISE));
        }
        for (rep = 0; rep < reps; rep++) {
            double t0 = now_s();
            if (mxs_host_quantize(&t, bf16, MXS_BF16, MXS_ROUND_CEIL) != MXS_OK) return 2;
            times[rep] = now_s() - t0;
        }
        qsort(times, (size_t)reps, sizeof(double), cmp_double);
        results[nres].name = d == MXS_ROWWISE ? "quantize bf16, row-only" : "quantize bf16, both";
        results[nres++].seconds = times[reps / 2];

        memset(&item, 0, sizeof item);
        item.primary = t;
        item.master = master;
        item.master_dtype = MXS_F32;
        item.start = 0;
        item.len = n;
        memset(&batch, 0, sizeof batch);
        batch.items = &item;
        batch.n_items = 1;
        batch.round_through = MXS_BF16;
        if (mxs_wb_make_plan(&batch, &plan, NULL) != MXS_OK) return 3;
        packed = malloc((size_t)plan.packed_bytes);
        for (rep = 0; rep < reps; rep++) {
            double t0 = now_s();
            if (mxs_host_wb_partial(&batch, &plan, packed) != MXS_OK) return 4;
            if (mxs_host_wb_apply(&batch, &plan, packed) != MXS_OK) return 5;
            times[rep] = now_s() - t0;
        }
        qsort(times, (size_t)reps, sizeof(double), cmp_double);
        results[nres].name =
            d == MXS_ROWWISE ? "writeback f32 (fused, DP=1), row-only" : "writeback f32 (fused, DP=1), both";
        results[nres++].seconds = times[reps / 2];
        free(packed);
        free(t.row_data);
        free(t.row_scale);
        free(t.col_data);
        free(t.col_scale);
    }
    { /* NVFP4 (nvfp4_quantize.h): row-only 1x16, both 16x16 */
        static const struct {
            const char *name;
            unsigned dirs;
            mxs_nvfp4_block block;
        } nv[] = {
            {"NVFP4 quantize bf16, 1x16, row-only", MXS_ROWWISE, MXS_NVFP4_1X16},
            {"NVFP4 quantize bf16, 1x16, both", MXS_BOTH, MXS_NVFP4_1X16},
            {"NVFP4 quantize bf16, 16x16, row-only", MXS_ROWWISE, MXS_NVFP4_16X16},
            {"NVFP4 quantize bf16, 16x16, both", MXS_BOTH, MXS_NVFP4_16X16},
        };
        size_t k;
        for (k = 0; k < sizeof nv / sizeof nv[0]; k++) {
            results[nres].name = nv[k].name;
            results[nres].seconds = nvfp4_quantize_time(bf16, rows, cols, nv[k].dirs, nv[k].block, reps, times);
            if (results[nres++].seconds < 0) return 6;
        }
    }
    printf("| variant | ms | M elements/s |\n| --- | ---: | ---: |\n");
    for (i = 0; i < nres; i++)
        printf("| %s | %.2f | %.0f |\n", results[i].name, 1e3 * results[i].seconds,
               (double)n / results[i].seconds / 1e6);
    free(master);
    free(bf16);
    free(times);
    return 0;
}
