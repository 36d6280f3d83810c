/* test_plan.c - the binary plan format, SHA-256 and status: round trips,
 * determinism, and every kind of damage a plan file can carry, each of which
 * must be refused with a message naming what is wrong (never a crash). */
#include <check.h>
#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "plan.h"
#include "sha256.h"
#include "status.h"
#include "test_util.h"

/* ---- status --------------------------------------------------------------- */

START_TEST(status_basics) {
  ck_assert_str_eq(rt_status_msg(NULL), "ok");
  rt_status s = rt_status_make("tensor %d: %s", 3, "bad");
  ck_assert_ptr_nonnull(s);
  ck_assert_str_eq(rt_status_msg(s), "tensor 3: bad");
  s = rt_status_wrap(s, "loading %s", "out/x");
  ck_assert_str_eq(rt_status_msg(s), "loading out/x: tensor 3: bad");
  rt_status_free(s);
  ck_assert_ptr_null(rt_status_wrap(NULL, "context %d", 1));
  rt_status_free(NULL);
  /* A long message is not truncated. */
  char big[5000];
  memset(big, 'x', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  s = rt_status_make("%s!", big);
  ck_assert_uint_eq(strlen(rt_status_msg(s)), sizeof big);
  rt_status_free(s);
}
END_TEST

/* ---- sha256 --------------------------------------------------------------- */

static void hex_of(const void *d, size_t n, char out[65]) {
  uint8_t h[32];
  rt_sha256(d, n, h);
  rt_hex(h, 32, out);
}

START_TEST(sha256_vectors) {
  char hex[65];
  hex_of("", 0, hex);
  ck_assert_str_eq(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  hex_of("abc", 3, hex);
  ck_assert_str_eq(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const char *m448 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  hex_of(m448, strlen(m448), hex);
  ck_assert_str_eq(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");

  /* One million 'a', fed in uneven pieces through the incremental API. */
  char *a = malloc(1000000);
  ck_assert_ptr_nonnull(a);
  memset(a, 'a', 1000000);
  rt_sha256_ctx c;
  rt_sha256_init(&c);
  size_t done = 0, step = 1;
  while (done < 1000000) {
    size_t n = step < 1000000 - done ? step : 1000000 - done;
    rt_sha256_update(&c, a + done, n);
    done += n;
    step = step * 3 % 1000 + 1;
  }
  uint8_t h[32];
  rt_sha256_final(&c, h);
  rt_hex(h, 32, hex);
  ck_assert_str_eq(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  hex_of(a, 1000000, hex);
  ck_assert_str_eq(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  free(a);

  /* Lengths around the padding boundary agree between one-shot and split. */
  uint8_t buf[130];
  for (size_t i = 0; i < sizeof buf; i++) buf[i] = (uint8_t)(i * 7 + 1);
  for (size_t n = 50; n <= 130; n++) {
    uint8_t one[32], two[32];
    rt_sha256(buf, n, one);
    rt_sha256_init(&c);
    rt_sha256_update(&c, buf, n / 2);
    rt_sha256_update(&c, buf + n / 2, n - n / 2);
    rt_sha256_final(&c, two);
    ck_assert_mem_eq(one, two, 32);
  }
  uint8_t b3[3] = {0x00, 0xab, 0xff};
  char h3[7];
  rt_hex(b3, 3, h3);
  ck_assert_str_eq(h3, "00abff");
}
END_TEST

/* ---- a small valid plan ------------------------------------------------------ */

typedef struct strtab {
  char buf[1024];
  uint32_t len;
} strtab;

static uint32_t str_add(strtab *t, const char *s) {
  uint32_t off = t->len;
  size_t n = strlen(s) + 1;
  ck_assert_uint_le(t->len + n, sizeof t->buf);
  memcpy(t->buf + t->len, s, n);
  t->len += (uint32_t)n;
  return off;
}

/* Two devices, three streams, nine tensors (among them a weight source on
 * no device, an expert-style view of it with a rows list and a replica of a
 * resident weight), two code objects (host and gfx1201), two kernels, three
 * ops (launch, copy, launch) with their costs, two edges, seven commands
 * with two record/wait pairs, seven args (some with offsets), two rows.
 * Arrays are static storage in the fixture. */
typedef struct fixture {
  strtab st;
  plan p;
  plan_param params[2];
  plan_device devices[2];
  plan_stream streams[3];
  plan_tensor tensors[9];
  plan_codeobj codeobjs[2];
  plan_kernel kernels[2];
  plan_op ops[3];
  plan_edge edges[2];
  plan_command commands[7];
  plan_arg args[7];
  uint32_t rows[2];
  double costs[3];
  plan_fparam fparams[2];
  plan_work work[3];
} fixture;

static void tensor_set(plan_tensor *t, uint32_t name, uint32_t dtype, uint32_t role,
                       uint32_t device, uint64_t offset, uint32_t ndim, const uint64_t *dims) {
  memset(t, 0, sizeof *t);
  t->name = name;
  t->checkpoint = PLAN_NONE;
  t->dtype = dtype;
  t->role = role;
  t->device = device;
  t->view_of = PLAN_NONE;
  t->rows = PLAN_NONE;
  t->ndim = ndim;
  uint64_t bytes = plan_dtype_size(dtype);
  for (uint32_t i = 0; i < ndim; i++) {
    t->dim[i] = dims[i];
    bytes *= dims[i];
  }
  t->bytes = bytes;
  t->offset = offset;
  t->init_offset = 0.5;
  t->init_scale = -0.25;
}

static void fixture_build(fixture *f) {
  memset(f, 0, sizeof *f);
  strtab *s = &f->st;
  plan *p = &f->p;
  str_add(s, ""); /* offset 0 is the empty string */
  p->info.model = str_add(s, "tiny-moe");
  p->info.schedule = str_add(s, "tiny-2dev");
  p->info.tokens = 4;
  p->info.max_seq = 16;
  p->info.prompt = 4;
  p->info.decode = 1;
  p->info.ids_tensor = 0;
  p->info.next_tensor = 4;
  p->info.nevents = 2;
  p->info.flags = PLAN_FLAG_GRID_WAIT;
  p->info.weight_seed = 0x123456789abcdef0ull;

  f->params[0] = (plan_param){.name = str_add(s, "hidden"), .value = 8};
  f->params[1] = (plan_param){.name = str_add(s, "negative"), .value = -3};
  f->fparams[0] = (plan_fparam){.name = str_add(s, "norm_eps"), .value = 1e-6};
  f->fparams[1] = (plan_fparam){.name = str_add(s, "compress_rope.theta"), .value = 160000.0};

  uint32_t host = str_add(s, "host");
  f->devices[0] = (plan_device){.name = str_add(s, "cpu0"), .backend = PLAN_BACKEND_CPU,
                                .arch = host, .ordinal = 0, .threads = 2, .arena_bytes = 4096,
                                .memory = 0};
  f->devices[1] = (plan_device){.name = str_add(s, "cpu1"), .backend = PLAN_BACKEND_CPU,
                                .arch = host, .ordinal = 1, .threads = 4, .arena_bytes = 2048,
                                .memory = 1u << 20};
  uint32_t compute = str_add(s, "compute");
  f->streams[0] = (plan_stream){compute, 0};
  f->streams[1] = (plan_stream){str_add(s, "copy"), 0};
  f->streams[2] = (plan_stream){compute, 1};

  const uint64_t d4[] = {4}, d48[] = {4, 8}, d248[] = {2, 4, 8};
  tensor_set(&f->tensors[0], str_add(s, "ids"), PLAN_I32, PLAN_INPUT, 0, 0, 1, d4);
  tensor_set(&f->tensors[1], str_add(s, "layers.0.w"), PLAN_F32, PLAN_WEIGHT, 0, 64, 2, d48);
  f->tensors[1].checkpoint = str_add(s, "model.layers.0.w.weight");
  tensor_set(&f->tensors[2], str_add(s, "h"), PLAN_F32, PLAN_ACTIVATION, 0, 256, 2, d48);
  tensor_set(&f->tensors[3], str_add(s, "h@cpu1"), PLAN_F32, PLAN_ACTIVATION, 1, 0, 2, d48);
  tensor_set(&f->tensors[4], str_add(s, "next"), PLAN_I32, PLAN_OUTPUT, 1, 256, 1, d4);
  tensor_set(&f->tensors[5], str_add(s, "kv"), PLAN_BF16, PLAN_STATE, 1, 512, 3, d248);
  /* Experts 3 and 1 of a non-resident source, and a replica of tensor 1. */
  const uint64_t d28[] = {2, 8};
  tensor_set(&f->tensors[6], str_add(s, "layers.0.experts"), PLAN_F32, PLAN_WEIGHT, PLAN_NONE, 0,
             2, d48);
  f->tensors[6].checkpoint = str_add(s, "model.layers.0.experts.weight");
  tensor_set(&f->tensors[7], str_add(s, "layers.0.experts@cpu1"), PLAN_F32, PLAN_WEIGHT, 1, 1024,
             2, d28);
  f->tensors[7].view_of = 6;
  f->tensors[7].rows = 0;
  f->rows[0] = 3;
  f->rows[1] = 1;
  tensor_set(&f->tensors[8], str_add(s, "layers.0.w@cpu1"), PLAN_F32, PLAN_WEIGHT, 1, 1536, 2, d48);
  f->tensors[8].view_of = 1;

  f->codeobjs[0].path = str_add(s, "kernels/host.so");
  f->codeobjs[0].target = host;
  for (int i = 0; i < 32; i++) f->codeobjs[0].sha256[i] = (uint8_t)(i * 9 + 3);
  f->codeobjs[1].path = str_add(s, "kernels/gfx1201.hsaco");
  f->codeobjs[1].target = str_add(s, "gfx1201");
  for (int i = 0; i < 32; i++) f->codeobjs[1].sha256[i] = (uint8_t)(255 - i);

  f->kernels[0] = (plan_kernel){.symbol = str_add(s, "embed_f32_4x8"),
                                .kind = str_add(s, "embedding"), .grid = 4, .block = 64,
                                .shared = 0, .nbufs = 3};
  f->kernels[1] = (plan_kernel){.symbol = str_add(s, "argmax_4x8"), .kind = str_add(s, "sample"),
                                .grid = 1, .block = 256, .shared = 2048, .nbufs = 2};

  f->ops[0] = (plan_op){.path = str_add(s, "embed"), .stream = 0, .kernel = 0};
  f->ops[1] = (plan_op){.path = str_add(s, "copy.h.cpu1"), .stream = 1, .kernel = PLAN_NONE};
  f->ops[2] = (plan_op){.path = str_add(s, "sample"), .stream = 2, .kernel = 1};

  f->edges[0] = (plan_edge){.from = 0, .to = 1, .tensor = 2, .hazard = PLAN_RAW};
  f->edges[1] = (plan_edge){.from = 1, .to = 2, .tensor = 3, .hazard = PLAN_WAR};

  /* Launch 0 takes args 0-2; the copy moves bytes [32, 96) of h into
   * bytes [64, 128) of h@cpu1 (args 3, 4) on the source's device; launch 6
   * takes args 5-6. */
  const plan_arg args[7] = {{0, 0, 0, 16},  {1, 0, 0, 128}, {2, 0, 0, 128}, {2, 0, 32, 64},
                            {3, 0, 64, 64}, {7, 0, 0, 64},  {4, 0, 0, 16}};
  memcpy(f->args, args, sizeof args);

  plan_command *c = f->commands;
  c[0] = (plan_command){PLAN_CMD_LAUNCH, 0, 0, 0, PLAN_NONE, 0, 3, 0};
  c[1] = (plan_command){PLAN_CMD_RECORD, 0, PLAN_NONE, 0, PLAN_NONE, 0, 0, 0};
  c[2] = (plan_command){PLAN_CMD_WAIT, 1, PLAN_NONE, 0, 1, 0, 0, 0};
  c[3] = (plan_command){PLAN_CMD_COPY, 1, 1, PLAN_NONE, PLAN_NONE, 3, 2, 0};
  c[4] = (plan_command){PLAN_CMD_RECORD, 1, PLAN_NONE, 1, PLAN_NONE, 0, 0, 0};
  c[5] = (plan_command){PLAN_CMD_WAIT, 2, PLAN_NONE, 1, 4, 0, 0, 0};
  c[6] = (plan_command){PLAN_CMD_LAUNCH, 2, 2, 1, PLAN_NONE, 5, 2, 0};

  p->strings = s->buf;
  p->strings_len = s->len;
  p->params = f->params; p->nparams = 2;
  p->fparams = f->fparams; p->nfparams = 2;
  f->work[0] = (plan_work){4096, 8192}; f->work[1] = (plan_work){64, 0}; f->work[2] = (plan_work){1e9, 0.5};
  p->work = f->work; p->nwork = 3;
  p->devices = f->devices; p->ndevices = 2;
  p->streams = f->streams; p->nstreams = 3;
  p->tensors = f->tensors; p->ntensors = 9;
  p->codeobjs = f->codeobjs; p->ncodeobjs = 2;
  p->kernels = f->kernels; p->nkernels = 2;
  p->ops = f->ops; p->nops = 3;
  p->edges = f->edges; p->nedges = 2;
  p->commands = f->commands; p->ncommands = 7;
  p->args = f->args; p->nargs = 7;
  p->rows = f->rows; p->nrows = 2;
  f->costs[0] = 1500.25; f->costs[1] = 0; f->costs[2] = 3.5e9;
  p->costs = f->costs; p->ncosts = 3;
}

static uint8_t *encode_fixture(size_t *len) {
  fixture f;
  fixture_build(&f);
  uint8_t *bytes = NULL;
  rt_status st = plan_encode(&f.p, &bytes, len);
  ck_assert_msg(st == NULL, "encode: %s", rt_status_msg(st));
  return bytes;
}

#define EQ(field) ck_assert_uint_eq((uint64_t)(a->field), (uint64_t)(b->field))

static void assert_plans_equal(const plan *x, const plan *y) {
  ck_assert_uint_eq(x->strings_len, y->strings_len);
  ck_assert_mem_eq(x->strings, y->strings, x->strings_len);
  {
    const plan_info *a = &x->info, *b = &y->info;
    EQ(model); EQ(schedule); EQ(tokens); EQ(max_seq); EQ(prompt); EQ(decode);
    EQ(ids_tensor); EQ(next_tensor); EQ(nevents); EQ(flags); EQ(weight_seed);
  }
  ck_assert_uint_eq(x->nparams, y->nparams);
  for (uint32_t i = 0; i < x->nparams; i++) {
    const plan_param *a = &x->params[i], *b = &y->params[i];
    EQ(name);
    ck_assert_int_eq(a->value, b->value);
  }
  ck_assert_uint_eq(x->ndevices, y->ndevices);
  for (uint32_t i = 0; i < x->ndevices; i++) {
    const plan_device *a = &x->devices[i], *b = &y->devices[i];
    EQ(name); EQ(backend); EQ(arch); EQ(ordinal); EQ(threads); EQ(arena_bytes); EQ(memory);
  }
  ck_assert_uint_eq(x->nstreams, y->nstreams);
  for (uint32_t i = 0; i < x->nstreams; i++) {
    const plan_stream *a = &x->streams[i], *b = &y->streams[i];
    EQ(name); EQ(device);
  }
  ck_assert_uint_eq(x->ntensors, y->ntensors);
  for (uint32_t i = 0; i < x->ntensors; i++) {
    const plan_tensor *a = &x->tensors[i], *b = &y->tensors[i];
    EQ(name); EQ(checkpoint); EQ(dtype); EQ(role); EQ(ndim); EQ(device); EQ(view_of); EQ(rows);
    EQ(dim[0]); EQ(dim[1]); EQ(dim[2]); EQ(dim[3]); EQ(bytes); EQ(offset);
    ck_assert(a->init_offset == b->init_offset);
    ck_assert(a->init_scale == b->init_scale);
  }
  ck_assert_uint_eq(x->ncodeobjs, y->ncodeobjs);
  for (uint32_t i = 0; i < x->ncodeobjs; i++) {
    const plan_codeobj *a = &x->codeobjs[i], *b = &y->codeobjs[i];
    EQ(path); EQ(target);
    ck_assert_mem_eq(a->sha256, b->sha256, 32);
  }
  ck_assert_uint_eq(x->nkernels, y->nkernels);
  for (uint32_t i = 0; i < x->nkernels; i++) {
    const plan_kernel *a = &x->kernels[i], *b = &y->kernels[i];
    EQ(symbol); EQ(kind); EQ(grid); EQ(block); EQ(shared); EQ(nbufs);
  }
  ck_assert_uint_eq(x->nops, y->nops);
  for (uint32_t i = 0; i < x->nops; i++) {
    const plan_op *a = &x->ops[i], *b = &y->ops[i];
    EQ(path); EQ(stream); EQ(kernel);
  }
  ck_assert_uint_eq(x->nedges, y->nedges);
  for (uint32_t i = 0; i < x->nedges; i++) {
    const plan_edge *a = &x->edges[i], *b = &y->edges[i];
    EQ(from); EQ(to); EQ(tensor); EQ(hazard);
  }
  ck_assert_uint_eq(x->ncommands, y->ncommands);
  for (uint32_t i = 0; i < x->ncommands; i++) {
    const plan_command *a = &x->commands[i], *b = &y->commands[i];
    EQ(kind); EQ(stream); EQ(op); EQ(a); EQ(b); EQ(args_begin); EQ(nargs);
  }
  ck_assert_uint_eq(x->nargs, y->nargs);
  for (uint32_t i = 0; i < x->nargs; i++) {
    const plan_arg *a = &x->args[i], *b = &y->args[i];
    EQ(tensor); EQ(offset); EQ(bytes);
  }
  ck_assert_uint_eq(x->nrows, y->nrows);
  for (uint32_t i = 0; i < x->nrows; i++) ck_assert_uint_eq(x->rows[i], y->rows[i]);
  ck_assert_uint_eq(x->ncosts, y->ncosts);
  for (uint32_t i = 0; i < x->ncosts; i++) ck_assert(x->costs[i] == y->costs[i]);
  ck_assert_uint_eq(x->nwork, y->nwork);
  for (uint32_t i = 0; i < x->nwork; i++)
    ck_assert(x->work[i].bytes == y->work[i].bytes && x->work[i].flops == y->work[i].flops);
  ck_assert_uint_eq(x->nfparams, y->nfparams);
  for (uint32_t i = 0; i < x->nfparams; i++) {
    ck_assert_str_eq(plan_str(x, x->fparams[i].name), plan_str(y, y->fparams[i].name));
    ck_assert(x->fparams[i].value == y->fparams[i].value);
  }
}

START_TEST(round_trip) {
  fixture f;
  fixture_build(&f);
  uint8_t *b1, *b2;
  size_t n1, n2;
  ck_assert_ptr_null(plan_encode(&f.p, &b1, &n1));
  ck_assert_ptr_null(plan_encode(&f.p, &b2, &n2));
  ck_assert_uint_eq(n1, n2);
  ck_assert_mem_eq(b1, b2, n1);
  ck_assert_uint_eq(n1 % 8, 0);
  ck_assert_mem_eq(b1, "DS4PLAN\0", 8);

  plan d;
  rt_status st = plan_decode("plan.ds4p", b1, n1, &d);
  ck_assert_msg(st == NULL, "%s", rt_status_msg(st));
  assert_plans_equal(&f.p, &d);
  ck_assert_str_eq(plan_str(&d, d.info.model), "tiny-moe");
  ck_assert_str_eq(plan_str(&d, d.tensors[1].checkpoint), "model.layers.0.w.weight");
  ck_assert_str_eq(plan_str(&d, d.tensors[0].checkpoint), "");
  ck_assert_int_eq(d.params[1].value, -3);
  ck_assert_uint_eq(d.tensors[6].device, PLAN_NONE);
  ck_assert_uint_eq(d.tensors[7].view_of, 6);
  ck_assert_uint_eq(d.rows[d.tensors[7].rows], 3);
  ck_assert_uint_eq(d.args[4].offset, 64);

  /* The decoded plan owns its arrays: scribbling over the bytes after
   * decoding does not change it, and re-encoding gives the same file. */
  uint8_t *copy = malloc(n1);
  memcpy(copy, b1, n1);
  memset(b1, 0xee, n1);
  ck_assert_str_eq(plan_str(&d, d.info.schedule), "tiny-2dev");
  uint8_t *b3;
  size_t n3;
  ck_assert_ptr_null(plan_encode(&d, &b3, &n3));
  ck_assert_uint_eq(n3, n1);
  ck_assert_mem_eq(b3, copy, n1);

  plan_free(&d);
  ck_assert_ptr_null(d.tensors);
  plan_free(&d); /* freeing twice is harmless after the reset */
  free(copy);
  free(b1);
  free(b2);
  free(b3);
}
END_TEST

START_TEST(names) {
  ck_assert_str_eq(plan_dtype_name(PLAN_F32), "f32");
  ck_assert_str_eq(plan_dtype_name(PLAN_BF16), "bf16");
  ck_assert_str_eq(plan_dtype_name(PLAN_F16), "f16");
  ck_assert_str_eq(plan_dtype_name(PLAN_I32), "i32");
  ck_assert_str_eq(plan_dtype_name(PLAN_F8E4M3), "f8e4m3");
  ck_assert_str_eq(plan_dtype_name(PLAN_MXFP4), "mxfp4");
  ck_assert_str_eq(plan_dtype_name(PLAN_NDTYPE), "?");
  ck_assert_str_eq(plan_dtype_name(17), "?");
  /* quantized dtypes have no element size: plan_quant gives their bytes */
  ck_assert_uint_eq(plan_dtype_size(PLAN_F8E4M3), 0);
  ck_assert_uint_eq(plan_dtype_size(PLAN_MXFP4), 0);
  for (uint32_t d = 0; d <= PLAN_NDTYPE; d++)
    ck_assert_int_eq(plan_dtype_quantized(d) != 0, d == PLAN_F8E4M3 || d == PLAN_MXFP4);
  ck_assert_uint_eq(plan_dtype_size(PLAN_F32), 4);
  ck_assert_uint_eq(plan_dtype_size(PLAN_BF16), 2);
  ck_assert_uint_eq(plan_dtype_size(PLAN_F16), 2);
  ck_assert_uint_eq(plan_dtype_size(PLAN_I32), 4);
  ck_assert_uint_eq(plan_dtype_size(PLAN_NDTYPE), 0);
  ck_assert_str_eq(plan_role_name(PLAN_INPUT), "input");
  ck_assert_str_eq(plan_role_name(PLAN_OUTPUT), "output");
  ck_assert_str_eq(plan_role_name(PLAN_WEIGHT), "weight");
  ck_assert_str_eq(plan_role_name(PLAN_STATE), "state");
  ck_assert_str_eq(plan_role_name(PLAN_ACTIVATION), "activation");
  ck_assert_str_eq(plan_role_name(PLAN_NROLE), "?");
}
END_TEST

/* ---- quantized weights ------------------------------------------------------ */

static void expect_quant(uint32_t dtype, uint32_t ndim, const uint64_t *dim, uint64_t nmat, uint64_t rows,
                         uint64_t cols, uint64_t data, uint64_t srows, uint64_t scols, uint64_t stride) {
  plan_quant q;
  const char *why = plan_quant_of(dtype, ndim, dim, &q);
  ck_assert_msg(why == NULL, "%s", why);
  ck_assert_uint_eq(q.nmat, nmat);
  ck_assert_uint_eq(q.rows, rows);
  ck_assert_uint_eq(q.cols, cols);
  ck_assert_uint_eq(q.data_bytes, data);
  ck_assert_uint_eq(q.scale_rows, srows);
  ck_assert_uint_eq(q.scale_cols, scols);
  ck_assert_uint_eq(q.stride, stride);
  ck_assert_uint_eq(q.stride % PLAN_QUANT_ALIGN, 0);
  ck_assert_uint_ge(q.stride, data + srows * scols);
  ck_assert_uint_lt(q.stride, data + srows * scols + PLAN_QUANT_ALIGN);
  ck_assert_uint_eq(plan_tensor_bytes(dtype, ndim, dim), nmat * stride);
}

/* Layouts of odd shapes and partial blocks: f8e4m3 [130, 200] has scale
 * blocks [2, 2] of which three are partial, mxfp4 [5, 34] two scales a row
 * (32 + 2 values); stacks of them, and the shapes refused. */
START_TEST(quant_layouts) {
  const uint64_t f8[] = {130, 200}, f8s[] = {3, 130, 200}, f8z[] = {0, 130, 200};
  /* 26000 codes + 4 scales = 26004, padded to 26016 */
  expect_quant(PLAN_F8E4M3, 2, f8, 1, 130, 200, 26000, 2, 2, 26016);
  expect_quant(PLAN_F8E4M3, 3, f8s, 3, 130, 200, 26000, 2, 2, 26016);
  ck_assert_uint_eq(plan_row_bytes(PLAN_F8E4M3, 2, f8), 0); /* one matrix: no rows to cut */
  ck_assert_uint_eq(plan_row_bytes(PLAN_F8E4M3, 3, f8s), 26016);
  /* no matrices: no bytes, a row is still one matrix (and dim 0 of 0 does not divide) */
  expect_quant(PLAN_F8E4M3, 3, f8z, 0, 130, 200, 26000, 2, 2, 26016);
  ck_assert_uint_eq(plan_row_bytes(PLAN_F8E4M3, 3, f8z), 26016);
  const uint64_t one[] = {1, 1}, exact[] = {128, 256};
  expect_quant(PLAN_F8E4M3, 2, one, 1, 1, 1, 1, 1, 1, 16);
  expect_quant(PLAN_F8E4M3, 2, exact, 1, 128, 256, 32768, 1, 2, 32784);

  const uint64_t f4[] = {5, 34}, f4s[] = {2, 5, 34}, f4q[] = {2, 3, 5, 34}, f4e[] = {7, 64};
  /* 85 code bytes + 10 scales = 95, padded to 96 */
  expect_quant(PLAN_MXFP4, 2, f4, 1, 5, 34, 85, 5, 2, 96);
  expect_quant(PLAN_MXFP4, 3, f4s, 2, 5, 34, 85, 5, 2, 96);
  expect_quant(PLAN_MXFP4, 4, f4q, 6, 5, 34, 85, 5, 2, 96);
  expect_quant(PLAN_MXFP4, 2, f4e, 1, 7, 64, 224, 7, 2, 240);
  ck_assert_uint_eq(plan_row_bytes(PLAN_MXFP4, 3, f4s), 96);
  ck_assert_uint_eq(plan_row_bytes(PLAN_MXFP4, 4, f4q), 3 * 96); /* a row of [3, 5, 34] */

  plan_quant q;
  const uint64_t odd[] = {4, 33}, flat[] = {16}, huge[] = {1ull << 40, 1ull << 40};
  ck_assert_str_eq(plan_quant_of(PLAN_MXFP4, 2, odd, &q),
                   "mxfp4 packs two values a byte along the last dim, which must be even");
  ck_assert_uint_eq(plan_tensor_bytes(PLAN_MXFP4, 2, odd), 0);
  ck_assert_str_eq(plan_quant_of(PLAN_F8E4M3, 1, flat, &q),
                   "a quantized weight needs 2 or more dims (its last two a matrix)");
  ck_assert_str_eq(plan_quant_of(PLAN_MXFP4, 0, flat, &q),
                   "a quantized weight needs 2 or more dims (its last two a matrix)");
  ck_assert_uint_eq(plan_tensor_bytes(PLAN_F8E4M3, 1, flat), 0);
  ck_assert_uint_eq(plan_row_bytes(PLAN_F8E4M3, 1, flat), 0);
  ck_assert_str_eq(plan_quant_of(PLAN_F8E4M3, 2, huge, &q), "more than 2^64 bytes");
  ck_assert_uint_eq(plan_tensor_bytes(PLAN_F8E4M3, 2, huge), 0);
  ck_assert_str_eq(plan_quant_of(PLAN_F32, 2, f8, &q), "not a quantized dtype");
  /* plain dtypes: element size times the elements; a row is dims 1.. */
  ck_assert_uint_eq(plan_tensor_bytes(PLAN_F32, 2, f8), 130 * 200 * 4);
  ck_assert_uint_eq(plan_tensor_bytes(PLAN_BF16, 3, f8s), 3 * 130 * 200 * 2);
  ck_assert_uint_eq(plan_row_bytes(PLAN_BF16, 3, f8s), 130 * 200 * 2);
  ck_assert_uint_eq(plan_row_bytes(PLAN_I32, 1, flat), 4);
  ck_assert_uint_eq(plan_tensor_bytes(PLAN_F32, 0, flat), 4);
  ck_assert_uint_eq(plan_tensor_bytes(PLAN_F32, 2, huge), 0);
}
END_TEST

/* E4M3 written another way: sign, then 1.mmm x 2^(e-7), or 0.mmm x 2^-6. */
static double e4m3_other(unsigned c) {
  unsigned e = (c & 0x78) >> 3, m = c & 0x7;
  if (e == 0xf && m == 0x7) return NAN;
  double mant = e ? 1.0 + m / 8.0 : m / 8.0;
  double v = mant * pow(2.0, e ? (double)e - 7.0 : -6.0);
  return c & 0x80 ? -v : v;
}

/* E2M1: sign, then 1.m x 2^(e-1), or 0.m (the one subnormal 0.5). */
static double e2m1_other(unsigned c) {
  unsigned e = (c >> 1) & 3, m = c & 1;
  double v = e ? (1.0 + m / 2.0) * pow(2.0, (double)e - 1.0) : m / 2.0;
  return c & 8 ? -v : v;
}

START_TEST(quant_codes) {
  int nan = 0;
  for (unsigned c = 0; c < 256; c++) {
    double v = plan_f8e4m3_value((uint8_t)c), w = e4m3_other(c);
    if (isnan(w)) {
      nan++;
      ck_assert_msg(isnan(v), "E4M3 0x%02x: %g, want NaN", c, v);
    } else {
      ck_assert_msg(v == w && signbit(v) == signbit(w), "E4M3 0x%02x: %a, want %a", c, v, w);
    }
  }
  ck_assert_int_eq(nan, 2); /* 0x7f and 0xff; no infinities */
  ck_assert(plan_f8e4m3_value(0x00) == 0.0 && !signbit(plan_f8e4m3_value(0x00)));
  ck_assert(plan_f8e4m3_value(0x80) == 0.0 && signbit(plan_f8e4m3_value(0x80)));
  ck_assert(plan_f8e4m3_value(0x01) == 0x1p-9);  /* the smallest subnormal */
  ck_assert(plan_f8e4m3_value(0x07) == 0x1.cp-7); /* the largest: 7 x 2^-9 */
  ck_assert(plan_f8e4m3_value(0x08) == 0x1p-6);  /* the smallest normal */
  ck_assert(plan_f8e4m3_value(0x38) == 1.0);
  ck_assert(plan_f8e4m3_value(0x7e) == 448.0);   /* the largest */
  ck_assert(plan_f8e4m3_value(0xfe) == -448.0);
  ck_assert(plan_f8e4m3_value(0xb9) == -1.125);
  ck_assert(isnan(plan_f8e4m3_value(0x7f)));
  ck_assert(isnan(plan_f8e4m3_value(0xff)));

  const double e2m1[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6};
  for (unsigned c = 0; c < 16; c++) {
    double v = plan_fp4_value((uint8_t)c);
    ck_assert_msg(v == e2m1[c] && signbit(v) == signbit(e2m1[c]), "E2M1 %u: %g", c, v);
    ck_assert(v == e2m1_other(c));
    ck_assert(plan_fp4_value((uint8_t)(c | 0xf0)) == v); /* the low 4 bits only */
  }

  ck_assert(plan_e8m0_value(0) == 0x1p-127);
  ck_assert(plan_e8m0_value(127) == 1.0);
  ck_assert(plan_e8m0_value(128) == 2.0);
  ck_assert(plan_e8m0_value(254) == 0x1p127);
  ck_assert(isnan(plan_e8m0_value(255)));
  for (unsigned s = 0; s < 255; s++) ck_assert(plan_e8m0_value((uint8_t)s) == pow(2.0, (double)s - 127.0));
}
END_TEST

/* plan_quant_element over every element of a stack of matrices laid out
 * by hand: codes, then the scale bytes, then padding, per matrix. */
START_TEST(quant_elements) {
  enum { M = 2, R = 130, C = 200, SR = 2, SC = 2, STRIDE = 26016 };
  const uint64_t dims[] = {M, R, C};
  plan_quant q;
  ck_assert_ptr_null(plan_quant_of(PLAN_F8E4M3, 3, dims, &q));
  uint8_t *b = calloc(M, STRIDE);
  for (int m = 0; m < M; m++) {
    uint8_t *mat = b + (size_t)m * STRIDE;
    for (int k = 0; k < R * C; k++) mat[k] = (uint8_t)(k * 7 + m * 3);
    for (int k = 0; k < SR * SC; k++) mat[R * C + k] = (uint8_t)(120 + 4 * m + k);
  }
  for (uint64_t i = 0; i < (uint64_t)M * R * C; i++) {
    uint64_t m = i / (R * C), r = i % (R * C) / C, c = i % C;
    const uint8_t *mat = b + m * STRIDE;
    double want = e4m3_other(mat[r * C + c]) * pow(2.0, mat[R * C + (r / 128) * SC + c / 128] - 127.0);
    double got = plan_quant_element(PLAN_F8E4M3, &q, b, i);
    ck_assert_msg(got == want || (isnan(got) && isnan(want)), "f8 element %llu: %g, want %g",
                  (unsigned long long)i, got, want);
  }
  /* element [1, 129, 199]: code 0x7e (448) in block [1, 1] of matrix 1 */
  b[STRIDE + 129 * C + 199] = 0x7e;
  b[STRIDE + R * C + 3] = 130;
  ck_assert(plan_quant_element(PLAN_F8E4M3, &q, b, (uint64_t)2 * R * C - 1) == 448.0 * 8.0);
  free(b);

  enum { FM = 3, FR = 5, FC = 34, FS = 2, FSTRIDE = 96 };
  const uint64_t fdims[] = {FM, FR, FC};
  ck_assert_ptr_null(plan_quant_of(PLAN_MXFP4, 3, fdims, &q));
  b = calloc(FM, FSTRIDE);
  for (int m = 0; m < FM; m++) {
    uint8_t *mat = b + m * FSTRIDE;
    for (int k = 0; k < FR * FC / 2; k++) mat[k] = (uint8_t)(k * 29 + m);
    for (int k = 0; k < FR * FS; k++) mat[FR * FC / 2 + k] = (uint8_t)(125 + (k + m) % 5);
  }
  for (uint64_t i = 0; i < (uint64_t)FM * FR * FC; i++) {
    uint64_t m = i / (FR * FC), r = i % (FR * FC) / FC, c = i % FC;
    const uint8_t *mat = b + m * FSTRIDE;
    uint8_t byte = mat[(r * FC + c) / 2];
    double want = e2m1_other(c % 2 ? byte >> 4 : byte & 15u) * pow(2.0, mat[FR * FC / 2 + r * FS + c / 32] - 127.0);
    ck_assert_msg(plan_quant_element(PLAN_MXFP4, &q, b, i) == want, "fp4 element %llu", (unsigned long long)i);
  }
  free(b);
}
END_TEST

/* ---- damage ---------------------------------------------------------------- */

static uint32_t rd32(const uint8_t *b) {
  return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}
static void wr32(uint8_t *b, uint32_t v) {
  for (int i = 0; i < 4; i++) b[i] = (uint8_t)(v >> (8 * i));
}
static void wr64(uint8_t *b, uint64_t v) {
  for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
}
static uint64_t rd64(const uint8_t *b) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | b[i];
  return v;
}

/* File offset of a section's payload, read from the section table. */
static size_t sec_at(const uint8_t *b, uint32_t id) {
  uint32_t n = rd32(b + 12);
  for (uint32_t s = 0; s < n; s++) {
    const uint8_t *t = b + 64 + 24 * s;
    if (rd32(t) == id) return (size_t)rd64(t + 8);
  }
  ck_abort_msg("section %u not found", id);
  return 0;
}

/* Record `rec` of section `id`. */
static uint8_t *record_at(uint8_t *b, uint32_t id, uint32_t recsize, uint32_t rec) {
  return b + sec_at(b, id) + (size_t)rec * recsize;
}

/* Patched bytes keep a valid checksum, so the field checks are reached. */
static void reseal(uint8_t *b, size_t len) { rt_sha256(b + 64, len - 64, b + 24); }

/* Decodes a private copy of exactly len bytes (so ASan sees any overread)
 * and asserts failure with a message containing want. */
static void expect_fail(const uint8_t *bytes, size_t len, const char *want) {
  uint8_t *copy = malloc(len ? len : 1);
  if (len) memcpy(copy, bytes, len);
  plan d;
  rt_status st = plan_decode("plan.ds4p", len ? copy : NULL, len, &d);
  ck_assert_msg(st != NULL, "decode of damaged plan succeeded (want \"%s\")", want);
  ck_assert_msg(strstr(rt_status_msg(st), want) != NULL, "message \"%s\" lacks \"%s\"",
                rt_status_msg(st), want);
  ck_assert_msg(strncmp(rt_status_msg(st), "plan.ds4p: ", 11) == 0, "unprefixed: %s",
                rt_status_msg(st));
  ck_assert_ptr_null(d.tensors);
  ck_assert_ptr_null(d.strings);
  rt_status_free(st);
  free(copy);
}

/* Patch one u32 field of record `rec` at `field_off` in section `id`,
 * reseal, expect failure with `want`. */
static void expect_field_fail(uint32_t id, uint32_t recsize, uint32_t rec, uint32_t field_off,
                              uint32_t value, const char *want) {
  size_t len;
  uint8_t *b = encode_fixture(&len);
  wr32(record_at(b, id, recsize, rec) + field_off, value);
  reseal(b, len);
  expect_fail(b, len, want);
  free(b);
}

START_TEST(bad_header) {
  size_t len;
  uint8_t *b = encode_fixture(&len);
  expect_fail(b, 0, "too short");
  expect_fail(b, 63, "too short");
  /* Every proper prefix fails cleanly. */
  for (size_t n = 0; n < len; n++) {
    uint8_t *copy = malloc(n ? n : 1);
    memcpy(copy, b, n);
    plan d;
    rt_status st = plan_decode("plan.ds4p", copy, n, &d);
    ck_assert_msg(st != NULL, "prefix of %zu bytes decoded", n);
    ck_assert(strstr(rt_status_msg(st), n < 64 ? "too short" : "truncated") != NULL);
    rt_status_free(st);
    free(copy);
  }
  /* Bytes appended after a valid plan are refused too. */
  uint8_t *longer = calloc(1, len + 8);
  memcpy(longer, b, len);
  expect_fail(longer, len + 8, "header says");
  free(longer);

  uint8_t *m = malloc(len);
  memcpy(m, b, len);
  m[3] = 'X';
  expect_fail(m, len, "bad magic");

  ck_assert_uint_eq(rd32(b + 8) & 0xffff, 3); /* this format is 3.5 */
  ck_assert_uint_eq(rd32(b + 8) >> 16, 5);
  memcpy(m, b, len);
  m[8] = 2; /* a 2.x plan: kernels named a code object, with no block */
  m[10] = 0;
  reseal(m, len);
  expect_fail(m, len, "plan format version 2.0, this ds4run reads 3.x");
  m[8] = 1;
  reseal(m, len);
  expect_fail(m, len, "plan format version 1.0, this ds4run reads 3.x");
  m[8] = 4;
  m[10] = 4;
  reseal(m, len);
  expect_fail(m, len, "plan format version 4.4, this ds4run reads 3.x");

  /* A newer minor version is accepted; a flag it added is a permission
   * this reader drops, while the flags it knows stay. */
  memcpy(m, b, len);
  m[10] = 7;
  wr32(m + sec_at(m, PLAN_SEC_INFO) + 36, 0x80000000u | PLAN_FLAG_GRID_WAIT);
  reseal(m, len);
  plan d;
  rt_status st = plan_decode("plan.ds4p", m, len, &d);
  ck_assert_msg(st == NULL, "%s", rt_status_msg(st));
  ck_assert_uint_eq(d.info.flags, PLAN_FLAG_GRID_WAIT);
  plan_free(&d);

  /* One flipped payload byte breaks the checksum. */
  memcpy(m, b, len);
  m[len - 40] ^= 0x10;
  expect_fail(m, len, "checksum mismatch");
  memcpy(m, b, len);
  m[200] ^= 0x01; /* in the section table, also covered */
  expect_fail(m, len, "checksum mismatch");
  free(m);
  free(b);
}
END_TEST

START_TEST(bad_sections) {
  size_t len;
  uint8_t *b = encode_fixture(&len);
  uint8_t *m = malloc(len);
  uint8_t *t0 = m + 64; /* first table entry: strings */
  uint8_t *targs = m + 64 + 24 * (PLAN_SEC_ARGS - 1);

  memcpy(m, b, len);
  wr32(m + 12, 100000); /* table far past the end */
  expect_fail(m, len, "section table (100000 sections) runs past the end");

  memcpy(m, b, len);
  wr32(m + 12, PLAN_NSECTIONS - 1); /* drop WORK, the last entry, from the table */
  reseal(m, len);
  expect_fail(m, len, "required work section is missing");
  wr32(m + 12, PLAN_NSECTIONS - 2); /* and FPARAMS */
  reseal(m, len);
  expect_fail(m, len, "required fparams section is missing");
  wr32(m + 12, PLAN_NSECTIONS - 3); /* and COSTS */
  reseal(m, len);
  expect_fail(m, len, "required costs section is missing");
  wr32(m + 12, PLAN_NSECTIONS - 4); /* and ROWS */
  reseal(m, len);
  expect_fail(m, len, "required rows section is missing");

  memcpy(m, b, len);
  wr32(targs, 99);
  reseal(m, len);
  expect_fail(m, len, "unknown section id 99");
  /* ...which a newer minor may add: skipped, so ARGS is then missing. */
  m[10] = PLAN_VERSION_MINOR + 1;
  reseal(m, len);
  expect_fail(m, len, "required args section is missing");

  memcpy(m, b, len);
  wr32(targs, PLAN_SEC_OPS);
  reseal(m, len);
  expect_fail(m, len, "ops section appears twice");

  memcpy(m, b, len);
  wr64(targs + 8, rd64(targs + 8) + 4);
  reseal(m, len);
  expect_fail(m, len, "is not 8-byte aligned");

  memcpy(m, b, len);
  wr64(targs + 8, (uint64_t)len + 8);
  reseal(m, len);
  expect_fail(m, len, "run past the end");

  memcpy(m, b, len);
  wr64(targs + 16, UINT64_MAX - 3); /* size that would wrap */
  reseal(m, len);
  expect_fail(m, len, "run past the end");

  memcpy(m, b, len);
  wr64(t0 + 8, 64); /* strings placed over the header's tail and table */
  reseal(m, len);
  expect_fail(m, len, "overlap");

  memcpy(m, b, len);
  wr32(targs + 4, 8); /* count 8, size still 7 records */
  reseal(m, len);
  expect_fail(m, len, "size 168 != 8 records * 24 bytes");

  memcpy(m, b, len);
  uint8_t *trows = m + 64 + 24 * (PLAN_SEC_ROWS - 1);
  wr32(trows + 4, 3); /* count 3, size still 2 rows */
  reseal(m, len);
  expect_fail(m, len, "size 8 != 3 records * 4 bytes");

  memcpy(m, b, len);
  uint8_t *tinfo = m + 64 + 24 * (PLAN_SEC_INFO - 1);
  wr32(tinfo + 4, 0);
  wr64(tinfo + 16, 0);
  reseal(m, len);
  expect_fail(m, len, "info section holds 0 records");

  memcpy(m, b, len);
  uint32_t slen = rd32(t0 + 4);
  m[sec_at(m, PLAN_SEC_STRINGS) + slen - 1] = 'x';
  reseal(m, len);
  expect_fail(m, len, "strings section does not end in a NUL byte");
  free(m);
  free(b);
}
END_TEST

/* File record sizes and field offsets, as docs/PLAN.md gives them. */
enum { R_INFO = 48, R_DEVICE = 40, R_STREAM = 8, R_TENSOR = 96, R_KERNEL = 24, R_OP = 16,
       R_EDGE = 16, R_CMD = 32, R_ARG = 24, R_ROW = 4, R_CODEOBJ = 40, R_PARAM = 16 };
/* Field offsets of TENSORS, ARGS, KERNELS and CODEOBJS records. */
enum { T_DEVICE = 20, T_VIEW_OF = 24, T_ROWS = 28, T_DIM = 32, T_BYTES = 64, T_OFFSET = 72 };
enum { A_TENSOR = 0, A_RESERVED = 4, A_OFFSET = 8, A_BYTES = 16 };
enum { K_SYMBOL = 0, K_KIND = 4, K_GRID = 8, K_BLOCK = 12, K_SHARED = 16, K_NBUFS = 20 };
enum { C_PATH = 0, C_TARGET = 4, C_SHA256 = 8 };

/* The 3.0 kernel and code object records, byte by byte. */
START_TEST(kernel_layout) {
  fixture f;
  fixture_build(&f);
  size_t len;
  uint8_t *b = encode_fixture(&len);
  uint8_t *k = record_at(b, PLAN_SEC_KERNELS, R_KERNEL, 1);
  ck_assert_uint_eq(rd32(k + K_SYMBOL), f.kernels[1].symbol);
  ck_assert_uint_eq(rd32(k + K_KIND), f.kernels[1].kind);
  ck_assert_uint_eq(rd32(k + K_GRID), 1);
  ck_assert_uint_eq(rd32(k + K_BLOCK), 256);
  ck_assert_uint_eq(rd32(k + K_SHARED), 2048);
  ck_assert_uint_eq(rd32(k + K_NBUFS), 2);
  k = record_at(b, PLAN_SEC_KERNELS, R_KERNEL, 0);
  ck_assert_uint_eq(rd32(k + K_GRID), 4);
  ck_assert_uint_eq(rd32(k + K_BLOCK), 64);
  ck_assert_uint_eq(rd32(k + K_NBUFS), 3);
  /* The section is exactly two 24-byte records. */
  const uint8_t *t = b + 64 + 24 * (PLAN_SEC_KERNELS - 1);
  ck_assert_uint_eq(rd32(t + 4), 2);
  ck_assert_uint_eq(rd64(t + 16), 2 * R_KERNEL);
  uint8_t *c = record_at(b, PLAN_SEC_CODEOBJS, R_CODEOBJ, 1);
  ck_assert_uint_eq(rd32(c + C_PATH), f.codeobjs[1].path);
  ck_assert_uint_eq(rd32(c + C_TARGET), f.codeobjs[1].target);
  ck_assert_mem_eq(c + C_SHA256, f.codeobjs[1].sha256, 32);
  free(b);
}
END_TEST

/* Grid, block, shared memory and buffer count each have a bound, and a
 * target has one code object. */
START_TEST(bad_kernels) {
  expect_field_fail(PLAN_SEC_KERNELS, R_KERNEL, 1, K_GRID, 0,
                    "plan.ds4p: kernel 1: empty grid (grid 0)");
  expect_field_fail(PLAN_SEC_KERNELS, R_KERNEL, 0, K_BLOCK, 0,
                    "plan.ds4p: kernel 0: block of 0 threads (must be 1..1024)");
  expect_field_fail(PLAN_SEC_KERNELS, R_KERNEL, 0, K_BLOCK, 1025,
                    "kernel 0: block of 1025 threads (must be 1..1024)");
  expect_field_fail(PLAN_SEC_KERNELS, R_KERNEL, 1, K_SHARED, 65537,
                    "kernel 1: 65537 bytes of shared memory per block (at most 65536)");
  expect_field_fail(PLAN_SEC_KERNELS, R_KERNEL, 0, K_NBUFS, 17,
                    "kernel 0: nbufs 17 (at most 16 buffers per launch)");

  /* The limits themselves are valid. */
  fixture f;
  fixture_build(&f);
  f.kernels[0].block = 1024;
  f.kernels[1].block = 1;
  f.kernels[1].shared = 65536;
  uint8_t *bytes;
  size_t len;
  rt_status st = plan_encode(&f.p, &bytes, &len);
  ck_assert_msg(st == NULL, "%s", rt_status_msg(st));
  free(bytes);

  /* Two code objects for one target: which would a device load? */
  uint8_t *b = encode_fixture(&len);
  uint32_t host = rd32(record_at(b, PLAN_SEC_CODEOBJS, R_CODEOBJ, 0) + C_TARGET);
  free(b);
  expect_field_fail(PLAN_SEC_CODEOBJS, R_CODEOBJ, 1, C_TARGET, host,
                    "plan.ds4p: codeobj 1: target 'host' is also codeobj 0's (one code object per "
                    "target)");
  fixture_build(&f);
  f.codeobjs[0].target = f.codeobjs[1].target;
  st = plan_encode(&f.p, &bytes, &len);
  ck_assert_ptr_nonnull(st);
  ck_assert_str_eq(rt_status_msg(st),
                   "plan: codeobj 1: target 'gfx1201' is also codeobj 0's (one code object per "
                   "target)");
  rt_status_free(st);
}
END_TEST

START_TEST(bad_fields) {
  expect_field_fail(PLAN_SEC_STREAMS, R_STREAM, 1, 4, 7,
                    "plan.ds4p: stream 1: device index 7 out of range (2 devices)");
  expect_field_fail(PLAN_SEC_COMMANDS, R_CMD, 6, 12, 99,
                    "plan.ds4p: command 6: kernel index 99 out of range (2 kernels)");
  expect_field_fail(PLAN_SEC_TENSORS, R_TENSOR, 1, 0, 9999,
                    "tensor 1: name string offset 9999 out of range");
  expect_field_fail(PLAN_SEC_TENSORS, R_TENSOR, 1, 0, 2,
                    "tensor 1: name string offset 2 is not the start of a string");
  expect_field_fail(PLAN_SEC_INFO, R_INFO, 0, 0, 100000, "info: model string offset 100000");
  expect_field_fail(PLAN_SEC_PARAMS, R_PARAM, 1, 0, 5000, "param 1: name string offset 5000");
  expect_field_fail(PLAN_SEC_DEVICES, R_DEVICE, 1, 8, 5000, "device 1: arch string offset");
  expect_field_fail(PLAN_SEC_CODEOBJS, R_CODEOBJ, 0, 4, 5000, "codeobj 0: target string offset");
  expect_field_fail(PLAN_SEC_KERNELS, R_KERNEL, 1, 4, 5000, "kernel 1: kind string offset");
  expect_field_fail(PLAN_SEC_OPS, R_OP, 2, 0, 5000, "op 2: path string offset");
  expect_field_fail(PLAN_SEC_COMMANDS, R_CMD, 1, 12, 5,
                    "command 1: event index 5 out of range (2 events)");
  expect_field_fail(PLAN_SEC_TENSORS, R_TENSOR, 5, T_OFFSET, 2000,
                    "tensor 5: offset 2000 + 128 bytes exceeds device 1's arena (2048 bytes)");
  expect_field_fail(PLAN_SEC_COMMANDS, R_CMD, 6, 20, 6,
                    "command 6: args range [6, +2) out of range (7 args)");
  expect_field_fail(PLAN_SEC_COMMANDS, R_CMD, 6, 20, 0xfffffffeu, "command 6: args range");
  expect_field_fail(PLAN_SEC_TENSORS, R_TENSOR, 2, 8, 9, "tensor 2: dtype 9 is not a known value");
  expect_field_fail(PLAN_SEC_TENSORS, R_TENSOR, 2, 12, 5, "tensor 2: role 5 is not a known value");
  expect_field_fail(PLAN_SEC_DEVICES, R_DEVICE, 0, 4, 3, "device 0: backend 3 is not a known");
  expect_field_fail(PLAN_SEC_EDGES, R_EDGE, 1, 12, 3, "edge 1: hazard 3 is not a known");
  expect_field_fail(PLAN_SEC_EDGES, R_EDGE, 0, 4, 3, "edge 0: to op index 3 out of range (3 ops)");
  expect_field_fail(PLAN_SEC_EDGES, R_EDGE, 0, 4, 0, "edge 0: op 0 depends on itself");
  expect_field_fail(PLAN_SEC_EDGES, R_EDGE, 0, 8, 9, "edge 0: tensor index 9 out of range");
  expect_field_fail(PLAN_SEC_COMMANDS, R_CMD, 3, 0, 4, "command 3: kind 4 is not a known value");
  expect_field_fail(PLAN_SEC_COMMANDS, R_CMD, 3, 4, 3, "command 3: stream index 3 out of range");
  expect_field_fail(PLAN_SEC_COMMANDS, R_CMD, 0, 8, 3, "command 0: op index 3 out of range");
  expect_field_fail(PLAN_SEC_COMMANDS, R_CMD, 0, 4, 1, "command 0: on stream 1 but op 0");
  expect_field_fail(PLAN_SEC_COMMANDS, R_CMD, 0, 12, 1,
                    "command 0: launches kernel 1 but op 0 has kernel 0");
  expect_field_fail(PLAN_SEC_COMMANDS, R_CMD, 0, 24, 2,
                    "command 0: nargs 2 but kernel 0 takes 3 buffers");
  expect_field_fail(PLAN_SEC_COMMANDS, R_CMD, 1, 24, 1, "command 1: nargs 1 on an event command");
  expect_field_fail(PLAN_SEC_COMMANDS, R_CMD, 1, 8, 0, "command 1: event command names op 0");
  /* WAIT's b must be an earlier RECORD of the same event. */
  expect_field_fail(PLAN_SEC_COMMANDS, R_CMD, 5, 16, 3,
                    "command 5: waits on command 3, which is not an earlier record of event 1");
  expect_field_fail(PLAN_SEC_COMMANDS, R_CMD, 5, 16, 1, "command 5: waits on command 1");
  expect_field_fail(PLAN_SEC_COMMANDS, R_CMD, 2, 16, 4, "command 2: waits on command 4");
  expect_field_fail(PLAN_SEC_ARGS, R_ARG, 4, A_TENSOR, 9,
                    "arg 4: tensor index 9 out of range (9 tensors)");
  expect_field_fail(PLAN_SEC_TENSORS, R_TENSOR, 1, 16, 5, "tensor 1: ndim 5 exceeds 4");
  expect_field_fail(PLAN_SEC_TENSORS, R_TENSOR, 1, T_DEVICE, 2,
                    "tensor 1: device index 2 out of range");
  expect_field_fail(PLAN_SEC_TENSORS, R_TENSOR, 1, T_BYTES, 100,
                    "tensor 1: bytes 100 does not match shape and dtype f32 (128 bytes)");
  expect_field_fail(PLAN_SEC_TENSORS, R_TENSOR, 1, 4, 3, "tensor 1: checkpoint string offset 3");
  expect_field_fail(PLAN_SEC_OPS, R_OP, 0, 4, 3, "op 0: stream index 3 out of range");
  expect_field_fail(PLAN_SEC_OPS, R_OP, 0, 8, 2, "op 0: kernel index 2 out of range");
  expect_field_fail(PLAN_SEC_INFO, R_INFO, 0, 24, 9, "info: ids_tensor index 9 out of range");
  expect_field_fail(PLAN_SEC_INFO, R_INFO, 0, 24, 1, "info: ids_tensor 1 has dtype f32, not i32");
  expect_field_fail(PLAN_SEC_INFO, R_INFO, 0, 28, 2, "info: next_tensor 2 has dtype f32, not i32");
  expect_field_fail(PLAN_SEC_INFO, R_INFO, 0, 36, 2 | 8, "plan.ds4p: info: unknown flags 0x8 (this runtime knows 0x3)");

  /* A shape whose byte count overflows 64 bits. */
  size_t len;
  uint8_t *b = encode_fixture(&len);
  uint8_t *t = b + sec_at(b, PLAN_SEC_TENSORS) + 1 * R_TENSOR;
  wr64(t + T_DIM, 1ull << 40);
  wr64(t + T_DIM + 8, 1ull << 40);
  reseal(b, len);
  expect_fail(b, len, "tensor 1: shape overflows");
  /* An offset so large that offset + bytes wraps. */
  free(b);
  b = encode_fixture(&len);
  wr64(b + sec_at(b, PLAN_SEC_TENSORS) + 1 * R_TENSOR + T_OFFSET, UINT64_MAX - 8);
  reseal(b, len);
  expect_fail(b, len, "tensor 1: offset");
  free(b);
}
END_TEST

/* Tensors 6 (a weight source on no device), 7 (its experts 3 and 1, rows
 * 0..1) and 8 (a replica of tensor 1), damaged one rule at a time. */
START_TEST(bad_views) {
  expect_field_fail(PLAN_SEC_TENSORS, R_TENSOR, 7, T_VIEW_OF, 99,
                    "plan.ds4p: tensor 7: view_of index 99 out of range (9 tensors)");
  expect_field_fail(PLAN_SEC_TENSORS, R_TENSOR, 8, T_VIEW_OF, 2,
                    "tensor 8: view of tensor 2, whose role is activation (not weight)");
  expect_field_fail(PLAN_SEC_TENSORS, R_TENSOR, 8, T_VIEW_OF, 7,
                    "tensor 8: view of tensor 7, which is itself a view (of tensor 6)");
  expect_field_fail(PLAN_SEC_TENSORS, R_TENSOR, 8, T_VIEW_OF, 8,
                    "tensor 8: view of tensor 8, which is itself a view (of tensor 8)");
  expect_field_fail(PLAN_SEC_TENSORS, R_TENSOR, 3, T_VIEW_OF, 2,
                    "tensor 3: a view (view_of 2) of role activation: only weights may be views");
  expect_field_fail(PLAN_SEC_TENSORS, R_TENSOR, 1, T_ROWS, 0,
                    "tensor 1: rows 0 on a tensor that is not a view");
  expect_field_fail(PLAN_SEC_TENSORS, R_TENSOR, 7, T_ROWS, PLAN_NONE,
                    "tensor 7: dim[0] is 2 but its source tensor 6 has 4 (a view without rows "
                    "holds every source row)");
  expect_field_fail(PLAN_SEC_TENSORS, R_TENSOR, 7, T_ROWS, 1,
                    "tensor 7: rows [1, +2) out of range (2 rows)");
  expect_field_fail(PLAN_SEC_TENSORS, R_TENSOR, 7, T_ROWS, 0xfffffffeu,
                    "tensor 7: rows [4294967294, +2) out of range (2 rows)");
  expect_field_fail(PLAN_SEC_ROWS, R_ROW, 0, 0, 4,
                    "tensor 7: row 0 maps to row 4 of tensor 6, which has 4 rows");
  expect_field_fail(PLAN_SEC_ROWS, R_ROW, 1, 0, PLAN_NONE,
                    "tensor 7: row 1 maps to row 4294967295 of tensor 6");
  /* Residency: only a weight that is not a view may have no device, and
   * then it has no arena offset either. */
  expect_field_fail(PLAN_SEC_TENSORS, R_TENSOR, 2, T_DEVICE, PLAN_NONE,
                    "tensor 2: device none, but only a weight may be non-resident (role "
                    "activation)");
  expect_field_fail(PLAN_SEC_TENSORS, R_TENSOR, 8, T_DEVICE, PLAN_NONE,
                    "tensor 8: device none, but a view must be resident (view of tensor 1)");
  expect_field_fail(PLAN_SEC_TENSORS, R_TENSOR, 6, T_OFFSET, 8,
                    "tensor 6: non-resident (device none) but offset 8 (must be 0)");

  /* Shape and dtype against the source, bytes kept consistent so that the
   * view rule is what refuses them. */
  size_t len;
  uint8_t *b = encode_fixture(&len);
  uint8_t *t = record_at(b, PLAN_SEC_TENSORS, R_TENSOR, 7);
  wr64(t + T_DIM + 8, 4); /* [2, 4] of a [4, 8] source */
  wr64(t + T_BYTES, 32);
  reseal(b, len);
  expect_fail(b, len, "tensor 7: dim[1] is 4 but its source tensor 6 has 8");
  free(b);

  b = encode_fixture(&len);
  t = record_at(b, PLAN_SEC_TENSORS, R_TENSOR, 8);
  wr32(t + 8, PLAN_BF16);
  wr64(t + T_BYTES, 64);
  reseal(b, len);
  expect_fail(b, len, "tensor 8: bf16 with ndim 2 but its source tensor 1 is f32 with ndim 2");
  free(b);

  b = encode_fixture(&len);
  t = record_at(b, PLAN_SEC_TENSORS, R_TENSOR, 8);
  wr32(t + 16, 3); /* [4, 8, 1]: same bytes, one more dim */
  wr64(t + T_DIM + 16, 1);
  reseal(b, len);
  expect_fail(b, len, "tensor 8: f32 with ndim 3 but its source tensor 1 is f32 with ndim 2");
  free(b);

  /* A rows list needs a dim 0 to index. */
  fixture f;
  fixture_build(&f);
  f.tensors[1].ndim = f.tensors[8].ndim = 0;
  f.tensors[1].bytes = f.tensors[8].bytes = 4;
  f.tensors[8].rows = 0;
  uint8_t *bytes;
  rt_status st = plan_encode(&f.p, &bytes, &len);
  ck_assert_ptr_nonnull(st);
  ck_assert_str_eq(rt_status_msg(st), "plan: tensor 8: rows 0 on a view with no dim 0");
  rt_status_free(st);
}
END_TEST

/* The fixture with tensor 1 (and its replica 8) f8e4m3 [4, 8] and the
 * experts (6, and their view 7 of rows {3, 1}) mxfp4 [4, 2, 8]: byte
 * counts, arg ranges and views under the quantized layout. */
static void quant_fixture(fixture *f) {
  fixture_build(f);
  const uint64_t d48[] = {4, 8}, d428[] = {4, 2, 8}, d228[] = {2, 2, 8};
  for (int k = 1; k <= 8; k += 7) {
    plan_tensor *t = &f->tensors[k];
    t->dtype = PLAN_F8E4M3;
    t->bytes = plan_tensor_bytes(PLAN_F8E4M3, 2, d48); /* 32 codes + 1 scale: 48 */
  }
  f->args[1].bytes = 48;
  plan_tensor *e = &f->tensors[6], *v = &f->tensors[7];
  e->dtype = v->dtype = PLAN_MXFP4;
  e->ndim = v->ndim = 3;
  memcpy(e->dim, d428, sizeof d428);
  memcpy(v->dim, d228, sizeof d228);
  e->bytes = plan_tensor_bytes(PLAN_MXFP4, 3, d428); /* 8 code bytes + 2 scales: 16 a matrix */
  v->bytes = plan_tensor_bytes(PLAN_MXFP4, 3, d228);
  f->args[5].bytes = v->bytes;
}

START_TEST(quant_plans) {
  fixture f;
  quant_fixture(&f);
  ck_assert_uint_eq(f.tensors[1].bytes, 48);
  ck_assert_uint_eq(f.tensors[6].bytes, 64);
  ck_assert_uint_eq(f.tensors[7].bytes, 32);
  uint8_t *bytes;
  size_t len;
  rt_status st = plan_encode(&f.p, &bytes, &len);
  ck_assert_msg(st == NULL, "%s", rt_status_msg(st));
  plan d;
  st = plan_decode("plan.ds4p", bytes, len, &d);
  ck_assert_msg(st == NULL, "%s", rt_status_msg(st));
  assert_plans_equal(&f.p, &d);
  ck_assert_uint_eq(d.tensors[1].dtype, PLAN_F8E4M3);
  ck_assert_uint_eq(d.tensors[7].dtype, PLAN_MXFP4);
  plan_free(&d);

  /* bytes that do not match the layout */
  uint8_t *t = record_at(bytes, PLAN_SEC_TENSORS, R_TENSOR, 1);
  wr64(t + T_BYTES, 33); /* the codes and the scale, without the padding */
  reseal(bytes, len);
  expect_fail(bytes, len, "plan.ds4p: tensor 1: bytes 33 does not match shape and dtype f8e4m3 (48 bytes)");
  wr64(t + T_BYTES, 32 * 4); /* f32's */
  reseal(bytes, len);
  expect_fail(bytes, len, "tensor 1: bytes 128 does not match shape and dtype f8e4m3 (48 bytes)");
  wr64(t + T_BYTES, 48);
  /* shapes that cannot hold the dtype: an odd last dim of mxfp4, one dim */
  t = record_at(bytes, PLAN_SEC_TENSORS, R_TENSOR, 6);
  wr64(t + T_DIM + 16, 7);
  reseal(bytes, len);
  expect_fail(bytes, len,
              "plan.ds4p: tensor 6: shape cannot hold mxfp4: mxfp4 packs two values a byte along the last dim, "
              "which must be even");
  wr64(t + T_DIM + 16, 8);
  t = record_at(bytes, PLAN_SEC_TENSORS, R_TENSOR, 1);
  wr32(t + 16, 1);
  reseal(bytes, len);
  expect_fail(bytes, len,
              "tensor 1: shape cannot hold f8e4m3: a quantized weight needs 2 or more dims (its last two a matrix)");
  free(bytes);

  /* an arg must not split a matrix */
  quant_fixture(&f);
  f.args[5].bytes = 8;
  st = plan_encode(&f.p, &bytes, &len);
  ck_assert_ptr_nonnull(st);
  ck_assert_str_eq(rt_status_msg(st), "plan: arg 5: bytes [0, +8) of tensor 7 split its mxfp4 elements (16 bytes)");
  rt_status_free(st);
  /* a view's rows of a 2-D quantized tensor would cut its scale blocks */
  quant_fixture(&f);
  const uint64_t d48[] = {4, 8}, d28[] = {2, 8};
  f.tensors[6].ndim = f.tensors[7].ndim = 2;
  memcpy(f.tensors[6].dim, d48, sizeof d48);
  memcpy(f.tensors[7].dim, d28, sizeof d28);
  f.tensors[6].bytes = plan_tensor_bytes(PLAN_MXFP4, 2, d48);
  f.tensors[7].bytes = f.args[5].bytes = plan_tensor_bytes(PLAN_MXFP4, 2, d28);
  st = plan_encode(&f.p, &bytes, &len);
  ck_assert_ptr_nonnull(st);
  ck_assert_str_eq(rt_status_msg(st), "plan: tensor 7: rows 0 on a 2-D mxfp4 view: the rows of a quantized matrix "
                                      "are not whole matrices (a row list needs 3 or more dims)");
  rt_status_free(st);
}
END_TEST

START_TEST(bad_args) {
  expect_field_fail(PLAN_SEC_ARGS, R_ARG, 5, A_TENSOR, 6,
                    "plan.ds4p: arg 5: tensor 6 is not resident (device none)");
  expect_field_fail(PLAN_SEC_ARGS, R_ARG, 0, A_BYTES, 0, "arg 0: an empty range (bytes 0)");
  expect_field_fail(PLAN_SEC_ARGS, R_ARG, 3, A_OFFSET, 80,
                    "arg 3: bytes [80, +64) run past the end of tensor 2 (128 bytes)");
  expect_field_fail(PLAN_SEC_ARGS, R_ARG, 3, A_BYTES, 97,
                    "arg 3: bytes [32, +97) run past the end of tensor 2 (128 bytes)");
  expect_field_fail(PLAN_SEC_ARGS, R_ARG, 3, A_OFFSET, 34,
                    "arg 3: bytes [34, +64) of tensor 2 split its f32 elements (4 bytes)");
  expect_field_fail(PLAN_SEC_ARGS, R_ARG, 3, A_BYTES, 62,
                    "arg 3: bytes [32, +62) of tensor 2 split its f32 elements (4 bytes)");
  /* A launch reads only its own device's arena. */
  expect_field_fail(PLAN_SEC_ARGS, R_ARG, 2, A_TENSOR, 3,
                    "command 0: arg 2 is tensor 3 of device 1, but the launch's stream 0 is on "
                    "device 0");
  expect_field_fail(PLAN_SEC_ARGS, R_ARG, 1, A_TENSOR, 8,
                    "command 0: arg 1 is tensor 8 of device 1");

  /* offset + bytes must not wrap around. */
  size_t len;
  uint8_t *b = encode_fixture(&len);
  wr64(record_at(b, PLAN_SEC_ARGS, R_ARG, 3) + A_OFFSET, UINT64_MAX - 8);
  reseal(b, len);
  expect_fail(b, len, "arg 3: bytes [18446744073709551607, +64) run past the end");
  free(b);
  b = encode_fixture(&len);
  wr64(record_at(b, PLAN_SEC_ARGS, R_ARG, 3) + A_BYTES, UINT64_MAX);
  reseal(b, len);
  expect_fail(b, len, "arg 3: bytes [32, +18446744073709551615) run past the end");
  free(b);
}
END_TEST

/* The reserved word of an arg follows the format's rule for every reserved
 * field: written as zero, ignored on read (a later minor may use it). */
START_TEST(arg_reserved_ignored) {
  size_t len;
  uint8_t *b = encode_fixture(&len);
  ck_assert_uint_eq(rd32(record_at(b, PLAN_SEC_ARGS, R_ARG, 2) + A_RESERVED), 0);
  uint8_t *m = malloc(len);
  memcpy(m, b, len);
  wr32(record_at(m, PLAN_SEC_ARGS, R_ARG, 2) + A_RESERVED, 7);
  reseal(m, len);
  plan d;
  rt_status st = plan_decode("plan.ds4p", m, len, &d);
  ck_assert_msg(st == NULL, "%s", rt_status_msg(st));
  ck_assert_uint_eq(d.args[2].reserved, 0);
  uint8_t *again;
  size_t n;
  ck_assert_ptr_null(plan_encode(&d, &again, &n));
  ck_assert_uint_eq(n, len);
  ck_assert_mem_eq(again, b, len);
  free(again);
  plan_free(&d);
  free(m);
  free(b);
}
END_TEST

/* Command 3 copies args 3 -> 4 (h on device 0 into h@cpu1 on device 1) on
 * stream 1 of device 0. */
START_TEST(bad_copies) {
  expect_field_fail(PLAN_SEC_COMMANDS, R_CMD, 3, 24, 1,
                    "plan.ds4p: command 3: copy with nargs 1 (must be 2: source, destination)");
  expect_field_fail(PLAN_SEC_COMMANDS, R_CMD, 3, 24, 3, "command 3: copy with nargs 3");
  expect_field_fail(PLAN_SEC_COMMANDS, R_CMD, 3, 20, 6,
                    "command 3: args range [6, +2) out of range (7 args)");
  expect_field_fail(PLAN_SEC_COMMANDS, R_CMD, 3, 12, 2,
                    "command 3: copy with a 2 and b 4294967295 (both must be none");
  expect_field_fail(PLAN_SEC_COMMANDS, R_CMD, 3, 16, 3,
                    "command 3: copy with a 4294967295 and b 3");
  expect_field_fail(PLAN_SEC_OPS, R_OP, 1, 8, 0, "command 3: copy of op 1, which has kernel 0");
  expect_field_fail(PLAN_SEC_ARGS, R_ARG, 4, A_BYTES, 32,
                    "command 3: copy of 64 bytes (arg 3) into 32 bytes (arg 4)");
  /* From device 1 to device 1, on a stream of device 0. */
  expect_field_fail(PLAN_SEC_ARGS, R_ARG, 3, A_TENSOR, 3,
                    "command 3: copy from device 1 to device 1 on stream 1 of device 0 (a copy "
                    "runs on a stream of its source's or its destination's device)");

  /* The same copy on the destination's side is valid too. */
  fixture f;
  fixture_build(&f);
  f.ops[1].stream = 2;
  f.commands[3].stream = 2;
  uint8_t *bytes;
  size_t len;
  rt_status st = plan_encode(&f.p, &bytes, &len);
  ck_assert_msg(st == NULL, "%s", rt_status_msg(st));
  free(bytes);
}
END_TEST

/* COSTS (3.1): none, or one finite, non-negative prediction per op; a 3.0
 * plan has no such section, and may not have one. */
START_TEST(bad_costs) {
  enum { R_COST = 8 };
  size_t len;
  uint8_t *b = encode_fixture(&len);
  uint8_t *m = malloc(len);
  uint8_t *tcosts = m + 64 + 24 * (PLAN_SEC_COSTS - 1);
  ck_assert_uint_eq(rd32(b + 64 + 24 * (PLAN_SEC_COSTS - 1)), PLAN_SEC_COSTS);
  /* The records: f64 nanoseconds, in op order. */
  double v;
  uint64_t bits = rd64(record_at(b, PLAN_SEC_COSTS, R_COST, 2));
  memcpy(&v, &bits, 8);
  ck_assert(v == 3.5e9);

  memcpy(m, b, len);
  wr32(tcosts + 4, 2);
  wr64(tcosts + 16, 2 * R_COST);
  reseal(m, len);
  expect_fail(m, len, "plan.ds4p: costs: 2 records for 3 ops (one per op, or none)");

  static const struct {
    uint32_t rec;
    double value;
    const char *want;
  } bad[] = {
      {1, -1.0, "plan.ds4p: cost 1: -1 ns (must be finite and >= 0)"},
      {0, NAN, "plan.ds4p: cost 0: nan ns (must be finite and >= 0)"},
      {2, INFINITY, "plan.ds4p: cost 2: inf ns (must be finite and >= 0)"},
      {2, -INFINITY, "plan.ds4p: cost 2: -inf ns"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    memcpy(m, b, len);
    memcpy(&bits, &bad[i].value, 8);
    wr64(record_at(m, PLAN_SEC_COSTS, R_COST, bad[i].rec), bits);
    reseal(m, len);
    expect_fail(m, len, bad[i].want);
  }

  /* A 3.0 plan: no COSTS (nor FPARAMS and WORK) in the table decodes
   * without costs; one with a COSTS section is damage (the section came in
   * 3.1). */
  memcpy(m, b, len);
  m[10] = 0;
  wr32(m + 12, PLAN_NSECTIONS - 2);
  reseal(m, len);
  expect_fail(m, len, "section 13: unknown section id 14");
  wr32(m + 12, PLAN_NSECTIONS - 3);
  reseal(m, len);
  plan d;
  rt_status st = plan_decode("plan.ds4p", m, len, &d);
  ck_assert_msg(st == NULL, "%s", rt_status_msg(st));
  ck_assert_uint_eq(d.ncosts, 0);
  ck_assert_ptr_null(d.costs);
  ck_assert_uint_eq(d.nops, 3);
  plan_free(&d);
  free(m);
  free(b);

  /* The encoder: no costs is a plan too (one no cost model wrote), and it
   * round-trips; a wrong count or value is refused. */
  fixture f;
  fixture_build(&f);
  f.p.ncosts = 0;
  uint8_t *bytes;
  ck_assert_ptr_null(plan_encode(&f.p, &bytes, &len));
  st = plan_decode("plan.ds4p", bytes, len, &d);
  ck_assert_msg(st == NULL, "%s", rt_status_msg(st));
  assert_plans_equal(&f.p, &d);
  plan_free(&d);
  free(bytes);
  f.p.ncosts = 2;
  st = plan_encode(&f.p, &bytes, &len);
  ck_assert_ptr_nonnull(st);
  ck_assert_str_eq(rt_status_msg(st), "plan: costs: 2 records for 3 ops (one per op, or none)");
  rt_status_free(st);
  fixture_build(&f);
  f.costs[1] = NAN;
  st = plan_encode(&f.p, &bytes, &len);
  ck_assert_ptr_nonnull(st);
  ck_assert_str_eq(rt_status_msg(st), "plan: cost 1: nan ns (must be finite and >= 0)");
  rt_status_free(st);
  fixture_build(&f);
  f.p.costs = NULL;
  st = plan_encode(&f.p, &bytes, &len);
  ck_assert_ptr_nonnull(st);
  ck_assert_str_eq(rt_status_msg(st), "plan: costs: 3 records but no array");
  rt_status_free(st);
}
END_TEST

/* Float params (3.5): a name in the strings and a finite value; a 3.4
 * plan has none, and one with the section is damage. */
START_TEST(bad_fparams) {
  enum { R_FPARAM = 16 };
  size_t len;
  uint8_t *b = encode_fixture(&len);
  uint8_t *m = malloc(len);
  double v;
  uint64_t bits = rd64(record_at(b, PLAN_SEC_FPARAMS, R_FPARAM, 1) + 8);
  memcpy(&v, &bits, 8);
  ck_assert(v == 160000.0);

  static const double bad[] = {NAN, INFINITY, -INFINITY};
  static const char *const want[] = {"plan.ds4p: fparam 1: value nan is not finite",
                                     "plan.ds4p: fparam 1: value inf is not finite",
                                     "plan.ds4p: fparam 1: value -inf is not finite"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    memcpy(m, b, len);
    memcpy(&bits, &bad[i], 8);
    wr64(record_at(m, PLAN_SEC_FPARAMS, R_FPARAM, 1) + 8, bits);
    reseal(m, len);
    expect_fail(m, len, want[i]);
  }
  memcpy(m, b, len);
  wr32(record_at(m, PLAN_SEC_FPARAMS, R_FPARAM, 0), 0xfffffff0u);
  reseal(m, len);
  expect_fail(m, len, "plan.ds4p: fparam 0: name");

  memcpy(m, b, len);
  m[10] = 4;
  reseal(m, len);
  expect_fail(m, len, "unknown section id 15");
  wr32(m + 12, PLAN_NSECTIONS - 2);
  reseal(m, len);
  plan d;
  rt_status st = plan_decode("plan.ds4p", m, len, &d);
  ck_assert_msg(st == NULL, "%s", rt_status_msg(st));
  ck_assert_uint_eq(d.nfparams, 0);
  ck_assert_uint_eq(d.nwork, 0);
  ck_assert_uint_eq(d.ncosts, 3);
  plan_free(&d);
  free(m);
  free(b);
}
END_TEST

/* Work (3.5): one record per op or none, each finite and >= 0. */
START_TEST(bad_work) {
  size_t len;
  uint8_t *b = encode_fixture(&len);
  uint8_t *m = malloc(len);
  uint64_t bits = rd64(record_at(b, PLAN_SEC_WORK, 16, 2));
  double v;
  memcpy(&v, &bits, 8);
  ck_assert(v == 1e9);
  static const struct {
    int field;
    double value;
    const char *want;
  } bad[] = {
      {0, -1.0, "plan.ds4p: work 1: -1 bytes, 0 flops (each must be finite and >= 0)"},
      {8, NAN, "plan.ds4p: work 1: 64 bytes, nan flops (each must be finite and >= 0)"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    memcpy(m, b, len);
    memcpy(&bits, &bad[i].value, 8);
    wr64(record_at(m, PLAN_SEC_WORK, 16, 1) + bad[i].field, bits);
    reseal(m, len);
    expect_fail(m, len, bad[i].want);
  }
  fixture f;
  fixture_build(&f);
  f.p.nwork = 2;
  uint8_t *bytes;
  rt_status st = plan_encode(&f.p, &bytes, &len);
  ck_assert_ptr_nonnull(st);
  ck_assert_str_eq(rt_status_msg(st), "plan: work: 2 records for 3 ops (one per op, or none)");
  rt_status_free(st);
  free(m);
  free(b);
}
END_TEST

/* Every single-byte change after the header, resealed, either decodes or is
 * refused with a message; none may crash or leak (ASan build). */
START_TEST(every_byte_flip) {
  size_t len;
  uint8_t *b = encode_fixture(&len);
  uint8_t *m = malloc(len);
  int refused = 0;
  for (size_t i = 12; i < len; i++) {
    if (i >= 24 && i < 64) continue; /* checksum and reserved: resealed/ignored */
    static const uint8_t masks[] = {0x01, 0x80, 0xff};
    for (size_t k = 0; k < sizeof masks; k++) {
      memcpy(m, b, len);
      m[i] ^= masks[k];
      reseal(m, len);
      plan d;
      rt_status st = plan_decode("plan.ds4p", m, len, &d);
      if (st) {
        ck_assert(strncmp(rt_status_msg(st), "plan.ds4p: ", 11) == 0);
        refused++;
        rt_status_free(st);
      } else {
        plan_free(&d);
      }
    }
  }
  ck_assert_int_gt(refused, 0);
  free(m);
  free(b);
}
END_TEST

START_TEST(encode_refuses_invalid) {
  fixture f;
  fixture_build(&f);
  f.streams[1].device = 7;
  uint8_t *bytes = (uint8_t *)1;
  size_t len = 1;
  rt_status st = plan_encode(&f.p, &bytes, &len);
  ck_assert_ptr_nonnull(st);
  ck_assert_ptr_null(bytes);
  ck_assert_uint_eq(len, 0);
  ck_assert_ptr_nonnull(strstr(rt_status_msg(st), "stream 1: device index 7 out of range"));
  rt_status_free(st);

  fixture_build(&f);
  f.p.tensors = NULL;
  st = plan_encode(&f.p, &bytes, &len);
  ck_assert_ptr_nonnull(st);
  ck_assert_ptr_nonnull(strstr(rt_status_msg(st), "tensors: 9 records but no array"));
  rt_status_free(st);

  fixture_build(&f);
  f.p.strings_len = 3; /* "\0ti": does not end in NUL */
  st = plan_encode(&f.p, &bytes, &len);
  ck_assert_ptr_nonnull(st);
  ck_assert_ptr_nonnull(strstr(rt_status_msg(st), "does not end in a NUL"));
  rt_status_free(st);
}
END_TEST

static int dir_entries(const char *dir) {
  DIR *d = opendir(dir);
  ck_assert_ptr_nonnull(d);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
  closedir(d);
  return n;
}

START_TEST(write_and_read) {
  char dir[] = "/tmp/test_plan.XXXXXX";
  tu_tmpdir_make(dir);
  char path[256], bad[300];
  snprintf(path, sizeof path, "%s/plan.ds4p", dir);

  fixture f;
  fixture_build(&f);
  rt_status st = plan_write(&f.p, path);
  ck_assert_msg(st == NULL, "%s", rt_status_msg(st));
  ck_assert_int_eq(dir_entries(dir), 1); /* no temporary left behind */
  plan d;
  st = plan_read(path, &d);
  ck_assert_msg(st == NULL, "%s", rt_status_msg(st));
  assert_plans_equal(&f.p, &d);
  plan_free(&d);

  /* The file holds exactly the encoded bytes. */
  uint8_t *bytes;
  size_t len;
  ck_assert_ptr_null(plan_encode(&f.p, &bytes, &len));
  FILE *fp = fopen(path, "rb");
  ck_assert_ptr_nonnull(fp);
  uint8_t *filebuf = malloc(len + 1);
  ck_assert_uint_eq(fread(filebuf, 1, len + 1, fp), len);
  fclose(fp);
  ck_assert_mem_eq(filebuf, bytes, len);

  /* A damaged file on disk is refused with its path in the message. */
  filebuf[len - 1] ^= 1;
  fp = fopen(path, "wb");
  fwrite(filebuf, 1, len, fp);
  fclose(fp);
  st = plan_read(path, &d);
  ck_assert_ptr_nonnull(st);
  ck_assert_ptr_nonnull(strstr(rt_status_msg(st), path));
  ck_assert_ptr_nonnull(strstr(rt_status_msg(st), "checksum mismatch"));
  rt_status_free(st);
  free(filebuf);
  free(bytes);

  /* Overwriting an existing plan replaces it atomically. */
  ck_assert_ptr_null(plan_write(&f.p, path));
  ck_assert_ptr_null(plan_read(path, &d));
  plan_free(&d);

  /* Missing file: path and strerror. */
  snprintf(bad, sizeof bad, "%s/missing.ds4p", dir);
  st = plan_read(bad, &d);
  ck_assert_ptr_nonnull(st);
  ck_assert_ptr_nonnull(strstr(rt_status_msg(st), bad));
  ck_assert_ptr_nonnull(strstr(rt_status_msg(st), "No such file"));
  rt_status_free(st);

  /* A directory is not a plan. */
  st = plan_read(dir, &d);
  ck_assert_ptr_nonnull(st);
  ck_assert_ptr_nonnull(strstr(rt_status_msg(st), "not a regular file"));
  rt_status_free(st);

  /* Writing into a missing directory fails and names the path. */
  snprintf(bad, sizeof bad, "%s/nodir/plan.ds4p", dir);
  st = plan_write(&f.p, bad);
  ck_assert_ptr_nonnull(st);
  ck_assert_ptr_nonnull(strstr(rt_status_msg(st), bad));
  rt_status_free(st);

  /* Renaming onto a directory fails: the temporary file is removed. */
  snprintf(bad, sizeof bad, "%s/adir", dir);
  ck_assert_int_eq(mkdir(bad, 0700), 0);
  st = plan_write(&f.p, bad);
  ck_assert_ptr_nonnull(st);
  ck_assert_ptr_nonnull(strstr(rt_status_msg(st), "rename"));
  rt_status_free(st);
  ck_assert_int_eq(dir_entries(dir), 2); /* plan.ds4p and adir only */
  rmdir(bad);

  /* An invalid plan writes nothing. */
  f.commands[0].a = 42;
  snprintf(bad, sizeof bad, "%s/invalid.ds4p", dir);
  st = plan_write(&f.p, bad);
  ck_assert_ptr_nonnull(st);
  ck_assert_ptr_nonnull(strstr(rt_status_msg(st), "command 0: kernel index 42"));
  rt_status_free(st);
  ck_assert_int_eq(dir_entries(dir), 1);

  unlink(path);
  rmdir(dir);
}
END_TEST

/* PLAN_MAX_BYTES: a bigger plan is neither written nor read. The big
 * buffers are untouched anonymous or sparse mappings, so the test costs no
 * memory or disk. */
START_TEST(size_limit) {
  const size_t big = (size_t)PLAN_MAX_BYTES + 1;
  uint8_t *mem = mmap(NULL, big, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  ck_assert_ptr_ne(mem, MAP_FAILED);

  plan d;
  rt_status st = plan_decode("big.ds4p", mem, big, &d);
  ck_assert_ptr_nonnull(st);
  ck_assert_str_eq(rt_status_msg(st), "big.ds4p: the plan is 1073741825 bytes; the limit is 1073741824 (1 GiB)");
  rt_status_free(st);

  /* A valid plan whose strings alone reach the limit: its strings are the
   * fixture's, then NUL bytes. */
  fixture f;
  fixture_build(&f);
  memcpy(mem, f.st.buf, f.st.len);
  f.p.strings = (char *)mem;
  f.p.strings_len = (uint32_t)PLAN_MAX_BYTES;
  uint8_t *bytes = NULL;
  size_t len = 0;
  st = plan_encode(&f.p, &bytes, &len);
  ck_assert_ptr_nonnull(st);
  ck_assert_ptr_null(bytes);
  /* the size: the strings and the fixture's other records, header and table */
  unsigned long long size = 0;
  ck_assert_int_eq(sscanf(rt_status_msg(st), "plan: the plan is %llu bytes;", &size), 1);
  ck_assert_uint_gt(size, PLAN_MAX_BYTES);
  ck_assert_uint_lt(size, PLAN_MAX_BYTES + 4096);
  char want[512];
  snprintf(want, sizeof want, "plan: the plan is %llu bytes; the limit is 1073741824 (1 GiB)", size);
  ck_assert_str_eq(rt_status_msg(st), want);
  rt_status_free(st);

  char dir[] = "/tmp/test_plan.XXXXXX";
  tu_tmpdir_make(dir);
  char path[256];
  snprintf(path, sizeof path, "%s/plan.ds4p", dir);
  st = plan_write(&f.p, path); /* what ds4c does: nothing is written */
  ck_assert_ptr_nonnull(st);
  snprintf(want, sizeof want, "writing %s: plan: the plan is %llu bytes; the limit is 1073741824 (1 GiB)", path,
           size);
  ck_assert_str_eq(rt_status_msg(st), want);
  rt_status_free(st);
  ck_assert_int_eq(dir_entries(dir), 0);
  munmap(mem, big);

  /* A file over the limit is refused before it is read. */
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(ftruncate(fd, (off_t)big), 0);
  close(fd);
  st = plan_read(path, &d);
  ck_assert_ptr_nonnull(st);
  snprintf(want, sizeof want, "%s: the plan is 1073741825 bytes; the limit is 1073741824 (1 GiB)", path);
  ck_assert_str_eq(rt_status_msg(st), want);
  rt_status_free(st);
  unlink(path);
  rmdir(dir);
}
END_TEST

int main(void) {
  Suite *s = suite_create("plan");
  TCase *tc = tcase_create("plan");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, status_basics);
  tcase_add_test(tc, sha256_vectors);
  tcase_add_test(tc, names);
  tcase_add_test(tc, quant_layouts);
  tcase_add_test(tc, quant_codes);
  tcase_add_test(tc, quant_elements);
  tcase_add_test(tc, quant_plans);
  tcase_add_test(tc, round_trip);
  tcase_add_test(tc, bad_header);
  tcase_add_test(tc, bad_sections);
  tcase_add_test(tc, bad_fields);
  tcase_add_test(tc, kernel_layout);
  tcase_add_test(tc, bad_kernels);
  tcase_add_test(tc, bad_views);
  tcase_add_test(tc, bad_args);
  tcase_add_test(tc, arg_reserved_ignored);
  tcase_add_test(tc, bad_copies);
  tcase_add_test(tc, bad_costs);
  tcase_add_test(tc, bad_fparams);
  tcase_add_test(tc, bad_work);
  tcase_add_test(tc, every_byte_flip);
  tcase_add_test(tc, encode_refuses_invalid);
  tcase_add_test(tc, write_and_read);
  tcase_add_test(tc, size_limit);
  suite_add_tcase(s, tc);
  return tu_run_suite(s);
}
