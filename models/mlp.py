"""MLP on flattened MNIST-sized input: 784 -> 256 -> relu -> 128 -> relu -> 10."""

from __future__ import annotations

import functools

import numpy as np

from aot import Tensor

from . import ReferenceModel
from . import _numpy_ref as ref

SEED = 1
BATCH = 8
# pinned by tests/test_models.py: one kernel per linear layer (matmul + bias + relu fuse); each hidden activation is
# read by the next matmul inside its output-column loop, where it does not vary, so it is stored rather than recomputed
EXPECTED_KERNELS = 3


def _weights() -> dict[str, np.ndarray]:
  rng = np.random.default_rng(SEED)
  p = {}
  for i, (fin, fout, gain) in enumerate(((784, 256, 2.0), (256, 128, 2.0), (128, 10, 1.0))):
    # He std for layers feeding a relu, 1/sqrt(fan_in) for the logits, so activations stay of order 1
    p[f"w{i}"] = (rng.standard_normal((fout, fin)) * np.sqrt(gain / fin)).astype(np.float32)
    p[f"b{i}"] = rng.uniform(-1, 1, fout).astype(np.float32) / np.float32(np.sqrt(fin))
  return p


@functools.lru_cache(maxsize=None)
def build() -> ReferenceModel:
  p = _weights()

  def forward(x: Tensor) -> Tensor:
    # constants are wrapped per call so every trace owns its own weight Tensors
    w = {k: Tensor(v) for k, v in p.items()}
    x = x.linear(w["w0"], w["b0"]).relu()
    x = x.linear(w["w1"], w["b1"]).relu()
    return x.linear(w["w2"], w["b2"])

  def reference(x: np.ndarray) -> np.ndarray:
    x = ref.relu(ref.linear(x.astype(np.float64), p["w0"], p["b0"]))
    x = ref.relu(ref.linear(x, p["w1"], p["b1"]))
    return ref.linear(x, p["w2"], p["b2"]).astype(np.float32)

  return ReferenceModel("mlp", forward, (("x", (BATCH, 784), np.float32),), reference, EXPECTED_KERNELS)
