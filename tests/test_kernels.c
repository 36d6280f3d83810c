/* test_kernels.c - the host kernels of every op kind: kgen_host specialises a
 * template, cc builds it into a .so, and its blocks run on random inputs for
 * several (pos, ntok) against a float64 implementation of docs/OPS.md written
 * here; plus dedupe, determinism, tie-breaking and error positions. The GPU
 * kernels cannot run here (no GPU): their tests build every kind for every
 * GPU target through emit_kernels_build and check the code objects, the
 * shared symbols, byte-identical rebuilds, the prelude's math against libm
 * and the toolchain's errors. */
#include <check.h>
#include <dlfcn.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "emit.h"
#include "kgen.h"
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
  int64_t n = 1;
  for (int j = 0; j < ndim; j++) {
    t->dim[j] = va_arg(ap, int64_t);
    n *= t->dim[j];
  }
  va_end(ap);
  t->bytes = n * 4;
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
 * write disjoint bytes, so the order must not matter). */
static void run(const built *b, bufs *bs, int pos, int ntok, int descending)
{
  int32_t step[4] = {pos, ntok, 7, 0};
  for (uint32_t i = 0; i < b->kk.grid; i++)
    b->fn(bs->b, step, descending ? b->kk.grid - 1 - i : i);
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

START_TEST(test_embed)
{
  enum { T = 4, V = 11, H = 9 };
  kt k;
  kt_init(&k, IR_OP_EMBED);
  kt_add(&k, 0, PLAN_I32, 1, (int64_t)T);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)V, (int64_t)H);
  kt_add(&k, 1, PLAN_F32, 2, (int64_t)T, (int64_t)H);
  built b;
  build(&k, &b);
  ck_assert_uint_eq(b.kk.grid, T);
  bufs bs;
  bufs_alloc(&bs, &k);
  /* ids outside [0, V) must give a zero row, not a read out of bounds. */
  const int32_t idsets[2][T] = {{3, 0, 10, 7}, {-1, V, 5, INT32_MAX}};
  for (int set = 0; set < 2; set++)
    for (int s = 0; s < NSTEPS; s++) {
      int ntok = g_steps[s][1];
      memcpy(bs.b[0], idsets[set], sizeof idsets[set]);
      fill_f32(bs.b[1], V * H, 1.0);
      fill_garbage(bs.b[2], T * H);
      run_checked(&b, &k, &bs, g_steps[s][0], ntok);
      const float *table = bs.b[1];
      double *ref = dalloc(T * H);
      for (int t = 0; t < ntok; t++) {
        int32_t id = idsets[set][t];
        for (int c = 0; c < H; c++)
          ref[t * H + c] = id >= 0 && id < V ? table[id * H + c] : 0.0;
      }
      /* A copy: exact, so tolerance 0. */
      check_rows("embed", bs.b[2], ref, T, H, ntok, 0.0);
      free(ref);
    }
  bufs_free(&bs);
  unbuild(&b);
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

/* ---- matmul: N = 150 makes three column tiles, the last one partial ---- */

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
  ck_assert_uint_eq(b.kk.grid, T * 3);
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

/* ---- rope ---- */

static void rope_case(int heads, int hd, int r, double theta, int pos_scale)
{
  enum { T = 4 };
  const int C = heads * hd;
  kt k;
  kt_init(&k, IR_OP_ROPE);
  k.op.iattr[0] = heads;
  k.op.iattr[1] = r;
  k.op.fattr[2] = theta;
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)T, (int64_t)C);
  kt_add(&k, 1, PLAN_F32, 2, (int64_t)T, (int64_t)C);
  built b;
  build(&k, &b);
  ck_assert_uint_eq(b.kk.grid, T);
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
          double phi = (double)(float)(pos + t) * pow((double)(float)theta, -2.0 * i / r);
          double x0 = xh[hd - r + 2 * i], x1 = xh[hd - r + 2 * i + 1];
          yh[hd - r + 2 * i] = x0 * cos(phi) - x1 * sin(phi);
          yh[hd - r + 2 * i + 1] = x0 * sin(phi) + x1 * cos(phi);
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
  rope_case(3, 16, 8, 10000.0, 1);  /* trailing channels rotate, the rest copy */
  rope_case(2, 8, 8, 500.0, 1);     /* the whole head rotates */
  rope_case(2, 6, 0, 10000.0, 1);   /* no rotation: a copy */
  rope_case(4, 16, 8, 10000.0, 350); /* positions up to 4200 */
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

/* A launch holding experts ex[0..n) of E = 5 (all when ex is NULL): its
 * weights have n rows, row r holding expert ex[r]. Slots of other experts
 * must be zero; the returned slots (caller frees) are the launch's output
 * for the last step, all tokens live. */
static float *moe_case(const int *ex, int n)
{
  enum { T = 4, K = 3, E = 5, H = 12, F = 7 };
  int rows = ex ? n : E, row_of[E];
  kt k;
  kt_init(&k, IR_OP_MOE_EXPERTS);
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
          act[f] = silu(g) * u;
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
  bufs_free(&bs);
  unbuild(&b);
  return last;
}

START_TEST(test_moe_experts)
{
  static const int range[] = {2, 3}, list[] = {0, 4, 1};
  free(moe_case(NULL, 0)); /* one launch for all experts */
  free(moe_case(range, 2)); /* a split: experts 2 and 3 */
  free(moe_case(list, 3));  /* a list, rows out of expert order */
}
END_TEST

/* The parts of a split sum to the unsplit slots bit for bit, through the
 * sum_parts kernel that merges them. */
START_TEST(test_moe_split_is_exact)
{
  enum { T = 4, K = 3, H = 12, N = T * K * H };
  static const int a[] = {0, 2, 4}, b2[] = {1, 3};
  float *whole = moe_case(NULL, 0), *pa = moe_case(a, 3), *pb = moe_case(b2, 2);
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

START_TEST(test_swiglu_ffn)
{
  enum { T = 4, H = 12, F = 20 };
  kt k;
  kt_init(&k, IR_OP_SWIGLU_FFN);
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
        act[f] = silu(g) * u;
      }
      for (int c = 0; c < H; c++)
        for (int f = 0; f < F; f++)
          ref[t * H + c] += act[f] * w2[c * F + f];
    }
    check_rows("swiglu_ffn", bs.b[4], ref, T, H, ntok, REL_TOL);
    free(ref);
  }
  bufs_free(&bs);
  unbuild(&b);
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
                                      "sum_parts"};
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

  kt_init(&k, IR_OP_MATMUL);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)4, (int64_t)8);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)16, (int64_t)9);
  kt_add(&k, 1, PLAN_F32, 2, (int64_t)4, (int64_t)16);
  expect_error(&k, "dimension 1 (K) must be 8 as in input x");

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

  kt_init(&k, IR_OP_SUM_PARTS);
  k.op.iattr[0] = 3;
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)8, (int64_t)5);
  kt_add(&k, 1, PLAN_F32, 2, (int64_t)4, (int64_t)5);
  expect_error(&k, "sum_parts: parts (t0) must be 3 copies of the shape of y (t1) along dimension 0");

  kt_init(&k, IR_OP_COPY);
  expect_error(&k, "has no host kernel");
  kt_init(&k, IR_NOPKIND + 3);
  expect_error(&k, "has no host kernel");
}
END_TEST

/* ==== GPU kernels ==== */

/* Every op kind at small shapes (tiny-moe's, plus the corners: a partial
 * matmul tile, rope without rotation, attention heads wider than a block,
 * a split expert op, an ffn in two chunks), as one program for
 * emit_kernels_build. */
#define MP_MAXT 64
#define MP_MAXOPS 20

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
  rmsnorm_op(&k, 4, 64, 1e-6);
  mp_take(m, &k);
  kt_init(&k, IR_OP_MATMUL); /* 150 columns: three tiles, the last partial */
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)4, (int64_t)64);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)150, (int64_t)64);
  kt_add(&k, 1, PLAN_F32, 2, (int64_t)4, (int64_t)150);
  mp_take(m, &k);
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
  for (int split = 0; split < 2; split++) {
    int64_t rows = split ? 2 : 8;
    kt_init(&k, IR_OP_MOE_EXPERTS);
    if (split) {
      k.op.expert_row = split_rows;
      k.op.nexperts = 8;
    }
    kt_add(&k, 0, PLAN_F32, 2, (int64_t)4, (int64_t)64);
    kt_add(&k, 0, PLAN_I32, 2, (int64_t)4, (int64_t)2);
    kt_add(&k, 0, PLAN_F32, 3, rows, (int64_t)32, (int64_t)64);
    kt_add(&k, 0, PLAN_F32, 3, rows, (int64_t)32, (int64_t)64);
    kt_add(&k, 0, PLAN_F32, 3, rows, (int64_t)64, (int64_t)32);
    kt_add(&k, 1, PLAN_F32, 3, (int64_t)4, (int64_t)2, (int64_t)64);
    mp_take(m, &k);
  }
  kt_init(&k, IR_OP_MOE_COMBINE);
  kt_add(&k, 0, PLAN_F32, 3, (int64_t)4, (int64_t)2, (int64_t)64);
  kt_add(&k, 0, PLAN_F32, 2, (int64_t)4, (int64_t)2);
  kt_add(&k, 1, PLAN_F32, 2, (int64_t)4, (int64_t)64);
  mp_take(m, &k);
  for (int64_t f = 32; f <= 2100; f += 2068) { /* one ffn chunk, and two */
    kt_init(&k, IR_OP_SWIGLU_FFN);
    kt_add(&k, 0, PLAN_F32, 2, (int64_t)4, (int64_t)64);
    kt_add(&k, 0, PLAN_F32, 2, f, (int64_t)64);
    kt_add(&k, 0, PLAN_F32, 2, f, (int64_t)64);
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
}

static const char *const g_kinds[] = {"embed", "rmsnorm", "matmul", "rope", "cache_write", "attention",
                                      "add", "topk_route", "moe_experts", "moe_combine", "swiglu_ffn",
                                      "argmax", "sum_parts"};
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
}
END_TEST

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
    free(ptx);
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
             "extern \"C\" void m_sincosf(float x, float *s, float *c) { ds4_sincosf(x, s, c); }\n",
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
  *(void **)&ex = dlsym(dl, "m_expf");
  *(void **)&sc = dlsym(dl, "m_sincosf");
  ck_assert(ex && sc);

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
  kt_init(&k, IR_OP_COPY);
  expect_gpu_error(&k, "has no GPU kernel");
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
  tcase_add_test(tc, test_rope);
  tcase_add_test(tc, test_cache_write);
  tcase_add_test(tc, test_attention);
  tcase_add_test(tc, test_add);
  tcase_add_test(tc, test_topk_route);
  tcase_add_test(tc, test_moe_experts);
  tcase_add_test(tc, test_moe_split_is_exact);
  tcase_add_test(tc, test_moe_combine);
  tcase_add_test(tc, test_swiglu_ffn);
  tcase_add_test(tc, test_argmax);
  suite_add_tcase(s, tc);
  TCase *gpu = tcase_create("gpu");
  tcase_add_unchecked_fixture(gpu, dir_setup, dir_teardown);
  tcase_add_test(gpu, test_gpu_templates);
  tcase_add_test(gpu, test_gpu_symbols);
  tcase_add_test(gpu, test_gpu_build);
  tcase_add_test(gpu, test_gpu_math);
  tcase_add_test(gpu, test_gpu_errors);
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
