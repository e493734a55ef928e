"""Optimisation passes on a kernel's loop nest, before it is linearized (every target reads their result).

upcast: the innermost output loop of a reduction kernel is split by a small factor and its inner part unrolled into
separate accumulators that share one reduction loop. The unrolled lanes read neighbouring elements and do
independent work, which the C and LLVM vectorisers (SLP) turn into vector loads and vector multiply-adds; loads that
do not depend on that loop (a matmul's row of A) are read once for all lanes."""
from __future__ import annotations
from aot.dtype import dtypes
from aot.ir import UOp, Ops, prod
import math
from aot.rewrite import substitute, graph_rewrite, PatternMatcher, UPat
from aot.symbolic import simplify, pm_simplify

# lanes per upcast: 8 floats fill an AVX register; more lanes add accumulators without adding vector width here
UPCAST = (8, 4)
# a reduction shorter than this gains nothing worth the bigger kernel
UPCAST_MIN_REDUCE = 8

def upcast(ast: UOp) -> UOp:
  """STORE -> SINK of STOREs: the innermost output loop r (size S) becomes r' (S/u) with u unrolled lanes."""
  if ast.op is not Ops.STORE: return ast
  topo = ast.toposort()
  accs = [u for u in topo if u.op is Ops.ACCUMULATE]
  if not accs or max(prod(r.size for r in a.src[1:]) for a in accs) < UPCAST_MIN_REDUCE: return ast
  outs = sorted((u for u in topo if u.op is Ops.RANGE and u.kind == "loop"), key=lambda r: r.number)
  if not outs: return ast
  r = outs[-1]
  factor = next((f for f in UPCAST if r.size % f == 0 and r.size > f), None)
  # splitting the outermost loop would leave nothing to share between threads
  if factor is None or (len(outs) == 1 and r.size // factor < 2): return ast
  outer = UOp(Ops.RANGE, dtypes.index, (), (r.number, r.size // factor, "loop"))
  stores = []
  for v in range(factor):
    lane = simplify(outer * factor + v)
    stores.append(substitute(ast, {r: lane}))
  # simplify the index arithmetic of each lane (r' * f + v through divisions and modulos)
  return graph_rewrite(UOp(Ops.SINK, dtypes.void, tuple(stores)), pm_simplify)

# erf's Taylor series at |x| < 1/2 (2/sqrt(pi) * (-1)^n / (n! (2n+1)), relative error < 1e-8 there), and Numerical
# Recipes' fit erfc(z) = t exp(-z^2 + P(t)), t = 1/(1 + z/2), elsewhere (fractional error < 1.2e-7)
ERF_TAYLOR = [2 / math.sqrt(math.pi) * (-1) ** n / (math.factorial(n) * (2 * n + 1)) for n in range(8)]
ERFC_FIT = [-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807, -1.13520398, 1.48851587,
            -0.82215223, 0.17087277]

def _erf32(x: UOp) -> UOp:
  """erf(x) from multiplies, adds and one exp (within 2e-7 of it): no call into libm's erff, which does not vectorise
  and was a third of the transformer's time (exact GELU)."""
  f = lambda v: UOp.const(dtypes.float32, v)
  def poly(t: UOp, coeffs) -> UOp:
    acc = f(coeffs[-1])
    for c in reversed(coeffs[:-1]): acc = acc.alu(Ops.MUL, t).alu(Ops.ADD, f(c))
    return acc
  ax, x2 = x.alu(Ops.ABS), x.alu(Ops.MUL, x)
  t = f(1.0).alu(Ops.DIV, f(1.0).alu(Ops.ADD, f(0.5).alu(Ops.MUL, ax)))
  erfc = t.alu(Ops.MUL, x2.alu(Ops.NEG).alu(Ops.ADD, poly(t, ERFC_FIT)).alu(Ops.EXP))
  tail = f(1.0).alu(Ops.SUB, erfc)
  tail = x.alu(Ops.CMPLT, f(0.0)).alu(Ops.WHERE, tail.alu(Ops.NEG), tail, dtype=dtypes.float32)
  return ax.alu(Ops.CMPLT, f(0.5)).alu(Ops.WHERE, x.alu(Ops.MUL, poly(x2, ERF_TAYLOR)), tail, dtype=dtypes.float32)

# exp(x) = 2^n exp(r), n = rint(x / ln 2), r = x - n ln 2 in [-ln2/2, ln2/2] (ln 2 in two parts, the first exact in
# n * LN2_HI for |n| < 2^9), exp(r) by its Taylor series to r^7 (the remainder is below 6e-9 relative); 2^n as two
# exponent-field powers so that results down to the denormals (n >= -150) stay right
EXP_TAYLOR = [1 / math.factorial(n) for n in range(8)]
LN2_HI, LN2_LO = 0.693359375, math.log(2) - 0.693359375
# past these exp is inf, or below the smallest denormal (0)
EXP_MAX, EXP_MIN = 88.72283935546875, -103.97208404541016

def _exp32(x: UOp) -> UOp:
  """exp(x) from multiplies, adds, a rint and integer exponent arithmetic (within 2 ulp of it): libm's expf does
  not vectorise, and was most of a SiLU's or a sigmoid's time (a MobileNet-style block with SiLU ran 10x slower
  than with ReLU6)."""
  f = lambda v: UOp.const(dtypes.float32, v)
  i = lambda v: UOp.const(dtypes.int32, v)
  nan = x.alu(Ops.CMPNE, x)
  xc = nan.alu(Ops.WHERE, f(0.0), x.alu(Ops.MAX, f(EXP_MIN)).alu(Ops.MIN, f(EXP_MAX)), dtype=dtypes.float32)
  n = xc.alu(Ops.MUL, f(1 / math.log(2))).alu(Ops.ROUND)
  r = xc.alu(Ops.SUB, n.alu(Ops.MUL, f(LN2_HI))).alu(Ops.SUB, n.alu(Ops.MUL, f(LN2_LO)))
  p = f(EXP_TAYLOR[-1])
  for c in reversed(EXP_TAYLOR[:-1]): p = p.alu(Ops.MUL, r).alu(Ops.ADD, f(c))
  ni = n.cast(dtypes.int32)
  half = ni.alu(Ops.IDIV, i(2))
  two_to = lambda e: UOp(Ops.BITCAST, dtypes.float32, (e.alu(Ops.ADD, i(127)).alu(Ops.SHL, i(23)),))
  y = p.alu(Ops.MUL, two_to(half)).alu(Ops.MUL, two_to(ni.alu(Ops.SUB, half)))
  y = x.alu(Ops.CMPLT, f(EXP_MIN)).alu(Ops.WHERE, f(0.0), y, dtype=dtypes.float32)
  y = f(EXP_MAX).alu(Ops.CMPLT, x).alu(Ops.WHERE, f(math.inf), y, dtype=dtypes.float32)
  return nan.alu(Ops.WHERE, x, y, dtype=dtypes.float32)

pm_decompose = PatternMatcher([
  # float32 erf as arithmetic that vectorises (float64 keeps libm's erf: the fit is single precision)
  (UPat(Ops.ERF, dtype=dtypes.float32, src=(UPat(name="x"),)), _erf32),
  # float32 exp likewise (sigmoid, SiLU, softmax, and erf's own exp)
  (UPat(Ops.EXP, dtype=dtypes.float32, src=(UPat(name="x"),)), _exp32),
])

def optimize(ast: UOp) -> UOp:
  """The passes, in order: decompose (before upcast, so the lanes share the decomposed form), upcast."""
  return upcast(graph_rewrite(ast, pm_decompose))
