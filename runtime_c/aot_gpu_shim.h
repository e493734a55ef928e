/* Runs CUDA (or HIP) kernel source on the CPU, for checking a GPU target's numbers without a GPU.
   The kernels are written as phases separated by barriers (codegen/render/gpu.py). A kernel without barriers (one thread per
   output) runs each phase as a loop over the block's threads. A cooperative kernel (aot_shim_blocks with barriers)
   runs each of its block's threads as a coroutine that yields at every AOT_BARRIER: the block's threads run round by
   round, each round from one barrier to the next, so a barrier the source lacks lets a thread run on into the next
   phase before the others finished this one, as it may on a GPU. Shared memory is one copy per host thread (the block
   it is running), seen by all of the block's coroutines.
   AOT_GPU_SHIM_ORDER picks the order the threads take in every phase and round: "forward" (the default), "reverse",
   or "shuffle:SEED" (a new seeded permutation each round); a kernel that is right gives the same bits in each, one
   that lacks a barrier or races inside a phase does not (tests/test_gpu.py runs them all).
   emulate.cpp calls aot_shim_blocks for a range of blocks of each kernel; it is C++ built with this file included. */
#ifndef AOT_GPU_SHIM_H
#define AOT_GPU_SHIM_H
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>
struct aot_dim3 { unsigned x, y, z; };
/* the block and thread being run, per host thread: blocks of one kernel may run on the runtime's thread pool */
static thread_local aot_dim3 blockIdx;
static thread_local aot_dim3 threadIdx;
/* CUDA's half type: the compiler's own on the CPU (clang knows _Float16 in C++) */
typedef _Float16 __half;
#define __global__
/* one copy per host thread, shared by the coroutines of the block it runs */
#define __shared__ static thread_local
/* the HIP source's spellings (clang builtins there) and its device functions (aot_hip_math.h) */
#define __builtin_amdgcn_workgroup_id_x() (blockIdx.x)
#define __builtin_amdgcn_workitem_id_x() (threadIdx.x)
#define AOT_DEVICE static inline

/* the most threads a block has (codegen/render/gpu.py BLOCK_THREADS, COOP_THREADS) */
enum { AOT_SHIM_MAX_THREADS = 1024 };
/* a coroutine's stack: a kernel's frame holds scalars and libm calls only */
enum { AOT_SHIM_STACK_BYTES = 64 * 1024 };

struct aot_shim_order {
  unsigned perm[AOT_SHIM_MAX_THREADS];
  int mode;  /* 0 forward, 1 reverse, 2 shuffle */
  uint64_t state;
  /* the order of one phase or round over n threads */
  void next(unsigned n) {
    for (unsigned i = 0; i < n; i++) perm[i] = mode == 1 ? n - 1 - i : i;
    if (mode != 2) return;
    for (unsigned i = n - 1; i > 0; i--) {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;  /* LCG (Knuth's MMIX constants) */
      unsigned j = (unsigned)((state >> 33) % (i + 1));
      unsigned t = perm[i]; perm[i] = perm[j]; perm[j] = t;
    }
  }
};

/* AOT_GPU_SHIM_ORDER, read when a kernel's blocks start (a test may change it between runs) */
static inline void aot_shim_order_init(aot_shim_order *o) {
  const char *s = getenv("AOT_GPU_SHIM_ORDER");
  o->mode = 0;
  o->state = 0;
  if (s && strcmp(s, "reverse") == 0) o->mode = 1;
  else if (s && strncmp(s, "shuffle", 7) == 0) {
    o->mode = 2;
    o->state = (uint64_t)strtoull(s[7] == ':' ? s + 8 : "0", NULL, 10) * 2654435761ULL + 1;
  }
}

static thread_local aot_shim_order aot_shim_phase_order;
static thread_local bool aot_shim_in_coroutine;

/* a phase outside a coroutine: a loop over the block's threads in the chosen order; inside one: the thread itself */
struct aot_shim_phase {
  unsigned n, i;
  explicit aot_shim_phase(unsigned threads) : n(threads), i(0) {
    if (!aot_shim_in_coroutine) aot_shim_phase_order.next(n);
  }
  bool next() {
    if (aot_shim_in_coroutine) return i++ == 0;
    if (i == n) return false;
    threadIdx.x = aot_shim_phase_order.perm[i++];
    return true;
  }
};
#define AOT_PHASE_BEGIN(threads) for (aot_shim_phase aot_phase_(threads); aot_phase_.next();) {
#define AOT_PHASE_END }

/* Switching between coroutines. x86-64: six callee-saved registers pushed on the stack being left, its stack pointer
   saved, the other's loaded (tens of nanoseconds; glibc's swapcontext makes a system call for the signal mask each
   time, which made vgg19's classifier 40 s slower). Elsewhere: ucontext. */
#if defined(__x86_64__)
extern "C" void aot_shim_switch(void **save_sp, void *load_sp);
__asm__(".text\n.p2align 4\n.hidden aot_shim_switch\n.type aot_shim_switch,@function\naot_shim_switch:\n"
        "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
        "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
        "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n  ret\n"
        ".size aot_shim_switch, .-aot_shim_switch\n");
struct aot_shim_ctx { void *sp; };
static inline void aot_shim_swap(aot_shim_ctx *from, aot_shim_ctx *to) { aot_shim_switch(&from->sp, to->sp); }
/* a new coroutine's stack as aot_shim_switch leaves one: six saved registers, then entry as the return address */
static inline void aot_shim_make(aot_shim_ctx *c, unsigned char *stack, size_t bytes, void (*entry)(),
                                 aot_shim_ctx *) {
  void **top = (void **)(((uintptr_t)(stack + bytes)) & ~(uintptr_t)15);
  top[-1] = NULL;           /* entry's own return address: it never returns */
  top[-2] = (void *)entry;
  for (int i = 3; i <= 8; i++) top[-i] = NULL;
  c->sp = top - 8;
}
#else
struct aot_shim_ctx { ucontext_t uc; };
static inline void aot_shim_swap(aot_shim_ctx *from, aot_shim_ctx *to) { swapcontext(&from->uc, &to->uc); }
static inline void aot_shim_make(aot_shim_ctx *c, unsigned char *stack, size_t bytes, void (*entry)(),
                                 aot_shim_ctx *back) {
  getcontext(&c->uc);
  c->uc.uc_stack.ss_sp = stack;
  c->uc.uc_stack.ss_size = bytes;
  c->uc.uc_link = &back->uc;
  makecontext(&c->uc, entry, 0);
}
#endif

/* the coroutines of the block being run on this host thread (on the heap, for the calls of one kernel: thread_local
   objects with destructors would make the library impossible to unload) */
struct aot_shim_block_state {
  aot_shim_ctx scheduler, thread[AOT_SHIM_MAX_THREADS];
  bool done[AOT_SHIM_MAX_THREADS];
  unsigned current;
  void (*body)(void *);
  void *arg;
  unsigned char stacks[];
};
static thread_local aot_shim_block_state *aot_shim_block_now;

static inline void aot_shim_barrier() {
  aot_shim_block_state *b = aot_shim_block_now;
  if (aot_shim_in_coroutine) aot_shim_swap(&b->thread[b->current], &b->scheduler);
}
#define AOT_BARRIER aot_shim_barrier()

static void aot_shim_thread_main() {
  aot_shim_block_state *b = aot_shim_block_now;
  b->body(b->arg);
  b->done[b->current] = true;
  /* back to the scheduler, which never resumes a finished thread */
  aot_shim_swap(&b->thread[b->current], &b->scheduler);
}

/* runs one block of `threads` threads of a kernel with barriers: body(arg) is the kernel call */
static inline void aot_shim_run_block(aot_shim_block_state *b, unsigned threads, void (*body)(void *), void *arg) {
  b->body = body;
  b->arg = arg;
  for (unsigned t = 0; t < threads; t++) {
    b->done[t] = false;
    aot_shim_make(&b->thread[t], b->stacks + (size_t)t * AOT_SHIM_STACK_BYTES, AOT_SHIM_STACK_BYTES,
                  aot_shim_thread_main, &b->scheduler);
  }
  aot_shim_in_coroutine = true;
  /* one round per barrier: every live thread runs to its next barrier (or its end), in this round's order */
  for (bool live = true; live;) {
    live = false;
    aot_shim_phase_order.next(threads);
    for (unsigned i = 0; i < threads; i++) {
      unsigned t = aot_shim_phase_order.perm[i];
      if (b->done[t]) continue;
      b->current = t;
      threadIdx.x = t;
      aot_shim_swap(&b->scheduler, &b->thread[t]);
      live |= !b->done[t];
    }
  }
  aot_shim_in_coroutine = false;
}

/* emulate.cpp's entry: blocks [start, end) of a kernel, each as loops (no barriers) or as coroutines (barriers) */
template <class F> static inline void aot_shim_blocks(int start, int end, unsigned threads, bool barriers, F &&kernel) {
  aot_shim_order_init(&aot_shim_phase_order);
  aot_shim_block_state *b = NULL;
  if (barriers) {
    if (threads > AOT_SHIM_MAX_THREADS) abort();
    b = (aot_shim_block_state *)malloc(sizeof *b + (size_t)threads * AOT_SHIM_STACK_BYTES);
    if (!b) abort();
    aot_shim_block_now = b;
  }
  for (int blk = start; blk < end; blk++) {
    blockIdx.x = (unsigned)blk;
    if (!barriers) kernel();
    else aot_shim_run_block(b, threads, [](void *f) { (*(F *)f)(); }, (void *)&kernel);
  }
  free(b);
}
#endif
