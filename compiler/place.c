/* place.c - devices and streams from the schedule, and the owner of every
 * op: ordered glob rules, first match wins, no match is an error. A rule
 * may select experts ("layers.*.ffn.experts[0:6] -> hot"): a moe_experts
 * op whose experts go to several streams is split here into one launch per
 * stream, each reading views of the weights that hold its experts and
 * writing its rows of a parts tensor, and a sum_parts merge where the
 * result is first read. A tensor lives on the device of the op that first
 * writes it (weights and inputs: of their first reader). A schedule's
 * hot_experts stands for expert rules chosen from routing statistics. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "emit.h"
#include "passes.h"

static int parse_int(const dsl_str *s, int64_t lo, int64_t hi, int64_t *out, dsl_diag *d) {
  char *end;
  long long v = strtoll(s->text, &end, 10);
  if (end == s->text || *end || v < lo || v > hi)
    return dsl_error(d, s->pos, "expected an integer from %lld to %lld, found '%s'", (long long)lo, (long long)hi,
                     s->text);
  *out = v;
  return 0;
}

/* A cost-profile number in [lo, 1e30]; lo > 0 means strictly positive. */
static int parse_cost(const dsl_str *s, double lo, double *out, dsl_diag *d) {
  char *end;
  *out = strtod(s->text, &end);
  if (end == s->text || *end || !(lo > 0 ? *out > 0 : *out >= 0) || *out > 1e30)
    return dsl_error(d, s->pos, "expected a %s number, found '%s'", lo > 0 ? "positive" : "non-negative", s->text);
  return 0;
}

/* A GPU device's arch must be a code object target of its vendor. */
static int gpu_arch_known(uint32_t backend, const char *arch) {
  const char *prefix = backend == PLAN_BACKEND_HIP ? "gfx" : "sm_";
  for (int i = 0; emit_known_targets[i]; i++)
    if (strcmp(emit_known_targets[i], arch) == 0) return strncmp(arch, prefix, 3) == 0;
  return 0;
}

static int place_devices(ir_prog *p, dsl_diag *d) {
  const dsl_schedule *s = p->sched;
  if (s->ndevices < 1) return dsl_error(d, s->name.pos, "schedule '%s' has no devices", s->name.text);
  p->devices = ir_xrealloc(NULL, (size_t)s->ndevices * sizeof *p->devices);
  memset(p->devices, 0, (size_t)s->ndevices * sizeof *p->devices);
  int ncpu = 0; /* cpu devices so far, as the schedule writes them */
  for (int i = 0; i < s->ndevices; i++) {
    const dsl_device *sd = &s->devices[i];
    ir_device *dv = &p->devices[i];
    p->ndevices = i + 1;
    dv->name = ir_strdup(sd->name.text);
    dv->arch = ir_strdup(sd->arch.text);
    dv->pos = sd->pos;
    for (int j = 0; j < i; j++)
      if (strcmp(p->devices[j].name, dv->name) == 0)
        return dsl_error(d, sd->name.pos, "duplicate device '%s'", dv->name);
    /* ds4c compile --cpu: the GPU's plan on the host, its memory bound (a
     * GPU's) dropped below */
    int to_cpu = p->cpu_only && strcmp(sd->backend.text, "cpu") != 0;
    if (to_cpu) {
      dv->backend = PLAN_BACKEND_CPU;
      ir_xfree(dv->arch);
      dv->arch = ir_strdup("host");
    } else if (strcmp(sd->backend.text, "cpu") == 0) {
      dv->backend = PLAN_BACKEND_CPU;
      if (strcmp(dv->arch, "host") != 0)
        return dsl_error(d, sd->arch.pos, "a cpu device has arch 'host', not '%s'", dv->arch);
    } else {
      dv->backend = strcmp(sd->backend.text, "hip") == 0 ? PLAN_BACKEND_HIP : PLAN_BACKEND_CUDA;
      if (!gpu_arch_known(dv->backend, dv->arch))
        return dsl_error(d, sd->arch.pos, "%s device '%s': arch '%s' is not a target of this compiler (%s)",
                         sd->backend.text, dv->name, dv->arch,
                         dv->backend == PLAN_BACKEND_HIP ? "gfx1201, gfx1151, gfx1100, gfx942" : "sm_90");
    }
    int64_t v = 0;
    if (parse_int(&sd->ordinal, 0, 1024, &v, d)) return -1;
    dv->ordinal = (int)v;
    /* the host has no device index: a cpu device's ordinal only numbers
     * the schedule's cpu devices, in order (ds4c diff matches devices by
     * backend, arch and ordinal) */
    if (!to_cpu && dv->backend == PLAN_BACKEND_CPU && v != ncpu)
      return dsl_error(d, sd->ordinal.pos, "cpu device '%s': a cpu device's ordinal numbers the schedule's cpu "
                       "devices in order, from 0; this is cpu device %d, not %lld", dv->name, ncpu, (long long)v);
    ncpu += !to_cpu && dv->backend == PLAN_BACKEND_CPU;
    v = 1;
    if (sd->threads.text && parse_int(&sd->threads, 1, 1024, &v, d)) return -1;
    dv->threads = (int)v;
    if (sd->memory.text && parse_int(&sd->memory, 1, INT64_MAX, &dv->memory, d)) return -1;
    if (to_cpu) dv->memory = 0;
    if (parse_cost(&sd->bandwidth, 1, &dv->bandwidth, d) || parse_cost(&sd->flops, 1, &dv->flops, d) ||
        parse_cost(&sd->launch, 0, &dv->launch, d))
      return -1;
    dv->copy_launch = dv->launch;
    if ((sd->copy_bandwidth.text && parse_cost(&sd->copy_bandwidth, 1, &dv->copy_bandwidth, d)) ||
        (sd->copy_launch.text && parse_cost(&sd->copy_launch, 0, &dv->copy_launch, d)))
      return -1;
  }
  return 0;
}

/* The devices' names, for suggest (at most 64). */
static int device_names(const ir_prog *p, const char **names) {
  int n = 0;
  for (int i = 0; i < p->ndevices && n < 64; i++) names[n++] = p->devices[i].name;
  return n;
}

/* "unknown device 'x'" plus a suggestion, at pos. */
static int unknown_device(const ir_prog *p, const char *name, const char *where, dsl_pos pos, dsl_diag *d) {
  const char *names[64];
  char hint[512];
  ir_suggest(hint, sizeof hint, name, names, device_names(p, names), "the schedule's devices");
  return dsl_error(d, pos, "unknown device '%s'%s%s", name, where, hint);
}

static int find_device(const ir_prog *p, const char *name) {
  for (int i = 0; i < p->ndevices; i++)
    if (strcmp(p->devices[i].name, name) == 0) return i;
  return -1;
}

static int place_streams(ir_prog *p, dsl_diag *d) {
  const dsl_schedule *s = p->sched;
  p->streams = ir_xrealloc(NULL, (size_t)(s->nstreams ? s->nstreams : 1) * sizeof *p->streams);
  for (int i = 0; i < s->nstreams; i++) {
    const dsl_stream *ss = &s->streams[i];
    int dev = find_device(p, ss->device.text);
    if (dev < 0) return unknown_device(p, ss->device.text, "", ss->device.pos, d);
    for (int j = 0; j < i; j++)
      if (p->streams[j].device == dev && strcmp(p->streams[j].name, ss->name.text) == 0)
        return dsl_error(d, ss->name.pos, "duplicate stream '%s' on device '%s'", ss->name.text, ss->device.text);
    p->streams[i] = (ir_stream){ir_strdup(ss->name.text), ss->pos, dev};
    p->nstreams = i + 1;
  }
  for (int i = 0; i < p->ndevices; i++) {
    int has = 0;
    for (int j = 0; j < p->nstreams; j++) has |= p->streams[j].device == i;
    if (!has) return dsl_error(d, p->devices[i].pos, "device '%s' has no stream", p->devices[i].name);
  }
  return 0;
}

/* The stream a rule names: device.stream, or the device's first stream. */
static int rule_stream(const ir_prog *p, const dsl_owner *o, dsl_diag *d) {
  int dev = find_device(p, o->device.text);
  if (dev < 0) return unknown_device(p, o->device.text, " in owner rule", o->device.pos, d), -1;
  const char *names[64];
  int n = 0;
  for (int j = 0; j < p->nstreams; j++) {
    if (p->streams[j].device != dev) continue;
    if (!o->stream.text || strcmp(p->streams[j].name, o->stream.text) == 0) return j;
    if (n < 64) names[n++] = p->streams[j].name;
  }
  char hint[512];
  ir_suggest(hint, sizeof hint, o->stream.text, names, n, "its streams");
  return dsl_error(d, o->stream.pos, "device '%s' has no stream '%s'%s", o->device.text, o->stream.text, hint), -1;
}

/* An owner rule, resolved: its glob without the expert selector, its
 * stream, and the experts it selects (all when nexperts < 0). */
typedef struct place_rule {
  char *glob;
  int stream;
  int *experts, nexperts;
  const dsl_owner *src;
  size_t sel_at; /* offset of '[' in the rule's glob text */
} place_rule;

static void free_rules(place_rule *r, int n) {
  for (int i = 0; i < n; i++) {
    ir_xfree(r[i].glob);
    ir_xfree(r[i].experts);
  }
  ir_xfree(r);
}

/* "[a:b]" (a < b) or "[a,b,...]" after the op glob. */
/* A model param's integer value, for the bounds of a selector. */
static int selector_param(void *ctx, const char *name, int64_t *out) {
  const ir_prog *p = ctx;
  for (int i = 0; i < p->nparams; i++)
    if (strcmp(p->params[i].name, name) == 0) {
      if (p->params[i].is_float) return 1;
      if (!ir_param_is_int(&p->params[i])) return 2;
      *out = p->params[i].value;
      return 0;
    }
  return -1;
}

/* An expert number of a selector: an integer expression of the model's
 * params (`experts / 8`), from c up to the next ',' ':' or ']'; *end is
 * where it stops. */
static int selector_bound(const ir_prog *p, const dsl_str *g, const char *c, const char **end, long long *out,
                          dsl_diag *d) {
  *end = c + strcspn(c, ",:]");
  if (*end == c) return dsl_error(d, dsl_pos_at(g, (size_t)(c - g->text)), "expected an expert number in the selector");
  char *text = ir_xrealloc(NULL, (size_t)(*end - c) + 1);
  memcpy(text, c, (size_t)(*end - c));
  text[*end - c] = 0;
  dsl_str e = {text, dsl_pos_at(g, (size_t)(c - g->text))};
  int64_t v = 0;
  int rc = dsl_eval(&e, selector_param, (void *)p, &v, d);
  ir_xfree(text);
  if (rc) return -1;
  if (v < 0 || v > 1 << 20)
    return dsl_error(d, dsl_pos_at(g, (size_t)(c - g->text)), "expert number %lld is out of [0, 2^20]", (long long)v);
  *out = v;
  return 0;
}

static int parse_selector(const ir_prog *p, place_rule *r, dsl_diag *d) {
  const dsl_str *g = &r->src->glob;
  const char *sel = g->text + r->sel_at + 1, *c = sel;
  int64_t v[2];
  int n = 0, range = 0;
  for (;;) {
    const char *end;
    long long x = 0;
    if (selector_bound(p, g, c, &end, &x, d)) return -1;
    r->experts = ir_xrealloc(r->experts, (size_t)(n + 1) * sizeof *r->experts);
    r->experts[n++] = (int)x;
    c = end;
    if (*c == ':' && n == 1 && !range) {
      range = 1;
      c++;
      continue;
    }
    if (*c == ',' && !range) {
      c++;
      continue;
    }
    if (*c == ']' && !c[1]) break;
    return dsl_error(d, dsl_pos_at(g, (size_t)(c - g->text)),
                     "expected ',' ':' or a final ']' in the expert selector (e.g. [0:6] or [0,3,5])");
  }
  if (range) {
    v[0] = r->experts[0];
    v[1] = r->experts[1];
    if (v[0] >= v[1])
      return dsl_error(d, dsl_pos_at(g, r->sel_at + 1), "expert range [%lld:%lld] is empty", (long long)v[0],
                       (long long)v[1]);
    n = (int)(v[1] - v[0]);
    r->experts = ir_xrealloc(r->experts, (size_t)n * sizeof *r->experts);
    for (int i = 0; i < n; i++) r->experts[i] = (int)v[0] + i;
  }
  r->nexperts = n;
  return 0;
}

/* ---- hot_experts: expert rules from routing statistics ---- */

static int expert_count(const ir_prog *p, const ir_op *op);

static int is_route(const ir_op *op) {
  return op->kind == IR_OP_TOPK_ROUTE || op->kind == IR_OP_SCORE_ROUTE || op->kind == IR_OP_HASH_ROUTE;
}

/* The experts a router chooses among: the columns of its logits. */
static int64_t route_experts(const ir_prog *p, const ir_op *route) {
  return p->tensors[route->in[route->kind == IR_OP_HASH_ROUTE ? 1 : 0]].dim[1];
}

/* The statistics file, relative to the schedule's folder. */
static char *stats_path(const dsl_schedule *s) {
  const char *rel = s->hot_experts->stats.text, *sp = s->src ? s->src->path : "";
  const char *slash = strrchr(sp, '/');
  if (rel[0] == '/' || !slash) return ir_strdup(rel);
  size_t n = (size_t)(slash - sp) + strlen(rel) + 2;
  char *path = ir_xrealloc(NULL, n);
  snprintf(path, n, "%.*s/%s", (int)(slash - sp), sp, rel);
  return path;
}

/* Statistics fit the model: its name, and a routing op with as many
 * experts as counts for every line. */
static int check_stats(const ir_prog *p, const dsl_routing_stats *st, dsl_diag *d) {
  const char *model = p->model->name.text;
  if (strcmp(st->model.text, model) != 0)
    return dsl_error(d, st->model.pos, "routing statistics of model '%s', but schedule '%s' compiles model '%s'",
                     st->model.text, p->sched->name.text, model);
  for (int i = 0; i < st->nroutes; i++) {
    const dsl_route_counts *c = &st->routes[i];
    int op = ir_find_op(p, c->path.text);
    if (op < 0 || !is_route(&p->ops[op]))
      return dsl_error(d, c->path.pos, "model '%s' has no routing op '%s'", model, c->path.text);
    int64_t E = route_experts(p, &p->ops[op]);
    if (c->n != E)
      return dsl_error(d, c->pos, "'%s' has %d counts, but the op routes among %lld experts", c->path.text, c->n,
                       (long long)E);
  }
  return 0;
}

/* The counts of the router whose idx moe_experts op `op` reads. */
static int router_counts(const ir_prog *p, const ir_op *op, const dsl_routing_stats *st, const int64_t **out,
                         dsl_diag *d) {
  const ir_op *route = NULL;
  for (int i = 0; i < p->nops && !route; i++)
    if (is_route(&p->ops[i]) && p->ops[i].out[0] == op->in[1]) route = &p->ops[i];
  if (!route)
    return dsl_error(d, op->pos, "hot_experts: moe_experts op '%s' reads idx '%s', which no routing op writes",
                     op->path, p->tensors[op->in[1]].path);
  if (route_experts(p, route) != expert_count(p, op))
    return dsl_error(d, op->pos, "hot_experts: '%s' has %d experts, but its router '%s' chooses among %lld",
                     op->path, expert_count(p, op), route->path, (long long)route_experts(p, route));
  for (int i = 0; i < st->nroutes; i++)
    if (strcmp(st->routes[i].path.text, route->path) == 0) {
      *out = st->routes[i].counts;
      return 0;
    }
  return dsl_error(d, st->counts_pos, "no counts for routing op '%s' (the router of '%s')", route->path, op->path);
}

/* The moe_experts ops in program order, each with its router's counts;
 * expert e of op k is number first[k] + e among all their experts. */
typedef struct hot_ops {
  int n, *moe, *first;
  const int64_t **counts;
} hot_ops;

static void hot_ops_free(hot_ops *o) {
  ir_xfree(o->moe);
  ir_xfree(o->first);
  ir_xfree(o->counts);
}

static int find_hot_ops(const ir_prog *p, const dsl_routing_stats *st, hot_ops *o, dsl_diag *d) {
  o->n = 0;
  for (int i = 0; i < p->nops; i++) o->n += p->ops[i].kind == IR_OP_MOE_EXPERTS;
  o->moe = ir_xrealloc(NULL, (size_t)(o->n + 1) * sizeof *o->moe);
  o->first = ir_xrealloc(NULL, (size_t)(o->n + 1) * sizeof *o->first);
  o->counts = ir_xrealloc(NULL, (size_t)(o->n + 1) * sizeof *o->counts);
  o->first[0] = 0;
  for (int i = 0, k = 0; i < p->nops; i++) {
    if (p->ops[i].kind != IR_OP_MOE_EXPERTS) continue;
    if (router_counts(p, &p->ops[i], st, &o->counts[k], d)) return -1;
    o->moe[k] = i;
    o->first[k + 1] = o->first[k] + expert_count(p, &p->ops[i]);
    k++;
  }
  return 0;
}

/* Each moe_experts op's chance that a token chooses expert e, count_e
 * over the tokens counted, for the cost model (order.c): the op and the
 * parts a split makes of it share the table. */
static void add_expert_freqs(ir_prog *p, const dsl_routing_stats *st, const hot_ops *o) {
  p->freqs = ir_xrealloc(p->freqs, (size_t)(p->nfreqs + o->n + 1) * sizeof *p->freqs);
  for (int k = 0; k < o->n; k++) {
    int E = o->first[k + 1] - o->first[k];
    double *f = ir_xrealloc(NULL, (size_t)(E ? E : 1) * sizeof *f);
    for (int e = 0; e < E; e++) f[e] = st->tokens > 0 ? (double)o->counts[k][e] / (double)st->tokens : 0.0;
    p->freqs[p->nfreqs++] = f;
    p->ops[o->moe[k]].freq = p->nfreqs;
  }
}

/* One expert of one moe_experts op, a candidate for the hot device. */
typedef struct hot_cand {
  int64_t count, bytes;
  int op, expert; /* op: k of hot_ops */
} hot_cand;

/* Most chosen first; ties to the earlier op, then to the lower expert. */
static int hot_cand_cmp(const void *x, const void *y) {
  const hot_cand *a = x, *b = y;
  if (a->count != b->count) return a->count > b->count ? -1 : 1;
  if (a->op != b->op) return a->op - b->op;
  return a->expert - b->expert;
}

/* Greedy over every expert of every op, most chosen first: an expert is
 * hot when its weights (its rows of w1, w3 and w2) fit what is left of the
 * budget. Every expert of one op has one size, so each op keeps its most
 * chosen ones, and a smaller expert of another op may still fill what a
 * larger one left. Sets hot[first[k] + e]. */
static void choose_hot(const ir_prog *p, const hot_ops *o, int64_t budget, uint8_t *hot) {
  int total = o->first[o->n], n = 0;
  hot_cand *c = ir_xrealloc(NULL, (size_t)(total ? total : 1) * sizeof *c);
  for (int k = 0; k < o->n; k++) {
    const ir_op *op = &p->ops[o->moe[k]];
    int64_t bytes = 0;
    for (int w = 2; w < 5; w++) bytes += ir_row_bytes(&p->tensors[op->in[w]]);
    for (int e = 0; e < expert_count(p, op); e++) c[n++] = (hot_cand){o->counts[k][e], bytes, k, e};
  }
  qsort(c, (size_t)n, sizeof *c, hot_cand_cmp);
  for (int i = 0; i < n; i++)
    if (c[i].bytes <= budget) {
      budget -= c[i].bytes;
      hot[o->first[c[i].op] + c[i].expert] = 1;
    }
  ir_xfree(c);
}

/* Per op, "PATH[its hot experts] -> device" when it keeps any, then
 * "PATH -> cold" when it leaves any: the rules one would write by hand. */
static place_rule *hot_rules(const ir_prog *p, const hot_ops *o, const uint8_t *hot, int hot_stream,
                             int cold_stream, int *out_n) {
  const dsl_hot_experts *h = p->sched->hot_experts;
  place_rule *r = ir_xrealloc(NULL, (size_t)(2 * o->n + 1) * sizeof *r);
  int n = 0;
  for (int k = 0; k < o->n; k++) {
    const ir_op *op = &p->ops[o->moe[k]];
    int E = expert_count(p, op), nhot = 0, *ex = ir_xrealloc(NULL, (size_t)E * sizeof *ex);
    for (int e = 0; e < E; e++)
      if (hot[o->first[k] + e]) ex[nhot++] = e;
    if (nhot) r[n++] = (place_rule){ir_strdup(op->path), hot_stream, ex, nhot, &h->device, 0};
    else ir_xfree(ex);
    if (nhot < E) r[n++] = (place_rule){ir_strdup(op->path), cold_stream, NULL, -1, &h->cold, 0};
  }
  *out_n = n;
  return r;
}

static void drop_stats(void *st) { dsl_routing_stats_free(st); }

/* The rules a schedule's hot_experts stands for, from its statistics
 * file, in the order of the moe_experts ops. */
static int hot_expert_rules(ir_prog *p, place_rule **out, int *out_n, dsl_diag *d) {
  const dsl_hot_experts *h = p->sched->hot_experts;
  int64_t budget = 0; /* set by parse_int on success; gcc -O3 cannot see it */
  int hot_stream, cold_stream;
  if (parse_int(&h->budget, 0, INT64_MAX, &budget, d) || (hot_stream = rule_stream(p, &h->device, d)) < 0 ||
      (cold_stream = rule_stream(p, &h->cold, d)) < 0)
    return -1;
  char *path = stats_path(p->sched);
  dsl_routing_stats *st = NULL;
  hot_ops o = {0};
  int rc = 0;
  if (access(path, R_OK) != 0)
    rc = dsl_error(d, h->stats.pos, "cannot read routing statistics '%s': %s", path, strerror(errno));
  if (!rc) rc = dsl_routing_stats_load(path, &st, d);
  ir_mem_hold(drop_stats, st); /* not tracked; freed if memory runs out below */
  if (!rc) rc = check_stats(p, st, d);
  if (!rc) rc = find_hot_ops(p, st, &o, d);
  if (!rc) add_expert_freqs(p, st, &o);
  if (!rc) {
    uint8_t *hot = ir_xrealloc(NULL, (size_t)o.first[o.n] + 1);
    memset(hot, 0, (size_t)o.first[o.n] + 1);
    choose_hot(p, &o, budget, hot);
    *out = hot_rules(p, &o, hot, hot_stream, cold_stream, out_n);
    ir_xfree(hot);
  }
  hot_ops_free(&o);
  ir_mem_unhold(st);
  dsl_routing_stats_free(st);
  ir_xfree(path);
  return rc ? -1 : 0;
}

/* The schedule's owner rules, resolved, behind the rules hot_experts
 * stands for. */
static int resolve_rules(ir_prog *p, place_rule **out, int *out_n, dsl_diag *d) {
  const dsl_schedule *s = p->sched;
  place_rule *hot = NULL;
  int nhot = 0;
  if (s->hot_experts && hot_expert_rules(p, &hot, &nhot, d)) return -1;
  int n = nhot + s->nowners;
  place_rule *r = ir_xrealloc(NULL, (size_t)(n ? n : 1) * sizeof *r);
  memset(r, 0, (size_t)(n ? n : 1) * sizeof *r);
  if (nhot) memcpy(r, hot, (size_t)nhot * sizeof *r);
  ir_xfree(hot);
  int rc = 0;
  for (int i = 0; i < s->nowners && !rc; i++) {
    place_rule *ri = &r[nhot + i];
    const char *g = s->owners[i].glob.text, *br = strchr(g, '[');
    ri->src = &s->owners[i];
    ri->nexperts = -1;
    ri->glob = ir_strdup(g);
    if (br) {
      ri->sel_at = (size_t)(br - g);
      ri->glob[ri->sel_at] = 0;
      rc = parse_selector(p, ri, d);
    }
    if (!rc && (ri->stream = rule_stream(p, &s->owners[i], d)) < 0) rc = -1;
  }
  if (rc) {
    free_rules(r, n);
    return -1;
  }
  *out = r;
  *out_n = n;
  return 0;
}

/* Each expert's stream: rules in order, the first that matches the op
 * and selects the expert wins. */
static int assign_experts(ir_prog *p, const ir_op *op, const place_rule *r, int nr, int *owner, int E,
                          dsl_diag *d) {
  for (int e = 0; e < E; e++) owner[e] = -1;
  for (int i = 0; i < nr; i++) {
    if (!ir_glob_match(r[i].glob, op->path)) continue;
    if (r[i].nexperts < 0) {
      for (int e = 0; e < E; e++)
        if (owner[e] < 0) owner[e] = r[i].stream;
      break;
    }
    for (int j = 0; j < r[i].nexperts; j++) {
      int e = r[i].experts[j];
      if (e >= E)
        return dsl_error(d, dsl_pos_at(&r[i].src->glob, r[i].sel_at + 1),
                         "expert %d is out of range: '%s' has %d experts (0 to %d)", e, op->path, E, E - 1);
      if (owner[e] < 0) owner[e] = r[i].stream;
    }
  }
  for (int e = 0; e < E; e++)
    if (owner[e] < 0)
      return dsl_error(d, op->pos, "expert %d of op '%s' matches no owner rule of schedule '%s' (%s)", e, op->path,
                       p->sched->name.text, p->sched->src ? p->sched->src->path : "?");
  return 0;
}

/* "[a:b]" for a contiguous set, else "[a,b,...]". */
static char *selector_text(const int *ex, int n) {
  size_t cap = 16 + (size_t)n * 12;
  char *t = ir_xrealloc(NULL, cap);
  if (ex[n - 1] - ex[0] == n - 1) {
    snprintf(t, cap, "[%d:%d]", ex[0], ex[n - 1] + 1);
    return t;
  }
  size_t m = 0;
  for (int i = 0; i < n; i++) m += (size_t)snprintf(t + m, cap - m, "%c%d", i ? ',' : '[', ex[i]);
  snprintf(t + m, cap - m, "]");
  return t;
}

static char *join(const char *a, const char *b) {
  size_t na = strlen(a), nb = strlen(b);
  char *s = ir_xrealloc(NULL, na + nb + 1);
  memcpy(s, a, na);
  memcpy(s + na, b, nb + 1);
  return s;
}

/* A weight holding the given expert rows of w, on a device. */
static int expert_view(ir_prog *p, int w, const int *ex, int n, const char *sel, int device) {
  ir_tensor v = p->tensors[w];
  v.path = join(v.path, sel);
  v.pos = p->tensors[w].pos;
  v.checkpoint = NULL;
  v.view_of = w;
  v.rows = ir_xrealloc(NULL, (size_t)n * sizeof *v.rows);
  memcpy(v.rows, ex, (size_t)n * sizeof *v.rows);
  v.bytes = v.bytes / v.dim[0] * n;
  v.dim[0] = n;
  v.device = device;
  return ir_add_tensor(p, &v);
}

/* The first op (in program order) that reads tensor t. */
static int first_reader(const ir_prog *p, int t) {
  for (int i = 0; i < p->nops; i++)
    if (ir_op_reads(p, &p->ops[i], t)) return i;
  return -1;
}

/* Splits expert op `i` into one launch per owning stream, each writing
 * its rows of a parts tensor, and a sum_parts merge on the stream of the
 * result's first reader. Slots of other owners' experts are zero in a
 * part, so the merge reproduces the unsplit result bit for bit. Returns
 * the number of new ops written to out. */
static int split_experts(ir_prog *p, int i, const int *owner, int E, ir_op *out) {
  ir_op op = p->ops[i];
  int streams[IR_MAXIO], ng = 0;
  for (int e = 0; e < E; e++) {
    int g = 0;
    while (g < ng && streams[g] != owner[e]) g++;
    if (g == ng) streams[ng++] = owner[e];
  }
  int slots = op.out[0], reader = first_reader(p, slots);
  int merge_stream = reader >= 0 && p->ops[reader].stream >= 0 ? p->ops[reader].stream : streams[0];
  ir_tensor parts = p->tensors[slots];
  parts.path = join(parts.path, ".parts");
  parts.dim[0] *= ng;
  parts.bytes *= ng;
  parts.device = p->streams[merge_stream].device;
  int pt = ir_add_tensor(p, &parts);
  int64_t T = p->tensors[slots].dim[0];
  for (int g = 0; g < ng; g++) {
    int n = 0, *row = ir_xrealloc(NULL, (size_t)E * sizeof *row), *ex = ir_xrealloc(NULL, (size_t)E * sizeof *ex);
    for (int e = 0; e < E; e++) {
      row[e] = -1;
      if (owner[e] == streams[g]) row[e] = n, ex[n++] = e;
    }
    char *sel = selector_text(ex, n);
    ir_op part = op;
    part.path = join(op.path, sel);
    part.stream = streams[g];
    part.device = p->streams[streams[g]].device;
    for (int w = 2; w < 5; w++) part.in[w] = expert_view(p, op.in[w], ex, n, sel, part.device);
    part.out[0] = pt;
    part.out_row0[0] = g * T;
    part.out_nrows[0] = T;
    part.expert_row = row;
    part.nexperts = E;
    out[g] = part;
    ir_xfree(sel);
    ir_xfree(ex);
  }
  ir_op merge = {0};
  merge.path = join(op.path, ".merge");
  merge.pos = op.pos;
  merge.kind = IR_OP_SUM_PARTS;
  merge.nin = merge.nout = 1;
  merge.in[0] = pt;
  merge.in_pos[0] = op.out_pos[0];
  merge.out[0] = slots;
  merge.out_pos[0] = op.out_pos[0];
  merge.iattr[0] = ng;
  merge.stream = merge_stream;
  merge.device = p->streams[merge_stream].device;
  merge.kernel = -1;
  out[ng] = merge;
  ir_xfree(op.path);
  return ng + 1;
}

static int expert_count(const ir_prog *p, const ir_op *op) { return (int)p->tensors[op->in[2]].dim[0]; }

static int place_ops(ir_prog *p, dsl_diag *d) {
  const dsl_schedule *s = p->sched;
  place_rule *r;
  int nr;
  if (resolve_rules(p, &r, &nr, d)) return -1;
  int rc = 0, nsplit = 0, nowned = p->nops, **owners = ir_xrealloc(NULL, (size_t)(nowned ? nowned : 1) * sizeof *owners);
  memset(owners, 0, (size_t)(nowned ? nowned : 1) * sizeof *owners);
  for (int i = 0; i < p->nops && !rc; i++) {
    ir_op *op = &p->ops[i];
    if (op->kind == IR_OP_MOE_EXPERTS) {
      int E = expert_count(p, op), *own = ir_xrealloc(NULL, (size_t)E * sizeof *own);
      if ((rc = assign_experts(p, op, r, nr, own, E, d))) {
        ir_xfree(own);
        break;
      }
      int one = 1;
      for (int e = 1; e < E; e++) one &= own[e] == own[0];
      op->stream = own[0];
      if (one) ir_xfree(own);
      else owners[i] = own, nsplit++;
    }
    for (int k = 0; k < nr && op->stream < 0; k++)
      if (ir_glob_match(r[k].glob, op->path)) {
        if (r[k].nexperts >= 0)
          rc = dsl_error(d, dsl_pos_at(&r[k].src->glob, r[k].sel_at),
                         "owner rule selects experts, but it matches '%s' (kind %s), not a moe_experts op",
                         op->path, ir_opkinds[op->kind].name);
        op->stream = r[k].stream;
      }
    if (!rc && op->stream < 0)
      rc = dsl_error(d, op->pos, "op '%s' matches no owner rule of schedule '%s' (%s)", op->path, s->name.text,
                     s->src ? s->src->path : "?");
    if (!rc) op->device = p->streams[op->stream].device;
  }
  if (!rc && nsplit) {
    /* Rebuild the op list with each split op's parts and merge in its place. */
    int cap = p->nops + nsplit * (IR_MAXIO + 1), n = 0;
    ir_op *ops = ir_xrealloc(NULL, (size_t)cap * sizeof *ops);
    for (int i = 0; i < p->nops; i++) {
      if (!owners[i]) {
        ops[n++] = p->ops[i];
        continue;
      }
      int distinct = 0, E = expert_count(p, &p->ops[i]);
      for (int e = 0; e < E; e++) {
        int seen = 0;
        for (int f = 0; f < e; f++) seen |= owners[i][f] == owners[i][e];
        distinct += !seen;
      }
      if (distinct > IR_MAXIO) {
        rc = dsl_error(d, p->ops[i].pos, "op '%s' is split among %d owners; at most %d are supported",
                       p->ops[i].path, distinct, IR_MAXIO);
        for (int j = i; j < p->nops; j++) ops[n++] = p->ops[j];
        break;
      }
      n += split_experts(p, i, owners[i], E, &ops[n]);
    }
    ir_xfree(p->ops);
    p->ops = ops;
    p->nops = n;
    p->capops = cap;
  }
  for (int i = 0; i < nowned; i++) ir_xfree(owners[i]);
  ir_xfree(owners);
  free_rules(r, nr);
  return rc;
}

/* A tensor's home: the device of its first writer; unwritten tensors
 * (weights, inputs) live with their first reader. */
static void place_tensors(ir_prog *p) {
  for (int i = 0; i < p->nops; i++)
    for (int j = 0; j < p->ops[i].nout; j++)
      if (p->tensors[p->ops[i].out[j]].device < 0) p->tensors[p->ops[i].out[j]].device = p->ops[i].device;
  for (int i = 0; i < p->nops; i++)
    for (int j = 0; j < p->ops[i].nin; j++)
      if (p->tensors[p->ops[i].in[j]].device < 0) p->tensors[p->ops[i].in[j]].device = p->ops[i].device;
  /* A weight no op reads directly (the source of expert views, or unused)
   * stays off every arena; other unused tensors stay on device 0. */
  for (int i = 0; i < p->ntensors; i++)
    if (p->tensors[i].device < 0 && p->tensors[i].role != PLAN_WEIGHT) p->tensors[i].device = 0;
}

/* The default prompt must fit the state; the slots of the two plans were
 * bound in expand, where shapes need them. */
static int place_step(ir_prog *p, dsl_diag *d) {
  const dsl_schedule *s = p->sched;
  int64_t v = 0;
  if (s->step_prompt.text && parse_int(&s->step_prompt, 1, p->max_seq, &v, d)) return -1;
  p->prompt = (int)v;
  return 0;
}

/* A schedule names the model it was written for; it also fits every model
 * that extends that one (the same blocks, so the same op paths). */
static int schedule_fits(const dsl_schedule *s, const dsl_model *m) {
  for (; m; m = m->base)
    if (strcmp(s->model.text, m->name.text) == 0) return 1;
  return 0;
}

int pass_place(ir_prog *p, dsl_diag *d) {
  const dsl_schedule *s = p->sched;
  if (!schedule_fits(s, p->model))
    return dsl_error(d, s->model.pos, "schedule '%s' is for model '%s', not '%s'", s->name.text, s->model.text,
                     p->model->name.text);
  if (place_devices(p, d) || place_streams(p, d) || place_ops(p, d) || place_step(p, d)) return -1;
  place_tensors(p);
  return 0;
}
