/* The int8 microkernel's inner tile for each instruction set, included by aot_qgemm.c alone (it defines QMR, QNR
   and QUNROLL first): micro(groups, a, b, c, ldc, accumulate) adds a QMR x QNR tile of sums over `groups` groups of
   4 k, A packed [groups][QMR][4] unsigned bytes, B [groups][QNR][4] signed; micro_tail does the same for a tile's
   first `rows` rows. Every path sums exactly in int32. */
#ifndef AOT_QMICRO_H
#define AOT_QMICRO_H

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#include <immintrin.h>
/* a last tile of up to this many rows goes in one call with the whole tile before it (micro_more): 2 x 12
   accumulators, 2 B vectors and a broadcast still fit the 32 registers */
#define MICRO_MORE 4
/* vpdpbusd: each int32 lane adds the four products of A's 4 unsigned bytes (broadcast) and B's 4 signed bytes.
   rows < QMR: a tile's first rows only (a constant where inlined, so the loops unroll and acc stays in registers) */
/* a tile's accumulators: loaded from c (or zero), one group of 4 k summed in from the rows' words at a, stored */
static inline __attribute__((always_inline)) void acc_load(int rows, __m512i acc[][2], const int32_t *restrict c,
                                                           int ldc, int accumulate) {
  QUNROLL
  for (int i = 0; i < rows; i++)
    QUNROLL
    for (int j = 0; j < 2; j++)
      acc[i][j] = accumulate ? _mm512_loadu_si512(c + i * ldc + j * 16) : _mm512_setzero_si512();
}

static inline __attribute__((always_inline)) void acc_dot(int rows, __m512i acc[][2], const uint8_t *restrict a,
                                                          __m512i b0, __m512i b1) {
  QUNROLL
  for (int i = 0; i < rows; i++) {
    int32_t word;
    memcpy(&word, a + i * 4, 4);
    const __m512i av = _mm512_set1_epi32(word);
    acc[i][0] = _mm512_dpbusd_epi32(acc[i][0], av, b0);
    acc[i][1] = _mm512_dpbusd_epi32(acc[i][1], av, b1);
  }
}

static inline __attribute__((always_inline)) void acc_store(int rows, __m512i acc[][2], int32_t *restrict c, int ldc) {
  QUNROLL
  for (int i = 0; i < rows; i++)
    QUNROLL
    for (int j = 0; j < 2; j++) _mm512_storeu_si512(c + i * ldc + j * 16, acc[i][j]);
}

static inline __attribute__((always_inline)) void micro_rows(int rows, int groups, const uint8_t *restrict a,
                                                             const int8_t *restrict b, int32_t *restrict c, int ldc,
                                                             int accumulate) {
  __m512i acc[QMR][2];
  acc_load(rows, acc, c, ldc, accumulate);
  for (int g = 0; g < groups; g++) {
    const __m512i b0 = _mm512_loadu_si512(b + g * QNR * 4), b1 = _mm512_loadu_si512(b + g * QNR * 4 + 64);
    acc_dot(rows, acc, a + g * QMR * 4, b0, b1);
  }
  acc_store(rows, acc, c, ldc);
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

/* as micro_rows, the tile's QMR rows from a, then `more` rows from the next tile's first at a_more (loops of at most
   8, as QUNROLL unrolls; clang 14 left a loop of 12 rolled, its accumulators in memory) */
static inline __attribute__((always_inline)) void micro_rows2(int more, int groups, const uint8_t *restrict a,
                                                              const uint8_t *restrict a_more, const int8_t *restrict b,
                                                              int32_t *restrict c, int ldc, int accumulate) {
  __m512i acc[QMR][2], extra[MICRO_MORE][2];
  int32_t *const c_more = c + QMR * ldc;
  acc_load(QMR, acc, c, ldc, accumulate);
  acc_load(more, extra, c_more, ldc, accumulate);
  for (int g = 0; g < groups; g++) {
    const __m512i b0 = _mm512_loadu_si512(b + g * QNR * 4), b1 = _mm512_loadu_si512(b + g * QNR * 4 + 64);
    acc_dot(QMR, acc, a + g * QMR * 4, b0, b1);
    acc_dot(more, extra, a_more + g * QMR * 4, b0, b1);
  }
  acc_store(QMR, acc, c, ldc);
  acc_store(more, extra, c_more, ldc);
}

/* a whole tile at a and the first `more` rows of the next at a_more, the block's last: 49 = 5 x 8 + 9, not
   6 x 8 + 1, whose call of one row read as much of B as a whole tile's and took a quarter of its time (5% of the
   49x512x4608 call; merged, thread CPU medians against apart: 0.95-0.99x by clang-19, 0.92-0.94x by gcc and
   clang 14). Rows 7 x 7 instead (the pack spreading rows by an expanding load) were no faster: the 7-row loop ran
   below the 8-row one's rate by as much as the part tile had cost */
static void micro_more(int more, int groups, const uint8_t *restrict a, const uint8_t *restrict a_more,
                       const int8_t *restrict b, int32_t *restrict c, int ldc, int accumulate) {
  switch (more) {
#define MORE(r)                                                                                                      \
  case r: micro_rows2(r, groups, a, a_more, b, c, ldc, accumulate); break;
    MORE(1) MORE(2) MORE(3)
#undef MORE
    default: micro_rows2(MICRO_MORE, groups, a, a_more, b, c, ldc, accumulate);
  }
}
#elif defined(__AVXVNNI__) || defined(AOT_QMICRO_EVEX_DPBUSD)
#include <immintrin.h>
/* AVX-VNNI (VEX vpdpbusd on 256 bits, e.g. Alder Lake): the same sums, 8 columns per vector. 8 x 32 would be 32
   accumulators of AVX's 16 registers, so the tile goes in parts of 4 rows x 16 columns: 8 accumulators, 2 B vectors
   and a broadcast */
#if defined(AOT_QMICRO_EVEX_DPBUSD)
/* tests/test_qmicro_isa.py only, where the CPU has AVX-512 VNNI but not AVX-VNNI (Zen 4) and no emulator runs
   AVX-VNNI (qemu 10's TCG has none): the same instruction in AVX-512VL's encoding, the same sums (built without
   -mavxvnni, or the compilers choose the shorter VEX encoding again) */
#define dpbusd_256 _mm256_dpbusd_epi32
#else
#define dpbusd_256 _mm256_dpbusd_avx_epi32
#endif
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
          acc[i][0] = dpbusd_256(acc[i][0], av, b0);
          acc[i][1] = dpbusd_256(acc[i][1], av, b1);
        }
      }
      QUNROLL
      for (int i = 0; i < 4; i++)
        QUNROLL
        for (int j = 0; j < 2; j++) _mm256_storeu_si256((__m256i *)(c + (r0 + i) * ldc + j0 + j * 8), acc[i][j]);
    }
}
#elif defined(__AVX2__)
#include <immintrin.h>
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
  /* groups <= QKC_MAX / 4: the caller's slices of k are at most QKC_MAX long (10 KB) */
  int64_t aw[QKC_MAX / 4 * QMR];
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

#if !defined(MICRO_MORE)
/* where a path has no micro of more than QMR rows, no last tile is merged (its rows are never more than 0) */
#define MICRO_MORE 0
static void micro_more(int more, int groups, const uint8_t *restrict a, const uint8_t *restrict a_more,
                       const int8_t *restrict b, int32_t *restrict c, int ldc, int accumulate) {
  micro(groups, a, b, c, ldc, accumulate);
  micro_tail(more, groups, a_more, b, c + QMR * ldc, ldc, accumulate);
}
#endif
#endif
