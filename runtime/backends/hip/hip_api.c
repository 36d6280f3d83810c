/* hip_api.c - the GPU backend's driver table over the HIP runtime
 * (libamdhip64.so of ROCm, loaded with dlopen; DS4_HIP_LIBRARY names
 * another file). HIP binds devices per thread too: each call first makes
 * the device current with hipSetDevice. The types and constants below
 * restate hip_runtime_api.h's, so that building needs no ROCm. */
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/gpu_api.h"

typedef int hipError_t;
typedef struct ihipStream_t *hipStream_t;
typedef struct ihipEvent_t *hipEvent_t;
typedef struct ihipModule_t *hipModule_t;
typedef struct ihipModuleSymbol_t *hipFunction_t;
typedef void (*hipStreamCallback_t)(hipStream_t stream, hipError_t status, void *user);
typedef struct ihipGraph *hipGraph_t;
typedef struct hipGraphNode *hipGraphNode_t;
typedef struct hipGraphExec *hipGraphExec_t;

enum {
  hipSuccess = 0,
  hipErrorNotReady = 600,
  hipErrorHostMemoryAlreadyRegistered = 712,
  hipStreamNonBlocking = 1,
  hipEventDefault = 0,
  hipEventDisableTiming = 2,
  hipHostRegisterPortable = 1,
  hipMemcpyDefault = 4,
  hipStreamCaptureModeRelaxed = 2,
};
#define HIP_LAUNCH_PARAM_BUFFER_POINTER ((void *)0x01)
#define HIP_LAUNCH_PARAM_BUFFER_SIZE ((void *)0x02)
#define HIP_LAUNCH_PARAM_END ((void *)0x03)

/* Every function used: required (1) or optional (0), its return type and
 * name (as in hip_runtime_api.h). None was renamed across ROCm 5 and 6. */
#define HIP_FUNCTIONS(X)                                                                           \
  X(1, hipError_t, hipInit, (unsigned int flags))                                                  \
  X(1, hipError_t, hipGetDeviceCount, (int *out_count))                                            \
  X(1, hipError_t, hipSetDevice, (int ordinal))                                                    \
  X(1, const char *, hipGetErrorName, (hipError_t e))                                              \
  X(1, const char *, hipGetErrorString, (hipError_t e))                                            \
  X(1, hipError_t, hipMalloc, (void **out_ptr, size_t bytes))                                      \
  X(1, hipError_t, hipFree, (void *ptr))                                                           \
  X(1, hipError_t, hipMemsetAsync, (void *dst, int value, size_t bytes, hipStream_t s))            \
  X(1, hipError_t, hipMemcpyAsync,                                                                 \
    (void *dst, const void *src, size_t bytes, int kind, hipStream_t s))                           \
  X(1, hipError_t, hipStreamCreateWithFlags, (hipStream_t * out_stream, unsigned int flags))       \
  X(1, hipError_t, hipStreamDestroy, (hipStream_t s))                                              \
  X(1, hipError_t, hipStreamSynchronize, (hipStream_t s))                                          \
  X(1, hipError_t, hipStreamQuery, (hipStream_t s))                                                \
  X(1, hipError_t, hipStreamWaitEvent, (hipStream_t s, hipEvent_t e, unsigned int flags))          \
  X(1, hipError_t, hipStreamAddCallback,                                                           \
    (hipStream_t s, hipStreamCallback_t fn, void *user, unsigned int flags))                       \
  X(1, hipError_t, hipEventCreateWithFlags, (hipEvent_t * out_event, unsigned int flags))          \
  X(1, hipError_t, hipEventDestroy, (hipEvent_t e))                                                \
  X(1, hipError_t, hipEventRecord, (hipEvent_t e, hipStream_t s))                                  \
  X(1, hipError_t, hipEventSynchronize, (hipEvent_t e))                                            \
  X(1, hipError_t, hipEventElapsedTime, (float *out_ms, hipEvent_t from, hipEvent_t to))           \
  X(1, hipError_t, hipModuleLoadData, (hipModule_t * out_module, const void *image))               \
  X(1, hipError_t, hipModuleUnload, (hipModule_t m))                                               \
  X(1, hipError_t, hipModuleGetFunction,                                                           \
    (hipFunction_t * out_function, hipModule_t m, const char *name))                               \
  X(1, hipError_t, hipModuleLaunchKernel,                                                          \
    (hipFunction_t f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,          \
     unsigned int by, unsigned int bz, unsigned int shared, hipStream_t s, void **params,          \
     void **extra))                                                                                \
  X(1, hipError_t, hipHostRegister, (void *ptr, size_t bytes, unsigned int flags))                 \
  X(1, hipError_t, hipHostUnregister, (void *ptr))                                                 \
  X(0, hipError_t, hipDeviceCanAccessPeer, (int *out_can, int dev, int peer))                      \
  X(0, hipError_t, hipDeviceEnablePeerAccess, (int peer, unsigned int flags))                     \
  X(0, hipError_t, hipDriverGetVersion, (int *out_version))                                        \
  X(0, hipError_t, hipMemGetInfo, (size_t * out_free, size_t * out_total))                          \
  X(0, hipError_t, hipDeviceGetName, (char *out_name, int len, int dev))                           \
  X(0, hipError_t, hipStreamBeginCapture, (hipStream_t s, int mode))                               \
  X(0, hipError_t, hipStreamEndCapture, (hipStream_t s, hipGraph_t * out_graph))                   \
  X(0, hipError_t, hipGraphGetNodes, (hipGraph_t g, hipGraphNode_t * nodes, size_t * count))       \
  X(0, hipError_t, hipGraphGetEdges,                                                               \
    (hipGraph_t g, hipGraphNode_t * from, hipGraphNode_t * to, size_t * count))                    \
  X(0, hipError_t, hipGraphInstantiate,                                                            \
    (hipGraphExec_t * out_exec, hipGraph_t g, hipGraphNode_t * error_node, char *log, size_t len)) \
  X(0, hipError_t, hipGraphLaunch, (hipGraphExec_t e, hipStream_t s))                              \
  X(0, hipError_t, hipGraphDestroy, (hipGraph_t g))                                                \
  X(0, hipError_t, hipGraphExecDestroy, (hipGraphExec_t e))

typedef struct hip_functions {
#define HIP_FIELD(required, ret, name, params) ret(*name) params;
  HIP_FUNCTIONS(HIP_FIELD)
#undef HIP_FIELD
} hip_functions;

static const gpu_symbol hip_symbols[] = {
#define HIP_SYMBOL(required, ret, name, params) \
  {#name, NULL, offsetof(hip_functions, name), required},
    HIP_FUNCTIONS(HIP_SYMBOL)
#undef HIP_SYMBOL
};

/* The unversioned name is a development symlink some installs lack. */
static const char *const hip_files[] = {"libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5",
                                        NULL};
static const gpu_library hip_library = {
    .backend = "hip",
    .env = "DS4_HIP_LIBRARY",
    .files = hip_files,
    .install_hint = "install ROCm's HIP runtime",
};

struct gpu_driver {
  char name[64];  /* the device, for messages */
  char file[256]; /* the library loaded */
  void *lib;
  hip_functions fn;
  int ordinal; /* -1 until select */
};

/* ---- errors ---- */

/* hipGetErrorName and hipGetErrorString only look the code up, so unlike
 * CUDA's they are safe inside a stream callback too. */
static void hip_describe(const gpu_driver *d, hipError_t e, char *buf, size_t len) {
  const char *name = d->fn.hipGetErrorName(e);
  if (!name) {
    snprintf(buf, len, "hipError_t %d", e);
    return;
  }
  gpu_error_text(buf, len, name, d->fn.hipGetErrorString(e));
}

/* "hip device gpu0: <call> failed: hipError... (...)", or NULL. */
__attribute__((format(printf, 3, 4))) static rt_status hip_check(const gpu_driver *d, hipError_t e,
                                                                 const char *call_fmt, ...) {
  if (e == hipSuccess) return NULL;
  char call[256], why[256];
  va_list ap;
  va_start(ap, call_fmt);
  vsnprintf(call, sizeof call, call_fmt, ap);
  va_end(ap);
  hip_describe(d, e, why, sizeof why);
  return rt_status_make("hip device %s: %s failed: %s", d->name, call, why);
}

/* ---- the driver and the device ---- */

static void hip_unload(gpu_driver *d) {
  if (!d) return;
  if (d->lib) dlclose(d->lib);
  free(d);
}

static rt_status hip_load(const char *device_name, gpu_driver **out_drv) {
  *out_drv = NULL;
  gpu_driver *d = calloc(1, sizeof *d);
  if (!d) return rt_status_make("hip device %s: out of memory", device_name);
  snprintf(d->name, sizeof d->name, "%s", device_name);
  d->ordinal = -1;
  rt_status s = gpu_library_open(&hip_library, &d->lib, d->file, sizeof d->file);
  if (!s)
    s = gpu_symbols_resolve(&hip_library, d->lib, d->file, hip_symbols,
                            sizeof hip_symbols / sizeof *hip_symbols, &d->fn);
  if (s) {
    hip_unload(d);
    return s;
  }
  *out_drv = d;
  return NULL;
}

/* Without a GPU, ROCm's hipInit answers hipErrorInvalidDevice, which reads
 * as if an ordinal were wrong; hipGetDeviceCount's hipErrorNoDevice says
 * what happened, so a failed init reports both. */
static rt_status hip_init(gpu_driver *d, uint32_t *out_count) {
  *out_count = 0;
  char init_why[256] = "", count_why[256];
  hipError_t e = d->fn.hipInit(0);
  if (e != hipSuccess) hip_describe(d, e, init_why, sizeof init_why);
  int n = 0;
  hipError_t ce = d->fn.hipGetDeviceCount(&n);
  if (ce != hipSuccess) {
    hip_describe(d, ce, count_why, sizeof count_why);
    if (init_why[0])
      return rt_status_make("hip: no HIP device (%s: hipInit: %s; hipGetDeviceCount: %s)", d->file,
                            init_why, count_why);
    return rt_status_make("hip: no HIP device (%s: hipGetDeviceCount: %s)", d->file, count_why);
  }
  if (init_why[0]) return rt_status_make("hip: no HIP device (%s: hipInit: %s)", d->file, init_why);
  if (n <= 0)
    return rt_status_make("hip: no HIP device (%s: hipGetDeviceCount found none)", d->file);
  *out_count = (uint32_t)n;
  return NULL;
}

static rt_status hip_make_current(gpu_driver *d) {
  return hip_check(d, d->fn.hipSetDevice(d->ordinal), "hipSetDevice(%d)", d->ordinal);
}

static rt_status hip_select(gpu_driver *d, uint32_t ordinal) {
  d->ordinal = (int)ordinal;
  return hip_make_current(d);
}

/* The name and driver version only: hipDeviceGetAttribute's numbering
 * is not restated here, so the sizes stay 0 (unknown). */
static rt_status hip_device_info(gpu_driver *d, gpu_device_info *out_info) {
  memset(out_info, 0, sizeof *out_info);
  if (!d->fn.hipDriverGetVersion || !d->fn.hipDeviceGetName)
    return rt_status_make("hip device %s: %s lacks hipDriverGetVersion or hipDeviceGetName",
                          d->name, d->file);
  RT_TRY(hip_check(d, d->fn.hipDriverGetVersion(&out_info->driver_version),
                   "hipDriverGetVersion"));
  return hip_check(d, d->fn.hipDeviceGetName(out_info->name, (int)sizeof out_info->name, d->ordinal),
                   "hipDeviceGetName");
}

/* HIP has no notion of a device in use, so every peer that can be reached
 * is enabled, both ways. Failures only cost speed and are not reported. */
static void hip_peer_enable(gpu_driver *d) {
  if (!d->fn.hipDeviceCanAccessPeer || !d->fn.hipDeviceEnablePeerAccess) return;
  int n = 0;
  if (d->fn.hipGetDeviceCount(&n) != hipSuccess) return;
  for (int peer = 0; peer < n; peer++) {
    int there = 0, back = 0;
    if (peer == d->ordinal) continue;
    if (d->fn.hipDeviceCanAccessPeer(&there, d->ordinal, peer) != hipSuccess) there = 0;
    if (d->fn.hipDeviceCanAccessPeer(&back, peer, d->ordinal) != hipSuccess) back = 0;
    if (there && d->fn.hipSetDevice(d->ordinal) == hipSuccess)
      d->fn.hipDeviceEnablePeerAccess(peer, 0);
    if (back && d->fn.hipSetDevice(peer) == hipSuccess)
      d->fn.hipDeviceEnablePeerAccess(d->ordinal, 0);
  }
  d->fn.hipSetDevice(d->ordinal);
}

/* ---- memory ---- */

/* As cuda_mem_alloc: more than hipMemGetInfo reports free is refused with
 * both figures before hipMalloc is asked. */
static rt_status hip_mem_alloc(gpu_driver *d, size_t bytes, void **out_ptr) {
  *out_ptr = NULL;
  size_t free_bytes = 0, total = 0;
  if (d->fn.hipMemGetInfo && d->fn.hipMemGetInfo(&free_bytes, &total) == hipSuccess && bytes > free_bytes)
    return rt_status_make("hip device %s: %zu bytes do not fit: the device has %zu bytes free of %zu "
                          "(hipMemGetInfo)",
                          d->name, bytes, free_bytes, total);
  return hip_check(d, d->fn.hipMalloc(out_ptr, bytes), "hipMalloc(%zu bytes)", bytes);
}

static void hip_mem_free(gpu_driver *d, void *ptr) { d->fn.hipFree(ptr); }

static rt_status hip_memset_async(gpu_driver *d, gpu_stream s, void *dst, int value, size_t bytes) {
  return hip_check(d, d->fn.hipMemsetAsync(dst, value, bytes, (hipStream_t)s),
                   "hipMemsetAsync(%zu bytes)", bytes);
}

static rt_status hip_memcpy_async(gpu_driver *d, gpu_stream s, void *dst, const void *src,
                                  size_t bytes) {
  return hip_check(d, d->fn.hipMemcpyAsync(dst, src, bytes, hipMemcpyDefault, (hipStream_t)s),
                   "hipMemcpyAsync(%p <- %p, %zu bytes)", dst, src, bytes);
}

static rt_status hip_host_register(gpu_driver *d, void *ptr, size_t bytes, int *out_owned) {
  *out_owned = 0;
  hipError_t e = d->fn.hipHostRegister(ptr, bytes, hipHostRegisterPortable);
  if (e == hipErrorHostMemoryAlreadyRegistered) return NULL;
  RT_TRY(hip_check(d, e, "hipHostRegister(%p, %zu bytes)", ptr, bytes));
  *out_owned = 1;
  return NULL;
}

static void hip_host_unregister(gpu_driver *d, void *ptr) { d->fn.hipHostUnregister(ptr); }

/* ---- streams and events ---- */

static rt_status hip_stream_create(gpu_driver *d, gpu_stream *out_stream) {
  hipStream_t s = NULL;
  *out_stream = NULL;
  RT_TRY(hip_check(d, d->fn.hipStreamCreateWithFlags(&s, hipStreamNonBlocking),
                   "hipStreamCreateWithFlags"));
  *out_stream = (gpu_stream)s;
  return NULL;
}

static void hip_stream_destroy(gpu_driver *d, gpu_stream s) {
  d->fn.hipStreamDestroy((hipStream_t)s);
}

static rt_status hip_stream_sync(gpu_driver *d, gpu_stream s) {
  return hip_check(d, d->fn.hipStreamSynchronize((hipStream_t)s), "hipStreamSynchronize");
}

static rt_status hip_stream_query(gpu_driver *d, gpu_stream s, int *out_idle) {
  hipError_t e = d->fn.hipStreamQuery((hipStream_t)s);
  *out_idle = e == hipSuccess;
  return e == hipErrorNotReady ? NULL : hip_check(d, e, "hipStreamQuery");
}

static rt_status hip_stream_wait_event(gpu_driver *d, gpu_stream s, gpu_event e) {
  return hip_check(d, d->fn.hipStreamWaitEvent((hipStream_t)s, (hipEvent_t)e, 0),
                   "hipStreamWaitEvent");
}

static rt_status hip_event_create(gpu_driver *d, int timing, gpu_event *out_event) {
  hipEvent_t e = NULL;
  *out_event = NULL;
  unsigned int flags = timing ? hipEventDefault : hipEventDisableTiming;
  RT_TRY(hip_check(d, d->fn.hipEventCreateWithFlags(&e, flags), "hipEventCreateWithFlags"));
  *out_event = (gpu_event)e;
  return NULL;
}

static void hip_event_destroy(gpu_driver *d, gpu_event e) { d->fn.hipEventDestroy((hipEvent_t)e); }

static rt_status hip_event_record(gpu_driver *d, gpu_event e, gpu_stream s) {
  return hip_check(d, d->fn.hipEventRecord((hipEvent_t)e, (hipStream_t)s), "hipEventRecord");
}

static rt_status hip_event_sync(gpu_driver *d, gpu_event e) {
  return hip_check(d, d->fn.hipEventSynchronize((hipEvent_t)e), "hipEventSynchronize");
}

static rt_status hip_event_elapsed_ms(gpu_driver *d, gpu_event from, gpu_event to, float *out_ms) {
  *out_ms = 0;
  return hip_check(d, d->fn.hipEventElapsedTime(out_ms, (hipEvent_t)from, (hipEvent_t)to),
                   "hipEventElapsedTime");
}

/* hipStreamAddCallback: ROCm 5's HIP has no hipLaunchHostFunc, and the
 * callback is told about a failed stream (see cuda_api.c). */
static void hip_host_task_trampoline(hipStream_t s, hipError_t e, void *user) {
  (void)s;
  gpu_host_task *t = user;
  rt_status err = NULL;
  if (e != hipSuccess) {
    char why[256];
    hip_describe(t->drv, e, why, sizeof why);
    err = rt_status_make("hip device %s: stream failed: %s", t->drv->name, why);
  }
  t->run(t, err);
}

static rt_status hip_host_task(gpu_driver *d, gpu_stream s, gpu_host_task *t) {
  t->drv = d;
  return hip_check(d, d->fn.hipStreamAddCallback((hipStream_t)s, hip_host_task_trampoline, t, 0),
                   "hipStreamAddCallback");
}

/* ---- code ---- */

static rt_status hip_module_load(gpu_driver *d, const void *image, gpu_module *out_module) {
  hipModule_t m = NULL;
  *out_module = NULL;
  RT_TRY(hip_check(d, d->fn.hipModuleLoadData(&m, image), "hipModuleLoadData"));
  *out_module = (gpu_module)m;
  return NULL;
}

static void hip_module_unload(gpu_driver *d, gpu_module m) {
  d->fn.hipModuleUnload((hipModule_t)m);
}

static rt_status hip_function_find(gpu_driver *d, gpu_module m, const char *symbol,
                                   gpu_function *out_function) {
  hipFunction_t f = NULL;
  *out_function = NULL;
  RT_TRY(hip_check(d, d->fn.hipModuleGetFunction(&f, (hipModule_t)m, symbol),
                   "hipModuleGetFunction(%s)", symbol));
  *out_function = (gpu_function)f;
  return NULL;
}

/* The arguments go through `extra` as one packed buffer: ROCm's
 * documentation still marks kernelParams as unimplemented. Pointers need no
 * padding, so the buffer is the args array itself. HIP has no launch that
 * overlaps the one before it: overlap changes nothing. */
static rt_status hip_launch(gpu_driver *d, gpu_stream s, gpu_function f, uint32_t grid,
                            uint32_t block, uint32_t shared_bytes, const void *const *args,
                            uint32_t nargs, int overlap) {
  (void)overlap;
  size_t size = nargs * sizeof(void *);
  void *extra[] = {HIP_LAUNCH_PARAM_BUFFER_POINTER, (void *)args, HIP_LAUNCH_PARAM_BUFFER_SIZE,
                   &size, HIP_LAUNCH_PARAM_END};
  return hip_check(d,
                   d->fn.hipModuleLaunchKernel((hipFunction_t)f, grid, 1, 1, block, 1, 1,
                                               shared_bytes, (hipStream_t)s, NULL, extra),
                   "hipModuleLaunchKernel(grid %u, block %u)", grid, block);
}

/* ---- graphs ---- */

/* Optional in the table, so that a runtime without graphs still replays
 * streams: graph replay fails here, naming what is missing. */
static rt_status hip_capture_begin(gpu_driver *d, gpu_stream s) {
  if (!d->fn.hipStreamBeginCapture || !d->fn.hipStreamEndCapture || !d->fn.hipGraphGetNodes ||
      !d->fn.hipGraphGetEdges || !d->fn.hipGraphInstantiate || !d->fn.hipGraphLaunch ||
      !d->fn.hipGraphDestroy || !d->fn.hipGraphExecDestroy)
    return rt_status_make("hip device %s: %s lacks the graph functions graph replay needs "
                          "(hipStreamBeginCapture, hipGraphInstantiate, ...)",
                          d->name, d->file);
  return hip_check(d, d->fn.hipStreamBeginCapture((hipStream_t)s, hipStreamCaptureModeRelaxed),
                   "hipStreamBeginCapture");
}

static rt_status hip_capture_end(gpu_driver *d, gpu_stream s, gpu_graph *out_graph) {
  hipGraph_t g = NULL;
  *out_graph = NULL;
  RT_TRY(hip_check(d, d->fn.hipStreamEndCapture((hipStream_t)s, &g), "hipStreamEndCapture"));
  *out_graph = (gpu_graph)g;
  return NULL;
}

static rt_status hip_graph_count(gpu_driver *d, gpu_graph g, size_t *out_nodes, size_t *out_edges) {
  *out_nodes = *out_edges = 0;
  RT_TRY(hip_check(d, d->fn.hipGraphGetNodes((hipGraph_t)g, NULL, out_nodes), "hipGraphGetNodes"));
  return hip_check(d, d->fn.hipGraphGetEdges((hipGraph_t)g, NULL, NULL, out_edges),
                   "hipGraphGetEdges");
}

static rt_status hip_graph_instantiate(gpu_driver *d, gpu_graph g, gpu_graph_exec *out_exec) {
  hipGraphExec_t e = NULL;
  *out_exec = NULL;
  RT_TRY(hip_check(d, d->fn.hipGraphInstantiate(&e, (hipGraph_t)g, NULL, NULL, 0),
                   "hipGraphInstantiate"));
  *out_exec = (gpu_graph_exec)e;
  return NULL;
}

static rt_status hip_graph_launch(gpu_driver *d, gpu_graph_exec e, gpu_stream s) {
  return hip_check(d, d->fn.hipGraphLaunch((hipGraphExec_t)e, (hipStream_t)s), "hipGraphLaunch");
}

static void hip_graph_destroy(gpu_driver *d, gpu_graph g) { d->fn.hipGraphDestroy((hipGraph_t)g); }

static void hip_graph_exec_destroy(gpu_driver *d, gpu_graph_exec e) {
  d->fn.hipGraphExecDestroy((hipGraphExec_t)e);
}

const gpu_api gpu_hip_api = {
    .name = "hip",
    .load = hip_load,
    .init = hip_init,
    .select = hip_select,
    .unload = hip_unload,
    .make_current = hip_make_current,
    .device_info = hip_device_info,
    .peer_enable = hip_peer_enable,
    .mem_alloc = hip_mem_alloc,
    .mem_free = hip_mem_free,
    .memset_async = hip_memset_async,
    .memcpy_async = hip_memcpy_async,
    .stream_create = hip_stream_create,
    .stream_destroy = hip_stream_destroy,
    .stream_sync = hip_stream_sync,
    .stream_query = hip_stream_query,
    .stream_wait_event = hip_stream_wait_event,
    .event_create = hip_event_create,
    .event_destroy = hip_event_destroy,
    .event_record = hip_event_record,
    .event_sync = hip_event_sync,
    .event_elapsed_ms = hip_event_elapsed_ms,
    .module_load = hip_module_load,
    .module_unload = hip_module_unload,
    .function_find = hip_function_find,
    .launch = hip_launch,
    .host_task = hip_host_task,
    .capture_begin = hip_capture_begin,
    .capture_end = hip_capture_end,
    .graph_count = hip_graph_count,
    .graph_instantiate = hip_graph_instantiate,
    .graph_launch = hip_graph_launch,
    .graph_destroy = hip_graph_destroy,
    .graph_exec_destroy = hip_graph_exec_destroy,
    .host_register = hip_host_register,
    .host_unregister = hip_host_unregister,
};
