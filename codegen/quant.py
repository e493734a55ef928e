"""int8 contractions: the compile-time half of the runtime's int8 microkernel (runtime_c/aot_qgemm.c).

A quantized matmul or convolution sums products of uint8 (or int8) activations and int8 weights in int32, then
requantizes: out = clamp(rint(float(acc) * x_scale * w_scale[n] / y_scale) + y_zero), round half to even, as
onnxruntime computes QLinearConv/QLinearMatMul and the DequantizeLinear -> Conv/MatMul -> QuantizeLinear groups it
fuses into them. The weights are packed here, ahead of time, in the tiles the microkernel reads, with their column
sums for the activations' zero point: sum_k (a - z) w = sum_k a w - z sum_k w."""
from __future__ import annotations
import numpy as np

# columns of a packed weight tile (QNR in runtime_c/aot_runtime.h): two 16-lane int32 vectors of the microkernel
QNR = 32
# k steps one vpdpbusd lane sums: the packed k axis is padded to a multiple of this
K_GROUP = 4

def pack_weights(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(packed, col_sum) of int8 weights w[K][N]: packed as [N/QNR][K4/K_GROUP][QNR][K_GROUP] int8 (zero padded to
  whole tiles and groups), col_sum[n] = sum_k w[k][n] in int32."""
  if w.dtype != np.int8 or w.ndim != 2: raise ValueError(f"pack_weights: expected int8 [K, N] weights, got {w.dtype} {w.shape}")
  K, N = w.shape
  K4, NP = -(-K // K_GROUP) * K_GROUP, -(-N // QNR) * QNR
  padded = np.zeros((K4, NP), np.int8)
  padded[:K, :N] = w
  packed = padded.reshape(K4 // K_GROUP, K_GROUP, NP // QNR, QNR).transpose(2, 0, 3, 1)
  return np.ascontiguousarray(packed).reshape(-1), w.astype(np.int32).sum(0, dtype=np.int32)

def requantize(acc: np.ndarray, scale: np.ndarray, zero: int, dtype) -> np.ndarray:
  """acc (int32) to dtype as onnxruntime requantizes: float32 product, round half to even, add the zero, saturate."""
  info = np.iinfo(dtype)
  r = np.rint(acc.astype(np.float32) * np.asarray(scale, np.float32))
  return np.clip(r + zero, info.min, info.max).astype(dtype)
