/* backend.h - the one vtable every backend (cpu, hip, cuda) implements:
 * devices, memory, copies, streams, events, code objects, launches,
 * timestamps. The replay engine talks only to this table and never knows
 * which backend runs. */
#ifndef DS4_BACKEND_H
#define DS4_BACKEND_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "plan.h"
#include "rt.h"
#include "status.h"

typedef struct rt_device rt_device;
typedef struct rt_stream rt_stream;
typedef struct rt_event rt_event;

/* Every backend's event begins with this header, so that a stream of one
 * backend can wait on an event of another (a GPU stream behind a cpu
 * kernel, a cpu stream behind a GPU copy). host_gen is the generation of
 * the last record that has executed, kept current by the owning backend
 * for events created host_visible; a foreign waiter reads it. */
typedef struct rt_event_base {
  const struct rt_backend *be;
  _Atomic uint64_t host_gen;
} rt_event_base;
typedef struct rt_module rt_module;
typedef struct rt_kernel rt_kernel;

/* The poison and wake-up point shared by every device of one bundle. The
 * first error of a step is kept, later ones are dropped; every host-side
 * wait of the step (an executor waiting on an event, a submitter waiting for
 * another device's record to be enqueued) sleeps on this one condition, so a
 * single broadcast on poison reaches all of them and nothing deadlocks. */
typedef struct rt_sync {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  atomic_int poisoned;
  atomic_int waiters; /* sleepers on cv; lets notify skip the lock when 0 */
  rt_status first;    /* guarded by mu */
} rt_sync;

rt_status rt_sync_init(rt_sync *s);
void rt_sync_destroy(rt_sync *s);
/* Record err (ownership passes) as the step's error unless one is already
 * kept, and wake every waiter. */
void rt_sync_poison(rt_sync *s, rt_status err);
static inline int rt_sync_poisoned(rt_sync *s) {
  return atomic_load_explicit(&s->poisoned, memory_order_acquire);
}
/* The kept error (caller frees; NULL when the step went well); clears the
 * poison so the next step can run. Call only when the step has drained. */
rt_status rt_sync_take(rt_sync *s);
/* After a release store to a value someone may wait on with rt_sync_wait. */
void rt_sync_notify(rt_sync *s);
/* Block until *value >= target (0) or the step is poisoned (-1). */
int rt_sync_wait(rt_sync *s, const _Atomic uint64_t *value, uint64_t target);

typedef struct rt_device_options {
  const char *name;     /* the plan's device name, for messages */
  uint32_t ordinal;
  uint32_t threads;     /* cpu: threads that run a launch's blocks (>= 1) */
  rt_sync *sync;        /* required: the bundle's poison point */
  /* Fault injection for tests: the fail_launch-th launch executed on this
   * device (1-based, counted over the device's life) fails and poisons its
   * step instead of running. 0: never. */
  uint64_t fail_launch;
} rt_device_options;

/* Every function that can fail returns a status naming the device and the
 * call. Enqueue functions (launch, copy_async, event_record, event_wait) only
 * queue work in stream order; their failures at execution time poison the
 * step through the device's rt_sync. Streams, events and modules must be
 * destroyed before their device is closed. */
typedef struct rt_backend {
  const char *name;

  rt_status (*device_open)(const rt_device_options *opts, rt_device **out_device);
  void (*device_close)(rt_device *d); /* joins every thread the device started */

  /* Zeroed, at least 64-byte aligned. */
  rt_status (*mem_alloc)(rt_device *d, size_t bytes, void **out_ptr);
  void (*mem_free)(rt_device *d, void *ptr);
  /* Synchronous copies, for use between steps. */
  rt_status (*copy_h2d)(rt_device *d, void *dst, const void *src, size_t bytes);
  rt_status (*copy_d2h)(rt_device *d, void *dst, const void *src, size_t bytes);
  rt_status (*copy_d2d)(rt_device *d, void *dst, const void *src, size_t bytes);

  /* capacity_hint: commands the stream may hold queued at once (a step's
   * worth); enqueueing more only makes the submitter wait for room. */
  rt_status (*stream_create)(rt_device *d, uint32_t capacity_hint, rt_stream **out_stream);
  void (*stream_destroy)(rt_stream *s);
  /* host_visible: a stream of another backend may wait on it (see
   * rt_event_base); the owner then keeps host_gen current. */
  rt_status (*event_create)(rt_device *d, int host_visible, rt_event **out_event);
  void (*event_destroy)(rt_event *e);

  /* A code object from a file (path) or from memory (bytes, len; path then
   * only names it in messages). */
  rt_status (*module_load)(rt_device *d, const char *path, const void *bytes, size_t len,
                           rt_module **out_module);
  void (*module_unload)(rt_module *m);
  /* The handle stays valid until the module is unloaded. */
  rt_status (*kernel_find)(rt_module *m, const char *symbol, rt_kernel **out_kernel);

  /* Enqueue. bufs and step must stay valid until the stream is synchronised:
   * the runtime builds them once, at bundle open. */
  /* grid blocks of `block` threads (the cpu backend runs each block on one
   * thread and ignores it). bufs is an array of the launch's buffer
   * pointers and step the step block, both in this device's memory
   * (mem_alloc); the kernel receives the two pointers. */
  rt_status (*launch)(rt_stream *s, rt_kernel *k, uint32_t grid, uint32_t block, void *const *bufs,
                      const int32_t *step);
  /* dst and src may be in this device's memory, another device's of the
   * same backend (a peer copy), or host memory of a cpu device that this
   * device has registered (host_register). */
  rt_status (*copy_async)(rt_stream *s, void *dst, const void *src, size_t bytes);
  /* Events carry generations: record sets the event to `generation` when the
   * stream reaches it; wait holds the stream until the event has reached at
   * least `generation`. The event may belong to another device, or to
   * another backend (through rt_event_base.host_gen). */
  rt_status (*event_record)(rt_stream *s, rt_event *e, uint64_t generation);
  rt_status (*event_wait)(rt_stream *s, rt_event *e, uint64_t generation);
  /* Enqueue a timestamp in stream order. Once the stream has been
   * synchronised (stream_sync), *out_ns holds the time at which the stream
   * reached it: after everything enqueued before it on the stream, waits
   * included, has run and before anything enqueued after it starts.
   * Nanoseconds on a clock shared by all devices of the backend (cpu:
   * CLOCK_MONOTONIC), so spans on different devices can be compared.
   * out_ns must stay valid until then; the host never waits for it. In a
   * poisoned step it may be skipped, leaving *out_ns as it was. GPU backends
   * will implement it with timing events (created with timing on, recorded
   * here) resolved into nanoseconds at stream_sync. */
  rt_status (*timestamp)(rt_stream *s, uint64_t *out_ns);
  /* Make everything enqueued so far visible to the device (commands may be
   * batched until then); call before the submitter blocks and at step end. */
  rt_status (*stream_flush)(rt_stream *s);
  /* Wait until everything enqueued on the stream has run (or been skipped
   * because the step is poisoned). */
  rt_status (*stream_sync)(rt_stream *s);
  /* Optional (NULL on the cpu backend): make a cpu device's arena usable
   * by this device's async copies (pinning); undone before the memory is
   * freed. */
  rt_status (*host_register)(rt_device *d, void *ptr, size_t bytes);
  void (*host_unregister)(rt_device *d, void *ptr);
} rt_backend;

/* The backend for a plan_backend value, or an error for an unknown one.
 * GPU backends load their driver library only when a device opens. */
rt_status rt_backend_lookup(uint32_t which, const rt_backend **out_backend);
const char *rt_backend_name(uint32_t which);

/* The cpu backend (runtime/backends/cpu/cpu_backend.c). */
extern const rt_backend rt_cpu_backend;

/* Test hook: rt_bundle_open with a launch failure injected on one device
 * (see rt_device_options.fail_launch). Lives here rather than in rt.h
 * because only tests use it. */
typedef struct rt_fault {
  uint32_t device;      /* plan device index */
  uint64_t fail_launch; /* 0: no fault */
} rt_fault;
rt_status rt_bundle_open_faulty(const char *dir, const rt_options *opts, const rt_fault *fault,
                                rt_bundle **out_bundle);

#endif
