"""What model.c runs: one call interface for every way a kernel runs.

A lowering (codegen/lower/stage.py's rule list) turns a kernel into calls: the runtime's microkernel (GemmCall), its
direct depthwise kernel (DepthwiseCall), its int8 GEMM (QGemmCall), its 8-bit pool and im2col (RuntimeCall), or a
generated function's loops (LoopCall). Each call renders its own C statement into model.c, describes itself to the
profiler (CallInfo, written to a profile build's CALLS_FILE) and knows how many tasks it splits into."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import ClassVar

from aot.codegen.render.linearize import (
  flop_count,
  kernel_params,
  parallel_extent,
  runtime_outer,
  takes_runtime_size,
)
from aot.core.ir import Ops, UOp
from aot.core.symbolic import linear
from aot.scheduler.kernel import Buffer, Kernel

# the name of the call list a profile build keeps in its src/ (what each timed call is, in model.c's order)
CALLS_FILE = "profile_calls.json"


@dataclass
class CallInfo:
  kernel: str  # the schedule kernel the call belongs to
  function: str  # the C function it runs (aot_gemm_run for the microkernel)
  role: str  # contraction, operand (a dense copy of one), epilogue (after a contraction), kernel (whole)
  path: str  # microkernel, copy, loop
  flops: int
  bytes: int  # of the distinct buffers it reads and writes
  gemm: list[int] | None = None  # a contraction's batch, M, N, K
  parallel: bool = False  # split across the pool's threads (else it runs whole on the calling thread)
  tasks: int = 1  # the pieces it splits into when parallel (threads share them out)
  task_work: list[int] | None = None  # a contraction's multiply-adds per task, in the order threads take them


def calls_json(infos: list[CallInfo]) -> str:
  return json.dumps([asdict(i) for i in infos], indent=1)


def distinct_bytes(bufs) -> int:
  """The bytes of the distinct buffers among bufs (a call reading one buffer twice moves it once)."""
  return sum(b.nbytes for b in {id(b): b for b in bufs}.values())


@dataclass(kw_only=True)
class Call:
  """One statement of model.c's kernel list. Every call has a role (contraction, operand, epilogue, kernel, ...:
  CallInfo.role), runs split across the pool's threads or whole, and knows the tasks it splits into; its kind says
  how it renders (render) and what the profiler reports (describe)."""

  role: str = ""
  parallel: bool = False

  @property
  def tasks(self) -> int:
    raise NotImplementedError

  def render(self, arg, tramps: dict[str, str]) -> str:
    """model.c's statement; arg(buffer, slot) is a buffer's pointer, tramps the static helpers already written (by
    function: a call adds the ones it needs)."""
    raise NotImplementedError

  def describe(self, kernel: str) -> CallInfo:
    """What the profiler reports of the call, which belongs to the schedule kernel named kernel."""
    raise NotImplementedError

  def fold(self, item) -> Call | None:
    """This call run once over all n_ items of a ranged dim (codegen/render/run_dims.py), None where it runs once per
    item; item(buffer) is the elements from one item of a buffer to the next (None: a buffer the items share)."""
    return None


@dataclass
class GuardedCall(Call):
  """A call made only where a condition on the run's size holds (a recurrence's step the run's length passes:
  aot/scheduler/runtime_extent.py step_condition)."""

  call: Call
  condition: str

  def __post_init__(self):
    self.role, self.parallel = self.call.role, self.call.parallel

  @property
  def tasks(self) -> int:
    return self.call.tasks

  def render(self, arg, tramps: dict[str, str]) -> str:
    return f"  if ({self.condition}) {{\n{self.call.render(arg, tramps)}\n  }}"

  def describe(self, kernel: str) -> CallInfo:
    return self.call.describe(kernel)


def guarded(call: Call, condition: str | None) -> Call:
  """call, made only where condition holds (None: always)."""
  return GuardedCall(call, condition) if condition else call


def ctype(b: Buffer, slot: int) -> str:
  """A kernel argument's C pointer type: slot 0 is the output, the others are read."""
  return f"{'' if slot == 0 else 'const '}{b.dtype.cname} *"


def trampoline(tramps: dict[str, str], fn: str, fargs: list, sized: bool = False) -> str:
  """The name of the function that calls fn with its pointers (fargs: [(slot, buffer)]) unpacked from an array: a
  kernel on the pool, or one the runtime calls back (a fused epilogue). sized: fn takes the run's size n_ too, the
  array's last entry."""
  if fn not in tramps:
    unpack = [f"({ctype(b, s)})a[{i}]" for i, (s, b) in enumerate(fargs)]
    unpack += [f"(int)(intptr_t)a[{len(fargs)}]"] if sized else []
    tramps[fn] = f"static void run_{fn}(void *c, int s, int e) {{ void **a = c; {fn}({', '.join(unpack)}, s, e); }}"
  return f"run_{fn}"


@dataclass(kw_only=True)
class LoopCall(Call):
  """A generated function run over its outermost loop's extent (split into that many tasks on the pool), over the
  (slot, buffer) arguments it takes; ast its optimised kernel (the profiler counts its flops)."""

  fn: str
  args: list[tuple[int, Buffer]]
  extent: int
  ast: object = field(default=None, repr=False)
  # elements the pointer of a slot is advanced by (rebase_reads): the function reads from there on
  offsets: dict[int, int] = field(default_factory=dict)
  # the function takes the run's size of a dim run to a size given at run time (aot/scheduler/runtime_extent.py; e_
  # in model.c, its parameter n_), and its outermost loop runs to it or a size derived from it (runtime_extent, that
  # size in C; extent is then its bound)
  sized: bool = False
  runtime_extent: str = ""

  @property
  def tasks(self) -> int:
    return self.extent

  def render(self, arg, tramps: dict[str, str]) -> str:
    at = lambda b, s: f"({arg(b, s)} + {self.offsets[s]})" if s in self.offsets else arg(b, s)
    extent = self.runtime_extent or str(self.extent)
    if not self.parallel:
      args = [at(b, s) for s, b in self.args] + (["(int)e_"] if self.sized else [])
      return f"  {self.fn}({', '.join(args)}, 0, {extent});"
    ptrs = [f"(void *){at(b, s)}" for s, b in self.args] + (["(void *)(intptr_t)e_"] if self.sized else [])
    run = trampoline(tramps, self.fn, self.args, self.sized)
    return f"  {{ void *a[] = {{{', '.join(ptrs)}}}; aot_parallel(m->pool, {run}, a, {extent}); }}"

  def describe(self, kernel: str) -> CallInfo:
    flops = flop_count(self.ast)
    nbytes = distinct_bytes(b for _, b in self.args)
    return CallInfo(
      kernel, self.fn, self.role, "loop" if flops else "copy", flops, nbytes, None, self.parallel, self.extent
    )


@dataclass
class CallContext:
  """What turning a lowered kernel into calls needs: the generated functions' names by their optimised AST, the
  optimised AST of each generated one, whether the model runs on the pool at all (threads), the smallest work worth
  splitting (stage.py's PARALLEL_MIN_WORK) and the target (the c target contracts a fused epilogue's multiply-adds)."""

  functions: dict[UOp, str]
  optimized: dict[UOp, UOp]
  threads: bool
  min_work: int
  target: str
  # the bound of a dim run to a size given at run time (aot/scheduler/runtime_extent.py), 0 for none: a
  # contraction's M, N or K of that size is the run's (e_ in model.c)
  bound: int = 0
  # its sizes at the bound -> their forms in the run's (frontends/batch_dims.py BatchDim.sizes)
  sizes: dict = field(default_factory=dict)
  # the functions loop calls run, by their rebased AST (rebase_reads), and the name each function's calls took
  shared: dict[UOp, str] = field(default_factory=dict)
  renamed: dict[str, str] = field(default_factory=dict)
  work: dict[UOp, int] = field(default_factory=dict)
  # (function, rebased or not, its slots' sizes) -> (rebased AST, offsets, extent, params, (takes a run-time size,
  # its threads' loop runs to it)): the layers of an encoder call one function each, and a layer norm's 128-step
  # function took 20 ms a call to walk
  prepared: dict[tuple, tuple] = field(default_factory=dict)

  def flops(self, ast: UOp) -> int:
    """flop_count (integer work too) of a function, once per function (an unrolled layer's steps share theirs)."""
    if ast not in self.work:
      self.work[ast] = flop_count(ast, integer=True)
    return self.work[ast]

  def parallel(self, tasks: int, work: int) -> bool:
    """Does a call of this many tasks doing this much work run on the pool?"""
    return self.threads and tasks > 1 and work >= self.min_work

  def loop(self, ast: UOp, bufs: list[Buffer], out: Buffer, role: str, rebase: bool = False) -> LoopCall:
    """The call of generated function ast over the kernel's buffers, its slot 0 being out (a dense operand's kernel
    writes its slot 0 into the operand's buffer). rebase: a call rendered by LoopCall.render alone, which may read
    through advanced pointers (rebase_reads)."""
    ast, fn = self.optimized[ast], self.functions[self.optimized[ast]]
    key = (ast, rebase, tuple(b.size for b in bufs))
    if key not in self.prepared:
      new, offsets = rebase_reads(ast, bufs) if rebase else (ast, {})
      sizes = (takes_runtime_size(new), runtime_outer(new))
      self.prepared[key] = (new, offsets, parallel_extent(new), [u.arg for u in kernel_params(new)], sizes)
    ast, offsets, extent, slots, (sized, outer) = self.prepared[key]
    if rebase:
      self.renamed[fn] = fn = self.shared.setdefault(ast, fn)
    args = [(s, out if s == 0 else bufs[s]) for s in slots]
    parallel = self.threads and extent > 1 and self.parallel(extent, self.flops(ast) + out.size)
    return LoopCall(
      fn=fn,
      args=args,
      extent=extent,
      ast=ast,
      role=role,
      parallel=parallel,
      offsets=offsets,
      sized=sized,
      runtime_extent=self.sizes[outer].c("(int)e_") if outer else "",
    )

  def rendered(self, functions: dict[UOp, str]) -> dict[UOp, str]:
    """The functions to render: those calls run rebased in place of theirs, the others as they are."""
    return {ast: fn for ast, fn in functions.items() if fn not in self.renamed} | self.shared


def rebase_reads(ast: UOp, bufs: list[Buffer]) -> tuple[UOp, dict[int, int]]:
  """ast with the smallest constant offset of each read slot's loads moved into the call's pointer: kernels that
  differ only by where in a buffer they read (an unrolled recurrent layer's steps, each reading its row of the input
  product) become one function, not one each to render and compile. -> (ast, {slot: elements})."""
  loads: dict[UOp, list[UOp]] = {}
  for u in ast.toposort():
    for s in u.src:
      if s.op is Ops.DEFINE_GLOBAL and s.arg != 0:
        loads.setdefault(s, []).append(u)
  offsets: dict[int, int] = {}
  slots = [g.arg for g in loads]
  for g, users in loads.items():
    # a slot seen as two globals (two dtypes) or also written keeps its pointer
    if slots.count(g.arg) > 1 or not all(u.op is Ops.LOAD and u.src[0] is g for u in users):
      continue
    c = min(linear(u.src[1])[1] for u in users)
    if 0 < c < bufs[g.arg].size:
      offsets[g.arg] = c
  if not offsets:
    return ast, {}
  # bottom up: a load's index may hold another rebased load (a gather by a loaded index), which must be rebased there
  done: dict[UOp, UOp] = {}
  for u in ast.toposort():
    src = tuple(done[s] for s in u.src)
    if u.op is Ops.LOAD and u.src[0].op is Ops.DEFINE_GLOBAL and (c := offsets.get(u.src[0].arg)):
      src = (src[0], src[1] + UOp.const(src[1].dtype, -c), *src[2:])
    done[u] = u if src == u.src else u.replace(src=src)
  return done[ast], offsets


def globals_read(asts) -> set[int]:
  """The slots the kernels asts read or write."""
  return {u.arg for ast in asts for u in ast.toposort() if u.op is Ops.DEFINE_GLOBAL}


@dataclass
class Lowered:
  """One schedule kernel lowered (a rule of stage.py's LOWERINGS): the kernel over its buffers with the slots the
  lowering added, the generated functions it needs, and the calls model.c makes of them and of the runtime. This
  base is a kernel run as generated loops: pieces are its functions (one per slice of a concat's output, else one)."""

  kernel: Kernel
  pieces: list[UOp]

  # what a kernel with no generated function of its own (main() None) reports as its function (KernelInfo)
  runtime_entry = ""
  # the runtime's C files this path calls, each with the entry points generated code calls it by (a file is built
  # and linked only where a model calls one: aot/compiler.py runtime_sources_called); generated loops call none
  runtime_sources: ClassVar[dict[str, tuple[str, ...]]] = {}

  def functions(self) -> dict[UOp, str]:
    """The generated functions by AST, in the order they are named: each its name's suffix after NAME_fI."""
    names: dict[UOp, str] = {}
    for j, p in enumerate(self.pieces):
      names.setdefault(p, "" if j == 0 else f"_slice{j}")
    return names

  def main(self) -> UOp | None:
    """The kernel's own function (KernelInfo's), None when the runtime does all its work."""
    return self.pieces[0] if self.pieces else None

  def reads(self) -> set[int]:
    """The slots of the kernel's buffers its generated functions and runtime calls read as they are (the constants
    among them go to the weights)."""
    return globals_read(self.pieces)

  def panel_floats(self) -> int:
    """The floats of the buffer each thread packs B's panels into (GemmCall.pack), 0 when none does."""
    return 0

  def segments(self) -> list[Kernel]:
    """The kernel's calls in runs, each with the buffers they touch, in order (the memory plan's steps: a buffer
    lives from the first run using it to the last): one run of all its buffers, unless its calls come in pieces."""
    return [self.kernel]

  def calls(self, ctx: CallContext) -> list[Call]:
    return [ctx.loop(p, self.kernel.bufs, self.kernel.bufs[0], "kernel", rebase=True) for p in self.pieces]


def copies_in_place(ast: UOp) -> bool:
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
