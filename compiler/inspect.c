/* inspect.c - `ds4c inspect`: what a compiled bundle holds, for review.
 * Kernel resources are read from the code objects themselves, by a small
 * ELF64 reader that checks every offset and size against the file's length,
 * with the msgpack of the AMDGPU metadata note and the .nv.info attributes
 * of NVIDIA cubins; toolchains' own dumpers are not needed to review. */
#include "inspect.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bundle_report.h"
#include "occupancy.h"
#include "plan.h"
#include "sha256.h"
#include "trace.h"

/* ---- ELF64, little-endian ------------------------------------------------ */

enum {
  ELF_HEADER_BYTES = 64,
  ELF_PHDR_BYTES = 56,
  ELF_SHDR_BYTES = 64,
  ELF_SYM_BYTES = 24,
  ELF_EM_CUDA = 190,
  ELF_EM_AMDGPU = 224,
  ELF_SHT_NULL = 0,
  ELF_SHT_SYMTAB = 2,
  ELF_SHT_STRTAB = 3,
  ELF_SHT_NOTE = 7,
  ELF_SHT_NOBITS = 8,
  ELF_SHT_DYNSYM = 11,
  ELF_STT_FUNC = 2,
  ELF_SHN_UNDEF = 0,
  ELF_STO_CUDA_ENTRY = 0x10, /* st_other bit of a kernel entry in a cubin */
  ELF_NT_AMDGPU_METADATA = 32,
};

/* .nv.info entries: {u8 format, u8 attribute, u16 value-or-size, payload}. */
enum {
  EIFMT_NVAL = 0x01, /* no value */
  EIFMT_BVAL = 0x02, /* the u16 holds a byte value */
  EIFMT_HVAL = 0x03, /* the u16 holds the value */
  EIFMT_SVAL = 0x04, /* the u16 is the size of the payload that follows */
  EIATTR_FRAME_SIZE = 0x11, /* {u32 symbol, u32 bytes} */
  EIATTR_REGCOUNT = 0x2f,   /* {u32 symbol, u32 registers} */
};

static uint16_t le16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t le32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t le64(const uint8_t *p) { return le32(p) | (uint64_t)le32(p + 4) << 32; }

/* Whether [off, off + size) lies inside len bytes, computed without overflow. */
static bool in_range(uint64_t off, uint64_t size, uint64_t len) { return off <= len && size <= len - off; }

typedef struct elf_sec {
  const char *name; /* from the section name table, NUL-terminated inside it */
  uint32_t name_off, type, link;
  uint64_t size, addralign, entsize;
  const uint8_t *data; /* NULL for NOBITS and NULL sections */
} elf_sec;

typedef struct elf_file {
  const char *name; /* for messages */
  uint16_t machine;
  uint32_t shstrndx; /* the section name table */
  elf_sec *secs;
  uint32_t nsecs;
} elf_file;

static void elf_close(elf_file *e) {
  free(e->secs);
  e->secs = NULL;
}

static rt_status elf_read_headers(elf_file *e, const uint8_t *b, size_t len) {
  const char *n = e->name;
  if (len < ELF_HEADER_BYTES)
    return rt_status_make("%s: not an ELF file: %zu bytes, an ELF64 header needs %d", n, len, ELF_HEADER_BYTES);
  if (memcmp(b, "\x7f" "ELF", 4) != 0) return rt_status_make("%s: not an ELF file (bad magic)", n);
  if (b[4] != 2) return rt_status_make("%s: not a 64-bit ELF file (class %u)", n, b[4]);
  if (b[5] != 1) return rt_status_make("%s: not a little-endian ELF file (data encoding %u)", n, b[5]);
  e->machine = le16(b + 18);
  uint64_t phoff = le64(b + 32), shoff = le64(b + 40);
  uint16_t phentsize = le16(b + 54), phnum = le16(b + 56);
  uint16_t shentsize = le16(b + 58), shnum = le16(b + 60), shstrndx = le16(b + 62);
  /* The program headers are not read, but a file cut inside them is damaged. */
  if (phnum && phentsize != ELF_PHDR_BYTES)
    return rt_status_make("%s: program header entries are %u bytes, ELF64 has %d", n, phentsize, ELF_PHDR_BYTES);
  if (!in_range(phoff, (uint64_t)phnum * ELF_PHDR_BYTES, len))
    return rt_status_make("%s: program header table (%u entries at offset %" PRIu64
                          ") runs past the end of the file (%zu bytes)",
                          n, phnum, phoff, len);
  if (shnum == 0)
    return rt_status_make(shoff ? "%s: extended section numbering is not supported" : "%s: no section headers", n);
  if (shentsize != ELF_SHDR_BYTES)
    return rt_status_make("%s: section header entries are %u bytes, ELF64 has %d", n, shentsize, ELF_SHDR_BYTES);
  if (!in_range(shoff, (uint64_t)shnum * ELF_SHDR_BYTES, len))
    return rt_status_make("%s: section header table (%u entries at offset %" PRIu64
                          ") runs past the end of the file (%zu bytes)",
                          n, shnum, shoff, len);
  if (shstrndx >= shnum)
    return rt_status_make("%s: section name table index %u out of range (%u sections)", n, shstrndx, shnum);
  e->secs = calloc(shnum, sizeof *e->secs);
  if (!e->secs) return rt_status_make("%s: out of memory", n);
  e->nsecs = shnum;
  e->shstrndx = shstrndx;
  for (uint32_t i = 0; i < shnum; i++) {
    const uint8_t *h = b + shoff + (uint64_t)i * ELF_SHDR_BYTES;
    elf_sec *s = &e->secs[i];
    uint64_t offset = le64(h + 24);
    s->name_off = le32(h);
    s->type = le32(h + 4);
    s->size = le64(h + 32);
    s->link = le32(h + 40);
    s->addralign = le64(h + 48);
    s->entsize = le64(h + 56);
    if (s->type == ELF_SHT_NULL || s->type == ELF_SHT_NOBITS) continue;
    if (!in_range(offset, s->size, len))
      return rt_status_make("%s: section %u: %" PRIu64 " bytes at offset %" PRIu64
                            " run past the end of the file (%zu bytes)",
                            n, i, s->size, offset, len);
    s->data = b + offset;
  }
  return NULL;
}

/* The NUL-terminated string at off inside string section strtab. */
static rt_status elf_str(const elf_file *e, uint32_t strtab, uint32_t off, const char *what, const char **out) {
  if (strtab >= e->nsecs)
    return rt_status_make("%s: %s: string table index %u out of range (%u sections)", e->name, what, strtab, e->nsecs);
  const elf_sec *s = &e->secs[strtab];
  if (s->type != ELF_SHT_STRTAB || !s->data)
    return rt_status_make("%s: %s: section %u is not a string table", e->name, what, strtab);
  if (off >= s->size)
    return rt_status_make("%s: %s: name offset %u outside its string table (%" PRIu64 " bytes)", e->name, what, off,
                          s->size);
  if (!memchr(s->data + off, 0, s->size - off))
    return rt_status_make("%s: %s: name at offset %u is not NUL-terminated", e->name, what, off);
  *out = (const char *)s->data + off;
  return NULL;
}

static rt_status elf_open(const char *name, const uint8_t *b, size_t len, elf_file *out) {
  memset(out, 0, sizeof *out);
  out->name = name;
  rt_status st = elf_read_headers(out, b, len);
  for (uint32_t i = 0; !st && i < out->nsecs; i++) {
    char what[32];
    snprintf(what, sizeof what, "section %u", i);
    st = elf_str(out, out->shstrndx, out->secs[i].name_off, what, &out->secs[i].name);
  }
  if (st) elf_close(out);
  return st;
}

static const elf_sec *elf_find_type(const elf_file *e, uint32_t type) {
  for (uint32_t i = 0; i < e->nsecs; i++)
    if (e->secs[i].type == type) return &e->secs[i];
  return NULL;
}

/* The section named prefix + suffix (".nv.shared." + kernel), or NULL. */
static const elf_sec *elf_find_named(const elf_file *e, const char *prefix, const char *suffix) {
  size_t n = strlen(prefix);
  for (uint32_t i = 0; i < e->nsecs; i++)
    if (strncmp(e->secs[i].name, prefix, n) == 0 && strcmp(e->secs[i].name + n, suffix) == 0) return &e->secs[i];
  return NULL;
}

typedef struct elf_sym {
  const char *name;
  uint8_t type, other;
  uint16_t shndx;
  uint64_t size;
} elf_sym;

/* Checks a symbol table's shape and returns its entry count. */
static rt_status elf_symtab_count(const elf_file *e, const elf_sec *s, uint32_t *out_n) {
  if (!s->data) return rt_status_make("%s: %s: symbol table has no data", e->name, s->name);
  if (s->entsize != ELF_SYM_BYTES || s->size % ELF_SYM_BYTES)
    return rt_status_make("%s: %s: %" PRIu64 " bytes of %" PRIu64 "-byte entries, ELF64 symbols are %d bytes",
                          e->name, s->name, s->size, s->entsize, ELF_SYM_BYTES);
  if (s->size / ELF_SYM_BYTES > UINT32_MAX) return rt_status_make("%s: %s: too many symbols", e->name, s->name);
  *out_n = (uint32_t)(s->size / ELF_SYM_BYTES);
  return NULL;
}

static rt_status elf_sym_at(const elf_file *e, const elf_sec *s, uint32_t i, elf_sym *out) {
  const uint8_t *p = s->data + (uint64_t)i * ELF_SYM_BYTES;
  char what[96];
  snprintf(what, sizeof what, "%s: symbol %u", s->name, i);
  out->type = p[4] & 0xf;
  out->other = p[5];
  out->shndx = le16(p + 6);
  out->size = le64(p + 16);
  return elf_str(e, s->link, le32(p), what, &out->name);
}

/* ---- the kernel table ---------------------------------------------------- */

void insp_codeobj_free(insp_codeobj *c) {
  for (uint32_t i = 0; i < c->nkernels; i++) free(c->kernels[i].symbol);
  free(c->kernels);
  memset(c, 0, sizeof *c);
}

const insp_kernel *insp_find_kernel(const insp_codeobj *c, const char *symbol) {
  for (uint32_t i = 0; i < c->nkernels; i++)
    if (strcmp(c->kernels[i].symbol, symbol) == 0) return &c->kernels[i];
  return NULL;
}

static insp_kernel kernel_unknown(void) {
  return (insp_kernel){.sgpr = INSP_UNKNOWN, .vgpr = INSP_UNKNOWN, .agpr = INSP_UNKNOWN, .lds = INSP_UNKNOWN,
                       .scratch = INSP_UNKNOWN, .kernarg = INSP_UNKNOWN, .regs = INSP_UNKNOWN,
                       .shared = INSP_UNKNOWN, .local = INSP_UNKNOWN, .stack = INSP_UNKNOWN, .size = INSP_UNKNOWN,
                       .wave = INSP_UNKNOWN};
}

/* Appends a kernel named symbol[0..n) with every field unknown. */
static rt_status add_kernel(insp_codeobj *c, const char *name, const char *symbol, size_t n, insp_kernel **out) {
  insp_kernel *k = realloc(c->kernels, (c->nkernels + 1) * sizeof *k);
  if (!k) return rt_status_make("%s: out of memory", name);
  c->kernels = k;
  k += c->nkernels;
  *k = kernel_unknown();
  k->symbol = strndup(symbol, n);
  if (!k->symbol) return rt_status_make("%s: out of memory", name);
  c->nkernels++;
  *out = k;
  return NULL;
}

/* ---- host: the dynamic symbol table --------------------------------------- */

static rt_status read_host(const elf_file *e, insp_codeobj *c) {
  const elf_sec *s = elf_find_type(e, ELF_SHT_DYNSYM);
  if (!s) return rt_status_make("%s: no dynamic symbol table (.dynsym): not a shared object", e->name);
  uint32_t n = 0;
  RT_TRY(elf_symtab_count(e, s, &n));
  for (uint32_t i = 1; i < n; i++) {
    elf_sym sym = {0};
    RT_TRY(elf_sym_at(e, s, i, &sym));
    if (sym.type != ELF_STT_FUNC || sym.shndx == ELF_SHN_UNDEF) continue;
    if (sym.size > INT64_MAX)
      return rt_status_make("%s: %s: symbol %s has size %" PRIu64, e->name, s->name, sym.name, sym.size);
    insp_kernel *k = NULL;
    RT_TRY(add_kernel(c, e->name, sym.name, strlen(sym.name), &k));
    k->size = (int64_t)sym.size;
  }
  return NULL;
}

/* ---- NVIDIA: .symtab entries, .nv.info attributes, per-kernel sections --- */

/* Applies one {u32 symbol, u32 value} attribute to the kernel at that
 * symbol index, if any. */
static void cuda_set(insp_codeobj *c, const uint32_t *symidx, uint32_t sym, uint8_t attr, uint32_t value) {
  for (uint32_t i = 0; i < c->nkernels; i++) {
    if (symidx[i] != sym) continue;
    if (attr == EIATTR_REGCOUNT) c->kernels[i].regs = value;
    else c->kernels[i].stack = value;
  }
}

static rt_status scan_nv_info(const elf_file *e, const elf_sec *s, uint32_t nsyms, const uint32_t *symidx,
                              insp_codeobj *c) {
  if (!s->data) return rt_status_make("%s: %s: section has no data", e->name, s->name);
  uint64_t pos = 0;
  while (pos < s->size) {
    uint64_t at = pos;
    if (s->size - pos < 4)
      return rt_status_make("%s: %s: entry at byte %" PRIu64 " is cut short (%" PRIu64 " of 4 header bytes)",
                            e->name, s->name, at, s->size - pos);
    uint8_t format = s->data[pos], attr = s->data[pos + 1];
    uint16_t value = le16(s->data + pos + 2);
    pos += 4;
    if (format != EIFMT_NVAL && format != EIFMT_BVAL && format != EIFMT_HVAL && format != EIFMT_SVAL)
      return rt_status_make("%s: %s: entry at byte %" PRIu64 " has unknown format 0x%02x", e->name, s->name, at,
                            format);
    if (format != EIFMT_SVAL) continue;
    if (value > s->size - pos)
      return rt_status_make("%s: %s: entry at byte %" PRIu64 " (attribute 0x%02x) has %u payload bytes, %" PRIu64
                            " remain",
                            e->name, s->name, at, attr, value, s->size - pos);
    const uint8_t *payload = s->data + pos;
    pos += value;
    if (attr != EIATTR_REGCOUNT && attr != EIATTR_FRAME_SIZE) continue;
    if (value != 8)
      return rt_status_make("%s: %s: entry at byte %" PRIu64 " (attribute 0x%02x) has %u payload bytes, expected 8",
                            e->name, s->name, at, attr, value);
    uint32_t sym = le32(payload);
    if (sym >= nsyms)
      return rt_status_make("%s: %s: entry at byte %" PRIu64 " (attribute 0x%02x) names symbol %u, .symtab has %u",
                            e->name, s->name, at, attr, sym, nsyms);
    cuda_set(c, symidx, sym, attr, le32(payload + 4));
  }
  return NULL;
}

/* The size of section prefix + kernel (NOBITS: not bounded by the file), 0
 * when there is none. */
static rt_status section_bytes(const elf_file *e, const char *prefix, const char *kernel, int64_t *out) {
  const elf_sec *s = elf_find_named(e, prefix, kernel);
  if (s && s->size > INT64_MAX)
    return rt_status_make("%s: %s: size %" PRIu64 " out of range", e->name, s->name, s->size);
  *out = s ? (int64_t)s->size : 0;
  return NULL;
}

static rt_status cuda_kernels(const elf_file *e, const elf_sec *symtab, uint32_t nsyms, insp_codeobj *c,
                              uint32_t **out_symidx) {
  for (uint32_t i = 1; i < nsyms; i++) {
    elf_sym sym = {0};
    RT_TRY(elf_sym_at(e, symtab, i, &sym));
    if (sym.type != ELF_STT_FUNC || !(sym.other & ELF_STO_CUDA_ENTRY) || sym.shndx == ELF_SHN_UNDEF) continue;
    uint32_t *idx = realloc(*out_symidx, (c->nkernels + 1) * sizeof *idx);
    if (!idx) return rt_status_make("%s: out of memory", e->name);
    *out_symidx = idx;
    idx[c->nkernels] = i;
    insp_kernel *k = NULL;
    RT_TRY(add_kernel(c, e->name, sym.name, strlen(sym.name), &k));
    RT_TRY(section_bytes(e, ".nv.shared.", sym.name, &k->shared));
    RT_TRY(section_bytes(e, ".nv.local.", sym.name, &k->local));
  }
  return NULL;
}

static rt_status read_cuda(const elf_file *e, insp_codeobj *c) {
  const elf_sec *symtab = elf_find_type(e, ELF_SHT_SYMTAB);
  if (!symtab) return rt_status_make("%s: no symbol table (.symtab)", e->name);
  uint32_t nsyms = 0;
  RT_TRY(elf_symtab_count(e, symtab, &nsyms));
  uint32_t *symidx = NULL;
  rt_status st = cuda_kernels(e, symtab, nsyms, c, &symidx);
  for (uint32_t i = 0; !st && i < e->nsecs; i++) {
    const char *n = e->secs[i].name;
    if (strcmp(n, ".nv.info") == 0 || strncmp(n, ".nv.info.", 9) == 0)
      st = scan_nv_info(e, &e->secs[i], nsyms, symidx, c);
  }
  /* ptxas records a frame only for kernels that have one. */
  for (uint32_t i = 0; !st && i < c->nkernels; i++)
    if (c->kernels[i].stack == INSP_UNKNOWN) c->kernels[i].stack = 0;
  free(symidx);
  return st;
}

/* ---- msgpack, the subset the AMDGPU metadata uses ------------------------- */

/* Nesting deeper than this is not metadata; refusing it bounds recursion. */
#define MP_MAX_DEPTH 32

typedef struct mp_reader {
  const char *name; /* for messages */
  const uint8_t *b;
  size_t len, pos;
} mp_reader;

static rt_status mp_short(const mp_reader *r, uint64_t need) {
  return rt_status_make("%s: AMDGPU metadata: value at byte %zu needs %" PRIu64 " bytes, %zu remain", r->name, r->pos,
                        need, r->len - r->pos);
}

static rt_status mp_need(const mp_reader *r, uint64_t n) { return n <= r->len - r->pos ? NULL : mp_short(r, n); }

/* Big-endian unsigned of n bytes at the cursor, which must be in range. */
static uint64_t mp_be(const mp_reader *r, size_t at, unsigned n) {
  uint64_t v = 0;
  for (unsigned i = 0; i < n; i++) v = v << 8 | r->b[at + i];
  return v;
}

/* Reads a type byte and the length that follows it (of a string, binary,
 * array, map or extension); *out_kind is 's', 'b', 'a', 'm', 'e' or 0 for a
 * scalar, whose bytes after the type byte are *out_len. */
static rt_status mp_header(mp_reader *r, char *out_kind, uint64_t *out_len) {
  RT_TRY(mp_need(r, 1));
  uint8_t t = r->b[r->pos];
  size_t at = r->pos + 1;
  unsigned lenbytes = 0;
  char kind = 0;
  uint64_t len = 0;
  if (t <= 0x7f || t >= 0xe0 || t == 0xc0 || t == 0xc2 || t == 0xc3) len = 0; /* fixint, nil, bool */
  else if (t >= 0x80 && t <= 0x8f) kind = 'm', len = t & 0xf;
  else if (t >= 0x90 && t <= 0x9f) kind = 'a', len = t & 0xf;
  else if (t >= 0xa0 && t <= 0xbf) kind = 's', len = t & 0x1f;
  else if (t >= 0xc4 && t <= 0xc6) kind = 'b', lenbytes = 1u << (t - 0xc4);
  else if (t >= 0xc7 && t <= 0xc9) kind = 'e', lenbytes = 1u << (t - 0xc7);
  else if (t == 0xca) len = 4;                                        /* float32 */
  else if (t == 0xcb) len = 8;                                        /* float64 */
  else if (t >= 0xcc && t <= 0xd3) len = 1u << ((t - 0xcc) & 3);     /* uint, int 8..64 */
  else if (t >= 0xd4 && t <= 0xd8) kind = 'e', len = 1u << (t - 0xd4); /* fixext */
  else if (t >= 0xd9 && t <= 0xdb) kind = 's', lenbytes = 1u << (t - 0xd9);
  else if (t == 0xdc || t == 0xdd) kind = 'a', lenbytes = t == 0xdc ? 2 : 4;
  else if (t == 0xde || t == 0xdf) kind = 'm', lenbytes = t == 0xde ? 2 : 4;
  else return rt_status_make("%s: AMDGPU metadata: byte %zu: type 0x%02x is not msgpack", r->name, r->pos, t);
  if (lenbytes) {
    RT_TRY(mp_need(r, 1 + (uint64_t)lenbytes));
    len = mp_be(r, at, lenbytes);
    at += lenbytes;
  }
  if (kind == 'e') len += 1; /* the extension's type byte */
  r->pos = at;
  *out_kind = kind;
  *out_len = len;
  return NULL;
}

static rt_status mp_skip(mp_reader *r, int depth) {
  if (depth > MP_MAX_DEPTH)
    return rt_status_make("%s: AMDGPU metadata: nested deeper than %d at byte %zu", r->name, MP_MAX_DEPTH, r->pos);
  size_t at = r->pos;
  char kind = 0;
  uint64_t n = 0;
  RT_TRY(mp_header(r, &kind, &n));
  if (kind == 'a' || kind == 'm') {
    uint64_t items = kind == 'm' ? 2 * n : n;
    for (uint64_t i = 0; i < items; i++) RT_TRY(mp_skip(r, depth + 1));
    return NULL;
  }
  if (n > r->len - r->pos) {
    r->pos = at;
    return mp_short(r, n + 1);
  }
  r->pos += n;
  return NULL;
}

static rt_status mp_expect(mp_reader *r, char want, const char *what, uint64_t *out_n) {
  size_t at = r->pos;
  char kind = 0;
  RT_TRY(mp_header(r, &kind, out_n));
  if (kind != want)
    return rt_status_make("%s: AMDGPU metadata: byte %zu: %s is not a %s", r->name, at, what,
                          want == 'm' ? "map" : want == 'a' ? "array" : "string");
  if (want == 's' && *out_n > r->len - r->pos) {
    r->pos = at;
    return mp_short(r, *out_n + 1);
  }
  return NULL;
}

/* A string at the cursor: its bytes stay in the buffer (not NUL-terminated). */
static rt_status mp_str(mp_reader *r, const char *what, const char **out_s, size_t *out_n) {
  uint64_t n = 0;
  RT_TRY(mp_expect(r, 's', what, &n));
  *out_s = (const char *)r->b + r->pos;
  *out_n = (size_t)n;
  r->pos += n;
  return NULL;
}

/* A non-negative integer at the cursor that fits in int64_t. */
static rt_status mp_count(mp_reader *r, const char *what, int64_t *out) {
  size_t at = r->pos;
  RT_TRY(mp_need(r, 1));
  uint8_t t = r->b[at];
  uint64_t v;
  bool is_signed = t >= 0xd0 && t <= 0xd3;
  if (t <= 0x7f) {
    v = t;
    r->pos++;
  } else if ((t >= 0xcc && t <= 0xcf) || is_signed) {
    unsigned n = 1u << ((t - 0xcc) & 3);
    RT_TRY(mp_need(r, 1 + (uint64_t)n));
    v = mp_be(r, at + 1, n);
    if (is_signed && n < 8 && (v >> (8 * n - 1))) v |= ~(uint64_t)0 << (8 * n); /* sign-extend */
    r->pos += 1 + n;
  } else {
    return rt_status_make("%s: AMDGPU metadata: byte %zu: %s is not an integer", r->name, at, what);
  }
  if (v > INT64_MAX) return rt_status_make("%s: AMDGPU metadata: byte %zu: %s is out of range", r->name, at, what);
  *out = (int64_t)v;
  return NULL;
}

static bool key_is(const char *s, size_t n, const char *key) { return strlen(key) == n && memcmp(s, key, n) == 0; }

/* One map of amdhsa.kernels: its .name and the resource fields. */
static rt_status amd_kernel(mp_reader *r, insp_codeobj *c) {
  size_t at = r->pos;
  uint64_t n = 0;
  RT_TRY(mp_expect(r, 'm', "an amdhsa.kernels entry", &n));
  insp_kernel k = kernel_unknown();
  const char *name = NULL;
  size_t name_len = 0;
  for (uint64_t i = 0; i < n; i++) {
    const char *key = NULL;
    size_t klen = 0;
    RT_TRY(mp_str(r, "a kernel field name", &key, &klen));
    int64_t *field = key_is(key, klen, ".sgpr_count")                  ? &k.sgpr
                     : key_is(key, klen, ".vgpr_count")                ? &k.vgpr
                     : key_is(key, klen, ".agpr_count")                ? &k.agpr
                     : key_is(key, klen, ".group_segment_fixed_size")  ? &k.lds
                     : key_is(key, klen, ".private_segment_fixed_size") ? &k.scratch
                     : key_is(key, klen, ".kernarg_segment_size")      ? &k.kernarg
                     : key_is(key, klen, ".wavefront_size")            ? &k.wave
                                                                         : NULL;
    if (field) RT_TRY(mp_count(r, "a kernel resource count", field));
    else if (key_is(key, klen, ".name")) RT_TRY(mp_str(r, ".name", &name, &name_len));
    else RT_TRY(mp_skip(r, 2));
  }
  if (!name) return rt_status_make("%s: AMDGPU metadata: kernel entry at byte %zu has no .name", r->name, at);
  insp_kernel *out = NULL;
  RT_TRY(add_kernel(c, r->name, name, name_len, &out));
  char *symbol = out->symbol;
  *out = k;
  out->symbol = symbol;
  return NULL;
}

static rt_status read_amd_metadata(const char *name, const uint8_t *b, size_t len, insp_codeobj *c) {
  mp_reader r = {.name = name, .b = b, .len = len};
  uint64_t n = 0;
  RT_TRY(mp_expect(&r, 'm', "the metadata", &n));
  bool found = false;
  for (uint64_t i = 0; i < n; i++) {
    const char *key = NULL;
    size_t klen = 0;
    RT_TRY(mp_str(&r, "a metadata key", &key, &klen));
    if (!key_is(key, klen, "amdhsa.kernels")) {
      RT_TRY(mp_skip(&r, 1));
      continue;
    }
    uint64_t nk = 0;
    RT_TRY(mp_expect(&r, 'a', "amdhsa.kernels", &nk));
    for (uint64_t j = 0; j < nk; j++) RT_TRY(amd_kernel(&r, c));
    found = true;
  }
  if (!found) return rt_status_make("%s: AMDGPU metadata has no amdhsa.kernels", name);
  return NULL;
}

/* Finds the NT_AMDGPU_METADATA note (owner "AMDGPU") in the note sections. */
static rt_status read_amd(const elf_file *e, insp_codeobj *c) {
  for (uint32_t i = 0; i < e->nsecs; i++) {
    const elf_sec *s = &e->secs[i];
    if (s->type != ELF_SHT_NOTE || !s->data) continue;
    uint64_t align = s->addralign == 8 ? 8 : 4, pos = 0;
    while (pos < s->size) {
      if (s->size - pos < 12)
        return rt_status_make("%s: %s: note at byte %" PRIu64 " is cut short", e->name, s->name, pos);
      uint64_t namesz = le32(s->data + pos), descsz = le32(s->data + pos + 4);
      uint32_t type = le32(s->data + pos + 8);
      uint64_t name_at = pos + 12;
      uint64_t desc_at = name_at + ((namesz + align - 1) & ~(align - 1));
      uint64_t next = desc_at + ((descsz + align - 1) & ~(align - 1));
      if (!in_range(desc_at, descsz, s->size))
        return rt_status_make("%s: %s: note at byte %" PRIu64 " (%" PRIu64 " name and %" PRIu64
                              " description bytes) runs past the section end (%" PRIu64 " bytes)",
                              e->name, s->name, pos, namesz, descsz, s->size);
      if (type == ELF_NT_AMDGPU_METADATA && namesz == 7 && memcmp(s->data + name_at, "AMDGPU", 7) == 0)
        return read_amd_metadata(e->name, s->data + desc_at, descsz, c);
      pos = next;
    }
  }
  return rt_status_make("%s: no AMDGPU metadata note (NT_AMDGPU_METADATA)", e->name);
}

rt_status insp_read_codeobj(const char *name, const uint8_t *bytes, size_t len, insp_codeobj *out) {
  memset(out, 0, sizeof *out);
  elf_file e;
  RT_TRY(elf_open(name, bytes, len, &e));
  out->kind = e.machine == ELF_EM_AMDGPU ? INSP_AMDGPU : e.machine == ELF_EM_CUDA ? INSP_CUDA : INSP_HOST;
  rt_status st = out->kind == INSP_AMDGPU ? read_amd(&e, out) : out->kind == INSP_CUDA ? read_cuda(&e, out)
                                                                                         : read_host(&e, out);
  elf_close(&e);
  if (st) insp_codeobj_free(out);
  return st;
}

/* ---- the bundle ---------------------------------------------------------- */

static rt_status read_file(const char *path, uint8_t **out, size_t *out_len) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) return rt_status_make("%s: cannot open: %s", path, strerror(errno));
  struct stat sb;
  rt_status st = NULL;
  if (fstat(fd, &sb) != 0) st = rt_status_make("%s: %s", path, strerror(errno));
  else if (!S_ISREG(sb.st_mode)) st = rt_status_make("%s: not a regular file", path);
  size_t len = st ? 0 : (size_t)sb.st_size, got = 0;
  uint8_t *buf = st ? NULL : malloc(len ? len : 1);
  if (!st && !buf) st = rt_status_make("%s: out of memory reading %zu bytes", path, len);
  while (!st && got < len) {
    ssize_t r = read(fd, buf + got, len - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) st = rt_status_make("%s: read failed: %s", path, strerror(errno));
    else if (r == 0) break; /* shrank while reading: the sha256 check reports it */
    else got += (size_t)r;
  }
  close(fd);
  if (st) {
    free(buf);
    return st;
  }
  *out = buf;
  *out_len = got;
  return NULL;
}

/* Like ds4run, never read outside the bundle: no absolute path, no "..". */
static bool path_leaves_bundle(const char *rel) {
  if (rel[0] == '/' || rel[0] == 0) return true;
  for (const char *s = rel;;) {
    const char *e = strchr(s, '/');
    size_t n = e ? (size_t)(e - s) : strlen(s);
    if (n == 2 && s[0] == '.' && s[1] == '.') return true;
    if (!e) return false;
    s = e + 1;
  }
}

static const char *kind_name(insp_kind k) {
  return k == INSP_AMDGPU ? "an AMDGPU code object" : k == INSP_CUDA ? "an NVIDIA cubin" : "a host shared object";
}

/* The kind of code object a target names; false for a name of no known family. */
static bool target_kind(const char *target, insp_kind *out) {
  if (strcmp(target, "host") == 0) *out = INSP_HOST;
  else if (strncmp(target, "gfx", 3) == 0) *out = INSP_AMDGPU;
  else if (strncmp(target, "sm_", 3) == 0) *out = INSP_CUDA;
  else return false;
  return true;
}

typedef struct bundle_view {
  const char *dir;
  plan p;
  insp_codeobj *objs; /* [p.ncodeobjs] */
  uint64_t *bytes;    /* [p.ncodeobjs] file sizes */
} bundle_view;

static void bundle_view_free(bundle_view *b) {
  for (uint32_t i = 0; b->objs && i < b->p.ncodeobjs; i++) insp_codeobj_free(&b->objs[i]);
  free(b->objs);
  free(b->bytes);
  plan_free(&b->p);
}

/* Reads code object i, checks its sha256 against the plan, its kind against
 * its target, and that it holds every kernel of the plan. */
static rt_status load_codeobj(bundle_view *b, uint32_t i, const char *path) {
  const plan *p = &b->p;
  const plan_codeobj *co = &p->codeobjs[i];
  uint8_t *buf = NULL;
  size_t len = 0;
  RT_TRY(read_file(path, &buf, &len));
  b->bytes[i] = len;
  uint8_t got[32];
  rt_sha256(buf, len, got);
  if (memcmp(got, co->sha256, 32) != 0) {
    char want_hex[65], got_hex[65];
    rt_hex(co->sha256, 32, want_hex);
    rt_hex(got, 32, got_hex);
    free(buf);
    return rt_status_make("%s: sha256 mismatch (plan expects %s, file has %s)", path, want_hex, got_hex);
  }
  rt_status st = insp_read_codeobj(path, buf, len, &b->objs[i]);
  free(buf);
  RT_TRY(st);
  const char *target = plan_str(p, co->target);
  insp_kind want;
  if (target_kind(target, &want) && want != b->objs[i].kind)
    return rt_status_make("%s: target %s needs %s, the file is %s", path, target, kind_name(want),
                          kind_name(b->objs[i].kind));
  for (uint32_t k = 0; k < p->nkernels; k++)
    if (!insp_find_kernel(&b->objs[i], plan_str(p, p->kernels[k].symbol)))
      return rt_status_make("%s: no kernel %s (the plan's kernel %u)", path, plan_str(p, p->kernels[k].symbol), k);
  return NULL;
}

static rt_status bundle_view_load(const char *dir, bundle_view *b) {
  memset(b, 0, sizeof *b);
  b->dir = dir;
  char *path;
  if (asprintf(&path, "%s/plan.ds4p", dir) < 0) return rt_status_make("out of memory");
  rt_status st = plan_read(path, &b->p);
  const plan *p = &b->p;
  if (!st) {
    b->objs = calloc(p->ncodeobjs ? p->ncodeobjs : 1, sizeof *b->objs);
    b->bytes = calloc(p->ncodeobjs ? p->ncodeobjs : 1, sizeof *b->bytes);
    if (!b->objs || !b->bytes) st = rt_status_make("out of memory");
  }
  for (uint32_t i = 0; !st && i < p->ncodeobjs; i++) {
    const char *rel = plan_str(p, p->codeobjs[i].path);
    char *co_path;
    if (path_leaves_bundle(rel)) st = rt_status_make("%s: code object path '%s' leaves the bundle", path, rel);
    else if (asprintf(&co_path, "%s/%s", dir, rel) < 0) st = rt_status_make("out of memory");
    else {
      st = load_codeobj(b, i, co_path);
      free(co_path);
    }
  }
  free(path);
  if (st) bundle_view_free(b);
  return st;
}

/* ---- text: one aligned table per section ---------------------------------- */

typedef struct table {
  const char *const *heads;
  const char *align; /* 'l' or 'r' per column */
  uint32_t ncols;
  char **cells; /* row-major */
  size_t ncells;
  bool oom;
} table;

static void cell(table *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void cell(table *t, const char *fmt, ...) {
  if (t->oom) return;
  char **c = realloc(t->cells, (t->ncells + 1) * sizeof *c);
  if (!c) {
    t->oom = true;
    return;
  }
  t->cells = c;
  va_list ap;
  va_start(ap, fmt);
  int n = vasprintf(&c[t->ncells], fmt, ap);
  va_end(ap);
  if (n < 0) t->oom = true;
  else t->ncells++;
}

static void cell_num(table *t, int64_t v) {
  if (v == INSP_UNKNOWN) cell(t, "-");
  else cell(t, "%" PRId64, v);
}

/* Prints the title, the heads and the rows, each column as wide as its
 * widest cell, then frees the cells. */
static rt_status table_print(table *t, const char *title, FILE *out) {
  rt_status st = t->oom ? rt_status_make("out of memory") : NULL;
  if (!st) {
    size_t width[16] = {0};
    for (uint32_t c = 0; c < t->ncols; c++) width[c] = strlen(t->heads[c]);
    for (size_t i = 0; i < t->ncells; i++) {
      size_t n = strlen(t->cells[i]);
      if (n > width[i % t->ncols]) width[i % t->ncols] = n;
    }
    fprintf(out, "%s\n", title);
    for (size_t i = 0; i < t->ncells + t->ncols; i++) {
      uint32_t c = (uint32_t)(i % t->ncols);
      const char *s = i < t->ncols ? t->heads[i] : t->cells[i - t->ncols];
      bool last = c + 1 == t->ncols;
      if (t->align[c] == 'r') fprintf(out, "  %*s", (int)width[c], s);
      else if (last) fprintf(out, "  %s", s);
      else fprintf(out, "  %-*s", (int)width[c], s);
      if (last) fputc('\n', out);
    }
    fputc('\n', out);
  }
  for (size_t i = 0; i < t->ncells; i++) free(t->cells[i]);
  free(t->cells);
  return st;
}

static const char *backend_name(uint32_t b) {
  return b == PLAN_BACKEND_CPU ? "cpu" : b == PLAN_BACKEND_HIP ? "hip" : "cuda";
}

typedef struct plan_counts {
  uint32_t launches, copies, records, waits;
} plan_counts;

static plan_counts count_commands(const plan *p) {
  plan_counts n = {0};
  for (uint32_t i = 0; i < p->ncommands; i++) {
    uint32_t k = p->commands[i].kind;
    if (k == PLAN_CMD_LAUNCH) n.launches++;
    else if (k == PLAN_CMD_COPY) n.copies++;
    else if (k == PLAN_CMD_RECORD) n.records++;
    else n.waits++;
  }
  return n;
}

static rt_status text_codeobjs(const bundle_view *b, FILE *out) {
  const plan *p = &b->p;
  static const char *const heads[] = {"target", "path", "bytes", "sha256"};
  table t = {heads, "llrl", 4, NULL, 0, false};
  for (uint32_t i = 0; i < p->ncodeobjs; i++) {
    char hex[65];
    rt_hex(p->codeobjs[i].sha256, 32, hex);
    cell(&t, "%s", plan_str(p, p->codeobjs[i].target));
    cell(&t, "%s", plan_str(p, p->codeobjs[i].path));
    cell(&t, "%" PRIu64, b->bytes[i]);
    cell(&t, "%.12s", hex);
  }
  return table_print(&t, "code objects", out);
}

/* The ops kernel k serves, in plan order (a kernel is shared by every op
 * of the same kind and shapes). */
static uint32_t kernel_ops(const plan *p, uint32_t k, uint32_t *out) {
  uint32_t n = 0;
  for (uint32_t i = 0; i < p->nops; i++)
    if (p->ops[i].kernel == k) out[n++] = i;
  return n;
}

static rt_status text_plan_kernels(const plan *p, FILE *out) {
  static const char *const heads[] = {"symbol", "kind", "grid", "block", "shared", "nbufs", "ops"};
  table t = {heads, "llrrrrr", 7, NULL, 0, false};
  uint32_t *ops = malloc((p->nops ? p->nops : 1) * sizeof *ops);
  if (!ops) return rt_status_make("out of memory");
  for (uint32_t i = 0; i < p->nkernels; i++) {
    const plan_kernel *k = &p->kernels[i];
    cell(&t, "%s", plan_str(p, k->symbol));
    cell(&t, "%s", plan_str(p, k->kind));
    cell(&t, "%u", k->grid);
    cell(&t, "%u", k->block);
    cell(&t, "%u", k->shared);
    cell(&t, "%u", k->nbufs);
    cell(&t, "%u", kernel_ops(p, i, ops));
  }
  rt_status st = table_print(&t, "kernels", out);
  /* Then each kernel's op paths, one a line, for a reviewer who asks
   * which ops a kernel's resources and occupancy stand for. */
  if (!st) fputs("ops by kernel\n", out);
  for (uint32_t i = 0; !st && i < p->nkernels; i++) {
    uint32_t n = kernel_ops(p, i, ops);
    fprintf(out, "  %s\n", plan_str(p, p->kernels[i].symbol));
    for (uint32_t j = 0; j < n; j++) fprintf(out, "    %s\n", plan_str(p, p->ops[ops[j]].path));
  }
  if (!st) fputc('\n', out);
  free(ops);
  return st;
}

/* "8/8" and its limit, or "-" twice when the target has no rule. */
static void cell_occupancy(table *t, const char *target, const insp_kernel *k, uint32_t block) {
  occ_result r;
  if (occ_compute(target, k, block, &r)) {
    cell(t, "-");
    cell(t, "-");
    return;
  }
  cell(t, "%" PRId64 "/%" PRId64, r.value, r.max);
  cell(t, "%s", r.limit);
}

/* The plan's kernels as code object i holds them, in the plan's order. */
static rt_status text_codeobj_kernels(const bundle_view *b, uint32_t i, FILE *out) {
  const plan *p = &b->p;
  const insp_codeobj *c = &b->objs[i];
  static const char *const host_heads[] = {"symbol", "code bytes"};
  static const char *const amd_heads[] = {"symbol", "sgpr",    "vgpr",       "agpr", "lds",
                                          "scratch", "kernarg", "waves/SIMD", "limit"};
  static const char *const cuda_heads[] = {"symbol", "regs", "shared", "local", "stack", "warps/SM", "limit"};
  table t = c->kind == INSP_AMDGPU ? (table){amd_heads, "lrrrrrrrl", 9, NULL, 0, false}
            : c->kind == INSP_CUDA ? (table){cuda_heads, "lrrrrrl", 7, NULL, 0, false}
                                   : (table){host_heads, "lr", 2, NULL, 0, false};
  const char *target = plan_str(p, p->codeobjs[i].target);
  for (uint32_t j = 0; j < p->nkernels; j++) {
    const insp_kernel *k = insp_find_kernel(c, plan_str(p, p->kernels[j].symbol));
    cell(&t, "%s", k->symbol);
    if (c->kind == INSP_AMDGPU) {
      int64_t v[] = {k->sgpr, k->vgpr, k->agpr, k->lds, k->scratch, k->kernarg};
      for (size_t f = 0; f < 6; f++) cell_num(&t, v[f]);
      cell_occupancy(&t, target, k, p->kernels[j].block);
    } else if (c->kind == INSP_CUDA) {
      int64_t v[] = {k->regs, k->shared, k->local, k->stack};
      for (size_t f = 0; f < 4; f++) cell_num(&t, v[f]);
      cell_occupancy(&t, target, k, p->kernels[j].block);
    } else {
      cell_num(&t, k->size);
    }
  }
  char *title;
  const plan_codeobj *co = &p->codeobjs[i];
  if (asprintf(&title, "kernels on %s (%s)", plan_str(p, co->target), plan_str(p, co->path)) < 0) {
    t.oom = true;
    title = NULL;
  }
  rt_status st = table_print(&t, title ? title : "", out);
  free(title);
  return st;
}

static rt_status text_devices(const plan *p, FILE *out) {
  static const char *const heads[] = {"name", "backend", "arch", "arena bytes"};
  table t = {heads, "lllr", 4, NULL, 0, false};
  for (uint32_t i = 0; i < p->ndevices; i++) {
    const plan_device *d = &p->devices[i];
    cell(&t, "%s", plan_str(p, d->name));
    cell(&t, "%s", backend_name(d->backend));
    cell(&t, "%s", plan_str(p, d->arch));
    cell(&t, "%" PRIu64, d->arena_bytes);
  }
  return table_print(&t, "devices", out);
}

static rt_status text_plan(const plan *p, FILE *out) {
  static const char *const heads[] = {"launches", "copies", "records", "waits", "ops", "edges", "kernels", "streams"};
  table t = {heads, "rrrrrrrr", 8, NULL, 0, false};
  plan_counts n = count_commands(p);
  uint32_t v[] = {n.launches, n.copies, n.records, n.waits, p->nops, p->nedges, p->nkernels, p->nstreams};
  for (size_t i = 0; i < 8; i++) cell(&t, "%u", v[i]);
  return table_print(&t, "plan", out);
}

static rt_status write_text(const bundle_view *b, FILE *out) {
  const plan *p = &b->p;
  fprintf(out, "bundle %s: model %s, schedule %s\n\n", b->dir, plan_str(p, p->info.model),
          plan_str(p, p->info.schedule));
  RT_TRY(text_codeobjs(b, out));
  RT_TRY(text_plan_kernels(p, out));
  for (uint32_t i = 0; i < p->ncodeobjs; i++) RT_TRY(text_codeobj_kernels(b, i, out));
  RT_TRY(text_devices(p, out));
  return text_plan(p, out);
}

/* ---- JSON ---------------------------------------------------------------- */

/* ", "key": value, with null for a field the code object does not state. */
static void json_field(FILE *f, const char *key, int64_t v) {
  fprintf(f, ", \"%s\": ", key);
  if (v == INSP_UNKNOWN) fputs("null", f);
  else fprintf(f, "%" PRId64, v);
}

/* , "occupancy": {...}, or null when the target has no rule. */
static void json_occupancy(FILE *f, const char *target, const insp_kernel *k, uint32_t block) {
  occ_result r;
  if (occ_compute(target, k, block, &r)) {
    fputs(", \"occupancy\": null", f);
    return;
  }
  fprintf(f, ", \"occupancy\": {\"value\": %" PRId64 ", \"max\": %" PRId64 ", \"unit\": \"%s\", \"limit\": \"%s\"}",
          r.value, r.max, r.unit, r.limit);
}

static void json_codeobj_kernel(FILE *f, insp_kind kind, const insp_kernel *k, const char *target, uint32_t block) {
  fputs("{\"symbol\": ", f);
  rt_json_string(f, k->symbol);
  if (kind == INSP_AMDGPU) {
    json_field(f, "sgpr", k->sgpr);
    json_field(f, "vgpr", k->vgpr);
    json_field(f, "agpr", k->agpr);
    json_field(f, "lds", k->lds);
    json_field(f, "scratch", k->scratch);
    json_field(f, "kernarg", k->kernarg);
    json_occupancy(f, target, k, block);
  } else if (kind == INSP_CUDA) {
    json_field(f, "regs", k->regs);
    json_field(f, "shared", k->shared);
    json_field(f, "local", k->local);
    json_field(f, "stack", k->stack);
    json_occupancy(f, target, k, block);
  } else {
    json_field(f, "code_bytes", k->size);
  }
  fputc('}', f);
}

static void json_codeobjs(const bundle_view *b, FILE *f) {
  const plan *p = &b->p;
  static const char *const kinds[] = {[INSP_HOST] = "host", [INSP_AMDGPU] = "amdgpu", [INSP_CUDA] = "cuda"};
  fputs("  \"codeobjs\": [", f);
  for (uint32_t i = 0; i < p->ncodeobjs; i++) {
    char hex[65];
    rt_hex(p->codeobjs[i].sha256, 32, hex);
    fputs(i ? ",\n    {\"target\": " : "\n    {\"target\": ", f);
    rt_json_string(f, plan_str(p, p->codeobjs[i].target));
    fputs(", \"path\": ", f);
    rt_json_string(f, plan_str(p, p->codeobjs[i].path));
    fprintf(f, ", \"kind\": \"%s\", \"bytes\": %" PRIu64 ", \"sha256\": \"%s\", \"kernels\": [", kinds[b->objs[i].kind],
            b->bytes[i], hex);
    for (uint32_t k = 0; k < p->nkernels; k++) {
      fputs(k ? ",\n      " : "\n      ", f);
      json_codeobj_kernel(f, b->objs[i].kind, insp_find_kernel(&b->objs[i], plan_str(p, p->kernels[k].symbol)),
                          plan_str(p, p->codeobjs[i].target), p->kernels[k].block);
    }
    fputs(p->nkernels ? "\n    ]}" : "]}", f);
  }
  fputs(p->ncodeobjs ? "\n  ],\n" : "],\n", f);
}

static void json_plan_kernels(const plan *p, FILE *f) {
  fputs("  \"kernels\": [", f);
  for (uint32_t i = 0; i < p->nkernels; i++) {
    const plan_kernel *k = &p->kernels[i];
    fputs(i ? ",\n    {\"symbol\": " : "\n    {\"symbol\": ", f);
    rt_json_string(f, plan_str(p, k->symbol));
    fputs(", \"kind\": ", f);
    rt_json_string(f, plan_str(p, k->kind));
    fprintf(f, ", \"grid\": %u, \"block\": %u, \"shared\": %u, \"nbufs\": %u, \"ops\": [", k->grid, k->block,
            k->shared, k->nbufs);
    for (uint32_t o = 0, n = 0; o < p->nops; o++) {
      if (p->ops[o].kernel != i) continue;
      if (n++) fputs(", ", f);
      rt_json_string(f, plan_str(p, p->ops[o].path));
    }
    fputs("]}", f);
  }
  fputs(p->nkernels ? "\n  ],\n" : "],\n", f);
}

static void json_devices(const plan *p, FILE *f) {
  fputs("  \"devices\": [", f);
  for (uint32_t i = 0; i < p->ndevices; i++) {
    const plan_device *d = &p->devices[i];
    fputs(i ? ",\n    {\"name\": " : "\n    {\"name\": ", f);
    rt_json_string(f, plan_str(p, d->name));
    fprintf(f, ", \"backend\": \"%s\", \"arch\": ", backend_name(d->backend));
    rt_json_string(f, plan_str(p, d->arch));
    fprintf(f, ", \"arena_bytes\": %" PRIu64 "}", d->arena_bytes);
  }
  fputs(p->ndevices ? "\n  ],\n" : "],\n", f);
}

static void write_json(const bundle_view *b, FILE *f) {
  const plan *p = &b->p;
  fputs("{\n  \"bundle\": ", f);
  rt_json_string(f, b->dir);
  fputs(",\n  \"model\": ", f);
  rt_json_string(f, plan_str(p, p->info.model));
  fputs(",\n  \"schedule\": ", f);
  rt_json_string(f, plan_str(p, p->info.schedule));
  fputs(",\n", f);
  json_codeobjs(b, f);
  json_plan_kernels(p, f);
  json_devices(p, f);
  plan_counts n = count_commands(p);
  fprintf(f,
          "  \"plan\": {\"launches\": %u, \"copies\": %u, \"records\": %u, \"waits\": %u, \"ops\": %u, \"edges\": %u, "
          "\"kernels\": %u, \"streams\": %u}\n}\n",
          n.launches, n.copies, n.records, n.waits, p->nops, p->nedges, p->nkernels, p->nstreams);
}

/* The report of the plan in dir (a bundle, or its decode/ folder) into
 * *out_text (free it), nothing on failure. */
static rt_status report_text(const char *dir, int json, char **out_text, size_t *out_len) {
  *out_text = NULL;
  *out_len = 0;
  bundle_view b;
  RT_TRY(bundle_view_load(dir, &b));
  FILE *m = open_memstream(out_text, out_len);
  rt_status st = m ? NULL : rt_status_make("out of memory");
  if (!st && json) write_json(&b, m);
  else if (!st) st = write_text(&b, m);
  if (m && fclose(m) != 0 && !st) st = rt_status_make("out of memory");
  if (st) {
    free(*out_text);
    *out_text = NULL;
  }
  bundle_view_free(&b);
  return st;
}

rt_status insp_report(const char *bundle_dir, insp_format format, FILE *out) {
  return brep_write(bundle_dir, format == INSP_JSON, report_text, out);
}
