"""Random chains of elementwise, movement and reduction ops, built on a Tensor and (independently) on a numpy array in
lockstep, compiled to an artifact and compared. The chains mix broadcasting binary ops on extra inputs with
permute/reshape/slice/pad/flip/expand and keepdim reductions, so fusion across movement ops and reductions is
exercised."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import run
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aot import Tensor

MAX_NUMEL = 400
SIZES = [1, 2, 3, 4, 5, 7]
CHAIN = settings(
  max_examples=40,
  deadline=None,
  derandomize=True,
  database=None,
  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)

# every test here runs once per target
pytestmark = pytest.mark.usefixtures("each_target")


def _numel(shape):
  return math.prod(shape)


def _bcast(a, b):
  n = max(len(a), len(b))
  a, b = (1,) * (n - len(a)) + tuple(a), (1,) * (n - len(b)) + tuple(b)
  return tuple(max(x, y) for x, y in zip(a, b))


def _draw_axes(draw, ndim):
  """None, one axis or a tuple of axes, each possibly written negative."""
  if draw(st.integers(0, 4)) == 0:
    return None
  axes = draw(st.lists(st.integers(0, ndim - 1), min_size=1, max_size=ndim, unique=True))
  axes = [a - ndim if draw(st.booleans()) else a for a in axes]
  return axes[0] if len(axes) == 1 and draw(st.booleans()) else tuple(axes)


def _draw_step(draw, shape, extras, kinds):
  """One step valid for shape: (step, new shape). Extra inputs are appended to extras."""
  nd = len(shape)
  kind = draw(st.sampled_from([k for k in kinds if nd > 0 or k not in MOVEMENT | REDUCING] or ["unary"]))
  if kind == "unary":
    return (
      "unary",
      draw(st.sampled_from(["neg", "abs", "tanh", "sigmoid", "relu", "sin", "square", "exp_tanh"])),
    ), shape
  if kind == "scalar":
    return (
      "scalar",
      draw(st.sampled_from(["add", "sub", "mul", "max"])),
      draw(st.sampled_from([-1.5, 0.5, 2.0, 3.0])),
      draw(st.booleans()),
    ), shape
  if kind in ("binary", "where"):
    e = draw(st.integers(0, min(nd + 1, 4)))
    eshape = []
    for i in range(e):
      j = nd - e + i  # the axis of shape this extra axis lines up with (negative: a new leading axis)
      if j < 0:
        eshape.append(draw(st.sampled_from([1, 2, 3])))
      elif shape[j] == 1:
        eshape.append(draw(st.sampled_from([1, 1, 2, 3])))
      else:
        eshape.append(draw(st.sampled_from([shape[j], shape[j], 1])))
    eshape = tuple(eshape)
    out = _bcast(shape, eshape)
    if _numel(out) > MAX_NUMEL:
      return ("unary", "neg"), shape
    extras.append(eshape)
    if kind == "where":
      return ("where", len(extras) - 1, draw(st.booleans())), out
    return (
      "binary",
      draw(st.sampled_from(["add", "sub", "mul", "maximum", "minimum"])),
      len(extras) - 1,
      draw(st.booleans()),
    ), out
  if kind == "permute":
    order = draw(st.permutations(range(nd)))
    order = tuple(o - nd if draw(st.booleans()) else o for o in order)
    return ("permute", order), tuple(shape[o] for o in order)
  if kind == "reshape":
    n, choice = _numel(shape), draw(st.integers(0, 4))
    if choice == 0:
      new = (n,)
    elif choice == 1 and nd < 4:
      at = draw(st.integers(0, nd))
      new = shape[:at] + (1,) + shape[at:]
    elif choice == 2 and nd >= 2:
      at = draw(st.integers(0, nd - 2))
      new = shape[:at] + (shape[at] * shape[at + 1],) + shape[at + 2 :]
    elif choice == 3 and nd < 4:
      at = draw(st.integers(0, nd - 1))
      divs = [f for f in range(2, shape[at]) if shape[at] % f == 0] or [1]
      f = draw(st.sampled_from(divs))
      new = shape[:at] + (f, shape[at] // f) + shape[at + 1 :]
    else:
      new = tuple(reversed(shape))
    written = list(new)
    if draw(st.booleans()):
      written[draw(st.integers(0, len(new) - 1))] = -1
    return ("reshape", tuple(written)), tuple(new)
  if kind == "slice":
    idx, new = [], []
    for s in shape:
      step = draw(st.sampled_from([1, 1, 2, 3, -1, -2]))
      start = draw(st.one_of(st.none(), st.integers(-s, s - 1)))
      stop = draw(st.one_of(st.none(), st.integers(-s - 1, s)))
      sl = slice(start, stop, step if step != 1 or draw(st.booleans()) else None)
      if len(range(*sl.indices(s))) == 0:
        sl = slice(None, None, step)
      idx.append(sl)
      new.append(len(range(*sl.indices(s))))
    if draw(st.booleans()) and nd >= 2:
      idx = [Ellipsis] + idx[1:] if draw(st.booleans()) else idx[:-1] + [Ellipsis]
    if idx and idx[0] is Ellipsis:
      new = list(shape[:1]) + new[1:]
    elif idx and idx[-1] is Ellipsis:
      new = new[:-1] + list(shape[-1:])
    return ("slice", tuple(idx)), tuple(new)
  if kind == "pad":
    pads, new = [], []
    for s in shape:
      lo = draw(st.integers(-1 if s > 1 else 0, 2))
      hi = draw(st.integers(-1 if s + lo > 1 else 0, 2))
      pads.append((lo, hi))
      new.append(s + lo + hi)
    if _numel(new) > MAX_NUMEL:
      return ("unary", "abs"), shape
    return ("pad", tuple(pads), draw(st.sampled_from([0.0, -1.0, 2.5]))), tuple(new)
  if kind == "flip":
    axes = draw(st.lists(st.integers(-nd, nd - 1), min_size=1, max_size=nd, unique_by=lambda a: a % nd))
    return ("flip", tuple(axes) if len(axes) > 1 else axes[0]), shape
  if kind == "expand":
    at, size = draw(st.integers(0, nd)), draw(st.sampled_from([2, 3]))
    new = shape[:at] + (size,) + shape[at:]
    if _numel(new) > MAX_NUMEL or nd >= 4:
      return ("unary", "relu"), shape
    return ("expand", at, size), new
  if kind == "reduce":
    axes, keep = _draw_axes(draw, nd), draw(st.booleans())
    red = set(range(nd)) if axes is None else {a % nd for a in ((axes,) if isinstance(axes, int) else axes)}
    new = (
      tuple(1 if i in red else s for i, s in enumerate(shape))
      if keep
      else tuple(s for i, s in enumerate(shape) if i not in red)
    )
    return ("reduce", draw(st.sampled_from(["sum", "max", "sum", "max", "min", "mean"])), axes, keep), new
  if kind == "selfreduce":
    # x - x.max(axis, keepdim=True) and friends: a reduce broadcast back over its own input
    axis = draw(st.integers(-nd, nd - 1))
    return ("selfreduce", draw(st.sampled_from(["sub_max", "div_abs_sum", "sub_mean"])), axis), shape
  raise AssertionError(kind)


MOVEMENT = {"permute", "reshape", "slice", "pad", "flip", "expand"}
REDUCING = {"reduce", "selfreduce"}
ALL_KINDS = [
  "unary",
  "scalar",
  "binary",
  "binary",
  "where",
  "permute",
  "reshape",
  "slice",
  "pad",
  "flip",
  "expand",
  "reduce",
  "reduce",
  "selfreduce",
]


@st.composite
def chains(draw, kinds=tuple(ALL_KINDS), min_steps=2, max_steps=6, end_with=()):
  nd = draw(st.integers(1, 3))
  shape = tuple(draw(st.sampled_from(SIZES)) for _ in range(nd))
  x_shape, extras, steps = shape, [], []
  for _ in range(draw(st.integers(min_steps, max_steps))):
    step, shape = _draw_step(draw, shape, extras, kinds)
    steps.append(step)
  for kinds_ in end_with:
    step, shape = _draw_step(draw, shape, extras, kinds_)
    steps.append(step)
  return x_shape, tuple(extras), tuple(steps), draw(st.integers(0, 2**16))


# *** the two interpreters: one on Tensors, one on numpy (float64), written separately ***


def tensor_step(t: Tensor, step, ex: list[Tensor]) -> Tensor:
  k = step[0]
  if k == "unary":
    return {
      "neg": lambda: -t,
      "abs": lambda: t.abs(),
      "tanh": lambda: t.tanh(),
      "sigmoid": lambda: t.sigmoid(),
      "relu": lambda: t.relu(),
      "sin": lambda: t.sin(),
      "square": lambda: t * t,
      "exp_tanh": lambda: t.tanh().exp(),
    }[step[1]]()
  if k == "scalar":
    _, op, v, left = step
    if op == "add":
      return v + t if left else t + v
    if op == "sub":
      return v - t if left else t - v
    if op == "mul":
      return v * t if left else t * v
    return t.maximum(v)
  if k == "binary":
    _, op, i, left = step
    a, b = (ex[i], t) if left else (t, ex[i])
    return {
      "add": lambda: a + b,
      "sub": lambda: a - b,
      "mul": lambda: a * b,
      "maximum": lambda: a.maximum(b),
      "minimum": lambda: a.minimum(b),
    }[op]()
  if k == "where":
    _, i, flip = step
    return (t > 0).where(ex[i], t) if flip else (ex[i] < 0).where(t, ex[i] * 0.5)
  if k == "permute":
    return t.permute(step[1])
  if k == "reshape":
    return t.reshape(step[1])
  if k == "slice":
    return t[step[1]]
  if k == "pad":
    return t.pad(list(step[1]), step[2])
  if k == "flip":
    return t.flip(step[1])
  if k == "expand":
    _, at, size = step
    u = t.unsqueeze(at)
    return u.expand(u.shape[:at] + (size,) + u.shape[at + 1 :])
  if k == "reduce":
    _, op, axes, keep = step
    return getattr(t, op)(axes, keepdim=keep)
  if k == "selfreduce":
    _, op, axis = step
    if op == "sub_max":
      return t - t.max(axis, keepdim=True)
    if op == "div_abs_sum":
      return t / (t.abs().sum(axis, keepdim=True) + 1.0)
    return t - t.mean(axis, keepdim=True)
  raise AssertionError(k)


def numpy_step(a: np.ndarray, step, ex: list[np.ndarray]) -> np.ndarray:
  k = step[0]
  if k == "unary":
    op = step[1]
    if op == "neg":
      return np.negative(a)
    if op == "abs":
      return np.abs(a)
    if op == "tanh":
      return np.tanh(a)
    if op == "sigmoid":
      return 1.0 / (1.0 + np.exp(-a))
    if op == "relu":
      return np.where(a > 0, a, 0.0)
    if op == "sin":
      return np.sin(a)
    if op == "square":
      return np.square(a)
    return np.exp(np.tanh(a))
  if k == "scalar":
    _, op, v, left = step
    if op == "add":
      return np.add(v, a)
    if op == "sub":
      return np.subtract(v, a) if left else np.subtract(a, v)
    if op == "mul":
      return np.multiply(a, v)
    return np.maximum(a, v)
  if k == "binary":
    _, op, i, left = step
    x, y = (ex[i], a) if left else (a, ex[i])
    return {"add": np.add, "sub": np.subtract, "mul": np.multiply, "maximum": np.maximum, "minimum": np.minimum}[op](
      x, y
    )
  if k == "where":
    _, i, flip = step
    shape = np.broadcast_shapes(a.shape, ex[i].shape)
    if flip:
      return np.where(a > 0, np.broadcast_to(ex[i], shape), np.broadcast_to(a, shape))
    return np.where(ex[i] < 0, a, ex[i] * 0.5)
  if k == "permute":
    return np.transpose(a, step[1])
  if k == "reshape":
    return np.reshape(a, step[1])
  if k == "slice":
    return a[step[1]]
  if k == "pad":
    pads, value = step[1], step[2]
    crop = tuple(slice(max(-lo, 0), n - max(-hi, 0)) for (lo, hi), n in zip(pads, a.shape))
    return np.pad(a[crop], [(max(lo, 0), max(hi, 0)) for lo, hi in pads], mode="constant", constant_values=value)
  if k == "flip":
    return np.flip(a, step[1])
  if k == "expand":
    _, at, size = step
    return np.repeat(np.expand_dims(a, at), size, axis=at)
  if k == "reduce":
    _, op, axes, keep = step
    return {"sum": np.sum, "max": np.amax, "min": np.amin, "mean": np.mean}[op](a, axis=axes, keepdims=keep)
  if k == "selfreduce":
    _, op, axis = step
    if op == "sub_max":
      return a - np.amax(a, axis=axis, keepdims=True)
    if op == "div_abs_sum":
      return a / (np.sum(np.abs(a), axis=axis, keepdims=True) + 1.0)
    return a - np.mean(a, axis=axis, keepdims=True)
  raise AssertionError(k)


def check_chain(chain, outputs="final"):
  x_shape, extras, steps, seed = chain
  rng = np.random.default_rng(seed)
  inputs = [rng.uniform(-2, 2, size=s).astype(np.float32) for s in (x_shape, *extras)]

  def fn(*ins):
    t, mids = ins[0], []
    for step in steps:
      t = tensor_step(t, step, list(ins[1:]))
      mids.append(t)
    return (t, mids[len(mids) // 2]) if outputs == "two" else t

  a, ex, mids = inputs[0].astype(np.float64), [e.astype(np.float64) for e in inputs[1:]], []
  for step in steps:
    a = numpy_step(a, step, ex)
    mids.append(a)
  refs = (a, mids[len(mids) // 2]) if outputs == "two" else (a,)

  out = run(fn, *inputs)
  outs = out if isinstance(out, tuple) else (out,)
  for o, r in zip(outs, refs):
    r = np.asarray(r)
    assert o.shape == r.shape, f"shape {o.shape} != numpy's {r.shape}"
    assert o.dtype == np.float32
    np.testing.assert_allclose(o.astype(np.float64), r, rtol=1e-5, atol=1e-5)


@CHAIN
@given(chains())
def test_random_chain(chain):
  check_chain(chain)


@CHAIN
@given(
  chains(
    kinds=("binary", "permute", "reshape", "slice", "pad", "flip", "expand", "scalar"),
    min_steps=2,
    max_steps=5,
    end_with=(("reduce",), ("binary", "selfreduce"), ("permute", "slice", "pad", "flip", "reshape")),
  )
)
def test_movement_then_reduce_chain(chain):
  """Movement ops feeding a keepdim reduction, then a broadcast back and one more movement."""
  check_chain(chain)


@CHAIN
@given(
  chains(kinds=("selfreduce", "reduce", "binary", "slice", "pad", "flip", "permute", "unary"), min_steps=3, max_steps=6)
)
def test_reduce_heavy_chain_two_outputs(chain):
  """Reductions between movement ops, with an intermediate result as a second output."""
  check_chain(chain, outputs="two")
