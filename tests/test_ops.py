"""Every Tensor op against numpy, through the real artifact path: compile_model -> libNAME.so -> load -> call.
The numpy references are written independently of the compiler (never compared with our own output)."""

from __future__ import annotations

import math
import tempfile

import numpy as np
import pytest

# *** helpers ***
from conftest import run

import aot
from aot import Tensor

# every test here runs once per target
pytestmark = pytest.mark.usefixtures("each_target")


def rng(seed=0):
  return np.random.default_rng(seed)


def randf(shape, seed=0, lo=-2.0, hi=2.0, dtype=np.float32):
  return rng(seed).uniform(lo, hi, size=shape).astype(dtype)


def randi(shape, seed=0, lo=-5, hi=6, dtype=np.int32):
  return rng(seed).integers(lo, hi, size=shape).astype(dtype)


F32 = dict(rtol=1e-5, atol=1e-5)
TRANS = dict(rtol=1e-5, atol=1e-6)  # transcendental functions: libm vs numpy
F16 = dict(rtol=1e-2, atol=1e-2)


def check(out, ref, dtype=None, **tol):
  """out has the reference's shape (and dtype when given) and its values within tolerance."""
  ref = np.asarray(ref)
  assert out.shape == ref.shape, f"shape {out.shape} != numpy's {ref.shape}"
  if dtype is not None:
    assert out.dtype == np.dtype(dtype), f"dtype {out.dtype} != {np.dtype(dtype)}"
  if out.dtype == np.bool_ or ref.dtype == np.bool_ or (out.dtype.kind in "iu" and ref.dtype.kind in "iu"):
    np.testing.assert_array_equal(out, ref)
  else:
    np.testing.assert_allclose(out.astype(np.float64), ref.astype(np.float64), **(tol or F32))


def check_all(outs, refs, dtype=None, **tol):
  """One model with several outputs: each against its reference."""
  outs = outs if isinstance(outs, tuple) else (outs,)
  assert len(outs) == len(refs)
  for i, (o, r) in enumerate(zip(outs, refs)):
    try:
      check(o, r, dtype, **tol)
    except AssertionError as e:
      raise AssertionError(f"output {i}: {e}") from None


BCAST = [
  ((3,), (3,)),
  ((7, 17), (7, 17)),
  ((3, 1, 5), (4, 5)),
  ((4, 5), (3, 1, 5)),
  ((1,), (3, 7)),
  ((3, 7), (1,)),
  ((), (3,)),
  ((3,), ()),
  ((17, 1), (1, 3)),
  ((2, 1, 3, 1), (7, 1, 5)),
]

# *** elementwise: binary ***

BINARY = {
  "add": (lambda a, b: a + b, lambda a, b: a + b),
  "sub": (lambda a, b: a - b, lambda a, b: a - b),
  "mul": (lambda a, b: a * b, lambda a, b: a * b),
  "div": (lambda a, b: a / b, lambda a, b: a / b),
  "maximum": (lambda a, b: a.maximum(b), np.maximum),
  "minimum": (lambda a, b: a.minimum(b), np.minimum),
}


@pytest.mark.parametrize("sa,sb", BCAST)
@pytest.mark.parametrize("op", list(BINARY))
def test_binary_float(op, sa, sb):
  a, b = randf(sa, 1), randf(sb, 2)
  if op.startswith("div"):
    b = np.where(np.abs(b) < 0.1, 0.5, b).astype(np.float32)
  tf, nf = BINARY[op]
  check(run(tf, a, b), nf(a.astype(np.float64), b.astype(np.float64)), np.float32)


@pytest.mark.parametrize("sa,sb", [((7,), (7,)), ((3, 1, 5), (4, 5)), ((4, 5), ())])
def test_binary_methods(sa, sb):
  a, b = randf(sa, 1), randf(sb, 2, 0.5, 2.0)
  outs = run(lambda x, y: (x.add(y), x.sub(y), x.mul(y), x.div(y)), a, b)
  a, b = a.astype(np.float64), b.astype(np.float64)
  for out, ref in zip(outs, (a + b, a - b, a * b, a / b)):
    check(out, ref, np.float32)


@pytest.mark.parametrize("sa,sb", [((3,), (3,)), ((3, 1, 5), (4, 5)), ((), (7,))])
@pytest.mark.parametrize("op", ["add", "sub", "mul", "maximum", "minimum"])
def test_binary_int(op, sa, sb):
  a, b = randi(sa, 1), randi(sb, 2)
  tf, nf = BINARY[op]
  check(run(tf, a, b), nf(a, b), np.int32)


@pytest.mark.parametrize("dt", [np.int32, np.int64, np.uint8, np.int8])
@pytest.mark.parametrize("sa,sb", [((7,), (7,)), ((3, 1, 5), (4, 5))])
def test_div_int_gives_float(dt, sa, sb):
  lo = 0 if dt == np.uint8 else -9
  a, b = randi(sa, 1, lo, 10, dt), randi(sb, 2, 1, 10, dt)
  check(run(lambda x, y: x / y, a, b), a.astype(np.float64) / b.astype(np.float64), np.float32)


@pytest.mark.parametrize("shape", [(7,), (3, 5)])
def test_div_int_scalar(shape):
  a = randi(shape, 1, -9, 10)
  check(run(lambda x: x / 4, a), a / 4.0, np.float32)
  check(run(lambda x: 12 / x, randi(shape, 2, 1, 10)), 12.0 / randi(shape, 2, 1, 10), np.float32)


SCALAR_SIDES = [
  ("x+s", lambda x: x + 2.5, lambda x: x + 2.5),
  ("s+x", lambda x: 2.5 + x, lambda x: 2.5 + x),
  ("x-s", lambda x: x - 1.5, lambda x: x - 1.5),
  ("s-x", lambda x: 1.5 - x, lambda x: 1.5 - x),
  ("x*s", lambda x: x * -3.0, lambda x: x * -3.0),
  ("s*x", lambda x: 0.25 * x, lambda x: 0.25 * x),
  ("x/s", lambda x: x / 4.0, lambda x: x / 4.0),
  ("s/x", lambda x: 3.0 / x, lambda x: 3.0 / x),
  ("x**s", lambda x: x.abs() ** 1.5, lambda x: np.abs(x) ** 1.5),
  ("s**x", lambda x: 2.0**x, lambda x: 2.0**x),
  ("x+i", lambda x: x + 3, lambda x: x + 3),
  ("i-x", lambda x: 3 - x, lambda x: 3 - x),
  ("max_s", lambda x: x.maximum(0.5), lambda x: np.maximum(x, 0.5)),
  ("min_s", lambda x: x.minimum(-0.5), lambda x: np.minimum(x, -0.5)),
  ("npscalar_left", lambda x: np.float32(2.0) * x, lambda x: 2.0 * x),
]


@pytest.mark.parametrize("shape", [(1,), (3, 1, 5)])
@pytest.mark.parametrize("name,tf,nf", SCALAR_SIDES, ids=[s[0] for s in SCALAR_SIDES])
def test_binary_scalar(name, tf, nf, shape):
  a = randf(shape, 3)
  if name == "s/x":
    a = np.where(np.abs(a) < 0.1, 0.5, a).astype(np.float32)
  check(run(tf, a), nf(a.astype(np.float64)), np.float32, **TRANS)


@pytest.mark.parametrize("sa,sb", [((3,), (3,)), ((7, 17), (7, 17)), ((3, 1, 5), (4, 5)), ((), (3,)), ((3,), ())])
def test_pow(sa, sb):
  a, b = randf(sa, 1, 0.1, 3.0), randf(sb, 2, -2.0, 2.0)
  ref = a.astype(np.float64) ** b.astype(np.float64)
  check_all(run(lambda x, y: (x**y, x.pow(y)), a, b), [ref, ref], np.float32, **TRANS)


@pytest.mark.parametrize("e", [0, 1, 2, 3, 0.5, -1, -2, 2.5])
def test_pow_scalar_exponent(e):
  a = randf((3, 7), 4, 0.1, 3.0)
  check(run(lambda x: x**e, a), a.astype(np.float64) ** e, np.float32, **TRANS)


def test_pow_negative_base_integer_exponent():
  a = randf((17,), 5, -3.0, 3.0)
  for e in (2.0, 3.0):
    check(run(lambda x: x**e, a), a.astype(np.float64) ** e, np.float32, **TRANS)


@pytest.mark.parametrize("shape", [(7,), (3, 5)])
def test_pow_int_input_gives_float(shape):
  a = randi(shape, 1, 0, 5)
  check(run(lambda x: x**2, a), a.astype(np.float64) ** 2, np.float32)


# *** elementwise: unary ***


def _np_gelu_erf(x):
  x = x.astype(np.float64)
  return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def _np_gelu_tanh(x):
  x = x.astype(np.float64)
  return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


UNARY = {
  "neg": (lambda x: -x, lambda x: -x, (-3, 3), F32),
  "neg_method": (lambda x: x.neg(), lambda x: -x, (-3, 3), F32),
  "abs": (lambda x: x.abs(), np.abs, (-3, 3), F32),
  "exp": (lambda x: x.exp(), np.exp, (-10, 10), TRANS),
  "log": (lambda x: x.log(), np.log, (1e-3, 100), TRANS),
  "sqrt": (lambda x: x.sqrt(), np.sqrt, (0, 100), TRANS),
  "reciprocal": (lambda x: x.reciprocal(), lambda x: 1.0 / x, (0.1, 10), TRANS),
  "sin": (lambda x: x.sin(), np.sin, (-10, 10), TRANS),
  "cos": (lambda x: x.cos(), np.cos, (-10, 10), TRANS),
  "tanh": (lambda x: x.tanh(), np.tanh, (-6, 6), TRANS),
  "sigmoid": (lambda x: x.sigmoid(), lambda x: 1.0 / (1.0 + np.exp(-x)), (-10, 10), TRANS),
  "relu": (lambda x: x.relu(), lambda x: np.maximum(x, 0), (-3, 3), F32),
  "gelu_none": (lambda x: x.gelu(), _np_gelu_erf, (-5, 5), TRANS),
  "gelu_none_explicit": (lambda x: x.gelu(approximate="none"), _np_gelu_erf, (-5, 5), TRANS),
  "gelu_tanh": (lambda x: x.gelu(approximate="tanh"), _np_gelu_tanh, (-5, 5), TRANS),
  "erf": (lambda x: x.erf(), np.vectorize(math.erf), (-3, 3), TRANS),
}


@pytest.mark.parametrize("shape", [(1,), (17,), (2, 3, 1, 5)])
@pytest.mark.parametrize("op", list(UNARY))
def test_unary(op, shape):
  tf, nf, (lo, hi), tol = UNARY[op]
  a = randf(shape, 7, lo, hi)
  check(run(tf, a), nf(a.astype(np.float64)), np.float32, **tol)


def test_unary_scalar_input():
  a = np.array(0.75, dtype=np.float32)
  check(run(lambda x: x.exp() + x.sin(), a), np.exp(0.75) + np.sin(0.75), np.float32, **TRANS)


@pytest.mark.parametrize("op", ["neg", "abs", "relu"])
@pytest.mark.parametrize("dt", [np.int32, np.int64, np.int8])
def test_unary_int(op, dt):
  tf, nf, _, _ = UNARY[op]
  a = randi((3, 7), 8, -9, 10, dt)
  check(run(tf, a), nf(a), dt)


@pytest.mark.parametrize("op", ["exp", "sqrt", "sin", "tanh", "sigmoid", "reciprocal"])
def test_unary_int_input_gives_float(op):
  tf, nf, _, tol = UNARY[op]
  a = randi((3, 5), 9, 1, 6)
  check(run(tf, a), nf(a.astype(np.float64)), np.float32, **tol)


@pytest.mark.parametrize("op", ["exp", "tanh", "sqrt", "abs", "neg"])
def test_unary_float16(op):
  tf, nf, (lo, hi), _ = UNARY[op]
  a = randf((3, 7), 10, max(lo, -4), min(hi, 4), np.float16)
  check(run(tf, a), nf(a.astype(np.float64)), np.float16, **F16)


# *** where, maximum/minimum with NaN, comparisons ***


@pytest.mark.parametrize(
  "sc,sa,sb",
  [((7,), (7,), (7,)), ((3, 1, 5), (4, 5), (1,)), ((4, 5), (3, 1, 5), ()), ((1,), (3, 7), (3, 7)), ((17,), (), ())],
)
def test_where(sc, sa, sb):
  c, a, b = randf(sc, 1) > 0, randf(sa, 2), randf(sb, 3)
  check(run(lambda c, x, y: c.where(x, y), c, a, b), np.where(c, a, b), np.float32)


@pytest.mark.parametrize("shape", [(7,), (3, 1, 5)])
def test_where_scalars(shape):
  x = randf(shape, 4)
  outs = run(
    lambda x: ((x > 0).where(1.0, 0.0), (x > 0).where(x, 0.0), (x > 0).where(-1.0, x), (x > 0).where(3, -2)), x
  )
  check_all(outs[:3], [np.where(x > 0, 1.0, 0.0), np.where(x > 0, x, 0.0), np.where(x > 0, -1.0, x)], np.float32)
  check(outs[3], np.where(x > 0, 3, -2), np.int32)


def test_where_float_condition():
  c, a, b = np.array([0.0, 1.0, -2.0, 0.0, 0.5], np.float32), randf((5,), 1), randf((5,), 2)
  check(run(lambda c, x, y: c.where(x, y), c, a, b), np.where(c != 0, a, b), np.float32)


def _with_nans(a, seed):
  a = a.copy()
  a.reshape(-1)[rng(seed).random(a.size) < 0.3] = np.nan
  return a


@pytest.mark.parametrize("sa,sb", [((17,), (17,)), ((3, 1, 5), (4, 5)), ((7,), ())])
@pytest.mark.parametrize("op", ["maximum", "minimum"])
def test_maximum_minimum_nan(op, sa, sb):
  a, b = _with_nans(randf(sa, 1), 11), _with_nans(randf(sb, 2), 12)
  if b.ndim == 0:
    b = np.array(np.nan, np.float32)
  tf, nf = BINARY[op]
  out = run(tf, a, b)
  ref = nf(a, b)
  assert out.dtype == np.float32
  np.testing.assert_array_equal(out, ref)  # NaN-aware: NaN exactly where numpy has one, the same values elsewhere


def test_relu_nan():
  a = np.array([np.nan, -1.0, 2.0, np.nan], np.float32)
  out = run(lambda x: x.relu(), a)
  np.testing.assert_array_equal(out, np.maximum(a, 0))  # NaN-aware: NaN where numpy has NaN, equal elsewhere


CMP = {
  "lt": (lambda a, b: a < b, np.less),
  "le": (lambda a, b: a <= b, np.less_equal),
  "gt": (lambda a, b: a > b, np.greater),
  "ge": (lambda a, b: a >= b, np.greater_equal),
  "eq": (lambda a, b: a == b, np.equal),
  "ne": (lambda a, b: a != b, np.not_equal),
}


@pytest.mark.parametrize(
  "sa,sb,dt",
  [((17,), (17,), np.float32), ((3, 1, 5), (4, 5), np.float32), ((), (7,), np.float32), ((3, 1, 5), (4, 5), np.int32)],
)
@pytest.mark.parametrize("op", list(CMP))
def test_compare(op, sa, sb, dt):
  a, b = randi(sa, 1, -2, 3).astype(dt), randi(sb, 2, -2, 3).astype(dt)  # small ints: many ties
  tf, nf = CMP[op]
  check(run(tf, a, b), nf(a, b), np.bool_)


@pytest.mark.parametrize("op", ["lt", "le", "gt", "ge", "eq", "ne"])
def test_compare_scalar_both_sides(op):
  a = randi((3, 7), 3, -2, 3).astype(np.float32)
  tf, nf = CMP[op]
  check_all(run(lambda x: (tf(x, 1), tf(0.0, x)), a), [nf(a, 1), nf(0.0, a)], np.bool_)


def test_compare_methods():
  a, b = randi((3, 1, 5), 1, -2, 3).astype(np.float32), randi((4, 5), 2, -2, 3).astype(np.float32)
  outs = run(lambda x, y: (x.eq(y), x.ne(y), x.eq(1.0), x.ne(0)), a, b)
  for out, ref in zip(outs, (a == b, a != b, a == 1.0, a != 0)):
    check(out, ref, np.bool_)


def test_compare_nan():
  a = np.array([np.nan, 1.0, np.nan, 2.0], np.float32)
  b = np.array([np.nan, np.nan, 1.0, 2.0], np.float32)
  check_all(
    run(lambda x, y: tuple(tf(x, y) for tf, _ in CMP.values()), a, b), [nf(a, b) for _, nf in CMP.values()], np.bool_
  )


# *** casts and promotion ***

CAST_DTYPES = [np.float32, np.float16, np.int32, np.int64, np.uint8, np.bool_]


def _cast_source(dt):
  # values every destination represents (no C undefined behaviour): zeros, small positive ints and fractions
  base = np.array([0, 1, 2, 0, 7, 100, 3, 0, 255, 42, 1, 0, 9, 17, 64, 5, 0], np.float64)
  if np.dtype(dt).kind == "f":
    base = base + np.array([0, 0.5, 0.25, 0, 0.75, 0.5, 0.9, 0, 0, 0.1, 0, 0, 0.5, 0.3, 0.6, 0.99, 0])
  if dt == np.bool_:
    return base != 0
  return base.astype(dt)


@pytest.mark.parametrize("dst", CAST_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("src", CAST_DTYPES, ids=lambda d: np.dtype(d).name)
def test_cast(src, dst):
  a = _cast_source(src).reshape(17)
  out = run(lambda x: x.cast(dst), a)
  ref = a.astype(dst)
  assert out.dtype == np.dtype(dst)
  if np.dtype(dst).kind == "f":
    check(out, ref, dst, rtol=0, atol=0)
  else:
    np.testing.assert_array_equal(out, ref)


@pytest.mark.parametrize("shape", [(3, 1, 5), ()])
def test_cast_then_math(shape):
  a = randf(shape, 3, -5, 5)
  check(
    run(lambda x: (x.cast(np.int32) * 3).cast(np.float16), a),
    (a.astype(np.int32) * 3).astype(np.float16),
    np.float16,
    **F16,
  )


PROMO = [np.int8, np.int32, np.int64, np.uint8, np.float16, np.float32]


@pytest.mark.parametrize("db", PROMO, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("da", PROMO, ids=lambda d: np.dtype(d).name)
def test_promotion_pairs(da, db):
  a, b = np.arange(1, 8).astype(da), (np.arange(7) % 3 + 1).astype(db)
  want = np.result_type(da, db)
  outs = run(lambda x, y: (x + y, x * y, x - y), a, b)
  for out, ref in zip(outs, (a + b, a * b, a - b)):
    assert out.dtype == want, f"{np.dtype(da).name} op {np.dtype(db).name}: {out.dtype}, numpy says {want}"
    check(out, ref, want, **(F16 if want == np.float16 else F32))


@pytest.mark.parametrize("da", PROMO, ids=lambda d: np.dtype(d).name)
def test_promotion_where_and_max(da):
  a, b = np.arange(1, 8).astype(da), np.arange(7).astype(np.float32)
  want = np.result_type(da, np.float32)
  out = run(lambda x, y: x.maximum(y), a, b)
  check(out, np.maximum(a, b), want)


# python scalars are weak: an int scalar keeps the tensor's dtype; a float scalar keeps a float tensor's dtype and makes
# an integer/bool tensor float32 (numpy would give float64 for the latter: this is our documented rule)
SCALAR_PROMO = [
  (np.int32, lambda x: x + 3, lambda a: (a + 3).astype(np.int32), np.int32),
  (np.int8, lambda x: x * 2, lambda a: (a * 2).astype(np.int8), np.int8),
  (np.uint8, lambda x: x + 3, lambda a: (a + 3).astype(np.uint8), np.uint8),
  (np.int64, lambda x: 5 - x, lambda a: (5 - a).astype(np.int64), np.int64),
  (np.float16, lambda x: x + 1, lambda a: (a + np.float16(1)).astype(np.float16), np.float16),
  (np.float16, lambda x: x * 1.5, lambda a: (a * np.float16(1.5)).astype(np.float16), np.float16),
  (np.float32, lambda x: x + 2, lambda a: a + np.float32(2), np.float32),
  (np.int32, lambda x: x + 1.5, lambda a: a.astype(np.float32) + np.float32(1.5), np.float32),
  (np.int64, lambda x: x * 0.5, lambda a: a.astype(np.float32) * np.float32(0.5), np.float32),
  (np.uint8, lambda x: 0.5 - x, lambda a: np.float32(0.5) - a.astype(np.float32), np.float32),
  (np.int8, lambda x: x / 2, lambda a: a.astype(np.float32) / np.float32(2), np.float32),
  (np.bool_, lambda x: x + 1, lambda a: a.astype(np.int32) + 1, np.int32),
  (np.bool_, lambda x: x * 2.5, lambda a: a.astype(np.float32) * np.float32(2.5), np.float32),
  (np.int32, lambda x: x + np.int64(2), lambda a: a + np.int32(2), np.int32),
  (np.int32, lambda x: x * np.float64(0.5), lambda a: a.astype(np.float32) * np.float32(0.5), np.float32),
]


@pytest.mark.parametrize("i", range(len(SCALAR_PROMO)))
def test_scalar_promotion(i):
  dt, tf, nf, want = SCALAR_PROMO[i]
  a = (np.arange(7) % 4).astype(dt) if dt != np.bool_ else np.arange(7) % 2 == 0
  out = run(tf, a)
  assert out.dtype == np.dtype(want)
  check(out, nf(a), want, **(F16 if want == np.float16 else F32))


# *** reductions ***

RSHAPES = [(17,), (3, 7), (3, 4, 5), (1, 3, 1)]
AXES = {1: [None, 0, -1], 2: [None, 0, 1, -1, -2, (0, 1), (-1,)], 3: [None, 0, 1, -1, (0, 2), (-1, -3), (0, 1, 2)]}
RCASES = [(s, ax) for s in RSHAPES for ax in AXES[len(s)]]

REDUCE = {
  "sum": (lambda x, ax, k: x.sum(ax, keepdim=k), np.sum, F32),
  "max": (lambda x, ax, k: x.max(ax, keepdim=k), np.max, F32),
  "min": (lambda x, ax, k: x.min(ax, keepdim=k), np.min, F32),
  "mean": (lambda x, ax, k: x.mean(ax, keepdim=k), np.mean, F32),
  "prod": (lambda x, ax, k: x.prod(ax, keepdim=k), np.prod, dict(rtol=1e-5, atol=1e-6)),
}


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("shape,axis", RCASES, ids=[f"{s}-{a}" for s, a in RCASES])
def test_reduce(shape, axis, keepdim):
  """sum, max, min, mean and prod over the same axes: one model with five outputs (prod gets values near 1)."""
  a, p = randf(shape, 5), randf(shape, 6, 0.5, 1.5)
  outs = run(lambda x, y: tuple(tf(y if op == "prod" else x, axis, keepdim) for op, (tf, _, _) in REDUCE.items()), a, p)
  for (op, (_, nf, tol)), out in zip(REDUCE.items(), outs):
    ref = nf((p if op == "prod" else a).astype(np.float64), axis=axis, keepdims=keepdim)
    try:
      check(out, ref, np.float32, **tol)
    except AssertionError as e:
      raise AssertionError(f"{op}(axis={axis}, keepdim={keepdim}): {e}") from None


@pytest.mark.parametrize("dt", [np.int32, np.int64, np.uint8, np.int8])
@pytest.mark.parametrize("axis,keepdim", [(None, False), (0, True), (-1, False), ((0, 2), True)])
def test_reduce_int(dt, axis, keepdim):
  a = randi((3, 4, 5), 6, 0 if dt == np.uint8 else -3, 4, dt)
  out = run(lambda x: (x.sum(axis, keepdim=keepdim), x.max(axis, keepdim=keepdim), x.min(axis, keepdim=keepdim)), a)
  refs = (
    np.sum(a, axis=axis, keepdims=keepdim),
    np.max(a, axis=axis, keepdims=keepdim),
    np.min(a, axis=axis, keepdims=keepdim),
  )
  for o, r in zip(out, refs):
    assert o.dtype.kind in "iu"
    check(o, r)


def test_sum_bool_counts():
  a = randf((3, 17), 1) > 0
  check(run(lambda x: x.sum(-1), a), np.sum(a, axis=-1))


def test_mean_int_gives_float():
  a = randi((3, 7), 2)
  check(run(lambda x: x.mean(1), a), np.mean(a, axis=1), np.float32)


def test_reduce_float16():
  a = randf((3, 17), 3, -1, 1, np.float16)
  out = run(lambda x: (x.sum(-1), x.max(0)), a)
  check(out[0], a.astype(np.float64).sum(-1), np.float16, **F16)
  check(out[1], a.max(0), np.float16, **F16)


def test_max_min_negative_values():
  a = -randf((7, 17), 4, 1, 5)  # all negative: a 0 identity would be wrong
  check(run(lambda x: x.max(-1), a), a.max(-1), np.float32)
  b = randf((7, 17), 4, 1, 5)
  check(run(lambda x: x.min(0), b), b.min(0), np.float32)


def test_max_nan_propagates():
  a = randf((3, 5), 1)
  a[1, 2] = np.nan
  out = run(lambda x: (x.max(1), x.min(0)), a)
  np.testing.assert_array_equal(out[0], np.max(a, 1))
  np.testing.assert_array_equal(out[1], np.min(a, 0))


# rows of every kind a reduction's identity or NaN handling could get wrong: all -inf, all +inf, a NaN among finite
# values, both infinities, -inf with finite values, NaN first then +inf, all NaN, finite
_SPECIAL = np.array(
  [
    [-np.inf] * 5,
    [np.inf] * 5,
    [1.0, np.nan, 3.0, -2.0, 0.5],
    [np.inf, -1.0, -np.inf, 2.0, 0.0],
    [-np.inf, -3.0, -np.inf, -7.0, -np.inf],
    [np.nan, np.inf, np.inf, 1.0, np.inf],
    [np.nan] * 5,
    [0.25, -1.5, 4.0, 4.0, -0.75],
  ],
  np.float32,
)


def test_reductions_over_infinities_and_nan():
  a = _SPECIAL
  outs = run(lambda x: (x.max(-1), x.min(-1), x.max(0), x.min(0), x.argmax(-1), x.argmin(-1), x.argmax(0)), a)
  refs = (a.max(-1), a.min(-1), a.max(0), a.min(0))
  # whole outputs, NaN-aware (NaN exactly where numpy has one, the same values elsewhere)
  for i, (o, r) in enumerate(zip(outs, refs)):
    np.testing.assert_array_equal(o, r, err_msg=f"output {i}")
  for o, r in zip(outs[4:], (a.argmax(-1), a.argmin(-1), a.argmax(0))):
    np.testing.assert_array_equal(o.astype(np.int64), r)


def test_softmax_over_infinities_and_nan():
  a = _SPECIAL
  with np.errstate(invalid="ignore"):
    want = _np_softmax(a, -1)
  np.testing.assert_allclose(run(lambda x: x.softmax(-1), a), want, rtol=1e-6, atol=1e-7, equal_nan=True)


ARG_CASES = [
  ((17,), None),
  ((17,), 0),
  ((3, 7), None),
  ((3, 7), 0),
  ((3, 7), -1),
  ((3, 4, 5), 1),
  ((3, 4, 5), -3),
  ((1, 3, 1), 0),
  ((1, 3, 1), 1),
]


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("shape,axis", ARG_CASES, ids=[f"{s}-{a}" for s, a in ARG_CASES])
def test_argmax_argmin(shape, axis, keepdim):
  a = randi(shape, 9, -2, 3).astype(np.float32)  # few distinct values: many ties, the first index wins
  outs = run(lambda x: (x.argmax(axis, keepdim=keepdim), x.argmin(axis, keepdim=keepdim)), a)
  for op, out in zip(("argmax", "argmin"), outs):
    assert out.dtype.kind in "iu", f"{op}: {out.dtype}"
    try:
      check(out.astype(np.int64), getattr(np, op)(a, axis=axis, keepdims=keepdim).astype(np.int64))
    except AssertionError as e:
      raise AssertionError(f"{op}(axis={axis}, keepdim={keepdim}): {e}") from None


def test_argmax_ties_first():
  a = np.array([[1, 3, 3, 0], [2, 2, 2, 2], [0, 0, 5, 5]], np.float32)
  out = run(lambda x: (x.argmax(1), x.argmin(1), x.argmax(0), x.argmax()), a)
  check(out[0].astype(np.int64), np.array([1, 0, 2]))
  check(out[1].astype(np.int64), np.array([3, 0, 0]))
  check(out[2].astype(np.int64), np.argmax(a, 0))
  check(out[3].astype(np.int64), np.array(10))


@pytest.mark.parametrize("dt", [np.int32, np.uint8])
def test_argmax_int(dt):
  a = randi((4, 9), 3, 0, 4, dt)
  out = run(lambda x: (x.argmax(-1), x.argmin(0)), a)
  check(out[0].astype(np.int64), np.argmax(a, -1))
  check(out[1].astype(np.int64), np.argmin(a, 0))


# *** movement ***


def _arange(shape, dtype=np.float32):
  return np.arange(int(np.prod(shape))).reshape(shape).astype(dtype)


@pytest.mark.parametrize(
  "src,dst",
  [
    ((3, 4, 5), (-1, 5)),
    ((3, 4, 5), (12, -1)),
    ((3, 4, 5), (5, -1, 2)),
    ((3, 4, 5), (60,)),
    ((3, 4, 5), (-1,)),
    ((17,), (1, 17, 1)),
    ((7, 1), (-1,)),
    ((2, 3, 4, 5), (6, 20)),
    ((1,), ()),
    ((), (1, 1)),
  ],
)
def test_reshape(src, dst):
  a = randf(src, 1)
  check_all(
    run(lambda x: (x.reshape(dst), (x + 1).reshape(*dst) * 2), a),
    [a.reshape(dst), (a.reshape(dst) + 1) * 2],
    np.float32,
  )


@pytest.mark.parametrize(
  "shape,order",
  [
    ((3, 7), (1, 0)),
    ((3, 4, 5), (2, 0, 1)),
    ((3, 4, 5), (1, 2, 0)),
    ((3, 4, 5), (-1, 0, -2)),
    ((2, 3, 4, 5), (3, 1, 0, 2)),
    ((1, 3, 1), (2, 1, 0)),
  ],
)
def test_permute(shape, order):
  a = randf(shape, 1)
  check_all(
    run(lambda x: (x.permute(order), x.permute(*order).exp()), a),
    [np.transpose(a, order), np.exp(np.transpose(a, order).astype(np.float64))],
    np.float32,
    **TRANS,
  )


@pytest.mark.parametrize(
  "shape,ab",
  [((3, 7), None), ((3, 4, 5), None), ((3, 4, 5), (0, 2)), ((2, 3, 4, 5), (1, -1)), ((2, 3, 4, 5), (-4, -3))],
)
def test_transpose(shape, ab):
  a = randf(shape, 1)
  if ab is None:
    check(run(lambda x: x.transpose(), a), np.swapaxes(a, -2, -1), np.float32)
  else:
    check(run(lambda x: x.transpose(*ab), a), np.swapaxes(a, *ab), np.float32)


def test_T():
  a = randf((3, 4, 5), 1)
  check(run(lambda x: x.T, a), a.T, np.float32)


@pytest.mark.parametrize(
  "src,dst",
  [
    ((3, 1, 5), (2, 3, 4, 5)),
    ((1,), (7,)),
    ((17, 1), (17, 3)),
    ((3, 1), (-1, 7)),
    ((1, 1), (3, 1, 5)),
    ((), (3, 7)),
    ((1, 5), (2, -1, -1)),
  ],
)
def test_expand(src, dst):
  a = randf(src, 1)
  want = tuple(s if s != -1 else src[i - (len(dst) - len(src))] for i, s in enumerate(dst))
  check_all(
    run(lambda x: (x.expand(dst), x.expand(*dst) * 2), a),
    [np.broadcast_to(a, want), np.broadcast_to(a, want) * 2],
    np.float32,
  )


def np_pad(a, pads, value):
  """numpy reference for pads that may be negative: crop the negative sides, then np.pad the rest."""
  crop = tuple(slice(-b if b < 0 else 0, a.shape[i] + e if e < 0 else a.shape[i]) for i, (b, e) in enumerate(pads))
  return np.pad(a[crop], [(max(b, 0), max(e, 0)) for b, e in pads], constant_values=value)


@pytest.mark.parametrize(
  "shape,pads,value",
  [
    ((7,), [(1, 1)], 0.0),
    ((7,), [(0, 3)], -1.5),
    ((3, 5), [(1, 2), (3, 0)], 0.0),
    ((3, 5), [(2, 2), (0, 0)], 7.0),
    ((3, 4, 5), [(0, 0), (1, 0), (2, 3)], 0.25),
    ((3, 5), [(-1, 2), (1, -2)], 0.0),
    ((7,), [(-2, -3)], 0.0),
    ((3, 4, 5), [(-1, 1), (0, -1), (2, -2)], 3.0),
    ((1,), [(3, 4)], -2.0),
    ((3, 5), [1, 2], 0.5),
  ],
)
def test_pad(shape, pads, value):
  a = randf(shape, 1)
  full = [(p, p) if isinstance(p, int) else p for p in pads]
  # the second output pads a computed value, so the padding is fused into an elementwise kernel
  check_all(
    run(lambda x: (x.pad(pads, value), x.exp().pad(pads, value) + 1), a),
    [np_pad(a, full, value), np_pad(np.exp(a.astype(np.float64)), full, value) + 1],
    np.float32,
    **TRANS,
  )


def test_pad_int():
  a = randi((3, 5), 1)
  check(run(lambda x: x.pad([(1, 0), (2, 1)], 9), a), np.pad(a, [(1, 0), (2, 1)], constant_values=9), np.int32)


@pytest.mark.parametrize(
  "shape,bounds",
  [
    ((7,), [(2, 5)]),
    ((3, 5), [(0, 3), (1, 4)]),
    ((3, 4, 5), [(1, 2), None, (4, 5)]),
    ((17,), [(0, 17)]),
    ((3, 5), [(1, 1), (0, 5)]),
  ],
)
def test_shrink(shape, bounds):
  a = randf(shape, 1)
  ref = a[tuple(slice(None) if b is None else slice(*b) for b in bounds)]
  check(run(lambda x: x.shrink(bounds), a), ref, np.float32)


SLICES = [
  (slice(1, 5),),
  (slice(None, None, 2),),
  (slice(None, None, -1),),
  (slice(5, 1, -1),),
  (slice(None, None, -3),),
  (slice(-3, None),),
  (slice(1, None, 3),),
  (slice(-2, -6, -2),),
  (Ellipsis, slice(None, None, -2)),
  (None, slice(2, 4)),
  (slice(None), None, 1),
  (1, Ellipsis),
  (-1, slice(None, None, -1)),
  (Ellipsis, 0),
  (slice(None, None, 2), slice(None, None, -2)),
  (Ellipsis, None),
  (0, 0),
  (slice(10, 20),),
  (slice(3, 3),),
  (slice(None), slice(None), slice(None, None, 4)),
  (None, Ellipsis, None),
  (slice(None, None, 100),),
]


@pytest.mark.parametrize("idx", SLICES, ids=[str(i) for i in range(len(SLICES))])
@pytest.mark.parametrize("shape", [(7, 5, 3)])
def test_getitem(shape, idx):
  a = randf(shape, 1)
  ref = a[idx]
  check(run(lambda x: x[idx] * 2, a), ref * 2, np.float32)


@pytest.mark.parametrize("idx", [3, -1, slice(None, None, -2), (slice(1, None, 2),)])
def test_getitem_1d(idx):
  a = randf((7,), 1)
  check(run(lambda x: x[idx] + 0, a), a[idx], np.float32)


@pytest.mark.parametrize(
  "shape,axis", [((7,), 0), ((3, 5), 1), ((3, 5), -2), ((3, 4, 5), (0, 2)), ((3, 4, 5), (-1, -2, -3)), ((1, 3, 1), 1)]
)
def test_flip(shape, axis):
  a = randf(shape, 1)
  check_all(
    run(lambda x: (x.flip(axis), x.flip(axis).sum(0)), a),
    [np.flip(a, axis), np.flip(a, axis).astype(np.float64).sum(0)],
    np.float32,
  )


@pytest.mark.parametrize("axis", [0, 1, -1, -3])
def test_cat(axis):
  base = [3, 4, 5]
  shapes = []
  for n in (1, 3, 7):
    s = list(base)
    s[axis] = n
    shapes.append(tuple(s))
  a, b, c = randf(shapes[0], 1), randf(shapes[1], 2), randf(shapes[2], 3)
  check(run(lambda x, y, z: Tensor.cat([x, y, z], axis), a, b, c), np.concatenate([a, b, c], axis), np.float32)
  check(
    run(lambda x, y, z: Tensor.cat([x * 2, y.exp(), -z], axis=axis), a, b, c),
    np.concatenate([a * 2.0, np.exp(b.astype(np.float64)), -c], axis),
    np.float32,
    **TRANS,
  )


def test_cat_mixed_dtypes_and_bool():
  a, b = randi((3, 2), 1), randf((3, 5), 2)
  check(run(lambda x, y: Tensor.cat([x, y], 1), a, b), np.concatenate([a, b], 1), np.result_type(a, b))
  c, d = randf((2, 3), 3) > 0, randf((4, 3), 4) > 0
  check(run(lambda x, y: Tensor.cat([x, y], 0), c, d), np.concatenate([c, d], 0), np.bool_)


def test_cat_negative_values_not_summed():
  a, b, c = np.full((2, 2), -1.0, np.float32), np.full((1, 2), np.inf, np.float32), np.full((3, 2), 5.0, np.float32)
  out = run(lambda x, y, z: Tensor.cat([x, y, z], 0), a, b, c)
  np.testing.assert_array_equal(out, np.concatenate([a, b, c], 0))


def test_cat_nan():
  a, b = np.array([np.nan, 1.0], np.float32), np.array([2.0, np.nan, 3.0], np.float32)
  out = run(lambda x, y: Tensor.cat([x, y]), a, b)
  np.testing.assert_array_equal(out, np.concatenate([a, b]))


@pytest.mark.parametrize("axis", [0, 1, 2, -1, -3])
@pytest.mark.parametrize("shape", [(3, 5), (1, 7)])
def test_stack(shape, axis):
  a, b, c = randf(shape, 1), randf(shape, 2), randf(shape, 3)
  check_all(
    run(lambda x, y, z: (Tensor.stack([x, y, z], axis=axis), Tensor.stack(x, y, axis=axis)), a, b, c),
    [np.stack([a, b, c], axis), np.stack([a, b], axis)],
    np.float32,
  )


@pytest.mark.parametrize(
  "shape,axis",
  [((1, 3, 1, 5), None), ((1, 3, 1, 5), 0), ((1, 3, 1, 5), -2), ((1, 3, 1, 5), (0, 2)), ((1,), None), ((7, 1), -1)],
)
def test_squeeze(shape, axis):
  a = randf(shape, 1)
  check(run(lambda x: x.squeeze(axis), a), np.squeeze(a, axis), np.float32)


@pytest.mark.parametrize(
  "shape,axis", [((3, 5), 0), ((3, 5), 1), ((3, 5), 2), ((3, 5), -1), ((3, 5), -3), ((), 0), ((7,), -1)]
)
def test_unsqueeze(shape, axis):
  a = randf(shape, 1)
  check(run(lambda x: x.unsqueeze(axis), a), np.expand_dims(a, axis), np.float32)


@pytest.mark.parametrize(
  "shape,se",
  [
    ((2, 3, 4, 5), None),
    ((2, 3, 4, 5), (1, -1)),
    ((2, 3, 4, 5), (0, 1)),
    ((2, 3, 4, 5), (1, 2)),
    ((2, 3, 4, 5), (-2, -1)),
    ((7,), None),
    ((3, 1, 5), (0, -2)),
  ],
)
def test_flatten(shape, se):
  a = randf(shape, 1)
  if se is None:
    out, ref = run(lambda x: x.flatten(), a), a.reshape(-1)
  else:
    s, e = se[0] % len(shape), se[1] % len(shape)
    out, ref = run(lambda x: x.flatten(*se), a), a.reshape(shape[:s] + (-1,) + shape[e + 1 :])
  check(out, ref, np.float32)


@pytest.mark.parametrize(
  "shape,reps",
  [
    ((3,), (2,)),
    ((3,), (2, 3)),
    ((3, 5), (1, 2)),
    ((3, 5), (3, 1)),
    ((1, 3, 1), (2, 2, 4)),
    ((2, 3), (2, 1, 3)),
    ((7,), (1,)),
  ],
)
def test_repeat(shape, reps):
  a = randf(shape, 1)
  check_all(
    run(lambda x: (x.repeat(reps), x.repeat(*reps) + 1), a), [np.tile(a, reps), np.tile(a, reps) + 1], np.float32
  )


@pytest.mark.parametrize(
  "dshape,ishape,axis",
  [
    ((3, 5), (3, 5), 1),
    ((3, 5), (3, 7), 1),
    ((3, 5), (2, 5), 0),
    ((3, 5), (4, 2), 0),
    ((3, 4, 5), (3, 4, 2), -1),
    ((3, 4, 5), (1, 6, 5), -2),
    ((7,), (17,), 0),
  ],
)
@pytest.mark.parametrize("idt", [np.int64, np.int32])
def test_gather(dshape, ishape, axis, idt):
  a = randf(dshape, 1)
  idx = rng(2).integers(0, dshape[axis], size=ishape).astype(idt)
  # torch.gather: out[i][j][k] = a[i][idx[i][j][k]][k] (axis 1); index may be smaller than the data off the axis
  sub = a[tuple(slice(0, ishape[d]) if d != axis % a.ndim else slice(None) for d in range(a.ndim))]
  ref = np.take_along_axis(sub, idx.astype(np.int64), axis)
  # the second output has the index as a constant in the graph
  check_all(run(lambda x, i: (x.gather(axis, i), x.gather(axis, Tensor(idx))), a, idx), [ref, ref], np.float32)


@pytest.mark.parametrize(
  "dshape,ishape,axis",
  [
    ((7,), (4,), 0),
    ((3, 5), (6,), 1),
    ((3, 5), (2, 3), 0),
    ((3, 4, 5), (2, 2), -1),
    ((3, 4, 5), (), 1),
    ((3, 4, 5), (5,), -2),
  ],
)
def test_take(dshape, ishape, axis):
  a = randf(dshape, 1)
  n = dshape[axis]
  idx = rng(3).integers(-n, n, size=ishape).astype(np.int64)  # negative indices count from the end
  ref = np.take(a, idx, axis)
  check_all(
    run(lambda x, i: (x.take(i, axis), x.take(idx.tolist() if idx.ndim else int(idx), axis)), a, idx),
    [ref, ref],
    np.float32,
  )


def test_take_negative_constant_and_getitem_tensor():
  a = randf((7, 3), 1)
  check(run(lambda x: x.take([-1, 0, -7, 3], 0), a), np.take(a, [-1, 0, -7, 3], 0), np.float32)
  idx = np.array([[-1, 2], [0, -3]], np.int32)
  check(run(lambda x, i: x[i], a, idx), a[idx], np.float32)


# movement ops composed: an offset/reversed view of a reshaped (merged-axes) tensor, fused with elementwise and
# reductions
COMPOSED = [
  ("reshape-slice", lambda x: x.reshape(-1)[1:], lambda a: a.reshape(-1)[1:]),
  ("reshape-flip", lambda x: x.reshape(-1).flip(0), lambda a: a.reshape(-1)[::-1]),
  ("reshape-negstep", lambda x: x.reshape(-1)[::-1], lambda a: a.reshape(-1)[::-1]),
  ("reshape-pad-before", lambda x: x.reshape(-1).pad([(1, 0)]), lambda a: np.pad(a.reshape(-1), [(1, 0)])),
  (
    "reshape-pad-after",
    lambda x: x.reshape(-1).pad([(0, 2)], 1.0),
    lambda a: np.pad(a.reshape(-1), [(0, 2)], constant_values=1.0),
  ),
  ("reshape2-slice", lambda x: x.reshape(3, -1)[1:, 2:], lambda a: a.reshape(3, -1)[1:, 2:]),
  ("permute-reshape-flip", lambda x: x.permute(1, 0).reshape(-1).flip(0), lambda a: a.T.reshape(-1)[::-1]),
  ("flip-reshape", lambda x: x.flip(1).reshape(-1), lambda a: a[:, ::-1].reshape(-1)),
  (
    "pad-reshape-sum",
    lambda x: x.pad([(1, 0), (0, 1)]).reshape(x.shape[1] + 1, -1).sum(-1),
    lambda a: np.pad(a, [(1, 0), (0, 1)]).reshape(a.shape[1] + 1, -1).sum(-1),
  ),
  ("slice-step-reshape", lambda x: x[::2, 1::3].reshape(-1), lambda a: a[::2, 1::3].reshape(-1)),
  ("reshape-slice-sum", lambda x: (x.reshape(-1)[2:] * 2).sum(), lambda a: (a.reshape(-1)[2:] * 2).sum()),
]


@pytest.mark.parametrize("shape", [(3, 4), (6, 5)])
@pytest.mark.parametrize("name,tf,nf", COMPOSED, ids=[c[0] for c in COMPOSED])
def test_composed_movement(name, tf, nf, shape):
  a = _arange(shape) + 1
  check(run(tf, a), nf(a.astype(np.float64)), np.float32)


@pytest.mark.parametrize("shape", [(3, 2), (2, 3), (7, 5)])
def test_flip_broadcast_scalar_inputs_sum(shape):
  """a reversed read plus the same 0-d input twice, summed: (x.flip(-1) + s + s).sum()"""
  x, s = _arange(shape), np.array(10.0, np.float32)
  check(run(lambda x, s: (x.flip(-1) + s + s).sum(), x, s), (x.astype(np.float64) + 20.0).sum(), np.float32)
  check(run(lambda x, s: (x.flip(-1) + s + s).sum(0), x, s), (x[:, ::-1].astype(np.float64) + 20.0).sum(0), np.float32)


@pytest.mark.parametrize(
  "sa,sb",
  [
    ((3, 4), (4, 5)),
    ((1, 1), (1, 1)),
    ((7, 17), (17, 3)),
    ((2, 3, 4), (2, 4, 5)),
    ((2, 1, 3, 4), (5, 4, 6)),
    ((3, 4), (2, 4, 5)),
    ((4,), (4, 5)),
    ((3, 4), (4,)),
    ((17,), (17,)),
    ((2, 3, 4), (4,)),
    ((4,), (2, 4, 3)),
  ],
)
def test_matmul(sa, sb):
  a, b = randf(sa, 1), randf(sb, 2)
  ref = np.matmul(a.astype(np.float64), b.astype(np.float64))
  check_all(run(lambda x, y: (x @ y, x.matmul(y)), a, b), [ref, ref], np.float32)


def test_matmul_constant_weight_and_rmatmul():
  a, w = randf((3, 4), 1), randf((4, 5), 2)
  check(run(lambda x: x @ Tensor(w), a), a.astype(np.float64) @ w, np.float32)
  check(run(lambda x: x.dot(Tensor(w)), a), a.astype(np.float64) @ w, np.float32)
  check(run(lambda x: x.matmul(w), a), a.astype(np.float64) @ w, np.float32)


def test_matmul_int():
  a, b = randi((3, 4), 1), randi((4, 5), 2)
  check(run(lambda x, y: x @ y, a, b), a @ b, np.int32)


@pytest.mark.parametrize("xs,out", [((5, 4), 3), ((4,), 3), ((2, 7, 17), 1), ((1, 1), 1)])
@pytest.mark.parametrize("bias", [True, False])
def test_linear(xs, out, bias):
  x, w, b = randf(xs, 1), randf((out, xs[-1]), 2), randf((out,), 3)
  ref = x.astype(np.float64) @ w.T.astype(np.float64) + (b if bias else 0)
  if bias:
    check(run(lambda x, w, b: x.linear(w, b), x, w, b), ref, np.float32)
  else:
    check(run(lambda x, w: x.linear(w), x, w), ref, np.float32)


def _pair(v):
  return (v, v) if isinstance(v, int) else tuple(v)


def np_conv2d(x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
  """numpy reference: pad, sliding windows, einsum over (channel-in-group, kh, kw) per group."""
  sh, sw = _pair(stride)
  dh, dw = _pair(dilation)
  ph, pw = _pair(padding)
  x = np.pad(x.astype(np.float64), [(0, 0), (0, 0), (ph, ph), (pw, pw)])
  N, C, H, W = x.shape
  cout, cg, kh, kw = w.shape
  win = np.lib.stride_tricks.sliding_window_view(x, (dh * (kh - 1) + 1, dw * (kw - 1) + 1), axis=(2, 3))
  win = win[:, :, ::sh, ::sw, ::dh, ::dw]  # (N, C, OH, OW, kh, kw)
  OH, OW = win.shape[2:4]
  win = win.reshape(N, groups, cg, OH, OW, kh, kw)
  wg = w.astype(np.float64).reshape(groups, cout // groups, cg, kh, kw)
  out = np.einsum("ngchwij,gocij->ngohw", win, wg).reshape(N, cout, OH, OW)
  return out + b.reshape(1, -1, 1, 1) if b is not None else out


CONVS = [  # (x shape, w shape, stride, padding, dilation, groups)
  ((1, 3, 7, 7), (4, 3, 3, 3), 1, 0, 1, 1),
  ((2, 3, 7, 7), (4, 3, 3, 3), 2, 1, 1, 1),
  ((2, 3, 9, 8), (5, 3, 3, 3), 1, 0, 2, 1),
  ((1, 4, 7, 7), (6, 2, 3, 3), 1, 1, 1, 2),
  ((2, 4, 7, 5), (4, 1, 3, 3), 1, 1, 1, 4),  # depthwise
  ((1, 3, 8, 8), (6, 1, 3, 3), 2, 1, 1, 3),  # depthwise, channel multiplier 2
  ((1, 2, 7, 9), (3, 2, 2, 3), (2, 1), (1, 0), (1, 2), 1),
  ((2, 3, 5, 5), (2, 3, 1, 1), 1, 0, 1, 1),
  ((1, 1, 17, 3), (1, 1, 5, 3), 3, (2, 0), 1, 1),
  ((1, 6, 11, 11), (6, 2, 3, 3), 2, 2, 2, 3),
]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("case", range(len(CONVS)))
def test_conv2d(case, bias):
  xs, ws, stride, padding, dilation, groups = CONVS[case]
  x, w, b = randf(xs, 1), randf(ws, 2), randf((ws[0],), 3)
  ref = np_conv2d(x, w, b if bias else None, stride, padding, dilation, groups)
  kw = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
  if bias:
    out = run(lambda x, w, b: x.conv2d(w, b, **kw), x, w, b)
  else:
    out = run(lambda x, w: x.conv2d(w, **kw), x, w)
  check(out, ref, np.float32, rtol=1e-5, atol=1e-5)


def test_conv2d_constant_weights():
  x, w, b = randf((2, 3, 6, 6), 1), randf((4, 3, 3, 3), 2), randf((4,), 3)
  check(run(lambda x: x.conv2d(Tensor(w), Tensor(b), padding=1), x), np_conv2d(x, w, b, padding=1), np.float32)


def _np_windows(x, k, s, pad, value):
  kh, kw = _pair(k)
  sh, sw = _pair(s)
  ph, pw = _pair(pad)
  x = np.pad(x.astype(np.float64), [(0, 0), (0, 0), (ph, ph), (pw, pw)], constant_values=value)
  return np.lib.stride_tricks.sliding_window_view(x, (kh, kw), axis=(2, 3))[:, :, ::sh, ::sw]


POOLS = [
  ((1, 2, 6, 6), 2, 2, 0),
  ((2, 3, 7, 7), 3, 1, 1),
  ((1, 2, 7, 7), 3, 2, 1),
  ((1, 1, 8, 9), (2, 3), (1, 2), (1, 1)),
  ((2, 1, 5, 5), 2, 1, 0),
  ((1, 3, 17, 3), (3, 1), (2, 1), (1, 0)),
  ((1, 2, 7, 7), 2, None, 0),
]


@pytest.mark.parametrize("case", range(len(POOLS)))
def test_max_pool2d(case):
  xs, k, s, p = POOLS[case]
  x = randf(xs, 1) - 3.0  # mostly negative: padding must not win
  ref = _np_windows(x, k, s if s is not None else k, p, -np.inf).max(axis=(-2, -1))
  check(run(lambda x: x.max_pool2d(k, s, p), x), ref, np.float32)


@pytest.mark.parametrize("include", [True, False])
@pytest.mark.parametrize("case", range(len(POOLS)))
def test_avg_pool2d(case, include):
  xs, k, s, p = POOLS[case]
  x = randf(xs, 1)
  s_ = s if s is not None else k
  sums = _np_windows(x, k, s_, p, 0.0).sum(axis=(-2, -1))
  if include:
    ref = sums / np.prod(_pair(k))
  else:
    ref = sums / _np_windows(np.ones_like(x), k, s_, p, 0.0).sum(axis=(-2, -1))
  check(run(lambda x: x.avg_pool2d(k, s, p, count_include_pad=include), x), ref, np.float32)


# *** normalisation ***


def _np_softmax(x, axis):
  x = x.astype(np.float64)
  e = np.exp(x - x.max(axis, keepdims=True))
  return e / e.sum(axis, keepdims=True)


@pytest.mark.parametrize("axis", [0, 1, -1, -2, 2])
@pytest.mark.parametrize("shape", [(3, 4, 5), (1, 17, 3)])
def test_softmax_log_softmax(shape, axis):
  a = randf(shape, 1, -5, 5)
  check(run(lambda x: x.softmax(axis), a), _np_softmax(a, axis), np.float32, **TRANS)
  check(run(lambda x: x.log_softmax(axis), a), np.log(_np_softmax(a, axis)), np.float32, rtol=1e-5, atol=1e-5)


def test_softmax_large_values():
  a = np.array([[1000.0, 1001.0, 999.0], [-1000.0, -1000.0, -1000.0]], np.float32)
  check(run(lambda x: x.softmax(-1), a), _np_softmax(a, -1), np.float32, **TRANS)
  check(run(lambda x: x.log_softmax(-1), a), np.log(_np_softmax(a, -1)), np.float32)


def _np_layernorm(x, axes, w, b, eps=1e-5):
  x = x.astype(np.float64)
  m = x.mean(axes, keepdims=True)
  v = ((x - m) ** 2).mean(axes, keepdims=True)
  y = (x - m) / np.sqrt(v + eps)
  if w is not None:
    y = y * w
  return y + b if b is not None else y


@pytest.mark.parametrize("shape,axis", [((3, 7), -1), ((2, 3, 17), -1), ((2, 3, 5), -2), ((2, 3, 5), 1), ((4, 1), -1)])
@pytest.mark.parametrize("affine", [True, False])
def test_layernorm(shape, axis, affine):
  a = randf(shape, 1, -3, 3)
  nshape = shape[axis % len(shape) :]
  axes = tuple(range(axis % len(shape), len(shape)))
  w, b = randf(nshape, 2), randf(nshape, 3)
  if affine:
    out = run(lambda x, w, b: x.layernorm(w, b, axis=axis), a, w, b)
  else:
    out = run(lambda x: x.layernorm(axis=axis), a)
  check(out, _np_layernorm(a, axes, w if affine else None, b if affine else None), np.float32, rtol=1e-4, atol=1e-4)


def test_layernorm_eps():
  a = randf((3, 5), 1) * 1e-3
  check(run(lambda x: x.layernorm(eps=1e-2), a), _np_layernorm(a, (1,), None, None, 1e-2), np.float32)


def _np_batchnorm(x, mean, var, w, b, eps=1e-5):
  shape = (1, -1) + (1,) * (x.ndim - 2)
  x = x.astype(np.float64)
  return (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps) * w.reshape(shape) + b.reshape(shape)


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (1, 7), (3, 17, 2)])
def test_batchnorm(shape):
  c = shape[1]
  x, m, v, w, b = randf(shape, 1), randf((c,), 2), randf((c,), 3, 0.1, 2.0), randf((c,), 4), randf((c,), 5)
  ref = _np_batchnorm(x, m, v, w, b)
  check(run(lambda x, m, v, w, b: x.batchnorm(m, v, w, b), x, m, v, w, b), ref, np.float32, rtol=1e-5, atol=1e-5)
  # constant statistics (folded at compile time)
  check(
    run(lambda x: x.batchnorm(Tensor(m), Tensor(v), Tensor(w), Tensor(b)), x), ref, np.float32, rtol=1e-5, atol=1e-5
  )
  check(
    run(lambda x: x.batchnorm(Tensor(m), Tensor(v)), x), _np_batchnorm(x, m, v, np.ones(c), np.zeros(c)), np.float32
  )


# *** several outputs, reused inputs ***


def test_multiple_outputs_and_reuse():
  a, b = randf((3, 5), 1), randf((5,), 2)
  out = run(lambda x, y: (x + y, (x * y).sum(0), x.T @ x, y), a, b)
  a64, b64 = a.astype(np.float64), b.astype(np.float64)
  for o, r in zip(out, (a64 + b64, (a64 * b64).sum(0), a64.T @ a64, b64)):
    check(o, r, np.float32)


# *** error paths ***


def test_broadcast_error_names_shapes():
  with pytest.raises(ValueError, match=r"\(3, 4\)") as e:
    aot.compile_model(lambda x, y: x + y, [np.zeros((3, 4), np.float32), np.zeros((5,), np.float32)])
  assert "(3, 4)" in str(e.value) and "(5,)" in str(e.value)
  with pytest.raises(ValueError, match=r"\(2, 3\)") as e:
    aot.compile_model(lambda x, y: x.maximum(y), [np.zeros((2, 3), np.float32), np.zeros((4, 3), np.float32)])
  assert "(2, 3)" in str(e.value) and "(4, 3)" in str(e.value)


def test_reshape_wrong_size_raises():
  with pytest.raises(ValueError, match=r"cannot reshape \(3, 5\) \(15 elements\) to \(4, 4\)"):
    aot.compile_model(lambda x: x.reshape(4, 4), [np.zeros((3, 5), np.float32)])
  with pytest.raises(ValueError, match=r"cannot reshape \(3, 5\) \(15 elements\) to \(3, 4\)"):
    aot.compile_model(lambda x: x.reshape(-1, 4), [np.zeros((3, 5), np.float32)])
  with pytest.raises(ValueError, match="at most one -1"):
    aot.compile_model(lambda x: x.reshape(-1, -1), [np.zeros((3, 5), np.float32)])


def test_loaded_model_checks_inputs():
  a, b = randf((3, 5), 1), randf((5,), 2)

  def model(image, bias):
    return image + bias

  with tempfile.TemporaryDirectory() as d:
    m = aot.load(aot.compile_model(model, [a, b], out_dir=d))
    check(m(a, b), a + b, np.float32)
    with pytest.raises(ValueError, match="image") as e:
      m(randf((5, 3), 1), b)
    assert "(3, 5)" in str(e.value) and "(5, 3)" in str(e.value)
    with pytest.raises(ValueError, match="bias"):
      m(a, randf((1, 5), 1))
    with pytest.raises(TypeError, match="image"):
      m(a.astype(np.float64), b)
    with pytest.raises(TypeError, match="bias"):
      m(a, b.astype(np.int32))
    with pytest.raises(TypeError, match=r"takes 2 inputs \(image, bias\), got 1"):
      m(a)
    m.close()


def test_function_shape_mismatch_raises():
  @aot.function
  def block(inp, w):
    return (inp * w).relu()

  w = np.ones(5, np.float32)

  def model(x, y):
    return block(x, Tensor(w)) + block(y, Tensor(w)).sum()

  with pytest.raises(TypeError, match="inp") as e:
    aot.compile_model(model, [np.zeros((3, 5), np.float32), np.zeros((4, 5), np.float32)])
  msg = str(e.value)
  assert "inp" in msg and "(3, 5)" in msg and "(4, 5)" in msg


def test_function_called_twice_matches_numpy():
  @aot.function
  def block(inp, w):
    return (inp @ w).relu()

  a, b, w = randf((3, 5), 1), randf((3, 5), 2), randf((5, 5), 3)
  out = run(lambda x, y, w: block(block(x, w), w) + block(y, w), a, b, w)
  r = lambda v: np.maximum(v.astype(np.float64) @ w, 0)
  check(out, r(r(a)) + r(b), np.float32)
