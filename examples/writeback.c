/* SPDX-License-Identifier: MIT */
/* examples/writeback.c - distributed writeback: three ranks, one thread each.
 *
 * Each data-parallel rank holds the whole MXFP8 primary of a weight and an
 * FP32 master shard of it: a contiguous flat range that starts and ends
 * anywhere, here in the middle of blocks. After the optimizer step every
 * rank writes its partial block exponents (one byte per block), the ranks do
 * ONE MAX all-reduce over those bytes, then every rank casts its own shard;
 * a byte all-gather assembles the weight. The result equals quantizing the
 * whole master at once, byte for byte; this program checks that on every
 * rank.
 *
 * The collectives are simulated between threads (group_allreduce_max_u8,
 * group_allgather); in training they are your framework's all-reduce (MAX
 * over uint8) and all-gather, e.g. MPI_Allreduce or ncclAllReduce.
 *
 *   cc -std=c99 -Iinclude examples/writeback.c -pthread -o writeback && ./writeback
 *
 * Builds as C99 and as C++ (the test suite compiles both). */
#define _POSIX_C_SOURCE 200809L
#include <mxshard/mxshard.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { NRANKS = 3, ROWS = 45, COLS = 70 };

/* ---- the simulated group ------------------------------------------------ */

typedef struct group {
    pthread_barrier_t barrier;
    uint8_t *buf[NRANKS]; /* each rank's buffer during a collective */
    mxs_tensor primary[NRANKS];
    int64_t start[NRANKS], len[NRANKS];
} group;

typedef struct rank_ctx {
    group *g;
    int rank;
    int failed;
} rank_ctx;

/* MAX over uint8 of `bytes` bytes, in place, across the group (the callback
 * mxs_host_wb_writeback calls exactly once). */
static int group_allreduce_max_u8(uint8_t *packed, int64_t bytes, void *user) {
    rank_ctx *me = (rank_ctx *)user;
    uint8_t *max = (uint8_t *)malloc(bytes > 0 ? (size_t)bytes : 1);
    int64_t i;
    int q;
    if (!max) return 1; /* (a real collective has its own error path) */
    me->g->buf[me->rank] = packed;
    pthread_barrier_wait(&me->g->barrier); /* every rank's partial exponents are in */
    for (i = 0; i < bytes; i++) {
        max[i] = 0;
        for (q = 0; q < NRANKS; q++) max[i] = me->g->buf[q][i] > max[i] ? me->g->buf[q][i] : max[i];
    }
    pthread_barrier_wait(&me->g->barrier); /* every rank has read every buffer */
    memcpy(packed, max, (size_t)bytes);
    free(max);
    return 0;
}

/* Every rank's shard of each data plane to every rank. */
static void group_allgather(rank_ctx *me) {
    group *g = me->g;
    int q;
    pthread_barrier_wait(&g->barrier); /* every rank has written its shard */
    for (q = 0; q < NRANKS; q++) {
        if (q == me->rank) continue;
        memcpy(g->primary[me->rank].row_data + g->start[q], g->primary[q].row_data + g->start[q], (size_t)g->len[q]);
        memcpy(g->primary[me->rank].col_data + g->start[q], g->primary[q].col_data + g->start[q], (size_t)g->len[q]);
    }
    pthread_barrier_wait(&g->barrier);
}

/* ---- one rank ------------------------------------------------------------ */

static const float *full_master; /* the whole master; rank r holds a slice of it */

static void *rank_main(void *arg) {
    rank_ctx *me = (rank_ctx *)arg;
    group *g = me->g;
    mxs_tensor w = g->primary[me->rank]; /* this rank's copy of the primary */
    const float *my_shard_f32 = full_master + g->start[me->rank];
    int64_t start = g->start[me->rank], len = g->len[me->rank];
    mxs_wb_item item;
    mxs_wb_batch batch;
    mxs_wb_plan plan;
    uint8_t *packed;
    mxs_status s;

    /* [writeback] */
    memset(&item, 0, sizeof item); /* zero means default, for every field */
    item.primary = w;              /* this rank's copy of the primary */
    item.master = my_shard_f32;    /* len elements; element 0 is flat index start */
    item.master_dtype = MXS_F32;
    item.start = start; /* any range; len may be 0 */
    item.len = len;

    memset(&batch, 0, sizeof batch);
    batch.items = &item;
    batch.n_items = 1;
    batch.round_through = MXS_BF16; /* as TE: writeback == BF16 copy-back, byte for byte */

    /* The same plan on every rank. In training: plan once, keep plan and buffer. */
    s = mxs_wb_make_plan(&batch, &plan, NULL);
    if (s != MXS_OK) {
        fprintf(stderr, "rank %d: mxs_wb_make_plan: %s\n", me->rank, mxs_status_str(s));
        /* a real rank must still join the collective: mxs_host_wb_writeback
           does that for a batch it rejects, see docs/contract.md 4.5 */
        me->failed = 1;
        return NULL;
    }
    packed = (uint8_t *)malloc((size_t)plan.packed_bytes);
    if (!packed) {
        me->failed = 1;
        return NULL;
    }
    /* partial exponents (1 byte per block) -> ONE all-reduce MAX over uint8 -> apply */
    s = mxs_host_wb_writeback(&batch, &plan, packed, group_allreduce_max_u8, me);
    if (s != MXS_OK) {
        fprintf(stderr, "rank %d: mxs_host_wb_writeback: %s\n", me->rank, mxs_status_str(s));
        me->failed = 1;
    }
    free(packed);
    /* then all-gather each present data plane; the scales are already complete */
    /* [/writeback] */
    group_allgather(me);
    return NULL;
}

/* ---- main: set up the group, run it, check every rank -------------------- */

static mxs_tensor new_primary(void) { /* bidirectional, TE's padded scale layout */
    mxs_tensor w;
    memset(&w, 0, sizeof w);
    w.rows = ROWS;
    w.cols = COLS;
    w.dirs = MXS_BOTH;
    w.scale_layout = MXS_SCALES_PADDED;
    w.row_data = (uint8_t *)calloc(ROWS * COLS, 1);
    w.col_data = (uint8_t *)calloc(ROWS * COLS, 1);
    w.row_scale = (uint8_t *)calloc((size_t)mxs_scale_bytes(&w, MXS_ROWWISE), 1);
    w.col_scale = (uint8_t *)calloc((size_t)mxs_scale_bytes(&w, MXS_COLWISE), 1);
    return w;
}

static int primary_ok(const mxs_tensor *w) { return w->row_data && w->col_data && w->row_scale && w->col_scale; }

static void free_primary(mxs_tensor *w) {
    free(w->row_data);
    free(w->col_data);
    free(w->row_scale);
    free(w->col_scale);
}

int main(void) {
    static float master[ROWS * COLS];
    static uint16_t master_bf16[ROWS * COLS];
    const int64_t cuts[NRANKS + 1] = {0, 1001, 2047, ROWS * COLS}; /* shard boundaries, mid-block */
    static group g;
    rank_ctx ctx[NRANKS];
    pthread_t thread[NRANKS];
    mxs_tensor whole;
    mxs_status s;
    int64_t i;
    int r, bad = 0;

    for (i = 0; i < ROWS * COLS; i++) master[i] = (float)((i * 37) % 1001) / 100.0f - 5.0f + (float)(i / COLS);
    full_master = master;
    if (pthread_barrier_init(&g.barrier, NULL, NRANKS) != 0) return 1;
    for (r = 0; r < NRANKS; r++) {
        g.primary[r] = new_primary();
        if (!primary_ok(&g.primary[r])) return 1;
        g.start[r] = cuts[r];
        g.len[r] = cuts[r + 1] - cuts[r];
        ctx[r].g = &g;
        ctx[r].rank = r;
        ctx[r].failed = 0;
    }
    for (r = 0; r < NRANKS; r++)
        if (pthread_create(&thread[r], NULL, rank_main, &ctx[r]) != 0) return 1;
    for (r = 0; r < NRANKS; r++) pthread_join(thread[r], NULL);

    /* The check: quantizing bf16(master) whole gives the same bytes on every rank. */
    whole = new_primary();
    if (!primary_ok(&whole)) return 1;
    for (i = 0; i < ROWS * COLS; i++) master_bf16[i] = mxs_bf16_from_f32(master[i]);
    s = mxs_host_quantize(&whole, master_bf16, MXS_BF16, MXS_ROUND_CEIL);
    if (s != MXS_OK) {
        fprintf(stderr, "mxs_host_quantize: %s\n", mxs_status_str(s));
        return 1;
    }
    for (r = 0; r < NRANKS; r++) {
        const mxs_tensor *w = &g.primary[r];
        bad |= ctx[r].failed;
        bad |= memcmp(w->row_data, whole.row_data, ROWS * COLS) != 0;
        bad |= memcmp(w->col_data, whole.col_data, ROWS * COLS) != 0;
        bad |= memcmp(w->row_scale, whole.row_scale, (size_t)mxs_scale_bytes(w, MXS_ROWWISE)) != 0;
        bad |= memcmp(w->col_scale, whole.col_scale, (size_t)mxs_scale_bytes(w, MXS_COLWISE)) != 0;
        free_primary(&g.primary[r]);
    }
    printf("writeback: %d ranks, %d x %d weight (row + column planes), shards cut mid-block: %s\n", NRANKS, ROWS, COLS,
           bad ? "MISMATCH" : "every rank identical to whole-tensor quantize");
    free_primary(&whole);
    pthread_barrier_destroy(&g.barrier);
    return bad;
}
