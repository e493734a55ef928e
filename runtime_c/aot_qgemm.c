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
/* a gathered A (a convolution's window) is read once per task, so its tasks span up to this many columns: ResNet's
   widest layers whole (64 x 512 int32 sums, 128 KB on the stack), rather than gathering the same rows per 128 */
#define QNC_GATHER 512

static int cdiv(int a, int b) { return (a + b - 1) / b; }
static int min(int a, int b) { return a < b ? a : b; }
static long ceil_div(long a, long b) { return a >= 0 ? (a + b - 1) / b : -(-a / b); }

/* columns of C a task spans */
static int task_cols(const aot_qgemm *g) { return g->gather ? min(cdiv(g->N, QNR) * QNR, QNC_GATHER) : QNC; }

int aot_qgemm_tasks(const aot_qgemm *g) { return cdiv(g->M, QMC) * cdiv(g->N, task_cols(g)); }

/* rows m0 .. m0 + mr of a gathered A, k from k0 (kc of them, kin real), packed as [m tile][k/4][QMR][4] (the layout
   the plain path packs into), unsigned (bytes ^ flip), zero past M and K. Where each k lies past a row's start does
   not depend on the row: a table of those offsets (and of each bounded k dim's index) is made once per slice. A row
   inside every bound (most of a convolution's rows) is then one table-driven gather; a tile of QMR rows at
   consecutive addresses (stride-1 convolution rows) moves 4 k of all its rows at once, 8-byte loads transposed. */
static void gather(const aot_qgemm *g, int m0, int mr, int k0, int kc, int kin, uint8_t flip, uint8_t *restrict ap) {
  const aot_qgather *q = g->gather;
  const uint8_t off = (uint8_t)g->a_zero ^ flip;
  const int kd = q->kdims;
  long koff[QKC];
  int kidx[AOT_QGATHER_DIMS][QKC];
  long kk[AOT_QGATHER_DIMS], p = 0;
  for (int j = kd - 1, r = k0; j >= 0; j--) {
    kk[j] = r % q->ksize[j];
    r /= q->ksize[j];
    p += q->kstride[j] * kk[j];
  }
  for (int k = 0; k < kin; k++) {
    koff[k] = p;
    for (int j = 0; j < kd; j++) kidx[j][k] = (int)kk[j];
    p += q->kstride[kd - 1];
    kk[kd - 1]++;
    for (int j = kd - 1; j > 0 && kk[j] == q->ksize[j]; j--) {
      p += q->kstride[j - 1] - q->ksize[j] * q->kstride[j];
      kk[j] = 0;
      kk[j - 1]++;
    }
  }
  long row[QMC];
  int inside[QMC];
  long lo[QMC][AOT_QGATHER_DIMS], hi[QMC][AOT_QGATHER_DIMS];
  for (int i = 0; i < mr; i++) {
    long mi[AOT_QGATHER_DIMS];
    for (int d = q->mdims - 1, m = m0 + i; d >= 0; d--) {
      mi[d] = m % q->msize[d];
      m /= q->msize[d];
    }
    row[i] = q->offset;
    for (int d = 0; d < q->mdims; d++) row[i] += q->mstride[d] * mi[d];
    for (int j = 0; j < kd; j++) {
      lo[i][j] = 0;
      hi[i][j] = q->ksize[j];
    }
    int on = 1;
    for (int b = 0; b < q->nbounds; b++) {
      long part = 0;
      for (int d = 0; d < q->mdims; d++) part += q->mcoef[b][d] * mi[d];
      const int j = q->kdim[b];
      if (j < 0) {
        on &= part >= q->lo[b] && part < q->hi[b];
        continue;
      }
      const long c = q->kcoef[b], a = ceil_div(q->lo[b] - part, c), e = ceil_div(q->hi[b] - part, c);
      if (a > lo[i][j]) lo[i][j] = a;
      if (e < hi[i][j]) hi[i][j] = e;
    }
    inside[i] = on ? 1 : -1;
    for (int j = 0; j < kd && on; j++)
      if (lo[i][j] > 0 || hi[i][j] < q->ksize[j]) inside[i] = 0;
  }
  for (int t = 0; t < cdiv(mr, QMR); t++) {
    uint8_t *tile = ap + t * QMR * kc;
    int fast = (t + 1) * QMR <= mr;
    for (int i = t * QMR; i < (t + 1) * QMR && fast; i++) fast = inside[i] == 1 && row[i] == row[t * QMR] + (i - t * QMR);
#if defined(__SSE2__)
    if (fast) {
      const uint8_t *src = g->a + row[t * QMR];
      const __m128i x = _mm_set1_epi8((char)flip);
      int k = 0;
      for (; k + 4 <= kin; k += 4) {
        __m128i r[4];
        for (int u = 0; u < 4; u++) r[u] = _mm_loadl_epi64((const __m128i *)(src + koff[k + u]));
        const __m128i t01 = _mm_unpacklo_epi8(r[0], r[1]), t23 = _mm_unpacklo_epi8(r[2], r[3]);
        _mm_storeu_si128((__m128i *)(tile + k * QMR), _mm_xor_si128(_mm_unpacklo_epi16(t01, t23), x));
        _mm_storeu_si128((__m128i *)(tile + k * QMR + 16), _mm_xor_si128(_mm_unpackhi_epi16(t01, t23), x));
      }
      for (int i = 0; i < QMR; i++)
        for (int e = k; e < kc; e++) tile[(e / 4) * QMR * 4 + i * 4 + e % 4] = e < kin ? (uint8_t)(src[i + koff[e]] ^ flip) : 0;
      continue;
    }
#endif
    for (int i = t * QMR; i < (t + 1) * QMR; i++) {
      uint8_t *dst = tile + (i % QMR) * 4;
      const uint8_t *src = g->a + (i < mr ? row[i] : 0);
      int k = 0;
      if (i < mr && inside[i] == 1)
        for (; k < kin; k++) dst[(k / 4) * QMR * 4 + k % 4] = (uint8_t)(src[koff[k]] ^ flip);
      else if (i < mr && inside[i] == 0)
        for (; k < kin; k++) {
          int on = 1;
          for (int j = 0; j < kd; j++) on &= kidx[j][k] >= lo[i][j] && kidx[j][k] < hi[i][j];
          dst[(k / 4) * QMR * 4 + k % 4] = on ? (uint8_t)(src[koff[k]] ^ flip) : off;
        }
      for (; k < kc; k++) dst[(k / 4) * QMR * 4 + k % 4] = i < mr && k < kin ? off : 0;
    }
  }
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#include <immintrin.h>
/* vpdpbusd: each int32 lane adds the four products of A's 4 unsigned bytes (broadcast) and B's 4 signed bytes */
static void micro(int groups, const uint8_t *restrict a, const int8_t *restrict b, int32_t *restrict c, int ldc,
                  int accumulate) {
  __m512i acc[QMR][2];
  for (int i = 0; i < QMR; i++)
    for (int j = 0; j < 2; j++)
      acc[i][j] = accumulate ? _mm512_loadu_si512(c + i * ldc + j * 16) : _mm512_setzero_si512();
  for (int g = 0; g < groups; g++) {
    const __m512i b0 = _mm512_loadu_si512(b + g * QNR * 4), b1 = _mm512_loadu_si512(b + g * QNR * 4 + 64);
    for (int i = 0; i < QMR; i++) {
      int32_t word;
      memcpy(&word, a + g * QMR * 4 + i * 4, 4);
      const __m512i av = _mm512_set1_epi32(word);
      acc[i][0] = _mm512_dpbusd_epi32(acc[i][0], av, b0);
      acc[i][1] = _mm512_dpbusd_epi32(acc[i][1], av, b1);
    }
  }
  for (int i = 0; i < QMR; i++)
    for (int j = 0; j < 2; j++) _mm512_storeu_si512(c + i * ldc + j * 16, acc[i][j]);
}
#else
/* portable: int32 lanes the compiler vectorises (AVX2: vpmulld/vpmaddwd on the widened bytes; NEON likewise) */
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

void aot_qgemm_run(void *ctx, int start, int end) {
  /* tasks from a shared counter, as in aot_gemm_run: each computes its block whole, whoever takes it */
  (void)start; (void)end;
  aot_qgemm *g = ctx;
  const int tasks = aot_qgemm_tasks(g), mblocks = cdiv(g->M, QMC), K4 = (g->K + 3) / 4 * 4;
  const uint32_t flip = g->a_signed ? 0x80 : 0;
  const int32_t zero = g->a_zero + (g->a_signed ? 128 : 0);
  const int nc = task_cols(g);
  uint8_t ap[QMC * QKC] __attribute__((aligned(64)));
  int32_t acc[QMC * QNC_GATHER] __attribute__((aligned(64)));
  for (int t; (t = __atomic_fetch_add(&g->next, 1, __ATOMIC_RELAXED)) < tasks;) {
    const int m0 = t % mblocks * QMC, n0 = t / mblocks * nc;
    const int mr = min(g->M - m0, QMC), nr = min(g->N - n0, nc);
    for (int k0 = 0; k0 < K4; k0 += QKC) {
      const int kc = min(K4 - k0, QKC);
      /* A's slice as [m tile][k/4][QMR][4] bytes, unsigned, zero past M and K (B is zero past K too) */
      const int kin = min(g->K - k0, kc);
      if (g->gather) gather(g, m0, mr, k0, kc, kin, (uint8_t)flip, ap);
      else for (int i = 0; i < cdiv(mr, QMR) * QMR; i++) {
        uint8_t *dst = ap + (i / QMR) * QMR * kc + (i % QMR) * 4;
        const uint8_t *src = g->a + (long)(m0 + i) * g->lda + k0;
        const int whole = i < mr ? kin / 4 * 4 : 0;
        for (int k = 0; k < whole; k += 4) {
          uint32_t word;
          memcpy(&word, src + k, 4);
          word ^= flip * 0x01010101u;
          memcpy(dst + k * QMR, &word, 4);
        }
        for (int k = whole; k < kc; k++)
          dst[(k / 4) * QMR * 4 + k % 4] = i < mr && k < kin ? (uint8_t)(src[k] ^ flip) : 0;
      }
      for (int n = 0; n < nr; n += QNR) {
        const int8_t *bt = g->b + (long)((n0 + n) / QNR) * K4 * QNR + (long)k0 * QNR;
        for (int m = 0; m < mr; m += QMR) micro(kc / 4, ap + (m / QMR) * QMR * kc, bt, acc + m * nc + n, nc, k0 > 0);
      }
    }
    /* the epilogue walks C along its contiguous axis (a convolution's output positions are m), one line at a time:
       the sums corrected and requantized into q, then stored (two loops the compiler vectorises) */
    const int m_inner = g->ldc_m < g->ldc_n, lines = m_inner ? nr : mr, len = m_inner ? mr : nr;
    const int u8 = g->out_type == AOT_QGEMM_UINT8;
    const float lo = u8 ? 0.0f : -128.0f, hi = u8 ? 255.0f : 127.0f;
    int32_t q[QNC_GATHER] __attribute__((aligned(64)));
    for (int line = 0; line < lines; line++) {
      const long step = m_inner ? nc : 1;
      const int32_t *sum = acc + (m_inner ? line : line * nc);
      char *out = (char *)g->c + ((m_inner ? (long)(n0 + line) * g->ldc_n + (long)m0 * g->ldc_m
                                            : (long)(m0 + line) * g->ldc_m + (long)n0 * g->ldc_n)
                                  * (g->out_type == AOT_QGEMM_INT32 ? 4 : 1));
      const long stride = m_inner ? g->ldc_m : g->ldc_n;
      for (int e = 0; e < len; e++) {
        const int n = n0 + (m_inner ? line : e);
        /* wrapping int32 arithmetic, as vpdpbusd's own */
        const int32_t v = (int32_t)((uint32_t)sum[e * step] - (uint32_t)zero * (uint32_t)g->col_sum[n]
                                    + (uint32_t)(g->bias ? g->bias[n] : 0));
        if (g->out_type == AOT_QGEMM_INT32) { q[e] = v; continue; }
        /* rint rounds half to even; clamping the integer-valued float to the range less the zero point first
           keeps the conversion in range */
        const float r = rintf((float)v * g->scale[n * g->scale_step]);
        q[e] = (int32_t)fminf(fmaxf(r, lo - (float)g->out_zero), hi - (float)g->out_zero) + g->out_zero;
      }
      if (g->out_type == AOT_QGEMM_INT32) for (int e = 0; e < len; e++) ((int32_t *)out)[e * stride] = q[e];
      else if (u8) for (int e = 0; e < len; e++) ((uint8_t *)out)[e * stride] = (uint8_t)q[e];
      else for (int e = 0; e < len; e++) ((int8_t *)out)[e * stride] = (int8_t)q[e];
    }
  }
}
