"""The neural-network methods of the lazy Tensor (aot/frontends/tensor.py): matmul and linear, convolution, pooling,
softmax and normalisation, all composed from the elementwise, reduction and movement methods. A mixin Tensor inherits,
so every method is Tensor's."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from aot.core.dtype import min_value
from aot.core.ir import prod
from aot.errors import InvalidValueError
from aot.frontends.winograd import constant_weights, winograd_conv, winograd_fits

if TYPE_CHECKING:
  from aot.frontends.tensor import Tensor


def _tuple(x, n: int) -> tuple[int, ...]:
  return (x,) * n if isinstance(x, int) else tuple(x)


class TensorNN:
  """Tensor's linear algebra and network layers."""

  __slots__ = ()

  # *** linear algebra and networks ***
  def matmul(self, other: Tensor) -> Tensor:
    a, b = self, other if isinstance(other, TensorNN) else type(self)(other)
    if a.ndim == 0 or b.ndim == 0:
      raise InvalidValueError("matmul needs tensors of rank >= 1")
    va, vb = a.ndim == 1, b.ndim == 1
    if va:
      a = a.reshape(1, -1)
    if vb:
      b = b.reshape(-1, 1)
    if a.shape[-1] != b.shape[-2]:
      raise InvalidValueError(f"matmul: {self.shape} @ {other.shape}: inner sizes differ")
    # (..., M, 1, K) * (..., 1, N, K) summed over K: the reduce is the innermost loop
    prod_ = a.reshape(a.shape[:-1] + (1, a.shape[-1])) * b.transpose(-1, -2).reshape(
      b.shape[:-2] + (1, b.shape[-1], b.shape[-2])
    )
    out = prod_.sum(-1)
    if va:
      out = out.squeeze(-2)
    if vb:
      out = out.squeeze(-1)
    return out

  def dot(self, other):
    return self.matmul(other)

  def linear(self, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    out = self.matmul(weight.T)
    return out + bias if bias is not None else out

  def _windows(self, kernel, stride, dilation) -> Tensor:
    """Sliding windows over the last len(kernel) axes: (..., L1..Ln) -> (..., O1..On, K1..Kn), window (o, k) reading
    element o*s + k*d. Built from movement ops only (so it becomes index arithmetic): repeat the axis R times, view the
    R*L elements as rows of width W = d + m*L, so that row k starts at k*W == k*d (mod L); then take every s-th."""
    n, x = len(kernel), self
    pre = self.ndim - n
    for i in reversed(range(n)):
      ax, L, K, s, d = pre + i, x.shape[pre + i], kernel[i], stride[i], dilation[i]
      O = (L - d * (K - 1) - 1) // s + 1
      if O <= 0:
        raise InvalidValueError(f"window {K} (dilation {d}) does not fit an axis of size {L}")
      m = max(0, -(-(O * s - d) // L))
      W = d + m * L
      R = -(-(K * W) // L)
      head, tail = x.shape[:ax], x.shape[ax + 1 :]
      x = x.reshape(head + (1, L) + tail).expand(head + (R, L) + tail).reshape(head + (R * L,) + tail)
      x = x.shrink([(0, K * W) if j == ax else None for j in range(x.ndim)]).reshape(head + (K, W) + tail)
      x = x.shrink([(0, O * s) if j == ax + 1 else None for j in range(x.ndim)])
      if s > 1:
        x = x.reshape(head + (K, O, s) + tail).shrink(
          [(0, 1) if j == ax + 2 else None for j in range(len(head) + 3 + len(tail))]
        )
        x = x.reshape(head + (K, O) + tail)
    # axes are now (..., K1, O1, K2, O2, ...): put the windows last
    out = x.permute(tuple(range(pre)) + tuple(pre + 2 * i + 1 for i in range(n)) + tuple(pre + 2 * i for i in range(n)))
    from aot.frontends.batch_dims import Windows, note_windows

    # (the movement ops between are taken whole by the proof of a ranged dim: frontends/extent_dims.py)
    note_windows(Windows(self.uop, tuple(kernel), tuple(stride), tuple(dilation)), out.uop)
    return out

  def _pad_spatial(self, padding, n: int, value=0.0) -> Tensor:
    pads = _spatial_pads(padding, n)
    return self.pad([(0, 0)] * (self.ndim - n) + pads, value) if any(p != (0, 0) for p in pads) else self

  def conv(
    self, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0, dilation=1, groups: int = 1
  ) -> Tensor:
    """N-d convolution, channels first: x (N, C, *spatial), weight (Cout, C/groups, *kernel)."""
    n = weight.ndim - 2
    N, C = self.shape[:2]
    cout, cg, kernel = weight.shape[0], weight.shape[1], weight.shape[2:]
    if self.ndim != n + 2:
      raise InvalidValueError(f"conv: input rank {self.ndim} does not match weight rank {weight.ndim}")
    if C != cg * groups or cout % groups:
      raise InvalidValueError(
        f"conv: input has {C} channels, weight {weight.shape} with groups={groups} expects {cg * groups}"
      )
    stride, dilation = _tuple(stride, n), _tuple(dilation, n)
    x, weight, padding = self._live_taps(weight, stride, _spatial_pads(padding, n), dilation)
    if winograd_fits(x, weight, stride, padding, dilation, groups) and (w := constant_weights(weight)) is not None:
      out = winograd_conv(x, w, padding)
      return out + bias.reshape((1, cout, 1, 1)) if bias is not None else out
    kernel = weight.shape[2:]
    x = x._pad_spatial(padding, n)._windows(kernel, stride, dilation)  # (N, C, *O, *K)
    outs = x.shape[2 : 2 + n]
    g, coutg = groups, cout // groups
    x = x.reshape((N, g, cg) + outs + kernel)
    x = x.permute((0, 1) + tuple(range(3, 3 + n)) + (2,) + tuple(range(3 + n, 3 + 2 * n)))  # (N, g, *O, cg, *K)
    x = x.reshape((N, g, 1) + outs + (cg,) + kernel)
    w = weight.reshape((1, g, coutg) + (1,) * n + (cg,) + kernel)
    out = (x * w).sum(tuple(range(-(n + 1), 0))).reshape((N, cout) + outs)
    return out + bias.reshape((1, cout) + (1,) * n) if bias is not None else out

  def _live_taps(self, weight: Tensor, stride, pads, dilation) -> tuple[Tensor, Tensor, list[tuple[int, int]]]:
    """(input, weight, pads) with the window's taps that read only padding for every output dropped (they add zeros):
    a dilated conv over a map smaller than its dilation (DeepLab's ASPP, dilations 24 and 36 over a 16x16 map) is a
    1x1 conv, where it multiplied 9x the work, 8/9 of it by zeros. The pads shrink with the kernel; where a pad would
    go negative the input is cut there instead (what it cuts no remaining tap reads)."""
    x = self
    kept, cut, new_pads = [], [], []
    for i, ((lo, hi), K, s, d) in enumerate(zip(pads, weight.shape[2:], stride, dilation)):
      L = x.shape[2 + i]
      O = (L + lo + hi - d * (K - 1) - 1) // s + 1
      # tap k reads o*s + k*d - lo for o in [0, O): inside [0, L) for some o on one run of taps
      live = [k for k in range(K) if k * d - lo < L and (O - 1) * s + k * d - lo >= 0] if O > 0 else []
      k0, k1 = (live[0], live[-1] + 1) if live else (0, K)
      lo, hi = lo - k0 * d, hi - (K - k1) * d
      kept.append((k0, k1))
      cut.append((max(0, -lo), L - max(0, -hi)))
      new_pads.append((max(0, lo), max(0, hi)))
    if all(k == (0, K) for k, K in zip(kept, weight.shape[2:])):
      return x, weight, pads
    weight = weight.shrink([None, None, *kept])
    x = x.shrink([None, None, *cut]) if any(c != (0, L) for c, L in zip(cut, x.shape[2:])) else x
    return x, weight, new_pads

  def conv2d(self, weight, bias=None, stride=1, padding=0, dilation=1, groups=1) -> Tensor:
    return self.conv(weight, bias, stride, padding, dilation, groups)

  def _pool(self, kernel_size, stride, padding, dilation, n: int, value) -> Tensor:
    kernel = _tuple(kernel_size, n)
    stride = kernel if stride is None else _tuple(stride, n)
    return self._pad_spatial(padding, n, value)._windows(kernel, stride, _tuple(dilation, n))

  def max_pool2d(self, kernel_size, stride=None, padding=0, dilation=1) -> Tensor:
    return self.max_pool(kernel_size, stride, padding, dilation, 2)

  def max_pool(self, kernel_size, stride=None, padding=0, dilation=1, n: int = 2) -> Tensor:
    w = self._pool(kernel_size, stride, padding, dilation, n, min_value(self.dtype))
    return w.max(tuple(range(-n, 0)))

  def avg_pool2d(self, kernel_size, stride=None, padding=0, count_include_pad: bool = True) -> Tensor:
    return self.avg_pool(kernel_size, stride, padding, count_include_pad, 2)

  def avg_pool(self, kernel_size, stride=None, padding=0, count_include_pad: bool = True, n: int = 2) -> Tensor:
    axes = tuple(range(-n, 0))
    total = self._float()._pool(kernel_size, stride, padding, 1, n, 0.0).sum(axes)
    if count_include_pad:
      return total * (1.0 / prod(_tuple(kernel_size, n)))
    # the count of real elements per window is a constant: the compiler folds it
    ones = type(self)(np.ones(self.shape[-n:], dtype=np.float32))
    return total / ones._pool(kernel_size, stride, padding, 1, n, 0.0).sum(axes)

  def softmax(self, axis: int = -1) -> Tensor:
    x = self._float()
    e = (x - x.max(axis, keepdim=True)).exp()
    return e / e.sum(axis, keepdim=True)

  def log_softmax(self, axis: int = -1) -> Tensor:
    x = self._float()
    d = x - x.max(axis, keepdim=True)
    return d - d.exp().sum(axis, keepdim=True).log()

  def layernorm(
    self, weight: Tensor | None = None, bias: Tensor | None = None, axis: int = -1, eps: float = 1e-5
  ) -> Tensor:
    """Normalise over the axes from `axis` to the last (ONNX LayerNormalization's convention)."""
    axes = tuple(range(axis % self.ndim, self.ndim))
    x = self._float()
    d = x - x.mean(axes, keepdim=True)
    y = d * ((d * d).mean(axes, keepdim=True) + eps).rsqrt()
    if weight is not None:
      y = y * weight
    return y + bias if bias is not None else y

  def batchnorm(
    self, mean: Tensor, var: Tensor, weight: Tensor | None = None, bias: Tensor | None = None, eps: float = 1e-5
  ) -> Tensor:
    """Inference batchnorm over axis 1: one scale and shift per channel (constant-folded when the stats are
    constants)."""
    scale = (var + eps).rsqrt() * (weight if weight is not None else 1.0)
    shift = (bias if bias is not None else 0.0) - mean * scale
    shape = (1, -1) + (1,) * (self.ndim - 2)
    return self * scale.reshape(shape) + shift.reshape(shape)


def _spatial_pads(padding, n: int) -> list[tuple[int, int]]:
  if isinstance(padding, int):
    return [(padding, padding)] * n
  padding = list(padding)
  if len(padding) == n and all(isinstance(p, int) for p in padding):
    return [(p, p) for p in padding]
  if len(padding) == n:
    return [tuple(p) for p in padding]
  if len(padding) == 2 * n:
    return [(padding[i], padding[i + n]) for i in range(n)]
  raise InvalidValueError(f"padding {padding} does not fit {n} spatial axes")
