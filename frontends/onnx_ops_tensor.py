"""ONNX movement, shape and tensor-creation operators (gathering, scattering and index maps are in onnx_ops_index.py).
Shapes are static, so every shape-like input (a Reshape's shape, Slice's starts, a Resize's scales) must be known at
compile time; index maps and interpolation weights that depend only on shapes are computed here in numpy and applied
with take/gather."""

from __future__ import annotations

import math
import string

import numpy as np
import onnx
from onnx import numpy_helper

from aot.core.dtype import dtypes, to_dtype
from aot.errors import InvalidValueError
from aot.frontends import narrow
from aot.frontends.batch_dims import rows_past_table
from aot.frontends.onnx import NeedsConstant, Unsupported, onnx_dtype, op
from aot.frontends.tensor import Tensor

# *** helpers ***


def _const(arr) -> Tensor:
  """A constant tensor that keeps numpy's dtype (Tensor() alone narrows python floats to float32)."""
  arr = np.asarray(arr)
  if arr.dtype == object or arr.dtype.kind in "USO":
    raise Unsupported("string tensors are not supported")
  return narrow.from_array(arr)


def _scalar(value, dt) -> Tensor:
  return _const(np.asarray(value, dtype=dt.np))


def _ints(n, t, what: str) -> list[int]:
  if t is None:
    return None
  if not isinstance(t, Tensor):
    return [int(v) for v in np.asarray(t).reshape(-1)]
  return [int(v) for v in n.const(t, what).reshape(-1)]


def _maybe_const(n, t: Tensor):
  """t's value if it is known at compile time, else None (the caller then builds a runtime formulation)."""
  try:
    return n.const(t)
  except NeedsConstant:
    return None


def _axis(a: int, ndim: int) -> int:
  if not -ndim <= a < max(ndim, 1):
    raise Unsupported(f"axis {a} is out of range for rank {ndim}")
  return a % max(ndim, 1)


def _full(shape, value, dt) -> Tensor:
  t = _scalar(value, dt)
  return t.reshape((1,) * len(shape)).expand(tuple(shape)) if len(shape) else t


def _reduce(x: Tensor, how: str, axes) -> Tensor:
  """x.sum/prod/max/min over axes (keepdim=False); axes of size 1 are reshaped away rather than reduced, so that
  k=1 / length-1 cases need no degenerate reduction."""
  axes = {a % x.ndim for a in ((axes,) if isinstance(axes, int) else axes)}
  if how == "sum" and x.dtype == dtypes.bool:
    x = x.cast(dtypes.default_int)
  big = tuple(a for a in sorted(axes) if x.shape[a] != 1)
  y = getattr(x, how)(big, keepdim=True) if big else x
  return y.reshape([s for i, s in enumerate(x.shape) if i not in axes])


def _move_last(x: Tensor, axis: int) -> Tensor:
  return x.permute([i for i in range(x.ndim) if i != axis] + [axis])


def _move_back(x: Tensor, axis: int) -> Tensor:
  order = list(range(x.ndim - 1))
  order.insert(axis, x.ndim - 1)
  return x.permute(order)


def _along(axis: int, ndim: int, arr: np.ndarray) -> Tensor:
  """A 1-d constant shaped to broadcast along `axis` of a rank-ndim tensor."""
  return _const(arr.reshape([arr.size if i == axis else 1 for i in range(ndim)]))


# *** constants and shapes ***


@op("Constant")
def constant(
  n,
  value=None,
  sparse_value=None,
  value_float=None,
  value_floats=None,
  value_int=None,
  value_ints=None,
  value_string=None,
  value_strings=None,
):
  if value is not None:
    return _const(value)
  if sparse_value is not None:
    return _const(_sparse_to_dense(sparse_value))
  if value_float is not None:
    return _const(np.float32(value_float))
  if value_floats is not None:
    return _const(np.asarray(value_floats, dtype=np.float32))
  if value_int is not None:
    return _const(np.int64(value_int))
  if value_ints is not None:
    return _const(np.asarray(value_ints, dtype=np.int64))
  raise Unsupported("string constants are not supported")


def _sparse_to_dense(sp: onnx.SparseTensorProto) -> np.ndarray:
  values, idx = numpy_helper.to_array(sp.values), numpy_helper.to_array(sp.indices)
  dense = np.zeros(int(np.prod(sp.dims)), dtype=values.dtype)
  # indices are either linear ([NNZ]) or one coordinate row per value ([NNZ, rank])
  flat = idx if idx.ndim == 1 else np.ravel_multi_index(tuple(idx.T), tuple(sp.dims))
  dense[flat] = values
  return dense.reshape(tuple(sp.dims))


@op("Shape")
def shape(n, x, start=0, end=None):
  return _const(np.asarray(x.shape[start:end], dtype=np.int64))


@op("Size")
def size(n, x):
  return _const(np.int64(x.numel()))


@op("ConstantOfShape")
def constant_of_shape(n, s, value=None):
  value = np.zeros(1, np.float32) if value is None else np.asarray(value)
  return _full(_ints(n, s, "shape"), value.reshape(-1)[0], to_dtype(value.dtype))


@op("Range")
def range_(n, start, limit, delta):
  s, l, d = (n.const(t, w).reshape(-1)[0] for t, w in ((start, "start"), (limit, "limit"), (delta, "delta")))
  count = max(int(math.ceil((float(l) - float(s)) / float(d))), 0)
  return _const((s + np.arange(count).astype(s.dtype) * d).astype(s.dtype))


@op("EyeLike")
def eye_like(n, x, dtype=None, k=0):
  if x.ndim != 2:
    raise Unsupported("EyeLike needs a 2-d input")
  dt = x.dtype if dtype is None else onnx_dtype(dtype)
  return _const(np.eye(x.shape[0], x.shape[1], k, dtype=dt.np))


# *** reshaping ***


@op("Reshape")
def reshape(n, x, shape=None, allowzero=0, consumed_inputs=None):
  s = _ints(n, shape, "shape")
  s = [x.shape[i] if v == 0 and not allowzero else v for i, v in enumerate(s)]
  return x.reshape(s)


@op("Flatten")
def flatten(n, x, axis=1):
  a = axis + x.ndim if axis < 0 else axis
  return x.reshape(int(np.prod(x.shape[:a])), int(np.prod(x.shape[a:])))


@op("Squeeze")
def squeeze(n, x, axes=None):
  axes = _ints(n, axes, "axes")
  return x.squeeze(None if not axes else tuple(_axis(a, x.ndim) for a in axes))


@op("Unsqueeze")
def unsqueeze(n, x, axes=None):
  axes = _ints(n, axes, "axes")
  rank = x.ndim + len(axes)
  axes = sorted(_axis(a, rank) for a in axes)
  dims = iter(x.shape)
  return x.reshape([1 if i in axes else next(dims) for i in range(rank)])


@op("Transpose")
def transpose(n, x, perm=None):
  return x.permute(list(reversed(range(x.ndim))) if perm is None else list(perm))


@op("Expand")
def expand(n, x, shape):
  s = _ints(n, shape, "shape")
  try:
    out = tuple(int(v) for v in np.broadcast_shapes(x.shape, tuple(s)))
  except ValueError:
    raise InvalidValueError(f"input of shape {x.shape} does not broadcast to shape {tuple(s)}") from None
  return x.reshape((1,) * (len(out) - x.ndim) + x.shape).expand(out)


@op("Tile")
def tile(n, x, repeats, axis=None):
  reps = _ints(n, repeats, "repeats")
  if axis is not None:  # opset 1: one count for one axis
    a = _ints(n, axis, "axis")[0]
    reps = [reps[0] if i == a else 1 for i in range(x.ndim)]
  return x.repeat(reps)


@op("DepthToSpace")
def depth_to_space(n, x, blocksize, mode="DCR"):
  N, C, H, W = x.shape
  b = blocksize
  if mode == "DCR":
    return x.reshape(N, b, b, C // b // b, H, W).permute(0, 3, 4, 1, 5, 2).reshape(N, C // b // b, H * b, W * b)
  if mode == "CRD":
    return x.reshape(N, C // b // b, b, b, H, W).permute(0, 1, 4, 2, 5, 3).reshape(N, C // b // b, H * b, W * b)
  raise Unsupported(f"mode {mode!r}")


@op("SpaceToDepth")
def space_to_depth(n, x, blocksize, mode="DCR"):
  N, C, H, W = x.shape
  b = blocksize
  y = x.reshape(N, C, H // b, b, W // b, b)
  if mode == "DCR":
    y = y.permute(0, 3, 5, 1, 2, 4)
  elif mode == "CRD":
    y = y.permute(0, 1, 3, 5, 2, 4)
  else:
    raise Unsupported(f"mode {mode!r}")
  return y.reshape(N, C * b * b, H // b, W // b)


# *** joining, splitting, slicing ***


@op("Concat")
def concat(n, *xs, axis=1):
  xs = [x for x in xs if x is not None]
  return Tensor.cat(xs, _axis(axis, xs[0].ndim))


@op("Split")
def split(n, x, split=None, axis=0, num_outputs=None):
  a = _axis(axis, x.ndim)
  d = x.shape[a]
  sizes = _ints(n, split, "split") if isinstance(split, Tensor) else (list(split) if split else None)
  if not sizes:
    k = num_outputs or n.num_outputs
    part = -(-d // k) if num_outputs else d // k
    sizes = [min(part, d - i * part) for i in range(k)]
  if sum(sizes) != d:
    raise Unsupported(f"split sizes {sizes} do not add up to {d}")
  offs = np.cumsum([0] + sizes)
  return [
    x.shrink([(int(offs[i]), int(offs[i + 1])) if j == a else None for j in range(x.ndim)]) for i in range(len(sizes))
  ]


@op("Slice")
def slice_(n, x, starts, ends, axes=None, steps=None):
  starts, ends = _ints(n, starts, "starts"), _ints(n, ends, "ends")
  axes = _ints(n, axes, "axes") or list(range(len(starts)))
  steps = _ints(n, steps, "steps") or [1] * len(starts)
  idx = [slice(None)] * x.ndim
  for s, e, a, st in zip(starts, ends, axes, steps):
    if st == 0:
      raise Unsupported("slice step 0")
    a = _axis(a, x.ndim)
    if (past := rows_past_table(s, e, st, x.shape[a])) and (table := _maybe_const(n, x)) is not None:
      # (one row more than the slice takes, so that it is a slice at every size the graph is traced at)
      x = _const(np.pad(table, [(0, past + 1 if i == a else 0) for i in range(x.ndim)]))
    idx[a] = _onnx_slice(s, e, st, x.shape[a])
  return x[tuple(idx)]


def _onnx_slice(s: int, e: int, step: int, d: int) -> slice:
  """The ONNX clamping rules (which differ from Python's for negative steps) as a Python slice."""
  s, e = s + d if s < 0 else s, e + d if e < 0 else e
  if step > 0:
    return slice(min(max(s, 0), d), min(max(e, 0), d), step)
  s, e = min(max(s, 0), d - 1), min(max(e, -1), d - 1)
  return slice(s, None if e < 0 else e, step)


@op("Pad")
def pad(n, x, pads=None, constant_value=None, axes=None, mode="constant", value=0.0, paddings=None):
  raw = _ints(n, pads if pads is not None else paddings, "pads")
  axes = [_axis(a, x.ndim) for a in (_ints(n, axes, "axes") or range(x.ndim))]
  width = [(0, 0)] * x.ndim
  for i, a in enumerate(axes):
    width[a] = (raw[i], raw[i + len(axes)])
  if mode == "constant":
    return _pad_constant(n, x, width, value if constant_value is None else constant_value)
  if mode not in ("reflect", "edge", "wrap"):
    raise Unsupported(f"pad mode {mode!r}")
  # negative pads crop first; the positive ones read an index map that numpy's own pad builds
  x = x.pad([(min(b, 0), min(e, 0)) for b, e in width])
  for a, (b, e) in enumerate(width):
    if b > 0 or e > 0:
      x = x.take(np.pad(np.arange(x.shape[a]), (max(b, 0), max(e, 0)), mode=mode), a)
  return x


def _pad_constant(n, x: Tensor, width, value) -> Tensor:
  if isinstance(value, Tensor):
    v = _maybe_const(n, value)
    if v is None:  # a runtime pad value: pad with zeros, then select it outside the original region
      inside = _const(np.ones(x.shape, bool)).pad(width, False)
      return inside.where(x.pad(width, 0), value.reshape(()).cast(x.dtype))
    value = v.reshape(-1)[0] if v.size else 0
  value = np.asarray(value).astype(x.dtype.np).item()
  return x.pad(width, value)


@op("CenterCropPad")
def center_crop_pad(n, x, shape, axes=None):
  target = _ints(n, shape, "shape")
  axes = [_axis(a, x.ndim) for a in (axes if axes is not None else range(x.ndim))]
  width = [(0, 0)] * x.ndim
  for a, s in zip(axes, target):
    d = x.shape[a]
    lo = (abs(s - d)) // 2
    width[a] = (lo, s - d - lo) if s >= d else (-lo, -(d - s - lo))
  return x.pad(width, 0)


# *** resizing ***


@op("Resize", since=10)
def resize_v10(n, x, scales, mode="nearest"):
  s = n.const(scales, "scales").astype(np.float32)
  return _resize(x, s, None, None, list(range(x.ndim)), mode, "asymmetric", "floor", -0.75, 0, 0.0, 0, "stretch")


@op("Resize", since=11)
def resize(
  n,
  x,
  roi=None,
  scales=None,
  sizes=None,
  antialias=0,
  axes=None,
  coordinate_transformation_mode="half_pixel",
  cubic_coeff_a=-0.75,
  exclude_outside=0,
  extrapolation_value=0.0,
  keep_aspect_ratio_policy="stretch",
  mode="nearest",
  nearest_mode="round_prefer_floor",
):
  axes = [_axis(a, x.ndim) for a in axes] if axes is not None else list(range(x.ndim))
  roi = n.const(roi, "roi").astype(np.float64) if roi is not None else None
  sc = n.const(scales, "scales").astype(np.float32) if scales is not None else None
  sz = n.const(sizes, "sizes").astype(np.int64) if sizes is not None else None
  if sc is not None and sc.size == 0:
    sc = None
  if sz is not None and sz.size == 0:
    sz = None
  return _resize(
    x,
    sc,
    sz,
    roi if roi is not None and roi.size else None,
    axes,
    mode,
    coordinate_transformation_mode,
    nearest_mode,
    cubic_coeff_a,
    exclude_outside,
    extrapolation_value,
    antialias,
    keep_aspect_ratio_policy,
  )


@op("Upsample", since=7)
def upsample(n, x, scales=None, mode="nearest"):
  s = (n.const(scales, "scales") if isinstance(scales, Tensor) else np.asarray(scales)).astype(np.float32)
  return _resize(x, s, None, None, list(range(x.ndim)), mode, "asymmetric", "floor", -0.75, 0, 0.0, 0, "stretch")


def _resize(x, scales, sizes, roi, axes, mode, ctm, nearest_mode, A, exclude_outside, extrap, antialias, policy):
  r = x.ndim
  if mode not in ("nearest", "linear", "cubic"):
    raise Unsupported(f"mode {mode!r}")
  full_scale, full_size, full_roi = [1.0] * r, list(x.shape), [0.0] * r + [1.0] * r
  if scales is not None:
    for i, a in enumerate(axes):
      full_scale[a] = scales[i]
  if sizes is not None:
    for i, a in enumerate(axes):
      full_size[a] = int(sizes[i])
  if roi is not None:
    for i, a in enumerate(axes):
      full_roi[a], full_roi[r + a] = roi[i], roi[len(axes) + i]
  if sizes is not None:
    full_scale = [full_size[i] / x.shape[i] for i in range(r)]
    if policy != "stretch":
      pick = {"not_larger": min, "not_smaller": max}.get(policy)
      if pick is None:
        raise Unsupported(f"keep_aspect_ratio_policy {policy!r}")
      s = pick(full_scale[a] for a in axes)
      full_scale = [s if i in axes else 1.0 for i in range(r)]
      full_size = [int(s * x.shape[i] + 0.5) if i in axes else x.shape[i] for i in range(r)]
  else:
    full_size = [int(v) for v in (np.asarray(full_scale, dtype=np.float32) * np.asarray(x.shape)).astype(int)]
  out = x if mode == "nearest" else x.cast(dtypes.float64 if x.dtype == dtypes.float64 else dtypes.float32)
  for a in axes:
    sc, osz, aroi = float(full_scale[a]), full_size[a], [full_roi[a], full_roi[a + r]]
    if (
      math.isclose(sc, 1.0)
      and osz == out.shape[a]
      and (roi is None or (math.isclose(aroi[0], 0) and math.isclose(aroi[1], 1)))
    ):
      continue
    taps = _resize_taps(out.shape[a], osz, sc, mode, ctm, nearest_mode, A, exclude_outside, antialias, aroi)
    out = _apply_taps(out, a, *taps, mode == "nearest", extrap)
  return out.cast(x.dtype)


def _source_coords(ctm, y, scale, in_w, out_w_int, roi):
  out_w = scale * in_w
  if ctm == "align_corners":
    return np.zeros(out_w_int) if out_w == 1 else y * (in_w - 1) / (out_w - 1)
  if ctm == "asymmetric":
    return y / scale
  if ctm == "tf_crop_and_resize":
    x = (
      np.full(out_w_int, (roi[1] - roi[0]) * (in_w - 1) / 2)
      if out_w == 1
      else y * (roi[1] - roi[0]) * (in_w - 1) / (out_w - 1)
    )
    return x + roi[0] * (in_w - 1)
  if ctm == "pytorch_half_pixel":
    return np.full(out_w_int, -0.5) if out_w == 1 else (y + 0.5) / scale - 0.5
  if ctm == "half_pixel":
    return (y + 0.5) / scale - 0.5
  if ctm == "half_pixel_symmetric":
    offset = in_w / 2 * (1 - out_w_int / out_w)
    return offset + (y + 0.5) / scale - 0.5
  raise Unsupported(f"coordinate_transformation_mode {ctm!r}")


def _coeffs(mode, ratio, scale, A, nearest_mode, antialias):
  if mode == "nearest":
    if float(ratio).is_integer():
      return np.array([0.0, 1.0])
    pick = {"round_prefer_floor": ratio > 0.5, "round_prefer_ceil": ratio >= 0.5, "floor": False, "ceil": True}
    if nearest_mode not in pick:
      raise Unsupported(f"nearest_mode {nearest_mode!r}")
    return np.array([0.0, 1.0]) if pick[nearest_mode] else np.array([1.0, 0.0])
  s = min(scale, 1.0) if antialias else 1.0
  if mode == "linear":
    start = int(np.floor(-1 / s) + 1)
    c = np.clip(1 - np.abs((np.arange(start, 2 - start) - ratio) * s), 0, 1)
    return c / c.sum()
  start = int(np.floor(-2 / s) + 1)
  t = np.abs(s * (np.arange(start, 2 - start) - ratio))
  c = np.where(
    t <= 1, (A + 2) * t**3 - (A + 3) * t**2 + 1, np.where(t < 2, A * t**3 - 5 * A * t**2 + 8 * A * t - 4 * A, 0.0)
  )
  return c / c.sum() if antialias else c


def _resize_taps(in_w, out_w, scale, mode, ctm, nearest_mode, A, exclude_outside, antialias, roi):
  """Per output position: the source indices, their weights, and whether it lies outside (tf_crop_and_resize)."""
  y = np.arange(out_w, dtype=np.float64)
  x = _source_coords(ctm, y, scale, in_w, out_w, roi).astype(np.float64)
  outside = (x < 0) | (x > in_w - 1) if ctm == "tf_crop_and_resize" else None
  xi = np.floor(x)
  ratios = np.where(x == xi, 1.0, x - xi)
  coeffs = (
    np.stack([_coeffs(mode, float(q), scale, A, nearest_mode, antialias) for q in ratios])
    if out_w
    else np.zeros((0, 2))
  )
  k = coeffs.shape[1]
  # the k nearest source positions, ties to the left (the reference's neighbour rule)
  pad = int(np.ceil(k / 2))
  xp = x + pad
  pp = np.floor(xp).astype(np.int64)
  frac = xp - pp
  if k % 2 == 0:
    off = np.where(frac == 0, -(k // 2), -(k // 2) + 1)
  else:
    off = np.where(frac <= 0.5, -((k - 1) // 2), -((k - 1) // 2) + 1)
  idx = (pp + off)[:, None] + np.arange(k)[None, :] - pad
  if exclude_outside:
    coeffs = np.where((idx < 0) | (idx >= in_w), 0.0, coeffs)
    tot = coeffs.sum(-1, keepdims=True)
    coeffs = coeffs / np.where(tot == 0, 1.0, tot)
  return np.clip(idx, 0, in_w - 1), coeffs, outside


def _apply_taps(x, a, idx, coeffs, outside, nearest, extrap):
  out_w, k = idx.shape
  if nearest:
    y = x.take(idx[np.arange(out_w), coeffs.argmax(1)], a)
  else:
    g = x.take(idx.reshape(-1), a).reshape(x.shape[:a] + (out_w, k) + x.shape[a + 1 :])
    w = _const(coeffs.astype(x.dtype.np).reshape((out_w, k) + (1,) * (x.ndim - a - 1)))
    y = _reduce(g * w, "sum", a + 1)
  if outside is not None and outside.any():
    y = _along(a, x.ndim, outside).where(_scalar(extrap, x.dtype), y)
  return y


# *** Einsum and Det ***


@op("Einsum")
def einsum(n, *xs, equation=""):
  eq = equation.replace(" ", "")
  lhs, rhs = eq.split("->") if "->" in eq else (eq, None)
  terms = lhs.split(",")
  if len(terms) != len(xs):
    raise Unsupported(f"equation {equation!r} names {len(terms)} operands, {len(xs)} given")
  free = [c for c in string.ascii_letters if c not in eq]
  ell_rank = max((x.ndim - len(t.replace("...", "")) for t, x in zip(terms, xs) if "..." in t), default=0)
  ell = "".join(free[:ell_rank])
  terms = [t.replace("...", ell[ell_rank - (x.ndim - len(t.replace("...", ""))) :]) for t, x in zip(terms, xs)]
  if rhs is None:
    counts = {c: "".join(terms).count(c) for c in "".join(terms)}
    rhs = ell + "".join(sorted(c for c, k in counts.items() if k == 1 and c not in ell))
  else:
    rhs = rhs.replace("...", ell)
  letters = list(dict.fromkeys(rhs + "".join(terms)))
  sizes, aligned = {}, []
  for t, x in zip(terms, xs):
    x, t = _einsum_diagonals(x, t)
    for c, s in zip(t, x.shape):
      sizes[c] = max(sizes.get(c, 1), s)
    # put this operand's axes in the global letter order, size 1 where it lacks a letter
    x = x.permute([t.index(c) for c in letters if c in t])
    aligned.append(x.reshape([x.shape[[c for c in letters if c in t].index(c)] if c in t else 1 for c in letters]))
  prod_ = aligned[0]
  for x in aligned[1:]:
    prod_ = prod_ * x
  prod_ = prod_.expand([sizes[c] for c in letters])
  summed = [i for i, c in enumerate(letters) if c not in rhs]
  out = _reduce(prod_, "sum", summed)
  return out.cast(xs[0].dtype)


def _einsum_diagonals(x: Tensor, t: str):
  """Repeated letters in one operand ('ii') keep only the diagonal."""
  while len(set(t)) < len(t):
    c = next(c for c in t if t.count(c) > 1)
    i, j = t.index(c), t.index(c, t.index(c) + 1)
    x, t = _diagonal(x, i, j), t[:j] + t[j + 1 :]
  return x, t


def _diagonal(x: Tensor, i: int, j: int) -> Tensor:
  """The diagonal of axes i and j, kept at position i."""
  d = x.shape[i]
  rest = [a for a in range(x.ndim) if a not in (i, j)]
  y = x.permute(rest + [i, j]).reshape([x.shape[a] for a in rest] + [d * d])
  # element (k, k) is at k*(d+1): pad to d*(d+1), view as (d, d+1), keep column 0
  y = y.pad([(0, 0)] * len(rest) + [(0, d)]).reshape([x.shape[a] for a in rest] + [d, d + 1])
  y = y.shrink([None] * (len(rest) + 1) + [(0, 1)]).reshape([x.shape[a] for a in rest] + [d])
  order = list(range(len(rest)))
  order.insert(i, len(rest))
  return y.permute(order)


@op("Det")
def det(n, x):
  d = x.shape[-1]
  if d > 4:
    raise Unsupported(f"Det of {d}x{d} matrices (only up to 4x4)")
  return _det(
    x.cast(dtypes.float64 if x.dtype == dtypes.float64 else dtypes.float32), list(range(d)), list(range(d))
  ).cast(x.dtype)


def _det(x, rows, cols):
  """Cofactor expansion along the first remaining row."""
  if len(rows) == 1:
    return x[..., rows[0], cols[0]]
  out = None
  for k, c in enumerate(cols):
    term = x[..., rows[0], c] * _det(x, rows[1:], cols[:k] + cols[k + 1 :])
    out = term if out is None else (out - term if k % 2 else out + term)
  return out
