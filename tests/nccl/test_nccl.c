/* SPDX-License-Identifier: MIT */
/* tests/nccl/test_nccl.c - the `nccl` suite: distributed writeback, gather,
 * copy-back and swizzle across one process per GPU (launch.h), checked byte
 * for byte against single-process quantization of the full master
 * (mxs_host_quantize on a host copy). docs/contract.md sections 3-5.
 *
 *   test_nccl [group]     group: writeback | gather | copyback | plan (default: all)
 *
 * Exit 77 (skipped) with fewer than 2 GPUs. Before that, the parent checks
 * the gather's owner rule (mxs_gather_segment) on the host, without CUDA.
 * What goes on the wire is observed by interposing NCCL's collectives
 * (wire.c).
 */
#define _POSIX_C_SOURCE 200809L
#include "launch.h"

#include <math.h>

#include <mxshard/nccl.h>

#include "wire.h"

static int wire_quiet(void) { return g_wire.all_reduce + g_wire.broadcast + g_wire.all_gather == 0; }

/* ---- small helpers -------------------------------------------------------------- */

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

static uint64_t mix64(uint64_t x) {
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

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) abort();
    return p;
}

static void *dev_alloc(mxs_rank *r, int64_t bytes) {
    void *p = NULL;
    CU(r, cudaMalloc(&p, (size_t)(bytes > 0 ? bytes : 1)));
    return p;
}

/* A batch's plan, workspace and packed buffer (device), as every writeback
 * test needs them. */
static void wb_buffers(mxs_rank *r, const mxs_wb_batch *b, mxs_wb_plan *plan, int64_t *ws_bytes, void **ws,
                       void **packed) {
    ST(r, mxs_wb_make_plan(b, plan, NULL), MXS_OK);
    ST(r, mxs_cuda_wb_prepare_bytes(b, ws_bytes), MXS_OK);
    *ws = dev_alloc(r, *ws_bytes);
    *packed = dev_alloc(r, plan->packed_bytes);
}

/* All device traffic of the tests is ordered on the rank's stream (the
 * legacy default stream would not order against a non-blocking one). */
static uint8_t *download(mxs_rank *r, const void *dev, int64_t bytes) {
    uint8_t *h = (uint8_t *)xmalloc((size_t)bytes);
    if (bytes > 0) CU(r, cudaMemcpyAsync(h, dev, (size_t)bytes, cudaMemcpyDeviceToHost, r->stream));
    CU(r, cudaStreamSynchronize(r->stream));
    return h;
}

static void upload(mxs_rank *r, void *dev, const void *host, int64_t bytes) {
    if (bytes > 0) CU(r, cudaMemcpyAsync(dev, host, (size_t)bytes, cudaMemcpyHostToDevice, r->stream));
    CU(r, cudaStreamSynchronize(r->stream));
}

static void fill(mxs_rank *r, void *dev, int value, int64_t bytes) {
    if (bytes > 0) CU(r, cudaMemsetAsync(dev, value, (size_t)bytes, r->stream));
}

/* 1 when equal; logs the first difference and the count otherwise. */
static int same_bytes(mxs_rank *r, const char *what, const uint8_t *got, const uint8_t *want, int64_t n) {
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
static const char *scheme_name[] = {"distopt bucket", "full replicas", "overlapping", "uneven (with empty)"};

static int has_plane(const weight *w, int p) { return (w->spec.dirs & (unsigned)(p + 1)) != 0u; }
static uint8_t *dev_data(const weight *w, int p) { return p ? w->dev.col_data : w->dev.row_data; }
static uint8_t *dev_scale(const weight *w, int p) { return p ? w->dev.col_scale : w->dev.row_scale; }

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
static weight *weights_new(mxs_rank *r, const wspec *specs, int n, int scheme, uint64_t seed, uint8_t **row_bucket,
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

static void weights_free(weight *w, int n, int own_data) {
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
static void weights_update(mxs_rank *r, weight *w, int n, uint64_t seed, mxs_dtype rt, mxs_rounding rnd) {
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
static void writeback(mxs_rank *r, weight *w, int n, mxs_rounding rnd, mxs_dtype rt, mxs_wb_mode mode) {
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
static void check_local(mxs_rank *r, weight *w, int n) {
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
static void check_full(mxs_rank *r, weight *w, int n, const char *label) {
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
static void gather_planes(mxs_rank *r, weight *w, int n) {
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

static int count_empty_unaligned(const weight *w, int n, int nranks, int *unaligned) {
    int i, q, empty = 0;
    *unaligned = 0;
    for (i = 0; i < n; i++)
        for (q = 0; q < nranks; q++) {
            empty += w[i].lens[q] == 0;
            *unaligned += w[i].lens[q] > 0 && (w[i].starts[q] % 32 != 0 || w[i].starts[q] % w[i].spec.cols != 0);
        }
    return empty;
}

/* ---- the tests ---------------------------------------------------------------------- */

static long test_begin(mxs_rank *r, const char *name) {
    mxs_rank_log(r, "test %s", name);
    return r->failed;
}
static void test_end(mxs_rank *r, const char *name, long failed_before) {
    mxs_rank_log(r, "  %s %s", r->failed == failed_before ? "ok    " : "FAILED", name);
}

/* docs/contract.md section 4 invariant for one sharding scheme and two consecutive
 * updates with changed masters: writeback + gather == quantize(full). */
static void run_writeback_case(mxs_rank *r, const char *name, const wspec *specs, int n, int scheme, mxs_wb_mode mode,
                               mxs_rounding rnd, int want_empty) {
    long before = test_begin(r, name);
    weight *w = weights_new(r, specs, n, scheme, 1234u + (uint64_t)n, NULL, NULL, NULL);
    int u, unaligned, empty = count_empty_unaligned(w, n, r->nranks, &unaligned);
    mxs_rank_log(r, "  %d weights, %s shards: %d empty, %d unaligned (table of all ranks), mode %s", n,
                 scheme_name[scheme], empty, unaligned, mode == MXS_WB_STRICT ? "strict" : "fused");
    if (want_empty) MXS_CHECK(r, empty > 0 && unaligned > 0, "the sharding has no empty or no unaligned shard");
    for (u = 0; u < 2; u++) {
        char label[64];
        weights_update(r, w, n, 100u * (uint64_t)u + 17u * (uint64_t)scheme + (uint64_t)mode, MXS_F32, rnd);
        writeback(r, w, n, rnd, MXS_F32, mode);
        check_local(r, w, n);
        gather_planes(r, w, n);
        snprintf(label, sizeof label, "update %d", u + 1);
        check_full(r, w, n, label);
    }
    weights_free(w, n, 1);
    test_end(r, name, before);
}

static const wspec dirs_shapes[] = {
    {70, 130, 0, MXS_SCALES_COMPACT, 0}, {33, 47, 0, MXS_SCALES_PADDED, 0},    {1, 1, 0, MXS_SCALES_SWIZZLED, 0},
    {5, 3, 0, MXS_SCALES_COMPACT, 0},    {128, 64, 0, MXS_SCALES_SWIZZLED, 0}, {257, 1031, 0, MXS_SCALES_COMPACT, 1},
    {31, 33, 0, MXS_SCALES_PADDED, 0},   {1, 200, 0, MXS_SCALES_SWIZZLED, 0},  {200, 1, 0, MXS_SCALES_COMPACT, 0},
    {64, 96, 0, MXS_SCALES_PADDED, 0},
};
#define N_DIRS_SHAPES ((int)(sizeof dirs_shapes / sizeof dirs_shapes[0]))

static void test_writeback_dirs(mxs_rank *r, unsigned dirs, const char *name) {
    wspec s[N_DIRS_SHAPES];
    int i;
    for (i = 0; i < N_DIRS_SHAPES; i++) {
        s[i] = dirs_shapes[i];
        s[i].dirs = dirs;
    }
    run_writeback_case(r, name, s, N_DIRS_SHAPES, SHARD_BUCKET, MXS_WB_FUSED, MXS_ROUND_CEIL, 1);
}

static void mixed_specs(wspec *s, int n) {
    int i;
    for (i = 0; i < n; i++) {
        s[i] = dirs_shapes[i % N_DIRS_SHAPES];
        s[i].dirs = (unsigned)(i % 3 + 1);
        s[i].special = i % 4 == 0;
    }
}

static void test_bucket_writeback_updates(mxs_rank *r);
static void test_group_never_hangs(mxs_rank *r);

static void group_writeback(mxs_rank *r) {
    wspec s[N_DIRS_SHAPES];
    test_writeback_dirs(r, MXS_ROWWISE, "writeback_rowwise_only_distopt_bucket");
    test_writeback_dirs(r, MXS_COLWISE, "writeback_colwise_only_distopt_bucket");
    test_writeback_dirs(r, MXS_BOTH, "writeback_bidirectional_distopt_bucket");
    mixed_specs(s, N_DIRS_SHAPES);
    run_writeback_case(r, "writeback_mixed_uneven_empty_shards_strict", s, N_DIRS_SHAPES, SHARD_UNEVEN, MXS_WB_STRICT,
                       MXS_ROUND_CEIL, 1);
    run_writeback_case(r, "writeback_mixed_uneven_empty_shards_fused_floor", s, N_DIRS_SHAPES, SHARD_UNEVEN,
                       MXS_WB_FUSED, MXS_ROUND_FLOOR, 1);
    run_writeback_case(r, "writeback_full_replicas", s, N_DIRS_SHAPES, SHARD_REPLICA, MXS_WB_FUSED, MXS_ROUND_CEIL, 0);
    run_writeback_case(r, "writeback_overlapping_shards", s, N_DIRS_SHAPES, SHARD_OVERLAP, MXS_WB_FUSED, MXS_ROUND_CEIL,
                       0);
    test_bucket_writeback_updates(r);
    test_group_never_hangs(r);
}

/* The batch of this rank's shards of w (items[] has n entries). */
static void batch_of(weight *w, int n, mxs_wb_item *items, mxs_wb_batch *b, mxs_rounding rnd, mxs_wb_mode mode) {
    int i;
    memset(items, 0, sizeof(mxs_wb_item) * (size_t)n);
    for (i = 0; i < n; i++) {
        items[i].primary = w[i].dev;
        items[i].master = w[i].shard_dev;
        items[i].master_dtype = MXS_F32;
        items[i].start = w[i].start;
        items[i].len = w[i].len;
    }
    memset(b, 0, sizeof *b);
    b->items = items;
    b->n_items = n;
    b->rounding = rnd;
    b->mode = mode;
}

/* A bucket prepared once serves every update (new master values, same
 * pointers): mxs_nccl_wb_bucket_writeback, one uint8 MAX all-reduce each. */
static void test_bucket_writeback_updates(mxs_rank *r) {
    const char *name = "bucket_prepared_once_serves_every_update";
    long before = test_begin(r, name);
    wspec s[N_DIRS_SHAPES];
    mxs_wb_item items[N_DIRS_SHAPES];
    mxs_wb_batch b;
    mxs_wb_plan plan;
    mxs_cuda_wb_bucket bk;
    int64_t ws_bytes = 0;
    void *ws, *packed;
    weight *w;
    int u;
    mixed_specs(s, N_DIRS_SHAPES);
    w = weights_new(r, s, N_DIRS_SHAPES, SHARD_BUCKET, 4242u, NULL, NULL, NULL);
    batch_of(w, N_DIRS_SHAPES, items, &b, MXS_ROUND_CEIL, MXS_WB_FUSED);
    wb_buffers(r, &b, &plan, &ws_bytes, &ws, &packed);
    ST(r, mxs_cuda_wb_prepare(&bk, &b, &plan, (uint8_t *)packed, ws, ws_bytes, r->stream), MXS_OK);
    for (u = 0; u < 3; u++) {
        mxs_status st;
        weights_update(r, w, N_DIRS_SHAPES, 777u + (uint64_t)u, MXS_F32, MXS_ROUND_CEIL);
        wire_reset();
        st = mxs_nccl_wb_bucket_writeback(&bk, r->comm, r->stream);
        wire_stop();
        MXS_CHECK(r, st == MXS_OK, "mxs_nccl_wb_bucket_writeback: %s", mxs_status_str(st));
        CU(r, cudaStreamSynchronize(r->stream));
        MXS_CHECK(r,
                  g_wire.all_reduce == 1 && g_wire.broadcast + g_wire.all_gather == 0 && g_wire.non_u8 == 0 &&
                      g_wire.reduce_not_max == 0 && g_wire.reduce_elems == plan.packed_bytes,
                  "bucket writeback: %d all-reduces of %lld bytes (want 1 of %lld, uint8 MAX)", g_wire.all_reduce,
                  g_wire.reduce_elems, (long long)plan.packed_bytes);
        check_local(r, w, N_DIRS_SHAPES);
        gather_planes(r, w, N_DIRS_SHAPES);
        check_full(r, w, N_DIRS_SHAPES, u == 0 ? "update 1" : u == 1 ? "update 2" : "update 3");
    }
    ST(r, mxs_cuda_wb_bucket_release(&bk), MXS_OK);
    cudaFree(ws);
    cudaFree(packed);
    weights_free(w, N_DIRS_SHAPES, 1);
    test_end(r, name, before);
}

/* A rank-local failure never hangs the group: the last rank's workspace is
 * one byte short. It still joins the one all-reduce (zeros, status byte 1)
 * and returns MXS_ERR_BUFFER_SIZE; every other rank returns MXS_ERR_REMOTE
 * and skips apply (its scale planes stay untouched); afterwards the
 * communicator is in step (a correct writeback + gather works). */
static void test_group_never_hangs(mxs_rank *r) {
    const char *name = "rank_local_failure_never_hangs_the_group";
    long before = test_begin(r, name);
    wspec s[N_DIRS_SHAPES];
    mxs_wb_item items[N_DIRS_SHAPES];
    mxs_wb_batch b;
    mxs_wb_plan plan;
    int64_t ws_bytes = 0;
    void *ws, *packed;
    weight *w;
    int last = r->rank == r->nranks - 1, i, p;
    mxs_status st, want = last ? MXS_ERR_BUFFER_SIZE : MXS_ERR_REMOTE;
    mixed_specs(s, N_DIRS_SHAPES);
    w = weights_new(r, s, N_DIRS_SHAPES, SHARD_UNEVEN, 31337u, NULL, NULL, NULL);
    weights_update(r, w, N_DIRS_SHAPES, 9u, MXS_F32, MXS_ROUND_CEIL);
    batch_of(w, N_DIRS_SHAPES, items, &b, MXS_ROUND_CEIL, MXS_WB_FUSED);
    wb_buffers(r, &b, &plan, &ws_bytes, &ws, &packed);
    wire_reset();
    st = mxs_nccl_wb_writeback(&b, &plan, (uint8_t *)packed, ws, last ? ws_bytes - 1 : ws_bytes, r->comm, r->stream);
    wire_stop();
    CU(r, cudaStreamSynchronize(r->stream));
    MXS_CHECK(r, st == want, "writeback with a failing last rank -> %s (want %s)", mxs_status_str(st),
              mxs_status_str(want));
    MXS_CHECK(r, g_wire.all_reduce == 1 && g_wire.reduce_elems == plan.packed_bytes,
              "the failing group issued %d all-reduces of %lld bytes (want 1 of %lld)", g_wire.all_reduce,
              g_wire.reduce_elems, (long long)plan.packed_bytes);
    for (i = 0; i < N_DIRS_SHAPES; i++)
        for (p = 0; p < 2; p++) {
            uint8_t *got;
            int64_t k, touched = 0;
            if (!has_plane(&w[i], p)) continue;
            got = download(r, dev_scale(&w[i], p), w[i].scale_bytes[p]);
            for (k = 0; k < w[i].scale_bytes[p]; k++) touched += got[k] != 0xCD;
            MXS_CHECK(r, touched == 0, "weight %d plane %d: %lld scale bytes written although apply was skipped", i, p,
                      (long long)touched);
            free(got);
        }
    /* the communicator is still in step */
    weights_update(r, w, N_DIRS_SHAPES, 10u, MXS_F32, MXS_ROUND_CEIL);
    writeback(r, w, N_DIRS_SHAPES, MXS_ROUND_CEIL, MXS_F32, MXS_WB_FUSED);
    gather_planes(r, w, N_DIRS_SHAPES);
    check_full(r, w, N_DIRS_SHAPES, "after the failed writeback");
    cudaFree(ws);
    cudaFree(packed);
    weights_free(w, N_DIRS_SHAPES, 1);
    test_end(r, name, before);
}

/* Fast path: bidirectional weights whose row and column data planes each
 * live in one bucket laid out like the master bucket; one uint8 all-gather
 * per bucket. */
static void test_gather_bucket_fast_path(mxs_rank *r) {
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
static void test_gather_many_weights(mxs_rank *r) {
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

static void test_gather_pattern_without_kernels(mxs_rank *r) {
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

static void group_gather(mxs_rank *r) {
    test_gather_pattern_without_kernels(r);
    test_gather_bucket_fast_path(r);
    test_gather_many_weights(r);
}

/* docs/contract.md section 5: all-gather the bf16 master, then mxs_cuda_quantize into the
 * EXISTING planes == FP8 writeback with bf16 round-through + byte gather. */
static void test_copyback_bf16(mxs_rank *r, mxs_rounding rnd, const char *name) {
    long before = test_begin(r, name);
    wspec s[N_DIRS_SHAPES];
    weight *w;
    int i, p;
    mixed_specs(s, N_DIRS_SHAPES);
    w = weights_new(r, s, N_DIRS_SHAPES, SHARD_UNEVEN, 2024u, NULL, NULL, NULL);
    weights_update(r, w, N_DIRS_SHAPES, 8080u + (uint64_t)rnd, MXS_BF16, rnd);
    writeback(r, w, N_DIRS_SHAPES, rnd, MXS_BF16, MXS_WB_FUSED);
    gather_planes(r, w, N_DIRS_SHAPES);
    check_full(r, w, N_DIRS_SHAPES, "fp8 writeback (bf16 round-through)");
    for (i = 0; i < N_DIRS_SHAPES; i++) {
        weight *x = &w[i];
        uint8_t *wb_data[2] = {NULL, NULL}, *wb_scale[2] = {NULL, NULL};
        uint16_t *bf = (uint16_t *)xmalloc(sizeof(uint16_t) * (size_t)x->elems);
        void *bf_dev = dev_alloc(r, 2 * x->elems);
        mxs_status st;
        int64_t k;
        for (p = 0; p < 2; p++) {
            if (!has_plane(x, p)) continue;
            wb_data[p] = download(r, dev_data(x, p), x->elems);
            wb_scale[p] = download(r, dev_scale(x, p), x->scale_bytes[p]);
            fill(r, dev_data(x, p), 0x5A, x->elems);
            fill(r, dev_scale(x, p), 0x5A, x->scale_bytes[p]);
        }
        /* only this rank's slice of the bf16 weight is valid before the gather */
        for (k = 0; k < x->elems; k++)
            bf[k] = (k >= x->start && k < x->start + x->len) ? mxs_bf16_from_f32(x->full[k]) : 0xFFFFu;
        upload(r, bf_dev, bf, 2 * x->elems);
        st = mxs_nccl_gather_bytes(bf_dev, x->elems, 2, x->starts, x->lens, r->comm, r->stream);
        MXS_CHECK(r, st == MXS_OK, "mxs_nccl_gather_bytes (bf16): %s", mxs_status_str(st));
        st = mxs_cuda_quantize(&x->dev, bf_dev, MXS_BF16, rnd, r->stream);
        MXS_CHECK(r, st == MXS_OK, "mxs_cuda_quantize: %s", mxs_status_str(st));
        CU(r, cudaStreamSynchronize(r->stream));
        MXS_CHECK(r, memcmp(&x->dev, &x->saved, sizeof(mxs_tensor)) == 0, "weight %d: copy-back changed the storage",
                  i);
        for (p = 0; p < 2; p++) {
            uint8_t *cb_data, *cb_scale;
            char what[128];
            if (!has_plane(x, p)) continue;
            cb_data = download(r, dev_data(x, p), x->elems);
            cb_scale = download(r, dev_scale(x, p), x->scale_bytes[p]);
            snprintf(what, sizeof what, "weight %d %s data: bf16 copy-back vs fp8 writeback", i, p ? "col" : "row");
            MXS_CHECK(r, same_bytes(r, what, cb_data, wb_data[p], x->elems), "%s", what);
            snprintf(what, sizeof what, "weight %d %s scales: bf16 copy-back vs fp8 writeback", i, p ? "col" : "row");
            MXS_CHECK(r, same_bytes(r, what, cb_scale, wb_scale[p], x->scale_bytes[p]), "%s", what);
            free(cb_data);
            free(cb_scale);
            free(wb_data[p]);
            free(wb_scale[p]);
        }
        cudaFree(bf_dev);
        free(bf);
    }
    weights_free(w, N_DIRS_SHAPES, 1);
    test_end(r, name, before);
}

/* docs/contract.md section 4 step 6: gather with COMPACT scales, then swizzle on the GPU
 * == quantizing straight into the SWIZZLED layout (GPU and host). */
static void test_swizzle_after_gather(mxs_rank *r) {
    const char *name = "swizzle_after_gather_equals_direct_swizzled_quantize";
    long before = test_begin(r, name);
    wspec s[N_DIRS_SHAPES];
    weight *w;
    int i, p;
    mixed_specs(s, N_DIRS_SHAPES);
    for (i = 0; i < N_DIRS_SHAPES; i++) s[i].layout = MXS_SCALES_COMPACT;
    w = weights_new(r, s, N_DIRS_SHAPES, SHARD_BUCKET, 5u, NULL, NULL, NULL);
    weights_update(r, w, N_DIRS_SHAPES, 6060u, MXS_F32, MXS_ROUND_CEIL);
    writeback(r, w, N_DIRS_SHAPES, MXS_ROUND_CEIL, MXS_F32, MXS_WB_FUSED);
    gather_planes(r, w, N_DIRS_SHAPES);
    check_full(r, w, N_DIRS_SHAPES, "compact");
    for (i = 0; i < N_DIRS_SHAPES; i++) {
        weight *x = &w[i];
        mxs_tensor direct = x->dev, host = x->dev;
        void *full_dev = dev_alloc(r, 4 * x->elems);
        float *src = x->full;
        mxs_status st;
        direct.scale_layout = host.scale_layout = MXS_SCALES_SWIZZLED;
        direct.row_data = direct.row_scale = direct.col_data = direct.col_scale = NULL;
        host.row_data = host.row_scale = host.col_data = host.col_scale = NULL;
        for (p = 0; p < 2; p++) {
            int64_t sb;
            if (!has_plane(x, p)) continue;
            sb = mxs_scale_bytes(&direct, (mxs_dirs)(p + 1));
            if (p) {
                direct.col_data = (uint8_t *)dev_alloc(r, x->elems);
                direct.col_scale = (uint8_t *)dev_alloc(r, sb);
                host.col_data = (uint8_t *)xmalloc((size_t)x->elems);
                host.col_scale = (uint8_t *)xmalloc((size_t)sb);
            } else {
                direct.row_data = (uint8_t *)dev_alloc(r, x->elems);
                direct.row_scale = (uint8_t *)dev_alloc(r, sb);
                host.row_data = (uint8_t *)xmalloc((size_t)x->elems);
                host.row_scale = (uint8_t *)xmalloc((size_t)sb);
            }
        }
        upload(r, full_dev, src, 4 * x->elems);
        ST(r, mxs_cuda_quantize(&direct, full_dev, MXS_F32, MXS_ROUND_CEIL, r->stream), MXS_OK);
        ST(r, mxs_host_quantize(&host, src, MXS_F32, MXS_ROUND_CEIL), MXS_OK);
        for (p = 0; p < 2; p++) {
            int64_t sb;
            uint8_t *swz_dev, *swz, *dir, *dir_data, *gathered;
            char what[128];
            if (!has_plane(x, p)) continue;
            sb = mxs_scale_bytes(&direct, (mxs_dirs)(p + 1));
            swz_dev = (uint8_t *)dev_alloc(r, sb);
            fill(r, swz_dev, 0xEE, sb);
            st = mxs_cuda_convert_scales(x->spec.rows, x->spec.cols, (mxs_dirs)(p + 1), MXS_SCALES_COMPACT,
                                         dev_scale(x, p), MXS_SCALES_SWIZZLED, swz_dev, r->stream);
            MXS_CHECK(r, st == MXS_OK, "mxs_cuda_convert_scales: %s", mxs_status_str(st));
            CU(r, cudaStreamSynchronize(r->stream));
            swz = download(r, swz_dev, sb);
            dir = download(r, p ? direct.col_scale : direct.row_scale, sb);
            dir_data = download(r, p ? direct.col_data : direct.row_data, x->elems);
            gathered = download(r, dev_data(x, p), x->elems);
            snprintf(what, sizeof what, "weight %d %s: swizzled-after-gather vs cuda direct", i, p ? "col" : "row");
            MXS_CHECK(r, same_bytes(r, what, swz, dir, sb), "%s", what);
            snprintf(what, sizeof what, "weight %d %s: swizzled-after-gather vs host direct", i, p ? "col" : "row");
            MXS_CHECK(r, same_bytes(r, what, swz, p ? host.col_scale : host.row_scale, sb), "%s", what);
            snprintf(what, sizeof what, "weight %d %s: gathered data vs cuda direct", i, p ? "col" : "row");
            MXS_CHECK(r, same_bytes(r, what, gathered, dir_data, x->elems), "%s", what);
            free(swz);
            free(dir);
            free(dir_data);
            free(gathered);
            cudaFree(swz_dev);
        }
        cudaFree(direct.row_data);
        cudaFree(direct.row_scale);
        cudaFree(direct.col_data);
        cudaFree(direct.col_scale);
        free(host.row_data);
        free(host.row_scale);
        free(host.col_data);
        free(host.col_scale);
        cudaFree(full_dev);
    }
    weights_free(w, N_DIRS_SHAPES, 1);
    test_end(r, name, before);
}

static void group_copyback(mxs_rank *r) {
    test_copyback_bf16(r, MXS_ROUND_CEIL, "copyback_bf16_equals_fp8_writeback_ceil");
    test_copyback_bf16(r, MXS_ROUND_FLOOR, "copyback_bf16_equals_fp8_writeback_floor");
    test_swizzle_after_gather(r);
}

/* mxs_nccl_wb_check_plan: OK when all ranks agree, MXS_ERR_PLAN_MISMATCH on
 * EVERY rank when one rank's batch differs (shape; rounding). */
static void test_plan_mismatch(mxs_rank *r) {
    const char *name = "plan_mismatch_detected_on_every_rank";
    long before = test_begin(r, name);
    wspec s[3] = {{64, 96, MXS_BOTH, MXS_SCALES_COMPACT, 0},
                  {33, 47, MXS_ROWWISE, MXS_SCALES_SWIZZLED, 0},
                  {5, 3, MXS_COLWISE, MXS_SCALES_PADDED, 0}};
    weight *w = weights_new(r, s, 3, SHARD_UNEVEN, 3u, NULL, NULL, NULL);
    void *scratch = dev_alloc(r, 32);
    int last = r->rank == r->nranks - 1, i, k;
    for (k = 0; k < 4; k++) {
        mxs_wb_item items[3];
        mxs_wb_batch b;
        mxs_wb_plan plan;
        mxs_status st, want = MXS_OK;
        memset(items, 0, sizeof items);
        for (i = 0; i < 3; i++) {
            items[i].primary = w[i].dev;
            items[i].master = w[i].shard_dev;
            items[i].start = w[i].start;
            items[i].len = w[i].len;
        }
        memset(&b, 0, sizeof b);
        b.items = items;
        b.n_items = 3;
        if (k == 1) { /* the last rank's weight 0 has one column fewer (a larger shape would make its
                       * planes overrun their buffers: the plan would reject that as aliasing) */
            want = MXS_ERR_PLAN_MISMATCH;
            if (last) {
                items[0].primary.cols -= 1;
                items[0].start = items[0].len = 0;
            }
        } else if (k == 2) { /* the last rank rounds differently */
            want = MXS_ERR_PLAN_MISMATCH;
            if (last) b.rounding = MXS_ROUND_FLOOR;
        } else if (k == 3) { /* the last rank's batch is shorter */
            want = MXS_ERR_PLAN_MISMATCH;
            if (last) b.n_items = 2;
        }
        ST(r, mxs_wb_make_plan(&b, &plan, NULL), MXS_OK);
        wire_reset();
        st = mxs_nccl_wb_check_plan(&plan, scratch, r->comm, r->stream);
        wire_stop();
        MXS_CHECK(r, st == want, "case %d: mxs_nccl_wb_check_plan -> %s (want %s)", k, mxs_status_str(st),
                  mxs_status_str(want));
        MXS_CHECK(r, g_wire.all_reduce == 1 && g_wire.broadcast + g_wire.all_gather == 0,
                  "case %d: plan check used %d all-reduces", k, g_wire.all_reduce);
    }
    cudaFree(scratch);
    weights_free(w, 3, 1);
    test_end(r, name, before);
}

/* Every rank passes the same bad arguments: each call returns the error,
 * no rank hangs (a writeback joins the one all-reduce when it can, a
 * gather issues nothing), and the communicator stays usable. */
static void test_rejects_before_enqueue(mxs_rank *r) {
    const char *name = "invalid_arguments_never_hang_the_group";
    long before = test_begin(r, name);
    wspec s[2] = {{70, 130, MXS_ROWWISE, MXS_SCALES_COMPACT, 0}, {33, 47, MXS_BOTH, MXS_SCALES_SWIZZLED, 0}};
    weight *w = weights_new(r, s, 2, SHARD_UNEVEN, 11u, NULL, NULL, NULL);
    mxs_wb_item items[2];
    mxs_wb_batch b, other;
    mxs_wb_plan plan, other_plan;
    int64_t ws_bytes = 0, starts[2 * MXS_LAUNCH_MAX_RANKS], lens[2 * MXS_LAUNCH_MAX_RANKS];
    void *ws, *packed;
    mxs_tensor ts[2];
    int i, q;
    memset(items, 0, sizeof items);
    for (i = 0; i < 2; i++) {
        items[i].primary = w[i].dev;
        items[i].master = w[i].shard_dev;
        items[i].start = w[i].start;
        items[i].len = w[i].len;
        ts[i] = w[i].dev;
        for (q = 0; q < r->nranks; q++) {
            starts[i * r->nranks + q] = w[i].starts[q];
            lens[i * r->nranks + q] = w[i].lens[q];
        }
    }
    memset(&b, 0, sizeof b);
    b.items = items;
    b.n_items = 2;
    other = b;
    other.n_items = 1;
    wb_buffers(r, &b, &plan, &ws_bytes, &ws, &packed);
    ST(r, mxs_wb_make_plan(&other, &other_plan, NULL), MXS_OK);
    /* Writeback: what makes joining impossible returns at once (no
     * collective); a rank-local failure joins the one all-reduce (zeros,
     * status byte 1) and returns its own error - here on every rank. */
    wire_reset();
    ST(r, mxs_nccl_wb_writeback(&b, &plan, NULL, ws, ws_bytes, r->comm, r->stream), MXS_ERR_INVALID_ARGUMENT);
    ST(r, mxs_nccl_wb_writeback(&b, &plan, (uint8_t *)packed, ws, ws_bytes, NULL, r->stream), MXS_ERR_INVALID_ARGUMENT);
    ST(r, mxs_nccl_wb_writeback(&b, NULL, (uint8_t *)packed, ws, ws_bytes, r->comm, r->stream),
       MXS_ERR_INVALID_ARGUMENT);
    ST(r, mxs_nccl_wb_bucket_writeback(NULL, r->comm, r->stream), MXS_ERR_INVALID_ARGUMENT);
    wire_stop();
    MXS_CHECK(r, wire_quiet(), "a writeback that cannot join issued %d all-reduces", g_wire.all_reduce);
    wire_reset();
    ST(r, mxs_nccl_wb_writeback(&b, &plan, (uint8_t *)packed, ws, ws_bytes - 1, r->comm, r->stream),
       MXS_ERR_BUFFER_SIZE);
    ST(r, mxs_nccl_wb_writeback(&b, &other_plan, (uint8_t *)packed, ws, ws_bytes, r->comm, r->stream),
       MXS_ERR_PLAN_MISMATCH);
    wire_stop();
    CU(r, cudaStreamSynchronize(r->stream));
    MXS_CHECK(r,
              g_wire.all_reduce == 2 && g_wire.broadcast + g_wire.all_gather == 0 && g_wire.non_u8 == 0 &&
                  g_wire.reduce_not_max == 0 && g_wire.reduce_elems == plan.packed_bytes + other_plan.packed_bytes,
              "failing writebacks issued %d all-reduces of %lld bytes (want 2 of %lld)", g_wire.all_reduce,
              g_wire.reduce_elems, (long long)(plan.packed_bytes + other_plan.packed_bytes));
    /* Gather: every argument is validated before anything is enqueued */
    wire_reset();
    ts[1].col_data = NULL;
    ST(r, mxs_nccl_gather_planes(ts, 2, starts, lens, r->comm, r->stream), MXS_ERR_ABSENT_PLANE);
    ts[1] = w[1].dev;
    lens[0] = w[0].elems + 1;
    ST(r, mxs_nccl_gather_planes(ts, 2, starts, lens, r->comm, r->stream), MXS_ERR_RANGE);
    ST(r, mxs_nccl_gather_bucket(w[0].dev.row_data, (int64_t)r->nranks * 3 + 1, r->comm, r->stream),
       MXS_ERR_INVALID_ARGUMENT);
    ST(r, mxs_nccl_gather_bytes(w[0].dev.row_data, w[0].elems, 0, w[0].starts, w[0].lens, r->comm, r->stream),
       MXS_ERR_INVALID_ARGUMENT);
    wire_stop();
    MXS_CHECK(r, wire_quiet(), "a rejected gather issued %d all-reduces, %d broadcasts, %d all-gathers",
              g_wire.all_reduce, g_wire.broadcast, g_wire.all_gather);
    /* the communicator is still in step: a real writeback + gather works */
    weights_update(r, w, 2, 4u, MXS_F32, MXS_ROUND_CEIL);
    writeback(r, w, 2, MXS_ROUND_CEIL, MXS_F32, MXS_WB_FUSED);
    gather_planes(r, w, 2);
    check_full(r, w, 2, "after rejected calls");
    cudaFree(ws);
    cudaFree(packed);
    weights_free(w, 2, 1);
    test_end(r, name, before);
}

static void group_plan(mxs_rank *r) {
    test_plan_mismatch(r);
    test_rejects_before_enqueue(r);
}

/* ---- host-only: the gather's owner rule (no CUDA) ---------------------------------- */

/* For random shard tables: the segments are disjoint, lie inside their
 * owner's shard, and cover exactly the union of the shards. */
static int host_check_segments(void) {
    int t, bad = 0;
    for (t = 0; t < 4000; t++) {
        int nranks = 1 + t % 9, q;
        int64_t elems = (int64_t)(mix64((uint64_t)t) % 97u), starts[16], lens[16], k;
        unsigned char in_shard[97], sent[97];
        memset(in_shard, 0, sizeof in_shard);
        memset(sent, 0, sizeof sent);
        for (q = 0; q < nranks; q++) {
            uint64_t h = mix64((uint64_t)t * 131u + (uint64_t)q);
            int64_t a = elems ? (int64_t)(h % (uint64_t)(elems + 1)) : 0;
            int64_t b = elems ? (int64_t)((h >> 20) % (uint64_t)(elems + 1)) : 0;
            if ((h >> 40) % 5u == 0u) b = a; /* empty */
            starts[q] = a < b ? a : b;
            lens[q] = a < b ? b - a : a - b;
            for (k = starts[q]; k < starts[q] + lens[q]; k++) in_shard[k] = 1;
        }
        for (q = 0; q < nranks; q++) {
            int64_t s, l;
            mxs_gather_segment(starts, lens, nranks, q, &s, &l);
            if (l > 0 && (s < starts[q] || s + l > starts[q] + lens[q])) bad++;
            for (k = s; k < s + l; k++) bad += sent[k]++ != 0;
        }
        for (k = 0; k < elems; k++) bad += in_shard[k] != sent[k];
    }
    return bad;
}

static void all_groups(mxs_rank *r, void *user) {
    const char *group = (const char *)user;
    if (!group || !strcmp(group, "writeback")) group_writeback(r);
    if (!group || !strcmp(group, "gather")) group_gather(r);
    if (!group || !strcmp(group, "copyback")) group_copyback(r);
    if (!group || !strcmp(group, "plan")) group_plan(r);
}

int main(int argc, char **argv) {
    const char *group = argc > 1 ? argv[1] : NULL;
    char name[64];
    int bad;
    if (group && strcmp(group, "writeback") && strcmp(group, "gather") && strcmp(group, "copyback") &&
        strcmp(group, "plan")) {
        fprintf(stderr, "usage: %s [writeback|gather|copyback|plan]\n", argv[0]);
        return 2;
    }
    bad = host_check_segments();
    printf("host: gather owner rule (mxs_gather_segment) on 4000 random shard tables: %s\n", bad ? "FAIL" : "ok");
    if (bad) return 1;
    snprintf(name, sizeof name, "test_nccl %s", group ? group : "(all groups)");
    return mxs_launch(name, all_groups, (void *)(uintptr_t)group);
}
