/* gpu_api.c - what the cuda and hip APIs share: finding and loading the
 * vendor library, resolving its functions into a table, and the clear
 * messages when either fails. */
#include "gpu_api.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

rt_status gpu_library_open(const gpu_library *lib, void **out_handle, char *out_file,
                           size_t out_len) {
  *out_handle = NULL;
  const char *chosen = getenv(lib->env);
  if (chosen && !*chosen) chosen = NULL;
  const char *override[2] = {chosen, NULL};
  const char *const *files = chosen ? override : lib->files;
  char first_error[512] = "";
  for (size_t i = 0; files[i]; i++) {
    const char *file = files[i];
    void *h = dlopen(file, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (h) {
      snprintf(out_file, out_len, "%s", file);
      *out_handle = h;
      return NULL;
    }
    /* The first candidate's reason is the useful one: the later names are
     * only older sonames of the same library. */
    if (i == 0) {
      const char *why = dlerror();
      snprintf(first_error, sizeof first_error, "%s", why ? why : "unknown dlopen error");
    }
  }
  if (chosen)
    return rt_status_make("%s: cannot load %s (%s), named by %s: set %s to the %s library, or "
                          "unset it",
                          lib->backend, files[0], first_error, lib->env, lib->env, lib->backend);
  return rt_status_make("%s: cannot load %s (%s): %s, or set %s", lib->backend, files[0],
                        first_error, lib->install_hint, lib->env);
}

rt_status gpu_symbols_resolve(const gpu_library *lib, void *handle, const char *file,
                              const gpu_symbol *syms, size_t nsyms, void *table) {
  for (size_t i = 0; i < nsyms; i++) {
    void *fn = dlsym(handle, syms[i].name);
    if (!fn && syms[i].old_name) fn = dlsym(handle, syms[i].old_name);
    if (!fn && syms[i].required)
      return rt_status_make("%s: %s has no function %s: it is not a %s driver library (or too "
                            "old a one); set %s to the right library",
                            lib->backend, file, syms[i].name, lib->backend, lib->env);
    /* POSIX guarantees a function pointer fits a void *. */
    memcpy((char *)table + syms[i].offset, &fn, sizeof fn);
  }
  return NULL;
}

void gpu_error_text(char *buf, size_t len, const char *name, const char *description) {
  if (!description || !*description || strcmp(name, description) == 0)
    snprintf(buf, len, "%s", name);
  else
    snprintf(buf, len, "%s (%s)", name, description);
}
