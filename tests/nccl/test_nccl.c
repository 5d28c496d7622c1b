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
 *
 * The cases live in test_nccl_*.c, one file per group (nccl_cases.h lists
 * them); the groups below run them in order.
 */
#define _POSIX_C_SOURCE 200809L
#include "nccl_cases.h"

/* ---- the groups: the cases in order ---------------------------------------------- */

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

static void group_gather(mxs_rank *r) {
    test_gather_pattern_without_kernels(r);
    test_gather_bucket_fast_path(r);
    test_gather_many_weights(r);
}

static void group_copyback(mxs_rank *r) {
    test_copyback_bf16(r, MXS_ROUND_CEIL, "copyback_bf16_equals_fp8_writeback_ceil");
    test_copyback_bf16(r, MXS_ROUND_FLOOR, "copyback_bf16_equals_fp8_writeback_floor");
    test_swizzle_after_gather(r);
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
