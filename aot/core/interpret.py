"""numpy semantics of every op: one table (NP_ALU) and one evaluator, for compile-time constant folding at tensor
level and for constant operands and index grids at kernel level (codegen/lower/contract.py, codegen/lower/direct.py)."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np

from aot.core.dtype import DType, dtypes
from aot.core.ir import Ops, ReduceOp, UOp
from aot.core.symbolic import linear
from aot.errors import InvalidValueError


def _idiv(a, b):
  # C semantics (truncate toward zero), as the generated kernels compute it
  if np.issubdtype(np.result_type(a, b), np.integer):
    return (a - np.fmod(a, b)) // b
  return np.trunc(a / b)


_erf = np.vectorize(math.erf, otypes=[np.float64])


def fused_multiply_add(x, y, z) -> np.ndarray:
  """x * y + z rounded once, as C's fma does. float32 and float16: the product is exact in float64 (at most 48
  significant bits, exponents well inside float64's), the sum is rounded to odd (rounded to nearest, then moved to
  its odd neighbour towards the exact sum when it was inexact and even: the exact error comes from Knuth's two-sum),
  and the odd float64 is rounded to the narrow type; rounding to odd with 2 bits more than the narrow type's 24 makes
  that one rounding of the exact sum. (Rounded to nearest twice, float64's 53 bits are not enough: 1 + 2^-24 +
  2^-80, say, is a float32 midpoint in float64 and rounds to even.) float64: math.fma, or exact rationals where
  Python has none (before 3.13). Integers: x * y + z wraps as the separate ops do."""
  dt = np.result_type(x, y, z)
  if not np.issubdtype(dt, np.floating):
    return np.asarray(np.asarray(x, dt) * np.asarray(y, dt) + np.asarray(z, dt), dt)
  if dt.itemsize > 4:
    x, y, z = np.broadcast_arrays(*(np.asarray(v, np.float64) for v in (x, y, z)))
    with np.errstate(all="ignore"):
      return np.asarray(np.frompyfunc(_fma64, 3, 1)(x, y, z), np.float64)
  with np.errstate(all="ignore"):
    p = np.asarray(x, np.float64) * np.asarray(y, np.float64)
    z = np.asarray(z, np.float64)
    s = p + z
    back = s - p
    err = (p - (s - back)) + (z - back)
    even = (np.asarray(s).view(np.int64) & 1) == 0
    inexact = np.isfinite(err) & (err != 0)
    s = np.where(inexact & even, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
    return np.asarray(s).astype(dt)


def _fma64(x: float, y: float, z: float) -> float:
  if hasattr(math, "fma"):
    return math.fma(x, y, z)
  from fractions import Fraction

  # an infinite or NaN addend to a finite product is the result (the product may overflow, the exact one does not)
  if math.isfinite(x) and math.isfinite(y) and not math.isfinite(z):
    return z
  # a zero or non-finite product: exact, so the separate ops' IEEE result is the fused one
  if x == 0 or y == 0 or not (math.isfinite(x) and math.isfinite(y)):
    return x * y + z
  exact = Fraction(x) * Fraction(y) + Fraction(z)
  if exact == 0:
    return 0.0
  try:
    return float(exact)
  except OverflowError:
    return math.inf if exact > 0 else -math.inf


NP_ALU = {
  Ops.NEG: np.negative,
  Ops.EXP: np.exp,
  Ops.LOG: np.log,
  Ops.SQRT: np.sqrt,
  Ops.RECIP: np.reciprocal,
  Ops.SIN: np.sin,
  Ops.COS: np.cos,
  Ops.TANH: np.tanh,
  Ops.ABS: np.abs,
  Ops.FLOOR: np.floor,
  Ops.CEIL: np.ceil,
  Ops.ROUND: np.round,
  Ops.ERF: lambda x: _erf(x).astype(x.dtype),
  Ops.TRUNC: np.trunc,
  Ops.TAN: np.tan,
  Ops.ASIN: np.arcsin,
  Ops.ACOS: np.arccos,
  Ops.ATAN: np.arctan,
  Ops.SINH: np.sinh,
  Ops.COSH: np.cosh,
  Ops.ASINH: np.arcsinh,
  Ops.ACOSH: np.arccosh,
  Ops.ATANH: np.arctanh,
  Ops.SHL: np.left_shift,
  Ops.SHR: np.right_shift,
  Ops.NOT: lambda x: np.logical_not(x) if x.dtype == bool else np.invert(x),
  Ops.ADD: np.add,
  Ops.SUB: np.subtract,
  Ops.MUL: np.multiply,
  Ops.DIV: np.true_divide,
  Ops.IDIV: _idiv,
  Ops.MOD: np.fmod,
  Ops.MAX: np.maximum,
  Ops.MIN: np.minimum,
  Ops.POW: np.power,
  Ops.CMPLT: np.less,
  Ops.CMPLE: np.less_equal,
  Ops.CMPEQ: np.equal,
  Ops.CMPNE: np.not_equal,
  Ops.AND: lambda a, b: np.logical_and(a, b) if a.dtype == bool else np.bitwise_and(a, b),
  Ops.OR: lambda a, b: np.logical_or(a, b) if a.dtype == bool else np.bitwise_or(a, b),
  Ops.XOR: lambda a, b: np.logical_xor(a, b) if a.dtype == bool else np.bitwise_xor(a, b),
  Ops.WHERE: np.where,
  Ops.FMA: fused_multiply_add,
}
NP_REDUCE = {ReduceOp.SUM: np.sum, ReduceOp.PROD: np.prod, ReduceOp.MAX: np.max, ReduceOp.MIN: np.min}


def eval_dtype(dt: DType) -> np.dtype:
  """The numpy type a value of dt is computed in: the kernel index types in int64 (numpy has no type of theirs, and
  64 bits do not wrap where the kernel's 32 could not either)."""
  return np.dtype(np.int64) if dt in (dtypes.index, dtypes.index64) else dt.np


def evaluate(
  u: UOp,
  leaf: dict[UOp, np.ndarray] | None = None,
  axes: list[UOp] | None = None,
  data: dict[int, np.ndarray] | None = None,
) -> np.ndarray:
  """Evaluate a graph with numpy. Tensor level: the leaves are constants, or values given in `leaf`. Kernel level:
  each RANGE is an arange along its own axis of `axes` (size 1 along the others) and a LOAD reads data[slot], so
  each node is computed over the ranges it depends on only and the result broadcasts to the grid of axes. Each value
  is dropped after its last use: the memory is a small multiple of the largest value, not of the whole graph's."""
  vals: dict[UOp, np.ndarray] = dict(leaf or {})
  if data is not None:
    vals |= {n: v for n in u.toposort() if n.op is Ops.LOAD and (v := _strided_load(n, axes, data)) is not None}
  nodes = u.toposort(stop=lambda n: n in vals)
  uses = Counter(s for n in nodes if n not in vals for s in n.src)
  with np.errstate(all="ignore"):
    for n in nodes:
      if n in vals:
        continue
      vals[n] = _eval_node(n, [vals[s] for s in n.src], axes, data)
      for s in n.src:
        uses[s] -= 1
        if uses[s] == 0:
          del vals[s]
  return vals[u]


def _strided_load(n: UOp, axes: list[UOp], data: dict[int, np.ndarray]) -> np.ndarray | None:
  """An ungated LOAD at an index linear in the ranges, in bounds, as a strided view of its data: no index array
  and no gather (a VGG-19's 575 MB of weights packed: 1.4 s of index arithmetic and 1 s of np.take)."""
  glob, idx, gate = n.src
  if glob.op is not Ops.DEFINE_GLOBAL or gate.op is not Ops.CONST or gate.arg is not True:
    return None
  terms, const = linear(idx)
  if not all(t.op is Ops.RANGE and t in axes for t in terms):
    return None
  flat = data[glob.slot].reshape(-1)
  lo = const + sum(min(0, k * (t.size - 1)) for t, k in terms.items())
  hi = const + sum(max(0, k * (t.size - 1)) for t, k in terms.items())
  if lo < 0 or hi >= flat.size:
    return None
  shape = [a.size if a in terms else 1 for a in axes]
  strides = [terms.get(a, 0) * flat.itemsize for a in axes]
  view = np.lib.stride_tricks.as_strided(flat[const:], shape, strides, writeable=False)
  return view.astype(eval_dtype(n.dtype), copy=False)


def _eval_node(n: UOp, src: list[np.ndarray], axes: list[UOp] | None, data: dict[int, np.ndarray] | None) -> np.ndarray:
  op, arg, npdt = n.op, n.arg, eval_dtype(n.dtype)
  if op is Ops.CONST:
    return np.array(arg, dtype=npdt)
  if op in NP_ALU:
    return np.asarray(NP_ALU[op](*src)).astype(npdt, copy=False)
  if op is Ops.CAST:
    return src[0].astype(npdt)
  # kernel level
  if op is Ops.RANGE:
    return np.arange(n.size, dtype=np.int64).reshape([-1 if a is n else 1 for a in axes])
  if op is Ops.DEFINE_GLOBAL:
    if data is None:
      raise ValueError(f"{op.name} in an expression of ranges alone")
    return data[n.slot].reshape(-1)
  if op is Ops.LOAD:
    # gathered over the index's own ranges (clamped: out of bounds only where the gate is false), then gated
    flat, idx, gate = src
    v = np.take(flat, idx, mode="clip")
    return v if gate.ndim == 0 and gate else np.where(gate, v, np.zeros((), flat.dtype))
  # tensor level
  if op is Ops.BUFFER:
    if arg.kind != "const":
      raise ValueError(f"cannot evaluate input {arg.name} at compile time")
    return arg.data.array
  if op is Ops.BITCAST:
    return np.ascontiguousarray(src[0]).view(npdt)
  if op is Ops.CONTIGUOUS:
    return src[0]
  if op is Ops.RESHAPE:
    return src[0].reshape(arg)
  if op is Ops.PERMUTE:
    return src[0].transpose(arg)
  if op is Ops.EXPAND:
    return np.broadcast_to(src[0], arg)
  if op is Ops.PAD:
    return np.pad(src[0], arg[0], constant_values=arg[1])
  if op is Ops.SHRINK:
    return src[0][tuple(slice(a, b) for a, b in arg)]
  if op is Ops.FLIP:
    return np.flip(src[0], arg)
  if op is Ops.REDUCE:
    return NP_REDUCE[n.reduce_op](src[0], axis=n.axes, keepdims=True).astype(npdt)
  if op is Ops.GATHER:
    x, idx, axis = src[0], src[1], arg if len(src) == 2 else arg[0]
    # a checked gather (IndexCheck) of constant indices: a bad one is the model's error, found at compile time
    if len(src) == 3 and src[2][0] != math.prod(arg[1].shape):
      raise InvalidValueError(arg[1].message(int(src[2][0]), int(src[2][1])))
    # clamped into [-n, n) and wrapped, as lowering does (aot/scheduler/schedule.py _index_compute)
    idx = np.clip(idx.astype(np.int64), -x.shape[axis], x.shape[axis] - 1)
    idx = np.where(idx < 0, idx + x.shape[axis], idx)
    return np.take_along_axis(x, idx.astype(np.int64), axis=axis)
  raise NotImplementedError(f"cannot evaluate {op}")


def evaluate_grid(u: UOp, axes: list[UOp], data: dict[int, np.ndarray] | None = None) -> np.ndarray:
  """A kernel-level expression's value at every point of the grid of axes (a read-only broadcast view)."""
  return np.broadcast_to(evaluate(u, axes=axes, data=data), [a.size for a in axes])
