"""The scheduler: a tensor graph becomes an ordered list of kernels (rangeify).

Order of passes, each a rule list: calls of functions whose results are stored are scheduled once (functions.py),
other calls inlined and constants folded (prepare) -> decide what is materialised
(stages) -> lower each stage to one kernel by pushing INDEX through the graph (movement ops become index arithmetic,
reduces become accumulators over new ranges) -> finalise (buffers become numbered params, so equal kernels are one UOp).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from aot.core.dtype import DType, dtypes
from aot.core.interpret import evaluate
from aot.core.ir import BufferArg, ConstData, GroupOp, IndexCheck, Ops, ReduceOp, UOp, file_mapping, prod
from aot.core.rewrite import PatternMatcher, UPat, graph_rewrite, substitute
from aot.core.symbolic import pm_simplify, simplify
from aot.errors import CompileError, InvalidTypeError, InvalidValueError, working_on
from aot.scheduler.functions import place_calls, renumbered, separate_calls
from aot.scheduler.kernel import Buffer, IndexCheckCall, Kernel, Schedule, StepGuard

# *** prepare: inline calls, fold constants ***


def inline_call(c: UOp) -> UOp:
  fn, args = c.src[0], c.src[1:]
  params = {p.arg[0]: p for p in fn.toposort() if p.op is Ops.PARAM}
  if len(params) > len(args):
    raise InvalidTypeError(f"{fn.arg}() expects {len(params)} arguments, got {len(args)}")
  for slot, p in params.items():
    a = args[slot]
    if a.shape != p.arg[1] or a.dtype != p.dtype:
      raise InvalidTypeError(
        f"{fn.arg}() argument '{p.arg[2]}': body expects shape {p.arg[1]} {p.dtype.name}, "
        f"got shape {a.shape} {a.dtype.name}"
      )
  return substitute(fn.src[c.arg], {p: args[slot] for slot, p in params.items()})


def _const_base(u: UOp) -> UOp | None:
  """The CONST or constant BUFFER under a chain of movement ops, else None."""
  while u.op in GroupOp.Movement:
    u = u.src[0]
  return u if u.op is Ops.CONST or (u.op is Ops.BUFFER and u.arg.kind == "const") else None


def _splat(u: UOp) -> bool:
  """Every element is the same scalar (a CONST seen through reshapes and expands)."""
  while u.op in (Ops.RESHAPE, Ops.EXPAND, Ops.PERMUTE, Ops.SHRINK, Ops.FLIP):
    u = u.src[0]
  return u.op is Ops.CONST


# folding must not blow a broadcast weight up into a huge constant: fold when the result is no bigger than this
# or than the constants it comes from
FOLD_MAX_ELEMENTS = 1 << 16


def fold_constant(x: UOp) -> UOp | None:
  bases = []
  for s in x.src:
    # (the first source that is not a constant ends it: tried on every node of the graph, twice)
    if (b := _const_base(s)) is None:
      return None
    bases.append(b)
  if x.op is not Ops.REDUCE and all(_splat(s) for s in x.src):
    v = evaluate(x.replace(src=tuple(b for b in bases)) if x.op is not Ops.GATHER else x).reshape(-1)
    if x.op is not Ops.GATHER:
      return UOp.const(x.dtype, v[0].item()).reshape((1,) * len(x.shape)).expand(x.shape)
  if x.numel > max([FOLD_MAX_ELEMENTS] + [b.numel for b in bases if b.op is Ops.BUFFER]):
    return None
  return _const_buffer(evaluate(x), x.dtype)


def _const_buffer(value: np.ndarray, dtype) -> UOp:
  # a movement of a memory-mapped weight stays a view of the map: a copy would hold every weight twice; and
  # ascontiguousarray makes a 0-d value 1-d, which made a folded scalar output shape (1,) (found by aot/tools/fuzz.py)
  arr = value if file_mapping(value) is not None else np.ascontiguousarray(value).reshape(np.shape(value))
  arr.flags.writeable = False
  return UOp(Ops.BUFFER, dtype, (), BufferArg("folded", arr.shape, "const", ConstData(arr)))


def _collapse_movement(x: UOp) -> UOp | None:
  s = x.src[0]
  if x.op is Ops.RESHAPE and s.op is Ops.RESHAPE:
    return s.src[0].reshape(x.arg)
  if x.op is Ops.PERMUTE and s.op is Ops.PERMUTE:
    return s.src[0].permute(tuple(s.arg[i] for i in x.arg))
  if x.op is Ops.EXPAND and s.op is Ops.EXPAND:
    return s.src[0].expand(x.arg)
  return None


# indices a gather's repeat pattern is looked for in, at most (evaluated at compile time)
REPEAT_GATHER_MAX_INDICES = 1 << 22


def _repeat_gather(x: UOp) -> UOp | None:
  """A gather by constant indices that repeat each position k times in order (0, 0, 1, 1, ...: a nearest upsample by
  k, Resize's) as movement ops: the kernels compute r // k rather than load an index table, clamp and wrap it, and the
  second axis' gather no longer reads the first at indices it cannot bound, which stored the first (YOLOv8's neck)."""
  if len(x.src) != 2 or _const_base(x.src[1]) is None or x.numel > REPEAT_GATHER_MAX_INDICES:
    return None
  data, axis = x.src[0], x.arg
  n, length = data.shape[axis], x.shape[axis]
  if n == 0 or length % n:
    return None
  along = [1] * len(x.shape)
  along[axis] = length
  if not np.array_equal(
    evaluate(x.src[1]), np.broadcast_to((np.arange(length) // (length // n)).reshape(along), x.shape)
  ):
    return None
  pre, post = data.shape[:axis], data.shape[axis + 1 :]
  return data.reshape(pre + (n, 1) + post).expand(pre + (n, length // n) + post).reshape(x.shape)


pm_prepare = PatternMatcher(
  [
    # a gather that repeats positions in order is a broadcast
    (UPat(Ops.GATHER, name="x"), _repeat_gather),
    # a call is its body with the parameters replaced by the arguments
    (UPat(Ops.CALL, name="c"), inline_call),
    # anything computed only from constants is computed now
    (UPat(GroupOp.Compute, name="x"), fold_constant),
    # two movement ops of one kind are one
    (UPat(GroupOp.Movement, name="x"), _collapse_movement),
    # a contiguous constant is already a buffer
    (UPat(Ops.CONTIGUOUS, src=(UPat(Ops.BUFFER, name="b"),)), lambda b: b),
    # weights are stored in the order they are read: a transposed constant (x @ w.T) is transposed now, for free
    (
      UPat(Ops.PERMUTE, src=(UPat(Ops.BUFFER, name="b"),), name="x"),
      lambda x, b: _const_buffer(evaluate(x), x.dtype) if b.arg.kind == "const" else None,
    ),
  ]
)

# *** lowering: INDEX pushed down a stage's graph until it reaches loads ***


class Lowering:
  def __init__(self, stages: dict[UOp, Buffer], keep: Lowering | None = None):
    self.stages = stages  # tensor node -> the buffer it is stored in
    self.pending: list[UOp] = []  # stages found while lowering, still to be lowered
    self.uses: dict[UOp, set] = {}  # computed node -> the INDEX nodes that read it (more than one: stage it)
    self.reads: list[tuple[UOp, UOp]] = []  # (computed node, INDEX) fused into the stage being lowered
    # kept from the previous round of staging, so that a kernel lowered then stays valid in this one: ranges stay
    # distinct, and a node keeps its buffer
    self.trip: dict[UOp, int] = keep.trip if keep else {}  # RANGE -> iterations of the loop nest down to it
    self.leaves: dict[UOp, Buffer] = keep.leaves if keep else {}
    self.nrange = keep.nrange if keep else 0
    self._ranges: dict[UOp, tuple] = keep._ranges if keep else {}
    self.buffers: dict[UOp, Buffer] = keep.buffers if keep else {}  # every node ever staged -> its scratch buffer
    # id(buffer) -> (node, store, reads, deps) of its last lowering
    self.lowered: dict[int, tuple] = keep.lowered if keep else {}
    # a stage's form (_form) -> its kernel as lowered for the first stage of that form
    self.templates: dict[UOp, Template] = keep.templates if keep else {}
    self.placeholders: dict[tuple, UOp] = keep.placeholders if keep else {}

  def new_range(self, size: int, kind: str, outer_trip: int) -> UOp:
    r = UOp(Ops.RANGE, dtypes.index, (), (self.nrange, size, kind))
    self.nrange += 1
    self.trip[r] = outer_trip * size
    return r

  def ranges_in(self, u: UOp) -> tuple:
    if (ret := self._ranges.get(u)) is None:
      self._ranges[u] = ret = tuple(r for r in u.toposort() if r.op is Ops.RANGE)
    return ret

  def trip_of(self, idxs) -> int:
    return max([1] + [self.trip[r] for i in idxs for r in self.ranges_in(i)])

  def stage(self, x: UOp) -> Buffer:
    if x not in self.stages:
      if x not in self.buffers:
        self.buffers[x] = Buffer("scratch", x.dtype, x.numel, shape=x.shape)
      self.stages[x] = self.buffers[x]
      self.pending.append(x)
    return self.stages[x]

  def buffer_of(self, b: UOp) -> Buffer:
    if b not in self.leaves:
      arg: BufferArg = b.arg
      self.leaves[b] = Buffer(
        arg.kind,
        b.dtype,
        prod(arg.shape),
        arg.name,
        shape=arg.shape,
        data=arg.data.array if arg.data is not None else None,
      )
    return self.leaves[b]


def make_index(x: UOp, gate: UOp, idxs, root: bool = False) -> UOp:
  return UOp(
    Ops.INDEX,
    x.dtype,
    (x, simplify(gate), *(simplify(i) if isinstance(i, UOp) else UOp.const(dtypes.index, i) for i in idxs)),
    "root" if root else None,
  )


def flat_index(idxs, shape) -> UOp:
  ret, stride = UOp.const(dtypes.index, 0), 1
  for i, s in reversed(list(zip(idxs, shape))):
    if s != 1:
      ret = ret + i * stride
    stride *= s
  return simplify(ret)


def load(buf: UOp, dtype: DType, idxs, shape, gate: UOp) -> UOp:
  return UOp(Ops.LOAD, dtype, (buf, flat_index(idxs, shape), gate))


def reshape_index(idxs, out_shape, in_shape) -> list:
  """Indices into in_shape for indices into out_shape, matched group by group (dims whose products agree) so that
  unrelated axes never meet in one division."""
  res, o, i = [], 0, 0
  zero = UOp.const(dtypes.index, 0)
  while i < len(in_shape):
    if in_shape[i] == 1:
      res.append(zero)
      i += 1
      continue
    while out_shape[o] == 1:
      o += 1
    og, ig, po, pi = [o], [i], out_shape[o], in_shape[i]
    o, i = o + 1, i + 1
    while po != pi:
      if po < pi:
        og.append(o)
        po *= out_shape[o]
        o += 1
      else:
        ig.append(i)
        pi *= in_shape[i]
        i += 1
    flat = flat_index([idxs[k] for k in og], [out_shape[k] for k in og])
    stride = pi
    for k in ig:
      stride //= in_shape[k]
      res.append(
        zero
        if in_shape[k] == 1
        else simplify((flat // stride) % in_shape[k])
        if k != ig[0]
        else simplify(flat // stride)
      )
  return res


# a reduce read through a PAD runs its loop at every position of the padded range, inside the source or not (outside,
# its loads are only gated off): it is stored first when the positions outside outnumber those inside this many
# times (SPPF's concat of x and three pools ran the last pool's loop over all four slices: 1.55 ms, each pool 0.27)
PAD_REDUCE_WASTE = 1.0


def _loop_reduce_under(ctx: Lowering, u: UOp) -> bool:
  """A REDUCE other than a sum of products would be computed in the reader's kernel: u's graph down to stages holds
  one. (A sum of products becomes a contraction, which the microkernel computes for its slice of a pad only:
  codegen/lower/contract.py gate_slices.)"""
  product = lambda v: v.op is Ops.REDUCE and v.arg[0] is ReduceOp.SUM and v.src[0].op is Ops.MUL
  # what a contraction's operands compute is written out by the operand's own copy kernel, not in the reader
  stop = lambda v: v is not u and (v in ctx.stages or product(v))
  return any(v.op is Ops.REDUCE and not stop(v) and not product(v) for v in u.toposort(stop=stop))


def _stage_padded_reduce(ctx: Lowering, x: UOp) -> None:
  """Stage what PAD x pads when it computes a loop reduce and the pad is mostly outside it (PAD_REDUCE_WASTE)."""
  src = x.src[0]
  if (x.numel - src.numel) <= PAD_REDUCE_WASTE * src.numel:
    return
  while src.op in GroupOp.Movement:
    src = src.src[0]
  if src.op in GroupOp.Compute and src not in ctx.stages and _loop_reduce_under(ctx, src):
    ctx.stage(src)


def _index_movement(ctx: Lowering, i: UOp, x: UOp):
  gate, idxs, src = i.src[1], list(i.src[2:]), x.src[0]
  if x.op is Ops.RESHAPE:
    return make_index(src, gate, reshape_index(idxs, x.shape, src.shape))
  if x.op is Ops.PERMUTE:
    new = [None] * len(idxs)
    for k, p in enumerate(x.arg):
      new[p] = idxs[k]
    return make_index(src, gate, new)
  if x.op is Ops.EXPAND:
    return make_index(src, gate, [0 if s == 1 else ix for ix, s in zip(idxs, src.shape)])
  if x.op is Ops.SHRINK:
    return make_index(src, gate, [ix + a for ix, (a, _) in zip(idxs, x.arg)])
  if x.op is Ops.FLIP:
    return make_index(src, gate, [(s - 1) - ix if k in x.arg else ix for k, (ix, s) in enumerate(zip(idxs, src.shape))])
  if x.op is Ops.PAD:
    _stage_padded_reduce(ctx, x)
    pads, value = x.arg
    valid = UOp.const(dtypes.bool, True)
    for ix, (a, _), s in zip(idxs, pads, src.shape):
      if a or _:
        valid = valid & ix.ge(a) & ix.lt(a + s)
    valid = simplify(valid)
    inner = make_index(src, gate & valid, [ix - a for ix, (a, _) in zip(idxs, pads)])
    return simplify(UOp(Ops.WHERE, x.dtype, (valid, inner, UOp.const(x.dtype, value))))


def _index_compute(ctx: Lowering, i: UOp, x: UOp):
  """Push the index into a computed node, or load it from a buffer when computing it here would repeat work."""
  gate, idxs = i.src[1], i.src[2:]
  # the loops around this point run trip_of(idxs) times; if the index can take fewer distinct values, work repeats
  if i.arg != "root" and ctx.trip_of(idxs) > prod(ix.vmax - ix.vmin + 1 for ix in idxs):
    return _index_stage(ctx, i, ctx.stage(x))
  if i.arg != "root":
    ctx.reads.append((x, i))
  if x.op is Ops.REDUCE:
    rop, axes = x.arg
    outer = ctx.trip_of(idxs)
    new, rngs = [], []
    for k, (ix, s) in enumerate(zip(idxs, x.src[0].shape)):
      if k not in axes:
        new.append(ix)
      elif s == 1:
        new.append(UOp.const(dtypes.index, 0))
      else:
        rngs.append(r := ctx.new_range(s, "reduce", outer))
        outer = ctx.trip[r]
        new.append(r)
    # a reduce over size-1 axes only is its input
    return (
      UOp(Ops.ACCUMULATE, x.dtype, (make_index(x.src[0], gate, new), *rngs), rop)
      if rngs
      else make_index(x.src[0], gate, new)
    )
  if x.op is Ops.GATHER:
    data, index, axis = x.src[0], x.src[1], x.arg
    n = data.shape[axis]
    # an index outside [-n, n) is clamped so a bad one never reads out of bounds, in 64 bits so that nothing
    # overflows and the kernel index it becomes has known bounds; negative ones count from the end
    v = make_index(index, gate, idxs).cast(dtypes.int64)
    v = UOp(
      Ops.MAX,
      dtypes.int64,
      (UOp(Ops.MIN, dtypes.int64, (v, UOp.const(dtypes.int64, n - 1))), UOp.const(dtypes.int64, -n)),
    ).cast(dtypes.index)
    v = UOp(Ops.MOD, dtypes.index, (v + n, UOp.const(dtypes.index, n)))
    return make_index(data, gate, [v if k == axis else ix for k, ix in enumerate(idxs)])
  return x.replace(src=tuple(make_index(s, gate, idxs) for s in x.src))


def _index_stage(ctx: Lowering, i: UOp, buf: Buffer) -> UOp:
  x = i.src[0]
  return load(UOp(Ops.BUF, x.dtype, (), buf), x.dtype, i.src[2:], x.shape, i.src[1])


def _unlowerable(x: UOp):
  raise CompileError(f"cannot lower {x.op.name} (was it inlined?)")


# loads that can never happen read nothing
pm_gated_off = PatternMatcher(
  [
    (UPat(Ops.LOAD, src=(UPat(), UPat(), UPat(Ops.CONST, arg=False)), name="l"), lambda l: l.const_like(0)),
  ]
)

pm_lower = (
  PatternMatcher(
    [
      # a stage is read from its buffer (except inside its own kernel)
      (
        UPat(Ops.INDEX, name="i"),
        lambda ctx, i: (
          _index_stage(ctx, i, ctx.stages[i.src[0]]) if i.src[0] in ctx.stages and i.arg != "root" else None
        ),
      ),
      (
        UPat(Ops.INDEX, src=(UPat(Ops.BUFFER, name="x"),), allow_any_len=True, name="i"),
        lambda ctx, i, x: _index_stage(ctx, i, ctx.buffer_of(x)),
      ),
      # (a run-time size, VAR, is a scalar as a constant is: the same at every index)
      (UPat(Ops.INDEX, src=(UPat((Ops.CONST, Ops.VAR), name="x"),), allow_any_len=True), lambda x: x),
      # movement ops are index arithmetic
      (UPat(Ops.INDEX, src=(UPat(GroupOp.Movement, name="x"),), allow_any_len=True, name="i"), _index_movement),
      (
        UPat(Ops.INDEX, src=(UPat(Ops.CONTIGUOUS, name="x"),), allow_any_len=True, name="i"),
        lambda i, x: make_index(x.src[0], i.src[1], i.src[2:]),
      ),
      (UPat(Ops.INDEX, src=(UPat(GroupOp.Compute, name="x"),), allow_any_len=True, name="i"), _index_compute),
      (UPat(Ops.INDEX, src=(UPat((Ops.PARAM, Ops.CALL, Ops.FUNCTION), name="x"),), allow_any_len=True), _unlowerable),
    ]
  )
  + pm_gated_off
)

# a value computed in a kernel may still simplify once its loads are known (a gated load of a constant, say)
pm_finish = pm_simplify


def lower_stage(ctx: Lowering, x: UOp, buf: Buffer) -> UOp:
  rngs, trip = [], 1
  for s in x.shape:
    if s == 1:
      rngs.append(UOp.const(dtypes.index, 0))
      continue
    rngs.append(r := ctx.new_range(s, "loop", trip))
    trip = ctx.trip[r]
  root = make_index(x, UOp.const(dtypes.bool, True), rngs, root=True)
  store = UOp(Ops.STORE, dtypes.void, (UOp(Ops.BUF, x.dtype, (), buf), flat_index(rngs, x.shape), root))
  return graph_rewrite(graph_rewrite(store, pm_lower, ctx), pm_finish)


@dataclasses.dataclass
class Form:
  """A stage's graph down to what it reads (stages, weights, inputs), each of those a numbered placeholder: stages of
  one form (a transformer's layers, its layer norms) lower to one kernel over other buffers. A leaf may be one block
  of a stage or buffer (_block_offset): an unrolled recurrence's steps, each reading its row of the input product,
  are one form whose kernels differ by where they read."""

  root: UOp  # hash-consed: stages of one form have the same root
  leaves: list[UOp]  # what the stage reads, in placeholder order
  offsets: list[int | None]  # a block leaf's offset into its source in elements; None: the leaf is read whole
  of: dict[UOp, UOp]  # the stage's node -> the form's


@dataclasses.dataclass
class Template:
  """The kernel of the first stage of a form, with what its instances replace: the buffers of its leaves (and the
  offsets of its blocks) and the one it writes, and the nodes it fused (in the form's terms) with the index each was
  read at."""

  store: UOp
  bufs: list[Buffer]
  offsets: list[int | None]
  out: Buffer
  reads: list[tuple[UOp, UOp]]
  # nodes its lowering staged (in the form's terms: a value its loop does not vary in), with their buffers: an
  # instance stages its own, as lowering it would
  staged: list[tuple[UOp, Buffer]]


def _block_offset(u: UOp) -> int | None:
  """Where a SHRINK that selects one contiguous block of its source starts (single positions on the axes before one,
  the axes after it whole), else None: read through it, index i of the block is i + offset of the source."""
  if u.op is not Ops.SHRINK:
    return None
  shape, ranges = u.src[0].shape, u.arg
  k = next((k for k, (a, b) in enumerate(ranges) if b - a != 1), len(ranges))
  if any((a, b) != (0, n) for (a, b), n in zip(ranges[k + 1 :], shape[k + 1 :])):
    return None
  offset, stride = 0, 1
  for (a, _), n in reversed(list(zip(ranges, shape))):
    offset, stride = offset + a * stride, stride * n
  return offset


def _form(ctx: Lowering, x: UOp) -> Form:
  read = lambda u: u is not x and (u in ctx.stages or u.op is Ops.BUFFER)
  # a block of what the stage reads only there is a leaf (read another way too, its source is the leaf)
  readers: dict[UOp, list[UOp]] = {}
  for u in x.toposort(stop=read):
    for s in u.src if not read(u) else ():
      if read(s):
        readers.setdefault(s, []).append(u)
  blocks = {us[0] for us in readers.values() if len(us) == 1 and _block_offset(us[0]) is not None}
  leaf = lambda u: read(u) or u in blocks
  of: dict[UOp, UOp] = {}
  leaves, offsets = [], []
  for u in x.toposort(stop=leaf):
    if leaf(u):
      offsets.append(_block_offset(u) if u in blocks else None)
      key = (len(leaves), u.dtype, u.shape, offsets[-1] is None)
      if key not in ctx.placeholders:
        ctx.placeholders[key] = UOp(Ops.BUFFER, u.dtype, (), BufferArg(f"leaf{len(leaves)}", u.shape, "input"))
      of[u] = ctx.placeholders[key]
      leaves.append(u)
      continue
    new_src = tuple(of[s] for s in u.src)
    of[u] = u if new_src == u.src else u.replace(src=new_src)
  return Form(of[x], leaves, offsets, of)


def _leaf_buffer(ctx: Lowering, u: UOp, offset: int | None = None) -> Buffer:
  u = u.src[0] if offset is not None else u
  return ctx.stages[u] if u in ctx.stages else ctx.buffer_of(u)


def _instance(t: Template, moved: dict[int, tuple[Buffer, int]]) -> UOp:
  """The template's kernel over other buffers: {id(template's buffer): (buffer, elements its reads move by)}."""
  done: dict[UOp, UOp] = {}
  for u in t.store.toposort():
    if u.op is Ops.BUF and id(u.arg) in moved:
      done[u] = u.replace(arg=moved[id(u.arg)][0])
      continue
    src = tuple(done[s] for s in u.src)
    if u.op is Ops.LOAD and u.src[0].op is Ops.BUF and (delta := moved.get(id(u.src[0].arg), (None, 0))[1]):
      src = (src[0], simplify(src[1] + delta), *src[2:])
    done[u] = u if src == u.src else u.replace(src=src)
  return done[t.store]


def _template(ctx: Lowering, form: Form, store: UOp, buf: Buffer, staged: list[UOp]) -> Template | None:
  """The kernel lowered for the first stage of a form as its instances take it; None where it reads a buffer the
  form does not name (what it staged lies outside the form)."""
  if any(u not in form.of for u in staged):
    return None
  bufs = [_leaf_buffer(ctx, u, o) for u, o in zip(form.leaves, form.offsets)]
  named = {id(b) for b in bufs} | {id(buf)} | {id(ctx.stages[u]) for u in staged}
  if any(u.op is Ops.BUF and id(u.arg) not in named for u in store.toposort()):
    return None
  reads = [(form.of[r], i) for r, i in ctx.reads]
  return Template(store, bufs, form.offsets, buf, reads, [(form.of[u], ctx.stages[u]) for u in staged])


# a stage takes the kernel of an earlier stage of its form (off: every stage is lowered, for tests comparing the two)
REUSE_FORMS = True


def lower_form(ctx: Lowering, x: UOp, buf: Buffer) -> tuple[UOp, list]:
  """x's kernel and the (node, index) reads it fused. Lowering depends only on the form (what is a stage is what the
  form reads; ranges are labels), so a stage of a form lowered before takes that kernel with its own buffers: a
  6-layer encoder's 39 layer-norm kernels (a 384-step recurrence each) took 4.9 of its 10 s compile lowered one by
  one. What a first lowering staged (a value its loop does not vary in) each instance stages too."""
  form = _form(ctx, x)
  if (t := ctx.templates.get(form.root)) is None or not REUSE_FORMS:
    before, ctx.reads = set(ctx.stages), []
    store = lower_stage(ctx, x, buf)
    if (t := _template(ctx, form, store, buf, [u for u in ctx.stages if u not in before])) is not None:
      ctx.templates[form.root] = t
    return store, ctx.reads
  node = {f: u for u, f in form.of.items()}
  moved = {id(t.out): (buf, 0)} | {id(b): (ctx.stage(node[f]), 0) for f, b in t.staged}
  for old, was, u, o in zip(t.bufs, t.offsets, form.leaves, form.offsets):
    moved[id(old)] = (_leaf_buffer(ctx, u, o), (o or 0) - (was or 0))
  # the index is tagged with the kernel: reads from two kernels are two reads, as ranges of their own would make them
  return _instance(t, moved), [(node[f], (id(buf), i)) for f, i in t.reads]


def finalize(store: UOp) -> tuple[UOp, list[Buffer]]:
  """Buffers become DEFINE_GLOBAL slots (the written one first) and ranges are numbered in order of appearance, so two
  kernels that do the same work on different buffers are the same UOp."""
  bufs: list[Buffer] = []
  mapping: dict[UOp, UOp] = {}
  topo = store.toposort()
  for u in topo:
    if u.op is Ops.BUF:
      bufs.append(u.arg)
      mapping[u] = UOp(Ops.DEFINE_GLOBAL, u.dtype, (), len(bufs) - 1)
  # ranges keep their creation order (output axes in order, then reductions), which is the loop nesting order
  for n, r in enumerate(sorted((u for u in topo if u.op is Ops.RANGE), key=lambda r: r.number)):
    mapping[r] = UOp(Ops.RANGE, dtypes.index, (), (n, *r.arg[1:]))
  return substitute(store, mapping), bufs


def kernel_name(i: int, ast: UOp, shape) -> str:
  kind = "r" if any(u.op is Ops.ACCUMULATE for u in ast.toposort()) else "e"
  return f"k{i}_{kind}_" + ("_".join(str(s) for s in shape) or "1")


def _stage_place(x: UOp, b: Buffer) -> str:
  """A stage being lowered, for the InternalError a bug there becomes (aot/errors.py: working_on)."""
  return f"in the kernel of the {x.op.name} of shape {x.shape}" + (
    f" (writing output '{b.name}')" if b.kind == "output" else ""
  )


def _lower_all(outputs: list[UOp], out_bufs: list[Buffer], forced: list[UOp], keep: Lowering | None = None):
  """Lower every stage reachable from the outputs, given the nodes that must be stages. A stage lowered in the round
  before (keep) is reused when none of the nodes it fused has become a stage since: lowering it again would give the
  same kernel, and re-lowering everything each round made a deep ladder of concats (one more stage per round)
  quadratic."""
  ctx = Lowering({}, keep)
  for u in forced:
    ctx.stage(u)
  work: list[tuple[UOp, Buffer]] = []
  for o, b in zip(outputs, out_bufs):
    if o in ctx.stages and ctx.stages[o].kind == "scratch":
      # an output that others also read is computed straight into the output buffer
      ctx.stages[o] = b
      ctx.pending.remove(o)
    work.append((o, b))
  lowered: dict[int, tuple[UOp, Buffer, UOp]] = {}
  deps: dict[int, list[Buffer]] = {}
  while work or ctx.pending:
    work += [(y, ctx.stages[y]) for y in ctx.pending]
    ctx.pending = []
    x, b = work.pop(0)
    if id(b) in lowered or x.numel == 0:
      continue
    # a second output of the same node copies the first (CONTIGUOUS lowers to a plain read)
    node = x if ctx.stages.get(x, b) is b else UOp(Ops.CONTIGUOUS, x.dtype, (x,))
    prev = ctx.lowered.get(id(b))
    if prev is not None and prev[0] is node and not any(r in ctx.stages for r, _ in prev[2]):
      _, store, reads, deps[id(b)] = prev
    else:
      with working_on(_stage_place(node, b)):
        store, reads = lower_form(ctx, node, b)
      deps[id(b)] = [u.arg for u in store.toposort() if u.op is Ops.BUF and u.arg is not b]
      ctx.lowered[id(b)] = (node, store, reads, deps[id(b)])
    for r, i in reads:
      ctx.uses.setdefault(r, set()).add(i)
    lowered[id(b)] = (store, b, x)
  return ctx, lowered, deps


def strip_checks(sink: UOp) -> tuple[UOp, list[tuple[UOp, IndexCheck]]]:
  """Checked GATHERs (IndexCheck) become plain ones, and their check tensors extra roots: (graph, [(root, label)]),
  one root per distinct check. A constant check is done now: a constant bad index is the model's error."""
  found: dict[UOp, IndexCheck] = {}

  def strip(root: UOp) -> UOp:
    # one walk that rebuilds only what is above a checked gather (a pattern pass cost 1 s on a 6-layer encoder)
    done: dict[UOp, UOp] = {}
    for u in root.toposort():
      src = tuple(done[s] for s in u.src)
      if u.op is Ops.GATHER and len(u.src) == 3:
        found.setdefault(u.src[2], u.arg[1])
        done[u] = u.replace(src=src[:2], arg=u.arg[0])
      else:
        done[u] = u if src == u.src else u.replace(src=src)
    return done[root]

  sink = strip(sink)
  roots: dict[UOp, IndexCheck] = {}
  done: set = set()
  # a check tensor may hold checked gathers of its own (indices gathered by indices)
  while todo := [c for c in found if c not in done]:
    for c in todo:
      done.add(c)
      root = strip(c)
      if _const_base(root) is None:
        roots.setdefault(root, found[c])
        continue
      pos, value = (int(v) for v in evaluate(root))
      if pos != prod(found[c].shape):
        raise InvalidValueError(found[c].message(pos, value))
  return sink, list(roots.items())


def without_checks(sched: Schedule) -> Schedule:
  """The schedule without its index checks (GPU targets do not report bad indices: they are only clamped there): the
  kernels writing a check and those only they read go."""
  if not sched.checks:
    return sched
  needed, kernels = {id(b) for b in sched.outputs}, []
  for k in reversed(sched.kernels):
    if id(k.out) in needed:
      kernels.insert(0, k)
      needed |= {id(b) for b in k.bufs[1:]}
  scratch = [b for b in sched.scratch if id(b) in needed]
  return dataclasses.replace(sched, kernels=kernels, scratch=scratch, checks=[])


def schedule(outputs: list[UOp], input_order: list[UOp], output_names: list[str] | None = None) -> Schedule:
  outputs, sites = separate_calls(outputs, schedule)
  # the calls' arguments are prepared with the graph, as its last roots
  args = [a for site in sites for a in site.args]
  sink = graph_rewrite(UOp(Ops.SINK, dtypes.void, (*outputs, *args)), pm_prepare)
  sink, checks = strip_checks(sink)
  outputs, args = list(sink.src[: len(outputs)]), list(sink.src[len(outputs) :])
  out_bufs = [
    Buffer("output", o.dtype, o.numel, output_names[k] if output_names else f"output{k}", k, o.shape)
    for k, o in enumerate(outputs)
  ]
  # the check tensors are written like outputs, into buffers the run reads after its kernels
  # (codegen/render/host_cpu.py)
  check_bufs = [Buffer("check", dtypes.int64, 2, f"check{k}", k, (2,)) for k in range(len(checks))]
  outputs, out_bufs = outputs + [c for c, _ in checks], out_bufs + check_bufs
  sink = UOp(Ops.SINK, dtypes.void, (*outputs, *args))
  # an argument is read from a buffer by the call's kernels: stored, unless it is one already
  forced = _first_stages(sink) + [a for a in dict.fromkeys(args) if a.op is not Ops.BUFFER]
  ctx, lowered, deps = _lower_to_fixpoint(outputs, out_bufs, forced)
  calls = place_calls(ctx, sites, args, lowered, deps)
  kernels = []
  for bid in _kernel_order(out_bufs, lowered, deps):
    if lowered[bid] is None:  # a call's results: its kernels come with the first
      kernels += [renumbered(k, len(kernels) + n) for n, k in enumerate(calls.get(bid, []))]
      continue
    store, b, x = lowered[bid]
    ast, bufs = finalize(store)
    step = x.arg if x.op is Ops.CONTIGUOUS and isinstance(x.arg, StepGuard) else None
    kernels.append(Kernel(kernel_name(len(kernels), ast, x.shape), ast, bufs, x.shape, step))

  used = {id(b): b for k in kernels for b in k.bufs}
  inputs = []
  for n, u in enumerate(input_order):
    inputs.append(ctx.leaves.get(u) or Buffer("input", u.dtype, u.numel, u.arg.name, shape=u.shape))
    inputs[-1].index = n
  return Schedule(
    kernels,
    inputs,
    out_bufs[: len(out_bufs) - len(check_bufs)],
    consts=[b for b in used.values() if b.kind == "const"],
    scratch=[b for b in used.values() if b.kind == "scratch"],
    checks=[IndexCheckCall(b, label) for b, (_, label) in zip(check_bufs, checks)],
    indexed=_indexed_inputs([label for _, label in checks]),
  )


def _first_stages(sink: UOp) -> list[UOp]:
  """The first guess at what is materialised (_lower_to_fixpoint finds the rest): CONTIGUOUS, and a computed node
  with several readers unless every reader is elementwise on the same shape (those usually land in one kernel and
  read it at one index, like GELU's input). The guess saves most of the fixpoint's rounds."""
  parents: dict[UOp, set] = {}
  for u in sink.toposort():
    for s in u.src:
      parents.setdefault(s, set()).add(u)

  # (a bitcast is elementwise as a cast is: as a stage, a value a bitcast also read was stored, and the kernels of
  # the stages after it each read the chain before it, which then was stored step by step: tests/test_kernel_counts.py)
  elementwise = lambda p, u: (p.op in GroupOp.ALU or p.op in (Ops.CAST, Ops.BITCAST)) and p.shape == u.shape

  def shared(u: UOp) -> bool:
    ps = parents.get(u, set())
    return len(ps) > 1 and not all(elementwise(p, u) for p in ps)

  topo = sink.toposort()
  forced = [u for u in topo if u.op is Ops.CONTIGUOUS or (u.op in GroupOp.Compute and shared(u))]
  # the readers a node reaches through elementwise readers of its shape that are not stages (those read it at their
  # own index): a concat read by the next one and by a layer, each through its own dequantize/requantize chain
  # (QOperator DenseNet's QLinearConcat ladder), is read at two indices too, else found a level a round after an
  # exponential first round (16 levels: 594k matcher calls)
  staged = set(forced)
  reach: dict[UOp, frozenset] = {}
  for u in reversed(topo):
    ps = parents.get(u, ())
    reach[u] = frozenset().union(*(reach[p] if elementwise(p, u) and p not in staged else {p} for p in ps))

  def shifted(u: UOp) -> bool:
    return len(reach[u]) > 1 and any(p.op in (Ops.PAD, Ops.SHRINK) for p in reach[u])

  # where such a chain forks: the node none of its elementwise readers continues whole (as the fixpoint finds it)
  forked = lambda u: not any(elementwise(p, u) and p not in staged and reach[p] == reach[u] for p in parents.get(u, ()))
  return forced + [u for u in topo if u.op in GroupOp.Compute and u not in staged and shifted(u) and forked(u)]


def _lower_to_fixpoint(outputs: list[UOp], out_bufs: list[Buffer], forced: list[UOp]):
  """Lower with `forced` as stages, adding what lowering finds would be computed twice if fused (read at two
  different indices or from two kernels, or inside a loop it does not vary in), until nothing new is found: the
  last round's (context, lowered kernels by buffer id, their dependencies)."""
  ctx = None
  while True:
    ctx, lowered, deps = _lower_all(outputs, out_bufs, forced, ctx)
    # a node read at two indices was fused somewhere already, so those need another round
    found = [x for x, uses in ctx.uses.items() if len(uses) > 1 and x not in ctx.stages]
    # a kernel lowered before a later one of the same round staged a node it fused still computes that node itself
    # (SPPF's concat recomputed both chained max-pools its pools' kernels stored): it is lowered again, loading it
    stale = any(r in ctx.stages for bid in lowered for r, _ in ctx.lowered[bid][2])
    if not found and not stale:
      return ctx, lowered, deps
    # stage only the outermost of them: staging a reader can resolve its sources' double reads
    below: set = set()
    for y in found:
      below.update(u for u in y.toposort(stop=lambda u: u in ctx.stages and u is not y) if u is not y)
    forced += [x for x in ctx.stages if x not in forced] + [x for x in found if x not in below]


def _kernel_order(out_bufs: list[Buffer], lowered: dict, deps: dict) -> list[int]:
  """Kernel order: each kernel after the kernels whose buffers it reads (depth first from the outputs, in order)."""
  order: list[int] = []
  visiting: set = set()

  def visit(bid: int):
    if bid in visiting or bid not in lowered:
      return
    visiting.add(bid)
    for d in deps[bid]:
      visit(id(d))
    order.append(bid)

  for b in out_bufs:
    visit(id(b))
  return order


def _indexed_inputs(checks: list[IndexCheck]) -> dict[str, int]:
  out: dict[str, int] = {}
  for c in checks:
    if c.input is not None:
      out[c.input] = min(out.get(c.input, c.size), c.size)
  return out
