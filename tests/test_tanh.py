"""float32 tanh is computed as an odd polynomial near 0 and from exp beyond (codegen/render/opt.py _tanh32), so that
it vectorises where libm's tanhf does not: within 2 ulp of tanh over the whole range (tiny and denormal inputs
included), exact at 0, -0, +-inf and NaN, on the C and LLVM targets; an LSTM built on it stays onnxruntime's."""

import numpy as np
import onnxruntime as ort
import pytest
from conftest import TARGETS, run_without_call
from onnx import TensorProto, helper, numpy_helper

import aot


@pytest.mark.parametrize("target", TARGETS)
def test_tanh_as_arithmetic_matches_numpy(tmp_path, target):
  exact = [np.nan, np.inf, -np.inf, 0.0, -0.0, 50.0, -50.0, 1e-40, -1e-40]
  ramp = np.linspace(-12, 12, 200001)
  # around the split between the two forms, and every binade of small inputs
  near = np.concatenate([np.linspace(0.6, 0.65, 20001), np.geomspace(1e-38, 10, 20001)])
  x = np.concatenate([ramp, near, -near, exact]).astype(np.float32)
  y = run_without_call(lambda a: a.tanh(), x, tmp_path / target, target, "tanhf")
  ref = np.tanh(x.astype(np.float64))
  finite = np.isfinite(ref) & (ref != 0)
  ulps = np.abs(y[finite] - ref[finite]) / np.spacing(np.abs(ref[finite]).astype(np.float32))
  assert ulps.max() <= 2, x[finite][ulps.argmax()]
  got, want = y[-len(exact) :], np.tanh(np.float32(exact))
  np.testing.assert_array_equal(got, want)
  assert np.array_equal(np.signbit(got), np.signbit(want))


def test_an_lstm_on_arithmetic_tanh_matches_onnxruntime(tmp_path):
  rng = np.random.default_rng(4)
  T, B, I, H = 9, 2, 12, 16
  w = numpy_helper.from_array((rng.standard_normal((1, 4 * H, I)) * 0.4).astype(np.float32), "w")
  r = numpy_helper.from_array((rng.standard_normal((1, 4 * H, H)) * 0.4).astype(np.float32), "r")
  g = helper.make_graph(
    [helper.make_node("LSTM", ["x", "w", "r"], ["y"], hidden_size=H)],
    "g",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [T, B, I])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    [w, r],
  )
  model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
  art = aot.compile_model(model, out_dir=tmp_path / "art")
  src = "".join(p.read_text() for p in (art.dir / "src").glob("*.c") if not p.name.startswith("aot_"))
  assert "tanhf(" not in src
  x = (rng.standard_normal((T, B, I)) * 2).astype(np.float32)
  want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
  np.testing.assert_allclose(aot.load(art)(x), want, rtol=1e-5, atol=1e-6)
