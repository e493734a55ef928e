"""Statically quantized attention, beside onnxruntime: a tiny one-layer attention block quantized by onnxruntime's own
quantize_static (models/quantized.py) in QDQ and QOperator form. The QDQ groups fused as onnxruntime fuses them
(attention's two activation matmuls, the residual add, the softmax), the bytes out equal to its int8 run, the weights
int8-sized; and the two QLinear ops whose arithmetic this rests on (QLinearAdd's rounding, a QLinearMatMul of two
activations at the float-exact bound) against onnxruntime directly."""

from collections import Counter

import numpy as np
import onnx
import pytest
from conftest import ort_session
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

import aot
from aot.frontends.onnx_qdq import fuse_qdq
from aot.models.quantized import quantized

SEQ, DIM, HEADS = 16, 32, 2
HEAD = DIM // HEADS
SEEDS = (0, 1, 2, 3, 4, 5)
# the ops onnxruntime's graph optimizer fuses a QDQ attention block into
QLINEAR = {"QLinearMatMul", "QGemm", "QLinearAdd", "QLinearSoftmax", "QLinearConv", "MatMulIntegerToFloat"}
# weights' bytes over the float model's weights in int8 (one byte each): packed tiles, column sums, scales, biases
INT8_WEIGHTS_SLACK = 2.0
# K below which a float32 sum of K products of 8-bit differences is exact (K * 255 * 255 < 2^24)
FLOAT_EXACT_K = 258


def _attention(seed: int = 3) -> onnx.ModelProto:
  """x [1, SEQ, DIM] -> q, k, v projections -> HEADS heads -> softmax(q k^T / sqrt(HEAD)) v -> output projection -> + x,
  in float32 (a transformer layer's attention half)."""
  r = np.random.default_rng(seed)
  w = lambda name: numpy_helper.from_array((r.standard_normal((DIM, DIM)) / np.sqrt(DIM)).astype(np.float32), name)
  b = lambda name: numpy_helper.from_array((r.uniform(-1, 1, DIM) / np.sqrt(DIM)).astype(np.float32), name)
  shape = lambda name, v: numpy_helper.from_array(np.array(v, np.int64), name)
  inits = [w("wq"), b("bq"), w("wk"), b("bk"), w("wv"), b("bv"), w("wo"), b("bo")]
  inits += [shape("heads", [1, SEQ, HEADS, HEAD]), shape("rows", [1, SEQ, DIM])]
  inits += [numpy_helper.from_array(np.array(np.sqrt(HEAD), np.float32), "root")]
  nodes = []
  for p in "qkv":
    nodes += [
      helper.make_node("MatMul", ["x", f"w{p}"], [f"{p}_mm"]),
      helper.make_node("Add", [f"{p}_mm", f"b{p}"], [f"{p}_lin"]),
      helper.make_node("Reshape", [f"{p}_lin", "heads"], [f"{p}_split"]),
      helper.make_node("Transpose", [f"{p}_split"], [f"{p}_h"], perm=[0, 2, 3, 1] if p == "k" else [0, 2, 1, 3]),
    ]
  nodes += [
    helper.make_node("MatMul", ["q_h", "k_h"], ["scores"]),
    helper.make_node("Div", ["scores", "root"], ["scaled"]),
    helper.make_node("Softmax", ["scaled"], ["probs"], axis=-1),
    helper.make_node("MatMul", ["probs", "v_h"], ["att"]),
    helper.make_node("Transpose", ["att"], ["att_t"], perm=[0, 2, 1, 3]),
    helper.make_node("Reshape", ["att_t", "rows"], ["att_rows"]),
    helper.make_node("MatMul", ["att_rows", "wo"], ["o_mm"]),
    helper.make_node("Add", ["o_mm", "bo"], ["o_lin"]),
    helper.make_node("Add", ["x", "o_lin"], ["y"]),
  ]
  g = helper.make_graph(
    nodes,
    "attention",
    [helper.make_tensor_value_info("x", TP.FLOAT, [1, SEQ, DIM])],
    [helper.make_tensor_value_info("y", TP.FLOAT, [1, SEQ, DIM])],
    inits,
  )
  return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module", params=["qdq", "qoperator"])
def compiled(request, tmp_path_factory):
  tmp = tmp_path_factory.mktemp(request.param)
  model = quantized(_attention(), request.param, seed=7)
  sess = ort_session(model, tmp / "ort.onnx")
  return request.param, model, sess, onnx.load(tmp / "ort.onnx"), aot.compile_model(model, out_dir=tmp / "art")


def test_qdq_groups_fused_as_onnxruntime(compiled):
  form, model, _, optimized, _ = compiled
  ours = Counter(n.op_type for n in fuse_qdq(model).graph.node if n.op_type in QLINEAR)
  theirs = Counter(n.op_type for n in optimized.graph.node if n.op_type in QLINEAR)
  assert ours == theirs
  # attention's Q.K^T and P.V are in it: the quantizer made them QDQ MatMuls of two activations
  assert ours["QLinearMatMul"] >= 2 and ours["QLinearSoftmax"] == 1


def test_bytes_as_onnxruntime(compiled):
  form, model, sess, _, art = compiled
  run = aot.load(art)
  for seed in SEEDS:
    x = np.random.default_rng(100 + seed).standard_normal((1, SEQ, DIM)).astype(np.float32)
    want = sess.run(None, {"x": x})[0]
    got = np.asarray(run(x))
    if form == "qdq":
      # the graph ends in DequantizeLinear of the residual add's bytes: equal bytes are equal floats
      np.testing.assert_array_equal(got, want)
    else:
      # the QOperator form dequantizes last in float32 as onnxruntime does
      np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_int8_sized_weights(compiled):
  _, _, _, _, art = compiled
  assert art.weights_bytes <= INT8_WEIGHTS_SLACK * 4 * DIM * DIM + 4096, art.weights_bytes
  src = (art.dir / "src" / "model.c").read_text()
  # the four projections on the int8 microkernel (those writing split heads too)
  assert src.count("aot_qgemm_run") >= 4


def _qlinear_model(op, domain, inputs, consts, out_type=TP.UINT8):
  names = [i[0] for i in inputs]
  node_inputs = [names[0], "sa", "za", names[1], "sb", "zb", "sc", "zc"]
  g = helper.make_graph(
    [helper.make_node(op, node_inputs, ["c"], domain=domain)],
    op,
    [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
    [helper.make_tensor_value_info("c", out_type, None)],
    [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()],
  )
  opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(domain, 1)] if domain else [])
  return helper.make_model(g, opset_imports=opsets)


def test_qlinear_add_rounds_as_mlas(tmp_path):
  # every pair of bytes (a 256 x 256 grid), at scales where (a - za) * ra + (b - zb) * rb lands on the other side of
  # a rounding boundary from MLAS's fma(a, ra, fma(b, rb, zc - fma(ra, za, rb * zb))) for some
  # a pair (72 of the 65536 pairs here: found by trying seeded scales)
  consts = dict(sa=np.float32(0.0471), za=np.uint8(71), sb=np.float32(0.0051), zb=np.uint8(208))
  consts.update(sc=np.float32(0.0436), zc=np.uint8(141))
  model = _qlinear_model(
    "QLinearAdd", "com.microsoft", [("a", TP.UINT8, [256, 256]), ("b", TP.UINT8, [256, 256])], consts
  )
  a, b = np.meshgrid(np.arange(256, dtype=np.uint8), np.arange(256, dtype=np.uint8), indexing="ij")
  a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
  want = ort_session(model).run(None, {"a": a, "b": b})[0]
  got = aot.load(aot.compile_model(model, out_dir=tmp_path / "art"))(a, b)
  np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("k", [256, 300])
def test_qlinear_matmul_of_activations(tmp_path, k):
  # the largest products at both ends of the range: K = 256 sums to about -255 * 255 * 256, just under 2^24 (the
  # float GEMM's exact bound), and runs there; K = 300 is past it and stays in int32
  r = np.random.default_rng(k)
  a = np.where(r.random((1, 2, 64, k)) < 0.97, 255, r.integers(0, 256, (1, 2, 64, k))).astype(np.uint8)
  b = np.where(r.random((1, 2, k, 64)) < 0.97, 0, r.integers(0, 256, (1, 2, k, 64))).astype(np.uint8)
  consts = dict(sa=np.float32(0.02), za=np.uint8(0), sb=np.float32(0.03), zb=np.uint8(255))
  # (a multiplier of 2^-16 * 256 / K: the sums spread over the output's bytes)
  consts.update(sc=np.float32(0.02 * 0.03 * 65536 * k / 256), zc=np.uint8(255))
  model = _qlinear_model("QLinearMatMul", "", [("a", TP.UINT8, list(a.shape)), ("b", TP.UINT8, list(b.shape))], consts)
  want = ort_session(model).run(None, {"a": a, "b": b})[0]
  art = aot.compile_model(model, out_dir=tmp_path / "art")
  np.testing.assert_array_equal(aot.load(art)(a, b), want)
  assert len(np.unique(want)) > 3
  assert ("aot_gemm_run" in (art.dir / "src" / "model.c").read_text()) == (k <= FLOAT_EXACT_K)


def _qdq_elementwise(op, shapes, attrs, opset=17, types=(TP.UINT8, TP.UINT8, TP.UINT8)):
  """float x_i -> QuantizeLinear -> DequantizeLinear -> op -> QuantizeLinear -> DequantizeLinear (types: each input's,
  then the output's 8-bit type)."""
  as_np = {TP.UINT8: np.uint8, TP.INT8: np.int8}
  inits, nodes, inputs = [], [], []
  for i, shape in enumerate(shapes):
    inputs.append(helper.make_tensor_value_info(f"x{i}", TP.FLOAT, shape))
    inits += [_scalar(f"s{i}", np.float32(0.02 + 0.01 * i)), _scalar(f"z{i}", np.array(100, as_np[types[i]]))]
    nodes += [
      helper.make_node("QuantizeLinear", [f"x{i}", f"s{i}", f"z{i}"], [f"q{i}"]),
      helper.make_node("DequantizeLinear", [f"q{i}", f"s{i}", f"z{i}"], [f"d{i}"]),
    ]
  nodes.append(helper.make_node(op, [f"d{i}" for i in range(len(shapes))], ["y"], **attrs))
  inits += [
    _scalar("sy", np.float32(0.05 if op != "Softmax" else 1 / 256)),
    _scalar("zy", np.array(3, as_np[types[-1]])),
  ]
  nodes += [
    helper.make_node("QuantizeLinear", ["y", "sy", "zy"], ["qy"]),
    helper.make_node("DequantizeLinear", ["qy", "sy", "zy"], ["out"]),
  ]
  g = helper.make_graph(nodes, op, inputs, [helper.make_tensor_value_info("out", TP.FLOAT, None)], inits)
  return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _scalar(name, v):
  return numpy_helper.from_array(np.asarray(v), name)


@pytest.mark.parametrize(
  "op, shapes, attrs, opset, types",
  [
    ("Add", [[2, 1, 70], [50, 1]], {}, 17, (TP.UINT8,) * 3),
    ("Add", [[4, 16, 64], [4, 16, 64]], {}, 17, (TP.INT8,) * 3),
    ("Mul", [[4, 16, 64], [4, 16, 64]], {}, 17, (TP.UINT8,) * 3),
    ("Softmax", [[2, 50, 7]], {"axis": 1}, 17, (TP.UINT8,) * 2),
    ("Softmax", [[2, 5, 70]], {"axis": 1}, 11, (TP.UINT8,) * 2),
    ("Softmax", [[2, 5, 70]], {}, 17, (TP.UINT8, TP.INT8)),
  ],
)
def test_elementwise_groups_as_onnxruntime(tmp_path, op, shapes, attrs, opset, types):
  model = _qdq_elementwise(op, shapes, attrs, opset, types)
  sess = ort_session(model, tmp_path / "ort.onnx")
  theirs = [n.op_type for n in onnx.load(tmp_path / "ort.onnx").graph.node if n.op_type in QLINEAR | {"QLinearMul"}]
  ours = [n.op_type for n in fuse_qdq(model).graph.node if n.op_type in QLINEAR | {"QLinearMul"}]
  assert ours == theirs == [f"QLinear{op}"]
  r = np.random.default_rng(1)
  feeds = {f"x{i}": (r.standard_normal(s) * 2).astype(np.float32) for i, s in enumerate(shapes)}
  got = aot.load(aot.compile_model(model, out_dir=tmp_path / "art"))(*feeds.values())
  np.testing.assert_array_equal(got, sess.run(None, feeds)[0])
