"""What a fuzz case is and how it is built: the values a case grows from, whose shapes, magnitudes and exactness
are tracked so that every node drawn is valid and the tolerance each output deserves is known; the case and its
ONNX model; the Builder that adds leaves and nodes. aot/tools/fuzz_graphs.py draws the ops, aot/tools/fuzz.py runs the
cases.

A value is exact when it is a multiple of 2**-grain far enough below 2**mantissa that every sum and product of such
values is representable: any correct evaluation order, FMA included, then gives the same bits, and the fuzzer may
compare it bit for bit, round it, cast it to an integer or compare it. Rounded values keep an error scale: a function
of onnxruntime's intermediate values saying what magnitude their rounding errors grow with."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper

OPSET = 18
IR_VERSION = 8
# elements per tensor, and rank: small enough that a case compiles and runs in milliseconds
MAX_NUMEL = 512
# ... except in a share of big cases, whose matmuls and convs are big enough for the runtime's microkernel
# (codegen/lower/contract.py: MIN_WORK multiply-adds, MIN_K long)
BIG_NUMEL, BIG_SHARE = 8192, 0.2
# slices that come out empty, and cases whose every operand is a constant (the whole graph folds at compile time)
EMPTY_SHARE, CONSTANT_SHARE = 0.04, 0.06
MAX_RANK = 5
# graph inputs per case (further operands are initializers, so constant folding is fuzzed too)
MAX_INPUTS = 3
NODES = (3, 10)
# a bound on |values| beyond which an op is not drawn (keeps exp, products and float16 finite; integers from wrapping)
MAG_MAX = 1e6
INT_MAG_MAX = {"int32": 2**30, "int64": 2**62}
# int64 leaves past int32's range, now and then (an index or accumulator of 32 bits would wrap)
WIDE_INT64_SHARE = 0.3
ELEM = {
  "float32": onnx.TensorProto.FLOAT,
  "float16": onnx.TensorProto.FLOAT16,
  "int32": onnx.TensorProto.INT32,
  "int64": onnx.TensorProto.INT64,
  "bool": onnx.TensorProto.BOOL,
}
MANTISSA = {"float32": 24, "float16": 11}
INTS = ("int32", "int64")

# constructs the generator leaves out because of a known compiler bug: (what, why). None at present: the two it found
# (a folded 0-d constant shaped (1,), ceil_mode pools rejected by the shape cross-check) were fixed, and are tests
KNOWN_BUGS: list[tuple[str, str]] = []
# constructs it leaves out because onnxruntime, the reference, cannot run them (not compiler bugs)
REFERENCE_LIMITS = [
  ("dilated SAME_UPPER/SAME_LOWER convs and pools", "onnxruntime rejects the convs and sizes the pools wrongly"),
  ("SAME windows with a stride longer than the window", "onnxruntime asks for negative padding and fails"),
  ("pool padding as large as the window", "onnxruntime rejects it"),
  ("max, min and mean over an empty axis", "not a number (-inf, +inf, NaN by convention)"),
]

Err = Callable[[dict], float]


@dataclass
class Value:
  name: str
  shape: tuple[int, ...]
  dtype: str
  # a bound on |x| over the elements
  mag: float
  # exact values are multiples of 2**-grain below 2**mantissa of that grain: any correct evaluation order gives the
  # same bits (FMA and reassociation included). None: rounded
  grain: int | None
  # how big the absolute rounding error may be, over RTOL: evaluated on onnxruntime's values of the graph
  err: Err
  lowp: bool = False
  leaf: bool = False

  @property
  def rank(self) -> int:
    return len(self.shape)

  @property
  def numel(self) -> int:
    return math.prod(self.shape)

  @property
  def is_float(self) -> bool:
    return self.dtype in ("float32", "float16")


def maxabs(x: np.ndarray) -> float:
  x = np.asarray(x)
  if x.size == 0 or x.dtype == bool:
    return 0.0
  f = np.abs(x.astype(np.float64))
  f = f[np.isfinite(f)]
  return float(f.max()) if f.size else 0.0


def exact_grain(dtype: str, mag: float, *grains: int | None) -> int | None:
  """The grain of a result computed from exact operands, or None when it may round."""
  if dtype in INTS or dtype == "bool":
    return 0
  if any(g is None for g in grains) or dtype not in MANTISSA:
    return None
  g = max(grains, default=0)
  return g if mag * 2.0**g < 2.0 ** (MANTISSA[dtype] - 1) else None


def broadcast(*shapes: tuple[int, ...]) -> tuple[int, ...]:
  return tuple(np.broadcast_shapes(*shapes))


@dataclass
class Case:
  seed: int
  index: int
  nodes: list = field(default_factory=list)
  inputs: list = field(default_factory=list)
  inits: list = field(default_factory=list)
  feeds: dict = field(default_factory=dict)
  outputs: list[Value] = field(default_factory=list)
  values: list[Value] = field(default_factory=list)
  ops: list[str] = field(default_factory=list)
  # are the graph's outputs declared with their shapes (else ONNX's shape inference has the last word)?
  shaped: bool = True

  def model(self) -> onnx.ModelProto:
    return merged([self])

  def describe(self) -> str:
    ins = ", ".join(f"{i.name}: {self.feeds[i.name].dtype}{list(self.feeds[i.name].shape)}" for i in self.inputs)
    return f"ops: {' '.join(self.ops)}\ninputs: {ins or '(none: every operand is a constant)'}"


def merged(cases: list[Case], extra_outputs: bool = False) -> onnx.ModelProto:
  """One model holding every case; with extra_outputs, every node output is a graph output (for the error scales)."""
  outs = [
    helper.make_tensor_value_info(v.name, ELEM[v.dtype], list(v.shape) if c.shaped else None)
    for c in cases
    for v in c.outputs
  ]
  if extra_outputs:
    named = {v.name for c in cases for v in c.outputs}
    outs += [
      helper.make_tensor_value_info(v.name, ELEM[v.dtype], list(v.shape))
      for c in cases
      for v in c.values
      if not v.leaf and v.name not in named
    ]
  name = f"fuzz_{cases[0].seed}_{cases[0].index}" + (f"_{len(cases)}" if len(cases) > 1 else "")
  g = helper.make_graph(
    [n for c in cases for n in c.nodes],
    name,
    [i for c in cases for i in c.inputs],
    outs,
    [t for c in cases for t in c.inits],
  )
  return helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)


# *** the generator ***


class Builder:
  """Grows one case: a pool of values and the nodes that made them."""

  def __init__(self, seed: int, index: int):
    self.rng = np.random.default_rng([seed, index])
    self.case = Case(seed, index)
    self.prefix = f"c{index}_"
    self.count = 0
    self.big = False
    self.max_numel = MAX_NUMEL
    self.room = MAX_INPUTS

  def fresh(self, hint: str) -> str:
    self.count += 1
    return f"{self.prefix}{hint}{self.count}"

  def side_rng(self) -> np.random.Generator:
    """A generator of the case and the nodes it has so far, apart from rng: a choice drawn from it leaves rng's
    draws, and so every case that does not take that choice, as they were."""
    return np.random.default_rng([self.case.seed, self.case.index, len(self.case.nodes), 29])

  def pick(self, seq):
    return seq[int(self.rng.integers(len(seq)))]

  def chance(self, p: float) -> bool:
    return bool(self.rng.random() < p)

  # leaves: graph inputs (while there is room) and initializers
  def leaf(self, shape: tuple[int, ...], dtype: str, kind: str | None = None, const: bool | None = None) -> Value:
    rng, shape = self.rng, tuple(shape)
    kind = kind or (self.pick(["normal", "grid"]) if dtype in MANTISSA else dtype)
    grain: int | None = 0
    if kind == "normal":
      data, grain = np.clip(rng.standard_normal(shape), -4, 4), None
    elif kind == "grid":
      data, grain = rng.integers(-8, 9, shape) / 2, 1
    elif kind == "denominator":
      data, grain = rng.choice([-1, 1], shape) * rng.uniform(0.5, 2, shape), None
    elif kind == "bool":
      data = rng.random(shape) < 0.5
    elif dtype == "int64" and self.chance(WIDE_INT64_SHARE):
      data = rng.integers(-(2**33), 2**33, shape)
    else:
      data = rng.integers(-5, 6, shape)
    data = np.asarray(data).astype(dtype)
    if const is None:
      const = len(self.case.inputs) >= self.room or self.chance(0.35)
    name = self.fresh("w" if const else "x")
    if const:
      self.case.inits.append(numpy_helper.from_array(data, name))
    else:
      self.case.inputs.append(helper.make_tensor_value_info(name, ELEM[dtype], list(shape)))
      self.case.feeds[name] = data
    m = maxabs(data)
    v = Value(
      name,
      shape,
      dtype,
      max(m, 1e-30),
      grain if dtype not in MANTISSA else exact_grain(dtype, m, grain),
      lambda env, m=m: m,
      leaf=True,
    )
    self.case.values.append(v)
    return v

  def ints(self, values, hint: str = "i") -> str:
    """An int64 initializer (shapes, axes, pads, indices)."""
    name = self.fresh(hint)
    self.case.inits.append(numpy_helper.from_array(np.asarray(values, dtype=np.int64), name))
    return name

  def scalar(self, value, dtype: str) -> str:
    name = self.fresh("s")
    self.case.inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
    return name

  def node(self, op: str, inputs: list, outs: list[dict], **attrs) -> list[Value]:
    """Add a node; outs give each output's shape, dtype, mag, grain, err (and lowp)."""
    values = [
      Value(self.fresh("v"), tuple(o["shape"]), o["dtype"], o["mag"], o["grain"], o["err"], o.get("lowp", False))
      for o in outs
    ]
    names = [i.name if isinstance(i, Value) else i for i in inputs]
    self.case.nodes.append(helper.make_node(op, names, [v.name for v in values], name=self.fresh(op.lower()), **attrs))
    self.case.ops.append(op)
    self.case.values += values
    return values

  def partner_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts with shape (possibly growing it)."""
    out = []
    for d in shape[len(shape) - int(self.rng.integers(0, len(shape) + 1)) :]:
      out.append(self.pick([1, 2, 3]) if d == 1 else self.pick([d, d, 1]))
    if len(out) == len(shape) < MAX_RANK - 1 and self.chance(0.15):
      out.insert(0, self.pick([1, 2]))
    return tuple(out)

  def partner(self, x: Value, dtype: str | None = None, kind: str | None = None) -> Value:
    """An operand to combine with x: an existing value that broadcasts with it, or a new leaf."""
    dtype = dtype or x.dtype
    if kind is None and self.chance(0.35):
      fits = [
        v
        for v in self.case.values
        if v.dtype == dtype
        and v is not x
        and broadcastable(v.shape, x.shape)
        and math.prod(broadcast(v.shape, x.shape)) <= self.max_numel
      ]
      if fits:
        return self.pick(fits)
    shape = self.partner_shape(x.shape)
    if math.prod(broadcast(shape, x.shape)) > self.max_numel:
      shape = x.shape
    return self.leaf(shape, dtype, kind)


def broadcastable(a: tuple, b: tuple) -> bool:
  try:
    broadcast(a, b)
  except ValueError:
    return False
  return len(a) <= MAX_RANK


def mag_ok(mag: float, dtype: str = "float32") -> bool:
  return mag <= INT_MAG_MAX.get(dtype, MAG_MAX)


def moved(x: Value, shape) -> dict:
  """The output description of a movement op: x's values, moved."""
  return {"shape": tuple(shape), "dtype": x.dtype, "mag": x.mag, "grain": x.grain, "err": x.err, "lowp": x.lowp}
