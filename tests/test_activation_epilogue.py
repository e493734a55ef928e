"""A convolution followed by an activation that reads its input twice (SiLU = x * sigmoid(x), YOLOv8's after every
conv; HardSwish) or computes an exp (Sigmoid): one kernel, the microkernel's contraction and then the activation as an
elementwise epilogue pass over the result (the microkernel's fused steps take a chain of one-input ops only:
codegen/lower/contract.py fused_steps). That pass runs one loop over each channel's plane (codegen/render/opt.py
_merge_inner), not one per row, whose remainder ran scalar."""

import re

import numpy as np
import pytest
from conftest import TARGETS, ort_session, outputs_on_threads
from onnx import TensorProto, helper

import aot
from aot.testing import assert_kernel_count

rng = np.random.default_rng(7)
# an odd plane (13 x 11 = 143 positions): rows of 11 leave a remainder after any vector width
X_SHAPE, COUT = (1, 8, 13, 11), 20


def _conv_then(act: str):
  node = helper.make_node
  nodes = [node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1])]
  if act == "silu":
    nodes += [node("Sigmoid", ["c"], ["s"]), node("Mul", ["c", "s"], ["y"])]
  else:
    nodes.append(node(act, ["c"], ["y"]))
  w = rng.standard_normal((COUT, X_SHAPE[1], 3, 3), dtype=np.float32) * 0.3
  b = rng.standard_normal(COUT, dtype=np.float32)
  g = helper.make_graph(
    nodes,
    "g",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, X_SHAPE)],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    [helper.make_tensor(n, TensorProto.FLOAT, a.shape, a.reshape(-1)) for n, a in (("w", w), ("b", b))],
  )
  return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("act", ["silu", "Sigmoid", "HardSwish"])
def test_conv_activation_is_one_kernel_matching_onnxruntime(act, target, tmp_path):
  model = _conv_then(act)
  assert_kernel_count(model, 1)
  x = rng.standard_normal(X_SHAPE, dtype=np.float32) * 2
  want = ort_session(model).run(None, {"x": x})[0]
  art = aot.compile_model(model, out_dir=tmp_path / target, target=target, name="m")
  one, two = outputs_on_threads(art, {"x": x}, threads=(1, 2))
  np.testing.assert_array_equal(one, two)
  np.testing.assert_allclose(one, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
  if target == "c":
    # the epilogue's loop runs over a whole plane, never a row of 11
    source = "".join(p.read_text() for p in (art.dir / "src").glob("*.c"))
    epilogue = re.search(r"void m_f0\(.*?\n}\n", source, re.S).group(0)
    loops = re.findall(r"for \(int r\d+ = 0; r\d+ < (\d+); r\d+\+\+\)", epilogue)
    assert loops == ["143"]
