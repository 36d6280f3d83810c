/* dsl_expr.c - the integer expressions of shapes, params and attrs:
 * recursive descent over + - * / % ( ), unary minus, decimal integers and
 * names, in int64 with every overflow an error at its column. */
#include <stdio.h>
#include <string.h>

#include "dsl_yaml.h"

/* Parentheses and unary minus recurse; a bound keeps hostile input from
 * exhausting the stack. */
#define EXPR_MAX_DEPTH 64

typedef struct expr_state {
  const dsl_str *e;
  const char *s;
  size_t i;
  dsl_lookup_fn lookup;
  void *ctx;
  dsl_diag *d;
  int depth;
} expr_state;

static int expr_error(expr_state *st, size_t off, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int expr_error(expr_state *st, size_t off, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int r = dsl_verror(st->d, dsl_pos_at(st->e, off), fmt, ap);
  va_end(ap);
  return r;
}

static void skip_space(expr_state *st) {
  while (st->s[st->i] == ' ' || st->s[st->i] == '\t') st->i++;
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }
static int is_ident_start(char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_'; }

static int unexpected(expr_state *st, const char *where) {
  unsigned char c = (unsigned char)st->s[st->i];
  if (!c) return expr_error(st, st->i, "expected a number, a name or '(' at the end of the expression");
  if (c > 0x20 && c < 0x7f) return expr_error(st, st->i, "unexpected '%c' %s", c, where);
  return expr_error(st, st->i, "unexpected character (byte 0x%02x) %s", c, where);
}

static int parse_sum(expr_state *st, int64_t *out);

static int parse_primary(expr_state *st, int64_t *out) {
  skip_space(st);
  size_t start = st->i;
  char c = st->s[start];
  if (is_digit(c)) {
    int64_t v = 0;
    while (is_digit(st->s[st->i])) {
      if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, st->s[st->i] - '0', &v)) {
        while (is_digit(st->s[st->i])) st->i++;
        return expr_error(st, start, "integer %.*s does not fit in 64 bits", (int)(st->i - start),
                          st->s + start);
      }
      st->i++;
    }
    *out = v;
    return 0;
  }
  if (is_ident_start(c)) {
    while (is_ident_start(st->s[st->i]) || is_digit(st->s[st->i])) st->i++;
    size_t n = st->i - start;
    char name[256];
    if (n < sizeof name && st->lookup) {
      memcpy(name, st->s + start, n);
      name[n] = 0;
      if (st->lookup(st->ctx, name, out) == 0) return 0;
    }
    return expr_error(st, start, "unknown param '%.*s'", (int)(n < 200 ? n : 200), st->s + start);
  }
  if (c == '(') {
    if (++st->depth > EXPR_MAX_DEPTH)
      return expr_error(st, start, "expression nested more than %d levels deep", EXPR_MAX_DEPTH);
    st->i++;
    if (parse_sum(st, out)) return -1;
    skip_space(st);
    if (st->s[st->i] != ')') {
      if (!st->s[st->i]) {
        dsl_pos open = dsl_pos_at(st->e, start);
        return expr_error(st, st->i, "missing ')' to close the '(' at column %d",
                          open.src ? open.col : (int)start + 1);
      }
      return unexpected(st, "(expected ')')");
    }
    st->i++;
    st->depth--;
    return 0;
  }
  return unexpected(st, "(expected a number, a name or '(')");
}

static int parse_unary(expr_state *st, int64_t *out) {
  skip_space(st);
  if (st->s[st->i] != '-') return parse_primary(st, out);
  size_t at = st->i++;
  if (++st->depth > EXPR_MAX_DEPTH)
    return expr_error(st, at, "expression nested more than %d levels deep", EXPR_MAX_DEPTH);
  int64_t v;
  if (parse_unary(st, &v)) return -1;
  st->depth--;
  if (v == INT64_MIN) return expr_error(st, at, "integer overflow: -(%lld) does not fit in 64 bits", (long long)v);
  *out = -v;
  return 0;
}

static int parse_product(expr_state *st, int64_t *out) {
  int64_t a;
  if (parse_unary(st, &a)) return -1;
  for (;;) {
    skip_space(st);
    char op = st->s[st->i];
    if (op != '*' && op != '/' && op != '%') break;
    size_t at = st->i++;
    int64_t b;
    if (parse_unary(st, &b)) return -1;
    if (op == '*') {
      int64_t r;
      if (__builtin_mul_overflow(a, b, &r))
        return expr_error(st, at, "integer overflow: %lld * %lld does not fit in 64 bits", (long long)a,
                          (long long)b);
      a = r;
      continue;
    }
    if (b == 0) return expr_error(st, at, op == '/' ? "division by zero" : "modulo by zero");
    if (a == INT64_MIN && b == -1)
      return expr_error(st, at, "integer overflow: %lld %c -1 does not fit in 64 bits", (long long)a, op);
    a = op == '/' ? a / b : a % b;
  }
  *out = a;
  return 0;
}

static int parse_sum(expr_state *st, int64_t *out) {
  int64_t a;
  if (parse_product(st, &a)) return -1;
  for (;;) {
    skip_space(st);
    char op = st->s[st->i];
    if (op != '+' && op != '-') break;
    size_t at = st->i++;
    int64_t b, r;
    if (parse_product(st, &b)) return -1;
    int bad = op == '+' ? __builtin_add_overflow(a, b, &r) : __builtin_sub_overflow(a, b, &r);
    if (bad)
      return expr_error(st, at, "integer overflow: %lld %c %lld does not fit in 64 bits", (long long)a, op,
                        (long long)b);
    a = r;
  }
  *out = a;
  return 0;
}

int dsl_eval(const dsl_str *e, dsl_lookup_fn lookup, void *ctx, int64_t *out_value, dsl_diag *d) {
  if (!e || !e->text) {
    dsl_pos none = {NULL, 0, 0};
    return dsl_error(d, e ? e->pos : none, "missing expression");
  }
  expr_state st = {e, e->text, 0, lookup, ctx, d, 0};
  skip_space(&st);
  if (!st.s[st.i]) return expr_error(&st, 0, "empty expression");
  int64_t v;
  if (parse_sum(&st, &v)) return -1;
  skip_space(&st);
  if (st.s[st.i]) return unexpected(&st, "after the expression");
  *out_value = v;
  return 0;
}
