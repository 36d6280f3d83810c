/* json_parse.c - the strict JSON parser of json_parse.h: recursive descent
 * over the RFC 8259 grammar, refusing anything the grammar does not allow
 * (trailing commas, leading zeros, bare control characters, bad UTF-8). */
#include "json_parse.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct parser {
  const unsigned char *s;
  size_t len, at;
  char *err;
  size_t errn;
  int failed;
} parser;

static void fail(parser *p, const char *fmt, ...) {
  if (p->failed) return;
  p->failed = 1;
  va_list ap;
  va_start(ap, fmt);
  int k = snprintf(p->err, p->errn, "byte %zu: ", p->at);
  if (k >= 0 && (size_t)k < p->errn) vsnprintf(p->err + k, p->errn - (size_t)k, fmt, ap);
  va_end(ap);
}

static int peek(const parser *p) { return p->at < p->len ? p->s[p->at] : -1; }

static void skip_ws(parser *p) {
  while (p->at < p->len && (p->s[p->at] == ' ' || p->s[p->at] == '\t' || p->s[p->at] == '\n' ||
                            p->s[p->at] == '\r'))
    p->at++;
}

static json_value *new_value(parser *p, json_kind kind) {
  json_value *v = calloc(1, sizeof *v);
  if (!v) fail(p, "out of memory");
  else v->kind = kind;
  return v;
}

/* A growable byte buffer for decoded strings. */
typedef struct buf {
  char *b;
  size_t n, cap;
} buf;

static int put(buf *b, const void *src, size_t n) {
  if (b->n + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 32;
    while (cap < b->n + n + 1) cap *= 2;
    char *x = realloc(b->b, cap);
    if (!x) return -1;
    b->b = x;
    b->cap = cap;
  }
  memcpy(b->b + b->n, src, n);
  b->n += n;
  b->b[b->n] = 0;
  return 0;
}

static int put_utf8(buf *b, unsigned long cp) {
  unsigned char u[4];
  size_t n;
  if (cp < 0x80) u[0] = (unsigned char)cp, n = 1;
  else if (cp < 0x800) u[0] = (unsigned char)(0xc0 | cp >> 6), u[1] = (unsigned char)(0x80 | (cp & 0x3f)), n = 2;
  else if (cp < 0x10000)
    u[0] = (unsigned char)(0xe0 | cp >> 12), u[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f)),
    u[2] = (unsigned char)(0x80 | (cp & 0x3f)), n = 3;
  else
    u[0] = (unsigned char)(0xf0 | cp >> 18), u[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3f)),
    u[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3f)), u[3] = (unsigned char)(0x80 | (cp & 0x3f)), n = 4;
  return put(b, u, n);
}

static int hex4(parser *p, unsigned long *out) {
  if (p->at + 4 > p->len) return -1;
  unsigned long v = 0;
  for (int i = 0; i < 4; i++) {
    int c = p->s[p->at + (size_t)i];
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (d < 0) return -1;
    v = v * 16 + (unsigned long)d;
  }
  p->at += 4;
  *out = v;
  return 0;
}

/* The length of the well-formed UTF-8 sequence at the parser's position
 * (RFC 3629), or 0. */
static size_t utf8_seq(const parser *p) {
  const unsigned char *u = p->s + p->at;
  size_t left = p->len - p->at, n;
  unsigned c = u[0], lo = 0x80, hi = 0xbf;
  if (c >= 0xc2 && c <= 0xdf) n = 2;
  else if (c >= 0xe0 && c <= 0xef) n = 3;
  else if (c >= 0xf0 && c <= 0xf4) n = 4;
  else return 0;
  if (left < n) return 0;
  if (c == 0xe0) lo = 0xa0;
  else if (c == 0xed) hi = 0x9f;
  else if (c == 0xf0) lo = 0x90;
  else if (c == 0xf4) hi = 0x8f;
  if (u[1] < lo || u[1] > hi) return 0;
  for (size_t i = 2; i < n; i++)
    if (u[i] < 0x80 || u[i] > 0xbf) return 0;
  return n;
}

/* At the opening quote; the decoded string (caller frees), or NULL. */
static char *parse_string(parser *p) {
  buf b = {0};
  p->at++;
  if (put(&b, "", 0)) goto oom;
  for (;;) {
    int c = peek(p);
    if (c < 0) {
      fail(p, "unterminated string");
      break;
    }
    if (c == '"') {
      p->at++;
      return b.b;
    }
    if (c < 0x20) {
      fail(p, "control character 0x%02x in a string", c);
      break;
    }
    if (c == '\\') {
      p->at++;
      int e = peek(p);
      const char *simple = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t";
      const char *at = e > 0 ? strchr(simple, e) : NULL;
      if (at) {
        p->at++;
        if (put(&b, to + (at - simple), 1)) goto oom;
        continue;
      }
      if (e != 'u') {
        fail(p, "bad escape in a string");
        break;
      }
      p->at++;
      unsigned long cp, lo;
      if (hex4(p, &cp)) {
        fail(p, "bad \\u escape");
        break;
      }
      if (cp >= 0xdc00 && cp <= 0xdfff) {
        fail(p, "lone low surrogate \\u%04lx", cp);
        break;
      }
      if (cp >= 0xd800 && cp <= 0xdbff) {
        if (p->at + 2 > p->len || p->s[p->at] != '\\' || p->s[p->at + 1] != 'u') {
          fail(p, "high surrogate \\u%04lx without its low half", cp);
          break;
        }
        p->at += 2;
        if (hex4(p, &lo) || lo < 0xdc00 || lo > 0xdfff) {
          fail(p, "high surrogate \\u%04lx without its low half", cp);
          break;
        }
        cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
      }
      if (cp == 0) {
        fail(p, "\\u0000 in a string");
        break;
      }
      if (put_utf8(&b, cp)) goto oom;
      continue;
    }
    size_t n = c < 0x80 ? 1 : utf8_seq(p);
    if (n == 0) {
      fail(p, "invalid UTF-8 in a string");
      break;
    }
    if (put(&b, p->s + p->at, n)) goto oom;
    p->at += n;
  }
  free(b.b);
  return NULL;
oom:
  fail(p, "out of memory");
  free(b.b);
  return NULL;
}

static int is_digit(int c) { return c >= '0' && c <= '9'; }

static json_value *parse_number(parser *p) {
  size_t begin = p->at;
  if (peek(p) == '-') p->at++;
  if (peek(p) == '0') {
    p->at++;
  } else if (is_digit(peek(p))) {
    while (is_digit(peek(p))) p->at++;
  } else {
    fail(p, "bad number");
    return NULL;
  }
  if (peek(p) == '.') {
    p->at++;
    if (!is_digit(peek(p))) {
      fail(p, "bad number: no digit after '.'");
      return NULL;
    }
    while (is_digit(peek(p))) p->at++;
  }
  if (peek(p) == 'e' || peek(p) == 'E') {
    p->at++;
    if (peek(p) == '+' || peek(p) == '-') p->at++;
    if (!is_digit(peek(p))) {
      fail(p, "bad number: no digit in the exponent");
      return NULL;
    }
    while (is_digit(peek(p))) p->at++;
  }
  json_value *v = new_value(p, JSON_NUMBER);
  if (!v) return NULL;
  v->text = malloc(p->at - begin + 1);
  if (!v->text) {
    fail(p, "out of memory");
    free(v);
    return NULL;
  }
  memcpy(v->text, p->s + begin, p->at - begin);
  v->text[p->at - begin] = 0;
  v->number = strtod(v->text, NULL);
  return v;
}

static int literal(parser *p, const char *word) {
  size_t n = strlen(word);
  if (p->at + n > p->len || memcmp(p->s + p->at, word, n) != 0) return 0;
  p->at += n;
  return 1;
}

static json_value *parse_value(parser *p, int depth);

static int append(parser *p, json_value *v, json_value *item, char *key) {
  json_value **items = realloc(v->items, (v->n + 1) * sizeof *items);
  if (items) v->items = items;
  if (v->kind == JSON_OBJECT) {
    char **keys = realloc(v->keys, (v->n + 1) * sizeof *keys);
    if (keys) v->keys = keys;
    if (!keys) items = NULL;
  }
  if (!items) {
    fail(p, "out of memory");
    json_free(item);
    free(key);
    return -1;
  }
  v->items[v->n] = item;
  if (v->kind == JSON_OBJECT) v->keys[v->n] = key;
  v->n++;
  return 0;
}

/* At '[' or '{'. */
static json_value *parse_container(parser *p, int depth) {
  int object = peek(p) == '{';
  char close = object ? '}' : ']';
  json_value *v = new_value(p, object ? JSON_OBJECT : JSON_ARRAY);
  if (!v) return NULL;
  p->at++;
  skip_ws(p);
  if (peek(p) == close) {
    p->at++;
    return v;
  }
  for (;;) {
    char *key = NULL;
    skip_ws(p);
    if (object) {
      if (peek(p) != '"') {
        fail(p, "expected a string key");
        break;
      }
      key = parse_string(p);
      if (!key) break;
      skip_ws(p);
      if (peek(p) != ':') {
        fail(p, "expected ':' after a key");
        free(key);
        break;
      }
      p->at++;
    }
    json_value *item = parse_value(p, depth + 1);
    if (!item) {
      free(key);
      break;
    }
    if (append(p, v, item, key)) break;
    skip_ws(p);
    if (peek(p) == ',') {
      p->at++;
      continue;
    }
    if (peek(p) == close) {
      p->at++;
      return v;
    }
    fail(p, "expected ',' or '%c'", close);
    break;
  }
  json_free(v);
  return NULL;
}

static json_value *parse_value(parser *p, int depth) {
  if (depth > 64) {
    fail(p, "nested more than 64 deep");
    return NULL;
  }
  skip_ws(p);
  int c = peek(p);
  json_value *v;
  if (c == '{' || c == '[') return parse_container(p, depth);
  if (c == '"') {
    char *s = parse_string(p);
    if (!s) return NULL;
    v = new_value(p, JSON_STRING);
    if (!v) {
      free(s);
      return NULL;
    }
    v->text = s;
    return v;
  }
  if (c == '-' || is_digit(c)) return parse_number(p);
  if (literal(p, "true") || literal(p, "false")) {
    v = new_value(p, JSON_BOOL);
    if (v) v->boolean = p->s[p->at - 1] == 'e' && p->s[p->at - 2] == 'u';
    return v;
  }
  if (literal(p, "null")) return new_value(p, JSON_NULL);
  fail(p, c < 0 ? "unexpected end of input" : "unexpected character '%c'", c);
  return NULL;
}

json_value *json_parse(const char *text, size_t len, char *err, size_t errn) {
  parser p = {.s = (const unsigned char *)text, .len = len, .err = err, .errn = errn};
  if (errn) err[0] = 0;
  json_value *v = parse_value(&p, 0);
  if (v) {
    skip_ws(&p);
    if (p.at != p.len) {
      fail(&p, "trailing characters after the value");
      json_free(v);
      v = NULL;
    }
  }
  return v;
}

void json_free(json_value *v) {
  if (!v) return;
  for (size_t i = 0; i < v->n; i++) {
    json_free(v->items[i]);
    if (v->keys) free(v->keys[i]);
  }
  free(v->items);
  free(v->keys);
  free(v->text);
  free(v);
}

const json_value *json_get(const json_value *v, const char *key) {
  if (!v || v->kind != JSON_OBJECT) return NULL;
  for (size_t i = 0; i < v->n; i++)
    if (!strcmp(v->keys[i], key)) return v->items[i];
  return NULL;
}
