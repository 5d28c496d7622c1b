/* SPDX-License-Identifier: MIT */
/* One version: meson.build's project version (passed in as MXS_EXPECT_*)
 * equals config.h's MXS_VERSION_*, MXS_VERSION_CODE follows from them, and
 * the compiled libraries report the same code at run time. TAP output. */
#if defined(MXS_TEST_NCCL)
#include <mxshard/nccl.h>
#elif defined(MXS_TEST_CUDA)
#include <mxshard/cuda.h>
#else
#include <mxshard/mxshard.h>
#endif

#include <stdio.h>

static int n_checks;
static int n_failed;

static void check(int ok, const char *what) {
    n_checks++;
    n_failed += !ok;
    printf("%s %d - %s\n", ok ? "ok" : "not ok", n_checks, what);
}

int main(void) {
    printf("# meson.build version %s, config.h %d.%d.%d, MXS_VERSION_CODE %d\n", MXS_EXPECT_VERSION, MXS_VERSION_MAJOR,
           MXS_VERSION_MINOR, MXS_VERSION_PATCH, MXS_VERSION_CODE);
    check(MXS_VERSION_MAJOR == MXS_EXPECT_MAJOR && MXS_VERSION_MINOR == MXS_EXPECT_MINOR &&
              MXS_VERSION_PATCH == MXS_EXPECT_PATCH,
          "config.h MXS_VERSION_MAJOR/MINOR/PATCH equal meson.build's project version");
    check(MXS_VERSION_CODE == MXS_VERSION_MAJOR * 10000 + MXS_VERSION_MINOR * 100 + MXS_VERSION_PATCH,
          "MXS_VERSION_CODE == MAJOR*10000 + MINOR*100 + PATCH");
#if defined(MXS_TEST_CUDA) || defined(MXS_TEST_NCCL)
    printf("# mxs_cuda_version() = %d\n", mxs_cuda_version());
    check(mxs_cuda_version() == MXS_VERSION_CODE, "mxs_cuda_version() == MXS_VERSION_CODE");
#endif
#if defined(MXS_TEST_NCCL)
    printf("# mxs_nccl_glue_version() = %d\n", mxs_nccl_glue_version());
    check(mxs_nccl_glue_version() == MXS_VERSION_CODE, "mxs_nccl_glue_version() == MXS_VERSION_CODE");
#endif
    printf("1..%d\n", n_checks);
    return n_failed ? 1 : 0;
}
