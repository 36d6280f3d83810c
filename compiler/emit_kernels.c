/* emit_kernels.c - one kernel per distinct (kind, attrs, shapes, target):
 * generate each op's source, keep one per symbol, write them into the
 * bundle for inspection and build the host code object from them. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "emit.h"
#include "sha256.h"

static int by_symbol(const void *a, const void *b) {
  return strcmp(((const kgen_kernel *)a)->symbol, ((const kgen_kernel *)b)->symbol);
}

static int write_file(const char *path, const char *text, dsl_diag *d) {
  FILE *f = fopen(path, "wb");
  if (!f) return dsl_error(d, (dsl_pos){0}, "cannot write %s: %s", path, strerror(errno));
  size_t n = strlen(text);
  int bad = fwrite(text, 1, n, f) != n;
  if (fclose(f) || bad) return dsl_error(d, (dsl_pos){0}, "cannot write %s: %s", path, strerror(errno));
  return 0;
}

static int hash_file(const char *path, uint8_t out[32], dsl_diag *d) {
  FILE *f = fopen(path, "rb");
  if (!f) return dsl_error(d, (dsl_pos){0}, "cannot read %s: %s", path, strerror(errno));
  rt_sha256_ctx c;
  rt_sha256_init(&c);
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) rt_sha256_update(&c, buf, n);
  int bad = ferror(f);
  fclose(f);
  if (bad) return dsl_error(d, (dsl_pos){0}, "cannot read %s", path);
  rt_sha256_final(&c, out);
  return 0;
}

int emit_kernels_build(ir_prog *p, const char *dir, emit_kernels *out, dsl_diag *d) {
  memset(out, 0, sizeof *out);
  kgen_kernel *all = calloc((size_t)p->nops + 1, sizeof *all);
  if (!all) abort();
  /* One kernel per symbol; ops[i].kernel holds its index until the sort,
   * then the symbols are matched once more to sorted positions. */
  int n = 0;
  for (int i = 0; i < p->nops; i++) {
    p->ops[i].kernel = -1;
    if (p->ops[i].kind == IR_OP_COPY) continue;
    kgen_kernel k;
    if (kgen_host(p, &p->ops[i], &k, d)) {
      for (int j = 0; j < n; j++) kgen_kernel_free(&all[j]);
      free(all);
      return -1;
    }
    int dup = -1;
    for (int j = 0; j < n && dup < 0; j++)
      if (strcmp(all[j].symbol, k.symbol) == 0) dup = j;
    if (dup >= 0) kgen_kernel_free(&k);
    else all[dup = n++] = k;
    p->ops[i].kernel = dup;
  }
  const char **unsorted = malloc((size_t)(n ? n : 1) * sizeof *unsorted);
  if (!unsorted) abort();
  for (int j = 0; j < n; j++) unsorted[j] = all[j].symbol;
  qsort(all, (size_t)n, sizeof *all, by_symbol);
  for (int i = 0; i < p->nops; i++) {
    if (p->ops[i].kernel < 0) continue;
    const char *sym = unsorted[p->ops[i].kernel];
    for (int j = 0; j < n; j++)
      if (all[j].symbol == sym) p->ops[i].kernel = j;
  }
  free(unsorted);
  out->kernels = all;
  out->nkernels = n;
  int rc = 0;

  char path[4096];
  snprintf(path, sizeof path, "%s/kernels", dir);
  if (mkdir(path, 0777)) return dsl_error(d, (dsl_pos){0}, "cannot create %s: %s", path, strerror(errno));
  snprintf(path, sizeof path, "%s/kernels/host", dir);
  if (mkdir(path, 0777)) return dsl_error(d, (dsl_pos){0}, "cannot create %s: %s", path, strerror(errno));
  char **sources = calloc((size_t)n + 1, sizeof *sources);
  if (!sources) abort();
  for (int j = 0; j < n && !rc; j++) {
    snprintf(path, sizeof path, "%s/kernels/host/%s.c", dir, all[j].symbol);
    rc = write_file(path, all[j].source, d);
    size_t len = strlen(all[j].symbol) + 8;
    sources[j] = malloc(len);
    if (!sources[j]) abort();
    snprintf(sources[j], len, "host/%s.c", all[j].symbol);
  }
  snprintf(path, sizeof path, "%s/kernels", dir);
  if (!rc) rc = toolchain_build_host(path, sources, n, "host.so", d);
  for (int j = 0; j < n; j++) free(sources[j]);
  free(sources);
  snprintf(path, sizeof path, "%s/kernels/host.so", dir);
  if (!rc) rc = hash_file(path, out->host_sha256, d);
  return rc ? -1 : 0;
}

void emit_kernels_free(emit_kernels *k) {
  for (int j = 0; j < k->nkernels; j++) kgen_kernel_free(&k->kernels[j]);
  free(k->kernels);
  memset(k, 0, sizeof *k);
}
