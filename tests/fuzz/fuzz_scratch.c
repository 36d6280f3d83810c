/* fuzz_scratch.c - see fuzz_scratch.h. The folder's entries are listed as
 * they are made, so that the exit handler removes exactly those. */
#include "fuzz_scratch.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { MAX_ENTRIES = 64 };

static char dir[4096];
static char *entries[MAX_ENTRIES];
static int nentries;
static char path[8192];

static void fail(const char *what, const char *where) {
  fprintf(stderr, "fuzz harness: %s %s: %s\n", what, where, strerror(errno));
  abort();
}

static void remember(const char *name) {
  for (int i = 0; i < nentries; i++)
    if (strcmp(entries[i], name) == 0) return;
  if (nentries == MAX_ENTRIES) {
    errno = ENOSPC;
    fail("too many scratch files for", dir);
  }
  entries[nentries] = strdup(name);
  if (!entries[nentries]) fail("out of memory in", dir);
  nentries++;
}

static void remove_scratch(void) {
  for (int i = 0; i < nentries; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, entries[i]);
    unlink(path);
    free(entries[i]);
  }
  nentries = 0;
  rmdir(dir);
}

static void link_models(void) {
  char models[4200];
  snprintf(models, sizeof models, "%s/models", DS4_SOURCE_DIR);
  DIR *d = opendir(models);
  if (!d) fail("cannot open", models);
  struct dirent *e;
  while ((e = readdir(d))) {
    size_t n = strlen(e->d_name);
    if (n < 6 || strcmp(e->d_name + n - 5, ".yaml") != 0) continue;
    char target[8400];
    snprintf(target, sizeof target, "%s/%s", models, e->d_name);
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    if (symlink(target, path)) fail("cannot link", path);
    remember(e->d_name);
  }
  closedir(d);
}

const char *fuzz_scratch_dir(int with_models) {
  if (dir[0]) return dir;
  const char *tmp = getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%s/ds4-fuzz-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(dir)) fail("cannot make", dir);
  atexit(remove_scratch);
  if (with_models) link_models();
  return dir;
}

const char *fuzz_scratch_write(const char *name, const uint8_t *bytes, size_t size) {
  fuzz_scratch_dir(0);
  remember(name);
  snprintf(path, sizeof path, "%s/%s", dir, name);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) fail("cannot write", path);
  for (size_t done = 0; done < size;) {
    ssize_t w = write(fd, bytes + done, size - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail("cannot write", path);
    done += (size_t)w;
  }
  if (close(fd)) fail("cannot write", path);
  return path;
}
