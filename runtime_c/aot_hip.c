/* aot_gpu.h over the HIP runtime API (AMD GPUs). libamdhip64 is opened at aot_gpu_open, not linked: an artifact
   loads on a machine without ROCm, and creating a model there fails with AOT_ERR_DEVICE and a message. */
#define __HIP_PLATFORM_AMD__ 1
#include "aot_gpu.h"
#include <hip/hip_runtime_api.h>
#include <dlfcn.h>
#include <stdlib.h>

/* the names ROCm releases install the runtime under, newest first (a build may name others: the tests name a
   missing one to check the failure) */
#ifndef AOT_HIP_LIBRARIES
#define AOT_HIP_LIBRARIES "libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5"
#endif
static const char *const HIP_LIBRARIES[] = {AOT_HIP_LIBRARIES};

#define HIP_FUNCTIONS(X) \
  X(init, "hipInit", hipError_t (*)(unsigned)) \
  X(device_count, "hipGetDeviceCount", hipError_t (*)(int *)) \
  X(set_device, "hipSetDevice", hipError_t (*)(int)) \
  X(module_load, "hipModuleLoadData", hipError_t (*)(hipModule_t *, const void *)) \
  X(module_unload, "hipModuleUnload", hipError_t (*)(hipModule_t)) \
  X(module_function, "hipModuleGetFunction", hipError_t (*)(hipFunction_t *, hipModule_t, const char *)) \
  X(mem_alloc, "hipMalloc", hipError_t (*)(void **, size_t)) \
  X(mem_free, "hipFree", hipError_t (*)(void *)) \
  X(htod, "hipMemcpyHtoD", hipError_t (*)(hipDeviceptr_t, void *, size_t)) \
  X(dtoh, "hipMemcpyDtoH", hipError_t (*)(void *, hipDeviceptr_t, size_t)) \
  X(launch, "hipModuleLaunchKernel", hipError_t (*)(hipFunction_t, unsigned, unsigned, unsigned, unsigned, unsigned, \
                                                    unsigned, unsigned, hipStream_t, void **, void **)) \
  X(device_sync, "hipDeviceSynchronize", hipError_t (*)(void)) \
  X(error_string, "hipGetErrorString", const char *(*)(hipError_t))

struct aot_gpu {
  void *lib;
  hipModule_t module;
#define FIELD(name, symbol, type) __typeof__(type) name;
  HIP_FUNCTIONS(FIELD)
#undef FIELD
};

static int hip_fail(aot_gpu *g, hipError_t r, char *error, const char *what) {
  const char *s = g->error_string ? g->error_string(r) : NULL;
  return aot_fail(error, AOT_ERR_DEVICE, "HIP runtime (libamdhip64): %s failed: %s (error %d)", what, s ? s :
      "unknown error", (int)r);
}
#define CHECK(call, what) do { hipError_t r_ = (call); if (r_ != hipSuccess) return hip_fail(g, r_, error, what); } \
    while (0)
/* the current device is per host thread: set it before each use (device 0, the one the module was loaded on) */
#define CURRENT() CHECK(g->set_device(0), "hipSetDevice(0)")

int aot_gpu_open(aot_gpu **out, const void *image, size_t image_bytes, char *error) {
  (void)image_bytes;
  *out = NULL;
  aot_gpu *g = calloc(1, sizeof *g);
  if (!g) return aot_fail(error, AOT_ERR_OUT_OF_MEMORY, "out of memory");
  for (size_t i = 0; i < sizeof HIP_LIBRARIES / sizeof *HIP_LIBRARIES && !g->lib; i++)
    g->lib = dlopen(HIP_LIBRARIES[i], RTLD_NOW | RTLD_LOCAL);
  if (!g->lib) {
    free(g);
    return aot_fail(error, AOT_ERR_DEVICE, "cannot load the HIP runtime library %s (is ROCm installed?)",
        HIP_LIBRARIES[0]);
  }
#define RESOLVE(name, symbol, type) \
  if (!(g->name = (__typeof__(type))dlsym(g->lib, symbol))) { \
    aot_gpu_close(g); return aot_fail(error, AOT_ERR_DEVICE, "libamdhip64.so has no %s", symbol); }
  HIP_FUNCTIONS(RESOLVE)
#undef RESOLVE
  int st = AOT_OK, n = 0;
  hipError_t r;
  if ((r = g->init(0)) != hipSuccess) st = hip_fail(g, r, error, "hipInit (no usable AMD GPU?)");
  else if ((r = g->device_count(&n)) != hipSuccess || n < 1)
    st = r != hipSuccess ? hip_fail(g, r, error, "hipGetDeviceCount") : aot_fail(error, AOT_ERR_DEVICE,
        "HIP: no AMD GPU found");
  else if ((r = g->set_device(0)) != hipSuccess) st = hip_fail(g, r, error, "hipSetDevice(0)");
  /* the image is a clang offload bundle with one code object per --offload-arch: the runtime picks this GPU's */
  else if ((r = g->module_load(&g->module, image)) != hipSuccess)
    st = hip_fail(g, r, error, "hipModuleLoadData (the kernels; was this GPU's architecture in --offload-arch?)");
  if (st != AOT_OK) { aot_gpu_close(g); return st; }
  *out = g;
  return AOT_OK;
}

void aot_gpu_close(aot_gpu *g) {
  if (!g) return;
  if (g->module) g->module_unload(g->module);
  if (g->lib) dlclose(g->lib);
  free(g);
}

int aot_gpu_function(aot_gpu *g, const char *name, void **fn, char *error) {
  CURRENT();
  hipFunction_t f;
  CHECK(g->module_function(&f, g->module, name), name);
  *fn = (void *)f;
  return AOT_OK;
}

int aot_gpu_alloc(aot_gpu *g, size_t bytes, aot_devptr *out, char *error) {
  CURRENT();
  void *p = NULL;
  CHECK(g->mem_alloc(&p, bytes ? bytes : 1), "hipMalloc");
  *out = (aot_devptr)(size_t)p;
  return AOT_OK;
}

void aot_gpu_free(aot_gpu *g, aot_devptr p) {
  if (!g || !p) return;
  g->set_device(0);
  g->mem_free((void *)(size_t)p);
}

int aot_gpu_upload(aot_gpu *g, aot_devptr dst, const void *src, size_t bytes, char *error) {
  if (!bytes) return AOT_OK;
  CURRENT();
  CHECK(g->htod((hipDeviceptr_t)(size_t)dst, (void *)src, bytes), "hipMemcpyHtoD");
  return AOT_OK;
}

int aot_gpu_download(aot_gpu *g, void *dst, aot_devptr src, size_t bytes, char *error) {
  if (!bytes) return AOT_OK;
  CURRENT();
  CHECK(g->dtoh(dst, (hipDeviceptr_t)(size_t)src, bytes), "hipMemcpyDtoH");
  return AOT_OK;
}

int aot_gpu_launch(aot_gpu *g, void *fn, unsigned grid, unsigned block, const aot_devptr *args, int nargs,
                   char *error) {
  CURRENT();
  /* kernel parameters are passed by address; every one is 64 bits (a device pointer, or a run-time size) */
  void *values[nargs > 0 ? nargs : 1];
  void *params[nargs > 0 ? nargs : 1];
  for (int i = 0; i < nargs; i++) { values[i] = (void *)(size_t)args[i]; params[i] = &values[i]; }
  CHECK(g->launch((hipFunction_t)fn, grid, 1, 1, block, 1, 1, 0, NULL, params, NULL), "hipModuleLaunchKernel");
  return AOT_OK;
}

int aot_gpu_sync(aot_gpu *g, char *error) {
  CURRENT();
  CHECK(g->device_sync(), "running the kernels (hipDeviceSynchronize)");
  return AOT_OK;
}
