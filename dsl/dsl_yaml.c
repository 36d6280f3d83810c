/* dsl_yaml.c - turns YAML text into a small tree of positioned nodes using
 * libyaml's event parser (so that depth, anchors and duplicate keys are ours
 * to check), and the schema helpers both description loaders share. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <yaml.h>

#include "dsl_yaml.h"

static const dsl_pos no_pos = {NULL, 0, 0};

void dsl_source_free(dsl_source *src) {
  if (!src) return;
  free(src->path);
  free(src->text);
  free(src);
}

void dy_free(dy_node *n) {
  if (!n) return;
  for (int i = 0; i < n->nitems; i++) dy_free(n->items[i]);
  free(n->items);
  free(n->text);
  free(n);
}

static dsl_pos mark_pos(const dsl_source *src, yaml_mark_t m) {
  dsl_pos p = {src, (int)m.line + 1, (int)m.column + 1};
  return p;
}

/* libyaml reports reader errors (bad UTF-8, control characters) as a byte
 * offset; turn it into a line and a code-point column. */
static dsl_pos offset_pos(const dsl_source *src, size_t off) {
  dsl_pos p = {src, 1, 1};
  if (off > src->len) off = src->len;
  for (size_t i = 0; i < off; i++) {
    unsigned char c = (unsigned char)src->text[i];
    if (c == '\n') p.line++, p.col = 1;
    else if ((c & 0xc0) != 0x80) p.col++;
  }
  return p;
}

static int parser_error(yaml_parser_t *y, const dsl_source *src, dsl_diag *d) {
  const char *problem = y->problem ? y->problem : "unknown problem";
  switch (y->error) {
  case YAML_MEMORY_ERROR:
    return dsl_error(d, no_pos, "%s: out of memory", src->path);
  case YAML_READER_ERROR:
    return dsl_error(d, offset_pos(src, y->problem_offset), "malformed YAML: %s", problem);
  default:
    break;
  }
  dsl_pos at = mark_pos(src, y->problem_mark);
  if (y->context)
    return dsl_error(d, at, "malformed YAML: %s (%s that starts at line %d, column %d)", problem,
                     y->context, (int)y->context_mark.line + 1, (int)y->context_mark.column + 1);
  return dsl_error(d, at, "malformed YAML: %s", problem);
}

static int oom(const dsl_source *src, dsl_diag *d) {
  return dsl_error(d, no_pos, "%s: out of memory", src && src->path ? src->path : "dsl");
}

static int append(dy_node *parent, dy_node *child) {
  if (parent->nitems == parent->cap) {
    int cap = parent->cap ? parent->cap * 2 : 8;
    dy_node **items = dsl_realloc(parent->items, (size_t)cap * sizeof *items);
    if (!items) return -1;
    parent->items = items;
    parent->cap = cap;
  }
  parent->items[parent->nitems++] = child;
  return 0;
}

typedef struct key_ref {
  const dy_node *key;
  int index;
} key_ref;

static int cmp_key_ref(const void *a, const void *b) {
  const key_ref *x = a, *y = b;
  int c = strcmp(x->key->text, y->key->text);
  if (c) return c;
  return (x->index > y->index) - (x->index < y->index);
}

/* Reports the duplicate whose second occurrence comes first in the file.
 * Sorting keeps this O(n log n) for large free-form mappings. */
static int check_duplicates(const dy_node *map, const dsl_source *src, dsl_diag *d) {
  int n = map->n;
  if (n < 2) return 0;
  key_ref *refs = dsl_malloc((size_t)n * sizeof *refs);
  if (!refs) return oom(src, d);
  for (int i = 0; i < n; i++) refs[i].key = map->items[2 * i], refs[i].index = i;
  qsort(refs, (size_t)n, sizeof *refs, cmp_key_ref);
  int best = -1, first = -1, group = 0;
  for (int i = 1; i < n; i++) {
    if (strcmp(refs[i].key->text, refs[i - 1].key->text) != 0) {
      group = i;
      continue;
    }
    if (best < 0 || refs[i].index < best) best = refs[i].index, first = refs[group].index;
  }
  free(refs);
  if (best < 0) return 0;
  const dy_node *k = map->items[2 * best], *f = map->items[2 * first];
  return dsl_error(d, k->pos, "duplicate key '%.100s' (first at line %d, column %d)", k->text,
                   f->pos.line, f->pos.col);
}

/* "PATH: error: ...": the whole file is at fault, no line of it. */
static int too_big(dsl_diag *d, const char *path, unsigned long long len) {
  if (!d || d->failed) return -1;
  d->failed = 1;
  snprintf(d->msg, sizeof d->msg, "%.400s: error: description is %llu bytes; the limit is %zu (16 MiB)", path,
           len, DSL_MAX_FILE_BYTES);
  return -1;
}

int dy_parse(const char *path, const char *text, size_t len, dsl_source **out_src,
             dy_node **out_root, dsl_diag *d) {
  *out_src = NULL;
  *out_root = NULL;
  if (!path) path = "<input>";
  if (len > DSL_MAX_FILE_BYTES) return too_big(d, path, len);
  dsl_source *src = dsl_calloc(1, sizeof *src);
  if (!src) return oom(NULL, d);
  src->path = dsl_strndup(path, strlen(path));
  src->text = dsl_strndup(text ? text : "", text ? len : 0);
  src->len = text ? len : 0;
  if (!src->path || !src->text) {
    dsl_source_free(src);
    return oom(NULL, d);
  }

  yaml_parser_t y;
  if (!yaml_parser_initialize(&y)) {
    dsl_source_free(src);
    return oom(NULL, d);
  }
  yaml_parser_set_input_string(&y, (const unsigned char *)src->text, src->len);

  dy_node *root = NULL;
  dy_node *stack[DSL_MAX_DEPTH];
  int depth = 0, ndocs = 0, done = 0, rc = 0, nnodes = 0;
  while (!done && rc == 0) {
    yaml_event_t ev;
    if (!yaml_parser_parse(&y, &ev)) {
      rc = parser_error(&y, src, d);
      break;
    }
    dsl_pos at = mark_pos(src, ev.start_mark);
    dy_node *node = NULL;
    const char *anchor = NULL;
    switch (ev.type) {
    case YAML_STREAM_END_EVENT:
      done = 1;
      break;
    case YAML_DOCUMENT_START_EVENT:
      if (++ndocs > 1)
        rc = dsl_error(d, at, "a description is one YAML document; a second one starts here");
      break;
    case YAML_ALIAS_EVENT:
      rc = dsl_error(d, at, "YAML aliases (*%.100s) are not supported; write the value out",
                     (const char *)ev.data.alias.anchor);
      break;
    case YAML_SCALAR_EVENT:
    case YAML_SEQUENCE_START_EVENT:
    case YAML_MAPPING_START_EVENT:
      anchor = ev.type == YAML_SCALAR_EVENT ? (const char *)ev.data.scalar.anchor
               : ev.type == YAML_SEQUENCE_START_EVENT ? (const char *)ev.data.sequence_start.anchor
                                                      : (const char *)ev.data.mapping_start.anchor;
      if (anchor) {
        rc = dsl_error(d, at, "YAML anchors (&%.100s) are not supported; write the value out", anchor);
        break;
      }
      if (ev.type != YAML_SCALAR_EVENT && depth == DSL_MAX_DEPTH) {
        rc = dsl_error(d, at, "nesting is deeper than %d levels", DSL_MAX_DEPTH);
        break;
      }
      if (++nnodes > DSL_MAX_NODES) {
        rc = dsl_error(d, at, "more than %d YAML nodes (scalars, lists and mappings) in one description",
                       DSL_MAX_NODES);
        break;
      }
      node = dsl_calloc(1, sizeof *node);
      if (!node) {
        rc = oom(src, d);
        break;
      }
      node->pos = at;
      if (ev.type == YAML_SCALAR_EVENT) {
        node->kind = DY_SCALAR;
        node->plain = ev.data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
        node->text = dsl_strndup((const char *)ev.data.scalar.value, ev.data.scalar.length);
        if (!node->text) {
          dy_free(node);
          rc = oom(src, d);
          break;
        }
        if (strlen(node->text) != ev.data.scalar.length) {
          dy_free(node);
          rc = dsl_error(d, at, "scalar contains a NUL character");
          break;
        }
      } else {
        node->kind = ev.type == YAML_SEQUENCE_START_EVENT ? DY_SEQ : DY_MAP;
      }
      if (depth == 0) {
        root = node;
      } else {
        dy_node *parent = stack[depth - 1];
        if (parent->kind == DY_MAP && parent->nitems % 2 == 0 && node->kind != DY_SCALAR) {
          rc = dsl_error(d, at, "mapping keys must be scalars, not a %s",
                         node->kind == DY_SEQ ? "list" : "mapping");
          dy_free(node);
          break;
        }
        if (parent->nitems == (parent->kind == DY_MAP ? 2 : 1) * DSL_MAX_ENTRIES) {
          rc = dsl_error(d, at, "more than %d entries in one %s", DSL_MAX_ENTRIES,
                         parent->kind == DY_MAP ? "mapping" : "list");
          dy_free(node);
          break;
        }
        if (append(parent, node)) {
          dy_free(node);
          rc = oom(src, d);
          break;
        }
      }
      if (node->kind != DY_SCALAR) stack[depth++] = node;
      break;
    case YAML_SEQUENCE_END_EVENT:
    case YAML_MAPPING_END_EVENT: {
      if (depth == 0) { /* libyaml balances its events; never trust that blindly */
        rc = dsl_error(d, at, "malformed YAML: unbalanced end of a collection");
        break;
      }
      dy_node *done_node = stack[--depth];
      if (done_node->kind == DY_MAP) {
        done_node->n = done_node->nitems / 2;
        rc = check_duplicates(done_node, src, d);
      } else {
        done_node->n = done_node->nitems;
      }
      break;
    }
    default:
      break;
    }
    yaml_event_delete(&ev);
  }
  yaml_parser_delete(&y);
  if (rc == 0 && !root)
    rc = dsl_error(d, (dsl_pos){src, 1, 1}, "empty description: the file holds no YAML document");
  if (rc) {
    dy_free(root);
    dsl_source_free(src);
    return -1;
  }
  *out_src = src;
  *out_root = root;
  return 0;
}

int dy_read_file(const char *path, char **out_text, size_t *out_len, dsl_diag *d) {
  *out_text = NULL;
  *out_len = 0;
  /* O_NONBLOCK: opening a FIFO for reading would otherwise wait for a
   * writer; it is refused below as not a regular file, which reads ignore
   * the flag for. */
  int fd = open(path, O_RDONLY | O_NONBLOCK);
  if (fd < 0) return dsl_error(d, no_pos, "cannot open '%s': %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    return dsl_error(d, no_pos, "cannot stat '%s': %s", path, strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return dsl_error(d, no_pos, "'%s' is not a regular file", path);
  }
  if ((unsigned long long)st.st_size > DSL_MAX_FILE_BYTES) { /* before reading a byte */
    close(fd);
    return too_big(d, path, (unsigned long long)st.st_size);
  }
  size_t len = (size_t)st.st_size;
  char *text = dsl_malloc(len + 1);
  if (!text) {
    close(fd);
    return dsl_error(d, no_pos, "%s: out of memory", path);
  }
  size_t got = 0;
  while (got < len) {
    ssize_t r = read(fd, text + got, len - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      int e = r < 0 ? errno : EIO;
      free(text);
      close(fd);
      return dsl_error(d, no_pos, "cannot read '%s': %s", path, r < 0 ? strerror(e) : "file shrank while reading");
    }
    got += (size_t)r;
  }
  close(fd);
  text[len] = 0;
  *out_text = text;
  *out_len = len;
  return 0;
}

/* ---- schema helpers ---- */

const char *dy_kind_name(const dy_node *n) {
  if (n->kind == DY_SEQ) return "list";
  if (n->kind == DY_MAP) return "mapping";
  return "scalar";
}

int dy_is_null(const dy_node *n) {
  if (n->kind != DY_SCALAR || !n->plain || !n->text) return 0;
  const char *t = n->text;
  return !*t || !strcmp(t, "~") || !strcmp(t, "null") || !strcmp(t, "Null") || !strcmp(t, "NULL");
}

int dy_is_ident(const char *s) {
  if (!s || !((*s >= 'A' && *s <= 'Z') || (*s >= 'a' && *s <= 'z') || *s == '_')) return 0;
  for (s++; *s; s++)
    if (!((*s >= 'A' && *s <= 'Z') || (*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') || *s == '_'))
      return 0;
  return 1;
}

/* "a, b, c" for messages; the lists are short and fixed. */
static void join(char *buf, size_t cap, const char *const *words) {
  size_t used = 0;
  buf[0] = 0;
  for (int i = 0; words[i]; i++) {
    int w = snprintf(buf + used, cap - used, "%s%s", i ? ", " : "", words[i]);
    if (w < 0 || (size_t)w >= cap - used) break;
    used += (size_t)w;
  }
}

const dy_node *dy_key_node(const dy_node *map, const char *key) {
  for (int i = 0; map->kind == DY_MAP && i < map->n; i++)
    if (strcmp(map->items[2 * i]->text, key) == 0) return map->items[2 * i];
  return NULL;
}

int dy_check_keys(const dy_node *map, const char *what, const char *const *keys, dsl_diag *d) {
  for (int i = 0; i < map->n; i++) {
    const dy_node *k = map->items[2 * i];
    int known = 0;
    for (int j = 0; keys[j] && !known; j++) known = strcmp(k->text, keys[j]) == 0;
    if (!known) {
      char list[512];
      join(list, sizeof list, keys);
      return dsl_error(d, k->pos, "unknown key '%.100s' in %s (expected one of: %s)", k->text, what, list);
    }
  }
  return 0;
}

dy_node *dy_get(const dy_node *map, const char *key) {
  if (map->kind != DY_MAP) return NULL;
  for (int i = 0; i < map->n; i++)
    if (strcmp(map->items[2 * i]->text, key) == 0) return map->items[2 * i + 1];
  return NULL;
}

dy_node *dy_need(const dy_node *map, const char *key, const char *what, dsl_diag *d) {
  dy_node *v = dy_get(map, key);
  if (!v) dsl_error(d, map->pos, "missing required key '%s' in %s", key, what);
  return v;
}

int dy_expect(const dy_node *n, dy_kind kind, const char *key, const char *what, dsl_diag *d) {
  if (n->kind == kind) return 0;
  /* an empty value where a list or mapping is expected is an empty one */
  if (kind != DY_SCALAR && dy_is_null(n)) return 0;
  static const char *names[] = {"scalar", "list", "mapping"};
  return dsl_error(d, n->pos, "'%s' in %s must be a %s, not a %s", key, what, names[kind],
                   dy_kind_name(n));
}

int dy_take_str(dy_node *n, const char *key, const char *what, dsl_str *out, dsl_diag *d) {
  if (dy_expect(n, DY_SCALAR, key, what, d)) return -1;
  if (dy_is_null(n) || !n->text[0]) return dsl_error(d, n->pos, "'%s' in %s must not be empty", key, what);
  out->text = n->text;
  out->pos = n->pos;
  n->text = NULL;
  return 0;
}

int dy_take_opt(const dy_node *map, const char *key, const char *what, dsl_str *out,
                dsl_diag *d) {
  dy_node *v = dy_get(map, key);
  return v ? dy_take_str(v, key, what, out, d) : 0;
}

int dy_take_req(const dy_node *map, const char *key, const char *what, dsl_str *out,
                dsl_diag *d) {
  dy_node *v = dy_need(map, key, what, d);
  return v ? dy_take_str(v, key, what, out, d) : -1;
}

int dy_take_list(dy_node *n, const char *key, const char *what, dsl_str **out, int *out_n,
                 dsl_diag *d) {
  if (dy_expect(n, DY_SEQ, key, what, d)) return -1;
  if (n->kind != DY_SEQ || n->n == 0) return 0;
  dsl_str *a = dsl_calloc((size_t)n->n, sizeof *a);
  if (!a) return oom(n->pos.src, d);
  *out = a;
  *out_n = n->n; /* set first so that the caller frees a partial list */
  for (int i = 0; i < n->n; i++) {
    dy_node *e = n->items[i];
    if (e->kind != DY_SCALAR)
      return dsl_error(d, e->pos, "entries of '%s' in %s must be scalars, not a %s", key, what,
                       dy_kind_name(e));
    if (dy_take_str(e, key, what, &a[i], d)) return -1;
  }
  return 0;
}

static int take_kvs(dy_node *n, const char *key, const char *what, int nested, dsl_kv **out, int *out_n,
                    dsl_diag *d) {
  if (dy_expect(n, DY_MAP, key, what, d)) return -1;
  if (n->kind != DY_MAP || n->n == 0) return 0;
  dsl_kv *a = dsl_calloc((size_t)n->n, sizeof *a);
  if (!a) return oom(n->pos.src, d);
  *out = a;
  *out_n = n->n;
  for (int i = 0; i < n->n; i++) {
    dy_node *k = n->items[2 * i], *v = n->items[2 * i + 1];
    if (dy_take_str(k, key, what, &a[i].key, d)) return -1;
    if (nested && v->kind == DY_MAP) {
      a[i].value.pos = v->pos;
      if (v->n == 0) return dsl_error(d, v->pos, "the value of '%.100s' in '%s' must not be empty", a[i].key.text, key);
      if (take_kvs(v, a[i].key.text, key, 0, &a[i].fields, &a[i].nfields, d)) return -1;
      continue;
    }
    if (v->kind != DY_SCALAR)
      return dsl_error(d, v->pos, "the value of '%.100s' in '%s' must be a scalar%s, not a %s", a[i].key.text,
                       key, nested ? " or a mapping" : "", dy_kind_name(v));
    if (dy_is_null(v) || !v->text[0])
      return dsl_error(d, v->pos, "the value of '%.100s' in '%s' must not be empty", a[i].key.text, key);
    if (dy_take_str(v, key, what, &a[i].value, d)) return -1;
  }
  return 0;
}

int dy_take_kvs(dy_node *n, const char *key, const char *what, dsl_kv **out, int *out_n,
                dsl_diag *d) {
  return take_kvs(n, key, what, 0, out, out_n, d);
}

int dy_take_params(dy_node *n, const char *what, dsl_kv **out, int *out_n, dsl_diag *d) {
  return take_kvs(n, "params", what, 1, out, out_n, d);
}

int dy_check_choice(const dsl_str *s, const char *key, const char *const *choices, dsl_diag *d) {
  for (int i = 0; choices[i]; i++)
    if (strcmp(s->text, choices[i]) == 0) return 0;
  char list[512];
  join(list, sizeof list, choices);
  return dsl_error(d, s->pos, "unknown %s '%.100s' (expected one of: %s)", key, s->text, list);
}

int dy_check_int(const dsl_str *s, const char *key, long long min, dsl_diag *d) {
  const char *t = s->text;
  const char *p = t + (*t == '-' || *t == '+');
  int ok = *p >= '0' && *p <= '9';
  for (; ok && *p; p++) ok = *p >= '0' && *p <= '9';
  long long v = 0;
  if (ok) {
    errno = 0;
    v = strtoll(t, NULL, 10);
    ok = errno == 0 && v >= min;
  }
  if (ok) return 0;
  if (min == 0) return dsl_error(d, s->pos, "'%s' must be an integer >= 0, not '%.100s'", key, t);
  if (min == 1) return dsl_error(d, s->pos, "'%s' must be an integer >= 1, not '%.100s'", key, t);
  return dsl_error(d, s->pos, "'%s' must be an integer, not '%.100s'", key, t);
}

int dy_check_number(const dsl_str *s, const char *key, int min_kind, dsl_diag *d) {
  char *end;
  errno = 0;
  double v = strtod(s->text, &end);
  int ok = end != s->text && *end == 0 && errno == 0 && isfinite(v);
  /* strtod takes hex floats, "inf" and "nan"; descriptions are decimal */
  for (const char *p = s->text; ok && *p; p++)
    ok = (*p >= '0' && *p <= '9') || *p == '.' || *p == 'e' || *p == 'E' || *p == '-' || *p == '+';
  if (ok && min_kind == 1) ok = v >= 0;
  if (ok && min_kind == 2) ok = v > 0;
  if (ok) return 0;
  const char *kind = min_kind == 2 ? "a positive number" : min_kind == 1 ? "a number >= 0" : "a number";
  return dsl_error(d, s->pos, "'%s' must be %s, not '%.100s'", key, kind, s->text);
}

void dsl_str_free(dsl_str *s) {
  if (!s) return;
  free(s->text);
  s->text = NULL;
}

void dsl_strs_free(dsl_str *s, int n) {
  if (!s) return;
  for (int i = 0; i < n; i++) free(s[i].text);
  free(s);
}

void dsl_kvs_free(dsl_kv *kv, int n) {
  if (!kv) return;
  for (int i = 0; i < n; i++) {
    free(kv[i].key.text);
    free(kv[i].value.text);
    dsl_kvs_free(kv[i].fields, kv[i].nfields);
  }
  free(kv);
}
