/* Device math for HIP kernels built without ROCm's device libraries (-nogpulib): the functions the AMDGPU backend
   does not lower by itself, from the ones it does (exp, log, sqrt, fabs, copysign). float only; relative error within
   a few 1e-7 (erf's absolute error below 3e-7), checked against numpy on the CPU by tests/test_gpu.py. */
#ifndef AOT_HIP_MATH_H
#define AOT_HIP_MATH_H
#ifndef AOT_DEVICE
#define AOT_DEVICE static __attribute__((device)) inline
#endif
/* exp(x) - 1 and log(1 + x) lose digits to cancellation for small x: Kahan's corrections (u - 1 is exact here, and
   the ratio cancels exp's and log's own rounding) */
AOT_DEVICE float aot_expm1f(float x) {
  float u = __builtin_expf(x);
  if (u == 1.0f) return x;
  if (u - 1.0f == -1.0f) return -1.0f;
  return (u - 1.0f) * x / __builtin_logf(u);
}
AOT_DEVICE float aot_log1pf(float x) {
  float u = 1.0f + x;
  return u == 1.0f ? x : __builtin_logf(u) * x / (u - 1.0f);
}
AOT_DEVICE float aot_tanhf(float x) {
  float a = __builtin_fabsf(x);
  /* beyond 9, tanh is 1 in float; below, 1 - 2 / (e^2a + 1) through expm1 keeps small values accurate */
  float t = a > 9.0f ? 1.0f : aot_expm1f(2.0f * a) / (aot_expm1f(2.0f * a) + 2.0f);
  return __builtin_copysignf(t, x);
}
AOT_DEVICE float aot_erff(float x) {
  float a = __builtin_fabsf(x);
  if (a < 0.5f) {
    /* Taylor series: relative accuracy where the absolute error of the approximation below would be too coarse */
    float z = x * x;
    return 1.1283791671f * x * (1.0f + z * (-1.0f / 3 + z * (1.0f / 10 + z * (-1.0f / 42 + z * (1.0f / 216 + z *
        (-1.0f / 1320))))));
  }
  /* Abramowitz & Stegun 7.1.28 */
  float t = 1.0f + a * (0.0705230784f + a * (0.0422820123f + a * (0.0092705272f + a * (0.0001520143f + a *
      (0.0002765672f
            + a * 0.0000430638f)))));
  t = t * t; t = t * t; t = t * t; t = t * t;
  return __builtin_copysignf(1.0f - 1.0f / t, x);
}
AOT_DEVICE float aot_tanf(float x) { return __builtin_sinf(x) / __builtin_cosf(x); }
AOT_DEVICE float aot_sinhf(float x) {
  float e = aot_expm1f(__builtin_fabsf(x));
  return __builtin_copysignf(0.5f * (e + e / (e + 1.0f)), x);
}
AOT_DEVICE float aot_coshf(float x) { float e = __builtin_expf(__builtin_fabsf(x)); return 0.5f * (e + 1.0f / e); }
AOT_DEVICE float aot_atanf(float x) {
  /* reduce to |x| <= tan(pi/12) by atan(x) = pi/2 - atan(1/x) and atan(x) = pi/6 + atan((x - c) / (1 + c x)), c =
     1/sqrt(3) */
  float a = __builtin_fabsf(x), off = 0.0f;
  int inv = a > 1.0f;
  if (inv) a = 1.0f / a;
  if (a > 0.2679491924f) { off = 0.5235987756f; a = (a - 0.5773502692f) / (1.0f + 0.5773502692f * a); }
  float z = a * a;
  float r = off + a * (1.0f + z * (-0.3333333333f + z * (0.2f + z * (-0.1428571429f + z * 0.1111111111f))));
  if (inv) r = 1.5707963268f - r;
  return __builtin_copysignf(r, x);
}
AOT_DEVICE float aot_asinf(float x) { return aot_atanf(x / __builtin_sqrtf((1.0f - x) * (1.0f + x))); }
AOT_DEVICE float aot_acosf(float x) { return 1.5707963268f - aot_asinf(x); }
AOT_DEVICE float aot_asinhf(float x) {
  float a = __builtin_fabsf(x);
  return __builtin_copysignf(aot_log1pf(a + a * a / (1.0f + __builtin_sqrtf(a * a + 1.0f))), x);
}
AOT_DEVICE float aot_acoshf(float x) { return __builtin_logf(x + __builtin_sqrtf((x - 1.0f) * (x + 1.0f))); }
AOT_DEVICE float aot_atanhf(float x) { return 0.5f * aot_log1pf(2.0f * x / (1.0f - x)); }
#endif
