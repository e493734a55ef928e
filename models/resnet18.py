"""ResNet-18 (torchvision layout, inference-mode batchnorm) on one 224x224 RGB image -> 1000 logits."""

from __future__ import annotations

import functools

import numpy as np

from aot import Tensor

from . import ReferenceModel
from . import _numpy_ref as ref

SEED = 3
# pinned by tests/test_models.py: conv1+bn+relu; maxpool; 15 convs (each with its bn, residual add and relu; the 1x1
# downsample conv fuses into the block's second conv, which reads it once per output); the last conv fuses into the
# global average pool, which reads each of its outputs once; fc. The 6 stride-1 3x3 convs of 128 and 256 channels (28x28
# and 14x14 maps) run as Winograd's F(2x2, 3x3) (frontends/winograd.py): 4 kernels more each (the input transform
# along each axis, the output transform's first axis, the products apart from the epilogue)
EXPECTED_KERNELS = 43

# (stage, block, Cin, Cout, stride); the first block of stages 2-4 halves the resolution and needs a 1x1/2 downsample
BLOCKS = tuple(
  (s + 1, b, cin if b == 0 else cout, cout, 2 if (b == 0 and s > 0) else 1)
  for s, (cin, cout) in enumerate(((64, 64), (64, 128), (128, 256), (256, 512)))
  for b in range(2)
)


def _weights() -> dict[str, np.ndarray]:
  rng = np.random.default_rng(SEED)
  f32 = lambda a: np.asarray(a, dtype=np.float32)
  p = {}

  def conv(name, cout, cin, k):
    p[f"{name}.weight"] = f32(rng.standard_normal((cout, cin, k, k)) * np.sqrt(2.0 / (cin * k * k)))

  def bn(name, c):
    p[f"{name}.weight"] = f32(rng.uniform(0.5, 1.5, c))
    p[f"{name}.bias"] = f32(rng.standard_normal(c) * 0.1)

  conv("conv1", 64, 3, 7)
  bn("bn1", 64)
  for s, b, cin, cout, stride in BLOCKS:
    pre = f"layer{s}.{b}"
    conv(f"{pre}.conv1", cout, cin, 3)
    bn(f"{pre}.bn1", cout)
    conv(f"{pre}.conv2", cout, cout, 3)
    bn(f"{pre}.bn2", cout)
    if stride != 1 or cin != cout:
      conv(f"{pre}.downsample.0", cout, cin, 1)
      bn(f"{pre}.downsample.1", cout)
  p["fc.weight"] = f32(rng.standard_normal((1000, 512)) / np.sqrt(512))
  p["fc.bias"] = f32(rng.uniform(-1, 1, 1000) / np.sqrt(512))
  # Running stats taken from a calibration image, as a trained net's would be: arbitrary ones let the relu means
  # pile up through the residual sums (logit std ~6); calibrated ones keep every activation of order 1.
  _reference(p, rng.standard_normal((1, 3, 224, 224)), calibrate=rng)
  return p


def _reference(p: dict, x: np.ndarray, calibrate: np.random.Generator | None = None) -> np.ndarray:
  def bn(x, n):
    if calibrate is not None:
      c = x.shape[1]
      p[f"{n}.running_mean"] = (x.mean(axis=(0, 2, 3)) + calibrate.standard_normal(c) * 0.1).astype(np.float32)
      p[f"{n}.running_var"] = (x.var(axis=(0, 2, 3)) * calibrate.uniform(0.5, 1.5, c)).astype(np.float32)
    return ref.batchnorm(x, p[f"{n}.running_mean"], p[f"{n}.running_var"], p[f"{n}.weight"], p[f"{n}.bias"])

  x = ref.relu(bn(ref.conv2d(x.astype(np.float64), p["conv1.weight"], stride=2, padding=3), "bn1"))
  x = ref.max_pool2d(x, 3, stride=2, padding=1)
  for s, b, cin, cout, stride in BLOCKS:
    pre = f"layer{s}.{b}"
    out = ref.relu(bn(ref.conv2d(x, p[f"{pre}.conv1.weight"], stride=stride, padding=1), f"{pre}.bn1"))
    out = bn(ref.conv2d(out, p[f"{pre}.conv2.weight"], padding=1), f"{pre}.bn2")
    if f"{pre}.downsample.0.weight" in p:
      x = bn(ref.conv2d(x, p[f"{pre}.downsample.0.weight"], stride=stride), f"{pre}.downsample.1")
    x = ref.relu(out + x)
  return ref.linear(x.mean(axis=(2, 3)), p["fc.weight"], p["fc.bias"]).astype(np.float32)


@functools.lru_cache(maxsize=None)
def build() -> ReferenceModel:
  p = _weights()

  def forward(x: Tensor) -> Tensor:
    # constants are wrapped per call so every trace owns its own weight Tensors
    w = {k: Tensor(v) for k, v in p.items()}
    bn = lambda x, n: x.batchnorm(w[f"{n}.running_mean"], w[f"{n}.running_var"], w[f"{n}.weight"], w[f"{n}.bias"])
    x = bn(x.conv2d(w["conv1.weight"], stride=2, padding=3), "bn1").relu().max_pool2d(3, stride=2, padding=1)
    for s, b, cin, cout, stride in BLOCKS:
      pre = f"layer{s}.{b}"
      out = bn(x.conv2d(w[f"{pre}.conv1.weight"], stride=stride, padding=1), f"{pre}.bn1").relu()
      out = bn(out.conv2d(w[f"{pre}.conv2.weight"], padding=1), f"{pre}.bn2")
      if f"{pre}.downsample.0.weight" in w:
        x = bn(x.conv2d(w[f"{pre}.downsample.0.weight"], stride=stride), f"{pre}.downsample.1")
      x = (out + x).relu()
    return x.mean(axis=(2, 3)).linear(w["fc.weight"], w["fc.bias"])

  def reference(x: np.ndarray) -> np.ndarray:
    return _reference(p, x)

  return ReferenceModel("resnet18", forward, (("x", (1, 3, 224, 224), np.float32),), reference, EXPECTED_KERNELS)
