"""Float com.microsoft operators that onnxruntime's transformer optimizer fuses graphs into (Gelu,
SkipLayerNormalization, FusedConv, ...), and the layer norms onnxruntime registers in the default domain before
opset 17. Each is written with the same Tensor ops the unfused graph would have used."""

from __future__ import annotations

from aot.frontends.onnx import Unsupported, onnx_dtype, op
from aot.frontends.onnx_ops_nn import _mm, conv, layer_norm

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


@op("SkipLayerNormalization", domain=MS)
def skip_layer_norm(n, x, skip, gamma, beta=None, bias=None, epsilon=1e-12):
  """LayerNormalization(x + skip + bias) over the last axis; outputs y, mean, 1/std and the sum itself."""
  s = _skip_sum(x, skip, bias)
  y, mean, inv = layer_norm(n, s, gamma, beta, -1, epsilon)
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
