"""MNIST CNN: two conv-conv-batchnorm-maxpool stages, then one linear layer to 10 logits."""

from __future__ import annotations

import functools

import numpy as np

from aot import Tensor

from . import ReferenceModel
from . import _numpy_ref as ref

SEED = 2
# pinned by tests/test_models.py: conv1+relu; conv2+relu+batchnorm+maxpool (2x2/2 windows read each conv output once,
# so the conv fuses into the pool); conv3+relu; conv4+relu+batchnorm+maxpool; flatten+linear
EXPECTED_KERNELS = 5

# (name, Cout, Cin, K) of the four unpadded stride-1 convs; spatial 28 -> 24 -> 20 -> pool 10 -> 8 -> 6 -> pool 3
CONVS = (("c1", 32, 1, 5), ("c2", 32, 32, 5), ("c3", 64, 32, 3), ("c4", 64, 64, 3))


def _weights() -> dict[str, np.ndarray]:
  rng = np.random.default_rng(SEED)
  f32 = lambda a: np.asarray(a, dtype=np.float32)
  p = {}
  for name, cout, cin, k in CONVS:
    fan_in = cin * k * k
    p[f"{name}_w"] = f32(rng.standard_normal((cout, cin, k, k)) * np.sqrt(2.0 / fan_in))  # He: each conv feeds a relu
    p[f"{name}_b"] = f32(rng.uniform(-1, 1, cout) / np.sqrt(fan_in))
  for name, c in (("bn1", 32), ("bn2", 64)):
    p[f"{name}_mean"] = f32(rng.standard_normal(c) * 0.1)
    p[f"{name}_var"] = f32(rng.uniform(0.5, 1.5, c))
    p[f"{name}_w"] = f32(rng.uniform(0.5, 1.5, c))
    p[f"{name}_b"] = f32(rng.standard_normal(c) * 0.1)
  p["fc_w"] = f32(rng.standard_normal((10, 576)) / np.sqrt(576))
  p["fc_b"] = f32(rng.uniform(-1, 1, 10) / np.sqrt(576))
  return p


@functools.lru_cache(maxsize=None)
def build() -> ReferenceModel:
  p = _weights()

  def forward(x: Tensor) -> Tensor:
    # constants are wrapped per call so every trace owns its own weight Tensors
    w = {k: Tensor(v) for k, v in p.items()}
    conv = lambda x, n: x.conv2d(w[f"{n}_w"], w[f"{n}_b"]).relu()
    bn = lambda x, n: x.batchnorm(w[f"{n}_mean"], w[f"{n}_var"], w[f"{n}_w"], w[f"{n}_b"])
    x = bn(conv(conv(x, "c1"), "c2"), "bn1").max_pool2d(2)
    x = bn(conv(conv(x, "c3"), "c4"), "bn2").max_pool2d(2)
    return x.flatten(1).linear(w["fc_w"], w["fc_b"])

  def reference(x: np.ndarray) -> np.ndarray:
    conv = lambda x, n: ref.relu(ref.conv2d(x, p[f"{n}_w"], p[f"{n}_b"]))
    bn = lambda x, n: ref.batchnorm(x, p[f"{n}_mean"], p[f"{n}_var"], p[f"{n}_w"], p[f"{n}_b"])
    x = ref.max_pool2d(bn(conv(conv(x.astype(np.float64), "c1"), "c2"), "bn1"), 2)
    x = ref.max_pool2d(bn(conv(conv(x, "c3"), "c4"), "bn2"), 2)
    return ref.linear(x.reshape(x.shape[0], -1), p["fc_w"], p["fc_b"]).astype(np.float32)

  return ReferenceModel("mnist", forward, (("x", (1, 1, 28, 28), np.float32),), reference, EXPECTED_KERNELS)
