"""Two-layer post-norm (BERT-style) transformer encoder: seq 128, width 256, 4 heads of 64, MLP 1024 with exact GELU."""

from __future__ import annotations

import functools
import math

import numpy as np

import aot
from aot import Tensor

from . import ReferenceModel
from . import _numpy_ref as ref

SEED = 4
SEQ, WIDTH, HEADS, HIDDEN, LAYERS = 128, 256, 4, 1024, 2
HEAD_DIM = WIDTH // HEADS
# pinned by tests/test_models.py: 14 per layer: q, k, v projections; scores; exp(scores - max); probabilities;
# probabilities @ v; output projection + residual; layernorm as two (x - mean, then the normalised output); MLP up +
# GELU; MLP down + residual; layernorm as two
EXPECTED_KERNELS = 28

# argument order of `layer` after the activations; torch-style (out, in) linear weights
LAYER_PARAMS = (
  "wq",
  "bq",
  "wk",
  "bk",
  "wv",
  "bv",
  "wo",
  "bo",
  "ln1_w",
  "ln1_b",
  "w1",
  "b1",
  "w2",
  "b2",
  "ln2_w",
  "ln2_b",
)


# One traced body shared by both layers: the weights are arguments, not constants captured in the trace.
@aot.function
def layer(x, wq, bq, wk, bk, wv, bv, wo, bo, ln1_w, ln1_b, w1, b1, w2, b2, ln2_w, ln2_b):
  n, s, d = x.shape
  heads = lambda t: t.reshape(n, s, HEADS, HEAD_DIM).permute(0, 2, 1, 3)  # -> (n, heads, s, head_dim)
  q, k, v = heads(x.linear(wq, bq)), heads(x.linear(wk, bk)), heads(x.linear(wv, bv))
  att = (q @ k.transpose(-2, -1) / math.sqrt(HEAD_DIM)).softmax(-1)
  a = (att @ v).permute(0, 2, 1, 3).reshape(n, s, d).linear(wo, bo)
  x = (x + a).layernorm(ln1_w, ln1_b)
  h = x.linear(w1, b1).gelu(approximate="none").linear(w2, b2)
  return (x + h).layernorm(ln2_w, ln2_b)


def _weights() -> dict[str, np.ndarray]:
  rng = np.random.default_rng(SEED)
  f32 = lambda a: np.asarray(a, dtype=np.float32)
  p = {}
  for i in range(LAYERS):
    # 1/sqrt(fan_in) everywhere keeps q.k/sqrt(64) and the residual branches of order 1
    for w, b, fout, fin in (
      ("wq", "bq", WIDTH, WIDTH),
      ("wk", "bk", WIDTH, WIDTH),
      ("wv", "bv", WIDTH, WIDTH),
      ("wo", "bo", WIDTH, WIDTH),
      ("w1", "b1", HIDDEN, WIDTH),
      ("w2", "b2", WIDTH, HIDDEN),
    ):
      p[f"l{i}.{w}"] = f32(rng.standard_normal((fout, fin)) / np.sqrt(fin))
      p[f"l{i}.{b}"] = f32(rng.uniform(-1, 1, fout) / np.sqrt(fin))
    for ln in ("ln1", "ln2"):
      p[f"l{i}.{ln}_w"] = f32(rng.uniform(0.5, 1.5, WIDTH))
      p[f"l{i}.{ln}_b"] = f32(rng.standard_normal(WIDTH) * 0.1)
  return p


@functools.lru_cache(maxsize=None)
def build() -> ReferenceModel:
  p = _weights()

  def forward(x: Tensor) -> Tensor:
    for i in range(LAYERS):
      # constants are wrapped per call so every trace owns its own weight Tensors
      x = layer(x, *(Tensor(p[f"l{i}.{n}"]) for n in LAYER_PARAMS))
    return x

  def reference(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    n, s, d = x.shape
    for i in range(LAYERS):
      w = {k: p[f"l{i}.{k}"] for k in LAYER_PARAMS}
      q, k, v = (ref.linear(x, w[f"w{c}"], w[f"b{c}"]).reshape(n, s, HEADS, HEAD_DIM) for c in "qkv")
      att = ref.softmax(np.einsum("nqhd,nkhd->nhqk", q, k) / math.sqrt(HEAD_DIM))
      a = ref.linear(np.einsum("nhqk,nkhd->nqhd", att, v).reshape(n, s, d), w["wo"], w["bo"])
      x = ref.layernorm(x + a, w["ln1_w"], w["ln1_b"])
      h = ref.linear(ref.gelu(ref.linear(x, w["w1"], w["b1"])), w["w2"], w["b2"])
      x = ref.layernorm(x + h, w["ln2_w"], w["ln2_b"])
    return x.astype(np.float32)

  return ReferenceModel("transformer", forward, (("x", (1, SEQ, WIDTH), np.float32),), reference, EXPECTED_KERNELS)
