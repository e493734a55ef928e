"""The index simplifier (aot/core/symbolic.py) against brute force: seeded random index expressions over small loops
(sums of loop variables times constants, some negative, divided and taken modulo, nested), evaluated at every point of
their loops before and after simplification, and their value ranges checked against the values they take. Divisors
are drawn around each expression's largest value, where a fold's boundary (x < c, x <= c) decides."""

import itertools

import numpy as np
import pytest

from aot.core.dtype import dtypes
from aot.core.ir import Ops, UOp
from aot.core.symbolic import simplify


def evaluate(u: UOp, env: dict) -> int:
  """C's integer semantics (division truncates toward zero), independent of the simplifier."""
  if u.op is Ops.CONST:
    return int(u.arg)
  if u.op is Ops.RANGE:
    return env[u]
  a, b = (evaluate(s, env) for s in u.src)
  if u.op is Ops.ADD:
    return a + b
  if u.op is Ops.MUL:
    return a * b
  q = abs(a) // abs(b) * (1 if (a >= 0) == (b > 0) else -1)
  if u.op is Ops.IDIV:
    return q
  if u.op is Ops.MOD:
    return a - b * q
  raise ValueError(f"unexpected {u.op}")


# raw nodes: UOp's operators simplify as they build, which would compare the simplifier with itself
def node(op: Ops, a: UOp, b) -> UOp:
  return UOp(op, dtypes.index, (a, b if isinstance(b, UOp) else UOp.const(dtypes.index, b)))


def points(ranges: list[UOp]):
  for values in itertools.product(*(range(r.arg[1]) for r in ranges)):
    yield dict(zip(ranges, values))


def random_expr(rng, ranges: list[UOp], depth: int) -> UOp:
  """A sum of loop variables times small constants plus a constant; at depth > 0, also a divided or mod'ed
  subexpression (its divisor drawn near its largest value, or a small one)."""
  e = UOp.const(dtypes.index, int(rng.integers(-3, 6)))
  for r in ranges:
    if k := int(rng.integers(-2, 5)):
      e = node(Ops.ADD, e, node(Ops.MUL, r, k))
  if depth > 0 and rng.random() < 0.8:
    inner = random_expr(rng, ranges, depth - 1)
    top = max(evaluate(inner, p) for p in points(ranges))
    d = max(int(rng.choice([top, top + 1, top + 2, top - 1, 2, 3, 4, 6])), 1)
    folded = node(Ops.MOD if rng.random() < 0.6 else Ops.IDIV, inner, d)
    e = node(Ops.ADD, node(Ops.MUL, e, int(rng.integers(0, 3))), node(Ops.MUL, folded, int(rng.integers(1, 4))))
  return e


def test_simplified_index_expressions_equal_the_originals_everywhere():
  rng = np.random.default_rng(0)
  for n in range(400):
    sizes = rng.integers(1, 7, int(rng.integers(1, 4)))
    ranges = [UOp(Ops.RANGE, dtypes.index, (), (i, int(size), "loop")) for i, size in enumerate(sizes)]
    e = random_expr(rng, ranges, 2)
    s = simplify(e)
    for p in points(ranges):
      want, got = evaluate(e, p), evaluate(s, p)
      at = {r.arg[0]: v for r, v in p.items()}
      assert got == want, f"expression {n}: {e} simplified to {s} gives {got}, not {want}, at {at}"
      assert e.vmin <= want <= e.vmax and s.vmin <= want <= s.vmax, f"expression {n}: {want} outside its range at {at}"


@pytest.mark.parametrize("size,d", [(4, 3), (4, 4), (4, 5), (6, 2), (6, 6), (6, 7)])
def test_mod_and_div_of_a_loop_variable_at_the_boundary(size, d):
  # r % d is r itself exactly when r < d everywhere (r's largest value is size - 1), and r // d is 0 then
  r = UOp(Ops.RANGE, dtypes.index, (), (0, size, "loop"))
  for e in (
    node(Ops.MOD, r, d),
    node(Ops.IDIV, r, d),
    node(Ops.MOD, node(Ops.ADD, r, 1), d),
    node(Ops.IDIV, node(Ops.ADD, node(Ops.MUL, r, 2), 1), d),
  ):
    s = simplify(e)
    assert [evaluate(s, {r: v}) for v in range(size)] == [evaluate(e, {r: v}) for v in range(size)], f"{e} -> {s}"


def test_an_offset_below_the_stride_never_carries():
  # (g r + v) // c = r // (c / g) and (g r + v) % c = g (r % (c / g)) + v when g divides c and 0 <= v < g: an
  # unrolled lane's channel (4 r + v) reads its group (4 r + v) // 28 as r // 7, one load shared by the lanes
  r, q = (UOp(Ops.RANGE, dtypes.index, (), (i, n, "loop")) for i, n in enumerate((30, 5)))
  for g, v, c in itertools.product((2, 4, 6), range(7), (4, 12, 24, 28)):
    for e in (
      node(Ops.IDIV, node(Ops.ADD, node(Ops.MUL, r, g), v), c),
      node(Ops.MOD, node(Ops.ADD, node(Ops.ADD, node(Ops.MUL, r, g), node(Ops.MUL, q, 2 * g)), v), c),
    ):
      s = simplify(e)
      assert all(evaluate(s, p) == evaluate(e, p) for p in points([r, q])), f"{e} -> {s}"
  lane = simplify(node(Ops.IDIV, node(Ops.ADD, node(Ops.MUL, r, 4), 3), 28))
  assert lane.op is Ops.IDIV and lane.src[0] is r and lane.src[1].arg == 7
