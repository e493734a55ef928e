"""The CPU targets' lowering stage: each schedule kernel to the calls model.c makes (codegen/lower/calls.py).

Every way a kernel can run is a rule of LOWERINGS, tried in order on each kernel; the first that takes it returns a
Lowered (the kernel over its new buffers, its generated functions, its calls). lower_schedule then writes the
constants the generated functions read, names and optimises the functions and lists the calls."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import accumulate

from aot.artifact import WeightsWriter, release_mapped_pages
from aot.codegen.lower.calls import Call, CallContext, CallInfo, Lowered, guarded
from aot.codegen.lower.contract import (
  fuse_epilogues,
  lower_contractions,
  lowerable_contractions,
  split_by_gates,
  split_by_slices,
)
from aot.codegen.lower.direct import DirectLowered, lower_depthwise
from aot.codegen.lower.microkernel import GemmLowered
from aot.codegen.lower.pieces import ARENA_GOAL, PiecedLowered, scratch_pieces
from aot.codegen.lower.qgemm import QGemm, QGemmLowered
from aot.codegen.lower.qpool import PoolLowered, lower_qpool
from aot.codegen.lower.quant import lower_qgemm, narrow_int8_producers
from aot.codegen.render.linearize import flop_count, takes_runtime_size
from aot.codegen.render.opt import optimize
from aot.core.dtype import dtypes
from aot.core.ir import Ops, UOp
from aot.errors import working_on
from aot.scheduler.kernel import Buffer, Kernel, Schedule
from aot.scheduler.memory import live_bytes
from aot.scheduler.runtime_extent import runtime_marked, step_condition

# kernels doing less work than this (flops + elements written) run on the calling thread: waking the pool costs more
PARALLEL_MIN_WORK = 1 << 16
# a model doing fewer flops than this runs whole on the calling thread: the pool's threads rest between runs, and
# the first wake-up of a run costs more than splitting gains (the 3-layer mlp: 2 threads were 0.74x as fast as 1)
MODEL_PARALLEL_MIN_WORK = 1 << 25


def function_name(name: str, i: int) -> str:
  """The C function of the schedule's kernel i (named ki_...): NAME_fi."""
  return f"{name}_f{i}"


def kernel_place(k: Kernel) -> str:
  """A kernel, for the InternalError a bug compiling it becomes (working_on): its name, and the model output it
  writes if it writes one."""
  return f"in kernel {k.name}" + (f" (writing output '{k.out.name}')" if k.out.kind == "output" else "")


def function_places(owners: dict[str, Kernel]) -> dict[str, str]:
  """Each generated function's place (working_on): the function, and the kernel whose work it does (owners: the
  kernel that named it, by function)."""
  return {fn: f"in function {fn} of kernel {kernel_place(k).removeprefix('in kernel ')}" for fn, k in owners.items()}


@dataclass
class LowerEnv:
  """What the rules share: the gemm tile, the weights file the packed constants go to as they are made, the kernels
  writing each buffer and the int8 results already lowered (quant.py's producers, qresults), and what was made."""

  tile: tuple[int, int]
  weights: WeightsWriter
  producers: dict = field(default_factory=dict)
  qresults: dict = field(default_factory=dict)
  scratch_made: list[Buffer] = field(default_factory=list)
  packed: set[int] = field(default_factory=set)
  # the arena bytes each kernel's lowering may add (by kernel id; pieces.py), unbounded where not given
  scratch_budget: dict[int, int] = field(default_factory=dict)

  def keep(self, b: Buffer) -> Buffer:
    """A buffer a lowering made: a scratch one for the arena; a packed constant to the weights file now, then
    dropped (never all of them in memory at once)."""
    if b.kind == "scratch":
      self.scratch_made.append(b)
      return b
    self.weights.add(b)
    b.data = None
    self.packed.add(id(b))
    return b

  def make_buffer(self, kind: str, x) -> Buffer:
    """A float32 scratch buffer of x elements, or a constant holding the array x (contract.py's make_buffer)."""
    if kind == "scratch":
      return self.keep(Buffer("scratch", dtypes.float32, x, "contraction"))
    return self.keep(Buffer("const", dtypes.float32, x.size, "packed", shape=x.shape, data=x))


def lower_int8_gemm(k: Kernel, env: LowerEnv) -> Lowered | None:
  found = lower_qgemm(k.ast, k.bufs, env.producers, env.qresults)
  return None if found is None else _int8_lowered(k, env, found)


def _int8_lowered(k: Kernel, env: LowerEnv, found: tuple) -> Lowered:
  bufs, made, qgemms, epilogue = found
  for b in made:
    env.keep(b)
  # the kernel's own generated function: its epilogue, else A's copy; none for a bare matmul read in place
  own = epilogue if epilogue is not None else qgemms[0].dense
  return QGemmLowered(Kernel(k.name, k.ast, bufs, k.shape), [own] if own is not None else [], qgemms, epilogue)


def lower_int8_pool(k: Kernel, env: LowerEnv) -> Lowered | None:
  found = lower_qpool(k.ast, k.bufs)
  if found is None:
    return None
  bufs, made, pools, epilogue = found
  for b in made:
    env.keep(b)
  return PoolLowered(Kernel(k.name, k.ast, bufs, k.shape), [epilogue] if epilogue is not None else [], pools)


def _released(k: Kernel, low: Lowered) -> Lowered:
  # what packing read of a memory-mapped weight leaves the process's memory again (it stays in the page cache)
  for b in k.bufs:
    if b.kind == "const":
      release_mapped_pages(b.data)
  return low


def lower_direct(k: Kernel, env: LowerEnv) -> Lowered | None:
  found = lower_depthwise(k.ast, k.bufs, env.make_buffer)
  if found is None:
    return None
  last, bufs, convs = found
  return _released(k, DirectLowered(Kernel(k.name, k.ast, bufs, k.shape), [last], convs))


def _gemm_lowered(kernel: Kernel, last: UOp, gemms: list) -> GemmLowered:
  # a concat's epilogue runs one kernel per branch's slice; a contraction applies its own to its tiles when it can
  pieces = split_by_slices(last, gemms)
  fuse_epilogues(pieces, gemms)
  return GemmLowered(kernel, pieces, gemms)


def lower_contraction(k: Kernel, env: LowerEnv) -> Lowered | None:
  found = lowerable_contractions(k.ast, k.bufs, env.tile)
  if not found:
    return None
  budget = env.scratch_budget.get(id(k), 1 << 62)
  if (cut := scratch_pieces(k.ast, k.bufs, env.tile, budget, found)) is not None:
    return _released(k, _lower_in_pieces(k, cut, env))
  last, bufs, gemms = lower_contractions(k.ast, k.bufs, env.tile, env.make_buffer, found=found)
  if not gemms:
    return None
  return _released(k, _gemm_lowered(Kernel(k.name, k.ast, bufs, k.shape), last, gemms))


def _lower_in_pieces(k: Kernel, cut: list[UOp], env: LowerEnv) -> PiecedLowered:
  """The kernel's pieces (pieces.py) lowered one after another over its buffers, the weights packed once."""
  bufs, consts, done = list(k.bufs), {}, []
  for piece in cut:
    n = len(bufs)
    last, bufs, gemms = lower_contractions(piece, bufs, env.tile, env.make_buffer, consts)
    done.append((last, gemms, range(n, len(bufs))))
  kernel = Kernel(k.name, k.ast, bufs, k.shape)
  # a piece too small for the microkernel runs as loops
  parts = [_gemm_lowered(kernel, last, gemms) if gemms else Lowered(kernel, [last]) for last, gemms, _ in done]
  return PiecedLowered(kernel, [p for part in parts for p in part.pieces], parts, [made for *_, made in done])


def lower_loops(k: Kernel, env: LowerEnv) -> Lowered:
  return _released(k, Lowered(Kernel(k.name, k.ast, k.bufs, k.shape), split_by_gates(k.ast, k.bufs[0].size)))


def lower_runtime_sized(k: Kernel, env: LowerEnv) -> Lowered | None:
  """A kernel with loops to a run-time size (aot/scheduler/runtime_extent.py): its float contractions on the
  microkernel where the dim is one of M, N and K alone, its int8 ones on the int8 microkernel where it is their M
  (the call passes e_ there; operands and C keep their strides at the bound), the rest as generated loops; no other
  fast path takes a size at run time yet."""
  if not takes_runtime_size(k.ast):
    return None
  found = lowerable_contractions(k.ast, k.bufs, env.tile)
  if found and all(_runtime_sized(c) for c in found):
    last, bufs, gemms = lower_contractions(k.ast, k.bufs, env.tile, env.make_buffer, found=found)
    if gemms:
      return _released(k, _gemm_lowered(Kernel(k.name, k.ast, bufs, k.shape), last, gemms))
  # (a kernel may take the size with no loop to it: a value computed from it, a reversal's last position)
  bound = next((r.size for r in k.ast.toposort() if r.op is Ops.RANGE and r.runtime), None)
  if (
    bound
    and (q := lower_qgemm(k.ast, k.bufs, env.producers, env.qresults))
    and all(_rows_runtime(g, bound) for g in q[2])
  ):
    return _int8_lowered(k, env, q)
  return _released(k, Lowered(Kernel(k.name, k.ast, k.bufs, k.shape), [k.ast]))


def _rows_runtime(q: QGemm, bound: int) -> bool:
  """Is an int8 contraction's run-time dim its rows alone (M, A's rows read in place or from its copy)?"""
  return q.M == bound and bound not in (q.N, q.K) and q.im2col is None


def _runtime_sized(c) -> bool:
  """Is each loop of a contraction to a run-time size the outermost range of its M, N or K, or among B's rows after
  fixed ones (not in its batch, nor a slice of an output range)? Its rows at a run's size are then a prefix of that
  side's at the bound, or B's columns compact at the run's size (contract.Contraction.compact)."""
  inner = [r for rs in (c.a.rows, c.k) for r in rs[1:]] + list(() if c.compact else c.b.rows[1:])
  return not c.bounds and not any(r.runtime for r in (*c.batch, *inner))


# each kernel goes to the first rule that takes it
LOWERINGS = (
  # loops to a run-time size first: the float microkernel takes one as M, N or K, the int8 one as M
  lower_runtime_sized,
  # int8 contractions first: their int32 sums are contractions the float microkernel would take too
  lower_int8_gemm,
  # 8-bit max pools: the runtime's separable pool (a MAX reduction, no contraction: either order finds it)
  lower_int8_pool,
  # depthwise convolutions before contractions: each is one, which the microkernel runs ~15x slower
  lower_direct,
  # float contractions on the microkernel, plus their epilogues
  lower_contraction,
  # whatever is left: generated loops (always takes the kernel)
  lower_loops,
)


# the runtime's C files an artifact may link, each with the entry points generated code calls it by (aot_runtime.c,
# the pool and errors, always; then those of every path above): a file is built and linked only where a kernel calls
# it, since a model with no contraction need not wait for the int8 microkernel to compile (6.5 s of gcc -O2)
RUNTIME_SOURCES: dict[str, tuple[str, ...]] = {
  "aot_runtime.c": (),
  # NAME_create's CPU check (aot/cpu.py), always: built for the architecture's baseline, not the target
  "aot_cpu.c": (),
  **{
    f: entries
    for path in (GemmLowered, DirectLowered, QGemmLowered, PoolLowered)
    for f, entries in path.runtime_sources.items()
  },
}


@dataclass
class LoweredSchedule:
  """The schedule lowered for a CPU target: each kernel's Lowered, the arena's scratch buffers (the schedule's, less
  those the lowering replaced, plus those it made), the generated functions' names by optimised AST and each one's
  place (working_on), the function KernelInfo names for each kernel, and model.c's calls of each kernel."""

  lowered: list[Lowered]
  scratch: list[Buffer]
  functions: dict[UOp, str]
  places: dict[str, str]
  entries: list[str]
  kernel_calls: list[list[Call]]

  @property
  def calls(self) -> list[Call]:
    return [c for calls in self.kernel_calls for c in calls]

  def call_infos(self) -> list[CallInfo]:
    """What the profiler reports of each call, in model.c's order."""
    return [c.describe(low.kernel.name) for low, calls in zip(self.lowered, self.kernel_calls) for c in calls]

  @property
  def panel_floats(self) -> int:
    return max([low.panel_floats() for low in self.lowered], default=0)

  @property
  def segments(self) -> list[Kernel]:
    """Every kernel's runs of calls with their buffers, in order: the memory plan's steps (Lowered.segments)."""
    return [s for low in self.lowered for s in low.segments()]


def _lower_kernels(sched: Schedule, env: LowerEnv) -> tuple[list[Lowered], set[int]]:
  """Each kernel by the first rule of LOWERINGS that takes it; and the ids of the schedule's scratch buffers
  replaced (8-bit values widened to int32 stored as bytes first)."""
  narrowed, made8, replaced = narrow_int8_producers(sched.kernels)
  env.scratch_made += made8
  env.producers.update({id(k.bufs[0]): k for k in narrowed})
  # a ranged dim's arena is planned by runs of whole kernels (codegen/render/run_dims.py item_segments): no budget
  if sched.batch is None:
    largest = max(b.nbytes for b in [*sched.inputs, *sched.outputs, *(k.bufs[0] for k in sched.kernels)])
    live = live_bytes(narrowed)
    env.scratch_budget = {id(k): ARENA_GOAL * largest - live[i] for i, k in enumerate(narrowed)}
  lowered = []
  for k in narrowed:
    with working_on(kernel_place(k)):
      lowered.append(next(low for rule in LOWERINGS if (low := rule(k, env)) is not None))
  return lowered, replaced


def _write_weights(lowered: list[Lowered], packed: set[int], weights: WeightsWriter) -> None:
  """The model's constants that the generated functions read, after the packed copies written during lowering."""
  # constants only a prepacked copy reads are left out of the weights
  used = {id(low.kernel.bufs[s]) for low in lowered for s in low.reads()}
  consts = [
    b for low in lowered for b in low.kernel.bufs if b.kind == "const" and id(b) in used and id(b) not in packed
  ]
  for b in {id(b): b for b in consts}.values():
    weights.add(b)
    release_mapped_pages(b.data)


def lower_schedule(
  name: str, sched: Schedule, tile: tuple[int, int], weights: WeightsWriter, target: str
) -> LoweredSchedule:
  """The schedule's kernels lowered (LOWERINGS), the constants they read written after the packed ones, the generated
  functions named (NAME_fI and suffixes; kernels doing the same work share one) and optimised, and the calls."""
  env = LowerEnv(tile, weights)
  lowered, replaced = _lower_kernels(sched, env)
  _write_weights(lowered, env.packed, weights)
  names: dict[UOp, str] = {}
  owners: dict[str, Kernel] = {}
  for n, (k, low) in enumerate(zip(sched.kernels, lowered)):
    for ast, suffix in low.functions().items():
      owners.setdefault(names.setdefault(ast, f"{function_name(name, n)}{suffix}"), k)
  places = function_places(owners)
  optimized = {}
  bound = sched.extent.bound if sched.extent is not None else 0
  for ast, fn in names.items():
    with working_on(places[fn]):
      # (a dense copy or an epilogue of a kernel with loops to a run-time size runs its loops of the bound so too)
      optimized[ast] = optimize(runtime_marked(ast, sched.extent, f"function {fn}") if bound else ast)
  functions = {optimized[ast]: fn for ast, fn in names.items()}
  entries = [names[low.main()] if low.main() is not None else low.runtime_entry for low in lowered]
  # integer sums count as work too: a quantized model's are nearly all of it; counted only until there is enough
  # (a ranged dim's items all count: frontends/batch_dims.py, at its largest size)
  items = sched.batch.dim.hi if sched.batch else 1
  sums = accumulate(items * flop_count(k.ast, integer=True) for k in sched.kernels)
  threads = any(w >= MODEL_PARALLEL_MIN_WORK for w in sums)
  sizes = dict(sched.extent.sizes) if sched.extent is not None else {}
  ctx = CallContext(functions, optimized, threads, PARALLEL_MIN_WORK, target, bound=bound, sizes=sizes)
  kernel_calls = []
  for k, low in zip(sched.kernels, lowered):
    with working_on(kernel_place(low.kernel)):
      kernel_calls.append([guarded(c, step_condition(sched.extent, k.step)) for c in low.calls(ctx)])
  scratch = [b for b in sched.scratch if id(b) not in replaced] + env.scratch_made
  entries = [ctx.renamed.get(fn, fn) for fn in entries]
  return LoweredSchedule(lowered, scratch, ctx.rendered(functions), places, entries, kernel_calls)
