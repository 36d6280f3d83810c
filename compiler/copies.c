/* copies.c - cross-device reads. Every op must read tensors that live on
 * its own device; this pass is where copies between devices are created.
 * Schedules with a single device, the only kind accepted so far, never
 * need one, so a cross-device read is reported, not silently allowed. */
#include "passes.h"

int pass_copies(ir_prog *p, dsl_diag *d) {
  for (int i = 0; i < p->nops; i++) {
    const ir_op *op = &p->ops[i];
    for (int j = 0; j < op->nin; j++) {
      const ir_tensor *t = &p->tensors[op->in[j]];
      if (t->device != op->device)
        return dsl_error(d, op->in_pos[j],
                         "op '%s' on device '%s' reads '%s' from device '%s': cross-device copies are not "
                         "supported yet",
                         op->path, p->devices[op->device].name, t->path, p->devices[t->device].name);
    }
  }
  return 0;
}
