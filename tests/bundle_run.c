/* bundle_run.c - see bundle_run.h. */
#include "bundle_run.h"

#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"
#include "rt.h"

void br_run(const char *bundle, int decode, int check, br_result *r) {
  rt_bundle *b = NULL;
  /* A check compares every prompt position's logits. */
  rt_status s = rt_bundle_open(bundle, &(rt_options){.every_position = check}, &b);
  ck_assert_msg(!s, "%s", rt_status_msg(s));
  ds4run_check *chk = NULL;
  if (check) {
    s = ds4run_check_open(b, &chk);
    ck_assert_msg(!s, "%s", rt_status_msg(s));
  }
  int32_t *prompt = NULL;
  int nprompt = 0;
  s = rt_default_prompt(rt_bundle_plan(b), &prompt, &nprompt);
  ck_assert_msg(!s, "%s", rt_status_msg(s));
  rt_report rep;
  s = rt_generate(b, prompt, nprompt, decode, chk ? ds4run_check_hook : NULL, chk, &rep);
  ck_assert_msg(!s, "%s: %s", bundle, rt_status_msg(s));
  memcpy(r->sha, rep.outputs_sha256, sizeof r->sha);
  ck_assert_int_le(rep.ngenerated, 64);
  r->ntokens = rep.ngenerated;
  memcpy(r->tokens, rep.generated, (size_t)rep.ngenerated * sizeof *rep.generated);
  if (chk) {
    ds4run_check_result_get(chk, &r->check);
    ds4run_check_close(chk);
  }
  free(rep.generated);
  free(prompt);
  rt_bundle_close(b);
}
