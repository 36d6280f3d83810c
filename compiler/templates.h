/* templates.h - kernel sources embedded into ds4c at build time
 * (compiler/kernels/host/<kind>.c and prelude.h, compiler/kernels/gpu/<kind>.hip
 * and prelude.h; see embed.cmake). */
#ifndef DS4_TEMPLATES_H
#define DS4_TEMPLATES_H

typedef struct ds4_template {
  const char *target; /* folder: host, gpu */
  const char *kind;   /* op kind, or "prelude" */
  const char *text;
} ds4_template;

extern const ds4_template ds4_templates[];
extern const int ds4_ntemplates;

const char *ds4_template_find(const char *target, const char *kind);

#endif
