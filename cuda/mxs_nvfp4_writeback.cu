/* SPDX-License-Identifier: MIT */
/* cuda/mxs_nvfp4_writeback.cu - the NVFP4 writeback on the GPU, host side
 * (<mxshard/cuda_nvfp4.h>): the unprepared phase calls
 * (mxs_cuda_nvfp4_wb_partial / _apply / _finish), mxs_cuda_nvfp4_stage_to_col
 * and the prepared bucket (mxs_cuda_nvfp4_wb_prepare, _bucket_partial /
 * _apply / _finish, _release).
 *
 * Every call validates with the host library's own check before anything is
 * enqueued, turns each item into its work record (NvItem, mxs_nvfp4_wb.cuh:
 * the entries of its packed slot, its tiles and units in the phase) and
 * launches the phase's kernel (mxs_nvfp4_wb_partial.cu, _apply.cu,
 * _finish.cu):
 *
 *   unprepared   the records as kernel parameters, MXS_CUDA_NVFP4_CHUNK items
 *                per launch (partial: after one memset of the packed buffer)
 *   prepared     the records of every phase stored once in the caller's
 *                workspace, one launch per phase for any number of items:
 *
 *     workspace  | partial: n x NvItem | apply: n x NvItem | finish: n x NvItem |
 *                ^16-byte aligned
 *
 * Nothing is allocated and nothing synchronises: every call can be captured
 * in a CUDA graph.
 */
#include <cuda_runtime.h>

#include <string.h>

#include <mxshard/cuda_nvfp4.h>

#include "mxs_launch.cuh"
#include "mxs_nvfp4_wb.cuh"

using namespace mxs__cu;

namespace {

/* The load specialisation for master dtype dt (-1: mixed) and round-through
 * rt (mxs_nvfp4_wb.cuh). */
int nv_wb_spec(int dt, int rt) {
    if (dt < 0) return NV_ANY;
    const int e = nv_eff_rt(dt, rt);
    if (dt == MXS_F32) return e == MXS_BF16 ? NV_F32_BF16 : e == MXS_F16 ? NV_F32_F16 : NV_F32;
    if (e != MXS_F32) return NV_ANY;
    return dt == MXS_BF16 ? NV_BF16 : NV_F16;
}

/* Phase ph over chunk C (C != NULL) or the table `it`: its kernel. */
void nv_wb_launch(int ph, int spec, unsigned grid, cudaStream_t stream, const NvChunk *C, const NvHead &h,
                  const NvItem *it) {
    if (ph == PH_PARTIAL)
        nv_wb_launch_partial(spec, grid, stream, C, h, it);
    else if (ph == PH_APPLY)
        nv_wb_launch_apply(spec, grid, stream, C, h, it);
    else
        nv_wb_launch_finish(grid, stream, C, h, it);
}

/* Whether plane byte 0 of an output whose byte 0 is plane nibble `base`
 * (even) is 4-byte aligned: (address - base/2) % 4 == 0, in integers (no
 * pointer outside the output is formed). nv_put8's 32-bit stores are at
 * plane bytes that are multiples of 4. */
int nv_st4(const void *out, int64_t base) {
    return out == nullptr || ((uintptr_t)out - (uintptr_t)(base / 2)) % 4u == 0;
}

/* A finish record transposing src (rows x cols, row-major nibbles) into the
 * column-wise plane dst: finish's kernels, for items and for
 * mxs_cuda_nvfp4_stage_to_col. */
void nv_transpose_record(int64_t rows, int64_t cols, const uint8_t *src, uint8_t *dst, NvItem *I) {
    I->rows = rows;
    I->cols = cols;
    I->n = rows * cols;
    I->dirs = MXS_COLWISE;
    I->data[1] = dst;
    I->stage = const_cast<uint8_t *>(src);
    I->ctiles = mxs_ceil_div(cols, kNvTileCols);
    I->finish = 1;
}

/* Item `in` (validated) as a chunk record, its entries at slot `sl`. */
void nv_item_make(const mxs_nvfp4_wb_item *in, const mxs_nvfp4_wb_slot *sl, NvItem *I) {
    const mxs_nvfp4_tensor *t = &in->primary;
    memset(I, 0, sizeof *I);
    I->rows = t->rows;
    I->cols = t->cols;
    I->n = t->rows * t->cols;
    I->start = in->start;
    I->len = in->len;
    I->master = in->master;
    I->dirs = (int)t->dirs;
    I->two_d = t->block == MXS_NVFP4_16X16;
    I->dtype = (int)in->master_dtype;
    I->amax = t->amax;
    for (int p = 0; p < 2; p++) {
        if (!(t->dirs & (unsigned)(p + 1))) continue;
        I->data[p] = p == 0 ? t->row_data : t->col_data;
        I->scale[p] = p == 0 ? t->row_scale : t->col_scale;
        mxs_nvfp4_scale_geom_make(t->rows, t->cols, (mxs_dirs)(p + 1), t->scale_layout, &I->geom[p]);
        I->sbytes[p] = mxs_scale_geom_bytes(&I->geom[p]);
        I->sunits[p] = nv_scale_units(I->geom[p]); /* apply's scale units */
    }
    const bool row_frag = (t->dirs & MXS_ROWWISE) && in->row_fragment;
    const bool stage_frag = (t->dirs & MXS_COLWISE) && in->stage_fragment;
    if (row_frag) I->data[0] = in->row_fragment; /* fragments win over the planes */
    I->stage = (t->dirs & MXS_COLWISE) ? (stage_frag ? in->stage_fragment : in->col_stage) : nullptr;
    I->finish = mxs__nvfp4_wb_finishes(in);
    I->row_entry = sl->row_entry;
    I->col_entry = sl->col_entry;
    I->tile_entry = sl->tile_entry;
    I->amax_entry = sl->amax_entry;
    I->first_entry = sl->tile_entry >= 0 ? sl->tile_entry : (sl->row_entry >= 0 ? sl->row_entry : sl->col_entry);
    /* the item's block regions (mxs__nvfp4_wb_region): the tiles, or the present planes' */
    const mxs_wb_region rg = mxs__nvfp4_wb_region(t->rows, t->cols, MXS_ROWWISE, t->block);
    const mxs_wb_region cg = mxs__nvfp4_wb_region(t->rows, t->cols, MXS_COLWISE, t->block);
    I->n_entries = I->two_d ? rg.block_rows * rg.per_row
                            : (sl->row_entry >= 0 ? rg.block_rows * rg.per_row : 0) +
                                  (sl->col_entry >= 0 ? cg.block_rows * cg.per_row : 0);
    I->ctiles = mxs_ceil_div(t->cols, kNvTileCols);
    const int64_t es = mxs_dtype_bytes(in->master_dtype);
    I->mis = in->len > 0 &&
             (reinterpret_cast<uintptr_t>(in->master) - (uintptr_t)(in->start * es)) % 16u != 0; /* vec rule */
    I->out = (row_frag ? kOutRowFrag : 0) | (stage_frag ? kOutStageFrag : 0) |
             (nv_st4(I->data[0], row_frag ? in->start : 0) ? kOutRowSt4 : 0) |
             (nv_st4(I->stage, stage_frag ? in->start : 0) ? kOutStageSt4 : 0);
}

/* CTAs of a phase's tiles: a warp per tile, finish a CTA per tile. */
int64_t nv_tile_blocks(int ph, int64_t tiles) { return ph == PH_FINISH ? tiles : mxs_ceil_div(tiles, kNvWarps); }

/* The partial splits a row-only 1x16 item's groups into half-group tiles
 * when its shard spans at most this many whole-group tiles: a DP=8 rank of
 * 8192x8192 (2,048 tiles, ~2 warps per SM scheduler) went 15.5 -> 13.8 µs,
 * while 8192x8192 at DP=1 (16,384 tiles, several waves) went 75.2 -> 84.5
 * (twice the per-tile work for no more loads in flight; RESULTS run 18). */
constexpr int64_t kNvHalfTiles = 4096;

/* Thread units and warp tiles of item I in phase ph. */
void nv_item_work(NvItem *I, int ph, int64_t *units, int64_t *tiles) {
    *units = *tiles = 0;
    if (ph == PH_FINISH) {
        if (!I->finish) return;
        const uint8_t *src = I->stage ? I->stage : I->data[0];
        if (I->rows % MXS_NVFP4_BLOCK == 0 && I->cols % 8 == 0 && nv_aligned_to(src, 4) && nv_aligned_to(I->data[1], 8))
            *tiles = mxs_ceil_div(I->rows / MXS_NVFP4_BLOCK, kFinishGroups) * I->ctiles; /* CTA tiles */
        else
            *units = (I->n + 1) / 2;
        return;
    }
    const bool tile_path = I->cols % 8 == 0 && I->len > 0;
    if (tile_path) {
        const int64_t g0 = (I->start / I->cols) / MXS_NVFP4_BLOCK;
        const int64_t g1 = ((I->start + I->len - 1) / I->cols) / MXS_NVFP4_BLOCK;
        const int64_t full = (g1 - g0 + 1) * I->ctiles;
        /* partial of a small row-only 1x16 shard: no column or tile entry
         * needs a whole group in one lane, so half groups - twice the warps
         * and the loads in flight (kNvHalfTiles) */
        I->half = ph == PH_PARTIAL && !I->two_d && I->col_entry < 0 && full <= kNvHalfTiles;
        I->grp0 = g0;
        *tiles = full << I->half;
    }
    if (ph == PH_PARTIAL) {
        if (!tile_path && I->len > 0) *units = I->n_entries;
        return;
    }
    const int64_t db =
        !tile_path && I->len > 0 && (I->data[0] || I->stage) ? (I->start + I->len + 1) / 2 - I->start / 2 : 0;
    *units = I->sunits[0] + I->sunits[1] + db;
}

/* The launch header of a validated batch (units and tiles: 0). */
NvHead nv_head(const mxs_nvfp4_wb_batch *b, const mxs_nvfp4_wb_plan *plan, const void *packed) {
    NvHead h;
    memset(&h, 0, sizeof h);
    h.rt = (int)b->round_through;
    h.w = plan->entry_bytes;
    h.packed = const_cast<void *>(packed);
    h.status_offset = plan->status_offset;
    return h;
}

/* Records of items [i0, i1) for phase ph into it[0 ..), their units and
 * tiles numbered on from h->units / h->tiles; *at: the running entry index
 * (b->n_items before item 0). */
void nv_items_build(const mxs_nvfp4_wb_batch *b, int64_t i0, int64_t i1, int ph, int64_t *at, NvHead *h, NvItem *it) {
    for (int64_t i = i0; i < i1; i++) {
        mxs_nvfp4_wb_slot sl;
        NvItem &I = it[i - i0];
        mxs__nvfp4_packed_slot(&b->items[i].primary, i, at, &sl);
        nv_item_make(&b->items[i], &sl, &I);
        nv_item_work(&I, ph, &I.units, &I.tiles);
        I.unit0 = h->units;
        I.tile0 = h->tiles;
        h->units += I.units;
        h->tiles += I.tiles;
    }
    h->tile_blocks = nv_tile_blocks(ph, h->tiles);
}

int64_t nv_blocks(const NvHead &h) { return h.tile_blocks + mxs_ceil_div(h.units, kNvThreads); }

/* The master dtype of the items [i0, i1) that have a shard (MXS_F32 when
 * none has), or -1 when they differ. */
int nv_master_dtype(const mxs_nvfp4_wb_batch *b, int64_t i0, int64_t i1) {
    int dt = -2;
    for (int64_t i = i0; i < i1; i++) {
        if (b->items[i].len <= 0) continue;
        const int d = (int)b->items[i].master_dtype;
        if (dt == -2) dt = d;
        if (dt != d) return -1;
    }
    return dt == -2 ? (int)MXS_F32 : dt;
}

/* The memset that starts every partial: the whole packed buffer. */
mxs_status nv_zero_packed(void *packed, int64_t bytes, cudaStream_t stream) {
    if (cudaMemsetAsync(packed, 0, (size_t)bytes, stream) == cudaSuccess) return MXS_OK;
    (void)cudaGetLastError();
    return MXS_ERR_CUDA;
}

/* Runs phase ph over the validated batch, chunk by chunk (partial: one
 * memset of the whole packed buffer first). */
mxs_status nv_wb_run(const mxs_nvfp4_wb_batch *b, const mxs_nvfp4_wb_plan *plan, const void *packed, int ph,
                     cudaStream_t stream) {
    NvChunk C;
    int64_t at = b->n_items;
    mxs_status s;
    if ((s = launch_begin()) != MXS_OK) return s;
    if (ph == PH_PARTIAL && (s = nv_zero_packed(const_cast<void *>(packed), plan->packed_bytes, stream)) != MXS_OK)
        return s;
    for (int64_t i0 = 0; i0 < b->n_items; i0 += kChunk) {
        const int64_t i1 = b->n_items - i0 < kChunk ? b->n_items : i0 + kChunk;
        memset(&C, 0, sizeof C);
        C.h = nv_head(b, plan, packed);
        C.h.n = i1 - i0;
        nv_items_build(b, i0, i1, ph, &at, &C.h, C.it);
        const unsigned grid = grid_for(nv_blocks(C.h));
        const int spec = nv_wb_spec(nv_master_dtype(b, i0, i1), (int)b->round_through);
        if (grid > 0) nv_wb_launch(ph, spec, grid, stream, &C, C.h, nullptr);
        if ((s = launch_end()) != MXS_OK) return s;
    }
    return launch_end();
}

/* ---- the prepared bucket ------------------------------------------------------------ */

constexpr int kNvPhases = 3;

/* Copies n records (kernel parameters) to dst: prepare's table stores. */
__global__ void __launch_bounds__(kNvThreads)
    nv_table_store(const __grid_constant__ NvChunk C, NvItem *dst, int64_t n) {
    const uint32_t *src = reinterpret_cast<const uint32_t *>(C.it);
    uint32_t *d = reinterpret_cast<uint32_t *>(dst);
    const int64_t words = n * (int64_t)(sizeof(NvItem) / 4);
    for (int64_t i = threadIdx.x; i < words; i += blockDim.x) d[i] = src[i];
}
static_assert(sizeof(NvItem) % 16 == 0, "table records keep 16-byte alignment");

/* Workspace of a bucket of n items: one record per item and phase. */
mxs_status nv_bucket_bytes(int64_t n, int64_t *bytes) {
    return mxs_mul_ok(n, (int64_t)(kNvPhases * sizeof(NvItem)), bytes) ? MXS_OK : MXS_ERR_OVERFLOW;
}

/* FNV-1a over every field after `check`. */
uint64_t nv_bucket_hash(const mxs_cuda_nvfp4_wb_bucket *bk) {
    uint64_t h = 0xCBF29CE484222325ull;
    h = mxs__fnv_u64(h, (uint64_t)bk->n_items);
    h = mxs__fnv_u64(h, (uint64_t)(uintptr_t)bk->packed);
    h = mxs__fnv_u64(h, (uint64_t)bk->packed_bytes);
    h = mxs__fnv_u64(h, (uint64_t)bk->entry_bytes);
    h = mxs__fnv_u64(h, (uint64_t)bk->status_offset);
    for (int p = 0; p < kNvPhases; p++) {
        h = mxs__fnv_u64(h, (uint64_t)(uintptr_t)bk->table[p]);
        h = mxs__fnv_u64(h, (uint64_t)bk->units[p]);
        h = mxs__fnv_u64(h, (uint64_t)bk->tiles[p]);
    }
    h = mxs__fnv_u64(h, (uint64_t)(int64_t)bk->round_through);
    h = mxs__fnv_u64(h, (uint64_t)(int64_t)bk->load_spec);
    h = mxs__fnv_u64(h, (uint64_t)(int64_t)bk->device);
    return h;
}

/* The header of a prepared bucket's phase. */
NvHead nv_bucket_head(const mxs_cuda_nvfp4_wb_bucket *bk, int ph) {
    NvHead h;
    memset(&h, 0, sizeof h);
    h.n = bk->n_items;
    h.rt = bk->round_through;
    h.w = bk->entry_bytes;
    h.packed = bk->packed;
    h.status_offset = bk->status_offset;
    h.units = bk->units[ph];
    h.tiles = bk->tiles[ph];
    h.tile_blocks = nv_tile_blocks(ph, h.tiles);
    return h;
}

/* A phase call's checks and launches: a prepared, unmodified bucket on the
 * device it was prepared on, no CUDA error pending; partial: the memset,
 * then one kernel; apply, finish: one kernel (none without work). */
mxs_status nv_bucket_run(const mxs_cuda_nvfp4_wb_bucket *bk, int ph, cudaStream_t stream) {
    int device;
    mxs_status s;
    if (!bk || bk->magic != MXS_CUDA_NVFP4_WB_BUCKET_MAGIC || bk->check != nv_bucket_hash(bk))
        return MXS_ERR_INVALID_ARGUMENT;
    if (launch_begin() != MXS_OK) return MXS_ERR_CUDA; /* peek before any other runtime call */
    if (cudaGetDevice(&device) != cudaSuccess) {
        (void)cudaGetLastError();
        return MXS_ERR_CUDA;
    }
    if (device != bk->device) return MXS_ERR_INVALID_ARGUMENT;
    if (ph == PH_PARTIAL && (s = nv_zero_packed(bk->packed, bk->packed_bytes, stream)) != MXS_OK) return s;
    const NvHead h = nv_bucket_head(bk, ph);
    const NvItem *table = static_cast<const NvItem *>(bk->table[ph]);
    const unsigned grid = grid_for(nv_blocks(h));
    if (grid > 0) nv_wb_launch(ph, bk->load_spec, grid, stream, nullptr, h, table);
    return launch_end();
}

} /* namespace */

/* ---- C ABI -------------------------------------------------------------------------- */

extern "C" {

mxs_status mxs_cuda_nvfp4_wb_partial(const mxs_nvfp4_wb_batch *b, const mxs_nvfp4_wb_plan *plan, void *packed,
                                     cudaStream_t stream) {
    mxs_status s = mxs__nvfp4_wb_check_phase(b, plan, packed);
    if (s != MXS_OK) return s;
    return nv_wb_run(b, plan, packed, PH_PARTIAL, stream);
}

mxs_status mxs_cuda_nvfp4_wb_apply(const mxs_nvfp4_wb_batch *b, const mxs_nvfp4_wb_plan *plan, const void *packed,
                                   cudaStream_t stream) {
    mxs_status s = mxs__nvfp4_wb_check_phase(b, plan, packed);
    if (s != MXS_OK) return s;
    return nv_wb_run(b, plan, packed, PH_APPLY, stream);
}

mxs_status mxs_cuda_nvfp4_wb_finish(const mxs_nvfp4_wb_batch *b, const mxs_nvfp4_wb_plan *plan, cudaStream_t stream) {
    mxs_status s = mxs__nvfp4_wb_check_plan(b, plan);
    if (s != MXS_OK) return s;
    if (b->n_items == 0) return MXS_OK;
    return nv_wb_run(b, plan, nullptr, PH_FINISH, stream);
}

mxs_status mxs_cuda_nvfp4_stage_to_col(const mxs_nvfp4_tensor *t, const uint8_t *stage, cudaStream_t stream) {
    mxs_status s = mxs_nvfp4_stage_to_col_check(t, stage);
    if (s != MXS_OK) return s;
    if ((s = launch_begin()) != MXS_OK) return s;
    NvChunk C; /* one finish record as a kernel parameter, as in nv_wb_run */
    memset(&C, 0, sizeof C);
    NvItem &I = C.it[0];
    nv_transpose_record(t->rows, t->cols, stage, t->col_data, &I);
    nv_item_work(&I, PH_FINISH, &I.units, &I.tiles);
    C.h.n = 1;
    C.h.units = I.units;
    C.h.tiles = I.tiles;
    C.h.tile_blocks = nv_tile_blocks(PH_FINISH, I.tiles);
    nv_wb_launch(PH_FINISH, NV_ANY, grid_for(nv_blocks(C.h)), stream, &C, C.h, nullptr);
    return launch_end();
}

size_t mxs_cuda_nvfp4_wb_bucket_size(void) { return sizeof(mxs_cuda_nvfp4_wb_bucket); }

mxs_status mxs_cuda_nvfp4_wb_prepare_bytes(const mxs_nvfp4_wb_batch *b, int64_t *workspace_bytes) {
    mxs_nvfp4_wb_plan plan;
    mxs_status s;
    if (!workspace_bytes) return MXS_ERR_INVALID_ARGUMENT;
    if ((s = mxs_nvfp4_wb_make_plan(b, &plan, NULL)) != MXS_OK) return s;
    return nv_bucket_bytes(b->n_items, workspace_bytes);
}

mxs_status mxs_cuda_nvfp4_wb_prepare(mxs_cuda_nvfp4_wb_bucket *bucket, const mxs_nvfp4_wb_batch *b,
                                     const mxs_nvfp4_wb_plan *plan, void *packed, void *workspace,
                                     int64_t workspace_bytes, cudaStream_t stream) {
    mxs_cuda_nvfp4_wb_bucket bk;
    int64_t need = 0;
    mxs_status s;
    if (!bucket) return MXS_ERR_INVALID_ARGUMENT;
    memset(bucket, 0, sizeof *bucket);
    memset(&bk, 0, sizeof bk);
    /* the planned batch; packed non-NULL, aligned, over no buffer of it */
    if ((s = mxs__nvfp4_wb_check_phase(b, plan, packed)) != MXS_OK) return s;
    if ((s = nv_bucket_bytes(b->n_items, &need)) != MXS_OK) return s;
    if (need > 0 && (!workspace || !aligned(workspace, 16))) return MXS_ERR_INVALID_ARGUMENT;
    if (workspace_bytes < need) return MXS_ERR_BUFFER_SIZE;
    if (mxs__overlap(packed, plan->packed_bytes, workspace, need)) return MXS_ERR_ALIASING;
    if ((s = mxs_nvfp4_wb_check_buffer(b, workspace, need)) != MXS_OK) return s;
    if ((s = launch_begin()) != MXS_OK) return s;
    if (cudaGetDevice(&bk.device) != cudaSuccess) {
        (void)cudaGetLastError();
        return MXS_ERR_CUDA;
    }
    bk.n_items = b->n_items;
    bk.packed = packed;
    bk.packed_bytes = plan->packed_bytes;
    bk.entry_bytes = plan->entry_bytes;
    bk.status_offset = plan->status_offset;
    bk.round_through = (int)b->round_through;
    bk.load_spec = nv_wb_spec(nv_master_dtype(b, 0, b->n_items), (int)b->round_through);
    for (int ph = 0; ph < kNvPhases; ph++) {
        NvItem *dev = static_cast<NvItem *>(workspace) + (int64_t)ph * b->n_items;
        NvHead h = nv_head(b, plan, packed);
        int64_t at = b->n_items;
        NvChunk C; /* ~30 KB: the records travel to the table as kernel parameters */
        for (int64_t i0 = 0; i0 < b->n_items; i0 += kChunk) {
            const int64_t i1 = b->n_items - i0 < kChunk ? b->n_items : i0 + kChunk;
            memset(&C, 0, sizeof C);
            nv_items_build(b, i0, i1, ph, &at, &h, C.it);
            nv_table_store<<<1, kNvThreads, 0, stream>>>(C, dev + i0, i1 - i0);
            if ((s = launch_end()) != MXS_OK) return s;
        }
        bk.table[ph] = b->n_items > 0 ? dev : nullptr;
        bk.units[ph] = h.units;
        bk.tiles[ph] = h.tiles;
    }
    bk.check = nv_bucket_hash(&bk);
    bk.magic = MXS_CUDA_NVFP4_WB_BUCKET_MAGIC;
    *bucket = bk;
    return MXS_OK;
}

mxs_status mxs_cuda_nvfp4_wb_bucket_partial(const mxs_cuda_nvfp4_wb_bucket *bucket, cudaStream_t stream) {
    return nv_bucket_run(bucket, PH_PARTIAL, stream);
}

mxs_status mxs_cuda_nvfp4_wb_bucket_apply(const mxs_cuda_nvfp4_wb_bucket *bucket, cudaStream_t stream) {
    return nv_bucket_run(bucket, PH_APPLY, stream);
}

mxs_status mxs_cuda_nvfp4_wb_bucket_finish(const mxs_cuda_nvfp4_wb_bucket *bucket, cudaStream_t stream) {
    return nv_bucket_run(bucket, PH_FINISH, stream);
}

mxs_status mxs_cuda_nvfp4_wb_bucket_release(mxs_cuda_nvfp4_wb_bucket *bucket) {
    if (!bucket) return MXS_ERR_INVALID_ARGUMENT;
    memset(bucket, 0, sizeof *bucket);
    return MXS_OK;
}

} /* extern "C" */
