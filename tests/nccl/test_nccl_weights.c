/* SPDX-License-Identifier: MIT */
/* tests/nccl/test_nccl_weights.c - what the cases of test_nccl (test_nccl.c)
 * are built from: small helpers; weights with every rank's shard under a
 * sharding scheme, new masters and the single-process reference
 * (mxs_host_quantize of the full master); the writeback and the gather
 * through libmxshard_nccl with what goes on the wire checked (wire.c); the
 * checks after apply and after the gather. */
#define _POSIX_C_SOURCE 200809L
#include "nccl_cases.h"

/* ---- small helpers -------------------------------------------------------------- */

uint64_t mix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* Master element i: per 32-element flat group a random binade in [-12, 12],
 * zeros, and (special) NaN, +-inf, huge and subnormal values. */
static float master_value(uint64_t seed, int64_t i, int special) {
    uint64_t h = mix64(seed ^ mix64((uint64_t)i));
    uint64_t g = mix64(seed * 31u + (uint64_t)(i / 32));
    int e = (int)(g % 25u) - 12;
    float u;
    if (h % 97u == 0u) return 0.0f;
    if (special) {
        switch (h % 1009u) {
        case 1: return NAN;
        case 2: return INFINITY;
        case 3: return -INFINITY;
        case 4: return 3e38f;
        case 5: return 1e-40f;
        default: break;
        }
    }
    u = (float)((h >> 11) & 0xFFFFFFu) / 16777216.0f * 2.0f - 1.0f;
    return ldexpf(u, e);
}

void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) abort();
    return p;
}

void *dev_alloc(mxs_rank *r, int64_t bytes) {
    void *p = NULL;
    CU(r, cudaMalloc(&p, (size_t)(bytes > 0 ? bytes : 1)));
    return p;
}

/* A batch's plan, workspace and packed buffer (device), as every writeback
 * test needs them. */
void wb_buffers(mxs_rank *r, const mxs_wb_batch *b, mxs_wb_plan *plan, int64_t *ws_bytes, void **ws, void **packed) {
    ST(r, mxs_wb_make_plan(b, plan, NULL), MXS_OK);
    ST(r, mxs_cuda_wb_prepare_bytes(b, ws_bytes), MXS_OK);
    *ws = dev_alloc(r, *ws_bytes);
    *packed = dev_alloc(r, plan->packed_bytes);
}

/* All device traffic of the tests is ordered on the rank's stream (the
 * legacy default stream would not order against a non-blocking one). */
uint8_t *download(mxs_rank *r, const void *dev, int64_t bytes) {
    uint8_t *h = (uint8_t *)xmalloc((size_t)bytes);
    if (bytes > 0) CU(r, cudaMemcpyAsync(h, dev, (size_t)bytes, cudaMemcpyDeviceToHost, r->stream));
    CU(r, cudaStreamSynchronize(r->stream));
    return h;
}

void upload(mxs_rank *r, void *dev, const void *host, int64_t bytes) {
    if (bytes > 0) CU(r, cudaMemcpyAsync(dev, host, (size_t)bytes, cudaMemcpyHostToDevice, r->stream));
    CU(r, cudaStreamSynchronize(r->stream));
}

void fill(mxs_rank *r, void *dev, int value, int64_t bytes) {
    if (bytes > 0) CU(r, cudaMemsetAsync(dev, value, (size_t)bytes, r->stream));
}

/* 1 when equal; logs the first difference and the count otherwise. */
int same_bytes(mxs_rank *r, const char *what, const uint8_t *got, const uint8_t *want, int64_t n) {
    int64_t i, bad = 0, first = -1;
    for (i = 0; i < n; i++) {
        if (got[i] != want[i]) {
            if (first < 0) first = i;
            bad++;
        }
    }
    if (bad)
        mxs_rank_log(r, "  %s: %lld of %lld bytes differ, first at %lld (got 0x%02x want 0x%02x)", what, (long long)bad,
                     (long long)n, (long long)first, got[first], want[first]);
    return bad == 0;
}

/* ---- weights ---------------------------------------------------------------------- */

const char *scheme_name[] = {"distopt bucket", "full replicas", "overlapping", "uneven (with empty)"};

int has_plane(const weight *w, int p) { return (w->spec.dirs & (unsigned)(p + 1)) != 0u; }
uint8_t *dev_data(const weight *w, int p) { return p ? w->dev.col_data : w->dev.row_data; }
uint8_t *dev_scale(const weight *w, int p) { return p ? w->dev.col_scale : w->dev.row_scale; }

/* Every rank's shard of every weight under `scheme`; *bucket_elems and
 * offsets[] (optional) describe the bucket of SHARD_BUCKET. */
static void make_shards(weight *w, int n, int scheme, int nranks, uint64_t seed, int64_t *bucket_elems,
                        int64_t *offsets) {
    int64_t total = 0, bucket, i;
    int q;
    for (i = 0; i < n; i++) {
        if (offsets) offsets[i] = total;
        total += w[i].elems;
    }
    bucket = mxs_round_up(total + 5, nranks); /* DistOpt pads the bucket to a multiple of nranks */
    if (bucket_elems) *bucket_elems = bucket;
    for (i = 0, total = 0; i < n; i++) {
        int64_t e = w[i].elems, cuts[MXS_LAUNCH_MAX_RANKS + 1];
        for (q = 0; q < nranks; q++) {
            int64_t s = 0, l = e;
            if (scheme == SHARD_BUCKET) {
                mxs_range rg = mxs_bucket_shard(total, e, bucket, nranks, q);
                s = rg.first;
                l = rg.count;
            } else if (scheme == SHARD_OVERLAP) {
                int64_t step = mxs_ceil_div(e, nranks + 1), a = q * step, b = (q + 2) * step;
                s = a < e ? a : e;
                l = (b < e ? b : e) - s;
            }
            w[i].starts[q] = s;
            w[i].lens[q] = l;
        }
        if (scheme == SHARD_UNEVEN) {
            int a, b;
            cuts[0] = 0;
            cuts[nranks] = e;
            for (q = 1; q < nranks; q++)
                cuts[q] = (int64_t)(mix64(seed + 977u * (uint64_t)i + (uint64_t)q) % (uint64_t)(e + 1));
            for (a = 1; a < nranks; a++) /* insertion sort of the cut points */
                for (b = a; b > 1 && cuts[b - 1] > cuts[b]; b--) {
                    int64_t t = cuts[b];
                    cuts[b] = cuts[b - 1];
                    cuts[b - 1] = t;
                }
            if (i % 3 == 1) { /* rank i % nranks owns nothing of this weight */
                q = (int)(i % nranks);
                if (q + 1 < nranks)
                    cuts[q + 1] = cuts[q];
                else
                    cuts[q] = cuts[q + 1];
            }
            for (q = 0; q < nranks; q++) {
                w[i].starts[q] = cuts[q];
                w[i].lens[q] = cuts[q + 1] - cuts[q];
            }
        }
        total += w[i].elems;
    }
}

/* Allocates n weights on this rank; data planes come from the optional
 * buckets (at offsets[i]) or from their own allocations. */
weight *weights_new(mxs_rank *r, const wspec *specs, int n, int scheme, uint64_t seed, uint8_t **row_bucket,
                    uint8_t **col_bucket, int64_t *bucket_elems) {
    weight *w = (weight *)xmalloc(sizeof(weight) * (size_t)n);
    int64_t *offsets = (int64_t *)xmalloc(sizeof(int64_t) * (size_t)n), be = 0;
    int i, p;
    memset(w, 0, sizeof(weight) * (size_t)n);
    for (i = 0; i < n; i++) {
        w[i].spec = specs[i];
        w[i].elems = specs[i].rows * specs[i].cols;
        w[i].starts = (int64_t *)xmalloc(sizeof(int64_t) * (size_t)r->nranks);
        w[i].lens = (int64_t *)xmalloc(sizeof(int64_t) * (size_t)r->nranks);
    }
    make_shards(w, n, scheme, r->nranks, seed, &be, offsets);
    if (bucket_elems) *bucket_elems = be;
    if (row_bucket) *row_bucket = (uint8_t *)dev_alloc(r, be);
    if (col_bucket) *col_bucket = (uint8_t *)dev_alloc(r, be);
    for (i = 0; i < n; i++) {
        weight *x = &w[i];
        x->start = x->starts[r->rank];
        x->len = x->lens[r->rank];
        x->full = (float *)xmalloc(sizeof(float) * (size_t)x->elems);
        x->shard_dev = (float *)dev_alloc(r, 4 * x->len);
        x->dev.rows = x->spec.rows;
        x->dev.cols = x->spec.cols;
        x->dev.dirs = x->spec.dirs;
        x->dev.scale_layout = x->spec.layout;
        for (p = 0; p < 2; p++) {
            uint8_t *data, *scale;
            if (!has_plane(x, p)) continue;
            x->scale_bytes[p] = mxs_scale_bytes(&x->dev, (mxs_dirs)(p + 1));
            uint8_t *bucket = p ? (col_bucket ? *col_bucket : NULL) : (row_bucket ? *row_bucket : NULL);
            data = bucket ? bucket + offsets[i] : (uint8_t *)dev_alloc(r, x->elems);
            scale = (uint8_t *)dev_alloc(r, x->scale_bytes[p]);
            if (p) {
                x->dev.col_data = data;
                x->dev.col_scale = scale;
            } else {
                x->dev.row_data = data;
                x->dev.row_scale = scale;
            }
            x->ref_data[p] = (uint8_t *)xmalloc((size_t)x->elems);
            x->ref_scale[p] = (uint8_t *)xmalloc((size_t)x->scale_bytes[p]);
        }
        x->saved = x->dev;
    }
    free(offsets);
    return w;
}

void weights_free(weight *w, int n, int own_data) {
    int i, p;
    for (i = 0; i < n; i++) {
        for (p = 0; p < 2; p++) {
            if (!has_plane(&w[i], p)) continue;
            if (own_data) cudaFree(dev_data(&w[i], p));
            cudaFree(dev_scale(&w[i], p));
            free(w[i].ref_data[p]);
            free(w[i].ref_scale[p]);
        }
        cudaFree(w[i].shard_dev);
        free(w[i].full);
        free(w[i].starts);
        free(w[i].lens);
    }
    free(w);
}

/* New masters (update `u`), this rank's shard uploaded, and the reference:
 * mxs_host_quantize of the full master (rounded through `rt` first). */
void weights_update(mxs_rank *r, weight *w, int n, uint64_t seed, mxs_dtype rt, mxs_rounding rnd) {
    int i, j;
    for (i = 0; i < n; i++) {
        weight *x = &w[i];
        float *src = (float *)xmalloc(sizeof(float) * (size_t)x->elems);
        mxs_tensor ref = x->dev;
        int64_t k;
        for (k = 0; k < x->elems; k++) {
            x->full[k] = master_value(seed + 7919u * (uint64_t)i, k, x->spec.special);
            src[k] = mxs_round_through(x->full[k], rt);
        }
        if (x->len > 0) upload(r, x->shard_dev, x->full + x->start, 4 * x->len);
        ref.row_data = x->ref_data[0];
        ref.row_scale = x->ref_scale[0];
        ref.col_data = x->ref_data[1];
        ref.col_scale = x->ref_scale[1];
        ST(r, mxs_host_quantize(&ref, src, MXS_F32, rnd), MXS_OK);
        free(src);
        for (j = 0; j < 2; j++) { /* garbage everywhere, so that unwritten bytes show */
            if (!has_plane(x, j)) continue;
            fill(r, dev_data(x, j), 0xCD, x->elems);
            fill(r, dev_scale(x, j), 0xCD, x->scale_bytes[j]);
        }
    }
}

/* Steps 1-4 through mxs_nccl_wb_writeback; checks the wire: exactly one
 * all-reduce, MAX over uint8 of plan.packed_bytes, nothing else. */
void writeback(mxs_rank *r, weight *w, int n, mxs_rounding rnd, mxs_dtype rt, mxs_wb_mode mode) {
    mxs_wb_item *items = (mxs_wb_item *)xmalloc(sizeof(mxs_wb_item) * (size_t)n);
    mxs_wb_batch b;
    mxs_wb_plan plan;
    int64_t ws_bytes = 0;
    void *ws, *packed;
    mxs_status st;
    int i;
    memset(items, 0, sizeof(mxs_wb_item) * (size_t)n);
    for (i = 0; i < n; i++) {
        items[i].primary = w[i].dev;
        items[i].master = w[i].shard_dev;
        items[i].master_dtype = MXS_F32;
        items[i].start = w[i].start;
        items[i].len = w[i].len;
    }
    memset(&b, 0, sizeof b);
    b.items = items;
    b.n_items = n;
    b.rounding = rnd;
    b.round_through = rt;
    b.mode = mode;
    wb_buffers(r, &b, &plan, &ws_bytes, &ws, &packed);
    wire_reset();
    st = mxs_nccl_wb_writeback(&b, &plan, (uint8_t *)packed, ws, ws_bytes, r->comm, r->stream);
    wire_stop();
    MXS_CHECK(r, st == MXS_OK, "mxs_nccl_wb_writeback: %s", mxs_status_str(st));
    CU(r, cudaStreamSynchronize(r->stream));
    MXS_CHECK(r, g_wire.all_reduce == 1 && g_wire.broadcast == 0 && g_wire.all_gather == 0,
              "writeback issued %d all-reduces, %d broadcasts, %d all-gathers (want exactly 1 all-reduce)",
              g_wire.all_reduce, g_wire.broadcast, g_wire.all_gather);
    MXS_CHECK(r, g_wire.non_u8 == 0 && g_wire.reduce_not_max == 0,
              "writeback communicated a non-uint8 type (%d) or a non-MAX reduction (%d)", g_wire.non_u8,
              g_wire.reduce_not_max);
    MXS_CHECK(r, g_wire.reduce_elems == plan.packed_bytes, "all-reduce of %lld bytes, plan says %lld",
              g_wire.reduce_elems, (long long)plan.packed_bytes);
    for (i = 0; i < n; i++)
        MXS_CHECK(r,
                  memcmp(&items[i].primary, &w[i].saved, sizeof(mxs_tensor)) == 0 &&
                      memcmp(&w[i].dev, &w[i].saved, sizeof(mxs_tensor)) == 0,
                  "weight %d: descriptor or storage pointers changed", i);
    cudaFree(ws);
    cudaFree(packed);
    free(items);
}

/* After apply, before the gather: complete scales; the rank's slice of each
 * present data plane is final; every byte outside it is untouched (0xCD). */
void check_local(mxs_rank *r, weight *w, int n) {
    int i, p;
    for (i = 0; i < n; i++) {
        weight *x = &w[i];
        for (p = 0; p < 2; p++) {
            uint8_t *data, *scale;
            int64_t k, outside_bad = 0;
            char what[96];
            if (!has_plane(x, p)) continue;
            data = download(r, dev_data(x, p), x->elems);
            scale = download(r, dev_scale(x, p), x->scale_bytes[p]);
            snprintf(what, sizeof what, "weight %d %s scales after apply", i, p ? "col" : "row");
            MXS_CHECK(r, same_bytes(r, what, scale, x->ref_scale[p], x->scale_bytes[p]), "%s", what);
            snprintf(what, sizeof what, "weight %d %s data, own shard [%lld,+%lld)", i, p ? "col" : "row",
                     (long long)x->start, (long long)x->len);
            MXS_CHECK(r, same_bytes(r, what, data + x->start, x->ref_data[p] + x->start, x->len), "%s", what);
            for (k = 0; k < x->elems; k++)
                if ((k < x->start || k >= x->start + x->len) && data[k] != 0xCD) outside_bad++;
            MXS_CHECK(r, outside_bad == 0, "weight %d %s plane: %lld bytes outside the shard were written", i,
                      p ? "col" : "row", (long long)outside_bad);
            free(data);
            free(scale);
        }
        MXS_CHECK(r,
                  (has_plane(x, 0) || (!x->dev.row_data && !x->dev.row_scale)) &&
                      (has_plane(x, 1) || (!x->dev.col_data && !x->dev.col_scale)),
                  "weight %d: an absent plane appeared", i);
    }
}

/* After the gather: every present plane equals the single-process reference. */
void check_full(mxs_rank *r, weight *w, int n, const char *label) {
    int i, p;
    for (i = 0; i < n; i++) {
        weight *x = &w[i];
        for (p = 0; p < 2; p++) {
            uint8_t *data, *scale;
            char what[128];
            if (!has_plane(x, p)) continue;
            data = download(r, dev_data(x, p), x->elems);
            scale = download(r, dev_scale(x, p), x->scale_bytes[p]);
            snprintf(what, sizeof what, "%s: weight %d (%lldx%lld) %s data", label, i, (long long)x->spec.rows,
                     (long long)x->spec.cols, p ? "col" : "row");
            MXS_CHECK(r, same_bytes(r, what, data, x->ref_data[p], x->elems), "%s", what);
            snprintf(what, sizeof what, "%s: weight %d %s scales", label, i, p ? "col" : "row");
            MXS_CHECK(r, same_bytes(r, what, scale, x->ref_scale[p], x->scale_bytes[p]), "%s", what);
            free(data);
            free(scale);
        }
        MXS_CHECK(r, memcmp(&x->dev, &x->saved, sizeof(mxs_tensor)) == 0, "weight %d: storage pointers changed", i);
    }
}

/* Gather through mxs_nccl_gather_planes; checks the wire: uint8 broadcasts
 * only, every byte of every present plane sent exactly once. */
void gather_planes(mxs_rank *r, weight *w, int n) {
    int64_t *starts = (int64_t *)xmalloc(sizeof(int64_t) * (size_t)(n * r->nranks));
    int64_t *lens = (int64_t *)xmalloc(sizeof(int64_t) * (size_t)(n * r->nranks));
    mxs_tensor *ts = (mxs_tensor *)xmalloc(sizeof(mxs_tensor) * (size_t)n);
    long long want_bytes = 0;
    mxs_status st;
    int i, q;
    for (i = 0; i < n; i++) {
        ts[i] = w[i].dev;
        for (q = 0; q < r->nranks; q++) {
            starts[i * r->nranks + q] = w[i].starts[q];
            lens[i * r->nranks + q] = w[i].lens[q];
        }
        want_bytes += (long long)w[i].elems * (has_plane(&w[i], 0) + has_plane(&w[i], 1));
    }
    wire_reset();
    st = mxs_nccl_gather_planes(ts, n, starts, lens, r->comm, r->stream);
    wire_stop();
    MXS_CHECK(r, st == MXS_OK, "mxs_nccl_gather_planes: %s", mxs_status_str(st));
    CU(r, cudaStreamSynchronize(r->stream));
    MXS_CHECK(r, g_wire.all_reduce == 0 && g_wire.all_gather == 0 && g_wire.non_u8 == 0,
              "gather: %d all-reduces, %d all-gathers, %d non-uint8 collectives", g_wire.all_reduce, g_wire.all_gather,
              g_wire.non_u8);
    MXS_CHECK(r, g_wire.bcast_bytes == want_bytes, "gather broadcast %lld bytes, the present planes hold %lld",
              g_wire.bcast_bytes, want_bytes);
    free(starts);
    free(lens);
    free(ts);
}

/* ---- the tests ---------------------------------------------------------------------- */

long test_begin(mxs_rank *r, const char *name) {
    mxs_rank_log(r, "test %s", name);
    return r->failed;
}
void test_end(mxs_rank *r, const char *name, long failed_before) {
    mxs_rank_log(r, "  %s %s", r->failed == failed_before ? "ok    " : "FAILED", name);
}

void mixed_specs(wspec *s, int n) {
    int i;
    for (i = 0; i < n; i++) {
        s[i] = dirs_shapes[i % N_DIRS_SHAPES];
        s[i].dirs = (unsigned)(i % 3 + 1);
        s[i].special = i % 4 == 0;
    }
}
