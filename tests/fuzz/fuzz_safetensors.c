/* fuzz_safetensors.c - the safetensors reader (st_open) on a file of the
 * input's bytes in the scratch folder (fuzz_scratch.h); when it opens,
 * every tensor is looked up by name (st_find, st_find_checkpoint), taken
 * as a weight (st_weight_of) and its first elements read (st_values,
 * st_convert, st_weight_values, st_weight_convert) into bounded buffers. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_scratch.h"
#include "plan.h"
#include "safetensors.h"

enum { MAX_ELEMS = 64 };

static void check(rt_status st) {
  if (!st) return;
  if (!rt_status_msg(st)[0]) abort();
  rt_status_free(st);
}

static void read_tensor(const st_set *s, const st_tensor *t) {
  if (st_find(s, t->name) != t) abort();
  const st_tensor *found = NULL;
  check(st_find_checkpoint(s, t->name, &found));
  uint64_t n = t->nelem < MAX_ELEMS ? t->nelem : MAX_ELEMS;
  double values[MAX_ELEMS];
  uint32_t out[MAX_ELEMS]; /* room for n elements of any plan dtype */
  check(st_values(t, 0, n, values));
  for (uint32_t to = 0; to < PLAN_NDTYPE; to++) {
    rt_status st = st_convertible(t->dtype, to);
    if (!st) check(st_convert(t, 0, n, to, out));
    check(st);
  }
  st_weight w;
  rt_status st = st_weight_of(s, t, &w);
  if (st) {
    check(st);
    return;
  }
  n = w.nelem < MAX_ELEMS ? w.nelem : MAX_ELEMS;
  check(st_weight_values(&w, 0, n, values));
  for (uint32_t to = 0; to < PLAN_NDTYPE; to++) {
    st = st_weight_convertible(&w, to);
    if (!st) check(st_weight_convert(&w, 0, n, to, out));
    check(st);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = fuzz_scratch_write("input.safetensors", data, size);
  st_set *s = NULL;
  rt_status st = st_open(path, &s);
  if (st) {
    if (s) abort();
    check(st);
    return 0;
  }
  for (uint32_t i = 0; i < st_ntensors(s); i++) read_tensor(s, st_tensor_at(s, i));
  st_close(s);
  return 0;
}
