/* test_kernels.c - the host kernels of every op kind: kgen_host specialises a
 * template, cc builds it into a .so, and its blocks run on random inputs for
 * several (pos, ntok) against a float64 implementation of docs/OPS.md written
 * here; plus dedupe, determinism, tie-breaking and error positions. The GPU
 * kernels' tests build every kind for every GPU target through
 * emit_kernels_build and check the code objects, the shared symbols,
 * byte-identical rebuilds, the prelude's math against libm and the
 * toolchain's errors; with no GPU here, some kinds' GPU kernels also run
 * as host fibers (the compressor and indexer, the FFNs, swiglu_act,
 * group_matmul). */
#include <check.h>
#include <dlfcn.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <ucontext.h>
#include <unistd.h>

#include "emit.h"
#include "inspect.h"
#include "kgen.h"
#include "pipeline.h"
#include "templates.h"

/* Tolerance against float64: |got - ref| <= REL_TOL * (largest |ref| of the
 * row). Relative 1e-5 covers f32 sums of these sizes (K, F <= 150 terms in
 * index order, ~1e-6 expected error) with margin. Integer outputs, dead
 * rows, untouched cache rows and skipped expert slots must match exactly. */
#define REL_TOL 1e-5

typedef void (*kernel_fn)(void *const *bufs, const int32_t *step, uint32_t block);

/* ---- a hand-built one-op program ---- */

typedef struct kt {
  ir_tensor tensors[IR_MAXIO * 2];
  char paths[IR_MAXIO * 2][32];
  ir_op op;
  ir_prog prog;
  dsl_source src;
} kt;

static void kt_init(kt *k, int kind)
{
  memset(k, 0, sizeof *k);
  k->op.kind = kind;
  k->op.path = "test.op";
  /* A position inside a description, so that errors can be checked to
   * point at it. */
  k->src.path = "kernels.yaml";
  k->src.text = "ops:\n  - {name: op, op: kind}\n";
  k->src.len = strlen(k->src.text);
  k->op.pos = (dsl_pos){&k->src, 2, 5};
  k->prog.tensors = k->tensors;
}

/* Appends a tensor as the next input (out = 0) or output of the op. */
static void kt_add(kt *k, int out, uint32_t dtype, int ndim, ...)
{
  int i = k->prog.ntensors++;
  ir_tensor *t = &k->tensors[i];
  snprintf(k->paths[i], sizeof k->paths[i], "t%d", i);
  t->path = k->paths[i];
  t->dtype = dtype;
  t->ndim = ndim;
  va_list ap;
  va_start(ap, ndim);
  uint64_t dims[IR_MAXDIM];
  for (int j = 0; j < ndim; j++)
    dims[j] = (uint64_t)(t->dim[j] = va_arg(ap, int64_t));
  va_end(ap);
  t->bytes = (int64_t)plan_tensor_bytes(dtype, (uint32_t)ndim, dims); /* a quantized one's matrices too */
  if (out)
    k->op.out[k->op.nout++] = i;
  else
    k->op.in[k->op.nin++] = i;
}

static int64_t kt_elems(const kt *k, int slot)
{
  return k->tensors[slot].bytes / 4;
}

/* ---- building a kernel ---- */

typedef struct built {
  kgen_kernel kk;
  void *dl;
  kernel_fn fn;
} built;

static char g_dir[256]; /* the suite's temporary directory (test state only) */

static void build(kt *k, built *b)
{
  dsl_diag d = {0};
  int rc = kgen_host(&k->prog, &k->op, &b->kk, &d);
  ck_assert_msg(rc == 0, "kgen_host failed: %s", d.msg);
  ck_assert_ptr_nonnull(b->kk.source);
  ck_assert_ptr_nonnull(b->kk.symbol);
  ck_assert_uint_gt(b->kk.grid, 0);
  char c_path[512], so_path[512], cmd[2048];
  snprintf(c_path, sizeof c_path, "%s/%s.c", g_dir, b->kk.symbol);
  snprintf(so_path, sizeof so_path, "%s/%s.so", g_dir, b->kk.symbol);
  FILE *f = fopen(c_path, "w");
  ck_assert_ptr_nonnull(f);
  ck_assert_int_eq(fputs(b->kk.source, f) >= 0, 1);
  ck_assert_int_eq(fclose(f), 0);
  /* The flags the brief pins for host kernels, plus -Wextra. */
  snprintf(cmd, sizeof cmd,
           "cc -std=c11 -O2 -fPIC -shared -ffp-contract=off -fno-fast-math "
           "-Wall -Wextra -Werror -o %s %s -lm",
           so_path, c_path);
  ck_assert_msg(system(cmd) == 0, "compiling %s failed:\n%s", c_path, b->kk.source);
  b->dl = dlopen(so_path, RTLD_NOW | RTLD_LOCAL);
  ck_assert_msg(b->dl != NULL, "dlopen: %s", dlerror());
  *(void **)&b->fn = dlsym(b->dl, b->kk.symbol);
  ck_assert_msg(b->fn != NULL, "symbol %s missing", b->kk.symbol);
}

static void unbuild(built *b)
{
  dlclose(b->dl);
  kgen_kernel_free(&b->kk);
}

/* ---- buffers ---- */

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

static double rnd(void) /* uniform in [-1, 1), deterministic */
{
  g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
  return (double)(g_rng >> 11) / (double)(1ull << 53) * 2.0 - 1.0;
}

static void fill_f32(float *p, int64_t n, double scale)
{
  for (int64_t i = 0; i < n; i++)
    p[i] = (float)(rnd() * scale);
}

/* Stale bytes that a kernel must overwrite or ignore: a quiet NaN. */
static void fill_garbage(void *p, int64_t n)
{
  uint32_t *u = p;
  for (int64_t i = 0; i < n; i++)
    u[i] = 0x7fc0beefu;
}

/* Two matmuls of one x of T slots (x [T, K]) in one launch, as lowered
 * for a GPU: w1 [N1, K] and w2 [N2, K] of dtype wt. */
static void pair_op(kt *k, uint32_t wt, int64_t T, int64_t K, int64_t N1, int64_t N2)
{
  kt_init(k, IR_OP_MATMUL_PAIR);
  kt_add(k, 0, PLAN_F32, 2, T, K);
  kt_add(k, 0, wt, 2, N1, K);
  kt_add(k, 0, wt, 2, N2, K);
  kt_add(k, 1, PLAN_F32, 2, T, N1);
  kt_add(k, 1, PLAN_F32, 2, T, N2);
}

typedef struct bufs {
  void *b[IR_MAXIO * 2];
  int n;
} bufs;

static void bufs_alloc(bufs *bs, const kt *k)
{
  bs->n = k->prog.ntensors;
  for (int i = 0; i < bs->n; i++) {
    bs->b[i] = malloc((size_t)k->tensors[i].bytes);
    ck_assert_ptr_nonnull(bs->b[i]);
  }
}

static void bufs_free(bufs *bs)
{
  for (int i = 0; i < bs->n; i++)
    free(bs->b[i]);
}

/* Runs every block of the grid, in ascending or descending order (blocks
 * write disjoint bytes, so the order must not matter), for a step that asks
 * for its outputs from slot `asked` on (step[3]). */
static void run_asked(const built *b, bufs *bs, int pos, int ntok, int asked, int descending)
{
  int32_t step[4] = {pos, ntok, 7, asked};
  for (uint32_t i = 0; i < b->kk.grid; i++)
    b->fn(bs->b, step, descending ? b->kk.grid - 1 - i : i);
}

/* The same for a step that asks for every slot's outputs. */
static void run(const built *b, bufs *bs, int pos, int ntok, int descending)
{
  run_asked(b, bs, pos, ntok, 0, descending);
}

/* Runs twice (ascending and descending block order, outputs refilled with
 * garbage in between) and checks that the output bytes agree; `outs` are
 * the buffer indices of the outputs. State outputs (cache_write) are saved
 * and restored around the first run. */
static void run_checked(const built *b, const kt *k, bufs *bs, int pos, int ntok)
{
  int nin = k->op.nin, nout = k->op.nout;
  void *saved[IR_MAXIO], *first[IR_MAXIO];
  for (int o = 0; o < nout; o++) {
    size_t n = (size_t)k->tensors[nin + o].bytes;
    saved[o] = malloc(n);
    first[o] = malloc(n);
    ck_assert(saved[o] && first[o]);
    memcpy(saved[o], bs->b[nin + o], n);
  }
  run(b, bs, pos, ntok, 0);
  for (int o = 0; o < nout; o++) {
    size_t n = (size_t)k->tensors[nin + o].bytes;
    memcpy(first[o], bs->b[nin + o], n);
    memcpy(bs->b[nin + o], saved[o], n);
  }
  run(b, bs, pos, ntok, 1);
  for (int o = 0; o < nout; o++) {
    ck_assert_msg(memcmp(first[o], bs->b[nin + o], (size_t)k->tensors[nin + o].bytes) == 0,
                  "%s: output %d differs between block orders", b->kk.symbol, o);
    free(saved[o]);
    free(first[o]);
  }
}

/* Live rows within REL_TOL of ref, dead rows exactly zero. */
static void check_rows(const char *what, const float *got, const double *ref, int64_t rows,
                       int64_t cols, int ntok, double tol)
{
  for (int64_t t = 0; t < rows; t++) {
    const float *g = got + t * cols;
    const double *r = ref + t * cols;
    if (t >= ntok) {
      for (int64_t c = 0; c < cols; c++)
        ck_assert_msg(g[c] == 0.0f, "%s: dead row %lld col %lld is %g", what, (long long)t,
                      (long long)c, (double)g[c]);
      continue;
    }
    double scale = 0.0;
    for (int64_t c = 0; c < cols; c++)
      scale = fmax(scale, fabs(r[c]));
    for (int64_t c = 0; c < cols; c++)
      ck_assert_msg(fabs((double)g[c] - r[c]) <= tol * scale,
                    "%s: row %lld col %lld: got %.9g, float64 %.9g (tol %g of %g)", what,
                    (long long)t, (long long)c, (double)g[c], r[c], tol, scale);
  }
}

static double *dalloc(int64_t n)
{
  double *p = calloc((size_t)n, sizeof *p);
  ck_assert_ptr_nonnull(p);
  return p;
}

static double silu(double x)
{
  return x / (1.0 + exp(-x));
}

/* MATH.md §3.3: silu(min(g, L)) * clamp(u, -L, L), the gate clamped from
 * above only; L = 0: no clamp. seen (may be NULL) counts the clamps that
 * engage: g > L, g < -L (left alone) and |u| > L. */
static double ref_swiglu_act(double g, double u, double limit, int seen[3])
{
  if (limit > 0.0) {
    if (seen) {
      seen[0] += g > limit;
      seen[1] += g < -limit;
      seen[2] += fabs(u) > limit;
    }
    g = fmin(g, limit);
    u = fmax(-limit, fmin(u, limit));
  }
  return silu(g) * u;
}

/* ---- suite setup: one temporary directory for the generated files ---- */

static void dir_setup(void)
{
  const char *tmp = getenv("TMPDIR");
  snprintf(g_dir, sizeof g_dir, "%s/ds4kXXXXXX", tmp && *tmp ? tmp : "/tmp");
  ck_assert_ptr_nonnull(mkdtemp(g_dir));
}

static void dir_teardown(void)
{
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  if (system(cmd) != 0)
    fprintf(stderr, "test_kernels: could not remove %s\n", g_dir);
}

/* The (pos, ntok) pairs each kernel runs with, for T = 4 slots. */
static const int g_steps[][2] = {{0, 4}, {0, 1}, {3, 2}, {9, 3}, {12, 4}};
#define NSTEPS ((int)(sizeof g_steps / sizeof g_steps[0]))

/* ---- embed ---- */

/* x [T, H] (nstreams 0), or [T, nstreams, H]: every stream a copy of the
 * row (MATH.md §2 step 2). Returns the kernel's symbol (caller frees). */
static char *embed_case(int nstreams)
{
  enum { T = 4, V = 11, H = 9 };
  int n = nstreams ? nstreams : 1;
  kt k;
  kt_init(&k, IR_OP_EMBED);
  kt_add(&k, 0, PLAN_I32, 1, (int64_t)T);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)V, (int64_t)H);
  if (nstreams)
    kt_add(&k, 1, PLAN_F32, 3, (int64_t)T, (int64_t)nstreams, (int64_t)H);
  else
    kt_add(&k, 1, PLAN_F32, 2, (int64_t)T, (int64_t)H);
  built b;
  build(&k, &b);
  ck_assert_uint_eq(b.kk.grid, T);
  char def[64];
  snprintf(def, sizeof def, "#define NSTREAMS ((int64_t)%d)\n", n);
  ck_assert_ptr_nonnull(strstr(b.kk.source, def));
  bufs bs;
  bufs_alloc(&bs, &k);
  /* ids outside [0, V) must give a zero row, not a read out of bounds. */
  const int32_t idsets[2][T] = {{3, 0, 10, 7}, {-1, V, 5, INT32_MAX}};
  for (int set = 0; set < 2; set++)
    for (int s = 0; s < NSTEPS; s++) {
      int ntok = g_steps[s][1];
      memcpy(bs.b[0], idsets[set], sizeof idsets[set]);
      fill_f32(bs.b[1], V * H, 1.0);
      fill_garbage(bs.b[2], T * n * H);
      run_checked(&b, &k, &bs, g_steps[s][0], ntok);
      const float *table = bs.b[1];
      double *ref = dalloc(T * n * H);
      for (int t = 0; t < ntok; t++) {
        int32_t id = idsets[set][t];
        for (int i = 0; i < n; i++)
          for (int c = 0; c < H; c++)
            ref[(t * n + i) * H + c] = id >= 0 && id < V ? table[id * H + c] : 0.0;
      }
      /* A copy: exact, so tolerance 0; a token's streams are one row. */
      check_rows("embed", bs.b[2], ref, T, n * H, ntok, 0.0);
      free(ref);
    }
  char *symbol = strdup(b.kk.symbol);
  ck_assert_ptr_nonnull(symbol);
  bufs_free(&bs);
  unbuild(&b);
  return symbol;
}

START_TEST(test_embed)
{
  char *rows = embed_case(0), *one = embed_case(1), *streams = embed_case(4);
  /* The output's shape is one of the hashed facts: [T,H], [T,1,H] and
   * [T,4,H] are three kernels. */
  ck_assert_str_ne(rows, one);
  ck_assert_str_ne(rows, streams);
  ck_assert_str_ne(one, streams);
  free(rows);
  free(one);
  free(streams);
}
END_TEST

/* ---- rmsnorm ---- */

START_TEST(test_rmsnorm)
{
  enum { T = 4, H = 37 };
  const double eps = 1e-6;
  kt k;
  kt_init(&k, IR_OP_RMSNORM);
  k.op.fattr[0] = eps;
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)T, (int64_t)H);
  kt_add(&k, 0, PLAN_F32, 1, (int64_t)H);
  kt_add(&k, 1, PLAN_F32, 2, (int64_t)T, (int64_t)H);
  built b;
  build(&k, &b);
  ck_assert_uint_eq(b.kk.grid, T);
  bufs bs;
  bufs_alloc(&bs, &k);
  for (int s = 0; s < NSTEPS; s++) {
    int ntok = g_steps[s][1];
    fill_f32(bs.b[0], T * H, 3.0);
    fill_f32(bs.b[1], H, 1.0);
    fill_garbage(bs.b[2], T * H);
    run_checked(&b, &k, &bs, g_steps[s][0], ntok);
    const float *x = bs.b[0], *w = bs.b[1];
    double *ref = dalloc(T * H);
    for (int t = 0; t < ntok; t++) {
      double ss = 0.0;
      for (int j = 0; j < H; j++)
        ss += (double)x[t * H + j] * x[t * H + j];
      double den = sqrt(ss / H + (double)(float)eps);
      for (int j = 0; j < H; j++)
        ref[t * H + j] = (double)x[t * H + j] * w[j] / den;
    }
    check_rows("rmsnorm", bs.b[2], ref, T, H, ntok, REL_TOL);
    free(ref);
  }
  bufs_free(&bs);
  unbuild(&b);
}
END_TEST

/* ---- matmul: N = 150 makes 19 column tiles of 8, the last one partial ---- */

START_TEST(test_matmul)
{
  enum { T = 4, K = 40, N = 150 };
  kt k;
  kt_init(&k, IR_OP_MATMUL);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)T, (int64_t)K);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)N, (int64_t)K);
  kt_add(&k, 1, PLAN_F32, 2, (int64_t)T, (int64_t)N);
  built b;
  build(&k, &b);
  ck_assert_uint_eq(b.kk.grid, 19); /* tiles of 8 columns, each for every slot */
  bufs bs;
  bufs_alloc(&bs, &k);
  for (int s = 0; s < NSTEPS; s++) {
    int ntok = g_steps[s][1];
    fill_f32(bs.b[0], T * K, 1.0);
    fill_f32(bs.b[1], N * K, 1.0);
    fill_garbage(bs.b[2], T * N);
    run_checked(&b, &k, &bs, g_steps[s][0], ntok);
    const float *x = bs.b[0], *w = bs.b[1];
    double *ref = dalloc(T * N);
    for (int t = 0; t < ntok; t++)
      for (int n = 0; n < N; n++) {
        double acc = 0.0;
        for (int i = 0; i < K; i++)
          acc += (double)x[t * K + i] * w[n * K + i];
        ref[t * N + n] = acc;
      }
    check_rows("matmul", bs.b[2], ref, T, N, ntok, REL_TOL);
    free(ref);
  }
  bufs_free(&bs);
  unbuild(&b);
}
END_TEST

/* ---- matmul with a bf16 weight: widened exactly, summed in f32 ---- */

/* The bf16 nearest x (ties to even), as its 16 bits. */
static uint16_t bf16_of(float x)
{
  uint32_t u;
  memcpy(&u, &x, 4);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static double bf16_value(uint16_t h)
{
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

START_TEST(test_matmul_bf16)
{
  /* K = 37: no multiple of a GPU chunk; 150 columns: a partial tile. */
  enum { T = 4, K = 37, N = 150 };
  kt k;
  kt_init(&k, IR_OP_MATMUL);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)T, (int64_t)K);
  kt_add(&k, 0, PLAN_BF16, 2, (int64_t)N, (int64_t)K);
  kt_add(&k, 1, PLAN_F32, 2, (int64_t)T, (int64_t)N);
  ck_assert_int_eq(k.tensors[1].bytes, N * K * 2);
  built b;
  build(&k, &b);
  ck_assert_uint_eq(b.kk.grid, 19);
  ck_assert_ptr_nonnull(strstr(b.kk.source, "#define W_DT ((int64_t)1)\n"));
  bufs bs;
  bufs_alloc(&bs, &k);
  uint16_t *w = bs.b[1];
  for (int s = 0; s < NSTEPS; s++) {
    int ntok = g_steps[s][1];
    fill_f32(bs.b[0], T * K, 1.0);
    for (int i = 0; i < N * K; i++)
      w[i] = bf16_of((float)rnd());
    fill_garbage(bs.b[2], T * N);
    run_checked(&b, &k, &bs, g_steps[s][0], ntok);
    const float *x = bs.b[0];
    double *ref = dalloc(T * N);
    for (int t = 0; t < ntok; t++)
      for (int n = 0; n < N; n++) {
        double acc = 0.0;
        for (int i = 0; i < K; i++)
          acc += (double)x[t * K + i] * bf16_value(w[n * K + i]);
        ref[t * N + n] = acc;
      }
    check_rows("matmul bf16", bs.b[2], ref, T, N, ntok, REL_TOL);
    free(ref);
  }
  bufs_free(&bs);
  unbuild(&b);
}
END_TEST

/* ---- rope ---- */

/* DeepSeek-V4's YaRN ("compress" table, MATH.md §3.2): factor, original
 * positions, beta_fast, beta_slow; as rope attrs 4..7. */
static const double g_ds4_yarn[4] = {16.0, 65536.0, 32.0, 1.0};

/* The inverse frequency of pair i (of r/2), in float64 from MATH.md §3.2:
 * theta^(-2i/r), or with YaRN the blend of it and it / factor along the
 * ramp between the correction dimensions c(beta_fast) and c(beta_slow). */
static double ref_rope_freq(double theta, int r, int i, const double *yarn)
{
  double extrapolated = pow(theta, -2.0 * i / r);
  if (!yarn)
    return extrapolated;
  double c_fast = r * log(yarn[1] / (yarn[2] * 2.0 * M_PI)) / (2.0 * log(theta));
  double c_slow = r * log(yarn[1] / (yarn[3] * 2.0 * M_PI)) / (2.0 * log(theta));
  double lo = fmax(floor(c_fast), 0.0), hi = fmin(ceil(c_slow), r - 1.0);
  if (hi == lo)
    hi += 0.001;
  double ramp = fmin(fmax((i - lo) / (hi - lo), 0.0), 1.0);
  return extrapolated / yarn[0] * ramp + extrapolated * (1.0 - ramp);
}

static void rope_op(kt *k, int heads, int hd, int r, double theta, int inverse, const double *yarn)
{
  enum { T = 4 };
  kt_init(k, IR_OP_ROPE);
  k->op.iattr[0] = heads;
  k->op.iattr[1] = r;
  k->op.fattr[2] = theta;
  k->op.iattr[3] = inverse;
  for (int a = 0; yarn && a < 4; a++)
    k->op.fattr[4 + a] = yarn[a];
  kt_add(k, 0, PLAN_F32, 2, (int64_t)T, (int64_t)(heads * hd));
  kt_add(k, 1, PLAN_F32, 2, (int64_t)T, (int64_t)(heads * hd));
}

/* An rmsnorm (groups 0) or rmsnorm_groups of groups channels a group and
 * the rope of its output as lower.c fuses them, on T = 4 slots of C
 * channels: the rope's heads the norm's row or groups, theta 10000 (or
 * DeepSeek-V4's YaRN with inverse), the norm's eps 1e-6. */
static void norm_rope_op(kt *k, int grouped, int64_t C, int64_t group, int64_t r, int inverse)
{
  kt_init(k, grouped ? IR_OP_RMSNORM_GROUPS_ROPE : IR_OP_RMSNORM_ROPE);
  k->op.iattr[0] = grouped ? C / (group ? group : C) : 1;
  k->op.iattr[1] = r;
  k->op.fattr[2] = inverse ? 160000.0 : 10000.0;
  k->op.iattr[3] = inverse;
  for (int a = 0; inverse && a < 4; a++)
    k->op.fattr[4 + a] = g_ds4_yarn[a];
  k->op.fattr[9] = 1e-6;
  k->op.iattr[10] = group;
  kt_add(k, 0, PLAN_F32, 2, (int64_t)4, C);
  if (!grouped)
    kt_add(k, 0, PLAN_F32, 1, C);
  kt_add(k, 1, PLAN_F32, 2, (int64_t)4, C);
}

static void rope_case(int heads, int hd, int r, double theta, int pos_scale, int inverse, const double *yarn)
{
  enum { T = 4 };
  const int C = heads * hd;
  kt k;
  rope_op(&k, heads, hd, r, theta, inverse, yarn);
  built b;
  build(&k, &b);
  ck_assert_uint_eq(b.kk.grid, T * heads); /* a block per slot and head */
  bufs bs;
  bufs_alloc(&bs, &k);
  for (int s = 0; s < NSTEPS; s++) {
    int pos = g_steps[s][0] * pos_scale, ntok = g_steps[s][1];
    fill_f32(bs.b[0], T * C, 1.0);
    fill_garbage(bs.b[1], T * C);
    run_checked(&b, &k, &bs, pos, ntok);
    const float *x = bs.b[0];
    double *ref = dalloc(T * C);
    for (int t = 0; t < ntok; t++)
      for (int h = 0; h < heads; h++) {
        const float *xh = x + t * C + h * hd;
        double *yh = ref + t * C + h * hd;
        for (int c = 0; c < hd - r; c++)
          yh[c] = xh[c];
        for (int i = 0; i < r / 2; i++) {
          /* inverse: RotInv of MATH.md §3.2, sin -> -sin */
          double phi = (double)(float)(pos + t) * ref_rope_freq((double)(float)theta, r, i, yarn);
          double x0 = xh[hd - r + 2 * i], x1 = xh[hd - r + 2 * i + 1];
          double sn = inverse ? -sin(phi) : sin(phi);
          yh[hd - r + 2 * i] = x0 * cos(phi) - x1 * sn;
          yh[hd - r + 2 * i + 1] = x0 * sn + x1 * cos(phi);
        }
      }
    /* The angle is an f32 product (OPS.md), so its error grows with the
     * position: about (pos+T) * 2^-23 radians on top of REL_TOL. */
    double tol = REL_TOL + (pos + T) * ldexp(1.0, -22);
    check_rows("rope", bs.b[1], ref, T, C, ntok, tol);
    free(ref);
  }
  bufs_free(&bs);
  unbuild(&b);
}

START_TEST(test_rope)
{
  rope_case(3, 16, 8, 10000.0, 1, 0, NULL);   /* trailing channels rotate, the rest copy */
  rope_case(2, 8, 8, 500.0, 1, 0, NULL);      /* the whole head rotates */
  rope_case(2, 6, 0, 10000.0, 1, 0, NULL);    /* no rotation: a copy */
  rope_case(4, 16, 8, 10000.0, 350, 0, NULL); /* positions up to 4200 */
  rope_case(3, 16, 8, 10000.0, 350, 1, NULL); /* the inverse rotation */
  /* DeepSeek-V4's compress table (64 of 80 channels rotate, as 64 of 512
   * do), forward and inverse, at positions up to 60000. */
  rope_case(2, 80, 64, 160000.0, 1, 0, g_ds4_yarn);
  rope_case(2, 80, 64, 160000.0, 5000, 0, g_ds4_yarn);
  rope_case(2, 80, 64, 160000.0, 5000, 1, g_ds4_yarn);
}
END_TEST

/* The inverse rotation undoes the rotation at the same position: the same
 * f32 angle, so only the rotations' rounding remains, at any position. */
START_TEST(test_rope_inverse_roundtrip)
{
  enum { T = 4, NH = 2, HD = 80, C = NH * HD };
  kt fwd, inv;
  rope_op(&fwd, NH, HD, 64, 160000.0, 0, g_ds4_yarn);
  rope_op(&inv, NH, HD, 64, 160000.0, 1, g_ds4_yarn);
  built bf, bi;
  build(&fwd, &bf);
  build(&inv, &bi);
  ck_assert_str_ne(bf.kk.symbol, bi.kk.symbol);
  bufs bs;
  bufs_alloc(&bs, &fwd);
  float *x = bs.b[0], *y = bs.b[1];
  static const int positions[] = {0, 7, 127, 4096, 65535, 1000003};
  for (size_t i = 0; i < sizeof positions / sizeof positions[0]; i++) {
    fill_f32(x, T * C, 1.0);
    float orig[T * C];
    memcpy(orig, x, sizeof orig);
    run(&bf, &bs, positions[i], T, 0);
    memcpy(x, y, sizeof orig);
    run(&bi, &bs, positions[i], T, 0);
    double *ref = dalloc(T * C);
    for (int j = 0; j < T * C; j++)
      ref[j] = orig[j];
    check_rows("rope roundtrip", y, ref, T, C, T, 4 * FLT_EPSILON);
    free(ref);
  }
  bufs_free(&bs);
  unbuild(&bf);
  unbuild(&bi);
}
END_TEST

/* The INV_FREQ table of a rope op's host kernel (the GPU kernels get the
 * same define), parsed back from its exact literals. */
static int rope_table(kt *k, float *out, int max)
{
  dsl_diag d = {0};
  kgen_kernel kk;
  ck_assert_msg(kgen_host(&k->prog, &k->op, &kk, &d) == 0, "kgen_host: %s", d.msg);
  const char *at = strstr(kk.source, "#define INV_FREQ {");
  ck_assert_ptr_nonnull(at);
  at += strlen("#define INV_FREQ {");
  int n = 0;
  while (*at != '}') {
    char *end;
    ck_assert_int_lt(n, max);
    out[n++] = strtof(at, &end);
    ck_assert_msg(end != at && *end == 'f', "bad INV_FREQ literal at \"%.20s\"", at);
    at = end + 1;
    if (*at == ',')
      at += 2;
  }
  kgen_kernel_free(&kk);
  return n;
}

/* The compress table against the values MATH.md §3.2 lists from HF 5.17
 * (fp32): the same floats, as HF's order of f32 operations is kept; every
 * entry against the float64 formula; the main table's ends. */
START_TEST(test_rope_tables)
{
  static const struct { int i; double w; } hf[] = {
      {0, 1.0}, {1, 0.687656045}, {15, 0.00363553851}, {16, 0.00226562493},
      {24, 1.95312532e-05}, {25, 5.37231244e-06}, {31, 5.68052940e-07}};
  kt k;
  float w[33];
  rope_op(&k, 1, 512, 64, 160000.0, 0, g_ds4_yarn);
  ck_assert_int_eq(rope_table(&k, w, 33), 32);
  for (size_t j = 0; j < sizeof hf / sizeof hf[0]; j++)
    ck_assert_msg(w[hf[j].i] == (float)hf[j].w, "compress w_%d = %.9g, HF %.9g", hf[j].i,
                  (double)w[hf[j].i], hf[j].w);
  for (int i = 0; i < 32; i++) {
    double ref = ref_rope_freq(160000.0, 64, i, g_ds4_yarn);
    ck_assert_msg(fabs(w[i] - ref) <= 4 * FLT_EPSILON * ref, "compress w_%d = %.9g, float64 %.9g", i,
                  (double)w[i], ref);
  }
  /* Unscaled up to pair 15, divided by 16 from pair 25. */
  ck_assert(w[15] == powf(160000.0f, -30.0f / 64.0f));
  ck_assert(fabs(w[31] * 16.0 - pow(160000.0, -62.0 / 64.0)) <= 4 * FLT_EPSILON * w[31] * 16.0);
  rope_op(&k, 1, 512, 64, 10000.0, 1, NULL);
  ck_assert_int_eq(rope_table(&k, w, 33), 32);
  ck_assert(w[0] == 1.0f);
  ck_assert_msg(fabs(w[31] - 1.3335e-4) <= 1e-8, "main w_31 = %.9g", (double)w[31]);
  rope_op(&k, 1, 16, 0, 10000.0, 0, NULL); /* nothing rotates: a one-entry table */
  ck_assert_int_eq(rope_table(&k, w, 33), 1);
  ck_assert(w[0] == 0.0f);
}
END_TEST

/* ---- cache_write ---- */

START_TEST(test_cache_write)
{
  enum { T = 4, S = 16, D = 10 };
  kt k;
  kt_init(&k, IR_OP_CACHE_WRITE);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)T, (int64_t)D);
  kt_add(&k, 1, PLAN_F32, 2, (int64_t)S, (int64_t)D);
  built b;
  build(&k, &b);
  ck_assert_uint_eq(b.kk.grid, T);
  bufs bs;
  bufs_alloc(&bs, &k);
  float before[S * D];
  for (int s = 0; s < NSTEPS; s++) {
    int pos = g_steps[s][0], ntok = g_steps[s][1];
    ck_assert_int_le(pos + ntok, S);
    fill_f32(bs.b[0], T * D, 1.0);
    fill_f32(bs.b[1], S * D, 1.0);
    memcpy(before, bs.b[1], sizeof before);
    run_checked(&b, &k, &bs, pos, ntok);
    const float *src = bs.b[0], *cache = bs.b[1];
    for (int row = 0; row < S; row++) {
      int live = row >= pos && row < pos + ntok;
      const float *want = live ? src + (row - pos) * D : before + row * D;
      ck_assert_msg(memcmp(cache + row * D, want, D * sizeof(float)) == 0,
                    "cache_write pos %d ntok %d: row %d %s", pos, ntok, row,
                    live ? "not written" : "touched");
    }
  }
  /* A position past the cache writes nothing rather than out of bounds. */
  fill_f32(bs.b[1], S * D, 1.0);
  memcpy(before, bs.b[1], sizeof before);
  run(&b, &bs, S - 1, T, 0);
  ck_assert(memcmp(bs.b[1], before, (S - 1) * D * sizeof(float)) == 0);
  ck_assert(memcmp((float *)bs.b[1] + (S - 1) * D, bs.b[0], D * sizeof(float)) == 0);
  bufs_free(&bs);
  unbuild(&b);
}
END_TEST

/* ---- attention ---- */

START_TEST(test_attention)
{
  enum { T = 4, S = 16, NH = 3, HD = 8, C = NH * HD };
  const double scale = 1.0 / sqrt((double)HD);
  kt k;
  kt_init(&k, IR_OP_ATTENTION);
  k.op.iattr[0] = NH;
  k.op.fattr[1] = scale;
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)T, (int64_t)C);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)S, (int64_t)C);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)S, (int64_t)C);
  kt_add(&k, 1, PLAN_F32, 2, (int64_t)T, (int64_t)C);
  built b;
  build(&k, &b);
  ck_assert_uint_eq(b.kk.grid, T * NH);
  bufs bs;
  bufs_alloc(&bs, &k);
  for (int s = 0; s < NSTEPS; s++) {
    int pos = g_steps[s][0], ntok = g_steps[s][1];
    ck_assert_int_le(pos + ntok, S);
    fill_f32(bs.b[0], T * C, 2.0);
    fill_f32(bs.b[1], S * C, 2.0);
    fill_f32(bs.b[2], S * C, 1.0);
    fill_garbage(bs.b[3], T * C);
    run_checked(&b, &k, &bs, pos, ntok);
    const float *q = bs.b[0], *kc = bs.b[1], *vc = bs.b[2];
    double *ref = dalloc(T * C);
    double sc[S];
    for (int t = 0; t < ntok; t++)
      for (int h = 0; h < NH; h++) {
        int n = pos + t + 1;
        double m = -INFINITY, sum = 0.0;
        for (int j = 0; j < n; j++) {
          double dot = 0.0;
          for (int c = 0; c < HD; c++)
            dot += (double)q[t * C + h * HD + c] * kc[j * C + h * HD + c];
          sc[j] = (double)(float)scale * dot;
          m = fmax(m, sc[j]);
        }
        for (int j = 0; j < n; j++)
          sum += exp(sc[j] - m);
        for (int j = 0; j < n; j++)
          for (int c = 0; c < HD; c++)
            ref[t * C + h * HD + c] += exp(sc[j] - m) / sum * vc[j * C + h * HD + c];
      }
    check_rows("attention", bs.b[3], ref, T, C, ntok, REL_TOL);
    free(ref);
  }
  bufs_free(&bs);
  unbuild(&b);
}
END_TEST

/* ---- rmsnorm_groups: no weight, each group of channels on its own ---- */

static void rmsnorm_groups_case(int C, int group)
{
  enum { T = 4 };
  const double eps = 1e-6;
  const int g = group ? group : C;
  kt k;
  kt_init(&k, IR_OP_RMSNORM_GROUPS);
  k.op.fattr[0] = eps;
  k.op.iattr[1] = group;
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)T, (int64_t)C);
  kt_add(&k, 1, PLAN_F32, 2, (int64_t)T, (int64_t)C);
  built b;
  build(&k, &b);
  ck_assert_uint_eq(b.kk.grid, T * (C / g));
  bufs bs;
  bufs_alloc(&bs, &k);
  for (int s = 0; s < NSTEPS; s++) {
    int ntok = g_steps[s][1];
    float *x = bs.b[0];
    fill_f32(x, T * C, 3.0);
    /* The last group 40 times larger: a norm over more than the group
     * would shrink the others. */
    for (int t = 0; t < T; t++)
      for (int j = C - g; j < C; j++)
        x[t * C + j] *= 40.0f;
    fill_garbage(bs.b[1], T * C);
    run_checked(&b, &k, &bs, g_steps[s][0], ntok);
    double *ref = dalloc(T * C);
    for (int t = 0; t < ntok; t++)
      for (int g0 = 0; g0 < C; g0 += g) {
        double ss = 0.0;
        for (int j = g0; j < g0 + g; j++)
          ss += (double)x[t * C + j] * x[t * C + j];
        double den = sqrt(ss / g + (double)(float)eps);
        for (int j = g0; j < g0 + g; j++)
          ref[t * C + j] = x[t * C + j] / den;
      }
    check_rows("rmsnorm_groups", bs.b[1], ref, T, C, ntok, REL_TOL);
    free(ref);
  }
  bufs_free(&bs);
  unbuild(&b);
}

START_TEST(test_rmsnorm_groups)
{
  rmsnorm_groups_case(48, 16); /* three groups, like per-head query norms */
  rmsnorm_groups_case(48, 0);  /* the whole row */
  rmsnorm_groups_case(37, 37); /* one group, named */
}
END_TEST

/* ---- window_write: a ring of the last S positions ---- */

START_TEST(test_window_write)
{
  enum { T = 4, S = 6, D = 5 };
  kt k;
  kt_init(&k, IR_OP_WINDOW_WRITE);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)T, (int64_t)D);
  kt_add(&k, 1, PLAN_F32, 2, (int64_t)S, (int64_t)D);
  built b;
  build(&k, &b);
  ck_assert_uint_eq(b.kk.grid, T);
  bufs bs;
  bufs_alloc(&bs, &k);
  float before[S * D];
  /* Steps inside the ring, wrapping inside one step (5..8: rows 5, 0, 1,
   * 2), and far along the sequence. */
  static const int steps[][2] = {{0, 4}, {0, 1}, {3, 2}, {5, 4}, {9, 3}, {12, 4}, {1000001, 4}};
  for (size_t s = 0; s < sizeof steps / sizeof steps[0]; s++) {
    int pos = steps[s][0], ntok = steps[s][1];
    fill_f32(bs.b[0], T * D, 1.0);
    fill_f32(bs.b[1], S * D, 1.0);
    memcpy(before, bs.b[1], sizeof before);
    run_checked(&b, &k, &bs, pos, ntok);
    const float *src = bs.b[0], *ring = bs.b[1];
    for (int row = 0; row < S; row++) {
      const float *want = before + row * D;
      for (int t = 0; t < ntok; t++)
        if ((pos + t) % S == row)
          want = src + t * D;
      ck_assert_msg(memcmp(ring + row * D, want, D * sizeof(float)) == 0, "window_write pos %d ntok %d: row %d",
                    pos, ntok, row);
    }
  }
  /* A negative position (a bad parameter block) writes nothing. */
  memcpy(before, bs.b[1], sizeof before);
  run(&b, &bs, -3, T, 0);
  ck_assert(memcmp(bs.b[1], before, sizeof before) == 0);
  bufs_free(&bs);
  unbuild(&b);
}
END_TEST

/* ---- sink_attention ---- */

typedef struct sink_cfg {
  int heads, hd, window, S, ratio, select, ne, nsel;
} sink_cfg;

/* MATH.md §6.3 with the softmax with sink of §3.4, in float64, for the
 * query q (all heads) at position p. Keys: kv rows of the raw window
 * max(0, p - window + 1)..p of the sequence (not of the ring), then the
 * compressed entries w < floor((p + 1) / ratio) (§8.3), for select 2 only
 * those sel_t names (§9.5, a set). */
static void ref_sink_attention(const sink_cfg *c, const float *q, const float *kv, const float *entries,
                               const int32_t *sel_t, const float *sinks, double scale, int p, double *out)
{
  const float **keys = malloc((size_t)(c->window + c->ne) * sizeof *keys);
  ck_assert_ptr_nonnull(keys);
  int n = 0;
  for (int s = p - c->window + 1 > 0 ? p - c->window + 1 : 0; s <= p; s++)
    keys[n++] = kv + s * c->hd;
  for (int w = 0; c->select && w < c->ne && w < (p + 1) / c->ratio; w++) {
    int chosen = c->select == 1;
    for (int j = 0; c->select == 2 && j < c->nsel; j++)
      chosen |= sel_t[j] == w;
    if (chosen)
      keys[n++] = entries + w * c->hd;
  }
  double *logit = dalloc(n);
  for (int h = 0; h < c->heads; h++) {
    const float *qh = q + h * c->hd;
    double mx = sinks[h], den = 0.0;
    for (int k = 0; k < n; k++) {
      double dot = 0.0;
      for (int i = 0; i < c->hd; i++)
        dot += (double)qh[i] * keys[k][i];
      logit[k] = scale * dot;
      mx = fmax(mx, logit[k]);
    }
    for (int k = 0; k < n; k++)
      den += exp(logit[k] - mx);
    den += exp(sinks[h] - mx);
    for (int i = 0; i < c->hd; i++) {
      double acc = 0.0;
      for (int k = 0; k < n; k++)
        acc += exp(logit[k] - mx) / den * keys[k][i];
      out[h * c->hd + i] = acc;
    }
  }
  free(logit);
  free(keys);
}

/* q [T, heads*hd], ring [S, hd], entries [ne, hd], sel [T, nsel], sinks
 * [heads] -> o [T, heads*hd], scale 1/sqrt(hd), as infer resolves it. */
static void sink_op(kt *k, const sink_cfg *c, int64_t T)
{
  const int64_t C = (int64_t)c->heads * c->hd;
  kt_init(k, IR_OP_SINK_ATTENTION);
  k->op.iattr[0] = c->heads;
  k->op.iattr[1] = c->window;
  k->op.iattr[2] = c->ratio;
  k->op.iattr[3] = c->select;
  k->op.fattr[4] = 1.0 / sqrt((double)c->hd);
  kt_add(k, 0, PLAN_F32, 2, T, C);
  kt_add(k, 0, PLAN_F32, 2, (int64_t)c->S, (int64_t)c->hd);
  kt_add(k, 0, PLAN_F32, 2, (int64_t)c->ne, (int64_t)c->hd);
  kt_add(k, 0, PLAN_I32, 2, T, (int64_t)c->nsel);
  kt_add(k, 0, PLAN_F32, 1, (int64_t)c->heads);
  kt_add(k, 1, PLAN_F32, 2, T, C);
}

static void sink_case(const sink_cfg *c)
{
  enum { T = 4, MAXPOS = 64 };
  const int C = c->heads * c->hd;
  const double scale = 1.0 / sqrt((double)c->hd);
  ck_assert_int_ge(c->S, c->window + T - 1); /* what infer asks of a model */
  kt k;
  sink_op(&k, c, T);
  built b;
  build(&k, &b);
  /* a block per slot and group of heads in a chunk of several slots:
   * groups of 4 (or 2) where they divide the heads, each head whole
   * 16-byte vectors */
  int hg = c->hd % 4 != 0 ? 1 : c->heads % 4 == 0 ? 4 : c->heads % 2 == 0 ? 2 : 1;
  char want[32];
  snprintf(want, sizeof want, "#define HG ((int64_t)%d)\n", hg);
  ck_assert_msg(strstr(b.kk.source, want) != NULL, "sink_attention of %d heads: no %s", c->heads, want);
  ck_assert_uint_eq(b.kk.grid, T * c->heads / hg);
  bufs bs;
  bufs_alloc(&bs, &k);
  float *q = bs.b[0], *ring = bs.b[1], *entries = bs.b[2], *sinks = bs.b[4], *o = bs.b[5];
  int32_t *sel = bs.b[3];
  float *kv = malloc((size_t)(MAXPOS + T) * c->hd * sizeof *kv), *first = malloc((size_t)T * C * sizeof *first);
  ck_assert(kv && first);
  /* Queries before the window fills, at its edge, and far past it, so
   * that the ring wraps (often within a step); the last steps see more
   * closed entries than the op's ne (clamped). */
  static const int steps[][2] = {{0, 4}, {0, 1}, {2, 3}, {5, 4}, {7, 1}, {13, 2}, {30, 4}, {47, 3}, {60, 4}};
  for (size_t s = 0; s < sizeof steps / sizeof steps[0]; s++) {
    int pos = steps[s][0], ntok = steps[s][1];
    fill_f32(kv, (MAXPOS + T) * c->hd, 1.0);
    fill_f32(q, T * C, 2.0);
    fill_f32(entries, c->ne * c->hd, 1.0);
    /* A sink that takes most of the mass, one that takes almost none. */
    for (int h = 0; h < c->heads; h++)
      sinks[h] = h == 1 ? 4.0f : h == 2 ? -30.0f : (float)rnd();
    /* The ring as window_write leaves it after positions 0..pos+ntok-1;
     * rows never written stay NaN, and a kernel reading them fails. */
    fill_garbage(ring, c->S * c->hd);
    for (int p = 0; p < pos + ntok; p++)
      memcpy(ring + (p % c->S) * c->hd, kv + p * c->hd, (size_t)c->hd * sizeof *kv);
    /* Entries visible or not, -1, other negatives, repeats, any order. */
    for (int t = 0; t < T; t++) {
      int nvis = c->ratio ? (pos + t + 1) / c->ratio : 0;
      for (int j = 0; j < c->nsel; j++)
        sel[t * c->nsel + j] = (int32_t)((rnd() + 1.0) * 0.5 * (nvis + 5)) - 2;
      sel[t * c->nsel + c->nsel - 1] = sel[t * c->nsel];
    }
    fill_garbage(o, T * C);
    run_checked(&b, &k, &bs, pos, ntok);
    double *ref = dalloc(T * C);
    for (int t = 0; t < ntok; t++)
      ref_sink_attention(c, q + t * C, kv, entries, sel + t * c->nsel, sinks, (double)(float)scale, pos + t,
                         ref + t * C);
    check_rows("sink_attention", o, ref, T, C, ntok, REL_TOL);
    free(ref);
    if (c->select == 2) { /* the selection is a set: its order does not change a bit */
      memcpy(first, o, (size_t)T * C * sizeof *first);
      for (int t = 0; t < T; t++)
        for (int j = 0; j < c->nsel / 2; j++) {
          int32_t *a = sel + t * c->nsel + j, *z = sel + t * c->nsel + c->nsel - 1 - j, tmp = *a;
          *a = *z;
          *z = tmp;
        }
      run(&b, &bs, pos, ntok, 0);
      ck_assert(memcmp(first, o, (size_t)T * C * sizeof *first) == 0);
    }
  }
  free(kv);
  free(first);
  bufs_free(&bs);
  unbuild(&b);
}

START_TEST(test_sink_attention)
{
  /* heads, hd, window, S, ratio, select, ne, nsel */
  static const sink_cfg cases[] = {
      {3, 16, 6, 9, 0, 0, 1, 1},   /* sliding window only; the smallest ring */
      {3, 16, 6, 11, 4, 1, 12, 1}, /* HCA: every closed entry */
      {3, 16, 6, 11, 4, 2, 12, 5}, /* CSA: the selected ones */
      {4, 24, 8, 13, 3, 2, 20, 9}, /* a wider window and selection */
      {4, 6, 6, 11, 4, 2, 12, 5},  /* heads of 6: a block each */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    sink_case(&cases[i]);
}
END_TEST

/* ---- group_matmul: MATH.md §6.4's block-diagonal o_a projection ---- */

START_TEST(test_group_matmul)
{
  enum { T = 4, G = 3, KG = 10, NG = 7, N = G * NG };
  kt k;
  kt_init(&k, IR_OP_GROUP_MATMUL);
  k.op.iattr[0] = G;
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)T, (int64_t)(G * KG));
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)N, (int64_t)KG);
  kt_add(&k, 1, PLAN_F32, 2, (int64_t)T, (int64_t)N);
  built b;
  build(&k, &b);
  ck_assert_uint_eq(b.kk.grid, 3); /* 21 columns: tiles of 8, 8, 5, each for every slot */
  bufs bs;
  bufs_alloc(&bs, &k);
  for (int s = 0; s < NSTEPS; s++) {
    int ntok = g_steps[s][1];
    fill_f32(bs.b[0], T * G * KG, 1.0);
    fill_f32(bs.b[1], N * KG, 1.0);
    fill_garbage(bs.b[2], T * N);
    run_checked(&b, &k, &bs, g_steps[s][0], ntok);
    const float *x = bs.b[0], *w = bs.b[1];
    double *ref = dalloc(T * N);
    /* u_g = A_g . z_g, A_g = rows g*NG.. of w, z_g = channels g*KG.. of x */
    for (int t = 0; t < ntok; t++)
      for (int g = 0; g < G; g++)
        for (int n = 0; n < NG; n++)
          for (int i = 0; i < KG; i++)
            ref[t * N + g * NG + n] += (double)w[(g * NG + n) * KG + i] * x[t * G * KG + g * KG + i];
    check_rows("group_matmul", bs.b[2], ref, T, N, ntok, REL_TOL);
    free(ref);
  }
  bufs_free(&bs);
  unbuild(&b);
}
END_TEST

/* ---- add: a 3-d shape, rows of 3*5 ---- */

START_TEST(test_add)
{
  enum { T = 4, A = 3, B = 5 };
  kt k;
  kt_init(&k, IR_OP_ADD);
  for (int i = 0; i < 3; i++)
    kt_add(&k, i == 2, PLAN_F32, 3, (int64_t)T, (int64_t)A, (int64_t)B);
  built b;
  build(&k, &b);
  ck_assert_uint_eq(b.kk.grid, T);
  bufs bs;
  bufs_alloc(&bs, &k);
  for (int s = 0; s < NSTEPS; s++) {
    int ntok = g_steps[s][1];
    fill_f32(bs.b[0], T * A * B, 1.0);
    fill_f32(bs.b[1], T * A * B, 1.0);
    fill_garbage(bs.b[2], T * A * B);
    run_checked(&b, &k, &bs, g_steps[s][0], ntok);
    const float *x = bs.b[0], *y = bs.b[1];
    double *ref = dalloc(T * A * B);
    for (int i = 0; i < ntok * A * B; i++)
      ref[i] = (double)x[i] + y[i];
    check_rows("add", bs.b[2], ref, T, A * B, ntok, REL_TOL);
    free(ref);
  }
  bufs_free(&bs);
  unbuild(&b);
}
END_TEST

/* ---- topk_route ---- */

/* The float64 router: softmax, then the k largest by repeated scans with a
 * strict comparison (ties: lower index), then renormalised weights. */
static void ref_topk(const float *logits, int E, int K, int32_t *idx, double *w)
{
  double p[64], m = -INFINITY, sum = 0.0;
  int taken[64] = {0};
  for (int e = 0; e < E; e++)
    m = fmax(m, logits[e]);
  for (int e = 0; e < E; e++)
    sum += exp(logits[e] - m);
  for (int e = 0; e < E; e++)
    p[e] = exp(logits[e] - m) / sum;
  double wsum = 0.0;
  for (int j = 0; j < K; j++) {
    int best = -1;
    for (int e = 0; e < E; e++)
      if (!taken[e] && (best < 0 || p[e] > p[best]))
        best = e;
    taken[best] = 1;
    idx[j] = best;
    wsum += p[best];
  }
  for (int j = 0; j < K; j++)
    w[j] = p[idx[j]] / wsum;
}

static void topk_case(int E, int K, const float *fixed_logits, const int32_t *want_idx)
{
  enum { T = 4 };
  kt k;
  kt_init(&k, IR_OP_TOPK_ROUTE);
  k.op.iattr[0] = K;
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)T, (int64_t)E);
  kt_add(&k, 1, PLAN_I32, 2, (int64_t)T, (int64_t)K);
  kt_add(&k, 1, PLAN_F32, 2, (int64_t)T, (int64_t)K);
  built b;
  build(&k, &b);
  ck_assert_uint_eq(b.kk.grid, T);
  bufs bs;
  bufs_alloc(&bs, &k);
  for (int s = 0; s < NSTEPS; s++) {
    int ntok = g_steps[s][1];
    float *logits = bs.b[0];
    if (fixed_logits) {
      for (int t = 0; t < T; t++)
        memcpy(logits + t * E, fixed_logits, (size_t)E * sizeof(float));
    } else {
      /* Distinct logits at least 0.05 apart, shuffled: the f32 and f64
       * orders of the probabilities then agree. */
      for (int t = 0; t < T; t++) {
        for (int e = 0; e < E; e++)
          logits[t * E + e] = (float)(0.05 * e - 0.7);
        for (int e = E - 1; e > 0; e--) {
          int o = (int)((rnd() + 1.0) * 0.5 * (e + 1)) % (e + 1);
          float tmp = logits[t * E + e];
          logits[t * E + e] = logits[t * E + o];
          logits[t * E + o] = tmp;
        }
      }
    }
    fill_garbage(bs.b[1], T * K);
    fill_garbage(bs.b[2], T * K);
    run_checked(&b, &k, &bs, g_steps[s][0], ntok);
    const int32_t *idx = bs.b[1];
    double *ref = dalloc(T * K);
    for (int t = 0; t < T; t++) {
      if (t >= ntok) {
        for (int j = 0; j < K; j++)
          ck_assert_int_eq(idx[t * K + j], 0);
        continue;
      }
      int32_t ridx[64];
      ref_topk(logits + t * E, E, K, ridx, ref + t * K);
      for (int j = 0; j < K; j++) {
        ck_assert_int_eq(idx[t * K + j], ridx[j]);
        if (want_idx)
          ck_assert_int_eq(idx[t * K + j], want_idx[j]);
      }
    }
    check_rows("topk_route", bs.b[2], ref, T, K, ntok, REL_TOL);
    free(ref);
  }
  bufs_free(&bs);
  unbuild(&b);
}

START_TEST(test_topk_route)
{
  topk_case(8, 2, NULL, NULL);
  topk_case(13, 5, NULL, NULL);
  topk_case(6, 6, NULL, NULL);
  /* Exact ties: equal logits give bit-equal probabilities; the lower index
   * must come first. */
  static const float tied[6] = {1.0f, 3.0f, 3.0f, 0.0f, 3.0f, 2.0f};
  static const int32_t want2[2] = {1, 2};
  static const int32_t want5[5] = {1, 2, 4, 5, 0};
  topk_case(6, 2, tied, want2);
  topk_case(6, 5, tied, want5);
  static const float flat[4] = {0.5f, 0.5f, 0.5f, 0.5f};
  static const int32_t want3[3] = {0, 1, 2};
  topk_case(4, 3, flat, want3);
}
END_TEST

/* ---- moe_experts ---- */

/* A launch holding experts ex[0..n) of E = 5 (all when ex is NULL), with
 * the SwiGLU clamp `limit` (0: none): its weights have n rows, row r
 * holding expert ex[r]. Slots of other experts must be zero; the returned
 * slots (caller frees) are the launch's output for the last step, all
 * tokens live. */
static float *moe_case(const int *ex, int n, double limit)
{
  /* H and F not whole groups of the host kernel's four dot products (F
   * odd: its gate and up rows go two at a time), so the tails run */
  enum { T = 4, K = 3, E = 5, H = 13, F = 7 };
  int rows = ex ? n : E, row_of[E], seen[3] = {0};
  kt k;
  kt_init(&k, IR_OP_MOE_EXPERTS);
  k.op.fattr[0] = limit;
  for (int e = 0; e < E; e++)
    row_of[e] = ex ? -1 : e;
  for (int r = 0; ex && r < n; r++)
    row_of[ex[r]] = r;
  if (ex) {
    k.op.expert_row = row_of;
    k.op.nexperts = E;
  }
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)T, (int64_t)H);
  kt_add(&k, 0, PLAN_I32, 2, (int64_t)T, (int64_t)K);
  kt_add(&k, 0, PLAN_F32, 3, (int64_t)rows, (int64_t)F, (int64_t)H);
  kt_add(&k, 0, PLAN_F32, 3, (int64_t)rows, (int64_t)F, (int64_t)H);
  kt_add(&k, 0, PLAN_F32, 3, (int64_t)rows, (int64_t)H, (int64_t)F);
  kt_add(&k, 1, PLAN_F32, 3, (int64_t)T, (int64_t)K, (int64_t)H);
  built b;
  build(&k, &b);
  ck_assert_uint_eq(b.kk.grid, T * K);
  bufs bs;
  bufs_alloc(&bs, &k);
  /* Every expert, plus ids outside [0, E) that must give zero slots. */
  static const int32_t idset[T * K] = {0, 4, 2, 3, -1, 1, E, 2, 0, INT32_MIN, 4, 3};
  float *last = malloc(T * K * H * sizeof *last);
  ck_assert_ptr_nonnull(last);
  for (int s = 0; s < NSTEPS; s++) {
    int ntok = g_steps[s][1];
    g_rng = 0x5eed + (uint64_t)s; /* the same inputs for every expert set */
    fill_f32(bs.b[0], T * H, 1.0);
    memcpy(bs.b[1], idset, sizeof idset);
    /* Each held row r gets the values expert ex[r] has in the full
     * weights: the generator is keyed by the expert, not the row. */
    for (int i = 2; i < 5; i++) {
      int64_t per = kt_elems(&k, i) / rows;
      float *full = malloc((size_t)(E * per) * sizeof *full);
      ck_assert_ptr_nonnull(full);
      fill_f32(full, E * per, 0.5 + i);
      for (int e = 0; e < E; e++)
        if (row_of[e] >= 0)
          memcpy((float *)bs.b[i] + row_of[e] * per, full + e * per, (size_t)per * sizeof *full);
      free(full);
    }
    fill_garbage(bs.b[5], T * K * H);
    run_checked(&b, &k, &bs, g_steps[s][0], ntok);
    const float *x = bs.b[0], *w1 = bs.b[2], *w3 = bs.b[3], *w2 = bs.b[4];
    const float *slots = bs.b[5];
    double *ref = dalloc(T * K * H);
    for (int t = 0; t < ntok; t++)
      for (int j = 0; j < K; j++) {
        int e = idset[t * K + j], r = e >= 0 && e < E ? row_of[e] : -1;
        if (r < 0) {
          for (int c = 0; c < H; c++)
            ck_assert_msg(slots[(t * K + j) * H + c] == 0.0f && !signbit(slots[(t * K + j) * H + c]),
                          "moe_experts: slot (%d,%d) of expert %d not +0", t, j, e);
          continue;
        }
        double act[F];
        for (int f = 0; f < F; f++) {
          double g = 0.0, u = 0.0;
          for (int c = 0; c < H; c++) {
            g += (double)x[t * H + c] * w1[(r * F + f) * H + c];
            u += (double)x[t * H + c] * w3[(r * F + f) * H + c];
          }
          act[f] = ref_swiglu_act(g, u, limit, seen);
        }
        for (int c = 0; c < H; c++) {
          double acc = 0.0;
          for (int f = 0; f < F; f++)
            acc += act[f] * w2[(r * H + c) * F + f];
          ref[(t * K + j) * H + c] = acc;
        }
      }
    /* Per slot: each is its own sum, so scale the tolerance per slot. */
    check_rows("moe_experts", slots, ref, T * K, H, ntok * K, REL_TOL);
    free(ref);
    memcpy(last, slots, T * K * H * sizeof *last);
  }
  if (limit > 0.0) /* |g|, |u| ~ 3-4 here: every side of the clamp is hit */
    ck_assert_msg(seen[0] && seen[1] && seen[2], "moe_experts: clamp at %g not exercised", limit);
  bufs_free(&bs);
  unbuild(&b);
  return last;
}

START_TEST(test_moe_experts)
{
  static const int range[] = {2, 3}, list[] = {0, 4, 1};
  free(moe_case(NULL, 0, 0.0)); /* one launch for all experts */
  free(moe_case(range, 2, 0.0)); /* a split: experts 2 and 3 */
  free(moe_case(list, 3, 0.0));  /* a list, rows out of expert order */
  free(moe_case(NULL, 0, 2.0));  /* the SwiGLU clamp of MATH.md §3.3 */
  free(moe_case(list, 3, 2.0));
}
END_TEST

/* The parts of a split sum to the unsplit slots bit for bit, through the
 * sum_parts kernel that merges them; with the SwiGLU clamp too. */
static void moe_split_case(double limit)
{
  enum { T = 4, K = 3, H = 12, N = T * K * H };
  static const int a[] = {0, 2, 4}, b2[] = {1, 3};
  float *whole = moe_case(NULL, 0, limit), *pa = moe_case(a, 3, limit), *pb = moe_case(b2, 2, limit);
  kt k;
  kt_init(&k, IR_OP_SUM_PARTS);
  k.op.iattr[0] = 2;
  kt_add(&k, 0, PLAN_F32, 3, (int64_t)(2 * T), (int64_t)K, (int64_t)H);
  kt_add(&k, 1, PLAN_F32, 3, (int64_t)T, (int64_t)K, (int64_t)H);
  built b;
  build(&k, &b);
  ck_assert_uint_eq(b.kk.grid, T);
  bufs bs;
  bufs_alloc(&bs, &k);
  memcpy(bs.b[0], pa, N * sizeof(float));
  memcpy((float *)bs.b[0] + N, pb, N * sizeof(float));
  fill_garbage(bs.b[1], N);
  run_checked(&b, &k, &bs, 0, T);
  ck_assert_msg(memcmp(bs.b[1], whole, N * sizeof(float)) == 0, "merged parts differ from the unsplit slots");
  bufs_free(&bs);
  unbuild(&b);
  free(whole);
  free(pa);
  free(pb);
}

START_TEST(test_moe_split_is_exact)
{
  moe_split_case(0.0);
  moe_split_case(2.0);
}
END_TEST

/* ---- moe_combine ---- */

START_TEST(test_moe_combine)
{
  enum { T = 4, K = 3, H = 10 };
  kt k;
  kt_init(&k, IR_OP_MOE_COMBINE);
  kt_add(&k, 0, PLAN_F32, 3, (int64_t)T, (int64_t)K, (int64_t)H);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)T, (int64_t)K);
  kt_add(&k, 1, PLAN_F32, 2, (int64_t)T, (int64_t)H);
  built b;
  build(&k, &b);
  ck_assert_uint_eq(b.kk.grid, T);
  bufs bs;
  bufs_alloc(&bs, &k);
  for (int s = 0; s < NSTEPS; s++) {
    int ntok = g_steps[s][1];
    fill_f32(bs.b[0], T * K * H, 1.0);
    fill_f32(bs.b[1], T * K, 1.0);
    fill_garbage(bs.b[2], T * H);
    run_checked(&b, &k, &bs, g_steps[s][0], ntok);
    const float *sl = bs.b[0], *w = bs.b[1];
    double *ref = dalloc(T * H);
    for (int t = 0; t < ntok; t++)
      for (int c = 0; c < H; c++)
        for (int j = 0; j < K; j++)
          ref[t * H + c] += (double)w[t * K + j] * sl[(t * K + j) * H + c];
    check_rows("moe_combine", bs.b[2], ref, T, H, ntok, REL_TOL);
    free(ref);
  }
  bufs_free(&bs);
  unbuild(&b);
}
END_TEST

/* ---- swiglu_ffn ---- */

/* With the SwiGLU clamp `limit` (0: none); the kernel's symbol goes to
 * symbol (64 bytes). */
static void swiglu_case(double limit, char *symbol)
{
  enum { T = 4, H = 12, F = 20 };
  int seen[3] = {0};
  kt k;
  kt_init(&k, IR_OP_SWIGLU_FFN);
  k.op.fattr[0] = limit;
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)T, (int64_t)H);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)F, (int64_t)H);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)F, (int64_t)H);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)H, (int64_t)F);
  kt_add(&k, 1, PLAN_F32, 2, (int64_t)T, (int64_t)H);
  built b;
  build(&k, &b);
  ck_assert_uint_eq(b.kk.grid, T);
  bufs bs;
  bufs_alloc(&bs, &k);
  for (int s = 0; s < NSTEPS; s++) {
    int ntok = g_steps[s][1];
    fill_f32(bs.b[0], T * H, 1.0);
    for (int i = 1; i < 4; i++)
      fill_f32(bs.b[i], kt_elems(&k, i), 0.5);
    fill_garbage(bs.b[4], T * H);
    run_checked(&b, &k, &bs, g_steps[s][0], ntok);
    const float *x = bs.b[0], *w1 = bs.b[1], *w3 = bs.b[2], *w2 = bs.b[3];
    double *ref = dalloc(T * H);
    for (int t = 0; t < ntok; t++) {
      double act[F];
      for (int f = 0; f < F; f++) {
        double g = 0.0, u = 0.0;
        for (int c = 0; c < H; c++) {
          g += (double)x[t * H + c] * w1[f * H + c];
          u += (double)x[t * H + c] * w3[f * H + c];
        }
        act[f] = ref_swiglu_act(g, u, limit, seen);
      }
      for (int c = 0; c < H; c++)
        for (int f = 0; f < F; f++)
          ref[t * H + c] += act[f] * w2[c * F + f];
    }
    check_rows("swiglu_ffn", bs.b[4], ref, T, H, ntok, REL_TOL);
    free(ref);
  }
  if (limit > 0.0) /* |g|, |u| ~ 0.6 here: every side of the clamp is hit */
    ck_assert_msg(seen[0] && seen[1] && seen[2], "swiglu_ffn: clamp at %g not exercised", limit);
  snprintf(symbol, 64, "%s", b.kk.symbol);
  bufs_free(&bs);
  unbuild(&b);
}

START_TEST(test_swiglu_ffn)
{
  char plain[64], clamped[64];
  swiglu_case(0.0, plain);
  swiglu_case(0.5, clamped);
  ck_assert_str_ne(plain, clamped);
  /* The default leaves the attr out of the hashed facts, so kernels from
   * before swiglu_limit keep their symbols; a limit is one of the facts. */
  kt k;
  kt_init(&k, IR_OP_SWIGLU_FFN);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)4, (int64_t)8);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)16, (int64_t)8);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)16, (int64_t)8);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)8, (int64_t)16);
  kt_add(&k, 1, PLAN_F32, 2, (int64_t)4, (int64_t)8);
  kgen_kernel a, c;
  dsl_diag d = {0};
  ck_assert_int_eq(kgen_host(&k.prog, &k.op, &a, &d), 0);
  ck_assert_ptr_null(strstr(a.source, "attr swiglu_limit"));
  ck_assert_ptr_nonnull(strstr(a.source, "#define SWIGLU_LIMIT (0x0p+0f)\n"));
  k.op.fattr[0] = 0.5;
  ck_assert_int_eq(kgen_host(&k.prog, &k.op, &c, &d), 0);
  ck_assert_ptr_nonnull(strstr(c.source, " *   attr swiglu_limit=0x800000p-24f\n"));
  ck_assert_ptr_nonnull(strstr(c.source, "#define SWIGLU_LIMIT (0x800000p-24f)\n"));
  kgen_kernel_free(&a);
  kgen_kernel_free(&c);
}
END_TEST

/* ---- swiglu_act: swiglu_ffn's activation alone ---- */

static void swiglu_act_op(kt *k, int64_t T, int64_t F, double limit)
{
  kt_init(k, IR_OP_SWIGLU_ACT);
  k->op.fattr[0] = limit;
  for (int i = 0; i < 3; i++)
    kt_add(k, i == 2, PLAN_F32, 2, T, F);
}

/* Every element against float64 (a relative error, as it is elementwise),
 * NaN inputs giving NaN, dead rows +0; returns the symbol (caller frees). */
static char *swiglu_act_case(double limit)
{
  enum { T = 4, F = 300 }; /* two tiles of 256, the second partial */
  int seen[3] = {0}, nans = 0;
  kt k;
  swiglu_act_op(&k, T, F, limit);
  built b;
  build(&k, &b);
  ck_assert_uint_eq(b.kk.grid, T * 2);
  bufs bs;
  bufs_alloc(&bs, &k);
  for (int s = 0; s < NSTEPS; s++) {
    int ntok = g_steps[s][1];
    float *g = bs.b[0], *u = bs.b[1], *a = bs.b[2];
    fill_f32(g, T * F, 1.5);
    fill_f32(u, T * F, 1.5);
    g[7] = NAN; /* live in every step: the clamps keep a NaN */
    u[F + 9] = NAN;
    fill_garbage(a, T * F);
    run_checked(&b, &k, &bs, g_steps[s][0], ntok);
    for (int64_t i = 0; i < T * F; i++) {
      if (i >= ntok * F) {
        ck_assert_msg(a[i] == 0.0f && !signbit(a[i]), "swiglu_act: dead element %lld is %g", (long long)i,
                      (double)a[i]);
        continue;
      }
      if (isnan(g[i]) || isnan(u[i])) {
        ck_assert_msg(isnan(a[i]), "swiglu_act: a NaN input gave %g at %lld", (double)a[i], (long long)i);
        nans++;
        continue;
      }
      double ref = ref_swiglu_act(g[i], u[i], limit, seen);
      ck_assert_msg(fabs((double)a[i] - ref) <= REL_TOL * fabs(ref),
                    "swiglu_act (limit %g): element %lld: got %.9g, float64 %.9g (g %g, u %g)", limit,
                    (long long)i, (double)a[i], ref, (double)g[i], (double)u[i]);
    }
  }
  ck_assert_int_gt(nans, NSTEPS);
  if (limit > 0.0) /* |g|, |u| up to 1.5: every side of the clamp is hit */
    ck_assert_msg(seen[0] && seen[1] && seen[2], "swiglu_act: clamp at %g not exercised", limit);
  char *symbol = strdup(b.kk.symbol);
  ck_assert_ptr_nonnull(symbol);
  bufs_free(&bs);
  unbuild(&b);
  return symbol;
}

START_TEST(test_swiglu_act)
{
  char *plain = swiglu_act_case(0.0), *clamped = swiglu_act_case(0.5);
  ck_assert_str_ne(plain, clamped);
  free(plain);
  free(clamped);
  /* A kind of its own from the start: its limit is always a fact. */
  kt k;
  swiglu_act_op(&k, 4, 8, 0.0);
  kgen_kernel kk;
  dsl_diag d = {0};
  ck_assert_int_eq(kgen_host(&k.prog, &k.op, &kk, &d), 0);
  ck_assert_ptr_nonnull(strstr(kk.source, " *   attr swiglu_limit=0x0p+0f\n"));
  ck_assert_ptr_nonnull(strstr(kk.source, "#define SWIGLU_LIMIT (0x0p+0f)\n"));
  kgen_kernel_free(&kk);
}
END_TEST

/* ---- bf16 weights: the f32 kernel's bits on the widened values ---- */

/* A random i32 in [-1, bound]: token ids or expert choices, the first
 * and last out of range. */
static int32_t rnd_index(int32_t bound)
{
  int32_t v = (int32_t)floor((rnd() + 1.0) * 0.5 * (bound + 2)) - 1;
  return v > bound ? bound : v;
}

/* k32's op (f32 weights) again with the inputs in wslots (bit i: input i)
 * made bf16: for bf16 weights it must give bit for bit what the f32
 * kernel gives for f32 weights holding the widened values (the kernels
 * widen exactly and keep the f32 path's order), through every step of
 * g_steps; i32 inputs take rnd_index(ibound). The symbol differs (the
 * dtypes are hashed) and the weights' defines say which are bf16. */
static void bf16_case(const kt *k32, unsigned wslots, int32_t ibound)
{
  kt k16 = *k32;
  k16.prog.tensors = k16.tensors;
  int nin = k32->op.nin, nbuf = k32->prog.ntensors, nonzero = 0;
  for (int i = 0; i < nin; i++)
    if (wslots & 1u << i) {
      ck_assert_int_eq(k16.tensors[i].dtype, PLAN_F32);
      k16.tensors[i].dtype = PLAN_BF16;
      k16.tensors[i].bytes /= 2;
    }
  kt a = *k32;
  a.prog.tensors = a.tensors;
  built b32, b16;
  build(&a, &b32);
  build(&k16, &b16);
  ck_assert_uint_eq(b16.kk.grid, b32.kk.grid);
  ck_assert_str_ne(b16.kk.symbol, b32.kk.symbol);
  ck_assert_ptr_null(strstr(b32.kk.source, "_DT ((int64_t)1)\n"));
  ck_assert_ptr_nonnull(strstr(b16.kk.source, "_DT ((int64_t)1)\n"));
  bufs s32, s16;
  bufs_alloc(&s32, &a);
  bufs_alloc(&s16, &k16);
  for (int s = 0; s < NSTEPS; s++) {
    for (int i = 0; i < nin; i++) {
      int64_t n = kt_elems(&a, i);
      if (wslots & 1u << i) {
        uint16_t *w16 = s16.b[i];
        float *w32 = s32.b[i];
        for (int64_t j = 0; j < n; j++) {
          w16[j] = bf16_of((float)rnd());
          w32[j] = (float)bf16_value(w16[j]);
        }
      } else {
        if (a.tensors[i].dtype == PLAN_I32)
          for (int64_t j = 0; j < n; j++)
            ((int32_t *)s32.b[i])[j] = rnd_index(ibound);
        else
          fill_f32(s32.b[i], n, 1.0);
        memcpy(s16.b[i], s32.b[i], (size_t)a.tensors[i].bytes);
      }
    }
    for (int o = nin; o < nbuf; o++) {
      fill_garbage(s32.b[o], kt_elems(&a, o));
      fill_garbage(s16.b[o], kt_elems(&a, o));
    }
    run_checked(&b32, &a, &s32, g_steps[s][0], g_steps[s][1]);
    run_checked(&b16, &k16, &s16, g_steps[s][0], g_steps[s][1]);
    for (int o = nin; o < nbuf; o++) {
      ck_assert_msg(memcmp(s32.b[o], s16.b[o], (size_t)a.tensors[o].bytes) == 0,
                    "%s: output %d with bf16 weights differs from f32 on the same values (step %d)",
                    b16.kk.symbol, o - nin, s);
      const float *y = s16.b[o];
      for (int64_t j = 0; j < kt_elems(&a, o); j++)
        nonzero |= y[j] != 0.0f;
    }
  }
  ck_assert_msg(nonzero, "%s: every output was zero", b16.kk.symbol);
  bufs_free(&s32);
  bufs_free(&s16);
  unbuild(&b32);
  unbuild(&b16);
}

START_TEST(test_bf16_weights)
{
  enum { T = 4, V = 11, H = 12, F = 20, E = 5, K = 3 };
  kt k;
  kt_init(&k, IR_OP_EMBED); /* the table, into rows and into streams */
  kt_add(&k, 0, PLAN_I32, 1, (int64_t)T);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)V, (int64_t)H);
  kt_add(&k, 1, PLAN_F32, 2, (int64_t)T, (int64_t)H);
  bf16_case(&k, 1u << 1, V);
  k.tensors[2].ndim = 3;
  k.tensors[2].dim[1] = 3;
  k.tensors[2].dim[2] = H;
  k.tensors[2].bytes *= 3;
  bf16_case(&k, 1u << 1, V);

  kt_init(&k, IR_OP_MATMUL); /* 150 columns: a partial tile */
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)T, (int64_t)37);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)150, (int64_t)37);
  kt_add(&k, 1, PLAN_F32, 2, (int64_t)T, (int64_t)150);
  bf16_case(&k, 1u << 1, 0);

  kt_init(&k, IR_OP_GROUP_MATMUL); /* 21 columns in 3 groups */
  k.op.iattr[0] = 3;
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)T, (int64_t)30);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)21, (int64_t)10);
  kt_add(&k, 1, PLAN_F32, 2, (int64_t)T, (int64_t)21);
  bf16_case(&k, 1u << 1, 0);

  /* Every expert, then a split holding experts 3 and 1 (rows out of
   * expert order), with the SwiGLU clamp; choices in [-1, E]. */
  static int split_rows[E] = {-1, 1, -1, 0, -1};
  for (int split = 0; split < 2; split++) {
    int64_t rows = split ? 2 : E;
    kt_init(&k, IR_OP_MOE_EXPERTS);
    if (split) {
      k.op.expert_row = split_rows;
      k.op.nexperts = E;
      k.op.fattr[0] = 2.0;
    }
    kt_add(&k, 0, PLAN_F32, 2, (int64_t)T, (int64_t)H);
    kt_add(&k, 0, PLAN_I32, 2, (int64_t)T, (int64_t)K);
    kt_add(&k, 0, PLAN_F32, 3, rows, (int64_t)F, (int64_t)H);
    kt_add(&k, 0, PLAN_F32, 3, rows, (int64_t)F, (int64_t)H);
    kt_add(&k, 0, PLAN_F32, 3, rows, (int64_t)H, (int64_t)F);
    kt_add(&k, 1, PLAN_F32, 3, (int64_t)T, (int64_t)K, (int64_t)H);
    bf16_case(&k, 1u << 2 | 1u << 3 | 1u << 4, E);
  }

  /* All three weights, clamped; and w2 alone: each weight's dtype is its
   * own. */
  kt_init(&k, IR_OP_SWIGLU_FFN);
  k.op.fattr[0] = 0.5;
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)T, (int64_t)H);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)F, (int64_t)H);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)F, (int64_t)H);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)H, (int64_t)F);
  kt_add(&k, 1, PLAN_F32, 2, (int64_t)T, (int64_t)H);
  bf16_case(&k, 1u << 1 | 1u << 2 | 1u << 3, 0);
  bf16_case(&k, 1u << 3, 0);
}
END_TEST

/* ---- the compiler's checks (infer) of weights and embed's streams ---- */

/* Every kind that takes a bf16 weight, all bf16, and embed into 3
 * hyper-connection streams; g_infer_edits changes one thing of it. */
static const char g_infer_model[] =
    "model: case\n"
    "params: {tokens: 2, max_seq: 8, hidden: 8, vocab: 16, hc: 3, experts: 4, ffn: 6}\n"
    "tensors:\n"
    "  - {name: ids, shape: [tokens], dtype: i32, role: input}\n"
    "  - {name: logits, shape: [tokens, vocab], dtype: f32, role: output}\n"
    "  - {name: next, shape: [tokens], dtype: i32, role: output}\n"
    "blocks:\n"
    "  - name: net\n"
    "    tensors:\n"
    "      - {name: table, shape: [vocab, hidden], dtype: bf16, role: weight}\n"
    "      - {name: hfn, shape: [hc, hc*hidden], dtype: f32, role: weight}\n"
    "      - {name: hbase, shape: [hc], dtype: f32, role: weight}\n"
    "      - {name: hscale, shape: [1], dtype: f32, role: weight}\n"
    "      - {name: gate, shape: [experts, hidden], dtype: bf16, role: weight}\n"
    "      - {name: w1, shape: [experts, ffn, hidden], dtype: bf16, role: weight}\n"
    "      - {name: w3, shape: [experts, ffn, hidden], dtype: bf16, role: weight}\n"
    "      - {name: w2, shape: [experts, hidden, ffn], dtype: bf16, role: weight}\n"
    "      - {name: s1, shape: [ffn, hidden], dtype: bf16, role: weight}\n"
    "      - {name: s3, shape: [ffn, hidden], dtype: bf16, role: weight}\n"
    "      - {name: s2, shape: [hidden, ffn], dtype: bf16, role: weight}\n"
    "      - {name: wo_a, shape: [hidden, hidden/2], dtype: bf16, role: weight}\n"
    "      - {name: w_out, shape: [vocab, hidden], dtype: bf16, role: weight}\n"
    "      - {name: X, shape: [tokens, hc, hidden], dtype: f32, role: activation}\n"
    "      - {name: h, shape: [tokens, hidden], dtype: f32, role: activation}\n"
    "      - {name: z, shape: [tokens, experts], dtype: f32, role: activation}\n"
    "      - {name: sel, shape: [tokens, 2], dtype: i32, role: activation}\n"
    "      - {name: sel_w, shape: [tokens, 2], dtype: f32, role: activation}\n"
    "      - {name: slots, shape: [tokens, 2, hidden], dtype: f32, role: activation}\n"
    "      - {name: m, shape: [tokens, hidden], dtype: f32, role: activation}\n"
    "      - {name: sh, shape: [tokens, hidden], dtype: f32, role: activation}\n"
    "      - {name: g, shape: [tokens, hidden], dtype: f32, role: activation}\n"
    "      - {name: a1, shape: [tokens, hidden], dtype: f32, role: activation}\n"
    "      - {name: a2, shape: [tokens, hidden], dtype: f32, role: activation}\n"
    "    ops:\n"
    "      - {name: embed, op: embed, in: [ids, table], out: [X]}\n"
    "      - {name: collapse, op: hc_head, in: [X, hfn, hbase, hscale], out: [h]}\n"
    "      - {name: gate, op: matmul, in: [h, gate], out: [z]}\n"
    "      - {name: route, op: topk_route, in: [z], out: [sel, sel_w], attrs: {k: 2}}\n"
    "      - {name: experts, op: moe_experts, in: [h, sel, w1, w3, w2], out: [slots]}\n"
    "      - {name: combine, op: moe_combine, in: [slots, sel_w], out: [m]}\n"
    "      - {name: shared, op: swiglu_ffn, in: [h, s1, s3, s2], out: [sh]}\n"
    "      - {name: oa, op: group_matmul, in: [h, wo_a], out: [g], attrs: {groups: 2}}\n"
    "      - {name: sum1, op: add, in: [m, sh], out: [a1]}\n"
    "      - {name: sum2, op: add, in: [a1, g], out: [a2]}\n"
    "      - {name: lm_head, op: matmul, in: [a2, w_out], out: [logits]}\n"
    "      - {name: sample, op: argmax, in: [logits], out: [next]}\n"
    "layers:\n"
    "  - {block: net, name: net}\n";

/* Writes g_infer_model with its first `from` replaced by `to` (NULL: as
 * it is) to DIR/name, and a one-cpu schedule beside it; fills o. */
static void infer_write(const char *name, const char *from, const char *to, ds4c_options *o, char *model,
                        char *sched, char *out, size_t n)
{
  snprintf(model, n, "%s/%s.yaml", g_dir, name);
  snprintf(sched, n, "%s/%s.sched.yaml", g_dir, name);
  snprintf(out, n, "%s/%s-bundle", g_dir, name);
  const char *at = from ? strstr(g_infer_model, from) : NULL;
  ck_assert_msg(!from || at, "the model has no \"%s\"", from);
  FILE *f = fopen(model, "w");
  ck_assert_ptr_nonnull(f);
  if (at)
    fprintf(f, "%.*s%s%s", (int)(at - g_infer_model), g_infer_model, to, at + strlen(from));
  else
    fputs(g_infer_model, f);
  ck_assert_int_eq(fclose(f), 0);
  f = fopen(sched, "w");
  ck_assert_ptr_nonnull(f);
  fputs("schedule: one-cpu\nmodel: case\n"
        "devices:\n  - {name: cpu0, backend: cpu, arch: host, ordinal: 0, threads: 1,\n"
        "     bandwidth: 1.0e10, flops: 1.0e10, launch: 1.0e-6}\n"
        "streams:\n  - {name: main, device: cpu0}\n"
        "owners:\n  - \"* -> cpu0.main\"\n"
        "step: {prompt: 2, decode: 1}\n",
        f);
  ck_assert_int_eq(fclose(f), 0);
  *o = (ds4c_options){.model_path = model, .sched_path = sched, .out_dir = out};
}

/* The model with one edit fails to compile with `what` in its message. */
static void infer_error(const char *from, const char *to, const char *what)
{
  char model[512], sched[512], out[512];
  ds4c_options o;
  infer_write("bad", from, to, &o, model, sched, out, sizeof model);
  dsl_diag d = {0};
  ir_prog *p = NULL;
  ck_assert_msg(ds4c_build(&o, &p, &d) != 0, "compiled with %s", to);
  ck_assert_msg(strstr(d.msg, what) != NULL, "message \"%s\" lacks \"%s\"", d.msg, what);
}

START_TEST(test_infer_weights)
{
  /* As it is: through kernel generation and the host build. */
  char model[512], sched[512], out[512];
  ds4c_options o;
  infer_write("good", NULL, NULL, &o, model, sched, out, sizeof model);
  dsl_diag d = {0};
  ck_assert_msg(ds4c_compile(&o, &d) == 0, "%s", d.msg);

  infer_error("table, shape: [vocab, hidden], dtype: bf16", "table, shape: [vocab, hidden], dtype: f16",
              "bad.yaml:35:44: error: embed 'net.embed': table 'net.table' has dtype f16, expected f32 or bf16");
  infer_error("dtype: bf16, role: weight}\n      - {name: w_out", "dtype: f16, role: weight}\n      - {name: w_out",
              "error: group_matmul 'net.oa': w 'net.wo_a' has dtype f16, expected f32 or bf16");
  infer_error("w2, shape: [experts, hidden, ffn], dtype: bf16", "w2, shape: [experts, hidden, ffn], dtype: i32",
              "error: moe_experts 'net.experts': w2 'net.w2' has dtype i32, expected f32 or bf16");
  infer_error("s3, shape: [ffn, hidden], dtype: bf16", "s3, shape: [ffn, hidden], dtype: f16",
              "error: swiglu_ffn 'net.shared': w3 'net.s3' has dtype f16, expected f32 or bf16");
  infer_error("gate, shape: [experts, hidden], dtype: bf16", "gate, shape: [experts, hidden], dtype: i32",
              "error: matmul 'net.gate': w 'net.gate' has dtype i32, expected f32 or bf16");
  /* embed's x: [T, H] or [T, N, H], nothing else. */
  infer_error("X, shape: [tokens, hc, hidden]", "X, shape: [tokens, hidden, hc]",
              "bad.yaml:35:58: error: shape mismatch: embed 'net.embed': x 'net.X' has shape [2, 8, 3], "
              "expected [2, _, 8]");
  infer_error("X, shape: [tokens, hc, hidden]", "X, shape: [tokens, hc, hidden, 1]",
              "error: shape mismatch: embed 'net.embed': x 'net.X' has shape [2, 3, 8, 1], expected [2, 8] or "
              "[2, _, 8] (hyper-connection streams)");
  infer_error("X, shape: [tokens, hc, hidden]", "X, shape: [tokens*hc*hidden]",
              "x 'net.X' has shape [48], expected [2, 8] or [2, _, 8]");
  infer_error("X, shape: [tokens, hc, hidden], dtype: f32", "X, shape: [tokens, hc, hidden], dtype: bf16",
              "error: embed 'net.embed': x 'net.X' has dtype bf16, expected f32");
}
END_TEST

/* ---- argmax ---- */

START_TEST(test_argmax)
{
  enum { T = 4, V = 50 };
  kt k;
  kt_init(&k, IR_OP_ARGMAX);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)T, (int64_t)V);
  kt_add(&k, 1, PLAN_I32, 1, (int64_t)T);
  built b;
  build(&k, &b);
  ck_assert_uint_eq(b.kk.grid, T);
  bufs bs;
  bufs_alloc(&bs, &k);
  for (int s = 0; s < NSTEPS; s++) {
    int ntok = g_steps[s][1];
    float *l = bs.b[0];
    fill_f32(l, T * V, 1.0);
    /* Row 1 has its maximum three times; the lowest index wins. */
    l[1 * V + 7] = l[1 * V + 19] = l[1 * V + 40] = 2.0f;
    fill_garbage(bs.b[1], T);
    run_checked(&b, &k, &bs, g_steps[s][0], ntok);
    const int32_t *ids = bs.b[1];
    for (int t = 0; t < T; t++) {
      int want = -1;
      if (t < ntok) {
        want = 0;
        for (int v = 1; v < V; v++)
          if ((double)l[t * V + v] > (double)l[t * V + want])
            want = v;
      }
      ck_assert_int_eq(ids[t], want);
      if (t == 1 && t < ntok)
        ck_assert_int_eq(ids[t], 7);
    }
  }
  bufs_free(&bs);
  unbuild(&b);
}
END_TEST

/* ---- hyper-connections: float64 MATH.md §4, written from the spec ---- */

#define HC_MAXMIX 80 /* (2+N)*N for the N <= 8 used here */

static double sigmoid(double z)
{
  return 1.0 / (1.0 + exp(-z));
}

/* One token's state xs (N streams of D, stream-major): the pre weights of
 * §4.1 step 4 / §4.3 step 3, and with post and C (hc_pre) steps 5-7.
 * x~ = RMSNorm_u(xs) first, then mu = fn . x~, as the spec writes it. */
static void ref_hc_weights(const float *xs, int N, int D, const float *fn, const float *base,
                           const float *scale, double eps, double hc_eps, int iters, double *pre,
                           double *post, double *C)
{
  int K = N * D, M = post ? (2 + N) * N : N;
  ck_assert_int_le(N, 8);
  ck_assert_int_le(M, HC_MAXMIX);
  double ss = 0.0, mu[HC_MAXMIX];
  for (int k = 0; k < K; k++)
    ss += (double)xs[k] * xs[k];
  double rs = 1.0 / sqrt(ss / K + eps);
  for (int m = 0; m < M; m++) {
    mu[m] = 0.0;
    for (int k = 0; k < K; k++)
      mu[m] += (double)fn[m * K + k] * ((double)xs[k] * rs);
  }
  for (int i = 0; i < N; i++)
    pre[i] = sigmoid(mu[i] * scale[0] + base[i]) + hc_eps;
  if (!post)
    return;
  for (int i = 0; i < N; i++)
    post[i] = 2.0 * sigmoid(mu[N + i] * scale[1] + base[N + i]);
  for (int i = 0; i < N; i++) { /* row softmax of the logits, + eps */
    double z[8], mx = -INFINITY, sum = 0.0;
    for (int j = 0; j < N; j++) {
      z[j] = mu[2 * N + N * i + j] * scale[2] + base[2 * N + N * i + j];
      mx = fmax(mx, z[j]);
    }
    for (int j = 0; j < N; j++)
      sum += exp(z[j] - mx);
    for (int j = 0; j < N; j++)
      C[i * N + j] = exp(z[j] - mx) / sum + hc_eps;
  }
  for (int round = 0; round < iters; round++) {
    if (round > 0) /* the iters - 1 row normalisations */
      for (int i = 0; i < N; i++) {
        double s = 0.0;
        for (int j = 0; j < N; j++)
          s += C[i * N + j];
        for (int j = 0; j < N; j++)
          C[i * N + j] /= s + hc_eps;
      }
    for (int j = 0; j < N; j++) { /* the iters column normalisations */
      double s = 0.0;
      for (int i = 0; i < N; i++)
        s += C[i * N + j];
      for (int i = 0; i < N; i++)
        C[i * N + j] /= s + hc_eps;
    }
  }
}

/* sum_i w_i X[i] over the N streams of one token. */
static void ref_hc_collapse(const float *xs, int N, int D, const double *w, double *out)
{
  for (int d = 0; d < D; d++) {
    out[d] = 0.0;
    for (int i = 0; i < N; i++)
      out[d] += w[i] * xs[i * D + d];
  }
}

/* Weights whose mixes are O(1) for a unit-RMS state: fn in +-2.5/sqrt(K),
 * scale in [0.5, 1.5], base in [-1, 1). */
static void fill_hc_weights(bufs *bs, int M, int K, int nscale)
{
  fill_f32(bs->b[1], (int64_t)M * K, 2.5 / sqrt((double)K));
  fill_f32(bs->b[2], M, 1.0);
  float *scale = bs->b[3];
  for (int i = 0; i < nscale; i++)
    scale[i] = (float)(1.0 + 0.5 * rnd());
}

static void hc_pre_op(kt *k, int64_t T, int64_t N, int64_t D, int64_t iters)
{
  kt_init(k, IR_OP_HC_PRE);
  k->op.fattr[0] = 1e-6;
  k->op.fattr[1] = 1e-6;
  k->op.iattr[2] = iters;
  kt_add(k, 0, PLAN_F32, 3, T, N, D);
  kt_add(k, 0, PLAN_F32, 2, (2 + N) * N, N * D);
  kt_add(k, 0, PLAN_F32, 1, (2 + N) * N);
  kt_add(k, 0, PLAN_F32, 1, (int64_t)3);
  kt_add(k, 1, PLAN_F32, 2, T, D);
  kt_add(k, 1, PLAN_F32, 2, T, N);
  kt_add(k, 1, PLAN_F32, 3, T, N, N);
}

/* hc_pre's second launch and the rmsnorm of its x as lower.c fuses them:
 * hc_pre's attrs, the norm's eps 1e-5. */
static void hc_pre_norm_op(kt *k, int64_t T, int64_t N, int64_t D, int64_t iters)
{
  int64_t M = (2 + N) * N;
  kt_init(k, IR_OP_HC_PRE_NORM);
  k->op.fattr[0] = 1e-6;
  k->op.fattr[1] = 1e-6;
  k->op.iattr[2] = iters;
  k->op.fattr[3] = 1e-5;
  kt_add(k, 0, PLAN_F32, 2, T, M + 1);
  kt_add(k, 0, PLAN_F32, 3, T, N, D);
  kt_add(k, 0, PLAN_F32, 1, M);
  kt_add(k, 0, PLAN_F32, 1, (int64_t)3);
  kt_add(k, 0, PLAN_F32, 1, D);
  kt_add(k, 1, PLAN_F32, 2, T, D);
  kt_add(k, 1, PLAN_F32, 2, T, N);
  kt_add(k, 1, PLAN_F32, 3, T, N, N);
}

/* hc_pre on T = 4 slots for every step of g_steps: x, post and comb
 * against float64, dead rows zero. */
static void hc_pre_case(int N, int D, int iters)
{
  enum { T = 4 };
  int K = N * D, M = (2 + N) * N;
  kt k;
  hc_pre_op(&k, T, N, D, iters);
  built b;
  build(&k, &b);
  ck_assert_uint_eq(b.kk.grid, T);
  bufs bs;
  bufs_alloc(&bs, &k);
  for (int s = 0; s < NSTEPS; s++) {
    int ntok = g_steps[s][1];
    fill_f32(bs.b[0], (int64_t)T * K, 2.0);
    fill_hc_weights(&bs, M, K, 3);
    fill_garbage(bs.b[4], (int64_t)T * D);
    fill_garbage(bs.b[5], T * N);
    fill_garbage(bs.b[6], T * N * N);
    run_checked(&b, &k, &bs, g_steps[s][0], ntok);
    const float *X = bs.b[0];
    double *rx = dalloc((int64_t)T * D), *rpost = dalloc(T * N), *rcomb = dalloc(T * N * N);
    for (int t = 0; t < ntok; t++) {
      double pre[8];
      ref_hc_weights(X + t * K, N, D, bs.b[1], bs.b[2], bs.b[3], (double)(float)1e-6, (double)(float)1e-6,
                     iters, pre, rpost + t * N, rcomb + t * N * N);
      ref_hc_collapse(X + t * K, N, D, pre, rx + t * D);
    }
    check_rows("hc_pre x", bs.b[4], rx, T, D, ntok, REL_TOL);
    check_rows("hc_pre post", bs.b[5], rpost, T, N, ntok, REL_TOL);
    check_rows("hc_pre comb", bs.b[6], rcomb, T, N * N, ntok, REL_TOL);
    /* The last step normalised columns: each sums to 1 - O(hc_eps), and
     * the mix is not symmetric (so hc_post's orientation matters). */
    const float *comb = bs.b[6];
    for (int t = 0; t < ntok; t++) {
      double asym = 0.0;
      for (int j = 0; j < N; j++) {
        double col = 0.0;
        for (int i = 0; i < N; i++) {
          col += comb[(t * N + i) * N + j];
          asym = fmax(asym, fabs(comb[(t * N + i) * N + j] - comb[(t * N + j) * N + i]));
        }
        ck_assert_msg(fabs(col - 1.0) < 1e-5, "hc_pre comb: row %d column %d sums to %.9g", t, j, col);
      }
      ck_assert_msg(asym > 1e-3, "hc_pre comb: row %d is symmetric", t);
    }
    free(rx);
    free(rpost);
    free(rcomb);
  }
  bufs_free(&bs);
  unbuild(&b);
}

START_TEST(test_hc_pre)
{
  /* The release's N = 4 with a small D; N = 3 with one Sinkhorn step and
   * with two (iters is honoured); the release's D = 4096, whose f32 sums
   * of 16384 terms are still within REL_TOL (3e-6 measured). */
  hc_pre_case(4, 40, 20);
  hc_pre_case(3, 33, 1);
  hc_pre_case(3, 33, 2);
  hc_pre_case(4, 4096, 20);

  /* Defaults are DeepSeek-V4's. */
  const ir_opkind_def *d = &ir_opkinds[IR_OP_HC_PRE];
  ck_assert_str_eq(d->name, "hc_pre");
  ck_assert_int_eq(d->nattrs, 3);
  ck_assert(d->attrs[0].fallback == 1e-6 && d->attrs[1].fallback == 1e-6 && d->attrs[2].fallback == 20);
}
END_TEST

START_TEST(test_hc_post)
{
  enum { T = 4, N = 4, D = 37 };
  kt k;
  kt_init(&k, IR_OP_HC_POST);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)T, (int64_t)D);
  kt_add(&k, 0, PLAN_F32, 3, (int64_t)T, (int64_t)N, (int64_t)D);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)T, (int64_t)N);
  kt_add(&k, 0, PLAN_F32, 3, (int64_t)T, (int64_t)N, (int64_t)N);
  kt_add(&k, 1, PLAN_F32, 3, (int64_t)T, (int64_t)N, (int64_t)D);
  built b;
  build(&k, &b);
  ck_assert_uint_eq(b.kk.grid, T * N); /* a block per slot and output stream */
  bufs bs;
  bufs_alloc(&bs, &k);
  float *post = bs.b[2], *comb = bs.b[3], *out = bs.b[4];
  const float *y = bs.b[0], *X = bs.b[1];
  for (int s = 0; s < NSTEPS; s++) {
    int ntok = g_steps[s][1];
    fill_f32(bs.b[0], T * D, 1.0);
    fill_f32(bs.b[1], T * N * D, 1.0);
    for (int i = 0; i < T * N; i++)
      post[i] = (float)(1.0 + rnd()); /* (0, 2) as 2 sigma */
    for (int i = 0; i < T * N * N; i++)
      comb[i] = (float)(0.5 + 0.5 * rnd()); /* positive, not symmetric */
    fill_garbage(out, T * N * D);
    run_checked(&b, &k, &bs, g_steps[s][0], ntok);
    double *ref = dalloc(T * N * D);
    for (int t = 0; t < ntok; t++)
      for (int j = 0; j < N; j++)
        for (int d = 0; d < D; d++) {
          double acc = (double)post[t * N + j] * y[t * D + d];
          for (int i = 0; i < N; i++)
            acc += (double)comb[(t * N + i) * N + j] * X[(t * N + i) * D + d];
          ref[(t * N + j) * D + d] = acc;
        }
    check_rows("hc_post", out, ref, T, N * D, ntok, REL_TOL);
    free(ref);
  }

  /* Orientation: comb[i][(i+1) mod N] = 1, the rest and post 0, moves
   * stream i to stream i + 1 exactly. */
  memset(post, 0, T * N * sizeof *post);
  memset(comb, 0, T * N * N * sizeof *comb);
  for (int t = 0; t < T; t++)
    for (int i = 0; i < N; i++)
      comb[(t * N + i) * N + (i + 1) % N] = 1.0f;
  fill_garbage(out, T * N * D);
  run_checked(&b, &k, &bs, 0, T);
  for (int t = 0; t < T; t++)
    for (int i = 0; i < N; i++)
      for (int d = 0; d < D; d++)
        ck_assert_msg(out[(t * N + (i + 1) % N) * D + d] == X[(t * N + i) * D + d],
                      "hc_post: stream %d did not move to stream %d", i, (i + 1) % N);
  bufs_free(&bs);
  unbuild(&b);
}
END_TEST

static void hc_head_op(kt *k, int64_t T, int64_t N, int64_t D)
{
  kt_init(k, IR_OP_HC_HEAD);
  k->op.fattr[0] = 1e-6;
  k->op.fattr[1] = 1e-6;
  kt_add(k, 0, PLAN_F32, 3, T, N, D);
  kt_add(k, 0, PLAN_F32, 2, N, N * D);
  kt_add(k, 0, PLAN_F32, 1, N);
  kt_add(k, 0, PLAN_F32, 1, (int64_t)1);
  kt_add(k, 1, PLAN_F32, 2, T, D);
}

START_TEST(test_hc_head)
{
  enum { T = 4 };
  static const int shapes[][2] = {{4, 40}, {4, 4096}, {2, 9}};
  for (int c = 0; c < 3; c++) {
    int N = shapes[c][0], D = shapes[c][1], K = N * D;
    kt k;
    hc_head_op(&k, T, N, D);
    built b;
    build(&k, &b);
    ck_assert_uint_eq(b.kk.grid, T);
    bufs bs;
    bufs_alloc(&bs, &k);
    for (int s = 0; s < NSTEPS; s++) {
      int ntok = g_steps[s][1];
      fill_f32(bs.b[0], (int64_t)T * K, 2.0);
      fill_hc_weights(&bs, N, K, 1);
      fill_garbage(bs.b[4], (int64_t)T * D);
      run_checked(&b, &k, &bs, g_steps[s][0], ntok);
      const float *X = bs.b[0];
      double *ref = dalloc((int64_t)T * D);
      for (int t = 0; t < ntok; t++) {
        double pre[8];
        ref_hc_weights(X + t * K, N, D, bs.b[1], bs.b[2], bs.b[3], (double)(float)1e-6, (double)(float)1e-6, 0,
                       pre, NULL, NULL);
        ref_hc_collapse(X + t * K, N, D, pre, ref + t * D);
      }
      check_rows("hc_head", bs.b[4], ref, T, D, ntok, REL_TOL);
      free(ref);
    }
    bufs_free(&bs);
    unbuild(&b);
  }
}
END_TEST

/* ---- score_route and hash_route: MATH.md §10, in float64 ---- */

#define ROUTE_MAXE 256

/* §10.1: s = sqrt(softplus(z)), softplus(z) = z above PyTorch's threshold
 * 20, else ln(1 + e^z). */
static double ref_route_score(double z)
{
  return sqrt(z > 20.0 ? z : log1p(exp(z)));
}

/* §10.2-10.3, score-routed: I = the K largest keys s_e + b_e, taken by
 * repeated scans with a strict comparison (ties: the lower index first);
 * w_j = s_I[j] / (sum over I of s + 1e-20) * scale. Returns how close the
 * choice came to another: the smallest gap between consecutive keys of
 * the order, down to the best key left out. */
static double ref_score_route(const float *z, const float *b, int E, int K, double scale, int32_t *idx,
                              double *w)
{
  double s[ROUTE_MAXE], key[ROUTE_MAXE], sum = 0.0, gap = INFINITY;
  int taken[ROUTE_MAXE] = {0};
  ck_assert_int_le(E, ROUTE_MAXE);
  for (int e = 0; e < E; e++) {
    s[e] = ref_route_score(z[e]);
    key[e] = s[e] + b[e];
  }
  for (int j = 0; j <= K && j < E; j++) {
    int best = -1;
    for (int e = 0; e < E; e++)
      if (!taken[e] && (best < 0 || key[e] > key[best]))
        best = e;
    if (j > 0)
      gap = fmin(gap, key[idx[j - 1]] - key[best]);
    if (j == K)
      break;
    taken[best] = 1;
    idx[j] = best;
    sum += s[best];
  }
  for (int j = 0; j < K; j++)
    w[j] = s[idx[j]] / (sum + 1e-20) * scale;
  return gap;
}

static void score_route_op(kt *k, int64_t T, int64_t E, int64_t K, double scale)
{
  kt_init(k, IR_OP_SCORE_ROUTE);
  k->op.iattr[0] = K;
  k->op.fattr[1] = scale;
  kt_add(k, 0, PLAN_F32, 2, T, E);
  kt_add(k, 0, PLAN_F32, 1, E);
  kt_add(k, 1, PLAN_I32, 2, T, K);
  kt_add(k, 1, PLAN_F32, 2, T, K);
}

/* One score_route kernel for every step of g_steps. With fixed logits
 * and bias (every row the same), want_idx, when given, is the choice;
 * else logits in +-zmax and bias in +-0.5, drawn afresh. The choice must
 * be the float64 one exactly, so random inputs must not come within f32
 * rounding of a different choice (checked); the weights within REL_TOL.
 * seen counts chosen experts with z > 20 and with z <= 20. */
static void score_route_case(int E, int K, double zmax, const float *fixed_z, const float *fixed_b,
                             const int32_t *want_idx, int seen[2])
{
  enum { T = 4 };
  const double scale = 1.5;
  kt k;
  score_route_op(&k, T, E, K, scale);
  built b;
  build(&k, &b);
  ck_assert_uint_eq(b.kk.grid, T);
  bufs bs;
  bufs_alloc(&bs, &k);
  float *z = bs.b[0], *bias = bs.b[1];
  for (int s = 0; s < NSTEPS; s++) {
    int ntok = g_steps[s][1];
    if (fixed_z) {
      for (int t = 0; t < T; t++)
        memcpy(z + t * E, fixed_z, (size_t)E * sizeof *z);
      memcpy(bias, fixed_b, (size_t)E * sizeof *bias);
    } else {
      fill_f32(z, T * E, zmax);
      fill_f32(bias, E, 0.5);
    }
    fill_garbage(bs.b[2], T * K);
    fill_garbage(bs.b[3], T * K);
    run_checked(&b, &k, &bs, g_steps[s][0], ntok);
    const int32_t *idx = bs.b[2];
    double *ref = dalloc(T * K);
    for (int t = 0; t < T; t++) {
      if (t >= ntok) {
        for (int j = 0; j < K; j++)
          ck_assert_int_eq(idx[t * K + j], 0);
        continue;
      }
      int32_t ridx[ROUTE_MAXE];
      double gap = ref_score_route(z + t * E, bias, E, K, scale, ridx, ref + t * K);
      if (!fixed_z) /* a few f32 ulps of keys up to ~sqrt(zmax) + 0.5 */
        ck_assert_msg(gap > 1e-5, "score_route: random keys within %g of another choice", gap);
      for (int j = 0; j < K; j++) {
        ck_assert_msg(idx[t * K + j] == ridx[j], "score_route E %d K %d: row %d choice %d is %d, float64 %d",
                      E, K, t, j, idx[t * K + j], ridx[j]);
        if (want_idx)
          ck_assert_int_eq(idx[t * K + j], want_idx[j]);
        seen[z[t * E + ridx[j]] > 20.0f ? 0 : 1]++;
      }
    }
    check_rows("score_route", bs.b[3], ref, T, K, ntok, REL_TOL);
    free(ref);
  }
  bufs_free(&bs);
  unbuild(&b);
}

START_TEST(test_score_route)
{
  int seen[2] = {0};
  /* DeepSeek-V4's 256 experts, 6 chosen; smaller; all chosen. Logits in
   * +-25 put chosen scores on both sides of softplus' threshold. */
  score_route_case(256, 6, 25.0, NULL, NULL, NULL, seen);
  score_route_case(16, 4, 25.0, NULL, NULL, NULL, seen);
  score_route_case(5, 5, 3.0, NULL, NULL, NULL, seen);
  ck_assert_msg(seen[0] > 0 && seen[1] > 0, "score_route: chosen z > 20: %d, z <= 20: %d", seen[0], seen[1]);

  /* Exact ties (equal logits and bias give bit-equal keys): the lower
   * index first, below the threshold and above it. */
  static const float tz[6] = {1.0f, 3.0f, 3.0f, 0.0f, 3.0f, 2.0f}, tb[6] = {0};
  static const int32_t tw[5] = {1, 2, 4, 5, 0};
  score_route_case(6, 5, 0.0, tz, tb, tw, seen);
  static const float hz[5] = {21.0f, 25.0f, 25.0f, 30.0f, 25.0f}, hb[5] = {0.25f, 0.25f, 0.25f, 0.25f, 0.25f};
  static const int32_t hw[4] = {3, 1, 2, 4};
  score_route_case(5, 4, 0.0, hz, hb, hw, seen);

  /* Near ties: equal logits, biases 16 f32 steps apart (about 4 ulps of
   * the keys): the larger key wins although its index is higher, and the
   * bias moves the choice but never the weights (all equal). */
  float nz[8], nb[8];
  for (int e = 0; e < 8; e++) {
    nz[e] = 2.0f;
    nb[e] = 0.25f;
    for (int i = 0; i < 16 * e; i++)
      nb[e] = nextafterf(nb[e], 1.0f);
  }
  static const int32_t nw[3] = {7, 6, 5};
  score_route_case(8, 3, 0.0, nz, nb, nw, seen);

  /* The bias chooses, the scores weigh: a large bias on a small score. */
  static const float bz[4] = {3.0f, -4.0f, 2.0f, 1.0f}, bb[4] = {0.0f, 10.0f, 0.0f, 0.0f};
  static const int32_t bw[2] = {1, 0};
  score_route_case(4, 2, 0.0, bz, bb, bw, seen);
}
END_TEST

/* §10.2-10.4, hash-routed: slot j of a token with id takes expert
 * table[id, j] (repeats count twice); w_j = s_j / (sum over the slots of s
 * + 1e-20) * scale. An id outside [0, V) or an entry outside [0, E)
 * leaves idx -1, w 0, out of the sum (docs/OPS.md). */
static void ref_hash_route(int32_t id, const float *z, const int32_t *table, int E, int V, int K, double scale,
                           int32_t *idx, double *w)
{
  double s[ROUTE_MAXE], sum = 0.0;
  ck_assert_int_le(K, ROUTE_MAXE);
  for (int j = 0; j < K; j++) {
    int32_t e = id >= 0 && id < V ? table[(int64_t)id * K + j] : -1;
    idx[j] = e >= 0 && e < E ? e : -1;
    s[j] = idx[j] >= 0 ? ref_route_score(z[idx[j]]) : 0.0;
    sum += s[j];
  }
  for (int j = 0; j < K; j++)
    w[j] = idx[j] >= 0 ? s[j] / (sum + 1e-20) * scale : 0.0;
}

static void hash_route_op(kt *k, int64_t T, int64_t E, int64_t V, int64_t K, double scale)
{
  kt_init(k, IR_OP_HASH_ROUTE);
  k->op.fattr[0] = scale;
  kt_add(k, 0, PLAN_I32, 1, T);
  kt_add(k, 0, PLAN_F32, 2, T, E);
  kt_add(k, 0, PLAN_I32, 2, V, K);
  kt_add(k, 1, PLAN_I32, 2, T, K);
  kt_add(k, 1, PLAN_F32, 2, T, K);
}

/* hash_route for every step of g_steps, against float64. Table rows 0-2
 * are special: a repeated expert, bad entries, nothing valid. */
static void hash_route_case(int E, int V, int K)
{
  enum { T = 4 };
  const double scale = 1.5;
  kt k;
  hash_route_op(&k, T, E, V, K, scale);
  built b;
  build(&k, &b);
  ck_assert_uint_eq(b.kk.grid, T);
  bufs bs;
  bufs_alloc(&bs, &k);
  int32_t *ids = bs.b[0], *table = bs.b[2];
  /* Valid ids (special rows included) and ids that must read nothing. */
  const int32_t idsets[3][T] = {{V - 1, 0, V / 2, 1}, {2, -1, V, 0}, {INT32_MAX, 1, INT32_MIN, V - 2}};
  for (int set = 0; set < 3; set++)
    for (int s = 0; s < NSTEPS; s++) {
      int ntok = g_steps[s][1];
      memcpy(ids, idsets[set], sizeof idsets[set]);
      fill_f32(bs.b[1], T * E, 25.0);
      for (int i = 0; i < V * K; i++)
        table[i] = (int32_t)((rnd() + 1.0) * 0.5 * E) % E;
      table[0 * K + 1] = table[0 * K + 0];                    /* row 0: one expert twice */
      table[1 * K + 0] = -1;                                  /* row 1: bad entries */
      table[1 * K + K - 1] = E;
      for (int j = 0; j < K; j++)                             /* row 2: nothing valid */
        table[2 * K + j] = j % 2 ? INT32_MIN : E + j;
      fill_garbage(bs.b[3], T * K);
      fill_garbage(bs.b[4], T * K);
      run_checked(&b, &k, &bs, g_steps[s][0], ntok);
      const int32_t *idx = bs.b[3];
      const float *w = bs.b[4];
      double *ref = dalloc(T * K);
      for (int t = 0; t < T; t++) {
        int32_t ridx[ROUTE_MAXE];
        if (t < ntok)
          ref_hash_route(ids[t], (const float *)bs.b[1] + t * E, table, E, V, K, scale, ridx, ref + t * K);
        for (int j = 0; j < K; j++)
          ck_assert_msg(idx[t * K + j] == (t < ntok ? ridx[j] : 0), "hash_route: row %d slot %d is %d", t, j,
                        idx[t * K + j]);
        if (t < ntok && ids[t] == 0) /* both copies of a repeat weigh the same */
          ck_assert(w[t * K] == w[t * K + 1] && w[t * K] > 0.0f);
        for (int j = 0; t < ntok && j < K; j++)
          if (ridx[j] < 0)
            ck_assert_msg(w[t * K + j] == 0.0f && !signbit(w[t * K + j]), "hash_route: bad slot not +0");
      }
      check_rows("hash_route", w, ref, T, K, ntok, REL_TOL);
      free(ref);
    }
  bufs_free(&bs);
  unbuild(&b);
}

START_TEST(test_hash_route)
{
  hash_route_case(256, 50, 6); /* DeepSeek-V4's experts and choices */
  hash_route_case(8, 11, 3);
  hash_route_case(4, 5, 2);
}
END_TEST

/* ---- naming, dedupe and determinism ---- */

static void rmsnorm_op(kt *k, int64_t T, int64_t H, double eps)
{
  kt_init(k, IR_OP_RMSNORM);
  k->op.fattr[0] = eps;
  kt_add(k, 0, PLAN_F32, 2, T, H);
  kt_add(k, 0, PLAN_F32, 1, H);
  kt_add(k, 1, PLAN_F32, 2, T, H);
}

static void gen(kt *k, kgen_kernel *out)
{
  dsl_diag d = {0};
  ck_assert_msg(kgen_host(&k->prog, &k->op, out, &d) == 0, "kgen_host: %s", d.msg);
}

START_TEST(test_naming)
{
  kt a, b;
  kgen_kernel ka, kb;
  rmsnorm_op(&a, 4, 64, 1e-6);
  gen(&a, &ka);
  /* ds4k_<kind>_<16 hex digits> */
  ck_assert_int_eq((int)strlen(ka.symbol), (int)strlen("ds4k_rmsnorm_") + 16);
  ck_assert(strncmp(ka.symbol, "ds4k_rmsnorm_", 13) == 0);
  ck_assert(strspn(ka.symbol + 13, "0123456789abcdef") == 16);
  ck_assert_ptr_nonnull(strstr(ka.source, ka.symbol));
  ck_assert_ptr_nonnull(strstr(ka.source, "#include <stdint.h>"));
  ck_assert_ptr_nonnull(strstr(ka.source, "#include <math.h>"));

  /* Same kind, attrs, shapes and dtypes, different paths and op position:
   * byte-identical source and symbol (so instances dedupe). */
  rmsnorm_op(&b, 4, 64, 1e-6);
  b.op.path = "elsewhere.norm";
  b.op.pos.line = 1;
  snprintf(b.paths[0], sizeof b.paths[0], "other.x");
  gen(&b, &kb);
  ck_assert_str_eq(ka.symbol, kb.symbol);
  ck_assert_str_eq(ka.source, kb.source);
  ck_assert_uint_eq(ka.grid, kb.grid);
  ck_assert_ptr_null(strstr(kb.source, "other.x"));
  ck_assert_ptr_null(strstr(kb.source, "elsewhere.norm"));
  kgen_kernel_free(&kb);

  /* A different attr, a different shape: a different kernel. */
  struct { int64_t T, H; double eps; } variants[] = {
      {4, 64, 1e-5}, {4, 65, 1e-6}, {1, 64, 1e-6}};
  for (int i = 0; i < 3; i++) {
    rmsnorm_op(&b, variants[i].T, variants[i].H, variants[i].eps);
    gen(&b, &kb);
    ck_assert_str_ne(ka.symbol, kb.symbol);
    ck_assert_str_ne(ka.source, kb.source);
    kgen_kernel_free(&kb);
  }
  /* An int attr: rope heads. */
  kgen_kernel r1, r2;
  kt_init(&a, IR_OP_ROPE);
  a.op.iattr[0] = 4;
  a.op.iattr[1] = 8;
  a.op.fattr[2] = 10000.0;
  kt_add(&a, 0, PLAN_F32, 2, (int64_t)4, (int64_t)64);
  kt_add(&a, 1, PLAN_F32, 2, (int64_t)4, (int64_t)64);
  gen(&a, &r1);
  a.op.iattr[0] = 2;
  gen(&a, &r2);
  ck_assert_str_ne(r1.symbol, r2.symbol);
  kgen_kernel_free(&r2);
  a.op.iattr[0] = 4;
  a.op.fattr[2] = 10000.5;
  gen(&a, &r2);
  ck_assert_str_ne(r1.symbol, r2.symbol);
  kgen_kernel_free(&r2);
  a.op.fattr[2] = 10000.0;
  gen(&a, &r2);
  ck_assert_str_eq(r1.symbol, r2.symbol);
  ck_assert_str_eq(r1.source, r2.source);
  kgen_kernel_free(&r1);
  kgen_kernel_free(&r2);

  /* Float attrs are written exactly: eps 1e-6 as f32 is 0x8637bd * 2^-43. */
  ck_assert_ptr_nonnull(strstr(ka.source, "#define EPS (0x8637bdp-43f)"));
  kgen_kernel_free(&ka);
  kgen_kernel_free(&ka); /* a second free is harmless */
}
END_TEST

START_TEST(test_templates)
{
  static const char *const kinds[] = {"embed", "rmsnorm", "matmul", "rope",
                                      "cache_write", "attention", "add", "topk_route",
                                      "moe_experts", "moe_combine", "swiglu_ffn", "argmax",
                                      "sum_parts", "hc_pre", "hc_post", "hc_head", "score_route",
                                      "hash_route", "compress_store", "compress_pool", "index_scores",
                                      "index_select", "rmsnorm_groups", "window_write", "sink_attention",
                                      "group_matmul", "swiglu_act"};
  for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
    const char *t = ds4_template_find("host", kinds[i]);
    ck_assert_msg(t != NULL, "no host template for %s", kinds[i]);
    ck_assert_ptr_nonnull(strstr(t, "KERNEL_NAME"));
  }
  ck_assert_ptr_null(ds4_template_find("host", "copy"));
  ck_assert_ptr_null(ds4_template_find("hip", "rmsnorm"));
}
END_TEST

/* ---- errors: each names the problem and points at the op ---- */

static void expect_error(kt *k, const char *what)
{
  dsl_diag d = {0};
  kgen_kernel kk;
  ck_assert_int_ne(kgen_host(&k->prog, &k->op, &kk, &d), 0);
  ck_assert_int_ne(d.failed, 0);
  ck_assert_ptr_null(kk.symbol);
  ck_assert_ptr_null(kk.source);
  ck_assert_msg(strstr(d.msg, what) != NULL, "message \"%s\" lacks \"%s\"", d.msg, what);
  ck_assert_msg(strstr(d.msg, "kernels.yaml:2:5") != NULL, "message \"%s\" lacks the position",
                d.msg);
}

START_TEST(test_errors)
{
  kt k;
  rmsnorm_op(&k, 4, 64, 1e-6);
  k.tensors[0].dtype = PLAN_BF16;
  expect_error(&k, "rmsnorm: dtype bf16 not supported by the host kernels yet");

  rmsnorm_op(&k, 4, 64, 1e-6);
  k.tensors[2].dtype = PLAN_F16;
  expect_error(&k, "rmsnorm: dtype f16 not supported by the host kernels yet");

  rmsnorm_op(&k, 4, 64, 1e-6);
  k.op.fattr[0] = NAN;
  expect_error(&k, "rmsnorm: attr eps must be a finite f32 value");

  rmsnorm_op(&k, 4, 64, 1e-6);
  k.tensors[1].dim[0] = 63;
  expect_error(&k, "rmsnorm: input w (t1) has shape [63]");

  rmsnorm_op(&k, 4, 64, 1e-6);
  k.op.nin = 1;
  expect_error(&k, "rmsnorm: takes 2 inputs and 1 outputs, got 1 and 1");

  rmsnorm_op(&k, 4, 64, 1e-6);
  k.op.in[1] = 9;
  expect_error(&k, "refers to tensor 9");

  rmsnorm_op(&k, 4, 64, 1e-6);
  k.tensors[0].ndim = 3;
  k.tensors[0].dim[2] = 1;
  expect_error(&k, "expected 2 dimensions");

  rmsnorm_op(&k, 4, 64, 1e-6);
  k.tensors[0].dim[1] = 0;
  expect_error(&k, "every dimension must be");

  kt_init(&k, IR_OP_EMBED);
  kt_add(&k, 0, PLAN_F32, 1, (int64_t)4);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)8, (int64_t)4);
  kt_add(&k, 1, PLAN_F32, 2, (int64_t)4, (int64_t)4);
  expect_error(&k, "embed: input ids (t0) has dtype f32; expected i32");
  /* x is [T,H] or [T,N,H]; the table f32 or bf16. */
  k.tensors[0].dtype = PLAN_I32;
  k.tensors[2].dim[1] = 5;
  expect_error(&k, "embed: output x (t2) has shape [4,5]; expected [4,4] or [4,N,4] (N hyper-connection streams)");
  k.tensors[2].ndim = 3;
  k.tensors[2].dim[1] = 2;
  k.tensors[2].dim[2] = 4;
  k.tensors[2].dim[0] = 3;
  expect_error(&k, "embed: output x (t2) has shape [3,2,4]; expected [4,4] or [4,N,4]");
  k.tensors[2].dim[0] = 4;
  k.tensors[2].ndim = 4;
  k.tensors[2].dim[3] = 4;
  expect_error(&k, "embed: output x (t2) has shape [4,2,4,4]; expected [4,4] or [4,N,4]");
  k.tensors[2].ndim = 1;
  expect_error(&k, "embed: output x (t2) has shape [4]; expected [4,4] or [4,N,4]");
  k.tensors[2].ndim = 3;
  k.tensors[1].dtype = PLAN_I32;
  expect_error(&k, "embed: input table (t1) has dtype i32; expected f32 or bf16");
  k.tensors[1].dtype = PLAN_F16;
  expect_error(&k, "embed: dtype f16 not supported by the host kernels yet (input table: t1)");
  k.tensors[1].dtype = PLAN_BF16;
  k.tensors[2].dtype = PLAN_BF16;
  expect_error(&k, "embed: dtype bf16 not supported by the host kernels yet (output x: t2)");

  kt_init(&k, IR_OP_MATMUL);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)4, (int64_t)8);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)16, (int64_t)9);
  kt_add(&k, 1, PLAN_F32, 2, (int64_t)4, (int64_t)16);
  expect_error(&k, "dimension 1 (K) must be 8 as in input x");
  /* The weight may be f32 or bf16; nothing else, and no other operand. */
  k.tensors[1].dim[1] = 8;
  k.tensors[1].dtype = PLAN_I32;
  expect_error(&k, "matmul: input w (t1) has dtype i32; expected f32, bf16, f8e4m3 or mxfp4");
  k.tensors[1].dtype = PLAN_F16;
  expect_error(&k, "matmul: dtype f16 not supported by the host kernels yet (input w: t1)");
  k.tensors[1].dtype = PLAN_BF16;
  k.tensors[0].dtype = PLAN_BF16;
  expect_error(&k, "matmul: dtype bf16 not supported by the host kernels yet (input x: t0)");
  k.tensors[0].dtype = PLAN_F32;
  k.tensors[2].dtype = PLAN_BF16;
  expect_error(&k, "matmul: dtype bf16 not supported by the host kernels yet (output y: t2)");

  kt_init(&k, IR_OP_ROPE);
  k.op.iattr[0] = 3;
  k.op.iattr[1] = 4;
  k.op.fattr[2] = 10000.0;
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)4, (int64_t)64);
  kt_add(&k, 1, PLAN_F32, 2, (int64_t)4, (int64_t)64);
  expect_error(&k, "rope: attr heads = 3 must be positive and divide the 64 channels");
  k.op.iattr[0] = 4;
  k.op.iattr[1] = 5;
  expect_error(&k, "rope: attr rope_dim = 5 must be even and at most the head dim 16");
  k.op.iattr[1] = 18;
  expect_error(&k, "rope: attr rope_dim = 18");
  k.op.iattr[1] = 8;
  k.op.fattr[2] = -1.0;
  expect_error(&k, "rope: attr theta must be positive");

  kt_init(&k, IR_OP_ATTENTION);
  k.op.iattr[0] = 0;
  k.op.fattr[1] = 0.25;
  for (int i = 0; i < 4; i++)
    kt_add(&k, i == 3, PLAN_F32, 2, (int64_t)(i == 1 || i == 2 ? 16 : 4), (int64_t)32);
  expect_error(&k, "attention: attr heads = 0");
  k.op.iattr[0] = 2;
  k.op.fattr[1] = INFINITY;
  expect_error(&k, "attention: attr scale must be a finite f32 value");

  kt_init(&k, IR_OP_ADD);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)4, (int64_t)8);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)4, (int64_t)9);
  kt_add(&k, 1, PLAN_F32, 2, (int64_t)4, (int64_t)8);
  expect_error(&k, "add: input b (t1) has shape [4,9]; expected [4,8] like input a");

  kt_init(&k, IR_OP_TOPK_ROUTE);
  k.op.iattr[0] = 3;
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)4, (int64_t)8);
  kt_add(&k, 1, PLAN_I32, 2, (int64_t)4, (int64_t)2);
  kt_add(&k, 1, PLAN_F32, 2, (int64_t)4, (int64_t)2);
  expect_error(&k, "topk_route: attr k = 3 must equal");
  k.op.iattr[0] = 9;
  k.tensors[1].dim[1] = k.tensors[2].dim[1] = 9;
  expect_error(&k, "be at most the 8 experts");

  kt_init(&k, IR_OP_MOE_EXPERTS);
  int rows[3] = {0, 8, -1};
  k.op.expert_row = rows;
  k.op.nexperts = 3;
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)4, (int64_t)8);
  kt_add(&k, 0, PLAN_I32, 2, (int64_t)4, (int64_t)2);
  kt_add(&k, 0, PLAN_F32, 3, (int64_t)8, (int64_t)6, (int64_t)8);
  kt_add(&k, 0, PLAN_F32, 3, (int64_t)8, (int64_t)6, (int64_t)8);
  kt_add(&k, 0, PLAN_F32, 3, (int64_t)8, (int64_t)8, (int64_t)6);
  kt_add(&k, 1, PLAN_F32, 3, (int64_t)4, (int64_t)2, (int64_t)8);
  expect_error(&k, "moe_experts: expert 1 maps to row 8 of 8");
  rows[1] = 7;
  k.tensors[1].dtype = PLAN_BF16;
  expect_error(&k, "moe_experts: input idx (t1) has dtype bf16; expected i32");
  k.tensors[1].dtype = PLAN_I32;
  k.tensors[4].dtype = PLAN_I32;
  expect_error(&k, "moe_experts: input w2 (t4) has dtype i32; expected f32, bf16, f8e4m3 or mxfp4");
  k.tensors[4].dtype = PLAN_F16;
  expect_error(&k, "moe_experts: dtype f16 not supported by the host kernels yet (input w2: t4)");
  k.tensors[4].dtype = PLAN_BF16;
  k.tensors[0].dtype = PLAN_BF16;
  expect_error(&k, "moe_experts: dtype bf16 not supported by the host kernels yet (input x: t0)");

  kt_init(&k, IR_OP_SWIGLU_FFN);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)4, (int64_t)8);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)6, (int64_t)8);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)6, (int64_t)8);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)8, (int64_t)6);
  kt_add(&k, 1, PLAN_F32, 2, (int64_t)4, (int64_t)8);
  k.tensors[2].dtype = PLAN_F16;
  expect_error(&k, "swiglu_ffn: dtype f16 not supported by the host kernels yet (input w3: t2)");
  k.tensors[2].dtype = PLAN_BF16;
  k.tensors[4].dtype = PLAN_BF16;
  expect_error(&k, "swiglu_ffn: dtype bf16 not supported by the host kernels yet (output y: t4)");

  kt_init(&k, IR_OP_SUM_PARTS);
  k.op.iattr[0] = 3;
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)8, (int64_t)5);
  kt_add(&k, 1, PLAN_F32, 2, (int64_t)4, (int64_t)5);
  expect_error(&k, "sum_parts: parts (t0) must be 3 copies of the shape of y (t1) along dimension 0");

  hc_pre_op(&k, 4, 4, 40, 20);
  k.tensors[3].dim[0] = 2;
  expect_error(&k, "hc_pre: fn (t1), base (t2) and scale (t3) must be [24,160], [24] and [3] for 4 streams of 40");
  hc_pre_op(&k, 4, 4, 40, 20);
  k.tensors[1].dim[1] = 161;
  expect_error(&k, "must be [24,160]");
  hc_pre_op(&k, 4, 4, 40, 0);
  expect_error(&k, "hc_pre: attr iters must be at least 1");
  hc_pre_op(&k, 4, 4, 40, 20);
  k.op.fattr[1] = NAN;
  expect_error(&k, "hc_pre: attr hc_eps must be a finite f32 value");
  hc_pre_op(&k, 4, 4, 40, 20);
  k.tensors[6].dim[2] = 3;
  expect_error(&k, "hc_pre: output comb (t6) has shape [4,4,3]; dimension 2 (N) must be 4 as in input X");
  hc_head_op(&k, 4, 65, 2);
  expect_error(&k, "hc_head: 65 hyper-connection streams; the kernels take at most 64");
  hc_head_op(&k, 4, 4, 40);
  k.tensors[3].dim[0] = 3;
  expect_error(&k, "hc_head: fn (t1), base (t2) and scale (t3) must be [4,160], [4] and [1]");

  /* rope's DS4 attrs */
  rope_op(&k, 4, 16, 8, 10000.0, 2, NULL);
  expect_error(&k, "rope: attr inverse must be 0 or 1");
  rope_op(&k, 4, 16, 8, 10000.0, 0, NULL);
  k.op.iattr[8] = 1;
  expect_error(&k, "rope: attr position must be 0 (the token's position)");
  rope_op(&k, 4, 16, 8, 10000.0, 0, NULL);
  k.op.fattr[6] = 32.0;
  expect_error(&k, "rope: attr yarn_beta_fast needs yarn_factor");
  rope_op(&k, 4, 16, 8, 10000.0, 0, g_ds4_yarn);
  k.op.fattr[5] = 0.0;
  expect_error(&k, "rope: attr yarn_orig must be positive with YaRN");
  k.op.fattr[5] = NAN;
  expect_error(&k, "rope: attr yarn_orig must be a finite f32 value");

  kt_init(&k, IR_OP_RMSNORM_GROUPS);
  k.op.fattr[0] = 1e-6;
  k.op.iattr[1] = 5;
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)4, (int64_t)64);
  kt_add(&k, 1, PLAN_F32, 2, (int64_t)4, (int64_t)64);
  expect_error(&k, "rmsnorm_groups: attr group = 5 must divide the 64 channels");

  kt_init(&k, IR_OP_WINDOW_WRITE);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)4, (int64_t)8);
  kt_add(&k, 1, PLAN_F32, 2, (int64_t)3, (int64_t)8);
  expect_error(&k, "window_write: the ring's 3 rows are fewer than the 4 token slots");

  static const sink_cfg sc = {4, 16, 4, 7, 4, 2, 16, 3};
  sink_op(&k, &sc, 4);
  k.op.iattr[0] = 2;
  expect_error(&k, "sink_attention: attr heads = 2 must equal the 4 sinks");
  sink_op(&k, &sc, 4);
  k.tensors[2].dim[1] = 8;
  expect_error(&k, "sink_attention: input entries (t2) has shape [16,8]; dimension 1 (D) must be 16 as in input ring");
  sink_op(&k, &sc, 4);
  k.op.iattr[3] = 3;
  expect_error(&k, "sink_attention: attr select must be 0, 1 or 2");
  sink_op(&k, &sc, 4);
  k.op.iattr[2] = 0;
  expect_error(&k, "sink_attention: attr ratio must be at least 1 when select is not 0");
  sink_op(&k, &sc, 4);
  k.op.iattr[1] = 0;
  expect_error(&k, "sink_attention: attr window must be at least 1");
  sink_op(&k, &sc, 4);
  k.tensors[3].dtype = PLAN_F32;
  expect_error(&k, "sink_attention: input sel (t3) has dtype f32; expected i32");

  kt_init(&k, IR_OP_GROUP_MATMUL);
  k.op.iattr[0] = 3;
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)4, (int64_t)48);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)20, (int64_t)16);
  kt_add(&k, 1, PLAN_F32, 2, (int64_t)4, (int64_t)20);
  expect_error(&k, "group_matmul: attr groups = 3 must split w's 20 rows");
  k.tensors[1].dim[0] = 21;
  k.tensors[2].dim[1] = 21;
  k.tensors[1].dtype = PLAN_I32;
  expect_error(&k, "group_matmul: input w (t1) has dtype i32; expected f32, bf16, f8e4m3 or mxfp4");
  k.tensors[1].dtype = PLAN_BF16;
  k.tensors[0].dtype = PLAN_BF16;
  expect_error(&k, "group_matmul: dtype bf16 not supported by the host kernels yet (input x: t0)");

  kt_init(&k, IR_OP_COPY);
  expect_error(&k, "has no host kernel");
  kt_init(&k, IR_NOPKIND + 3);
  expect_error(&k, "has no host kernel");
}
END_TEST

START_TEST(test_route_errors)
{
  kt k;
  score_route_op(&k, 4, 8, 3, 1.5);
  k.op.iattr[0] = 2;
  expect_error(&k, "score_route: attr k = 2 must equal the outputs' last dimension 3");
  score_route_op(&k, 4, 8, 9, 1.5);
  expect_error(&k, "be at most the 8 experts");
  score_route_op(&k, 4, 8, 3, 1.5);
  k.tensors[1].dim[0] = 7;
  expect_error(&k, "score_route: input bias (t1) has shape [7]; dimension 0 (E) must be 8 as in input logits");
  score_route_op(&k, 4, 8, 3, NAN);
  expect_error(&k, "score_route: attr scale must be a finite f32 value");
  score_route_op(&k, 4, 8, 3, 0.0);
  expect_error(&k, "score_route: attr scale must be positive");

  hash_route_op(&k, 4, 8, 16, 3, 1.5);
  k.tensors[2].dtype = PLAN_F32;
  expect_error(&k, "hash_route: input table (t2) has dtype f32; expected i32");
  hash_route_op(&k, 4, 8, 16, 3, 1.5);
  k.tensors[4].dim[1] = 2;
  expect_error(&k, "hash_route: output w (t4) has shape [4,2]; dimension 1 (k) must be 3 as in input table");
  hash_route_op(&k, 4, 8, 16, 3, -1.0);
  expect_error(&k, "hash_route: attr scale must be positive");

  kt_init(&k, IR_OP_SWIGLU_FFN);
  k.op.fattr[0] = -1.0;
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)4, (int64_t)8);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)16, (int64_t)8);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)16, (int64_t)8);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)8, (int64_t)16);
  kt_add(&k, 1, PLAN_F32, 2, (int64_t)4, (int64_t)8);
  expect_error(&k, "swiglu_ffn: attr swiglu_limit must be 0 (no clamp) or positive");
  k.op.fattr[0] = INFINITY;
  expect_error(&k, "swiglu_ffn: attr swiglu_limit must be a finite f32 value");
}
END_TEST

/* ---- DeepSeek-V4 compressor and Lightning Indexer: float64 MATH.md §8,
 * §9 and §12, written from the spec ----
 * A sequence of S tokens runs through compress_store and compress_pool
 * (and, with an indexer, index_scores and index_select over the entries as
 * index keys) under several step schedules on one state: whole prefill
 * chunks, chunks that end inside windows, one token through the T-slot
 * kernels, and decode steps through kernels built for one slot. Entries
 * are checked against float64 after every step, and entries, scores and
 * selections must be the same bits whatever the schedule. */

typedef struct comp_case {
  int m, overlap, W, r; /* ratio, CSA (1) or HCA (0), entry width, rope_dim */
  double theta;
  const double *yarn; /* NULL: no YaRN */
  int T, S;           /* token slots of the prefill kernels; sequence length */
  int heads, topk;    /* the indexer over the entries (width W = dI); heads 0: none */
} comp_case;

static int comp_cols(const comp_case *cc)
{
  return (1 + cc->overlap) * cc->W;
}

/* The rings: a step's tokens and the window before them (docs/OPS.md). */
static int comp_ring(const comp_case *cc)
{
  return cc->T + (1 + cc->overlap) * cc->m - 1;
}

/* Entry rows: two more than the windows of the sequence, which must stay
 * untouched. */
static int comp_nent(const comp_case *cc)
{
  return cc->S / cc->m + 2;
}

static void cstore_op(kt *k, int T, int R, int C)
{
  kt_init(k, IR_OP_COMPRESS_STORE);
  kt_add(k, 0, PLAN_F32, 2, (int64_t)T, (int64_t)C);
  kt_add(k, 0, PLAN_F32, 2, (int64_t)T, (int64_t)C);
  kt_add(k, 1, PLAN_F32, 2, (int64_t)R, (int64_t)C);
  kt_add(k, 1, PLAN_F32, 2, (int64_t)R, (int64_t)C);
}

static void cpool_op(kt *k, const comp_case *cc)
{
  int C = comp_cols(cc);
  kt_init(k, IR_OP_COMPRESS_POOL);
  k->op.iattr[0] = cc->m;
  k->op.iattr[1] = cc->r;
  k->op.fattr[2] = cc->theta;
  k->op.iattr[3] = cc->overlap;
  for (int a = 0; cc->yarn && a < 4; a++)
    k->op.fattr[4 + a] = cc->yarn[a];
  k->op.fattr[8] = 1e-6;
  kt_add(k, 0, PLAN_F32, 2, (int64_t)comp_ring(cc), (int64_t)C);
  kt_add(k, 0, PLAN_F32, 2, (int64_t)comp_ring(cc), (int64_t)C);
  kt_add(k, 0, PLAN_F32, 2, (int64_t)cc->m, (int64_t)C);
  kt_add(k, 0, PLAN_F32, 1, (int64_t)cc->W);
  kt_add(k, 1, PLAN_F32, 2, (int64_t)comp_nent(cc), (int64_t)cc->W);
}

static void iscores_op(kt *k, int T, int heads, int d, int nent, int m)
{
  kt_init(k, IR_OP_INDEX_SCORES);
  k->op.iattr[0] = heads;
  k->op.iattr[1] = m;
  kt_add(k, 0, PLAN_F32, 2, (int64_t)T, (int64_t)(heads * d));
  kt_add(k, 0, PLAN_F32, 2, (int64_t)T, (int64_t)heads);
  kt_add(k, 0, PLAN_F32, 2, (int64_t)nent, (int64_t)d);
  kt_add(k, 1, PLAN_F32, 2, (int64_t)T, (int64_t)nent);
}

static void iselect_op(kt *k, int T, int nent, int topk, int m)
{
  kt_init(k, IR_OP_INDEX_SELECT);
  k->op.iattr[0] = topk;
  k->op.iattr[1] = m;
  kt_add(k, 0, PLAN_F32, 2, (int64_t)T, (int64_t)nent);
  kt_add(k, 1, PLAN_I32, 2, (int64_t)T, (int64_t)topk);
}

/* Entry w in float64 (MATH.md §8.2, §9.3) from the sequence's projections
 * c, z [S, C]: per channel a softmax over the window's slots, the previous
 * window's Ca half first (value 0, logit -inf for w = 0), then the norm
 * and the rotation at position m*w (angle f32(m*w) * omega_i). */
static void ref_entry(const comp_case *cc, const float *c, const float *z, const float *bias,
                      const float *norm, int w, double *out)
{
  int m = cc->m, W = cc->W, C = comp_cols(cc), nslot = (1 + cc->overlap) * m;
  double ss = 0.0;
  for (int ch = 0; ch < W; ch++) {
    double logit[256], value[256], mx = -INFINITY;
    for (int j = 0; j < nslot; j++) {
      int own = j >= cc->overlap * m, jj = own ? j - cc->overlap * m : j;
      int s = m * (own ? w : w - 1) + jj, col = (own ? cc->overlap * W : 0) + ch;
      if (s < 0) {
        logit[j] = -INFINITY;
        value[j] = 0.0;
      } else {
        logit[j] = (double)z[s * C + col] + bias[jj * C + col];
        value[j] = c[s * C + col];
      }
      mx = fmax(mx, logit[j]);
    }
    double sum = 0.0, acc = 0.0;
    for (int j = 0; j < nslot; j++)
      sum += exp(logit[j] - mx);
    for (int j = 0; j < nslot; j++)
      acc += exp(logit[j] - mx) / sum * value[j];
    out[ch] = acc;
    ss += acc * acc;
  }
  double den = sqrt(ss / W + (double)1e-6f);
  for (int ch = 0; ch < W; ch++)
    out[ch] = out[ch] * norm[ch] / den;
  for (int i = 0; i < cc->r / 2; i++) {
    double phi = (double)(float)(m * w) * ref_rope_freq(cc->theta, cc->r, i, cc->yarn);
    double x0 = out[W - cc->r + 2 * i], x1 = out[W - cc->r + 2 * i + 1];
    out[W - cc->r + 2 * i] = x0 * cos(phi) - x1 * sin(phi);
    out[W - cc->r + 2 * i + 1] = x0 * sin(phi) + x1 * cos(phi);
  }
}

/* The windows visible to the token at position p: the closed ones. */
static int ref_visible(int p, int m, int nent)
{
  int v = (p + 1) / m;
  return v < nent ? v : nent;
}

/* MATH.md §9.4 in float64, and the scale its f32 rounding is measured
 * against: the same sum over absolute values. */
static double ref_score(const float *q, const float *wt, const float *key, int heads, int d, double *scale)
{
  double acc = 0.0, mag = 0.0;
  for (int h = 0; h < heads; h++) {
    double dot = 0.0, adot = 0.0;
    for (int c = 0; c < d; c++) {
      dot += (double)q[h * d + c] * key[c];
      adot += fabs((double)q[h * d + c] * key[c]);
    }
    acc += wt[h] / sqrt((double)heads) * fmax(dot, 0.0);
    mag += fabs(wt[h] / sqrt((double)heads)) * adot;
  }
  *scale = mag / sqrt((double)d);
  return acc / sqrt((double)d);
}

/* a ranks ahead of b (MATH.md §9.5 with docs/OPS.md's rule): the larger
 * score, NaN below everything, equal scores (-0 == +0) by the lower w. */
static int ref_ahead(float a, int wa, float b, int wb)
{
  if (isnan(a) || isnan(b))
    return isnan(b) && (!isnan(a) || wa < wb);
  return a > b || (a == b && wa < wb);
}

/* The selection from the f32 scores of a row, by repeated scans. */
static void ref_select(const float *scores, int vis, int topk, int32_t *out)
{
  char *taken = calloc((size_t)vis + 1, 1);
  ck_assert_ptr_nonnull(taken);
  for (int j = 0; j < topk; j++) {
    int best = -1;
    for (int w = 0; w < vis; w++)
      if (!taken[w] && (best < 0 || ref_ahead(scores[w], w, scores[best], best)))
        best = w;
    out[j] = best;
    if (best >= 0)
      taken[best] = 1;
  }
  free(taken);
}

/* ---- GPU kernels run on the host ----
 * A GPU kernel's source (kgen_gpu) compiled for the host by clang as C++
 * with DS4_EMU defined, its block's NTHREADS threads as fibers of the test's
 * own thread (emu_switch), ds4_barrier a barrier of the block's fibers and
 * ds4_lane_down and ds4_lane_read an exchange between the 32 fibers of a
 * warp, each step behind a barrier of the warp: the prelude's math,
 * reductions and dot products and the kernel's own code are the same IEEE
 * f32/f64 operations the GPU targets run (-ffp-contract=off), so this
 * gives the GPU kernel's bits, and its mapping of threads, lanes, shared
 * memory and barriers is exercised.
 *
 * Fibers rather than one OS thread per GPU thread: a block of 256 threads
 * as pthreads spent most of its time in the kernel's futex calls on a
 * 2-core machine, and the result did not depend on the interleaving. A
 * fiber runs until it reaches a barrier (or ends), then the next runnable
 * one runs, in ascending thread order or, with emu_run's descending,
 * descending: every thread runs as far ahead of the others as its
 * barriers let it, so a missing barrier shows as wrong bits rather than as
 * a rare race. When no fiber can run and some have not ended (a barrier
 * some threads of a block or warp never reach), the test fails naming the
 * threads, where a GPU would hang. */

#define EMU_MAXTHREADS 1024
#define EMU_WARP 32
#define EMU_STACK (1u << 20) /* a fiber's stack; a guard page below it */

typedef void (*gpu_kernel_fn)(void *const *bufs, const int32_t *step);

/* What the prelude expects from an emulator, declared before it. */
static const char g_emu_head[] =
    "#define DS4_EMU 1\n"
    "struct ds4_emu_hooks {\n"
    "  unsigned (*block)(void);\n"
    "  unsigned (*grid)(void);\n"
    "  int (*thread)(void);\n"
    "  void (*barrier)(void);\n"
    "  float (*lane_down)(float, int);\n"
    "  float (*lane_read)(float, int);\n"
    "};\n"
    "extern \"C\" { struct ds4_emu_hooks ds4_emu; }\n"
    "#define DS4_KERNEL extern \"C\"\n"
    "#define DS4_SHARED static\n"
    "#define DS4_EMU_FN static inline __attribute__((unused))\n"
    "DS4_EMU_FN unsigned ds4_block(void) { return ds4_emu.block(); }\n"
    "DS4_EMU_FN unsigned ds4_grid(void) { return ds4_emu.grid(); }\n"
    "DS4_EMU_FN int ds4_thread(void) { return ds4_emu.thread(); }\n"
    "DS4_EMU_FN void ds4_barrier(void) { ds4_emu.barrier(); }\n"
    "DS4_EMU_FN void ds4_grid_wait(void) {}\n"
    "DS4_EMU_FN float ds4_lane_down(float v, int s) { return ds4_emu.lane_down(v, s); }\n"
    "DS4_EMU_FN float ds4_lane_read(float v, int l) { return ds4_emu.lane_read(v, l); }\n";

typedef struct emu_hooks {
  unsigned (*block)(void);
  unsigned (*grid)(void);
  int (*thread)(void);
  void (*barrier)(void);
  float (*lane_down)(float, int);
  float (*lane_read)(float, int);
} emu_hooks;

/* A barrier: how many have arrived, and its generation, which moves on
 * when the last one arrives and so releases the others. */
typedef struct emu_barrier {
  int arrived, size;
  unsigned gen;
} emu_barrier;

/* A suspended fiber or the scheduler. On x86-64 a stack pointer, the
 * callee-saved registers and the floating-point control words pushed
 * below it (emu_switch); elsewhere a ucontext, whose swapcontext also
 * saves the signal mask, a system call a switch. */
#if defined(__x86_64__)
typedef struct emu_ctx {
  void *sp;
} emu_ctx;

/* emu_switch(from, to): pushes the callee-saved registers, MXCSR and the
 * x87 control word, stores the stack pointer in from->sp, takes to->sp
 * and pops to's. */
void ds4_test_emu_switch(emu_ctx *from, emu_ctx *to);
__asm__(".text\n"
        ".p2align 4\n"
        ".type ds4_test_emu_switch, @function\n"
        "ds4_test_emu_switch:\n"
        "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
        "  subq $8, %rsp\n  stmxcsr (%rsp)\n  fnstcw 4(%rsp)\n"
        "  movq %rsp, (%rdi)\n"
        "  movq (%rsi), %rsp\n"
        "  ldmxcsr (%rsp)\n  fldcw 4(%rsp)\n  addq $8, %rsp\n"
        "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
        "  ret\n"
        ".size ds4_test_emu_switch, .-ds4_test_emu_switch\n");

static void emu_switch(emu_ctx *from, emu_ctx *to)
{
  ds4_test_emu_switch(from, to);
}

/* A context that starts entry on the stack [base, base + size): the frame
 * emu_switch pops (this thread's control words, zeroed registers), entry
 * as its return address, and at the 16-byte-aligned top a null return
 * address for entry (which never returns), so that entry starts with the
 * stack as a call leaves it. */
static void emu_ctx_make(emu_ctx *c, char *base, size_t size, void (*entry)(void))
{
  uint64_t *top = (uint64_t *)(((uintptr_t)base + size) & ~(uintptr_t)15);
  uint64_t *sp = top - 9; /* control words, six registers, entry, null */
  uint32_t mxcsr;
  uint16_t fpcw;
  __asm__ volatile("stmxcsr %0\n\tfnstcw %1" : "=m"(mxcsr), "=m"(fpcw));
  memset(sp, 0, 9 * sizeof *sp);
  sp[0] = (uint64_t)mxcsr | (uint64_t)fpcw << 32;
  sp[7] = (uint64_t)(uintptr_t)entry;
  c->sp = sp;
}
#else
typedef struct emu_ctx {
  ucontext_t uc;
} emu_ctx;

static void emu_switch(emu_ctx *from, emu_ctx *to)
{
  ck_assert_int_eq(swapcontext(&from->uc, &to->uc), 0);
}

static void emu_ctx_make(emu_ctx *c, char *base, size_t size, void (*entry)(void))
{
  ck_assert_int_eq(getcontext(&c->uc), 0);
  c->uc.uc_stack.ss_sp = base;
  c->uc.uc_stack.ss_size = size;
  c->uc.uc_link = NULL;
  makecontext(&c->uc, entry, 0);
}
#endif

/* One GPU thread: a fiber that runs the kernel for each block it is given. */
typedef struct emu_fiber {
  emu_ctx ctx;
  const emu_barrier *waits; /* the barrier it waits at; NULL: runnable */
  unsigned gen;             /* that barrier's generation when it arrived */
  int done, parity;
} emu_fiber;

/* The fibers of one block, kept between blocks and launches (test state
 * only; one pool per test process). */
typedef struct emu_pool {
  int nthreads, current; /* nthreads 0: no fibers */
  char *stacks;          /* nthreads x (guard page + EMU_STACK) */
  emu_ctx sched;
  const void *sched_stack; /* the scheduler's stack, for AddressSanitizer */
  size_t sched_stack_size;
  emu_fiber fiber[EMU_MAXTHREADS];
  emu_barrier block_barrier, warp_barrier[EMU_MAXTHREADS / EMU_WARP];
  float lane_value[2][EMU_MAXTHREADS]; /* ds4_lane_down's exchange, by parity */
  gpu_kernel_fn fn;
  void *const *bufs;
  const int32_t *step;
  uint32_t block, grid;
} emu_pool;

static emu_pool g_emu;

#define EMU_GUARD 4096
#define EMU_SPAN (EMU_GUARD + EMU_STACK)

/* AddressSanitizer is told of every switch between stacks, or it takes a
 * fiber's frames for overflows of the test's own stack; and new stacks are
 * cleared of the poison that frames of fibers left mid-kernel, at the same
 * addresses before, leave in its shadow memory. */
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
static void emu_asan_clear(void *base, size_t size)
{
  ASAN_UNPOISON_MEMORY_REGION(base, size);
}
static void emu_asan_leave(void **save, const void *bottom, size_t size)
{
  __sanitizer_start_switch_fiber(save, bottom, size);
}
static void emu_asan_arrive(void *save, const void **old_bottom, size_t *old_size)
{
  __sanitizer_finish_switch_fiber(save, old_bottom, old_size);
}
#else
static void emu_asan_clear(void *base, size_t size)
{
  (void)base, (void)size;
}
static void emu_asan_leave(void **save, const void *bottom, size_t size)
{
  (void)save, (void)bottom, (void)size;
}
static void emu_asan_arrive(void *save, const void **old_bottom, size_t *old_size)
{
  (void)save, (void)old_bottom, (void)old_size;
}
#endif

static char *emu_stack(int i)
{
  return g_emu.stacks + (size_t)i * EMU_SPAN + EMU_GUARD;
}

/* The fiber's side of a switch back to the scheduler. */
static void emu_yield(void)
{
  void *fake = NULL;
  emu_asan_leave(&fake, g_emu.sched_stack, g_emu.sched_stack_size);
  emu_switch(&g_emu.fiber[g_emu.current].ctx, &g_emu.sched);
  emu_asan_arrive(fake, NULL, NULL);
}

/* Arrives at b; returns once every member has arrived. The last one to
 * arrive goes on without a switch. */
static void emu_barrier_wait(emu_barrier *b)
{
  if (++b->arrived == b->size) {
    b->arrived = 0;
    b->gen++;
    return;
  }
  emu_fiber *f = &g_emu.fiber[g_emu.current];
  f->waits = b;
  f->gen = b->gen;
  emu_yield();
}

static unsigned emu_hook_block(void)
{
  return g_emu.block;
}

static unsigned emu_hook_grid(void)
{
  return g_emu.grid;
}

static int emu_hook_thread(void)
{
  return g_emu.current;
}

static void emu_hook_barrier(void)
{
  emu_barrier_wait(&g_emu.block_barrier);
}

/* Every lane of the warp publishes v and waits for the others; returns
 * the warp's published values. Calls alternate between two arrays: a lane
 * can write the other one while the warp still reads this one, and cannot
 * come back to this one before every lane has passed the next call's
 * wait, having read. */
static const float *emu_lane_exchange(float v)
{
  int tid = g_emu.current, warp = tid / EMU_WARP;
  emu_fiber *f = &g_emu.fiber[tid];
  float *values = g_emu.lane_value[f->parity];
  f->parity ^= 1;
  values[tid] = v;
  emu_barrier_wait(&g_emu.warp_barrier[warp]);
  return values + warp * EMU_WARP;
}

/* ds4_lane_down: lane + s's v (its own past the warp's end: unspecified
 * on a GPU). */
static float emu_hook_lane_down(float v, int s)
{
  int lane = g_emu.current % EMU_WARP;
  const float *warp = emu_lane_exchange(v);
  return lane + s < EMU_WARP ? warp[lane + s] : v;
}

/* ds4_lane_read: lane l's v. */
static float emu_hook_lane_read(float v, int l)
{
  return emu_lane_exchange(v)[l];
}

/* A fiber's body: the kernel for the block in g_emu.block, then back to
 * the scheduler, which gives it the next block. */
static void emu_fiber_main(void)
{
  emu_asan_arrive(NULL, &g_emu.sched_stack, &g_emu.sched_stack_size);
  for (;;) {
    g_emu.fn(g_emu.bufs, g_emu.step);
    g_emu.fiber[g_emu.current].done = 1;
    emu_yield();
  }
}

static void emu_stop(void)
{
  if (g_emu.nthreads)
    munmap(g_emu.stacks, (size_t)g_emu.nthreads * EMU_SPAN);
  memset(&g_emu, 0, sizeof g_emu);
}

/* nthreads fibers, each on a stack above a page no access may touch. */
static void emu_start(int nthreads)
{
  if (g_emu.nthreads == nthreads)
    return;
  emu_stop();
  ck_assert_int_le(nthreads, EMU_MAXTHREADS);
  ck_assert_int_eq(nthreads % EMU_WARP, 0);
  g_emu.stacks = mmap(NULL, (size_t)nthreads * EMU_SPAN, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  ck_assert_msg(g_emu.stacks != MAP_FAILED, "mmap: %s", strerror(errno));
  emu_asan_clear(g_emu.stacks, (size_t)nthreads * EMU_SPAN);
  for (int i = 0; i < nthreads; i++) {
    ck_assert_int_eq(mprotect(emu_stack(i) - EMU_GUARD, EMU_GUARD, PROT_NONE), 0);
    emu_ctx_make(&g_emu.fiber[i].ctx, emu_stack(i), EMU_STACK, emu_fiber_main);
  }
  g_emu.nthreads = nthreads;
}

/* Runs fiber i until it reaches a barrier or ends its block. */
static void emu_resume(int i)
{
  g_emu.current = i;
  g_emu.fiber[i].waits = NULL;
  void *fake = NULL;
  emu_asan_leave(&fake, emu_stack(i), EMU_STACK);
  emu_switch(&g_emu.sched, &g_emu.fiber[i].ctx);
  emu_asan_arrive(fake, NULL, NULL);
}

/* One block: every fiber from the kernel's start until all have ended,
 * in ascending or descending thread order. Threads that would wait
 * forever fail the test. */
static void emu_block(int descending)
{
  int n = g_emu.nthreads;
  g_emu.block_barrier = (emu_barrier){0, n, 0};
  for (int w = 0; w < n / EMU_WARP; w++)
    g_emu.warp_barrier[w] = (emu_barrier){0, EMU_WARP, 0};
  for (int i = 0; i < n; i++)
    g_emu.fiber[i].done = 0, g_emu.fiber[i].waits = NULL;
  for (int left = n; left;) {
    int ran = 0;
    for (int k = 0; k < n; k++) {
      int i = descending ? n - 1 - k : k;
      emu_fiber *f = &g_emu.fiber[i];
      if (f->done || (f->waits && f->waits->gen == f->gen))
        continue;
      emu_resume(i);
      ran = 1;
      left -= f->done;
    }
    if (!ran) {
      int first = 0;
      while (g_emu.fiber[first].done)
        first++;
      const emu_barrier *b = g_emu.fiber[first].waits;
      char why[200];
      snprintf(why, sizeof why, "block %u of %u: thread %d of %d waits at a %s barrier that %d threads never reach",
               g_emu.block, g_emu.grid, first, n, b == &g_emu.block_barrier ? "block" : "warp", b->size - b->arrived);
      emu_stop(); /* the fibers are mid-kernel: none may run again */
      ck_abort_msg("%s", why);
    }
  }
}

typedef struct emu_built {
  kgen_kernel kk;
  void *dl;
  gpu_kernel_fn fn;
} emu_built;

static emu_built *emu_build(const kt *k)
{
  emu_built *e = calloc(1, sizeof *e);
  ck_assert_ptr_nonnull(e);
  dsl_diag d = {0};
  ck_assert_msg(kgen_gpu(&k->prog, &k->op, &e->kk, &d) == 0, "kgen_gpu: %s", d.msg);
  char src[512], so[512], cmd[1400];
  snprintf(src, sizeof src, "%s/%s.emu.cpp", g_dir, e->kk.symbol);
  snprintf(so, sizeof so, "%s/%s.emu.so", g_dir, e->kk.symbol);
  FILE *f = fopen(src, "w");
  ck_assert_ptr_nonnull(f);
  fprintf(f, "%s%s\n%s", g_emu_head, kgen_gpu_prelude(), e->kk.source);
  ck_assert_int_eq(fclose(f), 0);
  const char *clang = getenv("DS4_CLANG");
  snprintf(cmd, sizeof cmd, "%s -x c++ -std=c++17 -O2 -ffp-contract=off -fPIC -shared -Wall -Werror -o %s %s",
           clang && *clang ? clang : "clang-19", so, src);
  ck_assert_msg(system(cmd) == 0, "%s failed", cmd);
  e->dl = dlopen(so, RTLD_NOW | RTLD_LOCAL);
  ck_assert_msg(e->dl != NULL, "dlopen: %s", dlerror());
  *(void **)&e->fn = dlsym(e->dl, e->kk.symbol);
  emu_hooks *hooks = dlsym(e->dl, "ds4_emu");
  ck_assert(e->fn && hooks);
  *hooks = (emu_hooks){emu_hook_block, emu_hook_grid, emu_hook_thread, emu_hook_barrier, emu_hook_lane_down,
                     emu_hook_lane_read};
  return e;
}

static void emu_free(emu_built *e)
{
  dlclose(e->dl);
  kgen_kernel_free(&e->kk);
  free(e);
}

/* Every block of the grid, one after another, ascending or descending
 * (and each block's threads in the same order), for a step that asks for
 * its outputs from slot `asked` on (step[3]). */
static void emu_run_asked(const emu_built *e, void *const *bufs, int pos, int ntok, int asked, int descending)
{
  int32_t step[4] = {pos, ntok, 7, asked};
  emu_start((int)e->kk.block);
  g_emu.fn = e->fn;
  g_emu.bufs = bufs;
  g_emu.step = step;
  g_emu.grid = e->kk.grid;
  for (uint32_t i = 0; i < e->kk.grid; i++) {
    g_emu.block = descending ? e->kk.grid - 1 - i : i;
    emu_block(descending);
  }
}

static void emu_run(const emu_built *e, void *const *bufs, int pos, int ntok, int descending)
{
  emu_run_asked(e, bufs, pos, ntok, 0, descending);
}

/* A kernel of the compressor chain: its op, and the host kernel or the GPU
 * kernel run on the host. */
typedef struct chain_kernel {
  kt op;
  built host;
  emu_built *gpu;
} chain_kernel;

static void chain_build(chain_kernel *k, int gpu)
{
  if (gpu)
    k->gpu = emu_build(&k->op);
  else
    build(&k->op, &k->host);
}

/* k, a copy of op (its program pointing at the copy's own tensors), built
 * as the host kernel or the GPU kernel on the host. */
static void chain_start(chain_kernel *k, const kt *op, int gpu)
{
  *k = (chain_kernel){.op = *op};
  k->op.prog.tensors = k->op.tensors;
  chain_build(k, gpu);
}

static void chain_unbuild(chain_kernel *k)
{
  if (k->gpu)
    emu_free(k->gpu);
  else
    unbuild(&k->host);
}

static void chain_launch(const chain_kernel *k, bufs *bs, int pos, int ntok, int descending)
{
  if (k->gpu)
    emu_run(k->gpu, bs->b, pos, ntok, descending);
  else
    run(&k->host, bs, pos, ntok, descending);
}

/* run_checked for either kind: both block orders from the same state give
 * the same output bytes. */
static void chain_run(const chain_kernel *k, bufs *bs, int pos, int ntok)
{
  int nin = k->op.op.nin, nout = k->op.op.nout;
  void *saved[IR_MAXIO], *first[IR_MAXIO];
  for (int o = 0; o < nout; o++) {
    size_t n = (size_t)k->op.tensors[nin + o].bytes;
    saved[o] = malloc(n);
    first[o] = malloc(n);
    ck_assert(saved[o] && first[o]);
    memcpy(saved[o], bs->b[nin + o], n);
  }
  chain_launch(k, bs, pos, ntok, 0);
  for (int o = 0; o < nout; o++) {
    size_t n = (size_t)k->op.tensors[nin + o].bytes;
    memcpy(first[o], bs->b[nin + o], n);
    memcpy(bs->b[nin + o], saved[o], n);
  }
  chain_launch(k, bs, pos, ntok, 1);
  for (int o = 0; o < nout; o++) {
    ck_assert_msg(memcmp(first[o], bs->b[nin + o], (size_t)k->op.tensors[nin + o].bytes) == 0,
                  "%s: output %d differs between block orders", k->gpu ? k->gpu->kk.symbol : k->host.kk.symbol, o);
    free(saved[o]);
    free(first[o]);
  }
}

/* The chain's kernels for T slots (prefill) and for 1 (decode), its state
 * and step inputs, the sequence, and what every schedule must agree on. */
typedef struct comp_chain {
  const comp_case *cc;
  chain_kernel store[2], pool, scores[2], select[2]; /* [0]: T slots, [1]: one */
  float *c_seq, *z_seq, *q_seq, *w_seq, *bias, *norm;
  float *c_in, *z_in, *c_state, *z_state, *entries, *q_in, *w_in, *scores_out;
  int32_t *sel_out;
  double *ref;          /* float64 entries of every closed window */
  float *first_entries; /* the first schedule's; later ones must match */
  float *first_scores;  /* [S, nent]: visible scores of each position */
  int32_t *first_sel;   /* [S, topk] */
} comp_chain;

static void *xcalloc(size_t n, size_t size)
{
  void *p = calloc(n, size);
  ck_assert_ptr_nonnull(p);
  return p;
}

static void chain_prepare(comp_chain *x, const comp_case *cc)
{
  memset(x, 0, sizeof *x);
  x->cc = cc;
  int C = comp_cols(cc), nent = comp_nent(cc), S = cc->S, hd = cc->heads * cc->W;
  for (int one = 0; one < 2; one++)
    cstore_op(&x->store[one].op, one ? 1 : cc->T, comp_ring(cc), C);
  cpool_op(&x->pool.op, cc);
  for (int one = 0; cc->heads && one < 2; one++) {
    iscores_op(&x->scores[one].op, one ? 1 : cc->T, cc->heads, cc->W, nent, cc->m);
    iselect_op(&x->select[one].op, one ? 1 : cc->T, nent, cc->topk, cc->m);
  }
  x->c_seq = xcalloc((size_t)S * C, sizeof(float));
  x->z_seq = xcalloc((size_t)S * C, sizeof(float));
  x->bias = xcalloc((size_t)cc->m * C, sizeof(float));
  x->norm = xcalloc((size_t)cc->W, sizeof(float));
  fill_f32(x->c_seq, (int64_t)S * C, 1.0);
  fill_f32(x->z_seq, (int64_t)S * C, 2.0);
  fill_f32(x->bias, (int64_t)cc->m * C, 1.0);
  fill_f32(x->norm, cc->W, 1.0);
  x->c_in = xcalloc((size_t)cc->T * C, sizeof(float));
  x->z_in = xcalloc((size_t)cc->T * C, sizeof(float));
  x->c_state = xcalloc((size_t)comp_ring(cc) * C, sizeof(float));
  x->z_state = xcalloc((size_t)comp_ring(cc) * C, sizeof(float));
  x->entries = xcalloc((size_t)nent * cc->W, sizeof(float));
  x->ref = xcalloc((size_t)nent * cc->W, sizeof(double));
  for (int w = 0; w < S / cc->m; w++)
    ref_entry(cc, x->c_seq, x->z_seq, x->bias, x->norm, w, x->ref + (size_t)w * cc->W);
  x->first_entries = xcalloc((size_t)nent * cc->W, sizeof(float));
  if (!cc->heads)
    return;
  x->q_seq = xcalloc((size_t)S * hd, sizeof(float));
  x->w_seq = xcalloc((size_t)S * cc->heads, sizeof(float));
  fill_f32(x->q_seq, (int64_t)S * hd, 1.0);
  fill_f32(x->w_seq, (int64_t)S * cc->heads, 1.0);
  /* Every fifth query weighs every head 0: all its scores are exactly 0,
   * a tie the lower windows win. */
  for (int p = 2; p < S; p += 5)
    for (int h = 0; h < cc->heads; h++)
      x->w_seq[p * cc->heads + h] = 0.0f;
  x->q_in = xcalloc((size_t)cc->T * hd, sizeof(float));
  x->w_in = xcalloc((size_t)cc->T * cc->heads, sizeof(float));
  x->scores_out = xcalloc((size_t)cc->T * nent, sizeof(float));
  x->sel_out = xcalloc((size_t)cc->T * cc->topk, sizeof(int32_t));
  x->first_scores = xcalloc((size_t)S * nent, sizeof(float));
  x->first_sel = xcalloc((size_t)S * cc->topk, sizeof(int32_t));
}

static void chain_free(comp_chain *x)
{
  void *ptrs[] = {x->c_seq, x->z_seq, x->q_seq, x->w_seq, x->bias, x->norm, x->c_in, x->z_in,
                  x->c_state, x->z_state, x->entries, x->q_in, x->w_in, x->scores_out, x->sel_out,
                  x->ref, x->first_entries, x->first_scores, x->first_sel};
  for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++)
    free(ptrs[i]);
}

/* Rows [0, ntok) of a step input from the sequence at pos; the other rows
 * are garbage that the kernels must not read. */
static void step_input(float *in, const float *seq, int pos, int ntok, int slots, int cols)
{
  memcpy(in, seq + (size_t)pos * cols, (size_t)ntok * cols * sizeof(float));
  fill_garbage(in + (size_t)ntok * cols, (int64_t)(slots - ntok) * cols);
}

static void bufs_of(bufs *bs, int n, ...)
{
  va_list ap;
  va_start(ap, n);
  bs->n = n;
  for (int i = 0; i < n; i++)
    bs->b[i] = va_arg(ap, void *);
  va_end(ap);
}

/* Entries after the step ending at position end - 1: the closed windows
 * within tolerance of float64, every other row the untouched garbage. */
static void chain_check_entries(comp_chain *x, int end)
{
  const comp_case *cc = x->cc;
  int closed = end / cc->m, nent = comp_nent(cc), W = cc->W;
  /* The rotation's f32 angle adds about position * 2^-23 (rope's test). */
  double tol = REL_TOL + (double)cc->m * nent * ldexp(1.0, -22);
  for (int w = 0; w < nent; w++) {
    const float *e = x->entries + (size_t)w * W;
    if (w >= closed) {
      uint32_t bits;
      for (int ch = 0; ch < W; ch++) {
        memcpy(&bits, &e[ch], sizeof bits);
        ck_assert_msg(bits == 0x7fc0beefu, "entry %d (open window) written at step end %d", w, end);
      }
      continue;
    }
    const double *r = x->ref + (size_t)w * W;
    double scale = 0.0;
    for (int ch = 0; ch < W; ch++)
      scale = fmax(scale, fabs(r[ch]));
    for (int ch = 0; ch < W; ch++) {
      double err = fabs((double)e[ch] - r[ch]) / scale; /* NaN fails the check */
      ck_assert_msg(err <= tol, "m %d W %d: entry %d channel %d: %.9g, float64 %.9g (tol %g)", cc->m, W, w, ch,
                    (double)e[ch], r[ch], tol);
    }
  }
}

/* Scores and selections of the step's live rows (dead rows: 0 and -1),
 * kept for the comparison between schedules. */
static void chain_check_index(comp_chain *x, int pos, int ntok, int slots, int first_schedule)
{
  const comp_case *cc = x->cc;
  int nent = comp_nent(cc), K = cc->topk;
  for (int t = 0; t < slots; t++) {
    const float *sr = x->scores_out + (size_t)t * nent;
    const int32_t *sel = x->sel_out + (size_t)t * K;
    if (t >= ntok) {
      for (int w = 0; w < nent; w++)
        ck_assert_msg(sr[w] == 0.0f && !signbit(sr[w]), "dead score row %d not zero", t);
      for (int j = 0; j < K; j++)
        ck_assert_int_eq(sel[j], -1);
      continue;
    }
    int p = pos + t, vis = ref_visible(p, cc->m, nent);
    for (int w = 0; w < nent; w++) {
      if (w >= vis) {
        ck_assert_msg(isinf(sr[w]) && sr[w] < 0, "position %d window %d not visible: score %g", p, w,
                      (double)sr[w]);
        continue;
      }
      double scale, ref = ref_score(x->q_seq + (size_t)p * cc->heads * cc->W, x->w_seq + (size_t)p * cc->heads,
                                    x->entries + (size_t)w * cc->W, cc->heads, cc->W, &scale);
      ck_assert_msg(fabs(sr[w] - ref) <= REL_TOL * scale, "position %d window %d: score %.9g, float64 %.9g", p,
                    w, (double)sr[w], ref);
    }
    int32_t want[64];
    ck_assert_int_le(K, 64);
    ref_select(sr, vis, K, want);
    for (int j = 0; j < K; j++)
      ck_assert_msg(sel[j] == want[j], "position %d: sel[%d] = %d, expected %d", p, j, sel[j], want[j]);
    if (p % 5 == 2) /* all scores 0: the lowest windows, in order */
      for (int j = 0; j < K; j++)
        ck_assert_int_eq(sel[j], j < vis ? j : -1);
    float *fs = x->first_scores + (size_t)p * nent;
    int32_t *fsel = x->first_sel + (size_t)p * K;
    if (first_schedule) {
      memcpy(fs, sr, (size_t)vis * sizeof(float));
      memcpy(fsel, sel, (size_t)K * sizeof(int32_t));
    } else {
      ck_assert_msg(memcmp(fs, sr, (size_t)vis * sizeof(float)) == 0, "position %d: scores differ between schedules",
                    p);
      ck_assert_msg(memcmp(fsel, sel, (size_t)K * sizeof(int32_t)) == 0,
                    "position %d: selection differs between schedules", p);
    }
  }
}

/* One schedule from a fresh state: steps[i] tokens each, through the
 * one-slot kernels where steps[i] is -1. */
static void chain_schedule(comp_chain *x, const int *steps, int nsteps, int first_schedule)
{
  const comp_case *cc = x->cc;
  int C = comp_cols(cc), nent = comp_nent(cc), R = comp_ring(cc), hd = cc->heads * cc->W;
  fill_garbage(x->c_state, (int64_t)R * C);
  fill_garbage(x->z_state, (int64_t)R * C);
  fill_garbage(x->entries, (int64_t)nent * cc->W);
  int pos = 0;
  for (int i = 0; i < nsteps; i++) {
    int one = steps[i] < 0, ntok = one ? 1 : steps[i], slots = one ? 1 : cc->T;
    ck_assert_int_le(pos + ntok, cc->S);
    bufs bs;
    step_input(x->c_in, x->c_seq, pos, ntok, slots, C);
    step_input(x->z_in, x->z_seq, pos, ntok, slots, C);
    bufs_of(&bs, 4, x->c_in, x->z_in, x->c_state, x->z_state);
    chain_run(&x->store[one], &bs, pos, ntok);
    bufs_of(&bs, 5, x->c_state, x->z_state, x->bias, x->norm, x->entries);
    chain_run(&x->pool, &bs, pos, ntok);
    chain_check_entries(x, pos + ntok);
    if (cc->heads) {
      step_input(x->q_in, x->q_seq, pos, ntok, slots, hd);
      step_input(x->w_in, x->w_seq, pos, ntok, slots, cc->heads);
      fill_garbage(x->scores_out, (int64_t)slots * nent);
      fill_garbage(x->sel_out, (int64_t)slots * cc->topk);
      bufs_of(&bs, 4, x->q_in, x->w_in, x->entries, x->scores_out);
      chain_run(&x->scores[one], &bs, pos, ntok);
      bufs_of(&bs, 2, x->scores_out, x->sel_out);
      chain_run(&x->select[one], &bs, pos, ntok);
      chain_check_index(x, pos, ntok, slots, first_schedule);
    }
    pos += ntok;
  }
  ck_assert_int_eq(pos, cc->S);
  size_t n = (size_t)(cc->S / cc->m) * cc->W * sizeof(float);
  if (first_schedule)
    memcpy(x->first_entries, x->entries, n);
  else
    ck_assert_msg(memcmp(x->first_entries, x->entries, n) == 0, "m %d W %d: entries differ between schedules",
                  cc->m, cc->W);
}

/* The schedules: whole chunks of T; a chunk that ends inside a window,
 * then one-slot decode steps; uneven chunks mixed with one-token steps
 * through the T-slot kernels and one-slot steps; every token alone
 * through the T-slot kernels (T - 1 dead rows each step). */
static int comp_schedule(const comp_case *cc, int kind, int *steps)
{
  static const int uneven[] = {5, 1, 3, -1, 16, 2, -1, 7, 64, 9, 1, 11};
  int n = 0, left = cc->S;
  while (left > 0) {
    int want;
    switch (kind) {
    case 0: want = cc->T; break;
    case 1: want = n > 0 ? -1 : cc->T > 3 ? cc->T - 3 : 1; break;
    case 2: want = uneven[n % (int)(sizeof uneven / sizeof uneven[0])]; break;
    default: want = 1; break;
    }
    if (want > cc->T)
      want = cc->T;
    if (want > left)
      want = left;
    steps[n++] = want;
    left -= want < 0 ? 1 : want;
  }
  return n;
}

/* The first nkinds schedules of comp_schedule, on the host kernels or the
 * GPU kernels run on the host. */
static void comp_case_run(const comp_case *cc, int gpu, int nkinds)
{
  comp_chain x;
  chain_prepare(&x, cc);
  /* One pool kernel: it does not depend on the token slots. */
  chain_kernel *all[] = {&x.store[0], &x.store[1], &x.pool, &x.scores[0], &x.scores[1], &x.select[0], &x.select[1]};
  int nk = cc->heads ? 7 : 3;
  for (int i = 0; i < nk; i++)
    chain_build(all[i], gpu);
  int *steps = xcalloc((size_t)cc->S, sizeof(int));
  for (int kind = 0; kind < nkinds; kind++) {
    int n = comp_schedule(cc, kind, steps);
    chain_schedule(&x, steps, n, kind == 0);
  }
  free(steps);
  for (int i = 0; i < nk; i++)
    chain_unbuild(all[i]);
  chain_free(&x);
}

/* compress_store alone: live slots land in row (pos+t) mod R, byte for
 * byte; dead slots and every other row are left alone, also where the
 * step wraps around the ring. */
START_TEST(test_compress_store)
{
  enum { T = 4, R = 7, C = 6 };
  kt k;
  cstore_op(&k, T, R, C);
  built b;
  build(&k, &b);
  ck_assert_uint_eq(b.kk.grid, T);
  bufs bs;
  bufs_alloc(&bs, &k);
  static const int steps[][2] = {{0, 4}, {0, 1}, {5, 4}, {13, 3}, {20, 2}, {-3, 4}};
  float before[2][R * C];
  for (size_t s = 0; s < sizeof steps / sizeof steps[0]; s++) {
    int pos = steps[s][0], ntok = steps[s][1];
    fill_f32(bs.b[0], T * C, 1.0);
    fill_f32(bs.b[1], T * C, 1.0);
    for (int i = 0; i < 2; i++) {
      fill_f32(bs.b[2 + i], R * C, 1.0);
      memcpy(before[i], bs.b[2 + i], sizeof before[i]);
    }
    run_checked(&b, &k, &bs, pos, ntok);
    for (int i = 0; i < 2; i++)
      for (int row = 0; row < R; row++) {
        int t = -1; /* the live slot that owns the row in this step */
        for (int u = 0; pos >= 0 && u < ntok; u++)
          if ((pos + u) % R == row)
            t = u;
        const float *got = (const float *)bs.b[2 + i] + row * C;
        const float *want = t >= 0 ? (const float *)bs.b[i] + t * C : before[i] + row * C;
        ck_assert_msg(memcmp(got, want, C * sizeof(float)) == 0, "compress_store pos %d ntok %d: ring %d row %d %s",
                      pos, ntok, i, row, t >= 0 ? "not written" : "touched");
      }
  }
  bufs_free(&bs);
  unbuild(&b);
}
END_TEST

/* The DS4 Flash compressors (HCA: 128 slots of width 512; CSA: 8 slots,
 * Ca and Cb halves of 512, each with YaRN rope on 64 channels), the
 * indexer's at width dI = 128 with its scores and top-k, an odd ratio whose
 * rings are not a multiple of it, and ratio 1 (a window per token). */
static const comp_case g_hca = {128, 0, 512, 64, 160000.0, g_ds4_yarn, 64, 300, 0, 0};
static const comp_case g_csa = {4, 1, 512, 64, 160000.0, g_ds4_yarn, 16, 45, 0, 0};
static const comp_case g_indexer = {4, 1, 128, 64, 160000.0, g_ds4_yarn, 16, 45, 8, 5};
static const comp_case g_odd = {3, 1, 24, 8, 10000.0, NULL, 5, 31, 3, 4};
static const comp_case g_single = {1, 0, 16, 4, 10000.0, NULL, 3, 10, 2, 3};

START_TEST(test_compress_chain)
{
  const comp_case *cases[] = {&g_hca, &g_csa, &g_indexer, &g_odd, &g_single};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    comp_case_run(cases[i], 0, 4);
}
END_TEST

/* compress_pool's rope table is rope's, bit for bit, YaRN included; and
 * its grid covers exactly the windows a step that fills the rings closes. */
START_TEST(test_compress_pool_table)
{
  kt pool, rope;
  float wp[40], wr[40];
  cpool_op(&pool, &g_csa);
  rope_op(&rope, 1, 512, 64, 160000.0, 0, g_ds4_yarn);
  ck_assert_int_eq(rope_table(&pool, wp, 40), 32);
  ck_assert_int_eq(rope_table(&rope, wr, 40), 32);
  ck_assert(memcmp(wp, wr, sizeof(float) * 32) == 0);
  cpool_op(&pool, &g_odd);
  rope_op(&rope, 1, 24, 8, 10000.0, 0, NULL);
  ck_assert_int_eq(rope_table(&pool, wp, 40), 4);
  ck_assert_int_eq(rope_table(&rope, wr, 40), 4);
  ck_assert(memcmp(wp, wr, sizeof(float) * 4) == 0);
  /* T = 16 slots close at most 4 windows of 4; 64 slots, one of 128. */
  kgen_kernel kk;
  dsl_diag d = {0};
  cpool_op(&pool, &g_csa);
  ck_assert_msg(kgen_host(&pool.prog, &pool.op, &kk, &d) == 0, "%s", d.msg);
  ck_assert_uint_eq(kk.grid, 4);
  kgen_kernel_free(&kk);
  cpool_op(&pool, &g_hca);
  ck_assert_msg(kgen_host(&pool.prog, &pool.op, &kk, &d) == 0, "%s", d.msg);
  ck_assert_uint_eq(kk.grid, 1);
  kgen_kernel_free(&kk);
}
END_TEST

/* index_scores alone, over several tiles of windows (256 / heads a tile):
 * float64 scores for the visible windows, -inf past them, zeros in dead
 * rows. */
static void iscores_case(int heads, int d, int nent, int m, const int (*steps)[2], int nsteps)
{
  enum { T = 3 };
  kt k;
  iscores_op(&k, T, heads, d, nent, m);
  built b;
  build(&k, &b);
  int tile = heads < 256 ? 256 / heads : 1;
  ck_assert_uint_eq(b.kk.grid, T * ((nent + tile - 1) / tile));
  bufs bs;
  bufs_alloc(&bs, &k);
  for (int s = 0; s < nsteps; s++) {
    int pos = steps[s][0], ntok = steps[s][1];
    fill_f32(bs.b[0], (int64_t)T * heads * d, 1.0);
    fill_f32(bs.b[1], (int64_t)T * heads, 1.0);
    fill_f32(bs.b[2], (int64_t)nent * d, 1.0);
    fill_garbage(bs.b[3], (int64_t)T * nent);
    run_checked(&b, &k, &bs, pos, ntok);
    const float *q = bs.b[0], *wt = bs.b[1], *keys = bs.b[2], *sc = bs.b[3];
    for (int t = 0; t < T; t++)
      for (int w = 0; w < nent; w++) {
        float got = sc[t * nent + w];
        if (t >= ntok) {
          ck_assert(got == 0.0f && !signbit(got));
          continue;
        }
        if (w >= ref_visible(pos + t, m, nent)) {
          ck_assert_msg(isinf(got) && got < 0, "pos %d slot %d window %d: %g, expected -inf", pos, t, w,
                        (double)got);
          continue;
        }
        double scale, ref = ref_score(q + t * heads * d, wt + t * heads, keys + w * d, heads, d, &scale);
        ck_assert_msg(fabs(got - ref) <= REL_TOL * scale, "pos %d slot %d window %d: %.9g, float64 %.9g", pos, t, w,
                      (double)got, ref);
      }
  }
  bufs_free(&bs);
  unbuild(&b);
}

START_TEST(test_index_scores)
{
  static const int steps[][2] = {{0, 3}, {5, 2}, {290, 3}, {596, 1}, {1000, 3}};
  iscores_case(4, 16, 300, 2, steps, 5); /* 64 windows a tile: five, the last partial */
  static const int small[][2] = {{0, 3}, {3, 3}, {41, 2}};
  iscores_case(64, 8, 11, 4, small, 3); /* DS4's 64 heads: 4 windows a tile, the last partial */
}
END_TEST

/* Score rows for index_select: `kind` 0 distinct, 1 four levels (many
 * exact ties), 2 the corners (+0 and -0, NaN, +-inf among ties). */
static void select_scores(float *s, int n, int kind)
{
  static const float levels[] = {-1.0f, 0.0f, 0.5f, 2.0f};
  for (int w = 0; w < n; w++) {
    int pick = (int)((rnd() + 1.0) * 2.0) & 3;
    if (kind == 0)
      s[w] = (float)rnd();
    else if (kind == 1)
      s[w] = levels[pick];
    else
      s[w] = (float[]){-0.0f, 0.0f, NAN, INFINITY, -INFINITY, 1.0f, 1.0f, -0.0f}[(pick * 2 + (w & 1)) & 7];
  }
}

/* index_select against the repeated-scan reference on the same f32 scores,
 * for every kind of row and step; `gpu` also runs the GPU kernel (on the
 * host) on the same scores, which must choose the same windows. */
static void iselect_case(int nent, int topk, int m, const int (*steps)[2], int nsteps, int gpu)
{
  enum { T = 4 };
  chain_kernel host = {0}, dev = {0};
  iselect_op(&host.op, T, nent, topk, m);
  iselect_op(&dev.op, T, nent, topk, m);
  chain_build(&host, 0);
  if (gpu)
    chain_build(&dev, 1);
  bufs bs;
  bufs_alloc(&bs, &host.op);
  int32_t *want = xcalloc((size_t)topk, sizeof *want), *host_sel = xcalloc((size_t)T * topk, sizeof *host_sel);
  for (int kind = 0; kind < 3; kind++)
    for (int s = 0; s < nsteps; s++) {
      int pos = steps[s][0], ntok = steps[s][1];
      float *sc = bs.b[0];
      for (int t = 0; t < T; t++)
        select_scores(sc + (size_t)t * nent, nent, kind);
      fill_garbage(bs.b[1], (int64_t)T * topk);
      chain_run(&host, &bs, pos, ntok);
      const int32_t *sel = bs.b[1];
      for (int t = 0; t < T; t++) {
        int vis = t < ntok ? ref_visible(pos + t, m, nent) : 0;
        ref_select(sc + (size_t)t * nent, vis, topk, want);
        for (int j = 0; j < topk; j++)
          ck_assert_msg(sel[t * topk + j] == want[j], "kind %d pos %d slot %d: sel[%d] = %d, expected %d", kind,
                        pos, t, j, sel[t * topk + j], want[j]);
      }
      if (!gpu)
        continue;
      memcpy(host_sel, sel, (size_t)T * topk * sizeof *sel);
      fill_garbage(bs.b[1], (int64_t)T * topk);
      chain_run(&dev, &bs, pos, ntok);
      ck_assert_msg(memcmp(host_sel, bs.b[1], (size_t)T * topk * sizeof *sel) == 0,
                    "kind %d pos %d: the GPU kernel chose other windows than the host's", kind, pos);
    }
  free(want);
  free(host_sel);
  bufs_free(&bs);
  chain_unbuild(&host);
  if (gpu)
    chain_unbuild(&dev);
}

START_TEST(test_index_select)
{
  /* vis 0..2 (nothing or fewer than k), then more than k; past nent. */
  static const int few[][2] = {{0, 4}, {0, 1}, {9, 3}, {30, 4}, {100, 4}};
  iselect_case(40, 7, 2, few, 5, 0);
  iselect_case(10, 16, 1, few, 5, 0); /* k larger than every window */
  iselect_case(5, 1, 3, few, 5, 0);   /* k = 1 */
  static const int many[][2] = {{1500, 4}, {1996, 4}};
  iselect_case(2000, 64, 1, many, 2, 0);
  iselect_case(2000, 700, 1, many, 2, 0);
}
END_TEST

/* The checks that the kernels' memory safety and the state's meaning rely
 * on; each message names the attr or operand. */
START_TEST(test_compress_errors)
{
  kt k;
  cstore_op(&k, 4, 3, 8);
  expect_error(&k, "compress_store: the rings' 3 rows are fewer than the 4 token slots");
  cpool_op(&k, &g_odd);
  k.op.iattr[3] = 2;
  expect_error(&k, "compress_pool: attr overlap must be 0 (HCA) or 1 (CSA)");
  cpool_op(&k, &g_odd);
  k.tensors[2].dim[0] = 4;
  expect_error(&k, "compress_pool: bias (t2) must be [3,48]");
  cpool_op(&k, &g_odd);
  k.tensors[3].dim[0] = k.tensors[4].dim[1] = 25;
  expect_error(&k, "compress_pool: bias (t2) must be [3,48] and the rings' 48 columns 2 x the width 25");
  cpool_op(&k, &g_odd);
  k.tensors[0].dim[0] = k.tensors[1].dim[0] = 5;
  expect_error(&k, "compress_pool: the rings' 5 rows must hold a window (6)");
  cpool_op(&k, &g_odd);
  k.op.iattr[1] = 7;
  expect_error(&k, "compress_pool: attr rope_dim = 7 must be even and at most the width 24");
  cpool_op(&k, &g_odd);
  k.op.iattr[0] = 0;
  expect_error(&k, "compress_pool: attr ratio = 0 must be at least 1");
  cpool_op(&k, &g_odd);
  k.op.fattr[6] = 32.0;
  expect_error(&k, "compress_pool: attr yarn_beta_fast needs yarn_factor");
  cpool_op(&k, &g_odd);
  k.op.fattr[8] = 0.0;
  expect_error(&k, "compress_pool: attr eps must be positive");
  iscores_op(&k, 4, 3, 8, 10, 4);
  k.op.iattr[0] = 4;
  expect_error(&k, "index_scores: attr heads = 4 must equal the 3 weights");
  iscores_op(&k, 4, 3, 8, 10, 4);
  k.tensors[2].dim[1] = 7;
  expect_error(&k, "q's 24 channels must be heads x 7 (keys' width)");
  iselect_op(&k, 4, 10, 3, 4);
  k.op.iattr[0] = 2;
  expect_error(&k, "index_select: attr topk = 2 must equal sel's last dimension 3");
  iselect_op(&k, 4, 10, 3, 0);
  expect_error(&k, "index_select: attr ratio = 0 must be at least 1");
}
END_TEST

/* ==== GPU kernels ==== */

/* Every op kind at small shapes (tiny-moe's, plus the corners: a partial
 * matmul tile, x staged in shared memory, rope without rotation, attention
 * heads wider than a block, a split expert op, an ffn in two chunks,
 * moe_experts as lowered for a GPU), as one program for
 * emit_kernels_build. */
#define MP_MAXT 320
#define MP_MAXOPS 72

typedef struct mprog {
  ir_tensor tensors[MP_MAXT];
  char paths[MP_MAXT][16];
  ir_op ops[MP_MAXOPS];
  ir_prog prog;
  dsl_source src;
} mprog;

/* Appends the one op of k, with its tensors, to m. */
static void mp_take(mprog *m, const kt *k)
{
  int base = m->prog.ntensors;
  ck_assert_int_le(base + k->prog.ntensors, MP_MAXT);
  ck_assert_int_lt(m->prog.nops, MP_MAXOPS);
  for (int i = 0; i < k->prog.ntensors; i++) {
    m->tensors[base + i] = k->tensors[i];
    snprintf(m->paths[base + i], sizeof m->paths[base + i], "t%d", base + i);
    m->tensors[base + i].path = m->paths[base + i];
  }
  m->prog.ntensors += k->prog.ntensors;
  ir_op op = k->op;
  for (int i = 0; i < op.nin; i++)
    op.in[i] += base;
  for (int i = 0; i < op.nout; i++)
    op.out[i] += base;
  op.pos = (dsl_pos){&m->src, 2, 5};
  m->ops[m->prog.nops++] = op;
}

static void mp_all_kinds(mprog *m)
{
  static int split_rows[8] = {-1, -1, -1, -1, -1, -1, 0, 1}; /* experts 6, 7 */
  memset(m, 0, sizeof *m);
  m->src.path = "kernels.yaml";
  m->src.text = "ops:\n  - {name: op, op: kind}\n";
  m->src.len = strlen(m->src.text);
  m->prog.tensors = m->tensors;
  m->prog.ops = m->ops;
  kt k;
  kt_init(&k, IR_OP_EMBED);
  kt_add(&k, 0, PLAN_I32, 1, (int64_t)4);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)128, (int64_t)64);
  kt_add(&k, 1, PLAN_F32, 2, (int64_t)4, (int64_t)64);
  mp_take(m, &k);
  kt_init(&k, IR_OP_EMBED); /* a bf16 table into 4 hyper-connection streams */
  kt_add(&k, 0, PLAN_I32, 1, (int64_t)4);
  kt_add(&k, 0, PLAN_BF16, 2, (int64_t)128, (int64_t)64);
  kt_add(&k, 1, PLAN_F32, 3, (int64_t)4, (int64_t)4, (int64_t)64);
  mp_take(m, &k);
  rmsnorm_op(&k, 4, 64, 1e-6);
  mp_take(m, &k);
  kt_init(&k, IR_OP_MATMUL); /* 150 columns: 19 tiles, the last partial */
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)4, (int64_t)64);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)150, (int64_t)64);
  kt_add(&k, 1, PLAN_F32, 2, (int64_t)4, (int64_t)150);
  mp_take(m, &k);
  for (int64_t kdim = 64; kdim <= 67; kdim += 3) { /* bf16 w: whole 16-byte chunks, and not */
    kt_init(&k, IR_OP_MATMUL);
    kt_add(&k, 0, PLAN_F32, 2, (int64_t)4, kdim);
    kt_add(&k, 0, PLAN_BF16, 2, (int64_t)150, kdim);
    kt_add(&k, 1, PLAN_F32, 2, (int64_t)4, (int64_t)150);
    mp_take(m, &k);
  }
  /* K a multiple of 32 (64): on the matrix units, four tiles of 8 a
   * block, and one where 32 columns would straddle a group (4112); else
   * (72) two columns a warp with x staged in shared memory (kgen.c: 8192
   * columns and up; a group's columns whole tiles of 16) */
  for (int64_t kdim = 64; kdim <= 72; kdim += 8) {
    kt_init(&k, IR_OP_MATMUL);
    kt_add(&k, 0, PLAN_F32, 2, (int64_t)4, kdim);
    kt_add(&k, 0, PLAN_BF16, 2, (int64_t)8200, kdim);
    kt_add(&k, 1, PLAN_F32, 2, (int64_t)4, (int64_t)8200);
    mp_take(m, &k);
    kt_init(&k, IR_OP_GROUP_MATMUL);
    k.op.iattr[0] = 2;
    kt_add(&k, 0, PLAN_F32, 2, (int64_t)4, 2 * kdim);
    kt_add(&k, 0, PLAN_BF16, 2, (int64_t)8224, kdim);
    kt_add(&k, 1, PLAN_F32, 2, (int64_t)4, (int64_t)8224);
    mp_take(m, &k);
  }
  /* a combine and its add as lowered for a GPU (lower.c) */
  kt_init(&k, IR_OP_MOE_COMBINE_ADD);
  kt_add(&k, 0, PLAN_F32, 3, (int64_t)4, (int64_t)2, (int64_t)64);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)4, (int64_t)2);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)4, (int64_t)64);
  kt_add(&k, 1, PLAN_F32, 2, (int64_t)4, (int64_t)64);
  mp_take(m, &k);
  /* two matmuls of one x as lowered for a GPU (lower.c), narrow and wide */
  pair_op(&k, PLAN_BF16, 4, 64, 150, 40);
  mp_take(m, &k);
  pair_op(&k, PLAN_BF16, 4, 64, 8200, 8192);
  mp_take(m, &k);
  /* moe_experts lowered for a GPU (lower.c): moe_up and moe_down over
   * rows of x of 64 (kgen.c: a grouped GEMM on the matrix units), and of
   * 72 and 24 (x and the activation row staged) */
  for (int64_t kdim = 64; kdim <= 72; kdim += 8) {
    kt_init(&k, IR_OP_MOE_UP);
    k.op.fattr[0] = 10.0;
    kt_add(&k, 0, PLAN_F32, 2, (int64_t)4, kdim);
    kt_add(&k, 0, PLAN_I32, 2, (int64_t)4, (int64_t)2);
    kt_add(&k, 0, PLAN_BF16, 3, (int64_t)5, (int64_t)24, kdim);
    kt_add(&k, 0, PLAN_BF16, 3, (int64_t)5, (int64_t)24, kdim);
    kt_add(&k, 1, PLAN_F32, 3, (int64_t)4, (int64_t)2, (int64_t)24);
    mp_take(m, &k);
  }
  for (int64_t fdim = 64; fdim >= 24; fdim -= 40) {
    kt_init(&k, IR_OP_MOE_DOWN);
    kt_add(&k, 0, PLAN_F32, 3, (int64_t)4, (int64_t)2, fdim);
    kt_add(&k, 0, PLAN_I32, 2, (int64_t)4, (int64_t)2);
    kt_add(&k, 0, PLAN_BF16, 3, (int64_t)5, (int64_t)64, fdim);
    kt_add(&k, 1, PLAN_F32, 3, (int64_t)4, (int64_t)2, (int64_t)64);
    mp_take(m, &k);
  }
  for (int r = 0; r <= 8; r += 8) { /* rope_dim 8, and 0: no table */
    kt_init(&k, IR_OP_ROPE);
    k.op.iattr[0] = 4;
    k.op.iattr[1] = r;
    k.op.fattr[2] = 10000.0;
    kt_add(&k, 0, PLAN_F32, 2, (int64_t)4, (int64_t)64);
    kt_add(&k, 1, PLAN_F32, 2, (int64_t)4, (int64_t)64);
    mp_take(m, &k);
  }
  kt_init(&k, IR_OP_CACHE_WRITE);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)4, (int64_t)64);
  kt_add(&k, 1, PLAN_F32, 2, (int64_t)64, (int64_t)64);
  mp_take(m, &k);
  for (int heads = 4; heads >= 2; heads -= 2) { /* head dims 16 and 512 */
    int64_t c = heads == 4 ? 64 : 1024;
    kt_init(&k, IR_OP_ATTENTION);
    k.op.iattr[0] = heads;
    k.op.fattr[1] = 0.25;
    kt_add(&k, 0, PLAN_F32, 2, (int64_t)4, c);
    kt_add(&k, 0, PLAN_F32, 2, (int64_t)64, c);
    kt_add(&k, 0, PLAN_F32, 2, (int64_t)64, c);
    kt_add(&k, 1, PLAN_F32, 2, (int64_t)4, c);
    mp_take(m, &k);
  }
  kt_init(&k, IR_OP_ADD);
  for (int i = 0; i < 3; i++)
    kt_add(&k, i == 2, PLAN_F32, 2, (int64_t)4, (int64_t)64);
  mp_take(m, &k);
  kt_init(&k, IR_OP_TOPK_ROUTE);
  k.op.iattr[0] = 2;
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)4, (int64_t)8);
  kt_add(&k, 1, PLAN_I32, 2, (int64_t)4, (int64_t)2);
  kt_add(&k, 1, PLAN_F32, 2, (int64_t)4, (int64_t)2);
  mp_take(m, &k);
  for (int split = 0; split < 3; split++) { /* all experts; a split; a split with bf16 weights */
    int64_t rows = split ? 2 : 8;
    uint32_t wt = split == 2 ? PLAN_BF16 : PLAN_F32;
    kt_init(&k, IR_OP_MOE_EXPERTS);
    if (split) {
      k.op.expert_row = split_rows;
      k.op.nexperts = 8;
      k.op.fattr[0] = 10.0; /* and the SwiGLU clamp */
    }
    kt_add(&k, 0, PLAN_F32, 2, (int64_t)4, (int64_t)64);
    kt_add(&k, 0, PLAN_I32, 2, (int64_t)4, (int64_t)2);
    kt_add(&k, 0, wt, 3, rows, (int64_t)32, (int64_t)64);
    kt_add(&k, 0, wt, 3, rows, (int64_t)32, (int64_t)64);
    kt_add(&k, 0, wt, 3, rows, (int64_t)64, (int64_t)32);
    kt_add(&k, 1, PLAN_F32, 3, (int64_t)4, (int64_t)2, (int64_t)64);
    mp_take(m, &k);
  }
  kt_init(&k, IR_OP_MOE_COMBINE);
  kt_add(&k, 0, PLAN_F32, 3, (int64_t)4, (int64_t)2, (int64_t)64);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)4, (int64_t)2);
  kt_add(&k, 1, PLAN_F32, 2, (int64_t)4, (int64_t)64);
  mp_take(m, &k);
  /* One ffn chunk, and two (clamped), in f32; then two chunks with bf16
   * w1 and w3 and an f32 w2 (each weight's dtype is its own). */
  for (int i = 0; i < 3; i++) {
    int64_t f = i ? 2100 : 32;
    uint32_t wt = i == 2 ? PLAN_BF16 : PLAN_F32;
    kt_init(&k, IR_OP_SWIGLU_FFN);
    k.op.fattr[0] = i ? 10.0 : 0.0;
    kt_add(&k, 0, PLAN_F32, 2, (int64_t)4, (int64_t)64);
    kt_add(&k, 0, wt, 2, f, (int64_t)64);
    kt_add(&k, 0, wt, 2, f, (int64_t)64);
    kt_add(&k, 0, PLAN_F32, 2, (int64_t)64, f);
    kt_add(&k, 1, PLAN_F32, 2, (int64_t)4, (int64_t)64);
    mp_take(m, &k);
  }
  kt_init(&k, IR_OP_ARGMAX);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)4, (int64_t)128);
  kt_add(&k, 1, PLAN_I32, 1, (int64_t)4);
  mp_take(m, &k);
  kt_init(&k, IR_OP_SUM_PARTS);
  k.op.iattr[0] = 2;
  kt_add(&k, 0, PLAN_F32, 3, (int64_t)8, (int64_t)2, (int64_t)64);
  kt_add(&k, 1, PLAN_F32, 3, (int64_t)4, (int64_t)2, (int64_t)64);
  mp_take(m, &k);
  hc_pre_op(&k, 4, 4, 64, 20);
  mp_take(m, &k);
  hc_pre_norm_op(&k, 4, 4, 64, 20); /* hc_pre's mix and its norm as lowered for a GPU */
  mp_take(m, &k);
  norm_rope_op(&k, 0, 64, 0, 16, 0); /* the norms and their rope as lowered for a GPU */
  mp_take(m, &k);
  norm_rope_op(&k, 1, 64, 16, 8, 1);
  mp_take(m, &k);
  kt_init(&k, IR_OP_HC_POST);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)4, (int64_t)64);
  kt_add(&k, 0, PLAN_F32, 3, (int64_t)4, (int64_t)4, (int64_t)64);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)4, (int64_t)4);
  kt_add(&k, 0, PLAN_F32, 3, (int64_t)4, (int64_t)4, (int64_t)4);
  kt_add(&k, 1, PLAN_F32, 3, (int64_t)4, (int64_t)4, (int64_t)64);
  mp_take(m, &k);
  hc_head_op(&k, 4, 4, 64);
  mp_take(m, &k);
  score_route_op(&k, 4, 256, 6, 1.5); /* E > NTHREADS: threads own two experts */
  mp_take(m, &k);
  hash_route_op(&k, 4, 8, 128, 2, 1.5);
  mp_take(m, &k);
  /* The compressor at CSA's and HCA's DS4 sizes (HCA's 128 slots and 512
   * channels in shared memory), the indexer over two tiles of windows. */
  cstore_op(&k, 4, 11, 64);
  mp_take(m, &k);
  cpool_op(&k, &g_csa);
  mp_take(m, &k);
  cpool_op(&k, &g_hca);
  mp_take(m, &k);
  iscores_op(&k, 4, 8, 16, 300, 4);
  mp_take(m, &k);
  iselect_op(&k, 4, 300, 64, 4);
  mp_take(m, &k);
  /* DeepSeek-V4's attention pieces: the compress table's inverse rotation;
   * per-head norms; the ring; attention over the window alone, over every
   * closed entry, and at DS4's sizes over 512 selected entries of 512
   * channels; the grouped o_a projection, a partial tile. */
  rope_op(&k, 2, 64, 64, 160000.0, 1, g_ds4_yarn);
  mp_take(m, &k);
  kt_init(&k, IR_OP_RMSNORM_GROUPS);
  k.op.fattr[0] = 1e-6;
  k.op.iattr[1] = 16;
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)4, (int64_t)64);
  kt_add(&k, 1, PLAN_F32, 2, (int64_t)4, (int64_t)64);
  mp_take(m, &k);
  kt_init(&k, IR_OP_WINDOW_WRITE);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)4, (int64_t)64);
  kt_add(&k, 1, PLAN_F32, 2, (int64_t)7, (int64_t)64);
  mp_take(m, &k);
  static const sink_cfg sinks[] = {{4, 16, 4, 7, 0, 0, 1, 1}, {4, 16, 4, 7, 4, 1, 16, 1},
                                   {2, 512, 128, 131, 4, 2, 600, 512},
                                   {2, 16, 4, 7, 2, 1, 12288, 1}}; /* scores computed again */
  for (int i = 0; i < 4; i++) {
    sink_op(&k, &sinks[i], 4);
    mp_take(m, &k);
  }
  for (int bf16 = 0; bf16 < 2; bf16++) {
    kt_init(&k, IR_OP_GROUP_MATMUL);
    k.op.iattr[0] = 4;
    kt_add(&k, 0, PLAN_F32, 2, (int64_t)4, (int64_t)64);
    kt_add(&k, 0, bf16 ? PLAN_BF16 : PLAN_F32, 2, (int64_t)36, (int64_t)16);
    kt_add(&k, 1, PLAN_F32, 2, (int64_t)4, (int64_t)36);
    mp_take(m, &k);
  }
  /* Quantized weights in every kind that takes them: a matmul of each
   * dtype, the mxfp4 one wide (two columns a warp, x staged), a pair, a
   * wide grouped one, the shared expert in two chunks of ffn rows, a split
   * moe_experts, moe_up with the gate and up rows of one dtype (in flight
   * together) and of two, moe_down. */
  for (int fp4 = 0; fp4 < 2; fp4++) {
    int64_t n = fp4 ? 8200 : 150;
    kt_init(&k, IR_OP_MATMUL);
    kt_add(&k, 0, PLAN_F32, 2, (int64_t)4, (int64_t)64);
    kt_add(&k, 0, fp4 ? PLAN_MXFP4 : PLAN_F8E4M3, 2, n, (int64_t)64);
    kt_add(&k, 1, PLAN_F32, 2, (int64_t)4, n);
    mp_take(m, &k);
  }
  pair_op(&k, PLAN_F8E4M3, 4, 64, 150, 40);
  mp_take(m, &k);
  kt_init(&k, IR_OP_GROUP_MATMUL);
  k.op.iattr[0] = 2;
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)4, (int64_t)128);
  kt_add(&k, 0, PLAN_MXFP4, 2, (int64_t)8224, (int64_t)64);
  kt_add(&k, 1, PLAN_F32, 2, (int64_t)4, (int64_t)8224);
  mp_take(m, &k);
  kt_init(&k, IR_OP_SWIGLU_FFN);
  k.op.fattr[0] = 10.0;
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)4, (int64_t)64);
  kt_add(&k, 0, PLAN_F8E4M3, 2, (int64_t)2100, (int64_t)64);
  kt_add(&k, 0, PLAN_F8E4M3, 2, (int64_t)2100, (int64_t)64);
  kt_add(&k, 0, PLAN_MXFP4, 2, (int64_t)64, (int64_t)2100);
  kt_add(&k, 1, PLAN_F32, 2, (int64_t)4, (int64_t)64);
  mp_take(m, &k);
  kt_init(&k, IR_OP_MOE_EXPERTS);
  k.op.expert_row = split_rows;
  k.op.nexperts = 8;
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)4, (int64_t)64);
  kt_add(&k, 0, PLAN_I32, 2, (int64_t)4, (int64_t)2);
  kt_add(&k, 0, PLAN_MXFP4, 3, (int64_t)2, (int64_t)32, (int64_t)64);
  kt_add(&k, 0, PLAN_MXFP4, 3, (int64_t)2, (int64_t)32, (int64_t)64);
  kt_add(&k, 0, PLAN_MXFP4, 3, (int64_t)2, (int64_t)64, (int64_t)32);
  kt_add(&k, 1, PLAN_F32, 3, (int64_t)4, (int64_t)2, (int64_t)64);
  mp_take(m, &k);
  for (int mixed = 0; mixed < 2; mixed++) {
    kt_init(&k, IR_OP_MOE_UP);
    k.op.fattr[0] = 10.0;
    kt_add(&k, 0, PLAN_F32, 2, (int64_t)4, (int64_t)64);
    kt_add(&k, 0, PLAN_I32, 2, (int64_t)4, (int64_t)2);
    kt_add(&k, 0, PLAN_MXFP4, 3, (int64_t)5, (int64_t)24, (int64_t)64);
    kt_add(&k, 0, mixed ? PLAN_F8E4M3 : PLAN_MXFP4, 3, (int64_t)5, (int64_t)24, (int64_t)64);
    kt_add(&k, 1, PLAN_F32, 3, (int64_t)4, (int64_t)2, (int64_t)24);
    mp_take(m, &k);
  }
  kt_init(&k, IR_OP_MOE_DOWN);
  kt_add(&k, 0, PLAN_F32, 3, (int64_t)4, (int64_t)2, (int64_t)24);
  kt_add(&k, 0, PLAN_I32, 2, (int64_t)4, (int64_t)2);
  kt_add(&k, 0, PLAN_F8E4M3, 3, (int64_t)5, (int64_t)64, (int64_t)24);
  kt_add(&k, 1, PLAN_F32, 3, (int64_t)4, (int64_t)2, (int64_t)64);
  mp_take(m, &k);
  swiglu_act_op(&k, 4, 300, 10.0); /* a partial second tile, clamped */
  mp_take(m, &k);
  swiglu_act_op(&k, 4, 64, 0.0);
  mp_take(m, &k);
}

static const char *const g_kinds[] = {"embed", "rmsnorm", "matmul", "rope", "cache_write", "attention",
                                      "add", "topk_route", "moe_experts", "moe_combine", "swiglu_ffn",
                                      "argmax", "sum_parts", "hc_pre", "hc_post", "hc_head", "score_route",
                                      "hash_route", "compress_store", "compress_pool", "index_scores",
                                      "index_select", "rmsnorm_groups", "window_write", "sink_attention",
                                      "group_matmul", "swiglu_act"};
#define NKINDS ((int)(sizeof g_kinds / sizeof g_kinds[0]))

START_TEST(test_gpu_templates)
{
  const char *prelude = kgen_gpu_prelude();
  ck_assert_ptr_nonnull(prelude);
  ck_assert_ptr_nonnull(strstr(prelude, "#define DS4_KERNEL"));
  for (int i = 0; i < NKINDS; i++) {
    const char *t = ds4_template_find("gpu", g_kinds[i]);
    ck_assert_msg(t != NULL, "no gpu template for %s", g_kinds[i]);
    ck_assert_ptr_nonnull(strstr(t, "DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)"));
  }
  ck_assert_ptr_null(ds4_template_find("gpu", "copy"));
  /* Every GPU kernel, the lowered kinds too, waits for the grids before it
   * first of all: a plan says so (PLAN_FLAG_GRID_WAIT) and the cuda
   * backend then lets its launches overlap their predecessors. */
  int kernels = 0;
  for (int i = 0; i < ds4_ntemplates; i++) {
    const ds4_template *t = &ds4_templates[i];
    if (strcmp(t->target, "gpu") != 0 || strcmp(t->kind, "prelude") == 0)
      continue;
    ck_assert_msg(strstr(t->text, "DS4_KERNEL void KERNEL_NAME(void *const *bufs, const int32_t *step)\n{\n"
                                  "  ds4_grid_wait();\n") != NULL,
                  "gpu template %s: the kernel does not begin with ds4_grid_wait()", t->kind);
    kernels++;
  }
  ck_assert_int_ge(kernels, NKINDS);
}
END_TEST

/* Each weight's element type and dtype define in a GPU kernel's source:
 * float and 0 for f32, ds4_bf16 and 1 for bf16, ds4_f8e4m3 and 4,
 * ds4_mxfp4 and 5. */
static void gpu_check_weight_types(const ir_prog *p, const ir_op *op, const char *source)
{
  static const struct {
    int kind, slot;
    const char *name;
  } weights[] = {{IR_OP_EMBED, 1, "TABLE"},     {IR_OP_MATMUL, 1, "W"},        {IR_OP_GROUP_MATMUL, 1, "W"},
                 {IR_OP_MOE_EXPERTS, 2, "W1"},  {IR_OP_MOE_EXPERTS, 3, "W3"},  {IR_OP_MOE_EXPERTS, 4, "W2"},
                 {IR_OP_SWIGLU_FFN, 1, "W1"},   {IR_OP_SWIGLU_FFN, 2, "W3"},   {IR_OP_SWIGLU_FFN, 3, "W2"},
                 {IR_OP_MATMUL_PAIR, 1, "W1"},  {IR_OP_MATMUL_PAIR, 2, "W2"},  {IR_OP_MOE_UP, 2, "W1"},
                 {IR_OP_MOE_UP, 3, "W3"},       {IR_OP_MOE_DOWN, 2, "W2"}};
  for (size_t i = 0; i < sizeof weights / sizeof weights[0]; i++) {
    if (weights[i].kind != op->kind)
      continue;
    uint32_t dt = p->tensors[op->in[weights[i].slot]].dtype;
    const char *name = dt == PLAN_BF16      ? "ds4_bf16"
                       : dt == PLAN_F8E4M3 ? "ds4_f8e4m3"
                       : dt == PLAN_MXFP4  ? "ds4_mxfp4"
                                           : "float";
    char type[64], flag[64];
    snprintf(type, sizeof type, "#define %s_T %s\n", weights[i].name, name);
    snprintf(flag, sizeof flag, "#define %s_DT ((int64_t)%u)\n", weights[i].name, dt);
    ck_assert_msg(strstr(source, type) && strstr(source, flag), "%s: lacks \"%s\" or \"%s\"", op->path, type,
                  flag);
  }
}

/* The same symbol, grid and operands on every target; a block of whole
 * waves; a source that undoes its defines. */
START_TEST(test_gpu_symbols)
{
  mprog m;
  mp_all_kinds(&m);
  int seen[NKINDS] = {0};
  for (int i = 0; i < m.prog.nops; i++) {
    dsl_diag d = {0};
    kgen_kernel h, g;
    ck_assert_msg(kgen_host(&m.prog, &m.ops[i], &h, &d) == 0, "kgen_host: %s", d.msg);
    ck_assert_msg(kgen_gpu(&m.prog, &m.ops[i], &g, &d) == 0, "kgen_gpu: %s", d.msg);
    ck_assert_str_eq(h.symbol, g.symbol);
    ck_assert_str_eq(h.kind, g.kind);
    ck_assert_uint_eq(h.grid, g.grid);
    ck_assert_uint_eq(h.nbufs, g.nbufs);
    ck_assert_uint_eq(g.nbufs, (uint32_t)(m.ops[i].nin + m.ops[i].nout));
    ck_assert_uint_eq(h.block, 0);
    ck_assert_msg(g.block >= 64 && g.block <= 1024 && g.block % 64 == 0, "%s: block %u", g.symbol, g.block);
    for (int k = 0; k < NKINDS; k++)
      seen[k] |= strcmp(g.kind, g_kinds[k]) == 0;
    char line[128];
    snprintf(line, sizeof line, "#define KERNEL_NAME %s\n", g.symbol);
    ck_assert_ptr_nonnull(strstr(g.source, line));
    snprintf(line, sizeof line, "#define NTHREADS %u\n", g.block);
    ck_assert_ptr_nonnull(strstr(g.source, line));
    gpu_check_weight_types(&m.prog, &m.ops[i], g.source);
    ck_assert_ptr_nonnull(strstr(g.source, "#undef KERNEL_NAME\n"));
    ck_assert_ptr_nonnull(strstr(g.source, "#undef NTHREADS\n"));
    ck_assert_ptr_null(strstr(g.source, "#include"));
    kgen_kernel_free(&h);
    kgen_kernel_free(&g);
  }
  for (int k = 0; k < NKINDS; k++)
    ck_assert_msg(seen[k], "no %s op in the program", g_kinds[k]);
}
END_TEST

/* ---- the multi-target build ---- */

static char *read_all(const char *path, size_t *out_len)
{
  FILE *f = fopen(path, "rb");
  ck_assert_msg(f != NULL, "cannot read %s", path);
  size_t cap = 1 << 16, len = 0, n;
  char *buf = malloc(cap + 1);
  ck_assert_ptr_nonnull(buf);
  while ((n = fread(buf + len, 1, cap - len, f)) > 0) {
    len += n;
    if (len == cap) {
      cap *= 2;
      buf = realloc(buf, cap + 1);
      ck_assert_ptr_nonnull(buf);
    }
  }
  fclose(f);
  buf[len] = 0;
  if (out_len)
    *out_len = len;
  return buf;
}

static char *run_capture(const char *cmd)
{
  FILE *f = popen(cmd, "r");
  ck_assert_msg(f != NULL, "cannot run %s", cmd);
  size_t cap = 1 << 16, len = 0, n;
  char *buf = malloc(cap + 1);
  ck_assert_ptr_nonnull(buf);
  while ((n = fread(buf + len, 1, cap - len, f)) > 0) {
    len += n;
    if (len == cap) {
      cap *= 2;
      buf = realloc(buf, cap + 1);
      ck_assert_ptr_nonnull(buf);
    }
  }
  buf[len] = 0;
  ck_assert_msg(pclose(f) == 0, "%s failed:\n%s", cmd, buf);
  return buf;
}

/* A field of one kernel's record in `llvm-readelf --notes` output; -1 when
 * the kernel or the field is missing. */
static long note_field(const char *notes, const char *symbol, const char *field)
{
  char key[160];
  snprintf(key, sizeof key, "    .name:           %s\n", symbol);
  const char *at = strstr(notes, key);
  if (!at)
    return -1;
  const char *start = at, *end = strstr(at, "\n  - ");
  while (start > notes && strncmp(start, "\n  - ", 5) != 0)
    start--;
  if (!end)
    end = notes + strlen(notes);
  snprintf(key, sizeof key, "\n    %s:", field);
  const char *f = strstr(start, key);
  return f && f < end ? strtol(f + strlen(key), NULL, 10) : -1;
}

/* Whether ptxas is where the toolchain looks: DS4_PTXAS, PATH, then the
 * CUDA toolkit. */
static int ptxas_present(void)
{
  const char *env = getenv("DS4_PTXAS");
  if (env && *env)
    return access(env, X_OK) == 0;
  return system("command -v ptxas >/dev/null 2>&1") == 0 || access("/usr/local/cuda/bin/ptxas", X_OK) == 0;
}

static void make_dir(char *out, size_t n, const char *name)
{
  snprintf(out, n, "%s/%s", g_dir, name);
  ck_assert_msg(mkdir(out, 0777) == 0, "mkdir %s", out);
}

static void build_targets(mprog *m, const char *dir, char *const *targets, int n, emit_kernels *k)
{
  dsl_diag d = {0};
  int rc = emit_kernels_build(&m->prog, dir, targets, n, k, &d);
  ck_assert_msg(rc == 0, "emit_kernels_build: %s", d.msg);
}

/* Two bundles' copies of kernels/<name> are byte-identical. */
static void same_file(const char *a, const char *b, const char *name)
{
  char pa[512], pb[512];
  snprintf(pa, sizeof pa, "%s/kernels/%s", a, name);
  snprintf(pb, sizeof pb, "%s/kernels/%s", b, name);
  size_t la, lb;
  char *x = read_all(pa, &la), *y = read_all(pb, &lb);
  ck_assert_msg(la > 0 && la == lb && memcmp(x, y, la) == 0, "%s differs between two builds", name);
  free(x);
  free(y);
}

START_TEST(test_gpu_build)
{
  char *targets[] = {"host", "gfx1201", "gfx1151", "gfx1100", "gfx942", "sm_90"};
  int ntargets = 6;
  if (!ptxas_present()) {
    fprintf(stderr, "test_kernels: no ptxas (CUDA toolkit): sm_90 not built\n");
    ntargets = 5;
  }
  mprog m;
  mp_all_kinds(&m);
  char a[300], b[300];
  make_dir(a, sizeof a, "bundle-a");
  emit_kernels ka;
  build_targets(&m, a, targets, ntargets, &ka);

  /* One kernel per op (all distinct here), sorted, each op pointing at its
   * own; code objects in the order asked for. */
  ck_assert_int_eq(ka.nkernels, m.prog.nops);
  for (int j = 1; j < ka.nkernels; j++)
    ck_assert_int_lt(strcmp(ka.kernels[j - 1].symbol, ka.kernels[j].symbol), 0);
  for (int i = 0; i < m.prog.nops; i++) {
    dsl_diag d = {0};
    kgen_kernel g;
    ck_assert_msg(kgen_gpu(&m.prog, &m.ops[i], &g, &d) == 0, "%s", d.msg);
    const emit_kernel *e = &ka.kernels[m.ops[i].kernel];
    ck_assert_str_eq(e->symbol, g.symbol);
    ck_assert_str_eq(e->kind, g.kind);
    ck_assert_uint_eq(e->grid, g.grid);
    ck_assert_uint_eq(e->block, g.block);
    ck_assert_uint_eq(e->shared, g.shared);
    ck_assert_uint_eq(e->nbufs, g.nbufs);
    kgen_kernel_free(&g);
  }
  ck_assert_int_eq(ka.ncodeobjs, ntargets);
  for (int t = 0; t < ntargets; t++) {
    ck_assert_str_eq(ka.codeobjs[t].target, targets[t]);
    char want[64];
    snprintf(want, sizeof want, "kernels/%s.%s", targets[t],
             t == 0 ? "so" : strncmp(targets[t], "sm_", 3) == 0 ? "cubin" : "hsaco");
    ck_assert_str_eq(ka.codeobjs[t].path, want);
  }

  /* Every AMD code object lists every kernel, launched with its block,
   * using exactly the shared memory kgen_gpu reports and no stack. */
  for (int t = 1; t < ntargets; t++) {
    if (strncmp(targets[t], "gfx", 3) != 0)
      continue;
    char cmd[600];
    snprintf(cmd, sizeof cmd, "llvm-readelf-19 --notes '%s/kernels/%s.hsaco'", a, targets[t]);
    char *notes = run_capture(cmd);
    for (int j = 0; j < ka.nkernels; j++) {
      const emit_kernel *e = &ka.kernels[j];
      ck_assert_msg(note_field(notes, e->symbol, ".vgpr_count") > 0, "%s: %s missing", targets[t], e->symbol);
      ck_assert_int_eq(note_field(notes, e->symbol, ".max_flat_workgroup_size"), e->block);
      ck_assert_int_eq(note_field(notes, e->symbol, ".group_segment_fixed_size"), e->shared);
      ck_assert_int_eq(note_field(notes, e->symbol, ".private_segment_fixed_size"), 0);
    }
    free(notes);
  }
  if (ntargets == 6) { /* the PTX declares every kernel; ptxas made a cubin */
    char path[400];
    snprintf(path, sizeof path, "%s/kernels/sm_90.ptx", a);
    char *ptx = read_all(path, NULL);
    for (int j = 0; j < ka.nkernels; j++) {
      char entry[128];
      snprintf(entry, sizeof entry, ".entry %s(", ka.kernels[j].symbol);
      ck_assert_msg(strstr(ptx, entry) != NULL, "sm_90.ptx lacks %s", entry);
    }
    /* the matrix-unit kernels multiply on the units, not in a fallback */
    ck_assert_msg(strstr(ptx, "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32") != NULL,
                  "sm_90.ptx has no bf16 mma.sync");
    free(ptx);
    /* and no kernel uses local memory or a stack (no spills) */
    snprintf(path, sizeof path, "%s/kernels/sm_90.cubin", a);
    size_t len;
    char *cubin = read_all(path, &len);
    insp_codeobj co;
    rt_status st = insp_read_codeobj(path, (const uint8_t *)cubin, len, &co);
    ck_assert_msg(st == NULL, "%s", rt_status_msg(st));
    for (int j = 0; j < ka.nkernels; j++) {
      const insp_kernel *ik = insp_find_kernel(&co, ka.kernels[j].symbol);
      ck_assert_msg(ik != NULL, "sm_90.cubin lacks %s", ka.kernels[j].symbol);
      ck_assert_msg(ik->local == 0 && ik->stack == 0, "sm_90: %s (%s) has %lld bytes of local memory, a stack of %lld",
                    ik->symbol, ka.kernels[j].kind, (long long)ik->local, (long long)ik->stack);
    }
    insp_codeobj_free(&co);
    free(cubin);
  }

  /* Built again elsewhere: the same bytes. */
  make_dir(b, sizeof b, "bundle-b");
  char *again[] = {"gfx1201", "sm_90"};
  emit_kernels kb;
  build_targets(&m, b, again, ntargets == 6 ? 2 : 1, &kb);
  same_file(a, b, "gfx1201.hip");
  same_file(a, b, "gfx1201.hsaco");
  ck_assert(memcmp(ka.codeobjs[1].sha256, kb.codeobjs[0].sha256, 32) == 0);
  if (ntargets == 6) {
    same_file(a, b, "sm_90.hip");
    same_file(a, b, "sm_90.ptx");
    same_file(a, b, "sm_90.cubin");
    ck_assert(memcmp(ka.codeobjs[5].sha256, kb.codeobjs[1].sha256, 32) == 0);
  }
  emit_kernels_free(&ka);
  emit_kernels_free(&kb);
  ck_assert_ptr_null(ka.kernels);
}
END_TEST

/* ---- the prelude's math, compiled for the host: the same IEEE f32/f64
 * operations the GPU targets run, so the same bits ---- */

typedef float (*expf_fn)(float);
typedef void (*sincosf_fn)(float, float *, float *);

/* |got - ref| in units of the last place of the float nearest ref. */
static double ulp_error(float got, double ref)
{
  double mag = fabs(ref);
  double ulp = mag < 0x1p-126 ? 0x1p-149 : ldexp(1.0, ilogb((float)mag) - 23);
  return fabs((double)got - ref) / ulp;
}

START_TEST(test_gpu_math)
{
  char src[400], so[400], cmd[1200];
  snprintf(src, sizeof src, "%s/math.cpp", g_dir);
  snprintf(so, sizeof so, "%s/math.so", g_dir);
  FILE *f = fopen(src, "w");
  ck_assert_ptr_nonnull(f);
  fprintf(f, "%s\nextern \"C\" float m_expf(float x) { return ds4_expf(x); }\n"
             "extern \"C\" void m_sincosf(float x, float *s, float *c) { ds4_sincosf(x, s, c); }\n"
             "extern \"C\" float m_bf16(unsigned short h) { return ds4_f32(ds4_bf16{h}); }\n"
             "extern \"C\" float m_chunk(float acc, const float *x, const uint32_t *w, int bf16) {\n"
             "  ds4_f32x4 xv[2] = {{x[0], x[1], x[2], x[3]}, {x[4], x[5], x[6], x[7]}};\n"
             "  ds4_u32x4 wv = {w[0], w[1], w[2], w[3]};\n"
             "  return bf16 ? ds4_chunk_dot(acc, xv, wv, ds4_bf16{}) : ds4_chunk_dot(acc, xv, wv, 0.0f);\n"
             "}\n",
          kgen_gpu_prelude());
  ck_assert_int_eq(fclose(f), 0);
  const char *clang = getenv("DS4_CLANG");
  snprintf(cmd, sizeof cmd, "%s -x c++ -O2 -ffp-contract=off -fPIC -shared -Wall -Werror -o %s %s",
           clang && *clang ? clang : "clang-19", so, src);
  ck_assert_msg(system(cmd) == 0, "%s failed", cmd);
  void *dl = dlopen(so, RTLD_NOW | RTLD_LOCAL);
  ck_assert_msg(dl != NULL, "dlopen: %s", dlerror());
  expf_fn ex;
  sincosf_fn sc;
  float (*bf)(unsigned short);
  float (*chunk)(float, const float *, const uint32_t *, int);
  *(void **)&ex = dlsym(dl, "m_expf");
  *(void **)&sc = dlsym(dl, "m_sincosf");
  *(void **)&bf = dlsym(dl, "m_bf16");
  *(void **)&chunk = dlsym(dl, "m_chunk");
  ck_assert(ex && sc && bf && chunk);

  /* A 16-byte chunk of a matmul row: the products added in element
   * order, 4 f32 or 8 bf16 (element 2j the low half of word j). */
  for (int trial = 0; trial < 100; trial++) {
    float x[8], acc = (float)rnd();
    uint32_t w[4];
    for (int i = 0; i < 8; i++)
      x[i] = (float)rnd();
    for (int j = 0; j < 4; j++) {
      float v = (float)rnd();
      memcpy(&w[j], &v, 4);
      if (trial % 2)
        w[j] = (uint32_t)bf16_of((float)rnd()) | (uint32_t)bf16_of((float)rnd()) << 16;
    }
    float want = acc;
    for (int i = 0; i < (trial % 2 ? 8 : 4); i++) {
      uint32_t bits = trial % 2 ? (i % 2 ? w[i / 2] & 0xffff0000u : w[i / 2] << 16) : w[i];
      float wi;
      memcpy(&wi, &bits, 4);
      want = want + x[i] * wi;
    }
    float got = chunk(acc, x, w, trial % 2);
    ck_assert_msg(memcmp(&got, &want, 4) == 0, "ds4_chunk_dot (%s): %.9g, want %.9g", trial % 2 ? "bf16" : "f32",
                  (double)got, (double)want);
  }

  /* bf16 widening: exactly the f32 whose high half it is, for every
   * value (zeros, subnormals, infinities and NaNs included). */
  for (uint32_t h = 0; h <= 0xffffu; h++) {
    float got = bf((unsigned short)h);
    uint32_t bits;
    memcpy(&bits, &got, 4);
    ck_assert_msg(bits == h << 16, "ds4_f32(bf16 0x%04x) has bits 0x%08x", h, bits);
  }

  /* expf: exact where exact, the special values, and within 2 ulp of the
   * float64 exp on a sweep of the whole finite range. */
  ck_assert(ex(0.0f) == 1.0f);
  ck_assert(ex(-INFINITY) == 0.0f && !signbit(ex(-INFINITY)));
  ck_assert(isinf(ex(INFINITY)) && isinf(ex(89.5f)) && isinf(ex(88.75f)));
  ck_assert(isnan(ex(NAN)));
  ck_assert(ex(-110.0f) == 0.0f);
  ck_assert(ex(-103.5f) > 0.0f); /* subnormal, not flushed */
  double worst = 0.0;
  for (uint32_t i = 0; i <= 400000; i++) {
    float x = -104.0f + 193.0f * (float)i / 400000.0f;
    float got = ex(x);
    if (x > 88.72f)
      continue;
    worst = fmax(worst, ulp_error(got, exp((double)x)));
  }
  ck_assert_msg(worst <= 2.0, "ds4_expf is %.3f ulp off", worst);

  /* sincos: within an ulp of the long double sin and cos, from tiny
   * angles to positions in the billions. */
  float s, c;
  sc(0.0f, &s, &c);
  ck_assert(s == 0.0f && c == 1.0f);
  sc(INFINITY, &s, &c);
  ck_assert(isnan(s) && isnan(c));
  double ws = 0.0, wc = 0.0;
  for (uint32_t i = 0; i < 300000; i++) {
    float x = ldexpf(1.0f + (float)(i % 1000) / 1000.0f, (int)(i / 1000) % 55 - 22);
    if (i & 1)
      x = -x;
    sc(x, &s, &c);
    ws = fmax(ws, ulp_error(s, (double)sinl((long double)x)));
    wc = fmax(wc, ulp_error(c, (double)cosl((long double)x)));
  }
  ck_assert_msg(ws <= 1.0 && wc <= 1.0, "ds4_sincosf is %.3f / %.3f ulp off", ws, wc);
  dlclose(dl);
}
END_TEST

/* The prelude compiled for the host with `exports` (C++ defining extern
 * "C" wrappers) appended, as NAME.so in the suite's directory; the
 * caller dlcloses it. */
static void *load_prelude(const char *name, const char *exports)
{
  char src[400], so[400], cmd[1200];
  snprintf(src, sizeof src, "%s/%s.cpp", g_dir, name);
  snprintf(so, sizeof so, "%s/%s.so", g_dir, name);
  FILE *f = fopen(src, "w");
  ck_assert_ptr_nonnull(f);
  fprintf(f, "%s\n%s", kgen_gpu_prelude(), exports);
  ck_assert_int_eq(fclose(f), 0);
  const char *clang = getenv("DS4_CLANG");
  snprintf(cmd, sizeof cmd, "%s -x c++ -O2 -ffp-contract=off -fPIC -shared -Wall -Werror -o %s %s",
           clang && *clang ? clang : "clang-19", so, src);
  ck_assert_msg(system(cmd) == 0, "%s failed", cmd);
  void *dl = dlopen(so, RTLD_NOW | RTLD_LOCAL);
  ck_assert_msg(dl != NULL, "dlopen: %s", dlerror());
  return dl;
}

/* The routers' and the clamped SwiGLU's math on the GPU targets. */
START_TEST(test_gpu_route_math)
{
  void *dl = load_prelude("route_math", "extern \"C\" float m_log1pf(float y) { return ds4_log1pf(y); }\n"
                                        "extern \"C\" float m_score(float z) { return ds4_route_score(z); }\n"
                                        "extern \"C\" float m_act(float g, float u, float l) {\n"
                                        "  return ds4_swiglu_act(g, u, l);\n}\n");
  float (*lp)(float), (*score)(float), (*act)(float, float, float);
  *(void **)&lp = dlsym(dl, "m_log1pf");
  *(void **)&score = dlsym(dl, "m_score");
  *(void **)&act = dlsym(dl, "m_act");
  ck_assert(lp && score && act);

  /* log1p: the special values, and within an ulp of float64 from 2^-40
   * to past e^20 (the routers' range). */
  ck_assert(lp(0.0f) == 0.0f && isinf(lp(INFINITY)) && isnan(lp(NAN)));
  ck_assert(lp(0x1p-60f) == 0x1p-60f);
  double worst = 0.0;
  for (uint32_t i = 0; i < 72000; i++) {
    float y = ldexpf(1.0f + (float)(i % 1000) / 1000.0f, (int)(i / 1000) - 40);
    worst = fmax(worst, ulp_error(lp(y), log1p((double)y)));
  }
  ck_assert_msg(worst <= 1.0, "ds4_log1pf is %.3f ulp off", worst);

  /* sqrt(softplus(z)): z itself past PyTorch's threshold 20 (a correctly
   * rounded root), and within 2 ulp of float64 while e^z is a normal
   * float (below, a score of 1e-19 or less keeps fewer bits). */
  ck_assert(score(25.0f) == 5.0f && score(400.0f) == 20.0f);
  ck_assert(score(-INFINITY) == 0.0f && isnan(score(NAN)));
  worst = 0.0;
  for (uint32_t i = 0; i <= 200000; i++) {
    float z = -87.0f + 187.0f * (float)i / 200000.0f;
    worst = fmax(worst, ulp_error(score(z), ref_route_score(z)));
  }
  ck_assert_msg(worst <= 2.0, "ds4_route_score is %.3f ulp off", worst);

  /* The clamp: the gate from above only, the up projection both ways, a
   * NaN kept; limit 0 clamps nothing. Within 4 ulp of float64. */
  ck_assert(act(5.0f, 7.0f, 2.0f) == act(2.0f, 2.0f, 0.0f));
  ck_assert(act(-5.0f, 1.0f, 2.0f) == act(-5.0f, 1.0f, 0.0f));
  ck_assert(act(1.0f, -7.0f, 2.0f) == act(1.0f, -2.0f, 0.0f));
  ck_assert(act(30.0f, 30.0f, 0.0f) > 800.0f);
  ck_assert(isnan(act(NAN, 1.0f, 2.0f)) && isnan(act(1.0f, NAN, 2.0f)));
  static const float limits[] = {0.0f, 0.5f, 10.0f};
  worst = 0.0;
  for (int l = 0; l < 3; l++)
    for (int i = 0; i <= 400; i++)
      for (int j = 0; j <= 40; j++) {
        float g = -30.0f + 0.15f * (float)i, u = -30.0f + 1.5f * (float)j;
        worst = fmax(worst, ulp_error(act(g, u, limits[l]), ref_swiglu_act(g, u, limits[l], NULL)));
      }
  ck_assert_msg(worst <= 4.0, "ds4_swiglu_act is %.3f ulp off", worst);
  dlclose(dl);
}
END_TEST

/* ---- the compressor and indexer GPU kernels, run on the host ---- */

/* index_scores: the host kernel's bits, window for window. */
static void iscores_gpu_case(int heads, int d, int nent, int m, int pos, int ntok)
{
  enum { T = 3 };
  chain_kernel host = {0}, dev = {0};
  iscores_op(&host.op, T, heads, d, nent, m);
  iscores_op(&dev.op, T, heads, d, nent, m);
  chain_build(&host, 0);
  chain_build(&dev, 1);
  bufs bs;
  bufs_alloc(&bs, &host.op);
  fill_f32(bs.b[0], (int64_t)T * heads * d, 1.0);
  fill_f32(bs.b[1], (int64_t)T * heads, 1.0);
  fill_f32(bs.b[2], (int64_t)nent * d, 1.0);
  fill_garbage(bs.b[3], (int64_t)T * nent);
  chain_run(&host, &bs, pos, ntok);
  float *want = xcalloc((size_t)T * nent, sizeof *want);
  memcpy(want, bs.b[3], (size_t)T * nent * sizeof *want);
  fill_garbage(bs.b[3], (int64_t)T * nent);
  chain_run(&dev, &bs, pos, ntok);
  ck_assert_msg(memcmp(want, bs.b[3], (size_t)T * nent * sizeof *want) == 0,
                "index_scores: the GPU kernel's scores differ from the host's");
  free(want);
  bufs_free(&bs);
  chain_unbuild(&host);
  chain_unbuild(&dev);
}

/* index_scores and index_select give exactly the host's results (scores,
 * and windows with their ties); the GPU compressor's entries are within
 * tolerance of float64 and the same bits whatever the schedule, and so
 * are the indexer's scores and selections on them. */
/* x staged swizzled for a quantized row (prelude.h, ds4_xswz): over a
 * row of whole chunks, for chunks of 4, 8, 16 and 32 values, a
 * permutation that keeps each 16-byte vector whole (its 4 floats together
 * and in order), and the vectors q of 8 chunks in a row (the lanes one
 * 16-byte shared load serves) in 8 distinct bank groups of 16 bytes,
 * where the row order puts them in 1, 2 or 4 (8 lanes, 128 bytes). */
START_TEST(test_gpu_x_swizzle)
{
  void *dl = load_prelude("xswz", "extern \"C\" long long m_xswz(int v, long long k) {\n"
                                  "  switch (v) {\n"
                                  "  case 4: return ds4_xswz<4>(k);\n"
                                  "  case 8: return ds4_xswz<8>(k);\n"
                                  "  case 16: return ds4_xswz<16>(k);\n"
                                  "  default: return ds4_xswz<32>(k);\n"
                                  "  }\n"
                                  "}\n");
  long long (*xswz)(int, long long);
  *(void **)&xswz = dlsym(dl, "m_xswz");
  ck_assert(xswz != NULL);
  enum { K = 2048 };
  static unsigned char seen[K];
  for (int v = 4; v <= 32; v *= 2) {
    memset(seen, 0, sizeof seen);
    for (long long k = 0; k < K; k++) {
      long long p = xswz(v, k);
      ck_assert_msg(p >= 0 && p < K && !seen[p], "ds4_xswz<%d>(%lld) = %lld: not a permutation", v, k, p);
      seen[p] = 1;
      ck_assert_msg(p % 4 == k % 4 && (k % 4 == 0 || p == xswz(v, k - 1) + 1),
                    "ds4_xswz<%d> splits the vector of %lld", v, k);
    }
    int nv = v / 4;
    for (long long c0 = 0; c0 < K / v; c0 += 8)
      for (int q = 0; q < nv; q++) {
        unsigned groups = 0;
        for (long long c = c0; c < c0 + 8; c++)
          groups |= 1u << (xswz(v, c * v + 4 * q) / 4 % 8);
        ck_assert_msg(groups == 0xffu, "ds4_xswz<%d>: chunks %lld.. vector %d in bank groups %#x", v, c0, q, groups);
      }
  }
  dlclose(dl);
}
END_TEST

START_TEST(test_gpu_compress_index)
{
  iscores_gpu_case(4, 16, 300, 2, 290, 3);
  iscores_gpu_case(8, 128, 40, 4, 60, 2);
  static const int few[][2] = {{0, 4}, {9, 3}, {30, 4}};
  iselect_case(40, 7, 2, few, 3, 1);
  static const int many[][2] = {{1996, 3}};
  iselect_case(2000, 64, 1, many, 1, 1);
  iselect_case(700, 300, 1, many, 1, 1);
  /* keys in shared memory where NENT of them fit, read from the scores
   * each time where not: the same windows either way */
  static const int far[][2] = {{12995, 3}};
  for (int i = 0; i < 2; i++) {
    int nent = i ? 13000 : 2000;
    kt k;
    iselect_op(&k, 4, nent, 64, 1);
    kgen_kernel kk;
    dsl_diag d = {0};
    ck_assert_msg(kgen_gpu(&k.prog, &k.op, &kk, &d) == 0, "kgen_gpu: %s", d.msg);
    ck_assert_msg(strstr(kk.source, i ? "#define KEYS_SHARED 0\n" : "#define KEYS_SHARED 1\n") != NULL,
                  "index_select of %d windows: keys shared or not as expected", nent);
    kgen_kernel_free(&kk);
  }
  iselect_case(13000, 64, 1, far, 1, 1);
  comp_case_run(&g_indexer, 1, 2);
  comp_case_run(&g_csa, 1, 1);
  comp_case_run(&g_hca, 1, 1);
  emu_stop();
}
END_TEST

/* ---- the FFN and grouped projection GPU kernels, run on the host ---- */

/* Fresh inputs for op k: bf16 and f32 at random, i32 from idx (n values,
 * repeated). */
static void ffn_fill(const kt *k, bufs *bs, const int32_t *idx, int n)
{
  for (int i = 0; i < k->op.nin; i++) {
    int64_t cnt = k->tensors[i].bytes / plan_dtype_size(k->tensors[i].dtype);
    if (k->tensors[i].dtype == PLAN_BF16)
      for (int64_t j = 0; j < cnt; j++)
        ((uint16_t *)bs->b[i])[j] = bf16_of((float)rnd());
    else if (k->tensors[i].dtype == PLAN_I32)
      for (int64_t j = 0; j < cnt; j++)
        ((int32_t *)bs->b[i])[j] = idx[j % n];
    else
      fill_f32(bs->b[i], cnt, 1.0);
  }
  for (int o = k->op.nin; o < bs->n; o++)
    fill_garbage(bs->b[o], kt_elems(k, o));
}

/* A fused kind against the two kernels it replaces (lower.c), on the host
 * and on the GPU (its kernels as host fibers), in both block orders, at
 * each (pos, ntok) of steps: the fused kernel's one output bit for bit
 * the second kernel's, which reads the first's output as its input link.
 * fin_a[j] and fin_b[j] name the fused kernel's input that feeds input j
 * of the first and of the second (fin_b[link] is not read). The fused
 * output and the second's start from the same garbage, so a ring's rows
 * that a step does not write are compared too; i32 inputs take idx's
 * nidx values in turn. */
static void fused_chain_case(const char *what, const kt *fused, const kt *a, const kt *b, int link, const int *fin_a,
                             const int *fin_b, const int32_t *idx, int nidx, const int (*steps)[2], int nsteps)
{
  int nf = fused->op.nin, na = a->op.nin, nb = b->op.nin;
  ck_assert_int_eq(b->tensors[nb].bytes, fused->tensors[nf].bytes);
  for (int gpu = 0; gpu < 2; gpu++) {
    chain_kernel kf, ka, kb;
    chain_start(&kf, fused, gpu);
    chain_start(&ka, a, gpu);
    chain_start(&kb, b, gpu);
    bufs bf, ba, bb;
    bufs_alloc(&bf, fused);
    bufs_alloc(&ba, a);
    bufs_alloc(&bb, b);
    for (int st = 0; st < nsteps; st++) {
      int pos = steps[st][0], ntok = steps[st][1];
      ffn_fill(fused, &bf, idx, nidx);
      memcpy(bb.b[nb], bf.b[nf], (size_t)fused->tensors[nf].bytes);
      for (int j = 0; j < na; j++)
        memcpy(ba.b[j], bf.b[fin_a[j]], (size_t)a->tensors[j].bytes);
      fill_garbage(ba.b[na], kt_elems(a, na));
      chain_run(&kf, &bf, pos, ntok);
      chain_run(&ka, &ba, pos, ntok);
      for (int j = 0; j < nb; j++)
        memcpy(bb.b[j], j == link ? ba.b[na] : bf.b[fin_b[j]], (size_t)b->tensors[j].bytes);
      chain_run(&kb, &bb, pos, ntok);
      ck_assert_msg(memcmp(bf.b[nf], bb.b[nb], (size_t)fused->tensors[nf].bytes) == 0,
                    "%s %s: differs from the two kernels it replaces (pos %d, ntok %d)", gpu ? "GPU" : "host", what,
                    pos, ntok);
    }
    bufs_free(&bf);
    bufs_free(&ba);
    bufs_free(&bb);
    chain_unbuild(&kf);
    chain_unbuild(&ka);
    chain_unbuild(&kb);
  }
}

/* Steps for the fused cases: every slot live from 0, two live from 3, one
 * from 9 (a ring of 8 wraps), and a negative position (a bad parameter
 * block: the window writes nothing). */
static const int g_fused_steps[][2] = {{0, 4}, {3, 2}, {9, 1}, {-2, 4}};
#define NFUSED_STEPS ((int)(sizeof g_fused_steps / sizeof g_fused_steps[0]))

/* ||gpu - host|| / ||host|| over n floats; every +0 of the host's (dead
 * rows, other launches' and skipped expert slots) is +0 on the GPU too. */
static double ffn_rel_err(const char *what, const float *gpu, const float *host, int64_t n)
{
  double num = 0.0, den = 0.0;
  for (int64_t i = 0; i < n; i++) {
    uint32_t hb, gb;
    memcpy(&hb, &host[i], 4);
    memcpy(&gb, &gpu[i], 4);
    ck_assert_msg(hb != 0 || gb == 0, "%s: element %lld is %g on the GPU, +0 on the host", what, (long long)i,
                  (double)gpu[i]);
    double d = (double)gpu[i] - host[i];
    num += d * d;
    den += (double)host[i] * host[i];
  }
  ck_assert_msg(den > 0.0, "%s: every output was zero", what);
  return sqrt(num / den);
}

/* Op k's GPU kernel against its host kernel at each (pos, ntok) of steps:
 * within REL_TOL, zeros exact, the same bytes in either block order, and
 * the same bits again when every operand lies 4 bytes off its 16-byte
 * alignment (no chunk is then loaded 16 bytes at a time, but the order of
 * the sums is the same). i32 inputs come from idx. */
static void ffn_gpu_case(const kt *k, const int32_t *idx, int nidx, const int (*steps)[2], int nsteps)
{
  chain_kernel host, dev;
  chain_start(&host, k, 0);
  chain_start(&dev, k, 1);
  int nin = k->op.nin, nbuf = k->prog.ntensors;
  bufs bs;
  bufs_alloc(&bs, k);
  void *want[IR_MAXIO], *shifted[IR_MAXIO * 2];
  for (int i = 0; i < nbuf; i++) {
    size_t n = (size_t)k->tensors[i].bytes;
    char *raw = malloc(n + 16); /* 16-byte aligned, as bufs_alloc's */
    ck_assert_ptr_nonnull(raw);
    shifted[i] = raw + 4;
    if (i >= nin) {
      want[i - nin] = malloc(n);
      ck_assert_ptr_nonnull(want[i - nin]);
    }
  }
  for (int s = 0; s < nsteps; s++) {
    int pos = steps[s][0], ntok = steps[s][1];
    ffn_fill(k, &bs, idx, nidx);
    for (int i = 0; i < nbuf; i++)
      memcpy(shifted[i], bs.b[i], (size_t)k->tensors[i].bytes);
    chain_run(&host, &bs, pos, ntok);
    for (int o = nin; o < nbuf; o++) {
      memcpy(want[o - nin], bs.b[o], (size_t)k->tensors[o].bytes);
      fill_garbage(bs.b[o], kt_elems(k, o));
    }
    chain_run(&dev, &bs, pos, ntok);
    emu_run(dev.gpu, shifted, pos, ntok, 0);
    for (int o = nin; o < nbuf; o++) {
      int64_t n = kt_elems(k, o);
      double err = ffn_rel_err(dev.gpu->kk.symbol, bs.b[o], want[o - nin], n);
      ck_assert_msg(err <= REL_TOL, "%s: relative error %.3g against the host kernel (pos %d, ntok %d)",
                    dev.gpu->kk.symbol, err, pos, ntok);
      ck_assert_msg(memcmp(bs.b[o], shifted[o], (size_t)k->tensors[o].bytes) == 0,
                    "%s: other bits with operands off 16-byte alignment (pos %d, ntok %d)", dev.gpu->kk.symbol,
                    pos, ntok);
    }
  }
  for (int i = 0; i < nbuf; i++) {
    free((char *)shifted[i] - 4);
    if (i >= nin)
      free(want[i - nin]);
  }
  bufs_free(&bs);
  chain_unbuild(&host);
  chain_unbuild(&dev);
}

/* Every slot live, and two of four (each block's threads are host
 * threads here, so the GPU cases keep to few steps). */
static const int g_gpu_steps[][2] = {{0, 4}, {3, 2}};

/* moe_experts over E = 5 experts, the launch holding those of rows (NULL:
 * all), with weights of dtype wt and the clamp limit. */
static void moe_gpu_case(int *rows, uint32_t wt, double limit)
{
  enum { T = 4, K = 3, E = 5, H = 24, F = 24 };
  static const int32_t idx[T * K] = {0, 4, 2, 3, -1, 1, E, 2, 0, INT32_MIN, 4, 3};
  int64_t held = 0;
  for (int e = 0; e < E; e++)
    held += !rows || rows[e] >= 0;
  kt k;
  kt_init(&k, IR_OP_MOE_EXPERTS);
  k.op.fattr[0] = limit;
  if (rows) {
    k.op.expert_row = rows;
    k.op.nexperts = E;
  }
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)T, (int64_t)H);
  kt_add(&k, 0, PLAN_I32, 2, (int64_t)T, (int64_t)K);
  kt_add(&k, 0, wt, 3, held, (int64_t)F, (int64_t)H);
  kt_add(&k, 0, wt, 3, held, (int64_t)F, (int64_t)H);
  kt_add(&k, 0, wt, 3, held, (int64_t)H, (int64_t)F);
  kt_add(&k, 1, PLAN_F32, 3, (int64_t)T, (int64_t)K, (int64_t)H);
  ffn_gpu_case(&k, idx, T * K, g_gpu_steps, 2);
}

/* moe_experts as lowered for a GPU (lower.c): moe_up then moe_down over
 * the same operands as moe_case's op, the launch holding the experts of
 * rows (NULL: all). Each against its host kernel (ffn_gpu_case), and the
 * pair's slots bit for bit moe_experts' own, on the GPU (its kernels on
 * host threads) and on the host. */
static void moe_lowered_case(int *rows, uint32_t wt, double limit)
{
  enum { T = 4, K = 3, E = 5, H = 24, F = 24 };
  static const int32_t idx[T * K] = {0, 4, 2, 3, -1, 1, E, 2, 0, INT32_MIN, 4, 3};
  int64_t held = 0;
  for (int e = 0; e < E; e++)
    held += !rows || rows[e] >= 0;
  kt whole, up, down;
  kt_init(&whole, IR_OP_MOE_EXPERTS);
  kt_init(&up, IR_OP_MOE_UP);
  kt_init(&down, IR_OP_MOE_DOWN);
  whole.op.fattr[0] = up.op.fattr[0] = limit;
  if (rows) {
    whole.op.expert_row = up.op.expert_row = down.op.expert_row = rows;
    whole.op.nexperts = up.op.nexperts = down.op.nexperts = E;
  }
  kt_add(&whole, 0, PLAN_F32, 2, (int64_t)T, (int64_t)H);
  kt_add(&whole, 0, PLAN_I32, 2, (int64_t)T, (int64_t)K);
  kt_add(&whole, 0, wt, 3, held, (int64_t)F, (int64_t)H);
  kt_add(&whole, 0, wt, 3, held, (int64_t)F, (int64_t)H);
  kt_add(&whole, 0, wt, 3, held, (int64_t)H, (int64_t)F);
  kt_add(&whole, 1, PLAN_F32, 3, (int64_t)T, (int64_t)K, (int64_t)H);
  kt_add(&up, 0, PLAN_F32, 2, (int64_t)T, (int64_t)H);
  kt_add(&up, 0, PLAN_I32, 2, (int64_t)T, (int64_t)K);
  kt_add(&up, 0, wt, 3, held, (int64_t)F, (int64_t)H);
  kt_add(&up, 0, wt, 3, held, (int64_t)F, (int64_t)H);
  kt_add(&up, 1, PLAN_F32, 3, (int64_t)T, (int64_t)K, (int64_t)F);
  kt_add(&down, 0, PLAN_F32, 3, (int64_t)T, (int64_t)K, (int64_t)F);
  kt_add(&down, 0, PLAN_I32, 2, (int64_t)T, (int64_t)K);
  kt_add(&down, 0, wt, 3, held, (int64_t)H, (int64_t)F);
  kt_add(&down, 1, PLAN_F32, 3, (int64_t)T, (int64_t)K, (int64_t)H);
  ffn_gpu_case(&up, idx, T * K, g_gpu_steps, 2);
  ffn_gpu_case(&down, idx, T * K, g_gpu_steps, 2);

  for (int gpu = 0; gpu < 2; gpu++) {
    chain_kernel kw, ku, kd;
    chain_start(&kw, &whole, gpu);
    chain_start(&ku, &up, gpu);
    chain_start(&kd, &down, gpu);
    bufs bw, bu, bd;
    bufs_alloc(&bw, &whole);
    bufs_alloc(&bu, &up);
    bufs_alloc(&bd, &down);
    for (int s = 0; s < 2; s++) {
      int pos = g_gpu_steps[s][0], ntok = g_gpu_steps[s][1];
      ffn_fill(&whole, &bw, idx, T * K);
      for (int i = 0; i < 4; i++) /* x, idx, w1, w3 */
        memcpy(bu.b[i], bw.b[i], (size_t)whole.tensors[i].bytes);
      fill_garbage(bu.b[4], kt_elems(&up, 4));
      memcpy(bd.b[1], bw.b[1], (size_t)whole.tensors[1].bytes);
      memcpy(bd.b[2], bw.b[4], (size_t)whole.tensors[4].bytes);
      fill_garbage(bd.b[3], kt_elems(&down, 3));
      chain_run(&kw, &bw, pos, ntok);
      chain_run(&ku, &bu, pos, ntok);
      memcpy(bd.b[0], bu.b[4], (size_t)up.tensors[4].bytes);
      chain_run(&kd, &bd, pos, ntok);
      ck_assert_msg(memcmp(bd.b[3], bw.b[5], (size_t)whole.tensors[5].bytes) == 0,
                    "%s: moe_up and moe_down differ from moe_experts (pos %d, ntok %d)", gpu ? "GPU" : "host",
                    pos, ntok);
    }
    bufs_free(&bw);
    bufs_free(&bu);
    bufs_free(&bd);
    chain_unbuild(&kw);
    chain_unbuild(&ku);
    chain_unbuild(&kd);
  }
}

/* Two or three matmuls of one x as lowered for a GPU (lower.c):
 * matmul_pair's y1 and y2 (matmul_triple's y3 too, with n[2]) bit for bit
 * the matmuls' outputs, on the GPU (its kernels on host threads) and on
 * the host, each part's columns tiled alone (N1 not a tile's multiple),
 * wide (two columns a warp, x staged) and not. */
static void matmul_parts_case(int64_t K, int64_t N1, int64_t N2, int64_t N3, uint32_t wt)
{
  enum { T = 4 };
  int np = N3 ? 3 : 2;
  const int64_t n[3] = {N1, N2, N3};
  kt fused, m[3];
  kt_init(&fused, np == 3 ? IR_OP_MATMUL_TRIPLE : IR_OP_MATMUL_PAIR);
  kt_add(&fused, 0, PLAN_F32, 2, (int64_t)T, K);
  for (int q = 0; q < np; q++)
    kt_add(&fused, 0, wt, 2, n[q], K);
  for (int q = 0; q < np; q++) {
    kt_add(&fused, 1, PLAN_F32, 2, (int64_t)T, n[q]);
    kt_init(&m[q], IR_OP_MATMUL);
    kt_add(&m[q], 0, PLAN_F32, 2, (int64_t)T, K);
    kt_add(&m[q], 0, wt, 2, n[q], K);
    kt_add(&m[q], 1, PLAN_F32, 2, (int64_t)T, n[q]);
  }
  for (int gpu = 0; gpu < 2; gpu++) {
    chain_kernel kf, km[3];
    bufs bf, bm[3];
    chain_start(&kf, &fused, gpu);
    bufs_alloc(&bf, &fused);
    for (int q = 0; q < np; q++) {
      chain_start(&km[q], &m[q], gpu);
      bufs_alloc(&bm[q], &m[q]);
    }
    for (int s = 0; s < 2; s++) {
      int pos = g_gpu_steps[s][0], ntok = g_gpu_steps[s][1];
      ffn_fill(&fused, &bf, NULL, 1);
      chain_run(&kf, &bf, pos, ntok);
      for (int q = 0; q < np; q++) {
        memcpy(bm[q].b[0], bf.b[0], (size_t)fused.tensors[0].bytes);
        memcpy(bm[q].b[1], bf.b[1 + q], (size_t)fused.tensors[1 + q].bytes);
        fill_garbage(bm[q].b[2], kt_elems(&m[q], 2));
        chain_run(&km[q], &bm[q], pos, ntok);
        ck_assert_msg(memcmp(bf.b[1 + np + q], bm[q].b[2], (size_t)m[q].tensors[2].bytes) == 0,
                      "%s: %s's part %d differs from its matmul (K %lld, N %lld, %lld and %lld; pos %d, ntok %d)",
                      gpu ? "GPU" : "host", np == 3 ? "matmul_triple" : "matmul_pair", q + 1, (long long)K,
                      (long long)N1, (long long)N2, (long long)N3, pos, ntok);
      }
    }
    bufs_free(&bf);
    chain_unbuild(&kf);
    for (int q = 0; q < np; q++) {
      bufs_free(&bm[q]);
      chain_unbuild(&km[q]);
    }
  }
}

/* A moe_combine and the add after it as lowered for a GPU (lower.c):
 * moe_combine_add's y bit for bit the add of the combine's output and b,
 * on the GPU (its kernels as host fibers) and on the host, with H not a
 * multiple of a block's threads and dead slots zeroed. */
static void combine_add_case(int64_t H, int64_t K)
{
  enum { T = 4 };
  kt fused, comb, add;
  kt_init(&fused, IR_OP_MOE_COMBINE_ADD);
  kt_init(&comb, IR_OP_MOE_COMBINE);
  kt_init(&add, IR_OP_ADD);
  kt_add(&fused, 0, PLAN_F32, 3, (int64_t)T, K, H);
  kt_add(&fused, 0, PLAN_F32, 2, (int64_t)T, K);
  kt_add(&fused, 0, PLAN_F32, 2, (int64_t)T, H);
  kt_add(&fused, 1, PLAN_F32, 2, (int64_t)T, H);
  kt_add(&comb, 0, PLAN_F32, 3, (int64_t)T, K, H);
  kt_add(&comb, 0, PLAN_F32, 2, (int64_t)T, K);
  kt_add(&comb, 1, PLAN_F32, 2, (int64_t)T, H);
  kt_add(&add, 0, PLAN_F32, 2, (int64_t)T, H);
  kt_add(&add, 0, PLAN_F32, 2, (int64_t)T, H);
  kt_add(&add, 1, PLAN_F32, 2, (int64_t)T, H);
  static const int fin_a[] = {0, 1}, fin_b[] = {-1, 2};
  fused_chain_case("moe_combine_add", &fused, &comb, &add, 0, fin_a, fin_b, NULL, 0, g_gpu_steps, 2);
}

START_TEST(test_gpu_moe_combine_add)
{
  combine_add_case(300, 6);
  combine_add_case(64, 2);
  emu_stop();
}
END_TEST

START_TEST(test_gpu_matmul_pair)
{
  matmul_parts_case(64, 20, 8, 0, PLAN_F32);
  matmul_parts_case(72, 24, 40, 0, PLAN_BF16);
  matmul_parts_case(40, 8200, 8192, 0, PLAN_BF16); /* both wide: two columns a warp, x staged */
  matmul_parts_case(64, 8200, 8192, 0, PLAN_BF16); /* on the matrix units, four tiles a block */
  /* on the matrix units, a tile a block (the narrower part's), where the
   * second matmul alone takes four */
  matmul_parts_case(96, 24, 2100, 0, PLAN_BF16);
  /* three parts (q_a, kv and the indexer's weights, scaled down): f32 and
   * bf16 on the CUDA cores, on the matrix units, and all three wide */
  matmul_parts_case(64, 36, 20, 12, PLAN_F32);
  matmul_parts_case(72, 36, 20, 12, PLAN_BF16);
  matmul_parts_case(64, 36, 20, 12, PLAN_BF16);
  matmul_parts_case(40, 8200, 8192, 8208, PLAN_BF16);
  emu_stop();
}
END_TEST

START_TEST(test_gpu_moe_lowered)
{
  static int split[5] = {1, -1, -1, 2, 0}; /* experts 4, 0, 3 in rows 0, 1, 2 */
  moe_lowered_case(NULL, PLAN_F32, 0.0);
  moe_lowered_case(split, PLAN_BF16, 2.0);
  emu_stop();
}
END_TEST

/* ---- quantized weights (f8e4m3, mxfp4), on the host and on the GPU ---- */

static uint32_t rnd_bits(void) /* 32 random bits, deterministic */
{
  g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull;
  return (uint32_t)(g_rng >> 32);
}

/* Scale bytes that take every path of the kernels' dequantization: the
 * smallest (2^-127, a subnormal scale), the edges of the GPU's one-multiply
 * path (E4M3 up to 134, E2M1 up to 128) and past them, and the largest,
 * 254 (2^127). */
static const uint8_t g_special_scales[] = {0, 1, 2, 7, 100, 126, 127, 128, 129, 134, 135, 140, 200, 254};
#define NSPECIAL ((int)(sizeof g_special_scales / sizeof g_special_scales[0]))

/* A random code of a quantized dtype that is not a NaN (E4M3 0x7f and
 * 0xff); with small, a zero (7 in 8) or one of the smallest magnitudes
 * (an E4M3 subnormal, E2M1 0.5), so that under a scale of up to 2^127 a
 * row's sums stay finite. */
static uint8_t rnd_code(uint32_t dt, int small)
{
  uint32_t r = rnd_bits();
  uint8_t c = (uint8_t)(r >> 24), sign = (uint8_t)(r >> 8 & 1);
  if (small) {
    int zero = (r >> 4 & 7) != 0;
    if (dt == PLAN_MXFP4)
      return (uint8_t)(sign << 3 | (zero ? 0 : 1));
    return (uint8_t)(sign << 7 | (zero ? 0 : 1 + (r >> 16) % 7));
  }
  if (dt == PLAN_MXFP4)
    return c & 15;
  return (c & 0x7f) == 0x7f ? c & 0xf7 : c; /* a NaN code: another */
}

/* A random weight of quantized dtype dt and t's shape at base (every
 * matrix: codes, scale bytes, zero padding): scales in [120, 130], or
 * with special g_special_scales in turn from a random one (a block of
 * scale 200 or more takes rnd_code's small codes); and the same values
 * dequantized, element by element as runtime/plan.c reads them, into w32
 * (t's elements as f32: each exact, or rounded once where a large scale
 * takes it past f32's range). */
static void quant_fill(void *base, float *w32, uint32_t dt, const ir_tensor *t, int special)
{
  uint64_t dims[IR_MAXDIM];
  for (int i = 0; i < t->ndim; i++)
    dims[i] = (uint64_t)t->dim[i];
  plan_quant q;
  const char *why = plan_quant_of(dt, (uint32_t)t->ndim, dims, &q);
  ck_assert_msg(why == NULL, "%s", why);
  ck_assert_uint_eq(q.stride * q.nmat, (uint64_t)t->bytes);
  memset(base, 0, (size_t)t->bytes);
  int f8 = dt == PLAN_F8E4M3;
  uint32_t first = rnd_bits() % NSPECIAL; /* a small matrix has one block */
  uint64_t br = f8 ? PLAN_F8_BLOCK : 1, bc = f8 ? PLAN_F8_BLOCK : PLAN_FP4_BLOCK;
  for (uint64_t m = 0; m < q.nmat; m++) {
    uint8_t *mat = (uint8_t *)base + m * q.stride, *scales = mat + q.data_bytes;
    for (uint64_t i = 0; i < q.scale_rows * q.scale_cols; i++)
      scales[i] = special ? g_special_scales[(first + m * 5 + i) % NSPECIAL] : (uint8_t)(120 + rnd_bits() % 11);
    for (uint64_t r = 0; r < q.rows; r++)
      for (uint64_t c = 0; c < q.cols; c++) {
        uint8_t code = rnd_code(dt, scales[r / br * q.scale_cols + c / bc] >= 200);
        if (f8)
          mat[r * q.cols + c] = code;
        else
          mat[(r * q.cols + c) / 2] |= (uint8_t)(c % 2 ? code << 4 : code);
      }
  }
  for (uint64_t i = 0; i < q.nmat * q.rows * q.cols; i++)
    w32[i] = (float)plan_quant_element(dt, &q, base, i);
}

/* The dtypes of one run of quant_case: per input slot, PLAN_F32 to keep
 * the f32 operand (i32 ones are the i32 inputs), else bf16, f8e4m3 or
 * mxfp4; and whether the scales are the special ones. */
typedef struct qvariant {
  uint32_t dt[IR_MAXIO];
  int special;
} qvariant;

/* The four runs every weight slot of wslots in one quantized dtype: f8e4m3
 * and mxfp4, each with ordinary and with special scales. */
static int qvariants(unsigned wslots, qvariant *out)
{
  for (int v = 0; v < 4; v++) {
    memset(&out[v], 0, sizeof out[v]);
    for (int i = 0; i < IR_MAXIO; i++)
      out[v].dt[i] = wslots & 1u << i ? (v < 2 ? PLAN_F8E4M3 : PLAN_MXFP4) : PLAN_F32;
    out[v].special = v % 2;
  }
  return 4;
}

/* The GPU kernels sum a quantized row's chunks on their own and scale
 * each once (prelude.h, "quantized weights"), so they give the f32
 * kernel's result on the dequantized values to rounding, not to its bits:
 * every output within 2e-5 of the f32 kernel's, relative to the larger of
 * its own magnitude and the output's root mean square (a sum that cancels
 * keeps the error of its terms), plus 64 of the smallest subnormal's (a
 * subnormal sum rounds to 2^-149 at every step), and non-finite where the
 * f32 kernel's is, with its sign. Where one of the two is within a factor
 * of 4 of f32's largest (the special scales' 2^127 blocks) and the other
 * an infinity of its sign, a partial sum overflowed in one order and not
 * in the other, and that passes. */
static void quant_close(const float *y32, const float *yq, size_t n, const char *symbol, int out, const char *dtypes,
                        int special, int pos, int ntok)
{
  double ss = 0.0;
  size_t nf = 0;
  for (size_t j = 0; j < n; j++)
    if (isfinite(y32[j])) {
      ss += (double)y32[j] * y32[j];
      nf++;
    }
  double rms = nf ? sqrt(ss / (double)nf) : 0.0;
  for (size_t j = 0; j < n; j++) {
    double a = y32[j], b = yq[j], mag = fabs(a) > rms ? fabs(a) : rms;
    int ok;
    if (isfinite(a) && isfinite(b))
      ok = fabs(a - b) <= 2e-5 * mag + 0x1p-143;
    else if (isnan(a) || isnan(b))
      ok = isnan(a) && isnan(b);
    else /* an infinity: the other the same, or a finite sum near it */
      ok = (a < 0) == (b < 0) && fabs(isfinite(a) ? a : b) >= 0x1p126;
    ck_assert_msg(ok,
                  "%s (GPU): output %d element %zu with inputs %s%s: %.9g, the f32 kernel on the dequantized "
                  "values %.9g (rms %.3g; pos %d, ntok %d)",
                  symbol, out, j, dtypes, special ? ", special scales" : "", b, a, rms, pos, ntok);
  }
}

/* Op k32 (f32 weights) against the same op with its weights of each
 * variant's dtypes, on the host or (gpu) on the GPU (its kernels on host
 * threads): for quantized (and bf16) weights the host kernel must give,
 * bit for bit, what the host's f32 kernel gives for f32 weights holding
 * the dequantized (widened) values, the GPU kernel the same to rounding
 * (quant_close), at every step (g_steps; two on the GPU), in either block
 * order (on the GPU, where a launch is slow, the f32 kernel's blocks
 * ascending and the other's descending); on the GPU also with every
 * operand 4 bytes off its 16-byte alignment, bit for bit (read a value at
 * a time, in the same order). The kernel's symbol differs from the f32
 * one's and its source says the dtypes. i32 inputs take
 * rnd_index(ibound). */
static void quant_case(const kt *k32, int32_t ibound, int gpu, const qvariant *vars, int nvars)
{
  int nin = k32->op.nin, nbuf = k32->prog.ntensors;
  chain_kernel c32;
  chain_start(&c32, k32, gpu);
  const kgen_kernel *kk32 = gpu ? &c32.gpu->kk : &c32.host.kk;
  bufs s32, sq;
  bufs_alloc(&s32, &c32.op);
  const int(*steps)[2] = gpu ? g_gpu_steps : g_steps;
  int nsteps = gpu ? 2 : NSTEPS;
  for (int v = 0; v < nvars; v++) {
    chain_kernel cq = {.op = *k32};
    cq.op.prog.tensors = cq.op.tensors;
    for (int i = 0; i < nin; i++) {
      ir_tensor *t = &cq.op.tensors[i];
      if (vars[v].dt[i] == PLAN_F32 || t->dtype == PLAN_I32)
        continue;
      ck_assert_int_eq(t->dtype, PLAN_F32);
      uint64_t dims[IR_MAXDIM];
      for (int j = 0; j < t->ndim; j++)
        dims[j] = (uint64_t)t->dim[j];
      t->dtype = vars[v].dt[i];
      t->bytes = (int64_t)plan_tensor_bytes(t->dtype, (uint32_t)t->ndim, dims);
      ck_assert_int_gt(t->bytes, 0);
    }
    chain_build(&cq, gpu);
    const kgen_kernel *kq = gpu ? &cq.gpu->kk : &cq.host.kk;
    ck_assert_uint_eq(kq->grid, kk32->grid);
    ck_assert_str_ne(kq->symbol, kk32->symbol);
    for (int i = 0; i < nin; i++) {
      uint32_t dt = cq.op.tensors[i].dtype;
      if (dt != PLAN_F8E4M3 && dt != PLAN_MXFP4)
        continue;
      char want[64];
      snprintf(want, sizeof want, "_DT ((int64_t)%u)\n", dt);
      ck_assert_msg(strstr(kq->source, want) != NULL, "%s lacks \"%s\"", kq->symbol, want);
      if (gpu)
        ck_assert_ptr_nonnull(strstr(kq->source, dt == PLAN_F8E4M3 ? "_T ds4_f8e4m3\n" : "_T ds4_mxfp4\n"));
    }
    bufs_alloc(&sq, &cq.op);
    char dtypes[128] = "";
    for (int i = 0; i < nin; i++)
      snprintf(dtypes + strlen(dtypes), sizeof dtypes - strlen(dtypes), "%s%s", i ? " " : "",
               plan_dtype_name(cq.op.tensors[i].dtype));
    int finite = 0;
    for (int st = 0; st < nsteps; st++) {
      int pos = steps[st][0], ntok = steps[st][1];
      for (int i = 0; i < nin; i++) {
        const ir_tensor *t = &cq.op.tensors[i];
        int64_t n = kt_elems(&c32.op, i);
        if (t->dtype == PLAN_F8E4M3 || t->dtype == PLAN_MXFP4) {
          quant_fill(sq.b[i], s32.b[i], t->dtype, t, vars[v].special);
        } else if (t->dtype == PLAN_BF16) {
          for (int64_t j = 0; j < n; j++) {
            ((uint16_t *)sq.b[i])[j] = bf16_of((float)rnd());
            ((float *)s32.b[i])[j] = (float)bf16_value(((uint16_t *)sq.b[i])[j]);
          }
        } else {
          if (t->dtype == PLAN_I32)
            for (int64_t j = 0; j < n; j++)
              ((int32_t *)s32.b[i])[j] = rnd_index(ibound);
          else
            fill_f32(s32.b[i], n, 1.0);
          memcpy(sq.b[i], s32.b[i], (size_t)t->bytes);
        }
      }
      for (int o = nin; o < nbuf; o++) {
        fill_garbage(s32.b[o], kt_elems(&c32.op, o));
        fill_garbage(sq.b[o], kt_elems(&c32.op, o));
      }
      if (gpu) { /* slow: each kernel once, in opposite block orders */
        chain_launch(&c32, &s32, pos, ntok, 0);
        chain_launch(&cq, &sq, pos, ntok, 1);
      } else {
        chain_run(&c32, &s32, pos, ntok);
        chain_run(&cq, &sq, pos, ntok);
      }
      for (int o = nin; o < nbuf; o++) {
        size_t n = (size_t)c32.op.tensors[o].bytes;
        if (!gpu)
          ck_assert_msg(memcmp(s32.b[o], sq.b[o], n) == 0,
                        "%s (host): output %d with inputs %s%s differs from the f32 kernel on the dequantized "
                        "values (pos %d, ntok %d)",
                        kq->symbol, o - nin, dtypes, vars[v].special ? ", special scales" : "", pos, ntok);
        else
          quant_close(s32.b[o], sq.b[o], n / 4, kq->symbol, o - nin, dtypes, vars[v].special, pos, ntok);
        const float *y = sq.b[o];
        for (size_t j = 0; j < n / 4; j++)
          finite += y[j] != 0.0f && isfinite(y[j]);
      }
      if (gpu) { /* off alignment: the same bits */
        void *shifted[IR_MAXIO * 2];
        for (int i = 0; i < nbuf; i++) {
          size_t n = (size_t)cq.op.tensors[i].bytes;
          char *raw = malloc(n + 16);
          ck_assert_ptr_nonnull(raw);
          shifted[i] = raw + 4;
          if (i < nin)
            memcpy(shifted[i], sq.b[i], n);
          else
            fill_garbage(shifted[i], kt_elems(&cq.op, i));
        }
        emu_run(cq.gpu, shifted, pos, ntok, 0);
        for (int o = nin; o < nbuf; o++)
          ck_assert_msg(memcmp(shifted[o], sq.b[o], (size_t)cq.op.tensors[o].bytes) == 0,
                        "%s: other bits with operands off 16-byte alignment (pos %d, ntok %d)", kq->symbol, pos,
                        ntok);
        for (int i = 0; i < nbuf; i++)
          free((char *)shifted[i] - 4);
      }
    }
    ck_assert_msg(finite > 0 || vars[v].special, "%s: no output finite and nonzero", kq->symbol);
    bufs_free(&sq);
    chain_unbuild(&cq);
  }
  bufs_free(&s32);
  chain_unbuild(&c32);
}

/* Every kind that takes a quantized weight, at small shapes whose weight
 * rows are multiples of 4 values (what the GPU kernels need; the host's
 * take any), as f32 ops: matmul over 150 columns (a partial tile; f8e4m3's
 * second row of blocks) and 136 inputs (a partial block of either dtype,
 * a partial chunk of 16 or 32 codes: the GPU reads every row a value at a
 * time); matmul_pair over 96 inputs and group_matmul (3 groups of 7
 * columns) over 64 a group, whole chunks (read 16 bytes at a time on the
 * GPU), f8e4m3's in one partial block; swiglu_ffn; moe_experts over all 5
 * experts and a split of two (rows out of expert order); moe_up and
 * moe_down over the split, with H 64 and F 96. The FFNs are clamped
 * (swiglu_limit 2), so that a special scale's large weights give finite
 * activations. Each with its weight slots (bit i: input i). */
#define NQOPS 8
static int g_quant_split[5] = {-1, 1, -1, 0, -1};

static unsigned quant_op(kt *k, int which)
{
  enum { T = 4, E = 5, K = 3, H = 64, F = 96 };
  switch (which) {
  case 0:
    kt_init(k, IR_OP_MATMUL);
    kt_add(k, 0, PLAN_F32, 2, (int64_t)T, (int64_t)136);
    kt_add(k, 0, PLAN_F32, 2, (int64_t)150, (int64_t)136);
    kt_add(k, 1, PLAN_F32, 2, (int64_t)T, (int64_t)150);
    return 1u << 1;
  case 1:
    pair_op(k, PLAN_F32, T, 96, 24, 40);
    return 1u << 1 | 1u << 2;
  case 2:
    kt_init(k, IR_OP_GROUP_MATMUL);
    k->op.iattr[0] = 3;
    kt_add(k, 0, PLAN_F32, 2, (int64_t)T, (int64_t)3 * 64);
    kt_add(k, 0, PLAN_F32, 2, (int64_t)21, (int64_t)64);
    kt_add(k, 1, PLAN_F32, 2, (int64_t)T, (int64_t)21);
    return 1u << 1;
  case 3:
    kt_init(k, IR_OP_SWIGLU_FFN);
    k->op.fattr[0] = 2.0;
    kt_add(k, 0, PLAN_F32, 2, (int64_t)T, (int64_t)H);
    kt_add(k, 0, PLAN_F32, 2, (int64_t)F, (int64_t)H);
    kt_add(k, 0, PLAN_F32, 2, (int64_t)F, (int64_t)H);
    kt_add(k, 0, PLAN_F32, 2, (int64_t)H, (int64_t)F);
    kt_add(k, 1, PLAN_F32, 2, (int64_t)T, (int64_t)H);
    return 1u << 1 | 1u << 2 | 1u << 3;
  case 4:
  case 5: {
    int split = which == 5;
    int64_t rows = split ? 2 : E;
    kt_init(k, IR_OP_MOE_EXPERTS);
    k->op.fattr[0] = 2.0;
    if (split) {
      k->op.expert_row = g_quant_split;
      k->op.nexperts = E;
    }
    kt_add(k, 0, PLAN_F32, 2, (int64_t)T, (int64_t)H);
    kt_add(k, 0, PLAN_I32, 2, (int64_t)T, (int64_t)K);
    kt_add(k, 0, PLAN_F32, 3, rows, (int64_t)F, (int64_t)H);
    kt_add(k, 0, PLAN_F32, 3, rows, (int64_t)F, (int64_t)H);
    kt_add(k, 0, PLAN_F32, 3, rows, (int64_t)H, (int64_t)F);
    kt_add(k, 1, PLAN_F32, 3, (int64_t)T, (int64_t)K, (int64_t)H);
    return 1u << 2 | 1u << 3 | 1u << 4;
  }
  case 6:
    kt_init(k, IR_OP_MOE_UP);
    k->op.expert_row = g_quant_split;
    k->op.nexperts = E;
    k->op.fattr[0] = 2.0;
    kt_add(k, 0, PLAN_F32, 2, (int64_t)T, (int64_t)H);
    kt_add(k, 0, PLAN_I32, 2, (int64_t)T, (int64_t)K);
    kt_add(k, 0, PLAN_F32, 3, (int64_t)2, (int64_t)F, (int64_t)H);
    kt_add(k, 0, PLAN_F32, 3, (int64_t)2, (int64_t)F, (int64_t)H);
    kt_add(k, 1, PLAN_F32, 3, (int64_t)T, (int64_t)K, (int64_t)F);
    return 1u << 2 | 1u << 3;
  default:
    kt_init(k, IR_OP_MOE_DOWN);
    k->op.expert_row = g_quant_split;
    k->op.nexperts = E;
    kt_add(k, 0, PLAN_F32, 3, (int64_t)T, (int64_t)K, (int64_t)F);
    kt_add(k, 0, PLAN_I32, 2, (int64_t)T, (int64_t)K);
    kt_add(k, 0, PLAN_F32, 3, (int64_t)2, (int64_t)H, (int64_t)F);
    kt_add(k, 1, PLAN_F32, 3, (int64_t)T, (int64_t)K, (int64_t)H);
    return 1u << 2;
  }
}

/* On the host: every kind, both dtypes, ordinary and special scales;
 * shapes only the host kernels take (rows of f8e4m3 not whole chunks of
 * 4, mxfp4 rows of 2 mod 4 values, a 3-D weight's matrices padded);
 * weights of different dtypes in one op (moe_up's gate f8e4m3 and up
 * mxfp4, a swiglu_ffn with a bf16 w2). */
START_TEST(test_quant_weights)
{
  qvariant vars[4];
  kt k;
  for (int which = 0; which < NQOPS; which++) {
    unsigned wslots = quant_op(&k, which);
    quant_case(&k, 5, 0, vars, qvariants(wslots, vars));
  }
  /* odd shapes: matmul over 37 (f8e4m3) and 38 (mxfp4) inputs, 130 rows
   * (f8e4m3: a block row of 2) */
  for (int fp4 = 0; fp4 < 2; fp4++) {
    kt_init(&k, IR_OP_MATMUL);
    kt_add(&k, 0, PLAN_F32, 2, (int64_t)4, (int64_t)(37 + fp4));
    kt_add(&k, 0, PLAN_F32, 2, (int64_t)130, (int64_t)(37 + fp4));
    kt_add(&k, 1, PLAN_F32, 2, (int64_t)4, (int64_t)130);
    qvariants(1u << 1, vars);
    quant_case(&k, 0, 0, vars + 2 * fp4, 2);
  }
  /* moe_experts of [3, 10, 6] and [3, 6, 10] mxfp4 matrices (30 code
   * bytes and 10 or 6 scale bytes each: a stride of 48, 8 and 12 bytes of
   * padding), both kinds of scales */
  kt_init(&k, IR_OP_MOE_EXPERTS);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)4, (int64_t)6);
  kt_add(&k, 0, PLAN_I32, 2, (int64_t)4, (int64_t)2);
  kt_add(&k, 0, PLAN_F32, 3, (int64_t)3, (int64_t)10, (int64_t)6);
  kt_add(&k, 0, PLAN_F32, 3, (int64_t)3, (int64_t)10, (int64_t)6);
  kt_add(&k, 0, PLAN_F32, 3, (int64_t)3, (int64_t)6, (int64_t)10);
  kt_add(&k, 1, PLAN_F32, 3, (int64_t)4, (int64_t)2, (int64_t)6);
  qvariants(1u << 2 | 1u << 3 | 1u << 4, vars);
  quant_case(&k, 3, 0, vars + 2, 2);
  /* mixed dtypes */
  quant_op(&k, 6);
  qvariant mix = {{PLAN_F32, PLAN_F32, PLAN_F8E4M3, PLAN_MXFP4}, 0};
  quant_case(&k, 5, 0, &mix, 1);
  quant_op(&k, 3);
  qvariant mix2 = {{PLAN_F32, PLAN_MXFP4, PLAN_F8E4M3, PLAN_BF16}, 1};
  quant_case(&k, 0, 0, &mix2, 1);
}
END_TEST

/* On the GPU (its kernels as host fibers), each kind against its own f32
 * kernel: quant_op's ops, f8e4m3 and mxfp4, ordinary and special scales
 * (so every path of the dequantization, one multiply and the exact
 * general one), in either block order and off alignment. */
static void gpu_quant_kinds(int from, int to)
{
  qvariant vars[4];
  kt k;
  for (int which = from; which < to; which++) {
    unsigned wslots = quant_op(&k, which);
    quant_case(&k, 5, 1, vars, qvariants(wslots, vars));
  }
}

START_TEST(test_gpu_quant_matmuls)
{
  gpu_quant_kinds(0, 3);
  /* rows of whole chunks over 16 f8e4m3 blocks (K 2048: 128 chunks of
   * f8e4m3, 64 of mxfp4, 4 and 2 a lane, in flight together) */
  kt k;
  kt_init(&k, IR_OP_MATMUL);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)3, (int64_t)2048);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)40, (int64_t)2048);
  kt_add(&k, 1, PLAN_F32, 2, (int64_t)3, (int64_t)40);
  qvariant all[4];
  quant_case(&k, 0, 1, all, qvariants(1u << 1, all));
  /* two columns a warp with x staged (8200 columns, K 32: one mxfp4 block
   * a row) */
  kt_init(&k, IR_OP_MATMUL);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)4, (int64_t)32);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)8200, (int64_t)32);
  kt_add(&k, 1, PLAN_F32, 2, (int64_t)4, (int64_t)8200);
  qvariant vars[4];
  qvariants(1u << 1, vars);
  vars[1] = vars[2]; /* f8e4m3 and mxfp4, ordinary scales */
  quant_case(&k, 0, 1, vars, 2);
  emu_stop();
}
END_TEST

/* Where a matmul of quantized weights stages its row of x (kgen_gpu.c,
 * KGEN_GPU_STAGE_QUANTIZED): from rows of 1024 floats, whatever its
 * columns, in shared memory of the row's bytes; below, and for bf16
 * weights of few columns, x is read as it goes. */
START_TEST(test_gpu_quant_stages_x)
{
  const struct {
    uint32_t dt;
    int64_t k;
    int staged;
  } cases[] = {{PLAN_F8E4M3, 1024, 1}, {PLAN_MXFP4, 1024, 1}, {PLAN_F8E4M3, 8192, 1},
               {PLAN_F8E4M3, 1020, 0}, {PLAN_MXFP4, 512, 0},   {PLAN_BF16, 1024, 0}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    kt k;
    kt_init(&k, IR_OP_MATMUL);
    kt_add(&k, 0, PLAN_F32, 2, (int64_t)1, cases[i].k);
    kt_add(&k, 0, cases[i].dt, 2, (int64_t)40, cases[i].k);
    kt_add(&k, 1, PLAN_F32, 2, (int64_t)1, (int64_t)40);
    kgen_kernel kk;
    dsl_diag d = {0};
    ck_assert_msg(kgen_gpu(&k.prog, &k.op, &kk, &d) == 0, "kgen_gpu: %s", d.msg);
    ck_assert_msg(strstr(kk.source, cases[i].staged ? "#define X_SHARED 1\n" : "#define X_SHARED 0\n") != NULL,
                  "%s K %lld: X_SHARED is not %d", plan_dtype_name(cases[i].dt), (long long)cases[i].k,
                  cases[i].staged);
    ck_assert_uint_eq(kk.shared, cases[i].staged ? (uint64_t)cases[i].k * 4 : 0);
    kgen_kernel_free(&kk);
  }
}
END_TEST

START_TEST(test_gpu_quant_ffn)
{
  gpu_quant_kinds(3, NQOPS);
  /* the shared expert in two chunks of ffn rows (2048 and 52): the second
   * chunk's part of a w2 row starts at its scale block 16 (f8e4m3) or 64
   * (mxfp4); w1 f8e4m3, w3 mxfp4, w2 either */
  kt k;
  kt_init(&k, IR_OP_SWIGLU_FFN);
  k.op.fattr[0] = 1.0;
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)2, (int64_t)16);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)2100, (int64_t)16);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)2100, (int64_t)16);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)16, (int64_t)2100);
  kt_add(&k, 1, PLAN_F32, 2, (int64_t)2, (int64_t)16);
  qvariant two[2] = {{{PLAN_F32, PLAN_F8E4M3, PLAN_MXFP4, PLAN_F8E4M3}, 0},
                     {{PLAN_F32, PLAN_F8E4M3, PLAN_MXFP4, PLAN_MXFP4}, 1}};
  quant_case(&k, 0, 1, two, 2);
  /* moe_up with its gate and up rows of different dtypes: one row each at
   * a time, not two together */
  quant_op(&k, 6);
  qvariant mix = {{PLAN_F32, PLAN_F32, PLAN_MXFP4, PLAN_F8E4M3}, 1};
  quant_case(&k, 5, 1, &mix, 1);
  emu_stop();
}
END_TEST

/* ---- swiglu_act against swiglu_ffn, and on the GPU ---- */

/* swiglu_ffn whose weights pass g and u through unchanged: x[t] = [g[t],
 * u[t]], w1 = [I 0], w3 = [0 I], w2 = [I; 0] (sums of one product by 1 and
 * products by 0, exact), so y[t] = [act(g[t], u[t]), 0]: its activation. */
static void identity_ffn_op(kt *k, int64_t T, int64_t F, double limit)
{
  kt_init(k, IR_OP_SWIGLU_FFN);
  k->op.fattr[0] = limit;
  kt_add(k, 0, PLAN_F32, 2, T, 2 * F);
  kt_add(k, 0, PLAN_F32, 2, F, 2 * F);
  kt_add(k, 0, PLAN_F32, 2, F, 2 * F);
  kt_add(k, 0, PLAN_F32, 2, 2 * F, F);
  kt_add(k, 1, PLAN_F32, 2, T, 2 * F);
}

static void identity_ffn_fill(bufs *ffn, const bufs *act, int64_t T, int64_t F)
{
  float *x = ffn->b[0], *w1 = ffn->b[1], *w3 = ffn->b[2], *w2 = ffn->b[3];
  memset(w1, 0, (size_t)(F * 2 * F) * 4);
  memset(w3, 0, (size_t)(F * 2 * F) * 4);
  memset(w2, 0, (size_t)(2 * F * F) * 4);
  for (int64_t f = 0; f < F; f++) {
    w1[f * 2 * F + f] = 1.0f;
    w3[f * 2 * F + F + f] = 1.0f;
    w2[f * F + f] = 1.0f;
  }
  for (int64_t t = 0; t < T; t++) {
    memcpy(x + t * 2 * F, (const float *)act->b[0] + t * F, (size_t)F * 4);
    memcpy(x + t * 2 * F + F, (const float *)act->b[1] + t * F, (size_t)F * 4);
  }
}

/* swiglu_act's bits are swiglu_ffn's activation's, on the host and (run
 * as host fibers) on the GPU: one prelude helper computes both. */
static void act_is_ffn_case(int gpu, double limit)
{
  enum { T = 4, F = 40 };
  chain_kernel act = {0}, ffn = {0};
  swiglu_act_op(&act.op, T, F, limit);
  identity_ffn_op(&ffn.op, T, F, limit);
  chain_build(&act, gpu);
  chain_build(&ffn, gpu);
  bufs ba, bf;
  bufs_alloc(&ba, &act.op);
  bufs_alloc(&bf, &ffn.op);
  for (int s = 0; s < 2; s++) {
    int pos = g_gpu_steps[s][0], ntok = g_gpu_steps[s][1];
    fill_f32(ba.b[0], T * F, 3.0 * limit + 2.0);
    fill_f32(ba.b[1], T * F, 3.0 * limit + 2.0);
    fill_garbage(ba.b[2], T * F);
    identity_ffn_fill(&bf, &ba, T, F);
    fill_garbage(bf.b[4], T * 2 * F);
    chain_launch(&act, &ba, pos, ntok, 0);
    chain_launch(&ffn, &bf, pos, ntok, 0);
    const float *a = ba.b[2], *y = bf.b[4];
    for (int64_t t = 0; t < T; t++) {
      ck_assert_msg(memcmp(a + t * F, y + t * 2 * F, (size_t)F * 4) == 0,
                    "swiglu_act (%s, limit %g): row %lld differs from swiglu_ffn's activation",
                    gpu ? "GPU" : "host", limit, (long long)t);
      for (int64_t f = F; f < 2 * F; f++)
        ck_assert_msg(y[t * 2 * F + f] == 0.0f, "identity swiglu_ffn: y[%lld,%lld] is %g", (long long)t,
                      (long long)f, (double)y[t * 2 * F + f]);
    }
  }
  bufs_free(&ba);
  bufs_free(&bf);
  chain_unbuild(&act);
  chain_unbuild(&ffn);
}

START_TEST(test_swiglu_act_is_ffn)
{
  act_is_ffn_case(0, 0.0);
  act_is_ffn_case(0, 1.0);
}
END_TEST

/* The GPU kernel (as host fibers) against the host's: within REL_TOL (the
 * prelude's exp is not libm's), zeros exact, the same bits off 16-byte
 * alignment; and swiglu_ffn's activation's bits on the GPU too (a NaN is
 * test_gpu_route_math's). */
START_TEST(test_gpu_act)
{
  kt k;
  swiglu_act_op(&k, 4, 300, 0.5);
  ffn_gpu_case(&k, NULL, 0, g_gpu_steps, 2);
  swiglu_act_op(&k, 4, 40, 0.0);
  ffn_gpu_case(&k, NULL, 0, g_gpu_steps, 2);
  act_is_ffn_case(1, 0.0);
  act_is_ffn_case(1, 1.0);
  emu_stop();
}
END_TEST

/* moe_experts, swiglu_ffn and group_matmul on the GPU (their kernels run
 * as host fibers) against the host kernels: every slot skipped or dead
 * +0, the clamp, a split launch, f32 and bf16 weights, rows loaded 16
 * bytes at a time and (off alignment, or not whole chunks) not, and ffn
 * rows in two chunks. */
START_TEST(test_gpu_ffn)
{
  static int split[5] = {1, -1, -1, 2, 0}; /* experts 4, 0, 3 in rows 0, 1, 2 */
  moe_gpu_case(NULL, PLAN_F32, 0.0);
  moe_gpu_case(split, PLAN_BF16, 2.0);

  /* The shared expert: ffn rows 2048 and 52 (two chunks), bf16 gate and
   * up, an f32 down projection; one live slot of two. */
  static const int one[][2] = {{5, 1}};
  kt k;
  kt_init(&k, IR_OP_SWIGLU_FFN);
  k.op.fattr[0] = 1.0;
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)2, (int64_t)16);
  kt_add(&k, 0, PLAN_BF16, 2, (int64_t)2100, (int64_t)16);
  kt_add(&k, 0, PLAN_BF16, 2, (int64_t)2100, (int64_t)16);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)16, (int64_t)2100);
  kt_add(&k, 1, PLAN_F32, 2, (int64_t)2, (int64_t)16);
  ffn_gpu_case(&k, NULL, 0, one, 1);
  /* x too large to stage in shared memory beside the activations (48 KiB
   * a block): read from global memory. */
  kt_init(&k, IR_OP_SWIGLU_FFN);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)1, (int64_t)12300);
  kt_add(&k, 0, PLAN_BF16, 2, (int64_t)8, (int64_t)12300);
  kt_add(&k, 0, PLAN_BF16, 2, (int64_t)8, (int64_t)12300);
  kt_add(&k, 0, PLAN_BF16, 2, (int64_t)12300, (int64_t)8);
  kt_add(&k, 1, PLAN_F32, 2, (int64_t)1, (int64_t)12300);
  kgen_kernel kk;
  dsl_diag d = {0};
  ck_assert_msg(kgen_gpu(&k.prog, &k.op, &kk, &d) == 0, "kgen_gpu: %s", d.msg);
  ck_assert_ptr_nonnull(strstr(kk.source, "#define X_SHARED 0\n"));
  ck_assert_uint_eq(kk.shared, 32); /* act alone */
  kgen_kernel_free(&kk);
  ffn_gpu_case(&k, NULL, 0, one, 1);

  /* o_a: 3 groups of 7 columns (a partial tile of 8), rows of 10 f32 (not
   * whole chunks) and of 16 bf16. */
  static const struct {
    int64_t kg;
    uint32_t wt;
  } oa[] = {{10, PLAN_F32}, {16, PLAN_BF16}};
  for (size_t i = 0; i < sizeof oa / sizeof oa[0]; i++) {
    kt_init(&k, IR_OP_GROUP_MATMUL);
    k.op.iattr[0] = 3;
    kt_add(&k, 0, PLAN_F32, 2, (int64_t)4, 3 * oa[i].kg);
    kt_add(&k, 0, oa[i].wt, 2, (int64_t)21, oa[i].kg);
    kt_add(&k, 1, PLAN_F32, 2, (int64_t)4, (int64_t)21);
    ffn_gpu_case(&k, NULL, 0, g_gpu_steps, 2);
  }
  emu_stop();
}
END_TEST

/* matmul on the GPU against the host kernel: a block takes its tile of
 * columns for every slot (dead slots +0), f32 and bf16 weights, a partial
 * last tile; rope, a block per slot and head, the copied and the rotated
 * channels, forward and inverse. */
START_TEST(test_gpu_matmul)
{
  static const struct {
    int64_t k, n;
    uint32_t wt;
  } mm[] = {{40, 21, PLAN_F32}, {64, 19, PLAN_BF16}, {10, 8, PLAN_F32}};
  kt k;
  for (size_t i = 0; i < sizeof mm / sizeof mm[0]; i++) {
    kt_init(&k, IR_OP_MATMUL);
    kt_add(&k, 0, PLAN_F32, 2, (int64_t)4, mm[i].k);
    kt_add(&k, 0, mm[i].wt, 2, mm[i].n, mm[i].k);
    kt_add(&k, 1, PLAN_F32, 2, (int64_t)4, mm[i].n);
    ffn_gpu_case(&k, NULL, 0, g_gpu_steps, 2);
  }
  rope_op(&k, 3, 40, 16, 10000.0, 0, NULL);
  ffn_gpu_case(&k, NULL, 0, g_gpu_steps, 2);
  rope_op(&k, 2, 64, 64, 160000.0, 1, g_ds4_yarn);
  ffn_gpu_case(&k, NULL, 0, g_gpu_steps, 2);
  emu_stop();
}
END_TEST

/* ---- matmul on the matrix units (kgen.c, kgen_matmul_mma) ---- */

/* x as the matrix units take it: the bf16 hi and the bf16 of the rest. */
static double mma_x(float x)
{
  double hi = bf16_value(bf16_of(x));
  return hi + bf16_value(bf16_of((float)((double)x - hi)));
}

/* Define name of the GPU kernel kgen_gpu makes for k (0 where it has
 * none), and in *tiled whether the kernel is matmul_tiled.hip's. */
static int mma_define(const kt *k, const char *name, int *tiled)
{
  kgen_kernel g;
  dsl_diag d = {0};
  ck_assert_msg(kgen_gpu(&k->prog, &k->op, &g, &d) == 0, "kgen_gpu: %s", d.msg);
  char pat[64];
  snprintf(pat, sizeof pat, "#define %s ((int64_t)", name);
  const char *def = strstr(g.source, pat);
  int v = def ? atoi(def + strlen(pat)) : 0;
  *tiled = strstr(g.source, "ds4_tiled_sums<") != NULL;
  kgen_kernel_free(&g);
  return v;
}

/* The kernel kgen_gpu makes for k: MMA_NT tiles of 8 a block of
 * matmul_mma.hip or moe_mma.hip, 0 for the CUDA-core template. */
static int mma_tiles(const kt *k)
{
  int tiled, nt = mma_define(k, "MMA_NT", &tiled);
  ck_assert_msg(!tiled, "%d slots: the tiled kernel", (int)k->tensors[0].dim[0]);
  return nt;
}

/* Every live output of k's GPU kernel (run on the host, every slot live)
 * against float64 on the operands as the units take them (x as hi + lo,
 * w's bf16): within the f32 sums' own error, (2 K + 16) units of 2^-24 of
 * the sum of the terms' magnitudes, far below what a wrong k, row or slot
 * would move it. */
static void mma_exact_case(const kt *k)
{
  /* a group_matmul's column n reads x's channels (n / NG) * K and up */
  int64_t T = k->tensors[0].dim[0], KX = k->tensors[0].dim[1], K = k->tensors[1].dim[1], N = k->tensors[1].dim[0];
  int64_t NG = k->op.kind == IR_OP_GROUP_MATMUL ? N / k->op.iattr[0] : N;
  emu_built *g = emu_build(k);
  bufs bs;
  bufs_alloc(&bs, k);
  ffn_fill(k, &bs, NULL, 0);
  emu_run(g, bs.b, 0, (int)T, 0);
  const float *x = bs.b[0], *y = bs.b[2];
  const uint16_t *w = bs.b[1];
  for (int64_t t = 0; t < T; t++)
    for (int64_t n = 0; n < N; n++) {
      double ref = 0.0, mag = 0.0;
      for (int64_t kk = 0; kk < K; kk++) {
        double term = mma_x(x[t * KX + n / NG * K + kk]) * bf16_value(w[n * K + kk]);
        ref += term;
        mag += fabs(term);
      }
      double err = fabs(y[t * N + n] - ref), bound = (2.0 * K + 16.0) * 0x1p-24 * mag;
      ck_assert_msg(err <= bound, "%s: y[%lld,%lld] = %.9g, float64 %.9g (error %.3g over the bound %.3g)",
                    g->kk.symbol, (long long)t, (long long)n, (double)y[t * N + n], ref, err, bound);
    }
  bufs_free(&bs);
  emu_free(g);
}

/* Infinities and the largest finite values in x on the matrix units (k a
 * bf16 matmul of T >= 2 slots, N columns): slot 0 holds +inf, slot 1 a
 * value that would round past bf16's largest; each output as the host's
 * f32 sum gives it, an infinity of the same sign (or NaN with it), and a
 * finite value within REL_TOL, not the NaN of inf - inf. */
static void mma_extremes_case(const kt *k)
{
  int64_t K = k->tensors[0].dim[1], N = k->tensors[1].dim[0];
  chain_kernel host, dev;
  chain_start(&host, k, 0);
  chain_start(&dev, k, 1);
  bufs want, got;
  bufs_alloc(&want, k);
  bufs_alloc(&got, k);
  ffn_fill(k, &want, NULL, 0);
  ((float *)want.b[0])[3] = INFINITY;
  ((float *)want.b[0])[K + 5] = 3.4e38f;
  for (int i = 0; i < 2; i++)
    memcpy(got.b[i], want.b[i], (size_t)k->tensors[i].bytes);
  chain_run(&host, &want, 0, 2);
  chain_run(&dev, &got, 0, 2);
  const float *yh = want.b[2], *yg = got.b[2];
  for (int64_t n = 0; n < N; n++) {
    ck_assert_msg(isinf(yh[n]) ? yg[n] == yh[n] : isnan(yg[n]) && isnan(yh[n]),
                  "%s: column %lld of the slot with +inf: %g on the GPU, %g on the host", dev.gpu->kk.symbol,
                  (long long)n, (double)yg[n], (double)yh[n]);
    ck_assert_msg(isfinite(yg[N + n]) && fabs((double)yg[N + n] - yh[N + n]) <= REL_TOL * fabs((double)yh[N + n]),
                  "%s: column %lld of the slot with 3.4e38: %g on the GPU, %g on the host", dev.gpu->kk.symbol,
                  (long long)n, (double)yg[N + n], (double)yh[N + n]);
  }
  bufs_free(&want);
  bufs_free(&got);
  chain_unbuild(&host);
  chain_unbuild(&dev);
}

/* A matmul of T slots, x [T, K], w [N, K] of dtype wt; with groups > 0 a
 * group_matmul, x [T, groups * K], each group's N / groups columns
 * against its K channels. */
static void matmul_op(kt *k, uint32_t wt, int64_t groups, int64_t T, int64_t K, int64_t N)
{
  kt_init(k, groups ? IR_OP_GROUP_MATMUL : IR_OP_MATMUL);
  k->op.iattr[0] = groups;
  kt_add(k, 0, PLAN_F32, 2, T, groups ? groups * K : K);
  kt_add(k, 0, wt, 2, N, K);
  kt_add(k, 1, PLAN_F32, 2, T, N);
}

/* A bf16 matmul of T slots on matmul_mma.hip: tiles of KGEN_MMA_MROWS
 * (64) slots, the last partial (T under KGEN_TILED_SLOTS, or an op of
 * asked rows). */
static void mma_tiled_op(kt *k, int64_t T)
{
  matmul_op(k, PLAN_BF16, 0, T, 64, 40);
}

/* A bf16 matmul of several slots on the matrix units, against the host
 * kernel (dead slots +0, the same bits off 16-byte alignment) and against
 * float64: two 16s of slots and a partial tile of 8; fewer chunks of 32 k
 * than warps; chunks split unevenly over the warps (9 over 8) with four
 * tiles a block, the last partial; two blocks of slots a tile (three
 * with the asked rows, test_gpu_asked_rows); infinities and the largest
 * values in x. A group_matmul the same, each tile against its group's channels of
 * x: few columns, a tile of 8; many, a tile of 8 where 32 columns would
 * straddle two groups (NG 1032), and of 32 where they do not. The
 * CUDA-core kernel keeps a decode step's matmul (one slot), an f32 weight
 * and K off the chunks. */
START_TEST(test_gpu_matmul_mma)
{
  static const struct {
    int64_t t, k, n;
    int nt;
  } mm[] = {{20, 32, 21, 1}, {3, 288, 2050, 4}};
  static const int steps[][2] = {{0, 20}, {5, 17}, {2, 1}};
  for (size_t i = 0; i < sizeof mm / sizeof mm[0]; i++) {
    kt k;
    matmul_op(&k, PLAN_BF16, 0, mm[i].t, mm[i].k, mm[i].n);
    ck_assert_int_eq(mma_tiles(&k), mm[i].nt);
    ffn_gpu_case(&k, NULL, 0, steps, 3);
    mma_exact_case(&k);
  }
  /* two tiles of 64 slots, the last partial, the live slots ending in
   * the second (test_gpu_asked_rows: the asked rows) */
  static const int tiled_steps[][2] = {{0, 120}, {3, 100}};
  kt tiled;
  mma_tiled_op(&tiled, 120);
  ck_assert_int_eq(mma_tiles(&tiled), 1);
  ffn_gpu_case(&tiled, NULL, 0, tiled_steps, 2);
  mma_exact_case(&tiled);
  kt ext;
  matmul_op(&ext, PLAN_BF16, 0, 2, 64, 12);
  mma_extremes_case(&ext);
  static const struct {
    int64_t groups, kg, ng;
    int nt;
  } gm[] = {{3, 64, 40, 1}, {2, 64, 1032, 1}, {2, 96, 1056, 4}};
  for (size_t i = 0; i < sizeof gm / sizeof gm[0]; i++) {
    kt k;
    matmul_op(&k, PLAN_BF16, gm[i].groups, 18, gm[i].kg, gm[i].groups * gm[i].ng);
    ck_assert_int_eq(mma_tiles(&k), gm[i].nt);
    ffn_gpu_case(&k, NULL, 0, steps, 3);
    mma_exact_case(&k);
  }
  static const struct {
    int64_t t, k;
    uint32_t wt;
  } cuda_cores[] = {{1, 64, PLAN_BF16}, {4, 64, PLAN_F32}, {4, 48, PLAN_BF16}};
  for (size_t i = 0; i < sizeof cuda_cores / sizeof cuda_cores[0]; i++) {
    kt k;
    matmul_op(&k, cuda_cores[i].wt, 0, cuda_cores[i].t, cuda_cores[i].k, 2100);
    ck_assert_int_eq(mma_tiles(&k), 0);
  }
  emu_stop();
}
END_TEST

/* ---- the tiled matmuls on the matrix units (kgen.c, kgen_matmul_tiles) ---- */

/* k's tiled kernel (matmul_tiled.hip): its 16s of slots a warp, MMA_MT,
 * and 8s of columns, MMA_NT. */
static void tiled_shape(const kt *k, int mt, int nt)
{
  int tiled;
  ck_assert_int_eq(mma_define(k, "MMA_MT", &tiled), mt);
  ck_assert_msg(tiled, "not the tiled kernel");
  ck_assert_int_eq(mma_define(k, "MMA_NT", &tiled), nt);
}

/* k (tiled, every slot live) against the same op of `fewer` slots, which
 * runs on matmul_mma.hip or moe_mma.hip, on the same first rows of x (and
 * of idx, from the n values of idx): the same bits in every output of
 * those rows. */
static void tiled_mma_bits(const kt *k, int64_t fewer, const int32_t *idx, int n)
{
  kt small = *k;
  small.prog.tensors = small.tensors;
  for (int i = 0; i < small.prog.ntensors; i++)
    if (small.tensors[i].dtype != PLAN_BF16) { /* not a weight: slots first */
      small.tensors[i].bytes = small.tensors[i].bytes / small.tensors[i].dim[0] * fewer;
      small.tensors[i].dim[0] = fewer;
    }
  ck_assert_int_gt(mma_tiles(&small), 0);
  emu_built *gt = emu_build(k), *gs = emu_build(&small);
  bufs bt, bsm;
  bufs_alloc(&bt, k);
  bufs_alloc(&bsm, &small);
  ffn_fill(k, &bt, idx, n);
  ffn_fill(&small, &bsm, idx, n);
  for (int i = 0; i < k->op.nin; i++)
    memcpy(bsm.b[i], bt.b[i], (size_t)small.tensors[i].bytes);
  emu_run(gt, bt.b, 0, (int)k->tensors[0].dim[0], 0);
  emu_run(gs, bsm.b, 0, (int)fewer, 0);
  for (int o = k->op.nin; o < k->prog.ntensors; o++)
    ck_assert_msg(memcmp(bt.b[o], bsm.b[o], (size_t)small.tensors[o].bytes) == 0,
                  "%s: output %d of the first %lld slots differs from %s's", gt->kk.symbol, o - k->op.nin,
                  (long long)fewer, gs->kk.symbol);
  bufs_free(&bt);
  bufs_free(&bsm);
  emu_free(gt);
  emu_free(gs);
}

/* Chunks of 130 slots and more take the tiled kernel, each case against
 * the host kernel (every slot live, the live slots ending inside a tile,
 * starting past the first: bits the same off 16-byte alignment), against
 * float64, and bit for bit against matmul_mma.hip on the same rows: K of
 * one chunk of 32 (seven of the eight runs empty), of nine (runs of one
 * and two chunks); tiles of 64 and 128 slots and of 64 and 128 columns,
 * the last of each partial; a pair (its parts' tiles), a group_matmul
 * whose groups take whole tiles of 64 and of 128 columns. An op of asked
 * rows and a chunk under KGEN_TILED_SLOTS keep matmul_mma.hip. */
START_TEST(test_gpu_matmul_tiled)
{
  static const int steps[][2] = {{0, 130}, {3, 70}};
  static const struct {
    int64_t t, k, n;
    int mt, nt;
  } mm[] = {{130, 32, 200, 2, 4}, {130, 288, 70, 2, 4}, {128, 64, 16384, 4, 4}};
  for (size_t i = 0; i < sizeof mm / sizeof mm[0]; i++) {
    kt k;
    matmul_op(&k, PLAN_BF16, 0, mm[i].t, mm[i].k, mm[i].n);
    tiled_shape(&k, mm[i].mt, mm[i].nt);
    if (mm[i].t >= steps[0][1])
      ffn_gpu_case(&k, NULL, 0, steps, 2);
    mma_exact_case(&k);
    tiled_mma_bits(&k, 100, NULL, 0);
  }
  kt pair;
  pair_op(&pair, PLAN_BF16, 130, 96, 150, 40);
  tiled_shape(&pair, 2, 4);
  ffn_gpu_case(&pair, NULL, 0, steps, 2);
  tiled_mma_bits(&pair, 40, NULL, 0);
  static const struct {
    int64_t groups, kg, ng;
    int nt;
  } gm[] = {{2, 64, 128, 4}, {3, 96, 64, 2}};
  for (size_t i = 0; i < sizeof gm / sizeof gm[0]; i++) {
    kt k;
    matmul_op(&k, PLAN_BF16, gm[i].groups, 130, gm[i].kg, gm[i].groups * gm[i].ng);
    tiled_shape(&k, 2, gm[i].nt);
    ffn_gpu_case(&k, NULL, 0, steps, 2);
    mma_exact_case(&k);
    tiled_mma_bits(&k, 20, NULL, 0);
  }
  kt k;
  matmul_op(&k, PLAN_BF16, 0, 130, 64, 72);
  k.op.asked_rows = 1;
  ck_assert_int_eq(mma_tiles(&k), 1);
  k.op.asked_rows = 0;
  k.tensors[0].dim[0] = k.tensors[2].dim[0] = 127;
  ck_assert_int_eq(mma_tiles(&k), 1);
  matmul_op(&k, PLAN_BF16, 4, 130, 64, 4 * 32); /* groups of 32 columns: no whole tile */
  ck_assert_int_eq(mma_tiles(&k), 1);
  emu_stop();
}
END_TEST

/* ---- moe_up and moe_down on the matrix units (kgen.c, kgen_moe_mma) ---- */

/* moe_up (up) or moe_down of T slots and top-K over weights of dtype wt
 * and held rows, the launch holding the experts of rows (NULL: all
 * nexp). */
static void moe_mma_op(kt *k, int up, uint32_t wt, int *rows, int nexp, int64_t held, int64_t T, int64_t K, int64_t H,
                       int64_t F)
{
  kt_init(k, up ? IR_OP_MOE_UP : IR_OP_MOE_DOWN);
  if (rows) {
    k->op.expert_row = rows;
    k->op.nexperts = nexp;
  }
  if (up) {
    kt_add(k, 0, PLAN_F32, 2, T, H);
    kt_add(k, 0, PLAN_I32, 2, T, K);
    kt_add(k, 0, wt, 3, held, F, H);
    kt_add(k, 0, wt, 3, held, F, H);
    kt_add(k, 1, PLAN_F32, 3, T, K, F);
  } else {
    kt_add(k, 0, PLAN_F32, 3, T, K, F);
    kt_add(k, 0, PLAN_I32, 2, T, K);
    kt_add(k, 0, wt, 3, held, H, F);
    kt_add(k, 1, PLAN_F32, 3, T, K, H);
  }
}

/* x . w over n as the units take it (x as hi + lo, w's bf16), in float64;
 * *mag gets the sum of the terms' magnitudes. */
static double mma_dot(const float *x, const uint16_t *w, int64_t n, double *mag)
{
  double sum = 0.0;
  *mag = 0.0;
  for (int64_t i = 0; i < n; i++) {
    double term = mma_x(x[i]) * bf16_value(w[i]);
    sum += term;
    *mag += fabs(term);
  }
  return sum;
}

/* k's GPU kernel (every slot live, idx of n entries) against float64: a
 * slot whose expert the launch holds within the f32 sums' own error
 * (mma_exact_case's bound; for moe_up's activation silu(g) u, that bound
 * on g and on u carried through the product's slopes, and 2^-20 of the
 * activation for the f32 silu), every other slot +0. */
static void moe_mma_exact_case(const kt *k, const int32_t *idx, int n, const int *rows, int nexp)
{
  int up = k->op.kind == IR_OP_MOE_UP;
  int64_t T = k->tensors[1].dim[0], K = k->tensors[1].dim[1];
  int64_t N = k->tensors[2].dim[1], KW = k->tensors[2].dim[2]; /* a weight row's outputs and length */
  emu_built *g = emu_build(k);
  bufs bs;
  bufs_alloc(&bs, k);
  ffn_fill(k, &bs, idx, n);
  emu_run(g, bs.b, 0, (int)T, 0);
  const float *x = bs.b[0], *y = bs.b[up ? 4 : 3];
  const uint16_t *w1 = bs.b[2], *w3 = bs.b[3];
  for (int64_t s = 0; s < T * K; s++) {
    int32_t e = idx[s % n];
    int r = e >= 0 && e < nexp ? (rows ? rows[e] : e) : -1;
    const float *xr = x + (up ? s / K : s) * KW;
    for (int64_t c = 0; c < N; c++) {
      float got = y[s * N + c];
      if (r < 0) {
        uint32_t bits;
        memcpy(&bits, &got, 4);
        ck_assert_msg(bits == 0, "%s: slot %lld (expert %d, not held) output %lld is %g, not +0", g->kk.symbol,
                      (long long)s, e, (long long)c, (double)got);
        continue;
      }
      double mag1, mag3 = 0.0, ref, bound;
      double d1 = mma_dot(xr, w1 + ((int64_t)r * N + c) * KW, KW, &mag1);
      double eps = (2.0 * KW + 16.0) * 0x1p-24;
      if (up) {
        double u = mma_dot(xr, w3 + ((int64_t)r * N + c) * KW, KW, &mag3);
        double sig = 1.0 / (1.0 + exp(-d1)), silu = d1 * sig;
        ref = silu * u;
        /* d/dg silu(g) = sig (1 + g (1 - sig)), below 1.1 in magnitude */
        bound = eps * (1.1 * fabs(u) * mag1 + fabs(silu) * mag3) + 0x1p-20 * fabs(ref);
      } else {
        ref = d1;
        bound = eps * mag1;
      }
      ck_assert_msg(fabs(got - ref) <= bound,
                    "%s: slot %lld (expert %d) output %lld = %.9g, float64 %.9g (error %.3g over the bound %.3g)",
                    g->kk.symbol, (long long)s, e, (long long)c, (double)got, ref, fabs(got - ref), bound);
    }
  }
  bufs_free(&bs);
  emu_free(g);
}

/* A moe_down split between two launches as a schedule splits the experts
 * (part a holding experts 0 and 2, part b 1, 3 and 4, each its rows of
 * the whole w2): for every slot one part's output and the other's +0,
 * summed, are the whole launch's bits. */
static void moe_mma_split_case(const int32_t *idx, int n, int64_t T, int64_t K, int64_t H, int64_t F)
{
  static int rows_a[5] = {0, -1, 1, -1, -1}, rows_b[5] = {-1, 0, -1, 1, 2};
  static const int from_a[2] = {0, 2}, from_b[3] = {1, 3, 4};
  kt whole, part[2];
  moe_mma_op(&whole, 0, PLAN_BF16, NULL, 5, 5, T, K, H, F);
  moe_mma_op(&part[0], 0, PLAN_BF16, rows_a, 5, 2, T, K, H, F);
  moe_mma_op(&part[1], 0, PLAN_BF16, rows_b, 5, 3, T, K, H, F);
  bufs bw, bp[2];
  bufs_alloc(&bw, &whole);
  ffn_fill(&whole, &bw, idx, n);
  emu_built *g = emu_build(&whole);
  emu_run(g, bw.b, 0, (int)T, 0);
  emu_free(g);
  size_t mat = (size_t)(H * F) * 2;
  for (int p = 0; p < 2; p++) {
    bufs_alloc(&bp[p], &part[p]);
    memcpy(bp[p].b[0], bw.b[0], (size_t)whole.tensors[0].bytes);
    memcpy(bp[p].b[1], bw.b[1], (size_t)whole.tensors[1].bytes);
    for (int i = 0; i < (p ? 3 : 2); i++)
      memcpy((char *)bp[p].b[2] + (size_t)i * mat, (const char *)bw.b[2] + (size_t)(p ? from_b : from_a)[i] * mat,
             mat);
    fill_garbage(bp[p].b[3], kt_elems(&part[p], 3));
    g = emu_build(&part[p]);
    emu_run(g, bp[p].b, 0, (int)T, 0);
    emu_free(g);
  }
  const float *yw = bw.b[3], *ya = bp[0].b[3], *yb = bp[1].b[3];
  for (int64_t i = 0; i < T * K * H; i++) {
    float sum = ya[i] + yb[i];
    ck_assert_msg(memcmp(&sum, &yw[i], 4) == 0, "moe_down split: element %lld is %a + %a, the whole launch's %a",
                  (long long)i, (double)ya[i], (double)yb[i], (double)yw[i]);
  }
  bufs_free(&bw);
  bufs_free(&bp[0]);
  bufs_free(&bp[1]);
}

/* moe_up and moe_down of 20 slots at top-3 over 5 experts on the matrix
 * units: expert 0 in every third choice (20 slots: two 16s, 17 and one
 * at the partial steps), 1 to 3 in others, expert 4 in none, and ids that
 * name no expert (-1, 5, INT32_MIN); moe_up's 96 ffn rows in tiles of 16
 * gate and 16 up rows, K 64 (fewer chunks than warps), moe_down's 64
 * channels in tiles of 32, K 96. Each against its host kernel (dead and
 * unheld slots +0, the same bits off 16-byte alignment), against float64
 * with all experts and with a split's rows, and a split moe_down summing
 * to the whole bit for bit. An expert chosen more often than a pass
 * lists (KGEN_MOE_MMA_LIST, 4096): 1400 slots at top-3 over 140 experts
 * (under 32 choices an expert, so not tiled), 4199 of the choices expert
 * 0's, in two passes. The CUDA-core kernels keep one slot (decode), f32
 * weights and K off the chunks; however few choices an expert gets in a
 * chunk of several slots, the units take them (the bits must not depend
 * on the chunk's size). */
START_TEST(test_gpu_moe_mma)
{
  enum { T = 20, K = 3, E = 5, H = 64, F = 96 };
  static int split[E] = {1, -1, -1, 2, 0}; /* experts 4, 0, 3 in rows 0, 1, 2 */
  static const int steps[][2] = {{0, 20}, {5, 17}, {2, 1}};
  int32_t idx[T * K];
  for (int s = 0; s < T * K; s++)
    idx[s] = s % 3 == 0 ? 0 : s % 10 == 1 ? -1 : s % 10 == 2 ? E : s % 10 == 5 ? INT32_MIN : 1 + s * 7 % 3;
  for (int up = 1; up >= 0; up--)
    for (int split_rows = 0; split_rows < 2; split_rows++) {
      kt k;
      moe_mma_op(&k, up, PLAN_BF16, split_rows ? split : NULL, E, split_rows ? 3 : E, T, K, H, F);
      ck_assert_int_eq(mma_tiles(&k), up ? 2 : 4);
      ffn_gpu_case(&k, idx, T * K, steps, 3);
      moe_mma_exact_case(&k, idx, T * K, split_rows ? split : NULL, E);
    }
  moe_mma_split_case(idx, T * K, T, K, H, F);
  enum { TP = 1400, EP = 140 };
  static int32_t many[TP * K];
  for (int s = 0; s < TP * K; s++)
    many[s] = s == 7 ? 3 : 0;
  static const int many_steps[][2] = {{0, TP}};
  for (int up = 1; up >= 0; up--) {
    kt k;
    moe_mma_op(&k, up, PLAN_BF16, NULL, EP, EP, TP, K, H, 32);
    ck_assert_int_eq(mma_tiles(&k), up ? 2 : 4);
    ffn_gpu_case(&k, many, TP * K, many_steps, 1);
    moe_mma_exact_case(&k, many, TP * K, NULL, EP);
  }
  for (int up = 1; up >= 0; up--) {
    kt k;
    moe_mma_op(&k, up, PLAN_BF16, NULL, E, E, 1, K, H, F);
    ck_assert_int_eq(mma_tiles(&k), 0);
    moe_mma_op(&k, up, PLAN_BF16, NULL, E, E, 2, K, H, F); /* 6 choices, under 2 an expert */
    ck_assert_int_eq(mma_tiles(&k), up ? 2 : 4);
    moe_mma_op(&k, up, PLAN_BF16, split, E, 3, 4, K, H, F); /* 12 of 5 experts, 3 held: as all 5 held */
    ck_assert_int_eq(mma_tiles(&k), up ? 2 : 4);
    moe_mma_op(&k, up, PLAN_BF16, NULL, E, E, T, K, up ? 48 : H, up ? F : 48);
    ck_assert_int_eq(mma_tiles(&k), 0);
    moe_mma_op(&k, up, PLAN_F32, NULL, E, E, T, K, H, F);
    ck_assert_int_eq(mma_tiles(&k), 0);
  }
  emu_stop();
}
END_TEST

/* moe_up and moe_down of 130 slots at top-3 over 5 experts, tiled
 * (moe_tiled.hip): 390 choices, expert 0 the first of every token's and
 * the last of every odd token's (195: a token may choose an expert
 * twice, as hash_route's table allows, so its list takes two passes of
 * T, each in blocks of 32 slots, the last partial), 1 to 3 in others, 4
 * in none, ids that name no expert; moe_up's 96 ffn rows in tiles of 64
 * gate and 64 up rows (the last partial), moe_down's 64 channels in a
 * tile of 128. Each against its host kernel, against float64 with all
 * experts and a split's rows, bit for bit against moe_mma.hip on the
 * first 20 slots, and a split moe_down summing to the whole. */
START_TEST(test_gpu_moe_tiled)
{
  enum { T = 130, K = 3, E = 5, H = 64, F = 96 };
  static int split[E] = {1, -1, -1, 2, 0};
  static const int steps[][2] = {{0, 130}, {3, 70}};
  int32_t idx[T * K];
  for (int s = 0; s < T * K; s++)
    idx[s] = s % 3 == 0 || s % 6 == 5 ? 0
             : s % 10 == 1            ? -1
             : s % 10 == 2            ? E
             : s % 10 == 5            ? INT32_MIN
                                      : 1 + s * 7 % 3;
  for (int up = 1; up >= 0; up--)
    for (int split_rows = 0; split_rows < 2; split_rows++) {
      kt k;
      moe_mma_op(&k, up, PLAN_BF16, split_rows ? split : NULL, E, split_rows ? 3 : E, T, K, H, F);
      tiled_shape(&k, 1, up ? 2 : 4);
      ffn_gpu_case(&k, idx, T * K, steps, 2);
      moe_mma_exact_case(&k, idx, T * K, split_rows ? split : NULL, E);
      tiled_mma_bits(&k, 20, idx, T * K);
    }
  moe_mma_split_case(idx, T * K, T, K, H, F);
  /* 24 choices an expert (16 experts): moe_mma.hip's, 16 slots a warp */
  for (int up = 1; up >= 0; up--) {
    kt few;
    int tiled;
    moe_mma_op(&few, up, PLAN_BF16, NULL, 16, 16, T, K, H, F);
    ck_assert_int_eq(mma_define(&few, "MMA_NT", &tiled), up ? 2 : 4);
    ck_assert_msg(!tiled, "24 choices an expert took the tiled kernel");
  }
  emu_stop();
}
END_TEST

/* ---- the asked rows (lower.c): a matmul or argmax that only the plan's
 * outputs read computes its rows from step[3] on ---- */

/* One launch of k's host kernel, or with gpu its GPU kernel on the host. */
static void asked_run(const built *h, const emu_built *g, bufs *bs, int ntok, int asked)
{
  if (g)
    emu_run_asked(g, bs->b, 5, ntok, asked, 0);
  else
    run_asked(h, bs, 5, ntok, asked, 0);
}

/* k (one output, [T, ...]) built with asked_rows is a kernel of its own
 * (ASKED_ROWS); for a step asking from slot a on, its rows a..ntok-1 hold
 * the bits of k's kernel built without it, and its rows below a and from
 * ntok on are dead (+0; -1 for argmax's ids). The host's kernels, or with
 * gpu the GPU's run on the host. */
static void asked_case(const kt *k, int gpu, const int (*steps)[2], int nsteps)
{
  kt all = *k, asked = *k;
  all.prog.tensors = all.tensors;
  asked.prog.tensors = asked.tensors;
  asked.op.asked_rows = 1;
  built h[2];
  emu_built *g[2] = {NULL, NULL};
  if (gpu) {
    g[0] = emu_build(&all);
    g[1] = emu_build(&asked);
  } else {
    build(&all, &h[0]);
    build(&asked, &h[1]);
  }
  const kgen_kernel *kk[2] = {gpu ? &g[0]->kk : &h[0].kk, gpu ? &g[1]->kk : &h[1].kk};
  ck_assert_ptr_null(strstr(kk[0]->source, "#define ASKED_ROWS"));
  ck_assert_ptr_nonnull(strstr(kk[1]->source, "#define ASKED_ROWS"));
  ck_assert_str_ne(kk[0]->symbol, kk[1]->symbol);
  int o = k->op.nin;
  int64_t T = k->tensors[o].dim[0], row = k->tensors[o].bytes / T;
  int ids = k->tensors[o].dtype == PLAN_I32;
  bufs want, got;
  bufs_alloc(&want, k);
  bufs_alloc(&got, k);
  for (int s = 0; s < nsteps; s++) {
    int ntok = steps[s][0], a = steps[s][1];
    ffn_fill(k, &want, NULL, 0);
    for (int i = 0; i < o; i++)
      memcpy(got.b[i], want.b[i], (size_t)k->tensors[i].bytes);
    fill_garbage(got.b[o], kt_elems(k, o));
    asked_run(&h[0], g[0], &want, ntok, 0);
    asked_run(&h[1], g[1], &got, ntok, a);
    for (int64_t t = 0; t < T; t++) {
      const char *gr = (const char *)got.b[o] + t * row, *wr = (const char *)want.b[o] + t * row;
      if (t >= a && t < ntok) {
        ck_assert_msg(memcmp(gr, wr, (size_t)row) == 0, "%s: row %lld (ntok %d, asked from %d) differs from %s's",
                      kk[1]->symbol, (long long)t, ntok, a, kk[0]->symbol);
        continue;
      }
      for (int64_t j = 0; j < row / 4; j++) {
        int32_t v;
        memcpy(&v, gr + 4 * j, 4);
        ck_assert_msg(v == (ids ? -1 : 0), "%s: row %lld (ntok %d, asked from %d) not dead: word %lld is 0x%08x",
                      kk[1]->symbol, (long long)t, ntok, a, (long long)j, (unsigned)v);
      }
    }
  }
  bufs_free(&want);
  bufs_free(&got);
  for (int i = 0; i < 2; i++)
    if (gpu)
      emu_free(g[i]);
    else
      unbuild(&h[i]);
}

/* matmul (a few columns a block, and so many that x is staged in shared
 * memory) and argmax (a row of 16-byte chunks, and one that is not). */
static void asked_cases(int gpu)
{
  static const int steps[][2] = {{4, 3}, {4, 0}, {3, 1}, {2, 2}, {1, 0}, {4, 9}}; /* ntok, asked */
  static const struct {
    int kind;
    int64_t k, n;
    uint32_t wt;
  } cases[] = {{IR_OP_MATMUL, 40, 21, PLAN_F32},
               {IR_OP_MATMUL, 16, 8200, PLAN_BF16},
               {IR_OP_ARGMAX, 0, 52, PLAN_F32},
               {IR_OP_ARGMAX, 0, 37, PLAN_F32}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    kt k;
    kt_init(&k, cases[i].kind);
    if (cases[i].kind == IR_OP_MATMUL) {
      kt_add(&k, 0, PLAN_F32, 2, (int64_t)4, cases[i].k);
      kt_add(&k, 0, cases[i].wt, 2, cases[i].n, cases[i].k);
      kt_add(&k, 1, PLAN_F32, 2, (int64_t)4, cases[i].n);
    } else {
      kt_add(&k, 0, PLAN_F32, 2, (int64_t)4, cases[i].n);
      kt_add(&k, 1, PLAN_I32, 1, (int64_t)4);
    }
    asked_case(&k, gpu, steps, (int)(sizeof steps / sizeof steps[0]));
  }
}

START_TEST(test_asked_rows)
{
  asked_cases(0);
}
END_TEST

START_TEST(test_gpu_asked_rows)
{
  /* on the matrix units, the asked rows from the third tile of slots, the
   * second, and all (an op of asked rows keeps matmul_mma.hip at any
   * slot count) */
  static const int tiled[][2] = {{150, 130}, {100, 70}, {150, 0}};
  asked_cases(1);
  kt k;
  mma_tiled_op(&k, 150);
  asked_case(&k, 1, tiled, 3);
  emu_stop();
}
END_TEST

/* An argmax as lowered for a GPU (lower.c): argmax_parts over G parts of
 * each row, then argmax_of_parts, give argmax's ids exactly, on the host
 * and on the GPU (its kernels as host fibers), for every row asked and
 * for the rows from slot 2 on (ASKED_ROWS): a maximum tied across parts
 * (the lower index), NaN at index 0 (0) and elsewhere (skipped), a row of
 * NaN (0), -0 against +0 (equal: the lower index), a row whose parts are
 * 16-byte aligned and one whose are not (V odd), a short last part. */
static void argmax_split_case(int gpu, int64_t V, int64_t G, int asked)
{
  enum { T = 4 };
  kt whole, parts, best;
  kt_init(&whole, IR_OP_ARGMAX);
  kt_add(&whole, 0, PLAN_F32, 2, (int64_t)T, V);
  kt_add(&whole, 1, PLAN_I32, 1, (int64_t)T);
  kt_init(&parts, IR_OP_ARGMAX_PARTS);
  kt_add(&parts, 0, PLAN_F32, 2, (int64_t)T, V);
  kt_add(&parts, 1, PLAN_F32, 2, (int64_t)T, G);
  kt_add(&parts, 1, PLAN_I32, 2, (int64_t)T, G);
  kt_init(&best, IR_OP_ARGMAX_OF_PARTS);
  kt_add(&best, 0, PLAN_F32, 2, (int64_t)T, G);
  kt_add(&best, 0, PLAN_I32, 2, (int64_t)T, G);
  kt_add(&best, 0, PLAN_F32, 2, (int64_t)T, V);
  kt_add(&best, 1, PLAN_I32, 1, (int64_t)T);
  whole.op.asked_rows = parts.op.asked_rows = best.op.asked_rows = asked;
  chain_kernel kw, kp, kb;
  chain_start(&kw, &whole, gpu);
  chain_start(&kp, &parts, gpu);
  chain_start(&kb, &best, gpu);
  ck_assert_uint_eq(gpu ? kp.gpu->kk.grid : kp.host.kk.grid, (uint32_t)(T * G));
  bufs bw, bp, bb;
  bufs_alloc(&bw, &whole);
  bufs_alloc(&bp, &parts);
  bufs_alloc(&bb, &best);
  float *l = bw.b[0];
  fill_f32(l, T * V, 1.0);
  int64_t a = 7, b = V - 3; /* in the first part and the last */
  l[0 * V + a] = l[0 * V + b] = 3.0f;
  l[1 * V + 0] = NAN;
  l[1 * V + V / 2] = NAN;
  for (int64_t v = 0; v < V; v++)
    l[2 * V + v] = NAN;
  for (int64_t v = 0; v < V; v++)
    l[3 * V + v] = v % 5 == 1 ? NAN : -1.0f - (float)(v % 7);
  l[3 * V + V - 2] = 0.0f;
  l[3 * V + a] = -0.0f;
  static const int steps[][2] = {{4, 0}, {4, 2}, {2, 1}, {0, 0}}; /* ntok, asked from */
  for (int s = 0; s < 4; s++) {
    int ntok = steps[s][0], from = asked ? steps[s][1] : 0;
    memcpy(bp.b[0], l, (size_t)whole.tensors[0].bytes);
    memcpy(bb.b[2], l, (size_t)whole.tensors[0].bytes);
    fill_garbage(bw.b[1], T);
    fill_garbage(bp.b[1], T * G);
    fill_garbage(bp.b[2], T * G);
    fill_garbage(bb.b[3], T);
    asked_run(&kw.host, kw.gpu, &bw, ntok, from);
    asked_run(&kp.host, kp.gpu, &bp, ntok, from);
    memcpy(bb.b[0], bp.b[1], (size_t)parts.tensors[1].bytes);
    memcpy(bb.b[1], bp.b[2], (size_t)parts.tensors[2].bytes);
    asked_run(&kb.host, kb.gpu, &bb, ntok, from);
    const int32_t *want = bw.b[1], *got = bb.b[3];
    for (int t = 0; t < T; t++)
      ck_assert_msg(got[t] == want[t], "%s V %lld, %lld parts: row %d (ntok %d, asked from %d) gives %d, argmax %d",
                    gpu ? "GPU" : "host", (long long)V, (long long)G, t, ntok, from, got[t], want[t]);
    if (ntok == 4 && from == 0) {
      ck_assert_int_eq(want[0], a);
      ck_assert_int_eq(want[1], 0);
      ck_assert_int_eq(want[2], 0);
      ck_assert_int_eq(want[3], a);
    }
  }
  bufs_free(&bw);
  bufs_free(&bp);
  bufs_free(&bb);
  chain_unbuild(&kw);
  chain_unbuild(&kp);
  chain_unbuild(&kb);
}

START_TEST(test_argmax_parts)
{
  for (int gpu = 0; gpu < 2; gpu++)
    for (int asked = 0; asked < 2; asked++) {
      argmax_split_case(gpu, 9000, 3, asked);
      argmax_split_case(gpu, 8197, 3, asked); /* parts of 2736, the last of 2725 */
      argmax_split_case(gpu, 130, 17, asked); /* parts of 8, the last of 2 */
    }
  emu_stop();
}
END_TEST

/* One launch of k's GPU kernel (host threads) on operands filled by
 * ffn_fill, slot 0 live; returns the buffers, outputs in b[nin..]. */
static void staged_run(const kt *k, bufs *bs, emu_built **gpu)
{
  *gpu = emu_build(k);
  bufs_alloc(bs, k);
  ffn_fill(k, bs, NULL, 0);
  emu_run(*gpu, bs->b, 0, 1, 0);
}

/* A matmul or group_matmul of many columns takes two a warp and stages
 * its row of x in shared memory (kgen.c: ROWS 2 from 8192 columns, with a
 * group's columns whole tiles of 16; kgen_gpu: X_SHARED then, shared = the
 * row's bytes); one of few columns takes one a warp and reads x as it
 * goes. Their columns hold the same bits for the same row of w and the
 * same x: the staged kernel's first columns against an unstaged kernel
 * given those rows; the ungrouped kernel's last tile is partial (8200 =
 * 512 tiles of 16 and 8). */
START_TEST(test_gpu_matmul_staged_x)
{
  enum { K = 16, NBIG = 8200, NG_BIG = 4112, NSMALL = 8 };
  for (int grouped = 0; grouped < 2; grouped++) {
    kt big, small;
    kt_init(&big, grouped ? IR_OP_GROUP_MATMUL : IR_OP_MATMUL);
    kt_init(&small, grouped ? IR_OP_GROUP_MATMUL : IR_OP_MATMUL);
    int64_t groups = grouped ? 2 : 1, nbig = grouped ? 2 * NG_BIG : NBIG, nsmall = groups * NSMALL;
    big.op.iattr[0] = small.op.iattr[0] = groups;
    kt_add(&big, 0, PLAN_F32, 2, (int64_t)2, groups * K);
    kt_add(&big, 0, PLAN_BF16, 2, nbig, (int64_t)K);
    kt_add(&big, 1, PLAN_F32, 2, (int64_t)2, nbig);
    kt_add(&small, 0, PLAN_F32, 2, (int64_t)2, groups * K);
    kt_add(&small, 0, PLAN_BF16, 2, nsmall, (int64_t)K);
    kt_add(&small, 1, PLAN_F32, 2, (int64_t)2, nsmall);
    bufs bb, bsm;
    emu_built *gb, *gs;
    staged_run(&big, &bb, &gb);
    ck_assert_ptr_nonnull(strstr(gb->kk.source, "#define X_SHARED 1\n"));
    ck_assert_ptr_nonnull(strstr(gb->kk.source, "#define ROWS ((int64_t)2)\n"));
    ck_assert_uint_eq(gb->kk.grid, (nbig + 15) / 16);
    ck_assert_uint_eq(gb->kk.shared, K * 4);
    gs = emu_build(&small);
    ck_assert_ptr_nonnull(strstr(gs->kk.source, "#define X_SHARED 0\n"));
    ck_assert_ptr_nonnull(strstr(gs->kk.source, "#define ROWS ((int64_t)1)\n"));
    ck_assert_uint_eq(gs->kk.shared, 0);
    bufs_alloc(&bsm, &small);
    memcpy(bsm.b[0], bb.b[0], (size_t)big.tensors[0].bytes);
    /* group g's first NSMALL rows of w: rows g * (nbig / groups) and up */
    for (int64_t g = 0; g < groups; g++)
      memcpy((uint16_t *)bsm.b[1] + g * NSMALL * K, (uint16_t *)bb.b[1] + g * (nbig / groups) * K,
             (size_t)NSMALL * K * 2);
    fill_garbage(bsm.b[2], kt_elems(&small, 2));
    emu_run(gs, bsm.b, 0, 1, 0);
    const float *yb = bb.b[2], *ys = bsm.b[2];
    for (int64_t g = 0; g < groups; g++)
      ck_assert_msg(memcmp(ys + g * NSMALL, yb + g * (nbig / groups), NSMALL * 4) == 0,
                    "%s: group %lld's columns differ staged and unstaged", gb->kk.symbol, (long long)g);
    for (int64_t n = 0; n < nbig; n++) /* slot 1 dead: +0 */
      ck_assert_msg(yb[nbig + n] == 0.0f && !signbit(yb[nbig + n]), "%s: dead slot's column %lld not +0",
                    gb->kk.symbol, (long long)n);
    bufs_free(&bb);
    bufs_free(&bsm);
    emu_free(gb);
    emu_free(gs);
  }
  emu_stop();
}
END_TEST

/* sink_attention on the GPU against the host kernel: the keys' scores kept
 * in shared memory (STORE_SCORES 1) and, when the entries a slot may see
 * do not fit there, computed again in each pass (0), with the window
 * alone, every closed entry (HCA) and a selection with repeats and
 * entries not yet visible (CSA), its list by a bit per entry and, for
 * more entries than a block's words hold, by the sort. */
START_TEST(test_gpu_sink_attention)
{
  /* heads, hd, window, S, ratio, select, ne, nsel */
  static const struct {
    sink_cfg c;
    int store;
  } cases[] = {
      {{3, 16, 6, 9, 0, 0, 1, 1}, 1},
      {{3, 16, 6, 11, 4, 1, 12, 1}, 1},
      {{3, 16, 6, 11, 2, 1, 12288, 1}, 0},
      {{3, 16, 6, 11, 4, 2, 12, 5}, 1},
      {{3, 16, 6, 11, 2, 2, 12288, 5}, 1}, /* select 2's list by the sort */
      {{4, 6, 6, 11, 4, 2, 12, 5}, 1},     /* heads of 6 floats: a block each */
  };
  static const int32_t sel[] = {0, 2, -1, 1, 2, 7, 0, 3, 1, 1};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    kt k;
    sink_op(&k, &cases[i].c, 4);
    kgen_kernel kk;
    dsl_diag d = {0};
    ck_assert_msg(kgen_gpu(&k.prog, &k.op, &kk, &d) == 0, "kgen_gpu: %s", d.msg);
    char want[32];
    snprintf(want, sizeof want, "#define STORE_SCORES %d\n", cases[i].store);
    ck_assert_msg(strstr(kk.source, want) != NULL, "case %zu: no %s", i, want);
    snprintf(want, sizeof want, "#define SEL_BITMAP %d\n", cases[i].c.select == 2 && cases[i].c.ne <= 32 * 256);
    ck_assert_msg(strstr(kk.source, want) != NULL, "case %zu: no %s", i, want);
    kgen_kernel_free(&kk);
    ffn_gpu_case(&k, sel, (int)(sizeof sel / sizeof sel[0]), g_gpu_steps, 2);
  }
  emu_stop();
}
END_TEST

/* The lowered form of hc_pre (pre) or hc_head on T = 4 slots of N streams
 * of D (lower.c): hc_sums, then hc_pre_sums or hc_head_sums. hc_sums
 * against its host kernel (ffn_gpu_case; the second launch needs sums a
 * norm can take, so it is checked through the pair), and the pair's
 * outputs bit for bit the whole op's, on the GPU (its kernels on host
 * threads) and on the host, in both block orders. */
static void hc_lowered_case(int pre, int64_t N, int64_t D, int64_t iters)
{
  enum { T = 4 };
  int64_t M = pre ? (2 + N) * N : N;
  kt whole, sums, rest;
  if (pre)
    hc_pre_op(&whole, T, N, D, iters);
  else
    hc_head_op(&whole, T, N, D);
  kt_init(&sums, IR_OP_HC_SUMS);
  kt_add(&sums, 0, PLAN_F32, 3, (int64_t)T, N, D);
  kt_add(&sums, 0, PLAN_F32, 2, M, N * D);
  kt_add(&sums, 1, PLAN_F32, 2, (int64_t)T, M + 1);
  kt_init(&rest, pre ? IR_OP_HC_PRE_SUMS : IR_OP_HC_HEAD_SUMS);
  memcpy(rest.op.fattr, whole.op.fattr, sizeof rest.op.fattr);
  memcpy(rest.op.iattr, whole.op.iattr, sizeof rest.op.iattr);
  kt_add(&rest, 0, PLAN_F32, 2, (int64_t)T, M + 1);
  for (int i = 0; i < whole.op.nin + whole.op.nout; i++) /* X, base, scale and the outputs */
    if (i != 1) {
      const ir_tensor *t = &whole.tensors[i];
      kt_add(&rest, i >= whole.op.nin, PLAN_F32, t->ndim, t->dim[0], t->dim[1], t->ndim > 2 ? t->dim[2] : 0);
    }
  ffn_gpu_case(&sums, NULL, 0, g_gpu_steps, 2);

  int nin = whole.op.nin, nout = whole.op.nout;
  for (int gpu = 0; gpu < 2; gpu++) {
    chain_kernel kw, ks, kr;
    chain_start(&kw, &whole, gpu);
    chain_start(&ks, &sums, gpu);
    chain_start(&kr, &rest, gpu);
    bufs bw, bs, br;
    bufs_alloc(&bw, &whole);
    bufs_alloc(&bs, &sums);
    bufs_alloc(&br, &rest);
    for (int s = 0; s < 2; s++) {
      int pos = g_gpu_steps[s][0], ntok = g_gpu_steps[s][1];
      ffn_fill(&whole, &bw, NULL, 0);
      memcpy(bs.b[0], bw.b[0], (size_t)whole.tensors[0].bytes);
      memcpy(bs.b[1], bw.b[1], (size_t)whole.tensors[1].bytes);
      fill_garbage(bs.b[2], kt_elems(&sums, 2));
      for (int i = 2; i < nin; i++)
        memcpy(br.b[i], bw.b[i], (size_t)whole.tensors[i].bytes);
      memcpy(br.b[1], bw.b[0], (size_t)whole.tensors[0].bytes);
      for (int o = 0; o < nout; o++)
        fill_garbage(br.b[nin + o], kt_elems(&rest, nin + o));
      chain_run(&kw, &bw, pos, ntok);
      chain_run(&ks, &bs, pos, ntok);
      memcpy(br.b[0], bs.b[2], (size_t)sums.tensors[2].bytes);
      chain_run(&kr, &br, pos, ntok);
      for (int o = 0; o < nout; o++)
        ck_assert_msg(memcmp(br.b[nin + o], bw.b[nin + o], (size_t)whole.tensors[nin + o].bytes) == 0,
                      "%s %s: output %d of the lowered pair differs (pos %d, ntok %d)", gpu ? "GPU" : "host",
                      pre ? "hc_pre" : "hc_head", o, pos, ntok);
    }
    bufs_free(&bw);
    bufs_free(&bs);
    bufs_free(&br);
    chain_unbuild(&kw);
    chain_unbuild(&ks);
    chain_unbuild(&kr);
  }
}

/* A norm and the rope of its output as lowered for a GPU (lower.c): the
 * fused kernel's y bit for bit the norm's then the rope's, on the GPU
 * (its kernels as host fibers) and on the host, in both block orders,
 * dead slots zero: a row or group wider than a block's threads, and
 * rope_dim channels that span several threads' columns. */
static void norm_rope_case(int grouped, int64_t C, int64_t group, int64_t r, int inverse)
{
  enum { T = 4 };
  kt fused, norm, rope;
  norm_rope_op(&fused, grouped, C, group, r, inverse);
  int64_t g = group ? group : C;
  if (grouped) {
    kt_init(&norm, IR_OP_RMSNORM_GROUPS);
    norm.op.fattr[0] = 1e-6;
    norm.op.iattr[1] = group;
    kt_add(&norm, 0, PLAN_F32, 2, (int64_t)T, C);
    kt_add(&norm, 1, PLAN_F32, 2, (int64_t)T, C);
  } else {
    rmsnorm_op(&norm, T, C, 1e-6);
  }
  rope_op(&rope, (int)(C / g), (int)g, (int)r, fused.op.fattr[2], inverse, inverse ? g_ds4_yarn : NULL);
  /* the second step far along, where the rotation angles are large */
  static const int steps[][2] = {{0, 4}, {1003, 2}}, fin_a[] = {0, 1}, fin_b[] = {-1};
  fused_chain_case(grouped ? "rmsnorm_groups_rope" : "rmsnorm_rope", &fused, &norm, &rope, 0, fin_a, fin_b, NULL, 0,
                   steps, 2);
}

/* rmsnorm_rope_window against rmsnorm_rope then window_write: T = 4 slots
 * of a row of h (r rotated) into a ring of 8 rows. */
static void norm_window_case(int64_t h, int64_t r, int inverse)
{
  enum { T = 4, S = 8 };
  kt fused, norm, ww;
  norm_rope_op(&norm, 0, h, 0, r, inverse);
  fused = norm;
  fused.op.kind = IR_OP_RMSNORM_ROPE_WINDOW;
  fused.tensors[2].dim[0] = S;
  fused.tensors[2].bytes = S * h * 4;
  kt_init(&ww, IR_OP_WINDOW_WRITE);
  kt_add(&ww, 0, PLAN_F32, 2, (int64_t)T, h);
  kt_add(&ww, 1, PLAN_F32, 2, (int64_t)S, h);
  static const int fin_a[] = {0, 1}, fin_b[] = {-1};
  fused_chain_case("rmsnorm_rope_window", &fused, &norm, &ww, 0, fin_a, fin_b, NULL, 0, g_fused_steps,
                   NFUSED_STEPS);
}

/* The core of c on T slots (core) and, as lower.c fuses it with the
 * inverse rope of r of each head's channels, theta 10000 (rope),
 * sink_attention_rope (fused). */
static void attention_rope_ops(kt *fused, kt *core, kt *rope, const sink_cfg *c, int64_t r, int64_t T)
{
  sink_op(core, c, T);
  rope_op(rope, c->heads, c->hd, (int)r, 10000.0, 1, NULL);
  *fused = *core;
  fused->op.kind = IR_OP_SINK_ATTENTION_ROPE;
  memcpy(fused->op.iattr, rope->op.iattr, sizeof fused->op.iattr);
  memcpy(fused->op.fattr, rope->op.fattr, sizeof fused->op.fattr);
  fused->op.iattr[9] = core->op.iattr[1];
  fused->op.iattr[10] = core->op.iattr[2];
  fused->op.iattr[11] = core->op.iattr[3];
  fused->op.fattr[12] = core->op.fattr[4];
}

static const int32_t g_fused_sel[] = {0, 3, 1, -1, 3, 7};
static const int g_attn_steps[][2] = {{0, 4}, {3, 2}, {9, 4}, {13, 1}};

/* sink_attention_rope against sink_attention then the inverse rope of its
 * output (r of each head's channels), per c (kt_init's T = 4 slots). */
static void attention_rope_case(const sink_cfg *c, int64_t r)
{
  kt fused, core, rope;
  attention_rope_ops(&fused, &core, &rope, c, r, 4);
  static const int fin_a[] = {0, 1, 2, 3, 4}, fin_b[] = {-1};
  fused_chain_case("sink_attention_rope", &fused, &core, &rope, 0, fin_a, fin_b, g_fused_sel, 6, g_attn_steps, 4);
}

/* sink_attention_rope with q_norm against rmsnorm_groups_rope (a head a
 * group, eps 1e-6, the same rope not inverse) then sink_attention_rope. */
static void attention_qnorm_case(const sink_cfg *c, int64_t r)
{
  kt fused, core_rope, core, rope, norm;
  attention_rope_ops(&core_rope, &core, &rope, c, r, 4);
  norm_rope_op(&norm, 1, (int64_t)c->heads * c->hd, c->hd, r, 0);
  fused = core_rope;
  fused.op.iattr[13] = 1;
  fused.op.fattr[14] = norm.op.fattr[9];
  static const int fin_a[] = {0}, fin_b[] = {-1, 1, 2, 3, 4};
  fused_chain_case("sink_attention_rope (q_norm)", &fused, &norm, &core_rope, 0, fin_a, fin_b, g_fused_sel, 6,
                   g_attn_steps, 4);
}

/* sink_attention of a chunk of T = 4 slots, whose blocks take the heads in
 * groups (HG, kgen.c), against the decode plan's kernel (one slot, a
 * block a head) at each live slot's position, on the GPU (its kernels as
 * host fibers): the same bits, slot by slot, with the keys' scores kept
 * and recomputed, for the window alone, every closed entry (HCA) and a
 * selection (CSA), with and without the fused rope and q norm. */
static void sink_groups_case(const sink_cfg *c, int hg, int rope)
{
  enum { T = 4 };
  const int64_t C = (int64_t)c->heads * c->hd;
  kt chunk, one;
  if (rope) { /* sink_attention_rope: the inverse rope of 4 channels a head, and the q norm */
    kt core, r;
    attention_rope_ops(&chunk, &core, &r, c, 4, T);
    attention_rope_ops(&one, &core, &r, c, 4, 1);
    chunk.prog.tensors = chunk.tensors; /* the copies' own, not core's */
    one.prog.tensors = one.tensors;
    chunk.op.iattr[13] = one.op.iattr[13] = 1;
    chunk.op.fattr[14] = one.op.fattr[14] = 1e-6;
  } else {
    sink_op(&chunk, c, T);
    sink_op(&one, c, 1);
  }
  emu_built *gc = emu_build(&chunk), *g1 = emu_build(&one);
  char want[32];
  snprintf(want, sizeof want, "#define HG ((int64_t)%d)\n", hg);
  ck_assert_msg(strstr(gc->kk.source, want) != NULL, "%s: no %s", gc->kk.symbol, want);
  ck_assert_msg(strstr(g1->kk.source, "#define HG ((int64_t)1)\n") != NULL, "%s: a decode step's block is not one head",
                g1->kk.symbol);
  ck_assert_uint_eq(gc->kk.grid, T * c->heads / hg);
  bufs bc, b1;
  bufs_alloc(&bc, &chunk);
  bufs_alloc(&b1, &one);
  static const int32_t sel[] = {0, 2, -1, 1, 2, 7, 0, 3, 1, 1};
  ffn_fill(&chunk, &bc, sel, (int)(sizeof sel / sizeof sel[0]));
  for (int store = 0; store < 2; store++) {
    int pos = store ? 9 : 2;
    emu_run(gc, bc.b, pos, T, store);
    for (int t = 0; t < T; t++) {
      memcpy(b1.b[0], (float *)bc.b[0] + t * C, (size_t)C * 4);
      for (int i = 1; i < 5; i++)
        if (i != 3)
          memcpy(b1.b[i], bc.b[i], (size_t)one.tensors[i].bytes);
      memcpy(b1.b[3], (int32_t *)bc.b[3] + t * c->nsel, (size_t)c->nsel * 4);
      fill_garbage(b1.b[5], C);
      emu_run(g1, b1.b, pos + t, 1, 0);
      ck_assert_msg(memcmp(b1.b[5], (float *)bc.b[5] + t * C, (size_t)C * 4) == 0,
                    "%s: slot %d's heads differ from the one-slot kernel's at position %d", gc->kk.symbol, t,
                    pos + t);
    }
  }
  bufs_free(&bc);
  bufs_free(&b1);
  emu_free(gc);
  emu_free(g1);
}

START_TEST(test_gpu_sink_attention_groups)
{
  /* heads, hd, window, S, ratio, select, ne, nsel */
  static const sink_cfg swa = {8, 16, 6, 9, 0, 0, 1, 1}, hca = {4, 16, 6, 11, 4, 1, 12, 1},
                        csa = {4, 16, 6, 11, 4, 2, 12, 5}, pairs = {6, 16, 6, 11, 4, 2, 12, 5},
                        wide = {4, 16, 6, 11, 2, 1, 12288, 1};
  sink_groups_case(&swa, 4, 0);
  sink_groups_case(&hca, 4, 0);
  sink_groups_case(&csa, 4, 0);
  sink_groups_case(&pairs, 2, 0);
  sink_groups_case(&wide, 4, 0); /* the scores computed again in each pass */
  sink_groups_case(&csa, 4, 1);
  emu_stop();
}
END_TEST


/* hc_post_combine against moe_combine_add then hc_post: T = 4 slots of k
 * choices and N streams of d channels (tiles of 256, the last short). */
static void combine_hc_post_case(int64_t k, int64_t n, int64_t d)
{
  enum { T = 4 };
  kt fused, comb, post;
  kt_init(&comb, IR_OP_MOE_COMBINE_ADD);
  kt_add(&comb, 0, PLAN_F32, 3, (int64_t)T, k, d);
  kt_add(&comb, 0, PLAN_F32, 2, (int64_t)T, k);
  kt_add(&comb, 0, PLAN_F32, 2, (int64_t)T, d);
  kt_add(&comb, 1, PLAN_F32, 2, (int64_t)T, d);
  kt_init(&post, IR_OP_HC_POST);
  kt_add(&post, 0, PLAN_F32, 2, (int64_t)T, d);
  kt_add(&post, 0, PLAN_F32, 3, (int64_t)T, n, d);
  kt_add(&post, 0, PLAN_F32, 2, (int64_t)T, n);
  kt_add(&post, 0, PLAN_F32, 3, (int64_t)T, n, n);
  kt_add(&post, 1, PLAN_F32, 3, (int64_t)T, n, d);
  kt_init(&fused, IR_OP_HC_POST_COMBINE);
  kt_add(&fused, 0, PLAN_F32, 3, (int64_t)T, k, d);
  kt_add(&fused, 0, PLAN_F32, 2, (int64_t)T, k);
  kt_add(&fused, 0, PLAN_F32, 2, (int64_t)T, d);
  kt_add(&fused, 0, PLAN_F32, 3, (int64_t)T, n, d);
  kt_add(&fused, 0, PLAN_F32, 2, (int64_t)T, n);
  kt_add(&fused, 0, PLAN_F32, 3, (int64_t)T, n, n);
  kt_add(&fused, 1, PLAN_F32, 3, (int64_t)T, n, d);
  static const int fin_a[] = {0, 1, 2}, fin_b[] = {-1, 3, 4, 5};
  fused_chain_case("hc_post_combine", &fused, &comb, &post, 0, fin_a, fin_b, NULL, 0, g_gpu_steps, 2);
}

/* matmul_hc_post against matmul then hc_post: t slots of x [t, k], w [n, k]
 * of dtype wt, and streams of n channels, at the given steps. */
static void matmul_hc_post_case(int64_t t, int64_t k, int64_t n, uint32_t wt, int64_t streams,
                                const int (*steps)[2], int nsteps)
{
  kt fused, mm, post;
  kt_init(&mm, IR_OP_MATMUL);
  kt_add(&mm, 0, PLAN_F32, 2, t, k);
  kt_add(&mm, 0, wt, 2, n, k);
  kt_add(&mm, 1, PLAN_F32, 2, t, n);
  kt_init(&post, IR_OP_HC_POST);
  kt_add(&post, 0, PLAN_F32, 2, t, n);
  kt_add(&post, 0, PLAN_F32, 3, t, streams, n);
  kt_add(&post, 0, PLAN_F32, 2, t, streams);
  kt_add(&post, 0, PLAN_F32, 3, t, streams, streams);
  kt_add(&post, 1, PLAN_F32, 3, t, streams, n);
  kt_init(&fused, IR_OP_MATMUL_HC_POST);
  kt_add(&fused, 0, PLAN_F32, 2, t, k);
  kt_add(&fused, 0, wt, 2, n, k);
  kt_add(&fused, 0, PLAN_F32, 3, t, streams, n);
  kt_add(&fused, 0, PLAN_F32, 2, t, streams);
  kt_add(&fused, 0, PLAN_F32, 3, t, streams, streams);
  kt_add(&fused, 1, PLAN_F32, 3, t, streams, n);
  static const int fin_a[] = {0, 1}, fin_b[] = {-1, 2, 3, 4};
  fused_chain_case("matmul_hc_post", &fused, &mm, &post, 0, fin_a, fin_b, NULL, 0, steps, nsteps);
}

/* A decode step's one slot, then a step with none live. */
static const int g_one_slot_steps[][2] = {{0, 1}, {5, 0}};

START_TEST(test_gpu_fused_tails)
{
  norm_window_case(600, 64, 0); /* kv: 64 rotated over two threads' columns */
  norm_window_case(64, 64, 1);
  static const sink_cfg swa = {.heads = 3, .hd = 72, .window = 4, .S = 8, .ne = 1, .nsel = 1};
  static const sink_cfg csa = {.heads = 2, .hd = 64, .window = 4, .S = 8, .ratio = 4, .select = 2, .ne = 8, .nsel = 6};
  attention_rope_case(&swa, 16);
  attention_rope_case(&csa, 64); /* every channel rotated */
  attention_qnorm_case(&swa, 16);
  attention_qnorm_case(&csa, 64);
  combine_hc_post_case(6, 4, 600); /* three tiles of channels, the last of 88 */
  combine_hc_post_case(2, 3, 37);
  matmul_hc_post_case(4, 40, 150, PLAN_F32, 4, g_gpu_steps, 2); /* 19 tiles of 8, the last short */
  matmul_hc_post_case(1, 256, 40, PLAN_BF16, 3, g_one_slot_steps, 2);
  matmul_hc_post_case(1, 64, 8200, PLAN_BF16, 4, g_one_slot_steps, 2); /* two columns a warp */
  /* on the matrix units: matmul_mma.hip, then tiled (128 slots) */
  matmul_hc_post_case(4, 64, 40, PLAN_BF16, 4, g_gpu_steps, 2);
  matmul_hc_post_case(128, 64, 128, PLAN_BF16, 2, g_gpu_steps, 2);
  emu_stop();
}
END_TEST

START_TEST(test_gpu_norm_rope)
{
  norm_rope_case(0, 600, 0, 64, 0);   /* kv: a row of 600, 64 rotated over two threads' columns */
  norm_rope_case(0, 64, 0, 64, 1);    /* the whole row rotated, inverse with YaRN */
  norm_rope_case(1, 3 * 520, 520, 64, 0); /* q: three heads of 520 */
  norm_rope_case(1, 64, 16, 8, 1);
  emu_stop();
}
END_TEST

/* hc_pre's second launch and the rmsnorm of its x as lowered for a GPU
 * (lower.c), on T = 4 slots of N streams of D: hc_pre_norm's h, post and
 * comb bit for bit those of hc_pre_sums then rmsnorm, on the GPU (its
 * kernels as host fibers) and on the host, in both block orders, from
 * the sums hc_sums gives (against the host kernels and the whole hc_pre by
 * hc_lowered_case). */
static void hc_pre_norm_case(int64_t N, int64_t D, int64_t iters)
{
  enum { T = 4 };
  int64_t M = (2 + N) * N;
  kt fused, rest, norm, sums;
  hc_pre_norm_op(&fused, T, N, D, iters);
  kt_init(&rest, IR_OP_HC_PRE_SUMS);
  memcpy(rest.op.fattr, fused.op.fattr, sizeof rest.op.fattr);
  memcpy(rest.op.iattr, fused.op.iattr, sizeof rest.op.iattr);
  for (int i = 0; i < 8; i++) /* sums, X, base, scale; x, post, comb */
    if (i != 4) {
      const ir_tensor *t = &fused.tensors[i];
      kt_add(&rest, i >= 5, PLAN_F32, t->ndim, t->dim[0], t->dim[1], t->ndim > 2 ? t->dim[2] : 0);
    }
  rmsnorm_op(&norm, T, D, fused.op.fattr[3]);
  kt_init(&sums, IR_OP_HC_SUMS);
  kt_add(&sums, 0, PLAN_F32, 3, (int64_t)T, N, D);
  kt_add(&sums, 0, PLAN_F32, 2, M, N * D);
  kt_add(&sums, 1, PLAN_F32, 2, (int64_t)T, M + 1);
  for (int gpu = 0; gpu < 2; gpu++) {
    chain_kernel kf = {.op = fused}, kr = {.op = rest}, kn = {.op = norm}, ks = {.op = sums};
    kt *ops[] = {&kf.op, &kr.op, &kn.op, &ks.op};
    for (int i = 0; i < 4; i++)
      ops[i]->prog.tensors = ops[i]->tensors;
    chain_build(&kf, gpu);
    chain_build(&kr, gpu);
    chain_build(&kn, gpu);
    chain_build(&ks, gpu);
    bufs bf, br, bn, bs;
    bufs_alloc(&bf, &fused);
    bufs_alloc(&br, &rest);
    bufs_alloc(&bn, &norm);
    bufs_alloc(&bs, &sums);
    for (int st = 0; st < 2; st++) {
      int pos = g_gpu_steps[st][0], ntok = g_gpu_steps[st][1];
      ffn_fill(&sums, &bs, NULL, 1);
      chain_run(&ks, &bs, pos, ntok);
      ffn_fill(&fused, &bf, NULL, 1);
      memcpy(bf.b[0], bs.b[2], (size_t)sums.tensors[2].bytes);
      memcpy(bf.b[1], bs.b[0], (size_t)sums.tensors[0].bytes);
      for (int i = 0; i < 4; i++)
        memcpy(br.b[i], bf.b[i], (size_t)fused.tensors[i].bytes);
      for (int o = 4; o < 7; o++)
        fill_garbage(br.b[o], kt_elems(&rest, o));
      chain_run(&kf, &bf, pos, ntok);
      chain_run(&kr, &br, pos, ntok);
      memcpy(bn.b[0], br.b[4], (size_t)rest.tensors[4].bytes);
      memcpy(bn.b[1], bf.b[4], (size_t)fused.tensors[4].bytes);
      fill_garbage(bn.b[2], kt_elems(&norm, 2));
      chain_run(&kn, &bn, pos, ntok);
      const char *where = gpu ? "GPU" : "host";
      ck_assert_msg(memcmp(bf.b[5], bn.b[2], (size_t)norm.tensors[2].bytes) == 0,
                    "%s hc_pre_norm: h differs from hc_pre_sums then rmsnorm (N %lld, D %lld; pos %d, ntok %d)",
                    where, (long long)N, (long long)D, pos, ntok);
      ck_assert_msg(memcmp(bf.b[6], br.b[5], (size_t)fused.tensors[6].bytes) == 0 &&
                        memcmp(bf.b[7], br.b[6], (size_t)fused.tensors[7].bytes) == 0,
                    "%s hc_pre_norm: post or comb differs from hc_pre_sums' (pos %d, ntok %d)", where, pos, ntok);
    }
    bufs_free(&bf);
    bufs_free(&br);
    bufs_free(&bn);
    bufs_free(&bs);
    chain_unbuild(&kf);
    chain_unbuild(&kr);
    chain_unbuild(&kn);
    chain_unbuild(&ks);
  }
}

/* hc_pre, hc_head and hc_post on the GPU against the host kernels, and
 * the lowered forms of the first two against them; rows of 16-byte chunks
 * and (N*D = 99) not. */
START_TEST(test_gpu_hc)
{
  kt k;
  hc_pre_op(&k, 4, 4, 40, 20);
  ffn_gpu_case(&k, NULL, 0, g_gpu_steps, 2);
  hc_pre_op(&k, 4, 3, 33, 2);
  ffn_gpu_case(&k, NULL, 0, g_gpu_steps, 2);
  hc_pre_op(&k, 2, 6, 20, 3); /* 36 elements: the block's Sinkhorn, not 32 lanes' */
  ffn_gpu_case(&k, NULL, 0, g_gpu_steps, 2);
  hc_head_op(&k, 4, 4, 40);
  ffn_gpu_case(&k, NULL, 0, g_gpu_steps, 2);
  kt_init(&k, IR_OP_HC_POST); /* a block per slot and output stream */
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)4, (int64_t)37);
  kt_add(&k, 0, PLAN_F32, 3, (int64_t)4, (int64_t)3, (int64_t)37);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)4, (int64_t)3);
  kt_add(&k, 0, PLAN_F32, 3, (int64_t)4, (int64_t)3, (int64_t)3);
  kt_add(&k, 1, PLAN_F32, 3, (int64_t)4, (int64_t)3, (int64_t)37);
  ffn_gpu_case(&k, NULL, 0, g_gpu_steps, 2);
  hc_lowered_case(1, 4, 40, 20);
  hc_lowered_case(1, 3, 33, 2);
  hc_lowered_case(1, 6, 20, 3);
  hc_lowered_case(0, 4, 40, 0);
  hc_lowered_case(0, 3, 33, 0);
  hc_pre_norm_case(4, 300, 20); /* CPT 2, the last column of a thread past D */
  hc_pre_norm_case(6, 20, 3);   /* 36 elements: the block's Sinkhorn */
  emu_stop();
}
END_TEST

/* ---- errors ---- */

static char g_last_error[2048]; /* of expect_build_error (test state only) */

/* Puts back an environment variable saved with getenv (NULL: unset). */
static void restore_env(const char *name, const char *saved)
{
  if (saved)
    setenv(name, saved, 1);
  else
    unsetenv(name);
}

static void expect_build_error(mprog *m, const char *name, char *const *targets, int n, const char *what)
{
  char dir[300];
  make_dir(dir, sizeof dir, name);
  dsl_diag d = {0};
  emit_kernels k;
  ck_assert_int_ne(emit_kernels_build(&m->prog, dir, targets, n, &k, &d), 0);
  ck_assert_int_ne(d.failed, 0);
  ck_assert_msg(strstr(d.msg, what) != NULL, "message \"%s\" lacks \"%s\"", d.msg, what);
  snprintf(g_last_error, sizeof g_last_error, "%s", d.msg);
  emit_kernels_free(&k);
}

static void expect_gpu_error(kt *k, const char *what)
{
  dsl_diag d = {0};
  kgen_kernel kk;
  ck_assert_int_ne(kgen_gpu(&k->prog, &k->op, &kk, &d), 0);
  ck_assert_ptr_null(kk.symbol);
  ck_assert_msg(strstr(d.msg, what) != NULL, "message \"%s\" lacks \"%s\"", d.msg, what);
  ck_assert_msg(strstr(d.msg, "kernels.yaml:2:5") != NULL, "message \"%s\" lacks the position", d.msg);
}

START_TEST(test_gpu_errors)
{
  mprog m;
  mp_all_kinds(&m);
  m.prog.nops = 2; /* embed and rmsnorm are enough */
  char *gfx[] = {"gfx1201"}, *sm[] = {"sm_90"}, *bad[] = {"host", "gfx9000"}, *twice[] = {"sm_90", "host", "sm_90"};
  expect_build_error(&m, "unknown", bad, 2, "unknown kernel target 'gfx9000'");
  expect_build_error(&m, "twice", twice, 3, "kernel target 'sm_90' given twice");
  expect_build_error(&m, "none", gfx, 0, "no kernel target");

  /* The user's own tool settings, put back after each fake. */
  char *clang = getenv("DS4_CLANG") ? strdup(getenv("DS4_CLANG")) : NULL;
  char *ptxas = getenv("DS4_PTXAS") ? strdup(getenv("DS4_PTXAS")) : NULL;
  setenv("DS4_CLANG", "/nonexistent/clang", 1);
  expect_build_error(&m, "noclang-amd", gfx, 1,
                     "target gfx1201 needs clang-19 and ld.lld (Debian: apt-get install clang-19 lld-19 llvm-19)");
  expect_build_error(&m, "noclang-nv", sm, 1, "target sm_90 needs clang-19");
  restore_env("DS4_CLANG", clang);
  setenv("DS4_PTXAS", "/nonexistent/ptxas", 1);
  expect_build_error(&m, "noptxas", sm, 1, "target sm_90 needs ptxas from the CUDA toolkit (/usr/local/cuda/bin/ptxas)");
  restore_env("DS4_PTXAS", ptxas);

  /* Tools that run and fail: their output is quoted; a missing linker
   * names what to install. */
  char tool[400];
  snprintf(tool, sizeof tool, "%s/fake-tool", g_dir);
  FILE *f = fopen(tool, "w");
  ck_assert_ptr_nonnull(f);
  fprintf(f, "#!/bin/sh\necho \"$FAKE_TOOL_SAYS\" >&2\nexit 1\n");
  ck_assert_int_eq(fclose(f), 0);
  ck_assert_int_eq(chmod(tool, 0755), 0);
  setenv("DS4_CLANG", tool, 1);
  setenv("FAKE_TOOL_SAYS", "clang: error: unable to execute command: Executable \"ld.lld\" doesn't exist!", 1);
  expect_build_error(&m, "nolld", gfx, 1, "target gfx1201 needs clang-19 and ld.lld (Debian: apt-get install");
  ck_assert_ptr_nonnull(strstr(g_last_error, "Executable \"ld.lld\" doesn't exist!"));
  setenv("FAKE_TOOL_SAYS", "gfx1201.hip:1:1: error: something", 1);
  expect_build_error(&m, "clangfails", gfx, 1, "target gfx1201: '");
  ck_assert_ptr_nonnull(strstr(g_last_error, "failed building"));
  ck_assert_ptr_nonnull(strstr(g_last_error, "gfx1201.hip:1:1: error: something"));
  restore_env("DS4_CLANG", clang);
  setenv("DS4_PTXAS", tool, 1);
  setenv("FAKE_TOOL_SAYS", "ptxas fatal : something", 1);
  expect_build_error(&m, "ptxasfails", sm, 1, "target sm_90: '");
  ck_assert_ptr_nonnull(strstr(g_last_error, "ptxas fatal : something"));
  restore_env("DS4_PTXAS", ptxas);
  unsetenv("FAKE_TOOL_SAYS");
  free(clang);
  free(ptxas);

  /* A router over more experts than a GPU block's shared memory holds:
   * refused by a GPU build, at the op; a host build still works. */
  kt k;
  kt_init(&k, IR_OP_TOPK_ROUTE);
  k.op.iattr[0] = 2;
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)1, (int64_t)6000);
  kt_add(&k, 1, PLAN_I32, 2, (int64_t)1, (int64_t)2);
  kt_add(&k, 1, PLAN_F32, 2, (int64_t)1, (int64_t)2);
  mprog one;
  mp_all_kinds(&one);
  one.prog.nops = one.prog.ntensors = 0;
  mp_take(&one, &k);
  expect_build_error(&one, "router", gfx, 1,
                     "topk_route: the GPU kernel needs 50056 bytes of shared memory per block, more than the 49152");
  ck_assert_ptr_nonnull(strstr(g_last_error, "kernels.yaml:2:5"));
  char dir[300];
  make_dir(dir, sizeof dir, "router-host");
  char *host[] = {"host"};
  emit_kernels hk;
  build_targets(&one, dir, host, 1, &hk);
  ck_assert_uint_eq(hk.kernels[0].shared, 50056);
  emit_kernels_free(&hk);

  /* Dtypes the GPU kernels do not take yet; kinds without a GPU kernel. */
  rmsnorm_op(&k, 4, 64, 1e-6);
  k.tensors[1].dtype = PLAN_BF16;
  expect_gpu_error(&k, "rmsnorm: dtype bf16 not supported by the GPU kernels yet");
  kt_init(&k, IR_OP_EMBED);
  kt_add(&k, 0, PLAN_I32, 1, (int64_t)4);
  kt_add(&k, 0, PLAN_F16, 2, (int64_t)8, (int64_t)4);
  kt_add(&k, 1, PLAN_F32, 3, (int64_t)4, (int64_t)2, (int64_t)4);
  expect_gpu_error(&k, "embed: dtype f16 not supported by the GPU kernels yet (input table: t1)");
  kt_init(&k, IR_OP_COPY);
  expect_gpu_error(&k, "has no GPU kernel");

  /* Quantized weights whose rows are not multiples of 4 values: refused
   * by the GPU kernels, at the op, naming the weight and its shape; the
   * host kernels take them. */
  kt_init(&k, IR_OP_MATMUL);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)4, (int64_t)30);
  kt_add(&k, 0, PLAN_F8E4M3, 2, (int64_t)8, (int64_t)30);
  kt_add(&k, 1, PLAN_F32, 2, (int64_t)4, (int64_t)8);
  expect_gpu_error(&k, "matmul: input w (t1) is f8e4m3 of shape [8,30]; the GPU kernels start a quantized "
                       "weight's rows on 4-value bounds, so its last dimension must be a multiple of 4");
  dsl_diag d = {0};
  kgen_kernel hk1;
  ck_assert_msg(kgen_host(&k.prog, &k.op, &hk1, &d) == 0, "kgen_host: %s", d.msg);
  kgen_kernel_free(&hk1);
  kt_init(&k, IR_OP_MOE_DOWN);
  kt_add(&k, 0, PLAN_F32, 3, (int64_t)4, (int64_t)2, (int64_t)30);
  kt_add(&k, 0, PLAN_I32, 2, (int64_t)4, (int64_t)2);
  kt_add(&k, 0, PLAN_MXFP4, 3, (int64_t)5, (int64_t)8, (int64_t)30);
  kt_add(&k, 1, PLAN_F32, 3, (int64_t)4, (int64_t)2, (int64_t)8);
  expect_gpu_error(&k, "moe_down: input w2 (t2) is mxfp4 of shape [5,8,30]; the GPU kernels start a quantized "
                       "weight's rows on 4-value bounds");
  ck_assert_msg(kgen_host(&k.prog, &k.op, &hk1, &d) == 0, "kgen_host: %s", d.msg);
  kgen_kernel_free(&hk1);
  /* f8e4m3 and mxfp4 tables: embed takes neither */
  kt_init(&k, IR_OP_EMBED);
  kt_add(&k, 0, PLAN_I32, 1, (int64_t)4);
  kt_add(&k, 0, PLAN_F8E4M3, 2, (int64_t)8, (int64_t)4);
  kt_add(&k, 1, PLAN_F32, 2, (int64_t)4, (int64_t)4);
  expect_gpu_error(&k, "embed: dtype f8e4m3 not supported by the GPU kernels yet (input table: t1)");
}
END_TEST

static Suite *kernels_suite(void)
{
  Suite *s = suite_create("kernels");
  TCase *tc = tcase_create("host");
  tcase_add_unchecked_fixture(tc, dir_setup, dir_teardown);
  tcase_add_test(tc, test_templates);
  tcase_add_test(tc, test_naming);
  tcase_add_test(tc, test_errors);
  tcase_add_test(tc, test_embed);
  tcase_add_test(tc, test_rmsnorm);
  tcase_add_test(tc, test_matmul);
  tcase_add_test(tc, test_matmul_bf16);
  tcase_add_test(tc, test_rope);
  tcase_add_test(tc, test_rope_inverse_roundtrip);
  tcase_add_test(tc, test_rope_tables);
  tcase_add_test(tc, test_rmsnorm_groups);
  tcase_add_test(tc, test_window_write);
  tcase_add_test(tc, test_sink_attention);
  tcase_add_test(tc, test_group_matmul);
  tcase_add_test(tc, test_cache_write);
  tcase_add_test(tc, test_attention);
  tcase_add_test(tc, test_add);
  tcase_add_test(tc, test_topk_route);
  tcase_add_test(tc, test_moe_experts);
  tcase_add_test(tc, test_moe_split_is_exact);
  tcase_add_test(tc, test_moe_combine);
  tcase_add_test(tc, test_swiglu_ffn);
  tcase_add_test(tc, test_swiglu_act);
  tcase_add_test(tc, test_swiglu_act_is_ffn);
  tcase_add_test(tc, test_bf16_weights);
  tcase_add_test(tc, test_quant_weights);
  tcase_add_test(tc, test_infer_weights);
  tcase_add_test(tc, test_argmax);
  tcase_add_test(tc, test_asked_rows);
  tcase_add_test(tc, test_score_route);
  tcase_add_test(tc, test_hash_route);
  tcase_add_test(tc, test_route_errors);
  tcase_add_test(tc, test_hc_pre);
  tcase_add_test(tc, test_hc_post);
  tcase_add_test(tc, test_hc_head);
  tcase_add_test(tc, test_compress_store);
  tcase_add_test(tc, test_compress_chain);
  tcase_add_test(tc, test_compress_pool_table);
  tcase_add_test(tc, test_index_scores);
  tcase_add_test(tc, test_index_select);
  tcase_add_test(tc, test_compress_errors);
  suite_add_tcase(s, tc);
  TCase *gpu = tcase_create("gpu");
  tcase_add_unchecked_fixture(gpu, dir_setup, dir_teardown);
  tcase_add_test(gpu, test_gpu_templates);
  tcase_add_test(gpu, test_gpu_symbols);
  tcase_add_test(gpu, test_gpu_build);
  tcase_add_test(gpu, test_gpu_math);
  tcase_add_test(gpu, test_gpu_route_math);
  tcase_add_test(gpu, test_gpu_x_swizzle);
  tcase_add_test(gpu, test_gpu_quant_stages_x);
  tcase_add_test(gpu, test_gpu_errors);
  tcase_add_test(gpu, test_gpu_compress_index);
  tcase_add_test(gpu, test_gpu_ffn);
  tcase_add_test(gpu, test_gpu_act);
  tcase_add_test(gpu, test_gpu_matmul);
  tcase_add_test(gpu, test_gpu_matmul_staged_x);
  tcase_add_test(gpu, test_gpu_matmul_mma);
  tcase_add_test(gpu, test_gpu_matmul_tiled);
  tcase_add_test(gpu, test_gpu_moe_mma);
  tcase_add_test(gpu, test_gpu_moe_tiled);
  tcase_add_test(gpu, test_gpu_asked_rows);
  tcase_add_test(gpu, test_gpu_sink_attention);
  tcase_add_test(gpu, test_gpu_sink_attention_groups);
  tcase_add_test(gpu, test_gpu_hc);
  tcase_add_test(gpu, test_gpu_moe_lowered);
  tcase_add_test(gpu, test_gpu_matmul_pair);
  tcase_add_test(gpu, test_gpu_moe_combine_add);
  tcase_add_test(gpu, test_gpu_norm_rope);
  tcase_add_test(gpu, test_gpu_fused_tails);
  tcase_add_test(gpu, test_argmax_parts);
  tcase_add_test(gpu, test_gpu_quant_matmuls);
  tcase_add_test(gpu, test_gpu_quant_ffn);
  suite_add_tcase(s, gpu);
  return s;
}

int main(void)
{
  SRunner *sr = srunner_create(kernels_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
