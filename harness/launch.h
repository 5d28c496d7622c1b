/* SPDX-License-Identifier: MIT */
/* harness/launch.h - one process per GPU, like torchrun, for the nccl
 * test suite and the demo. Header-only; C11 + POSIX.
 *
 *   #define _POSIX_C_SOURCE 200809L     (before any #include)
 *   #include "launch.h"
 *   static void my_rank(mxs_rank *r, void *user) { ... r->comm, r->stream ... }
 *   int main(void) { return mxs_launch("my_test", my_rank, NULL); }
 *
 * What mxs_launch does, and why:
 *
 *   parent (touches neither CUDA nor NCCL: a CUDA/NCCL call before fork()
 *   makes the children hang in ncclCommInitRank)
 *     setenv NCCL_NVLS_ENABLE=0        (NVLink multicast off on these hosts)
 *     count GPUs: $MXS_NGPUS, else a probe child calls cudaGetDeviceCount
 *                 and pipes the count back; $MXS_NRANKS caps the rank count
 *     < 2 GPUs -> prints "SKIP ..." and returns 77 (meson: skipped)
 *     fork rank 0 .. n-1 ----------------------------------------------+
 *     poll the report pipes, buffer each rank's lines                  |
 *     reap; kill (by pid) what outlives $MXS_LAUNCH_TIMEOUT seconds     |
 *     (default 240) or a failed rank by 20 s; print each rank's        |
 *     report and verdict                                               |
 *                                                                      v
 *   rank q: unbuffered stdout; rank 0 calls ncclGetUniqueId and writes it
 *   into ranks 1..n-1's id pipes; cudaSetDevice(q); ncclCommInitRank;
 *   a stream (cudaStreamCreate: blocking, so it also orders against
 *   legacy-default-stream calls such as cudaMemcpy); fn(rank, user);
 *   ncclCommDestroy; _exit(0 if no check failed, 1 otherwise).
 *
 * Inside fn, mxs_rank_log() writes a line to the rank's report pipe and
 * MXS_CHECK(r, cond, fmt, ...) counts a check (and logs it when it fails).
 */
#ifndef MXSHARD_HARNESS_LAUNCH_H
#define MXSHARD_HARNESS_LAUNCH_H

#if !defined(_POSIX_C_SOURCE) || _POSIX_C_SOURCE < 200809L
#error "define _POSIX_C_SOURCE 200809L before any #include to use launch.h"
#endif

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#define MXS_LAUNCH_MAX_RANKS 64

typedef struct mxs_rank {
    int rank, nranks;
    ncclComm_t comm;
    cudaStream_t stream;
    int report_fd; /* write end of this rank's report pipe */
    long passed, failed;
} mxs_rank;

typedef void (*mxs_rank_main)(mxs_rank *r, void *user);

/* Writes all of buf to fd (retrying short writes and EINTR). */
static inline int mxs__write_all(int fd, const void *buf, size_t n) {
    const char *p = (const char *)buf;
    while (n > 0) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

static inline int mxs__read_all(int fd, void *buf, size_t n) {
    char *p = (char *)buf;
    while (n > 0) {
        ssize_t k = read(fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* One line (a newline is appended) into this rank's report. */
static inline void mxs_rank_log(mxs_rank *r, const char *fmt, ...) {
    char line[1024];
    va_list ap;
    int n;
    va_start(ap, fmt);
    n = vsnprintf(line, sizeof line - 1, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if (n > (int)sizeof line - 2) n = (int)sizeof line - 2;
    line[n++] = '\n';
    if (mxs__write_all(r->report_fd, line, (size_t)n) != 0) fputs(line, stdout);
}

#define MXS_CHECK(r, cond, ...)                                                                                        \
    do {                                                                                                               \
        if (cond) {                                                                                                    \
            (r)->passed++;                                                                                             \
        } else {                                                                                                       \
            (r)->failed++;                                                                                             \
            mxs_rank_log((r), "  FAIL %s:%d: %s", __FILE__, __LINE__, #cond);                                          \
            mxs_rank_log((r), "       " __VA_ARGS__);                                                                  \
        }                                                                                                              \
    } while (0)

static inline long mxs__env_long(const char *name, long fallback) {
    const char *v = getenv(name);
    char *end;
    long x;
    if (!v || !*v) return fallback;
    x = strtol(v, &end, 10);
    return *end ? fallback : x;
}

static inline double mxs__now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Counts GPUs without touching CUDA in this process. */
static inline int mxs__count_gpus(char *why, size_t why_len) {
    struct {
        int count;
        char msg[200];
    } rep;
    int fds[2], st;
    pid_t pid;
    long env = mxs__env_long("MXS_NGPUS", -1);
    if (env >= 0) {
        snprintf(why, why_len, "MXS_NGPUS=%ld", env);
        return (int)env;
    }
    if (pipe(fds) != 0) {
        snprintf(why, why_len, "pipe() failed");
        return 0;
    }
    fflush(stdout);
    fflush(stderr);
    pid = fork();
    if (pid < 0) {
        snprintf(why, why_len, "fork() failed");
        close(fds[0]);
        close(fds[1]);
        return 0;
    }
    if (pid == 0) { /* probe child: the only CUDA call before the ranks */
        cudaError_t e;
        close(fds[0]);
        alarm(60);
        memset(&rep, 0, sizeof rep);
        e = cudaGetDeviceCount(&rep.count);
        if (e != cudaSuccess) {
            rep.count = 0;
            snprintf(rep.msg, sizeof rep.msg, "cudaGetDeviceCount: %s", cudaGetErrorString(e));
        } else {
            snprintf(rep.msg, sizeof rep.msg, "cudaGetDeviceCount = %d", rep.count);
        }
        _exit(mxs__write_all(fds[1], &rep, sizeof rep) == 0 ? 0 : 1);
    }
    close(fds[1]);
    memset(&rep, 0, sizeof rep);
    if (mxs__read_all(fds[0], &rep, sizeof rep) != 0) {
        rep.count = 0;
        snprintf(rep.msg, sizeof rep.msg, "the GPU probe process died");
    }
    close(fds[0]);
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    rep.msg[sizeof rep.msg - 1] = '\0';
    snprintf(why, why_len, "%s", rep.msg);
    return rep.count;
}

/* Body of rank q (never returns). */
static inline void mxs__rank_child(int q, int n, int id_fds[][2], int rep_fds[][2], mxs_rank_main fn, void *user,
                                   long timeout_s) {
    mxs_rank r;
    ncclUniqueId id;
    ncclResult_t nr;
    cudaError_t ce;
    int k;
    char line[256];
    setvbuf(stdout, NULL, _IONBF, 0);
    setvbuf(stderr, NULL, _IONBF, 0);
    alarm((unsigned)timeout_s); /* a rank stuck in a collective dies instead of hanging the suite */
    for (k = 0; k < n; k++) {
        if (k != q) close(rep_fds[k][1]);
        close(rep_fds[k][0]);
        if (k != q) close(id_fds[k][0]);
        if (q != 0) close(id_fds[k][1]);
    }
    memset(&r, 0, sizeof r);
    r.rank = q;
    r.nranks = n;
    r.report_fd = rep_fds[q][1];
    if (q == 0) {
        nr = ncclGetUniqueId(&id);
        if (nr != ncclSuccess) {
            mxs_rank_log(&r, "ncclGetUniqueId: %s", ncclGetErrorString(nr));
            _exit(3); /* closing the id pipes lets the other ranks fail too */
        }
        for (k = 1; k < n; k++) {
            if (mxs__write_all(id_fds[k][1], &id, sizeof id) != 0) _exit(3);
            close(id_fds[k][1]);
        }
    } else if (mxs__read_all(id_fds[q][0], &id, sizeof id) != 0) {
        mxs_rank_log(&r, "no NCCL unique id from rank 0");
        _exit(3);
    }
    if ((ce = cudaSetDevice(q)) != cudaSuccess) {
        mxs_rank_log(&r, "cudaSetDevice(%d): %s", q, cudaGetErrorString(ce));
        _exit(3);
    }
    if ((nr = ncclCommInitRank(&r.comm, n, id, q)) != ncclSuccess) {
        mxs_rank_log(&r, "ncclCommInitRank: %s", ncclGetErrorString(nr));
        _exit(3);
    }
    if ((ce = cudaStreamCreate(&r.stream)) != cudaSuccess) {
        mxs_rank_log(&r, "cudaStreamCreate: %s", cudaGetErrorString(ce));
        _exit(3);
    }
    fn(&r, user);
    ce = cudaStreamSynchronize(r.stream);
    if (ce != cudaSuccess) {
        r.failed++;
        mxs_rank_log(&r, "  FAIL final cudaStreamSynchronize: %s", cudaGetErrorString(ce));
    }
    ncclCommDestroy(r.comm);
    cudaStreamDestroy(r.stream);
    snprintf(line, sizeof line, "%ld checks passed, %ld failed", r.passed, r.failed);
    mxs_rank_log(&r, "%s", line);
    close(r.report_fd);
    _exit(r.failed == 0 ? 0 : 1);
}

typedef struct mxs__rank_out {
    pid_t pid;
    int fd; /* read end of the report pipe, -1 once at EOF */
    int reaped, status;
    char *text;
    size_t len, cap;
} mxs__rank_out;

static inline void mxs__append(mxs__rank_out *o, const char *buf, size_t n) {
    if (o->len + n + 1 > o->cap) {
        size_t cap = (o->cap ? o->cap * 2 : 4096);
        char *p;
        while (cap < o->len + n + 1) cap *= 2;
        p = (char *)realloc(o->text, cap);
        if (!p) return;
        o->text = p;
        o->cap = cap;
    }
    memcpy(o->text + o->len, buf, n);
    o->len += n;
    o->text[o->len] = '\0';
}

/* Runs fn on one process per GPU. Returns 0 when every rank passed, 77 when
 * there are fewer than 2 GPUs (skip), 1 otherwise. */
static inline int mxs_launch(const char *name, mxs_rank_main fn, void *user) {
    int id_fds[MXS_LAUNCH_MAX_RANKS][2], rep_fds[MXS_LAUNCH_MAX_RANKS][2];
    mxs__rank_out out[MXS_LAUNCH_MAX_RANKS];
    char why[256];
    int n, q, open_fds, bad = 0;
    long timeout_s = mxs__env_long("MXS_LAUNCH_TIMEOUT", 240), cap = mxs__env_long("MXS_NRANKS", 0);
    double t0, deadline, kill_at = -1.0;

    setvbuf(stdout, NULL, _IONBF, 0);
    setenv("NCCL_NVLS_ENABLE", "0", 1);
    n = mxs__count_gpus(why, sizeof why);
    if (cap > 0 && n > cap) n = (int)cap;
    if (n > MXS_LAUNCH_MAX_RANKS) n = MXS_LAUNCH_MAX_RANKS;
    if (n < 2) {
        printf("SKIP %s: needs at least 2 CUDA GPUs (one process per GPU), found %d (%s)\n", name, n < 0 ? 0 : n, why);
        return 77;
    }
    printf("%s: %d ranks, one per GPU (%s)\n", name, n, why);
    for (q = 0; q < n; q++) {
        if (pipe(id_fds[q]) != 0 || pipe(rep_fds[q]) != 0) {
            printf("%s: pipe() failed\n", name);
            return 1;
        }
    }
    fflush(stdout);
    fflush(stderr);
    memset(out, 0, sizeof out);
    for (q = 0; q < n; q++) {
        pid_t pid = fork();
        if (pid < 0) {
            int p;
            printf("%s: fork() failed for rank %d\n", name, q);
            for (p = 0; p < q; p++) {
                kill(out[p].pid, SIGKILL);
                waitpid(out[p].pid, NULL, 0);
            }
            for (p = 0; p < n; p++) {
                close(id_fds[p][0]);
                close(id_fds[p][1]);
                close(rep_fds[p][0]);
                close(rep_fds[p][1]);
            }
            return 1;
        }
        if (pid == 0) mxs__rank_child(q, n, id_fds, rep_fds, fn, user, timeout_s);
        out[q].pid = pid;
    }
    for (q = 0; q < n; q++) {
        close(id_fds[q][0]);
        close(id_fds[q][1]);
        close(rep_fds[q][1]);
        out[q].fd = rep_fds[q][0];
    }
    t0 = mxs__now_s();
    deadline = t0 + (double)timeout_s + 10.0;
    for (;;) {
        struct pollfd pf[MXS_LAUNCH_MAX_RANKS];
        int idx[MXS_LAUNCH_MAX_RANKS], np = 0, alive = 0;
        for (q = 0; q < n; q++) {
            if (out[q].fd >= 0) {
                pf[np].fd = out[q].fd;
                pf[np].events = POLLIN;
                pf[np].revents = 0;
                idx[np++] = q;
            }
        }
        if (np > 0)
            poll(pf, (nfds_t)np, 100);
        else {
            struct timespec ts = {0, 50000000};
            nanosleep(&ts, NULL);
        }
        for (q = 0; q < np; q++) {
            if (pf[q].revents & (POLLIN | POLLHUP | POLLERR)) {
                char buf[4096];
                ssize_t k = read(pf[q].fd, buf, sizeof buf);
                if (k > 0)
                    mxs__append(&out[idx[q]], buf, (size_t)k);
                else if (k == 0 || errno != EINTR) {
                    close(pf[q].fd);
                    out[idx[q]].fd = -1;
                }
            }
        }
        for (q = 0; q < n; q++) {
            if (!out[q].reaped) {
                int st;
                pid_t w = waitpid(out[q].pid, &st, WNOHANG);
                if (w == out[q].pid) {
                    out[q].reaped = 1;
                    out[q].status = st;
                    if ((!WIFEXITED(st) || WEXITSTATUS(st) != 0) && kill_at < 0) kill_at = mxs__now_s() + 20.0;
                } else {
                    alive++;
                }
            }
        }
        open_fds = 0;
        for (q = 0; q < n; q++) open_fds += out[q].fd >= 0;
        if (alive == 0 && open_fds == 0) break;
        if (mxs__now_s() > deadline || (kill_at > 0 && mxs__now_s() > kill_at)) {
            for (q = 0; q < n; q++) {
                if (!out[q].reaped) {
                    char msg[96];
                    int k = snprintf(msg, sizeof msg, "  (killed by the launcher after %.0f s)\n", mxs__now_s() - t0);
                    mxs__append(&out[q], msg, (size_t)k);
                    kill(out[q].pid, SIGKILL);
                }
            }
            deadline = mxs__now_s() + 1e9;
            kill_at = -1.0;
        }
    }
    for (q = 0; q < n; q++) {
        int st = out[q].status, ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
        const char *p = out[q].text ? out[q].text : "";
        printf("---- rank %d ----\n", q);
        while (*p) { /* prefix every line with its rank */
            const char *e = strchr(p, '\n');
            int len = e ? (int)(e - p) : (int)strlen(p);
            printf("[rank %d] %.*s\n", q, len, p);
            p += len + (e ? 1 : 0);
        }
        if (WIFEXITED(st))
            printf("rank %d: %s (exit %d)\n", q, ok ? "PASS" : "FAIL", WEXITSTATUS(st));
        else
            printf("rank %d: FAIL (killed by signal %d)\n", q, WIFSIGNALED(st) ? WTERMSIG(st) : -1);
        bad |= !ok;
        free(out[q].text);
    }
    printf("%s: %s (%d ranks, %.1f s)\n", name, bad ? "FAIL" : "PASS", n, mxs__now_s() - t0);
    return bad ? 1 : 0;
}

#endif /* MXSHARD_HARNESS_LAUNCH_H */
