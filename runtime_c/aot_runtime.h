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
  AOT_ERR_INVALID_ARGUMENT = 3 /* an argument had a value the model cannot take */
};
#endif

#define AOT_ERROR_CAPACITY 256

__attribute__((visibility("hidden"))) int aot_fail(char *error, int status, const char *fmt, ...);
__attribute__((visibility("hidden"))) const char *aot_status_message(int status);
__attribute__((visibility("hidden"))) void *aot_arena_alloc(size_t bytes);
__attribute__((visibility("hidden"))) void aot_arena_free(void *arena);
#endif
