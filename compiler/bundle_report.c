/* bundle_report.c - a review report per plan of a bundle (bundle_report.h). */
#include "bundle_report.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static rt_status write_failed(void) { return rt_status_make("writing the report: %s", strerror(errno)); }

rt_status brep_write(const char *bundle_dir, int json, brep_plan_fn one, FILE *out) {
  char *text = NULL, *dtext = NULL, *decode = NULL;
  size_t len = 0, dlen = 0;
  rt_status st = one(bundle_dir, json, &text, &len);
  if (!st && asprintf(&decode, "%s/decode", bundle_dir) < 0) {
    decode = NULL;
    st = rt_status_make("out of memory");
  }
  if (!st && access(decode, F_OK) == 0) st = one(decode, json, &dtext, &dlen);
  if (!st && !dtext && fwrite(text, 1, len, out) != len) st = write_failed();
  if (!st && dtext && json) {
    /* "...\n}\n" then "{...\n}\n": the second becomes the first's last member. */
    if (len < 3 || dlen < 1) st = rt_status_make("internal error: a JSON report that is not an object");
    else if (fprintf(out, "%.*s,\n  \"decode\": %.*s}\n", (int)(len - 3), text, (int)(dlen - 1), dtext) < 0)
      st = write_failed();
  }
  if (!st && dtext && !json && fprintf(out, "%s\n%s", text, dtext) < 0) st = write_failed();
  free(decode);
  free(text);
  free(dtext);
  return st;
}
