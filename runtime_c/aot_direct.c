/* Depthwise convolution computed directly (see codegen/direct.py): every plane (one channel of one image) is
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
#include "aot_runtime.h"

#if defined(__AVX512F__)
typedef float vf __attribute__((vector_size(64), aligned(4)));
#else
typedef float vf __attribute__((vector_size(32), aligned(4)));
#endif
enum { VW = (int)(sizeof(vf) / sizeof(float)) };
/* vectors of outputs computed at once: 4 accumulators leave registers for the loads (1 and 2 were slower on
   MobileNet-like 112x112 planes, more spill on AVX2) */
#define SEG_VECTORS 4

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

/* padded columns per phase: whole vectors of outputs plus the window's reach past them */
static int phase_width(const aot_depthwise *d) { return (d->OW + VW - 1) / VW * VW + (d->KW - 1) / d->SW; }

/* Copy input rows [ih0, ih0 + rows) (rows outside the plane are zeros) into buf as [rows][SW][Wq]. */
AOT_LOOP_VECTORIZE static void fill_band(const aot_depthwise *d, const float *x, int ih0, int rows, float *buf) {
  const int SW = d->SW, Wq = phase_width(d);
  for (int r = 0; r < rows; r++) {
    const int ih = ih0 + r;
    for (int p = 0; p < SW; p++) {
      float *out = buf + ((long)r * SW + p) * Wq;
      if (ih < 0 || ih >= d->H) { memset(out, 0, (size_t)Wq * sizeof(float)); continue; }
      const float *row = x + (long)ih * d->x_row;
      /* padded column q * SW + p is input column q * SW + p - PW: valid for q in [q0, q1) */
      const int first = p - d->PW;
      int q0 = first >= 0 ? 0 : (-first + SW - 1) / SW;
      int q1 = d->W - first > 0 ? (d->W - first + SW - 1) / SW : 0;
      if (q0 > Wq) q0 = Wq;
      if (q1 > Wq) q1 = Wq;
      if (q1 < q0) q1 = q0;
      for (int q = 0; q < q0; q++) out[q] = 0;
      if (SW == 1) memcpy(out + q0, row + q0 + first, (size_t)(q1 - q0) * sizeof(float));
      else {
        int q = q0;
#ifdef HAVE_EVEN
        if (SW == 2)
          for (; 2L * (q + VW) + first <= d->W; q += VW)
            *(vf *)(out + q) = EVEN(*(const vf *)(row + 2L * q + first), *(const vf *)(row + 2L * q + first + VW));
#endif
        for (; q < q1; q++) out[q] = row[(long)q * SW + first];
      }
      for (int q = q1; q < Wq; q++) out[q] = 0;
    }
  }
}

/* NV vectors of outputs at src (the band's first tap) from the taps at offsets off[t] with weights w[t], in registers */
static inline __attribute__((always_inline)) void segment(int taps, const long *off, const float *w, const float *src,
                                                          float *y, const int NV) {
  vf acc[SEG_VECTORS] = {{0}};
  for (int t = 0; t < taps; t++) {
    const float wv = w[t], *p = src + off[t];
    _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) acc[v] += *(const vf *)(p + v * VW) * wv;
  }
  _Pragma("GCC unroll 4") for (int v = 0; v < NV; v++) *(vf *)(y + v * VW) = acc[v];
}

/* one output row from the band rows starting at src, the taps at offsets off */
static void conv_row(const aot_depthwise *d, const float *src, const long *off, const float *w, float *y) {
  const int taps = d->KH * d->KW, OW = d->OW;
  int ow = 0;
  for (; ow + SEG_VECTORS * VW <= OW; ow += SEG_VECTORS * VW) segment(taps, off, w, src + ow, y + ow, SEG_VECTORS);
  for (; ow + VW <= OW; ow += VW) segment(taps, off, w, src + ow, y + ow, 1);
  if (ow < OW) {
    float last[VW] __attribute__((aligned(64)));
    segment(taps, off, w, src + ow, last, 1);
    memcpy(y + ow, last, (size_t)(OW - ow) * sizeof(float));
  }
}

int aot_depthwise_band_rows(const aot_depthwise *d) {
  /* output rows per band: as many as the buffer holds (codegen/direct.py checks that one fits) */
  const long row = (long)d->SW * phase_width(d);
  const long in_rows = AOT_DEPTHWISE_BUFFER / row;
  return in_rows < d->KH ? 0 : (int)((in_rows - d->KH) / d->SH + 1);
}

void aot_depthwise_run(void *ctx, int start, int end) {
  const aot_depthwise *d = ctx;
  float buf[AOT_DEPTHWISE_BUFFER] __attribute__((aligned(64)));
  const int per_task = d->planes / d->tasks, band = aot_depthwise_band_rows(d), Wq = phase_width(d);
  const long rowlen = (long)d->SW * Wq;
  /* where tap (kh, kw) of output column 0 lies in the band: row kh, phase kw % SW, column kw / SW */
  long off[AOT_DEPTHWISE_MAX_TAPS];
  for (int kh = 0; kh < d->KH; kh++)
    for (int kw = 0; kw < d->KW; kw++) off[kh * d->KW + kw] = kh * rowlen + (kw % d->SW) * Wq + kw / d->SW;
  for (int t = start; t < end; t++) {
    for (int p = t * per_task; p < (t + 1) * per_task; p++) {
      const float *x = d->x + (long)p * d->x_plane, *w = d->w + (long)p * d->KH * d->KW;
      float *y = d->y + (long)p * d->OH * d->OW;
      for (int oh0 = 0; oh0 < d->OH; oh0 += band) {
        const int oh1 = oh0 + band < d->OH ? oh0 + band : d->OH;
        const int ih0 = oh0 * d->SH - d->PH, rows = (oh1 - 1 - oh0) * d->SH + d->KH;
        fill_band(d, x, ih0, rows, buf);
        for (int oh = oh0; oh < oh1; oh++) conv_row(d, buf + (oh - oh0) * d->SH * rowlen, off, w, y + (long)oh * d->OW);
      }
    }
    if (d->epilogue) d->epilogue(d->epilogue_ctx, t, t + 1);
  }
}
