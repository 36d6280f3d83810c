/* toolchain.c - drives the external compilers. Flags are pinned so that
 * the same sources give the same code object bytes; each tool runs in the
 * bundle's staging folder with relative paths so no absolute path reaches
 * the output. toolchain_identity describes the tools and their command
 * lines for the kernel cache's key. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "emit.h"

/* The exit status a child reports when the tool cannot be started. */
#define TOOL_NOT_FOUND 127

/* The first bytes of a tool's output, for error messages. */
typedef struct tool_log {
  char text[1024];
} tool_log;

/* Runs argv in dir with stdout and stderr captured into log. Returns the
 * tool's exit status (128 + the signal that killed it, as shells say),
 * TOOL_NOT_FOUND when it could not be started, or -1 when it could not be
 * run at all (errno says why). */
static int tool_run(const char *dir, char *const *argv, tool_log *log) {
  log->text[0] = 0;
  int pipefd[2];
  if (pipe(pipefd)) return -1;
  pid_t pid = fork();
  if (pid < 0) {
    close(pipefd[0]);
    close(pipefd[1]);
    return -1;
  }
  if (pid == 0) {
    dup2(pipefd[1], 2);
    dup2(pipefd[1], 1);
    close(pipefd[0]);
    if (chdir(dir) == 0) execvp(argv[0], argv);
    dprintf(2, "%s: %s", argv[0], strerror(errno));
    _exit(TOOL_NOT_FOUND);
  }
  close(pipefd[1]);
  size_t len = 0;
  ssize_t r;
  char sink[256];
  /* Keep the start of the output, drain the rest so the tool never
   * blocks on a full pipe. */
  while ((r = read(pipefd[0], len < sizeof log->text - 1 ? log->text + len : sink,
                   len < sizeof log->text - 1 ? sizeof log->text - 1 - len : sizeof sink)) > 0)
    if (len < sizeof log->text - 1) len += (size_t)r;
  log->text[len] = 0;
  close(pipefd[0]);
  int status = 0;
  if (waitpid(pid, &status, 0) < 0) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static const char *tool_from_env(const char *var, const char *fallback) {
  const char *v = getenv(var);
  return v && *v ? v : fallback;
}

/* Where a tool runs from: its name when that holds a slash, else the first
 * executable of that name on PATH. */
static int find_on_path(const char *name, char *out, size_t n) {
  if (strchr(name, '/')) {
    snprintf(out, n, "%s", name);
    return access(out, X_OK);
  }
  const char *path = getenv("PATH");
  for (const char *p = path; p && *p;) {
    const char *end = strchr(p, ':');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    snprintf(out, n, "%.*s/%s", (int)len, p, name);
    if (len && access(out, X_OK) == 0) return 0;
    p = end ? end + 1 : p + len;
  }
  return -1;
}

/* ---- the command lines: each is written once, for the build and for
 * toolchain_identity ---- */

/* Host code objects are built a kernel at a time (cc -c), so the kernel
 * cache can keep each kernel's object, then linked into one library. */
#define HOST_COMPILE_ARGV(cc, source, object)                                                                \
  {(cc), "-std=c11", "-O2", "-fPIC", "-ffp-contract=off", "-fno-fast-math", "-fno-ident", "-Wall", "-Werror", \
   "-c", "-o", (object), (source), NULL}

/* cc -shared ... OUT OBJECTS -lm, into argv[HOST_LINK_NFLAGS + nobjects + 4]. */
static const char *const host_link_flags[] = {"-shared", "-Wl,--build-id=sha1", "-o"};
#define HOST_LINK_NFLAGS ((int)(sizeof host_link_flags / sizeof *host_link_flags))

static void host_link_argv(const char *cc, char *const *objects, int nobjects, const char *out, const char **argv) {
  int n = 0;
  argv[n++] = cc;
  for (int i = 0; i < HOST_LINK_NFLAGS; i++) argv[n++] = host_link_flags[i];
  argv[n++] = out;
  for (int i = 0; i < nobjects; i++) argv[n++] = objects[i];
  argv[n++] = "-lm";
  argv[n] = NULL;
}

/* Flags both GPU compiles pin: IEEE f32 everywhere (no contraction into
 * FMA, denormals kept), so every target computes the same bits. */
#define GPU_COMMON_FLAGS \
  "-O3", "-ffp-contract=off", "-fno-gpu-flush-denormals-to-zero", "-fno-ident", "-Wall", "-Werror"

/* offload: --offload-arch=ARCH. -fuse-cuid=none: clang would otherwise
 * name a symbol after a hash of the source's absolute path. */
#define AMDGPU_ARGV(clang, offload, source, out)                                                             \
  {(clang), "-x", "hip", "--cuda-device-only", (offload), "-nogpulib", "-nogpuinc", "--no-gpu-bundle-output", \
   "-fuse-cuid=none", GPU_COMMON_FLAGS, "-o", (out), (source), NULL}

/* gpu_arch: --cuda-gpu-arch=ARCH. */
#define NVPTX_ARGV(clang, gpu_arch, source, ptx)                                                        \
  {(clang), "-x", "cuda", "--cuda-device-only", (gpu_arch), "-nocudalib", "-nocudainc",                 \
   "-Wno-unknown-cuda-version", GPU_COMMON_FLAGS, "-S", "-o", (ptx), (source), NULL}

/* ptx_arch: -arch=ARCH. */
#define PTXAS_ARGV(ptxas, ptx_arch, ptx, cubin) {(ptxas), (ptx_arch), "-O3", "-o", (cubin), (ptx), NULL}

/* The host C compiler's failures, worded once for both steps. */
static int host_tool_error(int rc, const char *cc, const char *dir, const char *out, const tool_log *log,
                           dsl_diag *d) {
  if (rc < 0) return dsl_error(d, (dsl_pos){0}, "cannot run the host C compiler '%s': %s", cc, strerror(errno));
  if (rc == TOOL_NOT_FOUND)
    return dsl_error(d, (dsl_pos){0},
                     "host kernels need a C compiler: '%s' not found (apt-get install gcc, or set DS4_CC)", cc);
  if (rc)
    return dsl_error(d, (dsl_pos){0}, "the host C compiler '%s' failed building %s/%s:\n%s", cc, dir, out, log->text);
  return 0;
}

/* Host code objects: DS4_CC overrides the compiler (default: cc). */
int toolchain_compile_host(const char *dir, const char *source, const char *object, dsl_diag *d) {
  const char *cc = tool_from_env("DS4_CC", "cc");
  const char *argv[] = HOST_COMPILE_ARGV(cc, source, object);
  tool_log log;
  int rc = tool_run(dir, (char *const *)argv, &log);
  return host_tool_error(rc, cc, dir, object, &log, d);
}

int toolchain_link_host(const char *dir, char *const *objects, int nobjects, const char *out, dsl_diag *d) {
  const char *cc = tool_from_env("DS4_CC", "cc");
  const char **argv = calloc((size_t)(HOST_LINK_NFLAGS + nobjects + 4), sizeof *argv);
  if (!argv) return dsl_error(d, (dsl_pos){0}, "out of memory");
  host_link_argv(cc, objects, nobjects, out, argv);
  tool_log log;
  int rc = tool_run(dir, (char *const *)argv, &log);
  free(argv);
  return host_tool_error(rc, cc, dir, out, &log, d);
}

/* SOURCE's object: its name with .o for .c (or .o added). */
static char *object_name(const char *source) {
  size_t n = strlen(source);
  if (n > 2 && strcmp(source + n - 2, ".c") == 0) n -= 2;
  char *o = malloc(n + 3);
  if (o) snprintf(o, n + 3, "%.*s.o", (int)n, source);
  return o;
}

int toolchain_build_host(const char *dir, char *const *sources, int nsources, const char *out, dsl_diag *d) {
  char **objects = calloc((size_t)(nsources ? nsources : 1), sizeof *objects);
  int rc = objects ? 0 : dsl_error(d, (dsl_pos){0}, "out of memory");
  for (int i = 0; i < nsources && !rc; i++) {
    objects[i] = object_name(sources[i]);
    rc = objects[i] ? toolchain_compile_host(dir, sources[i], objects[i], d)
                    : dsl_error(d, (dsl_pos){0}, "out of memory");
  }
  if (!rc) rc = toolchain_link_host(dir, objects, nsources, out, d);
  for (int i = 0; objects && i < nsources; i++) {
    if (objects[i]) {
      char path[PATH_MAX];
      snprintf(path, sizeof path, "%s/%s", dir, objects[i]);
      unlink(path);
    }
    free(objects[i]);
  }
  free(objects);
  return rc;
}

/* ---- GPU code objects: clang-19 without ROCm or CUDA headers and
 * libraries (the kernels need none: see compiler/kernels/gpu/prelude.h),
 * then, for NVIDIA, ptxas. DS4_CLANG and DS4_PTXAS override the tools. */

#define AMD_TOOLS "clang-19 and ld.lld (Debian: apt-get install clang-19 lld-19 llvm-19)"
#define NV_CLANG "clang-19 (Debian: apt-get install clang-19 llvm-19)"

static int gpu_clang_failed(const char *target, const char *clang, const char *needs, int rc, const char *dir,
                            const char *out, const tool_log *log, dsl_diag *d) {
  if (rc < 0) return dsl_error(d, (dsl_pos){0}, "target %s: cannot run '%s': %s", target, clang, strerror(errno));
  if (rc == TOOL_NOT_FOUND)
    return dsl_error(d, (dsl_pos){0}, "target %s needs %s; '%s' not found (or set DS4_CLANG)", target, needs, clang);
  if (strstr(log->text, "ld.lld"))
    return dsl_error(d, (dsl_pos){0}, "target %s needs %s; '%s' could not link %s/%s:\n%s", target, needs, clang, dir,
                     out, log->text);
  return dsl_error(d, (dsl_pos){0}, "target %s: '%s' failed building %s/%s:\n%s", target, clang, dir, out, log->text);
}

int toolchain_build_amdgpu(const char *dir, const char *arch, const char *source, const char *out, dsl_diag *d) {
  const char *clang = tool_from_env("DS4_CLANG", "clang-19");
  char offload[64];
  snprintf(offload, sizeof offload, "--offload-arch=%s", arch);
  const char *argv[] = AMDGPU_ARGV(clang, offload, source, out);
  tool_log log;
  int rc = tool_run(dir, (char *const *)argv, &log);
  return rc ? gpu_clang_failed(arch, clang, AMD_TOOLS, rc, dir, out, &log, d) : 0;
}

/* ptxas: DS4_PTXAS, else ptxas on PATH, else the CUDA toolkit's. */
static int find_ptxas(char *out, size_t n) {
  const char *env = getenv("DS4_PTXAS");
  if (env && *env) {
    snprintf(out, n, "%s", env);
    return 0;
  }
  if (find_on_path("ptxas", out, n) == 0) return 0;
  snprintf(out, n, "/usr/local/cuda/bin/ptxas");
  return access(out, X_OK);
}

int toolchain_build_nvptx(const char *dir, const char *arch, const char *source, const char *ptx, const char *cubin,
                          dsl_diag *d) {
  const char *clang = tool_from_env("DS4_CLANG", "clang-19");
  char gpu_arch[64];
  snprintf(gpu_arch, sizeof gpu_arch, "--cuda-gpu-arch=%s", arch);
  const char *cc_argv[] = NVPTX_ARGV(clang, gpu_arch, source, ptx);
  tool_log log;
  int rc = tool_run(dir, (char *const *)cc_argv, &log);
  if (rc) return gpu_clang_failed(arch, clang, NV_CLANG, rc, dir, ptx, &log, d);
  char ptxas[4096];
  if (find_ptxas(ptxas, sizeof ptxas))
    return dsl_error(d, (dsl_pos){0},
                     "target %s needs ptxas from the CUDA toolkit (/usr/local/cuda/bin/ptxas); not found on "
                     "PATH nor there (or set DS4_PTXAS)",
                     arch);
  char ptx_arch[64];
  snprintf(ptx_arch, sizeof ptx_arch, "-arch=%s", arch);
  const char *as_argv[] = PTXAS_ARGV(ptxas, ptx_arch, ptx, cubin);
  rc = tool_run(dir, (char *const *)as_argv, &log);
  if (rc < 0) return dsl_error(d, (dsl_pos){0}, "target %s: cannot run '%s': %s", arch, ptxas, strerror(errno));
  if (rc == TOOL_NOT_FOUND)
    return dsl_error(d, (dsl_pos){0},
                     "target %s needs ptxas from the CUDA toolkit (/usr/local/cuda/bin/ptxas); '%s' not found", arch,
                     ptxas);
  if (rc)
    return dsl_error(d, (dsl_pos){0}, "target %s: '%s' failed building %s/%s:\n%s", arch, ptxas, dir, cubin, log.text);
  return 0;
}

/* ---- the toolchain's identity, which the kernel cache keys on ---- */

/* A line naming the file that a tool or linker name resolves to, with its
 * size and modification time: a tool reinstalled or rebuilt in place is
 * another tool. */
static int describe_file(FILE *f, const char *role, const char *name) {
  char found[PATH_MAX], real[PATH_MAX];
  struct stat st;
  if (find_on_path(name, found, sizeof found) || !realpath(found, real) || stat(real, &st)) return -1;
  fprintf(f, "%s %s: %s, %lld bytes, modified %lld.%09ld\n", role, name, real, (long long)st.st_size,
          (long long)st.st_mtim.tv_sec, (long)st.st_mtim.tv_nsec);
  return 0;
}

/* The tool's file, then what `TOOL --version` prints (kept in version). */
static int describe_tool(FILE *f, const char *tool, tool_log *version) {
  char *argv[] = {(char *)tool, "--version", NULL};
  if (describe_file(f, "tool", tool) || tool_run(".", argv, version) != 0) return -1;
  fputs(version->text, f);
  return 0;
}

static void describe_argv(FILE *f, const char *const *argv) {
  fputs("run", f);
  for (int i = 0; argv[i]; i++) fprintf(f, " %s", argv[i]);
  fputc('\n', f);
}

/* clang links an AMD code object with the ld.lld of its own folder (the
 * InstalledDir its --version prints), else with the one on PATH. */
static int describe_lld(FILE *f, const tool_log *clang_version) {
  const char *dir = strstr(clang_version->text, "InstalledDir: ");
  if (dir) {
    dir += strlen("InstalledDir: ");
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%.*s/ld.lld", (int)strcspn(dir, "\r\n"), dir);
    if (access(path, X_OK) == 0) return describe_file(f, "linker", path);
  }
  return describe_file(f, "linker", "ld.lld");
}

int toolchain_identity(const char *target, char **out_text) {
  *out_text = NULL;
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  if (!f) {
    if (errno == ENOMEM) ir_out_of_memory();
    return -1;
  }
  tool_log version;
  int rc;
  if (strncmp(target, "gfx", 3) == 0) {
    const char *clang = tool_from_env("DS4_CLANG", "clang-19");
    const char *argv[] = AMDGPU_ARGV(clang, "--offload-arch=ARCH", "SOURCE", "OUT");
    rc = describe_tool(f, clang, &version) || describe_lld(f, &version);
    describe_argv(f, argv);
  } else if (strncmp(target, "sm_", 3) == 0) {
    const char *clang = tool_from_env("DS4_CLANG", "clang-19");
    char ptxas[PATH_MAX];
    const char *cc_argv[] = NVPTX_ARGV(clang, "--cuda-gpu-arch=ARCH", "SOURCE", "PTX");
    const char *as_argv[] = PTXAS_ARGV(ptxas, "-arch=ARCH", "PTX", "CUBIN");
    rc = describe_tool(f, clang, &version) || find_ptxas(ptxas, sizeof ptxas) || describe_tool(f, ptxas, &version);
    describe_argv(f, cc_argv);
    if (!rc) describe_argv(f, as_argv);
  } else {
    const char *cc = tool_from_env("DS4_CC", "cc");
    const char *cc_argv[] = HOST_COMPILE_ARGV(cc, "SOURCE", "OBJECT");
    const char *link_argv[HOST_LINK_NFLAGS + 5];
    char *objects[] = {"OBJECTS"};
    host_link_argv(cc, objects, 1, "OUT", link_argv);
    rc = describe_tool(f, cc, &version) || describe_file(f, "linker", "ld");
    describe_argv(f, cc_argv);
    describe_argv(f, link_argv);
  }
  /* A memory stream fails only when its buffer cannot grow; the text is
   * then short, or NULL after fclose. */
  int bad = ferror(f);
  if (fclose(f)) bad = 1;
  char *copy = !rc && !bad && text ? ir_try_realloc(NULL, len + 1) : NULL;
  if (copy) memcpy(copy, text, len + 1);
  free(text);
  if (rc) return -1;
  if (!copy) ir_out_of_memory();
  *out_text = copy;
  return 0;
}
