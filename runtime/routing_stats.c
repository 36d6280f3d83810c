/* routing_stats.c - how often each expert is chosen: after every step the
 * idx output of each routing op (topk_route, score_route, hash_route) is
 * read back and its live rows counted per expert, and the counts are
 * written as the small YAML file that ds4c's hot_experts reads
 * (docs/RUNTIME.md, "Routing statistics"). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rt_impl.h"

/* One routing op of the plan. */
typedef struct route_stat {
  const char *path;  /* the op's path (a plan string) */
  uint32_t tensor;   /* its idx output, i32 [rows, k] */
  uint32_t rows, k;
  uint32_t experts;  /* E: the columns of its logits */
  uint64_t *counts;  /* [experts] */
  /* An activation shares its arena bytes with tensors written later in
   * the step, so it gets bytes of its own while counting (own, the prefill
   * plan's size, which the decode plan's fits in) and goes back to its
   * arena bytes in each plan (home) at close. */
  void *own, *home[2];
  uint32_t nregistered; /* devices that registered own (host_register) */
} route_stat;

struct rt_routing_stats {
  rt_bundle *b;
  rt_bundle *plans[2]; /* b and its decode plan's bundle, when it has one */
  int nplans;
  route_stat *routes; /* in path order (see path_cmp) */
  uint32_t nroutes;
  int32_t *idx;       /* room for the largest idx tensor */
  uint64_t steps, tokens;
};

/* The routing kinds and where their logits are among the launch's args;
 * idx and w are always the last two. */
static const struct {
  const char *kind;
  uint32_t logits, nargs;
} route_kinds[] = {{"topk_route", 0, 3}, {"score_route", 0, 4}, {"hash_route", 1, 5}};

static int route_kind(const char *kind) {
  for (int i = 0; i < (int)(sizeof route_kinds / sizeof *route_kinds); i++)
    if (strcmp(route_kinds[i].kind, kind) == 0) return i;
  return -1;
}

/* Paths in natural order: digit runs compare as numbers, so layers.2
 * comes before layers.10 and the file reads in layer order. */
static int path_cmp(const char *a, const char *b) {
  while (*a && *b) {
    if (*a >= '0' && *a <= '9' && *b >= '0' && *b <= '9') {
      while (*a == '0') a++;
      while (*b == '0') b++;
      size_t na = strspn(a, "0123456789"), nb = strspn(b, "0123456789");
      if (na != nb) return na < nb ? -1 : 1;
      int c = strncmp(a, b, na);
      if (c) return c;
      a += na;
      b += nb;
      continue;
    }
    if (*a != *b) return (unsigned char)*a < (unsigned char)*b ? -1 : 1;
    a++, b++;
  }
  return (unsigned char)*a - (unsigned char)*b;
}

static int route_cmp(const void *x, const void *y) {
  return path_cmp(((const route_stat *)x)->path, ((const route_stat *)y)->path);
}

/* The routing op of launch command c, checked against what its kind
 * writes: idx i32 [rows, k], whole, and logits [rows, E]. */
static rt_status route_of(const plan *p, const plan_command *c, int kind, route_stat *out) {
  const char *path = plan_str(p, p->ops[c->op].path);
  if (c->nargs != route_kinds[kind].nargs)
    return rt_status_make("routing op %s (%s) has %u args, expected %u", path, route_kinds[kind].kind,
                          c->nargs, route_kinds[kind].nargs);
  const plan_arg *idx = &p->args[c->args_begin + c->nargs - 2];
  const plan_arg *logits = &p->args[c->args_begin + route_kinds[kind].logits];
  const plan_tensor *t = &p->tensors[idx->tensor], *l = &p->tensors[logits->tensor];
  if (t->dtype != PLAN_I32 || t->ndim != 2 || idx->offset != 0 || idx->bytes != t->bytes || l->ndim != 2 ||
      l->dim[1] == 0 || l->dim[1] > INT32_MAX)
    return rt_status_make("routing op %s: its idx output %s is not a whole i32 [T, k] tensor, or its logits "
                          "%s are not [T, E]",
                          path, plan_str(p, t->name), plan_str(p, l->name));
  *out = (route_stat){.path = path, .tensor = idx->tensor, .rows = (uint32_t)t->dim[0],
                      .k = (uint32_t)t->dim[1], .experts = (uint32_t)l->dim[1]};
  out->counts = calloc(out->experts, sizeof *out->counts);
  return out->counts ? NULL : rt_status_make("out of memory");
}

/* Point every launch and copy arg of tensor t, and the tensor itself, at
 * base: the launch arrays are device memory, written slot by slot. */
static rt_status point_tensor(rt_bundle *b, uint32_t t, void *base) {
  const plan *p = &b->p;
  b->tensor_ptr[t] = base;
  for (uint32_t d = 0; d < p->ndevices; d++) {
    rt_dev *v = &b->devs[d];
    for (uint32_t i = 0; i < v->ncmds; i++) {
      rt_cmd *r = &v->cmds[i];
      if (r->kind != PLAN_CMD_LAUNCH && r->kind != PLAN_CMD_COPY) continue;
      const plan_command *c = &p->commands[r->index];
      for (uint32_t j = 0; j < c->nargs; j++) {
        const plan_arg *a = &p->args[c->args_begin + j];
        if (a->tensor != t) continue;
        void *at = (uint8_t *)base + a->offset;
        if (r->kind == PLAN_CMD_COPY && j == 0) r->src = at;
        else if (r->kind == PLAN_CMD_COPY) r->dst = at;
        else RT_TRY(v->be->copy_h2d(v->dev, (void *)&r->bufs[j], &at, sizeof at));
      }
    }
  }
  return NULL;
}

/* Bytes of its own for an activation idx tensor, reachable by every
 * device that reaches its arena (a cpu arena is registered with the GPU
 * devices, so the copy is too). */
static rt_status give_own_bytes(rt_routing_stats *s, route_stat *r) {
  rt_bundle *b = s->b;
  const plan *p = &b->p;
  const plan_tensor *t = &p->tensors[r->tensor];
  if (t->role != PLAN_ACTIVATION) return NULL; /* its bytes are its own already */
  rt_dev *home = &b->devs[t->device];
  RT_TRY(home->be->mem_alloc(home->dev, t->bytes, &r->own));
  for (int i = 0; i < s->nplans; i++) r->home[i] = s->plans[i]->tensor_ptr[r->tensor];
  if (p->devices[t->device].backend == PLAN_BACKEND_CPU)
    for (uint32_t d = 0; d < p->ndevices; d++) {
      rt_dev *v = &b->devs[d];
      if (!v->be->host_register) continue;
      RT_TRY(v->be->host_register(v->dev, r->own, t->bytes));
      r->nregistered++;
    }
  for (int i = 0; i < s->nplans; i++) RT_TRY(point_tensor(s->plans[i], r->tensor, r->own));
  return NULL;
}

static void release_own_bytes(rt_routing_stats *s, route_stat *r) {
  if (!r->own) return;
  rt_bundle *b = s->b;
  const plan *p = &b->p;
  for (int i = 0; i < s->nplans; i++) rt_status_free(point_tensor(s->plans[i], r->tensor, r->home[i]));
  uint32_t n = 0;
  for (uint32_t d = 0; d < p->ndevices && n < r->nregistered; d++) {
    rt_dev *v = &b->devs[d];
    if (!v->be->host_register) continue;
    v->be->host_unregister(v->dev, r->own);
    n++;
  }
  rt_dev *home = &b->devs[p->tensors[r->tensor].device];
  home->be->mem_free(home->dev, r->own);
  r->own = NULL;
}

void rt_routing_stats_close(rt_routing_stats *s) {
  if (!s) return;
  for (uint32_t i = 0; i < s->nroutes; i++) {
    release_own_bytes(s, &s->routes[i]);
    free(s->routes[i].counts);
  }
  free(s->routes);
  free(s->idx);
  free(s);
}

static rt_status find_routes(rt_routing_stats *s) {
  const plan *p = &s->b->p;
  uint32_t n = 0;
  for (uint32_t i = 0; i < p->ncommands; i++)
    n += p->commands[i].kind == PLAN_CMD_LAUNCH && route_kind(plan_str(p, p->kernels[p->commands[i].a].kind)) >= 0;
  s->routes = calloc(n ? n : 1, sizeof *s->routes);
  if (!s->routes) return rt_status_make("out of memory");
  uint64_t most = 1;
  for (uint32_t i = 0; i < p->ncommands; i++) {
    const plan_command *c = &p->commands[i];
    int kind = c->kind == PLAN_CMD_LAUNCH ? route_kind(plan_str(p, p->kernels[c->a].kind)) : -1;
    if (kind < 0) continue;
    RT_TRY(route_of(p, c, kind, &s->routes[s->nroutes]));
    route_stat *r = &s->routes[s->nroutes++];
    if ((uint64_t)r->rows * r->k > most) most = (uint64_t)r->rows * r->k;
  }
  qsort(s->routes, s->nroutes, sizeof *s->routes, route_cmp);
  s->idx = malloc(most * sizeof *s->idx);
  return s->idx ? NULL : rt_status_make("out of memory");
}

rt_status rt_routing_stats_open(rt_bundle *b, rt_routing_stats **out_stats) {
  *out_stats = NULL;
  rt_routing_stats *s = calloc(1, sizeof *s);
  if (!s) return rt_status_make("out of memory");
  s->b = b;
  s->plans[0] = b;
  s->plans[1] = rt_bundle_decode(b);
  s->nplans = s->plans[1] == b ? 1 : 2;
  rt_status err = find_routes(s);
  for (uint32_t i = 0; i < s->nroutes && !err; i++) err = give_own_bytes(s, &s->routes[i]);
  if (err) {
    rt_routing_stats_close(s);
    return rt_status_wrap(err, "routing statistics of %s", b->dir);
  }
  *out_stats = s;
  return NULL;
}

rt_status rt_routing_stats_hook(void *ctx, rt_bundle *b, const int32_t step[4], const int32_t *ids) {
  (void)ids;
  rt_routing_stats *s = ctx;
  /* Either plan of the bundle: the same tensors by index. */
  if (b != s->b && b != rt_bundle_decode(s->b))
    return rt_status_make("rt_routing_stats_hook: a step of %s, but counting %s", b->dir, s->b->dir);
  for (uint32_t i = 0; i < s->nroutes; i++) {
    route_stat *r = &s->routes[i];
    uint32_t live = step[1] < 0 ? 0 : (uint32_t)step[1] < r->rows ? (uint32_t)step[1] : r->rows;
    RT_TRY(rt_tensor_read(b, r->tensor, s->idx, (size_t)live * r->k * sizeof *s->idx));
    for (uint32_t e = 0; e < live * r->k; e++)
      if (s->idx[e] >= 0 && (uint32_t)s->idx[e] < r->experts) r->counts[s->idx[e]]++;
  }
  s->steps++;
  s->tokens += step[1] < 0 ? 0 : (uint64_t)step[1];
  return NULL;
}

uint32_t rt_routing_stats_routes(const rt_routing_stats *s) { return s->nroutes; }

/* A YAML scalar: plain when it cannot be read as anything but itself,
 * else double-quoted. */
static void put_scalar(FILE *f, const char *s) {
  int plain = *s && *s != '-' && strspn(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-") ==
                                    strlen(s);
  plain = plain && strcmp(s, "null") && strcmp(s, "Null") && strcmp(s, "NULL");
  if (plain) {
    fputs(s, f);
    return;
  }
  fputc('"', f);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
    else if (c < 0x20 || c == 0x7f) fprintf(f, "\\x%02x", c);
    else fputc(c, f);
  }
  fputc('"', f);
}

static void put_stats(const rt_routing_stats *s, FILE *f) {
  const plan *p = &s->b->p;
  fputs("# Routing statistics from ds4run --routing-stats: how often each routing op\n"
        "# chose each expert (expert 0 first) over every live token (docs/RUNTIME.md).\n",
        f);
  fputs("model: ", f);
  put_scalar(f, plan_str(p, p->info.model));
  fputs("\nschedule: ", f);
  put_scalar(f, plan_str(p, p->info.schedule));
  fprintf(f, "\nsteps: %llu\ntokens: %llu\ncounts:%s\n", (unsigned long long)s->steps,
          (unsigned long long)s->tokens, s->nroutes ? "" : " {}");
  for (uint32_t i = 0; i < s->nroutes; i++) {
    const route_stat *r = &s->routes[i];
    fputs("  ", f);
    put_scalar(f, r->path);
    fputs(": [", f);
    for (uint32_t e = 0; e < r->experts; e++) fprintf(f, "%s%llu", e ? ", " : "", (unsigned long long)r->counts[e]);
    fputs("]\n", f);
  }
}

rt_status rt_routing_stats_write(const rt_routing_stats *s, const char *path) {
  size_t n = strlen(path) + 32;
  char *tmp = malloc(n);
  if (!tmp) return rt_status_make("%s: out of memory", path);
  snprintf(tmp, n, "%s.tmp.%ld", path, (long)getpid());
  rt_status err = NULL;
  FILE *f = fopen(tmp, "w");
  if (!f) {
    err = rt_status_make("%s: cannot write: %s", path, strerror(errno));
  } else {
    put_stats(s, f);
    int e = ferror(f) ? (errno ? errno : EIO) : 0;
    if (fclose(f) && !e) e = errno ? errno : EIO;
    if (e) err = rt_status_make("%s: cannot write %s: %s", path, tmp, strerror(e));
    else if (rename(tmp, path)) err = rt_status_make("%s: cannot rename %s to it: %s", path, tmp, strerror(errno));
    if (err) remove(tmp);
  }
  free(tmp);
  return err;
}
