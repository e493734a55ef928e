/* NAME_create's first step: does this CPU have every instruction set extension the library's code was compiled to
   use (aot_cpu_target.h, written by the build from the compiler's own answer: aot/cpu.py)? Without it, a library
   built with --cpu native and copied to an older machine dies with SIGILL in its first kernel. This file is built
   for the architecture's baseline (aot/build.py: no -march of the build's), so it runs on any CPU of it; NAME_create
   calls it before any code built for the target runs. */
#include <stdio.h>
#include <string.h>
#include "aot_core.h"
/* sources emitted without a build (compile-model --emit) have no target header yet: nothing to check */
#if __has_include("aot_cpu_target.h")
#include "aot_cpu_target.h"
#else
#define AOT_CPU_BUILT_FOR "an unknown --cpu"
#define AOT_CPU_REQUIRED_COUNT 0
#endif

/* the missing features' names, comma separated, into missing (at least AOT_ERROR_CAPACITY bytes) */
static void add_missing(char *missing, const char *name) {
  size_t used = strlen(missing);
  if (used + strlen(name) + 8 >= AOT_ERROR_CAPACITY / 2 - 8) {
    if (!strstr(missing, ", ...")) strcat(missing, ", ...");
    return;
  }
  if (used) strcat(missing, ", ");
  strcat(missing, name);
}

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define PORTABLE "x86-64-v2, x86-64-v3"
struct aot_cpu_feature {
  const char *name;
  unsigned leaf, subleaf, reg, bit;
  unsigned long long state; /* XCR0 bits the OS must have enabled for the extension's registers */
};

/* XCR0: the register state the OS saves and restores (an AVX-512 CPU under an OS that does not save ZMM lacks
   AVX-512 as far as a program is concerned) */
static unsigned long long os_state(void) {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE)) return 0;
  unsigned lo, hi;
  /* xgetbv by its bytes: an assembler that does not know the mnemonic (or a -march without XSAVE) still takes it */
  __asm__ volatile(".byte 0x0f, 0x01, 0xd0" : "=a"(lo), "=d"(hi) : "c"(0));
  return (unsigned long long)hi << 32 | lo;
}

static int has(const struct aot_cpu_feature *f, unsigned long long state) {
  unsigned r[4] = {0, 0, 0, 0};
  if (__get_cpuid_max(f->leaf & 0x80000000u, NULL) < f->leaf) return 0;
  __cpuid_count(f->leaf, f->subleaf, r[0], r[1], r[2], r[3]);
  return (r[f->reg] >> f->bit & 1u) && (state & f->state) == f->state;
}

static void find_missing(char *missing) {
#if AOT_CPU_REQUIRED_COUNT
  static const struct aot_cpu_feature required[] = AOT_CPU_REQUIRED;
  unsigned long long state = os_state();
  for (size_t i = 0; i < sizeof required / sizeof *required; i++)
    if (!has(&required[i], state)) add_missing(missing, required[i].name);
#else
  (void)missing;
#endif
}
#elif defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#define PORTABLE "generic, armv8.2-a+dotprod"
struct aot_cpu_feature {
  const char *name;
  int word; /* 1: AT_HWCAP, 2: AT_HWCAP2 */
  int bit;
};

static void find_missing(char *missing) {
#if AOT_CPU_REQUIRED_COUNT
  static const struct aot_cpu_feature required[] = AOT_CPU_REQUIRED;
  unsigned long words[3] = {0, getauxval(AT_HWCAP), getauxval(AT_HWCAP2)};
  for (size_t i = 0; i < sizeof required / sizeof *required; i++)
    if (!(words[required[i].word] >> required[i].bit & 1ul)) add_missing(missing, required[i].name);
#else
  (void)missing;
#endif
}
#else
#define PORTABLE "generic"
/* no way to ask here: the library runs as built */
static void find_missing(char *missing) { (void)missing; }
#endif

int aot_cpu_check(char *error) {
  char missing[AOT_ERROR_CAPACITY] = "";
  find_missing(missing);
  if (!missing[0]) {
    error[0] = 0;
    return AOT_OK;
  }
  /* snprintf, not aot_fail: aot_runtime.c is built for the target, and a varargs prologue built for AVX saves its
     registers with AVX instructions */
  snprintf(error, AOT_ERROR_CAPACITY, "this CPU lacks %s; the library was built for %s: build it for a --cpu this "
           "CPU has (%s)", missing, AOT_CPU_BUILT_FOR, PORTABLE);
  return AOT_ERR_UNSUPPORTED_CPU;
}
