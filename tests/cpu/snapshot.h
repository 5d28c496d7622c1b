/* SPDX-License-Identifier: MIT */
/* tests/cpu/snapshot.h - byte snapshots of buffers for the aliasing tests
 * (test_aliasing*.c): a copy taken before a call, compared after it.
 */
#ifndef MXSHARD_TESTS_CPU_SNAPSHOT_H
#define MXSHARD_TESTS_CPU_SNAPSHOT_H

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* A snapshot of a buffer, to prove a rejected call left it alone. */
typedef struct {
    const uint8_t *p;
    uint8_t *copy;
    size_t n;
} snap_t;

static inline snap_t snap(const void *p, size_t n) {
    snap_t s;
    s.p = (const uint8_t *)p;
    s.n = n;
    s.copy = (uint8_t *)malloc(n);
    cr_assert_not_null(s.copy);
    memcpy(s.copy, p, n);
    return s;
}
static inline int snap_same(const snap_t *s) { return memcmp(s->p, s->copy, s->n) == 0; }
static inline void snap_free(snap_t *s) { free(s->copy); }

#endif /* MXSHARD_TESTS_CPU_SNAPSHOT_H */
