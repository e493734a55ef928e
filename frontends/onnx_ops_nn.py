"""ONNX neural-network operators: matmul/gemm, convolutions, pooling, normalisations, softmax family and losses. One
small function per op (and per opset range where semantics changed). Attention is in onnx_ops_attention.py, recurrent
layers in onnx_ops_rnn.py, quantisation in onnx_ops_quant.py."""

from __future__ import annotations

import numpy as np

from aot.codegen.render.opt import WIDE_SUM_MIN_TERMS
from aot.core.dtype import dtypes, min_value
from aot.errors import InvalidValueError
from aot.frontends.onnx import Unsupported, onnx_dtype, op
from aot.frontends.tensor import Tensor

# *** helpers ***


def _iota(n: int, axis: int, ndim: int, dtype=np.int64) -> Tensor:
  """0..n-1 laid along `axis` of an otherwise all-ones shape: compared with a runtime index it makes a one-hot mask."""
  return Tensor(np.arange(n, dtype=dtype).reshape([n if i == axis else 1 for i in range(ndim)]))


def _f32(x: Tensor) -> Tensor:
  return x if x.dtype in (dtypes.float32, dtypes.float64) else x.cast(dtypes.float32)


def _spatial(x, kernel_shape, w=None):
  n = x.ndim - 2
  kernel = tuple(kernel_shape) if kernel_shape else tuple(w.shape[2:])
  return n, kernel


def _pads(auto_pad, pads, shape, kernel, strides, dilations) -> list[tuple[int, int]]:
  """(lo, hi) per spatial axis from ONNX pads/auto_pad (SAME_* pads so that out = ceil(in / stride))."""
  n = len(kernel)
  if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
    out = []
    for L, K, s, d in zip(shape, kernel, strides, dilations):
      total = max(0, (-(-L // s) - 1) * s + (K - 1) * d + 1 - L)
      small = total // 2
      out.append((small, total - small) if auto_pad == "SAME_UPPER" else (total - small, small))
    return out
  if auto_pad == "VALID" or not pads:
    return [(0, 0)] * n
  if auto_pad not in ("NOTSET", ""):
    raise Unsupported(f"auto_pad {auto_pad!r}")
  return [(int(pads[i]), int(pads[i + n])) for i in range(n)]


def _reduce(x: Tensor, method: str, axes, keepdim=False) -> Tensor:
  """x.sum/max/... over axes, leaving out size-1 axes (a reduce over only size-1 axes trips the code generator)."""
  axes = tuple(a % x.ndim for a in axes)
  big = tuple(a for a in axes if x.shape[a] != 1)
  y = getattr(x, method)(big, keepdim=True) if big else x
  return y if keepdim else y.reshape(tuple(s for i, s in enumerate(y.shape) if i not in axes))


def _defaults(n, strides, dilations):
  return tuple(strides or (1,) * n), tuple(dilations or (1,) * n)


# *** matmul and gemm ***


@op("MatMul")
def matmul(n, a, b):
  return _mm(a, b)


@op("Gemm")
def gemm(n, a, b, c=None, alpha=1.0, beta=1.0, transA=0, transB=0):
  if transA:
    a = a.T
  if transB:
    b = b.T
  y = _mm(a, b)
  if alpha != 1.0:
    y = (y * alpha).cast(a.dtype)
  if c is not None:
    # C broadcasts to the product's shape, not the other way (a (3, N) bias and a (1, N) product: not a Gemm)
    if c.ndim > y.ndim or any(s not in (1, t) for s, t in zip(reversed(c.shape), reversed(y.shape))):
      raise InvalidValueError(f"C of shape {c.shape} does not broadcast to the product's shape {y.shape}")
    y = y + (c * beta if beta != 1.0 else c).cast(y.dtype)
  return y


def _mm(a, b):
  if a.ndim >= 2 and b.ndim >= 2 and a.shape[-1] == 1:
    # an outer product: no reduction (one over a size-1 axis trips the code generator)
    return a * b.reshape(b.shape[:-2] + (1, b.shape[-1]))
  # half precision accumulates in float (as numpy does); a half accumulator drifts by ulps
  return (
    a.cast(dtypes.float32).matmul(b.cast(dtypes.float32)).cast(a.dtype) if a.dtype == dtypes.float16 else a.matmul(b)
  )


@op("MatMulInteger")
def matmul_integer(n, a, b, a_zero_point=None, b_zero_point=None):
  a = a.cast(dtypes.int32) - (
    a_zero_point.cast(dtypes.int32).reshape(-1, 1)
    if a_zero_point is not None and a_zero_point.ndim == 1 and a_zero_point.shape[0] > 1
    else _zp32(a_zero_point)
  )
  b = b.cast(dtypes.int32) - _zp32(b_zero_point)
  return a.matmul(b)


def _zp32(zp):
  return zp.cast(dtypes.int32) if zp is not None else 0


# *** convolution ***


@op("Conv")
def conv(n, x, w, b=None, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
  nd, kernel = _spatial(x, kernel_shape, w)
  strides, dilations = _defaults(nd, strides, dilations)
  p = _pads(auto_pad, pads, x.shape[2:], kernel, strides, dilations)
  return _conv(x, w, b, strides, p, dilations, group)


def _conv(x, w, b, strides, pads, dilations, group):
  if x.dtype == dtypes.float16:
    # half accumulates in float, as numpy does
    f = dtypes.float32
    return _conv(x.cast(f), w.cast(f), b.cast(f) if b is not None else None, strides, pads, dilations, group).cast(
      x.dtype
    )
  if int(np.prod(w.shape[1:])) != 1:
    return x.conv(w, b, strides, pads, dilations, group)
  # one tap per output (1x1 kernel, one channel per group): no reduction at all, so don't ask for one (a reduce over
  # only size-1 axes trips the code generator); each output channel scales its group's input channel
  nd, (N, C), cout = x.ndim - 2, x.shape[:2], w.shape[0]
  xs = x._pad_spatial(pads, nd)._windows((1,) * nd, strides, dilations)
  xs = xs.reshape(xs.shape[: 2 + nd]).unsqueeze(2)
  xs = xs.expand((N, C, cout // C) + xs.shape[3:]).reshape((N, cout) + xs.shape[3:])
  out = xs * w.reshape((1, cout) + (1,) * nd)
  return out + b.reshape((1, cout) + (1,) * nd) if b is not None else out


@op("ConvInteger")
def conv_integer(
  n,
  x,
  w,
  x_zero_point=None,
  w_zero_point=None,
  auto_pad="NOTSET",
  dilations=None,
  group=1,
  kernel_shape=None,
  pads=None,
  strides=None,
):
  wz = _zp32(w_zero_point)
  if isinstance(wz, Tensor) and wz.ndim == 1:
    wz = wz.reshape((-1,) + (1,) * (w.ndim - 1))
  nd, kernel = _spatial(x, kernel_shape, w)
  strides, dilations = _defaults(nd, strides, dilations)
  p = _pads(auto_pad, pads, x.shape[2:], kernel, strides, dilations)
  # padding must be the zero point, i.e. zero after the shift: shift first, then pad with 0
  return _conv(
    x.cast(dtypes.int32) - _zp32(x_zero_point), w.cast(dtypes.int32) - wz, None, strides, p, dilations, group
  )


def _dilate(x: Tensor, strides, axes=None) -> Tensor:
  """Insert stride-1 zeros between the elements of each of `axes` (by default the last len(strides) axes)."""
  axes = range(x.ndim - len(strides), x.ndim) if axes is None else axes
  for ax, s in zip(axes, strides):
    if s == 1:
      continue
    L = x.shape[ax]
    x = x.unsqueeze(ax + 1).pad([(0, s - 1) if j == ax + 1 else (0, 0) for j in range(x.ndim + 1)])
    x = x.reshape(x.shape[:ax] + (L * s,) + x.shape[ax + 2 :])
    x = x.shrink([(0, (L - 1) * s + 1) if j == ax else None for j in range(x.ndim)])
  return x


@op("ConvTranspose")
def conv_transpose(
  n,
  x,
  w,
  b=None,
  auto_pad="NOTSET",
  dilations=None,
  group=1,
  kernel_shape=None,
  output_padding=None,
  output_shape=None,
  pads=None,
  strides=None,
):
  nd, kernel = _spatial(x, kernel_shape, w)
  strides, dilations = _defaults(nd, strides, dilations)
  op_ = tuple(output_padding or (0,) * nd)
  full = [s * (L - 1) + o + (K - 1) * d + 1 for L, s, o, K, d in zip(x.shape[2:], strides, op_, kernel, dilations)]
  if auto_pad in ("SAME_UPPER", "SAME_LOWER") or output_shape is not None:
    # pads follow from the output size (the spec ignores explicit pads then); the head takes the smaller half only
    # under SAME_UPPER (onnxruntime agrees); a size above the full one makes negative pads: zeros at that end
    outs = list(output_shape)[-nd:] if output_shape is not None else [L * s for L, s in zip(x.shape[2:], strides)]
    tot = [f - o for f, o in zip(full, outs)]
    p = [(t // 2, t - t // 2) if auto_pad == "SAME_UPPER" else (t - t // 2, t // 2) for t in tot]
  else:
    p = _pads("NOTSET" if auto_pad == "VALID" else auto_pad, pads, x.shape[2:], kernel, strides, dilations)
  taps = [_phase_taps(K, s, d) for K, s, d in zip(kernel, strides, dilations)]
  if any(s > 1 for s in strides) and all(t <= K for t, K in zip(taps, kernel)):
    return _conv_transpose_phases(x, w, b, strides, dilations, p, op_, group)
  # all strides 1 (a plain conv, nothing is inserted), or a dilation above the stride (whose shared phase frame would
  # hold more taps than the kernel): a conv over the zero-dilated input with the kernel flipped, channel axes swapped
  cin, coutg = w.shape[0], w.shape[1]
  wt = w.reshape((group, cin // group, coutg) + kernel).transpose(1, 2).reshape((group * coutg, cin // group) + kernel)
  wt = wt.flip(tuple(range(2, 2 + nd)))
  xp = _dilate(x, strides)
  cp = [((K - 1) * d - lo, (K - 1) * d - hi + o) for (lo, hi), K, d, o in zip(p, kernel, dilations, op_)]
  xp = xp.pad([(0, 0), (0, 0)] + cp)
  return _conv(xp, wt, b, (1,) * nd, 0, dilations, group)


def _phase_taps(kernel: int, stride: int, dilation: int) -> int:
  """Taps of one sub-pixel phase's kernel along an axis: the dilated kernel cut into stride-long pieces (a stride-1
  axis keeps its kernel and dilation)."""
  return kernel if stride == 1 else -(-((kernel - 1) * dilation + 1) // stride)


def _conv_transpose_phases(x, w, b, strides, dilations, pads, output_padding, group):
  """ConvTranspose as the sub-pixel decomposition: full output position o = i*s + k*d, and writing the dilated tap
  k*d = j*s + a puts it in phase a at o // s = i + j. Each phase is an ordinary stride-1 conv of the input (not a
  zero-inserted copy) with the taps j of w[..., a::s] flipped; all phases share one frame, so they are one conv with
  s**nd times the output channels (a 2x2 stride-2 kernel: one GEMM [Cout*4, Cin] x [Cin, H*W]), and a pixel shuffle
  interleaves them. The pads then cut the frame, output_padding (or a larger output_shape) extends it with zeros."""
  nd, (N, cin), coutg = len(strides), x.shape[:2], w.shape[1]
  kernel = w.shape[2:]
  taps = [_phase_taps(K, s, d) for K, s, d in zip(kernel, strides, dilations)]
  # the kernel axes in the frame: dilated (where strided), zero-extended to taps*stride, split into (taps, stride)
  wd = _dilate(w, [d if s > 1 else 1 for s, d in zip(strides, dilations)], range(2, 2 + nd))
  wd = wd.pad([(0, 0)] * 2 + [(0, t * s - K) for t, s, K in zip(taps, strides, wd.shape[2:])])
  wd = wd.reshape((group, cin // group, coutg) + tuple(v for t, s in zip(taps, strides) for v in (t, s)))
  wd = wd.flip(tuple(3 + 2 * i for i in range(nd)))
  # output channels ordered (group, channel, phase...) so that each group's channels stay contiguous for the conv
  order = (0, 2) + tuple(4 + 2 * i for i in range(nd)) + (1,) + tuple(3 + 2 * i for i in range(nd))
  phases = int(np.prod(strides))
  wc = wd.permute(order).reshape((group * coutg * phases, cin // group) + tuple(taps))
  conv_dil = tuple(d if s == 1 else 1 for s, d in zip(strides, dilations))
  y = _conv(x, wc, None, (1,) * nd, [((t - 1) * d,) * 2 for t, d in zip(taps, conv_dil)], conv_dil, group)
  if int(np.prod(wc.shape[1:])) > 1:
    # the product is stored before the shuffle: fused into the shuffle's and the crop's loops it is no GEMM (a 4x4
    # stride-2 pad-1 kernel then ran 10x slower); a product without a reduction is a scaling, left to fuse
    y = y.contiguous()
  frames = y.shape[2:]
  y = y.reshape((N, group * coutg) + tuple(strides) + frames)
  y = y.permute((0, 1) + tuple(v for i in range(nd) for v in (2 + nd + i, 2 + i)))
  y = y.reshape((N, group * coutg) + tuple(q * s for q, s in zip(frames, strides)))
  size = [
    s * (L - 1) + o + (K - 1) * d + 1 - lo - hi
    for L, s, o, K, d, (lo, hi) in zip(x.shape[2:], strides, output_padding, kernel, dilations, pads)
  ]
  y = y.pad([(0, 0)] * 2 + [(-lo, O + lo - F) for (lo, _), O, F in zip(pads, size, y.shape[2:])])
  return y + b.reshape((1, -1) + (1,) * nd) if b is not None else y


# *** pooling ***


def _pool_geometry(x, kernel, strides, dilations, pads, auto_pad, ceil_mode):
  """Explicit pads, extra trailing pads that ceil_mode needs, and the output sizes."""
  p = _pads(auto_pad, pads, x.shape[2:], kernel, strides, dilations)
  extra, outs = [], []
  for L, K, s, d, (lo, hi) in zip(x.shape[2:], kernel, strides, dilations, p):
    span = (K - 1) * d + 1
    O = (L + lo + hi - span) // s + 1
    if ceil_mode:
      O = -(-(L + lo + hi - span) // s) + 1
      if (O - 1) * s >= L + lo:
        O -= 1
    outs.append(O)
    extra.append(max(0, (O - 1) * s + span - (L + lo + hi)))
  return p, extra, outs


def _pool_windows(x, kernel, strides, dilations, p, extra, value):
  nd = len(kernel)
  xp = x.pad([(0, 0)] * (x.ndim - nd) + [(lo, hi + e) for (lo, hi), e in zip(p, extra)], value)
  return xp._windows(kernel, strides, dilations)


def _window_counts(shape, kernel, strides, dilations, p, extra, outs, include_pad):
  """How many window taps fall on real elements (or explicit padding): the averaging divisor, a constant."""
  cnt = np.ones((), dtype=np.float64)
  for L, K, s, d, (lo, hi), O in zip(shape, kernel, strides, dilations, p, outs):
    pos = np.arange(O)[:, None] * s + np.arange(K)[None, :] * d - lo
    ok = (pos >= -lo) & (pos < L + hi) if include_pad else (pos >= 0) & (pos < L)
    cnt = cnt[..., None] * ok.sum(1)
  return cnt


def _pool_args(x, kernel_shape, strides, dilations):
  nd = x.ndim - 2
  kernel = tuple(kernel_shape)
  strides, dilations = _defaults(nd, strides, dilations)
  return nd, kernel, strides, dilations


# a stride-1 max pool of this many taps or more is one pass per axis (the last first, each stored before the next):
# k + k compares an output rather than k * k (YOLOv8's SPPF, three chained 5x5 pools on 10x10 maps: 0.23 ms each in
# one pass, 1.3 GFLOP/s, 5% of the detector's run). Exact: a max is the max of maxes, NaN included
SEPARABLE_POOL_TAPS = 25


def _separable_max(x, kernel, dilations, p, extra):
  nd = len(kernel)
  y = x.pad([(0, 0)] * (x.ndim - nd) + [(lo, hi + e) for (lo, hi), e in zip(p, extra)], min_value(x.dtype))
  for i in reversed(range(nd)):
    along = lambda v, i=i: tuple(v if j == i else 1 for j in range(nd))
    y = _reduce(y._windows(along(kernel[i]), along(1), along(dilations[i])), "max", tuple(range(-nd, 0)))
    y = y.contiguous() if i else y
  return y


@op("MaxPool")
def max_pool(
  n, x, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None, pads=None, storage_order=0, strides=None
):
  nd, kernel, strides, dilations = _pool_args(x, kernel_shape, strides, dilations)
  p, extra, outs = _pool_geometry(x, kernel, strides, dilations, pads, auto_pad, ceil_mode)
  # (8-bit pools have their own runtime path: codegen/lower/qpool.py)
  if x.dtype.is_float and not n.output_used(1) and np.prod(kernel) >= SEPARABLE_POOL_TAPS and set(strides) == {1}:
    return _separable_max(x, kernel, dilations, p, extra)
  win = _pool_windows(x, kernel, strides, dilations, p, extra, min_value(x.dtype))
  axes = tuple(range(-nd, 0))
  y = _reduce(win, "max", axes)
  if not n.output_used(1):
    return y
  # the flat index of each window's first maximum: windows over an index tensor, picked where x hits the max
  sp = x.shape[2:]
  idx = np.arange(int(np.prod(sp)), dtype=np.int64).reshape(sp)
  if storage_order:
    idx = np.arange(int(np.prod(sp)), dtype=np.int64).reshape(sp[::-1]).T
  iw = _pool_windows(Tensor(idx).reshape((1, 1) + sp), kernel, strides, dilations, p, extra, -1)
  flat = win.reshape(win.shape[:-nd] + (-1,))
  first = flat.argmax(-1).unsqueeze(-1) if flat.shape[-1] > 1 else Tensor(np.zeros((), np.int64))
  k = int(np.prod(kernel))
  pick = _reduce(
    (_iota(k, flat.ndim - 1, flat.ndim) == first).where(iw.reshape(iw.shape[:-nd] + (k,)), 0), "sum", (-1,)
  )
  N, C = x.shape[:2]
  base = Tensor((np.arange(N * C, dtype=np.int64) * int(np.prod(sp))).reshape((N, C) + (1,) * nd))
  return y, pick + base


@op("AveragePool")
def avg_pool(
  n, x, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=None, kernel_shape=None, pads=None, strides=None
):
  nd, kernel, strides, dilations = _pool_args(x, kernel_shape, strides, dilations)
  p, extra, outs = _pool_geometry(x, kernel, strides, dilations, pads, auto_pad, ceil_mode)
  total = _reduce(_pool_windows(x, kernel, strides, dilations, p, extra, 0.0), "sum", range(-nd, 0))
  cnt = _window_counts(x.shape[2:], kernel, strides, dilations, p, extra, outs, count_include_pad)
  return (total / Tensor(cnt.astype(np.float32))).cast(x.dtype)


@op("LpPool")
def lp_pool(n, x, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None, p=2, pads=None, strides=None):
  nd, kernel, strides, dilations = _pool_args(x, kernel_shape, strides, dilations)
  pp, extra, outs = _pool_geometry(x, kernel, strides, dilations, pads, auto_pad, ceil_mode)
  s = _reduce(_pool_windows(x.abs().pow(float(p)), kernel, strides, dilations, pp, extra, 0.0), "sum", range(-nd, 0))
  return s.pow(1.0 / p).cast(x.dtype)


@op("GlobalAveragePool")
def global_avg_pool(n, x):
  return x.mean(tuple(range(2, x.ndim)), keepdim=True).cast(x.dtype)


@op("GlobalMaxPool")
def global_max_pool(n, x):
  return x.max(tuple(range(2, x.ndim)), keepdim=True)


@op("GlobalLpPool")
def global_lp_pool(n, x, p=2):
  return x.abs().pow(float(p)).sum(tuple(range(2, x.ndim)), keepdim=True).pow(1.0 / p).cast(x.dtype)


@op("LRN")
def lrn(n, x, size=None, alpha=0.0001, beta=0.75, bias=1.0):
  sq = (x * x).pad([(0, 0), ((size - 1) // 2, size // 2)] + [(0, 0)] * (x.ndim - 2))
  # sum over a channel window: move channels last, slide, reduce
  perm = (0,) + tuple(range(2, x.ndim)) + (1,)
  win = sq.permute(perm)._windows((size,), (1,), (1,)).sum(-1)
  s = win.permute((0, x.ndim - 1) + tuple(range(1, x.ndim - 1)))
  base = bias + (alpha / size) * s
  # a positive base's power in ops that vectorise, where powf does not (Inception-v1's two LRNs: 2.8 of its 18.6 ms):
  # the usual beta 3/4 as sqrt(b) sqrt(sqrt(b)) (within 2 ulp; Inception-v1's first LRN 0.30 ms, 0.85 as exp(3/4 log
  # b)), others as exp(beta log(b)) (float32 exp and log are arithmetic: codegen/render/opt.py)
  if bias > 0 and alpha >= 0:
    power = base.sqrt() * base.sqrt().sqrt() if beta == 0.75 else (base.log() * beta).exp()
  else:
    power = base.pow(beta)
  return (x / power).cast(x.dtype)


# *** normalisation ***


@op("BatchNormalization")
def batch_norm(
  n, x, scale, b, mean, var, epsilon=1e-5, momentum=0.9, training_mode=0, spatial=1, is_test=0, consumed_inputs=None
):
  if not training_mode:
    return x.batchnorm(mean, var, scale, b, epsilon).cast(x.dtype)
  axes = (0,) + tuple(range(2, x.ndim))
  bm, bv = x.mean(axes), x.var(axes)
  y = x.batchnorm(bm, bv, scale, b, epsilon).cast(x.dtype)
  return (
    y,
    (mean * momentum + bm * (1 - momentum)).cast(mean.dtype),
    (var * momentum + bv * (1 - momentum)).cast(var.dtype),
  )


@op("InstanceNormalization")
def instance_norm(n, x, scale, b, epsilon=1e-5):
  axes = tuple(range(2, x.ndim))
  xf = _f32(x)
  d = xf - xf.mean(axes, keepdim=True)
  y = d * ((d * d).mean(axes, keepdim=True) + epsilon).rsqrt()
  shape = (1, -1) + (1,) * (x.ndim - 2)
  return (y * scale.reshape(shape) + b.reshape(shape)).cast(x.dtype)


@op("LayerNormalization", since=17)
def layer_norm(n, x, scale, b=None, axis=-1, epsilon=1e-5, stash_type=1):
  axes = tuple(range(axis % x.ndim, x.ndim))
  xs = x.cast(onnx_dtype(stash_type))
  mean = xs.mean(axes, keepdim=True)
  d = xs - mean
  inv = ((d * d).mean(axes, keepdim=True) + epsilon).rsqrt()
  y = (d * inv).cast(x.dtype) * scale
  if b is not None:
    y = y + b
  return y, mean, inv


@op("RMSNormalization", since=23)
def rms_norm(n, x, scale, axis=-1, epsilon=1e-5, stash_type=1):
  axes = tuple(range(axis % x.ndim, x.ndim))
  xs = x.cast(onnx_dtype(stash_type))
  y = xs * ((xs * xs).mean(axes, keepdim=True) + epsilon).rsqrt()
  return y.cast(x.dtype) * scale


def _group_norm(x, scale, b, num_groups, epsilon, per_channel, stash):
  N, C = x.shape[:2]
  g = x.cast(stash).reshape(N, num_groups, -1)
  d = g - g.mean(-1, keepdim=True)
  y = (d * ((d * d).mean(-1, keepdim=True) + epsilon).rsqrt()).reshape(x.shape).cast(x.dtype)
  if not per_channel:
    # opset 18: one scale per group, spread over its channels
    scale, b = (
      scale.reshape(-1, 1).expand(num_groups, C // num_groups).reshape(C),
      b.reshape(-1, 1).expand(num_groups, C // num_groups).reshape(C),
    )
  shape = (1, C) + (1,) * (x.ndim - 2)
  return y * scale.reshape(shape) + b.reshape(shape)


@op("GroupNormalization", since=18)
def group_norm_18(n, x, scale, b, num_groups=None, epsilon=1e-5):
  return _group_norm(x, scale, b, num_groups, epsilon, False, dtypes.float32)


@op("GroupNormalization", since=21)
def group_norm_21(n, x, scale, b, num_groups=None, epsilon=1e-5, stash_type=1):
  return _group_norm(x, scale, b, num_groups, epsilon, True, onnx_dtype(stash_type))


@op("MeanVarianceNormalization")
def mvn(n, x, axes=(0, 2, 3)):
  axes = tuple(axes)
  d = x - x.mean(axes, keepdim=True)
  return (d / ((d * d).mean(axes, keepdim=True).sqrt() + 1e-9)).cast(x.dtype)


@op("LpNormalization")
def lp_norm(n, x, axis=-1, p=2):
  if p == 1:
    norm = x.abs().sum(axis, keepdim=True)
  elif p == 2:
    norm = (x * x).sum(axis, keepdim=True).sqrt()
  else:
    raise Unsupported(f"p={p}")
  return (norm == 0).where(0.0, x / norm).cast(x.dtype)


# *** softmax family ***


def _flat2d(fn):
  """Before opset 13: the input is viewed as 2-D at `axis` and the op runs over the whole second half."""

  def run(n, x, axis=1):
    a = axis % x.ndim
    return fn(x.reshape(int(np.prod(x.shape[:a])), -1), 1).reshape(x.shape)

  return run


def _sum_acc(x, axis):
  # half sums accumulate in float, as numpy's do
  return (
    x.cast(dtypes.float32).sum(axis, keepdim=True).cast(x.dtype)
    if x.dtype == dtypes.float16
    else x.sum(axis, keepdim=True)
  )


# onnxruntime's float32 softmax row (MLAS's sum-of-exp kernel as its x86-64 build runs it on this AVX-512 CPU; found
# by matching its outputs): exp(x - max) by a degree-6 polynomial after range reduction by a rounding bias, every step
# one fused multiply-add (Ops.FMA: rounded once; two roundings differed in 1 of 20M values at the first step, 10% at
# the last), summed in two 8-lane float32 accumulators over blocks of 16 (one after another), the two added, then the
# 8 lanes in pairs, times 1 / sum. Ours the same where the row is whole blocks and the block sum stays float32 (rows of
# 16..512 bit for bit, with -inf, +inf and nan). A value a ulp apart just before a DynamicQuantizeLinear can round to
# the next step: the dynamically quantized transformer's seed 8 had softmax 1 ulp off in 30% of its values, then a
# byte, then 2.1e-3 of the output (now 3.2e-4). Two kernels as before (the max; the sums, tree and scaling), 4x128x128
# rows in thread CPU time 0.080 -> 0.074 ms and 0.102 -> 0.097 (exp stored once by a third kernel: 0.058)
SOFTMAX_LANES, SOFTMAX_ACCUMULATORS = 8, 2
# MLAS's constants, all float32 (so rounded here once: a float64 product by them would differ)
SOFTMAX_EXP_LOWER = float(np.float32(-88.3762626647949))
SOFTMAX_EXP_ROUNDING_BIAS = 12582912.0  # 1.5 * 2^23: adding it rounds to an integer in the low mantissa bits
SOFTMAX_EXP_LOG2E = float(np.float32(1.44269504088896341))
SOFTMAX_EXP_LN2 = (float(np.float32(-6.93145752e-1)), float(np.float32(-1.42860677e-6)))
SOFTMAX_EXP_POLY = [
  float.fromhex(h) for h in ("0x1.694p-10", "0x1.125edcp-7", "0x1.555b5ap-5", "0x1.55545p-3", "0x1.fffff6p-2", "0x1p0")
] + [1.0]


def _mlas_exp_row_softmax(x: Tensor) -> Tensor:
  """softmax over the last axis of float32 x (its length whole blocks of SOFTMAX_LANES * SOFTMAX_ACCUMULATORS) as
  onnxruntime computes it, to the bit."""
  v = (x - x.max(-1, keepdim=True)).maximum(SOFTMAX_EXP_LOWER)
  biased = v.fma(SOFTMAX_EXP_LOG2E, SOFTMAX_EXP_ROUNDING_BIAS)
  n = biased - SOFTMAX_EXP_ROUNDING_BIAS
  r = n.fma(SOFTMAX_EXP_LN2[1], n.fma(SOFTMAX_EXP_LN2[0], v))
  p = Tensor(np.float32(SOFTMAX_EXP_POLY[0]))
  for c in SOFTMAX_EXP_POLY[1:]:
    p = p.fma(r, c)
  # 2^n in the exponent field (n >= -127 above SOFTMAX_EXP_LOWER: its 0 there is MLAS's too)
  scale = ((n.cast(dtypes.int32) + 127).maximum(0) << 23).bitcast(dtypes.float32)
  e = p * scale
  # accumulator a's lane j sums e[16k + 8a + j] over k, in k's order: one strided row sum each, so that all of them,
  # the tree and the scaling are one kernel (a (rows, 16) sum read back by the tree was a kernel of its own)
  block = SOFTMAX_LANES * SOFTMAX_ACCUMULATORS
  acc = [e[..., m::block].sum(-1, keepdim=True) for m in range(block)]
  lanes = [acc[j] + acc[SOFTMAX_LANES + j] for j in range(SOFTMAX_LANES)]
  while len(lanes) > 1:
    lanes = [lanes[k] + lanes[k + 1] for k in range(0, len(lanes), 2)]
  total = lanes[0]
  return e * total.reciprocal()


def _softmax(x, axis):
  # rows of whole blocks, fewer than a sum that codegen widens to float64 (wide_sums; elsewhere a float64 row sum)
  blocks, d = SOFTMAX_LANES * SOFTMAX_ACCUMULATORS, x.shape[-1] if x.ndim else 0
  if (
    x.dtype == dtypes.float32
    and d
    and axis % x.ndim == x.ndim - 1
    and d % blocks == 0
    and 0 < d // blocks < WIDE_SUM_MIN_TERMS
  ):
    return _mlas_exp_row_softmax(x)
  e = (x - x.max(axis, keepdim=True)).exp()
  # times the row's reciprocal, as onnxruntime scales a row (one division per row, not one per element)
  return (e * _sum_acc(e, axis).reciprocal()).cast(x.dtype)


def _log_softmax(x, axis):
  d = x - x.max(axis, keepdim=True)
  return (d - _sum_acc(d.exp(), axis).log()).cast(x.dtype)


# Hardmax is in onnx_ops_index.py, with the other one-hot maps
for _name, _fn in {"Softmax": _softmax, "LogSoftmax": _log_softmax}.items():
  op(_name, since=1)(_flat2d(_fn))
  op(_name, since=13)(lambda n, x, axis=-1, _f=_fn: _f(x, axis))


@op("Dropout", since=1)
def dropout_old(n, x, ratio=0.5, is_test=0, consumed_inputs=None, seed=None):
  return x, Tensor(np.ones(x.shape, dtype=bool))


@op("Dropout", since=12)
def dropout(n, x, ratio=None, training_mode=None, seed=None):
  train = training_mode is not None and bool(n.const(training_mode, "training_mode"))
  if train and ratio is not None and float(n.const(ratio, "ratio")) != 0.0:
    raise Unsupported("training-mode dropout with a nonzero ratio draws random numbers")
  if train and ratio is None:
    raise Unsupported("training-mode dropout with the default ratio draws random numbers")
  return x, Tensor(np.ones(x.shape, dtype=bool))


@op("SwiGLU", since=28)
def swiglu(n, a, b, alpha=1.0):
  return (a * (a * alpha).sigmoid().cast(a.dtype) * b).cast(a.dtype)


# *** losses: labels are runtime values, picked with a one-hot mask rather than a gather ***


def _nll(x, target, weight, ignore_index, reduction):
  C = x.shape[1]
  onehot = _iota(C, 1, x.ndim) == target.cast(dtypes.int64).unsqueeze(1)
  picked = _reduce(onehot.where(x, 0.0), "sum", (1,))
  w = (
    _reduce(onehot.where(weight.reshape((1, C) + (1,) * (x.ndim - 2)), 0.0), "sum", (1,))
    if weight is not None
    else Tensor(np.ones((), dtype=x.dtype.np))
  )
  if ignore_index is not None:
    w = (target == ignore_index).where(0.0, w)
  w = w.cast(x.dtype)._broadcast_to(picked.shape)
  loss = -picked * w
  if reduction == "none":
    return loss.cast(x.dtype)
  if reduction == "sum":
    return loss.sum().cast(x.dtype)
  if reduction == "mean":
    return (loss.sum() / w.sum()).cast(x.dtype)
  raise Unsupported(f"reduction {reduction!r}")


@op("NegativeLogLikelihoodLoss", since=12)
def nll_loss(n, x, target, weight=None, ignore_index=None, reduction="mean"):
  return _nll(x, target, weight, ignore_index, reduction)


@op("SoftmaxCrossEntropyLoss", since=12)
def sce_loss(n, scores, labels, weights=None, ignore_index=None, reduction="mean"):
  logp = scores.log_softmax(1).cast(scores.dtype)
  return _nll(logp, labels, weights, ignore_index, reduction), logp


@op("MaxUnpool", since=9)
def max_unpool(n, x, indices, output_shape=None, kernel_shape=None, pads=None, strides=None):
  nd = x.ndim - 2
  strides = tuple(strides or (1,) * nd)
  p = _pads("NOTSET", pads, x.shape[2:], kernel_shape, strides, (1,) * nd)
  out_sp = tuple((L - 1) * s + K - lo - hi for L, s, K, (lo, hi) in zip(x.shape[2:], strides, kernel_shape, p))
  N, C = x.shape[:2]
  lin, lout = int(np.prod(x.shape[2:])), int(np.prod(out_sp))
  # indices are flat over the whole output; each (n, c) plane owns lout of them: scatter by comparing with an iota
  base = Tensor((np.arange(N * C, dtype=np.int64) * lout).reshape(N, C, 1, 1))
  rel = indices.cast(dtypes.int64).reshape(N, C, lin, 1) - base
  hit = rel == _iota(lout, 3, 4)
  out = _reduce(hit.where(x.reshape(N, C, lin, 1), 0), "sum", (2,))
  out = out.reshape((N, C) + out_sp).cast(x.dtype)
  if output_shape is None:
    return out
  # a given output shape holds the inferred one in its leading corner
  want = tuple(int(v) for v in n.const(output_shape, "output_shape"))[2:]
  return out.pad([(0, 0), (0, 0)] + [(0, w - o) for w, o in zip(want, out_sp)])
