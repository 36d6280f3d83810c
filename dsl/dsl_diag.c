/* dsl_diag.c - error messages that quote the offending YAML line with a caret
 * under the column, positions inside scalars (dsl_pos_at), and the allocation
 * wrappers whose failure tests can force. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsl_yaml.h"

/* Weak so that a test executable can define its own and fail the N-th
 * allocation; the library itself keeps no state. */
__attribute__((weak)) int dsl_alloc_should_fail(void) { return 0; }

void *dsl_malloc(size_t n) {
  if (dsl_alloc_should_fail()) return NULL;
  return malloc(n ? n : 1);
}

void *dsl_calloc(size_t n, size_t size) {
  if (dsl_alloc_should_fail()) return NULL;
  if (n == 0 || size == 0) n = size = 1;
  return calloc(n, size);
}

void *dsl_realloc(void *p, size_t n) {
  if (dsl_alloc_should_fail()) return NULL;
  return realloc(p, n ? n : 1);
}

char *dsl_strndup(const char *s, size_t n) {
  char *r = dsl_malloc(n + 1);
  if (!r) return NULL;
  memcpy(r, s, n);
  r[n] = 0;
  return r;
}

/* Byte length of the UTF-8 sequence that starts with c (1 for stray bytes,
 * so that invalid input still advances). */
static size_t utf8_width(unsigned char c) {
  if (c >= 0xf0 && c < 0xf8) return 4;
  if (c >= 0xe0) return c < 0xf0 ? 3 : 1;
  if (c >= 0xc0) return 2;
  return 1;
}

/* Advances over one code point without running past a line break or NUL. */
static const char *next_char(const char *p) {
  size_t w = utf8_width((unsigned char)*p);
  for (size_t i = 1; i < w; i++)
    if ((((unsigned char)p[i]) & 0xc0) != 0x80) return p + i;
  return p + w;
}

/* Start of 1-based line `line` in src, or NULL past the end. */
static const char *line_start(const dsl_source *src, int line) {
  const char *p = src->text, *end = src->text + src->len;
  for (int l = 1; l < line; l++) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    if (!nl) return NULL;
    p = nl + 1;
  }
  return p;
}

static size_t line_length(const dsl_source *src, const char *start) {
  const char *end = src->text + src->len;
  const char *nl = memchr(start, '\n', (size_t)(end - start));
  size_t n = nl ? (size_t)(nl - start) : (size_t)(end - start);
  if (n && start[n - 1] == '\r') n--;
  return n;
}

/* Appends "  <line>\n  <caret>" to buf. Long lines show a window around the
 * column so that the caret stays inside the message. */
static void quote_line(char *buf, size_t cap, const dsl_source *src, int line, int col) {
  const char *ls = line_start(src, line);
  size_t len = ls ? line_length(src, ls) : 0;
  if (!ls) ls = "";
  /* byte offset of the column (columns count code points, as libyaml does) */
  const char *p = ls, *end = ls + len;
  for (int c = 1; c < col && p < end; c++) p = next_char(p);
  int past = 0; /* columns beyond the end of the line */
  if (p >= end) {
    const char *q = ls;
    int c = 1;
    while (q < end) q = next_char(q), c++;
    past = col > c ? col - c : 0;
    if (past > 200) past = 200;
  }
  const char *ws = ls, *we = end;
  int lead = 0, trail = 0;
  if (p - ls > 120) {
    ws = p - 60;
    while (ws < p && (((unsigned char)*ws) & 0xc0) == 0x80) ws++;
    lead = 1;
  }
  if (we - ws > 200) {
    we = ws + 200;
    while (we > ws && (((unsigned char)*we) & 0xc0) == 0x80) we--;
    trail = 1;
  }
  size_t used = strlen(buf);
  char *o = buf + used;
  size_t room = cap - used;
  /* worst case: 2 * (3 + 200 + 3) + 200 + a few; the buffer is checked anyway */
  char tmp[1024];
  size_t t = 0;
  tmp[t++] = '\n';
  tmp[t++] = ' ';
  tmp[t++] = ' ';
  if (lead) memcpy(tmp + t, "...", 3), t += 3;
  for (const char *q = ws; q < we; q++) {
    unsigned char c = (unsigned char)*q;
    tmp[t++] = (c < 0x20 && c != '\t') || c == 0x7f ? '?' : (char)c;
  }
  if (trail) memcpy(tmp + t, "...", 3), t += 3;
  tmp[t++] = '\n';
  tmp[t++] = ' ';
  tmp[t++] = ' ';
  if (lead) memcpy(tmp + t, "   ", 3), t += 3;
  for (const char *q = ws; q < p && q < we;) {
    tmp[t++] = *q == '\t' ? '\t' : ' ';
    q = next_char(q);
  }
  for (int i = 0; i < past; i++) tmp[t++] = ' ';
  tmp[t++] = '^';
  if (t >= room) t = room ? room - 1 : 0;
  memcpy(o, tmp, t);
  o[t] = 0;
}

/* Appends "FILE:LINE:COL: LABEL: BODY" and the quoted line with its caret
 * to d->msg (pos.src set). */
static void append_at(dsl_diag *d, dsl_pos pos, const char *label, const char *body) {
  size_t used = strlen(d->msg);
  snprintf(d->msg + used, sizeof d->msg - used, "%.400s:%d:%d: %s: %s",
           pos.src->path ? pos.src->path : "<input>", pos.line, pos.col, label, body);
  if (pos.line >= 1 && pos.col >= 1 && pos.src->text) quote_line(d->msg, sizeof d->msg, pos.src, pos.line, pos.col);
}

int dsl_verror(dsl_diag *d, dsl_pos pos, const char *fmt, va_list ap) {
  if (!d || d->failed) return -1;
  d->failed = 1;
  char body[1024];
  vsnprintf(body, sizeof body, fmt, ap);
  if (!pos.src) {
    snprintf(d->msg, sizeof d->msg, "error: %s", body);
    return -1;
  }
  d->msg[0] = 0;
  append_at(d, pos, "error", body);
  return -1;
}

int dsl_error(dsl_diag *d, dsl_pos pos, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int r = dsl_verror(d, pos, fmt, ap);
  va_end(ap);
  return r;
}

int dsl_note(dsl_diag *d, dsl_pos pos, const char *fmt, ...) {
  if (!d || !d->failed || !pos.src) return -1;
  char body[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(body, sizeof body, fmt, ap);
  va_end(ap);
  size_t used = strlen(d->msg);
  snprintf(d->msg + used, sizeof d->msg - used, "\n");
  append_at(d, pos, "note", body);
  return -1;
}

static int hexval(const char *p, int digits, unsigned long *out) {
  unsigned long v = 0;
  for (int i = 0; i < digits; i++) {
    char c = p[i];
    int h = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
            : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (h < 0) return -1;
    v = v * 16 + (unsigned long)h;
  }
  *out = v;
  return 0;
}

static size_t utf8_len_of(unsigned long cp) {
  return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
}

/* One escape of a double-quoted scalar: source bytes and decoded bytes. */
static void escape_size(const char *q, size_t *src_len, size_t *dec_len) {
  unsigned long cp;
  *src_len = 2;
  *dec_len = 1;
  switch (q[1]) {
  case 'x': if (hexval(q + 2, 2, &cp) == 0) *src_len = 4, *dec_len = utf8_len_of(cp); break;
  case 'u': if (hexval(q + 2, 4, &cp) == 0) *src_len = 6, *dec_len = utf8_len_of(cp); break;
  case 'U': if (hexval(q + 2, 8, &cp) == 0) *src_len = 10, *dec_len = utf8_len_of(cp); break;
  case 'N': case '_': *dec_len = 2; break;
  case 'L': case 'P': *dec_len = 3; break;
  default: break;
  }
}

dsl_pos dsl_pos_at(const dsl_str *s, size_t offset) {
  dsl_pos p = s->pos;
  if (!p.src || !s->text || p.line < 1 || p.col < 1) return p;
  size_t tl = strlen(s->text);
  if (offset > tl) offset = tl;
  const char *ls = line_start(p.src, p.line);
  if (!ls) return p;
  const char *end = ls + line_length(p.src, ls);
  const char *q = ls;
  for (int c = 1; c < p.col && q < end; c++) q = next_char(q);
  if (q >= end) return p;
  if (*q == '"' || *q == '\'') {
    char quote = *q++;
    int col = p.col + 1;
    size_t dec = 0;
    while (dec < offset && q < end) {
      if (*q == quote) {
        if (quote == '\'' && q + 1 < end && q[1] == '\'') { /* '' is one quote */
          q += 2, col += 2, dec += 1;
          continue;
        }
        break; /* the closing quote */
      }
      if (quote == '"' && *q == '\\' && q + 1 < end) {
        size_t sl, dl;
        escape_size(q, &sl, &dl);
        if (q + sl > end) break;
        q += sl, col += (int)sl, dec += dl;
        continue;
      }
      const char *n = next_char(q);
      dec += (size_t)(n - q);
      q = n;
      col++;
    }
    p.col = col;
    return p;
  }
  if (*q == '|' || *q == '>') return p; /* block scalars: the indicator's position */
  /* plain scalar: the text is the source, one column per code point */
  for (const char *t = s->text; (size_t)(t - s->text) < offset;) {
    t = next_char(t);
    p.col++;
  }
  return p;
}
