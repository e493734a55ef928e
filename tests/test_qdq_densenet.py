"""The shapes of computation of onnx's light DenseNet-121 quantized by onnxruntime's quantizer (QDQ): small graphs
equal to onnxruntime's int8 run bit for bit."""

import tempfile

import numpy as np
import onnx
import pytest
from conftest import ort_session, outputs_on_threads
from onnx import TensorProto as TP
from onnx import helper as oh
from onnx import numpy_helper

import aot


def _transition_pool(zero_point: int) -> onnx.ModelProto:
  """DenseNet's transition: DequantizeLinear -> 2x2 stride-2 AveragePool -> QuantizeLinear at the input's scale, the
  mean of four steps landing on halves of a step (onnxruntime fuses it to QLinearAveragePool)."""
  inits = [numpy_helper.from_array(np.float32(0.0371), "s"), numpy_helper.from_array(np.uint8(zero_point), "z")]
  nodes = [
    oh.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
    oh.make_node("DequantizeLinear", ["q", "s", "z"], ["d"]),
    oh.make_node("AveragePool", ["d"], ["a"], kernel_shape=[2, 2], strides=[2, 2]),
    oh.make_node("QuantizeLinear", ["a", "s", "z"], ["y"]),
  ]
  g = oh.make_graph(
    nodes,
    "g",
    [oh.make_tensor_value_info("x", TP.FLOAT, [1, 16, 20, 20])],
    [oh.make_tensor_value_info("y", TP.UINT8, [1, 16, 10, 10])],
    initializer=inits,
  )
  m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])
  m.ir_version = 9
  return m


@pytest.mark.parametrize("zero_point", [7, 128])
def test_qdq_average_pool_equals_onnxruntime(zero_point):
  m = _transition_pool(zero_point)
  x = (3 * np.random.default_rng(zero_point).standard_normal((1, 16, 20, 20))).astype(np.float32)
  want = ort_session(m).run(None, {"x": x})[0]
  with tempfile.TemporaryDirectory(prefix="aot_qdq_densenet_") as d:
    (got,) = outputs_on_threads(aot.compile_model(m, out_dir=d), {"x": x}, threads=(1,))
  np.testing.assert_array_equal(np.asarray(got), want)
