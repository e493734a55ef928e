"""The real architectures that ship with onnx (backend/test/data/light), with seeded random weights in place of their
constant 0.02 ones: they compile, match onnxruntime (on c, on 2 threads bitwise as on 1), and keep their pinned kernel
counts."""
import os
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import aot
from aot.testing import randomize_constant_weights, assert_kernel_count
from conftest import TARGETS

LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")

# pinned kernel counts: one kernel per conv (with its batchnorm, bias, relu and residual add fused), plus pools,
# concatenations that feed windowed reads, fully-connected layers and the softmax
KERNELS = {
  "bvlc_alexnet": 17, "densenet121": 180, "inception_v1": 50, "inception_v2": 56, "resnet50": 53,
  "shufflenet": 53, "squeezenet": 23, "vgg19": 21, "zfnet512": 16,
}

def light_model(name: str):
  """One of the light models, its constant weights made seeded random ones."""
  return randomize_constant_weights(onnx.load(os.path.join(LIGHT, f"light_{name}.onnx")), seed=0)

def assert_matches_onnxruntime(art, model, name: str):
  """The artifact's output on a seeded input is within 1e-4 (relative to the largest value) of onnxruntime's."""
  ort.set_default_logger_severity(3)
  x = np.random.default_rng(1).standard_normal(art.inputs[0].shape).astype(np.float32)
  want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
    None, {art.inputs[0].name: x})[0]
  got = aot.load(art)(x)
  assert got.shape == want.shape
  rel = np.max(np.abs(got - want)) / np.max(np.abs(want))
  assert rel <= 1e-4, f"{name}: max relative error {rel:.2e}"
  return x, got

@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_light_model_matches_onnxruntime(name, target, tmp_path):
  model = light_model(name)
  art = aot.compile_model(model, out_dir=tmp_path / name, name=name, target=target)
  assert_kernel_count(art, KERNELS[name])
  x, one = assert_matches_onnxruntime(art, model, name)
  # on 2 threads (the tests run on 1), bitwise the same: on c only, where the split is the same runtime code as on
  # llvm (a run of densenet121 costs seconds)
  if target == "c":
    np.testing.assert_array_equal(aot.load(art, threads=2)(x), one, err_msg=f"{name}: 2 threads differ from 1")
