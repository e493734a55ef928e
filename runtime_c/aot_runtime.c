/* sched_getaffinity and CPU_COUNT (aot_default_threads) */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "aot_core.h"
#ifdef __linux__
#include <sched.h>
#endif
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    case AOT_ERR_DEVICE: return "the GPU runtime, driver or device is missing or failed";
    case AOT_ERR_INDEX_RANGE: return "an index was outside the axis it indexes";
    case AOT_ERR_UNSUPPORTED_CPU: return "this CPU lacks an instruction set extension the library was built for";
    default: return "unknown status";
  }
}

/* 64-byte aligned so every buffer offset (a multiple of 64) starts on a cache line, and AOT_ARENA_SLACK bytes longer:
   the float microkernel reads an arena buffer's last tile of B whole (codegen/lower/contract.py _operand), up to 31
   floats past its end, into lanes whose sums it drops */
#define AOT_ARENA_SLACK 128
void *aot_arena_alloc(size_t bytes) {
  void *p = NULL;
  if (posix_memalign(&p, 64, bytes + AOT_ARENA_SLACK) != 0) return NULL;
  return p;
}

void aot_arena_free(void *arena) { free(arena); }

#include <pthread.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

/* Between the kernels of one run, waiting threads spin this long (ns) before they sleep: waking a sleeping
   thread costs tens of microseconds, and a ResNet run is ~60 parallel regions (measured: 2 threads went from 1.5x to
   faster than 1 thread on ResNet-18; see README). 100 us at most, then the condition variable; and not at all once
   a run has ended (aot_pool_rest), so idle models do not take the cores from busy ones. */
#define AOT_SPIN_NS 100000L
/* rounds of cpu_relax between looks at the clock: a pause takes from a few to ~150 cycles by CPU (20000 of them
   were 450 us on a Zen 5), so the spin is bounded in time rather than in rounds */
#define AOT_SPIN_CHECK 64
/* past this (ns) a spinning thread yields its core at each look at the clock: the thread it waits for may be waiting
   for that very core (more threads than free cores: a loaded machine), and spinning would keep it off for the whole
   spin and then sleep; but a yield also hands the core to any other program's thread, so not at once. Measured
   (DenseNet-121, c, 2 threads, medians of all runs on this loaded 2-core machine): pinned to one core, 65 ms never
   yielding, 58 yielding past 5 us, 50 past 20 us, 48 past 50 us (1 thread: 43-53 ms; ~160 sleeps a run never
   yielding, ~1 yielding); on both cores beside a program busy half the time 62 / 54 / 51 / 51 ms; on free cores the
   same (~1.8x as fast as 1 thread) either way */
#define AOT_SPIN_YIELD_NS 20000L

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ volatile("yield");
#endif
}

static long spin_now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1000000000L + t.tv_nsec;
}

/* has a spin that started at start (spin_now_ns, taken at round 0) run its time? */
static int spun_out(long *start, int round) {
  if (round % AOT_SPIN_CHECK) return 0;
  if (round == 0) { *start = spin_now_ns(); return 0; }
  const long spun = spin_now_ns() - *start;
  if (spun > AOT_SPIN_YIELD_NS) sched_yield();
  return spun > AOT_SPIN_NS;
}

struct aot_pool {
  int threads;               /* including the caller */
  pthread_t *workers;
  pthread_mutex_t lock;
  pthread_cond_t start, done;
  /* the job's number, and per slice the number of the last job that took it: thread i (the caller 0, worker i)
     takes slice i of job j by moving slice[i] from j - 1 to j, then, done with it, the slices no other thread has
     taken yet. A thread that wakes late (kept off its core on a loaded machine) finds the job's slices taken, or a
     newer job whose slices its number no longer matches, so a job never waits for a thread that has not started
     it; and on free cores each thread runs the same slice of every call, so the rows a kernel writes on one core
     are the rows the next one reads there (the first thread to come used to take slice 0, the caller or the
     worker by chance; see aot_qgemm_run for what that cost) */
  unsigned job;
  unsigned *slice;
  int finished;              /* the job's slices run to the end */
  /* who sleeps on a condition variable (set under the lock): only then does the other side take the lock to wake
     it, and a thread that sees the job or its end while spinning takes no lock at all (it used to, and could meet
     the other thread holding it and sleep in the kernel: a call of two 1.3 us slices on 2 threads took 2.3 us, now
     1.9 us) */
  int sleepers;              /* workers waiting for a job */
  int waiting;               /* the caller waiting for the end of its job */
  int stop;
  int resting;               /* set between runs: waiting workers sleep at once instead of spinning */
  aot_task fn;
  void *ctx;
  int n;
  aot_executor_fn run;       /* a host's executor (aot_pool_executor): no workers, the slices go to run */
  void *host;
#ifdef __linux__
  cpu_set_t allowed;         /* the cores the creating thread may run on: where a worker moving off another goes */
  int *on_cpu;               /* per thread (the caller 0), the core it took its last job on; -1 before the first */
  int apart;                 /* no more threads than allowed cores: keep_apart moves them (decided at create) */
#endif
};

typedef struct { aot_pool *pool; int index; } aot_worker_arg;

/* slice i of threads in the fixed split of [0, n) */
static inline int slice_start(int n, int i, int threads) { return (int)((long long)n * i / threads); }

/* run job's slices, this thread's own (index) first, then the others no thread has taken, until none is left */
static void run_slices(aot_pool *p, unsigned job, int index) {
  const int slices = p->threads;
  for (int s = 0; s < slices; s++) {
    const int i = (index + s) % slices;
    unsigned was = job - 1;
    if (__atomic_load_n(&p->slice[i], __ATOMIC_RELAXED) != was ||
        !__atomic_compare_exchange_n(&p->slice[i], &was, job, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
      continue;
    /* the job cannot end while this slice is unfinished: its function and size stay as they are */
    const int n = __atomic_load_n(&p->n, __ATOMIC_RELAXED);
    const int lo = slice_start(n, i, slices), hi = slice_start(n, i + 1, slices);
    if (lo < hi) __atomic_load_n(&p->fn, __ATOMIC_RELAXED)(__atomic_load_n(&p->ctx, __ATOMIC_RELAXED), lo, hi);
    /* sequentially consistent with the caller's store to waiting and its load of finished: one of the two sees
       the other, so the caller either finds the job ended or is woken */
    const int done = __atomic_add_fetch(&p->finished, 1, __ATOMIC_SEQ_CST) == slices;
    if (done && __atomic_load_n(&p->waiting, __ATOMIC_SEQ_CST)) {
      pthread_mutex_lock(&p->lock);
      pthread_cond_signal(&p->done);
      pthread_mutex_unlock(&p->lock);
    }
  }
}

static int has_job(aot_pool *p, unsigned seen) {
  return __atomic_load_n(&p->job, __ATOMIC_SEQ_CST) != seen || __atomic_load_n(&p->stop, __ATOMIC_ACQUIRE);
}

/* Linux may wake a worker on the core its caller runs on and leave both there for the whole run: after the process
   slept 10 ms between runs, half of MobileNetV2's 2-thread runs on this 2-core machine took as long as 1 thread's
   (the two threads' cores read from /proc: the same core in those runs). A worker that takes a job on the core of a
   thread before it in the pool moves to the cores no other thread of the pool was last seen on (one look at the core
   a job, a system call only on a move); on one core it stays, as nothing else is allowed, and with more threads than
   cores (AOT_OVERSUBSCRIBE) threads must share them: none moves */
static void keep_apart(aot_pool *p, int index) {
#ifdef __linux__
  if (!p->apart) return;
  const int cpu = sched_getcpu();
  __atomic_store_n(&p->on_cpu[index], cpu, __ATOMIC_RELAXED);
  int shared = 0;
  for (int i = 0; i < index && cpu >= 0; i++) shared |= __atomic_load_n(&p->on_cpu[i], __ATOMIC_RELAXED) == cpu;
  if (!shared) return;
  cpu_set_t to = p->allowed;
  for (int i = 0; i < p->threads; i++) {
    const int other = __atomic_load_n(&p->on_cpu[i], __ATOMIC_RELAXED);
    if (i != index && other >= 0 && other < CPU_SETSIZE) CPU_CLR(other, &to);
  }
  if (CPU_COUNT(&to) == 0) {
    to = p->allowed;
    CPU_CLR(cpu, &to);
  }
  if (CPU_COUNT(&to) > 0) pthread_setaffinity_np(pthread_self(), sizeof to, &to);
#else
  (void)p;
  (void)index;
#endif
}

static void *worker_main(void *arg) {
  aot_worker_arg a = *(aot_worker_arg *)arg;
  free(arg);
  aot_pool *p = a.pool;
  unsigned seen = 0;
  for (;;) {
    long spin = 0;
    for (int i = 0; !spun_out(&spin, i) && !has_job(p, seen) && !__atomic_load_n(&p->resting, __ATOMIC_ACQUIRE); i++)
      cpu_relax();
    if (!has_job(p, seen)) {
      pthread_mutex_lock(&p->lock);
      /* counted before looking again, sequentially consistent with the caller's store of the job and its load of
         sleepers: the caller either sees this thread waiting and wakes it, or this thread sees the job */
      __atomic_add_fetch(&p->sleepers, 1, __ATOMIC_SEQ_CST);
      while (!has_job(p, seen)) pthread_cond_wait(&p->start, &p->lock);
      __atomic_sub_fetch(&p->sleepers, 1, __ATOMIC_RELAXED);
      pthread_mutex_unlock(&p->lock);
    }
    if (__atomic_load_n(&p->stop, __ATOMIC_ACQUIRE)) break;
    seen = __atomic_load_n(&p->job, __ATOMIC_ACQUIRE);
    keep_apart(p, a.index);
    run_slices(p, seen, a.index);
  }
  return NULL;
}

static void pool_free_cpus(aot_pool *p) {
#ifdef __linux__
  free(p->on_cpu);
#else
  (void)p;
#endif
}

aot_pool *aot_pool_create(int threads) {
  if (threads < 1) return NULL;
  aot_pool *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->threads = threads;
  pthread_mutex_init(&p->lock, NULL);
  pthread_cond_init(&p->start, NULL);
  pthread_cond_init(&p->done, NULL);
  p->slice = calloc((size_t)threads, sizeof *p->slice);
  if (!p->slice) { free(p); return NULL; }
#ifdef __linux__
  p->on_cpu = malloc((size_t)threads * sizeof *p->on_cpu);
  if (!p->on_cpu) { free(p->slice); free(p); return NULL; }
  for (int i = 0; i < threads; i++) p->on_cpu[i] = -1;
  if (sched_getaffinity(0, sizeof p->allowed, &p->allowed) != 0) CPU_ZERO(&p->allowed);
  p->apart = threads <= CPU_COUNT(&p->allowed);
#endif
  if (threads > 1) {
    p->workers = calloc((size_t)threads - 1, sizeof *p->workers);
    if (!p->workers) { free(p->slice); pool_free_cpus(p); free(p); return NULL; }
    for (int i = 1; i < threads; i++) {
      aot_worker_arg *a = malloc(sizeof *a);
      if (a) { a->pool = p; a->index = i; }
      if (!a || pthread_create(&p->workers[i - 1], NULL, worker_main, a) != 0) {
        free(a);
        p->threads = i;  /* keep the workers that started */
        break;
      }
    }
  }
  return p;
}

aot_pool *aot_pool_executor(aot_executor_fn run, void *host, int threads) {
  if (!run || threads < 1) return NULL;
  aot_pool *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->threads = threads;
  p->run = run;
  p->host = host;
  return p;
}

void aot_pool_destroy(aot_pool *p) {
  if (!p) return;
  if (p->run) { free(p); return; }
  pthread_mutex_lock(&p->lock);
  __atomic_store_n(&p->stop, 1, __ATOMIC_SEQ_CST);
  pthread_cond_broadcast(&p->start);
  pthread_mutex_unlock(&p->lock);
  for (int i = 1; i < p->threads; i++) pthread_join(p->workers[i - 1], NULL);
  pthread_mutex_destroy(&p->lock);
  pthread_cond_destroy(&p->start);
  pthread_cond_destroy(&p->done);
  free(p->workers);
  free(p->slice);
  pool_free_cpus(p);
  free(p);
}

/* one call's split as the host's executor's tasks see it (on the caller's stack: calls at once share nothing) */
typedef struct { aot_task fn; void *ctx; int n, slices; } executor_call;

static void executor_slice(void *c, int i) {
  const executor_call *e = c;
  if (i < 0 || i >= e->slices) return;
  const int lo = slice_start(e->n, i, e->slices), hi = slice_start(e->n, i + 1, e->slices);
  if (lo < hi) e->fn(e->ctx, lo, hi);
}

void aot_parallel(aot_pool *p, aot_task fn, void *ctx, int n) {
  if (!p || p->threads == 1 || n < 2) { fn(ctx, 0, n); return; }
  if (p->run) {
    executor_call e = {fn, ctx, n, p->threads};
    p->run(p->host, executor_slice, &e, p->threads);
    return;
  }
  __atomic_store_n(&p->resting, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&p->fn, fn, __ATOMIC_RELAXED);
  __atomic_store_n(&p->ctx, ctx, __ATOMIC_RELAXED);
  __atomic_store_n(&p->n, n, __ATOMIC_RELAXED);
  __atomic_store_n(&p->finished, 0, __ATOMIC_RELAXED);
#ifdef __linux__
  if (p->apart) __atomic_store_n(&p->on_cpu[0], sched_getcpu(), __ATOMIC_RELAXED);
#endif
  /* every slice of the last job was taken (it ended): each slice[i] is job - 1 */
  const unsigned job = __atomic_load_n(&p->job, __ATOMIC_RELAXED) + 1;
  __atomic_store_n(&p->job, job, __ATOMIC_SEQ_CST);
  if (__atomic_load_n(&p->sleepers, __ATOMIC_SEQ_CST)) {
    pthread_mutex_lock(&p->lock);
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->lock);
  }
  run_slices(p, job, 0);
  /* every slice is taken: wait for those other threads are still running */
  long spin = 0;
  for (int i = 0; !spun_out(&spin, i) && __atomic_load_n(&p->finished, __ATOMIC_ACQUIRE) < p->threads; i++)
    cpu_relax();
  if (__atomic_load_n(&p->finished, __ATOMIC_ACQUIRE) < p->threads) {
    pthread_mutex_lock(&p->lock);
    __atomic_store_n(&p->waiting, 1, __ATOMIC_SEQ_CST);
    while (__atomic_load_n(&p->finished, __ATOMIC_SEQ_CST) < p->threads) pthread_cond_wait(&p->done, &p->lock);
    __atomic_store_n(&p->waiting, 0, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&p->lock);
  }
}

void aot_pool_rest(aot_pool *p) {
  if (p) __atomic_store_n(&p->resting, 1, __ATOMIC_RELEASE);
}

int aot_pool_threads(const aot_pool *p) { return p ? p->threads : 1; }

int aot_usable_cores(void) {
#ifdef __linux__
  /* the cores this process may run on (a container or taskset limits them), not every core the machine has */
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof allowed, &allowed) == 0 && CPU_COUNT(&allowed) > 0) return CPU_COUNT(&allowed);
#endif
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

int aot_cap_threads(int n) {
  const char *over = getenv("AOT_OVERSUBSCRIBE");
  if (over && over[0] && strcmp(over, "0") != 0) return n;
  const int cores = aot_usable_cores();
  return n < cores ? n : cores;
}

int aot_default_threads(void) {
  const char *env = getenv("AOT_NUM_THREADS");
  return aot_cap_threads(env && atoi(env) > 0 ? atoi(env) : aot_usable_cores());
}
