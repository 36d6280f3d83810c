/* host_matmul.c - host_matmul_bench: the cpu backend's matmul columns
 * (ds4h_matmul_cols, compiler/kernels/host/prelude.h) against the loop
 * they replaced, one output column at a time, on one thread, in one run.
 *
 *   host_matmul_bench [--runs R]
 *
 * For each weight dtype (f32, bf16, f8e4m3, mxfp4) a 4096 x 4096 weight of
 * random values (f32 and bf16: multiples of 1/64 below 100/64 in
 * magnitude; f8e4m3 and mxfp4: random codes, E8M0 scales 2^-8 to 2^2) and
 * x of multiples of 1/1000 in [-1, 1], at 1 token slot (a
 * decode step) and 16 (a prefill chunk): the median of R runs of each over
 * every column, microseconds, the weight's bytes a second, and ours over
 * the loop before; then whether every output has the loop's bits (it
 * must: each output sums k ascending either way). Exits 1 if one differs. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../compiler/kernels/host/prelude.h"

#define NCOL 4096
#define NK 4096
#define MAX_RUNS 64

/* The loop before: a column at a time, one chain. */
static void cols_one_chain(const float *x, const void *w, int64_t dt, float *y, int64_t m0, int64_t m1,
                           int64_t nk, int64_t ncol, int64_t n0, int64_t n1) {
  float buf[nk];
  for (int64_t n = n0; n < n1; n++) {
    const float *wr = ds4h_weight_row(w, dt, ncol, nk, n, buf);
    for (int64_t t = m0; t < m1; t++) {
      float acc = 0.0f;
      for (int64_t k = 0; k < nk; k++) acc += x[t * nk + k] * wr[k];
      y[t * ncol + n] = acc;
    }
  }
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* A weight of dtype dt as docs/PLAN.md lays it out, random; *bytes its size. */
static void *make_weight(int64_t dt, uint64_t *seed, size_t *bytes) {
  size_t n = (size_t)NCOL * NK, data = dt == DS4_DT_F32 ? 4 * n : dt == DS4_DT_BF16 ? 2 * n
                                        : dt == DS4_DT_F8E4M3 ? n : n / 2;
  size_t scales = dt == DS4_DT_F8E4M3 ? (NCOL / 128) * (NK / 128) : dt == DS4_DT_MXFP4 ? NCOL * (NK / 32) : 0;
  *bytes = (data + scales + 15) / 16 * 16;
  uint8_t *w = malloc(*bytes);
  if (!w) return NULL;
  for (size_t i = 0; i < *bytes; i++) {
    *seed = *seed * 6364136223846793005ull + 1442695040888963407ull;
    w[i] = (uint8_t)(*seed >> 56);
  }
  /* f32 and bf16: multiples of 1/64 in [-100/64, 99/64], exact in bf16 */
  if (dt == DS4_DT_F32)
    for (size_t i = 0; i < n; i++) ((float *)w)[i] = (float)((int)(w[4 * i] % 200) - 100) / 64.0f;
  if (dt == DS4_DT_BF16)
    for (size_t i = 0; i < n; i++) {
      union {
        float f;
        uint32_t u;
      } v = {(float)((int)(w[2 * i] % 200) - 100) / 64.0f};
      ((uint16_t *)w)[i] = (uint16_t)(v.u >> 16);
    }
  if (dt == DS4_DT_F8E4M3)
    for (size_t i = 0; i < n; i++)
      if ((w[i] & 0x7f) == 0x7f) w[i] = 0;
  for (size_t i = 0; i < scales; i++) w[data + i] = (uint8_t)(119 + w[data + i] % 11);
  return w;
}

int main(int argc, char **argv) {
  int runs = 5;
  if (argc == 3 && !strcmp(argv[1], "--runs")) runs = atoi(argv[2]);
  if (argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
    printf("usage: host_matmul_bench [--runs R]\n");
    return 0;
  }
  if ((argc != 1 && argc != 3) || runs < 1 || runs > MAX_RUNS) {
    fprintf(stderr, "usage: host_matmul_bench [--runs R]  (R from 1 to %d)\n", MAX_RUNS);
    return 64;
  }
  static const int64_t dts[] = {DS4_DT_F32, DS4_DT_BF16, DS4_DT_F8E4M3, DS4_DT_MXFP4};
  static const char *names[] = {"f32", "bf16", "f8e4m3", "mxfp4"};
  static const int slots[] = {1, 16};
  uint64_t seed = 1;
  float *x = malloc(16 * NK * sizeof *x), *ya = malloc(16 * NCOL * sizeof *ya), *yb = malloc(16 * NCOL * sizeof *yb);
  if (!x || !ya || !yb) return 1;
  for (int i = 0; i < 16 * NK; i++) x[i] = (float)(i * 7919 % 2001 - 1000) / 1000.0f;
  int differ = 0;
  printf("| weight 4096 x 4096 | slots | ds4h_matmul_cols | a column at a time | ours / before | bits |\n");
  printf("|---|---|---|---|---|---|\n");
  for (int d = 0; d < 4; d++) {
    size_t bytes;
    void *w = make_weight(dts[d], &seed, &bytes);
    if (!w) return 1;
    for (int si = 0; si < 2; si++) {
      int m = slots[si];
      double ta[MAX_RUNS], tb[MAX_RUNS];
      for (int r = 0; r < runs; r++) {
        double t0 = now_s();
        ds4h_matmul_cols(x, w, dts[d], ya, 0, m, NK, NCOL, 0, NCOL, 0, m);
        double t1 = now_s();
        cols_one_chain(x, w, dts[d], yb, 0, m, NK, NCOL, 0, NCOL);
        double t2 = now_s();
        ta[r] = t1 - t0;
        tb[r] = t2 - t1;
      }
      qsort(ta, (size_t)runs, sizeof *ta, cmp_double);
      qsort(tb, (size_t)runs, sizeof *tb, cmp_double);
      double a = ta[runs / 2], b = tb[runs / 2];
      int same = memcmp(ya, yb, (size_t)m * NCOL * sizeof *ya) == 0;
      differ |= !same;
      printf("| %s | %d | %.0f us (%.2f GB/s) | %.0f us (%.2f GB/s) | %.2f | %s |\n", names[d], m, a * 1e6,
             (double)bytes / a * 1e-9, b * 1e6, (double)bytes / b * 1e-9, a / b, same ? "the same" : "DIFFER");
    }
    free(w);
  }
  free(x);
  free(ya);
  free(yb);
  return differ;
}
