"""The IR: one immutable, hash-consed node type (UOp) for every stage of the compiler."""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from enum import Enum, auto
from typing import Any

from aot.core.dtype import DType, dtypes, max_value, min_value
from aot.errors import InvalidValueError


class Ops(Enum):
  # tensor level: leaves
  BUFFER = auto()
  CONST = auto()
  PARAM = auto()
  # tensor level: functions (traced once, inlined before scheduling)
  FUNCTION = auto()
  CALL = auto()
  # tensor level: movement (become index arithmetic in the scheduler)
  RESHAPE = auto()
  PERMUTE = auto()
  EXPAND = auto()
  PAD = auto()
  SHRINK = auto()
  FLIP = auto()
  # tensor level: compute
  CAST = auto()
  BITCAST = auto()
  CONTIGUOUS = auto()
  REDUCE = auto()
  GATHER = auto()
  # elementwise ALU, shared by tensor and kernel level
  NEG = auto()
  EXP = auto()
  LOG = auto()
  SQRT = auto()
  RECIP = auto()
  SIN = auto()
  COS = auto()
  TANH = auto()
  ERF = auto()
  ABS = auto()
  NOT = auto()
  FLOOR = auto()
  CEIL = auto()
  ROUND = auto()
  TRUNC = auto()
  TAN = auto()
  ASIN = auto()
  ACOS = auto()
  ATAN = auto()
  SINH = auto()
  COSH = auto()
  ASINH = auto()
  ACOSH = auto()
  ATANH = auto()
  ADD = auto()
  SUB = auto()
  MUL = auto()
  DIV = auto()
  IDIV = auto()
  MOD = auto()
  MAX = auto()
  MIN = auto()
  POW = auto()
  CMPLT = auto()
  CMPLE = auto()
  CMPEQ = auto()
  CMPNE = auto()
  AND = auto()
  OR = auto()
  XOR = auto()
  SHL = auto()
  SHR = auto()
  WHERE = auto()
  # x * y + z rounded once (a fused multiply-add: C's fma, LLVM's llvm.fma); floats only
  FMA = auto()
  # kernel level (after scheduling)
  SINK = auto()
  INDEX = auto()
  BUF = auto()
  DEFINE_GLOBAL = auto()
  RANGE = auto()
  LOAD = auto()
  STORE = auto()
  ACCUMULATE = auto()
  # the size of a ranged dim in the run that is under way (frontends/extent_dims.py): arg (C name, lowest, highest)
  VAR = auto()


class GroupOp:
  Unary = {
    Ops.NEG,
    Ops.EXP,
    Ops.LOG,
    Ops.SQRT,
    Ops.RECIP,
    Ops.SIN,
    Ops.COS,
    Ops.TANH,
    Ops.ERF,
    Ops.ABS,
    Ops.NOT,
    Ops.FLOOR,
    Ops.CEIL,
    Ops.ROUND,
    Ops.TRUNC,
    Ops.TAN,
    Ops.ASIN,
    Ops.ACOS,
    Ops.ATAN,
    Ops.SINH,
    Ops.COSH,
    Ops.ASINH,
    Ops.ACOSH,
    Ops.ATANH,
  }
  Binary = {
    Ops.ADD,
    Ops.SUB,
    Ops.MUL,
    Ops.DIV,
    Ops.IDIV,
    Ops.MOD,
    Ops.MAX,
    Ops.MIN,
    Ops.POW,
    Ops.CMPLT,
    Ops.CMPLE,
    Ops.CMPEQ,
    Ops.CMPNE,
    Ops.AND,
    Ops.OR,
    Ops.XOR,
    Ops.SHL,
    Ops.SHR,
  }
  Ternary = {Ops.WHERE, Ops.FMA}
  ALU = Unary | Binary | Ternary
  Compare = {Ops.CMPLT, Ops.CMPLE, Ops.CMPEQ, Ops.CMPNE}
  Commutative = {Ops.ADD, Ops.MUL, Ops.MAX, Ops.MIN, Ops.CMPEQ, Ops.CMPNE, Ops.AND, Ops.OR, Ops.XOR}
  Movement = {Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.PAD, Ops.SHRINK, Ops.FLIP}
  # ops whose result is computed (so duplicating them duplicates work)
  Compute = ALU | {Ops.CAST, Ops.BITCAST, Ops.REDUCE, Ops.GATHER}


# the C math library function each unary op is, by its double name (float adds f): the C-family renderers, LLVM's
# intrinsics and libm calls spell their ops from it (ROUND is rint: halves to even, as numpy rounds)
LIBM = {
  Ops.EXP: "exp",
  Ops.LOG: "log",
  Ops.SQRT: "sqrt",
  Ops.SIN: "sin",
  Ops.COS: "cos",
  Ops.TANH: "tanh",
  Ops.ERF: "erf",
  Ops.FLOOR: "floor",
  Ops.CEIL: "ceil",
  Ops.ROUND: "rint",
  Ops.TRUNC: "trunc",
  Ops.TAN: "tan",
  Ops.ASIN: "asin",
  Ops.ACOS: "acos",
  Ops.ATAN: "atan",
  Ops.SINH: "sinh",
  Ops.COSH: "cosh",
  Ops.ASINH: "asinh",
  Ops.ACOSH: "acosh",
  Ops.ATANH: "atanh",
}


class ReduceOp(Enum):
  SUM = auto()
  PROD = auto()
  MAX = auto()
  MIN = auto()

  def identity(self, dt: DType):
    """The value a reduce of nothing gives (an empty axis, an accumulator before its first element)."""
    if self is ReduceOp.SUM:
      return 0
    if self is ReduceOp.PROD:
      return 1
    return min_value(dt) if self is ReduceOp.MAX else max_value(dt)


class ConstData:
  """A constant array (weights) carried in a BUFFER's arg; equal by identity, so two weights never merge by accident."""

  __slots__ = ("array", "__weakref__")

  def __init__(self, array):
    self.array = array

  def __repr__(self) -> str:
    return f"ConstData{self.array.shape}"


@dataclass(frozen=True)
class IndexCheck:
  """A checked GATHER's label (its arg is (axis, IndexCheck), its third source the check tensor): indices from
  outside the model's own arithmetic (an ONNX Gather's, an embedding's token ids) that may be out of range. Lowering
  still clamps them (a bad index never reads out of bounds), and the check tensor, int64 [flat position of the first
  index outside [-size, size) (numel when there is none), the value there], lets the run report it (schedule.py)."""

  indices: str  # what the indices are, for the message: "input 'token_type_ids'", "tensor 'ids2'"
  user: str  # what indexes with them: "Gather node 'emb'"
  shape: tuple  # the indices' shape: the bad value's position is given in it
  size: int  # the size of the axis they index
  input: str | None = None  # the model input the indices are (through reshapes and casts), if they are one

  def message(self, pos: int, value: int) -> str:
    return f"{self.indices}{position(pos, self.shape)} is {value}, {self.outside()}"

  def outside(self) -> str:
    return f"outside [{-self.size}, {self.size - 1}], the axis of size {self.size} that {self.user} indexes"


def position(flat: int, shape: tuple) -> str:
  """A flat position as numpy writes an index: [0, 5] (nothing for a scalar)."""
  idx = []
  for s in reversed(shape):
    idx.append(flat % s if s else 0)
    flat //= s if s else 1
  return f"[{', '.join(map(str, reversed(idx)))}]" if shape else ""


def file_mapping(x):
  """The mmap.mmap an array is a view of (an ONNX model's external weights are memory-mapped), else None."""
  import mmap

  import numpy as np

  while isinstance(x, np.ndarray):
    x = x.base
  return x if isinstance(x, mmap.mmap) else None


def prod(xs) -> int:
  return math.prod(xs)


def _key(arg):
  # -0.0 == 0.0 and 1 == 1.0 == True in Python; keep them apart in the hash-cons table
  if isinstance(arg, float):
    return (float, arg.hex() if not math.isnan(arg) else "nan")
  if isinstance(arg, (bool, int)):
    return (type(arg), arg)
  return arg


# a node keeps its toposort (nodes are immutable) when it has at most this many nodes below it: a kernel's AST and
# its index expressions are walked again by pass after pass (the CRNN over a width range: 37,000 walks, 18% of its
# compile), while a whole traced model, walked a few times, would keep a list per node walked (its size squared)
TOPO_KEPT_MAX = 4096


class UOp:
  """One node: op, dtype, sources, argument. Built through the constructor, which returns the existing node when an
  equal one is alive, so structural equality is identity."""

  __slots__ = ("op", "dtype", "src", "arg", "_shape", "_vrange", "_topo", "__weakref__")
  _cache: weakref.WeakValueDictionary = weakref.WeakValueDictionary()

  def __new__(cls, op: Ops, dtype: DType = dtypes.void, src: tuple = (), arg: Any = None):
    key = (op, dtype, src, _key(arg))
    if (ret := UOp._cache.get(key)) is not None:
      return ret
    self = object.__new__(cls)
    self.op, self.dtype, self.src, self.arg = op, dtype, src, arg
    self._shape = self._vrange = self._topo = None
    UOp._cache[key] = self
    return self

  def replace(self, **kw) -> UOp:
    return UOp(kw.get("op", self.op), kw.get("dtype", self.dtype), kw.get("src", self.src), kw.get("arg", self.arg))

  def __repr__(self) -> str:
    return f"UOp({self.op.name}, {self.dtype.name}, arg={self.arg!r}, nsrc={len(self.src)})"

  def __reduce__(self):
    return (UOp, (self.op, self.dtype, self.src, self.arg))

  # *** shape, derived from the node ***
  @property
  def shape(self) -> tuple[int, ...]:
    if self._shape is None:
      self._shape = _shape_of(self)
    return self._shape

  @property
  def numel(self) -> int:
    return prod(self.shape)

  def toposort(self, stop=None) -> list[UOp]:
    """Nodes reachable from self, sources before users (iterative: graphs are deep). Below a node where stop(node)
    is true nothing is walked."""
    if stop is None and self._topo is not None:
      return list(self._topo)
    # a node stays on the stack while its sources are walked (state 1), then is taken off into the order (2): a
    # flag per node rather than a (node, done) pair pushed twice, the hottest loop of a compile
    order: list[UOp] = []
    state: dict[UOp, int] = {}
    stack = [self]
    while stack:
      u = stack[-1]
      st = state.get(u)
      if st is None:
        state[u] = 1
        if stop is None or not stop(u):
          stack.extend(s for s in reversed(u.src) if s not in state)
        continue
      stack.pop()
      if st == 1:
        state[u] = 2
        order.append(u)
    if stop is None and len(order) <= TOPO_KEPT_MAX:
      self._topo = tuple(order)
    return order

  # *** constructors used by frontends and passes ***
  @staticmethod
  def const(dtype: DType, value) -> UOp:
    value = bool(value) if dtype.kind == "b" else (float(value) if dtype.is_float else int(value))
    return UOp(Ops.CONST, dtype, (), value)

  def const_like(self, value) -> UOp:
    return UOp.const(self.dtype, value)

  def alu(self, op: Ops, *src: UOp, dtype: DType | None = None) -> UOp:
    return UOp(op, dtype or (dtypes.bool if op in GroupOp.Compare else self.dtype), (self, *src))

  def cast(self, dtype: DType) -> UOp:
    return self if self.dtype == dtype else UOp(Ops.CAST, dtype, (self,))

  def reshape(self, shape) -> UOp:
    shape = _sizes(tuple(shape), "reshape")
    return self if shape == self.shape else UOp(Ops.RESHAPE, self.dtype, (self,), shape)

  def permute(self, order) -> UOp:
    order = tuple(order)
    return self if order == tuple(range(len(order))) else UOp(Ops.PERMUTE, self.dtype, (self,), order)

  def expand(self, shape) -> UOp:
    shape = _sizes(tuple(shape), "expand")
    return self if shape == self.shape else UOp(Ops.EXPAND, self.dtype, (self,), shape)

  def pad(self, pads, value=0.0) -> UOp:
    pads = tuple((int(a), int(b)) for a, b in pads)
    _sizes(tuple(s + a + b for s, (a, b) in zip(self.shape, pads)), "pad")
    return self if all(p == (0, 0) for p in pads) else UOp(Ops.PAD, self.dtype, (self,), (pads, value))

  def shrink(self, bounds) -> UOp:
    bounds = tuple((int(a), int(b)) for a, b in bounds)
    _sizes(tuple(b - a for a, b in bounds), "shrink")
    return self if bounds == tuple((0, s) for s in self.shape) else UOp(Ops.SHRINK, self.dtype, (self,), bounds)

  def flip(self, axes) -> UOp:
    axes = tuple(sorted(set(axes)))
    return self if not axes else UOp(Ops.FLIP, self.dtype, (self,), axes)

  def reduce(self, op: ReduceOp, axes) -> UOp:
    axes = tuple(sorted(set(axes)))
    return self if not axes else UOp(Ops.REDUCE, self.dtype, (self,), (op, axes))

  # *** index arithmetic helpers (kernel level) ***
  def __add__(self, o):
    return _binop(Ops.ADD, self, o)

  def __radd__(self, o):
    return _binop(Ops.ADD, o, self)

  def __mul__(self, o):
    return _binop(Ops.MUL, self, o)

  def __rmul__(self, o):
    return _binop(Ops.MUL, o, self)

  def __sub__(self, o):
    return _binop(Ops.ADD, self, -o if isinstance(o, int) else _binop(Ops.MUL, o, -1))

  def __rsub__(self, o):
    return _binop(Ops.ADD, _binop(Ops.MUL, self, -1), o)

  def __floordiv__(self, o):
    return _binop(Ops.IDIV, self, o)

  def __mod__(self, o):
    return _binop(Ops.MOD, self, o)

  def lt(self, o):
    return _binop(Ops.CMPLT, self, o)

  def ge(self, o):
    return UOp(Ops.NOT, dtypes.bool, (self.lt(o),))

  def __and__(self, o):
    return _binop(Ops.AND, self, o)

  # *** named fields of the args read most; the arg itself stays the plain value the hash-cons table keys on ***
  # RANGE: (number, size, kind): loops nest in the order of their numbers; kind is "loop", "reduce", "panel",
  # "panels" (a packed operand's panel count: codegen/lower/columns.py panel_operand) or "rows" (a compact panel's rows,
  # a count computed from a run's size: columns.py compact_panel_operand)
  @property
  def number(self):
    return _arg_of(self, Ops.RANGE)[0]

  @property
  def size(self) -> int:
    return _arg_of(self, Ops.RANGE)[1]

  @property
  def kind(self) -> str:
    return _arg_of(self, Ops.RANGE)[2]

  # a loop whose length is given at run time (frontends/extent_dims.py): its arg's 4th field, an index expression of
  # VARs; its size bounds it (every buffer is laid out for the size)
  @property
  def runtime(self) -> bool:
    return len(_arg_of(self, Ops.RANGE)) > 3

  @property
  def extent(self) -> UOp:
    return _arg_of(self, Ops.RANGE)[3]

  # REDUCE: (op, axes); ACCUMULATE: op (its ranges are its sources after the first)
  @property
  def reduce_op(self) -> ReduceOp:
    return self.arg if self.op is Ops.ACCUMULATE else _arg_of(self, Ops.REDUCE)[0]

  @property
  def axes(self) -> tuple[int, ...]:
    return _arg_of(self, Ops.REDUCE)[1]

  # DEFINE_GLOBAL: the kernel's buffer slot (0 is its output)
  @property
  def slot(self) -> int:
    return _arg_of(self, Ops.DEFINE_GLOBAL)

  @property
  def vmin(self):
    return self.vrange[0]

  @property
  def vmax(self):
    return self.vrange[1]

  @property
  def vrange(self):
    if self._vrange is None:
      from aot.core.symbolic import value_range

      self._vrange = value_range(self)
    return self._vrange


def _arg_of(u: UOp, op: Ops):
  if u.op is not op:
    raise AttributeError(f"{u.op.name} has no field of {op.name}'s arg")
  return u.arg


def _sizes(shape: tuple, what: str) -> tuple:
  """shape, if every dim is a size (a negative one would compile into loops that never run, and a kernel named
  k0_e_2_-3)."""
  if any(s < 0 for s in shape):
    raise InvalidValueError(f"{what} to shape {shape}: a dim is a size, 0 or more")
  return shape


def _binop(op: Ops, a, b) -> UOp:
  if not isinstance(a, UOp):
    a = UOp.const(b.dtype, a)
  if not isinstance(b, UOp):
    b = UOp.const(a.dtype, b)
  from aot.core.symbolic import simplify

  return simplify(UOp(op, dtypes.bool if op in GroupOp.Compare else a.dtype, (a, b)))


def _shape_of(u: UOp) -> tuple[int, ...]:
  op, arg = u.op, u.arg
  if op is Ops.BUFFER:
    return arg.shape
  if op is Ops.PARAM:
    return arg[1]
  if op is Ops.CALL:
    return u.src[0].src[arg].shape
  if op in (Ops.RESHAPE, Ops.EXPAND):
    return arg
  if op is Ops.PERMUTE:
    return tuple(u.src[0].shape[i] for i in arg)
  if op is Ops.PAD:
    return tuple(s + a + b for s, (a, b) in zip(u.src[0].shape, arg[0]))
  if op is Ops.SHRINK:
    return tuple(b - a for a, b in arg)
  if op is Ops.REDUCE:
    return tuple(1 if i in u.axes else s for i, s in enumerate(u.src[0].shape))
  if op is Ops.GATHER:
    return u.src[1].shape
  if op is Ops.WHERE:
    return u.src[1].shape
  if op in GroupOp.ALU or op in (Ops.CAST, Ops.BITCAST, Ops.CONTIGUOUS, Ops.FLIP):
    return u.src[0].shape
  return ()


# *** kernel-level index helpers ***
def ranges_of(u: UOp) -> set[UOp]:
  """The RANGEs u depends on."""
  return {r for r in u.toposort() if r.op is Ops.RANGE}


def flat_of(ranges) -> UOp:
  """The row-major flat index of ranges (outer first)."""
  out, stride = UOp.const(dtypes.index, 0), 1
  for r in reversed(ranges):
    out, stride = r * stride + out, stride * r.size
  return out


class BufferArg:
  """What a tensor-level BUFFER is: a named model input, or constant data (weights). Equal by identity."""

  __slots__ = ("name", "shape", "kind", "data", "__weakref__")

  def __init__(self, name: str, shape: tuple[int, ...], kind: str, data=None):
    # (scratch: a call's result, written by the kernels of a function scheduled once: aot/scheduler/functions.py)
    assert kind in ("input", "const", "scratch")
    self.name, self.shape, self.kind, self.data = name, tuple(shape), kind, data

  def __repr__(self) -> str:
    return f"{self.kind}:{self.name}{list(self.shape)}"
