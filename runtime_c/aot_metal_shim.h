/* A stand-in for <metal_stdlib>, so that generated Metal source can be syntax- and type-checked as C++ with clang on
   machines without Apple's toolchain (aot/build.py: check_metal_syntax). It declares only what the generated
   kernels use: address-space qualifiers, the kernel attribute, vector types for thread positions, barriers, math. */
#ifndef AOT_METAL_SHIM_H
#define AOT_METAL_SHIM_H
#include <cmath>
#define kernel
#define device
#define threadgroup
#define constant
typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;
typedef _Float16 half;
struct uint3 { uint x, y, z; };
namespace metal {
enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2 };
inline void threadgroup_barrier(mem_flags) {}
template <typename T, typename S> T as_type(S s) { T t; __builtin_memcpy(&t, &s, sizeof t); return t; }
inline float copysign(float a, float b) { return std::copysign(a, b); }
inline float fma(float a, float b, float c) { return std::fma(a, b, c); }
inline half fma(half a, half b, half c) { return (half)std::fma((double)a, (double)b, (double)c); }
namespace precise {
#define AOT_METAL_UNARY(f) inline float f(float x) { return std::f(x); }
AOT_METAL_UNARY(exp) AOT_METAL_UNARY(log) AOT_METAL_UNARY(sqrt) AOT_METAL_UNARY(sin) AOT_METAL_UNARY(cos)
AOT_METAL_UNARY(tan) AOT_METAL_UNARY(tanh) AOT_METAL_UNARY(floor) AOT_METAL_UNARY(ceil) AOT_METAL_UNARY(rint)
AOT_METAL_UNARY(trunc) AOT_METAL_UNARY(asin) AOT_METAL_UNARY(acos) AOT_METAL_UNARY(atan) AOT_METAL_UNARY(sinh)
AOT_METAL_UNARY(cosh) AOT_METAL_UNARY(asinh) AOT_METAL_UNARY(acosh) AOT_METAL_UNARY(atanh) AOT_METAL_UNARY(fabs)
#undef AOT_METAL_UNARY
inline float pow(float a, float b) { return std::pow(a, b); }
inline float fmod(float a, float b) { return std::fmod(a, b); }
}  // namespace precise
}  // namespace metal
#endif
