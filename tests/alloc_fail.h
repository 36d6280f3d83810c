/* alloc_fail.h - a test allocator that counts allocations and live blocks
 * and fails a chosen one. alloc_fail.c defines malloc, calloc, realloc,
 * free, posix_memalign, aligned_alloc and memalign over glibc's own
 * (__libc_malloc and friends), so every allocation of the process passes
 * through it: the project's, libyaml's, the C library's. Only the test
 * executable that links it gets it; it cannot sit beside the sanitizers'
 * interceptors, so it is built only without DS4_SANITIZE. */
#ifndef DS4_ALLOC_FAIL_H
#define DS4_ALLOC_FAIL_H

#include <stdint.h>

/* Restarts the count: the next allocation is number 1. */
void alloc_fail_reset(void);
/* Allocations since the last reset (each malloc, calloc, aligned one, and
 * each realloc, whether it grows, shrinks or starts a block). */
uint64_t alloc_fail_count(void);
/* Blocks allocated and not yet freed, over the whole process. */
int64_t alloc_fail_live(void);

/* Fail allocation number n after the last reset (0: none). With sticky
 * set, every allocation from n on fails too: the way to see a path that
 * survives one failure only by calling the allocator again. */
void alloc_fail_arm(uint64_t n, int sticky);
void alloc_fail_disarm(void);
/* Whether the armed allocation has failed yet. */
int alloc_fail_fired(void);
/* The code address that made the allocation that failed (its caller's
 * return address), or NULL. */
void *alloc_fail_site(void);

#endif
