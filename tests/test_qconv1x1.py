"""8-bit 1x1 stride-1 convolutions read their input where it lies: an NCHW plane x[c][h*w] is the int8 contraction's
k-major A ([K][M], lda = H*W), so no copy kernel writes A (codegen/lower/quant.py _in_place), a batch's images one
contraction each. QLinearConv and QDQ convolutions over uint8 and int8, batch 1 and 2, from a graph input and from a
previous int8 convolution's output, against onnxruntime byte for byte."""

import re
import tempfile

import numpy as np
import onnx
import pytest
from conftest import ort_session, outputs_on_threads, run_body
from onnx import TensorProto as TP
from onnx import helper as oh
from onnx import numpy_helper

import aot

# (batch, channels, H, W) of each chain's input: two 1x1 convolutions, the second reading the first's int8 output
CHAINS = [(1, 8, 5, 6), (2, 8, 7, 9)]
WIDTHS = (12, 6)  # output channels of each chain's two convolutions


def _conv(form: str, i: int, j: int, x: str, x_scale, x_zero, C: int, N: int, dt, nodes: list, inits: dict):
  """Conv j of chain i on the 8-bit tensor x (its scale and zero point): its 8-bit output's name, scale and zero."""
  r = np.random.default_rng(10 * i + j)
  p = f"c{i}{j}"
  y_scale, y_zero = np.float32(0.004 * np.sqrt(C)), dt(126 if dt == np.uint8 else 3)
  consts = {
    f"{p}xs": x_scale,
    f"{p}xz": x_zero,
    f"{p}w": r.integers(-127, 128, (N, C, 1, 1)).astype(np.int8),
    f"{p}ws": r.uniform(0.002, 0.006, N).astype(np.float32),
    f"{p}wz": np.zeros(N, np.int8),
    f"{p}ys": y_scale,
    f"{p}yz": y_zero,
  }
  inits.update(consts)
  if form == "qlinear":
    nodes.append(oh.make_node("QLinearConv", [x, *consts], [f"{p}y"]))
  else:
    nodes += [
      oh.make_node("DequantizeLinear", [x, f"{p}xs", f"{p}xz"], [f"{p}xf"]),
      oh.make_node("DequantizeLinear", [f"{p}w", f"{p}ws", f"{p}wz"], [f"{p}wf"], axis=0),
      oh.make_node("Conv", [f"{p}xf", f"{p}wf"], [f"{p}cf"]),
      oh.make_node("QuantizeLinear", [f"{p}cf", f"{p}ys", f"{p}yz"], [f"{p}y"]),
    ]
  return f"{p}y", y_scale, y_zero


def _model(form: str, dt) -> onnx.ModelProto:
  elem = TP.UINT8 if dt == np.uint8 else TP.INT8
  inputs, outputs, nodes, inits = [], [], [], {}
  for i, (B, C, H, W) in enumerate(CHAINS):
    inputs.append(oh.make_tensor_value_info(f"x{i}", elem, [B, C, H, W]))
    x, scale, zero = f"x{i}", np.float32(0.03), dt(118 if dt == np.uint8 else -5)
    for j, N in enumerate(WIDTHS):
      x, scale, zero = _conv(form, i, j, x, scale, zero, C, N, dt, nodes, inits)
      C = N
    outputs.append(oh.make_tensor_value_info(x, elem, [B, C, H, W]))
  g = oh.make_graph(
    nodes, "g", inputs, outputs, initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()]
  )
  m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])
  m.ir_version = 9
  onnx.checker.check_model(m)
  return m


def _qgemm_calls(source: str) -> list[list[str]]:
  """Each aot_qgemm descriptor's fields in model.c, in call order (M, N, K, a, lda, ... c, ldc_m, ldc_n, next,
  a_kmajor, a_zero_at, plane)."""
  return [d.split(", ") for d in re.findall(r"aot_qgemm g = \{(.*?)\};", source)]


def _arena(field: str) -> str:
  """The arena buffer a descriptor's pointer field names."""
  return re.search(r"\(A \+ \d+\)", field).group()


@pytest.mark.parametrize("form", ["qlinear", "qdq"])
@pytest.mark.parametrize("dt", [np.uint8, np.int8], ids=["u8", "s8"])
def test_1x1_convs_read_their_input_in_place_and_equal_onnxruntime(form, dt):
  m = _model(form, dt)
  r = np.random.default_rng(3)
  info = np.iinfo(dt)
  feeds = {f"x{i}": r.integers(info.min, info.max + 1, shape).astype(dt) for i, shape in enumerate(CHAINS)}
  want = ort_session(m).run(None, feeds)
  with tempfile.TemporaryDirectory(prefix="aot_qconv1x1_") as d:
    art = aot.compile_model(m, out_dir=d)
    source = (art.dir / "src" / "model.c").read_text()
    for got in outputs_on_threads(art, feeds):
      for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
  every = np.concatenate([w.reshape(-1) for w in want])
  assert 0.01 < np.mean(every == info.min) and 0.01 < np.mean(every == info.max)
  assert np.mean((every == info.min) | (every == info.max)) < 0.5
  # no operand written by a kernel of its own (a generated copy, the runtime's im2col) for any contraction: the only
  # generated kernels are those storing each graph input as the bytes the first convolution reads
  run = run_body(source).split("aot_pool_rest", 1)[0]
  generated = [c for c in run.splitlines() if c.strip().startswith(("g_f", "{ void *a[]"))]
  assert len(generated) == len(CHAINS) and all(re.search(r"\(const u?int8_t \*\)x\d\b", c) for c in generated)
  assert "aot_qim2col" not in source
  # one contraction per image, each k-major over its image's planes (lda H*W), signed as the activations are
  calls = _qgemm_calls(source)
  images = [(B, C_in, H * W) for B, C, H, W in CHAINS for C_in in (C, WIDTHS[0])]
  assert len(calls) == sum(B for B, _, _ in images)
  at = 0
  for B, K, plane in images:
    for image in range(B):
      q = calls[at]
      at += 1
      assert (q[0], q[2], q[4], q[5], q[18]) == (str(plane), str(K), str(plane), str(int(dt == np.int8)), "1")
      # the image's own plane of A and C: offsets of whole images, the first image at none
      a_offset = int(q[3].rsplit(" + ", 1)[1])
      assert a_offset == image * K * plane
      c_offset = f" + {image * int(q[1]) * plane})" if image else ""
      assert q[14].startswith("(void *)((") == (image > 0) and q[14].endswith(c_offset)
  # the second convolution of each chain reads the first's result where the first wrote it
  for first, second in ((0, 1), (2, 4)):
    assert _arena(calls[first][14]) == _arena(calls[second][3])
  # and the first reads the bytes the graph input's kernel wrote
  for i, first in enumerate((0, 2)):
    assert _arena(generated[i]) == _arena(calls[first][3])


# one power-of-two scale for the residual add's operands and result: the add is then exact both in onnxruntime's
# QLinearAdd (which its optimizer fuses the QDQ add into) and as the dequantized floats' sum, so the bytes agree
POW2_SCALE = 2.0**-5


def test_a_batch_of_1x1_convs_under_a_residual_add_reads_its_input_in_place():
  """QDQ's conv -> QuantizeLinear -> DequantizeLinear -> Add(the input) -> QuantizeLinear over 2 images: the kernel's
  epilogue (the add) reads each image's contraction result from a scratch at its own offset."""
  B, C, H, W = 2, 8, 7, 9
  r = np.random.default_rng(5)
  consts = {
    "xs": np.float32(POW2_SCALE),
    "xz": np.uint8(118),
    "w": r.integers(-127, 128, (C, C, 1, 1)).astype(np.int8),
    "ws": r.uniform(0.0005, 0.0015, C).astype(np.float32),
    "wz": np.zeros(C, np.int8),
    "ys": np.float32(POW2_SCALE),
    "yz": np.uint8(126),
    "zs": np.float32(POW2_SCALE),
    "zz": np.uint8(120),
  }
  nodes = [
    oh.make_node("DequantizeLinear", ["x", "xs", "xz"], ["xf"]),
    oh.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wf"], axis=0),
    oh.make_node("Conv", ["xf", "wf"], ["cf"]),
    oh.make_node("QuantizeLinear", ["cf", "ys", "yz"], ["cq"]),
    oh.make_node("DequantizeLinear", ["cq", "ys", "yz"], ["cd"]),
    oh.make_node("Add", ["cd", "xf"], ["sf"]),
    oh.make_node("QuantizeLinear", ["sf", "zs", "zz"], ["y"]),
  ]
  vi = lambda n: oh.make_tensor_value_info(n, TP.UINT8, [B, C, H, W])
  inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()]
  m = oh.make_model(
    oh.make_graph(nodes, "g", [vi("x")], [vi("y")], initializer=inits), opset_imports=[oh.make_opsetid("", 17)]
  )
  m.ir_version = 9
  x = r.integers(0, 256, (B, C, H, W)).astype(np.uint8)
  want = ort_session(m).run(None, {"x": x})[0]
  assert 0.01 < np.mean(want == 255) and 0.01 < np.mean(want == 0) and np.mean((want == 0) | (want == 255)) < 0.5
  with tempfile.TemporaryDirectory(prefix="aot_qconv1x1_") as d:
    art = aot.compile_model(m, out_dir=d)
    source = (art.dir / "src" / "model.c").read_text()
    model = aot.load(art, threads=2)
    try:
      np.testing.assert_array_equal(model(x), want)
    finally:
      model.close()
  calls = _qgemm_calls(source)
  # each image k-major where it lies in the input's bytes, its result at its own offset of one scratch
  assert [(q[0], q[3].rsplit(" + ", 1)[1], q[4], q[18]) for q in calls] == [
    ("63", "0", "63", "1"),
    ("63", "504", "63", "1"),
  ]
  assert calls[1][14].endswith(f" + {C * H * W})") and _arena(calls[0][14]) == _arena(calls[1][14])


def test_a_1x1_conv_wider_than_the_in_place_limit_copies_its_input_row_major():
  """Past MAX_KMAJOR_IN_PLACE_N output channels the microkernel would pack a strided A once per 128 of them: A is a
  row-major copy instead, and the result the same bytes as onnxruntime's."""
  from aot.codegen.lower.quant import MAX_KMAJOR_IN_PLACE_N

  B, C, H, W, N = 1, 8, 3, 5, MAX_KMAJOR_IN_PLACE_N + 32
  nodes, inits = [], {}
  y, _, _ = _conv("qlinear", 0, 0, "x", np.float32(0.03), np.uint8(118), C, N, np.uint8, nodes, inits)
  vi = lambda n, c: oh.make_tensor_value_info(n, TP.UINT8, [B, c, H, W])
  g = oh.make_graph(
    nodes,
    "g",
    [vi("x", C)],
    [vi(y, N)],
    initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()],
  )
  m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])
  m.ir_version = 9
  x = np.random.default_rng(9).integers(0, 256, (B, C, H, W)).astype(np.uint8)
  want = ort_session(m).run(None, {"x": x})[0]
  with tempfile.TemporaryDirectory(prefix="aot_qconv1x1_") as d:
    art = aot.compile_model(m, out_dir=d)
    source = (art.dir / "src" / "model.c").read_text()
    model = aot.load(art)
    try:
      np.testing.assert_array_equal(model(x), want)
    finally:
      model.close()
  ((M, n, K, _, lda, *_, kmajor, _, _),) = _qgemm_calls(source)
  assert (M, n, K, lda, kmajor) == (str(H * W), str(N), str(C), str(C), "0")
