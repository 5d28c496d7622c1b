/* SPDX-License-Identifier: MIT */
/* Suite cuda: the writeback paths of issue 17 - shard edges at every offset
 * modulo 32, element-aligned masters, buckets of 1-300 odd-shaped items
 * sharded like a distributed optimizer over DP = 1, 2, 3, 8, scale blocks
 * owned, straddled and foreign in every layout, several updates on the same
 * buffers.
 *
 * A simulated data-parallel group on one GPU, as in test_writeback.cu:
 * every rank runs partial, the MAX reduction is done here, every rank runs
 * apply. Through the prepared bucket (mxs_cuda_wb_prepare +
 * mxs_cuda_wb_bucket_partial / _apply, prepared once per case and reused by
 * every update) and, on some cases, the one-shot mxs_cuda_wb_partial /
 * _apply. After every phase of every update, each rank's whole output arena
 * is compared byte for byte with the host engine's (mxs_host_wb_partial /
 * _apply on an arena of the same layout):
 *
 *   arena | guard | buffer | guard | buffer | ... | packed | guard |
 *
 * every output buffer (data planes, scale planes, fragments, the packed
 * buffer) sits between guard bytes, everything starts as the 0xA5 poison,
 * so the comparison covers every output byte and every guard byte.
 *
 * Independently of the GPU, the host engine's bytes after apply are
 * checked against a whole-tensor mxs_host_quantize of the weight (the
 * shards of every item cover the weight): every rank's scale planes equal
 * the reference's, its shard's data bytes (in place or in the fragment)
 * equal the reference's, its data bytes outside the shard are untouched,
 * and the reduced packed buffer holds the reference's COMPACT scales
 * (after every update with --host-only, after the last one otherwise).
 *
 *   test_cuda_wb_paths               GPU vs host (exit 77 without a GPU)
 *   test_cuda_wb_paths --host-only   the host part alone: host engine vs
 *                                    reference, no CUDA call (self-check of
 *                                    the test's construction)
 *   MXS_SANITIZER=1                  fewer cases (compute-sanitizer runs),
 *                                    and every master in an allocation of
 *                                    its own that ends with the shard, so
 *                                    memcheck sees a read past its end
 */
#include "common.h"

#include <chrono>

static bool g_gpu = true;  /* false: --host-only */
static bool g_san = false; /* MXS_SANITIZER: fewer cases */

enum { K_ROW_DATA, K_ROW_SCALE, K_COL_DATA, K_COL_SCALE, K_ROW_FRAG, K_COL_FRAG, K_PACKED, K_MASTER };
static const char *const kind_names[] = {"row data",     "row scale",    "col data", "col scale",
                                         "row fragment", "col fragment", "packed",   "master"};
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
static Totals g_tot;

static Shard shard_of(int64_t a, int64_t b) {
    Shard s;
    s.start = a;
    s.len = b - a;
    return s;
}

static int64_t scale_bytes_of(const Weight &w, int p) {
    mxs_scale_geom g;
    mxs_scale_geom_make(w.rows, w.cols, (mxs_dirs)(p + 1), w.layout, &g);
    return mxs_scale_geom_bytes(&g);
}

static int64_t compact_bytes_of(const Weight &w, int p) {
    return p == 0 ? w.rows * mxs_ceil_div(w.cols, MXS_BLOCK) : w.cols * mxs_ceil_div(w.rows, MXS_BLOCK);
}

/* The device master laid out like the whole weight (master - start * eb
 * 16-byte aligned), 16-byte aligned itself, or offset by whole elements. */
static int64_t rnd_master_mis(const Weight &w, int64_t start) {
    const int64_t eb = mxs_dtype_bytes(w.dtype);
    const uint64_t r = rnd() % 20;
    if (r < 12) return (start * eb) % 16;
    if (r < 17) return 0;
    return eb * rnd_in(1, 16 / eb - 1);
}

/* Random output options of one rank's item: fragments (sometimes with a NULL
 * data plane), buffer misalignments, the master's placement. */
static void rnd_options(Shard &s, const Weight &w, int frag_one_in, bool keep_master_mis = false) {
    for (int p = 0; p < 2; p++) {
        if (!(w.dirs & (unsigned)(p + 1))) continue;
        s.data_mis[p] = rnd() % 8 == 0 ? rnd_in(1, 7) : 0;
        s.scale_mis[p] = rnd() % 6 == 0 ? rnd_in(1, 15) : 0;
        if (frag_one_in > 0 && rnd() % (uint64_t)frag_one_in == 0) {
            s.frag[p] = true;
            s.frag_mis[p] = rnd() % 2 ? s.start % 8 : rnd_in(0, 7); /* 8-aligned stores, or not */
            s.null_data[p] = rnd() % 2 == 0;
        }
    }
    if (!keep_master_mis) s.master_mis = rnd_master_mis(w, s.start);
    s.null_master = s.len == 0 && rnd() % 2 == 0;
}

static void weight_values(Weight &w) { w.master = rnd_source(w.n(), w.dtype); }

/* New master values in the same host vector. */
static void new_values(Weight &w, int kind, int64_t i) {
    std::vector<uint8_t> fresh;
    if (kind == 1 && i % 3 == 0) {
        fresh.assign(w.master.size(), 0); /* all zeros: amax 0 */
    } else if (kind == 1 && i % 3 == 1) {
        fresh.assign(w.master.size(), 0);
        const float c = ldexpf(1.5f, (int)rnd_in(-20, 20));
        for (int64_t k = 0; k < w.n(); k++) put_value(fresh, k, w.dtype, (k & 1) ? c : -c);
    } else {
        fresh = rnd_source(w.n(), w.dtype);
    }
    memcpy(w.master.data(), fresh.data(), fresh.size());
}

static bool all_poison(const uint8_t *p, int64_t n) {
    for (int64_t k = 0; k < n; k++)
        if (p[k] != POISON) return false;
    return true;
}

static void item_desc(const Case &C, int q, int i, char *buf, size_t bn) {
    const Weight &w = C.W[(size_t)i];
    const Shard &s = C.S[(size_t)q][(size_t)i];
    snprintf(buf, bn, "rank %d item %d (%lldx%lld dirs %u %s %s, shard [%lld, %lld)%s%s)", q, i, (long long)w.rows,
             (long long)w.cols, w.dirs, layout_names[w.layout], dtype_name(w.dtype), (long long)s.start,
             (long long)(s.start + s.len), s.frag[0] ? " row-frag" : "", s.frag[1] ? " col-frag" : "");
}

/* Where arena byte `at` lies: a buffer's byte or a guard byte. */
static void byte_desc(const Case &C, int q, const Arena &A, int64_t at, char *buf, size_t bn) {
    char it[200];
    for (const Region &g : A.regs) {
        if (at >= g.off && at < g.off + g.n) {
            if (g.item >= 0)
                item_desc(C, q, g.item, it, sizeof it);
            else
                snprintf(it, sizeof it, "rank %d", q);
            snprintf(buf, bn, "%s: %s byte %lld of %lld", it, kind_names[g.kind], (long long)(at - g.off),
                     (long long)g.n);
            return;
        }
        if (at < g.off) {
            if (g.item >= 0)
                item_desc(C, q, g.item, it, sizeof it);
            else
                snprintf(it, sizeof it, "rank %d", q);
            snprintf(buf, bn, "guard byte %lld before %s: %s", (long long)(g.off - at), it, kind_names[g.kind]);
            return;
        }
    }
    snprintf(buf, bn, "rank %d: guard byte %lld after the last buffer", q,
             (long long)(at - (A.regs.empty() ? 0 : A.regs.back().off + A.regs.back().n)));
}

/* The device arena equals the host arena, guards included. On a mismatch the
 * device arena is reset to the host's, so later phases compare on their own. */
static void arena_compare(const Case &C, int q, Arena &A, const char *phase, int u) {
    std::vector<uint8_t> got((size_t)A.size);
    CUDA_OK(cudaMemcpy(got.data(), A.d, (size_t)A.size, cudaMemcpyDeviceToHost));
    g_checks++;
    if (memcmp(got.data(), A.h.data(), (size_t)A.size) == 0) return;
    int64_t first = -1, count = 0;
    for (int64_t k = 0; k < A.size; k++)
        if (got[(size_t)k] != A.h[(size_t)k]) {
            if (first < 0) first = k;
            count++;
        }
    char where[400];
    byte_desc(C, q, A, first, where, sizeof where);
    CHECK(0, "%s: %s, update %d: %lld bytes differ; first: %s: gpu 0x%02X host 0x%02X", C.name, phase, u,
          (long long)count, where, got[(size_t)first], A.h[(size_t)first]);
    CUDA_OK(cudaMemcpy(A.d, A.h.data(), (size_t)A.size, cudaMemcpyHostToDevice));
}

/* The host engine's bytes after apply against a whole-tensor quantize. */
static void reference_check(const Case &C, std::vector<Arena> &out, const std::vector<int64_t> &o_packed,
                            const std::vector<int64_t> &prow, const std::vector<int64_t> &pcol, int u) {
    char it[200];
    for (size_t i = 0; i < C.W.size(); i++) {
        const Weight &w = C.W[i];
        const int64_t n = w.n();
        std::vector<uint8_t> conv;
        const void *src = w.master.data();
        mxs_dtype sd = w.dtype;
        if (C.rt != MXS_F32) { /* round-through: the master rounded to rt, as values of rt */
            conv.resize((size_t)(n * mxs_dtype_bytes(C.rt)));
            for (int64_t k = 0; k < n; k++) put_value(conv, k, C.rt, mxs_load_f32(w.master.data(), w.dtype, k));
            src = conv.data();
            sd = C.rt;
        }
        std::vector<uint8_t> data[2], scale[2], compact[2];
        mxs_tensor t;
        memset(&t, 0, sizeof t);
        t.rows = w.rows;
        t.cols = w.cols;
        t.dirs = w.dirs;
        t.scale_layout = w.layout;
        for (int p = 0; p < 2; p++) {
            if (!(w.dirs & (unsigned)(p + 1))) continue;
            data[p].assign((size_t)n, POISON);
            scale[p].assign((size_t)scale_bytes_of(w, p), POISON);
            compact[p].assign((size_t)compact_bytes_of(w, p), POISON);
        }
        if (w.dirs & MXS_ROWWISE) {
            t.row_data = data[0].data();
            t.row_scale = scale[0].data();
        }
        if (w.dirs & MXS_COLWISE) {
            t.col_data = data[1].data();
            t.col_scale = scale[1].data();
        }
        mxs_status st = mxs_host_quantize(&t, src, sd, C.rounding);
        CHECK(st == MXS_OK, "%s: reference quantize of item %d: %s", C.name, (int)i, mxs_status_str(st));
        if (st != MXS_OK) continue;
        for (int p = 0; p < 2; p++) {
            if (!(w.dirs & (unsigned)(p + 1))) continue;
            st = mxs_host_convert_scales(w.rows, w.cols, (mxs_dirs)(p + 1), w.layout, scale[p].data(),
                                         MXS_SCALES_COMPACT, compact[p].data());
            CHECK(st == MXS_OK, "%s: convert_scales", C.name);
            const int64_t slot = p == 0 ? prow[i] : pcol[i];
            g_checks++;
            CHECK(memcmp(out[0].h.data() + o_packed[0] + slot, compact[p].data(), compact[p].size()) == 0,
                  "%s: update %d item %d: reduced packed %s exponents != whole-tensor quantize's", C.name, u, (int)i,
                  p == 0 ? "row" : "col");
        }
        for (int q = 0; q < C.nranks; q++) {
            const Shard &s = C.S[(size_t)q][i];
            const uint8_t *A = out[(size_t)q].h.data();
            for (int p = 0; p < 2; p++) {
                if (!(w.dirs & (unsigned)(p + 1))) continue;
                item_desc(C, q, (int)i, it, sizeof it);
                g_checks++;
                CHECK(memcmp(A + s.o_scale[p], scale[p].data(), scale[p].size()) == 0,
                      "%s: update %d %s: host %s scales != whole-tensor quantize's", C.name, u, it,
                      p == 0 ? "row" : "col");
                if (s.o_data[p] >= 0) {
                    const uint8_t *D = A + s.o_data[p];
                    bool ok;
                    if (s.frag[p])
                        ok = all_poison(D, n);
                    else
                        ok = all_poison(D, s.start) &&
                             memcmp(D + s.start, data[p].data() + s.start, (size_t)s.len) == 0 &&
                             all_poison(D + s.start + s.len, n - s.start - s.len);
                    g_checks++;
                    CHECK(ok,
                          "%s: update %d %s: host %s data: shard bytes != whole-tensor quantize's or a byte "
                          "outside the shard written",
                          C.name, u, it, p == 0 ? "row" : "col");
                }
                if (s.o_frag[p] >= 0) {
                    g_checks++;
                    CHECK(memcmp(A + s.o_frag[p], data[p].data() + s.start, (size_t)s.len) == 0,
                          "%s: update %d %s: host %s fragment != whole-tensor quantize's shard", C.name, u, it,
                          p == 0 ? "row" : "col");
                }
            }
        }
    }
}

static void expect_ok(mxs_status s, const Case &C, const char *what, int q) {
    CHECK(s == MXS_OK, "%s: %s (rank %d): %d (%s)", C.name, what, q, (int)s, mxs_status_str(s));
}

/* Runs a case: arenas, batches and plans per rank, the buckets; then every
 * update: partial on every rank, MAX, apply on every rank, comparisons. */
static void run_case(Case &C) {
    const int R = C.nranks;
    const int64_t nw = (int64_t)C.W.size();
    const int failures_before = g_failures;
    const bool exact_masters = g_san;
    g_tot.cases++;
    g_tot.items += nw;
    g_tot.rank_items += nw * R;

    /* the construction's invariant: every item's shards cover it */
    for (int64_t i = 0; i < nw; i++) {
        std::vector<std::pair<int64_t, int64_t>> iv;
        const int64_t n = C.W[(size_t)i].n();
        for (int q = 0; q < R; q++) {
            const Shard &s = C.S[(size_t)q][(size_t)i];
            CHECK(mxs_shard_check(n, s.start, s.len) == MXS_OK, "%s: item %d rank %d: bad shard [%lld, +%lld) of %lld",
                  C.name, (int)i, q, (long long)s.start, (long long)s.len, (long long)n);
            if (s.len > 0) iv.push_back({s.start, s.start + s.len});
        }
        std::sort(iv.begin(), iv.end());
        int64_t reach = 0;
        for (auto &v : iv)
            if (v.first <= reach) reach = std::max(reach, v.second);
        CHECK(reach == n, "%s: item %d: the shards do not cover the weight (test construction)", C.name, (int)i);
    }
    if (g_failures != failures_before) return;

    /* the packed buffer's layout (docs/contract.md section 4), computed here */
    std::vector<int64_t> prow((size_t)nw, -1), pcol((size_t)nw, -1);
    int64_t rowb = 0, colb = 0;
    for (int64_t i = 0; i < nw; i++)
        if (C.W[(size_t)i].dirs & MXS_ROWWISE) {
            prow[(size_t)i] = rowb;
            rowb += compact_bytes_of(C.W[(size_t)i], 0);
        }
    for (int64_t i = 0; i < nw; i++)
        if (C.W[(size_t)i].dirs & MXS_COLWISE) {
            pcol[(size_t)i] = rowb + colb;
            colb += compact_bytes_of(C.W[(size_t)i], 1);
        }
    const int64_t packed_bytes = rowb + colb + 1;

    std::vector<Arena> out((size_t)R), mst((size_t)R);
    std::vector<int64_t> o_packed((size_t)R);
    for (int q = 0; q < R; q++) {
        for (int64_t i = 0; i < nw; i++) {
            Shard &s = C.S[(size_t)q][(size_t)i];
            const Weight &w = C.W[(size_t)i];
            for (int p = 0; p < 2; p++) {
                if (!(w.dirs & (unsigned)(p + 1))) continue;
                if (!s.null_data[p]) s.o_data[p] = out[(size_t)q].add(w.n(), s.data_mis[p], (int)i, 2 * p);
                s.o_scale[p] = out[(size_t)q].add(scale_bytes_of(w, p), s.scale_mis[p], (int)i, 2 * p + 1);
                if (s.frag[p]) s.o_frag[p] = out[(size_t)q].add(s.len, s.frag_mis[p], (int)i, K_ROW_FRAG + p);
            }
            if (!exact_masters && (s.len > 0 || !s.null_master))
                s.o_master = mst[(size_t)q].add(s.len * mxs_dtype_bytes(w.dtype), s.master_mis, (int)i, K_MASTER);
        }
        o_packed[(size_t)q] = out[(size_t)q].add(packed_bytes, rnd() % 4 == 0 ? rnd_in(1, 3) : 0, -1, K_PACKED);
        out[(size_t)q].finish(POISON);
        mst[(size_t)q].finish(0);
    }
    /* Under compute-sanitizer every master is its own allocation of exactly
     * master_mis + len * eb bytes (the shard at its end), so that memcheck
     * sees a read past a master's last element; otherwise they share the
     * rank's master arena. */
    std::vector<std::vector<uint8_t *>> dmaster((size_t)R, std::vector<uint8_t *>((size_t)nw, nullptr));
    std::vector<uint8_t *> own_masters;
    for (int q = 0; q < R; q++)
        for (int64_t i = 0; g_gpu && i < nw; i++) {
            const Shard &s = C.S[(size_t)q][(size_t)i];
            if (!exact_masters) {
                dmaster[(size_t)q][(size_t)i] = s.o_master >= 0 ? mst[(size_t)q].d + s.o_master : nullptr;
            } else if (s.len > 0 || !s.null_master) {
                uint8_t *p = nullptr;
                CUDA_OK(cudaMalloc(
                    &p, (size_t)std::max<int64_t>(1, s.master_mis + s.len * mxs_dtype_bytes(C.W[(size_t)i].dtype))));
                own_masters.push_back(p);
                dmaster[(size_t)q][(size_t)i] = p + s.master_mis;
            }
        }

    /* items, batches, plans */
    std::vector<std::vector<mxs_wb_item>> hit((size_t)R), dit((size_t)R);
    std::vector<mxs_wb_batch> hb((size_t)R), db((size_t)R);
    std::vector<mxs_wb_plan> hp((size_t)R), dp((size_t)R);
    bool planned = true;
    for (int q = 0; q < R; q++) {
        Arena &A = out[(size_t)q];
        for (int64_t i = 0; i < nw; i++) {
            const Shard &s = C.S[(size_t)q][(size_t)i];
            const Weight &w = C.W[(size_t)i];
            const int64_t eb = mxs_dtype_bytes(w.dtype);
            mxs_wb_item h, d;
            memset(&h, 0, sizeof h);
            h.primary.rows = w.rows;
            h.primary.cols = w.cols;
            h.primary.dirs = w.dirs;
            h.primary.scale_layout = w.layout;
            h.master_dtype = w.dtype;
            h.start = s.start;
            h.len = s.len;
            d = h;
            h.master = w.master.data() + s.start * eb;
            d.master = dmaster[(size_t)q][(size_t)i];
            uint8_t *hbase = A.h.data(), *dbase = A.d;
            auto at = [](uint8_t *base, int64_t off) -> uint8_t * { return off >= 0 && base ? base + off : nullptr; };
            if (w.dirs & MXS_ROWWISE) {
                h.primary.row_data = at(hbase, s.o_data[0]);
                h.primary.row_scale = at(hbase, s.o_scale[0]);
                h.row_fragment = at(hbase, s.o_frag[0]);
                d.primary.row_data = at(dbase, s.o_data[0]);
                d.primary.row_scale = at(dbase, s.o_scale[0]);
                d.row_fragment = at(dbase, s.o_frag[0]);
            }
            if (w.dirs & MXS_COLWISE) {
                h.primary.col_data = at(hbase, s.o_data[1]);
                h.primary.col_scale = at(hbase, s.o_scale[1]);
                h.col_fragment = at(hbase, s.o_frag[1]);
                d.primary.col_data = at(dbase, s.o_data[1]);
                d.primary.col_scale = at(dbase, s.o_scale[1]);
                d.col_fragment = at(dbase, s.o_frag[1]);
            }
            hit[(size_t)q].push_back(h);
            dit[(size_t)q].push_back(d);
        }
        memset(&hb[(size_t)q], 0, sizeof(mxs_wb_batch));
        hb[(size_t)q].items = hit[(size_t)q].data();
        hb[(size_t)q].n_items = nw;
        hb[(size_t)q].rounding = C.rounding;
        hb[(size_t)q].round_through = C.rt;
        hb[(size_t)q].mode = C.mode;
        db[(size_t)q] = hb[(size_t)q];
        db[(size_t)q].items = dit[(size_t)q].data();
        mxs_status st = mxs_wb_make_plan(&hb[(size_t)q], &hp[(size_t)q], NULL);
        expect_ok(st, C, "host plan", q);
        planned = planned && st == MXS_OK;
        if (st == MXS_OK)
            CHECK(hp[(size_t)q].packed_bytes == packed_bytes && hp[(size_t)q].row_region_bytes == rowb &&
                      hp[(size_t)q].status_offset == packed_bytes - 1,
                  "%s: plan's packed layout (%lld bytes) != the contract's (%lld)", C.name,
                  (long long)hp[(size_t)q].packed_bytes, (long long)packed_bytes);
        if (g_gpu) {
            st = mxs_wb_make_plan(&db[(size_t)q], &dp[(size_t)q], NULL);
            expect_ok(st, C, "device plan", q);
            planned = planned && st == MXS_OK;
            if (st == MXS_OK)
                CHECK(dp[(size_t)q].fingerprint == hp[(size_t)q].fingerprint &&
                          dp[(size_t)q].packed_bytes == hp[(size_t)q].packed_bytes,
                      "%s: host and device plans agree", C.name);
        }
    }

    /* workspaces and buckets */
    std::vector<uint8_t *> ws((size_t)R, nullptr);
    std::vector<int64_t> wsb((size_t)R, 0);
    std::vector<mxs_cuda_wb_bucket> bk((size_t)R);
    if (g_gpu && planned) {
        for (int q = 0; q < R; q++) {
            mxs_status st = C.oneshot ? mxs_cuda_wb_workspace_bytes(&db[(size_t)q], &wsb[(size_t)q])
                                      : mxs_cuda_wb_prepare_bytes(&db[(size_t)q], &wsb[(size_t)q]);
            expect_ok(st, C, "workspace query", q);
            CUDA_OK(cudaMalloc(&ws[(size_t)q], (size_t)std::max<int64_t>(wsb[(size_t)q], 16)));
            memset(&bk[(size_t)q], 0, sizeof(mxs_cuda_wb_bucket));
            if (!C.oneshot) {
                st = mxs_cuda_wb_prepare(&bk[(size_t)q], &db[(size_t)q], &dp[(size_t)q],
                                         out[(size_t)q].d + o_packed[(size_t)q], ws[(size_t)q], wsb[(size_t)q], 0);
                expect_ok(st, C, "prepare", q);
                planned = planned && st == MXS_OK;
            }
        }
    }

    for (int u = 0; planned && u < C.updates; u++) {
        if (u > 0)
            for (int64_t i = 0; i < nw; i++) new_values(C.W[(size_t)i], C.update_kind[u], i);
        if (g_gpu)
            for (int q = 0; q < R; q++) {
                Arena &M = mst[(size_t)q];
                for (int64_t i = 0; i < nw; i++) {
                    const Shard &s = C.S[(size_t)q][(size_t)i];
                    const int64_t eb = mxs_dtype_bytes(C.W[(size_t)i].dtype);
                    const uint8_t *from = C.W[(size_t)i].master.data() + s.start * eb;
                    if (s.len == 0) continue;
                    if (exact_masters)
                        CUDA_OK(cudaMemcpy(dmaster[(size_t)q][(size_t)i], from, (size_t)(s.len * eb),
                                           cudaMemcpyHostToDevice));
                    else
                        memcpy(M.h.data() + s.o_master, from, (size_t)(s.len * eb));
                }
                if (!exact_masters) CUDA_OK(cudaMemcpy(M.d, M.h.data(), (size_t)M.size, cudaMemcpyHostToDevice));
            }
        /* step 2 on every rank */
        for (int q = 0; q < R; q++) {
            Arena &A = out[(size_t)q];
            expect_ok(mxs_host_wb_partial(&hb[(size_t)q], &hp[(size_t)q], A.h.data() + o_packed[(size_t)q]), C,
                      "host partial", q);
            if (g_gpu) {
                mxs_status st = C.oneshot
                                    ? mxs_cuda_wb_partial(&db[(size_t)q], &dp[(size_t)q], A.d + o_packed[(size_t)q],
                                                          ws[(size_t)q], wsb[(size_t)q], 0)
                                    : mxs_cuda_wb_bucket_partial(&bk[(size_t)q], 0);
                expect_ok(st, C, C.oneshot ? "mxs_cuda_wb_partial" : "mxs_cuda_wb_bucket_partial", q);
                CUDA_OK(cudaDeviceSynchronize());
                arena_compare(C, q, A, "after partial", u);
            }
            g_tot.phases++;
            g_tot.bytes += A.size;
        }
        /* step 3: MAX over the ranks */
        std::vector<uint8_t> reduced((size_t)packed_bytes, 0);
        for (int q = 0; q < R; q++) {
            const uint8_t *pk = out[(size_t)q].h.data() + o_packed[(size_t)q];
            for (int64_t k = 0; k < packed_bytes; k++) reduced[(size_t)k] = std::max(reduced[(size_t)k], pk[k]);
        }
        /* step 4 on every rank */
        for (int q = 0; q < R; q++) {
            Arena &A = out[(size_t)q];
            memcpy(A.h.data() + o_packed[(size_t)q], reduced.data(), reduced.size());
            expect_ok(mxs_host_wb_apply(&hb[(size_t)q], &hp[(size_t)q], A.h.data() + o_packed[(size_t)q]), C,
                      "host apply", q);
            if (g_gpu) {
                CUDA_OK(cudaMemcpy(A.d + o_packed[(size_t)q], reduced.data(), reduced.size(), cudaMemcpyHostToDevice));
                mxs_status st = C.oneshot ? mxs_cuda_wb_apply(&db[(size_t)q], &dp[(size_t)q], A.d + o_packed[(size_t)q],
                                                              ws[(size_t)q], wsb[(size_t)q], 0)
                                          : mxs_cuda_wb_bucket_apply(&bk[(size_t)q], 0);
                expect_ok(st, C, C.oneshot ? "mxs_cuda_wb_apply" : "mxs_cuda_wb_bucket_apply", q);
                CUDA_OK(cudaDeviceSynchronize());
                arena_compare(C, q, A, "after apply", u);
            }
            g_tot.phases++;
            g_tot.bytes += A.size;
        }
        /* the host-only self-check after every update; with the GPU after the last */
        if (!g_gpu || u == C.updates - 1) reference_check(C, out, o_packed, prow, pcol, u);
    }

    for (int q = 0; q < R; q++) {
        if (g_gpu && !C.oneshot && bk[(size_t)q].magic)
            expect_ok(mxs_cuda_wb_bucket_release(&bk[(size_t)q]), C, "release", q);
        if (ws[(size_t)q]) CUDA_OK(cudaFree(ws[(size_t)q]));
        out[(size_t)q].release();
        mst[(size_t)q].release();
    }
    for (uint8_t *p : own_masters) CUDA_OK(cudaFree(p));
}

static const mxs_dtype kRts[3] = {MXS_F32, MXS_BF16, MXS_F16};

/* ---- 1. edges at every offset modulo 32 ---------------------------------- */

/* Per shape, batches of 3 ranks x 128 items: for every s in 0..31, four
 * items - a 2-rank cut at 32k+s (the third rank empty or a replica), and
 * three 3-rank items whose middle shard is [32a+s, 32b+e) (long, within one
 * or two 32-element chunks, row-based). Planes and layouts rotate over the
 * items so that each s meets all of them. */
static void group_edges(void) {
    g_rng = 0xE0E0E0E0D1D1D1D1ull;
    static const int64_t shapes[4][2] = {{96, 256}, {200, 384}, {70, 200}, {33, 1000}};
    for (int sh = 0; sh < 4; sh++)
        for (int pass = 0; pass < 3; pass++) { /* 0: FUSED, 1: STRICT, 2: row-only bucket */
            if (g_san && (sh + pass) % 3 != 0) continue;
            Case C;
            C.nranks = 3;
            C.mode = pass == 0 ? MXS_WB_FUSED : pass == 1 ? MXS_WB_STRICT : (sh % 2 ? MXS_WB_STRICT : MXS_WB_FUSED);
            C.rounding = (mxs_rounding)((sh + pass) % 2);
            C.rt = kRts[(sh + pass) % 3];
            C.oneshot = (sh * 3 + pass) % 5 == 4;
            const int64_t rows = shapes[sh][0], cols = shapes[sh][1], n = rows * cols;
            snprintf(C.name, sizeof C.name, "edges %lldx%lld %s%s, round %d, rt %s%s", (long long)rows, (long long)cols,
                     C.mode == MXS_WB_FUSED ? "FUSED" : "STRICT", pass == 2 ? " row-only" : "", (int)C.rounding,
                     dtype_name(C.rt), C.oneshot ? ", one-shot" : "");
            C.S.assign(3, std::vector<Shard>());
            for (int64_t s = 0; s < 32; s++)
                for (int v = 0; v < 4; v++) {
                    Weight w;
                    w.rows = rows;
                    w.cols = cols;
                    const int combo = (int)((sh * 4 + v + s + pass * 3) % 9);
                    w.dirs = pass == 2 ? (unsigned)MXS_ROWWISE : (unsigned)(combo / 3 + 1);
                    w.layout = (mxs_scale_layout)(pass == 2 ? (s + v) % 3 : combo % 3);
                    w.dtype = (mxs_dtype)((s + v + sh) % 3);
                    weight_values(w);
                    const int64_t e = (s * 7 + v * 13 + sh * 5 + pass) % 32;
                    Shard r[3];
                    if (v == 0) {
                        const int64_t cut = 32 * rnd_in(0, (n - s) / 32) + s;
                        r[0] = shard_of(0, cut);
                        r[1] = shard_of(cut, n);
                        if (s % 3 == 0) {
                            r[2] = shard_of(0, 0);
                            r[2].start = rnd_in(0, n); /* empty, anywhere */
                        } else {
                            r[2] = s % 3 == 1 ? r[0] : r[1]; /* a replica */
                        }
                    } else {
                        int64_t a, b;
                        if (v == 1) { /* long */
                            const int64_t ka = rnd_in(0, n / 32 - 2);
                            a = 32 * ka + s;
                            b = 32 * rnd_in(ka + 1, (n - e) / 32) + e;
                        } else if (v == 2) { /* within one or two 32-element chunks */
                            const int64_t ka = rnd_in(0, (n - 64) / 32);
                            a = 32 * ka + s;
                            b = 32 * (e > s ? ka : ka + 1) + e;
                        } else { /* row-based: column offsets 32j+s and 32j+e */
                            const int64_t ra = rnd_in(0, rows - 1);
                            a = ra * cols + 32 * rnd_in(0, (cols - 1 - s) / 32) + s;
                            if (rnd() % 4 == 0 || ra == rows - 1) {
                                b = n; /* to the end of the weight */
                            } else {
                                const int64_t rb = rnd_in(ra + 1, rows - 1);
                                b = rb * cols + 32 * rnd_in(0, (cols - 1 - e) / 32) + e;
                            }
                        }
                        r[0] = shard_of(0, a);
                        r[1] = shard_of(a, b);
                        r[2] = shard_of(b, n);
                    }
                    for (int q = 0; q < 3; q++) {
                        rnd_options(r[q], w, 8);
                        C.S[(size_t)q].push_back(r[q]);
                    }
                    C.W.push_back(std::move(w));
                }
            run_case(C);
        }
}

/* ---- 2. element-aligned masters ------------------------------------------ */

/* Per master dtype, round-through (none, bf16) and rounding: 3 ranks; the
 * middle rank's master at every element offset from a 16-byte boundary
 * (f32: 0..3, bf16/f16: 0..7), its shard starting on a 32-row group / row,
 * on the 8-element grid, or off it; the other ranks' masters at other
 * offsets. Most shapes have cols % 8 == 0 (the vector path). */
static void group_aligned_masters(void) {
    g_rng = 0xA11A11A11A11A11Aull;
    static const int64_t shapes[8][2] = {{64, 256}, {45, 136}, {100, 1000}, {7, 1024},
                                         {33, 40},  {50, 100}, {128, 128},  {96, 264}};
    for (int dt = 0; dt < 3; dt++)
        for (int rti = 0; rti < 2; rti++)
            for (int ro = 0; ro < 2; ro++) {
                if (g_san && (dt + rti + ro) % 2) continue;
                Case C;
                C.nranks = 3;
                C.rt = rti ? MXS_BF16 : MXS_F32;
                C.rounding = (mxs_rounding)ro;
                C.mode = (rti ^ ro) ? MXS_WB_STRICT : MXS_WB_FUSED;
                const bool row_only = (dt + rti) % 2 == 1;
                C.oneshot = (dt * 4 + rti * 2 + ro) % 6 == 5;
                const mxs_dtype dtype = (mxs_dtype)dt;
                snprintf(C.name, sizeof C.name, "aligned masters %s, rt %s, round %d, %s%s%s", dtype_name(dtype),
                         dtype_name(C.rt), ro, C.mode == MXS_WB_FUSED ? "FUSED" : "STRICT", row_only ? " row-only" : "",
                         C.oneshot ? ", one-shot" : "");
                const int64_t eb = mxs_dtype_bytes(dtype), O = 16 / eb;
                C.S.assign(3, std::vector<Shard>());
                for (int64_t o = 0; o < O; o++)
                    for (int kind = 0; kind < 3; kind++)
                        for (int z = 0; z < 2; z++) {
                            const int64_t *shp = shapes[(o * 3 + kind + z * 4 + dt) % 8];
                            Weight w;
                            w.rows = shp[0];
                            w.cols = shp[1];
                            w.dirs = row_only ? (unsigned)MXS_ROWWISE : (unsigned)((o + kind + z) % 3 + 1);
                            w.layout = (mxs_scale_layout)((o + kind * 2 + z) % 3);
                            w.dtype = dtype;
                            weight_values(w);
                            const int64_t n = w.n();
                            int64_t c1, c2;
                            if (kind == 0) { /* a 32-row group (or a row) boundary */
                                c1 = w.rows >= 64 ? 32 * w.cols * rnd_in(1, w.rows / 32 - 1)
                                                  : w.cols * rnd_in(1, w.rows - 1);
                                c2 = z == 0 ? n : 8 * rnd_in(c1 / 8 + 1, n / 8);
                            } else if (kind == 1) { /* the 8-element grid */
                                c1 = 8 * rnd_in(1, n / 8 - 2);
                                c2 = 8 * rnd_in(c1 / 8 + 1, n / 8);
                            } else { /* off the grid */
                                c1 = 8 * rnd_in(1, n / 8 - 2) + rnd_in(1, 7);
                                c2 = c1 + rnd_in(1, n - c1);
                            }
                            Shard r[3] = {shard_of(0, c1), shard_of(c1, c2), shard_of(c2, n)};
                            const int64_t mis[3] = {((o + 1) % O) * eb, o * eb, ((o + O / 2) % O) * eb};
                            for (int q = 0; q < 3; q++) {
                                r[q].master_mis = mis[q];
                                rnd_options(r[q], w, 6, true);
                                C.S[(size_t)q].push_back(r[q]);
                            }
                            C.W.push_back(std::move(w));
                        }
                run_case(C);
            }
}

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

static void group_buckets(void) {
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

/* ---- 4. scales of blocks owned, straddled and foreign -------------------- */

/* 4 ranks, every layout and plane set; shards cut at rows that are not
 * multiples of 128 (32-row groups not multiples of 4: swizzled tiles cut by
 * the shard) and at column offsets inside blocks, tiny shards inside one
 * block (a block straddled by three ranks), ranks that own nothing of an
 * item or one 128-row tile of it, and last shards reaching the last row of
 * weights whose row count is not a multiple of 128 or of 32. */
static void group_scale_ownership(void) {
    g_rng = 0x5CA1E0000000AB1Eull;
    /* rows: none a multiple of 128; 160 a multiple of 32 (PADDED / SWIZZLED padding with whole groups) */
    static const int64_t shapes[8][2] = {{300, 256}, {200, 384}, {129, 136}, {257, 520},
                                         {33, 1000}, {161, 64},  {260, 40},  {160, 136}};
    static const int64_t cut_rows[] = {1, 31, 32, 33, 64, 96, 100, 127, 128, 129, 160, 192, 224, 255, 256, 288};
    for (int mode = 0; mode < 2; mode++)
        for (int layout = 0; layout < 3; layout++) {
            if (g_san && (mode + layout) % 2) continue;
            Case C;
            C.nranks = 4;
            C.mode = (mxs_wb_mode)mode;
            C.rounding = (mxs_rounding)((mode + layout) % 2);
            C.rt = kRts[layout];
            C.oneshot = mode == 1 && layout == 2;
            snprintf(C.name, sizeof C.name, "scale ownership %s %s, round %d, rt %s%s", mode == 0 ? "FUSED" : "STRICT",
                     layout_names[layout], (int)C.rounding, dtype_name(C.rt), C.oneshot ? ", one-shot" : "");
            C.S.assign(4, std::vector<Shard>());
            for (int sh = 0; sh < 8; sh++)
                for (int pat = 0; pat < 4; pat++)
                    for (int dirs = 1; dirs <= 3; dirs++) {
                        Weight w;
                        w.rows = shapes[sh][0];
                        w.cols = shapes[sh][1];
                        w.dirs = (unsigned)dirs;
                        w.layout = (mxs_scale_layout)layout;
                        w.dtype = (mxs_dtype)((sh + pat + dirs) % 3);
                        weight_values(w);
                        const int64_t rows = w.rows, cols = w.cols, n = w.n(), kr = mxs_ceil_div(cols, MXS_BLOCK);
                        std::vector<int64_t> rws;
                        for (int64_t r : cut_rows)
                            if (r < rows) rws.push_back(r);
                        rws.push_back(rows - 1);                                        /* the last row */
                        if (rows % 32) rws.push_back(rows - rows % 32);                 /* the short last group */
                        if (rows % 128 && rows > 128) rws.push_back(rows - rows % 128); /* the short last tile */
                        const int64_t col_picks[6] = {0,        32 % cols,     7 % cols,
                                                      cols - 1, 32 * (kr - 1), std::min(cols - 1, 32 * (kr - 1) + 5)};
                        auto rnd_row = [&]() { return rws[rnd() % rws.size()]; };
                        int64_t c[5] = {0, 0, 0, 0, n};
                        Shard r[4];
                        if (pat == 0 || pat == 1) { /* cuts at rows (pat 1: and inside blocks) */
                            for (int k = 1; k <= 3; k++)
                                c[k] = rnd_row() * cols + (pat == 0 ? 0 : col_picks[rnd() % 6]);
                            std::sort(c + 1, c + 4);
                            for (int q = 0; q < 4; q++) r[q] = shard_of(c[q], c[q + 1]);
                        } else if (pat == 2) { /* a tiny shard straddling; the last from inside the last row */
                            const int64_t blk_r = rnd_row(), blk_j = rnd_in(0, kr - 1);
                            c[1] = std::min(n - 1, blk_r * cols + 32 * blk_j + rnd_in(1, 5));
                            c[2] = std::min(n, c[1] + rnd_in(1, 20));
                            c[3] = std::max(c[2], (rows - 1) * cols + col_picks[rnd() % 6]);
                            for (int q = 0; q < 4; q++) r[q] = shard_of(c[q], c[q + 1]);
                        } else { /* foreign: an empty rank, one 128-row tile, the rest, an overlapping replica */
                            const int64_t t = std::min(rows, (int64_t)128) * cols;
                            r[0] = shard_of(0, 0);
                            r[0].start = rnd_in(0, n);
                            r[1] = shard_of(0, t);
                            r[2] = shard_of(t, n);
                            r[3] = shard_of(std::max((int64_t)0, t - rnd_in(0, 40)), n);
                        }
                        for (int q = 0; q < 4; q++) {
                            rnd_options(r[q], w, 8);
                            C.S[(size_t)q].push_back(r[q]);
                        }
                        C.W.push_back(std::move(w));
                    }
            run_case(C);
        }
}

/* ---- 5. several updates on the same buffers ------------------------------ */

/* One bucket (and one one-shot batch) serves four updates: new random
 * values, then zeros / constants / random by item, then random again. */
static void group_updates(void) {
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

typedef void (*group_fn)(void);

int main(int argc, char **argv) {
    for (int a = 1; a < argc; a++) {
        if (strcmp(argv[a], "--host-only") == 0)
            g_gpu = false;
        else {
            fprintf(stderr, "usage: %s [--host-only]\n", argv[0]);
            return 2;
        }
    }
    const char *san = getenv("MXS_SANITIZER");
    g_san = san && *san && strcmp(san, "0") != 0;
    if (g_gpu)
        require_gpu();
    else
        printf("# --host-only: the host engine against whole-tensor quantize, no CUDA call\n");
    if (g_san) printf("# MXS_SANITIZER: reduced case counts\n");
    static const struct {
        group_fn fn;
        const char *name;
    } groups[] = {
        {group_edges, "shard_edges_at_every_offset_mod_32_both_modes_every_plane_set_and_layout"},
        {group_aligned_masters, "element_aligned_masters_every_offset_dtype_round_through_and_rounding"},
        {group_buckets, "buckets_of_1_to_300_odd_items_sharded_over_dp_1_2_3_8_with_empty_shards_and_replicas"},
        {group_scale_ownership, "scales_of_blocks_owned_straddled_and_foreign_in_every_layout"},
        {group_updates, "several_updates_on_the_same_buffers_bucket_and_one_shot"},
    };
    for (const auto &g : groups) {
        const Totals before = g_tot;
        const auto t0 = std::chrono::steady_clock::now();
        g.fn();
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        printf("# %s: %d cases, %lld items, %lld rank-items, %lld phase runs, %.0f MB compared, %.2f s\n", g.name,
               g_tot.cases - before.cases, (long long)(g_tot.items - before.items),
               (long long)(g_tot.rank_items - before.rank_items), (long long)(g_tot.phases - before.phases),
               (double)(g_tot.bytes - before.bytes) / 1e6, s);
        tap_point(g.name);
    }
    return tap_done();
}
