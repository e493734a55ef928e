/* The runtime as generated code sees it (model.c includes this one header): the core every artifact links
   (aot_core.h), then each operation's header that the artifact's src/ holds. An artifact holds the headers of the
   runtime files its model calls (aot/compiler.py runtime_files), and the build cache keys an object by the headers
   its source includes that are there (aot/build.py included_headers): so a float model's objects do not depend on
   the int8 headers, and editing those rebuilds only the models that call them. */
#ifndef AOT_RUNTIME_H
#define AOT_RUNTIME_H
#include "aot_core.h"
#if __has_include("aot_gemm.h")
#include "aot_gemm.h"
#endif
#if __has_include("aot_direct.h")
#include "aot_direct.h"
#endif
#if __has_include("aot_qgemm.h")
#include "aot_qgemm.h"
#endif
#if __has_include("aot_qim2col.h")
#include "aot_qim2col.h"
#endif
#if __has_include("aot_qpool.h")
#include "aot_qpool.h"
#endif
#endif
