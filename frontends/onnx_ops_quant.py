"""Quantized operators in QOperator form: the com.microsoft ops onnxruntime's quantizer emits (QLinearAdd, QGemm,
DynamicQuantizeMatMul, ...). Each one is lowered as onnxruntime computes it: integer products accumulated in int32
where it accumulates in int32, otherwise dequantize to float32, compute, and requantize (round half to even, then
add the zero point, then saturate). onnxruntime's float parts are not all ours: it has a fixed-point QLinearAdd
on some CPUs and MLAS's approximate logistic in QLinearSigmoid's lookup table, so a value can land one step apart
there (tests/test_quant_ops.py finds none on an AVX-512 x86 machine). The ai.onnx quantisation ops (QuantizeLinear,
DequantizeLinear, QLinearMatMul, QLinearConv) are here too."""

from __future__ import annotations

import math

import numpy as np

from aot.core.dtype import dtypes, max_value, min_value
from aot.errors import NeedsConstant
from aot.frontends import narrow
from aot.frontends.onnx import Unsupported, onnx_type, op
from aot.frontends.onnx_ops_nn import _zp32, avg_pool, conv_integer
from aot.frontends.onnx_ops_rnn import _activations, _rnn_outputs, _rnn_setup, _run_dirs, lstm_cell
from aot.frontends.tensor import Tensor

MS = "com.microsoft"
F32 = dtypes.float32


def _f(t: Tensor) -> Tensor:
  return t.cast(F32)


def _scalar(t: Tensor, what: str) -> Tensor:
  """A per-tensor scale or zero point (onnxruntime's kernels for these ops accept nothing else)."""
  if t.numel() != 1:
    raise Unsupported(f"{what} must be a scalar (per tensor), got shape {t.shape}")
  return t.reshape(())


def _dequant(x: Tensor, scale: Tensor, zp: Tensor | None) -> Tensor:
  """scale * (x - zp) in float32, the order onnxruntime's lookup tables and float paths use."""
  return _f(_scalar(scale, "the input scale")) * _f(x.cast(dtypes.int32) - _zp(zp))


def _requant(v: Tensor, scale: Tensor | None, zp: Tensor | None, dt) -> Tensor:
  """Quantize float32 v: round(v / scale) + zp, saturated to dt (onnxruntime's MlasQuantizeLinear)."""
  if dt not in (dtypes.int8, dtypes.uint8):
    raise Unsupported(f"quantized type {dt.name} (int8 or uint8 expected)")
  q = v / _f(_scalar(scale, "the output scale")) if scale is not None else v
  return _saturate(q.round(), zp, dt)


def _saturate(q: Tensor, zp: Tensor | None, dt) -> Tensor:
  """q (already rounded, float32) + zp, clamped to dt's range and cast."""
  if zp is not None:
    q = q + _f(_scalar(zp, "the output zero point"))
  return q.maximum(float(min_value(dt))).minimum(float(max_value(dt))).cast(dt)


def _out_type(x: Tensor, zp: Tensor | None):
  return zp.dtype if zp is not None else x.dtype


# *** elementwise: dequantize, compute in float, requantize ***


@op("QLinearAdd", domain=MS)
def qlinear_add(n, a, a_scale, a_zp, b, b_scale, b_zp, c_scale, c_zp=None):
  """As onnxruntime's x86 kernel (MLAS's AVX2 QLinearAdd) computes it: the ratios ra = sa/sc, rb = sb/sc, the fixed
  part zc - fma(ra, za, rb * zb) in float32, then fma(a, ra, fma(b, rb, fixed)) of the raw bytes, rounded half to
  even and saturated: each fused multiply-add rounds once (Tensor.fma; fmaf in the C kernels, a vfmadd where the CPU
  has one); (a - za) * ra + (b - zb) * rb rounds differently, a step apart in 1 of ~3e4."""
  sa, sb, sc = (_f(_scalar(t, w)) for t, w in ((a_scale, "A_scale"), (b_scale, "B_scale"), (c_scale, "C_scale")))
  ra, rb = sa / sc, sb / sc
  za, zb, zc = (_f(_scalar(z, "the zero point")) if z is not None else Tensor(0.0, F32) for z in (a_zp, b_zp, c_zp))
  fixed = zc - ra.fma(za, rb * zb)
  # the raw bytes read as (x - zx) + zx: the widened-less-zero-point form the int8 passes fuse into the producer's
  # kernel (a convolution's requantized output; read as plain bytes, ResNet-18's residual adds became 5 kernels more)
  raw = lambda t, z, zf: _f(t.cast(dtypes.int32) - _zp(z)) + zf
  v = raw(a, a_zp, za).fma(ra, raw(b, b_zp, zb).fma(rb, fixed))
  return _saturate(v.round(), None, _out_type(a, c_zp))


@op("QLinearMul", domain=MS)
def qlinear_mul(n, a, a_scale, a_zp, b, b_scale, b_zp, c_scale, c_zp=None):
  # the product of the integer differences is exact in int32; one float multiplier sa*sb/sc
  sa, sb, sc = (_f(_scalar(t, w)) for t, w in ((a_scale, "A_scale"), (b_scale, "B_scale"), (c_scale, "C_scale")))
  mult = sa * sb / sc
  v = _f((a.cast(dtypes.int32) - _zp(a_zp)) * (b.cast(dtypes.int32) - _zp(b_zp))) * mult
  return _saturate(v.round(), c_zp, _out_type(a, c_zp))


def _zp(zp: Tensor | None):
  return _scalar(zp, "the zero point").cast(dtypes.int32) if zp is not None else 0


@op("QLinearSigmoid", domain=MS)
def qlinear_sigmoid(n, x, x_scale, x_zp, y_scale, y_zp=None):
  return _requant(_dequant(x, x_scale, x_zp).sigmoid(), y_scale, y_zp, _out_type(x, y_zp))


@op("QLinearLeakyRelu", domain=MS)
def qlinear_leaky_relu(n, x, x_scale, x_zp, y_scale, y_zp=None, alpha=0.01):
  v = _dequant(x, x_scale, x_zp)
  return _requant((v < 0).where(v * alpha, v), y_scale, y_zp, _out_type(x, y_zp))


@op("QLinearSoftmax", domain=MS)
def qlinear_softmax(n, x, x_scale, x_zp, y_scale, y_zp=None, axis=None, opset=None):
  """onnxruntime's integer softmax, step for step: e = float32(exp((x - max + shift) * x_scale)) in double, where
  shift keeps a row's float32 sum of e finite; the sum in order; round(e * floor(1 / y_scale) / sum) + y_zp,
  saturated. (x's zero point cancels in x - max.) Below opset 13 the row is everything from axis on, as Softmax-1."""
  if opset is None:
    raise Unsupported("QLinearSoftmax needs its 'opset' attribute (which Softmax it quantizes)")
  if x.dtype not in (dtypes.int8, dtypes.uint8):
    raise Unsupported(f"QLinearSoftmax of {x.dtype.name} (int8 or uint8 expected)")
  axis = (1 if opset < 13 else -1) if axis is None else axis
  axis = axis + x.ndim if axis < 0 else axis
  xs = float(np.float32(n.const(_scalar(x_scale, "X_scale"), "X_scale")))
  ys = np.float32(n.const(_scalar(y_scale, "Y_scale"), "Y_scale"))
  shape = x.shape
  if opset < 13:
    rows = int(np.prod(shape[:axis], dtype=np.int64))
    x, axis = x.reshape(rows, -1), 1
  length = x.shape[axis]
  # the table's shift: exp of it times the row's length stays 5 binary orders under float32's largest value
  shift = max(0.0, np.log(float(np.finfo(np.float32).max) / length) - 5) / xs
  xi = x.cast(dtypes.int32)
  # x - max takes 256 values: e is read from their table, made here with the C library's exp as onnxruntime makes it
  # (the double exp per element was a transformer's costliest kernel)
  table = np.array([math.exp((float(d) + shift) * xs) for d in range(-255, 1)], np.float64).astype(np.float32)
  e = Tensor(table).take(xi - xi.max(axis, keepdim=True) + 255)
  y = e * float(np.floor(np.float32(1.0) / ys)) / e.sum(axis, keepdim=True)
  return _saturate(y.round(), y_zp, _out_type(x, y_zp)).reshape(shape)


# *** pooling and concatenation ***


def _to_channels_first(x: Tensor, channels_last: int) -> Tensor:
  return x.permute((0, x.ndim - 1) + tuple(range(1, x.ndim - 1))) if channels_last else x


def _from_channels_first(x: Tensor, channels_last: int) -> Tensor:
  return x.permute((0,) + tuple(range(2, x.ndim)) + (1,)) if channels_last else x


@op("QLinearGlobalAveragePool", domain=MS)
def qlinear_global_avg_pool(n, x, x_scale, x_zp, y_scale, y_zp=None, channels_last=0):
  # onnxruntime sums the raw integers, removes the zero point once per window, and scales by x_scale/(y_scale*count)
  xc = _to_channels_first(x, channels_last)
  axes = tuple(range(2, xc.ndim))
  count = 1
  for a in axes:
    count *= xc.shape[a]
  acc = xc.cast(dtypes.int32).sum(axes, keepdim=True) - _zp(x_zp) * count
  mult = _f(_scalar(x_scale, "x_scale")) / (_f(_scalar(y_scale, "y_scale")) * float(count))
  y = _saturate((_f(acc) * mult).round(), y_zp, _out_type(x, y_zp))
  return _from_channels_first(y, channels_last)


@op("QLinearAveragePool", domain=MS)
def qlinear_avg_pool(
  n,
  x,
  x_scale,
  x_zp,
  y_scale,
  y_zp=None,
  auto_pad="NOTSET",
  ceil_mode=0,
  channels_last=0,
  count_include_pad=0,
  kernel_shape=None,
  pads=None,
  strides=None,
):
  # onnxruntime dequantizes, pools in float and rounds mean / y_scale + y_zp: the zero point is added before the
  # rounding (a 2x2 mean's halves then tie the other way for an odd zero point)
  v = _to_channels_first(_dequant(x, x_scale, x_zp), channels_last)
  pooled = avg_pool(n, v, auto_pad, ceil_mode, count_include_pad, None, kernel_shape, pads, strides)
  q = pooled / _f(_scalar(y_scale, "y_scale"))
  if y_zp is not None:
    q = q + _f(_scalar(y_zp, "y_zero_point"))
  return _from_channels_first(_saturate(q.round(), None, _out_type(x, y_zp)), channels_last)


@op("QLinearConcat", domain=MS)
def qlinear_concat(n, y_scale, y_zp, *xs, axis=0):
  if len(xs) % 3:
    raise Unsupported(f"inputs after Y_scale and Y_zero_point come in (X, scale, zero point) triples, got {len(xs)}")
  dt = y_zp.dtype
  parts = []
  for x, s, z in zip(xs[0::3], xs[1::3], xs[2::3]):
    parts.append(
      x if _same_quantization(n, (s, z), (y_scale, y_zp)) else _requant(_dequant(x, s, z), y_scale, y_zp, dt)
    )
  return Tensor.cat(parts, axis % parts[0].ndim)


def _same_quantization(n, a: tuple, b: tuple) -> bool:
  """Whether the (scale, zero point) pairs a and b are the same constants: an input at the output's quantization is
  copied, as onnxruntime's QLinearConcat does (requantized, round(s (x - z) / s) + z is x again, but computed on every
  element: QOperator DenseNet's concats each requantized all the channels before them)."""
  try:
    (sa, za), (sb, zb) = ((n.const(s, "a scale"), n.const(z, "a zero point")) for s, z in (a, b))
  except NeedsConstant:
    return False
  return za.dtype == zb.dtype and np.array_equal(sa, sb) and np.array_equal(za, zb)


# *** products ***


def _rows(scale: Tensor, ndim: int) -> Tensor:
  """A per-tensor or per-column (last axis) scale shaped to broadcast against a matmul result."""
  return scale.reshape(()) if scale.numel() == 1 else scale.reshape((1,) * (ndim - 1) + (-1,))


def _int_mm(a: Tensor, a_zp, b: Tensor, b_zp) -> Tensor:
  """(a - za) @ (b - zb) accumulated exactly in int32; b's zero point may be per column."""
  bz = _zp32(b_zp)
  if isinstance(bz, Tensor) and bz.numel() > 1:
    bz = bz.reshape(1, -1)
  elif isinstance(bz, Tensor):
    bz = bz.reshape(())
  return (a.cast(dtypes.int32) - _zp(a_zp)).matmul(b.cast(dtypes.int32) - bz)


def _u8_weights_offset(n, w: Tensor, w_zp: Tensor | None) -> np.ndarray | None:
  """128 - w_zp (int32, per tensor or per output channel) for uint8 weights w whose constant zero point is not 128,
  else None. Their w - w_zp spans up to [-255, 255], past the int8 the microkernel packs; split as
  (a - za)(w - zw) = (a - za)(w - 128) + (128 - zw) * sum_k (a - za), exactly, the first term's weights are int8 and
  the second is the activations' row sum (one pass over them) times a constant per channel."""
  if w.dtype != dtypes.uint8 or w_zp is None:
    return None
  try:
    z = n.const(w_zp, "the weights' zero point")
  except NeedsConstant:
    return None
  return None if np.all(z == 128) else (128 - z.astype(np.int32)).reshape(-1)


def _int_mm_split(n, a: Tensor, a_zp, b: Tensor, b_zp) -> Tensor:
  """_int_mm(a, a_zp, b, b_zp), b's uint8 weights split around 128 where _u8_weights_offset says so."""
  offset = _u8_weights_offset(n, b, b_zp) if n is not None else None
  if offset is None:
    return _int_mm(a, a_zp, b, b_zp)
  rows = (a.cast(dtypes.int32) - _zp(a_zp)).sum(-1, keepdim=True).contiguous()
  per_column = Tensor(offset.reshape(1, -1) if offset.size > 1 else offset.reshape(()))
  return _int_mm(a, a_zp, b, Tensor(np.array(128, np.int32))) + rows * per_column


@op("QGemm", domain=MS)
def qgemm(n, a, a_scale, a_zp, b, b_scale, b_zp, c=None, y_scale=None, y_zp=None, alpha=1.0, transA=0, transB=0):
  if transA:
    a = a.T
  if transB:
    b = b.T
  acc = _int_mm_split(n, a, a_zp, b, b_zp)
  # C is an int32 bias in the accumulator's scale (a_scale * b_scale)
  if c is not None:
    acc = acc + c.cast(dtypes.int32)
  mult = _f(_scalar(a_scale, "a_scale")) * _rows(_f(b_scale), acc.ndim) * alpha
  if y_scale is None:
    return _f(acc) * mult
  return _saturate((_f(acc) * (mult / _f(_scalar(y_scale, "y_scale")))).round(), y_zp, _out_type(a, y_zp))


@op("MatMulIntegerToFloat", domain=MS)
def matmul_integer_to_float(n, a, b, a_scale, b_scale, a_zp=None, b_zp=None, bias=None):
  y = _f(_int_mm_split(n, a, a_zp, b, b_zp)) * (
    _f(_scalar(a_scale, "a_scale")) * _rows(_f(b_scale), max(a.ndim, b.ndim))
  )
  return y + bias if bias is not None else y


# A tensor's min or max is reduced in RANGE_PARTS parts, each folded elementwise from RANGE_FOLDS slices into one and
# then reduced in RANGE_LANES interleaved lanes, and last over those partials: the parts split over threads (one
# scalar chain cannot), the lanes are independent chains the upcast vectorises, and the folds shorten each chain
# (its latency bounds the loop). 128x1024 floats, 1 thread: 0.20 ms as one chain, 0.036 ms in 16 parts of 16 lanes
# (16x8, 16x32, 32x16 the same), 0.016 folding 4 slices (2: 0.018, 8: 0.019); 128x256: 0.0076 -> 0.0027 ms.
# Where its rows are long enough, each row is folded and laned the same way instead (_whole_by_rows: the rows split
# over threads): the dynamically quantized transformer, 1 thread, 1.43 -> 1.30 ms at 128 tokens, 0.93 -> 0.62 at 61
# (the parts of 61 x 1024 reduced 61 steps each); 2 threads 1.05 -> 0.90, 0.79 -> 0.49.
RANGE_PARTS = 16
RANGE_FOLDS = 4
RANGE_LANES = 16
# smaller tensors (under 4 elements a lane) cost about a call's overhead either way: one reduction
RANGE_MIN_GROUPS = 4


def _whole(x: Tensor, op: str) -> Tensor:
  """x reduced to a scalar by op ("min" or "max"), in parts when it is large enough (RANGE_PARTS); the same value as
  one reduction over x: min and max are exact in any order, and NaN-aware (a NaN anywhere is the result)."""
  from aot.frontends.batch_dims import tracing_for_range

  if tracing_for_range() or _by_rows(x):
    return _whole_by_rows(x, op)
  flat = x.reshape(-1)
  group = RANGE_PARTS * RANGE_FOLDS * RANGE_LANES
  n = flat.shape[0] // group * group
  if n < group * RANGE_MIN_GROUPS:
    return getattr(flat, op)()
  slices = flat.shrink([(0, n)]).reshape(RANGE_PARTS, RANGE_FOLDS, -1, RANGE_LANES)
  folded = slices[:, 0]
  for i in range(1, RANGE_FOLDS):
    folded = _pick(folded, slices[:, i], op)
  whole = getattr(getattr(folded, op)(axis=1).contiguous(), op)()
  if n < flat.shape[0]:
    whole = _pick(whole, getattr(flat.shrink([(n, flat.shape[0])]), op)(), op)
  return whole


def _whole_by_rows(x: Tensor, op: str) -> Tensor:
  """_whole over x's axes as they are (with a ranged dim in x, parts of the flat tensor would merge the dim with the
  others): each row's last axis folded from RANGE_FOLDS slices and reduced in RANGE_LANES lanes where it is long
  enough (_by_rows), then the partials of every row."""
  if not _by_rows(x):
    return getattr(x, op)()
  last, group = x.shape[-1], RANGE_FOLDS * RANGE_LANES
  slices = x.reshape(x.shape[:-1] + (RANGE_FOLDS, last // RANGE_FOLDS))
  folded = slices[..., 0, :]
  for i in range(1, RANGE_FOLDS):
    folded = _pick(folded, slices[..., i, :], op)
  lanes = folded.reshape(x.shape[:-1] + (last // group, RANGE_LANES))
  return getattr(getattr(lanes, op)(axis=-2).contiguous(), op)()


def _by_rows(x: Tensor) -> bool:
  """Are x's rows long enough to fold (whole groups of RANGE_FOLDS x RANGE_LANES, RANGE_MIN_GROUPS of them)?"""
  group = RANGE_FOLDS * RANGE_LANES
  return x.ndim >= 2 and x.shape[-1] % group == 0 and x.shape[-1] >= group * RANGE_MIN_GROUPS


def _pick(a: Tensor, b: Tensor, op: str) -> Tensor:
  """The NaN-aware min or max of a and b as two selects: gcc, whose vectoriser is off in reducing kernels, branches
  on Tensor.minimum's `a < b || a != a` form, an unpredictable branch here (the folds took 0.33 ms, not 0.056)."""
  # b's NaN test is b != b for the min and b == b for the max: one node read by both ends' kernels would be staged
  if op == "min":
    return (b != b).where(b, (b < a).where(b, a))
  return (b == b).where((a < b).where(b, a), b)


def dynamic_qparams(x: Tensor) -> tuple[Tensor, Tensor]:
  """onnxruntime's uint8 scale and zero point for x: the range widened to hold 0, scale 1 when it is empty, the zero
  point clamped to [0, 255] before it is rounded."""
  # the minimum is a buffer of its own: else the quantizing kernel, which needs it for the zero point, recomputes it
  # (a scalar pass over the whole tensor, 0.2 ms of the reference transformer's 0.22 ms quantize over 128x1024)
  lo, hi = _whole(_f(x), "min").minimum(0.0).contiguous(), _whole(_f(x), "max").maximum(0.0)
  scale = (hi == lo).where(1.0, (hi - lo) / 255.0)
  zp = (0.0 - lo / scale).maximum(0.0).minimum(255.0).round().cast(dtypes.uint8)
  return scale, zp


@op("DynamicQuantizeLinear", since=11)
def dynamic_quantize_linear(n, x):
  scale, zp = dynamic_qparams(x)
  return _requant(_f(x), scale, zp, dtypes.uint8), scale, zp


@op("DynamicQuantizeMatMul", domain=MS)
def dynamic_quantize_matmul(n, a, b, b_scale, b_zp=None, bias=None):
  scale, zp = dynamic_qparams(a)
  qa = _requant(_f(a), scale, zp, dtypes.uint8)
  return matmul_integer_to_float(n, qa, b, scale, b_scale, zp, b_zp, bias)


# *** the ai.onnx quantisation ops: QuantizeLinear, DequantizeLinear, QLinearMatMul, QLinearConv ***


def _qparam(s, x, axis, block_size):
  """A scale/zero point shaped to broadcast against x: per tensor, per axis, or blocked along axis."""
  if s.ndim == 0 or s.numel() == 1 and block_size == 0:
    return s.reshape(())
  axis = axis % x.ndim
  if s.ndim == 1 and not block_size:
    return s.reshape([-1 if i == axis else 1 for i in range(x.ndim)])
  # blocked: repeat each entry block_size times along axis, then cut to x's length
  rep = s.unsqueeze(axis + 1)
  rep = rep.expand(rep.shape[: axis + 1] + (block_size,) + rep.shape[axis + 2 :])
  rep = rep.reshape(s.shape[:axis] + (s.shape[axis] * block_size,) + s.shape[axis + 1 :])
  return rep.shrink([(0, x.shape[axis]) if i == axis else None for i in range(x.ndim)])


_QTYPES = (dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32)

# the range a quantized narrow int saturates to
_NARROW_INT_RANGE = {"int4": (-8, 7), "uint4": (0, 15), "int2": (-2, 1), "uint2": (0, 3)}


def _quantize(x, scale, zp, out_dt, saturate: bool = True):
  """out_dt: a DType or a narrow type (aot/core/dtype.py: NARROW); the narrow floats round and saturate as Cast does."""
  f = narrow.narrow_of(out_dt)
  if f is None and out_dt not in _QTYPES:
    raise Unsupported(f"quantize to {out_dt.name}")
  q = x.cast(dtypes.float32) / scale.cast(dtypes.float32)
  if f is not None and f.is_float:
    if zp is not None:
      q = q + zp
    return narrow.Stored(narrow.encode(q, f, saturate), f)
  q = q.round()
  if zp is not None:
    q = q + zp.cast(dtypes.float32)
  lo, hi = _NARROW_INT_RANGE[f.name] if f is not None else (min_value(out_dt), max_value(out_dt))
  q = q.maximum(float(lo)).minimum(float(hi))
  return narrow.Stored(q.cast(f.storage), f) if f is not None else q.cast(out_dt)


def _wide(t):
  """A quantization parameter or input in its computing type: a narrow float decoded, a narrow int's values."""
  f = narrow.fmt_of(t)
  return narrow.decode(t, f) if f is not None and f.is_float else t


@op("QuantizeLinear", since=10)
def quantize_linear(n, x, y_scale, y_zero_point=None, axis=1, saturate=1, block_size=0, output_dtype=0, precision=0):
  zp_type = None if y_zero_point is None else narrow.fmt_of(y_zero_point) or y_zero_point.dtype
  out_dt = zp_type or (onnx_type(output_dtype) if output_dtype else dtypes.uint8)
  x, y_scale = _wide(x), _wide(y_scale)
  s = _qparam(y_scale, x, axis, block_size)
  z = _qparam(_wide(y_zero_point), x, axis, block_size) if y_zero_point is not None else None
  return _quantize(x, s, z, out_dt, bool(saturate))


@op("DequantizeLinear", since=10)
def dequantize_linear(n, x, x_scale, x_zero_point=None, axis=1, block_size=0, output_dtype=0):
  out = onnx_type(output_dtype) if output_dtype else narrow.fmt_of(x_scale) or x_scale.dtype
  x, x_scale = _wide(x), _wide(x_scale)
  s = _qparam(x_scale, x, axis, block_size)
  xf = x.cast(dtypes.float32)
  if x_zero_point is not None:
    xf = xf - _qparam(_wide(x_zero_point), x, axis, block_size).cast(dtypes.float32)
  return narrow.convert(xf * s.cast(dtypes.float32), out)


# QLinearMatMul and QLinearConv: int32 accumulation, then one float multiplier, as onnxruntime computes them (a float
# product of dequantized values would round differently near half steps).
# a sum of K products of 8-bit differences (each at most 255 * 255) is an integer whose every partial sum float32
# holds exactly while K * 255 * 255 < 2^24 (K <= 258), in any order and with fused multiply-adds
FLOAT_EXACT_TERMS = (1 << 24) // (255 * 255)


@op("QLinearMatMul", since=10)
def qlinear_matmul(n, a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp):
  if not b.from_constants() and a.shape[-1] <= FLOAT_EXACT_TERMS:
    # two activations (attention's Q.K^T and P.V): the int8 microkernel packs its B at compile time, the float GEMM
    # takes run-time and batched operands, and is exact here (FLOAT_EXACT_TERMS). The 8-bit operands are stored
    # first: their producers (a QGemm's requantized projection) stay int8 contractions of their own
    a_f, b_f = (_f(t.contiguous().cast(dtypes.int32) - _zp32(z)) for t, z in ((a, a_zp), (b, b_zp)))
    acc = a_f.matmul(b_f).cast(dtypes.int32)
  elif _u8_weights_offset(n, b, b_zp) is not None and a_zp.numel() == 1:
    acc = _int_mm_split(n, a, a_zp, b, b_zp)
  else:
    acc = (a.cast(dtypes.int32) - _zp32(a_zp)).matmul(b.cast(dtypes.int32) - _zp32(b_zp))
  return _requant_acc(
    acc, a_scale.cast(dtypes.float32) * b_scale.cast(dtypes.float32) / y_scale.cast(dtypes.float32), y_zp, a.dtype
  )


def _requant_acc(acc, mult, y_zp, fallback):
  """The int32 accumulator acc scaled by the float multiplier mult into y_zp's type (fallback without one)."""
  # onnxruntime rounds the scaled accumulator and then adds the zero point (adding it first can round a fraction away)
  d = (acc.cast(dtypes.float32) * mult).round()
  if y_zp is not None:
    d = d + y_zp.cast(dtypes.float32)
  dt = y_zp.dtype if y_zp is not None else fallback
  return d.maximum(float(min_value(dt))).minimum(float(max_value(dt))).cast(dt)


@op("QLinearConv", since=10)
def qlinear_conv(
  n,
  x,
  x_scale,
  x_zp,
  w,
  w_scale,
  w_zp,
  y_scale,
  y_zp,
  b=None,
  auto_pad="NOTSET",
  dilations=None,
  group=1,
  kernel_shape=None,
  pads=None,
  strides=None,
):
  offset = _u8_weights_offset(n, w, w_zp) if group == 1 else None
  if offset is None:
    acc = conv_integer(n, x, w, x_zp, w_zp, auto_pad, dilations, group, kernel_shape, pads, strides)
  else:
    # uint8 weights split around 128 (_u8_weights_offset). The row sum is each window's sum of x - x_zp over the
    # channels: the channels' sum first, then its window sums (a convolution by ones, padding 0: the padded x is its
    # zero point), (C + kh * kw) adds an output, not C * kh * kw (a 64-channel 3x3 at 56x56: 0.80 ms as one sum)
    plane = (x.cast(dtypes.int32) - _zp32(x_zp)).sum(1, keepdim=True).contiguous()
    ones = Tensor(np.ones((1, 1) + w.shape[2:], np.int8))
    rows = conv_integer(n, plane, ones, None, None, auto_pad, dilations, 1, kernel_shape, pads, strides).contiguous()
    acc = conv_integer(
      n, x, w, x_zp, Tensor(np.array(128, np.int32)), auto_pad, dilations, group, kernel_shape, pads, strides
    )
    acc = acc + rows * Tensor(offset.reshape((1, -1) + (1,) * (x.ndim - 2)))
  if b is not None:
    acc = acc + b.cast(dtypes.int32).reshape((1, -1) + (1,) * (x.ndim - 2))
  ws = w_scale.cast(dtypes.float32)
  if ws.ndim == 1 and ws.shape[0] > 1:
    ws = ws.reshape((1, -1) + (1,) * (x.ndim - 2))
  return _requant_acc(acc, x_scale.cast(dtypes.float32) * ws / y_scale.cast(dtypes.float32), y_zp, x.dtype)


# *** DynamicQuantizeLSTM: an LSTM whose two products quantize their float operand on the fly ***


def _dq_product(a: Tensor, w: Tensor, w_scale: Tensor, w_zp: Tensor | None) -> Tensor:
  """a (M, K) float @ w (K, N) integer as onnxruntime's quantized LSTM GEMM: a quantized to uint8 as one tensor, the
  int32 product scaled by a_scale * w_scale (per tensor or per column)."""
  scale, zp = dynamic_qparams(a)
  qa = _requant(_f(a), scale, zp, dtypes.uint8)
  return matmul_integer_to_float(None, qa, w, scale, w_scale, zp, w_zp)


@op("DynamicQuantizeLSTM", domain=MS)
def dynamic_quantize_lstm(
  n,
  x,
  w,
  r,
  b=None,
  sequence_lens=None,
  initial_h=None,
  initial_c=None,
  p=None,
  w_scale=None,
  w_zp=None,
  r_scale=None,
  r_zp=None,
  activation_alpha=None,
  activation_beta=None,
  activations=None,
  clip=None,
  direction="forward",
  hidden_size=None,
  input_forget=0,
):
  if w_scale is None or r_scale is None:
    raise Unsupported("W_scale and R_scale are required")
  # W and R come transposed against ONNX LSTM's: (dirs, input, 4H) and (dirs, H, 4H)
  x, T, B, H, ndir, b, h0, lens = _rnn_setup(n, x, w, r.transpose(-1, -2), b, sequence_lens, initial_h, 0, direction, 4)
  acts = _activations(activations, activation_alpha, activation_beta, ["Sigmoid", "Tanh", "Tanh"], ndir)
  # scales and zero points are (dirs,) or (dirs, 4H): one per direction, per tensor or per gate column
  per_dir = lambda t, d: t[d] if t is not None else None
  # the input product runs once over every step (onnxruntime quantizes the whole sequence with one scale)
  xw = [
    _dq_product(x.reshape(T * B, -1), w[d], per_dir(w_scale, d), per_dir(w_zp, d)).reshape(T, B, 4 * H)
    for d in range(ndir)
  ]
  proj = Tensor.stack(xw, axis=1)  # (T, dirs, B, 4H)

  def step(d, xt, st):
    gts = xt[d] + _dq_product(st[0], r[d], per_dir(r_scale, d), per_dir(r_zp, d)) + b[d][: 4 * H] + b[d][4 * H :]
    return lstm_cell([acts[d]], gts, st[1], p[d] if p is not None else None, H, clip, input_forget)

  zeros = Tensor(np.zeros((B, H), dtype=np.float32))
  init = lambda d: (h0[d] if h0 is not None else zeros, initial_c[d] if initial_c is not None else zeros)
  return _rnn_outputs(*_run_dirs(proj, T, ndir, direction, lens, step, init), 0, x.dtype)
