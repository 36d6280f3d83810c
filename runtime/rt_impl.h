/* rt_impl.h - private to the runtime library (bundle.c, replay.c,
 * generate.c): the opened bundle, with every plan command resolved at open
 * time into backend handles and pointers so that replay does no lookups. */
#ifndef DS4_RT_IMPL_H
#define DS4_RT_IMPL_H

#include <pthread.h>
#include <stdatomic.h>

#include "backend.h"
#include "rt.h"
#include "safetensors.h"

/* A resolved command that is not in the plan: with rt_options.trace, one
 * before and one after each LAUNCH and COPY, on the same stream. */
enum { RT_CMD_TIMESTAMP = PLAN_CMD_WAIT + 1 };

/* The checkpoint values of a weight that is not a view: one checkpoint
 * weight, or with a checkpoint name holding "{e}" one per index e of dim 0
 * (part e holds row e, from the name with e in place of "{e}"). */
typedef struct rt_binding {
  st_weight *parts;    /* NULL: the seeded generator's values */
  uint64_t part_elems; /* elements of each part; bytes (one matrix each) for a
                          quantized weight, whose parts are copied as shipped */
} rt_binding;

/* One plan command, resolved. */
typedef struct rt_cmd {
  uint32_t kind;  /* plan_cmd_kind or RT_CMD_TIMESTAMP */
  uint32_t grid;  /* LAUNCH: blocks */
  uint32_t block; /* LAUNCH: threads per block (GPU backends) */
  uint32_t index; /* the command's index in the plan (TIMESTAMP: the timed one's) */
  /* WAIT on an event recorded on another device: the index of that RECORD
   * command, whose enqueue this WAIT must follow; PLAN_NONE otherwise. */
  uint32_t after;
  int publish;    /* RECORD: some WAIT on another device follows its enqueue */
  rt_stream *stream;
  rt_kernel *kernel;
  void *const *bufs;   /* LAUNCH: in the device's launch_bufs, the addresses of the
                          launch's arg ranges */
  const int32_t *step; /* LAUNCH: the device's step block (device memory) */
  void *dst;           /* COPY */
  const void *src;
  size_t bytes;
  union {
    rt_event *event;   /* RECORD, WAIT */
    uint64_t *stamp;   /* TIMESTAMP: a slot of the bundle's trace arrays */
  };
} rt_cmd;

typedef struct rt_dev {
  struct rt_bundle *owner;
  uint32_t index;
  const rt_backend *be;
  rt_device *dev;
  void *arena;
  int32_t *step_block; /* device memory: {pos, ntok, step, 0} */
  void **launch_bufs;  /* device memory: every launch's buffer pointers, back to back */
  uint32_t codeobj;    /* the plan's code object for this device's target */
  rt_module *module;   /* that code object, loaded at the device's first launch */
  uint8_t *registered; /* [p.ndevices], with host_register: the cpu devices whose
                          arenas this device has registered */
  rt_cmd *cmds;        /* this device's commands in global order */
  uint32_t ncmds;
  uint32_t *streams;   /* plan stream indices on this device */
  uint32_t nstreams;
  pthread_t submitter; /* devices 1..n-1; device 0 submits on the caller */
  int submitter_started;
  /* rt_fault.die_submitter and die_silently (0: no such fault). */
  uint64_t die_at;
  int die_silently;
  /* For the watchdog's report: whether the submitter is inside a step's
   * commands, and the RECORD command whose enqueue it sleeps for
   * (PLAN_NONE: none). Stored once per step and around a sleep, never per
   * command. */
  atomic_int submitting;
  _Atomic uint32_t waiting_record;
} rt_dev;

typedef struct rt_watchdog rt_watchdog;

struct rt_bundle {
  char *dir;
  plan p;
  int plan_loaded;
  uint64_t seed;
  /* rt_options.weights: the checkpoint, mapped while the bundle is open
   * (rt_weight_values reads it), and per weight that is not a view its
   * binding (parts NULL: the generator); NULL without. */
  st_set *ckpt;
  rt_binding *bound; /* [p.ntensors] */
  uint32_t nbound, ngenerated; /* weights that are not views, each way */
  int weights_cast;            /* rt_options.weights_cast */
  int every_position;          /* rt_options.every_position */
  uint32_t ncast;              /* bound weights rounded into the plan's dtype */
  rt_sync *sync;     /* &sync_own, or the parent's: every device's poison point */
  rt_sync sync_own;
  int sync_ready;

  /* A bundle of two plans (docs/RUNTIME.md, "Plans per step shape"): the
   * bundle opened is the prefill plan's and holds the decode plan's as
   * `decode`, whose `parent` it is. The decode bundle borrows the parent's
   * devices, arenas (so the weights and the state), streams, weight
   * bindings and poison point, and has its own commands, events, kernels,
   * submitters, trace and graph. Both NULL in a bundle of one plan. */
  struct rt_bundle *parent, *decode;

  rt_dev *devs;          /* [p.ndevices] */
  rt_stream **streams;   /* [p.nstreams] */
  rt_event **events;     /* [p.info.nevents] */
  uint32_t *event_dev;   /* [p.info.nevents] device that owns each event */
  rt_kernel **kernels;   /* [nkernels * ndevices], found on demand */
  void **tensor_ptr;     /* [p.ntensors]; NULL for a non-resident weight source */
  _Atomic uint64_t *enqueued; /* [p.ncommands]: the step generation in which
                                 a published RECORD was last enqueued */

  uint64_t generation;   /* steps replayed; the events' generation */

  /* rt_options.trace: [p.ncommands] start and end times of the last step's
   * launches and copies (NULL without trace); trace_valid says whether the
   * last step succeeded. */
  uint64_t *trace_start, *trace_end;
  uint64_t trace_host[3]; /* rt_trace_last_host */
  int trace_valid;

  rt_watchdog *watchdog; /* rt_options.watchdog_ms; NULL: off */

  /* rt_options.graph: the plan's one device replays each step as one
   * launch of `graph`, captured from its commands in the first step. */
  int use_graph;
  rt_graph *graph;

  /* RT_CPU_SERIAL (rt_options.cpu_replay), two devices or more: the
   * caller runs every device's commands, taking turns (replay.c,
   * submit_serial), and no submitter threads are started. serial_at:
   * [p.ndevices] each device's next command in the step. */
  int serial;
  uint32_t *serial_at;
  rt_cpu_replay cpu_replay; /* rt_bundle_cpu_replay */

  /* Submitter threads of devices 1..n-1: woken per step. */
  pthread_mutex_t sub_mu;
  pthread_cond_t sub_cv, sub_done_cv;
  int sub_ready;
  uint64_t sub_gen;
  int sub_pending;
  int sub_shutdown;
};

/* The seeded generator's two hashes (docs/RUNTIME.md states them exactly,
 * since the float64 reference must reproduce them). */
static inline uint64_t rt_fnv1a64(const char *s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (; *s; s++) {
    h ^= (uint8_t)*s;
    h *= 0x100000001b3ull;
  }
  return h;
}
/* splitmix64's finaliser. */
static inline uint64_t rt_mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
#define RT_GOLDEN 0x9e3779b97f4a7c15ull
/* The key of the stream of (seed, name), which rt_uniform_at reads: a
 * filler hashes the name once per tensor, not once per value. */
static inline uint64_t rt_uniform_key(uint64_t seed, const char *name) {
  return rt_mix64(seed ^ rt_fnv1a64(name));
}
static inline double rt_uniform_at(uint64_t key, uint64_t i) {
  uint64_t r = rt_mix64(key + (i + 1) * RT_GOLDEN);
  return (double)(r >> 11) * 0x1p-52 - 1.0;
}
/* u in [-1, 1): value i of the stream keyed by (seed, name). */
static inline double rt_uniform(uint64_t seed, const char *name, uint64_t i) {
  return rt_uniform_at(rt_uniform_key(seed, name), i);
}

/* bundle.c: elements [first, first + count) of weight t as its dtype into
 * dst (host memory), as bundle open fills them: split into at
 * most `threads` slices staged at once, the values the same for any
 * number (tests compare). For a quantized weight (f8e4m3, mxfp4) first
 * and count are bytes of its layout (plan.h), codes, scales and padding. */
rt_status rt_weight_stage(const rt_bundle *b, uint32_t t, uint64_t first, uint64_t count,
                          uint32_t threads, void *dst);

/* replay.c: the body of a device's submitter for step generation gen. */
void rt_submit_device(rt_bundle *b, uint32_t device, uint64_t gen);
void *rt_submitter_main(void *arg);

/* watchdog.c (docs/RUNTIME.md, "Faults and the watchdog"): a thread that
 * watches every step of bundle b between arm and disarm, and poisons one
 * that makes no progress for bound_ms with a report of what waits for
 * what. Stop joins it; stop(NULL) does nothing. */
rt_status rt_watchdog_start(rt_bundle *b, uint32_t bound_ms, rt_watchdog **out_watchdog);
void rt_watchdog_arm(rt_watchdog *w, uint64_t generation);
void rt_watchdog_disarm(rt_watchdog *w);
void rt_watchdog_stop(rt_watchdog *w);

#endif
