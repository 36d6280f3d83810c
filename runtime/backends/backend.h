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
typedef struct rt_graph rt_graph;

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
  /* rt_options.watchdog_ms (0: off). GPU backends then synchronise a
   * stream by polling it, and give up on one still busy this long after
   * its step was poisoned (a kernel that never returns). */
  uint32_t watchdog_ms;
  /* The plan's PLAN_FLAG_GRID_WAIT: every kernel waits for the grids
   * before it, so a GPU backend may start a launch before the one before
   * it on the stream ends (on CUDA, programmatic stream serialization).
   * The cpu backend runs a launch's blocks after the one before either way. */
  int overlap_launches;
  /* cpu: the thread that enqueues a command runs it there and then, in
   * enqueue order, instead of a stream's executor thread (a bundle's
   * default: rt_options.cpu_replay other than RT_CPU_STREAMS); a wait on
   * an event not yet recorded then holds the caller. */
  int inline_streams;
} rt_device_options;

/* What a stream is doing, for the watchdog's report (stream_state): a
 * snapshot, read from any thread while the stream runs, so already stale. */
typedef struct rt_stream_state {
  int counted;     /* the backend counts commands: queued and done mean something */
  uint64_t queued; /* commands enqueued over the stream's life */
  uint64_t done;   /* of those, finished (run, or skipped in a poisoned step) */
  int idle;        /* everything enqueued has finished */
  /* A host-side wait that holds the stream now: the event, and the
   * generation it waits for; NULL when there is none (or the backend
   * cannot tell). */
  const rt_event_base *waiting;
  uint64_t waiting_gen;
} rt_stream_state;

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
  /* What the stream is doing now (see rt_stream_state); any thread, any
   * time, never blocks. */
  void (*stream_state)(rt_stream *s, rt_stream_state *out);

  /* Graph replay (optional: NULL where the backend has none). Between
   * graph_begin and graph_end, what is enqueued (launch, copy_async,
   * event_record, event_wait) on streams[0..n) of one device is recorded
   * into a graph instead of running: launches and copies become its
   * nodes, each depending on the stream's previous one and, through an
   * event_wait, on the last one before the awaited record. Waits on
   * another backend's events and host-visible records cannot be recorded.
   * graph_end returns the graph ready to run, or fails and leaves the
   * streams as they were; it must follow every graph_begin that
   * succeeded. graph_launch enqueues one run of the whole graph on
   * streams[0]; the other streams stay idle. */
  rt_status (*graph_begin)(rt_stream *const *streams, uint32_t n);
  rt_status (*graph_end)(rt_stream *const *streams, uint32_t n, rt_graph **out_graph);
  rt_status (*graph_launch)(rt_graph *g);
  /* Nodes and dependencies, as the driver counts them. */
  void (*graph_stats)(const rt_graph *g, uint64_t *out_nodes, uint64_t *out_edges);
  void (*graph_destroy)(rt_graph *g);
} rt_backend;

/* The backend for a plan_backend value, or an error for an unknown one.
 * GPU backends load their driver library only when a device opens. */
rt_status rt_backend_lookup(uint32_t which, const rt_backend **out_backend);
const char *rt_backend_name(uint32_t which);

/* The cpu backend (runtime/backends/cpu/cpu_backend.c). */
extern const rt_backend rt_cpu_backend;

/* Test hook: faults injected into one device of a bundle opened with
 * rt_bundle_open_faulty (docs/RUNTIME.md, "Faults and the watchdog").
 * Every count is 1-based and counted over the device's life; 0 turns that
 * fault off. Lives here rather than in rt.h because only tests use it;
 * there is no global hook. */
typedef struct rt_fault {
  uint32_t device; /* plan device index */
  /* Inside the backend (rt_device_options.fail_launch): the N-th launch
   * fails (cpu: when its executor reaches it; GPU: when it is enqueued). */
  uint64_t fail_launch;
  /* At the vtable boundary (rt_fault_device_open): the N-th call of the
   * kind returns an error instead of reaching the backend. */
  uint64_t fail_copy;   /* copy_async */
  uint64_t fail_record; /* event_record */
  uint64_t fail_wait;   /* event_wait */
  /* The N-th event_record returns success but never reaches the backend:
   * the record never happens, and its waiters stall (see the watchdog). */
  uint64_t skip_record;
  /* From the N-th enqueue (launch, copy_async, event_record, event_wait,
   * timestamp) on, the device is lost: every call to it that can fail
   * fails with "device lost". It still drains what it had queued and
   * frees what it is asked to free, so the bundle closes cleanly. */
  uint64_t lose_device;
  /* In the replay (replay.c): the device's submitter stops before the N-th
   * command it would submit (each replayed step counts all the device's
   * commands) and poisons the step with an error; with die_silently it
   * returns as if it had finished, as a runtime bug would, and only the
   * watchdog ends a step that waits for the rest. */
  uint64_t die_submitter;
  int die_silently;
} rt_fault;
rt_status rt_bundle_open_faulty(const char *dir, const rt_options *opts, const rt_fault *fault,
                                rt_bundle **out_bundle);

/* Open a device of backend `be` (options o). With any of fault's
 * vtable-boundary faults (fail_copy, fail_record, fail_wait, skip_record,
 * lose_device) the device is wrapped: *out_be is the fault backend, which
 * passes every call through to `be` and injects those faults; otherwise
 * (fault NULL included) *out_be is `be` and the device is its own
 * (runtime/backends/fault_backend.c). */
rt_status rt_fault_device_open(const rt_backend *be, const rt_fault *fault,
                               const rt_device_options *o, const rt_backend **out_be,
                               rt_device **out_device);

#endif
