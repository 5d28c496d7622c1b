/* SPDX-License-Identifier: MIT */
/* Suite cuda: overlapping buffers are rejected with MXS_ERR_ALIASING before
 * anything is enqueued - one test per overlap case, mirroring the host
 * ones (tests/cpu/test_errors.c). Every buffer is carved from one poisoned
 * arena; after each rejected call the whole arena must still be poison. */
#include "common.h"

static void expect(mxs_status got, mxs_status want, const char *what) {
    CHECK(got == want, "%s: got %d (%s), want %d (%s)", what, (int)got, mxs_status_str(got), (int)want,
          mxs_status_str(want));
}

/* A poisoned arena; ptr(off) is a device pointer `off` bytes in. */
struct Arena {
    DevBuf buf;
    explicit Arena(int64_t bytes) { buf = dev_alloc(bytes); }
    ~Arena() { dev_free(buf); }
    uint8_t *ptr(int64_t off) const { return buf.p + off; }
    void untouched(const char *what) {
        CUDA_OK(cudaDeviceSynchronize());
        dev_untouched(buf, what);
    }
};

/* mxs_cuda_quantize: an output plane over the source. */
static void quantize_output_over_src(void) {
    Arena a(1 << 16);
    const int64_t rows = 40, cols = 70;
    mxs_tensor t = row_only(rows, cols, MXS_SCALES_COMPACT, a.ptr(256), a.ptr(40000));
    expect(mxs_cuda_quantize(&t, a.ptr(0), MXS_BF16, MXS_ROUND_CEIL, 0), MXS_ERR_ALIASING,
           "quantize: row_data = src + 256");
    t.row_data = a.ptr(20000);
    t.row_scale = a.ptr(100); /* the scale plane inside the source */
    expect(mxs_cuda_quantize(&t, a.ptr(0), MXS_BF16, MXS_ROUND_CEIL, 0), MXS_ERR_ALIASING,
           "quantize: row_scale inside src");
    a.untouched("quantize rejected: nothing written");
    tap_point("quantize_output_overlapping_src_is_rejected");
}

/* mxs_cuda_dequantize: the destination over the scale plane (and the data). */
static void dequantize_dst_over_scales(void) {
    Arena a(1 << 16);
    const int64_t rows = 40, cols = 70;
    mxs_tensor t = row_only(rows, cols, MXS_SCALES_PADDED, a.ptr(0), a.ptr(8192));
    expect(mxs_cuda_dequantize(&t, MXS_ROWWISE, a.ptr(8192 + 64), MXS_F32, 0), MXS_ERR_ALIASING,
           "dequantize: dst = row_scale + 64");
    expect(mxs_cuda_dequantize(&t, MXS_ROWWISE, a.ptr(5), MXS_BF16, 0), MXS_ERR_ALIASING,
           "dequantize: dst = row_data + 5");
    a.untouched("dequantize rejected: nothing written");
    tap_point("dequantize_dst_overlapping_scales_is_rejected");
}

/* One row-only item of a 40 x 70 weight, shard [3, 2000). */
static mxs_wb_item item_of(const mxs_tensor &t, const void *master) {
    mxs_wb_item it;
    memset(&it, 0, sizeof it);
    it.primary = t;
    it.master = master;
    it.master_dtype = MXS_F32;
    it.start = 3;
    it.len = 1997;
    return it;
}

/* Writeback: a fragment over the packed buffer (FUSED partial would cast
 * into it), a row_scale plane over the packed buffer (apply would convert
 * the exponents onto themselves), the workspace over the packed buffer or
 * a plane. The one-shot calls and mxs_cuda_wb_prepare reject them all. */
static void writeback_buffers_over_packed(void) {
    Arena a(1 << 18);
    const int64_t rows = 40, cols = 70;
    uint8_t *data = a.ptr(0), *scale = a.ptr(4096), *master = a.ptr(16384), *packed = a.ptr(32768);
    uint8_t *ws = a.ptr(65536);
    mxs_tensor t = row_only(rows, cols, MXS_SCALES_PADDED, data, scale);
    mxs_wb_item it = item_of(t, master);
    mxs_wb_batch b;
    memset(&b, 0, sizeof b);
    b.items = &it;
    b.n_items = 1;
    mxs_wb_plan plan;
    int64_t wsb = 0;
    mxs_cuda_wb_bucket bk;

    /* a fragment inside the packed buffer */
    it.row_fragment = packed + 3;
    expect(mxs_wb_make_plan(&b, &plan, NULL), MXS_OK, "plan (fragment case)");
    expect(mxs_cuda_wb_prepare_bytes(&b, &wsb), MXS_OK, "workspace query");
    expect(mxs_cuda_wb_partial(&b, &plan, packed, ws, wsb, 0), MXS_ERR_ALIASING, "partial: fragment over packed");
    expect(mxs_cuda_wb_prepare(&bk, &b, &plan, packed, ws, wsb, 0), MXS_ERR_ALIASING, "prepare: fragment over packed");
    a.untouched("fragment over packed: nothing written");
    tap_point("writeback_fragment_overlapping_packed_is_rejected");

    /* the row_scale plane over the packed buffer */
    it.row_fragment = NULL;
    it.primary.row_scale = packed + 16;
    expect(mxs_wb_make_plan(&b, &plan, NULL), MXS_OK, "plan (scale case)");
    expect(mxs_cuda_wb_partial(&b, &plan, packed, ws, wsb, 0), MXS_ERR_ALIASING, "partial: row_scale over packed");
    expect(mxs_cuda_wb_apply(&b, &plan, packed, ws, wsb, 0), MXS_ERR_ALIASING, "apply: row_scale over packed");
    expect(mxs_cuda_wb_prepare(&bk, &b, &plan, packed, ws, wsb, 0), MXS_ERR_ALIASING, "prepare: row_scale over packed");
    a.untouched("row_scale over packed: nothing written");
    tap_point("writeback_row_scale_overlapping_packed_is_rejected");

    /* the workspace over the packed buffer, over a scale plane, over the master */
    it.primary.row_scale = scale;
    expect(mxs_wb_make_plan(&b, &plan, NULL), MXS_OK, "plan (workspace case)");
    expect(mxs_cuda_wb_prepare(&bk, &b, &plan, packed, packed, wsb, 0), MXS_ERR_ALIASING,
           "prepare: workspace = packed");
    expect(mxs_cuda_wb_prepare(&bk, &b, &plan, packed, scale, wsb, 0), MXS_ERR_ALIASING,
           "prepare: workspace = row_scale");
    expect(mxs_cuda_wb_partial(&b, &plan, packed, master, wsb, 0), MXS_ERR_ALIASING, "partial: workspace = master");
    CHECK(bk.magic == 0, "a rejected prepare leaves the bucket unprepared");
    a.untouched("workspace overlaps: nothing written");
    tap_point("writeback_workspace_overlapping_a_buffer_is_rejected");
}

int main(void) {
    require_gpu();
    quantize_output_over_src();
    dequantize_dst_over_scales();
    writeback_buffers_over_packed();
    return tap_done();
}
