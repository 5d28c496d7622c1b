/* SPDX-License-Identifier: MIT */
/* tools/demo_common.c - what the demo's three programs share (demo.h): the
 * clock, the Llama-style bucket, Transformer Engine's amax bytes, and the
 * formatting of numbers and of the per-phase time table. demo.c (the CPU
 * run), demo_cuda.c and demo_nvfp4.c call these; nothing here calls them. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <mxshard/mxshard.h>

#include "demo.h"
#include "sim.h"

double demo_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* ---- the bucket ----------------------------------------------------------------- */

static const char *const layer_names[7] = {"q", "k", "v", "o", "gate", "up", "down"};
static char name_store[DEMO_MAX_WEIGHTS][24];

/* Llama-style layer: q, o: H x H; k, v: kv x H (GQA, kv = H/4); gate, up:
 * ffn x H; down: H x ffn, ffn = round(8H/3) (not a multiple of 32 in general).
 * Weight i of the bucket is row-only when the running count
 * round(f * (i+1)) steps up, which spreads round(f * n) row-only weights
 * evenly through the bucket. */
int demo_make_bucket(const demo_opts *o, mxs_sim_weight *w, int64_t *kv, int64_t *ffn) {
    int l, k, n = 0;
    const int64_t h = o->hidden;
    *kv = h / 4 > 0 ? h / 4 : 1;
    *ffn = (int64_t)floor(8.0 * (double)h / 3.0 + 0.5);
    for (l = 0; l < o->layers; l++)
        for (k = 0; k < 7; k++, n++) {
            int64_t shape[7][2] = {{h, h}, {*kv, h}, {*kv, h}, {h, h}, {*ffn, h}, {*ffn, h}, {h, *ffn}};
            snprintf(name_store[n], sizeof name_store[n], "L%d.%s", l, layer_names[k]);
            w[n].name = name_store[n];
            w[n].rows = shape[k][0];
            w[n].cols = shape[k][1];
            w[n].dirs = floor(o->row_only_fraction * (n + 1) + 0.5) > floor(o->row_only_fraction * n + 0.5)
                            ? MXS_ROWWISE
                            : MXS_BOTH;
        }
    return n;
}

/* Bytes TE would reduce for one plane: one bf16 amax per block over TE's
 * padded scale shape. */
int64_t demo_te_amax_bytes(int64_t rows, int64_t cols, unsigned dirs) {
    int64_t b = 0;
    int p;
    for (p = MXS_ROWWISE; p <= MXS_COLWISE; p++) {
        mxs_scale_geom g;
        if (!(dirs & (unsigned)p)) continue;
        mxs_scale_geom_make(rows, cols, (mxs_dirs)p, MXS_SCALES_PADDED, &g); /* TE's padded plane */
        b += 2 * mxs_scale_geom_bytes(&g);
    }
    return b;
}

/* ---- formatting ------------------------------------------------------------------- */

const char *demo_fmt_int(int64_t v, char *buf, size_t n) { /* 12345678 -> "12,345,678" */
    char tmp[32];
    int len, i, j = 0, neg = v < 0;
    snprintf(tmp, sizeof tmp, "%lld", (long long)(neg ? -v : v));
    len = (int)strlen(tmp);
    if (neg && (size_t)j + 1 < n) buf[j++] = '-';
    for (i = 0; i < len && (size_t)j + 1 < n; i++) {
        if (i > 0 && (len - i) % 3 == 0 && (size_t)j + 1 < n) buf[j++] = ',';
        buf[j++] = tmp[i];
    }
    buf[j] = 0;
    return buf;
}

const char *demo_fmt_mib(int64_t v, char *buf, size_t n) {
    snprintf(buf, n, "%.2f MiB", (double)v / (1024.0 * 1024.0));
    return buf;
}

const char *demo_plural(int64_t n) { return n == 1 ? "" : "s"; }

void demo_print_phase_ms(const char *who, const char *const *names, int n_phases, const double *ms, int decimals) {
    int u, p;
    printf("time per phase, %s, ms:", who);
    for (u = 0; u < DEMO_UPDATES; u++) printf("   update %d", u + 1);
    printf("\n");
    for (p = 0; p < n_phases; p++) {
        printf("  %-30s", names[p]);
        for (u = 0; u < DEMO_UPDATES; u++) printf(" %10.*f", decimals, ms[u * n_phases + p]);
        printf("\n");
    }
}
