/* gpu_backend.h - the two GPU backends, `cuda` and `hip`: one vtable
 * implementation (gpu_backend.c) over the driver table of gpu_api.h. */
#ifndef DS4_GPU_BACKEND_H
#define DS4_GPU_BACKEND_H

#include "backend.h"

extern const rt_backend rt_cuda_backend;
extern const rt_backend rt_hip_backend;

#endif
