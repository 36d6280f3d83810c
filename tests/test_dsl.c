/* test_dsl.c - the dsl module: the shipped descriptions load with the values
 * they hold, every error case under tests/cases/dsl/ gives exactly the message
 * in its .err file, expressions evaluate (and fail) at the right columns, and
 * truncated, mutated or allocation-starved input never crashes or leaks. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dsl.h"
#include "dsl_yaml.h"

/* ---- allocation failure injection (the library's weak hook) ---- */

static long alloc_count, alloc_fail_at = -1;

int dsl_alloc_should_fail(void) {
  return alloc_fail_at >= 0 && alloc_count++ == alloc_fail_at;
}

/* ---- helpers ---- */

static char *read_all(const char *path, size_t *out_len) {
  FILE *f = fopen(path, "rb");
  ck_assert_msg(f != NULL, "cannot open %s: %s", path, strerror(errno));
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)n + 1);
  ck_assert_ptr_nonnull(buf);
  ck_assert_int_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
  buf[n] = 0;
  fclose(f);
  if (out_len) *out_len = (size_t)n;
  return buf;
}

/* 1-based line and column of the first `token` on the first line that
 * contains `line_has`, found in the file text itself so that the checks do
 * not depend on where the shipped files put things. */
static dsl_pos find_pos(const dsl_source *src, const char *line_has, const char *token) {
  const char *l = strstr(src->text, line_has);
  ck_assert_msg(l != NULL, "'%s' not in %s", line_has, src->path);
  while (l > src->text && l[-1] != '\n') l--;
  const char *t = strstr(l, token);
  ck_assert_msg(t != NULL, "'%s' not in %s", token, src->path);
  dsl_pos p = {src, 1, 1};
  for (const char *c = src->text; c < l; c++) p.line += *c == '\n';
  p.col = (int)(t - l) + 1;
  return p;
}

static void assert_pos(dsl_pos got, dsl_pos want, const char *what) {
  ck_assert_msg(got.src == want.src && got.line == want.line && got.col == want.col,
                "%s at %d:%d, expected %d:%d", what, got.line, got.col, want.line, want.col);
}

static const dsl_kv *find_kv(const dsl_kv *kv, int n, const char *key) {
  for (int i = 0; i < n; i++)
    if (strcmp(kv[i].key.text, key) == 0) return &kv[i];
  return NULL;
}

/* Params of a model, evaluated in order: each may use the earlier ones,
 * the way the compiler's expand pass sees them. */
typedef struct param_env {
  const dsl_model *m;
  int known;
  int64_t value[64];
} param_env;

static int env_lookup(void *ctx, const char *name, int64_t *out) {
  const param_env *e = ctx;
  for (int i = 0; i < e->known; i++)
    if (strcmp(e->m->params[i].key.text, name) == 0) {
      *out = e->value[i];
      return 0;
    }
  return -1;
}

static int eval_params(const dsl_model *m, param_env *env, dsl_diag *d) {
  env->m = m;
  env->known = 0;
  ck_assert_int_le(m->nparams, 64);
  for (int i = 0; i < m->nparams; i++) {
    /* integer params only: a rope table or a float (tiny-moe's norm_eps) is none */
    int integer = !m->params[i].fields && !dsl_has_float_literal(&m->params[i].value);
    if (integer && dsl_eval(&m->params[i].value, env_lookup, env, &env->value[i], d)) return -1;
    env->known = i + 1;
  }
  return 0;
}

static int eval_shapes(const dsl_tensor *t, int n, param_env *env, dsl_diag *d) {
  for (int i = 0; i < n; i++)
    for (int j = 0; j < t[i].ndim; j++) {
      int64_t v;
      if (dsl_eval(&t[i].shape[j], env_lookup, env, &v, d)) return -1;
    }
  return 0;
}

/* Everything the expression cases exercise: params, shapes, repeats and
 * layers' first indices. */
static int eval_model(const dsl_model *m, dsl_diag *d) {
  param_env env;
  if (eval_params(m, &env, d)) return -1;
  if (eval_shapes(m->tensors, m->ntensors, &env, d)) return -1;
  for (int b = 0; b < m->nblocks; b++)
    if (eval_shapes(m->blocks[b].tensors, m->blocks[b].ntensors, &env, d)) return -1;
  for (int l = 0; l < m->nlayers; l++) {
    int64_t v;
    if (m->layers[l].repeat.text && dsl_eval(&m->layers[l].repeat, env_lookup, &env, &v, d)) return -1;
    if (m->layers[l].from.text && dsl_eval(&m->layers[l].from, env_lookup, &env, &v, d)) return -1;
  }
  return 0;
}

/* ---- the shipped descriptions ---- */

START_TEST(test_tiny_moe_loads) {
  dsl_diag d = {0};
  dsl_model *m = NULL;
  ck_assert_msg(dsl_model_load("models/tiny-moe.yaml", &m, &d) == 0, "%s", d.msg);
  ck_assert(!d.failed);
  const dsl_source *src = m->src;
  ck_assert_str_eq(src->path, "models/tiny-moe.yaml");
  ck_assert_str_eq(m->name.text, "tiny-moe");
  assert_pos(m->name.pos, find_pos(src, "model: tiny-moe", "tiny-moe"), "model name");
  ck_assert_int_eq(m->nparams, 14);
  ck_assert_str_eq(m->params[0].key.text, "vocab");
  ck_assert_str_eq(m->params[0].value.text, "128");
  assert_pos(m->params[0].key.pos, find_pos(src, "vocab: 128", "vocab"), "param key");
  assert_pos(m->params[0].value.pos, find_pos(src, "vocab: 128", "128"), "param value");
  ck_assert_str_eq(find_kv(m->params, m->nparams, "tokens")->value.text, "4");

  ck_assert_int_eq(m->ntensors, 3);
  ck_assert_str_eq(m->tensors[1].name.text, "logits");
  ck_assert_int_eq(m->tensors[1].ndim, 2);
  ck_assert_str_eq(m->tensors[1].shape[1].text, "vocab");
  ck_assert_str_eq(m->tensors[1].dtype.text, "f32");
  ck_assert_str_eq(m->tensors[1].role.text, "output");
  ck_assert_ptr_null(m->tensors[1].checkpoint.text);
  assert_pos(m->tensors[1].pos, find_pos(src, "{name: logits", "{"), "tensor mapping");

  ck_assert_int_eq(m->nblocks, 3);
  const dsl_block *embed = &m->blocks[0], *dec = &m->blocks[1], *head = &m->blocks[2];
  ck_assert_str_eq(embed->name.text, "embed");
  ck_assert_ptr_null(embed->carry_in.text);
  ck_assert_str_eq(embed->carry_out.text, "x");
  ck_assert_int_eq(embed->ntensors, 2);
  ck_assert_str_eq(embed->tensors[0].checkpoint.text, "embed.weight");
  ck_assert_str_eq(embed->tensors[0].init_scale.text, "1.0");
  ck_assert_ptr_null(embed->tensors[0].init_offset.text);
  ck_assert_int_eq(embed->nops, 1);

  ck_assert_str_eq(dec->name.text, "decoder");
  ck_assert_str_eq(dec->carry_in.text, "x");
  ck_assert_str_eq(dec->carry_out.text, "y");
  ck_assert_int_eq(dec->ntensors, 33);
  ck_assert_int_eq(dec->nops, 19);
  const dsl_tensor *wq = &dec->tensors[1];
  ck_assert_str_eq(wq->name.text, "wq");
  ck_assert_str_eq(wq->shape[0].text, "heads*head_dim");
  assert_pos(wq->shape[0].pos, find_pos(src, "{name: wq,", "heads*head_dim"), "shape entry");
  /* a double-quoted scalar's position is its opening quote */
  const dsl_tensor *an = &dec->tensors[0];
  ck_assert_str_eq(an->checkpoint.text, "layers.{i}.attn_norm.weight");
  assert_pos(an->checkpoint.pos, find_pos(src, "\"layers.{i}.attn_norm.weight\"", "\""), "checkpoint");
  ck_assert_str_eq(an->init_offset.text, "1.0");
  ck_assert_str_eq(an->init_scale.text, "0.1");

  const dsl_op *rope = &dec->ops[4];
  ck_assert_str_eq(rope->name.text, "attn.q_rope");
  ck_assert_str_eq(rope->kind.text, "rope");
  ck_assert_int_eq(rope->nin, 1);
  ck_assert_str_eq(rope->in[0].text, "q");
  ck_assert_int_eq(rope->nout, 1);
  ck_assert_str_eq(rope->out[0].text, "qr");
  ck_assert_int_eq(rope->nattrs, 3);
  ck_assert_str_eq(rope->attrs[2].key.text, "rope");
  ck_assert_str_eq(rope->attrs[2].value.text, "main_rope");
  const dsl_op *experts = &dec->ops[14];
  ck_assert_str_eq(experts->kind.text, "moe_experts");
  ck_assert_int_eq(experts->nin, 5);
  ck_assert_int_eq(experts->nattrs, 0);
  ck_assert_ptr_null(experts->attrs);
  ck_assert_str_eq(dec->ops[0].attrs[0].value.text, "norm_eps");

  ck_assert_ptr_null(head->carry_out.text);
  ck_assert_str_eq(head->carry_in.text, "x");
  ck_assert_int_eq(head->nops, 3);

  ck_assert_int_eq(m->nlayers, 3);
  ck_assert_str_eq(m->layers[1].block.text, "decoder");
  ck_assert_str_eq(m->layers[1].name.text, "layers");
  ck_assert_str_eq(m->layers[1].repeat.text, "n_layers");
  ck_assert_ptr_null(m->layers[0].repeat.text);
  ck_assert_int_eq(m->layers[0].nparams, 0);

  /* the expressions all evaluate against the params */
  param_env env;
  ck_assert_msg(eval_model(m, &d) == 0, "%s", d.msg);
  ck_assert_int_eq(eval_params(m, &env, &d), 0);
  int64_t v;
  ck_assert_int_eq(dsl_eval(&wq->shape[0], env_lookup, &env, &v, &d), 0);
  ck_assert_int_eq(v, 64);
  ck_assert_int_eq(dsl_eval(&m->layers[1].repeat, env_lookup, &env, &v, &d), 0);
  ck_assert_int_eq(v, 2);
  dsl_model_free(m);
}
END_TEST

START_TEST(test_tiny_1dev_loads) {
  dsl_diag d = {0};
  dsl_schedule *s = NULL;
  ck_assert_msg(dsl_schedule_load("schedules/tiny-1dev.yaml", &s, &d) == 0, "%s", d.msg);
  const dsl_source *src = s->src;
  ck_assert_str_eq(s->name.text, "tiny-1dev");
  ck_assert_str_eq(s->model.text, "tiny-moe");
  ck_assert_int_eq(s->ndevices, 1);
  const dsl_device *dev = &s->devices[0];
  ck_assert_str_eq(dev->name.text, "cpu0");
  ck_assert_str_eq(dev->backend.text, "cpu");
  ck_assert_str_eq(dev->arch.text, "host");
  ck_assert_str_eq(dev->ordinal.text, "0");
  ck_assert_str_eq(dev->threads.text, "2");
  ck_assert_ptr_null(dev->memory.text);
  ck_assert_str_eq(dev->bandwidth.text, "2.0e10");
  ck_assert_str_eq(dev->flops.text, "5.0e10");
  ck_assert_str_eq(dev->launch.text, "2.0e-6");
  assert_pos(dev->pos, find_pos(src, "{name: cpu0", "{"), "device");
  ck_assert_int_eq(s->nstreams, 1);
  ck_assert_str_eq(s->streams[0].name.text, "main");
  ck_assert_str_eq(s->streams[0].device.text, "cpu0");
  ck_assert_int_eq(s->nowners, 1);
  const dsl_owner *o = &s->owners[0];
  ck_assert_str_eq(o->glob.text, "*");
  ck_assert_str_eq(o->device.text, "cpu0");
  ck_assert_str_eq(o->stream.text, "main");
  assert_pos(o->pos, find_pos(src, "\"* -> cpu0.main\"", "\""), "owner rule");
  assert_pos(o->glob.pos, find_pos(src, "\"* -> cpu0.main\"", "*"), "owner glob");
  assert_pos(o->device.pos, find_pos(src, "\"* -> cpu0.main\"", "cpu0"), "owner device");
  assert_pos(o->stream.pos, find_pos(src, "\"* -> cpu0.main\"", "main"), "owner stream");
  ck_assert_int_eq(s->nearly_resolve, 0);
  ck_assert_int_eq(s->nsubmit_first, 0);
  ck_assert_int_eq(s->npriority, 0);
  ck_assert_int_eq(s->ncopies, 0);
  ck_assert_str_eq(s->step_prompt.text, "10");
  ck_assert_ptr_null(s->step_prefill.text);
  ck_assert_str_eq(s->step_decode.text, "1");
  dsl_schedule_free(s);
}
END_TEST

/* The optional parts of a schedule, which the shipped one does not use. */
START_TEST(test_schedule_optional_parts) {
  static const char text[] =
      "schedule: two\n"
      "model: m\n"
      "devices:\n"
      "  - {name: gpu0, backend: hip, arch: gfx942, ordinal: 1, memory: 1024,\n"
      "     bandwidth: 5.0e12, flops: 1.0e15, launch: 0}\n"
      "  - {name: cpu0, backend: cpu, arch: host, ordinal: 0, bandwidth: 1e10, flops: 1e11, launch: 1e-6}\n"
      "streams:\n"
      "  - {name: main, device: gpu0}\n"
      "  - {name: copy, device: gpu0}\n"
      "owners:\n"
      "  - layers.*.ffn.experts[0:6] -> gpu0\n"
      "  - '* ->cpu0.main'\n"
      "early_resolve: [layers.*.ffn.route]\n"
      "submit_first: [layers.*.ffn.experts]\n"
      "priority: {\"layers.*.attn.*\": -2, head.*: 3}\n"
      "copies: {stream: copy, batch: true}\n"
      "step: {prompt: 0, decode: 1}\n";
  dsl_diag d = {0};
  dsl_schedule *s;
  ck_assert_msg(dsl_schedule_parse("two.yaml", text, strlen(text), &s, &d) == 0, "%s", d.msg);
  ck_assert_int_eq(s->ndevices, 2);
  ck_assert_str_eq(s->devices[0].memory.text, "1024");
  ck_assert_ptr_null(s->devices[0].threads.text);
  ck_assert_int_eq(s->nstreams, 2);
  ck_assert_int_eq(s->nowners, 2);
  ck_assert_str_eq(s->owners[0].glob.text, "layers.*.ffn.experts[0:6]");
  ck_assert_int_eq(s->owners[0].glob.pos.line, 11);
  ck_assert_int_eq(s->owners[0].glob.pos.col, 5);
  ck_assert_str_eq(s->owners[0].device.text, "gpu0");
  ck_assert_int_eq(s->owners[0].device.pos.col, 34);
  ck_assert_ptr_null(s->owners[0].stream.text);
  ck_assert_str_eq(s->owners[1].glob.text, "*");
  ck_assert_int_eq(s->owners[1].glob.pos.col, 6); /* after the single quote */
  ck_assert_str_eq(s->owners[1].device.text, "cpu0");
  ck_assert_int_eq(s->owners[1].device.pos.col, 10);
  ck_assert_str_eq(s->owners[1].stream.text, "main");
  ck_assert_int_eq(s->owners[1].stream.pos.col, 15);
  ck_assert_int_eq(s->nearly_resolve, 1);
  ck_assert_str_eq(s->early_resolve[0].text, "layers.*.ffn.route");
  ck_assert_int_eq(s->nsubmit_first, 1);
  ck_assert_int_eq(s->npriority, 2);
  ck_assert_str_eq(s->priority[0].key.text, "layers.*.attn.*");
  ck_assert_str_eq(s->priority[0].value.text, "-2");
  ck_assert_int_eq(s->ncopies, 2);
  ck_assert_str_eq(s->copies[1].key.text, "batch");
  ck_assert_str_eq(s->copies[1].value.text, "true");
  ck_assert_str_eq(s->step_prompt.text, "0");
  dsl_schedule_free(s);
}
END_TEST

/* Per-layer params and empty optional values. */
START_TEST(test_model_layer_params) {
  static const char text[] =
      "model: m\n"
      "params: {hidden: 8}\n"
      "blocks:\n"
      "  - name: b\n"
      "    carry:\n"
      "    tensors:\n"
      "    ops:\n"
      "      - {name: a, op: add, in: [], out: [y], attrs: {}}\n"
      "layers:\n"
      "  - {block: b, name: first, params: {window: 128, heads: hidden/2}}\n"
      "  - {block: b, name: rest, repeat: 3}\n";
  dsl_diag d = {0};
  dsl_model *m;
  ck_assert_msg(dsl_model_parse("m.yaml", text, strlen(text), &m, &d) == 0, "%s", d.msg);
  ck_assert_int_eq(m->ntensors, 0);
  ck_assert_int_eq(m->blocks[0].ntensors, 0);
  ck_assert_ptr_null(m->blocks[0].carry_in.text);
  ck_assert_int_eq(m->blocks[0].ops[0].nin, 0);
  ck_assert_int_eq(m->blocks[0].ops[0].nattrs, 0);
  ck_assert_int_eq(m->layers[0].nparams, 2);
  ck_assert_str_eq(m->layers[0].params[1].key.text, "heads");
  ck_assert_str_eq(m->layers[0].params[1].value.text, "hidden/2");
  ck_assert_int_eq(m->layers[0].params[1].value.pos.line, 10);
  ck_assert_int_eq(m->layers[0].params[1].value.pos.col, 58);
  ck_assert_str_eq(m->layers[1].repeat.text, "3");
  dsl_model_free(m);
}
END_TEST

/* Layers that share a name: a list of blocks taken in turn, and the index
 * of the first instance. */
START_TEST(test_model_layer_blocks) {
  static const char text[] =
      "model: m\n"
      "blocks:\n"
      "  - {name: hca, ops: [{name: a, op: add, in: [], out: [y]}]}\n"
      "  - {name: csa, ops: [{name: a, op: add, in: [], out: [y]}]}\n"
      "layers:\n"
      "  - {block: csa, name: layers, from: 2}\n"
      "  - blocks: [hca, csa]\n"
      "    name: layers\n"
      "    from: n - 40\n"
      "    repeat: 40\n";
  dsl_diag d = {0};
  dsl_model *m;
  ck_assert_msg(dsl_model_parse("m.yaml", text, strlen(text), &m, &d) == 0, "%s", d.msg);
  ck_assert_int_eq(m->nlayers, 2);
  const dsl_layer *one = &m->layers[0], *alt = &m->layers[1];
  ck_assert_str_eq(one->block.text, "csa");
  ck_assert_int_eq(one->nblocks, 0);
  ck_assert_ptr_null(one->blocks);
  ck_assert_str_eq(one->from.text, "2");
  ck_assert_ptr_null(one->repeat.text);
  ck_assert_ptr_null(alt->block.text);
  ck_assert_int_eq(alt->nblocks, 2);
  ck_assert_str_eq(alt->blocks[0].text, "hca");
  ck_assert_str_eq(alt->blocks[1].text, "csa");
  ck_assert_int_eq(alt->blocks[1].pos.line, 7);
  ck_assert_int_eq(alt->blocks[1].pos.col, 19);
  ck_assert_str_eq(alt->from.text, "n - 40");
  ck_assert_int_eq(alt->from.pos.line, 9);
  ck_assert_int_eq(alt->from.pos.col, 11);
  ck_assert_str_eq(alt->repeat.text, "40");
  dsl_model_free(m);
}
END_TEST

/* ---- error cases: tests/cases/dsl/<name>.yaml and <name>.err ---- */

/* model_* load as models, sched_* as schedules, expr_* as models whose
 * params, shapes and repeats are then evaluated. */
/* ds4-flash-mini extends deepseek-v4-flash: its params replace the base's
 * in place, a param it does not give keeps the base's value and position,
 * and the lists it does not give (tensors, blocks) are the base's. */
START_TEST(test_model_extends) {
  dsl_diag d = {0};
  dsl_model *mini = NULL, *full = NULL;
  ck_assert_msg(dsl_model_load("models/ds4-flash-mini.yaml", &mini, &d) == 0, "%s", d.msg);
  ck_assert_msg(dsl_model_load("models/deepseek-v4-flash.yaml", &full, &d) == 0, "%s", d.msg);
  ck_assert_str_eq(mini->name.text, "ds4-flash-mini");
  ck_assert_str_eq(mini->extends.text, "deepseek-v4-flash.yaml");
  ck_assert_int_eq(mini->nparams, full->nparams);
  for (int i = 0; i < full->nparams; i++)
    ck_assert_str_eq(mini->params[i].key.text, full->params[i].key.text);
  const dsl_kv *hidden = find_kv(mini->params, mini->nparams, "hidden");
  ck_assert_str_eq(hidden->value.text, "64");
  ck_assert_str_eq(hidden->value.pos.src->path, "models/ds4-flash-mini.yaml");
  const dsl_kv *csa = find_kv(mini->params, mini->nparams, "csa_ratio");
  ck_assert_str_eq(csa->value.text, "4");
  ck_assert_str_eq(csa->value.pos.src->path, "models/deepseek-v4-flash.yaml");
  ck_assert_int_eq(mini->nblocks, full->nblocks);
  ck_assert_int_eq(mini->ntensors, full->ntensors);
  ck_assert_str_eq(mini->blocks[1].name.text, "swa_attn");
  /* a rope table param: its fields, positions in the base */
  const dsl_kv *rope = find_kv(mini->params, mini->nparams, "compress_rope");
  ck_assert_ptr_null(rope->value.text);
  ck_assert_int_eq(rope->nfields, 6);
  ck_assert_str_eq(rope->fields[0].key.text, "type");
  ck_assert_str_eq(rope->fields[0].value.text, "yarn");
  ck_assert_str_eq(rope->fields[1].value.pos.src->path, "models/deepseek-v4-flash.yaml");
  /* a block made of parts */
  const dsl_block *csa_score = NULL;
  for (int i = 0; i < mini->nblocks; i++)
    if (strcmp(mini->blocks[i].name.text, "csa_score") == 0) csa_score = &mini->blocks[i];
  ck_assert_ptr_nonnull(csa_score);
  ck_assert_int_eq(csa_score->nparts, 2);
  ck_assert_str_eq(csa_score->parts[0].text, "csa_attn");
  ck_assert_str_eq(csa_score->parts[1].text, "score_ffn");
  ck_assert_int_eq(csa_score->nops, 0);
  ck_assert_int_eq(mini->nlayers, 5);
  ck_assert_str_eq(mini->layers[3].repeat.text, "2");
  dsl_model_free(mini);
  dsl_model_free(full);
}
END_TEST

static const char *const error_cases[] = {
    "model_malformed",       "model_unknown_key",      "model_missing_field",
    "model_bad_dtype",       "model_bad_role",         "sched_bad_backend",
    "model_duplicate_key",   "model_wrong_type",       "sched_owner_no_arrow",
    "expr_unknown_param",    "expr_overflow",          "expr_div_zero",
    "expr_trailing",         "model_too_deep",         "model_alias",
    "sched_owner_empty_device", "expr_tab",            "model_empty",
    "sched_threads_not_cpu", "model_two_docs",         "model_bad_param_name",
    "sched_bad_priority",    "expr_unclosed",          "sched_owner_empty_glob",
    "model_missing_top",     "model_scalar_root",      "sched_bad_launch",
    "expr_escaped_quote",    "model_complex_key",      "model_attr_list",
    "sched_owner_empty_stream", "model_layer_block_and_blocks", "model_layer_no_block",
    "model_layer_empty_blocks", "model_layer_unknown_key", "model_layer_blocks_scalar",
    "expr_layer_from",       "model_extends_missing",  "model_extends_cycle",
    "model_extends_bad_base", "model_is_a_schedule", "sched_is_a_model",
};
#define NCASES ((int)(sizeof error_cases / sizeof error_cases[0]))

START_TEST(test_error_case) {
  const char *name = error_cases[_i];
  char yaml[512], err[512];
  snprintf(yaml, sizeof yaml, "tests/cases/dsl/%s.yaml", name);
  snprintf(err, sizeof err, "tests/cases/dsl/%s.err", name);
  char *want = read_all(err, NULL);
  dsl_diag d = {0};
  int rc;
  if (strncmp(name, "sched_", 6) == 0) {
    dsl_schedule *s = NULL;
    rc = dsl_schedule_load(yaml, &s, &d);
    ck_assert_ptr_null(s);
  } else {
    dsl_model *m = NULL;
    rc = dsl_model_load(yaml, &m, &d);
    if (rc == 0 && strncmp(name, "expr_", 5) == 0) {
      rc = eval_model(m, &d);
      dsl_model_free(m);
    } else {
      ck_assert_ptr_null(m);
    }
  }
  ck_assert_msg(rc != 0, "%s: no error", name);
  ck_assert(d.failed);
  char got[sizeof d.msg + 2];
  snprintf(got, sizeof got, "%s\n", d.msg);
  ck_assert_msg(strcmp(got, want) == 0, "%s:\n--- expected\n%s--- got\n%s", name, want, got);
  /* the three lines: location and message, the quoted line, the caret */
  int lines = 0;
  for (const char *c = got; *c; c++) lines += *c == '\n';
  ck_assert_msg(lines == 3 || strncmp(got, "error: ", 7) == 0, "%s: %d lines", name, lines);
  free(want);
}
END_TEST

/* Every input in the directory is one of the cases above and has its .err. */
START_TEST(test_error_cases_complete) {
  FILE *p = popen("ls tests/cases/dsl", "r");
  ck_assert_ptr_nonnull(p);
  char line[512];
  int yamls = 0, errs = 0;
  while (fgets(line, sizeof line, p)) {
    line[strcspn(line, "\n")] = 0;
    char *dot = strrchr(line, '.');
    ck_assert_ptr_nonnull(dot);
    int is_yaml = strcmp(dot, ".yaml") == 0;
    ck_assert_msg(is_yaml || strcmp(dot, ".err") == 0, "stray file %s", line);
    *dot = 0;
    int found = 0;
    for (int i = 0; i < NCASES && !found; i++) found = strcmp(error_cases[i], line) == 0;
    ck_assert_msg(found, "%s is not in the case table", line);
    is_yaml ? yamls++ : errs++;
  }
  pclose(p);
  ck_assert_int_eq(yamls, NCASES);
  ck_assert_int_eq(errs, NCASES);
}
END_TEST

/* ---- expressions ---- */

static int table_lookup(void *ctx, const char *name, int64_t *out) {
  (void)ctx;
  static const struct { const char *name; int64_t v; } t[] = {
      {"hidden", 64}, {"heads", 4}, {"head_dim", 16}, {"zero", 0}, {"big", INT64_MAX}, {"_x1", 7}};
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
    if (strcmp(t[i].name, name) == 0) {
      *out = t[i].v;
      return 0;
    }
  return -1;
}

static int64_t eval_ok(const char *text) {
  dsl_str e = {(char *)text, {NULL, 0, 0}};
  dsl_diag d = {0};
  int64_t v = -12345;
  ck_assert_msg(dsl_eval(&e, table_lookup, NULL, &v, &d) == 0, "'%s': %s", text, d.msg);
  ck_assert(!d.failed);
  return v;
}

START_TEST(test_eval_values) {
  ck_assert_int_eq(eval_ok("64"), 64);
  ck_assert_int_eq(eval_ok("  7 "), 7);
  ck_assert_int_eq(eval_ok("2+3*4"), 14);
  ck_assert_int_eq(eval_ok("(2+3)*4"), 20);
  ck_assert_int_eq(eval_ok("2*3+4"), 10);
  ck_assert_int_eq(eval_ok("2-3-4"), -5);
  ck_assert_int_eq(eval_ok("100/10/5"), 2);
  ck_assert_int_eq(eval_ok("7/2"), 3);
  ck_assert_int_eq(eval_ok("-7/2"), -3);
  ck_assert_int_eq(eval_ok("7%3"), 1);
  ck_assert_int_eq(eval_ok("-7%3"), -1);
  ck_assert_int_eq(eval_ok("-3*-2"), 6);
  ck_assert_int_eq(eval_ok("--5"), 5);
  ck_assert_int_eq(eval_ok("-(2+3)"), -5);
  ck_assert_int_eq(eval_ok("heads*head_dim"), 64);
  ck_assert_int_eq(eval_ok("hidden / heads - 1"), 15);
  ck_assert_int_eq(eval_ok("((hidden))"), 64);
  ck_assert_int_eq(eval_ok("_x1*\t2"), 14);
  ck_assert_int_eq(eval_ok("big"), INT64_MAX);
  ck_assert_int_eq(eval_ok("-big-1"), INT64_MIN);
  ck_assert_int_eq(eval_ok("9223372036854775807"), INT64_MAX);
  ck_assert_int_eq(eval_ok("big/big"), 1);
}
END_TEST

static int table_lookup_float(void *ctx, const char *name, double *out) {
  int64_t v;
  if (table_lookup(ctx, name, &v) == 0) {
    *out = (double)v;
    return 0;
  }
  if (strcmp(name, "theta") == 0) {
    *out = 160000.0;
    return 0;
  }
  return -1;
}

/* Float expressions: decimal numbers, names (integers widened), + - * /
 * and parentheses in double; errors at their column. */
START_TEST(test_eval_float) {
  static const struct { const char *text; double want; } ok[] = {
      {"1.0e-6", 1.0e-6}, {"16", 16.0}, {".5", 0.5}, {"2.5E2", 250.0}, {"theta", 160000.0},
      {"theta / 16", 10000.0}, {"hidden * 0.5", 32.0}, {"-(1.5 - 3)", 1.5}, {"7/2", 3.5}, {"1e-6 * 2", 2e-6}};
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    dsl_str e = {(char *)ok[i].text, {NULL, 0, 0}};
    dsl_diag d = {0};
    double v = -1;
    ck_assert_msg(dsl_eval_float(&e, table_lookup_float, NULL, &v, &d) == 0, "'%s': %s", ok[i].text, d.msg);
    ck_assert_msg(v == ok[i].want, "'%s' = %.17g, want %.17g", ok[i].text, v, ok[i].want);
  }
  static const struct { const char *line; int col; const char *want; } bad[] = {
      {"x: theta / 0.0", 4, "e.yaml:1:10: error: division by zero\n"},
      {"x: 1e300 * 1e300", 4, "e.yaml:1:10: error: 1e+300 * 1e+300 is not a finite number\n"},
      {"x: 7 % 2", 4, "e.yaml:1:6: error: '%' takes integers, not a float expression\n"},
      {"x: rope_scale * 2", 4, "e.yaml:1:4: error: unknown param 'rope_scale'\n"},
      {"x: 1.5 +", 4, "e.yaml:1:9: error: expected a number, a name or '(' at the end of the expression\n"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    dsl_source src = {(char *)"e.yaml", (char *)bad[i].line, strlen(bad[i].line)};
    dsl_str e = {(char *)bad[i].line + bad[i].col - 1, {&src, 1, bad[i].col}};
    dsl_diag d = {0};
    double v = 42;
    ck_assert_int_ne(dsl_eval_float(&e, table_lookup_float, NULL, &v, &d), 0);
    ck_assert(v == 42);
    ck_assert_msg(strncmp(d.msg, bad[i].want, strlen(bad[i].want)) == 0, "'%s':\n--- expected\n%s--- got\n%s",
                  bad[i].line, bad[i].want, d.msg);
  }
  dsl_str f = {(char *)"2 * 1.0e-6", {NULL, 0, 0}}, n = {(char *)"hidden2 * 16", {NULL, 0, 0}};
  ck_assert(dsl_has_float_literal(&f));
  ck_assert(!dsl_has_float_literal(&n));
}
END_TEST

/* An expression inside a one-line source so that columns are real. */
static void eval_fails(const char *line_text, int col, const char *want) {
  dsl_source src = {(char *)"e.yaml", (char *)line_text, strlen(line_text)};
  /* the scalar is the rest of the line from col; a quoted one ends before
   * its closing quote */
  char text[256];
  const char *start = line_text + col - 1;
  int quoted = *start == '"' || *start == '\'';
  snprintf(text, sizeof text, "%s", start + quoted);
  if (quoted) text[strlen(text) - 1] = 0;
  dsl_str e = {text, {&src, 1, col}};
  dsl_diag d = {0};
  int64_t v = 42;
  ck_assert_int_ne(dsl_eval(&e, table_lookup, NULL, &v, &d), 0);
  ck_assert(d.failed);
  ck_assert_int_eq(v, 42);
  ck_assert_msg(strcmp(d.msg, want) == 0, "'%s':\n--- expected\n%s\n--- got\n%s", line_text, want, d.msg);
}

START_TEST(test_eval_errors) {
  eval_fails("n: 9223372036854775807*2", 4,
             "e.yaml:1:23: error: integer overflow: 9223372036854775807 * 2 does not fit in 64 bits\n"
             "  n: 9223372036854775807*2\n"
             "                        ^");
  eval_fails("n: 1 + big", 4,
             "e.yaml:1:6: error: integer overflow: 1 + 9223372036854775807 does not fit in 64 bits\n"
             "  n: 1 + big\n"
             "       ^");
  eval_fails("n: -big - 2", 4,
             "e.yaml:1:9: error: integer overflow: -9223372036854775807 - 2 does not fit in 64 bits\n"
             "  n: -big - 2\n"
             "          ^");
  eval_fails("n: \"-(-big-1)\"", 4,
             "e.yaml:1:5: error: integer overflow: -(-9223372036854775808) does not fit in 64 bits\n"
             "  n: \"-(-big-1)\"\n"
             "      ^");
  eval_fails("n: (-big-1) / -1", 4,
             "e.yaml:1:13: error: integer overflow: -9223372036854775808 / -1 does not fit in 64 bits\n"
             "  n: (-big-1) / -1\n"
             "              ^");
  eval_fails("n: 99999999999999999999", 4,
             "e.yaml:1:4: error: integer 99999999999999999999 does not fit in 64 bits\n"
             "  n: 99999999999999999999\n"
             "     ^");
  eval_fails("n: hidden % zero", 4,
             "e.yaml:1:11: error: modulo by zero\n"
             "  n: hidden % zero\n"
             "            ^");
  eval_fails("n: 'hidden / (heads - 4)'", 4,
             "e.yaml:1:12: error: division by zero\n"
             "  n: 'hidden / (heads - 4)'\n"
             "             ^");
  eval_fails("n: heads * hiden", 4,
             "e.yaml:1:12: error: unknown param 'hiden'\n"
             "  n: heads * hiden\n"
             "             ^");
  eval_fails("n: hidden)", 4,
             "e.yaml:1:10: error: unexpected ')' after the expression\n"
             "  n: hidden)\n"
             "           ^");
  eval_fails("n: 2 * * 3", 4,
             "e.yaml:1:8: error: unexpected '*' (expected a number, a name or '(')\n"
             "  n: 2 * * 3\n"
             "         ^");
  eval_fails("n: hidden +", 4,
             "e.yaml:1:12: error: expected a number, a name or '(' at the end of the expression\n"
             "  n: hidden +\n"
             "             ^");
  eval_fails("n: \"  \"", 4,
             "e.yaml:1:5: error: empty expression\n"
             "  n: \"  \"\n"
             "      ^");
  /* without a source: no location, no quoted line */
  dsl_str e = {(char *)"1/0", {NULL, 0, 0}};
  dsl_diag d = {0};
  int64_t v;
  ck_assert_int_ne(dsl_eval(&e, NULL, NULL, &v, &d), 0);
  ck_assert_str_eq(d.msg, "error: division by zero");
  dsl_diag d2 = {0};
  dsl_str n = {(char *)"x", {NULL, 0, 0}};
  ck_assert_int_ne(dsl_eval(&n, NULL, NULL, &v, &d2), 0);
  ck_assert_str_eq(d2.msg, "error: unknown param 'x'");
  /* deep parentheses are refused, not recursed into */
  char deep[400];
  memset(deep, '(', 200);
  strcpy(deep + 200, "1");
  memset(deep + 201, ')', 198);
  deep[399] = 0;
  dsl_str de = {deep, {NULL, 0, 0}};
  dsl_diag d3 = {0};
  ck_assert_int_ne(dsl_eval(&de, NULL, NULL, &v, &d3), 0);
  ck_assert_str_eq(d3.msg, "error: expression nested more than 64 levels deep");
  dsl_diag d4 = {0};
  dsl_str none = {NULL, {NULL, 0, 0}};
  ck_assert_int_ne(dsl_eval(&none, NULL, NULL, &v, &d4), 0);
  ck_assert_str_eq(d4.msg, "error: missing expression");
}
END_TEST

START_TEST(test_pos_at) {
  static char text[] = "a: plain text\nb: \"q\\tx\\u00e9y\"\nc: 'it''s here'\nd: \"\xc3\xa9z\"\n";
  dsl_source src = {(char *)"p.yaml", text, sizeof text - 1};
  dsl_str plain = {(char *)"plain text", {&src, 1, 4}};
  dsl_pos p = dsl_pos_at(&plain, 6);
  ck_assert_int_eq(p.line, 1);
  ck_assert_int_eq(p.col, 10);
  ck_assert_int_eq(dsl_pos_at(&plain, 100).col, 14); /* clamped to the end */
  /* decoded "q\tx\xc3\xa9y": the escape \t is two columns, \u00e9 six */
  dsl_str dq = {(char *)"q\tx\xc3\xa9y", {&src, 2, 4}};
  ck_assert_int_eq(dsl_pos_at(&dq, 0).col, 5);
  ck_assert_int_eq(dsl_pos_at(&dq, 1).col, 6);
  ck_assert_int_eq(dsl_pos_at(&dq, 2).col, 8);
  ck_assert_int_eq(dsl_pos_at(&dq, 3).col, 9);
  ck_assert_int_eq(dsl_pos_at(&dq, 5).col, 15);
  dsl_str sq = {(char *)"it's here", {&src, 3, 4}};
  ck_assert_int_eq(dsl_pos_at(&sq, 2).col, 7);
  ck_assert_int_eq(dsl_pos_at(&sq, 3).col, 9);
  ck_assert_int_eq(dsl_pos_at(&sq, 5).col, 11);
  /* a multi-byte character is one column */
  dsl_str mb = {(char *)"\xc3\xa9z", {&src, 4, 4}};
  ck_assert_int_eq(dsl_pos_at(&mb, 2).col, 6);
  dsl_str nosrc = {(char *)"abc", {NULL, 0, 0}};
  ck_assert_ptr_null(dsl_pos_at(&nosrc, 2).src);
}
END_TEST

START_TEST(test_diag_format) {
  static char text[] = "first\n\tx: [a, b]\nlast";
  dsl_source src = {(char *)"f.yaml", text, sizeof text - 1};
  dsl_diag d = {0};
  ck_assert_int_eq(dsl_error(&d, (dsl_pos){&src, 2, 6}, "bad %s", "thing"), -1);
  ck_assert_str_eq(d.msg, "f.yaml:2:6: error: bad thing\n  \tx: [a, b]\n  \t    ^");
  /* the first error wins */
  dsl_error(&d, (dsl_pos){&src, 1, 1}, "second");
  ck_assert_str_eq(d.msg, "f.yaml:2:6: error: bad thing\n  \tx: [a, b]\n  \t    ^");
  /* a note follows the error, quoting its own line; none without an error */
  dsl_diag dn = {0};
  ck_assert_int_eq(dsl_note(&dn, (dsl_pos){&src, 1, 1}, "orphan"), -1);
  ck_assert_str_eq(dn.msg, "");
  dsl_error(&dn, (dsl_pos){&src, 3, 1}, "used here");
  ck_assert_int_eq(dsl_note(&dn, (dsl_pos){&src, 1, 3}, "'%s' declared here", "first"), -1);
  ck_assert_str_eq(dn.msg, "f.yaml:3:1: error: used here\n  last\n  ^\n"
                           "f.yaml:1:3: note: 'first' declared here\n  first\n    ^");
  /* a column past the end of the (last, unterminated) line */
  dsl_diag d2 = {0};
  dsl_error(&d2, (dsl_pos){&src, 3, 7}, "eof");
  ck_assert_str_eq(d2.msg, "f.yaml:3:7: error: eof\n  last\n        ^");
  /* a line past the end of the file quotes nothing */
  dsl_diag d3 = {0};
  dsl_error(&d3, (dsl_pos){&src, 9, 1}, "gone");
  ck_assert_str_eq(d3.msg, "f.yaml:9:1: error: gone\n  \n  ^");
  /* a very long line is shown as a window that keeps the caret under the column */
  char long_text[2000];
  memset(long_text, 'a', 1500);
  long_text[1000] = 'X';
  long_text[1500] = 0;
  dsl_source ls = {(char *)"l.yaml", long_text, 1500};
  dsl_diag d4 = {0};
  dsl_error(&d4, (dsl_pos){&ls, 1, 1001}, "here");
  ck_assert_int_lt(strlen(d4.msg), sizeof d4.msg - 1);
  const char *l2 = strchr(d4.msg, '\n') + 1, *l3 = strchr(l2, '\n') + 1;
  const char *caret = strchr(l3, '^');
  ck_assert_ptr_nonnull(caret);
  ck_assert_int_eq(l2[caret - l3], 'X');
  ck_assert(strncmp(l2, "  ...", 5) == 0);
  dsl_diag d5 = {0};
  ck_assert_int_eq(dsl_error(NULL, (dsl_pos){NULL, 0, 0}, "nowhere"), -1);
  dsl_error(&d5, (dsl_pos){NULL, 0, 0}, "plain %d", 3);
  ck_assert_str_eq(d5.msg, "error: plain 3");
}
END_TEST

/* ---- resource limits and files ---- */

START_TEST(test_limits) {
  size_t n = DSL_MAX_FILE_BYTES + 1;
  char *big = malloc(n);
  ck_assert_ptr_nonnull(big);
  memset(big, ' ', n);
  dsl_diag d = {0};
  dsl_model *m;
  ck_assert_int_ne(dsl_model_parse("big.yaml", big, n, &m, &d), 0);
  ck_assert_ptr_null(m);
  ck_assert_str_eq(d.msg, "big.yaml: error: description is 16777217 bytes; the limit is 16777216 (16 MiB)");
  free(big);

  char path[] = "/tmp/test_dsl_bigXXXXXX";
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(ftruncate(fd, (off_t)n), 0);
  close(fd);
  dsl_diag d2 = {0};
  dsl_schedule *s;
  ck_assert_int_ne(dsl_schedule_load(path, &s, &d2), 0);
  ck_assert_ptr_null(s);
  char want[256];
  snprintf(want, sizeof want, "%s: error: description is 16777217 bytes; the limit is 16777216 (16 MiB)", path);
  ck_assert_str_eq(d2.msg, want);
  unlink(path);

  dsl_diag d3 = {0};
  ck_assert_int_ne(dsl_model_load("tests/cases/dsl/no-such-file.yaml", &m, &d3), 0);
  ck_assert_str_eq(d3.msg, "error: cannot open 'tests/cases/dsl/no-such-file.yaml': No such file or directory");
  dsl_diag d4 = {0};
  ck_assert_int_ne(dsl_model_load("tests/cases", &m, &d4), 0);
  ck_assert_str_eq(d4.msg, "error: 'tests/cases' is not a regular file");
  /* A FIFO (say, an extends: naming one) is refused without waiting for a writer. */
  char fifo[] = "/tmp/test_dsl_fifoXXXXXX";
  ck_assert_ptr_nonnull(mkdtemp(fifo));
  char fifo_path[sizeof fifo + 8];
  snprintf(fifo_path, sizeof fifo_path, "%s/f.yaml", fifo);
  ck_assert_int_eq(mkfifo(fifo_path, 0600), 0);
  dsl_diag df = {0};
  ck_assert_int_ne(dsl_model_load(fifo_path, &m, &df), 0);
  ck_assert_ptr_nonnull(strstr(df.msg, "is not a regular file"));
  unlink(fifo_path);
  rmdir(fifo);

  /* exactly the deepest nesting allowed loads (as a structure error) */
  char deep[300];
  int k = 0;
  k += sprintf(deep + k, "model: t\nparams: {n: ");
  for (int i = 0; i < DSL_MAX_DEPTH - 2; i++) deep[k++] = '[';
  deep[k++] = '1';
  for (int i = 0; i < DSL_MAX_DEPTH - 2; i++) deep[k++] = ']';
  k += sprintf(deep + k, "}\nblocks: []\nlayers: []\n");
  dsl_diag d5 = {0};
  ck_assert_int_ne(dsl_model_parse("deep.yaml", deep, (size_t)k, &m, &d5), 0);
  ck_assert_ptr_nonnull(strstr(d5.msg, "the value of 'n' in 'params' must be a scalar or a mapping, not a list"));
}
END_TEST

/* "model: t\nparams: {p0: 0, p1: 0, ...}" with n params: its length. */
static size_t many_params(char *buf, int n) {
  size_t k = (size_t)sprintf(buf, "model: t\nparams: {");
  for (int i = 0; i < n; i++) k += (size_t)sprintf(buf + k, "%sp%d: 0", i ? ", " : "", i);
  k += (size_t)sprintf(buf + k, "}\nblocks: []\nlayers: []\n");
  return k;
}

/* DSL_MAX_ENTRIES in one list or mapping, DSL_MAX_NODES in a description. */
START_TEST(test_entry_and_node_limits) {
  char *buf = malloc((size_t)DSL_MAX_ENTRIES * 16 + 4096);
  ck_assert_ptr_nonnull(buf);
  dsl_model *m;
  dsl_diag d = {0};
  size_t n = many_params(buf, DSL_MAX_ENTRIES); /* exactly the limit: loads */
  ck_assert_msg(dsl_model_parse("many.yaml", buf, n, &m, &d) == 0, "%s", d.msg);
  ck_assert_int_eq(m->nparams, DSL_MAX_ENTRIES);
  dsl_model_free(m);
  n = many_params(buf, DSL_MAX_ENTRIES + 1);
  dsl_diag d2 = {0};
  ck_assert_int_ne(dsl_model_parse("many.yaml", buf, n, &m, &d2), 0);
  ck_assert_ptr_null(m);
  /* at the first key past the limit: "p16384" */
  ck_assert_ptr_nonnull(strstr(d2.msg, "many.yaml:2:"));
  ck_assert_ptr_nonnull(strstr(d2.msg, ": error: more than 16384 entries in one mapping\n"));
  int col = 0;
  ck_assert_int_eq(sscanf(d2.msg, "many.yaml:2:%d:", &col), 1);
  ck_assert(strncmp(strstr(buf, "\n") + col, "p16384:", 7) == 0);

  size_t k = (size_t)sprintf(buf, "model: t\nparams: {n: [");
  for (int i = 0; i <= DSL_MAX_ENTRIES; i++) k += (size_t)sprintf(buf + k, "%s0", i ? "," : "");
  k += (size_t)sprintf(buf + k, "]}\n");
  dsl_diag d3 = {0};
  ck_assert_int_ne(dsl_model_parse("list.yaml", buf, k, &m, &d3), 0);
  ck_assert_ptr_nonnull(strstr(d3.msg, "list.yaml:2:32782: error: more than 16384 entries in one list\n"));
  free(buf);

  /* 65 lists of 16384 scalars: more nodes than DSL_MAX_NODES */
  size_t cap = 65 * ((size_t)DSL_MAX_ENTRIES * 2 + 4) + 256;
  buf = malloc(cap);
  ck_assert_ptr_nonnull(buf);
  k = (size_t)sprintf(buf, "model: t\nparams: {n: [");
  for (int l = 0; l < 65; l++) {
    k += (size_t)sprintf(buf + k, "%s[", l ? "," : "");
    for (int i = 0; i < DSL_MAX_ENTRIES; i++) {
      buf[k++] = i ? ',' : ' ';
      buf[k++] = '0';
    }
    buf[k++] = ']';
  }
  k += (size_t)sprintf(buf + k, "]}\n");
  ck_assert_uint_le(k, cap);
  dsl_diag d4 = {0};
  ck_assert_int_ne(dsl_model_parse("nodes.yaml", buf, k, &m, &d4), 0);
  ck_assert_ptr_null(m);
  ck_assert_ptr_nonnull(
      strstr(d4.msg, ": error: more than 1048576 YAML nodes (scalars, lists and mappings) in one description\n"));
  free(buf);
}
END_TEST

/* Reader errors come with a byte offset rather than a mark. */
START_TEST(test_bad_bytes) {
  static const char text[] = "model: t\nparams: {a: \x01}\n";
  dsl_diag d = {0};
  dsl_model *m;
  ck_assert_int_ne(dsl_model_parse("b.yaml", text, sizeof text - 1, &m, &d), 0);
  ck_assert_str_eq(d.msg, "b.yaml:2:13: error: malformed YAML: control characters are not allowed\n"
                          "  params: {a: ?}\n"
                          "              ^");
  static const char utf[] = "model: t\xff\n";
  dsl_diag d2 = {0};
  ck_assert_int_ne(dsl_model_parse("u.yaml", utf, sizeof utf - 1, &m, &d2), 0);
  ck_assert_ptr_nonnull(strstr(d2.msg, "u.yaml:1:9: error: malformed YAML: invalid leading UTF-8 octet"));
  static const char nul[] = "model: \"a\\0b\"\n";
  dsl_diag d3 = {0};
  ck_assert_int_ne(dsl_model_parse("n.yaml", nul, sizeof nul - 1, &m, &d3), 0);
  ck_assert_ptr_nonnull(strstr(d3.msg, "n.yaml:1:8: error: scalar contains a NUL character"));
}
END_TEST

/* ---- robustness ---- */

static int parse_any(const char *path, const char *text, size_t len, int schedule) {
  dsl_diag d = {0};
  int rc;
  if (schedule) {
    dsl_schedule *s = NULL;
    rc = dsl_schedule_parse(path, text, len, &s, &d);
    ck_assert(rc == 0 ? s != NULL : s == NULL);
    dsl_schedule_free(s);
  } else {
    dsl_model *m = NULL;
    rc = dsl_model_parse(path, text, len, &m, &d);
    ck_assert(rc == 0 ? m != NULL : m == NULL);
    if (m) {
      dsl_diag e = {0};
      (void)eval_model(m, &e); /* truncated expressions may fail; never crash */
      ck_assert(e.failed ? e.msg[0] != 0 : 1);
    }
    dsl_model_free(m);
  }
  ck_assert_int_eq(rc != 0, d.failed);
  if (rc) ck_assert_msg(strstr(d.msg, "error: ") != NULL && strlen(d.msg) > 7, "empty message");
  return rc;
}

START_TEST(test_truncations) {
  static const char *const files[] = {"models/tiny-moe.yaml", "schedules/tiny-1dev.yaml"};
  for (int f = 0; f < 2; f++) {
    size_t len;
    char *text = read_all(files[f], &len);
    int ok = 0;
    /* every prefix, handed over in an exact-size buffer so that ASan sees
     * any read past the end */
    for (size_t n = 0; n <= len; n++) {
      char *cut = malloc(n ? n : 1);
      memcpy(cut, text, n);
      int rc = parse_any("cut.yaml", cut, n, f);
      ok += rc == 0 && n == len;
      free(cut);
    }
    ck_assert_int_eq(ok, 1);
    free(text);
  }
}
END_TEST

START_TEST(test_mutations) {
  static const char alphabet[] = "{}[]:,-\"'#&*!|>?% \t\n\\xa1.";
  unsigned seed = 12345;
  for (int f = 0; f < 2; f++) {
    size_t len;
    char *text = read_all(f ? "schedules/tiny-1dev.yaml" : "models/tiny-moe.yaml", &len);
    for (int round = 0; round < 1500; round++) {
      char *mut = malloc(len);
      memcpy(mut, text, len);
      int edits = 1 + (int)((seed = seed * 1103515245u + 12345u) >> 16) % 4;
      for (int e = 0; e < edits; e++) {
        seed = seed * 1103515245u + 12345u;
        size_t at = (seed >> 8) % len;
        seed = seed * 1103515245u + 12345u;
        mut[at] = alphabet[(seed >> 16) % (sizeof alphabet - 1)];
      }
      parse_any("mut.yaml", mut, len, f);
      free(mut);
    }
    free(text);
  }
}
END_TEST

/* Fails the 1st, 2nd, ... allocation until a load succeeds: each failure
 * must give "out of memory" and leak nothing (ASan checks the leaks). */
static void oom_sweep(const char *path, int schedule) {
  size_t len;
  char *text = read_all(path, &len);
  int failures = 0;
  for (long k = 0;; k++) {
    alloc_count = 0;
    alloc_fail_at = k;
    dsl_diag d = {0};
    int rc;
    if (schedule) {
      dsl_schedule *s;
      rc = dsl_schedule_parse(path, text, len, &s, &d);
      alloc_fail_at = -1;
      if (rc == 0) dsl_schedule_free(s);
    } else {
      dsl_model *m;
      rc = dsl_model_parse(path, text, len, &m, &d);
      alloc_fail_at = -1;
      if (rc == 0) dsl_model_free(m);
    }
    if (rc == 0) {
      ck_assert_int_le(alloc_count, k); /* succeeded: the k-th was never reached */
      break;
    }
    ck_assert_msg(strstr(d.msg, "out of memory") != NULL, "allocation %ld: %s", k, d.msg);
    failures++;
  }
  ck_assert_int_gt(failures, 50);
  free(text);
}

START_TEST(test_out_of_memory) {
  oom_sweep("models/tiny-moe.yaml", 0);
  oom_sweep("tests/cases/compile/layers-shared-name.yaml", 0); /* lists of blocks */
  oom_sweep("schedules/tiny-1dev.yaml", 1);
}
END_TEST

static Suite *dsl_suite(void) {
  Suite *s = suite_create("dsl");
  TCase *tc = tcase_create("load");
  tcase_add_test(tc, test_tiny_moe_loads);
  tcase_add_test(tc, test_tiny_1dev_loads);
  tcase_add_test(tc, test_schedule_optional_parts);
  tcase_add_test(tc, test_model_layer_params);
  tcase_add_test(tc, test_model_layer_blocks);
  tcase_add_test(tc, test_model_extends);
  suite_add_tcase(s, tc);
  tc = tcase_create("errors");
  tcase_add_loop_test(tc, test_error_case, 0, NCASES);
  tcase_add_test(tc, test_error_cases_complete);
  tcase_add_test(tc, test_bad_bytes);
  tcase_add_test(tc, test_limits);
  tcase_add_test(tc, test_entry_and_node_limits);
  suite_add_tcase(s, tc);
  tc = tcase_create("expr");
  tcase_add_test(tc, test_eval_values);
  tcase_add_test(tc, test_eval_errors);
  tcase_add_test(tc, test_eval_float);
  tcase_add_test(tc, test_pos_at);
  tcase_add_test(tc, test_diag_format);
  suite_add_tcase(s, tc);
  tc = tcase_create("robust");
  tcase_set_timeout(tc, 600);
  tcase_add_test(tc, test_truncations);
  tcase_add_test(tc, test_mutations);
  tcase_add_test(tc, test_out_of_memory);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  const char *root = getenv("DS4_SOURCE_DIR");
  if (root && chdir(root) != 0) {
    fprintf(stderr, "test_dsl: cannot enter %s: %s\n", root, strerror(errno));
    return 1;
  }
  SRunner *sr = srunner_create(dsl_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
