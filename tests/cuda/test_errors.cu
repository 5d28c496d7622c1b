/* SPDX-License-Identifier: MIT */
/* Suite cuda: bad arguments are rejected on the host before anything is
 * enqueued - the call returns the error and every output stays poisoned. */
#include "common.h"

static void expect(mxs_status got, mxs_status want, const char *what) {
    CHECK(got == want, "%s: got %d (%s), want %d", what, (int)got, mxs_status_str(got), (int)want);
}

int main(void) {
    require_gpu();
    const int64_t rows = 70, cols = 96;
    std::vector<uint8_t> src = rnd_source(rows * cols, MXS_BF16);
    DevBuf dsrc = dev_alloc((int64_t)src.size());
    dev_upload(dsrc, src.data(), (int64_t)src.size());

    /* ---- quantize ---- */
    Planes P;
    planes_make(P, rows, cols, MXS_BOTH, MXS_SCALES_SWIZZLED, false);
    mxs_tensor t = P.d;
    expect(mxs_cuda_quantize(NULL, dsrc.p, MXS_BF16, MXS_ROUND_CEIL, 0), MXS_ERR_INVALID_ARGUMENT, "quantize NULL dst");
    expect(mxs_cuda_quantize(&t, NULL, MXS_BF16, MXS_ROUND_CEIL, 0), MXS_ERR_INVALID_ARGUMENT, "quantize NULL src");
    expect(mxs_cuda_quantize(&t, dsrc.p, (mxs_dtype)7, MXS_ROUND_CEIL, 0), MXS_ERR_INVALID_ARGUMENT, "quantize dtype");
    expect(mxs_cuda_quantize(&t, dsrc.p, MXS_BF16, (mxs_rounding)5, 0), MXS_ERR_INVALID_ARGUMENT, "quantize rounding");
    t.dirs = 4;
    expect(mxs_cuda_quantize(&t, dsrc.p, MXS_BF16, MXS_ROUND_CEIL, 0), MXS_ERR_INVALID_ARGUMENT, "quantize dirs");
    t = P.d;
    t.scale_layout = (mxs_scale_layout)9;
    expect(mxs_cuda_quantize(&t, dsrc.p, MXS_BF16, MXS_ROUND_CEIL, 0), MXS_ERR_INVALID_ARGUMENT, "quantize layout");
    t = P.d;
    t.rows = 0;
    expect(mxs_cuda_quantize(&t, dsrc.p, MXS_BF16, MXS_ROUND_CEIL, 0), MXS_ERR_SHAPE, "quantize rows 0");
    t = P.d;
    t.rows = INT64_MAX / 2;
    expect(mxs_cuda_quantize(&t, dsrc.p, MXS_BF16, MXS_ROUND_CEIL, 0), MXS_ERR_OVERFLOW, "quantize overflow");
    t = P.d;
    t.col_scale = NULL; /* BOTH named, column-wise scale absent */
    expect(mxs_cuda_quantize(&t, dsrc.p, MXS_BF16, MXS_ROUND_CEIL, 0), MXS_ERR_ABSENT_PLANE, "quantize absent plane");
    t = P.d;
    t.row_data = NULL;
    expect(mxs_cuda_quantize(&t, dsrc.p, MXS_BF16, MXS_ROUND_CEIL, 0), MXS_ERR_ABSENT_PLANE, "quantize absent data");
    CUDA_OK(cudaDeviceSynchronize());
    for (int k = 0; k < 4; k++) dev_untouched(P.dbuf[k], "quantize rejected: outputs untouched");

    /* ---- dequantize / convert ---- */
    DevBuf out = dev_alloc(rows * cols * 4);
    t = P.d;
    t.dirs = MXS_ROWWISE;
    expect(mxs_cuda_dequantize(&t, MXS_COLWISE, out.p, MXS_F32, 0), MXS_ERR_ABSENT_PLANE, "dequantize absent plane");
    expect(mxs_cuda_dequantize(&P.d, MXS_BOTH, out.p, MXS_F32, 0), MXS_ERR_INVALID_ARGUMENT, "dequantize plane BOTH");
    expect(mxs_cuda_dequantize(&P.d, MXS_ROWWISE, out.p, (mxs_dtype)3, 0), MXS_ERR_INVALID_ARGUMENT,
           "dequantize dtype");
    expect(mxs_cuda_dequantize(&P.d, MXS_ROWWISE, NULL, MXS_F32, 0), MXS_ERR_INVALID_ARGUMENT, "dequantize NULL");
    expect(mxs_cuda_dequantize(&P.d, MXS_ROWWISE, P.d.row_data + 5, MXS_BF16, 0), MXS_ERR_ALIASING, "dequantize alias");
    expect(mxs_cuda_convert_scales(rows, cols, MXS_ROWWISE, MXS_SCALES_COMPACT, P.d.row_scale, MXS_SCALES_PADDED,
                                   P.d.row_scale + 3, 0),
           MXS_ERR_ALIASING, "convert alias");
    expect(
        mxs_cuda_convert_scales(rows, 0, MXS_ROWWISE, MXS_SCALES_COMPACT, P.d.row_scale, MXS_SCALES_PADDED, out.p, 0),
        MXS_ERR_SHAPE, "convert shape");
    expect(mxs_cuda_convert_scales(rows, cols, MXS_ROWWISE, (mxs_scale_layout)3, P.d.row_scale, MXS_SCALES_PADDED,
                                   out.p, 0),
           MXS_ERR_INVALID_ARGUMENT, "convert layout");
    CUDA_OK(cudaDeviceSynchronize());
    dev_untouched(out, "dequantize/convert rejected: output untouched");
    for (int k = 0; k < 4; k++) dev_untouched(P.dbuf[k], "dequantize/convert rejected: planes untouched");

    /* ---- writeback ---- */
    /* item 1 has its own primary: two items writing one primary overlap (MXS_ERR_ALIASING) */
    Planes P2;
    planes_make(P2, rows, cols, MXS_BOTH, MXS_SCALES_SWIZZLED, false);
    DevBuf master = dev_alloc(rows * cols * 4);
    mxs_wb_item items[2];
    memset(items, 0, sizeof items);
    items[0].primary = P.d;
    items[0].master = master.p;
    items[0].start = 10;
    items[0].len = 1000;
    items[1] = items[0];
    items[1].primary = P2.d;
    items[1].start = 0;
    items[1].len = rows * cols;
    mxs_wb_batch b;
    memset(&b, 0, sizeof b);
    b.items = items;
    b.n_items = 2;
    mxs_wb_plan plan;
    expect(mxs_wb_make_plan(&b, &plan, NULL), MXS_OK, "plan");
    int64_t wsb = 0;
    expect(mxs_cuda_wb_workspace_bytes(&b, &wsb), MXS_OK, "workspace query");
    expect(mxs_cuda_wb_workspace_bytes(&b, NULL), MXS_ERR_INVALID_ARGUMENT, "workspace query NULL");
    DevBuf ws = dev_alloc(wsb), packed = dev_alloc(plan.packed_bytes);
    mxs_wb_plan bad = plan;
    bad.fingerprint ^= 1;
    expect(mxs_cuda_wb_partial(&b, &bad, packed.p, ws.p, wsb, 0), MXS_ERR_PLAN_MISMATCH, "partial plan mismatch");
    expect(mxs_cuda_wb_apply(&b, &bad, packed.p, ws.p, wsb, 0), MXS_ERR_PLAN_MISMATCH, "apply plan mismatch");
    expect(mxs_cuda_wb_partial(&b, &plan, packed.p, ws.p, wsb - 1, 0), MXS_ERR_BUFFER_SIZE, "partial workspace small");
    expect(mxs_cuda_wb_apply(&b, &plan, packed.p, ws.p, wsb - 1, 0), MXS_ERR_BUFFER_SIZE, "apply workspace small");
    expect(mxs_cuda_wb_partial(&b, &plan, packed.p, NULL, wsb, 0), MXS_ERR_INVALID_ARGUMENT, "partial NULL workspace");
    expect(mxs_cuda_wb_partial(&b, &plan, NULL, ws.p, wsb, 0), MXS_ERR_INVALID_ARGUMENT, "partial NULL packed");
    expect(mxs_cuda_wb_partial(&b, NULL, packed.p, ws.p, wsb, 0), MXS_ERR_INVALID_ARGUMENT, "partial NULL plan");
    items[1].len = rows * cols + 1; /* the last item is out of range: nothing of item 0 may be written */
    expect(mxs_cuda_wb_partial(&b, &plan, packed.p, ws.p, wsb, 0), MXS_ERR_RANGE, "partial range");
    expect(mxs_cuda_wb_apply(&b, &plan, packed.p, ws.p, wsb, 0), MXS_ERR_RANGE, "apply range");
    items[1].len = 5;
    items[1].master = NULL;
    expect(mxs_cuda_wb_partial(&b, &plan, packed.p, ws.p, wsb, 0), MXS_ERR_INVALID_ARGUMENT, "partial NULL master");
    items[1].master = master.p;
    items[1].primary.col_scale = NULL;
    expect(mxs_cuda_wb_apply(&b, &plan, packed.p, ws.p, wsb, 0), MXS_ERR_ABSENT_PLANE, "apply absent plane");
    items[1].primary = P2.d;
    items[1].primary.dirs = MXS_ROWWISE;
    items[1].col_fragment = out.p;
    expect(mxs_cuda_wb_partial(&b, &plan, packed.p, ws.p, wsb, 0), MXS_ERR_ABSENT_PLANE, "fragment of absent plane");
    items[1].col_fragment = NULL;
    expect(mxs_cuda_wb_partial(&b, &plan, packed.p, ws.p, wsb, 0), MXS_ERR_PLAN_MISMATCH, "flags differ from plan");
    items[1].primary = P2.d;
    b.mode = (mxs_wb_mode)7;
    expect(mxs_cuda_wb_partial(&b, &plan, packed.p, ws.p, wsb, 0), MXS_ERR_INVALID_ARGUMENT, "partial mode");
    CUDA_OK(cudaDeviceSynchronize());
    dev_untouched(packed, "writeback rejected: packed untouched");
    dev_untouched(ws, "writeback rejected: workspace untouched");
    dev_untouched(out, "writeback rejected: fragment untouched");
    for (int k = 0; k < 4; k++) dev_untouched(P.dbuf[k], "writeback rejected: planes untouched");
    for (int k = 0; k < 4; k++) dev_untouched(P2.dbuf[k], "writeback rejected: planes untouched");

    /* an empty batch is valid: its packed buffer is the status byte alone,
     * which partial zeroes; no workspace needed */
    b.mode = MXS_WB_FUSED;
    b.n_items = 0;
    expect(mxs_wb_make_plan(&b, &plan, NULL), MXS_OK, "empty plan");
    CHECK(plan.packed_bytes == 1 && plan.status_offset == 0, "empty plan: packed = the status byte");
    DevBuf status = dev_alloc(1);
    expect(mxs_cuda_wb_partial(&b, &plan, NULL, NULL, 0, 0), MXS_ERR_INVALID_ARGUMENT, "empty partial, NULL packed");
    expect(mxs_cuda_wb_partial(&b, &plan, status.p, NULL, 0, 0), MXS_OK, "empty partial");
    expect(mxs_cuda_wb_apply(&b, &plan, status.p, NULL, 0, 0), MXS_OK, "empty apply");
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaGetLastError());
    const uint8_t zero = 0;
    dev_compare(status, &zero, "empty partial: status byte 0");
    dev_free(status);
    planes_free(P2);

    planes_free(P);
    dev_free(dsrc);
    dev_free(out);
    dev_free(master);
    dev_free(ws);
    dev_free(packed);
    return finish("cuda errors");
}
