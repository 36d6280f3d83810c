/* explain.c - `ds4c explain`: the plan's step replayed under the costs the
 * compiler predicted for its ops, so that a reviewer sees which ops make
 * the step as long as it is and why each of them starts when it does. */
#include "explain.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bundle_report.h"
#include "trace.h"

/* Where a stream stands in the replay: its time, and the op whose finish
 * set that time, an op of its own or one behind an event it waited on. */
typedef struct stream_clock {
  double t;
  uint32_t who;
  expl_cause cause;
  uint32_t event;
} stream_clock;

void expl_result_free(expl_result *r) {
  if (!r) return;
  free(r->ops);
  free(r->busy);
  free(r->path);
  memset(r, 0, sizeof *r);
}

typedef struct span {
  double start, finish;
} span;

static int by_start(const void *a, const void *b) {
  const span *x = a, *y = b;
  return (x->start > y->start) - (x->start < y->start);
}

/* Per device, the length of the union of its ops' [start, finish): two
 * streams of one device that run at once count once, so the share of the
 * step never exceeds 1. */
static rt_status device_busy(const plan *p, expl_result *r) {
  span *s = malloc((p->nops ? p->nops : 1) * sizeof *s);
  if (!s) return rt_status_make("out of memory");
  for (uint32_t d = 0; d < p->ndevices; d++) {
    uint32_t n = 0;
    for (uint32_t i = 0; i < p->nops; i++) {
      const expl_op *o = &r->ops[i];
      if (o->ran && o->finish > o->start && p->streams[p->ops[i].stream].device == d)
        s[n++] = (span){o->start, o->finish};
    }
    qsort(s, n, sizeof *s, by_start);
    double busy = 0;
    for (uint32_t k = 0; k < n;) {
      double lo = s[k].start, hi = s[k].finish;
      for (k++; k < n && s[k].start <= hi; k++)
        if (s[k].finish > hi) hi = s[k].finish;
      busy += hi - lo;
    }
    r->busy[d] = busy;
  }
  free(s);
  return NULL;
}

rt_status expl_simulate(const char *name, const plan *p, expl_result *out) {
  memset(out, 0, sizeof *out);
  if (p->ncosts == 0 && p->nops > 0)
    return rt_status_make("%s: the plan holds no predicted costs (plans before format 3.1 carry none); "
                          "recompile the bundle with ds4c compile",
                          name);
  if (p->ncosts != p->nops || (p->ncosts && !p->costs))
    return rt_status_make("%s: the plan holds %" PRIu32 " costs for %" PRIu32 " ops", name, p->ncosts, p->nops);
  expl_result r = {0};
  r.nops = p->nops;
  r.ops = calloc(p->nops ? p->nops : 1, sizeof *r.ops);
  r.busy = calloc(p->ndevices ? p->ndevices : 1, sizeof *r.busy);
  r.path = calloc(p->nops ? p->nops : 1, sizeof *r.path);
  stream_clock *clk = calloc(p->nstreams ? p->nstreams : 1, sizeof *clk);
  stream_clock *rec = calloc(p->ncommands ? p->ncommands : 1, sizeof *rec); /* by RECORD command */
  if (!r.ops || !r.busy || !r.path || !clk || !rec) {
    free(clk);
    free(rec);
    expl_result_free(&r);
    return rt_status_make("%s: out of memory simulating %" PRIu32 " commands", name, p->ncommands);
  }
  for (uint32_t s = 0; s < p->nstreams; s++) clk[s] = (stream_clock){0, PLAN_NONE, EXPL_START, PLAN_NONE};

  for (uint32_t i = 0; i < p->ncommands; i++) {
    const plan_command *c = &p->commands[i];
    stream_clock *sc = &clk[c->stream];
    switch (c->kind) {
    case PLAN_CMD_LAUNCH:
    case PLAN_CMD_COPY: {
      expl_op *o = &r.ops[c->op];
      if (o->ran) break; /* a later copy of a batch: its op's cost covers it */
      *o = (expl_op){true, sc->t, sc->t + p->costs[c->op], sc->cause, sc->who, sc->event};
      *sc = (stream_clock){o->finish, c->op, EXPL_STREAM, PLAN_NONE};
      break;
    }
    case PLAN_CMD_RECORD:
      rec[i] = *sc;
      break;
    case PLAN_CMD_WAIT:
      /* A tie keeps the stream's own cause: the wait did not delay it. */
      if (rec[c->b].t > sc->t) *sc = (stream_clock){rec[c->b].t, rec[c->b].who, EXPL_EVENT, c->a};
      break;
    }
  }
  free(clk);
  free(rec);

  uint32_t last = PLAN_NONE;
  for (uint32_t i = 0; i < p->nops; i++) {
    if (!r.ops[i].ran) {
      r.unrun++;
      continue;
    }
    if (last == PLAN_NONE || r.ops[i].finish >= r.ops[last].finish) last = i;
  }
  if (last != PLAN_NONE) r.makespan = r.ops[last].finish;
  /* Each step back goes to an op submitted earlier, so the walk ends. */
  for (uint32_t u = last; u != PLAN_NONE; u = r.ops[u].after) r.path[r.npath++] = u;
  rt_status st = device_busy(p, &r);
  if (st) {
    expl_result_free(&r);
    return rt_status_wrap(st, "%s", name);
  }
  *out = r;
  return NULL;
}

/* ---- the report ----------------------------------------------------------- */

static double share(double part, double whole) { return whole > 0 ? part / whole : 0; }

/* "device.stream" of stream s. */
static void stream_label(const plan *p, uint32_t s, char *buf, size_t n) {
  snprintf(buf, n, "%s.%s", plan_str(p, p->devices[p->streams[s].device].name), plan_str(p, p->streams[s].name));
}

static const char *op_path(const plan *p, uint32_t i) { return plan_str(p, p->ops[i].path); }

/* What the path spends on each device, and on copies. */
static void path_sums(const plan *p, const expl_result *r, double *by_device, double *copies) {
  *copies = 0;
  for (uint32_t d = 0; d < p->ndevices; d++) by_device[d] = 0;
  for (uint32_t k = 0; k < r->npath; k++) {
    uint32_t i = r->path[k];
    double dur = r->ops[i].finish - r->ops[i].start;
    by_device[p->streams[p->ops[i].stream].device] += dur;
    if (p->ops[i].kernel == PLAN_NONE) *copies += dur;
  }
}

static double path_total(const expl_result *r) {
  double t = 0;
  for (uint32_t k = 0; k < r->npath; k++) t += r->ops[r->path[k]].finish - r->ops[r->path[k]].start;
  return t;
}

static void write_text(const char *dir, const plan *p, const expl_result *r, const double *on_path, double copies,
                       FILE *f) {
  fprintf(f, "ds4c explain %s: model %s, schedule %s\n", dir, plan_str(p, p->info.model),
          plan_str(p, p->info.schedule));
  fprintf(f, "predicted step: %.3f µs (the compiler's cost model; %" PRIu32 " ops on %" PRIu32 " streams)\n",
          r->makespan / 1e3, p->nops, p->nstreams);
  if (r->unrun) fprintf(f, "left out: %" PRIu32 " ops that no command submits\n", r->unrun);

  int dw = 6;
  for (uint32_t d = 0; d < p->ndevices; d++) {
    int n = (int)strlen(plan_str(p, p->devices[d].name));
    if (n > dw) dw = n;
  }
  fprintf(f, "\n%-*s  %12s  %6s\n", dw, "device", "busy µs", "share");
  for (uint32_t d = 0; d < p->ndevices; d++)
    fprintf(f, "%-*s  %11.3f  %5.1f%%\n", dw, plan_str(p, p->devices[d].name), r->busy[d] / 1e3,
            100 * share(r->busy[d], r->makespan));

  char label[256];
  int sw = 6, ow = 2;
  for (uint32_t k = 0; k < r->npath; k++) {
    stream_label(p, p->ops[r->path[k]].stream, label, sizeof label);
    int n = (int)strlen(label), m = (int)strlen(op_path(p, r->path[k]));
    if (n > sw) sw = n;
    if (m > ow) ow = m;
  }
  fputs("\ncritical path, from the last-finishing op back to the step's start:\n", f);
  fprintf(f, "%12s  %12s  %11s  %-*s  %-*s  %s\n", "start µs", "finish µs", "µs", sw, "stream", ow, "op", "started");
  for (uint32_t k = 0; k < r->npath; k++) {
    uint32_t i = r->path[k];
    const expl_op *o = &r->ops[i];
    stream_label(p, p->ops[i].stream, label, sizeof label);
    fprintf(f, "%11.3f  %11.3f  %10.3f  %-*s  %-*s  ", o->start / 1e3, o->finish / 1e3, (o->finish - o->start) / 1e3,
            sw, label, ow, op_path(p, i));
    if (o->cause == EXPL_START) fputs("at the step's start\n", f);
    else if (o->cause == EXPL_STREAM) fprintf(f, "after %s on stream\n", op_path(p, o->after));
    else fprintf(f, "waits for %s via event %" PRIu32 "\n", op_path(p, o->after), o->event);
  }
  double total = path_total(r);
  fprintf(f, "path: %" PRIu32 " of %" PRIu32 " ops, %.3f µs, %.1f%% of the step; by device:", r->npath, p->nops,
          total / 1e3, 100 * share(total, r->makespan));
  for (uint32_t d = 0; d < p->ndevices; d++)
    fprintf(f, "%s %s %.3f µs (%.1f%%)", d ? "," : "", plan_str(p, p->devices[d].name), on_path[d] / 1e3,
            100 * share(on_path[d], r->makespan));
  fprintf(f, "; copies %.3f µs (%.1f%%)\n", copies / 1e3, 100 * share(copies, r->makespan));
}

/* Times go out with 17 significant digits, so a script reads back the
 * very doubles of the simulation (finish - start is the op's cost);
 * shares, derived from them, with 6. */
static void write_json(const char *dir, const plan *p, const expl_result *r, const double *on_path, double copies,
                       FILE *f) {
  fputs("{\n  \"bundle\": ", f);
  rt_json_string(f, dir);
  fputs(",\n  \"model\": ", f);
  rt_json_string(f, plan_str(p, p->info.model));
  fputs(",\n  \"schedule\": ", f);
  rt_json_string(f, plan_str(p, p->info.schedule));
  fprintf(f, ",\n  \"makespan_ns\": %.17g,\n  \"ops\": %" PRIu32 ",\n  \"unrun_ops\": %" PRIu32 ",\n  \"devices\": [",
          r->makespan, p->nops, r->unrun);
  for (uint32_t d = 0; d < p->ndevices; d++) {
    fputs(d ? ",\n    {\"name\": " : "\n    {\"name\": ", f);
    rt_json_string(f, plan_str(p, p->devices[d].name));
    fprintf(f, ", \"busy_ns\": %.17g, \"share\": %.6g, \"on_path_ns\": %.17g}", r->busy[d],
            share(r->busy[d], r->makespan), on_path[d]);
  }
  fputs(p->ndevices ? "\n  ],\n  \"path\": [" : "],\n  \"path\": [", f);
  for (uint32_t k = 0; k < r->npath; k++) {
    uint32_t i = r->path[k];
    const expl_op *o = &r->ops[i];
    const plan_stream *s = &p->streams[p->ops[i].stream];
    fprintf(f, "%s{\"op\": %" PRIu32 ", \"path\": ", k ? ",\n    " : "\n    ", i);
    rt_json_string(f, op_path(p, i));
    fputs(", \"device\": ", f);
    rt_json_string(f, plan_str(p, p->devices[s->device].name));
    fputs(", \"stream\": ", f);
    rt_json_string(f, plan_str(p, s->name));
    fprintf(f, ", \"kind\": \"%s\", \"start_ns\": %.17g, \"finish_ns\": %.17g, \"duration_ns\": %.17g, \"cost_ns\": %.17g, ",
            p->ops[i].kernel == PLAN_NONE ? "copy" : "launch", o->start, o->finish, o->finish - o->start, p->costs[i]);
    if (o->cause == EXPL_START) {
      fputs("\"after\": {\"reason\": \"start\"}}", f);
      continue;
    }
    fprintf(f, "\"after\": {\"reason\": \"%s\", \"op\": %" PRIu32 ", \"path\": ",
            o->cause == EXPL_STREAM ? "stream" : "event", o->after);
    rt_json_string(f, op_path(p, o->after));
    if (o->cause == EXPL_EVENT) fprintf(f, ", \"event\": %" PRIu32, o->event);
    fputs("}}", f);
  }
  double total = path_total(r);
  fprintf(f, "%s,\n  \"path_ops\": %" PRIu32 ",\n  \"path_ns\": %.17g,\n  \"path_share\": %.6g,\n"
             "  \"path_copies_ns\": %.17g\n}\n",
          r->npath ? "\n  ]" : "]", r->npath, total, share(total, r->makespan), copies);
}

/* The report of the plan in dir (a bundle, or its decode/ folder) to m. */
static rt_status report_plan(const char *dir, expl_format format, FILE *m) {
  struct stat sb;
  if (stat(dir, &sb) != 0) return rt_status_make("%s: %s", dir, strerror(errno));
  if (!S_ISDIR(sb.st_mode))
    return rt_status_make("%s: not a bundle (a bundle is the folder that ds4c compile -o writes)", dir);
  char *path;
  if (asprintf(&path, "%s/plan.ds4p", dir) < 0) return rt_status_make("out of memory");
  if (stat(path, &sb) != 0 && errno == ENOENT) {
    free(path);
    return rt_status_make("%s: not a bundle (it holds no plan.ds4p)", dir);
  }
  plan p;
  rt_status st = plan_read(path, &p);
  expl_result r = {0};
  if (!st) st = expl_simulate(path, &p, &r);
  free(path);
  double *on_path = NULL, copies = 0;
  if (!st && !(on_path = calloc(p.ndevices ? p.ndevices : 1, sizeof *on_path))) st = rt_status_make("out of memory");
  if (!st) {
    path_sums(&p, &r, on_path, &copies);
    if (format == EXPL_JSON) write_json(dir, &p, &r, on_path, copies, m);
    else write_text(dir, &p, &r, on_path, copies, m);
  }
  free(on_path);
  expl_result_free(&r);
  plan_free(&p);
  return st;
}

/* report_plan into *out_text (free it), nothing on failure. */
static rt_status report_text(const char *dir, int json, char **out_text, size_t *out_len) {
  *out_text = NULL;
  *out_len = 0;
  FILE *m = open_memstream(out_text, out_len);
  rt_status st = m ? report_plan(dir, json ? EXPL_JSON : EXPL_TEXT, m) : rt_status_make("out of memory");
  if (m && fclose(m) != 0 && !st) st = rt_status_make("out of memory");
  if (st) {
    free(*out_text);
    *out_text = NULL;
  }
  return st;
}

rt_status expl_report(const char *bundle_dir, expl_format format, FILE *out) {
  return brep_write(bundle_dir, format == EXPL_JSON, report_text, out);
}
