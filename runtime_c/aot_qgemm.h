#ifndef AOT_QGEMM_H
#define AOT_QGEMM_H
#include <stdint.h>
#include "aot_qim2col.h"
/* The int8 contraction (runtime_c/aot_qgemm.c): C[m][n] = sum_k (A[m][k] - a_zero) * B[k][n] + bias[n] in int32,
   A uint8 (or int8: a_signed) at a + m*lda + k, B int8 packed by codegen/lower/quant.py as [N/QNR][K4/4][QNR][4] with
   col_sum[n] = sum_k B[k][n]; bias may be NULL. out_type INT32 writes C; UINT8/INT8 write
   clamp(rint(float(C) * scale[n * scale_step]) + out_zero) (round half to even). C's element (m, n) is at c + m*ldc_m +
   n*ldc_n. Run
   aot_qgemm_run(g, 0, aot_qgemm_tasks(g)) on any number of threads at once (next = 0 to start), or through
   aot_parallel with slices set (and taken zero); results are the same for any count. a_kmajor: A lies as [K][M]
   instead (A[m][k] at a + k*lda + m). a_zero_at, when not NULL, holds A's zero point instead of a_zero: one
   computed at run time (DynamicQuantizeLinear's), written by an earlier call.
   plane, when not NULL (and only where aot_qgemm_reads_plane said yes to it), is the im2col that would have written
   the k-major A: A is then read from the convolution's input planes it names, and a is not read. */
#define QNR 32
#define AOT_QGEMM_SLICES 16
enum { AOT_QGEMM_INT32 = 0, AOT_QGEMM_UINT8 = 1, AOT_QGEMM_INT8 = 2 };
typedef struct {
  int M, N, K;
  const uint8_t *a;
  long lda;
  int a_signed, a_zero;
  const int8_t *b;
  const int32_t *col_sum, *bias;
  const float *scale;
  int scale_step, out_type, out_zero;
  void *c;
  long ldc_m, ldc_n;
  int next;
  int a_kmajor;
  const int32_t *a_zero_at;
  const aot_qim2col *plane;
  /* the pool's thread count (aot_pool_threads), where aot_parallel runs the call over [0, tasks): the call's task
     grid is then split into as many regions, contiguous in m (in n where that shares the work out more evenly), and
     whoever runs slice i of the split takes region i's tasks first, then the others' still untaken, from their
     ends. 0 or 1 (or more than AOT_QGEMM_SLICES): one region, its tasks counted by next */
  int slices;
  /* per region, the tasks taken from its start (low 32 bits) and from its end (high 32 bits) */
  unsigned long long taken[AOT_QGEMM_SLICES];
} aot_qgemm;
__attribute__((visibility("hidden"))) int aot_qgemm_tasks(const aot_qgemm *g);
__attribute__((visibility("hidden"))) int aot_qgemm_reads_plane(const aot_qim2col *p);
__attribute__((visibility("hidden"))) void aot_qgemm_run(void *g, int start, int end);
#endif
