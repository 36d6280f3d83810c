/* trace_writer.c - ds4run --trace: every step's launch and copy spans, on
 * one time axis, as a Chrome trace-event file (Perfetto, chrome://tracing),
 * with a flow per event wait, and the metrics ds4run prints: busy time and
 * overlap per device (trace_stats.c), copy durations, and the critical path
 * of the last step (docs/RUNTIME.md, "Traces"). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rt_impl.h"
#include "trace.h"

/* The length of the well-formed UTF-8 sequence (RFC 3629: no overlong
 * forms, no surrogates, nothing above U+10FFFF) at u; 0 if there is none. */
static int utf8_len(const unsigned char *u) {
  unsigned c = u[0], lo = 0x80, hi = 0xbf;
  int n;
  if (c >= 0xc2 && c <= 0xdf) n = 2;
  else if (c >= 0xe0 && c <= 0xef) n = 3;
  else if (c >= 0xf0 && c <= 0xf4) n = 4;
  else return 0;
  if (c == 0xe0) lo = 0xa0;
  else if (c == 0xed) hi = 0x9f;
  else if (c == 0xf0) lo = 0x90;
  else if (c == 0xf4) hi = 0x8f;
  if (u[1] < lo || u[1] > hi) return 0;
  for (int i = 2; i < n; i++)
    if (u[i] < 0x80 || u[i] > 0xbf) return 0;
  return n;
}

void rt_json_string(FILE *f, const char *s) {
  const unsigned char *u = (const unsigned char *)s;
  fputc('"', f);
  while (*u) {
    unsigned c = *u;
    int n;
    if (c == '"' || c == '\\') {
      fputc('\\', f);
      fputc((int)c, f);
      u++;
    } else if (c < 0x20) {
      fprintf(f, "\\u%04x", c);
      u++;
    } else if (c < 0x80) {
      fputc((int)c, f);
      u++;
    } else if ((n = utf8_len(u)) > 0) {
      fwrite(u, 1, (size_t)n, f);
      u += n;
    } else {
      fputs("\\ufffd", f);
      u++;
    }
  }
  fputc('"', f);
}

/* The copies of one (stream, source device, destination device). */
typedef struct copy_group {
  rt_trace_copies out;
  double *dur_us; /* every copy's duration, every step */
  size_t n, cap;
} copy_group;

/* One plan of the bundle (the prefill plan's, the decode plan's) and its
 * structure, indexed by command: for a launch or copy, the previous launch
 * or copy on its stream; for a WAIT, the last launch or copy before the
 * RECORD it waits for, on the recording stream (the producer), and the
 * next launch or copy on its own stream (the consumer); for a copy, its
 * group. PLAN_NONE where there is none. */
typedef struct tw_view {
  rt_bundle *b;
  const plan *p;
  rt_overlap *ov;
  uint32_t *stream_prev, *producer, *consumer, *group;
} tw_view;

struct rt_trace_writer {
  tw_view views[2];
  int nviews;
  const tw_view *v; /* the view of the latest step */
  const plan *p;    /* its plan */
  char *path, *tmp, *bundle_name;
  FILE *f;
  int32_t decode_from;
  copy_group *groups; /* of both plans: the same streams and devices */
  uint32_t ngroups;
  uint64_t t0; /* the first step's first start: the file's time 0 */
  uint64_t *busy_ns; /* [ndevices] summed */
  uint64_t any_ns, both_ns, span_ns;
  uint64_t host_ns[3]; /* step, submit and wait nanoseconds, summed */
  int steps;
  uint64_t spans, flows;
  /* The last step's trace, for the critical path. */
  uint64_t *last_start, *last_end;
  uint64_t last_first_ns, last_span_ns;
  int last_step, last_decode;
  /* finish's results */
  int finished;
  rt_trace_summary sum;
  double *busy_us;
  rt_trace_copies *copies;
  rt_trace_path_op *path_ops;
  rt_trace_costs *kind_costs; /* [ncommands] at most */
};

static int timed(const plan_command *c) {
  return c->kind == PLAN_CMD_LAUNCH || c->kind == PLAN_CMD_COPY;
}

/* Nanoseconds as microseconds with all three decimals: exact, so a reader
 * gets the nanoseconds back. */
static void put_us(FILE *f, int64_t ns) {
  uint64_t a = ns < 0 ? (uint64_t)(-(ns + 1)) + 1 : (uint64_t)ns;
  fprintf(f, "%s%llu.%03llu", ns < 0 ? "-" : "", (unsigned long long)(a / 1000),
          (unsigned long long)(a % 1000));
}

static const char *backend_name(uint32_t backend) {
  static const char *names[] = {"cpu", "hip", "cuda"};
  return backend < 3 ? names[backend] : "?";
}

static rt_status find_structure(rt_trace_writer *w, tw_view *v) {
  const plan *p = v->p;
  uint32_t nc = p->ncommands, ns = p->nstreams;
  uint32_t *last = malloc((ns ? ns : 1) * sizeof *last);
  if (!last) return rt_status_make("out of memory");
  for (uint32_t s = 0; s < ns; s++) last[s] = PLAN_NONE;
  for (uint32_t i = 0; i < nc; i++) {
    const plan_command *c = &p->commands[i];
    v->stream_prev[i] = v->producer[i] = v->consumer[i] = v->group[i] = PLAN_NONE;
    if (timed(c)) {
      v->stream_prev[i] = last[c->stream];
      last[c->stream] = i;
    } else if (c->kind == PLAN_CMD_RECORD) {
      v->producer[i] = last[c->stream]; /* read by the WAITs of this record */
    } else if (c->kind == PLAN_CMD_WAIT) {
      v->producer[i] = v->producer[c->b];
    }
  }
  for (uint32_t s = 0; s < ns; s++) last[s] = PLAN_NONE;
  for (uint32_t i = nc; i-- > 0;) {
    const plan_command *c = &p->commands[i];
    if (timed(c)) last[c->stream] = i;
    else if (c->kind == PLAN_CMD_WAIT) v->consumer[i] = last[c->stream];
  }
  free(last);
  for (uint32_t i = 0; i < nc; i++) {
    const plan_command *c = &p->commands[i];
    if (c->kind != PLAN_CMD_COPY) continue;
    uint32_t from = p->tensors[p->args[c->args_begin].tensor].device;
    uint32_t to = p->tensors[p->args[c->args_begin + 1].tensor].device;
    uint32_t g = 0;
    while (g < w->ngroups && !(w->groups[g].out.stream == c->stream && w->groups[g].out.from == from &&
                               w->groups[g].out.to == to))
      g++;
    if (g == w->ngroups) {
      w->groups[g] = (copy_group){.out = {.stream = c->stream, .from = from, .to = to}};
      w->ngroups++;
    }
    v->group[i] = g;
  }
  return NULL;
}

static void put_metadata(rt_trace_writer *w) {
  const plan *p = w->p;
  FILE *f = w->f;
  fputs("{\"traceEvents\":[", f);
  for (uint32_t d = 0; d < p->ndevices; d++) {
    const plan_device *pd = &p->devices[d];
    char name[512];
    snprintf(name, sizeof name, "device %s (%s %s)", plan_str(p, pd->name), backend_name(pd->backend),
             plan_str(p, pd->arch));
    fprintf(f, "%s\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%u,\"tid\":0,\"args\":{\"name\":",
            d ? "," : "", d);
    rt_json_string(f, name);
    fprintf(f, "}},\n{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%u,\"tid\":0,"
               "\"args\":{\"sort_index\":%u}}", d, d);
  }
  for (uint32_t s = 0; s < p->nstreams; s++) {
    const plan_stream *ps = &p->streams[s];
    char name[512];
    snprintf(name, sizeof name, "%s.%s", plan_str(p, p->devices[ps->device].name), plan_str(p, ps->name));
    fprintf(f, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%u,\"tid\":%u,\"args\":{\"name\":",
            ps->device, s);
    rt_json_string(f, name);
    fprintf(f, "}},\n{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":%u,\"tid\":%u,"
               "\"args\":{\"sort_index\":%u}}", ps->device, s, s);
  }
  /* The host: a process after the devices, one track of steps. */
  fprintf(f, ",\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%u,\"tid\":0,\"args\":{\"name\":\"host\"}},"
             "\n{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%u,\"tid\":0,\"args\":{\"sort_index\":%u}},"
             "\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%u,\"tid\":0,\"args\":{\"name\":\"host.steps\"}}",
          p->ndevices, p->ndevices, p->ndevices, p->ndevices);
}

/* One span of the host track: the step, or its submit or wait part. */
static void put_host_span(rt_trace_writer *w, const char *name, uint64_t from, uint64_t to, int32_t step,
                          const char *shape) {
  FILE *f = w->f;
  fprintf(f, ",\n{\"name\":\"%s\",\"cat\":\"host\",\"ph\":\"X\",\"pid\":%u,\"tid\":0,\"ts\":", name,
          w->p->ndevices);
  put_us(f, (int64_t)(from - w->t0));
  fputs(",\"dur\":", f);
  put_us(f, (int64_t)(to > from ? to - from : 0));
  fprintf(f, ",\"args\":{\"step\":%d,\"plan\":\"%s\"}}", (int)step, shape);
}

void rt_trace_writer_close(rt_trace_writer *w) {
  if (!w) return;
  if (w->f) {
    fclose(w->f);
    remove(w->tmp);
  }
  for (int i = 0; i < w->nviews; i++) {
    tw_view *v = &w->views[i];
    rt_overlap_close(v->ov);
    free(v->stream_prev);
    free(v->producer);
    free(v->consumer);
    free(v->group);
  }
  for (uint32_t g = 0; g < w->ngroups; g++) free(w->groups[g].dur_us);
  free(w->groups);
  free(w->busy_ns);
  free(w->last_start);
  free(w->last_end);
  free(w->busy_us);
  free(w->copies);
  free(w->path_ops);
  free(w->kind_costs);
  free(w->path);
  free(w->tmp);
  free(w->bundle_name);
  free(w);
}

rt_status rt_trace_writer_open(rt_bundle *b, const char *path, const char *bundle_name,
                               int32_t decode_from, rt_trace_writer **out_writer) {
  *out_writer = NULL;
  if (!b->trace_start)
    return rt_status_make("%s: cannot trace bundle %s: it was opened without tracing "
                          "(set rt_options.trace)", path, b->dir);
  rt_trace_writer *w = calloc(1, sizeof *w);
  if (!w) return rt_status_make("out of memory");
  rt_bundle *d = rt_bundle_decode(b);
  w->views[0].b = b;
  w->views[1].b = d;
  w->nviews = d == b ? 1 : 2;
  size_t nc = 1, ncs = 0, nd = b->p.ndevices ? b->p.ndevices : 1;
  rt_status s = NULL;
  for (int i = 0; i < w->nviews; i++) {
    tw_view *v = &w->views[i];
    v->p = &v->b->p;
    size_t n = v->p->ncommands ? v->p->ncommands : 1;
    if (n > nc) nc = n;
    ncs += n;
    v->stream_prev = malloc(n * sizeof *v->stream_prev);
    v->producer = malloc(n * sizeof *v->producer);
    v->consumer = malloc(n * sizeof *v->consumer);
    v->group = malloc(n * sizeof *v->group);
    if (!v->stream_prev || !v->producer || !v->consumer || !v->group) s = rt_status_make("out of memory");
  }
  w->v = &w->views[0];
  w->p = w->v->p;
  w->decode_from = decode_from;
  w->path = strdup(path);
  w->bundle_name = strdup(bundle_name);
  w->tmp = malloc(strlen(path) + 32);
  w->groups = calloc(ncs, sizeof *w->groups);
  w->busy_ns = calloc(nd, sizeof *w->busy_ns);
  w->busy_us = calloc(nd, sizeof *w->busy_us);
  w->last_start = calloc(nc, sizeof *w->last_start);
  w->last_end = calloc(nc, sizeof *w->last_end);
  w->path_ops = calloc(nc, sizeof *w->path_ops);
  w->kind_costs = calloc(nc, sizeof *w->kind_costs);
  if (!w->path || !w->bundle_name || !w->tmp || !w->groups || !w->busy_ns || !w->busy_us || !w->last_start ||
      !w->last_end || !w->path_ops || !w->kind_costs)
    s = rt_status_make("out of memory");
  for (int i = 0; i < w->nviews && !s; i++) {
    s = rt_overlap_open(w->views[i].p, &w->views[i].ov);
    if (!s) s = find_structure(w, &w->views[i]);
  }
  if (!s) {
    w->copies = calloc(w->ngroups ? w->ngroups : 1, sizeof *w->copies);
    if (!w->copies) s = rt_status_make("out of memory");
  }
  if (!s) {
    sprintf(w->tmp, "%s.tmp.%ld", path, (long)getpid());
    w->f = fopen(w->tmp, "w");
    if (!w->f) s = rt_status_make("%s: cannot write: %s", path, strerror(errno));
  }
  if (s) {
    rt_trace_writer_close(w);
    return s;
  }
  put_metadata(w);
  *out_writer = w;
  return NULL;
}

static rt_status add_duration(copy_group *g, double us) {
  if (g->n == g->cap) {
    size_t cap = g->cap ? 2 * g->cap : 64;
    double *d = realloc(g->dur_us, cap * sizeof *d);
    if (!d) return rt_status_make("out of memory");
    g->dur_us = d;
    g->cap = cap;
  }
  g->dur_us[g->n++] = us;
  return NULL;
}

static void put_span(rt_trace_writer *w, uint32_t i, const uint64_t *start, const uint64_t *end,
                     int32_t step) {
  const plan *p = w->p;
  const plan_command *c = &p->commands[i];
  FILE *f = w->f;
  uint64_t dur = end[i] > start[i] ? end[i] - start[i] : 0;
  fputs(",\n{\"name\":", f);
  rt_json_string(f, plan_str(p, p->ops[c->op].path));
  fprintf(f, ",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":%u,\"tid\":%u,\"ts\":",
          c->kind == PLAN_CMD_LAUNCH ? "launch" : "copy", p->streams[c->stream].device, c->stream);
  put_us(f, (int64_t)(start[i] - w->t0));
  fputs(",\"dur\":", f);
  put_us(f, (int64_t)dur);
  fprintf(f, ",\"args\":{\"step\":%d,\"kernel\":", (int)step);
  if (c->kind == PLAN_CMD_LAUNCH) {
    rt_json_string(f, plan_str(p, p->kernels[c->a].symbol));
    fputs("}}", f);
  } else {
    fprintf(f, "null,\"bytes\":%llu}}", (unsigned long long)p->args[c->args_begin].bytes);
  }
}

/* A flow from the producer's last nanosecond (inside its slice, where a
 * viewer binds the flow's start) to the consumer's start. */
static void put_flow(rt_trace_writer *w, uint32_t wait, const uint64_t *start, const uint64_t *end) {
  const plan *p = w->p;
  uint32_t from = w->v->producer[wait], to = w->v->consumer[wait];
  FILE *f = w->f;
  uint64_t at = end[from] > start[from] ? end[from] - 1 : start[from];
  uint32_t event = p->commands[wait].a;
  uint64_t id = ++w->flows;
  const plan_stream *sf = &p->streams[p->commands[from].stream], *st = &p->streams[p->commands[to].stream];
  fprintf(f, ",\n{\"name\":\"event %u\",\"cat\":\"wait\",\"ph\":\"s\",\"id\":%llu,\"pid\":%u,\"tid\":%u,\"ts\":",
          event, (unsigned long long)id, sf->device, p->commands[from].stream);
  put_us(f, (int64_t)(at - w->t0));
  fprintf(f, "},\n{\"name\":\"event %u\",\"cat\":\"wait\",\"ph\":\"f\",\"bp\":\"e\",\"id\":%llu,\"pid\":%u,"
             "\"tid\":%u,\"ts\":",
          event, (unsigned long long)id, st->device, p->commands[to].stream);
  put_us(f, (int64_t)(start[to] - w->t0));
  fputc('}', f);
}

rt_status rt_trace_writer_hook(void *ctx, rt_bundle *b, const int32_t step[4], const int32_t *ids) {
  (void)ids;
  rt_trace_writer *w = ctx;
  /* The plan that ran the step: the prefill or the decode plan. */
  const tw_view *v = NULL;
  for (int i = 0; i < w->nviews && !v; i++)
    if (w->views[i].b == b) v = &w->views[i];
  if (!v) return rt_status_make("%s: a step of %s, which this trace does not follow", w->path, b->dir);
  w->v = v;
  w->p = v->p;
  const plan *p = w->p;
  const uint64_t *start, *end;
  uint64_t host[3];
  RT_TRY(rt_trace_last_step(b, &start, &end));
  RT_TRY(rt_trace_last_host(b, host));
  rt_step_busy sb;
  rt_overlap_step(v->ov, start, end, &sb);
  /* The file's time 0: the first step's start on the host, before any of
   * its device work (which its enqueueing precedes). */
  if (w->steps == 0) w->t0 = host[0] < sb.first_ns ? host[0] : sb.first_ns;
  char name[32];
  snprintf(name, sizeof name, "step %d", (int)step[2]);
  /* The step shape of the plan that ran it. */
  const char *shape = p->info.flags & PLAN_FLAG_DECODE ? "decode" : "prefill";
  put_host_span(w, name, host[0], host[2], step[2], shape);
  put_host_span(w, "submit", host[0], host[1], step[2], shape);
  put_host_span(w, "wait", host[1], host[2], step[2], shape);
  w->host_ns[0] += host[2] - host[0];
  w->host_ns[1] += host[1] - host[0];
  w->host_ns[2] += host[2] - host[1];
  for (uint32_t d = 0; d < p->ndevices; d++) w->busy_ns[d] += sb.busy_ns[d];
  w->any_ns += sb.any_ns;
  w->both_ns += sb.both_ns;
  w->span_ns += sb.span_ns;
  for (uint32_t i = 0; i < p->ncommands; i++) {
    if (!timed(&p->commands[i])) continue;
    put_span(w, i, start, end, step[2]);
    w->spans++;
    if (v->group[i] != PLAN_NONE) {
      uint64_t dur = end[i] > start[i] ? end[i] - start[i] : 0;
      RT_TRY(add_duration(&w->groups[v->group[i]], 1e-3 * (double)dur));
    }
  }
  for (uint32_t i = 0; i < p->ncommands; i++)
    if (p->commands[i].kind == PLAN_CMD_WAIT && v->producer[i] != PLAN_NONE && v->consumer[i] != PLAN_NONE)
      put_flow(w, i, start, end);
  if (ferror(w->f)) return rt_status_make("%s: cannot write %s: %s", w->path, w->tmp, strerror(errno));
  memcpy(w->last_start, start, p->ncommands * sizeof *start);
  memcpy(w->last_end, end, p->ncommands * sizeof *end);
  w->last_first_ns = sb.first_ns;
  w->last_span_ns = sb.span_ns;
  w->last_step = step[2];
  w->last_decode = step[0] >= w->decode_from;
  w->steps++;
  return NULL;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Back from the last op to finish: each op's predecessor is whichever
 * finished last of the op before it on its stream and the producers of
 * the events its stream waited for just before it. Every predecessor
 * comes earlier in the plan, so the walk ends. */
static void critical_path(rt_trace_writer *w) {
  const plan *p = w->p;
  const uint64_t *start = w->last_start, *end = w->last_end;
  uint32_t c = PLAN_NONE, n = 0;
  for (uint32_t i = 0; i < p->ncommands; i++)
    if (timed(&p->commands[i]) && (c == PLAN_NONE || end[i] >= end[c])) c = i;
  while (c != PLAN_NONE) {
    w->path_ops[n++] = (rt_trace_path_op){.command = c,
                                          .start_us = 1e-3 * (double)(int64_t)(start[c] - w->last_first_ns),
                                          .end_us = 1e-3 * (double)(int64_t)(end[c] - w->last_first_ns)};
    uint32_t best = w->v->stream_prev[c], lo = best == PLAN_NONE ? 0 : best + 1;
    int best_via = 0;
    for (uint32_t j = c; j-- > lo;) {
      const plan_command *q = &p->commands[j];
      uint32_t from = w->v->producer[j];
      if (q->kind != PLAN_CMD_WAIT || q->stream != p->commands[c].stream || from == PLAN_NONE) continue;
      if (best == PLAN_NONE || end[from] > end[best]) {
        best = from;
        best_via = 1;
      }
    }
    w->path_ops[n - 1].via_wait = best_via;
    c = best;
  }
  /* collected last to first, each op's via_wait saying how it follows the
   * op collected after it */
  for (uint32_t i = 0; i < n / 2; i++) {
    rt_trace_path_op t = w->path_ops[i];
    w->path_ops[i] = w->path_ops[n - 1 - i];
    w->path_ops[n - 1 - i] = t;
  }
  w->sum.path = w->path_ops;
  w->sum.npath = n;
}

/* The last step's predicted and measured time by device and op kind: for
 * each device in order, its kinds in the order of their first launch or
 * copy in the plan. */
static void kind_costs(rt_trace_writer *w) {
  const plan *p = w->p;
  uint32_t n = 0;
  if (p->ncosts != p->nops) return;
  for (uint32_t d = 0; d < p->ndevices; d++) {
    uint32_t first = n;
    for (uint32_t i = 0; i < p->ncommands; i++) {
      const plan_command *c = &p->commands[i];
      if (!timed(c) || p->streams[c->stream].device != d) continue;
      uint32_t k = p->ops[c->op].kernel;
      const char *kind = k == PLAN_NONE ? "copy" : plan_str(p, p->kernels[k].kind);
      uint32_t j = first;
      while (j < n && strcmp(w->kind_costs[j].kind, kind) != 0) j++;
      if (j == n) w->kind_costs[n++] = (rt_trace_costs){.device = d, .kind = kind};
      rt_trace_costs *e = &w->kind_costs[j];
      e->ops++;
      e->predicted_us += 1e-3 * p->costs[c->op];
      e->measured_us += 1e-3 * (double)(w->last_end[i] > w->last_start[i] ? w->last_end[i] - w->last_start[i] : 0);
    }
  }
  w->sum.costs = w->kind_costs;
  w->sum.ncosts = n;
}

rt_status rt_trace_writer_finish(rt_trace_writer *w, const rt_trace_summary **out_summary) {
  *out_summary = NULL;
  const plan *p = w->p;
  FILE *f = w->f;
  if (w->finished || !f) return rt_status_make("%s: the trace was already finished", w->path);
  fputs("\n],\"displayTimeUnit\":\"ns\",\"otherData\":{\"model\":", f);
  rt_json_string(f, plan_str(p, p->info.model));
  fputs(",\"schedule\":", f);
  rt_json_string(f, plan_str(p, p->info.schedule));
  fputs(",\"bundle\":", f);
  rt_json_string(f, w->bundle_name);
  fprintf(f, ",\"steps\":%d}}\n", w->steps);
  int e = ferror(f) ? (errno ? errno : EIO) : 0;
  if (fclose(f) && !e) e = errno ? errno : EIO;
  w->f = NULL;
  rt_status s = NULL;
  if (e) s = rt_status_make("%s: cannot write %s: %s", w->path, w->tmp, strerror(e));
  else if (rename(w->tmp, w->path))
    s = rt_status_make("%s: cannot rename %s to it: %s", w->path, w->tmp, strerror(errno));
  if (s) {
    remove(w->tmp);
    return s;
  }
  w->finished = 1;
  rt_trace_summary *sum = &w->sum;
  sum->steps = w->steps;
  sum->spans = w->spans;
  sum->flows = w->flows;
  for (uint32_t d = 0; d < p->ndevices; d++) w->busy_us[d] = 1e-3 * (double)w->busy_ns[d];
  sum->busy_us = w->busy_us;
  sum->span_us = 1e-3 * (double)w->span_ns;
  sum->any_us = 1e-3 * (double)w->any_ns;
  sum->both_us = 1e-3 * (double)w->both_ns;
  sum->share = w->any_ns ? (double)w->both_ns / (double)w->any_ns : 0.0;
  for (uint32_t g = 0; g < w->ngroups; g++) {
    copy_group *cg = &w->groups[g];
    rt_trace_copies *c = &w->copies[g];
    *c = cg->out;
    c->count = cg->n;
    if (!cg->n) continue;
    qsort(cg->dur_us, cg->n, sizeof *cg->dur_us, cmp_double);
    for (size_t i = 0; i < cg->n; i++) c->total_us += cg->dur_us[i];
    c->median_us = rt_quantile(cg->dur_us, (int)cg->n, 0.5);
    c->max_us = cg->dur_us[cg->n - 1];
  }
  sum->copies = w->copies;
  sum->ncopies = w->ngroups;
  sum->path_step = w->last_step;
  sum->path_decode = w->last_decode;
  sum->path_plan = w->p;
  sum->path_span_us = 1e-3 * (double)w->last_span_ns;
  sum->host_step_us = 1e-3 * (double)w->host_ns[0];
  sum->host_submit_us = 1e-3 * (double)w->host_ns[1];
  sum->host_wait_us = 1e-3 * (double)w->host_ns[2];
  if (w->steps) {
    critical_path(w);
    kind_costs(w);
  }
  *out_summary = sum;
  return NULL;
}
