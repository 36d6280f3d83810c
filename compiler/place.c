/* place.c - devices and streams from the schedule, and the owner of every
 * op: ordered glob rules, first match wins, no match is an error. A tensor
 * lives on the device of the op that first writes it (weights and inputs:
 * of their first reader). */
#include <stdlib.h>
#include <string.h>

#include "passes.h"

/* '*' matches any run of characters, dots included; '?' one character. */
static int glob_match(const char *g, const char *s) {
  for (; *g; g++, s++) {
    if (*g == '*') {
      while (g[1] == '*') g++;
      if (!g[1]) return 1;
      for (; *s; s++)
        if (glob_match(g + 1, s)) return 1;
      return 0;
    }
    if (!*s || (*g != '?' && *g != *s)) return 0;
  }
  return !*s;
}

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

static int place_devices(ir_prog *p, dsl_diag *d) {
  const dsl_schedule *s = p->sched;
  if (s->ndevices < 1) return dsl_error(d, s->name.pos, "schedule '%s' has no devices", s->name.text);
  p->devices = ir_xrealloc(NULL, (size_t)s->ndevices * sizeof *p->devices);
  memset(p->devices, 0, (size_t)s->ndevices * sizeof *p->devices);
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
    if (strcmp(sd->backend.text, "cpu") == 0) {
      dv->backend = PLAN_BACKEND_CPU;
      if (strcmp(dv->arch, "host") != 0)
        return dsl_error(d, sd->arch.pos, "a cpu device has arch 'host', not '%s'", dv->arch);
    } else {
      dv->backend = strcmp(sd->backend.text, "hip") == 0 ? PLAN_BACKEND_HIP : PLAN_BACKEND_CUDA;
      return dsl_error(d, sd->backend.pos, "backend '%s' is not supported by this compiler yet (cpu)",
                       sd->backend.text);
    }
    int64_t v = 0;
    if (parse_int(&sd->ordinal, 0, 1024, &v, d)) return -1;
    dv->ordinal = (int)v;
    v = 1;
    if (sd->threads.text && parse_int(&sd->threads, 1, 1024, &v, d)) return -1;
    dv->threads = (int)v;
    if (sd->memory.text && parse_int(&sd->memory, 1, INT64_MAX, &dv->memory, d)) return -1;
    if (parse_cost(&sd->bandwidth, 1, &dv->bandwidth, d) || parse_cost(&sd->flops, 1, &dv->flops, d) ||
        parse_cost(&sd->launch, 0, &dv->launch, d))
      return -1;
  }
  return 0;
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
    if (dev < 0) return dsl_error(d, ss->device.pos, "unknown device '%s'", ss->device.text);
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
  if (dev < 0) return dsl_error(d, o->device.pos, "unknown device '%s' in owner rule", o->device.text), -1;
  for (int j = 0; j < p->nstreams; j++)
    if (p->streams[j].device == dev && (!o->stream.text || strcmp(p->streams[j].name, o->stream.text) == 0))
      return j;
  return dsl_error(d, o->stream.pos, "device '%s' has no stream '%s'", o->device.text, o->stream.text), -1;
}

static int place_ops(ir_prog *p, dsl_diag *d) {
  const dsl_schedule *s = p->sched;
  for (int r = 0; r < s->nowners; r++) {
    if (strchr(s->owners[r].glob.text, '['))
      return dsl_error(d, s->owners[r].glob.pos, "expert ranges in owner rules are not supported yet");
    if (rule_stream(p, &s->owners[r], d) < 0) return -1;
  }
  for (int i = 0; i < p->nops; i++) {
    ir_op *op = &p->ops[i];
    for (int r = 0; r < s->nowners && op->stream < 0; r++)
      if (glob_match(s->owners[r].glob.text, op->path)) op->stream = rule_stream(p, &s->owners[r], d);
    if (op->stream < 0)
      return dsl_error(d, op->pos, "op '%s' matches no owner rule of schedule '%s' (%s)", op->path,
                       s->name.text, s->src ? s->src->path : "?");
    op->device = p->streams[op->stream].device;
  }
  return 0;
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
  for (int i = 0; i < p->ntensors; i++)
    if (p->tensors[i].device < 0) p->tensors[i].device = 0; /* unused: kept for weight binding */
}

static int place_step(ir_prog *p, dsl_diag *d) {
  const dsl_schedule *s = p->sched;
  int64_t v = p->tokens;
  if (s->step_prefill.text && parse_int(&s->step_prefill, 1, p->max_seq, &v, d)) return -1;
  p->prefill = (int)v;
  v = 1;
  if (s->step_decode.text && parse_int(&s->step_decode, 1, 1, &v, d)) return -1;
  p->decode = (int)v;
  return 0;
}

int pass_place(ir_prog *p, dsl_diag *d) {
  const dsl_schedule *s = p->sched;
  if (strcmp(s->model.text, p->model->name.text) != 0)
    return dsl_error(d, s->model.pos, "schedule '%s' is for model '%s', not '%s'", s->name.text, s->model.text,
                     p->model->name.text);
  if (place_devices(p, d) || place_streams(p, d) || place_ops(p, d) || place_step(p, d)) return -1;
  place_tensors(p);
  return 0;
}
