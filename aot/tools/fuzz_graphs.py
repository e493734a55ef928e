"""The random graphs of the differential fuzzer (aot/tools/fuzz.py runs them): each case is a few ONNX nodes grown from
a pool of values whose shapes, magnitudes and exactness the generator tracks, so that every node it draws is valid and
the tolerance each output deserves is known.

The elementwise, reduction, movement and joining ops are here; the contraction and window ops in
aot/tools/fuzz_windows.py; values, cases and the builder in aot/tools/fuzz_cases.py."""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
from onnx import helper

from aot.tools.fuzz_cases import (
  BIG_NUMEL,
  BIG_SHARE,
  CONSTANT_SHARE,
  ELEM,
  EMPTY_SHARE,
  INTS,
  MAG_MAX,
  MAX_INPUTS,
  MAX_RANK,
  NODES,
  Builder,
  Case,
  Value,
  broadcast,
  broadcastable,
  exact_grain,
  mag_ok,
  maxabs,
  moved,
)
from aot.tools.fuzz_windows import gen_conv, gen_conv_transpose, gen_gemm, gen_matmul, gen_pool, gen_resize

# *** op generators: each takes the builder and an operand x, adds nodes and returns True, or returns False when x does
# not suit it ***

EXACT_UNARY = ["Neg", "Abs", "Relu", "Identity"]
# smooth unary ops, by how they treat the error scale of their operand: bounded ones with derivative <= ~1.2
BOUNDED_UNARY = {"Tanh": 1.0, "Sigmoid": 1.0, "Sin": 1.0, "Cos": 1.0, "Erf": 1.0}
ROUNDING_UNARY = ["Floor", "Ceil", "Round", "Sign"]


def gen_unary(b: Builder, x: Value) -> bool:
  if x.dtype != "float32":
    return False
  kinds = EXACT_UNARY + list(BOUNDED_UNARY) + ["Exp", "Softplus", "LeakyRelu", "Clip", "Sqrt1", "Log1", "Reciprocal1"]
  if x.grain is not None:
    kinds += ROUNDING_UNARY
  op = b.pick(kinds)
  base = {"shape": x.shape, "dtype": "float32", "lowp": x.lowp}
  if op in EXACT_UNARY:
    b.node(op, [x], [{**base, "mag": x.mag, "grain": x.grain, "err": x.err}])
  elif op in BOUNDED_UNARY:
    b.node(op, [x], [{**base, "mag": 1.0, "grain": None, "err": lambda env, e=x.err: e(env) + 1.0}])
  elif op in ROUNDING_UNARY:
    b.node(op, [x], [{**base, "mag": math.ceil(x.mag), "grain": 0, "err": x.err}])
  elif op == "Exp":
    if x.mag > 8:
      return False
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
    while names and names[-1] == "":
      names.pop()
    b.node(op, [x, *names], [{**base, "mag": x.mag, "grain": exact_grain("float32", x.mag, x.grain, 1), "err": x.err}])
  else:
    # sqrt, log and reciprocal of |x| + 1: their derivative is bounded there, so rounding errors do not blow up
    (a,) = b.node("Abs", [x], [{**base, "mag": x.mag, "grain": x.grain, "err": x.err}])
    (a1,) = b.node(
      "Add",
      [a, b.scalar(1.0, "float32")],
      [{**base, "mag": x.mag + 1, "grain": None, "err": lambda env, e=x.err: e(env) + 1.0}],
    )
    fn, mag = {
      "Sqrt1": ("Sqrt", math.sqrt(x.mag + 1)),
      "Log1": ("Log", math.log(x.mag + 1)),
      "Reciprocal1": ("Reciprocal", 1.0),
    }[op]
    b.node(fn, [a1], [{**base, "mag": mag, "grain": None, "err": lambda env, e=a1.err: e(env)}])
  return True


def gen_binary(b: Builder, x: Value) -> bool:
  if x.dtype not in ("float32", *INTS):
    return False
  ops = ["Add", "Sub", "Mul", "Max", "Min"] + (["Div", "Div", "Pow"] if x.dtype == "float32" else [])
  op = b.pick(ops)
  if op == "Pow":
    p = b.pick([2.0, 3.0])
    if x.mag**p > MAG_MAX:
      return False
    b.node(
      op,
      [x, b.scalar(p, "float32")],
      [
        {
          "shape": x.shape,
          "dtype": "float32",
          "mag": x.mag**p,
          "grain": None,
          "lowp": x.lowp,
          "err": lambda env, e=x.err, p=p: p * max(e(env), 1.0) ** p,
        }
      ],
    )
    return True
  y = b.partner(x, kind="denominator" if op == "Div" else None)
  if b.chance(0.5):
    x, y = (y, x) if op != "Div" else (x, y)
  side = b.side_rng()
  if x.dtype in INTS and side.random() < INT_DIVISION_SHARE:
    return int_division(b, x, y, side)
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
  if not mag_ok(mag, x.dtype):
    return False
  b.node(
    op, [x, y], [{"shape": shape, "dtype": x.dtype, "mag": mag, "grain": grain, "err": err, "lowp": x.lowp or y.lowp}]
  )
  return True


# integer Div and Mod (fmod 0 and 1) take the place of this share of the integer binary ops: drawn from a generator of
# their own (Builder.side_rng), so that the cases without integer binary ops stay as they were
INT_DIVISION_SHARE = 0.4
INT_DIVISIONS = [("Div", {}), ("Mod", {"fmod": 0}), ("Mod", {"fmod": 1})]


def int_division(b: Builder, x: Value, y: Value, side: np.random.Generator) -> bool:
  """x / y or x mod y on integers of either sign, the divisor's zeros made ones (onnxruntime refuses a zero divisor):
  truncated toward zero, the divisor's sign (fmod 0) or the dividend's (fmod 1)."""
  op, attrs = INT_DIVISIONS[int(side.integers(len(INT_DIVISIONS)))]
  exact = {"dtype": x.dtype, "mag": 1, "grain": 0, "err": lambda env: 0.0}
  (zero,) = b.node("Equal", [y, b.scalar(0, y.dtype)], [{**exact, "shape": y.shape, "dtype": "bool"}])
  (d,) = b.node("Where", [zero, b.scalar(1, y.dtype), y], [{**exact, "shape": y.shape, "mag": max(y.mag, 1)}])
  # |x / d| <= |x|; a remainder is below |d| and, fmod's, |x|
  mag = x.mag if op == "Div" else max(x.mag, d.mag)
  err = lambda env, ex=x.err, ey=y.err: ex(env) + ey(env)
  b.node(
    op, [x, d], [{"shape": broadcast(x.shape, y.shape), "dtype": x.dtype, "mag": mag, "grain": 0, "err": err}], **attrs
  )
  return True


def gen_compare(b: Builder, x: Value) -> bool:
  # comparing rounded values could flip on a last-bit difference: only exact ones
  if x.dtype not in ("float32", *INTS) or x.grain is None:
    return False
  y = b.partner(x, kind="grid" if x.dtype == "float32" else None)
  if y.grain is None:
    return False
  op = b.pick(["Greater", "Less", "Equal", "GreaterOrEqual", "LessOrEqual"])
  b.node(
    op, [x, y], [{"shape": broadcast(x.shape, y.shape), "dtype": "bool", "mag": 1, "grain": 0, "err": lambda env: 0.0}]
  )
  return True


def gen_logic(b: Builder, x: Value) -> bool:
  if x.dtype != "bool":
    return False
  out = {"dtype": "bool", "mag": 1, "grain": 0, "err": lambda env: 0.0}
  if b.chance(0.3):
    b.node("Not", [x], [{**out, "shape": x.shape}])
    return True
  y = b.partner(x)
  b.node(b.pick(["And", "Or", "Xor"]), [x, y], [{**out, "shape": broadcast(x.shape, y.shape)}])
  return True


def gen_where(b: Builder, x: Value) -> bool:
  if x.dtype not in ("float32", *INTS):
    return False
  cond = b.partner(x, dtype="bool")
  y = b.partner(x)
  if not broadcastable(cond.shape, y.shape):
    return False
  if math.prod(broadcast(cond.shape, x.shape, y.shape)) > b.max_numel:
    return False
  if b.chance(0.5):
    x, y = y, x
  mag = max(x.mag, y.mag)
  b.node(
    "Where",
    [cond, x, y],
    [
      {
        "shape": broadcast(cond.shape, x.shape, y.shape),
        "dtype": x.dtype,
        "mag": mag,
        "grain": exact_grain(x.dtype, mag, x.grain, y.grain),
        "lowp": x.lowp or y.lowp,
        "err": lambda env, ex=x.err, ey=y.err: max(ex(env), ey(env)),
      }
    ],
  )
  return True


def _axes_subset(b: Builder, rank: int, lo: int = 1) -> list[int]:
  k = int(b.rng.integers(lo, rank + 1))
  axes = sorted(b.rng.choice(rank, k, replace=False).tolist())
  return [a - rank if b.chance(0.3) else a for a in axes]


def gen_reduce(b: Builder, x: Value) -> bool:
  if x.dtype not in ("float32", *INTS) or x.rank == 0:
    return False
  op = b.pick(
    ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin"]
    if x.dtype == "float32"
    else ["ReduceSum", "ReduceMax", "ReduceMin"]
  )
  axes = None if b.chance(0.2) else _axes_subset(b, x.rank)
  keep = int(b.chance(0.5))
  red = set(range(x.rank)) if axes is None else {a % x.rank for a in axes}
  count = math.prod(x.shape[a] for a in red)
  shape = tuple(1 if i in red else d for i, d in enumerate(x.shape) if keep or i not in red)
  if count == 0 and op != "ReduceSum":
    return False  # max, min and mean of nothing are not numbers
  if op == "ReduceSum":
    mag, grain, err = x.mag * count, x.grain, (lambda env, e=x.err, n=count: e(env) * n)
  elif op == "ReduceMean":
    mag, grain, err = x.mag, None, x.err
  else:
    mag, grain, err = x.mag, x.grain, x.err
  if not mag_ok(mag, x.dtype):
    return False
  inputs = [x] if axes is None else [x, b.ints(axes, "axes")]
  b.node(
    op,
    inputs,
    [
      {
        "shape": shape,
        "dtype": x.dtype,
        "mag": mag,
        "grain": exact_grain(x.dtype, mag, grain),
        "err": err,
        "lowp": x.lowp,
      }
    ],
    keepdims=keep,
  )
  return True


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
    if written[i] == x.shape[i] and b.chance(0.25):
      written[i] = 0  # 0: copy the input's dim
  if b.chance(0.4):
    written[int(b.rng.integers(rank))] = -1
  b.node("Reshape", [x, b.ints(written, "shape")], [moved(x, new)])
  return True


def gen_transpose(b: Builder, x: Value) -> bool:
  if x.rank < 2:
    return False
  if b.chance(0.15):
    b.node("Transpose", [x], [moved(x, x.shape[::-1])])
    return True
  perm = b.rng.permutation(x.rank).tolist()
  b.node("Transpose", [x], [moved(x, [x.shape[p] for p in perm])], perm=perm)
  return True


def gen_expand(b: Builder, x: Value) -> bool:
  target = [b.pick([1, 2, 3]) if d == 1 else b.pick([d, d, 1]) for d in x.shape]
  while len(target) < MAX_RANK and b.chance(0.3):
    target.insert(0, b.pick([1, 2, 3]))
  shape = broadcast(x.shape, tuple(target))
  if math.prod(shape) > b.max_numel:
    return False
  b.node("Expand", [x, b.ints(target, "shape")], [moved(x, shape)])
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
  if x.rank == 0:
    return False
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
      end = b.pick([int(b.rng.integers(-d - 2, d + 2)), 2**62 if step > 0 else -(2**62)])
      if slice_length(d, start, end, step) > 0:
        break
    else:
      start, end, step = 0, d, 1
    starts.append(start)
    ends.append(end)
    steps.append(step)
    shape[a] = slice_length(d, start, end, step)
  ins = [x, b.ints(starts, "starts"), b.ints(ends, "ends")]
  if any(s != 1 for s in steps) or b.chance(0.5):
    ins += [b.ints(axes, "axes"), b.ints(steps, "steps")]
  elif sorted(a % x.rank for a in axes) != list(range(len(axes))) or b.chance(0.5):
    ins.append(b.ints(axes, "axes"))
  b.node("Slice", ins, [moved(x, shape)])
  return True


def gen_pad(b: Builder, x: Value) -> bool:
  if x.rank == 0:
    return False
  mode = b.pick(["constant", "constant", "edge", "reflect"])
  axes = list(range(x.rank)) if b.chance(0.6) else _axes_subset(b, x.rank)
  lo, hi = [], []
  for a in axes:
    d = x.shape[a]
    top = 0 if mode == "reflect" and d == 1 else min(2, d - 1) if mode == "reflect" else 2
    lo.append(int(b.rng.integers(-1 if mode == "constant" and d > 2 else 0, top + 1)))
    hi.append(int(b.rng.integers(-1 if mode == "constant" and d + lo[-1] > 1 else 0, top + 1)))
  shape = list(x.shape)
  for a, l, h in zip(axes, lo, hi):
    shape[a % x.rank] += l + h
  if math.prod(shape) > b.max_numel or min(shape) < 1:
    return False
  if mode == "edge" and x.numel == 0:
    return False
  ins: list = [x, b.ints(lo + hi, "pads")]
  mag, grain = x.mag, x.grain
  if mode == "constant" and b.chance(0.7):
    value = float(b.rng.integers(-4, 5) / 2) if x.is_float else int(b.rng.integers(-4, 5))
    ins.append(b.scalar(value, x.dtype))
    mag, grain = max(mag, abs(value)), exact_grain(x.dtype, max(mag, abs(value)), grain, 1 if x.is_float else 0)
  if axes != list(range(x.rank)):
    ins += [""] * (3 - len(ins)) + [b.ints(axes, "axes")]
  b.node("Pad", ins, [{**moved(x, shape), "mag": mag, "grain": grain}], mode=mode)
  return True


def gen_squeeze(b: Builder, x: Value) -> bool:
  ones = [i for i, d in enumerate(x.shape) if d == 1]
  if ones and b.chance(0.5):
    k = len(ones) if b.chance(0.3) else int(b.rng.integers(1, len(ones) + 1))
    axes = sorted(b.rng.choice(ones, k, replace=False).tolist())
    shape = [d for i, d in enumerate(x.shape) if i not in axes]
    ins = [x] if axes == ones and b.chance(0.5) else [x, b.ints([a - x.rank if b.chance(0.3) else a for a in axes])]
    b.node("Squeeze", ins, [moved(x, shape)])
    return True
  if x.rank >= MAX_RANK:
    return False
  k = 1 if x.rank == MAX_RANK - 1 else int(b.rng.integers(1, 3))
  out_rank = x.rank + k
  axes = sorted(b.rng.choice(out_rank, k, replace=False).tolist())
  shape, it = [], iter(x.shape)
  for i in range(out_rank):
    shape.append(1 if i in axes else next(it))
  b.node("Unsqueeze", [x, b.ints([a - out_rank if b.chance(0.3) else a for a in axes])], [moved(x, shape)])
  return True


def gen_flatten(b: Builder, x: Value) -> bool:
  if x.rank == 0:
    return False
  axis = int(b.rng.integers(-x.rank, x.rank + 1))
  a = axis % x.rank if axis < 0 else axis
  b.node("Flatten", [x], [moved(x, (math.prod(x.shape[:a]), math.prod(x.shape[a:])))], axis=axis)
  return True


def gen_concat(b: Builder, x: Value) -> bool:
  if x.rank == 0:
    return False
  axis = int(b.rng.integers(-x.rank, x.rank))
  a = axis % x.rank
  parts = [x]
  for _ in range(int(b.rng.integers(1, 3))):
    fits = [
      v
      for v in b.case.values
      if v.dtype == x.dtype and v.rank == x.rank and all(v.shape[i] == x.shape[i] for i in range(x.rank) if i != a)
    ]
    if fits and b.chance(0.5):
      parts.append(b.pick(fits))
    else:
      parts.append(b.leaf(x.shape[:a] + (b.pick([1, 2, 3]),) + x.shape[a + 1 :], x.dtype))
  shape = x.shape[:a] + (sum(p.shape[a] for p in parts),) + x.shape[a + 1 :]
  if math.prod(shape) > b.max_numel:
    return False
  b.rng.shuffle(parts)
  mag = max(p.mag for p in parts)
  b.node(
    "Concat",
    parts,
    [
      {
        "shape": shape,
        "dtype": x.dtype,
        "mag": mag,
        "lowp": any(p.lowp for p in parts),
        "grain": exact_grain(x.dtype, mag, *(p.grain for p in parts)),
        "err": lambda env, es=[p.err for p in parts]: max(e(env) for e in es),
      }
    ],
    axis=axis,
  )
  return True


def gen_split(b: Builder, x: Value) -> bool:
  axes = [i for i, d in enumerate(x.shape) if d >= 2]
  if not axes:
    return False
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
  b.node("Split", ins, [moved(x, x.shape[:a] + (s,) + x.shape[a + 1 :]) for s in sizes], **attrs)
  return True


def gen_gather(b: Builder, x: Value) -> bool:
  if x.rank == 0:
    return False
  a = int(b.rng.integers(x.rank))
  d = x.shape[a]
  ishape = b.pick([(), (1,), (2,), (3,), (2, 2)])
  idx = b.rng.integers(-d, d, ishape)
  shape = x.shape[:a] + tuple(ishape) + x.shape[a + 1 :]
  if math.prod(shape) > b.max_numel or len(shape) > MAX_RANK:
    return False
  if b.chance(0.3) and len(b.case.inputs) < b.room:
    # indices given at run time
    name = b.fresh("idx")
    dt = b.pick(["int64", "int32"])
    b.case.inputs.append(helper.make_tensor_value_info(name, ELEM[dt], list(ishape)))
    b.case.feeds[name] = idx.astype(dt)
  else:
    name = b.ints(idx, "idx")
  b.node("Gather", [x, name], [moved(x, shape)], axis=a - x.rank if b.chance(0.3) else a)
  return True


def gen_cast(b: Builder, x: Value) -> bool:
  out = {**moved(x, x.shape)}
  if x.dtype == "float32":
    to = b.pick(["float16", "float16"] + (["int32", "int64", "bool"] if x.grain is not None else []))
    if to == "float16":
      if x.mag > 6e4:
        return False
      grain = None if x.grain is None else exact_grain("float16", x.mag, x.grain)
      out.update(grain=grain, lowp=x.lowp or grain is None)
    elif to == "bool":
      out.update(mag=1, grain=0)
    else:
      out.update(mag=math.ceil(x.mag), grain=0)
  elif x.dtype == "float16":
    to = "float32"
  elif x.dtype in INTS:
    to = b.pick(["float32", "int32" if x.dtype == "int64" else "int64", "bool"])
    if to == "float32":
      out.update(grain=exact_grain(to, x.mag, 0))
    else:
      out.update(grain=0, mag=1 if to == "bool" else min(x.mag, 2.0**31))
  else:
    to = b.pick(["float32", "int32", "int64"])
  out["dtype"] = to
  b.node("Cast", [x], [out], to=ELEM[to])
  return True


# (generator, weight): elementwise ops most, since they are what fuses around everything else. The window ops only
# take (N, C, H, W)-like values, so their weights count only there
GENERATORS: list[tuple[Callable[[Builder, Value], bool], float]] = [
  (gen_unary, 4),
  (gen_binary, 4),
  (gen_compare, 2),
  (gen_logic, 1),
  (gen_where, 1),
  (gen_reduce, 2),
  (gen_reshape, 1),
  (gen_transpose, 1),
  (gen_expand, 1),
  (gen_slice, 1.5),
  (gen_pad, 1),
  (gen_squeeze, 1),
  (gen_flatten, 0.5),
  (gen_matmul, 1.5),
  (gen_gemm, 1),
  (gen_conv, 3),
  (gen_pool, 2.5),
  (gen_conv_transpose, 2),
  (gen_resize, 1.5),
  (gen_concat, 1),
  (gen_split, 0.7),
  (gen_gather, 1),
  (gen_cast, 1),
]

# the generators that take a value with a zero-size dim
EMPTY_OK = {
  gen_unary,
  gen_binary,
  gen_compare,
  gen_logic,
  gen_where,
  gen_reduce,
  gen_transpose,
  gen_expand,
  gen_slice,
  gen_squeeze,
  gen_concat,
  gen_cast,
}


def generate(seed: int, index: int) -> Case:
  """Case `index` of `seed`: a small random graph with its inputs, and which of its values are outputs."""
  b = Builder(seed, index)
  rng = b.rng
  if b.chance(BIG_SHARE):
    b.big, b.max_numel = True, BIG_NUMEL
    # M x K x N >= 32**3 = MIN_WORK: odd sizes leave partial tiles
    shape = b.pick(
      [
        (b.pick([32, 48, 64]), b.pick([32, 40, 64])),
        (1, b.pick([4, 8, 16])) + tuple(int(rng.integers(8, 17)) for _ in range(2)),
      ]
    )
  elif b.chance(0.35):
    n, c = b.pick([1, 1, 2]), b.pick([1, 2, 3, 4, 6])
    shape = (n, c) + tuple(int(rng.integers(3, 9)) for _ in range(b.pick([1, 2, 2])))
  else:
    shape = tuple(b.pick([1, 2, 3, 4, 5, 6]) for _ in range(int(rng.integers(0, 4))))
  b.room = MAX_INPUTS if not b.chance(CONSTANT_SHARE) else 0
  first = b.leaf(shape, b.pick(["float32"] * 8 + ["int32", "int64"]), const=not b.room)
  weights = np.array([w for _, w in GENERATORS])
  target = int(rng.integers(NODES[0], NODES[1] + 1))
  last = first
  if b.big:
    # a big case starts with its contraction, so that it does reach the microkernel
    made = len(b.case.values)
    big_ops = [gen_conv, gen_conv, gen_conv_transpose] if first.rank == 4 else [gen_matmul, gen_matmul, gen_gemm]
    if b.pick(big_ops)(b, first):
      last = b.case.values[-1] if len(b.case.values) > made else first
  for _ in range(8 * target):
    if len(b.case.nodes) >= target:
      break
    pool = [v for v in b.case.values if not v.leaf] or [first]
    x = last if b.chance(0.6) else b.pick(pool + [first])
    gen = GENERATORS[int(rng.choice(len(GENERATORS), p=weights / weights.sum()))][0]
    if x.numel == 0 and gen not in EMPTY_OK:
      continue
    before = len(b.case.values)
    if gen(b, x) and len(b.case.values) > before:
      made = [v for v in b.case.values[before:] if not v.leaf]
      last = made[int(rng.integers(len(made)))] if made else last
  computed = [v for v in b.case.values if not v.leaf]
  if not computed:  # nothing suited the first value: one elementwise op always does
    gen_cast(b, first)
    computed = [v for v in b.case.values if not v.leaf]
    last = computed[-1]
  outs = [last] + [v for v in computed if v is not last and b.chance(0.15)][:2]
  b.case.outputs = outs
  b.case.shaped = b.chance(0.5)
  return b.case
