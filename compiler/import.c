/* import.c - ds4c import: a Hugging Face config.json to a model
 * description (dsl_import_hf reads the config), written beside its base
 * and extending it. */
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pipeline.h"

/* The path of `file` relative to folder `dir` (both existing), for the
 * written `extends:`: up from dir to the deepest folder the two share,
 * then down to file. */
static int relative_path(const char *dir, const char *file, char *out, size_t n, dsl_diag *d) {
  char from[PATH_MAX + 2], to[PATH_MAX + 2];
  char *fdir = strdup(file), *fname = strdup(file);
  int ok = fdir && fname && realpath(dir, from) && realpath(dirname(fdir), to);
  if (!ok) {
    int e = errno;
    free(fdir);
    free(fname);
    return dsl_error(d, (dsl_pos){0}, "cannot resolve %s or %s: %s", dir, file, strerror(e));
  }
  /* realpath's results end in no '/', but "/" itself */
  if (strcmp(from, "/")) strcat(from, "/");
  if (strcmp(to, "/")) strcat(to, "/");
  size_t common = 0; /* through the last '/' the two share */
  for (size_t i = 0; from[i] && from[i] == to[i]; i++)
    if (from[i] == '/') common = i + 1;
  size_t len = 0;
  out[0] = 0;
  for (const char *c = from + common; *c && len < n; c++)
    if (*c == '/') len += (size_t)snprintf(out + len, n - len, "../");
  if (len < n) snprintf(out + len, n - len, "%s%s", to + common, basename(fname));
  free(fdir);
  free(fname);
  return 0;
}

/* out_path's file name less its .yaml: the default model name. */
static void stem(const char *path, char *out, size_t n) {
  const char *slash = strrchr(path, '/');
  snprintf(out, n, "%s", slash ? slash + 1 : path);
  size_t len = strlen(out);
  if (len > 5 && strcmp(out + len - 5, ".yaml") == 0) out[len - 5] = 0;
}

/* text into path through a temporary file beside it. */
static int write_atomically(const char *path, const char *text, dsl_diag *d) {
  char tmp[PATH_MAX];
  snprintf(tmp, sizeof tmp, "%s.tmp-%d", path, (int)getpid());
  FILE *f = fopen(tmp, "w");
  if (!f) return dsl_error(d, (dsl_pos){0}, "cannot write %s: %s", tmp, strerror(errno));
  int ok = fputs(text, f) >= 0;
  ok = fclose(f) == 0 && ok;
  if (!ok || rename(tmp, path)) {
    int e = errno;
    remove(tmp);
    return dsl_error(d, (dsl_pos){0}, "cannot write %s: %s", path, strerror(e));
  }
  return 0;
}

int ds4c_import(const ds4c_import_options *o, dsl_diag *d) {
  char name[256], base[PATH_MAX + 32], outdir[PATH_MAX], extends[PATH_MAX];
  stem(o->out_path, name, sizeof name);
  char *copy = strdup(o->out_path);
  if (!copy) return dsl_error(d, (dsl_pos){0}, "out of memory");
  snprintf(outdir, sizeof outdir, "%s", dirname(copy));
  free(copy);
  if (o->base_path) snprintf(base, sizeof base, "%s", o->base_path);
  else snprintf(base, sizeof base, "%s/deepseek-v4-flash.yaml", outdir);
  if (ds4c_make_parents(o->out_path, d)) return -1;
  dsl_model *m;
  if (dsl_model_load(base, &m, d)) {
    if (!o->base_path && access(base, R_OK))
      return dsl_error(d, (dsl_pos){0}, "no base description %s to extend (the release's, beside the output); "
                       "give one with --extends PATH", base);
    return -1;
  }
  int rc = relative_path(outdir, base, extends, sizeof extends, d);
  char *text = NULL;
  dsl_import_opts io = {o->name ? o->name : name, extends, m, o->max_seq, o->tokens};
  if (!rc) rc = dsl_import_hf(o->config_path, &io, &text, d);
  if (!rc) rc = write_atomically(o->out_path, text, d);
  free(text);
  dsl_model_free(m);
  return rc;
}
