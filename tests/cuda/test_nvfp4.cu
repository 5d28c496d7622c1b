/* SPDX-License-Identifier: MIT */
/* Suite cuda: NVFP4 on the GPU (<mxshard/cuda_nvfp4.h>) equals the host
 * library byte for byte.
 *
 *   1 the E2M1 oracle vectors (tests/vectors/e2m1_*.txt) through a kernel
 *     calling nvfp4.h's conversion rules (the path this device compiles);
 *     and the device rule - one element, pairs and the 8-wide packing the
 *     kernels store - against the boundary count for all 2^32 f32 patterns;
 *   2 quantize (twice on the same buffers), dequantize and scale conversion
 *     == the host, over random shapes (1-element dims, non-multiples of 16),
 *     every plane set, block shape, layout, source dtype and round-through;
 *   3 the sharded writeback on R simulated ranks on one GPU: partial (packed
 *     == the host's partial), ONE MAX reduction (on the host, counted), apply,
 *     the byte gather (device copies), finish; every buffer == the host
 *     writeback's after each phase, and every rank's primary == a
 *     whole-tensor host quantize; two updates on the same buffers; poisoned
 *     and guarded outputs; a remote failure writes nothing;
 *   4 partial / apply / finish captured in a CUDA graph and replayed with new
 *     masters give the same bytes;
 *   5 bad input is rejected with nothing written.
 *
 * Fragments (FSDP, contract 9.8) ride along in 3: on a third of the ranks'
 * planes apply writes a fragment (device fragments at random alignments and
 * shard starts: the 32-bit and the byte stores) == the host's fragment, the
 * replaced data pointer NULL or kept; the gather reads the fragments, finish
 * skips those items and mxs_cuda_nvfp4_stage_to_col == the host's transposes
 * the gathered stage - unprepared, prepared and in graphs.
 *
 * The parts live in test_nvfp4_*.cu, by number (nvfp4_cases.h lists the
 * files); main() below runs the cases in order.
 */
#include "nvfp4_cases.h"

void expect(mxs_status got, mxs_status want, const char *what) {
    CHECK(got == want, "%s: status %d (%s), expected %d", what, (int)got, mxs_status_str(got), (int)want);
}

/* ---- NVFP4 tensors on host and device ---------------------------------------------- */

int64_t nv_scale_bytes(int64_t rows, int64_t cols, int layout, mxs_dirs plane) {
    mxs_nvfp4_tensor t;
    memset(&t, 0, sizeof t);
    t.rows = rows;
    t.cols = cols;
    t.dirs = MXS_BOTH;
    t.scale_layout = (mxs_scale_layout)layout;
    return mxs_nvfp4_scale_bytes(&t, plane);
}

/* all_planes: absent planes get (poisoned) buffers too - they must stay
 * untouched; else their pointers are NULL. device: also the device side;
 * mis: its planes at odd offsets (the kernels' byte-store paths). */
void nv_make(Nv &T, int64_t rows, int64_t cols, unsigned dirs, int block, int layout, bool all_planes, bool device,
             bool mis) {
    uint8_t *hp[5], *dp[5];
    memset(&T.h, 0, sizeof T.h);
    T.h.rows = rows;
    T.h.cols = cols;
    T.h.dirs = dirs;
    T.h.block = (mxs_nvfp4_block)block;
    T.h.scale_layout = (mxs_scale_layout)layout;
    T.d = T.h;
    for (int k = 0; k < 5; k++) {
        const int p = k / 2;
        int64_t n = k == 4       ? 4
                    : k % 2 == 0 ? (rows * cols + 1) / 2
                                 : nv_scale_bytes(rows, cols, layout, (mxs_dirs)(p + 1));
        hp[k] = dp[k] = nullptr;
        if (k < 4 && !all_planes && !(dirs & (unsigned)(p + 1))) continue;
        T.hb[k].assign((size_t)n, POISON);
        hp[k] = T.hb[k].data();
        if (device) {
            T.db[k] = dev_alloc(n, mis && k < 4 ? rnd_in(1, k % 2 == 0 ? 7 : 3) : 0);
            dp[k] = T.db[k].p;
        }
    }
    T.h.row_data = hp[0];
    T.h.row_scale = hp[1];
    T.h.col_data = hp[2];
    T.h.col_scale = hp[3];
    T.h.amax = (float *)(void *)hp[4];
    T.d.row_data = dp[0];
    T.d.row_scale = dp[1];
    T.d.col_data = dp[2];
    T.d.col_scale = dp[3];
    T.d.amax = (float *)(void *)dp[4];
}

void nv_free(Nv &T) {
    for (int k = 0; k < 5; k++) dev_free(T.db[k]);
}

const char *buf_names[5] = {"row data", "row scale", "col data", "col scale", "amax"};

/* Device buffers == host buffers (guards included). */
void nv_compare(const Nv &T, const char *ctx) {
    for (int k = 0; k < 5; k++) {
        if (!T.db[k].base) continue;
        char what[512];
        snprintf(what, sizeof what, "%s: %s", ctx, buf_names[k]);
        dev_compare(T.db[k], T.hb[k].data(), what);
    }
}

/* Dimensions where NVFP4 edges go wrong: 1, small, around multiples of 16. */
int64_t rdim(int64_t max) {
    int64_t d;
    switch (rnd() % 4) {
    case 0: d = 1; break;
    case 1: d = rnd_in(1, 40); break;
    case 2: d = 16 * rnd_in(1, 6) + rnd_in(-1, 1); break;
    default: d = rnd_in(1, max); break;
    }
    return d < 1 ? 1 : (d > max ? max : d);
}

/* Source data: the suite's wide-range values, or moderate finite ones. */
std::vector<uint8_t> nv_source(int64_t n, mxs_dtype dtype) {
    if (rnd() % 2) return rnd_source(n, dtype);
    std::vector<uint8_t> v((size_t)(n * mxs_dtype_bytes(dtype)));
    for (int64_t i = 0; i < n; i++) {
        float x = ldexpf((float)rnd_in(-1000, 1000) / 256.0f, (int)rnd_in(-8, 8));
        put_value(v, i, dtype, x);
    }
    return v;
}

int main(void) {
    require_gpu();
    test_oracle();
    tap_point("E2M1 oracle vectors through a device kernel");
    test_e2m1_exhaustive();
    tap_point("E2M1 device rule (1, 2 and 8 per call) == the boundary count for all 2^32 f32 patterns");
    test_quantize();
    tap_point("quantize / dequantize / convert_scales == host");
    test_writeback();
    tap_point("sharded writeback on R simulated ranks (in place and fragments) == host == whole-tensor quantize");
    test_large();
    tap_point("larger weights (many warp tiles per item) == host");
    test_many_items();
    tap_point("a batch of 70 items (three launch chunks per phase)");
    test_remote_failure();
    tap_point("a remote failure: apply writes nothing");
    test_graphs();
    tap_point("partial / apply / finish captured in graphs and replayed");
    test_buckets();
    tap_point("prepared buckets == host, one launch per phase, misuse rejected");
    test_bad_input();
    tap_point("bad input rejected, nothing written");
    return tap_done();
}
