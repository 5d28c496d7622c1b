/* SPDX-License-Identifier: MIT */
/* tests/cuda/nvfp4_cases.h - what the files of test_cuda_nvfp4 share: the
 * cases main() runs, the NVFP4 tensors on host and device, and the R
 * simulated ranks of the sharded writeback. The parts (test_nvfp4.cu says
 * what each checks):
 *
 *   test_nvfp4.cu            main (the cases in order), expect, the Nv tensors
 *   test_nvfp4_e2m1.cu       1 the E2M1 oracle vectors and the exhaustive device rule
 *   test_nvfp4_quantize.cu   2 quantize / dequantize / convert
 *   test_nvfp4_group.cu      the R simulated ranks (Group): make, fill, phases, compare
 *   test_nvfp4_writeback.cu  3 the sharded writeback, prepared buckets; 4 graphs
 *   test_nvfp4_bad_input.cu  5 bad input
 *
 * The suite's counters and random generator are common.h's (one object per
 * program), so the cases see the same random sequence as in one file.
 */
#ifndef MXS_TESTS_CUDA_NVFP4_CASES_H
#define MXS_TESTS_CUDA_NVFP4_CASES_H

#include "common.h"

#include <mxshard/cuda_nvfp4.h>

/* ---- the cases, in main's order -------------------------------------------------- */

void test_oracle(void);
void test_e2m1_exhaustive();
void test_quantize(void);
void test_writeback(void);
void test_large(void);
void test_many_items(void);
void test_remote_failure(void);
void test_graphs(void);
void test_buckets(void);
void test_bad_input(void);

/* ---- NVFP4 tensors on host and device (test_nvfp4.cu) ---------------------------- */

void expect(mxs_status got, mxs_status want, const char *what);

/* Buffers: 0 row data, 1 row scale, 2 col data, 3 col scale, 4 amax. */
struct Nv {
    mxs_nvfp4_tensor h, d;
    std::vector<uint8_t> hb[5];
    DevBuf db[5];
};

int64_t nv_scale_bytes(int64_t rows, int64_t cols, int layout, mxs_dirs plane);
void nv_make(Nv &T, int64_t rows, int64_t cols, unsigned dirs, int block, int layout, bool all_planes, bool device,
             bool mis = false);
void nv_free(Nv &T);
extern const char *buf_names[5];
void nv_compare(const Nv &T, const char *ctx);
int64_t rdim(int64_t max);
std::vector<uint8_t> nv_source(int64_t n, mxs_dtype dtype);

/* ---- the sharded writeback on R simulated ranks (test_nvfp4_group.cu) ------------ */

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

/* Graphs of one rank's phases (captured once, replayed every step). */
struct RankGraphs {
    cudaGraphExec_t exec[3];
};

extern int g_frags;

void group_make(Group &g, int R, int sharding, int nw, int64_t maxdim = 90, bool allow_mis = true);
void group_free(Group &g);
void group_fill(Group &g);
void group_compare(const Group &g, const char *phase);
void group_reduce(Group &g, bool fail);
void run_phase(Group &g, int q, int phase, RankGraphs *graphs, cudaStream_t st);
void group_step(Group &g, RankGraphs *graphs, cudaStream_t st);
void graph_steps(Group &g, cudaStream_t st, int updates);
void bucket_prepare(Group &g);

#endif
