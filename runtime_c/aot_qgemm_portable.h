/* The int8 contraction's packing and requantization on any target, included by aot_qgemm.c alone after the
   instruction set's own header (aot_qgemm_avx512.h, _avx2.h, _sse2.h; its tile is aot_qmicro.h's): each function here
   lets that header's vector part (pack_rows_vector, ...) go as far as it does, then finishes bytewise. Where no
   header of this build has one, the part does nothing (0: no columns, rows or k done). */
#ifndef AOT_QGEMM_PORTABLE_H
#define AOT_QGEMM_PORTABLE_H

#if !defined(AOT_QGEMM_SSE2_H)
#define pack_kmajor_vector(src, lda, rows, rows_after, kc, kin, flip, tile, pair) (*(pair) = 0)
#define transpose_vector(src, ss, dst, ds, rows, cols) 0
#define pack_rows_vector(src, lda, rows, kin, flip, tile) 0
#endif
#if !defined(AOT_QGEMM_AVX512_H) && !defined(AOT_QGEMM_AVX2_H)
#define requantize_vector(sum, corr, sc, nr, lo, hi, bias8, flip8, q) 0
#endif

#if !defined(AOT_QGEMM_AVX512_H)
#define column_terms_vector(g, n0, nr, zero, corr, sc) 0
/* (write_bytes then writes a convolution's output through transpose_bytes) */
#define write_columns(g, acc, corr, sc, m0, n0, mr, nr, hi, u8) 0
int aot_qgemm_reads_plane(const aot_qim2col *p) {
  (void)p;
  return 0;
}
typedef struct plane_rows plane_rows;

/* A k-major ([K][M], a convolution's im2col written along its output rows): the slice packed as the row-major path
   packs it, 4 k of QMR rows at a time by a 4 x 8 byte transpose where the tile is whole, bytewise at the edges. With
   rows (the call's plane_rows, g->plane set) and valid (the block's plane_masks), read from the planes instead */
static void pack_kmajor(const aot_qgemm *g, int m0, int mr, int k0, int kc, int kin, uint8_t flip,
                        const plane_rows *rows_of, const uint64_t *valid, uint8_t *restrict ap) {
  (void)rows_of;
  (void)valid;
  for (int t = 0; t < cdiv(mr, QMR); t++) {
    uint8_t *tile = ap + t * QMR * kc;
    const uint8_t *src = g->a + (long)k0 * g->lda + m0 + t * QMR;
    const int rows = min(mr - t * QMR, QMR);
    int pair;
    int k = pack_kmajor_vector(src, g->lda, rows, mr - (t + 1) * QMR, kc, kin, flip, tile, &pair);
    for (; k < kc; k++)
      for (int i = 0; i < QMR; i++)
        tile[(k / 4) * QMR * 4 + i * 4 + k % 4] = i < rows && k < kin ? (uint8_t)(src[(long)k * g->lda + i] ^ flip) : 0;
    t += pair;
  }
}
#endif

/* dst[j][i] = src[i][j] for i < rows, j < cols (row strides ss, ds): 16 x 16 blocks by four rounds of byte
   unpacks where whole, bytewise at the edges. A convolution's result (m contiguous) is written through this: the
   bytewise transpose (which the compilers make a scatter of single bytes) was 31% of the first 7x7/2 convolution's
   int8 call */
static void transpose_bytes(const uint8_t *restrict src, int ss, uint8_t *restrict dst, int ds, int rows, int cols) {
  for (int i = transpose_vector(src, ss, dst, ds, rows, cols); i < rows; i++)
    for (int j = 0; j < cols; j++) dst[j * ds + i] = src[i * ss + j];
}

/* A row-major ([M][K]): the slice packed 16 k of QMR rows at a time by a 4 x 4 transpose of 4-byte words per 4 rows
   (rows past M zero), bytewise for the last k. Word by word, the compilers made it a scatter of 4-byte stores, and
   rows past M (M = 49 of a 7x7 layer: 7 of its 56) a byte loop: 22% of a 49x512x4608 call */
static void pack_rows(const aot_qgemm *g, int m0, int mr, int k0, int kc, int kin, uint8_t flip, uint8_t *restrict ap) {
  for (int t = 0; t < cdiv(mr, QMR); t++) {
    uint8_t *tile = ap + t * QMR * kc;
    const uint8_t *src = g->a + (long)(m0 + t * QMR) * g->lda + k0;
    const int rows = min(mr - t * QMR, QMR);
    for (int k = pack_rows_vector(src, g->lda, rows, kin, flip, tile); k < kc; k++)
      for (int i = 0; i < QMR; i++)
        tile[(k / 4) * QMR * 4 + i * 4 + k % 4] = i < rows && k < kin ? (uint8_t)(src[(long)i * g->lda + k] ^ flip) : 0;
  }
}

/* q[e] = clamp(rint((sum[e] + corr[e]) * sc[e]), lo, hi) + bias8 as a byte, ^ flip8 (int8 as uint8 shifted by 128).
   Clamping first is the same (lo and hi are integers) and keeps the conversion in range; the conversion rounds half
   to even (the default rounding mode, as rint). Written with vectors: gcc's loop vectoriser is off (build.py), and
   the scalar loop was a third of the stem's 12544x64x147 call built by gcc. The clamps as compares (fmaxf/fminf's
   NaN handling cost a compare and a blend each); max_ps(r, lo) gives lo for a NaN r, as the compare does */
static void requantize_row(const int32_t *restrict sum, const int32_t *restrict corr, const float *restrict sc, int nr,
                           float lo, float hi, int bias8, uint8_t flip8, uint8_t *restrict q) {
  for (int e = requantize_vector(sum, corr, sc, nr, lo, hi, bias8, flip8, q); e < nr; e++) {
    const int32_t v = (int32_t)((uint32_t)sum[e] + (uint32_t)corr[e]);
    float r = (float)v * sc[e];
    r = r > lo ? r : lo;
    r = r < hi ? r : hi;
    q[e] = (uint8_t)((int32_t)__builtin_rintf(r) + bias8) ^ flip8;
  }
}

/* the epilogue's zero-point correction and bias per column (corr) and scale (sc) of columns [n0, n0 + nr) */
static void column_terms(const aot_qgemm *g, int n0, int nr, int32_t zero, int32_t *corr, float *sc) {
  for (int e = column_terms_vector(g, n0, nr, zero, corr, sc); e < nr; e++) {
    const int n = n0 + e;
    /* wrapping int32 arithmetic, as vpdpbusd's own */
    corr[e] = (int32_t)((uint32_t)(g->bias ? g->bias[n] : 0) - (uint32_t)zero * (uint32_t)g->col_sum[n]);
    sc[e] = g->scale ? g->scale[n * g->scale_step] : 0.0f;
  }
}
#endif
