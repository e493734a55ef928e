"""The shapes of computation of onnx's light zoo models quantized by onnxruntime's quantizer (models/quantized.py) that
ran far slower than onnxruntime's int8 run: small hand-built float graphs of each, quantized by quantize_static in QDQ
and QOperator form, equal to onnxruntime's int8 run bit for bit and on the int8 microkernel (one aot_qgemm call per
convolution)."""

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
from aot.models.quantized import quantized


class _Graph:
  """A float NCHW graph built node by node with seeded weights."""

  def __init__(self, seed: int):
    self.rng = np.random.default_rng(seed)
    # convolutions, and the microkernel calls they take (one per group)
    self.nodes, self.inits, self.convs, self.calls = [], {}, 0, 0

  def conv(self, x: str, cin: int, cout: int, k: int, stride: int = 1, group: int = 1) -> str:
    name = f"c{self.convs}"
    self.convs += 1
    self.calls += group
    fan_in = cin // group * k * k
    self.inits[name + "_w"] = (self.rng.standard_normal((cout, cin // group, k, k)) / np.sqrt(fan_in)).astype(
      np.float32
    )
    self.inits[name + "_b"] = (0.1 * self.rng.standard_normal(cout)).astype(np.float32)
    self.nodes.append(
      oh.make_node(
        "Conv", [x, name + "_w", name + "_b"], [name + "_c"], pads=[k // 2] * 4, strides=[stride] * 2, group=group
      )
    )
    self.nodes.append(oh.make_node("Relu", [name + "_c"], [name]))
    return name

  def node(self, op: str, inputs: list, **attrs) -> str:
    out = f"n{len(self.nodes)}"
    self.nodes.append(oh.make_node(op, inputs, [out], **attrs))
    return out

  def model(self, out: str, in_shape: tuple, out_shape: tuple) -> onnx.ModelProto:
    g = oh.make_graph(
      self.nodes,
      "g",
      [oh.make_tensor_value_info("x", TP.FLOAT, list(in_shape))],
      [oh.make_tensor_value_info(out, TP.FLOAT, list(out_shape))],
      initializer=[numpy_helper.from_array(v, k) for k, v in self.inits.items()],
    )
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])
    m.ir_version = 9
    return m


def _fire() -> tuple[onnx.ModelProto, int]:
  """Two of squeezenet's fire modules (squeeze 1x1, expand 1x1 and 3x3, concat), a conv reading the last concat."""
  g = _Graph(0)
  x = "x"
  for cin in (16, 32):
    s = g.conv(x, cin, 8, 1)
    x = g.node("Concat", [g.conv(s, 8, 16, 1), g.conv(s, 8, 16, 3)], axis=1)
  return g.model(g.conv(x, 32, 8, 1), (1, 16, 12, 12), (1, 8, 12, 12)), g.calls


def _inception() -> tuple[onnx.ModelProto, int]:
  """inception_v1's module: a 1x1 branch, 1x1 -> 3x3, 1x1 -> 5x5, max pool -> 1x1, concatenated; a conv reads it."""
  g = _Graph(1)
  pool = g.node("MaxPool", ["x"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1])
  branches = [
    g.conv("x", 16, 8, 1),
    g.conv(g.conv("x", 16, 8, 1), 8, 12, 3),
    g.conv(g.conv("x", 16, 4, 1), 4, 8, 5),
    g.conv(pool, 16, 4, 1),
  ]
  cat = g.node("Concat", branches, axis=1)
  return g.model(g.conv(cat, 32, 8, 1), (1, 16, 10, 10), (1, 8, 10, 10)), g.calls


def _inception_pooled() -> tuple[onnx.ModelProto, int]:
  """inception_v1's last module: the concat of 4 branches read by a 7x7 average pool whose window is padded past the
  6x6 plane, a convolution after."""
  g = _Graph(2)
  pool = g.node("MaxPool", ["x"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1])
  branches = [g.conv("x", 16, 8, 1), g.conv(g.conv("x", 16, 8, 1), 8, 8, 3), g.conv(pool, 16, 8, 1)]
  cat = g.node("Concat", branches, axis=1)
  avg = g.node("AveragePool", [cat], kernel_shape=[7, 7], pads=[0, 0, 1, 1], strides=[1, 1])
  return g.model(g.conv(avg, 24, 8, 1), (1, 16, 6, 6), (1, 8, 1, 1)), g.calls


def _grouped() -> tuple[onnx.ModelProto, int]:
  """bvlc_alexnet's grouped convolutions: 5x5 in 2 groups, 3x3 in 4 (12 channels each)."""
  g = _Graph(3)
  x = g.conv(g.conv(g.conv("x", 16, 32, 1), 32, 32, 5, group=2), 32, 48, 3, group=4)
  return g.model(g.conv(x, 48, 8, 1), (1, 16, 9, 9), (1, 8, 9, 9)), g.calls


def _shuffled() -> tuple[onnx.ModelProto, int]:
  """shufflenet's unit: a 4-group 1x1 convolution, the channel shuffle (Reshape, Transpose, Reshape) after it, a
  depthwise 3x3 (generated loops: not counted), a 4-group 1x1 convolution."""
  g = _Graph(4)
  x = g.conv(g.conv("x", 16, 32, 1), 32, 32, 1, group=4)
  g.inits["split"], g.inits["merge"] = np.array([1, 4, 8, 9, 9]), np.array([1, 32, 9, 9])
  x = g.node("Reshape", [g.node("Transpose", [g.node("Reshape", [x, "split"])], perm=[0, 2, 1, 3, 4]), "merge"])
  x = g.conv(x, 32, 32, 3, group=32)
  x = g.conv(x, 32, 32, 1, group=4)
  return g.model(g.conv(x, 32, 8, 1), (1, 16, 9, 9), (1, 8, 9, 9)), g.calls - 32


def _shuffled_stride2() -> tuple[onnx.ModelProto, int]:
  """shufflenet's stride-2 unit: a 3x3 average pool of the input concatenated with a branch ending in a 4-group 1x1
  convolution (a concat's branch that is a group convolution)."""
  g = _Graph(5)
  x = g.conv("x", 16, 32, 1)
  shortcut = g.node("AveragePool", [x], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2], count_include_pad=0)
  branch = g.conv(g.conv(g.conv(x, 32, 32, 1, group=4), 32, 32, 3, stride=2, group=32), 32, 32, 1, group=4)
  cat = g.node("Concat", [shortcut, branch], axis=1)
  return g.model(g.conv(cat, 64, 8, 1), (1, 16, 10, 10), (1, 8, 5, 5)), g.calls - 32


def _dense() -> tuple[onnx.ModelProto, int]:
  """densenet121's dense block of two layers (BatchNormalization, its Mul and Add of constants, Relu, 1x1 and 3x3
  convolutions, the concat of the input and the new channels), its transition after (the same, a 1x1 convolution, a
  2x2 average pool): in QOperator form the last concat's branch, a QLinearConcat read by a QLinearMul, is fused with
  the requantizations after it."""
  g = _Graph(7)

  def scaled(x: str, c: int) -> str:
    stats = {"s": 1 + 0.1 * g.rng.standard_normal(c), "b": 0.1 * g.rng.standard_normal(c)}
    stats |= {"m": 0.1 * g.rng.standard_normal(c), "v": 1 + 0.1 * g.rng.random(c)}
    names = [f"bn{len(g.inits)}{k}" for k in stats]
    g.inits |= {n: v.astype(np.float32) for n, v in zip(names, stats.values())}
    mul, add = f"mul{len(g.inits)}", f"add{len(g.inits)}"
    g.inits[mul] = (1 + 0.1 * g.rng.standard_normal((c, 1, 1))).astype(np.float32)
    g.inits[add] = (0.1 * g.rng.standard_normal((c, 1, 1))).astype(np.float32)
    x = g.node("Add", [g.node("Mul", [g.node("BatchNormalization", [x, *names]), mul]), add])
    return g.node("Relu", [x])

  x, c = "x", 16
  for _ in range(2):
    x, c = g.node("Concat", [x, g.conv(g.conv(scaled(x, c), c, 16, 1), 16, 8, 3)], axis=1), c + 8
  y = g.node("AveragePool", [g.conv(scaled(x, c), c, 8, 1)], kernel_shape=[2, 2], strides=[2, 2])
  return g.model(y, (1, 16, 8, 8), (1, 8, 4, 4)), g.calls


def _qgemm_calls(source: str) -> int:
  return len(re.findall(r"aot_qgemm g = \{", source))


def _run_both(m: onnx.ModelProto, seed: int):
  """(our output, onnxruntime's, model.c) on one seeded input."""
  shape = [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]
  x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
  want = ort_session(m).run(None, {"x": x})[0]
  with tempfile.TemporaryDirectory(prefix="aot_qzoo_") as d:
    art = aot.compile_model(m, out_dir=d)
    source = (art.dir / "src" / "model.c").read_text()
    (got,) = outputs_on_threads(art, {"x": x}, threads=(1,))
  return got, want, source


@pytest.mark.parametrize(
  "build",
  [_fire, _inception, _inception_pooled, _grouped, _shuffled, _shuffled_stride2, _dense],
  ids=["fire", "inception", "inception_pooled", "grouped", "shuffled", "shuffled_stride2", "dense"],
)
@pytest.mark.parametrize("form", ["qdq", "qoperator"])
def test_convolutions_run_on_the_int8_microkernel_and_equal_onnxruntime(build, form):
  float_model, calls = build()
  m = quantized(float_model, form)
  got, want, source = _run_both(m, 2)
  assert got.dtype == want.dtype and got.shape == want.shape
  np.testing.assert_array_equal(got, want)
  # every convolution, the concat's branches too, one call of the microkernel, a grouped one a call per group (the
  # branches were generated loops over the whole concat each, the grouped convolutions generated loops; in QOperator
  # form a dense block's last branch, fused with the QLinearMul after the concat, failed its whole kernel)
  assert _qgemm_calls(source) == calls


CLASSES = 100


def test_a_classifier_head_with_a_quantized_softmax_equals_onnxruntime():
  # the zoo's heads: global average pool, flatten, fully connected, softmax; onnxruntime runs the QDQ softmax as
  # QLinearSoftmax, whose probabilities differed from the float softmax's by a step of 1/255
  g = _Graph(6)
  pooled = g.node("AveragePool", [g.conv("x", 16, 16, 1)], kernel_shape=[7, 7])
  g.inits["flat"] = np.array([1, 16 * 8 * 8])
  g.inits["fc_w"] = (0.05 * g.rng.standard_normal((CLASSES, 16 * 64))).astype(np.float32)
  g.inits["fc_b"] = g.rng.standard_normal(CLASSES).astype(np.float32)
  logits = g.node("Gemm", [g.node("Reshape", [pooled, "flat"]), "fc_w", "fc_b"], transB=1)
  m = quantized(g.model(g.node("Softmax", [logits], axis=-1), (1, 16, 14, 14), (1, CLASSES)), "qdq")
  got, want, _ = _run_both(m, 1)
  assert np.count_nonzero(want) > 1
  np.testing.assert_array_equal(got, want)
