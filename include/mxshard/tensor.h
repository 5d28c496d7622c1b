/* SPDX-License-Identifier: MIT */
/* mxshard/tensor.h - the MXFP8 tensor descriptor, its planes and scale layouts
 * (docs/contract.md section 2).
 *
 * A logical weight is rows x cols, row-major, flat index i = r*cols + c.
 * It carries a row-wise plane (1x32 blocks), a column-wise plane (32x1
 * blocks), or both - exactly the planes `dirs` names, never others.
 *
 *            cols = 70                       row-wise blocks (1x32)
 *   +--------------------------------+       j = c / 32, Kr = ceil(cols/32) = 3
 *   |[ 0..31 ][ 32..63 ][64..69]    |  r=0
 *   |[ 0..31 ][ 32..63 ][64..69]    |  r=1   the last block is short (6 elems)
 *   ...
 *
 *   column-wise blocks (32x1): i = r / 32, Kc = ceil(rows/32); block (i, c)
 *   covers rows 32i .. min(32i+32, rows)-1 of column c.
 *
 * Both data planes are rows x cols bytes, row-major, same flat index (the
 * column-wise data is NOT transposed).
 *
 * Scale planes. Every plane is viewed as a K-major matrix S[M][K]:
 *   row-wise:    M = rows, K = ceil(cols/32), entry (m=r, k=j)
 *   column-wise: M = cols, K = ceil(rows/32), entry (m=c, k=i)
 * with Mp = round_up(M,128), Kp = round_up(K,4). Byte offset of (m, k):
 *
 *   layout     row-wise plane            column-wise plane         bytes
 *   COMPACT    m*K  + k                  k*M  + m                  M*K
 *   PADDED     m*Kp + k                  k*Mp + m                  Mp*Kp
 *   SWIZZLED   ((m/128)*(Kp/4) + k/4)*512 + (m%32)*16 + ((m%128)/32)*4 + k%4
 *                                                                  Mp*Kp
 *
 * COMPACT column-wise is ceil(rows/32) x cols row-major; PADDED is TE's
 * MXFP8Tensor layout; SWIZZLED is the 128x4-tile layout cuBLAS block-scaled
 * GEMMs read. In PADDED and SWIZZLED planes every entry outside the logical
 * M x K is written as 0x00 by every call that writes the plane.
 */
#ifndef MXSHARD_TENSOR_H
#define MXSHARD_TENSOR_H

#include "config.h"
#include "formats.h"
#include "status.h"

MXS_EXTERN_C_BEGIN

typedef enum { MXS_ROWWISE = 1, MXS_COLWISE = 2, MXS_BOTH = 3 } mxs_dirs;
typedef enum { MXS_SCALES_COMPACT = 0, MXS_SCALES_PADDED = 1, MXS_SCALES_SWIZZLED = 2 } mxs_scale_layout;

typedef struct mxs_tensor {
    int64_t rows, cols;
    unsigned dirs;                 /* MXS_ROWWISE | MXS_COLWISE */
    mxs_scale_layout scale_layout; /* applies to both scale planes */
    uint8_t *row_data, *row_scale; /* NULL when the row-wise plane is absent */
    uint8_t *col_data, *col_scale; /* NULL when the column-wise plane is absent */
} mxs_tensor;                      /* more fields may follow; zero means default */

/* ---- checked 64-bit arithmetic ------------------------------------------ */

/* *out = a * b for a, b >= 0; returns 0 on overflow. */
MXS_HD int mxs_mul_ok(int64_t a, int64_t b, int64_t *out) {
    if (a < 0 || b < 0) return 0;
    if (a != 0 && b > INT64_MAX / a) return 0;
    *out = a * b;
    return 1;
}

/* *out = a + b for a, b >= 0; returns 0 on overflow. */
MXS_HD int mxs_add_ok(int64_t a, int64_t b, int64_t *out) {
    if (a < 0 || b < 0 || b > INT64_MAX - a) return 0;
    *out = a + b;
    return 1;
}

/* ceil(a / b) and a rounded up to a multiple of b, for a >= 0 and b >= 1
 * (b < 1 gives 0 instead of a division by zero). */
MXS_HD int64_t mxs_ceil_div(int64_t a, int64_t b) { return b > 0 ? a / b + (a % b != 0) : 0; }
MXS_HD int64_t mxs_round_up(int64_t a, int64_t b) { return mxs_ceil_div(a, b) * b; }

/* ---- buffer overlap ------------------------------------------------------ */

/* Whether the byte ranges [a, a+an) and [b, b+bn) share a byte: the one
 * overlap rule behind every MXS_ERR_ALIASING check. A NULL pointer or a
 * length <= 0 is an empty range, which overlaps nothing. Exact (ranges that
 * only touch do not overlap) and overflow-free: no end address is formed. */
MXS_HD int mxs__overlap(const void *a, int64_t an, const void *b, int64_t bn) {
    uint64_t pa = (uint64_t)(uintptr_t)a, pb = (uint64_t)(uintptr_t)b;
    if (!a || !b || an <= 0 || bn <= 0) return 0;
    return pa <= pb ? pb - pa < (uint64_t)an : pa - pb < (uint64_t)bn;
}

/* ---- scale-plane geometry ----------------------------------------------- */

/* Geometry of one scale plane in one layout: the pure function every host
 * loop and every kernel uses to place a scale byte. */
typedef struct mxs_scale_geom {
    int64_t M, K;   /* logical GEMM view S[M][K] */
    int64_t Mp, Kp; /* padded: round_up(M,128), round_up(K,4) */
    int layout;     /* mxs_scale_layout */
    int colwise;    /* 1 for the column-wise plane */
} mxs_scale_geom;

/* Builds the geometry; returns 0 when a size overflows int64 (only possible
 * for rows or cols near INT64_MAX). rows, cols >= 1. */
MXS_HD int mxs_scale_geom_make(int64_t rows, int64_t cols, mxs_dirs plane, mxs_scale_layout layout, mxs_scale_geom *g) {
    int64_t Mp_bytes;
    g->colwise = plane == MXS_COLWISE;
    g->layout = (int)layout;
    g->M = g->colwise ? cols : rows;
    g->K = mxs_ceil_div(g->colwise ? rows : cols, MXS_BLOCK);
    g->Mp = g->M > INT64_MAX - 127 ? INT64_MAX : mxs_round_up(g->M, 128);
    g->Kp = mxs_round_up(g->K, 4);
    return g->M <= INT64_MAX - 127 && mxs_mul_ok(g->Mp, g->Kp, &Mp_bytes);
}

/* Bytes the plane occupies: M*K compact, Mp*Kp padded or swizzled. */
MXS_HD int64_t mxs_scale_geom_bytes(const mxs_scale_geom *g) {
    return g->layout == MXS_SCALES_COMPACT ? g->M * g->K : g->Mp * g->Kp;
}

/* Byte offset of entry (m, k), 0 <= m < Mp, 0 <= k < Kp (padding entries
 * have offsets too in PADDED and SWIZZLED). */
MXS_HD int64_t mxs_scale_geom_offset(const mxs_scale_geom *g, int64_t m, int64_t k) {
    switch (g->layout) {
    case MXS_SCALES_COMPACT: return g->colwise ? k * g->M + m : m * g->K + k;
    case MXS_SCALES_PADDED: return g->colwise ? k * g->Mp + m : m * g->Kp + k;
    default: return ((m / 128) * (g->Kp / 4) + (k / 4)) * 512 + (m % 32) * 16 + ((m % 128) / 32) * 4 + (k % 4);
    }
}

/* Inverse of mxs_scale_geom_offset over the whole plane: the entry (m, k)
 * stored at byte `off`. Lets a writer walk its output bytes in order and
 * write each exactly once (padding included). */
MXS_HD void mxs_scale_geom_coords(const mxs_scale_geom *g, int64_t off, int64_t *m, int64_t *k) {
    switch (g->layout) {
    case MXS_SCALES_COMPACT:
        if (g->colwise) {
            *k = off / g->M;
            *m = off % g->M;
        } else {
            *m = off / g->K;
            *k = off % g->K;
        }
        return;
    case MXS_SCALES_PADDED:
        if (g->colwise) {
            *k = off / g->Mp;
            *m = off % g->Mp;
        } else {
            *m = off / g->Kp;
            *k = off % g->Kp;
        }
        return;
    default: {
        int64_t tile = off / 512, in = off % 512;
        int64_t ktiles = g->Kp / 4;
        *m = (tile / ktiles) * 128 + ((in % 16) / 4) * 32 + in / 16;
        *k = (tile % ktiles) * 4 + in % 4;
        return;
    }
    }
}

/* Whether (m, k) is a logical entry (not padding). */
MXS_HD int mxs_scale_geom_is_logical(const mxs_scale_geom *g, int64_t m, int64_t k) { return m < g->M && k < g->K; }

/* The step of mxs_scale_geom_offset along m inside a 16-row run:
 * offset(m0 + i, k) = offset(m0, k) + i * step for 0 <= i < 16 when m0 is a
 * multiple of 16 (so also inside any part of such a run: 8 entries from a
 * multiple of 8). COMPACT m*K + k / PADDED m*Kp + k: K / Kp (column-wise
 * MXFP8 planes k*M + m / k*Mp + m: 1); SWIZZLED (m % 32) * 16 + ..., the
 * run inside one 32-row block: 16. Lets a writer of consecutive entries
 * compute one offset. */
MXS_HD int64_t mxs_scale_geom_m_step(const mxs_scale_geom *g) {
    switch (g->layout) {
    case MXS_SCALES_COMPACT: return g->colwise ? 1 : g->K;
    case MXS_SCALES_PADDED: return g->colwise ? 1 : g->Kp;
    default: return 16;
    }
}

/* Block-coordinate helpers: the (m, k) of the block holding element (r, c). */
MXS_HD int64_t mxs_scale_m(const mxs_scale_geom *g, int64_t r, int64_t c) { return g->colwise ? c : r; }
MXS_HD int64_t mxs_scale_k(const mxs_scale_geom *g, int64_t r, int64_t c) { return (g->colwise ? r : c) / MXS_BLOCK; }

/* ---- descriptor validation ---------------------------------------------- */

MXS_HD int mxs_layout_valid(int layout) {
    return layout == MXS_SCALES_COMPACT || layout == MXS_SCALES_PADDED || layout == MXS_SCALES_SWIZZLED;
}
MXS_HD int mxs_rounding_valid(int r) { return r == MXS_ROUND_CEIL || r == MXS_ROUND_FLOOR; }
MXS_HD int mxs_plane_valid(int plane) { return plane == MXS_ROWWISE || plane == MXS_COLWISE; }

/* Shape of one scale plane as an outer x inner row-major array, as
 * Transformer Engine allocates it (the offsets of mxs_scale_geom_offset):
 *
 *   plane         COMPACT   PADDED, SWIZZLED
 *   row-wise      M x K     Mp x Kp
 *   column-wise   K x M     Kp x Mp     (stored k-major: ceil(rows/32) x cols compact)
 *
 * (SWIZZLED has the PADDED shape: the same Mp*Kp bytes in 128x4 tiles.)
 * MXS_ERR_INVALID_ARGUMENT for a NULL output or a bad plane / layout,
 * MXS_ERR_SHAPE, MXS_ERR_OVERFLOW (rows*cols or the plane beyond int64). */
MXS_NODISCARD MXS_HD mxs_status mxs_scale_shape(int64_t rows, int64_t cols, mxs_dirs plane, mxs_scale_layout layout,
                                                int64_t *outer, int64_t *inner) {
    mxs_scale_geom g;
    int64_t n, m_len, k_len;
    if (!outer || !inner || !mxs_plane_valid((int)plane) || !mxs_layout_valid((int)layout))
        return MXS_ERR_INVALID_ARGUMENT;
    if (rows < 1 || cols < 1) return MXS_ERR_SHAPE;
    if (!mxs_mul_ok(rows, cols, &n) || !mxs_scale_geom_make(rows, cols, plane, layout, &g)) return MXS_ERR_OVERFLOW;
    m_len = layout == MXS_SCALES_COMPACT ? g.M : g.Mp;
    k_len = layout == MXS_SCALES_COMPACT ? g.K : g.Kp;
    *outer = g.colwise ? k_len : m_len;
    *inner = g.colwise ? m_len : k_len;
    return MXS_OK;
}

/* Checks shape, flags, layout and sizes (not pointers): rows, cols >= 1,
 * rows*cols and every scale plane fit in int64, dirs is a non-empty subset of
 * MXS_BOTH. */
MXS_NODISCARD MXS_API mxs_status mxs_tensor_check_shape(const mxs_tensor *t) {
    int64_t elems;
    mxs_scale_geom g;
    if (!t) return MXS_ERR_INVALID_ARGUMENT;
    if (t->dirs == 0u || (t->dirs & ~(unsigned)MXS_BOTH) != 0u) return MXS_ERR_INVALID_ARGUMENT;
    if (!mxs_layout_valid((int)t->scale_layout)) return MXS_ERR_INVALID_ARGUMENT;
    if (t->rows < 1 || t->cols < 1) return MXS_ERR_SHAPE;
    if (!mxs_mul_ok(t->rows, t->cols, &elems)) return MXS_ERR_OVERFLOW;
    if (!mxs_scale_geom_make(t->rows, t->cols, MXS_ROWWISE, t->scale_layout, &g)) return MXS_ERR_OVERFLOW;
    if (!mxs_scale_geom_make(t->rows, t->cols, MXS_COLWISE, t->scale_layout, &g)) return MXS_ERR_OVERFLOW;
    return MXS_OK;
}

/* Full check: shape, and every plane `dirs` names has non-NULL data and scale
 * pointers (else MXS_ERR_ABSENT_PLANE). */
MXS_NODISCARD MXS_API mxs_status mxs_tensor_check(const mxs_tensor *t) {
    mxs_status s = mxs_tensor_check_shape(t);
    if (s != MXS_OK) return s;
    if ((t->dirs & MXS_ROWWISE) && (!t->row_data || !t->row_scale)) return MXS_ERR_ABSENT_PLANE;
    if ((t->dirs & MXS_COLWISE) && (!t->col_data || !t->col_scale)) return MXS_ERR_ABSENT_PLANE;
    return MXS_OK;
}

MXS_API int mxs_tensor_has(const mxs_tensor *t, mxs_dirs plane) { return t && (t->dirs & (unsigned)plane) != 0u; }

/* Number of elements rows*cols, or -1 when the shape is invalid. */
MXS_API int64_t mxs_tensor_elems(const mxs_tensor *t) {
    if (mxs_tensor_check_shape(t) != MXS_OK) return -1;
    return t->rows * t->cols;
}

/* Bytes the plane's scales need in t's layout (docs/contract.md section 7). Returns -1
 * when t is invalid, `plane` is not MXS_ROWWISE or MXS_COLWISE, or t does not
 * have that plane. Pointers are not looked at: call it to size allocations. */
MXS_API int64_t mxs_scale_bytes(const mxs_tensor *t, mxs_dirs plane) {
    mxs_scale_geom g;
    if (mxs_tensor_check_shape(t) != MXS_OK || !mxs_plane_valid((int)plane)) return -1;
    if (!(t->dirs & (unsigned)plane)) return -1;
    mxs_scale_geom_make(t->rows, t->cols, plane, t->scale_layout, &g);
    return mxs_scale_geom_bytes(&g);
}

/* Bytes of one data plane (rows*cols), -1 when t is invalid. */
MXS_API int64_t mxs_data_bytes(const mxs_tensor *t) { return mxs_tensor_elems(t); }

/* Bytes of the whole tensor's storage: data + scales of every present plane.
 * Row-only: rows*cols + scales (about 1 + 1/32 bytes per element);
 * bidirectional: about 2 + 2/32. -1 when invalid or on overflow. */
MXS_API int64_t mxs_tensor_storage_bytes(const mxs_tensor *t) {
    int64_t total = 0, data = mxs_tensor_elems(t);
    int p;
    if (data < 0) return -1;
    for (p = MXS_ROWWISE; p <= MXS_COLWISE; p++) {
        if (t->dirs & (unsigned)p) {
            int64_t sb = mxs_scale_bytes(t, (mxs_dirs)p);
            if (!mxs_add_ok(total, data, &total) || !mxs_add_ok(total, sb, &total)) return -1;
        }
    }
    return total;
}

MXS_EXTERN_C_END

#endif /* MXSHARD_TENSOR_H */
