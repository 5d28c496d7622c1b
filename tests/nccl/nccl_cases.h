/* SPDX-License-Identifier: MIT */
/* tests/nccl/nccl_cases.h - what the files of test_nccl share: the helpers,
 * the weights (every rank's shard, masters, single-process references), the
 * writeback and gather steps with their wire checks, and the cases the
 * groups run (test_nccl.c says what the program checks):
 *
 *   test_nccl.c            main, the groups (the cases in order), the host-only owner rule
 *   test_nccl_weights.c    helpers, weights, writeback / gather steps, local and full checks
 *   test_nccl_writeback.c  group writeback: every sharding scheme, a prepared bucket, a failing rank
 *   test_nccl_gather.c     group gather: byte patterns, the bucket fast path, 150 weights
 *   test_nccl_copyback.c   group copyback: bf16 copy-back, swizzle after the gather
 *   test_nccl_plan.c       group plan: plan mismatch, rejected arguments
 *
 * Every file defines _POSIX_C_SOURCE 200809L before its first #include
 * (launch.h needs it).
 */
#ifndef MXS_TESTS_NCCL_CASES_H
#define MXS_TESTS_NCCL_CASES_H

#include "launch.h"

#include <math.h>

#include <mxshard/nccl.h>

#include "wire.h"

/* ---- small helpers (test_nccl_weights.c) ----------------------------------------- */

#define CU(r, call)                                                                                                    \
    do {                                                                                                               \
        cudaError_t ce_ = (call);                                                                                      \
        MXS_CHECK(r, ce_ == cudaSuccess, "%s: %s", #call, cudaGetErrorString(ce_));                                    \
    } while (0)

#define ST(r, call, want)                                                                                              \
    do {                                                                                                               \
        mxs_status st_ = (call);                                                                                       \
        MXS_CHECK(r, st_ == (want), "%s -> %s (want %s)", #call, mxs_status_str(st_), mxs_status_str(want));           \
    } while (0)

uint64_t mix64(uint64_t x);
void *xmalloc(size_t n);
void *dev_alloc(mxs_rank *r, int64_t bytes);
void wb_buffers(mxs_rank *r, const mxs_wb_batch *b, mxs_wb_plan *plan, int64_t *ws_bytes, void **ws, void **packed);
uint8_t *download(mxs_rank *r, const void *dev, int64_t bytes);
void upload(mxs_rank *r, void *dev, const void *host, int64_t bytes);
void fill(mxs_rank *r, void *dev, int value, int64_t bytes);
int same_bytes(mxs_rank *r, const char *what, const uint8_t *got, const uint8_t *want, int64_t n);

/* ---- weights (test_nccl_weights.c) ----------------------------------------------- */

typedef struct wspec {
    int64_t rows, cols;
    unsigned dirs;
    mxs_scale_layout layout;
    int special;
} wspec;

typedef struct weight {
    wspec spec;
    int64_t elems;
    int64_t *starts, *lens; /* every rank's shard (nranks entries) */
    int64_t start, len;     /* this rank's */
    float *full;            /* host: the full master of the current update (same on every rank) */
    float *shard_dev;       /* device: this rank's master shard */
    mxs_tensor dev;         /* device primary */
    mxs_tensor saved;       /* dev as allocated: storage pointers must never change */
    uint8_t *ref_data[2], *ref_scale[2];
    int64_t scale_bytes[2];
} weight;

enum { SHARD_BUCKET, SHARD_REPLICA, SHARD_OVERLAP, SHARD_UNEVEN };
extern const char *scheme_name[];

int has_plane(const weight *w, int p);
uint8_t *dev_data(const weight *w, int p);
uint8_t *dev_scale(const weight *w, int p);
weight *weights_new(mxs_rank *r, const wspec *specs, int n, int scheme, uint64_t seed, uint8_t **row_bucket,
                    uint8_t **col_bucket, int64_t *bucket_elems);
void weights_free(weight *w, int n, int own_data);
void weights_update(mxs_rank *r, weight *w, int n, uint64_t seed, mxs_dtype rt, mxs_rounding rnd);
void writeback(mxs_rank *r, weight *w, int n, mxs_rounding rnd, mxs_dtype rt, mxs_wb_mode mode);
void check_local(mxs_rank *r, weight *w, int n);
void check_full(mxs_rank *r, weight *w, int n, const char *label);
void gather_planes(mxs_rank *r, weight *w, int n);

static const wspec dirs_shapes[] = {
    {70, 130, 0, MXS_SCALES_COMPACT, 0}, {33, 47, 0, MXS_SCALES_PADDED, 0},    {1, 1, 0, MXS_SCALES_SWIZZLED, 0},
    {5, 3, 0, MXS_SCALES_COMPACT, 0},    {128, 64, 0, MXS_SCALES_SWIZZLED, 0}, {257, 1031, 0, MXS_SCALES_COMPACT, 1},
    {31, 33, 0, MXS_SCALES_PADDED, 0},   {1, 200, 0, MXS_SCALES_SWIZZLED, 0},  {200, 1, 0, MXS_SCALES_COMPACT, 0},
    {64, 96, 0, MXS_SCALES_PADDED, 0},
};
#define N_DIRS_SHAPES ((int)(sizeof dirs_shapes / sizeof dirs_shapes[0]))

void mixed_specs(wspec *s, int n);

long test_begin(mxs_rank *r, const char *name);
void test_end(mxs_rank *r, const char *name, long failed_before);

/* ---- the cases, by group ---------------------------------------------------------- */

/* writeback (test_nccl_writeback.c) */
void run_writeback_case(mxs_rank *r, const char *name, const wspec *specs, int n, int scheme, mxs_wb_mode mode,
                        mxs_rounding rnd, int want_empty);
void test_writeback_dirs(mxs_rank *r, unsigned dirs, const char *name);
void test_bucket_writeback_updates(mxs_rank *r);
void test_group_never_hangs(mxs_rank *r);
/* gather (test_nccl_gather.c) */
void test_gather_pattern_without_kernels(mxs_rank *r);
void test_gather_bucket_fast_path(mxs_rank *r);
void test_gather_many_weights(mxs_rank *r);
/* copyback (test_nccl_copyback.c) */
void test_copyback_bf16(mxs_rank *r, mxs_rounding rnd, const char *name);
void test_swizzle_after_gather(mxs_rank *r);
/* plan (test_nccl_plan.c) */
void test_plan_mismatch(mxs_rank *r);
void test_rejects_before_enqueue(mxs_rank *r);

#endif
