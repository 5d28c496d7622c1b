/* SPDX-License-Identifier: MIT */
/* Suite cuda, writeback paths (test_wb_paths.cu): one case run - every
 * rank's output arena and masters, items, batches and plans, the buckets;
 * then every update: partial on every rank, the MAX reduction here, apply on
 * every rank, each phase's arena compared byte for byte with the host
 * engine's, and the host engine's bytes against a whole-tensor quantize. */
#include "wb_paths_cases.h"

enum { K_ROW_DATA, K_ROW_SCALE, K_COL_DATA, K_COL_SCALE, K_ROW_FRAG, K_COL_FRAG, K_PACKED, K_MASTER };
static const char *const kind_names[] = {"row data",     "row scale",    "col data", "col scale",
                                         "row fragment", "col fragment", "packed",   "master"};

Totals g_tot;

Shard shard_of(int64_t a, int64_t b) {
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
void rnd_options(Shard &s, const Weight &w, int frag_one_in, bool keep_master_mis) {
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

void weight_values(Weight &w) { w.master = rnd_source(w.n(), w.dtype); }

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
void run_case(Case &C) {
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
