"""Signal ops (DFT, STFT, windows, MelWeightMatrix) in the forms the backend node cases leave out, against numpy's
float64 FFT and onnx's reference implementation. One model, compiled once."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from aot.compiler import compile_model
from aot.errors import CompileError
from aot.loader import load

F, D, I64 = TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT64
ints = lambda name, v: numpy_helper.from_array(np.asarray(v, dtype=np.int64), name)


def _complex(a: np.ndarray) -> np.ndarray:
  return a[..., 0] + 1j * a[..., 1] if a.shape[-1] == 2 else a[..., 0]


def _pair(c: np.ndarray) -> np.ndarray:
  return np.stack([c.real, c.imag], axis=-1)


# (output, node, what numpy says from the inputs x (2,6,5,2 complex), r (3,7,1 real), d (4,3,1 float64), s (1,20,2))
CASES = [
  ("pad", helper.make_node("DFT", ["x", "n8", "one"], ["pad"]), lambda i: _pair(np.fft.fft(_complex(i["x"]), 8, 1))),
  ("cut", helper.make_node("DFT", ["x", "n4", "one"], ["cut"]), lambda i: _pair(np.fft.fft(_complex(i["x"]), 4, 1))),
  (
    "half",
    helper.make_node("DFT", ["x", "", "two"], ["half"], onesided=1),
    lambda i: _pair(np.fft.fft(_complex(i["x"]), axis=2)[:, :, :3]),
  ),
  ("real", helper.make_node("DFT", ["r"], ["real"]), lambda i: _pair(np.fft.fft(i["r"][..., 0], axis=1))),
  (
    "inv",
    helper.make_node("DFT", ["x", "n8", "one"], ["inv"], inverse=1),
    lambda i: _pair(np.fft.ifft(_complex(i["x"]), 8, 1)),
  ),
  # one-sided inverse to an odd length: bins 1..3 count twice, none is the unpaired middle one
  (
    "odd",
    helper.make_node("DFT", ["x", "n7", "one"], ["odd"], inverse=1, onesided=1),
    lambda i: np.fft.irfft(_complex(i["x"]), 7, 1)[..., None],
  ),
  ("wide", helper.make_node("DFT", ["d", "", "zero"], ["wide"]), lambda i: _pair(np.fft.fft(i["d"][..., 0], axis=0))),
  ("hann", helper.make_node("HannWindow", ["n8"], ["hann"], output_datatype=D), lambda i: _hann(8)),
  (
    "hamming",
    helper.make_node("HammingWindow", ["n7"], ["hamming"], periodic=0),  # ONNX's alpha is 25/46, not numpy's 0.54
    lambda i: 25 / 46 - 21 / 46 * np.cos(2 * np.pi * np.arange(7) / 6),
  ),
  ("blackman", helper.make_node("BlackmanWindow", ["n7"], ["blackman"], periodic=0), lambda i: np.blackman(7)),
  (
    "spec",
    helper.make_node("STFT", ["s", "three", "hann", "n8"], ["spec"], onesided=0),
    lambda i: _pair(
      np.stack([np.fft.fft(_complex(i["s"])[:, f * 3 : f * 3 + 8] * _hann(8), axis=1) for f in range(5)], axis=1)
    ),
  ),
  ("bf16", helper.make_node("HannWindow", ["n7"], ["bf16"], output_datatype=TensorProto.BFLOAT16), None),
  ("mel", helper.make_node("MelWeightMatrix", ["n8", "n64", "rate", "lo", "hi"], ["mel"], output_datatype=D), None),
]


def _hann(n):
  return np.sin(np.pi * np.arange(n) / n) ** 2


@pytest.fixture(scope="module")
def signal_model(tmp_path_factory):
  inits = [
    ints("n4", 4),
    ints("n7", 7),
    ints("n8", 8),
    ints("n64", 64),
    ints("one", 1),
    ints("two", 2),
    ints("zero", 0),
    ints("three", 3),
    ints("rate", 8000),
    numpy_helper.from_array(np.float32(100), "lo"),
    numpy_helper.from_array(np.float32(3000), "hi"),
  ]
  inputs = [
    helper.make_tensor_value_info("x", F, [2, 6, 5, 2]),
    helper.make_tensor_value_info("r", F, [3, 7, 1]),
    helper.make_tensor_value_info("d", D, [4, 3, 1]),
    helper.make_tensor_value_info("s", F, [1, 20, 2]),
  ]
  outs = [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o, _, _ in CASES]
  g = helper.make_graph([n for _, n, _ in CASES], "signal", inputs, outs, inits)
  m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])
  rng = np.random.default_rng(0)
  feeds = {
    "x": rng.standard_normal((2, 6, 5, 2)).astype(np.float32),
    "r": rng.standard_normal((3, 7, 1)).astype(np.float32),
    "d": rng.standard_normal((4, 3, 1)),
    "s": rng.standard_normal((1, 20, 2)).astype(np.float32),
  }
  got = load(compile_model(m, out_dir=tmp_path_factory.mktemp("signal"), name="signal"))(*feeds.values())
  return m, feeds, dict(zip([o for o, _, _ in CASES], got))


@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_signal_op(signal_model, name):
  m, feeds, got = signal_model
  want = dict(zip([o for o, _, _ in CASES], ReferenceEvaluator(m).run(None, feeds)))
  g, w = got[name], want[name]
  assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
  tol = 1e-2 if name == "bf16" else 1e-12 if g.dtype == np.float64 and name != "spec" else 1e-5
  np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=tol, atol=tol)
  numpy_says = {o: f for o, _, f in CASES}[name]
  if numpy_says is not None:
    np.testing.assert_allclose(g.astype(np.float64), numpy_says(feeds), rtol=tol, atol=tol)


def test_dft_length_must_be_known(tmp_path):
  g = helper.make_graph(
    [helper.make_node("DFT", ["x", "n"], ["y"], name="dft")],
    "g",
    [helper.make_tensor_value_info("x", F, [4, 1]), helper.make_tensor_value_info("n", I64, [])],
    [helper.make_tensor_value_info("y", F, None)],
  )
  m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])
  with pytest.raises(CompileError, match=r"dft_length of DFT node 'dft' must be known at compile time.*--bind n="):
    compile_model(m, out_dir=tmp_path, name="m")


@pytest.mark.parametrize(
  "shape, size, match",
  [
    ([4, 3], 4, r"DFT node 'dft': DFT input of shape \(4, 3\): needs a trailing axis of 1 \(real\) or 2"),
    ([1 << 13, 2], 1 << 13, r"DFT node 'dft': a DFT of length 8192 needs a 16384x16384 matrix"),
  ],
)
def test_dft_bad_input_names_the_node(tmp_path, shape, size, match):
  g = helper.make_graph(
    [helper.make_node("DFT", ["x", "n", "zero"], ["y"], name="dft")],
    "g",
    [helper.make_tensor_value_info("x", F, shape)],
    [helper.make_tensor_value_info("y", F, None)],
    [ints("n", size), ints("zero", 0)],
  )
  m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])
  with pytest.raises(CompileError, match=match):
    compile_model(m, out_dir=tmp_path, name="m")
