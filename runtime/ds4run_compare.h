/* ds4run_compare.h - `ds4run compare A B` (ds4run_compare.c), and the
 * option parsers of ds4run.c it shares. */
#ifndef DS4_DS4RUN_COMPARE_H
#define DS4_DS4RUN_COMPARE_H

#include <stdint.h>

/* argv[0] is "compare". Returns the exit status: 0 every run gave A's
 * first run's outputs, 1 one did not, 2 an error, 64 usage. */
int ds4run_compare_main(int argc, char **argv);

/* 0 and *out: s is a decimal integer in [lo, hi]; -1 otherwise. */
int ds4run_parse_int(const char *s, long long lo, long long hi, long long *out);
/* 0 and *out_ids (caller frees), *out_n: s is comma-separated token ids
 * (each in [0, INT32_MAX]); -1 otherwise. */
int ds4run_parse_ids(const char *s, int32_t **out_ids, int *out_n);
/* 0 and *out: s is a nonzero unsigned integer (decimal, 0x hex or octal);
 * -1 otherwise. */
int ds4run_parse_seed(const char *s, uint64_t *out);

#endif
