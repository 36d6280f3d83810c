/* emit_kernels.c - one kernel per distinct (kind, attrs, shapes): generate
 * each op's source for the targets asked for, keep one per symbol, write
 * them into the bundle for inspection and build one code object per
 * target: kernels/host.so from one C file per kernel, kernels/<arch>.hsaco
 * (AMD) or kernels/<arch>.cubin (NVIDIA, with its .ptx kept) from one
 * translation unit, kernels/<arch>.hip, holding every kernel. A code
 * object built before from the same sources by the same toolchain comes
 * from the kernel cache instead. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "emit.h"
#include "sha256.h"

const char *const emit_known_targets[] = {"host", "gfx1201", "gfx1151", "gfx1100", "gfx942", "sm_90", NULL};

enum target_family { TARGET_HOST, TARGET_AMD, TARGET_NVIDIA, TARGET_NFAMILIES };

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
  ir_xfree(all);
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
  ir_xfree(unsorted);
  *out_all = all;
  *out_n = n;
  return 0;
}

/* ---- the kernel cache ----
 * An entry holds the files of one code object (host.so; one host kernel's
 * object, which host.so is linked from; an .hsaco; a .ptx and its .cubin)
 * under the sha256 of everything that decides their bytes: the target,
 * the toolchain (toolchain_identity: tools, versions and command lines)
 * and each source's name and bytes. Its file is
 * CACHE/<key in hex>:
 *   ds4c kernel cache 1\n
 *   key <key in hex>\n
 *   file <name> <bytes> <sha256 in hex>\n      one line per file
 *   end\n
 *   the files' bytes, back to back.
 * An entry that does not parse, names another key or other files, or whose
 * bytes do not match their sizes and hashes is never used: the code object
 * is built and the entry written anew. An entry is written to a temporary
 * file and renamed into place, so a reader sees a whole entry or none. A
 * cache that cannot be read or written only costs the builds. */

#define CACHE_MAGIC "ds4c kernel cache 1\n"
#define CACHE_MAX_OUTPUTS 2

/* One toolchain run in the bundle's kernels folder: the sources it reads
 * and the files it writes, relative to that folder. */
typedef struct code_build {
  const char *kdir, *target;
  char *const *inputs;
  int ninputs;
  const char *outputs[CACHE_MAX_OUTPUTS];
  int noutputs;
} code_build;

_Static_assert((int)TARGET_NFAMILIES == (int)EMIT_TARGET_FAMILIES, "emit_cache holds an identity per target family");

void emit_cache_init(emit_cache *c, const char *dir) { *c = (emit_cache){.dir = dir}; }

void emit_cache_free(emit_cache *c) {
  for (int i = 0; i < TARGET_NFAMILIES; i++) ir_xfree(c->identity[i]);
  emit_cache_init(c, NULL);
}

static void to_hex(const uint8_t h[32], char out[65]) {
  for (int i = 0; i < 32; i++) snprintf(out + 2 * i, 3, "%02x", h[i]);
}

/* The whole file, NUL-terminated (for parsing), in *out (ir_xfree it);
 * -1 when it cannot be read. Running out of memory is no cache miss: it
 * ends the compile (ir_out_of_memory). */
static int read_whole(const char *path, char **out, size_t *out_len) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    if (errno == ENOMEM) ir_out_of_memory();
    return -1;
  }
  struct stat st;
  if (fstat(fileno(f), &st) || st.st_size < 0) {
    fclose(f);
    return -1;
  }
  size_t n = (size_t)st.st_size;
  char *buf = ir_try_realloc(NULL, n + 1);
  if (!buf) {
    fclose(f);
    ir_out_of_memory();
  }
  int bad = fread(buf, 1, n, f) != n || fgetc(f) != EOF;
  fclose(f);
  if (bad) {
    ir_xfree(buf);
    return -1;
  }
  buf[n] = 0;
  *out = buf;
  *out_len = n;
  return 0;
}

static int write_bytes(const char *path, const char *bytes, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f) return -1;
  int bad = fwrite(bytes, 1, n, f) != n;
  return fclose(f) || bad ? -1 : 0;
}

/* mkdir -p */
static int make_dirs(const char *path) {
  char buf[4096];
  if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf) return -1;
  for (char *c = buf + 1; *c; c++) {
    if (*c != '/') continue;
    *c = 0;
    if (mkdir(buf, 0777) && errno != EEXIST) return -1;
    *c = '/';
  }
  return mkdir(buf, 0777) && errno != EEXIST ? -1 : 0;
}

/* The entry's name: the sha256 of the target, its family's toolchain, the
 * outputs' names and each input's name, length and bytes. -1 when the
 * toolchain or an input cannot be read: then the build runs uncached. */
static int cache_key(emit_cache *c, const code_build *b, char key[65]) {
  int fam = target_family(b->target);
  if (!c->identity[fam] && !c->unknown[fam]) c->unknown[fam] = toolchain_identity(b->target, &c->identity[fam]) != 0;
  if (c->unknown[fam]) return -1;
  rt_sha256_ctx h;
  rt_sha256_init(&h);
  char line[4200];
  snprintf(line, sizeof line, "%starget %s\n", CACHE_MAGIC, b->target);
  rt_sha256_update(&h, line, strlen(line));
  rt_sha256_update(&h, c->identity[fam], strlen(c->identity[fam]));
  for (int i = 0; i < b->noutputs; i++) {
    snprintf(line, sizeof line, "output %s\n", b->outputs[i]);
    rt_sha256_update(&h, line, strlen(line));
  }
  for (int i = 0; i < b->ninputs; i++) {
    char path[4096 + 256], *bytes;
    size_t n;
    snprintf(path, sizeof path, "%s/%s", b->kdir, b->inputs[i]);
    if (read_whole(path, &bytes, &n)) return -1;
    snprintf(line, sizeof line, "input %s %zu\n", b->inputs[i], n);
    rt_sha256_update(&h, line, strlen(line));
    rt_sha256_update(&h, bytes, n);
    ir_xfree(bytes);
  }
  uint8_t sum[32];
  rt_sha256_final(&h, sum);
  to_hex(sum, key);
  return 0;
}

/* The next line of [*at, end), newline included, into line; 0 when there
 * is none that fits. */
static int next_line(const char **at, const char *end, char *line, size_t cap) {
  const char *nl = memchr(*at, '\n', (size_t)(end - *at));
  if (!nl || (size_t)(nl + 1 - *at) >= cap) return 0;
  size_t n = (size_t)(nl + 1 - *at);
  memcpy(line, *at, n);
  line[n] = 0;
  *at = nl + 1;
  return 1;
}

/* Checks an entry against its key and the files asked for; on success,
 * bytes[i] and len[i] point at output i's bytes inside buf. */
static int entry_valid(const char *buf, size_t n, const char *key, const code_build *b,
                       const char *bytes[CACHE_MAX_OUTPUTS], size_t len[CACHE_MAX_OUTPUTS]) {
  const char *at = buf, *end = buf + n;
  char line[512], expect[512], hex[CACHE_MAX_OUTPUTS][65];
  snprintf(expect, sizeof expect, "key %s\n", key);
  if (!next_line(&at, end, line, sizeof line) || strcmp(line, CACHE_MAGIC) != 0) return 0;
  if (!next_line(&at, end, line, sizeof line) || strcmp(line, expect) != 0) return 0;
  size_t total = 0;
  for (int i = 0; i < b->noutputs; i++) {
    char name[256];
    /* Parsed, then printed again: only the canonical line is accepted. */
    if (!next_line(&at, end, line, sizeof line) || sscanf(line, "file %255s %zu %64s", name, &len[i], hex[i]) != 3)
      return 0;
    snprintf(expect, sizeof expect, "file %s %zu %s\n", b->outputs[i], len[i], hex[i]);
    if (strcmp(line, expect) != 0 || len[i] > n) return 0;
    total += len[i];
  }
  if (!next_line(&at, end, line, sizeof line) || strcmp(line, "end\n") != 0 || (size_t)(end - at) != total) return 0;
  for (int i = 0; i < b->noutputs; i++) {
    uint8_t sum[32];
    char got[65];
    rt_sha256(at, len[i], sum);
    to_hex(sum, got);
    if (strcmp(got, hex[i]) != 0) return 0;
    bytes[i] = at;
    at += len[i];
  }
  return 1;
}

/* 1: the outputs were written from a valid entry; 0: there is none; -1:
 * the bundle could not be written (d says where). */
static int cache_fetch(const emit_cache *c, const char *key, const code_build *b, dsl_diag *d) {
  char path[4096 + 80], *buf;
  size_t n;
  snprintf(path, sizeof path, "%s/%s", c->dir, key);
  if (read_whole(path, &buf, &n)) return 0;
  const char *bytes[CACHE_MAX_OUTPUTS];
  size_t len[CACHE_MAX_OUTPUTS];
  int rc = entry_valid(buf, n, key, b, bytes, len);
  for (int i = 0; i < b->noutputs && rc > 0; i++) {
    snprintf(path, sizeof path, "%s/%s", b->kdir, b->outputs[i]);
    if (write_bytes(path, bytes[i], len[i]))
      rc = dsl_error(d, (dsl_pos){0}, "cannot write %s: %s", path, strerror(errno));
  }
  ir_xfree(buf);
  return rc;
}

/* Stores the outputs just built; a failure leaves the cache as it was. */
static void cache_store(const emit_cache *c, const char *key, const code_build *b) {
  char *bytes[CACHE_MAX_OUTPUTS] = {NULL};
  size_t len[CACHE_MAX_OUTPUTS];
  char path[4096 + 256], tmp[4096 + 128];
  int ok = make_dirs(c->dir) == 0;
  for (int i = 0; i < b->noutputs && ok; i++) {
    snprintf(path, sizeof path, "%s/%s", b->kdir, b->outputs[i]);
    ok = read_whole(path, &bytes[i], &len[i]) == 0;
  }
  snprintf(tmp, sizeof tmp, "%s/%s.tmp-%ld", c->dir, key, (long)getpid());
  FILE *f = ok ? fopen(tmp, "wb") : NULL;
  if (f) {
    fprintf(f, "%skey %s\n", CACHE_MAGIC, key);
    for (int i = 0; i < b->noutputs; i++) {
      uint8_t sum[32];
      char hex[65];
      rt_sha256(bytes[i], len[i], sum);
      to_hex(sum, hex);
      fprintf(f, "file %s %zu %s\n", b->outputs[i], len[i], hex);
    }
    fputs("end\n", f);
    for (int i = 0; i < b->noutputs; i++) fwrite(bytes[i], 1, len[i], f);
    int bad = ferror(f);
    snprintf(path, sizeof path, "%s/%s", c->dir, key);
    if (fclose(f) || bad || rename(tmp, path)) unlink(tmp);
  }
  for (int i = 0; i < b->noutputs; i++) ir_xfree(bytes[i]);
}

static int run_toolchain(const code_build *b, dsl_diag *d) {
  switch (target_family(b->target)) {
    case TARGET_HOST: return toolchain_compile_host(b->kdir, b->inputs[0], b->outputs[0], d);
    case TARGET_AMD: return toolchain_build_amdgpu(b->kdir, b->target, b->inputs[0], b->outputs[0], d);
    default: return toolchain_build_nvptx(b->kdir, b->target, b->inputs[0], b->outputs[0], b->outputs[1], d);
  }
}

/* 1: b's outputs were written from the cache; 0: they must be built, and
 * stored under key unless it is empty (no cache, or no key); -1: the
 * bundle could not be written (d says where). */
static int cache_lookup(emit_cache *c, const code_build *b, char key[65], dsl_diag *d) {
  key[0] = 0;
  if (!c->dir || cache_key(c, b, key)) {
    key[0] = 0;
    return 0;
  }
  return cache_fetch(c, key, b, d);
}

/* From the cache when it holds a valid entry, else built and stored. */
static int build_code_object(emit_cache *c, const code_build *b, dsl_diag *d) {
  char key[65];
  int hit = cache_lookup(c, b, key, d);
  if (hit) return hit < 0 ? -1 : 0;
  if (run_toolchain(b, d)) return -1;
  if (key[0]) cache_store(c, key, b);
  return 0;
}

/* kernels/host.so from the cache, else from each kernel's object (from
 * the cache, else compiled and stored), linked; the objects are removed,
 * so the bundle holds the sources and the library only. */
static int build_host_library(emit_cache *c, const code_build *lib, dsl_diag *d) {
  char key[65];
  int hit = cache_lookup(c, lib, key, d);
  if (hit) return hit < 0 ? -1 : 0;
  int n = lib->ninputs;
  char **objects = ir_xrealloc(NULL, (size_t)(n ? n : 1) * sizeof *objects);
  int rc = 0, made = 0;
  for (; made < n && !rc; made++) {
    const char *src = lib->inputs[made];
    size_t len = strlen(src) + 1; /* host/<symbol>.c: the same length as .o */
    objects[made] = ir_xrealloc(NULL, len);
    snprintf(objects[made], len, "%.*s.o", (int)(len - 3), src);
    code_build ob = {lib->kdir, lib->target, &lib->inputs[made], 1, {objects[made]}, 1};
    rc = build_code_object(c, &ob, d);
  }
  if (!rc) rc = toolchain_link_host(lib->kdir, objects, n, lib->outputs[0], d);
  if (!rc && key[0]) cache_store(c, key, lib);
  for (int j = 0; j < made; j++) {
    char path[4096 + 256];
    snprintf(path, sizeof path, "%s/%s", lib->kdir, objects[j]);
    unlink(path);
    ir_xfree(objects[j]);
  }
  ir_xfree(objects);
  return rc;
}

/* ---- code objects ---- */

static int build_host(emit_cache *c, const char *dir, const distinct *all, int n, emit_codeobj *co, dsl_diag *d) {
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
  code_build b = {path, "host", sources, n, {"host.so"}, 1};
  if (!rc) rc = build_host_library(c, &b, d);
  for (int j = 0; j < n; j++) ir_xfree(sources[j]);
  ir_xfree(sources);
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

static int build_gpu(emit_cache *c, const char *dir, const char *target, const distinct *all, int n,
                     emit_codeobj *co, dsl_diag *d) {
  char kdir[4096], unit[64], obj[64], ptx[64], path[4096 + 128];
  snprintf(kdir, sizeof kdir, "%s/kernels", dir);
  snprintf(unit, sizeof unit, "%s.hip", target);
  snprintf(path, sizeof path, "%s/%s", kdir, unit);
  if (write_gpu_unit(path, target, all, n, d)) return -1;
  int amd = target_family(target) == TARGET_AMD;
  snprintf(obj, sizeof obj, "%s.%s", target, amd ? "hsaco" : "cubin");
  snprintf(ptx, sizeof ptx, "%s.ptx", target);
  char *inputs[] = {unit};
  code_build b = amd ? (code_build){kdir, target, inputs, 1, {obj}, 1}
                     : (code_build){kdir, target, inputs, 1, {ptx, obj}, 2}; /* the .ptx is kept */
  int rc = build_code_object(c, &b, d);
  size_t len = strlen(obj) + 9;
  co->path = ir_xrealloc(NULL, len);
  snprintf(co->path, len, "kernels/%s", obj);
  snprintf(path, sizeof path, "%s/%s", dir, co->path);
  return rc ? -1 : hash_file(path, co->sha256, d);
}

int emit_kernels_build(ir_prog *p, const char *dir, char *const *targets, int ntargets, emit_kernels *out,
                       dsl_diag *d) {
  emit_cache none;
  emit_cache_init(&none, NULL);
  return emit_kernels_build_cached(p, dir, targets, ntargets, &none, out, d);
}

/* The targets' kernels, generated and sorted, and out's kernel table
 * (out->codeobjs stays empty). */
static int kernel_table(ir_prog *p, char *const *targets, int ntargets, emit_kernels *out, distinct **out_all,
                        int *out_n, dsl_diag *d) {
  memset(out, 0, sizeof *out);
  if (check_targets(targets, ntargets, d)) return -1;
  int need_host = 0, need_gpu = 0;
  for (int t = 0; t < ntargets; t++) {
    if (target_family(targets[t]) == TARGET_HOST)
      need_host = 1;
    else
      need_gpu = 1;
  }
  if (generate(p, need_host, need_gpu, out_all, out_n, d)) return -1;
  int n = *out_n;
  out->kernels = ir_xrealloc(NULL, (size_t)(n ? n : 1) * sizeof *out->kernels);
  out->nkernels = n;
  for (int j = 0; j < n; j++) {
    const kgen_kernel *k = &(*out_all)[j].gpu;
    out->kernels[j] = (emit_kernel){ir_strdup(k->symbol), k->kind, k->grid, k->block, k->shared, k->nbufs};
  }
  return 0;
}

int emit_kernels_list(ir_prog *p, char *const *targets, int ntargets, emit_kernels *out, dsl_diag *d) {
  distinct *all;
  int n;
  if (kernel_table(p, targets, ntargets, out, &all, &n, d)) return -1;
  distinct_free(all, n);
  return 0;
}

int emit_kernels_build_cached(ir_prog *p, const char *dir, char *const *targets, int ntargets, emit_cache *cache,
                              emit_kernels *out, dsl_diag *d) {
  distinct *all;
  int n;
  if (kernel_table(p, targets, ntargets, out, &all, &n, d)) return -1;

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
      rc = build_host(cache, dir, all, n, co, d);
    else
      rc = build_gpu(cache, dir, targets[t], all, n, co, d);
  }
  distinct_free(all, n);
  return rc ? -1 : 0;
}

void emit_kernels_free(emit_kernels *k) {
  for (int j = 0; j < k->nkernels; j++) ir_xfree(k->kernels[j].symbol);
  ir_xfree(k->kernels);
  for (int i = 0; i < k->ncodeobjs; i++) {
    ir_xfree(k->codeobjs[i].target);
    ir_xfree(k->codeobjs[i].path);
  }
  ir_xfree(k->codeobjs);
  memset(k, 0, sizeof *k);
}
