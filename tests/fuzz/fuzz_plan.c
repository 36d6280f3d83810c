/* fuzz_plan.c - the plan decoder (plan_decode) on the input's bytes, and
 * once more with the header's size and checksum made to fit them, so that
 * mutations reach the section table and the records behind the checksum.
 * A plan that decodes must encode again (plan_encode validates it the
 * same way), decode from those bytes, and encode to the same bytes. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"
#include "sha256.h"

enum { HEADER_BYTES = 64, SIZE_AT = 16, CHECKSUM_AT = 24 };

static void round_trip(const plan *p) {
  uint8_t *a, *b;
  size_t na, nb;
  rt_status st = plan_encode(p, &a, &na);
  if (st) abort(); /* decoded, so valid: encoding it cannot fail */
  plan q;
  if ((st = plan_decode("again", a, na, &q))) abort();
  if ((st = plan_encode(&q, &b, &nb))) abort();
  if (na != nb || memcmp(a, b, na) != 0) abort();
  plan_free(&q);
  free(a);
  free(b);
}

static void decode(const uint8_t *bytes, size_t size) {
  plan p;
  rt_status st = plan_decode("input.ds4p", bytes, size, &p);
  if (st) {
    if (!rt_status_msg(st)[0]) abort();
    rt_status_free(st);
    return;
  }
  round_trip(&p);
  plan_free(&p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  decode(data, size);
  if (size < HEADER_BYTES) return 0;
  uint8_t *sealed = malloc(size);
  if (!sealed) abort();
  memcpy(sealed, data, size);
  for (int i = 0; i < 8; i++) sealed[SIZE_AT + i] = (uint8_t)((uint64_t)size >> (8 * i));
  rt_sha256(sealed + HEADER_BYTES, size - HEADER_BYTES, sealed + CHECKSUM_AT);
  decode(sealed, size);
  free(sealed);
  return 0;
}
