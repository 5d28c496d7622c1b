/* SPDX-License-Identifier: MIT */
/* Suite cuda, writeback paths group 4 (test_wb_paths.cu): scales of blocks
 * owned, straddled and foreign, in every layout and plane set. */
#include "wb_paths_cases.h"

/* ---- 4. scales of blocks owned, straddled and foreign -------------------- */

/* 4 ranks, every layout and plane set; shards cut at rows that are not
 * multiples of 128 (32-row groups not multiples of 4: swizzled tiles cut by
 * the shard) and at column offsets inside blocks, tiny shards inside one
 * block (a block straddled by three ranks), ranks that own nothing of an
 * item or one 128-row tile of it, and last shards reaching the last row of
 * weights whose row count is not a multiple of 128 or of 32. */
void group_scale_ownership(void) {
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
