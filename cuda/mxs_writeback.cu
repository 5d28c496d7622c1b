/* SPDX-License-Identifier: MIT */
/* cuda/mxs_writeback.cu - the writeback on the GPU: the prepared bucket
 * (mxs_cuda_wb_prepare, _bucket_partial, _bucket_apply, _release) and the
 * one-shot wrappers mxs_cuda_wb_partial / _apply (<mxshard/cuda.h>).
 *
 * prepare validates the batch once, turns every item into its work-list
 * record (wb_item_make: the item -> job rule of writeback.h, mxs__wb_job,
 * plus the tile schedule of the phase) and stores the records into the
 * caller's workspace:
 *
 *   workspace  | partial work list: n x WbItem | apply work list: n x WbItem |
 *              ^16-byte aligned
 *
 * The phase calls read nothing but the bucket and launch the kernels of
 * mxs_wb_kernels.cuh on that list, through the launchers of mxs_wb_list.cuh:
 * this unit compiles no writeback kernel (the mxs_wb_*.cu units do, in
 * parallel), only the copy kernel of prepare (table_store). No state outside
 * the caller's objects.
 */
#include <cuda_runtime.h>

#include <string.h>

#include <mxshard/cuda.h>

#include "mxs_launch.cuh"
#include "mxs_wb_list.cuh"

using namespace mxs__cu;

namespace mxs__cu {

/* The work list's way to the workspace: kStoreItems records per launch, as
 * 32-bit words from the kernel's parameter block (mxs_wb_list.cuh). */
__global__ void __launch_bounds__(kThreads) table_store(const __grid_constant__ WbStore P, WbItem *dst, int64_t n) {
    const uint32_t *src = reinterpret_cast<const uint32_t *>(P.items);
    uint32_t *out = reinterpret_cast<uint32_t *>(dst);
    const int64_t words = n * (int64_t)(sizeof(WbItem) / 4);
    for (int64_t k = threadIdx.x; k < words; k += kThreads) out[k] = src[k];
}

} /* namespace mxs__cu */

namespace {

enum { PHASE_PARTIAL = 0, PHASE_APPLY = 1, PHASES = 2 };
enum { WANT_PARTIAL = 1u << PHASE_PARTIAL, WANT_APPLY = 1u << PHASE_APPLY, WANT_BOTH = WANT_PARTIAL | WANT_APPLY };

/* ---- the work-list record of one item ------------------------------------ */

/* The short last group of a weight (rows % 32 in 1..16: a bucket of 40- or
 * 41-row weights) goes to the interior kernel in units of 8 x 512 or
 * 16 x 256 (interior_wide_tile: four loads in flight per thread instead of
 * one or two); false: one clipped 32 x 128 tile per unit. */
constexpr bool kWideShortGroups = true;

/* Vector loads that are only element-aligned (see wb_item_make) are
 * allowed; false sends such items to scalar loads, as before. */
constexpr bool kMisalignedLoads = true;

/* Item `in` as the work-list record of phase `mode` (MXS__JOB_PARTIAL or
 * MXS__JOB_APPLY). ro / co: its offsets in the packed buffer
 * (mxs__packed_slot; -1: plane absent). *mis: its vector loads are only
 * element-aligned. The item is validated. */
void wb_item_make(const mxs_wb_batch *b, const mxs_wb_item *in, int mode, uint8_t *packed, int64_t ro, int64_t co,
                  WbItem *w, bool *mis, bool *edges) {
    const mxs_tensor *t = &in->primary;
    memset(w, 0, sizeof *w);
    mxs__job &J = w->job;
    mxs__wb_job(b, in, mode, ro >= 0 ? packed + ro : nullptr, co >= 0 ? packed + co : nullptr, &J);

    /* The vector path: a thread loads the 8 elements at flat index f (f a
     * multiple of 8 when cols is) as 16 bytes (f32: 32) from master + (f -
     * start) * eb, and stores 8 bytes at out[p] + (f - out_base[p]). The
     * stores need out[p] - out_base[p] 8-byte aligned. The loads are
     * aligned for every such f exactly when master - start * eb is 16-byte
     * aligned (a shard starting anywhere whose master is laid out like the
     * whole weight); otherwise, with kMisalignedLoads, they are read as
     * element-aligned 16-byte loads (ld16_elems): the item sets *mis and the
     * bucket runs the MIS kernels. Shards starting off the 8-element grid
     * then keep the interior tiles and vector loads instead of falling back
     * to scalar loads for the whole item. */
    const int64_t eb = mxs_dtype_bytes(in->master_dtype);
    const uintptr_t src_origin = reinterpret_cast<uintptr_t>(in->master) - (uintptr_t)in->start * (uintptr_t)eb;
    const bool ld_aligned = in->len == 0 || src_origin % 16 == 0;
    const bool ld_elem_aligned = in->len == 0 || src_origin % (uintptr_t)(eb == 4 ? 4 : 2) == 0;
    bool vec = t->cols % 8 == 0 && (ld_aligned || (kMisalignedLoads && ld_elem_aligned));
    for (int p = 0; p < 2; p++)
        if (t->dirs & (unsigned)(p + 1))
            vec = vec && (reinterpret_cast<uintptr_t>(J.out[p]) - (uintptr_t)J.out_base[p]) % 8 == 0;
    J.vec = vec;
    *mis = vec && !ld_aligned;

    const bool fused = b->mode == MXS_WB_FUSED;
    const mxs_range gr = mxs_shard_groups(t->cols, in->start, in->len);
    const int64_t g_first = gr.first, g_last = gr.first + gr.count - 1;
    int64_t ga = g_last + 1, gb = g_last + 1;
    /* the lean path: every touched group's whole tile columns go to the
     * interior kernel, masked in the (at most two) groups the edges cut */
    const bool lean = mode == MXS__JOB_PARTIAL && fused && vec && in->len > 0 && t->cols >= kTileCols;
    if (lean) {
        int64_t group_elems;
        if (mxs_mul_ok(t->cols, MXS_BLOCK, &group_elems)) {
            int64_t a = mxs_ceil_div(in->start, group_elems), z = (in->start + in->len) / group_elems;
            z = z < t->rows / MXS_BLOCK ? z : t->rows / MXS_BLOCK;
            /* a last group of fewer than 32 rows is wholly inside when the
             * shard runs to the end; the interior kernel clips its rows */
            if (in->start + in->len == t->rows * t->cols) z = mxs_col_groups(t->rows);
            if (z > a) {
                ga = a;
                gb = z;
            }
        }
    }
    w->T = mxs_ceil_div(t->cols, kTileCols);
    int ns = 0; /* fused apply: the edge spans made */
    if (mode == MXS__JOB_PARTIAL || !fused) {
        w->g_first = g_first;
        w->g_last = g_last;
        w->ga = ga;
        w->gb = gb;
        const int64_t ngroups = g_last - g_first + 1;
        if (lean) {
            w->T_int = t->cols / kTileCols;
            w->int_units = ngroups * w->T_int;
            *edges = w->T_int > 0 && (g_first < ga || g_last >= gb);
        }
        w->tile_units = ngroups * (w->T - w->T_int);
        w->wide_from = w->int_units;
        /* a short last group (at most kTY rows) wholly inside: the shard
         * runs to the end, so gb - 1 = g_last; in units of 4 tile columns
         * (interior_wide_tile) */
        const int64_t short_rows = t->rows - (gb - 1) * MXS_BLOCK;
        if (kWideShortGroups && lean && gb > ga && short_rows <= 2 * kTY) {
            w->wide_rpt = short_rows <= kTY ? 1 : 2;
            w->wide_from = (gb - 1 - g_first) * w->T_int;
            w->int_units = w->wide_from + mxs_ceil_div(w->T_int, 4 / w->wide_rpt);
        }
    } else if (t->dirs == MXS_ROWWISE) {
        /* fused apply, row-only: only the row blocks of start and end-1 can
         * straddle; each is an edge span of its own (one row, its columns),
         * cast in wb_scales_kernel (mxs_wb_edges.cuh) */
        if (in->len > 0) {
            const int64_t ba = mxs_row_block_of(t->cols, in->start);
            const int64_t bz = mxs_row_block_of(t->cols, in->start + in->len - 1);
            const int64_t b[2] = {ba, bz};
            for (int k = 0; k < (ba == bz ? 1 : 2); k++) {
                if (mxs_row_block_inside(t->cols, b[k], in->start, in->len)) continue;
                const mxs_range sp = mxs_row_block_span(t->cols, b[k]);
                const int64_t r = sp.first / t->cols, c = sp.first % t->cols;
                w->span[ns++] = edge_span_make(r, r + 1, c, c + sp.count);
            }
        }
    } else {
        /* fused apply with a column-wise plane: the edge groups that hold a
         * straddling block (a row block of start / end-1 or a column block
         * of g_first / g_last), i.e. whose edge is not a group boundary;
         * each is an edge span (its rows, every column) */
        int64_t u[2] = {0, 0};
        int n = 0;
        if (gr.count > 0) {
            const int64_t cols = t->cols, a = in->start, e = in->start + in->len;
            const bool sa = a % cols != 0 || (a / cols) % MXS_BLOCK != 0;
            const bool sz = e % cols != 0 || (e / cols != t->rows && (e / cols) % MXS_BLOCK != 0);
            if (gr.count == 1) {
                if (sa || sz) u[n++] = g_first;
            } else {
                if (sa) u[n++] = g_first;
                if (sz) u[n++] = g_last;
            }
        }
        for (int k = 0; k < n; k++) {
            const int64_t r0 = u[k] * MXS_BLOCK, r1 = r0 + MXS_BLOCK < t->rows ? r0 + MXS_BLOCK : t->rows;
            w->span[ns++] = edge_span_make(r0, r1, 0, t->cols);
        }
    }
    if (mode == MXS__JOB_PARTIAL) {
        /* zero what the touched groups' tiles do not write */
        const int64_t gfirst = w->g_first, gcount = w->g_last - w->g_first + 1;
        int q = 0;
        if (t->dirs & MXS_ROWWISE) {
            int64_t K = J.geom[0].K, rb = gfirst * MXS_BLOCK;
            int64_t re = (gfirst + gcount) * MXS_BLOCK;
            re = gcount == 0 ? 0 : (re < t->rows ? re : t->rows);
            if (gcount == 0) rb = 0;
            w->zero_ptr[q] = packed + ro;
            w->zero_len[q++] = rb * K;
            w->zero_ptr[q] = packed + ro + re * K;
            w->zero_len[q++] = (t->rows - re) * K;
        }
        if (t->dirs & MXS_COLWISE) {
            int64_t Kc = J.geom[1].K, g0 = gcount == 0 ? 0 : gfirst, ge = gcount == 0 ? 0 : gfirst + gcount;
            w->zero_ptr[q] = packed + co;
            w->zero_len[q++] = g0 * t->cols;
            w->zero_ptr[q] = packed + co + ge * t->cols;
            w->zero_len[q++] = (Kc - ge) * t->cols;
        }
        w->extra_units = 0;
        for (int k = 0; k < q; k++) w->extra_units += zero_units(w->zero_ptr[k], w->zero_len[k]);
    } else {
        /* every scale byte of the primary's planes (mxs_scale_write.cuh) */
        for (int p = 0; p < 2; p++) {
            const mxs_dirs pl = p == 0 ? MXS_ROWWISE : MXS_COLWISE;
            if (!(t->dirs & (unsigned)pl)) continue;
            mxs_scale_geom gd;
            mxs_scale_geom_make(t->rows, t->cols, pl, t->scale_layout, &gd);
            w->sw[p] = scale_write_make(p == 0 ? t->row_scale : t->col_scale, J.scale[p], gd, J.geom[p]);
        }
        /* the scale units, then the edge spans' units, have their own
         * numbering (int_begin / int_units, unused otherwise in apply) and
         * kernel: wb_scales_kernel */
        w->int_units = w->sw[0].units + w->sw[1].units + edge_span_units(w->span[0]) + edge_span_units(w->span[1]);
        w->extra_units = 0;
    }
}

/* ---- validation of the buffers the bucket adds ----------------------------- */

/* Workspace bytes of a bucket of n items (both phases' work lists). */
mxs_status bucket_bytes(int64_t n, int64_t *bytes) {
    const int64_t per_item = PHASES * (int64_t)sizeof(WbItem);
    if (n < 0) return MXS_ERR_INVALID_ARGUMENT;
    if (n > INT64_MAX / per_item) return MXS_ERR_OVERFLOW;
    *bytes = n * per_item;
    return MXS_OK;
}

/* ---- the bucket -------------------------------------------------------------- */

/* FNV-1a over every field after `check`: a bucket that was modified (or
 * never prepared) does not match. */
uint64_t bucket_hash(const mxs_cuda_wb_bucket *bk) {
    uint64_t h = 0xCBF29CE484222325ull;
    h = mxs__fnv_u64(h, (uint64_t)bk->n_items);
    h = mxs__fnv_u64(h, (uint64_t)(uintptr_t)bk->packed);
    h = mxs__fnv_u64(h, (uint64_t)bk->packed_bytes);
    h = mxs__fnv_u64(h, (uint64_t)bk->status_offset);
    for (int p = 0; p < PHASES; p++) {
        h = mxs__fnv_u64(h, (uint64_t)(uintptr_t)bk->table[p]);
        h = mxs__fnv_u64(h, (uint64_t)bk->units[p]);
        h = mxs__fnv_u64(h, (uint64_t)bk->int_units[p]);
        h = mxs__fnv_u64(h, (uint64_t)bk->tile_units[p]);
    }
    h = mxs__fnv_u64(h, (uint64_t)(int64_t)bk->device);
    h = mxs__fnv_u64(h, (uint64_t)(int64_t)bk->row_only);
    h = mxs__fnv_u64(h, (uint64_t)(int64_t)bk->misaligned);
    h = mxs__fnv_u64(h, (uint64_t)(int64_t)bk->edges);
    h = mxs__fnv_u64(h, (uint64_t)(int64_t)bk->wide_cols);
    return h;
}

/* Builds the work list of phase `mode` and stores it at `dev` (kStoreItems
 * records per table_store launch); returns the unit counts. */
mxs_status table_build(const mxs_wb_batch *b, const mxs_wb_plan *plan, uint8_t *packed, int mode, WbItem *dev,
                       cudaStream_t stream, int64_t *units, int64_t *int_units, int64_t *tile_units, int *misaligned,
                       int *has_edges, int *wide_cols) {
    WbStore chunk; /* ~30 KB on the host stack, copied into the launch's parameters */
    int64_t ro = 0, co = plan->row_region_bytes;
    *units = *int_units = *tile_units = 0;
    for (int64_t i0 = 0; i0 < b->n_items; i0 += kStoreItems) {
        const int64_t n = b->n_items - i0 < kStoreItems ? b->n_items - i0 : kStoreItems;
        for (int64_t j = 0; j < n; j++) {
            const mxs_wb_item *it = &b->items[i0 + j];
            int64_t row_off, col_off;
            mxs__packed_slot(&it->primary, &ro, &co, &row_off, &col_off);
            WbItem &w = chunk.items[j];
            bool mis = false, edges = false;
            wb_item_make(b, it, mode, packed, row_off, col_off, &w, &mis, &edges);
            if (mis) *misaligned = 1;
            if (edges) *has_edges = 1;
            if (mode == MXS__JOB_PARTIAL && (it->primary.dirs & MXS_COLWISE) && w.wide_from < w.int_units)
                *wide_cols = 1;
            w.unit_begin = *units;
            w.int_begin = *int_units;
            *units += w.tile_units + w.extra_units;
            *tile_units += w.tile_units;
            *int_units += w.int_units;
        }
        if (n < kStoreItems) memset(&chunk.items[n], 0, (size_t)(kStoreItems - n) * sizeof(WbItem));
        table_store<<<1, kThreads, 0, stream>>>(chunk, dev + i0, n);
        mxs_status s = launch_end();
        if (s != MXS_OK) return s;
    }
    return MXS_OK;
}

/* mxs_cuda_wb_prepare for the phases in `want`. */
mxs_status prepare(mxs_cuda_wb_bucket *bucket, const mxs_wb_batch *b, const mxs_wb_plan *plan, uint8_t *packed,
                   void *workspace, int64_t workspace_bytes, cudaStream_t stream, unsigned want) {
    mxs_cuda_wb_bucket bk;
    int64_t need = 0;
    int sms = 0;
    mxs_status s;
    if (!bucket) return MXS_ERR_INVALID_ARGUMENT;
    memset(bucket, 0, sizeof *bucket);
    memset(&bk, 0, sizeof bk);
    /* the batch is the one mxs_wb_make_plan validated (aliasing included): O(n) */
    if ((s = mxs__wb_check_plan(b, plan)) != MXS_OK) return s;
    if (plan->packed_bytes > 0 && !packed) return MXS_ERR_INVALID_ARGUMENT;
    if ((s = bucket_bytes(b->n_items, &need)) != MXS_OK) return s;
    if (need > 0 && (!workspace || !aligned(workspace, 16))) return MXS_ERR_INVALID_ARGUMENT;
    if (workspace_bytes < need) return MXS_ERR_BUFFER_SIZE;
    /* the buffers the bucket adds: no overlap with any buffer of the batch or each other */
    if (mxs__overlap(packed, plan->packed_bytes, workspace, need)) return MXS_ERR_ALIASING;
    if ((s = mxs_wb_check_buffer(b, packed, plan->packed_bytes)) != MXS_OK) return s;
    if ((s = mxs_wb_check_buffer(b, workspace, need)) != MXS_OK) return s;
    /* peek first: a runtime call may return (and device_sms would then
     * clear) an unrelated pending error that belongs to someone else */
    if ((s = launch_begin()) != MXS_OK) return s;
    if ((s = device_sms(&bk.device, &sms)) != MXS_OK) return s;

    bk.n_items = b->n_items;
    bk.packed = packed;
    bk.packed_bytes = plan->packed_bytes;
    bk.status_offset = plan->status_offset; /* the group status byte (the last one) */
    bk.row_only = 1;
    for (int64_t i = 0; i < b->n_items; i++) bk.row_only = bk.row_only && b->items[i].primary.dirs == MXS_ROWWISE;
    for (int p = 0; p < PHASES; p++) {
        if (!(want & (1u << p)) || b->n_items == 0) continue;
        WbItem *dev = static_cast<WbItem *>(workspace) + (int64_t)p * b->n_items;
        s = table_build(b, plan, packed, p == PHASE_PARTIAL ? MXS__JOB_PARTIAL : MXS__JOB_APPLY, dev, stream,
                        &bk.units[p], &bk.int_units[p], &bk.tile_units[p], &bk.misaligned, &bk.edges, &bk.wide_cols);
        if (s != MXS_OK) return s;
        bk.table[p] = dev;
    }
    bk.check = bucket_hash(&bk);
    bk.magic = MXS_CUDA_WB_BUCKET_MAGIC;
    *bucket = bk;
    return MXS_OK;
}

/* The checks of a phase call: a prepared, unmodified bucket of this phase,
 * on the device it was prepared on, and no CUDA error pending. */
mxs_status bucket_ready(const mxs_cuda_wb_bucket *bk, int phase) {
    int device;
    if (!bk || bk->magic != MXS_CUDA_WB_BUCKET_MAGIC || bk->check != bucket_hash(bk)) return MXS_ERR_INVALID_ARGUMENT;
    if (bk->n_items > 0 && !bk->table[phase]) return MXS_ERR_INVALID_ARGUMENT;
    /* peek before any other runtime call (see mxs_launch.cuh) */
    if (launch_begin() != MXS_OK) return MXS_ERR_CUDA;
    if (cudaGetDevice(&device) != cudaSuccess) {
        (void)cudaGetLastError();
        return MXS_ERR_CUDA;
    }
    if (device != bk->device) return MXS_ERR_INVALID_ARGUMENT;
    return MXS_OK;
}

/* One phase's launches (see mxs_wb_kernels.cuh), through the launchers of
 * mxs_wb_list.cuh. status: the group status byte the partial zeroes (NULL
 * for apply). */
template <int MODE, unsigned PLANES, bool MIS, bool EDGES, bool WCOL = false>
void wb_launch(const WbItem *dev, int64_t n_items, int64_t int_units, int64_t units, int64_t tile_units,
               uint8_t *status, cudaStream_t stream) {
    if (MODE == MXS__JOB_PARTIAL && int_units > 0 && tile_units > 0) {
        /* interior tiles and general-kernel tiles (cols % 128 != 0, an item
         * off the vector path): two launches, so that the interior tiles
         * keep the interior kernel's registers (one kernel for both would
         * run them at run_tile's 128); the zero-fill goes with the general
         * kernel's units */
        wb_interior_launch<PLANES, MIS, EDGES, WCOL>({grid_for(int_units), stream, dev, n_items, int_units, 0, status});
        wb_general_launch<MODE, PLANES, MIS>({grid_for(units), stream, dev, n_items, units, 0, nullptr});
        return;
    }
    if (int_units > 0) {
        /* no general-kernel tiles: the zero-fill units ride along in the
         * interior launch */
        const int64_t zu = MODE == MXS__JOB_PARTIAL && tile_units == 0 ? units : 0;
        wb_interior_launch<PLANES, MIS, EDGES, WCOL>(
            {grid_for(int_units + zu), stream, dev, n_items, int_units, zu, status});
        if (units == zu) return;
        wb_general_launch<MODE, PLANES, MIS>({grid_for(units - zu), stream, dev, n_items, units - zu, 0, nullptr});
        return;
    }
    if (units > 0) wb_general_launch<MODE, PLANES, MIS>({grid_for(units), stream, dev, n_items, units, 0, status});
}

/* The kernels of the bucket's kind: row-only or not, misaligned loads or
 * not, masked tiles or not; a bucket that is not row-only also by whether an
 * item with a column-wise plane has wide units (WCOL). */
template <int MODE, bool MIS, bool EDGES>
void mixed_launch(const mxs_cuda_wb_bucket *bk, const WbItem *dev, int64_t int_units, int64_t units, int64_t tile_units,
                  uint8_t *status, cudaStream_t stream) {
    if (MODE == MXS__JOB_PARTIAL && bk->wide_cols)
        wb_launch<MODE, 0, MIS, EDGES, true>(dev, bk->n_items, int_units, units, tile_units, status, stream);
    else
        wb_launch<MODE, 0, MIS, EDGES>(dev, bk->n_items, int_units, units, tile_units, status, stream);
}

template <int MODE>
void phase_launch(const mxs_cuda_wb_bucket *bk, const WbItem *dev, int64_t int_units, int64_t units, int64_t tile_units,
                  uint8_t *status, cudaStream_t stream) {
    const int64_t n = bk->n_items;
    /* interior tiles are masked only in a partial with edges; a bucket
     * without them runs the kernels without the masked path (fewer registers) */
    const bool e = MODE == MXS__JOB_PARTIAL && bk->edges;
    if (bk->row_only && bk->misaligned && e)
        wb_launch<MODE, MXS_ROWWISE, true, true>(dev, n, int_units, units, tile_units, status, stream);
    else if (bk->row_only && bk->misaligned)
        wb_launch<MODE, MXS_ROWWISE, true, false>(dev, n, int_units, units, tile_units, status, stream);
    else if (bk->row_only && e)
        wb_launch<MODE, MXS_ROWWISE, false, true>(dev, n, int_units, units, tile_units, status, stream);
    else if (bk->row_only)
        wb_launch<MODE, MXS_ROWWISE, false, false>(dev, n, int_units, units, tile_units, status, stream);
    else if (bk->misaligned && e)
        mixed_launch<MODE, true, true>(bk, dev, int_units, units, tile_units, status, stream);
    else if (bk->misaligned)
        mixed_launch<MODE, true, false>(bk, dev, int_units, units, tile_units, status, stream);
    else if (e)
        mixed_launch<MODE, false, true>(bk, dev, int_units, units, tile_units, status, stream);
    else
        mixed_launch<MODE, false, false>(bk, dev, int_units, units, tile_units, status, stream);
}

mxs_status bucket_run(const mxs_cuda_wb_bucket *bk, int phase, cudaStream_t stream) {
    mxs_status s = bucket_ready(bk, phase);
    if (s != MXS_OK) return s;
    const WbItem *dev = static_cast<const WbItem *>(bk->table[phase]);
    const int64_t units = bk->units[phase], int_units = bk->int_units[phase], tile_units = bk->tile_units[phase];
    uint8_t *status = phase == PHASE_PARTIAL && bk->status_offset >= 0 ? bk->packed + bk->status_offset : nullptr;
    if (units == 0 && int_units == 0) {
        /* nothing but (maybe) the status byte: an empty batch */
        if (status && cudaMemsetAsync(status, 0, 1, stream) != cudaSuccess) {
            (void)cudaGetLastError();
            return MXS_ERR_CUDA;
        }
        return MXS_OK;
    }
    if (phase == PHASE_PARTIAL) {
        phase_launch<MXS__JOB_PARTIAL>(bk, dev, int_units, units, tile_units, status, stream);
    } else {
        /* the scale writes and the straddling blocks (edge spans) in a
         * kernel of their own (no run_tile: its registers, not run_tile's
         * 128); a non-fused apply's tiles in the general kernel after it */
        if (int_units > 0) wb_scales_launch({grid_for(int_units), stream, dev, bk->n_items, int_units, 0, nullptr});
        if (units > 0) phase_launch<MXS__JOB_APPLY>(bk, dev, 0, units, tile_units, nullptr, stream);
    }
    return launch_end();
}

} /* namespace */

/* ---- C ABI -------------------------------------------------------------------------- */

extern "C" {

size_t mxs_cuda_wb_bucket_size(void) { return sizeof(mxs_cuda_wb_bucket); }

mxs_status mxs_cuda_wb_prepare_bytes(const mxs_wb_batch *b, int64_t *workspace_bytes) {
    mxs_wb_plan plan;
    mxs_status s;
    if (!workspace_bytes) return MXS_ERR_INVALID_ARGUMENT;
    if ((s = mxs_wb_make_plan(b, &plan, NULL)) != MXS_OK) return s;
    return bucket_bytes(b->n_items, workspace_bytes);
}

mxs_status mxs_cuda_wb_prepare(mxs_cuda_wb_bucket *bucket, const mxs_wb_batch *b, const mxs_wb_plan *plan,
                               uint8_t *packed, void *workspace, int64_t workspace_bytes, cudaStream_t stream) {
    return prepare(bucket, b, plan, packed, workspace, workspace_bytes, stream, WANT_BOTH);
}

mxs_status mxs_cuda_wb_bucket_partial(const mxs_cuda_wb_bucket *bucket, cudaStream_t stream) {
    return bucket_run(bucket, PHASE_PARTIAL, stream);
}

mxs_status mxs_cuda_wb_bucket_apply(const mxs_cuda_wb_bucket *bucket, cudaStream_t stream) {
    return bucket_run(bucket, PHASE_APPLY, stream);
}

mxs_status mxs_cuda_wb_bucket_release(mxs_cuda_wb_bucket *bucket) {
    if (!bucket) return MXS_ERR_INVALID_ARGUMENT;
    memset(bucket, 0, sizeof *bucket);
    return MXS_OK;
}

mxs_status mxs_cuda_wb_workspace_bytes(const mxs_wb_batch *b, int64_t *bytes) {
    return mxs_cuda_wb_prepare_bytes(b, bytes);
}

mxs_status mxs_cuda_wb_partial(const mxs_wb_batch *b, const mxs_wb_plan *plan, uint8_t *packed, void *workspace,
                               int64_t workspace_bytes, cudaStream_t stream) {
    mxs_cuda_wb_bucket bk;
    mxs_status s = prepare(&bk, b, plan, packed, workspace, workspace_bytes, stream, WANT_PARTIAL);
    return s != MXS_OK ? s : bucket_run(&bk, PHASE_PARTIAL, stream);
}

mxs_status mxs_cuda_wb_apply(const mxs_wb_batch *b, const mxs_wb_plan *plan, const uint8_t *packed, void *workspace,
                             int64_t workspace_bytes, cudaStream_t stream) {
    mxs_cuda_wb_bucket bk;
    /* apply only reads `packed` (the prepared apply list never writes it) */
    mxs_status s = prepare(&bk, b, plan, const_cast<uint8_t *>(packed), workspace, workspace_bytes, stream, WANT_APPLY);
    return s != MXS_OK ? s : bucket_run(&bk, PHASE_APPLY, stream);
}

} /* extern "C" */
