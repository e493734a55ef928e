#ifndef AOT_QPOOL_H
#define AOT_QPOOL_H
#include <stdint.h>
/* An 8-bit max pool (runtime_c/aot_qpool.c): y[p][oy][ox] (at y + p*y_plane + oy*y_row + ox) is the largest
   x[p][iy][ix] (at x + p*x_plane + iy*x_row + ix) over iy = oy*SH - PH + ky*DH, ix = ox*SW - PW + kx*DW inside the
   H x W plane, uint8 or int8 (x_signed); taps outside it are skipped (the type's minimum where none is inside).
   Run aot_qpool_run(p, start, end) on any split of [0, planes). */
#define AOT_QPOOL_ROW 4096
typedef struct {
  const uint8_t *x;
  long x_plane, x_row;
  int H, W, x_signed;
  int KH, KW, SH, SW, PH, PW, DH, DW;
  uint8_t *y;
  long y_plane, y_row;
  int OH, OW, planes;
} aot_qpool;
__attribute__((visibility("hidden"))) void aot_qpool_run(void *p, int start, int end);
#endif
