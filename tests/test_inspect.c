/* test_inspect.c - ds4c inspect: the ELF, msgpack and .nv.info readers give
 * the numbers the toolchains print for code objects built here (AMD and
 * NVIDIA kernels from one source, a host shared object), every truncated or
 * corrupted code object gives an error, not a crash, and the report of a
 * compiled bundle lists every kernel on every target and refuses a damaged
 * bundle naming what is wrong. */
#include <check.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "inspect.h"
#include "occupancy.h"
#include "pipeline.h"
#include "plan.h"
#include "sha256.h"
#include "test_util.h"

/* CUDA is not a Debian package: the machines have it at this path. */
#define PTXAS "/usr/local/cuda/bin/ptxas"

/* One source for every target. tiny_scale uses LDS (shared memory),
 * tiny_local a private array (scratch, a stack frame), tiny_add neither. */
static const char kernel_src[] =
    "#if defined(__AMDGCN__)\n"
    "#define TID() __builtin_amdgcn_workitem_id_x()\n"
    "#define BARRIER() __builtin_amdgcn_s_barrier()\n"
    "#else\n"
    "#define TID() __nvvm_read_ptx_sreg_tid_x()\n"
    "#define BARRIER() __nvvm_bar_sync(0)\n"
    "#endif\n"
    "extern \"C\" __attribute__((global)) void tiny_scale(void *const *bufs, const int *step) {\n"
    "  __attribute__((shared)) float s[256];\n"
    "  float *x = (float *)bufs[0];\n"
    "  int t = TID();\n"
    "  s[t] = x[t] * (float)*step;\n"
    "  BARRIER();\n"
    "  x[t] = s[255 - t];\n"
    "}\n"
    "extern \"C\" __attribute__((global)) void tiny_add(void *const *bufs, const int *step) {\n"
    "  float *x = (float *)bufs[0];\n"
    "  const float *y = (const float *)bufs[1];\n"
    "  int t = TID();\n"
    "  x[t] += y[t] + (float)*step;\n"
    "}\n"
    "extern \"C\" __attribute__((global)) void tiny_local(void *const *bufs, const int *step) {\n"
    "  volatile float loc[64];\n"
    "  float *x = (float *)bufs[0];\n"
    "  int t = TID();\n"
    "  for (int i = 0; i < 64; i++) loc[i] = x[i + t];\n"
    "  x[t] = loc[(*step + t) & 63];\n"
    "}\n";

static const char host_src[] =
    "void ds4k_small(float *x) { x[0] += 1.0f; }\n"
    "void ds4k_loop(float *x, int n) { for (int i = 0; i < n; i++) x[i] = x[i] * 2.0f + (float)i; }\n"
    "static int helper(int v) { return v * 3; }\n"
    "int ds4k_uses_helper(int v) { return helper(v) + 1; }\n";

enum { NKERNELS = 3 };

static char tmpdir[] = "/tmp/ds4-insp-XXXXXX";

static void setup(void) {
  tu_chdir_source();
  tu_tmpdir_make(tmpdir);
}

static void teardown(void) { tu_tmpdir_remove(tmpdir); }

/* A tool the test needs: its absence fails the test, saying so. */
static void need_tool(const char *tool) {
  char cmd[512];
  snprintf(cmd, sizeof cmd, "command -v %s >/dev/null 2>&1", tool);
  ck_assert_msg(system(cmd) == 0,
                "%s is missing (scripts/setup.sh installs clang-19, lld-19 and llvm-19; CUDA is at /usr/local/cuda)", tool);
}

static void run_ok(const char *cmd) {
  char *out;
  int rc = tu_run(cmd, &out);
  ck_assert_msg(rc == 0, "%s: exit %d:\n%s", cmd, rc, out);
  free(out);
}

/* Builds tmpdir/k.hsaco (gfx1201; clang links it with lld), k942.hsaco
 * (gfx942, which has AGPRs), k.cubin (sm_90; ptxas -v's report in
 * ptxas.txt) and h.so (host). */
static void build_code_objects(void) {
  need_tool("clang-19");
  need_tool("ld.lld-19");
  need_tool("llvm-readelf-19");
  need_tool(PTXAS);
  char path[128], cmd[1024];
  snprintf(path, sizeof path, "%s/k.hip", tmpdir);
  tu_write_text(path, kernel_src);
  snprintf(path, sizeof path, "%s/h.c", tmpdir);
  tu_write_text(path, host_src);
  static const char *const amd[][2] = {{"gfx1201", "k.hsaco"}, {"gfx942", "k942.hsaco"}};
  for (int i = 0; i < 2; i++) {
    snprintf(cmd, sizeof cmd,
             "cd %s && clang-19 -x hip --cuda-device-only --offload-arch=%s -nogpulib -nogpuinc -O3 "
             "--no-gpu-bundle-output -o %s k.hip",
             tmpdir, amd[i][0], amd[i][1]);
    run_ok(cmd);
  }
  snprintf(cmd, sizeof cmd,
           "cd %s && clang-19 -x cuda --cuda-device-only --cuda-gpu-arch=sm_90 -nocudalib -nocudainc "
           "-Wno-unknown-cuda-version -O3 -S -o k.ptx k.hip && " PTXAS " -v -arch=sm_90 k.ptx -o k.cubin > ptxas.txt",
           tmpdir);
  run_ok(cmd);
  snprintf(cmd, sizeof cmd, "cd %s && clang-19 -shared -fPIC -O2 -o h.so h.c", tmpdir);
  run_ok(cmd);
}

static void read_codeobj(const char *file, insp_codeobj *out) {
  char path[128];
  snprintf(path, sizeof path, "%s/%s", tmpdir, file);
  size_t len;
  uint8_t *b = (uint8_t *)tu_slurp(path, &len);
  rt_status st = insp_read_codeobj(path, b, len, out);
  ck_assert_msg(st == NULL, "%s", rt_status_msg(st));
  free(b);
}

static const insp_kernel *must_find(const insp_codeobj *c, const char *name) {
  const insp_kernel *k = insp_find_kernel(c, name);
  ck_assert_msg(k != NULL, "no kernel %s", name);
  return k;
}

/* ---- the readers against the toolchains' own dumps ----------------------- */

/* A kernel's fields in `llvm-readelf-19 --notes`: each kernel's map starts
 * with "  - .key:", its fields are indented by 4, nested ones deeper. */
enum { F_SGPR, F_VGPR, F_AGPR, F_LDS, F_SCRATCH, F_KERNARG, NFIELDS };
static const char *const amd_keys[NFIELDS] = {".sgpr_count", ".vgpr_count", ".agpr_count", ".group_segment_fixed_size",
                                              ".private_segment_fixed_size", ".kernarg_segment_size"};

typedef struct readelf_kernel {
  char name[64];
  int64_t v[NFIELDS];
} readelf_kernel;

static int parse_readelf_notes(char *text, readelf_kernel *out, int max) {
  int n = -1;
  for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
    if (strncmp(line, "  - .", 5) == 0) {
      ck_assert_int_lt(++n, max);
      memset(&out[n], 0, sizeof out[n]);
      for (int f = 0; f < NFIELDS; f++) out[n].v[f] = INSP_UNKNOWN;
    } else if (n < 0 || strncmp(line, "    .", 5) != 0) {
      continue;
    }
    char *key = line + 4, *colon = strchr(key, ':');
    if (!colon) continue;
    *colon = 0;
    char *value = colon + 1 + strspn(colon + 1, " ");
    if (strcmp(key, ".name") == 0) snprintf(out[n].name, sizeof out[n].name, "%s", value);
    for (int f = 0; f < NFIELDS; f++)
      if (strcmp(key, amd_keys[f]) == 0) out[n].v[f] = strtoll(value, NULL, 10);
  }
  return n + 1;
}

static void check_amd(const char *file, bool has_agpr) {
  insp_codeobj c;
  read_codeobj(file, &c);
  ck_assert_int_eq(c.kind, INSP_AMDGPU);
  ck_assert_uint_eq(c.nkernels, NKERNELS);
  char cmd[256], *notes;
  snprintf(cmd, sizeof cmd, "llvm-readelf-19 --notes %s/%s", tmpdir, file);
  ck_assert_int_eq(tu_run(cmd, &notes), 0);
  readelf_kernel ref[8];
  int nref = parse_readelf_notes(notes, ref, 8);
  ck_assert_int_eq(nref, NKERNELS);
  for (int i = 0; i < nref; i++) {
    const insp_kernel *k = must_find(&c, ref[i].name);
    int64_t got[NFIELDS] = {k->sgpr, k->vgpr, k->agpr, k->lds, k->scratch, k->kernarg};
    for (int f = 0; f < NFIELDS; f++)
      ck_assert_msg(got[f] == ref[i].v[f], "%s %s %s: read %lld, llvm-readelf says %lld", file, ref[i].name,
                    amd_keys[f], (long long)got[f], (long long)ref[i].v[f]);
    ck_assert_int_gt(k->sgpr, 0);
    ck_assert_int_gt(k->vgpr, 0);
    ck_assert_int_eq(k->regs, INSP_UNKNOWN);
    ck_assert_int_eq(k->agpr == INSP_UNKNOWN, !has_agpr);
  }
  /* the kernels do use what they were written to use */
  ck_assert_int_eq(must_find(&c, "tiny_scale")->lds, 1024);
  ck_assert_int_eq(must_find(&c, "tiny_add")->lds, 0);
  ck_assert_int_gt(must_find(&c, "tiny_local")->scratch, 0);
  ck_assert_int_eq(must_find(&c, "tiny_add")->kernarg, 16);
  free(notes);
  insp_codeobj_free(&c);
}

START_TEST(amdgpu_matches_llvm_readelf) {
  build_code_objects();
  check_amd("k.hsaco", false);
  check_amd("k942.hsaco", true);
}
END_TEST

/* `ptxas -v` per entry function: "Compiling entry function 'NAME'", then
 * "N bytes stack frame" and "Used N registers[, ...][, N bytes smem]". */
typedef struct ptxas_kernel {
  char name[64];
  int64_t regs, smem, frame;
} ptxas_kernel;

static int parse_ptxas(char *text, ptxas_kernel *out, int max) {
  int n = -1;
  for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
    char *p;
    if ((p = strstr(line, "Compiling entry function '"))) {
      ck_assert_int_lt(++n, max);
      memset(&out[n], 0, sizeof out[n]);
      p += strlen("Compiling entry function '");
      snprintf(out[n].name, sizeof out[n].name, "%.*s", (int)strcspn(p, "'"), p);
    } else if (n < 0) {
      continue;
    } else if (strstr(line, "bytes stack frame")) {
      out[n].frame = strtoll(line + strspn(line, " "), NULL, 10);
    } else if ((p = strstr(line, "Used "))) {
      out[n].regs = strtoll(p + 5, NULL, 10);
      char *smem = strstr(line, " bytes smem");
      if (smem) {
        while (smem > line && smem[-1] >= '0' && smem[-1] <= '9') smem--;
        out[n].smem = strtoll(smem, NULL, 10);
      }
    }
  }
  return n + 1;
}

START_TEST(cuda_matches_ptxas) {
  build_code_objects();
  insp_codeobj c;
  read_codeobj("k.cubin", &c);
  ck_assert_int_eq(c.kind, INSP_CUDA);
  ck_assert_uint_eq(c.nkernels, NKERNELS);
  char path[128];
  snprintf(path, sizeof path, "%s/ptxas.txt", tmpdir);
  size_t len;
  char *text = tu_slurp(path, &len);
  text[len] = 0;
  ptxas_kernel ref[8];
  int nref = parse_ptxas(text, ref, 8);
  ck_assert_int_eq(nref, NKERNELS);
  for (int i = 0; i < nref; i++) {
    const insp_kernel *k = must_find(&c, ref[i].name);
    ck_assert_msg(k->regs == ref[i].regs, "%s: %lld registers, ptxas says %lld", ref[i].name, (long long)k->regs,
                  (long long)ref[i].regs);
    ck_assert_msg(k->stack == ref[i].frame, "%s: stack %lld, ptxas says %lld", ref[i].name, (long long)k->stack,
                  (long long)ref[i].frame);
    /* On sm_90 the .nv.shared.<kernel> section of a kernel that uses shared
     * memory also holds the 1 KiB the driver reserves per block; cuobjdump
     * --dump-resource-usage (CUDA 13.0, checked once on an H200 machine)
     * reports the section size as SHARED, and ptxas the declared bytes. */
    int64_t want = ref[i].smem ? ref[i].smem + 1024 : 0;
    ck_assert_msg(k->shared == want, "%s: shared %lld, ptxas says %lld bytes smem", ref[i].name, (long long)k->shared,
                  (long long)ref[i].smem);
    ck_assert_int_eq(k->local, 0);
    ck_assert_int_gt(k->regs, 0);
    ck_assert_int_eq(k->sgpr, INSP_UNKNOWN);
  }
  ck_assert_int_eq(must_find(&c, "tiny_scale")->shared, 1024 + 1024);
  ck_assert_int_gt(must_find(&c, "tiny_local")->stack, 0);
  free(text);
  insp_codeobj_free(&c);
}
END_TEST

START_TEST(host_matches_llvm_readelf) {
  build_code_objects();
  insp_codeobj c;
  read_codeobj("h.so", &c);
  ck_assert_int_eq(c.kind, INSP_HOST);
  char cmd[256], *syms;
  snprintf(cmd, sizeof cmd, "llvm-readelf-19 --dyn-syms %s/h.so", tmpdir);
  ck_assert_int_eq(tu_run(cmd, &syms), 0);
  int checked = 0;
  for (char *line = strtok(syms, "\n"); line; line = strtok(NULL, "\n")) {
    long long size;
    char type[16], ndx[16], name[64];
    if (sscanf(line, " %*u: %*x %lld %15s %*s %*s %15s %63s", &size, type, ndx, name) != 4) continue;
    if (strcmp(type, "FUNC") != 0 || strcmp(ndx, "UND") == 0) continue;
    const insp_kernel *k = must_find(&c, name);
    ck_assert_msg(k->size == size, "%s: %lld bytes, llvm-readelf says %lld", name, (long long)k->size, size);
    if (strncmp(name, "ds4k_", 5) == 0) checked++;
  }
  ck_assert_int_eq(checked, 3);
  ck_assert_ptr_null(insp_find_kernel(&c, "helper")); /* static: not in .dynsym */
  ck_assert_int_gt(must_find(&c, "ds4k_loop")->size, must_find(&c, "ds4k_small")->size);
  free(syms);
  insp_codeobj_free(&c);
}
END_TEST

/* ---- damaged code objects ---------------------------------------------- */

/* Reading bytes[0..len) either succeeds or fails with a message that names
 * the file; on failure nothing is left allocated. Returns whether it failed. */
static bool read_fails_cleanly(const char *name, const uint8_t *b, size_t len) {
  insp_codeobj c;
  rt_status st = insp_read_codeobj(name, b, len, &c);
  if (!st) {
    insp_codeobj_free(&c);
    return false;
  }
  const char *msg = rt_status_msg(st);
  ck_assert_msg(strncmp(msg, name, strlen(name)) == 0 && msg[strlen(name)] == ':', "message does not name the file: %s",
                msg);
  ck_assert_uint_eq(c.nkernels, 0);
  ck_assert_ptr_null(c.kernels);
  rt_status_free(st);
  return true;
}

static const char *const damaged_files[] = {"k.hsaco", "k.cubin", "h.so"};

/* Cut at every length: each one is an error (the program and section
 * header tables and the sections' data reach the file's end). */
START_TEST(every_truncation_is_an_error) {
  build_code_objects();
  for (int f = 0; f < 3; f++) {
    char path[128];
    snprintf(path, sizeof path, "%s/%s", tmpdir, damaged_files[f]);
    size_t len;
    uint8_t *b = (uint8_t *)tu_slurp(path, &len);
    for (size_t cut = 0; cut < len; cut++) {
      uint8_t *copy = malloc(cut ? cut : 1); /* exact size, so ASan sees any overread */
      memcpy(copy, b, cut);
      ck_assert_msg(read_fails_cleanly(damaged_files[f], copy, cut), "%s cut at %zu bytes reads as valid",
                    damaged_files[f], cut);
      free(copy);
    }
    free(b);
  }
  /* The metadata itself cut at every length, the note's descsz saying so:
   * each is an error of the msgpack reader, which must not read past it. */
  char path[128];
  snprintf(path, sizeof path, "%s/k.hsaco", tmpdir);
  size_t len;
  uint8_t *b = (uint8_t *)tu_slurp(path, &len);
  uint8_t *note = memmem(b, len, "AMDGPU\0\0", 8);
  ck_assert_ptr_nonnull(note);
  uint8_t *descsz = note - 8;
  uint32_t full = descsz[0] | descsz[1] << 8 | (uint32_t)descsz[2] << 16 | (uint32_t)descsz[3] << 24;
  ck_assert_uint_gt(full, 100);
  ck_assert_uint_lt(full, 65536); /* the cuts below rewrite the low two bytes */
  for (uint32_t cut = 0; cut < full; cut++) {
    descsz[0] = (uint8_t)cut;
    descsz[1] = (uint8_t)(cut >> 8);
    insp_codeobj c;
    rt_status st = insp_read_codeobj("k.hsaco", b, len, &c);
    ck_assert_msg(st != NULL, "metadata cut at %u bytes reads as valid", cut);
    ck_assert_msg(strstr(rt_status_msg(st), "k.hsaco: AMDGPU metadata"), "cut at %u: %s", cut, rt_status_msg(st));
    rt_status_free(st);
  }
  free(b);
}
END_TEST

/* Every byte flipped in three ways: a clean error or a successful read,
 * never a crash (ASan builds check the reads); flips in the AMDGPU note
 * are mostly caught. */
START_TEST(every_flipped_byte_reads_cleanly) {
  build_code_objects();
  static const uint8_t masks[] = {0x01, 0x80, 0xff};
  for (int f = 0; f < 3; f++) {
    char path[128];
    snprintf(path, sizeof path, "%s/%s", tmpdir, damaged_files[f]);
    size_t len;
    uint8_t *b = (uint8_t *)tu_slurp(path, &len);
    uint8_t *copy = malloc(len);
    const uint8_t *note = memmem(b, len, "AMDGPU\0\0", 8);
    size_t note_at = note ? (size_t)(note - b) + 8 : len, note_errors = 0;
    for (size_t i = 0; i < len; i++) {
      for (size_t m = 0; m < sizeof masks; m++) {
        memcpy(copy, b, len);
        copy[i] ^= masks[m];
        bool failed = read_fails_cleanly(damaged_files[f], copy, len);
        if (failed && i >= note_at && i < note_at + 64) note_errors++;
      }
    }
    if (f == 0) ck_assert_uint_ge(note_errors, 32);
    free(copy);
    free(b);
  }
}
END_TEST

/* Damage at known places gives messages that say what is wrong. */
static void assert_read_error(const char *name, const uint8_t *b, size_t len, const char *want) {
  insp_codeobj c;
  rt_status st = insp_read_codeobj(name, b, len, &c);
  ck_assert_msg(st != NULL, "%s: damaged file reads as valid (wanted %s)", name, want);
  ck_assert_msg(strstr(rt_status_msg(st), want), "%s: wanted '%s' in: %s", name, want, rt_status_msg(st));
  rt_status_free(st);
}

START_TEST(damage_is_named) {
  build_code_objects();
  char path[128];
  size_t len;
  snprintf(path, sizeof path, "%s/k.hsaco", tmpdir);
  uint8_t *b = (uint8_t *)tu_slurp(path, &len);
  assert_read_error("k.hsaco", b, 10, "k.hsaco: not an ELF file: 10 bytes, an ELF64 header needs 64");
  uint8_t *meta = (uint8_t *)memmem(b, len, "AMDGPU\0\0", 8) + 8;
  uint8_t saved = meta[0];
  meta[0] = 0xc1; /* never used by msgpack */
  assert_read_error("k.hsaco", b, len, "AMDGPU metadata: byte 0: type 0xc1 is not msgpack");
  meta[0] = 0x90; /* an empty array where the top-level map belongs */
  assert_read_error("k.hsaco", b, len, "AMDGPU metadata: byte 0: the metadata is not a map");
  meta[0] = saved;
  uint8_t *kernels = memmem(b, len, "amdhsa.kernels", 14);
  ck_assert_ptr_nonnull(kernels);
  kernels[7] = 'K'; /* the key no longer matches */
  assert_read_error("k.hsaco", b, len, "AMDGPU metadata has no amdhsa.kernels");
  free(b);

  snprintf(path, sizeof path, "%s/k.cubin", tmpdir);
  b = (uint8_t *)tu_slurp(path, &len);
  b[18] = 0x3e; /* EM_X86_64: read as a host object, which a cubin is not */
  b[19] = 0;
  assert_read_error("k.cubin", b, len, "k.cubin: no dynamic symbol table (.dynsym)");
  b[18] = 190;
  /* the first EIATTR_REGCOUNT entry: {format 4, attribute 0x2f, size 8} */
  uint8_t *reg = memmem(b, len, "\x04\x2f\x08\x00", 4);
  ck_assert_ptr_nonnull(reg);
  reg[2] = 0xff;
  assert_read_error("k.cubin", b, len, "(attribute 0x2f) has 255 payload bytes");
  reg[2] = 0x04;
  assert_read_error("k.cubin", b, len, "(attribute 0x2f) has 4 payload bytes, expected 8");
  reg[2] = 0x08;
  reg[0] = 0x07;
  assert_read_error("k.cubin", b, len, "has unknown format 0x07");
  reg[0] = 0x04;
  reg[4] = reg[5] = 0xff;
  assert_read_error("k.cubin", b, len, "(attribute 0x2f) names symbol 65535");
  free(b);
}
END_TEST

/* ---- bundles ------------------------------------------------------------- */

static char bundle[128];

static void compile_bundle(const char *targets) {
  snprintf(bundle, sizeof bundle, "%s/tiny", tmpdir);
  ds4c_options o = {.model_path = "models/tiny-moe.yaml", .sched_path = "schedules/tiny-1dev.yaml",
                    .out_dir = bundle, .targets = targets};
  dsl_diag d = {0};
  ck_assert_msg(ds4c_compile(&o, &d) == 0, "%s", d.msg);
}

static void read_plan(plan *p) {
  char path[256];
  snprintf(path, sizeof path, "%s/plan.ds4p", bundle);
  rt_status st = plan_read(path, p);
  ck_assert_msg(st == NULL, "%s", rt_status_msg(st));
}

static void write_plan(const plan *p) {
  char path[256];
  snprintf(path, sizeof path, "%s/plan.ds4p", bundle);
  rt_status st = plan_write(p, path);
  ck_assert_msg(st == NULL, "%s", rt_status_msg(st));
}

/* Not inlined: GCC 12 at -O3 takes the returned buffer, which
 * open_memstream was given &text to fill, for a pointer into text itself
 * and warns of a dangling pointer wherever the caller reads it. */
static __attribute__((noinline)) char *report(insp_format format) {
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  rt_status st = insp_report(bundle, format, f);
  ck_assert_msg(st == NULL, "%s", rt_status_msg(st));
  fclose(f);
  return text;
}

/* The text report's section titled title (up to the blank line after it). */
static char *text_section(const char *text, const char *title) {
  char head[256];
  snprintf(head, sizeof head, "\n%s\n", title);
  const char *s = strstr(text, head);
  ck_assert_msg(s != NULL, "no section '%s' in:\n%s", title, text);
  s += 1;
  const char *e = strstr(s, "\n\n");
  return strndup(s, e ? (size_t)(e - s) : strlen(s));
}

/* Every code object's table, in text and JSON, lists every kernel of the
 * plan. */
static void assert_lists_every_kernel(void) {
  plan p;
  read_plan(&p);
  char *text = report(INSP_TEXT), *json = report(INSP_JSON);
  for (uint32_t i = 0; i < p.ncodeobjs; i++) {
    char title[256];
    snprintf(title, sizeof title, "kernels on %s (%s)", plan_str(&p, p.codeobjs[i].target),
             plan_str(&p, p.codeobjs[i].path));
    char *sec = text_section(text, title);
    for (uint32_t k = 0; k < p.nkernels; k++) {
      char row[128];
      snprintf(row, sizeof row, "\n  %s ", plan_str(&p, p.kernels[k].symbol));
      ck_assert_msg(strstr(sec, row), "%s does not list %s:\n%s", title, plan_str(&p, p.kernels[k].symbol), sec);
    }
    free(sec);
  }
  /* JSON: parsed by Python's json module, every code object lists the
   * plan's kernels in order */
  need_tool("python3");
  char path[256];
  snprintf(path, sizeof path, "%s/report.json", tmpdir);
  tu_write_text(path, json);
  char cmd[512], *out;
  snprintf(cmd, sizeof cmd,
           "python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); ks=[k[\"symbol\"] for k in d[\"kernels\"]]; "
           "print(len(d[\"codeobjs\"]), len(ks), "
           "all([k[\"symbol\"] for k in c[\"kernels\"]] == ks for c in d[\"codeobjs\"]))' %s",
           path);
  ck_assert_int_eq(tu_run(cmd, &out), 0);
  char want[64];
  snprintf(want, sizeof want, "%u %u True\n", p.ncodeobjs, p.nkernels);
  ck_assert_str_eq(out, want);
  free(out);
  /* Each op with a kernel under that kernel, once: its path on the line
   * after the kernel's or another of its ops' in "ops by kernel", and in
   * the kernel's "ops" in the JSON. */
  uint32_t launched = 0;
  for (uint32_t o = 0; o < p.nops; o++) {
    if (p.ops[o].kernel == PLAN_NONE) continue;
    launched++;
    char line[512];
    snprintf(line, sizeof line, "\n    %s\n", plan_str(&p, p.ops[o].path));
    const char *at = strstr(text, line);
    ck_assert_msg(at, "ops by kernel lacks %s", plan_str(&p, p.ops[o].path));
    while (at > text && !(at[-1] == '\n' && at[0] == ' ' && at[1] == ' ' && at[2] != ' ')) at--;
    char head[256];
    snprintf(head, sizeof head, "  %s\n", plan_str(&p, p.kernels[p.ops[o].kernel].symbol));
    ck_assert_msg(strncmp(at, head, strlen(head)) == 0, "%s is not under %s", plan_str(&p, p.ops[o].path), head);
  }
  snprintf(cmd, sizeof cmd,
           "python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); o=[x for k in d[\"kernels\"] for x in k[\"ops\"]]; "
           "print(len(o), len(set(o)))' %s",
           path);
  ck_assert_int_eq(tu_run(cmd, &out), 0);
  snprintf(want, sizeof want, "%u %u\n", launched, launched);
  ck_assert_str_eq(out, want);
  free(out);
  free(text);
  free(json);
  plan_free(&p);
}

START_TEST(host_bundle_report) {
  need_tool("llvm-readelf-19");
  compile_bundle(NULL);
  plan p;
  read_plan(&p);
  char *text = report(INSP_TEXT);
  char head[256];
  snprintf(head, sizeof head, "bundle %s: model tiny-moe, schedule tiny-1dev\n", bundle);
  ck_assert_msg(strncmp(text, head, strlen(head)) == 0, "%s", text);
  /* code objects: the short sha256 of the file */
  char hex[65], row[256];
  rt_hex(p.codeobjs[0].sha256, 32, hex);
  char *sec = text_section(text, "code objects");
  snprintf(row, sizeof row, "  %.12s", hex);
  ck_assert_msg(strstr(sec, "  host    kernels/host.so  ") && strstr(sec, row), "%s", sec);
  free(sec);
  /* each kernel's code bytes are its st_size as llvm-readelf prints it */
  char cmd[512], *syms;
  snprintf(cmd, sizeof cmd, "llvm-readelf-19 --dyn-syms %s/kernels/host.so", bundle);
  ck_assert_int_eq(tu_run(cmd, &syms), 0);
  sec = text_section(text, "kernels on host (kernels/host.so)");
  for (uint32_t k = 0; k < p.nkernels; k++) {
    const char *sym = plan_str(&p, p.kernels[k].symbol);
    const char *at = strstr(syms, sym);
    ck_assert_ptr_nonnull(at);
    while (at > syms && at[-1] != '\n') at--;
    long long size;
    ck_assert_int_eq(sscanf(at, " %*u: %*x %lld", &size), 1);
    snprintf(row, sizeof row, "\n  %s ", sym);
    const char *line = strstr(sec, row);
    ck_assert_ptr_nonnull(line);
    line += strlen(row);
    ck_assert_msg(strtoll(line, NULL, 10) == size, "%s: report says %s, llvm-readelf %lld", sym, line, size);
  }
  free(sec);
  free(syms);
  /* devices and the plan's counts */
  sec = text_section(text, "devices");
  const char *dev = strstr(sec, "\n  cpu0 ");
  char backend[16], arch[16];
  unsigned long long arena;
  ck_assert_msg(dev && sscanf(dev, " cpu0 %15s %15s %llu", backend, arch, &arena) == 3, "%s", sec);
  ck_assert_str_eq(backend, "cpu");
  ck_assert_str_eq(arch, "host");
  ck_assert_uint_eq(arena, p.devices[0].arena_bytes);
  free(sec);
  uint32_t n[4] = {0};
  for (uint32_t i = 0; i < p.ncommands; i++) n[p.commands[i].kind]++;
  char *json = report(INSP_JSON);
  snprintf(row, sizeof row,
           "\"plan\": {\"launches\": %u, \"copies\": %u, \"records\": %u, \"waits\": %u, \"ops\": %u, \"edges\": %u, "
           "\"kernels\": %u, \"streams\": %u}",
           n[0], n[1], n[2], n[3], p.nops, p.nedges, p.nkernels, p.nstreams);
  ck_assert_msg(strstr(json, row), "%s", json);
  ck_assert_uint_gt(n[0], 0);
  ck_assert_uint_gt(p.nedges, 0);
  free(json);
  free(text);
  plan_free(&p);
  assert_lists_every_kernel();
}
END_TEST

/* tiny-moe compiled for host, gfx1201 and sm_90: the report lists every
 * kernel of the plan on every target, and the gfx1201 numbers are the ones
 * llvm-readelf prints for the bundle's code object. */
START_TEST(gpu_bundle_lists_every_kernel) {
  need_tool("clang-19");
  need_tool("llvm-readelf-19");
  need_tool(PTXAS);
  compile_bundle("host,gfx1201,sm_90");
  plan p;
  read_plan(&p);
  ck_assert_uint_eq(p.ncodeobjs, 3);
  assert_lists_every_kernel();
  char *text = report(INSP_TEXT);
  char *sec = text_section(text, "kernels on gfx1201 (kernels/gfx1201.hsaco)");
  ck_assert_msg(strstr(sec, "  sgpr  vgpr  agpr  "), "%s", sec);
  free(sec);
  sec = text_section(text, "kernels on sm_90 (kernels/sm_90.cubin)");
  ck_assert_msg(strstr(sec, "  regs  shared  local  stack  warps/SM  limit\n"), "%s", sec);
  free(sec);
  free(text);

  char path[256], cmd[512], *notes;
  snprintf(path, sizeof path, "%s/kernels/gfx1201.hsaco", bundle);
  size_t len;
  uint8_t *b = (uint8_t *)tu_slurp(path, &len);
  insp_codeobj c;
  rt_status st = insp_read_codeobj(path, b, len, &c);
  ck_assert_msg(st == NULL, "%s", rt_status_msg(st));
  snprintf(cmd, sizeof cmd, "llvm-readelf-19 --notes %s", path);
  ck_assert_int_eq(tu_run(cmd, &notes), 0);
  readelf_kernel *ref = calloc(p.nkernels + 1, sizeof *ref);
  ck_assert_int_eq(parse_readelf_notes(notes, ref, (int)p.nkernels + 1), (int)p.nkernels);
  for (uint32_t i = 0; i < p.nkernels; i++) {
    const insp_kernel *k = must_find(&c, ref[i].name);
    int64_t got[NFIELDS] = {k->sgpr, k->vgpr, k->agpr, k->lds, k->scratch, k->kernarg};
    ck_assert_msg(memcmp(got, ref[i].v, sizeof got) == 0, "%s differs from llvm-readelf", ref[i].name);
  }
  free(ref);
  free(notes);
  free(b);
  insp_codeobj_free(&c);
  plan_free(&p);
}
END_TEST

/* Occupancy on AMDGPU is LLVM's: for every kernel of ds4-flash-mini (VGPR,
 * LDS and workgroup limits all met among them) on the four AMD archs,
 * the "; Occupancy:" line clang -S writes for the bundle's own source. */
START_TEST(amd_occupancy_matches_clang) {
  need_tool("clang-19");
  need_tool(PTXAS); /* the schedule's own device is an sm_90 */
  snprintf(bundle, sizeof bundle, "%s/mini", tmpdir);
  ds4c_options o = {.model_path = "models/ds4-flash-mini.yaml", .sched_path = "schedules/ds4-flash-h200.yaml",
                    .out_dir = bundle, .targets = "sm_90,gfx942,gfx1100,gfx1151,gfx1201"};
  dsl_diag d = {0};
  ck_assert_msg(ds4c_compile(&o, &d) == 0, "%s", d.msg);
  plan p;
  read_plan(&p);
  int below_max = 0;
  for (uint32_t i = 0; i < p.ncodeobjs; i++) {
    const char *arch = plan_str(&p, p.codeobjs[i].target);
    if (strncmp(arch, "gfx", 3) != 0) continue;
    char path[512], cmd[1024], *asm_text;
    snprintf(cmd, sizeof cmd,
             "clang-19 -x hip --cuda-device-only --offload-arch=%s -nogpulib -nogpuinc -fuse-cuid=none -O3 "
             "-ffp-contract=off -fno-gpu-flush-denormals-to-zero -S -o - %s/kernels/%s.hip",
             arch, bundle, arch);
    ck_assert_int_eq(tu_run(cmd, &asm_text), 0);
    snprintf(path, sizeof path, "%s/%s", bundle, plan_str(&p, p.codeobjs[i].path));
    size_t len;
    uint8_t *b = (uint8_t *)tu_slurp(path, &len);
    insp_codeobj c;
    rt_status st = insp_read_codeobj(path, b, len, &c);
    ck_assert_msg(st == NULL, "%s", rt_status_msg(st));
    for (uint32_t k = 0; k < p.nkernels; k++) {
      const char *sym = plan_str(&p, p.kernels[k].symbol);
      char label[128];
      snprintf(label, sizeof label, "\n%s:", sym); /* the function's label, a comment after it */
      const char *at = strstr(asm_text, label), *occ = at ? strstr(at, "; Occupancy: ") : NULL;
      ck_assert_msg(occ, "%s: clang -S gives no occupancy for %s", arch, sym);
      occ_result r;
      ck_assert_int_eq(occ_compute(arch, must_find(&c, sym), p.kernels[k].block, &r), 0);
      ck_assert_msg(r.value == strtol(occ + 13, NULL, 10), "%s %s: %lld waves/SIMD, clang says %ld", arch, sym,
                    (long long)r.value, strtol(occ + 13, NULL, 10));
      below_max += r.value < r.max;
    }
    insp_codeobj_free(&c);
    free(b);
    free(asm_text);
  }
  ck_assert_int_gt(below_max, 0); /* some kernel is limited by something */
  plan_free(&p);
}
END_TEST

/* ds4c inspect BUNDLE: its exit status and output. */
static int ds4c_inspect(const char *args, char **out) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "%s/ds4c inspect %s", tu_build_dir(), args);
  return tu_run(cmd, out);
}

static void assert_inspect_fails(const char *want) {
  char *out;
  int rc = ds4c_inspect(bundle, &out);
  ck_assert_msg(rc == 1, "exit %d:\n%s", rc, out);
  ck_assert_msg(strncmp(out, "ds4c: error: ", 13) == 0 && strstr(out, want), "wanted '%s' in:\n%s", want, out);
  ck_assert_msg(!strstr(out, "code objects"), "a failed inspect printed a report:\n%s", out);
  free(out);
}

/* Points *field at a new string of the plan: strings may be shared by
 * several fields, which must keep theirs. */
static void set_str(plan *p, uint32_t *field, const char *value) {
  size_t n = strlen(value) + 1;
  p->strings = realloc(p->strings, p->strings_len + n);
  memcpy(p->strings + p->strings_len, value, n);
  *field = p->strings_len;
  p->strings_len += (uint32_t)n;
}

/* The code object as the plan names it: path and its sha256 re-recorded, so
 * that the damage is found by reading it, not by the hash. */
static void replace_host_so(const uint8_t *bytes, size_t len) {
  char path[256];
  snprintf(path, sizeof path, "%s/kernels/host.so", bundle);
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  ck_assert_uint_eq(fwrite(bytes, 1, len, f), len);
  ck_assert_int_eq(fclose(f), 0);
  plan p;
  read_plan(&p);
  rt_sha256(bytes, len, p.codeobjs[0].sha256);
  write_plan(&p);
  plan_free(&p);
}

START_TEST(command_line) {
  ck_assert_msg(getenv("DS4_BUILD_DIR"), "DS4_BUILD_DIR must name the build directory");
  compile_bundle(NULL);
  char *out, args[256];
  ck_assert_int_eq(ds4c_inspect(bundle, &out), 0);
  ck_assert_ptr_nonnull(strstr(out, "kernels on host (kernels/host.so)"));
  free(out);
  snprintf(args, sizeof args, "%s --json", bundle);
  ck_assert_int_eq(ds4c_inspect(args, &out), 0);
  ck_assert_msg(out[0] == '{' && strstr(out, "\"codeobjs\": ["), "%s", out);
  free(out);
  ck_assert_int_eq(ds4c_inspect("", &out), 64);
  ck_assert_ptr_nonnull(strstr(out, "ds4c: error: inspect needs BUNDLE"));
  free(out);
  snprintf(args, sizeof args, "%s --yaml", bundle);
  ck_assert_int_eq(ds4c_inspect(args, &out), 64);
  ck_assert_ptr_nonnull(strstr(out, "unknown option '--yaml'"));
  free(out);
  snprintf(args, sizeof args, "%s/none", tmpdir);
  ck_assert_int_eq(ds4c_inspect(args, &out), 1);
  ck_assert_msg(strstr(out, "ds4c: error: ") && strstr(out, "/none/plan.ds4p: "), "%s", out);
  free(out);

  char so[256];
  snprintf(so, sizeof so, "%s/kernels/host.so", bundle);
  size_t len;
  uint8_t *orig = (uint8_t *)tu_slurp(so, &len);
  /* a code object that differs from the plan's sha256 */
  FILE *f = fopen(so, "ab");
  fputc(0, f);
  fclose(f);
  char want[512];
  snprintf(want, sizeof want, "%s: sha256 mismatch (plan expects ", so);
  assert_inspect_fails(want);
  /* a missing one */
  ck_assert_int_eq(unlink(so), 0);
  snprintf(want, sizeof want, "%s: cannot open: No such file or directory", so);
  assert_inspect_fails(want);
  /* a damaged one, whose hash the plan records */
  replace_host_so(orig, len - 1);
  snprintf(want, sizeof want, "%s: section header table", so);
  assert_inspect_fails(want);
  /* one of the wrong kind for its target */
  replace_host_so(orig, len);
  plan p;
  read_plan(&p);
  uint32_t host = p.codeobjs[0].target;
  set_str(&p, &p.codeobjs[0].target, "sm_90");
  write_plan(&p);
  snprintf(want, sizeof want, "%s: target sm_90 needs an NVIDIA cubin, the file is a host shared object", so);
  assert_inspect_fails(want);
  /* one that lacks a kernel of the plan */
  p.codeobjs[0].target = host;
  set_str(&p, &p.kernels[0].symbol, "ds4k_not_there");
  write_plan(&p);
  snprintf(want, sizeof want, "%s: no kernel ds4k_not_there (the plan's kernel 0)", so);
  assert_inspect_fails(want);
  /* one outside the bundle */
  set_str(&p, &p.codeobjs[0].path, "../x.so");
  write_plan(&p);
  assert_inspect_fails("code object path '../x.so' leaves the bundle");
  plan_free(&p);
  free(orig);
}
END_TEST

/* sm_90's occupancy, warps a multiprocessor holds, with what limits it.
 * The first two are index_scores and hc_pre_sums of ds4-flash-slice,
 * whose theoretical occupancy ncu reported on the H200 as 25 % and 75 %. */
START_TEST(sm90_occupancy) {
  static const struct {
    int64_t regs, shared;
    uint32_t block;
    int64_t warps;
    const char *limit;
  } cases[] = {
      {108, 2048, 256, 16, "regs"},   {33, 1168, 256, 48, "regs"},      {18, 0, 256, 64, "none"},
      {32, 100000, 256, 16, "shared"}, {16, 0, 96, 63, "threads"},      {16, 0, 32, 32, "blocks"},
      {52, 9216, 1024, 32, "regs"},   {255, 0, 1024, 0, "regs"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    insp_kernel k = {.regs = cases[i].regs, .shared = cases[i].shared};
    occ_result r;
    ck_assert_int_eq(occ_compute("sm_90", &k, cases[i].block, &r), 0);
    ck_assert_msg(r.value == cases[i].warps && strcmp(r.limit, cases[i].limit) == 0 && r.max == 64,
                  "case %zu: %lld warps (%s)", i, (long long)r.value, r.limit);
    ck_assert_str_eq(r.unit, "warps/SM");
  }
  /* No rule: an arch it does not know, an AMD kernel without its wave size. */
  insp_kernel k = {.regs = 32, .shared = 0, .sgpr = 20, .vgpr = 20, .lds = 0, .wave = INSP_UNKNOWN};
  occ_result r;
  ck_assert_int_eq(occ_compute("gfx90a", &k, 256, &r), -1);
  ck_assert_int_eq(occ_compute("gfx942", &k, 256, &r), -1);
  k.wave = 64;
  ck_assert_int_eq(occ_compute("gfx942", &k, 256, &r), 0);
  ck_assert_int_eq(r.value, 8);
  ck_assert_str_eq(r.limit, "none");
}
END_TEST

int main(void) {
  Suite *s = suite_create("inspect");
  TCase *tc = tcase_create("code objects");
  tcase_set_timeout(tc, 600);
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, amdgpu_matches_llvm_readelf);
  tcase_add_test(tc, cuda_matches_ptxas);
  tcase_add_test(tc, host_matches_llvm_readelf);
  tcase_add_test(tc, every_truncation_is_an_error);
  tcase_add_test(tc, every_flipped_byte_reads_cleanly);
  tcase_add_test(tc, damage_is_named);
  tcase_add_test(tc, sm90_occupancy);
  suite_add_tcase(s, tc);
  TCase *tb = tcase_create("bundles");
  tcase_set_timeout(tb, 600);
  tcase_add_checked_fixture(tb, setup, teardown);
  tcase_add_test(tb, host_bundle_report);
  tcase_add_test(tb, gpu_bundle_lists_every_kernel);
  tcase_add_test(tb, amd_occupancy_matches_clang);
  tcase_add_test(tb, command_line);
  suite_add_tcase(s, tb);
  return tu_run_suite(s);
}
