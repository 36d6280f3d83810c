/* gpu_backend.c - the vtable of the `cuda` and `hip` backends, written once
 * over the driver table of gpu_api.h: streams are the driver's non-blocking
 * streams, events its events, code objects its modules, and host work in
 * stream order (publishing an event to other backends, waiting for
 * theirs) runs as driver callbacks. Timestamps are timing events turned
 * into CLOCK_MONOTONIC nanoseconds at stream_sync. With the watchdog on,
 * stream_sync polls, so that a stream that never finishes cannot hold the
 * caller for good. */
#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu_api.h"
#include "gpu_backend.h"

/* Spins of a host task waiting for another backend's event before it
 * sleeps: such waits are usually short, and a sleep costs a wake-up. */
#define GPU_SPIN 2000
/* The clock anchor (see clock_anchor): taken again about once a second;
 * its host time is read within a window of this many ns, in as many tries. */
#define GPU_ANCHOR_REFRESH_NS 1000000000ull
#define GPU_ANCHOR_WINDOW_NS 20000u
#define GPU_ANCHOR_ATTEMPTS 4
#define GPU_SLOTS_PER_CHUNK 64
/* A polled stream_sync sleeps this long between queries once its spin is
 * spent: short next to a step, long next to a query. */
#define GPU_POLL_SLEEP_NS 20000

typedef struct gpu_registration {
  void *ptr;
  int owned; /* this device registered it (see gpu_api.host_register) */
} gpu_registration;

struct rt_device {
  const rt_backend *be;
  const gpu_api *api;
  gpu_driver *drv;
  char name[64];
  rt_sync *sync;
  uint64_t fail_launch;
  _Atomic uint64_t launches; /* counted only when fail_launch is set */
  uint64_t watchdog_ns;      /* rt_device_options.watchdog_ms; 0: off */
  int overlap_launches;      /* rt_device_options.overlap_launches */
  /* A private stream for the synchronous copies, the zeroing of new memory
   * and the clock anchors. The legacy default stream would not do: the
   * runtime's streams are non-blocking, so they do not wait for it. */
  gpu_stream host_stream;

  /* The clock: anchor is a timing event whose CLOCK_MONOTONIC time was
   * read on the host when it completed (anchor_ns); every timestamp of the
   * device is placed relative to it. */
  pthread_mutex_t clock_mu;
  gpu_event anchor;
  uint64_t anchor_ns;
  uint32_t stamping; /* streams holding unresolved timestamps */

  pthread_mutex_t reg_mu;
  gpu_registration *regs;
  size_t nregs, regs_cap;

  /* Graph capture's fork and join (graph_begin, graph_end); NULL until a
   * graph is first captured. */
  gpu_event fork_join;
};

/* Host work enqueued in stream order: the publication of a host-visible
 * record, or a wait for another backend's event. */
typedef struct gpu_host_slot {
  gpu_host_task task; /* first: the driver hands back &task */
  rt_device *dev;
  rt_stream *stream;
  rt_event_base *event;
  uint64_t generation;
} gpu_host_slot;

/* Slots live until the driver has run them, i.e. until the stream is
 * synchronised; chunks never move, so slots can be handed to the driver. */
typedef struct gpu_slot_chunk {
  struct gpu_slot_chunk *next;
  gpu_host_slot slots[GPU_SLOTS_PER_CHUNK];
} gpu_slot_chunk;

typedef struct gpu_stamp {
  gpu_event ev; /* a timing event, reused from step to step */
  uint64_t *out;
} gpu_stamp;

/* A stream is used by one thread at a time (its device's submitter, then
 * whoever synchronises it), so its bookkeeping needs no lock. */
struct rt_stream {
  rt_device *dev;
  gpu_stream s;
  gpu_slot_chunk *chunks, *chunk; /* chunk: the one being filled; NULL: none yet */
  uint32_t used;                  /* slots taken in chunk */
  /* A synchronisation failed: the driver may still call back into slots,
   * so they are never reused (the device is lost anyway). */
  int failed;
  gpu_stamp *stamps;
  uint32_t nstamps, nevents, cap; /* pending, events created, allocated */
  int stamping;                   /* counted in dev->stamping */
  /* The foreign event a host task of the stream sleeps for, and the
   * generation (stream_state); set on the driver's callback thread. */
  _Atomic(const rt_event_base *) waiting;
  _Atomic uint64_t waiting_gen;
};

struct rt_event {
  rt_event_base base; /* first: another backend's stream reads it */
  rt_device *dev;
  gpu_event ev;
  int host_visible;
};

struct rt_graph {
  rt_device *dev;
  rt_stream *origin; /* the stream it runs on */
  gpu_graph g;
  gpu_graph_exec exec;
  size_t nodes, edges;
};

struct rt_module {
  rt_device *dev;
  gpu_module m;
  char name[]; /* the code object's path, for messages */
};

static uint64_t monotonic_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline void gpu_backoff(int i) {
  if (i >= 64) {
    sched_yield();
    return;
  }
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

/* Every entry point runs this first: the calling thread may never have
 * used the device (see gpu_api.make_current). */
static rt_status current(rt_device *d) { return d->api->make_current(d->drv); }

static rt_status out_of_memory(rt_device *d, const char *what) {
  return rt_status_make("%s device %s: out of memory (%s)", d->api->name, d->name, what);
}

/* ---- the clock ---- */

/* Record the anchor on the idle host stream and wait for it, reading the
 * host clock before and after: the anchor ran inside that window, and is
 * placed at its middle. A window is usually a few microseconds; one that a
 * preempted thread stretched is measured again. */
static rt_status clock_anchor(rt_device *d) {
  for (int attempt = 0; attempt < GPU_ANCHOR_ATTEMPTS; attempt++) {
    uint64_t before = monotonic_ns();
    RT_TRY(d->api->event_record(d->drv, d->anchor, d->host_stream));
    RT_TRY(d->api->event_sync(d->drv, d->anchor));
    uint64_t after = monotonic_ns();
    d->anchor_ns = before + (after - before) / 2;
    if (after - before <= GPU_ANCHOR_WINDOW_NS) break;
  }
  return NULL;
}

/* Called with clock_mu held, before the stream's first timestamp since it
 * was last resolved is recorded: the anchor is refreshed only while no
 * stream holds one (below), so every timestamp follows the anchor it is
 * measured from and the elapsed time is never negative. */
static void stamps_begin(rt_stream *s) {
  if (s->stamping) return;
  s->stamping = 1;
  s->dev->stamping++;
}

static void stamps_end_locked(rt_stream *s) {
  s->nstamps = 0;
  if (!s->stamping) return;
  s->stamping = 0;
  s->dev->stamping--;
}

static void stamps_drop(rt_stream *s) {
  pthread_mutex_lock(&s->dev->clock_mu);
  stamps_end_locked(s);
  pthread_mutex_unlock(&s->dev->clock_mu);
}

/* Turn the stream's timestamps into nanoseconds: the anchor's host time
 * plus the events' elapsed time from it. The events resolve to about 0.5
 * us; the float milliseconds keep that resolution for spans of a few
 * seconds, which is why the anchor is taken again about once a second
 * (that also keeps the GPU's clock from drifting away from the host's).
 * Stamps of one device thus compare to ~0.5 us, and stamps of different
 * devices (or against the host) to within half the anchors' windows (a few
 * us, 10 at most unless the host was too busy to read a narrow window). */
static rt_status stamps_resolve(rt_stream *s) {
  rt_device *d = s->dev;
  rt_status st = NULL;
  pthread_mutex_lock(&d->clock_mu);
  for (uint32_t i = 0; i < s->nstamps && !st; i++) {
    float ms = 0;
    st = d->api->event_elapsed_ms(d->drv, d->anchor, s->stamps[i].ev, &ms);
    if (!st) *s->stamps[i].out = d->anchor_ns + (uint64_t)llround((double)ms * 1e6);
  }
  stamps_end_locked(s);
  if (!st && d->stamping == 0 && monotonic_ns() - d->anchor_ns > GPU_ANCHOR_REFRESH_NS)
    st = clock_anchor(d);
  pthread_mutex_unlock(&d->clock_mu);
  return st;
}

/* ---- devices ---- */

static void gpu_device_close(rt_device *d) {
  if (!d) return;
  if (d->drv) {
    /* The host stream exists once the device was selected, and the
     * registrations and the anchor only after it. */
    if (d->host_stream) {
      rt_status_free(current(d));
      for (size_t i = 0; i < d->nregs; i++)
        if (d->regs[i].owned) d->api->host_unregister(d->drv, d->regs[i].ptr);
      rt_status_free(d->api->stream_sync(d->drv, d->host_stream));
      if (d->anchor) d->api->event_destroy(d->drv, d->anchor);
      if (d->fork_join) d->api->event_destroy(d->drv, d->fork_join);
      d->api->stream_destroy(d->drv, d->host_stream);
    }
    d->api->unload(d->drv);
  }
  free(d->regs);
  pthread_mutex_destroy(&d->reg_mu);
  pthread_mutex_destroy(&d->clock_mu);
  free(d);
}

static rt_status device_start(rt_device *d, uint32_t ordinal) {
  const gpu_api *api = d->api;
  uint32_t count = 0;
  RT_TRY(api->load(d->name, &d->drv));
  RT_TRY(api->init(d->drv, &count));
  if (ordinal >= count)
    return rt_status_make(
        "%s device %s: ordinal %u does not exist (the %s driver sees %u device%s)", api->name,
        d->name, ordinal, api->name, count, count == 1 ? "" : "s");
  RT_TRY(api->select(d->drv, ordinal));
  api->peer_enable(d->drv);
  RT_TRY(api->stream_create(d->drv, &d->host_stream));
  RT_TRY(api->event_create(d->drv, 1, &d->anchor));
  return clock_anchor(d);
}

static rt_status gpu_device_open(const rt_backend *be, const gpu_api *api,
                                 const rt_device_options *o, rt_device **out_device) {
  *out_device = NULL;
  if (!o->sync) return rt_status_make("%s device open: no rt_sync given", api->name);
  const char *name = o->name ? o->name : api->name;
  rt_device *d = calloc(1, sizeof *d);
  if (!d) return rt_status_make("%s device %s: out of memory", api->name, name);
  d->be = be;
  d->api = api;
  snprintf(d->name, sizeof d->name, "%s", name);
  d->sync = o->sync;
  d->fail_launch = o->fail_launch;
  atomic_init(&d->launches, 0);
  d->watchdog_ns = (uint64_t)o->watchdog_ms * 1000000u;
  d->overlap_launches = o->overlap_launches;
  pthread_mutex_init(&d->clock_mu, NULL);
  pthread_mutex_init(&d->reg_mu, NULL);
  rt_status s = device_start(d, o->ordinal);
  if (s) {
    gpu_device_close(d);
    return s;
  }
  *out_device = d;
  return NULL;
}

static rt_status cuda_device_open(const rt_device_options *o, rt_device **out_device) {
  return gpu_device_open(&rt_cuda_backend, &gpu_cuda_api, o, out_device);
}

static rt_status hip_device_open(const rt_device_options *o, rt_device **out_device) {
  return gpu_device_open(&rt_hip_backend, &gpu_hip_api, o, out_device);
}

/* ---- memory ---- */

/* The copies and the zeroing go through the host stream and wait for it:
 * a plain synchronous copy from pageable memory may return before its DMA
 * has landed, and a kernel on a non-blocking stream would then race it. */
static rt_status host_stream_run(rt_device *d, rt_status enqueued) {
  RT_TRY(enqueued);
  return d->api->stream_sync(d->drv, d->host_stream);
}

static rt_status gpu_mem_alloc(rt_device *d, size_t bytes, void **out_ptr) {
  *out_ptr = NULL;
  size_t n = bytes ? bytes : 64; /* the drivers refuse 0; they align to 256 */
  RT_TRY(current(d));
  void *p = NULL;
  RT_TRY(d->api->mem_alloc(d->drv, n, &p));
  rt_status s = host_stream_run(d, d->api->memset_async(d->drv, d->host_stream, p, 0, n));
  if (s) {
    d->api->mem_free(d->drv, p);
    return s;
  }
  *out_ptr = p;
  return NULL;
}

static void gpu_mem_free(rt_device *d, void *ptr) {
  if (!ptr) return;
  rt_status_free(current(d));
  d->api->mem_free(d->drv, ptr);
}

/* One function serves h2d, d2h and d2d: the driver tells the kinds apart
 * by address. */
static rt_status gpu_copy(rt_device *d, void *dst, const void *src, size_t bytes) {
  if (!bytes) return NULL;
  RT_TRY(current(d));
  return host_stream_run(d, d->api->memcpy_async(d->drv, d->host_stream, dst, src, bytes));
}

static rt_status gpu_host_register(rt_device *d, void *ptr, size_t bytes) {
  pthread_mutex_lock(&d->reg_mu);
  rt_status s = NULL;
  if (d->nregs == d->regs_cap) {
    size_t cap = d->regs_cap ? 2 * d->regs_cap : 8;
    gpu_registration *r = realloc(d->regs, cap * sizeof *r);
    if (r) {
      d->regs = r;
      d->regs_cap = cap;
    } else {
      s = out_of_memory(d, "host registrations");
    }
  }
  int owned = 0;
  if (!s) s = current(d);
  if (!s) s = d->api->host_register(d->drv, ptr, bytes, &owned);
  if (!s) d->regs[d->nregs++] = (gpu_registration){ptr, owned};
  pthread_mutex_unlock(&d->reg_mu);
  return s;
}

static void gpu_host_unregister(rt_device *d, void *ptr) {
  pthread_mutex_lock(&d->reg_mu);
  for (size_t i = 0; i < d->nregs; i++) {
    if (d->regs[i].ptr != ptr) continue;
    if (d->regs[i].owned) {
      rt_status_free(current(d));
      d->api->host_unregister(d->drv, ptr);
    }
    d->regs[i] = d->regs[--d->nregs];
    break;
  }
  pthread_mutex_unlock(&d->reg_mu);
}

/* ---- streams ---- */

static rt_status gpu_stream_create(rt_device *d, uint32_t capacity_hint, rt_stream **out_stream) {
  (void)capacity_hint; /* the driver's queues hold any number of commands */
  *out_stream = NULL;
  rt_stream *s = calloc(1, sizeof *s);
  if (!s) return out_of_memory(d, "a stream");
  s->dev = d;
  atomic_init(&s->waiting, NULL);
  atomic_init(&s->waiting_gen, 0);
  rt_status st = current(d);
  if (!st) st = d->api->stream_create(d->drv, &s->s);
  if (st) {
    free(s);
    return st;
  }
  *out_stream = s;
  return NULL;
}

static void gpu_stream_destroy(rt_stream *s) {
  if (!s) return;
  rt_device *d = s->dev;
  rt_status_free(current(d));
  /* Callbacks still queued point into the slots freed below. */
  rt_status_free(d->api->stream_sync(d->drv, s->s));
  stamps_drop(s);
  for (uint32_t i = 0; i < s->nevents; i++) d->api->event_destroy(d->drv, s->stamps[i].ev);
  d->api->stream_destroy(d->drv, s->s);
  while (s->chunks) {
    gpu_slot_chunk *next = s->chunks->next;
    free(s->chunks);
    s->chunks = next;
  }
  free(s->stamps);
  free(s);
}

static rt_status slot_take(rt_stream *s, gpu_host_slot **out_slot) {
  if (!s->chunk || s->used == GPU_SLOTS_PER_CHUNK) {
    gpu_slot_chunk *next = s->chunk ? s->chunk->next : s->chunks;
    if (!next) {
      next = calloc(1, sizeof *next);
      if (!next) return out_of_memory(s->dev, "host task slots");
      if (s->chunk)
        s->chunk->next = next;
      else
        s->chunks = next;
    }
    s->chunk = next;
    s->used = 0;
  }
  *out_slot = &s->chunk->slots[s->used++];
  return NULL;
}

static rt_status gpu_stream_flush(rt_stream *s) {
  (void)s; /* the driver submits as commands are enqueued */
  return NULL;
}

/* The watchdog's stream_sync: queries instead of one blocking call. A
 * stream still busy watchdog_ns after its step was poisoned (by the
 * watchdog's report, or another failure) is given up: it holds a kernel
 * that does not return, which nothing but the driver can stop. */
static rt_status stream_sync_polled(rt_stream *s) {
  rt_device *d = s->dev;
  uint64_t give_up = 0;
  for (int i = 0;; i++) {
    int idle = 0;
    RT_TRY(d->api->stream_query(d->drv, s->s, &idle));
    if (idle) return NULL;
    if (rt_sync_poisoned(d->sync)) {
      uint64_t now = monotonic_ns();
      if (!give_up) give_up = now + d->watchdog_ns;
      if (now >= give_up)
        return rt_status_make("%s device %s: a stream is still busy %llu ms after its step failed "
                              "(a kernel that does not return?)",
                              d->api->name, d->name, (unsigned long long)(d->watchdog_ns / 1000000u));
    }
    if (i < GPU_SPIN) {
      gpu_backoff(i);
    } else {
      struct timespec ts = {0, GPU_POLL_SLEEP_NS};
      nanosleep(&ts, NULL);
    }
  }
}

/* A failure here is one the device met while running the stream (a kernel
 * fault, say): it is returned and also poisons the step, so that the
 * other devices' host-side waits of this step give up. */
static rt_status gpu_stream_sync(rt_stream *s) {
  rt_device *d = s->dev;
  rt_status st = current(d);
  if (!st) st = d->watchdog_ns ? stream_sync_polled(s) : d->api->stream_sync(d->drv, s->s);
  if (st) {
    s->failed = 1;
    stamps_drop(s);
    rt_sync_poison(d->sync, rt_status_make("%s", rt_status_msg(st)));
    return st;
  }
  if (!s->failed) {
    s->chunk = NULL;
    s->used = 0;
  }
  return stamps_resolve(s);
}

/* The driver tells whether the stream is idle; what holds it, only a
 * foreign wait's host task can tell (a failed query reads as busy: the
 * sync reports the failure). Commands are not counted. */
static void gpu_stream_state(rt_stream *s, rt_stream_state *out) {
  rt_device *d = s->dev;
  int idle = 0;
  rt_status st = current(d);
  if (!st) st = d->api->stream_query(d->drv, s->s, &idle);
  if (st) idle = 0;
  rt_status_free(st);
  const rt_event_base *ev = atomic_load_explicit(&s->waiting, memory_order_acquire);
  *out = (rt_stream_state){
      .idle = idle,
      .waiting = ev,
      .waiting_gen = ev ? atomic_load_explicit(&s->waiting_gen, memory_order_relaxed) : 0};
}

/* ---- events ---- */

static rt_status gpu_event_create(rt_device *d, int host_visible, rt_event **out_event) {
  *out_event = NULL;
  rt_event *e = calloc(1, sizeof *e);
  if (!e) return out_of_memory(d, "an event");
  e->base.be = d->be;
  atomic_init(&e->base.host_gen, 0);
  e->dev = d;
  e->host_visible = host_visible;
  rt_status s = current(d);
  if (!s) s = d->api->event_create(d->drv, 0, &e->ev);
  if (s) {
    free(e);
    return s;
  }
  *out_event = e;
  return NULL;
}

static void gpu_event_destroy(rt_event *e) {
  if (!e) return;
  rt_status_free(current(e->dev));
  e->dev->api->event_destroy(e->dev->drv, e->ev);
  free(e);
}

/* Runs on the driver's callback thread once the record has executed. */
static void publish_run(gpu_host_task *t, rt_status err) {
  gpu_host_slot *slot = (gpu_host_slot *)t;
  if (err) {
    /* The record never happens: poisoning releases whoever waits for it. */
    rt_sync_poison(slot->dev->sync, err);
    return;
  }
  atomic_store_explicit(&slot->event->host_gen, slot->generation, memory_order_release);
  rt_sync_notify(slot->dev->sync);
}

static rt_status gpu_event_record(rt_stream *s, rt_event *e, uint64_t generation) {
  rt_device *d = s->dev;
  if (e->base.be != d->be || e->dev != d)
    return rt_status_make("%s device %s: event_record: the event belongs to another device "
                          "(events are recorded on their own device's streams)",
                          d->api->name, d->name);
  RT_TRY(current(d));
  RT_TRY(d->api->event_record(d->drv, e->ev, s->s));
  if (!e->host_visible) return NULL;
  gpu_host_slot *slot;
  RT_TRY(slot_take(s, &slot));
  slot->task.run = publish_run;
  slot->dev = d;
  slot->event = &e->base;
  slot->generation = generation;
  return d->api->host_task(d->drv, s->s, &slot->task);
}

/* Holds a stream of this device until another backend's event (a cpu
 * device's) reaches the generation: no GPU command can wait for a host
 * counter, so a host task waits instead, spinning briefly and then
 * sleeping on the bundle's rt_sync (a poisoned step releases it). It
 * occupies the driver's callback thread meanwhile, and the drivers may run
 * the callbacks of all streams of a device (CUDA: "may be serialized") on
 * that one thread. Acceptable while nothing else needs that thread until
 * the wait ends, which holds when each GPU device's host-visible records
 * and foreign waits all sit on one stream (they then run in stream order):
 * so it is in tiny-gpu-cpu, whose copies to and from the cpu device, and
 * the records and waits around them, are all on the GPU's copy stream.
 * Spread over two streams of one GPU, a publication (publish_run) could
 * queue behind this wait on the callback thread while the awaited event
 * depends on it: a deadlock (docs/GPU.md, "Backends"). */
static void foreign_wait_run(gpu_host_task *t, rt_status err) {
  gpu_host_slot *slot = (gpu_host_slot *)t;
  rt_sync *sync = slot->dev->sync;
  if (err) {
    rt_sync_poison(sync, err);
    return;
  }
  const _Atomic uint64_t *gen = &slot->event->host_gen;
  for (int i = 0; i < GPU_SPIN; i++) {
    if (atomic_load_explicit(gen, memory_order_acquire) >= slot->generation) return;
    if (rt_sync_poisoned(sync)) return;
    gpu_backoff(i);
  }
  rt_stream *s = slot->stream;
  atomic_store_explicit(&s->waiting_gen, slot->generation, memory_order_relaxed);
  atomic_store_explicit(&s->waiting, slot->event, memory_order_release);
  rt_sync_wait(sync, gen, slot->generation);
  atomic_store_explicit(&s->waiting, NULL, memory_order_relaxed);
}

static rt_status gpu_event_wait(rt_stream *s, rt_event *e, uint64_t generation) {
  rt_device *d = s->dev;
  rt_event_base *base = &e->base;
  RT_TRY(current(d));
  /* An event of this backend, on any device: the runtime enqueues a wait
   * only after the record of the same step, so the event's latest record
   * is the awaited one, whatever the generation. */
  if (base->be == d->be) return d->api->stream_wait_event(d->drv, s->s, e->ev);
  if (atomic_load_explicit(&base->host_gen, memory_order_acquire) >= generation) return NULL;
  gpu_host_slot *slot;
  RT_TRY(slot_take(s, &slot));
  slot->task.run = foreign_wait_run;
  slot->dev = d;
  slot->stream = s;
  slot->event = base;
  slot->generation = generation;
  return d->api->host_task(d->drv, s->s, &slot->task);
}

static rt_status gpu_timestamp(rt_stream *s, uint64_t *out_ns) {
  rt_device *d = s->dev;
  RT_TRY(current(d));
  if (s->nstamps == s->cap) {
    uint32_t cap = s->cap ? 2 * s->cap : 16;
    gpu_stamp *st = realloc(s->stamps, cap * sizeof *st);
    if (!st) return out_of_memory(d, "timestamps");
    s->stamps = st;
    s->cap = cap;
  }
  gpu_stamp *st = &s->stamps[s->nstamps];
  if (s->nstamps == s->nevents) {
    RT_TRY(d->api->event_create(d->drv, 1, &st->ev));
    s->nevents++;
  }
  /* Counted before the record is enqueued: a refresh of the anchor either
   * happened before (and the record follows it) or waits for this stream. */
  pthread_mutex_lock(&d->clock_mu);
  stamps_begin(s);
  pthread_mutex_unlock(&d->clock_mu);
  RT_TRY(d->api->event_record(d->drv, st->ev, s->s));
  st->out = out_ns;
  s->nstamps++;
  return NULL;
}

/* ---- code objects and launches ---- */

static rt_status read_file(const char *path, void **out_bytes, size_t *out_len) {
  *out_bytes = NULL;
  *out_len = 0;
  FILE *f = fopen(path, "rb");
  if (!f) return rt_status_make("%s: cannot open: %s", path, strerror(errno));
  rt_status s = NULL;
  long n = -1;
  if (fseek(f, 0, SEEK_END) == 0) n = ftell(f);
  if (n < 0 || fseek(f, 0, SEEK_SET) != 0)
    s = rt_status_make("%s: cannot size: %s", path, strerror(errno));
  void *buf = s ? NULL : malloc((size_t)n + 1);
  if (!s && !buf) s = rt_status_make("%s: out of memory reading %ld bytes", path, n);
  if (!s && fread(buf, 1, (size_t)n, f) != (size_t)n)
    s = rt_status_make("%s: short read", path);
  fclose(f);
  if (s) {
    free(buf);
    return s;
  }
  *out_bytes = buf;
  *out_len = (size_t)n;
  return NULL;
}

/* The drivers read PTX up to its NUL; code objects (ELF) carry their
 * size. A PTX image without the NUL is copied with one. */
static int needs_nul(const void *bytes, size_t len) {
  const unsigned char *b = bytes;
  int elf = len >= 4 && b[0] == 0x7f && b[1] == 'E' && b[2] == 'L' && b[3] == 'F';
  return !elf && b[len - 1] != '\0';
}

static rt_status module_from_memory(rt_device *d, const char *what, const void *bytes, size_t len,
                                    gpu_module *out_module) {
  *out_module = NULL;
  if (len == 0) return rt_status_make("%s: empty code object", what);
  char *copy = NULL;
  if (needs_nul(bytes, len)) {
    copy = malloc(len + 1);
    if (!copy) return rt_status_make("%s: out of memory copying %zu bytes of PTX", what, len);
    memcpy(copy, bytes, len);
    copy[len] = '\0';
  }
  rt_status s = current(d);
  if (!s) s = d->api->module_load(d->drv, copy ? copy : bytes, out_module);
  free(copy);
  return s ? rt_status_wrap(s, "%s", what) : NULL;
}

static rt_status gpu_module_load(rt_device *d, const char *path, const void *bytes, size_t len,
                                 rt_module **out_module) {
  *out_module = NULL;
  const char *what = path ? path : "in-memory code object";
  size_t n = strlen(what);
  rt_module *m = malloc(sizeof *m + n + 1);
  if (!m) return rt_status_make("%s: out of memory", what);
  m->dev = d;
  memcpy(m->name, what, n + 1);
  void *file_bytes = NULL;
  rt_status s = NULL;
  if (!bytes) {
    if (!path)
      s = rt_status_make("%s device %s: module_load needs a path or bytes", d->api->name,
                         d->name);
    if (!s) s = read_file(path, &file_bytes, &len);
    bytes = file_bytes;
  }
  if (!s) s = module_from_memory(d, what, bytes, len, &m->m);
  free(file_bytes);
  if (s) {
    free(m);
    return s;
  }
  *out_module = m;
  return NULL;
}

static void gpu_module_unload(rt_module *m) {
  if (!m) return;
  rt_status_free(current(m->dev));
  m->dev->api->module_unload(m->dev->drv, m->m);
  free(m);
}

static rt_status gpu_kernel_find(rt_module *m, const char *symbol, rt_kernel **out_kernel) {
  *out_kernel = NULL;
  rt_device *d = m->dev;
  gpu_function f = NULL;
  rt_status s = current(d);
  if (!s) s = d->api->function_find(d->drv, m->m, symbol, &f);
  if (s) return rt_status_wrap(s, "%s", m->name);
  /* The handle is the driver's function; gpu_launch turns it back. */
  *out_kernel = (rt_kernel *)f;
  return NULL;
}

/* Static shared memory only: the kernels declare theirs. */
static rt_status gpu_launch(rt_stream *s, rt_kernel *k, uint32_t grid, uint32_t block,
                            void *const *bufs, const int32_t *step) {
  rt_device *d = s->dev;
  /* Counted as enqueued: the host never sees a launch execute. */
  if (d->fail_launch) {
    uint64_t n = atomic_fetch_add(&d->launches, 1) + 1;
    if (n == d->fail_launch)
      return rt_status_make("%s device %s: launch %llu failed (injected fault)", d->api->name,
                            d->name, (unsigned long long)n);
  }
  RT_TRY(current(d));
  const void *args[2] = {bufs, step};
  return d->api->launch(d->drv, s->s, (gpu_function)k, grid, block, 0, args, 2, d->overlap_launches);
}

static rt_status gpu_copy_async(rt_stream *s, void *dst, const void *src, size_t bytes) {
  if (!bytes) return NULL;
  rt_device *d = s->dev;
  RT_TRY(current(d));
  return d->api->memcpy_async(d->drv, s->s, dst, src, bytes);
}

/* ---- graphs ---- */

static rt_status graph_streams_check(rt_stream *const *streams, uint32_t n) {
  if (n == 0) return rt_status_make("graph_begin: no stream");
  rt_device *d = streams[0]->dev;
  for (uint32_t i = 1; i < n; i++)
    if (streams[i]->dev != d)
      return rt_status_make("%s device %s: a graph is captured on the streams of one device",
                            d->api->name, d->name);
  return NULL;
}

/* Ends a capture that went wrong, so that the origin stream runs again,
 * and drops what it recorded. */
static void capture_abandon(rt_device *d, rt_stream *origin) {
  gpu_graph g = NULL;
  rt_status_free(d->api->capture_end(d->drv, origin->s, &g));
  if (g) d->api->graph_destroy(d->drv, g);
}

/* Capture starts on the first stream; the others join it at once through
 * the fork event, so that each one's work is recorded from its first
 * command on, whether or not that command waits on anything. */
static rt_status gpu_graph_begin(rt_stream *const *streams, uint32_t n) {
  RT_TRY(graph_streams_check(streams, n));
  rt_device *d = streams[0]->dev;
  RT_TRY(current(d));
  if (!d->fork_join) RT_TRY(d->api->event_create(d->drv, 0, &d->fork_join));
  RT_TRY(d->api->capture_begin(d->drv, streams[0]->s));
  rt_status s = d->api->event_record(d->drv, d->fork_join, streams[0]->s);
  for (uint32_t i = 1; i < n && !s; i++)
    s = d->api->stream_wait_event(d->drv, streams[i]->s, d->fork_join);
  if (s) capture_abandon(d, streams[0]);
  return s;
}

static void gpu_graph_destroy(rt_graph *g) {
  if (!g) return;
  rt_device *d = g->dev;
  rt_status_free(current(d));
  if (g->exec) d->api->graph_exec_destroy(d->drv, g->exec);
  if (g->g) d->api->graph_destroy(d->drv, g->g);
  free(g);
}

/* Every other stream joins back into the first (which waits on its last
 * work), then the capture ends and the graph is instantiated. */
static rt_status gpu_graph_end(rt_stream *const *streams, uint32_t n, rt_graph **out_graph) {
  *out_graph = NULL;
  RT_TRY(graph_streams_check(streams, n));
  rt_device *d = streams[0]->dev;
  rt_status s = current(d);
  for (uint32_t i = 1; i < n && !s; i++) {
    s = d->api->event_record(d->drv, d->fork_join, streams[i]->s);
    if (!s) s = d->api->stream_wait_event(d->drv, streams[0]->s, d->fork_join);
  }
  if (s) {
    capture_abandon(d, streams[0]);
    return s;
  }
  rt_graph *g = calloc(1, sizeof *g);
  if (!g) {
    capture_abandon(d, streams[0]);
    return out_of_memory(d, "a graph");
  }
  g->dev = d;
  g->origin = streams[0];
  s = d->api->capture_end(d->drv, streams[0]->s, &g->g);
  if (!s) s = d->api->graph_count(d->drv, g->g, &g->nodes, &g->edges);
  if (!s) s = d->api->graph_instantiate(d->drv, g->g, &g->exec);
  if (s) {
    gpu_graph_destroy(g);
    return s;
  }
  *out_graph = g;
  return NULL;
}

static rt_status gpu_graph_launch(rt_graph *g) {
  rt_device *d = g->dev;
  RT_TRY(current(d));
  return d->api->graph_launch(d->drv, g->exec, g->origin->s);
}

static void gpu_graph_stats(const rt_graph *g, uint64_t *out_nodes, uint64_t *out_edges) {
  *out_nodes = g->nodes;
  *out_edges = g->edges;
}

#define GPU_BACKEND(backend_name, open)         \
  {                                             \
      .name = backend_name,                     \
      .device_open = open,                      \
      .device_close = gpu_device_close,         \
      .mem_alloc = gpu_mem_alloc,               \
      .mem_free = gpu_mem_free,                 \
      .copy_h2d = gpu_copy,                     \
      .copy_d2h = gpu_copy,                     \
      .copy_d2d = gpu_copy,                     \
      .stream_create = gpu_stream_create,       \
      .stream_destroy = gpu_stream_destroy,     \
      .event_create = gpu_event_create,         \
      .event_destroy = gpu_event_destroy,       \
      .module_load = gpu_module_load,           \
      .module_unload = gpu_module_unload,       \
      .kernel_find = gpu_kernel_find,           \
      .launch = gpu_launch,                     \
      .copy_async = gpu_copy_async,             \
      .event_record = gpu_event_record,         \
      .event_wait = gpu_event_wait,             \
      .timestamp = gpu_timestamp,               \
      .stream_flush = gpu_stream_flush,         \
      .stream_sync = gpu_stream_sync,           \
      .host_register = gpu_host_register,       \
      .host_unregister = gpu_host_unregister,   \
      .stream_state = gpu_stream_state,         \
      .graph_begin = gpu_graph_begin,           \
      .graph_end = gpu_graph_end,               \
      .graph_launch = gpu_graph_launch,         \
      .graph_stats = gpu_graph_stats,           \
      .graph_destroy = gpu_graph_destroy,       \
  }

const rt_backend rt_cuda_backend = GPU_BACKEND("cuda", cuda_device_open);
const rt_backend rt_hip_backend = GPU_BACKEND("hip", hip_device_open);
