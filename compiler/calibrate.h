/* calibrate.h - `ds4c calibrate`: a device profile (bandwidth, FLOP rate,
 * launch cost, copy rate and cost) fitted to a ds4run trace of a bundle,
 * from the bytes and FLOPs the bundle's plans charge each op (WORK), with
 * the steps the old and the new profile predict beside the measured ones. */
#ifndef DS4_CALIBRATE_H
#define DS4_CALIBRATE_H

#include <stdio.h>

#include "status.h"

typedef struct calib_options {
  const char *trace;   /* a trace ds4run --trace wrote */
  const char *bundle;  /* the bundle it ran; NULL: the one the trace names */
  const char *out;     /* the profile file to write */
  const char *name;    /* the profile's name; NULL: the schedule's, "-calibrated" */
} calib_options;

/* One device's fitted profile; has_copy when its streams ran copies of two
 * sizes or more (else copy_* are 0 and the profile states none). */
typedef struct calib_device {
  double bandwidth, flops, launch;
  int has_copy;
  double copy_bandwidth, copy_launch;
  int launches, copies; /* the (plan, op) pairs fitted */
} calib_device;

/* The launch model's fit to samples of bytes b, FLOPs f and seconds t:
 * launch + max(b / bandwidth, f / flops), least squares on the logarithm
 * (each sample weighs by its relative error). n >= 1. */
void calib_fit_launches(const double *b, const double *f, const double *t, int n, calib_device *out);
/* The copy model's: copy_launch + b / copy_bandwidth; needs two sizes. */
int calib_fit_copies(const double *b, const double *t, int n, calib_device *out);

/* Reads the trace and the bundle's plans, fits every device, writes the
 * profile (a temporary file renamed into place) and the report to
 * report. Nothing is written when it fails. */
rt_status calib_run(const calib_options *o, FILE *report);

#endif
