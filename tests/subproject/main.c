/* SPDX-License-Identifier: MIT */
/* Quantizes a 32 x 32 weight row-only through mxshard taken as a meson
 * subproject, and checks one block by hand. */
#include <mxshard/mxshard.h>

#include <stdio.h>
#include <string.h>

int main(void) {
    float src[32 * 32];
    uint8_t data[32 * 32], scale[32];
    mxs_tensor t;
    int i;
    for (i = 0; i < 32 * 32; i++) src[i] = (float)(i % 32) - 16.0f; /* every row: -16 .. 15 */
    memset(&t, 0, sizeof t);
    t.rows = 32;
    t.cols = 32;
    t.dirs = MXS_ROWWISE;
    t.row_data = data;
    t.row_scale = scale;
    if (mxs_scale_bytes(&t, MXS_ROWWISE) != 32) return 1;
    if (mxs_host_quantize(&t, src, MXS_F32, MXS_ROUND_CEIL) != MXS_OK) return 2;
    /* amax 16: e8m0_up(16/448) = 2^-4 (e = 123); -16 * 16 = -256 -> 0xF8 */
    for (i = 0; i < 32; i++)
        if (scale[i] != 123 || data[i * 32] != 0xF8) {
            fprintf(stderr, "row %d: scale %u data 0x%02x\n", i, scale[i], data[i * 32]);
            return 3;
        }
    printf("mxshard as a subproject: ok (%s)\n", mxs_status_str(MXS_OK));
    return 0;
}
