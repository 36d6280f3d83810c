/* dsl_expr.c - the expressions of shapes, params and attrs: integer ones,
 * recursive descent over + - * / % ( ), unary minus, decimal integers and
 * names, in int64 with every overflow an error at its column; and float
 * ones (float attrs and params) over + - * / ( ), unary minus, decimal
 * numbers and names, in double, with division by zero and results that are
 * not finite errors at their column. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
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
  dsl_lookup_float_fn lookup_float; /* float expressions */
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

/* The name at st->i, consumed, into name (NUL-terminated); 0 when longer
 * than cap allows (unknown, then). */
static int lex_name(expr_state *st, char *name, size_t cap) {
  size_t start = st->i;
  while (is_ident_start(st->s[st->i]) || is_digit(st->s[st->i])) st->i++;
  size_t n = st->i - start;
  if (n >= cap) return 0;
  memcpy(name, st->s + start, n);
  name[n] = 0;
  return 1;
}

static int unknown_name(expr_state *st, size_t start) {
  size_t n = st->i - start;
  return expr_error(st, start, "unknown param '%.*s'", (int)(n < 200 ? n : 200), st->s + start);
}

/* A param that holds a dtype or a rope table, named in an expression. */
static int not_a_number(expr_state *st, size_t start, const char *name) {
  return expr_error(st, start, "param '%s' is not a number (it holds a dtype or a rope table)", name);
}

/* The '(' at st->i, within the nesting bound. */
static int paren_open(expr_state *st) {
  if (++st->depth > EXPR_MAX_DEPTH)
    return expr_error(st, st->i, "expression nested more than %d levels deep", EXPR_MAX_DEPTH);
  st->i++;
  return 0;
}

/* The ')' that closes the '(' at column `start`. */
static int paren_close(expr_state *st, size_t start) {
  skip_space(st);
  if (st->s[st->i] != ')') {
    if (!st->s[st->i]) {
      dsl_pos open = dsl_pos_at(st->e, start);
      return expr_error(st, st->i, "missing ')' to close the '(' at column %d", open.src ? open.col : (int)start + 1);
    }
    return unexpected(st, "(expected ')')");
  }
  st->i++;
  st->depth--;
  return 0;
}

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
    char name[256];
    int found = lex_name(st, name, sizeof name) && st->lookup ? st->lookup(st->ctx, name, out) : -1;
    if (found == 0) return 0;
    if (found == 1)
      return expr_error(st, start, "param '%s' is a float; an integer expression takes integer params", name);
    if (found == 2) return not_a_number(st, start, name);
    return unknown_name(st, start);
  }
  if (c == '(') return paren_open(st) || parse_sum(st, out) || paren_close(st, start);
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
  expr_state st = {e, e->text, 0, lookup, NULL, ctx, d, 0};
  skip_space(&st);
  if (!st.s[st.i]) return expr_error(&st, 0, "empty expression");
  int64_t v;
  if (parse_sum(&st, &v)) return -1;
  skip_space(&st);
  if (st.s[st.i]) return unexpected(&st, "after the expression");
  *out_value = v;
  return 0;
}

/* ---- float expressions ---- */

static int fparse_sum(expr_state *st, double *out);

/* A decimal number as strtod reads it, without its sign (unary minus is
 * the parser's), hex floats, inf and nan. */
static size_t number_length(const char *s) {
  size_t i = 0;
  while (is_digit(s[i])) i++;
  if (s[i] == '.') {
    i++;
    while (is_digit(s[i])) i++;
  }
  if ((s[i] == 'e' || s[i] == 'E') && i > 0) {
    size_t j = i + 1;
    if (s[j] == '+' || s[j] == '-') j++;
    if (is_digit(s[j])) {
      while (is_digit(s[j])) j++;
      i = j;
    }
  }
  return i;
}

static int fparse_primary(expr_state *st, double *out) {
  skip_space(st);
  size_t start = st->i;
  char c = st->s[start];
  if (is_digit(c) || (c == '.' && is_digit(st->s[start + 1]))) {
    size_t n = number_length(st->s + start);
    char text[64];
    if (n >= sizeof text) return expr_error(st, start, "number %.20s... is too long", st->s + start);
    memcpy(text, st->s + start, n);
    text[n] = 0;
    st->i += n;
    *out = strtod(text, NULL);
    if (!isfinite(*out)) return expr_error(st, start, "number %s is out of range", text);
    return 0;
  }
  if (is_ident_start(c)) {
    char name[256];
    int found = lex_name(st, name, sizeof name) && st->lookup_float ? st->lookup_float(st->ctx, name, out) : -1;
    if (found == 0) return 0;
    if (found == 2) return not_a_number(st, start, name);
    return unknown_name(st, start);
  }
  if (c == '(') return paren_open(st) || fparse_sum(st, out) || paren_close(st, start);
  return unexpected(st, "(expected a number, a name or '(')");
}

static int fparse_unary(expr_state *st, double *out) {
  skip_space(st);
  if (st->s[st->i] != '-') return fparse_primary(st, out);
  size_t at = st->i++;
  if (++st->depth > EXPR_MAX_DEPTH)
    return expr_error(st, at, "expression nested more than %d levels deep", EXPR_MAX_DEPTH);
  if (fparse_unary(st, out)) return -1;
  st->depth--;
  *out = -*out;
  return 0;
}

/* a op b, an error at the operator's column unless finite. */
static int fapply(expr_state *st, size_t at, char op, double a, double b, double *out) {
  if (op == '/' && b == 0.0) return expr_error(st, at, "division by zero");
  double r = op == '+' ? a + b : op == '-' ? a - b : op == '*' ? a * b : a / b;
  if (!isfinite(r)) return expr_error(st, at, "%g %c %g is not a finite number", a, op, b);
  *out = r;
  return 0;
}

static int fparse_product(expr_state *st, double *out) {
  double a;
  if (fparse_unary(st, &a)) return -1;
  for (;;) {
    skip_space(st);
    char op = st->s[st->i];
    if (op == '%') return expr_error(st, st->i, "'%%' takes integers, not a float expression");
    if (op != '*' && op != '/') break;
    size_t at = st->i++;
    double b;
    if (fparse_unary(st, &b) || fapply(st, at, op, a, b, &a)) return -1;
  }
  *out = a;
  return 0;
}

static int fparse_sum(expr_state *st, double *out) {
  double a;
  if (fparse_product(st, &a)) return -1;
  for (;;) {
    skip_space(st);
    char op = st->s[st->i];
    if (op != '+' && op != '-') break;
    size_t at = st->i++;
    double b;
    if (fparse_product(st, &b) || fapply(st, at, op, a, b, &a)) return -1;
  }
  *out = a;
  return 0;
}

int dsl_eval_float(const dsl_str *e, dsl_lookup_float_fn lookup, void *ctx, double *out_value, dsl_diag *d) {
  if (!e || !e->text) {
    dsl_pos none = {NULL, 0, 0};
    return dsl_error(d, e ? e->pos : none, "missing expression");
  }
  expr_state st = {e, e->text, 0, NULL, lookup, ctx, d, 0};
  skip_space(&st);
  if (!st.s[st.i]) return expr_error(&st, 0, "empty expression");
  double v;
  if (fparse_sum(&st, &v)) return -1;
  skip_space(&st);
  if (st.s[st.i]) return unexpected(&st, "after the expression");
  *out_value = v;
  return 0;
}

int dsl_has_float_literal(const dsl_str *e) {
  const char *s = e && e->text ? e->text : "";
  for (size_t i = 0; s[i];) {
    if (is_ident_start(s[i])) { /* a name's digits are no number */
      while (is_ident_start(s[i]) || is_digit(s[i])) i++;
      continue;
    }
    if (is_digit(s[i]) || (s[i] == '.' && is_digit(s[i + 1]))) {
      size_t n = number_length(s + i);
      for (size_t k = i; k < i + n; k++)
        if (s[k] == '.' || s[k] == 'e' || s[k] == 'E') return 1;
      i += n;
      continue;
    }
    i++;
  }
  return 0;
}

const char *dsl_format_double(double v, int always_float, char *buf, size_t n) {
  double a = fabs(v);
  int fixed = a == 0.0 || (a >= 1e-4 && a < 1e15);
  for (int digits = fixed ? 0 : 1; digits <= (fixed ? 20 : 17); digits++) {
    snprintf(buf, n, fixed ? "%.*f" : "%.*g", digits, v);
    if (strtod(buf, NULL) == v) break;
  }
  if (always_float && !strpbrk(buf, ".e")) strncat(buf, ".0", n - strlen(buf) - 1);
  return buf;
}
