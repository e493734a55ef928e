"""QDQ groups onnxruntime's graph optimizer fuses into one integer contraction (codegen/quant.py fuse_qdq), beyond
DequantizeLinear -> Conv/MatMul -> QuantizeLinear: a Gemm's (com.microsoft QGemm), a redundant Relu or Clip before
the QuantizeLinear, uint8 weights. Each against onnxruntime: the same groups fused (its optimized graph), the same
bytes out, and ours on the int8 microkernel with int8-sized weights."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import aot

U8, I8 = np.uint8, np.int8
# weights' bytes over the int8 weights' own: int8 packed in 32-column tiles, int32 column sums, scales and bias
INT8_WEIGHTS_SLACK = 2.0


def _const(name, v):
  return numpy_helper.from_array(np.asarray(v), name)


def _qdq_graph(op, act, dt=U8, w_dt=I8, per_channel=True, bias=True, y_zero=None, float_io=False, seed=0, **attrs):
  """A hand-built x (dt) -> DequantizeLinear -> Conv/MatMul/Gemm (weights and int32 bias through DequantizeLinear)
  -> act (None, "relu", or ("clip", lo, hi), a bound None to leave out) -> QuantizeLinear -> y (dt) model; with
  float_io, x and y float through a QuantizeLinear before and a DequantizeLinear after."""
  r = np.random.default_rng(seed)
  info = np.iinfo(dt)
  x_zero, w_zero = (dt(131), 0) if dt == U8 else (dt(-3), 0)
  if op == "Conv":
    # the output shape left to inference (strides, dilations and pads change it)
    x_shape, w_shape, y_shape, n_axis, channels = [1, 8, 7, 6], [12, 8, 3, 3], None, 0, 12
    attrs.setdefault("pads", [1, 1, 1, 1])
  elif op == "MatMul":
    x_shape, w_shape, y_shape, n_axis, channels = [5, 40], [40, 24], [5, 24], 1, 24
  else:
    t_a, t_b = attrs.get("transA", 0), attrs.get("transB", 0)
    x_shape, w_shape, n_axis = ([40, 5] if t_a else [5, 40]), ([24, 40] if t_b else [40, 24]), (0 if t_b else 1)
    y_shape, channels = [5, 24], 24
  w_info = np.iinfo(w_dt)
  if w_dt == U8:
    # asymmetric uint8 weights (per tensor): their zero point off the middle, so w - zero does not fit in int8
    w_zero = U8(97)
  w = r.integers(w_info.min, w_info.max + 1, w_shape).astype(w_dt)
  x_scale = np.float32(0.02)
  w_scale = (r.uniform(0.002, 0.006, channels) if per_channel else np.array(0.004)).astype(np.float32)
  w_zp = np.full(channels, w_zero, w_dt) if per_channel else np.array(w_zero, w_dt)
  if w_dt == U8 and per_channel:
    w_zp = r.integers(60, 200, channels).astype(U8)
  y_scale = np.float32(0.05 if act is None else 0.03)
  if y_zero is None:
    y_zero = info.min if act is not None else (dt(120) if dt == U8 else dt(-5))
  inits = [
    _const("xs", x_scale),
    _const("xz", np.array(x_zero, dt)),
    _const("w", w),
    _const("ws", w_scale),
    _const("wz", w_zp),
    _const("ys", y_scale),
    _const("yz", np.array(y_zero, dt)),
  ]
  nodes = [
    helper.make_node("DequantizeLinear", ["x", "xs", "xz"], ["xf"]),
    helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wf"], axis=n_axis),
  ]
  inputs = ["xf", "wf"]
  if bias and op != "MatMul":
    b = r.integers(-3000, 3000, channels).astype(np.int32)
    inits += [_const("b", b), _const("bs", (x_scale * w_scale).astype(np.float32)), _const("bz", np.zeros_like(b))]
    nodes.append(helper.make_node("DequantizeLinear", ["b", "bs", "bz"], ["bf"], axis=0))
    inputs.append("bf")
  nodes.append(helper.make_node(op, inputs, ["c"], **attrs))
  out = "c"
  if act == "relu":
    nodes.append(helper.make_node("Relu", ["c"], ["a"]))
    out = "a"
  elif act is not None:
    _, lo, hi = act
    names = ["c", "lo" if lo is not None else "", "hi" if hi is not None else ""]
    inits += [_const(k, np.float32(v)) for k, v in (("lo", lo), ("hi", hi)) if v is not None]
    nodes.append(helper.make_node("Clip", names, ["a"]))
    out = "a"
  nodes.append(helper.make_node("QuantizeLinear", [out, "ys", "yz"], ["y"]))
  elem = TP.UINT8 if dt == U8 else TP.INT8
  if float_io:
    # float in and out through QuantizeLinear and DequantizeLinear, as the quantizer writes a model: onnxruntime on x86
    # fuses int8 activations only there (shifted to uint8 Q/DQ pair by Q/DQ pair)
    nodes.insert(0, helper.make_node("QuantizeLinear", ["xin", "xs", "xz"], ["x"]))
    nodes.append(helper.make_node("DequantizeLinear", ["y", "ys", "yz"], ["yout"]))
  g = helper.make_graph(
    nodes,
    "g",
    [helper.make_tensor_value_info("xin" if float_io else "x", TP.FLOAT if float_io else elem, x_shape)],
    [helper.make_tensor_value_info("yout" if float_io else "y", TP.FLOAT if float_io else elem, y_shape)],
    inits,
  )
  return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _onnxruntime(model, tmp):
  """(onnxruntime's session on 1 thread, the op types of its optimized graph)."""
  opts = ort.SessionOptions()
  opts.intra_op_num_threads = 1
  opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
  opts.optimized_model_filepath = str(tmp / "ort.onnx")
  sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
  return sess, {n.op_type for n in onnx.load(tmp / "ort.onnx").graph.node}


def _check(model, tmp, fused_as, seed=1):
  """Compile; the group fused exactly where onnxruntime fuses it (into fused_as), then on our int8 microkernel with
  int8-sized weights, and the bytes out equal onnxruntime's on full-range inputs."""
  sess, ort_ops = _onnxruntime(model, tmp)
  art = aot.compile_model(model, out_dir=tmp / "art")
  src = (art.dir / "src" / "model.c").read_text()
  fused = fused_as in ort_ops
  assert ("aot_qgemm_run" in src) == fused, (ort_ops, fused_as)
  if fused:
    w = numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == "w"))
    assert art.weights_bytes <= INT8_WEIGHTS_SLACK * w.size + 4096, (art.weights_bytes, w.size)
  inp = sess.get_inputs()[0]
  r = np.random.default_rng(seed)
  if inp.type == "tensor(float)":
    # past both ends of x's quantized range (x_scale 0.02: +-2.6), so its QuantizeLinear saturates too
    x = (r.standard_normal(inp.shape) * 2).astype(np.float32)
  else:
    info = np.iinfo(U8 if inp.type == "tensor(uint8)" else I8)
    x = r.integers(info.min, info.max + 1, inp.shape).astype(info.dtype)
  want = sess.run(None, {inp.name: x})[0]
  got = aot.load(art)(x)
  assert got.dtype == want.dtype
  if fused:
    np.testing.assert_array_equal(got, want)
  elif want.dtype == np.float32:
    np.testing.assert_allclose(got, want, rtol=1e-6)
  else:
    # both sides compute the float contraction: a value can round one step apart
    assert np.abs(got.astype(np.int32) - want).max() <= 1
  return art


# *** DequantizeLinear -> Gemm -> QuantizeLinear: onnxruntime's QGemm ***


@pytest.mark.parametrize(
  "dt,per_channel,bias,attrs",
  [
    (U8, True, True, {"transB": 1}),
    (U8, False, False, {"alpha": 0.5}),
    (I8, True, False, {"transA": 1, "transB": 1, "alpha": 1.25}),
    (I8, False, True, {"transA": 1}),
    (U8, True, True, {"transB": 1, "beta": 1.0}),
  ],
)
def test_qdq_gemm_runs_on_the_int8_microkernel(tmp_path, dt, per_channel, bias, attrs):
  _check(_qdq_graph("Gemm", None, dt, per_channel=per_channel, bias=bias, **attrs), tmp_path, "QGemm")


@pytest.mark.parametrize("attrs", [{"transB": 1, "beta": 0.5}, {"alpha": 0.5}])
def test_qdq_gemm_with_a_bias_and_alpha_or_beta_stays_float(tmp_path, attrs):
  # QGemm adds its bias unscaled and scales it by alpha with the product: onnxruntime fuses a Gemm with a bias only
  # at alpha 1 and beta 1
  _check(_qdq_graph("Gemm", None, U8, **attrs), tmp_path, "QGemm")


@pytest.mark.parametrize("scale,zero", [(1.01, 0), (1.5, 0), (1.0, 5)])
def test_qdq_conv_bias_away_from_the_product_scale_stays_float(tmp_path, scale, zero):
  # the bias's DequantizeLinear off x_scale * w_scale, or with a zero point: onnxruntime leaves the Conv in float (1%
  # off it still fuses)
  model = _qdq_graph("Conv", None, U8)
  for t in model.graph.initializer:
    if t.name == "bs":
      t.CopyFrom(_const("bs", (numpy_helper.to_array(t) * np.float32(scale)).astype(np.float32)))
    if t.name == "bz":
      t.CopyFrom(_const("bz", numpy_helper.to_array(t) + np.int32(zero)))
  _check(model, tmp_path, "QLinearConv")


@pytest.mark.parametrize(
  "op,act,attrs",
  [("Gemm", None, {"transB": 1}), ("Gemm", None, {"alpha": 0.5}), ("MatMul", None, {}), ("Gemm", "relu", {})],
)
def test_qdq_gemm_and_matmul_with_a_float_result_run_on_the_int8_microkernel(tmp_path, op, act, attrs):
  # no QuantizeLinear after: onnxruntime fuses the group all the same, into a float-out QGemm or MatMulIntegerToFloat
  # (float(sum) * x_scale * w_scale), which its float Gemm/MatMul is not bit for bit; a Relu after (the graph's
  # output) runs on the float result
  model = _qdq_graph(op, act, U8, bias=not attrs.get("alpha"), **attrs)
  g = model.graph
  g.node.remove(next(n for n in g.node if n.op_type == "QuantizeLinear"))
  del g.output[:]
  g.output.append(helper.make_tensor_value_info(g.node[-1].output[0], TP.FLOAT, None))
  sess, ort_ops = _onnxruntime(model, tmp_path)
  assert {"QGemm" if op == "Gemm" else "MatMulIntegerToFloat"} <= ort_ops
  _check(model, tmp_path, "QGemm" if op == "Gemm" else "MatMulIntegerToFloat")


# *** a Relu or Clip between the contraction and its QuantizeLinear ***

RELU_CLIP = [
  ("Conv", U8, "relu", None),  # the zero point at uint8's least: the Relu is redundant
  ("Conv", I8, "relu", None),  # at int8's least (-128)
  ("Gemm", U8, "relu", None),
  ("MatMul", I8, "relu", None),
  ("Conv", U8, "relu", 10),  # above it: the Relu clamps values Q would keep, so the group stays float
  ("Conv", U8, ("clip", 0.0, 6.0), None),  # 255 * 0.03 = 7.65 > 6: the Clip cuts in, stays float
  ("Conv", U8, ("clip", 0.0, 8.0), None),  # both bounds past Q's range: redundant
  ("Conv", U8, ("clip", 0.0, 7.64), None),  # rint(7.64 / 0.03) = 255: redundant by rounding, not by epsilon
  ("Conv", U8, ("clip", 0.0, None), None),  # no upper bound (float32's largest)
  ("Gemm", I8, ("clip", -1.0, 7.0), None),  # int8, zero point -128: Q keeps up to 7.65, the Clip cuts at 7: float
  ("MatMul", U8, ("clip", -5.0, 100.0), None),
]


@pytest.mark.parametrize("op,dt,act,y_zero", RELU_CLIP)
def test_qdq_relu_or_clip_before_the_quantize_is_fused_where_onnxruntime_fuses_it(tmp_path, op, dt, act, y_zero):
  attrs = {"transB": 1} if op == "Gemm" else {}
  model = _qdq_graph(op, act, dt, y_zero=None if y_zero is None else dt(y_zero), float_io=dt == I8, **attrs)
  _check(model, tmp_path, {"Conv": "QLinearConv", "MatMul": "QLinearMatMul", "Gemm": "QGemm"}[op])


# *** models quantized by onnxruntime's quantizer ***


@pytest.mark.parametrize("keep_activations", [False, True])
def test_quantized_conv_relu_gemm_relu_matmul_add_run_on_the_int8_microkernel(tmp_path, keep_activations):
  # quantize_static drops a Relu after a contraction into its QuantizeLinear's range; kept (QDQKeepRemovableActivations)
  # it is DequantizeLinear -> Relu -> QuantizeLinear after the group, which onnxruntime folds away
  from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

  r = np.random.default_rng(4)
  inits = [
    _const("w", (r.standard_normal((8, 4, 3, 3)) * 0.3).astype(np.float32)),
    _const("b", (r.standard_normal(8) * 0.1).astype(np.float32)),
    _const("g", (r.standard_normal((24, 40)) * 0.2).astype(np.float32)),
    _const("gb", (r.standard_normal(24) * 0.1).astype(np.float32)),
    _const("m", (r.standard_normal((24, 10)) * 0.2).astype(np.float32)),
    _const("mb", (r.standard_normal(10) * 0.1).astype(np.float32)),
  ]
  nodes = [
    helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
    helper.make_node("Relu", ["c"], ["y0"]),
    helper.make_node("Gemm", ["v", "g", "gb"], ["h"], transB=1),
    helper.make_node("Relu", ["h"], ["hr"]),
    helper.make_node("MatMul", ["hr", "m"], ["mm"]),
    helper.make_node("Add", ["mm", "mb"], ["y1"]),
  ]
  shapes = {"x": [1, 4, 6, 6], "v": [3, 40]}
  g = helper.make_graph(
    nodes,
    "g",
    [helper.make_tensor_value_info(k, TP.FLOAT, v) for k, v in shapes.items()],
    [
      helper.make_tensor_value_info("y0", TP.FLOAT, [1, 8, 6, 6]),
      helper.make_tensor_value_info("y1", TP.FLOAT, [3, 10]),
    ],
    inits,
  )
  onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "f.onnx")
  feeds = lambda rng: {k: (rng.standard_normal(v) * 2).astype(np.float32) for k, v in shapes.items()}

  class Data(CalibrationDataReader):
    def __init__(self):
      self.it = iter([feeds(r) for _ in range(4)])

    def get_next(self):
      return next(self.it, None)

  quantize_static(
    str(tmp_path / "f.onnx"),
    str(tmp_path / "q.onnx"),
    Data(),
    quant_format=QuantFormat.QDQ,
    per_channel=True,
    weight_type=QuantType.QInt8,
    activation_type=QuantType.QUInt8,
    extra_options={"QDQKeepRemovableActivations": keep_activations},
  )
  model = onnx.load(tmp_path / "q.onnx")
  assert ("Relu" in {n.op_type for n in model.graph.node}) == keep_activations
  sess, ort_ops = _onnxruntime(model, tmp_path)
  assert {"QLinearConv", "QGemm", "QLinearMatMul"} <= ort_ops
  art = aot.compile_model(model, out_dir=tmp_path / "art")
  assert (art.dir / "src" / "model.c").read_text().count("aot_qgemm_run(&g") == 3
  weights = sum(numpy_helper.to_array(t).size for t in inits if t.name in ("w", "g", "m"))
  assert art.weights_bytes <= INT8_WEIGHTS_SLACK * weights + 4096
  for seed in range(3):
    x = feeds(np.random.default_rng(seed))
    for got, want in zip(aot.load(art)(*x.values()), sess.run(None, x)):
      np.testing.assert_array_equal(got, want)


# *** uint8 weights: w - w_zero spans past int8 unless the zero point is 128 ***


@pytest.mark.parametrize(
  "op,per_channel,attrs",
  [
    ("Conv", False, {}),
    ("Conv", True, {"strides": [2, 2]}),
    ("Conv", True, {"dilations": [2, 2], "pads": [2, 1, 0, 2]}),
    ("MatMul", True, {}),
    ("Gemm", True, {"transB": 1}),
  ],
)
def test_qdq_uint8_weights_run_on_the_int8_microkernel(tmp_path, op, per_channel, attrs):
  # (a - za)(w - zw) = (a - za)(w - 128) + (128 - zw) * sum_k (a - za): int8 weights the microkernel packs, and the
  # activations' row sum (zero in a convolution's padding, where a is za) times a constant per channel
  _check(
    _qdq_graph(op, None, U8, w_dt=U8, per_channel=per_channel, **attrs), tmp_path, f"Q{'Linear' * (op != 'Gemm')}{op}"
  )
