"""The driver: trace -> schedule -> memory plan -> render -> build -> artifact."""

from __future__ import annotations

import importlib.resources
import inspect
import os
import re
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from aot.artifact import (
  WEIGHTS_INLINE_MAX,
  Artifact,
  ExternalWeights,
  KernelInfo,
  WeightsWriter,
  c_name,
  install,
  make_stage,
  place_sources,
  weights_checksum,
  write_manifest,
)
from aot.build import build_gpu_library, build_library, check_metal_syntax, gpu_manifest, included_headers
from aot.codegen.lower.contract import fuse_epilogues, gemm_tile, lower_contractions, split_by_slices
from aot.codegen.lower.direct import DepthwiseCall, lower_depthwise
from aot.codegen.lower.qpool import lower_qpool
from aot.codegen.lower.quant import lower_qgemm, narrow_int8_producers
from aot.codegen.render.c import KERNEL_PRELUDE, CRenderer
from aot.codegen.render.gpu import GPU_TARGETS, HOST_GLUE, KERNEL_SOURCE, Launch, plan_launch
from aot.codegen.render.gpu import RENDERERS as GPU_RENDERERS
from aot.codegen.render.host_cpu import GemmCall, render_header, render_model_c, render_weights_asm
from aot.codegen.render.host_gpu import render_emulated_host, render_gpu_host
from aot.codegen.render.linearize import flop_count, kernel_params, parallel_extent
from aot.codegen.render.opt import optimize
from aot.core.dtype import dtypes, to_dtype
from aot.core.ir import Ops, UOp, release_mapped_pages
from aot.core.symbolic import linear
from aot.errors import BUG_REPORT, AotError, InternalError, InvalidTypeError, InvalidValueError, places_of, working_on
from aot.frontends.tensor import Tensor
from aot.scheduler.kernel import Buffer, Kernel, Schedule, Traced
from aot.scheduler.memory import align_up, memory_plan
from aot.scheduler.schedule import schedule, without_checks
from aot.tools.profile import CALLS_FILE, calls_json, describe_calls

# the CPU targets, then the GPU ones (rendered by codegen/render/gpu.py, their host code by codegen/render/host_gpu.py)
TARGETS = ("c", "llvm", *GPU_TARGETS)
# kernels doing less work than this (flops + elements written) run on the calling thread: waking the pool costs more
PARALLEL_MIN_WORK = 1 << 16
# a model doing fewer flops than this runs whole on the calling thread: the pool's threads rest between runs, and
# the first wake-up of a run costs more than splitting gains (the 3-layer mlp: 2 threads were 0.74x as fast as 1)
MODEL_PARALLEL_MIN_WORK = 1 << 25
# the runtime's C files of a CPU artifact (the pool and errors; the microkernel, the depthwise kernel, the int8
# microkernel, the 8-bit pool and im2col), each with the entry points the generated code calls it by: a file is built
# and linked only where a kernel calls it, since a model with no contraction need not wait for the int8 microkernel
# to compile (6.5 s of gcc -O2), nor carry it. The headers each includes are written with it (runtime_files)
RUNTIME_SOURCES = {
  "aot_runtime.c": (),
  "aot_gemm.c": ("aot_gemm_run", "aot_gemm_tasks"),
  "aot_direct.c": ("aot_depthwise_run", "aot_depthwise_band_rows"),
  "aot_qgemm.c": ("aot_qgemm_run", "aot_qgemm_tasks", "aot_qgemm_reads_plane"),
  "aot_qpool.c": ("aot_qpool_run",),
  "aot_qim2col.c": ("aot_qim2col_run",),
}
# the header model.c includes: it includes in turn the core and each operation's header that src/ holds, so that a
# model's objects (keyed by the headers their sources include) do not change with the runtime parts it does not call
RUNTIME_HEADERS = ("aot_runtime.h",)
# kernels per generated C file: small enough that the files compile in parallel, big enough to amortise the headers
KERNELS_PER_FILE = 16


def _input_specs(example_inputs) -> list[tuple[tuple, object]]:
  specs = []
  for i, x in enumerate(example_inputs):
    if isinstance(x, np.ndarray) or np.isscalar(x):
      x = np.asarray(x)
      specs.append((x.shape, to_dtype(x.dtype)))
    elif isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], (tuple, list)):
      specs.append((tuple(x[0]), to_dtype(x[1])))
    else:
      raise InvalidTypeError(f"example input {i}: expected a numpy array or (shape, dtype), got {type(x).__name__}")
  return specs


def trace(fn: Callable, example_inputs: Sequence, name: str | None = None) -> Traced:
  """Run a Tensor program once on named input placeholders; its outputs are the graph."""
  specs = _input_specs(example_inputs)
  try:
    params = list(inspect.signature(fn).parameters.values())
  except (TypeError, ValueError):
    params = []
  positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
  varargs = any(p.kind is p.VAR_POSITIONAL for p in params)
  if params and not varargs and len(positional) < len(specs):
    raise InvalidTypeError(
      f"{getattr(fn, '__name__', fn)} takes {len(positional)} inputs, {len(specs)} example inputs given"
    )
  names = [positional[i] if i < len(positional) else f"input{i}" for i in range(len(specs))]
  inputs = [Tensor.input(n, shape, dt) for n, (shape, dt) in zip(names, specs)]
  out = fn(*inputs)
  outs = [out] if isinstance(out, Tensor) else list(out)
  if not outs or not all(isinstance(o, Tensor) for o in outs):
    raise InvalidTypeError(f"{getattr(fn, '__name__', fn)} must return a Tensor or a tuple of Tensors")
  return Traced(c_name(name or getattr(fn, "__name__", "model")), [o.uop for o in outs], [t.uop for t in inputs])


def resolve(what, example_inputs=None, name: str | None = None, shapes=None, bind=None) -> Traced:
  """Anything compile_model accepts, traced: a Tensor program with example inputs, "models:NAME", an ONNX file or
  an onnx.ModelProto."""
  if _is_onnx(what):
    from aot.frontends.onnx import trace_onnx

    return trace_onnx(what, shapes, bind, name)
  if isinstance(what, str) and what.startswith("models:"):
    from aot.models import get

    model = get(what.split(":", 1)[1])
    return trace(model.forward, [(shape, dt) for _, shape, dt in model.inputs], name or model.name)
  if callable(what):
    if example_inputs is None:
      raise InvalidTypeError("compile_model(fn, example_inputs): example_inputs are needed to trace fn")
    return trace(what, example_inputs, name)
  raise InvalidTypeError(f"cannot compile {what!r}: expected a Tensor program or 'models:NAME'")


def _is_onnx(what) -> bool:
  if isinstance(what, (str, Path)) and str(what).endswith(".onnx"):
    return True
  return type(what).__name__ == "ModelProto"


def render_kernels(target: str, functions: dict[UOp, str], places: dict[str, str] | None = None) -> dict[str, str]:
  """The kernel source files: C files of KERNELS_PER_FILE kernels each (compiled in parallel), or one LLVM module.
  places: where each function comes from, by name (function_places), for the error a bug rendering it becomes."""
  items = list(functions.items())
  places = places or {}
  if target == "llvm":
    from llvmlite import ir

    from aot.codegen.render.llvm import LLVMRenderer, module_text

    module = ir.Module(name="kernels")
    llr = LLVMRenderer(module)
    for ast, fn in items:
      with working_on(places.get(fn, f"in function {fn}")):
        llr.render_kernel(fn, ast)
    return {"kernels.ll": module_text(module)}
  renderer = CRenderer()
  texts = []
  for ast, fn in items:
    with working_on(places.get(fn, f"in function {fn}")):
      texts.append(renderer.render_kernel(fn, ast))
  return {
    f"kernels{i // KERNELS_PER_FILE}.c": KERNEL_PRELUDE + "\n" + "\n\n".join(texts[i : i + KERNELS_PER_FILE]) + "\n"
    for i in range(0, len(texts), KERNELS_PER_FILE)
  }


@dataclass
class Sources:
  """What render makes of a schedule for one target: the artifact's source files, its kernel list, the arena's size
  and what it holds (bytes of every buffer placed in it: the size it would have without reuse), the weights (written
  by the WeightsWriter given as they are made: its size, and checksum when external; laid out only when none is given)
  and, on a GPU target, each kernel's launch (function, buffers, codegen.gpu.Launch); empty on the CPU targets."""

  files: dict[str, str]
  kernels: list[KernelInfo]
  arena: int
  arena_holds: int
  weights: WeightsWriter
  launches: list[tuple[str, list[Buffer], Launch]] = field(default_factory=list)


def render(
  name: str,
  sched: Schedule,
  target: str = "c",
  cpu: str = "native",
  triple: str | None = None,
  profile: bool = False,
  emulate: bool = False,
  weights: WeightsWriter | None = None,
) -> Sources:
  """The sources of an artifact for any target. cpu, triple: what a CPU target's kernels are tuned for (the gemm
  tile); profile: time each call (aot/tools/profile.py, CPU targets); emulate: a CUDA or HIP build run on the CPU."""
  weights = weights or WeightsWriter(None)
  if target in GPU_TARGETS or emulate:
    return _render_gpu(name, sched, target, emulate, weights)
  return _render_cpu(name, sched, target, cpu, triple, profile, weights)


def function_name(name: str, i: int) -> str:
  """The C function of the schedule's kernel i (named ki_...): NAME_fi."""
  return f"{name}_f{i}"


def kernel_place(k: Kernel) -> str:
  """A kernel, for the InternalError a bug compiling it becomes (working_on): its name, and the model output it
  writes if it writes one."""
  return f"in kernel {k.name}" + (f" (writing output '{k.out.name}')" if k.out.kind == "output" else "")


def function_places(name: str, sched: Schedule, functions: Sequence[str]) -> dict[str, str]:
  """Each generated function's place (working_on): the function, and the kernel whose work it does (its name starts
  with function_name(name, i) of kernel i: NAME_f3, NAME_f3_slice1, NAME_f3_dense0a)."""
  places = {}
  for fn in functions:
    m = re.match(re.escape(name) + r"_f(\d+)", fn)
    k = sched.kernels[int(m.group(1))] if m and int(m.group(1)) < len(sched.kernels) else None
    places[fn] = f"in function {fn}" + (f" of kernel {kernel_place(k).removeprefix('in kernel ')}" if k else "")
  return places


def _finish_weights(weights: WeightsWriter) -> ExternalWeights | None:
  """Close the weights file; above WEIGHTS_INLINE_MAX it is NAME.weights beside the library, checked at create."""
  weights.close()
  external = (
    ExternalWeights(weights.size, weights_checksum(weights.path) if weights.path else 0)
    if weights.size > WEIGHTS_INLINE_MAX
    else None
  )
  weights.checksum = external.checksum if external else None
  return external


def _render_gpu(name: str, sched: Schedule, target: str, emulate: bool, weights: WeightsWriter) -> Sources:
  """The schedule's kernels one launch each (codegen/render/gpu.py), over the constants as they are."""
  if emulate and target not in ("cuda", "hip"):
    raise InvalidValueError("emulate=True runs the CUDA or HIP kernel source on the CPU: target must be cuda or hip")
  if target not in GPU_TARGETS:
    raise InvalidValueError(f"unknown GPU target {target!r}; available: {', '.join(GPU_TARGETS)}")
  # the GPU hosts do not read index checks back yet: a bad index is clamped there, not reported
  sched = without_checks(sched)
  arena = memory_plan(sched.kernels, sched.scratch)
  # the model's constants into the weights file one at a time (a mapped weight's pages released after)
  for b in sched.consts:
    weights.add(b)
    release_mapped_pages(b.data)
  external = _finish_weights(weights)
  functions: dict[UOp, str] = {}
  # kernels that do the same work on different buffers share one function
  for i, k in enumerate(sched.kernels):
    functions.setdefault(k.ast, function_name(name, i))
  places = function_places(name, sched, list(functions.values()))
  launch = {}
  for ast, fn in functions.items():
    with working_on(places[fn]):
      launch[ast] = plan_launch(ast)
  files = {KERNEL_SOURCE[target]: GPU_RENDERERS[target]().render_source(functions)}
  infos = [KernelInfo(k.name, functions[k.ast], k.shape) for k in sched.kernels]
  launches = [(functions[k.ast], k.bufs, launch[k.ast]) for k in sched.kernels]
  if emulate:
    files |= render_emulated_host(name, sched, arena, functions, launch, target, external)
  else:
    files |= render_gpu_host(name, sched, arena, launches, list(functions.values()), target, external, weights.size)
  return Sources(files, infos, arena, sum(align_up(b.nbytes) for b in sched.scratch), weights, launches)


@dataclass
class _Lowered:
  """The schedule's kernels lowered to calls (_lower_kernels): kernels[i] over its new buffers, plans[i] its generated
  functions (epilogues per slice, and its contractions), directs[i] its depthwise calls, qgemms its int8 calls by
  kernel name; the scratch buffers the lowering made, and the ids of the packed constants already written and of the
  schedule's scratch buffers it replaced (narrowed to 8 bits)."""

  kernels: list[Kernel]
  plans: list
  directs: list
  qgemms: dict
  scratch_made: list[Buffer]
  packed: set[int]
  replaced: set[int]


def _lower_kernels(sched: Schedule, tile, weights: WeightsWriter) -> _Lowered:
  scratch_made: list[Buffer] = []
  packed: set[int] = set()

  def make_buffer(kind: str, x) -> Buffer:
    if kind == "scratch":
      scratch_made.append(b := Buffer("scratch", dtypes.float32, x, "contraction"))
      return b
    # a packed copy of a weight goes to the weights file now and is dropped: never all of them in memory at once
    b = Buffer("const", dtypes.float32, x.size, "packed", shape=x.shape, data=x)
    weights.add(b)
    b.data = None
    packed.add(id(b))
    return b

  # contractions become the runtime's microkernel plus an epilogue kernel (codegen/lower/contract.py)
  # depthwise convolutions go to the runtime's direct kernel instead (codegen/lower/direct.py); directs[i] are kernel
  # i's
  kernels, plans, directs = [], [], []
  # int8 contractions go to the runtime's int8 microkernel (codegen/lower/quant.py), after a kernel writing their A;
  # 8-bit values widened to int32 are stored as bytes first
  narrowed, made8, replaced = narrow_int8_producers(sched.kernels)
  scratch_made += made8
  producers, qgemms, qresults = {id(k.bufs[0]): k for k in narrowed}, {}, {}
  for k in narrowed:
    with working_on(kernel_place(k)):
      # and 8-bit max pools to the runtime's pool (codegen/lower/qpool.py)
      if (q := lower_qgemm(k.ast, k.bufs, producers, qresults) or lower_qpool(k.ast, k.bufs)) is not None:
        for b in q[1]:
          if b.kind == "scratch":
            scratch_made.append(b)
          else:
            weights.add(b)
            b.data = None
            packed.add(id(b))
        kernels.append(Kernel(k.name, k.ast, q[0], k.shape))
        # the kernel's own generated function: its epilogue, else A's copy; none for a bare matmul read in place
        own = q[3] or q[2][0].dense
        plans.append(([own] if own is not None else [], []))
        directs.append([])
        qgemms[k.name] = q[2:]
        continue
      direct = lower_depthwise(k.ast, k.bufs, make_buffer)
      last, bufs, gemms = lower_contractions(k.ast, k.bufs, tile, make_buffer) if direct is None else (*direct[:2], [])
      kernels.append(Kernel(k.name, k.ast, bufs, k.shape))
      # a concat's epilogue runs one kernel per branch's slice; a contraction applies its own to its tiles when it can
      pieces = split_by_slices(last, gemms)
      fuse_epilogues(pieces, gemms)
      plans.append((pieces, gemms))
      directs.append(direct[2] if direct is not None else [])
      # what packing read of a memory-mapped weight leaves the process's memory again (it stays in the page cache)
      for b in k.bufs:
        if b.kind == "const":
          release_mapped_pages(b.data)
  return _Lowered(kernels, plans, directs, qgemms, scratch_made, packed, replaced)


def _write_weights(low: _Lowered, weights: WeightsWriter) -> None:
  """The model's constants that the generated functions read, after the packed copies written during lowering."""
  kernels, plans, packed = low.kernels, low.plans, low.packed
  # constants only a prepacked copy reads are left out of the weights
  used = {
    id(k.bufs[u.arg])
    for k, (lasts, gemms) in zip(kernels, plans)
    for ast in [*lasts, *(x for g in gemms for o in (g.a, g.b) for x in (o.dense, o.pack) if x is not None)]
    for u in ast.toposort()
    if u.op is Ops.DEFINE_GLOBAL
  }
  used |= {
    id(k.bufs[o.slot]) for k, (_, gemms) in zip(kernels, plans) for g in gemms for o in (g.a, g.b) if o.pack is None
  }
  # the model's own constants that kernels read follow the packed ones (these were written as they were made)
  consts = [b for k in kernels for b in k.bufs if b.kind == "const" and id(b) in used and id(b) not in packed]
  for b in {id(b): b for b in consts}.values():
    weights.add(b)
    release_mapped_pages(b.data)


def _name_functions(name: str, sched: Schedule, low: _Lowered) -> dict[UOp, str]:
  """The generated functions' names, by their AST: a kernel's own, its slices', its operands' dense copies and packs."""
  functions: dict[UOp, str] = {}
  for n, (k, (lasts, gemms)) in enumerate(zip(sched.kernels, low.plans)):
    # kernels that do the same work on different buffers share one function
    base = function_name(name, n)
    for j, last in enumerate(lasts):
      functions.setdefault(last, base if j == 0 else f"{base}_slice{j}")
    for i, q in enumerate(low.qgemms.get(k.name, ([], None))[0]):
      if q.dense is not None:
        functions.setdefault(q.dense, f"{base}_dense{i}")
      if q.zero is not None:
        functions.setdefault(q.zero, f"{base}_zero{i}")
    for i, g in enumerate(gemms):
      for side, o in zip("ab", (g.a, g.b)):
        if o.dense is not None:
          functions.setdefault(o.dense, f"{base}_dense{i}{side}")
        if o.pack is not None:
          functions.setdefault(o.pack, f"{base}_pack{i}{side}")
  return functions


def _call_list(
  sched: Schedule, low: _Lowered, functions: dict[UOp, str], optimized: dict[UOp, UOp], target: str = "c"
) -> tuple[list, list]:
  """What model.c runs, in order (render_model_c's calls), and (kernel, role, AST) of each call for a profile build."""
  kernels, plans, directs, qgemms = low.kernels, low.plans, low.directs, low.qgemms
  calls: list = []
  notes: list = []  # (kernel, role, AST) of each call, for a profile build
  # integer sums count as work too: a quantized model's are nearly all of it
  threads = sum(flop_count(k.ast, integer=True) for k in sched.kernels) >= MODEL_PARALLEL_MIN_WORK
  for k, (lasts, gemms), ds in zip(kernels, plans, directs):
    with working_on(kernel_place(k)):

      def call(ast: UOp, out: Buffer):
        # a dense operand's kernel writes its slot 0 into the operand's scratch buffer
        ast, extent = optimized[ast], parallel_extent(optimized[ast])
        args = [(u.arg, out if u.arg == 0 else k.bufs[u.arg]) for u in kernel_params(ast)]
        work = flop_count(ast, integer=True) + out.size
        return (functions[ast], args, extent, threads and extent > 1 and work >= PARALLEL_MIN_WORK)

      if k.name in qgemms:
        qs, epilogue = qgemms[k.name]
        for q in qs:
          # a zero point computed at run time first: A's copy and the microkernel read it
          if q.zero is not None:
            calls.append(call(q.zero, k.bufs[q.zero_slot]))
            notes.append((k.name, "operand", optimized[q.zero]))
          if q.dense is not None:
            calls.append(call(q.dense, k.bufs[q.a_slot]))
            notes.append((k.name, "operand", optimized[q.dense]))
          if q.im2col is not None:
            calls.append(q.im2col.call(k.bufs, threads and q.im2col.tasks > 1 and q.M * q.K >= PARALLEL_MIN_WORK))
            notes.append((k.name, "operand", None))
          calls.append(q.call(k.bufs, threads and q.tasks > 1 and q.work >= PARALLEL_MIN_WORK))
          notes.append((k.name, q.role, None))
        if epilogue is not None:
          calls.append(call(epilogue, k.bufs[0]))
          notes.append((k.name, "epilogue", optimized[epilogue]))
        continue
      for g in gemms:
        for o in (g.a, g.b):
          if o.dense is not None:
            calls.append(call(o.dense, k.bufs[o.slot]))
            notes.append((k.name, "operand", optimized[o.dense]))
        work = g.c.B * g.c.a.size * g.c.b.size * g.c.K
        pack = None
        if g.b.pack is not None:
          # B's panels are packed inside the gemm's tasks: the pack kernel is not a call of its own
          ast = optimized[g.b.pack]
          pack = (functions[ast], [(u.arg, None if u.arg == 0 else k.bufs[u.arg]) for u in kernel_params(ast)])
        calls.append(GemmCall(g, k.bufs, threads and g.tasks > 1 and work >= PARALLEL_MIN_WORK, pack, target == "c"))
        notes.append((k.name, "contraction", None))
      if ds:
        # the direct kernel runs its epilogue after each task's planes when their loops agree (no slices: one epilogue)
        (last,) = lasts
        epilogue = None if _copies_in_place(last) else call(last, k.bufs[0])
        for d in ds:
          fused = epilogue is not None and d.fused and epilogue[2] == d.tasks
          calls.append(
            DepthwiseCall(
              d, k.bufs, threads and d.tasks > 1 and d.work >= PARALLEL_MIN_WORK, epilogue[:2] if fused else None
            )
          )
          notes.append((k.name, "depthwise", optimized[last] if fused else None))
          if fused or epilogue is None:
            continue
          calls.append(epilogue)
          notes.append((k.name, "epilogue", optimized[last]))
        continue
      # an epilogue that only reads back what the microkernel wrote in place (a bare matmul or conv), or that the
      # microkernel applied to its tiles (Gemm.steps), is not run
      for last in lasts:
        if not (gemms and (_copies_in_place(last) or any(g.epilogue is last for g in gemms))):
          calls.append(call(last, k.bufs[0]))
          notes.append((k.name, "epilogue" if gemms else "kernel", optimized[last]))
  return calls, notes


def _render_cpu(
  name: str, sched: Schedule, target: str, cpu: str, triple: str | None, profile: bool, weights: WeightsWriter
) -> Sources:
  """Contractions, depthwise and int8 kernels lowered to the runtime's kernels plus generated functions
  (_lower_kernels), the weights laid out (_write_weights), the functions named and rendered, and model.c's call
  list over them (_call_list)."""
  low = _lower_kernels(sched, gemm_tile(cpu, triple), weights)
  scratch = [b for b in sched.scratch if id(b) not in low.replaced] + low.scratch_made
  arena = memory_plan(low.kernels, scratch)
  _write_weights(low, weights)
  external = _finish_weights(weights)
  functions = _name_functions(name, sched, low)
  places = function_places(name, sched, list(functions.values()))
  optimized = {}
  for ast, fn in functions.items():
    with working_on(places[fn]):
      optimized[ast] = optimize(ast)
  functions = {optimized[ast]: fn for ast, fn in functions.items()}
  files = render_kernels(target, functions, places)
  protos = [f"void {fn}({', '.join(CRenderer().param_decls(ast))});" for ast, fn in functions.items()]
  infos = [
    KernelInfo(k.name, functions[optimized[lasts[0]]] if lasts else "aot_qgemm_run", k.shape)
    for k, (lasts, _) in zip(sched.kernels, low.plans)
  ]
  calls, notes = _call_list(sched, low, functions, optimized, target)
  panel_floats = max([g.c.K * g.b.panel[1] for _, gemms in low.plans for g in gemms], default=0)
  model_c = render_model_c(name, sched, calls, protos, external, profile, panel_floats)
  files["model.c"] = "#include <stdint.h>\n#include <stdbool.h>\n" + model_c
  if not external:
    files["model.c"] += render_weights_asm(name)
  files[f"{name}.h"] = render_header(name, sched, arena, len(sched.kernels), target, len(calls) if profile else 0)
  if profile:
    files[CALLS_FILE] = calls_json(describe_calls(calls, notes))
  if list(files) == ["kernels0.c", "model.c", f"{name}.h"]:
    # a small model is one C file: a compiler run per artifact is most of the build time
    files["model.c"] = files.pop("kernels0.c") + "\n" + files["model.c"]
  # dladdr (external weights) needs _GNU_SOURCE before the first system header
  files["model.c"] = "#define _GNU_SOURCE\n" + files["model.c"]
  return Sources(files, infos, arena, sum(align_up(b.nbytes) for b in scratch), weights)


def _copies_in_place(ast: UOp) -> bool:
  """Is the kernel out[i] = out[i]?"""
  if ast.op is not Ops.STORE:
    return False
  buf, idx, value = ast.src
  return (
    value.op is Ops.LOAD
    and value.src[0] is buf
    and value.src[2].op is Ops.CONST
    and value.src[2].arg is True
    and linear(value.src[1]) == linear(idx)
  )


def compile_model(
  what,
  example_inputs=None,
  target: str = "c",
  out_dir=None,
  name: str | None = None,
  cpu: str = "native",
  cache: bool = True,
  progress: Callable[[str], None] | None = None,
  shapes: dict | None = None,
  bind: dict | None = None,
  triple: str | None = None,
  offload_arch: tuple[str, ...] | None = None,
  emulate: bool = False,
  profile: bool = False,
  sanitize: bool | None = None,
) -> Artifact:
  """Compile a Tensor program (with example inputs: numpy arrays or (shape, dtype) pairs), "models:NAME", or an ONNX
  model (a .onnx path or an onnx.ModelProto; `shapes` pins symbolic dims by input or dim name, `bind` pins scalar
  inputs to values) into an artifact folder: libNAME.so, NAME.h, NAME.json and src/. Returns the Artifact.
  target: "c" (kernels in C, built with the system compiler) or "llvm" (kernels as LLVM IR through llvmlite).
  cpu: the CPU to compile for ("native" = this machine); triple: cross-compile for another target triple
  (e.g. "aarch64-linux-gnu"; needs that triple's gcc for the runtime and the link).
  GPU targets "cuda", "hip", "metal" (codegen/render/gpu.py): offload_arch lists the AMD GPUs of a hip build (default
  gfx90a, gfx1100); emulate=True (cuda, hip) builds the kernel source for the CPU instead, to check their numbers.
  profile=True (CPU targets) builds the timed variant aot/tools/profile.py reads.
  sanitize (default: AOT_SANITIZE=1 in the environment) builds the C with AddressSanitizer and UBSan, for a program
  that is itself built with -fsanitize=address,undefined (or runs with the ASan runtime preloaded).
  A bug of ours on the way is an InternalError naming where it happened (bugs_as_internal_errors)."""
  if target not in TARGETS:
    raise InvalidValueError(f"unknown target {target!r}; available: {', '.join(TARGETS)}")
  gpu = target in GPU_TARGETS or emulate
  if profile and gpu:
    raise InvalidValueError(f"profile is for the CPU targets (c, llvm), not {target}{' emulation' if emulate else ''}")
  if gpu and triple:
    raise InvalidValueError(f"--triple is for the CPU targets; target {target} builds device code for the GPU")
  if sanitize is None:
    sanitize = os.environ.get("AOT_SANITIZE", "") not in ("", "0")
  if gpu and sanitize:
    raise InvalidValueError(f"sanitize is for the CPU targets (c, llvm), not {target}")
  t0 = time.perf_counter()
  say = progress or (lambda s: None)
  # a Tensor program is the user's code, run here: what it raises is its own, not a bug of the compiler's
  traced = resolve(what, example_inputs, name, shapes, bind) if callable(what) else None
  with bugs_as_internal_errors():
    if traced is None:
      with working_on("while tracing the model"):
        traced = resolve(what, example_inputs, name, shapes, bind)
    with working_on("while scheduling"):
      sched = schedule(traced.outputs, traced.inputs, traced.output_names)
    sched.formats = traced.formats or {}
    sched.containers = traced.containers or []
    say(f"scheduled {len(sched.kernels)} kernels")
    out, stage = make_stage(traced.name, out_dir)
    try:
      with working_on(f"while rendering the kernels for target {target}"):
        srcs = render(traced.name, sched, target, cpu, triple, profile, emulate, WeightsWriter(stage / "weights.part"))
      if not gpu:
        say(f"rendered {len(srcs.kernels)} kernels")
      with working_on(f"while building lib{traced.name}.so"):
        _build(traced.name, stage, srcs, target, cpu, triple, offload_arch, emulate, cache, sanitize, say)
      with working_on("while writing the artifact"):
        shutil.copyfile(stage / "src" / f"{traced.name}.h", stage / f"{traced.name}.h")
        manifest = gpu_manifest(target, emulate, srcs.launches, offload_arch) if gpu else None
        write_manifest(
          stage / f"{traced.name}.json",
          traced.name,
          target,
          cpu,
          triple,
          sched,
          srcs.kernels,
          srcs.arena,
          srcs.arena_holds,
          srcs.weights.size,
          time.perf_counter() - t0,
          srcs.weights.checksum,
          manifest,
        )
        install(stage, out)
    finally:
      shutil.rmtree(stage, ignore_errors=True)
    return Artifact(out)


@contextmanager
def bugs_as_internal_errors():
  """Where an exception from our own code while compiling becomes an InternalError (compile_model, and the CLI's
  --emit, which runs the same stages): any that is not one of ours raised on purpose (an AotError: the user's
  CompileError, a C compiler's BuildError, the ONNX frontend's InternalError naming its node pass as they are) nor the
  system's (OSError: a folder that cannot be written; MemoryError). It names where the bug happened (working_on): the
  kernel, by its name, its function and the model output it writes if any, and the stage. The IR keeps no link from
  a kernel back to the ONNX nodes fused into it, so past the frontend a kernel is named, not a node."""
  try:
    yield
  except (AotError, OSError, MemoryError):
    raise
  except Exception as e:
    where = " ".join(places_of(e)) or "while compiling"
    lines = str(e).strip().splitlines() or [""]
    why = lines[0] + (" ..." if len(lines) > 1 else "")
    raise InternalError(f"internal compiler error {where}: {type(e).__name__}: {why} {BUG_REPORT}") from e


def _build(name, stage: Path, srcs: Sources, target, cpu, triple, offload_arch, emulate, cache, sanitize, say) -> None:
  """The sources and the runtime's files written to stage/src and built into stage/libNAME.so (a Metal source is
  only checked: it builds on macOS)."""
  place_sources(stage, name, srcs.files, srcs.weights.path)
  src = stage / "src"
  runtime = importlib.resources.files("aot.runtime_c")
  generated = [f for f in srcs.files if f.endswith((".c", ".S", ".ll"))]
  for f in runtime_files(target, emulate, runtime_sources_called(src, generated)):
    (src / f).write_text(runtime.joinpath(f).read_text())
  library = stage / f"lib{name}.so"
  if target == "metal":
    check_metal_syntax(src)
    say(
      "checked the Metal source's syntax (clang, C++ with a metal_stdlib stand-in); build on macOS: src/build_macos.sh"
    )
  elif target in GPU_TARGETS or emulate:
    build_gpu_library(target, src, library, emulate, offload_arch, cpu, cache)
    say(f"built lib{name}.so")
  else:
    sources = generated + runtime_sources_called(src, generated)
    build_library(
      src,
      sources,
      library,
      cpu,
      cache,
      progress=lambda d, n: say(f"compiled {d}/{n} sources"),
      triple=triple,
      sanitize=sanitize,
    )


def runtime_sources_called(src: Path, generated: list[str]) -> list[str]:
  """The runtime's C files that the generated sources in src call (aot_runtime.c always)."""
  text = "".join((src / f).read_text() for f in generated)
  called = set(re.findall(r"\baot_\w+", text))
  return [f for f, entries in RUNTIME_SOURCES.items() if not entries or called.intersection(entries)]


def runtime_files(target: str, emulate: bool = False, called: list[str] | None = None) -> list[str]:
  """The runtime_c files an artifact's src/ holds: what its build compiles and includes. On a CPU target, the runtime
  C files the model calls (called, from runtime_sources_called; None: all of them) with the headers they include."""
  if target not in GPU_TARGETS and not emulate:
    sources = list(RUNTIME_SOURCES) if called is None else called
    runtime = importlib.resources.files("aot.runtime_c")
    headers = {h for s in sources for h in included_headers(runtime, s)}
    return [*sources, *RUNTIME_HEADERS, *sorted(headers - set(RUNTIME_HEADERS))]
  return (
    ["aot_runtime.c", "aot_runtime.h", "aot_core.h"]
    + (["aot_hip_math.h"] if target == "hip" else [])
    + (["aot_gpu_shim.h"] if emulate else ["aot_gpu.h", HOST_GLUE[target]])
  )
