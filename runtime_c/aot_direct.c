/* Depthwise convolution computed directly (see codegen/lower/direct.py): every plane (one channel of one image) is
   convolved with its own KH x KW filter, no im2col and no microkernel (a GEMM with M = 1 and K = 9 fills one row of
   its tile and spends its time packing).

   A band of a plane's input rows is first copied into a zero-padded buffer on the stack, its columns split by phase
   (column q of phase p holds padded input column q * SW + p): the taps of a strided window then read contiguous
   columns, and no load needs a bounds check. Each output row is computed in segments of SEG_VECTORS vectors held
   in registers across all KH x KW taps, so an output is written once and every tap is one vector load and one
   multiply-add per VW outputs.

   Work is split into tasks of whole planes; after a task's planes the generated epilogue kernel (batch norm,
   activation, residual add) runs on them while they are still in cache. Every output is summed in the same order
   (kh, then kw, ascending) whoever computes it, so results are bitwise the same for any thread count. */
#include <string.h>
#include "aot_direct.h"
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#if defined(__AVX512F__)
typedef float vf __attribute__((vector_size(64), aligned(4)));
#else
typedef float vf __attribute__((vector_size(32), aligned(4)));
#endif
enum { VW = (int)(sizeof(vf) / sizeof(float)) };
/* outputs computed at once: ROW_BLOCK rows x SEG_VECTORS vectors, 8 independent accumulators, enough to hide the
   multiply-add's latency (one row of 4 vectors: stride 2 on 56-wide rows ran at a third of stride 1's rate) */
#define SEG_VECTORS 4
#define ROW_BLOCK 2

/* the even lanes of two vectors (a stride-2 row split by phase); gcc has __builtin_shufflevector since 12 */
#if defined(__clang__) || __GNUC__ >= 12
#define HAVE_EVEN 1
#if defined(__AVX512F__)
#define EVEN(a, b) __builtin_shufflevector(a, b, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30)
#else
#define EVEN(a, b) __builtin_shufflevector(a, b, 0, 2, 4, 6, 8, 10, 12, 14)
#endif
#endif

#if defined(__GNUC__) && !defined(__clang__)
#define AOT_LOOP_VECTORIZE __attribute__((optimize("tree-loop-vectorize")))
#else
#define AOT_LOOP_VECTORIZE
#endif

/* the first n lanes of v stored at p (n in 1..VW): a masked store where the ISA has one, so the row's last, partial
   vector is written straight into the output (it used to go through a buffer and a memcpy call per row, which cost
   small planes more than their multiply-adds: 7x7 and 14x14 rows are one partial vector) */
static inline __attribute__((always_inline)) void store_first(float *p, const vf *v, int n) {
#if defined(__AVX512F__)
  _mm512_mask_storeu_ps(p, (__mmask16)((1u << n) - 1), (__m512)*v);
#elif defined(__AVX2__)
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  _mm256_maskstore_ps(p, _mm256_cmpgt_epi32(_mm256_set1_epi32(n), lanes), (__m256)*v);
#else
  for (int i = 0; i < n; i++) p[i] = (*v)[i];
#endif
}

/* the first n floats at p (n in 1..VW) into *v, the rest 0, reading nothing past them (vectors go by pointer: a
   32-byte one by value changes the ABI of an SSE-only build, and gcc says so) */
static inline __attribute__((always_inline)) void load_first(vf *v, const float *p, int n) {
#if defined(__AVX512F__)
  *v = (vf)_mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1), p);
#elif defined(__AVX2__)
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  *v = (vf)_mm256_maskload_ps(p, _mm256_cmpgt_epi32(_mm256_set1_epi32(n), lanes));
#else
  *v = (vf){0};
  for (int i = 0; i < n; i++) (*v)[i] = p[i];
#endif
}

/* the dilation (0 in a descriptor that names none reads as 1) and the rows and columns a window spans */
static inline int dil_h(const aot_depthwise *d) { return d->DH > 1 ? d->DH : 1; }
static inline int dil_w(const aot_depthwise *d) { return d->DW > 1 ? d->DW : 1; }
static inline long col_step(const aot_depthwise *d) { return d->x_col > 1 ? d->x_col : 1; }
static inline int span_h(const aot_depthwise *d) { return (d->KH - 1) * dil_h(d) + 1; }
/* output rows whose windows in_rows input rows hold (0: not one) */
static int band_outputs(const aot_depthwise *d, long in_rows) {
  return in_rows < span_h(d) ? 0 : (int)((in_rows - span_h(d)) / d->SH + 1);
}

/* padded columns per phase: whole vectors of outputs plus the window's reach past them */
static int phase_width(const aot_depthwise *d) {
  return (d->OW + VW - 1) / VW * VW + (d->KW - 1) * dil_w(d) / d->SW;
}

/* the band's columns: padded column q * SW + p is input column q * SW + p - PW, valid for q in [lo[p], hi[p]) (the
   same for every row and plane: worked out once a call, its integer divisions cost more than a small plane's copy) */
typedef struct { int lo[AOT_DEPTHWISE_MAX_STRIDE], hi[AOT_DEPTHWISE_MAX_STRIDE]; } band_cols;

static band_cols band_cols_of(const aot_depthwise *d) {
  const int SW = d->SW, Wq = phase_width(d);
  band_cols c;
  for (int p = 0; p < SW; p++) {
    const int first = p - d->PW;
    int q0 = first >= 0 ? 0 : (-first + SW - 1) / SW, q1 = d->W - first > 0 ? (d->W - first + SW - 1) / SW : 0;
    q0 = q0 < Wq ? q0 : Wq;
    q1 = q1 < Wq ? q1 : Wq;
    c.lo[p] = q0;
    c.hi[p] = q1 > q0 ? q1 : q0;
  }
  return c;
}

/* Copy input rows [ih0, ih0 + rows) (rows outside the plane are zeros) into buf as [rows][SW][Wq]. Columns outside
   the plane are never written: buf starts zeroed, and they are the same columns in every row. */
AOT_LOOP_VECTORIZE static void fill_band(const aot_depthwise *d, const band_cols *cols, const float *x, int ih0,
                                         int rows, float *buf) {
  const int SW = d->SW, Wq = phase_width(d);
  const int *lo = cols->lo, *hi = cols->hi;
  for (int r = 0; r < rows; r++) {
    const int ih = ih0 + r;
    for (int p = 0; p < SW; p++) {
      float *out = buf + ((long)r * SW + p) * Wq;
      if (ih < 0 || ih >= d->H) {
        memset(out, 0, (size_t)Wq * sizeof(float));
        continue;
      }
      const long xc = col_step(d);
      const float *row = x + (long)ih * d->x_row + (p - d->PW) * xc;
      const int q0 = lo[p], q1 = hi[p];
      int q = q0;
      if (xc > 1) {
        /* a channels-last input: its row's columns one at a time (the next plane's lie beside them, in cache) */
      } else if (SW == 1) {
        /* vectors, then the rest masked (a memcpy call per row cost 7- and 14-wide planes more than their copy) */
        for (; q + VW <= q1; q += VW) *(vf *)(out + q) = *(const vf *)(row + q);
        if (q < q1) {
          vf rest;
          load_first(&rest, row + q, q1 - q);
          store_first(out + q, &rest, q1 - q);
          q = q1;
        }
      }
#ifdef HAVE_EVEN
      else if (SW == 2 && xc == 1) {
        for (; 2L * (q + VW) + p - d->PW <= d->W; q += VW)
          *(vf *)(out + q) = EVEN(*(const vf *)(row + 2L * q), *(const vf *)(row + 2L * q + VW));
        /* the row's last columns (fewer than 2 * VW) read masked, zeros past them (what lies there is padding) */
        if (q < q1 && q + VW <= Wq) {
          const int m = d->W - (2 * q + p - d->PW);
          vf a, b = {0};
          load_first(&a, row + 2L * q, m < VW ? m : VW);
          if (m > VW) load_first(&b, row + 2L * q + VW, m - VW);
          *(vf *)(out + q) = EVEN(a, b);
          q = q1;
        }
      }
#endif
      for (; q < q1; q++) out[q] = row[(long)q * SW * xc];
    }
  }
}

/* the fused epilogue's operands on one plane (aot_depthwise.steps): each step's at the plane's first output (its
   value for a constant), and whether it moves with the output (a residual) or is one per plane (a bias, a scale) */
typedef struct {
  const aot_gemm_step *s;
  int n;
  const float *y, *x[AOT_DEPTHWISE_MAX_STEPS];
  int col[AOT_DEPTHWISE_MAX_STEPS];
} plane_steps;

static void plane_steps_of(const aot_depthwise *d, int p, const float *y, plane_steps *ps) {
  const int images = d->images, filters = d->filters;
  const long b = p / (images * filters), m = p / images % filters, n = (long)(p % images) * d->OH * d->OW;
  ps->s = d->steps;
  ps->n = d->nsteps;
  ps->y = y;
  for (int k = 0; k < d->nsteps; k++) {
    const aot_gemm_step *s = &d->steps[k];
    ps->x[k] = s->p ? s->p + b * s->batch + m * s->m + n * s->n : &s->value;
    ps->col[k] = s->p && s->n;
  }
}

/* step k's operand for the outputs at y into *x, of which the first lanes are the row's (the rest read as 0) */
static inline __attribute__((always_inline)) void step_operand(vf *x, const plane_steps *ps, int k, const float *y,
                                                               int lanes) {
  const float *at = ps->x[k];
  if (!ps->col[k]) *x = *at - (vf){0};
  else if (lanes == VW) *x = *(const vf *)(at + (y - ps->y));
  else load_first(x, at + (y - ps->y), lanes);
}

/* EXPR of each accumulator v and its operand x (step k's) into the accumulator */
#define ON_BLOCK(EXPR)                                                                                     \
  _Pragma("GCC unroll 2") for (int r = 0; r < R; r++)                                                      \
    _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) {                                                 \
      const float *at = y + r * y_row + j * VW;                                                            \
      const vf v = acc[r][j];                                                                              \
      vf x;                                                                                                \
      step_operand(&x, ps, k, at, j == NV - 1 ? last : VW);                                                \
      acc[r][j] = EXPR;                                                                                    \
    }

/* R rows x NV vectors of outputs, in registers across the taps (at offsets off[t] from src, weights w[t]); the rows'
   band rows are src_row apart, their outputs y_row; of the last vector only its first last lanes are stored (VW:
   all of them). With ps, the plane's steps on them first: the same ops in the same order as the epilogue kernel (an
   add or a multiply rounds the same either way round; a multiply an add takes is two statements, as the kernel has
   them), one step at a time over the whole block (a switch per output vector cost the 56-wide planes 1.2x) */
static inline __attribute__((always_inline)) void segment(int taps, const long *off, const float *w,
                                                          const float *src, long src_row, float *y, long y_row,
                                                          const int R, const int NV, int last, const plane_steps *ps) {
  vf acc[ROW_BLOCK][SEG_VECTORS] = {{{0}}};
  for (int t = 0; t < taps; t++) {
    const float wv = w[t], *p = src + off[t];
    _Pragma("GCC unroll 2") for (int r = 0; r < R; r++)
      _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) acc[r][v] += *(const vf *)(p + r * src_row + v * VW) * wv;
  }
  for (int k = 0; ps && k < ps->n; k++) {
    const aot_gemm_step *s = &ps->s[k];
    if (s->op == AOT_STEP_MUL_ADD) {
      k++;
      _Pragma("GCC unroll 2") for (int r = 0; r < R; r++)
        _Pragma("GCC unroll 4") for (int j = 0; j < NV; j++) {
          const float *at = y + r * y_row + j * VW;
          const int lanes = j == NV - 1 ? last : VW;
          vf x, z;
          step_operand(&x, ps, k - 1, at, lanes);
          step_operand(&z, ps, k, at, lanes);
          const vf p = acc[r][j] * x;
          acc[r][j] = p + z;
        }
      continue;
    }
    AOT_STEP_SWITCH(s, ON_BLOCK, v, x)
  }
  _Pragma("GCC unroll 2") for (int r = 0; r < R; r++) {
    _Pragma("GCC unroll 4") for (int v = 0; v < NV - 1; v++) *(vf *)(y + r * y_row + v * VW) = acc[r][v];
    if (last == VW) *(vf *)(y + r * y_row + (NV - 1) * VW) = acc[r][NV - 1];
    else store_first(y + r * y_row + (NV - 1) * VW, &acc[r][NV - 1], last);
  }
}

#define SEGMENT(R, NV) segment(taps, off, w, src, src_row, y, OW, R, NV, last, ps)
/* R (1 or ROW_BLOCK) output rows from the band rows starting at src, the taps at offsets off */
static void conv_rows(const aot_depthwise *d, const float *src, long src_row, const long *off, const float *w, float *y,
                      const int R, const plane_steps *ps) {
  const int taps = d->KH * d->KW, OW = d->OW;
  int ow = 0;
  for (; ow + SEG_VECTORS * VW <= OW; ow += SEG_VECTORS * VW) {
    const float *s = src + ow;
    float *o = y + ow;
    if (R == ROW_BLOCK) segment(taps, off, w, s, src_row, o, OW, ROW_BLOCK, SEG_VECTORS, VW, ps);
    else segment(taps, off, w, s, src_row, o, OW, 1, SEG_VECTORS, VW, ps);
  }
  if (ow == OW) return;
  /* the rest of the row: its last vector partial, stored masked */
  const int rest = OW - ow, nv = (rest + VW - 1) / VW, last = rest - (nv - 1) * VW;
  src += ow;
  y += ow;
  if (R == ROW_BLOCK) {
    switch (nv) {
      case 1: SEGMENT(ROW_BLOCK, 1); break;
      case 2: SEGMENT(ROW_BLOCK, 2); break;
      case 3: SEGMENT(ROW_BLOCK, 3); break;
      default: SEGMENT(ROW_BLOCK, 4); break;
    }
  } else {
    switch (nv) {
      case 1: SEGMENT(1, 1); break;
      case 2: SEGMENT(1, 2); break;
      case 3: SEGMENT(1, 3); break;
      default: SEGMENT(1, 4); break;
    }
  }
}

/* Small planes (rows of at most VW / 2 outputs, stride 1: MobileNet's 7x7 maps) are padded whole into the buffer
   with rows Wt = OW + KW - 1 wide, and their outputs computed over the flattened padded rows (output (oh, ow) at
   oh * Wt + ow): tap (kh, kw) is then one contiguous vector per VW outputs wherever they lie, a vector spanning
   rows (a 7-wide row filled 7 of 16 lanes: 7 vectors a tap for 49 outputs, 5 now with a 5x5 window). Each output
   is summed in conv_rows' order (segment's), so the results are the same bits. The rows are then stored from the
   flattened block, through the steps, by segment over one tap of weight 1 (0 + v * 1 is v: a sum that starts
   at +0 is never -0). */
/* flattened outputs of a small plane at most (the block they are computed into, on the stack) */
#define SMALL_OUTPUTS 1024
static int small_plane(const aot_depthwise *d) {
  const long Wt = d->OW + d->KW - 1, Hp = d->OH + d->KH - 1;
  return d->SH == 1 && d->SW == 1 && dil_h(d) == 1 && dil_w(d) == 1 && col_step(d) == 1 && 2 * d->OW <= VW &&
         d->OH * Wt <= SMALL_OUTPUTS &&
         Hp * Wt + 2 * VW + d->KW <= AOT_DEPTHWISE_BUFFER;
}

/* the plane zero-padded into buf as [OH + KH - 1][OW + KW - 1] (what lies past it stays 0 from the start) */
static void fill_small(const aot_depthwise *d, const float *x, float *buf) {
  const int Wt = d->OW + d->KW - 1, Hp = d->OH + d->KH - 1;
  for (int r = 0; r < Hp; r++) {
    const int ih = r - d->PH;
    float *out = buf + (long)r * Wt;
    if (ih < 0 || ih >= d->H) {
      memset(out, 0, (size_t)Wt * sizeof(float));
      continue;
    }
    /* the row's padding, then its W columns at PW, vectors at a time (masked: a scalar copy of 121 elements a plane
       cost more than its 5x5 window's multiply-adds) */
    const float *row = x + (long)ih * d->x_row;
    const vf zero = {0};
    for (int q = 0; q < Wt; q += VW) store_first(out + q, &zero, Wt - q < VW ? Wt - q : VW);
    for (int q = 0; q < d->W; q += VW) {
      const int n = d->W - q < VW ? d->W - q : VW;
      vf v;
      load_first(&v, row + q, n);
      store_first(out + d->PW + q, &v, n);
    }
  }
}

#define SMALL_SEGMENT(NV) segment(taps, off, w, buf + v * VW, 0, blk + v * VW, 0, 1, NV, VW, NULL)
/* a small plane's outputs (small_plane) into y through its steps; off: the taps' offsets kh * Wt + kw */
static void conv_small(const aot_depthwise *d, const float *buf, const long *off, const float *w, float *y,
                       const plane_steps *ps) {
  float blk[SMALL_OUTPUTS + VW] __attribute__((aligned(64)));
  const int taps = d->KH * d->KW, Wt = d->OW + d->KW - 1, vectors = (d->OH * Wt + VW - 1) / VW;
  for (int v = 0; v < vectors; v += SEG_VECTORS) {
    switch (vectors - v) {
      case 1: SMALL_SEGMENT(1); break;
      case 2: SMALL_SEGMENT(2); break;
      case 3: SMALL_SEGMENT(3); break;
      default: SMALL_SEGMENT(4); break;
    }
  }
  static const long at0 = 0;
  static const float one = 1.0f;
  for (int oh = 0; oh < d->OH; oh++)
    segment(1, &at0, &one, blk + (long)oh * Wt, 0, y + (long)oh * d->OW, 0, 1, 1, d->OW, ps);
}

#if defined(__AVX512F__)
/* Planes across lanes: small planes (MobileNet's 14x14 and 7x7 maps) are computed VW at a time, one plane a lane.
   A plane a task spent most of its time on its own rows' edges (masked copies, partial vectors, a segment per row:
   7x7 planes ran at 11 GFLOP/s); here a band of the group's input rows is transposed into the buffer as
   [rows][cols][VW] (padded with zeros), each output is one full vector of multiply-adds a tap, and the outputs are
   transposed back row by row. Each output is summed over the taps in segment's order and goes through the same
   steps (a multiply an add takes may be contracted differently by the C compiler, as between segment's row blocks:
   a last-bit difference); which path computes a plane depends on the shape alone, not on the threads. Steps with an
   operand per output (a residual) are left to the other paths. */
typedef __m512 v512;

/* r[i] <- column i of the 16 x 16 matrix whose rows are r */
static inline __attribute__((always_inline)) void transpose16(v512 r[16]) {
  v512 t[16];
  _Pragma("GCC unroll 8") for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  _Pragma("GCC unroll 4") for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
    r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
    r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
    r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
  }
  _Pragma("GCC unroll 2") for (int i = 0; i < 16; i += 8)
    _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
      t[i + j] = _mm512_shuffle_f32x4(r[i + j], r[i + j + 4], 0x88);
      t[i + j + 4] = _mm512_shuffle_f32x4(r[i + j], r[i + j + 4], 0xdd);
    }
  _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) {
    r[j] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0x88);
    r[j + 8] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0xdd);
  }
}

/* the columns of a buffer row: those the outputs' windows cover, or the input's own if it reaches further (each
   input column lands in its row) */
static long lane_cols(const aot_depthwise *d) {
  const long windows = (long)(d->OW - 1) * d->SW + d->KW, input = (long)d->PW + d->W;
  return windows > input ? windows : input;
}

/* output rows per band: as many as the buffer holds VW times over, with VW columns of room past the last row */
static int lane_band(const aot_depthwise *d) {
  return band_outputs(d, AOT_DEPTHWISE_BUFFER / VW / lane_cols(d) - 1);
}

/* rows of at most LANE_WIDTH outputs, or strided (the row path's stride-2 copies cost more than the transposes),
   no step per output. Measured on this AVX-512 machine, per call (before -> after, 1 thread): 960 7x7 planes 73 ->
   28 us, 384 14x14 52 -> 27, 576 14x14 stride 2 82 -> 21, 192 28x28 70 -> 48, 144 56x56 stride 2 125 -> 75, 96
   112x112 stride 2 261 -> 212; 56- and 112-wide rows at stride 1 ran 1.1-1.2x slower (their bands are a few rows,
   each row transposed KH times) */
#define LANE_WIDTH 32
static int lane_planes(const aot_depthwise *d) {
  if ((d->OW > LANE_WIDTH && d->SW == 1) || dil_h(d) > 1 || dil_w(d) > 1 || col_step(d) > 1 || lane_band(d) == 0)
    return 0;
  for (int k = 0; k < d->nsteps; k++)
    if (d->steps[k].p && d->steps[k].n) return 0;
  return 1;
}

/* padded rows [r0, r1) of the group's planes [p0, p0 + n) into buf as [row - r0][col][lane], input (ih, iw) at
   (ih + PH, iw + PW); every other position holds 0 (zeroed once; only zeros are written there) */
static void lane_fill(const aot_depthwise *d, int p0, int n, long r0, long r1, float *buf) {
  const long cols = lane_cols(d);
  for (long r = r0; r < r1; r++) {
    const long ih = r - d->PH;
    float *row = buf + (r - r0) * cols * VW;
    if (ih < 0 || ih >= d->H) {
      memset(row, 0, (size_t)(cols * VW) * sizeof(float));
      continue;
    }
    for (int c0 = 0; c0 < d->W; c0 += VW) {
      const int w = d->W - c0 < VW ? d->W - c0 : VW;
      v512 v[16];
      _Pragma("GCC unroll 16") for (int l = 0; l < 16; l++)
        v[l] = l < n ? _mm512_maskz_loadu_ps((__mmask16)((1u << w) - 1),
                                             d->x + d->x_planes[p0 + l] + ih * d->x_row + c0)
                     : _mm512_setzero_ps();
      transpose16(v);
      /* all 16 columns: those past the row's w were loaded as zeros, and land on padding, or on the next row's
         columns before that row is written (lane_band leaves VW columns of room past the last row) */
      float *at = row + (c0 + d->PW) * VW;
      _Pragma("GCC unroll 16") for (int j = 0; j < 16; j++) _mm512_storeu_ps(at + j * VW, v[j]);
    }
  }
}

/* EXPR of each lane accumulator v and its step's operand x (one per lane) into the accumulator */
#define ON_LANES(EXPR)                                                                                     \
  _Pragma("GCC unroll 16") for (int j = 0; j < n; j++) { const vf v = acc[j], x = y; acc[j] = EXPR; }

/* the group's n x VW outputs of row oh from column ow0 (n of them: acc[j] is output ow0 + j of every lane), through
   the steps (ops: each step's operand per lane), transposed and stored into the group's planes; band: the buffer's
   rows from the band's first output row's window on */
static inline __attribute__((always_inline)) void lane_row(const aot_depthwise *d, const float *band,
                                                           const float (*wl)[VW], const float (*ops)[VW], int oh,
                                                           int band_oh, int ow0, const int n, const int SW, int p0,
                                                           int planes) {
  const long cols = lane_cols(d);
  vf acc[16] = {{0}};
  for (int kh = 0; kh < d->KH; kh++)
    for (int kw = 0; kw < d->KW; kw++) {
      const vf wv = *(const vf *)wl[kh * d->KW + kw];
      const float *at = band + (((long)band_oh * d->SH + kh) * cols + (long)ow0 * SW + kw) * VW;
      _Pragma("GCC unroll 16") for (int j = 0; j < n; j++) acc[j] += *(const vf *)(at + j * SW * VW) * wv;
    }
  for (int k = 0; k < d->nsteps; k++) {
    const aot_gemm_step *s = &d->steps[k];
    if (s->op == AOT_STEP_MUL_ADD) {
      k++;
      _Pragma("GCC unroll 16") for (int j = 0; j < n; j++) {
        const vf p = acc[j] * *(const vf *)ops[k - 1];
        acc[j] = p + *(const vf *)ops[k];
      }
      continue;
    }
    const vf y = *(const vf *)ops[k];
    AOT_STEP_SWITCH(s, ON_LANES, v, x)
  }
  v512 r[16];
  _Pragma("GCC unroll 16") for (int j = 0; j < 16; j++) r[j] = (v512)acc[j];
  transpose16(r);
  const long plane = (long)d->OH * d->OW;
  for (int l = 0; l < planes; l++)
    _mm512_mask_storeu_ps(d->y + (p0 + l) * plane + (long)oh * d->OW + ow0, (__mmask16)((1u << n) - 1), r[l]);
}

/* planes [p, p_end) a group of VW at a time */
static void lane_run(const aot_depthwise *d, int p, int p_end, float *buf) {
  const int taps = d->KH * d->KW;
  for (; p < p_end; p += VW) {
    const int planes = p_end - p < VW ? p_end - p : VW;
    /* each lane's weights and step operands (a lane past the group's planes repeats its first) */
    float wl[AOT_DEPTHWISE_MAX_TAPS][VW] __attribute__((aligned(64))), x[AOT_DEPTHWISE_MAX_STEPS][VW]
      __attribute__((aligned(64)));
    for (int l = 0; l < VW; l++) {
      const int q = p + (l < planes ? l : 0);
      const float *w = d->w + (long)(q / d->images) * taps;
      for (int t = 0; t < taps; t++) wl[t][l] = w[t];
      if (!d->nsteps) continue;
      plane_steps ps;
      plane_steps_of(d, q, NULL, &ps);
      for (int k = 0; k < d->nsteps; k++) x[k][l] = *ps.x[k];
    }
    const int band = lane_band(d);
    for (int oh0 = 0; oh0 < d->OH; oh0 += band) {
      const int oh1 = oh0 + band < d->OH ? oh0 + band : d->OH;
      lane_fill(d, p, planes, (long)oh0 * d->SH, (long)(oh1 - 1) * d->SH + span_h(d), buf);
      for (int oh = oh0; oh < oh1; oh++)
        for (int ow0 = 0; ow0 < d->OW; ow0 += VW) {
          const int n = d->OW - ow0 < VW ? d->OW - ow0 : VW;
          /* the row's width and the stride as constants where they are common (7-, 14- and 28-wide maps: the
             accumulators then registers, the taps' loads at fixed offsets, 1.1-1.2x the time of the general case);
             a case each costs this file's build ~0.07 s */
          switch (n * 4 + (d->SW < 3 ? d->SW : 3)) {
#define LANE_ROW(N, S) case N * 4 + S: lane_row(d, buf, wl, x, oh, oh - oh0, ow0, N, S, p, planes); break;
            LANE_ROW(16, 1) LANE_ROW(16, 2) LANE_ROW(14, 1) LANE_ROW(14, 2) LANE_ROW(12, 1) LANE_ROW(12, 2)
            LANE_ROW(7, 1) LANE_ROW(7, 2)
#undef LANE_ROW
            default: lane_row(d, buf, wl, x, oh, oh - oh0, ow0, n, d->SW, p, planes); break;
          }
        }
    }
  }
}
#else
static int lane_planes(const aot_depthwise *d) { (void)d; return 0; }
static void lane_run(const aot_depthwise *d, int p, int p_end, float *buf) { (void)d, (void)p, (void)p_end, (void)buf; }
#endif

int aot_depthwise_band_rows(const aot_depthwise *d) {
  /* output rows per band: as many as the buffer holds (codegen/lower/direct.py checks that one fits) */
  return band_outputs(d, AOT_DEPTHWISE_BUFFER / ((long)d->SW * phase_width(d)));
}

/* the planes of task t, one band of output rows at a time */
static void run_task(const aot_depthwise *d, const band_cols *cols, int t, float *buf, const long *off) {
  const int per_task = d->planes / d->tasks, band = aot_depthwise_band_rows(d);
  const long src_row = d->SH * (long)d->SW * phase_width(d);
  for (int p = t * per_task; p < (t + 1) * per_task; p++) {
    const int f = p / d->images;
    const float *x = d->x + d->x_planes[p], *w = d->w + (long)f * d->KH * d->KW;
    float *y = d->y + (long)p * d->OH * d->OW;
    plane_steps steps, *ps = NULL;
    if (d->nsteps) plane_steps_of(d, p, y, ps = &steps);
    if (small_plane(d)) {
      fill_small(d, x, buf);
      conv_small(d, buf, off, w, y, ps);
      continue;
    }
    for (int oh0 = 0; oh0 < d->OH; oh0 += band) {
      const int oh1 = oh0 + band < d->OH ? oh0 + band : d->OH;
      const int ih0 = oh0 * d->SH - d->PH, rows = (oh1 - 1 - oh0) * d->SH + span_h(d);
      fill_band(d, cols, x, ih0, rows, buf);
      int oh = oh0;
      for (; oh + ROW_BLOCK <= oh1; oh += ROW_BLOCK)
        conv_rows(d, buf + (oh - oh0) * src_row, src_row, off, w, y + (long)oh * d->OW, ROW_BLOCK, ps);
      for (; oh < oh1; oh++) conv_rows(d, buf + (oh - oh0) * src_row, src_row, off, w, y + (long)oh * d->OW, 1, ps);
    }
  }
}

void aot_depthwise_run(void *ctx, int start, int end) {
  /* tasks are taken from the call's shared counter, not from [start, end): a thread kept off its core (a loaded
     machine) then holds up at most the tasks it took last, where a fixed split left the other threads waiting for
     its whole slice (each task computes its planes whole, so results do not depend on who takes it) */
  (void)start;
  (void)end;
  aot_depthwise *d = ctx;
  float buf[AOT_DEPTHWISE_BUFFER] __attribute__((aligned(64)));
  memset(buf, 0, sizeof buf);
  const long rowlen = (long)d->SW * phase_width(d);
  const band_cols cols = band_cols_of(d);
  /* where tap (kh, kw) of output column 0 lies in the band: row kh * DH, phase (kw * DW) % SW, column
     (kw * DW) / SW */
  /* (a small plane's taps lie over its padded rows: row kh, column kw) */
  long off[AOT_DEPTHWISE_MAX_TAPS];
  const int small = small_plane(d);
  for (int kh = 0; kh < d->KH; kh++)
    for (int kw = 0; kw < d->KW; kw++) {
      const int ch = kw * dil_w(d);
      off[kh * d->KW + kw] = small ? (long)kh * (d->OW + d->KW - 1) + kw
                                   : kh * dil_h(d) * rowlen + (ch % d->SW) * phase_width(d) + ch / d->SW;
    }
  /* tasks taken at once: enough work to make the counter's cache line cheap beside it, few enough that the tasks
     still share out evenly and a task's planes are still in cache for its epilogue */
  const long task_work = (long)(d->planes / d->tasks) * d->OH * d->OW * d->KH * d->KW;
  int grain = (int)(AOT_DEPTHWISE_CLAIM_WORK / (task_work ? task_work : 1));
  const int most = d->tasks / AOT_DEPTHWISE_MIN_CLAIMS;
  grain = grain > most ? most : grain;
  grain = grain < 1 ? 1 : grain;
  const int lanes = lane_planes(d), per_task = d->planes / d->tasks;
  /* (across lanes, claims of whole groups of VW planes where the tasks' planes divide them) */
  if (lanes && VW % per_task == 0) grain = (grain * per_task + VW - 1) / VW * VW / per_task;
  for (int t0; (t0 = __atomic_fetch_add(&d->next, grain, __ATOMIC_RELAXED)) < d->tasks;) {
    const int t1 = t0 + grain < d->tasks ? t0 + grain : d->tasks;
    if (lanes) lane_run(d, t0 * per_task, t1 * per_task, buf);
    else
      for (int t = t0; t < t1; t++) run_task(d, &cols, t, buf, off);
    if (d->epilogue) d->epilogue(d->epilogue_ctx, t0, t1);
  }
}
