/* The int8 matrix-multiply microkernel (declared in aot_runtime.h; weights packed by codegen/lower/quant.py).

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
#include "aot_qgemm.h"
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
/* and K whole in one slice up to this long: 576 (the 56x56 layers' 3136x64x576) was 512 + 64, whose short second
   slice cost a pass of accumulator loads and stores and an A pack for 64 k (0.314 -> 0.303 ms, best of 300) */
#define QKC_ONE 640
/* the longest slice (the packed A's and AVX2's widened A's buffers) */
#define QKC_MAX QKC_ONE

/* the loops over a tile's rows and columns unrolled, so that its accumulators live in registers: gcc 12 at -O2 kept
   them in memory, a load and a store for each multiply (1024^3 with gcc: VNNI-512 270 -> 640 GOPS, AVX2 64 -> 90;
   clang, which unrolled them anyway, 700-780 and 165-180) */
#define QUNROLL _Pragma("GCC unroll 8")

static int cdiv(int a, int b) { return (a + b - 1) / b; }
static int min(int a, int b) { return a < b ? a : b; }

int aot_qgemm_tasks(const aot_qgemm *g) { return cdiv(g->M, QMC) * cdiv(g->N, QNC); }

/* A call's regions of its task grid (mblocks x nblocks blocks of C), one per slice of aot_parallel's split: m blocks
   [m0, m0 + mc) by n blocks [n0, n0 + nc), split along m (each thread's output positions, which the next layer reads
   on the same core), or along n where that shares the work out more evenly (split_by_m). Task j of a region is m
   block m0 + j % mc of n block n0 + j / mc: the order of one thread's whole grid, each n block's weights used by all
   the region's rows while in L2.
   On 2 threads the tasks had come from one counter, m fastest, so which core computed which output positions
   changed from call to call, and the next layer (which reads all channels of its own positions) read much of its
   input from the other core's L2: 2 threads took 1.04-1.12x 1 thread's CPU time on ResNet-50 (the int8 calls +8%).
   With the regions (and the pool running slice i on thread i), light:resnet50:qdq's profile on 2 threads: all threads'
   CPU 1.028-1.053x 1 thread's -> 1.013-1.029x, the calls' busiest threads 0.531-0.552x 1 thread's time ->
   0.521-0.532x; end to end within the machine's noise (0.99-1.01x main's time) */
typedef struct { int m0, mc, n0, nc; } qregion;

/* the largest region's rows (or columns) when blocks of b rows of n split into regions */
static int largest_share(int n, int b, int regions) {
  const int blocks = cdiv(n, b);
  int most = 0;
  for (int r = 0; r < regions; r++) {
    const int lo = (int)((long)blocks * r / regions), hi = (int)((long)blocks * (r + 1) / regions);
    const int share = min(hi * b, n) - lo * b;
    if (hi > lo && share > most) most = share;
  }
  return most;
}

/* along m unless the largest region's work (its rows times N) is over 1.1x that of the largest along n: a 14x14
   layer's M = 196 is 3 blocks and 4 rows, 128 rows against 68 along m on 2 threads, and its calls' busiest threads
   took 7% more than half the work (196x256x2304, taking the other's tasks when done); 28x28's 784 is 384 against
   400, 56x56's 3136 1536 against 1600 (within 2% of the split along n where there is one) */
static int split_by_m(int M, int N, int regions) {
  const long along_m = (long)largest_share(M, QMC, regions) * N, along_n = (long)largest_share(N, QNC, regions) * M;
  return along_m * 10 <= along_n * 11;
}

static qregion region_of(int r, int regions, int by_m, int mblocks, int nblocks) {
  if (by_m) {
    const int lo = (int)((long)mblocks * r / regions), hi = (int)((long)mblocks * (r + 1) / regions);
    return (qregion){lo, hi - lo, 0, nblocks};
  }
  const int lo = (int)((long)nblocks * r / regions), hi = (int)((long)nblocks * (r + 1) / regions);
  return (qregion){0, mblocks, lo, hi - lo};
}

/* a task of a region's size tasks: from its start (its index) or its end (size less one less the index); -1 when
   none is left */
static int take(unsigned long long *taken, int size, int from_end) {
  unsigned long long v = __atomic_load_n(taken, __ATOMIC_RELAXED);
  for (;;) {
    const unsigned head = (unsigned)v, tail = (unsigned)(v >> 32);
    if ((long)head + tail >= size) return -1;
    const unsigned long long w = from_end ? v + (1ULL << 32) : v + 1;
    if (__atomic_compare_exchange_n(taken, &v, w, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
      return from_end ? size - 1 - (int)tail : (int)head;
  }
}

#include "aot_qmicro.h"

#if defined(__AVX512BW__) && QMC == 64 && QMR == 8
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
#else
int aot_qgemm_reads_plane(const aot_qim2col *p) {
  (void)p;
  return 0;
}
typedef struct plane_rows plane_rows;
#endif

/* A k-major ([K][M], a convolution's im2col written along its output rows): the slice packed as the row-major path
   packs it, 4 k of QMR rows at a time by a 4 x 8 byte transpose where the tile is whole, bytewise at the edges. With
   rows (the call's plane_rows, g->plane set) and valid (the block's plane_masks), read from the planes instead */
static void pack_kmajor(const aot_qgemm *g, int m0, int mr, int k0, int kc, int kin, uint8_t flip,
                        const plane_rows *rows_of, const uint64_t *valid, uint8_t *restrict ap) {
#if defined(__AVX512BW__) && QMC == 64 && QMR == 8
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
#else
  (void)rows_of;
  (void)valid;
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

#if defined(__AVX512BW__) && defined(__AVX512VL__)
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
#endif

/* q[e] = clamp(rint((sum[e] + corr[e]) * sc[e]), lo, hi) + bias8 as a byte, ^ flip8 (int8 as uint8 shifted by 128).
   Clamping first is the same (lo and hi are integers) and keeps the conversion in range; the conversion rounds half
   to even (the default rounding mode, as rint). Written with vectors: gcc's loop vectoriser is off (build.py), and
   the scalar loop was a third of the stem's 12544x64x147 call built by gcc. The clamps as compares (fmaxf/fminf's
   NaN handling cost a compare and a blend each); max_ps(r, lo) gives lo for a NaN r, as the compare does */
static void requantize_row(const int32_t *restrict sum, const int32_t *restrict corr, const float *restrict sc, int nr,
                           float lo, float hi, int bias8, uint8_t flip8, uint8_t *restrict q) {
  int e = 0;
#if defined(__AVX512BW__) && defined(__AVX512VL__)
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

/* what one thread's run of a call keeps across its tasks: the call's geometry and its own buffers */
typedef struct {
  aot_qgemm *g;
  int mblocks, K4, kslice;
  uint8_t flip;
  int32_t zero;
  const plane_rows *rows_of;
  uint64_t *valid;
  uint8_t *ap;
  int32_t *acc;
} qrun;

/* weights read once per run come from memory (ResNet's 7x7 layers, 49x512x4608: 0.444 ms against 0.316 with them in
   cache), so they are fetched ahead, spread over the calls. Where M fits one block, each task's weights are its own:
   the next slice of all its panels (after the last, the next task's first), a whole slice ahead (0.42 -> 0.36 ms;
   the next panel alone was too late). Else the next m block's task reuses them from L2, and only the next panel is
   fetched (a slice ahead cost 196x256x2304 5%, its lines crowding L1). far: the lines fetched a slice ahead */
typedef struct {
  const int8_t *far;
  int far_lines, far_panels;
} qahead;

static qahead weights_ahead(const qrun *q, const qregion *reg, int n0, int k0, int kc, int panels, int j_next) {
  const aot_qgemm *g = q->g;
  const int K4 = q->K4;
  qahead w = {NULL, 0, 0};
  if (q->mblocks == 1 && k0 + kc < K4) {
    w.far = g->b + (long)(n0 / QNR) * K4 * QNR + (long)(k0 + kc) * QNR;
    w.far_lines = min(K4 - k0 - kc, q->kslice) * QNR / 64;
    w.far_panels = panels;
  } else if (q->mblocks == 1 && j_next >= 0) {
    /* (the next n block of the region: mblocks == 1) */
    const int n0n = (reg->n0 + j_next) * QNC;
    w.far = g->b + (long)(n0n / QNR) * K4 * QNR;
    w.far_lines = min(K4, q->kslice) * QNR / 64;
    w.far_panels = cdiv(min(g->N - n0n, QNC), QNR);
  }
  return w;
}

/* call `call` of `calls`' share of the lines a slice ahead, walked as runs of contiguous lines, one per panel it
   touches (a division per line had cost 10% there, a check per line for the panel's end 8 instructions a line) */
static void fetch_weights_share(const qahead *w, int K4, long call, long calls) {
  const long far_total = (long)w->far_lines * w->far_panels, end = (call + 1) * far_total / calls;
  long l = call * far_total / calls;
  if (l >= end) return;
  const int8_t *line = w->far + l / w->far_lines * K4 * QNR + l % w->far_lines * 64;
  for (long run; l < end; l += run, line += (long)K4 * QNR - w->far_lines * 64) {
    run = min((int)(end - l), w->far_lines - (int)(l % w->far_lines));
    for (const int8_t *stop = line + run * 64; line < stop; line += 64) __builtin_prefetch(line);
  }
}

/* a k-major A (a convolution's im2col) is read QMC bytes from each of K rows lda apart, which the hardware does not
   fetch ahead: in the last slice, the first slice of the next task's rows are (the next of this thread's region,
   unless another thread takes it first: with one counter for all it had been a guess on 2). With A out of L2 (as an
   im2col's 1.8 MB leaves it): the stem's 12544x64x147 0.58-0.68 -> 0.42-0.49 ms, 3136x64x576 0.38-0.52 -> 0.31;
   with A in L2 up to 5% slower. Call `call` of `calls` fetches its share of the rows */
static void fetch_a_share(const qrun *q, const qregion *reg, int j_next, long call, long calls) {
  const aot_qgemm *g = q->g;
  const int m0n = (reg->m0 + j_next % reg->mc) * QMC;
  const uint8_t *a_next = g->a + m0n;
  const int a_rows = min(g->K, q->kslice), a_span = min(g->M - m0n, QMC) - 1;
  for (long k = call * a_rows / calls; k < (call + 1) * a_rows / calls; k++) {
    const uint8_t *row = a_next + k * g->lda;
    __builtin_prefetch(row);
    /* the row's second line, where it crosses one */
    if (((uintptr_t)row ^ (uintptr_t)(row + a_span)) >= 64) __builtin_prefetch(row + a_span);
  }
}

/* the block's sums over the k slice [k0, k0 + kc) added into acc, A's slice packed into ap first; j_next: the task
   this thread takes next, unless another takes it first (-1: none known) */
static void multiply_slice(const qrun *q, const qregion *reg, int m0, int n0, int mr, int nr, int k0, int j_next) {
  const aot_qgemm *g = q->g;
  const int K4 = q->K4, kc = min(K4 - k0, q->kslice);
  /* A's slice as [m tile][k/4][QMR][4] bytes, unsigned, zero past M and K (B is zero past K too) */
  const int kin = min(g->K - k0, kc);
  if (g->a_kmajor) pack_kmajor(g, m0, mr, k0, kc, kin, q->flip, q->rows_of, q->valid, q->ap);
  else pack_rows(g, m0, mr, k0, kc, kin, q->flip, q->ap);
  const int panels = cdiv(nr, QNR);
  /* a last tile of few rows in the call of the whole one before it */
  const int more = mr > QMR && mr % QMR <= MICRO_MORE ? mr % QMR : 0;
  /* calls a panel */
  const int tiles = cdiv(mr, QMR) - (more > 0);
  const qahead w = weights_ahead(q, reg, n0, k0, kc, panels, j_next);
  const long calls = (long)tiles * panels;
  const int a_ahead = g->a_kmajor && !q->rows_of && q->mblocks > 1 && k0 + kc >= K4 && j_next >= 0;
  for (int n = 0; n < nr; n += QNR) {
    const int8_t *bt = g->b + (long)((n0 + n) / QNR) * K4 * QNR + (long)k0 * QNR;
    /* the next panel: the next tile's, else the next slice's first */
    const int8_t *next = q->mblocks == 1 ? NULL
                         : n + QNR < nr  ? bt + (long)K4 * QNR
                         : k0 + kc < K4  ? g->b + (long)(n0 / QNR) * K4 * QNR + (long)(k0 + kc) * QNR
                                         : NULL;
    const int next_kc = n + QNR < nr ? kc : min(K4 - k0 - kc, q->kslice);
    const int lines = next ? next_kc * QNR / 64 : 0;
    for (int tile = 0; tile < tiles; tile++) {
      const int m = tile * QMR;
      for (int l = tile * lines / tiles; l < (tile + 1) * lines / tiles; l++) __builtin_prefetch(next + l * 64);
      const long call = (long)(n / QNR) * tiles + tile;
      fetch_weights_share(&w, K4, call, calls);
      if (a_ahead) fetch_a_share(q, reg, j_next, call, calls);
      const uint8_t *at = q->ap + tile * QMR * kc;
      int32_t *ct = q->acc + m * QNC + n;
      if (more && tile == tiles - 1) micro_more(more, kc / 4, at, at + QMR * kc, bt, ct, QNC, k0 > 0);
      else if (mr - m >= QMR) micro(kc / 4, at, bt, ct, QNC, k0 > 0);
      else micro_tail(mr - m, kc / 4, at, bt, ct, QNC, k0 > 0);
    }
  }
}

/* the epilogue's zero-point correction and bias per column (corr) and scale (sc) of columns [n0, n0 + nr) */
static void column_terms(const aot_qgemm *g, int n0, int nr, int32_t zero, int32_t *corr, float *sc) {
  int e = 0;
#if defined(__AVX512F__)
  /* 16 at a time where the scales are one or one per column (the loop was 1/4 of the stem's epilogue by gcc,
     whose loop vectoriser is off) */
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
#endif
  for (; e < nr; e++) {
    const int n = n0 + e;
    /* wrapping int32 arithmetic, as vpdpbusd's own */
    corr[e] = (int32_t)((uint32_t)(g->bias ? g->bias[n] : 0) - (uint32_t)zero * (uint32_t)g->col_sum[n]);
    sc[e] = g->scale ? g->scale[n * g->scale_step] : 0.0f;
  }
}

/* the block's int32 sums plus corr written as they are */
static void write_int32(const aot_qgemm *g, const int32_t *acc, const int32_t *corr, int m0, int n0, int mr, int nr) {
#if !defined(__clang__)
  if (g->ldc_n == 1) {
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
    return;
  }
#endif
  for (int m = 0; m < mr; m++)
    for (int e = 0; e < nr; e++)
      ((int32_t *)g->c)[(long)(m0 + m) * g->ldc_m + (long)(n0 + e) * g->ldc_n] =
        (int32_t)((uint32_t)acc[m * QNC + e] + (uint32_t)corr[e]);
}

#if defined(__AVX512BW__) && defined(__AVX512VL__)
/* a convolution's output (m contiguous, ldc_m 1): blocks of 16 x 16 requantized, turned to columns in registers and
   stored straight into each column's line, part blocks (rows past the last 16, columns past the last 16) with
   masks. The stem's 12544x64x147: the byte buffers, their transpose and a memcpy per line had been a fifth of the
   call */
static void write_columns(const aot_qgemm *g, const int32_t *acc, const int32_t *corr, const float *sc, int m0,
                          int n0, int mr, int nr, float hi, int u8) {
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
}
#endif

/* the block requantized to bytes, each row along n as the sums lie; a convolution's output (m contiguous) is turned
   to columns 16 x 16 (with AVX-512 in registers, else through the byte transpose tb) so that each of its lines is
   written contiguously */
static void write_bytes(const aot_qgemm *g, const int32_t *acc, const int32_t *corr, const float *sc, int m0, int n0,
                        int mr, int nr) {
  const int m_inner = g->ldc_m < g->ldc_n;
  const int u8 = g->out_type == AOT_QGEMM_UINT8;
  /* clamping the integer-valued float to the range less the zero point first keeps the conversion in range */
  const float lo = (u8 ? 0.0f : -128.0f) - (float)g->out_zero, hi = (u8 ? 255.0f : 127.0f) - (float)g->out_zero;
  const int bias8 = g->out_zero + (u8 ? 0 : 128);
  uint8_t *c8 = g->c;
#if defined(__AVX512BW__) && defined(__AVX512VL__)
  if (m_inner && g->ldc_m == 1) {
    write_columns(g, acc, corr, sc, m0, n0, mr, nr, hi, u8);
    return;
  }
#endif
  /* the requantized rows ([m][e], QNC apart), and their transpose ([e][m], QMC apart) when m is contiguous */
  uint8_t qb[QMC * QNC] __attribute__((aligned(64)));
  uint8_t tb[QNC * QMC] __attribute__((aligned(64)));
  const uint8_t flip8 = u8 ? 0 : 0x80;
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
  if (!m_inner) return;
  transpose_bytes(qb, QNC, tb, QMC, mr, nr);
  for (int e = 0; e < nr; e++) {
    uint8_t *out = c8 + (long)(n0 + e) * g->ldc_n + (long)m0 * g->ldc_m;
    if (g->ldc_m == 1) memcpy(out, tb + e * QMC, (size_t)mr);
    else
      for (int m = 0; m < mr; m++) out[(long)m * g->ldc_m] = tb[e * QMC + m];
  }
}

/* one task: the QMC x QNC block of C at (m0, n0) summed whole over K, then its epilogue */
static void run_block(const qrun *q, const qregion *reg, int m0, int n0, int j_next) {
  const aot_qgemm *g = q->g;
  const int mr = min(g->M - m0, QMC), nr = min(g->N - n0, QNC);
#if defined(__AVX512BW__) && QMC == 64 && QMR == 8
  if (q->rows_of) plane_masks(g->plane, m0, q->valid);
#endif
  for (int k0 = 0; k0 < q->K4; k0 += q->kslice) multiply_slice(q, reg, m0, n0, mr, nr, k0, j_next);
  int32_t corr[QNC] __attribute__((aligned(64)));
  float sc[QNC] __attribute__((aligned(64)));
  column_terms(g, n0, nr, q->zero, corr, sc);
  if (g->out_type == AOT_QGEMM_INT32) write_int32(g, q->acc, corr, m0, n0, mr, nr);
  else write_bytes(g, q->acc, corr, sc, m0, n0, mr, nr);
}

/* this call's region: the one whose slice [start, end) is (any other start of a range only changes which region
   goes first) */
static int own_region(int tasks, int regions, int start, int end) {
  int own = 0;
  for (int i = 0; i < regions; i++)
    if (start == (int)((long)tasks * i / regions) && end == (int)((long)tasks * (i + 1) / regions)) own = i;
  return own;
}

void aot_qgemm_run(void *ctx, int start, int end) {
  /* each task computes its block whole, whoever takes it: results do not depend on who does which */
  aot_qgemm *g = ctx;
  const int tasks = aot_qgemm_tasks(g), mblocks = cdiv(g->M, QMC), nblocks = cdiv(g->N, QNC), K4 = (g->K + 3) / 4 * 4;
  const int regions = g->slices > 1 && g->slices <= AOT_QGEMM_SLICES ? g->slices : 1;
  const int by_m = split_by_m(g->M, g->N, regions), own = own_region(tasks, regions, start, end);
  /* K in slices of equal length (a multiple of 4) at most kmax: 2304 as 5 x 464, not 4 x 512 + 256 */
  const int kmax = mblocks == 1 ? QKC_FEW_ROWS : K4 <= QKC_ONE ? QKC_ONE : QKC;
  uint8_t ap[QMC * QKC_MAX] __attribute__((aligned(64)));
  int32_t acc[QMC * QNC] __attribute__((aligned(64)));
  qrun q = {g, mblocks, K4, (cdiv(K4, cdiv(K4, kmax)) + 3) / 4 * 4, g->a_signed ? 0x80 : 0,
            (g->a_zero_at ? *g->a_zero_at : g->a_zero) + (g->a_signed ? 128 : 0), NULL, NULL, ap, acc};
#if defined(__AVX512BW__) && QMC == 64 && QMR == 8
  plane_rows table;
  uint64_t valid[QPLANE_TAPS];
  if (g->plane) {
    plane_rows_of(g->plane, g->M, &table);
    q.rows_of = &table;
    q.valid = valid;
  }
#endif
  /* the region whose tasks are being taken (own, then the next ones round, from their ends), and its index */
  int r = own, from_end = 0;
  qregion reg = region_of(r, regions, by_m, mblocks, nblocks);
  for (;;) {
    const int size = reg.mc * reg.nc;
    const int j = regions == 1 ? __atomic_fetch_add(&g->next, 1, __ATOMIC_RELAXED) : take(&g->taken[r], size, from_end);
    if (j < 0 || j >= size) {
      if (regions == 1 || (r = (r + 1) % regions) == own) break;
      from_end = 1;
      reg = region_of(r, regions, by_m, mblocks, nblocks);
      continue;
    }
    /* the task this thread takes next, unless another takes it first: the region's next from its start (-1 when
       taking from the end, or at the region's end) */
    const int jn = from_end ? -1
                   : regions == 1 ? __atomic_load_n(&g->next, __ATOMIC_RELAXED)
                                  : (int)(unsigned)__atomic_load_n(&g->taken[r], __ATOMIC_RELAXED);
    run_block(&q, &reg, (reg.m0 + j % reg.mc) * QMC, (reg.n0 + j / reg.mc) * QNC, jn >= 0 && jn < size ? jn : -1);
  }
}
