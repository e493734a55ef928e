/* Runs CUDA (or HIP) kernel source on the CPU, for checking a GPU target's numbers without a GPU.
   The kernels are written as phases separated by barriers (codegen/gpu.py): here a phase is a loop over the block's
   threads, so every thread finishes a phase before any starts the next, which is what a barrier guarantees. The
   launcher (emulate.cpp) sets blockIdx and calls a kernel once per block. Compile as C++ with -include this file. */
#ifndef AOT_GPU_SHIM_H
#define AOT_GPU_SHIM_H
struct aot_dim3 { unsigned x, y, z; };
/* the block being run, per host thread: blocks of one kernel may run on the runtime's thread pool */
static thread_local aot_dim3 blockIdx;
/* CUDA's half type: the compiler's own on the CPU (clang knows _Float16 in C++) */
typedef _Float16 __half;
#define __global__
#define __shared__
#define AOT_PHASE_BEGIN(threads) for (aot_dim3 threadIdx = {0, 0, 0}; threadIdx.x < (threads); threadIdx.x++) {
#define AOT_PHASE_END }
#define AOT_BARRIER ((void)0)
/* the HIP source's spellings (clang builtins there) and its device functions (aot_hip_math.h) */
#define __builtin_amdgcn_workgroup_id_x() (blockIdx.x)
#define __builtin_amdgcn_workitem_id_x() (threadIdx.x)
#define AOT_DEVICE static inline
#endif
