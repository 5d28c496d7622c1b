/* SPDX-License-Identifier: MIT */
/* Suite cuda, writeback paths groups 3 and 5 (test_wb_paths.cu): buckets of
 * 1..300 odd-shaped items sharded like a distributed optimizer over DP = 1,
 * 2, 3, 8, and several updates on the same buffers. */
#include "wb_paths_cases.h"

/* ---- 3. buckets of 1..300 items, sharded like a distributed optimizer ---- */

static void bucket_shape(int64_t i, int64_t *rows, int64_t *cols) {
    static const int64_t rp[] = {1, 2, 7, 31, 32, 33, 40, 41, 64, 96, 127, 128, 129, 200, 256, 257, 300};
    static const int64_t cp[] = {1, 8, 32, 40, 64, 96, 100, 128, 136, 256, 264, 300, 384};
    if (i % 37 == 5) { /* wide rows */
        static const int64_t wr[] = {41, 40, 33, 1, 7};
        static const int64_t wc[] = {8192, 4096, 8200};
        *rows = wr[rnd() % 5];
        *cols = wc[rnd() % 3];
        return;
    }
    *rows = rnd() % 2 ? rp[rnd() % 17] : rnd_in(1, 300);
    *cols = rnd() % 2 ? cp[rnd() % 13] : rnd_in(1, 300);
}

struct BucketCfg {
    int items, dp;
    mxs_wb_mode mode;
    int layout; /* -1: mixed per item */
    int dirs;   /* 0: mixed per item */
    int dtype;  /* -1: mixed per item */
    mxs_dtype rt;
    mxs_rounding rounding;
    bool oneshot;
    int64_t rows = 0, cols = 0; /* every item's shape; 0: random (bucket_shape) */
};

static void run_bucket(const BucketCfg &b, int max_items) {
    Case C;
    C.nranks = b.dp;
    C.mode = b.mode;
    C.rt = b.rt;
    C.rounding = b.rounding;
    C.oneshot = b.oneshot;
    const int nitems = std::min(b.items, max_items);
    snprintf(C.name, sizeof C.name, "bucket %d items DP=%d %s layout %s dirs %d dtype %s rt %s round %d%s", nitems,
             b.dp, b.mode == MXS_WB_FUSED ? "FUSED" : "STRICT", b.layout < 0 ? "mixed" : layout_names[b.layout], b.dirs,
             b.dtype < 0 ? "mixed" : dtype_name(b.dtype), dtype_name(b.rt), (int)b.rounding,
             b.oneshot ? " one-shot" : "");
    std::vector<int64_t> off;
    int64_t total = 0;
    for (int i = 0; i < nitems; i++) {
        Weight w;
        bucket_shape(i, &w.rows, &w.cols);
        if (b.rows > 0) w.rows = b.rows, w.cols = b.cols;
        w.dirs = b.dirs ? (unsigned)b.dirs : (unsigned)rnd_in(1, 3);
        w.layout = (mxs_scale_layout)(b.layout >= 0 ? b.layout : (int)(rnd() % 3));
        w.dtype = (mxs_dtype)(b.dtype >= 0 ? b.dtype : (int)(rnd() % 3));
        weight_values(w);
        off.push_back(total);
        total += w.n();
        C.W.push_back(std::move(w));
    }
    const int64_t bucket_elems = mxs_round_up(total, b.dp) + b.dp * rnd_in(0, 2); /* padded */
    C.S.assign((size_t)b.dp, std::vector<Shard>((size_t)nitems));
    for (int i = 0; i < nitems; i++) {
        const Weight &w = C.W[(size_t)i];
        for (int q = 0; q < b.dp; q++) {
            const mxs_range r = mxs_bucket_shard(off[(size_t)i], w.n(), bucket_elems, b.dp, q);
            Shard s = shard_of(r.first, r.first + r.count);
            if (s.len == 0 && rnd() % 2) s.start = rnd_in(0, w.n()); /* an empty shard anywhere */
            C.S[(size_t)q][(size_t)i] = s;
        }
        /* a replica: a rank that owns nothing of the item takes an owner's range */
        if (b.dp >= 2 && rnd() % 4 == 0) {
            int empty = -1, owner = -1;
            for (int q = 0; q < b.dp; q++) {
                if (C.S[(size_t)q][(size_t)i].len == 0 && (empty < 0 || rnd() % 2)) empty = q;
                if (C.S[(size_t)q][(size_t)i].len > 0 && (owner < 0 || rnd() % 2)) owner = q;
            }
            if (empty >= 0 && owner >= 0) C.S[(size_t)empty][(size_t)i] = C.S[(size_t)owner][(size_t)i];
        }
        for (int q = 0; q < b.dp; q++) rnd_options(C.S[(size_t)q][(size_t)i], w, 10);
    }
    run_case(C);
}

void group_buckets(void) {
    g_rng = 0xB0C4E7B0C4E7B0C4ull;
    static const BucketCfg cfgs[] = {
        {1, 1, MXS_WB_FUSED, 0, 3, MXS_F32, MXS_BF16, MXS_ROUND_CEIL, false},
        {1, 8, MXS_WB_STRICT, 2, 0, MXS_BF16, MXS_F32, MXS_ROUND_FLOOR, false},
        {2, 3, MXS_WB_FUSED, -1, 0, -1, MXS_BF16, MXS_ROUND_CEIL, true},
        {7, 2, MXS_WB_FUSED, 1, 1, MXS_F32, MXS_BF16, MXS_ROUND_FLOOR, false},
        {17, 8, MXS_WB_STRICT, -1, 0, -1, MXS_F16, MXS_ROUND_CEIL, true},
        {40, 3, MXS_WB_FUSED, 2, 0, MXS_F32, MXS_BF16, MXS_ROUND_CEIL, false},
        {64, 8, MXS_WB_FUSED, -1, 1, MXS_BF16, MXS_BF16, MXS_ROUND_FLOOR, false},
        {130, 1, MXS_WB_STRICT, 0, 0, MXS_F32, MXS_F32, MXS_ROUND_CEIL, false},
        {200, 2, MXS_WB_FUSED, 1, 0, MXS_F32, MXS_BF16, MXS_ROUND_CEIL, false},
        {250, 2, MXS_WB_FUSED, 0, 2, MXS_F16, MXS_F32, MXS_ROUND_FLOOR, true},
        {300, 3, MXS_WB_FUSED, -1, 0, -1, MXS_BF16, MXS_ROUND_FLOOR, false},
        {300, 8, MXS_WB_STRICT, 2, 0, MXS_F32, MXS_BF16, MXS_ROUND_CEIL, false},
        {300, 8, MXS_WB_FUSED, -1, 0, MXS_F32, MXS_BF16, MXS_ROUND_CEIL, false},
        /* fixed shapes, so that both interior kernels of a bucket with
         * column-wise planes run (mxs_cuda_wb_bucket.wide_cols): 41-row
         * weights have a 9-row last group in wide units, 64-row ones none */
        {12, 2, MXS_WB_FUSED, 0, 3, MXS_F32, MXS_BF16, MXS_ROUND_CEIL, false, 41, 256},
        {12, 2, MXS_WB_FUSED, 1, 3, MXS_F32, MXS_BF16, MXS_ROUND_CEIL, false, 64, 256},
        {12, 3, MXS_WB_FUSED, 2, 0, MXS_F32, MXS_BF16, MXS_ROUND_FLOOR, false, 64, 384},
    };
    /* under the sanitizers: every other bucket, at most 60 items but for one of 300 */
    int k = 0;
    for (const BucketCfg &b : cfgs) {
        if (!g_san)
            run_bucket(b, b.items);
        else if (k % 2 == 0 && k < 12)
            run_bucket(b, k == 10 ? b.items : 60);
        k++;
    }
}

/* ---- 5. several updates on the same buffers ------------------------------ */

/* One bucket (and one one-shot batch) serves four updates: new random
 * values, then zeros / constants / random by item, then random again. */
void group_updates(void) {
    g_rng = 0x0DDBA11C0FFEE000ull;
    for (int k = 0; k < 2; k++) {
        Case C;
        C.nranks = k == 0 ? 3 : 2;
        C.mode = k == 0 ? MXS_WB_FUSED : MXS_WB_STRICT;
        C.rounding = (mxs_rounding)k;
        C.rt = k == 0 ? MXS_BF16 : MXS_F32;
        C.oneshot = k == 1;
        C.updates = 4;
        C.update_kind[2] = 1;
        snprintf(C.name, sizeof C.name, "updates: %d ranks %s%s", C.nranks, k == 0 ? "FUSED" : "STRICT",
                 C.oneshot ? " one-shot" : " bucket");
        const int nitems = k == 0 ? 24 : 12;
        std::vector<int64_t> off;
        int64_t total = 0;
        for (int i = 0; i < nitems; i++) {
            Weight w;
            bucket_shape(i, &w.rows, &w.cols);
            w.dirs = (unsigned)rnd_in(1, 3);
            w.layout = (mxs_scale_layout)(rnd() % 3);
            w.dtype = (mxs_dtype)(rnd() % 3);
            weight_values(w);
            off.push_back(total);
            total += w.n();
            C.W.push_back(std::move(w));
        }
        C.S.assign((size_t)C.nranks, std::vector<Shard>((size_t)nitems));
        for (int i = 0; i < nitems; i++)
            for (int q = 0; q < C.nranks; q++) {
                const mxs_range r = mxs_bucket_shard(off[(size_t)i], C.W[(size_t)i].n(),
                                                     total + 13 * C.nranks - total % C.nranks, C.nranks, q);
                C.S[(size_t)q][(size_t)i] = shard_of(r.first, r.first + r.count);
                rnd_options(C.S[(size_t)q][(size_t)i], C.W[(size_t)i], 6);
            }
        run_case(C);
    }
}
