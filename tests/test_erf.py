"""float32 erf is one rational function of x on [-4, 4] (codegen/opt.py _erf32), computed without a select between
branches so that it vectorises: within 4e-7 of erf over the whole range (6 ulp; onnxruntime's is within 1 ulp) and
of onnxruntime's own Erf, relative accuracy near 0, exact at +-0, +-inf and NaN, never past +-1, and exact GELU on
it within the unary tests' tolerance; the same under each C compiler and the llvm target."""

import math

import numpy as np
import pytest
from onnx import TensorProto, helper

import aot
from aot.codegen.opt import optimize
from aot.compiler import resolve
from aot.ir import Ops
from aot.schedule import schedule

ERF_ABS = 4e-7
# near 0 relative to erf: 8 ulp (the normal floats only; a denormal's own spacing is coarser)
ERF_REL = 8 * 2.0**-24
EXACT = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 4.0, -4.0, 1e30, -1e30, 1e-40, -1e-40], np.float32)


def _inputs() -> np.ndarray:
  tiny = np.geomspace(np.finfo(np.float32).tiny, 1.0, 2001)
  return np.concatenate([np.linspace(-6, 6, 40001), tiny, -tiny, EXACT]).astype(np.float32)


def test_erf_is_one_rational_without_branches():
  # no exp and no select on the argument's size: one division, and selects only for the clamps to +-4 and +-1
  t = resolve(lambda a: a.erf(), [np.zeros(64, np.float32)])
  (k,) = schedule(t.outputs, t.inputs).kernels
  topo = optimize(k.ast).toposort()
  ops = [u.op for u in topo]
  assert Ops.EXP not in ops and Ops.ROUND not in ops and Ops.ERF not in ops
  assert ops.count(Ops.DIV) == 1
  limits = {abs(c.arg) for u in topo if u.op is Ops.CMPLT for c in u.src if c.op is Ops.CONST}
  assert limits == {4.0, 1.0}


@pytest.mark.parametrize("build", ["c:clang-19", "c:gcc", "c:clang-14", "llvm"])
def test_erf_and_gelu_match_numpy_and_onnxruntime(build, tmp_path, monkeypatch):
  import onnxruntime as ort
  from test_compilers import need

  target, _, compiler = build.partition(":")
  if compiler:
    need(compiler)
    monkeypatch.setenv("CC", compiler)
  x = _inputs()
  art = aot.compile_model(lambda a: (a.erf(), a.gelu()), [x], out_dir=tmp_path, target=target, name="m")
  if target == "c":
    source = (art.dir / "src" / "model.c").read_text()
    assert "erff(" not in source and "expf(" not in source
  loaded = aot.load(art)
  try:
    y, g = loaded(x)
  finally:
    loaded.close()
  ref = np.array([math.erf(float(v)) for v in x])
  finite = np.isfinite(x)
  assert np.abs(y[finite] - ref[finite]).max() < ERF_ABS
  normal = finite & (np.abs(x) >= np.finfo(np.float32).tiny) & (np.abs(x) < 1)
  assert (np.abs(y[normal] - ref[normal]) / np.abs(ref[normal])).max() < ERF_REL
  assert np.abs(y[finite]).max() <= 1.0
  # exact: NaN, +-1 at the infinities, zeros keeping their sign
  special = y[-len(EXACT) :]
  assert np.isnan(special[0]) and list(special[1:3]) == [1.0, -1.0]
  assert np.array_equal(np.signbit(special[3:5]), [False, True]) and not special[3:5].any()

  graph = helper.make_graph(
    [helper.make_node("Erf", ["x"], ["y"])],
    "erf",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [x.size])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [x.size])],
  )
  model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
  sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
  theirs = sess.run(None, {"x": x})[0]
  np.testing.assert_allclose(y, theirs, rtol=0, atol=ERF_ABS + 1e-7)  # NaN where theirs is NaN

  # exact GELU within the unary tests' tolerance (tests/test_ops.py TRANS)
  x64 = x[finite].astype(np.float64)
  want = 0.5 * x64 * (1.0 + np.array([math.erf(v / math.sqrt(2.0)) for v in x64]))
  np.testing.assert_allclose(g[finite], want, rtol=1e-5, atol=1e-6)
  assert np.isnan(g[-len(EXACT)])
