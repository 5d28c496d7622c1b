/* SPDX-License-Identifier: MIT */
/* cuda/mxs_wb_edges.cuh - the fused apply's straddling blocks: the blocks
 * of a shard that a shard edge cuts, which only the reduced exponents can
 * cast (the partial casts every block wholly inside the shard).
 *
 * They lie in at most two "edge spans" per item, rows [row0, row1) x
 * columns [col0, col1):
 *
 *   row-only item    the straddling row block itself (1 row x <= 32 columns)
 *   with a column    the whole 32-row group an edge cuts (its column blocks
 *   plane            straddle, and the row blocks of the edge element too)
 *
 *           col0                col1
 *   row0    |. . . . . . . [lo x x x x|   x: elements of the shard; a span's
 *           |x x x x x x x x x x x x x|   elements outside [lo, hi) are
 *   row1-1  |x x x x x x x x x x x x x|   skipped
 *
 * A unit is one row of a span x kEdgeCols columns, thread t taking columns
 * col0 + t + kThreads j (j < 8: a warp's loads and byte stores are
 * contiguous). Each element inside the shard is cast into each plane whose
 * block through it is not wholly inside: the bytes of run_tile<APPLY> (the
 * same load, round-through, __fmul_rn and E4M3 conversion, one element at a
 * time), with the exponent read from the packed buffer (J.scale, which apply
 * only reads), so the units run in the scale writer's launch, next to the
 * scale writes (wb_scales_kernel) and at its registers. This replaced a
 * second launch of the general kernel (run_tile, 124-128 registers) over
 * those tiles: 8.5-9.3 us for a row-only DP=8 rank's two blocks and 12.4 us
 * for a both-planes rank's two groups (128 one-tile CTAs at 6 % occupancy),
 * mostly instruction fetch and latency, not bytes (runs 13 and 17). */
#ifndef MXSHARD_CUDA_WB_EDGES_CUH
#define MXSHARD_CUDA_WB_EDGES_CUH

#include "mxs_tile.cuh"

namespace mxs__cu {

constexpr int kEdgeElems = 8;                        /* elements per thread and unit */
constexpr int64_t kEdgeCols = kThreads * kEdgeElems; /* columns per unit */

/* One edge span of an item (host-made by edge_span_make). */
struct EdgeSpan {
    int64_t row0, row1, col0, col1;
    int64_t upr; /* units per row: ceil((col1 - col0) / kEdgeCols) */
};

inline EdgeSpan edge_span_make(int64_t row0, int64_t row1, int64_t col0, int64_t col1) {
    EdgeSpan s;
    s.row0 = row0;
    s.row1 = row1;
    s.col0 = col0;
    s.col1 = col1;
    s.upr = mxs_ceil_div(col1 - col0, kEdgeCols);
    return s;
}

__host__ __device__ inline int64_t edge_span_units(const EdgeSpan &s) { return (s.row1 - s.row0) * s.upr; }

/* Unit `u` of span s of the fused apply job J. */
__device__ __forceinline__ void edge_span_unit(const mxs__job &J, const EdgeSpan &s, int64_t u) {
    const int64_t cols = J.cols, lo = J.lo, hi = J.hi;
    const int64_t r = s.row0 + u / s.upr, c0 = s.col0 + (u % s.upr) * kEdgeCols + threadIdx.x;
    const int64_t g = r / MXS_BLOCK;
    const int64_t r_last = (g * MXS_BLOCK + MXS_BLOCK < J.rows ? g * MXS_BLOCK + MXS_BLOCK : J.rows) - 1;
    const bool do_row = (J.planes & MXS_ROWWISE) != 0, do_col = (J.planes & MXS_COLWISE) != 0;
    /* every load first (element, then its exponents), then the casts */
    float x[kEdgeElems];
    uint8_t er[kEdgeElems], ec[kEdgeElems];
    unsigned cast_row = 0u, cast_col = 0u;
#pragma unroll
    for (int j = 0; j < kEdgeElems; j++) {
        const int64_t c = c0 + (int64_t)j * kThreads, f = r * cols + c;
        x[j] = 0.0f;
        er[j] = ec[j] = 0;
        if (c >= s.col1 || f < lo || f >= hi) continue;
        const int64_t kb = c / MXS_BLOCK;
        /* = mxs_row_block_inside and mxs_col_block_inside (geometry.h) in
         * closed form, as in run_tile: calling them costs this kernel 24
         * registers (72 -> 96, ptxas), and the predicates are equal (checked
         * on 2e6 random shapes, shards and elements) */
        /* row block (r, kb): [r*cols + 32kb, r*cols + min(32kb + 32, cols)) */
        const int64_t b0 = r * cols + kb * MXS_BLOCK;
        const int64_t b1 = r * cols + (kb * MXS_BLOCK + MXS_BLOCK < cols ? kb * MXS_BLOCK + MXS_BLOCK : cols);
        const bool row = do_row && mxs__cast_selected(J.cast, b0 >= lo && b1 <= hi);
        /* column block (g, c): first element >= lo and last < hi */
        const bool col = do_col && mxs__cast_selected(J.cast, g * MXS_BLOCK * cols + c >= lo && r_last * cols + c < hi);
        if (!row && !col) continue;
        x[j] = ld_elem(J.src, (int)J.src_dtype, f - J.src_base);
        if (row) {
            cast_row |= 1u << j;
            er[j] = J.scale[0][mxs_scale_geom_offset(&J.geom[0], r, kb)];
        }
        if (col) {
            cast_col |= 1u << j;
            ec[j] = J.scale[1][mxs_scale_geom_offset(&J.geom[1], c, g)];
        }
    }
#pragma unroll
    for (int j = 0; j < kEdgeElems; j++) {
        if (!((cast_row | cast_col) & (1u << j))) continue;
        const int64_t f = r * cols + c0 + (int64_t)j * kThreads;
        const float v = mxs_round_through(x[j], J.round_through);
        /* one rounding, never fused (as quantize8); the low byte of the
         * 4-wide conversion is the kernels' E4M3 rule */
        if (cast_row & (1u << j))
            J.out[0][f - J.out_base[0]] =
                (uint8_t)(mxs_e4m3x4_from_f32(__fmul_rn(v, mxs_e8m0_quant_mult(er[j])), 0.0f, 0.0f, 0.0f) & 0xFFu);
        if (cast_col & (1u << j))
            J.out[1][f - J.out_base[1]] =
                (uint8_t)(mxs_e4m3x4_from_f32(__fmul_rn(v, mxs_e8m0_quant_mult(ec[j])), 0.0f, 0.0f, 0.0f) & 0xFFu);
    }
}

} /* namespace mxs__cu */

#endif /* MXSHARD_CUDA_WB_EDGES_CUH */
