/* fake_cuda.c - a stand-in for libcuda.so.1 that runs on the host, so that
 * the cuda backend can be tested where there is no GPU (DS4_CUDA_LIBRARY
 * names it). It implements the driver calls cuda_api.c uses, with the
 * semantics the backend relies on: streams run in order (one worker thread
 * each), an event wait holds a stream until the event's latest record at
 * the time of the wait has run, a failure is sticky for the context and
 * reported to later callbacks and syncs, callbacks of all streams run on
 * one thread (CUDA says they "may be serialized"). It also checks what a
 * driver checks: a context current on the calling thread (the one of the
 * stream used), live handles, no double registration. Device memory is
 * host memory filled with garbage, as cuMemAlloc does not zero.
 *
 * Code is PTX text: a module holds the kernels its ".entry NAME(" lines
 * declare, among the few this file implements on the host (ds4_smoke, the
 * smoke kernel of gpu_smoke.c; fake_fault, which faults; fake_hang, which
 * runs until the test opens its gate with fake_cuda_hang_gate).
 *
 * Graphs by stream capture, as graph replay uses them: between
 * cuStreamBeginCapture_v2 and cuStreamEndCapture, launches, copies and
 * memsets on the capturing streams become nodes depending on their
 * stream's frontier; a record captures the frontier, a wait on it joins
 * the waiting stream to the capture and adds the recorded nodes to its
 * frontier; the end fails with CUDA_ERROR_STREAM_CAPTURE_UNJOINED unless
 * every node leads to the origin's frontier. A launched graph runs its
 * nodes in capture order (a topological one) on the stream.
 * fake_cuda_last_graph tells a test what the last graph instantiated
 * held; fake_cuda_launch_counts how many launches allowed programmatic
 * stream serialization (cuLaunchKernelEx).
 *
 * DS4_FAKE_CUDA_DEVICES: the number of devices (default 1; 0 makes cuInit
 * fail with CUDA_ERROR_NO_DEVICE). DS4_FAKE_CUDA_MEMORY: each device's
 * memory in bytes (default 80 GiB), which cuMemGetInfo_v2 reports free
 * (the fake does not count what is allocated) and cuMemAlloc_v2 refuses
 * to exceed in one allocation. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;

enum {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_INVALID_VALUE = 1,
  CUDA_ERROR_OUT_OF_MEMORY = 2,
  CUDA_ERROR_NOT_INITIALIZED = 3,
  CUDA_ERROR_NO_DEVICE = 100,
  CUDA_ERROR_INVALID_DEVICE = 101,
  CUDA_ERROR_INVALID_IMAGE = 200,
  CUDA_ERROR_INVALID_CONTEXT = 201,
  CUDA_ERROR_INVALID_HANDLE = 400,
  CUDA_ERROR_NOT_FOUND = 500,
  CUDA_ERROR_NOT_READY = 600,
  CUDA_ERROR_ILLEGAL_ADDRESS = 700,
  CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712,
  CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED = 713,
  CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
  CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901,
  CUDA_ERROR_STREAM_CAPTURE_UNJOINED = 904,
  CUDA_ERROR_STREAM_CAPTURE_ISOLATION = 905,
  CUDA_ERROR_ILLEGAL_STATE = 401,
};

#define FAKE_MAX_DEVICES 8
#define FAKE_MAX_REGISTERED 64
#define FAKE_MAX_STREAMS 64

typedef struct CUctx_st {
  int device;
  int refs;
  CUresult error; /* sticky, as a device fault is */
} *CUcontext;

typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUmod_st *CUmodule;
typedef const struct fake_kernel *CUfunction;
typedef void (*CUstreamCallback)(CUstream stream, CUresult status, void *user);

typedef void (*fake_kernel_fn)(void *const *bufs, const int32_t *step, uint32_t block,
                               uint32_t threads);
struct fake_kernel {
  const char *name;
  fake_kernel_fn fn; /* NULL: the launch faults */
};

/* out[i] = 2 * in[i] + pos for i < ntok: bufs = {in, out}, step = {pos, ntok, ...}. */
static void fake_smoke(void *const *bufs, const int32_t *step, uint32_t block, uint32_t threads) {
  const float *in = bufs[0];
  float *out = bufs[1];
  for (uint32_t t = 0; t < threads; t++) {
    uint32_t i = block * threads + t;
    if (i < (uint32_t)step[1]) out[i] = in[i] * 2.0f + (float)step[0];
  }
}

/* A kernel that never returns by itself, as a hung GPU kernel: it blocks
 * until the gate is open. */
static pthread_mutex_t fake_gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t fake_gate_cv = PTHREAD_COND_INITIALIZER;
static int fake_gate_open;

static void fake_hang(void *const *bufs, const int32_t *step, uint32_t block, uint32_t threads) {
  (void)bufs, (void)step, (void)block, (void)threads;
  pthread_mutex_lock(&fake_gate_mu);
  while (!fake_gate_open) pthread_cond_wait(&fake_gate_cv, &fake_gate_mu);
  pthread_mutex_unlock(&fake_gate_mu);
}

static const struct fake_kernel fake_kernels[] = {
    {"ds4_smoke", fake_smoke},
    {"fake_fault", NULL},
    {"fake_hang", fake_hang},
};

/* ---- the driver's state (global, as a driver's is) ---- */

static pthread_mutex_t fake_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t fake_cv = PTHREAD_COND_INITIALIZER; /* events completed, work drained */
static int fake_initialized;
static int fake_ndevices;
static struct CUctx_st fake_ctxs[FAKE_MAX_DEVICES];
static _Thread_local CUcontext fake_current;
static struct {
  void *ptr;
  size_t bytes;
} fake_registered[FAKE_MAX_REGISTERED];
static CUstream fake_streams[FAKE_MAX_STREAMS]; /* live streams, for the end of a capture */
static uint64_t fake_captures;                  /* captures begun */
/* fake_cuda_last_graph: what the last graph instantiated held. */
static int fake_last_nodes, fake_last_nedges;
static int (*fake_last_edges)[2];

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---- streams ---- */

enum { OP_MEMSET, OP_MEMCPY, OP_RECORD, OP_WAIT, OP_CALLBACK, OP_LAUNCH, OP_GRAPH };

/* A set of node indices (a capture's frontier), without repeats. */
typedef struct fake_set {
  int *v;
  int n, cap;
} fake_set;

/* A graph: nodes in capture order; deps[i] the nodes node i depends on. */
typedef struct CUgraph_st {
  struct fake_op *nodes; /* LAUNCH, MEMCPY or MEMSET, next unused */
  fake_set *deps;
  int n, cap;
  int invalid;  /* something unsupported was enqueued during the capture */
  uint64_t id;  /* the capture's number, never reused */
} *CUgraph;
typedef struct CUgraph_st *CUgraphExec; /* instantiated: a copy of the graph */
typedef void *CUgraphNode;

typedef struct fake_op {
  struct fake_op *next;
  int kind;
  void *dst;
  const void *src;
  size_t bytes;
  int value;
  CUevent event;
  uint64_t seq;
  CUstreamCallback cb;
  void *user;
  CUfunction fn;
  uint32_t grid, block;
  void *const *bufs;
  const int32_t *step;
  CUgraphExec graph; /* OP_GRAPH */
} fake_op;

struct CUstream_st {
  CUcontext ctx;
  fake_op *head, *tail;
  int busy, shutdown;
  pthread_cond_t work_cv;
  pthread_t thread;
  CUgraph capture;   /* the capture the stream takes part in, or NULL */
  int origin;        /* it began that capture */
  fake_set frontier; /* the nodes its next node depends on */
};

struct CUevent_st {
  CUcontext ctx;
  int timing;
  uint64_t recorded, completed; /* record sequence numbers */
  uint64_t ns;                  /* when the last completed record ran */
  uint64_t captured;            /* the capture it was last recorded in, or 0 */
  fake_set nodes;               /* the recording stream's frontier then */
};

struct CUmod_st {
  CUcontext ctx;
  char *text;
};

/* The one callback thread: each callback is handed to it and the stream
 * waits until it has run. */
static pthread_t fake_cb_thread;
static int fake_cb_started;
static fake_op *fake_cb_op; /* the callback waiting to run, guarded by fake_mu */
static CUstream fake_cb_stream;
static pthread_cond_t fake_cb_cv = PTHREAD_COND_INITIALIZER;

static void *callback_main(void *arg) {
  (void)arg;
  pthread_mutex_lock(&fake_mu);
  for (;;) {
    while (!fake_cb_op) pthread_cond_wait(&fake_cb_cv, &fake_mu);
    fake_op *op = fake_cb_op;
    CUstream s = fake_cb_stream;
    CUresult status = s->ctx->error;
    pthread_mutex_unlock(&fake_mu);
    op->cb(s, status, op->user);
    pthread_mutex_lock(&fake_mu);
    fake_cb_op = NULL;
    pthread_cond_broadcast(&fake_cb_cv);
  }
  return NULL;
}

/* Called with fake_mu held, by a stream's worker. */
static void run_callback(CUstream s, fake_op *op) {
  while (fake_cb_op) pthread_cond_wait(&fake_cb_cv, &fake_mu);
  fake_cb_op = op;
  fake_cb_stream = s;
  pthread_cond_broadcast(&fake_cb_cv);
  while (fake_cb_op == op) pthread_cond_wait(&fake_cb_cv, &fake_mu);
}

/* Called with fake_mu held; drops it while kernels and copies run. */
static void execute(CUstream s, fake_op *op) {
  CUcontext ctx = s->ctx;
  if (op->kind == OP_CALLBACK) {
    run_callback(s, op);
    return;
  }
  if (ctx->error) return; /* a faulted context runs nothing more */
  switch (op->kind) {
  case OP_WAIT:
    while (op->event->completed < op->seq && !ctx->error) pthread_cond_wait(&fake_cv, &fake_mu);
    return;
  case OP_RECORD:
    op->event->completed = op->seq;
    op->event->ns = now_ns();
    pthread_cond_broadcast(&fake_cv);
    return;
  case OP_GRAPH:
    for (int i = 0; i < op->graph->n && !ctx->error; i++) execute(s, &op->graph->nodes[i]);
    return;
  default:
    break;
  }
  pthread_mutex_unlock(&fake_mu);
  int fault = 0;
  if (op->kind == OP_MEMSET) {
    memset(op->dst, op->value, op->bytes);
  } else if (op->kind == OP_MEMCPY) {
    memmove(op->dst, op->src, op->bytes);
  } else if (!op->fn->fn) {
    fault = 1;
  } else {
    for (uint32_t b = 0; b < op->grid; b++) op->fn->fn(op->bufs, op->step, b, op->block);
  }
  pthread_mutex_lock(&fake_mu);
  if (fault) {
    ctx->error = CUDA_ERROR_ILLEGAL_ADDRESS;
    pthread_cond_broadcast(&fake_cv);
  }
}

static void *stream_main(void *arg) {
  CUstream s = arg;
  pthread_mutex_lock(&fake_mu);
  for (;;) {
    while (!s->head && !s->shutdown) pthread_cond_wait(&s->work_cv, &fake_mu);
    if (!s->head) break;
    fake_op *op = s->head;
    s->head = op->next;
    if (!s->head) s->tail = NULL;
    s->busy = 1;
    execute(s, op);
    s->busy = 0;
    free(op);
    pthread_cond_broadcast(&fake_cv);
  }
  pthread_mutex_unlock(&fake_mu);
  return NULL;
}

/* The checks of every stream call: initialised, the stream's context
 * current on this thread. */
static CUresult check_stream(CUstream s) {
  if (!fake_initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (!s) return CUDA_ERROR_INVALID_HANDLE; /* the backend never uses the legacy stream */
  if (fake_current != s->ctx) return CUDA_ERROR_INVALID_CONTEXT;
  return s->ctx->error;
}

/* ---- capture (called with fake_mu held) ---- */

static int set_add(fake_set *set, int v) {
  for (int i = 0; i < set->n; i++)
    if (set->v[i] == v) return 0;
  if (set->n == set->cap) {
    int cap = set->cap ? 2 * set->cap : 8;
    int *nv = realloc(set->v, (size_t)cap * sizeof *nv);
    if (!nv) return -1;
    set->v = nv;
    set->cap = cap;
  }
  set->v[set->n++] = v;
  return 0;
}

static int set_copy(fake_set *dst, const fake_set *src) {
  dst->n = 0;
  for (int i = 0; i < src->n; i++)
    if (set_add(dst, src->v[i])) return -1;
  return 0;
}

static void graph_free(CUgraph g) {
  if (!g) return;
  for (int i = 0; i < g->n; i++) free(g->deps[i].v);
  free(g->nodes);
  free(g->deps);
  free(g);
}

/* op becomes node n of the stream's capture, after the stream's frontier,
 * which it then is alone; op itself is freed. */
static CUresult capture_node(CUstream s, fake_op *op) {
  CUgraph g = s->capture;
  CUresult r = CUDA_SUCCESS;
  if (op->kind != OP_LAUNCH && op->kind != OP_MEMCPY && op->kind != OP_MEMSET) {
    g->invalid = 1; /* host callbacks cannot be captured */
    r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  } else if (g->n == g->cap) {
    int cap = g->cap ? 2 * g->cap : 16;
    fake_op *nodes = realloc(g->nodes, (size_t)cap * sizeof *nodes);
    fake_set *deps = nodes ? realloc(g->deps, (size_t)cap * sizeof *deps) : NULL;
    if (nodes) g->nodes = nodes;
    if (deps) {
      g->deps = deps;
      g->cap = cap;
    } else {
      r = CUDA_ERROR_OUT_OF_MEMORY;
    }
  }
  if (!r) {
    g->nodes[g->n] = *op;
    g->deps[g->n] = (fake_set){0};
    if (set_copy(&g->deps[g->n], &s->frontier)) r = CUDA_ERROR_OUT_OF_MEMORY;
    s->frontier.n = 0;
    if (!r && set_add(&s->frontier, g->n)) r = CUDA_ERROR_OUT_OF_MEMORY;
    g->n++;
  }
  free(op);
  return r;
}

/* Whether every node of g leads to one of the origin's frontier: mark
 * from the frontier backwards (deps point to earlier nodes). */
static int capture_joined(CUgraph g, const fake_set *frontier) {
  char *seen = calloc((size_t)g->n + 1, 1);
  if (!seen) return 0;
  for (int i = 0; i < frontier->n; i++) seen[frontier->v[i]] = 1;
  for (int i = g->n - 1; i >= 0; i--)
    if (seen[i])
      for (int k = 0; k < g->deps[i].n; k++) seen[g->deps[i].v[k]] = 1;
  int all = 1;
  for (int i = 0; i < g->n; i++) all &= seen[i];
  free(seen);
  return all;
}

static CUresult enqueue(CUstream s, fake_op *op) {
  CUresult r = check_stream(s);
  if (r) {
    free(op);
    return r;
  }
  op->next = NULL;
  pthread_mutex_lock(&fake_mu);
  if (s->capture) {
    r = capture_node(s, op);
    pthread_mutex_unlock(&fake_mu);
    return r;
  }
  if (s->tail)
    s->tail->next = op;
  else
    s->head = op;
  s->tail = op;
  pthread_cond_signal(&s->work_cv);
  pthread_mutex_unlock(&fake_mu);
  return CUDA_SUCCESS;
}

static fake_op *op_new(int kind) {
  fake_op *op = calloc(1, sizeof *op);
  if (op) op->kind = kind;
  return op;
}

/* ---- the API ---- */

CUresult cuInit(unsigned int flags) {
  if (flags) return CUDA_ERROR_INVALID_VALUE;
  const char *env = getenv("DS4_FAKE_CUDA_DEVICES");
  int n = env ? atoi(env) : 1;
  if (n <= 0) return CUDA_ERROR_NO_DEVICE;
  pthread_mutex_lock(&fake_mu);
  if (!fake_initialized) {
    fake_ndevices = n < FAKE_MAX_DEVICES ? n : FAKE_MAX_DEVICES;
    for (int i = 0; i < fake_ndevices; i++) fake_ctxs[i].device = i;
    fake_initialized = 1;
  }
  if (!fake_cb_started && pthread_create(&fake_cb_thread, NULL, callback_main, NULL) == 0) {
    pthread_detach(fake_cb_thread);
    fake_cb_started = 1;
  }
  pthread_mutex_unlock(&fake_mu);
  return fake_cb_started ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult cuDeviceGetCount(int *out_count) {
  if (!fake_initialized) return CUDA_ERROR_NOT_INITIALIZED;
  *out_count = fake_ndevices;
  return CUDA_SUCCESS;
}

CUresult cuDeviceGet(CUdevice *out_dev, int ordinal) {
  if (!fake_initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (ordinal < 0 || ordinal >= fake_ndevices) return CUDA_ERROR_INVALID_DEVICE;
  *out_dev = ordinal;
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *out_ctx, CUdevice dev) {
  if (!fake_initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (dev < 0 || dev >= fake_ndevices) return CUDA_ERROR_INVALID_DEVICE;
  pthread_mutex_lock(&fake_mu);
  /* A new primary context starts clean, as after a reset. */
  if (fake_ctxs[dev].refs++ == 0) fake_ctxs[dev].error = CUDA_SUCCESS;
  pthread_mutex_unlock(&fake_mu);
  *out_ctx = &fake_ctxs[dev];
  return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  if (dev < 0 || dev >= fake_ndevices || fake_ctxs[dev].refs == 0) return CUDA_ERROR_INVALID_DEVICE;
  pthread_mutex_lock(&fake_mu);
  fake_ctxs[dev].refs--;
  pthread_mutex_unlock(&fake_mu);
  return CUDA_SUCCESS;
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
  if (!fake_initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (ctx && ctx->refs == 0) return CUDA_ERROR_INVALID_CONTEXT;
  fake_current = ctx;
  return CUDA_SUCCESS;
}

static const struct {
  CUresult code;
  const char *name, *text;
} fake_errors[] = {
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS",
     "an illegal memory access was encountered"},
    {CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
     "part or all of the requested memory range is already mapped"},
    {CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
     "pointer does not correspond to a registered memory region"},
    {CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE", "the operation is not permitted now"},
    {CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
     "operation not permitted when stream is capturing"},
    {CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
     "operation failed due to a previous error during capture"},
    {CUDA_ERROR_STREAM_CAPTURE_UNJOINED, "CUDA_ERROR_STREAM_CAPTURE_UNJOINED",
     "capture was not joined"},
    {CUDA_ERROR_STREAM_CAPTURE_ISOLATION, "CUDA_ERROR_STREAM_CAPTURE_ISOLATION",
     "a capture would depend on work outside it"},
};

CUresult cuGetErrorName(CUresult r, const char **out_name) {
  for (size_t i = 0; i < sizeof fake_errors / sizeof *fake_errors; i++)
    if (fake_errors[i].code == r) {
      *out_name = fake_errors[i].name;
      return CUDA_SUCCESS;
    }
  return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult r, const char **out_text) {
  for (size_t i = 0; i < sizeof fake_errors / sizeof *fake_errors; i++)
    if (fake_errors[i].code == r) {
      *out_text = fake_errors[i].text;
      return CUDA_SUCCESS;
    }
  return CUDA_ERROR_INVALID_VALUE;
}

static CUresult check_context(void) {
  if (!fake_initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (!fake_current) return CUDA_ERROR_INVALID_CONTEXT;
  return fake_current->error;
}

static size_t fake_memory(void) {
  const char *env = getenv("DS4_FAKE_CUDA_MEMORY");
  return env && *env ? (size_t)strtoull(env, NULL, 10) : (size_t)80 << 30;
}

CUresult cuMemGetInfo_v2(size_t *out_free, size_t *out_total) {
  CUresult r = check_context();
  if (r) return r;
  *out_free = *out_total = fake_memory();
  return CUDA_SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr *out_ptr, size_t bytes) {
  CUresult r = check_context();
  if (r) return r;
  if (bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  if (bytes > fake_memory()) return CUDA_ERROR_OUT_OF_MEMORY;
  size_t n = (bytes + 255) & ~(size_t)255;
  void *p = aligned_alloc(256, n);
  if (!p) return CUDA_ERROR_OUT_OF_MEMORY;
  memset(p, 0xab, n);
  *out_ptr = (CUdeviceptr)(uintptr_t)p;
  return CUDA_SUCCESS;
}

CUresult cuMemFree_v2(CUdeviceptr ptr) {
  CUresult r = check_context();
  if (r && r != CUDA_ERROR_ILLEGAL_ADDRESS) return r;
  free((void *)(uintptr_t)ptr);
  return CUDA_SUCCESS;
}

CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t n, CUstream s) {
  fake_op *op = op_new(OP_MEMSET);
  if (!op) return CUDA_ERROR_OUT_OF_MEMORY;
  op->dst = (void *)(uintptr_t)dst;
  op->value = value;
  op->bytes = n;
  return enqueue(s, op);
}

CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream s) {
  fake_op *op = op_new(OP_MEMCPY);
  if (!op) return CUDA_ERROR_OUT_OF_MEMORY;
  op->dst = (void *)(uintptr_t)dst;
  op->src = (const void *)(uintptr_t)src;
  op->bytes = bytes;
  return enqueue(s, op);
}

CUresult cuStreamCreate(CUstream *out_stream, unsigned int flags) {
  CUresult r = check_context();
  if (r) return r;
  if (flags != 1) return CUDA_ERROR_INVALID_VALUE; /* the backend asks for non-blocking */
  CUstream s = calloc(1, sizeof *s);
  if (!s) return CUDA_ERROR_OUT_OF_MEMORY;
  s->ctx = fake_current;
  pthread_cond_init(&s->work_cv, NULL);
  if (pthread_create(&s->thread, NULL, stream_main, s) != 0) {
    pthread_cond_destroy(&s->work_cv);
    free(s);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  pthread_mutex_lock(&fake_mu);
  for (int i = 0; i < FAKE_MAX_STREAMS; i++)
    if (!fake_streams[i]) {
      fake_streams[i] = s;
      break;
    }
  pthread_mutex_unlock(&fake_mu);
  *out_stream = s;
  return CUDA_SUCCESS;
}

CUresult cuStreamSynchronize(CUstream s) {
  if (!fake_initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (!s) return CUDA_ERROR_INVALID_HANDLE;
  if (fake_current != s->ctx) return CUDA_ERROR_INVALID_CONTEXT;
  pthread_mutex_lock(&fake_mu);
  while (s->head || s->busy) pthread_cond_wait(&fake_cv, &fake_mu);
  CUresult r = s->ctx->error;
  pthread_mutex_unlock(&fake_mu);
  return r;
}

CUresult cuStreamQuery(CUstream s) {
  CUresult r = check_stream(s);
  if (r) return r;
  pthread_mutex_lock(&fake_mu);
  r = s->head || s->busy ? CUDA_ERROR_NOT_READY : s->ctx->error;
  pthread_mutex_unlock(&fake_mu);
  return r;
}

/* Like the driver, destroying returns at once; the queued work still runs
 * (here: before the thread ends). */
CUresult cuStreamDestroy_v2(CUstream s) {
  if (!s) return CUDA_ERROR_INVALID_HANDLE;
  pthread_mutex_lock(&fake_mu);
  s->shutdown = 1;
  for (int i = 0; i < FAKE_MAX_STREAMS; i++)
    if (fake_streams[i] == s) fake_streams[i] = NULL;
  pthread_cond_signal(&s->work_cv);
  pthread_mutex_unlock(&fake_mu);
  pthread_join(s->thread, NULL);
  pthread_cond_destroy(&s->work_cv);
  free(s->frontier.v);
  free(s);
  return CUDA_SUCCESS;
}

CUresult cuStreamAddCallback(CUstream s, CUstreamCallback fn, void *user, unsigned int flags) {
  if (flags) return CUDA_ERROR_INVALID_VALUE;
  fake_op *op = op_new(OP_CALLBACK);
  if (!op) return CUDA_ERROR_OUT_OF_MEMORY;
  op->cb = fn;
  op->user = user;
  return enqueue(s, op);
}

CUresult cuEventCreate(CUevent *out_event, unsigned int flags) {
  CUresult r = check_context();
  if (r) return r;
  if (flags & ~2u) return CUDA_ERROR_INVALID_VALUE;
  CUevent e = calloc(1, sizeof *e);
  if (!e) return CUDA_ERROR_OUT_OF_MEMORY;
  e->ctx = fake_current;
  e->timing = !(flags & 2u);
  *out_event = e;
  return CUDA_SUCCESS;
}

CUresult cuEventDestroy_v2(CUevent e) {
  if (!e) return CUDA_ERROR_INVALID_HANDLE;
  free(e->nodes.v);
  free(e);
  return CUDA_SUCCESS;
}

CUresult cuEventRecord(CUevent e, CUstream s) {
  if (!e) return CUDA_ERROR_INVALID_HANDLE;
  if (s && e->ctx != s->ctx) return CUDA_ERROR_INVALID_HANDLE;
  CUresult r = check_stream(s);
  if (r) return r;
  pthread_mutex_lock(&fake_mu);
  if (s->capture) { /* no node: the frontier, for the waits that follow */
    e->captured = s->capture->id;
    r = set_copy(&e->nodes, &s->frontier) ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
    pthread_mutex_unlock(&fake_mu);
    return r;
  }
  e->captured = 0;
  pthread_mutex_unlock(&fake_mu);
  fake_op *op = op_new(OP_RECORD);
  if (!op) return CUDA_ERROR_OUT_OF_MEMORY;
  pthread_mutex_lock(&fake_mu);
  op->event = e;
  op->seq = ++e->recorded;
  pthread_mutex_unlock(&fake_mu);
  return enqueue(s, op);
}

/* The capture numbered id if it is still going on (some stream takes part
 * in it), else NULL. */
static CUgraph capture_live(uint64_t id) {
  for (int i = 0; id && i < FAKE_MAX_STREAMS; i++)
    if (fake_streams[i] && fake_streams[i]->capture && fake_streams[i]->capture->id == id)
      return fake_streams[i]->capture;
  return NULL;
}

/* A wait inside a capture, or on an event recorded in one (fake_mu held). */
static CUresult capture_wait(CUstream s, CUevent e) {
  CUgraph g = capture_live(e->captured);
  if (!g) { /* an event recorded outside: a capture cannot wait on it */
    s->capture->invalid = 1;
    return CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
  }
  if (!s->capture) {
    s->capture = g;
    s->origin = 0;
    s->frontier.n = 0;
  } else if (s->capture != g) {
    s->capture->invalid = 1;
    return CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
  }
  for (int i = 0; i < e->nodes.n; i++)
    if (set_add(&s->frontier, e->nodes.v[i])) return CUDA_ERROR_OUT_OF_MEMORY;
  return CUDA_SUCCESS;
}

/* The event may belong to any context; a never-recorded event is no wait. */
CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned int flags) {
  if (!e || flags) return CUDA_ERROR_INVALID_VALUE;
  CUresult r = check_stream(s);
  if (r) return r;
  pthread_mutex_lock(&fake_mu);
  if (s->capture || capture_live(e->captured)) {
    r = capture_wait(s, e);
    pthread_mutex_unlock(&fake_mu);
    return r;
  }
  pthread_mutex_unlock(&fake_mu);
  fake_op *op = op_new(OP_WAIT);
  if (!op) return CUDA_ERROR_OUT_OF_MEMORY;
  pthread_mutex_lock(&fake_mu);
  op->event = e;
  op->seq = e->recorded;
  pthread_mutex_unlock(&fake_mu);
  return enqueue(s, op);
}

CUresult cuEventSynchronize(CUevent e) {
  if (!e) return CUDA_ERROR_INVALID_HANDLE;
  pthread_mutex_lock(&fake_mu);
  while (e->completed < e->recorded && !e->ctx->error) pthread_cond_wait(&fake_cv, &fake_mu);
  CUresult r = e->ctx->error;
  pthread_mutex_unlock(&fake_mu);
  return r;
}

/* Exported under its old name only, as by drivers before CUDA 12.8. */
CUresult cuEventElapsedTime(float *out_ms, CUevent from, CUevent to) {
  if (!from || !to || !from->timing || !to->timing) return CUDA_ERROR_INVALID_HANDLE;
  pthread_mutex_lock(&fake_mu);
  CUresult r = CUDA_SUCCESS;
  if (!from->recorded || !to->recorded)
    r = CUDA_ERROR_INVALID_HANDLE;
  else if (from->completed < from->recorded || to->completed < to->recorded)
    r = CUDA_ERROR_NOT_READY;
  else
    *out_ms = (float)((double)((int64_t)to->ns - (int64_t)from->ns) / 1e6);
  pthread_mutex_unlock(&fake_mu);
  return r;
}

/* "Compiles" PTX text: it must carry a .version directive. */
CUresult cuModuleLoadDataEx(CUmodule *out_module, const void *image, unsigned int noptions,
                            int *options, void **values) {
  CUresult r = check_context();
  if (r) return r;
  const char *text = image;
  if (!strstr(text, ".version")) {
    char *log = NULL;
    size_t len = 0;
    for (unsigned int i = 0; i < noptions; i++) {
      if (options[i] == 5) log = values[i];
      if (options[i] == 6) len = (size_t)(uintptr_t)values[i];
    }
    if (log && len) snprintf(log, len, "fake ptxas: line 1: no .version directive\n");
    return CUDA_ERROR_INVALID_IMAGE;
  }
  CUmodule m = calloc(1, sizeof *m);
  if (!m || !(m->text = strdup(text))) {
    free(m);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  m->ctx = fake_current;
  *out_module = m;
  return CUDA_SUCCESS;
}

CUresult cuModuleUnload(CUmodule m) {
  if (!m) return CUDA_ERROR_INVALID_HANDLE;
  free(m->text);
  free(m);
  return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(CUfunction *out_function, CUmodule m, const char *name) {
  if (!m) return CUDA_ERROR_INVALID_HANDLE;
  char entry[256];
  snprintf(entry, sizeof entry, ".entry %s(", name);
  if (!strstr(m->text, entry)) return CUDA_ERROR_NOT_FOUND;
  for (size_t i = 0; i < sizeof fake_kernels / sizeof *fake_kernels; i++)
    if (strcmp(fake_kernels[i].name, name) == 0) {
      *out_function = &fake_kernels[i];
      return CUDA_SUCCESS;
    }
  return CUDA_ERROR_NOT_FOUND;
}

/* Launches so far, and of them those that allowed programmatic stream
 * serialization (fake_cuda_launch_counts). A stream here runs each op
 * after the one before it has ended, which is what a kernel that waits
 * for its predecessor observes either way. */
static uint64_t fake_launches, fake_overlapped;

CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
                        unsigned int bx, unsigned int by, unsigned int bz, unsigned int shared,
                        CUstream s, void **params, void **extra) {
  if (!f) return CUDA_ERROR_INVALID_HANDLE;
  pthread_mutex_lock(&fake_mu);
  fake_launches++;
  pthread_mutex_unlock(&fake_mu);
  if (!gx || !bx || gy != 1 || gz != 1 || by != 1 || bz != 1 || bx > 1024 || shared || extra ||
      !params)
    return CUDA_ERROR_INVALID_VALUE;
  fake_op *op = op_new(OP_LAUNCH);
  if (!op) return CUDA_ERROR_OUT_OF_MEMORY;
  op->fn = f;
  op->grid = gx;
  op->block = bx;
  /* The values are read at launch, as the driver copies them then. */
  op->bufs = *(void *const *const *)params[0];
  op->step = *(const int32_t *const *)params[1];
  return enqueue(s, op);
}

/* cuda.h's CUlaunchConfig and CUlaunchAttribute; of the attributes, only
 * programmatic stream serialization (id 6), the one the backend sets. */
typedef struct CUlaunchAttribute {
  int id;
  char pad[4];
  union {
    char bytes[64];
    int allowed;
  } value;
} CUlaunchAttribute;

typedef struct CUlaunchConfig {
  unsigned int gx, gy, gz, bx, by, bz, shared;
  CUstream s;
  CUlaunchAttribute *attrs;
  unsigned int nattrs;
} CUlaunchConfig;

CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {
  if (!c || (c->nattrs && !c->attrs)) return CUDA_ERROR_INVALID_VALUE;
  int overlapped = 0;
  for (unsigned int i = 0; i < c->nattrs; i++) {
    if (c->attrs[i].id != 6) return CUDA_ERROR_INVALID_VALUE;
    overlapped = c->attrs[i].value.allowed != 0;
  }
  CUresult r = cuLaunchKernel(f, c->gx, c->gy, c->gz, c->bx, c->by, c->bz, c->shared, c->s, params, extra);
  if (!r && overlapped) {
    pthread_mutex_lock(&fake_mu);
    fake_overlapped++;
    pthread_mutex_unlock(&fake_mu);
  }
  return r;
}

CUresult cuMemHostRegister_v2(void *ptr, size_t bytes, unsigned int flags) {
  CUresult r = check_context();
  if (r) return r;
  if (!ptr || !bytes || flags != 1) return CUDA_ERROR_INVALID_VALUE;
  pthread_mutex_lock(&fake_mu);
  r = CUDA_ERROR_OUT_OF_MEMORY;
  for (int i = 0; i < FAKE_MAX_REGISTERED; i++) {
    const char *a = fake_registered[i].ptr, *b = ptr;
    if (a && a < b + bytes && b < a + fake_registered[i].bytes) {
      r = CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
      break;
    }
  }
  for (int i = 0; r == CUDA_ERROR_OUT_OF_MEMORY && i < FAKE_MAX_REGISTERED; i++)
    if (!fake_registered[i].ptr) {
      fake_registered[i].ptr = ptr;
      fake_registered[i].bytes = bytes;
      r = CUDA_SUCCESS;
    }
  pthread_mutex_unlock(&fake_mu);
  return r;
}

CUresult cuMemHostUnregister(void *ptr) {
  pthread_mutex_lock(&fake_mu);
  CUresult r = CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
  for (int i = 0; i < FAKE_MAX_REGISTERED; i++)
    if (fake_registered[i].ptr == ptr) {
      fake_registered[i].ptr = NULL;
      r = CUDA_SUCCESS;
    }
  pthread_mutex_unlock(&fake_mu);
  return r;
}

/* ---- graphs ---- */

CUresult cuStreamBeginCapture_v2(CUstream s, int mode) {
  CUresult r = check_stream(s);
  if (r) return r;
  if (mode < 0 || mode > 2) return CUDA_ERROR_INVALID_VALUE;
  CUgraph g = calloc(1, sizeof *g);
  if (!g) return CUDA_ERROR_OUT_OF_MEMORY;
  pthread_mutex_lock(&fake_mu);
  if (s->capture) {
    r = CUDA_ERROR_ILLEGAL_STATE;
  } else {
    g->id = ++fake_captures;
    s->capture = g;
    s->origin = 1;
    s->frontier.n = 0;
  }
  pthread_mutex_unlock(&fake_mu);
  if (r) free(g);
  return r;
}

/* Every stream of the capture leaves it; the graph is returned only when
 * the capture was whole and joined. */
CUresult cuStreamEndCapture(CUstream s, CUgraph *out_graph) {
  if (!out_graph) return CUDA_ERROR_INVALID_VALUE;
  *out_graph = NULL;
  CUresult r = check_stream(s);
  if (r) return r;
  pthread_mutex_lock(&fake_mu);
  CUgraph g = s->capture;
  if (!g || !s->origin) {
    pthread_mutex_unlock(&fake_mu);
    return CUDA_ERROR_ILLEGAL_STATE;
  }
  if (g->invalid)
    r = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  else if (!capture_joined(g, &s->frontier))
    r = CUDA_ERROR_STREAM_CAPTURE_UNJOINED;
  for (int i = 0; i < FAKE_MAX_STREAMS; i++)
    if (fake_streams[i] && fake_streams[i]->capture == g) {
      fake_streams[i]->capture = NULL;
      fake_streams[i]->origin = 0;
      fake_streams[i]->frontier.n = 0;
    }
  pthread_mutex_unlock(&fake_mu);
  if (r)
    graph_free(g);
  else
    *out_graph = g;
  return r;
}

CUresult cuGraphGetNodes(CUgraph g, CUgraphNode *nodes, size_t *count) {
  if (!g || !count) return CUDA_ERROR_INVALID_VALUE;
  if (nodes)
    for (size_t i = 0; i < *count && i < (size_t)g->n; i++) nodes[i] = (CUgraphNode)(uintptr_t)(i + 1);
  *count = (size_t)g->n;
  return CUDA_SUCCESS;
}

/* Counts only: the backend asks for nothing else. */
CUresult cuGraphGetEdges_v2(CUgraph g, CUgraphNode *from, CUgraphNode *to, void *edge_data,
                            size_t *count) {
  if (!g || !count || from || to || edge_data) return CUDA_ERROR_INVALID_VALUE;
  size_t n = 0;
  for (int i = 0; i < g->n; i++) n += (size_t)g->deps[i].n;
  *count = n;
  return CUDA_SUCCESS;
}

/* The executable graph is a copy: the graph may be destroyed first. */
CUresult cuGraphInstantiateWithFlags(CUgraphExec *out_exec, CUgraph g, unsigned long long flags) {
  if (!out_exec || !g || flags) return CUDA_ERROR_INVALID_VALUE;
  CUgraphExec e = calloc(1, sizeof *e);
  int nedges = 0;
  for (int i = 0; i < g->n; i++) nedges += g->deps[i].n;
  int(*edges)[2] = malloc((size_t)(nedges ? nedges : 1) * sizeof *edges);
  if (e) e->nodes = malloc((size_t)(g->n ? g->n : 1) * sizeof *e->nodes);
  if (!e || !edges || !e->nodes) {
    if (e) free(e->nodes);
    free(e);
    free(edges);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  memcpy(e->nodes, g->nodes, (size_t)g->n * sizeof *e->nodes);
  e->n = e->cap = g->n;
  int k = 0;
  for (int i = 0; i < g->n; i++)
    for (int j = 0; j < g->deps[i].n; j++) {
      edges[k][0] = g->deps[i].v[j];
      edges[k++][1] = i;
    }
  pthread_mutex_lock(&fake_mu);
  free(fake_last_edges);
  fake_last_edges = edges;
  fake_last_nodes = g->n;
  fake_last_nedges = nedges;
  pthread_mutex_unlock(&fake_mu);
  *out_exec = e;
  return CUDA_SUCCESS;
}

CUresult cuGraphLaunch(CUgraphExec e, CUstream s) {
  if (!e) return CUDA_ERROR_INVALID_HANDLE;
  fake_op *op = op_new(OP_GRAPH);
  if (!op) return CUDA_ERROR_OUT_OF_MEMORY;
  op->graph = e;
  return enqueue(s, op);
}

CUresult cuGraphDestroy(CUgraph g) {
  if (!g) return CUDA_ERROR_INVALID_HANDLE;
  graph_free(g);
  return CUDA_SUCCESS;
}

CUresult cuGraphExecDestroy(CUgraphExec e) {
  if (!e) return CUDA_ERROR_INVALID_HANDLE;
  free(e->nodes);
  free(e);
  return CUDA_SUCCESS;
}

/* Test hook: the last graph instantiated: its node count (-1: none yet),
 * and its dependencies as (from, to) node indices in capture order, up to
 * cap of them into edges; *out_nedges gets how many there are. */
int fake_cuda_last_graph(int (*edges)[2], int cap, int *out_nedges) {
  pthread_mutex_lock(&fake_mu);
  int n = fake_last_edges ? fake_last_nodes : -1;
  *out_nedges = fake_last_nedges;
  for (int i = 0; i < cap && i < fake_last_nedges; i++) {
    edges[i][0] = fake_last_edges[i][0];
    edges[i][1] = fake_last_edges[i][1];
  }
  pthread_mutex_unlock(&fake_mu);
  return n;
}

/* Test hook: the launches so far, and into *out_overlapped those that
 * allowed programmatic stream serialization. */
uint64_t fake_cuda_launch_counts(uint64_t *out_overlapped) {
  pthread_mutex_lock(&fake_mu);
  uint64_t n = fake_launches;
  *out_overlapped = fake_overlapped;
  pthread_mutex_unlock(&fake_mu);
  return n;
}

/* Test hook: open (1) or close (0) the gate fake_hang kernels wait at. */
void fake_cuda_hang_gate(int open) {
  pthread_mutex_lock(&fake_gate_mu);
  fake_gate_open = open;
  pthread_cond_broadcast(&fake_gate_cv);
  pthread_mutex_unlock(&fake_gate_mu);
}

/* Test hook: how many host ranges are registered now. */
int fake_cuda_registered_count(void) {
  int n = 0;
  pthread_mutex_lock(&fake_mu);
  for (int i = 0; i < FAKE_MAX_REGISTERED; i++) n += fake_registered[i].ptr != NULL;
  pthread_mutex_unlock(&fake_mu);
  return n;
}
