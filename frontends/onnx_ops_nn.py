"""ONNX neural-network operators: matmul/gemm, convolutions, pooling, normalisations, softmax family, attention,
recurrent layers, losses and quantisation. One small function per op (and per opset range where semantics changed)."""
from __future__ import annotations
import functools, itertools, math, operator
import numpy as np
from aot.dtype import dtypes, min_value, max_value
from aot.frontends.tensor import Tensor
from aot.frontends.onnx import op, onnx_dtype, onnx_type, Unsupported
from aot.frontends import narrow

# *** helpers ***

def _iota(n: int, axis: int, ndim: int, dtype=np.int64) -> Tensor:
  """0..n-1 laid along `axis` of an otherwise all-ones shape: compared with a runtime index it makes a one-hot mask."""
  return Tensor(np.arange(n, dtype=dtype).reshape([n if i == axis else 1 for i in range(ndim)]))

def _f32(x: Tensor) -> Tensor: return x if x.dtype in (dtypes.float32, dtypes.float64) else x.cast(dtypes.float32)

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
  if auto_pad == "VALID" or not pads: return [(0, 0)] * n
  if auto_pad not in ("NOTSET", ""): raise Unsupported(f"auto_pad {auto_pad!r}")
  return [(int(pads[i]), int(pads[i + n])) for i in range(n)]

def _reduce(x: Tensor, method: str, axes, keepdim=False) -> Tensor:
  """x.sum/max/... over axes, leaving out size-1 axes (a reduce over only size-1 axes trips the code generator)."""
  axes = tuple(a % x.ndim for a in axes)
  big = tuple(a for a in axes if x.shape[a] != 1)
  y = getattr(x, method)(big, keepdim=True) if big else x
  return y if keepdim else y.reshape(tuple(s for i, s in enumerate(y.shape) if i not in axes))

def _defaults(n, strides, dilations): return tuple(strides or (1,) * n), tuple(dilations or (1,) * n)

# *** matmul and gemm ***

@op("MatMul")
def matmul(n, a, b): return _mm(a, b)

@op("Gemm")
def gemm(n, a, b, c=None, alpha=1.0, beta=1.0, transA=0, transB=0):
  if transA: a = a.T
  if transB: b = b.T
  y = _mm(a, b)
  if alpha != 1.0: y = (y * alpha).cast(a.dtype)
  if c is not None: y = y + (c * beta if beta != 1.0 else c).cast(y.dtype)
  return y

@op("MatMulInteger")
def matmul_integer(n, a, b, a_zero_point=None, b_zero_point=None):
  a = a.cast(dtypes.int32) - (a_zero_point.cast(dtypes.int32).reshape(-1, 1) if a_zero_point is not None and a_zero_point.ndim == 1 and a_zero_point.shape[0] > 1 else _zp32(a_zero_point))
  b = b.cast(dtypes.int32) - _zp32(b_zero_point)
  return a.matmul(b)

def _zp32(zp): return zp.cast(dtypes.int32) if zp is not None else 0

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
    return _conv(x.cast(f), w.cast(f), b.cast(f) if b is not None else None, strides, pads, dilations, group).cast(x.dtype)
  if int(np.prod(w.shape[1:])) != 1: return x.conv(w, b, strides, pads, dilations, group)
  # one tap per output (1x1 kernel, one channel per group): no reduction at all, so don't ask for one (a reduce over
  # only size-1 axes trips the code generator); each output channel scales its group's input channel
  nd, (N, C), cout = x.ndim - 2, x.shape[:2], w.shape[0]
  xs = x._pad_spatial(pads, nd)._windows((1,) * nd, strides, dilations)
  xs = xs.reshape(xs.shape[:2 + nd]).unsqueeze(2)
  xs = xs.expand((N, C, cout // C) + xs.shape[3:]).reshape((N, cout) + xs.shape[3:])
  out = xs * w.reshape((1, cout) + (1,) * nd)
  return out + b.reshape((1, cout) + (1,) * nd) if b is not None else out

@op("ConvInteger")
def conv_integer(n, x, w, x_zero_point=None, w_zero_point=None, auto_pad="NOTSET", dilations=None, group=1,
                 kernel_shape=None, pads=None, strides=None):
  wz = _zp32(w_zero_point)
  if isinstance(wz, Tensor) and wz.ndim == 1: wz = wz.reshape((-1,) + (1,) * (w.ndim - 1))
  nd, kernel = _spatial(x, kernel_shape, w)
  strides, dilations = _defaults(nd, strides, dilations)
  p = _pads(auto_pad, pads, x.shape[2:], kernel, strides, dilations)
  # padding must be the zero point, i.e. zero after the shift: shift first, then pad with 0
  return _conv(x.cast(dtypes.int32) - _zp32(x_zero_point), w.cast(dtypes.int32) - wz, None, strides, p, dilations, group)

def _dilate(x: Tensor, strides) -> Tensor:
  """Insert stride-1 zeros between the elements of each spatial axis."""
  nd = len(strides)
  for i, s in enumerate(strides):
    if s == 1: continue
    ax = x.ndim - nd + i
    L = x.shape[ax]
    x = x.unsqueeze(ax + 1).pad([(0, s - 1) if j == ax + 1 else (0, 0) for j in range(x.ndim + 1)])
    x = x.reshape(x.shape[:ax] + (L * s,) + x.shape[ax + 2:])
    x = x.shrink([(0, (L - 1) * s + 1) if j == ax else None for j in range(x.ndim)])
  return x

@op("ConvTranspose")
def conv_transpose(n, x, w, b=None, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, output_padding=None,
                   output_shape=None, pads=None, strides=None):
  nd, kernel = _spatial(x, kernel_shape, w)
  strides, dilations = _defaults(nd, strides, dilations)
  op_ = tuple(output_padding or (0,) * nd)
  full = [s * (L - 1) + o + (K - 1) * d + 1 for L, s, o, K, d in zip(x.shape[2:], strides, op_, kernel, dilations)]
  if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
    outs = list(output_shape)[-nd:] if output_shape is not None else [L * s for L, s in zip(x.shape[2:], strides)]
    tot = [f - o for f, o in zip(full, outs)]
    p = [(t // 2, t - t // 2) if auto_pad == "SAME_UPPER" else (t - t // 2, t // 2) for t in tot]
  else:
    p = _pads("NOTSET" if auto_pad == "VALID" else auto_pad, pads, x.shape[2:], kernel, strides, dilations)
    if output_shape is not None:
      # an explicit output shape with explicit pads: the result is cut or zero-extended at the end
      op_ = tuple(o + w - (f - lo - hi) for o, w, f, (lo, hi) in zip(op_, list(output_shape)[-nd:], full, p))
  # a transposed conv is a conv over the zero-dilated input with the kernel flipped and its channel axes swapped
  cin, coutg = w.shape[0], w.shape[1]
  wt = w.reshape((group, cin // group, coutg) + kernel).transpose(1, 2).reshape((group * coutg, cin // group) + kernel)
  wt = wt.flip(tuple(range(2, 2 + nd)))
  xp = _dilate(x, strides)
  cp = [((K - 1) * d - lo, (K - 1) * d - hi + o) for (lo, hi), K, d, o in zip(p, kernel, dilations, op_)]
  xp = xp.pad([(0, 0), (0, 0)] + cp)
  return _conv(xp, wt, b, (1,) * nd, 0, dilations, group)

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
      if (O - 1) * s >= L + lo: O -= 1
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

@op("MaxPool")
def max_pool(n, x, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None, pads=None, storage_order=0, strides=None):
  nd, kernel, strides, dilations = _pool_args(x, kernel_shape, strides, dilations)
  p, extra, outs = _pool_geometry(x, kernel, strides, dilations, pads, auto_pad, ceil_mode)
  win = _pool_windows(x, kernel, strides, dilations, p, extra, min_value(x.dtype))
  axes = tuple(range(-nd, 0))
  y = _reduce(win, "max", axes)
  if not n.output_used(1): return y
  # the flat index of each window's first maximum: windows over an index tensor, picked where x hits the max
  sp = x.shape[2:]
  idx = np.arange(int(np.prod(sp)), dtype=np.int64).reshape(sp)
  if storage_order: idx = np.arange(int(np.prod(sp)), dtype=np.int64).reshape(sp[::-1]).T
  iw = _pool_windows(Tensor(idx).reshape((1, 1) + sp), kernel, strides, dilations, p, extra, -1)
  flat = win.reshape(win.shape[:-nd] + (-1,))
  first = flat.argmax(-1).unsqueeze(-1) if flat.shape[-1] > 1 else Tensor(np.zeros((), np.int64))
  k = int(np.prod(kernel))
  pick = _reduce((_iota(k, flat.ndim - 1, flat.ndim) == first).where(iw.reshape(iw.shape[:-nd] + (k,)), 0), "sum", (-1,))
  N, C = x.shape[:2]
  base = Tensor((np.arange(N * C, dtype=np.int64) * int(np.prod(sp))).reshape((N, C) + (1,) * nd))
  return y, pick + base

@op("AveragePool")
def avg_pool(n, x, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=None, kernel_shape=None, pads=None, strides=None):
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
def global_avg_pool(n, x): return x.mean(tuple(range(2, x.ndim)), keepdim=True).cast(x.dtype)
@op("GlobalMaxPool")
def global_max_pool(n, x): return x.max(tuple(range(2, x.ndim)), keepdim=True)
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
  return (x / (bias + (alpha / size) * s).pow(beta)).cast(x.dtype)

# *** normalisation ***

@op("BatchNormalization")
def batch_norm(n, x, scale, b, mean, var, epsilon=1e-5, momentum=0.9, training_mode=0, spatial=1, is_test=0,
               consumed_inputs=None):
  if not training_mode: return x.batchnorm(mean, var, scale, b, epsilon).cast(x.dtype)
  axes = (0,) + tuple(range(2, x.ndim))
  bm, bv = x.mean(axes), x.var(axes)
  y = x.batchnorm(bm, bv, scale, b, epsilon).cast(x.dtype)
  return y, (mean * momentum + bm * (1 - momentum)).cast(mean.dtype), (var * momentum + bv * (1 - momentum)).cast(var.dtype)

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
  if b is not None: y = y + b
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
    scale, b = scale.reshape(-1, 1).expand(num_groups, C // num_groups).reshape(C), b.reshape(-1, 1).expand(num_groups, C // num_groups).reshape(C)
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
  if p == 1: norm = x.abs().sum(axis, keepdim=True)
  elif p == 2: norm = (x * x).sum(axis, keepdim=True).sqrt()
  else: raise Unsupported(f"p={p}")
  return (norm == 0).where(0.0, x / norm).cast(x.dtype)

# *** softmax family ***

def _flat2d(fn):
  """Before opset 13: the input is viewed as 2-D at `axis` and the op runs over the whole second half."""
  def run(n, x, axis=1):
    a = axis % x.ndim
    return fn(x.reshape(int(np.prod(x.shape[:a])), -1), 1).reshape(x.shape)
  return run

def _hardmax(x, axis):
  am = x.argmax(axis, keepdim=True)
  return (_iota(x.shape[axis % x.ndim], axis % x.ndim, x.ndim) == am).cast(x.dtype)

def _sum_acc(x, axis):
  # half sums accumulate in float, as numpy's do
  return x.cast(dtypes.float32).sum(axis, keepdim=True).cast(x.dtype) if x.dtype == dtypes.float16 else x.sum(axis, keepdim=True)

def _softmax(x, axis):
  e = (x - x.max(axis, keepdim=True)).exp()
  return (e / _sum_acc(e, axis)).cast(x.dtype)

def _log_softmax(x, axis):
  d = x - x.max(axis, keepdim=True)
  return (d - _sum_acc(d.exp(), axis).log()).cast(x.dtype)

for _name, _fn in {"Softmax": _softmax, "LogSoftmax": _log_softmax,
                   "Hardmax": _hardmax}.items():
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
  if train and ratio is None: raise Unsupported("training-mode dropout with the default ratio draws random numbers")
  return x, Tensor(np.ones(x.shape, dtype=bool))

@op("SwiGLU", since=28)
def swiglu(n, a, b, alpha=1.0): return (a * (a * alpha).sigmoid().cast(a.dtype) * b).cast(a.dtype)

# *** attention ***

def _heads(x, h):
  B, S, D = x.shape
  return x.reshape(B, S, h, D // h).permute(0, 2, 1, 3)

@op("Attention", since=23)
def attention(n, q, k, v, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None, is_causal=0,
              kv_num_heads=None, q_num_heads=None, qk_matmul_output_mode=0, scale=None, softcap=0.0,
              softmax_precision=None, left_window_size=-1, right_window_size=-1):
  three = q.ndim == 3
  if three: q, k, v = _heads(q, q_num_heads), _heads(k, kv_num_heads), _heads(v, kv_num_heads)
  if past_key is not None: k = Tensor.cat([past_key, k], 2)
  if past_value is not None: v = Tensor.cat([past_value, v], 2)
  present_k, present_v = k, v
  B, Hq, Sq, Dh = q.shape
  Skv = k.shape[2]
  dt = q.dtype
  sc = math.sqrt(scale if scale is not None else 1 / math.sqrt(Dh))
  bias = _attention_bias(n, q, attn_mask, Sq, Skv, is_causal, past_key, nonpad_kv_seqlen, left_window_size, right_window_size)
  if Hq != k.shape[1]:
    # grouped-query: each kv head serves Hq/Hkv consecutive query heads
    r = Hq // k.shape[1]
    k, v = [t.unsqueeze(2).expand(B, t.shape[1], r, Skv, t.shape[3]).reshape(B, Hq, Skv, t.shape[3]) for t in (k, v)]
  qk = _mm((q * sc).cast(dt), (k * sc).cast(dt).transpose(-1, -2))
  if softcap: qk = ((qk / softcap).tanh() * softcap).cast(dt)
  qkb = qk + bias if bias is not None else qk
  qk_out = qkb if qk_matmul_output_mode == 2 else qk
  sm_in = qkb.cast(onnx_dtype(softmax_precision)) if softmax_precision else qkb
  p = _safe_softmax(sm_in)
  if bias is not None:
    p = (bias.max(-1, keepdim=True) == float("-inf")).where(0.0, p)
  if qk_matmul_output_mode == 3: qk_out = p
  y = _mm(p.cast(dt), v)
  if three: y = y.permute(0, 2, 1, 3).reshape(B, Sq, -1)
  return y, present_k, present_v, qk_out.cast(dt)

def _mm(a, b):
  if a.ndim >= 2 and b.ndim >= 2 and a.shape[-1] == 1:
    # an outer product: no reduction (one over a size-1 axis trips the code generator)
    return a * b.reshape(b.shape[:-2] + (1, b.shape[-1]))
  # half precision accumulates in float (as numpy does); a half accumulator drifts by ulps
  return a.cast(dtypes.float32).matmul(b.cast(dtypes.float32)).cast(a.dtype) if a.dtype == dtypes.float16 else a.matmul(b)

def _safe_softmax(x):
  """Softmax whose fully masked (all -inf) rows give 0 rather than nan."""
  m = x.max(-1, keepdim=True)
  m = (m == float("-inf")).where(0.0, m)
  e = (x - m).exp()
  s = e.cast(dtypes.float32).sum(-1, keepdim=True).cast(e.dtype) if e.dtype == dtypes.float16 else e.sum(-1, keepdim=True)
  return e / (s == 0).where(1.0, s)

def _attention_bias(n, q, mask, Sq, Skv, causal, past_key, nonpad, left, right):
  """The additive bias: the mask (bool -> 0/-inf), padded to the kv length, plus causal/window/padding terms."""
  dt = q.dtype
  bias = None
  if mask is not None:
    if mask.shape[-1] < Skv:
      padv = False if mask.dtype == dtypes.bool else float("-inf")
      mask = mask.pad([(0, 0)] * (mask.ndim - 1) + [(0, Skv - mask.shape[-1])], padv)
    bias = mask.where(Tensor(0.0).cast(dt), float("-inf")) if mask.dtype == dtypes.bool else mask.cast(dt)
  i, j = _iota(Sq, 0, 2), _iota(Skv, 1, 2)
  if nonpad is not None and past_key is None:
    off = (nonpad.cast(dtypes.int64) - Sq).reshape(-1, 1, 1, 1)
  else: off = past_key.shape[2] if past_key is not None else 0
  allowed = None
  if causal: allowed = j <= i + off
  if left >= 0: allowed = _and(allowed, (i + off) - j <= left)
  if right >= 0: allowed = _and(allowed, j - (i + off) <= right)
  if allowed is not None:
    term = allowed.where(Tensor(0.0).cast(dt), float("-inf"))
    bias = term if bias is None else bias + term
  if nonpad is not None:
    pm = (_iota(Skv, 0, 1) < nonpad.cast(dtypes.int64).reshape(-1, 1)).reshape(-1, 1, 1, Skv)
    term = pm.where(Tensor(0.0).cast(dt), float("-inf"))
    bias = term if bias is None else bias + term
  return bias

def _and(a, b): return b if a is None else a & b

@op("RotaryEmbedding", since=23)
def rotary_embedding(n, x, cos_cache, sin_cache, position_ids=None, interleaved=0, num_heads=0, rotary_embedding_dim=0):
  shape = x.shape
  if x.ndim == 4: x = x.permute(0, 2, 1, 3)
  else: x = x.reshape(shape[0], shape[1], num_heads, -1)
  D = x.shape[3]
  rd = rotary_embedding_dim or D
  if position_ids is not None: cos_cache, sin_cache = cos_cache.take(position_ids, 0), sin_cache.take(position_ids, 0)
  cos, sin = cos_cache.unsqueeze(2), sin_cache.unsqueeze(2)
  xr, rest = x[..., :rd], x[..., rd:]
  if interleaved: x1, x2 = xr[..., 0::2], xr[..., 1::2]
  else: x1, x2 = xr[..., :rd // 2], xr[..., rd // 2:]
  real, imag = (cos * x1 - sin * x2).cast(x.dtype), (sin * x1 + cos * x2).cast(x.dtype)
  if interleaved: rot = Tensor.stack([real, imag], axis=-1).reshape(xr.shape)
  else: rot = Tensor.cat([real, imag], -1)
  out = Tensor.cat([rot, rest], -1) if rd < D else rot
  return out.reshape(shape) if len(shape) == 3 else out.permute(0, 2, 1, 3)

# *** recurrent layers: unrolled over the (static) sequence length ***

_ACT = {"relu": lambda x, a, b: x.relu(), "tanh": lambda x, a, b: x.tanh(), "sigmoid": lambda x, a, b: x.sigmoid(),
        "affine": lambda x, a, b: x * a + b, "leakyrelu": lambda x, a, b: (x < 0).where(x * a, x),
        "thresholdedrelu": lambda x, a, b: (x > a).where(x, 0.0), "scaledtanh": lambda x, a, b: (x * b).tanh() * a,
        "hardsigmoid": lambda x, a, b: (x * a + b).maximum(0).minimum(1), "elu": lambda x, a, b: (x < 0).where(a * (x.exp() - 1), x),
        "softsign": lambda x, a, b: x / (x.abs() + 1), "softplus": lambda x, a, b: (x.exp() + 1).log()}
_ACT_DEFAULTS = {"leakyrelu": (0.01, 0.0), "thresholdedrelu": (1.0, 0.0), "hardsigmoid": (0.2, 0.5), "elu": (1.0, 0.0),
                 "scaledtanh": (1.0, 1.0), "affine": (1.0, 0.0)}

def _activations(names, alphas, betas, defaults, ndir):
  """One list of callables per direction; alpha/beta are consumed in order by the activations that take them."""
  names = list(names) if names else defaults * ndir
  alphas, betas = list(alphas or []), list(betas or [])
  fns = []
  for nm in names:
    k = nm.lower()
    if k not in _ACT: raise Unsupported(f"activation {nm!r}")
    a, b = _ACT_DEFAULTS.get(k, (0.0, 0.0))
    if k in _ACT_DEFAULTS:
      if alphas: a = alphas.pop(0)
      if betas and k in ("hardsigmoid", "scaledtanh", "affine"): b = betas.pop(0)
    fns.append(lambda x, _f=_ACT[k], _a=a, _b=b: _f(x, _a, _b))
  per = len(names) // ndir
  return [fns[d * per:(d + 1) * per] for d in range(ndir)]

def _rnn_setup(n, x, w, r, b, seq_lens, h0, layout, direction, gates, extra=None):
  if layout: x = x.transpose(0, 1)
  T, B = x.shape[:2]
  H = r.shape[-1]
  ndir = 2 if direction == "bidirectional" else 1
  if b is None: b = Tensor(np.zeros((ndir, 2 * gates * H), dtype=x.dtype.np))
  if h0 is not None and layout: h0 = h0.transpose(0, 1)
  lens = n.const(seq_lens, "sequence_lens") if seq_lens is not None else None
  if lens is not None and (lens == T).all(): lens = None
  return x, T, B, H, ndir, b, h0, lens

def _run_dirs(x, T, ndir, direction, lens, step, init):
  """Run step(d, x_t, state) -> (h, state) over time in each direction; steps past a sequence's length keep the state
  and output zeros."""
  ys, finals = [], []
  for d in range(ndir):
    rev = direction == "reverse" or d == 1
    state, out = init(d), [None] * T
    for t in (reversed(range(T)) if rev else range(T)):
      h, new = step(d, x[t], state)
      if lens is not None:
        live = Tensor((t < lens).reshape(-1, 1))
        new = tuple(live.where(nv, ov) for nv, ov in zip(new, state))
        h = live.where(h, 0.0)
      state, out[t] = new, h
    ys.append(Tensor.stack(out, axis=0))
    finals.append(state)
  return ys, finals

def _rnn_outputs(ys, finals, layout, x_dtype):
  y = Tensor.stack(ys, axis=1)  # (T, dirs, B, H)
  hs = [Tensor.stack([f[i] for f in finals], axis=0) for i in range(len(finals[0]))]
  if layout: y, hs = y.permute(2, 0, 1, 3), [h.transpose(0, 1) for h in hs]
  return (y.cast(x_dtype), *[h.cast(x_dtype) for h in hs])

def _clip(x, clip): return x.maximum(-clip).minimum(clip) if clip is not None else x

@op("RNN", since=7)
def rnn(n, x, w, r, b=None, sequence_lens=None, initial_h=None, activation_alpha=None, activation_beta=None,
        activations=None, clip=None, direction="forward", hidden_size=None, layout=0):
  x, T, B, H, ndir, b, h0, lens = _rnn_setup(n, x, w, r, b, sequence_lens, initial_h, layout, direction, 1)
  acts = _activations(activations, activation_alpha, activation_beta, ["Tanh"], ndir)
  def step(d, xt, st):
    h = acts[d][0](_clip(xt.matmul(w[d].T) + st[0].matmul(r[d].T) + b[d][:H] + b[d][H:], clip))
    return h, (h,)
  init = lambda d: (h0[d] if h0 is not None else Tensor(np.zeros((B, H), dtype=x.dtype.np)),)
  return _rnn_outputs(*_run_dirs(x, T, ndir, direction, lens, step, init), layout, x.dtype)

@op("GRU", since=7)
def gru(n, x, w, r, b=None, sequence_lens=None, initial_h=None, activation_alpha=None, activation_beta=None,
        activations=None, clip=None, direction="forward", hidden_size=None, layout=0, linear_before_reset=0):
  x, T, B, H, ndir, b, h0, lens = _rnn_setup(n, x, w, r, b, sequence_lens, initial_h, layout, direction, 3)
  acts = _activations(activations, activation_alpha, activation_beta, ["Sigmoid", "Tanh"], ndir)
  def step(d, xt, st):
    f, g = acts[d]
    hp = st[0]
    xw = xt.matmul(w[d].T) + b[d][:3 * H]
    rb = b[d][3 * H:]
    hr = hp.matmul(r[d][:2 * H].T) + rb[:2 * H]
    z = f(_clip(xw[:, :H] + hr[:, :H], clip))
    rr = f(_clip(xw[:, H:2 * H] + hr[:, H:], clip))
    if linear_before_reset: hh = rr * (hp.matmul(r[d][2 * H:].T) + rb[2 * H:])
    else: hh = (rr * hp).matmul(r[d][2 * H:].T) + rb[2 * H:]
    ht = g(_clip(xw[:, 2 * H:] + hh, clip))
    h = (1 - z) * ht + z * hp
    return h, (h,)
  init = lambda d: (h0[d] if h0 is not None else Tensor(np.zeros((B, H), dtype=x.dtype.np)),)
  return _rnn_outputs(*_run_dirs(x, T, ndir, direction, lens, step, init), layout, x.dtype)

@op("LSTM", since=7)
def lstm(n, x, w, r, b=None, sequence_lens=None, initial_h=None, initial_c=None, p=None, activation_alpha=None,
         activation_beta=None, activations=None, clip=None, direction="forward", hidden_size=None, input_forget=0, layout=0):
  x, T, B, H, ndir, b, h0, lens = _rnn_setup(n, x, w, r, b, sequence_lens, initial_h, layout, direction, 4)
  if initial_c is not None and layout: initial_c = initial_c.transpose(0, 1)
  acts = _activations(activations, activation_alpha, activation_beta, ["Sigmoid", "Tanh", "Tanh"], ndir)
  def step(d, xt, st):
    gts = xt.matmul(w[d].T) + st[0].matmul(r[d].T) + b[d][:4 * H] + b[d][4 * H:]
    return lstm_cell(acts[d], gts, st[1], p[d] if p is not None else None, H, clip, input_forget)
  zeros = Tensor(np.zeros((B, H), dtype=x.dtype.np))
  init = lambda d: (h0[d] if h0 is not None else zeros, initial_c[d] if initial_c is not None else zeros)
  return _rnn_outputs(*_run_dirs(x, T, ndir, direction, lens, step, init), layout, x.dtype)

def lstm_cell(acts, gts, cp, p, H, clip, input_forget):
  """One LSTM step from its gate pre-activations gts (B, 4H, gates i o f c): -> (h, (h, c))."""
  f, g, hf = acts
  pi, po, pf = (p[:H], p[H:2 * H], p[2 * H:]) if p is not None else (0.0, 0.0, 0.0)
  i = f(_clip(gts[:, :H] + pi * cp, clip))
  fg = 1 - i if input_forget else f(_clip(gts[:, 2 * H:3 * H] + pf * cp, clip))
  c = fg * cp + i * g(_clip(gts[:, 3 * H:], clip))
  o = f(_clip(gts[:, H:2 * H] + po * c, clip))
  h = o * hf(c)
  return h, (h, c)

# *** losses: labels are runtime values, picked with a one-hot mask rather than a gather ***

def _nll(x, target, weight, ignore_index, reduction):
  C = x.shape[1]
  onehot = _iota(C, 1, x.ndim) == target.cast(dtypes.int64).unsqueeze(1)
  picked = _reduce(onehot.where(x, 0.0), "sum", (1,))
  w = _reduce(onehot.where(weight.reshape((1, C) + (1,) * (x.ndim - 2)), 0.0), "sum", (1,)) if weight is not None \
    else Tensor(np.ones((), dtype=x.dtype.np))
  if ignore_index is not None: w = (target == ignore_index).where(0.0, w)
  w = w.cast(x.dtype)._broadcast_to(picked.shape)
  loss = -picked * w
  if reduction == "none": return loss.cast(x.dtype)
  if reduction == "sum": return loss.sum().cast(x.dtype)
  if reduction == "mean": return (loss.sum() / w.sum()).cast(x.dtype)
  raise Unsupported(f"reduction {reduction!r}")

@op("NegativeLogLikelihoodLoss", since=12)
def nll_loss(n, x, target, weight=None, ignore_index=None, reduction="mean"):
  return _nll(x, target, weight, ignore_index, reduction)

@op("SoftmaxCrossEntropyLoss", since=12)
def sce_loss(n, scores, labels, weights=None, ignore_index=None, reduction="mean"):
  logp = scores.log_softmax(1).cast(scores.dtype)
  return _nll(logp, labels, weights, ignore_index, reduction), logp

# *** quantisation ***

def _qparam(s, x, axis, block_size):
  """A scale/zero point shaped to broadcast against x: per tensor, per axis, or blocked along axis."""
  if s.ndim == 0 or s.numel() == 1 and block_size == 0: return s.reshape(())
  axis = axis % x.ndim
  if s.ndim == 1 and not block_size: return s.reshape([-1 if i == axis else 1 for i in range(x.ndim)])
  # blocked: repeat each entry block_size times along axis, then cut to x's length
  rep = s.unsqueeze(axis + 1)
  rep = rep.expand(rep.shape[:axis + 1] + (block_size,) + rep.shape[axis + 2:])
  rep = rep.reshape(s.shape[:axis] + (s.shape[axis] * block_size,) + s.shape[axis + 1:])
  return rep.shrink([(0, x.shape[axis]) if i == axis else None for i in range(x.ndim)])

_QTYPES = (dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32)

# the range a quantized narrow int saturates to
_NARROW_INT_RANGE = {"int4": (-8, 7), "uint4": (0, 15), "int2": (-2, 1), "uint2": (0, 3)}

def _quantize(x, scale, zp, out_dt, saturate: bool = True):
  """out_dt: a DType or a narrow type (aot/dtype.py: NARROW); the narrow floats round and saturate as Cast does."""
  f = narrow.narrow_of(out_dt)
  if f is None and out_dt not in _QTYPES: raise Unsupported(f"quantize to {out_dt.name}")
  q = x.cast(dtypes.float32) / scale.cast(dtypes.float32)
  if f is not None and f.is_float:
    if zp is not None: q = q + zp
    return narrow.Stored(narrow.encode(q, f, saturate), f)
  q = q.round()
  if zp is not None: q = q + zp.cast(dtypes.float32)
  lo, hi = _NARROW_INT_RANGE[f.name] if f is not None else (min_value(out_dt), max_value(out_dt))
  q = q.maximum(float(lo)).minimum(float(hi))
  return narrow.Stored(q.cast(f.storage), f) if f is not None else q.cast(out_dt)

def _wide(t):
  """A quantization parameter or input in its computing type: a narrow float decoded, a narrow int's values."""
  f = narrow.fmt_of(t)
  return narrow.decode(t, f) if f is not None and f.is_float else t

@op("QuantizeLinear", since=10)
def quantize_linear(n, x, y_scale, y_zero_point=None, axis=1, saturate=1, block_size=0, output_dtype=0, precision=0):
  zp_type = None if y_zero_point is None else narrow.fmt_of(y_zero_point) or y_zero_point.dtype
  out_dt = zp_type or (onnx_type(output_dtype) if output_dtype else dtypes.uint8)
  x, y_scale = _wide(x), _wide(y_scale)
  s = _qparam(y_scale, x, axis, block_size)
  z = _qparam(_wide(y_zero_point), x, axis, block_size) if y_zero_point is not None else None
  return _quantize(x, s, z, out_dt, bool(saturate))

@op("DequantizeLinear", since=10)
def dequantize_linear(n, x, x_scale, x_zero_point=None, axis=1, block_size=0, output_dtype=0):
  out = onnx_type(output_dtype) if output_dtype else narrow.fmt_of(x_scale) or x_scale.dtype
  x, x_scale = _wide(x), _wide(x_scale)
  s = _qparam(x_scale, x, axis, block_size)
  xf = x.cast(dtypes.float32)
  if x_zero_point is not None: xf = xf - _qparam(_wide(x_zero_point), x, axis, block_size).cast(dtypes.float32)
  return narrow.convert(xf * s.cast(dtypes.float32), out)

@op("QLinearMatMul", since=10)
def qlinear_matmul(n, a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp):
  acc = (a.cast(dtypes.int32) - _zp32(a_zp)).matmul(b.cast(dtypes.int32) - _zp32(b_zp))
  return _requant(acc, a_scale.cast(dtypes.float32) * b_scale.cast(dtypes.float32) / y_scale.cast(dtypes.float32), y_zp, a.dtype)

def _requant(acc, mult, y_zp, fallback):
  # onnxruntime rounds the scaled accumulator and then adds the zero point (adding it first can round a fraction away)
  d = (acc.cast(dtypes.float32) * mult).round()
  if y_zp is not None: d = d + y_zp.cast(dtypes.float32)
  dt = y_zp.dtype if y_zp is not None else fallback
  return d.maximum(float(min_value(dt))).minimum(float(max_value(dt))).cast(dt)

@op("QLinearConv", since=10)
def qlinear_conv(n, x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp, b=None, auto_pad="NOTSET", dilations=None,
                 group=1, kernel_shape=None, pads=None, strides=None):
  acc = conv_integer(n, x, w, x_zp, w_zp, auto_pad, dilations, group, kernel_shape, pads, strides)
  if b is not None: acc = acc + b.cast(dtypes.int32).reshape((1, -1) + (1,) * (x.ndim - 2))
  ws = w_scale.cast(dtypes.float32)
  if ws.ndim == 1 and ws.shape[0] > 1: ws = ws.reshape((1, -1) + (1,) * (x.ndim - 2))
  return _requant(acc, x_scale.cast(dtypes.float32) * ws / y_scale.cast(dtypes.float32), y_zp, x.dtype)

@op("CausalConvWithState", since=27)
def causal_conv_with_state(n, x, w, b=None, past_state=None, activation="none"):
  if activation not in ("none", "silu", "swish"): raise Unsupported(f"activation {activation!r}")
  B, C, L = x.shape
  k = w.shape[2]
  pad = past_state if past_state is not None else Tensor(np.zeros((B, C, k - 1), dtype=x.dtype.np))
  padded = Tensor.cat([pad, x], 2) if k > 1 else x
  y = _conv(padded, w, b, (1,), 0, (1,), C).cast(x.dtype)
  if activation != "none": y = (_f32(y) * _f32(y).sigmoid()).cast(x.dtype)
  return y, padded.shrink([None, None, (padded.shape[2] - (k - 1), padded.shape[2])])

@op("LinearAttention", since=27)
def linear_attention(n, q, k, v, past_state=None, decay=None, beta=None, chunk_size=None, kv_num_heads=None,
                     q_num_heads=None, scale=None, update_rule="gated_delta"):
  """The recurrent form, unrolled over the (static) sequence: state (B, Hkv, dk, dv) updated once per step."""
  if update_rule not in ("linear", "gated", "delta", "gated_delta"): raise Unsupported(f"update_rule {update_rule!r}")
  f = dtypes.float32
  B, T, _ = q.shape
  q4, k4, v4 = [_heads(t, h).cast(f) for t, h in ((q, q_num_heads), (k, kv_num_heads), (v, kv_num_heads))]
  dk, dv, grp = q4.shape[-1], v4.shape[-1], q_num_heads // kv_num_heads
  if decay is not None:
    decay = (decay.reshape(B, T, kv_num_heads, 1).permute(0, 2, 1, 3) if decay.shape[-1] == kv_num_heads
             else _heads(decay, kv_num_heads)).cast(f)
  if beta is not None: beta = beta.reshape(B, T, beta.shape[-1], 1).permute(0, 2, 1, 3).cast(f)
  state = past_state.cast(f) if past_state is not None else Tensor(np.zeros((B, kv_num_heads, dk, dv), np.float32))
  sc = float(scale) if scale else 1.0 / math.sqrt(dk)
  outs = []
  for i in range(T):
    kt, vt = k4[:, :, i, :], v4[:, :, i, :]
    if decay is not None: state = state * decay[:, :, i, :].exp().unsqueeze(-1)
    if beta is not None: vt = beta[:, :, i, :] * (vt - _reduce(state * kt.unsqueeze(-1), "sum", (2,)))
    state = state + kt.unsqueeze(-1) * vt.unsqueeze(-2)
    rd = state if grp == 1 else state.unsqueeze(2).expand(B, kv_num_heads, grp, dk, dv).reshape(B, q_num_heads, dk, dv)
    outs.append(_reduce(q4[:, :, i, :].unsqueeze(-1) * rd, "sum", (2,)) * sc)
  y = Tensor.stack(outs, axis=2).permute(0, 2, 1, 3).reshape(B, T, -1).cast(q.dtype)
  return y, state.cast(past_state.dtype if past_state is not None else q.dtype)

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
  if output_shape is None: return out
  # a given output shape holds the inferred one in its leading corner
  want = tuple(int(v) for v in n.const(output_shape, "output_shape"))[2:]
  return out.pad([(0, 0), (0, 0)] + [(0, w - o) for w, o in zip(want, out_sp)])

# *** FlexAttention: attention with user subgraphs applied to the whole score and probability tensors ***

_FLEX_PRECISION = {1: dtypes.float32, 10: dtypes.float16, 11: dtypes.float64}

@op("FlexAttention", since=1, domain="ai.onnx.preview")
def flex_attention(n, q, k, v, prob_mod=None, score_mod=None, scale=None, softmax_precision=None):
  B, Hq, L, E = q.shape
  Hkv, S = k.shape[1], k.shape[2]
  if Hq != Hkv:
    # grouped-query: each kv head serves Hq/Hkv consecutive query heads
    r = Hq // Hkv
    k, v = [t.unsqueeze(2).expand(B, Hkv, r, S, t.shape[3]).reshape(B, Hq, S, t.shape[3]) for t in (k, v)]
  if softmax_precision is not None and softmax_precision not in _FLEX_PRECISION:
    raise Unsupported(f"softmax_precision {softmax_precision}")
  cd = _FLEX_PRECISION[softmax_precision] if softmax_precision is not None else \
    (dtypes.float32 if q.dtype.itemsize < 4 else q.dtype)
  # Q and K are each pre-scaled by sqrt(scale), computed in float32 and rounded to the input type, as the reference does
  sq = float(np.array(np.sqrt(np.float32(scale if scale is not None else 1.0 / np.sqrt(E))), dtype=q.dtype.np))
  scores = _mm((q * sq).cast(q.dtype), (k * sq).cast(q.dtype).transpose(-1, -2)).cast(cd)
  if score_mod is not None: scores = _one_output(n, score_mod, scores).cast(cd)
  e = (scores - scores.max(-1, keepdim=True)).exp()
  p = e / e.sum(-1, keepdim=True)
  if prob_mod is not None: p = _one_output(n, prob_mod, p).cast(cd)
  return _mm(p, v.cast(cd)).cast(v.dtype)

def _one_output(n, g, t: Tensor) -> Tensor:
  if len(g.input) != 1 or len(g.output) != 1: raise Unsupported("a FlexAttention modifier takes one input and gives one output")
  (out,) = n.subgraph(g, [t])
  if not isinstance(out, Tensor): raise Unsupported("the FlexAttention modifier subgraph cannot be compiled")
  return out
