/* SPDX-License-Identifier: MIT */
/* tests/nccl/test_nccl_copyback.c - group copyback of test_nccl: the bf16
 * copy-back == the FP8 writeback (docs/contract.md section 5), and swizzle
 * after the gather == a direct swizzled quantize (section 4 step 6). */
#define _POSIX_C_SOURCE 200809L
#include "nccl_cases.h"

/* docs/contract.md section 5: all-gather the bf16 master, then mxs_cuda_quantize into the
 * EXISTING planes == FP8 writeback with bf16 round-through + byte gather. */
void test_copyback_bf16(mxs_rank *r, mxs_rounding rnd, const char *name) {
    long before = test_begin(r, name);
    wspec s[N_DIRS_SHAPES];
    weight *w;
    int i, p;
    mixed_specs(s, N_DIRS_SHAPES);
    w = weights_new(r, s, N_DIRS_SHAPES, SHARD_UNEVEN, 2024u, NULL, NULL, NULL);
    weights_update(r, w, N_DIRS_SHAPES, 8080u + (uint64_t)rnd, MXS_BF16, rnd);
    writeback(r, w, N_DIRS_SHAPES, rnd, MXS_BF16, MXS_WB_FUSED);
    gather_planes(r, w, N_DIRS_SHAPES);
    check_full(r, w, N_DIRS_SHAPES, "fp8 writeback (bf16 round-through)");
    for (i = 0; i < N_DIRS_SHAPES; i++) {
        weight *x = &w[i];
        uint8_t *wb_data[2] = {NULL, NULL}, *wb_scale[2] = {NULL, NULL};
        uint16_t *bf = (uint16_t *)xmalloc(sizeof(uint16_t) * (size_t)x->elems);
        void *bf_dev = dev_alloc(r, 2 * x->elems);
        mxs_status st;
        int64_t k;
        for (p = 0; p < 2; p++) {
            if (!has_plane(x, p)) continue;
            wb_data[p] = download(r, dev_data(x, p), x->elems);
            wb_scale[p] = download(r, dev_scale(x, p), x->scale_bytes[p]);
            fill(r, dev_data(x, p), 0x5A, x->elems);
            fill(r, dev_scale(x, p), 0x5A, x->scale_bytes[p]);
        }
        /* only this rank's slice of the bf16 weight is valid before the gather */
        for (k = 0; k < x->elems; k++)
            bf[k] = (k >= x->start && k < x->start + x->len) ? mxs_bf16_from_f32(x->full[k]) : 0xFFFFu;
        upload(r, bf_dev, bf, 2 * x->elems);
        st = mxs_nccl_gather_bytes(bf_dev, x->elems, 2, x->starts, x->lens, r->comm, r->stream);
        MXS_CHECK(r, st == MXS_OK, "mxs_nccl_gather_bytes (bf16): %s", mxs_status_str(st));
        st = mxs_cuda_quantize(&x->dev, bf_dev, MXS_BF16, rnd, r->stream);
        MXS_CHECK(r, st == MXS_OK, "mxs_cuda_quantize: %s", mxs_status_str(st));
        CU(r, cudaStreamSynchronize(r->stream));
        MXS_CHECK(r, memcmp(&x->dev, &x->saved, sizeof(mxs_tensor)) == 0, "weight %d: copy-back changed the storage",
                  i);
        for (p = 0; p < 2; p++) {
            uint8_t *cb_data, *cb_scale;
            char what[128];
            if (!has_plane(x, p)) continue;
            cb_data = download(r, dev_data(x, p), x->elems);
            cb_scale = download(r, dev_scale(x, p), x->scale_bytes[p]);
            snprintf(what, sizeof what, "weight %d %s data: bf16 copy-back vs fp8 writeback", i, p ? "col" : "row");
            MXS_CHECK(r, same_bytes(r, what, cb_data, wb_data[p], x->elems), "%s", what);
            snprintf(what, sizeof what, "weight %d %s scales: bf16 copy-back vs fp8 writeback", i, p ? "col" : "row");
            MXS_CHECK(r, same_bytes(r, what, cb_scale, wb_scale[p], x->scale_bytes[p]), "%s", what);
            free(cb_data);
            free(cb_scale);
            free(wb_data[p]);
            free(wb_scale[p]);
        }
        cudaFree(bf_dev);
        free(bf);
    }
    weights_free(w, N_DIRS_SHAPES, 1);
    test_end(r, name, before);
}

/* docs/contract.md section 4 step 6: gather with COMPACT scales, then swizzle on the GPU
 * == quantizing straight into the SWIZZLED layout (GPU and host). */
void test_swizzle_after_gather(mxs_rank *r) {
    const char *name = "swizzle_after_gather_equals_direct_swizzled_quantize";
    long before = test_begin(r, name);
    wspec s[N_DIRS_SHAPES];
    weight *w;
    int i, p;
    mixed_specs(s, N_DIRS_SHAPES);
    for (i = 0; i < N_DIRS_SHAPES; i++) s[i].layout = MXS_SCALES_COMPACT;
    w = weights_new(r, s, N_DIRS_SHAPES, SHARD_BUCKET, 5u, NULL, NULL, NULL);
    weights_update(r, w, N_DIRS_SHAPES, 6060u, MXS_F32, MXS_ROUND_CEIL);
    writeback(r, w, N_DIRS_SHAPES, MXS_ROUND_CEIL, MXS_F32, MXS_WB_FUSED);
    gather_planes(r, w, N_DIRS_SHAPES);
    check_full(r, w, N_DIRS_SHAPES, "compact");
    for (i = 0; i < N_DIRS_SHAPES; i++) {
        weight *x = &w[i];
        mxs_tensor direct = x->dev, host = x->dev;
        void *full_dev = dev_alloc(r, 4 * x->elems);
        float *src = x->full;
        mxs_status st;
        direct.scale_layout = host.scale_layout = MXS_SCALES_SWIZZLED;
        direct.row_data = direct.row_scale = direct.col_data = direct.col_scale = NULL;
        host.row_data = host.row_scale = host.col_data = host.col_scale = NULL;
        for (p = 0; p < 2; p++) {
            int64_t sb;
            if (!has_plane(x, p)) continue;
            sb = mxs_scale_bytes(&direct, (mxs_dirs)(p + 1));
            if (p) {
                direct.col_data = (uint8_t *)dev_alloc(r, x->elems);
                direct.col_scale = (uint8_t *)dev_alloc(r, sb);
                host.col_data = (uint8_t *)xmalloc((size_t)x->elems);
                host.col_scale = (uint8_t *)xmalloc((size_t)sb);
            } else {
                direct.row_data = (uint8_t *)dev_alloc(r, x->elems);
                direct.row_scale = (uint8_t *)dev_alloc(r, sb);
                host.row_data = (uint8_t *)xmalloc((size_t)x->elems);
                host.row_scale = (uint8_t *)xmalloc((size_t)sb);
            }
        }
        upload(r, full_dev, src, 4 * x->elems);
        ST(r, mxs_cuda_quantize(&direct, full_dev, MXS_F32, MXS_ROUND_CEIL, r->stream), MXS_OK);
        ST(r, mxs_host_quantize(&host, src, MXS_F32, MXS_ROUND_CEIL), MXS_OK);
        for (p = 0; p < 2; p++) {
            int64_t sb;
            uint8_t *swz_dev, *swz, *dir, *dir_data, *gathered;
            char what[128];
            if (!has_plane(x, p)) continue;
            sb = mxs_scale_bytes(&direct, (mxs_dirs)(p + 1));
            swz_dev = (uint8_t *)dev_alloc(r, sb);
            fill(r, swz_dev, 0xEE, sb);
            st = mxs_cuda_convert_scales(x->spec.rows, x->spec.cols, (mxs_dirs)(p + 1), MXS_SCALES_COMPACT,
                                         dev_scale(x, p), MXS_SCALES_SWIZZLED, swz_dev, r->stream);
            MXS_CHECK(r, st == MXS_OK, "mxs_cuda_convert_scales: %s", mxs_status_str(st));
            CU(r, cudaStreamSynchronize(r->stream));
            swz = download(r, swz_dev, sb);
            dir = download(r, p ? direct.col_scale : direct.row_scale, sb);
            dir_data = download(r, p ? direct.col_data : direct.row_data, x->elems);
            gathered = download(r, dev_data(x, p), x->elems);
            snprintf(what, sizeof what, "weight %d %s: swizzled-after-gather vs cuda direct", i, p ? "col" : "row");
            MXS_CHECK(r, same_bytes(r, what, swz, dir, sb), "%s", what);
            snprintf(what, sizeof what, "weight %d %s: swizzled-after-gather vs host direct", i, p ? "col" : "row");
            MXS_CHECK(r, same_bytes(r, what, swz, p ? host.col_scale : host.row_scale, sb), "%s", what);
            snprintf(what, sizeof what, "weight %d %s: gathered data vs cuda direct", i, p ? "col" : "row");
            MXS_CHECK(r, same_bytes(r, what, gathered, dir_data, x->elems), "%s", what);
            free(swz);
            free(dir);
            free(dir_data);
            free(gathered);
            cudaFree(swz_dev);
        }
        cudaFree(direct.row_data);
        cudaFree(direct.row_scale);
        cudaFree(direct.col_data);
        cudaFree(direct.col_scale);
        free(host.row_data);
        free(host.row_scale);
        free(host.col_data);
        free(host.col_scale);
        cudaFree(full_dev);
    }
    weights_free(w, N_DIRS_SHAPES, 1);
    test_end(r, name, before);
}
