/* test_review.c - ds4c diff on real plans: a plan against itself, its text
 * or a recompile is identical; an early_resolve or priority hint changes
 * order only; an owner change lists the copies, edges and placement it
 * brings; a param change lists kernels; a moved wait is an event; a damaged
 * input is an error naming the file and line. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pipeline.h"
#include "plan_diff.h"
#include "test_util.h"

static char tmpdir[] = "/tmp/ds4-review-XXXXXX";
/* One kernel cache for every test (each runs in a child process): the
 * same kernels are built once. */
static char cachedir[] = "/tmp/ds4-review-cache-XXXXXX";

/* In the source tree (the descriptions' paths are relative), with a fresh
 * scratch folder. */
static void make_tmpdir(void) {
  tu_chdir_source();
  tu_tmpdir_make(tmpdir);
}

/* The 1-based line of the first `what` in text. */
static int line_of(const char *text, const char *what) {
  const char *at = strstr(text, what);
  ck_assert_msg(at != NULL, "'%s' not found", what);
  int no = 1;
  for (const char *c = text; c < at; c++) no += *c == '\n';
  return no;
}

/* tmpdir/name, in one of 8 buffers used in turn */
static const char *tmp_path(const char *name) {
  static char paths[8][700];
  static int next;
  char *p = paths[next++ % 8];
  snprintf(p, sizeof paths[0], "%s/%s", tmpdir, name);
  return p;
}

/* Compiles model + schedule into tmpdir/name through a kernel cache of the
 * test's own; returns the bundle's path. */
static const char *compile(const char *model, const char *sched, const char *name) {
  char out[700];
  snprintf(out, sizeof out, "%s/%s", tmpdir, name);
  ds4c_options o = {.model_path = model, .sched_path = sched, .out_dir = out, .cache_dir = cachedir};
  dsl_diag d = {0};
  ck_assert_msg(ds4c_compile(&o, &d) == 0, "%s + %s: %s", model, sched, d.msg);
  return tmp_path(name);
}

/* A schedule file's text plus `extra`, or with `from` replaced by `to`,
 * written to tmpdir/name. */
static const char *variant(const char *sched, const char *from, const char *to, const char *extra, const char *name) {
  char *text = tu_slurp(sched, NULL);
  char *v = from ? tu_replace_first(text, from, to) : strdup(text);
  const char *path = tmp_path(name);
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fputs(v, f);
  if (extra) fputs(extra, f);
  ck_assert_int_eq(fclose(f), 0);
  free(text);
  free(v);
  return path;
}

typedef struct diff_result {
  int rc;
  char *out, *err;
} diff_result;

static diff_result diff(const char *a, const char *b) {
  diff_result r;
  size_t no, ne;
  FILE *out = open_memstream(&r.out, &no), *err = open_memstream(&r.err, &ne);
  ck_assert_ptr_nonnull(out);
  ck_assert_ptr_nonnull(err);
  r.rc = plan_diff(a, b, out, err);
  ck_assert_int_eq(fclose(out), 0);
  ck_assert_int_eq(fclose(err), 0);
  return r;
}

static void result_free(diff_result *r) {
  free(r->out);
  free(r->err);
}

/* The report's last line, without its newline. */
static const char *last_line(const char *out) {
  static char line[1024];
  size_t n = strlen(out);
  ck_assert_msg(n && out[n - 1] == '\n', "the report does not end in a line: %s", out);
  const char *b = out + n - 1;
  while (b > out && b[-1] != '\n') b--;
  snprintf(line, sizeof line, "%.*s", (int)(out + n - 1 - b), b);
  return line;
}

static void assert_has(const diff_result *r, const char *what) {
  ck_assert_msg(strstr(r->out, what) != NULL, "'%s' missing from the report:\n%s", what, r->out);
}

static void assert_lacks(const diff_result *r, const char *what) {
  ck_assert_msg(strstr(r->out, what) == NULL, "'%s' in the report:\n%s", what, r->out);
}

static void assert_order_only(const diff_result *r) {
  ck_assert_msg(r->rc == PLAN_DIFF_ORDER, "exit %d, not 1:\n%s%s", r->rc, r->out, r->err);
  ck_assert_str_eq(last_line(r->out), "order only: no edge, kernel or memory changes");
  ck_assert_str_eq(r->err, "");
  for (const char *h = "kernels (math):\0dependency edges:\0copies:\0placement:\0memory:\0params:\0"; *h;
       h += strlen(h) + 1)
    assert_lacks(r, h);
}

static void assert_identical(const char *a, const char *b) {
  diff_result r = diff(a, b);
  ck_assert_msg(r.rc == PLAN_DIFF_IDENTICAL, "%s vs %s: exit %d:\n%s%s", a, b, r.rc, r.out, r.err);
  ck_assert_str_eq(last_line(r.out), "identical");
  ck_assert_str_eq(r.err, "");
  result_free(&r);
}

/* A GPU schedule of ds4-flash-mini moved onto cpu devices, streams and
 * owners unchanged: the same plan shape without a GPU toolchain. */
static const char *on_cpu(const char *sched, const char *name) {
  return variant(sched, "backend: cuda, arch: sm_90, ordinal: 0,", "backend: cpu, arch: host, ordinal: 0, threads: 1,",
                 NULL, name);
}

START_TEST(same_plan_is_identical) {
  make_tmpdir();
  const char *a = compile("models/tiny-moe.yaml", "schedules/tiny-hotcold.yaml", "a");
  char a_dir[700], a_bin[700], a_txt[700];
  snprintf(a_dir, sizeof a_dir, "%s", a);
  snprintf(a_bin, sizeof a_bin, "%s/plan.ds4p", a);
  snprintf(a_txt, sizeof a_txt, "%s/plan.txt", a);
  const char *b = compile("models/tiny-moe.yaml", "schedules/tiny-hotcold.yaml", "b");
  assert_identical(a_dir, b);
  /* a bundle, its binary plan and its text: three ways to one plan */
  assert_identical(a_dir, a_txt);
  assert_identical(a_txt, a_bin);
  assert_identical(a_bin, a_dir);

  /* the text's version is a note, not a change */
  char *text = tu_slurp(a_txt, NULL);
  const char *v = strstr(text, "# ds4 plan ") + strlen("# ds4 plan ");
  char old[64];
  snprintf(old, sizeof old, "# ds4 plan %.*s:", (int)(strchr(v, ':') - v), v);
  char *newer = tu_replace_first(text, old, "# ds4 plan 99.7:");
  tu_write_text(tmp_path("newer.txt"), newer);
  diff_result r = diff(a_dir, tmp_path("newer.txt"));
  ck_assert_int_eq(r.rc, PLAN_DIFF_IDENTICAL);
  assert_has(&r, "note: plan text version ");
  assert_has(&r, " -> 99.7 ");
  ck_assert_str_eq(last_line(r.out), "identical");
  result_free(&r);
  free(newer);
  free(text);
  tu_tmpdir_remove(tmpdir);
}
END_TEST

/* test_compile's early_resolve_changes_order_only, through the diff. */
START_TEST(tiny_early_resolve_is_order_only) {
  make_tmpdir();
  const char *a = compile("models/tiny-moe.yaml", "schedules/tiny-hotcold.yaml", "a");
  const char *sched =
      variant("schedules/tiny-hotcold.yaml", NULL, NULL, "early_resolve:\n  - \"layers.*.ffn.gate\"\n", "early.yaml");
  diff_result r = diff(a, compile("models/tiny-moe.yaml", sched, "b"));
  assert_order_only(&r);
  assert_has(&r, "\nper-stream order: 1\n  hot.main: 2 of ");
  assert_has(&r, "    moved layers.0.ffn.route: after layers.0.ffn.shared -> after layers.0.ffn.gate\n");
  assert_has(&r, "    moved layers.1.ffn.route: after layers.1.ffn.shared -> after layers.1.ffn.gate\n");
  assert_lacks(&r, "cold.main:");
  result_free(&r);
  tu_tmpdir_remove(tmpdir);
}
END_TEST

/* schedules/ds4-flash-decode-early.yaml is ds4-flash-h200 plus early
 * resolve hints (on cpu devices here). */
START_TEST(mini_decode_early_is_order_only) {
  make_tmpdir();
  const char *h200 = on_cpu("schedules/ds4-flash-h200.yaml", "h200.yaml");
  const char *a = compile("models/ds4-flash-mini.yaml", h200, "h200");
  const char *early = on_cpu("schedules/ds4-flash-decode-early.yaml", "early.yaml");
  const char *b = compile("models/ds4-flash-mini.yaml", early, "early");
  diff_result r = diff(a, b);
  assert_order_only(&r);
  assert_has(&r, "no edge, kernel or memory changes");
  assert_has(&r, "note: schedule ds4-flash-h200 -> ds4-flash-decode-early\n");
  assert_has(&r, "\n  gpu0.main: ");
  assert_has(&r, "    moved layers.2.attn.csa.kv_write: ");
  result_free(&r);
  tu_tmpdir_remove(tmpdir);
}
END_TEST

/* From one device to the hot/cold pair: the copies to and from the cold
 * device, their edges, the new streams and devices. */
START_TEST(owner_change_lists_copies_and_edges) {
  make_tmpdir();
  const char *one = compile("models/tiny-moe.yaml", "schedules/tiny-1dev.yaml", "one");
  const char *hc = compile("models/tiny-moe.yaml", "schedules/tiny-hotcold.yaml", "hc");
  diff_result r = diff(one, hc);
  ck_assert_msg(r.rc == PLAN_DIFF_CHANGED, "exit %d:\n%s%s", r.rc, r.out, r.err);
  assert_has(&r, "\ncopies: 6\n");
  assert_has(&r, "\n  + copy copy.layers.0.h2@cold layers.0.h2 -> layers.0.h2@cold on cold.copy\n");
  assert_has(&r, "\n  + copy copy.layers.1.sel@cold layers.1.sel -> layers.1.sel@cold on cold.copy\n");
  assert_has(&r, "\n  + copy copy.layers.0.slots.parts[4:8]@cold ");
  assert_has(&r, "\n  + layers.0.ffn.norm -> copy.layers.0.h2@cold raw layers.0.h2\n");
  assert_has(&r, "\n  + copy.layers.0.h2@cold -> layers.0.ffn.experts[6:8] raw layers.0.h2@cold\n");
  assert_has(&r, "\n  - layers.0.ffn.norm -> layers.0.ffn.experts raw layers.0.h2\n");
  assert_has(&r, "\n  - launch layers.0.ffn.experts ds4k_moe_experts_");
  assert_has(&r, "\n  + launch layers.0.ffn.experts[6:8] ds4k_moe_experts_");
  assert_has(&r, "\n  + stream cold.copy\n");
  /* tiny-1dev's cpu0 and tiny-hotcold's hot are both the cpu's ordinal 0:
   * one device under two names, so its streams and ops stay where they
   * were, and only its thread count changed */
  assert_has(&r, "\nnote: device cpu0 -> hot (the same backend, arch and ordinal; compared as one device)\n");
  assert_has(&r, "\n  ~ device cpu0: threads 2 -> 1\n");
  assert_lacks(&r, "stream cpu0.main");
  assert_lacks(&r, "hot.main");
  ck_assert_msg(strncmp(last_line(r.out), "changed: ", 9) == 0, "%s", last_line(r.out));
  ck_assert_ptr_nonnull(strstr(last_line(r.out), " 6 copies, "));
  result_free(&r);

  /* experts 4-5 move to the cold device too */
  const char *sched = variant("schedules/tiny-hotcold.yaml", "experts[6:8] -> cold.main", "experts[4:8] -> cold.main",
                              NULL, "wider.yaml");
  r = diff(hc, compile("models/tiny-moe.yaml", sched, "wider"));
  ck_assert_msg(r.rc == PLAN_DIFF_CHANGED, "exit %d:\n%s%s", r.rc, r.out, r.err);
  assert_has(&r, "\n  + copy.layers.0.h2@cold -> layers.0.ffn.experts[4:8] raw layers.0.h2@cold\n");
  assert_has(&r, "\n  - copy.layers.0.h2@cold -> layers.0.ffn.experts[6:8] raw layers.0.h2@cold\n");
  assert_has(&r, "\n  + launch layers.0.ffn.experts[4:8] ds4k_moe_experts_");
  assert_has(&r, "\n  - tensor layers.0.w1[6:8] f32 [2, 32, 64] weight cold+");
  assert_has(&r, "\n  + tensor layers.0.w1[4:8] f32 [4, 32, 64] weight cold+");
  assert_has(&r, "\n  ~ arena cold: ");
  assert_has(&r, "\n  ~ cold.main: wait cold.copy after copy.layers.0.sel@cold, before layers.0.ffn.experts[6:8] -> "
                 "before layers.0.ffn.experts[4:8]\n");
  result_free(&r);
  tu_tmpdir_remove(tmpdir);
}
END_TEST

/* A model param changes the shared expert's kernel and its weights. */
START_TEST(param_change_lists_kernels) {
  make_tmpdir();
  const char *a = compile("models/tiny-moe.yaml", "schedules/tiny-hotcold.yaml", "a");
  const char *model = variant("models/tiny-moe.yaml", "shared_ffn: 32", "shared_ffn: 48", NULL, "model.yaml");
  diff_result r = diff(a, compile(model, "schedules/tiny-hotcold.yaml", "b"));
  ck_assert_msg(r.rc == PLAN_DIFF_CHANGED, "exit %d:\n%s%s", r.rc, r.out, r.err);
  assert_has(&r, "\nkernels (math): 4\n  ~ op layers.0.ffn.shared: kernel ds4k_swiglu_ffn_");
  assert_has(&r, "\n  ~ op layers.1.ffn.shared: kernel ds4k_swiglu_ffn_");
  assert_has(&r, "\n  + kernel ds4k_swiglu_ffn_");
  assert_has(&r, "\n  ~ tensor layers.0.shared_w1: shape [32, 64] -> [48, 64]\n");
  assert_has(&r, "\nparams: 1\n  ~ shared_ffn = 32 -> 48\n");
  assert_has(&r, "\n  ~ arena hot: ");
  ck_assert_msg(strncmp(last_line(r.out), "changed: 4 kernels, 0 edges, 0 copies, 6 placement, ", 52) == 0, "%s",
                last_line(r.out));
  result_free(&r);
  tu_tmpdir_remove(tmpdir);
}
END_TEST

/* Edits of a text: a wait moved is an event (order only); an arena
 * grown is memory, with its delta. */
/* A device renamed in the schedule (tiny-hotcold's cold device as 'apu':
 * its streams, owners and placements follow) is matched by backend, arch
 * and ordinal: one note, and the plans are identical. */
START_TEST(renamed_device_is_one_note) {
  make_tmpdir();
  const char *a = compile("models/tiny-moe.yaml", "schedules/tiny-hotcold.yaml", "a");
  char *text = tu_slurp("schedules/tiny-hotcold.yaml", NULL);
  char *renamed = tu_replace_all(text, "cold", "apu");
  tu_write_text(tmp_path("apu.yaml"), renamed);
  const char *b = compile("models/tiny-moe.yaml", tmp_path("apu.yaml"), "b");
  diff_result r = diff(a, b);
  ck_assert_msg(r.rc == PLAN_DIFF_IDENTICAL, "exit %d:\n%s%s", r.rc, r.out, r.err);
  assert_has(&r, "\nnote: device cold -> apu (the same backend, arch and ordinal; compared as one device)\n");
  ck_assert_str_eq(last_line(r.out), "identical");
  result_free(&r);
  free(text);
  free(renamed);
  tu_tmpdir_remove(tmpdir);
}
END_TEST

START_TEST(edited_text_events_and_memory) {
  make_tmpdir();
  const char *a = compile("models/tiny-moe.yaml", "schedules/tiny-hotcold.yaml", "a");
  char txt[700];
  snprintf(txt, sizeof txt, "%s/plan.txt", a);
  char *text = tu_slurp(txt, NULL);

  char *moved = tu_replace_first(text,
                              "copy copy.layers.0.h2@cold layers.0.h2 -> layers.0.h2@cold\n"
                              "wait hot.main after layers.0.ffn.route\n",
                              "wait hot.main after layers.0.ffn.route\n"
                              "copy copy.layers.0.h2@cold layers.0.h2 -> layers.0.h2@cold\n");
  tu_write_text(tmp_path("moved.txt"), moved);
  diff_result r = diff(txt, tmp_path("moved.txt"));
  assert_order_only(&r);
  assert_has(&r, "\nevents: 1\n  ~ cold.copy: wait hot.main after layers.0.ffn.route, before copy.layers.0.sel@cold "
                 "-> before copy.layers.0.h2@cold\n");
  assert_lacks(&r, "per-stream order");
  result_free(&r);

  const char *dev = strstr(text, "\ncold backend ");
  ck_assert_ptr_nonnull(dev);
  unsigned long long arena;
  ck_assert_int_eq(sscanf(strstr(dev, " arena ") + 7, "%llu", &arena), 1);
  char from[64], to[64], want[128];
  snprintf(from, sizeof from, " arena %llu\n", arena);
  snprintf(to, sizeof to, " arena %llu\n", arena + 1024);
  char *grown = tu_replace_first(dev, from, to);
  char *whole = malloc(strlen(text) + 32);
  snprintf(whole, strlen(text) + 32, "%.*s%s", (int)(dev - text), text, grown);
  tu_write_text(tmp_path("grown.txt"), whole);
  r = diff(txt, tmp_path("grown.txt"));
  ck_assert_int_eq(r.rc, PLAN_DIFF_CHANGED);
  snprintf(want, sizeof want, "\nmemory: 1\n  ~ arena cold: %llu -> %llu (+1024)\n", arena, arena + 1024);
  assert_has(&r, want);
  ck_assert_str_eq(last_line(r.out), "changed: 0 kernels, 0 edges, 0 copies, 0 placement, 1 memory, 0 params");
  result_free(&r);
  free(grown);
  free(whole);
  free(moved);
  free(text);
  tu_tmpdir_remove(tmpdir);
}
END_TEST

/* A damaged input is exit 3 with FILE:LINE (a text) or the file and what
 * is wrong (a binary, a path), and nothing on the report's stream. */
static void assert_error(const char *good, const char *bad, const char *want) {
  diff_result r = diff(good, bad);
  ck_assert_msg(r.rc == PLAN_DIFF_ERROR, "%s: exit %d:\n%s", bad, r.rc, r.out);
  ck_assert_str_eq(r.out, "");
  ck_assert_msg(strstr(r.err, want) != NULL, "wanted '%s', got '%s'", want, r.err);
  ck_assert_int_eq(strchr(r.err, '\n') - r.err, (long)strlen(r.err) - 1); /* one line */
  result_free(&r);
}

static void assert_text_error(const char *good, const char *text, const char *name, int line, const char *msg) {
  const char *path = tmp_path(name);
  tu_write_text(path, text);
  char want[1200];
  snprintf(want, sizeof want, "%s:%d: error: %s", path, line, msg);
  assert_error(good, path, want);
}

START_TEST(damaged_inputs_name_file_and_line) {
  make_tmpdir();
  char a[700], good[800];
  snprintf(a, sizeof a, "%s", compile("models/tiny-moe.yaml", "schedules/tiny-1dev.yaml", "a"));
  snprintf(good, sizeof good, "%s/plan.txt", a);
  char *text = tu_slurp(good, NULL);

  char *t = tu_replace_first(text, "launch embed.lookup ds4k_embed_", "launch embed.lookup ds4k_nothing_");
  assert_text_error(good, t, "kernel.txt", line_of(t, "launch embed.lookup"),
                    "launch embed.lookup: kernel ds4k_nothing_");
  free(t);

  const char *cut = strstr(text, "launch layers.1.attn.k ");
  t = tu_replace_first(text, cut, strchr(cut, '\n') + 1); /* one launch fewer */
  assert_text_error(good, t, "summary.txt", line_of(t, "\n[summary]") + 2, "the summary says launches ");
  free(t);

  t = strdup(text);
  strstr(t, "\n[stream ")[1] = 0; /* truncated after [edges] and its blank line */
  int lines = 0;
  for (const char *c = t; *c; c++) lines += *c == '\n';
  assert_text_error(good, t, "short.txt", lines, "the text ends before [summary]");
  free(t);

  t = tu_replace_first(text, "embed.x f32 [4, 64] activation", "embed.x f32 [4, 64 activation");
  assert_text_error(good, t, "shape.txt", line_of(t, "embed.x f32"), "'[' without its ']'");
  free(t);

  t = tu_replace_first(text, "\nlayers.0.wq f32 [64, 64] weight cpu0+", "\nlayers.0.wq f32 [64, 64] weight gpu7+");
  assert_text_error(good, t, "device.txt", line_of(t, "layers.0.wq f32"), "tensor layers.0.wq: no such device");
  free(t);

  t = tu_replace_first(text, "\nhidden = 64\n", "\nhidden = 64\nhidden = 64\n");
  assert_text_error(good, t, "twice.txt", line_of(t, "hidden = 64\nhidden") + 1, "param hidden twice");
  free(t);

  t = tu_replace_first(text, "# ds4 plan ", "# a plan ");
  assert_text_error(good, t, "header.txt", 1, "expected '# ds4 plan VERSION");
  free(t);

  /* every truncation at a line's end is an error at a line, never a crash
   * or a plan */
  const char *cut_path = tmp_path("cut.txt");
  for (const char *nl = strchr(text, '\n'); nl && nl[1]; nl = strchr(nl + 1, '\n')) {
    tu_write_bytes(cut_path, text, (size_t)(nl + 1 - text));
    diff_result r = diff(good, cut_path);
    ck_assert_msg(r.rc == PLAN_DIFF_ERROR, "%zu bytes: exit %d", (size_t)(nl + 1 - text), r.rc);
    ck_assert_msg(strncmp(r.err, cut_path, strlen(cut_path)) == 0 && strstr(r.err, ": error: "), "%s", r.err);
    result_free(&r);
  }

  /* a binary plan with one byte changed */
  char bin[800];
  snprintf(bin, sizeof bin, "%s/plan.ds4p", a);
  size_t n;
  char *bytes = tu_slurp(bin, &n);
  bytes[n - 3] ^= 0x20;
  tu_write_bytes(tmp_path("bad.ds4p"), bytes, n);
  char want[800];
  snprintf(want, sizeof want, "ds4c: error: %s: checksum mismatch", tmp_path("bad.ds4p"));
  assert_error(good, tmp_path("bad.ds4p"), want);
  free(bytes);

  snprintf(want, sizeof want, "ds4c: error: %s: No such file or directory", tmp_path("none.txt"));
  assert_error(good, tmp_path("none.txt"), want);
  snprintf(want, sizeof want, "ds4c: error: %s/plan.ds4p: No such file or directory", tmpdir);
  assert_error(good, tmpdir, want); /* a folder, not a bundle */
  free(text);
  tu_tmpdir_remove(tmpdir);
}
END_TEST

/* ds4c diff ARGS, run from the source tree: the exit status, and stdout
 * and stderr together into *out. */
static int ds4c_diff(const char *args, char **out) {
  char cmd[2048];
  snprintf(cmd, sizeof cmd, "%s/ds4c diff %s", tu_build_dir(), args);
  int rc = tu_run(cmd, out);
  ck_assert_msg(rc >= 0, "%s: killed by a signal", cmd);
  return rc;
}

/* The committed texts of ds4-flash-slice: decode-early (early_resolve)
 * changes order only, on the compress stream alone (what it names on
 * main folds into launches that keep their places); so does 2gpu-cold-second (a priority hint) for the
 * bf16 slice, while for the release's dtypes the cost model already
 * queues GPU 0's hot experts first (the two plans are the same); the exit
 * status reaches the shell. */
START_TEST(committed_texts_through_the_cli) {
  tu_chdir_source();
  char *out;
  ck_assert_int_eq(
      ds4c_diff("out/ds4-flash-slice--ds4-flash-h200.plan.txt out/ds4-flash-slice--ds4-flash-decode-early.plan.txt",
                &out),
      1);
  ck_assert_str_eq(last_line(out), "order only: no edge, kernel or memory changes");
  ck_assert_ptr_null(strstr(out, "\n  gpu0.main: "));
  ck_assert_ptr_nonnull(strstr(out, "\n  gpu0.compress: 2 of "));
  free(out);
  ck_assert_int_eq(ds4c_diff("out/ds4-flash-slice-bf16--ds4-flash-2gpu.plan.txt "
                             "out/ds4-flash-slice-bf16--ds4-flash-2gpu-cold-second.plan.txt",
                             &out),
                   1);
  ck_assert_str_eq(last_line(out), "order only: no edge, kernel or memory changes");
  ck_assert_ptr_nonnull(
      strstr(out, "\n    moved layers.0.ffn.experts[0:128].up: after copy.layers.0.route_idx@gpu1 -> after "));
  free(out);
  ck_assert_int_eq(ds4c_diff("out/ds4-flash-slice--ds4-flash-2gpu.plan.txt "
                             "out/ds4-flash-slice--ds4-flash-2gpu-cold-second.plan.txt",
                             &out),
                   0);
  free(out);
  ck_assert_int_eq(ds4c_diff("out/tiny-moe--tiny-1dev.plan.txt out/tiny-moe--tiny-hotcold.plan.txt", &out), 2);
  ck_assert_ptr_nonnull(strstr(out, "\n  + copy copy.layers.0.h2@cold layers.0.h2 -> layers.0.h2@cold on cold.copy\n"));
  free(out);
  ck_assert_int_eq(ds4c_diff("out/tiny-moe--tiny-1dev.plan.txt out/tiny-moe--tiny-1dev.plan.txt", &out), 0);
  ck_assert_str_eq(last_line(out), "identical");
  free(out);
  ck_assert_int_eq(ds4c_diff("out/tiny-moe--tiny-1dev.plan.txt README.md", &out), 3);
  ck_assert_ptr_nonnull(strstr(out, "README.md:1: error: expected '# ds4 plan VERSION"));
  free(out);
  ck_assert_int_eq(ds4c_diff("out/tiny-moe--tiny-1dev.plan.txt", &out), 64);
  ck_assert_ptr_nonnull(
      strstr(out, "ds4c: error: diff needs two plans, A and B (ds4c --help lists the commands and options)\n"));
  free(out);
  ck_assert_int_eq(ds4c_diff("--json a b", &out), 64);
  free(out);
}
END_TEST

int main(void) {
  if (!mkdtemp(cachedir)) {
    perror(cachedir);
    return 1;
  }
  Suite *s = suite_create("review");
  TCase *tc = tcase_create("diff");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, same_plan_is_identical);
  tcase_add_test(tc, tiny_early_resolve_is_order_only);
  tcase_add_test(tc, mini_decode_early_is_order_only);
  tcase_add_test(tc, owner_change_lists_copies_and_edges);
  tcase_add_test(tc, param_change_lists_kernels);
  tcase_add_test(tc, renamed_device_is_one_note);
  tcase_add_test(tc, edited_text_events_and_memory);
  tcase_add_test(tc, damaged_inputs_name_file_and_line);
  tcase_add_test(tc, committed_texts_through_the_cli);
  suite_add_tcase(s, tc);
  int rc = tu_run_suite(s);
  if (tu_remove_tree(cachedir) != 0) return 1;
  return rc;
}
