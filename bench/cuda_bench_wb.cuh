/* SPDX-License-Identifier: MIT */
/* bench/cuda_bench_wb.cuh - part of bench/cuda_bench.cu: device memory
 * (buffers, tensors placed in one zeroed arena), one writeback batch with
 * its prepared bucket, the byte checks of the sharded cases (the group's
 * exponents, one rank's bytes) and the host cost of each phase call.
 * Included once, into cuda_bench.cu's one translation unit: bench_util.h
 * defines its kernels in every file that includes it. */
#ifndef MXSHARD_BENCH_CUDA_BENCH_WB_CUH
#define MXSHARD_BENCH_CUDA_BENCH_WB_CUH

#include <chrono>
#include <memory>

#include <mxshard/cuda.h>
#include <mxshard/mxshard.h>

#include "cuda_bench.cuh"

/* ---- device memory ------------------------------------------------------ */

/* One device allocation, freed with its owner. */
struct dev_buf {
    void *p = nullptr;
    explicit dev_buf(size_t bytes) { CK(cudaMalloc(&p, bytes)); }
    ~dev_buf() { cudaFree(p); }
    dev_buf(const dev_buf &) = delete;
    dev_buf &operator=(const dev_buf &) = delete;
    template <class T> T *as() const { return static_cast<T *>(p); }
};

static mxs_tensor tensor_shape(int64_t rows, int64_t cols, unsigned dirs, mxs_scale_layout layout) {
    return bench_tensor_shape<mxs_tensor>(rows, cols, dirs, layout);
}

/* Bytes for one tensor's planes, each data and scale plane 256-aligned. */
static int64_t tensor_bytes(const mxs_tensor &t) { return bench_planes_bytes(t); }

/* Places t's planes at base + *off and advances *off. */
static void tensor_place(mxs_tensor *t, uint8_t *base, int64_t *off) { bench_planes_place(t, base, off); }

/* All scale bytes of t's present planes in its layout. */
static int64_t tensor_scale_bytes(const mxs_tensor &t) {
    int64_t b = 0;
    for (int pl = 1; pl <= 2; pl++)
        if (t.dirs & (unsigned)pl) b += mxs_scale_bytes(&t, (mxs_dirs)pl);
    return b;
}

static const uint8_t *plane_data(const mxs_tensor &t, int pl) { return pl == 1 ? t.row_data : t.col_data; }
static const uint8_t *plane_scale(const mxs_tensor &t, int pl) { return pl == 1 ? t.row_scale : t.col_scale; }

/* A set of tensors in one zeroed allocation (gaps stay 0, so two arenas of
 * the same shapes compare byte for byte). */
struct arena {
    uint8_t *mem = nullptr;
    int64_t bytes = 0;
    std::vector<mxs_tensor> t;
    arena(const std::vector<mxs_tensor> &shapes) : t(shapes) {
        for (const mxs_tensor &x : t) bytes += tensor_bytes(x);
        CK(cudaMalloc(&mem, (size_t)bytes));
        CK(cudaMemset(mem, 0, (size_t)bytes));
        int64_t off = 0;
        for (mxs_tensor &x : t) tensor_place(&x, mem, &off);
    }
    ~arena() { cudaFree(mem); }
    arena(const arena &) = delete;
    arena &operator=(const arena &) = delete;
};

static int64_t arena_diff(const arena &a, const arena &b, unsigned long long *dcount, cudaStream_t s) {
    return bench_count_diff(a.mem, b.mem, std::min(a.bytes, b.bytes), dcount, s);
}

/* acc[i] = max(acc[i], p[i]): the MAX all-reduce of a group's packed
 * buffers, on one device. */
__global__ void bench_max_into(uint8_t *acc, const uint8_t *p, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        acc[i] = p[i] > acc[i] ? p[i] : acc[i];
}

/* ---- one writeback batch ------------------------------------------------ */

/* A batch with its plan, packed buffer, a prepared bucket and two
 * workspaces (the bucket's, and one for the one-shot calls, which must never
 * overwrite the bucket's work list). Not copyable: the bucket stays where
 * it was prepared. */
struct wb_set {
    std::vector<mxs_wb_item> items;
    mxs_wb_batch b;
    mxs_wb_plan plan;
    uint8_t *packed = nullptr;
    void *ws = nullptr;
    int64_t wsb = 0;
    mxs_cuda_wb_bucket bucket;
    void *bws = nullptr;
    int64_t bwsb = 0;
    bool prepared = false;
    wb_set() { memset(&bucket, 0, sizeof bucket); }
    wb_set(const wb_set &) = delete;
    wb_set &operator=(const wb_set &) = delete;

    void setup(cudaStream_t s) {
        memset(&b, 0, sizeof b);
        b.items = items.data();
        b.n_items = (int64_t)items.size();
        b.round_through = MXS_BF16;
        b.mode = MXS_WB_FUSED;
        MK(mxs_wb_make_plan(&b, &plan, NULL));
        MK(mxs_cuda_wb_workspace_bytes(&b, &wsb));
        CK(cudaMalloc(&packed, (size_t)plan.packed_bytes + 64));
        CK(cudaMalloc(&ws, (size_t)wsb + 64));
        memset(&bucket, 0, sizeof bucket);
        MK(mxs_cuda_wb_prepare_bytes(&b, &bwsb));
        CK(cudaMalloc(&bws, (size_t)bwsb + 64));
        MK(mxs_cuda_wb_prepare(&bucket, &b, &plan, packed, bws, bwsb, s));
        CK(cudaStreamSynchronize(s));
        prepared = true;
    }
    mxs_status oneshot(cudaStream_t s) {
        mxs_status st = mxs_cuda_wb_partial(&b, &plan, packed, ws, wsb, s);
        return st != MXS_OK ? st : mxs_cuda_wb_apply(&b, &plan, packed, ws, wsb, s);
    }
    mxs_status run(cudaStream_t s) {
        mxs_status st = mxs_cuda_wb_bucket_partial(&bucket, s);
        return st != MXS_OK ? st : mxs_cuda_wb_bucket_apply(&bucket, s);
    }
    ~wb_set() {
        if (prepared && mxs_cuda_wb_bucket_release(&bucket) != MXS_OK)
            fprintf(stderr, "cuda_bench: bucket release failed\n");
        cudaFree(bws);
        cudaFree(packed);
        cudaFree(ws);
    }
};

static mxs_wb_item wb_item(const mxs_tensor &t, const float *master, int64_t start, int64_t len) {
    mxs_wb_item it;
    memset(&it, 0, sizeof it);
    it.primary = t;
    it.master = master;
    it.master_dtype = MXS_F32;
    it.start = start;
    it.len = len;
    return it;
}

static std::vector<bench_call> wb_calls(const std::vector<wb_set *> &sets) {
    std::vector<bench_call> calls;
    for (wb_set *p : sets) calls.push_back([p](cudaStream_t s) { return p->run(s); });
    return calls;
}
static std::vector<wb_set *> wb_ptrs(const std::vector<std::unique_ptr<wb_set>> &sets) {
    std::vector<wb_set *> v;
    for (const auto &w : sets) v.push_back(w.get());
    return v;
}

/* ---- the group's exponents and one rank's bytes ------------------------- */

/* The packed buffer after the group's MAX all-reduce, built from the
 * reference: item i's COMPACT scales (ref[i], in the items' layout,
 * converted) at its slot, then the status byte 0. w: any rank's set of the
 * group (the packed layout depends only on shapes and planes). */
static void reduced_exponents(const wb_set &w, const std::vector<mxs_tensor> &ref, uint8_t *reduced, cudaStream_t s) {
    std::vector<mxs_wb_slot> slots(w.items.size());
    mxs_wb_plan p;
    MK(mxs_wb_make_plan(&w.b, &p, slots.data()));
    for (size_t i = 0; i < w.items.size(); i++) {
        const mxs_tensor &r = ref[i];
        const mxs_tensor c = tensor_shape(r.rows, r.cols, r.dirs, MXS_SCALES_COMPACT);
        for (int pl = 1; pl <= 2; pl++) {
            if (!(r.dirs & (unsigned)pl)) continue;
            uint8_t *dst = reduced + (pl == 1 ? slots[i].row_offset : slots[i].col_offset);
            if (r.scale_layout == MXS_SCALES_COMPACT)
                CK(cudaMemcpyAsync(dst, plane_scale(r, pl), (size_t)mxs_scale_bytes(&c, (mxs_dirs)pl),
                                   cudaMemcpyDeviceToDevice, s));
            else
                MK(mxs_cuda_convert_scales(r.rows, r.cols, (mxs_dirs)pl, r.scale_layout, plane_scale(r, pl),
                                           MXS_SCALES_COMPACT, dst, s));
        }
    }
    CK(cudaMemsetAsync(reduced + p.status_offset, 0, 1, s));
}

/* The group check (a): on zeroed primaries (prim, prim_bytes), each rank's
 * partial in turn (run_rank(q, acc) runs rank q's partial and MAXes its
 * packed buffer into acc), against the reduced exponents. Differing bytes. */
static int64_t group_exponents_diff(int nranks, const std::function<void(int, uint8_t *)> &run_rank, uint8_t *prim,
                                    int64_t prim_bytes, const uint8_t *reduced, int64_t packed_bytes,
                                    unsigned long long *dcount, cudaStream_t s) {
    dev_buf acc((size_t)packed_bytes + 64);
    CK(cudaMemsetAsync(prim, 0, (size_t)prim_bytes, s));
    CK(cudaMemsetAsync(acc.p, 0, (size_t)packed_bytes, s));
    for (int q = 0; q < nranks; q++) run_rank(q, acc.as<uint8_t>());
    return bench_count_diff(acc.as<uint8_t>(), reduced, packed_bytes, dcount, s);
}

/* Rank w's partial, its packed buffer MAXed into acc. */
static void partial_into(wb_set &w, uint8_t *acc, cudaStream_t s) {
    MK(mxs_cuda_wb_bucket_partial(&w.bucket, s));
    bench_max_into<<<1024, 256, 0, s>>>(acc, w.packed, w.plan.packed_bytes);
    CK(cudaGetLastError());
}

/* The rank check (b): rank w alone on zeroed primaries (prim, prim_bytes):
 * partial, the reduced exponents in place of the all-reduce, apply; then its
 * slice of each present data plane and every scale plane (padding included)
 * against the reference (ref[i] placed like item i's primary). Differing
 * bytes. */
static int64_t rank_diff(wb_set &w, uint8_t *prim, int64_t prim_bytes, const uint8_t *reduced,
                         const std::vector<mxs_tensor> &ref, unsigned long long *dcount, cudaStream_t s) {
    CK(cudaMemsetAsync(prim, 0, (size_t)prim_bytes, s));
    MK(mxs_cuda_wb_bucket_partial(&w.bucket, s));
    CK(cudaMemcpyAsync(w.packed, reduced, (size_t)w.plan.packed_bytes, cudaMemcpyDeviceToDevice, s));
    MK(mxs_cuda_wb_bucket_apply(&w.bucket, s));
    int64_t d = 0;
    for (size_t i = 0; i < w.items.size(); i++) {
        const mxs_wb_item &it = w.items[i];
        const mxs_tensor &t = it.primary, &r = ref[i];
        for (int pl = 1; pl <= 2; pl++) {
            if (!(t.dirs & (unsigned)pl)) continue;
            if (it.len > 0)
                d += bench_count_diff(plane_data(t, pl) + it.start, plane_data(r, pl) + it.start, it.len, dcount, s);
            d += bench_count_diff(plane_scale(t, pl), plane_scale(r, pl), mxs_scale_bytes(&t, (mxs_dirs)pl), dcount, s);
        }
    }
    return d;
}

static std::string check_text(int64_t group, int64_t ranks) {
    if (group == 0 && ranks == 0) return "ok";
    return std::to_string(group + ranks) + " bytes differ (group exponents " + std::to_string(group) +
           ", rank slices + scales " + std::to_string(ranks) + ")";
}

/* Host time of each phase call (enqueue only: the stream is idle before
 * each call, so no call waits for the GPU), median of `reps`. */
struct host_cost {
    double prepare = -1, partial = -1, apply = -1, oneshot_partial = -1, oneshot_apply = -1;
};

static host_cost measure_host(wb_set &w, cudaStream_t s, int reps) {
    host_cost h;
    std::vector<double> a, b;
    for (int i = 0; i < reps; i++) {
        CK(cudaStreamSynchronize(s));
        auto t0 = std::chrono::steady_clock::now();
        MK(mxs_cuda_wb_partial(&w.b, &w.plan, w.packed, w.ws, w.wsb, s));
        a.push_back(bench_us_since(t0));
        t0 = std::chrono::steady_clock::now();
        MK(mxs_cuda_wb_apply(&w.b, &w.plan, w.packed, w.ws, w.wsb, s));
        b.push_back(bench_us_since(t0));
    }
    h.oneshot_partial = bench_median(a);
    h.oneshot_apply = bench_median(b);
    {
        std::vector<double> p;
        a.clear();
        b.clear();
        for (int i = 0; i < reps; i++) {
            CK(cudaStreamSynchronize(s));
            auto t0 = std::chrono::steady_clock::now();
            MK(mxs_cuda_wb_bucket_partial(&w.bucket, s));
            a.push_back(bench_us_since(t0));
            t0 = std::chrono::steady_clock::now();
            MK(mxs_cuda_wb_bucket_apply(&w.bucket, s));
            b.push_back(bench_us_since(t0));
        }
        h.partial = bench_median(a);
        h.apply = bench_median(b);
        for (int i = 0; i < std::max(3, reps / 10); i++) {
            CK(cudaStreamSynchronize(s));
            MK(mxs_cuda_wb_bucket_release(&w.bucket));
            auto t0 = std::chrono::steady_clock::now();
            MK(mxs_cuda_wb_prepare(&w.bucket, &w.b, &w.plan, w.packed, w.bws, w.bwsb, s));
            p.push_back(bench_us_since(t0));
        }
        h.prepare = bench_median(p);
    }
    CK(cudaStreamSynchronize(s));
    return h;
}

static std::unique_ptr<dev_buf> dev_alloc(size_t bytes) { return std::unique_ptr<dev_buf>(new dev_buf(bytes)); }

#endif /* MXSHARD_BENCH_CUDA_BENCH_WB_CUH */
