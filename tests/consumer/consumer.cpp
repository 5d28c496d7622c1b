/* SPDX-License-Identifier: MIT */
// A downstream C++ program: the host headers must compile as C++11/C++17
// with nothing but -I<srcroot>/include, and use the fixed names (docs/contract.md §7).
#include <mxshard/mxshard.h>

#include <cstdio>
#include <cstring>
#include <vector>

int main() {
    const int rows = 33, cols = 3;
    std::vector<float> src(rows * cols);
    for (int i = 0; i < rows * cols; i++) src[i] = static_cast<float>(i) - 40.0f;

    mxs_tensor t;
    std::memset(&t, 0, sizeof t);
    t.rows = rows;
    t.cols = cols;
    t.dirs = MXS_COLWISE;
    t.scale_layout = MXS_SCALES_COMPACT;
    std::vector<uint8_t> col_data(rows * cols), col_scale(static_cast<size_t>(mxs_scale_bytes(&t, MXS_COLWISE)));
    t.col_data = col_data.data();
    t.col_scale = col_scale.data();

    int bad = 0;
    if (mxs_e4m3_from_f32(-0.0f) != 0x80) bad |= 1;
    if (mxs_e4m3_to_f32(0x38) != 1.0f) bad |= 2;
    if (mxs_e8m0_from_amax(512.0f, MXS_ROUND_FLOOR) != 128) bad |= 4;
    if (col_scale.size() != 2 * 3) bad |= 8;
    if (mxs_host_quantize(&t, src.data(), MXS_F32, MXS_ROUND_FLOOR) != MXS_OK) bad |= 16;
    // column 0, rows 0..31 hold -40 .. 53: amax 53 -> FLOOR e8m0_down(53) - 8 = 132 - 8 = 124;
    // -40 * 2^3 = -320 = -1.25 * 2^8 -> 0xFA
    if (col_scale[0] != 124 || col_data[0] != 0xFA) bad |= 32;
    // row 32 (the one-row edge group), column 0: 56 -> e8m0_down(56) - 8 = 124; scale entry (1, 0) = byte 3
    if (col_scale[3] != 124) bad |= 64;
    if (mxs_status_str(MXS_OK) == nullptr || mxs_status_str(static_cast<mxs_status>(999))[0] == '\0') bad |= 128;
    std::printf("consumer (C++%ld): %s\n", static_cast<long>(__cplusplus), bad ? "FAILED" : "ok");
    if (bad)
        std::fprintf(stderr, "failure mask 0x%x col_scale0=%u col_data0=0x%02x col_scale3=%u\n", bad, col_scale[0],
                     col_data[0], col_scale[3]);
    return bad ? 1 : 0;
}
