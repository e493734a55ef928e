"""The runtime's im2col of 8-bit convolutions (aot_qim2col_run, runtime_c/aot_qim2col.c) at every stride: the routine
against an independent numpy im2col, byte for byte, and QLinearConv / QDQ convolutions over small and odd planes
against onnxruntime's int8 run, their operand made by the runtime's routine."""

import ctypes
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import ort_session, outputs_on_threads
from onnx import TensorProto as TP
from onnx import helper as oh
from onnx import numpy_helper

import aot
from aot.build import cc, cflags

RUNTIME = Path(__file__).resolve().parent.parent / "runtime_c"

# the routine on a pool of `threads` threads, as model.c calls it
DRIVER = r"""
#include "aot_runtime.h"
__attribute__((visibility("default"))) void qim2col(aot_qim2col *p, int start, int end, int threads) {
  if (threads == 0) { aot_qim2col_run(p, start, end); return; }
  aot_pool *pool = aot_pool_create(threads);
  aot_parallel(pool, aot_qim2col_run, p, end - start);
  aot_pool_destroy(pool);
}
"""


class QIm2col(ctypes.Structure):
  _fields_ = [
    ("x", ctypes.c_void_p),
    ("x_plane", ctypes.c_long),
    ("x_row", ctypes.c_long),
    *[(f, ctypes.c_int) for f in ("H", "W", "KH", "KW", "SH", "SW", "PH", "PW")],
    ("y", ctypes.c_void_p),
    ("y_plane", ctypes.c_long),
    ("y_kh", ctypes.c_long),
    ("y_kw", ctypes.c_long),
    *[(f, ctypes.c_int) for f in ("OH", "OW", "planes", "pad")],
  ]


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
  d = tmp_path_factory.mktemp("qim2col")
  (d / "driver.c").write_text(DRIVER)
  so = d / "libq.so"
  sources = [str(d / "driver.c"), *(str(RUNTIME / f) for f in ("aot_qim2col.c", "aot_qgemm.c", "aot_runtime.c"))]
  subprocess.run(
    [cc(), *cflags("native"), "-shared", f"-I{RUNTIME}", *sources, "-o", str(so), "-lpthread", "-lm"], check=True
  )
  return ctypes.CDLL(str(so))


def out_size(H, W, KH, KW, S, pads, D=(1, 1)) -> tuple[int, int]:
  spans = (KH - 1) * D[0] + 1, (KW - 1) * D[1] + 1
  return (H + pads[0] + pads[2] - spans[0]) // S[0] + 1, (W + pads[1] + pads[3] - spans[1]) // S[1] + 1


def reference(x, KH, KW, S, pads, OH, OW, pad):
  """A as [c][kh][kw][oy * OW + ox]: x padded by pads (top, left, bottom, right) with pad, sliced at the stride."""
  C, H, W = x.shape
  SH, SW = S
  xp = np.full((C, max((OH - 1) * SH + KH, pads[0] + H), max((OW - 1) * SW + KW, pads[1] + W)), pad, np.uint8)
  xp[:, pads[0] : pads[0] + H, pads[1] : pads[1] + W] = x
  taps = [xp[:, i : i + (OH - 1) * SH + 1 : SH, j : j + (OW - 1) * SW + 1 : SW] for i in range(KH) for j in range(KW)]
  return np.stack(taps, 1).reshape(C, KH, KW, OH * OW)


# (C, H, W, KH, KW, (SH, SW), (top, left, bottom, right) pads): planes of 1 to 130 columns, runs of 1 to 68 outputs
# (the one-vector widths and past them), stride 1, 2 and 3, 1xK and Kx1 windows, one input plane, planes too big for
# the routine's buffer (130x130, 120x230: bands of padded rows); the input's rows 3 bytes longer than the plane's
GEOMETRIES = [
  (5, 7, 7, 3, 3, (1, 1), (1, 1, 1, 1)),
  (4, 14, 14, 3, 3, (1, 1), (1, 1, 1, 1)),
  (3, 5, 3, 3, 3, (1, 1), (1, 1, 1, 1)),
  (3, 1, 1, 3, 3, (1, 1), (1, 1, 1, 1)),
  (2, 28, 28, 3, 3, (1, 1), (1, 1, 1, 1)),
  (2, 56, 56, 3, 3, (1, 1), (1, 1, 1, 1)),
  (2, 13, 40, 5, 5, (1, 1), (2, 2, 2, 2)),
  (2, 6, 70, 3, 3, (1, 1), (0, 0, 0, 0)),
  (3, 9, 11, 3, 3, (2, 2), (1, 1, 1, 1)),
  (3, 14, 14, 3, 3, (2, 2), (1, 1, 1, 1)),
  (2, 30, 33, 3, 3, (2, 2), (1, 1, 1, 1)),
  (2, 21, 71, 7, 7, (2, 2), (3, 3, 3, 3)),
  (2, 10, 9, 3, 3, (3, 3), (0, 1, 1, 0)),
  (3, 8, 12, 1, 5, (1, 1), (0, 2, 0, 2)),
  (3, 12, 8, 5, 1, (2, 1), (2, 0, 2, 0)),
  (2, 9, 12, 1, 5, (2, 2), (1, 2, 1, 2)),
  (1, 9, 10, 3, 3, (1, 1), (1, 1, 1, 1)),
  (1, 9, 10, 3, 3, (2, 1), (0, 0, 0, 0)),
  (2, 130, 130, 3, 3, (1, 1), (1, 1, 1, 1)),
  (1, 120, 230, 7, 7, (2, 2), (3, 3, 3, 3)),
]


def im2col_equals_numpy(lib, x, x_at: int, x_row: int, KH, KW, S, pads, pad: int, r) -> None:
  """The runtime's im2col of planes x (C, H, W; their bytes at address x_at, rows x_row apart) equal to numpy's, with
  A's k in the order (c, kh, kw), then (kw, kh, c), split anyhow and on 3 threads; a guard after A that must stay as
  it was."""
  C, H, W = x.shape
  OH, OW = out_size(H, W, KH, KW, S, pads)
  M = OH * OW
  want = reference(x, KH, KW, S, pads, OH, OW, pad)
  for order in ((0, 1, 2), (2, 1, 0)):
    sizes = {0: C, 1: KH, 2: KW}
    stride, step = {}, M
    for axis in reversed(order):
      stride[axis] = step
      step *= sizes[axis]
    y = np.full(C * KH * KW * M + 64, 0xEE, np.uint8)
    p = QIm2col(x_at, H * x_row, x_row, H, W, KH, KW, *S, pads[0], pads[1], y.ctypes.data)
    p.y_plane, p.y_kh, p.y_kw, p.OH, p.OW, p.planes, p.pad = stride[0], stride[1], stride[2], OH, OW, C, pad
    tasks = C * KH

    def check():
      got = y[: C * KH * KW * M].reshape([sizes[a] for a in order] + [M]).transpose([*np.argsort(order), 3])
      np.testing.assert_array_equal(got, want, err_msg=f"k order {order}")
      assert (y[-64:] == 0xEE).all()
      y[:] = 0xEE

    # splits in any order, later tasks first: a row spilling into another task's rows shows
    cuts = sorted({0, tasks, *r.integers(0, tasks + 1, 3).tolist()})
    for lo, hi in reversed(list(zip(cuts, cuts[1:]))):
      lib.qim2col(ctypes.byref(p), lo, hi, 0)
    check()
    lib.qim2col(ctypes.byref(p), 0, tasks, 3)
    check()


@pytest.mark.parametrize("g", GEOMETRIES, ids=lambda g: "x".join(map(str, g[:5])) + f"s{g[5][0]}{g[5][1]}")
def test_runtime_im2col_equals_numpy(lib, g):
  C, H, W, KH, KW, S, pads = g
  r = np.random.default_rng(sum(g[:5]))
  x_row = W + 3
  xbuf = r.integers(0, 256, C * H * x_row, dtype=np.uint8)
  im2col_equals_numpy(lib, xbuf.reshape(C, H, x_row)[:, :, :W], xbuf.ctypes.data, x_row, KH, KW, S, pads, 0x5A, r)


# *** whole convolutions against onnxruntime ***


def _conv_outputs(node_of, geometries, dt):
  """A model of one convolution per geometry, each on its own 8-bit input: the graph's inputs, outputs, nodes and
  initializers."""
  inputs, outputs, nodes, inits = [], [], [], []
  elem = TP.UINT8 if dt == np.uint8 else TP.INT8
  for i, (C, H, W, KH, KW, S, pads, *D) in enumerate(geometries):
    inputs.append(oh.make_tensor_value_info(f"x{i}", elem, [1, C, H, W]))
    window = dict(strides=list(S), pads=list(pads), **({"dilations": list(D[0])} if D else {}))
    n, consts = node_of(i, C, KH, KW, dt, window)
    N = consts[f"w{i}"].shape[0]
    outputs.append(oh.make_tensor_value_info(f"y{i}", elem, [1, N, *out_size(H, W, KH, KW, S, pads, *D)]))
    nodes += n
    inits += [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()]
  return inputs, outputs, nodes, inits


def _qlinear_conv(i, C, KH, KW, dt, window):
  r = np.random.default_rng(100 + i)
  N = 6
  consts = {
    f"xs{i}": np.float32(0.02),
    f"xz{i}": dt(121 if dt == np.uint8 else -7),
    f"w{i}": r.integers(-127, 128, (N, C, KH, KW)).astype(np.int8),
    f"ws{i}": r.uniform(0.002, 0.006, N).astype(np.float32),
    f"wz{i}": np.zeros(N, np.int8),
    f"ys{i}": np.float32(0.006 * np.sqrt(C * KH * KW)),
    f"yz{i}": dt(126 if dt == np.uint8 else 3),
    f"b{i}": r.integers(-500, 500, N).astype(np.int32),
  }
  names = [f"x{i}", *consts]
  return [oh.make_node("QLinearConv", names, [f"y{i}"], **window)], consts


def _qdq_conv(i, C, KH, KW, dt, window):
  """DequantizeLinear -> Conv (per-channel int8 weights, dequantized) -> QuantizeLinear: the QDQ form."""
  r = np.random.default_rng(200 + i)
  N = 5
  consts = {
    f"xs{i}": np.float32(0.03),
    f"xz{i}": dt(118 if dt == np.uint8 else 5),
    f"w{i}": r.integers(-127, 128, (N, C, KH, KW)).astype(np.int8),
    f"ws{i}": r.uniform(0.001, 0.004, N).astype(np.float32),
    f"wz{i}": np.zeros(N, np.int8),
    f"ys{i}": np.float32(0.0055 * np.sqrt(C * KH * KW)),
    f"yz{i}": dt(130 if dt == np.uint8 else -2),
  }
  nodes = [
    oh.make_node("DequantizeLinear", [f"x{i}", f"xs{i}", f"xz{i}"], [f"xf{i}"]),
    oh.make_node("DequantizeLinear", [f"w{i}", f"ws{i}", f"wz{i}"], [f"wf{i}"], axis=0),
    oh.make_node("Conv", [f"xf{i}", f"wf{i}"], [f"cf{i}"], **window),
    oh.make_node("QuantizeLinear", [f"cf{i}", f"ys{i}", f"yz{i}"], [f"y{i}"]),
  ]
  return nodes, consts


# the convolutions over small and odd planes (not the two too big for a cheap model), and those whose operand the
# runtime makes: a k-major A, the output row longer than the window's (codegen/lower/quant.py writes A row-major where
# it is not: 3 or 1 outputs a row under a 3-wide window)
MODEL_GEOMETRIES = [g for g in GEOMETRIES if g[1] * g[2] <= 70 * 70]


def by_runtime(g) -> bool:
  C, H, W, KH, KW, S, pads = g
  return out_size(H, W, KH, KW, S, pads)[1] > KW


def equal_to_onnxruntime_on_threads(m, feeds: dict, labels: list) -> tuple[list, str]:
  """Model m compiled and run on 1 and 3 threads: each output equal to onnxruntime's (labels[i] names output i in a
  failure); onnxruntime's outputs and our model.c."""
  want = ort_session(m).run(None, feeds)
  with tempfile.TemporaryDirectory(prefix="aot_qim2col_") as d:
    art = aot.compile_model(m, out_dir=d)
    source = (art.dir / "src" / "model.c").read_text()
    for got in outputs_on_threads(art, feeds):
      for i, (a, b) in enumerate(zip(got, want)):
        assert a.dtype == b.dtype and a.shape == b.shape, labels[i]
        np.testing.assert_array_equal(a, b, err_msg=str(labels[i]))
  return want, source


def _run_against_onnxruntime(form: str, dt, geometries) -> str:
  """The model of the geometries' convolutions (QLinearConv or QDQ), compiled and run on 1 and 3 threads: outputs
  equal to onnxruntime's; its model.c."""
  inputs, outputs, nodes, inits = _conv_outputs(_qlinear_conv if form == "qlinear" else _qdq_conv, geometries, dt)
  g = oh.make_graph(nodes, "g", inputs, outputs, initializer=inits)
  m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])
  m.ir_version = 9
  onnx.checker.check_model(m)
  r = np.random.default_rng(7)
  info = np.iinfo(dt)
  feeds = {
    f"x{i}": r.integers(info.min, info.max + 1, (1, C, H, W)).astype(dt) for i, (C, H, W, *_) in enumerate(geometries)
  }
  want, source = equal_to_onnxruntime_on_threads(m, feeds, geometries)
  # some outputs at each end of the range, most inside it
  every = np.concatenate([w.reshape(-1) for w in want])
  assert (
    0.01 < np.mean(every == info.min)
    and 0.01 < np.mean(every == info.max)
    and np.mean((every == info.min) | (every == info.max)) < 0.5
  )
  return source


@pytest.mark.parametrize("form", ["qlinear", "qdq"])
@pytest.mark.parametrize("dt", [np.uint8, np.int8], ids=["u8", "s8"])
def test_convs_equal_onnxruntime_with_the_runtime_im2col(form, dt):
  geometries = MODEL_GEOMETRIES if form == "qlinear" else MODEL_GEOMETRIES[::3]
  source = _run_against_onnxruntime(form, dt, geometries)
  # each k-major operand is the runtime's im2col, not a generated copy
  assert source.count("aot_qim2col p = {") == sum(map(by_runtime, geometries)) > 0


def test_dilated_convs_equal_onnxruntime():
  """Dilated windows (which aot_qim2col has no field for) are either read another way that its geometry checks
  exactly (rows dilated by the row stride: every other row of a plane) or left to the generated copy."""
  geometries = [
    (3, 12, 11, 3, 3, (1, 1), (2, 2, 2, 2), (2, 2)),
    (2, 13, 14, 3, 3, (2, 2), (2, 1, 2, 1), (2, 1)),
    (2, 9, 16, 1, 3, (1, 1), (0, 2, 0, 2), (1, 2)),
  ]
  source = _run_against_onnxruntime("qlinear", np.uint8, geometries)
  assert source.count("aot_qim2col p = {") == 1
