/* calibrate.c - `ds4c calibrate`: fits each device's cost profile to what
 * a ds4run trace measured. The plans' WORK gives every op's bytes and
 * FLOPs, the trace every launch's and copy's duration in every step; the
 * median over steps of one (plan, op) is a sample. A device's launches fit
 * launch + max(bytes / bandwidth, flops / rate), its copies copy_launch +
 * bytes / copy_bandwidth, each by least squares on the logarithm (a
 * Nelder-Mead search over the parameters' logarithms), so a 2 us launch
 * weighs as much as a 2 ms one. The report replays each plan under the
 * old costs (the plan's COSTS) and the fitted ones (explain's simulation)
 * beside the measured median step. */
#include "calibrate.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "explain.h"
#include "json_parse.h"
#include "plan.h"
#include "trace.h"

/* ---- the fits ---- */

/* The profile's parameters stay within these (bytes/s, FLOP/s, seconds):
 * a rate that no sample binds drifts to the top and binds nothing. */
#define CALIB_RATE_MIN 1e3
#define CALIB_RATE_MAX 1e18
#define CALIB_TIME_MIN 1e-12
#define CALIB_TIME_MAX 1.0

typedef struct fit_data {
  const double *b, *f, *t;
  int n;
  int copies; /* the copy model: x[0] launch, x[1] bandwidth */
} fit_data;

static double clampd(double v, double lo, double hi) { return v < lo ? lo : v > hi ? hi : v; }

/* x holds logarithms: launch, bandwidth[, flops]. */
static double predict(const fit_data *fd, const double *x, int i) {
  double launch = exp(x[0]), bw = exp(x[1]);
  double t = fd->b[i] / bw;
  if (!fd->copies) {
    double tm = fd->f[i] / exp(x[2]);
    if (tm > t) t = tm;
  }
  return launch + t;
}

static double objective(const fit_data *fd, const double *x) {
  double lo[3] = {log(CALIB_TIME_MIN), log(CALIB_RATE_MIN), log(CALIB_RATE_MIN)};
  double hi[3] = {log(CALIB_TIME_MAX), log(CALIB_RATE_MAX), log(CALIB_RATE_MAX)};
  double penalty = 0;
  for (int k = 0; k < (fd->copies ? 2 : 3); k++)
    if (x[k] < lo[k] || x[k] > hi[k]) penalty += 1e6 * (1 + fabs(x[k]));
  double sum = 0;
  for (int i = 0; i < fd->n; i++) {
    double r = log(predict(fd, x, i)) - log(fd->t[i]);
    sum += r * r;
  }
  return sum + penalty;
}

/* Nelder-Mead over dim (2 or 3) parameters from x, restarted from its best
 * point until a restart no longer improves it. */
static void minimise(const fit_data *fd, int dim, double *x) {
  double best = objective(fd, x);
  for (int restart = 0; restart < 8; restart++) {
    double s[4][3], v[4];
    for (int i = 0; i <= dim; i++) {
      for (int k = 0; k < dim; k++) s[i][k] = x[k] + (i == k + 1 ? log(4.0) : 0.0);
      v[i] = objective(fd, s[i]);
    }
    for (int it = 0; it < 4000; it++) {
      int hi = 0, lo = 0, nh = 0;
      for (int i = 1; i <= dim; i++) {
        if (v[i] > v[hi]) hi = i;
        if (v[i] < v[lo]) lo = i;
      }
      for (int i = 0; i <= dim; i++)
        if (i != hi && (nh == hi || v[i] > v[nh])) nh = i;
      if (v[hi] - v[lo] <= 1e-15 * (1 + fabs(v[lo]))) break;
      double c[3] = {0}, r[3], e[3], k3[3];
      for (int i = 0; i <= dim; i++)
        if (i != hi)
          for (int k = 0; k < dim; k++) c[k] += s[i][k] / dim;
      for (int k = 0; k < dim; k++) r[k] = c[k] + (c[k] - s[hi][k]);
      double vr = objective(fd, r);
      if (vr < v[lo]) {
        for (int k = 0; k < dim; k++) e[k] = c[k] + 2 * (c[k] - s[hi][k]);
        double ve = objective(fd, e);
        memcpy(s[hi], ve < vr ? e : r, sizeof s[hi]);
        v[hi] = ve < vr ? ve : vr;
      } else if (vr < v[nh]) {
        memcpy(s[hi], r, sizeof s[hi]);
        v[hi] = vr;
      } else {
        for (int k = 0; k < dim; k++) k3[k] = c[k] + 0.5 * (s[hi][k] - c[k]);
        double vk = objective(fd, k3);
        if (vk < v[hi]) {
          memcpy(s[hi], k3, sizeof s[hi]);
          v[hi] = vk;
        } else {
          for (int i = 0; i <= dim; i++) {
            if (i == lo) continue;
            for (int k = 0; k < dim; k++) s[i][k] = s[lo][k] + 0.5 * (s[i][k] - s[lo][k]);
            v[i] = objective(fd, s[i]);
          }
        }
      }
    }
    int lo = 0;
    for (int i = 1; i <= dim; i++)
      if (v[i] < v[lo]) lo = i;
    if (!(v[lo] < best * (1 - 1e-12))) break;
    best = v[lo];
    memcpy(x, s[lo], (size_t)dim * sizeof *x);
  }
}

/* The median of v[0..n-1] (sorts v). */
static double median(double *v, int n) {
  rt_sort_doubles(v, n);
  return rt_quantile(v, n, 0.5);
}

/* A starting rate: the median of work / time over the samples with work. */
static double start_rate(const double *w, const double *t, int n, double launch) {
  double *r = malloc((size_t)(n ? n : 1) * sizeof *r);
  int m = 0;
  for (int i = 0; r && i < n; i++)
    if (w[i] > 0) r[m++] = w[i] / fmax(t[i] - launch, 0.1 * t[i]);
  double v = m ? median(r, m) : 1e12;
  free(r);
  return clampd(v, CALIB_RATE_MIN, CALIB_RATE_MAX);
}

static double smallest(const double *t, int n) {
  double v = t[0];
  for (int i = 1; i < n; i++) v = fmin(v, t[i]);
  return v;
}

void calib_fit_launches(const double *b, const double *f, const double *t, int n, calib_device *out) {
  fit_data fd = {b, f, t, n, 0};
  double launch = clampd(0.5 * smallest(t, n), CALIB_TIME_MIN, CALIB_TIME_MAX);
  double x[3] = {log(launch), log(start_rate(b, t, n, launch)), log(start_rate(f, t, n, launch))};
  minimise(&fd, 3, x);
  out->launch = exp(x[0]);
  out->bandwidth = clampd(exp(x[1]), CALIB_RATE_MIN, CALIB_RATE_MAX);
  out->flops = clampd(exp(x[2]), CALIB_RATE_MIN, CALIB_RATE_MAX);
  out->launches = n;
}

int calib_fit_copies(const double *b, const double *t, int n, calib_device *out) {
  int sizes = 0;
  for (int i = 0; i < n && sizes < 2; i++) sizes += i == 0 || b[i] != b[0];
  out->copies = n;
  if (sizes < 2) return 0;
  fit_data fd = {b, NULL, t, n, 1};
  double launch = clampd(0.5 * smallest(t, n), CALIB_TIME_MIN, CALIB_TIME_MAX);
  double x[2] = {log(launch), log(start_rate(b, t, n, launch))};
  minimise(&fd, 2, x);
  out->has_copy = 1;
  out->copy_launch = exp(x[0]);
  out->copy_bandwidth = clampd(exp(x[1]), CALIB_RATE_MIN, CALIB_RATE_MAX);
  return 1;
}

/* ---- the trace and the plans ---- */

/* One plan of the bundle and what the trace measured of it. */
typedef struct calib_plan {
  plan p;
  int loaded;
  const char *shape;    /* "prefill" or "decode" */
  uint32_t *by_path;    /* op indices sorted by path */
  double **dur;         /* per op: measured seconds, one per step */
  int *ndur, *capdur;
  double *steps;        /* measured step seconds */
  int nsteps, capsteps;
  uint32_t *ncopycmds;  /* per op: its COPY commands */
} calib_plan;

static const plan *sort_plan; /* qsort's context: the plan being indexed */

static int cmp_path(const void *a, const void *b) {
  const plan *p = sort_plan;
  return strcmp(plan_str(p, p->ops[*(const uint32_t *)a].path), plan_str(p, p->ops[*(const uint32_t *)b].path));
}

static uint32_t find_op(const calib_plan *cp, const char *path) {
  uint32_t lo = 0, hi = cp->p.nops;
  while (lo < hi) {
    uint32_t mid = lo + (hi - lo) / 2;
    int c = strcmp(plan_str(&cp->p, cp->p.ops[cp->by_path[mid]].path), path);
    if (c == 0) return cp->by_path[mid];
    if (c < 0) lo = mid + 1;
    else hi = mid;
  }
  return PLAN_NONE;
}

static rt_status push(double **v, int *n, int *cap, double x) {
  if (*n == *cap) {
    int c = *cap ? 2 * *cap : 8;
    double *nv = realloc(*v, (size_t)c * sizeof *nv);
    if (!nv) return rt_status_make("out of memory");
    *v = nv;
    *cap = c;
  }
  (*v)[(*n)++] = x;
  return NULL;
}

static rt_status load_plan(const char *bundle, const char *sub, const char *shape, calib_plan *cp) {
  char path[4200];
  snprintf(path, sizeof path, "%s%s/plan.ds4p", bundle, sub);
  if (*sub && access(path, F_OK)) return NULL; /* a bundle of one plan */
  RT_TRY(plan_read(path, &cp->p));
  cp->loaded = 1;
  cp->shape = shape;
  const plan *p = &cp->p;
  if (p->nwork != p->nops)
    return rt_status_make("%s: the plan holds no bytes and FLOPs per op (WORK, since plan format 3.5); "
                          "recompile the bundle with ds4c compile", path);
  uint32_t n = p->nops ? p->nops : 1;
  cp->by_path = malloc(n * sizeof *cp->by_path);
  cp->dur = calloc(n, sizeof *cp->dur);
  cp->ndur = calloc(n, sizeof *cp->ndur);
  cp->capdur = calloc(n, sizeof *cp->capdur);
  cp->ncopycmds = calloc(n, sizeof *cp->ncopycmds);
  if (!cp->by_path || !cp->dur || !cp->ndur || !cp->capdur || !cp->ncopycmds) return rt_status_make("out of memory");
  for (uint32_t i = 0; i < p->nops; i++) cp->by_path[i] = i;
  sort_plan = p;
  qsort(cp->by_path, p->nops, sizeof *cp->by_path, cmp_path);
  for (uint32_t i = 0; i < p->ncommands; i++)
    if (p->commands[i].kind == PLAN_CMD_COPY) cp->ncopycmds[p->commands[i].op]++;
  return NULL;
}

static void free_plan(calib_plan *cp) {
  if (!cp->loaded) return;
  for (uint32_t i = 0; i < cp->p.nops; i++) free(cp->dur ? cp->dur[i] : NULL);
  free(cp->dur);
  free(cp->ndur);
  free(cp->capdur);
  free(cp->by_path);
  free(cp->ncopycmds);
  free(cp->steps);
  plan_free(&cp->p);
}

/* A number member of an event's args, or -1. */
static double arg_number(const json_value *ev, const char *key) {
  const json_value *v = json_get(json_get(ev, "args"), key);
  return v && v->kind == JSON_NUMBER ? v->number : -1;
}

static const char *str_member(const json_value *v, const char *key) {
  const json_value *m = json_get(v, key);
  return m && m->kind == JSON_STRING ? m->text : NULL;
}

/* The trace's spans into the plans: each host `step N` event says which
 * plan ran step N and how long it took; each launch and copy is then a
 * duration of that plan's op. */
static rt_status read_spans(const char *trace, const json_value *events, calib_plan *plans, int *step_plan,
                            int maxstep) {
  for (size_t i = 0; i < events->n; i++) {
    const json_value *ev = events->items[i];
    const char *cat = str_member(ev, "cat"), *ph = str_member(ev, "ph"), *name = str_member(ev, "name");
    if (!cat || !ph || !name || strcmp(ph, "X") || strcmp(cat, "host") || strncmp(name, "step ", 5)) continue;
    int step = (int)arg_number(ev, "step");
    const char *shape = str_member(json_get(ev, "args"), "plan");
    int k = shape && strcmp(shape, "decode") == 0 ? 1 : 0;
    if (step < 0 || step >= maxstep || !shape || !plans[k].loaded)
      return rt_status_make("%s: host event '%s' names no step of a plan the bundle has", trace, name);
    step_plan[step] = k;
    const json_value *dur = json_get(ev, "dur");
    if (dur && dur->kind == JSON_NUMBER)
      RT_TRY(push(&plans[k].steps, &plans[k].nsteps, &plans[k].capsteps, dur->number * 1e-6));
  }
  for (size_t i = 0; i < events->n; i++) {
    const json_value *ev = events->items[i];
    const char *cat = str_member(ev, "cat"), *ph = str_member(ev, "ph"), *name = str_member(ev, "name");
    if (!cat || !ph || !name || strcmp(ph, "X") || (strcmp(cat, "launch") && strcmp(cat, "copy"))) continue;
    int step = (int)arg_number(ev, "step");
    const json_value *dur = json_get(ev, "dur");
    if (step < 0 || step >= maxstep || step_plan[step] < 0 || !dur || dur->kind != JSON_NUMBER)
      return rt_status_make("%s: %s event '%s' has no step the host track ran, or no duration", trace, cat, name);
    calib_plan *cp = &plans[step_plan[step]];
    uint32_t op = find_op(cp, name);
    if (op == PLAN_NONE)
      return rt_status_make("%s: '%s' (step %d) is no op of the bundle's %s plan: the trace is of another bundle "
                            "(give the one it ran with --bundle)", trace, name, step, cp->shape);
    RT_TRY(push(&cp->dur[op], &cp->ndur[op], &cp->capdur[op], dur->number * 1e-6));
  }
  return NULL;
}

/* ---- the fits of every device ---- */

typedef struct samples {
  double *b, *f, *t;
  int n, cap;
} samples;

static rt_status add_sample(samples *s, double b, double f, double t) {
  if (s->n == s->cap) {
    int c = s->cap ? 2 * s->cap : 64;
    double *nb = realloc(s->b, (size_t)c * sizeof *nb);
    if (nb) s->b = nb;
    double *nf = realloc(s->f, (size_t)c * sizeof *nf);
    if (nf) s->f = nf;
    double *nt = realloc(s->t, (size_t)c * sizeof *nt);
    if (nt) s->t = nt;
    if (!nb || !nf || !nt) return rt_status_make("out of memory");
    s->cap = c;
  }
  s->b[s->n] = b, s->f[s->n] = f, s->t[s->n] = t;
  s->n++;
  return NULL;
}

/* Every measured (plan, op) of device dv as a launch or a copy sample: its
 * work and the median of its durations. */
static rt_status device_samples(calib_plan *plans, uint32_t dv, samples *launch, samples *copy) {
  for (int k = 0; k < 2; k++) {
    calib_plan *cp = &plans[k];
    if (!cp->loaded) continue;
    for (uint32_t i = 0; i < cp->p.nops; i++) {
      if (!cp->ndur[i] || cp->p.streams[cp->p.ops[i].stream].device != dv) continue;
      double t = median(cp->dur[i], cp->ndur[i]);
      if (!(t > 0)) continue; /* below the clock's resolution: no information */
      const plan_work *w = &cp->p.work[i];
      RT_TRY(cp->p.ops[i].kernel == PLAN_NONE ? add_sample(copy, w->bytes, 0, t)
                                                : add_sample(launch, w->bytes, w->flops, t));
    }
  }
  return NULL;
}

/* ---- predictions ---- */

/* Op i's seconds under the fitted profiles, as order.c prices it. */
static double fitted_cost(const plan *p, const calib_device *dev, uint32_t i, uint32_t ncopycmds) {
  const plan_work *w = &p->work[i];
  const calib_device *d = &dev[p->streams[p->ops[i].stream].device];
  if (p->ops[i].kernel != PLAN_NONE) return d->launch + fmax(w->bytes / d->bandwidth, w->flops / d->flops);
  if (d->has_copy) return d->copy_launch * ncopycmds + w->bytes / d->copy_bandwidth;
  double bw = d->bandwidth;
  for (uint32_t c = 0; c < p->ncommands; c++) {
    const plan_command *cmd = &p->commands[c];
    if (cmd->kind != PLAN_CMD_COPY || cmd->op != i) continue;
    for (uint32_t a = 0; a < cmd->nargs; a++) {
      uint32_t tdev = p->tensors[p->args[cmd->args_begin + a].tensor].device;
      if (tdev != PLAN_NONE) bw = fmin(bw, dev[tdev].bandwidth);
    }
  }
  return d->launch * ncopycmds + w->bytes / bw;
}

/* The plan's step simulated under costs (ns) instead of its own. */
static rt_status simulate_with(calib_plan *cp, double *costs, double *step_s) {
  double *own = cp->p.costs;
  cp->p.costs = costs;
  expl_result r;
  rt_status st = expl_simulate(cp->shape, &cp->p, &r);
  cp->p.costs = own;
  if (st) return st;
  *step_s = r.makespan * 1e-9;
  expl_result_free(&r);
  return NULL;
}

/* Each plan's step under the fitted profiles, dispatch added to every
 * launch and copy cost (seconds): the sum over the measured plans of the
 * squared log error against their median steps. */
static double step_error(calib_plan *plans, calib_device *dev, uint32_t ndev, double dispatch) {
  calib_device *shifted = malloc((ndev ? ndev : 1) * sizeof *shifted);
  if (!shifted) return INFINITY;
  for (uint32_t d = 0; d < ndev; d++) {
    shifted[d] = dev[d];
    shifted[d].launch += dispatch;
    shifted[d].copy_launch += dispatch;
  }
  double err = 0;
  for (int k = 0; k < 2; k++) {
    calib_plan *cp = &plans[k];
    if (!cp->loaded || !cp->nsteps) continue;
    double *costs = malloc((cp->p.nops ? cp->p.nops : 1) * sizeof *costs), step;
    if (!costs) {
      err = INFINITY;
      break;
    }
    for (uint32_t i = 0; i < cp->p.nops; i++) costs[i] = 1e9 * fitted_cost(&cp->p, shifted, i, cp->ncopycmds[i]);
    rt_status st = simulate_with(cp, costs, &step);
    free(costs);
    if (st) {
      rt_status_free(st);
      err = INFINITY;
      break;
    }
    double r = log(step) - log(median(cp->steps, cp->nsteps));
    err += r * r;
  }
  free(shifted);
  return err;
}

/* What a launch costs beyond its kernel's own time (the trace's spans
 * measure the kernel; a step also waits for each launch to be dispatched
 * and for streams to hand over): the one addition to every device's launch
 * and copy_launch that makes the simulated steps the measured ones, by a
 * scan over 1 ns .. 1 ms and a golden-section refinement. */
static double fit_dispatch(calib_plan *plans, calib_device *dev, uint32_t ndev) {
  double best = 0, best_err = step_error(plans, dev, ndev, 0);
  for (int i = 0; i <= 120; i++) {
    double x = 1e-9 * pow(10.0, i / 20.0), e = step_error(plans, dev, ndev, x);
    if (e < best_err) best = x, best_err = e;
  }
  double lo = best / 1.2, hi = best * 1.2 + 1e-10;
  for (int it = 0; it < 60; it++) {
    double a = hi - 0.618 * (hi - lo), b = lo + 0.618 * (hi - lo);
    if (step_error(plans, dev, ndev, a) < step_error(plans, dev, ndev, b)) hi = b;
    else lo = a;
  }
  double mid = 0.5 * (lo + hi);
  return step_error(plans, dev, ndev, mid) < best_err ? mid : best;
}

static const char *kind_of(const plan *p, uint32_t op) {
  return p->ops[op].kernel == PLAN_NONE ? "copy" : plan_str(p, p->kernels[p->ops[op].kernel].kind);
}

/* Per plan: the step as the old and the fitted profile predict it and as
 * measured; then, per op kind, the summed op times of one step. */
static rt_status report_plan(calib_plan *cp, const calib_device *dev, FILE *out) {
  const plan *p = &cp->p;
  uint32_t n = p->nops ? p->nops : 1;
  double *after = malloc(n * sizeof *after);
  if (!after) return rt_status_make("out of memory");
  for (uint32_t i = 0; i < p->nops; i++) after[i] = 1e9 * fitted_cost(p, dev, i, cp->ncopycmds[i]);
  double before_s, after_s;
  rt_status st = simulate_with(cp, p->costs, &before_s);
  if (!st) st = simulate_with(cp, after, &after_s);
  if (st) {
    free(after);
    return st;
  }
  double measured = cp->nsteps ? median(cp->steps, cp->nsteps) : 0;
  fprintf(out, "\n%s step (%d measured): predicted %.1f us before, %.1f us after; measured %.1f us (median)\n",
          cp->shape, cp->nsteps, before_s * 1e6, after_s * 1e6, measured * 1e6);
  fprintf(out, "  %-22s %10s %10s %10s  (us, one step's ops summed)\n", "op kind", "before", "after", "measured");
  for (uint32_t i = 0; i < p->nops; i++) {
    const char *kind = kind_of(p, i);
    int first = 1;
    for (uint32_t j = 0; j < i && first; j++) first = strcmp(kind_of(p, j), kind) != 0;
    if (!first) continue;
    double b = 0, a = 0, m = 0;
    for (uint32_t j = i; j < p->nops; j++) {
      if (strcmp(kind_of(p, j), kind)) continue;
      b += p->costs[j] * 1e-3;
      a += after[j] * 1e-3;
      if (cp->ndur[j]) m += median(cp->dur[j], cp->ndur[j]) * 1e6;
    }
    fprintf(out, "  %-22s %10.1f %10.1f %10.1f\n", kind, b, a, m);
  }
  free(after);
  return NULL;
}

/* ---- the profile file ---- */

static rt_status write_profile(const calib_options *o, const plan *p, const calib_device *dev, int nsteps) {
  char tmp[4200];
  snprintf(tmp, sizeof tmp, "%s.tmp-%d", o->out, (int)getpid());
  FILE *f = fopen(tmp, "w");
  if (!f) return rt_status_make("cannot write %s: %s", tmp, strerror(errno));
  fprintf(f, "# Fitted by ds4c calibrate from %s: model %s, schedule %s, %d steps.\n", o->trace,
          plan_str(p, p->info.model), plan_str(p, p->info.schedule), nsteps);
  fprintf(f, "# A schedule takes it with `profile: FILE` (docs/SCHEDULES.md, \"Calibration\").\n");
  if (o->name) fprintf(f, "profile: %s\n", o->name);
  else fprintf(f, "profile: %s-calibrated\n", plan_str(p, p->info.schedule));
  fprintf(f, "devices:\n");
  for (uint32_t d = 0; d < p->ndevices; d++) {
    const calib_device *c = &dev[d];
    if (!c->launches) continue;
    fprintf(f, "  - {name: %s, bandwidth: %.4e, flops: %.4e, launch: %.4e", plan_str(p, p->devices[d].name),
            c->bandwidth, c->flops, c->launch);
    if (c->has_copy) fprintf(f, ", copy_bandwidth: %.4e, copy_launch: %.4e", c->copy_bandwidth, c->copy_launch);
    fprintf(f, "}\n");
  }
  int ok = !ferror(f);
  ok = fclose(f) == 0 && ok;
  if (!ok || rename(tmp, o->out)) {
    int e = errno;
    remove(tmp);
    return rt_status_make("cannot write %s: %s", o->out, strerror(e));
  }
  return NULL;
}

/* ---- the whole run ---- */

static rt_status read_trace(const char *path, json_value **out) {
  FILE *f = fopen(path, "rb");
  if (!f) return rt_status_make("%s: cannot read: %s", path, strerror(errno));
  char *text = NULL;
  size_t len = 0, cap = 0;
  for (;;) {
    if (len == cap) {
      cap = cap ? 2 * cap : 1 << 16;
      char *nt = realloc(text, cap);
      if (!nt) {
        free(text);
        fclose(f);
        return rt_status_make("%s: out of memory", path);
      }
      text = nt;
    }
    size_t got = fread(text + len, 1, cap - len, f);
    len += got;
    if (got == 0) break;
  }
  fclose(f);
  char err[256];
  *out = json_parse(text, len, err, sizeof err);
  free(text);
  if (!*out) return rt_status_make("%s: not a trace (JSON: %s)", path, err);
  return NULL;
}

static rt_status calibrate(const calib_options *o, const json_value *root, calib_plan *plans, calib_device **dev,
                           FILE *report) {
  const json_value *events = json_get(root, "traceEvents"), *other = json_get(root, "otherData");
  if (!events || events->kind != JSON_ARRAY)
    return rt_status_make("%s: no traceEvents (ds4run --trace FILE writes one)", o->trace);
  const char *bundle = o->bundle ? o->bundle : str_member(other, "bundle");
  if (!bundle) return rt_status_make("%s: names no bundle; give it with --bundle DIR", o->trace);
  RT_TRY(load_plan(bundle, "", "prefill", &plans[0]));
  RT_TRY(load_plan(bundle, "/decode", "decode", &plans[1]));
  const json_value *steps = json_get(other, "steps");
  int maxstep = steps && steps->kind == JSON_NUMBER && steps->number >= 1 && steps->number < 1e7 ? (int)steps->number : 0;
  if (!maxstep) return rt_status_make("%s: otherData.steps is missing (ds4run --trace FILE writes it)", o->trace);
  int *step_plan = malloc((size_t)maxstep * sizeof *step_plan);
  if (!step_plan) return rt_status_make("out of memory");
  for (int s = 0; s < maxstep; s++) step_plan[s] = -1;
  rt_status st = read_spans(o->trace, events, plans, step_plan, maxstep);
  free(step_plan);
  if (st) return st;

  const plan *p = &plans[0].p;
  *dev = calloc(p->ndevices ? p->ndevices : 1, sizeof **dev);
  if (!*dev) return rt_status_make("out of memory");
  fprintf(report, "ds4c calibrate: %s: model %s, schedule %s, bundle %s, %d steps\n", o->trace,
          plan_str(p, p->info.model), plan_str(p, p->info.schedule), bundle, maxstep);
  int fitted = 0;
  for (uint32_t d = 0; d < p->ndevices && !st; d++) {
    samples l = {0}, c = {0};
    st = device_samples(plans, d, &l, &c);
    calib_device *cd = &(*dev)[d];
    if (!st && l.n) {
      calib_fit_launches(l.b, l.f, l.t, l.n, cd);
      calib_fit_copies(c.b, c.t, c.n, cd);
      fitted++;
      int mem = 0;
      for (int i = 0; i < l.n; i++) mem += l.b[i] / cd->bandwidth >= l.f[i] / cd->flops;
      fprintf(report, "device %s: %d ops fitted (%d bound by bandwidth, %d by FLOPs): launch %.3g s, bandwidth "
              "%.4g B/s, flops %.4g FLOP/s", plan_str(p, p->devices[d].name), l.n, mem, l.n - mem, cd->launch,
              cd->bandwidth, cd->flops);
      if (cd->has_copy)
        fprintf(report, "; %d copies: copy_launch %.3g s, copy_bandwidth %.4g B/s", c.n, cd->copy_launch,
                cd->copy_bandwidth);
      else if (c.n)
        fprintf(report, "; %d copies, of one size: no copy rate fitted", c.n);
      fprintf(report, "\n");
    } else if (!st) {
      fprintf(report, "device %s: no launch measured; not in the profile\n", plan_str(p, p->devices[d].name));
    }
    free(l.b), free(l.f), free(l.t), free(c.b), free(c.f), free(c.t);
  }
  if (st) return st;
  if (!fitted) return rt_status_make("%s: no launch of the bundle's plans measured", o->trace);
  for (uint32_t d = 0; d < p->ndevices; d++)
    if (!(*dev)[d].launches) (*dev)[d] = (calib_device){1e12, 1e12, 0, 0, 0, 0, 0, 0}; /* unpredicted: idle */
  double dispatch = fit_dispatch(plans, *dev, p->ndevices);
  for (uint32_t d = 0; d < p->ndevices; d++)
    if ((*dev)[d].launches) {
      (*dev)[d].launch += dispatch;
      (*dev)[d].copy_launch += (*dev)[d].has_copy ? dispatch : 0;
    }
  fprintf(report, "dispatch: %.3g s a launch or copy beyond its kernel's time (fitted to the measured steps; "
          "added to each launch and copy_launch)\n", dispatch);
  for (int k = 0; k < 2 && !st; k++)
    if (plans[k].loaded && plans[k].nsteps) st = report_plan(&plans[k], *dev, report);
  return st;
}

rt_status calib_run(const calib_options *o, FILE *report) {
  json_value *root;
  RT_TRY(read_trace(o->trace, &root));
  calib_plan plans[2] = {0};
  calib_device *dev = NULL;
  char *text = NULL;
  size_t len = 0;
  FILE *mem = open_memstream(&text, &len); /* the report, printed only when all went well */
  rt_status st = mem ? calibrate(o, root, plans, &dev, mem) : rt_status_make("out of memory");
  if (mem && fclose(mem) && !st) st = rt_status_make("out of memory");
  if (!st) st = write_profile(o, &plans[0].p, dev, plans[0].nsteps + plans[1].nsteps);
  if (!st) {
    fputs(text, report);
    fprintf(report, "\nwrote %s\n", o->out);
  }
  free(text);
  free(dev);
  free_plan(&plans[0]);
  free_plan(&plans[1]);
  json_free(root);
  return st;
}
