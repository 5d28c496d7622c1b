/* SPDX-License-Identifier: MIT */
/* Suite cuda, NVFP4 part 5 (test_nvfp4.cu): bad input is rejected with
 * nothing written - writeback, quantize / dequantize / convert and the
 * standalone transpose. */
#include "nvfp4_cases.h"

/* ---- 5 bad input ------------------------------------------------------------------- */

void test_bad_input(void) {
    /* writeback: one rank, a shard of at least 4 elements */
    Group *g = new Group();
    do {
        if (g->R) group_free(*g);
        delete g;
        g = new Group();
        group_make(*g, 1, SH_REPLICA, 1, 90, false); /* aligned buffers: a packed buffer over them is aligned */
    } while (g->rw[0][0].shard.count < 4);
    group_fill(*g);
    mxs_nvfp4_wb_batch *b = &g->db[0];
    mxs_nvfp4_wb_plan *plan = &g->dplan[0];
    uint8_t *pk = g->dpacked[0].p;
    mxs_nvfp4_wb_item *it = &g->dit[0][0];
    expect(mxs_cuda_nvfp4_wb_partial(b, plan, nullptr, 0), MXS_ERR_INVALID_ARGUMENT, "partial, NULL packed");
    expect(mxs_cuda_nvfp4_wb_partial(b, plan, pk + 1, 0), MXS_ERR_INVALID_ARGUMENT, "partial, misaligned packed");
    expect(mxs_cuda_nvfp4_wb_apply(b, plan, pk + 1, 0), MXS_ERR_INVALID_ARGUMENT, "apply, misaligned packed");
    expect(mxs_cuda_nvfp4_wb_partial(b, nullptr, pk, 0), MXS_ERR_INVALID_ARGUMENT, "partial, NULL plan");
    expect(mxs_cuda_nvfp4_wb_partial(nullptr, plan, pk, 0), MXS_ERR_INVALID_ARGUMENT, "partial, NULL batch");
    expect(mxs_cuda_nvfp4_wb_finish(b, nullptr, 0), MXS_ERR_INVALID_ARGUMENT, "finish, NULL plan");
    /* the packed buffer over an output: the amax, the master */
    expect(mxs_cuda_nvfp4_wb_partial(b, plan, it->primary.amax, 0), MXS_ERR_ALIASING, "partial, packed over amax");
    expect(mxs_cuda_nvfp4_wb_apply(b, plan, g->rw[0][0].dmaster.p, 0), MXS_ERR_ALIASING, "apply, packed over master");
    /* the batch changed since its plan */
    const int64_t start = it->start, len = it->len;
    it->start = start + 1;
    it->len = len - 1;
    expect(mxs_cuda_nvfp4_wb_partial(b, plan, pk, 0), MXS_ERR_RANGE, "partial, odd shard start");
    expect(mxs_cuda_nvfp4_wb_apply(b, plan, pk, 0), MXS_ERR_RANGE, "apply, odd shard start");
    expect(mxs_cuda_nvfp4_wb_finish(b, plan, 0), MXS_ERR_RANGE, "finish, odd shard start");
    it->start = start + 2;
    it->len = len - 2;
    expect(mxs_cuda_nvfp4_wb_partial(b, plan, pk, 0), MXS_ERR_PLAN_MISMATCH, "partial, another shard");
    expect(mxs_cuda_nvfp4_wb_apply(b, plan, pk, 0), MXS_ERR_PLAN_MISMATCH, "apply, another shard");
    expect(mxs_cuda_nvfp4_wb_finish(b, plan, 0), MXS_ERR_PLAN_MISMATCH, "finish, another shard");
    it->start = start;
    it->len = len;
    g->db[0].round_through = g->rt == MXS_BF16 ? MXS_F32 : MXS_BF16;
    expect(mxs_cuda_nvfp4_wb_partial(b, plan, pk, 0), MXS_ERR_PLAN_MISMATCH, "partial, another round-through");
    g->db[0].round_through = g->rt;
    CUDA_OK(cudaDeviceSynchronize());
    group_compare(*g, "rejected writeback calls write nothing");
    CHECK(cudaGetLastError() == cudaSuccess, "rejected calls leave no CUDA error");
    group_free(*g);
    delete g;

    /* quantize / dequantize / convert */
    Nv T;
    nv_make(T, 33, 17, MXS_BOTH, MXS_NVFP4_1X16, MXS_SCALES_PADDED, false, true);
    std::vector<uint8_t> src = nv_source(33 * 17, MXS_F32);
    DevBuf dsrc = dev_alloc(33 * 17 * 4);
    dev_upload(dsrc, src.data(), 33 * 17 * 4);
    mxs_nvfp4_tensor t = T.d;
    expect(mxs_cuda_nvfp4_quantize(&t, dsrc.p, (mxs_dtype)7, MXS_F32, 0), MXS_ERR_INVALID_ARGUMENT, "bad dtype");
    expect(mxs_cuda_nvfp4_quantize(&t, dsrc.p, MXS_F32, (mxs_dtype)9, 0), MXS_ERR_INVALID_ARGUMENT,
           "bad round-through");
    expect(mxs_cuda_nvfp4_quantize(&t, nullptr, MXS_F32, MXS_F32, 0), MXS_ERR_INVALID_ARGUMENT, "NULL source");
    expect(mxs_cuda_nvfp4_quantize(nullptr, dsrc.p, MXS_F32, MXS_F32, 0), MXS_ERR_INVALID_ARGUMENT, "NULL tensor");
    t.scale_layout = (mxs_scale_layout)2;
    t.dirs = 4;
    expect(mxs_cuda_nvfp4_quantize(&t, dsrc.p, MXS_F32, MXS_F32, 0), MXS_ERR_INVALID_ARGUMENT, "bad dirs");
    t = T.d;
    t.dirs = 0;
    expect(mxs_cuda_nvfp4_quantize(&t, dsrc.p, MXS_F32, MXS_F32, 0), MXS_ERR_INVALID_ARGUMENT, "no plane");
    t = T.d;
    t.rows = 0;
    expect(mxs_cuda_nvfp4_quantize(&t, dsrc.p, MXS_F32, MXS_F32, 0), MXS_ERR_SHAPE, "rows 0");
    t = T.d;
    t.col_scale = nullptr;
    expect(mxs_cuda_nvfp4_quantize(&t, dsrc.p, MXS_F32, MXS_F32, 0), MXS_ERR_ABSENT_PLANE, "NULL column scales");
    t = T.d;
    t.amax = nullptr;
    expect(mxs_cuda_nvfp4_quantize(&t, dsrc.p, MXS_F32, MXS_F32, 0), MXS_ERR_INVALID_ARGUMENT, "NULL amax");
    t = T.d;
    expect(mxs_cuda_nvfp4_quantize(&t, t.row_data, MXS_BF16, MXS_F32, 0), MXS_ERR_ALIASING, "source over data");
    t.col_scale = t.row_scale + 1;
    expect(mxs_cuda_nvfp4_quantize(&t, dsrc.p, MXS_F32, MXS_F32, 0), MXS_ERR_ALIASING, "two outputs overlap");
    t = T.d;
    t.dirs = MXS_ROWWISE;
    expect(mxs_cuda_nvfp4_dequantize(&t, MXS_COLWISE, dsrc.p, MXS_F32, 0), MXS_ERR_ABSENT_PLANE, "dequantize absent");
    t = T.d;
    expect(mxs_cuda_nvfp4_dequantize(&t, MXS_ROWWISE, t.row_data, MXS_F32, 0), MXS_ERR_ALIASING,
           "dequantize over data");
    expect(mxs_cuda_nvfp4_convert_scales(33, 17, MXS_ROWWISE, MXS_SCALES_PADDED, t.row_scale, MXS_SCALES_COMPACT,
                                         t.row_scale + 3, 0),
           MXS_ERR_ALIASING, "convert in place");
    expect(mxs_cuda_nvfp4_convert_scales(0, 17, MXS_ROWWISE, MXS_SCALES_PADDED, t.row_scale, MXS_SCALES_COMPACT,
                                         t.col_scale, 0),
           MXS_ERR_SHAPE, "convert rows 0");
    /* the standalone transpose (FSDP): the host's checks, nothing enqueued on error */
    DevBuf stage = dev_alloc((33 * 17 + 1) / 2);
    t = T.d;
    expect(mxs_cuda_nvfp4_stage_to_col(&t, nullptr, 0), MXS_ERR_INVALID_ARGUMENT, "stage_to_col, NULL stage");
    expect(mxs_cuda_nvfp4_stage_to_col(nullptr, stage.p, 0), MXS_ERR_INVALID_ARGUMENT, "stage_to_col, NULL tensor");
    expect(mxs_cuda_nvfp4_stage_to_col(&t, t.col_data + 5, 0), MXS_ERR_ALIASING, "stage_to_col over its output");
    t.dirs = MXS_ROWWISE;
    expect(mxs_cuda_nvfp4_stage_to_col(&t, stage.p, 0), MXS_ERR_ABSENT_PLANE, "stage_to_col, no column plane");
    t = T.d;
    t.col_data = nullptr;
    expect(mxs_cuda_nvfp4_stage_to_col(&t, stage.p, 0), MXS_ERR_ABSENT_PLANE, "stage_to_col, NULL column data");
    t = T.d;
    t.cols = 0;
    expect(mxs_cuda_nvfp4_stage_to_col(&t, stage.p, 0), MXS_ERR_SHAPE, "stage_to_col, cols 0");
    CUDA_OK(cudaDeviceSynchronize());
    nv_compare(T, "rejected quantize and stage_to_col calls write nothing");
    dev_untouched(stage, "stage_to_col reads its stage only");
    dev_free(stage);
    dev_free(dsrc);
    nv_free(T);
}
