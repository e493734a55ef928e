"""Float com.microsoft operators that onnxruntime's transformer optimizer fuses graphs into (Gelu,
SkipLayerNormalization, FusedConv, ...), and the layer norms onnxruntime registers in the default domain before
opset 17. Each is written with the same Tensor ops the unfused graph would have used."""

from __future__ import annotations

import functools

from aot.core.dtype import dtypes
from aot.frontends.onnx import Unsupported, onnx_dtype, op
from aot.frontends.onnx_ops_nn import _mm, conv, layer_norm
from aot.frontends.tensor import function

MS = "com.microsoft"

# *** activations ***


@op("Gelu", domain=MS)
def gelu(n, x):
  return x.gelu().cast(x.dtype)


@op("BiasGelu", domain=MS)
def bias_gelu(n, a, b):
  return (a + b).gelu().cast(a.dtype)


@op("FastGelu", domain=MS)
def fast_gelu(n, x, bias=None):
  if bias is not None:
    x = x + bias
  return x.gelu("tanh").cast(x.dtype)


@op("QuickGelu", domain=MS)
def quick_gelu(n, x, alpha=1.702):
  return (x * (x * alpha).sigmoid()).cast(x.dtype)


# *** layer norms ***

# onnxruntime's LayerNormalization from opset 1 (the ONNX one arrived in 17 with the same meaning)
op("LayerNormalization", since=1)(layer_norm)
op("LayerNormalization", domain=MS)(layer_norm)


@op("SimplifiedLayerNormalization", since=1)
def simplified_layer_norm(n, x, scale, axis=-1, epsilon=1e-5, stash_type=1):
  """x / sqrt(mean(x^2) + epsilon) * scale over the axes from `axis` on; second output 1/sqrt(mean(x^2) + epsilon)."""
  axes = tuple(range(axis % x.ndim, x.ndim))
  xs = x.cast(onnx_dtype(stash_type))
  inv = ((xs * xs).mean(axes, keepdim=True) + epsilon).rsqrt()
  return (xs * inv).cast(x.dtype) * scale, inv


op("SimplifiedLayerNormalization", domain=MS)(simplified_layer_norm)


def _skip_sum(x, skip, bias):
  s = x + skip
  return s + bias if bias is not None else s


# rows per group in the Welford recurrence's inner loop (a 16-float AVX-512 vector; fewer where they do not divide)
WELFORD_LANES = 16
# steps of the recurrence per kernel: clang-19 left a loop of 252 steps scalar (248: vectorised)
WELFORD_STEPS = 128


def _pack(a, b):
  """Two float32 tensors as one uint64 each (a in the low word): one kernel stores both."""
  return a.bitcast(dtypes.uint32).cast(dtypes.uint64) | (b.bitcast(dtypes.uint32).cast(dtypes.uint64) << 32)


def _unpack(w):
  low = (w & 0xFFFFFFFF).cast(dtypes.uint32).bitcast(dtypes.float32)
  return low, (w >> 32).cast(dtypes.uint32).bitcast(dtypes.float32)


def _welford_layer_norm(s, gamma, beta, epsilon):
  """LayerNormalization over the last axis of float32 s as onnxruntime's CPU SkipLayerNormalization computes it
  (its x86-64 build, read off the machine code and matched bit for bit): Welford's running mean and sum of squared
  deviations, one term after another, each step rounded (delta = v - mean; mean += delta / i; m2 += (v - mean) *
  delta; no fused multiply-add), then std = sqrt(m2 / d + epsilon), y = (s - mean) / std * gamma + beta (a division
  per element) and 1 / std. Its mean is the float32 recurrence's, not the double sum rounded once of the plain
  LayerNormalization kernel: ours had the double's, a ulp or more from onnxruntime's in 90% of the rows, which the
  dynamically quantized transformer's next DynamicQuantizeLinear scale turned into 3-4e-3 of the output (seeds 7 and
  9, issue 14).

  The rows go in groups of `lanes`, the inner loop of known length, which the C compiler vectorises across rows (a
  loop over all the rows it left one row at a time, latency bound: 128 rows of 256 in 0.13 ms, grouped 0.05; it
  reads each step's column at the row stride: a transposed copy to read it contiguously cost more, 0.028 ms, than
  the recurrence, which waits on each step's division anyway). The state between kernels of WELFORD_STEPS steps,
  and the row's mean and std for the output, are stored packed (_pack): as two stages each kernel would read the
  chain's steps, and the scheduler then stores every step (a kernel per step)."""
  mean, std = _unpack(_welford_rows(s.shape, float(epsilon))(s).reshape(s.shape[:-1] + (1,)))
  y = (s - mean) / std * gamma
  if beta is not None:
    y = y + beta
  return y, mean, std.reciprocal()


@functools.lru_cache(maxsize=16)
def _welford_rows(shape: tuple, epsilon: float):
  """The recurrence over rows of this shape, as a function traced once (its calls are inlined before scheduling): an
  encoder's layer norms each traced their 384 steps anew, 0.1 s apiece. -> rows' (mean, std), packed."""

  @function
  def welford_rows(s):
    d = s.shape[-1]
    rows = s.numel() // d
    lanes = next((n for n in (WELFORD_LANES, 8, 4, 2) if rows % n == 0), 1)
    cols = s.reshape(rows // lanes, lanes, d).permute(2, 0, 1)
    # the first step: mean = v0, m2 = (v0 - v0) * v0 = 0
    mean, m2 = cols[0], cols[0] * 0.0
    for i in range(1, d):
      if i % WELFORD_STEPS == 0:
        mean, m2 = _unpack(_pack(mean, m2).contiguous())
      v = cols[i]
      delta = v - mean
      mean = mean + delta / float(i + 1)
      m2 = m2 + (v - mean) * delta
    std = (m2 / float(d) + epsilon).sqrt()
    return _pack(mean, std).contiguous()

  return welford_rows


@op("SkipLayerNormalization", domain=MS)
def skip_layer_norm(n, x, skip, gamma, beta=None, bias=None, epsilon=1e-12):
  """LayerNormalization(x + skip + bias) over the last axis; outputs y, mean, 1/std and the sum itself."""
  s = _skip_sum(x, skip, bias)
  if s.dtype != dtypes.float32:
    y, mean, inv = layer_norm(n, s, gamma, beta, -1, epsilon)
    return y, mean, inv, s
  y, mean, inv = _welford_layer_norm(s, gamma, beta, epsilon)
  return y, mean, inv, s


@op("SkipSimplifiedLayerNormalization", domain=MS)
def skip_simplified_layer_norm(n, x, skip, gamma, bias=None, epsilon=1e-12):
  s = _skip_sum(x, skip, bias)
  y, inv = simplified_layer_norm(n, s, gamma, -1, epsilon)
  # the second output (mean) is declared but not computed by onnxruntime: it stays unset here too
  return y, None, inv, s


# *** fused products ***

_FUSED_ACTIVATIONS = {
  "Relu": lambda y, p: y.relu(),
  "Tanh": lambda y, p: y.tanh(),
  "Sigmoid": lambda y, p: y.sigmoid(),
  "LeakyRelu": lambda y, p: (y < 0).where(y * (p[0] if p else 0.01), y),
  "Clip": lambda y, p: y.maximum(p[0]).minimum(p[1]),
  "HardSigmoid": lambda y, p: (y * (p[0] if p else 0.2) + (p[1] if len(p) > 1 else 0.5)).maximum(0).minimum(1),
}


@op("FusedConv", domain=MS)
def fused_conv(
  n,
  x,
  w,
  b=None,
  z=None,
  activation="",
  activation_params=None,
  auto_pad="NOTSET",
  dilations=None,
  group=1,
  kernel_shape=None,
  pads=None,
  strides=None,
):
  """Conv, plus Z (a residual added before the activation), then the activation."""
  y = conv(n, x, w, b, auto_pad, dilations, group, kernel_shape, pads, strides)
  if z is not None:
    y = y + z
  if not activation:
    return y
  if activation not in _FUSED_ACTIVATIONS:
    raise Unsupported(f"activation {activation!r}")
  params = [float(v) for v in (activation_params or [])]
  if activation == "Clip" and len(params) != 2:
    raise Unsupported("Clip activation needs activation_params [min, max]")
  return _FUSED_ACTIVATIONS[activation](y, params).cast(x.dtype)


@op("FusedMatMul", domain=MS)
def fused_matmul(n, a, b, alpha=1.0, transA=0, transB=0, transBatchA=0, transBatchB=0):
  """alpha * op(A) @ op(B), op transposing the last two axes."""
  if transBatchA or transBatchB:
    raise Unsupported("transBatchA/transBatchB")
  if transA:
    a = a.transpose(-1, -2) if a.ndim >= 2 else a
  if transB:
    b = b.transpose(-1, -2) if b.ndim >= 2 else b
  y = _mm(a, b)
  return (y * alpha).cast(y.dtype) if alpha != 1.0 else y
