"""Where the dynamically quantized transformer meets onnxruntime's arithmetic bit for bit, so that no value lands a ulp
from its own just before a DynamicQuantizeLinear (the next step there moves 1e-3 of the output). onnxruntime's
optimizer (its default level) fuses quantize_dynamic's DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul -> Add
into com.microsoft's MatMulIntegerToFloat (a shared quantized input) or DynamicQuantizeMatMul (its own): ours,
unfused, gives the same floats; an attention-shaped float MatMul is MLAS's to the bit; and so is Softmax over rows of
whole 16-blocks (frontends/onnx_ops_nn.py, in Ops.FMA). It fuses Add + LayerNormalization into SkipLayerNormalization,
whose kernel's float32 Welford mean is not the plain LayerNormalization's double sum: we fuse it where it does
(frontends/onnx_skip_ln.py) and compute it as its kernel does (frontends/onnx_ops_contrib.py), where the transformer's
seeds 7 and 9 differed (issue 14: 2.9e-3 and 4.1e-3 of the output, now 0)."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_dynamic_precision import dynamic_transformer_within_1e3

import aot


def _session(m: onnx.ModelProto, optimized_path=None) -> ort.InferenceSession:
  o = ort.SessionOptions()
  o.intra_op_num_threads = 1
  if optimized_path is not None:
    o.optimized_model_filepath = str(optimized_path)
  return ort.InferenceSession(m.SerializeToString(), o, providers=["CPUExecutionProvider"])


def _dynamic_two_matmul_model(tmp_path) -> onnx.ModelProto:
  # q = x @ wq + bq and k = x @ wk + bk share x's quantization (MatMulIntegerToFloat); y = (q * k) @ wo + bo
  # quantizes its own input (DynamicQuantizeMatMul)
  from onnxruntime.quantization import QuantType, quantize_dynamic

  rng = np.random.default_rng(0)
  d = 256
  inits = {
    n: (rng.standard_normal(s) * sc).astype(np.float32)
    for n, s, sc in [
      ("wq", (d, d), 0.06),
      ("bq", (d,), 0.1),
      ("wk", (d, d), 0.06),
      ("bk", (d,), 0.1),
      ("wo", (d, d), 0.06),
      ("bo", (d,), 0.1),
    ]
  }
  nodes = [
    helper.make_node("MatMul", ["x", "wq"], ["mq"]),
    helper.make_node("Add", ["mq", "bq"], ["q"]),
    helper.make_node("MatMul", ["x", "wk"], ["mk"]),
    helper.make_node("Add", ["mk", "bk"], ["k"]),
    helper.make_node("Mul", ["q", "k"], ["qk"]),
    helper.make_node("MatMul", ["qk", "wo"], ["mo"]),
    helper.make_node("Add", ["mo", "bo"], ["y"]),
  ]
  g = helper.make_graph(
    nodes,
    "g",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, d])],
    [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 64, d]) for n in ("q", "k", "y")],
    [numpy_helper.from_array(v, n) for n, v in inits.items()],
  )
  m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
  onnx.save(m, tmp_path / "f.onnx")
  quantize_dynamic(tmp_path / "f.onnx", tmp_path / "q.onnx", weight_type=QuantType.QInt8)
  return onnx.load(tmp_path / "q.onnx")


def test_dynamic_matmuls_equal_onnxruntimes_fused_kernels(tmp_path):
  m = _dynamic_two_matmul_model(tmp_path)
  sess = _session(m, tmp_path / "opt.onnx")
  fused = {n.op_type for n in onnx.load(tmp_path / "opt.onnx").graph.node}
  assert {"MatMulIntegerToFloat", "DynamicQuantizeMatMul"} <= fused, fused
  loaded = aot.load(aot.compile_model(m, target="c", out_dir=tmp_path / "art"))
  try:
    for seed in range(4):
      x = (np.random.default_rng(seed).standard_normal((1, 64, 256)) * (1 + seed)).astype(np.float32)
      ours = loaded(x)
      for name, a, b in zip(("q", "k", "y"), ours, sess.run(None, {"x": x})):
        np.testing.assert_array_equal(a, b, err_msg=f"{name}, seed {seed}")
  finally:
    loaded.close()


def test_attention_value_product_is_mlas_to_the_bit(tmp_path):
  # softmax rows (128 terms, all positive) times V per head: MLAS sums each dot product in k order with fused
  # multiply-adds, and so do we
  rng = np.random.default_rng(3)
  p = rng.random((4, 128, 128)).astype(np.float32)
  p /= p.sum(-1, keepdims=True)
  v = rng.standard_normal((4, 128, 64)).astype(np.float32)
  g = helper.make_graph(
    [helper.make_node("MatMul", ["p", "v"], ["y"])],
    "g",
    [
      helper.make_tensor_value_info("p", TensorProto.FLOAT, [4, 128, 128]),
      helper.make_tensor_value_info("v", TensorProto.FLOAT, [4, 128, 64]),
    ],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 128, 64])],
  )
  m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
  loaded = aot.load(aot.compile_model(m, target="c", out_dir=tmp_path))
  try:
    ours = loaded(p, v)
  finally:
    loaded.close()
  ours = ours[0] if isinstance(ours, (tuple, list)) else ours
  np.testing.assert_array_equal(ours, _session(m).run(None, {"p": p, "v": v})[0])


def _softmax_model(shape) -> onnx.ModelProto:
  g = helper.make_graph(
    [helper.make_node("Softmax", ["x"], ["y"], axis=-1)],
    "g",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
  )
  return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("target", ["c", "llvm"])
def test_softmax_rows_are_onnxruntimes_to_the_bit(tmp_path, target):
  # rows of whole 16-blocks (MLAS's two 8-lane accumulators): its polynomial exp, its sum order, times 1 / sum; with
  # masked (-inf) entries, a fully masked row, +inf and nan. libm-accurate exp and a float64 row sum were 1 ulp off
  # in a third of the values (seed 8 of the dynamic transformer: 2.1e-3 of the output, now 3.2e-4)
  rng = np.random.default_rng(4)
  for d in (16, 128, 512):
    x = (rng.standard_normal((2, 8, d)) * 3).astype(np.float32)
    x[0, 0, : d // 3] = -np.inf
    x[0, 1] = -np.inf
    x[0, 2, 5] = np.inf
    x[0, 3, 1] = np.nan
    m = _softmax_model([2, 8, d])
    loaded = aot.load(aot.compile_model(m, target=target, out_dir=tmp_path / str(d)))
    try:
      ours = loaded(x)
    finally:
      loaded.close()
    ours = ours[0] if isinstance(ours, (tuple, list)) else ours
    np.testing.assert_array_equal(ours, _session(m).run(None, {"x": x})[0], err_msg=f"{target}, rows of {d}")


def _skip_layer_norm_model(shape, bias: bool, epsilon: float) -> onnx.ModelProto:
  rng = np.random.default_rng(shape[-1])
  d = shape[-1]
  inits = {"gamma": rng.standard_normal(d), "beta": rng.standard_normal(d)} | (
    {"bias": rng.standard_normal(d)} if bias else {}
  )
  node = helper.make_node(
    "SkipLayerNormalization",
    ["x", "skip", *inits],
    ["y", "mean", "inv", "sum"],
    domain="com.microsoft",
    epsilon=epsilon,
  )
  rows = list(shape[:-1]) + [1]
  g = helper.make_graph(
    [node],
    "g",
    [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(shape)) for n in ("x", "skip")],
    [
      helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
      for n, s in [("y", list(shape)), ("mean", rows), ("inv", rows), ("sum", list(shape))]
    ],
    [numpy_helper.from_array(v.astype(np.float32), n) for n, v in inits.items()],
  )
  m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
  return m


@pytest.mark.parametrize(
  "shape,bias",
  [((1, 128, 256), False), ((2, 37, 64), True), ((3, 5, 300), False), ((4, 16, 1), True), ((8, 768), True)],
)
def test_skip_layer_normalization_is_onnxruntimes_to_the_bit(tmp_path, shape, bias):
  # onnxruntime's CPU kernel: a float32 Welford mean and variance, each step rounded, then (v - mean) / std * gamma
  # + beta. Rows a group of 16 (the vectorised recurrence), of 37 and 5 (fewer lanes), rows of 300 (three kernels of
  # the recurrence), of 1; off zero and at scale. As LayerNormalization of the sum (a double mean), y was a ulp or
  # more apart in half the values and the mean in 92% of the rows
  m = _skip_layer_norm_model(shape, bias, 1e-5)
  rng = np.random.default_rng(7)
  x = (rng.standard_normal(shape) * 3 + 0.5).astype(np.float32)
  skip = (rng.standard_normal(shape) * 0.7).astype(np.float32)
  x.reshape(-1, shape[-1])[0] *= 1e4
  loaded = aot.load(aot.compile_model(m, target="c", out_dir=tmp_path))
  try:
    ours = loaded(x, skip)
  finally:
    loaded.close()
  for name, a, b in zip(("y", "mean", "inv", "sum"), ours, _session(m).run(None, {"x": x, "skip": skip})):
    np.testing.assert_array_equal(a, b.reshape(a.shape), err_msg=f"{name}, {shape}")


def _add_layer_norm_model(bias: bool, axis: int = -1) -> onnx.ModelProto:
  # (a [+ bias]) + b -> LayerNormalization: onnxruntime's fusion formats 1 (the bias goes in) and 3
  rng = np.random.default_rng(11)
  d = 256
  inits = {"w": rng.standard_normal(d), "b": rng.standard_normal(d)} | (
    {"bias": rng.standard_normal(d)} if bias else {}
  )
  nodes = [helper.make_node("Add", ["a", "bias"], ["ab"])] if bias else []
  nodes += [
    helper.make_node("Add", ["ab" if bias else "a", "c"], ["s"]),
    helper.make_node("LayerNormalization", ["s", "w", "b"], ["y"], axis=axis, epsilon=1e-5),
  ]
  g = helper.make_graph(
    nodes,
    "g",
    [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 128, d]) for n in ("a", "c")],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 128, d])],
    [numpy_helper.from_array(v.astype(np.float32), n) for n, v in inits.items()],
  )
  return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("bias", [False, True])
def test_add_layer_norm_is_fused_and_computed_as_onnxruntime_does(tmp_path, bias):
  # onnxruntime fuses the Adds and the LayerNormalization into SkipLayerNormalization (its bias added after the skip)
  # and computes that: ours the same, bit for bit, where LayerNormalization of the sum was a ulp or more apart
  from aot.frontends.onnx_skip_ln import fuse_skip_layer_norm

  m = _add_layer_norm_model(bias)
  sess = _session(m, tmp_path / "opt.onnx")
  fused = [n for n in onnx.load(tmp_path / "opt.onnx").graph.node if n.op_type == "SkipLayerNormalization"]
  ours_fused = [n for n in fuse_skip_layer_norm(m).graph.node if n.op_type == "SkipLayerNormalization"]
  assert [list(n.input) for n in ours_fused] == [list(n.input) for n in fused]
  rng = np.random.default_rng(12)
  a, c = ((rng.standard_normal((1, 128, 256)) * 2 + 0.3).astype(np.float32) for _ in range(2))
  loaded = aot.load(aot.compile_model(m, target="c", out_dir=tmp_path / "art"))
  try:
    ours = loaded(a, c)
  finally:
    loaded.close()
  ours = ours[0] if isinstance(ours, (tuple, list)) else ours
  np.testing.assert_array_equal(ours, sess.run(None, {"a": a, "c": c})[0])


def test_layer_norm_onnxruntime_leaves_unfused_is_left_alone():
  # a broadcast Add (a 2-D input) and a LayerNormalization over another axis are not fused
  from aot.frontends.onnx_skip_ln import fuse_skip_layer_norm

  m = _add_layer_norm_model(False, axis=1)
  assert [n.op_type for n in fuse_skip_layer_norm(m).graph.node] == ["Add", "LayerNormalization"]
  m = _add_layer_norm_model(False)
  m.graph.input[1].CopyFrom(helper.make_tensor_value_info("c", TensorProto.FLOAT, [128, 256]))
  assert [n.op_type for n in fuse_skip_layer_norm(m).graph.node] == ["Add", "LayerNormalization"]


def test_dynamic_transformer_seeds_that_met_the_fusion(tmp_path):
  # the seeds tests/test_dynamic_precision.py leaves out: 7 and 9 differed at layer0's first DynamicQuantizeLinear
  # scale by a ulp of its SkipLayerNormalization (2.9e-3 and 4.1e-3 of the output), 1 and 5 did not
  dynamic_transformer_within_1e3(_session, (1, 5, 7, 9), tmp_path)
