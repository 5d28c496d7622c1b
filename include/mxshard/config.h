/* SPDX-License-Identifier: MIT */
/* mxshard/config.h - portability macros shared by every mxshard header.
 *
 * MXS_HOST_DEVICE marks the scalar rules (conversions, index math) that the
 * host path and the CUDA kernels both call, so each rule has one definition.
 * Under nvcc it expands to `__host__ __device__`; in plain C/C++ to nothing.
 */
#ifndef MXSHARD_CONFIG_H
#define MXSHARD_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define MXS_HOST_DEVICE __host__ __device__
#else
#define MXS_HOST_DEVICE
#endif

/* Non-aliasing pointer qualifier (C99 restrict; the common extension in C++). */
#if defined(__cplusplus) || (defined(__STDC_VERSION__) && __STDC_VERSION__ < 199901L)
#if defined(__GNUC__) || defined(__clang__) || defined(_MSC_VER) || defined(__CUDACC__)
#define MXS_RESTRICT __restrict
#else
#define MXS_RESTRICT
#endif
#else
#define MXS_RESTRICT restrict
#endif

/* Every function in the headers is `static inline`: including a header in
 * several translation units never produces duplicate symbols.
 *
 * MXS_API marks the public host API. A translation unit that wants real,
 * exported symbols for it (the host shared library that FFI users such as
 * the Python package load) defines MXS_API before including any mxshard
 * header, e.g. `#define MXS_API __attribute__((visibility("default")))`.
 * MXS_PRIVATE marks helpers that are never exported (names mxs__*). */
#ifndef MXS_API
#define MXS_API static inline
#endif
#define MXS_PRIVATE static inline
#define MXS_HD static inline MXS_HOST_DEVICE

/* MXS_NODISCARD: the compiler warns when a fallible call's status is dropped. */
#if defined(__cplusplus) && __cplusplus >= 201703L
#define MXS_NODISCARD [[nodiscard]]
#elif defined(__GNUC__) || defined(__clang__)
#define MXS_NODISCARD __attribute__((warn_unused_result))
#else
#define MXS_NODISCARD
#endif

#ifdef __cplusplus
#define MXS_EXTERN_C_BEGIN extern "C" {
#define MXS_EXTERN_C_END }
#else
#define MXS_EXTERN_C_BEGIN
#define MXS_EXTERN_C_END
#endif

/* The version of these headers. meson.build's project version is the one
 * source; tests/version checks that these lines agree with it. A program
 * detects a header/library mismatch by comparing MXS_VERSION_CODE with
 * mxs_cuda_version() / mxs_nccl_glue_version() / mxs_host_version(). */
#define MXS_VERSION_MAJOR 0
#define MXS_VERSION_MINOR 2
#define MXS_VERSION_PATCH 0
#define MXS_VERSION_CODE (MXS_VERSION_MAJOR * 10000 + MXS_VERSION_MINOR * 100 + MXS_VERSION_PATCH)

#endif /* MXSHARD_CONFIG_H */
