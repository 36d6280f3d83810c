/* fuzz_main.c - the regression driver of a fuzz target, for builds without
 * libFuzzer: runs LLVMFuzzerTestOneInput once on every file of each folder
 * (or file) named on the command line, in name order, each in a buffer of
 * exactly its size so that the sanitizers see any read past its end.
 * Exits 1 when an argument cannot be read or holds no input. */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "fuzz_main: cannot open %s: %s\n", path, strerror(errno));
    return -1;
  }
  struct stat sb;
  if (fstat(fileno(f), &sb) != 0) {
    fprintf(stderr, "fuzz_main: cannot stat %s: %s\n", path, strerror(errno));
    fclose(f);
    return -1;
  }
  size_t size = (size_t)sb.st_size;
  uint8_t *data = malloc(size ? size : 1);
  if (!data || fread(data, 1, size, f) != size) {
    fprintf(stderr, "fuzz_main: cannot read %s\n", path);
    free(data);
    fclose(f);
    return -1;
  }
  fclose(f);
  LLVMFuzzerTestOneInput(data, size);
  free(data);
  return 0;
}

static int by_name(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every regular file of dir (no dot files), in name order; the number run,
 * or -1. */
static int run_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) {
    fprintf(stderr, "fuzz_main: cannot open %s: %s\n", dir, strerror(errno));
    return -1;
  }
  char **names = NULL;
  size_t n = 0, cap = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    if (n == cap) {
      cap = cap ? 2 * cap : 64;
      char **grown = realloc(names, cap * sizeof *grown);
      if (!grown) abort();
      names = grown;
    }
    size_t len = strlen(dir) + strlen(e->d_name) + 2;
    names[n] = malloc(len);
    if (!names[n]) abort();
    snprintf(names[n++], len, "%s/%s", dir, e->d_name);
  }
  closedir(d);
  qsort(names, n, sizeof *names, by_name);
  int ran = 0, rc = 0;
  for (size_t i = 0; i < n; i++) {
    struct stat sb;
    if (rc == 0 && stat(names[i], &sb) == 0 && S_ISREG(sb.st_mode)) {
      if (run_file(names[i])) rc = -1;
      else ran++;
    }
    free(names[i]);
  }
  free(names);
  return rc ? -1 : ran;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s CORPUS_DIR_OR_FILE...\n", argv[0]);
    return 2;
  }
  for (int i = 1; i < argc; i++) {
    struct stat sb;
    if (stat(argv[i], &sb) != 0) {
      fprintf(stderr, "fuzz_main: cannot open %s: %s\n", argv[i], strerror(errno));
      return 1;
    }
    int ran = S_ISDIR(sb.st_mode) ? run_dir(argv[i]) : run_file(argv[i]) ? -1 : 1;
    if (ran < 0) return 1;
    if (ran == 0) {
      fprintf(stderr, "fuzz_main: %s holds no input\n", argv[i]);
      return 1;
    }
    printf("%s: %d inputs\n", argv[i], ran);
  }
  return 0;
}
