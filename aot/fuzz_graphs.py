"""The random graphs of the differential fuzzer (aot/fuzz.py runs them): each case is a few ONNX nodes grown from a
pool of values whose shapes, magnitudes and exactness the generator tracks, so that every node it draws is valid and
the tolerance each output deserves is known.

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
# (codegen/contract.py: MIN_WORK multiply-adds, MIN_K long)
BIG_NUMEL, BIG_SHARE = 8192, 0.2
# slices that come out empty, and cases whose every operand is a constant (the whole graph folds at compile time)
EMPTY_SHARE, CONSTANT_SHARE = 0.04, 0.06
MAX_RANK = 5
# graph inputs per case (further operands are initializers, so constant folding is fuzzed too)
MAX_INPUTS = 3
NODES = (3, 10)
# a bound on |values| beyond which an op is not drawn (keeps exp, products and float16 finite; integers from wrapping)
MAG_MAX = 1e6
INT_MAG_MAX = {"int32": 2 ** 30, "int64": 2 ** 62}
# int64 leaves past int32's range, now and then (an index or accumulator of 32 bits would wrap)
WIDE_INT64_SHARE = 0.3
ELEM = {"float32": onnx.TensorProto.FLOAT, "float16": onnx.TensorProto.FLOAT16, "int32": onnx.TensorProto.INT32,
        "int64": onnx.TensorProto.INT64, "bool": onnx.TensorProto.BOOL}
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
  def rank(self) -> int: return len(self.shape)
  @property
  def numel(self) -> int: return math.prod(self.shape)
  @property
  def is_float(self) -> bool: return self.dtype in ("float32", "float16")

def maxabs(x: np.ndarray) -> float:
  x = np.asarray(x)
  if x.size == 0 or x.dtype == bool: return 0.0
  f = np.abs(x.astype(np.float64))
  f = f[np.isfinite(f)]
  return float(f.max()) if f.size else 0.0

def exact_grain(dtype: str, mag: float, *grains: int | None) -> int | None:
  """The grain of a result computed from exact operands, or None when it may round."""
  if dtype in INTS or dtype == "bool": return 0
  if any(g is None for g in grains) or dtype not in MANTISSA: return None
  g = max(grains, default=0)
  return g if mag * 2.0 ** g < 2.0 ** (MANTISSA[dtype] - 1) else None

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
  outs = [helper.make_tensor_value_info(v.name, ELEM[v.dtype], list(v.shape) if c.shaped else None)
          for c in cases for v in c.outputs]
  if extra_outputs:
    named = {v.name for c in cases for v in c.outputs}
    outs += [helper.make_tensor_value_info(v.name, ELEM[v.dtype], list(v.shape))
             for c in cases for v in c.values if not v.leaf and v.name not in named]
  name = f"fuzz_{cases[0].seed}_{cases[0].index}" + (f"_{len(cases)}" if len(cases) > 1 else "")
  g = helper.make_graph([n for c in cases for n in c.nodes], name, [i for c in cases for i in c.inputs], outs,
                        [t for c in cases for t in c.inits])
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
    elif kind == "grid": data, grain = rng.integers(-8, 9, shape) / 2, 1
    elif kind == "denominator": data, grain = rng.choice([-1, 1], shape) * rng.uniform(0.5, 2, shape), None
    elif kind == "bool": data = rng.random(shape) < 0.5
    elif dtype == "int64" and self.chance(WIDE_INT64_SHARE): data = rng.integers(-2 ** 33, 2 ** 33, shape)
    else: data = rng.integers(-5, 6, shape)
    data = np.asarray(data).astype(dtype)
    if const is None: const = len(self.case.inputs) >= self.room or self.chance(0.35)
    name = self.fresh("w" if const else "x")
    if const: self.case.inits.append(numpy_helper.from_array(data, name))
    else:
      self.case.inputs.append(helper.make_tensor_value_info(name, ELEM[dtype], list(shape)))
      self.case.feeds[name] = data
    m = maxabs(data)
    v = Value(name, shape, dtype, max(m, 1e-30), grain if dtype not in MANTISSA else exact_grain(dtype, m, grain),
              lambda env, m=m: m, leaf=True)
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
    values = [Value(self.fresh("v"), tuple(o["shape"]), o["dtype"], o["mag"], o["grain"], o["err"],
                    o.get("lowp", False)) for o in outs]
    names = [i.name if isinstance(i, Value) else i for i in inputs]
    self.case.nodes.append(helper.make_node(op, names, [v.name for v in values], name=self.fresh(op.lower()), **attrs))
    self.case.ops.append(op)
    self.case.values += values
    return values

  def partner_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts with shape (possibly growing it)."""
    out = []
    for d in shape[len(shape) - int(self.rng.integers(0, len(shape) + 1)):]:
      out.append(self.pick([1, 2, 3]) if d == 1 else self.pick([d, d, 1]))
    if len(out) == len(shape) < MAX_RANK - 1 and self.chance(0.15): out.insert(0, self.pick([1, 2]))
    return tuple(out)

  def partner(self, x: Value, dtype: str | None = None, kind: str | None = None) -> Value:
    """An operand to combine with x: an existing value that broadcasts with it, or a new leaf."""
    dtype = dtype or x.dtype
    if kind is None and self.chance(0.35):
      fits = [v for v in self.case.values if v.dtype == dtype and v is not x and _broadcasts(v.shape, x.shape)
              and math.prod(broadcast(v.shape, x.shape)) <= self.max_numel]
      if fits: return self.pick(fits)
    shape = self.partner_shape(x.shape)
    if math.prod(broadcast(shape, x.shape)) > self.max_numel: shape = x.shape
    return self.leaf(shape, dtype, kind)

def _broadcasts(a: tuple, b: tuple) -> bool:
  try: broadcast(a, b)
  except ValueError: return False
  return len(a) <= MAX_RANK

def _mag_ok(mag: float, dtype: str = "float32") -> bool: return mag <= INT_MAG_MAX.get(dtype, MAG_MAX)

# *** op generators: each takes the builder and an operand x, adds nodes and returns True, or returns False when x does
# not suit it ***

EXACT_UNARY = ["Neg", "Abs", "Relu", "Identity"]
# smooth unary ops, by how they treat the error scale of their operand: bounded ones with derivative <= ~1.2
BOUNDED_UNARY = {"Tanh": 1.0, "Sigmoid": 1.0, "Sin": 1.0, "Cos": 1.0, "Erf": 1.0}
ROUNDING_UNARY = ["Floor", "Ceil", "Round", "Sign"]

def gen_unary(b: Builder, x: Value) -> bool:
  if x.dtype != "float32": return False
  kinds = EXACT_UNARY + list(BOUNDED_UNARY) + ["Exp", "Softplus", "LeakyRelu", "Clip", "Sqrt1", "Log1", "Reciprocal1"]
  if x.grain is not None: kinds += ROUNDING_UNARY
  op = b.pick(kinds)
  base = {"shape": x.shape, "dtype": "float32", "lowp": x.lowp}
  if op in EXACT_UNARY: b.node(op, [x], [{**base, "mag": x.mag, "grain": x.grain, "err": x.err}])
  elif op in BOUNDED_UNARY:
    b.node(op, [x], [{**base, "mag": 1.0, "grain": None, "err": lambda env, e=x.err: e(env) + 1.0}])
  elif op in ROUNDING_UNARY:
    b.node(op, [x], [{**base, "mag": math.ceil(x.mag), "grain": 0, "err": x.err}])
  elif op == "Exp":
    if x.mag > 8: return False
    (v,) = b.node(op, [x], [{**base, "mag": math.exp(x.mag), "grain": None, "err": x.err}])
    v.err = lambda env, e=x.err, n=v.name: maxabs(env[n]) * max(1.0, e(env))
  elif op == "Softplus":
    b.node(op, [x], [{**base, "mag": x.mag + 1, "grain": None, "err": lambda env, e=x.err: e(env) + 1.0}])
  elif op == "LeakyRelu":
    alpha = b.pick([0.5, 0.1, 0.01])
    grain = exact_grain("float32", x.mag, x.grain + 1) if x.grain is not None and alpha == 0.5 else None
    b.node(op, [x], [{**base, "mag": x.mag, "grain": grain, "err": x.err}], alpha=alpha)
  elif op == "Clip":
    lo, hi = sorted(b.rng.integers(-6, 7, 2) / 2)
    names = [b.scalar(lo, "float32") if b.chance(0.8) else "", b.scalar(hi, "float32") if b.chance(0.8) else ""]
    while names and names[-1] == "": names.pop()
    b.node(op, [x, *names], [{**base, "mag": x.mag, "grain": exact_grain("float32", x.mag, x.grain, 1), "err": x.err}])
  else:
    # sqrt, log and reciprocal of |x| + 1: their derivative is bounded there, so rounding errors do not blow up
    (a,) = b.node("Abs", [x], [{**base, "mag": x.mag, "grain": x.grain, "err": x.err}])
    (a1,) = b.node("Add", [a, b.scalar(1.0, "float32")], [{**base, "mag": x.mag + 1, "grain": None,
                                                            "err": lambda env, e=x.err: e(env) + 1.0}])
    fn, mag = {"Sqrt1": ("Sqrt", math.sqrt(x.mag + 1)), "Log1": ("Log", math.log(x.mag + 1)),
               "Reciprocal1": ("Reciprocal", 1.0)}[op]
    b.node(fn, [a1], [{**base, "mag": mag, "grain": None, "err": lambda env, e=a1.err: e(env)}])
  return True

def gen_binary(b: Builder, x: Value) -> bool:
  if x.dtype not in ("float32", *INTS): return False
  ops = ["Add", "Sub", "Mul", "Max", "Min"] + (["Div", "Div", "Pow"] if x.dtype == "float32" else [])
  op = b.pick(ops)
  if op == "Pow":
    p = b.pick([2.0, 3.0])
    if x.mag ** p > MAG_MAX: return False
    b.node(op, [x, b.scalar(p, "float32")], [{"shape": x.shape, "dtype": "float32", "mag": x.mag ** p, "grain": None,
            "lowp": x.lowp, "err": lambda env, e=x.err, p=p: p * max(e(env), 1.0) ** p}])
    return True
  y = b.partner(x, kind="denominator" if op == "Div" else None)
  if b.chance(0.5): x, y = (y, x) if op != "Div" else (x, y)
  shape = broadcast(x.shape, y.shape)
  if op == "Div":
    mag, grain, err = x.mag * 2, None, (lambda env, e=x.err: 2 * e(env))
  elif op == "Mul":
    mag = x.mag * y.mag
    grain = exact_grain(x.dtype, mag, None if x.grain is None or y.grain is None else x.grain + y.grain)
    err = lambda env, ex=x.err, ey=y.err: 2 * ex(env) * ey(env)
  else:
    mag = x.mag + y.mag if op in ("Add", "Sub") else max(x.mag, y.mag)
    grain, err = exact_grain(x.dtype, mag, x.grain, y.grain), (lambda env, ex=x.err, ey=y.err: ex(env) + ey(env))
  if not _mag_ok(mag, x.dtype): return False
  b.node(op, [x, y], [{"shape": shape, "dtype": x.dtype, "mag": mag, "grain": grain, "err": err,
                       "lowp": x.lowp or y.lowp}])
  return True

def gen_compare(b: Builder, x: Value) -> bool:
  # comparing rounded values could flip on a last-bit difference: only exact ones
  if x.dtype not in ("float32", *INTS) or x.grain is None: return False
  y = b.partner(x, kind="grid" if x.dtype == "float32" else None)
  if y.grain is None: return False
  op = b.pick(["Greater", "Less", "Equal", "GreaterOrEqual", "LessOrEqual"])
  b.node(op, [x, y], [{"shape": broadcast(x.shape, y.shape), "dtype": "bool", "mag": 1, "grain": 0,
                       "err": lambda env: 0.0}])
  return True

def gen_logic(b: Builder, x: Value) -> bool:
  if x.dtype != "bool": return False
  out = {"dtype": "bool", "mag": 1, "grain": 0, "err": lambda env: 0.0}
  if b.chance(0.3):
    b.node("Not", [x], [{**out, "shape": x.shape}])
    return True
  y = b.partner(x)
  b.node(b.pick(["And", "Or", "Xor"]), [x, y], [{**out, "shape": broadcast(x.shape, y.shape)}])
  return True

def gen_where(b: Builder, x: Value) -> bool:
  if x.dtype not in ("float32", *INTS): return False
  cond = b.partner(x, dtype="bool")
  y = b.partner(x)
  if not _broadcasts(cond.shape, y.shape): return False
  if math.prod(broadcast(cond.shape, x.shape, y.shape)) > b.max_numel: return False
  if b.chance(0.5): x, y = y, x
  mag = max(x.mag, y.mag)
  b.node("Where", [cond, x, y], [{"shape": broadcast(cond.shape, x.shape, y.shape), "dtype": x.dtype, "mag": mag,
          "grain": exact_grain(x.dtype, mag, x.grain, y.grain), "lowp": x.lowp or y.lowp,
          "err": lambda env, ex=x.err, ey=y.err: max(ex(env), ey(env))}])
  return True

def _axes_subset(b: Builder, rank: int, lo: int = 1) -> list[int]:
  k = int(b.rng.integers(lo, rank + 1))
  axes = sorted(b.rng.choice(rank, k, replace=False).tolist())
  return [a - rank if b.chance(0.3) else a for a in axes]

def gen_reduce(b: Builder, x: Value) -> bool:
  if x.dtype not in ("float32", *INTS) or x.rank == 0: return False
  op = b.pick(["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin"] if x.dtype == "float32" else
              ["ReduceSum", "ReduceMax", "ReduceMin"])
  axes = None if b.chance(0.2) else _axes_subset(b, x.rank)
  keep = int(b.chance(0.5))
  red = set(range(x.rank)) if axes is None else {a % x.rank for a in axes}
  count = math.prod(x.shape[a] for a in red)
  shape = tuple(1 if i in red else d for i, d in enumerate(x.shape) if keep or i not in red)
  if count == 0 and op != "ReduceSum": return False   # max, min and mean of nothing are not numbers
  if op == "ReduceSum": mag, grain, err = x.mag * count, x.grain, (lambda env, e=x.err, n=count: e(env) * n)
  elif op == "ReduceMean": mag, grain, err = x.mag, None, x.err
  else: mag, grain, err = x.mag, x.grain, x.err
  if not _mag_ok(mag, x.dtype): return False
  inputs = [x] if axes is None else [x, b.ints(axes, "axes")]
  b.node(op, inputs, [{"shape": shape, "dtype": x.dtype, "mag": mag, "grain": exact_grain(x.dtype, mag, grain),
                       "err": err, "lowp": x.lowp}], keepdims=keep)
  return True

def _same(x: Value, shape) -> dict:
  """The output description of a movement op: x's values, moved."""
  return {"shape": tuple(shape), "dtype": x.dtype, "mag": x.mag, "grain": x.grain, "err": x.err, "lowp": x.lowp}

def _factor(b: Builder, n: int, rank: int) -> list[int]:
  dims = [1] * rank
  p = 2
  while n > 1:
    while n % p == 0:
      dims[int(b.rng.integers(rank))] *= p
      n //= p
    p += 1
  return dims

def gen_reshape(b: Builder, x: Value) -> bool:
  rank = int(b.rng.integers(1, MAX_RANK))
  new = _factor(b, x.numel, rank)
  written = list(new)
  for i in range(min(rank, x.rank)):
    if written[i] == x.shape[i] and b.chance(0.25): written[i] = 0   # 0: copy the input's dim
  if b.chance(0.4): written[int(b.rng.integers(rank))] = -1
  b.node("Reshape", [x, b.ints(written, "shape")], [_same(x, new)])
  return True

def gen_transpose(b: Builder, x: Value) -> bool:
  if x.rank < 2: return False
  if b.chance(0.15):
    b.node("Transpose", [x], [_same(x, x.shape[::-1])])
    return True
  perm = b.rng.permutation(x.rank).tolist()
  b.node("Transpose", [x], [_same(x, [x.shape[p] for p in perm])], perm=perm)
  return True

def gen_expand(b: Builder, x: Value) -> bool:
  target = [b.pick([1, 2, 3]) if d == 1 else b.pick([d, d, 1]) for d in x.shape]
  while len(target) < MAX_RANK and b.chance(0.3): target.insert(0, b.pick([1, 2, 3]))
  shape = broadcast(x.shape, tuple(target))
  if math.prod(shape) > b.max_numel: return False
  b.node("Expand", [x, b.ints(target, "shape")], [_same(x, shape)])
  return True

def slice_length(d: int, start: int, end: int, step: int) -> int:
  """Elements ONNX's Slice takes from a dim of size d."""
  start, end = start + d if start < 0 else start, end + d if end < 0 else end
  if step > 0:
    start, end = min(max(start, 0), d), min(max(end, 0), d)
    return max(0, -(-(end - start) // step))
  start, end = min(max(start, 0), d - 1), min(max(end, -1), d - 1)
  return max(0, -(-(start - end) // -step))

def gen_slice(b: Builder, x: Value) -> bool:
  if x.rank == 0: return False
  axes = _axes_subset(b, x.rank)
  starts, ends, steps = [], [], []
  shape = list(x.shape)
  for a in axes:
    d = x.shape[a]
    for _ in range(10):
      if b.chance(EMPTY_SHARE):
        # an empty slice: zero-size dims must work everywhere downstream too
        start, end, step = (d // 2, d // 2, 1)
        break
      step = b.pick([1, 1, 2, 3, -1, -2])
      start = int(b.rng.integers(-d - 1, d + 2))
      end = b.pick([int(b.rng.integers(-d - 2, d + 2)), 2 ** 62 if step > 0 else -2 ** 62])
      if slice_length(d, start, end, step) > 0: break
    else: start, end, step = 0, d, 1
    starts.append(start)
    ends.append(end)
    steps.append(step)
    shape[a] = slice_length(d, start, end, step)
  ins = [x, b.ints(starts, "starts"), b.ints(ends, "ends")]
  if any(s != 1 for s in steps) or b.chance(0.5): ins += [b.ints(axes, "axes"), b.ints(steps, "steps")]
  elif sorted(a % x.rank for a in axes) != list(range(len(axes))) or b.chance(0.5): ins.append(b.ints(axes, "axes"))
  b.node("Slice", ins, [_same(x, shape)])
  return True

def gen_pad(b: Builder, x: Value) -> bool:
  if x.rank == 0: return False
  mode = b.pick(["constant", "constant", "edge", "reflect"])
  axes = list(range(x.rank)) if b.chance(0.6) else _axes_subset(b, x.rank)
  lo, hi = [], []
  for a in axes:
    d = x.shape[a]
    top = 0 if mode == "reflect" and d == 1 else min(2, d - 1) if mode == "reflect" else 2
    lo.append(int(b.rng.integers(-1 if mode == "constant" and d > 2 else 0, top + 1)))
    hi.append(int(b.rng.integers(-1 if mode == "constant" and d + lo[-1] > 1 else 0, top + 1)))
  shape = list(x.shape)
  for a, l, h in zip(axes, lo, hi): shape[a % x.rank] += l + h
  if math.prod(shape) > b.max_numel or min(shape) < 1: return False
  if mode == "edge" and x.numel == 0: return False
  ins: list = [x, b.ints(lo + hi, "pads")]
  mag, grain = x.mag, x.grain
  if mode == "constant" and b.chance(0.7):
    value = float(b.rng.integers(-4, 5) / 2) if x.is_float else int(b.rng.integers(-4, 5))
    ins.append(b.scalar(value, x.dtype))
    mag, grain = max(mag, abs(value)), exact_grain(x.dtype, max(mag, abs(value)), grain, 1 if x.is_float else 0)
  if axes != list(range(x.rank)): ins += [""] * (3 - len(ins)) + [b.ints(axes, "axes")]
  b.node("Pad", ins, [{**_same(x, shape), "mag": mag, "grain": grain}], mode=mode)
  return True

def gen_squeeze(b: Builder, x: Value) -> bool:
  ones = [i for i, d in enumerate(x.shape) if d == 1]
  if ones and b.chance(0.5):
    k = len(ones) if b.chance(0.3) else int(b.rng.integers(1, len(ones) + 1))
    axes = sorted(b.rng.choice(ones, k, replace=False).tolist())
    shape = [d for i, d in enumerate(x.shape) if i not in axes]
    ins = [x] if axes == ones and b.chance(0.5) else [x, b.ints([a - x.rank if b.chance(0.3) else a for a in axes])]
    b.node("Squeeze", ins, [_same(x, shape)])
    return True
  if x.rank >= MAX_RANK: return False
  k = 1 if x.rank == MAX_RANK - 1 else int(b.rng.integers(1, 3))
  out_rank = x.rank + k
  axes = sorted(b.rng.choice(out_rank, k, replace=False).tolist())
  shape, it = [], iter(x.shape)
  for i in range(out_rank): shape.append(1 if i in axes else next(it))
  b.node("Unsqueeze", [x, b.ints([a - out_rank if b.chance(0.3) else a for a in axes])], [_same(x, shape)])
  return True

def gen_flatten(b: Builder, x: Value) -> bool:
  if x.rank == 0: return False
  axis = int(b.rng.integers(-x.rank, x.rank + 1))
  a = axis % x.rank if axis < 0 else axis
  b.node("Flatten", [x], [_same(x, (math.prod(x.shape[:a]), math.prod(x.shape[a:])))], axis=axis)
  return True

def _weight(b: Builder, shape, x: Value, const_p: float = 0.7) -> Value:
  """A contraction's second operand: exact (grid) when x is, mostly a constant."""
  return b.leaf(shape, "float32", "grid" if x.grain is not None and b.chance(0.7) else "normal",
                const=True if b.chance(const_p) else None)

def _contraction(x: Value, w: Value, k: int, shape, lowp: bool = False) -> dict:
  mag = x.mag * w.mag * k
  grain = None if x.grain is None or w.grain is None else x.grain + w.grain
  return {"shape": tuple(shape), "dtype": "float32", "mag": mag, "grain": exact_grain("float32", mag, grain),
          "lowp": lowp or x.lowp, "err": lambda env, ex=x.err, ew=w.err: ex(env) * ew(env) * k}

def gen_matmul(b: Builder, x: Value) -> bool:
  if x.dtype != "float32" or x.rank == 0 or x.rank > 4: return False
  n = b.pick([32, 33, 64] if b.big else [1, 2, 3, 5, 8])
  if x.rank >= 2 and b.chance(0.25):
    # x on the right: (m, K) @ x with K = x.shape[-2]
    k, m = x.shape[-2], b.pick([32, 48] if b.big else [1, 2, 4])
    w = _weight(b, (m, k), x)
    shape = x.shape[:-2] + (m, x.shape[-1])
    if math.prod(shape) > b.max_numel: return False
    out = _contraction(x, w, k, shape)
    if not _mag_ok(out["mag"]): return False
    b.node("MatMul", [w, x], [out])
    return True
  k = x.shape[-1]
  form = "2d" if b.big else b.pick(["2d", "2d", "batched", "vector"])
  if form == "vector": wshape, shape = (k,), x.shape[:-1]
  elif form == "batched" and x.rank >= 2:
    batch = tuple(b.pick([d, 1]) for d in x.shape[:-2])
    wshape, shape = batch + (k, n), x.shape[:-1] + (n,)
  elif x.rank == 1 and b.chance(0.3): wshape, shape = (2, k, n), (2, n)
  else: wshape, shape = (k, n), x.shape[:-1] + (n,)
  if math.prod(shape) > b.max_numel: return False
  w = _weight(b, wshape, x)
  out = _contraction(x, w, k, shape)
  if not _mag_ok(out["mag"]): return False
  b.node("MatMul", [x, w], [out])
  return True

def gen_gemm(b: Builder, x: Value) -> bool:
  if x.dtype != "float32" or x.rank != 2: return False
  trans_a, trans_b = int(b.chance(0.3)), int(b.chance(0.4))
  m, k = x.shape[::-1] if trans_a else x.shape
  n = b.pick([8, 16, 33] if b.big else [1, 3, 4, 7])
  w = _weight(b, (n, k) if trans_b else (k, n), x)
  alpha, beta = b.pick([1.0, 1.0, 0.5, 2.0, -1.0]), b.pick([1.0, 1.0, 0.5, -2.0])
  out = _contraction(x, w, k, (m, n))
  out["mag"] *= abs(alpha)
  out["err"] = lambda env, e=out["err"], a=abs(alpha): a * e(env)
  shift = {0.5: 1}.get(alpha, 0)
  ins = [x, w]
  if b.chance(0.7):
    c = b.leaf(b.pick([(), (n,), (1, n), (m, 1), (m, n)]), "float32", const=True if b.chance(0.7) else None)
    ins.append(c)
    out["mag"] += abs(beta) * c.mag
    cg = None if c.grain is None else c.grain + {0.5: 1}.get(beta, 0)
    out["err"] = lambda env, e=out["err"], ec=c.err, be=abs(beta): e(env) + be * ec(env)
  else: cg, beta = 0, 1.0
  g = out["grain"]
  out["grain"] = exact_grain("float32", out["mag"], None if g is None else g + shift, cg)
  if not _mag_ok(out["mag"]): return False
  b.node("Gemm", ins, [out], alpha=alpha, beta=beta, transA=trans_a, transB=trans_b)
  return True

def _image(b: Builder, x: Value) -> bool:
  """Does x suit a conv or a pool: (N, C, L) or (N, C, H, W), small?"""
  return x.dtype == "float32" and x.rank in (3, 4) and x.shape[0] <= 2 and x.shape[1] <= (16 if b.big else 8) \
    and min(x.shape[2:]) >= 1 and max(x.shape[2:]) <= (16 if b.big else 12)

def _window(b: Builder, spatial, pool: bool, dilate: bool = True):
  """Kernel, strides, dilations, pads and auto_pad for a window over these spatial dims, or None."""
  nd = len(spatial)
  kernel = [int(b.rng.integers(1, min(3, d) + 1)) for d in spatial]
  strides = [b.pick([1, 1, 2]) for _ in spatial]
  dil = [b.pick([1, 1, 2]) if dilate else 1 for _ in spatial]
  auto = b.pick(["NOTSET"] * 6 + ["SAME_UPPER", "SAME_LOWER", "VALID"])
  # onnxruntime rejects dilated SAME convs, and sizes dilated SAME pools wrongly: the reference cannot say
  if auto.startswith("SAME"): dil = [1] * nd
  eff = [(k - 1) * di + 1 for k, di in zip(kernel, dil)]
  # ... and SAME windows whose stride is longer than the window (padding them would take a negative amount)
  if auto.startswith("SAME"): strides = [min(s, e) for s, e in zip(strides, eff)]
  # a pool's padding stays under its window (onnxruntime rejects more)
  limits = (kernel if pool else eff) * 2
  pads = [0] * (2 * nd) if auto != "NOTSET" else [int(b.rng.integers(0, lim)) for lim in limits]
  return kernel, strides, dil, pads, auto, eff

def _out_size(d: int, k_eff: int, s: int, lo: int, hi: int, auto: str, ceil: bool = False) -> int:
  if auto in ("SAME_UPPER", "SAME_LOWER"): return -(-d // s)
  if auto == "VALID": return (d - k_eff) // s + 1 if d >= k_eff else 0
  span = d + lo + hi - k_eff
  if span < 0: return 0
  out = (-(-span // s) if ceil else span // s) + 1
  # a last window starting in the right padding is dropped
  if ceil and (out - 1) * s >= d + lo: out -= 1
  return out

def _window_attrs(kernel, strides, dil, pads, auto, dilations: bool = True) -> dict:
  attrs: dict = {"kernel_shape": kernel}
  if any(s != 1 for s in strides): attrs["strides"] = strides
  if dilations and any(d != 1 for d in dil): attrs["dilations"] = dil
  if auto != "NOTSET": attrs["auto_pad"] = auto
  elif any(pads): attrs["pads"] = pads
  return attrs

def gen_conv(b: Builder, x: Value) -> bool:
  if not _image(b, x): return False
  n, c, *spatial = x.shape
  groups = b.pick([g for g in range(1, c + 1) if c % g == 0] + ([1, 1, 1] if b.big else []))
  m = groups * b.pick([1, 1, 2]) * (b.pick([4, 8]) if b.big and groups < 4 else 1)
  kernel, strides, dil, pads, auto, eff = _window(b, spatial, pool=False)
  nd = len(spatial)
  out = [_out_size(d, e, s, pads[i], pads[i + nd], auto) for i, (d, e, s) in enumerate(zip(spatial, eff, strides))]
  if min(out) < 1 or n * m * math.prod(out) > b.max_numel: return False
  w = _weight(b, (m, c // groups, *kernel), x, const_p=0.85)
  desc = _contraction(x, w, (c // groups) * math.prod(kernel), (n, m, *out))
  ins = [x, w]
  if b.chance(0.6):
    bias = b.leaf((m,), "float32", const=True if b.chance(0.8) else None)
    ins.append(bias)
    desc["mag"] += bias.mag
    desc["grain"] = exact_grain("float32", desc["mag"], desc["grain"], bias.grain)
    desc["err"] = lambda env, e=desc["err"], eb=bias.err: e(env) + eb(env)
  if not _mag_ok(desc["mag"]): return False
  attrs = _window_attrs(kernel, strides, dil, pads, auto)
  if b.chance(0.3): del attrs["kernel_shape"]   # taken from the weight's shape
  b.node("Conv", ins, [desc], group=groups, **attrs)
  return True

def gen_pool(b: Builder, x: Value) -> bool:
  if not _image(b, x): return False
  n, c, *spatial = x.shape
  op = b.pick(["MaxPool", "MaxPool", "AveragePool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"])
  if op.startswith("Global"):
    exact = op == "GlobalMaxPool"
    b.node(op, [x], [{**_same(x, (n, c) + (1,) * len(spatial)), "grain": x.grain if exact else None}])
    return True
  kernel, strides, dil, pads, auto, eff = _window(b, spatial, pool=True, dilate=op == "MaxPool")
  ceil = b.chance(0.3) and auto == "NOTSET"
  nd = len(spatial)
  out = [_out_size(d, e, s, pads[i], pads[i + nd], auto, ceil)
         for i, (d, e, s) in enumerate(zip(spatial, eff, strides))]
  if min(out) < 1: return False
  attrs = _window_attrs(kernel, strides, dil, pads, auto, dilations=op == "MaxPool")
  if ceil: attrs["ceil_mode"] = 1
  if op == "AveragePool" and b.chance(0.5): attrs["count_include_pad"] = 1
  b.node(op, [x], [{**_same(x, (n, c, *out)), "grain": x.grain if op == "MaxPool" else None}], **attrs)
  return True

def gen_conv_transpose(b: Builder, x: Value) -> bool:
  if not _image(b, x): return False
  n, c, *spatial = x.shape
  groups = b.pick([g for g in range(1, c + 1) if c % g == 0])
  per_group = b.pick([1, 2, 3])
  kernel = [int(b.rng.integers(1, 4)) for _ in spatial]
  strides = [b.pick([1, 2, 2, 3]) for _ in spatial]
  dil = [b.pick([1, 1, 2]) for _ in spatial]
  eff = [(k - 1) * d + 1 for k, d in zip(kernel, dil)]
  pads = [int(b.rng.integers(0, e)) for e in eff] + [int(b.rng.integers(0, e)) for e in eff]
  # output_padding below the stride (the spec allows below the dilation too; onnxruntime does not)
  extra = [int(b.rng.integers(0, s)) if b.chance(0.3) else 0 for s in strides]
  nd = len(spatial)
  out = [s * (i - 1) + o + e - pads[j] - pads[j + nd]
         for j, (i, s, o, e) in enumerate(zip(spatial, strides, extra, eff))]
  m = groups * per_group
  if min(out) < 1 or n * m * math.prod(out) > b.max_numel: return False
  w = _weight(b, (c, per_group, *kernel), x, const_p=0.85)
  # each output sums at most C/g * prod(kernel) products
  desc = _contraction(x, w, (c // groups) * math.prod(kernel), (n, m, *out))
  if not _mag_ok(desc["mag"]): return False
  attrs: dict = {"group": groups, "strides": strides, "pads": pads}
  if any(d != 1 for d in dil): attrs["dilations"] = dil
  if any(extra): attrs["output_padding"] = extra
  if b.chance(0.5): attrs["kernel_shape"] = kernel
  b.node("ConvTranspose", [x, w], [desc], **attrs)
  return True

def gen_resize(b: Builder, x: Value) -> bool:
  """Nearest or linear upsampling by whole factors over the spatial dims (as detection and segmentation heads do)."""
  if not _image(b, x): return False
  n, c, *spatial = x.shape
  factors = [b.pick([1, 2, 2, 3]) for _ in spatial]
  shape = (n, c, *(d * f for d, f in zip(spatial, factors)))
  if math.prod(shape) > b.max_numel: return False
  mode = b.pick(["nearest", "nearest", "linear"])
  attrs: dict = {"mode": mode}
  if mode == "nearest":
    attrs.update(b.pick([{"coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"},
                         {"coordinate_transformation_mode": "half_pixel", "nearest_mode": "round_prefer_floor"}]))
  else: attrs["coordinate_transformation_mode"] = b.pick(["half_pixel", "asymmetric", "align_corners"])
  if b.chance(0.5): ins = [x, "", b.scalar([1.0, 1.0, *map(float, factors)], "float32")]
  else: ins = [x, "", "", b.ints(list(shape), "sizes")]
  b.node("Resize", ins, [{**_same(x, shape), "grain": x.grain if mode == "nearest" else None}], **attrs)
  return True

def gen_concat(b: Builder, x: Value) -> bool:
  if x.rank == 0: return False
  axis = int(b.rng.integers(-x.rank, x.rank))
  a = axis % x.rank
  parts = [x]
  for _ in range(int(b.rng.integers(1, 3))):
    fits = [v for v in b.case.values if v.dtype == x.dtype and v.rank == x.rank
            and all(v.shape[i] == x.shape[i] for i in range(x.rank) if i != a)]
    if fits and b.chance(0.5): parts.append(b.pick(fits))
    else: parts.append(b.leaf(x.shape[:a] + (b.pick([1, 2, 3]),) + x.shape[a + 1:], x.dtype))
  shape = x.shape[:a] + (sum(p.shape[a] for p in parts),) + x.shape[a + 1:]
  if math.prod(shape) > b.max_numel: return False
  b.rng.shuffle(parts)
  mag = max(p.mag for p in parts)
  b.node("Concat", parts, [{"shape": shape, "dtype": x.dtype, "mag": mag, "lowp": any(p.lowp for p in parts),
          "grain": exact_grain(x.dtype, mag, *(p.grain for p in parts)),
          "err": lambda env, es=[p.err for p in parts]: max(e(env) for e in es)}], axis=axis)
  return True

def gen_split(b: Builder, x: Value) -> bool:
  axes = [i for i, d in enumerate(x.shape) if d >= 2]
  if not axes: return False
  a = b.pick(axes)
  d = x.shape[a]
  k = int(b.rng.integers(2, min(3, d) + 1))
  chunk = -(-d // k)
  attrs = {"axis": a - x.rank if b.chance(0.3) else a}
  if b.chance(0.4) and d - chunk * (k - 1) > 0:
    sizes, ins = [chunk] * (k - 1) + [d - chunk * (k - 1)], [x]
    attrs["num_outputs"] = k
  else:
    cuts = sorted(b.rng.choice(np.arange(1, d), k - 1, replace=False).tolist())
    sizes = [e - s for s, e in zip([0] + cuts, cuts + [d])]
    ins = [x, b.ints(sizes, "split")]
  b.node("Split", ins, [_same(x, x.shape[:a] + (s,) + x.shape[a + 1:]) for s in sizes], **attrs)
  return True

def gen_gather(b: Builder, x: Value) -> bool:
  if x.rank == 0: return False
  a = int(b.rng.integers(x.rank))
  d = x.shape[a]
  ishape = b.pick([(), (1,), (2,), (3,), (2, 2)])
  idx = b.rng.integers(-d, d, ishape)
  shape = x.shape[:a] + tuple(ishape) + x.shape[a + 1:]
  if math.prod(shape) > b.max_numel or len(shape) > MAX_RANK: return False
  if b.chance(0.3) and len(b.case.inputs) < b.room:
    # indices given at run time
    name = b.fresh("idx")
    dt = b.pick(["int64", "int32"])
    b.case.inputs.append(helper.make_tensor_value_info(name, ELEM[dt], list(ishape)))
    b.case.feeds[name] = idx.astype(dt)
  else: name = b.ints(idx, "idx")
  b.node("Gather", [x, name], [_same(x, shape)], axis=a - x.rank if b.chance(0.3) else a)
  return True

def gen_cast(b: Builder, x: Value) -> bool:
  out = {**_same(x, x.shape)}
  if x.dtype == "float32":
    to = b.pick(["float16", "float16"] + (["int32", "int64", "bool"] if x.grain is not None else []))
    if to == "float16":
      if x.mag > 6e4: return False
      grain = None if x.grain is None else exact_grain("float16", x.mag, x.grain)
      out.update(grain=grain, lowp=x.lowp or grain is None)
    elif to == "bool": out.update(mag=1, grain=0)
    else: out.update(mag=math.ceil(x.mag), grain=0)
  elif x.dtype == "float16": to = "float32"
  elif x.dtype in INTS:
    to = b.pick(["float32", "int32" if x.dtype == "int64" else "int64", "bool"])
    if to == "float32": out.update(grain=exact_grain(to, x.mag, 0))
    else: out.update(grain=0, mag=1 if to == "bool" else min(x.mag, 2.0 ** 31))
  else: to = b.pick(["float32", "int32", "int64"])
  out["dtype"] = to
  b.node("Cast", [x], [out], to=ELEM[to])
  return True

# (generator, weight): elementwise ops most, since they are what fuses around everything else. The window ops only
# take (N, C, H, W)-like values, so their weights count only there
GENERATORS: list[tuple[Callable[[Builder, Value], bool], float]] = [
  (gen_unary, 4), (gen_binary, 4), (gen_compare, 2), (gen_logic, 1), (gen_where, 1), (gen_reduce, 2),
  (gen_reshape, 1), (gen_transpose, 1), (gen_expand, 1), (gen_slice, 1.5), (gen_pad, 1), (gen_squeeze, 1),
  (gen_flatten, 0.5), (gen_matmul, 1.5), (gen_gemm, 1), (gen_conv, 3), (gen_pool, 2.5), (gen_conv_transpose, 2),
  (gen_resize, 1.5), (gen_concat, 1), (gen_split, 0.7), (gen_gather, 1), (gen_cast, 1),
]

# the generators that take a value with a zero-size dim
EMPTY_OK = {gen_unary, gen_binary, gen_compare, gen_logic, gen_where, gen_reduce, gen_transpose, gen_expand, gen_slice,
            gen_squeeze, gen_concat, gen_cast}

def generate(seed: int, index: int) -> Case:
  """Case `index` of `seed`: a small random graph with its inputs, and which of its values are outputs."""
  b = Builder(seed, index)
  rng = b.rng
  if b.chance(BIG_SHARE):
    b.big, b.max_numel = True, BIG_NUMEL
    # M x K x N >= 32**3 = MIN_WORK: odd sizes leave partial tiles
    shape = b.pick([(b.pick([32, 48, 64]), b.pick([32, 40, 64])),
                    (1, b.pick([4, 8, 16])) + tuple(int(rng.integers(8, 17)) for _ in range(2))])
  elif b.chance(0.35):
    n, c = b.pick([1, 1, 2]), b.pick([1, 2, 3, 4, 6])
    shape = (n, c) + tuple(int(rng.integers(3, 9)) for _ in range(b.pick([1, 2, 2])))
  else: shape = tuple(b.pick([1, 2, 3, 4, 5, 6]) for _ in range(int(rng.integers(0, 4))))
  b.room = MAX_INPUTS if not b.chance(CONSTANT_SHARE) else 0
  first = b.leaf(shape, b.pick(["float32"] * 8 + ["int32", "int64"]), const=not b.room)
  weights = np.array([w for _, w in GENERATORS])
  target = int(rng.integers(NODES[0], NODES[1] + 1))
  last = first
  if b.big:
    # a big case starts with its contraction, so that it does reach the microkernel
    made = len(b.case.values)
    big_ops = [gen_conv, gen_conv, gen_conv_transpose] if first.rank == 4 else [gen_matmul, gen_matmul, gen_gemm]
    if b.pick(big_ops)(b, first): last = b.case.values[-1] if len(b.case.values) > made else first
  for _ in range(8 * target):
    if len(b.case.nodes) >= target: break
    pool = [v for v in b.case.values if not v.leaf] or [first]
    x = last if b.chance(0.6) else b.pick(pool + [first])
    gen = GENERATORS[int(rng.choice(len(GENERATORS), p=weights / weights.sum()))][0]
    if x.numel == 0 and gen not in EMPTY_OK: continue
    before = len(b.case.values)
    if gen(b, x) and len(b.case.values) > before:
      made = [v for v in b.case.values[before:] if not v.leaf]
      last = made[int(rng.integers(len(made)))] if made else last
  computed = [v for v in b.case.values if not v.leaf]
  if not computed:   # nothing suited the first value: one elementwise op always does
    gen_cast(b, first)
    computed = [v for v in b.case.values if not v.leaf]
    last = computed[-1]
  outs = [last] + [v for v in computed if v is not last and b.chance(0.15)][:2]
  b.case.outputs = outs
  b.case.shaped = b.chance(0.5)
  return b.case
