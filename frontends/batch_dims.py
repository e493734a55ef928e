"""A dim with a range (--shape batch=1..64): the artifact takes any size in it, as that many runs of the program traced
at size 1, each on its own item of every input and output that has the dim (codegen/render/run_dims.py's
NAME_run_dims). That is only right for a batch dim: one that no op mixes, so that each item's outputs depend on that
item alone, by the same computation. It is proved here, before anything is built, on the graph traced at two sizes
(two primes no other dim has): a node's batch axis is the one whose size is the batch size in both, and every node
keeps items apart by its op's rule (_RULES); a constant may depend on the size only as a broadcast along its batch
axis. A dim that some op mixes (a sequence under attention) may still run to its size in loops laid out at a bound
(frontends/extent_dims.py), which names the first node it cannot take. Two ranged dims: a batch dim run item by item,
and the other run to its size in each item's program."""

from __future__ import annotations

import math
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import onnx

from aot.core.dtype import dtypes
from aot.core.ir import GroupOp, Ops, UOp
from aot.dim_size import DimSize
from aot.errors import CompileError, InternalError
from aot.frontends.winograd import direct_convolutions
from aot.options import DimRange
from aot.scheduler.kernel import StepGuard, Traced

# sizes the graph is traced at to find each node's batch axis: primes, so that no product of other dims is one by
# chance; the two smallest that no dim of the one-item graph has are taken
PROBE_SIZES = (7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53)


@dataclass(frozen=True)
class RunDim:
  """A dim given a range: its name (the dim_param, else input[axis]) and its bounds."""

  name: str
  lo: int
  hi: int


@dataclass(frozen=True)
class BatchDim:
  """How an artifact runs its ranged dim: per C API input and output, the axis the dim is (-1: one without it), every
  dim before it 1. runs "items": the program traced at size 1 runs once per item (this module); "extent": the program
  traced at bound, its loops over the dim run to the run's size (frontends/extent_dims.py)."""

  dim: RunDim
  inputs: tuple[int, ...]
  outputs: tuple[int, ...]
  runs: str = "items"
  bound: int = 0
  # runs "extent": each size of its axes at the bound -> its form in the run's size (the dim's own, and those pads
  # and windows derive from it: aot/dim_size.py), and the constants a pad's bounds are compared with -> theirs
  sizes: tuple[tuple[int, DimSize], ...] = ()
  gates: tuple[tuple[int, DimSize | None], ...] = ()

  def size_at(self, bound_size: int) -> DimSize | None:
    """The form of an axis of this size at the bound, if it is one of the dim's."""
    return dict(self.sizes).get(bound_size)

  def axis_form(self, size: int) -> DimSize:
    """The form of an input's or output's axis of the dim, of this size in the program: the dim itself where items
    run one by one, else that size's at the bound (windows may have derived it)."""
    return self.size_at(size) if self.runs == "extent" else DimSize()


def ranged_dims(shapes: dict | None, graph: onnx.GraphProto) -> tuple[list[RunDim], Callable[[dict], dict]]:
  """The dims shapes gives a range to (at most two) and shapes with them pinned to sizes (by name). A range is a
  dim_param's (batch=(1, 64), --shape batch=1..64) or one input dim's (x=((1, 8), 3, 224, 224), --shape
  x=1..8x3x224x224)."""
  shapes = dict(shapes or {})
  inputs = {vi.name: vi for vi in graph.input}
  found: dict[str, tuple[int, int]] = {}
  where: dict[str, list] = {}  # dim name -> (key, axis or None) of each place that gave it a range
  for key, value in shapes.items():
    tensor = key in inputs and inputs[key].type.HasField("tensor_type")
    if key in inputs and not tensor:
      continue
    if tensor and isinstance(value, (tuple, list)) and not isinstance(value, DimRange):
      dims = inputs[key].type.tensor_type.shape.dim
      for axis, d in enumerate(value):
        if _is_range(d):
          param = dims[axis].dim_param if axis < len(dims) else ""
          name = param or f"{key}[{axis}]"
          found.setdefault(name, _bounds(d, f"input '{key}' dim {axis}"))
          where.setdefault(name, []).append((key, axis))
    elif tensor and isinstance(value, DimRange):
      found.setdefault(key + "[0]", _bounds(value, f"input '{key}'"))
      where.setdefault(key + "[0]", []).append((key, 0))
    elif key not in inputs and _is_range(value):
      found.setdefault(key, _bounds(value, f"dim '{key}'"))
      where.setdefault(key, []).append((key, None))
  # a range of one size is that size: the artifact is static
  fixed = {n for n, (lo, hi) in found.items() if lo == hi}
  if len(found) - len(fixed) > 2:
    raise CompileError(
      f"dims {', '.join(repr(n) for n in found if n not in fixed)} are given ranges: an artifact takes two dims with "
      "a range in this version (a batch and one other); pin the others to a size (--shape NAME=N)"
    )
  ranged = [RunDim(n, lo, hi) for n, (lo, hi) in found.items() if n not in fixed]

  def pinned(sizes: dict) -> dict:
    out = dict(shapes)
    for name, places in where.items():
      n = found[name][0] if name in fixed else sizes[name]
      for key, axis in places:
        if axis is None:
          out[key] = n
        elif isinstance(shapes[key], DimRange):
          out[key] = (n,)
        else:
          out[key] = tuple(n if i == axis else d for i, d in enumerate(out[key]))
        # the dim_param a per-input range names holds the same size in every input that has it
        if axis is not None and not name.endswith("]"):
          out.setdefault(name, n)
    return out

  return ranged, pinned


def _is_range(d) -> bool:
  return isinstance(d, DimRange) or (
    isinstance(d, (tuple, list)) and len(d) == 2 and all(isinstance(x, (int, np.integer)) for x in d)
  )


def _bounds(d, what: str) -> tuple[int, int]:
  lo, hi = int(d[0]), int(d[1])
  if lo < 1 or hi < lo:
    raise CompileError(f"{what}: the range {lo}..{hi} is not one: it needs 1 <= low <= high")
  return lo, hi


def trace_batched(src, shapes: dict | None, bind: dict | None, name: str | None, trace) -> Traced:
  """The model traced at size 1 of its batch dim, with how the artifact runs it (Traced.batch), once proved one, or
  at the bound of a dim some op mixes (Traced.extent), or both; without a range, the model traced as it is. trace:
  frontends/onnx.py's trace_onnx, src its LoadedOnnx."""
  if not any(_is_range(v) or isinstance(v, tuple) and any(map(_is_range, v)) for v in (shapes or {}).values()):
    return trace(src, shapes, bind, name)
  graph = src.model.graph
  dims, pinned = ranged_dims(shapes, graph)
  if not dims:
    return trace(src, pinned({}), bind, name)
  declared = {d.dim_value for vi in graph.input for d in vi.type.tensor_type.shape.dim}
  declared |= {d for init in graph.initializer for d in init.dims}
  probes = [p for p in PROBE_SIZES if p not in declared]
  # (a range above the probes': a prime inside it too, where windows along the dim fit: _trace_one)
  probes += [p for d in dims if (p := _prime_in(d.lo, d.hi, declared)) is not None and p not in probes]
  if len(dims) == 2:
    item = _trace_two(src, dims, pinned, bind, name, trace, probes)
    dim = item.batch.dim
  else:
    (dim,) = dims
    item = _trace_one(src, dim, lambda n: pinned({dim.name: n}), bind, name, trace, probes)
    if item.batch is None:
      return item
  names = [u.arg.name for u, a in zip(item.inputs, item.batch.inputs) if a >= 0]
  names += [n for n, a in zip(item.output_names or [], item.batch.outputs) if a >= 0]
  # a sequence's tensors and a narrow type's packed codes are not laid out item after item
  if item.containers or any(n in (item.formats or {}) for n in names):
    what = "sequence or optional inputs or outputs" if item.containers else "inputs or outputs of a narrow type"
    raise CompileError(f"dim '{dim.name}' cannot have a range: the model has {what}, which take no range yet")
  return item


def _prime_in(lo: int, hi: int, declared: set[int]) -> int | None:
  from aot.frontends.extent_dims import _is_prime

  return next((p for p in range(max(lo, 2), hi) if _is_prime(p) and p not in declared), None)


def _trace_one(src, dim: RunDim, pinned, bind, name, trace, probes: list[int]) -> Traced:
  """One ranged dim: the item program with its BatchDim (traced at size 1) where it is a batch dim, else the program
  at the bound with its extent (Traced.extent: frontends/extent_dims.py). The probes: a small prime no declared dim
  has, and the bound an extent would be laid out at (a prime >= the range's top dividing no size of the first
  probe's graph), which is then the program a dim some op mixes runs."""
  from aot.frontends.extent_dims import OtherBound, bound_size, prove_extent_dim

  # (a size in the range where there is one: windows along the dim may not fit below it)
  b1, labels, bound_labels = next((p for p in probes if dim.lo <= p < dim.hi), probes[0]), [], []
  with _at_size(dim, b1) as probe:
    t1 = trace(src, pinned(b1), bind, name, produced=labels)
  taken = {s for u in _walk(t1) for s in u.shape} | {b1}
  b2 = bound_size(dim.hi, taken)
  with _at_size(dim, b2) as at:
    t2 = trace(src, pinned(b2), bind, name, produced=bound_labels)
  try:
    batch = prove_batch_dim(dim, t1, t2, b1, b2, labels)
  except CompileError:
    if probe.winograd or at.winograd:
      # (the proof of a dim run in loops takes windows whole, not Winograd's tiles)
      with direct_convolutions():
        return _trace_one(src, dim, pinned, bind, name, trace, probes)
    # a dim some op mixes may still run to a size given at run time, in loops laid out at its bound
    try:
      t2.extent = prove_extent_dim(dim, t2, t1, b2, b1, bound_labels, at, probe)
    except OtherBound as e:
      # (windows along it: their sizes and reach at the bound depend on which bound; the next one that fits)
      if (b2 := bound_size(b2 + 1, taken, e.unfit)) is None:
        raise
      bound_labels = []
      with _at_size(dim, b2) as at:
        t2 = trace(src, pinned(b2), bind, name, produced=bound_labels)
      t2.extent = prove_extent_dim(dim, t2, t1, b2, b1, bound_labels, at, probe)
    return t2
  with _at_size(dim, 1) as one:
    one.items = True
    item = trace(src, pinned(1), bind, name)
  item.batch = batch
  _check_one_item(dim, item, t1, labels)
  return item


def _trace_two(src, dims: list[RunDim], pinned, bind, name, trace, probes: list[int]) -> Traced:
  """Two ranged dims: one a batch dim, run item by item, the other run to its size in each item's program (traced at
  item size 1 and the other's bound): each way round until one is proved, else a refusal: what the run-time size
  cannot take, where a way got that far (the other way's, that the sequence mixes its items, says less)."""
  with direct_convolutions():  # (the extent's proof takes windows whole, not Winograd's tiles)
    return _trace_two_ways(src, dims, pinned, bind, name, trace, probes)


def _trace_two_ways(src, dims: list[RunDim], pinned, bind, name, trace, probes: list[int]) -> Traced:
  from aot.frontends.extent_dims import bound_size, prove_extent_dim

  refusals: list[CompileError] = []
  for items, ext in (dims, dims[::-1]):
    b0, b1, b2 = probes[:3]
    with _at_size(ext, b0) as probe_at:
      probe = trace(src, pinned({items.name: 1, ext.name: b0}), bind, name)
    bound = bound_size(ext.hi, {s for u in _walk(probe) for s in u.shape} | {b0, b1, b2})
    item_labels, labels = [], []
    with _at_size(ext, bound) as at:
      item = trace(src, pinned({items.name: 1, ext.name: bound}), bind, name, produced=item_labels)
    try:
      item.extent = prove_extent_dim(ext, item, probe, bound, b0, item_labels, at, probe_at, staged=False)
    except CompileError as e:
      refusals.insert(0, e)
      continue
    try:
      # (the extent still at its bound: its tables padded as in the item's program)
      with _above(ext, bound), _at_size(items, b1):
        t1 = trace(src, pinned({items.name: b1, ext.name: bound}), bind, name, produced=labels)
      with _above(ext, bound), _at_size(items, b2):
        t2 = trace(src, pinned({items.name: b2, ext.name: bound}), bind, name)
      item.batch = prove_batch_dim(items, t1, t2, b1, b2, labels)
    except CompileError as e:
      refusals.append(e)
      continue
    _check_one_item(items, item, t1, labels)
    return item
  raise refusals[0]


@dataclass
class AboveRange:
  """A ranged dim while the graph is traced at a size at or above its range's top (its bound): the top, and the means
  the trace took over the dim (note_mean)."""

  top: int
  means: dict[float, int] = field(default_factory=dict)  # a mean's 1/count (as float32) -> count


@dataclass
class SizeTrace:
  """What the graph traced at a size of a ranged dim noted: above, where the size is at or above the range's top, and
  the windows it built (note_windows)."""

  above: AboveRange | None
  windows: dict[UOp, Windows] = field(default_factory=dict)  # by the windows' output
  inside: set[UOp] = field(default_factory=set)  # the nodes they are built of, between source and output
  winograd: bool = False  # a convolution was traced as Winograd's tiles (frontends/winograd.py)
  recurrences: dict[UOp, Recurrence] = field(default_factory=dict)  # by the recurrence's output (note_recurrence)
  recurrent: set[UOp] = field(default_factory=set)  # the nodes of their steps (in inside too)
  # the program a batch dim's items run (traced at one item): a recurrence there is a static compile's
  items: bool = False


@dataclass(frozen=True)
class Windows:
  """Sliding windows over a tensor's last axes (frontends/tensor_nn.py _windows): the tensor, and per window axis its
  kernel, stride and dilation; the output is (..., O1..On, K1..Kn), window (o, k) reading element o*s + k*d."""

  source: UOp
  kernel: tuple[int, ...]
  stride: tuple[int, ...]
  dilation: tuple[int, ...]


@dataclass(frozen=True)
class Recurrence:
  """A recurrence unrolled over the first axis of its source (frontends/onnx_ops_rnn.py _run_steps), its output
  (T, ...) by step: the reversals of that axis its backward direction makes (of the source, and of its outputs back
  into time order), the sizes its steps have besides T, the positions its steps are placed at along that axis
  (their pads' bounds, the same at every length: a kernel compares a position there), and whether sequence_lens masks
  its steps."""

  source: UOp
  y: UOp  # its output by step (its other outputs: the final state's parts, one value each)
  steps: frozenset[UOp]
  flips: tuple[UOp, ...]
  static: frozenset[int]
  positions: frozenset[int]
  masked: bool


# the ranged dims traced at or above their range's top, by the size they are traced at
_ABOVE_RANGE: ContextVar[dict[int, AboveRange] | None] = ContextVar("above_range", default=None)
# set while the graph is traced at a size of a ranged dim (_at_size)
_FOR_RANGE: ContextVar[SizeTrace | None] = ContextVar("for_range", default=None)


def tracing_for_range() -> bool:
  """Is the graph being traced at a size of a ranged dim? Its form must then not depend on the size (a reduction over
  a whole tensor is not cut into parts by its length: frontends/onnx_ops_quant.py _whole)."""
  return _FOR_RANGE.get() is not None


def recurrence_at_run() -> bool:
  """Is a recurrence traced now to run as many steps as a call has (frontends/onnx_ops_rnn.py _run_steps)? While the
  graph is traced at a size of a ranged dim, but for the program a batch dim's items run: that one unrolls it as a
  static compile does (its kernels a static compile's)."""
  return (at := _FOR_RANGE.get()) is not None and not at.items


def rows_past_table(start: int, end: int, step: int, rows: int) -> int:
  """How many rows to add to a constant table of rows sliced [start:end:step] while the graph is traced at its
  range's bound: a table of at least the range's top rows (BERT's 512 positions under sequence=1..512) sliced from 0
  to the size reads no row past the top at any size the artifact runs, but stops short of the bound; 0 otherwise."""
  above = (_ABOVE_RANGE.get() or {}).get(end)
  return end - rows if above and (start, step) == (0, 1) and above.top <= rows < end else 0


def rows_past_indices(indices: np.ndarray, rows: int) -> int:
  """How many rows to add to a constant table of rows gathered at these constant indices while the graph is traced at
  its range's bound: a table of at least the range's top rows gathered at an arange of the size (GPT-2's positions)
  reads past its end only at positions past the top along the dim (an axis of the bound's size), which no size the
  artifact runs computes; 0 otherwise (a bad index is the model's error)."""
  # (a scalar index has no axis of the bound's size)
  past = np.nonzero(indices >= rows) if indices.ndim else ()
  if not past or not past[0].size:
    return 0
  beyond_top = np.zeros(past[0].size, bool)
  for bound, above in (_ABOVE_RANGE.get() or {}).items():
    if rows < above.top or int(indices.max()) >= rows + bound:
      continue
    for axis, at in enumerate(past):
      if indices.shape[axis] == bound:
        beyond_top |= at >= above.top
  return int(indices.max()) + 1 - rows if beyond_top.all() else 0


def tracing_above_range() -> bool:
  """Is the graph being traced at a range's bound (where rows_past_table and rows_past_indices may pad)?"""
  return bool(_ABOVE_RANGE.get())


def note_windows(windows: Windows, out: UOp) -> None:
  """Windows built while the graph is traced at a size of a ranged dim: the movement ops they are made of merge the
  axis with copies of itself (a trick of index arithmetic whose steps depend on the size), which the proof takes
  whole, as one op, from windows.source to out (frontends/extent_dims.py)."""
  if (at := _FOR_RANGE.get()) is None:
    return
  todo = list(out.src)
  while todo:
    if (u := todo.pop()) is not windows.source and u not in at.inside:
      at.inside.add(u)
      todo += u.src
  at.windows[out] = windows


def note_recurrence(source: UOp, outs: list[UOp], given: list[UOp], masked: bool) -> None:
  """A recurrence unrolled while the graph is traced at a size of a ranged dim: its steps are as many as the first
  axis of source, so its graph depends on the size; the proof takes it whole, as one op from source to its outputs
  (Y by step, then the final state's parts) (given: its other inputs, weights and initial state, which are the
  graph's nodes, not its own)."""
  if (at := _FOR_RANGE.get()) is None:
    return
  T, stops = source.shape[0], {source, *given}
  sink = UOp(Ops.SINK, dtypes.void, tuple(outs))
  order = sink.toposort(stop=lambda u: u in stops)
  steps = set(order) - stops - {sink, *outs}
  at.inside |= steps
  at.recurrent |= steps
  stages = [u for u in steps if u.op is Ops.CONTIGUOUS and isinstance(u.arg, StepGuard)]
  static = {s for u in steps for s in u.shape if s != T} | {s for u in stages for s in u.shape}
  # (sources first: a reversal of Y reads the steps, which read the source's reversal)
  flips = tuple(u for u in order if u in steps and u.op is Ops.FLIP and u.arg == (0,) and u.shape[0] == T)
  pads = [u for u in steps if u.op is Ops.PAD and u.shape[0] == T and u.arg[0][0] != (0, 0)]
  positions = {x for u in pads for x in (u.arg[0][0][0], u.arg[0][0][0] + u.src[0].shape[0])}
  rec = Recurrence(source, outs[0], frozenset(steps), flips, frozenset(static), frozenset(positions), masked)
  at.recurrences |= dict.fromkeys(outs, rec)


def note_winograd() -> None:
  """A convolution traced as Winograd's tiles while the graph is traced at a size of a ranged dim."""
  if (at := _FOR_RANGE.get()) is not None:
    at.winograd = True


def note_mean(count: int) -> None:
  """A mean over count elements (its 1/count a constant in the graph) while the graph is traced above a range: over
  the dim, or an axis windows derive from it, it divides by that size at the run (frontends/extent_dims.py
  _at_run_size)."""
  for above in (_ABOVE_RANGE.get() or {}).values():
    above.means[float(np.float32(1.0 / count))] = count


@contextmanager
def _above(dim: RunDim, size: int):
  """The graph traced at this size of dim: an AboveRange while that is the range's top or above (its bound may be the
  top itself, a prime), else None."""
  above = AboveRange(dim.hi) if size >= dim.hi else None
  token = _ABOVE_RANGE.set({**(_ABOVE_RANGE.get() or {}), size: above} if above else _ABOVE_RANGE.get())
  try:
    yield above
  finally:
    _ABOVE_RANGE.reset(token)


@contextmanager
def _at_size(dim: RunDim, size: int):
  """A model that does not trace at a size of its ranged dim cannot take the range (a shape the exporter wrote as a
  constant: a Reshape to batch 1). A size above the range is its bound (frontends/extent_dims.py bound_size): a
  table of fewer rows than the bound is padded to it where it is sliced to the size (rows_past_table). Yields _above's
  SizeTrace."""
  at = SizeTrace(None)
  token = _FOR_RANGE.set(at)
  try:
    with _above(dim, size) as above:
      at.above = above
      yield at
  except (CompileError, InternalError) as e:
    bound = (
      f" ({size} is the size the range is laid out at: the smallest >= {dim.hi} that no other dim's size is a "
      "multiple of)"
      if size > dim.hi
      else ""
    )
    raise CompileError(
      f"dim '{dim.name}' cannot have a range: the model does not compile at size {size} of it{bound}: {e}"
    )
  finally:
    _FOR_RANGE.reset(token)


def prove_batch_dim(dim: RunDim, t1: Traced, t2: Traced, b1: int, b2: int, labels: list) -> BatchDim:
  """The inputs' and outputs' batch axes, once every node of the graph traced at b1 (t1) and at b2 (t2) is shown to
  keep the items of dim apart; else a CompileError naming the node (labels: the ONNX nodes' outputs in t1, in order)."""
  axis: dict[UOp, int | None] = {}
  # per node with a batch axis: how far apart along it one item's element is from the next item's (_step)
  step: dict[UOp, int | None] = {}
  differs: dict[UOp, UOp] = {}
  for u, v, constant in in_step(dim, t1, t2, differs, labels=labels):
    axis[u] = a = _batch_axis(u.shape, v.shape, b1, b2)
    if constant:
      continue
    srcs = _sources(u)
    why = next((w for s in srcs if s in differs and (w := _same_values(s, differs[s], axis[s]))), None)
    if why is None and a in ("merged", "paired"):
      why = "merges it with another dim" if a == "merged" else "pairs its items with one another (two axes of it)"
    elif why is None:
      # (a constant's values are the same along an axis of the batch's size it was broadcast to: none of the items')
      src_axes = [None if isinstance(axis[s], str) else axis[s] for s in srcs]
      why = _RULES.get(u.op, _same_arg)(u, v, a, src_axes)
    if why is None and a is not None:
      step[u] = _step(u, a, [(sa, step.get(s)) for sa, s in zip(src_axes, srcs)], b1)
      why = step[u] if isinstance(step[u], str) else None
    if why:
      raise CompileError(
        f"dim '{dim.name}' cannot have a range: {_node_of(u, labels)} {why}, so items of it do not run apart; "
        f"only a batch dim (one no op mixes) can vary at run time in this version: pin it (--shape {dim.name}=N)"
      )
  inputs = _io_axes(dim, t1, axis, step, "input", b1)
  if all(a < 0 for a in inputs):
    raise CompileError(f"dim '{dim.name}' is given a range, but no input has it")
  return BatchDim(dim, inputs, _io_axes(dim, t1, axis, step, "output", b1))


def in_step(
  dim: RunDim, t1: Traced, t2: Traced, differs: dict, skip: tuple[set, set] = (set(), set()), labels: list = ()
):
  """The nodes of t1 and t2 in step, each with whether it is a constant (or computed from constants alone); those
  whose values differ between the sizes (a Shape's output, and what is computed from it) go to differs (by t1's
  node), to be checked where they meet the inputs' data, by value. The graphs must be the same at both sizes, but for
  the nodes skipped in each (the steps of windows, which depend on the size: SizeTrace.inside); else a CompileError
  naming the first node built otherwise (labels: t1's, as prove_batch_dim takes them)."""
  n1, n2 = _walk(t1), [v for v in _walk(t2) if v not in skip[1]]
  kept = [u for u in n1 if u not in skip[0]]
  if len(kept) != len(n2) or any(u.op is not v.op for u, v in zip(kept, n2)):
    at = next((i for i, (u, v) in enumerate(zip(kept, n2)) if u.op is not v.op), min(len(kept), len(n2)) - 1)
    raise CompileError(
      f"dim '{dim.name}' cannot have a range: the model's graph is not the same at every size of it: "
      f"{_node_of(kept[at], labels)} is built otherwise at another size (a recurrence over the dim is unrolled "
      f"over its steps, one per position); pin it (--shape {dim.name}=N)"
    )
  const: set[UOp] = set()
  varied: set[UOp] = set()  # skipped constants computed from one that differs
  step = dict(zip(kept, n2))
  for u in n1:
    constant = _is_constant(u, const)
    from_differing = any(s in differs or s in varied for s in _sources(u))
    if u in skip[0]:
      if constant:
        const.add(u)
        varied |= {u} if from_differing else set()
      continue
    v = step[u]
    if constant:
      const.add(u)
      # (an expand's shape differs by the size: it broadcasts the same values)
      if from_differing or (u.op is not Ops.EXPAND and _leaf_differs(u, v)):
        differs[u] = v
    yield u, v, constant


def _check_one_item(dim: RunDim, item: Traced, t1: Traced, labels: list) -> None:
  """Each output of the program the items run (traced at size 1) must be the probes' at one item: their shape with
  the batch axis 1. A graph whose outputs change at size 1 (a Squeeze without axes drops the dim there, and the
  output's rank with it, as onnxruntime's does) cannot take the range: its output was described at the probes' rank
  and written at the item's (past its buffer). Nodes inside may differ (an expand or reshape to the same shape is no
  node at size 1); an op reading an axis by number behind such a drop changes an output's shape with it."""
  names = item.output_names or [""] * len(item.outputs)
  # (an output's batch axis, item.batch's, is the probe's size there, its items one after another: _io_axes)
  for u, v, a, name in zip(item.outputs, t1.outputs, item.batch.outputs, names):
    one = tuple(1 if i == a else s for i, s in enumerate(v.shape))
    if u.shape != one:
      raise CompileError(
        f"dim '{dim.name}' cannot have a range: output '{name}' is {u.shape} at size 1 of it, not {one}: the "
        f"model changes shape there ({_node_of(v, labels)}; a Squeeze without axes drops a dim of size 1); pin it "
        f"(--shape {dim.name}=N), or give the Squeeze its axes"
      )


def _is_constant(u: UOp, const: set) -> bool:
  if u.op in (Ops.CONST, Ops.PARAM):
    return u.op is Ops.CONST  # (a function's parameter takes its call's argument: not known constant)
  if u.op is Ops.BUFFER:
    return u.arg.kind == "const"
  return bool(u.src) and all(s in const for s in _sources(u))


def _leaf_differs(u: UOp, v: UOp) -> bool:
  """Does a constant hold other values at the other size (a leaf's values, a node's arguments: a shape)?"""
  if u.op is Ops.BUFFER:
    if u.arg is v.arg:
      return False
    # (every constant compared, weights too: one the frontend folded from the batch size has a weight's size; a
    # comparison reads the weights twice, a fraction of a second for a GB, unless both traces hold the one array
    # the model's initializer was read into: frontends/onnx.py LoadedOnnx.arrays)
    x, y = u.arg.data.array, v.arg.data.array
    return x is not y and (x.shape != y.shape or not np.array_equal(x, y, x.dtype.kind in "fc"))
  return _arg(u) != _arg(v)


def _same_values(u: UOp, v: UOp, a) -> str | None:
  """A constant that differs between the sizes, where the inputs' data meets it: the same values at both, or
  along its batch axis the same slice at every item (ConstantOfShape of the input's shape); else why not."""
  from aot.core.interpret import evaluate

  if isinstance(a, str):
    return "computes a value from its size"
  x, y = evaluate(u), evaluate(v)
  if a is None:
    return None if np.array_equal(x, y, x.dtype.kind in "fc") else "computes a value from its size"
  k = math.gcd(x.shape[a], y.shape[a])
  x, y = (z.reshape(z.shape[:a] + (z.shape[a] // k, k) + z.shape[a + 1 :]) for z in (x, y))
  first = (slice(None),) * a + (slice(0, 1),)
  if np.array_equal(x, np.broadcast_to(x[first], x.shape)) and np.array_equal(x[first], y[first]):
    return None
  return "holds a constant that differs along it"


def _walk(t: Traced) -> list[UOp]:
  """t's nodes, sources first, without the index checks' sources: a check reduces over all of its indices, items
  too, and each item's run checks its own."""
  seen, order, stack = set(), [], [(u, False) for u in reversed(list(t.outputs) + list(t.inputs))]
  while stack:
    u, done = stack.pop()
    if done:
      order.append(u)
    elif u not in seen:
      seen.add(u)
      stack.append((u, True))
      stack.extend((s, False) for s in reversed(_sources(u)) if s not in seen)
  return order


def _sources(u: UOp) -> tuple:
  return u.src[:2] if u.op is Ops.GATHER else u.src


def _batch_axis(s1: tuple, s2: tuple, b1: int, b2: int):
  """The axis whose size is the batch size (times the same k) at both sizes; None if none is; "merged" if the shapes
  differ otherwise. An axis of k times the batch is made by a reshape, which _step follows (how far apart an item's
  elements are along it)."""
  if len(s1) != len(s2):
    return "merged"
  diff = [i for i, (x, y) in enumerate(zip(s1, s2)) if x != y]
  if not diff:
    return None
  (x, y) = (s1[diff[0]], s2[diff[0]])
  if len(diff) > 1:
    return "paired"
  if x % b1 or y % b2 or x // b1 != y // b2:
    return "merged"
  return diff[0]


def _same_arg(u: UOp, v: UOp, a, srcs: list) -> str | None:
  return None if _arg(u) == _arg(v) else "computes a value from its size"


def _arg(u: UOp):
  if u.op is Ops.CONST:
    return repr(u.arg)
  return u.arg


def _step(u: UOp, a: int, srcs: list, size: int) -> int | None | str:
  """How far apart along its batch axis a one item's element is from the next item's, in elements of the axis: 1 for
  an input's, k where each item holds k in a row (a Gather's flattened indices), and where the batch is an inner
  factor (torch's attention: (sequence, batch) merged) the item's place repeats every size * step. None: values the
  same at every item (a constant broadcast), which fit any. A string: why the node mixes the items."""
  if u.op is Ops.BUFFER:
    return 1
  if u.op is Ops.PARAM:
    return u.shape[a] // size  # (a function's parameters: checked at the call to hold whole items in a row)
  known = [(sa, k) for sa, k in srcs if sa is not None and k is not None]
  if u.op is Ops.RESHAPE:
    if not known:
      return None
    (sa, k), shape = known[0], u.src[0].shape
    # an item's place in the flat order: (flat // stride) % size, which a reshape keeps; it must fall on one axis
    stride, inner = k * math.prod(shape[sa + 1 :]), math.prod(u.shape[a + 1 :])
    if stride % inner or (u.shape[a] * inner) % (size * stride):
      return "reshapes it into other dims"
    return stride // inner
  if u.op is Ops.CALL:
    args = [(sa, k, s) for (sa, k), s in zip(srcs[1:], u.src[1:]) if sa is not None]
    if any(k is not None and k != s.shape[sa] // size for sa, k, s in args):
      return "passes it to a function with its items apart (unsupported)"
    return u.src[0].src[u.arg].shape[a] // size if args else None
  steps = {k for _, k in known}
  if len(steps) > 1:
    return "combines two layouts of it"
  return steps.pop() if steps else None


def _window(u: UOp, v: UOp, a, srcs: list) -> str | None:
  """PAD, SHRINK: the batch axis kept whole."""
  (s,) = srcs
  if s is None:
    return _same_arg(u, v, a, srcs)
  bounds = u.arg[0] if u.op is Ops.PAD else u.arg
  keep = (0, 0) if u.op is Ops.PAD else (0, u.src[0].shape[s])
  if a != s or tuple(bounds[s]) != keep:
    return "pads it" if u.op is Ops.PAD else "slices it"
  return None


def _axes_apart(u: UOp, v: UOp, a, srcs: list) -> str | None:
  """REDUCE, FLIP: the batch axis not among the op's axes."""
  (s,) = srcs
  axes = u.axes if u.op is Ops.REDUCE else u.arg
  if s is not None and s in axes:
    return "reduces over it" if u.op is Ops.REDUCE else "reverses it"
  return _same_arg(u, v, a, srcs)


def _gather(u: UOp, v: UOp, a, srcs: list) -> str | None:
  along = u.arg if len(u.src) == 2 else u.arg[0]
  if srcs[0] is not None and srcs[0] == along:
    return "gathers along it"
  return None if along == (v.arg if len(v.src) == 2 else v.arg[0]) else "computes a value from its size"


def _fine(u: UOp, v: UOp, a, srcs: list) -> str | None:
  return None


# per op: why it would mix the items of the batch axis (None: it does not). An elementwise op's sources all have its
# shape, so their batch axes are its own; a permute or expand moves or broadcasts the axis, never mixes it
_RULES: dict[Ops, Callable] = {
  **{op: _fine for op in GroupOp.ALU - {Ops.CONST} | {Ops.CAST, Ops.BITCAST, Ops.CONTIGUOUS, Ops.EXPAND}},
  Ops.PERMUTE: _same_arg,
  Ops.RESHAPE: _fine,  # (_step: whether the items' place in the flat order stays on one axis)
  Ops.PAD: _window,
  Ops.SHRINK: _window,
  Ops.REDUCE: _axes_apart,
  Ops.FLIP: _axes_apart,
  Ops.GATHER: _gather,
  Ops.BUFFER: _fine,
  # a function's body is walked node by node: its parameters take the shapes of the calls' arguments
  Ops.PARAM: _fine,
  Ops.CALL: _same_arg,
  Ops.FUNCTION: _same_arg,
  Ops.SINK: _fine,
}


def _node_of(u: UOp, labels: list) -> str:
  """The first ONNX node whose outputs' graph holds u (labels: (node label, its output UOps) in the order traced)."""
  for label, outs in labels:
    if any(u is x or u in x.toposort() for x in outs):
      return label
  return "a node"


def _io_axes(dim: RunDim, t: Traced, axis: dict, step: dict, side: str, size: int) -> tuple[int, ...]:
  """Each input's or output's batch axis (-1 where it has none), checked to hold whole items one after another."""
  out = []
  for i, u in enumerate(t.inputs if side == "input" else t.outputs):
    a = axis.get(u)
    name = u.arg.name if side == "input" else (t.output_names or [f"output {i}"] * (i + 1))[i]
    if a is not None and math.prod(u.shape[:a]) != 1:
      raise CompileError(
        f"dim '{dim.name}' cannot have a range: it is axis {a} of {side} '{name}' (shape {_at1(u.shape, a)}), and "
        "its items are not one after another there: only dims of size 1 may come before it"
      )
    if a is not None and (u.shape[a] != size or step.get(u) not in (None, 1)):
      raise CompileError(f"dim '{dim.name}' cannot have a range: {side} '{name}' has it merged with another dim")
    out.append(-1 if a is None else a)
  return tuple(out)


def _at1(shape: tuple, a: int) -> tuple:
  return tuple("N" if i == a else s for i, s in enumerate(shape))
