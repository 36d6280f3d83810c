/* toolchain.c - drives the external compilers. Flags are pinned so that
 * the same sources give the same code object bytes; the compiler runs in
 * the bundle's staging folder with relative paths so no absolute path
 * reaches the output. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "emit.h"

/* Host code objects: DS4_CC overrides the compiler (default: cc). */
int toolchain_build_host(const char *dir, char *const *sources, int nsources, const char *out, dsl_diag *d) {
  const char *cc = getenv("DS4_CC");
  if (!cc || !*cc) cc = "cc";
  static const char *const flags[] = {"-std=c11", "-O2", "-fPIC", "-shared", "-ffp-contract=off",
                                      "-fno-fast-math", "-fno-ident", "-Wall", "-Werror", "-Wl,--build-id=sha1",
                                      "-o"};
  int nflags = (int)(sizeof flags / sizeof *flags);
  char **argv = calloc((size_t)(nflags + nsources + 4), sizeof *argv);
  if (!argv) return dsl_error(d, (dsl_pos){0}, "out of memory");
  int n = 0;
  argv[n++] = (char *)cc;
  for (int i = 0; i < nflags; i++) argv[n++] = (char *)flags[i];
  argv[n++] = (char *)out;
  for (int i = 0; i < nsources; i++) argv[n++] = sources[i];
  argv[n++] = "-lm";
  argv[n] = NULL;
  int pipefd[2];
  if (pipe(pipefd)) {
    free(argv);
    return dsl_error(d, (dsl_pos){0}, "pipe: %s", strerror(errno));
  }
  pid_t pid = fork();
  if (pid == 0) {
    dup2(pipefd[1], 2);
    dup2(pipefd[1], 1);
    close(pipefd[0]);
    if (chdir(dir) == 0) execvp(cc, argv);
    dprintf(2, "%s: %s", cc, strerror(errno));
    _exit(127);
  }
  close(pipefd[1]);
  free(argv);
  char log[1024];
  size_t len = 0;
  ssize_t r;
  char sink[256];
  while ((r = read(pipefd[0], len < sizeof log - 1 ? log + len : sink,
                   len < sizeof log - 1 ? sizeof log - 1 - len : sizeof sink)) > 0)
    if (len < sizeof log - 1) len += (size_t)r;
  log[len] = 0;
  close(pipefd[0]);
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) < 0)
    return dsl_error(d, (dsl_pos){0}, "cannot run the host C compiler '%s': %s", cc, strerror(errno));
  if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
    return dsl_error(d, (dsl_pos){0}, "host kernels need a C compiler: '%s' not found (apt-get install gcc, or set DS4_CC)", cc);
  if (!WIFEXITED(status) || WEXITSTATUS(status))
    return dsl_error(d, (dsl_pos){0}, "the host C compiler '%s' failed building %s/%s:\n%s", cc, dir, out, log);
  return 0;
}
