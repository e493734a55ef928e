/* aot_gpu.h over the CUDA driver API. libcuda.so.1 is opened at aot_gpu_open, not linked: an artifact loads on a
   machine without the NVIDIA driver, and creating a model there fails with AOT_ERR_DEVICE and a message. */
#include "aot_gpu.h"
#include <cuda.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>

#ifndef CUDA_LIBRARY
#define CUDA_LIBRARY "libcuda.so.1"  /* the driver's soname (a build may name another: the tests name a missing one) */
#endif

/* the driver entry points used, with the versioned names cuda.h maps them to */
#define CUDA_FUNCTIONS(X) \
  X(init, "cuInit", CUresult (*)(unsigned)) \
  X(device_get, "cuDeviceGet", CUresult (*)(CUdevice *, int)) \
  X(ctx_retain, "cuDevicePrimaryCtxRetain", CUresult (*)(CUcontext *, CUdevice)) \
  X(ctx_release, "cuDevicePrimaryCtxRelease_v2", CUresult (*)(CUdevice)) \
  X(ctx_set, "cuCtxSetCurrent", CUresult (*)(CUcontext)) \
  X(ctx_sync, "cuCtxSynchronize", CUresult (*)(void)) \
  X(module_load, "cuModuleLoadData", CUresult (*)(CUmodule *, const void *)) \
  X(module_unload, "cuModuleUnload", CUresult (*)(CUmodule)) \
  X(module_function, "cuModuleGetFunction", CUresult (*)(CUfunction *, CUmodule, const char *)) \
  X(mem_alloc, "cuMemAlloc_v2", CUresult (*)(CUdeviceptr *, size_t)) \
  X(mem_free, "cuMemFree_v2", CUresult (*)(CUdeviceptr)) \
  X(htod, "cuMemcpyHtoD_v2", CUresult (*)(CUdeviceptr, const void *, size_t)) \
  X(dtoh, "cuMemcpyDtoH_v2", CUresult (*)(void *, CUdeviceptr, size_t)) \
  X(launch, "cuLaunchKernel", CUresult (*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, \
                                           unsigned, CUstream, void **, void **)) \
  X(error_string, "cuGetErrorString", CUresult (*)(CUresult, const char **))

struct aot_gpu {
  void *lib;
  CUdevice device;
  CUcontext context;
  CUmodule module;
#define FIELD(name, symbol, type) __typeof__(type) name;
  CUDA_FUNCTIONS(FIELD)
#undef FIELD
};

static int cuda_fail(aot_gpu *g, CUresult r, char *error, const char *what) {
  const char *s = NULL;
  if (g->error_string) g->error_string(r, &s);
  return aot_fail(error, AOT_ERR_DEVICE, "CUDA: %s failed: %s (error %d)", what, s ? s : "unknown error", (int)r);
}
#define CHECK(call, what) do { CUresult r_ = (call); if (r_ != CUDA_SUCCESS) return cuda_fail(g, r_, error, what); } \
    while (0)

int aot_gpu_open(aot_gpu **out, const void *image, size_t image_bytes, char *error) {
  (void)image_bytes;
  *out = NULL;
  aot_gpu *g = calloc(1, sizeof *g);
  if (!g) return aot_fail(error, AOT_ERR_OUT_OF_MEMORY, "out of memory");
  g->lib = dlopen(CUDA_LIBRARY, RTLD_NOW | RTLD_LOCAL);
  if (!g->lib) {
    const char *why = dlerror();
    free(g);
    return aot_fail(error, AOT_ERR_DEVICE, "cannot load the CUDA driver library " CUDA_LIBRARY
                    " (is the NVIDIA driver installed?): %s", why ? why : "not found");
  }
#define RESOLVE(name, symbol, type) \
  if (!(g->name = (__typeof__(type))dlsym(g->lib, symbol))) { \
    aot_gpu_close(g); return aot_fail(error, AOT_ERR_DEVICE, CUDA_LIBRARY " has no %s (driver too old?)", symbol); }
  CUDA_FUNCTIONS(RESOLVE)
#undef RESOLVE
  int st = AOT_OK;
  CUresult r;
  if ((r = g->init(0)) != CUDA_SUCCESS) st = cuda_fail(g, r, error, "cuInit (no usable NVIDIA GPU?)");
  else if ((r = g->device_get(&g->device, 0)) != CUDA_SUCCESS) st = cuda_fail(g, r, error, "cuDeviceGet(0)");
  else if ((r = g->ctx_retain(&g->context, g->device)) != CUDA_SUCCESS) st = cuda_fail(g, r, error,
      "cuDevicePrimaryCtxRetain");
  else if ((r = g->ctx_set(g->context)) != CUDA_SUCCESS) st = cuda_fail(g, r, error, "cuCtxSetCurrent");
  /* the image is a fatbin holding sm_90 code and PTX: the driver picks the cubin, or JIT-compiles the PTX */
  else if ((r = g->module_load(&g->module, image)) != CUDA_SUCCESS) st = cuda_fail(g, r, error,
      "cuModuleLoadData (the kernels)");
  if (st != AOT_OK) { aot_gpu_close(g); return st; }
  *out = g;
  return AOT_OK;
}

void aot_gpu_close(aot_gpu *g) {
  if (!g) return;
  if (g->module) { g->ctx_set(g->context); g->module_unload(g->module); }
  if (g->context) g->ctx_release(g->device);
  if (g->lib) dlclose(g->lib);
  free(g);
}

/* the primary context is per device and shared by the process; a thread must make it current before using it */
#define CURRENT() CHECK(g->ctx_set(g->context), "cuCtxSetCurrent")

int aot_gpu_function(aot_gpu *g, const char *name, void **fn, char *error) {
  CURRENT();
  CUfunction f;
  CHECK(g->module_function(&f, g->module, name), name);
  *fn = (void *)f;
  return AOT_OK;
}

int aot_gpu_alloc(aot_gpu *g, size_t bytes, aot_devptr *out, char *error) {
  CURRENT();
  CUdeviceptr p;
  CHECK(g->mem_alloc(&p, bytes ? bytes : 1), "cuMemAlloc");
  *out = (aot_devptr)p;
  return AOT_OK;
}

void aot_gpu_free(aot_gpu *g, aot_devptr p) {
  if (!g || !p) return;
  g->ctx_set(g->context);
  g->mem_free((CUdeviceptr)p);
}

int aot_gpu_upload(aot_gpu *g, aot_devptr dst, const void *src, size_t bytes, char *error) {
  if (!bytes) return AOT_OK;
  CURRENT();
  CHECK(g->htod((CUdeviceptr)dst, src, bytes), "cuMemcpyHtoD");
  return AOT_OK;
}

int aot_gpu_download(aot_gpu *g, void *dst, aot_devptr src, size_t bytes, char *error) {
  if (!bytes) return AOT_OK;
  CURRENT();
  CHECK(g->dtoh(dst, (CUdeviceptr)src, bytes), "cuMemcpyDtoH");
  return AOT_OK;
}

int aot_gpu_launch(aot_gpu *g, void *fn, unsigned grid, unsigned block, const aot_devptr *args, int nargs,
                   char *error) {
  CURRENT();
  /* kernel parameters are passed by address; every one is 64 bits (a device pointer, or a run-time size) */
  CUdeviceptr values[nargs > 0 ? nargs : 1];
  void *params[nargs > 0 ? nargs : 1];
  for (int i = 0; i < nargs; i++) { values[i] = (CUdeviceptr)args[i]; params[i] = &values[i]; }
  CHECK(g->launch((CUfunction)fn, grid, 1, 1, block, 1, 1, 0, NULL, params, NULL), "cuLaunchKernel");
  return AOT_OK;
}

int aot_gpu_sync(aot_gpu *g, char *error) {
  CURRENT();
  CHECK(g->ctx_sync(), "running the kernels (cuCtxSynchronize)");
  return AOT_OK;
}
