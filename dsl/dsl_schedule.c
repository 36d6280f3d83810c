/* dsl_schedule.c - loads a schedule description (devices, streams, owner
 * rules, ordering hints, copy policy, step) into dsl_schedule. Owner rules
 * are split here into glob, device and stream, each with its own column. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "dsl_yaml.h"

static const char *const sched_keys[] = {"schedule", "model", "devices", "streams", "owners",
                                         "early_resolve", "submit_first", "priority", "copies",
                                         "step", "hot_experts", "profile", NULL};
static const char *const device_keys[] = {"name", "backend", "arch", "ordinal", "threads", "memory",
                                          "bandwidth", "flops", "launch", "copy_bandwidth", "copy_launch",
                                          NULL};
static const char *const profile_keys[] = {"profile", "devices", NULL};
static const char *const profile_device_keys[] = {"name", "bandwidth", "flops", "launch", "copy_bandwidth",
                                                  "copy_launch", NULL};
static const char *const stream_keys[] = {"name", "device", NULL};
static const char *const step_keys[] = {"prefill", "decode", "prompt", NULL};
static const char *const hot_keys[] = {"stats", "device", "budget", "cold", NULL};
static const char *const backends[] = {"cpu", "hip", "cuda", NULL};

static int oom(dsl_diag *d) {
  return dsl_error(d, (dsl_pos){NULL, 0, 0}, "out of memory");
}

static int list_of_maps(const dy_node *parent, const char *key, dy_node **out, dsl_diag *d) {
  *out = NULL;
  dy_node *v = dy_need(parent, key, "schedule", d);
  if (!v) return -1;
  if (dy_expect(v, DY_SEQ, key, "schedule", d)) return -1;
  if (v->kind != DY_SEQ) return 0;
  for (int i = 0; i < v->n; i++)
    if (v->items[i]->kind != DY_MAP)
      return dsl_error(d, v->items[i]->pos, "entries of '%s' in schedule must be mappings, not a %s", key,
                       dy_kind_name(v->items[i]));
  *out = v;
  return 0;
}

/* copy_bandwidth (> 0) and copy_launch (>= 0), both optional. */
static int load_copy_costs(dy_node *n, dsl_device *dev, dsl_diag *d) {
  if (dy_take_opt(n, "copy_bandwidth", "device", &dev->copy_bandwidth, d)) return -1;
  if (dev->copy_bandwidth.text && dy_check_number(&dev->copy_bandwidth, "copy_bandwidth", 2, d)) return -1;
  if (dy_take_opt(n, "copy_launch", "device", &dev->copy_launch, d)) return -1;
  return dev->copy_launch.text ? dy_check_number(&dev->copy_launch, "copy_launch", 1, d) : 0;
}

static int load_device(dy_node *n, dsl_device *dev, dsl_diag *d) {
  dev->pos = n->pos;
  if (dy_check_keys(n, "device", device_keys, d)) return -1;
  if (dy_take_req(n, "name", "device", &dev->name, d)) return -1;
  if (dy_take_req(n, "backend", "device", &dev->backend, d)) return -1;
  if (dy_check_choice(&dev->backend, "backend", backends, d)) return -1;
  if (dy_take_req(n, "arch", "device", &dev->arch, d)) return -1;
  if (dy_take_req(n, "ordinal", "device", &dev->ordinal, d)) return -1;
  if (dy_check_int(&dev->ordinal, "ordinal", 0, d)) return -1;
  if (dy_take_opt(n, "threads", "device", &dev->threads, d)) return -1;
  if (dev->threads.text) {
    if (strcmp(dev->backend.text, "cpu") != 0)
      return dsl_error(d, dev->threads.pos, "'threads' is only for cpu devices; '%.100s' has backend %s",
                       dev->name.text, dev->backend.text);
    if (dy_check_int(&dev->threads, "threads", 1, d)) return -1;
  }
  if (dy_take_opt(n, "memory", "device", &dev->memory, d)) return -1;
  if (dev->memory.text && dy_check_int(&dev->memory, "memory", 1, d)) return -1;
  if (dy_take_req(n, "bandwidth", "device", &dev->bandwidth, d)) return -1;
  if (dy_check_number(&dev->bandwidth, "bandwidth", 2, d)) return -1;
  if (dy_take_req(n, "flops", "device", &dev->flops, d)) return -1;
  if (dy_check_number(&dev->flops, "flops", 2, d)) return -1;
  if (dy_take_req(n, "launch", "device", &dev->launch, d)) return -1;
  if (dy_check_number(&dev->launch, "launch", 1, d)) return -1;
  return load_copy_costs(n, dev, d);
}


/* Moves profile device p's cost fields into schedule device dev: those
 * it gives replace the schedule's. */
static int apply_profile_device(dy_node *p, dsl_device *dev, dsl_diag *d) {
  static const char *const keys[] = {"bandwidth", "flops", "launch"};
  dsl_str *fields[] = {&dev->bandwidth, &dev->flops, &dev->launch};
  static const int min_kind[] = {2, 2, 1};
  for (int k = 0; k < 3; k++) {
    if (!dy_get(p, keys[k])) continue;
    dsl_str v = {0};
    if (dy_take_opt(p, keys[k], "profile device", &v, d)) return -1;
    dsl_str_free(fields[k]);
    *fields[k] = v;
    if (dy_check_number(fields[k], keys[k], min_kind[k], d)) return -1;
  }
  if (dy_get(p, "copy_bandwidth")) dsl_str_free(&dev->copy_bandwidth);
  if (dy_get(p, "copy_launch")) dsl_str_free(&dev->copy_launch);
  return load_copy_costs(p, dev, d);
}

/* `profile: FILE`: a device profile (docs/SCHEDULES.md, "Calibration"),
 * its path relative to the schedule's folder; each of its devices names a
 * device of the schedule. */
static int load_profile(dy_node *v, dsl_schedule *s, dsl_diag *d) {
  if (dy_take_str(v, "profile", "schedule", &s->profile, d)) return -1;
  const char *sched = s->src->path, *slash = strrchr(sched, '/');
  size_t dir = slash && s->profile.text[0] != '/' ? (size_t)(slash - sched) + 1 : 0;
  char *path = dsl_malloc(dir + strlen(s->profile.text) + 1);
  if (!path) return oom(d);
  memcpy(path, sched, dir);
  strcpy(path + dir, s->profile.text);
  char *text;
  size_t len;
  int rc = dy_read_file(path, &text, &len, d);
  dy_node *root = NULL;
  if (!rc) {
    rc = dy_parse(path, text, len, &s->profile_src, &root, d);
    free(text);
  }
  free(path);
  if (rc) return dsl_note(d, s->profile.pos, "the profile is named here");
  dy_node *list;
  rc = dy_expect(root, DY_MAP, "profile", "profile file", d) || dy_check_keys(root, "profile", profile_keys, d) ||
       list_of_maps(root, "devices", &list, d);
  for (int i = 0; !rc && list && i < list->n; i++) {
    dy_node *p = list->items[i];
    dsl_str name = {0};
    rc = dy_check_keys(p, "profile device", profile_device_keys, d) ||
         dy_take_req(p, "name", "profile device", &name, d);
    dsl_device *dev = NULL;
    for (int j = 0; !rc && j < s->ndevices; j++)
      if (strcmp(s->devices[j].name.text, name.text) == 0) dev = &s->devices[j];
    if (!rc && !dev)
      rc = dsl_error(d, name.pos, "profile device '%s' is not a device of schedule '%s'", name.text, s->name.text);
    if (!rc) rc = apply_profile_device(p, dev, d);
    dsl_str_free(&name);
  }
  dy_free(root);
  return rc ? -1 : 0;
}

static int load_stream(dy_node *n, dsl_stream *s, dsl_diag *d) {
  s->pos = n->pos;
  if (dy_check_keys(n, "stream", stream_keys, d)) return -1;
  if (dy_take_req(n, "name", "stream", &s->name, d)) return -1;
  return dy_take_req(n, "device", "stream", &s->device, d);
}

static int is_space(char c) { return c == ' ' || c == '\t'; }

/* A part of the rule [b, e) as its own positioned string. */
static int rule_part(const dsl_str *rule, size_t b, size_t e, dsl_str *out, dsl_diag *d) {
  out->text = dsl_strndup(rule->text + b, e - b);
  if (!out->text) return oom(d);
  out->pos = dsl_pos_at(rule, b);
  return 0;
}

/* "glob -> device" or "glob -> device.stream"; every complaint points at
 * the column inside the rule where the problem is. */
static int split_owner(const dsl_str *rule, dsl_owner *o, dsl_diag *d) {
  const char *t = rule->text;
  size_t len = strlen(t);
  o->pos = rule->pos;
  const char *arrow = strstr(t, "->");
  if (!arrow)
    return dsl_error(d, dsl_pos_at(rule, 0),
                     "owner rule '%.100s' has no '->' (write 'glob -> device' or 'glob -> device.stream')", t);
  size_t a = (size_t)(arrow - t);
  const char *again = strstr(arrow + 2, "->");
  if (again) return dsl_error(d, dsl_pos_at(rule, (size_t)(again - t)), "owner rule has a second '->'");
  size_t gb = 0, ge = a;
  while (gb < ge && is_space(t[gb])) gb++;
  while (ge > gb && is_space(t[ge - 1])) ge--;
  if (gb == ge) return dsl_error(d, dsl_pos_at(rule, a), "owner rule has no glob before '->'");
  size_t tb = a + 2, te = len;
  while (tb < te && is_space(t[tb])) tb++;
  while (te > tb && is_space(t[te - 1])) te--;
  if (tb == te) return dsl_error(d, dsl_pos_at(rule, len), "owner rule has no device after '->'");
  for (size_t i = tb; i < te; i++)
    if (is_space(t[i]))
      return dsl_error(d, dsl_pos_at(rule, i), "owner target must be 'device' or 'device.stream' without spaces");
  const char *dot = memchr(t + tb, '.', te - tb);
  size_t de = dot ? (size_t)(dot - t) : te;
  if (de == tb) return dsl_error(d, dsl_pos_at(rule, tb), "owner rule has an empty device name before '.'");
  if (dot) {
    size_t sb = de + 1;
    if (sb == te) return dsl_error(d, dsl_pos_at(rule, sb), "owner rule has an empty stream name after '.'");
    const char *dot2 = memchr(t + sb, '.', te - sb);
    if (dot2)
      return dsl_error(d, dsl_pos_at(rule, (size_t)(dot2 - t)),
                       "owner target has a second '.'; write 'device' or 'device.stream'");
  }
  if (rule_part(rule, gb, ge, &o->glob, d)) return -1;
  if (rule_part(rule, tb, de, &o->device, d)) return -1;
  if (dot && rule_part(rule, de + 1, te, &o->stream, d)) return -1;
  return 0;
}

static int load_owners(dy_node *root, dsl_schedule *s, dsl_diag *d) {
  dy_node *v = dy_need(root, "owners", "schedule", d);
  if (!v) return -1;
  dsl_str *rules = NULL;
  int n = 0;
  if (dy_take_list(v, "owners", "schedule", &rules, &n, d)) {
    dsl_strs_free(rules, n);
    return -1;
  }
  int rc = 0;
  if (n) {
    s->owners = dsl_calloc((size_t)n, sizeof *s->owners);
    if (!s->owners) rc = oom(d);
    else s->nowners = n;
  }
  for (int i = 0; rc == 0 && i < n; i++) rc = split_owner(&rules[i], &s->owners[i], d);
  dsl_strs_free(rules, n);
  return rc;
}

/* A hot_experts target, "device" or "device.stream", split like an owner
 * rule's target. */
static int split_target(const dsl_str *v, const char *key, dsl_owner *o, dsl_diag *d) {
  const char *t = v->text, *dot = strchr(t, '.');
  size_t len = strlen(t), de = dot ? (size_t)(dot - t) : len;
  int bad = de == 0 || (dot && (de + 1 == len || strchr(dot + 1, '.')));
  for (size_t i = 0; i < len && !bad; i++) bad = is_space(t[i]);
  if (bad)
    return dsl_error(d, v->pos, "'%s' in hot_experts must be 'device' or 'device.stream', not '%.100s'", key, t);
  o->pos = v->pos;
  if (rule_part(v, 0, de, &o->device, d)) return -1;
  return dot ? rule_part(v, de + 1, len, &o->stream, d) : 0;
}

static int load_hot_experts(dy_node *n, dsl_schedule *s, dsl_diag *d) {
  if (n->kind != DY_MAP)
    return dsl_error(d, n->pos, "'hot_experts' in schedule must be a mapping (stats, device, budget, cold), not a %s",
                     dy_kind_name(n));
  if (dy_check_keys(n, "hot_experts", hot_keys, d)) return -1;
  dsl_hot_experts *h = s->hot_experts = dsl_calloc(1, sizeof *h);
  if (!h) return oom(d);
  h->pos = n->pos;
  dsl_str device = {0}, cold = {0};
  int rc = dy_take_req(n, "stats", "hot_experts", &h->stats, d);
  if (!rc) rc = dy_take_req(n, "device", "hot_experts", &device, d);
  if (!rc) rc = split_target(&device, "device", &h->device, d);
  if (!rc) rc = dy_take_req(n, "budget", "hot_experts", &h->budget, d);
  if (!rc) rc = dy_check_int(&h->budget, "budget", 0, d);
  if (!rc) rc = dy_take_req(n, "cold", "hot_experts", &cold, d);
  if (!rc) rc = split_target(&cold, "cold", &h->cold, d);
  free(device.text);
  free(cold.text);
  return rc;
}

static int load_schedule(dy_node *root, dsl_schedule *s, dsl_diag *d) {
  if (root->kind != DY_MAP)
    return dsl_error(d, root->pos,
                     "a schedule description is a mapping with keys schedule, model, devices, streams, "
                     "owners and step, not a %s", dy_kind_name(root));
  /* A model given for the schedule (the arguments swapped): said at its
   * first key that only models have. */
  static const char *const model_only[] = {"extends", "params", "tensors", "blocks", "layers"};
  for (int i = 0; i < root->n && !dy_key_node(root, "schedule"); i++) {
    const dy_node *k = root->items[2 * i];
    for (size_t j = 0; j < sizeof model_only / sizeof *model_only; j++)
      if (!strcmp(k->text, model_only[j]))
        return dsl_error(d, k->pos, "this is a model (it has key '%s'), not a schedule: ds4c compile takes "
                                    "MODEL.yaml, then SCHEDULE.yaml", k->text);
  }
  if (dy_check_keys(root, "schedule", sched_keys, d)) return -1;
  if (dy_take_req(root, "schedule", "schedule", &s->name, d)) return -1;
  if (dy_take_req(root, "model", "schedule", &s->model, d)) return -1;

  dy_node *list, *v0;
  if (list_of_maps(root, "devices", &list, d)) return -1;
  if (list && list->n) {
    s->devices = dsl_calloc((size_t)list->n, sizeof *s->devices);
    if (!s->devices) return oom(d);
    s->ndevices = list->n;
    for (int i = 0; i < list->n; i++)
      if (load_device(list->items[i], &s->devices[i], d)) return -1;
  }
  if ((v0 = dy_get(root, "profile")) && load_profile(v0, s, d)) return -1;
  if (list_of_maps(root, "streams", &list, d)) return -1;
  if (list && list->n) {
    s->streams = dsl_calloc((size_t)list->n, sizeof *s->streams);
    if (!s->streams) return oom(d);
    s->nstreams = list->n;
    for (int i = 0; i < list->n; i++)
      if (load_stream(list->items[i], &s->streams[i], d)) return -1;
  }
  if (load_owners(root, s, d)) return -1;

  dy_node *v;
  if ((v = dy_get(root, "early_resolve")) &&
      dy_take_list(v, "early_resolve", "schedule", &s->early_resolve, &s->nearly_resolve, d))
    return -1;
  if ((v = dy_get(root, "submit_first")) &&
      dy_take_list(v, "submit_first", "schedule", &s->submit_first, &s->nsubmit_first, d))
    return -1;
  if ((v = dy_get(root, "priority"))) {
    if (dy_take_kvs(v, "priority", "schedule", &s->priority, &s->npriority, d)) return -1;
    for (int i = 0; i < s->npriority; i++)
      if (dy_check_int(&s->priority[i].value, "priority", LLONG_MIN, d)) return -1;
  }
  if ((v = dy_get(root, "copies")) && dy_take_kvs(v, "copies", "schedule", &s->copies, &s->ncopies, d))
    return -1;

  dy_node *step = dy_need(root, "step", "schedule", d);
  if (!step) return -1;
  if (step->kind != DY_MAP)
    return dsl_error(d, step->pos, "'step' in schedule must be a mapping (prefill, decode, prompt), not a %s",
                     dy_kind_name(step));
  if (dy_check_keys(step, "step", step_keys, d)) return -1;
  if (dy_take_opt(step, "prefill", "step", &s->step_prefill, d)) return -1;
  if (s->step_prefill.text && dy_check_int(&s->step_prefill, "prefill", 1, d)) return -1;
  if (dy_take_req(step, "decode", "step", &s->step_decode, d)) return -1;
  if (dy_check_int(&s->step_decode, "decode", 1, d)) return -1;
  if (dy_take_req(step, "prompt", "step", &s->step_prompt, d)) return -1;
  if (dy_check_int(&s->step_prompt, "prompt", 0, d)) return -1;
  if ((v = dy_get(root, "hot_experts")) && load_hot_experts(v, s, d)) return -1;
  return 0;
}

static void owner_free(dsl_owner *o) {
  free(o->glob.text);
  free(o->device.text);
  free(o->stream.text);
}

void dsl_schedule_free(dsl_schedule *s) {
  if (!s) return;
  free(s->name.text);
  free(s->model.text);
  for (int i = 0; s->devices && i < s->ndevices; i++) {
    dsl_device *dev = &s->devices[i];
    free(dev->name.text);
    free(dev->backend.text);
    free(dev->arch.text);
    free(dev->ordinal.text);
    free(dev->threads.text);
    free(dev->memory.text);
    free(dev->bandwidth.text);
    free(dev->flops.text);
    free(dev->launch.text);
    free(dev->copy_bandwidth.text);
    free(dev->copy_launch.text);
  }
  free(s->profile.text);
  dsl_source_free(s->profile_src);
  free(s->devices);
  for (int i = 0; s->streams && i < s->nstreams; i++) {
    free(s->streams[i].name.text);
    free(s->streams[i].device.text);
  }
  free(s->streams);
  for (int i = 0; s->owners && i < s->nowners; i++) owner_free(&s->owners[i]);
  free(s->owners);
  if (s->hot_experts) {
    free(s->hot_experts->stats.text);
    owner_free(&s->hot_experts->device);
    free(s->hot_experts->budget.text);
    owner_free(&s->hot_experts->cold);
    free(s->hot_experts);
  }
  dsl_strs_free(s->early_resolve, s->nearly_resolve);
  dsl_strs_free(s->submit_first, s->nsubmit_first);
  dsl_kvs_free(s->priority, s->npriority);
  dsl_kvs_free(s->copies, s->ncopies);
  free(s->step_prefill.text);
  free(s->step_decode.text);
  free(s->step_prompt.text);
  dsl_source_free(s->src);
  free(s);
}

int dsl_schedule_parse(const char *path, const char *text, size_t len, dsl_schedule **out_sched,
                       dsl_diag *d) {
  *out_sched = NULL;
  dsl_source *src;
  dy_node *root;
  if (dy_parse(path, text, len, &src, &root, d)) return -1;
  dsl_schedule *s = dsl_calloc(1, sizeof *s);
  if (!s) {
    dy_free(root);
    dsl_source_free(src);
    return oom(d);
  }
  s->src = src;
  int rc = load_schedule(root, s, d);
  dy_free(root);
  if (rc) {
    dsl_schedule_free(s);
    return -1;
  }
  *out_sched = s;
  return 0;
}

int dsl_schedule_load(const char *path, dsl_schedule **out_sched, dsl_diag *d) {
  *out_sched = NULL;
  char *text;
  size_t len;
  if (dy_read_file(path, &text, &len, d)) return -1;
  int rc = dsl_schedule_parse(path, text, len, out_sched, d);
  free(text);
  return rc;
}
