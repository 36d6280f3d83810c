/* plan_diff.c - two plans compared for the review of a schedule change.
 * Every input, binary or text, goes through the canonical text
 * (plan_text_write) and one parser, so that a committed out/ text and a
 * fresh bundle compare alike; the report names ops, tensors, streams and
 * devices, never indices, and says whether anything beyond order changed. */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "emit.h"
#include "plan_diff.h"

/* ---- the parsed text ---- */

typedef struct pd_line {
  int no;        /* 1-based line number */
  size_t begin, end; /* its bytes */
  int tok, ntok; /* its tokens: tokoff[tok .. tok + ntok) */
} pd_line;

typedef struct pd_list {
  int *v; /* line indices */
  int n, cap;
} pd_list;

/* A [stream X] section. */
typedef struct pd_stream {
  const char *name;
  int header; /* line index */
  pd_list cmds;
  int *ops; /* op table indices, in stream order */
  int nops;
} pd_stream;

/* A launch or copy, by path. */
typedef struct pd_op {
  const char *path;
  int stream; /* index into streams sections */
  int line;   /* line index of its command */
  int pos;    /* its place among the stream's ops */
  int copy;   /* 1: a copy, 0: a launch */
} pd_op;

/* A section this parser does not know: compared as a set of lines. */
typedef struct pd_other {
  const char *name;
  pd_list lines;
} pd_other;

typedef struct pd_plan {
  const char *name; /* the input's path, for messages */
  int rendered;     /* the text was rendered from a binary plan */
  char *text;       /* the lines, NUL-terminated */
  char *toks;       /* the same bytes, tokens NUL-terminated */
  size_t len;
  pd_line *lines;
  int nlines;
  uint32_t *tokoff;
  int ntoks, captoks;
  char *version, *model, *schedule;
  int step, summary; /* line indices, -1 when absent */
  pd_list params, devices, streams, tensors, code, kernels, edges;
  pd_stream *sst;
  int nsst;
  pd_other *other;
  int nother;
  pd_op *ops; /* sorted by path */
  int nops;
  char err[6144]; /* a path of up to 4096 bytes and the message */
} pd_plan;

static void *xrealloc(void *p, size_t n) {
  p = realloc(p, n ? n : 1);
  if (!p) abort();
  return p;
}

static void list_add(pd_list *l, int v) {
  if (l->n == l->cap) {
    l->cap = l->cap ? 2 * l->cap : 16;
    l->v = xrealloc(l->v, (size_t)l->cap * sizeof *l->v);
  }
  l->v[l->n++] = v;
}

static const char *tok(const pd_plan *pl, int line, int i) { return pl->toks + pl->tokoff[pl->lines[line].tok + i]; }
static int ntok(const pd_plan *pl, int line) { return pl->lines[line].ntok; }
static const char *line_text(const pd_plan *pl, int line) { return pl->text + pl->tokoff[pl->lines[line].tok]; }
/* The text of a line from token i to its end. */
static const char *rest_text(const pd_plan *pl, int line, int i) {
  return pl->text + pl->tokoff[pl->lines[line].tok + i];
}

/* An error at a line: FILE:LINE for a text input; for a binary one, the
 * line of its canonical text. Returns -1. */
__attribute__((format(printf, 3, 4))) static int fail(pd_plan *pl, int no, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (pl->rendered)
    snprintf(pl->err, sizeof pl->err, "ds4c: error: %s: line %d of its canonical text: %s", pl->name, no, msg);
  else
    snprintf(pl->err, sizeof pl->err, "%s:%d: error: %s", pl->name, no, msg);
  return -1;
}

static int is_uint(const char *s) {
  if (!*s) return 0;
  for (; *s; s++)
    if (*s < '0' || *s > '9') return 0;
  return 1;
}

static int is_int(const char *s) { return is_uint(*s == '-' ? s + 1 : s); }

/* An integer param's value, or a float param's as plan_text writes it. */
static int is_number(const char *s) {
  char *end;
  if (is_int(s)) return 1;
  (void)strtod(s, &end);
  return end != s && *end == 0;
}

static int is_uint_n(const char *s, size_t n) {
  if (!n) return 0;
  for (size_t i = 0; i < n; i++)
    if (s[i] < '0' || s[i] > '9') return 0;
  return 1;
}

static void push_tok(pd_plan *pl, size_t off) {
  if (pl->ntoks == pl->captoks) {
    pl->captoks = pl->captoks ? 2 * pl->captoks : 1024;
    pl->tokoff = xrealloc(pl->tokoff, (size_t)pl->captoks * sizeof *pl->tokoff);
  }
  pl->tokoff[pl->ntoks++] = (uint32_t)off;
}

/* Splits line i (toks[begin, end)) at spaces; a token that starts with '['
 * runs to its ']' (a shape: "[4, 64]"). */
static int tokenize(pd_plan *pl, int i, size_t begin, size_t end) {
  pd_line *ln = &pl->lines[i];
  ln->tok = pl->ntoks;
  size_t c = begin;
  while (c < end) {
    if (pl->toks[c] == ' ') {
      c++;
      continue;
    }
    push_tok(pl, c);
    if (pl->toks[c] == '[') {
      while (c < end && pl->toks[c] != ']') c++;
      if (c == end) return fail(pl, ln->no, "'[' without its ']'");
      c++;
      if (c < end && pl->toks[c] != ' ') return fail(pl, ln->no, "']' followed by '%c'", pl->toks[c]);
    } else {
      while (c < end && pl->toks[c] != ' ') c++;
    }
    if (c < end) pl->toks[c++] = 0;
  }
  ln->ntok = pl->ntoks - ln->tok;
  /* the empty line's offset, so that line_text works on it too */
  if (!ln->ntok) push_tok(pl, begin);
  return 0;
}

/* Key-value pairs from token `first` on: an even count. */
static int check_pairs(pd_plan *pl, int line, int first, const char *what) {
  if ((ntok(pl, line) - first) % 2) return fail(pl, pl->lines[line].no, "%s: a key without its value", what);
  return 0;
}

/* The value of key in line's pairs from token `first`, or NULL. */
static const char *pair(const pd_plan *pl, int line, int first, const char *key) {
  for (int i = first; i + 1 < ntok(pl, line); i += 2)
    if (strcmp(tok(pl, line, i), key) == 0) return tok(pl, line, i + 1);
  return NULL;
}

static int parse_header(pd_plan *pl) {
  static const char pre[] = "# ds4 plan ", mid[] = ": model ", sch[] = ", schedule ";
  const char *t = pl->text; /* line 1 */
  const char *colon = strncmp(t, pre, strlen(pre)) == 0 ? strstr(t, mid) : NULL;
  const char *comma = colon ? strstr(colon, sch) : NULL;
  if (!comma) return fail(pl, 1, "expected '# ds4 plan VERSION: model NAME, schedule NAME'");
  t += strlen(pre);
  pl->version = strndup(t, (size_t)(colon - t));
  pl->model = strndup(colon + strlen(mid), (size_t)(comma - colon - strlen(mid)));
  pl->schedule = strdup(comma + strlen(sch));
  if (!pl->version || !pl->model || !pl->schedule) abort();
  return 0;
}

/* The known sections, in the order the text holds them. */
enum { SEC_NONE = -1, SEC_PARAMS, SEC_DEVICES, SEC_STREAMS, SEC_TENSORS, SEC_CODE, SEC_KERNELS, SEC_EDGES,
       SEC_STREAM, SEC_SUMMARY, SEC_OTHER };
static const char *const sec_names[] = {"params", "devices", "streams", "tensors", "code", "kernels", "edges",
                                        "stream", "summary"};

static int section_of(const char *name) {
  if (strncmp(name, "stream ", 7) == 0) return SEC_STREAM;
  for (int i = 0; i <= SEC_SUMMARY; i++)
    if (i != SEC_STREAM && strcmp(name, sec_names[i]) == 0) return i;
  return SEC_OTHER;
}

static int parse_entry(pd_plan *pl, int sec, int i) {
  int no = pl->lines[i].no, n = ntok(pl, i);
  const char *t0 = tok(pl, i, 0);
  switch (sec) {
    case SEC_PARAMS:
      if (n != 3 || strcmp(tok(pl, i, 1), "=") || !is_number(tok(pl, i, 2)))
        return fail(pl, no, "expected 'NAME = NUMBER' in [params]");
      list_add(&pl->params, i);
      return 0;
    case SEC_DEVICES: {
      if (check_pairs(pl, i, 1, "device")) return -1;
      const char *arena = pair(pl, i, 1, "arena");
      if (!arena || !is_uint(arena)) return fail(pl, no, "device %s: expected 'arena BYTES'", t0);
      list_add(&pl->devices, i);
      return 0;
    }
    case SEC_STREAMS:
      if (n != 1 || !strchr(t0, '.')) return fail(pl, no, "expected 'DEVICE.STREAM' in [streams]");
      list_add(&pl->streams, i);
      return 0;
    case SEC_TENSORS: {
      if (n < 6 || tok(pl, i, 2)[0] != '[')
        return fail(pl, no, "expected 'NAME DTYPE [SHAPE] ROLE DEVICE+OFFSET BYTES' in [tensors]");
      const char *place = tok(pl, i, 4), *plus = strrchr(place, '+');
      if (strcmp(place, "unplaced") && (!plus || plus == place || !is_uint(plus + 1)))
        return fail(pl, no, "tensor %s: expected DEVICE+OFFSET or 'unplaced', not '%s'", t0, place);
      if (!is_uint(tok(pl, i, 5))) return fail(pl, no, "tensor %s: bytes '%s' is not a number", t0, tok(pl, i, 5));
      if (check_pairs(pl, i, 6, "tensor")) return -1;
      list_add(&pl->tensors, i);
      return 0;
    }
    case SEC_CODE:
      if (check_pairs(pl, i, 1, "code object")) return -1;
      list_add(&pl->code, i);
      return 0;
    case SEC_KERNELS:
      if (check_pairs(pl, i, 1, "kernel")) return -1;
      list_add(&pl->kernels, i);
      return 0;
    case SEC_EDGES:
      if (n != 5 || strcmp(tok(pl, i, 1), "->"))
        return fail(pl, no, "expected 'FROM -> TO HAZARD TENSOR' in [edges]");
      list_add(&pl->edges, i);
      return 0;
    case SEC_STREAM: {
      int ok = (strcmp(t0, "launch") == 0 && n >= 3) ||
               (strcmp(t0, "copy") == 0 && n == 5 && strcmp(tok(pl, i, 3), "->") == 0) ||
               (strcmp(t0, "record") == 0 && n == 3 && strcmp(tok(pl, i, 1), "after") == 0) ||
               (strcmp(t0, "wait") == 0 && n == 4 && strcmp(tok(pl, i, 2), "after") == 0);
      if (!ok)
        return fail(pl, no,
                    "expected 'launch OP KERNEL ARGS', 'copy OP SRC -> DST', 'record after OP' or "
                    "'wait STREAM after OP'");
      list_add(&pl->sst[pl->nsst - 1].cmds, i);
      return 0;
    }
    case SEC_SUMMARY:
      if (pl->summary >= 0) return fail(pl, no, "[summary] holds one line");
      if (check_pairs(pl, i, 0, "summary")) return -1;
      pl->summary = i;
      return 0;
    default:
      list_add(&pl->other[pl->nother - 1].lines, i);
      return 0;
  }
}

/* Lines, sections and the grammar of each line. */
static int parse_text(pd_plan *pl) {
  pl->step = pl->summary = -1;
  if (pl->len > UINT32_MAX) return fail(pl, 1, "%zu bytes: too large for a plan text", pl->len);
  for (size_t c = 0; c < pl->len; c++) {
    if (pl->text[c] == 0 || pl->text[c] == '\r') {
      int no = 1;
      for (size_t k = 0; k < c; k++) no += pl->text[k] == '\n';
      return fail(pl, no, "%s: not a plan text, whose lines end in \\n alone",
                  pl->text[c] ? "a carriage return" : "a NUL byte");
    }
  }
  int cap = 0, sec = SEC_NONE, last_known = SEC_NONE;
  for (size_t begin = 0; begin < pl->len;) {
    char *nl = memchr(pl->text + begin, '\n', pl->len - begin);
    size_t end = nl ? (size_t)(nl - pl->text) : pl->len;
    if (pl->nlines == cap) {
      cap = cap ? 2 * cap : 1024;
      pl->lines = xrealloc(pl->lines, (size_t)cap * sizeof *pl->lines);
    }
    int i = pl->nlines++;
    pl->lines[i] = (pd_line){.no = i + 1, .begin = begin, .end = end};
    pl->text[end] = pl->toks[end] = 0;
    begin = end + 1;
  }
  if (pl->nlines == 0) return fail(pl, 1, "empty: expected '# ds4 plan' and its sections");
  /* the header first: a file of another kind fails at its line 1 */
  if (parse_header(pl) || tokenize(pl, 0, 0, pl->lines[0].end)) return -1;
  for (int i = 1; i < pl->nlines; i++) {
    int no = pl->lines[i].no;
    if (tokenize(pl, i, pl->lines[i].begin, pl->lines[i].end)) return -1;
    if (ntok(pl, i) == 0) continue;
    if (ntok(pl, i) == 1 && tok(pl, i, 0)[0] == '[') {
      /* a section header: one token, "[NAME]" */
      char *name = pl->toks + pl->tokoff[pl->lines[i].tok] + 1;
      name[strlen(name) - 1] = 0;
      int s = section_of(name);
      if (s != SEC_OTHER) {
        if (s < last_known || (s == last_known && s != SEC_STREAM))
          return fail(pl, no, "section [%s] %s", name, s == last_known ? "again" : "out of order");
        for (int k = last_known + 1; k < s; k++)
          if (k != SEC_STREAM) return fail(pl, no, "section [%s] before [%s]", name, sec_names[k]);
        last_known = s;
      }
      if (pl->step < 0) return fail(pl, no, "section [%s] before the 'step' line", name);
      sec = s;
      if (s == SEC_STREAM) {
        pl->sst = xrealloc(pl->sst, (size_t)(pl->nsst + 1) * sizeof *pl->sst);
        pl->sst[pl->nsst++] = (pd_stream){.name = name + 7, .header = i};
      } else if (s == SEC_OTHER) {
        pl->other = xrealloc(pl->other, (size_t)(pl->nother + 1) * sizeof *pl->other);
        pl->other[pl->nother++] = (pd_other){.name = name};
      }
      continue;
    }
    if (sec == SEC_NONE) {
      if (pl->step >= 0 || strcmp(tok(pl, i, 0), "step")) return fail(pl, no, "expected the 'step' line or [params]");
      if (check_pairs(pl, i, 1, "step")) return -1;
      pl->step = i;
      continue;
    }
    if (parse_entry(pl, sec, i)) return -1;
  }
  if (last_known != SEC_SUMMARY || pl->summary < 0)
    return fail(pl, pl->nlines, "the text ends before %s",
                last_known == SEC_SUMMARY ? "the summary line" : "[summary]");
  return 0;
}

/* ---- indexes and cross-checks ---- */

static int cmp_line_tok0(const void *x, const void *y, void *ctx) {
  const pd_plan *pl = ctx;
  int a = *(const int *)x, b = *(const int *)y;
  int c = strcmp(tok(pl, a, 0), tok(pl, b, 0));
  return c ? c : (a > b) - (a < b);
}

static int cmp_line_text(const void *x, const void *y, void *ctx) {
  const pd_plan *pl = ctx;
  int a = *(const int *)x, b = *(const int *)y;
  int c = strcmp(line_text(pl, a), line_text(pl, b));
  return c ? c : (a > b) - (a < b);
}

/* Sorts a section by name; a name twice is an error. */
static int sort_unique(pd_plan *pl, pd_list *l, const char *what) {
  if (l->n) qsort_r(l->v, (size_t)l->n, sizeof *l->v, cmp_line_tok0, pl);
  for (int i = 1; i < l->n; i++)
    if (strcmp(tok(pl, l->v[i], 0), tok(pl, l->v[i - 1], 0)) == 0) {
      int a = l->v[i - 1], b = l->v[i];
      return fail(pl, pl->lines[a > b ? a : b].no, "%s %s twice (also line %d)", what, tok(pl, a, 0),
                  pl->lines[a < b ? a : b].no);
    }
  return 0;
}

/* The line of a name in a section sorted by sort_unique, or -1; the name
 * is the first len bytes of key. */
static int find_n(const pd_plan *pl, const pd_list *l, const char *key, size_t len) {
  int lo = 0, hi = l->n;
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    const char *t = tok(pl, l->v[mid], 0);
    int c = strncmp(t, key, len);
    if (!c) c = t[len] ? 1 : 0;
    if (!c) return l->v[mid];
    if (c < 0) lo = mid + 1;
    else hi = mid;
  }
  return -1;
}

static int find(const pd_plan *pl, const pd_list *l, const char *key) { return find_n(pl, l, key, strlen(key)); }

static int cmp_op(const void *x, const void *y) {
  return strcmp(((const pd_op *)x)->path, ((const pd_op *)y)->path);
}

/* The op table index of path, or -1. */
static int find_op(const pd_plan *pl, const char *path) {
  pd_op key = {.path = path};
  if (!pl->nops) return -1;
  const pd_op *o = bsearch(&key, pl->ops, (size_t)pl->nops, sizeof *pl->ops, cmp_op);
  return o ? (int)(o - pl->ops) : -1;
}

static int find_stream(const pd_plan *pl, const char *name) {
  for (int s = 0; s < pl->nsst; s++)
    if (strcmp(pl->sst[s].name, name) == 0) return s;
  return -1;
}

/* An operand names a tensor, with "[+OFFSET:BYTES]" when it is a part. */
static int check_operand(pd_plan *pl, int line, const char *arg) {
  size_t n = strlen(arg);
  const char *range = strstr(arg, "[+");
  if (range && arg[n - 1] == ']') n = (size_t)(range - arg);
  if (find_n(pl, &pl->tensors, arg, n) < 0)
    return fail(pl, pl->lines[line].no, "operand %s: no such tensor in [tensors]", arg);
  return 0;
}

static int check_summary(pd_plan *pl, const uint64_t held[4]) {
  static const char *const keys[] = {"launches", "copies", "records", "waits"};
  for (int k = 0; k < 4; k++) {
    const char *v = pair(pl, pl->summary, 0, keys[k]);
    if (!v || !is_uint(v))
      return fail(pl, pl->lines[pl->summary].no, "the summary has no number of %s", keys[k]);
    if (strtoull(v, NULL, 10) != held[k])
      return fail(pl, pl->lines[pl->summary].no, "the summary says %s %s, the streams hold %" PRIu64, keys[k], v,
                  held[k]);
  }
  return 0;
}

/* Builds the op table and checks that every name a line uses is defined:
 * a text edited by hand fails here, at the line, and not in the diff. */
static int index_plan(pd_plan *pl) {
  if (sort_unique(pl, &pl->params, "param") || sort_unique(pl, &pl->devices, "device") ||
      sort_unique(pl, &pl->streams, "stream") || sort_unique(pl, &pl->tensors, "tensor") ||
      sort_unique(pl, &pl->code, "code object") || sort_unique(pl, &pl->kernels, "kernel"))
    return -1;
  if (pl->edges.n) qsort_r(pl->edges.v, (size_t)pl->edges.n, sizeof *pl->edges.v, cmp_line_text, pl);

  for (int i = 0; i < pl->streams.n; i++) {
    int l = pl->streams.v[i];
    const char *name = tok(pl, l, 0);
    if (find_n(pl, &pl->devices, name, (size_t)(strchr(name, '.') - name)) < 0)
      return fail(pl, pl->lines[l].no, "stream %s: no such device in [devices]", name);
    if (find_stream(pl, name) < 0) return fail(pl, pl->lines[l].no, "stream %s has no [stream %s] section", name, name);
  }
  for (int s = 0; s < pl->nsst; s++) {
    if (find(pl, &pl->streams, pl->sst[s].name) < 0)
      return fail(pl, pl->lines[pl->sst[s].header].no, "[stream %s]: no such stream in [streams]", pl->sst[s].name);
    for (int t = 0; t < s; t++)
      if (strcmp(pl->sst[t].name, pl->sst[s].name) == 0)
        return fail(pl, pl->lines[pl->sst[s].header].no, "[stream %s] again", pl->sst[s].name);
  }
  for (int i = 0; i < pl->tensors.n; i++) {
    int l = pl->tensors.v[i];
    const char *place = tok(pl, l, 4), *view = pair(pl, l, 6, "view");
    if (strcmp(place, "unplaced") && find_n(pl, &pl->devices, place, (size_t)(strrchr(place, '+') - place)) < 0)
      return fail(pl, pl->lines[l].no, "tensor %s: no such device in '%s'", tok(pl, l, 0), place);
    if (view && find(pl, &pl->tensors, view) < 0)
      return fail(pl, pl->lines[l].no, "tensor %s: a view of %s, which is not in [tensors]", tok(pl, l, 0), view);
  }

  /* the op table, by path */
  uint64_t held[4] = {0, 0, 0, 0};
  size_t ncmds = 0;
  for (int s = 0; s < pl->nsst; s++) ncmds += (size_t)pl->sst[s].cmds.n;
  pl->ops = xrealloc(NULL, ncmds * sizeof *pl->ops);
  for (int s = 0; s < pl->nsst; s++)
    for (int k = 0; k < pl->sst[s].cmds.n; k++) {
      int l = pl->sst[s].cmds.v[k];
      const char *t0 = tok(pl, l, 0);
      int kind = t0[0] == 'l' ? 0 : t0[0] == 'c' ? 1 : t0[0] == 'r' ? 2 : 3;
      held[kind]++;
      if (kind > 1) continue;
      pl->ops[pl->nops++] =
          (pd_op){.path = tok(pl, l, 1), .stream = s, .line = l, .pos = pl->sst[s].nops++, .copy = kind};
    }
  if (check_summary(pl, held)) return -1;
  if (pl->nops) qsort(pl->ops, (size_t)pl->nops, sizeof *pl->ops, cmp_op);
  for (int i = 1; i < pl->nops; i++)
    if (strcmp(pl->ops[i].path, pl->ops[i - 1].path) == 0) {
      int a = pl->ops[i - 1].line, b = pl->ops[i].line;
      return fail(pl, pl->lines[a > b ? a : b].no, "op %s issued twice (also line %d)", pl->ops[i].path,
                  pl->lines[a < b ? a : b].no);
    }
  for (int s = 0; s < pl->nsst; s++) pl->sst[s].ops = xrealloc(NULL, (size_t)pl->sst[s].nops * sizeof(int));
  for (int i = 0; i < pl->nops; i++) pl->sst[pl->ops[i].stream].ops[pl->ops[i].pos] = i;

  /* commands: kernels, operands, events */
  for (int s = 0; s < pl->nsst; s++) {
    const char *prev = "(start)";
    for (int k = 0; k < pl->sst[s].cmds.n; k++) {
      int l = pl->sst[s].cmds.v[k], no = pl->lines[l].no;
      const char *t0 = tok(pl, l, 0);
      if (strcmp(t0, "launch") == 0) {
        if (find(pl, &pl->kernels, tok(pl, l, 2)) < 0)
          return fail(pl, no, "launch %s: kernel %s is not in [kernels]", tok(pl, l, 1), tok(pl, l, 2));
        for (int j = 3; j < ntok(pl, l); j++)
          if (check_operand(pl, l, tok(pl, l, j))) return -1;
        prev = tok(pl, l, 1);
      } else if (strcmp(t0, "copy") == 0) {
        if (check_operand(pl, l, tok(pl, l, 2)) || check_operand(pl, l, tok(pl, l, 4))) return -1;
        prev = tok(pl, l, 1);
      } else if (strcmp(t0, "record") == 0) {
        if (strcmp(tok(pl, l, 2), prev))
          return fail(pl, no, "'record after %s' follows %s on stream %s", tok(pl, l, 2), prev, pl->sst[s].name);
      } else {
        int w = find_stream(pl, tok(pl, l, 1)), found = 0;
        if (w < 0) return fail(pl, no, "wait: no stream %s", tok(pl, l, 1));
        for (int j = 0; j < pl->sst[w].cmds.n && !found; j++) {
          int r = pl->sst[w].cmds.v[j];
          found = strcmp(tok(pl, r, 0), "record") == 0 && strcmp(tok(pl, r, 2), tok(pl, l, 3)) == 0;
        }
        if (!found) return fail(pl, no, "wait: stream %s has no 'record after %s'", tok(pl, l, 1), tok(pl, l, 3));
      }
    }
  }
  for (int i = 0; i < pl->edges.n; i++) {
    int l = pl->edges.v[i];
    for (int j = 0; j <= 2; j += 2)
      if (find_op(pl, tok(pl, l, j)) < 0)
        return fail(pl, pl->lines[l].no, "edge: no stream issues op %s", tok(pl, l, j));
    if (find(pl, &pl->tensors, tok(pl, l, 4)) < 0)
      return fail(pl, pl->lines[l].no, "edge: no such tensor %s", tok(pl, l, 4));
  }
  return 0;
}

/* ---- loading ---- */

static void plan_free_parsed(pd_plan *pl) {
  free(pl->text);
  free(pl->toks);
  free(pl->lines);
  free(pl->tokoff);
  free(pl->version);
  free(pl->model);
  free(pl->schedule);
  free(pl->params.v);
  free(pl->devices.v);
  free(pl->streams.v);
  free(pl->tensors.v);
  free(pl->code.v);
  free(pl->kernels.v);
  free(pl->edges.v);
  for (int s = 0; s < pl->nsst; s++) {
    free(pl->sst[s].cmds.v);
    free(pl->sst[s].ops);
  }
  free(pl->sst);
  for (int s = 0; s < pl->nother; s++) free(pl->other[s].lines.v);
  free(pl->other);
  free(pl->ops);
}

static int read_file(pd_plan *pl, const char *path, char **out, size_t *out_len) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    snprintf(pl->err, sizeof pl->err, "ds4c: error: %s: %s", path, strerror(errno));
    return -1;
  }
  char *buf = NULL;
  size_t len = 0, cap = 0;
  for (;;) {
    if (len + 65536 > cap) {
      cap = cap ? 2 * cap : 1 << 20;
      buf = xrealloc(buf, cap + 1);
    }
    size_t got = fread(buf + len, 1, cap - len, f);
    len += got;
    if (got == 0) break;
  }
  int bad = ferror(f) ? (errno ? errno : EIO) : 0;
  fclose(f);
  if (bad) {
    free(buf);
    snprintf(pl->err, sizeof pl->err, "ds4c: error: %s: %s", path, strerror(bad));
    return -1;
  }
  buf[len] = 0;
  *out = buf;
  *out_len = len;
  return 0;
}

/* A bundle folder (its plan.ds4p), a binary plan (the magic) or a text. */
static int load(pd_plan *pl, const char *path) {
  memset(pl, 0, sizeof *pl);
  pl->name = path;
  struct stat sb;
  if (stat(path, &sb) != 0) {
    snprintf(pl->err, sizeof pl->err, "ds4c: error: %s: %s", path, strerror(errno));
    return -1;
  }
  char file[4096];
  size_t n = strlen(path);
  while (S_ISDIR(sb.st_mode) && n > 1 && path[n - 1] == '/') n--;
  snprintf(file, sizeof file, S_ISDIR(sb.st_mode) ? "%.*s/plan.ds4p" : "%.*s", (int)n, path);
  char *bytes;
  size_t len;
  if (read_file(pl, file, &bytes, &len)) return -1;
  int binary = len >= strlen(PLAN_MAGIC) && memcmp(bytes, PLAN_MAGIC, strlen(PLAN_MAGIC)) == 0;
  if (!binary && S_ISDIR(sb.st_mode)) {
    free(bytes);
    snprintf(pl->err, sizeof pl->err, "ds4c: error: %s: not a binary plan (no %s magic)", file, PLAN_MAGIC);
    return -1;
  }
  if (binary) {
    plan p;
    rt_status st = plan_decode(file, (const uint8_t *)bytes, len, &p);
    free(bytes);
    if (st) {
      snprintf(pl->err, sizeof pl->err, "ds4c: error: %s", rt_status_msg(st));
      rt_status_free(st);
      return -1;
    }
    FILE *f = open_memstream(&bytes, &len);
    if (!f) abort();
    plan_text_write(&p, f);
    if (fclose(f)) abort();
    plan_free(&p);
    pl->rendered = 1;
  }
  pl->text = bytes;
  pl->len = len;
  pl->toks = xrealloc(NULL, len + 1);
  memcpy(pl->toks, bytes, len + 1);
  return parse_text(pl) || index_plan(pl) ? -1 : 0;
}

/* ---- devices matched across a rename ---- */

/* A device of B that no device of A is named as, with the backend, arch
 * and ordinal of a device of A that B does not name: the same device
 * under another name. */
typedef struct pd_rename {
  char *from, *to; /* B's name, A's name */
} pd_rename;

#define PD_MAX_RENAMES 16

static int same_device(const pd_plan *a, int la, const pd_plan *b, int lb) {
  static const char *const keys[] = {"backend", "arch", "ordinal"};
  for (int k = 0; k < 3; k++) {
    const char *x = pair(a, la, 1, keys[k]), *y = pair(b, lb, 1, keys[k]);
    if (!x || !y || strcmp(x, y)) return 0;
  }
  return 1;
}

static int match_devices(const pd_plan *a, const pd_plan *b, pd_rename *out) {
  int n = 0;
  for (int i = 0; i < b->devices.n && n < PD_MAX_RENAMES; i++) {
    int lb = b->devices.v[i];
    if (find(a, &a->devices, tok(b, lb, 0)) >= 0) continue;
    for (int j = 0; j < a->devices.n; j++) {
      int la = a->devices.v[j], taken = 0;
      if (find(b, &b->devices, tok(a, la, 0)) >= 0 || !same_device(a, la, b, lb)) continue;
      for (int k = 0; k < n; k++) taken |= strcmp(out[k].to, tok(a, la, 0)) == 0;
      if (taken) continue;
      out[n].from = strdup(tok(b, lb, 0));
      out[n].to = strdup(tok(a, la, 0));
      if (!out[n].from || !out[n].to) abort();
      n++;
      break;
    }
  }
  return n;
}

/* The rename of the device word w (len bytes) of B's text stands for: the
 * first word of a [devices] line, or the device part of a stream
 * (DEVICE.STREAM, one of B's [streams], also as "[stream DEVICE.STREAM]")
 * or of a placement (DEVICE+OFFSET); NULL for any other word. */
static const pd_rename *renamed(const pd_plan *b, const char *w, size_t len, int device_line, const pd_rename *rn,
                                int n) {
  for (int i = 0; i < n; i++) {
    size_t l = strlen(rn[i].from);
    if (len < l || memcmp(w, rn[i].from, l) != 0) continue;
    if (len == l && device_line) return &rn[i];
    if (len > l + 1 && w[l] == '+' && is_uint_n(w + l + 1, len - l - 1)) return &rn[i];
    if (len > l + 1 && w[l] == '.') {
      size_t sl = w[len - 1] == ']' ? len - 1 : len;
      char name[512];
      if (sl >= sizeof name) continue;
      memcpy(name, w, sl);
      name[sl] = 0;
      if (find(b, &b->streams, name) >= 0) return &rn[i];
    }
  }
  return NULL;
}

static int name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

/* Word w of B's text under the renames, to f: a device word renamed, and
 * in any other word each "@DEVICE" (a tensor's or a copy's copy on that
 * device) that ends where the name does. */
static void write_word(FILE *f, const pd_plan *b, const char *w, size_t len, int device_line, const pd_rename *rn,
                       int n) {
  const pd_rename *r = renamed(b, w, len, device_line, rn, n);
  if (r) {
    fprintf(f, "%s%.*s", r->to, (int)(len - strlen(r->from)), w + strlen(r->from));
    return;
  }
  for (size_t i = 0; i < len; i++) {
    int done = 0;
    for (int k = 0; k < n && w[i] == '@' && !done; k++) {
      size_t l = strlen(rn[k].from);
      if (i + 1 + l <= len && memcmp(w + i + 1, rn[k].from, l) == 0 && (i + 1 + l == len || !name_char(w[i + 1 + l]))) {
        fprintf(f, "@%s", rn[k].to);
        i += l;
        done = 1;
      }
    }
    if (!done) fputc(w[i], f);
  }
}

/* B's text with its devices renamed to A's names, parsed again. */
static int apply_renames(pd_plan *b, const pd_rename *rn, int n) {
  char *out = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&out, &len);
  if (!f) abort();
  int devices = 0;
  for (size_t c = 0; c < b->len;) {
    size_t e = c;
    while (e < b->len && b->text[e] != '\n' && b->text[e]) e++; /* parsing ends lines with NUL */
    const char *line = b->text + c;
    if (line[0] == '[') devices = e - c == 9 && memcmp(line, "[devices]", 9) == 0;
    for (size_t w = c; w < e;) {
      if (b->text[w] == ' ') {
        fputc(' ', f);
        w++;
        continue;
      }
      size_t we = w;
      while (we < e && b->text[we] != ' ') we++;
      write_word(f, b, b->text + w, we - w, devices && w == c, rn, n);
      w = we;
    }
    if (e < b->len) fputc('\n', f);
    c = e + 1;
  }
  if (fclose(f)) abort();
  const char *name = b->name;
  int rendered = b->rendered;
  plan_free_parsed(b);
  memset(b, 0, sizeof *b);
  b->name = name;
  b->rendered = rendered;
  b->text = out;
  b->len = len;
  b->toks = xrealloc(NULL, len + 1);
  memcpy(b->toks, out, len + 1);
  return parse_text(b) || index_plan(b) ? -1 : 0;
}

/* ---- the report ---- */

enum { CAT_KERNELS, CAT_EDGES, CAT_COPIES, CAT_PLACEMENT, CAT_MEMORY, CAT_PARAMS, CAT_OTHER, CAT_ORDER, CAT_EVENTS,
       NCAT };
static const char *const cat_heading[NCAT] = {"kernels (math)", "dependency edges", "copies", "placement",
                                              "memory", "params", "other sections", "per-stream order", "events"};

typedef struct pd_item {
  int cat, group; /* group: the kind of thing within a category, listed in turn */
  char *key, *text;
} pd_item;

typedef struct pd_report {
  pd_item *v;
  int n, cap;
  int count[NCAT];
} pd_report;

__attribute__((format(printf, 5, 6))) static void item(pd_report *r, int cat, int group, const char *key,
                                                       const char *fmt, ...) {
  if (r->n == r->cap) {
    r->cap = r->cap ? 2 * r->cap : 64;
    r->v = xrealloc(r->v, (size_t)r->cap * sizeof *r->v);
  }
  va_list ap;
  va_start(ap, fmt);
  char *text;
  if (vasprintf(&text, fmt, ap) < 0) abort();
  va_end(ap);
  char *k = strdup(key);
  if (!k) abort();
  r->v[r->n++] = (pd_item){cat, group, k, text};
  r->count[cat]++;
}

static int cmp_item(const void *x, const void *y) {
  const pd_item *a = x, *b = y;
  if (a->cat != b->cat) return a->cat - b->cat;
  if (a->group != b->group) return a->group - b->group;
  int c = strcmp(a->key, b->key);
  return c ? c : strcmp(a->text, b->text);
}

/* A growing string for one item's text. */
typedef struct pd_buf {
  char *s;
  size_t n;
  FILE *f;
} pd_buf;

static void buf_open(pd_buf *b) {
  b->f = open_memstream(&b->s, &b->n);
  if (!b->f) abort();
}

static char *buf_close(pd_buf *b) {
  if (fclose(b->f)) abort();
  return b->s;
}

/* The pairs of two lines, from token `first` on, that differ, as
 * "key old -> new, ..." into f after the n differences already there,
 * every key but `skip` when set. Returns n plus how many differ. */
static int pairs_diff(const pd_plan *a, int la, const pd_plan *b, int lb, int first, const char *skip, FILE *f,
                      int n) {
  for (int side = 0; side < 2; side++) {
    const pd_plan *p = side ? b : a, *q = side ? a : b;
    int lp = side ? lb : la, lq = side ? la : lb;
    for (int i = first; i + 1 < ntok(p, lp); i += 2) {
      const char *k = tok(p, lp, i), *vp = tok(p, lp, i + 1), *vq = pair(q, lq, first, k);
      if (skip && strcmp(k, skip) == 0) continue;
      if (side && vq) continue; /* compared from a's side */
      if (vq && strcmp(vp, vq) == 0) continue;
      fprintf(f, "%s%s %s -> %s", n++ ? ", " : "", k, side ? "(none)" : vp, side ? vp : vq ? vq : "(none)");
    }
  }
  return n;
}

typedef void (*pd_walk_fn)(pd_report *r, const pd_plan *a, int la, const pd_plan *b, int lb);

/* Both sections sorted by name (or by the whole line); fn sees each name
 * with its line on each side, -1 where a side lacks it. */
static void walk(pd_report *r, const pd_plan *a, const pd_list *A, const pd_plan *b, const pd_list *B, int by_line,
                 pd_walk_fn fn) {
  int i = 0, j = 0;
  while (i < A->n || j < B->n) {
    int c;
    if (i == A->n) c = 1;
    else if (j == B->n) c = -1;
    else if (by_line) c = strcmp(line_text(a, A->v[i]), line_text(b, B->v[j]));
    else c = strcmp(tok(a, A->v[i], 0), tok(b, B->v[j], 0));
    fn(r, a, c <= 0 ? A->v[i] : -1, b, c >= 0 ? B->v[j] : -1);
    if (c <= 0) i++;
    if (c >= 0) j++;
  }
}

static const char *key_of(const pd_plan *a, int la, const pd_plan *b, int lb) {
  return la >= 0 ? tok(a, la, 0) : tok(b, lb, 0);
}

static void on_param(pd_report *r, const pd_plan *a, int la, const pd_plan *b, int lb) {
  const char *k = key_of(a, la, b, lb);
  if (la < 0) item(r, CAT_PARAMS, 1, k, "+ %s", line_text(b, lb));
  else if (lb < 0) item(r, CAT_PARAMS, 1, k, "- %s", line_text(a, la));
  else if (strcmp(tok(a, la, 2), tok(b, lb, 2)))
    item(r, CAT_PARAMS, 1, k, "~ %s = %s -> %s", k, tok(a, la, 2), tok(b, lb, 2));
}

static void on_device(pd_report *r, const pd_plan *a, int la, const pd_plan *b, int lb) {
  const char *k = key_of(a, la, b, lb);
  if (la < 0 || lb < 0) {
    const pd_plan *p = la < 0 ? b : a;
    int l = la < 0 ? lb : la;
    char sign = la < 0 ? '+' : '-';
    item(r, CAT_PLACEMENT, 0, k, "%c device %s", sign, line_text(p, l));
    item(r, CAT_MEMORY, 0, k, "%c arena %s %s", sign, k, pair(p, l, 1, "arena"));
    return;
  }
  pd_buf buf;
  buf_open(&buf);
  int n = pairs_diff(a, la, b, lb, 1, "arena", buf.f, 0);
  char *s = buf_close(&buf);
  if (n) item(r, CAT_PLACEMENT, 0, k, "~ device %s: %s", k, s);
  free(s);
  uint64_t x = strtoull(pair(a, la, 1, "arena"), NULL, 10), y = strtoull(pair(b, lb, 1, "arena"), NULL, 10);
  if (x != y)
    item(r, CAT_MEMORY, 0, k, "~ arena %s: %" PRIu64 " -> %" PRIu64 " (%s%" PRIu64 ")", k, x, y, y > x ? "+" : "-",
         y > x ? y - x : x - y);
}

static void on_stream(pd_report *r, const pd_plan *a, int la, const pd_plan *b, int lb) {
  const char *k = key_of(a, la, b, lb);
  if (la < 0) item(r, CAT_PLACEMENT, 1, k, "+ stream %s", k);
  else if (lb < 0) item(r, CAT_PLACEMENT, 1, k, "- stream %s", k);
}

/* A tensor's device, "unplaced" when it has none. */
static const char *tensor_device(const pd_plan *p, int l, char *buf, size_t n) {
  const char *place = tok(p, l, 4), *plus = strrchr(place, '+');
  snprintf(buf, n, "%.*s", plus ? (int)(plus - place) : (int)strlen(place), place);
  return buf;
}

static void on_tensor(pd_report *r, const pd_plan *a, int la, const pd_plan *b, int lb) {
  const char *k = key_of(a, la, b, lb);
  if (la < 0) {
    item(r, CAT_PLACEMENT, 3, k, "+ tensor %s", line_text(b, lb));
    return;
  }
  if (lb < 0) {
    item(r, CAT_PLACEMENT, 3, k, "- tensor %s", line_text(a, la));
    return;
  }
  static const char *const field[] = {NULL, "dtype", "shape", "role"};
  char da[256], db[256];
  int moved = strcmp(tensor_device(a, la, da, sizeof da), tensor_device(b, lb, db, sizeof db)) != 0;
  pd_buf buf;
  buf_open(&buf);
  int n = 0;
  for (int i = 1; i <= 3; i++)
    if (strcmp(tok(a, la, i), tok(b, lb, i)))
      fprintf(buf.f, "%s%s %s -> %s", n++ ? ", " : "", field[i], tok(a, la, i), tok(b, lb, i));
  if (moved) fprintf(buf.f, "%sdevice %s -> %s", n++ ? ", " : "", tok(a, la, 4), tok(b, lb, 4));
  if (moved && strcmp(tok(a, la, 5), tok(b, lb, 5)))
    fprintf(buf.f, ", bytes %s -> %s", tok(a, la, 5), tok(b, lb, 5)); /* memory lists a tensor that stays */
  n = pairs_diff(a, la, b, lb, 6, NULL, buf.f, n);
  char *s = buf_close(&buf);
  if (n) item(r, CAT_PLACEMENT, 3, k, "~ tensor %s: %s", k, s);
  free(s);
  if (!moved && (strcmp(tok(a, la, 4), tok(b, lb, 4)) || strcmp(tok(a, la, 5), tok(b, lb, 5))))
    item(r, CAT_MEMORY, 1, k, "~ tensor %s: %s %s -> %s %s", k, tok(a, la, 4), tok(a, la, 5), tok(b, lb, 4),
         tok(b, lb, 5));
}

/* A [code] or [kernels] line (`what`): added, removed, or its fields
 * changed, listed under kernels in item group `group`. */
static void kernel_line(pd_report *r, const pd_plan *a, int la, const pd_plan *b, int lb, const char *what,
                        int group) {
  const char *k = key_of(a, la, b, lb);
  if (la < 0) item(r, CAT_KERNELS, group, k, "+ %s %s", what, line_text(b, lb));
  else if (lb < 0) item(r, CAT_KERNELS, group, k, "- %s %s", what, line_text(a, la));
  else {
    pd_buf buf;
    buf_open(&buf);
    int n = pairs_diff(a, la, b, lb, 1, NULL, buf.f, 0);
    char *s = buf_close(&buf);
    if (n) item(r, CAT_KERNELS, group, k, "~ %s %s: %s", what, k, s);
    free(s);
  }
}

static void on_code(pd_report *r, const pd_plan *a, int la, const pd_plan *b, int lb) {
  kernel_line(r, a, la, b, lb, "code", 2);
}

static void on_kernel(pd_report *r, const pd_plan *a, int la, const pd_plan *b, int lb) {
  kernel_line(r, a, la, b, lb, "kernel", 1);
}

static void on_edge(pd_report *r, const pd_plan *a, int la, const pd_plan *b, int lb) {
  if (la >= 0 && lb >= 0) return;
  const pd_plan *p = la < 0 ? b : a;
  int l = la < 0 ? lb : la;
  item(r, CAT_EDGES, 0, line_text(p, l), "%c %s", la < 0 ? '+' : '-', line_text(p, l));
}

/* An op only one side issues: a launch (kernels) or a copy (copies). */
static void op_only(pd_report *r, const pd_plan *p, const pd_op *o, char sign) {
  const char *stream = p->sst[o->stream].name;
  if (o->copy) item(r, CAT_COPIES, 0, o->path, "%c copy %s on %s", sign, rest_text(p, o->line, 1), stream);
  else item(r, CAT_KERNELS, 0, o->path, "%c launch %s %s on %s", sign, o->path, tok(p, o->line, 2), stream);
}

static void diff_ops(pd_report *r, const pd_plan *a, const pd_plan *b) {
  int i = 0, j = 0;
  while (i < a->nops || j < b->nops) {
    int c = i == a->nops ? 1 : j == b->nops ? -1 : strcmp(a->ops[i].path, b->ops[j].path);
    if (c < 0) op_only(r, a, &a->ops[i++], '-');
    else if (c > 0) op_only(r, b, &b->ops[j++], '+');
    else {
      const pd_op *x = &a->ops[i++], *y = &b->ops[j++];
      const char *sx = a->sst[x->stream].name, *sy = b->sst[y->stream].name;
      if (x->copy != y->copy) {
        op_only(r, a, x, '-');
        op_only(r, b, y, '+');
        continue;
      }
      if (strcmp(sx, sy)) item(r, CAT_PLACEMENT, 2, x->path, "~ op %s: stream %s -> %s", x->path, sx, sy);
      if (x->copy) {
        if (strcmp(rest_text(a, x->line, 2), rest_text(b, y->line, 2)))
          item(r, CAT_COPIES, 0, x->path, "~ copy %s: %s => %s", x->path, rest_text(a, x->line, 2),
               rest_text(b, y->line, 2));
        continue;
      }
      if (strcmp(tok(a, x->line, 2), tok(b, y->line, 2)))
        item(r, CAT_KERNELS, 0, x->path, "~ op %s: kernel %s -> %s", x->path, tok(a, x->line, 2), tok(b, y->line, 2));
      const char *ox = ntok(a, x->line) > 3 ? rest_text(a, x->line, 3) : "";
      const char *oy = ntok(b, y->line) > 3 ? rest_text(b, y->line, 3) : "";
      if (strcmp(ox, oy)) item(r, CAT_KERNELS, 0, x->path, "~ op %s: operands %s => %s", x->path, ox, oy);
    }
  }
}

/* in[j] = 1 for the members of a longest increasing subsequence of the
 * distinct values p[0..n): the ops that kept their relative order. */
static int increasing_run(const int *p, int n, char *in) {
  if (n <= 0) return 0; /* and gcc -O1 then knows memset's size below is not negative */
  int *tail = xrealloc(NULL, (size_t)n * sizeof *tail), *prev = xrealloc(NULL, (size_t)n * sizeof *prev), len = 0;
  for (int j = 0; j < n; j++) {
    int lo = 0, hi = len;
    while (lo < hi) {
      int mid = (lo + hi) / 2;
      if (p[tail[mid]] < p[j]) lo = mid + 1;
      else hi = mid;
    }
    prev[j] = lo ? tail[lo - 1] : -1;
    tail[lo] = j;
    if (lo == len) len++;
  }
  memset(in, 0, (size_t)n);
  for (int j = len ? tail[len - 1] : -1; j >= 0; j = prev[j]) in[j] = 1;
  free(tail);
  free(prev);
  return len;
}

/* The op before position pos on a stream, "(start)" for the first. */
static const char *op_before(const pd_plan *p, const pd_stream *s, int pos) {
  return pos ? p->ops[s->ops[pos - 1]].path : "(start)";
}

enum { ORDER_CONTEXT = 3, ORDER_MOVED_SHOWN = 10 };

/* A stream's ops that both plans issue on it, in each plan's order: when
 * the orders differ, the first difference with a few ops around it, and
 * the ops that left the longest common order, with their neighbours. */
static void diff_order(pd_report *r, const pd_plan *a, const pd_stream *sa, const pd_plan *b, const pd_stream *sb) {
  int *ca = xrealloc(NULL, (size_t)sa->nops * sizeof *ca), *cb = xrealloc(NULL, (size_t)sb->nops * sizeof *cb);
  int *rank = xrealloc(NULL, (size_t)a->nops * sizeof *rank), n = 0, m = 0;
  for (int k = 0; k < sa->nops; k++) {
    const pd_op *o = &a->ops[sa->ops[k]];
    int ob = find_op(b, o->path);
    if (ob >= 0 && strcmp(b->sst[b->ops[ob].stream].name, sa->name) == 0) {
      rank[sa->ops[k]] = n;
      ca[n++] = sa->ops[k];
    }
  }
  for (int k = 0; k < sb->nops; k++) {
    int oa = find_op(a, b->ops[sb->ops[k]].path);
    if (oa >= 0 && strcmp(a->sst[a->ops[oa].stream].name, sb->name) == 0) cb[m++] = oa; /* as A's op */
  }
  int *p = xrealloc(NULL, (size_t)(m ? m : 1) * sizeof *p);
  for (int j = 0; j < m; j++) p[j] = rank[cb[j]];
  char *keep = xrealloc(NULL, (size_t)(m ? m : 1));
  int moved = m - increasing_run(p, m, keep), first = 0;
  if (moved) {
    while (p[first] == first) first++;
    pd_buf buf;
    buf_open(&buf);
    const pd_op *fa = &a->ops[ca[first]], *fb = &b->ops[find_op(b, a->ops[cb[first]].path)];
    fprintf(buf.f, "%s: %d of %d ops moved; first difference at A line %d, B line %d", sa->name, moved, n,
            a->lines[fa->line].no, b->lines[fb->line].no);
    if (first) fprintf(buf.f, "\n      both %s", a->ops[ca[first - 1]].path);
    for (int side = 0; side < 2; side++)
      for (int k = first; k < first + ORDER_CONTEXT && k < n; k++)
        fprintf(buf.f, "\n      %s    %s", side ? "B" : "A", a->ops[side ? cb[k] : ca[k]].path);
    int shown = 0;
    for (int j = 0; j < m; j++) {
      if (keep[j]) continue;
      if (shown++ == ORDER_MOVED_SHOWN) {
        fprintf(buf.f, "\n    ... and %d more moved", moved - ORDER_MOVED_SHOWN);
        break;
      }
      const pd_op *x = &a->ops[cb[j]], *y = &b->ops[find_op(b, x->path)];
      fprintf(buf.f, "\n    moved %s: after %s -> after %s", x->path, op_before(a, sa, x->pos),
              op_before(b, sb, y->pos));
    }
    char *s = buf_close(&buf);
    item(r, CAT_ORDER, 0, sa->name, "%s", s);
    free(s);
  }
  free(ca);
  free(cb);
  free(rank);
  free(p);
  free(keep);
}

/* An event command of a stream: "record after X" or "wait S after X", with
 * the op a wait holds back (the next one on its stream). */
typedef struct pd_event {
  char *key;
  const char *before;
  int seq;
} pd_event;

static int cmp_event(const void *x, const void *y) {
  const pd_event *a = x, *b = y;
  int c = strcmp(a->key, b->key);
  return c ? c : a->seq - b->seq;
}

static pd_event *events_of(const pd_plan *p, const pd_stream *s, int *out_n) {
  pd_event *ev = xrealloc(NULL, (size_t)(s->cmds.n ? s->cmds.n : 1) * sizeof *ev);
  int n = 0;
  for (int k = 0; k < s->cmds.n; k++) {
    int l = s->cmds.v[k];
    const char *t0 = tok(p, l, 0);
    if (strcmp(t0, "record") && strcmp(t0, "wait")) continue;
    const char *before = NULL;
    if (t0[0] == 'w') {
      before = "(end)";
      for (int j = k + 1; j < s->cmds.n; j++) {
        const char *tj = tok(p, s->cmds.v[j], 0);
        if (strcmp(tj, "launch") == 0 || strcmp(tj, "copy") == 0) {
          before = tok(p, s->cmds.v[j], 1);
          break;
        }
      }
    }
    ev[n] = (pd_event){strdup(line_text(p, l)), before, n};
    if (!ev[n].key) abort();
    n++;
  }
  if (n) qsort(ev, (size_t)n, sizeof *ev, cmp_event);
  *out_n = n;
  return ev;
}

static void diff_events(pd_report *r, const pd_plan *a, const pd_stream *sa, const pd_plan *b, const pd_stream *sb) {
  int na, nb, i = 0, j = 0;
  pd_event *ea = events_of(a, sa, &na), *eb = events_of(b, sb, &nb);
  while (i < na || j < nb) {
    int c = i == na ? 1 : j == nb ? -1 : strcmp(ea[i].key, eb[j].key);
    const pd_event *e = c <= 0 ? &ea[i] : &eb[j];
    char key[1024];
    snprintf(key, sizeof key, "%s %s", sa->name, e->key);
    if (c && e->before)
      item(r, CAT_EVENTS, 0, key, "%c %s: %s, before %s", c < 0 ? '-' : '+', sa->name, e->key, e->before);
    else if (c)
      item(r, CAT_EVENTS, 0, key, "%c %s: %s", c < 0 ? '-' : '+', sa->name, e->key);
    else if (e->before && strcmp(ea[i].before, eb[j].before))
      item(r, CAT_EVENTS, 0, key, "~ %s: %s, before %s -> before %s", sa->name, e->key, ea[i].before, eb[j].before);
    if (c <= 0) i++;
    if (c >= 0) j++;
  }
  for (int k = 0; k < na; k++) free(ea[k].key);
  for (int k = 0; k < nb; k++) free(eb[k].key);
  free(ea);
  free(eb);
}

static void diff_other(pd_report *r, const pd_plan *a, const pd_plan *b) {
  for (int side = 0; side < 2; side++) {
    const pd_plan *p = side ? b : a, *q = side ? a : b;
    for (int s = 0; s < p->nother; s++) {
      const pd_other *o = &p->other[s];
      const pd_other *oq = NULL;
      for (int t = 0; t < q->nother && !oq; t++)
        if (strcmp(q->other[t].name, o->name) == 0) oq = &q->other[t];
      for (int k = 0; k < o->lines.n; k++) {
        const char *t = line_text(p, o->lines.v[k]);
        int found = 0;
        for (int j = 0; oq && j < oq->lines.n && !found; j++) found = strcmp(line_text(q, oq->lines.v[j]), t) == 0;
        if (!found) item(r, CAT_OTHER, 0, o->name, "%c [%s] %s", side ? '+' : '-', o->name, t);
      }
      if (!oq && !o->lines.n) item(r, CAT_OTHER, 0, o->name, "%c [%s]", side ? '+' : '-', o->name);
    }
  }
}

static void diff_plans(pd_report *r, const pd_plan *a, const pd_plan *b) {
  pd_buf buf;
  buf_open(&buf);
  int n = pairs_diff(a, a->step, b, b->step, 1, NULL, buf.f, 0);
  char *s = buf_close(&buf);
  if (n) item(r, CAT_PARAMS, 0, "step", "~ step: %s", s);
  free(s);
  walk(r, a, &a->params, b, &b->params, 0, on_param);
  walk(r, a, &a->devices, b, &b->devices, 0, on_device);
  walk(r, a, &a->streams, b, &b->streams, 0, on_stream);
  walk(r, a, &a->tensors, b, &b->tensors, 0, on_tensor);
  walk(r, a, &a->code, b, &b->code, 0, on_code);
  walk(r, a, &a->kernels, b, &b->kernels, 0, on_kernel);
  walk(r, a, &a->edges, b, &b->edges, 1, on_edge);
  diff_ops(r, a, b);
  diff_other(r, a, b);
  for (int i = 0; i < a->streams.n; i++) {
    const char *name = tok(a, a->streams.v[i], 0); /* sorted by name */
    int sb = find_stream(b, name);
    if (sb < 0) continue;
    const pd_stream *x = &a->sst[find_stream(a, name)], *y = &b->sst[sb];
    diff_order(r, a, x, b, y);
    diff_events(r, a, x, b, y);
  }
}

static void print_side(FILE *out, const char *label, const pd_plan *p) {
  fprintf(out, "%s: %s (plan %s, model %s, schedule %s)\n", label, p->name, p->version, p->model, p->schedule);
}

static int print_report(FILE *out, const pd_plan *a, const pd_plan *b, pd_report *r, const pd_rename *rn,
                        int nrn) {
  print_side(out, "A", a);
  print_side(out, "B", b);
  for (int i = 0; i < nrn; i++)
    fprintf(out, "note: device %s -> %s (the same backend, arch and ordinal; compared as one device)\n", rn[i].to,
            rn[i].from);
  /* names and the text's version say nothing about what the plan does */
  if (strcmp(a->version, b->version))
    fprintf(out, "note: plan text version %s -> %s (a format change, not a change of the plan)\n", a->version,
            b->version);
  if (strcmp(a->model, b->model)) fprintf(out, "note: model %s -> %s\n", a->model, b->model);
  if (strcmp(a->schedule, b->schedule)) fprintf(out, "note: schedule %s -> %s\n", a->schedule, b->schedule);
  if (r->n) qsort(r->v, (size_t)r->n, sizeof *r->v, cmp_item);
  for (int i = 0; i < r->n; i++) {
    if (i == 0 || r->v[i].cat != r->v[i - 1].cat)
      fprintf(out, "\n%s: %d\n", cat_heading[r->v[i].cat], r->count[r->v[i].cat]);
    fprintf(out, "  %s\n", r->v[i].text);
  }
  int changed = 0;
  for (int c = 0; c < CAT_ORDER; c++) changed += r->count[c];
  if (changed) {
    fprintf(out, "\nchanged: %d kernels, %d edges, %d copies, %d placement, %d memory, %d params",
            r->count[CAT_KERNELS], r->count[CAT_EDGES], r->count[CAT_COPIES], r->count[CAT_PLACEMENT],
            r->count[CAT_MEMORY], r->count[CAT_PARAMS]);
    if (r->count[CAT_OTHER]) fprintf(out, ", %d other", r->count[CAT_OTHER]);
    fputc('\n', out);
    return PLAN_DIFF_CHANGED;
  }
  if (r->n) {
    fprintf(out, "\norder only: no edge, kernel or memory changes\n");
    return PLAN_DIFF_ORDER;
  }
  fprintf(out, "identical\n");
  return PLAN_DIFF_IDENTICAL;
}

static int diff_one(const char *a_path, const char *b_path, FILE *out, FILE *err) {
  pd_plan a, b;
  int rc = PLAN_DIFF_ERROR;
  memset(&b, 0, sizeof b);
  if (load(&a, a_path)) fprintf(err, "%s\n", a.err);
  else if (load(&b, b_path)) fprintf(err, "%s\n", b.err);
  else {
    pd_rename rn[PD_MAX_RENAMES];
    int nrn = match_devices(&a, &b, rn);
    if (nrn && apply_renames(&b, rn, nrn)) fprintf(err, "%s\n", b.err);
    else {
      pd_report r = {0};
      diff_plans(&r, &a, &b);
      rc = print_report(out, &a, &b, &r, rn, nrn);
      for (int i = 0; i < r.n; i++) {
        free(r.v[i].key);
        free(r.v[i].text);
      }
      free(r.v);
    }
    for (int i = 0; i < nrn; i++) {
      free(rn[i].from);
      free(rn[i].to);
    }
  }
  plan_free_parsed(&a);
  plan_free_parsed(&b);
  return rc;
}

/* A bundle folder with a decode plan (its decode/plan.ds4p). */
static int has_decode_plan(const char *path) {
  struct stat sb;
  char sub[4200];
  if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode)) return 0;
  snprintf(sub, sizeof sub, "%s/decode/plan.ds4p", path);
  return stat(sub, &sb) == 0;
}

int plan_diff(const char *a_path, const char *b_path, FILE *out, FILE *err) {
  int rc = diff_one(a_path, b_path, out, err);
  if (rc == PLAN_DIFF_ERROR || !has_decode_plan(a_path) || !has_decode_plan(b_path)) return rc;
  /* Two bundles: their decode plans too, the worse result of the two. */
  char a_sub[4200], b_sub[4200];
  snprintf(a_sub, sizeof a_sub, "%s/decode", a_path);
  snprintf(b_sub, sizeof b_sub, "%s/decode", b_path);
  fprintf(out, "\ndecode plans: %s and %s\n", a_sub, b_sub);
  int drc = diff_one(a_sub, b_sub, out, err);
  return drc > rc ? drc : rc;
}
