/* dsl_yaml.h - private to dsl/ (not part of the dsl.h contract): a small
 * YAML tree built from libyaml events, each node with its 1-based position,
 * and the schema helpers that the model and schedule loaders share. */
#ifndef DS4_DSL_YAML_H
#define DS4_DSL_YAML_H

#include "dsl.h"

/* Limits on what a description may be; each is an error, never a crash.
 * The nodes (scalars, lists and mappings) bound the loader's memory, about
 * 100 bytes a node: 16 MiB of "0," would otherwise take a gigabyte. The
 * entries of one list or mapping bound the work of the checks that compare
 * entries pairwise (duplicate params, layer names). The full
 * DeepSeek-V4-Flash description has 6200 nodes and at most 82 entries in
 * one collection. */
#define DSL_MAX_FILE_BYTES ((size_t)16 << 20)
#define DSL_MAX_DEPTH 64
#define DSL_MAX_NODES (1 << 20)
#define DSL_MAX_ENTRIES 16384

typedef enum dy_kind { DY_SCALAR, DY_SEQ, DY_MAP } dy_kind;

typedef struct dy_node {
  dy_kind kind;
  dsl_pos pos;
  char *text;   /* scalar only; NUL-terminated; stolen by dy_take_str */
  int plain;    /* scalar written without quotes or block style */
  struct dy_node **items; /* seq: elements; map: key, value, key, value... */
  int n;                  /* seq: element count; map: pair count */
  int nitems, cap;        /* used and allocated slots in items */
} dy_node;

/* Copies text into a new dsl_source (NUL-terminated) and parses one YAML
 * document into *out_root. On error d holds the message and nothing is
 * allocated. */
int dy_parse(const char *path, const char *text, size_t len, dsl_source **out_src,
             dy_node **out_root, dsl_diag *d);
void dy_free(dy_node *n);
void dsl_source_free(dsl_source *src);

/* Reads a whole file (with the size limit) for the *_load entry points. */
int dy_read_file(const char *path, char **out_text, size_t *out_len, dsl_diag *d);

const char *dy_kind_name(const dy_node *n);
/* A plain empty scalar, "~", "null" or "Null"/"NULL": YAML's null. */
int dy_is_null(const dy_node *n);

/* Checks that every key of map is one of keys (NULL-terminated); what names
 * the mapping in messages ("tensor", "device"). */
/* The key node `key` of map, or NULL: for messages at the key itself. */
const dy_node *dy_key_node(const dy_node *map, const char *key);
int dy_check_keys(const dy_node *map, const char *what, const char *const *keys, dsl_diag *d);
/* The value for key, or NULL. */
dy_node *dy_get(const dy_node *map, const char *key);
/* The value for a required key; error at the mapping when it is missing. */
dy_node *dy_need(const dy_node *map, const char *key, const char *what, dsl_diag *d);

/* Expect a mapping / sequence (key names the field in messages). */
int dy_expect(const dy_node *n, dy_kind kind, const char *key, const char *what, dsl_diag *d);
/* Moves a non-empty scalar's text into out (the node loses it). */
int dy_take_str(dy_node *n, const char *key, const char *what, dsl_str *out, dsl_diag *d);
/* Same for an optional key: absent leaves out zeroed. */
int dy_take_opt(const dy_node *map, const char *key, const char *what, dsl_str *out,
                dsl_diag *d);
/* A required key's scalar. */
int dy_take_req(const dy_node *map, const char *key, const char *what, dsl_str *out,
                dsl_diag *d);
/* A list of scalars (a YAML sequence) into a new array. */
int dy_take_list(dy_node *n, const char *key, const char *what, dsl_str **out, int *out_n,
                 dsl_diag *d);
/* A mapping of scalar keys to scalar values into a new dsl_kv array. */
int dy_take_kvs(dy_node *n, const char *key, const char *what, dsl_kv **out, int *out_n,
                dsl_diag *d);
/* The same for a model's params, whose values may also be mappings of
 * scalars (dsl_kv.fields). */
int dy_take_params(dy_node *n, const char *what, dsl_kv **out, int *out_n, dsl_diag *d);

/* Value checks on loaded scalars; errors list the valid choices. */
int dy_check_choice(const dsl_str *s, const char *key, const char *const *choices, dsl_diag *d);
int dy_check_int(const dsl_str *s, const char *key, long long min, dsl_diag *d);
/* min_kind: 0 any finite number, 1 zero or more, 2 more than zero. */
int dy_check_number(const dsl_str *s, const char *key, int min_kind, dsl_diag *d);
/* [A-Za-z_][A-Za-z0-9_]* */
int dy_is_ident(const char *s);

void dsl_str_free(dsl_str *s);
void dsl_kvs_free(dsl_kv *kv, int n);
void dsl_strs_free(dsl_str *s, int n);

/* Allocation goes through these so that tests can fail the N-th one.
 * dsl_alloc_should_fail is a weak hook returning 0; a test may define its
 * own. Failure is reported as "out of memory" by the callers. */
int dsl_alloc_should_fail(void);
void *dsl_malloc(size_t n);
void *dsl_calloc(size_t n, size_t size);
void *dsl_realloc(void *p, size_t n);
char *dsl_strndup(const char *s, size_t n);

#endif
