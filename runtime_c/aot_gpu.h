/* The GPU driver interface an artifact's generated model.c calls: one implementation per runtime (aot_cuda.c over
   the CUDA driver API, aot_hip.c over the HIP runtime, aot_metal.m over Metal). Each loads its runtime library at
   aot_gpu_open, so a library built here loads anywhere and fails there with AOT_ERR_DEVICE and a message. */
#ifndef AOT_GPU_H
#define AOT_GPU_H
#include <stddef.h>
#include "aot_core.h"

/* a device address (CUDA/HIP), or a buffer handle plus offset (Metal): arithmetic on it moves within one allocation */
typedef unsigned long long aot_devptr;
typedef struct aot_gpu aot_gpu;

/* loads the runtime library, picks device 0 and loads the device code (a fatbin, an offload bundle, Metal source) */
__attribute__((visibility("hidden"))) int aot_gpu_open(aot_gpu **out, const void *image, size_t image_bytes,
    char *error);
__attribute__((visibility("hidden"))) void aot_gpu_close(aot_gpu *gpu);
__attribute__((visibility("hidden"))) int aot_gpu_function(aot_gpu *gpu, const char *name, void **fn, char *error);
__attribute__((visibility("hidden"))) int aot_gpu_alloc(aot_gpu *gpu, size_t bytes, aot_devptr *out, char *error);
__attribute__((visibility("hidden"))) void aot_gpu_free(aot_gpu *gpu, aot_devptr p);
__attribute__((visibility("hidden"))) int aot_gpu_upload(aot_gpu *gpu, aot_devptr dst, const void *src, size_t bytes,
    char *error);
__attribute__((visibility("hidden"))) int aot_gpu_download(aot_gpu *gpu, void *dst, aot_devptr src, size_t bytes,
    char *error);
/* queues fn on grid x block threads; args are its parameters in order (buffers, then a run-time size where it takes
   one), each 64 bits. Kernels run in the order launched */
__attribute__((visibility("hidden"))) int aot_gpu_launch(aot_gpu *gpu, void *fn, unsigned grid, unsigned block,
                                                         const aot_devptr *args, int nargs, char *error);
/* waits for every queued kernel */
__attribute__((visibility("hidden"))) int aot_gpu_sync(aot_gpu *gpu, char *error);
#endif
