/* cpu_backend.c - the cpu backend: each stream is an in-order ring of
 * commands served by its own executor thread, a launch's blocks spread over
 * the device's worker pool, events are generation counters (the
 * rt_event_base host_gen, so waits also take other backends' events),
 * timestamps read CLOCK_MONOTONIC on the executor, and kernels come from a
 * host .so through dlopen/dlsym (ABI in docs/OPS.md). Device memory is host
 * memory. */
#include <dlfcn.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"

typedef void (*cpu_kernel_fn)(void *const *bufs, const int32_t *step, uint32_t block);

/* Short busy waits before sleeping: a step's commands arrive back to back,
 * and a condition-variable round trip costs more than the gap between them. */
#define CPU_SPIN 2000

/* Spin iteration i: first a pause, then yield, so that on a machine with
 * fewer cores than threads the thread being waited for gets to run. */
static inline void cpu_backoff(int i) {
  if (i >= 64) {
    sched_yield();
    return;
  }
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

/* A launch with grid > 1, shared by its executor and the pool's workers.
 * It lives on the executor's stack; `users` says how many workers still
 * touch it, and the executor returns only at 0. */
typedef struct cpu_job {
  cpu_kernel_fn fn;
  void *const *bufs;
  const int32_t *step;
  uint32_t grid;
  _Atomic uint64_t next; /* next block to claim */
  atomic_int users;      /* workers inside job_run; changed under pool_mu */
  int linked;
  struct cpu_job *link;
} cpu_job;

struct rt_device {
  char name[64];
  uint32_t threads;
  int inline_streams; /* rt_device_options.inline_streams */
  rt_sync *sync;
  uint64_t fail_launch;
  _Atomic uint64_t launches; /* counted only when fail_launch is set */

  pthread_mutex_t pool_mu;
  pthread_cond_t pool_cv;      /* workers: a job was posted, or shutdown */
  pthread_cond_t pool_done_cv; /* executors: a job lost its last worker */
  cpu_job *jobs;               /* jobs with blocks possibly unclaimed, oldest first */
  atomic_int njobs;            /* length of jobs, for workers spinning without the lock */
  int sleepers;                /* workers waiting on pool_cv */
  int shutdown;
  pthread_t *workers;
  uint32_t nworkers;
};

enum { CPU_LAUNCH, CPU_COPY, CPU_RECORD, CPU_WAIT, CPU_TIMESTAMP };

typedef struct cpu_cmd {
  uint32_t kind, grid;
  union {
    struct {
      cpu_kernel_fn fn;
      void *const *bufs;
      const int32_t *step;
    } launch;
    struct {
      void *dst;
      const void *src;
      size_t bytes;
    } copy;
    struct {
      rt_event_base *ev;
      uint64_t gen;
    } event;
    uint64_t *stamp;
  } u;
} cpu_cmd;

/* A single-producer (the device's submitter), single-consumer (the
 * executor) ring. The producer publishes with a release store of tail, so a
 * command costs a few stores; the executor sleeps only after spinning, and
 * sets `sleeping` so the producer knows when a wake-up is needed. */
struct rt_stream {
  rt_device *dev;
  cpu_cmd *ring;
  uint64_t mask;
  _Atomic uint64_t tail; /* written by the producer only */
  _Atomic uint64_t head; /* written by the executor only */
  atomic_int sleeping;
  atomic_int syncers;
  atomic_int producer_waiting;
  atomic_int shutdown;
  /* The event and generation the executor waits for, spinning or asleep
   * (stream_state); NULL otherwise. */
  _Atomic(rt_event_base *) waiting;
  _Atomic uint64_t waiting_gen;
  pthread_mutex_t mu;
  pthread_cond_t work_cv;  /* executor sleeps here */
  pthread_cond_t idle_cv;  /* syncers sleep here */
  pthread_cond_t space_cv; /* a producer facing a full ring sleeps here */
  pthread_t thread;
};

/* Nothing beyond the shared header: its host_gen is the counter that
 * record stores and wait reads. */
struct rt_event {
  rt_event_base base;
};

struct rt_module {
  void *handle;
  char path[];
};

/* The trace clock: CLOCK_MONOTONIC is one clock for every thread and core
 * of the host, so all cpu devices' timestamps compare directly. */
static uint64_t monotonic_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- the worker pool ---- */

static void job_run(rt_device *d, cpu_job *j) {
  for (;;) {
    if (rt_sync_poisoned(d->sync)) return;
    uint64_t b = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
    if (b >= j->grid) return;
    j->fn(j->bufs, j->step, (uint32_t)b);
  }
}

static void job_unlink(rt_device *d, cpu_job *j) {
  if (!j->linked) return;
  atomic_fetch_sub(&d->njobs, 1);
  for (cpu_job **pp = &d->jobs; *pp; pp = &(*pp)->link) {
    if (*pp == j) {
      *pp = j->link;
      break;
    }
  }
  j->linked = 0;
}

static void *worker_main(void *arg) {
  rt_device *d = arg;
  pthread_mutex_lock(&d->pool_mu);
  for (;;) {
    if (d->shutdown) break;
    if (!d->jobs) {
      /* Launches of a step come back to back: spin a while before paying
       * for a sleep and a wake-up. */
      pthread_mutex_unlock(&d->pool_mu);
      for (int i = 0; i < CPU_SPIN && !atomic_load_explicit(&d->njobs, memory_order_relaxed); i++)
        cpu_backoff(i);
      pthread_mutex_lock(&d->pool_mu);
      while (!d->shutdown && !d->jobs) {
        d->sleepers++;
        pthread_cond_wait(&d->pool_cv, &d->pool_mu);
        d->sleepers--;
      }
      continue;
    }
    cpu_job *j = d->jobs;
    atomic_fetch_add(&j->users, 1);
    pthread_mutex_unlock(&d->pool_mu);
    job_run(d, j);
    pthread_mutex_lock(&d->pool_mu);
    /* Every block is claimed once any thread returns from job_run, so the
     * job no longer needs to be found. */
    job_unlink(d, j);
    if (atomic_fetch_sub(&j->users, 1) == 1) pthread_cond_broadcast(&d->pool_done_cv);
  }
  pthread_mutex_unlock(&d->pool_mu);
  return NULL;
}

static void run_launch(rt_device *d, cpu_kernel_fn fn, void *const *bufs, const int32_t *step,
                       uint32_t grid) {
  if (grid == 1 || d->nworkers == 0) {
    for (uint32_t b = 0; b < grid; b++) {
      if (b && rt_sync_poisoned(d->sync)) return;
      fn(bufs, step, b);
    }
    return;
  }
  cpu_job j = {.fn = fn, .bufs = bufs, .step = step, .grid = grid, .linked = 1};
  atomic_init(&j.next, 0);
  atomic_init(&j.users, 0);
  pthread_mutex_lock(&d->pool_mu);
  cpu_job **pp = &d->jobs;
  while (*pp) pp = &(*pp)->link;
  *pp = &j;
  j.link = NULL;
  atomic_fetch_add(&d->njobs, 1);
  if (d->sleepers) {
    if (grid - 1 >= (uint32_t)d->sleepers)
      pthread_cond_broadcast(&d->pool_cv);
    else
      for (uint32_t i = 0; i + 1 < grid; i++) pthread_cond_signal(&d->pool_cv);
  }
  pthread_mutex_unlock(&d->pool_mu);

  job_run(d, &j); /* the executor works too */

  /* Workers that took the job finish their blocks; the lock taken below
   * also makes sure the last one has left its critical section, which
   * still touches j, before j goes out of scope. */
  for (int i = 0; i < CPU_SPIN && atomic_load_explicit(&j.users, memory_order_acquire); i++)
    cpu_backoff(i);
  pthread_mutex_lock(&d->pool_mu);
  job_unlink(d, &j);
  while (atomic_load(&j.users) > 0) pthread_cond_wait(&d->pool_done_cv, &d->pool_mu);
  pthread_mutex_unlock(&d->pool_mu);
}

/* ---- devices ---- */

static void device_stop_workers(rt_device *d, uint32_t started) {
  pthread_mutex_lock(&d->pool_mu);
  d->shutdown = 1;
  pthread_cond_broadcast(&d->pool_cv);
  pthread_mutex_unlock(&d->pool_mu);
  for (uint32_t i = 0; i < started; i++) pthread_join(d->workers[i], NULL);
}

static void cpu_device_close(rt_device *d) {
  if (!d) return;
  device_stop_workers(d, d->nworkers);
  free(d->workers);
  pthread_cond_destroy(&d->pool_done_cv);
  pthread_cond_destroy(&d->pool_cv);
  pthread_mutex_destroy(&d->pool_mu);
  free(d);
}

static rt_status cpu_device_open(const rt_device_options *o, rt_device **out_device) {
  *out_device = NULL;
  if (!o->sync) return rt_status_make("cpu device open: no rt_sync given");
  uint32_t threads = o->threads ? o->threads : 1;
  rt_device *d = calloc(1, sizeof *d);
  if (!d) return rt_status_make("cpu device %s: out of memory", o->name ? o->name : "?");
  snprintf(d->name, sizeof d->name, "%s", o->name ? o->name : "cpu");
  d->threads = threads;
  d->inline_streams = o->inline_streams;
  d->sync = o->sync;
  d->fail_launch = o->fail_launch;
  atomic_init(&d->launches, 0);
  atomic_init(&d->njobs, 0);
  pthread_mutex_init(&d->pool_mu, NULL);
  pthread_cond_init(&d->pool_cv, NULL);
  pthread_cond_init(&d->pool_done_cv, NULL);
  /* The thread that runs the launch (the stream's executor, or the
   * submitter) is one of the `threads`. */
  uint32_t want = threads - 1;
  if (want) {
    d->workers = calloc(want, sizeof *d->workers);
    if (!d->workers) {
      cpu_device_close(d);
      return rt_status_make("cpu device %s: out of memory", d->name);
    }
  }
  for (uint32_t i = 0; i < want; i++) {
    int rc = pthread_create(&d->workers[i], NULL, worker_main, d);
    if (rc) {
      device_stop_workers(d, i);
      d->nworkers = 0;
      rt_status s = rt_status_make("cpu device %s: pthread_create (worker %u of %u): %s", d->name,
                                   i + 1, want, strerror(rc));
      cpu_device_close(d);
      return s;
    }
    d->nworkers = i + 1;
  }
  *out_device = d;
  return NULL;
}

static rt_status cpu_mem_alloc(rt_device *d, size_t bytes, void **out_ptr) {
  *out_ptr = NULL;
  size_t n = (bytes + 63) & ~(size_t)63;
  if (n < bytes) return rt_status_make("cpu device %s: allocation of %zu bytes overflows", d->name, bytes);
  if (n == 0) n = 64;
  void *p = aligned_alloc(64, n);
  if (!p) return rt_status_make("cpu device %s: cannot allocate %zu bytes", d->name, bytes);
  memset(p, 0, n);
  *out_ptr = p;
  return NULL;
}

static void cpu_mem_free(rt_device *d, void *ptr) {
  (void)d;
  free(ptr);
}

static rt_status cpu_copy(rt_device *d, void *dst, const void *src, size_t bytes) {
  (void)d;
  if (bytes) memmove(dst, src, bytes);
  return NULL;
}

/* ---- streams ---- */

static void stream_wake_producer(rt_stream *s) {
  if (!atomic_load_explicit(&s->producer_waiting, memory_order_acquire)) return;
  pthread_mutex_lock(&s->mu);
  pthread_cond_broadcast(&s->space_cv);
  pthread_mutex_unlock(&s->mu);
}

static void execute(rt_stream *s, const cpu_cmd *c) {
  rt_device *d = s->dev;
  /* A poisoned step still drains its queues so syncs return, but runs nothing. */
  if (rt_sync_poisoned(d->sync)) return;
  switch (c->kind) {
  case CPU_LAUNCH:
    if (d->fail_launch) {
      uint64_t n = atomic_fetch_add(&d->launches, 1) + 1;
      if (n == d->fail_launch) {
        rt_sync_poison(d->sync, rt_status_make("cpu device %s: launch %llu failed (injected fault)",
                                               d->name, (unsigned long long)n));
        return;
      }
    }
    run_launch(d, c->u.launch.fn, c->u.launch.bufs, c->u.launch.step, c->grid);
    break;
  case CPU_COPY:
    if (c->u.copy.bytes) memmove(c->u.copy.dst, c->u.copy.src, c->u.copy.bytes);
    break;
  case CPU_RECORD:
    atomic_store_explicit(&c->u.event.ev->host_gen, c->u.event.gen, memory_order_release);
    rt_sync_notify(d->sync);
    break;
  case CPU_WAIT: {
    /* A cpu event or a host-visible event of another backend, whose owner
     * stores host_gen and notifies the bundle's rt_sync the same way. */
    _Atomic uint64_t *g = &c->u.event.ev->host_gen;
    if (atomic_load_explicit(g, memory_order_acquire) >= c->u.event.gen) return;
    /* Published before the spin: on a loaded machine the spin's yields can
     * outlast a watchdog's bound, and its report must still name the wait. */
    atomic_store_explicit(&s->waiting_gen, c->u.event.gen, memory_order_relaxed);
    atomic_store_explicit(&s->waiting, c->u.event.ev, memory_order_release);
    int done = 0;
    for (int i = 0; i < CPU_SPIN && !done; i++) {
      if (atomic_load_explicit(g, memory_order_acquire) >= c->u.event.gen) done = 1;
      else if (rt_sync_poisoned(d->sync)) done = 1;
      else cpu_backoff(i);
    }
    if (!done) rt_sync_wait(d->sync, g, c->u.event.gen);
    atomic_store_explicit(&s->waiting, NULL, memory_order_relaxed);
    break;
  }
  case CPU_TIMESTAMP:
    /* Read by the host only after stream_sync, whose acquire of head pairs
     * with the executor's release after this command. */
    *c->u.stamp = monotonic_ns();
    break;
  }
}

static void *executor_main(void *arg) {
  rt_stream *s = arg;
  uint64_t h = atomic_load_explicit(&s->head, memory_order_relaxed);
  for (;;) {
    uint64_t t = atomic_load_explicit(&s->tail, memory_order_acquire);
    if (h != t) {
      execute(s, &s->ring[h & s->mask]);
      h++;
      atomic_store_explicit(&s->head, h, memory_order_release);
      stream_wake_producer(s);
      continue;
    }
    /* Drained: tell syncers (the fence pairs with their increment). */
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load(&s->syncers)) {
      pthread_mutex_lock(&s->mu);
      pthread_cond_broadcast(&s->idle_cv);
      pthread_mutex_unlock(&s->mu);
    }
    int i = 0;
    while (i < CPU_SPIN && atomic_load_explicit(&s->tail, memory_order_acquire) == h) {
      cpu_backoff(i);
      i++;
    }
    if (i < CPU_SPIN) continue;
    pthread_mutex_lock(&s->mu);
    atomic_store(&s->sleeping, 1);
    while (atomic_load(&s->tail) == h && !atomic_load(&s->shutdown)) {
      pthread_cond_broadcast(&s->idle_cv);
      pthread_cond_wait(&s->work_cv, &s->mu);
    }
    atomic_store(&s->sleeping, 0);
    int done = atomic_load(&s->shutdown) && atomic_load(&s->tail) == h;
    pthread_mutex_unlock(&s->mu);
    if (done) break;
  }
  return NULL;
}

static rt_status cpu_stream_flush(rt_stream *s) {
  if (s->dev->inline_streams) return NULL; /* no executor to wake */
  /* Pairs with the executor's store of `sleeping` then load of tail. */
  atomic_thread_fence(memory_order_seq_cst);
  if (atomic_load(&s->sleeping)) {
    pthread_mutex_lock(&s->mu);
    pthread_cond_signal(&s->work_cv);
    pthread_mutex_unlock(&s->mu);
  }
  return NULL;
}

static void stream_free(rt_stream *s) {
  pthread_cond_destroy(&s->space_cv);
  pthread_cond_destroy(&s->idle_cv);
  pthread_cond_destroy(&s->work_cv);
  pthread_mutex_destroy(&s->mu);
  free(s->ring);
  free(s);
}

static rt_status cpu_stream_create(rt_device *d, uint32_t capacity_hint, rt_stream **out_stream) {
  *out_stream = NULL;
  uint64_t cap = 64;
  while (cap < (uint64_t)capacity_hint + 1 && cap < ((uint64_t)1 << 24)) cap <<= 1;
  rt_stream *s = calloc(1, sizeof *s);
  cpu_cmd *ring = d->inline_streams ? NULL : calloc(cap, sizeof *ring); /* the executor's queue */
  if (!s || (!d->inline_streams && !ring)) {
    free(s);
    free(ring);
    return rt_status_make("cpu device %s: cannot allocate a stream of %llu commands", d->name,
                          (unsigned long long)cap);
  }
  s->dev = d;
  s->ring = ring;
  s->mask = cap - 1;
  atomic_init(&s->tail, 0);
  atomic_init(&s->head, 0);
  atomic_init(&s->sleeping, 0);
  atomic_init(&s->syncers, 0);
  atomic_init(&s->producer_waiting, 0);
  atomic_init(&s->shutdown, 0);
  atomic_init(&s->waiting, NULL);
  atomic_init(&s->waiting_gen, 0);
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->work_cv, NULL);
  pthread_cond_init(&s->idle_cv, NULL);
  pthread_cond_init(&s->space_cv, NULL);
  if (d->inline_streams) {
    *out_stream = s;
    return NULL;
  }
  int rc = pthread_create(&s->thread, NULL, executor_main, s);
  if (rc) {
    stream_free(s);
    return rt_status_make("cpu device %s: pthread_create (stream executor): %s", d->name,
                          strerror(rc));
  }
  *out_stream = s;
  return NULL;
}

static rt_status cpu_stream_sync(rt_stream *s) {
  uint64_t t = atomic_load_explicit(&s->tail, memory_order_relaxed);
  cpu_stream_flush(s);
  for (int i = 0; i < CPU_SPIN; i++) {
    if (atomic_load_explicit(&s->head, memory_order_acquire) == t) return NULL;
    cpu_backoff(i);
  }
  pthread_mutex_lock(&s->mu);
  atomic_fetch_add(&s->syncers, 1);
  while (atomic_load(&s->head) != t) pthread_cond_wait(&s->idle_cv, &s->mu);
  atomic_fetch_sub(&s->syncers, 1);
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

/* The ring's counters are the stream's own progress; the watchdog reads
 * them without disturbing the executor. */
static void cpu_stream_state(rt_stream *s, rt_stream_state *out) {
  uint64_t done = atomic_load_explicit(&s->head, memory_order_acquire);
  uint64_t queued = atomic_load_explicit(&s->tail, memory_order_acquire);
  const rt_event_base *ev = atomic_load_explicit(&s->waiting, memory_order_acquire);
  *out = (rt_stream_state){.counted = 1, .queued = queued, .done = done, .idle = done == queued,
                           .waiting = ev,
                           .waiting_gen = ev ? atomic_load_explicit(&s->waiting_gen,
                                                                    memory_order_relaxed) : 0};
}

static void cpu_stream_destroy(rt_stream *s) {
  if (!s) return;
  if (s->dev->inline_streams) {
    stream_free(s);
    return;
  }
  pthread_mutex_lock(&s->mu);
  atomic_store(&s->shutdown, 1);
  pthread_cond_signal(&s->work_cv);
  pthread_mutex_unlock(&s->mu);
  pthread_join(s->thread, NULL);
  stream_free(s);
}

/* The producer's half of the ring. A full ring is rare (the capacity hint
 * covers a step), so waiting for room uses a timed wait instead of a second
 * Dekker pair on the executor's hot path. */
static void enqueue(rt_stream *s, const cpu_cmd *c) {
  uint64_t t = atomic_load_explicit(&s->tail, memory_order_relaxed);
  if (s->dev->inline_streams) {
    /* Run here and now: the counters still say queued, then done, so the
     * watchdog's report and stream_sync read it as an executor's. */
    atomic_store_explicit(&s->tail, t + 1, memory_order_release);
    execute(s, c);
    atomic_store_explicit(&s->head, t + 1, memory_order_release);
    return;
  }
  if (t - atomic_load_explicit(&s->head, memory_order_acquire) > s->mask) {
    cpu_stream_flush(s);
    pthread_mutex_lock(&s->mu);
    atomic_store(&s->producer_waiting, 1);
    while (t - atomic_load(&s->head) > s->mask) {
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      ts.tv_nsec += 1000000;
      if (ts.tv_nsec >= 1000000000) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000;
      }
      pthread_cond_timedwait(&s->space_cv, &s->mu, &ts);
    }
    atomic_store(&s->producer_waiting, 0);
    pthread_mutex_unlock(&s->mu);
  }
  s->ring[t & s->mask] = *c;
  atomic_store_explicit(&s->tail, t + 1, memory_order_release);
  /* A cheap hint: a missed wake-up here only delays the executor until the
   * next flush, which every submitter issues before blocking and at step end. */
  if (atomic_load_explicit(&s->sleeping, memory_order_relaxed)) cpu_stream_flush(s);
}

/* block (GPU threads per block) does not apply: a block runs on one thread. */
static rt_status cpu_launch(rt_stream *s, rt_kernel *k, uint32_t grid, uint32_t block,
                            void *const *bufs, const int32_t *step) {
  (void)block;
  cpu_cmd c = {.kind = CPU_LAUNCH, .grid = grid};
  c.u.launch.fn = (cpu_kernel_fn)(void *)k;
  c.u.launch.bufs = bufs;
  c.u.launch.step = step;
  enqueue(s, &c);
  return NULL;
}

static rt_status cpu_copy_async(rt_stream *s, void *dst, const void *src, size_t bytes) {
  cpu_cmd c = {.kind = CPU_COPY};
  c.u.copy.dst = dst;
  c.u.copy.src = src;
  c.u.copy.bytes = bytes;
  enqueue(s, &c);
  return NULL;
}

static rt_status cpu_event_record(rt_stream *s, rt_event *e, uint64_t generation) {
  /* Only the owner may store an event's host_gen: another backend keeps
   * more state behind it than the counter. */
  rt_event_base *base = (rt_event_base *)e;
  if (base->be != &rt_cpu_backend)
    return rt_status_make("cpu device %s: cannot record an event of backend '%s'", s->dev->name,
                          base->be ? base->be->name : "?");
  cpu_cmd c = {.kind = CPU_RECORD};
  c.u.event.ev = base;
  c.u.event.gen = generation;
  enqueue(s, &c);
  return NULL;
}

static rt_status cpu_event_wait(rt_stream *s, rt_event *e, uint64_t generation) {
  cpu_cmd c = {.kind = CPU_WAIT};
  c.u.event.ev = (rt_event_base *)e;
  c.u.event.gen = generation;
  enqueue(s, &c);
  return NULL;
}

static rt_status cpu_timestamp(rt_stream *s, uint64_t *out_ns) {
  cpu_cmd c = {.kind = CPU_TIMESTAMP};
  c.u.stamp = out_ns;
  enqueue(s, &c);
  return NULL;
}

/* ---- events ---- */

/* host_visible asks nothing more of a cpu event: its counter is in host
 * memory and always current. */
static rt_status cpu_event_create(rt_device *d, int host_visible, rt_event **out_event) {
  (void)host_visible;
  rt_event *e = calloc(1, sizeof *e);
  *out_event = e;
  if (!e) return rt_status_make("cpu device %s: out of memory creating an event", d->name);
  e->base.be = &rt_cpu_backend;
  atomic_init(&e->base.host_gen, 0);
  return NULL;
}

static void cpu_event_destroy(rt_event *e) { free(e); }

/* ---- code objects ---- */

static rt_status cpu_module_load(rt_device *d, const char *path, const void *bytes, size_t len,
                                 rt_module **out_module) {
  (void)len;
  *out_module = NULL;
  if (!path || bytes)
    return rt_status_make("cpu device %s: host code objects load from files only (%s)", d->name,
                          path ? path : "in-memory code object");
  size_t n = strlen(path);
  rt_module *m = malloc(sizeof *m + n + 1);
  if (!m) return rt_status_make("cpu device %s: out of memory loading %s", d->name, path);
  memcpy(m->path, path, n + 1);
  m->handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!m->handle) {
    const char *why = dlerror();
    rt_status s = rt_status_make("%s: dlopen failed: %s", path, why ? why : "unknown error");
    free(m);
    return s;
  }
  *out_module = m;
  return NULL;
}

static void cpu_module_unload(rt_module *m) {
  if (!m) return;
  dlclose(m->handle);
  free(m);
}

static rt_status cpu_kernel_find(rt_module *m, const char *symbol, rt_kernel **out_kernel) {
  *out_kernel = NULL;
  dlerror();
  void *sym = dlsym(m->handle, symbol);
  if (!sym) {
    const char *why = dlerror();
    return rt_status_make("%s: kernel symbol %s not found%s%s", m->path, symbol, why ? ": " : "",
                          why ? why : "");
  }
  /* The handle is the function's address; cpu_launch turns it back. */
  *out_kernel = (rt_kernel *)sym;
  return NULL;
}

const rt_backend rt_cpu_backend = {
    .name = "cpu",
    .device_open = cpu_device_open,
    .device_close = cpu_device_close,
    .mem_alloc = cpu_mem_alloc,
    .mem_free = cpu_mem_free,
    .copy_h2d = cpu_copy,
    .copy_d2h = cpu_copy,
    .copy_d2d = cpu_copy,
    .stream_create = cpu_stream_create,
    .stream_destroy = cpu_stream_destroy,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_destroy,
    .module_load = cpu_module_load,
    .module_unload = cpu_module_unload,
    .kernel_find = cpu_kernel_find,
    .launch = cpu_launch,
    .copy_async = cpu_copy_async,
    .event_record = cpu_event_record,
    .event_wait = cpu_event_wait,
    .timestamp = cpu_timestamp,
    .stream_flush = cpu_stream_flush,
    .stream_sync = cpu_stream_sync,
    .stream_state = cpu_stream_state,
};
