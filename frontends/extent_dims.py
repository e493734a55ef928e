"""A dim with a range that ops mix (--shape sequence=1..256 where attention reduces over it): the artifact is the
program traced at a bound P (the smallest prime >= the range's top that divides no other dim's size), every buffer
laid out at P, and the loops over the dim run to the size the run is given (RANGE.runtime) where they ran to P. That
is only right when every element a loop computes at a size n < P reads elements below n of its sources along the dim
and no value depends on n itself: the dim flows through elementwise ops, broadcasts, permutes, reshapes that keep it
an axis of its own, reductions and contractions over it, and slices that start at 0 of a longer constant (a position
table). It is proved here on the program and a probe at another size (frontends/batch_dims.py's), walked in step as
that module does for a batch: a node's dim axes are those of the two sizes there, and every node keeps positions by
its op's rule (_RULES); a constant that differs between the sizes must agree on the positions both have (a position
table, an arange), or be a mean's 1/count over the dim (batch_dims.note_mean), which is then computed from the run's
size (the VAR n_). Pads and windows (convolutions, pools) along the dim derive sizes from it, each with a form in
the run's size (aot/dim_size.py), to which their loops then run and against which a pad's bound is compared
(_DimSizes); the bound is then the first size at which every strided window reaches the end of its input, prime or
not. A recurrence over the dim (LSTM, GRU, RNN: unrolled, one step per position) is taken whole too: its steps run
as far as the run's length (aot/scheduler/runtime_extent.py guard_steps), its backward direction from the run's
last position (_reversed_at_run). Flipping, gathering or slicing anything but a prefix along the dim, merging it
with another dim, or another value of its size (the length read from Shape, as a value) is a CompileError naming
the first node that does it.

Memory: the arena is the static plan at P (strides at the bound: every index stays a constant-coefficient sum, and
a loop's bound is the only run-time value). Inputs and outputs are read and written in place when every axis before
the dim is 1 (or the batch's, item by item): their first n rows are the first n of the layout at P; one with other
dims before it is copied to and from its layout at P in the arena, n rows of each (codegen/render/run_dims.py)."""

from __future__ import annotations

import itertools
import math
from typing import Callable

import numpy as np

from aot.core.dtype import dtypes
from aot.core.ir import GroupOp, Ops, UOp
from aot.core.rewrite import substitute
from aot.dim_size import DimSize
from aot.errors import CompileError, InvalidValueError
from aot.frontends.batch_dims import BatchDim, Recurrence, RunDim, SizeTrace, Windows, _node_of, _sources, in_step
from aot.frontends.tensor import Tensor
from aot.scheduler.kernel import Traced
from aot.scheduler.runtime_extent import blocks_before, size_uop, size_var


def _is_prime(n: int) -> bool:
  return n > 1 and all(n % d for d in range(2, math.isqrt(n) + 1))


def bound_size(hi: int, taken: set[int], unfit=None) -> int | None:
  """The size a dim run to a size given at run time is traced and laid out at: the smallest prime >= hi that divides
  no other dim's size (a loop of that size is then the dim's and no other's). Above hi where small primes divide
  the model's sizes (a detector's 320x320 has 2 and 5, its channels 3). unfit: where windows run along the dim
  (_DimSizes.unfit), the first size >= hi, prime or not, dividing no other dim's size, that they fit (windows of
  stride 2 want an even one); None when none below 64 x hi does."""
  apart = lambda p: not any(s % p == 0 for s in taken if s)
  if unfit is None:
    return next(p for p in itertools.count(max(hi, 2)) if _is_prime(p) and apart(p))
  return next((b for b in range(hi, 64 * hi) if apart(b) and unfit(b) is None), None)


def prove_extent_dim(
  dim: RunDim,
  t1: Traced,
  t2: Traced,
  p1: int,
  p2: int,
  labels: list,
  at1: SizeTrace,
  at2: SizeTrace,
  staged: bool = True,
) -> BatchDim:
  """The inputs' and outputs' dim axes, once every node of the graph traced at p1 (t1, the bound) and p2 (t2) is shown
  to keep its positions along the dim (the module's rule); else a CompileError naming the node. at1, at2: what the
  traces noted (batch_dims.SizeTrace): the windows they slid, each taken whole, and at the bound the means over the
  dim, whose 1/count t1 then computes from the run's size. staged: an input or output may have dims before the dim
  (its rows are copied to and from the layout at the bound: codegen/render/run_dims.py staging); not where the
  program runs item by item (another dim's range)."""
  axes: dict[UOp, tuple | str] = {}
  differs: dict[UOp, UOp] = {}
  of_size: dict[UOp, UOp] = {}  # a constant computed from the size (a mean's 1/n) -> it computed from the run's
  sizes = _DimSizes(dim, p1, p2)
  means = at1.above.means if at1.above else {}
  _same_steps_walked(at1, at2)
  for u, v, constant in in_step(dim, t1, t2, differs, (at1.inside, at2.inside), labels):
    if u.op is Ops.PAD and isinstance(axes[u.src[0]], tuple):
      sizes.pad(u, v, axes[u.src[0]])
    if (w := at1.windows.get(u)) is not None and isinstance(axes.get(w.source), tuple):
      sizes.windows(u, w, axes[w.source], _node_of(u, labels))
    axes[u] = a = sizes.axes(u.shape, v.shape)
    if constant:
      continue
    srcs = _sources(u)
    why = None
    for s in (s for s in srcs if s in differs and s not in of_size):
      why = _prefix_values(s, differs[s], axes[s])
      if why and (run := _at_run_size(s, differs[s], p2, dim, means, sizes)):
        of_size[s], why = run, None
      if why:
        break
    if why is None and isinstance(a, str):
      why = a
    if u in at1.windows:
      pass  # (windows are taken whole, their steps skipped)
    elif u in at1.recurrences:
      why = why or _recurrence(at1.recurrences[u], u, a, axes[at1.recurrences[u].source])
    elif why is None and any(s in at1.recurrent for s in srcs):
      why = "reads a step of a recurrence over it"
    elif why is None and any(s in at1.inside for s in srcs):
      why = "reads a step of windows over it"
    elif why is None:
      src_axes = [() if isinstance(axes[s], str) else axes[s] for s in srcs]
      why = _RULES.get(u.op, _same_arg)(u, v, a, src_axes, dim)
    if why:
      raise CompileError(
        f"dim '{dim.name}' cannot have a range: {_node_of(u, labels)} {why}; a dim that varies at run time may reach "
        "elementwise ops, reductions, matrix products, convolutions and pools, and be sliced from position 0, in this "
        f"version: pin it (--shape {dim.name}=N)"
      )
  sizes.static = {x for u, a in axes.items() if isinstance(a, tuple) for i, x in enumerate(u.shape) if i not in a}
  sizes.static |= {x for r in at1.recurrences.values() for x in r.static}
  sizes.positions = {x for r in at1.recurrences.values() for x in r.positions}
  if (why := sizes.unfit(p1)) is not None:
    raise OtherBound(f"dim '{dim.name}' cannot have a range: {why}", sizes.unfit)
  if t1.containers or any(n in (t1.formats or {}) for n in [u.arg.name for u in t1.inputs] + (t1.output_names or [])):
    raise CompileError(
      f"dim '{dim.name}' cannot have a range: the model has sequence, optional or narrow-typed "
      "inputs or outputs, which take no range yet"
    )
  inputs = _io_axes(dim, t1, axes, "input", staged)
  if all(a < 0 for a in inputs):
    raise CompileError(f"dim '{dim.name}' is given a range, but no input has it")
  outputs = _io_axes(dim, t1, axes, "output", staged)
  # (a recurrence's backward direction starts at the run's last step, not the bound's: each reversal, in the order
  # traced, made of what it reads with the reversals below it made already)
  for f in (f for r in dict.fromkeys(at1.recurrences.values()) for f in r.flips):
    of_size[f] = _reversed_at_run(substitute(f.src[0], of_size), sizes.forms[f.shape[0]], dim)
  if of_size:
    sink = substitute(UOp(Ops.SINK, dtypes.void, tuple(t1.outputs)), of_size)
    t1.outputs = list(sink.src)
  return BatchDim(
    dim,
    inputs,
    outputs,
    runs="extent",
    bound=p1,
    sizes=tuple(sizes.forms.items()),
    gates=tuple(sizes.gates(p1).items()),
  )


class _DimSizes:
  """The sizes the dim's axes have at the bound, each with its form in the run's size (aot/dim_size.py): the dim's
  own, and those pads and windows derive from it; and the constants a pad's bounds are compared with."""

  def __init__(self, dim: RunDim, p1: int, p2: int):
    self.dim, self.p1, self.p2 = dim, p1, p2
    self.forms: dict[int, DimSize] = {p1: DimSize()}
    # each pad along the dim: its low pad and the padded axis' form (its bounds, compared with a counter: gates)
    self.pads: set[tuple[int, DimSize]] = set()
    # strided windows: their input's form, the window's span, its stride and the input's right pad. At the bound
    # every window must reach the end of its input, its pad too: a tap the bound's windows never take (or a pad's
    # bound they never cross) is simplified away there, and would be missed at another size
    self.reach: list[tuple[DimSize, int, int, int]] = []
    self.static: set[int] = set()  # the sizes of the program's other dims
    # the positions along it a recurrence's steps are placed at (Recurrence.positions), the same at every size
    self.positions: set[int] = set()

  def axes(self, s1: tuple, s2: tuple) -> tuple | str:
    """The axes whose sizes are the dim's or derived from it in both traces; a string if the shapes differ
    otherwise."""
    if len(s1) != len(s2):
      return "changes its rank with it"
    diff = [i for i, (x, y) in enumerate(zip(s1, s2)) if x != y]
    if any(s1[i] not in self.forms or self.forms[s1[i]].at(self.p2) != s2[i] for i in diff):
      slices = any(s1[i] - s2[i] == self.p1 - self.p2 for i in diff)
      return "pads or slices it" if slices else "merges it with another dim"
    return tuple(diff)

  def pad(self, u: UOp, v: UOp, src_axes: tuple) -> None:
    for i in src_axes:
      (lo, hi), form = u.arg[0][i], self.forms[u.src[0].shape[i]]
      if (lo, hi) != (0, 0):
        self._add(form.padded(lo + hi), u)
        self.pads.add((lo, form))

  def windows(self, u: UOp, w: Windows, src_axes: tuple, node: str) -> None:
    pre = len(w.source.shape) - len(w.kernel)
    for i in (i for i in src_axes if i >= pre):
      K, s, d = w.kernel[i - pre], w.stride[i - pre], w.dilation[i - pre]
      out = self.forms[w.source.shape[i]].windowed(-d * (K - 1) - 1, s)
      if out.at(self.dim.lo) < 1:
        raise CompileError(
          f"dim '{self.dim.name}' cannot have a range: {node} slides windows of {K} over it, which leave nothing at "
          f"its size {self.dim.lo}: raise the range's low end"
        )
      self._add(out, u)
      if s > 1:
        hi = w.source.arg[0][i][1] if w.source.op is Ops.PAD else 0
        self.reach.append((self.forms[w.source.shape[i]], d * (K - 1) + 1, s, hi))

  def _add(self, form: DimSize, u: UOp) -> None:
    x = form.at(self.p1)
    if self.forms.setdefault(x, form) != form:
      raise CompileError(
        f"dim '{self.dim.name}' cannot have a range: two sizes derived from it, {self.forms[x].text(self.dim.name)} "
        f"and {form.text(self.dim.name)}, are both {x} at its bound {self.p1}: pick another top of the range"
      )

  def gates(self, bound: int) -> dict[int, DimSize | None]:
    """Each pad's bounds at this bound: its upper one (its low pad plus the axis' size) -> its form, its lower one (the
    low pad, the same at every size) -> None."""
    fixed = {lo: None for lo, _ in self.pads} | dict.fromkeys(self.positions)
    return fixed | {lo + f.at(bound): f.padded(lo) for lo, f in self.pads}

  def unfit(self, bound: int) -> str | None:
    """Why the program laid out at this bound would not run right at every size (None: it would): a derived size
    that is another dim's too (its loops would run to the form), or strided windows that stop short of the end of
    their input there (self.reach)."""
    at = {f.at(bound): f for f in self.forms.values()}
    if len(at) < len(self.forms) or any(x in self.static for x, f in at.items() if f != DimSize()):
      return f"sizes derived from it coincide with each other or another dim's at its bound {bound}"
    uppers = {(lo + f.at(bound), f.padded(lo)) for lo, f in self.pads}
    if len({x for x, _ in uppers}) < len(uppers) or {x for x, _ in uppers} & (
      {lo for lo, _ in self.pads} | self.positions
    ):
      return f"two pads' bounds along it, or one and a recurrence's step, coincide at its bound {bound}"
    for padded, span, s, hi in self.reach:
      if (padded.at(bound) - span) % s >= max(hi, 1):
        return f"windows of stride {s} stop short of the end of their input at its bound {bound}"
    return None


class OtherBound(CompileError):
  """The program traced at a range's bound would not run right at every size of it, where another bound may:
  unfit(bound) says why one does not (None where it does: _DimSizes.unfit)."""

  def __init__(self, message: str, unfit):
    super().__init__(message)
    self.unfit = unfit


def _prefix_values(u: UOp, v: UOp, a) -> str | None:
  """A constant that differs between the sizes, where data meets it: its values at the positions both sizes have
  the same (a position table sliced to the size, an arange); else why not."""
  from aot.core.interpret import evaluate

  if isinstance(a, str):
    return "computes a value from its size"
  try:
    x, y = evaluate(u), evaluate(v)
  except InvalidValueError as e:
    # (constant indices past a table's end at a position the range reaches: batch_dims.rows_past_indices)
    return f"reads a table past its end at a size in the range ({e})"
  common = tuple(slice(0, min(x.shape[i], y.shape[i])) if i in a else slice(None) for i in range(y.ndim))
  if x.ndim == y.ndim and np.array_equal(x[common], y[common], x.dtype.kind in "fc"):
    return None
  return "computes a value from its size"


def _at_run_size(u: UOp, v: UOp, p2: int, dim: RunDim, means: dict[float, int], sizes: _DimSizes) -> UOp | None:
  """A mean's 1/count over the dim, or over an axis windows derive from it (a constant, broadcast), as computed from
  the run's size n_: 1 / (the axis' form at n_ x the count's other factors), the constant a static compile folds at
  that size; None for any other constant."""
  from aot.core.interpret import evaluate

  if not u.dtype.is_float or u.shape != v.shape:
    return None
  x, y = evaluate(u), evaluate(v)
  if x.size == 0 or np.any(x != x.flat[0]) or np.any(y != y.flat[0]):
    return None
  count = means.get(float(np.float32(x.flat[0])))
  for size, form in sizes.forms.items() if count else ():
    other = count // size
    if count % size == 0 and math.isclose(float(y.flat[0]) * other * form.at(p2), 1.0, rel_tol=1e-6):
      at_run = Tensor(size_uop(form, size_var(dim)) * other).cast(u.dtype)
      return (Tensor(1.0, u.dtype) / at_run).reshape((1,) * len(u.shape)).expand(u.shape).uop
  return None


def _same_steps_walked(at1: SizeTrace, at2: SizeTrace) -> None:
  """A recurrence with as many steps at both sizes (over another axis than the dim) is built the same at both: its
  nodes are walked as the graph's others, not taken whole."""
  for r1, r2 in zip(dict.fromkeys(at1.recurrences.values()), dict.fromkeys(at2.recurrences.values())):
    if r1.source.shape[0] == r2.source.shape[0]:
      for at, r in ((at1, r1), (at2, r2)):
        at.inside -= r.steps
        at.recurrent -= r.steps
        at.recurrences = {o: x for o, x in at.recurrences.items() if x is not r}


def _recurrence(r: Recurrence, out: UOp, a, source_axes) -> str | None:
  """Why an output of a recurrence (batch_dims.note_recurrence) cannot be computed at the run's length, if it cannot:
  its steps must be the dim's positions, Y's too, a final state has none, and each step's time must be known
  (sequence_lens masks steps by a length of the bound's)."""
  if r.masked:
    return "masks its steps by sequence_lens, which takes no range of their count in this version"
  if source_axes != (0,) or a != ((0,) if out is r.y else ()):
    return "runs a recurrence along another axis than the dim, or along it and another"
  return None


def _reversed_at_run(x: UOp, form: DimSize, dim: RunDim) -> UOp:
  """x's first axis (the bound's L positions) reversed as the run's first form(n) ones: position i reads form(n) - 1
  - i (positions past form(n) are not computed at the run)."""
  last = Tensor(size_uop(form, size_var(dim)) + (-1)).cast(dtypes.int64)
  return Tensor(x).take(last - Tensor(np.arange(x.shape[0], dtype=np.int64)), axis=0).uop


def _same_arg(u: UOp, v: UOp, a, srcs: list, dim: RunDim) -> str | None:
  return (
    None
    if (repr(u.arg) if u.op is Ops.CONST else u.arg) == (repr(v.arg) if v.op is Ops.CONST else v.arg)
    else ("computes a value from its size")
  )


def _fine(u: UOp, v: UOp, a, srcs: list, dim: RunDim) -> str | None:
  return None


def _reshape(u: UOp, v: UOp, a, srcs: list, dim: RunDim) -> str | None:
  """The dim stays an axis of its own: as many dim axes, each with the same elements after it."""
  (sa,) = srcs
  inner = lambda shape, axes: [math.prod(shape[i + 1 :]) for i in axes]
  if len(sa) != len(a) or inner(u.src[0].shape, sa) != inner(u.shape, a):
    return "reshapes it into other dims"
  return None


def _expand(u: UOp, v: UOp, a, srcs: list, dim: RunDim) -> str | None:
  (sa,) = srcs
  return None if set(sa) <= set(a) else "reshapes it into other dims"


def _window(u: UOp, v: UOp, a, srcs: list, dim: RunDim) -> str | None:
  """PAD none along the dim; SHRINK keeps it whole, or takes a prefix: of a constant's axis (a position table) to
  the dim's size, or of the dim to a size every run has (the first token)."""
  (sa,) = srcs
  if u.op is Ops.PAD:
    # (along the dim: its bounds are compared with the run's size, aot/scheduler/runtime_extent.py)
    return _same_arg(u, v, a, srcs, dim)
  for i, ((lo, hi), (lo2, hi2)) in enumerate(zip(u.arg, v.arg)):
    if i in sa and i in a and (lo, lo2) == (0, 0):
      continue
    if i in sa and i not in a and (lo, hi) == (lo2, hi2) and lo == 0 and hi <= dim.lo:
      continue
    if i in a and i not in sa and lo == lo2 == 0:
      continue
    if (lo, hi) != (lo2, hi2) or i in sa:
      return "slices it"
  return None


def _flip(u: UOp, v: UOp, a, srcs: list, dim: RunDim) -> str | None:
  (sa,) = srcs
  return "reverses it" if set(sa) & set(u.arg) else _same_arg(u, v, a, srcs, dim)


def _gather(u: UOp, v: UOp, a, srcs: list, dim: RunDim) -> str | None:
  along = u.arg if len(u.src) == 2 else u.arg[0]
  if along in srcs[0]:
    return "gathers along it"
  # (a checked gather's arg holds its indices' shape: the axis is what must agree)
  return None if along == (v.arg if len(v.src) == 2 else v.arg[0]) else "computes a value from its size"


# per op: why it would not keep positions along the dim (None: it does). An elementwise op's sources all have its
# shape; a reduction over the dim runs its loop to the run's size
_RULES: dict[Ops, Callable] = {
  **{op: _fine for op in GroupOp.ALU - {Ops.CONST} | {Ops.CAST, Ops.BITCAST, Ops.CONTIGUOUS}},
  Ops.EXPAND: _expand,
  Ops.PERMUTE: _same_arg,
  Ops.RESHAPE: _reshape,
  Ops.PAD: _window,
  Ops.SHRINK: _window,
  Ops.REDUCE: _same_arg,
  Ops.FLIP: _flip,
  Ops.GATHER: _gather,
  Ops.BUFFER: _fine,
  Ops.PARAM: _fine,
  Ops.CALL: _same_arg,
  Ops.FUNCTION: _same_arg,
  Ops.SINK: _fine,
}


def _io_axes(dim: RunDim, t: Traced, axes: dict, side: str, staged: bool) -> tuple[int, ...]:
  """Each input's or output's dim axis (-1 where it has none): at most one, with only dims of size 1 before it (its
  first n rows are then the layout's at the bound)."""
  out = []
  for i, u in enumerate(t.inputs if side == "input" else t.outputs):
    a = axes.get(u, ())
    name = u.arg.name if side == "input" else (t.output_names or [f"output {i}"] * (i + 1))[i]
    if len(a) > 1 or (a and not staged and blocks_before(u.shape, a[0]) != 1):
      before = "" if staged else ", with only dims of size 1 before it where another dim has a range"
      raise CompileError(
        f"dim '{dim.name}' cannot have a range: {side} '{name}' has it as axis {', '.join(map(str, a))} of "
        f"{len(u.shape)}: a dim that varies at run time may be one axis of an input or output{before}, in this "
        "version"
      )
    out.append(a[0] if a else -1)
  return tuple(out)
