/* pipeline.c - the whole compiler in order, the way a reader expects:
 *   expand -> infer -> place -> lower -> copies -> deps -> order -> sync -> memplan
 *   -> verify -> emit kernels, plan and text.
 * The IR can be dumped after any pass by name. ds4c_build and ds4c_compile
 * are where a compile that runs out of memory lands (ir.h): each tracks
 * the blocks allocated under it and turns the jump into the error "out of
 * memory" with nothing left allocated or written. */
#define _XOPEN_SOURCE 700
#include "pipeline.h"

#include <errno.h>
#include <ftw.h>
#include <setjmp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "emit.h"
#include "passes.h"

typedef struct pass {
  const char *name;
  int (*run)(ir_prog *, dsl_diag *);
} pass;

static const pass passes[] = {
    {"expand", pass_expand}, {"infer", pass_infer}, {"place", pass_place}, {"lower", pass_lower},
    {"copies", pass_copies}, {"deps", pass_deps},   {"order", pass_order}, {"sync", pass_sync},
    {"memplan", pass_memplan}, {"verify", pass_verify},
};
#define NPASSES ((int)(sizeof passes / sizeof *passes))

const char *const ds4c_pass_names[] = {"expand", "infer", "place",   "lower",  "copies", "deps",
                                       "order",  "sync",  "memplan", "verify", NULL};

void ds4c_prog_free(ir_prog *p) {
  if (!p) return;
  dsl_model_free((dsl_model *)p->model);
  dsl_schedule_free((dsl_schedule *)p->sched);
  ir_prog_free(p);
}

static void drop_model(void *m) { dsl_model_free(m); }
static void drop_schedule(void *s) { dsl_schedule_free(s); }

/* --dump-after names a pass (or "all"). */
static int check_dump_after(const ds4c_options *o, dsl_diag *d) {
  if (!o->dump_after || strcmp(o->dump_after, "all") == 0) return 0;
  for (int i = 0; i < NPASSES; i++)
    if (strcmp(passes[i].name, o->dump_after) == 0) return 0;
  return dsl_error(d, (dsl_pos){0}, "unknown pass '%s' for --dump-after", o->dump_after);
}

/* The model and schedule o names, loaded; nothing is left on an error. */
static int load_descriptions(const ds4c_options *o, dsl_model **m, dsl_schedule **s, dsl_diag *d) {
  *m = NULL;
  *s = NULL;
  if (check_dump_after(o, d) || dsl_model_load(o->model_path, m, d)) return -1;
  if (dsl_schedule_load(o->sched_path, s, d)) {
    dsl_model_free(*m);
    *m = NULL;
    return -1;
  }
  return 0;
}

/* Every pass over a new program of m and s, which the passes only read
 * and the caller keeps. */
static int run_passes(const ds4c_options *o, const dsl_model *m, const dsl_schedule *s, ir_prog **out_prog,
                      dsl_diag *d) {
  ir_prog *p = ir_prog_new(m, s);
  if (o->max_ops > 0 && o->max_ops < p->max_ops) p->max_ops = o->max_ops;
  p->cpu_only = o->cpu;
  p->decode_plan = o->decode_plan;
  for (int i = 0; i < NPASSES; i++) {
    if (passes[i].run(p, d)) {
      ir_prog_free(p);
      return -1;
    }
    if (o->dump_after && (strcmp(o->dump_after, "all") == 0 || strcmp(o->dump_after, passes[i].name) == 0)) {
      FILE *f = o->dump ? o->dump : stderr;
      fprintf(f, "## after %s%s\n", passes[i].name, o->decode_plan ? " (decode plan)" : "");
      ir_print(p, f);
    }
  }
  *out_prog = p;
  return 0;
}

/* setjmp's caller: every object it changes after setjmp lives outside its
 * frame, as the jump requires. */
static int passes_tracked(ir_mem *mem, const ds4c_options *o, const dsl_model *m, const dsl_schedule *s,
                          ir_prog **out_prog, dsl_diag *d) {
  if (setjmp(mem->oom)) {
    ir_mem_unwind(mem);
    *out_prog = NULL;
    return dsl_error(d, (dsl_pos){0}, "out of memory");
  }
  int rc = run_passes(o, m, s, out_prog, d);
  ir_mem_end(mem);
  return rc;
}

/* A program of m and s in a memory tracker of its own: running out of
 * memory frees what the passes allocated, never m or s. */
static int build_prog(const ds4c_options *o, const dsl_model *m, const dsl_schedule *s, ir_prog **out_prog,
                      dsl_diag *d) {
  *out_prog = NULL;
  ir_mem mem;
  ir_mem_begin(&mem);
  return passes_tracked(&mem, o, m, s, out_prog, d);
}

int ds4c_build(const ds4c_options *o, ir_prog **out_prog, dsl_diag *d) {
  dsl_model *m;
  dsl_schedule *s;
  *out_prog = NULL;
  if (load_descriptions(o, &m, &s, d)) return -1;
  if (build_prog(o, m, s, out_prog, d)) {
    dsl_model_free(m);
    dsl_schedule_free(s);
    return -1;
  }
  return 0; /* the program owns m and s now (ds4c_prog_free) */
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(path);
}

static void remove_tree(const char *path) { nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS); }

static int write_text(const plan *pl, const char *path, dsl_diag *d) {
  FILE *f = fopen(path, "w");
  if (!f) return dsl_error(d, (dsl_pos){0}, "cannot write %s: %s", path, strerror(errno));
  if (plan_text_write(pl, f)) {
    fclose(f);
    return dsl_error(d, (dsl_pos){0}, "cannot write %s: out of memory", path);
  }
  if (fclose(f)) return dsl_error(d, (dsl_pos){0}, "cannot write %s: %s", path, strerror(errno));
  return 0;
}

/* The code object targets: the list asked for, or else each device's arch
 * once, in device order (cpu devices: host). Every device's arch must be
 * among them. */
typedef struct target_list {
  char *names[16];
  int n;
} target_list;

static void targets_free(target_list *t) {
  for (int i = 0; i < t->n; i++) ir_xfree(t->names[i]);
  t->n = 0;
}

static int target_add(target_list *t, const char *name, size_t len, dsl_diag *d) {
  for (int i = 0; i < t->n; i++)
    if (strlen(t->names[i]) == len && strncmp(t->names[i], name, len) == 0) return 0;
  int known = 0;
  for (int i = 0; emit_known_targets[i] && !known; i++)
    known = strlen(emit_known_targets[i]) == len && strncmp(emit_known_targets[i], name, len) == 0;
  if (!known) {
    char list[256] = "";
    for (int i = 0; emit_known_targets[i]; i++)
      snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", emit_known_targets[i]);
    return dsl_error(d, (dsl_pos){0}, "unknown target '%.*s' (known: %s)", (int)len, name, list);
  }
  if (t->n == (int)(sizeof t->names / sizeof *t->names)) return dsl_error(d, (dsl_pos){0}, "too many targets");
  t->names[t->n] = ir_xrealloc(NULL, len + 1);
  memcpy(t->names[t->n], name, len);
  t->names[t->n++][len] = 0;
  return 0;
}

static const char *device_target(const ir_device *dv) {
  return dv->backend == PLAN_BACKEND_CPU ? "host" : dv->arch;
}

static int resolve_targets(const ir_prog *p, const char *asked, target_list *t, dsl_diag *d) {
  t->n = 0;
  if (!asked) {
    for (int i = 0; i < p->ndevices; i++) {
      const char *name = device_target(&p->devices[i]);
      if (target_add(t, name, strlen(name), d)) return -1;
    }
    return 0;
  }
  for (const char *c = asked;;) {
    const char *end = strchr(c, ',');
    size_t len = end ? (size_t)(end - c) : strlen(c);
    if (!len) return dsl_error(d, (dsl_pos){0}, "empty name in the target list '%s'", asked);
    if (target_add(t, c, len, d)) return -1;
    if (!end) break;
    c = end + 1;
  }
  for (int i = 0; i < p->ndevices; i++) {
    const char *name = device_target(&p->devices[i]);
    int found = 0;
    for (int j = 0; j < t->n && !found; j++) found = strcmp(t->names[j], name) == 0;
    if (!found)
      return dsl_error(d, p->devices[i].pos, "device '%s' needs target %s, which the target list '%s' leaves out",
                       p->devices[i].name, name, asked);
  }
  return 0;
}

static int emit_bundle(ir_prog *p, const char *dir, const ds4c_options *o, emit_cache *cache, dsl_diag *d) {
  target_list t;
  if (resolve_targets(p, o->targets, &t, d)) {
    targets_free(&t);
    return -1;
  }
  emit_kernels k;
  int rc = emit_kernels_build_cached(p, dir, t.names, t.n, cache, &k, d);
  targets_free(&t);
  if (!rc) {
    plan pl;
    emit_plan(p, &k, &pl);
    char path[4096 + 32]; /* dir is at most 4096 bytes (ds4c_compile) */
    snprintf(path, sizeof path, "%s/plan.ds4p", dir);
    rt_status st = plan_write(&pl, path);
    if (st) {
      rc = dsl_error(d, (dsl_pos){0}, "%s", rt_status_msg(st));
      rt_status_free(st);
    }
    snprintf(path, sizeof path, "%s/plan.txt", dir);
    if (!rc) rc = write_text(&pl, path, d);
    plan_free(&pl);
  }
  emit_kernels_free(&k);
  return rc;
}

int ds4c_make_parents(const char *path, dsl_diag *d) {
  char buf[4096];
  snprintf(buf, sizeof buf, "%s", path);
  for (char *c = buf + 1; *c; c++) {
    if (*c != '/') continue;
    *c = 0;
    if (mkdir(buf, 0777) && errno != EEXIST)
      return dsl_error(d, (dsl_pos){0}, "cannot create %s: %s", buf, strerror(errno));
    *c = '/';
  }
  return 0;
}

/* A compile under way: what its jump out needs to undo. */
typedef struct compile_state {
  ir_mem mem;
  char stage[4096]; /* the staging folder's path; "" until it is known */
} compile_state;

/* Build in DIR.tmp-PID, then swap it into place: an error never leaves
 * a half-written bundle at DIR, and an earlier bundle stays until the new
 * one is complete. */
/* The prefill plan p and the decode plan q share every weight and state
 * tensor: the same bytes at the same offset of the same device (memplan
 * lays them out first, and their shapes do not depend on the step), and
 * one arena per device that fits either plan's step. */
static int share_state(ir_prog *p, ir_prog *q, dsl_diag *d) {
  if (p->ntensors != q->ntensors || p->ndevices != q->ndevices)
    return dsl_error(d, (dsl_pos){0}, "internal error: the prefill and decode plans differ in tensors or devices");
  for (int t = 0; t < p->ntensors; t++) {
    const ir_tensor *a = &p->tensors[t], *b = &q->tensors[t];
    if (a->role != PLAN_WEIGHT && a->role != PLAN_STATE) continue;
    if (strcmp(a->path, b->path) || a->device != b->device || a->offset != b->offset || a->bytes != b->bytes)
      return dsl_error(d, a->pos, "internal error: %s '%s' is not where the decode plan has it", a->role == PLAN_WEIGHT ? "weight" : "state", a->path);
  }
  for (int i = 0; i < p->ndevices; i++) {
    int64_t most = p->devices[i].arena_bytes > q->devices[i].arena_bytes ? p->devices[i].arena_bytes
                                                                          : q->devices[i].arena_bytes;
    p->devices[i].arena_bytes = q->devices[i].arena_bytes = most;
  }
  return 0;
}

/* Two programs (either may be NULL) and the descriptions they share, held
 * by the compile's memory tracker. */
static void free_plans(ir_prog *p, ir_prog *q, dsl_model *m, dsl_schedule *s) {
  ir_prog_free(p);
  ir_prog_free(q);
  ir_mem_unhold(m);
  ir_mem_unhold(s);
  dsl_model_free(m);
  dsl_schedule_free(s);
}

/* Both plans of one bundle, built from one load of the descriptions and
 * sharing their state. The descriptions stay held by the compile's memory
 * tracker (freed if memory runs out later) until release_plans. */
static int build_plans(const ds4c_options *o, ir_prog **out_p, ir_prog **out_q, dsl_diag *d) {
  dsl_model *m;
  dsl_schedule *s;
  ir_prog *p = NULL, *q = NULL;
  ds4c_options od = *o;
  od.decode_plan = 1;
  if (load_descriptions(o, &m, &s, d)) return -1;
  ir_mem_hold(drop_model, m);
  ir_mem_hold(drop_schedule, s);
  if (build_prog(o, m, s, &p, d) || build_prog(&od, m, s, &q, d) || share_state(p, q, d)) {
    free_plans(p, q, m, s);
    return -1;
  }
  *out_p = p;
  *out_q = q;
  return 0;
}

/* The programs of build_plans and the descriptions they share. */
static void release_plans(ir_prog *p, ir_prog *q) {
  free_plans(p, q, (dsl_model *)p->model, (dsl_schedule *)p->sched);
}

static int compile(compile_state *c, const ds4c_options *o, dsl_diag *d) {
  char old[4096], sub[4096 + 16];
  if (strlen(o->out_dir) > 4000)
    return dsl_error(d, (dsl_pos){0}, "output path is longer than 4000 bytes: %.60s...", o->out_dir);
  ir_prog *p, *q;
  if (build_plans(o, &p, &q, d)) return -1;
  char *stage = c->stage;
  snprintf(stage, sizeof c->stage, "%s.tmp-%ld", o->out_dir, (long)getpid());
  snprintf(old, sizeof old, "%s.old-%ld", o->out_dir, (long)getpid());
  snprintf(sub, sizeof sub, "%s/decode", stage);
  remove_tree(stage);
  int rc = ds4c_make_parents(o->out_dir, d);
  if (!rc && mkdir(stage, 0777)) rc = dsl_error(d, (dsl_pos){0}, "cannot create %s: %s", stage, strerror(errno));
  if (!rc && mkdir(sub, 0777)) rc = dsl_error(d, (dsl_pos){0}, "cannot create %s: %s", sub, strerror(errno));
  emit_cache cache;
  emit_cache_init(&cache, o->cache_dir);
  if (!rc) rc = emit_bundle(p, stage, o, &cache, d);
  if (!rc) rc = emit_bundle(q, sub, o, &cache, d);
  emit_cache_free(&cache);
  release_plans(p, q);
  if (!rc) {
    struct stat sb;
    int had_old = stat(o->out_dir, &sb) == 0;
    if (had_old && rename(o->out_dir, old))
      rc = dsl_error(d, (dsl_pos){0}, "cannot replace %s: %s", o->out_dir, strerror(errno));
    else if (rename(stage, o->out_dir)) {
      rc = dsl_error(d, (dsl_pos){0}, "cannot create %s: %s", o->out_dir, strerror(errno));
      if (had_old) rename(old, o->out_dir);
    } else if (had_old) {
      remove_tree(old);
    }
  }
  if (rc) remove_tree(stage);
  return rc ? -1 : 0;
}

static int compile_tracked(compile_state *c, const ds4c_options *o, dsl_diag *d) {
  if (setjmp(c->mem.oom)) {
    ir_mem_unwind(&c->mem);
    if (c->stage[0]) remove_tree(c->stage);
    return dsl_error(d, (dsl_pos){0}, "out of memory");
  }
  int rc = compile(c, o, d);
  ir_mem_end(&c->mem);
  return rc;
}

int ds4c_compile(const ds4c_options *o, dsl_diag *d) {
  compile_state c;
  c.stage[0] = 0;
  ir_mem_begin(&c.mem);
  return compile_tracked(&c, o, d);
}
