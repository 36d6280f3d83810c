/* st_write.h - a small safetensors writer for the tests: the header JSON,
 * padded with spaces to a multiple of 8 bytes as the reference writer
 * does, then each tensor's bytes in the order given. */
#ifndef DS4_TESTS_ST_WRITE_H
#define DS4_TESTS_ST_WRITE_H

#include <stddef.h>
#include <stdint.h>

typedef struct st_entry {
  const char *name;  /* the writer escapes it */
  const char *dtype; /* "F32", "BF16", ... written as given */
  uint32_t ndim;
  uint64_t shape[4];
  const void *data;
  size_t bytes;
} st_entry;

/* 0 on success, -1 on an I/O error. */
int st_write(const char *path, const st_entry *e, size_t n);
/* A file of the given header text (its length first) and data bytes. */
int st_write_raw(const char *path, const char *header, const void *data, size_t data_len);
int write_bytes(const char *path, const void *bytes, size_t n);

#endif
