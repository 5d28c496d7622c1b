/* SPDX-License-Identifier: MIT */
/* tests/cuda/wb_paths_cases.h - what the files of test_cuda_wb_paths share:
 * the arenas, a case (weights, every rank's shard of each, the options), the
 * case runner and the groups main() runs (test_wb_paths.cu says what each
 * checks):
 *
 *   test_wb_paths.cu          main (the groups in order), --host-only, MXS_SANITIZER
 *   test_wb_paths_case.cu     run_case: arenas, plans, buckets, every phase compared
 *   test_wb_paths_edges.cu    1 edges at every offset modulo 32; 2 element-aligned masters
 *   test_wb_paths_buckets.cu  3 buckets of 1..300 items; 5 several updates
 *   test_wb_paths_scales.cu   4 scales of blocks owned, straddled and foreign
 *
 * The suite's counters and random generator are common.h's (one object per
 * program): a group seeds g_rng and run_case draws from the same sequence.
 */
#ifndef MXS_TESTS_CUDA_WB_PATHS_CASES_H
#define MXS_TESTS_CUDA_WB_PATHS_CASES_H

#include "common.h"

extern bool g_gpu; /* false: --host-only */
extern bool g_san; /* MXS_SANITIZER: fewer cases */

static const char *const layout_names[] = {"compact", "padded", "swizzled"};

/* ---- arenas: one allocation per rank, buffers between guards ------------- */

struct Region {
    int64_t off, n;
    int item, kind;
};

/* Host image h and device copy d of the same layout; payload addresses are
 * 16-byte aligned plus the buffer's `mis` (the device base is 256-aligned). */
struct Arena {
    int64_t size = 0;
    std::vector<uint8_t> h;
    uint8_t *d = nullptr;
    std::vector<Region> regs;
    int64_t add(int64_t n, int64_t mis, int item, int kind) {
        size = mxs_round_up(size, 16) + GUARD;
        const int64_t off = size + mis;
        size = off + n;
        regs.push_back(Region{off, n, item, kind});
        return off;
    }
    void finish(uint8_t fill) {
        size = mxs_round_up(size + GUARD, 256);
        h.assign((size_t)size, fill);
        if (g_gpu) {
            CUDA_OK(cudaMalloc(&d, (size_t)size));
            CUDA_OK(cudaMemset(d, fill, (size_t)size));
        }
    }
    void release() {
        if (d) CUDA_OK(cudaFree(d));
        d = nullptr;
    }
};

/* ---- a case: weights, every rank's shard of each, the options ------------ */

struct Weight {
    int64_t rows = 1, cols = 1;
    unsigned dirs = MXS_BOTH;
    mxs_scale_layout layout = MXS_SCALES_COMPACT;
    mxs_dtype dtype = MXS_F32;
    std::vector<uint8_t> master; /* the whole weight's master, of dtype */
    int64_t n() const { return rows * cols; }
};

struct Shard {
    int64_t start = 0, len = 0;
    bool frag[2] = {false, false}, null_data[2] = {false, false};
    bool null_master = false; /* len 0: the device master pointer is NULL */
    int64_t master_mis = 0;   /* the device master's address mod 16 */
    int64_t data_mis[2] = {0, 0}, scale_mis[2] = {0, 0}, frag_mis[2] = {0, 0};
    /* arena offsets (-1: none), filled by run_case */
    int64_t o_data[2] = {-1, -1}, o_scale[2] = {-1, -1}, o_frag[2] = {-1, -1}, o_master = -1;
};

struct Case {
    char name[200];
    int nranks = 1;
    mxs_wb_mode mode = MXS_WB_FUSED;
    mxs_rounding rounding = MXS_ROUND_CEIL;
    mxs_dtype rt = MXS_F32;
    bool oneshot = false;
    int updates = 2;
    int update_kind[8] = {0, 0, 0, 0, 0, 0, 0, 0}; /* 0: random values; 1: zeros / constants / random by item */
    std::vector<Weight> W;
    std::vector<std::vector<Shard>> S; /* [rank][item] */
};

struct Totals {
    int cases = 0;
    int64_t items = 0, rank_items = 0, phases = 0, bytes = 0; /* bytes: output arena bytes compared */
};
extern Totals g_tot;

static const mxs_dtype kRts[3] = {MXS_F32, MXS_BF16, MXS_F16};

Shard shard_of(int64_t a, int64_t b);
void rnd_options(Shard &s, const Weight &w, int frag_one_in, bool keep_master_mis = false);
void weight_values(Weight &w);
void run_case(Case &C);

/* ---- the groups, in main's order ------------------------------------------- */

void group_edges(void);
void group_aligned_masters(void);
void group_buckets(void);
void group_scale_ownership(void);
void group_updates(void);

#endif
