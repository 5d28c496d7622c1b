/* SPDX-License-Identifier: MIT */
/* tools/demo_cuda.c - `mxshard-demo --device cuda`: the demo's job on real
 * GPUs, one process per GPU over NCCL, as torchrun would run it.
 *
 * Every rank builds the same Llama-style bucket (demo.h), owns the
 * distributed-optimizer shard of it that mxs_bucket_shard gives, keeps its
 * own MXFP8 primaries on its GPU (TE's padded scale layout) and, per update:
 *
 *   step     new f32 masters; this rank's shard to the GPU
 *   partial  mxs_cuda_wb_partial    (whole bucket, fused mode)
 *   reduce   ONE ncclAllReduce(uint8, ncclMax) of the packed exponents
 *   apply    mxs_cuda_wb_apply      (scales + shard edges)
 *   gather   mxs_nccl_gather_planes (uint8, present data planes only)
 *   verify   GPU bytes == mxs_host_quantize of the bf16-rounded master
 *            == GPU BF16 copy-back (bf16 master all-gathered, then
 *               mxs_cuda_quantize into a second set of primaries)
 *
 * partial / reduce / apply are the three calls mxs_nccl_wb_writeback makes;
 * they are issued one by one here only to time them with CUDA events.
 * Rank 0 prints the progress and the summary; the launcher (launch.h) then
 * prints each rank's verdict. Timings are the maximum over ranks.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <mxshard/mxshard.h>
#include <mxshard/nccl.h>

#include "demo.h"
#include "launch.h"

enum { CP_STEP, CP_PARTIAL, CP_REDUCE, CP_APPLY, CP_GATHER, CP_VERIFY, CP_COUNT };
static const char *const cp_names[CP_COUNT] = {"step", "partial", "reduce", "apply", "gather", "verify"};

/* Per-rank state of one weight. */
typedef struct cw {
    mxs_tensor dev;      /* the primary on this rank's GPU */
    mxs_tensor copyback; /* a second primary for the BF16 copy-back check */
    mxs_tensor ref;      /* host reference (mxs_host_quantize) */
    float *d_shard;      /* this rank's master shard on the GPU */
    uint16_t *d_bf16;    /* the full bf16 master (gathered) for copy-back */
    float *master;       /* full f32 master on the host (deterministic) */
    uint16_t *bf16;      /* its bf16 rounding */
    int64_t elems, offset;
} cw;

/* Deterministic master value of element i of weight w at update u: the same
 * on every rank, magnitudes spread over ~16 binades around 2^-6. */
static float master_value(uint64_t seed, int w, int u, int64_t i) {
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + (uint64_t)w * 0xBF58476D1CE4E5B9ull +
                 (uint64_t)u * 0x94D049BB133111EBull + (uint64_t)i * 0x2545F4914F6CDD1Dull;
    uint32_t bits;
    z ^= z >> 31;
    z *= 0x7FB5D329728EA185ull;
    z ^= z >> 27;
    z *= 0x81DADEF4BC2E2A3Bull;
    z ^= z >> 33;
    bits = (uint32_t)(z & 0x807FFFFFu) | ((uint32_t)(113 + (z >> 40) % 16) << 23);
    return mxs_f32_from_bits(bits);
}

static int64_t diff_bytes(const uint8_t *a, const uint8_t *b, int64_t n) {
    int64_t k, bad = 0;
    for (k = 0; k < n; k++) bad += a[k] != b[k];
    return bad;
}

/* Device plane(s) of t vs host planes of ref: mismatching bytes (data and
 * scales of every present plane); -1 on a CUDA error. */
static int64_t compare_planes(const mxs_tensor *t, const mxs_tensor *ref, uint8_t *scratch) {
    int64_t bad = 0, n = ref->rows * ref->cols;
    int p;
    for (p = MXS_ROWWISE; p <= MXS_COLWISE; p++) {
        const uint8_t *dd = p == MXS_ROWWISE ? t->row_data : t->col_data;
        const uint8_t *ds = p == MXS_ROWWISE ? t->row_scale : t->col_scale;
        int64_t sb;
        if (!(ref->dirs & (unsigned)p)) continue;
        sb = mxs_scale_bytes(ref, (mxs_dirs)p);
        if (cudaMemcpy(scratch, dd, (size_t)n, cudaMemcpyDeviceToHost) != cudaSuccess) return -1;
        bad += diff_bytes(scratch, p == MXS_ROWWISE ? ref->row_data : ref->col_data, n);
        if (cudaMemcpy(scratch, ds, (size_t)sb, cudaMemcpyDeviceToHost) != cudaSuccess) return -1;
        bad += diff_bytes(scratch, p == MXS_ROWWISE ? ref->row_scale : ref->col_scale, sb);
    }
    return bad;
}

static int alloc_tensor(mxs_tensor *t, int device) {
    int64_t n = t->rows * t->cols;
    int p;
    for (p = MXS_ROWWISE; p <= MXS_COLWISE; p++) {
        uint8_t **data = p == MXS_ROWWISE ? &t->row_data : &t->col_data;
        uint8_t **scale = p == MXS_ROWWISE ? &t->row_scale : &t->col_scale;
        int64_t sb;
        if (!(t->dirs & (unsigned)p)) continue;
        sb = mxs_scale_bytes(t, (mxs_dirs)p);
        if (device) {
            if (cudaMalloc((void **)data, (size_t)n) != cudaSuccess ||
                cudaMalloc((void **)scale, (size_t)sb) != cudaSuccess)
                return 0;
            cudaMemset(*data, 0xA5, (size_t)n); /* poison: every byte must be written */
            cudaMemset(*scale, 0xA5, (size_t)sb);
        } else {
            *data = (uint8_t *)malloc((size_t)n);
            *scale = (uint8_t *)malloc((size_t)sb);
            if (!*data || !*scale) return 0;
        }
    }
    return 1;
}

static void free_tensor(mxs_tensor *t, int device) {
    if (device) {
        cudaFree(t->row_data);
        cudaFree(t->row_scale);
        cudaFree(t->col_data);
        cudaFree(t->col_scale);
    } else {
        free(t->row_data);
        free(t->row_scale);
        free(t->col_data);
        free(t->col_scale);
    }
}

#define CU(call)                                                                                                       \
    do {                                                                                                               \
        cudaError_t e_ = (call);                                                                                       \
        if (e_ != cudaSuccess) {                                                                                       \
            mxs_rank_log(r, "  FAIL %s: %s", #call, cudaGetErrorString(e_));                                           \
            r->failed++;                                                                                               \
            return;                                                                                                    \
        }                                                                                                              \
    } while (0)
#define MX(call)                                                                                                       \
    do {                                                                                                               \
        mxs_status s_ = (call);                                                                                        \
        if (s_ != MXS_OK) {                                                                                            \
            mxs_rank_log(r, "  FAIL %s: %s", #call, mxs_status_str(s_));                                               \
            r->failed++;                                                                                               \
            return;                                                                                                    \
        }                                                                                                              \
    } while (0)
#define NC(call)                                                                                                       \
    do {                                                                                                               \
        ncclResult_t n_ = (call);                                                                                      \
        if (n_ != ncclSuccess) {                                                                                       \
            mxs_rank_log(r, "  FAIL %s: %s", #call, ncclGetErrorString(n_));                                           \
            r->failed++;                                                                                               \
            return;                                                                                                    \
        }                                                                                                              \
    } while (0)

static void rank_main(mxs_rank *r, void *user) {
    const demo_opts *o = (const demo_opts *)user;
    static mxs_sim_weight weights[DEMO_MAX_WEIGHTS];
    static cw st[DEMO_MAX_WEIGHTS];
    static mxs_wb_item items[DEMO_MAX_WEIGHTS];
    static mxs_tensor dev_views[DEMO_MAX_WEIGHTS];
    int64_t *starts, *lens, kv, ffn, bucket = 0, max_elems = 0, ws_bytes = 0, gather_u8 = 0, gather_bf16 = 0;
    int64_t primary = 0, bidir = 0, te_bytes = 0, row_only = 0, mismatch = 0, i;
    double ms[DEMO_UPDATES][CP_COUNT];
    const int me = r->rank, nr = r->nranks, talk = me == 0 && !o->json;
    int n = demo_make_bucket(o, weights, &kv, &ffn), w, u, p;
    mxs_wb_batch batch;
    mxs_wb_plan plan;
    uint8_t *packed = NULL, *scratch, *check = NULL;
    void *ws = NULL;
    double *d_ms = NULL;
    int64_t *d_bad = NULL;
    cudaEvent_t ev[5];
    char b1[32], b2[32], b3[32];

    starts = (int64_t *)calloc((size_t)n * (size_t)nr, sizeof(int64_t));
    lens = (int64_t *)calloc((size_t)n * (size_t)nr, sizeof(int64_t));
    if (!starts || !lens) return;
    for (w = 0; w < n; w++) {
        st[w].elems = weights[w].rows * weights[w].cols;
        st[w].offset = bucket;
        bucket += st[w].elems;
        if (st[w].elems > max_elems) max_elems = st[w].elems;
    }
    bucket = mxs_round_up(bucket, nr);
    if (talk)
        printf("mxshard-demo: %d rank%s (one process per GPU, NCCL), %d layer%s, hidden %lld, kv %lld, ffn %lld\n", nr,
               nr == 1 ? "" : "s", o->layers, o->layers > 1 ? "s" : "", (long long)o->hidden, (long long)kv,
               (long long)ffn);

    /* the bucket: shards, primaries, masters */
    memset(&batch, 0, sizeof batch);
    for (w = 0; w < n; w++) {
        cw *c = &st[w];
        mxs_tensor shape;
        int q;
        memset(&shape, 0, sizeof shape);
        shape.rows = weights[w].rows;
        shape.cols = weights[w].cols;
        shape.dirs = weights[w].dirs;
        shape.scale_layout = MXS_SCALES_PADDED;
        for (q = 0; q < nr; q++) {
            mxs_range sh = mxs_bucket_shard(c->offset, c->elems, bucket, nr, q);
            starts[w * nr + q] = sh.first;
            lens[w * nr + q] = sh.count;
        }
        c->dev = c->copyback = c->ref = shape;
        if (!alloc_tensor(&c->dev, 1) || !alloc_tensor(&c->copyback, 1) || !alloc_tensor(&c->ref, 0)) {
            mxs_rank_log(r, "  FAIL out of memory for weight %s", weights[w].name);
            r->failed++;
            return;
        }
        c->master = (float *)malloc((size_t)c->elems * sizeof(float));
        c->bf16 = (uint16_t *)malloc((size_t)c->elems * sizeof(uint16_t));
        if (!c->master || !c->bf16) return;
        CU(cudaMalloc((void **)&c->d_shard, (size_t)(lens[w * nr + me] > 0 ? lens[w * nr + me] : 1) * sizeof(float)));
        CU(cudaMalloc((void **)&c->d_bf16, (size_t)c->elems * sizeof(uint16_t)));
        memset(&items[w], 0, sizeof items[w]);
        items[w].primary = c->dev;
        items[w].master = c->d_shard;
        items[w].master_dtype = MXS_F32;
        items[w].start = starts[w * nr + me];
        items[w].len = lens[w * nr + me];
        dev_views[w] = c->dev;
        primary += mxs_tensor_storage_bytes(&c->dev);
        shape.dirs = MXS_BOTH;
        bidir += mxs_tensor_storage_bytes(&shape);
        te_bytes += demo_te_amax_bytes(shape.rows, shape.cols, weights[w].dirs);
        row_only += weights[w].dirs == MXS_ROWWISE;
        for (q = 0; q < 2; q++) gather_u8 += (weights[w].dirs & (unsigned)(q + 1)) ? c->elems : 0;
        gather_bf16 += 2 * c->elems;
    }
    batch.items = items;
    batch.n_items = n;
    batch.rounding = o->rounding;
    batch.round_through = MXS_BF16; /* as TE: writeback == BF16 copy-back */
    batch.mode = MXS_WB_FUSED;
    MX(mxs_wb_make_plan(&batch, &plan, NULL));
    MX(mxs_cuda_wb_workspace_bytes(&batch, &ws_bytes));
    CU(cudaMalloc((void **)&packed, (size_t)(plan.packed_bytes > 0 ? plan.packed_bytes : 1)));
    CU(cudaMalloc(&ws, (size_t)(ws_bytes > 0 ? ws_bytes : 1)));
    CU(cudaMalloc((void **)&d_ms, sizeof ms));
    CU(cudaMalloc((void **)&d_bad, sizeof(int64_t)));
    scratch = (uint8_t *)malloc((size_t)max_elems);
    if (!scratch) return;
    for (p = 0; p < 5; p++) CU(cudaEventCreate(&ev[p]));
    CU(cudaMalloc((void **)&check, 32)); /* plan-check scratch (device) */
    MX(mxs_nccl_wb_check_plan(&plan, check, r->comm, r->stream));
    if (talk)
        printf("[setup]      plan agreed by %d rank%s (fingerprint %016llx)\n", nr, nr == 1 ? "" : "s",
               (unsigned long long)plan.fingerprint);

    for (u = 0; u < DEMO_UPDATES; u++) {
        double t0 = demo_now_ms();
        float span[4];
        /* step: every rank knows the new masters (deterministic); it uploads only its shard */
        for (w = 0; w < n; w++) {
            cw *c = &st[w];
            for (i = 0; i < c->elems; i++) {
                c->master[i] = master_value(o->seed, w, u, i);
                c->bf16[i] = mxs_bf16_from_f32(c->master[i]);
            }
            if (items[w].len > 0)
                CU(cudaMemcpyAsync(c->d_shard, c->master + items[w].start, (size_t)items[w].len * sizeof(float),
                                   cudaMemcpyHostToDevice, r->stream));
        }
        CU(cudaStreamSynchronize(r->stream));
        ms[u][CP_STEP] = demo_now_ms() - t0;
        if (talk)
            printf("[update %d/%d] step      new masters, shards uploaded  %8.1f ms\n", u + 1, DEMO_UPDATES,
                   ms[u][CP_STEP]);

        /* line the ranks up first (a 1-byte all-reduce, not part of the
         * writeback) so that the reduce phase does not time another rank's
         * host work */
        NC(ncclAllReduce(d_bad, d_bad, 1, ncclUint8, ncclMax, r->comm, r->stream));
        CU(cudaStreamSynchronize(r->stream));

        /* the writeback: partial -> ONE uint8 MAX all-reduce -> apply, then the byte gather */
        CU(cudaEventRecord(ev[0], r->stream));
        MX(mxs_cuda_wb_partial(&batch, &plan, packed, ws, ws_bytes, r->stream));
        CU(cudaEventRecord(ev[1], r->stream));
        if (plan.packed_bytes > 0)
            NC(ncclAllReduce(packed, packed, (size_t)plan.packed_bytes, ncclUint8, ncclMax, r->comm, r->stream));
        CU(cudaEventRecord(ev[2], r->stream));
        MX(mxs_cuda_wb_apply(&batch, &plan, packed, ws, ws_bytes, r->stream));
        CU(cudaEventRecord(ev[3], r->stream));
        MX(mxs_nccl_gather_planes(dev_views, n, starts, lens, r->comm, r->stream));
        CU(cudaEventRecord(ev[4], r->stream));
        CU(cudaStreamSynchronize(r->stream));
        for (p = 0; p < 4; p++) CU(cudaEventElapsedTime(&span[p], ev[p], ev[p + 1]));
        for (p = 0; p < 4; p++) {
            ms[u][CP_PARTIAL + p] = span[p];
            if (talk)
                printf("[update %d/%d] %-8s  %-27s  %8.3f ms (GPU)\n", u + 1, DEMO_UPDATES, cp_names[CP_PARTIAL + p],
                       p == 0   ? "partial exponents + cast"
                       : p == 1 ? "ncclAllReduce uint8 MAX"
                       : p == 2 ? "scales + shard edges"
                                : "ncclBroadcast uint8 planes",
                       ms[u][CP_PARTIAL + p]);
        }

        /* verify against the host path and against the GPU BF16 copy-back */
        t0 = demo_now_ms();
        for (w = 0; w < n; w++) {
            cw *c = &st[w];
            int64_t bad;
            MX(mxs_host_quantize(&c->ref, c->bf16, MXS_BF16, o->rounding));
            bad = compare_planes(&c->dev, &c->ref, scratch);
            MXS_CHECK(r, bad == 0, "update %d, %s: writeback differs from whole-tensor quantize in %lld bytes", u + 1,
                      weights[w].name, (long long)bad);
            mismatch += bad < 0 ? 1 : bad;
            /* BF16 copy-back, TE style: all-gather the bf16 master (2 bytes per element), quantize */
            if (items[w].len > 0)
                CU(cudaMemcpyAsync(c->d_bf16 + items[w].start, c->bf16 + items[w].start,
                                   (size_t)items[w].len * sizeof(uint16_t), cudaMemcpyHostToDevice, r->stream));
            MX(mxs_nccl_gather_bytes(c->d_bf16, c->elems, 2, starts + (int64_t)w * nr, lens + (int64_t)w * nr, r->comm,
                                     r->stream));
            MX(mxs_cuda_quantize(&c->copyback, c->d_bf16, MXS_BF16, o->rounding, r->stream));
            CU(cudaStreamSynchronize(r->stream));
            bad = compare_planes(&c->copyback, &c->ref, scratch);
            MXS_CHECK(r, bad == 0, "update %d, %s: BF16 copy-back differs in %lld bytes", u + 1, weights[w].name,
                      (long long)bad);
            mismatch += bad < 0 ? 1 : bad;
        }
        ms[u][CP_VERIFY] = demo_now_ms() - t0;
        if (talk)
            printf("[update %d/%d] verify    host quantize + GPU copy-back  %8.1f ms\n", u + 1, DEMO_UPDATES,
                   ms[u][CP_VERIFY]);
    }

    /* Bookkeeping outside the writeback: the slowest rank's times and the
     * total mismatch count (f64 / int64 all-reduces of a few bytes). */
    CU(cudaMemcpy(d_ms, ms, sizeof ms, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(d_bad, &mismatch, sizeof mismatch, cudaMemcpyHostToDevice));
    NC(ncclAllReduce(d_ms, d_ms, sizeof ms / sizeof(double), ncclFloat64, ncclMax, r->comm, r->stream));
    NC(ncclAllReduce(d_bad, d_bad, 1, ncclInt64, ncclSum, r->comm, r->stream));
    CU(cudaStreamSynchronize(r->stream));
    CU(cudaMemcpy(ms, d_ms, sizeof ms, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(&mismatch, d_bad, sizeof mismatch, cudaMemcpyDeviceToHost));

    if (me == 0 && o->json) {
        printf("{\n  \"device\": \"cuda\",\n  \"ranks\": %d,\n  \"layers\": %d,\n  \"hidden\": %lld,\n"
               "  \"rounding\": \"%s\",\n  \"updates\": %d,\n  \"weights\": %d,\n  \"row_only_weights\": %lld,\n"
               "  \"primary_bytes\": %lld,\n  \"bidirectional_bytes\": %lld,\n"
               "  \"reduction_bytes_per_update\": %lld,\n  \"te_bf16_amax_bytes_per_update\": %lld,\n"
               "  \"gather_uint8_bytes_per_update\": %lld,\n  \"bf16_gather_bytes_per_update\": %lld,\n"
               "  \"phases_ms_max_over_ranks\": {",
               nr, o->layers, (long long)o->hidden, o->rounding == MXS_ROUND_CEIL ? "ceil" : "floor", DEMO_UPDATES, n,
               (long long)row_only, (long long)primary, (long long)bidir, (long long)plan.packed_bytes,
               (long long)te_bytes, (long long)gather_u8, (long long)gather_bf16);
        for (p = 0; p < CP_COUNT; p++) {
            printf("%s\"%s\": [", p ? ", " : "", cp_names[p]);
            for (u = 0; u < DEMO_UPDATES; u++) printf("%s%.4f", u ? ", " : "", ms[u][p]);
            printf("]");
        }
        printf("},\n  \"verified\": %s,\n  \"mismatching_bytes\": %lld\n}\n", mismatch ? "false" : "true",
               (long long)mismatch);
    } else if (talk) {
        printf("\n== mxshard-demo summary (GPU, %d rank%s over NCCL) ==\n", nr, nr == 1 ? "" : "s");
        printf("bucket: %d weights (%lld row-only), %s elements, padded TE scale layout, %s rounding, bf16 "
               "round-through\n",
               n, (long long)row_only, demo_fmt_int(bucket, b1, sizeof b1),
               o->rounding == MXS_ROUND_CEIL ? "ceil" : "floor");
        printf("memory per rank: %s instead of %s bidirectional, saved %s (%.1f%%)\n",
               demo_fmt_mib(primary, b1, sizeof b1), demo_fmt_mib(bidir, b2, sizeof b2),
               demo_fmt_mib(bidir - primary, b3, sizeof b3),
               bidir ? 100.0 * (double)(bidir - primary) / (double)bidir : 0.0);
        printf("bytes on the wire per update (payload):\n");
        printf("  writeback all-reduce   uint8 MAX   1 call   %14s bytes  (TE: bf16 amax, ~%s bytes)\n",
               demo_fmt_int(plan.packed_bytes, b1, sizeof b1), demo_fmt_int(te_bytes, b2, sizeof b2));
        printf("  quantized gather       uint8 bcast          %14s bytes  (present planes only)\n",
               demo_fmt_int(gather_u8, b1, sizeof b1));
        printf("  (BF16 copy-back would gather %s bytes of bf16 instead)\n", demo_fmt_int(gather_bf16, b1, sizeof b1));
        printf("  high-precision values exchanged by the writeback: 0 bytes\n");
        demo_print_phase_ms("slowest rank", cp_names, CP_COUNT, &ms[0][0], 3);
        if (!mismatch)
            printf("\nverified: bit-exact (%d updates x %d rank%s x %d weights, data and scales: whole-tensor quantize "
                   "and bf16 copy-back on GPU)\n",
                   DEMO_UPDATES, nr, nr == 1 ? "" : "s", n);
        else
            printf("\nverified: FAILED (%lld mismatching bytes)\n", (long long)mismatch);
    }

    for (w = 0; w < n; w++) {
        free_tensor(&st[w].dev, 1);
        free_tensor(&st[w].copyback, 1);
        free_tensor(&st[w].ref, 0);
        cudaFree(st[w].d_shard);
        cudaFree(st[w].d_bf16);
        free(st[w].master);
        free(st[w].bf16);
    }
    for (p = 0; p < 5; p++) cudaEventDestroy(ev[p]);
    cudaFree(packed);
    cudaFree(ws);
    cudaFree(d_ms);
    cudaFree(d_bad);
    cudaFree(check);
    free(scratch);
    free(starts);
    free(lens);
}

int demo_cuda_run(const demo_opts *o) {
    char cap[16];
    int rc;
    if (o->ranks_set) { /* --ranks caps the number of GPUs used */
        snprintf(cap, sizeof cap, "%d", o->ranks);
        setenv("MXS_NRANKS", cap, 1);
    }
    rc = mxs_launch("mxshard-demo", rank_main, (void *)o);
    if (rc == 77) fprintf(stderr, "mxshard-demo: --device cuda needs at least 2 GPUs\n");
    return rc;
}
