#include "aot_runtime.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

int aot_fail(char *error, int status, const char *fmt, ...) {
  if (error) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(error, AOT_ERROR_CAPACITY, fmt, ap);
    va_end(ap);
  }
  return status;
}

const char *aot_status_message(int status) {
  switch (status) {
    case AOT_OK: return "ok";
    case AOT_ERR_NULL_ARGUMENT: return "a required pointer argument was NULL";
    case AOT_ERR_OUT_OF_MEMORY: return "out of memory";
    case AOT_ERR_INVALID_ARGUMENT: return "invalid argument";
    default: return "unknown status";
  }
}

/* 64-byte aligned so every buffer offset (a multiple of 64) starts on a cache line */
void *aot_arena_alloc(size_t bytes) {
  void *p = NULL;
  if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0) return NULL;
  return p;
}

void aot_arena_free(void *arena) { free(arena); }
