"""ONNX sampling operators: GridSample, AffineGrid, RoiAlign, DeformConv. Sampling positions are run-time values, so
each op computes float source coordinates with Tensor math and reads the corners with gathers."""

from __future__ import annotations

import functools
import itertools
import operator

import numpy as np

from aot.core.dtype import dtypes
from aot.frontends.onnx import Unsupported, op
from aot.frontends.onnx_ops_nn import _defaults, _f32, _iota, _reduce
from aot.frontends.tensor import Tensor

# *** sampling: GridSample, AffineGrid, RoiAlign, DeformConv. Positions are runtime values, so each op computes float
# source coordinates with tensor math, turns them into flat integer indices and picks the values with one gather ***


def _gather_flat(data: Tensor, idx: Tensor, axis: int) -> Tensor:
  """data gathered along `axis` at idx, whose size-1 axes are broadcast to data's (torch.gather wants full index
  shapes)."""
  shape = tuple(d if i != axis and s == 1 else s for i, (s, d) in enumerate(zip(idx.shape, data.shape)))
  return data.gather(axis, idx.expand(shape))


def _reflect(x: Tensor, lo: float, hi: float) -> Tensor:
  """Fold x back into [lo, hi] by mirroring at the nearer border (GridSample's reflection padding)."""
  rng = hi - lo
  if rng <= 0:
    return x * 0 + lo
  below, above = x < lo, x > hi
  dx = below.where(lo - x, x - hi)
  k = (dx / rng).floor()
  r = dx - k * rng
  odd = (k - (k * 0.5).floor() * 2) > 0.5
  # an even number of whole folds leaves us measuring from the border we crossed, an odd one from the other
  return (below | above).where((below != odd).where(lo + r, hi - r), x)


def _cubic_coeffs(t: Tensor) -> list[Tensor]:
  """Keys' cubic convolution weights (alpha -0.75) of the taps at -1, 0, 1, 2 for a fraction t in [0, 1)."""
  a = -0.75

  def far(u):
    return ((a * u - 5 * a) * u + 8 * a) * u - 4 * a

  def near(u):
    return ((a + 2) * u - (a + 3)) * u * u + 1

  return [far(t + 1), near(t), near(1 - t), far(2 - t)]


def _gs_axis(x: Tensor, L: int, mode: str, padding: str, align: bool):
  """One spatial axis of GridSample: [(index, weight, valid)] per tap for float source coordinates x."""
  lo, hi = (0.0, L - 1.0) if align else (-0.5, L - 0.5)
  if mode == "nearest":
    x = x.round()  # rint: halves to even, as PyTorch does
  if padding == "border":
    x = ((x < lo) | (x > hi)).where(x.maximum(0.0).minimum(L - 1.0), x)
  elif padding == "reflection":
    x = _reflect(x, lo, hi)
  if mode == "nearest":
    taps = [(x.trunc(), None)]
  else:
    x0 = x.floor()
    t = x - x0
    taps = (
      [(x0, 1 - t), (x0 + 1, t)] if mode == "linear" else [(x0 + k, c) for k, c in zip((-1, 0, 1, 2), _cubic_coeffs(t))]
    )
  out = []
  for i, w in taps:
    valid = ((i >= 0) & (i <= L - 1)) if padding == "zeros" else None
    if padding == "reflection":
      i = _reflect(i, lo, hi).trunc()
    out.append((i.maximum(0.0).minimum(L - 1.0).cast(dtypes.int64), w, valid))
  return out


def _combine_taps(axes_taps, dims) -> tuple[Tensor, Tensor | None, Tensor | None]:
  """Every combination of per-axis taps, stacked on a new last axis: flat indices, weights (product) and validity."""
  strides = [int(np.prod(dims[i + 1 :])) for i in range(len(dims))]
  idx, ws, vs = [], [], []
  for combo in itertools.product(*axes_taps):
    idx.append(sum(i * s for (i, _, _), s in zip(combo, strides)))
    w, v = [t[1] for t in combo if t[1] is not None], [t[2] for t in combo if t[2] is not None]
    ws.append(functools.reduce(operator.mul, w) if w else None)
    vs.append(functools.reduce(operator.and_, v) if v else None)
  stack = lambda ts: Tensor.stack(ts, axis=-1) if ts[0] is not None else None
  return stack(idx), stack(ws), stack(vs)


def _blend(vals: Tensor, w: Tensor | None, valid: Tensor | None) -> Tensor:
  """Sum over the last (tap) axis of the weighted values, zero where a tap fell outside."""
  if valid is not None:
    vals = valid.where(vals, 0.0)
  if w is not None:
    vals = vals * w
  return _reduce(vals, "sum", (-1,))


@op("GridSample", since=16)
def grid_sample(n, x, grid, align_corners=0, mode="bilinear", padding_mode="zeros"):
  mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
  if mode not in ("linear", "nearest", "cubic"):
    raise Unsupported(f"mode {mode!r}")
  if padding_mode not in ("zeros", "border", "reflection"):
    raise Unsupported(f"padding_mode {padding_mode!r}")
  N, C, dims = x.shape[0], x.shape[1], x.shape[2:]
  nd, outs = len(dims), grid.shape[1:-1]
  g = _f32(grid)
  taps = []
  for i, L in enumerate(dims):
    c = g[..., nd - 1 - i]  # the grid lists coordinates innermost axis first
    c = (c + 1) * ((L - 1) / 2) if align_corners else ((c + 1) * L - 1) * 0.5
    taps.append(_gs_axis(c, L, mode, padding_mode, bool(align_corners)))
  idx, w, valid = _combine_taps(taps, dims)
  P, K = int(np.prod(outs)), idx.shape[-1]
  vals = _gather_flat(x.reshape(N, C, -1), idx.reshape(N, 1, P * K), 2).reshape(N, C, P, K)
  rs = lambda t: t.reshape(N, 1, P, K) if t is not None else None
  return _blend(_f32(vals), rs(w), rs(valid)).reshape((N, C) + outs).cast(x.dtype)


@op("AffineGrid", since=20)
def affine_grid(n, theta, size, align_corners=0):
  sz = [int(v) for v in n.const(size, "size")]
  N, dims = sz[0], sz[2:]
  # the base grid is a constant: per axis, -1..1 at pixel centres (or corners), listed innermost axis first, then 1
  axes = [np.linspace(-1, 1, L) if align_corners else (np.arange(L) * 2 + 1) / L - 1 for L in dims]
  mesh = np.meshgrid(*axes, indexing="ij")
  base = np.stack(list(mesh[::-1]) + [np.ones(dims)], axis=-1).reshape(-1, len(dims) + 1).astype(theta.dtype.np)
  out = Tensor(base).matmul(theta.transpose(-1, -2))  # (N, P, nd)
  return out.reshape([N] + dims + [len(dims)]).cast(theta.dtype)


def _roi_grid_counts(n, rois, sampling_ratio, oh, ow, scale, half_pixel):
  """Samples per bin along h and w, per ROI: fixed, or (ratio 0) ceil(roi size / bins), which needs the ROI values."""
  R = rois.shape[0]
  if sampling_ratio > 0:
    return np.full(R, sampling_ratio), np.full(R, sampling_ratio)
  r = n.const(rois, "rois (adaptive sampling_ratio 0)").astype(np.float32)
  size = r[:, 2:4] * np.float32(scale) - r[:, 0:2] * np.float32(scale)
  if not half_pixel:
    size = np.maximum(size, 1.0)
  return np.ceil(size[:, 1] / oh).astype(np.int64), np.ceil(size[:, 0] / ow).astype(np.int64)


def _roi_axis(start, bin_size, count, bins, G, L):
  """Sample coordinates along one axis, (R, bins, G), and RoiAlign's bilinear taps [(index, weight)] plus the
  in-range mask (a sample beyond -1 or L contributes nothing)."""
  R = start.shape[0]
  cnt = Tensor(count.reshape(R, 1, 1).astype(np.float32))
  p = (
    start.reshape(R, 1, 1)
    + _iota(bins, 1, 3, np.float32) * bin_size.reshape(R, 1, 1)
    + (_iota(G, 2, 3, np.float32) + 0.5) * bin_size.reshape(R, 1, 1) / cnt
  )
  inside = (p >= -1.0) & (p <= float(L))
  p = p.maximum(0.0)
  top = p.floor() >= L - 1  # at or past the last row: both taps on it, no fraction
  lo = top.where(float(L - 1), p.floor())
  frac = top.where(0.0, p - lo)
  hi = top.where(float(L - 1), lo + 1)
  return [(lo.cast(dtypes.int64), 1 - frac), (hi.cast(dtypes.int64), frac)], inside


@op("RoiAlign", since=10)
def roi_align(
  n,
  x,
  rois,
  batch_indices,
  coordinate_transformation_mode="half_pixel",
  mode="avg",
  output_height=1,
  output_width=1,
  sampling_ratio=0,
  spatial_scale=1.0,
):
  if n.opset < 16 and "coordinate_transformation_mode" not in {a.name for a in n.proto.attribute}:
    coordinate_transformation_mode = "output_half_pixel"  # opset 10 had no half-pixel shift
  if mode not in ("avg", "max"):
    raise Unsupported(f"mode {mode!r}")
  half = coordinate_transformation_mode == "half_pixel"
  N, C, H, W = x.shape
  R, oh, ow = rois.shape[0], output_height, output_width
  gh, gw = _roi_grid_counts(n, rois, sampling_ratio, oh, ow, spatial_scale, half)
  Gh, Gw = max(int(gh.max(initial=0)), 1), max(int(gw.max(initial=0)), 1)
  r = _f32(rois) * spatial_scale - (0.5 if half else 0.0)
  x1, y1, x2, y2 = (r[:, i] for i in range(4))
  rw, rh = x2 - x1, y2 - y1
  if not half:
    rw, rh = rw.maximum(1.0), rh.maximum(1.0)
  ty, in_y = _roi_axis(y1, rh / oh, gh, oh, Gh, H)
  tx, in_x = _roi_axis(x1, rw / ow, gw, ow, Gw, W)
  # samples are (R, oh, Gh, ow, Gw); the four corners go on a last axis
  ey = lambda t: t.reshape(R, oh, Gh, 1, 1)
  ex = lambda t: t.reshape(R, 1, 1, ow, Gw)
  inside = ey(in_y) & ex(in_x)
  base = batch_indices.cast(dtypes.int64).reshape(R, 1, 1, 1, 1) * (H * W)
  idx = Tensor.stack([base + ey(iy) * W + ex(ix) for iy, _ in ty for ix, _ in tx], axis=-1)
  w = Tensor.stack([inside.where(ey(wy) * ex(wx), 0.0) for _, wy in ty for _, wx in tx], axis=-1)
  flat = x.permute(1, 0, 2, 3).reshape(C, N * H * W)
  P = R * oh * Gh * ow * Gw * 4
  vals = _gather_flat(flat, idx.reshape(1, P), 1).reshape(C, R, oh, Gh, ow, Gw, 4) * w.unsqueeze(0)
  # samples beyond an ROI's own count (adaptive grids differ per ROI) are left out
  ly, lx = np.arange(Gh)[None, :] < gh[:, None], np.arange(Gw)[None, :] < gw[:, None]
  live = Tensor((ly[:, None, :, None, None] & lx[:, None, None, None, :]).reshape(1, R, 1, Gh, 1, Gw))
  if mode == "avg":
    s = _reduce(live.where(_reduce(vals, "sum", (-1,)), 0.0), "sum", (3, 5))
    y = s / Tensor(np.maximum(gh * gw, 1).astype(np.float32).reshape(1, R, 1, 1))
  else:
    m = _reduce(live.where(_reduce(vals, "max", (-1,)), float("-inf")), "max", (3, 5))
    y = Tensor((gh * gw == 0).reshape(1, R, 1, 1)).where(0.0, m)
  return y.permute(1, 0, 2, 3).cast(x.dtype)


@op("DeformConv", since=19)
def deform_conv(
  n,
  x,
  w,
  offset,
  b=None,
  mask=None,
  dilations=None,
  group=1,
  kernel_shape=None,
  offset_group=1,
  pads=None,
  strides=None,
):
  N, C, dims = x.shape[0], x.shape[1], x.shape[2:]
  nd, kernel, outs = len(dims), tuple(kernel_shape or w.shape[2:]), offset.shape[2:]
  strides, dilations = _defaults(nd, strides, dilations)
  pads = list(pads or [0] * 2 * nd)
  og, K = offset_group, int(np.prod(kernel))
  off = _f32(offset).reshape((N, og) + kernel + (nd,) + outs)
  # bilinear samples (zeros outside) at each tap's own position: base grid + learned offset, per offset group
  taps = []
  for i, L in enumerate(dims):
    tap = (
      _iota(kernel[i], 2 + i, 2 + nd + nd) * dilations[i]
      + _iota(outs[i], 2 + nd + i, 2 + nd + nd) * strides[i]
      - pads[i]
    )
    p = off[(slice(None),) * (2 + nd) + (i,)] + tap.cast(dtypes.float32)
    p0 = p.floor()
    t = p - p0
    corners = ((p0, 1 - t), (p0 + 1, t))
    taps.append(
      [(c.maximum(0.0).minimum(L - 1.0).cast(dtypes.int64), wt, (c >= 0) & (c <= L - 1)) for c, wt in corners]
    )
  idx, wts, valid = _combine_taps(taps, dims)
  P = K * int(np.prod(outs)) * idx.shape[-1]
  vals = _gather_flat(x.reshape(N, og, C // og, -1), idx.reshape(N, og, 1, P), 3)
  rs = lambda t: t.reshape((N, og, 1, K) + outs + (idx.shape[-1],))
  s = _blend(_f32(vals).reshape((N, og, C // og, K) + outs + (idx.shape[-1],)), rs(wts), rs(valid))
  if mask is not None:
    s = s * _f32(mask).reshape((N, og, 1, K) + outs)
  # the convolution proper: per group, a sum over its input channels and the kernel taps
  cg, cout = C // group, w.shape[0]
  s = s.reshape((N, group, 1, cg, K) + outs)
  wf = _f32(w).reshape((1, group, cout // group, cg, K) + (1,) * nd)
  y = _reduce(s * wf, "sum", (3, 4)).reshape((N, cout) + outs)
  if b is not None:
    y = y + _f32(b).reshape((1, cout) + (1,) * nd)
  return y.cast(x.dtype)
