/* SPDX-License-Identifier: MIT */
/* Suite cuda, writeback paths groups 1 and 2 (test_wb_paths.cu): shard edges
 * at every offset modulo 32, and masters at every element offset from a
 * 16-byte boundary. */
#include "wb_paths_cases.h"

/* ---- 1. edges at every offset modulo 32 ---------------------------------- */

/* Per shape, batches of 3 ranks x 128 items: for every s in 0..31, four
 * items - a 2-rank cut at 32k+s (the third rank empty or a replica), and
 * three 3-rank items whose middle shard is [32a+s, 32b+e) (long, within one
 * or two 32-element chunks, row-based). Planes and layouts rotate over the
 * items so that each s meets all of them. */
void group_edges(void) {
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
void group_aligned_masters(void) {
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
