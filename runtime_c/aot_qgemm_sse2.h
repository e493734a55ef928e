/* The int8 contraction's SSE2 pieces (every x86-64), included by aot_qgemm.c alone: A's tiles packed (a k-major A
   here only below AVX-512) and the output's bytes transposed by byte and word unpacks. Each returns how far it got;
   aot_qgemm_portable.h's loops do the rest. */
#ifndef AOT_QGEMM_SSE2_H
#define AOT_QGEMM_SSE2_H
#include <immintrin.h>

#if !defined(AOT_QGEMM_AVX512_H)
/* pack_kmajor's tile (aot_qgemm_portable.h) at src, rows_after rows of the block after it: 4 k at a time by a 4 x 8
   byte transpose where the tile is whole, with the next tile too where that is whole (*pair: then it is packed
   whole, its tail too); returns the k done */
static int pack_kmajor_vector(const uint8_t *src, long lda, int rows, int rows_after, int kc, int kin, uint8_t flip,
                              uint8_t *restrict tile, int *pair) {
  int k = 0;
  const __m128i x = _mm_set1_epi8((char)flip);
  /* two whole tiles at once where there are: 16-byte rows, half the instructions per byte (the pack was a fifth
     of a 3136x64x576 call) */
  *pair = rows == QMR && rows_after >= QMR;
  if (*pair) {
    uint8_t *next = tile + QMR * kc;
    for (; k + 4 <= kin; k += 4) {
      const uint8_t *s0 = src + (long)k * lda;
      const __m128i r0 = _mm_loadu_si128((const __m128i *)s0), r1 = _mm_loadu_si128((const __m128i *)(s0 + lda));
      const __m128i r2 = _mm_loadu_si128((const __m128i *)(s0 + 2 * lda));
      const __m128i r3 = _mm_loadu_si128((const __m128i *)(s0 + 3 * lda));
      const __m128i lo01 = _mm_unpacklo_epi8(r0, r1), lo23 = _mm_unpacklo_epi8(r2, r3);
      const __m128i hi01 = _mm_unpackhi_epi8(r0, r1), hi23 = _mm_unpackhi_epi8(r2, r3);
      _mm_storeu_si128((__m128i *)(tile + k * QMR), _mm_xor_si128(_mm_unpacklo_epi16(lo01, lo23), x));
      _mm_storeu_si128((__m128i *)(tile + k * QMR + 16), _mm_xor_si128(_mm_unpackhi_epi16(lo01, lo23), x));
      _mm_storeu_si128((__m128i *)(next + k * QMR), _mm_xor_si128(_mm_unpacklo_epi16(hi01, hi23), x));
      _mm_storeu_si128((__m128i *)(next + k * QMR + 16), _mm_xor_si128(_mm_unpackhi_epi16(hi01, hi23), x));
    }
    for (int kk = k; kk < kc; kk++)
      for (int i = 0; i < QMR; i++)
        next[(kk / 4) * QMR * 4 + i * 4 + kk % 4] = kk < kin ? (uint8_t)(src[(long)kk * lda + QMR + i] ^ flip) : 0;
  }
  if (rows == QMR) {
    for (; k + 4 <= kin; k += 4) {
      const uint8_t *s0 = src + (long)k * lda;
      const __m128i r0 = _mm_loadl_epi64((const __m128i *)s0), r1 = _mm_loadl_epi64((const __m128i *)(s0 + lda));
      const __m128i r2 = _mm_loadl_epi64((const __m128i *)(s0 + 2 * lda));
      const __m128i r3 = _mm_loadl_epi64((const __m128i *)(s0 + 3 * lda));
      const __m128i t01 = _mm_unpacklo_epi8(r0, r1), t23 = _mm_unpacklo_epi8(r2, r3);
      _mm_storeu_si128((__m128i *)(tile + k * QMR), _mm_xor_si128(_mm_unpacklo_epi16(t01, t23), x));
      _mm_storeu_si128((__m128i *)(tile + k * QMR + 16), _mm_xor_si128(_mm_unpackhi_epi16(t01, t23), x));
    }
  }
  return k;
}
#endif

/* x[j] byte i = x[i] byte j */
static inline void transpose16(__m128i x[16]) {
  /* unrolled whole, or gcc keeps x and y in memory (the stem's 12544x64x147 was 40% slower built by gcc) */
#pragma GCC unroll 4
  for (int round = 0; round < 4; round++) {
    __m128i y[16];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
      y[2 * i] = _mm_unpacklo_epi8(x[i], x[i + 8]);
      y[2 * i + 1] = _mm_unpackhi_epi8(x[i], x[i + 8]);
    }
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) x[i] = y[i];
  }
}

/* transpose_bytes' (aot_qgemm_portable.h) whole 16 x 16 blocks, and the columns past them of the rows done: returns
   those rows */
static int transpose_vector(const uint8_t *restrict src, int ss, uint8_t *restrict dst, int ds, int rows, int cols) {
  int i0 = 0;
  for (; i0 + 16 <= rows; i0 += 16)
    for (int j0 = 0; j0 + 16 <= cols; j0 += 16) {
      __m128i x[16];
      for (int i = 0; i < 16; i++) x[i] = _mm_loadu_si128((const __m128i *)(src + (i0 + i) * ss + j0));
      transpose16(x);
      for (int j = 0; j < 16; j++) _mm_storeu_si128((__m128i *)(dst + (j0 + j) * ds + i0), x[j]);
    }
  /* the columns past the whole blocks of the rows done */
  for (int i = 0; i < i0; i++)
    for (int j = cols / 16 * 16; j < cols; j++) dst[j * ds + i] = src[i * ss + j];
  return i0;
}

/* pack_rows' tile (aot_qgemm_portable.h) at src, 16 k at a time; returns the k done */
static int pack_rows_vector(const uint8_t *src, long lda, int rows, int kin, uint8_t flip, uint8_t *restrict tile) {
  int k = 0;
  const __m128i x = _mm_set1_epi8((char)flip);
  for (; k + 16 <= kin; k += 16)
    for (int h = 0; h < QMR; h += 4) {
      __m128i r[4];
      for (int i = 0; i < 4; i++)
        r[i] = h + i < rows ? _mm_xor_si128(_mm_loadu_si128((const __m128i *)(src + (long)(h + i) * lda + k)), x)
                            : _mm_setzero_si128();
      const __m128i t0 = _mm_unpacklo_epi32(r[0], r[1]), t1 = _mm_unpacklo_epi32(r[2], r[3]);
      const __m128i t2 = _mm_unpackhi_epi32(r[0], r[1]), t3 = _mm_unpackhi_epi32(r[2], r[3]);
      /* k group j of rows h..h+3 goes to tile + (k/4 + j) * QMR * 4 + h * 4 */
      uint8_t *d = tile + (k / 4) * QMR * 4 + h * 4;
      _mm_storeu_si128((__m128i *)d, _mm_unpacklo_epi64(t0, t1));
      _mm_storeu_si128((__m128i *)(d + QMR * 4), _mm_unpackhi_epi64(t0, t1));
      _mm_storeu_si128((__m128i *)(d + 2 * QMR * 4), _mm_unpacklo_epi64(t2, t3));
      _mm_storeu_si128((__m128i *)(d + 3 * QMR * 4), _mm_unpackhi_epi64(t2, t3));
    }
  return k;
}
#endif
