"""GPU lowering and the CUDA / HIP / Metal renderers: one lowering, three tables over the C renderer.

Lowering (decided once per kernel, `plan_launch`): the kernel's output loops (every non-reduce RANGE) are flattened
into one index over the grid.
- per-thread: each thread computes one output element, gid = block id * BLOCK_THREADS + thread id, with a bounds
  guard for the last, partial block. Reductions run serially inside the thread.
- cooperative: a kernel with few outputs that each reduce over many elements gets one block per output; the block's
  threads split every top-level reduction (its loops flattened into one strided loop), then combine their partial
  results in shared memory by a tree of halvings.

Barriers are spelled through macros so that one source runs on a GPU and, for the numbers check without one, on the
CPU (runtime_c/aot_gpu_shim.h): the kernel body is a sequence of phases, AOT_PHASE_BEGIN(threads) ... AOT_PHASE_END,
separated by AOT_BARRIER. On a GPU a phase is a plain block and the barrier is __syncthreads(); in the shim each thread
of a block is a coroutine that stops at every AOT_BARRIER, run in a forward, reverse or seeded shuffled order
(AOT_GPU_SHIM_ORDER), so a missing barrier lets a thread run ahead as on a GPU and changes the numbers. Only shared
memory and block-uniform values (computed from the block id alone, outside every phase) cross phases.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from aot.codegen.render.c import CRenderer, abs_with, fma_with
from aot.codegen.render.linearize import kernel_params, linearize, takes_runtime_size
from aot.core.dtype import DType, dtypes
from aot.core.ir import LIBM, Ops, UOp, prod
from aot.errors import CompileError

# threads per block for per-thread kernels: a multiple of both warp (32) and wavefront (64) sizes, and small enough
# that a block's registers fit on every GPU we target
BLOCK_THREADS = 256
# threads per block of a cooperative reduction: a power of two (the tree halves it), one partial result each
COOP_THREADS = 256
# a cooperative block pays for log2(COOP_THREADS) barriers; it wins when each output reduces over at least this
# many elements (a 1000-class classifier over a 4096-wide feature vector: yes; a 3x3 conv window: no)
COOP_MIN_REDUCE = 1024
# with more outputs than this, one thread per output already fills the GPU (a few thousand resident threads)
COOP_MAX_OUTPUTS = 8192


@dataclass(frozen=True)
class Launch:
  grid: int  # blocks
  block: int  # threads per block
  cooperative: bool  # one block per output, reductions split across the block
  outputs: int  # output elements (the flattened output loops)
  sized: bool = False  # takes the run's size of a dim run to a size given at run time (its last argument)


def _top_level_reductions(ast: UOp) -> list[int]:
  """Sizes (elements reduced per output) of the reductions not nested in another reduction."""
  sizes, inner = [], 0
  for kind, u in linearize(ast):
    if kind == "loop" and u.kind == "reduce":
      inner += 1
    elif kind == "end" and u.kind == "reduce":
      inner -= 1
    elif kind == "acc_init" and inner == 0:
      sizes.append(prod(r.size for r in u.src[1:]))
  return sizes


def plan_launch(ast: UOp) -> Launch:
  outputs = prod(r.size for r in ast.toposort() if r.op is Ops.RANGE and r.kind != "reduce")
  reductions = _top_level_reductions(ast)
  sized = takes_runtime_size(ast)
  if reductions and max(reductions) >= COOP_MIN_REDUCE and outputs <= COOP_MAX_OUTPUTS:
    return Launch(outputs, COOP_THREADS, True, outputs, sized)
  return Launch(max(1, math.ceil(outputs / BLOCK_THREADS)), BLOCK_THREADS, False, outputs, sized)


def _unflatten(flat: str, ranges: list[UOp]) -> dict[UOp, str]:
  """Each loop variable of a perfectly nested loop chain, from the flat index over the chain (row-major)."""
  out, stride = {}, prod(r.size for r in ranges)
  for i, r in enumerate(ranges):
    stride //= r.size
    e = flat if stride == 1 else f"({flat} / {stride})"
    out[r] = e if i == 0 else f"({e} % {r.size})"
  return out


class GPURenderer(CRenderer):
  """The shared GPU renderer; targets set the table entries below."""

  target = ""
  kernel_prefix = 'extern "C" __global__ void'
  restrict = "__restrict__"
  buffer_space = ""  # address-space qualifier of a kernel's buffer parameters
  shared_space = "__shared__"  # ... of a block's shared memory
  block_id = "blockIdx.x"
  thread_id = "threadIdx.x"
  extra_params: tuple = ()  # thread-position parameters (Metal passes them as arguments)
  type_names: dict = {}  # C type names this target spells differently
  prelude = ""

  def param_decls(self, ast: UOp) -> list[str]:
    # n_size: the size of a dim that runs to a size given at run time (aot/scheduler/runtime_extent.py), passed as
    # the launch's pointer-wide arguments are
    sized = ["unsigned long long n_size"] if takes_runtime_size(ast) else []
    return [self.buffer_param(p.slot, p.dtype) for p in kernel_params(ast)] + sized + list(self.extra_params)

  def buffer_param(self, slot: int, dt: DType) -> str:
    return f"{'' if slot == 0 else 'const '}{self.buffer_space}{dt.cname} *{self.restrict} d{slot}"

  def render_kernel(self, name: str, ast: UOp) -> str:
    outer = sorted((u for u in ast.toposort() if u.op is Ops.RANGE and u.kind != "reduce"), key=lambda r: r.number)
    body = _Body(self, plan_launch(ast), linearize(ast), _unflatten("gid", outer))
    body.begin()
    for i, (kind, u) in enumerate(body.instrs):
      body.step(i, kind, u)
    body.finish()
    head = [f"{self.kernel_prefix} {name}({', '.join(self.param_decls(ast))}) {{"]
    # (block-uniform: it may cross phases)
    head += ["  const int n_ = (int)n_size;"] if body.launch.sized else []
    decls = [f"  {self.shared_space} {a.dtype.cname} {p}[{body.launch.block}];" for a, p in body.part.items()]
    text = "\n".join(head + decls + body.lines + ["}"])
    if not self.type_names:
      return text
    return re.sub(r"\b(" + "|".join(self.type_names) + r")\b", lambda m: self.type_names[m.group(0)], text)

  def render_source(self, functions: dict[UOp, str]) -> str:
    return self.prelude + "\n" + "\n\n".join(self.render_kernel(fn, ast) for ast, fn in functions.items()) + "\n"


@dataclass
class _Body:
  """One GPU kernel's body as it is written: the lines at their nesting depth, each value's name, and the
  cooperative reduction in flight (module docstring)."""

  rd: GPURenderer
  launch: Launch
  instrs: list
  out_index: dict[UOp, str]  # output loop -> its index, from the flat output index `gid`
  names: dict[UOp, str] = field(default_factory=dict)
  lines: list[str] = field(default_factory=list)
  depth: int = 1
  flat: dict[UOp, str] = field(default_factory=dict)  # reduce loops folded into a cooperative strided loop -> index
  coop: list[UOp] | None = None  # the accumulators of the cooperative reduction being rendered
  part: dict[UOp, str] = field(default_factory=dict)  # accumulator -> its shared array of partial results
  reduce_depth: int = 0

  def emit(self, s: str):
    self.lines.append("  " * self.depth + s)

  def open(self, s: str):
    self.emit(s)
    self.depth += 1

  def close(self, s: str = "}"):
    self.depth -= 1
    self.emit(s)

  def r(self, u: UOp) -> str:
    return self.rd.literal(u.dtype, u.arg) if u.op is Ops.CONST else self.names[u]

  def begin(self):
    """The output index: a cooperative block's is its block id; a thread's, its place in the grid, guarded. The grid
    covers a run-time sized output loop to its bound: the threads (or blocks) past the run's size n_ do nothing."""
    rd, launch = self.rd, self.launch
    within = "".join(f" && {self.out_index[r]} < n_" for r in self.out_index if r.runtime)
    if launch.cooperative:
      self.emit(f"const int gid = (int){rd.block_id};")
      if within:
        self.emit(f"if (!(1{within})) return;")
      return
    self.open(f"AOT_PHASE_BEGIN({launch.block})")
    self.emit(f"const int gid = (int)({rd.block_id} * {launch.block}u + {rd.thread_id});")
    self.open(f"if (gid < {launch.outputs}{within}) {{")

  def finish(self):
    if not self.launch.cooperative:
      self.close()
      self.close("AOT_PHASE_END")

  def step(self, i: int, kind: str, u: UOp):
    """One instruction of linearize's."""
    rd = self.rd
    if kind == "loop" and u.kind != "reduce":
      self.names[u] = f"r{u.number}"
      self.emit(f"const int {self.names[u]} = {self.out_index[u]};")
    elif kind == "end" and u.kind != "reduce":
      pass  # an output loop is one index, not a loop
    elif kind == "loop":
      self.reduce_loop(i, u)
    elif kind == "end":
      self.reduce_end(u)
    elif kind == "acc_init":
      self.names[u] = f"acc{len(self.names)}"
      # a cooperative accumulator is declared inside its phase (at its first loop)
      if not (self.launch.cooperative and self.reduce_depth == 0):
        self.emit(f"{u.dtype.cname} {self.names[u]} = {rd.identity(u.reduce_op, u.dtype)};")
    elif kind == "acc_update":
      self.emit(rd.accumulate(u.reduce_op, u.dtype, self.names[u], self.r(u.src[0])))
    elif kind == "store":
      # in a cooperative kernel every thread of the block stores the same (block-uniform) value: harmless
      self.emit(f"d{u.src[0].slot}[{self.r(u.src[1])}] = {self.r(u.src[2])};")
    else:
      self.names[u] = f"v{len(self.names)}"
      self.emit(f"const {u.dtype.cname} {self.names[u]} = {rd.render_value(u, self.r)};")

  def reduce_loop(self, i: int, u: UOp):
    self.reduce_depth += 1
    self.names[u] = f"r{u.number}"
    if self.reduce_depth == 1 and self.launch.cooperative:
      # a top-level reduction: the block's threads take strided turns over its loops, flattened into one
      coop = self.coop = [a for k, a in self.instrs[:i] if k == "acc_init" and a.src[1] is u]
      self.part.update((a, f"part{len(self.part) + n}") for n, a in enumerate(coop))
      ranges, fv = list(coop[0].src[1:]), f"f{u.number}"
      self.flat.update(_unflatten(fv, ranges))
      self.open(f"AOT_PHASE_BEGIN({self.launch.block})")
      for a in coop:
        self.emit(f"{a.dtype.cname} {self.names[a]} = {self.rd.identity(a.reduce_op, a.dtype)};")
      trips = prod(x.size for x in ranges)
      self.open(f"for (int {fv} = (int){self.rd.thread_id}; {fv} < {trips}; {fv} += {self.launch.block}) {{")
    if u in self.flat:
      self.emit(f"const int {self.names[u]} = {self.flat[u]};")
      # (a run-time sized loop flattened at its bound: the turns past the run's size add nothing)
      if u.runtime:
        self.emit(f"if ({self.names[u]} >= n_) continue;")
    else:
      hi = "n_" if u.runtime else u.size
      self.open(f"for (int {self.names[u]} = 0; {self.names[u]} < {hi}; {self.names[u]}++) {{")

  def reduce_end(self, u: UOp):
    self.reduce_depth -= 1
    if u not in self.flat:
      self.close()
    elif self.coop is not None and u is self.coop[0].src[1]:
      self.close()
      self.depth -= 1
      self.combine()

  def combine(self):
    """End a cooperative reduction's phase: publish each thread's partial result, halve the block until one is left,
    and read it back as a block-uniform value."""
    rd, accs, part, threads = self.rd, self.coop, self.part, self.launch.block
    t = rd.thread_id
    out = [f"  {part[a]}[{t}] = {self.names[a]};" for a in accs]
    out += [
      "AOT_PHASE_END",
      "AOT_BARRIER;",
      f"for (int s = {threads // 2}; s > 0; s >>= 1) {{",
      f"  AOT_PHASE_BEGIN({threads})",
    ]
    for a in accs:
      p = part[a]
      fold = rd.accumulate(a.reduce_op, a.dtype, f"{p}[{t}]", f"{p}[{t} + s]")
      out.append(f"  if ({t} < (unsigned)s) {{ {fold} }}")
    out += ["  AOT_PHASE_END", "  AOT_BARRIER;", "}"]
    for a in accs:
      self.names[a] = f"{self.names[a]}_total"
      out.append(f"const {a.dtype.cname} {self.names[a]} = {part[a]}[0];")
    self.lines += ["  " * self.depth + l for l in out]
    self.coop = None


# *** the targets: tables over GPURenderer ***

_CUDA_PRELUDE = """#include <math.h>
#include <stdint.h>
#ifndef AOT_GPU_SHIM_H
#include <cuda_fp16.h>
#endif
/* phases and barriers (codegen/render/gpu.py); the CPU shim (aot_gpu_shim.h) defines them first to run the grid as \
loops */
#ifndef AOT_PHASE_BEGIN
#define AOT_PHASE_BEGIN(threads) {
#define AOT_PHASE_END }
#define AOT_BARRIER __syncthreads()
#endif
"""


class CUDARenderer(GPURenderer):
  target = "cuda"
  # nvcc parses _Float16 but cannot generate code for it
  type_names = {"_Float16": "__half"}
  prelude = _CUDA_PRELUDE
  code_for_op = {**CRenderer.code_for_op, Ops.FMA: fma_with("fma", "fmaf")}


# libm functions the AMDGPU backend lowers itself (LLVM intrinsics); the rest come from aot_hip_math.h, since device
# code here is built without ROCm's device libraries (-nogpulib)
_AMDGPU_NATIVE = {"exp", "log", "sqrt", "sin", "cos", "floor", "ceil", "rint", "trunc", "fabs"}

# ... and in double precision (the others would need ROCm's device libraries)
_AMDGPU_NATIVE_F64 = {"sqrt", "floor", "ceil", "rint", "trunc", "fabs"}


def _no_hip_f64(what: str):
  raise CompileError(
    f"target hip: float64 {what} needs ROCm's device libraries, which hip builds here do not use "
    "(float32 works; or use target c/llvm)"
  )


def _hip_fn(name: str):
  spell = f"__builtin_{name}" if name in _AMDGPU_NATIVE else f"aot_{name}"

  def render(dt: DType, a: str) -> str:
    if dt == dtypes.float64:
      return f"__builtin_{name}({a})" if name in _AMDGPU_NATIVE_F64 else _no_hip_f64(name)
    if dt == dtypes.float32:
      return f"{spell}f({a})"
    return f"(({dt.cname}){spell}f((float)({a})))"

  return render


_HIP_PRELUDE = """#include <stdint.h>
#define INFINITY __builtin_inff()
#define NAN __builtin_nanf("")
#ifndef AOT_GPU_SHIM_H
/* HIP device code built without ROCm headers: the few keywords they would define, as clang's attributes */
#define __global__ __attribute__((global))
#define __shared__ __attribute__((shared))
#define AOT_PHASE_BEGIN(threads) {
#define AOT_PHASE_END }
/* __syncthreads(): workgroup barrier with the fences that make shared-memory writes visible across it */
#define AOT_BARRIER do { __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup"); __builtin_amdgcn_s_barrier(); \\
                         __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup"); } while (0)
#endif
#include "aot_hip_math.h"
"""


class HIPRenderer(GPURenderer):
  target = "hip"
  block_id = "__builtin_amdgcn_workgroup_id_x()"
  thread_id = "__builtin_amdgcn_workitem_id_x()"
  prelude = _HIP_PRELUDE
  code_for_op = {
    **CRenderer.code_for_op,
    **{op: _hip_fn(n) for op, n in LIBM.items()},
    Ops.ABS: abs_with(_hip_fn("fabs")),
    Ops.MOD: lambda dt, a, b: (
      f"__builtin_fmod{'' if dt == dtypes.float64 else 'f'}({a}, {b})" if dt.is_float else f"({a}%{b})"
    ),
    Ops.POW: lambda dt, a, b: _no_hip_f64("pow") if dt == dtypes.float64 else f"(({dt.cname})__builtin_powf({a}, {b}))",
    # the AMDGPU backend has fused multiply-adds in both precisions (llvm.fma)
    Ops.FMA: fma_with("__builtin_fma", "__builtin_fmaf"),
  }


def _metal_fn(name: str):
  # Metal's math is overloaded by type (no f suffix); it has no erf, which aot_erf in the prelude provides
  spell = "aot_erf" if name == "erf" else f"metal::precise::{name}"
  return lambda dt, a: f"{spell}({a})" if dt == dtypes.float32 else f"(({dt.cname}){spell}((float)({a})))"


_METAL_PRELUDE = """#include <metal_stdlib>
using namespace metal;
#define AOT_PHASE_BEGIN(threads) {
#define AOT_PHASE_END }
#define AOT_BARRIER threadgroup_barrier(mem_flags::mem_threadgroup)
/* erf: Metal has none; Abramowitz & Stegun 7.1.28 (absolute error below 3e-7) */
inline float aot_erf(float x) {
  float a = metal::precise::fabs(x);
  float t = 1.0f + a * (0.0705230784f + a * (0.0422820123f + a * (0.0092705272f + a * (0.0001520143f + a * \
(0.0002765672f
            + a * 0.0000430638f)))));
  t = t * t; t = t * t; t = t * t; t = t * t;
  return metal::copysign(1.0f - 1.0f / t, x);
}
"""


class MetalRenderer(GPURenderer):
  target = "metal"
  kernel_prefix = "kernel void"
  restrict = ""
  buffer_space = "device "
  shared_space = "threadgroup"
  block_id = "aot_block.x"
  thread_id = "aot_thread.x"
  extra_params = (
    "uint3 aot_block [[threadgroup_position_in_grid]]",
    "uint3 aot_thread [[thread_position_in_threadgroup]]",
  )
  prelude = _METAL_PRELUDE
  code_for_op = {
    **CRenderer.code_for_op,
    **{op: _metal_fn(n) for op, n in LIBM.items()},
    Ops.ABS: abs_with(lambda dt, a: f"metal::precise::fabs({a})"),
    Ops.MOD: lambda dt, a, b: f"metal::precise::fmod({a}, {b})" if dt.is_float else f"({a}%{b})",
    Ops.POW: lambda dt, a, b: f"(({dt.cname})metal::precise::pow({a}, {b}))",
    # Metal's fma is overloaded for float and half and rounds once (it has no double to widen a half into)
    Ops.FMA: lambda dt, a, b, c: f"metal::fma({a}, {b}, {c})",
  }

  # Metal has no <stdint.h> names or _Float16
  type_names = {
    "int8_t": "char",
    "uint8_t": "uchar",
    "int16_t": "short",
    "uint16_t": "ushort",
    "int32_t": "int",
    "uint32_t": "uint",
    "int64_t": "long",
    "uint64_t": "ulong",
    "_Float16": "half",
  }

  def buffer_param(self, slot: int, dt: DType) -> str:
    return f"{'' if slot == 0 else 'const '}device {dt.cname} *d{slot} [[buffer({slot})]]"

  def render_kernel(self, name: str, ast: UOp) -> str:
    if any(u.dtype == dtypes.float64 for u in ast.toposort()):
      raise CompileError("target metal: Metal has no float64 (double); cast the model to float32 or use target c/llvm")
    return super().render_kernel(name, ast)

  def literal(self, dt: DType, v) -> str:
    # decimal, not C's hex floats (MSL is C++14): the shortest repr of a float32 value reads back as that value
    if dt in (dtypes.float32, dtypes.float16) and not (math.isnan(v) or math.isinf(v)):
      s = f"{float(v)!r}f"
      if dt == dtypes.float16:
        return f"((_Float16){s})"
      return f"({s})" if s.startswith("-") else s
    return super().literal(dt, v)

  def render_value(self, u: UOp, r) -> str:
    if u.op is Ops.BITCAST:
      return f"as_type<{u.dtype.cname}>({r(u.src[0])})"
    return super().render_value(u, r)


RENDERERS = {"cuda": CUDARenderer, "hip": HIPRenderer, "metal": MetalRenderer}
# the targets this file renders, in the order every list of them is shown
GPU_TARGETS = tuple(RENDERERS)
# per target: the kernel source, the device code built from it (what libNAME.so embeds), the host glue (the API's
# implementation of runtime_c/aot_gpu.h: which GPU runtime it loads)
KERNEL_SOURCE = {"cuda": "kernels.cu", "hip": "kernels.hip", "metal": "kernels.metal"}
DEVICE_IMAGE = {"cuda": "kernels.fatbin", "hip": "kernels.hipfb", "metal": "kernels.metal"}
HOST_GLUE = {"cuda": "aot_cuda.c", "hip": "aot_hip.c", "metal": "aot_metal.m"}
