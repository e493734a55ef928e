"""int8 contractions: the compile-time half of the runtime's int8 microkernel (runtime_c/aot_qgemm.c).

A quantized matmul or convolution sums products of uint8 (or int8) activations and int8 weights in int32, then
requantizes: out = clamp(rint(float(acc) * x_scale * w_scale[n] / y_scale) + y_zero), round half to even, as
onnxruntime computes QLinearConv/QLinearMatMul and the DequantizeLinear -> Conv/MatMul -> QuantizeLinear groups it
fuses into them. The weights are packed here, ahead of time, in the tiles the microkernel reads, with their column
sums for the activations' zero point: sum_k (a - z) w = sum_k a w - z sum_k w."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from aot.codegen.lower.qgemm import QGemm
from aot.codegen.lower.qpool import QIm2col, im2col
from aot.core.dtype import dtypes
from aot.core.ir import Ops, ReduceOp, UOp, flat_of, prod, ranges_of
from aot.core.rewrite import graph_rewrite, substitute
from aot.core.symbolic import flat_stride, from_linear, linear, pm_simplify
from aot.scheduler.kernel import Buffer, Kernel

# columns of a packed weight tile (QNR in runtime_c/aot_qgemm.h): two 16-lane int32 vectors of the microkernel
QNR = 32
# k steps one vpdpbusd lane sums: the packed k axis is padded to a multiple of this
K_GROUP = 4


def pack_weights(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(packed, col_sum) of int8 weights w[K][N]: packed as [N/QNR][K4/K_GROUP][QNR][K_GROUP] int8 (zero padded to
  whole tiles and groups), col_sum[n] = sum_k w[k][n] in int32."""
  if w.dtype != np.int8 or w.ndim != 2:
    raise ValueError(f"pack_weights: expected int8 [K, N] weights, got {w.dtype} {w.shape}")
  K, N = w.shape
  K4, NP = -(-K // K_GROUP) * K_GROUP, -(-N // QNR) * QNR
  padded = np.zeros((K4, NP), np.int8)
  padded[:K, :N] = w
  packed = padded.reshape(K4 // K_GROUP, K_GROUP, NP // QNR, QNR).transpose(2, 0, 3, 1)
  return np.ascontiguousarray(packed).reshape(-1), w.astype(np.int32).sum(0, dtype=np.int32)


def requantize(acc: np.ndarray, scale: np.ndarray, zero: int, dtype) -> np.ndarray:
  """acc (int32) to dtype as onnxruntime requantizes: float32 product, round half to even, add the zero, saturate."""
  info = np.iinfo(dtype)
  r = np.rint(acc.astype(np.float32) * np.asarray(scale, np.float32))
  return np.clip(r + zero, info.min, info.max).astype(dtype)


# *** int32 contractions with a requantizing store to the int8 microkernel ***

_QTYPES = {dtypes.uint8: 1, dtypes.int8: 2}


def _const(u: UOp):
  return u.arg if u.op is Ops.CONST else None


def _requant(value: UOp):
  """(int32 sum, scale node, zero point, dtype) of CAST(dt, MIN(MAX(ROUND(sum * scale) [+ zero], lo), hi)), else None:
  the zero point added after rounding, as onnxruntime does and the runtime's requantization computes."""
  if value.op is not Ops.CAST or value.dtype not in _QTYPES:
    return None
  info = np.iinfo(value.dtype.np)
  mn = value.src[0]
  if mn.op is not Ops.MIN or _const(mn.src[1]) != info.max or mn.src[0].op is not Ops.MAX:
    return None
  mx = mn.src[0]
  if _const(mx.src[1]) != info.min:
    return None
  r, zero = mx.src[0], 0
  # the zero point added after rounding (as onnxruntime does: the frontend's QLinearConv/QLinearMatMul)
  if r.op is Ops.ADD and (z := _const(r.src[1])) is not None and float(z).is_integer():
    r, zero = r.src[0], int(z)
  if r.op is not Ops.ROUND:
    return None
  x = r.src[0]
  if x.op is not Ops.MUL or x.src[0].op is not Ops.CAST or x.src[0].src[0].dtype != dtypes.int32:
    return None
  return x.src[0].src[0], x.src[1], zero, value.dtype


def _per_n(u: UOp, n_rows, bufs) -> np.ndarray | None:
  """A constant vector over the flat n (a per-channel value), or a scalar constant, as an array; else None."""
  if u.op is Ops.CONST:
    return np.array([u.arg])
  if u.op is not Ops.LOAD or _const(u.src[2]) is not True or bufs[u.src[0].arg].kind != "const":
    return None
  terms, offset = linear(u.src[1])
  if set(terms) - set(n_rows) or flat_stride(n_rows, terms) != 1:
    return None
  n = prod(r.size for r in n_rows)
  data = np.asarray(bufs[u.src[0].arg].data).reshape(-1)
  return data[offset : offset + n] if offset + n <= data.size else None


def _activation(x: UOp):
  """(gate, load, zero) of an int32 operand that reads a buffer where its gate is on and is zero elsewhere: an int32
  buffer (zero None: its producer says what it holds), or an 8-bit one less a constant zero point (a narrowed
  producer's, narrow_int8_producers; the load's own gate folded into gate); else None."""
  gate = None
  while x.op is Ops.WHERE and _const(x.src[2]) == 0:
    gate, x = x.src[0] if gate is None else gate & x.src[0], x.src[1]
  if x.op is Ops.SUB and (z := _const(x.src[1])) is not None and x.src[0].op is Ops.CAST and x.dtype == dtypes.int32:
    load = x.src[0].src[0]
    if load.op is not Ops.LOAD or load.dtype not in _QTYPES:
      return None
    if _const(load.src[2]) is not True:
      gate = load.src[2] if gate is None else gate & load.src[2]
    return gate, load, int(z)
  if x.op is not Ops.LOAD or x.dtype != dtypes.int32:
    return None
  return gate, x, None


def _int8_source(kernel, qresults: dict):
  """(8-bit buffer, zero point) holding what the kernel writes plus the zero point, at the same index, when the kernel
  is x8[i] - zero, read from an 8-bit buffer or from an int8 contraction's requantized result; (x8's dtype, zero
  point) when x8 is computed; else None. The zero point is an int, or an int32 UOp over the kernel's buffers that no
  output index changes (DynamicQuantizeLinear's, computed at run time from the tensor's range)."""
  value = kernel.ast.src[2]
  widened = _widened(value)
  if (
    widened is None
    and value.op is Ops.SUB
    and value.src[1].dtype == dtypes.int32
    and not ranges_of(value.src[1]) & ranges_of(kernel.ast.src[1])
    and (w := _widened(value.src[0])) is not None
  ):
    widened = (w[0], value.src[1])
  if widened is None:
    return None
  x8, zero = widened
  if x8.op is Ops.LOAD and _const(x8.src[2]) is True and linear(x8.src[1]) == linear(kernel.ast.src[1]):
    return kernel.bufs[x8.src[0].arg], zero
  if (r := qresults.get(id(kernel.bufs[0]))) is not None and r[0] is x8:
    return r[1], zero
  # any other 8-bit value (a requantized residual add): read back from the int32 the kernel wrote
  return x8.dtype, zero


def _k_major(m_rows, k) -> bool:
  """Is a dense A written k-major ([K][M], the runtime transposing 4x8 byte blocks as it packs)? When k's innermost
  range is the shorter: the copy's inner loop then runs along a convolution's output row, not its 3-wide window."""
  return bool(m_rows) and k[-1].size < m_rows[-1].size


# contractions of one int8 kernel split by its outer m rows (a batch's images, where each image's rows are flat but the
# batch's are not: NCHW's m is (image, h, w) with the channels between) at most: model.c has a call per image
MAX_SPLIT_CALLS = 64
# the widest contraction whose k-major A is read in place (wider: a row-major copy, as before). The microkernel packs
# A once per 128 columns of N, and a strided k-major A packs slower than a dense row-major copy (its last partial tile
# byte by byte): light:resnet50:qdq's 7x7 layers, 49x2048x512 ate 0.038 ms more per call reading in place against
# the 0.010 ms copy; 49x512x2048 +0.035 against 0.043; 196x256x1024 and the 28x28, 56x56 ones gained 0.07-0.22 ms each
MAX_KMAJOR_IN_PLACE_N = 1024


def _in_place(load: UOp, m_rows: tuple, k: tuple, N: int, out_terms: dict) -> tuple[bool, int, tuple] | None:
  """(k_major, lda, the outer m rows split into calls of their own) when the load reads A's (m, k) where it lies, at
  offset + m*lda + k (a matmul's input: k contiguous) or at offset + k*lda + m (a 1x1 stride-1 convolution's NCHW
  input: each channel's plane a row of the k-major A), over the m rows inside the outer ones; else None. Rows are
  split only where the output's m rows are not flat as a whole (a batch of NCHW images)."""
  terms, offset = linear(load.src[1])
  if offset < 0 or set(terms) - set(m_rows) - set(k) or _const(load.src[2]) is not True:
    return None
  for s in [0] if flat_stride(m_rows, out_terms) is not None else range(1, len(m_rows)):
    outer, inner = m_rows[:s], m_rows[s:]
    if prod(r.size for r in outer) > MAX_SPLIT_CALLS or flat_stride(inner, out_terms) is None:
      continue
    if flat_stride(k, terms) == 1 and (lda := flat_stride(inner, terms) if inner else prod(r.size for r in k)):
      return False, lda, outer
    if inner and N <= MAX_KMAJOR_IN_PLACE_N and flat_stride(inner, terms) == 1 and (lda := flat_stride(k, terms)):
      return True, lda, outer
  return None


@dataclass
class _Sum:
  """An int8 contraction's sum as _lower_one reads it: requantized (scale, out_zero into out_dt) or its int32 sum
  (scale None), a bias, the sum's k ranges, its activation side x (gate, load, the 8-bit buffer or the kernel it is
  read back from as int32 and its zero point) and its constant weight side w."""

  acc: UOp
  scale: UOp | None
  out_zero: int
  out_dt: object
  bias: UOp | None
  k: tuple
  x: UOp
  w: UOp
  gate: UOp | None
  load: UOp
  x8_buf: object  # the 8-bit Buffer A is read from, or the int32 dtype-of-A read back from the producer's output
  p_zero: object  # A's zero point: an int, or a UOp computed at run time


def _sum_of(requant: UOp, bufs: list, producers: dict, qresults: dict) -> _Sum | None:
  """requant's sum of products of 8-bit activations and int8 constants, else None."""
  if requant.op is Ops.ACCUMULATE:
    total, scale, out_zero, out_dt = requant, None, 0, dtypes.int32
  else:
    total, scale, out_zero, out_dt = _requant(requant)
  bias = None
  if total.op is Ops.ADD:
    total, bias = total.src
  if total.op is not Ops.ACCUMULATE or total.arg is not ReduceOp.SUM or total.src[0].op is not Ops.MUL:
    return None
  acc = total
  k = tuple(sorted(acc.src[1:], key=lambda r: r.number))
  x, w = acc.src[0].src
  consts = lambda u: all(bufs[l.src[0].arg].kind == "const" for l in u.toposort() if l.op is Ops.LOAD)
  if consts(x):
    x, w = w, x
  if not consts(w) or consts(x):
    return None
  act = _activation(x)
  if act is None:
    return None
  gate, load, zero8 = act
  src = producers.get(id(bufs[load.src[0].arg]))
  source = (bufs[load.src[0].arg], zero8) if zero8 is not None else None if src is None else _int8_source(src, qresults)
  if source is None:
    return None
  x8_buf, p_zero = source
  # a run-time zero point is read back from the int32 the producer wrote (below), not beside an 8-bit buffer
  if isinstance(p_zero, UOp) and isinstance(x8_buf, Buffer):
    return None
  return _Sum(acc, scale, out_zero, out_dt, bias, k, x, w, gate, load, x8_buf, p_zero)


@dataclass
class _Layout:
  """Where an int8 contraction's A and C lie: its m and n rows, C's index (at, its terms) and row strides (ldc), A's
  in-place reading (_in_place) or None, the outer m rows split into calls of their own, and M, N, K."""

  m_rows: tuple
  n_rows: tuple
  at: UOp
  out_terms: dict
  ldc: tuple
  in_place: tuple | None
  outer: tuple
  M: int
  N: int
  K: int


def _layout(ast: UOp, requant: UOp, q: _Sum, bare: bool) -> _Layout | None:
  """The layout of q's contraction in the kernel (bare: a requantized store, its result where the output has it),
  else None."""
  k, from_int32 = q.k, not isinstance(q.x8_buf, Buffer)
  m_rows = tuple(sorted(ranges_of(q.x) - set(k), key=lambda r: r.number))
  n_rows = tuple(sorted(ranges_of(q.w) - set(k), key=lambda r: r.number))
  # no m rows is one row (a batch-1 fully connected layer)
  if not n_rows or set(m_rows) & set(n_rows):
    return None
  if ranges_of(requant) - set(k) != set(m_rows) | set(n_rows):
    return None
  # the result where the output has it (a bare requantized store), else in a scratch in the kernel's loop order
  at = ast.src[1] if bare else flat_of(sorted(set(m_rows) | set(n_rows), key=lambda r: r.number))
  out_terms, out_offset = linear(at)
  if set(out_terms) != set(m_rows) | set(n_rows) or out_offset != 0:
    return None
  # A where it lies, no copy (over the m rows inside those split off into calls of their own), when the load reads it so
  N = prod(r.size for r in n_rows)
  in_place = None if from_int32 or q.gate is not None else _in_place(q.load, m_rows, k, N, out_terms)
  outer = () if in_place is None else in_place[2]
  ldc = (flat_stride(m_rows[len(outer) :], out_terms), flat_stride(n_rows, out_terms))
  if None in ldc and not bare and not outer:
    # loops interleaving m's and n's (attention's heads split out of a projection's columns): the scratch m-major
    at = flat_of([*m_rows, *n_rows])
    out_terms, _ = linear(at)
    ldc = (flat_stride(m_rows, out_terms), flat_stride(n_rows, out_terms))
  if None in ldc:
    return None
  M, K = prod(r.size for r in m_rows[len(outer) :]), prod(r.size for r in k)
  return _Layout(m_rows, n_rows, at, out_terms, ldc, in_place, outer, M, N, K)


def _weights(q: _Sum, lay: _Layout, bufs: list) -> tuple | None:
  """(the packed int8 weights, their column sums, per-n scales, per-n biases) evaluated with numpy as the float
  microkernel's constants are, else None (weights outside int8, a scale or bias that varies but along n)."""
  scales = None if q.scale is None else _per_n(q.scale, lay.n_rows, bufs)
  biases = None if q.bias is None else _per_n(q.bias, lay.n_rows, bufs)
  if (q.scale is not None and scales is None) or (q.bias is not None and biases is None):
    return None
  from aot.codegen.lower.contract import Contraction, Side, evaluate_operand

  c = Contraction(q.acc, (), q.k, Side(q.x, lay.m_rows), Side(q.w, lay.n_rows))
  data = {l.src[0].arg: bufs[l.src[0].arg].data for l in q.w.toposort() if l.op is Ops.LOAD}
  grid = evaluate_operand(c, c.b, lay.N, data).reshape(lay.K, lay.N)
  if grid.min() < -128 or grid.max() > 127:
    return None
  return (*pack_weights(grid.astype(np.int8)), scales, biases)


def _runtime_zero(load: UOp, bufs: list, slot) -> tuple[int, dict, UOp]:
  """A's zero point computed at run time: a kernel of its own writes it into a 1-element int32 the microkernel and
  A's copy read. A read back from int32 x8 - zero is that less its minimum (0..255 whatever x8's type; A's zero point
  minus the minimum): one integer reduction, not the producer's float range again. (A's zero point as a constant,
  QGemm's runtime fields, the load of it.)"""
  # one loop per dim of the buffer (a dim run to a size given at run time is then a loop of its own: its rows past
  # the size are not the run's)
  buf = bufs[load.src[0].arg]
  dims = [d for d in (buf.shape if prod(buf.shape) == buf.size else (buf.size,)) if d > 1] or [1]
  every = [UOp(Ops.RANGE, dtypes.index, (), (i, d, "reduce")) for i, d in enumerate(dims)]
  at = UOp.const(dtypes.index, 0)
  for r, stride in zip(every, [prod(dims[i + 1 :]) for i in range(len(dims))]):
    at = at + r * UOp.const(dtypes.index, stride) if stride != 1 else at + r
  v = UOp(Ops.LOAD, dtypes.int32, (load.src[0], at, UOp.const(dtypes.bool, True)))
  zero = UOp(
    Ops.SUB, dtypes.int32, (UOp.const(dtypes.int32, 0), UOp(Ops.ACCUMULATE, dtypes.int32, (v, *every), ReduceOp.MIN))
  )
  zero_slot = slot(Buffer("scratch", dtypes.int32, 1, "qgemm zero"))
  zero_ast = UOp(
    Ops.STORE, dtypes.void, (UOp(Ops.DEFINE_GLOBAL, dtypes.int32, (), 0), UOp.const(dtypes.index, 0), zero)
  )
  zero_read = UOp(
    Ops.LOAD,
    dtypes.int32,
    (UOp(Ops.DEFINE_GLOBAL, dtypes.int32, (), zero_slot), UOp.const(dtypes.index, 0), UOp.const(dtypes.bool, True)),
  )
  return 0, dict(zero_slot=zero_slot, zero=zero_ast), zero_read


def _dense_a(q: _Sum, lay: _Layout, a_dt, x8_slot: int, a_slot: int, p_zero: int, zero_read: UOp | None):
  """(the kernel writing A as a dense [M][K] (or k-major [K][M]) byte matrix into slot 0, k_major), or the runtime's
  im2col for it (an 8-bit convolution's input: strided rows read as vectors, not byte by byte) with no kernel."""
  load, k, m_rows, M, K = q.load, q.k, lay.m_rows, lay.M, lay.K
  from_int32 = not isinstance(q.x8_buf, Buffer)
  k_major = _k_major(m_rows, k)
  if k_major and not from_int32 and zero_read is None:
    cols = im2col(load, [] if q.gate is None else [q.gate], m_rows, k, p_zero, x8_slot, a_slot)
    if cols is not None:
      return cols, True
  # else the 8-bit activation at each (m, k), its zero point where the gate is off, written out as a [M][K] matrix
  order = [*k, *m_rows] if k_major else [*m_rows, *k]
  fresh = {r: UOp(Ops.RANGE, dtypes.index, (), (i, r.size, "loop")) for i, r in enumerate(order)}
  if from_int32:
    read = UOp(Ops.CAST, a_dt, (load + (p_zero if zero_read is None else zero_read),))
  else:
    read = UOp(Ops.LOAD, a_dt, (UOp(Ops.DEFINE_GLOBAL, a_dt, (), x8_slot), load.src[1], load.src[2]))
  pad = UOp.const(a_dt, p_zero) if zero_read is None else UOp(Ops.CAST, a_dt, (zero_read,))
  value = read if q.gate is None else UOp(Ops.WHERE, a_dt, (q.gate, read, pad))
  m_flat, k_flat = flat_of([fresh[r] for r in m_rows]), flat_of([fresh[r] for r in k])
  idx = k_flat * M + m_flat if k_major else m_flat * K + k_flat
  dense = graph_rewrite(
    UOp(Ops.STORE, dtypes.void, (UOp(Ops.DEFINE_GLOBAL, a_dt, (), 0), idx, substitute(value, fresh))), pm_simplify
  )
  return dense, k_major


def _lower_one(ast: UOp, requant: UOp, bare: bool, bufs: list, made: list, producers: dict, qresults: dict):
  """(its QGemms: one, or one per image of a batch; the load of their result) of one int8 contraction of the kernel,
  requantized (requant a _requant node) or its int32 sum (requant the ACCUMULATE: MatMulInteger's, which the epilogue
  scales to float), its buffers appended to bufs (and the new ones to made); None when it is not one."""
  q = _sum_of(requant, bufs, producers, qresults)
  lay = None if q is None else _layout(ast, requant, q, bare)
  weights = None if lay is None else _weights(q, lay, bufs)
  if weights is None:
    return None
  packed, col_sum, scales, biases = weights

  def slot(b: Buffer, new: bool = True) -> int:
    bufs.append(b)
    if new:
      made.append(b)
    return len(bufs) - 1

  const = lambda dt, arr: slot(Buffer("const", dt, arr.size, "qgemm", shape=arr.shape, data=arr))
  # a computed 8-bit value is read back from the kernel's int32 output, plus its zero point
  from_int32, load, M, N, K = not isinstance(q.x8_buf, Buffer), q.load, lay.M, lay.N, lay.K
  a_dt = q.x8_buf if from_int32 else q.x8_buf.dtype
  c_slot = 0 if bare else slot(Buffer("scratch", q.out_dt, prod(r.size for r in lay.m_rows) * N, "qgemm C"))
  x8_slot = load.src[0].arg if from_int32 else slot(q.x8_buf, new=False)
  result = UOp(Ops.LOAD, q.out_dt, (UOp(Ops.DEFINE_GLOBAL, q.out_dt, (), c_slot), lay.at, UOp.const(dtypes.bool, True)))
  tail = (
    const(dtypes.int8, packed),
    const(dtypes.int32, col_sum),
    None if biases is None else const(dtypes.int32, biases.astype(np.int32)),
    None if scales is None else const(dtypes.float32, scales.astype(np.float32)),
    int(scales is not None and scales.size > 1),
    _QTYPES.get(q.out_dt, 0),
    q.out_zero,
    lay.ldc,
  )
  p_zero, runtime, zero_read = q.p_zero, {}, None
  if isinstance(p_zero, UOp):
    a_dt = dtypes.uint8
    p_zero, runtime, zero_read = _runtime_zero(load, bufs, slot)
  if lay.in_place is not None:
    k_major, lda, outer = lay.in_place
    terms, offset = linear(load.src[1])
    calls = []
    for image in itertools.product(*(range(r.size) for r in outer)):
      a_at = offset + sum(i * terms.get(r, 0) for i, r in zip(image, outer))
      c_at = sum(i * lay.out_terms[r] for i, r in zip(image, outer))
      signed = a_dt == dtypes.int8
      calls.append(QGemm(M, N, K, x8_slot, a_at, lda, signed, p_zero, *tail, None, c_slot, k_major, c_offset=c_at))
    return calls, result
  a_slot = slot(Buffer("scratch", a_dt, M * K, "qgemm A"))
  dense, k_major = _dense_a(q, lay, a_dt, x8_slot, a_slot, p_zero, zero_read)
  lda, signed = M if k_major else K, a_dt == dtypes.int8
  if isinstance(dense, QIm2col):
    return [QGemm(M, N, K, a_slot, 0, lda, signed, p_zero, *tail, None, c_slot, True, im2col=dense)], result
  return [QGemm(M, N, K, a_slot, 0, lda, signed, p_zero, *tail, dense, c_slot, k_major, **runtime)], result


def _slice_bounds(cond: UOp) -> tuple[UOp, int, int] | None:
  """(loop range, start, end) of a gate r < end, not r < start, or both ANDed (a concat branch's, schedule.py's
  PAD lowering), else None."""
  if cond.op is Ops.AND:
    a, b = _slice_bounds(cond.src[0]), _slice_bounds(cond.src[1])
    if a is None or b is None or a[0] is not b[0]:
      return None
    return a[0], max(a[1], b[1]), min(a[2], b[2])
  neg = cond.op is Ops.NOT
  lt = cond.src[0] if neg else cond
  if lt.op is not Ops.CMPLT or lt.src[0].op is not Ops.RANGE or lt.src[0].arg[2] != "loop":
    return None
  r, bound = lt.src[0], _const(lt.src[1])
  if not isinstance(bound, int) or not 0 < bound < r.size:
    return None
  return (r, bound, r.size) if neg else (r, 0, bound)


def _conjuncts(cond: UOp) -> list[UOp]:
  return _conjuncts(cond.src[0]) + _conjuncts(cond.src[1]) if cond.op is Ops.AND else [cond]


def _guards(value: UOp, node: UOp) -> set[UOp]:
  """The conditions that hold wherever value uses node: conjuncts of the gates of WHERE(gate, ..., 0) on every path
  from value down to node (a concat's branch slice, a padded pool's window gate), node's value elsewhere unused."""
  topo = value.toposort()
  if node not in set(topo):
    return set()
  held: dict[UOp, set | None] = {u: None for u in topo}
  held[value] = set()
  for u in reversed(topo):
    if held[u] is None or u is node:
      continue
    for i, src in enumerate(u.src):
      extra = _conjuncts(u.src[0]) if u.op is Ops.WHERE and i == 1 and _const(u.src[2]) == 0 else []
      got = held[u] | set(extra)
      held[src] = got if held[src] is None else held[src] & got
  return held[node] or set()


# a grouped convolution's groups are contractions of their own, one microkernel call each: at most this many, each
# of this many output channels at least (fewer wastes most of the microkernel's 32 lanes; depthwise ones stay where
# they are)
MAX_GROUP_CALLS = 16
MIN_GROUP_CHANNELS = 8


def _slice(r: UOp, start: int, end: int) -> tuple:
  """Channels [start, end) of range r as (r, the slice's size, r at the slice's index i, i at r, where r is in it)."""
  gate = r.lt(end) if start == 0 else r.ge(start) if end == r.size else r.ge(start) & r.lt(end)
  return r, end - start, lambda i: i + start, r - start, gate


def _group_slices(node: UOp) -> list[list[tuple]]:
  """A grouped convolution's groups as slices (_slice's form) of its output channel range r, a list of them for each
  way the activations read the group: r // d (channels [g d, (g + 1) d)), or r % G (every G-th channel from g: a
  channel shuffle after the group convolution, ShuffleNet's, read through the output's index)."""
  ways = []
  for u in node.toposort():
    if u.op not in (Ops.IDIV, Ops.MOD) or u.src[0].op is not Ops.RANGE or u.src[0].arg[2] != "loop":
      continue
    r, d = u.src[0], _const(u.src[1])
    if not isinstance(d, int) or not 1 < d < r.size or r.size % d:
      continue
    groups, width = (r.size // d, d) if u.op is Ops.IDIV else (d, r.size // d)
    if groups > MAX_GROUP_CALLS or width < MIN_GROUP_CHANNELS:
      continue
    if u.op is Ops.IDIV:
      ways.append([_slice(r, g * d, (g + 1) * d) for g in range(groups)])
      continue
    phase = r % d
    ways.append([(r, width, lambda i, g=g: i * d + g, r // d, phase.ge(g) & phase.lt(g + 1)) for g in range(groups)])
  return ways


def _lower_branch(ast: UOp, requant: UOp, bufs: list, made: list, producers: dict, qresults: dict):
  """_lower_one of a contraction whose value the kernel uses only under gates (_guards), or one over slices of an
  output range: its constant operands' loads drop the consumer's gates that cannot guard their index (a padded
  pool's window gate on the weights: a pool reading a convolution); a slice of one output range among those gates (a
  concat's branch) is all it computes (concat branches computed everywhere by the generated loops cost a whole
  contraction each: light:squeezenet:qdq 98% of the run); a grouped convolution is one contraction per group
  (_group_slices: light:bvlc_alexnet:qdq's and light:shufflenet:qdq's were generated loops); results read back where
  their slice is; else None."""
  guards = _guards(ast.src[2], requant)
  # a gate on a constant load whose index it cannot guard is the consumer's, not the contraction's
  loose = {}
  for u in requant.toposort():
    if u.op is Ops.LOAD and bufs[u.src[0].arg].kind == "const" and _const(u.src[2]) is not True:
      index_ranges = ranges_of(u.src[1])
      drop = {c: UOp.const(dtypes.bool, True) for c in _conjuncts(u.src[2]) if c in guards}
      drop = {c: t for c, t in drop.items() if not ranges_of(c) & index_ranges}
      if drop:
        loose[u] = u.replace(src=(u.src[0], u.src[1], substitute(u.src[2], drop)))
  node = substitute(requant, loose) if loose else requant
  bounds = [b for c in guards if (b := _slice_bounds(c)) is not None]
  if bounds:
    r = bounds[0][0]
    start, end = max(b[1] for b in bounds), min(b[2] for b in bounds)
    if any(b[0] is not r for b in bounds) or start >= end:
      return None
    branch = _slice(r, start, end)
    # a branch that is itself a group convolution (ShuffleNet's stride-2 unit): its groups are slices of the branch
    inner = UOp(Ops.RANGE, dtypes.index, (), (r.number, end - start, r.arg[2]))
    within = _group_slices(graph_rewrite(substitute(node, {r: inner + start}), pm_simplify))
    back = {inner: r - start}
    ways = [
      [
        (r, size, lambda i, f=at: f(i) + start, substitute(at_r, back), branch[4] & substitute(gate, back))
        for _, size, at, at_r, gate in way
      ]
      for way in within
    ] or [[branch]]
  else:
    ways = _group_slices(node)
  if not ways:
    return _lower_one(ast, graph_rewrite(node, pm_simplify), False, bufs, made, producers, qresults) if loose else None
  for slices in ways:
    # a way that fails leaves its buffers appended: the next starts from the same lists
    trial_bufs, trial_made = list(bufs), list(made)
    if (out := _lower_slices(ast, node, slices, trial_bufs, trial_made, producers, qresults)) is not None:
      bufs[:], made[:] = trial_bufs, trial_made
      return out
  return None


def _lower_slices(ast: UOp, node: UOp, slices: list, bufs: list, made: list, producers: dict, qresults: dict):
  """(calls, result) of node's contraction computed over each slice of its output range by _lower_one, each slice's
  result read back where its gate is on (zero elsewhere: their sum is the one that is on); None when one fails."""
  calls, total, parts = [], None, []
  for r, size, at_inner, inner_at, gate in slices:
    inner = UOp(Ops.RANGE, dtypes.index, (), (r.number, size, r.arg[2]))
    sliced = graph_rewrite(substitute(node, {r: at_inner(inner)}), pm_simplify)
    if any(u is r for u in sliced.toposort()):
      return None
    out = _lower_one(ast, sliced, False, bufs, made, producers, qresults)
    if out is None:
      return None
    calls += out[0]
    parts.append((out, inner, at_inner(inner)))
    at = graph_rewrite(substitute(out[1].src[1], {inner: inner_at}), pm_simplify)
    read = out[1].replace(src=(out[1].src[0], at, gate))
    total = read if total is None else total + read
  return _one_result(parts, slices[0][0], bufs, made) or (calls, total)


def _one_result(parts: list, r: UOp, bufs: list, made: list):
  """(calls, result) with every slice's calls writing one scratch laid out as the whole contraction's result over
  range r, which the epilogue reads with one plain load (not a gated load per slice: a shuffled group convolution's
  epilogue ran at 0.4 GB/s), when r is the outermost range of the result's layout; else None."""
  (_, first), inner0, _ = parts[0]
  # slices that do not cover r (a concat's branch) keep a scratch of their own size
  if sum(inner.size for _, inner, _ in parts) != r.size:
    return None
  terms, offset = linear(first.src[1])
  rest = prod(u.size for u in terms if u is not inner0)
  if offset or terms.get(inner0) != rest or set(terms) != ranges_of(first.src[1]):
    return None
  # each slice's channel i is channel base + step * i of the whole
  placed = []
  for (calls, _), inner, at in parts:
    t, base = linear(graph_rewrite(at, pm_simplify))
    if set(t) != {inner} or any(q.c_slot == 0 for q in calls):
      return None
    placed.append((calls, base, t[inner]))
  whole = Buffer("scratch", bufs[placed[0][0][0].c_slot].dtype, rest * r.size, "qgemm C")
  mine = {id(bufs[q.c_slot]) for calls, _, _ in placed for q in calls}
  made[:] = [b for b in made if id(b) not in mine] + [whole]
  for calls, base, step in placed:
    for q in calls:
      bufs[q.c_slot] = whole
      q.c_offset += base * rest
      q.ldc = (q.ldc[0], q.ldc[1] * step)
  at = graph_rewrite(substitute(first.src[1], {inner0: r}), pm_simplify)
  return [q for calls, _, _ in placed for q in calls], first.replace(src=(first.src[0], at, first.src[2]))


def _widened(value: UOp) -> tuple[UOp, int] | None:
  """(x8, zero) of CAST(int32, x8) - zero, x8 an 8-bit value and zero a constant (or none), else None."""
  zero = 0
  if value.op is Ops.SUB and (z := _const(value.src[1])) is not None:
    value, zero = value.src[0], int(z)
  if value.op is not Ops.CAST or value.dtype != dtypes.int32 or value.src[0].dtype not in _QTYPES:
    return None
  return value.src[0], zero


def collapse_rows(ast: UOp) -> UOp:
  """An elementwise kernel with each pair of adjacent inner loops (a, b) that every index reads as one flat range
  (a's coefficient b.size times b's) made one loop of a.size * b.size, the outermost loop (the threads') kept: a
  quantized model's elementwise kernels over 14x14 or 7x7 planes (QDQ's requantized residual adds) ran their
  14-wide rows as scalar code. Values and the order of the stores are unchanged."""
  if ast.op is not Ops.STORE or any(u.op is Ops.ACCUMULATE for u in ast.toposort()):
    return ast
  while True:
    loops = sorted((u for u in ast.toposort() if u.op is Ops.RANGE), key=lambda r: r.number)
    access = [u for u in ast.toposort() if u.op in (Ops.LOAD, Ops.STORE)]
    merged = None
    for a, b in zip(loops[1:], loops[2:]):
      if b.number != a.number + 1:
        continue
      lin = [linear(u.src[1]) for u in access]
      if any(t.get(a, 0) != b.size * t.get(b, 0) for t, _ in lin):
        continue
      r = UOp(Ops.RANGE, dtypes.index, (), (a.number, a.size * b.size, a.kind))
      index = {}
      for u, (t, c) in zip(access, lin):
        k = t.pop(b, 0)
        t.pop(a, None)
        index[u.src[1]] = from_linear({**t, r: k}, c)
      new = substitute(ast, index)
      # a or b read anywhere but in an index (a padding gate) keeps the loops apart
      if not ranges_of(new) & {a, b}:
        merged = new
        break
    if merged is None:
      return ast
    ast = merged


def narrow_int8_producers(kernels: list) -> tuple[list, list[Buffer], set[int]]:
  """(kernels, the 8-bit buffers made, the ids of the int32 ones they replace): a kernel writing an 8-bit value widened
  to int32 less a constant zero point into a scratch (QuantizeLinear's, a requantized residual add's) writes the 8-bit
  value instead, and its readers widen it where they read it. A quarter of the bytes; an int8 contraction reading it
  then reads the bytes in place or copies bytes, not int32 it narrows again. Values are unchanged."""
  narrowed: dict[int, tuple[Buffer, int]] = {}
  out = []
  for k in kernels:
    ast, bufs = k.ast, list(k.bufs)
    # reads of a narrowed buffer: the byte widened, less the zero; zero where the read's gate is off, as before
    mapping = {}
    for u in ast.toposort():
      if u.op is not Ops.LOAD or (n := narrowed.get(id(k.bufs[u.src[0].arg]))) is None:
        continue
      b8, zero = n
      bufs[u.src[0].arg] = b8
      read = UOp(Ops.LOAD, b8.dtype, (UOp(Ops.DEFINE_GLOBAL, b8.dtype, (), u.src[0].arg), u.src[1], u.src[2]))
      v = UOp(Ops.SUB, dtypes.int32, (UOp(Ops.CAST, dtypes.int32, (read,)), UOp.const(dtypes.int32, zero)))
      mapping[u] = v if _const(u.src[2]) is True else UOp(Ops.WHERE, dtypes.int32, (u.src[2], v, u.const_like(0)))
    if mapping:
      ast = substitute(ast, mapping)
    if k.bufs[0].kind == "scratch" and ast.op is Ops.STORE and (w := _widened(ast.src[2])) is not None:
      x8, zero = w
      old = k.bufs[0]
      b8 = Buffer("scratch", x8.dtype, old.size, old.name, shape=old.shape)
      narrowed[id(old)] = (b8, zero)
      bufs[0] = b8
      ast = UOp(Ops.STORE, dtypes.void, (UOp(Ops.DEFINE_GLOBAL, x8.dtype, (), 0), ast.src[1], x8))
    if bufs[0].dtype in _QTYPES:
      ast = collapse_rows(ast)
    out.append(k if ast is k.ast else Kernel(k.name, ast, bufs, k.shape))
  return out, [b for b, _ in narrowed.values()], set(narrowed)


def lower_qgemm(ast: UOp, bufs: list, producers: dict, qresults: dict):
  """(the kernel's buffers with new slots appended, the buffers made for them, its QGemms, the kernel reading their
  results or None) when the kernel's contractions are int8 contractions with a requantizing cast (the int32 sum of
  8-bit activations times int8 constant weights, plus an int32 bias, scaled per tensor or per output channel), else
  None. producers: buffer id -> the kernel writing it; qresults (updated): output buffer id of a lowered kernel ->
  (its requantize node, the 8-bit buffer holding it)."""
  if ast.op is not Ops.STORE:
    return None
  # the requantized contractions: each holds one int32 sum, its own; sums around them (a global average pool of a
  # convolution's requantized result, itself requantized: QOperator ResNet's last layer) stay in the epilogue,
  # reading the int8 result
  sums = lambda u: sum(s.op is Ops.ACCUMULATE and s.dtype == dtypes.int32 for s in u.toposort())
  found = [u for u in ast.src[2].toposort() if _requant(u) is not None and sums(u) == 1]
  # a requantization of a value that holds another's (a QLinearMul of a concat of a convolution's requantized result:
  # QOperator DenseNet's transitions) is epilogue: the sum is the inner one's, whose failure to lower failed the kernel
  ids = {id(u) for u in found}
  found = [u for u in found if not any(id(v) in ids for v in u.toposort() if v is not u)]
  # int32 sums outside them (MatMulInteger, ConvInteger: scaled to float after) where they are int8 contractions
  inside = {id(v) for u in found for v in u.toposort()}
  found += [
    u for u in ast.src[2].toposort() if u.op is Ops.ACCUMULATE and u.dtype == dtypes.int32 and id(u) not in inside
  ]
  if not found:
    return None
  # a kernel that is one int8 contraction writes it straight to its output; else an epilogue reads them
  bare = len(found) == 1 and found[0] is ast.src[2]
  bufs, made, qgemms, results = list(bufs), [], [], {}
  requantized = True
  for node in found:
    r = _lower_one(ast, node, bare, bufs, made, producers, qresults)
    if r is None and bare:
      # a requantized store the microkernel's (ldm, ldn) cannot address (heads split out of the columns): the result
      # in a scratch, the epilogue storing it where it goes
      r = _lower_one(ast, node, False, bufs, made, producers, qresults)
      bare = r is None
    # a concat's branch, a grouped convolution: the contraction over slices of the output, an epilogue reading them
    if r is None and node.op is not Ops.ACCUMULATE:
      r = _lower_branch(ast, node, bufs, made, producers, qresults)
      # (its result is in slices, or laid out unlike the output: no reader takes it for the kernel's output)
      bare, requantized = bare and r is None, requantized and r is None
    if r is None and node.op is not Ops.ACCUMULATE:
      # a requantized sum with more than a bias around it (uint8 weights' zero-point term, a row sum of the
      # activations): its int32 sum on the microkernel, the rest in the epilogue; else the kernel is not lowered
      node = next(s for s in node.toposort() if s.op is Ops.ACCUMULATE and s.dtype == dtypes.int32)
      if (r := _lower_one(ast, node, False, bufs, made, producers, qresults)) is None:
        return None
      requantized = bare = False
    if r is None:
      # an int32 sum that is not an int8 contraction stays in the generated code
      continue
    qgemms += r[0]
    results[node] = r[1]
  if not qgemms:
    return None
  if bare:
    return bufs, made, qgemms, None
  if len(found) == 1 and found[0].op is not Ops.ACCUMULATE and requantized:
    qresults[id(bufs[0])] = (found[0], bufs[qgemms[0].c_slot])
  return bufs, made, qgemms, collapse_rows(graph_rewrite(substitute(ast, results), pm_simplify))
