/* test_compile.c - the compiler on the shipped model: a bundle has its
 * files, compiling twice gives byte-identical files, the plan decodes and
 * launches every op exactly once, the IR dump names every pass, and the
 * kernel cache gives the bytes a build gives. */
#include <check.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "passes.h"
#include "pipeline.h"
#include "plan.h"
#include "plan_compare.h"
#include "test_util.h"

static void setup(void) { tu_chdir_source(); }

/* The IR of a model and schedule, through verify. */
static ir_prog *build(const char *model, const char *sched) {
  ds4c_options o = {.model_path = model, .sched_path = sched};
  ir_prog *p;
  dsl_diag d = {0};
  ck_assert_msg(ds4c_build(&o, &p, &d) == 0, "%s", d.msg);
  return p;
}

static void compile_tiny(const char *out) {
  ds4c_options o = {.model_path = "models/tiny-moe.yaml", .sched_path = "schedules/tiny-1dev.yaml", .out_dir = out};
  dsl_diag d = {0};
  ck_assert_msg(ds4c_compile(&o, &d) == 0, "%s", d.msg);
}

static void assert_same_file(const char *a, const char *b) {
  size_t na, nb;
  char *x = tu_try_slurp(a, &na), *y = tu_try_slurp(b, &nb);
  ck_assert_msg(x && y, "missing %s or %s", a, b);
  ck_assert_msg(na == nb && memcmp(x, y, na) == 0, "%s and %s differ", a, b);
  free(x);
  free(y);
}

START_TEST(compiling_twice_gives_identical_bundles) {
  char tmpl[] = "/tmp/ds4-det-XXXXXX";
  tu_tmpdir_make(tmpl);
  char a[512], b[512], fa[1024], fb[1024];
  snprintf(a, sizeof a, "%s/a", tmpl);
  snprintf(b, sizeof b, "%s/b", tmpl);
  compile_tiny(a);
  compile_tiny(b);
  static const char *files[] = {"plan.ds4p", "plan.txt", "kernels/host.so"};
  for (int i = 0; i < 3; i++) {
    snprintf(fa, sizeof fa, "%s/%s", a, files[i]);
    snprintf(fb, sizeof fb, "%s/%s", b, files[i]);
    assert_same_file(fa, fb);
  }
  /* every generated kernel source too */
  snprintf(fa, sizeof fa, "%s/kernels/host", a);
  DIR *d = opendir(fa);
  ck_assert_ptr_nonnull(d);
  int nsrc = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    snprintf(fa, sizeof fa, "%s/kernels/host/%s", a, e->d_name);
    snprintf(fb, sizeof fb, "%s/kernels/host/%s", b, e->d_name);
    assert_same_file(fa, fb);
    nsrc++;
  }
  closedir(d);
  ck_assert_int_ge(nsrc, 12); /* one per op kind of tiny-moe at least */

  /* the plan decodes, and launches each op exactly once */
  plan pl;
  snprintf(fa, sizeof fa, "%s/plan.ds4p", a);
  rt_status st = plan_read(fa, &pl);
  ck_assert_msg(st == NULL, "%s", rt_status_msg(st));
  ck_assert_str_eq(plan_str(&pl, pl.info.model), "tiny-moe");
  ck_assert_uint_eq(pl.nkernels, (unsigned)nsrc);
  int *seen = calloc(pl.nops, sizeof *seen);
  for (uint32_t i = 0; i < pl.ncommands; i++)
    if (pl.commands[i].kind == PLAN_CMD_LAUNCH) seen[pl.commands[i].op]++;
  for (uint32_t i = 0; i < pl.nops; i++) ck_assert_int_eq(seen[i], 1);
  free(seen);
  /* activations share bytes: the arena is smaller than all tensors */
  uint64_t sum = 0;
  for (uint32_t i = 0; i < pl.ntensors; i++) sum += pl.tensors[i].bytes;
  ck_assert_uint_lt(pl.devices[0].arena_bytes, sum);
  plan_free(&pl);

  tu_tmpdir_remove(tmpl);
}
END_TEST

START_TEST(dump_after_every_pass) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  ds4c_options o = {.model_path = "models/tiny-moe.yaml", .sched_path = "schedules/tiny-1dev.yaml",
                    .dump_after = "all", .dump = f};
  ir_prog *p;
  dsl_diag d = {0};
  ck_assert_msg(ds4c_build(&o, &p, &d) == 0, "%s", d.msg);
  fclose(f);
  for (int i = 0; ds4c_pass_names[i]; i++) {
    char head[64];
    snprintf(head, sizeof head, "## after %s\n", ds4c_pass_names[i]);
    ck_assert_msg(strstr(buf, head), "no dump after %s", ds4c_pass_names[i]);
  }
  ck_assert_ptr_nonnull(strstr(buf, "op 0 embed.lookup embed"));
  free(buf);
  ds4c_prog_free(p);

  ds4c_options bad = {.model_path = "models/tiny-moe.yaml", .sched_path = "schedules/tiny-1dev.yaml",
                      .dump_after = "orderr"};
  dsl_diag d2 = {0};
  ck_assert_int_ne(ds4c_build(&bad, &p, &d2), 0);
  ck_assert_ptr_nonnull(strstr(d2.msg, "unknown pass 'orderr'"));
}
END_TEST

/* Every wait sync emits for a multi-stream schedule is necessary: without
 * any one of them the verifier finds a race. One device with three
 * streams, then two devices with copies. */
static const char *const multi_stream[] = {"schedules/tiny-streams.yaml", "schedules/tiny-hotcold.yaml"};

START_TEST(every_wait_is_necessary) {
  ir_prog *p = build("models/tiny-moe.yaml", multi_stream[_i]);
  int n = p->ncmds, nwaits = 0;
  ir_cmd *orig = malloc((size_t)n * sizeof *orig);
  memcpy(orig, p->cmds, (size_t)n * sizeof *orig);
  for (int w = 0; w < n; w++) {
    if (orig[w].kind != IR_CMD_WAIT) continue;
    nwaits++;
    /* the plan without command w; later waits name their records anew */
    int k = 0;
    for (int i = 0; i < n; i++) {
      if (i == w) continue;
      p->cmds[k] = orig[i];
      if (p->cmds[k].kind == IR_CMD_WAIT && p->cmds[k].record > w) p->cmds[k].record--;
      k++;
    }
    p->ncmds = k;
    dsl_diag dv = {0};
    ck_assert_msg(pass_verify(p, &dv) != 0, "the plan without wait %d still verifies", w);
    ck_assert_msg(strstr(dv.msg, "verify: race on '"), "wait %d: %s", w, dv.msg);
  }
  ck_assert_int_ge(nwaits, 4);
  ck_assert_int_eq(nwaits, p->nevents); /* every record has a wait that needs it */
  memcpy(p->cmds, orig, (size_t)n * sizeof *orig);
  p->ncmds = n;
  dsl_diag dv = {0};
  ck_assert_msg(pass_verify(p, &dv) == 0, "%s", dv.msg);
  free(orig);
  ds4c_prog_free(p);
}
END_TEST

/* Two tensors live at once on different streams placed on the same bytes:
 * the verifier refuses the plan and names both ops and tensors. */
START_TEST(overlapping_live_tensors_are_refused) {
  ir_prog *p = build("models/tiny-moe.yaml", "schedules/tiny-streams.yaml");
  int a = ir_find_tensor(p, "layers.0.slots"), b = ir_find_tensor(p, "layers.0.shared_out");
  ck_assert_int_ge(a, 0);
  ck_assert_int_ge(b, 0);
  ck_assert_int_ne(p->tensors[a].offset, p->tensors[b].offset);
  p->tensors[b].offset = p->tensors[a].offset;
  dsl_diag dv = {0};
  ck_assert_int_ne(pass_verify(p, &dv), 0);
  /* the first race found may be with another tensor sharing slots' bytes */
  ck_assert_msg(strstr(dv.msg, "race on shared bytes") && strstr(dv.msg, "writes 'layers.0.shared_out'"),
                "%s", dv.msg);
  ds4c_prog_free(p);
}
END_TEST

/* On two devices: the arenas hold less than their tensors (activations
 * share bytes), and placing h2 on the rows of the slots' parts that the
 * cold side's copy writes while the hot experts read h2 is refused. */
START_TEST(hotcold_memory_plan) {
  ir_prog *p = build("models/tiny-moe.yaml", "schedules/tiny-hotcold.yaml");
  ck_assert_int_eq(p->ndevices, 2);
  int64_t arenas = 0, tensors = 0;
  for (int i = 0; i < p->ndevices; i++) arenas += p->devices[i].arena_bytes;
  for (int t = 0; t < p->ntensors; t++)
    if (p->tensors[t].device >= 0) tensors += p->tensors[t].bytes;
  ck_assert_msg(arenas < tensors, "arenas %lld bytes, tensors %lld", (long long)arenas, (long long)tensors);
  for (int i = 0; i < p->ndevices; i++) ck_assert_int_gt(p->devices[i].arena_bytes, 0);

  int parts = ir_find_tensor(p, "layers.0.slots.parts"), h2 = ir_find_tensor(p, "layers.0.h2");
  ck_assert_int_ge(parts, 0);
  ck_assert_int_ge(h2, 0);
  ck_assert_int_eq(p->tensors[parts].device, p->tensors[h2].device);
  dsl_diag dv = {0};
  ck_assert_msg(pass_verify(p, &dv) == 0, "%s", dv.msg);
  p->tensors[h2].offset = p->tensors[parts].offset + p->tensors[parts].bytes / 2;
  ck_assert_int_ne(pass_verify(p, &dv), 0);
  ck_assert_msg(strstr(dv.msg, "verify: race on shared bytes") && strstr(dv.msg, "'layers.0.slots.parts'") &&
                    strstr(dv.msg, "'layers.0.h2'"),
                "%s", dv.msg);
  ds4c_prog_free(p);
}
END_TEST

static void compile_to(const char *sched, const char *out, plan *pl) {
  ds4c_options o = {.model_path = "models/tiny-moe.yaml", .sched_path = sched, .out_dir = out};
  dsl_diag d = {0};
  ck_assert_msg(ds4c_compile(&o, &d) == 0, "%s", d.msg);
  char path[700];
  snprintf(path, sizeof path, "%s/plan.ds4p", out);
  rt_status st = plan_read(path, pl);
  ck_assert_msg(!st, "%s", rt_status_msg(st));
}

/* tiny-hotcold states no hint, yet the cold side's input copies go ahead
 * of the hot experts in every layer: the cold experts are the longer pole,
 * so their inputs' copies rank higher on the critical path. */
START_TEST(hotcold_cold_input_goes_first) {
  char tmpl[] = "/tmp/ds4-hc-XXXXXX";
  tu_tmpdir_make(tmpl);
  char out[600];
  snprintf(out, sizeof out, "%s/hc", tmpl);
  plan pl;
  compile_to("schedules/tiny-hotcold.yaml", out, &pl);
  for (int l = 0; l < 2; l++) {
    char hot[128], sel[128], h2[128];
    snprintf(hot, sizeof hot, "layers.%d.ffn.experts[0:6]", l);
    snprintf(sel, sizeof sel, "copy.layers.%d.sel@cold", l);
    snprintf(h2, sizeof h2, "copy.layers.%d.h2@cold", l);
    ck_assert_msg(plan_command_of(&pl, sel) < plan_command_of(&pl, hot), "layer %d: %s after %s", l, sel, hot);
    ck_assert_msg(plan_command_of(&pl, h2) < plan_command_of(&pl, hot), "layer %d: %s after %s", l, h2, hot);
  }
  plan_free(&pl);

  /* Swap the two cost profiles: the hot side becomes the longer pole and
   * its experts now go before the cold side's input copy. */
  size_t n;
  char *text = tu_slurp("schedules/tiny-hotcold.yaml", &n), sched[600];
  static const char hot[] = "bandwidth: 2.0e10, flops: 5.0e10, launch: 2.0e-6";
  static const char cold[] = "bandwidth: 4.0e9, flops: 2.0e9, launch: 5.0e-6";
  char *h = strstr(text, hot), *c = strstr(text, cold);
  ck_assert_msg(h && c && h < c, "tiny-hotcold's cost profiles changed; update this test");
  char *swapped = malloc(n + 1);
  ck_assert_ptr_nonnull(swapped);
  snprintf(swapped, n + 1, "%.*s%s%.*s%s%s", (int)(h - text), text, cold, (int)(c - h - strlen(hot)),
           h + strlen(hot), hot, c + strlen(cold));
  free(text);
  text = swapped;
  snprintf(sched, sizeof sched, "%s/swapped.yaml", tmpl);
  tu_write_text(sched, text);
  free(text);
  snprintf(out, sizeof out, "%s/swapped", tmpl);
  compile_to(sched, out, &pl);
  ck_assert_int_lt(plan_command_of(&pl, "layers.0.ffn.experts[0:6]"), plan_command_of(&pl, "copy.layers.0.sel@cold"));
  plan_free(&pl);
  tu_tmpdir_remove(tmpl);
}
END_TEST

/* Is there an edge from -> to on tensor t with this hazard? */
static int has_edge(const ir_prog *p, const char *from, const char *to, const char *t, int hazard) {
  int a = ir_find_op(p, from), b = ir_find_op(p, to), x = ir_find_tensor(p, t);
  ck_assert_msg(a >= 0 && b >= 0 && x >= 0, "no %s, %s or %s", from, to, t);
  for (int i = 0; i < p->nedges; i++)
    if (p->edges[i].from == a && p->edges[i].to == b && p->edges[i].tensor == x && p->edges[i].hazard == hazard)
      return 1;
  return 0;
}

static int linked(const ir_prog *p, const char *x, const char *y) {
  int a = ir_find_op(p, x), b = ir_find_op(p, y);
  ck_assert_msg(a >= 0 && b >= 0, "no %s or %s", x, y);
  for (int i = 0; i < p->nedges; i++)
    if ((p->edges[i].from == a && p->edges[i].to == b) || (p->edges[i].from == b && p->edges[i].to == a)) return 1;
  return 0;
}

/* A state read, overwritten twice and read again gives all three hazards. */
START_TEST(state_hazards) {
  ir_prog *p = build("tests/cases/deps/hazards.yaml", "tests/cases/compile/one-cpu.sched.yaml");
  ck_assert(has_edge(p, "net.r1", "net.w1", "net.s", PLAN_WAR));
  ck_assert(has_edge(p, "net.r1", "net.w2", "net.s", PLAN_WAR));
  ck_assert(has_edge(p, "net.w1", "net.w2", "net.s", PLAN_WAW));
  ck_assert(has_edge(p, "net.w2", "net.r2", "net.s", PLAN_RAW));
  ck_assert(!linked(p, "net.r1", "net.r2")); /* two reads never conflict */
  ds4c_prog_free(p);
}
END_TEST

/* The hot experts and the copy of the cold part write disjoint rows of one
 * tensor: no edge between them, and the merge reads after both. */
START_TEST(disjoint_rows_do_not_conflict) {
  ir_prog *p = build("models/tiny-moe.yaml", "schedules/tiny-hotcold.yaml");
  const char *hot = "layers.0.ffn.experts[0:6]", *back = "copy.layers.0.slots.parts[4:8]@cold";
  ck_assert(!linked(p, hot, back));
  ck_assert(has_edge(p, hot, "layers.0.ffn.experts.merge", "layers.0.slots.parts", PLAN_RAW));
  ck_assert(has_edge(p, back, "layers.0.ffn.experts.merge", "layers.0.slots.parts", PLAN_RAW));
  ds4c_prog_free(p);
}
END_TEST

/* Each op's position on its stream, by path: the order a plan gives. */

/* early_resolve changes the order and nothing else: tiny-hotcold with and
 * without early_resolve on the router's gate matmul has the same edges
 * (by op paths), the same kernel for each op, the same tensors at the
 * same offsets and the same arenas, read from the two plans. */
START_TEST(early_resolve_changes_order_only) {
  char tmpl[] = "/tmp/ds4-er-XXXXXX";
  tu_tmpdir_make(tmpl);
  char sched[600], a_dir[600], b_dir[600];
  snprintf(sched, sizeof sched, "%s/early.yaml", tmpl);
  snprintf(a_dir, sizeof a_dir, "%s/a", tmpl);
  snprintf(b_dir, sizeof b_dir, "%s/b", tmpl);
  size_t n;
  char *text = tu_slurp("schedules/tiny-hotcold.yaml", &n);
  FILE *f = fopen(sched, "w");
  ck_assert_ptr_nonnull(f);
  ck_assert_uint_eq(fwrite(text, 1, n, f), n);
  fputs("early_resolve:\n  - \"layers.*.ffn.gate\"\n", f);
  ck_assert_int_eq(fclose(f), 0);
  free(text);
  plan a, b;
  compile_to("schedules/tiny-hotcold.yaml", a_dir, &a);
  compile_to(sched, b_dir, &b);

  assert_order_only(&a, &b);
  /* The router's consumer is staged right behind it, ahead of the shared
   * expert, which went first without the hint. */
  ck_assert_int_lt(plan_command_of(&a, "layers.0.ffn.shared"), plan_command_of(&a, "layers.0.ffn.route"));
  ck_assert_int_lt(plan_command_of(&b, "layers.0.ffn.route"), plan_command_of(&b, "layers.0.ffn.shared"));
  plan_free(&a);
  plan_free(&b);
  tu_tmpdir_remove(tmpl);
}
END_TEST

/* Entries that share the name 'layers' number their instances globally
 * (DeepSeek-V4's layout in small): layers.0-1 sliding, layers.2 CSA, then
 * HCA and CSA in turn from layers.3; checkpoint names take the global index
 * and the carried tensor runs through every instance in order. */
START_TEST(shared_layer_name_numbers_globally) {
  ir_prog *p = build("tests/cases/compile/layers-shared-name.yaml", "tests/cases/compile/one-cpu.sched.yaml");
  static const char *const kinds[] = {"swa", "swa", "csa", "hca", "csa", "hca", "csa"};
  int prev = -1;
  for (int i = 0; i < 7; i++) {
    char path[128], other[128], w[64], y[64], ckpt[64];
    snprintf(path, sizeof path, "layers.%d.attn.%s", i, kinds[i]);
    snprintf(other, sizeof other, "layers.%d.attn.%s", i, strcmp(kinds[i], "hca") ? "hca" : "csa");
    int op = ir_find_op(p, path);
    ck_assert_msg(op > prev, "%s missing or out of order", path);
    ck_assert_msg(ir_find_op(p, other) < 0, "%s should not exist", other);
    snprintf(w, sizeof w, "layers.%d.w", i);
    snprintf(ckpt, sizeof ckpt, "layers.%d.attn.w.weight", i);
    int t = ir_find_tensor(p, w);
    ck_assert_int_ge(t, 0);
    ck_assert_str_eq(p->tensors[t].checkpoint, ckpt);
    /* the carried tensor: the previous instance's output */
    if (i) snprintf(y, sizeof y, "layers.%d.y", i - 1);
    else snprintf(y, sizeof y, "embed.x");
    ck_assert_int_eq(p->ops[op].in[0], ir_find_tensor(p, y));
    prev = op;
  }
  ck_assert_int_lt(ir_find_op(p, "layers.7.attn.hca"), 0);
  ck_assert_int_eq(p->ops[ir_find_op(p, "head.proj")].in[0], ir_find_tensor(p, "layers.6.y"));
  ds4c_prog_free(p);
}
END_TEST

/* A block made of parts is one instance of each part's tensors and ops,
 * in the parts' order: the second part reads the first's output by name,
 * the first takes the carried tensor and the last carries its own out. */
START_TEST(block_made_of_parts) {
  ir_prog *p = build("tests/cases/compile/block-parts-ok.yaml", "tests/cases/compile/one-cpu.sched.yaml");
  static const char *const order[] = {"embed.embed", "layers.0.one", "layers.0.two", "layers.1.one",
                                      "layers.1.two", "head.head", "head.sample"};
  ck_assert_int_eq(p->nops, 7);
  for (int i = 0; i < 7; i++) ck_assert_str_eq(p->ops[i].path, order[i]);
  ck_assert_int_eq(p->ops[1].in[0], ir_find_tensor(p, "embed.x"));
  ck_assert_int_eq(p->ops[2].in[0], ir_find_tensor(p, "layers.0.y"));
  ck_assert_int_eq(p->ops[3].in[0], ir_find_tensor(p, "layers.0.z"));
  ck_assert_int_eq(p->ops[5].in[0], ir_find_tensor(p, "layers.1.z"));
  /* tensors: each part's, in order, in the instance's scope */
  ck_assert_int_lt(ir_find_tensor(p, "layers.0.w1"), ir_find_tensor(p, "layers.0.w2"));
  ck_assert_int_lt(ir_find_tensor(p, "layers.0.y"), ir_find_tensor(p, "layers.0.w2"));
  ds4c_prog_free(p);
}
END_TEST

/* ---- plans per step shape ---- */

static void compile_pair(const char *model, const char *sched, const char *out) {
  ds4c_options o = {.model_path = model, .sched_path = sched, .out_dir = out};
  dsl_diag d = {0};
  ck_assert_msg(ds4c_compile(&o, &d) == 0, "%s", d.msg);
}

static void read_plan_at(const char *dir, const char *sub, plan *p) {
  char path[1024];
  snprintf(path, sizeof path, "%s%s/plan.ds4p", dir, sub);
  rt_status st = plan_read(path, p);
  ck_assert_msg(st == NULL, "%s", rt_status_msg(st));
}

/* Each op's place in p: its stream's count of launches and copies before
 * it (the plans may interleave the streams' ops differently, by their own
 * cost estimates; a stream replays its ops in one order in both). -1 for
 * an op no command submits. */
static int64_t *stream_ranks(const plan *p) {
  int64_t *rank = malloc(p->nops * sizeof *rank), *seen = calloc(p->nstreams, sizeof *seen);
  ck_assert_ptr_nonnull(rank);
  ck_assert_ptr_nonnull(seen);
  for (uint32_t i = 0; i < p->nops; i++) rank[i] = -1;
  for (uint32_t c = 0; c < p->ncommands; c++) {
    const plan_command *k = &p->commands[c];
    if (k->kind == PLAN_CMD_LAUNCH || k->kind == PLAN_CMD_COPY) rank[k->op] = seen[k->stream]++;
  }
  free(seen);
  return rank;
}

/* Op i of p in q: the op in the same place on the same stream (the same
 * index where no command submits it). */
static uint32_t same_op(const plan *p, const int64_t *prank, uint32_t i, const plan *q, const int64_t *qrank) {
  if (prank[i] < 0) return i;
  for (uint32_t j = 0; j < q->nops; j++)
    if (q->ops[j].stream == p->ops[i].stream && qrank[j] == prank[i]) return j;
  ck_abort_msg("op %s has no counterpart in the decode plan", plan_str(p, p->ops[i].path));
  return 0;
}

/* A bundle's prefill and decode plans: the same ops (kind, stream, and
 * for a launch its path) in the same order on each stream, the same
 * dependency edges, placement and devices; shapes and grids for their own
 * slots; every weight and state tensor at the same offset; both verified
 * (ds4c_compile ran verify on each). */
static void assert_plans_differ_in_shapes_only(const char *model, const char *sched, uint32_t prefill) {
  char tmpl[] = "/tmp/ds4-shapes-XXXXXX", out[600];
  tu_tmpdir_make(tmpl);
  snprintf(out, sizeof out, "%s/b", tmpl);
  compile_pair(model, sched, out);
  plan p, q;
  read_plan_at(out, "", &p);
  read_plan_at(out, "/decode", &q);
  ck_assert_uint_eq(p.info.tokens, prefill);
  ck_assert_uint_eq(q.info.tokens, 1);
  ck_assert_uint_eq(p.info.flags & PLAN_FLAG_DECODE, 0);
  ck_assert_uint_eq(q.info.flags & PLAN_FLAG_DECODE, PLAN_FLAG_DECODE);
  ck_assert_uint_eq(p.info.prompt, q.info.prompt);
  ck_assert_uint_eq(p.ndevices, q.ndevices);
  for (uint32_t d = 0; d < p.ndevices; d++) {
    ck_assert_str_eq(plan_str(&p, p.devices[d].name), plan_str(&q, q.devices[d].name));
    ck_assert_uint_eq(p.devices[d].arena_bytes, q.devices[d].arena_bytes);
  }
  ck_assert_uint_eq(p.nops, q.nops);
  uint32_t *in_q = malloc(p.nops * sizeof *in_q);
  int64_t *prank = stream_ranks(&p), *qrank = stream_ranks(&q);
  ck_assert_ptr_nonnull(in_q);
  for (uint32_t i = 0; i < p.nops; i++) in_q[i] = same_op(&p, prank, i, &q, qrank);
  free(prank);
  free(qrank);
  int smaller = 0;
  for (uint32_t i = 0; i < p.nops; i++) {
    const plan_op *a = &p.ops[i], *b = &q.ops[in_q[i]];
    ck_assert_uint_eq(a->stream, b->stream);
    ck_assert_uint_eq(a->kernel == PLAN_NONE, b->kernel == PLAN_NONE);
    if (a->kernel == PLAN_NONE) continue;
    const plan_kernel *ka = &p.kernels[a->kernel], *kb = &q.kernels[b->kernel];
    ck_assert_str_eq(plan_str(&p, ka->kind), plan_str(&q, kb->kind));
    ck_assert_str_eq(plan_str(&p, a->path), plan_str(&q, b->path));
    ck_assert_msg(kb->grid <= ka->grid, "%s: decode grid %u above prefill's %u", plan_str(&p, a->path), kb->grid,
                  ka->grid);
    smaller += kb->grid < ka->grid;
  }
  ck_assert_int_gt(smaller, 0);
  ck_assert_uint_eq(p.nedges, q.nedges);
  for (uint32_t e = 0; e < p.nedges; e++) {
    int found = 0;
    for (uint32_t f = 0; f < q.nedges && !found; f++)
      found = in_q[p.edges[e].from] == q.edges[f].from && in_q[p.edges[e].to] == q.edges[f].to &&
              p.edges[e].hazard == q.edges[f].hazard;
    ck_assert_msg(found, "edge %u (%s -> %s) missing from the decode plan", e, plan_str(&p, p.ops[p.edges[e].from].path),
                  plan_str(&p, p.ops[p.edges[e].to].path));
  }
  ck_assert_uint_eq(p.ntensors, q.ntensors);
  for (uint32_t t = 0; t < p.ntensors; t++) {
    const plan_tensor *a = &p.tensors[t], *b = &q.tensors[t];
    ck_assert_uint_eq(a->role, b->role);
    ck_assert_uint_eq(a->device, b->device);
    if (a->role != PLAN_WEIGHT && a->role != PLAN_STATE) continue;
    ck_assert_str_eq(plan_str(&p, a->name), plan_str(&q, b->name));
    ck_assert_msg(a->offset == b->offset && a->bytes == b->bytes, "%s moved", plan_str(&p, a->name));
  }
  free(in_q);
  plan_free(&p);
  plan_free(&q);
  tu_tmpdir_remove(tmpl);
}

START_TEST(decode_plan_differs_in_shapes_and_grids_only) {
  assert_plans_differ_in_shapes_only("models/tiny-moe.yaml", "schedules/tiny-hotcold.yaml", 4);
  assert_plans_differ_in_shapes_only("models/ds4-flash-mini.yaml", "tests/cases/compile/mini-cpu-prefill8.sched.yaml", 8);
  /* a GPU's fusions alike in both plans, whichever kernels run them; the
   * schedule's chunks of 2048 slots are the mini's max_seq, 64 */
  assert_plans_differ_in_shapes_only("models/ds4-flash-mini-bf16.yaml", "schedules/ds4-flash-h200.yaml", 64);
}
END_TEST

/* Both plans of tiny-moe under the schedule at path, written from fmt with
 * its step; every state tensor the same bytes in both. */
static void step_plans(ds4c_options *o, const char *path, const char *fmt, const char *step, ir_prog **p,
                       ir_prog **q) {
  char text[1024];
  snprintf(text, sizeof text, fmt, step);
  tu_write_text(path, text);
  dsl_diag d = {0};
  o->decode_plan = 0;
  ck_assert_msg(ds4c_build(o, p, &d) == 0, "%s", d.msg);
  o->decode_plan = 1;
  ck_assert_msg(ds4c_build(o, q, &d) == 0, "%s", d.msg);
  for (int t = 0; t < (*p)->ntensors; t++)
    if ((*p)->tensors[t].role == PLAN_STATE) ck_assert_int_eq((*p)->tensors[t].bytes, (*q)->tensors[t].bytes);
}

/* The schedule's step: prefill overrides the model's tokens (at most the
 * model's max_seq), the state is sized from it in both plans, and what it
 * refuses it names. */
START_TEST(step_shapes_from_the_schedule) {
  const char *sched_fmt = "schedule: s\nmodel: tiny-moe\ndevices:\n"
                          "  - {name: cpu0, backend: cpu, arch: host, ordinal: 0, threads: 1,\n"
                          "     bandwidth: 1.0e10, flops: 1.0e11, launch: 1.0e-6}\n"
                          "streams:\n  - {name: main, device: cpu0}\nowners:\n  - \"* -> cpu0.main\"\n"
                          "step: {%s}\n";
  char tmpl[] = "/tmp/ds4-step-XXXXXX", path[600], text[1024];
  tu_tmpdir_make(tmpl);
  snprintf(path, sizeof path, "%s/s.yaml", tmpl);
  ds4c_options o = {.model_path = "models/tiny-moe.yaml", .sched_path = path};
  ir_prog *p, *q;
  step_plans(&o, path, sched_fmt, "prefill: 3, decode: 1, prompt: 10", &p, &q);
  ck_assert_int_eq(p->tokens, 3);
  ck_assert_int_eq(q->tokens, 1);
  ck_assert_int_eq(p->prompt, 10);
  int ring = ir_find_tensor(p, "layers.0.k_cache"), x = ir_find_tensor(p, "embed.x");
  ck_assert_int_ge(x, 0);
  ck_assert_int_eq(p->tensors[x].dim[0], 3);
  ck_assert_int_eq(q->tensors[x].dim[0], 1);
  if (ring >= 0) ck_assert_int_eq(p->tensors[ring].bytes, q->tensors[ring].bytes);
  ds4c_prog_free(p);
  ds4c_prog_free(q);

  /* chunks above tiny-moe's max_seq (64) hold 64 slots, the state too */
  step_plans(&o, path, sched_fmt, "prefill: 2048, decode: 1, prompt: 10", &p, &q);
  ck_assert_int_eq(p->tokens, 64);
  ck_assert_int_eq(p->max_seq, 64);
  ck_assert_int_eq(q->tokens, 1);
  x = ir_find_tensor(p, "embed.x");
  ck_assert_int_ge(x, 0);
  ck_assert_int_eq(p->tensors[x].dim[0], 64);
  ds4c_prog_free(p);
  ds4c_prog_free(q);

  static const struct {
    const char *step, *want;
  } bad[] = {
      {"prefill: 3, decode: 2, prompt: 10",
       "step: decode slots must be 1 (a bundle decodes one sequence, a token a step), found '2'"},
      {"prefill: 70000, decode: 1, prompt: 10", "step: prefill slots must be from 1 to 65536, found '70000'"},
      {"prefill: 3, decode: 1", "missing required key 'prompt'"},
      {"prefill: 0, decode: 1, prompt: 10", "prefill"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    snprintf(text, sizeof text, sched_fmt, bad[i].step);
    tu_write_text(path, text);
    o.decode_plan = 0;
    dsl_diag e = {0};
    ck_assert_int_ne(ds4c_build(&o, &p, &e), 0);
    ck_assert_msg(strstr(e.msg, bad[i].want) && strstr(e.msg, path), "step {%s}: %s", bad[i].step, e.msg);
  }
  tu_tmpdir_remove(tmpl);
}
END_TEST

/* ---- the kernel cache ---- */

/* Lines of the log that the DS4_CC wrapper of kernel_cache_hits_and_repairs
 * writes holding `what`: " -c " for a kernel's object compiled, "-shared"
 * for host.so linked, "--version" for the toolchain described. */
static int cc_calls(const char *log, const char *what) {
  FILE *f = fopen(log, "r");
  if (!f) return 0;
  char line[8192];
  int n = 0;
  while (fgets(line, sizeof line, f)) n += strstr(line, what) != NULL;
  fclose(f);
  return n;
}

/* The host kernels of a bundle's two plans: how many sources in all
 * (total) and how many distinct ones (the plans share some kernels). */
static void host_kernels(const char *bundle, int *total, int *distinct) {
  char cmd[1200], line[512];
  snprintf(cmd, sizeof cmd, "cd %s && ls kernels/host decode/kernels/host | grep -c '\\.c$'", bundle);
  FILE *f = popen(cmd, "r");
  ck_assert_ptr_nonnull(f);
  ck_assert_ptr_nonnull(fgets(line, sizeof line, f));
  pclose(f);
  *total = atoi(line);
  snprintf(cmd, sizeof cmd, "cd %s && ls kernels/host decode/kernels/host | grep '\\.c$' | sort -u | wc -l", bundle);
  f = popen(cmd, "r");
  ck_assert_ptr_nonnull(f);
  ck_assert_ptr_nonnull(fgets(line, sizeof line, f));
  pclose(f);
  *distinct = atoi(line);
  ck_assert_int_gt(*distinct, 0);
}

/* A folder with a DS4_CC wrapper (named `name`) that logs each call to
 * cc.log and runs cc. */
static void write_wrapper(const char *dir, const char *name) {
  char path[600];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fprintf(f, "#!/bin/sh\necho \"$*\" >> %s/cc.log\nexec cc \"$@\"\n", dir);
  ck_assert_int_eq(fclose(f), 0);
  ck_assert_int_eq(chmod(path, 0755), 0);
}

static void compile_cached(const char *out, const char *sched, const char *cache) {
  ds4c_options o = {.model_path = "models/tiny-moe.yaml", .sched_path = sched, .out_dir = out, .cache_dir = cache};
  dsl_diag d = {0};
  ck_assert_msg(ds4c_compile(&o, &d) == 0, "%s", d.msg);
}

/* The entries of the cache folder; in path, the last one read that holds
 * a host.so (not a kernel's object). */
static int cache_entry(const char *cache, char *path, size_t n) {
  DIR *dir = opendir(cache);
  if (!dir) return 0;
  int count = 0;
  struct dirent *e;
  while ((e = readdir(dir)))
    if (e->d_name[0] != '.') {
      count++;
      char entry[1200];
      snprintf(entry, sizeof entry, "%s/%s", cache, e->d_name);
      char *bytes = tu_slurp(entry, NULL);
      if (strstr(bytes, "\nfile host.so ")) snprintf(path, n, "%s", entry);
      free(bytes);
    }
  closedir(dir);
  return count;
}

/* A compile builds two host code objects, the prefill plan's and the
 * decode plan's, each linked from its kernels' objects; a kernel both
 * plans share is compiled once, and the toolchain is described once. A
 * second compile takes both libraries from the cache, with every byte of
 * the bundle the same; a build without the cache agrees with it; an entry
 * whose bytes were changed or cut short is never used but built and
 * stored anew; another compiler (here: another path to it) misses; and a
 * compile of another schedule of the model compiles only the kernels the
 * cache has not met. */
START_TEST(kernel_cache_hits_and_repairs) {
  char tmpl[] = "/tmp/ds4-kcache-XXXXXX";
  tu_tmpdir_make(tmpl);
  char cache[600], log[600], out[700], ref[700], entry[1200], path[1400], other[1400];
  snprintf(cache, sizeof cache, "%s/cache/ds4c", tmpl); /* made by the compile */
  snprintf(log, sizeof log, "%s/cc.log", tmpl);
  write_wrapper(tmpl, "cc.sh");
  write_wrapper(tmpl, "cc2.sh");
  snprintf(path, sizeof path, "%s/cc.sh", tmpl);
  ck_assert_int_eq(setenv("DS4_CC", path, 1), 0);

  snprintf(ref, sizeof ref, "%s/first", tmpl);
  compile_cached(ref, "schedules/tiny-1dev.yaml", cache);
  int total, distinct;
  host_kernels(ref, &total, &distinct);
  ck_assert_int_eq(cc_calls(log, "-shared"), 2);
  ck_assert_int_eq(cc_calls(log, " -c "), distinct);
  ck_assert_int_eq(cc_calls(log, "--version"), 1);
  ck_assert_int_eq(cache_entry(cache, entry, sizeof entry), distinct + 2);

  snprintf(out, sizeof out, "%s/second", tmpl);
  compile_cached(out, "schedules/tiny-1dev.yaml", cache);
  ck_assert_int_eq(cc_calls(log, "-shared"), 2); /* from the cache */
  ck_assert_int_eq(cc_calls(log, " -c "), distinct);
  ck_assert_int_eq(cc_calls(log, "--version"), 2);
  static const char *const files[] = {"kernels/host.so",        "plan.ds4p",        "plan.txt",
                                      "decode/kernels/host.so", "decode/plan.ds4p", "decode/plan.txt"};
  for (int i = 0; i < 6; i++) {
    snprintf(path, sizeof path, "%s/%s", ref, files[i]);
    snprintf(other, sizeof other, "%s/%s", out, files[i]);
    assert_same_file(path, other);
  }
  /* The bundle keeps the sources and the library, not the objects. */
  char cmd[2400], line[64];
  snprintf(cmd, sizeof cmd, "ls %s/kernels/host %s/decode/kernels/host | grep -q '\\.o$'", out, out);
  ck_assert_int_ne(system(cmd), 0);

  snprintf(out, sizeof out, "%s/uncached", tmpl);
  compile_cached(out, "schedules/tiny-1dev.yaml", NULL);
  ck_assert_int_eq(cc_calls(log, "-shared"), 4);
  ck_assert_int_eq(cc_calls(log, " -c "), distinct + total);
  ck_assert_int_eq(cc_calls(log, "--version"), 2); /* no cache, no key */
  for (int i = 0; i < 6; i += 3) {
    snprintf(path, sizeof path, "%s/%s", ref, files[i]);
    snprintf(other, sizeof other, "%s/%s", out, files[i]);
    assert_same_file(path, other);
  }

  /* Corrupt one library's entry: its last byte flipped, then cut in half.
   * It is linked again from the objects, which stay valid. */
  for (int damage = 0; damage < 2; damage++) {
    size_t n;
    char *bytes = tu_slurp(entry, &n);
    if (damage == 0) bytes[n - 1] ^= 0x40;
    tu_write_bytes(entry, bytes, damage == 0 ? n : n / 2);
    free(bytes);
    snprintf(out, sizeof out, "%s/repaired%d", tmpl, damage);
    compile_cached(out, "schedules/tiny-1dev.yaml", cache);
    ck_assert_int_eq(cc_calls(log, "-shared"), 5 + damage); /* rebuilt, not used */
    ck_assert_int_eq(cc_calls(log, " -c "), distinct + total);
    for (int i = 0; i < 6; i += 3) {
      snprintf(path, sizeof path, "%s/%s", ref, files[i]);
      snprintf(other, sizeof other, "%s/%s", out, files[i]);
      assert_same_file(path, other);
    }
    compile_cached(out, "schedules/tiny-1dev.yaml", cache);
    ck_assert_int_eq(cc_calls(log, "-shared"), 5 + damage); /* the entry was written anew */
  }

  /* Another schedule: its kernels that tiny-1dev's bundle has are taken
   * from the cache; only the others are compiled. */
  snprintf(out, sizeof out, "%s/hotcold", tmpl);
  compile_cached(out, "schedules/tiny-hotcold.yaml", cache);
  int hc_total, hc_distinct;
  host_kernels(out, &hc_total, &hc_distinct);
  snprintf(cmd, sizeof cmd,
           "cd %s && ls kernels/host decode/kernels/host | grep '\\.c$' | sort -u > %s/new.txt && "
           "cd %s && ls kernels/host decode/kernels/host | grep '\\.c$' | sort -u | comm -23 %s/new.txt - | wc -l",
           out, tmpl, ref, tmpl);
  FILE *f = popen(cmd, "r");
  ck_assert_ptr_nonnull(f);
  ck_assert_ptr_nonnull(fgets(line, sizeof line, f));
  pclose(f);
  int unseen = atoi(line);
  ck_assert_int_gt(unseen, 0);
  ck_assert_int_lt(unseen, hc_distinct);
  ck_assert_int_eq(cc_calls(log, " -c "), distinct + total + unseen);
  ck_assert_int_eq(cc_calls(log, "-shared"), 8);

  snprintf(path, sizeof path, "%s/cc2.sh", tmpl);
  ck_assert_int_eq(setenv("DS4_CC", path, 1), 0);
  int entries = cache_entry(cache, entry, sizeof entry);
  compile_cached(out, "schedules/tiny-1dev.yaml", cache);
  ck_assert_int_eq(cc_calls(log, "-shared"), 10);
  ck_assert_int_eq(cc_calls(log, " -c "), 2 * distinct + total + unseen);
  ck_assert_int_eq(cache_entry(cache, entry, sizeof entry), entries + distinct + 2);
  unsetenv("DS4_CC");

  tu_tmpdir_remove(tmpl);
}
END_TEST

/* ds4c compile's cache folder: $DS4C_CACHE, else $XDG_CACHE_HOME/ds4c,
 * else ~/.cache/ds4c; --no-cache uses none. */
START_TEST(ds4c_finds_its_cache) {
  const char *bin = tu_build_dir();
  char tmpl[] = "/tmp/ds4-kcache-cli-XXXXXX";
  tu_tmpdir_make(tmpl);
  static const struct {
    const char *env, *flags, *cache; /* env: prefix of the command; cache: where the entry lands, "" for none */
  } cases[] = {
      {"DS4C_CACHE=%s/a XDG_CACHE_HOME=%s/x HOME=%s/h", "", "a"},
      {"DS4C_CACHE= XDG_CACHE_HOME=%s/x HOME=%s/h", "", "x/ds4c"},
      {"DS4C_CACHE= XDG_CACHE_HOME= HOME=%s/h", "", "h/.cache/ds4c"},
      {"DS4C_CACHE=%s/n XDG_CACHE_HOME=%s/n HOME=%s/n", " --no-cache", ""},
  };
  for (int i = 0; i < 4; i++) {
    char env[700], cmd[2400], entry[1200], where[700];
    snprintf(env, sizeof env, cases[i].env, tmpl, tmpl, tmpl);
    snprintf(cmd, sizeof cmd,
             "env %s %s/ds4c compile models/tiny-moe.yaml schedules/tiny-1dev.yaml -o %s/out%d%s > /dev/null", env,
             bin, tmpl, i, cases[i].flags);
    ck_assert_msg(system(cmd) == 0, "%s", cmd);
    if (*cases[i].cache) {
      int total, distinct;
      snprintf(where, sizeof where, "%s/out%d", tmpl, i);
      host_kernels(where, &total, &distinct);
      snprintf(where, sizeof where, "%s/%s", tmpl, cases[i].cache);
      ck_assert_msg(cache_entry(where, entry, sizeof entry) == distinct + 2,
                    "not the %d entries (two libraries, their objects) in %s after %s", distinct + 2, where, cmd);
    } else {
      snprintf(where, sizeof where, "%s/n", tmpl);
      ck_assert_msg(access(where, F_OK) != 0, "%s made %s", cmd, where);
    }
  }
  tu_tmpdir_remove(tmpl);
}
END_TEST

/* ds4c compile's report: each plan's commands, the arenas, then the
 * decode plan's launches in the decoder layers (tiny-moe under
 * tiny-hotcold: 21 in each of its 2 layers, the embedding and the head's 4
 * outside). */
START_TEST(ds4c_reports_layer_launches) {
  char tmpl[] = "/tmp/ds4-report-XXXXXX", cmd[2048], *out = NULL;
  tu_tmpdir_make(tmpl);
  snprintf(cmd, sizeof cmd, "%s/ds4c compile models/tiny-moe.yaml schedules/tiny-hotcold.yaml -o %s/b --no-cache",
           tu_build_dir(), tmpl);
  ck_assert_int_eq(tu_capture(cmd, &out, NULL), 0);
  char want[1024];
  snprintf(want, sizeof want,
           "ds4c: %s/b: prefill plan, 4 slots: 46 launches, 6 copies, 10 records, 10 waits on 3 streams\n"
           "ds4c: %s/b: decode plan, 1 slot: 46 launches, 6 copies, 10 records, 10 waits on 3 streams\n"
           "ds4c: %s/b: arenas: hot 623040 bytes, cold 101440 bytes\n"
           "ds4c: %s/b: decode plan: 42 launches in 2 decoder layers, at most 21 in one (layers.0); 4 outside them\n",
           tmpl, tmpl, tmpl, tmpl);
  ck_assert_str_eq(out, want);
  free(out);
  /* A usage error is one line that points at --help. */
  snprintf(cmd, sizeof cmd, "%s/ds4c compile models/tiny-moe.yaml 2>&1", tu_build_dir());
  ck_assert_int_eq(tu_capture(cmd, &out, NULL), 64);
  ck_assert_str_eq(out, "ds4c: error: compile needs MODEL.yaml and SCHEDULE.yaml (ds4c --help lists the "
                        "commands and options)\n");
  free(out);
  tu_tmpdir_remove(tmpl);
}
END_TEST

/* --cpu: every device of tiny-gpu-cpu (a cuda device and a cpu one) on
 * the cpu backend, arch host, no memory bound, with the schedule's device
 * names, streams and owners; the ops, their streams and the order are the
 * GPU plan's except that the cpu keeps a moe_experts whole and two
 * matmuls of one x apart (no lower). */
START_TEST(cpu_retargets_every_device) {
  ds4c_options o = {.model_path = "models/tiny-moe.yaml", .sched_path = "schedules/tiny-gpu-cpu.yaml", .cpu = 1};
  ir_prog *cpu, *gpu = build("models/tiny-moe.yaml", "schedules/tiny-gpu-cpu.yaml");
  dsl_diag d = {0};
  ck_assert_msg(ds4c_build(&o, &cpu, &d) == 0, "%s", d.msg);
  ck_assert_int_eq(cpu->ndevices, gpu->ndevices);
  ck_assert_int_eq(gpu->devices[0].backend, PLAN_BACKEND_CUDA);
  for (int i = 0; i < cpu->ndevices; i++) {
    ck_assert_str_eq(cpu->devices[i].name, gpu->devices[i].name);
    ck_assert_int_eq(cpu->devices[i].backend, PLAN_BACKEND_CPU);
    ck_assert_str_eq(cpu->devices[i].arch, "host");
    ck_assert_int_eq(cpu->devices[i].memory, 0);
  }
  ck_assert_int_eq(cpu->nstreams, gpu->nstreams);
  for (int i = 0; i < cpu->nstreams; i++) ck_assert_str_eq(cpu->streams[i].name, gpu->streams[i].name);
  int lowered = 0, pairs = 0, triples = 0, fused = 0;
  for (int i = 0; i < gpu->nops; i++) {
    lowered += gpu->ops[i].kind == IR_OP_MOE_UP;
    pairs += gpu->ops[i].kind == IR_OP_MATMUL_PAIR;
    triples += gpu->ops[i].kind == IR_OP_MATMUL_TRIPLE;
    fused += gpu->ops[i].kind == IR_OP_MOE_COMBINE_ADD;
  }
  ck_assert_int_gt(lowered, 0);
  ck_assert_int_gt(pairs + triples, 0);
  ck_assert_int_eq(cpu->nops, gpu->nops - lowered + pairs + 2 * triples + fused);
  for (int i = 0; i < cpu->nops; i++) {
    ck_assert_int_ne(cpu->ops[i].kind, IR_OP_MOE_UP);
    ck_assert_int_ne(cpu->ops[i].kind, IR_OP_MATMUL_PAIR);
    ck_assert_int_ne(cpu->ops[i].kind, IR_OP_MATMUL_TRIPLE);
    ck_assert_int_ne(cpu->ops[i].kind, IR_OP_MOE_COMBINE_ADD);
    for (int j = 0; j < gpu->nops; j++)
      if (strcmp(cpu->ops[i].path, gpu->ops[j].path) == 0)
        ck_assert_str_eq(cpu->streams[cpu->ops[i].stream].name, gpu->streams[gpu->ops[j].stream].name);
  }
  ds4c_prog_free(cpu);
  ds4c_prog_free(gpu);
}
END_TEST

/* On a GPU each decoder layer's routed combine, its add to the shared
 * expert's output and the hc_post of that sum are one hc_post_combine, in
 * the hc_post's place and on its stream, reading the combine's inputs,
 * the shared output and the hc_post's other three (lower.c); ffn_out,
 * their sum, is read by no op. The cpu schedule keeps all three. */
START_TEST(combine_add_fused_on_gpu) {
  ir_prog *gpu = build("models/ds4-flash-mini.yaml", "schedules/ds4-flash-h200.yaml");
  ir_prog *cpu = build("models/ds4-flash-mini.yaml", "schedules/ds4-flash-cpu.yaml");
  int fused = 0, layers = 0;
  for (int i = 0; i < gpu->nops; i++) {
    const ir_op *op = &gpu->ops[i];
    ck_assert_int_ne(op->kind, IR_OP_MOE_COMBINE);
    ck_assert_int_ne(op->kind, IR_OP_MOE_COMBINE_ADD);
    for (int j = 0; j < op->nin; j++)
      ck_assert_msg(!strstr(gpu->tensors[op->in[j]].path, ".ffn_out"), "%s reads %s", op->path,
                    gpu->tensors[op->in[j]].path);
    if (op->kind != IR_OP_HC_POST_COMBINE) continue;
    fused++;
    const char *tail = strstr(op->path, ".ffn.combine+add_shared+hc_post");
    ck_assert_msg(tail && !tail[strlen(".ffn.combine+add_shared+hc_post")], "%s", op->path);
    ck_assert_int_eq(op->nin, 6);
    ck_assert(strstr(gpu->tensors[op->in[0]].path, ".slots") != NULL);
    ck_assert(strstr(gpu->tensors[op->in[2]].path, ".shared_out") != NULL);
    ck_assert(strstr(gpu->tensors[op->in[3]].path, ".X_mid") != NULL);
    ck_assert(strstr(gpu->tensors[op->in[4]].path, ".post_f") != NULL);
    ck_assert(strstr(gpu->tensors[op->in[5]].path, ".comb_f") != NULL);
    ck_assert(strstr(gpu->tensors[op->out[0]].path, ".X_out") != NULL);
    ck_assert_str_eq(gpu->streams[op->stream].name, "main");
  }
  for (int i = 0; i < cpu->nops; i++) {
    ck_assert_int_ne(cpu->ops[i].kind, IR_OP_MOE_COMBINE_ADD);
    ck_assert_int_ne(cpu->ops[i].kind, IR_OP_HC_POST_COMBINE);
    layers += cpu->ops[i].kind == IR_OP_MOE_COMBINE;
  }
  ck_assert_int_gt(layers, 0);
  ck_assert_int_eq(fused, layers);
  ds4c_prog_free(gpu);
  ds4c_prog_free(cpu);
}
END_TEST

static int count_kind(const ir_prog *p, int kind) {
  int n = 0;
  for (int i = 0; i < p->nops; i++) n += p->ops[i].kind == kind;
  return n;
}

/* The matmul_hc_posts of a GPU plan, checked: each attention block's
 * output projection (o_b) and the hc_post that reads its output are one
 * op in the hc_post's place, reading o_b's x and weight and hc_post's X,
 * post and comb (lower.c); ao, the projection's output, is read by no op. */
static int matmul_hc_posts(const ir_prog *gpu) {
  int fused = 0;
  for (int i = 0; i < gpu->nops; i++) {
    const ir_op *op = &gpu->ops[i];
    ck_assert_int_ne(op->kind, IR_OP_HC_POST);
    for (int j = 0; j < op->nin; j++)
      ck_assert_msg(!strstr(gpu->tensors[op->in[j]].path, ".ao"), "%s reads %s", op->path,
                    gpu->tensors[op->in[j]].path);
    if (op->kind != IR_OP_MATMUL_HC_POST) continue;
    fused++;
    const char *tail = strstr(op->path, ".attn.o_b+hc_post");
    ck_assert_msg(tail && !tail[strlen(".attn.o_b+hc_post")], "%s", op->path);
    ck_assert_int_eq(op->nin, 5);
    ck_assert(strstr(gpu->tensors[op->in[0]].path, ".oa") != NULL);
    ck_assert(strstr(gpu->tensors[op->in[1]].path, ".wo_b") != NULL);
    ck_assert(strstr(gpu->tensors[op->in[3]].path, ".post_a") != NULL);
    ck_assert(strstr(gpu->tensors[op->in[4]].path, ".comb_a") != NULL);
    ck_assert(strstr(gpu->tensors[op->out[0]].path, ".X_mid") != NULL);
    ck_assert_str_eq(gpu->streams[op->stream].name, "main");
  }
  return fused;
}

/* Both plans of a GPU bundle fuse every attention block's o_b and
 * hc_post, the decode plan's one slot on the CUDA cores and the bf16
 * prefill chunk's on the matrix units; the cpu schedule keeps both ops
 * (an hc_post a block, attention's and the feed-forward's). */
START_TEST(output_projection_fused_with_hc_post) {
  ds4c_options o = {.model_path = "models/ds4-flash-mini-bf16.yaml", .sched_path = "schedules/ds4-flash-h200.yaml",
                    .decode_plan = 1};
  ir_prog *decode;
  dsl_diag d = {0};
  ck_assert_msg(ds4c_build(&o, &decode, &d) == 0, "%s", d.msg);
  ir_prog *prefill = build("models/ds4-flash-mini-bf16.yaml", "schedules/ds4-flash-h200.yaml");
  ir_prog *cpu = build("models/ds4-flash-mini-bf16.yaml", "schedules/ds4-flash-cpu.yaml");
  int layers = matmul_hc_posts(decode);
  ck_assert_int_gt(layers, 0);
  ck_assert_int_eq(matmul_hc_posts(prefill), layers);
  ck_assert_int_eq(count_kind(cpu, IR_OP_MATMUL_HC_POST), 0);
  ck_assert_int_eq(count_kind(cpu, IR_OP_HC_POST), 2 * layers);
  ds4c_prog_free(decode);
  ds4c_prog_free(prefill);
  ds4c_prog_free(cpu);
}
END_TEST

/* The op of kind `kind` at path, or NULL. */
static const ir_op *op_at(const ir_prog *p, const char *path, int kind) {
  for (int i = 0; i < p->nops; i++)
    if (!strcmp(p->ops[i].path, path)) {
      ck_assert_int_eq(p->ops[i].kind, kind);
      return &p->ops[i];
    }
  return NULL;
}

/* On a GPU an argmax over a row of more than 4096 logits is two launches
 * (lower.c): head.sample.parts, the best of each part of 4096 at most
 * ([T, 32] vals and idx for DeepSeek-V4-Flash's 129280), then
 * head.sample.best from them and the logits, both of asked rows as the
 * argmax was; a row of 256 (ds4-flash-mini) and the cpu keep one. */
START_TEST(argmax_in_parts_on_gpu) {
  ir_prog *gpu = build("models/ds4-flash-slice-bf16.yaml", "schedules/ds4-flash-h200.yaml");
  ck_assert_ptr_null(op_at(gpu, "head.sample", IR_OP_ARGMAX));
  const ir_op *parts = op_at(gpu, "head.sample.parts", IR_OP_ARGMAX_PARTS);
  const ir_op *best = op_at(gpu, "head.sample.best", IR_OP_ARGMAX_OF_PARTS);
  ck_assert(parts && best && parts < best);
  ck_assert(parts->asked_rows && best->asked_rows);
  const ir_tensor *vals = &gpu->tensors[parts->out[0]], *idx = &gpu->tensors[parts->out[1]];
  ck_assert_str_eq(vals->path, "head.sample.vals");
  ck_assert_str_eq(idx->path, "head.sample.idx");
  ck_assert_int_eq(vals->dtype, PLAN_F32);
  ck_assert_int_eq(idx->dtype, PLAN_I32);
  ck_assert_int_eq(vals->dim[0], gpu->tokens);
  ck_assert_int_eq(vals->dim[1], 32);
  ck_assert_int_eq(best->in[0], parts->out[0]);
  ck_assert_int_eq(best->in[1], parts->out[1]);
  ck_assert_int_eq(best->in[2], parts->in[0]);
  ck_assert_str_eq(gpu->tensors[best->out[0]].path, "next_ids");
  ir_prog *mini = build("models/ds4-flash-mini.yaml", "schedules/ds4-flash-h200.yaml");
  ir_prog *cpu = build("models/ds4-flash-slice-bf16.yaml", "schedules/ds4-flash-cpu.yaml");
  ck_assert_ptr_nonnull(op_at(mini, "head.sample", IR_OP_ARGMAX));
  ck_assert_ptr_nonnull(op_at(cpu, "head.sample", IR_OP_ARGMAX));
  ck_assert_int_eq(count_kind(cpu, IR_OP_ARGMAX_PARTS), 0);
  ds4c_prog_free(gpu);
  ds4c_prog_free(mini);
  ds4c_prog_free(cpu);
}
END_TEST

/* On a GPU a CSA layer's q_a and kv (a matmul_pair) and the indexer's
 * weights, three matmuls of h on main, are one matmul_triple in the
 * pair's place (lower.c); the cpu keeps the three. */
START_TEST(csa_projections_in_one_launch) {
  ir_prog *gpu = build("models/ds4-flash-slice-bf16.yaml", "schedules/ds4-flash-h200.yaml");
  ir_prog *cpu = build("models/ds4-flash-slice-bf16.yaml", "schedules/ds4-flash-cpu.yaml");
  const ir_op *tri = op_at(gpu, "layers.2.attn.q_a+kv+weights", IR_OP_MATMUL_TRIPLE);
  ck_assert_ptr_nonnull(tri);
  static const char *const in[] = {"layers.2.h", "layers.2.wq_a", "layers.2.wkv", "layers.2.idx_wproj"};
  static const char *const out[] = {"layers.2.qa", "layers.2.kv", "layers.2.iw"};
  ck_assert_int_eq(tri->nin, 4);
  ck_assert_int_eq(tri->nout, 3);
  for (int i = 0; i < 4; i++) ck_assert_str_eq(gpu->tensors[tri->in[i]].path, in[i]);
  for (int i = 0; i < 3; i++) ck_assert_str_eq(gpu->tensors[tri->out[i]].path, out[i]);
  ck_assert_str_eq(gpu->streams[tri->stream].name, "main");
  ck_assert_ptr_null(op_at(gpu, "layers.2.attn.csa.indexer.weights", IR_OP_MATMUL));
  ck_assert_ptr_nonnull(op_at(cpu, "layers.2.attn.csa.indexer.weights", IR_OP_MATMUL));
  ck_assert_int_eq(count_kind(cpu, IR_OP_MATMUL_TRIPLE), 0);
  ds4c_prog_free(gpu);
  ds4c_prog_free(cpu);
}
END_TEST

/* On a GPU each hc_pre is two launches, hc_sums and the mix, and the mix
 * and the rmsnorm that reads its x are one hc_pre_norm in the mix's place
 * and on its stream (lower.c): the sums its first input, the norm's weight
 * its fifth, the norm's output its first output; the x between them is
 * read by no op. The cpu schedule keeps the hc_pre and the norm. */
START_TEST(hc_pre_norm_fused_on_gpu) {
  ir_prog *gpu = build("models/ds4-flash-mini.yaml", "schedules/ds4-flash-h200.yaml");
  ir_prog *cpu = build("models/ds4-flash-mini.yaml", "schedules/ds4-flash-cpu.yaml");
  int fused = 0, pres = 0;
  for (int i = 0; i < gpu->nops; i++) {
    const ir_op *op = &gpu->ops[i];
    ck_assert_int_ne(op->kind, IR_OP_HC_PRE);
    ck_assert_int_ne(op->kind, IR_OP_HC_PRE_SUMS);
    if (op->kind != IR_OP_HC_PRE_NORM) continue;
    fused++;
    const char *tail = strstr(op->path, ".hc_pre.mix+norm");
    ck_assert_msg(tail && !tail[strlen(".hc_pre.mix+norm")], "%s", op->path);
    ck_assert_int_eq(op->nin, 5);
    ck_assert_int_eq(op->nout, 3);
    ck_assert_msg(strstr(gpu->tensors[op->in[0]].path, ".hc_pre.sums") != NULL, "%s", gpu->tensors[op->in[0]].path);
    ck_assert_msg(strstr(gpu->tensors[op->in[4]].path, "_norm") != NULL, "%s", gpu->tensors[op->in[4]].path);
    ck_assert_int_eq(gpu->ops[i - 1].kind, IR_OP_HC_SUMS);
    ck_assert_str_eq(gpu->streams[op->stream].name, "main");
    ck_assert(op->fattr[3] > 0.0);
  }
  for (int i = 0; i < cpu->nops; i++) {
    ck_assert_int_ne(cpu->ops[i].kind, IR_OP_HC_PRE_NORM);
    if (cpu->ops[i].kind != IR_OP_HC_PRE) continue;
    pres++;
    int x = cpu->ops[i].out[0];
    for (int k = 0; k < gpu->nops; k++)
      for (int j = 0; j < gpu->ops[k].nin; j++)
        ck_assert_msg(strcmp(gpu->tensors[gpu->ops[k].in[j]].path, cpu->tensors[x].path) != 0,
                      "%s reads %s on the GPU", gpu->ops[k].path, cpu->tensors[x].path);
  }
  ck_assert_int_gt(pres, 0);
  ck_assert_int_eq(fused, pres);
  ds4c_prog_free(gpu);
  ds4c_prog_free(cpu);
}
END_TEST

/* Where x is wider than one hc_pre_sums tile (256 columns: ds4-flash-slice's
 * 4096) the mix keeps its blocks a slot and the norm its own launch: every
 * hc_pre_sums is followed on its stream by the rmsnorm of its x. */
START_TEST(hc_pre_norm_not_fused_when_wide) {
  ir_prog *gpu = build("models/ds4-flash-slice-bf16.yaml", "schedules/ds4-flash-h200.yaml");
  int mixes = 0;
  for (int i = 0; i < gpu->nops; i++) {
    const ir_op *op = &gpu->ops[i];
    ck_assert_int_ne(op->kind, IR_OP_HC_PRE_NORM);
    if (op->kind != IR_OP_HC_PRE_SUMS) continue;
    mixes++;
    int norm = -1;
    for (int k = i + 1; k < gpu->nops && norm < 0; k++)
      if (gpu->ops[k].kind == IR_OP_RMSNORM && gpu->ops[k].in[0] == op->out[0]) norm = k;
    ck_assert_msg(norm >= 0, "%s: no rmsnorm reads its x", op->path);
    ck_assert_int_eq(gpu->ops[norm].stream, op->stream);
  }
  ck_assert_int_gt(mixes, 0);
  ds4c_prog_free(gpu);
}
END_TEST

/* Whether an alias of op ends in suffix. */
static int has_alias(const ir_op *op, const char *suffix) {
  for (int a = 0; a < IR_MAXALIAS && op->alias[a]; a++) {
    size_t n = strlen(op->alias[a]), m = strlen(suffix);
    if (n >= m && strcmp(op->alias[a] + n - m, suffix) == 0) return 1;
  }
  return 0;
}

/* On a GPU each attention's kv_norm and q_head_norm fold in the rope that
 * reads their output (lower.c): rmsnorm_rope and rmsnorm_groups_rope, in
 * the norm's place, named <norm>+<rope>, writing the rope's output, rope's
 * attrs in rope's slots and the norm's eps after them; kv's then folds in
 * the window write of its output too (rmsnorm_rope_window, writing the
 * ring), and each attention core the rope of its output
 * (sink_attention_rope: rope's attrs, then the core's window, ratio,
 * select and scale) and then q's norm and rope (q_norm 1, q_eps the
 * norm's eps, reading the norm's input); the indexer's q rope stays. The
 * cpu schedule keeps every norm, rope, window write and core. */
START_TEST(norm_rope_fused_on_gpu) {
  ir_prog *gpu = build("models/ds4-flash-mini.yaml", "schedules/ds4-flash-h200.yaml");
  ir_prog *cpu = build("models/ds4-flash-mini.yaml", "schedules/ds4-flash-cpu.yaml");
  int kv = 0, q = 0, cores = 0, ropes = 0, cpu_ropes = 0, cpu_kv = 0, cpu_cores = 0;
  for (int i = 0; i < gpu->nops; i++) {
    const ir_op *op = &gpu->ops[i];
    ropes += op->kind == IR_OP_ROPE;
    ck_assert_int_ne(op->kind, IR_OP_WINDOW_WRITE);
    ck_assert_int_ne(op->kind, IR_OP_SINK_ATTENTION);
    ck_assert_int_ne(op->kind, IR_OP_RMSNORM_ROPE);
    ck_assert_int_ne(op->kind, IR_OP_RMSNORM_GROUPS_ROPE);
    if (op->kind == IR_OP_SINK_ATTENTION_ROPE) {
      cores++;
      q += op->iattr[13];
      const char *tail = strstr(op->path, ".attn.q_head_norm+q_rope+core+o_rope");
      ck_assert_msg(tail && !tail[strlen(".attn.q_head_norm+q_rope+core+o_rope")], "%s", op->path);
      ck_assert_msg(strstr(gpu->tensors[op->out[0]].path, ".od") != NULL, "%s", gpu->tensors[op->out[0]].path);
      const char *qin = gpu->tensors[op->in[0]].path;
      ck_assert_msg(strlen(qin) > 2 && strcmp(qin + strlen(qin) - 2, ".q") == 0, "%s", qin);
      ck_assert_int_eq(op->iattr[3], 1); /* the output's rope is the inverse one */
      ck_assert_int_gt(op->iattr[9], 0); /* window */
      ck_assert(op->fattr[12] > 0.0);    /* scale */
      ck_assert(op->fattr[14] > 0.0);    /* q's eps */
      ck_assert_str_eq(gpu->streams[op->stream].name, "main");
      continue;
    }
    if (op->kind != IR_OP_RMSNORM_ROPE_WINDOW) continue;
    kv++;
    ck_assert_msg(strstr(op->path, "_rope+kv_write") != NULL, "%s", op->path);
    ck_assert_msg(strstr(gpu->tensors[op->out[0]].path, ".ring") != NULL, "%s", gpu->tensors[op->out[0]].path);
    ck_assert_int_gt(op->iattr[1], 0);
    ck_assert(op->fattr[9] > 0.0);
    ck_assert_str_eq(gpu->streams[op->stream].name, "main");
  }
  for (int i = 0; i < cpu->nops; i++) {
    ck_assert_int_ne(cpu->ops[i].kind, IR_OP_RMSNORM_ROPE);
    ck_assert_int_ne(cpu->ops[i].kind, IR_OP_RMSNORM_GROUPS_ROPE);
    ck_assert_int_ne(cpu->ops[i].kind, IR_OP_RMSNORM_ROPE_WINDOW);
    ck_assert_int_ne(cpu->ops[i].kind, IR_OP_SINK_ATTENTION_ROPE);
    cpu_ropes += cpu->ops[i].kind == IR_OP_ROPE;
    cpu_kv += strstr(cpu->ops[i].path, ".attn.kv_norm") != NULL;
    cpu_cores += cpu->ops[i].kind == IR_OP_SINK_ATTENTION;
  }
  ck_assert_int_gt(cpu_kv, 0);
  ck_assert_int_eq(kv, cpu_kv);
  ck_assert_int_eq(q, cpu_kv);
  ck_assert_int_eq(cores, cpu_kv);
  ck_assert_int_eq(cpu_cores, cpu_kv);
  ck_assert_int_eq(ropes, cpu_ropes - kv - q - cores);
  /* decode-early names the CSA layers' ropes, kv_write and core in
   * early_resolve: every fusion happens all the same, and the fused
   * launch answers to the names of the ops it folded that a hint uses
   * (its aliases): kv's norm to its rope and write, the core to itself,
   * its q's rope and its output's rope */
  ir_prog *early = build("models/ds4-flash-mini.yaml", "schedules/ds4-flash-decode-early.yaml");
  int kv_early = 0, cores_early = 0, core_aliases = 0, kv_aliases = 0;
  for (int i = 0; i < early->nops; i++) {
    const ir_op *op = &early->ops[i];
    ck_assert_int_ne(op->kind, IR_OP_SINK_ATTENTION);
    ck_assert_int_ne(op->kind, IR_OP_RMSNORM_GROUPS_ROPE);
    ck_assert_int_ne(op->kind, IR_OP_RMSNORM_ROPE);
    int n = 0;
    while (n < IR_MAXALIAS && op->alias[n]) {
      ck_assert_msg(strstr(op->alias[n], ".attn.csa.") != NULL, "%s: alias %s", op->path, op->alias[n]);
      n++;
    }
    if (op->kind == IR_OP_SINK_ATTENTION_ROPE) {
      cores_early++;
      ck_assert_int_eq(op->iattr[13], 1);
      /* a CSA layer's: the core, its q's rope and its output's rope */
      int csa = has_alias(op, ".csa.core") + has_alias(op, ".csa.q_rope") + has_alias(op, ".csa.o_rope");
      ck_assert_msg(csa == 0 || csa == 3, "%s: %d of its three parts' names", op->path, csa);
      core_aliases += csa == 3;
      continue;
    }
    if (op->kind == IR_OP_RMSNORM_ROPE_WINDOW) {
      kv_early++;
      int csa = has_alias(op, ".csa.kv_rope") + has_alias(op, ".csa.kv_write"); /* a CSA layer's */
      ck_assert_msg(csa == 0 || csa == 2, "%s: %d of its two parts' names", op->path, csa);
      kv_aliases += csa == 2;
      continue;
    }
    ck_assert_msg(n == 0, "%s has an alias", op->path);
  }
  ck_assert_int_eq(kv_early, kv);
  ck_assert_int_eq(cores_early, cores);
  ck_assert_int_gt(core_aliases, 0);
  ck_assert_int_eq(core_aliases, kv_aliases);
  ds4c_prog_free(early);
  ds4c_prog_free(gpu);
  ds4c_prog_free(cpu);
}
END_TEST

/* ds4c compile of DIR/big.yaml under a one-H200 schedule written to
 * DIR/h200.sched.yaml with MEMORY appended to its device; asserts the exit
 * status and returns what it wrote to stderr. */
static char *compile_on_h200(const char *dir, const char *memory, int want_rc) {
  char text[512], path[600], cmd[2048], *out = NULL;
  snprintf(text, sizeof text,
           "schedule: one-h200\nmodel: case\ndevices:\n"
           "  - {name: gpu0, backend: cuda, arch: sm_90, ordinal: 0, bandwidth: 4.8e12, flops: 1.0e15, "
           "launch: 4.0e-6%s}\n"
           "streams:\n  - {name: main, device: gpu0}\nowners:\n  - \"* -> gpu0.main\"\n"
           "step: {prompt: 2, decode: 1}\n",
           memory);
  snprintf(path, sizeof path, "%s/h200.sched.yaml", dir);
  tu_write_text(path, text);
  snprintf(cmd, sizeof cmd, "cd %s && %s/ds4c compile big.yaml h200.sched.yaml -o b --no-cache 2>&1 >/dev/null",
           dir, tu_build_dir());
  ck_assert_int_eq(tu_capture(cmd, &out, NULL), want_rc);
  return out;
}

/* ds4c compile warns, naming the schedule, when a device owns no op
 * (ds4-flash-mini under ds4-flash-hotcold with every expert hot), and
 * refuses a GPU arena larger than its memory: the
 * schedule's `memory`, else the largest board of its arch (ok.yaml with
 * two 128 GiB weights on one sm_90 device), naming the device, the need
 * and the limit, and leaving no bundle. */
START_TEST(ds4c_warns_idle_device_and_refuses_oversized_arena) {
  char tmpl[] = "/tmp/ds4-warn-XXXXXX", cmd[2048], path[600], want[900], *out = NULL;
  tu_tmpdir_make(tmpl);
  char *hotcold = tu_slurp("schedules/ds4-flash-hotcold.yaml", NULL);
  char *allhot = tu_replace_once(hotcold, "experts[0:(experts+7)/8] -> hot.main", "experts[0:experts] -> hot.main");
  snprintf(path, sizeof path, "%s/allhot.yaml", tmpl);
  tu_write_text(path, allhot);
  free(hotcold);
  free(allhot);
  snprintf(cmd, sizeof cmd, "%s/ds4c compile models/ds4-flash-mini.yaml %s -o %s/hc --no-cache 2>&1 >/dev/null",
           tu_build_dir(), path, tmpl);
  ck_assert_int_eq(tu_capture(cmd, &out, NULL), 0);
  snprintf(want, sizeof want, "ds4c: warning: %s: device 'cold' owns no op (an arena of 0 bytes, no launch)\n", path);
  ck_assert_str_eq(out, want);
  free(out);
  size_t n;
  char *model = tu_slurp("tests/cases/compile/ok.yaml", &n);
  char *big = tu_replace_once(model, "hidden: 8, vocab: 16", "hidden: 524288, vocab: 65536");
  snprintf(path, sizeof path, "%s/big.yaml", tmpl);
  tu_write_text(path, big);
  out = compile_on_h200(tmpl, "", 1);
  ck_assert_str_eq(out, "h200.sched.yaml:4:5: error: device 'gpu0' needs an arena of 274882625664 bytes (256.0 GiB), "
                        "more than any sm_90 GPU has (154618822656: NVIDIA H200, 144 GiB of HBM3e), by 112.0 GiB; "
                        "`memory` in the schedule states another board's\n"
                        "    - {name: gpu0, backend: cuda, arch: sm_90, ordinal: 0, bandwidth: 4.8e12, flops: 1.0e15, "
                        "launch: 4.0e-6}\n"
                        "      ^\n");
  free(out);
  snprintf(path, sizeof path, "%s/b", tmpl);
  ck_assert_int_ne(access(path, F_OK), 0);
  out = compile_on_h200(tmpl, ", memory: 100000000000", 1);
  ck_assert_str_eq(out, "h200.sched.yaml:4:5: error: device 'gpu0' needs an arena of 274882625664 bytes but has "
                        "100000000000\n"
                        "    - {name: gpu0, backend: cuda, arch: sm_90, ordinal: 0, bandwidth: 4.8e12, flops: 1.0e15, "
                        "launch: 4.0e-6, memory: 100000000000}\n"
                        "      ^\n");
  free(out);
  free(model);
  free(big);
  tu_tmpdir_remove(tmpl);
}
END_TEST

int main(void) {
  Suite *s = suite_create("compile");
  TCase *tc = tcase_create("tiny-moe");
  tcase_add_checked_fixture(tc, setup, NULL);
  tcase_add_test(tc, compiling_twice_gives_identical_bundles);
  tcase_add_test(tc, dump_after_every_pass);
  tcase_add_loop_test(tc, every_wait_is_necessary, 0, 2);
  tcase_add_test(tc, overlapping_live_tensors_are_refused);
  tcase_add_test(tc, hotcold_memory_plan);
  tcase_add_test(tc, hotcold_cold_input_goes_first);
  tcase_add_test(tc, early_resolve_changes_order_only);
  tcase_add_test(tc, state_hazards);
  tcase_add_test(tc, disjoint_rows_do_not_conflict);
  tcase_add_test(tc, shared_layer_name_numbers_globally);
  tcase_add_test(tc, block_made_of_parts);
  tcase_add_test(tc, kernel_cache_hits_and_repairs);
  tcase_add_test(tc, ds4c_finds_its_cache);
  tcase_add_test(tc, ds4c_reports_layer_launches);
  tcase_add_test(tc, ds4c_warns_idle_device_and_refuses_oversized_arena);
  tcase_add_test(tc, cpu_retargets_every_device);
  tcase_add_test(tc, combine_add_fused_on_gpu);
  tcase_add_test(tc, output_projection_fused_with_hc_post);
  tcase_add_test(tc, argmax_in_parts_on_gpu);
  tcase_add_test(tc, csa_projections_in_one_launch);
  tcase_add_test(tc, hc_pre_norm_fused_on_gpu);
  tcase_add_test(tc, hc_pre_norm_not_fused_when_wide);
  tcase_add_test(tc, norm_rope_fused_on_gpu);
  tcase_add_test(tc, decode_plan_differs_in_shapes_and_grids_only);
  tcase_add_test(tc, step_shapes_from_the_schedule);
  suite_add_tcase(s, tc);
  return tu_run_suite(s);
}
