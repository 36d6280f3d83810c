/* gpu_smoke.c - the GPU backend's calls on a real GPU, through the
 * backend vtable exactly as the runtime uses it; prints PASS or FAIL per
 * check and exits 1 on any failure.
 *
 *   gpu_smoke [--backend cuda|hip] [--ordinal N] [CODE_OBJECT [KERNEL]]
 *
 * The launch checks run KERNEL (default ds4_smoke) with the kernel ABI
 * (void *const *bufs, const int32_t *step), computing
 *     out[i] = 2 * in[i] + step[0]   for i < step[1],   bufs = {in, out}.
 * For cuda a PTX version of it is built in; CODE_OBJECT (a cubin, PTX, or
 * for hip an AMDGPU code object) is loaded too, and its kernel is used
 * when it defines KERNEL. A HIP source of the same kernel, for hip:
 *     extern "C" __global__ void ds4_smoke(void *const *bufs, const int *step) {
 *       int i = blockIdx.x * blockDim.x + threadIdx.x;
 *       if (i < step[1]) ((float *)bufs[1])[i] = 2.0f * ((const float *)bufs[0])[i] + step[0];
 *     }
 * (docs/GPU.md's clang-19 recipes build it for gfx targets and sm_90.)
 *
 * Checks: device open; zeroed allocation; synchronous copies; code object
 * load; a launch (the result checked element by element); an event
 * recorded on one stream and waited on by another; a host-visible event
 * waited on by a host thread; a stream held by a host-side event of
 * another backend; pinned host memory with async copies; timestamps on
 * the host's clock; load errors and an injected launch fault reported
 * clearly. Also prints the launch and copy times it measured. */
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "gpu/gpu_backend.h"

/* ds4_smoke for any NVIDIA GPU from sm_70 on (the driver compiles it). */
static const char smoke_ptx[] =
    ".version 7.0\n"
    ".target sm_70\n"
    ".address_size 64\n"
    "\n"
    ".visible .entry ds4_smoke(\n"
    "\t.param .u64 ds4_smoke_bufs,\n"
    "\t.param .u64 ds4_smoke_step\n"
    ")\n"
    "{\n"
    "\t.reg .pred %p<2>;\n"
    "\t.reg .b32 %r<7>;\n"
    "\t.reg .f32 %f<4>;\n"
    "\t.reg .b64 %rd<12>;\n"
    "\n"
    "\tld.param.u64 %rd1, [ds4_smoke_bufs];\n"
    "\tld.param.u64 %rd2, [ds4_smoke_step];\n"
    "\tcvta.to.global.u64 %rd3, %rd1;\n"
    "\tcvta.to.global.u64 %rd4, %rd2;\n"
    "\tmov.u32 %r1, %ctaid.x;\n"
    "\tmov.u32 %r2, %ntid.x;\n"
    "\tmov.u32 %r3, %tid.x;\n"
    "\tmad.lo.s32 %r4, %r1, %r2, %r3;\n"    /* i */
    "\tld.global.u32 %r5, [%rd4+4];\n"      /* step[1] = ntok */
    "\tsetp.ge.s32 %p1, %r4, %r5;\n"
    "\t@%p1 bra DONE;\n"
    "\tld.global.u32 %r6, [%rd4];\n"        /* step[0] = pos */
    "\tld.global.u64 %rd5, [%rd3];\n"       /* bufs[0] = in */
    "\tld.global.u64 %rd6, [%rd3+8];\n"     /* bufs[1] = out */
    "\tcvta.to.global.u64 %rd7, %rd5;\n"
    "\tcvta.to.global.u64 %rd8, %rd6;\n"
    "\tmul.wide.u32 %rd9, %r4, 4;\n"
    "\tadd.s64 %rd10, %rd7, %rd9;\n"
    "\tadd.s64 %rd11, %rd8, %rd9;\n"
    "\tld.global.f32 %f1, [%rd10];\n"
    "\tcvt.rn.f32.s32 %f2, %r6;\n"
    "\tfma.rn.f32 %f3, %f1, 0f40000000, %f2;\n" /* 2 * in + pos, exact as 2 * in is */
    "\tst.global.f32 [%rd11], %f3;\n"
    "DONE:\n"
    "\tret;\n"
    "}\n";

#define N_ELEMS (1u << 24) /* 64 MiB per buffer: a kernel long enough to race */
#define BLOCK 256u
#define POS 7
#define REPEATS 20 /* launches before the record, so that a missing wait shows */

static int passed, failed;

__attribute__((format(printf, 2, 3))) static void check(int ok, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  printf("%s ", ok ? "PASS" : "FAIL");
  vprintf(fmt, ap);
  printf("\n");
  va_end(ap);
  fflush(stdout);
  if (ok)
    passed++;
  else
    failed++;
}

/* A failed call: FAIL with the backend's message; returns 1 if s failed. */
static int failed_call(rt_status s, const char *what) {
  if (!s) return 0;
  check(0, "%s: %s", what, rt_status_msg(s));
  rt_status_free(s);
  return 1;
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static double sdiff_us(uint64_t a, uint64_t b) { return ((double)a - (double)b) / 1e3; }

typedef struct host_waiter {
  rt_sync *sync;
  const _Atomic uint64_t *value;
  uint64_t target;
  int result;
  uint64_t released_ns;
} host_waiter;

static void *host_wait(void *arg) {
  host_waiter *w = arg;
  w->result = rt_sync_wait(w->sync, w->value, w->target);
  w->released_ns = now_ns();
  return NULL;
}

/* Another backend's event, as a cpu device's looks to a GPU stream. */
typedef struct foreign_event {
  rt_event_base base;
  uint64_t published_ns;
  rt_sync *sync;
} foreign_event;

static void *publish_later(void *arg) {
  foreign_event *e = arg;
  usleep(20 * 1000);
  e->published_ns = now_ns();
  atomic_store_explicit(&e->base.host_gen, 1, memory_order_release);
  rt_sync_notify(e->sync);
  return NULL;
}

static void usage(void) {
  fprintf(stderr, "usage: gpu_smoke [--backend cuda|hip] [--ordinal N] [CODE_OBJECT [KERNEL]]\n");
  exit(2);
}

typedef struct smoke {
  const rt_backend *be;
  rt_sync sync;
  rt_device *dev;
  rt_stream *a, *b;
  rt_module *builtin, *file;
  rt_kernel *kernel;
  float *in, *out, *copy;
  void **bufs;
  int32_t *step;
  float *host_in, *host_out;
} smoke;

static void check_memory(smoke *t) {
  size_t bytes = (size_t)N_ELEMS * sizeof(float);
  if (failed_call(t->be->copy_d2h(t->dev, t->host_out, t->out, bytes), "copy_d2h")) return;
  size_t nonzero = 0;
  for (size_t i = 0; i < N_ELEMS; i++) nonzero += t->host_out[i] != 0.0f;
  check(nonzero == 0, "alloc-zeroed: %zu MiB read back as zeros (%zu nonzero)", bytes >> 20,
        nonzero);

  for (size_t i = 0; i < N_ELEMS; i++)
    t->host_in[i] = (float)((i * 2654435761u) % 1000) / 8.0f - 60.0f;
  if (failed_call(t->be->copy_h2d(t->dev, t->in, t->host_in, bytes), "copy_h2d")) return;
  if (failed_call(t->be->copy_d2d(t->dev, t->copy, t->in, bytes), "copy_d2d")) return;
  if (failed_call(t->be->copy_d2h(t->dev, t->host_out, t->copy, bytes), "copy_d2h")) return;
  check(memcmp(t->host_in, t->host_out, bytes) == 0,
        "copies: %zu MiB host -> device -> device -> host unchanged", bytes >> 20);
}

static void load_code(smoke *t, const char *code_path, const char *kernel_name,
                      int kernel_named) {
  rt_status s;
  if (t->be == &rt_cuda_backend) {
    s = t->be->module_load(t->dev, "built-in ds4_smoke.ptx", smoke_ptx, strlen(smoke_ptx),
                           &t->builtin);
    if (!failed_call(s, "load built-in PTX")) {
      s = t->be->kernel_find(t->builtin, "ds4_smoke", &t->kernel);
      if (!failed_call(s, "kernel_find in the built-in PTX"))
        check(1, "load: built-in PTX compiled by the driver, ds4_smoke found");
    }
  }
  if (!code_path) return;
  s = t->be->module_load(t->dev, code_path, NULL, 0, &t->file);
  if (failed_call(s, "load CODE_OBJECT")) return;
  check(1, "load: %s", code_path);
  rt_kernel *k = NULL;
  s = t->be->kernel_find(t->file, kernel_name, &k);
  if (s && !kernel_named && t->kernel) {
    printf("note %s has no kernel %s: the launch checks use the built-in PTX\n", code_path,
           kernel_name);
    rt_status_free(s);
    return;
  }
  if (failed_call(s, "kernel_find in CODE_OBJECT")) return;
  check(1, "load: %s defines %s; the launch checks use it", code_path, kernel_name);
  t->kernel = k;
}

/* Stream a runs the kernel REPEATS times and records `done`; stream b waits
 * for it, copies out away and records a host-visible event that a host
 * thread waits for. Timestamps bracket the kernels and the copy. */
static void check_launch(smoke *t, uint32_t ntok) {
  const rt_backend *be = t->be;
  size_t bytes = (size_t)N_ELEMS * sizeof(float);
  rt_event *done = NULL, *visible = NULL;
  if (failed_call(be->event_create(t->dev, 0, &done), "event_create")) return;
  if (failed_call(be->event_create(t->dev, 1, &visible), "event_create (host-visible)")) {
    be->event_destroy(done);
    return;
  }
  int32_t step[4] = {POS, (int32_t)ntok, 1, 0};
  rt_status s = be->copy_h2d(t->dev, t->step, step, sizeof step);
  uint32_t grid = (N_ELEMS + BLOCK - 1) / BLOCK;
  host_waiter w = {.sync = &t->sync, .value = &((rt_event_base *)visible)->host_gen, .target = 1,
                   .result = 99};
  pthread_t waiter;
  int waiting = !s && pthread_create(&waiter, NULL, host_wait, &w) == 0;
  uint64_t ts[6] = {0};
  uint64_t t0 = now_ns();
  if (!s) s = be->timestamp(t->a, &ts[0]);
  uint64_t l0 = now_ns();
  for (int r = 0; r < REPEATS && !s; r++) {
    s = be->launch(t->a, t->kernel, grid, BLOCK, t->bufs, t->step);
    if (!s && r == 0) s = be->timestamp(t->a, &ts[1]);
  }
  uint64_t l1 = now_ns();
  if (!s) s = be->timestamp(t->a, &ts[2]);
  if (!s) s = be->event_record(t->a, done, 1);
  if (!s) s = be->event_wait(t->b, done, 1);
  if (!s) s = be->timestamp(t->b, &ts[3]);
  if (!s) s = be->copy_async(t->b, t->copy, t->out, bytes);
  if (!s) s = be->timestamp(t->b, &ts[4]);
  if (!s) s = be->event_record(t->b, visible, 1);
  if (!s) s = be->stream_flush(t->a);
  if (!s) s = be->stream_flush(t->b);
  if (!s) s = be->stream_sync(t->b);
  if (!s) s = be->stream_sync(t->a);
  uint64_t t1 = now_ns();
  if (s) {
    /* Release the host thread before reporting. */
    rt_sync_poison(&t->sync, rt_status_make("gpu_smoke: giving up"));
    failed_call(s, "launch sequence");
  }
  if (waiting) pthread_join(waiter, NULL);
  if (s) {
    rt_status_free(rt_sync_take(&t->sync));
    be->event_destroy(visible);
    be->event_destroy(done);
    return;
  }

  if (failed_call(be->copy_d2h(t->dev, t->host_out, t->copy, bytes), "copy_d2h")) return;
  size_t bad = 0, first_bad = 0;
  for (size_t i = 0; i < N_ELEMS; i++) {
    float want = i < ntok ? 2.0f * t->host_in[i] + (float)POS : 0.0f;
    if (t->host_out[i] != want && bad++ == 0) first_bad = i;
  }
  check(bad == 0,
        "launch: %d x grid %u x block %u: out = 2 * in + %d on %u elements, the %u past ntok "
        "untouched (%zu wrong%s)",
        REPEATS, grid, BLOCK, POS, ntok, N_ELEMS - ntok, bad, bad ? ", see below" : "");
  if (bad)
    printf("     first wrong: out[%zu] = %g, want %g (in %g)\n", first_bad,
           (double)t->host_out[first_bad], (double)(2.0f * t->host_in[first_bad] + (float)POS),
           (double)t->host_in[first_bad]);
  check(bad == 0 && ts[3] + 2000 >= ts[2],
        "cross-stream: stream b's copy started %.1f us after stream a's last kernel ended "
        "(event record on a, wait on b)",
        sdiff_us(ts[3], ts[2]));
  check(w.result == 0 && atomic_load(&((rt_event_base *)visible)->host_gen) == 1,
        "host-visible event: host thread released (rt_sync_wait -> %d), %.1f us after the "
        "copy ended",
        w.result, sdiff_us(w.released_ns, ts[4]));
  int ordered = ts[0] <= ts[1] && ts[1] <= ts[2] && ts[3] <= ts[4];
  /* The anchor places the GPU's clock on CLOCK_MONOTONIC to a few us. */
  int on_clock = ts[0] + 100000 >= t0 && ts[4] <= t1 + 100000;
  check(ordered && on_clock,
        "timestamps: in stream order, on the host clock (first %.1f us after the host's "
        "first enqueue, last %.1f us before stream_sync returned)",
        sdiff_us(ts[0], t0), sdiff_us(t1, ts[4]));
  double kernel_us = sdiff_us(ts[2], ts[1]) / (REPEATS - 1);
  double copy_us = sdiff_us(ts[4], ts[3]);
  printf("time kernel %.1f us each (%.0f GB/s read+write), copy d2d %.1f us (%.0f GB/s "
         "read+write), launch enqueue %.1f us each on the host\n",
         kernel_us, 2.0 * (double)ntok * 4 / (kernel_us * 1e3), copy_us,
         2.0 * (double)bytes / (copy_us * 1e3), sdiff_us(l1, l0) / REPEATS);
  be->event_destroy(visible);
  be->event_destroy(done);
}

/* Stream a waits for an event another backend publishes on the host (as a
 * cpu device's record does) 20 ms later. */
static void check_foreign_wait(smoke *t) {
  foreign_event e = {.base = {.be = &rt_cpu_backend}, .sync = &t->sync};
  atomic_init(&e.base.host_gen, 0);
  uint64_t stamp = 0;
  pthread_t th;
  rt_status s = t->be->event_wait(t->a, (rt_event *)&e, 1);
  if (!s) s = t->be->timestamp(t->a, &stamp);
  if (s) {
    failed_call(s, "foreign wait");
    return;
  }
  if (pthread_create(&th, NULL, publish_later, &e) != 0) {
    /* Nothing would publish: poison to release the stream. */
    rt_sync_poison(&t->sync, rt_status_make("gpu_smoke: no thread"));
    rt_status_free(t->be->stream_sync(t->a));
    rt_status_free(rt_sync_take(&t->sync));
    check(0, "foreign wait: cannot start the publishing thread");
    return;
  }
  s = t->be->stream_sync(t->a);
  pthread_join(th, NULL);
  if (failed_call(s, "foreign wait: stream_sync")) return;
  check(stamp + 100000 >= e.published_ns,
        "foreign wait: stream held until the host published the event (its next timestamp "
        "%.1f us after)",
        sdiff_us(stamp, e.published_ns));
}

/* Async copies from and to registered (pinned) host memory. */
static void check_host_register(smoke *t) {
  if (!t->be->host_register) {
    check(0, "host_register: the backend has none");
    return;
  }
  size_t n = 1u << 20, bytes = n * sizeof(float);
  float *host = malloc(bytes);
  if (!host) {
    check(0, "host_register: out of host memory");
    return;
  }
  for (size_t i = 0; i < n; i++) host[i] = (float)i;
  rt_status s = t->be->host_register(t->dev, host, bytes);
  if (failed_call(s, "host_register")) {
    free(host);
    return;
  }
  uint64_t ts[2] = {0};
  s = t->be->copy_async(t->a, t->copy, host, bytes);
  if (!s) s = t->be->timestamp(t->a, &ts[0]);
  if (!s) s = t->be->copy_async(t->a, host, t->in, bytes);
  if (!s) s = t->be->timestamp(t->a, &ts[1]);
  if (!s) s = t->be->stream_sync(t->a);
  if (!s) s = t->be->copy_d2h(t->dev, t->host_out, t->copy, bytes);
  t->be->host_unregister(t->dev, host);
  if (!failed_call(s, "pinned copies")) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += t->host_out[i] != (float)i || host[i] != t->host_in[i];
    check(bad == 0,
          "host_register: async copies to and from %zu MiB of pinned memory (d2h %.0f GB/s)",
          bytes >> 20, (double)bytes / (sdiff_us(ts[1], ts[0]) * 1e3));
  }
  free(host);
}

static void check_errors(smoke *t, uint32_t ordinal) {
  rt_module *m = NULL;
  static const char junk[] = "this is not a code object";
  rt_status s = t->be->module_load(t->dev, "junk.bin", junk, sizeof junk - 1, &m);
  check(s != NULL && m == NULL, "error: a junk code object is refused: %s", rt_status_msg(s));
  rt_status_free(s);
  if (m) t->be->module_unload(m);
  rt_kernel *k = NULL;
  rt_module *mod = t->builtin ? t->builtin : t->file;
  if (mod) {
    s = t->be->kernel_find(mod, "no_such_kernel", &k);
    check(s != NULL && k == NULL, "error: a missing kernel is named: %s", rt_status_msg(s));
    rt_status_free(s);
  }

  /* A second handle on the device with the 2nd launch failing. */
  rt_device_options o = {.name = "gpu-faulty", .ordinal = ordinal, .sync = &t->sync,
                         .fail_launch = 2};
  rt_device *d = NULL;
  rt_stream *st = NULL;
  s = t->be->device_open(&o, &d);
  if (!s) s = t->be->stream_create(d, 16, &st);
  rt_status first = NULL, second = NULL;
  if (!s && t->kernel) {
    first = t->be->launch(st, t->kernel, 1, BLOCK, t->bufs, t->step);
    second = t->be->launch(st, t->kernel, 1, BLOCK, t->bufs, t->step);
    s = t->be->stream_sync(st);
  }
  if (!failed_call(s, "fault injection") && t->kernel)
    check(first == NULL && second && strstr(rt_status_msg(second), "injected fault"),
          "error: fail_launch = 2 fails the second launch: %s", rt_status_msg(second));
  rt_status_free(first);
  rt_status_free(second);
  if (st) t->be->stream_destroy(st);
  if (d) t->be->device_close(d);
}

int main(int argc, char **argv) {
  const char *backend = "cuda", *code = NULL, *kernel = "ds4_smoke";
  int kernel_named = 0;
  uint32_t ordinal = 0;
  int pos = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--backend") == 0 && i + 1 < argc) {
      backend = argv[++i];
    } else if (strcmp(argv[i], "--ordinal") == 0 && i + 1 < argc) {
      ordinal = (uint32_t)strtoul(argv[++i], NULL, 10);
    } else if (argv[i][0] == '-') {
      usage();
    } else if (pos == 0) {
      code = argv[i];
      pos++;
    } else if (pos == 1) {
      kernel = argv[i];
      kernel_named = 1;
      pos++;
    } else {
      usage();
    }
  }
  smoke t = {0};
  if (strcmp(backend, "cuda") == 0)
    t.be = &rt_cuda_backend;
  else if (strcmp(backend, "hip") == 0)
    t.be = &rt_hip_backend;
  else
    usage();
  const char *env = getenv(t.be == &rt_cuda_backend ? "DS4_CUDA_LIBRARY" : "DS4_HIP_LIBRARY");
  printf("gpu_smoke: %s device %u%s%s%s, kernel %s\n", backend, ordinal, env ? " (library " : "",
         env ? env : "", env ? ")" : "", kernel);

  rt_status s = rt_sync_init(&t.sync);
  if (failed_call(s, "rt_sync_init")) return 1;
  rt_device_options o = {.name = "gpu0", .ordinal = ordinal, .sync = &t.sync};
  s = t.be->device_open(&o, &t.dev);
  if (failed_call(s, "open")) {
    rt_sync_destroy(&t.sync);
    printf("gpu_smoke: 0 passed, 1 failed\n");
    return 1;
  }
  check(1, "open: %s device %u", backend, ordinal);

  size_t bytes = (size_t)N_ELEMS * sizeof(float);
  t.host_in = malloc(bytes);
  t.host_out = malloc(bytes);
  s = t.host_in && t.host_out ? NULL : rt_status_make("out of host memory");
  if (!s) s = t.be->mem_alloc(t.dev, bytes, (void **)&t.in);
  if (!s) s = t.be->mem_alloc(t.dev, bytes, (void **)&t.out);
  if (!s) s = t.be->mem_alloc(t.dev, bytes, (void **)&t.copy);
  if (!s) s = t.be->mem_alloc(t.dev, 2 * sizeof(void *), (void **)&t.bufs);
  if (!s) s = t.be->mem_alloc(t.dev, 4 * sizeof(int32_t), (void **)&t.step);
  if (!s) {
    void *bufs[2] = {t.in, t.out};
    s = t.be->copy_h2d(t.dev, t.bufs, bufs, sizeof bufs);
  }
  if (!s) s = t.be->stream_create(t.dev, 64, &t.a);
  if (!s) s = t.be->stream_create(t.dev, 64, &t.b);
  if (!failed_call(s, "setup (allocations, streams)")) {
    check_memory(&t);
    load_code(&t, code, kernel, kernel_named);
    if (t.kernel) {
      check_launch(&t, N_ELEMS - 3);
    } else {
      check(0, "launch: no kernel %s to run (for hip, give a CODE_OBJECT that defines it)",
            kernel);
    }
    check_foreign_wait(&t);
    check_host_register(&t);
    check_errors(&t, ordinal);
  }

  if (t.a) t.be->stream_destroy(t.a);
  if (t.b) t.be->stream_destroy(t.b);
  if (t.builtin) t.be->module_unload(t.builtin);
  if (t.file) t.be->module_unload(t.file);
  t.be->mem_free(t.dev, t.in);
  t.be->mem_free(t.dev, t.out);
  t.be->mem_free(t.dev, t.copy);
  t.be->mem_free(t.dev, t.bufs);
  t.be->mem_free(t.dev, t.step);
  t.be->device_close(t.dev);
  rt_sync_destroy(&t.sync);
  free(t.host_in);
  free(t.host_out);
  printf("gpu_smoke: %d passed, %d failed: %s\n", passed, failed, failed ? "FAIL" : "PASS");
  return failed ? 1 : 0;
}
