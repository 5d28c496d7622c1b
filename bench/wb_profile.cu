/* SPDX-License-Identifier: MIT */
/* bench/wb_profile.cu - one writeback configuration, run a few times: the
 * driver for profiler runs (ncu) of the prepared-bucket phases. Not a
 * benchmark (bench/cuda_bench.cu is): it prints one line with the mean time
 * per partial + apply step and nothing is compared against a ceiling.
 *
 *   wb_profile [--shape RxC] [--weights W] [--planes row|both]
 *              [--layout compact|padded|swizzled] [--dp N] [--rank R]
 *              [--shift S] [--elem-aligned] [--megatron] [--iters K]
 *
 * The bucket: W weights of R/W rows x C (R % W rows go to the last), or
 * with --megatron the linear weights of 4 layers at hidden 4096 (qkv
 * 6144x4096 and fc1 28672x4096 bidirectional, proj 4096x4096 and fc2
 * 4096x14336 row-only when --planes both, else all row-only). The bucket is
 * cut into N equal contiguous ranges (mxs_bucket_shard); rank R's range is
 * moved by +S elements at the start and -S at the end (--shift). Its master
 * is one f32 buffer of its range: 16-byte aligned with --elem-aligned (the
 * loads are then only element-aligned unless the start is a multiple of 4),
 * else placed as if the whole bucket's master were 16-byte aligned. FUSED,
 * round-through bf16. Exit 77 without a CUDA device. */
#include <string>
#include <vector>

#include <mxshard/cuda.h>
#include <mxshard/mxshard.h>

#include "bench_util.h"

static int profile_main(int argc, char **argv) {
    int64_t rows = 8192, cols = 8192, weights = 1, dp = 1, rank = 0, shift = 0, iters = 5;
    bool both = false, elem_aligned = false, megatron = false;
    mxs_scale_layout layout = MXS_SCALES_COMPACT;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : "";
        if (a == "--shape" && sscanf(v, "%lldx%lld", (long long *)&rows, (long long *)&cols) == 2)
            i++;
        else if (a == "--weights")
            weights = atoll(argv[++i]);
        else if (a == "--planes")
            both = std::string(argv[++i]) == "both";
        else if (a == "--layout") {
            std::string l = argv[++i];
            layout = l == "padded" ? MXS_SCALES_PADDED : l == "swizzled" ? MXS_SCALES_SWIZZLED : MXS_SCALES_COMPACT;
        } else if (a == "--dp")
            dp = atoll(argv[++i]);
        else if (a == "--rank")
            rank = atoll(argv[++i]);
        else if (a == "--shift")
            shift = atoll(argv[++i]);
        else if (a == "--iters")
            iters = atoll(argv[++i]);
        else if (a == "--elem-aligned")
            elem_aligned = true;
        else if (a == "--megatron")
            megatron = true;
        else {
            fprintf(stderr, "wb_profile: unknown argument %s\n", argv[i]);
            return 2;
        }
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) {
        printf("wb_profile: no CUDA device\n");
        return 77;
    }

    /* the bucket's weights */
    struct W {
        int64_t r, c;
        unsigned dirs;
    };
    std::vector<W> ws;
    if (megatron) {
        for (int l = 0; l < 4; l++) {
            ws.push_back({6144, 4096, both ? 3u : 1u});
            ws.push_back({4096, 4096, 1u});
            ws.push_back({28672, 4096, both ? 3u : 1u});
            ws.push_back({4096, 14336, 1u});
        }
    } else {
        for (int64_t w = 0; w < weights; w++)
            ws.push_back({rows / weights + (w == weights - 1 ? rows % weights : 0), cols, both ? 3u : 1u});
    }
    int64_t total = 0, prim_bytes = 0;
    std::vector<int64_t> offset;
    for (const W &w : ws) {
        offset.push_back(total);
        total += w.r * w.c;
        prim_bytes += bench_planes_bytes(bench_tensor_shape<mxs_tensor>(w.r, w.c, w.dirs, layout));
    }
    const mxs_range me = mxs_bucket_shard(0, total, total, dp, rank);
    int64_t lo = me.first + shift, hi = me.first + me.count - shift;
    if (lo < 0) lo = 0;
    if (hi > total) hi = total;
    if (hi < lo) hi = lo;

    float *master = nullptr;
    uint8_t *prim = nullptr;
    const int64_t pad = elem_aligned ? 0 : lo % 4; /* elements before lo in the 16-byte line */
    CK(cudaMalloc(&master, (size_t)(hi - lo + pad + 4) * 4));
    CK(cudaMalloc(&prim, (size_t)prim_bytes));
    CK(cudaMemset(prim, 0, (size_t)prim_bytes));
    bench_fill<<<1024, 256>>>(reinterpret_cast<uint32_t *>(master), hi - lo + pad + 4, 7u, 1);
    CK(cudaGetLastError());

    std::vector<mxs_wb_item> items;
    int64_t off = 0;
    for (size_t i = 0; i < ws.size(); i++) {
        const W &w = ws[i];
        mxs_wb_item it;
        memset(&it, 0, sizeof it);
        it.primary = bench_tensor_shape<mxs_tensor>(w.r, w.c, w.dirs, layout);
        bench_planes_place(&it.primary, prim, &off);
        const mxs_range r = mxs_range_in_weight(lo, hi, offset[i], w.r * w.c);
        it.start = r.first;
        it.len = r.count;
        it.master = master + pad + (offset[i] + r.first - lo);
        it.master_dtype = MXS_F32;
        items.push_back(it);
    }
    mxs_wb_batch b;
    memset(&b, 0, sizeof b);
    b.items = items.data();
    b.n_items = (int64_t)items.size();
    b.round_through = MXS_BF16;
    b.mode = MXS_WB_FUSED;
    mxs_wb_plan plan;
    MK(mxs_wb_make_plan(&b, &plan, NULL));
    int64_t wsb = 0;
    MK(mxs_cuda_wb_prepare_bytes(&b, &wsb));
    uint8_t *packed = nullptr;
    void *work = nullptr;
    CK(cudaMalloc(&packed, (size_t)plan.packed_bytes));
    CK(cudaMalloc(&work, (size_t)wsb + 16));
    mxs_cuda_wb_bucket bk;
    MK(mxs_cuda_wb_prepare(&bk, &b, &plan, packed, work, wsb, 0));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    MK(mxs_cuda_wb_bucket_partial(&bk, 0)); /* warm-up */
    MK(mxs_cuda_wb_bucket_apply(&bk, 0));
    CK(cudaEventRecord(e0, 0));
    for (int64_t k = 0; k < iters; k++) {
        MK(mxs_cuda_wb_bucket_partial(&bk, 0));
        MK(mxs_cuda_wb_bucket_apply(&bk, 0));
    }
    CK(cudaEventRecord(e1, 0));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    printf("wb_profile: %zu weights, %lld elements, rank %lld/%lld [%lld, %lld) %s %s%s: %.2f us per step "
           "(packed %lld B)\n",
           ws.size(), (long long)total, (long long)rank, (long long)dp, (long long)lo, (long long)hi,
           both ? "both" : "row-only",
           layout == MXS_SCALES_COMPACT  ? "COMPACT"
           : layout == MXS_SCALES_PADDED ? "PADDED"
                                         : "SWIZZLED",
           elem_aligned ? " elem-aligned master" : "", 1000.0 * ms / (double)iters, (long long)plan.packed_bytes);
    MK(mxs_cuda_wb_bucket_release(&bk));
    cudaFree(master);
    cudaFree(prim);
    cudaFree(packed);
    cudaFree(work);
    return 0;
}

int main(int argc, char **argv) {
    try {
        return profile_main(argc, argv);
    } catch (const bench_error &e) {
        fprintf(stderr, "wb_profile: %s\n", e.what());
        return 1;
    }
}
