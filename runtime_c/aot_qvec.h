/* GNU C vector types of bytes and 16-bit lanes, the same code for gcc and clang, x86 and arm: the 8-bit pool's
   and im2col's (aot_qpool.c, aot_qim2col.c). */
#ifndef AOT_QVEC_H
#define AOT_QVEC_H
#include <stdint.h>
typedef uint8_t qv8 __attribute__((vector_size(32), aligned(1)));
typedef uint16_t qv16 __attribute__((vector_size(32), aligned(1)));
typedef uint8_t qh8 __attribute__((vector_size(16), aligned(1)));
typedef uint16_t qw16 __attribute__((vector_size(64), aligned(1)));
typedef uint8_t qq8 __attribute__((vector_size(8), aligned(1)));
typedef uint16_t qh16 __attribute__((vector_size(16), aligned(1), may_alias));
typedef uint8_t qd8 __attribute__((vector_size(4), aligned(1)));
typedef uint16_t qq16 __attribute__((vector_size(8), aligned(1), may_alias));
#define QV 32
#endif
