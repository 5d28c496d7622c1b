/* SPDX-License-Identifier: MIT */
/* tests/nccl/test_nccl_gather.c - group gather of test_nccl: the gather
 * alone on byte patterns (planes, bucket, bytes), the bucket fast path, and
 * 150 weights whose broadcasts span several NCCL groups. */
#define _POSIX_C_SOURCE 200809L
#include "nccl_cases.h"

/* Fast path: bidirectional weights whose row and column data planes each
 * live in one bucket laid out like the master bucket; one uint8 all-gather
 * per bucket. */
void test_gather_bucket_fast_path(mxs_rank *r) {
    const char *name = "gather_distopt_bucket_fast_path";
    long before = test_begin(r, name);
    wspec s[N_DIRS_SHAPES];
    uint8_t *row_bucket = NULL, *col_bucket = NULL;
    int64_t bucket_elems = 0;
    weight *w;
    int i, u;
    for (i = 0; i < N_DIRS_SHAPES; i++) {
        s[i] = dirs_shapes[i];
        s[i].dirs = MXS_BOTH;
    }
    w = weights_new(r, s, N_DIRS_SHAPES, SHARD_BUCKET, 99u, &row_bucket, &col_bucket, &bucket_elems);
    for (u = 0; u < 2; u++) {
        mxs_status st1, st2;
        weights_update(r, w, N_DIRS_SHAPES, 555u + (uint64_t)u, MXS_F32, MXS_ROUND_CEIL);
        writeback(r, w, N_DIRS_SHAPES, MXS_ROUND_CEIL, MXS_F32, MXS_WB_FUSED);
        check_local(r, w, N_DIRS_SHAPES);
        wire_reset();
        st1 = mxs_nccl_gather_bucket(row_bucket, bucket_elems, r->comm, r->stream);
        st2 = mxs_nccl_gather_bucket(col_bucket, bucket_elems, r->comm, r->stream);
        wire_stop();
        MXS_CHECK(r, st1 == MXS_OK && st2 == MXS_OK, "mxs_nccl_gather_bucket: %s / %s", mxs_status_str(st1),
                  mxs_status_str(st2));
        CU(r, cudaStreamSynchronize(r->stream));
        MXS_CHECK(r, g_wire.all_gather == 2 && g_wire.broadcast == 0 && g_wire.all_reduce == 0 && g_wire.non_u8 == 0,
                  "bucket gather: %d all-gathers, %d broadcasts, %d all-reduces, %d non-uint8", g_wire.all_gather,
                  g_wire.broadcast, g_wire.all_reduce, g_wire.non_u8);
        MXS_CHECK(r, g_wire.gather_elems == 2 * bucket_elems / r->nranks, "all-gather of %lld bytes per rank",
                  g_wire.gather_elems);
        check_full(r, w, N_DIRS_SHAPES, u ? "update 2" : "update 1");
    }
    weights_free(w, N_DIRS_SHAPES, 0);
    cudaFree(row_bucket);
    cudaFree(col_bucket);
    test_end(r, name, before);
}

/* 150 small weights in one batch: one all-reduce for all of them, and a
 * gather that spans several ncclGroupStart/End batches. */
void test_gather_many_weights(mxs_rank *r) {
    const char *name = "gather_many_weights_grouped_broadcasts";
    enum { N = 150 };
    long before = test_begin(r, name);
    wspec s[N];
    weight *w;
    int i;
    for (i = 0; i < N; i++) {
        uint64_t h = mix64(4242u + (uint64_t)i);
        s[i].rows = 1 + (int64_t)(h % 70u);
        s[i].cols = 1 + (int64_t)((h >> 8) % 70u);
        s[i].dirs = (unsigned)((h >> 16) % 3u + 1u);
        s[i].layout = (mxs_scale_layout)((h >> 24) % 3u);
        s[i].special = 0;
    }
    w = weights_new(r, s, N, SHARD_OVERLAP, 7u, NULL, NULL, NULL);
    weights_update(r, w, N, 31337u, MXS_F32, MXS_ROUND_CEIL);
    writeback(r, w, N, MXS_ROUND_CEIL, MXS_F32, MXS_WB_FUSED);
    check_local(r, w, N);
    gather_planes(r, w, N);
    MXS_CHECK(r, g_wire.broadcast > MXS_NCCL_GROUP_OPS, "only %d broadcasts: the group batching was not exercised",
              g_wire.broadcast);
    check_full(r, w, N, "many weights");
    weights_free(w, N, 1);
    test_end(r, name, before);
}

/* The gather alone (no mxshard kernel runs): each rank writes only its own
 * slice of each present plane with a known byte pattern; after
 * mxs_nccl_gather_planes / _bucket / _bytes every rank holds the whole
 * pattern, and each byte went over the wire exactly once. */
static uint8_t pattern_byte(uint64_t tag, int64_t k) { return (uint8_t)(mix64(tag * 1000003u + (uint64_t)k) >> 24); }

void test_gather_pattern_without_kernels(mxs_rank *r) {
    const char *name = "gather_pattern_only_owned_slices_sent_once";
    long before = test_begin(r, name);
    enum { N = 140 };
    wspec s[N];
    int scheme, i, p;
    for (i = 0; i < N; i++) {
        uint64_t h = mix64(777u + (uint64_t)i);
        s[i] = dirs_shapes[i % N_DIRS_SHAPES];
        if (i >= N_DIRS_SHAPES) { /* small random weights beyond the fixed shapes */
            s[i].rows = 1 + (int64_t)(h % 50u);
            s[i].cols = 1 + (int64_t)((h >> 8) % 90u);
        }
        s[i].dirs = (unsigned)(i % 3 + 1);
    }
    for (scheme = 0; scheme < 4; scheme++) {
        weight *w = weights_new(r, s, N, scheme, 4000u + (uint64_t)scheme, NULL, NULL, NULL);
        long long want_bytes = 0;
        int64_t *starts = (int64_t *)xmalloc(sizeof(int64_t) * (size_t)(N * r->nranks));
        int64_t *lens = (int64_t *)xmalloc(sizeof(int64_t) * (size_t)(N * r->nranks));
        mxs_tensor ts[N];
        mxs_status st;
        for (i = 0; i < N; i++) {
            weight *x = &w[i];
            int q;
            ts[i] = x->dev;
            for (q = 0; q < r->nranks; q++) {
                starts[i * r->nranks + q] = x->starts[q];
                lens[i * r->nranks + q] = x->lens[q];
            }
            for (p = 0; p < 2; p++) {
                uint8_t *mine;
                int64_t k;
                if (!has_plane(x, p)) continue;
                want_bytes += x->elems;
                mine = (uint8_t *)xmalloc((size_t)x->elems);
                for (k = 0; k < x->elems; k++) mine[k] = pattern_byte((uint64_t)(i * 2 + p), k);
                fill(r, dev_data(x, p), 0xCD, x->elems);
                upload(r, dev_data(x, p) + x->start, mine + x->start, x->len);
                free(mine);
            }
        }
        wire_reset();
        st = mxs_nccl_gather_planes(ts, N, starts, lens, r->comm, r->stream);
        wire_stop();
        MXS_CHECK(r, st == MXS_OK, "%s: mxs_nccl_gather_planes: %s", scheme_name[scheme], mxs_status_str(st));
        CU(r, cudaStreamSynchronize(r->stream));
        MXS_CHECK(r, g_wire.bcast_bytes == want_bytes && g_wire.non_u8 == 0 && g_wire.all_reduce == 0,
                  "%s: broadcast %lld bytes (want %lld), %d non-uint8", scheme_name[scheme], g_wire.bcast_bytes,
                  want_bytes, g_wire.non_u8);
        if (scheme == SHARD_UNEVEN)
            MXS_CHECK(r, g_wire.broadcast > MXS_NCCL_GROUP_OPS, "only %d broadcasts: group batching not exercised",
                      g_wire.broadcast);
        for (i = 0; i < N; i++) {
            weight *x = &w[i];
            for (p = 0; p < 2; p++) {
                uint8_t *got, *want;
                int64_t k;
                char what[128];
                if (!has_plane(x, p)) continue;
                got = download(r, dev_data(x, p), x->elems);
                want = (uint8_t *)xmalloc((size_t)x->elems);
                for (k = 0; k < x->elems; k++) want[k] = pattern_byte((uint64_t)(i * 2 + p), k);
                snprintf(what, sizeof what, "%s: weight %d %s plane after gather", scheme_name[scheme], i,
                         p ? "col" : "row");
                MXS_CHECK(r, same_bytes(r, what, got, want, x->elems), "%s", what);
                free(got);
                free(want);
            }
        }
        free(starts);
        free(lens);
        weights_free(w, N, 1);
    }
    { /* mxs_nccl_gather_bucket: rank q writes chunk q */
        int64_t chunk = 4099, bytes = chunk * r->nranks, k;
        uint8_t *bucket = (uint8_t *)dev_alloc(r, bytes), *mine = (uint8_t *)xmalloc((size_t)bytes), *got;
        mxs_status st;
        for (k = 0; k < bytes; k++) mine[k] = pattern_byte(99u, k);
        fill(r, bucket, 0xCD, bytes);
        upload(r, bucket + r->rank * chunk, mine + r->rank * chunk, chunk);
        wire_reset();
        st = mxs_nccl_gather_bucket(bucket, bytes, r->comm, r->stream);
        wire_stop();
        MXS_CHECK(r, st == MXS_OK, "mxs_nccl_gather_bucket: %s", mxs_status_str(st));
        MXS_CHECK(r, g_wire.all_gather == 1 && g_wire.gather_elems == chunk && g_wire.non_u8 == 0,
                  "bucket: %d all-gathers of %lld", g_wire.all_gather, g_wire.gather_elems);
        got = download(r, bucket, bytes);
        MXS_CHECK(r, same_bytes(r, "bucket after all-gather", got, mine, bytes), "bucket after all-gather");
        free(got);
        free(mine);
        cudaFree(bucket);
    }
    { /* mxs_nccl_gather_bytes, 2-byte elements (a bf16 weight), uneven shards with an empty one */
        int64_t elems = 10007, st_[MXS_LAUNCH_MAX_RANKS], ln[MXS_LAUNCH_MAX_RANKS], k, a = 0;
        uint16_t *mine = (uint16_t *)xmalloc(sizeof(uint16_t) * (size_t)elems), *got;
        void *buf = dev_alloc(r, 2 * elems);
        mxs_status st;
        int q;
        for (q = 0; q < r->nranks; q++) {
            int64_t l = q == 0 ? 0 : (q == r->nranks - 1 ? elems - a : elems / r->nranks + 13);
            st_[q] = a;
            ln[q] = l;
            a += l;
        }
        for (k = 0; k < elems; k++) mine[k] = (uint16_t)(pattern_byte(7u, k) | (pattern_byte(8u, k) << 8));
        fill(r, buf, 0xCD, 2 * elems);
        upload(r, (uint16_t *)buf + st_[r->rank], mine + st_[r->rank], 2 * ln[r->rank]);
        wire_reset();
        st = mxs_nccl_gather_bytes(buf, elems, 2, st_, ln, r->comm, r->stream);
        wire_stop();
        MXS_CHECK(r, st == MXS_OK, "mxs_nccl_gather_bytes: %s", mxs_status_str(st));
        MXS_CHECK(r, g_wire.bcast_bytes == 2 * elems && g_wire.non_u8 == 0, "bytes: %lld broadcast",
                  g_wire.bcast_bytes);
        got = (uint16_t *)download(r, buf, 2 * elems);
        MXS_CHECK(r, same_bytes(r, "2-byte gather", (const uint8_t *)got, (const uint8_t *)mine, 2 * elems),
                  "2-byte gather");
        free(got);
        free(mine);
        cudaFree(buf);
    }
    test_end(r, name, before);
}
