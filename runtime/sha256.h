/* sha256.h - SHA-256 (FIPS 180-4) for plan checksums and code-object
 * hashes, one-shot and incremental, plus lowercase hex formatting. */
#ifndef DS4_SHA256_H
#define DS4_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct rt_sha256_ctx {
  uint32_t h[8];
  uint64_t nbytes;    /* total bytes hashed so far */
  uint8_t block[64];  /* pending partial block */
  size_t nblock;      /* bytes in block */
} rt_sha256_ctx;

void rt_sha256_init(rt_sha256_ctx *c);
void rt_sha256_update(rt_sha256_ctx *c, const void *data, size_t len);
/* Writes the digest; the context must be re-initialised before reuse. */
void rt_sha256_final(rt_sha256_ctx *c, uint8_t out[32]);
void rt_sha256(const void *data, size_t len, uint8_t out[32]);

/* Lowercase hex of n bytes into out, which holds 2*n+1 chars (NUL-terminated). */
void rt_hex(const uint8_t *bytes, size_t n, char *out);

#endif
