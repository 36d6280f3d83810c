/* cuda_api.c - the GPU backend's driver table over the CUDA driver API
 * (libcuda.so.1, loaded with dlopen; DS4_CUDA_LIBRARY names another file).
 * Each device holds the primary context of its GPU, the one the CUDA
 * runtime would use too, and makes it current in whichever thread calls.
 * The types and constants below restate cuda.h's, so that building needs
 * no CUDA toolkit. */
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu/gpu_api.h"

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef void (*CUstreamCallback)(CUstream stream, CUresult status, void *user);
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphNode_st *CUgraphNode;
typedef struct CUgraphExec_st *CUgraphExec;

/* cuLaunchKernelEx's configuration, as cuda.h lays it out: an attribute
 * is its id, padding to 8 bytes and a 64-byte value. */
typedef struct CUlaunchAttribute {
  int id;
  char pad[4];
  union {
    char bytes[64];
    int programmatic_stream_serialization_allowed;
  } value;
} CUlaunchAttribute;

typedef struct CUlaunchConfig {
  unsigned int grid_x, grid_y, grid_z, block_x, block_y, block_z;
  unsigned int shared_bytes;
  CUstream stream;
  CUlaunchAttribute *attrs;
  unsigned int nattrs;
} CUlaunchConfig;

_Static_assert(sizeof(CUlaunchAttribute) == 72 && offsetof(CUlaunchAttribute, value) == 8,
               "CUlaunchAttribute as cuda.h lays it out");

enum {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_NOT_READY = 600,
  CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712,
  CU_STREAM_NON_BLOCKING = 1,
  CU_EVENT_DEFAULT = 0,
  CU_EVENT_DISABLE_TIMING = 2,
  CU_MEMHOSTREGISTER_PORTABLE = 1,
  CU_JIT_ERROR_LOG_BUFFER = 5,
  CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6,
  CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
  CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE = 38,
  CU_STREAM_CAPTURE_MODE_RELAXED = 2,
  CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6,
};

/* Every function used: required (1) or optional (0), the field (named as
 * in cuda.h), the exported symbol and an older symbol to fall back to. */
#define CUDA_FUNCTIONS(X)                                                                          \
  X(1, cuInit, "cuInit", NULL, (unsigned int flags))                                               \
  X(1, cuDeviceGetCount, "cuDeviceGetCount", NULL, (int *out_count))                               \
  X(1, cuDeviceGet, "cuDeviceGet", NULL, (CUdevice * out_dev, int ordinal))                        \
  X(1, cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", NULL,                                 \
    (CUcontext * out_ctx, CUdevice dev))                                                           \
  X(1, cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", NULL, (CUdevice dev))            \
  X(1, cuCtxSetCurrent, "cuCtxSetCurrent", NULL, (CUcontext ctx))                                  \
  X(1, cuGetErrorName, "cuGetErrorName", NULL, (CUresult r, const char **out_name))                \
  X(1, cuGetErrorString, "cuGetErrorString", NULL, (CUresult r, const char **out_text))            \
  X(1, cuMemAlloc, "cuMemAlloc_v2", NULL, (CUdeviceptr * out_ptr, size_t bytes))                   \
  X(1, cuMemFree, "cuMemFree_v2", NULL, (CUdeviceptr ptr))                                         \
  X(1, cuMemsetD8Async, "cuMemsetD8Async", NULL,                                                   \
    (CUdeviceptr dst, unsigned char value, size_t n, CUstream s))                                  \
  X(1, cuMemcpyAsync, "cuMemcpyAsync", NULL,                                                       \
    (CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream s))                                  \
  X(1, cuStreamCreate, "cuStreamCreate", NULL, (CUstream * out_stream, unsigned int flags))        \
  X(1, cuStreamDestroy, "cuStreamDestroy_v2", NULL, (CUstream s))                                  \
  X(1, cuStreamSynchronize, "cuStreamSynchronize", NULL, (CUstream s))                             \
  X(1, cuStreamQuery, "cuStreamQuery", NULL, (CUstream s))                                         \
  X(1, cuStreamWaitEvent, "cuStreamWaitEvent", NULL, (CUstream s, CUevent e, unsigned int flags))  \
  X(1, cuStreamAddCallback, "cuStreamAddCallback", NULL,                                           \
    (CUstream s, CUstreamCallback fn, void *user, unsigned int flags))                             \
  X(1, cuEventCreate, "cuEventCreate", NULL, (CUevent * out_event, unsigned int flags))            \
  X(1, cuEventDestroy, "cuEventDestroy_v2", NULL, (CUevent e))                                     \
  X(1, cuEventRecord, "cuEventRecord", NULL, (CUevent e, CUstream s))                              \
  X(1, cuEventSynchronize, "cuEventSynchronize", NULL, (CUevent e))                                \
  X(1, cuEventElapsedTime, "cuEventElapsedTime_v2", "cuEventElapsedTime",                          \
    (float *out_ms, CUevent from, CUevent to))                                                     \
  X(1, cuModuleLoadDataEx, "cuModuleLoadDataEx", NULL,                                             \
    (CUmodule * out_module, const void *image, unsigned int noptions, int *options,                \
     void **values))                                                                               \
  X(1, cuModuleUnload, "cuModuleUnload", NULL, (CUmodule m))                                       \
  X(1, cuModuleGetFunction, "cuModuleGetFunction", NULL,                                           \
    (CUfunction * out_function, CUmodule m, const char *name))                                     \
  X(1, cuLaunchKernel, "cuLaunchKernel", NULL,                                                     \
    (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,             \
     unsigned int by, unsigned int bz, unsigned int shared, CUstream s, void **params,             \
     void **extra))                                                                                \
  X(1, cuMemHostRegister, "cuMemHostRegister_v2", NULL,                                            \
    (void *ptr, size_t bytes, unsigned int flags))                                                 \
  X(1, cuMemHostUnregister, "cuMemHostUnregister", NULL, (void *ptr))                              \
  X(0, cuDeviceCanAccessPeer, "cuDeviceCanAccessPeer", NULL,                                       \
    (int *out_can, CUdevice dev, CUdevice peer))                                                   \
  X(0, cuDevicePrimaryCtxGetState, "cuDevicePrimaryCtxGetState", NULL,                             \
    (CUdevice dev, unsigned int *out_flags, int *out_active))                                      \
  X(0, cuCtxEnablePeerAccess, "cuCtxEnablePeerAccess", NULL, (CUcontext peer, unsigned int flags)) \
  X(0, cuDriverGetVersion, "cuDriverGetVersion", NULL, (int *out_version))                         \
  X(0, cuMemGetInfo, "cuMemGetInfo_v2", NULL, (size_t * out_free, size_t * out_total))              \
  X(0, cuDeviceGetName, "cuDeviceGetName", NULL, (char *out_name, int len, CUdevice dev))          \
  X(0, cuDeviceGetAttribute, "cuDeviceGetAttribute", NULL,                                         \
    (int *out_value, int attribute, CUdevice dev))                                                 \
  X(0, cuLaunchKernelEx, "cuLaunchKernelEx", NULL,                                                 \
    (const CUlaunchConfig *config, CUfunction f, void **params, void **extra))                     \
  X(0, cuStreamBeginCapture, "cuStreamBeginCapture_v2", NULL, (CUstream s, int mode))               \
  X(0, cuStreamEndCapture, "cuStreamEndCapture", NULL, (CUstream s, CUgraph * out_graph))          \
  X(0, cuGraphGetNodes, "cuGraphGetNodes", NULL, (CUgraph g, CUgraphNode * nodes, size_t * count))  \
  X(0, cuGraphGetEdges, "cuGraphGetEdges_v2", NULL,                                                \
    (CUgraph g, CUgraphNode * from, CUgraphNode * to, void *edge_data, size_t *count))             \
  X(0, cuGraphInstantiate, "cuGraphInstantiateWithFlags", NULL,                                    \
    (CUgraphExec * out_exec, CUgraph g, unsigned long long flags))                                 \
  X(0, cuGraphLaunch, "cuGraphLaunch", NULL, (CUgraphExec e, CUstream s))                          \
  X(0, cuGraphDestroy, "cuGraphDestroy", NULL, (CUgraph g))                                        \
  X(0, cuGraphExecDestroy, "cuGraphExecDestroy", NULL, (CUgraphExec e))

typedef struct cuda_functions {
#define CUDA_FIELD(required, field, symbol, old_symbol, params) CUresult(*field) params;
  CUDA_FUNCTIONS(CUDA_FIELD)
#undef CUDA_FIELD
} cuda_functions;

static const gpu_symbol cuda_symbols[] = {
#define CUDA_SYMBOL(required, field, symbol, old_symbol, params) \
  {symbol, old_symbol, offsetof(cuda_functions, field), required},
    CUDA_FUNCTIONS(CUDA_SYMBOL)
#undef CUDA_SYMBOL
};

static const char *const cuda_files[] = {"libcuda.so.1", NULL};
static const gpu_library cuda_library = {
    .backend = "cuda",
    .env = "DS4_CUDA_LIBRARY",
    .files = cuda_files,
    .install_hint = "install the NVIDIA driver",
};

struct gpu_driver {
  char name[64];   /* the device, for messages */
  char file[256];  /* the library loaded */
  void *lib;
  cuda_functions fn;
  CUdevice dev;
  CUcontext ctx; /* the retained primary context; NULL until select */
};

/* ---- errors ---- */

/* Names for the errors met where the driver cannot name them: inside a
 * stream callback (which must not call the driver) and in the toolkit's
 * stub library, whose cuGetErrorName fails like everything else. */
static const struct {
  CUresult code;
  const char *name, *text;
} cuda_known_errors[] = {
    {3, "CUDA_ERROR_NOT_INITIALIZED", "the driver is not initialised"},
    {34, "CUDA_ERROR_STUB_LIBRARY", "this is the CUDA toolkit's stub library, not the driver"},
    {35, "CUDA_ERROR_INSUFFICIENT_DRIVER", "the driver is older than the library"},
    {100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {700, "CUDA_ERROR_ILLEGAL_ADDRESS", "a kernel accessed an illegal address"},
    {714, "CUDA_ERROR_HARDWARE_STACK_ERROR", "a kernel overflowed its call stack"},
    {715, "CUDA_ERROR_ILLEGAL_INSTRUCTION", "a kernel executed an illegal instruction"},
    {716, "CUDA_ERROR_MISALIGNED_ADDRESS", "a kernel accessed a misaligned address"},
    {719, "CUDA_ERROR_LAUNCH_FAILED", "a kernel failed"},
    {803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", "the driver library and kernel module differ"},
    {999, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

/* may_call: 0 inside a stream callback. */
static void cuda_describe(const gpu_driver *d, CUresult r, int may_call, char *buf, size_t len) {
  const char *name = NULL, *text = NULL;
  if (may_call && d->fn.cuGetErrorName(r, &name) != CUDA_SUCCESS) name = NULL;
  if (name && d->fn.cuGetErrorString(r, &text) != CUDA_SUCCESS) text = NULL;
  for (size_t i = 0; !name && i < sizeof cuda_known_errors / sizeof *cuda_known_errors; i++) {
    if (cuda_known_errors[i].code == r) {
      name = cuda_known_errors[i].name;
      text = cuda_known_errors[i].text;
    }
  }
  if (name)
    gpu_error_text(buf, len, name, text);
  else
    snprintf(buf, len, "CUresult %d", r);
}

/* "cuda device gpu0: <call> failed: CUDA_ERROR_... (...)", or NULL. */
__attribute__((format(printf, 3, 4))) static rt_status cu_check(const gpu_driver *d, CUresult r,
                                                                const char *call_fmt, ...) {
  if (r == CUDA_SUCCESS) return NULL;
  char call[256], why[256];
  va_list ap;
  va_start(ap, call_fmt);
  vsnprintf(call, sizeof call, call_fmt, ap);
  va_end(ap);
  cuda_describe(d, r, 1, why, sizeof why);
  return rt_status_make("cuda device %s: %s failed: %s", d->name, call, why);
}

/* ---- the driver and the device ---- */

static void cuda_unload(gpu_driver *d) {
  if (!d) return;
  if (d->ctx) d->fn.cuDevicePrimaryCtxRelease(d->dev);
  if (d->lib) dlclose(d->lib);
  free(d);
}

static rt_status cuda_load(const char *device_name, gpu_driver **out_drv) {
  *out_drv = NULL;
  gpu_driver *d = calloc(1, sizeof *d);
  if (!d) return rt_status_make("cuda device %s: out of memory", device_name);
  snprintf(d->name, sizeof d->name, "%s", device_name);
  rt_status s = gpu_library_open(&cuda_library, &d->lib, d->file, sizeof d->file);
  if (!s)
    s = gpu_symbols_resolve(&cuda_library, d->lib, d->file, cuda_symbols,
                            sizeof cuda_symbols / sizeof *cuda_symbols, &d->fn);
  if (s) {
    cuda_unload(d);
    return s;
  }
  *out_drv = d;
  return NULL;
}

static rt_status cuda_init(gpu_driver *d, uint32_t *out_count) {
  *out_count = 0;
  char why[256];
  CUresult r = d->fn.cuInit(0);
  if (r != CUDA_SUCCESS) {
    cuda_describe(d, r, 1, why, sizeof why);
    return rt_status_make("cuda: no CUDA device (%s: cuInit: %s)", d->file, why);
  }
  int n = 0;
  r = d->fn.cuDeviceGetCount(&n);
  if (r != CUDA_SUCCESS) {
    cuda_describe(d, r, 1, why, sizeof why);
    return rt_status_make("cuda: no CUDA device (%s: cuDeviceGetCount: %s)", d->file, why);
  }
  if (n <= 0)
    return rt_status_make("cuda: no CUDA device (%s: cuDeviceGetCount found none)", d->file);
  *out_count = (uint32_t)n;
  return NULL;
}

static rt_status cuda_make_current(gpu_driver *d) {
  return cu_check(d, d->fn.cuCtxSetCurrent(d->ctx), "cuCtxSetCurrent");
}

static rt_status cuda_select(gpu_driver *d, uint32_t ordinal) {
  RT_TRY(cu_check(d, d->fn.cuDeviceGet(&d->dev, (int)ordinal), "cuDeviceGet(%u)", ordinal));
  CUcontext ctx = NULL;
  RT_TRY(cu_check(d, d->fn.cuDevicePrimaryCtxRetain(&ctx, d->dev), "cuDevicePrimaryCtxRetain"));
  d->ctx = ctx;
  return cuda_make_current(d);
}

/* A peer is in use when its primary context is active (another device of
 * this process holds it): retaining it then creates nothing. Each pair is
 * enabled both ways by whichever of the two opens second. Failures only
 * cost speed, so they are not reported. */
static void cuda_peer_enable(gpu_driver *d) {
  if (!d->fn.cuDeviceCanAccessPeer || !d->fn.cuDevicePrimaryCtxGetState ||
      !d->fn.cuCtxEnablePeerAccess)
    return;
  int n = 0;
  if (d->fn.cuDeviceGetCount(&n) != CUDA_SUCCESS) return;
  for (int i = 0; i < n; i++) {
    CUdevice peer;
    unsigned int flags = 0;
    int active = 0, there = 0, back = 0;
    if (d->fn.cuDeviceGet(&peer, i) != CUDA_SUCCESS || peer == d->dev) continue;
    if (d->fn.cuDevicePrimaryCtxGetState(peer, &flags, &active) != CUDA_SUCCESS || !active)
      continue;
    if (d->fn.cuDeviceCanAccessPeer(&there, d->dev, peer) != CUDA_SUCCESS) there = 0;
    if (d->fn.cuDeviceCanAccessPeer(&back, peer, d->dev) != CUDA_SUCCESS) back = 0;
    CUcontext peer_ctx = NULL;
    if ((!there && !back) || d->fn.cuDevicePrimaryCtxRetain(&peer_ctx, peer) != CUDA_SUCCESS)
      continue;
    if (there && d->fn.cuCtxSetCurrent(d->ctx) == CUDA_SUCCESS)
      d->fn.cuCtxEnablePeerAccess(peer_ctx, 0);
    if (back && d->fn.cuCtxSetCurrent(peer_ctx) == CUDA_SUCCESS)
      d->fn.cuCtxEnablePeerAccess(d->ctx, 0);
    d->fn.cuDevicePrimaryCtxRelease(peer);
  }
  d->fn.cuCtxSetCurrent(d->ctx);
}

/* Optional in the table (only reports need it), so a driver without one
 * of the functions fails here, by name, and nowhere else. */
static rt_status cuda_device_info(gpu_driver *d, gpu_device_info *out_info) {
  memset(out_info, 0, sizeof *out_info);
  if (!d->fn.cuDriverGetVersion || !d->fn.cuDeviceGetName || !d->fn.cuDeviceGetAttribute)
    return rt_status_make("cuda device %s: %s lacks cuDriverGetVersion, cuDeviceGetName or "
                          "cuDeviceGetAttribute",
                          d->name, d->file);
  RT_TRY(cu_check(d, d->fn.cuDriverGetVersion(&out_info->driver_version), "cuDriverGetVersion"));
  RT_TRY(cu_check(d, d->fn.cuDeviceGetName(out_info->name, (int)sizeof out_info->name, d->dev),
                  "cuDeviceGetName"));
  int l2 = 0, mps = 0;
  RT_TRY(cu_check(d, d->fn.cuDeviceGetAttribute(&l2, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, d->dev),
                  "cuDeviceGetAttribute(L2_CACHE_SIZE)"));
  RT_TRY(cu_check(d,
                  d->fn.cuDeviceGetAttribute(&mps, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, d->dev),
                  "cuDeviceGetAttribute(MULTIPROCESSOR_COUNT)"));
  out_info->l2_bytes = l2 > 0 ? (uint64_t)l2 : 0;
  out_info->multiprocessors = mps > 0 ? (uint32_t)mps : 0;
  return NULL;
}

/* ---- memory ---- */

static CUdeviceptr dptr(const void *p) { return (CUdeviceptr)(uintptr_t)p; }

/* More than the device has free is refused before the driver is asked, by
 * the figures the driver reports (cuMemGetInfo, where it has one): the
 * error then says what was needed and what there is. */
static rt_status cuda_mem_alloc(gpu_driver *d, size_t bytes, void **out_ptr) {
  CUdeviceptr p = 0;
  *out_ptr = NULL;
  size_t free_bytes = 0, total = 0;
  if (d->fn.cuMemGetInfo && d->fn.cuMemGetInfo(&free_bytes, &total) == CUDA_SUCCESS && bytes > free_bytes)
    return rt_status_make("cuda device %s: %zu bytes do not fit: the device has %zu bytes free of %zu "
                          "(cuMemGetInfo)",
                          d->name, bytes, free_bytes, total);
  RT_TRY(cu_check(d, d->fn.cuMemAlloc(&p, bytes), "cuMemAlloc(%zu bytes)", bytes));
  *out_ptr = (void *)(uintptr_t)p;
  return NULL;
}

static void cuda_mem_free(gpu_driver *d, void *ptr) { d->fn.cuMemFree(dptr(ptr)); }

static rt_status cuda_memset_async(gpu_driver *d, gpu_stream s, void *dst, int value,
                                   size_t bytes) {
  return cu_check(d, d->fn.cuMemsetD8Async(dptr(dst), (unsigned char)value, bytes, (CUstream)s),
                  "cuMemsetD8Async(%zu bytes)", bytes);
}

static rt_status cuda_memcpy_async(gpu_driver *d, gpu_stream s, void *dst, const void *src,
                                   size_t bytes) {
  return cu_check(d, d->fn.cuMemcpyAsync(dptr(dst), dptr(src), bytes, (CUstream)s),
                  "cuMemcpyAsync(%p <- %p, %zu bytes)", dst, src, bytes);
}

static rt_status cuda_host_register(gpu_driver *d, void *ptr, size_t bytes, int *out_owned) {
  *out_owned = 0;
  CUresult r = d->fn.cuMemHostRegister(ptr, bytes, CU_MEMHOSTREGISTER_PORTABLE);
  if (r == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED) return NULL;
  RT_TRY(cu_check(d, r, "cuMemHostRegister(%p, %zu bytes)", ptr, bytes));
  *out_owned = 1;
  return NULL;
}

static void cuda_host_unregister(gpu_driver *d, void *ptr) { d->fn.cuMemHostUnregister(ptr); }

/* ---- streams and events ---- */

static rt_status cuda_stream_create(gpu_driver *d, gpu_stream *out_stream) {
  CUstream s = NULL;
  *out_stream = NULL;
  RT_TRY(cu_check(d, d->fn.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate"));
  *out_stream = (gpu_stream)s;
  return NULL;
}

static void cuda_stream_destroy(gpu_driver *d, gpu_stream s) {
  d->fn.cuStreamDestroy((CUstream)s);
}

static rt_status cuda_stream_sync(gpu_driver *d, gpu_stream s) {
  return cu_check(d, d->fn.cuStreamSynchronize((CUstream)s), "cuStreamSynchronize");
}

static rt_status cuda_stream_query(gpu_driver *d, gpu_stream s, int *out_idle) {
  CUresult r = d->fn.cuStreamQuery((CUstream)s);
  *out_idle = r == CUDA_SUCCESS;
  return r == CUDA_ERROR_NOT_READY ? NULL : cu_check(d, r, "cuStreamQuery");
}

static rt_status cuda_stream_wait_event(gpu_driver *d, gpu_stream s, gpu_event e) {
  return cu_check(d, d->fn.cuStreamWaitEvent((CUstream)s, (CUevent)e, 0), "cuStreamWaitEvent");
}

static rt_status cuda_event_create(gpu_driver *d, int timing, gpu_event *out_event) {
  CUevent e = NULL;
  *out_event = NULL;
  RT_TRY(cu_check(d, d->fn.cuEventCreate(&e, timing ? CU_EVENT_DEFAULT : CU_EVENT_DISABLE_TIMING),
                  "cuEventCreate"));
  *out_event = (gpu_event)e;
  return NULL;
}

static void cuda_event_destroy(gpu_driver *d, gpu_event e) { d->fn.cuEventDestroy((CUevent)e); }

static rt_status cuda_event_record(gpu_driver *d, gpu_event e, gpu_stream s) {
  return cu_check(d, d->fn.cuEventRecord((CUevent)e, (CUstream)s), "cuEventRecord");
}

static rt_status cuda_event_sync(gpu_driver *d, gpu_event e) {
  return cu_check(d, d->fn.cuEventSynchronize((CUevent)e), "cuEventSynchronize");
}

static rt_status cuda_event_elapsed_ms(gpu_driver *d, gpu_event from, gpu_event to,
                                       float *out_ms) {
  *out_ms = 0;
  return cu_check(d, d->fn.cuEventElapsedTime(out_ms, (CUevent)from, (CUevent)to),
                  "cuEventElapsedTime");
}

/* cuStreamAddCallback rather than cuLaunchHostFunc: after a device fault
 * it still calls back, with the error, so the task can poison the step and
 * release the host threads that wait on it; cuLaunchHostFunc's functions
 * silently never run then. */
static void cuda_host_task_trampoline(CUstream s, CUresult r, void *user) {
  (void)s;
  gpu_host_task *t = user;
  rt_status err = NULL;
  if (r != CUDA_SUCCESS) {
    char why[256];
    cuda_describe(t->drv, r, 0, why, sizeof why);
    err = rt_status_make("cuda device %s: stream failed: %s", t->drv->name, why);
  }
  t->run(t, err);
}

static rt_status cuda_host_task(gpu_driver *d, gpu_stream s, gpu_host_task *t) {
  t->drv = d;
  return cu_check(d, d->fn.cuStreamAddCallback((CUstream)s, cuda_host_task_trampoline, t, 0),
                  "cuStreamAddCallback");
}

/* ---- code ---- */

static rt_status cuda_module_load(gpu_driver *d, const void *image, gpu_module *out_module) {
  *out_module = NULL;
  /* PTX is compiled here, and the JIT's log says why it failed. */
  char log[4096] = "";
  int options[2] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
  void *values[2] = {log, (void *)(uintptr_t)sizeof log};
  CUmodule m = NULL;
  CUresult r = d->fn.cuModuleLoadDataEx(&m, image, 2, options, values);
  if (r != CUDA_SUCCESS) {
    char why[256];
    cuda_describe(d, r, 1, why, sizeof why);
    log[sizeof log - 1] = '\0';
    size_t n = strlen(log);
    while (n && (log[n - 1] == '\n' || log[n - 1] == '\r')) log[--n] = '\0';
    return rt_status_make("cuda device %s: cuModuleLoadDataEx failed: %s%s%s", d->name, why,
                          n ? "; JIT log: " : "", log);
  }
  *out_module = (gpu_module)m;
  return NULL;
}

static void cuda_module_unload(gpu_driver *d, gpu_module m) { d->fn.cuModuleUnload((CUmodule)m); }

static rt_status cuda_function_find(gpu_driver *d, gpu_module m, const char *symbol,
                                    gpu_function *out_function) {
  CUfunction f = NULL;
  *out_function = NULL;
  RT_TRY(cu_check(d, d->fn.cuModuleGetFunction(&f, (CUmodule)m, symbol),
                  "cuModuleGetFunction(%s)", symbol));
  *out_function = (gpu_function)f;
  return NULL;
}

/* With overlap, programmatic stream serialization (sm_90 and later; a
 * driver without cuLaunchKernelEx launches plainly): the driver may
 * schedule the grid's blocks while the kernel before it on the stream
 * drains, and the kernel's griddepcontrol.wait holds them until that grid
 * has ended (sm_90, the one NVIDIA target ds4c builds for, has both). */
static rt_status cuda_launch(gpu_driver *d, gpu_stream s, gpu_function f, uint32_t grid,
                             uint32_t block, uint32_t shared_bytes, const void *const *args,
                             uint32_t nargs, int overlap) {
  /* kernelParams: one pointer to each argument's value. */
  void *params[GPU_MAX_ARGS];
  for (uint32_t i = 0; i < nargs && i < GPU_MAX_ARGS; i++) params[i] = (void *)&args[i];
  if (overlap && d->fn.cuLaunchKernelEx) {
    CUlaunchAttribute attr = {.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION};
    attr.value.programmatic_stream_serialization_allowed = 1;
    CUlaunchConfig config = {.grid_x = grid, .grid_y = 1, .grid_z = 1, .block_x = block, .block_y = 1,
                             .block_z = 1, .shared_bytes = shared_bytes, .stream = (CUstream)s,
                             .attrs = &attr, .nattrs = 1};
    return cu_check(d, d->fn.cuLaunchKernelEx(&config, (CUfunction)f, params, NULL),
                    "cuLaunchKernelEx(grid %u, block %u, programmatic stream serialization)", grid, block);
  }
  return cu_check(d,
                  d->fn.cuLaunchKernel((CUfunction)f, grid, 1, 1, block, 1, 1, shared_bytes,
                                       (CUstream)s, params, NULL),
                  "cuLaunchKernel(grid %u, block %u)", grid, block);
}

/* ---- graphs ---- */

/* Optional in the table, so that a driver without graphs still replays
 * streams: graph replay fails here, naming what is missing. */
static rt_status cuda_capture_begin(gpu_driver *d, gpu_stream s) {
  if (!d->fn.cuStreamBeginCapture || !d->fn.cuStreamEndCapture || !d->fn.cuGraphGetNodes ||
      !d->fn.cuGraphGetEdges || !d->fn.cuGraphInstantiate || !d->fn.cuGraphLaunch ||
      !d->fn.cuGraphDestroy || !d->fn.cuGraphExecDestroy)
    return rt_status_make("cuda device %s: %s lacks the graph functions graph replay needs "
                          "(cuStreamBeginCapture_v2, cuGraphGetEdges_v2, "
                          "cuGraphInstantiateWithFlags, ...: a driver for CUDA 12.3 or later)",
                          d->name, d->file);
  return cu_check(d, d->fn.cuStreamBeginCapture((CUstream)s, CU_STREAM_CAPTURE_MODE_RELAXED),
                  "cuStreamBeginCapture_v2");
}

static rt_status cuda_capture_end(gpu_driver *d, gpu_stream s, gpu_graph *out_graph) {
  CUgraph g = NULL;
  *out_graph = NULL;
  RT_TRY(cu_check(d, d->fn.cuStreamEndCapture((CUstream)s, &g), "cuStreamEndCapture"));
  *out_graph = (gpu_graph)g;
  return NULL;
}

static rt_status cuda_graph_count(gpu_driver *d, gpu_graph g, size_t *out_nodes, size_t *out_edges) {
  *out_nodes = *out_edges = 0;
  RT_TRY(cu_check(d, d->fn.cuGraphGetNodes((CUgraph)g, NULL, out_nodes), "cuGraphGetNodes"));
  return cu_check(d, d->fn.cuGraphGetEdges((CUgraph)g, NULL, NULL, NULL, out_edges),
                  "cuGraphGetEdges_v2");
}

static rt_status cuda_graph_instantiate(gpu_driver *d, gpu_graph g, gpu_graph_exec *out_exec) {
  CUgraphExec e = NULL;
  *out_exec = NULL;
  RT_TRY(cu_check(d, d->fn.cuGraphInstantiate(&e, (CUgraph)g, 0), "cuGraphInstantiateWithFlags"));
  *out_exec = (gpu_graph_exec)e;
  return NULL;
}

static rt_status cuda_graph_launch(gpu_driver *d, gpu_graph_exec e, gpu_stream s) {
  return cu_check(d, d->fn.cuGraphLaunch((CUgraphExec)e, (CUstream)s), "cuGraphLaunch");
}

static void cuda_graph_destroy(gpu_driver *d, gpu_graph g) { d->fn.cuGraphDestroy((CUgraph)g); }

static void cuda_graph_exec_destroy(gpu_driver *d, gpu_graph_exec e) {
  d->fn.cuGraphExecDestroy((CUgraphExec)e);
}

const gpu_api gpu_cuda_api = {
    .name = "cuda",
    .load = cuda_load,
    .init = cuda_init,
    .select = cuda_select,
    .unload = cuda_unload,
    .make_current = cuda_make_current,
    .device_info = cuda_device_info,
    .peer_enable = cuda_peer_enable,
    .mem_alloc = cuda_mem_alloc,
    .mem_free = cuda_mem_free,
    .memset_async = cuda_memset_async,
    .memcpy_async = cuda_memcpy_async,
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .stream_sync = cuda_stream_sync,
    .stream_query = cuda_stream_query,
    .stream_wait_event = cuda_stream_wait_event,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .event_sync = cuda_event_sync,
    .event_elapsed_ms = cuda_event_elapsed_ms,
    .module_load = cuda_module_load,
    .module_unload = cuda_module_unload,
    .function_find = cuda_function_find,
    .launch = cuda_launch,
    .host_task = cuda_host_task,
    .capture_begin = cuda_capture_begin,
    .capture_end = cuda_capture_end,
    .graph_count = cuda_graph_count,
    .graph_instantiate = cuda_graph_instantiate,
    .graph_launch = cuda_graph_launch,
    .graph_destroy = cuda_graph_destroy,
    .graph_exec_destroy = cuda_graph_exec_destroy,
    .host_register = cuda_host_register,
    .host_unregister = cuda_host_unregister,
};
