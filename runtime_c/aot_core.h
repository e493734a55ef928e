/* What every part of the runtime and every artifact uses (runtime_c/aot_runtime.c): status codes, error messages,
   the arena, the thread pool. */
#ifndef AOT_CORE_H
#define AOT_CORE_H
#include <stddef.h>

#ifndef AOT_STATUS_DEFINED
#define AOT_STATUS_DEFINED
enum {
  AOT_OK = 0,
  AOT_ERR_NULL_ARGUMENT = 1,   /* a required pointer was NULL */
  AOT_ERR_OUT_OF_MEMORY = 2,   /* the arena could not be allocated */
  AOT_ERR_INVALID_ARGUMENT = 3, /* an argument had a value the model cannot take */
  AOT_ERR_DEVICE = 4,           /* GPU targets: the GPU runtime, driver or device is missing or failed */
  AOT_ERR_INDEX_RANGE = 5,      /* an index input (a Gather's indices) held a value outside the axis it indexes */
  AOT_ERR_UNSUPPORTED_CPU = 6   /* create: this CPU lacks an instruction set extension the library was built for */
};
#endif

#define AOT_ERROR_CAPACITY 256

__attribute__((visibility("hidden"))) int aot_fail(char *error, int status, const char *fmt, ...);
__attribute__((visibility("hidden"))) const char *aot_status_message(int status);
__attribute__((visibility("hidden"))) void *aot_arena_alloc(size_t bytes);
/* AOT_OK if this CPU has every extension the library was built to use (aot_cpu.c), else AOT_ERR_UNSUPPORTED_CPU
   with their names in error (AOT_ERROR_CAPACITY bytes) */
__attribute__((visibility("hidden"))) int aot_cpu_check(char *error);
__attribute__((visibility("hidden"))) void aot_arena_free(void *arena);

/* A small thread pool: aot_parallel(pool, fn, ctx, n) runs fn(ctx, start, end) over a fixed split of [0, n), one
   slice per thread (thread i, the caller being 0, runs slice i where it is free to, and takes any other still untaken
   once done with its own), and returns when all are done. The split depends only on n and the thread count, and
   every output element is computed whole by one thread, so results do not depend on timing. */
typedef void (*aot_task)(void *ctx, int start, int end);
typedef struct aot_pool aot_pool;
__attribute__((visibility("hidden"))) aot_pool *aot_pool_create(int threads);
__attribute__((visibility("hidden"))) void aot_pool_destroy(aot_pool *pool);
__attribute__((visibility("hidden"))) void aot_parallel(aot_pool *pool, aot_task fn, void *ctx, int n);
__attribute__((visibility("hidden"))) int aot_pool_threads(const aot_pool *pool);
/* the end of a run: the pool's threads sleep until the next aot_parallel instead of spinning for it */
__attribute__((visibility("hidden"))) void aot_pool_rest(aot_pool *pool);
/* A host's executor (NAME_set_executor in NAME.h, which declares the same types): run(host, task, ctx, count) calls
   task(ctx, i) once for each i in [0, count), on any threads in any order, and returns when all have returned */
#ifndef AOT_EXECUTOR_DEFINED
#define AOT_EXECUTOR_DEFINED
typedef void (*aot_task_fn)(void *ctx, int index);
typedef void (*aot_executor_fn)(void *host, aot_task_fn task, void *ctx, int count);
#endif
/* a pool that starts no thread: aot_parallel hands its slices (the split of a pool of that many threads) to run */
__attribute__((visibility("hidden"))) aot_pool *aot_pool_executor(aot_executor_fn run, void *host, int threads);
/* the cores the process may run on (its affinity mask; online cores where there is none) */
__attribute__((visibility("hidden"))) int aot_usable_cores(void);
/* n, or the usable cores where they are fewer: more threads than cores only wait for one another. AOT_OVERSUBSCRIBE
   (set, not 0) leaves n as it is, for tests of the split on small machines */
__attribute__((visibility("hidden"))) int aot_cap_threads(int n);
/* AOT_NUM_THREADS if set and positive, else the usable cores; capped (aot_cap_threads) */
__attribute__((visibility("hidden"))) int aot_default_threads(void);
#endif

