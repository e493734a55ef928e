"""Optimisation passes on a kernel's loop nest, before it is linearized (every target reads their result).

upcast: the innermost output loop of a reduction kernel is split by a small factor and its inner part unrolled into
separate accumulators that share one reduction loop. The unrolled lanes read neighbouring elements and do
independent work, which the C and LLVM vectorisers (SLP) turn into vector loads and vector multiply-adds; loads that
do not depend on that loop (a matmul's row of A) are read once for all lanes. A kernel whose sums are too short
for that (a grouped 1x1 convolution's 6 channels per group, under the microkernel's MIN_K) has its plane's loops
made one, and its lanes over an outer range whose iterations read the same input (a group's output channels)."""

from __future__ import annotations

import math

from aot.codegen.render.linearize import takes_runtime_size
from aot.core.dtype import dtypes
from aot.core.ir import LIBM, Ops, ReduceOp, UOp, prod
from aot.core.rewrite import PatternMatcher, UPat, graph_rewrite, substitute
from aot.core.symbolic import from_linear, linear, pm_simplify, simplify

# lanes per upcast: 8 floats fill an AVX register; more lanes add accumulators without adding vector width here
UPCAST = (8, 4)
# a reduction shorter than this gains nothing worth the bigger kernel
UPCAST_MIN_REDUCE = 8
# lanes over an outer range for a shorter reduction (_shared_lanes), and the iterations the outermost loop must keep
# for the threads when it is the one split
SHARED_LANES = (4, 2)
SHARED_LANES_MIN_SPLIT = 16

# a reduction over at most this many elements (a pool's 3x3 or 5x5 window, a 3x3x3 one) is written out term by term:
# the innermost loop is then the output's own, which the C and LLVM loop vectorisers run across (a 3x3/2 max pool over
# 64x111x111: 0.47 -> 0.22 ms in C built by clang-19), where a 9-step loop inside it ran scalar
UNROLL_MAX_REDUCE = 27
# ... when its terms add up to at most this many nodes: a window of loads, not one of exps (the kernel's size)
UNROLL_MAX_NODES = 512
COMBINE = {ReduceOp.SUM: Ops.ADD, ReduceOp.PROD: Ops.MUL, ReduceOp.MAX: Ops.MAX, ReduceOp.MIN: Ops.MIN}
# ... in a kernel that calls none of libm's functions that do not vectorise: around those the vectorised loop only
# adds packing (AlexNet's LRN, a 5-channel window under powf: 1.28 -> 1.53 ms written out)
# (libm's functions less those the vectorisers have instructions for, and pow)
SCALAR_CALLS = {Ops.POW, *LIBM} - {Ops.SQRT, Ops.FLOOR, Ops.CEIL, Ops.ROUND, Ops.TRUNC}

# a long float max/min (a ReduceMax to one value, DynamicQuantizeLinear's min(x) and max(x)) runs over blocks of this
# many neighbours, each block combined pairwise in a tree and then into the accumulator: one scalar chain of selects
# was latency-bound (128x1024 floats, thread CPU time: clang-19 0.19 -> 0.043 ms, clang-14 0.19 -> 0.053, gcc 0.048
# -> 0.034; blocks of 8 measured the same, 32 slower under clang-14). Interleaved accumulators combined at the end ran
# 3x faster again, but would change which zero or which NaN comes out (the sequential order's first zero, its last
# NaN); the tree keeps the order, so the result is bitwise the sequential one (maxmin_blocks). 8 where 16 does not
# divide the range (a classifier's 1000 logits)
MAXMIN_BLOCKS = (16, 8)
# ... for a reduction of at least this many terms, whose summand is at most this many nodes (a block repeats it once
# per term), in a kernel of at most this many outputs (more outputs are lanes of upcast's), or one that does not
# read the innermost output loop, the one upcast splits into lanes (computed once for all its lanes:
# DynamicQuantizeLinear's min(x) for its zero point, in the kernel that quantizes x; softmax's row max, once per row
# in the kernel that exponentiates the row: 4x128 rows of 128, thread CPU time, clang-19 0.17 -> 0.10 ms, clang-14
# 0.20 -> 0.14, llvm 0.16 -> 0.09; gcc 0.26 -> 0.43, whose scalar code branches on each select of the tree where the
# sequential chain's branches were predictable)
MAXMIN_BLOCK_MIN_TERMS = 128
MAXMIN_BLOCK_MAX_OUTPUTS = 16
MAXMIN_BLOCK_MAX_NODES = 32
# a float32 sum of at least this many terms is accumulated in float64 (wide_sums): summed one after another in
# float32, LayerNormalization's mean over 256 was within half an ulp of the exact mean in 15% of the rows (onnxruntime
# sums it in double: all of them), and the dynamically quantized transformer's DynamicQuantizeLinears rounded values
# across a step where onnxruntime's did not (10 seeds within 1e-3 of it: 3 before, 7 after; onnx.reference 4).
# Shorter sums (a pool's window, a 7x7 global average) keep float32: their error is a few ulp at most (not measured
# to matter)
WIDE_SUM_MIN_TERMS = 64
# ... a summand of at most this many nodes in blocks of this many neighbours, added in a tree before the accumulator:
# the chain of float64 adds is then an eighth as long (a row sum of squares over 2048x256 written in C, thread CPU
# time: float32 chain gcc 0.21 ms, clang-19 0.39; float64 chain 0.25, 0.25; float64 in blocks of 8 0.13, 0.08;
# compiled, old/new interleaved: LayerNormalization over 2048x256 c 0.52 -> 0.24 ms, llvm 0.50 -> 0.21, softmax over
# 32x128x128 c 0.71 -> 0.63)
WIDE_SUM_BLOCK = 8
WIDE_SUM_BLOCK_MAX_NODES = 32


def unroll_small_reduces(ast: UOp) -> UOp:
  """Each ACCUMULATE over at most UNROLL_MAX_REDUCE elements -> its terms combined in the loop's own order, from the
  same identity (acc = op(value, acc), as the renderers update an accumulator), so the result is the same."""
  terms = lambda u: prod(r.size for r in u.src[1:])
  if any(u.op in SCALAR_CALLS for u in ast.toposort()):
    return ast
  while True:
    acc = next(
      (
        u
        for u in ast.toposort()
        if u.op is Ops.ACCUMULATE
        and u.dtype == u.src[0].dtype
        and terms(u) <= UNROLL_MAX_REDUCE
        and terms(u) * len(u.src[0].toposort()) <= UNROLL_MAX_NODES
      ),
      None,
    )
    if acc is None:
      return ast
    ranges = acc.src[1:]
    total = UOp.const(acc.dtype, acc.reduce_op.identity(acc.dtype))
    for flat in range(prod(r.size for r in ranges)):
      at, stride = {}, 1
      for r in reversed(ranges):
        at[r] = UOp.const(dtypes.index, flat // stride % r.size)
        stride *= r.size
      total = substitute(acc.src[0], at).alu(COMBINE[acc.reduce_op], total)
    ast = graph_rewrite(substitute(ast, {acc: total}), pm_simplify)


def _tree(op: Ops, terms: list[UOp]) -> UOp:
  """terms (oldest first) combined pairwise, each pair as op(newer, older) like an accumulator's update."""
  while len(terms) > 1:
    terms = [terms[i + 1].alu(op, terms[i]) for i in range(0, len(terms) - 1, 2)] + terms[len(terms) & ~1 :]
  return terms[0]


def maxmin_blocks(ast: UOp) -> UOp | None:
  """Each long float MAX/MIN accumulator -> one over blocks of neighbours (MAXMIN_BLOCKS) along its innermost range,
  each block combined in a tree (_tree). NaN-propagating max/min (keep the newer value when it is NaN, else the older
  on a tie) is associative with the identity on both sides, so grouping the terms, in their order, changes no bit of
  the result (a zero keeps the sign of the first zero reaching the extreme, a NaN the payload of the last NaN).
  None when no accumulator qualifies."""
  outs, accs = _loops_and_sums(ast)
  few = prod(r.size for r in outs) <= MAXMIN_BLOCK_MAX_OUTPUTS
  mapping = {}
  for acc in accs:
    inner = acc.src[-1]
    if (
      not (few or outs[-1] not in acc.src[0].toposort())
      or acc.reduce_op not in (ReduceOp.MAX, ReduceOp.MIN)
      or not acc.dtype.is_float
      or acc.dtype != acc.src[0].dtype
      or prod(r.size for r in acc.src[1:]) < MAXMIN_BLOCK_MIN_TERMS
      or (size := next((b for b in MAXMIN_BLOCKS if inner.size % b == 0), None)) is None
      or len(acc.src[0].toposort()) > MAXMIN_BLOCK_MAX_NODES
    ):
      continue
    block = UOp(Ops.RANGE, dtypes.index, (), (inner.number, inner.size // size, "reduce"))
    terms = [substitute(acc.src[0], {inner: block * size + j}) for j in range(size)]
    tree = _tree(COMBINE[acc.reduce_op], terms)
    mapping[acc] = UOp(Ops.ACCUMULATE, acc.dtype, (tree, *acc.src[1:-1], block), acc.arg)
  return graph_rewrite(substitute(ast, mapping), pm_simplify) if mapping else None


def runtime_blocks(ast: UOp) -> UOp:
  """maxmin_blocks and wide_sums' blocks for an accumulator over one loop to a run-time size n_ (a softmax's row of
  keys): its whole blocks (n_ // b of them) each combined in a tree, then the rest (n_ % b terms) one by one, the two
  combined in order. Over the range's bound, a loop to n_ could not be cut in equal blocks, and a chain of selects or
  float64 adds is latency-bound (a MiniLM-sized encoder's softmax over 256 keys: 1.39 ms a layer, 0.43 in blocks)."""
  mapping, fresh = {}, 1 + max((u.number for u in ast.toposort() if u.op is Ops.RANGE), default=-1)
  for acc in [u for u in ast.toposort() if u.op is Ops.ACCUMULATE]:
    (inner, *more), op = acc.src[1:], acc.reduce_op
    if more or not inner.runtime or not acc.dtype.is_float or acc.dtype != acc.src[0].dtype:
      continue
    nodes = len(acc.src[0].toposort())
    if op in (ReduceOp.MAX, ReduceOp.MIN) and nodes <= MAXMIN_BLOCK_MAX_NODES:
      size = MAXMIN_BLOCKS[0]
    elif op is ReduceOp.SUM and acc.dtype == dtypes.float64 and nodes <= WIDE_SUM_BLOCK_MAX_NODES:
      size = WIDE_SUM_BLOCK
    else:
      continue
    if inner.size < size:
      continue  # (a bound below one block: no whole block at any size, and a loop of none is no loop)
    n = inner.extent
    block = UOp(Ops.RANGE, dtypes.index, (), (inner.number, inner.size // size, "reduce", n // size))
    rest = UOp(Ops.RANGE, dtypes.index, (), (fresh, size, "reduce", n % size))
    fresh += 1
    tree = _tree(COMBINE[op], [substitute(acc.src[0], {inner: block * size + j}) for j in range(size)])
    whole = UOp(Ops.ACCUMULATE, acc.dtype, (tree, block), acc.arg)
    tail = UOp(Ops.ACCUMULATE, acc.dtype, (substitute(acc.src[0], {inner: n // size * size + rest}), rest), acc.arg)
    mapping[acc] = tail.alu(COMBINE[op], whole)
  return graph_rewrite(substitute(ast, mapping), pm_simplify) if mapping else ast


def _lanes(ast: UOp, r: UOp, factor: int) -> UOp:
  """The kernel with range r split into r' (size S/factor) and factor unrolled lanes, one STORE each."""
  outer = UOp(Ops.RANGE, dtypes.index, (), (r.number, r.size // factor, "loop"))
  stores = []
  for v in range(factor):
    lane = simplify(outer * factor + v)
    stores.append(substitute(ast, {r: lane}))
  # simplify the index arithmetic of each lane (r' * f + v through divisions and modulos)
  return graph_rewrite(UOp(Ops.SINK, dtypes.void, tuple(stores)), pm_simplify)


def _vector_loads(ast: UOp, inner: UOp) -> set[UOp]:
  """The float loads inside the kernel's sums that vary with its innermost output loop (the vectoriser's)."""
  return {
    u
    for a in ast.toposort()
    if a.op is Ops.ACCUMULATE
    for u in a.src[0].toposort()
    if u.op is Ops.LOAD and u.dtype.is_float and inner in u.toposort()
  }


def _shared_lanes(ast: UOp, outs: list[UOp]) -> UOp | None:
  """A short reduction's kernel with lanes over an outer output range that one of its operands reads only in blocks
  (a grouped convolution's output channels, which all read their group's input): the lanes load that operand once,
  and the vectoriser runs them along the innermost loop. None when no such range exists."""
  loads = len(_vector_loads(ast, outs[-1]))
  for r in outs[:-1]:
    for f in SHARED_LANES:
      # splitting the outermost loop must leave enough to share between threads
      if r.size % f or (r.number == 0 and r.size // f < SHARED_LANES_MIN_SPLIT):
        continue
      lanes = _lanes(ast, r, f)
      if len(_vector_loads(lanes, outs[-1])) < f * loads:
        return lanes
  return None


def _merge_inner(ast: UOp, outs: list[UOp]) -> tuple[UOp, list[UOp]]:
  """The kernel with its two innermost output loops made one wherever every index reads them as one (a plane's rows
  and columns, r1 * W + r2): one long loop vectorises without a remainder per row (a 28-wide row is 3 vectors of 8
  and 4 scalars). Repeated while it applies; unchanged when a gate or a window reads a row on its own."""
  while len(outs) >= 2:
    hi, lo = outs[-2], outs[-1]
    if hi.number == 0:
      break
    both = UOp(Ops.RANGE, dtypes.index, (), (hi.number, hi.size * lo.size, "loop"))
    merged = graph_rewrite(substitute(ast, {hi: both // lo.size, lo: both % lo.size}), pm_simplify)
    if any(u.op in (Ops.IDIV, Ops.MOD) and u.src[0] is both for u in merged.toposort()):
      break
    ast, outs = merged, [*outs[:-2], both]
  return ast, outs


def _gated_by(ast: UOp, rngs: set) -> bool:
  """Does a load's gate vary with one of these ranges?"""
  gates = [u.src[2] for u in ast.toposort() if u.op is Ops.LOAD and u.src[2].op is not Ops.CONST]
  return any(r in rngs for g in gates for r in g.toposort() if r.op is Ops.RANGE)


def _loops_and_sums(ast: UOp) -> tuple[list[UOp], list[UOp]]:
  """A STORE kernel's output loops (outer first) and its sums."""
  if ast.op is not Ops.STORE:
    return [], []
  topo = ast.toposort()
  outs = sorted((u for u in topo if u.op is Ops.RANGE and u.kind in ("loop", "panels")), key=lambda r: r.number)
  return outs, [u for u in topo if u.op is Ops.ACCUMULATE]


def short_sum_lanes(ast: UOp) -> UOp | None:
  """A kernel whose sums are all too short to upcast, with its plane's loops merged and lanes over an outer range
  that share loads (_shared_lanes); None when it has no such range."""
  outs, accs = _loops_and_sums(ast)
  if not outs or not accs or max(prod(r.size for r in a.src[1:]) for a in accs) >= UPCAST_MIN_REDUCE:
    return None
  return _shared_lanes(*_merge_inner(ast, outs))


def upcast(ast: UOp) -> UOp:
  """STORE -> SINK of STOREs: the innermost output loop r (size S) becomes r' (S/u) with u unrolled lanes; a kernel
  whose sums are short has its plane's loops merged (_merge_inner) and, where they share loads, lanes over an outer
  range (_shared_lanes)."""
  outs, accs = _loops_and_sums(ast)
  if not outs:
    return ast
  # an elementwise kernel (a contraction's epilogue: SiLU's exp over a conv's 40x40 plane) in one loop over the plane
  # has no remainder per row, which it ran scalar (a 40-wide row: 2 vectors of 16 and 8 scalar exps); not one whose
  # loads the plane's loops gate (an im2col's padding: its rows are cut into pieces at the gates, in_pieces)
  if not accs:
    return ast if _gated_by(ast, set(outs[-2:])) else _merge_inner(ast, outs)[0]
  if max(prod(r.size for r in a.src[1:]) for a in accs) < UPCAST_MIN_REDUCE:
    merged, outs = _merge_inner(ast, outs)
    return _shared_lanes(merged, outs) or merged
  r = outs[-1]
  factor = next((f for f in UPCAST if r.size % f == 0 and r.size > f), None)
  # splitting the outermost loop would leave nothing to share between threads
  if factor is None or (len(outs) == 1 and r.size // factor < 2):
    return ast
  return _lanes(ast, r, factor)


# erf in two forms, both computed and one taken by a select (a blend, which vectorises): below ERF_SPLIT,
# erf(x) = x + x R(x^2) (R small, so its rounding is a fraction of an ulp of erf); from it to ERF_CLAMP = 4 (past it
# erf rounds to 1), erf(x) = 1 - S(x - ERF_SPLIT)^2 with S = sqrt(erfc) a rational (erfc itself decays too fast for
# a low-degree rational; its square root as fast as a Gaussian twice as wide). Both fitted here in double precision
# to erf's error (Lawson's reweighted least squares towards minimax; the rational linearised in its denominator and
# weighted up near the split, where S^2's rounding is the largest part of an ulp), float32 coefficients: within
# 1.38 ulp of erf evaluated in double over [-4, 4] (the one rational x P(x^2) / Q(x^2) it replaced was within 7,
# onnxruntime's 1). One division and no exp, 40 operations where the rational took 31: an exact GELU over
# 128x1024 (thread CPU time, 1 thread, medians of 300 interleaved) 1.02-1.06x the rational's under clang-19, clang-14,
# gcc and llvm (0.044-0.050 ms; one run of three 1.10x under clang-19).
ERF_CLAMP = 4.0
ERF_SPLIT = 0.9
ERF_R = [0.12837915, -0.37612525, 0.11282141, -0.026778908, 0.0050119623, -0.0006090356]
ERF_S_P = [0.45065707, -0.54784924, 0.25745764, -0.055396937, 0.004598895]
ERF_S_Q = [1.0, 0.020148339, 0.24759506, 0.00054075767, 0.020944446]


def _poly(t: UOp, coeffs) -> UOp:
  """coeffs[0] + coeffs[1] t + ... in float32, by Horner's rule."""
  acc = UOp.const(dtypes.float32, coeffs[-1])
  for c in reversed(coeffs[:-1]):
    acc = acc.alu(Ops.MUL, t).alu(Ops.ADD, UOp.const(dtypes.float32, c))
  return acc


def _odd(x: UOp, of_abs) -> UOp:
  """An odd function of float32 x as of_abs(|x|) with x's sign bit put back: |x| and the sign as integer masks, two
  ANDs and an OR where a compare, two negations and two selects were (-0 stays -0, a NaN stays NaN)."""
  bits = lambda v: UOp(Ops.BITCAST, dtypes.int32, (v,))
  xb = bits(x)
  ab = xb.alu(Ops.AND, UOp.const(dtypes.int32, 0x7FFFFFFF))
  y = of_abs(UOp(Ops.BITCAST, dtypes.float32, (ab,)))
  return UOp(Ops.BITCAST, dtypes.float32, (bits(y).alu(Ops.OR, xb.alu(Ops.XOR, ab)),))


def _erf32(x: UOp) -> UOp:
  """erf(x) from multiplies, adds, one division and bit masks, its two forms joined by a select, so that it vectorises
  (libm's erff does not, and was a third of the transformer's time). A NaN fails every compare and stays NaN, the
  result takes x's sign bit (-0 stays -0), and 1 - S^2 never passes 1."""
  f = lambda v: UOp.const(dtypes.float32, v)

  def of_abs(ax: UOp) -> UOp:
    ax = f(ERF_CLAMP).alu(Ops.CMPLT, ax).alu(Ops.WHERE, f(ERF_CLAMP), ax, dtype=dtypes.float32)
    small = ax.alu(Ops.ADD, ax.alu(Ops.MUL, _poly(ax.alu(Ops.MUL, ax), ERF_R)))
    u = ax.alu(Ops.SUB, f(ERF_SPLIT))
    s = _poly(u, ERF_S_P).alu(Ops.DIV, _poly(u, ERF_S_Q))
    big = f(1.0).alu(Ops.SUB, s.alu(Ops.MUL, s))
    return ax.alu(Ops.CMPLT, f(ERF_SPLIT)).alu(Ops.WHERE, small, big, dtype=dtypes.float32)

  return _odd(x, of_abs)


# exp(x) = 2^n exp(r), n = rint(x / ln 2), r = x - n ln 2 in [-ln2/2, ln2/2] (ln 2 in two parts, the first exact in
# n * LN2_HI for |n| < 2^9), exp(r) = 1 + r + r^2 q(r), q of degree 4 fitted to exp's relative error over that
# interval (Lawson's reweighted least squares, float32 coefficients: within 3.2e-9 relative, where the Taylor series
# needed degree 7); 2^n as two exponent-field powers (n >> 1 and the rest) so that results down to the denormals
# stay right. Evaluated in float32 as below over 2M points of [-103.9, 88.7]: within 1.59 ulp (the Taylor form 1.68)
EXP_POLY = [1.0, 1.0, 0.49999994, 0.1666652, 0.041668408, 0.0083689196, 0.0013814213]
LN2_HI, LN2_LO = 0.693359375, math.log(2) - 0.693359375
# x is clamped to [EXP_MIN, EXP_HIGH], where the arithmetic itself gives 0 (below 2^-150, rounded to even) and inf
# (past the largest float): what lies beyond needs no fix afterwards
EXP_MIN, EXP_HIGH = -103.97208404541016, 89.0


def _exp32(x: UOp) -> UOp:
  """exp(x) from multiplies, adds, a rint and integer exponent arithmetic (within 2 ulp of it): libm's expf does
  not vectorise, and was most of a SiLU's or a sigmoid's time (a MobileNet-style block with SiLU ran 10x slower
  than with ReLU6). 35 operations where the form before this one took 40 (a NaN select in its clamp, two range
  fixes at the end, a degree-7 series) and a shift for n / 2 where it truncated (three instructions): a SiLU over
  16x160x160, 1 thread, 0.150 -> 0.113 ms."""
  f = lambda v: UOp.const(dtypes.float32, v)
  i = lambda v: UOp.const(dtypes.int32, v)
  where = lambda c, a, b: c.alu(Ops.WHERE, a, b, dtype=dtypes.float32)
  # a NaN fails the first compare and is clamped to EXP_MIN (its int conversion below is then defined), and is
  # given back at the end
  xc = where(f(EXP_MIN).alu(Ops.CMPLE, x), x, f(EXP_MIN))
  xc = where(xc.alu(Ops.CMPLT, f(EXP_HIGH)), xc, f(EXP_HIGH))
  n = xc.alu(Ops.MUL, f(1 / math.log(2))).alu(Ops.ROUND)
  r = xc.alu(Ops.SUB, n.alu(Ops.MUL, f(LN2_HI))).alu(Ops.SUB, n.alu(Ops.MUL, f(LN2_LO)))
  p = _poly(r, EXP_POLY)
  ni = n.cast(dtypes.int32)
  half = ni.alu(Ops.SHR, i(1))
  two_to = lambda e: UOp(Ops.BITCAST, dtypes.float32, (e.alu(Ops.ADD, i(127)).alu(Ops.SHL, i(23)),))
  y = p.alu(Ops.MUL, two_to(half)).alu(Ops.MUL, two_to(ni.alu(Ops.SUB, half)))
  return where(x.alu(Ops.CMPNE, x), x, y)


# tanh(x) for |x| below TANH_SPLIT as x + x^3 P(x^2), P of degree 4 fitted to tanh's relative error there
# (Lawson's reweighted least squares, float32 coefficients: within 4.4e-9), from it as 1 - 2 / (exp(2|x|) + 1)
# (2 / (e + 1) is below 0.45 there, so the difference loses under a bit); the sign put back as a bit. Evaluated in
# float32 over 4.2M points of [-12, 12] and [1e-30, 10]: within 1.3 ulp
TANH_SPLIT = 0.625
TANH_P = [-0.3333328068256378, 0.13331441581249237, -0.05373971536755562, 0.0206390842795372, -0.005704979412257671]


def _tanh32(x: UOp) -> UOp:
  """tanh(x) as arithmetic that vectorises, its two forms joined by a select: libm's tanhf does not (an LSTM's gates
  and cell output, a Mish, a tanh-approximated GELU). A NaN fails the compare and comes out of exp as NaN; past
  |x| = 44 exp is inf and the result 1; -0 stays -0."""
  f = lambda v: UOp.const(dtypes.float32, v)

  def of_abs(ax: UOp) -> UOp:
    z = ax.alu(Ops.MUL, ax)
    small = ax.alu(Ops.ADD, ax.alu(Ops.MUL, z).alu(Ops.MUL, _poly(z, TANH_P)))
    e = _exp32(ax.alu(Ops.ADD, ax))
    big = f(1.0).alu(Ops.SUB, f(2.0).alu(Ops.DIV, e.alu(Ops.ADD, f(1.0))))
    return ax.alu(Ops.CMPLT, f(TANH_SPLIT)).alu(Ops.WHERE, small, big, dtype=dtypes.float32)

  return _odd(x, of_abs)


# log(x) = e ln 2 + log(m) for x = m 2^e, m in [sqrt(1/2), sqrt(2)); log(m) = 2 atanh(s), s = (m - 1) / (m + 1) (|s| <
# 0.172; m - 1 is exact), by its series to s^9 (the remainder is below 1e-9 relative); denormals scaled by 2^23 first
LOG_SERIES = [2 / (2 * n + 1) for n in range(5)]
SQRT2 = 1.4142135


def _log32(x: UOp) -> UOp:
  """log(x) from multiplies, adds, one division and exponent bit fields (within 2 ulp of it): libm's logf does not
  vectorise (LRN's power of its window sum, as exp of a log: 2.1 ms of Inception-v1's 18.6 in scalar powf)."""
  f = lambda v: UOp.const(dtypes.float32, v)
  i = lambda v: UOp.const(dtypes.int32, v)
  where = lambda c, a, b, dt=dtypes.float32: c.alu(Ops.WHERE, a, b, dtype=dt)
  tiny = x.alu(Ops.CMPLT, f(2.0**-126))
  bits = UOp(Ops.BITCAST, dtypes.int32, (where(tiny, x.alu(Ops.MUL, f(2.0**23)), x),))
  e = bits.alu(Ops.SHR, i(23)).alu(Ops.SUB, where(tiny, i(150), i(127), dtypes.int32))
  m = UOp(Ops.BITCAST, dtypes.float32, (bits.alu(Ops.AND, i(0x7FFFFF)).alu(Ops.OR, i(0x3F800000)),))
  big = f(SQRT2).alu(Ops.CMPLT, m)
  m = where(big, m.alu(Ops.MUL, f(0.5)), m)
  e = e.alu(Ops.ADD, where(big, i(1), i(0), dtypes.int32)).cast(dtypes.float32)
  s = m.alu(Ops.SUB, f(1.0)).alu(Ops.DIV, m.alu(Ops.ADD, f(1.0)))
  z = s.alu(Ops.MUL, s)
  # 2s (exact) plus the rest of the series, a correction of under 1% whose rounding hardly reaches the result
  q = _poly(z, LOG_SERIES[1:])
  log_m = s.alu(Ops.MUL, f(2.0)).alu(Ops.ADD, s.alu(Ops.MUL, z).alu(Ops.MUL, q))
  y = e.alu(Ops.MUL, f(LN2_HI)).alu(Ops.ADD, log_m.alu(Ops.ADD, e.alu(Ops.MUL, f(LN2_LO))))
  # log(+-0) = -inf, of a negative number NaN, of inf inf, of NaN the NaN (what the bit fields made of them is dropped)
  y = where(x.alu(Ops.CMPEQ, f(0.0)), f(-math.inf), where(x.alu(Ops.CMPLT, f(0.0)), f(math.nan), y))
  y = where(x.alu(Ops.CMPEQ, f(math.inf)), f(math.inf), y)
  return where(x.alu(Ops.CMPNE, x), x, y)


pm_decompose = PatternMatcher(
  [
    # float32 erf as arithmetic that vectorises (float64 keeps libm's erf: the fit is single precision)
    (UPat(Ops.ERF, dtype=dtypes.float32, src=(UPat(name="x"),)), _erf32),
    # float32 exp likewise (sigmoid, SiLU, softmax, and erf's own exp)
    (UPat(Ops.EXP, dtype=dtypes.float32, src=(UPat(name="x"),)), _exp32),
    # float32 log likewise (log-softmax, LRN's power)
    (UPat(Ops.LOG, dtype=dtypes.float32, src=(UPat(name="x"),)), _log32),
    # float32 tanh likewise (recurrent gates, Mish)
    (UPat(Ops.TANH, dtype=dtypes.float32, src=(UPat(name="x"),)), _tanh32),
  ]
)


def wide_sums(ast: UOp) -> UOp:
  """Each long float32 SUM accumulator (WIDE_SUM_MIN_TERMS) -> one in float64 over its terms widened, rounded to
  float32 once after the loop; a small summand's terms in blocks of neighbours (WIDE_SUM_BLOCK) added in a tree first.
  The float64 sum of float32 terms is all but exact in any order, so the blocks change no more than a rare last bit."""
  mapping = {}
  for acc in _loops_and_sums(ast)[1]:
    inner = acc.src[-1]
    if (
      acc.reduce_op is not ReduceOp.SUM
      or acc.dtype != dtypes.float32
      or acc.src[0].dtype != dtypes.float32
      or prod(r.size for r in acc.src[1:]) < WIDE_SUM_MIN_TERMS
    ):
      continue
    term = acc.src[0].cast(dtypes.float64)
    ranges = acc.src[1:]
    blocks = inner.size % WIDE_SUM_BLOCK == 0 and not inner.runtime
    if blocks and len(acc.src[0].toposort()) <= WIDE_SUM_BLOCK_MAX_NODES:
      block = UOp(Ops.RANGE, dtypes.index, (), (inner.number, inner.size // WIDE_SUM_BLOCK, "reduce"))
      term = _tree(Ops.ADD, [substitute(term, {inner: block * WIDE_SUM_BLOCK + j}) for j in range(WIDE_SUM_BLOCK)])
      ranges = (*acc.src[1:-1], block)
    mapping[acc] = UOp(Ops.ACCUMULATE, dtypes.float64, (term, *ranges), acc.arg).cast(dtypes.float32)
  return graph_rewrite(substitute(ast, mapping), pm_simplify) if mapping else ast


def _nesting(u: UOp) -> tuple:
  # the loops nest outputs' first (in number order), a reduction's inside them: an index term's place is its innermost
  return max(((r.kind == "reduce", r.number) for r in u.toposort() if r.op is Ops.RANGE), default=(False, -1))


def _inner_last(x: UOp) -> UOp | None:
  terms, const = linear(x)
  ordered = dict(sorted(terms.items(), key=lambda t: _nesting(t[0])))
  return None if list(ordered) == list(terms) else from_linear(ordered, const, x.dtype)


# an index summed from the outer loops' terms to the inner ones': the part the inner loop does not change is one value
# computed outside it, and the compilers see its reads as consecutive. Summed inner term first, ((r2 + 128 r1) +
# 16384 r0), clang-19 took the sum for an or of disjoint bits and a row's reads for unrelated addresses, and left the
# loop scalar (softmax's scaling over 4x128 rows of 128). Whole runs, new/old interleaved, thread CPU time, clang-19:
# the dynamically quantized transformer 0.96, ShuffleNet 0.93, Inception-v1 0.98, DenseNet-121 0.98, ResNet-50 0.99
pm_inner_last = PatternMatcher([(UPat(Ops.ADD, dtype=dtypes.index, name="x"), _inner_last)])


def optimize(ast: UOp) -> UOp:
  """The passes, in order: decompose (before upcast, so the lanes share the decomposed form), long float32 sums in
  float64 (wide_sums, before upcast: its lanes each keep one such sum), long max/min in blocks, then either lanes over
  an outer range that share loads (a short grouped sum: 24->112 channels in 4 groups over 56x56, 0.069 ms written
  out term by term, 0.040 ms in shared lanes, onnxruntime 0.058), or small reductions written out and upcast; last,
  each index summed from the outer loops' terms to the inner ones' (pm_inner_last)."""
  ast = wide_sums(graph_rewrite(ast, pm_decompose))
  # loops to a run-time size (aot/scheduler/runtime_extent.py) are not split, merged or unrolled: each of those takes
  # the loop's size as known
  if takes_runtime_size(ast):
    return graph_rewrite(runtime_blocks(ast), pm_inner_last)
  blocks = maxmin_blocks(ast)
  if blocks is not None:
    outs, _ = _loops_and_sums(blocks)
    # a few outputs, each from a long reduction in blocks: as they are (upcast would repeat the blocks per lane)
    if prod(r.size for r in outs) <= MAXMIN_BLOCK_MAX_OUTPUTS:
      return graph_rewrite(blocks, pm_inner_last)
    ast = blocks
  shared = short_sum_lanes(ast)
  return graph_rewrite(shared if shared is not None else upcast(unroll_small_reduces(ast)), pm_inner_last)
