"""Depthwise convolutions on the runtime's direct kernel (codegen/lower/direct.py, runtime_c/aot_direct.c): window
sizes, strides, symmetric and asymmetric padding, each fused epilogue, batches, against onnxruntime on fresh inputs; the
plan (no im2col, no M = 1 microkernel call); bitwise the same results on 1 and 2 threads; and the shapes it leaves to
the microkernel still right."""

import numpy as np
import onnx
import pytest
from conftest import TARGETS, run_without_call
from onnx import TensorProto as TP
from onnx import helper as oh
from onnx import numpy_helper as nh

import aot

ort = pytest.importorskip("onnxruntime")
rng = np.random.default_rng(0)


class Graph:
  """A small ONNX graph under construction: seeded initializers, nodes, named outputs."""

  def __init__(self):
    self.inits, self.nodes, self.outputs, self.n = [], [], [], 0

  def name(self, base: str) -> str:
    self.n += 1
    return f"{base}{self.n}"

  def ints(self, value) -> str:
    self.inits.append(nh.from_array(np.asarray(value, np.int64), self.name("i")))
    return self.inits[-1].name

  def const(self, value) -> str:
    self.inits.append(nh.from_array(np.asarray(value, np.float32), self.name("c")))
    return self.inits[-1].name

  def node(self, op: str, *inputs: str, **attrs) -> str:
    out = self.name(op.lower())
    self.nodes.append(oh.make_node(op, list(inputs), [out], **attrs))
    return out

  def bn(self, x: str, c: int) -> str:
    pos = lambda: rng.uniform(0.5, 1.5, c)
    return self.node(
      "BatchNormalization",
      x,
      self.const(pos()),
      self.const(rng.normal(0, 0.1, c)),
      self.const(rng.normal(0, 0.1, c)),
      self.const(pos()),
    )

  def act(self, x: str, kind: str) -> str:
    if kind == "relu6":
      return self.node("Clip", x, self.const(0.0), self.const(6.0))
    if kind == "clip":
      return self.node("Clip", x, self.const(-1.0), self.const(1.0))
    if kind == "hardswish":
      return self.node("HardSwish", x)
    if kind == "silu":
      return self.node("Mul", x, self.node("Sigmoid", x))
    return x

  def depthwise(self, x: str, c: int, k: int, stride: int, pads, bias: bool = False, **attrs) -> str:
    w = self.const(rng.normal(0, 0.3, (c, 1, k, k)))
    ins = [x, w, self.const(rng.normal(0, 0.1, c))] if bias else [x, w]
    return self.node("Conv", *ins, group=c, strides=[stride, stride], pads=list(pads), kernel_shape=[k, k], **attrs)

  def output(self, x: str):
    self.outputs.append(x)

  def model(self, inputs: dict[str, tuple]) -> onnx.ModelProto:
    g = oh.make_graph(
      self.nodes,
      "g",
      [oh.make_tensor_value_info(n, TP.FLOAT, s) for n, s in inputs.items()],
      [oh.make_tensor_value_info(o, TP.FLOAT, None) for o in self.outputs],
      self.inits,
    )
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])
    m.ir_version = 8
    return m


X, X2 = (1, 16, 21, 70), (2, 8, 31, 33)
# (window, stride, pads [top, left, bottom, right], conv bias, epilogue): 70 columns make a full 64-wide segment and
# a partial vector at stride 1, 35 make single vectors and a partial one at stride 2
BRANCHES = [
  (3, 1, (1, 1, 1, 1), False, "relu6"),
  (5, 2, (2, 2, 2, 2), False, "hardswish"),
  (3, 2, (0, 0, 1, 1), True, "silu"),
  (5, 1, (0, 0, 0, 0), False, "clip"),
  (3, 1, (1, 2, 1, 0), True, "none"),
]


def direct_model() -> onnx.ModelProto:
  g = Graph()
  for k, s, pads, bias, act in BRANCHES:
    g.output(g.act(g.bn(g.depthwise("x", X[1], k, s, pads, bias), X[1]), act))
  # a batch of two images: the filter does not vary with the image, which the contraction counts as a row of the
  # runtime side (planes are then filter x image, and the result is not in the output's layout: no fused epilogue)
  g.output(g.act(g.depthwise("x2", X2[1], 3, 2, (1, 1, 1, 1), True), "relu6"))
  # two filters per channel: output channel o reads input channel o // 2 (each plane's start from a table)
  w = g.const(rng.normal(0, 0.3, (2 * X[1], 1, 3, 3)))
  g.output(g.node("Conv", "x", w, group=X[1], pads=[1, 1, 1, 1], kernel_shape=[3, 3]))
  # a channel shuffle (reshape, transpose, reshape) read by the depthwise convolution: planes in shuffled order
  c = X[1]
  shuffled = g.node(
    "Reshape",
    g.node("Transpose", g.node("Reshape", "x", g.ints([1, 4, c // 4, X[2], X[3]])), perm=[0, 2, 1, 3, 4]),
    g.ints([1, c, X[2], X[3]]),
  )
  g.output(g.act(g.bn(g.depthwise(shuffled, c, 3, 1, (1, 1, 1, 1)), c), "relu6"))
  return g.model({"x": X, "x2": X2})


def fallback_model() -> onnx.ModelProto:
  """A depthwise convolution the direct kernel does not take: dilated and strided (it takes dilation at stride 1)."""
  g = Graph()
  g.output(g.act(g.bn(g.depthwise("x", X[1], 3, 2, (2, 2, 2, 2), dilations=[2, 2]), X[1]), "relu6"))
  return g.model({"x": X})


def block_model(c: int = 16, expand: int = 4, hw: int = 96) -> onnx.ModelProto:
  """A MobileNetV2 block (1x1 expand, BN, ReLU6, 3x3 depthwise, BN, ReLU6, 1x1 project, residual): big enough
  (48 MFLOP) for the model to run on the pool."""
  g = Graph()
  e = c * expand
  h = g.act(g.bn(g.node("Conv", "x", g.const(rng.normal(0, 0.2, (e, c, 1, 1)))), e), "relu6")
  h = g.act(g.bn(g.depthwise(h, e, 3, 1, (1, 1, 1, 1)), e), "relu6")
  h = g.node("Conv", h, g.const(rng.normal(0, 0.2, (c, e, 1, 1))), g.const(rng.normal(0, 0.1, c)))
  g.output(g.node("Add", h, "x"))
  return g.model({"x": (1, c, hw, hw)})


def reference(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
  so = ort.SessionOptions()
  so.intra_op_num_threads = 1
  return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def close(out, ref):
  np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
  """(model, artifact) per (name, target), compiled once for the module."""
  base, made = tmp_path_factory.mktemp("direct"), {}

  def get(name: str, target: str):
    if (name, target) not in made:
      model = {"direct": direct_model, "fallback": fallback_model, "block": block_model}[name]()
      made[name, target] = model, aot.compile_model(model, out_dir=base / f"{name}_{target}", target=target)
    return made[name, target]

  return get


def model_c(art) -> str:
  return (art.dir / "src" / "model.c").read_text()


def run_on(art, x: np.ndarray, threads: int) -> np.ndarray:
  loaded = aot.load(art, threads=threads)
  try:
    return loaded(x)
  finally:
    loaded.close()


@pytest.mark.parametrize("target", TARGETS)
def test_depthwise_matches_onnxruntime(artifacts, target):
  model, art = artifacts("direct", target)
  loaded = aot.load(art)
  try:
    for seed in (1, 2):
      r = np.random.default_rng(seed)
      xs = [r.standard_normal(X, dtype=np.float32), r.standard_normal(X2, dtype=np.float32)]
      for out, ref in zip(loaded(*xs), reference(model, {"x": xs[0], "x2": xs[1]}), strict=True):
        close(out, ref)
  finally:
    loaded.close()


@pytest.mark.parametrize("target", TARGETS)
def test_depthwise_takes_the_direct_kernel(artifacts, target):
  src = model_c(artifacts("direct", target)[1])
  # one direct call per convolution, its epilogue run on each task's planes; no im2col copy, no microkernel call.
  # The two-filters-per-channel convolution (its channel split into (group, filter)) is a direct call too, with no
  # epilogue (it has none); it ran on the microkernel as 16 groups of M = 2 over an im2col copy before the direct
  # kernel took channel multipliers
  assert src.count("aot_depthwise d =") == len(BRANCHES) + 3
  # a batch norm, a bias and a clip are steps the kernel applies to each output before storing it (the three of
  # BRANCHES and the shuffled one); hardswish and silu are epilogue calls on each run of tasks' planes
  assert src.count(".steps = s, ") == 4
  assert src.count(", a}; aot_depthwise_run(&d, 0, d.tasks)") + 4 == len(BRANCHES) + 1
  assert "aot_gemm g =" not in src and "_dense0b(" not in src


@pytest.mark.parametrize("target", TARGETS)
def test_shapes_left_to_the_microkernel(artifacts, target):
  model, art = artifacts("fallback", target)
  assert "aot_depthwise d =" not in model_c(art)
  x = np.random.default_rng(3).standard_normal(X, dtype=np.float32)
  loaded = aot.load(art)
  try:
    close(loaded(x), reference(model, {"x": x})[0])
  finally:
    loaded.close()


@pytest.mark.parametrize("target", TARGETS)
def test_depthwise_bitwise_same_on_1_and_2_threads(artifacts, target):
  model, art = artifacts("block", target)
  # the direct kernel (and its fused epilogue) runs on the pool
  assert "aot_parallel(m->pool, aot_depthwise_run, &d, d.tasks)" in model_c(art)
  x = np.random.default_rng(4).standard_normal((1, 16, 96, 96), dtype=np.float32)
  outs = [run_on(art, x, threads) for threads in (1, 2)]
  np.testing.assert_array_equal(outs[0], outs[1])
  close(outs[0], reference(model, {"x": x})[0])


# (channels, height, width, window, stride, pads [top, left, bottom, right], epilogue): output rows of 2, 7, 10, 16,
# 24 and 33 columns (one partial vector, whole vectors, whole ones and a lane: the masked store of a row's last
# vector), strides 1 to 4, channel counts that leave a partial run of tasks (600 7x7 planes: runs of several tasks, an
# epilogue call per run), each at least find_contractions' MIN_WORK; rows of at most 8 at stride 1 are small planes
# (runtime_c/aot_direct.c small_plane: 3x3, 5x5 and 7x7 windows here, and the residual's steps)
SHAPES = [
  (576, 7, 7, 5, 1, (2, 2, 2, 2), "relu6"),
  (40, 8, 8, 7, 1, (3, 3, 3, 3), "clip"),
  (96, 7, 7, 3, 1, (1, 1, 1, 1), "relu6"),
  (83, 13, 13, 3, 2, (1, 1, 1, 1), "relu6"),
  (13, 17, 33, 3, 1, (0, 1, 0, 1), "hardswish"),
  (7, 40, 31, 5, 2, (2, 2, 2, 2), "none"),
  (5, 30, 70, 7, 3, (3, 3, 3, 3), "clip"),
  (64, 40, 40, 5, 4, (2, 2, 2, 2), "relu6"),
  (600, 9, 4, 3, 1, (0, 0, 0, 0), "relu6"),
]


def shapes_model() -> onnx.ModelProto:
  """One depthwise convolution (BN, activation) per entry of SHAPES, each on its own input."""
  g = Graph()
  for i, (c, _, _, k, s, pads, act) in enumerate(SHAPES):
    g.output(g.act(g.bn(g.depthwise(f"x{i}", c, k, s, pads), c), act))
  # a residual add: a step whose operand moves with the output (7-wide rows: its last vector's lanes read masked)
  g.output(g.node("Add", g.bn(g.depthwise("x0", SHAPES[0][0], 3, 1, (1, 1, 1, 1)), SHAPES[0][0]), "x0"))
  return g.model({f"x{i}": (1, c, h, w) for i, (c, h, w, *_) in enumerate(SHAPES)})


@pytest.mark.usefixtures("split_every_kernel")
def test_depthwise_shapes_bitwise_same_on_1_2_and_3_threads(tmp_path):
  """Partial vectors, strides, pads and task counts: onnxruntime's results, and the same bits on any thread count
  (threads take the tasks from a shared counter: who computes a plane must not change it). The c target alone: the
  runtime kernel is the same on llvm's."""
  model = shapes_model()
  art = aot.compile_model(model, out_dir=tmp_path)
  src = model_c(art)
  assert src.count("aot_depthwise d =") == len(SHAPES) + 1
  assert src.count("aot_parallel(m->pool, aot_depthwise_run, &d, d.tasks)") == len(SHAPES) + 1
  # batch norm, relu6, clip and the residual are steps the kernel applies; hardswish is an epilogue call
  assert src.count(".steps = s, ") == len(SHAPES)
  matches_on_threads(model, art, SHAPES, seed=7)


def matches_on_threads(model, art, shapes, seed: int, channels_last: bool = False) -> None:
  """The artifact on fresh inputs x0, x1, ... of shapes' (channels, height, width), or (height, width, channels):
  onnxruntime's results, and the same bits on 1, 2 and 3 threads."""
  r = np.random.default_rng(seed)
  xs = [r.standard_normal((1, h, w, c) if channels_last else (1, c, h, w), dtype=np.float32) for c, h, w, *_ in shapes]
  runs = []
  for threads in (1, 2, 3):
    loaded = aot.load(art, threads=threads)
    try:
      runs.append(loaded(*xs))
    finally:
      loaded.close()
  for i, ref in enumerate(reference(model, {f"x{i}": x for i, x in enumerate(xs)})):
    close(runs[0][i], ref)
    for other in runs[1:]:
      np.testing.assert_array_equal(other[i], runs[0][i])


# (channels, height, width, window, dilations, pads [top, left, bottom, right], epilogue) at stride 1: LRASPP's and
# DeepLab's atrous 16x16 maps, a 70-wide row (a whole segment and a partial vector), different dilations down and
# across with asymmetric pads, a dilation half the map; each at least find_contractions' MIN_WORK
DILATED = [
  (16, 16, 16, 3, (2, 2), (2, 2, 2, 2), "relu6"),
  (24, 21, 70, 5, (2, 2), (4, 4, 4, 4), "hardswish"),
  (17, 12, 19, 3, (2, 3), (1, 2, 3, 4), "none"),
  (24, 13, 13, 3, (3, 3), (3, 3, 3, 3), "clip"),
  (60, 8, 8, 3, (4, 4), (4, 4, 4, 4), "relu6"),
]


@pytest.mark.usefixtures("split_every_kernel")
def test_dilated_depthwise_on_the_direct_kernel(tmp_path):
  """Atrous depthwise convolutions run on the direct kernel (their taps' offsets dilated; small planes and lanes
  decline them), not as a GEMM of M = 1 per channel over a 9x or 25x window copy (LRASPP 12.1 -> 7.7 ms): onnxruntime's
  results, the same bits on 1, 2 and 3 threads."""
  g = Graph()
  for i, (c, _, _, k, dil, pads, act) in enumerate(DILATED):
    w = g.const(rng.normal(0, 0.3, (c, 1, k, k)))
    conv = g.node("Conv", f"x{i}", w, group=c, pads=list(pads), kernel_shape=[k, k], dilations=list(dil))
    g.output(g.act(g.bn(conv, c), act))
  model = g.model({f"x{i}": (1, c, h, w) for i, (c, h, w, *_) in enumerate(DILATED)})
  art = aot.compile_model(model, out_dir=tmp_path)
  src = model_c(art)
  assert src.count("aot_depthwise d =") == len(DILATED) and "aot_gemm g =" not in src
  assert src.count(".DH = ") == len(DILATED)
  matches_on_threads(model, art, DILATED, seed=8)


def test_a_window_read_without_its_row_range_is_no_dilated_window():
  # terms of a load at 16 * oh + ow + 2 * kw: the window's other range does not move the read, so it is no dilated
  # window (taken as one, its DH of 0 would be read as 1 by the kernel, rows apart); with 32 * kh it is one, DH 2
  from aot.codegen.lower.direct import _geometry
  from aot.core.dtype import dtypes
  from aot.core.ir import Ops, UOp

  r = [UOp(Ops.RANGE, dtypes.index, (), (i, 8 if i < 2 else 3, "loop" if i < 2 else "reduce")) for i in range(4)]
  o_h, o_w, kh, kw = r
  assert _geometry({o_h: 16, o_w: 1, kw: 2}, (kh, kw), o_h, o_w) is None
  assert _geometry({o_h: 16, o_w: 1, kh: 32, kw: 2}, (kh, kw), o_h, o_w) == (kh, kw, 16, 1, 1, 1, 2, 2)


# (multiplier, window, stride, pads [top, left, bottom, right], conv bias, epilogue) on odd sizes: partial vectors,
# asymmetric padding, a band's edge rows; each big enough for a contraction (find_contractions' MIN_WORK)
MULTIPLIERS = [
  (2, 3, 1, (1, 1, 1, 1), False, "relu6"),
  (3, 5, 2, (2, 1, 2, 1), True, "hardswish"),
  (2, 3, 2, (0, 0, 1, 1), False, "none"),
  (4, 5, 1, (2, 2, 2, 2), True, "silu"),
]
XM, XM2 = (1, 9, 27, 37), (2, 6, 29, 23)


def multiplier_model() -> onnx.ModelProto:
  """Depthwise convolutions with a channel multiplier: m filters per input channel, output channel o reading input
  channel o // m."""
  g = Graph()
  for m, k, s, pads, bias, act in MULTIPLIERS:
    c = XM[1]
    w = g.const(rng.normal(0, 0.3, (m * c, 1, k, k)))
    ins = ["x", w, g.const(rng.normal(0, 0.1, m * c))] if bias else ["x", w]
    conv = g.node("Conv", *ins, group=c, strides=[s, s], pads=list(pads), kernel_shape=[k, k])
    g.output(g.act(g.bn(conv, m * c), act))
  # a batch of two images: planes are (channel, filter, image), not the output's layout, so no fused epilogue
  w = g.const(rng.normal(0, 0.3, (2 * XM2[1], 1, 3, 3)))
  conv = g.node("Conv", "x2", w, group=XM2[1], strides=[2, 2], pads=[1, 1, 1, 1], kernel_shape=[3, 3])
  g.output(g.act(conv, "relu6"))
  return g.model({"x": XM, "x2": XM2})


def multiplier_block_model(c: int = 16, hw: int = 96) -> onnx.ModelProto:
  """A 1x1 expand, a depthwise convolution with two filters per channel, BN, ReLU6, a 1x1 project: 78 MFLOP, enough
  for the model to run on the pool."""
  g = Graph()
  e = 4 * c
  h = g.act(g.bn(g.node("Conv", "x", g.const(rng.normal(0, 0.2, (e, c, 1, 1)))), e), "relu6")
  h = g.node("Conv", h, g.const(rng.normal(0, 0.3, (2 * e, 1, 3, 3))), group=e, pads=[1, 1, 1, 1], kernel_shape=[3, 3])
  h = g.act(g.bn(h, 2 * e), "relu6")
  g.output(g.node("Conv", h, g.const(rng.normal(0, 0.2, (c, 2 * e, 1, 1)))))
  return g.model({"x": (1, c, hw, hw)})


@pytest.mark.parametrize("target", TARGETS)
def test_channel_multiplier_on_the_direct_kernel(tmp_path, target):
  model = multiplier_model()
  art = aot.compile_model(model, out_dir=tmp_path / target, target=target)
  src = model_c(art)
  # one direct call each, no im2col and no microkernel call; the single-image ones run their epilogue per task
  assert src.count("aot_depthwise d =") == len(MULTIPLIERS) + 1 and "aot_gemm g =" not in src
  assert src.count(", a}; aot_depthwise_run(&d, 0, d.tasks)") == len(MULTIPLIERS)
  loaded = aot.load(art)
  try:
    for seed in (1, 2):
      r = np.random.default_rng(seed)
      xs = [r.standard_normal(XM, dtype=np.float32), r.standard_normal(XM2, dtype=np.float32)]
      for out, ref in zip(loaded(*xs), reference(model, {"x": xs[0], "x2": xs[1]}), strict=True):
        close(out, ref)
  finally:
    loaded.close()


def test_channel_multiplier_bitwise_same_on_1_and_2_threads(tmp_path):
  model = multiplier_block_model()
  art = aot.compile_model(model, out_dir=tmp_path)
  assert "aot_parallel(m->pool, aot_depthwise_run, &d, d.tasks)" in model_c(art)
  x = np.random.default_rng(6).standard_normal((1, 16, 96, 96), dtype=np.float32)
  outs = [run_on(art, x, threads) for threads in (1, 2)]
  np.testing.assert_array_equal(outs[0], outs[1])
  close(outs[0], reference(model, {"x": x})[0])


def fc_model(k: int = 1023, n: int = 1000) -> onnx.ModelProto:
  """A batch-1 fully connected layer (the GEMV: M = 1), sizes that fill no whole tile and no whole k split."""
  g = Graph()
  w = g.const(rng.normal(0, 1 / np.sqrt(k), (n, k)))
  g.output(g.node("Relu", g.node("Gemm", "x", w, g.const(rng.normal(0, 0.1, n)), transB=1)))
  return g.model({"x": (1, k)})


@pytest.mark.parametrize("target", TARGETS)
def test_gemv_matches_onnxruntime(tmp_path, target):
  model = fc_model()
  art = aot.compile_model(model, out_dir=tmp_path / target, target=target)
  # one microkernel call with M = 1: aot_gemm_run's GEMV path
  assert model_c(art).count("aot_gemm g = {1, 1, 1000, 1023,") == 1
  x = np.random.default_rng(5).standard_normal((1, 1023), dtype=np.float32)
  outs = [run_on(art, x, threads) for threads in (1, 2)]
  np.testing.assert_array_equal(outs[0], outs[1])
  close(outs[0], reference(model, {"x": x})[0])


@pytest.mark.parametrize("target", TARGETS)
def test_exp_as_arithmetic_matches_numpy(tmp_path, target):
  """float32 exp is computed from multiplies, adds and exponent arithmetic (codegen/render/opt.py: it vectorises, libm's
  expf does not): within 2 ulp over the whole range, right at the denormals, overflow, infinities and NaN."""
  exact = [np.nan, np.inf, -np.inf, 0.0, -0.0, 88.73, -104.0, -150.0]
  x = np.concatenate([np.linspace(-110, 95, 100001), [88.72, -87.5, -103.9], exact]).astype(np.float32)
  y = run_without_call(lambda a: a.exp(), x, tmp_path / target, target, "expf")
  ref = np.exp(x.astype(np.float64))
  normal = (ref > np.finfo(np.float32).tiny) & (ref < np.finfo(np.float32).max)
  assert (np.abs(y[normal] - ref[normal]) / ref[normal]).max() < 2 * 2.0**-24
  tiny = ref <= np.finfo(np.float32).tiny
  assert np.abs(y[tiny] - ref[tiny]).max() <= np.finfo(np.float32).smallest_subnormal
  with np.errstate(over="ignore"):
    np.testing.assert_array_equal(y[-len(exact) :], np.exp(x[-len(exact) :]))


# (channels, height, width, window, stride, dilation, pads [top, left, bottom, right], epilogue) of inputs read
# channels-last: ConvNeXt's 7x7 over 14x14, a strided 3x3 on odd sizes, a dilated 3x3
CHANNELS_LAST = [
  (96, 14, 14, 7, 1, 1, (3, 3, 3, 3), "none"),
  (32, 33, 41, 3, 2, 1, (1, 1, 1, 1), "relu6"),
  (16, 16, 16, 3, 1, 2, (2, 2, 2, 2), "clip"),
]


@pytest.mark.usefixtures("split_every_kernel")
def test_a_channels_last_input_is_read_by_the_direct_kernel(tmp_path):
  """A depthwise convolution of a [H][W][C] tensor transposed (ConvNeXt's, after its layer norm) runs on the direct
  kernel, each plane's columns C apart, where it was a GEMM of M = 1 per channel over a copy of its 49-tap windows
  (ConvNeXt-T 63.5 -> 54.0 ms): onnxruntime's results, the same bits on 1, 2 and 3 threads."""
  g = Graph()
  for i, (c, _, _, k, s, d, pads, act) in enumerate(CHANNELS_LAST):
    x = g.node("Transpose", f"x{i}", perm=[0, 3, 1, 2])
    w = g.const(rng.normal(0, 0.3, (c, 1, k, k)))
    conv = g.node("Conv", x, w, group=c, strides=[s, s], pads=list(pads), kernel_shape=[k, k], dilations=[d, d])
    g.output(g.act(g.bn(conv, c), act))
  model = g.model({f"x{i}": (1, h, w, c) for i, (c, h, w, *_) in enumerate(CHANNELS_LAST)})
  art = aot.compile_model(model, out_dir=tmp_path)
  src = model_c(art)
  assert "aot_gemm g =" not in src and all(f".x_col = {c}" in src for c, *_ in CHANNELS_LAST)
  matches_on_threads(model, art, CHANNELS_LAST, seed=9, channels_last=True)
