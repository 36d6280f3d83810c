/* test_import.c - ds4c import: the release's config.json gives the shipped
 * description's plans exactly; the committed imports of the two small
 * configurations are what ds4c import writes today, compile, and match
 * the float64 reference, which takes every constant from the plan; keys
 * the blocks cannot honour are errors naming the key at its place, and a
 * failed import leaves nothing behind. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bundle_run.h"
#include "pipeline.h"
#include "plan.h"
#include "rt.h"
#include "test_util.h"

static char tmpdir[] = "/tmp/ds4-import-XXXXXX";

static void make_tmpdir(void) {
  tu_chdir_source();
  tu_tmpdir_make(tmpdir);
}

static void import_ok(const char *config, const char *out, const char *base, long long max_seq, long long tokens) {
  ds4c_import_options o = {.config_path = config, .out_path = out, .base_path = base, .max_seq = max_seq,
                           .tokens = tokens};
  dsl_diag d = {0};
  ck_assert_msg(ds4c_import(&o, &d) == 0, "%s: %s", config, d.msg);
}

/* The compiles share a kernel cache in the test's folder: an imported
 * description and the committed one give the same kernels. */
static void compile_cpu(const char *model, const char *sched, const char *out) {
  char cache[600];
  snprintf(cache, sizeof cache, "%s/cache", tmpdir);
  ds4c_options o = {.model_path = model, .sched_path = sched, .out_dir = out, .cpu = 1, .cache_dir = cache};
  dsl_diag d = {0};
  ck_assert_msg(ds4c_compile(&o, &d) == 0, "%s: %s", model, d.msg);
}

/* The release's config (models/configs/deepseek-v4-flash.json: the
 * compress_ratios form with its MTP entry, rope_scaling, FP8 quantization
 * and FP4 experts) imports to a description that states no param of its
 * own and whose prefill and decode plans equal the shipped description's. */
START_TEST(release_config_gives_the_shipped_plans) {
  make_tmpdir();
  char out[700], a[700], b[700];
  snprintf(out, sizeof out, "%s/flash-imported.yaml", tmpdir);
  import_ok("models/configs/deepseek-v4-flash.json", out, "models/deepseek-v4-flash.yaml", 0, 0);
  char *text = tu_slurp(out, NULL);
  ck_assert_msg(strstr(text, "params: {}"), "the release's import states params:\n%s", text);
  ck_assert_msg(strstr(text, "#   num_nextn_predict_layers: 1 (the MTP block is not built)"), "%s", text);
  free(text);
  /* its model name is the file's; the shipped one is deepseek-v4-flash */
  char *imported = tu_slurp(out, NULL);
  char *renamed = tu_replace_once(imported, "model: flash-imported", "model: deepseek-v4-flash");
  tu_write_text(out, renamed);
  free(imported);
  free(renamed);
  snprintf(a, sizeof a, "%s/shipped", tmpdir);
  snprintf(b, sizeof b, "%s/imported", tmpdir);
  compile_cpu("models/deepseek-v4-flash.yaml", "schedules/ds4-flash-hotcold.yaml", a);
  compile_cpu(out, "schedules/ds4-flash-hotcold.yaml", b);
  for (int decode = 0; decode < 2; decode++) {
    char pa[800], pb[800];
    snprintf(pa, sizeof pa, "%s%s/plan.txt", a, decode ? "/decode" : "");
    snprintf(pb, sizeof pb, "%s%s/plan.txt", b, decode ? "/decode" : "");
    char *ta = tu_slurp(pa, NULL), *tb = tu_slurp(pb, NULL);
    ck_assert_msg(strcmp(ta, tb) == 0, "%s and %s differ", pa, pb);
    free(ta);
    free(tb);
  }
  tu_tmpdir_remove(tmpdir);
}
END_TEST

/* text with its `extends:` line replaced by the one in like. */
static char *same_extends(const char *text, const char *like) {
  const char *a = strstr(text, "\nextends: "), *b = strstr(like, "\nextends: ");
  ck_assert(a && b);
  size_t la = strcspn(a + 1, "\n") + 1, lb = strcspn(b + 1, "\n") + 1;
  char *out = malloc(strlen(text) + lb + 1);
  ck_assert_ptr_nonnull(out);
  sprintf(out, "%.*s%.*s%s", (int)(a - text), text, (int)lb, b, a + la);
  return out;
}

/* models/ds4-small-a.yaml and -b.yaml are ds4c import's output for
 * models/configs/ds4-small-{a,b}.json (with --max-seq 64 --tokens 4), so
 * they cannot drift from the importer. */
START_TEST(committed_imports_are_current) {
  make_tmpdir();
  static const char *const names[] = {"ds4-small-a", "ds4-small-b"};
  for (int i = 0; i < 2; i++) {
    char config[256], committed[256], out[700];
    snprintf(config, sizeof config, "models/configs/%s.json", names[i]);
    snprintf(committed, sizeof committed, "models/%s.yaml", names[i]);
    snprintf(out, sizeof out, "%s/%s.yaml", tmpdir, names[i]);
    import_ok(config, out, "models/deepseek-v4-flash.yaml", 64, 4);
    char *want = tu_slurp(committed, NULL), *got = tu_slurp(out, NULL);
    char *got_here = same_extends(got, want); /* the scratch file extends the same base by another path */
    ck_assert_msg(strcmp(want, got_here) == 0, "%s is stale; refresh it with: ds4c import %s -o %s --max-seq 64 "
                  "--tokens 4", committed, config, committed);
    free(want);
    free(got);
    free(got_here);
  }
  tu_tmpdir_remove(tmpdir);
}
END_TEST

/* The two small configurations differ from the release in every way the
 * blocks allow: (a) float32 weights, both rope tables plain at other
 * thetas, eps 1e-5, hc_eps 1e-4, routed scale 2.5, SwiGLU limit 7, window
 * 6, CSA ratio 2, HCA ratio 4, 6 experts with 3 chosen, and a
 * sliding-window layer on scored routing and an HCA layer on hash routing;
 * (b) bfloat16 weights, YaRN of other fields on the compress table,
 * window 4, HCA ratio 8, 4 experts, two hyper-connection streams, 10
 * Sinkhorn iterations. Each matches the float64 reference over the
 * default prompt and 20 decode steps. A plan whose main_rope.theta no
 * longer says what its kernels compute fails the check: the reference
 * reads the plan. */
static void set_plan_fparam(const char *bundle, const char *name, double v) {
  char path[800];
  snprintf(path, sizeof path, "%s/plan.ds4p", bundle);
  plan p;
  rt_status s = plan_read(path, &p);
  ck_assert_msg(s == NULL, "%s", rt_status_msg(s));
  int found = 0;
  for (uint32_t i = 0; i < p.nfparams; i++)
    if (strcmp(plan_str(&p, p.fparams[i].name), name) == 0) {
      p.fparams[i].value = v;
      found = 1;
    }
  ck_assert_msg(found, "%s: no float param %s", path, name);
  s = plan_write(&p, path);
  ck_assert_msg(s == NULL, "%s", rt_status_msg(s));
  plan_free(&p);
}

/* The default prompt and 20 decode steps against the float64 reference. */
static ds4run_check_result check_run(const char *bundle) {
  br_result r;
  br_run(bundle, 20, 1, &r);
  return r.check;
}

START_TEST(small_configs_match_the_reference) {
  make_tmpdir();
  static const char *const models[] = {"models/ds4-small-a.yaml", "models/ds4-small-b.yaml"};
  for (int i = 0; i < 2; i++) {
    char out[700];
    snprintf(out, sizeof out, "%s/small%d", tmpdir, i);
    compile_cpu(models[i], "schedules/ds4-flash-cpu.yaml", out);
    ds4run_check_result r = check_run(out);
    fprintf(stderr, "test_import: %s vs float64: %d steps, max rel err %.3g\n", models[i], r.steps, r.max_rel_err);
    ck_assert_int_gt(r.steps, 20);
    ck_assert_int_eq(r.token_mismatches, 0);
    ck_assert_msg(r.passed, "%s: max rel err %g over bound %g", models[i], r.max_rel_err, r.bound);
    ck_assert(r.tracks_ties);
    if (i > 0) continue;
    /* ds4run --ties alone: the reference's first exact top-k tie, no verdict */
    char args[800], text[8192];
    snprintf(args, sizeof args, "%s --steps 20 --ties", out);
    ck_assert_int_eq(tu_ds4run(args, text, sizeof text), 0);
    char want[128];
    snprintf(want, sizeof want, "ties:      first exact top-k tie at position %d (layers.%d, %s)", r.tie_position,
             r.tie_layer, r.tie_where);
    ck_assert_msg(r.tie_position >= 0 && strstr(text, want), "want '%s' in:\n%s", want, text);
    ck_assert_msg(!strstr(text, "check:"), "%s", text);
    set_plan_fparam(out, "main_rope.theta", 10000.0);
    r = check_run(out);
    ck_assert_msg(!r.passed && r.max_rel_err > r.bound,
                  "a plan whose main_rope.theta differs from its kernels' passed (max rel err %g)", r.max_rel_err);
  }
  tu_tmpdir_remove(tmpdir);
}
END_TEST

/* Configs the blocks cannot honour, each refused at the key with what
 * can be honoured; the output is never written. */
START_TEST(refusals_name_the_key) {
  make_tmpdir();
  char *release = tu_slurp("models/configs/deepseek-v4-flash.json", NULL);
  static const struct {
    const char *from, *to, *want;
  } cases[] = {
      {"\"scoring_func\": \"sqrtsoftplus\"", "\"scoring_func\": \"softmax\"",
       "config.json:74:19: error: 'scoring_func' is \"softmax\"; ds4c import can honour only \"sqrtsoftplus\": the "
       "router's score"},
      {"\"tie_word_embeddings\": false", "\"tie_word_embeddings\": true",
       "error: 'tie_word_embeddings' is true; ds4c import can honour only false: the head has its own matrix, "
       "head.weight"},
      {"\"n_shared_experts\": 1", "\"n_shared_experts\": 2", "error: 'n_shared_experts' is 2; ds4c import can "
       "honour only 1: one shared expert"},
      {"\"hidden_size\": 4096", "\"hidden_size\": 4096, \"hidden_dropout\": 0.1",
       "error: 'hidden_dropout': ds4c import does not know this key"},
      {"\"hidden_size\": 4096", "\"hidden_size\": 4096.5", "error: 'hidden_size' must be a positive integer, "
       "found 4096.5"},
      {"\"type\": \"yarn\"", "\"type\": \"linear\"", "error: 'rope_scaling' has rope_type 'linear'; the kernels "
       "compute default and yarn tables"},
      {"\"beta_slow\": 1", "\"beta_slow\": 1, \"mscale\": 0.707", "error: 'rope_scaling.mscale': ds4c import does "
       "not know this rope field"},
      {"\"torch_dtype\": \"bfloat16\"", "\"torch_dtype\": \"float16\"", "error: 'torch_dtype' is \"float16\"; "
       "the DeepSeek-V4 kernels read float32, bfloat16, FP8 and FP4 weights"},
      {"\"scale_fmt\": \"ue8m0\"", "\"scale_fmt\": \"float32\"", "error: quantization_config.scale_fmt is "
       "float32; ds4c import reads the release's FP8 (scale_fmt \"ue8m0\")"},
      {"\"num_hash_layers\": 3", "\"num_hash_layers\": 3, \"mlp_layer_types\": []",
       "error: the config has both mlp_layer_types and num_hash_layers"},
      {"\"vocab_size\": 129280,", "", "error: the config has no 'vocab_size', which ds4c import needs"},
      {"\"sliding_window\": 128", "\"sliding_window\": 128,", "config.json:19:25: error: malformed YAML: did not find expected node content"},
  };
  char config[700], out[700];
  snprintf(config, sizeof config, "%s/config.json", tmpdir);
  snprintf(out, sizeof out, "%s/out.yaml", tmpdir);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *text = tu_replace_once(release, cases[i].from, cases[i].to);
    tu_write_text(config, text);
    free(text);
    tu_write_text(out, "an earlier description\n");
    ds4c_import_options o = {.config_path = config, .out_path = out, .base_path = "models/deepseek-v4-flash.yaml"};
    dsl_diag d = {0};
    ck_assert_msg(ds4c_import(&o, &d) != 0, "case %zu imported", i);
    ck_assert_msg(strstr(d.msg, cases[i].want), "case %zu: got\n%s\nwant\n%s", i, d.msg, cases[i].want);
    char *kept = tu_slurp(out, NULL);
    ck_assert_str_eq(kept, "an earlier description\n");
    free(kept);
  }
  free(release);
  tu_tmpdir_remove(tmpdir);
}
END_TEST

int main(void) {
  Suite *s = suite_create("import");
  TCase *tc = tcase_create("import");
  tcase_add_test(tc, release_config_gives_the_shipped_plans);
  tcase_add_test(tc, committed_imports_are_current);
  tcase_add_test(tc, small_configs_match_the_reference);
  tcase_add_test(tc, refusals_name_the_key);
  suite_add_tcase(s, tc);
  return tu_run_suite(s);
}
