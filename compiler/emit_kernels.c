/* emit_kernels.c - one kernel per distinct (kind, attrs, shapes): generate
 * each op's source for the targets asked for, keep one per symbol, write
 * them into the bundle for inspection and build one code object per
 * target: kernels/host.so from one C file per kernel, kernels/<arch>.hsaco
 * (AMD) or kernels/<arch>.cubin (NVIDIA, with its .ptx kept) from one
 * translation unit, kernels/<arch>.hip, holding every kernel. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "emit.h"
#include "sha256.h"

const char *const emit_known_targets[] = {"host", "gfx1201", "gfx1151", "gfx1100", "gfx942", "sm_90", NULL};

enum target_family { TARGET_HOST, TARGET_AMD, TARGET_NVIDIA };

static int target_family(const char *target) {
  if (strncmp(target, "gfx", 3) == 0) return TARGET_AMD;
  if (strncmp(target, "sm_", 3) == 0) return TARGET_NVIDIA;
  return TARGET_HOST;
}

/* Every target known, none twice, at least one. */
static int check_targets(char *const *targets, int ntargets, dsl_diag *d) {
  if (ntargets < 1)
    return dsl_error(d, (dsl_pos){0},
                     "no kernel target: give at least one of host, gfx1201, gfx1151, gfx1100, gfx942, sm_90");
  for (int i = 0; i < ntargets; i++) {
    int known = 0;
    for (int k = 0; emit_known_targets[k] && !known; k++) known = strcmp(targets[i], emit_known_targets[k]) == 0;
    if (!known)
      return dsl_error(d, (dsl_pos){0},
                       "unknown kernel target '%s' (known: host, gfx1201, gfx1151, gfx1100, gfx942, sm_90)",
                       targets[i]);
    for (int j = 0; j < i; j++)
      if (strcmp(targets[i], targets[j]) == 0)
        return dsl_error(d, (dsl_pos){0}, "kernel target '%s' given twice", targets[i]);
  }
  return 0;
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

/* ---- the distinct kernels ---- */

/* One distinct kernel while building: its GPU source, and its host one
 * when the host is a target. */
typedef struct distinct {
  kgen_kernel host, gpu;
  const char *symbol; /* the same in both */
} distinct;

static int by_symbol(const void *a, const void *b) {
  return strcmp(((const distinct *)a)->symbol, ((const distinct *)b)->symbol);
}

static void distinct_free(distinct *all, int n) {
  for (int j = 0; j < n; j++) {
    kgen_kernel_free(&all[j].host);
    kgen_kernel_free(&all[j].gpu);
  }
  free(all);
}

/* What a GPU target cannot run. */
static int check_gpu_kernel(const ir_op *op, const kgen_kernel *k, dsl_diag *d) {
  if (k->shared <= KGEN_GPU_MAX_SHARED) return 0;
  return dsl_error(d, op->pos,
                   "%s: the GPU kernel needs %u bytes of shared memory per block, more than the %u every GPU "
                   "target allows",
                   k->kind, k->shared, KGEN_GPU_MAX_SHARED);
}

/* Generates every op's kernel, one per symbol, sorted by symbol; sets
 * ops[i].kernel to its index (-1 for copies). The GPU kernel is made even
 * for host-only builds: its block and shared memory are part of the plan,
 * whatever the targets. */
static int generate(ir_prog *p, int need_host, int need_gpu, distinct **out_all, int *out_n, dsl_diag *d) {
  distinct *all = ir_xrealloc(NULL, ((size_t)p->nops + 1) * sizeof *all);
  int n = 0;
  for (int i = 0; i < p->nops; i++) {
    ir_op *op = &p->ops[i];
    op->kernel = -1;
    if (op->kind == IR_OP_COPY) continue;
    distinct k = {0};
    if ((need_host && kgen_host(p, op, &k.host, d)) || kgen_gpu(p, op, &k.gpu, d) ||
        (need_gpu && check_gpu_kernel(op, &k.gpu, d))) {
      kgen_kernel_free(&k.host);
      kgen_kernel_free(&k.gpu);
      distinct_free(all, n);
      return -1;
    }
    k.symbol = k.gpu.symbol;
    int dup = -1;
    for (int j = 0; j < n && dup < 0; j++)
      if (strcmp(all[j].symbol, k.symbol) == 0) dup = j;
    if (dup >= 0) {
      kgen_kernel_free(&k.host);
      kgen_kernel_free(&k.gpu);
    } else {
      all[dup = n++] = k;
    }
    op->kernel = dup;
  }
  /* Sort, then match each op's symbol once more to its sorted position. */
  const char **unsorted = ir_xrealloc(NULL, (size_t)(n ? n : 1) * sizeof *unsorted);
  for (int j = 0; j < n; j++) unsorted[j] = all[j].symbol;
  qsort(all, (size_t)n, sizeof *all, by_symbol);
  for (int i = 0; i < p->nops; i++) {
    if (p->ops[i].kernel < 0) continue;
    const char *sym = unsorted[p->ops[i].kernel];
    for (int j = 0; j < n; j++)
      if (all[j].symbol == sym) p->ops[i].kernel = j;
  }
  free(unsorted);
  *out_all = all;
  *out_n = n;
  return 0;
}

/* ---- code objects ---- */

static int build_host(const char *dir, const distinct *all, int n, emit_codeobj *co, dsl_diag *d) {
  char path[4096];
  snprintf(path, sizeof path, "%s/kernels/host", dir);
  if (mkdir(path, 0777)) return dsl_error(d, (dsl_pos){0}, "cannot create %s: %s", path, strerror(errno));
  char **sources = ir_xrealloc(NULL, (size_t)(n ? n : 1) * sizeof *sources);
  int rc = 0;
  for (int j = 0; j < n; j++) {
    size_t len = strlen(all[j].symbol) + 8;
    sources[j] = ir_xrealloc(NULL, len);
    snprintf(sources[j], len, "host/%s.c", all[j].symbol);
    snprintf(path, sizeof path, "%s/kernels/%s", dir, sources[j]);
    if (!rc) rc = write_file(path, all[j].host.source, d);
  }
  snprintf(path, sizeof path, "%s/kernels", dir);
  if (!rc) rc = toolchain_build_host(path, sources, n, "host.so", d);
  for (int j = 0; j < n; j++) free(sources[j]);
  free(sources);
  co->path = ir_strdup("kernels/host.so");
  snprintf(path, sizeof path, "%s/%s", dir, co->path);
  return rc ? -1 : hash_file(path, co->sha256, d);
}

/* kernels/<target>.hip: the prelude, then every kernel in symbol order. */
static int write_gpu_unit(const char *path, const char *target, const distinct *all, int n, dsl_diag *d) {
  FILE *f = fopen(path, "wb");
  if (!f) return dsl_error(d, (dsl_pos){0}, "cannot write %s: %s", path, strerror(errno));
  fprintf(f,
          "/* %s.hip: every GPU kernel of this bundle, for %s, generated by ds4c\n"
          " * (emit_kernels); do not edit. One translation unit: the prelude maps\n"
          " * the HIP dialect to the target, then each kernel's defines, its\n"
          " * template and the #undef of its defines. */\n\n",
          target, target);
  fputs(kgen_gpu_prelude(), f);
  for (int j = 0; j < n; j++) {
    fputs("\n", f);
    fputs(all[j].gpu.source, f);
  }
  int bad = ferror(f);
  if (fclose(f) || bad) return dsl_error(d, (dsl_pos){0}, "cannot write %s: %s", path, strerror(errno));
  return 0;
}

static int build_gpu(const char *dir, const char *target, const distinct *all, int n, emit_codeobj *co, dsl_diag *d) {
  char kdir[4096], unit[64], obj[64], ptx[64], path[4096 + 128];
  snprintf(kdir, sizeof kdir, "%s/kernels", dir);
  snprintf(unit, sizeof unit, "%s.hip", target);
  snprintf(path, sizeof path, "%s/%s", kdir, unit);
  if (write_gpu_unit(path, target, all, n, d)) return -1;
  int rc;
  if (target_family(target) == TARGET_AMD) {
    snprintf(obj, sizeof obj, "%s.hsaco", target);
    rc = toolchain_build_amdgpu(kdir, target, unit, obj, d);
  } else {
    snprintf(obj, sizeof obj, "%s.cubin", target);
    snprintf(ptx, sizeof ptx, "%s.ptx", target);
    rc = toolchain_build_nvptx(kdir, target, unit, ptx, obj, d);
  }
  size_t len = strlen(obj) + 9;
  co->path = ir_xrealloc(NULL, len);
  snprintf(co->path, len, "kernels/%s", obj);
  snprintf(path, sizeof path, "%s/%s", dir, co->path);
  return rc ? -1 : hash_file(path, co->sha256, d);
}

int emit_kernels_build(ir_prog *p, const char *dir, char *const *targets, int ntargets, emit_kernels *out,
                       dsl_diag *d) {
  memset(out, 0, sizeof *out);
  if (check_targets(targets, ntargets, d)) return -1;
  int need_host = 0, need_gpu = 0;
  for (int t = 0; t < ntargets; t++) {
    if (target_family(targets[t]) == TARGET_HOST)
      need_host = 1;
    else
      need_gpu = 1;
  }
  distinct *all;
  int n;
  if (generate(p, need_host, need_gpu, &all, &n, d)) return -1;

  out->kernels = ir_xrealloc(NULL, (size_t)(n ? n : 1) * sizeof *out->kernels);
  out->nkernels = n;
  for (int j = 0; j < n; j++) {
    const kgen_kernel *k = &all[j].gpu;
    out->kernels[j] = (emit_kernel){ir_strdup(k->symbol), k->kind, k->grid, k->block, k->shared, k->nbufs};
  }

  char path[4096];
  snprintf(path, sizeof path, "%s/kernels", dir);
  int rc = 0;
  if (mkdir(path, 0777)) rc = dsl_error(d, (dsl_pos){0}, "cannot create %s: %s", path, strerror(errno));
  out->codeobjs = ir_xrealloc(NULL, (size_t)ntargets * sizeof *out->codeobjs);
  for (int t = 0; t < ntargets && !rc; t++) {
    emit_codeobj *co = &out->codeobjs[out->ncodeobjs++];
    memset(co, 0, sizeof *co);
    co->target = ir_strdup(targets[t]);
    if (target_family(targets[t]) == TARGET_HOST)
      rc = build_host(dir, all, n, co, d);
    else
      rc = build_gpu(dir, targets[t], all, n, co, d);
  }
  distinct_free(all, n);
  return rc ? -1 : 0;
}

void emit_kernels_free(emit_kernels *k) {
  for (int j = 0; j < k->nkernels; j++) free(k->kernels[j].symbol);
  free(k->kernels);
  for (int i = 0; i < k->ncodeobjs; i++) {
    free(k->codeobjs[i].target);
    free(k->codeobjs[i].path);
  }
  free(k->codeobjs);
  memset(k, 0, sizeof *k);
}
