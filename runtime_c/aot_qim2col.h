#ifndef AOT_QIM2COL_H
#define AOT_QIM2COL_H
#include <stdint.h>
/* An 8-bit convolution's input as the int8 contraction's k-major A (runtime_c/aot_qim2col.c): for plane c and tap
   (kh, kw), the row at y + c*y_plane + kh*y_kh + kw*y_kw holds, at oy*OW + ox, x[c][iy][ix] (at x + c*x_plane +
   iy*x_row + ix) for iy = oy*SH - PH + kh, ix = ox*SW - PW + kw inside the H x W plane, else the byte pad (A's zero
   point). Run aot_qim2col_run(p, start, end) on any split of [0, planes * KH). */
typedef struct {
  const uint8_t *x;
  long x_plane, x_row;
  int H, W;
  int KH, KW, SH, SW, PH, PW;
  uint8_t *y;
  long y_plane, y_kh, y_kw;
  int OH, OW, planes, pad;
} aot_qim2col;
__attribute__((visibility("hidden"))) void aot_qim2col_run(void *p, int start, int end);
#endif
