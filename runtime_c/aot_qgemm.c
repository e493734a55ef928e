/* The int8 matrix-multiply microkernel (declared in aot_runtime.h; weights packed by codegen/quant.py).

   C[m][n] = sum_k (A[m][k] - a_zero) * B[k][n] + bias[n], A uint8 or int8 (a runtime operand, row stride lda), B
   int8 weights packed at compile time in tiles of QNR columns: [N/QNR][K4/4][QNR][4] (K4 = K rounded up to 4, zero
   padded), with col_sum[n] = sum_k B[k][n] for the zero-point correction. Every product is exact in int32:
   sum_k (a - z) b = sum_k a b - z col_sum[n], and an int8 A is read as uint8 a ^ 0x80 = a + 128, so its zero moves
   by 128. No step saturates (unlike a u8 x s8 pairwise add into int16), so results equal the integer sum exactly.

   The result is either int32 C, or C requantized to uint8/int8: clamp(rint(float(C) * scale[n]) + out_zero), rint
   rounding half to even, as onnxruntime's requantization does (scale is per column, or one for all: scale_step 0).

   Work is split into tasks of QMC x QNC blocks of C, each summed whole over K, so results do not depend on the
   thread count (integer sums are exact in any order anyway). */
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "aot_runtime.h"
#if defined(__SSE2__)
#include <immintrin.h>
#endif

/* rows of A per microkernel call; QNR (aot_runtime.h) columns: 8 x 32 keeps 16 accumulators of 16 int32 lanes plus
   2 B vectors and a broadcast inside AVX-512's 32 registers */
#define QMR 8
/* a task's block of C: 64 x 128 int32 (32 KB) stays in L1/L2 beside a KC slice of A (32 KB) */
#define QMC 64
#define QNC 128
/* k is walked in slices this long (a multiple of 4): the packed A slice lives on the stack */
#define QKC 512
/* and half that where M fits one block: then A's slice (49 x 256) and a weight panel's (8 KB) both fit L1 (the
   7x7 layers' 49x512x4608 and x2304: 4% faster; 1024^3 2% slower, so not everywhere) */
#define QKC_FEW_ROWS 256

/* the loops over a tile's rows and columns unrolled, so that its accumulators live in registers: gcc 12 at -O2 kept
   them in memory, a load and a store for each multiply (1024^3 with gcc: VNNI-512 270 -> 640 GOPS, AVX2 64 -> 90;
   clang, which unrolled them anyway, 700-780 and 165-180) */
#define QUNROLL _Pragma("GCC unroll 8")

static int cdiv(int a, int b) { return (a + b - 1) / b; }
static int min(int a, int b) { return a < b ? a : b; }

int aot_qgemm_tasks(const aot_qgemm *g) { return cdiv(g->M, QMC) * cdiv(g->N, QNC); }

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#include <immintrin.h>
/* vpdpbusd: each int32 lane adds the four products of A's 4 unsigned bytes (broadcast) and B's 4 signed bytes.
   rows < QMR: a tile's first rows only (a constant where inlined, so the loops unroll and acc stays in registers) */
static inline __attribute__((always_inline)) void micro_rows(int rows, int groups, const uint8_t *restrict a,
                                                             const int8_t *restrict b, int32_t *restrict c, int ldc,
                                                             int accumulate) {
  __m512i acc[QMR][2];
  QUNROLL
  for (int i = 0; i < rows; i++)
    QUNROLL
    for (int j = 0; j < 2; j++)
      acc[i][j] = accumulate ? _mm512_loadu_si512(c + i * ldc + j * 16) : _mm512_setzero_si512();
  for (int g = 0; g < groups; g++) {
    const __m512i b0 = _mm512_loadu_si512(b + g * QNR * 4), b1 = _mm512_loadu_si512(b + g * QNR * 4 + 64);
    QUNROLL
    for (int i = 0; i < rows; i++) {
      int32_t word;
      memcpy(&word, a + g * QMR * 4 + i * 4, 4);
      const __m512i av = _mm512_set1_epi32(word);
      acc[i][0] = _mm512_dpbusd_epi32(acc[i][0], av, b0);
      acc[i][1] = _mm512_dpbusd_epi32(acc[i][1], av, b1);
    }
  }
  QUNROLL
  for (int i = 0; i < rows; i++)
    QUNROLL
    for (int j = 0; j < 2; j++) _mm512_storeu_si512(c + i * ldc + j * 16, acc[i][j]);
}

static void micro(int groups, const uint8_t *restrict a, const int8_t *restrict b, int32_t *restrict c, int ldc,
                  int accumulate) {
  micro_rows(QMR, groups, a, b, c, ldc, accumulate);
}

/* a tile of fewer rows (M = 49 of a 7x7 layer: its seventh tile has one) at the cost of those rows, not of QMR: the
   49x512x4608 call had spent 1/8 of its time on the 7 rows past M */
#define MICRO_TAIL 1
static void micro_tail(int rows, int groups, const uint8_t *restrict a, const int8_t *restrict b, int32_t *restrict c,
                       int ldc, int accumulate) {
  switch (rows) {
#define ROWS(r)                                                                                                      \
  case r: micro_rows(r, groups, a, b, c, ldc, accumulate); break;
    ROWS(1) ROWS(2) ROWS(3) ROWS(4) ROWS(5) ROWS(6) ROWS(7)
#undef ROWS
    default: micro(groups, a, b, c, ldc, accumulate);
  }
}
#elif defined(__AVXVNNI__)
/* AVX-VNNI (VEX vpdpbusd on 256 bits, e.g. Alder Lake): the same sums, 8 columns per vector. 8 x 32 would be 32
   accumulators of AVX's 16 registers, so the tile goes in parts of 4 rows x 16 columns: 8 accumulators, 2 B vectors
   and a broadcast */
static void micro(int groups, const uint8_t *restrict a, const int8_t *restrict b, int32_t *restrict c, int ldc,
                  int accumulate) {
  for (int r0 = 0; r0 < QMR; r0 += 4)
    for (int j0 = 0; j0 < QNR; j0 += 16) {
      __m256i acc[4][2];
      QUNROLL
      for (int i = 0; i < 4; i++)
        QUNROLL
        for (int j = 0; j < 2; j++)
          acc[i][j] = accumulate ? _mm256_loadu_si256((const __m256i *)(c + (r0 + i) * ldc + j0 + j * 8))
                                 : _mm256_setzero_si256();
      for (int g = 0; g < groups; g++) {
        const int8_t *bg = b + g * QNR * 4 + j0 * 4;
        const __m256i b0 = _mm256_loadu_si256((const __m256i *)bg), b1 = _mm256_loadu_si256((const __m256i *)(bg + 32));
        QUNROLL
        for (int i = 0; i < 4; i++) {
          int32_t word;
          memcpy(&word, a + g * QMR * 4 + (r0 + i) * 4, 4);
          const __m256i av = _mm256_set1_epi32(word);
          acc[i][0] = _mm256_dpbusd_avx_epi32(acc[i][0], av, b0);
          acc[i][1] = _mm256_dpbusd_avx_epi32(acc[i][1], av, b1);
        }
      }
      QUNROLL
      for (int i = 0; i < 4; i++)
        QUNROLL
        for (int j = 0; j < 2; j++) _mm256_storeu_si256((__m256i *)(c + (r0 + i) * ldc + j0 + j * 8), acc[i][j]);
    }
}
#elif defined(__AVX2__)
/* AVX2 has no u8 x s8 dot product into int32, and vpmaddubsw (pairs of u8 x s8 products added in int16) saturates:
   255 * -128 twice is -65280. So both sides are widened to int16 and vpmaddwd adds pairs of products in int32: a
   product is at most 255 * 128 = 32640 in magnitude, a pair 65280, every step exact (the int32 sums wrap as
   vpdpbusd's). B's 16 bytes of 4 columns x 4 k widen to one vector, a row's 4 bytes of A to 4 int16 broadcast to
   each column's 4, so an int32 lane holds (column, k pair): the two of a column are added at the end (vphaddd).
   As many multiplies per product as vpmaddubsw + vpmaddwd would take; A is widened once per call into aw, then
   broadcast from memory (a load, no shuffle). The tile goes in parts of 4 rows x 8 columns: 8 accumulators, 2 B
   vectors and a broadcast of the 16 registers (8 x 8, 16 accumulators, spilled: 0.56x on 1024^3; 2 x 16 0.92x) */
static void micro(int groups, const uint8_t *restrict a, const int8_t *restrict b, int32_t *restrict c, int ldc,
                  int accumulate) {
  /* groups <= QKC / 4: the caller's slices of k are at most QKC long (8 KB) */
  int64_t aw[QKC / 4 * QMR];
  for (int g = 0; g < groups; g++)
    QUNROLL
    for (int h = 0; h < 2; h++) {
      const __m128i v = _mm_loadu_si128((const __m128i *)(a + g * QMR * 4 + h * 16));
      _mm256_storeu_si256((__m256i *)(aw + g * QMR + h * 4), _mm256_cvtepu8_epi16(v));
    }
  for (int r0 = 0; r0 < QMR; r0 += 4)
    for (int j0 = 0; j0 < QNR; j0 += 8) {
      __m256i acc[4][2];
      QUNROLL
      for (int i = 0; i < 4; i++)
        QUNROLL
        for (int j = 0; j < 2; j++) acc[i][j] = _mm256_setzero_si256();
      for (int g = 0; g < groups; g++) {
        const int8_t *bg = b + g * QNR * 4 + j0 * 4;
        const __m256i b0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)bg));
        const __m256i b1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(bg + 16)));
        QUNROLL
        for (int i = 0; i < 4; i++) {
          const __m256i av = _mm256_set1_epi64x(aw[g * QMR + r0 + i]);
          acc[i][0] = _mm256_add_epi32(acc[i][0], _mm256_madd_epi16(av, b0));
          acc[i][1] = _mm256_add_epi32(acc[i][1], _mm256_madd_epi16(av, b1));
        }
      }
      QUNROLL
      for (int i = 0; i < 4; i++) {
        /* lanes (c0 c1 c4 c5 | c2 c3 c6 c7) after the pairwise add, put in order by 64-bit lanes 0 2 1 3 */
        __m256i s = _mm256_permute4x64_epi64(_mm256_hadd_epi32(acc[i][0], acc[i][1]), 0xd8);
        int32_t *row = c + (r0 + i) * ldc + j0;
        if (accumulate) s = _mm256_add_epi32(s, _mm256_loadu_si256((const __m256i *)row));
        _mm256_storeu_si256((__m256i *)row, s);
      }
    }
}
#elif defined(__aarch64__) && (defined(__ARM_FEATURE_MATMUL_INT8) || defined(__ARM_FEATURE_DOTPROD))
#include <arm_neon.h>
/* usdot (i8mm) or sdot (dotprod) by element: each int32 lane of 4 columns adds the 4 products of a column's 4 bytes
   of B and one row's 4 bytes of A (a 32-bit lane of a vector of 4 rows). sdot multiplies signed bytes only, so A's a
   is read as a ^ 0x80 = a - 128 and sum (a - 128) b + 128 sum b = sum a b, the column sums of B over the call kept
   beside (an sdot of B with ones: one in nine). Exact: a product is at most 128 * 128, four 65536; the int32 sums
   wrap as vpdpbusd's. The tile goes in parts of 8 rows x 8 columns: 16 accumulators, 2 column sums, 2 B and 2 A
   vectors of the 32 registers */
#if defined(__ARM_FEATURE_MATMUL_INT8)
#define QDOT_SIGNED 0
typedef uint8x16_t qdot_a;
#define QA_LOAD(p) vld1q_u8(p)
#define QDOT(acc, bv, av, lane) vsudotq_laneq_s32(acc, bv, av, lane)
#else
#define QDOT_SIGNED 1
typedef int8x16_t qdot_a;
#define QA_LOAD(p) vreinterpretq_s8_u8(veorq_u8(vld1q_u8(p), vdupq_n_u8(0x80)))
#define QDOT(acc, bv, av, lane) vdotq_laneq_s32(acc, bv, av, lane)
#endif
/* row i of the part, A's vector av, its 32-bit lane (a constant, as the instruction's index must be) */
#define QDOT_ROW(i, av, lane)                                                                                        \
  do {                                                                                                               \
    acc[i][0] = QDOT(acc[i][0], b0, av, lane);                                                                       \
    acc[i][1] = QDOT(acc[i][1], b1, av, lane);                                                                       \
  } while (0)
static void micro(int groups, const uint8_t *restrict a, const int8_t *restrict b, int32_t *restrict c, int ldc,
                  int accumulate) {
  for (int j0 = 0; j0 < QNR; j0 += 8) {
    int32x4_t acc[QMR][2], bsum[2] = {vdupq_n_s32(0), vdupq_n_s32(0)};
    QUNROLL
    for (int i = 0; i < QMR; i++)
      QUNROLL
      for (int j = 0; j < 2; j++) acc[i][j] = vdupq_n_s32(0);
    for (int g = 0; g < groups; g++) {
      const int8x16_t b0 = vld1q_s8(b + g * QNR * 4 + j0 * 4), b1 = vld1q_s8(b + g * QNR * 4 + j0 * 4 + 16);
      const qdot_a a0 = QA_LOAD(a + g * QMR * 4), a1 = QA_LOAD(a + g * QMR * 4 + 16);
      QDOT_ROW(0, a0, 0);
      QDOT_ROW(1, a0, 1);
      QDOT_ROW(2, a0, 2);
      QDOT_ROW(3, a0, 3);
      QDOT_ROW(4, a1, 0);
      QDOT_ROW(5, a1, 1);
      QDOT_ROW(6, a1, 2);
      QDOT_ROW(7, a1, 3);
#if QDOT_SIGNED
      bsum[0] = vdotq_s32(bsum[0], b0, vdupq_n_s8(1));
      bsum[1] = vdotq_s32(bsum[1], b1, vdupq_n_s8(1));
#endif
    }
    QUNROLL
    for (int i = 0; i < QMR; i++)
      QUNROLL
      for (int j = 0; j < 2; j++) {
        int32_t *at = c + i * ldc + j0 + j * 4;
        int32x4_t s = vaddq_s32(acc[i][j], vshlq_n_s32(bsum[j], 7));
        if (accumulate) s = vaddq_s32(s, vld1q_s32(at));
        vst1q_s32(at, s);
      }
  }
}
#elif defined(__aarch64__)
#include <arm_neon.h>
/* NEON without dot products: bytes widened to int16 and multiplied into int32 lanes by element (smlal), exact
   (a product is at most 255 * 128; the int32 sums wrap as vpdpbusd's). An ld4 of 8 columns' 4 bytes gives B by k, each
   multiplied by a row's byte of A for that k (lane (row % 2) * 4 + k of a vector of 2 rows). The tile goes in parts
   of 8 rows x 8 columns: 16 accumulators, 4 B and 4 A vectors of the 32 registers */
/* row i of the part times B's k q, A's vector av, its 16-bit lane (a constant, as the instruction's index must be) */
#define QMLA_K(i, bq, av, lane)                                                                                      \
  do {                                                                                                               \
    acc[i][0] = vmlal_laneq_s16(acc[i][0], vget_low_s16(bq), av, lane);                                              \
    acc[i][1] = vmlal_high_laneq_s16(acc[i][1], bq, av, lane);                                                       \
  } while (0)
#define QMLA_ROW(i, av, base)                                                                                        \
  do {                                                                                                               \
    QMLA_K(i, bk0, av, base);                                                                                        \
    QMLA_K(i, bk1, av, base + 1);                                                                                    \
    QMLA_K(i, bk2, av, base + 2);                                                                                    \
    QMLA_K(i, bk3, av, base + 3);                                                                                    \
  } while (0)
static void micro(int groups, const uint8_t *restrict a, const int8_t *restrict b, int32_t *restrict c, int ldc,
                  int accumulate) {
  for (int j0 = 0; j0 < QNR; j0 += 8) {
    int32x4_t acc[QMR][2];
    QUNROLL
    for (int i = 0; i < QMR; i++)
      QUNROLL
      for (int j = 0; j < 2; j++) acc[i][j] = accumulate ? vld1q_s32(c + i * ldc + j0 + j * 4) : vdupq_n_s32(0);
    for (int g = 0; g < groups; g++) {
      const int8x8x4_t bt = vld4_s8(b + g * QNR * 4 + j0 * 4);
      const int16x8_t bk0 = vmovl_s8(bt.val[0]), bk1 = vmovl_s8(bt.val[1]);
      const int16x8_t bk2 = vmovl_s8(bt.val[2]), bk3 = vmovl_s8(bt.val[3]);
      const uint8x16_t lo = vld1q_u8(a + g * QMR * 4), hi = vld1q_u8(a + g * QMR * 4 + 16);
      const int16x8_t a01 = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(lo)));
      const int16x8_t a23 = vreinterpretq_s16_u16(vmovl_high_u8(lo));
      const int16x8_t a45 = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(hi)));
      const int16x8_t a67 = vreinterpretq_s16_u16(vmovl_high_u8(hi));
      QMLA_ROW(0, a01, 0);
      QMLA_ROW(1, a01, 4);
      QMLA_ROW(2, a23, 0);
      QMLA_ROW(3, a23, 4);
      QMLA_ROW(4, a45, 0);
      QMLA_ROW(5, a45, 4);
      QMLA_ROW(6, a67, 0);
      QMLA_ROW(7, a67, 4);
    }
    QUNROLL
    for (int i = 0; i < QMR; i++)
      QUNROLL
      for (int j = 0; j < 2; j++) vst1q_s32(c + i * ldc + j0 + j * 4, acc[i][j]);
  }
}
#else
/* portable (x86 before AVX2, other targets): int32 lanes the compiler vectorises */
typedef int32_t vq __attribute__((vector_size(64), aligned(4)));
static void micro(int groups, const uint8_t *restrict a, const int8_t *restrict b, int32_t *restrict c, int ldc,
                  int accumulate) {
  vq acc[QMR][2];
  for (int i = 0; i < QMR; i++)
    for (int j = 0; j < 2; j++) {
      if (accumulate) memcpy(&acc[i][j], c + i * ldc + j * 16, sizeof(vq));
      else acc[i][j] = (vq){0};
    }
  for (int g = 0; g < groups; g++)
    for (int q = 0; q < 4; q++) {
      vq bv[2];
      for (int j = 0; j < 2; j++)
        for (int l = 0; l < 16; l++) bv[j][l] = b[g * QNR * 4 + (j * 16 + l) * 4 + q];
      for (int i = 0; i < QMR; i++) {
        const int32_t av = a[g * QMR * 4 + i * 4 + q];
        for (int j = 0; j < 2; j++) acc[i][j] += bv[j] * av;
      }
    }
  for (int i = 0; i < QMR; i++)
    for (int j = 0; j < 2; j++) memcpy(c + i * ldc + j * 16, &acc[i][j], sizeof(vq));
}
#endif

#if !defined(MICRO_TAIL)
/* where a path has no micro for fewer rows: the whole tile, rows past the tile's rows too (their sums are never
   read) */
static void micro_tail(int rows, int groups, const uint8_t *restrict a, const int8_t *restrict b, int32_t *restrict c,
                       int ldc, int accumulate) {
  (void)rows;
  micro(groups, a, b, c, ldc, accumulate);
}
#endif

/* A k-major ([K][M], a convolution's im2col written along its output rows): the slice packed as the row-major path
   packs it, 4 k of QMR rows at a time by a 4 x 8 byte transpose where the tile is whole, bytewise at the edges */
static void pack_kmajor(const aot_qgemm *g, int m0, int mr, int k0, int kc, int kin, uint8_t flip,
                        uint8_t *restrict ap) {
#if defined(__AVX512BW__) && QMC == 64 && QMR == 8
  /* the whole block's 64 rows at once, rows past mr masked off (M = 49 of a 7x7 layer: its last tile of one row
     was a bytewise loop, most of the pack's time there). Each 128-bit lane l of the byte/word unpacks holds rows
     16l..16l+15: tile 2l's 4 x 8 group in lo (two halves) and tile 2l+1's in hi, paired into 32-byte stores */
  const __mmask64 rows = mr >= 64 ? ~0ULL : (1ULL << mr) - 1;
  const __m512i x = _mm512_maskz_set1_epi8(rows, (char)flip);
  const __m512i even = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11), odd = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
  const uint8_t *src = g->a + (long)k0 * g->lda + m0;
  int k = 0;
  /* the last group of 4 k too, zero past kin (the stem's K = 147: its bytewise tail was half the pack) */
  for (; k < kin; k += 4) {
    const uint8_t *s0 = src + (long)k * g->lda;
    __m512i r[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
      r[i] = k + i < kin ? _mm512_xor_si512(_mm512_maskz_loadu_epi8(rows, s0 + i * g->lda), x) : _mm512_setzero_si512();
    const __m512i lo01 = _mm512_unpacklo_epi8(r[0], r[1]), lo23 = _mm512_unpacklo_epi8(r[2], r[3]);
    const __m512i hi01 = _mm512_unpackhi_epi8(r[0], r[1]), hi23 = _mm512_unpackhi_epi8(r[2], r[3]);
    const __m512i q[4] = {_mm512_unpacklo_epi16(lo01, lo23), _mm512_unpackhi_epi16(lo01, lo23),
                          _mm512_unpacklo_epi16(hi01, hi23), _mm512_unpackhi_epi16(hi01, hi23)};
    /* tiles 0 2 | 4 6 from q0 q1, tiles 1 3 | 5 7 from q2 q3 */
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
      const __m512i lo = _mm512_permutex2var_epi64(q[2 * h], even, q[2 * h + 1]);
      const __m512i hi = _mm512_permutex2var_epi64(q[2 * h], odd, q[2 * h + 1]);
      uint8_t *d = ap + h * QMR * kc + k * QMR;
      _mm256_storeu_si256((__m256i *)d, _mm512_castsi512_si256(lo));
      _mm256_storeu_si256((__m256i *)(d + 2 * QMR * kc), _mm512_extracti64x4_epi64(lo, 1));
      _mm256_storeu_si256((__m256i *)(d + 4 * QMR * kc), _mm512_castsi512_si256(hi));
      _mm256_storeu_si256((__m256i *)(d + 6 * QMR * kc), _mm512_extracti64x4_epi64(hi, 1));
    }
  }
  for (int t = 0; t < cdiv(mr, QMR); t++)
    for (int kk = k; kk < kc; kk++)
      for (int i = 0; i < QMR; i++)
        ap[t * QMR * kc + (kk / 4) * QMR * 4 + i * 4 + kk % 4] =
          t * QMR + i < mr && kk < kin ? (uint8_t)(src[(long)kk * g->lda + t * QMR + i] ^ flip) : 0;
#else
  for (int t = 0; t < cdiv(mr, QMR); t++) {
    uint8_t *tile = ap + t * QMR * kc;
    const uint8_t *src = g->a + (long)k0 * g->lda + m0 + t * QMR;
    const int rows = min(mr - t * QMR, QMR);
    int k = 0;
#if defined(__SSE2__)
    const __m128i x = _mm_set1_epi8((char)flip);
    /* two whole tiles at once where there are: 16-byte rows, half the instructions per byte (the pack was a fifth
       of a 3136x64x576 call) */
    const int pair = rows == QMR && mr - (t + 1) * QMR >= QMR;
    if (pair) {
      uint8_t *next = tile + QMR * kc;
      for (; k + 4 <= kin; k += 4) {
        const uint8_t *s0 = src + (long)k * g->lda;
        const __m128i r0 = _mm_loadu_si128((const __m128i *)s0), r1 = _mm_loadu_si128((const __m128i *)(s0 + g->lda));
        const __m128i r2 = _mm_loadu_si128((const __m128i *)(s0 + 2 * g->lda));
        const __m128i r3 = _mm_loadu_si128((const __m128i *)(s0 + 3 * g->lda));
        const __m128i lo01 = _mm_unpacklo_epi8(r0, r1), lo23 = _mm_unpacklo_epi8(r2, r3);
        const __m128i hi01 = _mm_unpackhi_epi8(r0, r1), hi23 = _mm_unpackhi_epi8(r2, r3);
        _mm_storeu_si128((__m128i *)(tile + k * QMR), _mm_xor_si128(_mm_unpacklo_epi16(lo01, lo23), x));
        _mm_storeu_si128((__m128i *)(tile + k * QMR + 16), _mm_xor_si128(_mm_unpackhi_epi16(lo01, lo23), x));
        _mm_storeu_si128((__m128i *)(next + k * QMR), _mm_xor_si128(_mm_unpacklo_epi16(hi01, hi23), x));
        _mm_storeu_si128((__m128i *)(next + k * QMR + 16), _mm_xor_si128(_mm_unpackhi_epi16(hi01, hi23), x));
      }
      for (int kk = k; kk < kc; kk++)
        for (int i = 0; i < QMR; i++)
          next[(kk / 4) * QMR * 4 + i * 4 + kk % 4] = kk < kin ? (uint8_t)(src[(long)kk * g->lda + QMR + i] ^ flip) : 0;
    }
    if (rows == QMR) {
      for (; k + 4 <= kin; k += 4) {
        const uint8_t *s0 = src + (long)k * g->lda;
        const __m128i r0 = _mm_loadl_epi64((const __m128i *)s0), r1 = _mm_loadl_epi64((const __m128i *)(s0 + g->lda));
        const __m128i r2 = _mm_loadl_epi64((const __m128i *)(s0 + 2 * g->lda));
        const __m128i r3 = _mm_loadl_epi64((const __m128i *)(s0 + 3 * g->lda));
        const __m128i t01 = _mm_unpacklo_epi8(r0, r1), t23 = _mm_unpacklo_epi8(r2, r3);
        _mm_storeu_si128((__m128i *)(tile + k * QMR), _mm_xor_si128(_mm_unpacklo_epi16(t01, t23), x));
        _mm_storeu_si128((__m128i *)(tile + k * QMR + 16), _mm_xor_si128(_mm_unpackhi_epi16(t01, t23), x));
      }
    }
#endif
    for (; k < kc; k++)
      for (int i = 0; i < QMR; i++)
        tile[(k / 4) * QMR * 4 + i * 4 + k % 4] = i < rows && k < kin ? (uint8_t)(src[(long)k * g->lda + i] ^ flip) : 0;
#if defined(__SSE2__)
    t += pair;
#endif
  }
#endif
}

#if defined(__SSE2__)
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
#endif

/* dst[j][i] = src[i][j] for i < rows, j < cols (row strides ss, ds): 16 x 16 blocks by four rounds of byte
   unpacks where whole, bytewise at the edges. A convolution's result (m contiguous) is written through this: the
   bytewise transpose (which the compilers make a scatter of single bytes) was 31% of the first 7x7/2 convolution's
   int8 call */
static void transpose_bytes(const uint8_t *restrict src, int ss, uint8_t *restrict dst, int ds, int rows, int cols) {
  int i0 = 0;
#if defined(__SSE2__)
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
#endif
  for (int i = i0; i < rows; i++)
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
    int k = 0;
#if defined(__SSE2__)
    const __m128i x = _mm_set1_epi8((char)flip);
    for (; k + 16 <= kin; k += 16)
      for (int h = 0; h < QMR; h += 4) {
        __m128i r[4];
        for (int i = 0; i < 4; i++)
          r[i] = h + i < rows ? _mm_xor_si128(_mm_loadu_si128((const __m128i *)(src + (long)(h + i) * g->lda + k)), x)
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
#endif
    for (; k < kc; k++)
      for (int i = 0; i < QMR; i++)
        tile[(k / 4) * QMR * 4 + i * 4 + k % 4] = i < rows && k < kin ? (uint8_t)(src[(long)i * g->lda + k] ^ flip) : 0;
  }
}

#if defined(__AVX512F__)
/* 16 columns of a row requantized as requantize_row does (below). The bytes kept of the lanes (vpmovdb) are the low
   ones: (r + bias8) ^ 0x80 is r + bias8 - 128 there, so one add of the zero point alone gives int8's bytes as
   uint8's */
typedef struct {
  __m512 lo, hi;
  __m512i zero;
} requant16;

static inline requant16 requant16_of(float lo, float hi, int bias8, uint8_t flip8) {
  return (requant16){_mm512_set1_ps(lo), _mm512_set1_ps(hi), _mm512_set1_epi32(bias8 - (flip8 ? 128 : 0))};
}

static inline __m128i requantize16(const int32_t *sum, const int32_t *corr, const float *sc, const requant16 *p) {
  const __m512i v = _mm512_add_epi32(_mm512_loadu_si512(sum), _mm512_loadu_si512(corr));
  __m512 r = _mm512_mul_ps(_mm512_cvtepi32_ps(v), _mm512_loadu_ps(sc));
  r = _mm512_min_ps(_mm512_max_ps(r, p->lo), p->hi);
  return _mm512_cvtepi32_epi8(_mm512_add_epi32(_mm512_cvtps_epi32(r), p->zero));
}
#endif

#if defined(__AVX512F__)
#if defined(__AVX512VBMI__)
/* the permutes' byte indices (64 + i: the second vector's byte i). First round, column half h: byte 8s + r
   (column 8h + s, row r of 8) from row r's vector (r / 4) at 16 (r % 4) + 8h + s. Second, half h: byte 16s + m
   (column 4h + s of the 8, row m of 16) from the vector of m's half at 8 (4h + s) + m % 8 */
#define GATHER_ROWS(h, j) (((j) % 8 >= 4) * 64 + 16 * ((j) % 4) + 8 * (h) + (j) / 8)
#define GATHER_COLUMNS(h, j) (((j) % 16 >= 8) * 64 + 8 * (4 * (h) + (j) / 16) + (j) % 8)
#define BYTES8(F, h, j) \
  F(h, j), F(h, j + 1), F(h, j + 2), F(h, j + 3), F(h, j + 4), F(h, j + 5), F(h, j + 6), F(h, j + 7)
#define BYTES64(F, h)                                                                                                \
  BYTES8(F, h, 0), BYTES8(F, h, 8), BYTES8(F, h, 16), BYTES8(F, h, 24), BYTES8(F, h, 32), BYTES8(F, h, 40),         \
    BYTES8(F, h, 48), BYTES8(F, h, 56)
static const uint8_t gather_rows[2][64] __attribute__((aligned(64))) = {{BYTES64(GATHER_ROWS, 0)},
                                                                        {BYTES64(GATHER_ROWS, 1)}};
static const uint8_t gather_columns[2][64] __attribute__((aligned(64))) = {{BYTES64(GATHER_COLUMNS, 0)},
                                                                           {BYTES64(GATHER_COLUMNS, 1)}};
#endif
/* out[j * ld + i] = x[i] byte j, 16 x 16. With VBMI, as 4 rows to a 64-byte vector and two rounds of 2-source byte
   permutes (8 in all, against 64 unpacks): the first gathers 8 rows x 8 columns from 2 vectors, the second a
   column's 16 rows from 2 of those (3136x256x64, K short so the epilogue weighs: 0.197 -> 0.181 ms; the stem's
   12544x64x147 0.362 -> 0.348) */
static inline void store_columns16(__m128i x[16], uint8_t *out, long ld) {
#if defined(__AVX512VBMI__)
  __m512i z[4], u[4];
#pragma GCC unroll 4
  for (int a = 0; a < 4; a++) {
    const __m256i lo = _mm256_inserti128_si256(_mm256_castsi128_si256(x[4 * a]), x[4 * a + 1], 1);
    const __m256i hi = _mm256_inserti128_si256(_mm256_castsi128_si256(x[4 * a + 2]), x[4 * a + 3], 1);
    z[a] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
  }
  const __m512i i10 = _mm512_load_si512(gather_rows[0]), i11 = _mm512_load_si512(gather_rows[1]);
  const __m512i i20 = _mm512_load_si512(gather_columns[0]), i21 = _mm512_load_si512(gather_columns[1]);
  /* u0, u1: rows 0-7, columns 0-7 and 8-15; u2, u3: rows 8-15 */
  u[0] = _mm512_permutex2var_epi8(z[0], i10, z[1]);
  u[1] = _mm512_permutex2var_epi8(z[0], i11, z[1]);
  u[2] = _mm512_permutex2var_epi8(z[2], i10, z[3]);
  u[3] = _mm512_permutex2var_epi8(z[2], i11, z[3]);
#pragma GCC unroll 4
  for (int b = 0; b < 4; b++) {
    const __m512i w = _mm512_permutex2var_epi8(u[b / 2], b % 2 ? i21 : i20, u[b / 2 + 2]);
    _mm_storeu_si128((__m128i *)(out + (4 * b) * ld), _mm512_castsi512_si128(w));
    _mm_storeu_si128((__m128i *)(out + (4 * b + 1) * ld), _mm512_extracti32x4_epi32(w, 1));
    _mm_storeu_si128((__m128i *)(out + (4 * b + 2) * ld), _mm512_extracti32x4_epi32(w, 2));
    _mm_storeu_si128((__m128i *)(out + (4 * b + 3) * ld), _mm512_extracti32x4_epi32(w, 3));
  }
#else
  transpose16(x);
#pragma GCC unroll 16
  for (int j = 0; j < 16; j++) _mm_storeu_si128((__m128i *)(out + j * ld), x[j]);
#endif
}
#endif

/* q[e] = clamp(rint((sum[e] + corr[e]) * sc[e]), lo, hi) + bias8 as a byte, ^ flip8 (int8 as uint8 shifted by 128).
   Clamping first is the same (lo and hi are integers) and keeps the conversion in range; the conversion rounds half
   to even (the default rounding mode, as rint). Written with vectors: gcc's loop vectoriser is off (build.py), and
   the scalar loop was a third of the stem's 12544x64x147 call built by gcc. The clamps as compares (fmaxf/fminf's
   NaN handling cost a compare and a blend each); max_ps(r, lo) gives lo for a NaN r, as the compare does */
static void requantize_row(const int32_t *restrict sum, const int32_t *restrict corr, const float *restrict sc, int nr,
                           float lo, float hi, int bias8, uint8_t flip8, uint8_t *restrict q) {
  int e = 0;
#if defined(__AVX512F__)
  const requant16 p = requant16_of(lo, hi, bias8, flip8);
  for (; e + 16 <= nr; e += 16) _mm_storeu_si128((__m128i *)(q + e), requantize16(sum + e, corr + e, sc + e, &p));
#elif defined(__AVX2__)
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
#endif
  for (; e < nr; e++) {
    const int32_t v = (int32_t)((uint32_t)sum[e] + (uint32_t)corr[e]);
    float r = (float)v * sc[e];
    r = r > lo ? r : lo;
    r = r < hi ? r : hi;
    q[e] = (uint8_t)((int32_t)__builtin_rintf(r) + bias8) ^ flip8;
  }
}

void aot_qgemm_run(void *ctx, int start, int end) {
  /* tasks from a shared counter, as in aot_gemm_run: each computes its block whole, whoever takes it */
  (void)start; (void)end;
  aot_qgemm *g = ctx;
  const int tasks = aot_qgemm_tasks(g), mblocks = cdiv(g->M, QMC), K4 = (g->K + 3) / 4 * 4;
  const uint32_t flip = g->a_signed ? 0x80 : 0;
  const int32_t zero = (g->a_zero_at ? *g->a_zero_at : g->a_zero) + (g->a_signed ? 128 : 0);
  const int kslice = mblocks == 1 ? QKC_FEW_ROWS : QKC;
  uint8_t ap[QMC * QKC] __attribute__((aligned(64)));
  int32_t acc[QMC * QNC] __attribute__((aligned(64)));
  for (int t; (t = __atomic_fetch_add(&g->next, 1, __ATOMIC_RELAXED)) < tasks;) {
    const int m0 = t % mblocks * QMC, n0 = t / mblocks * QNC;
    const int mr = min(g->M - m0, QMC), nr = min(g->N - n0, QNC);
    for (int k0 = 0; k0 < K4; k0 += kslice) {
      const int kc = min(K4 - k0, kslice);
      /* A's slice as [m tile][k/4][QMR][4] bytes, unsigned, zero past M and K (B is zero past K too) */
      const int kin = min(g->K - k0, kc);
      if (g->a_kmajor) pack_kmajor(g, m0, mr, k0, kc, kin, (uint8_t)flip, ap);
      else pack_rows(g, m0, mr, k0, kc, kin, (uint8_t)flip, ap);
      /* weights read once per run come from memory (ResNet's 7x7 layers, 49x512x4608: 0.444 ms against 0.316 with
         them in cache), so they are fetched ahead, spread over the calls. Where M fits one block, each task's weights
         are its own: the next slice of all its panels (after the last, the next task's first), a whole slice ahead
         (0.42 -> 0.36 ms; the next panel alone was too late). Else the next m block's task reuses them from L2, and
         only the next panel is fetched (a slice ahead cost 196x256x2304 5%, its lines crowding L1) */
      const int tiles = cdiv(mr, QMR), panels = cdiv(nr, QNR);
      const int8_t *far = NULL;
      int far_lines = 0, far_panels = 0;
      if (mblocks == 1 && k0 + kc < K4) {
        far = g->b + (long)(n0 / QNR) * K4 * QNR + (long)(k0 + kc) * QNR;
        far_lines = min(K4 - k0 - kc, kslice) * QNR / 64;
        far_panels = panels;
      } else if (mblocks == 1 && n0 + QNC < g->N) {
        far = g->b + (long)((n0 + QNC) / QNR) * K4 * QNR;
        far_lines = min(K4, kslice) * QNR / 64;
        far_panels = cdiv(min(g->N - n0 - QNC, QNC), QNR);
      }
      const long far_total = (long)far_lines * far_panels, calls = (long)tiles * panels;
      for (int n = 0; n < nr; n += QNR) {
        const int8_t *bt = g->b + (long)((n0 + n) / QNR) * K4 * QNR + (long)k0 * QNR;
        /* the next panel: the next tile's, else the next slice's first */
        const int8_t *next = mblocks == 1 ? NULL
                             : n + QNR < nr ? bt + (long)K4 * QNR
                             : k0 + kc < K4 ? g->b + (long)(n0 / QNR) * K4 * QNR + (long)(k0 + kc) * QNR
                                            : NULL;
        const int next_kc = n + QNR < nr ? kc : min(K4 - k0 - kc, kslice);
        const int lines = next ? next_kc * QNR / 64 : 0;
        for (int m = 0; m < mr; m += QMR) {
          for (int l = m / QMR * lines / tiles; l < (m / QMR + 1) * lines / tiles; l++)
            __builtin_prefetch(next + l * 64);
          /* this call's share of the lines, walked panel by panel (a division per line had cost 10% there) */
          const long call = (long)(n / QNR) * tiles + m / QMR, end = (call + 1) * far_total / calls;
          long l = call * far_total / calls;
          if (l < end) {
            const int8_t *panel = far + l / far_lines * K4 * QNR;
            for (int line = (int)(l % far_lines); l < end; l++) {
              __builtin_prefetch(panel + line * 64);
              if (++line == far_lines) {
                line = 0;
                panel += (long)K4 * QNR;
              }
            }
          }
          if (mr - m >= QMR) micro(kc / 4, ap + (m / QMR) * QMR * kc, bt, acc + m * QNC + n, QNC, k0 > 0);
          else micro_tail(mr - m, kc / 4, ap + (m / QMR) * QMR * kc, bt, acc + m * QNC + n, QNC, k0 > 0);
        }
      }
    }
    /* the epilogue: zero-point correction and bias per column first (corr), then each row of sums requantized
       along n, as the sums lie; a convolution's output (m contiguous) is turned to columns 16 x 16 (with AVX-512 in
       registers, else through the byte transpose tb) so that each of its lines is written contiguously */
    const int m_inner = g->ldc_m < g->ldc_n;
    int32_t corr[QNC] __attribute__((aligned(64)));
    float sc[QNC] __attribute__((aligned(64)));
    for (int e = 0; e < nr; e++) {
      const int n = n0 + e;
      /* wrapping int32 arithmetic, as vpdpbusd's own */
      corr[e] = (int32_t)((uint32_t)(g->bias ? g->bias[n] : 0) - (uint32_t)zero * (uint32_t)g->col_sum[n]);
      sc[e] = g->scale ? g->scale[n * g->scale_step] : 0.0f;
    }
#if !defined(__clang__)
    if (g->out_type == AOT_QGEMM_INT32 && g->ldc_n == 1) {
      /* rows of n contiguous (a dynamically quantized matmul's) 16 lanes at a time where the loop vectoriser is off
         (gcc: 3136x256x64 0.435 -> 0.195 ms); clang vectorises the loop below itself, 5% faster than this */
      typedef uint32_t v16 __attribute__((vector_size(64), aligned(4)));
      for (int m = 0; m < mr; m++) {
        uint32_t *out = (uint32_t *)g->c + (long)(m0 + m) * g->ldc_m + n0;
        const uint32_t *sum = (const uint32_t *)acc + m * QNC;
        int e = 0;
#pragma GCC unroll 4
        for (; e + 16 <= nr; e += 16) {
          v16 a, c;
          memcpy(&a, sum + e, sizeof a);
          memcpy(&c, (const uint32_t *)corr + e, sizeof c);
          a += c;
          memcpy(out + e, &a, sizeof a);
        }
        for (; e < nr; e++) out[e] = sum[e] + (uint32_t)corr[e];
      }
      continue;
    }
#endif
    if (g->out_type == AOT_QGEMM_INT32) {
      for (int m = 0; m < mr; m++)
        for (int e = 0; e < nr; e++)
          ((int32_t *)g->c)[(long)(m0 + m) * g->ldc_m + (long)(n0 + e) * g->ldc_n] =
            (int32_t)((uint32_t)acc[m * QNC + e] + (uint32_t)corr[e]);
      continue;
    }
    const int u8 = g->out_type == AOT_QGEMM_UINT8;
    /* clamping the integer-valued float to the range less the zero point first keeps the conversion in range */
    const float lo = (u8 ? 0.0f : -128.0f) - (float)g->out_zero, hi = (u8 ? 255.0f : 127.0f) - (float)g->out_zero;
    const int bias8 = g->out_zero + (u8 ? 0 : 128);
    uint8_t *c8 = g->c;
    /* the requantized rows ([m][e], QNC apart), and their transpose ([e][m], QMC apart) when m is contiguous */
    uint8_t qb[QMC * QNC] __attribute__((aligned(64)));
    uint8_t tb[QNC * QMC] __attribute__((aligned(64)));
    const uint8_t flip8 = u8 ? 0 : 0x80;
#if defined(__AVX512F__)
    /* a convolution's output (m contiguous): 16 x 16 blocks requantized into a byte vector per row m, transposed in
       registers to one per column and stored straight into that column's line; the rest (rows past the last 16,
       columns past the last 16) byte by byte. The stem's 12544x64x147: the byte buffers, their transpose and a
       memcpy per line had been a fifth of the call */
    if (m_inner && g->ldc_m == 1) {
      const requant16 p = requant16_of(lo, hi, bias8, flip8);
      const int m16 = mr / 16 * 16, e16 = nr / 16 * 16;
      for (int mb = 0; mb < m16; mb += 16)
        for (int eb = 0; eb < e16; eb += 16) {
          __m128i x[16];
#pragma GCC unroll 16
          for (int i = 0; i < 16; i++) x[i] = requantize16(acc + (mb + i) * QNC + eb, corr + eb, sc + eb, &p);
          store_columns16(x, c8 + (long)(n0 + eb) * g->ldc_n + m0 + mb, g->ldc_n);
        }
      for (int m = 0; m < mr; m++) {
        const int e0 = m < m16 ? e16 : 0;
        uint8_t *q = qb + m * QNC;
        requantize_row(acc + m * QNC + e0, corr + e0, sc + e0, nr - e0, lo, hi, bias8, flip8, q);
        for (int e = e0; e < nr; e++) c8[(long)(n0 + e) * g->ldc_n + m0 + m] = q[e - e0];
      }
      continue;
    }
#endif
    for (int m = 0; m < mr; m++) {
      const int32_t *sum = acc + m * QNC;
      uint8_t *out = c8 + (long)(m0 + m) * g->ldc_m + (long)n0 * g->ldc_n;
      /* a contiguous row of the output is written in place */
      const int direct = !m_inner && g->ldc_n == 1;
      uint8_t *q = direct ? out : qb + m * QNC;
      requantize_row(sum, corr, sc, nr, lo, hi, bias8, flip8, q);
      if (m_inner || direct) continue;
      for (int e = 0; e < nr; e++) out[(long)e * g->ldc_n] = q[e];
    }
    if (m_inner) transpose_bytes(qb, QNC, tb, QMC, mr, nr);
    if (m_inner)
      for (int e = 0; e < nr; e++) {
        uint8_t *out = c8 + (long)(n0 + e) * g->ldc_n + (long)m0 * g->ldc_m;
        if (g->ldc_m == 1) memcpy(out, tb + e * QMC, (size_t)mr);
        else
          for (int m = 0; m < mr; m++) out[(long)m * g->ldc_m] = tb[e * QMC + m];
      }
  }
}

/* *** 8-bit max pools (aot_qpool): separable, each output row the column maxima of its window's rows, then the
   maxima along that row at the window's steps, both along contiguous bytes in 32-byte vectors (GNU C vector types:
   the same code for gcc and clang, x86 and arm). The generated loop over the window's gated taps ran as byte inserts
   at 4 GB/s (ResNet-18's 3x3/2 pool over 64x112x112 uint8: 0.51 ms). int8 is compared as uint8 with its sign bit
   flipped. *** */

typedef uint8_t qv8 __attribute__((vector_size(32), aligned(1)));
typedef uint16_t qv16 __attribute__((vector_size(32), aligned(1)));
typedef uint8_t qh8 __attribute__((vector_size(16), aligned(1)));
typedef uint16_t qw16 __attribute__((vector_size(64), aligned(1)));
#define QV 32

/* lanewise max (a statement expression, not a function: a 32-byte vector returned by value changes the ABI where
   the target has no AVX, which gcc warns of) */
#define qmax(a, b)                                                                                                   \
  ({                                                                                                                 \
    const qv8 a_ = (a), b_ = (b), m_ = (qv8)(a_ > b_);                                                               \
    (a_ & m_) | (b_ & ~m_);                                                                                          \
  })

/* the vector steps over [0, n): whole vectors, then one more ending at n (overlapping: each lane's value is the same
   whichever step computes it); none when n < step (the scalar loop after takes all) */
#define QPOOL_STEPS(i, n, step) for (int i = 0, last_ = (n) - (step); i <= last_; i = i < last_ && i + (step) > last_ ? last_ : i + (step))

static void qpool_row(const uint8_t *restrict t, uint8_t *restrict y, const aot_qpool *p, uint8_t flip) {
  const int OW = p->OW, SW = p->SW, KW = p->KW, DW = p->DW;
  const qv8 f = (qv8){0} + flip;
  int done = 0;
  if (DW == 1 && KW == 3 && SW == 1 && OW >= QV) {
    QPOOL_STEPS(ox, OW, QV) {
      const qv8 m = qmax(qmax(*(const qv8 *)(t + ox), *(const qv8 *)(t + ox + 1)), *(const qv8 *)(t + ox + 2));
      *(qv8 *)(y + ox) = m ^ f;
    }
    done = OW;
  } else if (DW == 1 && (KW == 3 || KW == 2) && SW == 2 && OW >= QV / 2) {
    /* the window's maxima at every column, then every other one: the low bytes of 16-bit lanes, narrowed */
    QPOOL_STEPS(ox, OW, QV / 2) {
      const uint8_t *s = t + 2 * ox;
      qv8 m = qmax(*(const qv8 *)s, *(const qv8 *)(s + 1));
      if (KW == 3) m = qmax(m, *(const qv8 *)(s + 2));
      *(qh8 *)(y + ox) = __builtin_convertvector((qv16)m & 0xff, qh8) ^ ((qh8){0} + flip);
    }
    done = OW;
  }
  for (int ox = done; ox < OW; ox++) {
    uint8_t m = t[ox * SW];
    for (int kx = 1; kx < KW; kx++) m = t[ox * SW + kx * DW] > m ? t[ox * SW + kx * DW] : m;
    y[ox] = m ^ flip;
  }
}

void aot_qpool_run(void *ctx, int start, int end) {
  const aot_qpool *p = ctx;
  const uint8_t flip = p->x_signed ? 0x80 : 0;
  const qv8 f = (qv8){0} + flip;
  /* the row with its padding: t[PW + ix] holds column ix, the padding (and a vector past the end, which the steps
     read into lanes they drop) the identity 0, flipped the minimum; codegen/qpool.py keeps the row within
     AOT_QPOOL_ROW - QV */
  uint8_t t[AOT_QPOOL_ROW] __attribute__((aligned(64)));
  memset(t, 0, sizeof t);
  uint8_t *restrict row = t + p->PW;
  const int W = p->W;
  for (int plane = start; plane < end; plane++) {
    const uint8_t *x = p->x + plane * p->x_plane;
    for (int oy = 0; oy < p->OH; oy++) {
      int taps = 0;
      for (int ky = 0; ky < p->KH; ky++) {
        const int iy = oy * p->SH - p->PH + ky * p->DH;
        if (iy < 0 || iy >= p->H) continue;
        const uint8_t *restrict in = x + iy * p->x_row;
        if (W >= QV) {
          QPOOL_STEPS(ix, W, QV) {
            const qv8 v = *(const qv8 *)(in + ix) ^ f;
            *(qv8 *)(row + ix) = taps ? qmax(v, *(qv8 *)(row + ix)) : v;
          }
        } else
          for (int ix = 0; ix < W; ix++) {
            const uint8_t v = in[ix] ^ flip;
            row[ix] = taps && row[ix] > v ? row[ix] : v;
          }
        taps++;
      }
      if (taps == 0) memset(row, 0, (size_t)W);
      qpool_row(t, p->y + plane * p->y_plane + oy * p->y_row, p, flip);
    }
  }
}

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

typedef uint8_t qq8 __attribute__((vector_size(8), aligned(1)));
typedef uint16_t qh16 __attribute__((vector_size(16), aligned(1), may_alias));
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

static int max(int a, int b) { return a > b ? a : b; }

/* plane c of the input into its padded plane b (rows wp apart, the padding already there) */
static void plane_in(const aot_qim2col *p, int c, uint8_t *restrict b, int wp) {
  const uint8_t *x = p->x + c * p->x_plane;
  for (int iy = 0; iy < p->H; iy++) copy_run(b + (long)(p->PH + iy) * wp + p->PW, x + iy * p->x_row, p->W);
}

void aot_qim2col_run(void *ctx, int start, int end) {
  const aot_qim2col *p = ctx;
  if (start >= end) return;
  const int OW = p->OW, OH = p->OH, W = p->W, PW = p->PW, SW = p->SW, KH = p->KH;
  /* the rows from exact_from on have fewer than v - OW bytes of their tap's row after them */
  const int v = spill_width(OW, SW), exact_from = v ? OH - cdiv(v - OW, OW) : 0;
  /* the padded rows: b[r * wp + PW + ix] holds column ix of padded row r, the rest the pad; codegen/qpool.py keeps
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
