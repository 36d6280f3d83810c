/* fault_backend.c - the test hook rt_fault at the vtable boundary: a
 * backend that wraps one device of another backend, passes every call
 * through, and makes the chosen calls fail, vanish (skip_record) or, once
 * the device is "lost", all fail. So every backend gets the same faults
 * without a line of fault code inside it. Events and kernels stay the
 * wrapped backend's own handles, so that other devices wait on this
 * device's events as before; devices, streams and modules are wrapped
 * because a call on them must find the wrapped backend. */
#include <stdio.h>
#include <stdlib.h>

#include "backend.h"

struct rt_device {
  const rt_backend *be; /* the wrapped backend */
  rt_device *dev;       /* and its device */
  char name[64];
  rt_fault f;
  /* Calls counted, each only by the device's submitter (which enqueues),
   * but read by whoever syncs or frees: atomics. */
  _Atomic uint64_t enqueues, copies, records, waits;
  _Atomic uint64_t lost_at; /* 0, or the enqueue from which the device is lost */
};

struct rt_stream {
  rt_device *d;
  rt_stream *s;
};

struct rt_module {
  rt_device *d;
  rt_module *m;
};

static const rt_backend rt_fault_backend;

static rt_status injected(const rt_device *d, const char *call, uint64_t n) {
  return rt_status_make("%s device %s: %s %llu failed (injected fault)", d->be->name, d->name, call,
                        (unsigned long long)n);
}

/* The error of every call once the device is lost; NULL before. */
static rt_status lost(rt_device *d, const char *call) {
  uint64_t at = atomic_load(&d->lost_at);
  if (!at) return NULL;
  return rt_status_make("%s device %s: %s: device lost (injected fault at enqueue %llu)",
                        d->be->name, d->name, call, (unsigned long long)at);
}

/* Counts an enqueue: the lose_device-th loses the device for good. */
static rt_status enqueue_check(rt_device *d, const char *call) {
  uint64_t n = atomic_fetch_add(&d->enqueues, 1) + 1;
  if (n == d->f.lose_device) atomic_store(&d->lost_at, n);
  return lost(d, call);
}

static int wraps(const rt_fault *f) {
  return f && (f->fail_copy || f->fail_record || f->fail_wait || f->skip_record || f->lose_device);
}

rt_status rt_fault_device_open(const rt_backend *be, const rt_fault *fault,
                               const rt_device_options *o, const rt_backend **out_be,
                               rt_device **out_device) {
  *out_be = be;
  *out_device = NULL;
  if (!wraps(fault)) return be->device_open(o, out_device);
  rt_device *d = calloc(1, sizeof *d);
  if (!d) return rt_status_make("%s device %s: out of memory", be->name, o->name ? o->name : "?");
  d->be = be;
  d->f = *fault;
  snprintf(d->name, sizeof d->name, "%s", o->name ? o->name : be->name);
  atomic_init(&d->enqueues, 0);
  atomic_init(&d->copies, 0);
  atomic_init(&d->records, 0);
  atomic_init(&d->waits, 0);
  atomic_init(&d->lost_at, 0);
  rt_status s = be->device_open(o, &d->dev);
  if (s) {
    free(d);
    return s;
  }
  *out_be = &rt_fault_backend;
  *out_device = d;
  return NULL;
}

static void fault_device_close(rt_device *d) {
  if (!d) return;
  d->be->device_close(d->dev);
  free(d);
}

/* ---- memory ---- */

static rt_status fault_mem_alloc(rt_device *d, size_t bytes, void **out_ptr) {
  *out_ptr = NULL;
  RT_TRY(lost(d, "mem_alloc"));
  return d->be->mem_alloc(d->dev, bytes, out_ptr);
}

static void fault_mem_free(rt_device *d, void *ptr) { d->be->mem_free(d->dev, ptr); }

static rt_status fault_copy_h2d(rt_device *d, void *dst, const void *src, size_t bytes) {
  RT_TRY(lost(d, "copy_h2d"));
  return d->be->copy_h2d(d->dev, dst, src, bytes);
}

static rt_status fault_copy_d2h(rt_device *d, void *dst, const void *src, size_t bytes) {
  RT_TRY(lost(d, "copy_d2h"));
  return d->be->copy_d2h(d->dev, dst, src, bytes);
}

static rt_status fault_copy_d2d(rt_device *d, void *dst, const void *src, size_t bytes) {
  RT_TRY(lost(d, "copy_d2d"));
  return d->be->copy_d2d(d->dev, dst, src, bytes);
}

static rt_status fault_host_register(rt_device *d, void *ptr, size_t bytes) {
  RT_TRY(lost(d, "host_register"));
  return d->be->host_register ? d->be->host_register(d->dev, ptr, bytes) : NULL;
}

static void fault_host_unregister(rt_device *d, void *ptr) {
  if (d->be->host_unregister) d->be->host_unregister(d->dev, ptr);
}

/* ---- streams and events ---- */

static rt_status fault_stream_create(rt_device *d, uint32_t capacity_hint, rt_stream **out_stream) {
  *out_stream = NULL;
  RT_TRY(lost(d, "stream_create"));
  rt_stream *s = calloc(1, sizeof *s);
  if (!s) return rt_status_make("%s device %s: out of memory creating a stream", d->be->name, d->name);
  s->d = d;
  rt_status st = d->be->stream_create(d->dev, capacity_hint, &s->s);
  if (st) {
    free(s);
    return st;
  }
  *out_stream = s;
  return NULL;
}

static void fault_stream_destroy(rt_stream *s) {
  if (!s) return;
  s->d->be->stream_destroy(s->s);
  free(s);
}

/* The wrapped backend's own event: other devices wait on it directly. */
static rt_status fault_event_create(rt_device *d, int host_visible, rt_event **out_event) {
  *out_event = NULL;
  RT_TRY(lost(d, "event_create"));
  return d->be->event_create(d->dev, host_visible, out_event);
}

static void fault_event_destroy(rt_event *e) {
  if (e) ((rt_event_base *)e)->be->event_destroy(e);
}

/* A lost device still drains what it had queued before it answers, so
 * that nothing runs on after the step has returned. */
static rt_status fault_stream_sync(rt_stream *s) {
  rt_status st = s->d->be->stream_sync(s->s);
  rt_status gone = lost(s->d, "stream_sync");
  if (!gone) return st;
  rt_status_free(st);
  return gone;
}

static rt_status fault_stream_flush(rt_stream *s) {
  RT_TRY(lost(s->d, "stream_flush"));
  return s->d->be->stream_flush(s->s);
}

static void fault_stream_state(rt_stream *s, rt_stream_state *out) {
  s->d->be->stream_state(s->s, out);
}

/* ---- code objects ---- */

static rt_status fault_module_load(rt_device *d, const char *path, const void *bytes, size_t len,
                                   rt_module **out_module) {
  *out_module = NULL;
  RT_TRY(lost(d, "module_load"));
  rt_module *m = calloc(1, sizeof *m);
  if (!m) return rt_status_make("%s device %s: out of memory loading a module", d->be->name, d->name);
  m->d = d;
  rt_status s = d->be->module_load(d->dev, path, bytes, len, &m->m);
  if (s) {
    free(m);
    return s;
  }
  *out_module = m;
  return NULL;
}

static void fault_module_unload(rt_module *m) {
  if (!m) return;
  m->d->be->module_unload(m->m);
  free(m);
}

static rt_status fault_kernel_find(rt_module *m, const char *symbol, rt_kernel **out_kernel) {
  *out_kernel = NULL;
  RT_TRY(lost(m->d, "kernel_find"));
  return m->d->be->kernel_find(m->m, symbol, out_kernel);
}

/* ---- enqueues ---- */

static rt_status fault_launch(rt_stream *s, rt_kernel *k, uint32_t grid, uint32_t block,
                              void *const *bufs, const int32_t *step) {
  RT_TRY(enqueue_check(s->d, "launch"));
  return s->d->be->launch(s->s, k, grid, block, bufs, step);
}

static rt_status fault_copy_async(rt_stream *s, void *dst, const void *src, size_t bytes) {
  rt_device *d = s->d;
  RT_TRY(enqueue_check(d, "copy_async"));
  uint64_t n = atomic_fetch_add(&d->copies, 1) + 1;
  if (n == d->f.fail_copy) return injected(d, "copy_async", n);
  return d->be->copy_async(s->s, dst, src, bytes);
}

static rt_status fault_event_record(rt_stream *s, rt_event *e, uint64_t generation) {
  rt_device *d = s->d;
  RT_TRY(enqueue_check(d, "event_record"));
  uint64_t n = atomic_fetch_add(&d->records, 1) + 1;
  if (n == d->f.fail_record) return injected(d, "event_record", n);
  if (n == d->f.skip_record) return NULL;
  return d->be->event_record(s->s, e, generation);
}

static rt_status fault_event_wait(rt_stream *s, rt_event *e, uint64_t generation) {
  rt_device *d = s->d;
  RT_TRY(enqueue_check(d, "event_wait"));
  uint64_t n = atomic_fetch_add(&d->waits, 1) + 1;
  if (n == d->f.fail_wait) return injected(d, "event_wait", n);
  return d->be->event_wait(s->s, e, generation);
}

static rt_status fault_timestamp(rt_stream *s, uint64_t *out_ns) {
  RT_TRY(enqueue_check(s->d, "timestamp"));
  return s->d->be->timestamp(s->s, out_ns);
}

static const rt_backend rt_fault_backend = {
    .name = "fault",
    .device_open = NULL, /* its devices open through rt_fault_device_open */
    .device_close = fault_device_close,
    .mem_alloc = fault_mem_alloc,
    .mem_free = fault_mem_free,
    .copy_h2d = fault_copy_h2d,
    .copy_d2h = fault_copy_d2h,
    .copy_d2d = fault_copy_d2d,
    .stream_create = fault_stream_create,
    .stream_destroy = fault_stream_destroy,
    .event_create = fault_event_create,
    .event_destroy = fault_event_destroy,
    .module_load = fault_module_load,
    .module_unload = fault_module_unload,
    .kernel_find = fault_kernel_find,
    .launch = fault_launch,
    .copy_async = fault_copy_async,
    .event_record = fault_event_record,
    .event_wait = fault_event_wait,
    .timestamp = fault_timestamp,
    .stream_flush = fault_stream_flush,
    .stream_sync = fault_stream_sync,
    .host_register = fault_host_register,
    .host_unregister = fault_host_unregister,
    .stream_state = fault_stream_state,
};
