/* json_parse.h - a strict JSON (RFC 8259) parser for what ds4run writes
 * (traces, --json output), read back by ds4c calibrate and the tests: a
 * tree of values, numbers kept with their text so that they read back
 * exactly. */
#ifndef DS4_JSON_PARSE_H
#define DS4_JSON_PARSE_H

#include <stddef.h>

typedef enum json_kind { JSON_NULL, JSON_BOOL, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT } json_kind;

typedef struct json_value json_value;
struct json_value {
  json_kind kind;
  int boolean;
  double number;
  char *text;          /* STRING: the decoded UTF-8 (no NUL inside); NUMBER: its source text */
  json_value **items;  /* ARRAY, OBJECT: the elements (an object's values) */
  char **keys;         /* OBJECT: the keys, decoded */
  size_t n;
};

/* The value of text[0, len): one JSON value with only whitespace around
 * it; every string valid UTF-8 with valid escapes (no \u0000, no lone
 * surrogate), numbers in the JSON grammar, nesting at most 64 deep. NULL
 * on error, with the reason and byte offset in err. */
json_value *json_parse(const char *text, size_t len, char *err, size_t errn);
void json_free(json_value *v);

/* An object's member named key, or NULL (also when v is not an object). */
const json_value *json_get(const json_value *v, const char *key);

#endif
