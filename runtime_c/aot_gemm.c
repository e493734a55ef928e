/* The matrix-multiply microkernel generated contraction kernels call (see codegen/lower/contract.py).

   C[b][m][n] = sum_k A[b][m][k] * B[b][k][n]. Each operand is described by strides (aot_operand): a constant is
   packed at compile time in tiles ([m/MR][K][MR] for A, [n/NR][K][NR] for B, zero-padded) so the inner loop reads it
   contiguously; a runtime operand is read where it lies, or from a copy a generated kernel made (when its element is
   an expression, e.g. a convolution's window with padding). The microkernel keeps an MR x NR tile of C in vector
   registers across a KC-long slice of K; B's NR columns must be contiguous.

   Work is split into tasks (batch x m blocks x n blocks), each computing its block of C whole; every element of C is
   summed in the same order (k ascending, in KC slices) whatever the thread count, so results are bitwise the same. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "aot_gemm.h"

/* the microkernels' loops unrolled, but under the sanitizers (tests/test_sanitize.py): there the checks of the
   unrolled code made clang-19 take 25 s over this file, 3 without. Each accumulator's sum runs in the same order
   either way. */
#ifndef __has_feature
#define __has_feature(x) 0
#endif
#if defined(__SANITIZE_ADDRESS__) || __has_feature(address_sanitizer)
#define AOT_UNROLL(n)
#else
#define AOT_UNROLL_(text) _Pragma(#text)
#define AOT_UNROLL(n) AOT_UNROLL_(GCC unroll n)
#endif

/* K is walked in slices this long: fewer slices, fewer passes over C's tiles (measured in ResNet-18/50: 512-1024 is
   ~5% faster than 256; the slice of a B tile then lives in L2, not L1) */
#define KC 1024
/* ... but a packed panel's (a convolution's window matrix, packed by each task) in slices of this many where L1 holds
   a B tile's slice (32 x 256 floats: 32 KB) beside A's (L1 of 48 KB or more): measured on a Xeon with 48 KB, 1
   thread, ResNet-18 35.4 -> 33.0 ms, 3x3 convolutions 5-7% faster, matmuls and 1x1 convolutions (B read in place)
   as they were (or 2-7% slower at 256). Every element is summed in the same order either way */
#define PANEL_KC 256
#define PANEL_KC_L1 (48 * 1024)
/* a B read in place (aot_gemm.stream_b: codegen/lower/microkernel.py streams_b) is prefetched this many steps of k
   ahead of the microkernel, and with it an A packed in tiles: a 512-channel 3x3 convolution over a 7x7 map (its 9.4 MB
   of weights as B, read once per 49 rows) ran 2.72 -> 2.34 ms in ResNet-18, 1 thread, at 32 to 128 steps alike;
   Winograd's 16 products over its 14x14 maps (the transformed weights as A, a view as B) 1.18-1.28 -> 1.10 ms */
#define STREAM_AHEAD 64
/* edge tiles are copied this many steps of k at a time (so the copies fit on the stack) */
#define EDGE_KC 128

typedef float v16 __attribute__((vector_size(64), aligned(4)));
typedef float v8 __attribute__((vector_size(32), aligned(4)));

/* The fused epilogue (aot_gemm.steps) on a tile's accumulators, before they are stored: a step's operand is one value
   (a constant: x points at it, xm = 0) or one per row (ROW: broadcast), or NR contiguous columns per row (COL). An add
   or a multiply takes its operands in one order (they round the same either way, a NaN's payload aside); max and min
   keep their first argument when it is NaN, as the generated kernels do. */
/* (inside a microkernel: vec_t its vector type, TILE_MR its rows, VW and NV its lanes and vectors per row) */
#define ROW(x, xm) ((x)[i * (xm)] - (vec_t){0})
#define COL(x, xm) (*(const vec_t *)((x) + i * (xm) + j * VW))
#define ON_TILE(Y, EXPR)                                                                                   \
  AOT_UNROLL(16) for (int i = 0; i < TILE_MR; i++)                                                         \
    AOT_UNROLL(4) for (int j = 0; j < NV; j++) { const vec_t v = acc[i][j], y = Y; acc[i][j] = EXPR; }
/* a multiply whose result an add takes: one statement per op, as the generated kernel has them */
#define ON_TILE_MUL_ADD(Y, Z)                                                                              \
  AOT_UNROLL(16) for (int i = 0; i < TILE_MR; i++)                                                         \
    AOT_UNROLL(4) for (int j = 0; j < NV; j++) {                                                           \
      const vec_t y_ = Y, z_ = Z, p_ = acc[i][j] * y_;                                                        \
      acc[i][j] = p_ + z_;                                                                                 \
    }
#define BY_KIND(EXPR) do { if (xcol) { ON_TILE(COL(x, xm), EXPR) } else { ON_TILE(ROW(x, xm), EXPR) } } while (0)
#define TILE_STEPS                                                                                         \
  for (int k = 0; k < g->nsteps; k++) {                                                                    \
    const aot_gemm_step *s = &g->steps[k], *t = s->op == AOT_STEP_MUL_ADD ? &g->steps[++k] : NULL;         \
    const float *x = step_at(s, gb, gm, gn), *z = t ? step_at(t, gb, gm, gn) : NULL;                       \
    const long xm = s->p ? s->m : 0, zm = t && t->p ? t->m : 0;                                            \
    const int xcol = s->p && s->n, zcol = t && t->p && t->n;                                               \
    if (t) {                                                                                               \
      if (xcol && zcol) { ON_TILE_MUL_ADD(COL(x, xm), COL(z, zm)) }                                        \
      else if (xcol) { ON_TILE_MUL_ADD(COL(x, xm), ROW(z, zm)) }                                           \
      else if (zcol) { ON_TILE_MUL_ADD(ROW(x, xm), COL(z, zm)) }                                           \
      else { ON_TILE_MUL_ADD(ROW(x, xm), ROW(z, zm)) }                                                     \
      continue;                                                                                            \
    }                                                                                                      \
    AOT_STEP_SWITCH(s, BY_KIND, v, y)                                                                      \
  }

/* an edge tile's vector of C at p with `lanes` of its VW lanes inside C (none when <= 0): loaded into (over) v, or
   stored; through a copy on the stack, so that the accumulators stay in registers (a generic macro: v8 and v16) */
#define edge_load(p, lanes, VW, v)                                                                         \
  ({ __typeof__(v) v_ = (v); float t_[VW];                                                                 \
     memcpy(t_, &v_, sizeof v_);                                                                           \
     for (int l_ = 0; l_ < (lanes) && l_ < (VW); l_++) t_[l_] = (p)[l_];                                    \
     memcpy(&v_, t_, sizeof v_); v_; })
#define edge_store(p, lanes, VW, v)                                                                        \
  do { __typeof__(v) v_ = (v); float t_[VW];                                                               \
       memcpy(t_, &v_, sizeof v_);                                                                         \
       for (int l_ = 0; l_ < (lanes) && l_ < (VW); l_++) (p)[l_] = t_[l_]; } while (0)

/* where a step's operand for C's element (b, m, n) is: its value for a constant */
static inline const float *step_at(const aot_gemm_step *s, int b, int m, int n) {
  return s->p ? s->p + (long)b * s->batch + (long)m * s->m + (long)n * s->n : &s->value;
}

/* the microkernel's step k (inside it, MR, NR and AHEAD its own): B's row k (at BROW) times A's column k, row i's
   element AV, into the accumulators; B prefetched AHEAD steps ahead, and A where A_AHEAD (packed in tiles: ak * AHEAD
   further) */
#define MICRO_STEP(MR, NR, AHEAD, BROW, AV, A_AHEAD)                                                       \
  do {                                                                                                     \
    vec_t bv[NV];                                                                                          \
    AOT_UNROLL(4) for (int j = 0; j < NV; j++) bv[j] = *(const vec_t *)((BROW) + j * VW);                  \
    if (AHEAD) AOT_UNROLL(2) for (int j = 0; j < NR; j += 16) __builtin_prefetch(b + (k + AHEAD) * bk + j); \
    if (AHEAD && (A_AHEAD)) __builtin_prefetch(a + (k + AHEAD) * ak);                                      \
    /* scalar * vector broadcasts the scalar straight from memory (0 + a would be an add: -0 + 0 is not -0) */ \
    AOT_UNROLL(16) for (int i = 0; i < MR; i++) {                                                          \
      const float av = AV;                                                                                 \
      AOT_UNROLL(4) for (int j = 0; j < NV; j++) acc[i][j] += bv[j] * av;                                  \
    }                                                                                                      \
  } while (0)

/* One microkernel per (MR, NR, vector type): an MR x NR tile of C in MR x NR/VW vector accumulators over kc steps of
   k. A's element (i, k) is a[i*ar + k*ak] (broadcast); B's row k is NR contiguous floats at b + k*bk. C is read (when
   `accumulate`) and written with row stride ldc, whole, or in the EDGE variant its first mr rows and nr columns only:
   an edge tile is computed whole (A and B are read in whole tiles: padded, or zero-padded copies) and only its part
   inside C stored, where it went through a copy of the tile (a 7x7 image's 1x1 convs, 1 thread: 1280x49x320 0.239
   -> 0.227 ms, MobileNetV2 0.97x); its rows past mr read A's last row (rows past M need not be readable), where a
   zero-padded copy of A's rows was made per column tile (7x384 @ 384x1536, 1 thread: 101 -> 46 us; 8 rows: 45).
   The full tiles' variant has no test in its loads and stores (with them the whole models were 2-6% slower).
   With g set, the tile is final: g's steps for C's element (gb, gm, gn) at the tile's corner are applied before it is
   stored (the caller checks they can be: their operands are read for the whole tile). AHEAD (0: none) prefetches B
   that many steps of k ahead, and A where it is packed in tiles (weights: ar == 1), STREAM_AHEAD (a prefetch past an
   operand's end does not fault). The WINDOW variant reads B's row k at b + koff[k] (aot_gemm.koff) and A packed in
   tiles, every row of a tile (zero past M). */
#define MICROKERNEL(NAME, MR, NR, V, EDGE, AHEAD, WINDOW)                                                 \
  static void NAME(int kc, const float *restrict a, long ar, long ak, const float *restrict b, long bk,    \
                   float *restrict c, long ldc, int mr, int nr, int accumulate, const aot_gemm *g, int gb,   \
                   int gm, int gn, const int *restrict koff) {                                             \
    enum { VW = (int)(sizeof(V) / sizeof(float)), NV = NR / VW, TILE_MR = MR };                            \
    typedef V vec_t;                                                                                       \
    V acc[MR][NV];                                                                                         \
    const float *ai[MR];                                                                                   \
    const int whole = !(EDGE) || (mr == MR && nr == NR);                                                    \
    AOT_UNROLL(16) for (int i = 0; i < MR; i++) {                                                          \
      ai[i] = a + ((EDGE) && i >= mr ? mr - 1 : i) * ar;                                                   \
      AOT_UNROLL(4) for (int j = 0; j < NV; j++)                                                           \
        acc[i][j] = accumulate && whole ? *(const V *)(c + i * ldc + j * VW)                               \
                  : accumulate && i < mr ? edge_load(c + i * ldc + j * VW, nr - j * VW, VW, (V){0})      \
                  : (V){0};                                                                                \
    }                                                                                                      \
    /* A packed in tiles (weights) has constant offsets: that loop unrolled reads it without the generic one's index \
       arithmetic, which nearly filled the front end (a 3x3 convolution's 64 x 1760 x 144: 151 -> 162 GFLOP/s) */  \
    if (WINDOW)                                                                                            \
      AOT_UNROLL(4) for (int k = 0; k < kc; k++) MICRO_STEP(MR, NR, 0, b + koff[k], a[k * MR + i], 0);      \
    else if (ar == 1 && ak == MR && mr == MR)                                                              \
      AOT_UNROLL(4) for (int k = 0; k < kc; k++) MICRO_STEP(MR, NR, AHEAD, b + k * bk, a[k * MR + i], 1);  \
    else                                                                                                   \
      for (int k = 0; k < kc; k++) MICRO_STEP(MR, NR, AHEAD, b + k * bk, ai[i][k * ak], ar == 1);          \
    if (g) { TILE_STEPS }                                                                                  \
    AOT_UNROLL(16) for (int i = 0; i < MR; i++)                                                            \
      AOT_UNROLL(4) for (int j = 0; j < NV; j++) {                                                         \
        if (whole) *(V *)(c + i * ldc + j * VW) = acc[i][j];                                               \
        else if (i < mr) edge_store(c + i * ldc + j * VW, nr - j * VW, VW, acc[i][j]);                   \
      }                                                                                                    \
  }

/* 6 x 16 with 8-float vectors: 12 accumulators fit AVX2's 16 registers (and NEON's 32 as 24 halves) */
MICROKERNEL(microkernel_6x16, 6, 16, v8, 0, 0, 0)
MICROKERNEL(microkernel_6x16_edge, 6, 16, v8, 1, 0, 0)
MICROKERNEL(microkernel_6x16_stream, 6, 16, v8, 0, STREAM_AHEAD, 0)
MICROKERNEL(microkernel_6x16_window, 6, 16, v8, 0, 0, 1)
#if defined(__AVX512F__)
/* 8 x 32 with 16-float vectors: 16 accumulators + 2 B vectors + 1 broadcast fit AVX-512's 32 registers */
MICROKERNEL(microkernel_8x32, 8, 32, v16, 0, 0, 0)
MICROKERNEL(microkernel_8x32_edge, 8, 32, v16, 1, 0, 0)
MICROKERNEL(microkernel_8x32_stream, 8, 32, v16, 0, STREAM_AHEAD, 0)
MICROKERNEL(microkernel_8x32_window, 8, 32, v16, 0, 0, 1)
/* an edge tile of at most 16 columns on the 8 x 32 path: half the work of a full tile (a 13x13 image's 169 columns
   end in 9, which the full tile computed 32 of; the sums, k ascending, are the same) */
MICROKERNEL(microkernel_8x16_edge, 8, 16, v16, 1, 0, 0)
#else
/* the 8 x 32 tile is AVX-512's alone (codegen/lower/contract.py gemm_tile): elsewhere it is never called, and gcc
   split its 16-float vectors into quarters for long: 41 of the 45 s of an aarch64 build of this file, 13 of 18 s of
   an x86-64-v2 one. A call would trap */
static void microkernel_8x32(int K, const float *a, long ar, long ak, const float *b, long bk, float *c, long ldc,
                             int mr, int nr, int acc, const aot_gemm *g, int bb, int m, int n, const int *koff) {
  (void)K, (void)a, (void)ar, (void)ak, (void)b, (void)bk, (void)c, (void)ldc, (void)mr, (void)nr, (void)acc;
  (void)g, (void)bb, (void)m, (void)n, (void)koff;
  __builtin_trap();
}
#define microkernel_8x32_edge microkernel_8x32
#define microkernel_8x32_stream microkernel_8x32
#define microkernel_8x16_edge microkernel_8x32
#define microkernel_8x32_window microkernel_8x32
#endif

typedef void (*microkernel_fn)(int, const float *, long, long, const float *, long, float *, long, int, int, int,
                               const aot_gemm *, int, int, int, const int *);

/* M = 1 (a batch-1 fully connected layer): c[0, NR) = sum over k of a[k * ak] * b[k * bk + (0, NR)], reading each
   element of B once (the microkernel would fill 1 of its MR rows, compute-bound at MR x the work). The sum runs in
   GEMV_SPLIT interleaved partial sums over k (k mod GEMV_SPLIT), added in a fixed order at the end: independent
   multiply-add chains, so the loads, not the latency, set the pace. */
#define GEMV_SPLIT 4
#define GEMV_KERNEL(NAME, NR, V)                                                                           \
  static void NAME(int K, const float *restrict a, long ak, const float *restrict b, long bk, float *restrict c) { \
    enum { VW = (int)(sizeof(V) / sizeof(float)), NV = NR / VW };                                           \
    V acc[GEMV_SPLIT][NV];                                                                                  \
    AOT_UNROLL(4) for (int u = 0; u < GEMV_SPLIT; u++)                                                     \
      AOT_UNROLL(4) for (int j = 0; j < NV; j++) acc[u][j] = (V){0};                                       \
    int k = 0;                                                                                              \
    for (; k + GEMV_SPLIT <= K; k += GEMV_SPLIT)                                                            \
      AOT_UNROLL(4) for (int u = 0; u < GEMV_SPLIT; u++) {                                                 \
        const float av = a[(k + u) * ak];                                                                   \
        const float *bu = b + (k + u) * bk;                                                                 \
        AOT_UNROLL(4) for (int j = 0; j < NV; j++) acc[u][j] += *(const V *)(bu + j * VW) * av;            \
      }                                                                                                     \
    for (; k < K; k++)                                                                                      \
      AOT_UNROLL(4) for (int j = 0; j < NV; j++) acc[0][j] += *(const V *)(b + k * bk + j * VW) * a[k * ak]; \
    AOT_UNROLL(4) for (int j = 0; j < NV; j++)                                                             \
      *(V *)(c + j * VW) = (acc[0][j] + acc[1][j]) + (acc[2][j] + acc[3][j]);                               \
  }
GEMV_KERNEL(gemv_32, 32, v16)
GEMV_KERNEL(gemv_16, 16, v8)

static int cdiv(int a, int b) { return (a + b - 1) / b; }
static int min(int a, int b) { return a < b ? a : b; }

/* The fused epilogue (aot_gemm.steps) over an mr x nr tile of C at (b, m, n), row stride ldc: one pass per step and
   row, over contiguous columns, so each vectorises; the ops and their argument order are the generated kernel's, one
   rounding per op (codegen/lower/contract.py fuses only chains no compiler contracts into a multiply-add). */
#define STEP_MAX(a, b) (((a) > (b) || (a) != (a)) ? (a) : (b))
#define STEP_MIN(a, b) (((a) < (b) || (a) != (a)) ? (a) : (b))
#define STEP_ROW(EXPR)                                                                                     \
  do {                                                                                                     \
    if (!x) for (int j = 0; j < nr; j++) { const float v = row[j], y = s->value; row[j] = (EXPR); }        \
    else if (s->n == 0) for (int j = 0; j < nr; j++) { const float v = row[j], y = x[0]; row[j] = (EXPR); } \
    else if (s->n == 1) for (int j = 0; j < nr; j++) { const float v = row[j], y = x[j]; row[j] = (EXPR); } \
    else for (int j = 0; j < nr; j++) { const float v = row[j], y = x[j * s->n]; row[j] = (EXPR); }          \
  } while (0)
/* a step's operand over the row's nr columns */
static void step_operand(const aot_gemm_step *s, const float *x, int nr, float *restrict y) {
  for (int j = 0; j < nr; j++) y[j] = !x ? s->value : x[j * s->n];
}
static void apply_steps(const aot_gemm *g, int b, int m, int n, int mr, int nr, float *restrict c, long ldc) {
  float y[32], z[32];
  for (int i = 0; i < mr; i++) {
    float *restrict row = c + i * ldc;
    for (int k = 0; k < g->nsteps; k++) {
      const aot_gemm_step *s = &g->steps[k];
      const float *x = s->p ? s->p + (long)b * s->batch + (long)(m + i) * s->m + (long)n * s->n : NULL;
      if (s->op == AOT_STEP_MUL_ADD) {
        const aot_gemm_step *t = &g->steps[++k];
        step_operand(s, x, nr, y);
        step_operand(t, t->p ? t->p + (long)b * t->batch + (long)(m + i) * t->m + (long)n * t->n : NULL, nr, z);
        /* one statement per op, as the generated kernel has them */
        switch (s->swapped * 2 + t->swapped) {
        case 0: for (int j = 0; j < nr; j++) { const float p = row[j] * y[j]; row[j] = p + z[j]; } break;
        case 1: for (int j = 0; j < nr; j++) { const float p = row[j] * y[j]; row[j] = z[j] + p; } break;
        case 2: for (int j = 0; j < nr; j++) { const float p = y[j] * row[j]; row[j] = p + z[j]; } break;
        default: for (int j = 0; j < nr; j++) { const float p = y[j] * row[j]; row[j] = z[j] + p; } break;
        }
        continue;
      }
      switch (s->op * 2 + s->swapped) {
      case AOT_STEP_ADD * 2: STEP_ROW(v + y); break;
      case AOT_STEP_ADD * 2 + 1: STEP_ROW(y + v); break;
      case AOT_STEP_MUL * 2: STEP_ROW(v * y); break;
      case AOT_STEP_MUL * 2 + 1: STEP_ROW(y * v); break;
      case AOT_STEP_MAX * 2: STEP_ROW(STEP_MAX(v, y)); break;
      case AOT_STEP_MAX * 2 + 1: STEP_ROW(STEP_MAX(y, v)); break;
      case AOT_STEP_MIN * 2: STEP_ROW(STEP_MIN(v, y)); break;
      default: STEP_ROW(STEP_MIN(y, v)); break;
      }
    }
  }
}

/* can the microkernel apply every step (operands of one value, one per row, or contiguous columns)? */
static int steps_vectorise(const aot_gemm *g) {
  for (int k = 0; k < g->nsteps; k++)
    if (g->steps[k].p && g->steps[k].n != 0 && g->steps[k].n != 1) return 0;
  return 1;
}

/* row groups a packed panel's rows are cut into: one (its task runs all its row blocks) unless the call's slices
   outnumber the panels, when each panel is packed once per group so that every thread has rows to run (the CRNN's
   last convolutions are one panel of 160 columns each: 43% of its run on one thread of two) */
static int panel_groups(const aot_gemm *g) {
  const int panels = g->batch * cdiv(g->N, g->nc), tiles = cdiv(g->M, g->mr);
  if (!g->pack || g->slices <= panels) return 1;
  return min(cdiv(g->slices, panels), tiles);
}

/* the K slice of a packed panel on this CPU (PANEL_KC), found once (sysconf may ask the CPU: a trap in a VM) */
static int panel_kc(void) {
  static int found;
  int kc = __atomic_load_n(&found, __ATOMIC_RELAXED);
  if (!kc) {
    long l1 = 0;
#ifdef _SC_LEVEL1_DCACHE_SIZE
    l1 = sysconf(_SC_LEVEL1_DCACHE_SIZE);
#endif
    kc = l1 >= PANEL_KC_L1 ? PANEL_KC : KC;
    __atomic_store_n(&found, kc, __ATOMIC_RELAXED);
  }
  return kc;
}

int aot_gemm_tasks(const aot_gemm *g) {
  return g->batch * cdiv(g->N, g->nc) * (g->pack ? panel_groups(g) : cdiv(g->M, g->mc));
}

/* where an operand's element (batch, row, k) is; rows come in tiles of R */
static const float *at(const aot_operand *o, int b, int row, int R) {
  return o->p + b * o->batch + (long)(row / R) * o->tile + (long)(row % R) * o->row;
}

/* A window read from a padded copy (aot_gemm.koff) at copy, its column n0 first, over C's rows [m_lo, m_hi) and the
   microkernel's columns [n0, n1): each tile over all of K (its partial sums never leave the registers), whole (A is
   packed in tiles, zero past M, and the copy readable past its last column), into C where the tile lies in one of its
   rows, else into a tile on the stack of which each of the copy's rows' first `narrow` columns are stored where C has
   them. With fuse, a tile of whole rows goes through the steps (one value or one per row: they do not read by column)
   before it is stored; else they run on the stored columns. */
static void window_rows(const aot_gemm *g, const float *copy, int m_lo, int m_hi, int n0, int n1, float *c, long ldc,
                        int fuse) {
  const int b = 0;
  const int MR = g->mr, NR = g->nr;
  const microkernel_fn micro = MR == 8 ? microkernel_8x32_window : microkernel_6x16_window;
  float tile[8 * 32] __attribute__((aligned(64)));
  for (int n = n0; n < n1; n += NR) {
    /* the tile's columns in runs of one row of the copy: from, to C's column to, len (wide >= 8: at most 5 runs) */
    int from[5], to[5], len[5], runs = 0;
    for (int j = 0, nr = min(n1 - n, NR); j < nr;) {
      const int col = (n + j) % g->wide, run = min(nr - j, g->wide - col);
      if (col < g->narrow) {
        from[runs] = j, to[runs] = (n + j) / g->wide * g->narrow + col, len[runs++] = min(run, g->narrow - col);
      }
      j += run;
    }
    for (int m = m_lo; m < m_hi; m += MR) {
      const int mr = min(m_hi - m, MR), steps = fuse && mr == MR;
      const float *a_ = at(&g->a, b, m, MR), *b_ = copy + (n - n0);
      /* (a tile of whole rows inside one of C's rows is stored there) */
      const int direct = mr == MR && runs == 1 && len[0] == NR;
      float *ct = direct ? c + (long)m * ldc + to[0] : tile;
      micro(g->K, a_, g->a.row, g->a.k, b_, 0, ct, direct ? ldc : NR, MR, NR, 0, steps ? g : NULL, b, m, n, g->koff);
      for (int r = 0; r < runs && !direct; r++)
        for (int i = 0; i < mr; i++) {
          float *restrict d = c + (long)(m + i) * ldc + to[r];
          const float *s = tile + i * NR + from[r];
          for (int l = 0; l < len[r]; l++) d[l] = s[l];
        }
      if (g->nsteps && !steps)
        for (int r = 0; r < runs; r++) apply_steps(g, b, m, to[r], mr, len[r], c + (long)m * ldc + to[r], ldc);
    }
  }
}

void aot_gemm_run(void *ctx, int start, int end) {
  /* tasks are taken from a shared counter, not from [start, end): blocks at the edges are smaller, and a fixed split
     would leave one thread waiting (each task computes its block whole, so results do not depend on who takes it);
     start says which slice's panel buffer a packing gemm uses (aot_gemm.h) */
  (void)end;
  aot_gemm *g = ctx;
  const int tasks = aot_gemm_tasks(g);
  const int MR = g->mr, NR = g->nr, K = g->K;
  const long ldc = g->ldc ? g->ldc : g->N;
  const microkernel_fn micro = MR == 8 ? (g->stream_b ? microkernel_8x32_stream : microkernel_8x32)
                                        : g->stream_b ? microkernel_6x16_stream : microkernel_6x16;
  const int mblocks = cdiv(g->M, g->mc), nblocks = cdiv(g->N, g->nc), vector_steps = steps_vectorise(g);
  const int kcs = g->pack ? panel_kc() : KC;
  int column_steps = 0;
  for (int k = 0; k < g->nsteps; k++) column_steps |= g->steps[k].p && g->steps[k].n == 1;
  /* edge tiles of B that end at N (and B tiles whose lanes are not contiguous) are read through zero-padded copies
     of EDGE_KC steps of k at a time (an edge tile of A is read in place: the EDGE microkernel reads its last row for
     the rows past M); the GEMV's edge is written through a full-size one */
  float eb[EDGE_KC * 32] __attribute__((aligned(64)));
  float ec[32] __attribute__((aligned(64)));
  /* a panel task's B is the panel this thread packs, holding columns [n0, n0 + nc) from its start */
  aot_operand bo = g->b;
  float *panel = g->pack ? g->panels + (long)start * g->panel_floats : NULL;
  if (g->pack) { bo.p = panel; bo.batch = 0; }
  const int groups = panel_groups(g), group_rows = cdiv(cdiv(g->M, MR), groups) * MR;
  for (int t; (t = __atomic_fetch_add(&g->next, 1, __ATOMIC_RELAXED)) < tasks;) {
    /* m blocks innermost: neighbouring tasks share B columns; a panel's row groups likewise */
    const int p = g->pack ? t / groups : t, per_batch = g->pack ? nblocks : mblocks * nblocks;
    const int b = p / per_batch, nb = g->pack ? p % nblocks : p / mblocks % nblocks;
    const int n0 = nb * g->nc, n1 = min(n0 + g->nc, g->N), bn0 = g->pack ? n0 : 0;
    /* the rows this task runs: its group's, or its row block */
    const int m_lo = g->pack ? t % groups * group_rows : t % mblocks * g->mc;
    const int m_hi = min(m_lo + (g->pack ? group_rows : g->mc), g->M);
    if (m_lo >= m_hi) continue;
    if (g->pack) g->pack(g->pack_args, panel, p);
    float *c = g->c + (long)b * (g->ldcb ? g->ldcb : g->M * ldc);
    if (g->koff) {
      window_rows(g, panel, m_lo, m_hi, n0, n1, c, ldc, vector_steps && !column_steps);
      continue;
    }
    /* one row of A, and B a packed constant (lanes contiguous, whole tiles): the GEMV, over all of K at once */
    if (!g->pack && g->M == 1 && g->b.row == 1 && g->b.padded) {
      for (int n = n0; n < n1; n += NR) {
        const int nr = min(n1 - n, NR);
        float *ct = nr == NR ? c + n : ec;
        (NR == 32 ? gemv_32 : gemv_16)(K, at(&g->a, b, 0, MR), g->a.k, at(&g->b, b, n, NR), g->b.k, ct);
        if (nr < NR) memcpy(c + n, ec, (size_t)nr * sizeof(float));
        if (g->nsteps) apply_steps(g, b, 0, n, 1, nr, c + n, ldc);
      }
      continue;
    }
    for (int m0 = m_lo; m0 < m_hi; m0 += g->mc) {
    const int m1 = min(m0 + g->mc, m_hi);
    for (int k0 = 0; k0 < K; k0 += kcs) {
      const int kc = min(K - k0, kcs);
      for (int n = n0; n < n1; n += NR) {
        const int nr = min(n1 - n, NR);
        const int b_copy = (nr < NR && !bo.padded) || bo.row != 1;
        for (int kb = k0; kb < k0 + kc; kb += b_copy ? EDGE_KC : kc) {
          const int kbn = min(k0 + kc - kb, b_copy ? EDGE_KC : kc);
          const float *bt = at(&bo, b, n - bn0, NR) + (long)kb * bo.k;
          long bk = bo.k;
          if (b_copy) {
            for (int k = 0; k < kbn; k++)
              for (int j = 0; j < NR; j++) eb[k * NR + j] = j < nr ? bt[j * bo.row + (long)k * bo.k] : 0;
            bt = eb; bk = NR;
          }
          for (int m = m0; m < m1; m += MR) {
            const int mr = min(m1 - m, MR);
            float *ct = c + (long)m * ldc + n;
            {
              const int ka = kb, kan = kbn;
              const float *a_ = at(&g->a, b, m, MR) + (long)ka * g->a.k, *b_ = bt;
              const long ar = g->a.row, ak = g->a.k;
              /* the tile's last slice of k: it is final, and goes through the fused epilogue while in L1, where
                 the steps' operands may be read for the whole tile: an edge tile's rows past M would read a row
                 operand past its end, its columns past N a column operand (else they only reach dropped lanes) */
              const int last = ka + kan == K && g->nsteps;
              const int fuse = last && vector_steps && mr == MR && (nr == NR || !column_steps);
              const microkernel_fn f = mr == MR && nr == NR ? micro : nr <= 16 && MR == 8 ? microkernel_8x16_edge
                                       : MR == 8 ? microkernel_8x32_edge : microkernel_6x16_edge;
              f(kan, a_, ar, ak, b_, bk, ct, ldc, mr, nr, ka > 0, fuse ? g : NULL, b, m, n, NULL);
              if (last && !fuse) apply_steps(g, b, m, n, mr, nr, ct, ldc);
            }
          }
        }
      }
    }
    }
  }
}
