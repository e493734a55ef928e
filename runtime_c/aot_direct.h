/* The float depthwise convolution's call (runtime_c/aot_direct.c). */
#ifndef AOT_DIRECT_H
#define AOT_DIRECT_H
#include "aot_core.h"
#include "aot_gemm.h"
/* Depthwise convolution (runtime_c/aot_direct.c): plane p = f * images + i (filter f, image i) has output
   y[p*OH*OW + oh*OW + ow] = sum over kh, kw of w[f*KH*KW + kh*KW + kw] * x[x_planes[p] + ih*x_row + iw*x_col],
   ih = oh*SH + kh*DH - PH, iw = ow*SW + kw*DW - PW, zero outside H x W (x_planes: any order, e.g. a channel shuffle's).
   Tasks are planes / tasks planes each; after a run of tasks [t0, t1), epilogue(epilogue_ctx, t0, t1) runs when not
   NULL. Threads take the tasks from the shared counter next (0 in a fresh call): run aot_depthwise_run(d, 0, tasks)
   on any split of [0, tasks), or on one thread.
   With steps set (epilogue then NULL), every output goes through them before it is stored, as aot_gemm's do with C's
   elements: plane p is C's batch entry p / (filters * images), row p / images % filters, and its outputs columns
   (p % images) * OH * OW + oh * OW + ow; a step's operand is one value per plane or one per output (n: 0 or 1). */
/* floats of the stack buffer holding a band of padded input rows (32 KB: a 112-wide plane's rows stay in L1) */
#define AOT_DEPTHWISE_BUFFER 8192
/* multiply-adds a thread takes at once at least (whole tasks, at least one), and the fewest claims a call's tasks
   make (so that they share out between threads): 16K multiply-adds are ~1 us, a claim ~20 ns */
#define AOT_DEPTHWISE_CLAIM_WORK 16384L
#define AOT_DEPTHWISE_MIN_CLAIMS 16
/* the most steps a fused epilogue has */
#define AOT_DEPTHWISE_MAX_STEPS 8
/* the largest window (KH * KW) it takes: 7 x 7 */
#define AOT_DEPTHWISE_MAX_TAPS 49
/* and the largest stride */
#define AOT_DEPTHWISE_MAX_STRIDE 4
typedef struct {
  const float *x;
  const int *x_planes;
  int images;
  long x_row;
  int H, W;
  const float *w;
  int KH, KW, SH, SW, PH, PW;
  float *y;
  int OH, OW, planes, tasks;
  aot_task epilogue;
  void *epilogue_ctx;
  int next; /* the next task no thread has taken */
  const aot_gemm_step *steps;
  int nsteps, filters;
  int DH, DW; /* dilation (0 reads as 1): tap (kh, kw) at kh * DH, kw * DW; small planes and lanes take none */
  long x_col; /* an input row's column stride (0 reads as 1: channels-last input has the channels'); rows only */
} aot_depthwise;
__attribute__((visibility("hidden"))) int aot_depthwise_band_rows(const aot_depthwise *d);
__attribute__((visibility("hidden"))) void aot_depthwise_run(void *d, int start, int end);
#endif
