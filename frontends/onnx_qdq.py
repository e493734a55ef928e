"""QDQ groups to the QLinear ops onnxruntime runs them as: an ONNX graph rewrite before the model is read
(frontends/onnx.py). DequantizeLinear -> Conv/MatMul/Gemm -> QuantizeLinear becomes QLinearConv, QLinearMatMul or
com.microsoft's QGemm, as onnxruntime's graph optimizer fuses them, so the contraction runs in integers and is
requantized once (float products in the dequantized form round differently); the int8 kernels themselves are
codegen/lower/quant.py's. Add, Mul and Softmax groups become com.microsoft's QLinearAdd, QLinearMul and QLinearSoftmax,
and ops that only move values run on the bytes between a DequantizeLinear and a QuantizeLinear of one scale."""

from __future__ import annotations

import numpy as np

# onnxruntime fuses a Gemm's group into com.microsoft's QGemm (Conv's and MatMul's into the ai.onnx QLinear ops)
MS = "com.microsoft"
_FUSED = {"Conv": ("QLinearConv", ""), "MatMul": ("QLinearMatMul", ""), "Gemm": ("QGemm", MS)}


def _redundant_clip(clip, q, consts: dict) -> bool:
  """Does QuantizeLinear q's saturation already do what Relu or Clip `clip` before it does? Then onnxruntime leaves
  the activation out of the group it fuses (its QDQ selectors' redundant Clip/Relu, and its Relu/Clip-QuantizeLinear
  rules that run before them), and so do we: a Relu when q's zero point is its type's least value (every negative
  value quantizes to it anyway), a Clip when its bounds quantize to or past the type's ends (rint(bound / scale) +
  zero point, as onnxruntime tests it), or lie within float32's epsilon of the ends' values (its earlier rule)."""
  scale, zero = consts.get(q.input[1]), consts.get(q.input[2]) if len(q.input) > 2 else None
  if scale is None or zero is None or scale.dtype != np.float32 or zero.dtype not in (np.uint8, np.int8):
    return False
  info, z = np.iinfo(zero.dtype), int(zero.reshape(()))
  if clip.op_type == "Relu":
    return z == info.min
  # (a Clip's test reads a scalar scale and zero point only: one of shape [1] keeps the Clip)
  if scale.ndim or zero.ndim:
    return False
  # the Clip's bounds: attributes before opset 11, constant inputs since (an absent one is float32's end)
  big = float(np.finfo(np.float32).max)
  lo, hi = -big, big
  for a in clip.attribute:
    lo = a.f if a.name == "min" else lo
    hi = a.f if a.name == "max" else hi
  for i, name in ((1, "lo"), (2, "hi")):
    if len(clip.input) <= i or not clip.input[i]:
      continue
    v = consts.get(clip.input[i])
    if v is None or v.size != 1 or v.dtype != np.float32:
      return False
    lo, hi = (float(v.reshape(())), hi) if name == "lo" else (lo, float(v.reshape(())))
  s = np.float32(scale.reshape(()))
  with np.errstate(over="ignore", invalid="ignore"):
    q_lo, q_hi = np.rint(np.float32(lo) / s), np.rint(np.float32(hi) / s)
  # an infinite quotient converts to int32 as x86 does (INT_MIN): a low bound then passes, a high one fails
  q_lo = q_lo + z if np.isfinite(q_lo) and abs(q_lo) < 2**31 else -(2**31)
  q_hi = q_hi + z if np.isfinite(q_hi) and abs(q_hi) < 2**31 else -(2**31)
  if q_lo <= info.min and q_hi >= info.max:
    return True
  eps = np.finfo(np.float32).eps
  lower, upper = s * np.float32(info.min - z), s * np.float32(info.max - z)
  return not (eps < np.float32(lo) - lower or eps < upper - np.float32(hi))


# onnxruntime (1.32) leaves a QDQ Conv in float when its bias's DequantizeLinear has a zero point or a scale away from
# x_scale * w_scale (the int32 bias is then not in the accumulator's scale). Found by trying, not in its source: it
# fuses at 2% apart (and at the product's rounding, which the quantizer writes), not at 5%. We fuse within
# BIAS_SCALE_RTOL; a bias between that and onnxruntime's bound runs as float, as it did before this fusion.
BIAS_SCALE_RTOL = 0.02


def _bias_at_product_scale(b, x, w, arrays) -> bool:
  """Is the int32 bias of DequantizeLinear b at the scale of x's and w's product, with zero points of zero?"""
  b_scale, x_scale, w_scale = arrays(b.input[1], x.input[1], w.input[1])
  b_zero = arrays(b.input[2])[0] if len(b.input) > 2 and b.input[2] else np.zeros(1, np.int32)
  if any(a is None for a in (b_scale, x_scale, w_scale, b_zero)) or np.any(b_zero != 0):
    return False
  want = (x_scale.astype(np.float32) * w_scale.astype(np.float32)).reshape(-1)
  got = b_scale.astype(np.float32).reshape(-1)
  if got.size not in (1, want.size) or not np.all(want > 0):
    return False
  return bool(np.all(np.abs(got - want) <= BIAS_SCALE_RTOL * want))


def _qdq_groups(model) -> list[tuple]:
  """(Conv/MatMul/Gemm node, its QuantizeLinear or None, the DequantizeLinear of x, of w, of the bias or None, a
  redundant Relu/Clip between the node and the QuantizeLinear or None) of each DequantizeLinear -> Conv/MatMul/Gemm
  [-> Relu or Clip] -> QuantizeLinear group onnxruntime's graph optimizer fuses, whose weights are constant and whose
  float result only the QuantizeLinear reads; and of each DequantizeLinear -> Gemm/MatMul it fuses with a float
  result (no QuantizeLinear)."""
  import onnx

  g = model.graph
  inits = {t.name for t in g.initializer}
  size = {t.name: int(np.prod(t.dims, dtype=np.int64)) for t in g.initializer}
  dtype = {t.name: t.data_type for t in g.initializer}
  small = {t.name: onnx.numpy_helper.to_array(t) for t in g.initializer if size[t.name] == 1}
  producer, readers, outputs = _graph_maps(g)
  by_name = {t.name: t for t in g.initializer}
  arrays = lambda *names: [onnx.numpy_helper.to_array(by_name[k]) if k in by_name else None for k in names]

  def dq(name: str):
    p = producer.get(name)
    return p if p is not None and p.op_type == "DequantizeLinear" and p.domain in ("", "ai.onnx") else None

  groups = []
  for n in g.node:
    if n.op_type not in _FUSED or n.domain not in ("", "ai.onnx") or len(n.input) < 2:
      continue
    # as onnxruntime's selectors read the group: a Relu/Clip that is the node's one reader, and reads of its result
    edges = readers.get(n.output[0], [])
    clip = edges[0] if len(edges) == 1 and edges[0].op_type in ("Relu", "Clip") else None
    if clip is not None and (len(readers.get(clip.output[0], [])) != 1 or clip.output[0] in outputs):
      clip = None
    after = readers.get(clip.output[0], []) if clip is not None else edges
    qs = [r for r in after if r.op_type == "QuantizeLinear" and r.domain in ("", "ai.onnx")]
    if clip is not None and (len(qs) != 1 or not _redundant_clip(clip, qs[0], small)):
      continue
    if qs and (len(edges) != 1 or len(after) != 1 or n.output[0] in outputs or len(n.output) != 1):
      continue
    # no QuantizeLinear after a Gemm or MatMul: onnxruntime still fuses it, with a float result (QGemm,
    # MatMulIntegerToFloat)
    if not qs and n.op_type == "Conv":
      continue
    q = qs[0] if qs else None
    x, w = dq(n.input[0]), dq(n.input[1])
    b = dq(n.input[2]) if len(n.input) > 2 and n.input[2] else None
    if x is None or w is None or (len(n.input) > 2 and n.input[2] and b is None):
      continue
    # a MatMul of two activations (attention's Q.K^T and P.V) onnxruntime fuses too, into QLinearMatMul; both
    # quantized per tensor
    if w.input[0] not in inits and (n.op_type != "MatMul" or q is None or size.get(w.input[1], 0) != 1):
      continue
    # QLinear ops take zero points, per-tensor scales or the weights' per-output-channel ones (axis 0 of a conv's
    # weights, the last of a matmul's, a Gemm's N axis), and an int32 bias (at scale x_scale * w_scale: the
    # quantizer writes it so)
    quantized = [x] if q is None else [x, q]
    if len(w.input) < 3 or any(len(s.input) < 3 or size.get(s.input[1], 0) != 1 for s in quantized):
      continue
    # onnxruntime's selectors: the activations' type in and out the same; int8 activations with int8 weights
    x_type, w_type = dtype.get(x.input[2]), dtype.get(w.input[2])
    if (q is not None and x_type != dtype.get(q.input[2])) or (x_type == onnx.TensorProto.INT8 and w_type != x_type):
      continue
    if q is None and n.op_type == "MatMul" and len(n.input) > 2:
      continue
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
    axis = next((a.i for a in w.attribute if a.name == "axis"), 1)
    n_axis = {"Conv": (0, -4), "MatMul": (1, -1), "Gemm": (0, -2) if attrs.get("transB", 0) else (1, -1)}
    if size.get(w.input[1], 0) != 1 and axis not in n_axis[n.op_type]:
      continue
    if b is not None and (dtype.get(b.input[0]) != onnx.TensorProto.INT32 or size.get(b.input[1], 0) == 0):
      continue
    # QGemm adds the int32 bias unscaled, and scales it with the product by alpha: onnxruntime fuses a Gemm with a bias
    # only at alpha 1 and beta 1
    if n.op_type == "Gemm" and b is not None and (attrs.get("beta", 1.0) != 1.0 or attrs.get("alpha", 1.0) != 1.0):
      continue
    if n.op_type == "Conv" and b is not None and not _bias_at_product_scale(b, x, w, arrays):
      continue
    groups.append((n, q, x, w, b, clip))
  return groups


# ops that only move values (or pick the largest): between a DequantizeLinear and a QuantizeLinear of the same scale
# and zero point they run on the bytes, as onnxruntime's rule dropping such pairs runs them
_MOVES = {"MaxPool", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten"}


def _graph_maps(g) -> tuple[dict, dict, set]:
  """(producer of each value, the readers of each value, the graph's output names) of graph g."""
  producer = {o: n for n in g.node for o in n.output}
  readers: dict[str, list] = {}
  for n in g.node:
    for i in n.input:
      readers.setdefault(i, []).append(n)
  return producer, readers, {o.name for o in g.output}


def _qdq_moves(model) -> list[tuple]:
  """(DequantizeLinear, node, QuantizeLinear) of each DequantizeLinear -> a _MOVES op -> QuantizeLinear
  whose two quantizations are the same constant per-tensor scale and zero point (the quantizer writes them so) and
  whose float result only the QuantizeLinear reads. The op commutes with the monotone dequantization, and
  requantizing the dequantized byte gives it back (|q - z| <= 255 times the scale rounds back to within 255 * 2^-23 of
  q - z), so the group is the op over the bytes, as onnxruntime runs it."""
  import onnx

  g = model.graph
  inits = {t.name: onnx.numpy_helper.to_array(t) for t in g.initializer if len(t.dims) == 0}
  producer, readers, outputs = _graph_maps(g)
  same = lambda a, b: a in inits and b in inits and inits[a].dtype == inits[b].dtype and inits[a] == inits[b]
  found = []
  for n in g.node:
    if n.op_type not in _MOVES or n.domain not in ("", "ai.onnx") or len([o for o in n.output if o]) != 1:
      continue
    dq, users = producer.get(n.input[0]), readers.get(n.output[0], [])
    if dq is None or dq.op_type != "DequantizeLinear" or len(users) != 1 or n.output[0] in outputs:
      continue
    q = users[0]
    if q.op_type != "QuantizeLinear" or len(dq.input) < 3 or len(q.input) < 3:
      continue
    if not all(same(dq.input[i], q.input[i]) for i in (1, 2)):
      continue
    found.append((dq, n, q))
  return found


# the elementwise groups onnxruntime's QDQ rules run as com.microsoft's QLinear ops: DequantizeLinear of each input ->
# op -> QuantizeLinear, every scale and zero point a per-tensor constant of one 8-bit type (a softmax's output may be
# of the other; mixed Add/Mul inputs stay in float here, which onnxruntime fuses too)
_ELEMENTWISE = {
  "Add": "QLinearAdd",
  "Mul": "QLinearMul",
  "Softmax": "QLinearSoftmax",
  "AveragePool": "QLinearAveragePool",
}


def _qdq_elementwise(model) -> list[tuple]:
  """(node, its input DequantizeLinears, its QuantizeLinear) of each _ELEMENTWISE group whose float result only the
  QuantizeLinear reads."""
  import onnx

  g = model.graph
  scalar = {t.name: t.data_type for t in g.initializer if int(np.prod(t.dims, dtype=np.int64)) == 1}
  inits = {t.name for t in g.initializer}
  producer, readers, outputs = _graph_maps(g)
  found = []
  for n in g.node:
    if n.op_type not in _ELEMENTWISE or n.domain not in ("", "ai.onnx") or n.output[0] in outputs:
      continue
    users = readers.get(n.output[0], [])
    dqs = [producer.get(i) for i in n.input]
    if len(users) != 1 or users[0].op_type != "QuantizeLinear" or users[0].domain not in ("", "ai.onnx"):
      continue
    if any(d is None or d.op_type != "DequantizeLinear" or d.domain not in ("", "ai.onnx") for d in dqs):
      continue
    # an Add or Mul of a constant (a folded BatchNormalization's scale or shift) stays float: as a QLinear op it was
    # recomputed inside the next convolution's operand loops (light:densenet121:qdq 1,308 ms against 57 float)
    if n.op_type != "Softmax" and any(d.input[0] in inits for d in dqs):
      continue
    q = users[0]
    quants = [*dqs, q]
    if any(len(d.input) < 3 or d.input[1] not in scalar or d.input[2] not in scalar for d in quants):
      continue
    # one 8-bit type throughout, but for a softmax's output (QLinearSoftmax takes each its own)
    types = {scalar[d.input[2]] for d in (dqs if n.op_type == "Softmax" else quants)}
    if len(types) != 1 or {*types, scalar[q.input[2]]} - {onnx.TensorProto.UINT8, onnx.TensorProto.INT8}:
      continue
    found.append((n, dqs, q))
  return found


def fuse_qdq(model, in_place: bool = False):
  """The model with each QDQ group (_qdq_groups) as one QLinearConv, QLinearMatMul or QGemm, as onnxruntime's graph
  optimizer fuses them: the contraction then runs in integers and is requantized once, as onnxruntime computes it
  (float products in the dequantized form round differently). The model itself is changed only when in_place (one
  loaded for this compile); else fused in a copy, made without serialising (which stops at 2 GB)."""
  import onnx
  from onnx import helper

  if not _qdq_groups(model) and not _qdq_moves(model) and not _qdq_elementwise(model):
    return model
  if not in_place:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    model = copy
  g = model.graph
  # moves first: the op then reads the bytes, so a contraction after it reads a DequantizeLinear again (attention's
  # reshaped and transposed heads); the DequantizeLinear stays for any other reader
  for dq, move, q in _qdq_moves(model):
    move.input[0] = dq.input[0]
    move.output[0] = q.output[0]
    g.node.remove(q)
  by_output = {n.output[0]: i for i, n in enumerate(g.node)}
  for n, q, x, w, b, clip in _qdq_groups(model):
    op_type, domain = _FUSED[n.op_type]
    qin = [x.input[0], x.input[1], x.input[2], w.input[0], w.input[1], w.input[2]]
    bias, out_q = [b.input[0]] if b is not None else [], [] if q is None else [q.input[1], q.input[2]]
    # QGemm takes its bias (an empty name for none) before the output's scale and zero point, the QLinear ops after
    qin += (bias or [""]) + out_q if op_type == "QGemm" else out_q + bias
    if q is None and op_type == "QLinearMatMul":
      op_type, domain = "MatMulIntegerToFloat", "com.microsoft"
      qin = [x.input[0], w.input[0], x.input[1], w.input[1], x.input[2], w.input[2]]
    out = n.output[0] if q is None else q.output[0]
    fused = helper.make_node(op_type, qin, [out], name=f"{n.name}_qlinear", domain=domain)
    # QLinearConv keeps the Conv's attributes, QGemm the Gemm's less beta (QGemm has none; the group's beta is 1)
    fused.attribute.extend(a for a in n.attribute if n.op_type == "Conv" or (op_type == "QGemm" and a.name != "beta"))
    if domain and not any(o.domain == domain for o in model.opset_import):
      model.opset_import.append(helper.make_opsetid(domain, 1))
    at = by_output[n.output[0]]
    g.node[at].CopyFrom(fused)
    if q is not None:
      g.node.remove(q)
    if clip is not None:
      g.node.remove(clip)
    by_output = {m.output[0]: i for i, m in enumerate(g.node)}
  opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
  for n, dqs, q in _qdq_elementwise(model):
    qin = [t for d in dqs for t in d.input[:3]] + [q.input[1], q.input[2]]
    fused = helper.make_node(_ELEMENTWISE[n.op_type], qin, [q.output[0]], name=f"{n.name}_qlinear", domain=MS)
    if n.op_type == "Softmax":
      # QLinearSoftmax's rows are Softmax's of the opset the model is in
      axis = next((a.i for a in n.attribute if a.name == "axis"), 1 if opset < 13 else -1)
      fused.attribute.extend([helper.make_attribute("axis", axis), helper.make_attribute("opset", opset)])
    if n.op_type == "AveragePool":
      fused.attribute.extend(n.attribute)
    if not any(o.domain == MS for o in model.opset_import):
      model.opset_import.append(helper.make_opsetid(MS, 1))
    n.CopyFrom(fused)
    g.node.remove(q)
  return model
