"""ONNX attention operators: Attention (with its masks, causal and sliding windows, grouped-query heads and a KV
cache), RotaryEmbedding and the preview FlexAttention."""

from __future__ import annotations

import math

import numpy as np

from aot.core.dtype import dtypes
from aot.frontends.onnx import Unsupported, onnx_dtype, op
from aot.frontends.onnx_ops_nn import _iota, _mm
from aot.frontends.tensor import Tensor

# *** attention ***


def _heads(x, h):
  B, S, D = x.shape
  return x.reshape(B, S, h, D // h).permute(0, 2, 1, 3)


@op("Attention", since=23)
def attention(
  n,
  q,
  k,
  v,
  attn_mask=None,
  past_key=None,
  past_value=None,
  nonpad_kv_seqlen=None,
  is_causal=0,
  kv_num_heads=None,
  q_num_heads=None,
  qk_matmul_output_mode=0,
  scale=None,
  softcap=0.0,
  softmax_precision=None,
  left_window_size=-1,
  right_window_size=-1,
):
  three = q.ndim == 3
  if three:
    q, k, v = _heads(q, q_num_heads), _heads(k, kv_num_heads), _heads(v, kv_num_heads)
  if past_key is not None:
    k = Tensor.cat([past_key, k], 2)
  if past_value is not None:
    v = Tensor.cat([past_value, v], 2)
  present_k, present_v = k, v
  B, Hq, Sq, Dh = q.shape
  Skv = k.shape[2]
  dt = q.dtype
  sc = math.sqrt(scale if scale is not None else 1 / math.sqrt(Dh))
  bias = _attention_bias(
    n, q, attn_mask, Sq, Skv, is_causal, past_key, nonpad_kv_seqlen, left_window_size, right_window_size
  )
  if Hq != k.shape[1]:
    # grouped-query: each kv head serves Hq/Hkv consecutive query heads
    r = Hq // k.shape[1]
    k, v = [t.unsqueeze(2).expand(B, t.shape[1], r, Skv, t.shape[3]).reshape(B, Hq, Skv, t.shape[3]) for t in (k, v)]
  qk = _mm((q * sc).cast(dt), (k * sc).cast(dt).transpose(-1, -2))
  if softcap:
    qk = ((qk / softcap).tanh() * softcap).cast(dt)
  qkb = qk + bias if bias is not None else qk
  qk_out = qkb if qk_matmul_output_mode == 2 else qk
  sm_in = qkb.cast(onnx_dtype(softmax_precision)) if softmax_precision else qkb
  p = _safe_softmax(sm_in)
  if bias is not None:
    p = (bias.max(-1, keepdim=True) == float("-inf")).where(0.0, p)
  if qk_matmul_output_mode == 3:
    qk_out = p
  y = _mm(p.cast(dt), v)
  if three:
    y = y.permute(0, 2, 1, 3).reshape(B, Sq, -1)
  return y, present_k, present_v, qk_out.cast(dt)


def _safe_softmax(x):
  """Softmax whose fully masked (all -inf) rows give 0 rather than nan."""
  m = x.max(-1, keepdim=True)
  m = (m == float("-inf")).where(0.0, m)
  e = (x - m).exp()
  s = (
    e.cast(dtypes.float32).sum(-1, keepdim=True).cast(e.dtype) if e.dtype == dtypes.float16 else e.sum(-1, keepdim=True)
  )
  return e / (s == 0).where(1.0, s)


def _attention_bias(n, q, mask, Sq, Skv, causal, past_key, nonpad, left, right):
  """The additive bias: the mask (bool -> 0/-inf), padded to the kv length, plus causal/window/padding terms."""
  dt = q.dtype
  bias = None
  if mask is not None:
    if mask.shape[-1] < Skv:
      padv = False if mask.dtype == dtypes.bool else float("-inf")
      mask = mask.pad([(0, 0)] * (mask.ndim - 1) + [(0, Skv - mask.shape[-1])], padv)
    bias = mask.where(Tensor(0.0).cast(dt), float("-inf")) if mask.dtype == dtypes.bool else mask.cast(dt)
  i, j = _iota(Sq, 0, 2), _iota(Skv, 1, 2)
  if nonpad is not None and past_key is None:
    off = (nonpad.cast(dtypes.int64) - Sq).reshape(-1, 1, 1, 1)
  else:
    off = past_key.shape[2] if past_key is not None else 0
  allowed = None
  if causal:
    allowed = j <= i + off
  if left >= 0:
    allowed = _and(allowed, (i + off) - j <= left)
  if right >= 0:
    allowed = _and(allowed, j - (i + off) <= right)
  if allowed is not None:
    term = allowed.where(Tensor(0.0).cast(dt), float("-inf"))
    bias = term if bias is None else bias + term
  if nonpad is not None:
    pm = (_iota(Skv, 0, 1) < nonpad.cast(dtypes.int64).reshape(-1, 1)).reshape(-1, 1, 1, Skv)
    term = pm.where(Tensor(0.0).cast(dt), float("-inf"))
    bias = term if bias is None else bias + term
  return bias


def _and(a, b):
  return b if a is None else a & b


@op("RotaryEmbedding", since=23)
def rotary_embedding(n, x, cos_cache, sin_cache, position_ids=None, interleaved=0, num_heads=0, rotary_embedding_dim=0):
  shape = x.shape
  if x.ndim == 4:
    x = x.permute(0, 2, 1, 3)
  else:
    x = x.reshape(shape[0], shape[1], num_heads, -1)
  D = x.shape[3]
  rd = rotary_embedding_dim or D
  if position_ids is not None:
    cos_cache, sin_cache = cos_cache.take(position_ids, 0), sin_cache.take(position_ids, 0)
  cos, sin = cos_cache.unsqueeze(2), sin_cache.unsqueeze(2)
  xr, rest = x[..., :rd], x[..., rd:]
  if interleaved:
    x1, x2 = xr[..., 0::2], xr[..., 1::2]
  else:
    x1, x2 = xr[..., : rd // 2], xr[..., rd // 2 :]
  real, imag = (cos * x1 - sin * x2).cast(x.dtype), (sin * x1 + cos * x2).cast(x.dtype)
  if interleaved:
    rot = Tensor.stack([real, imag], axis=-1).reshape(xr.shape)
  else:
    rot = Tensor.cat([real, imag], -1)
  out = Tensor.cat([rot, rest], -1) if rd < D else rot
  return out.reshape(shape) if len(shape) == 3 else out.permute(0, 2, 1, 3)


# *** FlexAttention: attention with user subgraphs applied to the whole score and probability tensors ***

_FLEX_PRECISION = {1: dtypes.float32, 10: dtypes.float16, 11: dtypes.float64}


@op("FlexAttention", since=1, domain="ai.onnx.preview")
def flex_attention(n, q, k, v, prob_mod=None, score_mod=None, scale=None, softmax_precision=None):
  B, Hq, L, E = q.shape
  Hkv, S = k.shape[1], k.shape[2]
  if Hq != Hkv:
    # grouped-query: each kv head serves Hq/Hkv consecutive query heads
    r = Hq // Hkv
    k, v = [t.unsqueeze(2).expand(B, Hkv, r, S, t.shape[3]).reshape(B, Hq, S, t.shape[3]) for t in (k, v)]
  if softmax_precision is not None and softmax_precision not in _FLEX_PRECISION:
    raise Unsupported(f"softmax_precision {softmax_precision}")
  cd = (
    _FLEX_PRECISION[softmax_precision]
    if softmax_precision is not None
    else (dtypes.float32 if q.dtype.itemsize < 4 else q.dtype)
  )
  # Q and K are each pre-scaled by sqrt(scale), computed in float32 and rounded to the input type, as the reference does
  sq = float(np.array(np.sqrt(np.float32(scale if scale is not None else 1.0 / np.sqrt(E))), dtype=q.dtype.np))
  scores = _mm((q * sq).cast(q.dtype), (k * sq).cast(q.dtype).transpose(-1, -2)).cast(cd)
  if score_mod is not None:
    scores = _one_output(n, score_mod, scores).cast(cd)
  e = (scores - scores.max(-1, keepdim=True)).exp()
  p = e / e.sum(-1, keepdim=True)
  if prob_mod is not None:
    p = _one_output(n, prob_mod, p).cast(cd)
  return _mm(p, v.cast(cd)).cast(v.dtype)


def _one_output(n, g, t: Tensor) -> Tensor:
  if len(g.input) != 1 or len(g.output) != 1:
    raise Unsupported("a FlexAttention modifier takes one input and gives one output")
  (out,) = n.subgraph(g, [t])
  if not isinstance(out, Tensor):
    raise Unsupported("the FlexAttention modifier subgraph cannot be compiled")
  return out
