/* An 8-bit convolution's k-major A (aot_qim2col_run, declared in aot_qim2col.h) that the int8 microkernel
   (aot_qgemm.c) reads; recognised by codegen/lower/qpool.py. */
#include <stdint.h>
#include <string.h>
#include "aot_qim2col.h"
/* AOT_QPOOL_ROW: the row buffer codegen/lower/qpool.py sizes both window routines' rows against */
#include "aot_qpool.h"
#include "aot_qvec.h"
#if defined(__AVX512BW__)
#include <immintrin.h>
#endif

static int cdiv(int a, int b) { return (a + b - 1) / b; }
static int min(int a, int b) { return a < b ? a : b; }
static int max(int a, int b) { return a > b ? a : b; }


/* *** an 8-bit convolution's k-major A (aot_qim2col): a tap's row of A is its output rows one after another
   (oy * OW + ox), each a run of the padded input at the stride. The padded plane is put in a buffer once per plane
   where it fits (ResNet's up to 56x56), else the padded input rows of a band of output rows once per (plane, kh); the
   runs are then read with no bounds to check. A run is one vector where it fits in one (the smallest of 8 to 64
   bytes that holds it), which spills past the run's end into the tap's next rows, written after it: a 7-byte row is
   one 8-byte store, not a tail of two overlapping ones or a call of memcpy. A tap's last rows are written exactly,
   as the bytes after them may be another task's. At stride 2, the low bytes of 16-bit lanes, narrowed. Thread CPU
   medians, clang-19, 3x3 pad 1 over 512x7x7 / 256x14x14 / 64x56x56: at stride 1 0.028 / 0.021 / 0.026 ms, where the
   generated copy (rows under 16 bytes as scalar gated loads) took 0.055 / 0.14 / 0.068 and a padded row buffer per
   output row and tap row written exactly 0.068 / 0.066 / 0.074; at stride 2 over 256x14x14 0.019 against 0.065 for
   that row buffer and its scalar loop under 16 outputs. The generated copy read stride-2 bytes one by one (ResNet-18's
   7x7/2 first conv: 0.45 ms for 1.8 MB, 4 GB/s; this 0.062) *** */

typedef uint16_t qv16a __attribute__((vector_size(32), aligned(1), may_alias));
typedef uint16_t qw16a __attribute__((vector_size(64), aligned(1), may_alias));

/* the buffer of padded rows (a 56x56 plane padded by 1 is 3364 bytes), and the bytes kept after its rows: a run's
   one vector reads up to 31 past the row's end (64 bytes for a stride-2 run of 17 outputs) */
#define QIM2COL_BUF (4 * AOT_QPOOL_ROW)
#define QIM2COL_SLACK 128

/* out[0, n) = x[0, n): up to 64 bytes (a row of a 7x7 to 56x56 plane) two overlapping moves of the largest vector
   that fits, where a call of memcpy cost more than the copy */
static inline void copy_run(uint8_t *restrict out, const uint8_t *restrict x, int n) {
  /* (a loop of vector moves would be made a call of memcpy again) */
  if (n > 2 * QV)
    memcpy(out, x, (size_t)n);
  else if (n >= QV) {
    *(qv8 *)out = *(const qv8 *)x;
    *(qv8 *)(out + n - QV) = *(const qv8 *)(x + n - QV);
  } else if (n >= 16) {
    *(qh8 *)out = *(const qh8 *)x;
    *(qh8 *)(out + n - 16) = *(const qh8 *)(x + n - 16);
  } else if (n >= 8) {
    uint64_t a, b;
    memcpy(&a, x, 8);
    memcpy(&b, x + n - 8, 8);
    memcpy(out, &a, 8);
    memcpy(out + n - 8, &b, 8);
  } else if (n >= 4) {
    uint32_t a, b;
    memcpy(&a, x, 4);
    memcpy(&b, x + n - 4, 4);
    memcpy(out, &a, 4);
    memcpy(out + n - 4, &b, 4);
  } else
    for (int i = 0; i < n; i++) out[i] = x[i];
}

/* outputs [at, at + lanes) of a stride-2 run: the low bytes of 16-bit lanes, narrowed */
#define QIM2COL_EVEN(bytes, pairs, at) (*(bytes *)(out + (at)) = __builtin_convertvector(*(const pairs *)(t + 2 * (at)) & 0xff, bytes))

/* out[ox] = t[ox * SW] for ox < n, exactly; t may be read up to QIM2COL_SLACK past its last element used */
static inline void exact_run(uint8_t *restrict out, const uint8_t *restrict t, int n, int SW) {
  if (SW == 1)
    copy_run(out, t, n);
  else if (SW == 2 && n >= QV) {
    /* whole vectors, the last ending at n (overlapping the one before) */
    int ox = 0;
    for (; ox + QV <= n; ox += QV) QIM2COL_EVEN(qv8, qw16a, ox);
    if (ox < n) QIM2COL_EVEN(qv8, qw16a, n - QV);
  } else if (SW == 2 && n >= 16) {
    QIM2COL_EVEN(qh8, qv16a, 0);
    QIM2COL_EVEN(qh8, qv16a, n - 16);
  } else if (SW == 2 && n >= 8) {
    QIM2COL_EVEN(qq8, qh16, 0);
    QIM2COL_EVEN(qq8, qh16, n - 8);
  } else
    for (int ox = 0; ox < n; ox++) out[ox] = t[ox * SW];
}

/* rows [oy, stop) of a tap as one vector each, spilling past the row into the next (v: the vector's bytes) */
#define QIM2COL_SPILL(stmt)                                                                                         \
  for (; oy < stop; oy++) {                                                                                          \
    uint8_t *restrict out = dst + (long)oy * n;                                                                      \
    const uint8_t *restrict t = src + (oy - o0) * rs;                                                                \
    stmt;                                                                                                            \
  }

/* the bytes of the vector a run of n outputs at stride SW spills into, 0 where none holds it */
static int spill_width(int n, int SW) {
  if (SW == 1 && n <= 2 * QV) return n <= 8 ? 8 : n <= 16 ? 16 : n <= QV ? QV : 2 * QV;
  if (SW == 2 && n <= QV) return n <= 8 ? 8 : n <= 16 ? 16 : QV;
  return 0;
}

/* (inlined where called, so that the callers' constant stride and vector width choose one store per row) */
#define QIM2COL_INLINE static inline __attribute__((always_inline))

/* output rows [o0, o1) of one tap's row of A (at dst), row oy read at src + (oy - o0) * rs at the column stride:
   each row one vector of v bytes (spill_width's), spilling into the rows after, which are written later; the
   rows from exact_from on, too near the tap's end for the spill, exactly */
QIM2COL_INLINE void tap_rows(uint8_t *restrict dst, const uint8_t *restrict src, long rs, int o0, int o1, int n, int SW,
                             int v, int exact_from) {
  const int stop = min(o1, exact_from);
  int oy = o0;
  if (SW == 1 && v == 8) QIM2COL_SPILL(*(qq8 *)out = *(const qq8 *)t)
  else if (SW == 1 && v == 16) QIM2COL_SPILL(*(qh8 *)out = *(const qh8 *)t)
  else if (SW == 1 && v == QV) QIM2COL_SPILL(*(qv8 *)out = *(const qv8 *)t)
  else if (SW == 1 && v == 2 * QV) {
    QIM2COL_SPILL(*(qv8 *)out = *(const qv8 *)t; *(qv8 *)(out + QV) = *(const qv8 *)(t + QV))
  }
  else if (SW == 2 && v == 8) QIM2COL_SPILL(QIM2COL_EVEN(qq8, qh16, 0))
  else if (SW == 2 && v == 16) QIM2COL_SPILL(QIM2COL_EVEN(qh8, qv16a, 0))
  else if (SW == 2 && v == QV) QIM2COL_SPILL(QIM2COL_EVEN(qv8, qw16a, 0))
  for (; oy < o1; oy++) exact_run(dst + (long)oy * n, src + (oy - o0) * rs, n, SW);
}

/* the taps (kh, kw) of one plane for kh in [kh0, kh1) into y (its rows of A), from its padded plane b (rows wp
   apart) */
QIM2COL_INLINE void plane_taps(const aot_qim2col *p, uint8_t *y, const uint8_t *b, int wp, int kh0, int kh1, int SW,
                               int v, int exact_from) {
  for (int kh = kh0; kh < kh1; kh++)
    for (int kw = 0; kw < p->KW; kw++)
      tap_rows(y + kh * p->y_kh + kw * p->y_kw, b + kh * wp + kw, (long)p->SH * wp, 0, p->OH, p->OW, SW, v, exact_from);
}

/* plane_taps for the stride and vector width given, as constants where they are one of spill_width's */
static void plane_taps_at(const aot_qim2col *p, uint8_t *y, const uint8_t *b, int wp, int kh0, int kh1, int v,
                          int exact_from) {
  const int SW = p->SW;
#define QIM2COL_CASE(sw, width) \
  if (SW == (sw) && v == (width)) plane_taps(p, y, b, wp, kh0, kh1, sw, width, exact_from); else
  QIM2COL_CASE(1, 8) QIM2COL_CASE(1, 16) QIM2COL_CASE(1, QV) QIM2COL_CASE(1, 2 * QV) QIM2COL_CASE(2, 8)
  QIM2COL_CASE(2, 16) QIM2COL_CASE(2, QV) plane_taps(p, y, b, wp, kh0, kh1, SW, 0, 0);
#undef QIM2COL_CASE
}

/* plane c of the input into its padded plane b (rows wp apart, the padding already there) */
static void plane_in(const aot_qim2col *p, int c, uint8_t *restrict b, int wp) {
  const uint8_t *x = p->x + c * p->x_plane;
  for (int iy = 0; iy < p->H; iy++) copy_run(b + (long)(p->PH + iy) * wp + p->PW, x + iy * p->x_row, p->W);
}

#if defined(__AVX512BW__)
/* Where the output rows are as wide as the input's (OW == W, stride 1: a "same" convolution) and the plane's rows
   lie one after another (x_row == W), a tap's row of A is the plane itself read d = (kh - PH) * W + kw - PW bytes
   on, with the bytes whose row or column falls outside it the pad: per 64 bytes one load masked to the valid lanes
   over a vector of the pad, and a store, from no buffer. The masks, for planes of up to QSAME_MAX bytes, are made
   once per call (KH * KW * M bits). Thread CPU medians of 401 calls interleaved, 3x3 pad 1, the padded-buffer path
   -> this: 512x7x7 0.029 -> 0.017 ms (clang-19), 0.042 -> 0.019 (gcc); 256x14x14 0.034 -> 0.022, 0.042 -> 0.025;
   at 128x28x28 (784 bytes) none faster (0.021 both), so planes up to QSAME_MAX only. (Grouping several planes' padded
   copies in the buffer before reading any, against a store-forwarding stall, gained nothing: 0.052 -> 0.055 at
   512x7x7.) */
#define QSAME_MAX 256
static int qim2col_same(const aot_qim2col *p, int start, int end) {
  const int W = p->W, M = p->OH * p->OW, KH = p->KH, KW = p->KW, chunks = (M + 63) / 64;
  if (p->SW != 1 || p->SH != 1 || p->OW != W || p->x_row != W || M > QSAME_MAX || KW * KH > 16) return 0;
  /* valid[kh * KW + kw][j]: the lanes of chunk j whose row oy + kh - PH and column ox + kw - PW are inside the
     plane */
  uint64_t valid[16][QSAME_MAX / 64];
  for (int kh = 0; kh < KH; kh++)
    for (int kw = 0; kw < KW; kw++) {
      const int lo = p->PW - kw, hi = W + p->PW - kw;
      const int rlo = max(0, p->PH - kh) * W, rhi = min(p->OH, p->H + p->PH - kh) * W;
      for (int j = 0; j < chunks; j++) {
        uint64_t bits = 0;
        for (int l = 0, m = j * 64, ox = m % W; l < 64; l++, m++, ox = ox + 1 == W ? 0 : ox + 1)
          bits |= (uint64_t)(ox >= lo && ox < hi && m >= rlo && m < rhi) << l;
        valid[kh * KW + kw][j] = bits;
      }
    }
  const __m512i pad = _mm512_set1_epi8((char)p->pad);
  const __mmask64 tail = M % 64 ? ((uint64_t)1 << (M % 64)) - 1 : ~(uint64_t)0;
  /* the last chunk's bytes past a row spill into the rows of the next taps of its kh, written after it, where they
     are next and hold them (taps before kw_spill) */
  const int over = chunks * 64 - M, kw_spill = p->y_kw == M ? KW - cdiv(over, M) : 0;
  for (int t = start; t < end; t++) {
    const int c = t / KH, kh = t % KH;
    const uint8_t *x = p->x + c * p->x_plane;
    for (int kw = 0; kw < KW; kw++) {
      const uint64_t *k = valid[kh * KW + kw];
      /* (the masked lanes are not read: x + d may lie before or after the plane) */
      const uintptr_t at = (uintptr_t)x + (kh - p->PH) * W + kw - p->PW;
      uint8_t *y = p->y + c * p->y_plane + kh * p->y_kh + kw * p->y_kw;
      int j = 0;
      for (; j + 1 < chunks; j++)
        _mm512_storeu_si512(y + j * 64, _mm512_mask_loadu_epi8(pad, k[j], (const void *)(at + j * 64)));
      const __m512i v = _mm512_mask_loadu_epi8(pad, k[j], (const void *)(at + j * 64));
      if (kw < kw_spill) _mm512_storeu_si512(y + j * 64, v);
      else _mm512_mask_storeu_epi8(y + j * 64, tail, v);
    }
  }
  return 1;
}
#endif

void aot_qim2col_run(void *ctx, int start, int end) {
  const aot_qim2col *p = ctx;
  if (start >= end) return;
#if defined(__AVX512BW__)
  if (qim2col_same(p, start, end)) return;
#endif
  const int OW = p->OW, OH = p->OH, W = p->W, PW = p->PW, SW = p->SW, KH = p->KH;
  /* the rows from exact_from on have fewer than v - OW bytes of their tap's row after them */
  const int v = spill_width(OW, SW), exact_from = v ? OH - cdiv(v - OW, OW) : 0;
  /* the padded rows: b[r * wp + PW + ix] holds column ix of padded row r, the rest the pad; codegen/lower/qpool.py keeps
     a row within AOT_QPOOL_ROW less the vector read past its end, so at least one fits */
  const int wp = max((OW - 1) * SW + p->KW, PW + W), hp = max((OH - 1) * p->SH + KH, p->PH + p->H);
  const int whole = (long)hp * wp <= QIM2COL_BUF - QIM2COL_SLACK;
  const int band = whole ? OH : min(OH, (QIM2COL_BUF - QIM2COL_SLACK) / wp);
  uint8_t b[QIM2COL_BUF] __attribute__((aligned(64)));
  memset(b, p->pad, (size_t)(whole ? hp : band) * wp + QIM2COL_SLACK);
  /* a task is one (plane, kh): a 3-channel image's first convolution splits into 21, not 3; a whole plane is put in
     the buffer once for the tasks of a split that share it */
  const int c0 = start / KH, c1 = (end - 1) / KH + 1;
  for (int c = c0; c < c1; c++) {
    const int kh0 = max(start - c * KH, 0), kh1 = min(end - c * KH, KH);
    const uint8_t *x = p->x + c * p->x_plane;
    uint8_t *y = p->y + c * p->y_plane;
    if (whole) {
      plane_in(p, c, b, wp);
      plane_taps_at(p, y, b, wp, kh0, kh1, v, exact_from);
      continue;
    }
    for (int kh = kh0; kh < kh1; kh++)
      for (int o0 = 0; o0 < OH; o0 += band) {
        const int o1 = min(OH, o0 + band);
        for (int oy = o0; oy < o1; oy++) {
          const int iy = oy * p->SH - p->PH + kh;
          uint8_t *row = b + (long)(oy - o0) * wp + PW;
          if (iy < 0 || iy >= p->H) memset(row, p->pad, (size_t)W);
          else copy_run(row, x + iy * p->x_row, W);
        }
        for (int kw = 0; kw < p->KW; kw++)
          tap_rows(y + kh * p->y_kh + kw * p->y_kw, b + kw, wp, o0, o1, OW, SW, v, exact_from);
      }
  }
}
