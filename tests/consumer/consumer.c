/* SPDX-License-Identifier: MIT */
/* A downstream C99 program: builds against <mxshard/mxshard.h> with nothing
 * but -I<srcroot>/include and uses the fixed names (docs/contract.md section 7). */
#include <mxshard/mxshard.h>

#include <stdio.h>
#include <string.h>

int main(void) {
    float src[2 * 40];
    uint8_t row_data[2 * 40], row_scale[128 * 4];
    mxs_tensor t;
    mxs_status s;
    int i, bad = 0;

    for (i = 0; i < 2 * 40; i++) src[i] = (float)(i % 40) * 0.25f;
    memset(&t, 0, sizeof t);
    t.rows = 2;
    t.cols = 40;
    t.dirs = MXS_ROWWISE;
    t.scale_layout = MXS_SCALES_SWIZZLED;
    t.row_data = row_data;
    t.row_scale = row_scale;

    if (mxs_e4m3_from_f32(1.0f) != 0x38) bad |= 1;
    if (mxs_e4m3_to_f32(0x7E) != 448.0f) bad |= 2;
    if (mxs_e8m0_from_amax(448.0f, MXS_ROUND_CEIL) != 127) bad |= 4;
    if (mxs_scale_bytes(&t, MXS_ROWWISE) != 128 * 4) bad |= 8;
    if (mxs_scale_bytes(&t, MXS_COLWISE) != -1) bad |= 16;
    s = mxs_host_quantize(&t, src, MXS_F32, MXS_ROUND_CEIL);
    if (s != MXS_OK) bad |= 32;
    /* row 0, block 0: amax 7.75 -> e8m0_up(7.75/448) = 2^-5 (e = 122);
     * 7.75 * 32 = 248 = 1.9375 * 2^7 ties between 240 and 256: even -> 256 (0x78) */
    if (row_scale[0] != 122 || row_data[31] != 0x78) bad |= 64;
    if (mxs_host_quantize(&t, NULL, MXS_F32, MXS_ROUND_CEIL) != MXS_ERR_INVALID_ARGUMENT) bad |= 128;
    if (strlen(mxs_status_str(MXS_ERR_ABSENT_PLANE)) == 0) bad |= 256;
    printf("consumer (C): %s\n", bad ? "FAILED" : "ok");
    if (bad)
        fprintf(stderr, "consumer (C): failure mask 0x%x, row_scale[0]=%u row_data[31]=0x%02x\n", bad, row_scale[0],
                row_data[31]);
    return bad ? 1 : 0;
}
