/* SPDX-License-Identifier: MIT */
/* bench/bench_util.h - timing, same-mix ceilings and report tables for
 * bench/cuda_bench.cu and bench/nvfp4_bench.cu (programs, not part of the
 * library).
 *
 * Timing modes (all on one non-blocking stream, CUDA events):
 *   single  one call between two events, the L2 flushed before each call (a
 *           kernel READS a buffer of 3x the L2 size, so the lines it leaves
 *           are clean and the timed call pays no write-back of flush data);
 *           median of `single_reps`.
 *   b2b     K calls in a row between two events, time / K; median of
 *           `b2b_reps` such windows; no flush (steady state). K = b2b_k
 *           rounded up to a multiple of the rotation (below).
 *   graph   each call captured once into a CUDA graph
 *           (cudaStreamCaptureModeGlobal, as PyTorch captures), then K
 *           replays in a row between two events, time / K; median of
 *           `b2b_reps`. -1 when the call cannot be captured (the reason is
 *           kept).
 * A case is a list of calls used in rotation (call i % n): one call for
 * most cases; the 8 ranks' shards for DP=8, so that the b2b / graph working
 * set exceeds the L2 as it would for 8 different buckets.
 */
#ifndef MXS_BENCH_UTIL_H
#define MXS_BENCH_UTIL_H

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include <mxshard/mxshard.h>

/* A failed CUDA or mxshard call throws: the case is reported as an error
 * and the run goes on (or, after a sticky CUDA error, stops) - the tables
 * measured so far are still written. */
struct bench_error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

[[noreturn]] static void bench_fail(const char *file, int line, const char *what, const char *why) {
    char m[600];
    snprintf(m, sizeof m, "%s:%d %s: %s", file, line, what, why);
    throw bench_error(m);
}

#define CK(x)                                                                                                          \
    do {                                                                                                               \
        cudaError_t e_ = (x);                                                                                          \
        if (e_ != cudaSuccess) bench_fail(__FILE__, __LINE__, #x, cudaGetErrorString(e_));                             \
    } while (0)
#define MK(x)                                                                                                          \
    do {                                                                                                               \
        mxs_status s_ = (x);                                                                                           \
        if (s_ != MXS_OK) bench_fail(__FILE__, __LINE__, #x, mxs_status_str(s_));                                      \
    } while (0)

/* One enqueue of the measured work on stream s; MXS_OK or the failure. */
typedef std::function<mxs_status(cudaStream_t)> bench_call;

static mxs_status bench_launch_status(void) { return cudaGetLastError() == cudaSuccess ? MXS_OK : MXS_ERR_CUDA; }

/* ---- kernels ------------------------------------------------------------ */

/* Finite values with exponents in a moderate range (never zeros: zeros hide
 * unwritten outputs and can run faster than real data). f32 = 1: n f32
 * words; else n words of two bf16. */
__device__ __forceinline__ uint32_t bench_fill_word(int64_t i, uint32_t seed, int f32) {
    uint32_t h = (uint32_t)i * 2654435761u + seed;
    h ^= h >> 15;
    h *= 0x2C1B3C6Du;
    h ^= h >> 12;
    uint32_t v = ((h & 1u) << 31) | ((110u + (h >> 27)) << 23) | ((h >> 4) & 0x7FFFFFu);
    uint32_t w = ((h & 2u) << 30) | ((110u + ((h >> 22) & 31u)) << 23) | ((h >> 1) & 0x7FFFFFu);
    return f32 ? v : ((v >> 16) | (w & 0xFFFF0000u));
}

__global__ void bench_fill(uint32_t *p, int64_t n, uint32_t seed, int f32) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        p[i] = bench_fill_word(i, seed, f32);
}

/* Word `first + i` of the f32 fill (bench_fill(., ., seed, 1)) at p[i], i <
 * n: a piece of one long fill (a rank's master shard of a bucket) in its own
 * buffer. bf16 = 1: its bf16 rounding (mxs_bf16_from_f32) instead, as
 * uint16 - the reference input of a writeback with round-through bf16. The
 * pattern repeats every 2^32 words. */
__global__ void bench_fill_at(void *p, int64_t n, int64_t first, uint32_t seed, int bf16) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        uint32_t v = bench_fill_word(first + i, seed, 1);
        if (bf16) {
            ((uint16_t *)p)[i] = mxs_bf16_from_f32(__uint_as_float(v));
        } else {
            ((uint32_t *)p)[i] = v;
        }
    }
}

/* bf16 copy of an f32 master, the library's own rounding rule: the input of
 * the reference quantize (writeback with round-through bf16 == quantize of
 * the bf16 copy, docs/contract.md section 1). */
__global__ void bench_to_bf16(const float *m, uint16_t *o, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        o[i] = mxs_bf16_from_f32(m[i]);
}

__global__ void bench_diff(const uint8_t *a, const uint8_t *b, int64_t n, unsigned long long *count) {
    unsigned long long c = 0;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        c += a[i] != b[i];
    if (c) atomicAdd(count, c);
}

/* Reads n 16-byte vectors; the store never happens for real data but the
 * compiler cannot know that, so every load is issued. */
__global__ void bench_l2_flush(const uint4 *p, int64_t n, uint32_t *sink) {
    uint32_t acc = 0;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        uint4 v = p[i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9E3779B9u) *sink = acc;
}

/* The same-mix ceiling: reads nvec 16-byte vectors of IB-byte elements
 * (bf16: 8 per vector, f32: 4), writes one byte per element to each of PL
 * output planes (a byte of the input, no arithmetic) and nsvec 16-byte
 * vectors to each of PL scale planes. Coalesced 16-byte loads, U of them in
 * flight per thread before the first store.
 * FP4: the NVFP4 same-mix ceiling - each output plane takes HALF a byte per
 * element (packed nibbles): 8 bf16 -> 4 bytes, 4 f32 -> 2 bytes per 16-byte
 * input vector (bytes of the input, one XOR, no arithmetic on values). */
template <int IB, int PL, bool FP4>
__global__ void __launch_bounds__(256)
    bench_mix(const uint4 *__restrict__ in, int64_t nvec, uint8_t *__restrict__ o0, uint8_t *__restrict__ o1,
              uint4 *__restrict__ s0, uint4 *__restrict__ s1, int64_t nsvec) {
    constexpr int U = 4;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (int64_t base = tid; base < nvec; base += U * stride) {
        uint4 v[U];
#pragma unroll
        for (int k = 0; k < U; k++) {
            int64_t j = base + k * stride;
            if (j < nvec) v[k] = in[j];
        }
#pragma unroll
        for (int k = 0; k < U; k++) {
            int64_t j = base + k * stride;
            if (j >= nvec) continue;
            if (FP4 && IB == 2) { /* 8 elements -> 4 bytes */
                uint32_t o = __byte_perm(v[k].x, v[k].y, 0x7531) ^ __byte_perm(v[k].z, v[k].w, 0x7531);
                reinterpret_cast<uint32_t *>(o0)[j] = o;
                if (PL == 2) reinterpret_cast<uint32_t *>(o1)[j] = o;
            } else if (FP4) { /* 4 elements -> 2 bytes */
                uint16_t o = (uint16_t)(__byte_perm(v[k].x, v[k].y, 0x0073) ^ __byte_perm(v[k].z, v[k].w, 0x0073));
                reinterpret_cast<uint16_t *>(o0)[j] = o;
                if (PL == 2) reinterpret_cast<uint16_t *>(o1)[j] = o;
            } else if (IB == 2) { /* the high byte of each of the 8 bf16 */
                uint2 o = make_uint2(__byte_perm(v[k].x, v[k].y, 0x7531), __byte_perm(v[k].z, v[k].w, 0x7531));
                reinterpret_cast<uint2 *>(o0)[j] = o;
                if (PL == 2) reinterpret_cast<uint2 *>(o1)[j] = o;
            } else { /* the high byte of each of the 4 f32 */
                uint32_t o =
                    __byte_perm(__byte_perm(v[k].x, v[k].y, 0x0073), __byte_perm(v[k].z, v[k].w, 0x0073), 0x5410);
                reinterpret_cast<uint32_t *>(o0)[j] = o;
                if (PL == 2) reinterpret_cast<uint32_t *>(o1)[j] = o;
            }
        }
    }
    for (int64_t j = tid; j < nsvec; j += stride) {
        uint4 z = make_uint4((uint32_t)j, 0x7F7F7F7Fu, 0x7F7F7F7Fu, 0x7F7F7F7Fu);
        s0[j] = z;
        if (PL == 2) s1[j] = z;
    }
}

/* ---- timing ------------------------------------------------------------- */

struct bench_times {
    double single = -1, b2b = -1, graph = -1; /* microseconds; -1: not measured */
    std::string graph_why;                    /* why graph is -1 */
};

struct bench_ctx {
    cudaStream_t s = nullptr;
    cudaEvent_t ev0 = nullptr, ev1 = nullptr;
    int single_reps = 50, b2b_k = 20, b2b_reps = 9, warmup = 3;
    bool graphs = true;
    uint4 *flush = nullptr;
    int64_t flush_vecs = 0;
    uint32_t *sink = nullptr;
    int sms = 0;

    void init(const cudaDeviceProp &prop) {
        sms = prop.multiProcessorCount;
        CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        CK(cudaEventCreate(&ev0));
        CK(cudaEventCreate(&ev1));
        int64_t fb = std::max<int64_t>(3 * (int64_t)prop.l2CacheSize, (int64_t)192 << 20);
        flush_vecs = fb / 16;
        CK(cudaMalloc(&flush, (size_t)fb));
        CK(cudaMemset(flush, 0x5A, (size_t)fb));
        CK(cudaMalloc(&sink, 16));
    }
    void l2_flush() {
        bench_l2_flush<<<sms * 4, 512, 0, s>>>(flush, flush_vecs, sink);
        CK(cudaGetLastError());
    }
    float elapsed_ms() {
        float ms = 0;
        CK(cudaEventSynchronize(ev1));
        CK(cudaEventElapsedTime(&ms, ev0, ev1));
        return ms;
    }
};

static double bench_median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? -1 : v[v.size() / 2];
}

static void bench_must(mxs_status st, const char *what) {
    if (st != MXS_OK) {
        std::string why = std::string(mxs_status_str(st)) + " (CUDA: " + cudaGetErrorString(cudaGetLastError()) + ")";
        bench_fail(__FILE__, __LINE__, what, why.c_str());
    }
}

/* Captures call c into an executable graph; false (and why) when it cannot. */
static bool bench_capture(bench_ctx &B, const bench_call &c, cudaGraphExec_t *exec, std::string *why) {
    cudaGraph_t g = nullptr;
    cudaError_t e = cudaStreamBeginCapture(B.s, cudaStreamCaptureModeGlobal);
    if (e != cudaSuccess) {
        *why = std::string("begin capture: ") + cudaGetErrorString(e);
        cudaGetLastError();
        return false;
    }
    mxs_status st = c(B.s);
    e = cudaStreamEndCapture(B.s, &g);
    if (st != MXS_OK || e != cudaSuccess) {
        *why = st != MXS_OK ? std::string("call during capture: ") + mxs_status_str(st)
                            : std::string("end capture: ") + cudaGetErrorString(e);
        if (g) cudaGraphDestroy(g);
        cudaGetLastError();
        return false;
    }
    e = cudaGraphInstantiate(exec, g, 0);
    cudaGraphDestroy(g);
    if (e != cudaSuccess) {
        *why = std::string("instantiate: ") + cudaGetErrorString(e);
        cudaGetLastError();
        return false;
    }
    return true;
}

static bench_times bench_measure(bench_ctx &B, const std::vector<bench_call> &calls, const char *what, bool try_graph) {
    bench_times t;
    const size_t n = calls.size();
    const int K = (int)(((size_t)B.b2b_k + n - 1) / n * n); /* every call of the rotation equally often */
    for (size_t i = 0; i < (size_t)B.warmup * n; i++) bench_must(calls[i % n](B.s), what);
    CK(cudaStreamSynchronize(B.s));

    std::vector<double> v;
    for (int r = 0; r < B.single_reps; r++) {
        B.l2_flush();
        CK(cudaEventRecord(B.ev0, B.s));
        bench_must(calls[(size_t)r % n](B.s), what);
        CK(cudaEventRecord(B.ev1, B.s));
        v.push_back(1000.0 * B.elapsed_ms());
    }
    t.single = bench_median(v);

    v.clear();
    for (int r = 0; r < B.b2b_reps; r++) {
        CK(cudaEventRecord(B.ev0, B.s));
        for (int k = 0; k < K; k++) bench_must(calls[(size_t)k % n](B.s), what);
        CK(cudaEventRecord(B.ev1, B.s));
        v.push_back(1000.0 * B.elapsed_ms() / K);
    }
    t.b2b = bench_median(v);

    if (!try_graph || !B.graphs) {
        t.graph_why = "not tried";
        return t;
    }
    std::vector<cudaGraphExec_t> ex;
    for (size_t i = 0; i < n; i++) {
        cudaGraphExec_t e = nullptr;
        if (!bench_capture(B, calls[i], &e, &t.graph_why)) break;
        ex.push_back(e);
    }
    if (ex.size() == n) {
        for (size_t i = 0; i < (size_t)B.warmup * n; i++) CK(cudaGraphLaunch(ex[i % n], B.s));
        CK(cudaStreamSynchronize(B.s));
        v.clear();
        for (int r = 0; r < B.b2b_reps; r++) {
            CK(cudaEventRecord(B.ev0, B.s));
            for (int k = 0; k < K; k++) CK(cudaGraphLaunch(ex[(size_t)k % n], B.s));
            CK(cudaEventRecord(B.ev1, B.s));
            v.push_back(1000.0 * B.elapsed_ms() / K);
        }
        t.graph = bench_median(v);
    }
    for (cudaGraphExec_t e : ex) cudaGraphExecDestroy(e);
    CK(cudaStreamSynchronize(B.s));
    return t;
}

/* ---- same-mix ceilings -------------------------------------------------- */

/* One ceiling stream: `elems` input elements of in_bytes (2 or 4) bytes at
 * `in`, `planes` output planes of elems bytes, `scale_bytes` per plane. */
struct bench_mix_job {
    const void *in;
    int64_t elems;
    int in_bytes, planes;
    uint8_t *o0, *o1;
    uint8_t *s0, *s1;
    int64_t scale_bytes;
};

/* Launches bench_mix<., ., FP4> for job j: one byte (FP4 false) or half a
 * byte (FP4 true) per element per output plane. */
template <bool FP4> static inline mxs_status bench_mix_launch_as(const bench_mix_job &j, int grid, cudaStream_t s) {
    const int64_t nvec = j.elems * j.in_bytes / 16, nsvec = (j.scale_bytes + 15) / 16;
    const uint4 *in = (const uint4 *)j.in;
    uint4 *s0 = (uint4 *)j.s0, *s1 = (uint4 *)j.s1;
    if (j.in_bytes == 2 && j.planes == 1)
        bench_mix<2, 1, FP4><<<grid, 256, 0, s>>>(in, nvec, j.o0, j.o1, s0, s1, nsvec);
    else if (j.in_bytes == 2)
        bench_mix<2, 2, FP4><<<grid, 256, 0, s>>>(in, nvec, j.o0, j.o1, s0, s1, nsvec);
    else if (j.planes == 1)
        bench_mix<4, 1, FP4><<<grid, 256, 0, s>>>(in, nvec, j.o0, j.o1, s0, s1, nsvec);
    else
        bench_mix<4, 2, FP4><<<grid, 256, 0, s>>>(in, nvec, j.o0, j.o1, s0, s1, nsvec);
    return bench_launch_status();
}

static inline mxs_status bench_mix_launch(const bench_mix_job &j, int grid, cudaStream_t s) {
    return bench_mix_launch_as<false>(j, grid, s);
}

/* The NVFP4 ceiling stream (bench_mix<., ., true>): the same fields as
 * bench_mix_job, but each output plane holds elems/2 bytes (packed nibbles).
 * Build one as bench_fp4_job{{in, elems, in_bytes, planes, o0, o1, s0, s1,
 * scale_bytes}}; o0/o1 must be 4-byte (bf16 in) or 2-byte (f32 in) aligned. */
struct bench_fp4_job : bench_mix_job {};

static inline mxs_status bench_mix_launch(const bench_fp4_job &j, int grid, cudaStream_t s) {
    return bench_mix_launch_as<true>(j, grid, s);
}

/* Times the jobs (used in rotation, like a case's calls) with two grid
 * shapes - persistent (8 CTAs of 256 per SM) and one pass of U vectors per
 * thread (of the data or of the scale vectors, whichever is longer) - and
 * keeps the faster of the two in each mode. Job: bench_mix_job (one byte
 * per element per plane) or bench_fp4_job (half a byte). */
template <class Job> static bench_times bench_ceiling_of(bench_ctx &B, const std::vector<Job> &jobs, const char *what) {
    bench_times best;
    for (int variant = 0; variant < 2; variant++) {
        std::vector<bench_call> calls;
        for (const Job &j : jobs) {
            int64_t nvec = std::max(j.elems * j.in_bytes / 16, (j.scale_bytes + 15) / 16);
            int64_t one_pass = std::max<int64_t>(1, (nvec + 256 * 4 - 1) / (256 * 4));
            int grid = variant == 0 ? B.sms * 8 : (int)std::min<int64_t>(one_pass, 1 << 30);
            calls.push_back([j, grid](cudaStream_t s) { return bench_mix_launch(j, grid, s); });
        }
        bench_times t = bench_measure(B, calls, what, false);
        if (best.single < 0 || t.single < best.single) best.single = t.single;
        if (best.b2b < 0 || t.b2b < best.b2b) best.b2b = t.b2b;
    }
    return best;
}

static inline bench_times bench_ceiling(bench_ctx &B, const std::vector<bench_mix_job> &jobs, const char *what) {
    return bench_ceiling_of(B, jobs, what);
}
static inline bench_times bench_ceiling_fp4(bench_ctx &B, const std::vector<bench_fp4_job> &jobs, const char *what) {
    return bench_ceiling_of(B, jobs, what);
}

/* ---- the benches' shared report, device and flag handling ---------------- */

static inline double bench_pct(double ceil_us, double op_us) {
    return ceil_us > 0 && op_us > 0 ? 100.0 * ceil_us / op_us : -1;
}

/* v formatted with f; "–" when v < 0 (not measured). */
static inline std::string bench_fmt(const char *f, double v) {
    if (v < 0) return "–";
    char buf[64];
    snprintf(buf, sizeof buf, f, v);
    return buf;
}

static inline std::string bench_csvq(const std::string &x) {
    std::string q = "\"";
    for (char c : x) q += c == '"' ? std::string("\"\"") : std::string(1, c);
    return q + "\"";
}

static const char *const bench_ceil_header =
    "| shape | same-mix ceiling | MB | single µs | b2b µs | GB/s b2b | % copy |\n"
    "|---|---|---:|---:|---:|---:|---:|\n";

/* Prints line (flushed) and appends it to *md. */
static inline void bench_emit(std::string *md, const std::string &line) {
    fputs(line.c_str(), stdout);
    fflush(stdout);
    *md += line;
}

static inline double bench_us_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

static inline int64_t bench_align256(int64_t x) { return (x + 255) / 256 * 256; }

/* ---- tensors in device memory (mxs_tensor or mxs_nvfp4_tensor) ----------- */

/* A tensor of the shape, no pointers (the rest zero). */
template <class T>
static inline T bench_tensor_shape(int64_t rows, int64_t cols, unsigned dirs, mxs_scale_layout layout) {
    T t;
    memset(&t, 0, sizeof t);
    t.rows = rows;
    t.cols = cols;
    t.dirs = dirs;
    t.scale_layout = layout;
    return t;
}

static inline int64_t bench_data_bytes(const mxs_tensor *t) { return t->rows * t->cols; }
static inline int64_t bench_data_bytes(const mxs_nvfp4_tensor *t) { return mxs_nvfp4_data_bytes(t); }
static inline int64_t bench_scale_bytes(const mxs_tensor *t, mxs_dirs pl) { return mxs_scale_bytes(t, pl); }
static inline int64_t bench_scale_bytes(const mxs_nvfp4_tensor *t, mxs_dirs pl) { return mxs_nvfp4_scale_bytes(t, pl); }

/* Bytes of t's present planes, each data and scale plane 256-aligned. */
template <class T> static inline int64_t bench_planes_bytes(const T &t) {
    int64_t b = 0;
    for (int pl = 1; pl <= 2; pl++)
        if (t.dirs & (unsigned)pl)
            b += bench_align256(bench_data_bytes(&t)) + bench_align256(bench_scale_bytes(&t, (mxs_dirs)pl));
    return b;
}

/* Places t's present planes at base + *off and advances *off. */
template <class T> static inline void bench_planes_place(T *t, uint8_t *base, int64_t *off) {
    for (int pl = 1; pl <= 2; pl++) {
        if (!(t->dirs & (unsigned)pl)) continue;
        uint8_t *d = base + *off;
        *off += bench_align256(bench_data_bytes(t));
        uint8_t *s = base + *off;
        *off += bench_align256(bench_scale_bytes(t, (mxs_dirs)pl));
        if (pl == 1) {
            t->row_data = d;
            t->row_scale = s;
        } else {
            t->col_data = d;
            t->col_scale = s;
        }
    }
}

/* How many of the first `bytes` bytes of a and b differ (on stream s). */
static inline int64_t bench_count_diff(const uint8_t *a, const uint8_t *b, int64_t bytes, unsigned long long *dcount,
                                       cudaStream_t s) {
    unsigned long long h = 0;
    CK(cudaMemsetAsync(dcount, 0, sizeof h, s));
    bench_diff<<<1024, 256, 0, s>>>(a, b, bytes, dcount);
    CK(cudaGetLastError());
    CK(cudaMemcpyAsync(&h, dcount, sizeof h, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    return (int64_t)h;
}

/* One row of a ceiling table per entry (name: a format with one %d, the
 * plane count), printed and kept in *lines. */
struct bench_ceil_entry {
    const char *name;
    const bench_times *t;
    double bytes;
};

static inline void bench_ceiling_rows(const std::string &shape, int planes, const bench_ceil_entry *list, size_t n,
                                      double copy_gbs, std::vector<std::string> *lines) {
    for (size_t i = 0; i < n; i++) {
        const bench_ceil_entry &c = list[i];
        char name[96], line[400];
        snprintf(name, sizeof name, c.name, planes);
        double gbs = c.t->b2b > 0 ? c.bytes / c.t->b2b / 1e3 : -1;
        snprintf(line, sizeof line, "| %s | %s | %.1f | %.1f | %.1f | %.0f | %.1f %% |\n", shape.c_str(), name,
                 c.bytes / 1e6, c.t->single, c.t->b2b, gbs, 100.0 * gbs / copy_gbs);
        lines->push_back(line);
        fputs(line, stdout);
    }
}

/* A case that threw: the error line (stderr and *errors); true when the
 * CUDA context is broken (the caller rethrows: stop). */
static inline bool bench_case_error(const char *prog, const std::string &m, std::vector<std::string> *errors) {
    fprintf(stderr, "%s: ERROR %s\n", prog, m.c_str());
    errors->push_back(m);
    cudaError_t st = cudaDeviceSynchronize();
    cudaGetLastError();
    return st != cudaSuccess;
}

/* The run stopped on e: the error line (stderr and *errors). */
static inline void bench_run_stopped(const char *prog, const bench_error &e, std::vector<std::string> *errors) {
    std::string m = std::string("run stopped (CUDA context broken?): ") + e.what();
    fprintf(stderr, "%s: %s\n", prog, m.c_str());
    errors->push_back(m);
}

/* The flags both benches take. */
struct bench_args {
    std::string out, csv, shapes;
};

/* Consumes argv[*i] (and its value) when it is a shared flag: --reps N (at
 * least min_reps), --k K (at least min_k), --out, --csv, --shapes,
 * --no-graph. False when it is none of them. */
static inline bool bench_parse_flag(int argc, char **argv, int *i, int min_reps, int min_k, bench_ctx &B,
                                    bench_args *args) {
    std::string a = argv[*i];
    bool has = *i + 1 < argc;
    if (a == "--reps" && has)
        B.single_reps = std::max(min_reps, atoi(argv[++*i]));
    else if (a == "--k" && has)
        B.b2b_k = std::max(min_k, atoi(argv[++*i]));
    else if (a == "--out" && has)
        args->out = argv[++*i];
    else if (a == "--csv" && has)
        args->csv = argv[++*i];
    else if (a == "--shapes" && has)
        args->shapes = argv[++*i];
    else if (a == "--no-graph")
        B.graphs = false;
    else
        return false;
    return true;
}

/* The CSV file next to the markdown one (FILE.md -> FILE.csv) unless --csv
 * named one. */
static inline void bench_default_csv(bench_args *args) {
    if (args->csv.empty() && !args->out.empty()) {
        args->csv = args->out;
        size_t dot = args->csv.rfind('.');
        if (dot != std::string::npos && args->csv.find('/', dot) == std::string::npos) args->csv.resize(dot);
        args->csv += ".csv";
    }
}

/* The device the run measures and its versions. */
struct bench_device {
    cudaDeviceProp prop;
    int rt = 0, drv = 0;
};

/* Opens device 0 and initialises B; *t_start is taken once a device is
 * known to exist. False (after saying so) when there is no CUDA device. */
static inline bool bench_open_device(const char *prog, bench_ctx &B, bench_device *d,
                                     std::chrono::steady_clock::time_point *t_start) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("%s: no CUDA device, nothing measured\n", prog);
        return false;
    }
    *t_start = std::chrono::steady_clock::now();
    CK(cudaGetDeviceProperties(&d->prop, 0));
    CK(cudaRuntimeGetVersion(&d->rt));
    CK(cudaDriverGetVersion(&d->drv));
    B.init(d->prop);
    return true;
}

/* The copy ceiling in GB/s: 1 GiB device to device (cudaMemcpyAsync),
 * bytes read + written, b2b time with B's repetition counts. */
static inline double bench_copy_gbs(bench_ctx &B) {
    const size_t bytes = (size_t)1 << 30;
    void *ca, *cb;
    CK(cudaMalloc(&ca, bytes));
    CK(cudaMalloc(&cb, bytes));
    CK(cudaMemset(ca, 1, bytes));
    bench_times t = bench_measure(B, {[&](cudaStream_t s) {
                                      return cudaMemcpyAsync(cb, ca, bytes, cudaMemcpyDeviceToDevice, s) == cudaSuccess
                                                 ? MXS_OK
                                                 : MXS_ERR_CUDA;
                                  }},
                                  "copy", false);
    double gbs = 2.0 * (double)bytes / t.b2b / 1e3;
    CK(cudaFree(ca));
    CK(cudaFree(cb));
    return gbs;
}

/* The markdown's first sections - run header, same-mix ceilings,
 * operations (each title + suffix: "" or " (NVFP4)") - the operation rows
 * being `rows` (markdown). */
static inline std::string bench_md_head(const char *suffix, const char *head, const std::vector<std::string> &ceilings,
                                        const char *row_header, const std::string &rows) {
    std::string md = std::string("### Run header") + suffix + "\n\n";
    md += head;
    md += std::string("\n### Same-mix ceilings") + suffix + "\n\n";
    md += bench_ceil_header;
    for (auto &l : ceilings) md += l;
    md += std::string("\n### Operations") + suffix + "\n\n";
    md += row_header;
    md += rows;
    return md;
}

/* The tables' end: the error list, the byte-check and wall-time line. */
static inline void bench_emit_end(std::string *md, const std::vector<std::string> &errors, int failed_checks,
                                  std::chrono::steady_clock::time_point t_start) {
    if (!errors.empty()) {
        bench_emit(md, "\n### Errors\n\n");
        for (auto &e : errors) bench_emit(md, "* " + e + "\n");
    }
    char tail[200];
    snprintf(tail, sizeof tail, "\nbyte checks: %s; bench wall time %.0f s\n",
             failed_checks ? (std::to_string(failed_checks) + " FAILED").c_str() : "all ok",
             bench_us_since(t_start) / 1e6);
    bench_emit(md, tail);
}

/* Opens path for writing; NULL after saying so on stderr. */
static inline FILE *bench_open_out(const char *prog, const std::string &path) {
    FILE *f = fopen(path.c_str(), "w");
    if (!f) fprintf(stderr, "%s: cannot write %s\n", prog, path.c_str());
    return f;
}

/* Writes the markdown (when --out named a file); false when it cannot. */
static inline bool bench_write_md(const char *prog, const std::string &out, const std::string &md) {
    if (out.empty()) return true;
    FILE *f = bench_open_out(prog, out);
    if (!f) return false;
    fputs(md.c_str(), f);
    fclose(f);
    return true;
}

#endif /* MXS_BENCH_UTIL_H */
