"""The lazy Tensor API: every method builds tensor-level UOps; nothing runs until the graph is compiled."""

from __future__ import annotations

import functools
import inspect
import math
from typing import Sequence

import numpy as np

from aot.core.dtype import DType, dtypes, promote, to_dtype
from aot.core.ir import BufferArg, ConstData, IndexCheck, Ops, ReduceOp, UOp, prod
from aot.errors import CompileError, InvalidIndexError, InvalidTypeError, InvalidValueError, Unsupported
from aot.frontends.tensor_nn import TensorNN


def _axes(axis, ndim: int) -> tuple[int, ...]:
  if axis is None:
    return tuple(range(ndim))
  axes = (axis,) if isinstance(axis, int) else tuple(axis)
  for a in axes:
    if not -ndim <= a < max(ndim, 1):
      raise InvalidValueError(f"axis {a} is out of range for a tensor of rank {ndim}")
  return tuple(sorted({a % max(ndim, 1) for a in axes}))


class Tensor(TensorNN):
  """A lazy tensor: a handle on a tensor-level UOp. Shapes and dtypes are known when the tensor is built. The network
  methods (matmul, conv, pools, softmax, norms) are in frontends/tensor_nn.py."""

  __slots__ = ("uop",)
  __array_priority__ = 1000  # numpy scalars on the left defer to our operators

  def __init__(self, data, dtype=None):
    if isinstance(data, UOp):
      self.uop = data
      return
    if isinstance(data, (bool, int, float)) and dtype is None:
      dtype = (
        dtypes.bool if isinstance(data, bool) else dtypes.default_int if isinstance(data, int) else dtypes.default_float
      )
    arr = np.asarray(data, dtype=None if dtype is None else to_dtype(dtype).np)
    if arr.dtype == np.float64 and dtype is None and not isinstance(data, np.ndarray):
      arr = arr.astype(np.float32)
    dt = to_dtype(arr.dtype)
    if arr.ndim == 0:
      self.uop = UOp.const(dt, arr.item())
      return
    arr = np.ascontiguousarray(arr)
    arr.flags.writeable = False
    self.uop = UOp(Ops.BUFFER, dt, (), BufferArg("const", arr.shape, "const", ConstData(arr)))

  @staticmethod
  def input(name: str, shape: Sequence[int], dtype=dtypes.float32) -> Tensor:
    """A model input: a named buffer the caller passes at run time."""
    shape = tuple(int(s) for s in shape)
    if bad := [f"dim {i} is {s}" for i, s in enumerate(shape) if s < 0]:
      raise CompileError(f"input '{name}' of shape {shape}: {', '.join(bad)} (a dim is a size: 0 or more)")
    return Tensor(UOp(Ops.BUFFER, to_dtype(dtype), (), BufferArg(name, shape, "input")))

  @property
  def shape(self) -> tuple[int, ...]:
    return self.uop.shape

  @property
  def dtype(self) -> DType:
    return self.uop.dtype

  @property
  def ndim(self) -> int:
    return len(self.shape)

  def numel(self) -> int:
    return prod(self.shape)

  def from_constants(self) -> bool:
    """Is it computed from constants alone (no model input, no function parameter)?"""
    return not any(u.op is Ops.PARAM or (u.op is Ops.BUFFER and u.arg.kind != "const") for u in self.uop.toposort())

  def __len__(self) -> int:
    return self.shape[0]

  def __repr__(self) -> str:
    return f"<Tensor {self.uop.op.name} {self.shape} {self.dtype.name}>"

  def __bool__(self):
    raise TypeError("a lazy Tensor has no truth value at trace time")

  # *** broadcasting and promotion ***
  def _const(self, value, dtype: DType) -> Tensor:
    return Tensor(UOp.const(dtype, value))

  def _coerce(self, other) -> tuple[Tensor, Tensor]:
    """Both operands as tensors of one dtype and one shape. Python scalars are weak: they take the tensor's dtype,
    except that a float scalar with an integer/bool tensor gives the default float (float32)."""
    if isinstance(other, Tensor):
      dt = promote(self.dtype, other.dtype)
    else:
      if isinstance(other, np.generic):
        other = other.item()
      if isinstance(other, bool):
        dt = self.dtype
      elif isinstance(other, int):
        dt = self.dtype if self.dtype != dtypes.bool else dtypes.default_int
      elif isinstance(other, float):
        dt = self.dtype if self.dtype.is_float else dtypes.default_float
      else:
        raise TypeError(f"cannot combine a Tensor with {type(other).__name__}")
      other = self._const(other, dt)
    a, b = self.cast(dt), other.cast(dt)
    shape = _broadcast_shape(a.shape, b.shape)
    return a._broadcast_to(shape), b._broadcast_to(shape)

  def _broadcast_to(self, shape) -> Tensor:
    if self.shape == tuple(shape):
      return self
    padded = (1,) * (len(shape) - self.ndim) + self.shape
    return Tensor(self.uop.reshape(padded).expand(shape))

  def _binary(self, op: Ops, other, reverse=False, out_dtype=None) -> Tensor:
    a, b = self._coerce(other)
    if reverse:
      a, b = b, a
    return Tensor(UOp(op, out_dtype or a.dtype, (a.uop, b.uop)))

  def _unary(self, op: Ops) -> Tensor:
    return Tensor(UOp(op, self.dtype, (self.uop,)))

  def _float(self) -> Tensor:
    return self if self.dtype.is_float else self.cast(dtypes.default_float)

  # *** elementwise ***
  def __add__(self, o):
    return self._binary(Ops.ADD, o)

  def __radd__(self, o):
    return self._binary(Ops.ADD, o, True)

  def __sub__(self, o):
    return self._binary(Ops.SUB, o)

  def __rsub__(self, o):
    return self._binary(Ops.SUB, o, True)

  def __mul__(self, o):
    return self._binary(Ops.MUL, o)

  def __rmul__(self, o):
    return self._binary(Ops.MUL, o, True)

  def __truediv__(self, o):
    return self.div(o)

  def __rtruediv__(self, o):
    return self._float()._binary(Ops.DIV, o, True) if not isinstance(o, Tensor) else o.div(self)

  def __floordiv__(self, o):
    """C's division, not Python's: the quotient truncated toward zero (floats too). x // 0 is 0 for integers and
    MIN // -1 wraps to MIN, as numpy gives them (docs/ARCHITECTURE.md)."""
    return self._binary(Ops.IDIV, o)

  def __mod__(self, o):
    """C's remainder (fmod), not Python's: the dividend's sign. x % 0 and MIN % -1 are 0 for integers."""
    return self._binary(Ops.MOD, o)

  def __pow__(self, o):
    return self.pow(o)

  def __rpow__(self, o):
    return self._float()._binary(Ops.POW, o, True)

  def __neg__(self):
    return self.neg()

  def __lt__(self, o):
    return self._binary(Ops.CMPLT, o, out_dtype=dtypes.bool)

  def __le__(self, o):
    return self._binary(Ops.CMPLE, o, out_dtype=dtypes.bool)

  def __gt__(self, o):
    return self._binary(Ops.CMPLT, o, True, out_dtype=dtypes.bool)

  def __ge__(self, o):
    return self._binary(Ops.CMPLE, o, True, out_dtype=dtypes.bool)

  def __eq__(self, o):
    return self._binary(Ops.CMPEQ, o, out_dtype=dtypes.bool)  # type: ignore[override]

  def __ne__(self, o):
    return self._binary(Ops.CMPNE, o, out_dtype=dtypes.bool)  # type: ignore[override]

  def __and__(self, o):
    return self._binary(Ops.AND, o)

  def __or__(self, o):
    return self._binary(Ops.OR, o)

  def __xor__(self, o):
    return self._binary(Ops.XOR, o)

  def __invert__(self):
    return self._unary(Ops.NOT)

  def __matmul__(self, o):
    return self.matmul(o)

  def __rmatmul__(self, o):
    return Tensor(o).matmul(self)

  __hash__ = object.__hash__

  def add(self, o):
    return self + o

  def sub(self, o):
    return self - o

  def mul(self, o):
    return self * o

  def div(self, o):
    a, b = self._coerce(o)
    if not a.dtype.is_float:
      a, b = a._float(), b._float()
    return Tensor(UOp(Ops.DIV, a.dtype, (a.uop, b.uop)))

  def pow(self, o):
    return self._float()._binary(Ops.POW, o)

  def eq(self, o):
    return self == o

  def ne(self, o):
    return self != o

  def maximum(self, o):
    return self._binary(Ops.MAX, o)

  def minimum(self, o):
    return self._binary(Ops.MIN, o)

  def neg(self):
    return self._unary(Ops.NEG) if self.dtype != dtypes.bool else ~self

  def abs(self):
    return self._unary(Ops.ABS)

  def exp(self):
    return self._float()._unary(Ops.EXP)

  def log(self):
    return self._float()._unary(Ops.LOG)

  def sqrt(self):
    return self._float()._unary(Ops.SQRT)

  def rsqrt(self):
    return self.sqrt().reciprocal()

  def reciprocal(self):
    return self._float()._unary(Ops.RECIP)

  def sin(self):
    return self._float()._unary(Ops.SIN)

  def cos(self):
    return self._float()._unary(Ops.COS)

  def tanh(self):
    return self._float()._unary(Ops.TANH)

  def erf(self):
    return self._float()._unary(Ops.ERF)

  def tan(self):
    return self._float()._unary(Ops.TAN)

  def asin(self):
    return self._float()._unary(Ops.ASIN)

  def acos(self):
    return self._float()._unary(Ops.ACOS)

  def atan(self):
    return self._float()._unary(Ops.ATAN)

  def sinh(self):
    return self._float()._unary(Ops.SINH)

  def cosh(self):
    return self._float()._unary(Ops.COSH)

  def asinh(self):
    return self._float()._unary(Ops.ASINH)

  def acosh(self):
    return self._float()._unary(Ops.ACOSH)

  def atanh(self):
    return self._float()._unary(Ops.ATANH)

  def trunc(self):
    return self._unary(Ops.TRUNC) if self.dtype.is_float else self

  def sign(self):
    if self.dtype == dtypes.bool:
      return self
    s = (self > 0).cast(self.dtype) - (self < 0).cast(self.dtype)
    # NaN compares false both ways; its sign is NaN (numpy, onnxruntime, onnx.reference)
    return (self != self).where(self, s) if self.dtype.is_float else s

  def isnan(self):
    return self != self

  def isinf(self):
    return self.abs() == float("inf") if self.dtype.is_float else self != self

  def __lshift__(self, o):
    return self._binary(Ops.SHL, o)

  def __rshift__(self, o):
    return self._binary(Ops.SHR, o)

  def floor(self):
    return self._unary(Ops.FLOOR) if self.dtype.is_float else self

  def ceil(self):
    return self._unary(Ops.CEIL) if self.dtype.is_float else self

  def round(self):
    return self._unary(Ops.ROUND) if self.dtype.is_float else self

  def sigmoid(self):
    return (1.0 + (-self._float()).exp()).reciprocal()

  def relu(self):
    return self.maximum(0)

  def gelu(self, approximate: str = "none"):
    x = self._float()
    if approximate == "tanh":
      return 0.5 * x * (1.0 + (math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)).tanh())
    if approximate != "none":
      raise InvalidValueError(f"gelu approximate must be 'none' or 'tanh', not {approximate!r}")
    return 0.5 * x * (1.0 + (x * (1 / math.sqrt(2))).erf())

  def square(self):
    return self * self

  def logical_not(self):
    return self.cast(dtypes.bool)._unary(Ops.NOT)

  def where(self, a, b) -> Tensor:
    """self is the condition: elementwise a where self else b."""
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
      a = Tensor(a, dtypes.default_float if isinstance(a, float) or isinstance(b, float) else None)
    a, b = a._coerce(b) if isinstance(a, Tensor) else tuple(reversed(b._coerce(a)))
    shape = _broadcast_shape(self.shape, a.shape)
    c, a, b = self.cast(dtypes.bool)._broadcast_to(shape), a._broadcast_to(shape), b._broadcast_to(shape)
    return Tensor(UOp(Ops.WHERE, a.dtype, (c.uop, a.uop, b.uop)))

  def fma(self, y, z) -> Tensor:
    """self * y + z rounded once (a fused multiply-add, C's fma): the exact product plus z, rounded to the float type;
    the separate ops round twice. Integers: self * y + z, which rounds nowhere."""
    x, y = self._coerce(y)
    x, z = x._coerce(z)
    y = y.cast(x.dtype)._broadcast_to(x.shape)
    if not x.dtype.is_float:
      return x * y + z
    return Tensor(UOp(Ops.FMA, x.dtype, (x.uop, y.uop, z.uop)))

  def cast(self, dtype) -> Tensor:
    return Tensor(self.uop.cast(to_dtype(dtype)))

  def bitcast(self, dtype) -> Tensor:
    dtype = to_dtype(dtype)
    if dtype.itemsize != self.dtype.itemsize:
      raise InvalidTypeError(f"bitcast {self.dtype.name} -> {dtype.name} changes the size")
    return Tensor(UOp(Ops.BITCAST, dtype, (self.uop,)))

  def contiguous(self) -> Tensor:
    return Tensor(UOp(Ops.CONTIGUOUS, self.dtype, (self.uop,)))

  # *** reductions ***
  def _reduce(self, op: ReduceOp, axis, keepdim: bool) -> Tensor:
    axes = _axes(axis, self.ndim)
    if any(self.shape[a] == 0 for a in axes):
      # a reduce over an empty axis is its identity
      shape = tuple(1 if i in axes else s for i, s in enumerate(self.shape))
      ret = Tensor(UOp.const(self.dtype, op.identity(self.dtype)))._broadcast_to(shape)
    else:
      ret = Tensor(self.uop.reduce(op, axes))
    return ret if keepdim else ret.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))

  def sum(self, axis=None, keepdim=False):
    x = self.cast(dtypes.default_int) if self.dtype == dtypes.bool else self
    return x._reduce(ReduceOp.SUM, axis, keepdim)

  def prod(self, axis=None, keepdim=False):
    return self._reduce(ReduceOp.PROD, axis, keepdim)

  def max(self, axis=None, keepdim=False):
    return self._reduce(ReduceOp.MAX, axis, keepdim)

  def min(self, axis=None, keepdim=False):
    return self._reduce(ReduceOp.MIN, axis, keepdim)

  def mean(self, axis=None, keepdim=False):
    from aot.frontends.batch_dims import note_mean

    n = prod(self.shape[a] for a in _axes(axis, self.ndim))
    note_mean(n)
    return self._float().sum(axis, keepdim) * (1.0 / n if n else math.nan)

  def var(self, axis=None, keepdim=False, correction=0):
    d = self - self.mean(axis, keepdim=True)
    n = prod(self.shape[a] for a in _axes(axis, self.ndim))
    return (d * d).sum(axis, keepdim) * (1.0 / max(n - correction, 0) if n - correction > 0 else math.nan)

  def _arg_reduce(self, axis, keepdim: bool, largest: bool) -> Tensor:
    # the first index holding the extreme: max over (n - i) of the positions equal to the extreme, mapped back
    if axis is None:
      return self.flatten()._arg_reduce(0, keepdim, largest).reshape(() if not keepdim else (1,) * self.ndim)
    axis = _axes(axis, self.ndim)[0]
    n = self.shape[axis]
    m = self.max(axis, keepdim=True) if largest else self.min(axis, keepdim=True)
    rev = Tensor(np.arange(n, 0, -1, dtype=np.int64).reshape([n if i == axis else 1 for i in range(self.ndim)]))
    hit = (self == m) | ((self != self) & (m != m))  # nan is the extreme, as numpy says
    return (n - hit.where(rev, 0).max(axis, keepdim=True)).reshape(
      m.shape if keepdim else tuple(s for i, s in enumerate(self.shape) if i != axis)
    )

  def argmax(self, axis=None, keepdim=False):
    return self._arg_reduce(axis, keepdim, True)

  def argmin(self, axis=None, keepdim=False):
    return self._arg_reduce(axis, keepdim, False)

  # *** movement ***
  def reshape(self, *shape) -> Tensor:
    shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else tuple(shape)
    if shape.count(-1) > 1:
      raise InvalidValueError(f"reshape {self.shape} -> {shape}: at most one -1")
    if -1 in shape:
      known = prod(s for s in shape if s != -1)
      shape = tuple(self.numel() // known if s == -1 and known else (0 if s == -1 else s) for s in shape)
    if prod(shape) != self.numel():
      raise InvalidValueError(f"cannot reshape {self.shape} ({self.numel()} elements) to {shape}")
    return Tensor(self.uop.reshape(tuple(int(s) for s in shape)))

  def permute(self, *order) -> Tensor:
    order = tuple(order[0]) if len(order) == 1 and isinstance(order[0], (tuple, list)) else tuple(order)
    order = tuple(o % self.ndim for o in order) if self.ndim else order
    if sorted(order) != list(range(self.ndim)):
      raise InvalidValueError(f"permute order {order} is not a permutation of {self.ndim} axes")
    return Tensor(self.uop.permute(order))

  def transpose(self, a: int = -2, b: int = -1) -> Tensor:
    order = list(range(self.ndim))
    order[a], order[b] = order[b], order[a]
    return self.permute(order)

  @property
  def T(self) -> Tensor:
    return self.permute(tuple(reversed(range(self.ndim))))

  def expand(self, *shape) -> Tensor:
    shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else tuple(shape)
    shape = tuple(s if s != -1 else self.shape[i - (len(shape) - self.ndim)] for i, s in enumerate(shape))
    if _broadcast_shape(self.shape, shape) != shape:
      raise InvalidValueError(f"cannot expand {self.shape} to {shape}")
    return self._broadcast_to(shape)

  def pad(self, pads, value=0.0) -> Tensor:
    """numpy-style pads: one (before, after) per axis; negative amounts remove elements."""
    pads = [(p, p) if isinstance(p, int) else tuple(p) for p in pads]
    if len(pads) != self.ndim:
      raise InvalidValueError(f"pad needs {self.ndim} (before, after) pairs, got {len(pads)}")
    x = self
    if any(a < 0 or b < 0 for a, b in pads):
      x = x.shrink([(-min(a, 0), s + min(b, 0)) for (a, b), s in zip(pads, self.shape)])
    return Tensor(x.uop.pad([(max(a, 0), max(b, 0)) for a, b in pads], value))

  def shrink(self, bounds) -> Tensor:
    bounds = [(0, s) if b is None else b for b, s in zip(bounds, self.shape)]
    for (a, b), s in zip(bounds, self.shape):
      if not 0 <= a <= b <= s:
        raise InvalidValueError(f"shrink {bounds} out of range for shape {self.shape}")
    return Tensor(self.uop.shrink(bounds))

  def flip(self, axis) -> Tensor:
    return Tensor(self.uop.flip(_axes(axis, self.ndim)))

  def flatten(self, start: int = 0, end: int = -1) -> Tensor:
    if self.ndim == 0:
      return self.reshape(1)
    start, end = start % self.ndim, end % self.ndim
    return self.reshape(self.shape[:start] + (prod(self.shape[start : end + 1]),) + self.shape[end + 1 :])

  def squeeze(self, axis=None) -> Tensor:
    axes = [i for i, s in enumerate(self.shape) if s == 1] if axis is None else _axes(axis, self.ndim)
    for a in axes:
      if self.shape[a] != 1:
        raise InvalidValueError(f"cannot squeeze axis {a} of size {self.shape[a]}")
    return self.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))

  def unsqueeze(self, axis: int) -> Tensor:
    axis = axis % (self.ndim + 1)
    return self.reshape(self.shape[:axis] + (1,) + self.shape[axis:])

  def repeat(self, *reps) -> Tensor:
    reps = tuple(reps[0]) if len(reps) == 1 and isinstance(reps[0], (tuple, list)) else tuple(reps)
    x = self.reshape((1,) * (len(reps) - self.ndim) + self.shape)
    big = tuple(v for r, s in zip(reps, x.shape) for v in (r, s))
    return (
      x.reshape(tuple(v for s in x.shape for v in (1, s)))
      .expand(big)
      .reshape(tuple(r * s for r, s in zip(reps, x.shape)))
    )

  def _strided(self, axis: int, step: int) -> Tensor:
    """Every step-th element along axis, from the first."""
    n = self.shape[axis]
    out = -(-n // step)
    x = self.pad([(0, out * step - n) if i == axis else (0, 0) for i in range(self.ndim)])
    x = x.reshape(self.shape[:axis] + (out, step) + self.shape[axis + 1 :])
    x = x.shrink([(0, 1) if i == axis + 1 else None for i in range(x.ndim)])
    return x.reshape(self.shape[:axis] + (out,) + self.shape[axis + 1 :])

  def __getitem__(self, idx) -> Tensor:
    idx = list(idx) if isinstance(idx, tuple) else [idx]
    if any(isinstance(i, Tensor) for i in idx):
      if len(idx) != 1:
        raise Unsupported("indexing with a tensor works on the first axis only; use take()")
      return self.take(idx[0], 0)
    if (n_ell := sum(i is Ellipsis for i in idx)) > 1:
      raise InvalidIndexError("only one Ellipsis is allowed")
    real = sum(i is not None and i is not Ellipsis for i in idx)
    if real > self.ndim:
      raise InvalidIndexError(f"too many indices ({real}) for a tensor of rank {self.ndim}")
    if n_ell:
      e = idx.index(Ellipsis)
      idx[e : e + 1] = [slice(None)] * (self.ndim - real)
    idx += [slice(None)] * (self.ndim - real - 0) if not n_ell else []
    x, axis, bounds, flips, steps, out_shape = self, 0, [], [], [], []
    for i in idx:
      if i is None:
        out_shape.append(("new",))
        continue
      n = self.shape[axis]
      if isinstance(i, (int, np.integer)):
        i = int(i)
        if not -n <= i < n:
          raise InvalidIndexError(f"index {i} is out of bounds for axis {axis} with size {n}")
        bounds.append((i % n, i % n + 1))
        out_shape.append(("drop",))
      elif isinstance(i, slice):
        start, stop, step = i.indices(n)
        cnt = len(range(start, stop, step))
        if step > 0:
          bounds.append((start, start + max(cnt - 1, 0) * step + (1 if cnt else 0)))
        else:
          flips.append(axis)
          bounds.append((n - 1 - start, n - 1 - start + max(cnt - 1, 0) * -step + (1 if cnt else 0)))
        steps.append((axis, abs(step)))
        out_shape.append(("keep",))
      else:
        raise InvalidTypeError(f"unsupported index {i!r}")
      axis += 1
    x = x.flip(flips) if flips else x
    x = x.shrink(bounds)
    for a, s in steps:
      if s > 1 and x.shape[a] > 0:
        x = x._strided(a, s)
    shape, it = [], iter(x.shape)
    for kind in out_shape:
      if kind[0] == "new":
        shape.append(1)
      elif kind[0] == "keep":
        shape.append(next(it))
      else:
        next(it)
    shape += list(it)
    return x.reshape(tuple(shape))

  @staticmethod
  def cat(tensors: Sequence[Tensor], axis: int = 0) -> Tensor:
    tensors = list(tensors)
    t0 = tensors[0]
    axis = axis % t0.ndim
    dt = functools.reduce(promote, [t.dtype for t in tensors])
    for t in tensors:
      if t.ndim != t0.ndim or any(a != b for i, (a, b) in enumerate(zip(t.shape, t0.shape)) if i != axis):
        raise InvalidValueError(f"cat: shapes {[t.shape for t in tensors]} differ outside axis {axis}")
    total, off, parts = sum(t.shape[axis] for t in tensors), 0, []
    for t in tensors:
      if t.shape[axis] == 0:
        continue
      parts.append(t.cast(dt).pad([(off, total - off - t.shape[axis]) if i == axis else (0, 0) for i in range(t.ndim)]))
      off += t.shape[axis]
    if not parts:
      return t0.cast(dt).reshape(t0.shape[:axis] + (0,) + t0.shape[axis + 1 :])
    # the pieces are zero outside their own slice: adding (or or-ing) them places each one
    return functools.reduce(lambda a, b: a | b if dt == dtypes.bool else a + b, parts)

  def stack(*tensors, axis: int = 0) -> Tensor:
    tensors = list(tensors[0]) if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)) else list(tensors)
    axis = axis % (tensors[0].ndim + 1)
    return Tensor.cat([t.unsqueeze(axis) for t in tensors], axis)

  def gather(self, axis: int, index: Tensor, checked_by: str | None = None, name: str | None = None) -> Tensor:
    """torch.gather / ONNX GatherElements: out[..., i, ...] = self[..., index[..., i, ...], ...] along axis.
    An index outside [-n, n) is clamped; with checked_by (what indexes: "Gather node 'emb'"), a run given one also
    fails, naming the indices (a model input, else name) and the bad value's position (IndexCheck)."""
    axis = axis % self.ndim
    if index.ndim != self.ndim:
      raise InvalidValueError(f"gather: index rank {index.ndim} != data rank {self.ndim}")
    if index.dtype.kind not in "iu":
      raise InvalidTypeError(f"gather: index must be an integer tensor, not {index.dtype.name}")
    return self._gather(axis, index, checked_by and index._index_check(self.shape[axis], checked_by, name))

  def _gather(self, axis: int, index: Tensor, check: tuple[Tensor, IndexCheck] | None) -> Tensor:
    x = self.shrink([(0, self.shape[i]) if i == axis else (0, index.shape[i]) for i in range(self.ndim)])
    if check is None:
      return Tensor(UOp(Ops.GATHER, self.dtype, (x.uop, index.uop), axis))
    return Tensor(UOp(Ops.GATHER, self.dtype, (x.uop, index.uop, check[0].uop), (axis, check[1])))

  def _index_check(self, size: int, user: str, name: str | None) -> tuple[Tensor, IndexCheck] | None:
    """self as the indices of an axis of this size: the check tensor of a checked GATHER and its label."""
    if self.numel() == 0:
      return None
    # the model input these indices are, element for element (through reshapes and casts): named in the message, the
    # position given in its shape
    base = self.uop
    while base.op in (Ops.RESHAPE, Ops.CAST) and base.src[0].dtype.kind in "iu":
      base = base.src[0]
    src = base.arg.name if base.op is Ops.BUFFER and base.arg.kind == "input" else None
    shape = base.shape if src else self.shape
    what = f"input '{src}'" if src else f"tensor '{name}'" if name else "the indices"
    x = self.reshape(shape).cast(dtypes.int64)
    # each element's flat position, as a sum of one small arange per axis (not one constant as big as the indices)
    pos = Tensor(UOp.const(dtypes.int64, 0))
    stride = self.numel()
    for k, s in enumerate(shape):
      stride //= s
      coord = np.arange(s, dtype=np.int64) * stride
      pos = pos + Tensor(coord.reshape([s if i == k else 1 for i in range(len(shape))]))
    first = ((x < -size) | (x >= size)).where(pos, Tensor(self.numel(), dtypes.int64)).min().reshape(1)
    value = x.reshape(-1)._gather(0, first, None)
    return Tensor.cat([first, value]), IndexCheck(what, user, tuple(shape), size, src)

  def take(self, indices, axis: int = 0, checked_by: str | None = None, name: str | None = None) -> Tensor:
    """numpy.take / ONNX Gather: the axis is replaced by the indices' shape. checked_by, name: as gather's."""
    indices = indices if isinstance(indices, Tensor) else Tensor(np.asarray(indices, dtype=np.int64))
    axis = axis % self.ndim
    pre, post, r = self.shape[:axis], self.shape[axis + 1 :], indices.ndim
    check = checked_by and indices._index_check(self.shape[axis], checked_by, name)
    if r <= 1:
      flat = indices.reshape(-1)
      idx = flat.reshape((1,) * len(pre) + flat.shape + (1,) * len(post)).expand(pre + flat.shape + post)
      return self._gather(axis, idx, check).reshape(pre + indices.shape + post)
    # several axes of indices kept apart (not flattened into one, which would merge a ranged dim with the others):
    # self broadcast along them, gathered along its own axis after them
    data = self.reshape(pre + (1,) * r + self.shape[axis:]).expand(pre + indices.shape + self.shape[axis:])
    idx = indices.reshape((1,) * len(pre) + indices.shape + (1,) + (1,) * len(post))
    idx = idx.expand(pre + indices.shape + (1,) + post)
    return data._gather(axis + r, idx, check).reshape(pre + indices.shape + post)


def _broadcast_shape(*shapes) -> tuple[int, ...]:
  nd = max(len(s) for s in shapes)
  padded = [(1,) * (nd - len(s)) + tuple(s) for s in shapes]
  out = []
  for dims in zip(*padded):
    big = {d for d in dims if d != 1}
    if len(big) > 1:
      raise InvalidValueError(f"shapes {' and '.join(str(tuple(s)) for s in shapes)} do not broadcast")
    out.append(big.pop() if big else 1)
  return tuple(out)


# *** functions: traced once, called many times ***


def function(fn):
  """Trace fn once into a FUNCTION body over PARAMs; each call becomes a CALL, inlined before scheduling."""
  sig = inspect.signature(fn)
  state: dict = {}

  @functools.wraps(fn)
  def call(*args, **kwargs):
    bound = sig.bind(*args, **kwargs)
    names, vals = [], []
    for n, v in bound.arguments.items():
      # *args contribute one parameter each
      items = (
        [(f"{n}[{i}]", x) for i, x in enumerate(v)]
        if sig.parameters[n].kind is inspect.Parameter.VAR_POSITIONAL
        else [(n, v)]
      )
      for name, x in items:
        names.append(name)
        vals.append(x if isinstance(x, Tensor) else Tensor(x))
    if "body" not in state:
      params = [Tensor(UOp(Ops.PARAM, v.dtype, (), (i, v.shape, n))) for i, (n, v) in enumerate(zip(names, vals))]
      out = fn(*params)
      state["single"] = isinstance(out, Tensor)
      outs = (out,) if state["single"] else tuple(out)
      state["body"] = UOp(Ops.FUNCTION, dtypes.void, tuple(o.uop for o in outs), fn.__name__)
      state["params"] = [(n, v.shape, v.dtype) for n, v in zip(names, vals)]
    params = state["params"]
    if len(vals) != len(params):
      raise InvalidTypeError(f"{fn.__name__}() was traced with {len(params)} arguments, called with {len(vals)}")
    for (n, shape, dt), v in zip(params, vals):
      if v.shape != shape or v.dtype != dt:
        raise InvalidTypeError(
          f"{fn.__name__}() argument '{n}': traced with shape {shape} {dt.name}, "
          f"called with shape {v.shape} {v.dtype.name}"
        )
    body = state["body"]
    outs = tuple(Tensor(UOp(Ops.CALL, o.dtype, (body, *(v.uop for v in vals)), i)) for i, o in enumerate(body.src))
    return outs[0] if state["single"] else outs

  return call
