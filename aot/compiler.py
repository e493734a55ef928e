"""The driver: trace -> schedule -> lower -> render -> build -> install, one stage after the other (compile_model)."""

from __future__ import annotations

import importlib.resources
import inspect
import re
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from aot import cache
from aot.artifact import (
  Artifact,
  Built,
  KernelInfo,
  WeightsWriter,
  c_name,
  install,
  make_stage,
  place_sources,
  write_link_files,
  write_manifest,
)
from aot.build import (
  build_gpu_library,
  build_library,
  check_metal_syntax,
  gpu_manifest,
  included_headers,
  prebuild_runtime,
)
from aot.codegen.lower.calls import CALLS_FILE, calls_json
from aot.codegen.lower.contract import gemm_tile
from aot.codegen.lower.stage import RUNTIME_SOURCES, LoweredSchedule, function_name, function_places, lower_schedule
from aot.codegen.render.c import KERNEL_PRELUDE, CRenderer
from aot.codegen.render.cpp_header import render_cpp_header
from aot.codegen.render.gpu import GPU_TARGETS, HOST_GLUE, KERNEL_SOURCE, Launch, plan_launch
from aot.codegen.render.gpu import RENDERERS as GPU_RENDERERS
from aot.codegen.render.host_cpu import render_header, render_model_c, render_weights_asm
from aot.codegen.render.host_gpu import render_emulated_host, render_gpu_host
from aot.codegen.render.run_dims import batch_arena, plan_items, staged_io
from aot.core.dtype import to_dtype
from aot.core.ir import UOp
from aot.cpu import cpu_target
from aot.errors import BUG_REPORT, AotError, CompileError, InternalError, InvalidTypeError, places_of, working_on
from aot.frontends.tensor import Tensor
from aot.frontends.winograd import direct_convolutions
from aot.options import TARGETS, CompileOptions
from aot.scheduler.kernel import Buffer, Schedule, Traced
from aot.scheduler.memory import align_up, memory_plan
from aot.scheduler.runtime_extent import blocks_before, guard_steps, mark_runtime_ranges
from aot.scheduler.schedule import schedule, without_checks

__all__ = ["TARGETS", "CompileOptions", "bugs_as_internal_errors", "compile_model", "render", "resolve", "trace"]

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
    from aot.frontends.batch_dims import trace_batched
    from aot.frontends.onnx import load_checked, trace_onnx

    return trace_batched(load_checked(what), shapes, bind, name, trace_onnx)
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
  """The kernel source files of KERNELS_PER_FILE kernels each, compiled in parallel: C files, or LLVM modules (one
  module of YOLOv8n's 70 kernels was 2.6 s of its 4.6 s compile, on one core).
  places: where each function comes from, by name (function_places), for the error a bug rendering it becomes."""
  items = list(functions.items())
  places = places or {}
  if target == "llvm":
    from llvmlite import ir

    from aot.codegen.render.llvm import LLVMRenderer, module_text

    modules = {}
    for i in range(0, len(items), KERNELS_PER_FILE):
      module = ir.Module(name=f"kernels{i // KERNELS_PER_FILE}")
      llr = LLVMRenderer(module)
      for ast, fn in items[i : i + KERNELS_PER_FILE]:
        with working_on(places.get(fn, f"in function {fn}")):
          llr.render_kernel(fn, ast)
      modules[f"{module.name}.ll"] = module_text(module)
    return modules
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
  options: CompileOptions | None = None,
) -> Sources:
  """The sources of an artifact for any target. cpu, triple: what a CPU target's kernels are tuned for (the gemm
  tile); profile: time each call (aot/tools/profile.py, CPU targets); emulate: a CUDA or HIP build run on the CPU.
  The settings are checked as compile_model's are; options (compile_model's own) stands for all of them."""
  if options is None:
    options = CompileOptions(target=target, cpu=cpu, triple=triple, profile=profile, emulate=emulate, sanitize=False)
  weights = weights or WeightsWriter(None)
  return _render(name, sched, lower(name, sched, options, weights), options, weights)


def lower(name: str, sched: Schedule, opts: CompileOptions, weights: WeightsWriter) -> LoweredSchedule | None:
  """On a CPU target, the schedule's kernels lowered to the runtime's calls and generated functions, the packed
  weights written as they are made (codegen/lower/stage.py); a GPU target runs each kernel as one launch: None."""
  if opts.gpu:
    return None
  return lower_schedule(name, sched, gemm_tile(opts.cpu, opts.triple), weights, opts.target)


def _render(
  name: str, sched: Schedule, low: LoweredSchedule | None, opts: CompileOptions, weights: WeightsWriter
) -> Sources:
  """The artifact's sources: a CPU target's lowered schedule (_render_cpu), a GPU target's launches (_render_gpu)."""
  if low is None:
    return _render_gpu(name, sched, opts.target, opts.emulate, weights)
  return _render_cpu(name, sched, low, opts.target, opts.profile, weights)


def _render_gpu(name: str, sched: Schedule, target: str, emulate: bool, weights: WeightsWriter) -> Sources:
  """The schedule's kernels one launch each (codegen/render/gpu.py), over the constants as they are (the target is
  checked: CompileOptions)."""
  # the GPU hosts do not read index checks back yet: a bad index is clamped there, not reported
  sched = without_checks(sched)
  arena = memory_plan(sched.kernels, sched.scratch)
  if sched.batch:
    # a ranged dim's items run kernel by kernel there: the plan by kernels, at the largest size (run_dims.py)
    arena = batch_arena(sched, arena)
  # the model's constants into the weights file one at a time (a mapped weight's pages released after)
  weights.add_consts(sched.consts)
  external = weights.finish()
  functions: dict[UOp, str] = {}
  # kernels that do the same work on different buffers share one function
  owners = {}
  for i, k in enumerate(sched.kernels):
    owners.setdefault(functions.setdefault(k.ast, function_name(name, i)), k)
  places = function_places(owners)
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


def _render_cpu(
  name: str, sched: Schedule, low: LoweredSchedule, target: str, profile: bool, weights: WeightsWriter
) -> Sources:
  """The lowered schedule's functions rendered, the arena placed, and model.c's calls over them."""
  if sched.batch:
    arena = plan_items(sched, low)
  else:
    arena = memory_plan(low.segments, low.scratch)
    sched.staged, arena = staged_io(sched, arena)
  external = weights.finish()
  files = render_kernels(target, low.functions, low.places)
  protos = [f"void {fn}({', '.join(CRenderer().param_decls(ast))});" for ast, fn in low.functions.items()]
  infos = [KernelInfo(k.name, fn, k.shape) for k, fn in zip(sched.kernels, low.entries)]
  calls = low.calls
  model_c = render_model_c(name, sched, calls, protos, external, profile, low.panel_floats)
  files["model.c"] = "#include <stdint.h>\n#include <stdbool.h>\n" + model_c
  if not external:
    files["model.c"] += render_weights_asm(name)
  files[f"{name}.h"] = render_header(
    name, sched, arena, len(sched.kernels), target, len(calls) if profile else 0, weights_file=external is not None
  )
  if profile:
    files[CALLS_FILE] = calls_json(low.call_infos())
  if list(files) == ["kernels0.c", "model.c", f"{name}.h"]:
    # a small model is one C file: a compiler run per artifact is most of the build time
    files["model.c"] = files.pop("kernels0.c") + "\n" + files["model.c"]
  files[f"{name}.hpp"] = render_cpp_header(name, sched, weights_file=external is not None)
  # dladdr (external weights) needs _GNU_SOURCE before the first system header
  files["model.c"] = "#define _GNU_SOURCE\n" + files["model.c"]
  return Sources(files, infos, arena, sum(align_up(b.nbytes) for b in low.scratch), weights)


def compile_model(what, example_inputs=None, *, options: CompileOptions | None = None, **keywords) -> Artifact:
  """Compile a Tensor program (with example inputs: numpy arrays or (shape, dtype) pairs), "models:NAME", or an ONNX
  model (a .onnx path or an onnx.ModelProto; `shapes` pins symbolic dims by input or dim name, `bind` pins scalar
  inputs to values) into an artifact folder: libNAME.so, NAME.h, NAME.json and src/. Returns the Artifact.
  target: "c" (kernels in C, built with the system compiler) or "llvm" (kernels as LLVM IR through llvmlite).
  cpu: the CPU to compile for ("native" = this machine); triple: cross-compile for another target triple
  (e.g. "aarch64-linux-gnu"; needs that triple's gcc for the runtime and the link).
  GPU targets "cuda", "hip", "metal" (codegen/render/gpu.py): offload_arch lists the AMD GPUs of a hip build (default
  gfx90a, gfx1100); emulate=True (cuda, hip) builds the kernel source for the CPU instead, to check their numbers.
  profile=True (CPU targets) builds the timed variant aot/tools/profile.py reads.
  winograd=False sums every convolution directly: Winograd's F(2x2, 3x3) stores 16 floats per 3x3 filter for 9.
  sanitize (default: AOT_SANITIZE=1 in the environment) builds the C with AddressSanitizer and UBSan, for a program
  that is itself built with -fsanitize=address,undefined (or runs with the ASan runtime preloaded).
  options: the same as a CompileOptions, instead of the keywords (not both).
  A bug of ours on the way is an InternalError naming where it happened (bugs_as_internal_errors)."""
  if options is not None and keywords:
    raise InvalidTypeError(f"compile_model: options or keywords, not both (got options and {', '.join(keywords)})")
  opts = options if options is not None else CompileOptions(**keywords)
  t0 = time.perf_counter()
  _prebuild(opts)
  # a Tensor program is the user's code, run here: what it raises is its own, not a bug of the compiler's
  with direct_convolutions(not opts.winograd):
    traced = resolve(what, example_inputs, opts.name, opts.shapes, opts.bind) if callable(what) else None
  with bugs_as_internal_errors():
    traced = trace_stage(what, example_inputs, opts) if traced is None else traced
    sched = schedule_stage(traced, opts)
    out, stage = make_stage(traced.name, opts.out_dir)
    try:
      weights = WeightsWriter(stage / "weights.part")
      low = lower_stage(traced.name, sched, opts, weights)
      srcs = render_stage(traced.name, sched, low, opts, weights)
      build_stage(traced.name, stage, srcs, opts)
      install_stage(traced.name, sched, srcs, opts, stage, out, time.perf_counter() - t0)
    finally:
      shutil.rmtree(stage, ignore_errors=True)
    return Artifact(out)


def _prebuild(opts: CompileOptions) -> None:
  """A CPU build's runtime objects started in the background (aot/build.py prebuild_runtime); anything in the way
  (no compiler) is left for the build to report."""
  if opts.target in ("c", "llvm") and not opts.emulate:
    try:
      prebuild_runtime(opts.cpu, opts.triple, opts.sanitize, opts.target == "llvm", opts.cache)
    except AotError:
      pass


def trace_stage(what, example_inputs, opts: CompileOptions) -> Traced:
  with working_on("while tracing the model"), direct_convolutions(not opts.winograd):
    traced = resolve(what, example_inputs, opts.name, opts.shapes, opts.bind)
  # a Metal host is built on macOS from its own sources, with no loop over a ranged dim's items yet
  if traced.batch is not None and opts.target == "metal":
    raise CompileError(f"a dim with a range ('{traced.batch.dim.name}') is for the c, llvm, cuda and hip targets")
  # a GPU host passes a run-time size to its kernels and copies an input's first rows: no staging (run_dims.Staged)
  ext = traced.extent
  if ext is not None and opts.target not in ("c", "llvm"):
    # (a GPU kernel's guards compare with the run's size itself: frontends/extent_dims.py's derived sizes are CPU's)
    if len(ext.sizes) > 1 or any(form is not None for _, form in ext.gates):
      raise CompileError(
        f"dim '{ext.dim.name}' reaches convolutions, pools or pads, which take a range on the c and llvm targets, "
        "not on GPUs, in this version"
      )
    tensors = zip(traced.inputs + traced.outputs, ext.inputs + ext.outputs)
    before = any(blocks_before(u.shape, a) > 1 for u, a in tensors)
    if opts.target == "metal" or before:
      raise CompileError(
        f"dim '{ext.dim.name}' is not a batch dim (an op mixes it), and such a dim takes a range on the cuda and hip "
        "targets where no input or output has a dim but 1 before it, on the c and llvm targets where one has, and "
        "not on metal, in this version"
      )
  return traced


def schedule_stage(traced: Traced, opts: CompileOptions) -> Schedule:
  with working_on("while scheduling"):
    sched = schedule(traced.outputs, traced.inputs, traced.output_names)
  sched.formats = traced.formats or {}
  sched.containers = traced.containers or []
  sched.batch, sched.extent = traced.batch, traced.extent
  if sched.extent is not None:
    mark_runtime_ranges(sched)
    guard_steps(sched)
  opts.say(f"scheduled {len(sched.kernels)} kernels")
  return sched


def lower_stage(name: str, sched: Schedule, opts: CompileOptions, weights: WeightsWriter) -> LoweredSchedule | None:
  with working_on(f"while lowering the kernels for target {opts.target}"):
    return lower(name, sched, opts, weights)


def render_stage(
  name: str, sched: Schedule, low: LoweredSchedule | None, opts: CompileOptions, weights: WeightsWriter
) -> Sources:
  with working_on(f"while rendering the kernels for target {opts.target}"):
    srcs = _render(name, sched, low, opts, weights)
  if not opts.gpu:
    opts.say(f"rendered {len(srcs.kernels)} kernels")
  return srcs


def build_stage(name: str, stage: Path, srcs: Sources, opts: CompileOptions) -> None:
  with working_on(f"while building lib{name}.so"):
    _build(name, stage, srcs, opts)


def install_stage(
  name: str, sched: Schedule, srcs: Sources, opts: CompileOptions, stage: Path, out: Path, seconds: float
) -> None:
  """The header beside the library, the manifest (NAME.json) written, and the staged artifact moved into out."""
  with working_on("while writing the artifact"):
    for header in (f"{name}.h", f"{name}.hpp"):
      shutil.copyfile(stage / "src" / header, stage / header)
    if opts.target != "metal":  # a Metal library is built on macOS, from src/
      write_link_files(stage, name, static=not opts.gpu)
    gpu = gpu_manifest(opts.target, opts.emulate, srcs.launches, opts.offload_arch) if opts.gpu else None
    built = Built(
      name,
      opts.target,
      opts.cpu,
      opts.triple,
      srcs.kernels,
      srcs.arena,
      srcs.arena_holds,
      srcs.weights.size,
      srcs.weights.checksum,
      seconds,
      gpu,
      None if opts.gpu else cpu_target(opts.cpu, opts.triple, llvm=opts.target == "llvm"),
    )
    write_manifest(stage / f"{name}.json", sched, built)
    install(stage, out)


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


def _build(name: str, stage: Path, srcs: Sources, opts: CompileOptions) -> None:
  """The sources and the runtime's files written to stage/src and built into stage/libNAME.so (a Metal source is
  only checked: it builds on macOS)."""
  place_sources(stage, name, srcs.files, srcs.weights.path)
  src = stage / "src"
  runtime = importlib.resources.files("aot.runtime_c")
  generated = [f for f in srcs.files if f.endswith((".c", ".S", ".ll"))]
  called = runtime_sources_called(src, generated)
  for f in runtime_files(opts.target, opts.emulate, called):
    (src / f).write_text(runtime.joinpath(f).read_text())
  library = stage / f"lib{name}.so"
  if opts.target == "metal":
    check_metal_syntax(src)
    opts.say(
      "checked the Metal source's syntax (clang, C++ with a metal_stdlib stand-in); build on macOS: src/build_macos.sh"
    )
  elif opts.gpu:
    hit = build_gpu_library(opts.target, src, library, opts.emulate, opts.offload_arch, opts.cpu, opts.cache)
    opts.say(f"built lib{name}.so")
  else:
    hit = build_library(
      src,
      generated + called,
      library,
      opts.cpu,
      opts.cache,
      progress=lambda d, n: opts.say(f"compiled {d}/{n} sources"),
      triple=opts.triple,
      sanitize=opts.sanitize,
    )
  if opts.target != "metal" and opts.cache and not hit:
    cache.trim()


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
    + (["aot_gpu_shim.h", "aot_cpu.c"] if emulate else ["aot_gpu.h", HOST_GLUE[target]])
  )
