/* The tiny C runtime every artifact links: status codes, error messages, the arena. */
#ifndef AOT_RUNTIME_H
#define AOT_RUNTIME_H
#include <stddef.h>

#ifndef AOT_STATUS_DEFINED
#define AOT_STATUS_DEFINED
enum {
  AOT_OK = 0,
  AOT_ERR_NULL_ARGUMENT = 1,   /* a required pointer was NULL */
  AOT_ERR_OUT_OF_MEMORY = 2,   /* the arena could not be allocated */
  AOT_ERR_INVALID_ARGUMENT = 3, /* an argument had a value the model cannot take */
  AOT_ERR_DEVICE = 4            /* GPU targets: the GPU runtime, driver or device is missing or failed */
};
#endif

#define AOT_ERROR_CAPACITY 256

__attribute__((visibility("hidden"))) int aot_fail(char *error, int status, const char *fmt, ...);
__attribute__((visibility("hidden"))) const char *aot_status_message(int status);
__attribute__((visibility("hidden"))) void *aot_arena_alloc(size_t bytes);
__attribute__((visibility("hidden"))) void aot_arena_free(void *arena);
#endif

#ifndef AOT_RUNTIME_POOL_H
#define AOT_RUNTIME_POOL_H
/* A small thread pool: aot_parallel(pool, fn, ctx, n) runs fn(ctx, start, end) over a fixed split of [0, n), one
   slice per thread (the caller takes the first), and returns when all are done. The split depends only on n and the
   thread count, and every output element is computed whole by one thread, so results do not depend on timing. */
typedef void (*aot_task)(void *ctx, int start, int end);
typedef struct aot_pool aot_pool;
__attribute__((visibility("hidden"))) aot_pool *aot_pool_create(int threads);
__attribute__((visibility("hidden"))) void aot_pool_destroy(aot_pool *pool);
__attribute__((visibility("hidden"))) void aot_parallel(aot_pool *pool, aot_task fn, void *ctx, int n);
__attribute__((visibility("hidden"))) int aot_pool_threads(const aot_pool *pool);
/* AOT_NUM_THREADS if set and positive, else the number of online cores */
__attribute__((visibility("hidden"))) int aot_default_threads(void);
#endif
