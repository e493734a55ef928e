/* The tiny C runtime every artifact links: status codes, error messages, the arena. */
#ifndef AOT_RUNTIME_H
#define AOT_RUNTIME_H
#include <stddef.h>

#ifndef AOT_STATUS_DEFINED
#define AOT_STATUS_DEFINED
enum {
  AOT_OK = 0,
  AOT_ERR_NULL_ARGUMENT = 1,   /* a required pointer was NULL */
  AOT_ERR_OUT_OF_MEMORY = 2,   /* the arena could not be allocated */
  AOT_ERR_INVALID_ARGUMENT = 3, /* an argument had a value the model cannot take */
  AOT_ERR_DEVICE = 4,           /* GPU targets: the GPU runtime, driver or device is missing or failed */
  AOT_ERR_INDEX_RANGE = 5       /* an index input (a Gather's indices) held a value outside the axis it indexes */
};
#endif

#define AOT_ERROR_CAPACITY 256

__attribute__((visibility("hidden"))) int aot_fail(char *error, int status, const char *fmt, ...);
__attribute__((visibility("hidden"))) const char *aot_status_message(int status);
__attribute__((visibility("hidden"))) void *aot_arena_alloc(size_t bytes);
__attribute__((visibility("hidden"))) void aot_arena_free(void *arena);
#endif

#ifndef AOT_RUNTIME_POOL_H
#define AOT_RUNTIME_POOL_H
/* A small thread pool: aot_parallel(pool, fn, ctx, n) runs fn(ctx, start, end) over a fixed split of [0, n), one
   slice per thread (thread i, the caller being 0, runs slice i where it is free to, and takes any other still untaken
   once done with its own), and returns when all are done. The split depends only on n and the thread count, and
   every output element is computed whole by one thread, so results do not depend on timing. */
typedef void (*aot_task)(void *ctx, int start, int end);
typedef struct aot_pool aot_pool;
__attribute__((visibility("hidden"))) aot_pool *aot_pool_create(int threads);
__attribute__((visibility("hidden"))) void aot_pool_destroy(aot_pool *pool);
__attribute__((visibility("hidden"))) void aot_parallel(aot_pool *pool, aot_task fn, void *ctx, int n);
__attribute__((visibility("hidden"))) int aot_pool_threads(const aot_pool *pool);
/* the end of a run: the pool's threads sleep until the next aot_parallel instead of spinning for it */
__attribute__((visibility("hidden"))) void aot_pool_rest(aot_pool *pool);
/* AOT_NUM_THREADS if set and positive, else the number of online cores */
__attribute__((visibility("hidden"))) int aot_default_threads(void);
#endif

#ifndef AOT_RUNTIME_GEMM_H
#define AOT_RUNTIME_GEMM_H
/* C[b][m][n] = sum_k A[b][m][k] B[b][k][n] (runtime_c/aot_gemm.c). An operand's element (batch, row, k), row = m for
   A and n for B in tiles of R = mr or nr rows, is p[batch*batch_stride + (row/R)*tile + (row%R)*row_stride +
   k*k_stride]:
   tiles packed ahead of time, or a plain strided matrix. A padded operand may be read past its last row up to a whole
   tile (what is there only reaches C's elements past the edge, which are dropped). (mr, nr) is 8x32 or 6x16; mc, nc,
   the rows and columns of C
   one task computes, are multiples of them; next counts the tasks taken (0 to start). Run aot_gemm_run(g, 0,
   aot_gemm_tasks(g)) on any number of threads at once: each takes tasks until none is left, and every element of C is
   summed in the same order whoever computes it.
   With pack set, B is written a panel of nc columns at a time: a task is one panel (batch b, columns from nb * nc),
   which pack(pack_args, buffer, b * ceil(N / nc) + nb) writes into the calling thread's buffer as [K][b.k] (B's strides
   are the panel's, its pointer unused), and every row block of C then runs over it. The thread's buffer is
   panels + start * panel_floats: run it with aot_parallel over the thread count, so that start is the thread.
   With steps set, each finished tile of C goes through them in order while it is in L1 (the kernel's epilogue, fused:
   codegen/lower/contract.py fused_steps): element v = c[b][m][n] becomes op(v, x), or op(x, v) when swapped, x being value
   when p is NULL, else p[b*batch + m*m_stride + n*n_stride]; max and min keep their first argument when it is NaN,
   as the generated kernels do. MUL_ADD is a multiply whose result the next step (an add) takes in the same
   expression, as a C kernel computes it: the compiler contracts the two into one multiply-add where it would in that
   kernel (gcc does, clang does not); a MUL step then an ADD step are always two roundings, as LLVM IR computes them. */
typedef struct { const float *p; long batch, tile, row, k; int padded; } aot_operand;
typedef void (*aot_pack)(void *args, float *panel, int index);
enum { AOT_STEP_ADD = 0, AOT_STEP_MUL = 1, AOT_STEP_MAX = 2, AOT_STEP_MIN = 3, AOT_STEP_MUL_ADD = 4 };
typedef struct { int op, swapped; float value; const float *p; long batch, m, n; } aot_gemm_step;
typedef struct {
  int batch, M, N, K, mr, nr, mc, nc;
  aot_operand a, b;
  float *c;
  int next;
  aot_pack pack;
  void *pack_args;
  float *panels;
  long panel_floats;
  const aot_gemm_step *steps;
  int nsteps;
  long ldc;                    /* C's row stride (0: N): C[b][m][n] is c[(b*M + m)*ldc + n] */
} aot_gemm;
__attribute__((visibility("hidden"))) int aot_gemm_tasks(const aot_gemm *g);
__attribute__((visibility("hidden"))) void aot_gemm_run(void *g, int start, int end);
#endif
#ifndef AOT_RUNTIME_DIRECT_H
#define AOT_RUNTIME_DIRECT_H
/* Depthwise convolution (runtime_c/aot_direct.c): plane p = f * images + i (filter f, image i) has output
   y[p*OH*OW + oh*OW + ow] = sum over kh, kw of w[f*KH*KW + kh*KW + kw] * x[x_planes[p] + ih*x_row + iw],
   ih = oh*SH + kh - PH, iw = ow*SW + kw - PW, zero outside H x W (x_planes: any order, e.g. a channel shuffle's).
   Tasks are planes / tasks planes each; after a task, epilogue(epilogue_ctx, t, t + 1) runs when not NULL.
   Run aot_depthwise_run(d, 0, tasks) on any split of [0, tasks). */
/* floats of the stack buffer holding a band of padded input rows (32 KB: a 112-wide plane's rows stay in L1) */
#define AOT_DEPTHWISE_BUFFER 8192
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
} aot_depthwise;
__attribute__((visibility("hidden"))) int aot_depthwise_band_rows(const aot_depthwise *d);
__attribute__((visibility("hidden"))) void aot_depthwise_run(void *d, int start, int end);
#endif
#ifndef AOT_RUNTIME_QGEMM_H
#define AOT_RUNTIME_QGEMM_H
#include <stdint.h>
/* An 8-bit convolution's input as the int8 contraction's k-major A (runtime_c/aot_qwindow.c): for plane c and tap
   (kh, kw), the row at y + c*y_plane + kh*y_kh + kw*y_kw holds, at oy*OW + ox, x[c][iy][ix] (at x + c*x_plane +
   iy*x_row + ix) for iy = oy*SH - PH + kh, ix = ox*SW - PW + kw inside the H x W plane, else the byte pad (A's zero
   point). Run aot_qim2col_run(p, start, end) on any split of [0, planes * KH). */
typedef struct {
  const uint8_t *x;
  long x_plane, x_row;
  int H, W;
  int KH, KW, SH, SW, PH, PW;
  uint8_t *y;
  long y_plane, y_kh, y_kw;
  int OH, OW, planes, pad;
} aot_qim2col;
__attribute__((visibility("hidden"))) void aot_qim2col_run(void *p, int start, int end);
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
/* An 8-bit max pool (runtime_c/aot_qwindow.c): y[p][oy][ox] (at y + p*y_plane + oy*y_row + ox) is the largest
   x[p][iy][ix] (at x + p*x_plane + iy*x_row + ix) over iy = oy*SH - PH + ky*DH, ix = ox*SW - PW + kx*DW inside the
   H x W plane, uint8 or int8 (x_signed); taps outside it are skipped (the type's minimum where none is inside).
   Run aot_qpool_run(p, start, end) on any split of [0, planes). */
#define AOT_QPOOL_ROW 4096
typedef struct {
  const uint8_t *x;
  long x_plane, x_row;
  int H, W, x_signed;
  int KH, KW, SH, SW, PH, PW, DH, DW;
  uint8_t *y;
  long y_plane, y_row;
  int OH, OW, planes;
} aot_qpool;
__attribute__((visibility("hidden"))) void aot_qpool_run(void *p, int start, int end);
#endif
