/* test_gpu_backend.c - the cuda and hip backends without a GPU: every way
 * of failing to open one (no library, a wrong library, no device) says so
 * clearly and leaks nothing; and the whole vtable, run over a host stand-in
 * for libcuda.so.1 (tests/gpu/fake_cuda.c): memory, copies, streams,
 * events across streams, devices and backends, code objects, launches from
 * other threads, timestamps, host registration, injected and device
 * faults, the faults of rt_fault at the vtable boundary, the watchdog's
 * polled synchronisation and stream state, and graph capture. */
#include <check.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "gpu/gpu_backend.h"
#include "test_util.h"

/* The stand-in's PTX: the fake "compiles" text with a .version directive
 * and knows the kernels by their .entry lines. No NUL at the end, as in a
 * code object file: the backend must add one. */
static const char fake_ptx[] =
    ".version 8.0\n.target sm_90\n.address_size 64\n"
    ".visible .entry ds4_smoke(.param .u64 a, .param .u64 b)\n{ ret; }\n"
    ".visible .entry fake_fault(.param .u64 a, .param .u64 b)\n{ ret; }\n"
    ".visible .entry fake_hang(.param .u64 a, .param .u64 b)\n{ ret; }\n";

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void expect_contains(rt_status s, const char *want) {
  ck_assert_msg(s != NULL, "expected an error containing \"%s\"", want);
  ck_assert_msg(strstr(rt_status_msg(s), want) != NULL, "\"%s\" does not contain \"%s\"",
                rt_status_msg(s), want);
}

static rt_status open_dev(const rt_backend *be, rt_sync *sync, const char *name, uint32_t ordinal,
                          uint64_t fail_launch, rt_device **out) {
  rt_device_options o = {.name = name, .ordinal = ordinal, .threads = 1, .sync = sync,
                         .fail_launch = fail_launch};
  return be->device_open(&o, out);
}

/* Opening must fail with every one of the wanted pieces in the message. */
static void expect_open_fails(const rt_backend *be, const char *want1, const char *want2) {
  rt_sync sync;
  ck_assert_ptr_null(rt_sync_init(&sync));
  rt_device *d = (rt_device *)&sync; /* must be reset to NULL */
  rt_status s = open_dev(be, &sync, "gpu0", 0, 0, &d);
  ck_assert_ptr_null(d);
  expect_contains(s, want1);
  if (want2) expect_contains(s, want2);
  rt_status_free(s);
  rt_sync_destroy(&sync);
}

static int loadable(const char *file) {
  void *h = dlopen(file, RTLD_NOW | RTLD_LOCAL);
  if (h) dlclose(h);
  return h != NULL;
}

/* ---- opening without a GPU ---- */

START_TEST(lookup_names_both) {
  const rt_backend *be;
  ck_assert_ptr_null(rt_backend_lookup(PLAN_BACKEND_CUDA, &be));
  ck_assert_ptr_eq(be, &rt_cuda_backend);
  ck_assert_str_eq(be->name, "cuda");
  ck_assert_ptr_nonnull(be->host_register);
  ck_assert_ptr_null(rt_backend_lookup(PLAN_BACKEND_HIP, &be));
  ck_assert_ptr_eq(be, &rt_hip_backend);
  ck_assert_str_eq(be->name, "hip");
}
END_TEST

START_TEST(open_needs_sync) {
  rt_device *d;
  rt_status s = open_dev(&rt_cuda_backend, NULL, "gpu0", 0, 0, &d);
  expect_contains(s, "cuda device open: no rt_sync given");
  ck_assert_ptr_null(d);
  rt_status_free(s);
}
END_TEST

START_TEST(cuda_without_driver) {
  unsetenv("DS4_CUDA_LIBRARY");
  if (loadable("libcuda.so.1")) {
    /* A driver is installed: then only a missing GPU may stop the open. */
    rt_sync sync;
    ck_assert_ptr_null(rt_sync_init(&sync));
    rt_device *d;
    rt_status s = open_dev(&rt_cuda_backend, &sync, "gpu0", 0, 0, &d);
    if (s) expect_contains(s, "cuda: no CUDA device (");
    rt_status_free(s);
    rt_cuda_backend.device_close(d);
    rt_sync_destroy(&sync);
    return;
  }
  expect_open_fails(&rt_cuda_backend, "cuda: cannot load libcuda.so.1 (",
                    "): install the NVIDIA driver, or set DS4_CUDA_LIBRARY");
  /* An empty override means none. */
  setenv("DS4_CUDA_LIBRARY", "", 1);
  expect_open_fails(&rt_cuda_backend, "cuda: cannot load libcuda.so.1 (", NULL);
  unsetenv("DS4_CUDA_LIBRARY");
}
END_TEST

START_TEST(hip_override_missing) {
  setenv("DS4_HIP_LIBRARY", "/nonexistent/libamdhip64.so", 1);
  expect_open_fails(&rt_hip_backend, "hip: cannot load /nonexistent/libamdhip64.so (",
                    "named by DS4_HIP_LIBRARY");
  unsetenv("DS4_HIP_LIBRARY");
}
END_TEST

/* ROCm without a GPU (Debian's libamdhip64 5.2 here): hipInit answers
 * hipErrorInvalidDevice and hipGetDeviceCount hipErrorNoDevice. Twice, so
 * that a second load of the runtime is exercised too. */
START_TEST(hip_without_gpu) {
  unsetenv("DS4_HIP_LIBRARY");
  int have = loadable("libamdhip64.so") || loadable("libamdhip64.so.6") ||
             loadable("libamdhip64.so.5");
  for (int round = 0; round < 2; round++) {
    if (!have) {
      expect_open_fails(&rt_hip_backend, "hip: cannot load libamdhip64.so (",
                        "install ROCm's HIP runtime, or set DS4_HIP_LIBRARY");
      continue;
    }
    rt_sync sync;
    ck_assert_ptr_null(rt_sync_init(&sync));
    rt_device *d;
    rt_status s = open_dev(&rt_hip_backend, &sync, "gpu0", 0, 0, &d);
    if (s) {
      expect_contains(s, "hip: no HIP device (");
      expect_contains(s, "hipGetDeviceCount: hipErrorNoDevice");
      ck_assert_ptr_null(d);
    } else {
      rt_hip_backend.device_close(d);
    }
    rt_status_free(s);
    rt_sync_destroy(&sync);
  }
}
END_TEST

START_TEST(library_lacks_symbol) {
  setenv("DS4_CUDA_LIBRARY", "libm.so.6", 1);
  expect_open_fails(&rt_cuda_backend, "cuda: libm.so.6 has no function cuInit",
                    "set DS4_CUDA_LIBRARY to the right library");
  unsetenv("DS4_CUDA_LIBRARY");
  setenv("DS4_HIP_LIBRARY", "libm.so.6", 1);
  expect_open_fails(&rt_hip_backend, "hip: libm.so.6 has no function hipInit", NULL);
  unsetenv("DS4_HIP_LIBRARY");
}
END_TEST

/* The CUDA toolkit's stub library exports everything and fails every
 * call, its error names included: the backend names the error itself. */
START_TEST(cuda_stub_library) {
  const char *stub = "/usr/local/cuda/lib64/stubs/libcuda.so";
  if (access(stub, R_OK) != 0) return;
  setenv("DS4_CUDA_LIBRARY", stub, 1);
  expect_open_fails(&rt_cuda_backend, "cuda: no CUDA device (",
                    "cuInit: CUDA_ERROR_STUB_LIBRARY (this is the CUDA toolkit's stub library");
  unsetenv("DS4_CUDA_LIBRARY");
}
END_TEST

/* ---- the vtable over the stand-in driver ---- */


static int fake_registered(void) {
  void *h = dlopen(getenv("DS4_CUDA_LIBRARY"), RTLD_NOW | RTLD_NOLOAD);
  ck_assert_ptr_nonnull(h);
  int (*count)(void) = (int (*)(void))dlsym(h, "fake_cuda_registered_count");
  ck_assert_ptr_nonnull(count);
  int n = count();
  dlclose(h);
  return n;
}

/* One fake device with a module, two streams and the sync. */
typedef struct fx {
  const rt_backend *be;
  rt_sync sync;
  rt_device *d;
  rt_module *m;
  rt_kernel *smoke, *fault, *hang;
  rt_stream *a, *b;
} fx;

/* With fault (may be NULL), through rt_fault_device_open as a bundle
 * opens its devices. */
static void fx_open_with(fx *f, uint64_t fail_launch, uint32_t watchdog_ms, const rt_fault *fault) {
  tu_use_fake_cuda(1);
  ck_assert_ptr_null(rt_sync_init(&f->sync));
  rt_device_options o = {.name = "gpu0", .threads = 1, .sync = &f->sync,
                         .fail_launch = fail_launch, .watchdog_ms = watchdog_ms};
  rt_status s = rt_fault_device_open(&rt_cuda_backend, fault, &o, &f->be, &f->d);
  ck_assert_msg(s == NULL, "%s", rt_status_msg(s));
  s = f->be->module_load(f->d, "fake.ptx", fake_ptx, sizeof fake_ptx - 1, &f->m);
  ck_assert_msg(s == NULL, "%s", rt_status_msg(s));
  ck_assert_ptr_null(f->be->kernel_find(f->m, "ds4_smoke", &f->smoke));
  ck_assert_ptr_null(f->be->kernel_find(f->m, "fake_fault", &f->fault));
  ck_assert_ptr_null(f->be->kernel_find(f->m, "fake_hang", &f->hang));
  ck_assert_ptr_null(f->be->stream_create(f->d, 64, &f->a));
  ck_assert_ptr_null(f->be->stream_create(f->d, 64, &f->b));
}

static void fx_open(fx *f, uint64_t fail_launch) {
  fx_open_with(f, fail_launch, 0, NULL);
  ck_assert_ptr_eq(f->be, &rt_cuda_backend);
}

static void fx_close(fx *f) {
  f->be->stream_destroy(f->a);
  f->be->stream_destroy(f->b);
  f->be->module_unload(f->m);
  f->be->device_close(f->d);
  rt_sync_destroy(&f->sync);
}

/* Device buffers for ds4_smoke: bufs = {in, out}, step = {pos, ntok, 0, 0}. */
typedef struct smoke_args {
  float *in, *out;
  void **bufs;
  int32_t *step;
} smoke_args;

static void smoke_args_make(fx *f, smoke_args *a, const float *in, int n, int32_t pos) {
  ck_assert_ptr_null(f->be->mem_alloc(f->d, (size_t)n * sizeof(float), (void **)&a->in));
  ck_assert_ptr_null(f->be->mem_alloc(f->d, (size_t)n * sizeof(float), (void **)&a->out));
  ck_assert_ptr_null(f->be->mem_alloc(f->d, 2 * sizeof(void *), (void **)&a->bufs));
  ck_assert_ptr_null(f->be->mem_alloc(f->d, 4 * sizeof(int32_t), (void **)&a->step));
  void *bufs[2] = {a->in, a->out};
  int32_t step[4] = {pos, n, 0, 0};
  ck_assert_ptr_null(f->be->copy_h2d(f->d, a->in, in, (size_t)n * sizeof(float)));
  ck_assert_ptr_null(f->be->copy_h2d(f->d, a->bufs, bufs, sizeof bufs));
  ck_assert_ptr_null(f->be->copy_h2d(f->d, a->step, step, sizeof step));
}

static void smoke_args_free(fx *f, smoke_args *a) {
  f->be->mem_free(f->d, a->in);
  f->be->mem_free(f->d, a->out);
  f->be->mem_free(f->d, a->bufs);
  f->be->mem_free(f->d, a->step);
}

START_TEST(fake_no_device) {
  tu_use_fake_cuda(0);
  expect_open_fails(&rt_cuda_backend, "cuda: no CUDA device (",
                    "cuInit: CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected))");
}
END_TEST

START_TEST(fake_ordinal_out_of_range) {
  tu_use_fake_cuda(2);
  rt_sync sync;
  ck_assert_ptr_null(rt_sync_init(&sync));
  rt_device *d;
  rt_status s = open_dev(&rt_cuda_backend, &sync, "gpu2", 2, 0, &d);
  expect_contains(s, "cuda device gpu2: ordinal 2 does not exist (the cuda driver sees 2 devices)");
  ck_assert_ptr_null(d);
  rt_status_free(s);
  rt_sync_destroy(&sync);
}
END_TEST

/* Memory comes zeroed (the fake fills new memory with 0xab), and the three
 * synchronous copies move bytes both ways. */
START_TEST(fake_memory_and_copies) {
  fx f;
  fx_open(&f, 0);
  uint8_t *p, *q, *z;
  ck_assert_ptr_null(f.be->mem_alloc(f.d, 1000, (void **)&p));
  ck_assert_ptr_null(f.be->mem_alloc(f.d, 1000, (void **)&q));
  ck_assert_ptr_null(f.be->mem_alloc(f.d, 0, (void **)&z));
  ck_assert_ptr_nonnull(z);
  ck_assert_uint_eq((uintptr_t)p % 64, 0);
  uint8_t host[1000], back[1000];
  ck_assert_ptr_null(f.be->copy_d2h(f.d, back, p, sizeof back));
  for (int i = 0; i < 1000; i++) ck_assert_uint_eq(back[i], 0);
  for (int i = 0; i < 1000; i++) host[i] = (uint8_t)(i * 7 + 1);
  ck_assert_ptr_null(f.be->copy_h2d(f.d, p, host, sizeof host));
  ck_assert_ptr_null(f.be->copy_d2d(f.d, q, p, sizeof host));
  ck_assert_ptr_null(f.be->copy_d2h(f.d, back, q, sizeof back));
  ck_assert_int_eq(memcmp(host, back, sizeof host), 0);
  ck_assert_ptr_null(f.be->copy_h2d(f.d, p, host, 0));
  f.be->mem_free(f.d, p);
  f.be->mem_free(f.d, q);
  f.be->mem_free(f.d, z);
  f.be->mem_free(f.d, NULL);
  fx_close(&f);
}
END_TEST

/* An allocation larger than the device has free is refused with both
 * figures, before the driver is asked (cuMemGetInfo_v2). */
START_TEST(fake_memory_too_small) {
  setenv("DS4_FAKE_CUDA_MEMORY", "1048576", 1);
  fx f;
  fx_open(&f, 0);
  void *p = NULL;
  rt_status s = f.be->mem_alloc(f.d, 2 << 20, &p);
  ck_assert_ptr_nonnull(s);
  ck_assert_str_eq(rt_status_msg(s), "cuda device gpu0: 2097152 bytes do not fit: the device has 1048576 "
                                     "bytes free of 1048576 (cuMemGetInfo)");
  ck_assert_ptr_null(p);
  rt_status_free(s);
  ck_assert_ptr_null(f.be->mem_alloc(f.d, 1 << 20, &p));
  f.be->mem_free(f.d, p);
  fx_close(&f);
  unsetenv("DS4_FAKE_CUDA_MEMORY");
}
END_TEST

typedef struct enqueue_job {
  fx *f;
  smoke_args *args;
  rt_event *done;
  rt_status status;
} enqueue_job;

/* A submitter thread that never opened the device: the backend must make
 * the context current there itself. */
static void *enqueue_launch(void *arg) {
  enqueue_job *j = arg;
  j->status = j->f->be->launch(j->f->a, j->f->smoke, 2, 4, j->args->bufs, j->args->step);
  if (!j->status) j->status = j->f->be->event_record(j->f->a, j->done, 1);
  return NULL;
}

/* Stream a computes out on another thread and records an event; stream b
 * waits for it and copies out away. */
START_TEST(fake_launch_and_cross_stream_wait) {
  fx f;
  fx_open(&f, 0);
  float in[7], got[7];
  for (int i = 0; i < 7; i++) in[i] = (float)i - 2.5f;
  smoke_args a;
  smoke_args_make(&f, &a, in, 7, 10);
  float *copy;
  ck_assert_ptr_null(f.be->mem_alloc(f.d, sizeof got, (void **)&copy));
  rt_event *done;
  ck_assert_ptr_null(f.be->event_create(f.d, 0, &done));

  enqueue_job j = {.f = &f, .args = &a, .done = done};
  pthread_t t;
  ck_assert_int_eq(pthread_create(&t, NULL, enqueue_launch, &j), 0);
  pthread_join(t, NULL);
  ck_assert_msg(j.status == NULL, "%s", rt_status_msg(j.status));
  ck_assert_ptr_null(f.be->event_wait(f.b, done, 1));
  ck_assert_ptr_null(f.be->copy_async(f.b, copy, a.out, sizeof got));
  ck_assert_ptr_null(f.be->stream_flush(f.b));
  ck_assert_ptr_null(f.be->stream_sync(f.b));
  ck_assert_ptr_null(f.be->copy_d2h(f.d, got, copy, sizeof got));
  for (int i = 0; i < 7; i++) ck_assert_float_eq(got[i], 2.0f * in[i] + 10.0f);
  ck_assert_ptr_null(f.be->stream_sync(f.a));
  /* Not host-visible: the counter is left alone. */
  ck_assert_uint_eq(atomic_load(&((rt_event_base *)done)->host_gen), 0);

  f.be->event_destroy(done);
  f.be->mem_free(f.d, copy);
  smoke_args_free(&f, &a);
  fx_close(&f);
}
END_TEST

typedef struct host_waiter {
  rt_sync *sync;
  const _Atomic uint64_t *value;
  uint64_t target;
  int result;
} host_waiter;

static void *host_wait(void *arg) {
  host_waiter *w = arg;
  w->result = rt_sync_wait(w->sync, w->value, w->target);
  return NULL;
}

/* A host-visible record publishes its generation to host_gen once it has
 * run, waking a host thread that sleeps on the rt_sync. */
START_TEST(fake_host_visible_record) {
  fx f;
  fx_open(&f, 0);
  rt_event *e;
  ck_assert_ptr_null(f.be->event_create(f.d, 1, &e));
  rt_event_base *base = (rt_event_base *)e;
  ck_assert_ptr_eq(base->be, &rt_cuda_backend);
  host_waiter w = {.sync = &f.sync, .value = &base->host_gen, .target = 5, .result = 99};
  pthread_t t;
  ck_assert_int_eq(pthread_create(&t, NULL, host_wait, &w), 0);
  for (uint64_t gen = 4; gen <= 5; gen++) ck_assert_ptr_null(f.be->event_record(f.a, e, gen));
  pthread_join(t, NULL);
  ck_assert_int_eq(w.result, 0);
  ck_assert_ptr_null(f.be->stream_sync(f.a));
  ck_assert_uint_eq(atomic_load(&base->host_gen), 5);
  /* More records than one chunk of host-task slots, over two steps. */
  for (int step = 0; step < 2; step++) {
    for (uint64_t gen = 1; gen <= 150; gen++)
      ck_assert_ptr_null(f.be->event_record(f.a, e, 100 * (uint64_t)step + gen));
    ck_assert_ptr_null(f.be->stream_sync(f.a));
    ck_assert_uint_eq(atomic_load(&base->host_gen), 100 * (uint64_t)step + 150);
  }
  f.be->event_destroy(e);
  fx_close(&f);
}
END_TEST

/* Another backend's event, as a cpu device's looks: the header only. */
typedef struct foreign_event {
  rt_event_base base;
} foreign_event;

/* Publishes gen once the test has said `go`, after writing `written` to
 * the host word `value`: what the test did before saying so happened
 * before the record, whatever the machine's load. */
typedef struct late_record {
  foreign_event *e;
  rt_sync *sync;
  uint64_t gen;
  int32_t *value, written;
  atomic_int go;
} late_record;

static void *record_later(void *arg) {
  late_record *r = arg;
  while (!atomic_load(&r->go)) usleep(1000);
  *r->value = r->written;
  atomic_store_explicit(&r->e->base.host_gen, r->gen, memory_order_release);
  rt_sync_notify(r->sync);
  return NULL;
}

/* A stream waits for a cpu event through a host task: what follows the
 * wait runs only after the cpu side has published. Shown by cause, not by
 * clocks (a timestamp is placed against the host's clock only to within
 * half the anchor's window): a copy after the wait reads the word the cpu
 * side wrote before publishing; one on the other stream, which does not
 * wait, has run (and read the old word) before the cpu side may publish. */
START_TEST(fake_foreign_wait) {
  fx f;
  fx_open(&f, 0);
  foreign_event e = {.base = {.be = &rt_cpu_backend}};
  atomic_init(&e.base.host_gen, 0);
  int32_t *after, *before, got_after = 0, got_before = -1;
  ck_assert_ptr_null(f.be->mem_alloc(f.d, sizeof *after, (void **)&after));
  ck_assert_ptr_null(f.be->mem_alloc(f.d, sizeof *before, (void **)&before));
  static int32_t host_word;
  host_word = 0;
  late_record r = {.e = &e, .sync = &f.sync, .gen = 3, .value = &host_word, .written = 42};
  atomic_init(&r.go, 0);
  pthread_t t;
  ck_assert_int_eq(pthread_create(&t, NULL, record_later, &r), 0);
  ck_assert_ptr_null(f.be->event_wait(f.a, (rt_event *)&e, 3));
  ck_assert_ptr_null(f.be->copy_async(f.a, after, &host_word, sizeof host_word));
  ck_assert_ptr_null(f.be->copy_async(f.b, before, &host_word, sizeof host_word));
  ck_assert_ptr_null(f.be->stream_sync(f.b));
  atomic_store(&r.go, 1);
  ck_assert_ptr_null(f.be->stream_sync(f.a));
  pthread_join(t, NULL);
  ck_assert_ptr_null(f.be->copy_d2h(f.d, &got_after, after, sizeof got_after));
  ck_assert_ptr_null(f.be->copy_d2h(f.d, &got_before, before, sizeof got_before));
  ck_assert_int_eq(got_after, 42);
  ck_assert_int_eq(got_before, 0);
  f.be->mem_free(f.d, after);
  f.be->mem_free(f.d, before);
  /* Already reached: nothing to wait for. */
  ck_assert_ptr_null(f.be->event_wait(f.a, (rt_event *)&e, 2));
  ck_assert_ptr_null(f.be->stream_sync(f.a));
  /* Never reached: poisoning the step releases the stream. */
  ck_assert_ptr_null(f.be->event_wait(f.a, (rt_event *)&e, 4));
  usleep(10 * 1000);
  rt_sync_poison(&f.sync, rt_status_make("elsewhere: failed"));
  ck_assert_ptr_null(f.be->stream_sync(f.a));
  rt_status s = rt_sync_take(&f.sync);
  expect_contains(s, "elsewhere: failed");
  rt_status_free(s);
  fx_close(&f);
}
END_TEST

/* Timestamps are CLOCK_MONOTONIC nanoseconds, in stream order, bracketed
 * by host reads; a second after the device opened, the anchor is taken
 * again and stamps stay on the same clock. */
START_TEST(fake_timestamps) {
  fx f;
  fx_open(&f, 0);
  float in[4] = {1, 2, 3, 4};
  smoke_args a;
  smoke_args_make(&f, &a, in, 4, 0);
  for (int round = 0; round < 2; round++) {
    uint64_t s[3] = {0, 0, 0}, other = 0;
    uint64_t before = now_ns();
    ck_assert_ptr_null(f.be->timestamp(f.a, &s[0]));
    ck_assert_ptr_null(f.be->launch(f.a, f.smoke, 1, 4, a.bufs, a.step));
    ck_assert_ptr_null(f.be->timestamp(f.a, &s[1]));
    ck_assert_ptr_null(f.be->timestamp(f.b, &other));
    ck_assert_ptr_null(f.be->timestamp(f.a, &s[2]));
    ck_assert_ptr_null(f.be->stream_sync(f.a));
    ck_assert_ptr_null(f.be->stream_sync(f.b));
    uint64_t after = now_ns();
    /* In stream order, to the float milliseconds' rounding (the fake's
     * events are exact); against the host, to the anchor's placement: half
     * the host's window around the anchor, a few microseconds when idle,
     * as long as the scheduler likes on a loaded machine. The slack is
     * half a second, under the 1.1 s a stamp of round 1 lies past its
     * anchor, so a wrong clock or unit is still caught. */
    ck_assert_uint_le(s[0], s[1] + 1000);
    ck_assert_uint_le(s[1], s[2] + 1000);
    uint64_t slack = 500000000;
    ck_assert_uint_ge(s[0] + slack, before);
    ck_assert_uint_le(s[2], after + slack);
    ck_assert_uint_ge(other + slack, before);
    ck_assert_uint_le(other, after + slack);
    if (round == 0) usleep(1100 * 1000); /* past the anchor's refresh */
  }
  smoke_args_free(&f, &a);
  fx_close(&f);
}
END_TEST

/* A capture that meets something a graph cannot hold (a host-visible
 * record needs a host task) fails at its end, naming the driver's error,
 * and leaves both streams running work as before; a whole one runs its
 * nodes on the first stream each time it is launched. */
START_TEST(fake_graph_capture) {
  fx f;
  fx_open(&f, 0);
  float in[4] = {1, 2, 3, 4}, got[4];
  smoke_args a;
  smoke_args_make(&f, &a, in, 4, 5);
  rt_event *visible, *plain;
  ck_assert_ptr_null(f.be->event_create(f.d, 1, &visible));
  ck_assert_ptr_null(f.be->event_create(f.d, 0, &plain));
  rt_stream *both[2] = {f.a, f.b};
  rt_graph *g = (rt_graph *)&f;

  ck_assert_ptr_null(f.be->graph_begin(both, 2));
  rt_status s = f.be->event_record(f.b, visible, 1); /* its host task cannot be captured */
  expect_contains(s, "cuStreamAddCallback failed: CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED");
  rt_status_free(s);
  s = f.be->graph_end(both, 2, &g);
  ck_assert_ptr_null(g);
  expect_contains(s, "cuStreamEndCapture failed: CUDA_ERROR_STREAM_CAPTURE_INVALIDATED");
  rt_status_free(s);
  ck_assert_ptr_null(f.be->launch(f.b, f.smoke, 1, 4, a.bufs, a.step));
  ck_assert_ptr_null(f.be->stream_sync(f.b));
  ck_assert_ptr_null(f.be->copy_d2h(f.d, got, a.out, sizeof got));
  for (int i = 0; i < 4; i++) ck_assert_float_eq(got[i], 2.0f * in[i] + 5.0f);

  /* a: smoke, record; b: wait, copy out into in. Two nodes, one edge. */
  ck_assert_ptr_null(f.be->graph_begin(both, 2));
  ck_assert_ptr_null(f.be->launch(f.a, f.smoke, 1, 4, a.bufs, a.step));
  ck_assert_ptr_null(f.be->event_record(f.a, plain, 1));
  ck_assert_ptr_null(f.be->event_wait(f.b, plain, 1));
  ck_assert_ptr_null(f.be->copy_async(f.b, a.in, a.out, sizeof in));
  s = f.be->graph_end(both, 2, &g);
  ck_assert_msg(s == NULL, "%s", rt_status_msg(s));
  uint64_t nodes = 0, edges = 0;
  f.be->graph_stats(g, &nodes, &edges);
  ck_assert_uint_eq(nodes, 2);
  ck_assert_uint_eq(edges, 1);
  float want[4] = {1, 2, 3, 4};
  for (int run = 0; run < 3; run++) { /* in = 2 in + 5, in place, each run */
    ck_assert_ptr_null(f.be->graph_launch(g));
    ck_assert_ptr_null(f.be->stream_sync(f.a));
    ck_assert_ptr_null(f.be->copy_d2h(f.d, got, a.in, sizeof got));
    for (int i = 0; i < 4; i++) {
      want[i] = 2.0f * want[i] + 5.0f;
      ck_assert_float_eq(got[i], want[i]);
    }
  }
  f.be->graph_destroy(g);
  f.be->event_destroy(visible);
  f.be->event_destroy(plain);
  smoke_args_free(&f, &a);
  fx_close(&f);
}
END_TEST

START_TEST(fake_code_object_errors) {
  fx f;
  fx_open(&f, 0);
  rt_module *m = (rt_module *)&f;
  const char junk[] = "not a code object";
  rt_status s = f.be->module_load(f.d, NULL, junk, sizeof junk - 1, &m);
  expect_contains(s, "in-memory code object: cuda device gpu0: cuModuleLoadDataEx failed: "
                     "CUDA_ERROR_INVALID_IMAGE (device kernel image is invalid); JIT log: fake "
                     "ptxas: line 1: no .version directive");
  ck_assert_ptr_null(m);
  rt_status_free(s);

  s = f.be->module_load(f.d, "/nonexistent/k.ptx", NULL, 0, &m);
  expect_contains(s, "/nonexistent/k.ptx: cannot open: No such file or directory");
  rt_status_free(s);

  s = f.be->module_load(f.d, "empty.ptx", "", 0, &m);
  expect_contains(s, "empty.ptx: empty code object");
  rt_status_free(s);

  s = f.be->module_load(f.d, NULL, NULL, 0, &m);
  expect_contains(s, "cuda device gpu0: module_load needs a path or bytes");
  rt_status_free(s);

  rt_kernel *k = (rt_kernel *)&f;
  s = f.be->kernel_find(f.m, "nope", &k);
  expect_contains(s, "fake.ptx: cuda device gpu0: cuModuleGetFunction(nope) failed: "
                     "CUDA_ERROR_NOT_FOUND (named symbol not found)");
  ck_assert_ptr_null(k);
  rt_status_free(s);

  /* From a file, as gpu_smoke loads one. */
  char path[] = "/tmp/ds4_gpu_test_XXXXXX";
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(write(fd, fake_ptx, sizeof fake_ptx - 1), (ssize_t)(sizeof fake_ptx - 1));
  close(fd);
  s = f.be->module_load(f.d, path, NULL, 0, &m);
  ck_assert_msg(s == NULL, "%s", rt_status_msg(s));
  ck_assert_ptr_null(f.be->kernel_find(m, "ds4_smoke", &k));
  f.be->module_unload(m);
  unlink(path);
  fx_close(&f);
}
END_TEST

/* fail_launch counts launches as they are enqueued, as the cpu backend
 * counts them as they run. */
START_TEST(fake_injected_fault) {
  fx f;
  fx_open(&f, 2);
  float in[4] = {1, 2, 3, 4};
  smoke_args a;
  smoke_args_make(&f, &a, in, 4, 0);
  ck_assert_ptr_null(f.be->launch(f.a, f.smoke, 1, 4, a.bufs, a.step));
  rt_status s = f.be->launch(f.a, f.smoke, 1, 4, a.bufs, a.step);
  ck_assert_str_eq(rt_status_msg(s), "cuda device gpu0: launch 2 failed (injected fault)");
  rt_status_free(s);
  ck_assert_ptr_null(f.be->launch(f.a, f.smoke, 1, 4, a.bufs, a.step));
  ck_assert_ptr_null(f.be->stream_sync(f.a));
  smoke_args_free(&f, &a);
  fx_close(&f);
}
END_TEST

/* A kernel faults: the host-visible record behind it never happens, its
 * host task poisons the step (releasing a host waiter), and stream_sync
 * reports the fault. A cpu event holds the stream until all is enqueued,
 * since a faulted context refuses new work. */
START_TEST(fake_device_fault) {
  fx f;
  fx_open(&f, 0);
  float in[4] = {1, 2, 3, 4};
  smoke_args a;
  smoke_args_make(&f, &a, in, 4, 0);
  rt_event *e;
  ck_assert_ptr_null(f.be->event_create(f.d, 1, &e));
  host_waiter w = {.sync = &f.sync, .value = &((rt_event_base *)e)->host_gen, .target = 1,
                   .result = 99};
  pthread_t t;
  ck_assert_int_eq(pthread_create(&t, NULL, host_wait, &w), 0);
  foreign_event gate = {.base = {.be = &rt_cpu_backend}};
  uint64_t stamp = 12345;
  ck_assert_ptr_null(f.be->event_wait(f.a, (rt_event *)&gate, 1));
  ck_assert_ptr_null(f.be->launch(f.a, f.fault, 1, 4, a.bufs, a.step));
  ck_assert_ptr_null(f.be->timestamp(f.a, &stamp));
  ck_assert_ptr_null(f.be->event_record(f.a, e, 1));
  atomic_store(&gate.base.host_gen, 1);
  rt_sync_notify(&f.sync);
  pthread_join(t, NULL);
  ck_assert_int_eq(w.result, -1);
  rt_status s = f.be->stream_sync(f.a);
  expect_contains(s, "cuda device gpu0: cuStreamSynchronize failed: CUDA_ERROR_ILLEGAL_ADDRESS "
                     "(an illegal memory access was encountered)");
  rt_status_free(s);
  ck_assert_uint_eq(stamp, 12345); /* skipped, left as it was */
  ck_assert_int_eq(rt_sync_poisoned(&f.sync), 1);
  s = rt_sync_take(&f.sync);
  /* The callback names the fault without calling the driver. */
  expect_contains(s, "cuda device gpu0: stream failed: CUDA_ERROR_ILLEGAL_ADDRESS");
  rt_status_free(s);
  f.be->event_destroy(e);
  smoke_args_free(&f, &a);
  fx_close(&f);
}
END_TEST

/* Two devices: a host range is registered once (portable), by the first
 * device; the second's registration is a no-op, and so is its undoing.
 * Closing a device undoes what it still holds. An event of one device is
 * waited on by the other's stream directly, and refused as a record. */
START_TEST(fake_two_devices) {
  tu_use_fake_cuda(2);
  rt_sync sync;
  ck_assert_ptr_null(rt_sync_init(&sync));
  const rt_backend *be = &rt_cuda_backend;
  rt_device *d0, *d1;
  ck_assert_ptr_null(open_dev(be, &sync, "gpu0", 0, 0, &d0));
  ck_assert_ptr_null(open_dev(be, &sync, "gpu1", 1, 0, &d1));
  static char arena[8192], other[4096];
  ck_assert_ptr_null(be->host_register(d0, arena, sizeof arena));
  ck_assert_ptr_null(be->host_register(d1, arena, sizeof arena));
  ck_assert_int_eq(fake_registered(), 1);
  be->host_unregister(d1, arena);
  ck_assert_int_eq(fake_registered(), 1);
  be->host_unregister(d0, arena);
  ck_assert_int_eq(fake_registered(), 0);
  ck_assert_ptr_null(be->host_register(d1, other, sizeof other));
  ck_assert_int_eq(fake_registered(), 1);

  rt_stream *s0, *s1;
  ck_assert_ptr_null(be->stream_create(d0, 16, &s0));
  ck_assert_ptr_null(be->stream_create(d1, 16, &s1));
  rt_event *e0;
  ck_assert_ptr_null(be->event_create(d0, 0, &e0));
  rt_status s = be->event_record(s1, e0, 1);
  expect_contains(s, "cuda device gpu1: event_record: the event belongs to another device");
  rt_status_free(s);
  /* d0 fills a buffer, d1 copies it to itself after waiting on e0. */
  uint32_t *src, *dst, host[256], back[256];
  for (int i = 0; i < 256; i++) host[i] = (uint32_t)i * 2654435761u;
  ck_assert_ptr_null(be->mem_alloc(d0, sizeof host, (void **)&src));
  ck_assert_ptr_null(be->mem_alloc(d1, sizeof host, (void **)&dst));
  static uint32_t pinned[256];
  ck_assert_ptr_null(be->host_register(d0, pinned, sizeof pinned));
  memcpy(pinned, host, sizeof host);
  ck_assert_ptr_null(be->copy_async(s0, src, pinned, sizeof host));
  ck_assert_ptr_null(be->event_record(s0, e0, 1));
  ck_assert_ptr_null(be->event_wait(s1, e0, 1));
  ck_assert_ptr_null(be->copy_async(s1, dst, src, sizeof host));
  ck_assert_ptr_null(be->stream_sync(s1));
  ck_assert_ptr_null(be->stream_sync(s0));
  ck_assert_ptr_null(be->copy_d2h(d1, back, dst, sizeof back));
  ck_assert_int_eq(memcmp(host, back, sizeof host), 0);

  be->mem_free(d0, src);
  be->mem_free(d1, dst);
  be->event_destroy(e0);
  be->stream_destroy(s0);
  be->stream_destroy(s1);
  be->device_close(d0);
  ck_assert_int_eq(fake_registered(), 1);
  be->device_close(d1);
  ck_assert_int_eq(fake_registered(), 0);
  rt_sync_destroy(&sync);
}
END_TEST

/* The stand-in's test hook for fake_hang kernels. */
static void hang_gate(int open) {
  void *h = dlopen(getenv("DS4_CUDA_LIBRARY"), RTLD_NOW | RTLD_NOLOAD);
  ck_assert_ptr_nonnull(h);
  void (*gate)(int) = (void (*)(int))dlsym(h, "fake_cuda_hang_gate");
  ck_assert_ptr_nonnull(gate);
  gate(open);
  dlclose(h);
}

/* With the watchdog on, stream_sync polls: work completes as before; the
 * stream state names a foreign wait in progress, then shows the stream
 * idle; a kernel that does not return is given up watchdog_ms after the
 * step was poisoned, and the stream is usable once it has returned. */
START_TEST(fake_watchdog_sync_and_state) {
  fx f;
  fx_open_with(&f, 0, 100, NULL);
  float in[4] = {1, 2, 3, 4}, out[4];
  smoke_args a;
  smoke_args_make(&f, &a, in, 4, 10);
  ck_assert_ptr_null(f.be->launch(f.a, f.smoke, 1, 4, a.bufs, a.step));
  ck_assert_ptr_null(f.be->stream_sync(f.a));
  ck_assert_ptr_null(f.be->copy_d2h(f.d, out, a.out, sizeof out));
  for (int i = 0; i < 4; i++) ck_assert_float_eq(out[i], 2 * in[i] + 10);

  foreign_event e = {.base = {.be = &rt_cpu_backend}};
  atomic_init(&e.base.host_gen, 0);
  ck_assert_ptr_null(f.be->event_wait(f.a, (rt_event *)&e, 7));
  rt_stream_state st = {0};
  double t_wait = tu_seconds();
  while (!st.waiting && tu_seconds() - t_wait < TU_HANG_S) {
    f.be->stream_state(f.a, &st);
    usleep(1000);
  }
  ck_assert_ptr_eq(st.waiting, &e.base);
  ck_assert_uint_eq(st.waiting_gen, 7);
  ck_assert_int_eq(st.idle, 0);
  ck_assert_int_eq(st.counted, 0);
  atomic_store(&e.base.host_gen, 7);
  rt_sync_notify(&f.sync);
  ck_assert_ptr_null(f.be->stream_sync(f.a));
  f.be->stream_state(f.a, &st);
  ck_assert_ptr_null(st.waiting);
  ck_assert_int_eq(st.idle, 1);

  hang_gate(0);
  ck_assert_ptr_null(f.be->launch(f.b, f.hang, 1, 4, a.bufs, a.step));
  rt_sync_poison(&f.sync, rt_status_make("watchdog: no progress"));
  uint64_t t0 = now_ns();
  rt_status s = f.be->stream_sync(f.b);
  uint64_t waited = now_ns() - t0;
  ck_assert_str_eq(rt_status_msg(s), "cuda device gpu0: a stream is still busy 100 ms after its "
                                     "step failed (a kernel that does not return?)");
  rt_status_free(s);
  ck_assert_uint_ge(waited, 100000000u);
  ck_assert_msg(waited < (uint64_t)(TU_HANG_S * 1e9), "stream_sync did not give up: a hang");
  s = rt_sync_take(&f.sync);
  ck_assert_str_eq(rt_status_msg(s), "watchdog: no progress");
  rt_status_free(s);
  hang_gate(1);
  ck_assert_ptr_null(f.be->stream_sync(f.b));
  smoke_args_free(&f, &a);
  fx_close(&f);
}
END_TEST

/* rt_fault at the vtable boundary works over a GPU backend as over the
 * cpu one: the n-th copy fails, and from the n-th enqueue on the device
 * is lost for every call that can fail, yet still closes. Without such
 * faults the device is the backend's own. */
START_TEST(fake_vtable_faults) {
  fx f;
  rt_fault fault = {.fail_copy = 2, .lose_device = 4};
  fx_open_with(&f, 0, 0, &fault);
  ck_assert_ptr_ne(f.be, &rt_cuda_backend);
  float in[4] = {1, 2, 3, 4}, out[4];
  smoke_args a;
  smoke_args_make(&f, &a, in, 4, 0);
  ck_assert_ptr_null(f.be->copy_async(f.a, a.out, a.in, sizeof in));
  rt_status s = f.be->copy_async(f.a, a.out, a.in, sizeof in);
  ck_assert_str_eq(rt_status_msg(s), "cuda device gpu0: copy_async 2 failed (injected fault)");
  rt_status_free(s);
  ck_assert_ptr_null(f.be->launch(f.a, f.smoke, 1, 4, a.bufs, a.step));
  s = f.be->launch(f.a, f.smoke, 1, 4, a.bufs, a.step);
  ck_assert_str_eq(rt_status_msg(s),
                   "cuda device gpu0: launch: device lost (injected fault at enqueue 4)");
  rt_status_free(s);
  s = f.be->stream_sync(f.a);
  ck_assert_str_eq(rt_status_msg(s),
                   "cuda device gpu0: stream_sync: device lost (injected fault at enqueue 4)");
  rt_status_free(s);
  s = f.be->copy_d2h(f.d, out, a.out, sizeof out);
  expect_contains(s, "cuda device gpu0: copy_d2h: device lost");
  rt_status_free(s);
  smoke_args_free(&f, &a);
  fx_close(&f);
  rt_device_options o = {.name = "gpu0", .threads = 1, .sync = &f.sync};
  const rt_backend *be = NULL;
  rt_device *d = NULL;
  ck_assert_ptr_null(rt_sync_init(&f.sync));
  ck_assert_ptr_null(rt_fault_device_open(&rt_cuda_backend, &(rt_fault){.fail_launch = 3}, &o, &be, &d));
  ck_assert_ptr_eq(be, &rt_cuda_backend);
  be->device_close(d);
  rt_sync_destroy(&f.sync);
}
END_TEST

int main(void) {
  Suite *s = suite_create("gpu_backend");
  TCase *open = tcase_create("open");
  tcase_add_test(open, lookup_names_both);
  tcase_add_test(open, open_needs_sync);
  tcase_add_test(open, cuda_without_driver);
  tcase_add_test(open, hip_override_missing);
  tcase_add_test(open, hip_without_gpu);
  tcase_add_test(open, library_lacks_symbol);
  tcase_add_test(open, cuda_stub_library);
  suite_add_tcase(s, open);
  TCase *fake = tcase_create("fake_cuda");
  tcase_set_timeout(fake, 60);
  tcase_add_test(fake, fake_no_device);
  tcase_add_test(fake, fake_ordinal_out_of_range);
  tcase_add_test(fake, fake_memory_and_copies);
  tcase_add_test(fake, fake_memory_too_small);
  tcase_add_test(fake, fake_launch_and_cross_stream_wait);
  tcase_add_test(fake, fake_host_visible_record);
  tcase_add_test(fake, fake_foreign_wait);
  tcase_add_test(fake, fake_timestamps);
  tcase_add_test(fake, fake_code_object_errors);
  tcase_add_test(fake, fake_graph_capture);
  tcase_add_test(fake, fake_injected_fault);
  tcase_add_test(fake, fake_device_fault);
  tcase_add_test(fake, fake_two_devices);
  tcase_add_test(fake, fake_watchdog_sync_and_state);
  tcase_add_test(fake, fake_vtable_faults);
  suite_add_tcase(s, fake);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
