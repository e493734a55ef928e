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
  AOT_ERR_INDEX_RANGE = 5       /* an index input (a Gather's indices) held a value outside the axis it indexes */
};
#endif

#define AOT_ERROR_CAPACITY 256

__attribute__((visibility("hidden"))) int aot_fail(char *error, int status, const char *fmt, ...);
__attribute__((visibility("hidden"))) const char *aot_status_message(int status);
__attribute__((visibility("hidden"))) void *aot_arena_alloc(size_t bytes);
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
/* AOT_NUM_THREADS if set and positive, else the cores the process may run on (its affinity mask; online cores
   where there is none) */
__attribute__((visibility("hidden"))) int aot_default_threads(void);
#endif

