/* ds4run.c - the command line: open a bundle, generate greedily through its
 * plan, print what ran (for people, or --json for scripts), optionally
 * checking every step against the float64 reference. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ds4run_check.h"
#include "rt.h"
#include "sha256.h"

enum { EXIT_FAIL = 1, EXIT_CHECK = 2, EXIT_USAGE = 64 };

static const char usage_text[] =
    "usage: ds4run BUNDLE [--steps N] [--check] [--prompt 1,2,3] [--seed S]\n"
    "              [--weights PATH] [--threads N] [--json]\n"
    "       ds4run --help\n"
    "\n"
    "Replays BUNDLE's plan: prefills the prompt (default: the plan's seeded\n"
    "prompt) in chunks of the plan's token slots, then runs N greedy decode\n"
    "steps (default 8).\n"
    "\n"
    "  --steps N       decode steps after the prefill\n"
    "  --check         compare every step with the float64 reference\n"
    "  --prompt IDS    comma-separated token ids\n"
    "  --seed S        weight generator seed (default: the plan's)\n"
    "  --weights PATH  weights from a safetensors file, or from every\n"
    "                  *.safetensors file of directory PATH (default: all\n"
    "                  from the seeded generator)\n"
    "  --threads N     threads per cpu device (default: the plan's)\n"
    "  --json          print the results as one JSON object\n"
    "\n"
    "Exit status: 0 ok, 1 error, 2 check failed, 64 usage.\n";

typedef struct cli {
  const char *bundle;
  int steps;
  int check;
  int json;
  uint64_t seed;
  const char *weights;
  int threads;
  int32_t *prompt;
  int nprompt;
} cli;

static int usage_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "ds4run: error: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n\n%s", usage_text);
  va_end(ap);
  return EXIT_USAGE;
}

static int parse_int(const char *s, long long lo, long long hi, long long *out) {
  if (!s || !*s) return -1;
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || *end || v < lo || v > hi) return -1;
  *out = v;
  return 0;
}

static int parse_prompt(const char *s, cli *c) {
  int n = 1;
  for (const char *q = s; *q; q++) n += *q == ',';
  c->prompt = malloc((size_t)n * sizeof *c->prompt);
  if (!c->prompt) return -1;
  char *copy = strdup(s);
  if (!copy) return -1;
  int k = 0, bad = 0;
  char *save = NULL;
  for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    long long v;
    if (parse_int(tok, 0, INT32_MAX, &v)) {
      bad = 1;
      break;
    }
    c->prompt[k++] = (int32_t)v;
  }
  free(copy);
  if (bad || k == 0 || k != n) return -1;
  c->nprompt = k;
  return 0;
}

/* 0: parsed; otherwise the exit status (usage printed). */
static int parse_args(int argc, char **argv, cli *c, int *out_help) {
  *out_help = 0;
  c->steps = 8;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    long long v;
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      *out_help = 1;
      return 0;
    } else if (!strcmp(a, "--check")) {
      c->check = 1;
    } else if (!strcmp(a, "--json")) {
      c->json = 1;
    } else if (!strcmp(a, "--steps")) {
      if (parse_int(i + 1 < argc ? argv[++i] : NULL, 0, 1000000, &v))
        return usage_error("--steps needs a count >= 0");
      c->steps = (int)v;
    } else if (!strcmp(a, "--threads")) {
      if (parse_int(i + 1 < argc ? argv[++i] : NULL, 1, 4096, &v))
        return usage_error("--threads needs a count >= 1");
      c->threads = (int)v;
    } else if (!strcmp(a, "--seed")) {
      const char *s = i + 1 < argc ? argv[++i] : NULL;
      char *end;
      errno = 0;
      unsigned long long u = s && *s && *s != '-' ? strtoull(s, &end, 0) : 0;
      if (!s || !*s || *s == '-' || errno || *end || u == 0)
        return usage_error("--seed needs a nonzero unsigned integer");
      c->seed = u;
    } else if (!strcmp(a, "--weights")) {
      if (i + 1 >= argc || !*argv[i + 1] || c->weights)
        return usage_error("--weights needs one safetensors file or directory");
      c->weights = argv[++i];
    } else if (!strcmp(a, "--prompt")) {
      if (i + 1 >= argc || c->prompt || parse_prompt(argv[++i], c))
        return usage_error("--prompt needs comma-separated token ids, e.g. --prompt 1,2,3");
    } else if (a[0] == '-' && a[1]) {
      return usage_error("unknown option %s", a);
    } else if (c->bundle) {
      return usage_error("more than one bundle given (%s, %s)", c->bundle, a);
    } else {
      c->bundle = a;
    }
  }
  if (!c->bundle) return usage_error("no bundle given");
  return 0;
}

static void json_string(const char *s) {
  putchar('"');
  for (; *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\')
      printf("\\%c", ch);
    else if (ch < 0x20)
      printf("\\u%04x", ch);
    else
      putchar(ch);
  }
  putchar('"');
}

static int fail(rt_status s) {
  fprintf(stderr, "ds4run: error: %s\n", rt_status_msg(s));
  rt_status_free(s);
  return EXIT_FAIL;
}

static void print_weights_human(const rt_weights_info *w) {
  if (!w->path) {
    printf("weights:   %u tensors from the generator (seed %llu)\n", w->from_generator,
           (unsigned long long)w->seed);
    return;
  }
  if (w->files == 1)
    printf("weights:   %u tensors from 1 file %s", w->from_checkpoint, w->file);
  else
    printf("weights:   %u tensors from %u files under %s", w->from_checkpoint, w->files, w->path);
  printf("; %u from the generator\n", w->from_generator);
}

static void print_weights_json(const rt_weights_info *w) {
  printf(", \"weights\": {\"path\": ");
  if (w->path)
    json_string(w->path);
  else
    printf("null");
  printf(", \"files\": %u, \"from_checkpoint\": %u, \"from_generator\": %u, \"seed\": %llu}",
         w->files, w->from_checkpoint, w->from_generator, (unsigned long long)w->seed);
}

static void print_human(const cli *c, const plan *p, const rt_weights_info *w, const rt_report *r,
                        int nprefill, int nprompt, const ds4run_check_result *chk) {
  printf("bundle:    %s\n", c->bundle);
  printf("model:     %s   schedule: %s\n", plan_str(p, p->info.model), plan_str(p, p->info.schedule));
  for (uint32_t d = 0; d < p->ndevices; d++) {
    const plan_device *pd = &p->devices[d];
    static const char *backends[] = {"cpu", "hip", "cuda"};
    printf("device:    %s (%s, %s", plan_str(p, pd->name),
           pd->backend < 3 ? backends[pd->backend] : "?", plan_str(p, pd->arch));
    if (pd->backend == PLAN_BACKEND_CPU)
      printf(", %d threads", c->threads ? c->threads : (int)(pd->threads ? pd->threads : 1));
    printf(", arena %llu bytes)\n", (unsigned long long)pd->arena_bytes);
  }
  print_weights_human(w);
  printf("steps:     %d prefill (%d prompt tokens, %u slots) + %d decode = %d\n", nprefill, nprompt,
         p->info.tokens, r->steps - nprefill, r->steps);
  printf("tokens:    %d processed\n", r->tokens);
  printf("time:      %.3f ms per step (median), %.3f ms total\n", r->seconds_median * 1e3,
         r->seconds_total * 1e3);
  printf("generated:");
  for (int i = 0; i < r->ngenerated; i++) printf(" %d", r->generated[i]);
  printf("\n");
  if (chk)
    printf("check:     %d steps vs float64 reference, max rel err %.3g (bound %.3g), "
           "%d token mismatches: %s\n",
           chk->steps, chk->max_rel_err, chk->bound, chk->token_mismatches,
           chk->passed ? "PASS" : "FAIL");
  char hex[65];
  rt_hex(r->outputs_sha256, 32, hex);
  printf("outputs sha256: %s\n", hex);
}

static void print_json(const cli *c, const plan *p, const rt_weights_info *w, const rt_report *r,
                       int nprefill, int nprompt, const ds4run_check_result *chk) {
  printf("{\"bundle\": ");
  json_string(c->bundle);
  printf(", \"model\": ");
  json_string(plan_str(p, p->info.model));
  printf(", \"schedule\": ");
  json_string(plan_str(p, p->info.schedule));
  printf(", \"devices\": [");
  for (uint32_t d = 0; d < p->ndevices; d++) {
    const plan_device *pd = &p->devices[d];
    static const char *backends[] = {"cpu", "hip", "cuda"};
    printf("%s{\"name\": ", d ? ", " : "");
    json_string(plan_str(p, pd->name));
    printf(", \"backend\": \"%s\", \"arch\": ", pd->backend < 3 ? backends[pd->backend] : "?");
    json_string(plan_str(p, pd->arch));
    printf(", \"arena_bytes\": %llu}", (unsigned long long)pd->arena_bytes);
  }
  printf("]");
  print_weights_json(w);
  printf(", \"prompt_tokens\": %d, \"slots\": %u, \"prefill_steps\": %d, \"decode_steps\": %d",
         nprompt, p->info.tokens, nprefill, r->steps - nprefill);
  printf(", \"steps\": %d, \"tokens\": %d, \"seconds_median\": %.9g, \"seconds_total\": %.9g",
         r->steps, r->tokens, r->seconds_median, r->seconds_total);
  printf(", \"generated\": [");
  for (int i = 0; i < r->ngenerated; i++) printf("%s%d", i ? ", " : "", r->generated[i]);
  printf("]");
  if (chk)
    printf(", \"check\": {\"steps\": %d, \"max_rel_err\": %.9g, \"bound\": %.9g, "
           "\"token_mismatches\": %d, \"passed\": %s}",
           chk->steps, chk->max_rel_err, chk->bound, chk->token_mismatches,
           chk->passed ? "true" : "false");
  char hex[65];
  rt_hex(r->outputs_sha256, 32, hex);
  printf(", \"outputs_sha256\": \"%s\"}\n", hex);
}

static int run(cli *c) {
  rt_options opts = {.weight_seed = c->seed, .threads = c->threads, .weights = c->weights};
  rt_bundle *b = NULL;
  rt_status s = rt_bundle_open(c->bundle, &opts, &b);
  if (s) return fail(s);
  const plan *p = rt_bundle_plan(b);
  if (!c->prompt) {
    s = rt_default_prompt(p, &c->prompt, &c->nprompt);
    if (s) {
      rt_bundle_close(b);
      return fail(s);
    }
  }
  ds4run_check *chk = NULL;
  if (c->check) {
    s = ds4run_check_open(b, &chk);
    if (s) {
      rt_bundle_close(b);
      return fail(s);
    }
  }
  rt_report r;
  s = rt_generate(b, c->prompt, c->nprompt, c->steps, chk ? ds4run_check_hook : NULL, chk, &r);
  if (s) {
    if (chk) ds4run_check_close(chk);
    rt_bundle_close(b);
    return fail(s);
  }
  ds4run_check_result res;
  if (chk) ds4run_check_result_get(chk, &res);
  int nprefill = (c->nprompt + (int)p->info.tokens - 1) / (int)p->info.tokens;
  rt_weights_info w;
  rt_bundle_weights(b, &w);
  if (c->json)
    print_json(c, p, &w, &r, nprefill, c->nprompt, chk ? &res : NULL);
  else
    print_human(c, p, &w, &r, nprefill, c->nprompt, chk ? &res : NULL);
  fflush(stdout);
  int rc = chk && !res.passed ? EXIT_CHECK : 0;
  free(r.generated);
  if (chk) ds4run_check_close(chk);
  rt_bundle_close(b);
  return rc;
}

int main(int argc, char **argv) {
  cli c = {0};
  int help;
  int rc = parse_args(argc, argv, &c, &help);
  if (!rc && help) {
    fputs(usage_text, stdout);
  } else if (!rc) {
    rc = run(&c);
  }
  free(c.prompt);
  return rc;
}
