/* SPDX-License-Identifier: MIT */
/* host_bench - CPU quantize throughput (one core), elements per second.
 *
 *   build/bench/host_bench [rows cols reps]
 *
 * Quantizes a rows x cols bf16 weight (default 4096 x 4096) with
 * mxs_host_quantize into row-only and bidirectional primaries, and runs a
 * single-rank fused writeback (f32 master) for both; prints the median of
 * `reps` runs. Timings are CPU wall-clock (CLOCK_MONOTONIC).
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

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rng(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* A random normal-ish weight: magnitudes spread over ~12 binades. */
static float random_weight(void) {
    uint32_t bits = (uint32_t)(rng() & 0x807FFFFFu) | ((uint32_t)(115 + rng() % 12) << 23);
    return mxs_f32_from_bits(bits);
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
    result results[4];
    int nres = 0;
    if (!master || !bf16 || !times) return 1;
    for (i = 0; i < n; i++) {
        master[i] = random_weight();
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
    printf("| variant | ms | M elements/s |\n| --- | ---: | ---: |\n");
    for (i = 0; i < nres; i++)
        printf("| %s | %.2f | %.0f |\n", results[i].name, 1e3 * results[i].seconds,
               (double)n / results[i].seconds / 1e6);
    free(master);
    free(bf16);
    free(times);
    return 0;
}
