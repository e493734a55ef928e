/* The float GEMM microkernel's call (runtime_c/aot_gemm.c). */
#ifndef AOT_GEMM_H
#define AOT_GEMM_H
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
   panels + start * panel_floats: run it with aot_parallel over the thread count, so that start is the slice, which
   one thread runs at a time (a pool's, or a host executor's task: the buffer follows the slice, not the thread);
   slices is that count: with fewer panels than slices, a panel's rows are cut into groups of whole tiles, a task
   each, which packs the panel for its rows (every tile of C is still summed in one order, by one task).
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
/* a step's max or min of two vectors (GNU vector types) as the generated kernels compute it: a when a CMP b or a is NaN,
   else b (aot_gemm.c's and aot_direct.c's fused epilogues) */
#define VMAX_MIN(a, b, CMP)                                                                                \
  ({ const __typeof__((a) > (b)) k_ = ((a) CMP (b)) | ((a) != (a));                                       \
     (__typeof__(a))((k_ & (__typeof__(k_))(a)) | (~k_ & (__typeof__(k_))(b))); })
/* step s of a fused epilogue (not a MUL_ADD) on an element v with its operand x, as ON(EXPR) applies EXPR to the
   elements (v and x: the caller's names for them): the epilogue kernel's ops in its argument order (an add or a
   multiply rounds the same either way round) */
#define AOT_STEP_SWITCH(s, ON, v, x)                                                                       \
  switch ((s)->op * 2 + ((s)->op >= AOT_STEP_MAX ? (s)->swapped : 0)) {                                    \
    case AOT_STEP_ADD * 2: ON(v + x); break;                                                               \
    case AOT_STEP_MUL * 2: ON(v * x); break;                                                               \
    case AOT_STEP_MAX * 2: ON(VMAX_MIN(v, x, >)); break;                                                   \
    case AOT_STEP_MAX * 2 + 1: ON(VMAX_MIN(x, v, >)); break;                                               \
    case AOT_STEP_MIN * 2: ON(VMAX_MIN(v, x, <)); break;                                                   \
    default: ON(VMAX_MIN(x, v, <)); break;                                                                 \
  }
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
  long ldc;                    /* C's row stride (0: N): C[b][m][n] is c[b*ldcb + m*ldc + n] */
  int slices;                  /* a packing call's slices (aot_parallel's count; 0 or 1: one) */
  long ldcb;                   /* C's batch stride (0: M*ldc; more when M is a run-time size below the bound) */
  int stream_b;                /* B is read in place, maybe from memory as it goes: prefetched ahead */
  const int *koff;             /* B's row k at koff[k] + its column in its panel (b.k unused): a convolution's window
                                  read from a padded copy of its input (pack writes it), the taps' offsets there, the
                                  panel's first column at its start; A packed in tiles, batch 1 */
  int wide, narrow;            /* ... the microkernel's columns in rows of `wide` (the copy's), of which C has the
                                  first `narrow` (the output's row), C's row holding those alone */
} aot_gemm;
__attribute__((visibility("hidden"))) int aot_gemm_tasks(const aot_gemm *g);
__attribute__((visibility("hidden"))) void aot_gemm_run(void *g, int start, int end);
#endif
