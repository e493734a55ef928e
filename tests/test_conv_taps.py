"""A convolution's taps that read only padding for every output add zeros: TensorNN._live_taps drops them (a dilated
conv over a map smaller than its dilation, DeepLab's ASPP, becomes a 1x1 conv), shrinking the pads with the kernel and
cutting the input where a pad would go negative. Against a float64 numpy convolution over random geometries (strides,
dilations, asymmetric pads, taps dead at either end or both), and DeepLab's ASPP shape against onnxruntime."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import aot
from aot.frontends.tensor import Tensor


def reference(x, w, stride, pads, dilation):
  """float64 convolution, pads ((top, bottom), (left, right)), by taps."""
  x, w = x.astype(np.float64), w.astype(np.float64)
  (t, b), (left, r) = pads
  xp = np.pad(x, ((0, 0), (0, 0), (t, b), (left, r)))
  K1, K2 = w.shape[2:]
  O1 = (xp.shape[2] - dilation[0] * (K1 - 1) - 1) // stride[0] + 1
  O2 = (xp.shape[3] - dilation[1] * (K2 - 1) - 1) // stride[1] + 1
  out = np.zeros((x.shape[0], w.shape[0], O1, O2))
  for i in range(K1):
    for j in range(K2):
      a, c = i * dilation[0], j * dilation[1]
      win = xp[:, :, a : a + (O1 - 1) * stride[0] + 1 : stride[0], c : c + (O2 - 1) * stride[1] + 1 : stride[1]]
      out += np.einsum("nchw,oc->nohw", win, w[:, :, i, j])
  return out


def geometries(count: int, seed: int):
  """Random (x shape, w shape, stride, pads, dilation) with an output, most with taps that read only padding."""
  rng = np.random.default_rng(seed)
  found = []
  while len(found) < count:
    L = rng.integers(3, 10, 2)
    K = rng.integers(1, 4, 2)
    d = rng.integers(1, 13, 2)
    s = rng.integers(1, 4, 2)
    pads = [tuple(rng.integers(0, dd * kk + 3, 2)) for dd, kk in zip(d, K)]
    outs = [(ll + lo + hi - dd * (kk - 1) - 1) // ss + 1 for ll, (lo, hi), dd, kk, ss in zip(L, pads, d, K, s)]
    if min(outs) >= 1:
      found.append(((1, 3, *L), (4, 3, *K), tuple(map(int, s)), [tuple(map(int, p)) for p in pads], tuple(map(int, d))))
  return found


# (seed 7: 32 geometries, 16 with taps that read only padding, 3 of them cutting the input, 2 whose every tap does)
@pytest.mark.parametrize("case", geometries(32, 7))
def test_dropping_padding_taps_keeps_the_convolution(case, tmp_path):
  xs, ws, stride, pads, dilation = case
  rng = np.random.default_rng(sum(xs) + sum(ws))
  x, w = rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ws).astype(np.float32)
  padding = [pads[0][0], pads[1][0], pads[0][1], pads[1][1]]
  fn = lambda a: a.conv2d(Tensor(w), stride=stride, padding=padding, dilation=dilation)
  got = aot.load(aot.compile_model(fn, [x], out_dir=tmp_path))(x)
  want = reference(x, w, stride, pads, dilation)
  assert got.shape == want.shape
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * max(1.0, np.abs(want).max()))


def test_aspp_dilations_past_the_map_run_as_a_1x1_conv(tmp_path):
  # DeepLabV3's ASPP over a 16x16 map: dilation 24's taps off the centre read only padding; the contraction that runs
  # has K = channels (a 1x1 conv's), not 9x them, and matches onnxruntime
  rng = np.random.default_rng(3)
  w = numpy_helper.from_array((rng.standard_normal((32, 64, 3, 3)) * 0.1).astype(np.float32), "w")
  g = helper.make_graph(
    [helper.make_node("Conv", ["x", "w"], ["y"], pads=[24, 24, 24, 24], dilations=[24, 24])],
    "g",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 16, 16])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    [w],
  )
  model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
  art = aot.compile_model(model, out_dir=tmp_path / "art")
  assert "aot_gemm g = {1, 32, 256, 64," in (art.dir / "src" / "model.c").read_text()
  x = rng.standard_normal((1, 64, 16, 16)).astype(np.float32)
  want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
  np.testing.assert_allclose(aot.load(art)(x), want, rtol=1e-5, atol=1e-5)
