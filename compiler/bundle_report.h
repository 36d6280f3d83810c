/* bundle_report.h - the review reports (`ds4c inspect`, `ds4c explain`)
 * over every plan of a bundle: the prefill plan's report of BUNDLE, then,
 * when the bundle has one, the decode plan's of BUNDLE/decode. */
#ifndef DS4_BUNDLE_REPORT_H
#define DS4_BUNDLE_REPORT_H

#include <stddef.h>
#include <stdio.h>

#include "status.h"

/* One plan's report: of the plan in dir, as text or as one JSON object
 * ending "\n}\n", into *out_text (malloc'd, *out_len bytes); nothing on
 * failure. */
typedef rt_status (*brep_plan_fn)(const char *dir, int json, char **out_text, size_t *out_len);

/* Both plans' reports to out, or nothing when either fails: in text one
 * after the other, a blank line between; in JSON the decode plan's object
 * as the member "decode" of the prefill plan's. */
rt_status brep_write(const char *bundle_dir, int json, brep_plan_fn one, FILE *out);

#endif
