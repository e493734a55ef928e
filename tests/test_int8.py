"""The int8 microkernel (runtime_c/aot_qgemm.c) against an independent numpy int32 computation, bit for bit."""

import ctypes
import subprocess
from pathlib import Path

import numpy as np
import pytest

from aot.build import cc, cflags
from aot.codegen.lower.quant import pack_weights, requantize

RUNTIME = Path(__file__).resolve().parent.parent / "runtime_c"

# a small C driver: the kernel on a pool of `threads` threads
DRIVER = r"""
#include "aot_runtime.h"
__attribute__((visibility("default"))) void qgemm(aot_qgemm *g, int threads) {
  aot_pool *p = aot_pool_create(threads);
  g->slices = threads;
  aot_parallel(p, aot_qgemm_run, g, aot_qgemm_tasks(g));
  aot_pool_destroy(p);
}
"""


class QGemm(ctypes.Structure):
  _fields_ = [
    ("M", ctypes.c_int),
    ("N", ctypes.c_int),
    ("K", ctypes.c_int),
    ("a", ctypes.c_void_p),
    ("lda", ctypes.c_long),
    ("a_signed", ctypes.c_int),
    ("a_zero", ctypes.c_int),
    ("b", ctypes.c_void_p),
    ("col_sum", ctypes.c_void_p),
    ("bias", ctypes.c_void_p),
    ("scale", ctypes.c_void_p),
    ("scale_step", ctypes.c_int),
    ("out_type", ctypes.c_int),
    ("out_zero", ctypes.c_int),
    ("c", ctypes.c_void_p),
    ("ldc_m", ctypes.c_long),
    ("ldc_n", ctypes.c_long),
    ("next", ctypes.c_int),
    ("a_kmajor", ctypes.c_int),
    ("a_zero_at", ctypes.c_void_p),
    ("plane", ctypes.c_void_p),
    ("slices", ctypes.c_int),
    ("taken", ctypes.c_ulonglong * 16),  # AOT_QGEMM_SLICES
  ]


def build_qgemm(d: Path, cpu: str, compiler: str | None = None, driver: str = DRIVER) -> ctypes.CDLL:
  """driver and the runtime's int8 microkernel as a shared library in folder d, by compiler (default the one aot
  picks) for cpu."""
  compiler = compiler or cc()
  (d / "driver.c").write_text(driver)
  so = d / "libq.so"
  sources = [str(d / "driver.c"), str(RUNTIME / "aot_qgemm.c"), str(RUNTIME / "aot_runtime.c")]
  with pytest.MonkeyPatch.context() as m:
    # cflags asks $CC which compiler's flags to give
    m.setenv("CC", compiler)
    flags = cflags(cpu)
  subprocess.run([compiler, *flags, "-shared", f"-I{RUNTIME}", *sources, "-o", str(so), "-lpthread", "-lm"], check=True)
  return ctypes.CDLL(str(so))


@pytest.fixture(scope="module", params=["native", "x86-64-v3"])
def lib(request, tmp_path_factory):
  """Built for this CPU (AVX-512 VNNI where it has it) and for AVX2 (the portable path)."""
  return build_qgemm(tmp_path_factory.mktemp(f"qgemm_{request.param}"), request.param)


def run(lib, a, w, a_zero, bias=None, scale=None, out_zero=0, out_dtype=np.int32, threads=1, zero_at=False):
  M, K = a.shape
  N = w.shape[1]
  packed, col_sum = pack_weights(w)
  out = np.zeros((M, N), out_dtype)
  keep = [np.ascontiguousarray(a), packed, col_sum]
  scale = None if scale is None else np.ascontiguousarray(np.atleast_1d(scale), np.float32)
  ptr = lambda x: None if x is None else x.ctypes.data
  # a zero point computed at run time is read from memory; a_zero is then not used
  at = np.array([a_zero], np.int32) if zero_at else None
  g = QGemm(
    M,
    N,
    K,
    ptr(keep[0]),
    K,
    int(a.dtype == np.int8),
    a_zero,
    ptr(packed),
    ptr(col_sum),
    ptr(bias),
    ptr(scale),
    0 if scale is None or scale.size == 1 else 1,
    {np.int32: 0, np.uint8: 1, np.int8: 2}[out_dtype],
    out_zero,
    ptr(out),
    N,
    1,
    0,
    0,
    ptr(at),
  )
  if zero_at:
    g.a_zero = -12345
  lib.qgemm(ctypes.byref(g), threads)
  return out


def reference(a, w, a_zero, bias=None):
  acc = (a.astype(np.int64) - a_zero) @ w.astype(np.int64)
  return (acc + (0 if bias is None else bias)).astype(np.int32)


@pytest.mark.parametrize("M,N,K", [(1, 1, 1), (7, 33, 5), (65, 129, 515), (9, 31, 1030)])
@pytest.mark.parametrize("a_dtype", [np.uint8, np.int8])
def test_int32_products(lib, M, N, K, a_dtype):
  rng = np.random.default_rng(M * N + K)
  info = np.iinfo(a_dtype)
  a = rng.integers(info.min, info.max + 1, (M, K)).astype(a_dtype)
  # the extremes too: -128 * 255 summed is where a u8 x s8 pairwise int16 add saturates
  a[0, :] = info.max
  w = rng.integers(-128, 128, (K, N)).astype(np.int8)
  w[:, 0] = -128
  zero = int(rng.integers(info.min, info.max + 1))
  bias = rng.integers(-1000, 1000, N).astype(np.int32)
  want = reference(a, w, zero, bias)
  for threads in (1, 2, 3):
    np.testing.assert_array_equal(run(lib, a, w, zero, bias, threads=threads), want)
    np.testing.assert_array_equal(run(lib, a, w, zero, bias, threads=threads, zero_at=True), want)


@pytest.mark.parametrize("out_dtype,out_zero", [(np.uint8, 131), (np.int8, -5)])
@pytest.mark.parametrize("per_channel", [False, True])
def test_requantized(lib, out_dtype, out_zero, per_channel):
  rng = np.random.default_rng(3)
  M, N, K = 37, 45, 77
  a = rng.integers(0, 256, (M, K)).astype(np.uint8)
  w = rng.integers(-128, 128, (K, N)).astype(np.int8)
  scale = (rng.uniform(5e-4, 4e-3, N) if per_channel else rng.uniform(5e-4, 4e-3, 1)).astype(np.float32)
  # values exactly halfway between integers must round to even: scale 0.5 on a few columns of small sums
  if per_channel:
    scale[:3] = 0.5
    w[:, :3] = 0
    w[:4, :3] = rng.integers(-1, 2, (4, 3))
  acc = reference(a, w, 120)
  if per_channel:
    assert np.sum(acc[:, :3] % 2 == 1) > 10
  want = requantize(acc, scale, out_zero, out_dtype)
  assert 0 < np.mean((want == np.iinfo(out_dtype).min) | (want == np.iinfo(out_dtype).max)) < 0.9
  for threads in (1, 3):
    np.testing.assert_array_equal(
      run(lib, a, w, 120, scale=scale, out_zero=out_zero, out_dtype=out_dtype, threads=threads), want
    )


# *** QDQ models, made with onnxruntime's quantizer, against onnxruntime's int8 run ***


def _qdq_model(kind: str, per_channel: bool, activations: str, tmp):
  """A float conv (+ Relu) or matmul quantized by onnxruntime.quantization.quantize_static from seeded calibration
  data, with its first QuantizeLinear and last DequantizeLinear dropped: 8-bit in, 8-bit out."""
  import onnx
  from onnx import TensorProto, helper, numpy_helper
  from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

  rng = np.random.default_rng(11)
  if kind in ("conv", "wide conv", "big conv", "stem conv"):
    # a wide one spans several of the microkernel's 64-row blocks, its result lines written through the epilogue's
    # transpose (m contiguous) block by block; a big one is ResNet's 3x3 at 56x56, work enough to split over threads;
    # a stem one ResNet's first 7x7/2 over 3 channels, rows long enough for the im2col's stride-2 vectors
    shape, out_shape, stride, kernel = {
      "conv": ([1, 64, 10, 9], [1, 20, 5, 5], 2, 3),
      "wide conv": ([1, 16, 21, 18], [1, 20, 21, 18], 1, 3),
      "big conv": ([1, 64, 56, 56], [1, 20, 56, 56], 1, 3),
      "stem conv": ([1, 3, 21, 71], [1, 20, 11, 36], 2, 7),
    }[kind]
    w = numpy_helper.from_array((rng.standard_normal((20, shape[1], kernel, kernel)) * 0.2).astype(np.float32), "w")
    b = numpy_helper.from_array((rng.standard_normal(20) * 0.1).astype(np.float32), "b")
    pads = [kernel // 2] * 4
    nodes = [
      helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=pads, strides=[stride, stride]),
      helper.make_node("Relu", ["c"], ["y"]),
    ]
    inits = [w, b]
  else:
    # a vector by a matrix has no m rows (a batch-1 fully connected layer): one row of the microkernel
    shape, out_shape = ([7, 600], [7, 45]) if kind == "matmul" else ([600], [45])
    w = numpy_helper.from_array((rng.standard_normal((600, 45)) * 0.2).astype(np.float32), "w")
    nodes, inits = [helper.make_node("MatMul", ["x", "w"], ["y"])], [w]
  g = helper.make_graph(
    nodes,
    "g",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
    inits,
  )
  onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp / "f.onnx")

  class Data(CalibrationDataReader):
    def __init__(self):
      self.it = iter([{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(4)])

    def get_next(self):
      return next(self.it, None)

  act = QuantType.QUInt8 if activations == "u8" else QuantType.QInt8
  quantize_static(
    str(tmp / "f.onnx"),
    str(tmp / "q.onnx"),
    Data(),
    quant_format=QuantFormat.QDQ,
    per_channel=per_channel,
    weight_type=QuantType.QInt8,
    activation_type=act,
  )
  m = onnx.load(tmp / "q.onnx")
  q = next(n for n in m.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "x")
  dq = next(n for n in m.graph.node if n.op_type == "DequantizeLinear" and n.output[0] == "y")
  m.graph.node.remove(q)
  m.graph.node.remove(dq)
  dt = TensorProto.UINT8 if activations == "u8" else TensorProto.INT8
  del m.graph.input[:], m.graph.output[:]
  m.graph.input.append(helper.make_tensor_value_info(q.output[0], dt, shape))
  m.graph.output.append(helper.make_tensor_value_info(dq.input[0], dt, out_shape))
  return m


@pytest.mark.parametrize(
  "kind,per_channel,activations",
  [
    ("conv", True, "u8"),
    ("conv", False, "u8"),
    ("matmul", True, "u8"),
    ("matmul", False, "u8"),
    ("conv", True, "s8"),
    ("wide conv", True, "u8"),
    ("wide conv", False, "s8"),
    ("vector matmul", True, "u8"),
    ("stem conv", True, "u8"),
    ("stem conv", False, "s8"),
  ],
)
def test_qdq_equals_onnxruntime(kind, per_channel, activations, tmp_path):
  import onnxruntime as ort

  import aot

  model = _qdq_model(kind, per_channel, activations, tmp_path)
  art = aot.compile_model(model, out_dir=tmp_path / "art")
  # the plan takes the int8 path: the contraction is a call of the int8 microkernel, a convolution's input copied by
  # the runtime's im2col
  calls = (art.dir / "src" / "model.c").read_text()
  assert "aot_qgemm_run" in calls
  assert ("aot_qim2col_run" in calls) == ("conv" in kind)
  opts = ort.SessionOptions()
  opts.intra_op_num_threads = 1
  sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
  name, shape = sess.get_inputs()[0].name, sess.get_inputs()[0].shape
  dt = np.uint8 if activations == "u8" else np.int8
  # fresh inputs, not the calibration data: the full 8-bit range, so results saturate at both ends
  x = np.random.default_rng(21).integers(np.iinfo(dt).min, np.iinfo(dt).max + 1, shape).astype(dt)
  want = sess.run(None, {name: x})[0]
  for threads in (1, 2, 3):
    got = aot.load(art, threads=threads)(x)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_a_quantized_model_splits_its_int8_work_across_threads(tmp_path):
  """A model whose work is int32 sums (no float arithmetic to speak of) still runs its big calls on the pool: the
  thread decision counted only float operations, so every int8 model ran on one thread (QDQ ResNet-18: 2 threads
  1.06x as fast as 1)."""
  import onnxruntime as ort

  import aot
  from aot.tools.profile import load_calls

  model = _qdq_model("big conv", True, "u8", tmp_path)
  art = aot.compile_model(model, out_dir=tmp_path / "art", profile=True)
  calls = load_calls(art)
  big = [c for c in calls if c.path == "int8 microkernel"]
  assert big and all(c.parallel and c.tasks > 1 for c in big), [(c.function, c.tasks, c.parallel) for c in calls]
  opts = ort.SessionOptions()
  opts.intra_op_num_threads = 1
  sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
  x = np.random.default_rng(3).integers(0, 256, (1, 64, 56, 56)).astype(np.uint8)
  want = sess.run(None, {sess.get_inputs()[0].name: x})[0]
  for threads in (1, 2, 3):
    np.testing.assert_array_equal(aot.load(art, threads=threads)(x), want)


def test_qoperator_conv_then_global_average_pool_runs_on_the_int8_microkernel(tmp_path):
  # QLinearConv -> QLinearGlobalAveragePool fuses into one kernel whose pool sums the conv's requantized result (and
  # requantizes again): the conv inside still goes to the microkernel, the pool stays in its epilogue
  import onnxruntime as ort
  from onnx import TensorProto, helper, numpy_helper

  import aot
  from aot.models.quantized import quantized

  rng = np.random.default_rng(5)
  w = numpy_helper.from_array((rng.standard_normal((24, 16, 3, 3)) * 0.2).astype(np.float32), "w")
  b = numpy_helper.from_array((rng.standard_normal(24) * 0.1).astype(np.float32), "b")
  g = helper.make_graph(
    [
      helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
      helper.make_node("GlobalAveragePool", ["c"], ["y"]),
    ],
    "g",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 7, 7])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 24, 1, 1])],
    [w, b],
  )
  q = quantized(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), "qoperator")
  assert {"QLinearConv", "QLinearGlobalAveragePool"} <= {n.op_type for n in q.graph.node}
  art = aot.compile_model(q, out_dir=tmp_path / "art")
  assert (art.dir / "src" / "model.c").read_text().count("aot_qgemm_run(&g") == 1
  x = rng.standard_normal((1, 16, 7, 7)).astype(np.float32) * 2
  opts = ort.SessionOptions()
  opts.intra_op_num_threads = 1
  want = ort.InferenceSession(q.SerializeToString(), opts, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
  for threads in (1, 2, 3):
    np.testing.assert_array_equal(aot.load(art, threads=threads)(x), want)


def test_qdq_fused_in_a_copy_of_a_model_given_and_in_place_of_one_loaded(tmp_path):
  # fuse_qdq copies a caller's model without serialising it (a model over 2 GB cannot be) and fuses a file's in place
  import onnx

  import aot

  model = _qdq_model("matmul", True, "u8", tmp_path)
  before = model.SerializeToString()
  art = aot.compile_model(model, out_dir=tmp_path / "a")
  assert model.SerializeToString() == before
  onnx.save(model, tmp_path / "m.onnx")
  art2 = aot.compile_model(tmp_path / "m.onnx", out_dir=tmp_path / "b")
  for a in (art, art2):
    assert "aot_qgemm_run" in (a.dir / "src" / "model.c").read_text()
  x = np.random.default_rng(2).integers(0, 256, (7, 600)).astype(np.uint8)
  np.testing.assert_array_equal(aot.load(art)(x), aot.load(art2)(x))


# *** dynamic quantization: A's zero point computed at run time, the int32 sum scaled to float after ***


def test_dynamic_quantization_runs_on_the_int8_microkernel(tmp_path):
  # DynamicQuantizeLinear's zero point comes from the tensor's range at run time: the microkernel reads it from a
  # 1-element buffer a kernel of its own writes. MatMulInteger's int32 sums are exact (equal to onnxruntime's bit for
  # bit); DynamicQuantizeMatMul's (com.microsoft) are scaled to float by the epilogue as onnxruntime scales them
  import onnxruntime as ort
  from onnx import TensorProto, helper, numpy_helper

  import aot

  rng = np.random.default_rng(17)
  # 130 rows and 160 columns: several of the microkernel's tasks, so that 2 and 3 threads split them
  w = numpy_helper.from_array(rng.integers(-128, 128, (96, 160)).astype(np.int8), "w")
  wz = numpy_helper.from_array(np.int8(0), "wz")
  ws = numpy_helper.from_array(np.float32(0.02), "ws")
  bias = numpy_helper.from_array(rng.standard_normal(160).astype(np.float32), "bias")
  nodes = [
    helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
    helper.make_node("MatMulInteger", ["xq", "w", "xz", "wz"], ["y"]),
    helper.make_node("DynamicQuantizeMatMul", ["x", "w", "ws", "wz", "bias"], ["f"], domain="com.microsoft"),
  ]
  g = helper.make_graph(
    nodes,
    "g",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 65, 96])],
    [
      helper.make_tensor_value_info("y", TensorProto.INT32, None),
      helper.make_tensor_value_info("f", TensorProto.FLOAT, None),
    ],
    [w, wz, ws, bias],
  )
  m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
  m.ir_version = 9
  art = aot.compile_model(m, out_dir=tmp_path / "art")
  # both products are one int32 sum (the same quantized x by the same w): one call, both outputs read it
  assert (art.dir / "src" / "model.c").read_text().count("aot_qgemm_run(&g") == 1
  opts = ort.SessionOptions()
  opts.intra_op_num_threads = 1
  sess = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
  # shifted off zero, so that the zero point is neither 0 nor 255
  x = (rng.standard_normal((2, 65, 96)) * 2 + 0.7).astype(np.float32)
  want_y, want_f = sess.run(None, {"x": x})
  got = [aot.load(art, threads=threads)(x) for threads in (1, 2, 3)]
  np.testing.assert_array_equal(got[0][0], want_y)
  np.testing.assert_allclose(got[0][1], want_f, rtol=1e-5, atol=1e-5 * np.abs(want_f).max())
  for other in got[1:]:
    for a, b in zip(other, got[0]):
      np.testing.assert_array_equal(a, b)


def _dynamic_quantize_model(shape, k: int, n: int, seed: int):
  """DynamicQuantizeLinear -> MatMulInteger as quantize_dynamic writes them; every output is a graph output."""
  from onnx import TensorProto, helper, numpy_helper

  rng = np.random.default_rng(seed)
  w = numpy_helper.from_array(rng.integers(-128, 128, (k, n)).astype(np.int8), "w")
  wz = numpy_helper.from_array(np.int8(0), "wz")
  nodes = [
    helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
    helper.make_node("MatMulInteger", ["xq", "w", "xz", "wz"], ["y"]),
  ]
  outs = [helper.make_tensor_value_info(o, t, None) for o, t in (("xq", TensorProto.UINT8), ("xs", 1), ("xz", 2))]
  g = helper.make_graph(
    nodes,
    "g",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
    outs + [helper.make_tensor_value_info("y", TensorProto.INT32, None)],
    [w, wz],
  )
  m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
  m.ir_version = 9
  return m


def test_dynamic_quantize_linear_reads_its_range_once(tmp_path):
  # the zero point needs the minimum and the scale needs both ends of the range: the minimum is computed once, in a
  # kernel of its own, not again inside the kernel that quantizes (where it ran as a scalar chain over the whole
  # tensor, half of that kernel's time); the quantizing kernel is elementwise. Outputs bit-equal to onnxruntime's
  import onnxruntime as ort

  import aot
  from aot.compiler import resolve
  from aot.core.ir import Ops
  from aot.scheduler.schedule import schedule

  m = _dynamic_quantize_model((64, 96), 96, 40, seed=23)
  traced = resolve(m)
  kernels = schedule(traced.outputs, traced.inputs).kernels
  reads_x = [k for k in kernels if any(b.kind == "input" for b in k.bufs)]
  # one reduction for the minimum, one for the maximum; the quantizing kernel reads x elementwise
  assert sum(u.op is Ops.ACCUMULATE for k in reads_x for u in k.ast.toposort()) == 2
  assert any(k.shape == (64, 96) for k in reads_x)
  art = aot.compile_model(m, out_dir=tmp_path / "art")
  opts = ort.SessionOptions()
  opts.intra_op_num_threads = 1
  sess = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
  run = aot.load(art, threads=2)
  rng = np.random.default_rng(5)
  base = rng.standard_normal((64, 96)).astype(np.float32)
  # mixed signs (zero point inside the range), all positive (zero point 0), all negative (255), all zero (scale 1),
  # and values on half steps of a scale of 1/16 (the range [-8, 7.9375]), where rounding half to even matters
  steps = (rng.integers(-256, 255, (64, 96)) / 32).astype(np.float32)
  steps[0, :2] = -8.0, 7.9375
  for x in (base * 3 + 0.4, np.abs(base) + 0.1, -np.abs(base) - 0.1, np.zeros_like(base), steps):
    want = sess.run(None, {"x": x})
    got = run(x)
    for g, w in zip(got, want):
      np.testing.assert_array_equal(np.asarray(g).reshape(np.shape(w)), w)
  run.close()


def test_dynamic_quantize_range_is_reduced_in_parts_that_split_over_threads(tmp_path):
  # a tensor's min and max as one scalar chain cannot split over threads: they are reduced in RANGE_PARTS parts of
  # RANGE_LANES lanes (a kernel the pool splits), then over the partials; the elements past the last whole group (a
  # tail of 4 here) are reduced beside them. Outputs bit-equal to onnxruntime's, with the ends in the parts and in
  # the tail, on 1, 2 and 3 threads
  import onnxruntime as ort

  import aot
  from aot.compiler import resolve
  from aot.frontends.onnx_ops_quant import RANGE_LANES, RANGE_PARTS
  from aot.scheduler.schedule import schedule

  shape = (3, 50, 70)
  m = _dynamic_quantize_model(shape, 70, 24, seed=29)
  traced = resolve(m)
  kernels = schedule(traced.outputs, traced.inputs).kernels
  assert sum(k.shape == (RANGE_PARTS, RANGE_LANES) for k in kernels) == 2
  # and nothing of the parts' folds is staged (a NaN test both ends shared was, in a kernel of its own)
  assert not any(len(k.shape) == 3 and k.shape[0] == RANGE_PARTS for k in kernels)
  art = aot.compile_model(m, out_dir=tmp_path / "art")
  opts = ort.SessionOptions()
  opts.intra_op_num_threads = 1
  sess = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
  runs = [aot.load(art, threads=t) for t in (1, 2, 3)]
  rng = np.random.default_rng(31)
  xs = []
  for at in (0, 5000, -1, -4):
    for end in (-40.0, 40.0):
      x = rng.standard_normal(shape).astype(np.float32)
      x.reshape(-1)[at] = end
      xs.append(x)
  for x in xs:
    want = sess.run(None, {"x": x})
    for run in runs:
      for g, w in zip(run(x), want):
        np.testing.assert_array_equal(np.asarray(g).reshape(np.shape(w)), w)
  for run in runs:
    run.close()


def test_a_range_in_parts_is_the_whole_tensors_with_nan_and_infinities(tmp_path):
  # reduced in parts, folds and lanes, then over the partials (and a tail): still the one min and max numpy finds,
  # a NaN anywhere the result
  import aot
  from aot.frontends.onnx_ops_quant import _whole

  shape = (3, 50, 70)
  art = aot.compile_model(
    lambda x: (_whole(x, "min"), _whole(x, "max")), [np.zeros(shape, np.float32)], out_dir=tmp_path
  )
  run = aot.load(art, threads=2)
  rng = np.random.default_rng(3)
  for at in (0, 77, 5000, 10239, 10240, 10499):
    for special in (np.nan, -np.inf, np.inf):
      x = rng.standard_normal(shape).astype(np.float32)
      x.reshape(-1)[at] = special
      lo, hi = run(x)
      np.testing.assert_array_equal([lo, hi], [x.min(), x.max()])
  run.close()


def test_quantized_input_is_stored_as_bytes_for_the_conv_and_the_residual_add(tmp_path):
  # QuantizeLinear's result (x8 - zero in int32) is read by a conv and by the residual add: it is stored as x8, both
  # widen it as they read it, and no int32 scratch is left for the conv's copy to narrow again
  import onnxruntime as ort
  from onnx import TensorProto, helper, numpy_helper

  import aot
  from aot.models.quantized import quantized

  rng = np.random.default_rng(8)
  w = numpy_helper.from_array((rng.standard_normal((8, 8, 3, 3)) * 0.2).astype(np.float32), "w")
  b = numpy_helper.from_array((rng.standard_normal(8) * 0.1).astype(np.float32), "b")
  g = helper.make_graph(
    [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Add", ["c", "x"], ["y"])],
    "g",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 9, 9])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 9, 9])],
    [w, b],
  )
  q = quantized(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), "qoperator")
  art = aot.compile_model(q, out_dir=tmp_path / "art")
  calls = (art.dir / "src" / "model.c").read_text()
  assert "aot_qgemm_run(&g" in calls and "(const int32_t *)(A + " not in calls
  x = rng.standard_normal((1, 8, 9, 9)).astype(np.float32) * 2
  opts = ort.SessionOptions()
  opts.intra_op_num_threads = 1
  want = ort.InferenceSession(q.SerializeToString(), opts, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
  # the output dequantizes a uint8 tensor: equal floats are equal integers
  for threads in (1, 2, 3):
    np.testing.assert_array_equal(aot.load(art, threads=threads)(x), want)


# *** 8-bit max pools: the runtime's pool (codegen/lower/qpool.py), exact against onnxruntime's ***


def _pool_model(dtype, shape, kernel, strides, pads, form: str):
  """An 8-bit MaxPool: over the bytes (QOperator's), followed by a DequantizeLinear (its float result read through
  an epilogue), or between a DequantizeLinear and a QuantizeLinear of the same scale (QDQ's)."""
  import onnx
  from onnx import TensorProto, helper, numpy_helper

  et = TensorProto.UINT8 if dtype == np.uint8 else TensorProto.INT8
  pool = dict(kernel_shape=kernel, strides=strides, pads=pads)
  inits = [numpy_helper.from_array(np.float32(0.05), "s"), numpy_helper.from_array(dtype(3), "z")]
  nodes = {
    "bytes": [helper.make_node("MaxPool", ["x"], ["y"], **pool)],
    "dequantized": [
      helper.make_node("MaxPool", ["x"], ["p"], **pool),
      helper.make_node("DequantizeLinear", ["p", "s", "z"], ["y"]),
    ],
    "qdq": [
      helper.make_node("DequantizeLinear", ["x", "s", "z"], ["f"]),
      helper.make_node("MaxPool", ["f"], ["p"], **pool),
      helper.make_node("QuantizeLinear", ["p", "s", "z"], ["y"]),
    ],
  }[form]
  out = TensorProto.FLOAT if form == "dequantized" else et
  g = helper.make_graph(
    nodes, "g", [helper.make_tensor_value_info("x", et, shape)], [helper.make_tensor_value_info("y", out, None)], inits
  )
  return helper.make_model(g, opset_imports=[onnx.helper.make_opsetid("", 17)])


@pytest.mark.parametrize(
  "dtype,shape,kernel,strides,pads,form",
  [
    # ResNet's stem pool (3x3/2, padded) over rows wide enough for the vector steps, and its last partial step
    (np.uint8, [1, 3, 37, 70], [3, 3], [2, 2], [1, 1, 1, 1], "bytes"),
    (np.int8, [2, 3, 37, 70], [3, 3], [2, 2], [1, 1, 1, 1], "bytes"),
    (np.int8, [1, 4, 9, 40], [3, 3], [1, 1], [1, 1, 1, 1], "dequantized"),
    (np.uint8, [1, 4, 12, 66], [2, 2], [2, 2], [0, 0, 0, 0], "qdq"),
    # narrow rows (the scalar steps), an uneven window and padding on one side only
    (np.uint8, [1, 2, 11, 13], [2, 3], [1, 2], [0, 2, 1, 0], "qdq"),
    (np.int8, [1, 2, 8, 9], [3, 3], [3, 2], [1, 0, 0, 1], "bytes"),
  ],
)
def test_8bit_max_pool_runs_on_the_runtime_pool(tmp_path, dtype, shape, kernel, strides, pads, form):
  import onnxruntime as ort

  import aot

  model = _pool_model(dtype, shape, kernel, strides, pads, form)
  art = aot.compile_model(model, out_dir=tmp_path / "art")
  assert "aot_qpool_run" in (art.dir / "src" / "model.c").read_text()
  opts = ort.SessionOptions()
  opts.intra_op_num_threads = 1
  sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
  info = np.iinfo(dtype)
  x = np.random.default_rng(sum(shape)).integers(info.min, info.max + 1, shape).astype(dtype)
  # the extremes, which the sign flip and the padding's identity must get right
  x[..., 0, :] = info.min
  x[..., -1, -1] = info.max
  want = sess.run(None, {"x": x})[0]
  for threads in (1, 2, 3):
    got = aot.load(art, threads=threads)(x)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_qdq_residual_add_over_small_planes_runs_as_one_loop_per_channel(tmp_path):
  # the requantized residual add after a conv over 14x14 planes: its rows (h, w) are one flat range, run as one loop
  # of 196 (vectorised), not 14 rows of 14 run as scalar code
  import onnxruntime as ort
  from onnx import TensorProto, helper, numpy_helper

  import aot
  from aot.models.quantized import quantized

  rng = np.random.default_rng(12)
  w = numpy_helper.from_array((rng.standard_normal((8, 8, 3, 3)) * 0.2).astype(np.float32), "w")
  b = numpy_helper.from_array((rng.standard_normal(8) * 0.1).astype(np.float32), "b")
  g = helper.make_graph(
    [
      helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
      helper.make_node("Add", ["c", "x"], ["s"]),
      helper.make_node("Relu", ["s"], ["y"]),
    ],
    "g",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 14, 14])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 14, 14])],
    [w, b],
  )
  q = quantized(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), "qdq")
  art = aot.compile_model(q, out_dir=tmp_path / "art")
  src = "".join(p.read_text() for p in (art.dir / "src").glob("*.c") if not p.name.startswith("aot_"))
  assert "< 196; r1++" in src and "< 14; r2++" not in src
  x = rng.standard_normal((1, 8, 14, 14)).astype(np.float32) * 2
  opts = ort.SessionOptions()
  opts.intra_op_num_threads = 1
  want = ort.InferenceSession(q.SerializeToString(), opts, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
  for threads in (1, 2, 3):
    np.testing.assert_array_equal(aot.load(art, threads=threads)(x), want)


def test_int8_max_pool_after_a_zero_pad_keeps_the_zeros(tmp_path):
  # a constant zero Pad before an int8 MaxPool puts real zeros in the window (above every negative value): they are
  # not the padding the runtime's pool skips, and the result must still be onnxruntime's
  import onnxruntime as ort
  from onnx import TensorProto, helper, numpy_helper

  import aot

  g = helper.make_graph(
    [
      helper.make_node("Pad", ["x", "pads"], ["p"], mode="constant"),
      helper.make_node("MaxPool", ["p"], ["y"], kernel_shape=[3, 3], strides=[2, 2]),
    ],
    "g",
    [helper.make_tensor_value_info("x", TensorProto.INT8, [1, 2, 9, 40])],
    [helper.make_tensor_value_info("y", TensorProto.INT8, None)],
    [numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads")],
  )
  model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
  art = aot.compile_model(model, out_dir=tmp_path / "art")
  # all negative: a skipped zero would leave -128 or a negative maximum at the edges
  x = np.random.default_rng(4).integers(-128, 0, (1, 2, 9, 40)).astype(np.int8)
  opts = ort.SessionOptions()
  opts.intra_op_num_threads = 1
  want = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"]).run(None, {"x": x})
  np.testing.assert_array_equal(aot.load(art)(x), want[0])
