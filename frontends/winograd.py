"""3x3 convolutions by Winograd's F(2x2, 3x3): each 2x2 block of outputs from a 4x4 tile of the input with 16
multiply-adds per input channel instead of 36.

With d a 4x4 input tile, g a 3x3 filter and the constant matrices below, the 2x2 output block is
    Y = AT [(G g GT) * (BT d B)] A        (* elementwise)
so the 16 products of one tile, summed over the input channels, are 16 independent matrix multiplies:
    M[i] = U[i] @ V[i],   U[i] = (G g GT)[i] per (output, input channel),   V[i] = (BT d B)[i] per (channel, tile).
U is computed here from the constant weights (float64, then rounded once). V and the output transform are additions
and subtractions (BT and AT hold only 0 and +-1; G's halves are exact in binary), which the scheduler fuses into a
kernel per axis of the tile, the second output one into the convolution's consumer. The 16 products run on the
runtime's microkernel as one batched matmul, which is where the 2.25x fewer multiply-adds are won.

The price: V and M are 4x the input and output activations (in the arena, between the kernels); U holds 16 floats
per filter where the weights held 9; an infinity in the input (or a sum that overflows) makes its whole tile's
outputs NaN, where the direct sum could give an infinity. It pays where the matmuls are big against the transforms
(the thresholds below). Measured in ResNet-18 (1 thread, interleaved in one process): 34.1 -> 31.1 ms; VGG-19 356 ->
285 ms."""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING

import numpy as np

from aot.core.dtype import dtypes
from aot.core.ir import prod

if TYPE_CHECKING:
  from aot.frontends.tensor import Tensor

# the harmonic mean of the input and output channels (C O / (C + O): the multiplies saved against the transforms'
# additions) from which a convolution takes it. Alone, 128 -> 128 channels over 28x28 (64) ran 1.64 -> 1.35 ms and
# 64 -> 64 over 56x56 (32) 1.65 -> 1.94; ResNet-18 with its 64-channel convolutions taken too ran 5% slower than with
# them summed directly
WINOGRAD_MIN_CHANNELS = 64
# output tiles (2x2 blocks) per image from which it pays: each element of U is used once per tile, and U is 16/9 of
# the weights, streamed from memory where a model's weights pass the caches. ResNet-18's 512-channel 7x7 maps (16
# tiles) ran 2.5 ms a convolution where the direct sum took 2.7 (alone, its weights in cache: 1.39 against 2.76), and
# took the weights blob to 1.62x the model's weights (1.15x without them); its 14x14 ones (49 tiles) 1.2 against 1.8
WINOGRAD_MIN_TILES = 40
# the share of an ONNX model's weights that Winograd's transformed weights may add (7 floats more per 3x3 filter),
# to keep the weights blob within 1.2x the model's. The convolutions traced first take it, the big maps of few
# channels, which save the most time per byte. Where the budget held them back it cost (1 thread, interleaved): the
# CRNN 5.14 -> 5.74 ms (one of its four; all direct 6.04), the DB detector 56.0 -> 58.3 ms (one of three; 58.9);
# their blobs 1.32x and 1.47x without it
WINOGRAD_MAX_GROWTH = 0.2

# F(2x2, 3x3): filter to the 4 points, input tile to the 4 points, the 4 points' products to the 2 outputs
G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]])
BT = ((1, 0, -1, 0), (0, 1, 1, 0), (0, -1, 1, 0), (0, 1, 0, -1))
AT = ((1, 1, 1, 0), (0, 1, -1, -1))
# the filters' transform G w G^T as one matrix over a filter's 9 taps: row 4 i + j is G[i, a] G[j, b] at tap 3 a + b
GG = np.kron(G, G)


def constant_weights(w: Tensor) -> np.ndarray | None:
  """w's value when it is computed from constants only (the weights of an ONNX model, a Tensor program's numpy)."""
  from aot.core.interpret import evaluate

  return evaluate(w.uop) if w.from_constants() else None


# set while a program is traced with winograd=False, or for a dim run to a size given at run time
# (frontends/extent_dims.py), whose proof takes a convolution's windows whole, not the tiles' movement ops or the
# interleaving of their outputs
_DIRECT: ContextVar[bool] = ContextVar("direct_convolutions", default=False)
# the bytes of transformed weights a traced ONNX model may still add (weights_budget); None: no bound
_BUDGET: ContextVar[list[int] | None] = ContextVar("winograd_budget", default=None)


@contextmanager
def weights_budget(model_bytes: int):
  """Winograd's weights traced inside add at most WINOGRAD_MAX_GROWTH of the model's weight bytes (each trace of a
  ranged dim's sizes starts afresh, so each takes the same convolutions)."""
  token = _BUDGET.set([int(model_bytes * WINOGRAD_MAX_GROWTH)])
  try:
    yield
  finally:
    _BUDGET.reset(token)


@contextmanager
def direct_convolutions(direct: bool = True):
  """Convolutions traced inside are summed directly (where direct: compile_model's winograd=False says so too)."""
  token = _DIRECT.set(direct or _DIRECT.get())
  try:
    yield
  finally:
    _DIRECT.reset(token)


def winograd_fits(x: Tensor, weight: Tensor, stride, pads, dilation, groups: int) -> bool:
  """Does this convolution take F(2x2, 3x3)? A dense 2-d 3x3 one of unit stride and dilation over float32, with
  enough channels and tiles per image (WINOGRAD_MIN_CHANNELS, WINOGRAD_MIN_TILES: a batch dim's range then traces
  the same program at every size), outside direct_convolutions."""
  if weight.ndim != 4 or tuple(weight.shape[2:]) != (3, 3) or groups != 1 or x.dtype != dtypes.float32:
    return False
  if any(s != 1 for s in stride) or any(d != 1 for d in dilation) or _DIRECT.get():
    return False
  cin, cout = weight.shape[1], weight.shape[0]
  tiles = prod(-(-(size + lo + hi - 2) // 2) for size, (lo, hi) in zip(x.shape[2:], pads))
  fits_budget = (budget := _BUDGET.get()) is None or _added_bytes(weight.shape) <= budget[0]
  return cin * cout >= WINOGRAD_MIN_CHANNELS * (cin + cout) and tiles >= WINOGRAD_MIN_TILES and fits_budget


def _added_bytes(weight_shape) -> int:
  """The bytes Winograd's transformed weights take beyond the filters': 7 floats more per (output, input) channel."""
  return weight_shape[0] * weight_shape[1] * 7 * 4


def _pick(t: Tensor, axis: int, i: int) -> Tensor:
  return t.shrink([(i, i + 1) if a == axis else None for a in range(t.ndim)])


def _transform(t: Tensor, axis: int, rows) -> Tensor:
  """rows @ t along axis, for a matrix of 0 and +-1: sums and differences of slices."""
  from aot.frontends.tensor import Tensor

  parts = [_pick(t, axis, i) for i in range(t.shape[axis])]
  out = []
  for row in rows:
    terms = [(c, p) for c, p in zip(row, parts) if c]
    acc = terms[0][1] if terms[0][0] > 0 else -terms[0][1]
    for c, p in terms[1:]:
      acc = acc + p if c > 0 else acc - p
    out.append(acc)
  return Tensor.cat(out, axis)


def winograd_conv(x: Tensor, w: np.ndarray, pads: list[tuple[int, int]]) -> Tensor:
  """x (N, C, H, W) convolved with the constant 3x3 filters w (O, C, 3, 3) over the padded input, without bias."""
  from aot.frontends.batch_dims import note_winograd
  from aot.frontends.tensor import Tensor

  note_winograd()
  N, C, H, W = x.shape
  O = w.shape[0]
  if (budget := _BUDGET.get()) is not None:
    budget[0] -= _added_bytes(w.shape)
  (top, bottom), (left, right) = pads
  Ho, Wo = H + top + bottom - 2, W + left + right - 2
  Ty, Tx = -(-Ho // 2), -(-Wo // 2)
  # tiles of 4 every 2 cover 2 Ty + 2 rows: the last tile's row past the pad reads zeros, its output is cut below
  x = x.pad([(0, 0), (0, 0), (top, 2 * Ty + 2 - H - top), (left, 2 * Tx + 2 - W - left)])
  tiles = x._windows((4, 4), (2, 2), (1, 1)).permute(4, 5, 0, 1, 2, 3)  # (4, 4, N, C, Ty, Tx)
  V = _transform(_transform(tiles, 0, BT), 1, BT).reshape(16, N, C, Ty * Tx)
  # G w G^T for every filter as one product by G (x) G: its terms, w's times 1, 1/2 or 1/4, sum exactly in float64
  # in any order (VGG-19's 512x512 filters 48 -> 14 ms; G @ w @ G.T's stacked 4x3 products, einsum's 3x slower)
  U = (GG @ w.reshape(O * C, 9).T.astype(np.float64)).reshape(16, 1, O, C)
  M = (Tensor(U.astype(np.float32)) @ V).reshape(4, 4, N, O, Ty, Tx)
  # (AT along the 4x4's axes before they are interleaved with the tiles': after, the consumer computed each output's
  # place in its 2x2 block through gates, ResNet-18's residual adds 3x slower)
  Y = _transform(_transform(M, 0, AT), 1, AT).permute(2, 3, 4, 0, 5, 1).reshape(N, O, 2 * Ty, 2 * Tx)
  return Y.shrink([None, None, (0, Ho), (0, Wo)]) if (Ho, Wo) != (2 * Ty, 2 * Tx) else Y
