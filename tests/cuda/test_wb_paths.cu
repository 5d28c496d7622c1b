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
 *
 * The groups and the case runner live in test_wb_paths_*.cu
 * (wb_paths_cases.h lists the files); main() below runs the groups in order.
 */
#include "wb_paths_cases.h"

#include <chrono>

bool g_gpu = true;  /* false: --host-only */
bool g_san = false; /* MXS_SANITIZER: fewer cases */

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
