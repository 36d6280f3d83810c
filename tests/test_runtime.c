/* test_runtime.c - the runtime's execution side on hand-built bundles: a
 * plan assembled in memory plus a host.so compiled here from small kernels.
 * Replay order (streams, events, devices, copies), grids over the thread
 * pool, poisoning on an injected launch failure, code-object checks (one
 * per device target), copies the cpu backend cannot reach, cpu waits on
 * another backend's event, the seeded weight generator, rt_generate's
 * chunking, per-command tracing, and graph replay over the host stand-in
 * for libcuda.so.1 (tests/gpu/fake_cuda.c). */
#include <check.h>
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "plan.h"
#include "rt.h"
#include "sha256.h"
#include "test_util.h"

#define N 64 /* elements of the f32 test tensors */

/* Kernels the tests launch. t_slow_inc sleeps first, so a consumer that is
 * not properly ordered behind it reads stale bytes and the test sees it. */
static const char kernel_source[] =
    "#include <stdint.h>\n"
    "#include <pthread.h>\n"
    "#include <time.h>\n"
    "static void nap(long ns) { struct timespec t = {0, ns}; nanosleep(&t, 0); }\n"
    "void t_double(void *const *b, const int32_t *s, uint32_t k) {\n"
    "  (void)s; (void)k; const float *x = b[0]; float *y = b[1];\n"
    "  for (int i = 0; i < 64; i++) y[i] = 2.0f * x[i];\n"
    "}\n"
    "void t_inc(void *const *b, const int32_t *s, uint32_t k) {\n"
    "  (void)s; (void)k; const float *x = b[0]; float *y = b[1];\n"
    "  for (int i = 0; i < 64; i++) y[i] = x[i] + 1.0f;\n"
    "}\n"
    "void t_slow_inc(void *const *b, const int32_t *s, uint32_t k) {\n"
    "  nap(3000000); t_inc(b, s, k);\n"
    "}\n"
    "void t_add_pos(void *const *b, const int32_t *s, uint32_t k) {\n"
    "  (void)k; const float *x = b[0]; float *y = b[1];\n"
    "  for (int i = 0; i < 64; i++) y[i] = x[i] + (float)s[0];\n"
    "}\n"
    "void t_blocks(void *const *b, const int32_t *s, uint32_t k) {\n"
    "  int32_t *o = b[0]; uint64_t *who = b[1];\n"
    "  nap(200000);\n"
    "  o[k] = 3 * (int32_t)k + 1 + s[2];\n"
    "  who[k] = (uint64_t)pthread_self();\n"
    "}\n"
    "void t_next(void *const *b, const int32_t *s, uint32_t k) {\n"
    "  (void)k; const int32_t *ids = b[0]; int32_t *next = b[1]; int32_t *seen = b[2];\n"
    "  for (int t = 0; t < 4; t++) next[t] = t < s[1] ? ids[t] + 1 : -1;\n"
    "  for (int i = 0; i < 4; i++) seen[i] = s[i];\n"
    "}\n";

/* ---- a plan built in memory -------------------------------------------- */

typedef struct tb {
  plan p;
  char strings[8192];
  plan_param params[8];
  plan_device devices[4];
  plan_stream streams[8];
  plan_tensor tensors[32];
  plan_codeobj codeobjs[4];
  plan_kernel kernels[16];
  plan_op ops[64];
  plan_command commands[128];
  plan_arg args[256];
  uint32_t rows[64];
  char dir[64];
} tb;

static uint32_t tb_str(tb *b, const char *s) {
  uint32_t off = b->p.strings_len;
  size_t n = strlen(s) + 1;
  ck_assert_uint_lt(off + n, sizeof b->strings);
  memcpy(b->strings + off, s, n);
  b->p.strings_len += (uint32_t)n;
  return off;
}

static void tb_init(tb *b) {
  memset(b, 0, sizeof *b);
  plan *p = &b->p;
  p->strings = b->strings;
  p->params = b->params;
  p->devices = b->devices;
  p->streams = b->streams;
  p->tensors = b->tensors;
  p->codeobjs = b->codeobjs;
  p->kernels = b->kernels;
  p->ops = b->ops;
  p->commands = b->commands;
  p->args = b->args;
  p->rows = b->rows;
  tb_str(b, "");
  p->info.model = tb_str(b, "test-model");
  p->info.schedule = tb_str(b, "test-schedule");
  p->info.tokens = 4;
  p->info.max_seq = 64;
  p->info.prompt = 10;
  p->info.decode = 1;
  p->info.weight_seed = 1234;
  snprintf(b->dir, sizeof b->dir, "/tmp/ds4-rt-test-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(b->dir));
  b->codeobjs[0].path = tb_str(b, "kernels/host.so");
  b->codeobjs[0].target = tb_str(b, "host");
  p->ncodeobjs = 1;
}

static void tb_param(tb *b, const char *name, int64_t v) {
  b->params[b->p.nparams].name = tb_str(b, name);
  b->params[b->p.nparams++].value = v;
}

static uint32_t tb_device(tb *b, const char *name, uint32_t threads) {
  plan_device *d = &b->devices[b->p.ndevices];
  d->name = tb_str(b, name);
  d->backend = PLAN_BACKEND_CPU;
  d->arch = tb_str(b, "host");
  d->threads = threads;
  return b->p.ndevices++;
}

/* A device of a GPU backend; the plan may name it even where the backend
 * is missing, as long as opening fails before the device is opened. */
static uint32_t tb_gpu_device(tb *b, const char *name, uint32_t backend, const char *arch) {
  uint32_t d = tb_device(b, name, 1);
  b->devices[d].backend = backend;
  b->devices[d].arch = tb_str(b, arch);
  return d;
}

/* Another code object, whose file the test does not write. */
static void tb_codeobj(tb *b, const char *path, const char *target) {
  b->codeobjs[b->p.ncodeobjs].path = tb_str(b, path);
  b->codeobjs[b->p.ncodeobjs].target = tb_str(b, target);
  b->p.ncodeobjs++;
}

static uint32_t tb_stream(tb *b, const char *name, uint32_t dev) {
  b->streams[b->p.nstreams].name = tb_str(b, name);
  b->streams[b->p.nstreams].device = dev;
  return b->p.nstreams++;
}

/* A tensor of the given shape; on device PLAN_NONE it takes no arena. */
static uint32_t tb_tensor_nd(tb *b, const char *name, uint32_t dtype, uint32_t role, uint32_t dev,
                             uint32_t ndim, const uint64_t *dims) {
  plan_tensor *t = &b->tensors[b->p.ntensors];
  t->name = tb_str(b, name);
  t->checkpoint = PLAN_NONE;
  t->dtype = dtype;
  t->role = role;
  t->ndim = ndim;
  t->device = dev;
  t->view_of = PLAN_NONE;
  t->rows = PLAN_NONE;
  for (uint32_t d = 0; d < ndim; d++) t->dim[d] = dims[d];
  t->bytes = plan_tensor_bytes(dtype, ndim, dims);
  t->init_scale = 1.0;
  if (dev != PLAN_NONE) {
    t->offset = b->devices[dev].arena_bytes;
    b->devices[dev].arena_bytes += (t->bytes + 63) & ~(uint64_t)63;
  }
  return b->p.ntensors++;
}

static uint32_t tb_tensor(tb *b, const char *name, uint32_t dtype, uint32_t role, uint32_t dev,
                          uint64_t n) {
  return tb_tensor_nd(b, name, dtype, role, dev, 1, &n);
}

/* A view on dev of weight src: rows[0..nrows) of src, or every row of it
 * (a replica) when rows is NULL. */
static uint32_t tb_view(tb *b, const char *name, uint32_t src, uint32_t dev, const uint32_t *rows,
                        uint32_t nrows) {
  uint64_t dims[PLAN_MAXDIM];
  memcpy(dims, b->tensors[src].dim, sizeof dims);
  if (rows) dims[0] = nrows;
  uint32_t v = tb_tensor_nd(b, name, b->tensors[src].dtype, PLAN_WEIGHT, dev,
                            b->tensors[src].ndim, dims);
  b->tensors[v].view_of = src;
  if (rows) {
    b->tensors[v].rows = b->p.nrows;
    memcpy(b->rows + b->p.nrows, rows, nrows * sizeof *rows);
    b->p.nrows += nrows;
  }
  return v;
}

static uint32_t tb_kernel(tb *b, const char *sym, uint32_t grid, uint32_t nbufs) {
  plan_kernel *k = &b->kernels[b->p.nkernels];
  k->symbol = tb_str(b, sym);
  k->kind = tb_str(b, "test");
  k->grid = grid;
  k->block = 64; /* read by GPU backends only */
  k->nbufs = nbufs;
  return b->p.nkernels++;
}

static uint32_t tb_cmd(tb *b, uint32_t kind, uint32_t stream, uint32_t op, uint32_t a, uint32_t bb) {
  plan_command *c = &b->commands[b->p.ncommands];
  c->kind = kind;
  c->stream = stream;
  c->op = op;
  c->a = a;
  c->b = bb;
  return b->p.ncommands++;
}

static uint32_t tb_op(tb *b, uint32_t stream, uint32_t kernel) {
  char path[32];
  snprintf(path, sizeof path, "op%u", b->p.nops);
  b->ops[b->p.nops].path = tb_str(b, path);
  b->ops[b->p.nops].stream = stream;
  b->ops[b->p.nops].kernel = kernel;
  return b->p.nops++;
}

/* Bytes [offset, offset + bytes) of tensor t, as the next ARGS entry. */
static uint32_t tb_arg(tb *b, uint32_t t, uint64_t offset, uint64_t bytes) {
  b->args[b->p.nargs] = (plan_arg){.tensor = t, .offset = offset, .bytes = bytes};
  return b->p.nargs++;
}

static uint32_t tb_whole(tb *b, uint32_t t) { return tb_arg(b, t, 0, b->tensors[t].bytes); }

/* A launch of kernel on the kernel's nbufs args from `begin` on. */
static void tb_launch_args(tb *b, uint32_t stream, uint32_t kernel, uint32_t begin) {
  uint32_t c = tb_cmd(b, PLAN_CMD_LAUNCH, stream, tb_op(b, stream, kernel), kernel, PLAN_NONE);
  b->commands[c].args_begin = begin;
  b->commands[c].nargs = b->kernels[kernel].nbufs;
}

/* A launch on whole tensors t0, t1, t2 (as many as the kernel takes). */
static void tb_launch(tb *b, uint32_t stream, uint32_t kernel, uint32_t t0, uint32_t t1,
                      uint32_t t2) {
  uint32_t ts[3] = {t0, t1, t2};
  uint32_t begin = b->p.nargs;
  for (uint32_t i = 0; i < b->kernels[kernel].nbufs; i++) tb_whole(b, ts[i]);
  tb_launch_args(b, stream, kernel, begin);
}

/* A copy from arg `begin` into arg `begin + 1`. */
static void tb_copy_args(tb *b, uint32_t stream, uint32_t begin) {
  uint32_t c = tb_cmd(b, PLAN_CMD_COPY, stream, tb_op(b, stream, PLAN_NONE), PLAN_NONE, PLAN_NONE);
  b->commands[c].args_begin = begin;
  b->commands[c].nargs = 2;
}

static void tb_copy(tb *b, uint32_t stream, uint32_t src, uint32_t dst) {
  uint32_t begin = tb_whole(b, src);
  tb_whole(b, dst);
  tb_copy_args(b, stream, begin);
}

static uint32_t tb_record(tb *b, uint32_t stream) {
  return tb_cmd(b, PLAN_CMD_RECORD, stream, PLAN_NONE, b->p.info.nevents++, PLAN_NONE);
}

static void tb_wait(tb *b, uint32_t stream, uint32_t record) {
  tb_cmd(b, PLAN_CMD_WAIT, stream, PLAN_NONE, b->commands[record].a, record);
}

/* The ids and next-token tensors every plan names (rt_generate uses them). */
static void tb_io(tb *b) {
  b->p.info.ids_tensor = tb_tensor(b, "ids", PLAN_I32, PLAN_INPUT, 0, 4);
  b->p.info.next_tensor = tb_tensor(b, "next", PLAN_I32, PLAN_OUTPUT, 0, 4);
}

static void tb_file(const tb *b, const char *rel, const char *text) {
  char path[256];
  snprintf(path, sizeof path, "%s/%s", b->dir, rel);
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fputs(text, f);
  fclose(f);
}

static void file_digest(const char *path, uint8_t out[32]) {
  FILE *f = fopen(path, "rb");
  ck_assert_ptr_nonnull(f);
  rt_sha256_ctx c;
  rt_sha256_init(&c);
  uint8_t buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) rt_sha256_update(&c, buf, n);
  fclose(f);
  rt_sha256_final(&c, out);
}

/* Compile the kernels into DIR/kernels/host.so, hash it, write the plan. */
static void tb_write(tb *b) {
  char cmd[512];
  snprintf(cmd, sizeof cmd, "mkdir -p %s/kernels", b->dir);
  ck_assert_int_eq(system(cmd), 0);
  tb_file(b, "kernels/k.c", kernel_source);
  snprintf(cmd, sizeof cmd, "cc -std=c11 -D_GNU_SOURCE -O1 -shared -fPIC -o %s/kernels/host.so %s/kernels/k.c -lpthread",
           b->dir, b->dir);
  ck_assert_int_eq(system(cmd), 0);
  snprintf(cmd, sizeof cmd, "%s/kernels/host.so", b->dir);
  file_digest(cmd, b->codeobjs[0].sha256);
  for (uint32_t d = 0; d < b->p.ndevices; d++)
    if (!b->devices[d].arena_bytes) b->devices[d].arena_bytes = 64;
  snprintf(cmd, sizeof cmd, "%s/plan.ds4p", b->dir);
  rt_status s = plan_write(&b->p, cmd);
  ck_assert_msg(s == NULL, "plan_write: %s", rt_status_msg(s));
}

static void tb_cleanup(tb *b) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", b->dir);
  ck_assert_int_eq(system(cmd), 0);
}

static rt_bundle *open_ok(const char *dir, const rt_fault *fault) {
  rt_bundle *bd = NULL;
  rt_status s = rt_bundle_open_faulty(dir, NULL, fault, &bd);
  ck_assert_msg(s == NULL, "rt_bundle_open: %s", rt_status_msg(s));
  return bd;
}

static void step_ok(rt_bundle *bd, int32_t pos, int32_t ntok, int32_t idx) {
  int32_t st[4] = {pos, ntok, idx, 0};
  rt_status s = rt_replay_step(bd, st);
  ck_assert_msg(s == NULL, "rt_replay_step: %s", rt_status_msg(s));
}

static void write_f32(rt_bundle *bd, uint32_t t, float base) {
  float x[N];
  for (int i = 0; i < N; i++) x[i] = base + (float)i;
  rt_status s = rt_tensor_write(bd, t, x, sizeof x);
  ck_assert_msg(s == NULL, "%s", rt_status_msg(s));
}

static void expect_f32(rt_bundle *bd, uint32_t t, float mul, float add, float base) {
  float y[N];
  rt_status s = rt_tensor_read(bd, t, y, sizeof y);
  ck_assert_msg(s == NULL, "%s", rt_status_msg(s));
  for (int i = 0; i < N; i++)
    ck_assert_msg(y[i] == mul * (base + (float)i) + add, "element %d: got %g, want %g", i,
                  (double)y[i], (double)(mul * (base + (float)i) + add));
}

/* ---- replay ------------------------------------------------------------- */

START_TEST(chain_one_stream) {
  tb b;
  tb_init(&b);
  uint32_t d = tb_device(&b, "cpu0", 1), s = tb_stream(&b, "main", d);
  tb_io(&b);
  uint32_t x = tb_tensor(&b, "x", PLAN_F32, PLAN_INPUT, d, N);
  uint32_t a = tb_tensor(&b, "a", PLAN_F32, PLAN_ACTIVATION, d, N);
  uint32_t c = tb_tensor(&b, "c", PLAN_F32, PLAN_ACTIVATION, d, N);
  uint32_t y = tb_tensor(&b, "y", PLAN_F32, PLAN_OUTPUT, d, N);
  uint32_t kd = tb_kernel(&b, "t_double", 1, 2), ki = tb_kernel(&b, "t_inc", 1, 2),
           kp = tb_kernel(&b, "t_add_pos", 1, 2);
  tb_launch(&b, s, kd, x, a, 0); /* a = 2x */
  tb_launch(&b, s, ki, a, c, 0); /* c = 2x + 1 */
  tb_launch(&b, s, kp, c, y, 0); /* y = 2x + 1 + pos */
  tb_write(&b);
  rt_bundle *bd = open_ok(b.dir, NULL);
  for (int k = 0; k < 5; k++) {
    write_f32(bd, x, (float)(10 * k));
    step_ok(bd, 7 * k, 1, k);
    expect_f32(bd, y, 2.0f, 1.0f + (float)(7 * k), (float)(10 * k));
  }
  uint32_t found;
  ck_assert_ptr_null(rt_tensor_find(bd, "y", &found));
  ck_assert_uint_eq(found, y);
  rt_status e = rt_tensor_find(bd, "nope", &found);
  ck_assert_ptr_nonnull(e);
  ck_assert_ptr_nonnull(strstr(rt_status_msg(e), "no tensor named nope"));
  rt_status_free(e);
  float big[N + 1];
  e = rt_tensor_read(bd, y, big, sizeof big);
  ck_assert_ptr_nonnull(e);
  rt_status_free(e);
  /* A read from an offset: the tail of the whole, and nothing past it. */
  float whole[N], tail[N];
  ck_assert_ptr_null(rt_tensor_read(bd, y, whole, sizeof whole));
  ck_assert_ptr_null(rt_tensor_read_at(bd, y, 3 * sizeof(float), tail, (N - 3) * sizeof(float)));
  ck_assert_mem_eq(tail, whole + 3, (N - 3) * sizeof(float));
  ck_assert_ptr_null(rt_tensor_read_at(bd, y, sizeof whole, tail, 0));
  e = rt_tensor_read_at(bd, y, 3 * sizeof(float), tail, (N - 2) * sizeof(float));
  ck_assert_ptr_nonnull(e);
  ck_assert_msg(strstr(rt_status_msg(e), "bytes from byte 12 asked of tensor y"), "%s", rt_status_msg(e));
  rt_status_free(e);
  e = rt_tensor_read_at(bd, y, sizeof whole + 1, tail, 0);
  ck_assert_ptr_nonnull(e);
  rt_status_free(e);
  rt_bundle_close(bd);
  tb_cleanup(&b);
}
END_TEST

/* rt_cpu_threads: an explicit count wins; else the plan's, scaled so the
 * cpu devices together fit the cores this process may run on (here one,
 * by its affinity: so each device gets 1, and a GPU device's threads do
 * not count). */
START_TEST(cpu_threads_fit_the_cores) {
  tb b;
  tb_init(&b);
  uint32_t d0 = tb_device(&b, "cpu0", 4), d1 = tb_device(&b, "cpu1", 2), g = tb_device(&b, "gpu0", 8);
  b.devices[g].backend = PLAN_BACKEND_CUDA;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(sched_getcpu() >= 0 ? sched_getcpu() : 0, &one);
  ck_assert_int_eq(sched_setaffinity(0, sizeof one, &one), 0);
  ck_assert_uint_eq(rt_cpu_threads(&b.p, d0, 0), 1);
  ck_assert_uint_eq(rt_cpu_threads(&b.p, d1, 0), 1);
  ck_assert_uint_eq(rt_cpu_threads(&b.p, d0, 3), 3);
  b.devices[d0].threads = 1;
  b.devices[d1].threads = 0; /* unstated: 1 */
  cpu_set_t all;
  CPU_ZERO(&all);
  CPU_SET(0, &all);
  CPU_SET(1, &all);
  if (sched_setaffinity(0, sizeof all, &all) == 0 && CPU_COUNT(&all) == 2) {
    ck_assert_uint_eq(rt_cpu_threads(&b.p, d0, 0), 1);
    ck_assert_uint_eq(rt_cpu_threads(&b.p, d1, 0), 1);
  }
  tb_cleanup(&b);
}
END_TEST

START_TEST(two_streams_record_wait) {
  tb b;
  tb_init(&b);
  uint32_t d = tb_device(&b, "cpu0", 2);
  uint32_t s0 = tb_stream(&b, "compute", d), s1 = tb_stream(&b, "other", d);
  tb_io(&b);
  uint32_t x = tb_tensor(&b, "x", PLAN_F32, PLAN_INPUT, d, N);
  uint32_t a = tb_tensor(&b, "a", PLAN_F32, PLAN_ACTIVATION, d, N);
  uint32_t y = tb_tensor(&b, "y", PLAN_F32, PLAN_OUTPUT, d, N);
  uint32_t ks = tb_kernel(&b, "t_slow_inc", 1, 2), kd = tb_kernel(&b, "t_double", 1, 2);
  tb_launch(&b, s0, ks, x, a, 0); /* a = x + 1, after a nap */
  uint32_t r = tb_record(&b, s0);
  tb_wait(&b, s1, r);
  tb_launch(&b, s1, kd, a, y, 0); /* y = 2x + 2, only if ordered */
  tb_write(&b);
  rt_bundle *bd = open_ok(b.dir, NULL);
  for (int k = 0; k < 4; k++) {
    write_f32(bd, x, (float)(100 * k));
    step_ok(bd, k, 1, k);
    expect_f32(bd, y, 2.0f, 2.0f, (float)(100 * k));
  }
  rt_bundle_close(bd);
  tb_cleanup(&b);
}
END_TEST

/* dev0 computes, dev1 waits, copies across and computes; then dev0 waits
 * for dev1 and copies back: both submitters honour enqueue-after. */
static void build_two_devices(tb *b, uint32_t *x, uint32_t *y1, uint32_t *z0) {
  tb_init(b);
  uint32_t d0 = tb_device(b, "cpu0", 2), d1 = tb_device(b, "cpu1", 2);
  uint32_t s0 = tb_stream(b, "main0", d0), s1 = tb_stream(b, "main1", d1);
  tb_io(b);
  *x = tb_tensor(b, "x", PLAN_F32, PLAN_INPUT, d0, N);
  uint32_t a0 = tb_tensor(b, "a0", PLAN_F32, PLAN_ACTIVATION, d0, N);
  uint32_t a1 = tb_tensor(b, "a1", PLAN_F32, PLAN_ACTIVATION, d1, N);
  uint32_t b1 = tb_tensor(b, "b1", PLAN_F32, PLAN_ACTIVATION, d1, N);
  *y1 = tb_tensor(b, "y1", PLAN_F32, PLAN_OUTPUT, d1, N);
  uint32_t y0 = tb_tensor(b, "y0", PLAN_F32, PLAN_ACTIVATION, d0, N);
  *z0 = tb_tensor(b, "z0", PLAN_F32, PLAN_OUTPUT, d0, N);
  uint32_t ki = tb_kernel(b, "t_inc", 1, 2), ks = tb_kernel(b, "t_slow_inc", 1, 2),
           kd = tb_kernel(b, "t_double", 1, 2);
  tb_launch(b, s0, ks, *x, a0, 0);   /* a0 = x + 1 (slow) */
  uint32_t r0 = tb_record(b, s0);
  tb_wait(b, s1, r0);
  tb_copy(b, s1, a0, a1);            /* across devices */
  tb_launch(b, s1, ks, a1, b1, 0);   /* b1 = x + 2 (slow) */
  tb_launch(b, s1, kd, b1, *y1, 0);  /* y1 = 2x + 4 */
  uint32_t r1 = tb_record(b, s1);
  tb_wait(b, s0, r1);
  tb_copy(b, s0, *y1, y0);
  tb_launch(b, s0, ki, y0, *z0, 0);  /* z0 = 2x + 5 */
  tb_write(b);
}

START_TEST(two_devices_copy_wait) {
  tb b;
  uint32_t x, y1, z0;
  build_two_devices(&b, &x, &y1, &z0);
  rt_bundle *bd = open_ok(b.dir, NULL);
  for (int k = 0; k < 4; k++) {
    write_f32(bd, x, (float)(1000 * k));
    step_ok(bd, k, 1, k);
    expect_f32(bd, y1, 2.0f, 4.0f, (float)(1000 * k));
    expect_f32(bd, z0, 2.0f, 5.0f, (float)(1000 * k));
  }
  rt_bundle_close(bd);
  tb_cleanup(&b);
}
END_TEST

/* Launch args and copies address byte ranges, not whole tensors: t_inc
 * reads the second half of x and writes the middle third of y, then a copy
 * moves that third to the front of z. Bytes outside the ranges stay zero. */
START_TEST(arg_offsets) {
  tb b;
  tb_init(&b);
  uint32_t d = tb_device(&b, "cpu0", 1), s = tb_stream(&b, "main", d);
  tb_io(&b);
  uint32_t x = tb_tensor(&b, "x", PLAN_F32, PLAN_INPUT, d, 2 * N);
  uint32_t y = tb_tensor(&b, "y", PLAN_F32, PLAN_OUTPUT, d, 3 * N);
  uint32_t z = tb_tensor(&b, "z", PLAN_F32, PLAN_OUTPUT, d, 2 * N);
  const uint64_t part = N * sizeof(float);
  uint32_t begin = tb_arg(&b, x, part, part);
  tb_arg(&b, y, part, part);
  tb_launch_args(&b, s, tb_kernel(&b, "t_inc", 1, 2), begin);
  begin = tb_arg(&b, y, part, part);
  tb_arg(&b, z, 0, part);
  tb_copy_args(&b, s, begin);
  tb_write(&b);
  rt_bundle *bd = open_ok(b.dir, NULL);
  float xs[2 * N], ys[3 * N], zs[2 * N];
  for (int i = 0; i < 2 * N; i++) xs[i] = (float)(1000 + i);
  ck_assert_ptr_null(rt_tensor_write(bd, x, xs, sizeof xs));
  step_ok(bd, 0, 1, 0);
  ck_assert_ptr_null(rt_tensor_read(bd, y, ys, sizeof ys));
  ck_assert_ptr_null(rt_tensor_read(bd, z, zs, sizeof zs));
  for (int i = 0; i < 3 * N; i++) {
    float want = i >= N && i < 2 * N ? xs[i] + 1.0f : 0.0f;
    ck_assert_msg(ys[i] == want, "y[%d]: got %g, want %g", i, (double)ys[i], (double)want);
  }
  for (int i = 0; i < 2 * N; i++) {
    float want = i < N ? xs[N + i] + 1.0f : 0.0f;
    ck_assert_msg(zs[i] == want, "z[%d]: got %g, want %g", i, (double)zs[i], (double)want);
  }
  rt_bundle_close(bd);
  tb_cleanup(&b);
}
END_TEST

START_TEST(grid_spreads_over_threads) {
  enum { GRID = 48 };
  tb b;
  tb_init(&b);
  uint32_t d = tb_device(&b, "cpu0", 4), s = tb_stream(&b, "main", d);
  tb_io(&b);
  uint32_t o = tb_tensor(&b, "o", PLAN_I32, PLAN_OUTPUT, d, GRID);
  uint32_t who = tb_tensor(&b, "who", PLAN_I32, PLAN_OUTPUT, d, 2 * GRID);
  uint32_t kb = tb_kernel(&b, "t_blocks", GRID, 2);
  tb_launch(&b, s, kb, o, who, 0);
  tb_write(&b);
  rt_bundle *bd = open_ok(b.dir, NULL);
  for (int k = 0; k < 3; k++) {
    step_ok(bd, 0, 1, 100 + k);
    int32_t out[GRID];
    uint64_t ids[GRID];
    ck_assert_ptr_null(rt_tensor_read(bd, o, out, sizeof out));
    ck_assert_ptr_null(rt_tensor_read(bd, who, ids, sizeof ids));
    for (int i = 0; i < GRID; i++) ck_assert_int_eq(out[i], 3 * i + 1 + 100 + k);
    int distinct = 0;
    for (int i = 0; i < GRID; i++) {
      int seen = 0;
      for (int j = 0; j < i; j++) seen |= ids[j] == ids[i];
      distinct += !seen;
    }
    ck_assert_msg(distinct >= 2, "all %d blocks ran on one thread", GRID);
    ck_assert_int_le(distinct, 4);
  }
  rt_bundle_close(bd);
  tb_cleanup(&b);
}
END_TEST

/* The n-th launch of a device fails in step k of a two-device replay: the
 * other device is then blocked on an event that will never be recorded (or
 * its submitter on a record never enqueued) and must be released. */
static void fault_case(uint32_t device, uint64_t nth, int fail_step) {
  tb b;
  uint32_t x, y1, z0;
  build_two_devices(&b, &x, &y1, &z0);
  rt_fault f = {.device = device, .fail_launch = nth};
  rt_bundle *bd = open_ok(b.dir, &f);
  for (int k = 1; k <= fail_step + 1; k++) {
    write_f32(bd, x, (float)k);
    int32_t st[4] = {k, 1, k, 0};
    double t0 = tu_seconds();
    rt_status s = rt_replay_step(bd, st);
    tu_assert_no_hang(t0, "the step");
    if (k == fail_step) {
      ck_assert_msg(s != NULL, "step %d should fail", k);
      ck_assert_msg(strstr(rt_status_msg(s), "injected") != NULL, "%s", rt_status_msg(s));
      ck_assert_msg(strstr(rt_status_msg(s), device ? "cpu1" : "cpu0") != NULL, "%s",
                    rt_status_msg(s));
      rt_status_free(s);
    } else {
      /* Before and after the failure, steps run and compute correctly. */
      ck_assert_msg(s == NULL, "step %d: %s", k, rt_status_msg(s));
      expect_f32(bd, z0, 2.0f, 5.0f, (float)k);
    }
  }
  rt_bundle_close(bd);
  tb_cleanup(&b);
}

START_TEST(fault_poisons_step) {
  /* dev1 launches 2 kernels per step, dev0 2: fail each position once. */
  fault_case(1, 2 * 2 + 1, 3); /* dev1's first launch of step 3 */
  fault_case(1, 2 * 1 + 2, 2); /* dev1's second launch of step 2 */
  fault_case(0, 2 * 2 + 1, 3); /* dev0's first launch of step 3 */
  fault_case(0, 2 * 0 + 2, 1); /* dev0's last launch of step 1 */
}
END_TEST

START_TEST(close_without_steps) {
  tb b;
  uint32_t x, y1, z0;
  build_two_devices(&b, &x, &y1, &z0);
  rt_bundle_close(open_ok(b.dir, NULL));
  tb_cleanup(&b);
}
END_TEST

/* ---- refusals ----------------------------------------------------------- */

static void expect_open_error(const char *dir, const char *needle) {
  rt_bundle *bd = (rt_bundle *)1;
  rt_status s = rt_bundle_open(dir, NULL, &bd);
  ck_assert_msg(s != NULL, "open should fail with '%s'", needle);
  ck_assert_ptr_null(bd);
  ck_assert_msg(strstr(rt_status_msg(s), needle) != NULL, "got: %s (want '%s')", rt_status_msg(s),
                needle);
  rt_status_free(s);
}

static void simple_plan(tb *b, const char *symbol) {
  tb_init(b);
  uint32_t d = tb_device(b, "cpu0", 1), s = tb_stream(b, "main", d);
  tb_io(b);
  uint32_t x = tb_tensor(b, "x", PLAN_F32, PLAN_INPUT, d, N);
  uint32_t y = tb_tensor(b, "y", PLAN_F32, PLAN_OUTPUT, d, N);
  tb_launch(b, s, tb_kernel(b, symbol, 1, 2), x, y, 0);
}

START_TEST(codeobj_sha_mismatch) {
  tb b;
  simple_plan(&b, "t_inc");
  tb_write(&b);
  char path[256];
  snprintf(path, sizeof path, "%s/kernels/host.so", b.dir);
  FILE *f = fopen(path, "ab");
  ck_assert_ptr_nonnull(f);
  fputc(0, f);
  fclose(f);
  char want[300];
  snprintf(want, sizeof want, "%s: sha256 mismatch (plan expects ", path);
  expect_open_error(b.dir, want);
  expect_open_error(b.dir, ", file has ");
  unlink(path);
  expect_open_error(b.dir, "kernels/host.so: cannot open");
  tb_cleanup(&b);
}
END_TEST

START_TEST(codeobj_load_errors) {
  tb b;
  simple_plan(&b, "t_missing_symbol");
  tb_write(&b);
  expect_open_error(b.dir, "kernel symbol t_missing_symbol not found");
  tb_cleanup(&b);

  /* Not a shared object, but its hash matches: dlopen must say so. */
  simple_plan(&b, "t_inc");
  tb_write(&b);
  tb_file(&b, "kernels/host.so", "not an ELF file\n");
  char path[256];
  snprintf(path, sizeof path, "%s/kernels/host.so", b.dir);
  file_digest(path, b.codeobjs[0].sha256);
  snprintf(path, sizeof path, "%s/plan.ds4p", b.dir);
  ck_assert_ptr_null(plan_write(&b.p, path));
  expect_open_error(b.dir, "dlopen failed");
  tb_cleanup(&b);

  /* A hip device where no HIP runtime can be loaded: the library is named,
   * the same on every machine. */
  simple_plan(&b, "t_inc");
  b.devices[0].backend = PLAN_BACKEND_HIP;
  tb_write(&b);
  setenv("DS4_HIP_LIBRARY", "/nonexistent/libamdhip64.so", 1);
  expect_open_error(b.dir, "cannot load /nonexistent/libamdhip64.so");
  unsetenv("DS4_HIP_LIBRARY");
  tb_cleanup(&b);

  expect_open_error("/nonexistent/bundle", "/nonexistent/bundle/plan.ds4p");
}
END_TEST

START_TEST(backend_lookup) {
  const rt_backend *be;
  ck_assert_ptr_null(rt_backend_lookup(PLAN_BACKEND_CPU, &be));
  ck_assert_str_eq(be->name, "cpu");
  ck_assert_ptr_null(rt_backend_lookup(PLAN_BACKEND_CUDA, &be));
  ck_assert_str_eq(be->name, "cuda");
  ck_assert_ptr_null(rt_backend_lookup(PLAN_BACKEND_HIP, &be));
  ck_assert_str_eq(be->name, "hip");
  rt_status s = rt_backend_lookup(PLAN_BACKEND_CUDA + 1, &be);
  ck_assert_ptr_nonnull(s);
  ck_assert_ptr_null(be);
  rt_status_free(s);
}
END_TEST

/* Each device loads the code object of its target: a device whose target
 * has none is refused at open, naming the targets there are. */
START_TEST(codeobj_per_target) {
  tb b;
  simple_plan(&b, "t_inc");
  tb_codeobj(&b, "kernels/gfx1201.hsaco", "gfx1201");
  tb_gpu_device(&b, "gpu0", PLAN_BACKEND_CUDA, "sm_90");
  tb_write(&b);
  expect_open_error(b.dir, "/plan.ds4p: device 'gpu0' (cuda, sm_90) has no code object for "
                           "target sm_90 (targets: host, gfx1201)");
  tb_cleanup(&b);

  /* cpu devices take "host", whatever their arch string. */
  simple_plan(&b, "t_inc");
  b.codeobjs[0].target = tb_str(&b, "gfx1201");
  b.devices[0].arch = tb_str(&b, "znver4");
  tb_write(&b);
  expect_open_error(b.dir, "/plan.ds4p: device 'cpu0' (cpu, znver4) has no code object for "
                           "target host (targets: gfx1201)");
  tb_cleanup(&b);
}
END_TEST

/* A code object no device runs is neither verified nor loaded: its file
 * need not exist. The cpu device's arch string is not "host" either. */
START_TEST(codeobj_unused_target) {
  tb b;
  simple_plan(&b, "t_inc");
  tb_codeobj(&b, "kernels/gfx1201.hsaco", "gfx1201");
  b.devices[0].arch = tb_str(&b, "znver4");
  tb_write(&b);
  rt_bundle *bd = open_ok(b.dir, NULL);
  uint32_t x, y;
  ck_assert_ptr_null(rt_tensor_find(bd, "x", &x));
  ck_assert_ptr_null(rt_tensor_find(bd, "y", &y));
  write_f32(bd, x, 7.0f);
  step_ok(bd, 0, 1, 0);
  expect_f32(bd, y, 1.0f, 1.0f, 7.0f);
  rt_bundle_close(bd);
  tb_cleanup(&b);
}
END_TEST

/* cpu0 (host) beside gpu0 (cuda) and gpu1 (hip), each with a code object,
 * and tensors on all three; the caller adds one copy. */
static void copy_reach_plan(tb *b, uint32_t *s_cpu, uint32_t *s_gpu0, uint32_t *x, uint32_t *g0,
                            uint32_t *g1) {
  tb_init(b);
  uint32_t d = tb_device(b, "cpu0", 1);
  uint32_t gpu0 = tb_gpu_device(b, "gpu0", PLAN_BACKEND_CUDA, "sm_90");
  uint32_t gpu1 = tb_gpu_device(b, "gpu1", PLAN_BACKEND_HIP, "gfx1201");
  tb_codeobj(b, "kernels/sm_90.cubin", "sm_90");
  tb_codeobj(b, "kernels/gfx1201.hsaco", "gfx1201");
  *s_cpu = tb_stream(b, "main", d);
  *s_gpu0 = tb_stream(b, "copy", gpu0);
  tb_stream(b, "copy", gpu1);
  tb_io(b);
  *x = tb_tensor(b, "x", PLAN_F32, PLAN_OUTPUT, d, N);
  *g0 = tb_tensor(b, "g0", PLAN_F32, PLAN_ACTIVATION, gpu0, N);
  *g1 = tb_tensor(b, "g1", PLAN_F32, PLAN_ACTIVATION, gpu1, N);
}

/* The cpu backend cannot reach GPU memory, and no backend reaches another
 * GPU backend's: such copies are refused at open, before any device is
 * opened (so this runs where neither GPU backend exists). */
START_TEST(copy_reach) {
  tb b;
  uint32_t s_cpu, s_gpu0, x, g0, g1;
  copy_reach_plan(&b, &s_cpu, &s_gpu0, &x, &g0, &g1);
  tb_copy(&b, s_cpu, g0, x); /* GPU to cpu, on the cpu's stream */
  tb_write(&b);
  char want[256];
  snprintf(want, sizeof want, "%s/plan.ds4p: command 0: copy on cpu stream 'main' touches memory "
           "of device 'gpu0' (cuda); such copies run on the GPU's stream", b.dir);
  expect_open_error(b.dir, want);
  tb_cleanup(&b);

  copy_reach_plan(&b, &s_cpu, &s_gpu0, &x, &g0, &g1);
  /* A copy on the cpu stream within cpu memory is fine, the next is not. */
  tb_copy(&b, s_cpu, b.p.info.ids_tensor, b.p.info.next_tensor);
  tb_copy(&b, s_cpu, x, g0);
  tb_write(&b);
  expect_open_error(b.dir, "/plan.ds4p: command 1: copy on cpu stream 'main' touches memory of "
                           "device 'gpu0' (cuda); such copies run on the GPU's stream");
  tb_cleanup(&b);

  copy_reach_plan(&b, &s_cpu, &s_gpu0, &x, &g0, &g1);
  tb_copy(&b, s_gpu0, g1, g0);
  tb_write(&b);
  expect_open_error(b.dir, "/plan.ds4p: command 0: copy on cuda stream 'copy' touches memory of "
                           "device 'gpu1' (hip); no backend copies between two GPU backends");
  tb_cleanup(&b);

  /* On the GPU's stream the copy passes; opening then stops at the first
   * thing the test left out, the GPU's code object file. */
  copy_reach_plan(&b, &s_cpu, &s_gpu0, &x, &g0, &g1);
  tb_copy(&b, s_gpu0, g0, x);
  tb_copy(&b, s_gpu0, x, g0);
  tb_write(&b);
  expect_open_error(b.dir, "kernels/sm_90.cubin: cannot open");
  tb_cleanup(&b);
}
END_TEST

/* A GPU keeps its records waited on by another backend and its waits on
 * another backend's events on one stream: spread over two, the driver's
 * shared callback thread could hold one behind the other for good. */
START_TEST(cross_backend_sync_on_one_stream) {
  tb b;
  uint32_t s_cpu, s_gpu0, x, g0, g1;
  copy_reach_plan(&b, &s_cpu, &s_gpu0, &x, &g0, &g1);
  uint32_t s_main = tb_stream(&b, "main", b.streams[s_gpu0].device);
  tb_copy(&b, s_gpu0, x, g0);
  tb_wait(&b, s_cpu, tb_record(&b, s_gpu0)); /* the cpu waits on gpu0.copy */
  tb_wait(&b, s_main, tb_record(&b, s_cpu)); /* gpu0.main waits on the cpu */
  tb_write(&b);
  expect_open_error(b.dir, "/plan.ds4p: device 'gpu0' (cuda) synchronises with devices of other backends on "
                           "streams 'copy' and 'main'; such records and waits must all be on one stream of "
                           "the device");
  tb_cleanup(&b);

  /* The same on one stream passes the check (and stops at the missing
   * code object file). */
  copy_reach_plan(&b, &s_cpu, &s_gpu0, &x, &g0, &g1);
  tb_copy(&b, s_gpu0, x, g0);
  tb_wait(&b, s_cpu, tb_record(&b, s_gpu0));
  tb_wait(&b, s_gpu0, tb_record(&b, s_cpu));
  tb_write(&b);
  expect_open_error(b.dir, "kernels/sm_90.cubin: cannot open");
  tb_cleanup(&b);
}
END_TEST

/* ---- the cpu backend's events -------------------------------------------- */

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void nap_ns(long ns) {
  struct timespec t = {ns / 1000000000, ns % 1000000000};
  nanosleep(&t, NULL);
}

/* Plays another backend's executor: after a delay, publishes a generation
 * of its event the way rt_event_base asks (release store, then notify). */
typedef struct foreign_setter {
  rt_event_base *ev;
  rt_sync *sync;
  long delay_ns;
  uint64_t gen;
  uint64_t set_at; /* CLOCK_MONOTONIC ns, just before the store */
} foreign_setter;

static void *set_later(void *arg) {
  foreign_setter *f = arg;
  nap_ns(f->delay_ns);
  f->set_at = now_ns();
  atomic_store_explicit(&f->ev->host_gen, f->gen, memory_order_release);
  rt_sync_notify(f->sync);
  return NULL;
}

/* A cpu stream waits on an event of another backend through its
 * host_gen; a cpu event is that header, its counter host_gen. */
START_TEST(cpu_waits_on_foreign_event) {
  static const rt_backend fake_gpu = {.name = "fake-gpu"};
  rt_event_base foreign = {.be = &fake_gpu};
  atomic_init(&foreign.host_gen, 0);
  rt_sync sync;
  ck_assert_ptr_null(rt_sync_init(&sync));
  const rt_backend *be = &rt_cpu_backend;
  rt_device_options o = {.name = "cpu0", .threads = 1, .sync = &sync};
  rt_device *d;
  rt_stream *s;
  rt_event *mine;
  ck_assert_ptr_null(be->device_open(&o, &d));
  ck_assert_ptr_null(be->stream_create(d, 16, &s));
  ck_assert_ptr_null(be->event_create(d, 1, &mine));
  rt_event_base *mine_base = (rt_event_base *)mine;
  ck_assert_ptr_eq(mine_base->be, &rt_cpu_backend);
  ck_assert_uint_eq(atomic_load(&mine_base->host_gen), 0);

  /* wait(foreign, 3), timestamp, record(mine, 3); the foreign event
   * reaches 3 some 50 ms later. */
  uint64_t stamp = 0;
  ck_assert_ptr_null(be->event_wait(s, (rt_event *)&foreign, 3));
  ck_assert_ptr_null(be->timestamp(s, &stamp));
  ck_assert_ptr_null(be->event_record(s, mine, 3));
  ck_assert_ptr_null(be->stream_flush(s));
  foreign_setter f = {.ev = &foreign, .sync = &sync, .delay_ns = 50000000, .gen = 3};
  pthread_t th;
  ck_assert_int_eq(pthread_create(&th, NULL, set_later, &f), 0);
  nap_ns(20000000);
  uint64_t held = atomic_load(&mine_base->host_gen);
  if (atomic_load(&foreign.host_gen) == 0) ck_assert_uint_eq(held, 0);
  ck_assert_ptr_null(be->stream_sync(s));
  ck_assert_int_eq(pthread_join(th, NULL), 0);
  ck_assert_msg(stamp >= f.set_at, "the stream went on %lld ns before the foreign event was set",
                (long long)(f.set_at - stamp));
  ck_assert_uint_eq(atomic_load(&mine_base->host_gen), 3);

  /* A generation already reached does not hold the stream. */
  ck_assert_ptr_null(be->event_wait(s, (rt_event *)&foreign, 2));
  ck_assert_ptr_null(be->event_record(s, mine, 4));
  ck_assert_ptr_null(be->stream_sync(s));
  ck_assert_uint_eq(atomic_load(&mine_base->host_gen), 4);

  /* A foreign event that never arrives: poisoning releases the stream. */
  ck_assert_ptr_null(be->event_wait(s, (rt_event *)&foreign, 5));
  ck_assert_ptr_null(be->event_record(s, mine, 5));
  ck_assert_ptr_null(be->stream_flush(s));
  nap_ns(10000000);
  rt_sync_poison(&sync, rt_status_make("stopped by the test"));
  ck_assert_ptr_null(be->stream_sync(s));
  ck_assert_uint_eq(atomic_load(&mine_base->host_gen), 4); /* skipped, not run */
  rt_status e = rt_sync_take(&sync);
  ck_assert_str_eq(rt_status_msg(e), "stopped by the test");
  rt_status_free(e);

  /* Only the owner records: a cpu stream refuses another backend's event. */
  e = be->event_record(s, (rt_event *)&foreign, 6);
  ck_assert_ptr_nonnull(e);
  ck_assert_str_eq(rt_status_msg(e), "cpu device cpu0: cannot record an event of backend "
                                     "'fake-gpu'");
  rt_status_free(e);
  ck_assert_uint_eq(atomic_load(&foreign.host_gen), 3);

  be->event_destroy(mine);
  be->stream_destroy(s);
  be->device_close(d);
  rt_sync_destroy(&sync);
}
END_TEST

/* ---- the seeded generator ----------------------------------------------- */

static double bf16_value(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

static double f16_value(uint16_t h) {
  int e = (h >> 10) & 31, m = h & 1023;
  double v = e ? ldexp(1024 + m, e - 25) : ldexp(m, -24);
  return h & 0x8000 ? -v : v;
}

START_TEST(init_values) {
  tb b;
  tb_init(&b);
  uint32_t d = tb_device(&b, "cpu0", 1);
  tb_stream(&b, "main", d);
  tb_io(&b);
  uint32_t w = tb_tensor(&b, "layers.0.w", PLAN_F32, PLAN_WEIGHT, d, 4096);
  uint32_t w2 = tb_tensor(&b, "layers.1.w", PLAN_F32, PLAN_WEIGHT, d, 4096);
  uint32_t wb = tb_tensor(&b, "wb", PLAN_BF16, PLAN_WEIGHT, d, 1024);
  uint32_t wh = tb_tensor(&b, "wh", PLAN_F16, PLAN_WEIGHT, d, 1024);
  uint32_t wi = tb_tensor(&b, "wi", PLAN_I32, PLAN_WEIGHT, d, 1024);
  uint32_t st = tb_tensor(&b, "state", PLAN_F32, PLAN_STATE, d, 256);
  b.tensors[w].init_offset = 1.0;
  b.tensors[w].init_scale = 0.1;
  b.tensors[wb].init_scale = 3.0;
  b.tensors[wh].init_scale = 0.01;
  b.tensors[wi].init_scale = 100.0;
  const plan *p = &b.p;

  double lo = 2, hi = 0, sum = 0;
  for (uint64_t i = 0; i < 4096; i++) {
    double v = rt_init_value(p, w, 99, i);
    ck_assert(v >= 0.9 && v < 1.1);
    ck_assert(v == rt_init_value(p, w, 99, i)); /* deterministic */
    lo = fmin(lo, v);
    hi = fmax(hi, v);
    sum += v;
  }
  /* Spread over the range, centred on the offset. */
  ck_assert(lo < 0.905 && hi > 1.095);
  ck_assert(fabs(sum / 4096 - 1.0) < 0.01);
  /* Name and seed change the stream; the dtype and index order do not. */
  int same_name = 0, same_seed = 0;
  for (uint64_t i = 0; i < 64; i++) {
    same_name += fabs((rt_init_value(p, w, 99, i) - 1.0) / 0.1 - rt_init_value(p, w2, 99, i)) < 1e-9;
    same_seed += rt_init_value(p, w, 99, i) == rt_init_value(p, w, 100, i);
  }
  ck_assert_int_lt(same_name, 2);
  ck_assert_int_lt(same_seed, 2);

  /* The bundle fills weights with these values, rounded to the dtype. */
  tb_write(&b);
  rt_options opts = {.weight_seed = 77};
  rt_bundle *bd;
  rt_status s = rt_bundle_open(b.dir, &opts, &bd);
  ck_assert_msg(s == NULL, "%s", rt_status_msg(s));
  float fv[4096];
  ck_assert_ptr_null(rt_tensor_read(bd, w, fv, sizeof fv));
  for (uint64_t i = 0; i < 4096; i++) ck_assert(fv[i] == (float)rt_init_value(p, w, 77, i));
  uint16_t hv[1024];
  ck_assert_ptr_null(rt_tensor_read(bd, wb, hv, sizeof hv));
  for (uint64_t i = 0; i < 1024; i++) {
    double v = rt_init_value(p, wb, 77, i), got = bf16_value(hv[i]);
    int e;
    frexp(v, &e);
    ck_assert_msg(fabs(got - v) <= ldexp(1.0, e - 9), "bf16 %g -> %g", v, got); /* half an ulp */
  }
  ck_assert_ptr_null(rt_tensor_read(bd, wh, hv, sizeof hv));
  for (uint64_t i = 0; i < 1024; i++) {
    double v = rt_init_value(p, wh, 77, i), got = f16_value(hv[i]);
    int e;
    frexp(v, &e);
    if (e < -13) e = -13; /* subnormal spacing 2^-24 */
    ck_assert_msg(fabs(got - v) <= ldexp(1.0, e - 12), "f16 %g -> %g", v, got);
  }
  int32_t iv[1024];
  ck_assert_ptr_null(rt_tensor_read(bd, wi, iv, sizeof iv));
  for (uint64_t i = 0; i < 1024; i++) ck_assert_int_eq(iv[i], (int32_t)rt_init_value(p, wi, 77, i));
  float sv[256];
  ck_assert_ptr_null(rt_tensor_read(bd, st, sv, sizeof sv));
  for (int i = 0; i < 256; i++) ck_assert(sv[i] == 0.0f);
  rt_bundle_close(bd);

  /* Without an override the plan's seed is used. */
  ck_assert_ptr_null(rt_bundle_open(b.dir, NULL, &bd));
  ck_assert_ptr_null(rt_tensor_read(bd, w, fv, sizeof fv));
  ck_assert(fv[5] == (float)rt_init_value(p, w, p->info.weight_seed, 5));
  rt_bundle_close(bd);
  tb_cleanup(&b);
}
END_TEST

/* A view holds exactly its source's generated bytes at the mapped rows: an
 * expert-style slice (experts 3, 0, 2) of a source on no device, and a
 * replica (no rows) on another device of a resident bf16 weight. */
START_TEST(weight_views) {
  enum { E = 4, ROW = 3 * 5 }; /* experts of [3, 5] values each */
  tb b;
  tb_init(&b);
  uint32_t d0 = tb_device(&b, "cpu0", 1), d1 = tb_device(&b, "cpu1", 1);
  tb_stream(&b, "main", d0);
  tb_io(&b);
  const uint64_t edims[] = {E, 3, 5}, wdims[] = {6, 7};
  uint32_t experts =
      tb_tensor_nd(&b, "layers.0.experts", PLAN_F32, PLAN_WEIGHT, PLAN_NONE, 3, edims);
  b.tensors[experts].init_offset = 0.5;
  b.tensors[experts].init_scale = 2.0;
  uint32_t w = tb_tensor_nd(&b, "layers.0.w", PLAN_BF16, PLAN_WEIGHT, d0, 2, wdims);
  b.tensors[w].init_scale = 3.0;
  const uint32_t owned[3] = {3, 0, 2};
  uint32_t slice = tb_view(&b, "layers.0.experts@cpu1", experts, d1, owned, 3);
  uint32_t replica = tb_view(&b, "layers.0.w@cpu1", w, d1, NULL, 0);
  tb_write(&b);
  rt_options opts = {.weight_seed = 5};
  rt_bundle *bd;
  rt_status s = rt_bundle_open(b.dir, &opts, &bd);
  ck_assert_msg(s == NULL, "%s", rt_status_msg(s));
  const plan *p = rt_bundle_plan(bd);

  float got[3 * ROW];
  ck_assert_ptr_null(rt_tensor_read(bd, slice, got, sizeof got));
  for (uint32_t r = 0; r < 3; r++)
    for (uint32_t k = 0; k < ROW; k++) {
      double want = rt_init_value(p, experts, 5, owned[r] * ROW + k);
      ck_assert_msg(got[r * ROW + k] == (float)want, "slice row %u [%u]: got %g, want %g", r, k,
                    (double)got[r * ROW + k], want);
      ck_assert(rt_init_value(p, slice, 5, r * ROW + k) == want);
    }
  /* Row 0 is expert 3, not expert 0: the rows list is honoured. */
  ck_assert(got[0] != (float)rt_init_value(p, experts, 5, 0));

  uint16_t src[6 * 7], rep[6 * 7];
  ck_assert_ptr_null(rt_tensor_read(bd, w, src, sizeof src));
  ck_assert_ptr_null(rt_tensor_read(bd, replica, rep, sizeof rep));
  ck_assert_mem_eq(src, rep, sizeof src);
  for (uint64_t i = 0; i < 6 * 7; i++)
    ck_assert(rt_init_value(p, replica, 5, i) == rt_init_value(p, w, 5, i));

  /* The source has no device: no host copies in or out. */
  s = rt_tensor_read(bd, experts, got, sizeof(float));
  ck_assert_ptr_nonnull(s);
  ck_assert_str_eq(rt_status_msg(s), "rt_tensor_read: tensor layers.0.experts is not resident "
                                     "(device none): its values live only in its views");
  rt_status_free(s);
  s = rt_tensor_write(bd, experts, got, sizeof(float));
  ck_assert_ptr_nonnull(s);
  ck_assert_ptr_nonnull(strstr(rt_status_msg(s), "rt_tensor_write: tensor layers.0.experts is "
                                                 "not resident"));
  rt_status_free(s);
  rt_bundle_close(bd);
  tb_cleanup(&b);
}
END_TEST

/* The least E8M0 scale s whose 2^(s-127) times the format's largest value
 * reaches bound, clamped to [0, 254]: the generator's choice, by search. */
static int scale_for(double bound, double max) {
  for (int s = 0; s < 254; s++)
    if (max * pow(2.0, s - 127) >= bound) return s;
  return 254;
}

/* Every element of generated quantized weight t (read back as `bytes`):
 * its block's scale byte is the generator's, its code is never NaN and is
 * the nearest to rt_init_value / 2^(s-127), ties to the even code; the
 * padding is zero; rt_weight_values gives what the bytes hold. */
static void expect_generated(rt_bundle *bd, uint32_t t, uint64_t seed, const uint8_t *bytes) {
  const plan *p = rt_bundle_plan(bd);
  const plan_tensor *pt = &p->tensors[t], *w = pt->view_of == PLAN_NONE ? pt : &p->tensors[pt->view_of];
  int fp8 = pt->dtype == PLAN_F8E4M3;
  plan_quant q;
  ck_assert_ptr_null(plan_quant_of(pt->dtype, pt->ndim, pt->dim, &q));
  int s = scale_for(fabs(w->init_offset) + fabs(w->init_scale), fp8 ? 448.0 : 6.0);
  uint64_t per = q.rows * q.cols, nscale = q.scale_rows * q.scale_cols;
  for (uint64_t m = 0; m < q.nmat; m++) {
    const uint8_t *mat = bytes + m * q.stride;
    /* (a check per element would write to Check's pipe per element) */
    for (uint64_t k = 0; k < nscale; k++)
      if (mat[q.data_bytes + k] != s) ck_abort_msg("matrix %llu scale %llu is %d, want %d", (unsigned long long)m,
                                                   (unsigned long long)k, mat[q.data_bytes + k], s);
    for (uint64_t k = q.data_bytes + nscale; k < q.stride; k++)
      if (mat[k]) ck_abort_msg("matrix %llu: padding byte %llu is %d", (unsigned long long)m, (unsigned long long)k, mat[k]);
  }
  uint64_t n = q.nmat * per;
  double *vals = malloc(n * sizeof *vals);
  rt_status st = rt_weight_values(bd, t, 0, n, vals);
  ck_assert_msg(st == NULL, "%s", rt_status_msg(st));
  double unit = pow(2.0, s - 127);
  for (uint64_t i = 0; i < n; i++) {
    uint64_t m = i / per, e = i % per;
    const uint8_t *mat = bytes + m * q.stride;
    uint8_t code = fp8 ? mat[e] : (e % 2 ? mat[e / 2] >> 4 : mat[e / 2] & 15);
    double got = fp8 ? plan_f8e4m3_value(code) : plan_fp4_value(code);
    if (isnan(got)) ck_abort_msg("%s element %llu: a NaN code", plan_str(p, pt->name), (unsigned long long)i);
    if (vals[i] != got * unit || vals[i] != plan_quant_element(pt->dtype, &q, bytes, i))
      ck_abort_msg("%s element %llu: rt_weight_values %a, the bytes hold %a", plan_str(p, pt->name),
                   (unsigned long long)i, vals[i], got * unit);
    double x = rt_init_value(p, t, seed, i) / unit, d = fabs(got - x), max = fp8 ? 448.0 : 6.0;
    if (fabs(x) >= max) { /* saturated (448 < x < 464 rounds there too) */
      if (got != copysign(max, x))
        ck_abort_msg("%s element %llu: %a coded %a", plan_str(p, pt->name), (unsigned long long)i, x, got);
      continue;
    }
    for (unsigned c = 0; c < (fp8 ? 256u : 16u); c++) {
      double other = fp8 ? plan_f8e4m3_value((uint8_t)c) : plan_fp4_value((uint8_t)c);
      if (isnan(other) || other == got) continue;
      double od = fabs(other - x);
      if (!(od > d || (od == d && (code & 1) == 0)))
        ck_abort_msg("%s element %llu: %a / 2^%d = %a coded %a, but %a is nearer or an even tie",
                     plan_str(p, pt->name), (unsigned long long)i, rt_init_value(p, t, seed, i), s - 127, x, got,
                     other);
    }
  }
  free(vals);
}

/* Generated f8e4m3 and mxfp4 weights: valid codes and scales from the
 * values of rt_init_value, the same bytes every open, views holding their
 * source's matrices; ranges that round to zero or saturate at every scale
 * the E8M0 byte allows. */
START_TEST(quantized_generator) {
  tb b;
  tb_init(&b);
  uint32_t d0 = tb_device(&b, "cpu0", 2), d1 = tb_device(&b, "cpu1", 1);
  tb_stream(&b, "main", d0);
  tb_io(&b);
  const uint64_t d8[] = {300, 260}, d4[] = {4, 70, 66}, dsmall[] = {3, 130};
  uint32_t q8 = tb_tensor_nd(&b, "layers.0.q8", PLAN_F8E4M3, PLAN_WEIGHT, d0, 2, d8);
  b.tensors[q8].init_offset = 0.5;
  b.tensors[q8].init_scale = 0.25;
  uint32_t q4 = tb_tensor_nd(&b, "layers.0.q4", PLAN_MXFP4, PLAN_WEIGHT, d0, 3, d4);
  b.tensors[q4].init_scale = 100.0;
  const uint32_t owned[2] = {3, 0};
  uint32_t q4v = tb_view(&b, "layers.0.q4@cpu1", q4, d1, owned, 2);
  uint32_t q8r = tb_view(&b, "layers.0.q8@cpu1", q8, d1, NULL, 0);
  uint32_t tiny = tb_tensor_nd(&b, "tiny", PLAN_F8E4M3, PLAN_WEIGHT, d1, 2, dsmall);
  b.tensors[tiny].init_scale = 0x1p-133; /* scale 0 (clamped): subnormal codes and zeros */
  uint32_t huge = tb_tensor_nd(&b, "huge", PLAN_F8E4M3, PLAN_WEIGHT, d1, 2, dsmall);
  b.tensors[huge].init_scale = 1e300; /* scale 254: every code saturates at 448 */
  uint32_t zero = tb_tensor_nd(&b, "zero", PLAN_MXFP4, PLAN_WEIGHT, d1, 2, dsmall);
  b.tensors[zero].init_scale = 0.0;
  uint32_t h4 = tb_tensor_nd(&b, "huge4", PLAN_MXFP4, PLAN_WEIGHT, d1, 2, dsmall);
  b.tensors[h4].init_offset = -1e200;
  b.tensors[h4].init_scale = 1e199;
  uint32_t inf8 = tb_tensor_nd(&b, "inf8", PLAN_F8E4M3, PLAN_WEIGHT, d1, 2, dsmall);
  b.tensors[inf8].init_offset = -INFINITY; /* every value -inf: every code -448 */
  uint32_t inf4 = tb_tensor_nd(&b, "inf4", PLAN_MXFP4, PLAN_WEIGHT, d1, 2, dsmall);
  b.tensors[inf4].init_offset = INFINITY; /* every code +6 */
  tb_write(&b);

  uint8_t *bytes[10], *again = malloc(b.tensors[q8].bytes);
  const uint32_t ts[] = {q8, q4, q4v, q8r, tiny, huge, zero, h4, inf8, inf4};
  rt_bundle *bd;
  for (int open = 0; open < 2; open++) {
    rt_status s = rt_bundle_open(b.dir, &(rt_options){.weight_seed = 9}, &bd);
    ck_assert_msg(s == NULL, "%s", rt_status_msg(s));
    for (size_t k = 0; k < sizeof ts / sizeof ts[0]; k++) {
      size_t n = b.tensors[ts[k]].bytes;
      uint8_t *buf = open ? again : (bytes[k] = malloc(n));
      ck_assert_ptr_null(rt_tensor_read(bd, ts[k], buf, n));
      if (open) ck_assert_msg(memcmp(buf, bytes[k], n) == 0, "%s differs between opens", plan_str(&b.p, b.tensors[ts[k]].name));
    }
    if (!open)
      for (size_t k = 0; k < sizeof ts / sizeof ts[0]; k++) expect_generated(bd, ts[k], 9, bytes[k]);
    rt_bundle_close(bd);
  }
  /* the scales the bounds ask for: 0.75 / 448, 100 / 6, and the ends */
  ck_assert_int_eq(bytes[0][300 * 260], 118);
  ck_assert_int_eq(bytes[1][70 * 33], 132);
  ck_assert_int_eq(bytes[4][3 * 130], 0);
  ck_assert_int_eq(bytes[5][3 * 130], 254);
  ck_assert_int_eq(bytes[6][3 * 65], 0);
  ck_assert_int_eq(bytes[7][3 * 65], 254);
  int subnormals = 0, sat = 0, zero4 = 0, sat4 = 0;
  for (int k = 0; k < 3 * 130; k++) {
    subnormals += (bytes[4][k] & 0x78) == 0 && (bytes[4][k] & 7) != 0;
    sat += bytes[5][k] == 0x7e || bytes[5][k] == 0xfe;
  }
  for (int k = 0; k < 3 * 65; k++) {
    zero4 += bytes[6][k] == 0;
    sat4 += bytes[7][k] == 0xff; /* -6, both nibbles */
  }
  ck_assert_int_gt(subnormals, 3 * 130 / 2);
  ck_assert_int_eq(sat, 3 * 130);
  ck_assert_int_eq(zero4, 3 * 65);
  ck_assert_int_eq(sat4, 3 * 65);
  /* views hold their source's matrices: experts 3 and 0, a replica */
  uint64_t stride = plan_row_bytes(PLAN_MXFP4, 3, d4);
  ck_assert_uint_eq(stride, 70 * 33 + 70 * 3 + 8); /* 2310 code bytes, 210 scales, padding */
  ck_assert_mem_eq(bytes[2], bytes[1] + 3 * stride, stride);
  ck_assert_mem_eq(bytes[2] + stride, bytes[1], stride);
  ck_assert_mem_eq(bytes[3], bytes[0], b.tensors[q8].bytes);
  /* another seed, other codes */
  ck_assert_ptr_null(rt_bundle_open(b.dir, &(rt_options){.weight_seed = 10}, &bd));
  ck_assert_ptr_null(rt_tensor_read(bd, q8, again, b.tensors[q8].bytes));
  ck_assert(memcmp(again, bytes[0], 300 * 260) != 0);
  rt_bundle_close(bd);
  for (size_t k = 0; k < sizeof ts / sizeof ts[0]; k++) free(bytes[k]);
  free(again);

  /* the live bytes of a step: whole matrices of a 3-D one, all of a 2-D one */
  const uint64_t d3[] = {4, 128, 64}, d2[] = {4, 64};
  uint32_t l3 = tb_tensor_nd(&b, "live3", PLAN_F8E4M3, PLAN_WEIGHT, d0, 3, d3);
  uint32_t l2 = tb_tensor_nd(&b, "live2", PLAN_MXFP4, PLAN_WEIGHT, d0, 2, d2);
  ck_assert_uint_eq(rt_live_bytes(&b.p, l3, 3), 3 * 8208); /* 8192 codes + 1 scale, padded */
  ck_assert_uint_eq(rt_live_bytes(&b.p, l2, 1), b.tensors[l2].bytes);
  tb_cleanup(&b);
}
END_TEST

/* tiny-moe with its attention and FFN matrices f8e4m3 and its experts
 * mxfp4, from the generator: ds4run --check's float64 reference reads the
 * quantized values exactly and passes, and two schedules (one holding the
 * experts as views on two devices) give the same outputs. */
START_TEST(quantized_check) {
  tu_chdir_source();
  char *model = tu_slurp("models/tiny-moe.yaml", NULL);
  static const char *const matrices[][2] = {
      {"wq, shape: [heads*head_dim, hidden], dtype: f32", "f8e4m3"},
      {"wo, shape: [hidden, heads*head_dim], dtype: f32", "f8e4m3"},
      {"w1, shape: [experts, expert_ffn, hidden], dtype: f32", "mxfp4"},
      {"w3, shape: [experts, expert_ffn, hidden], dtype: f32", "mxfp4"},
      {"w2, shape: [experts, hidden, expert_ffn], dtype: f32", "mxfp4"},
      {"shared_w2, shape: [hidden, shared_ffn], dtype: f32", "f8e4m3"},
  };
  for (size_t k = 0; k < sizeof matrices / sizeof matrices[0]; k++) {
    char to[128];
    snprintf(to, sizeof to, "%.*s%s", (int)strlen(matrices[k][0]) - 3, matrices[k][0], matrices[k][1]);
    char *next = tu_replace_once(model, matrices[k][0], to);
    free(model);
    model = next;
  }
  char dir[] = "/tmp/ds4-rt-quant-XXXXXX", path[256], cmd[1024], *out;
  tu_tmpdir_make(dir);
  snprintf(path, sizeof path, "%s/tiny-q.yaml", dir);
  tu_write_text(path, model);
  free(model);
  char sha[2][96] = {{0}};
  const char *schedules[2] = {"tiny-1dev", "tiny-hotcold"};
  for (int k = 0; k < 2; k++) {
    snprintf(cmd, sizeof cmd, "%s/ds4c compile %s schedules/%s.yaml -o %s/%s", tu_build_dir(), path, schedules[k],
             dir, schedules[k]);
    int rc = tu_run(cmd, &out);
    ck_assert_msg(rc == 0, "%s:\n%s", cmd, out);
    free(out);
    snprintf(cmd, sizeof cmd, "%s/ds4run %s/%s --steps 4 --check", tu_build_dir(), dir, schedules[k]);
    rc = tu_run(cmd, &out);
    ck_assert_msg(rc == 0, "%s:\n%s", cmd, out);
    ck_assert_msg(strstr(out, "0 token mismatches: PASS") != NULL, "%s", out);
    const char *h = strstr(out, "outputs sha256: ");
    ck_assert_ptr_nonnull(h);
    snprintf(sha[k], sizeof sha[k], "%.80s", h);
    free(out);
  }
  ck_assert_str_eq(sha[0], sha[1]);
  tu_tmpdir_remove(dir);
}
END_TEST

/* ---- rt_generate ------------------------------------------------------- */

typedef struct seen_steps {
  int n;
  int32_t step[16][4];
  int32_t ids[16][4];
  int fail_at;
} seen_steps;

static rt_status record_hook(void *ctx, rt_bundle *b, const int32_t step[4], const int32_t *ids) {
  (void)b;
  seen_steps *s = ctx;
  if (s->n == s->fail_at) return rt_status_make("hook refuses step %d", s->n);
  memcpy(s->step[s->n], step, sizeof s->step[0]);
  memcpy(s->ids[s->n], ids, sizeof s->ids[0]);
  s->n++;
  return NULL;
}

static void generate_plan(tb *b) {
  tb_init(b);
  tb_param(b, "vocab", 1000);
  uint32_t d = tb_device(b, "cpu0", 1), s = tb_stream(b, "main", d);
  tb_io(b);
  uint32_t seen = tb_tensor(b, "seen", PLAN_I32, PLAN_OUTPUT, d, 4);
  tb_launch(b, s, tb_kernel(b, "t_next", 1, 3), b->p.info.ids_tensor, b->p.info.next_tensor, seen);
  tb_write(b);
}

START_TEST(generate_chunks) {
  tb b;
  generate_plan(&b);
  rt_bundle *bd = open_ok(b.dir, NULL);
  int32_t prompt[10] = {5, 9, 2, 7, 11, 13, 17, 19, 23, 29};
  seen_steps ss = {.fail_at = -1};
  rt_report r;
  rt_status s = rt_generate(bd, prompt, 10, 3, record_hook, &ss, &r);
  ck_assert_msg(s == NULL, "%s", rt_status_msg(s));
  ck_assert_int_eq(r.steps, 6);
  ck_assert_int_eq(ss.n, 6);
  ck_assert_int_eq(r.tokens, 4 + 4 + 2 + 3);
  /* pos, ntok and the first slot asked for (step[3]): none of the first two
   * chunks, the prompt's last position in the third, a decode step's one. */
  const int32_t want_step[6][3] = {{0, 4, 4}, {4, 4, 4}, {8, 2, 1}, {10, 1, 0}, {11, 1, 0}, {12, 1, 0}};
  rt_sha256_ctx c;
  rt_sha256_init(&c);
  for (int i = 0; i < 6; i++) {
    ck_assert_int_eq(ss.step[i][0], want_step[i][0]);
    ck_assert_int_eq(ss.step[i][1], want_step[i][1]);
    ck_assert_int_eq(ss.step[i][2], i);
    ck_assert_int_eq(ss.step[i][3], want_step[i][2]);
    int32_t next[4], shown[4];
    for (int t = 0; t < 4; t++) {
      int live = t < want_step[i][1];
      int32_t want_id = !live ? 0 : i < 3 ? prompt[want_step[i][0] + t] : 29 + (i - 2);
      ck_assert_int_eq(ss.ids[i][t], want_id);
      next[t] = live ? want_id + 1 : -1;
      shown[t] = ss.step[i][t];
    }
    /* The outputs in plan order, next then seen (the step block as the
     * kernel read it), each [tokens]: the asked slots' values only, from
     * step[3] to the last live one (none of the first two chunks). */
    int asked = want_step[i][2], nasked = want_step[i][1] - asked;
    if (nasked == 0) continue;
    rt_sha256_update(&c, next + asked, (size_t)nasked * sizeof *next);
    rt_sha256_update(&c, shown + asked, (size_t)nasked * sizeof *shown);
  }
  uint8_t want[32];
  rt_sha256_final(&c, want);
  ck_assert_mem_eq(r.outputs_sha256, want, 32);
  ck_assert_int_eq(r.ngenerated, 4);
  for (int i = 0; i < 4; i++) ck_assert_int_eq(r.generated[i], 30 + i);
  ck_assert(r.seconds_total > 0 && r.seconds_median > 0 && r.seconds_median <= r.seconds_total);
  free(r.generated);

  rt_report r2;
  /* With every_position, every prefill step asks for all its slots. */
  rt_bundle *every = NULL;
  s = rt_bundle_open(b.dir, &(rt_options){.every_position = 1}, &every);
  ck_assert_msg(s == NULL, "%s", rt_status_msg(s));
  seen_steps se = {.fail_at = -1};
  ck_assert_ptr_null(rt_generate(every, prompt, 10, 3, record_hook, &se, &r2));
  ck_assert_int_eq(se.n, 6);
  for (int i = 0; i < 6; i++) ck_assert_int_eq(se.step[i][3], 0);
  ck_assert(memcmp(r2.outputs_sha256, want, 32) != 0); /* seen holds step[3] */
  ck_assert_int_eq(r2.ngenerated, 4);
  for (int i = 0; i < 4; i++) ck_assert_int_eq(r2.generated[i], 30 + i);
  free(r2.generated);
  rt_bundle_close(every);

  /* Same inputs, same bytes; another token in a row no step asks for
   * (this kernel's outputs of a slot depend on that slot's id alone), the
   * same hash; another last prompt token, another hash. */
  ck_assert_ptr_null(rt_generate(bd, prompt, 10, 3, NULL, NULL, &r2));
  ck_assert_mem_eq(r2.outputs_sha256, want, 32);
  free(r2.generated);
  prompt[3] = 8;
  ck_assert_ptr_null(rt_generate(bd, prompt, 10, 3, NULL, NULL, &r2));
  ck_assert_mem_eq(r2.outputs_sha256, want, 32);
  free(r2.generated);
  prompt[9] = 31;
  ck_assert_ptr_null(rt_generate(bd, prompt, 10, 3, NULL, NULL, &r2));
  ck_assert(memcmp(r2.outputs_sha256, want, 32) != 0);
  free(r2.generated);

  /* A prompt of exactly one chunk, no decode. */
  ck_assert_ptr_null(rt_generate(bd, prompt, 4, 0, NULL, NULL, &r2));
  ck_assert_int_eq(r2.steps, 1);
  ck_assert_int_eq(r2.ngenerated, 1);
  ck_assert_int_eq(r2.generated[0], prompt[3] + 1);
  free(r2.generated);

  /* Errors: a hook that refuses, positions past max_seq, ids past vocab. */
  seen_steps fail = {.fail_at = 4};
  s = rt_generate(bd, prompt, 10, 3, record_hook, &fail, &r2);
  ck_assert_ptr_nonnull(s);
  ck_assert_str_eq(rt_status_msg(s), "hook refuses step 4");
  ck_assert_ptr_null(r2.generated);
  rt_status_free(s);
  s = rt_generate(bd, prompt, 10, 60, NULL, NULL, &r2);
  ck_assert_ptr_nonnull(s);
  ck_assert_ptr_nonnull(strstr(rt_status_msg(s), "max_seq"));
  rt_status_free(s);
  prompt[2] = 1000;
  s = rt_generate(bd, prompt, 10, 1, NULL, NULL, &r2);
  ck_assert_ptr_nonnull(s);
  ck_assert_ptr_nonnull(strstr(rt_status_msg(s), "outside the vocabulary"));
  rt_status_free(s);
  s = rt_generate(bd, prompt, 0, 1, NULL, NULL, &r2);
  ck_assert_ptr_nonnull(s);
  rt_status_free(s);

  /* The default prompt: prefill tokens below vocab, the same every time. */
  int32_t *ids, *ids2;
  int n, n2;
  ck_assert_ptr_null(rt_default_prompt(rt_bundle_plan(bd), &ids, &n));
  ck_assert_ptr_null(rt_default_prompt(rt_bundle_plan(bd), &ids2, &n2));
  ck_assert_int_eq(n, 10);
  ck_assert_int_eq(n2, 10);
  ck_assert_mem_eq(ids, ids2, 10 * sizeof *ids);
  int distinct = 0;
  for (int i = 0; i < n; i++) {
    ck_assert(ids[i] >= 0 && ids[i] < 1000);
    distinct += i == 0 || ids[i] != ids[i - 1];
  }
  ck_assert_int_gt(distinct, 5);
  free(ids);
  free(ids2);
  rt_bundle_close(bd);
  tb_cleanup(&b);
}
END_TEST


/* ---- tracing ------------------------------------------------------------ */

static rt_bundle *open_traced(const char *dir, const rt_fault *fault) {
  rt_options o = {.trace = 1};
  rt_bundle *bd = NULL;
  rt_status s = rt_bundle_open_faulty(dir, &o, fault, &bd);
  ck_assert_msg(s == NULL, "rt_bundle_open (trace): %s", rt_status_msg(s));
  return bd;
}

static int timed(const plan_command *c) {
  return c->kind == PLAN_CMD_LAUNCH || c->kind == PLAN_CMD_COPY;
}

/* The last launch or copy on `stream` before plan command `before`. */
static uint32_t timed_before(const plan *p, uint32_t stream, uint32_t before) {
  uint32_t found = PLAN_NONE;
  for (uint32_t i = 0; i < before; i++)
    if (p->commands[i].stream == stream && timed(&p->commands[i])) found = i;
  return found;
}

/* The first launch or copy on `stream` after plan command `after`. */
static uint32_t timed_after(const plan *p, uint32_t stream, uint32_t after) {
  for (uint32_t i = after + 1; i < p->ncommands; i++)
    if (p->commands[i].stream == stream && timed(&p->commands[i])) return i;
  return PLAN_NONE;
}

/* One step's trace against the plan: every launch and copy has
 * prev_end < start <= end, other commands have no times, a stream's commands
 * follow one another without overlap, and the first command behind a WAIT
 * starts no earlier than the end of the last one before the RECORD it waits
 * for. Returns the number of such waits checked; *out_end is the step's
 * last end. */
static int check_trace(rt_bundle *bd, uint64_t prev_end, uint64_t *out_end) {
  const plan *p = rt_bundle_plan(bd);
  const uint64_t *start, *end;
  rt_status s = rt_trace_last_step(bd, &start, &end);
  ck_assert_msg(s == NULL, "rt_trace_last_step: %s", rt_status_msg(s));
  uint64_t last = 0;
  for (uint32_t i = 0; i < p->ncommands; i++) {
    if (!timed(&p->commands[i])) {
      ck_assert_msg(start[i] == 0 && end[i] == 0, "command %u (kind %u) has times", i,
                    p->commands[i].kind);
      continue;
    }
    ck_assert_msg(start[i] > prev_end, "command %u starts at %llu, before the previous step "
                  "ended (%llu)", i, (unsigned long long)start[i], (unsigned long long)prev_end);
    ck_assert_msg(start[i] <= end[i], "command %u: start %llu > end %llu", i,
                  (unsigned long long)start[i], (unsigned long long)end[i]);
    if (end[i] > last) last = end[i];
    uint32_t prev = timed_before(p, p->commands[i].stream, i);
    if (prev != PLAN_NONE)
      ck_assert_msg(end[prev] <= start[i], "stream %u: command %u starts %lld ns before command "
                    "%u ends", p->commands[i].stream, i, (long long)(end[prev] - start[i]), prev);
  }
  int waits = 0;
  for (uint32_t w = 0; w < p->ncommands; w++) {
    const plan_command *c = &p->commands[w];
    if (c->kind != PLAN_CMD_WAIT) continue;
    uint32_t producer = timed_before(p, p->commands[c->b].stream, c->b);
    uint32_t consumer = timed_after(p, c->stream, w);
    if (producer == PLAN_NONE || consumer == PLAN_NONE) continue;
    ck_assert_msg(start[consumer] >= end[producer], "command %u (behind wait %u) starts %lld ns "
                  "before its producer %u ends", consumer, w,
                  (long long)(end[producer] - start[consumer]), producer);
    waits++;
  }
  *out_end = last;
  return waits;
}

/* The kernel of every launch of `symbol` ran at least `ns` between its start
 * and end: the timestamps bracket the execution, not the enqueue. */
static void expect_spans_at_least(rt_bundle *bd, const char *symbol, uint64_t ns) {
  const plan *p = rt_bundle_plan(bd);
  const uint64_t *start, *end;
  ck_assert_ptr_null(rt_trace_last_step(bd, &start, &end));
  int seen = 0;
  for (uint32_t i = 0; i < p->ncommands; i++) {
    const plan_command *c = &p->commands[i];
    if (c->kind != PLAN_CMD_LAUNCH || strcmp(plan_str(p, p->kernels[c->a].symbol), symbol))
      continue;
    ck_assert_msg(end[i] - start[i] >= ns, "command %u (%s) took %llu ns, its kernel sleeps %llu",
                  i, symbol, (unsigned long long)(end[i] - start[i]), (unsigned long long)ns);
    seen++;
  }
  ck_assert_int_gt(seen, 0);
}

/* Two streams of one device, two launches each; the second stream waits
 * for the slow first launch of the first. */
START_TEST(trace_two_streams) {
  tb b;
  tb_init(&b);
  uint32_t d = tb_device(&b, "cpu0", 2);
  uint32_t s0 = tb_stream(&b, "compute", d), s1 = tb_stream(&b, "other", d);
  tb_io(&b);
  uint32_t x = tb_tensor(&b, "x", PLAN_F32, PLAN_INPUT, d, N);
  uint32_t a = tb_tensor(&b, "a", PLAN_F32, PLAN_ACTIVATION, d, N);
  uint32_t c = tb_tensor(&b, "c", PLAN_F32, PLAN_OUTPUT, d, N);
  uint32_t y = tb_tensor(&b, "y", PLAN_F32, PLAN_ACTIVATION, d, N);
  uint32_t z = tb_tensor(&b, "z", PLAN_F32, PLAN_OUTPUT, d, N);
  uint32_t ks = tb_kernel(&b, "t_slow_inc", 1, 2), kd = tb_kernel(&b, "t_double", 1, 2),
           ki = tb_kernel(&b, "t_inc", 1, 2);
  tb_launch(&b, s0, ks, x, a, 0); /* a = x + 1, after a nap */
  uint32_t r = tb_record(&b, s0);
  tb_launch(&b, s0, ki, a, c, 0); /* c = x + 2 */
  tb_wait(&b, s1, r);
  tb_launch(&b, s1, kd, a, y, 0); /* y = 2x + 2 */
  tb_launch(&b, s1, ki, y, z, 0); /* z = 2x + 3 */
  tb_write(&b);
  rt_bundle *bd = open_traced(b.dir, NULL);
  uint64_t prev_end = 0;
  for (int k = 0; k < 3; k++) {
    write_f32(bd, x, (float)(10 * k));
    step_ok(bd, k, 1, k);
    expect_f32(bd, c, 1.0f, 2.0f, (float)(10 * k));
    expect_f32(bd, z, 2.0f, 3.0f, (float)(10 * k));
    ck_assert_int_eq(check_trace(bd, prev_end, &prev_end), 1);
    expect_spans_at_least(bd, "t_slow_inc", 3000000);
  }
  rt_bundle_close(bd);
  tb_cleanup(&b);
}
END_TEST

/* Two devices with copies both ways: each device waits on the other's
 * record, and the cross-device copies are timed like launches. */
START_TEST(trace_two_devices) {
  tb b;
  uint32_t x, y1, z0;
  build_two_devices(&b, &x, &y1, &z0);
  rt_bundle *bd = open_traced(b.dir, NULL);
  const plan *p = rt_bundle_plan(bd);
  uint64_t prev_end = 0;
  for (int k = 0; k < 3; k++) {
    write_f32(bd, x, (float)(1000 * k));
    step_ok(bd, k, 1, k);
    expect_f32(bd, z0, 2.0f, 5.0f, (float)(1000 * k));
    ck_assert_int_eq(check_trace(bd, prev_end, &prev_end), 2);
    expect_spans_at_least(bd, "t_slow_inc", 3000000);
  }
  int copies = 0;
  for (uint32_t i = 0; i < p->ncommands; i++) copies += p->commands[i].kind == PLAN_CMD_COPY;
  ck_assert_int_eq(copies, 2);
  rt_bundle_close(bd);
  tb_cleanup(&b);
}
END_TEST

/* No trace without the option, before a step or after a failed one; a
 * step that fails skips its timestamps and the next one traces again. */
START_TEST(trace_refusals) {
  tb b;
  uint32_t x, y1, z0;
  build_two_devices(&b, &x, &y1, &z0);
  const uint64_t *start = (const uint64_t *)1, *end = (const uint64_t *)1;

  rt_bundle *bd = open_ok(b.dir, NULL);
  step_ok(bd, 0, 1, 0);
  rt_status s = rt_trace_last_step(bd, &start, &end);
  ck_assert_ptr_nonnull(s);
  char want[256];
  snprintf(want, sizeof want, "rt_trace_last_step: bundle %s was opened without tracing (set "
           "rt_options.trace)", b.dir);
  ck_assert_str_eq(rt_status_msg(s), want);
  ck_assert(start == NULL && end == NULL);
  rt_status_free(s);
  rt_bundle_close(bd);

  /* dev1 launches twice per step: its first launch of step 2 fails. */
  rt_fault f = {.device = 1, .fail_launch = 2 * 1 + 1};
  bd = open_traced(b.dir, &f);
  s = rt_trace_last_step(bd, &start, &end);
  ck_assert_ptr_nonnull(s);
  ck_assert_msg(strstr(rt_status_msg(s), "no step to report") != NULL, "%s", rt_status_msg(s));
  rt_status_free(s);
  uint64_t prev_end = 0;
  step_ok(bd, 1, 1, 1);
  ck_assert_int_eq(check_trace(bd, prev_end, &prev_end), 2);
  int32_t st[4] = {2, 1, 2, 0};
  s = rt_replay_step(bd, st);
  ck_assert_ptr_nonnull(s);
  rt_status_free(s);
  s = rt_trace_last_step(bd, &start, &end);
  ck_assert_ptr_nonnull(s);
  ck_assert_msg(strstr(rt_status_msg(s), "the last one failed") != NULL, "%s", rt_status_msg(s));
  rt_status_free(s);
  write_f32(bd, x, 3.0f);
  step_ok(bd, 3, 1, 3);
  expect_f32(bd, z0, 2.0f, 5.0f, 3.0f);
  ck_assert_int_eq(check_trace(bd, prev_end, &prev_end), 2);
  rt_bundle_close(bd);
  tb_cleanup(&b);
}
END_TEST

/* A step hook that checks each step's trace against the previous one. */
static rt_status trace_hook(void *ctx, rt_bundle *b, const int32_t step[4], const int32_t *ids) {
  (void)step;
  (void)ids;
  uint64_t *prev_end = ctx;
  check_trace(b, *prev_end, prev_end);
  return NULL;
}

/* rt_generate on a traced bundle: the same outputs as without trace, and
 * a hook sees the trace of every step. */
/* ---- graph replay ------------------------------------------------------ */

/* The stand-in's PTX: it knows ds4_smoke (out[i] = 2 in[i] + pos for i <
 * ntok) by its .entry line. */
static const char graph_ptx[] = ".version 8.0\n.target sm_90\n.address_size 64\n"
                                ".visible .entry ds4_smoke(.param .u64 a, .param .u64 b)\n{ ret; }\n";


/* One cuda device, three streams: main doubles x into a; side doubles a
 * into b and copy copies a into c, both after main's record; main then
 * doubles b into y and copies c into z, after both. */
static void graph_plan(tb *b, uint32_t *x, uint32_t *y, uint32_t *z) {
  tb_init(b);
  uint32_t d = tb_gpu_device(b, "gpu0", PLAN_BACKEND_CUDA, "sm_90");
  tb_codeobj(b, "kernels/sm_90.ptx", "sm_90");
  uint32_t main = tb_stream(b, "main", d), side = tb_stream(b, "side", d), copy = tb_stream(b, "copy", d);
  tb_io(b);
  *x = tb_tensor(b, "x", PLAN_F32, PLAN_INPUT, d, N);
  uint32_t a = tb_tensor(b, "a", PLAN_F32, PLAN_ACTIVATION, d, N);
  uint32_t bt = tb_tensor(b, "b", PLAN_F32, PLAN_ACTIVATION, d, N);
  uint32_t c = tb_tensor(b, "c", PLAN_F32, PLAN_ACTIVATION, d, N);
  *y = tb_tensor(b, "y", PLAN_F32, PLAN_OUTPUT, d, N);
  *z = tb_tensor(b, "z", PLAN_F32, PLAN_OUTPUT, d, N);
  uint32_t k = tb_kernel(b, "ds4_smoke", 1, 2);
  tb_launch(b, main, k, *x, a, 0);
  uint32_t r1 = tb_record(b, main);
  tb_wait(b, side, r1);
  tb_launch(b, side, k, a, bt, 0);
  uint32_t r2 = tb_record(b, side);
  tb_wait(b, copy, r1);
  tb_copy(b, copy, a, c);
  uint32_t r3 = tb_record(b, copy);
  tb_wait(b, main, r2);
  tb_wait(b, main, r3);
  tb_launch(b, main, k, bt, *y, 0);
  tb_copy(b, main, c, *z);
  tb_write(b);
  tb_file(b, "kernels/sm_90.ptx", graph_ptx);
  char path[256];
  snprintf(path, sizeof path, "%s/kernels/sm_90.ptx", b->dir);
  file_digest(path, b->codeobjs[1].sha256);
  snprintf(path, sizeof path, "%s/plan.ds4p", b->dir);
  rt_status s = plan_write(&b->p, path);
  ck_assert_msg(s == NULL, "plan_write: %s", rt_status_msg(s));
}

/* What a graph of plan p's one device must hold: a node per LAUNCH and
 * COPY in plan order, each depending on its stream's previous node and,
 * through the WAITs since then, on the last node of the awaited RECORD's
 * stream before that RECORD (the plan's cross-stream edges). Returns the
 * node count; edges[i] = {from, to}. */
static int plan_graph_edges(const plan *p, int (*edges)[2], int cap, int *out_nedges) {
  int last[8], pending[8][8], npending[8] = {0}, *rec_node = calloc(p->info.nevents + 1, sizeof *rec_node);
  ck_assert(p->nstreams <= 8 && rec_node);
  for (uint32_t s = 0; s < p->nstreams; s++) last[s] = -1;
  int nodes = 0, n = 0;
  for (uint32_t i = 0; i < p->ncommands; i++) {
    const plan_command *c = &p->commands[i];
    uint32_t s = c->stream;
    if (c->kind == PLAN_CMD_RECORD) {
      rec_node[c->a] = last[s];
    } else if (c->kind == PLAN_CMD_WAIT) {
      int from = rec_node[c->a], dup = from < 0;
      for (int k = 0; k < npending[s]; k++) dup |= pending[s][k] == from;
      if (!dup) {
        ck_assert_int_lt(npending[s], 8);
        pending[s][npending[s]++] = from;
      }
    } else {
      if (last[s] >= 0) {
        ck_assert_int_lt(n, cap);
        edges[n][0] = last[s];
        edges[n++][1] = nodes;
      }
      for (int k = 0; k < npending[s]; k++) {
        if (pending[s][k] == last[s]) continue;
        ck_assert_int_lt(n, cap);
        edges[n][0] = pending[s][k];
        edges[n++][1] = nodes;
      }
      npending[s] = 0;
      last[s] = nodes++;
    }
  }
  free(rec_node);
  *out_nedges = n;
  return nodes;
}

static int edge_cmp(const void *a, const void *b) {
  const int *x = a, *y = b;
  return x[0] != y[0] ? (x[0] > y[0]) - (x[0] < y[0]) : (x[1] > y[1]) - (x[1] < y[1]);
}

static rt_bundle *open_graph(const char *dir, int graph) {
  rt_options o = {.graph = graph};
  rt_bundle *bd = NULL;
  rt_status s = rt_bundle_open(dir, &o, &bd);
  ck_assert_msg(s == NULL, "rt_bundle_open: %s", rt_status_msg(s));
  return bd;
}

/* Graph replay gives stream replay's outputs step after step (the step
 * block and the inputs stay in device memory, read by every launch of the
 * one graph); the graph holds a node per launch and copy and exactly the
 * plan's dependencies, in-stream and cross-stream. */
START_TEST(graph_replay) {
  tu_use_fake_cuda(1);
  tb b;
  uint32_t x, y, z;
  graph_plan(&b, &x, &y, &z);
  rt_bundle *streams = open_graph(b.dir, 0), *graph = open_graph(b.dir, 1);
  uint64_t nodes = 0, edges = 0;
  rt_status s = rt_graph_stats(graph, &nodes, &edges);
  ck_assert_ptr_nonnull(s);
  ck_assert_msg(strstr(rt_status_msg(s), "no graph yet") != NULL, "%s", rt_status_msg(s));
  rt_status_free(s);
  for (int step = 0; step < 3; step++) {
    rt_bundle *both[2] = {streams, graph};
    for (int i = 0; i < 2; i++) {
      write_f32(both[i], x, (float)(10 * step));
      step_ok(both[i], 3 + step, N, step);
    }
    /* y = 2 (2 (2 x + pos) + pos) + pos, z = 2 x + pos, in both modes. */
    for (int i = 0; i < 2; i++) {
      expect_f32(both[i], y, 8.0f, 7.0f * (float)(3 + step), (float)(10 * step));
      expect_f32(both[i], z, 2.0f, (float)(3 + step), (float)(10 * step));
    }
  }
  const plan *p = rt_bundle_plan(graph);
  int want[32][2], got[32][2], nwant = 0, ngot = 0;
  int want_nodes = plan_graph_edges(p, want, 32, &nwant);
  ck_assert_int_eq(want_nodes, 5); /* 3 launches + 2 copies */
  ck_assert_ptr_null(rt_graph_stats(graph, &nodes, &edges));
  ck_assert_uint_eq(nodes, (uint64_t)want_nodes);
  ck_assert_uint_eq(edges, (uint64_t)nwant);
  void *h = dlopen(getenv("DS4_CUDA_LIBRARY"), RTLD_NOW | RTLD_NOLOAD);
  ck_assert_ptr_nonnull(h);
  int (*last_graph)(int (*)[2], int, int *) = (int (*)(int (*)[2], int, int *))dlsym(h, "fake_cuda_last_graph");
  ck_assert_ptr_nonnull(last_graph);
  ck_assert_int_eq(last_graph(got, 32, &ngot), want_nodes);
  dlclose(h);
  ck_assert_int_eq(ngot, nwant);
  qsort(want, (size_t)nwant, sizeof want[0], edge_cmp);
  qsort(got, (size_t)ngot, sizeof got[0], edge_cmp);
  for (int i = 0; i < nwant; i++)
    ck_assert_msg(got[i][0] == want[i][0] && got[i][1] == want[i][1], "dependency %d: %d -> %d, want %d -> %d",
                  i, got[i][0], got[i][1], want[i][0], want[i][1]);
  /* Cross-stream: launch 0 to launch 1 and to copy 2 (r1), launch 1 and
   * copy 2 to launch 3 (r2, r3); main's own order: 0 to 3, 3 to copy 4. */
  ck_assert_int_eq(nwant, 6);
  rt_bundle_close(streams);
  rt_bundle_close(graph);
  tb_cleanup(&b);
}
END_TEST

/* The fake driver's launches so far, and of them those that allowed
 * programmatic stream serialization. */
static uint64_t fake_launches(uint64_t *out_overlapped) {
  void *h = dlopen(getenv("DS4_CUDA_LIBRARY"), RTLD_NOW | RTLD_NOLOAD);
  ck_assert_ptr_nonnull(h);
  uint64_t (*counts)(uint64_t *) = (uint64_t (*)(uint64_t *))dlsym(h, "fake_cuda_launch_counts");
  ck_assert_ptr_nonnull(counts);
  uint64_t n = counts(out_overlapped);
  dlclose(h);
  return n;
}

/* A plan whose kernels wait for the grids before them (PLAN_FLAG_GRID_WAIT)
 * has every launch let overlap its predecessor, under stream replay and in
 * the graph captured for graph replay, with the same results and the same
 * graph; a plan without the flag has none. */
START_TEST(overlapped_launches) {
  tu_use_fake_cuda(1);
  for (int flagged = 0; flagged < 2; flagged++) {
    tb b;
    uint32_t x, y, z;
    graph_plan(&b, &x, &y, &z);
    b.p.info.flags = flagged ? PLAN_FLAG_GRID_WAIT : 0;
    char path[256];
    snprintf(path, sizeof path, "%s/plan.ds4p", b.dir);
    rt_status s = plan_write(&b.p, path);
    ck_assert_msg(s == NULL, "plan_write: %s", rt_status_msg(s));
    for (int graph = 0; graph < 2; graph++) {
      rt_bundle *bd = open_graph(b.dir, graph);
      uint64_t over0 = 0, over1 = 0, n0 = fake_launches(&over0);
      for (int step = 0; step < 2; step++) {
        write_f32(bd, x, (float)step);
        step_ok(bd, 3, N, step);
        expect_f32(bd, y, 8.0f, 21.0f, (float)step);
        expect_f32(bd, z, 2.0f, 3.0f, (float)step);
      }
      uint64_t n1 = fake_launches(&over1);
      /* Streams: 3 launches a step; graph: the 3 captured in the first. */
      ck_assert_uint_eq(n1 - n0, graph ? 3 : 6);
      ck_assert_uint_eq(over1 - over0, flagged ? n1 - n0 : 0);
      if (graph) {
        uint64_t nodes = 0, edges = 0;
        ck_assert_ptr_null(rt_graph_stats(bd, &nodes, &edges));
        ck_assert_uint_eq(nodes, 5);
        ck_assert_uint_eq(edges, 6);
      }
      rt_bundle_close(bd);
    }
    tb_cleanup(&b);
  }
}
END_TEST

/* What graph replay refuses, before any device opens. */
START_TEST(graph_refusals) {
  tu_use_fake_cuda(1);
  tb b;
  uint32_t x, y, z;
  graph_plan(&b, &x, &y, &z);
  rt_options o = {.graph = 1, .trace = 1};
  rt_bundle *bd = (rt_bundle *)1;
  rt_status s = rt_bundle_open(b.dir, &o, &bd);
  ck_assert_ptr_null(bd);
  ck_assert_ptr_nonnull(s);
  ck_assert_msg(strstr(rt_status_msg(s), "graph replay runs a step as one graph launch, while a trace "
                                         "times each launch") != NULL, "%s", rt_status_msg(s));
  rt_status_free(s);
  bd = open_graph(b.dir, 0);
  s = rt_graph_stats(bd, &(uint64_t){0}, &(uint64_t){0});
  ck_assert_msg(s && strstr(rt_status_msg(s), "opened without graph replay"), "%s", rt_status_msg(s));
  rt_status_free(s);
  rt_bundle_close(bd);
  tb_cleanup(&b);

  simple_plan(&b, "t_double");
  tb_write(&b);
  o.trace = 0;
  bd = (rt_bundle *)1;
  s = rt_bundle_open(b.dir, &o, &bd);
  ck_assert_ptr_null(bd);
  ck_assert_msg(s && strstr(rt_status_msg(s), "graph replay needs a GPU device; device 'cpu0' is on the cpu backend"),
                "%s", rt_status_msg(s));
  rt_status_free(s);
  tb_cleanup(&b);
}
END_TEST

/* A GPU whose driver reports less free memory than the plan's arena is
 * refused at open, the error naming the device, the arena and the
 * driver's figures (the fake reports DS4_FAKE_CUDA_MEMORY free). */
START_TEST(arena_larger_than_the_device) {
  tu_use_fake_cuda(1);
  setenv("DS4_FAKE_CUDA_MEMORY", "64", 1);
  tb b;
  uint32_t x, y, z;
  graph_plan(&b, &x, &y, &z);
  rt_bundle *bd = (rt_bundle *)1;
  rt_status s = rt_bundle_open(b.dir, NULL, &bd);
  ck_assert_ptr_null(bd);
  ck_assert_ptr_nonnull(s);
  char want[256];
  unsigned long long arena = (unsigned long long)b.p.devices[0].arena_bytes;
  snprintf(want, sizeof want,
           "device gpu0: arena of %llu bytes: cuda device gpu0: %llu bytes do not fit: the device has 64 bytes "
           "free of 64 (cuMemGetInfo)",
           arena, arena);
  ck_assert_str_eq(rt_status_msg(s), want);
  rt_status_free(s);
  unsetenv("DS4_FAKE_CUDA_MEMORY");
  tb_cleanup(&b);
}
END_TEST

START_TEST(trace_generate) {
  tb b;
  generate_plan(&b);
  int32_t prompt[10] = {5, 9, 2, 7, 11, 13, 17, 19, 23, 29};
  rt_bundle *plain = open_ok(b.dir, NULL), *traced = open_traced(b.dir, NULL);
  rt_report r1, r2;
  uint64_t end = 0;
  ck_assert_ptr_null(rt_generate(plain, prompt, 10, 3, NULL, NULL, &r1));
  ck_assert_ptr_null(rt_generate(traced, prompt, 10, 3, trace_hook, &end, &r2));
  ck_assert_mem_eq(r1.outputs_sha256, r2.outputs_sha256, 32);
  ck_assert_int_eq(r2.ngenerated, 4);
  ck_assert_mem_eq(r1.generated, r2.generated, 4 * sizeof(int32_t));
  ck_assert_uint_gt(end, 0);
  free(r1.generated);
  free(r2.generated);
  rt_bundle_close(plain);
  rt_bundle_close(traced);
  tb_cleanup(&b);
}
END_TEST

/* ---- the ds4run command line --------------------------------------------- */

/* ds4run lives in the build directory: DS4_BUILD_DIR under ctest, else the
 * parent of this test's own directory. */
static void ds4run_path(char *out, size_t n) {
  const char *bd = getenv("DS4_BUILD_DIR");
  if (bd) {
    snprintf(out, n, "%s/ds4run", bd);
    return;
  }
  char self[512];
  ssize_t k = readlink("/proc/self/exe", self, sizeof self - 1);
  ck_assert_int_gt(k, 0);
  self[k] = 0;
  *strrchr(self, '/') = 0;
  snprintf(out, n, "%s/../ds4run", self);
}

/* Run a command, capture stdout+stderr; returns the exit status. */
static int run_capture(const char *cmd, char *out, size_t n) {
  char full[1024];
  snprintf(full, sizeof full, "%s 2>&1", cmd);
  FILE *f = popen(full, "r");
  ck_assert_ptr_nonnull(f);
  size_t got = fread(out, 1, n - 1, f);
  out[got] = 0;
  int st = pclose(f);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

START_TEST(cli) {
  tb b;
  generate_plan(&b);
  char exe[600], cmd[1024], out[8192];
  ds4run_path(exe, sizeof exe);

  /* The reported hash is rt_generate's over the default prompt. */
  rt_bundle *bd = open_ok(b.dir, NULL);
  int32_t *prompt;
  int n;
  ck_assert_ptr_null(rt_default_prompt(rt_bundle_plan(bd), &prompt, &n));
  rt_report r;
  ck_assert_ptr_null(rt_generate(bd, prompt, n, 3, NULL, NULL, &r));
  char hex[65], want[256];
  rt_hex(r.outputs_sha256, 32, hex);
  snprintf(want, sizeof want, "\noutputs sha256: %s\n", hex);
  free(r.generated);
  free(prompt);
  rt_bundle_close(bd);

  snprintf(cmd, sizeof cmd, "%s %s --steps 3", exe, b.dir);
  ck_assert_int_eq(run_capture(cmd, out, sizeof out), 0);
  ck_assert_msg(strstr(out, want) != NULL, "output:\n%s", out);
  /* a bundle of one plan: decode steps on it too */
  ck_assert_ptr_nonnull(strstr(out, "3 prefill (10 prompt tokens, 4 slots) + 3 decode (on the prefill plan) = 6\n"));

  snprintf(cmd, sizeof cmd, "%s %s --steps 1 --prompt 1,2,3 --json", exe, b.dir);
  ck_assert_int_eq(run_capture(cmd, out, sizeof out), 0);
  ck_assert_msg(strstr(out, "\"generated\": [4, 5]") != NULL, "output:\n%s", out);

  /* Usage errors: one line that points at --help, exit 64. */
  snprintf(cmd, sizeof cmd, "%s %s --steps", exe, b.dir);
  ck_assert_int_eq(run_capture(cmd, out, sizeof out), 64);
  ck_assert_str_eq(out, "ds4run: error: --steps needs a count >= 0 (ds4run --help lists the options)\n");
  snprintf(cmd, sizeof cmd, "%s --help", exe);
  ck_assert_int_eq(run_capture(cmd, out, sizeof out), 0);
  ck_assert_ptr_nonnull(strstr(out, "usage: ds4run BUNDLE"));
  snprintf(cmd, sizeof cmd, "%s %s --prompt 1,x", exe, b.dir);
  ck_assert_int_eq(run_capture(cmd, out, sizeof out), 64);

  /* Runtime errors: one line, the prefix, exit 1. */
  snprintf(cmd, sizeof cmd, "%s %s --prompt 1,2000", exe, b.dir);
  ck_assert_int_eq(run_capture(cmd, out, sizeof out), 1);
  ck_assert_msg(strncmp(out, "ds4run: error: prompt token 1 is 2000", 37) == 0, "%s", out);
  snprintf(cmd, sizeof cmd, "%s/kernels/host.so", b.dir);
  FILE *f = fopen(cmd, "ab");
  ck_assert_ptr_nonnull(f);
  fputc(1, f);
  fclose(f);
  snprintf(cmd, sizeof cmd, "%s %s", exe, b.dir);
  ck_assert_int_eq(run_capture(cmd, out, sizeof out), 1);
  snprintf(want, sizeof want, "ds4run: error: %s/kernels/host.so: sha256 mismatch", b.dir);
  ck_assert_msg(strncmp(out, want, strlen(want)) == 0, "%s", out);
  tb_cleanup(&b);
}
END_TEST

static Suite *runtime_suite(void) {
  Suite *s = suite_create("runtime");
  TCase *t = tcase_create("replay");
  tcase_set_timeout(t, 120);
  tcase_add_test(t, chain_one_stream);
  tcase_add_test(t, cpu_threads_fit_the_cores);
  tcase_add_test(t, two_streams_record_wait);
  tcase_add_test(t, two_devices_copy_wait);
  tcase_add_test(t, arg_offsets);
  tcase_add_test(t, grid_spreads_over_threads);
  tcase_add_test(t, fault_poisons_step);
  tcase_add_test(t, close_without_steps);
  suite_add_tcase(s, t);
  TCase *o = tcase_create("open");
  tcase_set_timeout(o, 120);
  tcase_add_test(o, codeobj_sha_mismatch);
  tcase_add_test(o, codeobj_load_errors);
  tcase_add_test(o, backend_lookup);
  tcase_add_test(o, codeobj_per_target);
  tcase_add_test(o, codeobj_unused_target);
  tcase_add_test(o, copy_reach);
  tcase_add_test(o, cross_backend_sync_on_one_stream);
  tcase_add_test(o, cpu_waits_on_foreign_event);
  tcase_add_test(o, init_values);
  tcase_add_test(o, weight_views);
  suite_add_tcase(s, o);
  TCase *q = tcase_create("quantized");
  tcase_set_timeout(q, 120);
  tcase_add_test(q, quantized_generator);
  tcase_add_test(q, quantized_check);
  suite_add_tcase(s, q);
  TCase *g = tcase_create("generate");
  tcase_set_timeout(g, 120);
  tcase_add_test(g, generate_chunks);
  tcase_add_test(g, cli);
  suite_add_tcase(s, g);
  TCase *tr = tcase_create("trace");
  tcase_set_timeout(tr, 120);
  tcase_add_test(tr, trace_two_streams);
  tcase_add_test(tr, trace_two_devices);
  tcase_add_test(tr, trace_refusals);
  tcase_add_test(tr, trace_generate);
  suite_add_tcase(s, tr);
  TCase *gr = tcase_create("graph");
  tcase_set_timeout(gr, 120);
  tcase_add_test(gr, graph_replay);
  tcase_add_test(gr, graph_refusals);
  tcase_add_test(gr, overlapped_launches);
  tcase_add_test(gr, arena_larger_than_the_device);
  suite_add_tcase(s, gr);
  return s;
}

int main(void) {
  SRunner *r = srunner_create(runtime_suite());
  srunner_run_all(r, CK_NORMAL);
  int failed = srunner_ntests_failed(r);
  srunner_free(r);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
