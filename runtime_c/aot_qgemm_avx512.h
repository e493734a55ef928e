/* The int8 contraction's AVX-512 (BW, VL) pieces, included by aot_qgemm.c alone (after its constants, QMC 64 and
   QMR 8): A read from a convolution's input planes, a block's k-major A packed 64 rows at once, the requantization 16
   and 64 columns at a time, and a convolution's output turned to columns in registers. */
#ifndef AOT_QGEMM_AVX512_H
#define AOT_QGEMM_AVX512_H
#include <immintrin.h>
#if QMC != 64 || QMR != 8
#error "the AVX-512 pack and plane masks are written for blocks of 64 rows in tiles of 8"
#endif
#define QGEMM_PLANES 1

/* A k-major A read from the convolution's input planes (g->plane) rather than from the im2col's copy of them, where
   the output rows are as wide as the input's (stride 1, OW == W) and the plane's rows lie one after another
   (x_row == W): then A's row of tap (c, kh, kw) at m is the plane read (kh - PH) * W + kw - PW bytes on from m, with
   the lanes whose row or column falls outside the plane the pad, as aot_qim2col_run's qim2col_same writes it. The
   im2col (9 bytes of A for each input byte of a 3x3 convolution) was written to memory and read back by the pack:
   3136x64x576's A is 1.8 MB, its input plane 0.2 MB */
#define QPLANE_TAPS 49
/* the longest K whose rows' table (plane_rows) a call keeps on each thread's stack: 512 planes of 3x3 */
#define QPLANE_K 4608

int aot_qgemm_reads_plane(const aot_qim2col *p) {
  const long M = (long)p->OH * p->OW, K = (long)p->planes * p->KH * p->KW;
  const int dense = M > 0 && p->y_plane % M == 0 && p->y_kh % M == 0 && p->y_kw % M == 0;
  return p->SW == 1 && p->SH == 1 && p->OW == p->W && p->x_row == p->W && p->KH * p->KW <= QPLANE_TAPS &&
         K <= QPLANE_K && dense && (long)p->planes * p->x_plane + (long)p->KH * p->W < (1L << 31);
}

/* for each row r of A: its bytes' offset from the plane's element at m (the first plane's (0, 0) less m) and its tap
   kh * KW + kw */
typedef struct {
  int32_t off[QPLANE_K];
  uint8_t tap[QPLANE_K];
} plane_rows;

static void plane_rows_of(const aot_qim2col *p, int M, plane_rows *t) {
  /* the im2col's strides in rows of A (each a multiple of M: aot_qgemm_reads_plane), divided once: a division per
     row had been 2% of a 49x512x4608 call (thread CPU, each thread builds the table) */
  const long rp = p->y_plane / M, rh = p->y_kh / M, rw = p->y_kw / M;
  for (int c = 0; c < p->planes; c++)
    for (int kh = 0; kh < p->KH; kh++)
      for (int kw = 0; kw < p->KW; kw++) {
        const long r = c * rp + kh * rh + kw * rw;
        t->off[r] = (int32_t)(c * p->x_plane + (kh - p->PH) * p->W + kw - p->PW);
        t->tap[r] = (uint8_t)(kh * p->KW + kw);
      }
}

/* lanes [lo, hi) of 64, clamped */
static uint64_t lane_range(long lo, long hi) {
  const uint64_t below_hi = hi >= 64 ? ~0ULL : hi <= 0 ? 0 : (1ULL << hi) - 1;
  const uint64_t below_lo = lo >= 64 ? ~0ULL : lo <= 0 ? 0 : (1ULL << lo) - 1;
  return below_hi & ~below_lo;
}

/* valid[kh * KW + kw]: the lanes m0 + l whose row oy + kh - PH and column ox + kw - PW are inside the plane */
static void plane_masks(const aot_qim2col *p, int m0, uint64_t valid[QPLANE_TAPS]) {
  const int W = p->W;
  uint64_t cols[QPLANE_TAPS] = {0};
  for (int l = 0, ox = m0 % W; l < 64; l++, ox = ox + 1 == W ? 0 : ox + 1)
    for (int kw = 0; kw < p->KW; kw++) cols[kw] |= (uint64_t)(ox >= p->PW - kw && ox < W + p->PW - kw) << l;
  for (int kh = 0; kh < p->KH; kh++) {
    const long rlo = (long)(p->PH - kh > 0 ? p->PH - kh : 0) * W;
    const long rhi = (long)min(p->OH, p->H + p->PH - kh) * W;
    const uint64_t rows = lane_range(rlo - m0, rhi - m0);
    for (int kw = 0; kw < p->KW; kw++) valid[kh * p->KW + kw] = rows & cols[kw];
  }
}

/* A k-major ([K][M], a convolution's im2col written along its output rows): the slice packed as the row-major path
   packs it (aot_qgemm_portable.h), 4 k of QMR rows at a time by a 4 x 8 byte transpose where the tile is whole, bytewise at the edges. With
   rows (the call's plane_rows, g->plane set) and valid (the block's plane_masks), read from the planes instead */
static void pack_kmajor(const aot_qgemm *g, int m0, int mr, int k0, int kc, int kin, uint8_t flip,
                        const plane_rows *rows_of, const uint64_t *valid, uint8_t *restrict ap) {
  /* the whole block's 64 rows at once, rows past mr masked off (M = 49 of a 7x7 layer: its last tile of one row
     was a bytewise loop, most of the pack's time there). Each 128-bit lane l of the byte/word unpacks holds rows
     16l..16l+15: tile 2l's 4 x 8 group in lo (two halves) and tile 2l+1's in hi, paired into 32-byte stores */
  const __mmask64 rows = mr >= 64 ? ~0ULL : (1ULL << mr) - 1;
  const __m512i x = _mm512_maskz_set1_epi8(rows, (char)flip);
  const __m512i even = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11), odd = _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15);
  const uint8_t *src = g->a + (long)k0 * g->lda + m0;
  /* (the plane's masked lanes are not read: they may lie before or after it) */
  const uintptr_t plane = rows_of ? (uintptr_t)g->plane->x + m0 : 0;
  const __m512i pad = _mm512_set1_epi8(rows_of ? (char)g->plane->pad : 0);
  int k = 0;
  /* the last group of 4 k too, zero past kin (the stem's K = 147: its bytewise tail was half the pack) */
  for (; k < kin; k += 4) {
    const uint8_t *s0 = src + (long)k * g->lda;
    __m512i r[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
      const int row = k0 + k + i;
      const __m512i v = !(k + i < kin) ? _mm512_setzero_si512()
                        : rows_of      ? _mm512_mask_loadu_epi8(pad, valid[rows_of->tap[row]] & rows,
                                                                (const void *)(plane + rows_of->off[row]))
                                       : _mm512_maskz_loadu_epi8(rows, s0 + i * g->lda);
      r[i] = _mm512_xor_si512(v, x);
    }
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
  /* (kk >= kin here: the loop above ends past it) */
  for (int t = 0; t < cdiv(mr, QMR); t++)
    for (int kk = k; kk < kc; kk++)
      for (int i = 0; i < QMR; i++) ap[t * QMR * kc + (kk / 4) * QMR * 4 + i * 4 + kk % 4] = 0;
}

/* requantize_row's result (below) by saturation: x = rint(r) in int32, the packs' signed saturation to int16, the
   zero point added with int16 saturation, and the packs' saturation to the output's 8 bits. Equal to clamping r to
   [lo, hi] first, as lo and hi are integers and rint is monotone, once x is right or on the right side of the range:
   cvtps2dq gives INT_MIN for r past int32's range either way (and for a NaN), so r must stay below 2^31: where the
   scales are all below 1 in magnitude it does (|float(int32)| <= 2^31), else min(hi, r) keeps it there (a NaN r
   stays NaN, as min_ps passes its second operand on, and reads as lo, as max_ps(r, lo) gives). Against a max, a min,
   an int32 add and a vpmovdb (2 uops) per 16: 1/2 a saturating add and 3/4 of a pack. With the block's transpose
   from the packs' 4 vectors (no inserts), thread CPU medians against the vpmovdb version, interleaved, 3 repeats:
   the stem's 12544x64x147 clang-19 0.396 -> 0.365 ms (0.92-0.98x), gcc 0.409 -> 0.361 (0.84-0.88x), clang-14
   0.94x; 3136x64x576 0.96-0.98x */
typedef struct {
  __m512 hi;
  __m512i zero;
  int u8;
} requant;

static inline requant requant_of(float hi, int out_zero, int u8) {
  return (requant){_mm512_set1_ps(hi), _mm512_set1_epi16((short)out_zero), u8};
}

/* rint(float(sum + corr) * sc) in int32 lanes, kept below 2^31 by min(hi, r) where clamp is set */
static inline __m512i requant_lanes(__m512i sum, __m512i corr, __m512 sc, const requant *p, int clamp) {
  const __m512 r = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(sum, corr)), sc);
  return _mm512_cvtps_epi32(clamp ? _mm512_min_ps(p->hi, r) : r);
}

/* whether all the scales' magnitudes are below 1 (then requant_lanes needs no clamp); false for a NaN */
static inline int scales_below_one(__m512 sc) {
  return _mm512_cmp_ps_mask(_mm512_abs_ps(sc), _mm512_set1_ps(1.0f), _CMP_LT_OQ) == 0xffff;
}

/* 4 vectors of requant_lanes to bytes with the zero point: 128-bit lane L holds lanes 4L..4L+3 of a, b, c, d */
static inline __m512i bytes_of4(__m512i a, __m512i b, __m512i c, __m512i d, const requant *p) {
  const __m512i ab = _mm512_adds_epi16(_mm512_packs_epi32(a, b), p->zero);
  const __m512i cd = _mm512_adds_epi16(_mm512_packs_epi32(c, d), p->zero);
  return p->u8 ? _mm512_packus_epi16(ab, cd) : _mm512_packs_epi16(ab, cd);
}

#if defined(__AVX512VBMI__)
/* the permutes' byte indices (64 + i: the second vector's byte i). Row group g's vector holds row 4g + r, column
   4L + c at byte 16L + 4r + c. First round, column half h: byte 8s + r (column 8h + s, row r of 8) from group r / 4
   at 16 ((8h + s) / 4) + 4 (r % 4) + s % 4. Second, quarter b: byte 16s + m (column 4b + s, row m of 16) from the
   vector of m's half at 8 (4 (b % 2) + s) + m % 8 */
#define GATHER_ROWS(h, j) \
  (((j) % 8 >= 4) * 64 + 16 * ((8 * (h) + (j) / 8) / 4) + 4 * ((j) % 4) + ((j) / 8) % 4)
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
#else
/* within each 128-bit lane, the 4 x 4 bytes (row r, column c at 4r + c) to columns (at 4c + r) */
#define LANE_COLUMNS(i) ((i) % 4 * 4 + (i) / 4)
#define LANE16                                                                                                       \
  LANE_COLUMNS(0), LANE_COLUMNS(1), LANE_COLUMNS(2), LANE_COLUMNS(3), LANE_COLUMNS(4), LANE_COLUMNS(5),             \
    LANE_COLUMNS(6), LANE_COLUMNS(7), LANE_COLUMNS(8), LANE_COLUMNS(9), LANE_COLUMNS(10), LANE_COLUMNS(11),         \
    LANE_COLUMNS(12), LANE_COLUMNS(13), LANE_COLUMNS(14), LANE_COLUMNS(15)
static const uint8_t lane_columns[64] __attribute__((aligned(64))) = {LANE16, LANE16, LANE16, LANE16};
#endif

/* rows x 16 sums of a block (row stride QNC, columns past `cols` not read) requantized and written as columns:
   column j's rows at out + j * ld, for j < cols; rows past `rows` left as they are. Inlined with 16 and 16, the
   whole block's path has no masks. The bytes are turned to columns in registers: with VBMI by two rounds of
   2-source byte permutes (8), else by an in-lane byte shuffle and a 4 x 4 transpose of dwords (12) */
static inline __attribute__((always_inline)) void requantize_columns16(const int32_t *sum, __m512i corr, __m512 sc,
                                                                       const requant *p, int clamp, int rows,
                                                                       int cols, uint8_t *out, long ld) {
  const __mmask16 cm = cols >= 16 ? 0xffff : (__mmask16)((1u << cols) - 1);
  __m512i z[4], w[4];
#pragma GCC unroll 4
  for (int g = 0; g < 4; g++) {
    __m512i v[4];
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++) {
      const int32_t *row = sum + (4 * g + r) * QNC;
      const __m512i s = 4 * g + r >= rows ? _mm512_setzero_si512()
                        : cols >= 16      ? _mm512_loadu_si512(row)
                                          : _mm512_maskz_loadu_epi32(cm, row);
      v[r] = requant_lanes(s, corr, sc, p, clamp);
    }
    z[g] = bytes_of4(v[0], v[1], v[2], v[3], p);
  }
#if defined(__AVX512VBMI__)
  const __m512i i10 = _mm512_load_si512(gather_rows[0]), i11 = _mm512_load_si512(gather_rows[1]);
  const __m512i i20 = _mm512_load_si512(gather_columns[0]), i21 = _mm512_load_si512(gather_columns[1]);
  /* u0, u1: rows 0-7, columns 0-7 and 8-15; u2, u3: rows 8-15 */
  const __m512i u[4] = {_mm512_permutex2var_epi8(z[0], i10, z[1]), _mm512_permutex2var_epi8(z[0], i11, z[1]),
                        _mm512_permutex2var_epi8(z[2], i10, z[3]), _mm512_permutex2var_epi8(z[2], i11, z[3])};
  /* w[b] lane s: column 4b + s */
#pragma GCC unroll 4
  for (int b = 0; b < 4; b++) w[b] = _mm512_permutex2var_epi8(u[b / 2], b % 2 ? i21 : i20, u[b / 2 + 2]);
#define COLUMN(i, l) (4 * (i) + (l))
#else
  const __m512i shuffle = _mm512_load_si512(lane_columns);
  __m512i t[4];
#pragma GCC unroll 4
  for (int g = 0; g < 4; g++) t[g] = _mm512_shuffle_epi8(z[g], shuffle);
  /* t[g] lane L dword c: column 4L + c, rows 4g..4g+3; w[c] lane L: column 4L + c */
  const __m512i a0 = _mm512_unpacklo_epi32(t[0], t[1]), a1 = _mm512_unpackhi_epi32(t[0], t[1]);
  const __m512i b0 = _mm512_unpacklo_epi32(t[2], t[3]), b1 = _mm512_unpackhi_epi32(t[2], t[3]);
  w[0] = _mm512_unpacklo_epi64(a0, b0);
  w[1] = _mm512_unpackhi_epi64(a0, b0);
  w[2] = _mm512_unpacklo_epi64(a1, b1);
  w[3] = _mm512_unpackhi_epi64(a1, b1);
#define COLUMN(i, l) (4 * (l) + (i))
#endif
  const __mmask16 rm = rows >= 16 ? 0xffff : (__mmask16)((1u << rows) - 1);
#pragma GCC unroll 4
  for (int i = 0; i < 4; i++) {
    const __m128i x[4] = {_mm512_castsi512_si128(w[i]), _mm512_extracti32x4_epi32(w[i], 1),
                          _mm512_extracti32x4_epi32(w[i], 2), _mm512_extracti32x4_epi32(w[i], 3)};
#pragma GCC unroll 4
    for (int l = 0; l < 4; l++) {
      const int j = COLUMN(i, l);
      if (j >= cols) continue;
      if (rows >= 16) _mm_storeu_si128((__m128i *)(out + j * ld), x[l]);
      else _mm_mask_storeu_epi8(out + j * ld, rm, x[l]);
    }
  }
#undef COLUMN
}

/* requantize_row (aot_qgemm_portable.h) 64 and 16 columns at a time; returns the columns done */
static int requantize_vector(const int32_t *restrict sum, const int32_t *restrict corr, const float *restrict sc,
                             int nr, float lo, float hi, int bias8, uint8_t flip8, uint8_t *restrict q) {
  (void)lo;
  int e = 0;
  const requant p = requant_of(hi, bias8 - (flip8 ? 128 : 0), !flip8);
  /* bytes_of4's lane L holds its vectors' lanes 4L..4L+3: dword 4L + r moved to 4r + L puts them in order */
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  for (; e + 64 <= nr; e += 64) {
    __m512i v[4];
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++) {
      const int f = e + 16 * r;
      v[r] = requant_lanes(_mm512_loadu_si512(sum + f), _mm512_loadu_si512(corr + f), _mm512_loadu_ps(sc + f), &p, 1);
    }
    _mm512_storeu_si512(q + e, _mm512_permutexvar_epi32(order, bytes_of4(v[0], v[1], v[2], v[3], &p)));
  }
  for (; e + 16 <= nr; e += 16) {
    const __m512i v = requant_lanes(_mm512_loadu_si512(sum + e), _mm512_loadu_si512(corr + e), _mm512_loadu_ps(sc + e),
                                    &p, 1);
    const __m512i b = _mm512_permutexvar_epi32(order, bytes_of4(v, v, v, v, &p));
    _mm_storeu_si128((__m128i *)(q + e), _mm512_castsi512_si128(b));
  }
  return e;
}

/* column_terms (aot_qgemm_portable.h) 16 at a time where the scales are one or one per column (the loop was 1/4 of
   the stem's epilogue by gcc, whose loop vectoriser is off); returns the columns done */
static int column_terms_vector(const aot_qgemm *g, int n0, int nr, int32_t zero, int32_t *corr, float *sc) {
  int e = 0;
  if (!g->scale || g->scale_step <= 1)
    for (; e < nr; e += 16) {
      const __mmask16 cm = (__mmask16)((1u << min(nr - e, 16)) - 1);
      const __m512i b = g->bias ? _mm512_maskz_loadu_epi32(cm, g->bias + n0 + e) : _mm512_setzero_si512();
      const __m512i cs = _mm512_maskz_loadu_epi32(cm, g->col_sum + n0 + e);
      _mm512_store_si512(corr + e, _mm512_sub_epi32(b, _mm512_mullo_epi32(_mm512_set1_epi32(zero), cs)));
      _mm512_store_ps(sc + e, !g->scale            ? _mm512_setzero_ps()
                              : g->scale_step == 1 ? _mm512_maskz_loadu_ps(cm, g->scale + n0 + e)
                                                   : _mm512_set1_ps(g->scale[0]));
    }
  return e;
}

/* a convolution's output (m contiguous, ldc_m 1): blocks of 16 x 16 requantized, turned to columns in registers and
   stored straight into each column's line, part blocks (rows past the last 16, columns past the last 16) with
   masks. The stem's 12544x64x147: the byte buffers, their transpose and a memcpy per line had been a fifth of the
   call. Returns whether it wrote the block (else write_bytes does, through a byte transpose) */
static int write_columns(const aot_qgemm *g, const int32_t *acc, const int32_t *corr, const float *sc, int m0, int n0,
                         int mr, int nr, float hi, int u8) {
  if (!(g->ldc_m < g->ldc_n && g->ldc_m == 1)) return 0;
  const requant p = requant_of(hi, g->out_zero, u8);
  const int m16 = mr / 16 * 16;
  for (int eb = 0; eb < nr; eb += 16) {
    const int cols = min(nr - eb, 16);
    const __mmask16 cm = (__mmask16)((1u << cols) - 1);
    const __m512i cv = _mm512_maskz_loadu_epi32(cm, corr + eb);
    const __m512 sv = _mm512_maskz_loadu_ps(cm, sc + eb);
    uint8_t *out = (uint8_t *)g->c + (long)(n0 + eb) * g->ldc_n + m0;
    const int clamp = !scales_below_one(sv);
    if (cols == 16 && !clamp)
      for (int mb = 0; mb < m16; mb += 16)
        requantize_columns16(acc + mb * QNC + eb, cv, sv, &p, 0, 16, 16, out + mb, g->ldc_n);
    else
      for (int mb = 0; mb < m16; mb += 16)
        requantize_columns16(acc + mb * QNC + eb, cv, sv, &p, 1, 16, cols, out + mb, g->ldc_n);
    if (m16 < mr) requantize_columns16(acc + m16 * QNC + eb, cv, sv, &p, 1, mr - m16, cols, out + m16, g->ldc_n);
  }
  return 1;
}
#endif
