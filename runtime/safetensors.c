/* safetensors.c - the safetensors reader: map each file read-only, parse
 * its JSON header with a small strict parser that knows the header's shape
 * (objects of tensors, arrays of integers, strings), check every size and
 * offset against the file, and index the tensors of all files by name.
 * Conversions to the plan's dtypes are here too, so that every path from a
 * checkpoint's bytes to a weight goes through one place. */
#include "safetensors.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "plan.h"

/* The reference implementation refuses longer headers; a length past it
 * means the first 8 bytes are not a header length at all. */
#define ST_MAX_HEADER 100000000ull
#define ST_HEADER_AT 8 /* file offset of the header's first byte */

static const struct {
  const char *name;
  uint32_t bits;
} dtypes[ST_NDTYPE] = {
    [ST_F32] = {"F32", 32},         [ST_BF16] = {"BF16", 16},       [ST_F16] = {"F16", 16},
    [ST_I32] = {"I32", 32},         [ST_I64] = {"I64", 64},         [ST_F64] = {"F64", 64},
    [ST_U8] = {"U8", 8},            [ST_I8] = {"I8", 8},            [ST_U16] = {"U16", 16},
    [ST_I16] = {"I16", 16},         [ST_U32] = {"U32", 32},         [ST_U64] = {"U64", 64},
    [ST_BOOL] = {"BOOL", 8},        [ST_F8_E4M3] = {"F8_E4M3", 8},  [ST_F8_E5M2] = {"F8_E5M2", 8},
    [ST_F8_E8M0] = {"F8_E8M0", 8},  [ST_F4] = {"F4", 4},
};

const char *st_dtype_name(uint32_t dtype) { return dtype < ST_NDTYPE ? dtypes[dtype].name : "?"; }

typedef struct st_map {
  char *path;
  const uint8_t *bytes; /* NULL for an empty file */
  size_t len;
} st_map;

struct st_set {
  char *path;
  int is_dir;
  st_map *files;
  uint32_t nfiles;
  st_tensor *tensors; /* sorted by name */
  uint32_t ntensors;
};

/* ---- the header's JSON -------------------------------------------------- */

typedef struct jp {
  const char *file;
  const uint8_t *s; /* the header */
  size_t n, i;
  rt_status err;
} jp;

static int jp_fail(jp *j, size_t at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int jp_fail(jp *j, size_t at, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *msg = NULL;
  if (vasprintf(&msg, fmt, ap) < 0) msg = NULL;
  va_end(ap);
  j->err = rt_status_make("%s: bad header at byte %zu: %s", j->file, ST_HEADER_AT + at,
                          msg ? msg : "out of memory");
  free(msg);
  return -1;
}

static void jp_ws(jp *j) {
  while (j->i < j->n && (j->s[j->i] == ' ' || j->s[j->i] == '\t' || j->s[j->i] == '\n' ||
                         j->s[j->i] == '\r'))
    j->i++;
}

static int jp_peek(const jp *j) { return j->i < j->n ? j->s[j->i] : -1; }

static int jp_unexpected(jp *j, const char *want) {
  if (j->i >= j->n) return jp_fail(j, j->i, "the header ends where %s was expected", want);
  uint8_t c = j->s[j->i];
  if (c > 0x20 && c < 0x7f) return jp_fail(j, j->i, "expected %s, found '%c'", want, c);
  return jp_fail(j, j->i, "expected %s, found byte 0x%02x", want, c);
}

static int jp_expect(jp *j, char c, const char *want) {
  jp_ws(j);
  if (jp_peek(j) != (uint8_t)c) return jp_unexpected(j, want);
  j->i++;
  return 0;
}

/* Length of the well-formed UTF-8 sequence at s (n bytes left), 0 if none:
 * no overlong forms, surrogates or code points past U+10FFFF. */
static size_t utf8_len(const uint8_t *s, size_t n) {
  uint8_t c = s[0];
  size_t len;
  uint8_t lo = 0x80, hi = 0xbf; /* range of the second byte */
  if (c < 0x80) return 1;
  if (c >= 0xc2 && c <= 0xdf) len = 2;
  else if (c >= 0xe0 && c <= 0xef) len = 3, lo = c == 0xe0 ? 0xa0 : 0x80, hi = c == 0xed ? 0x9f : 0xbf;
  else if (c >= 0xf0 && c <= 0xf4) len = 4, lo = c == 0xf0 ? 0x90 : 0x80, hi = c == 0xf4 ? 0x8f : 0xbf;
  else return 0;
  if (n < len || s[1] < lo || s[1] > hi) return 0;
  for (size_t k = 2; k < len; k++)
    if (s[k] < 0x80 || s[k] > 0xbf) return 0;
  return len;
}

typedef struct sbuf {
  char *p;
  size_t len, cap;
} sbuf;

static int sbuf_put(sbuf *b, const void *bytes, size_t n) {
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 32;
    while (b->len + n + 1 > cap) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return -1;
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->len, bytes, n);
  b->len += n;
  b->p[b->len] = 0;
  return 0;
}

static int hex4(const uint8_t *s, uint32_t *out) {
  uint32_t v = 0;
  for (int k = 0; k < 4; k++) {
    uint8_t c = s[k];
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
          : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (d < 0) return -1;
    v = v << 4 | (uint32_t)d;
  }
  *out = v;
  return 0;
}

/* \uXXXX at j->i (just after the backslash and 'u'), with its low
 * surrogate when it is a high one: the code point. */
static int jp_unicode(jp *j, size_t at, uint32_t *out) {
  uint32_t u, lo;
  if (j->n - j->i < 4 || hex4(j->s + j->i, &u))
    return jp_fail(j, at, "\\u needs four hex digits");
  j->i += 4;
  if (u >= 0xdc00 && u <= 0xdfff) return jp_fail(j, at, "a low surrogate without a high one");
  if (u >= 0xd800 && u <= 0xdbff) {
    if (j->n - j->i < 6 || j->s[j->i] != '\\' || j->s[j->i + 1] != 'u' ||
        hex4(j->s + j->i + 2, &lo) || lo < 0xdc00 || lo > 0xdfff)
      return jp_fail(j, at, "a high surrogate without a low one");
    j->i += 6;
    u = 0x10000 + ((u - 0xd800) << 10) + (lo - 0xdc00);
  }
  if (u == 0) return jp_fail(j, at, "a NUL character (\\u0000) in a string");
  *out = u;
  return 0;
}

static int put_utf8(sbuf *b, uint32_t u) {
  uint8_t e[4];
  size_t n;
  if (u < 0x80) e[0] = (uint8_t)u, n = 1;
  else if (u < 0x800) e[0] = (uint8_t)(0xc0 | u >> 6), e[1] = (uint8_t)(0x80 | (u & 63)), n = 2;
  else if (u < 0x10000)
    e[0] = (uint8_t)(0xe0 | u >> 12), e[1] = (uint8_t)(0x80 | (u >> 6 & 63)),
    e[2] = (uint8_t)(0x80 | (u & 63)), n = 3;
  else
    e[0] = (uint8_t)(0xf0 | u >> 18), e[1] = (uint8_t)(0x80 | (u >> 12 & 63)),
    e[2] = (uint8_t)(0x80 | (u >> 6 & 63)), e[3] = (uint8_t)(0x80 | (u & 63)), n = 4;
  return sbuf_put(b, e, n);
}

/* One escape after a backslash at `at`, appended decoded. */
static int jp_escape(jp *j, size_t at, sbuf *b) {
  static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
  if (j->i >= j->n) return jp_fail(j, at, "the header ends inside a string");
  uint8_t c = j->s[j->i++];
  const char *k = c ? strchr(from, c) : NULL;
  if (k) return sbuf_put(b, &to[k - from], 1);
  if (c != 'u') return jp_fail(j, at, "unknown escape '\\%c'", c > 0x20 && c < 0x7f ? c : '?');
  uint32_t u = 0;
  if (jp_unicode(j, at, &u)) return -1;
  return put_utf8(b, u);
}

/* A string: *out is its decoded, NUL-terminated copy (caller frees). */
static int jp_string(jp *j, char **out) {
  jp_ws(j);
  if (jp_peek(j) != '"') return jp_unexpected(j, "a string");
  j->i++;
  sbuf b = {0};
  if (sbuf_put(&b, "", 0)) return jp_fail(j, j->i, "out of memory");
  for (;;) {
    if (j->i >= j->n) {
      free(b.p);
      return jp_fail(j, j->i, "the header ends inside a string");
    }
    size_t at = j->i;
    uint8_t c = j->s[j->i];
    int rc = 0;
    if (c == '"') {
      j->i++;
      *out = b.p;
      return 0;
    } else if (c == '\\') {
      j->i++;
      rc = jp_escape(j, at, &b);
    } else if (c < 0x20) {
      rc = jp_fail(j, at, "control character 0x%02x in a string", c);
    } else {
      size_t n = utf8_len(j->s + at, j->n - at);
      rc = n ? sbuf_put(&b, j->s + at, n) : jp_fail(j, at, "invalid UTF-8 in a string");
      j->i += n;
    }
    if (rc) {
      if (!j->err) jp_fail(j, at, "out of memory");
      free(b.p);
      return -1;
    }
  }
}

/* A non-negative JSON integer (no sign, fraction or exponent), < 2^64. */
static int jp_uint(jp *j, uint64_t *out) {
  jp_ws(j);
  size_t at = j->i;
  int c = jp_peek(j);
  if (c == '-') return jp_fail(j, at, "expected a non-negative integer, found '-'");
  if (c < '0' || c > '9') return jp_unexpected(j, "an integer");
  uint64_t v = 0;
  while ((c = jp_peek(j)) >= '0' && c <= '9') {
    if (v == 0 && j->i > at) return jp_fail(j, at, "an integer with a leading zero");
    uint64_t d = (uint64_t)(c - '0');
    if (v > (UINT64_MAX - d) / 10) return jp_fail(j, at, "an integer past 64 bits");
    v = v * 10 + d;
    j->i++;
  }
  if (c == '.' || c == 'e' || c == 'E') return jp_fail(j, j->i, "expected an integer, found '%c'", c);
  *out = v;
  return 0;
}

/* [u, u, ...] with at most max entries. */
static int jp_uints(jp *j, const char *what, uint64_t *out, uint32_t max, uint32_t *count) {
  if (jp_expect(j, '[', "'['")) return -1;
  *count = 0;
  jp_ws(j);
  if (jp_peek(j) == ']') {
    j->i++;
    return 0;
  }
  for (;;) {
    jp_ws(j);
    size_t at = j->i;
    uint64_t v = 0;
    if (jp_uint(j, &v)) return -1;
    if (*count == max) return jp_fail(j, at, "%s has more than %u entries", what, max);
    out[(*count)++] = v;
    jp_ws(j);
    int c = jp_peek(j);
    if (c == ']') {
      j->i++;
      return 0;
    }
    if (c != ',') return jp_unexpected(j, "',' or ']'");
    j->i++;
  }
}

/* { "key": value, ... }: member parses each value and owns the key. */
typedef int (*jp_member)(jp *j, void *ctx, char *key, size_t key_at);

static int jp_object(jp *j, jp_member member, void *ctx) {
  if (jp_expect(j, '{', "'{'")) return -1;
  jp_ws(j);
  if (jp_peek(j) == '}') {
    j->i++;
    return 0;
  }
  for (;;) {
    jp_ws(j);
    size_t at = j->i;
    char *key;
    if (jp_string(j, &key)) return -1;
    if (jp_expect(j, ':', "':'")) {
      free(key);
      return -1;
    }
    if (member(j, ctx, key, at)) return -1;
    jp_ws(j);
    int c = jp_peek(j);
    if (c == '}') {
      j->i++;
      return 0;
    }
    if (c != ',') return jp_unexpected(j, "',' or '}'");
    j->i++;
  }
}

/* ---- one file's entries -------------------------------------------------- */

typedef struct entry {
  st_tensor t;
  uint64_t begin, end; /* data_offsets */
  size_t at;           /* header offset of the name */
  int have[3];         /* dtype, shape, data_offsets seen */
} entry;

typedef struct parse {
  entry *e;
  uint32_t n, cap;
  int have_metadata;
} parse;

static int metadata_member(jp *j, void *ctx, char *key, size_t key_at) {
  (void)ctx;
  (void)key_at;
  free(key);
  jp_ws(j);
  if (jp_peek(j) != '"') return jp_unexpected(j, "a string (__metadata__ values are strings)");
  char *value;
  if (jp_string(j, &value)) return -1;
  free(value);
  return 0;
}

static const char *const entry_keys[3] = {"dtype", "shape", "data_offsets"};

static int entry_dtype(jp *j, entry *e) {
  jp_ws(j);
  size_t at = j->i;
  char *s;
  if (jp_string(j, &s)) return -1;
  uint32_t d = 0;
  while (d < ST_NDTYPE && strcmp(dtypes[d].name, s) != 0) d++;
  int rc = d == ST_NDTYPE ? jp_fail(j, at, "tensor '%s': unknown dtype '%s'", e->t.name, s) : 0;
  free(s);
  e->t.dtype = d;
  return rc;
}

static int entry_member(jp *j, void *ctx, char *key, size_t key_at) {
  entry *e = ctx;
  int k = 0;
  while (k < 3 && strcmp(entry_keys[k], key) != 0) k++;
  if (k == 3) {
    jp_fail(j, key_at, "tensor '%s': unknown key '%s'", e->t.name, key);
    free(key);
    return -1;
  }
  free(key);
  if (e->have[k]) return jp_fail(j, key_at, "tensor '%s': '%s' twice", e->t.name, entry_keys[k]);
  e->have[k] = 1;
  if (k == 0) return entry_dtype(j, e);
  if (k == 1) return jp_uints(j, "shape", e->t.shape, ST_MAXDIM, &e->t.ndim);
  jp_ws(j);
  size_t at = j->i;
  uint64_t offs[2];
  uint32_t n;
  if (jp_uints(j, "data_offsets", offs, 2, &n)) return -1;
  if (n != 2) return jp_fail(j, at, "tensor '%s': data_offsets needs 2 integers, has %u", e->t.name, n);
  e->begin = offs[0];
  e->end = offs[1];
  return 0;
}

static int top_member(jp *j, void *ctx, char *key, size_t key_at) {
  parse *ps = ctx;
  if (strcmp(key, "__metadata__") == 0) {
    free(key);
    if (ps->have_metadata++) return jp_fail(j, key_at, "'__metadata__' twice");
    return jp_object(j, metadata_member, NULL);
  }
  if (ps->n == ps->cap) {
    uint32_t cap = ps->cap ? 2 * ps->cap : 16;
    entry *e = realloc(ps->e, cap * sizeof *e);
    if (!e) {
      free(key);
      return jp_fail(j, key_at, "out of memory");
    }
    ps->e = e;
    ps->cap = cap;
  }
  entry *e = &ps->e[ps->n++];
  memset(e, 0, sizeof *e);
  e->t.name = key; /* owned by the entry from here on */
  e->at = key_at;
  jp_ws(j);
  size_t at = j->i;
  if (jp_object(j, entry_member, e)) return -1;
  for (int k = 0; k < 3; k++)
    if (!e->have[k]) return jp_fail(j, at, "tensor '%s' has no '%s'", key, entry_keys[k]);
  return 0;
}

static void shape_text(const uint64_t *shape, uint32_t ndim, char *out, size_t n) {
  size_t k = (size_t)snprintf(out, n, "[");
  for (uint32_t d = 0; d < ndim && k < n; d++)
    k += (size_t)snprintf(out + k, n - k, "%s%" PRIu64, d ? ", " : "", shape[d]);
  if (k < n) snprintf(out + k, n - k, "]");
}

/* What the header claims against what the file holds: the element count,
 * the byte size its dtype gives, and the data range. */
static int entry_check(jp *j, entry *e, const st_map *f, const uint8_t *data, uint64_t data_len) {
  st_tensor *t = &e->t;
  char shape[200];
  shape_text(t->shape, t->ndim, shape, sizeof shape);
  uint64_t n = 1;
  for (uint32_t d = 0; d < t->ndim; d++) {
    if (t->shape[d] && n > UINT64_MAX / 64 / t->shape[d])
      return jp_fail(j, e->at, "tensor '%s': shape %s has too many elements", t->name, shape);
    n *= t->shape[d];
  }
  uint64_t bits = n * dtypes[t->dtype].bits;
  if (bits % 8)
    return jp_fail(j, e->at, "tensor '%s': %s %s is not a whole number of bytes", t->name,
                   dtypes[t->dtype].name, shape);
  if (e->begin > e->end)
    return jp_fail(j, e->at, "tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] end before they begin",
                   t->name, e->begin, e->end);
  if (e->end - e->begin != bits / 8)
    return jp_fail(j, e->at, "tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] hold %" PRIu64
                   " bytes, but %s %s needs %" PRIu64,
                   t->name, e->begin, e->end, e->end - e->begin, dtypes[t->dtype].name, shape, bits / 8);
  if (e->end > data_len) {
    j->err = rt_status_make("%s: truncated: tensor '%s' needs data bytes [%" PRIu64 ", %" PRIu64
                            "), the file holds %" PRIu64 " after its header",
                            j->file, t->name, e->begin, e->end, data_len);
    return -1;
  }
  t->nelem = n;
  t->bytes = bits / 8;
  t->data = data + e->begin;
  t->offset = (uint64_t)(t->data - f->bytes);
  return 0;
}

static int entry_cmp(const void *a, const void *b) {
  const entry *x = a, *y = b;
  int c = strcmp(x->t.name, y->t.name);
  return c ? c : (x->at > y->at) - (x->at < y->at);
}

/* Parse the header of a mapped file into ps, sorted by name. */
static rt_status parse_file(const st_map *f, parse *ps) {
  if (f->len < ST_HEADER_AT)
    return rt_status_make("%s: not a safetensors file (%zu bytes, fewer than the 8 of the header "
                          "length)",
                          f->path, f->len);
  uint64_t hlen = 0;
  for (int k = 7; k >= 0; k--) hlen = hlen << 8 | f->bytes[k];
  if (hlen > ST_MAX_HEADER)
    return rt_status_make("%s: not a safetensors file (header length %" PRIu64 " is past the "
                          "format's limit of %llu bytes)",
                          f->path, hlen, ST_MAX_HEADER);
  if (hlen > f->len - ST_HEADER_AT)
    return rt_status_make("%s: truncated: the header needs %" PRIu64 " bytes, the file has %zu "
                          "after the header length",
                          f->path, hlen, f->len - ST_HEADER_AT);
  if (hlen == 0 || f->bytes[ST_HEADER_AT] != '{')
    return rt_status_make("%s: not a safetensors file (the header does not start with '{')",
                          f->path);
  jp j = {.file = f->path, .s = f->bytes + ST_HEADER_AT, .n = hlen};
  if (!jp_object(&j, top_member, ps)) {
    jp_ws(&j);
    if (j.i < j.n) jp_unexpected(&j, "the end of the header");
  }
  const uint8_t *data = f->bytes + ST_HEADER_AT + hlen;
  uint64_t data_len = f->len - ST_HEADER_AT - hlen;
  for (uint32_t k = 0; k < ps->n && !j.err; k++) entry_check(&j, &ps->e[k], f, data, data_len);
  if (j.err) return j.err;
  if (ps->n > 1) qsort(ps->e, ps->n, sizeof *ps->e, entry_cmp);
  for (uint32_t k = 1; k < ps->n; k++)
    if (strcmp(ps->e[k - 1].t.name, ps->e[k].t.name) == 0) {
      jp_fail(&j, ps->e[k].at, "tensor '%s' appears twice (first at byte %zu)", ps->e[k].t.name,
              ST_HEADER_AT + ps->e[k - 1].at);
      return j.err;
    }
  return NULL;
}

/* ---- files and sets ------------------------------------------------------ */

static rt_status map_file(st_map *f) {
  const char *path = f->path;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return rt_status_make("%s: cannot open: %s", path, strerror(errno));
  struct stat st;
  rt_status s = NULL;
  if (fstat(fd, &st) != 0)
    s = rt_status_make("%s: cannot stat: %s", path, strerror(errno));
  else if (!S_ISREG(st.st_mode))
    s = rt_status_make("%s: not a regular file", path);
  else if ((f->len = (size_t)st.st_size) > 0) {
    void *m = mmap(NULL, f->len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) s = rt_status_make("%s: cannot map: %s", path, strerror(errno));
    else f->bytes = m;
  }
  close(fd);
  return s;
}

static void free_entries(parse *ps) {
  for (uint32_t k = 0; k < ps->n; k++) free((char *)ps->e[k].t.name);
  free(ps->e);
}

/* Map file number `file` of the set and add its tensors. */
static rt_status add_file(st_set *s, uint32_t file) {
  RT_TRY(map_file(&s->files[file]));
  parse ps = {0};
  rt_status err = parse_file(&s->files[file], &ps);
  st_tensor *t = err ? NULL : realloc(s->tensors, (s->ntensors + ps.n + 1) * sizeof *t);
  if (!err && !t) err = rt_status_make("out of memory");
  if (err) {
    free_entries(&ps);
    return err;
  }
  s->tensors = t;
  for (uint32_t k = 0; k < ps.n; k++) {
    ps.e[k].t.file = file;
    s->tensors[s->ntensors++] = ps.e[k].t; /* the name moves to the set */
  }
  free(ps.e);
  return NULL;
}

static int str_cmp(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static int is_safetensors_name(const char *name) {
  static const char ext[] = ".safetensors";
  size_t n = strlen(name), e = sizeof ext - 1;
  return n > e && strcmp(name + n - e, ext) == 0;
}

/* The set's file list: the path itself, or DIR's *.safetensors in name
 * order (each mapped later by add_file). */
static rt_status list_files(st_set *s) {
  struct stat st;
  if (stat(s->path, &st) != 0) return rt_status_make("%s: cannot open: %s", s->path, strerror(errno));
  s->is_dir = S_ISDIR(st.st_mode);
  if (!s->is_dir) {
    s->files = calloc(1, sizeof *s->files);
    if (!s->files || !(s->files[0].path = strdup(s->path))) return rt_status_make("out of memory");
    s->nfiles = 1;
    return NULL;
  }
  DIR *d = opendir(s->path);
  if (!d) return rt_status_make("%s: cannot open: %s", s->path, strerror(errno));
  size_t dl = strlen(s->path);
  const char *sep = dl && s->path[dl - 1] == '/' ? "" : "/";
  char **names = NULL;
  size_t n = 0, cap = 0;
  rt_status err = NULL;
  for (struct dirent *de; !err && (de = readdir(d));) {
    if (!is_safetensors_name(de->d_name)) continue;
    if (n == cap) {
      cap = cap ? 2 * cap : 16;
      char **grown = realloc(names, cap * sizeof *grown);
      if (!grown) err = rt_status_make("out of memory");
      else names = grown;
    }
    if (!err && asprintf(&names[n], "%s%s%s", s->path, sep, de->d_name) < 0)
      err = rt_status_make("out of memory");
    if (!err) n++;
  }
  closedir(d);
  if (!err && n == 0) err = rt_status_make("%s: no *.safetensors files", s->path);
  if (!err) {
    qsort(names, n, sizeof *names, str_cmp);
    s->files = calloc(n, sizeof *s->files);
    if (!s->files) err = rt_status_make("out of memory");
  }
  for (size_t k = 0; k < n; k++) {
    if (err) free(names[k]);
    else s->files[k].path = names[k];
  }
  free(names);
  if (!err) s->nfiles = (uint32_t)n;
  return err;
}

static int tensor_cmp(const void *a, const void *b) {
  const st_tensor *x = a, *y = b;
  int c = strcmp(x->name, y->name);
  return c ? c : (x->file > y->file) - (x->file < y->file);
}

static rt_status build_set(st_set *s) {
  RT_TRY(list_files(s));
  for (uint32_t f = 0; f < s->nfiles; f++) RT_TRY(add_file(s, f));
  qsort(s->tensors, s->ntensors, sizeof *s->tensors, tensor_cmp);
  for (uint32_t k = 1; k < s->ntensors; k++)
    if (strcmp(s->tensors[k - 1].name, s->tensors[k].name) == 0)
      return rt_status_make("tensor '%s' is in both %s and %s", s->tensors[k].name,
                            s->files[s->tensors[k - 1].file].path, s->files[s->tensors[k].file].path);
  return NULL;
}

rt_status st_open(const char *path, st_set **out_set) {
  *out_set = NULL;
  st_set *s = calloc(1, sizeof *s);
  if (!s || !(s->path = strdup(path))) {
    free(s);
    return rt_status_make("out of memory");
  }
  rt_status err = build_set(s);
  if (err) {
    st_close(s);
    return err;
  }
  *out_set = s;
  return NULL;
}

void st_close(st_set *s) {
  if (!s) return;
  for (uint32_t k = 0; k < s->ntensors; k++) free((char *)s->tensors[k].name);
  free(s->tensors);
  for (uint32_t f = 0; s->files && f < s->nfiles; f++) {
    if (s->files[f].bytes) munmap((void *)s->files[f].bytes, s->files[f].len);
    free(s->files[f].path);
  }
  free(s->files);
  free(s->path);
  free(s);
}

const char *st_path(const st_set *s) { return s->path; }
int st_is_dir(const st_set *s) { return s->is_dir; }
uint32_t st_nfiles(const st_set *s) { return s->nfiles; }
const char *st_file(const st_set *s, uint32_t file) { return s->files[file].path; }
uint32_t st_ntensors(const st_set *s) { return s->ntensors; }
const st_tensor *st_tensor_at(const st_set *s, uint32_t i) { return &s->tensors[i]; }

static int name_cmp(const void *key, const void *t) {
  return strcmp(key, ((const st_tensor *)t)->name);
}

const st_tensor *st_find(const st_set *s, const char *name) {
  return s->ntensors ? bsearch(name, s->tensors, s->ntensors, sizeof *s->tensors, name_cmp) : NULL;
}

int st_pretrained_name(const char *name, char *out, size_t n) {
  static const char *const renamed[][2] = {
      {"embed.weight", "model.embed_tokens.weight"},
      {"hc_head_fn", "model.hc_head.hc_fn"},
      {"hc_head_base", "model.hc_head.hc_base"},
      {"hc_head_scale", "model.hc_head.hc_scale"},
  };
  static const char kv_norm[] = ".attn.kv_norm.weight";
  if (strcmp(name, "head.weight") == 0) return 0;
  for (size_t k = 0; k < sizeof renamed / sizeof renamed[0]; k++)
    if (strcmp(name, renamed[k][0]) == 0) return snprintf(out, n, "%s", renamed[k][1]) < (int)n;
  size_t len = strlen(name), kl = sizeof kv_norm - 1;
  if (len >= kl && strcmp(name + len - kl, kv_norm) == 0)
    return snprintf(out, n, "model.%.*s.attn.norm.weight", (int)(len - kl), name) < (int)n;
  return snprintf(out, n, "model.%s", name) < (int)n;
}

rt_status st_find_checkpoint(const st_set *s, const char *name, const st_tensor **out) {
  const st_tensor *t = st_find(s, name), *u = NULL;
  char alt[1024];
  if (st_pretrained_name(name, alt, sizeof alt)) u = st_find(s, alt);
  *out = t && u ? NULL : t ? t : u;
  if (t && u)
    return rt_status_make("both '%s' (in %s) and its save_pretrained spelling '%s' (in %s) are in "
                          "the checkpoint",
                          t->name, st_file(s, t->file), u->name, st_file(s, u->file));
  return NULL;
}

/* ---- elements and conversions ------------------------------------------- */

static uint16_t load16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t load32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t load64(const uint8_t *p) { return load32(p) | (uint64_t)load32(p + 4) << 32; }

static float f32_of_bits(uint32_t bits) {
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

static uint32_t f32_bits_of_f16(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = h >> 10 & 31, m = h & 0x3ff;
  if (e == 31) return sign | 0x7f800000 | m << 13;
  if (e) return sign | (e + 112) << 23 | m << 13;
  if (!m) return sign;
  e = 113; /* subnormal m * 2^-24: normalise */
  while (!(m & 0x400)) m <<= 1, e--;
  return sign | e << 23 | (m & 0x3ff) << 13;
}

/* Round to nearest, ties to even; NaN stays NaN (quiet), overflow is inf. */
static uint16_t bf16_of_f32_bits(uint32_t x) {
  if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)(x >> 16 | 0x40);
  return (uint16_t)((x + 0x7fff + (x >> 16 & 1)) >> 16);
}

static uint16_t f16_of_f32_bits(uint32_t x) {
  uint16_t sign = (uint16_t)(x >> 16 & 0x8000);
  uint32_t a = x & 0x7fffffff;
  if (a > 0x7f800000) return sign | 0x7e00 | (uint16_t)(a >> 13 & 0x3ff);
  if (a >= 0x477ff000) return sign | 0x7c00; /* 65520 and up round past 65504 */
  if (a >= 0x38800000) /* normal: 2^-14 and up; a carry out of the fraction bumps the exponent */
    return sign | (uint16_t)((a + 0xfff + (a >> 13 & 1) - 0x38000000) >> 13);
  uint32_t e = a >> 23;
  if (e < 102) return sign; /* below 2^-25: rounds to zero */
  uint32_t m = (a & 0x7fffff) | 0x800000, shift = 126 - e; /* subnormal: m * 2^(e-150) / 2^-24 */
  uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1))) q++;
  return sign | (uint16_t)q;
}

static int is_readable(uint32_t dtype) { return dtype <= ST_I64; }

/* The plan dtype whose elements have exactly the bytes of this one. */
static uint32_t same_plan_dtype(uint32_t dtype) {
  switch (dtype) {
  case ST_F32: return PLAN_F32;
  case ST_BF16: return PLAN_BF16;
  case ST_F16: return PLAN_F16;
  case ST_I32: return PLAN_I32;
  }
  return PLAN_NDTYPE;
}

rt_status st_convertible(uint32_t from, uint32_t to) {
  if (!is_readable(from))
    return rt_status_make("checkpoint dtype %s is not supported yet", st_dtype_name(from));
  int ok = same_plan_dtype(from) == to || (to == PLAN_F32 && (from == ST_BF16 || from == ST_F16)) ||
           (from == ST_F32 && (to == PLAN_BF16 || to == PLAN_F16)) || (from == ST_I64 && to == PLAN_I32);
  if (ok) return NULL;
  return rt_status_make("cannot convert checkpoint dtype %s to the plan's %s", st_dtype_name(from),
                        plan_dtype_name(to));
}

rt_status st_convert(const st_tensor *t, uint64_t first, uint64_t count, uint32_t to, void *dst) {
  RT_TRY(st_convertible(t->dtype, to));
  const uint32_t esz = dtypes[t->dtype].bits / 8;
  const uint8_t *src = t->data + first * esz;
  if (same_plan_dtype(t->dtype) == to) {
    memcpy(dst, src, count * esz);
    return NULL;
  }
  for (uint64_t k = 0; k < count; k++, src += esz) {
    switch (t->dtype) {
    case ST_BF16: ((uint32_t *)dst)[k] = (uint32_t)load16(src) << 16; break;
    case ST_F16: ((uint32_t *)dst)[k] = f32_bits_of_f16(load16(src)); break;
    case ST_F32:
      ((uint16_t *)dst)[k] = to == PLAN_BF16 ? bf16_of_f32_bits(load32(src)) : f16_of_f32_bits(load32(src));
      break;
    case ST_I64: {
      int64_t v = (int64_t)load64(src);
      if (v < INT32_MIN || v > INT32_MAX)
        return rt_status_make("element %" PRIu64 " is %" PRId64 ", outside the int32 range", first + k, v);
      ((int32_t *)dst)[k] = (int32_t)v;
      break;
    }
    }
  }
  return NULL;
}

rt_status st_values(const st_tensor *t, uint64_t first, uint64_t count, double *out) {
  if (!is_readable(t->dtype))
    return rt_status_make("checkpoint dtype %s is not supported yet", st_dtype_name(t->dtype));
  const uint32_t esz = dtypes[t->dtype].bits / 8;
  const uint8_t *src = t->data + first * esz;
  for (uint64_t k = 0; k < count; k++, src += esz) {
    switch (t->dtype) {
    case ST_F32: out[k] = f32_of_bits(load32(src)); break;
    case ST_BF16: out[k] = f32_of_bits((uint32_t)load16(src) << 16); break;
    case ST_F16: out[k] = f32_of_bits(f32_bits_of_f16(load16(src))); break;
    case ST_I32: out[k] = (int32_t)load32(src); break;
    case ST_I64: out[k] = (double)(int64_t)load64(src); break;
    }
  }
  return NULL;
}

/* ---- block-scaled weights (MATH.md §13.3) -------------------------------- */

#define ST_FP8_BLOCK 128 /* one F8_E4M3 scale per 128 x 128 block */
#define ST_FP4_BLOCK 32  /* one FP4 scale per 32 columns of a row */

static uint64_t ceil_div(uint64_t a, uint64_t b) { return a / b + (a % b != 0); }

/* The companion of a quantized tensor: ".weight" becomes ".scale"
 * ("layers.0.attn.wq_a.scale", as the release spells it), or ".scale" is
 * appended. Caller frees. */
static char *scale_name(const char *name) {
  static const char weight[] = ".weight", scale[] = ".scale";
  size_t n = strlen(name), wl = sizeof weight - 1;
  if (n >= wl && strcmp(name + n - wl, weight) == 0) n -= wl;
  char *out = malloc(n + sizeof scale);
  if (!out) return NULL;
  memcpy(out, name, n);
  memcpy(out + n, scale, sizeof scale);
  return out;
}

static const char *encoding_name(const st_weight *w) {
  if (w->encoding == ST_FP8_BLOCKS) return "F8_E4M3";
  return w->values->dtype == ST_I8 ? "FP4 packed in I8" : "FP4 packed in U8";
}

/* t [rows, cols] (FP4: [rows, cols / 2]) with scale tensor sc. */
static rt_status quantized_weight(const st_tensor *t, const st_tensor *sc, st_weight *w) {
  w->scale = sc;
  w->encoding = t->dtype == ST_F8_E4M3 ? ST_FP8_BLOCKS : ST_FP4_PACKED;
  char have[200], shape[200];
  shape_text(t->shape, t->ndim, shape, sizeof shape);
  if (t->ndim != 2)
    return rt_status_make("%s %s with block scales '%s' is not 2-D", encoding_name(w), shape, sc->name);
  int fp8 = w->encoding == ST_FP8_BLOCKS;
  uint64_t rows = t->shape[0], cols = fp8 ? t->shape[1] : 2 * t->shape[1];
  uint64_t want[2] = {fp8 ? ceil_div(rows, ST_FP8_BLOCK) : rows,
                      ceil_div(cols, fp8 ? ST_FP8_BLOCK : ST_FP4_BLOCK)};
  if (sc->dtype != ST_F8_E8M0 || sc->ndim != 2 || sc->shape[0] != want[0] || sc->shape[1] != want[1]) {
    shape_text(sc->shape, sc->ndim, have, sizeof have);
    return rt_status_make("block scales '%s' are %s %s; %s %s needs F8_E8M0 [%" PRIu64 ", %" PRIu64 "]",
                          sc->name, st_dtype_name(sc->dtype), have, encoding_name(w), shape, want[0],
                          want[1]);
  }
  w->shape[1] = cols;
  w->nelem = rows * cols;
  return NULL;
}

rt_status st_weight_of(const st_set *s, const st_tensor *t, st_weight *out) {
  *out = (st_weight){.values = t, .encoding = ST_PLAIN, .ndim = t->ndim, .nelem = t->nelem};
  memcpy(out->shape, t->shape, sizeof out->shape);
  if (t->dtype != ST_F8_E4M3 && t->dtype != ST_I8 && t->dtype != ST_U8) return NULL;
  char *name = scale_name(t->name);
  if (!name) return rt_status_make("out of memory");
  const st_tensor *sc = st_find(s, name);
  rt_status err = NULL;
  if (sc) err = quantized_weight(t, sc, out);
  else if (t->dtype == ST_F8_E4M3)
    err = rt_status_make("F8_E4M3 needs its block scales '%s', which are not in the checkpoint", name);
  free(name);
  return err;
}

rt_status st_weight_convertible(const st_weight *w, uint32_t to) {
  if (w->encoding == ST_PLAIN) return st_convertible(w->values->dtype, to);
  if (to == PLAN_F32 || to == PLAN_BF16) return NULL;
  return rt_status_make("cannot convert %s to the plan's %s (block-scaled weights become f32 or bf16)",
                        encoding_name(w), plan_dtype_name(to));
}

/* Every code's value as f32 bits (exact: at most 4 significant bits;
 * runtime/plan.c's values, an E4M3 NaN code a quiet NaN of its sign). */
static void code_table(const st_weight *w, uint32_t lut[256]) {
  int fp8 = w->encoding == ST_FP8_BLOCKS;
  for (uint32_t c = 0; c < (fp8 ? 256u : 16u); c++) {
    float v = (float)(fp8 ? plan_f8e4m3_value((uint8_t)c) : plan_fp4_value((uint8_t)c));
    memcpy(&lut[c], &v, 4);
    if (isnan(v)) lut[c] = (c & 0x80) << 24 | 0x7fc00000u;
  }
}

/* From logical element k of a quantized w on, the elements that share a
 * scale: row i, first column j, how many (at most left), and the scale's
 * power of two x. */
typedef struct scale_run {
  uint64_t i, j, n;
  int x;
} scale_run;

static rt_status next_scale_run(const st_weight *w, uint64_t k, uint64_t left, scale_run *r) {
  int fp8 = w->encoding == ST_FP8_BLOCKS;
  uint64_t cols = w->shape[1], width = fp8 ? ST_FP8_BLOCK : ST_FP4_BLOCK;
  r->i = k / cols;
  r->j = k % cols;
  uint64_t end = (r->j / width + 1) * width;
  r->n = (end < cols ? end : cols) - r->j;
  if (r->n > left) r->n = left;
  uint64_t bi = fp8 ? r->i / ST_FP8_BLOCK : r->i, bj = r->j / width;
  uint8_t s = w->scale->data[bi * w->scale->shape[1] + bj];
  if (s == 255)
    return rt_status_make("block [%" PRIu64 ", %" PRIu64 "] of scales '%s' is 255, NaN in F8_E8M0", bi,
                          bj, w->scale->name);
  r->x = (int)s - 127;
  return NULL;
}

static uint32_t code_at(const st_weight *w, uint64_t i, uint64_t j) {
  uint64_t k = i * w->shape[1] + j;
  if (w->encoding == ST_FP8_BLOCKS) return w->values->data[k];
  uint8_t byte = w->values->data[k / 2]; /* the row length is even */
  return k & 1 ? byte >> 4 : byte & 15u;
}

/* v (a decoded code: zero, NaN, or a normal of at most 4 significant
 * bits) times 2^x as f32 bits, when plan dtype `to` holds it exactly:
 * 0, or -1 when it overflows or has bits below to's smallest subnormal. */
static inline int scale_bits(uint32_t v, int x, uint32_t to, uint32_t *out) {
  int e = (int)(v >> 23 & 0xff), ne = e + x;
  if (e == 0 || e == 0xff) {
    *out = v;
    return 0;
  }
  if (ne >= 1 && ne <= 254) {
    *out = (v & 0x807fffff) | (uint32_t)ne << 23; /* bf16: the low 16 bits are 0 */
    return 0;
  }
  uint32_t sig = 0x800000 | (v & 0x7fffff), shift = (uint32_t)(1 - ne);
  if (ne > 254 || shift > 24 || (sig & ((1u << shift) - 1))) return -1;
  uint32_t bits = (v & 0x80000000) | sig >> shift; /* an f32 subnormal */
  if (to == PLAN_BF16 && (bits & 0xffff)) return -1;
  *out = bits;
  return 0;
}

static rt_status inexact_error(const scale_run *r, uint64_t j, uint32_t v, uint32_t to) {
  return rt_status_make("element [%" PRIu64 ", %" PRIu64 "] is %.10g * 2^%d (scale %d), which %s "
                        "does not hold exactly",
                        r->i, j, (double)f32_of_bits(v), r->x, r->x + 127, plan_dtype_name(to));
}

rt_status st_weight_convert(const st_weight *w, uint64_t first, uint64_t count, uint32_t to, void *dst) {
  if (w->encoding == ST_PLAIN) return st_convert(w->values, first, count, to, dst);
  RT_TRY(st_weight_convertible(w, to));
  uint32_t lut[256];
  code_table(w, lut);
  for (uint64_t k = 0; k < count;) {
    scale_run r;
    RT_TRY(next_scale_run(w, first + k, count - k, &r));
    for (uint64_t m = 0; m < r.n; m++) {
      uint32_t v = lut[code_at(w, r.i, r.j + m)], bits;
      if (scale_bits(v, r.x, to, &bits)) return inexact_error(&r, r.j + m, v, to);
      if (to == PLAN_F32) ((uint32_t *)dst)[k + m] = bits;
      else ((uint16_t *)dst)[k + m] = (uint16_t)(bits >> 16);
    }
    k += r.n;
  }
  return NULL;
}

rt_status st_weight_values(const st_weight *w, uint64_t first, uint64_t count, double *out) {
  if (w->encoding == ST_PLAIN) return st_values(w->values, first, count, out);
  uint32_t lut[256];
  code_table(w, lut);
  for (uint64_t k = 0; k < count;) {
    scale_run r;
    RT_TRY(next_scale_run(w, first + k, count - k, &r));
    for (uint64_t m = 0; m < r.n; m++)
      out[k + m] = ldexp(f32_of_bits(lut[code_at(w, r.i, r.j + m)]), r.x);
    k += r.n;
  }
  return NULL;
}

/* ---- quantized weights bound as shipped --------------------------------- */

/* What a checkpoint tensor holds, for a message: its dtype and shape, FP4
 * packing named when its companion scales make it so. */
static void holds_text(const st_tensor *t, const st_tensor *sc, char *out, size_t n) {
  char shape[200];
  shape_text(t->shape, t->ndim, shape, sizeof shape);
  int packed = sc && (t->dtype == ST_I8 || t->dtype == ST_U8);
  snprintf(out, n, "%s%s %s", packed ? "FP4 packed in " : "", st_dtype_name(t->dtype), shape);
}

rt_status st_weight_quantized(const st_set *s, const st_tensor *t, uint32_t to, uint64_t rows, uint64_t cols,
                              st_weight *out) {
  *out = (st_weight){.values = t, .encoding = ST_PLAIN, .ndim = t->ndim, .nelem = t->nelem};
  memcpy(out->shape, t->shape, sizeof out->shape);
  int fp8 = to == PLAN_F8E4M3;
  if (!fp8 && to != PLAN_MXFP4)
    return rt_status_make("the plan's %s is not a quantized dtype", plan_dtype_name(to));
  char *sname = scale_name(t->name);
  if (!sname) return rt_status_make("out of memory");
  const st_tensor *sc = st_find(s, sname);
  const uint64_t vals[2] = {rows, fp8 ? cols : cols / 2};
  const uint64_t scales[2] = {fp8 ? ceil_div(rows, ST_FP8_BLOCK) : rows,
                              ceil_div(cols, fp8 ? ST_FP8_BLOCK : ST_FP4_BLOCK)};
  char want[600], have[240];
  snprintf(want, sizeof want,
           "the plan's %s [%" PRIu64 ", %" PRIu64 "] binds %s [%" PRIu64 ", %" PRIu64 "] with block scales "
           "'%s' F8_E8M0 [%" PRIu64 ", %" PRIu64 "]",
           plan_dtype_name(to), rows, cols, fp8 ? "F8_E4M3" : "FP4 packed in I8 or U8", vals[0], vals[1], sname,
           scales[0], scales[1]);
  holds_text(t, sc, have, sizeof have);
  int codes = fp8 ? t->dtype == ST_F8_E4M3 : t->dtype == ST_I8 || t->dtype == ST_U8;
  int other_quant = t->dtype == ST_F8_E4M3 || (sc && (t->dtype == ST_I8 || t->dtype == ST_U8));
  rt_status err = NULL;
  if (!codes && other_quant)
    err = rt_status_make("%s is another quantization; %s", have, want);
  else if (!codes)
    err = rt_status_make("%s would need quantizing, which binding does not do; %s", have, want);
  else if (t->ndim != 2 || t->shape[0] != vals[0] || t->shape[1] != vals[1])
    err = rt_status_make("%s has another shape; %s", have, want);
  else if (!sc)
    err = rt_status_make("%s has no block scales ('%s' is not in the checkpoint); %s", have, sname, want);
  else if (sc->dtype != ST_F8_E8M0 || sc->ndim != 2 || sc->shape[0] != scales[0] || sc->shape[1] != scales[1]) {
    char sshape[200];
    shape_text(sc->shape, sc->ndim, sshape, sizeof sshape);
    err = rt_status_make("%s has block scales '%s' %s %s; %s", have, sname, st_dtype_name(sc->dtype), sshape, want);
  }
  free(sname);
  if (err) return err;
  RT_TRY(st_weight_of(s, t, out)); /* as checked above: quantized, of shape [rows, cols] */
  for (uint64_t k = 0; k < sc->nelem; k++)
    if (sc->data[k] == 255)
      return rt_status_make("block [%" PRIu64 ", %" PRIu64 "] of scales '%s' is 255, NaN in F8_E8M0",
                            k / sc->shape[1], k % sc->shape[1], sc->name);
  return NULL;
}
