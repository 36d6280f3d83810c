/* gpu_api.h - the driver calls the GPU backend (gpu_backend.c) is written
 * against: one table per vendor, filled by cuda_api.c from the CUDA driver
 * (libcuda.so.1) and by hip_api.c from the HIP runtime (libamdhip64.so),
 * both through dlopen/dlsym so that no binary links a vendor library. Every
 * call that fails returns a status naming the backend, the device, the
 * driver call and the driver's error, e.g. "cuda device gpu0:
 * cuModuleLoadData failed: CUDA_ERROR_INVALID_IMAGE (device kernel image is
 * invalid)". */
#ifndef DS4_GPU_API_H
#define DS4_GPU_API_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

/* The driver's handles (CUstream, hipStream_t, ...), opaque here. */
typedef struct gpu_stream_s *gpu_stream;
typedef struct gpu_event_s *gpu_event;
typedef struct gpu_module_s *gpu_module;
typedef struct gpu_function_s *gpu_function;
typedef struct gpu_graph_s *gpu_graph;
typedef struct gpu_graph_exec_s *gpu_graph_exec;

/* One device's hold on the driver: the library, its function table, the
 * device and (CUDA) its primary context. Each API defines it. */
typedef struct gpu_driver gpu_driver;

#define GPU_MAX_ARGS 8

/* What a report says about the device (device_info). */
typedef struct gpu_device_info {
  char name[256];          /* "NVIDIA H200" */
  int driver_version;      /* CUDA: 1000 * major + 10 * minor; HIP: its own number */
  uint64_t l2_bytes;       /* 0: the API does not say */
  uint32_t multiprocessors; /* 0: the API does not say */
} gpu_device_info;

/* Host work in stream order: the driver runs `run` on a thread of its own
 * once everything enqueued before it on the stream has run. err is NULL, or
 * (ownership passes) the failure of earlier work on the stream; the task
 * then only releases whoever waits on it. run must not call the driver. */
typedef struct gpu_host_task gpu_host_task;
struct gpu_host_task {
  void (*run)(gpu_host_task *t, rt_status err);
  gpu_driver *drv; /* set by host_task, for the error's message */
};

typedef struct gpu_api {
  const char *name; /* "cuda" or "hip", as in messages */

  /* Load the library and resolve its functions (no driver call yet). */
  rt_status (*load)(const char *device_name, gpu_driver **out_drv);
  /* Initialise the driver and count its devices; none is an error. */
  rt_status (*init)(gpu_driver *drv, uint32_t *out_count);
  /* Take device `ordinal` (< the count) and make it current here. */
  rt_status (*select)(gpu_driver *drv, uint32_t ordinal);
  /* Give back what load and select took; drv may be half set up. */
  void (*unload)(gpu_driver *drv);
  /* Make the device current in the calling thread: CUDA binds the context
   * per thread, and a device's calls come from several threads (the
   * opener, its submitter, whoever synchronises). */
  rt_status (*make_current)(gpu_driver *drv);
  /* The selected device's name, the driver's version and the sizes a
   * benchmark needs, for reports. */
  rt_status (*device_info)(gpu_driver *drv, gpu_device_info *out_info);
  /* Let the device and every peer already in use in this process reach
   * each other's memory directly. Best effort: copies between devices work
   * without it, staged through the host. */
  void (*peer_enable)(gpu_driver *drv);

  rt_status (*mem_alloc)(gpu_driver *drv, size_t bytes, void **out_ptr);
  void (*mem_free)(gpu_driver *drv, void *ptr);
  rt_status (*memset_async)(gpu_driver *drv, gpu_stream s, void *dst, int value, size_t bytes);
  /* dst and src: this device's memory, a peer's, or registered host
   * memory; the driver tells them apart by address (unified addressing). */
  rt_status (*memcpy_async)(gpu_driver *drv, gpu_stream s, void *dst, const void *src,
                            size_t bytes);

  /* Non-blocking streams: they never wait for the legacy default stream. */
  rt_status (*stream_create)(gpu_driver *drv, gpu_stream *out_stream);
  void (*stream_destroy)(gpu_driver *drv, gpu_stream s);
  rt_status (*stream_sync)(gpu_driver *drv, gpu_stream s);
  /* Without blocking: *out_idle is 1 when everything enqueued on s has
   * run, 0 while some of it has not (not an error). */
  rt_status (*stream_query)(gpu_driver *drv, gpu_stream s, int *out_idle);
  rt_status (*stream_wait_event)(gpu_driver *drv, gpu_stream s, gpu_event e);

  /* timing: the event can be measured with event_elapsed_ms (slower to
   * record and wait on, so only timestamps ask for it). */
  rt_status (*event_create)(gpu_driver *drv, int timing, gpu_event *out_event);
  void (*event_destroy)(gpu_driver *drv, gpu_event e);
  rt_status (*event_record)(gpu_driver *drv, gpu_event e, gpu_stream s);
  rt_status (*event_sync)(gpu_driver *drv, gpu_event e);
  /* to - from, both recorded and reached; negative when `to` came first. */
  rt_status (*event_elapsed_ms)(gpu_driver *drv, gpu_event from, gpu_event to, float *out_ms);

  /* image: a code object (ELF) or NUL-terminated PTX. */
  rt_status (*module_load)(gpu_driver *drv, const void *image, gpu_module *out_module);
  void (*module_unload)(gpu_driver *drv, gpu_module m);
  rt_status (*function_find)(gpu_driver *drv, gpu_module m, const char *symbol,
                             gpu_function *out_function);
  /* grid x 1 x 1 blocks of block x 1 x 1 threads. The kernel's arguments
   * are nargs (at most GPU_MAX_ARGS) pointers, args[i] the i-th: the kernel
   * ABI passes only pointers (bufs, step). overlap: the kernel waits for
   * the grids before it (rt_device_options.overlap_launches), so the
   * launch may begin before the one before it on s has ended. */
  rt_status (*launch)(gpu_driver *drv, gpu_stream s, gpu_function f, uint32_t grid, uint32_t block,
                      uint32_t shared_bytes, const void *const *args, uint32_t nargs, int overlap);
  /* t must stay valid until it has run. */
  rt_status (*host_task)(gpu_driver *drv, gpu_stream s, gpu_host_task *t);

  /* Graphs, by stream capture (relaxed: other threads' driver calls are
   * not restricted). Between capture_begin on s and capture_end, what is
   * enqueued on s, and on every stream that waits on an event recorded on
   * a capturing stream, goes into a graph instead of running, an event
   * wait becoming a dependency; by capture_end every such stream must
   * have been joined back into s (s waits on an event recorded after its
   * last work). graph_count gives the graph's nodes and dependencies. */
  rt_status (*capture_begin)(gpu_driver *drv, gpu_stream s);
  rt_status (*capture_end)(gpu_driver *drv, gpu_stream s, gpu_graph *out_graph);
  rt_status (*graph_count)(gpu_driver *drv, gpu_graph g, size_t *out_nodes, size_t *out_edges);
  rt_status (*graph_instantiate)(gpu_driver *drv, gpu_graph g, gpu_graph_exec *out_exec);
  rt_status (*graph_launch)(gpu_driver *drv, gpu_graph_exec e, gpu_stream s);
  void (*graph_destroy)(gpu_driver *drv, gpu_graph g);
  void (*graph_exec_destroy)(gpu_driver *drv, gpu_graph_exec e);

  /* Pin host memory for every device of the backend (portable). When the
   * range is already registered, by another device of this backend,
   * *out_owned is 0 and nothing is to be undone. */
  rt_status (*host_register)(gpu_driver *drv, void *ptr, size_t bytes, int *out_owned);
  void (*host_unregister)(gpu_driver *drv, void *ptr);
} gpu_api;

extern const gpu_api gpu_cuda_api;
extern const gpu_api gpu_hip_api;

/* ---- loading, shared by the two APIs (gpu_api.c) ---- */

typedef struct gpu_library {
  const char *backend;      /* "cuda" */
  const char *env;          /* overrides the file names: "DS4_CUDA_LIBRARY" */
  const char *const *files; /* tried in order, NULL-terminated */
  const char *install_hint; /* "install the NVIDIA driver" */
} gpu_library;

/* One function of the table: its offset in the API's struct of function
 * pointers, its exported name and, when drivers renamed it, the older name
 * to fall back to. A missing optional function leaves its pointer NULL. */
typedef struct gpu_symbol {
  const char *name;
  const char *old_name;
  size_t offset;
  int required;
} gpu_symbol;

/* dlopen the library (RTLD_NODELETE: a driver that has started threads
 * cannot be unloaded, so dlclose only drops the reference). out_file
 * (out_len bytes) receives the file that was loaded, for messages. */
rt_status gpu_library_open(const gpu_library *lib, void **out_handle, char *out_file,
                           size_t out_len);
/* Fill table from syms, or name the first required function missing. */
rt_status gpu_symbols_resolve(const gpu_library *lib, void *handle, const char *file,
                              const gpu_symbol *syms, size_t nsyms, void *table);
/* "NAME (description)", or "NAME" where the driver's description only
 * repeats the name (HIP's often does). */
void gpu_error_text(char *buf, size_t len, const char *name, const char *description);

#endif
