/* SPDX-License-Identifier: MIT */
/* tools/demo.h - what the CPU demo (demo.c), its CUDA/NCCL backend
 * (demo_cuda.c) and its NVFP4 run (demo_nvfp4.c) share: options, and
 * demo_common.c's Llama-style bucket and formatting. */
#ifndef MXSHARD_TOOLS_DEMO_H
#define MXSHARD_TOOLS_DEMO_H

#include <stdio.h>

#include <mxshard/mxshard.h>

#include "sim.h"

#define DEMO_UPDATES 2
#define DEMO_MAX_WEIGHTS (7 * 64)

typedef struct demo_opts {
    int ranks;
    int64_t hidden;
    int layers;
    double row_only_fraction;
    mxs_rounding rounding;
    uint64_t seed;
    int json;
    int cuda;
    int ranks_set;               /* --ranks was given (caps the GPU count with --device cuda) */
    int nvfp4;                   /* --format nvfp4 (default mxfp8) */
    mxs_nvfp4_block nvfp4_block; /* --block 1x16|16x16 (default 1x16, as convert()) */
} demo_opts;

/* Fills w[] with the bucket (7 weights per layer); returns the count. */
int demo_make_bucket(const demo_opts *o, mxs_sim_weight *w, int64_t *kv, int64_t *ffn);
/* Bytes Transformer Engine would all-reduce for a weight's planes: one bf16
 * amax per block over its padded scale shape (an assumption, see demo.c). */
int64_t demo_te_amax_bytes(int64_t rows, int64_t cols, unsigned dirs);
const char *demo_fmt_int(int64_t v, char *buf, size_t n);
const char *demo_fmt_mib(int64_t v, char *buf, size_t n);
double demo_now_ms(void);
/* "" for 1, else "s". */
const char *demo_plural(int64_t n);
/* The "time per phase, <who>, ms:" table: a column per update, a line per
 * phase (ms[u * n_phases + p], `decimals` digits after the point). */
void demo_print_phase_ms(const char *who, const char *const *names, int n_phases, const double *ms, int decimals);

/* --format nvfp4: the NVFP4 writeback on the simulated group, with the
 * NVFP4 / MXFP8 / BF16 memory and wire tables (demo_nvfp4.c). */
int demo_nvfp4_run(const demo_opts *o);

/* --device cuda: one process per GPU over NCCL (demo_cuda.c). */
int demo_cuda_run(const demo_opts *o);

#endif /* MXSHARD_TOOLS_DEMO_H */
