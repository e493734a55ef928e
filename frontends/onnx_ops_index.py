"""ONNX gathering, scattering and index-map operators (Gather*, Scatter*, TensorScatter, Col2Im, Trilu, cumulative
sums and products, OneHot, Hardmax, TopK, ReverseSequence, NonZero, Compress). The IR has no gather-by-address
beyond take/gather and no scatter: index maps known at compile time are computed in numpy, runtime ones become
one-hot comparisons and reductions."""

from __future__ import annotations

import numpy as np

from aot.core.dtype import dtypes, max_value, min_value
from aot.frontends.batch_dims import rows_past_indices, tracing_above_range
from aot.frontends.onnx import NeedsConstant, Unsupported, op
from aot.frontends.onnx_ops_tensor import (
  _along,
  _axis,
  _const,
  _ints,
  _maybe_const,
  _move_back,
  _move_last,
  _reduce,
  _scalar,
)
from aot.frontends.tensor import Tensor

# *** gathering ***


# indices out of range are an error in ONNX (onnxruntime refuses them): a run given one fails, naming them
@op("Gather")
def gather(n, x, indices, axis=0):
  axis = _axis(axis, x.ndim)
  if tracing_above_range() and (at := _maybe_const(n, indices)) is not None:
    if (past := rows_past_indices(np.asarray(at), x.shape[axis])) and (table := _maybe_const(n, x)) is not None:
      x = _const(np.pad(table, [(0, past if i == axis else 0) for i in range(x.ndim)]))
  return x.take(indices, axis, f"Gather node '{n.name}'", n.proto.input[1])


@op("GatherElements")
def gather_elements(n, x, indices, axis=0):
  return x.gather(_axis(axis, x.ndim), indices, f"GatherElements node '{n.name}'", n.proto.input[1])


@op("GatherND")
def gather_nd(n, x, indices, batch_dims=0):
  b, k = batch_dims, indices.shape[-1]
  bshape, dims, rest = x.shape[:b], x.shape[b : b + k], x.shape[b + k :]
  B, L, R = int(np.prod(bshape)), int(np.prod(dims)), int(np.prod(rest))
  lin = _linear_index(indices, dims)  # (*bshape, *M)
  M = lin.shape[b:]
  lin = lin.reshape(B, -1, 1).expand(B, int(np.prod(M)), R)
  out = x.reshape(B, L, R).gather(1, lin)
  return out.reshape(bshape + M + rest)


def _linear_index(indices: Tensor, dims) -> Tensor:
  """Row-major linear index of the coordinate rows in indices[..., k] over dims (negative entries count from the
  end)."""
  idx = indices.cast(dtypes.int64)
  dims_t = _const(np.asarray(dims, dtype=np.int64))
  idx = (idx < 0).where(idx + dims_t, idx)
  strides = np.cumprod((list(dims[1:]) + [1])[::-1])[::-1].astype(np.int64)
  return _reduce(idx * _const(strides.copy()), "sum", -1)


# *** scattering: the IR has no scatter, so every output element selects or reduces the updates aimed at it ***

_IDENT = {"add": lambda dt: 0, "mul": lambda dt: 1, "max": min_value, "min": max_value}


def _combine(reduction: str, a: Tensor, b: Tensor) -> Tensor:
  if reduction == "none":
    return b
  if reduction == "add":
    return a | b if a.dtype == dtypes.bool else a + b
  if reduction == "mul":
    return a & b if a.dtype == dtypes.bool else a * b
  if reduction == "max":
    return a.maximum(b)
  if reduction == "min":
    return a.minimum(b)
  raise Unsupported(f"reduction {reduction!r}")


def _scatter_flat(data: Tensor, targets: np.ndarray, updates: Tensor, reduction: str) -> Tensor:
  """Known targets: data.flat[targets[i]] (op)= updates.flat[i], in order. Each round handles one update per target,
  so repeated targets combine in index order as the reference does."""
  flat, upd = data.reshape(-1), updates.reshape(-1)
  for src in _rounds(targets, flat.shape[0]):
    flat = _const(src >= 0).where(_combine(reduction, flat, upd.take(np.maximum(src, 0)).cast(flat.dtype)), flat)
  return flat.reshape(data.shape)


def _rounds(targets: np.ndarray, size: int):
  """Source maps src[p] (-1: none), round r holding the r-th source (in index order) aimed at each target p."""
  targets = np.asarray(targets, dtype=np.int64).reshape(-1)
  order = np.argsort(targets, kind="stable")
  ts = targets[order]
  rank = np.arange(len(ts)) - np.searchsorted(ts, ts, side="left")
  for r in range(int(rank.max()) + 1 if len(ts) else 0):
    src = np.full(size, -1, dtype=np.int64)
    src[ts[rank == r]] = order[rank == r]
    yield src


def _scatter_runtime(data: Tensor, idx: Tensor, upd: Tensor, axis: int, reduction: str) -> Tensor:
  """Runtime indices: out[.., p, ..] reduces over k the updates with idx[.., k, ..] == p (ScatterElements)."""
  nd, P, K = data.ndim, data.shape[axis], idx.shape[axis]
  idx = idx.cast(dtypes.int64)
  idx = (idx < 0).where(idx + P, idx)
  ik, uk = _move_last(idx, axis).unsqueeze(axis), _move_last(upd, axis).unsqueeze(axis).cast(data.dtype)
  hit = ik == _const(np.arange(P, dtype=np.int64).reshape([P if i == axis else 1 for i in range(nd)] + [1]))
  region_shape = tuple(P if i == axis else s for i, s in enumerate(idx.shape))
  region = data.shrink([(0, s) for s in region_shape])
  if reduction == "none":
    k = _const(np.arange(K, dtype=np.int64))
    last = _reduce(hit.where(k, -1), "max", -1)  # the last update wins, as in the reference
    val = _reduce((k == last.unsqueeze(-1)).where(uk, _scalar(min_value(data.dtype), data.dtype)), "max", -1)
    new = (last >= 0).where(val, region)
  elif reduction in ("add", "mul", "max", "min"):
    ident = _scalar(_IDENT[reduction](data.dtype), data.dtype)
    red = {"add": "sum", "mul": "prod", "max": "max", "min": "min"}[reduction]
    new = _combine(reduction, region, _reduce(hit.where(uk, ident), red, -1).cast(data.dtype))
  else:
    raise Unsupported(f"reduction {reduction!r}")
  if region_shape == data.shape:
    return new
  width = [(0, d - s) for d, s in zip(data.shape, region_shape)]
  inside = _const(np.ones(region_shape, bool)).pad(width, False)
  return inside.where(new.pad(width, 0), data)


@op("ScatterElements")
def scatter_elements(n, data, indices, updates, axis=0, reduction="none"):
  a = _axis(axis, data.ndim)
  idx = _maybe_const(n, indices)
  if idx is None:
    return _scatter_runtime(data, indices, updates, a, reduction)
  idx = np.where(idx < 0, idx + data.shape[a], idx).astype(np.int64)
  coords = list(np.indices(idx.shape, dtype=np.int64))
  coords[a] = idx
  return _scatter_flat(data, np.ravel_multi_index(tuple(coords), data.shape), updates, reduction)


@op("Scatter")
def scatter(n, data, indices, updates, axis=0):
  return scatter_elements(n, data, indices, updates, axis)


@op("ScatterND")
def scatter_nd(n, data, indices, updates, reduction="none"):
  k = indices.shape[-1]
  dims, rest = data.shape[:k], data.shape[k:]
  L, R = int(np.prod(dims)), int(np.prod(rest))
  idx = _maybe_const(n, indices)
  if idx is not None:
    idx = np.where(idx < 0, idx + np.asarray(dims), idx).astype(np.int64)
    lin = np.ravel_multi_index(tuple(np.moveaxis(idx, -1, 0)), dims) if k else np.zeros(idx.shape[:-1], np.int64)
    targets = lin.reshape(-1, 1) * R + np.arange(R)
    return _scatter_flat(data, targets, updates, reduction)
  # runtime indices: ScatterElements along the linearised leading axes
  lin = _linear_index(indices, dims).reshape(-1, 1)
  M = lin.shape[0]
  out = _scatter_runtime(data.reshape(L, R), lin.expand(M, R), updates.reshape(M, R), 0, reduction)
  return out.reshape(data.shape)


@op("TensorScatter", since=24)
def tensor_scatter(n, past, update, write_indices=None, mode="linear", axis=-2):
  a = _axis(axis, past.ndim)
  B, S, T = past.shape[0], past.shape[a], update.shape[a]
  w = write_indices.cast(dtypes.int64) if write_indices is not None else _const(np.zeros(B, np.int64))
  # output position p along axis reads update[p - w[b]] where that lies in [0, T) (mod S when circular)
  p = _along(a, past.ndim, np.arange(S, dtype=np.int64))
  off = p - w.reshape((B,) + (1,) * (past.ndim - 1))
  if mode == "circular":
    off = (off % S + S) % S
  elif mode != "linear":
    raise Unsupported(f"mode {mode!r}")
  hit = (off >= 0) & (off < T)
  shape = tuple(S if i == a else s for i, s in enumerate(update.shape))
  idx = hit.where(off, 0).expand(shape)
  return hit.where(update.pad([(0, S - T) if i == a else (0, 0) for i in range(update.ndim)]).gather(a, idx), past)


# *** index-map ops ***


@op("Trilu")
def trilu(n, x, k=None, upper=1):
  k = _ints(n, k, "k")[0] if k is not None else 0
  r, c = x.shape[-2:]
  i, j = np.arange(r)[:, None], np.arange(c)[None, :]
  mask = (j - i >= k) if upper else (j - i <= k)
  return _const(mask).where(x, _scalar(0, x.dtype))


# the longest axis CumSum/CumProd take: output i accumulates input j through a d x d mask, a constant of d*d bytes
# (256 MB here) and d*d operations per row; beyond it the model is refused, not left to exhaust the compiler's memory
CUMULATIVE_AXIS_MAX = 1 << 14


def _cumulative(n, x, axis, exclusive, reverse, ident, how):
  a = _axis(_ints(n, axis, "axis")[0], x.ndim)
  d = x.shape[a]
  if d > CUMULATIVE_AXIS_MAX:
    raise Unsupported(
      f"axis {a} of input '{n.proto.input[0]}' {x.shape} has {d} elements; at most {CUMULATIVE_AXIS_MAX} are "
      f"supported (it is computed as a {d} x {d} masked {how})"
    )
  i, j = np.arange(d)[:, None], np.arange(d)[None, :]
  mask = (j > i if exclusive else j >= i) if reverse else (j < i if exclusive else j <= i)
  xs = _move_last(x, a).unsqueeze(-2)  # (..., 1, d): row i of the mask picks what output i accumulates
  out = _reduce(_const(mask).where(xs, _scalar(ident, x.dtype)), how, -1).cast(x.dtype)
  return _move_back(out, a)


@op("CumSum")
def cumsum(n, x, axis, exclusive=0, reverse=0):
  return _cumulative(n, x, axis, exclusive, reverse, 0, "sum")


@op("CumProd")
def cumprod(n, x, axis, exclusive=0, reverse=0):
  return _cumulative(n, x, axis, exclusive, reverse, 1, "prod")


@op("OneHot")
def one_hot(n, indices, depth, values, axis=-1):
  d = int(n.const(depth, "depth").reshape(-1)[0])
  a = _axis(axis, indices.ndim + 1)
  idx = indices.cast(dtypes.int64)
  idx = (idx < 0).where(idx + d, idx).unsqueeze(a)
  hit = idx == _along(a, indices.ndim + 1, np.arange(d, dtype=np.int64))
  return hit.where(values[1], values[0])


@op("Hardmax", since=1)
def hardmax_v1(n, x, axis=1):
  a = _axis(axis, x.ndim)
  flat = x.reshape(int(np.prod(x.shape[:a])), int(np.prod(x.shape[a:])))
  return _hardmax(flat, 1).reshape(x.shape)


@op("Hardmax", since=13)
def hardmax(n, x, axis=-1):
  return _hardmax(x, _axis(axis, x.ndim))


def _hardmax(x, a):
  am = x.argmax(a, keepdim=True).cast(dtypes.int64)
  return (am == _along(a, x.ndim, np.arange(x.shape[a], dtype=np.int64))).cast(x.dtype)


@op("TopK", since=1)
def topk(n, x, K=None, axis=-1, largest=1, sorted=1, k=None):
  k = int(_ints(n, K, "K")[0]) if K is not None else k
  a = _axis(axis, x.ndim)
  d = x.shape[a]
  xl = _move_last(x, a)
  vals, inds = _topk_select(xl, k, largest) if k <= 8 and d > 32 else _topk_rank(xl, k, largest)
  return _move_back(vals, a), _move_back(inds, a)


def _topk_rank(xl: Tensor, k: int, largest) -> tuple[Tensor, Tensor]:
  """All k at once, O(d^2): output r takes the element with exactly r elements before it."""
  d = xl.shape[-1]
  xi, xj = xl.unsqueeze(-1), xl.unsqueeze(-2)
  # rank of element i = how many elements come before it (ties: the lower index first)
  before = (xj > xi) if largest else (xj < xi)
  lower = _const(np.arange(d)[None, :] < np.arange(d)[:, None])
  rank = _reduce(before | ((xj == xi) & lower), "sum", -1)  # (..., d)
  sel = rank.unsqueeze(-1) == _const(np.arange(k, dtype=rank.dtype.np))  # (..., d, k)
  vals = _reduce(sel.where(xl.unsqueeze(-1), _scalar(0, xl.dtype)), "sum", -2).cast(xl.dtype)
  inds = _reduce(sel.where(_const(np.arange(d, dtype=np.int64).reshape(d, 1)), _scalar(0, dtypes.int64)), "sum", -2)
  return vals, inds


def _topk_select(xl: Tensor, k: int, largest) -> tuple[Tensor, Tensor]:
  """One extreme at a time, O(k*d) for small k: the first index holding the extreme among those not yet taken."""
  d = xl.shape[-1]
  pos = _const(np.arange(d, dtype=np.int64))
  fill = _scalar((min_value if largest else max_value)(xl.dtype), xl.dtype)
  taken, vals, inds = _const(np.zeros(d, bool)), [], []
  for _ in range(k):
    cand = taken.where(fill, xl)
    v = cand.max(-1, keepdim=True) if largest else cand.min(-1, keepdim=True)
    i = _reduce(((xl == v) & taken.logical_not()).where(pos, d), "min", -1)
    vals.append(v)
    inds.append(i.unsqueeze(-1))
    taken = taken | (pos == i.unsqueeze(-1))
  return Tensor.cat(vals, -1), Tensor.cat(inds, -1)


@op("ReverseSequence")
def reverse_sequence(n, x, sequence_lens, batch_axis=1, time_axis=0):
  T, B = x.shape[time_axis], x.shape[batch_axis]
  t = _along(time_axis, x.ndim, np.arange(T, dtype=np.int64))
  L = sequence_lens.cast(dtypes.int64).reshape([B if i == batch_axis else 1 for i in range(x.ndim)])
  src = (t < L).where(L - 1 - t, t)
  return x.gather(time_axis, src.expand(x.shape))


@op("NonZero")
def nonzero(n, x):
  v = _values_deciding_shape(n, x, "NonZero")
  return _const(np.array(np.nonzero(v), dtype=np.int64).reshape(v.ndim, -1))


@op("Compress")
def compress(n, x, condition, axis=None):
  keep = np.nonzero(_values_deciding_shape(n, condition, "Compress").reshape(-1))[0]
  if axis is None:
    return x.reshape(-1).take(keep, 0)
  a = _axis(axis, x.ndim)
  return x.take(keep[keep < x.shape[a]], a)


def _values_deciding_shape(n, t, what):
  try:
    return n.const(t)
  except NeedsConstant as e:
    raise NeedsConstant(
      f"{what}'s output shape depends on the values of its input, which must be known at compile time ({e})",
      e.input_name,
    )


# *** Col2Im: a constant scatter-add of the column entries into the image ***


@op("Col2Im")
def col2im(n, x, image_shape, block_shape, dilations=None, pads=None, strides=None):
  img, blk = _ints(n, image_shape, "image_shape"), _ints(n, block_shape, "block_shape")
  nd = len(img)
  dil, st = dilations or [1] * nd, strides or [1] * nd
  pads = pads or [0] * (2 * nd)
  padded = [img[i] + pads[i] + pads[i + nd] for i in range(nd)]
  outs = [(padded[i] - dil[i] * (blk[i] - 1) - 1) // st[i] + 1 for i in range(nd)]
  N, CK, L = x.shape
  C = CK // int(np.prod(blk))
  # column entry (kernel offset kk, block position ll) lands on padded pixel o*s + kk*d on every axis
  kk = np.indices(blk).reshape(nd, -1)
  ll = np.indices(outs).reshape(nd, -1)
  pos = [ll[i][None, :] * st[i] + kk[i][:, None] * dil[i] for i in range(nd)]
  target = np.ravel_multi_index(tuple(pos), padded)  # (K, L)
  out = _col2im_sum(x.reshape(N * C, -1), target, int(np.prod(padded)))
  out = out.reshape([N, C] + padded)
  return out.shrink([None, None] + [(pads[i], pads[i] + img[i]) for i in range(nd)])


def _col2im_sum(cols: Tensor, target: np.ndarray, P: int) -> Tensor:
  """out[:, p] = sum of cols[:, j] over the j with target[j] == p."""
  out = _scalar(0, cols.dtype).reshape(1, 1).expand(cols.shape[0], P)
  for src in _rounds(target, P):
    out = out + _const(src >= 0).where(cols.take(np.maximum(src, 0), 1), _scalar(0, cols.dtype))
  return out
