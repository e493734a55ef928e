"""ConvTranspose against onnxruntime over a grid of strides 1-3, kernels 1-4, pads, output_padding, dilations 1-2,
groups 1-2, bias or none, 1-D and 2-D (all nodes of one model, compiled once), the output_shape and auto_pad forms, and
the sub-pixel lowering's cost: a 2x2 stride-2 upsampler is one GEMM over the input's channels with an arena near the
output's size, where a conv over the zero-inserted input copies 4 x the output per input channel."""

import itertools
import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import aot
from aot.artifact import Artifact

STRIDES, KERNELS = (1, 2, 3), (1, 2, 3, 4)


def _grid() -> list[dict]:
  """One case per (rank, stride, kernel); the other attributes rotate through their values with the case number, so
  each value meets several strides and kernels while the model stays small enough to compile in seconds."""
  cases = []
  for i, (nd, s, k) in enumerate(itertools.product((1, 2), STRIDES, KERNELS)):
    d, group = (1, 2)[i % 2], (1, 2)[(i // 2) % 2]
    # the second axis takes another stride and kernel, so axes differ in phase count and sub-kernel size
    strides = [s] if nd == 1 else [s, STRIDES[(i + 1) % 3]]
    kernel = [k] if nd == 1 else [k, KERNELS[(i + 2) % 4]]
    # output_padding below the stride (the spec allows up to the dilation; onnxruntime does not); pads within the kernel
    attrs = dict(strides=strides, dilations=[d] * nd, group=group)
    attrs["output_padding"] = [(i + a) % st for a, st in enumerate(strides)]
    attrs["pads"] = [(i + a) % kk for a, kk in enumerate(kernel)] + [(i // 3 + a) % kk for a, kk in enumerate(kernel)]
    cases.append(dict(attrs=attrs, kernel=kernel, cin=2 * group, coutg=3 - group, bias=i % 3 != 2, batch=2 // nd))
  return cases


def _extra() -> list[dict]:
  """The forms the grid does not reach: output sizes given by output_shape or auto_pad, a dilation above the stride
  (the zero-insertion path), and the wide 2x2 stride-2 upsampler of segmentation necks."""
  same = dict(cin=3, coutg=2, bias=True, batch=1)
  return [
    # odd total pads (1 and 3): without SAME_UPPER the head takes the larger half
    dict(attrs=dict(strides=[2, 2], output_shape=[10, 6]), kernel=[3, 3], **same),
    dict(attrs=dict(strides=[2, 2], auto_pad="SAME_UPPER", output_shape=[10, 6]), kernel=[3, 3], **same),
    dict(attrs=dict(strides=[2, 3], auto_pad="SAME_UPPER"), kernel=[3, 4], **same),
    dict(attrs=dict(strides=[3, 2], auto_pad="SAME_LOWER", output_shape=[13, 9]), kernel=[4, 3], **same),
    dict(attrs=dict(strides=[2, 2], auto_pad="VALID"), kernel=[4, 4], **same),
    dict(attrs=dict(strides=[2, 2], dilations=[3, 1]), kernel=[3, 3], **same),
    dict(attrs=dict(strides=[2, 2]), kernel=[2, 2], cin=16, coutg=8, bias=True, batch=1),
  ]


CASES = _grid() + _extra()


def _model(cases) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
  rng = np.random.default_rng(0)
  nodes, inputs, outputs, inits, feeds = [], [], [], [], {}
  for i, c in enumerate(cases):
    group = c["attrs"].get("group", 1)
    x = rng.standard_normal((c["batch"], c["cin"]) + (5, 4)[: len(c["kernel"])]).astype(np.float32)
    feeds[f"x{i}"] = x
    inputs.append(helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, list(x.shape)))
    inits.append(
      numpy_helper.from_array(rng.standard_normal((c["cin"], c["coutg"], *c["kernel"]), np.float32), f"w{i}")
    )
    names = [f"x{i}", f"w{i}"]
    if c["bias"]:
      inits.append(numpy_helper.from_array(rng.standard_normal(c["coutg"] * group, np.float32), f"b{i}"))
      names.append(f"b{i}")
    nodes.append(helper.make_node("ConvTranspose", names, [f"y{i}"], **c["attrs"]))
    outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None))
  graph = helper.make_graph(nodes, "conv_transposes", inputs, outputs, inits)
  return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), feeds


@pytest.fixture(scope="module")
def ours_and_onnxruntime(tmp_path_factory):
  model, feeds = _model(CASES)
  want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
  art = aot.compile_model(model, out_dir=tmp_path_factory.mktemp("convt") / "m")
  got = aot.load(art, threads=1)(*feeds.values())
  return got, want


@pytest.mark.parametrize("i", range(len(CASES)), ids=[str(c["attrs"]) for c in CASES])
def test_matches_onnxruntime(ours_and_onnxruntime, i):
  got, want = ours_and_onnxruntime
  assert got[i].shape == want[i].shape
  np.testing.assert_allclose(got[i], want[i], rtol=1e-4, atol=1e-4)


def _upsampler(tmp_path, cin: int, cout: int, size: int, **attrs) -> tuple[Artifact, int]:
  """(artifact, output bytes) of ConvTranspose(cin -> cout, stride 2) -> Sigmoid on a size x size input."""
  rng = np.random.default_rng(1)
  kernel = attrs.pop("kernel")
  w = rng.standard_normal((cin, cout, kernel, kernel), np.float32)
  out = 2 * size + kernel - 2 - 2 * attrs.get("pads", [0])[0]
  nodes = [
    helper.make_node("ConvTranspose", ["x", "w"], ["t"], strides=[2, 2], **attrs),
    helper.make_node("Sigmoid", ["t"], ["y"]),
  ]
  x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, size, size])
  y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, cout, out, out])
  graph = helper.make_graph(nodes, "upsampler", [x], [y], [numpy_helper.from_array(w, "w")])
  model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
  art = aot.compile_model(model, out_dir=tmp_path / "up")
  feeds = {"x": rng.standard_normal((1, cin, size, size), np.float32)}
  want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
  np.testing.assert_allclose(aot.load(art, threads=1)(feeds["x"]), want, rtol=1e-4, atol=1e-5)
  return art, 4 * cout * out * out


def _gemms(art: Artifact) -> list[tuple[int, int, int, int]]:
  """(batch, M, N, K) of each microkernel call in the artifact's C source."""
  calls = re.findall(r"aot_gemm g = \{(\d+), (\d+), (\d+), (\d+),", (art.dir / "src" / "model.c").read_text())
  return [tuple(map(int, c)) for c in calls]


def test_kernel_equal_to_stride_is_one_gemm_over_the_input_channels(tmp_path):
  # DBNet's last layer: [Cout*4, 16] x [16, H*W], reading the input in place; over the zero-inserted input it was
  # K = 16*4 with a 64 x output-sized operand copy in the arena
  art, out_bytes = _upsampler(tmp_path, 16, 1, 64, kernel=2)
  gemms = _gemms(art)
  assert len(gemms) == 1 and gemms[0][3] == 16, f"GEMMs (B, M, N, K) {gemms}: expected one, K the input's 16 channels"
  assert art.arena_bytes <= 2 * out_bytes, f"arena {art.arena_bytes} B for a {out_bytes} B output"


def test_padded_upsampler_multiplies_only_real_taps(tmp_path):
  # a 4x4 stride-2 pad-1 kernel: each of the 4 phases is a 2x2 conv of the un-dilated input, one GEMM with
  # M = Cout*4, K = Cin*4; over the zero-inserted input K is Cin*16, three of every four products by an inserted zero
  art, _ = _upsampler(tmp_path, 8, 6, 32, kernel=4, pads=[1, 1, 1, 1])
  gemms = _gemms(art)
  # the output channels (6 x 4 phases) are the GEMM's M or its N, whichever side the scheduler puts them on
  assert len(gemms) == 1 and gemms[0][3] == 8 * 4 and 6 * 4 in gemms[0][1:3], f"GEMMs (B, M, N, K) {gemms}"
