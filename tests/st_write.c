/* st_write.c - the tests' safetensors writer (st_write.h). */
#include "st_write.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int write_bytes(const char *path, const void *bytes, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f) return -1;
  size_t put = n ? fwrite(bytes, 1, n, f) : 0;
  return fclose(f) == 0 && put == n ? 0 : -1;
}

static void put_string(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
    else if (c < 0x20) fprintf(f, "\\u%04x", c);
    else fputc(c, f);
  }
  fputc('"', f);
}

int st_write(const char *path, const st_entry *e, size_t n) {
  char *header = NULL;
  size_t hlen = 0;
  FILE *h = open_memstream(&header, &hlen);
  if (!h) return -1;
  fputs("{\"__metadata__\":{\"format\":\"pt\"}", h);
  size_t off = 0;
  for (size_t k = 0; k < n; k++) {
    fputc(',', h);
    put_string(h, e[k].name);
    fprintf(h, ":{\"dtype\":\"%s\",\"shape\":[", e[k].dtype);
    for (uint32_t d = 0; d < e[k].ndim; d++)
      fprintf(h, "%s%llu", d ? "," : "", (unsigned long long)e[k].shape[d]);
    fprintf(h, "],\"data_offsets\":[%zu,%zu]}", off, off + e[k].bytes);
    off += e[k].bytes;
  }
  fputc('}', h);
  while (ftell(h) % 8) fputc(' ', h);
  if (fclose(h) != 0) return -1;
  uint8_t *data = malloc(off ? off : 1);
  int rc = -1;
  if (data) {
    size_t at = 0;
    for (size_t k = 0; k < n; k++) {
      if (e[k].bytes) memcpy(data + at, e[k].data, e[k].bytes);
      at += e[k].bytes;
    }
    rc = st_write_raw(path, header, data, off);
  }
  free(data);
  free(header);
  return rc;
}

int st_write_raw(const char *path, const char *header, const void *data, size_t data_len) {
  size_t hlen = strlen(header), total = 8 + hlen + data_len;
  uint8_t *buf = malloc(total);
  if (!buf) return -1;
  for (int k = 0; k < 8; k++) buf[k] = (uint8_t)((uint64_t)hlen >> (8 * k));
  memcpy(buf + 8, header, hlen);
  if (data_len) memcpy(buf + 8 + hlen, data, data_len);
  int rc = write_bytes(path, buf, total);
  free(buf);
  return rc;
}
