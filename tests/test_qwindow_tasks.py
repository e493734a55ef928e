"""The 8-bit window routines (runtime_c/aot_qpool.c, aot_qim2col.c) over the shapes their fast paths and task splits
pick apart:
the im2col of "same" stride-1 convolutions over contiguous planes of up to 256 bytes (read as the plane shifted by
the tap, masked to the plane, where AVX-512BW is there), with one channel, planes of 1x1, 7x7, 16x16, odd sizes,
asymmetric padding and both orders of A's k, against an independent numpy im2col, split anyhow on 1 and 3 threads;
and QLinearConv and 8-bit MaxPool models over such planes against onnxruntime on 1 and 3 threads."""

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper as oh
from test_qim2col import (
  _run_against_onnxruntime,
  equal_to_onnxruntime_on_threads,
  im2col_equals_numpy,
  lib,  # noqa: F401 (the fixture: the window routines built for this CPU)
  out_size,
)

# (C, H, W, KH, KW, (top, left, bottom, right) pads), stride 1, output rows as wide as the input's: one channel, 1x1
# and 7x7 planes, 16x16 (256 bytes, four whole vectors) and 17x15 (255, a partial last one), 5x13, a 5x5 window (25
# taps), 1x3 and 3x1 windows, padding only below or to the left, more channels than a split's share
SAME = [
  (1, 7, 7, 3, 3, (1, 1, 1, 1)),
  (5, 7, 7, 3, 3, (1, 1, 1, 1)),
  (3, 1, 1, 3, 3, (1, 1, 1, 1)),
  (2, 16, 16, 3, 3, (1, 1, 1, 1)),
  (3, 17, 15, 3, 3, (1, 1, 1, 1)),
  (7, 5, 13, 3, 3, (0, 1, 2, 1)),
  (2, 9, 9, 5, 5, (2, 2, 2, 2)),
  (3, 6, 11, 1, 3, (0, 2, 0, 0)),
  (4, 11, 6, 3, 1, (2, 0, 0, 0)),
  (33, 7, 7, 3, 3, (1, 1, 1, 1)),
  (8, 9, 9, 3, 3, (1, 1, 1, 1)),
]


@pytest.mark.parametrize("g", SAME, ids=lambda g: "x".join(map(str, g[:5])))
def test_same_width_im2col_equals_numpy(lib, g):  # noqa: F811
  C, H, W, KH, KW, pads = g
  OH, OW = out_size(H, W, KH, KW, (1, 1), pads)
  assert OW == W
  r = np.random.default_rng(sum(g[:5]))
  # the planes one after another (x_row == W), a guard before and after that the routine must not copy into A
  xbuf = r.integers(0, 256, C * H * W + 128, dtype=np.uint8)
  x = xbuf[64 : 64 + C * H * W].reshape(C, H, W)
  im2col_equals_numpy(lib, x, xbuf.ctypes.data + 64, W, KH, KW, (1, 1), pads, 0xA7, r)


# the same shapes (with their stride) as whole QLinearConvs: (C, H, W, KH, KW, (SH, SW), pads)
SAME_CONVS = [(C, H, W, KH, KW, (1, 1), pads) for C, H, W, KH, KW, pads in SAME if H * W > 1]


@pytest.mark.parametrize("dt", [np.uint8, np.int8], ids=["u8", "s8"])
def test_same_width_convs_equal_onnxruntime(dt):
  source = _run_against_onnxruntime("qlinear", dt, SAME_CONVS)
  assert source.count("aot_qim2col p = {") == len(SAME_CONVS)


# 8-bit max pools: (C, H, W, kernel, strides, pads): stride 2 with padding over even and odd planes, 1 channel,
# planes of 1x1 and 7x7, rows of 33 and 70 columns (past the routine's vector steps), rows of 4 to 31 bytes or outputs
# (its 4-, 8- and 16-byte steps: 27x27/2 to 13, 13x13, 10x20 and 6x6 at stride 1, 9x18 and 5x9 2x2/2 to 9 and 4)
POOLS = [
  (4, 112 // 4, 112 // 4, (3, 3), (2, 2), (1, 1, 1, 1)),
  (1, 7, 7, (3, 3), (2, 2), (1, 1, 1, 1)),
  (3, 1, 1, (3, 3), (2, 2), (1, 1, 1, 1)),
  (5, 9, 33, (3, 3), (2, 2), (1, 1, 1, 1)),
  (2, 11, 70, (2, 2), (2, 2), (0, 0, 1, 1)),
  (3, 13, 35, (3, 3), (1, 1), (1, 1, 1, 1)),
  (6, 27, 27, (3, 3), (2, 2), (0, 0, 0, 0)),
  (5, 13, 13, (3, 3), (1, 1), (1, 1, 1, 1)),
  (3, 10, 20, (3, 3), (1, 1), (1, 1, 1, 1)),
  (2, 9, 18, (2, 2), (2, 2), (0, 0, 0, 0)),
  (6, 6, 6, (3, 3), (1, 1), (1, 1, 1, 1)),
  (2, 5, 9, (2, 2), (2, 2), (0, 0, 0, 0)),
]


@pytest.mark.parametrize("dt", [np.uint8, np.int8], ids=["u8", "s8"])
def test_8bit_max_pools_equal_onnxruntime(dt):
  elem = TP.UINT8 if dt == np.uint8 else TP.INT8
  inputs, outputs, nodes = [], [], []
  for i, (C, H, W, k, s, pads) in enumerate(POOLS):
    inputs.append(oh.make_tensor_value_info(f"x{i}", elem, [1, C, H, W]))
    outputs.append(oh.make_tensor_value_info(f"y{i}", elem, None))
    nodes.append(oh.make_node("MaxPool", [f"x{i}"], [f"y{i}"], kernel_shape=list(k), strides=list(s), pads=list(pads)))
  m = oh.make_model(oh.make_graph(nodes, "pools", inputs, outputs), opset_imports=[oh.make_opsetid("", 17)])
  m.ir_version = 9
  r = np.random.default_rng(11)
  info = np.iinfo(dt)
  feeds = {
    f"x{i}": r.integers(info.min, info.max + 1, (1, C, H, W)).astype(dt) for i, (C, H, W, *_) in enumerate(POOLS)
  }
  _, source = equal_to_onnxruntime_on_threads(m, feeds, POOLS)
  # each pool is the runtime's, not a generated loop (but the 1x1 plane's, whose one tap is a copy)
  assert source.count("aot_qpool p = {") == sum(H * W > 1 for _, H, W, *_ in POOLS)
