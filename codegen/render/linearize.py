"""Lowering a kernel to loops: every node is placed in the innermost loop it depends on (so nothing is recomputed in a
loop it does not vary in), and reductions open their own loops where their accumulator lives.

The result is a flat instruction list shared by every renderer: ("loop", RANGE) ... ("end", RANGE), ("value", node),
("acc_init", ACCUMULATE), ("acc_update", ACCUMULATE), ("store", STORE). A RANGE's kind ("loop", "reduce", and later
"global"/"parallel"/"vector") is what optimisation passes and GPU renderers change; the placement is decided here once.
"""

from __future__ import annotations

from dataclasses import dataclass

from aot.core.dtype import dtypes
from aot.core.ir import Ops, UOp, prod, ranges_of
from aot.core.symbolic import from_linear, linear
from aot.errors import CompileError

ROOT = "root"  # the block outside every loop
# kernels index in 32 bits (as fast as it gets, and enough for most tensors); a kernel whose loop counter or index
# arithmetic can pass this does all of its index arithmetic in 64 bits instead (widen_index)
INDEX32_MAX = 2**31 - 1
# ... and so does a kernel without reductions whose innermost loop reads a buffer at a small stride (a pool's window
# written out, every 2nd element): clang and LLVM take reads at int32 indices sign-extended one by one for unrelated
# addresses and load them singly, where 64-bit ones make one interleaved load per window row (a 3x3/2 max pool over
# 64x111x111 with a cold cache: 0.45 -> 0.21 ms, C built by clang-19)
STRIDED_MAX = 4


def is_outer(r: UOp) -> bool:
  """The outermost output loop: the one split across threads (kernels take its [start, end) as arguments). The
  runtime splits in int, so a loop longer than INDEX32_MAX is not split: it runs whole on one thread."""
  return r.number == 0 and r.kind != "reduce" and r.size <= INDEX32_MAX


def needs_wide_index(ast: UOp) -> bool:
  """Can an index value, or a loop counter (which reaches the loop's size), leave the int32 range?"""
  for u in ast.toposort():
    if u.dtype != dtypes.index:
      continue
    if u.op is Ops.RANGE and u.size > INDEX32_MAX:
      return True
    if u.vmin < -INDEX32_MAX - 1 or u.vmax > INDEX32_MAX:
      return True
  return False


def reads_strided(ast: UOp) -> bool:
  """Does a kernel without reductions load at a stride of 2..STRIDED_MAX along its innermost output loop?"""
  nodes = ast.toposort()
  loops = [u for u in nodes if u.op is Ops.RANGE and u.kind != "reduce"]
  if not loops or any(u.op is Ops.ACCUMULATE for u in nodes):
    return False
  inner = max(loops, key=lambda r: r.number)
  return any(u.op is Ops.LOAD and 1 < abs(linear(u.src[1])[0].get(inner, 0)) <= STRIDED_MAX for u in nodes)


def cut_by_outer_loops(ast: UOp) -> bool:
  """Does a loop of the kernel run in pieces whose bounds depend on the loops around it (loop_pieces)?"""
  if any(u.op is Ops.ACCUMULATE for u in ast.toposort()):
    return False
  return any(p is not None and p.varies for _, _, p, _ in in_pieces(ast, linearize(ast)))


def widen_index(ast: UOp) -> UOp:
  """The kernel with its index arithmetic in 64 bits where 32 could overflow, where it reads at a small stride, or
  where a loop runs in pieces bounded by the loops around it; unchanged (and as fast) otherwise."""
  if not (needs_wide_index(ast) or reads_strided(ast) or cut_by_outer_loops(ast)):
    return ast
  new: dict[UOp, UOp] = {}
  for u in ast.toposort():
    new[u] = UOp(u.op, dtypes.index64 if u.dtype == dtypes.index else u.dtype, tuple(new[s] for s in u.src), u.arg)
  return new[ast]


# a kernel without sums (a pool written out) whose innermost loop is gated at its edges (padding: r >= 1, r + 2 < 29)
# runs that loop in pieces over which every such gate is constant, the same body in each: the compilers fold the
# gates from the bounds, and the interior's loads are plain ones they vectorise, where masked loads of a padded window
# stayed scalar (inception_v2's 3x3/1 average pool over 256x28x28, clang-19: 0.252 -> 0.089 ms, thread CPU time);
# at most this many pieces (a 5x5 window's four edges give five)
PEEL_MAX_PIECES = 5
# the llvm target splits a piece bounded by the loops around it at its core, the part it runs for every value of
# theirs (a 3x3/1 im2col row of 56: [max(0, 1 - kw), 1) [1, 55) [55, min(57 - kw, 56))): LLVM vectorises a loop of
# constant bounds with its remainder vectorised too, and the varying rest is 0-2 iterations (the 29 packs of
# resnet18/50, inception_v2 and squeezenet, thread CPU time: 3.55 -> 2.53 ms; ResNet-18's 3x3/2 over 64x56x56 0.079
# -> 0.053, 0.048 before pieces). C keeps the pieces whole: clang-14 was slower split (4.31 -> 4.80 ms), clang-19 the
# same, gcc faster (5.5 -> 4.6)
CORE_SPLIT = {"c": False, "llvm": True}
# a loop nest whose innermost loop is shorter than this is not cut in pieces bounded by the loops around them: there
# is no vector to gain and the pieces cost (a dense im2col copy written k-major, its innermost loop a 3x3 window's 3
# taps, 256x14x14: 0.177 -> 0.340 ms clang-14, 0.137 -> 0.159 clang-19, 0.118 -> 0.163 llvm in pieces). A 14-wide
# map's rows are cut (at 16 they were not, every element a gated load): the panel pack of RegNetX-400MF's 3x3
# grouped convs over 160x14x14, 1 thread, 0.188 -> 0.107 ms a conv; whole RegNetX 0.92x (clang-19), 0.91 (clang-14),
# 0.98 (gcc), 0.94 (llvm), ResNeXt-50 0.98, the others within noise (DenseNet-121, ResNet-18/50, SqueezeNet, YOLOv8n,
# GoogLeNet, EfficientNet-B0, Inception-v3, DBNet, MNIST)
AFFINE_MIN_SIZE = 8


@dataclass(frozen=True)
class Piece:
  """[lo, hi) of a loop run in pieces, each bound an int or an index expression of the loops around it, and the
  comparisons (gates) that keep one value over it, with that value."""

  lo: int | UOp
  hi: int | UOp
  gates: tuple[tuple[UOp, bool], ...] = ()

  @property
  def varies(self) -> bool:
    """Do its bounds depend on the loops around it?"""
    return isinstance(self.lo, UOp) or isinstance(self.hi, UOp)

  def length(self) -> tuple[int, int]:
    """The fewest and the most iterations the piece can run."""
    lo, hi = (x.vrange if isinstance(x, UOp) else (x, x) for x in (self.lo, self.hi))
    return max(0, hi[0] - lo[1]), max(0, hi[1] - lo[0])


def _gate_terms(u: UOp, r: UOp, outside: frozenset) -> tuple[int, dict[UOp, int], int] | None:
  """(a, terms, c) when u compares a*r + terms + c < 0 with a != 0 and terms of the loops around r only (outside)."""
  if u.op is not Ops.CMPLT or u.src[0].dtype not in (dtypes.index, dtypes.index64):
    return None
  (ta, ca), (tb, cb) = linear(u.src[0]), linear(u.src[1])
  terms = {t: k for t in dict.fromkeys([*ta, *tb]) if (k := ta.get(t, 0) - tb.get(t, 0))}
  a = terms.pop(r, 0)
  if a == 0 or not all(ranges_of(t) <= outside for t in terms):
    return None
  return a, terms, ca - cb


def _constant_pieces(r: UOp, gates: list[tuple[UOp, int, int]]) -> list[Piece]:
  """The pieces cut where gates a*r + c < 0 change value, each gate's value over a piece its value at lo."""
  edges = {0, r.size}
  for _, a, c in gates:
    # a*r + c < 0 changes value at the first r past -c/a
    edge = -(c // a) if a > 0 else c // -a + 1
    if 0 < edge < r.size:
      edges.add(edge)
  cuts = sorted(edges)
  return [Piece(lo, hi, tuple((u, a * lo + c < 0) for u, a, c in gates)) for lo, hi in zip(cuts, cuts[1:])]


def _affine_pieces(r: UOp, gates: list[tuple[UOp, int, dict[UOp, int], int]], core: bool) -> list[Piece]:
  """The pieces cut where gates a*r + terms + c < 0 change value, their terms of the loops around r (a padded conv's
  im2col: column ow*stride + kw - pad >= 0 for each tap kw). Each gate is s < t or its negation for one s = A*r + f
  (A > 0), the same for every gate the pieces fold: cut at E(t) = clamp(ceil((t - f) / A), 0, r.size), which does
  not decrease with t, the thresholds' order is the edges' whatever the outer loops' values. core: each piece's
  part that runs whatever the outer loops' values (between its edges' extremes) a piece of its own, of constant
  bounds, the rest the short pieces either side of it (CORE_SPLIT)."""
  forms: dict[tuple, list] = {}
  for u, a, terms, c in gates:
    # a > 0: s < -c; a < 0: -A*r + f + c < 0 is A*r - f >= c + 1, not (s < c + 1)
    f = terms if a > 0 else {t: -k for t, k in terms.items()}
    key = (abs(a), frozenset(f.items()))
    forms.setdefault(key, [f, []])[1].append((u, -c if a > 0 else c + 1, a > 0))
  (A, _), (f, folded) = max(forms.items(), key=lambda kv: len(kv[1][1]))
  thresholds = sorted({t for _, t, _ in folded})
  dt = r.dtype

  def edge(t: int) -> int | UOp:
    e = from_linear({x: -k for x, k in f.items()}, t + A - 1, dt)
    if e.vmin < 0:
      e = UOp(Ops.MAX, dt, (e, e.const_like(0)))
    if A > 1:
      e = UOp(Ops.IDIV, dt, (e, e.const_like(A)))
    if e.vmax > r.size:
      e = UOp(Ops.MIN, dt, (e, e.const_like(r.size)))
    return e.vmin if e.vmin == e.vmax else e

  # over piece i, s lies in [thresholds[i - 1], thresholds[i]): s < t holds there when t is thresholds[i] or above
  below = lambda i, t: i < len(thresholds) and thresholds[i] <= t
  cuts = [0, *(edge(t) for t in thresholds), r.size]
  span = [c.vrange if isinstance(c, UOp) else (c, c) for c in cuts]
  pieces = []
  for i, (lo, hi) in enumerate(zip(cuts, cuts[1:])):
    gates = tuple((u, below(i, t) == positive) for u, t, positive in folded)
    inside = [span[i][1], span[i + 1][0]] if core and span[i][1] <= span[i + 1][0] else []
    points = [lo, *(x for x in inside if x not in (lo, hi)), hi]
    pieces += [Piece(a, b, gates) for a, b in zip(points, points[1:])]
  return pieces


def bodies(pieces: list[Piece]) -> int:
  """How many different bodies the pieces' known gates make (a core split's short pieces share their piece's)."""
  return len({p.gates for p in pieces})


def loop_pieces(
  ast: UOp, r: UOp, outside: frozenset = frozenset(), core: bool = False, affine: bool = True
) -> list[Piece]:
  """Pieces covering [0, r.size) over each of which the comparisons of r against a constant (a*r + c < 0), or else
  those of one affine form of r and the loops around it (outside), keep one value; [Piece(0, size)] when r is not
  peeled (a kernel with sums, the threads' loop, a loop to a run-time size, no such gate, too many pieces). core:
  _affine_pieces'; affine: False for constant gates only."""
  nodes = ast.toposort()
  whole = [Piece(0, r.size)]
  # (a loop to a run-time size, compared with a pad's bound there: its pieces' edges would be run-time values)
  if is_outer(r) or r.runtime or any(u.op is Ops.ACCUMULATE for u in nodes):
    return whole
  gates = [(u, *g) for u in nodes if (g := _gate_terms(u, r, outside)) is not None]
  constant = [(u, a, c) for u, a, terms, c in gates if not terms]
  if constant:
    pieces = _constant_pieces(r, constant)
  else:
    pieces = _affine_pieces(r, gates, core) if gates and affine else whole
  # a piece that never runs is left out
  pieces = [p for p in pieces if p.length()[1] > 0]
  return pieces if 1 < len(pieces) and bodies(pieces) <= PEEL_MAX_PIECES else whole


# ... and the loop around it likewise (a padded pool's rows: the gate on a row, r >= 1, is invariant in the innermost
# loop, where the compilers read it as a mask on every load: ResNet-18's padded 3x3/2 max pool over 64x112x112,
# thread CPU time, clang-19 0.47 -> 0.25 ms, clang-14 0.38 -> 0.21, gcc 0.66 -> 0.21), when the copies of the
# innermost body this makes are at most this many (a 3x3/1 window's three pieces each way)
PEEL_MAX_COPIES = 9
# the loops taken in pieces, innermost first
PEEL_LOOPS = 2


def in_pieces(
  ast: UOp, program: list[tuple[str, UOp]], core: bool = False
) -> list[tuple[str, UOp, Piece | None, dict[UOp, bool]]]:
  """The program with each loop's piece and each instruction's known gates: the innermost loop and the one around it
  in pieces (loop_pieces), their instructions repeated once per piece, the innermost's within each of the outer's,
  each knowing the gates of the pieces around it; every other loop one Piece(0, size). core: the innermost loop's
  pieces split at their constant core (_affine_pieces)."""
  around, open_ = {}, []
  for kind, u in program:
    if kind == "loop":
      around[u] = frozenset(open_)
      open_.append(u)
    elif kind == "end":
      open_.pop()
  out = [(kind, u, Piece(0, u.size) if kind == "loop" else None, {}) for kind, u in program]
  copies = 1
  loops = [u for kind, u in program if kind == "loop"]
  for r in reversed(loops[-PEEL_LOOPS:]):
    pieces = loop_pieces(ast, r, around[r], core and r is loops[-1], loops[-1].size >= AFFINE_MIN_SIZE)
    if len(pieces) == 1 or copies * bodies(pieces) > PEEL_MAX_COPIES:
      continue
    copies *= bodies(pieces)
    at = next(i for i, (kind, u, _, _) in enumerate(out) if kind == "loop" and u is r)
    to = next(i for i, (kind, u, _, _) in enumerate(out) if kind == "end" and u is r) + 1
    repeated = [
      [(k, u, piece if k == "loop" and u is r else b, {**known, **dict(piece.gates)}) for k, u, b, known in out[at:to]]
      for piece in pieces
    ]
    out = out[:at] + [x for rep in repeated for x in rep] + out[to:]
  return out


def takes_runtime_size(ast: UOp) -> bool:
  """Does the kernel run a loop to a size given at run time (RANGE.runtime), its function taking it as n_?"""
  return any((u.op is Ops.RANGE and u.runtime) or u.op is Ops.VAR for u in ast.toposort())


def runtime_outer(ast: UOp) -> int:
  """The bound's size of the loop split across threads where it runs to a size given at run time (its callers pass
  that size's form of e_ as the extent); 0 where it does not."""
  return next((r.size for r in ast.toposort() if r.op is Ops.RANGE and is_outer(r) and r.runtime), 0)


def parallel_extent(ast: UOp) -> int:
  """How many iterations of the outermost output loop a kernel has (1 when it has none: it runs whole, once)."""
  return next((r.size for r in ast.toposort() if r.op is Ops.RANGE and is_outer(r)), 1)


def guards_divisor(u: UOp) -> bool:
  """Does this integer IDIV, DIV or MOD need its divisor checked? Division by zero, and a signed minimum by -1, are
  undefined in C and LLVM (x86 traps on both); IR defines them as numpy computes them: x / 0 and x % 0 are 0, MIN / -1
  wraps to MIN and MIN % -1 is 0. Not for a constant divisor other than 0 and -1, nor for the index types, whose
  divisors are sizes (positive)."""
  if u.op not in (Ops.IDIV, Ops.DIV, Ops.MOD) or not u.dtype.is_int or u.dtype in (dtypes.index, dtypes.index64):
    return False
  d = u.src[1]
  return d.op is not Ops.CONST or d.arg in (0, -1)


def kernel_params(ast: UOp) -> list[UOp]:
  """A kernel's buffer arguments (DEFINE_GLOBALs) in slot order; its loop bounds follow them."""
  return sorted({u.slot: u for u in ast.toposort() if u.op is Ops.DEFINE_GLOBAL}.values(), key=lambda u: u.slot)


def _loop_deps(topo: list[UOp]) -> dict[UOp, frozenset]:
  """The loops each node varies in. Accumulators over the same reduction ranges (an upcast kernel's lanes) are one
  loop nest, placed in one block: each varies in every loop any of them does, and so does what reads it. A lane that
  reads only padding (its summand a constant 0 times a weight) varies in fewer loops than its nest is placed in; the
  value reading it, placed by its own loops, was emitted before the nest (a grouped, dilated, strided ConvTranspose
  divided by a runtime scalar, found by aot/tools/fuzz.py: seed 4242 case 704). A lane's summand may come after another
  lane in topological order, so this repeats until nothing grows (twice, mostly)."""
  lanes: dict[tuple, list[UOp]] = {}
  for u in topo:
    if u.op is Ops.ACCUMULATE:
      lanes.setdefault(u.src[1:], []).append(u)
  deps: dict[UOp, frozenset] = {}
  while True:
    before = dict(deps)
    for u in topo:
      if u.op is Ops.RANGE:
        deps[u] = frozenset([u])
      elif u.op is Ops.ACCUMULATE:
        deps[u] = frozenset().union(*(deps.get(a.src[0], frozenset()) for a in lanes[u.src[1:]])) - frozenset(u.src[1:])
      else:
        deps[u] = frozenset().union(*(deps[s] for s in u.src))
    if deps == before:
      return deps


def linearize(ast: UOp) -> list[tuple[str, UOp]]:
  # the C and LLVM renderers widen such a kernel first; a target that cannot must not wrap around silently
  if needs_wide_index(ast):
    raise CompileError(
      "a kernel indexes past 2**31-1 elements, which this target computes in 32 bits "
      "(the c and llvm targets compute such indices in 64)"
    )
  topo = ast.toposort()
  return _emit(topo, _place(topo, _loop_deps(topo)))


@dataclass
class _Placement:
  """Where each node is computed: the block (a loop, or ROOT) it is placed in, each block's nodes in topological
  order, and each output loop's child (the next output loop inside it)."""

  block: dict[UOp, object]
  contents: dict[object, list[UOp]]
  parent_child: dict[object, UOp]


def _place(topo: list[UOp], deps: dict) -> _Placement:
  """Each node in the innermost loop it varies in. The loop tree: output loops nest in order; a reduction's loops
  nest inside the loop its accumulator is placed in."""
  depth: dict = {ROOT: 0}
  parent_child: dict = {}
  outer = sorted((r for r in topo if r.op is Ops.RANGE and r.kind != "reduce"), key=lambda r: r.number)
  prev = ROOT
  for r in outer:
    depth[r], parent_child[prev] = depth[prev] + 1, r
    prev = r
  block: dict[UOp, object] = {}

  def place(u: UOp):
    return max(deps[u], key=lambda r: depth[r], default=ROOT)

  # accumulators over the same reduction ranges (an upcast kernel's lanes) live in one block, the deepest any of them
  # needs (_loop_deps gives every lane the loops of all): the ranges are one loop nest at one depth. A lane that
  # happens not to vary in an output loop (all its reads padding, say) placed alone outside it would open the shared
  # nest there, around values of the other lanes that read that loop's index (found by aot/tools/fuzz.py: a dilated,
  # strided ConvTranspose)
  home: dict[tuple, object] = {}
  for u in reversed(topo):
    if u.op is Ops.ACCUMULATE and (ranges := u.src[1:]) not in home:
      b = home[ranges] = place(u)
      for r in ranges:
        depth[r] = depth[b] + 1
        b = r
  contents: dict = {}
  for u in topo:
    if u.op in (Ops.RANGE, Ops.CONST, Ops.DEFINE_GLOBAL, Ops.SINK):
      continue
    block[u] = home[u.src[1:]] if u.op is Ops.ACCUMULATE else place(u)
    contents.setdefault(block[u], []).append(u)
  return _Placement(block, contents, parent_child)


def _emit(topo: list[UOp], placed: _Placement) -> list[tuple[str, UOp]]:
  """The instruction list: each block's nodes in dependency order, then the loop nested in it."""
  block, contents, parent_child = placed.block, placed.contents, placed.parent_child
  out: list[tuple[str, UOp]] = []
  # accumulators placed together over the same reduction ranges (the lanes of an upcast kernel) share one loop nest
  groups: dict[tuple, list[UOp]] = {}
  for u in topo:
    if u.op is Ops.ACCUMULATE:
      groups.setdefault((block[u], u.src[1:]), []).append(u)

  def needs(unit, b) -> set:
    """What must be emitted in block b before unit: its sources placed in b (for a reduction, those its body reads)."""
    if not isinstance(unit, list):
      return {s for s in unit.src if block.get(s) is b}
    return {n for a in unit for n in a.src[0].toposort(stop=lambda n: block.get(n) is b) if block.get(n) is b}

  def emit_block(b, inner=None):
    """Emit what is placed in block b in dependency order, then what nests inside it (the next output loop, or the
    rest of a reduction)."""
    units, seen = [], set()
    for u in contents.get(b, []):
      if u.op is not Ops.ACCUMULATE:
        units.append(u)
      elif (key := (b, u.src[1:])) not in seen:
        seen.add(key)
        units.append(groups[key])
    pending, done = [(u, needs(u, b)) for u in units], set()
    while pending:
      i = next(i for i, (_, need) in enumerate(pending) if need <= done)
      unit = pending.pop(i)[0]
      if isinstance(unit, list):
        out.extend(("acc_init", a) for a in unit)
        emit_reduce(unit, 1)
        done.update(unit)
      else:
        out.append(("store" if unit.op is Ops.STORE else "value", unit))
        done.add(unit)
    if inner is not None:
      inner()
    elif (child := parent_child.get(b)) is not None:
      out.append(("loop", child))
      emit_block(child)
      out.append(("end", child))

  def emit_reduce(group: list[UOp], i: int):
    r = group[0].src[i]
    out.append(("loop", r))
    emit_block(
      r,
      (lambda: emit_reduce(group, i + 1))
      if i + 1 < len(group[0].src)
      else (lambda: out.extend(("acc_update", a) for a in group)),
    )
    out.append(("end", r))

  emit_block(ROOT)
  return out


def _live_fractions(ast: UOp) -> dict[UOp, float]:
  """For each accumulator and each node of its summand that varies with its reduction, the fraction of the output
  where the summand can be nonzero: a concat's branch is zero outside its slice of the channels (its loads are gated
  off there), though the kernel's loops compute it everywhere. A node several summands share takes the largest."""
  from aot.codegen.lower.contract import gate_slices

  live: dict[UOp, float] = {}
  for acc in ast.toposort():
    if acc.op is not Ops.ACCUMULATE:
      continue
    body, reduce = acc.src[0], set(acc.src[1:])
    x, y = body.src if body.op is Ops.MUL else (body, body)
    nodes = body.toposort()
    outs = {r for r in nodes if r.op is Ops.RANGE} - reduce
    start, end = gate_slices(x, y, outs)
    fraction = prod(max(0, end[r] - start[r]) / r.size for r in outs)
    inner: set[UOp] = set()
    for n in nodes:
      if n in reduce or any(s in inner for s in n.src):
        inner.add(n)
    for n in (acc, *inner):
      live[n] = max(live.get(n, 0.0), fraction)
  return live


def flop_count(ast: UOp, live_only: bool = False, integer: bool = False) -> int:
  """Floating-point operations one run of the kernel performs (loads, stores and index arithmetic excluded).
  live_only: only those the model needs, each sum counted over the part of the output where it can be nonzero (a
  concat's branches are computed everywhere by generated loops, but only in their slice by the microkernel): the
  bench's GFLOP. Without it, what the generated loops execute, which is what deciding a thread split needs.
  integer: the data's integer arithmetic too (a quantized model's int32 sums), still not the index arithmetic."""
  from aot.core.ir import GroupOp

  live = _live_fractions(ast) if live_only else {}
  trips, total = [1], 0.0
  for kind, u in linearize(widen_index(ast)):
    if kind == "loop":
      trips.append(trips[-1] * u.size)
    elif kind == "end":
      trips.pop()
    # arithmetic only: selects and comparisons (padding masks) are not floating-point work; a fused multiply-add is two
    elif (
      kind in ("value", "acc_update")
      and (u.dtype.is_float or (integer and u.dtype.is_int and u.dtype not in (dtypes.index, dtypes.index64)))
      and (kind == "acc_update" or (u.op in GroupOp.ALU and u.op is not Ops.WHERE))
    ):
      total += trips[-1] * live.get(u, 1.0) * (2 if u.op is Ops.FMA else 1)
  return round(total)
