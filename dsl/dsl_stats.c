/* dsl_stats.c - loads a routing statistics file, the one `ds4run
 * --routing-stats` writes (docs/RUNTIME.md), into dsl_routing_stats, with
 * the position of every key and list so that the compiler's complaints
 * about it point into the file. */
#include <stdlib.h>
#include <string.h>

#include "dsl_yaml.h"

static const char *const stats_keys[] = {"model", "schedule", "steps", "tokens", "counts", NULL};

static int oom(dsl_diag *d) { return dsl_error(d, (dsl_pos){NULL, 0, 0}, "out of memory"); }

/* An integer >= 0 that fits in 64 bits, as the runtime writes them. */
static int take_count(const dsl_str *s, const char *key, int64_t *out, dsl_diag *d) {
  if (dy_check_int(s, key, 0, d)) return -1;
  *out = strtoll(s->text, NULL, 10);
  return 0;
}

static int load_route(dy_node *key, dy_node *list, dsl_route_counts *r, dsl_diag *d) {
  if (dy_take_str(key, "counts", "routing statistics", &r->path, d)) return -1;
  r->pos = list->pos;
  if (list->kind != DY_SEQ)
    return dsl_error(d, list->pos, "the counts of '%.100s' must be a list of integers, not a %s", r->path.text,
                     dy_kind_name(list));
  dsl_str *items = NULL;
  int n = 0, rc = dy_take_list(list, "counts", "routing statistics", &items, &n, d);
  if (!rc && n == 0) rc = dsl_error(d, list->pos, "the counts of '%.100s' are empty", r->path.text);
  if (!rc && !(r->counts = dsl_calloc((size_t)n, sizeof *r->counts))) rc = oom(d);
  for (int i = 0; !rc && i < n; i++) rc = take_count(&items[i], "count", &r->counts[i], d);
  if (!rc) r->n = n;
  dsl_strs_free(items, n);
  return rc;
}

static int load_stats(dy_node *root, dsl_routing_stats *s, dsl_diag *d) {
  if (root->kind != DY_MAP)
    return dsl_error(d, root->pos,
                     "a routing statistics file is a mapping with keys model, tokens and counts, not a %s",
                     dy_kind_name(root));
  if (dy_check_keys(root, "routing statistics", stats_keys, d)) return -1;
  if (dy_take_req(root, "model", "routing statistics", &s->model, d)) return -1;
  if (dy_take_opt(root, "schedule", "routing statistics", &s->schedule, d)) return -1;
  dsl_str num = {0};
  s->steps = -1;
  int rc = dy_take_opt(root, "steps", "routing statistics", &num, d);
  if (!rc && num.text) rc = take_count(&num, "steps", &s->steps, d);
  dsl_str_free(&num);
  if (!rc) rc = dy_take_req(root, "tokens", "routing statistics", &num, d);
  if (!rc) rc = take_count(&num, "tokens", &s->tokens, d);
  dsl_str_free(&num);
  if (rc) return -1;
  dy_node *counts = dy_need(root, "counts", "routing statistics", d);
  if (!counts || dy_expect(counts, DY_MAP, "counts", "routing statistics", d)) return -1;
  for (int i = 0; i < root->n; i++)
    if (root->items[2 * i + 1] == counts) s->counts_pos = root->items[2 * i]->pos;
  if (counts->kind != DY_MAP || counts->n == 0) return 0;
  if (!(s->routes = dsl_calloc((size_t)counts->n, sizeof *s->routes))) return oom(d);
  s->nroutes = counts->n; /* set first so that a partial list is freed */
  for (int i = 0; i < counts->n; i++)
    if (load_route(counts->items[2 * i], counts->items[2 * i + 1], &s->routes[i], d)) return -1;
  return 0;
}

void dsl_routing_stats_free(dsl_routing_stats *s) {
  if (!s) return;
  free(s->model.text);
  free(s->schedule.text);
  for (int i = 0; s->routes && i < s->nroutes; i++) {
    free(s->routes[i].path.text);
    free(s->routes[i].counts);
  }
  free(s->routes);
  dsl_source_free(s->src);
  free(s);
}

int dsl_routing_stats_parse(const char *path, const char *text, size_t len, dsl_routing_stats **out_stats,
                            dsl_diag *d) {
  *out_stats = NULL;
  dsl_source *src;
  dy_node *root;
  if (dy_parse(path, text, len, &src, &root, d)) return -1;
  dsl_routing_stats *s = dsl_calloc(1, sizeof *s);
  if (!s) {
    dy_free(root);
    dsl_source_free(src);
    return oom(d);
  }
  s->src = src;
  int rc = load_stats(root, s, d);
  dy_free(root);
  if (rc) {
    dsl_routing_stats_free(s);
    return -1;
  }
  *out_stats = s;
  return 0;
}

int dsl_routing_stats_load(const char *path, dsl_routing_stats **out_stats, dsl_diag *d) {
  *out_stats = NULL;
  char *text;
  size_t len;
  if (dy_read_file(path, &text, &len, d)) return -1;
  int rc = dsl_routing_stats_parse(path, text, len, out_stats, d);
  free(text);
  return rc;
}
