"""QOperator, integer and com.microsoft ops against onnxruntime, one node each on fresh inputs: integer outputs equal
bit for bit, float outputs within 1e-5 relative; then models quantized by onnxruntime's own tools."""

import re
import tempfile

import numpy as np
import onnx
import pytest
from conftest import ort_session, outputs_on_threads
from onnx import TensorProto as TP
from onnx import helper as oh
from onnx import numpy_helper

import aot

MS = "com.microsoft"
U8, I8 = np.uint8, np.int8


def _model(node, feeds, consts, outs, opset=17):
  inputs = [oh.make_tensor_value_info(k, oh.np_dtype_to_tensor_dtype(v.dtype), v.shape) for k, v in feeds.items()]
  outputs = [oh.make_tensor_value_info(name, elem, None) for name, elem in outs]
  inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()]
  g = oh.make_graph([node], "g", inputs, outputs, initializer=inits)
  m = oh.make_model(g, opset_imports=[oh.make_opsetid("", opset), oh.make_opsetid(MS, 1)])
  m.ir_version = 9
  return m


def _run_both(m, feeds, target="c"):
  want = ort_session(m).run(None, feeds)
  with tempfile.TemporaryDirectory(prefix="aot_q_") as d:
    (got,) = outputs_on_threads(aot.compile_model(m, out_dir=d, target=target), feeds, threads=(1,))
  got = list(got) if isinstance(got, (list, tuple)) else [got]
  return got, want


def check(op_type, feeds, consts, outs, domain=MS, target="c", rtol=0.0, opset=17, **attrs):
  """Run one node; integer outputs must be equal, float ones within rtol. Input names: feeds then consts in order,
  '' for a left-out optional input (a key starting with '_')."""
  names = [("" if k.startswith("_") else k) for k in attrs.pop("order", list(feeds) + list(consts))]
  node = oh.make_node(op_type, names, [o for o, _ in outs], domain=domain, **attrs)
  m = _model(node, feeds, {k: v for k, v in consts.items() if not k.startswith("_")}, outs, opset)
  got, want = _run_both(m, feeds, target)
  for g, w, (name, _) in zip(got, want, outs):
    assert g.dtype == w.dtype and g.shape == w.shape, name
    if np.issubdtype(w.dtype, np.integer):
      np.testing.assert_array_equal(g, w, err_msg=name)
    else:
      np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol, err_msg=name)
  return got


def rnd(seed):
  return np.random.default_rng(seed)


def qarr(r, shape, dt=U8):
  info = np.iinfo(dt)
  return r.integers(info.min, info.max + 1, size=shape).astype(dt)


f32 = np.float32

# *** elementwise ***


@pytest.mark.parametrize("dt", [U8, I8])
@pytest.mark.parametrize("op_type", ["QLinearAdd", "QLinearMul"])
def test_qlinear_binary(op_type, dt):
  r = rnd(1)
  a, b = qarr(r, (3, 5, 8), dt), qarr(r, (5, 8), dt)
  zero = {U8: 128, I8: 3}[dt]
  check(
    op_type,
    {"a": a, "b": b},
    {
      "as": f32(0.05),
      "az": dt(zero),
      "bs": f32(0.031),
      "bz": dt(zero - 5),
      "cs": f32(0.07 if op_type == "QLinearAdd" else 0.2),
      "cz": dt(zero + 2),
    },
    [("y", oh.np_dtype_to_tensor_dtype(np.dtype(dt)))],
    order=["a", "as", "az", "b", "bs", "bz", "cs", "cz"],
  )


@pytest.mark.parametrize("dt,target", [(U8, "c"), (I8, "c"), (U8, "llvm")])
def test_qlinear_sigmoid_and_leaky_relu(dt, target):
  r = rnd(2)
  x = qarr(r, (2, 3, 16), dt)
  z = {U8: 120, I8: -4}[dt]
  ty = oh.np_dtype_to_tensor_dtype(np.dtype(dt))
  yz = dt(0 if dt is U8 else -128)
  check(
    "QLinearSigmoid", {"x": x}, {"xs": f32(0.06), "xz": dt(z), "ys": f32(1 / 256), "yz": yz}, [("y", ty)], target=target
  )
  check(
    "QLinearLeakyRelu",
    {"x": x},
    {"xs": f32(0.06), "xz": dt(z), "ys": f32(0.05), "yz": dt(z + 3)},
    [("y", ty)],
    alpha=0.13,
    target=target,
  )


def _qlinear_softmax(x, xs, ys, yz, axis, opset, target="c"):
  """One QLinearSoftmax node (its 'opset' attribute, which check's opset keyword would take) against onnxruntime."""
  consts = {"xs": f32(xs), "xz": x.dtype.type(7), "ys": f32(ys), "yz": yz}
  node = oh.make_node("QLinearSoftmax", ["x", *consts], ["y"], domain=MS, axis=axis, opset=opset)
  ty = oh.np_dtype_to_tensor_dtype(x.dtype)
  (got,), (want,) = _run_both(_model(node, {"x": x}, consts, [("y", ty)]), {"x": x}, target)
  assert got.dtype == want.dtype and got.shape == want.shape
  np.testing.assert_array_equal(got, want)
  return got


@pytest.mark.parametrize(
  "dt,shape,axis,opset,target",
  [
    (U8, (2, 1000), -1, 13, "c"),  # a classifier's 1000 logits (light ResNet-50 quantized in QOperator form)
    (I8, (3, 4, 37), 1, 13, "c"),  # along a middle axis
    (U8, (3, 4, 5), 1, 12, "c"),  # below opset 13 a row is everything from axis on
    (I8, (2, 300), -1, 13, "llvm"),
  ],
)
def test_qlinear_softmax(dt, shape, axis, opset, target):
  # fresh inputs over the whole range: rows with ties at their maximum and long tails of tiny values. The int8 output
  # zero point is -127, not -128: a row whose maximum stands alone reaches 256 steps, which onnxruntime wraps (to -128
  # from a zero point of -128) and we saturate (to 127)
  yz = dt(0 if dt is U8 else -127)
  _qlinear_softmax(qarr(rnd(9), shape, dt), 0.09, 1 / 256, yz, axis, opset, target)


def test_qlinear_softmax_with_one_dominant_value_saturates():
  # a maximum far above the rest of its row: its probability rounds to 256 steps of 1/256, past uint8's 255
  x = np.zeros((2, 8), U8)
  x[:, 3] = 255
  assert _qlinear_softmax(x, 0.5, 1 / 256, U8(0), -1, 13)[0, 3] == 255


# *** pooling and concatenation ***


@pytest.mark.parametrize("channels_last", [0, 1])
def test_qlinear_global_average_pool(channels_last):
  r = rnd(3)
  x = qarr(r, (2, 6, 5, 7) if not channels_last else (2, 5, 7, 6))
  check(
    "QLinearGlobalAveragePool",
    {"x": x},
    {"xs": f32(0.04), "xz": U8(125), "ys": f32(0.013), "yz": U8(119)},
    [("y", TP.UINT8)],
    channels_last=channels_last,
  )


@pytest.mark.parametrize("count_include_pad", [0, 1])
def test_qlinear_average_pool(count_include_pad):
  r = rnd(4)
  x = qarr(r, (1, 3, 7, 6))
  check(
    "QLinearAveragePool",
    {"x": x},
    {"xs": f32(0.04), "xz": U8(125), "ys": f32(0.03), "yz": U8(119)},
    [("y", TP.UINT8)],
    kernel_shape=[3, 2],
    pads=[1, 0, 1, 1],
    strides=[2, 1],
    count_include_pad=count_include_pad,
  )


def test_qlinear_concat():
  r = rnd(5)
  a, b = qarr(r, (2, 3, 4)), qarr(r, (2, 5, 4))
  check(
    "QLinearConcat",
    {"a": a, "b": b},
    {"ys": f32(0.05), "yz": U8(128), "as": f32(0.05), "az": U8(128), "bs": f32(0.083), "bz": U8(100)},
    [("y", TP.UINT8)],
    order=["ys", "yz", "a", "as", "az", "b", "bs", "bz"],
    axis=1,
  )


def test_qlinear_concat_copies_inputs_at_the_output_quantization():
  # onnxruntime copies an input whose scale and zero point are the output's; ours requantized it (round(s (x - z) /
  # s) + z, the same bytes) on every element: QOperator DenseNet's concats, each of every channel before it
  r = rnd(15)
  feeds = {"a": qarr(r, (1, 6, 5, 5)), "b": qarr(r, (1, 3, 5, 5))}
  q = {"s": f32(0.0371), "z": U8(39)}
  node = oh.make_node("QLinearConcat", ["s", "z", "a", "s", "z", "b", "s", "z"], ["y"], domain=MS, axis=1)
  m = _model(node, feeds, q, [("y", TP.UINT8)])
  want = ort_session(m).run(None, feeds)[0]
  with tempfile.TemporaryDirectory(prefix="aot_q_") as d:
    art = aot.compile_model(m, out_dir=d)
    (got,) = outputs_on_threads(art, feeds, threads=(1,))
    source = "".join(f.read_text() for f in (art.dir / "src").glob("*.c") if f.name.startswith(("model", "kernels")))
  np.testing.assert_array_equal(got, want)
  # bytes moved, nothing rounded: the kernels' definitions (their bodies up to the closing brace) hold no float
  kernels = re.findall(r"^[^\n]*void g_f\d+\([^\n]*\{\n.*?^\}", source, re.S | re.M)
  assert kernels and not any("float" in k for k in kernels), kernels


# *** products ***


@pytest.mark.parametrize("quantized_out", [True, False])
def test_qgemm(quantized_out):
  r = rnd(6)
  a, b = qarr(r, (5, 24)), qarr(r, (16, 24), I8)
  c = r.integers(-2000, 2000, size=(16,)).astype(np.int32)
  consts = {
    "as": f32(0.02),
    "az": U8(130),
    "b": b,
    "bs": (r.uniform(0.002, 0.01, 16)).astype(f32),
    "bz": np.zeros(16, I8),
    "c": c,
  }
  if quantized_out:
    consts |= {"ys": f32(0.09), "yz": U8(110)}
  check(
    "QGemm",
    {"a": a},
    consts,
    [("y", TP.UINT8 if quantized_out else TP.FLOAT)],
    rtol=1e-5,
    transB=1,
    alpha=0.75,
    order=["a", "as", "az", "b", "bs", "bz", "c"] + (["ys", "yz"] if quantized_out else []),
  )


def test_matmul_integer_to_float():
  r = rnd(7)
  a, b = qarr(r, (2, 3, 20)), qarr(r, (20, 12), I8)
  check(
    "MatMulIntegerToFloat",
    {"a": a},
    {
      "b": b,
      "as": f32(0.03),
      "bs": r.uniform(0.01, 0.02, 12).astype(f32),
      "az": U8(127),
      "bz": np.zeros(12, I8),
      "bias": r.standard_normal(12).astype(f32),
    },
    [("y", TP.FLOAT)],
    rtol=1e-5,
  )


@pytest.mark.parametrize("target", ["c", "llvm"])
def test_dynamic_quantize_matmul(target):
  r = rnd(8)
  a = r.standard_normal((4, 32)).astype(f32)
  b = qarr(r, (32, 10), I8)
  bias = r.standard_normal(10).astype(f32)
  check(
    "DynamicQuantizeMatMul",
    {"a": a},
    {"b": b, "bs": f32(0.01), "bz": I8(0), "bias": bias},
    [("y", TP.FLOAT)],
    rtol=1e-5,
    target=target,
  )


@pytest.mark.parametrize("target", ["c", "llvm"])
def test_dynamic_quantize_linear(target):
  r = rnd(9)
  x = (r.standard_normal((6, 7)) * 3 + 0.5).astype(f32)
  check(
    "DynamicQuantizeLinear", {"x": x}, {}, [("y", TP.UINT8), ("s", TP.FLOAT), ("z", TP.UINT8)], domain="", target=target
  )


def test_dynamic_quantize_linear_of_zeros_has_scale_one():
  # an empty range: onnxruntime's scale is 1 (not 0, which would make every quotient NaN)
  check(
    "DynamicQuantizeLinear",
    {"x": np.zeros((3, 4), f32)},
    {},
    [("y", TP.UINT8), ("s", TP.FLOAT), ("z", TP.UINT8)],
    domain="",
  )


def test_qlinear_matmul_and_conv():
  r = rnd(10)
  a, b = qarr(r, (3, 40)), qarr(r, (40, 9), I8)
  check(
    "QLinearMatMul",
    {"a": a},
    {"as": f32(0.02), "az": U8(121), "b": b, "bs": f32(0.004), "bz": I8(0), "ys": f32(0.05), "yz": U8(126)},
    [("y", TP.UINT8)],
    domain="",
  )
  x, w = qarr(r, (1, 4, 6, 6)), qarr(r, (5, 4, 3, 3), I8)
  check(
    "QLinearConv",
    {"x": x},
    {
      "xs": f32(0.02),
      "xz": U8(121),
      "w": w,
      "ws": r.uniform(0.002, 0.006, 5).astype(f32),
      "wz": np.zeros(5, I8),
      "ys": f32(0.03),
      "yz": U8(126),
      "b": r.integers(-500, 500, 5).astype(np.int32),
    },
    [("y", TP.UINT8)],
    domain="",
    pads=[1, 1, 1, 1],
  )


def test_matmul_integer_and_conv_integer():
  r = rnd(11)
  a, b = qarr(r, (3, 17)), qarr(r, (17, 6), I8)
  check(
    "MatMulInteger",
    {"a": a},
    {"b": b, "az": U8(100), "bz": I8(2)},
    [("y", TP.INT32)],
    domain="",
    order=["a", "b", "az", "bz"],
  )
  x, w = qarr(r, (1, 2, 5, 5)), qarr(r, (3, 2, 2, 2), U8)
  check("ConvInteger", {"x": x}, {"w": w, "xz": U8(7), "wz": U8(9)}, [("y", TP.INT32)], domain="", pads=[0, 1, 0, 1])


# *** float contrib ops ***


@pytest.mark.parametrize("op_type", ["Gelu", "FastGelu", "QuickGelu"])
def test_gelus(op_type):
  x = (rnd(12).standard_normal((3, 16)) * 2).astype(f32)
  check(op_type, {"x": x}, {}, [("y", TP.FLOAT)], rtol=1e-5)


def test_bias_gelu_and_fast_gelu_with_bias():
  r = rnd(13)
  x, bias = (r.standard_normal((2, 3, 8)) * 2).astype(f32), r.standard_normal(8).astype(f32)
  check("BiasGelu", {"x": x}, {"bias": bias}, [("y", TP.FLOAT)], rtol=1e-5)
  check("FastGelu", {"x": x}, {"bias": bias}, [("y", TP.FLOAT)], rtol=1e-5)


def test_skip_layer_normalization():
  r = rnd(14)
  x, skip = r.standard_normal((2, 3, 16)).astype(f32), r.standard_normal((2, 3, 16)).astype(f32)
  p = {k: r.standard_normal(16).astype(f32) for k in ("gamma", "beta", "bias")}
  check(
    "SkipLayerNormalization",
    {"x": x, "skip": skip},
    p,
    [("y", TP.FLOAT), ("mean", TP.FLOAT), ("inv", TP.FLOAT), ("sum", TP.FLOAT)],
    rtol=1e-5,
    epsilon=1e-5,
  )


def test_simplified_layer_normalizations():
  r = rnd(15)
  x, skip, g = (r.standard_normal(s).astype(f32) for s in ((2, 4, 12), (2, 4, 12), (12,)))
  check("SimplifiedLayerNormalization", {"x": x}, {"g": g}, [("y", TP.FLOAT)], domain="", rtol=1e-5, epsilon=1e-6)
  check(
    "SkipSimplifiedLayerNormalization",
    {"x": x, "skip": skip},
    {"g": g},
    [("y", TP.FLOAT), ("_m", TP.FLOAT), ("inv", TP.FLOAT), ("sum", TP.FLOAT)][:1],
    rtol=1e-5,
    epsilon=1e-6,
  )


def test_layer_normalization_before_opset_17():
  # onnxruntime's own LayerNormalization, in the default domain from opset 1
  r = rnd(18)
  x, g, b = (r.standard_normal(s).astype(f32) for s in ((2, 5, 12), (12,), (12,)))
  check(
    "LayerNormalization", {"x": x}, {"g": g, "b": b}, [("y", TP.FLOAT)], domain="", rtol=1e-5, opset=13, epsilon=1e-5
  )


@pytest.mark.parametrize(
  "activation,params", [("Relu", None), ("LeakyRelu", [0.2]), ("Clip", [-0.5, 0.7]), ("Sigmoid", None)]
)
def test_fused_conv(activation, params):
  r = rnd(16)
  x, w, b = (r.standard_normal(s).astype(f32) for s in ((1, 3, 6, 6), (4, 3, 3, 3), (4,)))
  attrs = {"activation": activation} | ({"activation_params": params} if params else {})
  check("FusedConv", {"x": x}, {"w": w, "b": b}, [("y", TP.FLOAT)], rtol=1e-5, pads=[1, 1, 1, 1], **attrs)


@pytest.mark.parametrize("target", ["c", "llvm"])
def test_fused_matmul(target):
  r = rnd(17)
  a, b = r.standard_normal((2, 7, 5)).astype(f32), r.standard_normal((2, 6, 7)).astype(f32)
  check("FusedMatMul", {"a": a, "b": b}, {}, [("y", TP.FLOAT)], rtol=1e-5, transA=1, transB=1, alpha=0.5, target=target)


# *** models quantized by onnxruntime's own tools ***


def _float_model(nodes, x_shape, y_shape, weights):
  r = rnd(20)
  inits = [numpy_helper.from_array((r.standard_normal(s) * sc).astype(f32), k) for k, (s, sc) in weights.items()]
  g = oh.make_graph(
    nodes,
    "g",
    [oh.make_tensor_value_info("x", TP.FLOAT, x_shape)],
    [oh.make_tensor_value_info("y", TP.FLOAT, y_shape)],
    inits,
  )
  m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])
  m.ir_version = 9
  return m


def _compare_quantized(q, x, rtol):
  want = ort_session(q).run(None, {"x": x})[0]
  with tempfile.TemporaryDirectory(prefix="aot_q_") as d:
    model = aot.load(aot.compile_model(q, out_dir=d))
    try:
      got = model(x)
    finally:
      model.close()
  if rtol == 0:
    np.testing.assert_array_equal(got, want)
  else:
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * np.abs(want).max())


def test_static_qoperator_conv_matmul_model(tmp_path):
  from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

  nodes = [
    oh.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
    oh.make_node("Relu", ["c1"], ["r1"]),
    oh.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
    oh.make_node("Add", ["c2", "c2b"], ["a2"]),
    oh.make_node("Sigmoid", ["a2"], ["s2"]),
    oh.make_node("GlobalAveragePool", ["s2"], ["g"]),
    oh.make_node("Flatten", ["g"], ["f"]),
    oh.make_node("MatMul", ["f", "wm"], ["m"]),
    oh.make_node("Add", ["m", "bm"], ["y"]),
  ]
  m = _float_model(
    nodes,
    [1, 3, 8, 8],
    [1, 5],
    {
      "w1": ((6, 3, 3, 3), 0.3),
      "b1": ((6,), 0.1),
      "w2": ((8, 6, 3, 3), 0.3),
      "b2": ((8,), 0.1),
      "c2b": ((1, 8, 4, 4), 0.3),
      "wm": ((8, 5), 0.5),
      "bm": ((5,), 0.1),
    },
  )

  class Reader(CalibrationDataReader):
    def __init__(self):
      self.feeds = iter([{"x": rnd(i).standard_normal((1, 3, 8, 8)).astype(f32)} for i in range(8)])

    def get_next(self):
      return next(self.feeds, None)

  onnx.save(m, tmp_path / "f.onnx")
  quantize_static(
    tmp_path / "f.onnx",
    tmp_path / "q.onnx",
    Reader(),
    quant_format=QuantFormat.QOperator,
    per_channel=True,
    activation_type=QuantType.QUInt8,
    weight_type=QuantType.QInt8,
  )
  q = onnx.load(tmp_path / "q.onnx")
  ops = {n.op_type for n in q.graph.node}
  assert {"QLinearConv", "QLinearMatMul", "QLinearAdd", "QLinearSigmoid", "QLinearGlobalAveragePool"} <= ops, ops
  # the float output is the dequantized last uint8 tensor: equal floats mean equal integers all the way
  _compare_quantized(q, rnd(99).standard_normal((1, 3, 8, 8)).astype(f32), 0)


def test_dynamic_matmul_model(tmp_path):
  from onnxruntime.quantization import QuantType, quantize_dynamic

  nodes = [
    oh.make_node("MatMul", ["x", "w1"], ["m1"]),
    oh.make_node("Add", ["m1", "b1"], ["a1"]),
    oh.make_node("Relu", ["a1"], ["r1"]),
    oh.make_node("MatMul", ["r1", "w2"], ["m2"]),
    oh.make_node("Add", ["m2", "b2"], ["y"]),
  ]
  m = _float_model(
    nodes,
    [2, 6, 32],
    [2, 6, 16],
    {"w1": ((32, 48), 0.3), "b1": ((48,), 0.1), "w2": ((48, 16), 0.3), "b2": ((16,), 0.1)},
  )
  onnx.save(m, tmp_path / "f.onnx")
  quantize_dynamic(tmp_path / "f.onnx", tmp_path / "q.onnx", weight_type=QuantType.QInt8)
  q = onnx.load(tmp_path / "q.onnx")
  assert {"DynamicQuantizeLinear", "MatMulInteger"} <= {n.op_type for n in q.graph.node}
  _compare_quantized(q, rnd(98).standard_normal((2, 6, 32)).astype(f32), 1e-3)


@pytest.mark.parametrize("target", ["c", "llvm"])
def test_requantize_rounds_before_adding_the_zero_point(target):
  # 169 * 69 * (as*bs/ys) is 48.500008 in float32: adding the zero point 128 first would round it to 176.5 and then
  # to the even 176; onnxruntime rounds 48.500008 to 49 and gives 177
  a = np.arange(256, dtype=U8).reshape(256, 1)
  check(
    "QLinearMatMul",
    {"a": a},
    {
      "as": f32(0.029896908),
      "az": U8(0),
      "b": np.full((1, 1), 69, I8),
      "bs": f32(0.0057638097),
      "bz": I8(0),
      "ys": f32(0.041431427),
      "yz": U8(128),
    },
    [("y", TP.UINT8)],
    domain="",
    target=target,
  )


def test_a_per_channel_scale_where_onnxruntime_takes_one_is_named():
  from aot.errors import CompileError

  node = oh.make_node("QLinearSigmoid", ["x", "xs", "xz", "ys", "yz"], ["y"], domain=MS, name="sig")
  m = _model(
    node,
    {"x": np.zeros((1, 3), U8)},
    {"xs": np.full(3, 0.1, f32), "xz": U8(0), "ys": f32(0.1), "yz": U8(0)},
    [("y", TP.UINT8)],
  )
  with pytest.raises(
    CompileError,
    match=r"QLinearSigmoid node 'sig': the input scale must be a scalar \(per tensor\), "
    r"got shape \(3,\)",
  ):
    aot.compile_model(m)


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_dynamic_quantize_lstm(direction):
  # each step requantizes h with one range over the whole batch (onnxruntime does that on one thread; with more it
  # quantizes each thread's rows with their own range, so _run_both pins it to one), and onnxruntime's gates use
  # MLAS's logistic and tanh: one ulp of difference there would move a quantized value by a step (here there is none)
  r = rnd(19)
  T, B, I, H = 5, 3, 6, 4
  nd = 2 if direction == "bidirectional" else 1
  x = r.standard_normal((T, B, I)).astype(f32)
  consts = {
    "w": qarr(r, (nd, I, 4 * H), I8),
    "r": qarr(r, (nd, H, 4 * H), I8),
    "b": (r.standard_normal((nd, 8 * H)) * 0.1).astype(f32),
    "_sl": None,
    "_h0": None,
    "_c0": None,
    "_p": None,
    "ws": r.uniform(0.003, 0.01, (nd, 4 * H)).astype(f32),
    "wz": np.zeros((nd, 4 * H), I8),
    "rs": r.uniform(0.003, 0.01, (nd,)).astype(f32),
    "rz": np.zeros((nd,), I8),
  }
  got = check(
    "DynamicQuantizeLSTM",
    {"x": x},
    consts,
    [("y", TP.FLOAT), ("yh", TP.FLOAT), ("yc", TP.FLOAT)],
    rtol=1e-5,
    hidden_size=H,
    direction=direction,
  )
  assert got[0].shape == (T, nd, B, H)
