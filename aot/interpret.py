"""numpy semantics of every tensor-level op: one table used for compile-time constant folding."""
from __future__ import annotations
import math
import numpy as np
from aot.ir import UOp, Ops, ReduceOp

def _idiv(a, b):
  # C semantics (truncate toward zero), as the generated kernels compute it
  if np.issubdtype(np.result_type(a, b), np.integer): return (a - np.fmod(a, b)) // b
  return np.trunc(a / b)

_erf = np.vectorize(math.erf, otypes=[np.float64])

NP_ALU = {
  Ops.NEG: np.negative, Ops.EXP: np.exp, Ops.LOG: np.log, Ops.SQRT: np.sqrt, Ops.RECIP: np.reciprocal,
  Ops.SIN: np.sin, Ops.COS: np.cos, Ops.TANH: np.tanh, Ops.ABS: np.abs, Ops.FLOOR: np.floor, Ops.CEIL: np.ceil,
  Ops.ROUND: np.round, Ops.ERF: lambda x: _erf(x).astype(x.dtype), Ops.TRUNC: np.trunc, Ops.TAN: np.tan,
  Ops.ASIN: np.arcsin, Ops.ACOS: np.arccos, Ops.ATAN: np.arctan, Ops.SINH: np.sinh, Ops.COSH: np.cosh,
  Ops.ASINH: np.arcsinh, Ops.ACOSH: np.arccosh, Ops.ATANH: np.arctanh,
  Ops.SHL: np.left_shift, Ops.SHR: np.right_shift,
  Ops.NOT: lambda x: np.logical_not(x) if x.dtype == bool else np.invert(x),
  Ops.ADD: np.add, Ops.SUB: np.subtract, Ops.MUL: np.multiply, Ops.DIV: np.true_divide, Ops.IDIV: _idiv,
  Ops.MOD: np.fmod, Ops.MAX: np.maximum, Ops.MIN: np.minimum, Ops.POW: np.power,
  Ops.CMPLT: np.less, Ops.CMPLE: np.less_equal, Ops.CMPEQ: np.equal, Ops.CMPNE: np.not_equal,
  Ops.AND: lambda a, b: np.logical_and(a, b) if a.dtype == bool else np.bitwise_and(a, b),
  Ops.OR: lambda a, b: np.logical_or(a, b) if a.dtype == bool else np.bitwise_or(a, b),
  Ops.XOR: lambda a, b: np.logical_xor(a, b) if a.dtype == bool else np.bitwise_xor(a, b),
  Ops.WHERE: np.where,
}
NP_REDUCE = {ReduceOp.SUM: np.sum, ReduceOp.PROD: np.prod, ReduceOp.MAX: np.max, ReduceOp.MIN: np.min}

def evaluate(u: UOp, leaf: dict[UOp, np.ndarray] | None = None) -> np.ndarray:
  """Evaluate a tensor-level graph with numpy. Leaves are constants, or values given in `leaf`."""
  vals: dict[UOp, np.ndarray] = dict(leaf or {})
  with np.errstate(all="ignore"):
    for n in u.toposort(stop=lambda n: n in vals):
      if n not in vals: vals[n] = _eval_node(n, [vals[s] for s in n.src])
  return vals[u]

def _eval_node(n: UOp, src: list[np.ndarray]) -> np.ndarray:
  op, arg, npdt = n.op, n.arg, n.dtype.np
  if op is Ops.CONST: return np.array(arg, dtype=npdt)
  if op is Ops.BUFFER:
    if arg.kind != "const": raise ValueError(f"cannot evaluate input {arg.name} at compile time")
    return arg.data.array
  if op in NP_ALU: return np.asarray(NP_ALU[op](*src)).astype(npdt, copy=False)
  if op is Ops.CAST: return src[0].astype(npdt)
  if op is Ops.BITCAST: return np.ascontiguousarray(src[0]).view(npdt)
  if op is Ops.CONTIGUOUS: return src[0]
  if op is Ops.RESHAPE: return src[0].reshape(arg)
  if op is Ops.PERMUTE: return src[0].transpose(arg)
  if op is Ops.EXPAND: return np.broadcast_to(src[0], arg)
  if op is Ops.PAD: return np.pad(src[0], arg[0], constant_values=arg[1])
  if op is Ops.SHRINK: return src[0][tuple(slice(a, b) for a, b in arg)]
  if op is Ops.FLIP: return np.flip(src[0], arg)
  if op is Ops.REDUCE: return NP_REDUCE[arg[0]](src[0], axis=arg[1], keepdims=True).astype(npdt)
  if op is Ops.GATHER:
    x, idx = src
    idx = np.where(idx < 0, idx + x.shape[arg], idx)
    return np.take_along_axis(x, idx.astype(np.int64), axis=arg)
  raise NotImplementedError(f"cannot evaluate {op}")
