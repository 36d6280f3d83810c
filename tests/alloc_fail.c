/* alloc_fail.c - the test allocator of alloc_fail.h: glibc's allocator
 * underneath, a count of allocations and live blocks on top, and the armed
 * allocation answered with NULL and ENOMEM. glibc lets a program replace
 * its allocator by defining these functions; its own calls (fopen, strdup,
 * dlopen, pthread_create) then come here as well. Threads of the runtime
 * allocate too, so the counters are atomic. */
#include "alloc_fail.h"

#include <errno.h>
#include <stdatomic.h>
#include <stddef.h>

extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *p, size_t n);
extern void __libc_free(void *p);
extern void *__libc_memalign(size_t align, size_t n);
extern void *__libc_valloc(size_t n);
extern void *__libc_pvalloc(size_t n);

static atomic_uint_fast64_t count, fail_at;
static atomic_int sticky, fired;
static atomic_int_fast64_t live;
static _Atomic(void *) site;

void alloc_fail_reset(void) { atomic_store(&count, 0); }
uint64_t alloc_fail_count(void) { return atomic_load(&count); }
int64_t alloc_fail_live(void) { return atomic_load(&live); }
int alloc_fail_fired(void) { return atomic_load(&fired); }
void *alloc_fail_site(void) { return atomic_load(&site); }

void alloc_fail_arm(uint64_t n, int stick) {
  atomic_store(&fired, 0);
  atomic_store(&site, NULL);
  atomic_store(&sticky, stick);
  atomic_store(&fail_at, n);
}

void alloc_fail_disarm(void) { atomic_store(&fail_at, 0); }

/* Counts one allocation; nonzero when it is to fail. */
static int should_fail(void *caller) {
  uint64_t n = atomic_fetch_add(&count, 1) + 1, at = atomic_load(&fail_at);
  if (!at || (n != at && !(atomic_load(&sticky) && n > at))) return 0;
  void *none = NULL;
  atomic_compare_exchange_strong(&site, &none, caller);
  atomic_store(&fired, 1);
  errno = ENOMEM;
  return 1;
}

static void *counted(void *p) {
  if (p) atomic_fetch_add(&live, 1);
  return p;
}

void *malloc(size_t n) {
  return should_fail(__builtin_return_address(0)) ? NULL : counted(__libc_malloc(n));
}

void *calloc(size_t n, size_t size) {
  return should_fail(__builtin_return_address(0)) ? NULL : counted(__libc_calloc(n, size));
}

void *realloc(void *p, size_t n) {
  if (should_fail(__builtin_return_address(0))) return NULL;
  if (!p) return counted(__libc_realloc(NULL, n));
  void *q = __libc_realloc(p, n);
  if (!n && !q) atomic_fetch_sub(&live, 1); /* glibc frees p for size 0 */
  return q;
}

void free(void *p) {
  if (!p) return;
  atomic_fetch_sub(&live, 1);
  __libc_free(p);
}

void *memalign(size_t align, size_t n) {
  return should_fail(__builtin_return_address(0)) ? NULL : counted(__libc_memalign(align, n));
}

void *aligned_alloc(size_t align, size_t n) {
  return should_fail(__builtin_return_address(0)) ? NULL : counted(__libc_memalign(align, n));
}

int posix_memalign(void **out, size_t align, size_t n) {
  if (!align || (align & (align - 1)) || align % sizeof(void *)) return EINVAL;
  if (should_fail(__builtin_return_address(0))) return ENOMEM;
  void *p = counted(__libc_memalign(align, n));
  if (!p) return ENOMEM;
  *out = p;
  return 0;
}

void *valloc(size_t n) {
  return should_fail(__builtin_return_address(0)) ? NULL : counted(__libc_valloc(n));
}

void *pvalloc(size_t n) {
  return should_fail(__builtin_return_address(0)) ? NULL : counted(__libc_pvalloc(n));
}
