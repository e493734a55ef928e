"""3x3 convolutions by Winograd's F(2x2, 3x3) (frontends/winograd.py): which convolutions take it, their answers
against a float64 sum (onnxruntime sums in float32 itself, the less exact side), over sizes that leave the last tile
partial, any padding and a batch, bitwise the same on any thread count, and through a batch range."""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import outputs_on_threads
from onnx import TensorProto, helper, numpy_helper

import aot
from aot.frontends.tensor import Tensor
from aot.frontends.winograd import WINOGRAD_MIN_TILES
from aot.testing import assert_kernel_count

rng = np.random.default_rng(0)
f32 = lambda *shape: rng.standard_normal(shape, dtype=np.float32)


def conv_ref(x, w, pads=(1, 1, 1, 1), stride=1):
  """float64 NCHW convolution; pads (top, left, bottom, right) as ONNX orders them."""
  x, w = x.astype(np.float64), w.astype(np.float64)
  x = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
  win = np.lib.stride_tricks.sliding_window_view(x, w.shape[2:], axis=(2, 3))[:, :, ::stride, ::stride]
  return np.einsum("nchwij,ocij->nohw", win, w)


def close(out, ref):
  # F(2x2, 3x3) adds and subtracts 4 inputs per transformed value and 9 products per output: a few roundings more
  # than the direct sum, within the 1e-4 relative the project holds convolutions to
  np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


# the input transform along each of the tile's axes, the 16 products as one batched matmul on the microkernel, the
# output transform along the first axis of the 2x2 block; the second, interleaving the blocks into NCHW, is the
# consumer's (here the bias add's kernel)
WINOGRAD_KERNELS = 5


@pytest.mark.parametrize(
  "n, c, h, w, o, pads",
  [
    (1, 128, 28, 28, 128, (1, 1, 1, 1)),  # whole tiles
    (2, 128, 15, 13, 160, (1, 1, 1, 1)),  # odd sizes: the last row and column of tiles half cut, a batch of 2
    (1, 128, 17, 20, 144, (0, 2, 1, 0)),  # uneven padding
    (1, 128, 18, 18, 128, (0, 0, 0, 0)),  # no padding: 16x16 outputs
  ],
)
def test_winograd_conv_matches_a_float64_sum(n, c, h, w, o, pads, tmp_path):
  x, wt, b = f32(n, c, h, w), f32(o, c, 3, 3) * 0.1, f32(o)
  fn = lambda x: x.conv2d(Tensor(wt), Tensor(b), padding=[(pads[0], pads[2]), (pads[1], pads[3])])
  art = aot.compile_model(fn, [x], out_dir=tmp_path / "m")
  assert art.num_kernels == WINOGRAD_KERNELS
  outs = outputs_on_threads(art, {"x": x}, (1, 2, 3))
  close(outs[0], conv_ref(x, wt, pads) + b[:, None, None])
  for out in outs[1:]:
    np.testing.assert_array_equal(out, outs[0])


def test_winograd_conv_is_five_kernels(tmp_path):
  x, w = f32(1, 128, 28, 28), f32(128, 128, 3, 3)
  assert_kernel_count(lambda x: x.conv2d(Tensor(w), padding=1), WINOGRAD_KERNELS, [x])


@pytest.mark.parametrize(
  "why, x, w, stride",
  [
    ("64 to 64 channels: the transforms cost more than the products save", (1, 64, 56, 56), (64, 64, 3, 3), 1),
    ("a 7x7 map: 16 tiles use each transformed weight too few times", (1, 512, 7, 7), (512, 512, 3, 3), 1),
    ("stride 2", (1, 128, 28, 28), (128, 128, 3, 3), 2),
    ("a 5x5 window", (1, 128, 28, 28), (128, 128, 5, 5), 1),
  ],
)
def test_other_convolutions_are_summed_directly(why, x, w, stride):
  # one kernel: the microkernel over the window matrix, the conv's own
  assert_kernel_count(lambda x: x.conv2d(Tensor(f32(*w)), stride=stride, padding=1), 1, [f32(*x)])


def test_tile_threshold_counts_tiles_per_image():
  # a batch does not change the program (a batch range traces it at other sizes): 16 tiles per image stay direct
  assert 16 < WINOGRAD_MIN_TILES
  assert_kernel_count(lambda x: x.conv2d(Tensor(f32(256, 256, 3, 3)), padding=1), 1, [f32(8, 256, 7, 7)])


def _conv_model(w: np.ndarray, dims: list):
  """A 3x3 conv, relu, then a 1x1 conv to 4096 channels: its 2 MB of weights leave the 3x3 conv's transformed ones
  within the model's budget (WINOGRAD_MAX_GROWTH)."""
  wide = f32(4096, w.shape[0], 1, 1) * 0.05
  nodes = [
    helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1]),
    helper.make_node("Relu", ["y"], ["r"]),
    helper.make_node("Conv", ["r", "wide"], ["z"]),
  ]
  graph = helper.make_graph(
    nodes,
    "g",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
    [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
    [numpy_helper.from_array(w, "w"), numpy_helper.from_array(wide, "wide")],
  )
  return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), wide


def _model_ref(x, w, wide):
  return np.einsum("nchw,oc->nohw", np.maximum(conv_ref(x, w), 0), wide[:, :, 0, 0].astype(np.float64))


def test_batch_range_runs_winograd_like_a_static_compile(tmp_path):
  w = f32(128, 128, 3, 3) * 0.05
  model, wide = _conv_model(w, ["batch", 128, 16, 16])
  ranged = aot.compile_model(model, out_dir=tmp_path / "ranged", shapes={"batch": (1, 5)})
  static = aot.compile_model(model, out_dir=tmp_path / "static", shapes={"batch": 1})
  direct = aot.compile_model(model, out_dir=tmp_path / "direct", shapes={"batch": 1}, winograd=False)
  assert ranged.num_kernels == static.num_kernels == direct.num_kernels + WINOGRAD_KERNELS - 1
  session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
  with aot.load(ranged) as run:
    for n in (1, 3, 5):
      x = f32(n, 128, 16, 16)
      out = run(x)
      close(out, _model_ref(x, w, wide))
      np.testing.assert_allclose(out, session.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)


def test_width_range_sums_directly(tmp_path):
  # a dim run in loops to the size given at run time is proved over windows taken whole, not Winograd's tiles: that
  # artifact sums its convolutions directly, where a static compile of the same width takes Winograd
  w = f32(128, 128, 3, 3) * 0.05
  model, wide = _conv_model(w, [1, 128, 12, "width"])
  ranged = aot.compile_model(model, out_dir=tmp_path / "ranged", shapes={"width": (8, 40)})
  static = aot.compile_model(model, out_dir=tmp_path / "static", shapes={"width": 40})
  direct = aot.compile_model(model, out_dir=tmp_path / "direct", shapes={"width": 40}, winograd=False)
  assert ranged.num_kernels == direct.num_kernels == static.num_kernels - (WINOGRAD_KERNELS - 1)
  with aot.load(ranged) as run:
    for width in (8, 23, 40):
      x = f32(1, 128, 12, width)
      close(run(x), _model_ref(x, w, wide))


def test_winograd_off_sums_directly(tmp_path):
  # compile_model(winograd=False) and compile-model --no-winograd: for a user short of memory (16 floats per filter)
  from aot import cli

  kernels = {}
  x, w = f32(1, 128, 28, 28), f32(128, 128, 3, 3) * 0.05
  art = aot.compile_model(lambda x: x.conv2d(Tensor(w), padding=1), [x], out_dir=tmp_path / "py", winograd=False)
  assert art.num_kernels == 1
  with aot.load(art) as run:
    close(run(x), conv_ref(x, w))
  model, _ = _conv_model(w, [1, 128, 28, 28])
  onnx.save(model, tmp_path / "conv.onnx")
  for flags in ([], ["--no-winograd"]):
    assert cli.main([str(tmp_path / "conv.onnx"), "-o", str(tmp_path / "cli"), *flags, "-q"]) == 0
    kernels["off" if flags else "on"] = len(json.loads((tmp_path / "cli" / "conv.json").read_text())["kernels"])
  assert kernels["on"] == kernels["off"] + WINOGRAD_KERNELS - 1


def test_onnx_model_weights_grow_at_most_the_budget(tmp_path):
  # an ONNX model's transformed weights add at most WINOGRAD_MAX_GROWTH of its weights: the first 3x3 convolution fits
  # (a wide 1x1 convolution holds most of the weights), the second would pass it and is summed directly
  from aot.frontends.winograd import WINOGRAD_MAX_GROWTH

  w1, w2, wide = f32(128, 128, 3, 3) * 0.05, f32(128, 128, 3, 3) * 0.05, f32(4096, 128, 1, 1) * 0.05
  nodes = [
    helper.make_node("Conv", ["x", "w1"], ["a"], pads=[1, 1, 1, 1]),
    helper.make_node("Conv", ["a", "w2"], ["b"], pads=[1, 1, 1, 1]),
    helper.make_node("Conv", ["b", "wide"], ["y"]),
  ]
  weights = [numpy_helper.from_array(v, n) for n, v in (("w1", w1), ("w2", w2), ("wide", wide))]
  graph = helper.make_graph(
    nodes,
    "g",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 128, 16, 16])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    weights,
  )
  model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
  own = w1.nbytes + w2.nbytes + wide.nbytes
  assert w1.nbytes * 7 / 9 <= WINOGRAD_MAX_GROWTH * own < (w1.nbytes + w2.nbytes) * 7 / 9
  art = aot.compile_model(model, out_dir=tmp_path / "m", name="m")
  # Winograd's 5 kernels, the direct 3x3 conv, the 1x1 conv
  assert art.num_kernels == WINOGRAD_KERNELS + 2
  assert art.weights_bytes <= (1 + WINOGRAD_MAX_GROWTH) * own
  x = f32(1, 128, 16, 16)
  session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
  with aot.load(art) as run:
    np.testing.assert_allclose(run(x), session.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)
