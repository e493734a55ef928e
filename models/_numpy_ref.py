"""Plain-numpy reference ops shared by the bundled models' reference forwards.

Deliberately independent of aot (no aot import) so the references check the compiler rather than mirror it.
Everything is computed in float64; callers cast the final result to float32.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


def _pair(v) -> tuple[int, int]:
  return (v, v) if isinstance(v, int) else tuple(v)


def linear(x, w, b=None):
  y = x @ w.T.astype(np.float64)
  return y if b is None else y + b


def relu(x):
  return np.maximum(x, 0.0)


def conv2d(x, w, b=None, stride=1, padding=0):
  """NCHW cross-correlation, groups=1, dilation=1: im2col through a strided window view, then one tensordot (BLAS)."""
  (sh, sw), (ph, pw) = _pair(stride), _pair(padding)
  x = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
  win = sliding_window_view(x, w.shape[2:], axis=(2, 3))[:, :, ::sh, ::sw]  # (N, Cin, OH, OW, KH, KW)
  y = np.tensordot(win, w.astype(np.float64), axes=((1, 4, 5), (1, 2, 3)))  # (N, OH, OW, Cout)
  y = y.transpose(0, 3, 1, 2)
  return y if b is None else y + b[:, None, None]


def max_pool2d(x, k, stride=None, padding=0):
  (kh, kw), (sh, sw), (ph, pw) = _pair(k), _pair(k if stride is None else stride), _pair(padding)
  # -inf padding: a window that overlaps the border must never pick the pad value
  x = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=-np.inf)
  return sliding_window_view(x, (kh, kw), axis=(2, 3))[:, :, ::sh, ::sw].max(axis=(4, 5))


def batchnorm(x, mean, var, weight, bias, eps=1e-5):
  scale = weight / np.sqrt(var.astype(np.float64) + eps)
  return (x - mean[:, None, None]) * scale[:, None, None] + bias[:, None, None]


def layernorm(x, weight, bias, eps=1e-5):
  mu = x.mean(axis=-1, keepdims=True)
  var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)  # biased variance, as torch/ONNX
  return (x - mu) / np.sqrt(var + eps) * weight + bias


def softmax(x, axis=-1):
  e = np.exp(x - x.max(axis=axis, keepdims=True))
  return e / e.sum(axis=axis, keepdims=True)


_erf = np.frompyfunc(math.erf, 1, 1)  # exact libm erf; polynomial approximations are not accurate enough


def gelu(x):
  return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)).astype(np.float64))
