/* test_explain.c - `ds4c explain`: the step replayed under the plan's
 * predicted costs. A compiled bundle's critical path is an unbroken chain
 * from time 0 to the predicted step time, each op on it lasting its stored
 * cost; a hand-built plan gives exactly the path and times worked out by
 * hand; a plan without costs and a path that is no bundle are refused with
 * a clear error. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "explain.h"
#include "pipeline.h"
#include "plan.h"
#include "sha256.h"
#include "test_util.h"

static char tmpdir[] = "/tmp/ds4-explain-XXXXXX";

static void setup(void) {
  tu_chdir_source();
  tu_tmpdir_make(tmpdir);
}

static void teardown(void) { tu_tmpdir_remove(tmpdir); }

/* ds4c explain ARGS: its exit status and output. */
static int ds4c_explain(const char *args, char **out) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "%s/ds4c explain %s", tu_build_dir(), args);
  return tu_run(cmd, out);
}

/* expl_report into memory; NULL on success, else the status (caller frees). */
static rt_status report(const char *dir, expl_format format, char **out) {
  size_t len = 0;
  *out = NULL;
  FILE *f = open_memstream(out, &len);
  ck_assert_ptr_nonnull(f);
  rt_status st = expl_report(dir, format, f);
  ck_assert_int_eq(fclose(f), 0);
  return st;
}

static void assert_report_fails(const char *dir, const char *want) {
  char *text;
  rt_status st = report(dir, EXPL_TEXT, &text);
  ck_assert_msg(st != NULL, "explain of %s succeeded:\n%s", dir, text);
  ck_assert_msg(strstr(rt_status_msg(st), want), "wanted '%s' in '%s'", want, rt_status_msg(st));
  ck_assert_msg(text[0] == '\0', "a failed explain wrote:\n%s", text);
  rt_status_free(st);
  free(text);
}

/* ---- a compiled bundle ------------------------------------------------------ */

/* One op of the path as `--json` gives it. */
typedef struct json_op {
  unsigned op, after;
  char reason[16];
  double start, finish, duration, cost;
} json_op;

static double json_num(const char *line, const char *key) {
  const char *at = strstr(line, key);
  ck_assert_msg(at, "no %s in %s", key, line);
  char *end;
  double v = strtod(at + strlen(key), &end);
  ck_assert_msg(end != at + strlen(key), "no number after %s in %s", key, line);
  return v;
}

/* The path items of --json output, one a line, the last-finishing first. */
static int json_path(const char *json, json_op *ops, int max) {
  int n = 0;
  for (const char *line = strstr(json, "\n    {\"op\": "); line; line = strstr(line + 1, "\n    {\"op\": ")) {
    ck_assert_int_lt(n, max);
    json_op *o = &ops[n++];
    const char *end = strchr(line + 1, '\n');
    size_t len = end ? (size_t)(end - line) : strlen(line);
    char *l = strndup(line, len);
    ck_assert_int_eq(sscanf(l, "\n    {\"op\": %u", &o->op), 1);
    o->start = json_num(l, "\"start_ns\": ");
    o->finish = json_num(l, "\"finish_ns\": ");
    o->duration = json_num(l, "\"duration_ns\": ");
    o->cost = json_num(l, "\"cost_ns\": ");
    const char *r = strstr(l, "\"reason\": \"");
    ck_assert_ptr_nonnull(r);
    ck_assert_int_eq(sscanf(r, "\"reason\": \"%15[a-z]\"", o->reason), 1);
    o->after = PLAN_NONE;
    if (strcmp(o->reason, "start") != 0) ck_assert_int_eq(sscanf(strstr(r, "\"op\": "), "\"op\": %u", &o->after), 1);
    free(l);
  }
  return n;
}

/* tiny-moe on two CPU devices (hot and cold, three streams): copies,
 * events and both kinds of wait. */
START_TEST(compiled_bundle_path_is_a_chain) {
  char bundle[256], path[300], args[300];
  snprintf(bundle, sizeof bundle, "%s/bundle", tmpdir);
  ds4c_options o = {.model_path = "models/tiny-moe.yaml", .sched_path = "schedules/tiny-hotcold.yaml",
                    .out_dir = bundle, .targets = "host"};
  dsl_diag d = {0};
  ck_assert_msg(ds4c_compile(&o, &d) == 0, "%s", d.msg);

  /* The plan's costs are the order pass's predictions, in ns, in plan op
   * order (submission order). */
  plan p;
  snprintf(path, sizeof path, "%s/plan.ds4p", bundle);
  rt_status st = plan_read(path, &p);
  ck_assert_msg(st == NULL, "%s", rt_status_msg(st));
  ck_assert_uint_eq(p.ncosts, p.nops);
  ir_prog *ir;
  ck_assert_msg(ds4c_build(&o, &ir, &d) == 0, "%s", d.msg);
  ck_assert_int_eq(ir->nops, (int)p.nops);
  for (uint32_t r = 0; r < p.nops; r++) {
    ck_assert_msg(p.costs[r] > 0, "op %u costs %g", r, p.costs[r]);
    ck_assert(p.costs[r] == ir->ops[ir->order[r]].cost * 1e9);
  }
  ds4c_prog_free(ir);

  expl_result r;
  st = expl_simulate(path, &p, &r);
  ck_assert_msg(st == NULL, "%s", rt_status_msg(st));
  ck_assert_uint_eq(r.unrun, 0);
  /* The replay honours every dependency (the plan's events carry them) and
   * never runs two ops of one stream at once. */
  for (uint32_t e = 0; e < p.nedges; e++)
    ck_assert_msg(r.ops[p.edges[e].to].start >= r.ops[p.edges[e].from].finish, "edge %u: op %u starts before op %u ends",
                  e, p.edges[e].to, p.edges[e].from);
  for (uint32_t i = 0; i < p.nops; i++)
    for (uint32_t j = i + 1; j < p.nops; j++)
      if (p.ops[i].stream == p.ops[j].stream)
        ck_assert_msg(r.ops[j].start >= r.ops[i].finish, "ops %u and %u overlap on stream %u", i, j, p.ops[i].stream);
  /* hot has one stream: its busy time is the sum of its ops' costs. */
  double hot = 0;
  for (uint32_t i = 0; i < p.nops; i++)
    if (p.streams[p.ops[i].stream].device == 0) hot += p.costs[i];
  ck_assert_double_eq_tol(r.busy[0], hot, 1e-6 * hot);
  ck_assert(r.busy[1] > 0 && r.busy[1] <= r.makespan);
  ck_assert_int_gt(r.npath, 2);

  /* The path, as --json prints it: each op starts when the one below it
   * finishes, as the named reason says, from 0 to the step's end. */
  snprintf(args, sizeof args, "%s --json", bundle);
  char *json;
  ck_assert_int_eq(ds4c_explain(args, &json), 0);
  /* The decode plan's report is the member "decode", after the prefill
   * plan's members: the prefill plan's path is before it. */
  char *decode = strstr(json, ",\n  \"decode\": {\n");
  ck_assert_msg(decode != NULL, "%s", json);
  *decode = 0;
  decode += strlen(",\n  \"decode\": ");
  json_op *ops = calloc(p.nops, sizeof *ops);
  int n = json_path(json, ops, (int)p.nops);
  ck_assert_int_eq(n, (int)r.npath);
  double makespan = json_num(json, "\"makespan_ns\": ");
  ck_assert(makespan == r.makespan);
  ck_assert(ops[0].finish == makespan);
  int via_event = 0, copies = 0;
  for (int k = 0; k < n; k++) {
    ck_assert_uint_eq(ops[k].op, r.path[k]);
    ck_assert(ops[k].cost == p.costs[ops[k].op]);
    ck_assert(ops[k].duration == ops[k].finish - ops[k].start);
    ck_assert_double_eq_tol(ops[k].finish - ops[k].start, ops[k].cost, 1e-9 * ops[k].finish);
    if (k + 1 < n) {
      ck_assert_msg(ops[k].start == ops[k + 1].finish, "path op %d starts at %.17g, the one before ends at %.17g", k,
                    ops[k].start, ops[k + 1].finish);
      ck_assert_uint_eq(ops[k].after, ops[k + 1].op);
      ck_assert_msg(strcmp(ops[k].reason, "stream") == 0 || strcmp(ops[k].reason, "event") == 0, "%s", ops[k].reason);
      /* "after X on stream" names an op of the same stream; an event, one of another. */
      int same = p.ops[ops[k].op].stream == p.ops[ops[k].after].stream;
      ck_assert_int_eq(same, strcmp(ops[k].reason, "stream") == 0);
      via_event += !same;
    } else {
      ck_assert_str_eq(ops[k].reason, "start");
      ck_assert(ops[k].start == 0);
    }
    copies += p.ops[ops[k].op].kernel == PLAN_NONE;
  }
  /* The cold experts are the longer pole of each MoE layer, so the path
   * crosses to the cold device and back through copies and events. */
  ck_assert_int_gt(via_event, 0);
  ck_assert_int_gt(copies, 0);
  ck_assert_ptr_nonnull(strstr(json, "\"path_share\": 1,\n"));
  ck_assert_double_eq_tol(json_num(json, "\n  \"path_ns\": "), makespan, 1e-9 * makespan);
  /* The decode plan's: its own simulation, a chain from 0 to its end. */
  plan q;
  snprintf(path, sizeof path, "%s/decode/plan.ds4p", bundle);
  st = plan_read(path, &q);
  ck_assert_msg(st == NULL, "%s", rt_status_msg(st));
  expl_result rq;
  st = expl_simulate(path, &q, &rq);
  ck_assert_msg(st == NULL, "%s", rt_status_msg(st));
  ck_assert(json_num(decode, "\"makespan_ns\": ") == rq.makespan);
  ck_assert(rq.makespan < r.makespan); /* one slot's work, not four's */
  n = json_path(decode, ops, (int)q.nops);
  ck_assert_int_eq(n, (int)rq.npath);
  for (int k = 0; k + 1 < n; k++) ck_assert(ops[k].start == ops[k + 1].finish);
  ck_assert(ops[0].finish == rq.makespan && ops[n - 1].start == 0);
  expl_result_free(&rq);
  plan_free(&q);
  free(ops);
  free(json);

  /* The text report says the same in µs. */
  char *text, want[128];
  ck_assert_int_eq(ds4c_explain(bundle, &text), 0);
  snprintf(want, sizeof want, "predicted step: %.3f µs (the compiler's cost model; %u ops on 3 streams)",
           r.makespan / 1e3, p.nops);
  ck_assert_msg(strstr(text, want), "wanted '%s' in:\n%s", want, text);
  snprintf(want, sizeof want, "path: %u of %u ops, %.3f µs, 100.0%% of the step", r.npath, p.nops, r.makespan / 1e3);
  ck_assert_msg(strstr(text, want), "wanted '%s' in:\n%s", want, text);
  ck_assert_ptr_nonnull(strstr(text, "at the step's start\npath: "));
  ck_assert_ptr_nonnull(strstr(text, " on stream\n"));
  ck_assert_ptr_nonnull(strstr(text, " via event "));
  free(text);
  expl_result_free(&r);
  plan_free(&p);
}
END_TEST

/* The cost the order pass gives a routed-experts op (moe_experts, or on a
 * GPU its moe_up and moe_down): its expert weights count at the share a
 * step's routing reaches, 1 - (1 - k/E)^T for T slots choosing k of E
 * experts each, the other operands whole; its FLOPs those of the T·k
 * choices (docs/SCHEDULES.md). Returns the share. */
static double assert_moe_cost(const ir_prog *ir, const ir_op *op) {
  const ir_device *dv = &ir->devices[op->device];
  const ir_tensor *idx = &ir->tensors[op->in[1]];
  double E = op->expert_row ? op->nexperts : (double)ir_operand_view(ir, op, 2).dim[0];
  double k = (double)idx->dim[1], share = 1 - pow(1 - k / E, (double)idx->dim[0]), bytes = 0;
  for (int s = 0; s < op->nin + op->nout; s++) {
    int64_t off, len;
    ir_operand_range(ir, op, s, &off, &len);
    bytes += s >= 2 && s < op->nin ? (double)len * share : (double)len;
  }
  const ir_tensor *in0 = &ir->tensors[op->in[0]], *out0 = &ir->tensors[op->out[0]];
  double outs = 1;
  for (int i = 0; i < out0->ndim; i++) outs *= (double)out0->dim[i];
  double flops = op->kind == IR_OP_MOE_EXPERTS ? 6.0 * outs * (double)ir->tensors[op->in[2]].dim[1]
                 : op->kind == IR_OP_MOE_UP    ? 4.0 * outs * (double)in0->dim[1]
                                               : 2.0 * outs * (double)in0->dim[2];
  double want = dv->launch + fmax(bytes / dv->bandwidth, flops / dv->flops);
  ck_assert_msg(fabs(op->cost - want) <= 1e-9 * want, "%s: cost %.9g s, want %.9g s (share %.4f)", op->path, op->cost,
                want, share);
  return share;
}

/* The routed experts cost what a step's routing reads: tiny-hotcold's
 * split moe_experts on the cpu, ds4-flash-mini's lowered moe_up and
 * moe_down on the H200 (a decode step there reads top_k of its experts a
 * slot, not all of them). */
START_TEST(routed_experts_cost_their_share) {
  static const char *const pairs[][2] = {{"models/tiny-moe.yaml", "schedules/tiny-hotcold.yaml"},
                                         {"models/ds4-flash-mini.yaml", "schedules/ds4-flash-h200.yaml"}};
  for (int i = 0; i < 2; i++) {
    ds4c_options o = {.model_path = pairs[i][0], .sched_path = pairs[i][1]};
    dsl_diag d = {0};
    ir_prog *ir;
    ck_assert_msg(ds4c_build(&o, &ir, &d) == 0, "%s", d.msg);
    int n = 0;
    for (int k = 0; k < ir->nops; k++) {
      const ir_op *op = &ir->ops[k];
      if (op->kind != IR_OP_MOE_EXPERTS && op->kind != IR_OP_MOE_UP && op->kind != IR_OP_MOE_DOWN) continue;
      double share = assert_moe_cost(ir, op);
      ck_assert_msg(share > 0 && share < 1, "%s: share %g", op->path, share);
      n++;
    }
    ck_assert_int_gt(n, 0);
    ds4c_prog_free(ir);
  }
}
END_TEST

/* ---- a plan built by hand ----------------------------------------------------- */

typedef struct hand {
  char strings[256];
  uint32_t nstr;
  plan p;
  plan_device devices[2];
  plan_stream streams[3];
  plan_tensor tensors[4];
  plan_codeobj codeobj;
  plan_kernel kernel;
  plan_op ops[6];
  plan_command commands[15];
  plan_arg args[10];
  double costs[6];
} hand;

static uint32_t hand_str(hand *h, const char *s) {
  uint32_t off = h->nstr;
  size_t n = strlen(s) + 1;
  ck_assert_uint_le(off + n, sizeof h->strings);
  memcpy(h->strings + off, s, n);
  h->nstr += (uint32_t)n;
  return off;
}

/* Op i's launch, on its stream, reading x (d0) or x@d1 (d1). */
static void hand_launch(hand *h, uint32_t op) {
  uint32_t stream = h->ops[op].stream, na = h->p.nargs;
  h->args[na] = (plan_arg){.tensor = stream == 2 ? 3 : 2, .bytes = 16};
  h->commands[h->p.ncommands++] = (plan_command){PLAN_CMD_LAUNCH, stream, op, 0, PLAN_NONE, na, 1, 0};
  h->p.nargs = na + 1;
}

/* Half `half` of op 2's copy of x into x@d1, on d0.copy. */
static void hand_copy(hand *h, uint32_t half) {
  uint32_t na = h->p.nargs;
  h->args[na] = (plan_arg){.tensor = 2, .offset = 8 * half, .bytes = 8};
  h->args[na + 1] = (plan_arg){.tensor = 3, .offset = 8 * half, .bytes = 8};
  h->commands[h->p.ncommands++] = (plan_command){PLAN_CMD_COPY, 1, 2, PLAN_NONE, PLAN_NONE, na, 2, 0};
  h->p.nargs = na + 2;
}

/* A record or a wait (on the record command `rec`) of event on stream. */
static void hand_event(hand *h, uint32_t kind, uint32_t stream, uint32_t event, uint32_t rec) {
  h->commands[h->p.ncommands++] = (plan_command){kind, stream, PLAN_NONE, event, rec, 0, 0, 0};
}

static void hand_tensor(hand *h, uint32_t i, const char *name, uint32_t dtype, uint32_t role, uint32_t device,
                        uint64_t offset) {
  h->tensors[i] = (plan_tensor){.name = hand_str(h, name), .checkpoint = PLAN_NONE, .dtype = dtype, .role = role,
                                .ndim = 1, .device = device, .view_of = PLAN_NONE, .rows = PLAN_NONE,
                                .dim = {4}, .bytes = 16, .offset = offset};
}

/* Devices d0 (streams d0.main and d0.copy) and d1 (d1.main); ops and their
 * costs in ns:
 *   a  d0.main  1000  at 0
 *   b  d1.main   500  at 0 (its wait on an event recorded at 0 delays nothing)
 *   c  d0.copy   300  a copy of two pairs, after a via event 0: 1000..1300
 *   e  d0.main   250  after a: 1000..1250
 *   d  d1.main  2000  after b, but waits for c via event 1: 1300..3300
 *   f  d0.main   100  after e, but waits for d via event 2: 3300..3400
 * The step is 3400 ns; its critical path is f, d, c, a. d0 is busy over
 * [0, 1300) and [3300, 3400): 1400 ns; d1 over [0, 500) and [1300, 3300):
 * 2500 ns. */
static void hand_build(hand *h) {
  memset(h, 0, sizeof *h);
  plan *p = &h->p;
  hand_str(h, "");
  p->info = (plan_info){.model = hand_str(h, "hand"), .schedule = hand_str(h, "two-devices"), .tokens = 4,
                        .max_seq = 4, .prompt = 4, .decode = 1, .ids_tensor = 0, .next_tensor = 1,
                        .nevents = 4};
  uint32_t host = hand_str(h, "host"), main_ = hand_str(h, "main");
  h->devices[0] = (plan_device){.name = hand_str(h, "d0"), .backend = PLAN_BACKEND_CPU, .arch = host, .threads = 1,
                                .arena_bytes = 64};
  h->devices[1] = (plan_device){.name = hand_str(h, "d1"), .backend = PLAN_BACKEND_CPU, .arch = host, .ordinal = 1,
                                .threads = 1, .arena_bytes = 64};
  h->streams[0] = (plan_stream){main_, 0};
  h->streams[1] = (plan_stream){hand_str(h, "copy"), 0};
  h->streams[2] = (plan_stream){main_, 1};
  hand_tensor(h, 0, "ids", PLAN_I32, PLAN_INPUT, 0, 0);
  hand_tensor(h, 1, "next", PLAN_I32, PLAN_OUTPUT, 1, 0);
  hand_tensor(h, 2, "x", PLAN_F32, PLAN_ACTIVATION, 0, 16);
  hand_tensor(h, 3, "x@d1", PLAN_F32, PLAN_ACTIVATION, 1, 16);
  h->codeobj.path = hand_str(h, "kernels/host.so");
  h->codeobj.target = host;
  h->kernel = (plan_kernel){.symbol = hand_str(h, "k"), .kind = hand_str(h, "add"), .grid = 1, .block = 1, .nbufs = 1};

  static const char *const names[6] = {"a", "b", "c", "d", "e", "f"};
  static const uint32_t streams[6] = {0, 2, 1, 2, 0, 0};
  static const double costs[6] = {1000, 500, 300, 2000, 250, 100};
  for (uint32_t i = 0; i < 6; i++) {
    h->ops[i] = (plan_op){.path = hand_str(h, names[i]), .stream = streams[i], .kernel = i == 2 ? PLAN_NONE : 0};
    h->costs[i] = costs[i];
  }
  /* Commands in submission order: launches on d0 read x, on d1 x@d1; c
   * copies x into x@d1 in two halves. */
  hand_launch(h, 0);      /* 0: a */
  hand_event(h, PLAN_CMD_RECORD, 0, 0, PLAN_NONE);
  hand_event(h, PLAN_CMD_RECORD, 1, 3, PLAN_NONE); /* 2: d0.copy at 0 */
  hand_event(h, PLAN_CMD_WAIT, 2, 3, 2);
  hand_launch(h, 1);      /* 4: b */
  hand_event(h, PLAN_CMD_WAIT, 1, 0, 1);
  hand_copy(h, 0);        /* 6: c */
  hand_copy(h, 1);        /* 7: c's second pair */
  hand_event(h, PLAN_CMD_RECORD, 1, 1, PLAN_NONE);
  hand_launch(h, 4);      /* 9: e */
  hand_event(h, PLAN_CMD_WAIT, 2, 1, 8);
  hand_launch(h, 3);      /* 11: d */
  hand_event(h, PLAN_CMD_RECORD, 2, 2, PLAN_NONE);
  hand_event(h, PLAN_CMD_WAIT, 0, 2, 12);
  hand_launch(h, 5);      /* 14: f */
  ck_assert_uint_eq(h->p.ncommands, 15);
  p->strings = h->strings;
  p->strings_len = h->nstr;
  p->devices = h->devices;
  p->ndevices = 2;
  p->streams = h->streams;
  p->nstreams = 3;
  p->tensors = h->tensors;
  p->ntensors = 4;
  p->codeobjs = &h->codeobj;
  p->ncodeobjs = 1;
  p->kernels = &h->kernel;
  p->nkernels = 1;
  p->ops = h->ops;
  p->nops = 6;
  p->commands = h->commands;
  p->args = h->args;
  p->costs = h->costs;
  p->ncosts = 6;
}

/* tmpdir/NAME/plan.ds4p from p; returns the bundle's path (static). */
static const char *hand_write(const plan *p, const char *name) {
  static char dir[256];
  char path[300];
  snprintf(dir, sizeof dir, "%s/%s", tmpdir, name);
  ck_assert_int_eq(mkdir(dir, 0755), 0);
  snprintf(path, sizeof path, "%s/plan.ds4p", dir);
  rt_status st = plan_write(p, path);
  ck_assert_msg(st == NULL, "%s", rt_status_msg(st));
  return dir;
}

START_TEST(hand_built_plan) {
  hand h;
  hand_build(&h);
  const char *dir = hand_write(&h.p, "hand");
  char path[300];
  snprintf(path, sizeof path, "%s/plan.ds4p", dir);
  plan p;
  rt_status st = plan_read(path, &p);
  ck_assert_msg(st == NULL, "%s", rt_status_msg(st));
  expl_result r;
  st = expl_simulate(path, &p, &r);
  ck_assert_msg(st == NULL, "%s", rt_status_msg(st));

  static const struct {
    double start, finish;
    expl_cause cause;
    uint32_t after, event;
  } want[6] = {
      {0, 1000, EXPL_START, PLAN_NONE, PLAN_NONE},   /* a */
      {0, 500, EXPL_START, PLAN_NONE, PLAN_NONE},    /* b: the tie keeps its own cause */
      {1000, 1300, EXPL_EVENT, 0, 0},                /* c */
      {1300, 3300, EXPL_EVENT, 2, 1},                /* d */
      {1000, 1250, EXPL_STREAM, 0, PLAN_NONE},       /* e */
      {3300, 3400, EXPL_EVENT, 3, 2},                /* f */
  };
  for (int i = 0; i < 6; i++) {
    const expl_op *o = &r.ops[i];
    ck_assert_msg(o->ran, "op %d", i);
    ck_assert_msg(o->start == want[i].start && o->finish == want[i].finish, "op %d: %g..%g", i, o->start, o->finish);
    ck_assert_int_eq(o->cause, want[i].cause);
    ck_assert_uint_eq(o->after, want[i].after);
    if (o->cause == EXPL_EVENT) ck_assert_uint_eq(o->event, want[i].event);
  }
  ck_assert(r.makespan == 3400);
  ck_assert_uint_eq(r.npath, 4);
  static const uint32_t path_ops[4] = {5, 3, 2, 0};
  for (int k = 0; k < 4; k++) ck_assert_uint_eq(r.path[k], path_ops[k]);
  ck_assert(r.busy[0] == 1400 && r.busy[1] == 2500);
  expl_result_free(&r);
  plan_free(&p);

  char *text;
  st = report(dir, EXPL_TEXT, &text);
  ck_assert_msg(st == NULL, "%s", rt_status_msg(st));
  char expect[2048];
  snprintf(expect, sizeof expect,
           "ds4c explain %s: model hand, schedule two-devices\n"
           "predicted step: 3.400 µs (the compiler's cost model; 6 ops on 3 streams)\n"
           "\n"
           "device      busy µs   share\n"
           "d0            1.400   41.2%%\n"
           "d1            2.500   73.5%%\n"
           "\n"
           "critical path, from the last-finishing op back to the step's start:\n"
           "   start µs    finish µs          µs  stream   op  started\n"
           "      3.300        3.400       0.100  d0.main  f   waits for d via event 2\n"
           "      1.300        3.300       2.000  d1.main  d   waits for c via event 1\n"
           "      1.000        1.300       0.300  d0.copy  c   waits for a via event 0\n"
           "      0.000        1.000       1.000  d0.main  a   at the step's start\n"
           "path: 4 of 6 ops, 3.400 µs, 100.0%% of the step; by device: d0 1.400 µs (41.2%%), d1 2.000 µs "
           "(58.8%%); copies 0.300 µs (8.8%%)\n",
           dir);
  ck_assert_str_eq(text, expect);
  free(text);

  st = report(dir, EXPL_JSON, &text);
  ck_assert_msg(st == NULL, "%s", rt_status_msg(st));
  snprintf(expect, sizeof expect,
           "{\n"
           "  \"bundle\": \"%s\",\n"
           "  \"model\": \"hand\",\n"
           "  \"schedule\": \"two-devices\",\n"
           "  \"makespan_ns\": 3400,\n"
           "  \"ops\": 6,\n"
           "  \"unrun_ops\": 0,\n"
           "  \"devices\": [\n"
           "    {\"name\": \"d0\", \"busy_ns\": 1400, \"share\": 0.411765, \"on_path_ns\": 1400},\n"
           "    {\"name\": \"d1\", \"busy_ns\": 2500, \"share\": 0.735294, \"on_path_ns\": 2000}\n"
           "  ],\n"
           "  \"path\": [\n"
           "    {\"op\": 5, \"path\": \"f\", \"device\": \"d0\", \"stream\": \"main\", \"kind\": \"launch\", "
           "\"start_ns\": 3300, \"finish_ns\": 3400, \"duration_ns\": 100, \"cost_ns\": 100, "
           "\"after\": {\"reason\": \"event\", \"op\": 3, \"path\": \"d\", \"event\": 2}},\n"
           "    {\"op\": 3, \"path\": \"d\", \"device\": \"d1\", \"stream\": \"main\", \"kind\": \"launch\", "
           "\"start_ns\": 1300, \"finish_ns\": 3300, \"duration_ns\": 2000, \"cost_ns\": 2000, "
           "\"after\": {\"reason\": \"event\", \"op\": 2, \"path\": \"c\", \"event\": 1}},\n"
           "    {\"op\": 2, \"path\": \"c\", \"device\": \"d0\", \"stream\": \"copy\", \"kind\": \"copy\", "
           "\"start_ns\": 1000, \"finish_ns\": 1300, \"duration_ns\": 300, \"cost_ns\": 300, "
           "\"after\": {\"reason\": \"event\", \"op\": 0, \"path\": \"a\", \"event\": 0}},\n"
           "    {\"op\": 0, \"path\": \"a\", \"device\": \"d0\", \"stream\": \"main\", \"kind\": \"launch\", "
           "\"start_ns\": 0, \"finish_ns\": 1000, \"duration_ns\": 1000, \"cost_ns\": 1000, "
           "\"after\": {\"reason\": \"start\"}}\n"
           "  ],\n"
           "  \"path_ops\": 4,\n"
           "  \"path_ns\": 3400,\n"
           "  \"path_share\": 1,\n"
           "  \"path_copies_ns\": 300\n"
           "}\n",
           dir);
  ck_assert_str_eq(text, expect);
  free(text);

  /* An op that no command submits is counted and left out. */
  hand_build(&h);
  h.commands[14] = (plan_command){PLAN_CMD_RECORD, 0, PLAN_NONE, 3, PLAN_NONE, 0, 0, 0};
  dir = hand_write(&h.p, "unrun");
  st = report(dir, EXPL_TEXT, &text);
  ck_assert_msg(st == NULL, "%s", rt_status_msg(st));
  ck_assert_ptr_nonnull(strstr(text, "predicted step: 3.300 µs"));
  ck_assert_ptr_nonnull(strstr(text, "\nleft out: 1 ops that no command submits\n"));
  ck_assert_ptr_nonnull(strstr(text, "path: 3 of 6 ops, 3.300 µs, 100.0% of the step"));
  free(text);
}
END_TEST

/* A plan without costs, a 3.0 plan, and paths that are no bundle. */
START_TEST(refusals) {
  hand h;
  hand_build(&h);
  h.p.ncosts = 0;
  const char *dir = hand_write(&h.p, "nocosts");
  assert_report_fails(dir, "/nocosts/plan.ds4p: the plan holds no predicted costs (plans before format 3.1 carry "
                           "none); recompile the bundle with ds4c compile");

  /* A 3.0 file: no COSTS, FPARAMS or WORK (the last three of the table), minor 0. */
  hand_build(&h);
  uint8_t *bytes;
  size_t len;
  ck_assert_ptr_null(plan_encode(&h.p, &bytes, &len));
  bytes[12] = PLAN_NSECTIONS - 3;
  bytes[10] = 0;
  rt_sha256(bytes + 64, len - 64, bytes + 24);
  char path[300];
  snprintf(path, sizeof path, "%s/old", tmpdir);
  ck_assert_int_eq(mkdir(path, 0755), 0);
  snprintf(path, sizeof path, "%s/old/plan.ds4p", tmpdir);
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  ck_assert_uint_eq(fwrite(bytes, 1, len, f), len);
  ck_assert_int_eq(fclose(f), 0);
  free(bytes);
  snprintf(path, sizeof path, "%s/old", tmpdir);
  assert_report_fails(path, "/old/plan.ds4p: the plan holds no predicted costs (plans before format 3.1");

  /* Not a bundle: a missing path, a file, a folder without a plan. */
  snprintf(path, sizeof path, "%s/missing", tmpdir);
  assert_report_fails(path, "/missing: No such file or directory");
  snprintf(path, sizeof path, "%s/old/plan.ds4p", tmpdir);
  assert_report_fails(path, "/old/plan.ds4p: not a bundle (a bundle is the folder that ds4c compile -o writes)");
  snprintf(path, sizeof path, "%s/empty", tmpdir);
  ck_assert_int_eq(mkdir(path, 0755), 0);
  assert_report_fails(path, "/empty: not a bundle (it holds no plan.ds4p)");
}
END_TEST

/* The command line: exit 0 with a report, 1 with `ds4c: error: PATH: ...`,
 * 64 for a bad command line. */
START_TEST(command_line) {
  hand h;
  hand_build(&h);
  const char *dir = hand_write(&h.p, "cli");
  char *out, args[300];
  ck_assert_int_eq(ds4c_explain(dir, &out), 0);
  ck_assert_ptr_nonnull(strstr(out, "predicted step: 3.400 µs"));
  free(out);
  snprintf(args, sizeof args, "%s --json", dir);
  ck_assert_int_eq(ds4c_explain(args, &out), 0);
  ck_assert_msg(out[0] == '{' && strstr(out, "\"makespan_ns\": 3400,"), "%s", out);
  free(out);

  snprintf(args, sizeof args, "%s/none", tmpdir);
  ck_assert_int_eq(ds4c_explain(args, &out), 1);
  char want[300];
  snprintf(want, sizeof want, "ds4c: error: %s/none: No such file or directory\n", tmpdir);
  ck_assert_str_eq(out, want);
  free(out);
  ck_assert_int_eq(ds4c_explain("", &out), 64);
  ck_assert_ptr_nonnull(strstr(out, "ds4c: error: explain needs BUNDLE"));
  free(out);
  snprintf(args, sizeof args, "%s --csv", dir);
  ck_assert_int_eq(ds4c_explain(args, &out), 64);
  ck_assert_ptr_nonnull(strstr(out, "ds4c: error: unknown option '--csv'"));
  free(out);
  snprintf(args, sizeof args, "%s %s", dir, dir);
  ck_assert_int_eq(ds4c_explain(args, &out), 64);
  ck_assert_ptr_nonnull(strstr(out, "ds4c: error: too many arguments"));
  free(out);
}
END_TEST

int main(void) {
  Suite *s = suite_create("explain");
  TCase *tc = tcase_create("explain");
  tcase_set_timeout(tc, 600);
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, compiled_bundle_path_is_a_chain);
  tcase_add_test(tc, hand_built_plan);
  tcase_add_test(tc, refusals);
  tcase_add_test(tc, command_line);
  tcase_add_test(tc, routed_experts_cost_their_share);
  suite_add_tcase(s, tc);
  return tu_run_suite(s);
}
