/* The int8 contraction's AVX2 requantization, included by aot_qgemm.c alone (its tile is aot_qmicro.h's). */
#ifndef AOT_QGEMM_AVX2_H
#define AOT_QGEMM_AVX2_H
#include <immintrin.h>

/* requantize_row (aot_qgemm_portable.h) 8 columns at a time; returns the columns done */
static int requantize_vector(const int32_t *restrict sum, const int32_t *restrict corr, const float *restrict sc,
                             int nr, float lo, float hi, int bias8, uint8_t flip8, uint8_t *restrict q) {
  int e = 0;
  const __m256 lo8 = _mm256_set1_ps(lo), hi8 = _mm256_set1_ps(hi);
  const __m256i bias8v = _mm256_set1_epi32(bias8);
  for (; e + 8 <= nr; e += 8) {
    const __m256i v = _mm256_add_epi32(_mm256_loadu_si256((const __m256i *)(sum + e)),
                                       _mm256_loadu_si256((const __m256i *)(corr + e)));
    __m256 r = _mm256_mul_ps(_mm256_cvtepi32_ps(v), _mm256_loadu_ps(sc + e));
    r = _mm256_min_ps(_mm256_max_ps(r, lo8), hi8);
    const __m256i b = _mm256_add_epi32(_mm256_cvtps_epi32(r), bias8v);
    /* the 8 low bytes of the lanes (each 0..255) */
    const __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
    const __m128i bytes = _mm_xor_si128(_mm_packus_epi16(w, w), _mm_set1_epi8((char)flip8));
    _mm_storel_epi64((__m128i *)(q + e), bytes);
  }
  return e;
}
#endif
