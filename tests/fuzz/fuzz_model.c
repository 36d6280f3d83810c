/* fuzz_model.c - the model loader (dsl_model_load) on the input as a file,
 * then every integer expression of what loaded (params, shapes, layer
 * indices and repeats) through dsl_eval.
 *
 * The input is input.yaml of the scratch folder (fuzz_scratch.h), beside
 * links to the shipped descriptions of models/: `extends: deepseek-v4-flash.yaml`
 * loads the shipped description, any other relative name finds nothing.
 * The contract checked: failure leaves no model and a message; success
 * leaves no error. Diagnostics stay in dsl_diag, never on stderr. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dsl.h"
#include "fuzz_scratch.h"

/* Names resolve to a value fixed by their position among the params, so
 * that evaluation never recurses and stays deterministic. */
static int lookup(void *ctx, const char *name, int64_t *out) {
  const dsl_model *m = ctx;
  for (int i = 0; i < m->nparams; i++)
    if (strcmp(m->params[i].key.text, name) == 0) {
      *out = i + 1;
      return 0;
    }
  return -1;
}

static void eval(const dsl_model *m, const dsl_str *e) {
  if (!e->text) return;
  dsl_diag d = {0};
  int64_t v;
  if (dsl_eval(e, lookup, (void *)m, &v, &d) != 0 && !d.failed) abort();
}

static void eval_tensors(const dsl_model *m, const dsl_tensor *t, int n) {
  for (int i = 0; i < n; i++)
    for (int k = 0; k < t[i].ndim; k++) eval(m, &t[i].shape[k]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_scratch_dir(1);
  const char *path = fuzz_scratch_write("input.yaml", data, size);
  dsl_model *m = NULL;
  dsl_diag d = {0};
  if (dsl_model_load(path, &m, &d) != 0) {
    if (m || !d.failed || !d.msg[0]) abort();
    return 0;
  }
  if (d.failed) abort();
  for (int i = 0; i < m->nparams; i++) eval(m, &m->params[i].value);
  eval_tensors(m, m->tensors, m->ntensors);
  for (int b = 0; b < m->nblocks; b++) eval_tensors(m, m->blocks[b].tensors, m->blocks[b].ntensors);
  for (int l = 0; l < m->nlayers; l++) {
    eval(m, &m->layers[l].from);
    eval(m, &m->layers[l].repeat);
    for (int i = 0; i < m->layers[l].nparams; i++) eval(m, &m->layers[l].params[i].value);
  }
  dsl_model_free(m);
  return 0;
}
