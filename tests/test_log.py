"""float32 log is computed from exponent bit fields, one division and a short series (codegen/render/opt.py _log32),
so that it vectorises where libm's logf does not: within 2 ulp of log over the whole range (denormals included),
exact at 0, -0, negatives, inf and NaN, on the C and LLVM targets. LRN's power of its window sum is built on it (or,
for the usual beta 3/4, on square roots): the generated C calls neither powf nor logf, and the results are
onnxruntime's within 1e-5."""

import numpy as np
import onnxruntime as ort
import pytest
from conftest import TARGETS, run_without_call
from onnx import TensorProto, helper

import aot

SPECIAL = [np.nan, np.inf, -np.inf, 0.0, -0.0, -1.0, 1.0, -1e-40]


@pytest.mark.parametrize("target", TARGETS)
def test_log_as_arithmetic_matches_numpy(tmp_path, target):
  tiny = np.finfo(np.float32).tiny
  x = np.concatenate(
    [
      np.geomspace(1e-45, 3e38, 100001),  # every binade, denormals first
      np.linspace(0.5, 2, 50001),  # where m crosses sqrt(2) and log(x) crosses 0
      [tiny, tiny / 2, 1.4142135, 1.4142137, 0.70710677],
      SPECIAL,
    ]
  ).astype(np.float32)
  y = run_without_call(lambda a: a.log(), x, tmp_path / target, target, "logf")
  with np.errstate(divide="ignore", invalid="ignore"):
    ref = np.log(x.astype(np.float64))
    np.testing.assert_array_equal(y[-len(SPECIAL) :], np.log(x[-len(SPECIAL) :]))
  finite = np.isfinite(ref) & (ref != 0)
  ulp = np.spacing(np.abs(ref[finite]).astype(np.float32)).astype(np.float64)
  assert (np.abs(y[finite] - ref[finite]) / ulp).max() < 2


def _lrn_model(beta: float, bias: float):
  node = helper.make_node("LRN", ["x"], ["y"], size=5, alpha=1e-4, beta=beta, bias=bias)
  graph = helper.make_graph(
    [node],
    "lrn",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 9, 11])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 9, 11])],
  )
  return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("beta, bias", [(0.75, 1.0), (0.6, 2.0), (0.75, 0.0)])
def test_lrn_without_powf_matches_onnxruntime(tmp_path, beta, bias):
  model = _lrn_model(beta, bias)
  # large values: the window sum of squares, not the bias, sets the power
  x = (np.random.default_rng(0).standard_normal((1, 16, 9, 11)) * 60).astype(np.float32)
  art = aot.compile_model(model, out_dir=tmp_path)
  src = "".join(p.read_text() for p in (art.dir / "src").glob("*.c"))
  # (a zero bias may leave a zero base: the power then stays powf)
  assert ("powf(" in src) == (bias == 0.0) and "logf(" not in src
  want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
  np.testing.assert_allclose(aot.load(art)(x), want, rtol=1e-5, atol=1e-6)
