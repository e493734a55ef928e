/* The int8 matrix-multiply microkernel's driver (declared in aot_qgemm.h; weights packed by codegen/lower/quant.py).

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

/* rows of A per microkernel call; QNR (aot_qgemm.h) columns: 8 x 32 keeps 16 accumulators of 16 int32 lanes plus
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


/* the instruction set's parts, fixed at compile time and inlined: its tile (aot_qmicro.h), and where it has faster
   ones, A's packing, the requantization and the output's transpose (the header of each ISA level; AVX-512 also reads
   a convolution's A from its input planes); aot_qgemm_portable.h finishes what those leave */
#include "aot_qmicro.h"
#if defined(__AVX512BW__) && defined(__AVX512VL__)
#include "aot_qgemm_avx512.h"
#elif defined(__AVX2__)
#include "aot_qgemm_avx2.h"
#endif
#if defined(__SSE2__)
#include "aot_qgemm_sse2.h"
#endif
#include "aot_qgemm_portable.h"

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
  if (write_columns(g, acc, corr, sc, m0, n0, mr, nr, hi, u8)) return;
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
#if defined(QGEMM_PLANES)
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
#if defined(QGEMM_PLANES)
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
