"""The kernels of a dim that runs to a size given at run time (frontends/extent_dims.py): the schedule is made at the
bound P, a prime no other dim's size is a multiple of, so a loop of P is a loop over the dim; it becomes a runtime
RANGE (its arg's 4th field: the VAR n_, the run's size), which the renderer runs to n_, its index arithmetic
unchanged (strides at the bound). That is exact only where the loop's counter reaches nothing but addresses: a counter
compared, divided or taken modulo would compare against the bound; such a kernel is a bug of the proof, reported
here. A recurrence over the dim, unrolled to the bound's steps, has its steps' kernels guarded by the run's length
(guard_steps): the kernel list stays the bound's, the steps past the run's length are skipped."""

from __future__ import annotations

from aot.core.dtype import dtypes
from aot.core.ir import Ops, UOp, prod
from aot.core.rewrite import substitute
from aot.dim_size import DimSize
from aot.errors import CompileError, InternalError
from aot.scheduler.kernel import Kernel, Schedule, StepGuard

# what an index holding a runtime loop counter may be: a sum of terms times constants, read as an address (or cast to
# a value: an arange's position)
ADDRESS_OPS = {Ops.ADD, Ops.MUL, Ops.LOAD, Ops.STORE, Ops.ACCUMULATE, Ops.CAST, Ops.SINK}


def blocks_before(shape: tuple, axis: int) -> int:
  """The blocks a tensor's rows along the dim at axis come in (the product of the dims before it): at 1, its first n
  rows are its layout's at the bound, read and written in place; else copied (codegen/render/run_dims.py Staged)."""
  return prod(shape[:axis]) if axis >= 0 else 1


def size_var(dim) -> UOp:
  """The run's size of a ranged dim (frontends/batch_dims.py RunDim), n_ in the kernels' C."""
  return UOp(Ops.VAR, dtypes.index, (), ("n_", dim.lo, dim.hi))


def mark_runtime_ranges(sched: Schedule) -> None:
  """Every kernel's loops of the bound's size made runtime ranges, in place (runtime_marked)."""
  done: dict[UOp, UOp] = {}
  for k in sched.kernels:
    if k.ast not in done:
      done[k.ast] = runtime_marked(k.ast, sched.extent, f"kernel {k.name}")
    k.ast = done[k.ast]


def guard_steps(sched: Schedule) -> None:
  """A recurrence's steps made only as far as the run's length (frontends/onnx_ops_rnn.py StepGuard), in place: a
  kernel whose stage a step is marked with has its guard; another kernel all of whose readers have guards takes the
  first one's (a step's product, read by its state's kernel alone). The steps past the run's length are then not
  made, and nothing the run computes reads them: a loop over the dim runs to the run's size."""
  readers: dict[int, list[Kernel]] = {}
  for k in sched.kernels:
    for b in {id(b): b for b in k.bufs[1:]}.values():
      readers.setdefault(id(b), []).append(k)
  for k in reversed(sched.kernels):
    if k.step is not None or k.out.kind != "scratch" or not (rs := readers.get(id(k.out))):
      continue
    if all(r.step is not None for r in rs) and len({r.step.length for r in rs}) == 1:
      k.step = min((r.step for r in rs), key=lambda g: g.step)


def step_condition(extent, guard: StepGuard | None) -> str | None:
  """The C condition under which a kernel of a recurrence's step runs (the run's size e_), None where it always
  does (no step, or the first)."""
  form = extent.size_at(guard.length) if extent is not None and guard is not None else None
  return f"{form.c('e_')} > {guard.step}" if form is not None and guard.step > 0 else None


def size_uop(form: DimSize, n: UOp) -> UOp:
  """A size derived from the dim (aot/dim_size.py) as an index expression of its run's size n."""
  if form.q == 1:
    return n + (form.b + form.e) if form.b + form.e else n
  return (n + form.b) // form.q + form.e


def runtime_marked(ast: UOp, batch, what: str) -> UOp:
  """ast with its loops of the dim's sizes at the bound made runtime ranges (those already are stay), to the forms
  of those sizes at the run's; a pad's bound compared with a counter, the form of its constant. A loop of a multiple
  of the bound (the dim merged with another), a counter used other than as an address or compared with another
  constant is an InternalError naming what. batch: the ranged dim (frontends/batch_dims.py BatchDim)."""
  bound, n = batch.bound, size_var(batch.dim)
  ranges = [u for u in ast.toposort() if u.op is Ops.RANGE]
  if any(r.size != bound and r.size % bound == 0 for r in ranges):
    raise InternalError(f"{what} runs the ranged dim merged with another dim in one loop")
  mapping = {
    r: UOp(Ops.RANGE, r.dtype, (), (*r.arg, size_uop(form, n)))
    for r in ranges
    if not r.runtime and r.kind != "panels" and (form := batch.size_at(r.size)) is not None
  }
  ast = substitute(ast, mapping) if mapping else ast
  # (a pack's "rows" run to a count computed from the run's size, not over the dim: codegen/lower/columns.py)
  counted = {r for r in ast.toposort() if r.op is Ops.RANGE and r.runtime and r.kind != "rows"}
  gates, compared = dict(batch.gates), {}
  for u in ast.toposort():
    if u in counted or not any(s in counted for s in u.src):
      continue
    if u.op is Ops.CMPLT and u.src[0] in counted and n in u.src[1].toposort():
      continue  # (marked before)
    if u.op is Ops.CMPLT and u.src[0] in counted and u.src[1].op is Ops.CONST and int(u.src[1].arg) in gates:
      # (a pad's bound: its lower one stays, its upper one is the padded axis' form at the run's size)
      if (form := gates[int(u.src[1].arg)]) is not None:
        compared[u] = u.replace(src=(u.src[0], size_uop(form, n)))
      continue
    if u.op in (Ops.MOD, Ops.IDIV):
      # (windows over windows, fused in one kernel, can leave their index arithmetic unsimplified at the bound)
      raise CompileError(
        f"dim '{batch.dim.name}' cannot have a range: {what} divides its positions ({u.op.name}), as windows over "
        f"windows computed in one kernel may: a run-time size cannot take that in this version: pin it "
        f"(--shape {batch.dim.name}=N)"
      )
    if u.op not in ADDRESS_OPS or (u.op is Ops.MUL and not any(s.op is Ops.CONST for s in u.src)):
      raise InternalError(f"{what} uses the ranged dim's loop counter in {u.op.name}, not an address")
    # (a loaded value and what is computed from it no longer carry the counter)
    if u.op not in (Ops.LOAD, Ops.ACCUMULATE, Ops.STORE, Ops.SINK, Ops.CAST):
      counted.add(u)
  # (only the comparisons with a counter: the same constant elsewhere is another value)
  return substitute(ast, compared) if compared else ast
