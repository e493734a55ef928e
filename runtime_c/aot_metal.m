/* aot_gpu.h over Metal (macOS; built by src/build_macos.sh, not on Linux). The device code is the Metal source,
   compiled for this Mac's GPU at aot_gpu_open. A device pointer is a buffer handle plus an offset: the buffer's
   index + 1 in the bits above, the byte offset in the low AOT_METAL_OFFSET_BITS bits.
   Buffers use shared storage (one memory on Apple silicon), so uploads and downloads are memcpy. */
#import <Foundation/Foundation.h>
#import <Metal/Metal.h>
#include <stdlib.h>
#include <string.h>
#include "aot_gpu.h"

/* 1 TiB per buffer is more than any Mac's GPU can allocate */
#define AOT_METAL_OFFSET_BITS 40
#define AOT_METAL_MAX_BUFFERS 64

struct aot_gpu {
  void *device;                       /* id<MTLDevice>, retained */
  void *library;                      /* id<MTLLibrary> */
  void *queue;                        /* id<MTLCommandQueue> */
  void *commands;                     /* id<MTLCommandBuffer> being encoded, or NULL */
  void *encoder;                      /* id<MTLComputeCommandEncoder> being encoded, or NULL */
  void *buffers[AOT_METAL_MAX_BUFFERS];
  void **pipelines;                   /* id<MTLComputePipelineState>, one per kernel function */
  int npipelines, capacity;
};

static id<MTLBuffer> buffer_of(aot_gpu *g, aot_devptr p, size_t *offset) {
  unsigned long long slot = p >> AOT_METAL_OFFSET_BITS;
  *offset = (size_t)(p & ((1ULL << AOT_METAL_OFFSET_BITS) - 1));
  if (slot == 0 || slot > AOT_METAL_MAX_BUFFERS) return nil;
  return (__bridge id<MTLBuffer>)g->buffers[slot - 1];
}

int aot_gpu_open(aot_gpu **out, const void *image, size_t image_bytes, char *error) {
  @autoreleasepool {
    *out = NULL;
    id<MTLDevice> device = MTLCreateSystemDefaultDevice();
    if (!device) return aot_fail(error, AOT_ERR_DEVICE, "Metal: no GPU (MTLCreateSystemDefaultDevice returned nil)");
    NSString *source = [[NSString alloc] initWithBytes:image length:image_bytes encoding:NSUTF8StringEncoding];
    MTLCompileOptions *options = [MTLCompileOptions new];
    /* results must match the CPU targets within 1e-4: no fast math */
    options.fastMathEnabled = NO;
    NSError *err = nil;
    id<MTLLibrary> library = [device newLibraryWithSource:source options:options error:&err];
    if (!library)
      return aot_fail(error, AOT_ERR_DEVICE, "Metal: compiling the kernels failed: %s",
          err.localizedDescription.UTF8String);
    aot_gpu *g = calloc(1, sizeof *g);
    if (!g) return aot_fail(error, AOT_ERR_OUT_OF_MEMORY, "out of memory");
    g->device = (__bridge_retained void *)device;
    g->library = (__bridge_retained void *)library;
    g->queue = (__bridge_retained void *)[device newCommandQueue];
    *out = g;
    return AOT_OK;
  }
}

void aot_gpu_close(aot_gpu *g) {
  if (!g) return;
  for (int i = 0; i < AOT_METAL_MAX_BUFFERS; i++) if (g->buffers[i]) CFRelease(g->buffers[i]);
  for (int i = 0; i < g->npipelines; i++) CFRelease(g->pipelines[i]);
  free(g->pipelines);
  if (g->encoder) CFRelease(g->encoder);
  if (g->commands) CFRelease(g->commands);
  if (g->queue) CFRelease(g->queue);
  if (g->library) CFRelease(g->library);
  if (g->device) CFRelease(g->device);
  free(g);
}

int aot_gpu_function(aot_gpu *g, const char *name, void **fn, char *error) {
  @autoreleasepool {
    if (g->npipelines == g->capacity) {
      int n = g->capacity ? 2 * g->capacity : 64;
      void **p = realloc(g->pipelines, (size_t)n * sizeof *p);
      if (!p) return aot_fail(error, AOT_ERR_OUT_OF_MEMORY, "out of memory");
      g->pipelines = p; g->capacity = n;
    }
    id<MTLLibrary> library = (__bridge id<MTLLibrary>)g->library;
    id<MTLFunction> f = [library newFunctionWithName:[NSString stringWithUTF8String:name]];
    if (!f) return aot_fail(error, AOT_ERR_DEVICE, "Metal: no kernel %s in the library", name);
    NSError *err = nil;
    id<MTLComputePipelineState> p = [(__bridge id<MTLDevice>)g->device newComputePipelineStateWithFunction:f
        error:&err];
    if (!p) return aot_fail(error, AOT_ERR_DEVICE, "Metal: pipeline for %s: %s", name,
        err.localizedDescription.UTF8String);
    *fn = g->pipelines[g->npipelines++] = (__bridge_retained void *)p;
    return AOT_OK;
  }
}

int aot_gpu_alloc(aot_gpu *g, size_t bytes, aot_devptr *out, char *error) {
  int slot = 0;
  while (slot < AOT_METAL_MAX_BUFFERS && g->buffers[slot]) slot++;
  if (slot == AOT_METAL_MAX_BUFFERS) return aot_fail(error, AOT_ERR_OUT_OF_MEMORY, "Metal: too many buffers");
  id<MTLBuffer> b = [(__bridge id<MTLDevice>)g->device newBufferWithLength:(bytes ? bytes : 1)
                                                                    options:MTLResourceStorageModeShared];
  if (!b) return aot_fail(error, AOT_ERR_OUT_OF_MEMORY, "Metal: cannot allocate %zu bytes", bytes);
  g->buffers[slot] = (__bridge_retained void *)b;
  *out = (aot_devptr)(slot + 1) << AOT_METAL_OFFSET_BITS;
  return AOT_OK;
}

void aot_gpu_free(aot_gpu *g, aot_devptr p) {
  unsigned long long slot = p >> AOT_METAL_OFFSET_BITS;
  if (!g || slot == 0 || slot > AOT_METAL_MAX_BUFFERS || !g->buffers[slot - 1]) return;
  CFRelease(g->buffers[slot - 1]);
  g->buffers[slot - 1] = NULL;
}

int aot_gpu_upload(aot_gpu *g, aot_devptr dst, const void *src, size_t bytes, char *error) {
  size_t off;
  id<MTLBuffer> b = buffer_of(g, dst, &off);
  if (!b) return aot_fail(error, AOT_ERR_INVALID_ARGUMENT, "Metal: not a buffer of this model");
  memcpy((char *)b.contents + off, src, bytes);
  return AOT_OK;
}

int aot_gpu_download(aot_gpu *g, void *dst, aot_devptr src, size_t bytes, char *error) {
  size_t off;
  id<MTLBuffer> b = buffer_of(g, src, &off);
  if (!b) return aot_fail(error, AOT_ERR_INVALID_ARGUMENT, "Metal: not a buffer of this model");
  memcpy(dst, (const char *)b.contents + off, bytes);
  return AOT_OK;
}

int aot_gpu_launch(aot_gpu *g, void *fn, unsigned grid, unsigned block, const aot_devptr *args, int nargs,
                   char *error) {
  @autoreleasepool {
    /* every kernel of a run goes into one command buffer; a serial compute encoder runs them in order */
    if (!g->commands) {
      id<MTLCommandBuffer> c = [(__bridge id<MTLCommandQueue>)g->queue commandBuffer];
      g->commands = (__bridge_retained void *)c;
      g->encoder = (__bridge_retained void *)[c computeCommandEncoder];
    }
    id<MTLComputeCommandEncoder> e = (__bridge id<MTLComputeCommandEncoder>)g->encoder;
    [e setComputePipelineState:(__bridge id<MTLComputePipelineState>)fn];
    for (int i = 0; i < nargs; i++) {
      size_t off;
      id<MTLBuffer> b = buffer_of(g, args[i], &off);
      if (!b) return aot_fail(error, AOT_ERR_INVALID_ARGUMENT, "Metal: argument %d is not a buffer of this model", i);
      [e setBuffer:b offset:off atIndex:(NSUInteger)i];
    }
    [e dispatchThreadgroups:MTLSizeMake(grid, 1, 1) threadsPerThreadgroup:MTLSizeMake(block, 1, 1)];
    return AOT_OK;
  }
}

int aot_gpu_sync(aot_gpu *g, char *error) {
  if (!g->commands) return AOT_OK;
  id<MTLCommandBuffer> c = (__bridge_transfer id<MTLCommandBuffer>)g->commands;
  id<MTLComputeCommandEncoder> e = (__bridge_transfer id<MTLComputeCommandEncoder>)g->encoder;
  g->commands = g->encoder = NULL;
  [e endEncoding];
  [c commit];
  [c waitUntilCompleted];
  if (c.error) return aot_fail(error, AOT_ERR_DEVICE, "Metal: running the kernels failed: %s",
      c.error.localizedDescription.UTF8String);
  return AOT_OK;
}
