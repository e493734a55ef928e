"""ONNX operators, one small function each: (node, *inputs, **attributes) -> Tensor(s). Attribute defaults are the
ONNX defaults. Elementwise math, logic, casts and reductions here; movement and shapes in onnx_ops_tensor.py, gathering,
scattering and index maps in onnx_ops_index.py, neural network layers in onnx_ops_nn.py (attention in
onnx_ops_attention.py, recurrent layers in onnx_ops_rnn.py, quantisation in onnx_ops_quant.py), control flow in
onnx_ops_control.py."""

from __future__ import annotations

from aot.core.dtype import dtypes, to_dtype
from aot.frontends import narrow
from aot.frontends.onnx import Unsupported, onnx_dtype, onnx_type, op
from aot.frontends.tensor import Tensor

# *** elementwise ***

for _name, _method in {
  "Abs": "abs",
  "Neg": "neg",
  "Exp": "exp",
  "Log": "log",
  "Sqrt": "sqrt",
  "Reciprocal": "reciprocal",
  "Sin": "sin",
  "Cos": "cos",
  "Tan": "tan",
  "Asin": "asin",
  "Acos": "acos",
  "Atan": "atan",
  "Sinh": "sinh",
  "Cosh": "cosh",
  "Asinh": "asinh",
  "Acosh": "acosh",
  "Atanh": "atanh",
  "Tanh": "tanh",
  "Erf": "erf",
  "Sigmoid": "sigmoid",
  "Relu": "relu",
  "Floor": "floor",
  "Ceil": "ceil",
  "Round": "round",
  "Sign": "sign",
  "IsNaN": "isnan",
  "Not": "logical_not",
  "BitwiseNot": "__invert__",
}.items():
  op(_name)(lambda n, x, _m=_method: getattr(x, _m)())

for _name, _method in {"Add": "__add__", "Sub": "__sub__", "Mul": "__mul__"}.items():
  op(_name)(lambda n, a, b, _m=_method: getattr(a, _m)(b))


@op("Div")
def div(n, a, b):
  # ONNX integer division truncates toward zero, as C (and Tensor's //) does
  return a // b if a.dtype.is_int else a / b


@op("Pow")
def pow_(n, a, b):
  out = a.cast(dtypes.float64 if a.dtype == dtypes.float64 or b.dtype == dtypes.float64 else dtypes.float32).pow(b)
  return out.cast(a.dtype)


@op("Mod")
def mod(n, a, b, fmod=0):
  r = a % b  # C semantics: the remainder has the dividend's sign (fmod)
  if fmod:
    return r
  # Python-style mod takes the divisor's sign
  return ((r != 0) & ((r < 0) != (b < 0))).where(r + b, r)


@op("Max")
def max_(n, *xs):
  return _variadic(xs, lambda a, b: a.maximum(b))


@op("Min")
def min_(n, *xs):
  return _variadic(xs, lambda a, b: a.minimum(b))


@op("Sum")
def sum_(n, *xs):
  return _variadic(xs, lambda a, b: a + b)


@op("Mean")
def mean_(n, *xs):
  return _variadic(xs, lambda a, b: a + b) / len(xs)


def _variadic(xs, f):
  out = xs[0]
  for x in xs[1:]:
    out = f(out, x)
  return out


for _name, _method in {
  "Equal": "__eq__",
  "Less": "__lt__",
  "LessOrEqual": "__le__",
  "Greater": "__gt__",
  "GreaterOrEqual": "__ge__",
  "And": "__and__",
  "Or": "__or__",
  "Xor": "__xor__",
  "BitwiseAnd": "__and__",
  "BitwiseOr": "__or__",
  "BitwiseXor": "__xor__",
}.items():
  op(_name)(lambda n, a, b, _m=_method: getattr(a, _m)(b))


@op("BitShift")
def bitshift(n, x, y, direction=""):
  if direction not in ("LEFT", "RIGHT"):
    raise Unsupported(f"direction {direction!r}")
  # shifting by a negative amount or by the bit width or more saturates (C leaves it undefined)
  bits = x.dtype.itemsize * 8
  valid = (y >= 0) & (y < bits)
  y = valid.where(y, 0)
  if direction == "RIGHT":
    return valid.where(x >> y, (x < 0).where(-1, 0).cast(x.dtype) if x.dtype.kind == "i" else 0)
  if x.dtype.kind == "i":  # left shifts of negative signed values are done on the bits
    u = to_dtype(f"uint{bits}")
    return valid.where((x.bitcast(u) << y.cast(u)).bitcast(x.dtype), 0)
  return valid.where(x << y, 0)


@op("Where")
def where(n, c, a, b):
  return c.where(a, b)


@op("IsInf")
def isinf(n, x, detect_negative=1, detect_positive=1):
  out = x != x if not x.dtype.is_float else (x < 0) & (x > 0)  # all false (NaN included)
  if x.dtype.is_float and detect_positive:
    out = out | (x == float("inf"))
  if x.dtype.is_float and detect_negative:
    out = out | (x == float("-inf"))
  return out


@op("Cast")
def cast(n, x, to=1, saturate=1, round_mode="up"):
  return narrow.convert(x, onnx_type(to), bool(saturate), round_mode)


@op("CastLike")
def cast_like(n, x, like, saturate=1, round_mode="up"):
  return narrow.convert(x, narrow.fmt_of(like) or like.dtype, bool(saturate), round_mode)


@op("BitCast")
def bitcast(n, x, to=1):
  return x.bitcast(onnx_dtype(to))


@op("Identity")
def identity(n, x):
  return x


# *** activations ***


@op("LeakyRelu")
def leaky_relu(n, x, alpha=0.01):
  return (x < 0).where(x * alpha, x)


@op("PRelu")
def prelu(n, x, slope):
  return (x < 0).where(x * slope, x)


@op("ThresholdedRelu")
def thresholded_relu(n, x, alpha=1.0):
  return (x > alpha).where(x, 0.0)


@op("Elu")
def elu(n, x, alpha=1.0):
  return (x < 0).where(alpha * (x.exp() - 1), x)


@op("Celu")
def celu(n, x, alpha=1.0):
  return x.maximum(0) + (alpha * ((x / alpha).exp() - 1)).minimum(0)


@op("Selu")
def selu(n, x, alpha=1.67326319217681884765625, gamma=1.05070102214813232421875):
  return (x <= 0).where(gamma * (alpha * x.exp() - alpha), gamma * x)


@op("HardSigmoid")
def hard_sigmoid(n, x, alpha=0.2, beta=0.5):
  return (x * alpha + beta).maximum(0).minimum(1)


@op("HardSwish")
def hard_swish(n, x):
  return x * (x * (1 / 6) + 0.5).maximum(0).minimum(1)


@op("Softplus")
def softplus(n, x):
  return (x > 20).where(x, (x.exp() + 1).log())


@op("Softsign")
def softsign(n, x):
  return x / (x.abs() + 1)


@op("Mish")
def mish(n, x):
  return x * softplus(n, x).tanh()


@op("Swish", since=24)
def swish(n, x, alpha=1.0):
  return x * (x * alpha).sigmoid()


@op("Gelu", since=20)
def gelu(n, x, approximate="none"):
  return x.gelu(approximate).cast(x.dtype)


@op("Shrink")
def shrink(n, x, bias=0.0, lambd=0.5):
  return (x < -lambd).where(x + bias, (x > lambd).where(x - bias, 0)).cast(x.dtype)


@op("Clip", since=1)
def clip_v1(n, x, min=-3.4028234663852886e38, max=3.4028234663852886e38):
  return x.maximum(min).minimum(max)


@op("Clip", since=11)
def clip(n, x, lo=None, hi=None):
  if lo is not None:
    x = x.maximum(lo)
  if hi is not None:
    x = x.minimum(hi)
  return x


# *** reductions: axes are an attribute before opset 18 (13 for ReduceSum), an input after; _axes takes both ***


def _axes(n, x, axes, noop_with_empty_axes):
  if isinstance(axes, Tensor):
    axes = n.const(axes, "axes").tolist()
  if axes is None or len(axes) == 0:
    return () if noop_with_empty_axes else tuple(range(x.ndim))
  return tuple(int(a) % max(x.ndim, 1) for a in axes)


def _reduction(name: str, fn, elementwise=lambda x: x):
  """fn(x, axes, keepdims) reduces; with no axes and noop_with_empty_axes only its elementwise part is applied."""

  @op(name)
  def reduce(n, x, axes=None, keepdims=1, noop_with_empty_axes=0):
    axes = _axes(n, x, axes, noop_with_empty_axes)
    return fn(x, axes, bool(keepdims)) if axes else elementwise(x)


_reduction("ReduceSum", lambda x, a, k: x.sum(a, k))
_reduction("ReduceMean", lambda x, a, k: x.mean(a, k).cast(x.dtype))
_reduction("ReduceMax", lambda x, a, k: x.max(a, k))
_reduction("ReduceMin", lambda x, a, k: x.min(a, k))
_reduction("ReduceProd", lambda x, a, k: x.prod(a, k))
_reduction("ReduceL1", lambda x, a, k: x.abs().sum(a, k), lambda x: x.abs())
_reduction(
  "ReduceL2",
  lambda x, a, k: (
    (x * x).sum(a, k).cast(dtypes.float64 if x.dtype == dtypes.float64 else dtypes.float32).sqrt().cast(x.dtype)
  ),
  lambda x: x.abs(),
)
_reduction("ReduceSumSquare", lambda x, a, k: (x * x).sum(a, k), lambda x: x * x)
_reduction("ReduceLogSum", lambda x, a, k: x.sum(a, k).log())
_reduction("ReduceLogSumExp", lambda x, a, k: _logsumexp(x, a, k))


def _logsumexp(x, axes, keepdims):
  m = x.max(axes, keepdim=True)
  m = (m.abs() == float("inf")).where(0.0, m) if x.dtype.is_float else m
  out = (x - m).exp().sum(axes, keepdim=True).log() + m
  return out if keepdims else out.squeeze(axes)


@op("ArgMax")
def argmax(n, x, axis=0, keepdims=1, select_last_index=0):
  return _arg(x, axis, keepdims, select_last_index, True)


@op("ArgMin")
def argmin(n, x, axis=0, keepdims=1, select_last_index=0):
  return _arg(x, axis, keepdims, select_last_index, False)


def _arg(x, axis, keepdims, last, largest):
  if last:
    # the last index of the extreme is the first one in the flipped tensor
    i = _arg(x.flip(axis), axis, keepdims, 0, largest)
    return (x.shape[axis % x.ndim] - 1) - i
  return (x.argmax(axis, bool(keepdims)) if largest else x.argmin(axis, bool(keepdims))).cast(dtypes.int64)


# the other op modules register theirs on import (in any order: an op registered twice is an error, frontends/onnx.py)
import aot.frontends.onnx_ops_attention  # noqa: E402,F401
import aot.frontends.onnx_ops_contrib  # noqa: E402,F401
import aot.frontends.onnx_ops_control  # noqa: E402,F401
import aot.frontends.onnx_ops_index  # noqa: E402,F401
import aot.frontends.onnx_ops_nn  # noqa: E402,F401
import aot.frontends.onnx_ops_quant  # noqa: E402,F401
import aot.frontends.onnx_ops_rnn  # noqa: E402,F401
import aot.frontends.onnx_ops_sampling  # noqa: E402,F401
import aot.frontends.onnx_ops_sequence  # noqa: E402,F401
import aot.frontends.onnx_ops_signal  # noqa: E402,F401
import aot.frontends.onnx_ops_tensor  # noqa: E402,F401
