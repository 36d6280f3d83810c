/* fuzz_scratch.h - the per-process scratch folder of the fuzz targets whose
 * code under test reads files: made on first use under $TMPDIR (or /tmp),
 * removed at exit. Inputs are written into it, one file rewritten per
 * input, so nothing is ever written into the source tree. */
#ifndef DS4_FUZZ_SCRATCH_H
#define DS4_FUZZ_SCRATCH_H

#include <stddef.h>
#include <stdint.h>

/* The folder; with_models (on the first call) also links every shipped
 * descriptions of models/ into it, so that `extends: tiny-moe.yaml` finds the
 * shipped file (read only: the links are never written through). */
const char *fuzz_scratch_dir(int with_models);

/* Writes bytes to the folder's file `name` (made or truncated) and returns
 * its path, valid until the next call. Aborts on an I/O error: the
 * harness, not the code under test, has failed. */
const char *fuzz_scratch_write(const char *name, const uint8_t *bytes, size_t size);

#endif
