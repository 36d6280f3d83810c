/* backend.c - picks the backend for a plan device, and the shared poison
 * point (rt_sync) through which every backend and submitter of a bundle
 * stops together when a step fails. */
#include "backend.h"

#include <string.h>

#include "gpu/gpu_backend.h"

const char *rt_backend_name(uint32_t which) {
  switch (which) {
  case PLAN_BACKEND_CPU: return "cpu";
  case PLAN_BACKEND_HIP: return "hip";
  case PLAN_BACKEND_CUDA: return "cuda";
  default: return "?";
  }
}

rt_status rt_backend_lookup(uint32_t which, const rt_backend **out_backend) {
  *out_backend = NULL;
  switch (which) {
  case PLAN_BACKEND_CPU:
    *out_backend = &rt_cpu_backend;
    return NULL;
  case PLAN_BACKEND_HIP:
    *out_backend = &rt_hip_backend;
    return NULL;
  case PLAN_BACKEND_CUDA:
    *out_backend = &rt_cuda_backend;
    return NULL;
  default:
    return rt_status_make("unknown backend %u", which);
  }
}

rt_status rt_sync_init(rt_sync *s) {
  memset(s, 0, sizeof *s);
  int rc = pthread_mutex_init(&s->mu, NULL);
  if (rc) return rt_status_make("pthread_mutex_init: %s", strerror(rc));
  rc = pthread_cond_init(&s->cv, NULL);
  if (rc) {
    pthread_mutex_destroy(&s->mu);
    return rt_status_make("pthread_cond_init: %s", strerror(rc));
  }
  atomic_init(&s->poisoned, 0);
  atomic_init(&s->waiters, 0);
  s->first = NULL;
  return NULL;
}

void rt_sync_destroy(rt_sync *s) {
  rt_status_free(s->first);
  s->first = NULL;
  pthread_cond_destroy(&s->cv);
  pthread_mutex_destroy(&s->mu);
}

void rt_sync_poison(rt_sync *s, rt_status err) {
  pthread_mutex_lock(&s->mu);
  if (!s->first)
    s->first = err;
  else
    rt_status_free(err);
  atomic_store(&s->poisoned, 1);
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

rt_status rt_sync_take(rt_sync *s) {
  pthread_mutex_lock(&s->mu);
  rt_status e = s->first;
  s->first = NULL;
  atomic_store(&s->poisoned, 0);
  pthread_mutex_unlock(&s->mu);
  return e;
}

/* The store that precedes this call and the waiters counter form a Dekker
 * pair: the fence makes sure that either the waiter sees the new value or we
 * see the waiter, so the lock is taken only when someone sleeps. */
void rt_sync_notify(rt_sync *s) {
  atomic_thread_fence(memory_order_seq_cst);
  if (atomic_load(&s->waiters) == 0) return;
  pthread_mutex_lock(&s->mu);
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
}

int rt_sync_wait(rt_sync *s, const _Atomic uint64_t *value, uint64_t target) {
  if (atomic_load_explicit(value, memory_order_acquire) >= target) return 0;
  pthread_mutex_lock(&s->mu);
  atomic_fetch_add(&s->waiters, 1);
  while (atomic_load(value) < target && !atomic_load(&s->poisoned))
    pthread_cond_wait(&s->cv, &s->mu);
  atomic_fetch_sub(&s->waiters, 1);
  int reached = atomic_load(value) >= target;
  pthread_mutex_unlock(&s->mu);
  return reached ? 0 : -1;
}
