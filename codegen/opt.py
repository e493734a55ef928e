"""Optimisation passes on a kernel's loop nest, before it is linearized (every target reads their result).

upcast: the innermost output loop of a reduction kernel is split by a small factor and its inner part unrolled into
separate accumulators that share one reduction loop. The unrolled lanes read neighbouring elements and do
independent work, which the C and LLVM vectorisers (SLP) turn into vector loads and vector multiply-adds; loads that
do not depend on that loop (a matmul's row of A) are read once for all lanes."""
from __future__ import annotations
from aot.dtype import dtypes
from aot.ir import UOp, Ops, prod
from aot.rewrite import substitute, graph_rewrite
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
  if not accs or max(prod(r.arg[1] for r in a.src[1:]) for a in accs) < UPCAST_MIN_REDUCE: return ast
  outs = sorted((u for u in topo if u.op is Ops.RANGE and u.arg[2] == "loop"), key=lambda r: r.arg[0])
  if not outs: return ast
  r = outs[-1]
  factor = next((f for f in UPCAST if r.arg[1] % f == 0 and r.arg[1] > f), None)
  # splitting the outermost loop would leave nothing to share between threads
  if factor is None or (len(outs) == 1 and r.arg[1] // factor < 2): return ast
  outer = UOp(Ops.RANGE, dtypes.index, (), (r.arg[0], r.arg[1] // factor, "loop"))
  stores = []
  for v in range(factor):
    lane = simplify(outer * factor + v)
    stores.append(substitute(ast, {r: lane}))
  # simplify the index arithmetic of each lane (r' * f + v through divisions and modulos)
  return graph_rewrite(UOp(Ops.SINK, dtypes.void, tuple(stores)), pm_simplify)

def optimize(ast: UOp) -> UOp:
  """The passes, in order: (upcast is the only one so far)."""
  return upcast(ast)
