"""ONNX signal operators: DFT, STFT, the Hann/Hamming/Blackman windows and MelWeightMatrix. A complex tensor is a real
one with a trailing axis of 2 (real, imaginary); a real signal has a trailing axis of 1. A DFT of a length known at
compile time is one contraction of the signal with a constant matrix of cosines and sines (so the contraction
microkernel runs it); the windows and the mel filter bank depend on their inputs' values only and fold into
constants."""

from __future__ import annotations

import math

import numpy as np
import onnx

from aot.core.dtype import dtypes
from aot.errors import InvalidValueError
from aot.frontends import narrow
from aot.frontends.onnx import Unsupported, op
from aot.frontends.tensor import Tensor

# The DFT matrix is dense, (2 x signal length) by (2 x bins): O(N^2) where an FFT would be O(N log N). 2**24 float32
# elements are 64 MiB of constant, a complex DFT of length 2048; beyond that the matrix would dwarf the model.
MAX_DFT_MATRIX_ELEMENTS = 1 << 24


def _scalar(n, t, what: str) -> int:
  return int(np.asarray(n.const(t, what)).reshape(-1)[0])


def _dft_matrix(length: int, size: int, bins: int, channels: int, inverse: bool, real_out: bool) -> np.ndarray:
  """The float64 matrix W with y = x @ W for a signal of `length` samples x (channels 1: real, 2: real/imag
  interleaved), flattened as (sample, channel), and y flattened as (bin, channel). The transform has `size` points;
  samples past `size` were cut off before, those missing are zeros (no row). real_out: the inverse of a one-sided
  spectrum, whose bins 1..size/2 stand for themselves and their conjugate mirror (so they count twice) and whose
  output is the real part only."""
  n = np.arange(length).reshape(-1, 1)
  k = np.arange(bins).reshape(1, -1)
  # the angle's integer part reduced before scaling: exact for any size, so cos/sin keep float64's precision
  theta = 2 * math.pi * ((n * k) % size) / size
  if not inverse:
    theta = -theta
  cos, sin = np.cos(theta), np.sin(theta)
  if real_out:
    # rows are bins, columns output samples: y[t] = sum_k w_k (re_k cos - im_k sin) / size
    twice = np.where((n == 0) | (2 * n == size), 1.0, 2.0)
    w = np.zeros((length, channels, bins, 1))
    w[:, 0, :, 0] = twice * cos / size
    if channels == 2:
      w[:, 1, :, 0] = -twice * sin / size
    return w.reshape(length * channels, bins)
  # (a + ib)(cos + i sin) = (a cos - b sin) + i (a sin + b cos)
  w = np.zeros((length, channels, bins, 2))
  w[:, 0, :, 0], w[:, 0, :, 1] = cos, sin
  if channels == 2:
    w[:, 1, :, 0], w[:, 1, :, 1] = -sin, cos
  if inverse:
    w /= size
  return w.reshape(length * channels, bins * 2)


def dft(x: Tensor, axis: int, size: int | None, inverse: bool, onesided: bool) -> Tensor:
  """ONNX DFT of x along `axis` (not the trailing complex axis), `size` points (None: the ONNX default)."""
  r = x.ndim
  channels = x.shape[-1] if r else 0
  if r < 2 or channels not in (1, 2):
    raise InvalidValueError(f"DFT input of shape {x.shape}: needs a trailing axis of 1 (real) or 2 (complex)")
  if not -r <= axis < r:
    raise InvalidValueError(f"DFT axis {axis} is outside a rank-{r} input")
  a = axis % r
  if a == r - 1:
    raise InvalidValueError(f"DFT axis {axis} is the trailing real/imaginary axis of a rank-{r} input")
  length = x.shape[a]
  real_out = inverse and onesided
  if size is None:
    size = 2 * (length - 1) if real_out else length
  if size <= 0:
    raise InvalidValueError(f"DFT length {size}: must be positive")
  # bins read (inverse one-sided: the size//2+1 non-redundant ones) and bins written
  used = min(length, size // 2 + 1 if real_out else size)
  out_bins = size if real_out or not onesided else size // 2 + 1
  rows, cols = used * channels, out_bins * (1 if real_out else 2)
  if rows * cols > MAX_DFT_MATRIX_ELEMENTS:
    raise Unsupported(
      f"a DFT of length {size} needs a {rows}x{cols} matrix, more than {MAX_DFT_MATRIX_ELEMENTS} "
      "elements (the dense DFT is O(N^2); there is no FFT)"
    )
  compute = dtypes.float64 if x.dtype == dtypes.float64 else dtypes.float32
  # the signal axis next to the complex one, both flattened into the contraction's reduce axis
  order = [i for i in range(r - 1) if i != a] + [a, r - 1]
  xs = x.cast(compute).permute(order)
  if used < length:
    xs = xs.shrink([(0, used) if i == r - 2 else None for i in range(r)])
  batch = xs.shape[:-2]
  w = Tensor(_dft_matrix(used, size, out_bins, channels, inverse, real_out).astype(compute.np))
  y = xs.reshape(batch + (rows,)).matmul(w).reshape(batch + (out_bins, 1 if real_out else 2))
  back = [0] * r
  for pos, src in enumerate(order):
    back[src] = pos
  return y.permute(back).cast(x.dtype)


@op("DFT", since=17)
def dft_v17(n, x, dft_length=None, axis=1, inverse=0, onesided=0):
  size = None if dft_length is None else _scalar(n, dft_length, "dft_length")
  return dft(x, axis, size, bool(inverse), bool(onesided))


@op("DFT", since=20)
def dft_v20(n, x, dft_length=None, axis=None, inverse=0, onesided=0):
  size = None if dft_length is None else _scalar(n, dft_length, "dft_length")
  a = -2 if axis is None else _scalar(n, axis, "axis")
  return dft(x, a, size, bool(inverse), bool(onesided))


@op("STFT", since=17)
def stft(n, signal, frame_step, window=None, frame_length=None, onesided=1):
  if signal.ndim != 3 or signal.shape[-1] not in (1, 2):
    raise InvalidValueError(f"STFT signal of shape {signal.shape}: needs (batch, length, 1 or 2)")
  step = _scalar(n, frame_step, "frame_step")
  if frame_length is not None:
    flen = _scalar(n, frame_length, "frame_length")
  elif window is not None:
    flen = window.shape[0]
  else:
    raise InvalidValueError("STFT needs a window or a frame_length")
  if window is not None and (window.ndim != 1 or window.shape[0] != flen):
    raise InvalidValueError(f"STFT window of shape {window.shape} does not match frame_length {flen}")
  L = signal.shape[1]
  if step <= 0 or not 0 < flen <= L:
    raise InvalidValueError(f"STFT frame_step {step}, frame_length {flen} over a signal of length {L}")
  # frames by movement ops only: (B, C, L) -> (B, C, frames, flen) -> (B, frames, flen, C)
  frames = signal.permute(0, 2, 1)._windows((flen,), (step,), (1,)).permute(0, 2, 3, 1)
  if window is not None:
    frames = frames * window.cast(signal.dtype).reshape(flen, 1)
  return dft(frames, 2, flen, False, bool(onesided))


# *** windows and filter banks: values from constants, computed in float64 and stored as output_datatype ***


def _store(values: np.ndarray, output_datatype: int) -> Tensor:
  return narrow.from_array(values.astype(onnx.helper.tensor_dtype_to_np_dtype(output_datatype)))


def _window(name: str, fn):
  """fn(positions, denominator) -> values: the symmetric window divides by size-1, the periodic one by size."""

  @op(name, since=17)
  def window(n, size, output_datatype=1, periodic=1):
    count = _scalar(n, size, "size")
    if count < 0:
      raise InvalidValueError(f"{name} size {count}: must be 0 or more")
    with np.errstate(divide="ignore", invalid="ignore"):
      return _store(fn(np.arange(count, dtype=np.float64), count if periodic else count - 1), output_datatype)


_window("HannWindow", lambda i, d: np.sin(math.pi * i / d) ** 2)
_window("HammingWindow", lambda i, d: 25 / 46 - (21 / 46) * np.cos(2 * math.pi * i / d))
_window("BlackmanWindow", lambda i, d: 0.42 - 0.5 * np.cos(2 * math.pi * i / d) + 0.08 * np.cos(4 * math.pi * i / d))


# log1p/expm1 as the reference has them: the bin edges are floored, so the last ulp can move an edge
def _hz_to_mel(hz):
  return 2595 * np.log1p(hz / 700) / np.log(10)


def _mel_to_hz(mel):
  return 700 * np.expm1(mel / 2595 * np.log(10))


@op("MelWeightMatrix", since=17)
def mel_weight_matrix(n, num_mel_bins, dft_length, sample_rate, lower_edge_hertz, upper_edge_hertz, output_datatype=1):
  mels, size, rate = (
    _scalar(n, t, w)
    for t, w in ((num_mel_bins, "num_mel_bins"), (dft_length, "dft_length"), (sample_rate, "sample_rate"))
  )
  lo, hi = (
    float(np.asarray(n.const(t, w)).reshape(-1)[0])
    for t, w in ((lower_edge_hertz, "lower_edge_hertz"), (upper_edge_hertz, "upper_edge_hertz"))
  )
  if mels <= 0 or size <= 0 or rate <= 0 or not 0 <= lo < hi:
    raise InvalidValueError(
      f"MelWeightMatrix num_mel_bins {mels}, dft_length {size}, sample_rate {rate}, "
      f"edges {lo}..{hi} Hz: needs positive counts and 0 <= lower < upper"
    )
  bins = size // 2 + 1
  # mels + 2 points evenly spaced in mel (the step divides by mels + 2, as onnx's reference does), as DFT bin indices
  step = (_hz_to_mel(hi) - _hz_to_mel(lo)) / (mels + 2)
  edges = ((size + 1) * _mel_to_hz(np.arange(mels + 2) * step + _hz_to_mel(lo)) // rate).astype(np.int64)
  if edges.max() >= bins:
    raise InvalidValueError(f"MelWeightMatrix: upper_edge_hertz {hi} lies past the last DFT bin")
  out = np.zeros((bins, mels))
  j = np.arange(bins)
  for m in range(mels):
    left, centre, right = edges[m], edges[m + 1], edges[m + 2]
    rise = (j >= left) & (j <= centre)
    out[:, m] = np.where(rise, (j - left) / max(centre - left, 1), out[:, m])
    if centre == left:
      out[centre, m] = 1.0
    fall = (j >= centre) & (j < right)
    out[:, m] = np.where(fall, (right - j) / max(right - centre, 1), out[:, m])
  return _store(out, output_datatype)
