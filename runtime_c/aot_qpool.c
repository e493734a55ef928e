/* The 8-bit max pool (aot_qpool_run, declared in aot_qpool.h), recognised by codegen/lower/qpool.py. */
#include <stdint.h>
#include <string.h>
#include "aot_qpool.h"
#include "aot_qvec.h"

/* *** 8-bit max pools (aot_qpool): separable, each output row the column maxima of its window's rows, then the
   maxima along that row at the window's steps, both along contiguous bytes in 32-byte vectors (16- or 8-byte ones
   for shorter rows; GNU C vector types: the same code for gcc and clang, x86 and arm). The generated loop over the
   window's gated taps ran as byte inserts at 4 GB/s (ResNet-18's 3x3/2 pool over 64x112x112 uint8: 0.51 ms). int8 is
   compared as uint8 with its sign bit flipped. (Computing a stride-2 row's maxima in AVX-512 registers instead, no
   row buffer, was 2x faster with the input in cache and slower inside ResNet-18: reverted, cause not found.) *** */

/* lanewise max (a statement expression, not a function: a 32-byte vector returned by value changes the ABI where
   the target has no AVX, which gcc warns of) */
#define qmax(a, b)                                                                                                   \
  ({                                                                                                                 \
    const __typeof__(a) a_ = (a), b_ = (b), m_ = (__typeof__(a))(a_ > b_);                                           \
    (a_ & m_) | (b_ & ~m_);                                                                                          \
  })

/* the vector steps over [0, n): whole vectors, then one more ending at n (overlapping: each lane's value is the same
   whichever step computes it); none when n < step (the scalar loop after takes all) */
#define QPOOL_STEPS(i, n, step) for (int i = 0, last_ = (n) - (step); i <= last_; i = i < last_ && i + (step) > last_ ? last_ : i + (step))

static void qpool_row(const uint8_t *restrict t, uint8_t *restrict y, const aot_qpool *p, uint8_t flip) {
  const int OW = p->OW, SW = p->SW, KW = p->KW, DW = p->DW;
  int done = 0;
  /* rows narrower than a 32-byte vector in 16-, 8- or 4-byte ones (the scalar loop took 3x3 pools over 13x13 and
     27x27 planes at 0.1-0.5 GB/s) */
#define QPOOL_STRIDE1(T, lanes)                                                                                       \
  QPOOL_STEPS(ox, OW, lanes) {                                                                                       \
    const T m = qmax(qmax(*(const T *)(t + ox), *(const T *)(t + ox + 1)), *(const T *)(t + ox + 2));                \
    *(T *)(y + ox) = m ^ ((T){0} + flip);                                                                            \
  }
  /* the window's maxima at every column, then every other one: the low bytes of 16-bit lanes, narrowed */
#define QPOOL_STRIDE2(T, W16, N, lanes)                                                                               \
  QPOOL_STEPS(ox, OW, lanes) {                                                                                       \
    const uint8_t *s = t + 2 * ox;                                                                                   \
    T m = qmax(*(const T *)s, *(const T *)(s + 1));                                                                  \
    if (KW == 3) m = qmax(m, *(const T *)(s + 2));                                                                   \
    *(N *)(y + ox) = __builtin_convertvector((W16)m & 0xff, N) ^ ((N){0} + flip);                                    \
  }
  if (DW == 1 && KW == 3 && SW == 1 && OW >= 4) {
    if (OW >= QV) QPOOL_STRIDE1(qv8, QV)
    else if (OW >= 16) QPOOL_STRIDE1(qh8, 16)
    else if (OW >= 8) QPOOL_STRIDE1(qq8, 8)
    else QPOOL_STRIDE1(qd8, 4)
    done = OW;
  } else if (DW == 1 && (KW == 3 || KW == 2) && SW == 2 && OW >= 4) {
    if (OW >= QV / 2) QPOOL_STRIDE2(qv8, qv16, qh8, QV / 2)
    else if (OW >= 8) QPOOL_STRIDE2(qh8, qh16, qq8, 8)
    else QPOOL_STRIDE2(qq8, qq16, qd8, 4)
    done = OW;
  }
#undef QPOOL_STRIDE1
#undef QPOOL_STRIDE2
  for (int ox = done; ox < OW; ox++) {
    uint8_t m = t[ox * SW];
    for (int kx = 1; kx < KW; kx++) m = t[ox * SW + kx * DW] > m ? t[ox * SW + kx * DW] : m;
    y[ox] = m ^ flip;
  }
}

void aot_qpool_run(void *ctx, int start, int end) {
  const aot_qpool *p = ctx;
  const uint8_t flip = p->x_signed ? 0x80 : 0;
  /* the row with its padding: t[PW + ix] holds column ix, the padding (and a vector past the end, which the steps
     read into lanes they drop) the identity 0, flipped the minimum; codegen/lower/qpool.py keeps the row within
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
#define QPOOL_ROWS(T, lanes)                                                                                          \
  QPOOL_STEPS(ix, W, lanes) {                                                                                        \
    const T v = *(const T *)(in + ix) ^ ((T){0} + flip);                                                             \
    *(T *)(row + ix) = taps ? qmax(v, *(T *)(row + ix)) : v;                                                         \
  }
        if (W >= QV) QPOOL_ROWS(qv8, QV)
        else if (W >= 16) QPOOL_ROWS(qh8, 16)
        else if (W >= 8) QPOOL_ROWS(qq8, 8)
        else if (W >= 4) QPOOL_ROWS(qd8, 4)
#undef QPOOL_ROWS
        else
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
