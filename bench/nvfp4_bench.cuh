/* SPDX-License-Identifier: MIT */
/* bench/nvfp4_bench.cuh - what the parts of bench/nvfp4_bench.cu share: the
 * configurations (scale layouts, block shapes, the DP of the sharded case),
 * the report (result and summary rows, their markdown), NVFP4 tensors in
 * device memory and one rank's writeback batch.
 * Included once, into nvfp4_bench.cu's one translation unit: bench_util.h
 * defines its kernels in every file that includes it. */
#ifndef MXSHARD_BENCH_NVFP4_BENCH_CUH
#define MXSHARD_BENCH_NVFP4_BENCH_CUH

#include <mxshard/cuda_nvfp4.h>
#include <mxshard/mxshard.h>

#include "bench_util.h"

static const char *const k_layout_name[] = {"COMPACT", "PADDED", "SWIZZLED"};
static const mxs_scale_layout k_layouts[] = {MXS_SCALES_COMPACT, MXS_SCALES_PADDED, MXS_SCALES_SWIZZLED};
static const char *const k_block_name[] = {"1x16", "16x16"};
static const int k_dp = 8;

/* ---- report --------------------------------------------------------------- */

struct nv_row {
    std::string shape, block, layout, planes, op, shard;
    bench_times t, ceil;
    bench_times floor;          /* the two-pass floor (nvfp4_floor.cuh); -1: none (finish) */
    double alu_us = -1;         /* instruction ceiling (conversions at the measured rate); -1: none */
    double bytes = 0;           /* the ceiling's bytes (input + outputs) */
    int64_t ours = -1, te = -1; /* reduced bytes per step; -1: not a writeback row / n.a. */
    std::string check, note;
};

/* One (shape, block, layout, planes) configuration's results, for the
 * summary table: % of ceiling (b2b) per operation. */
struct nv_summary {
    std::string shape, block, layout, planes;
    double q = -1, w1 = -1, w8 = -1, fin = -1;
    double q_alu = -1, w1_alu = -1, w8_alu = -1; /* % of the instruction ceiling */
    double q_fl = -1, w1_fl = -1, w8_fl = -1;    /* % of the two-pass floor */
    int64_t ours = -1, te = -1;
    std::string check;
};

struct nv_report {
    std::vector<nv_row> rows;
    std::vector<nv_summary> summary;
    std::vector<std::string> ceilings, errors, skipped;
    double copy_gbs = 0;
    double alu_gps = 0, alu_prev_gps = 0; /* conversions per second / 1e9: this rule, run 13's */
    int failed_checks = 0;
};

static std::string fmt_bytes(int64_t v) { return v < 0 ? std::string("n/a") : std::to_string((long long)v); }

static const char *k_row_header =
    "| shape | block | layout | planes | op | shard | single µs | b2b µs | graph µs | ceiling b2b µs | % ceil single "
    "| % ceil b2b | % ceil graph | 2-pass floor b2b µs | % floor b2b | ALU ceiling µs | % ALU ceil b2b | GB/s b2b "
    "| reduced B/step, ours (1 all-reduce) | TE B/step (2 all-reduces) | check | note |\n"
    "|---|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|\n";

static std::string row_md(const nv_row &r) {
    double gbs = r.t.b2b > 0 ? r.bytes / r.t.b2b / 1e3 : -1;
    bool wb = r.op == "writeback";
    return "| " + r.shape + " | " + r.block + " | " + r.layout + " | " + r.planes + " | " + r.op + " | " + r.shard +
           " | " + bench_fmt("%.1f", r.t.single) + " | " + bench_fmt("%.1f", r.t.b2b) + " | " +
           bench_fmt("%.1f", r.t.graph) + " | " + bench_fmt("%.1f", r.ceil.b2b) + " | " +
           bench_fmt("%.1f %%", bench_pct(r.ceil.single, r.t.single)) + " | " +
           bench_fmt("%.1f %%", bench_pct(r.ceil.b2b, r.t.b2b)) + " | " +
           bench_fmt("%.1f %%", bench_pct(r.ceil.b2b, r.t.graph)) + " | " + bench_fmt("%.1f", r.floor.b2b) + " | " +
           bench_fmt("%.1f %%", bench_pct(r.floor.b2b, r.t.b2b)) + " | " + bench_fmt("%.1f", r.alu_us) + " | " +
           bench_fmt("%.1f %%", bench_pct(r.alu_us, r.t.b2b)) + " | " + bench_fmt("%.0f", gbs) + " | " +
           (wb ? fmt_bytes(r.ours) : std::string("")) + " | " + (wb ? fmt_bytes(r.te) : std::string("")) + " | " +
           r.check + " | " + r.note + " |\n";
}

static const char *k_summary_header =
    "| shape | block | layout | planes | quantize | writeback DP=1 | writeback DP=8 rank | finish | quantize, % "
    "2-pass floor | DP=1, % 2-pass floor | DP=8 rank, % 2-pass floor | reduced B/step ours (1 x uint16 MAX) | TE (2 x "
    "fp32 MAX) | checks |\n"
    "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n";

/* "memory % / ALU %" of one summary cell. */
static std::string two_pct(double mem, double alu) {
    return bench_fmt("%.0f %%", mem) + (alu >= 0 ? " / " + bench_fmt("%.0f %%", alu) : std::string(""));
}

static std::string summary_md(const nv_summary &s) {
    return "| " + s.shape + " | " + s.block + " | " + s.layout + " | " + s.planes + " | " + two_pct(s.q, s.q_alu) +
           " | " + two_pct(s.w1, s.w1_alu) + " | " + two_pct(s.w8, s.w8_alu) + " | " + bench_fmt("%.0f %%", s.fin) +
           " | " + bench_fmt("%.0f %%", s.q_fl) + " | " + bench_fmt("%.0f %%", s.w1_fl) + " | " +
           bench_fmt("%.0f %%", s.w8_fl) + " | " + fmt_bytes(s.ours) + " | " + fmt_bytes(s.te) + " | " + s.check +
           " |\n";
}

/* ---- NVFP4 tensors in device memory ------------------------------------------ */

static mxs_nvfp4_tensor nv_shape(int64_t rows, int64_t cols, unsigned dirs, mxs_scale_layout layout,
                                 mxs_nvfp4_block block) {
    mxs_nvfp4_tensor t = bench_tensor_shape<mxs_nvfp4_tensor>(rows, cols, dirs, layout);
    t.block = block;
    return t;
}

/* Data and scale plane of every present plane, each 256-aligned, then the
 * amax (256 bytes, so arenas of one shape compare whole). */
static int64_t nv_tensor_bytes(const mxs_nvfp4_tensor &t) { return 256 + bench_planes_bytes(t); }

static void nv_tensor_place(mxs_nvfp4_tensor *t, uint8_t *base, int64_t *off) {
    bench_planes_place(t, base, off);
    t->amax = (float *)(base + *off);
    *off += 256;
}

/* One NVFP4 tensor in one zeroed allocation. */
struct nv_arena {
    uint8_t *mem = nullptr;
    int64_t bytes = 0;
    mxs_nvfp4_tensor t;
    explicit nv_arena(const mxs_nvfp4_tensor &shape) : t(shape) {
        bytes = nv_tensor_bytes(t);
        CK(cudaMalloc(&mem, (size_t)bytes));
        CK(cudaMemset(mem, 0, (size_t)bytes));
        int64_t off = 0;
        nv_tensor_place(&t, mem, &off);
    }
    ~nv_arena() { cudaFree(mem); }
    nv_arena(const nv_arena &) = delete;
    nv_arena &operator=(const nv_arena &) = delete;
};

static int64_t nv_arena_diff(const nv_arena &a, const nv_arena &b, unsigned long long *dcount, cudaStream_t s) {
    return bench_count_diff(a.mem, b.mem, std::min(a.bytes, b.bytes), dcount, s);
}

/* acc[i] = max(acc[i], x[i]) over uint16 entries: the MAX all-reduce of the
 * DP=8 byte check, done on one device. */
__global__ void nv_max_u16(uint16_t *acc, const uint16_t *x, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        acc[i] = x[i] > acc[i] ? x[i] : acc[i];
}

/* ---- one rank's writeback batch ------------------------------------------------ */

/* One item, its plan and packed buffer. Not copyable: the batch points at
 * the item. */
struct nv_wb {
    mxs_nvfp4_wb_item item;
    mxs_nvfp4_wb_batch b;
    mxs_nvfp4_wb_plan plan;
    void *packed = nullptr;
    nv_wb(const mxs_nvfp4_tensor &t, const float *master, int64_t start, int64_t len, uint8_t *stage) {
        memset(&item, 0, sizeof item);
        item.primary = t;
        item.master = master;
        item.master_dtype = MXS_F32;
        item.start = start;
        item.len = len;
        item.col_stage = stage;
        memset(&b, 0, sizeof b);
        b.items = &item;
        b.n_items = 1;
        b.round_through = MXS_BF16; /* TE's master cast: 2-byte entries */
        MK(mxs_nvfp4_wb_make_plan(&b, &plan, NULL));
        CK(cudaMalloc(&packed, (size_t)plan.packed_bytes + 64));
    }
    ~nv_wb() { cudaFree(packed); }
    nv_wb(const nv_wb &) = delete;
    nv_wb &operator=(const nv_wb &) = delete;
    mxs_status step(cudaStream_t s) { /* partial + apply, no reduction */
        mxs_status st = mxs_cuda_nvfp4_wb_partial(&b, &plan, packed, s);
        return st != MXS_OK ? st : mxs_cuda_nvfp4_wb_apply(&b, &plan, packed, s);
    }
};

/* TE's reduced bytes per step for one weight (16x16 only): 4 per tile + 4. */
static int64_t te_bytes(int64_t rows, int64_t cols, mxs_nvfp4_block block) {
    if (block != MXS_NVFP4_16X16) return -1;
    return 4 * mxs_ceil_div(rows, MXS_NVFP4_BLOCK) * mxs_ceil_div(cols, MXS_NVFP4_BLOCK) + 4;
}

#endif /* MXSHARD_BENCH_NVFP4_BENCH_CUH */
