"""Narrow storage types (aot/core/dtype.py: NARROW) as Tensor ops: decoding to float32, encoding from it exactly as
ONNX's Cast says (round to nearest even, saturate on or off, each variant's NaN/Inf codes, e8m0's rounding modes), and
the packing of the 4- and 2-bit types. Integer and bit ops only, so every target renders them as it renders any
kernel."""

from __future__ import annotations

import numpy as np

from aot.core.dtype import Narrow, dtypes, narrow_of
from aot.errors import InvalidValueError
from aot.frontends.tensor import Tensor

F32, I32, U32 = dtypes.float32, dtypes.int32, dtypes.uint32
NAN = float("nan")


class Stored(Tensor):
  """A tensor of a narrow type: the storage tensor (codes, or the values of the ints) and its type."""

  __slots__ = ("fmt",)

  def __init__(self, t: Tensor, fmt: Narrow):
    super().__init__(t.uop)
    self.fmt = fmt


def fmt_of(t) -> Narrow | None:
  return getattr(t, "fmt", None)


def from_array(arr: np.ndarray) -> Tensor:
  """A constant of a narrow numpy (ml_dtypes) type as a Stored tensor; any other array as itself."""
  f = narrow_of(arr.dtype)
  if f is None:
    return Tensor(arr, arr.dtype)
  return Stored(Tensor(storage_array(arr, f), f.storage.np), f)


def storage_array(arr: np.ndarray, f: Narrow) -> np.ndarray:
  """ml_dtypes keeps one element a byte (or two for bf16): its code bits, which for the ints are not sign-extended."""
  if f.kind in ("i", "u"):
    return np.asarray(arr).astype(f.storage.np)
  arr = np.asarray(arr)
  return (arr if arr.flags.c_contiguous else arr.copy()).view(f.storage.np)  # ascontiguousarray makes a scalar 1-d


def _pow2(k: Tensor) -> Tensor:
  """2**k for int32 k inside float32's normal exponents."""
  return ((k + 127) << 23).bitcast(F32)


def decode(t: Tensor, f: Narrow) -> Tensor:
  """The float32 values of storage tensor t (ints: their values as float32)."""
  if f.kind in ("i", "u"):
    return t.cast(F32)
  if f.kind == "bf16":
    return (t.cast(U32) << 16).bitcast(F32)
  c = t.cast(I32)
  if f.kind == "e8m0":
    # 2**(c-127); c = 0 is 2**-127, a float32 subnormal; 0xFF is NaN
    v = (c == 0).where(Tensor(1 << 22, I32), c << 23).bitcast(F32)
    return (c == 0xFF).where(NAN, v)
  e, m = f.exp_bits, f.man_bits
  E, M = (c >> m) & ((1 << e) - 1), c & ((1 << m) - 1)
  subnormal = M.cast(F32) * float(2.0 ** (1 - f.bias - m))
  normal = (M + (1 << m)).cast(F32) * _pow2(E - (f.bias + m))
  mag = (E == 0).where(subnormal, normal)
  v = (((c >> (f.bits - 1)) & 1) == 1).where(-mag, mag)
  if f.special == "fn":
    return ((c & 0x7F) == 0x7F).where(NAN, v)
  if f.special == "fnuz":
    return (c == 0x80).where(NAN, v)
  if f.special == "ieee":
    top = E == (1 << e) - 1
    inf = ((c >> (f.bits - 1)) == 1).where(float("-inf"), float("inf"))
    return top.where((M == 0).where(inf, NAN), v)
  return v


def _max_code(f: Narrow) -> int:
  """The magnitude code of the largest finite value."""
  ones = (1 << (f.exp_bits + f.man_bits)) - 1
  return {"fn": ones - 1, "fnuz": ones, "ieee": ones - (1 << f.man_bits), "": ones}[f.special]


def encode(x: Tensor, f: Narrow, saturate: bool = True, round_mode: str = "up") -> Tensor:
  """The storage tensor of float (or int) tensor x converted to f."""
  if f.kind in ("i", "u"):
    # truncated toward zero; out of range (undefined in ONNX's Cast) is 0, as in ml_dtypes and onnx's test data
    lo, hi = (-(1 << (f.bits - 1)), (1 << (f.bits - 1)) - 1) if f.kind == "i" else (0, (1 << f.bits) - 1)
    v = x.cast(F32).trunc()
    return ((v >= lo) & (v <= hi)).where(v, 0.0).cast(f.storage)
  u = x.cast(F32).bitcast(U32)
  if f.kind == "bf16":
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return (x.cast(F32) != x.cast(F32)).where((u >> 16) | 0x40, rounded).cast(f.storage)
  if f.kind == "e8m0":
    return _encode_e8m0(u, saturate, round_mode).cast(f.storage)
  e, m, bits = f.exp_bits, f.man_bits, f.bits
  a = u & 0x7FFFFFFF
  af = a.bitcast(F32)
  shift = 23 - m
  # normal: round float32's mantissa to m bits in place (a carry moves into the exponent), then rebias
  r = ((a + ((1 << (shift - 1)) - 1) + ((a >> shift) & 1)) >> shift).cast(I32)
  normal = r - ((127 - f.bias) << m)
  # below the smallest normal the code is the value in units of the smallest subnormal, rounded to even
  subnormal = (af * float(2.0 ** (f.bias - 1 + m))).round().cast(I32)
  code = (af < float(2.0 ** (1 - f.bias))).where(subnormal, normal)
  top = _max_code(f)
  if saturate or f.special == "":
    over = Tensor(top, I32)
  elif f.special == "ieee":
    over = Tensor(((1 << e) - 1) << m, I32)
  elif f.special == "fn":
    over = Tensor((1 << (e + m)) - 1, I32)
  else:
    over = Tensor(1 << (bits - 1), I32)  # fnuz: the NaN code, which has no sign
  code = (code > top).where(over, code)
  sign = (u >> 31).cast(I32) << (bits - 1)
  nan = x.cast(F32) != x.cast(F32)
  if f.special == "fnuz":
    out = ((code == 0) | (code == 1 << (bits - 1))).where(code, code | sign)
    out = nan.where(Tensor(1 << (bits - 1), I32), out)
  elif f.special == "fn":
    out = nan.where(sign | ((1 << (e + m)) - 1), code | sign)
  elif f.special == "ieee":
    out = nan.where(sign | ((1 << (e + m)) - 2), code | sign)
  else:
    out = nan.where(sign ^ (1 << (bits - 1)), code | sign)  # no NaN code: ml_dtypes gives a zero
  return out.cast(f.storage)


def _encode_e8m0(u: Tensor, saturate: bool, round_mode: str) -> Tensor:
  """float32 bits to e8m0 (a biased power of two, no sign), as onnx.numpy_helper.to_float8e8m0 defines it."""
  E = (u >> 23) & 0xFF
  if round_mode == "nearest":
    g, rest = (u & 0x400000) != 0, (u & 0x3FFFFF) != 0
    up = g & (rest | (E > 0))
  elif round_mode == "up":
    up = (u & 0x7FFFFF) != 0
  elif round_mode == "down":
    up = E != E
  else:
    raise InvalidValueError(f"round_mode '{round_mode}': expected up, down or nearest")
  if saturate:
    up = up & (E != 0xFE)
  return (E == 0xFF).where(E, E + up.cast(U32))


def convert(x: Tensor, to, saturate: bool = True, round_mode: str = "up") -> Tensor:
  """x (a Stored tensor or a plain one) as type `to` (a Narrow or a DType): through float32 when either is narrow."""
  src, dst = fmt_of(x), narrow_of(to)
  if src is None and dst is None:
    return x.cast(to)
  if src is not None and dst is not None and src == dst:
    return x
  if src is not None:
    # the ints convert exactly through int32, so an int4 -> int8 cast keeps every value
    x = x.cast(I32) if src.kind in ("i", "u") and (dst is not None or not to.is_float) else decode(x, src)
  if dst is None:
    return x.cast(to)
  return Stored(encode(x, dst, saturate, round_mode), dst)


def pack(t: Tensor, f: Narrow) -> Tensor:
  """Storage tensor t as the packed bytes of f: element i in bits (i % per) * bits of byte i // per."""
  per, n = 8 // f.bits, t.numel()
  flat = t.reshape(n).cast(dtypes.uint8) & ((1 << f.bits) - 1)
  if n % per:
    flat = Tensor.cat([flat, Tensor(np.zeros(per - n % per, np.uint8))])
  cols = flat.reshape(-1, per)
  out = cols[:, 0]
  for j in range(1, per):
    out = out | (cols[:, j] << (f.bits * j))
  return out


def unpack(b: Tensor, f: Narrow, shape: tuple) -> Tensor:
  """The storage tensor of logical shape `shape` from packed bytes b."""
  per, n = 8 // f.bits, int(np.prod(shape, dtype=np.int64))
  mask = (1 << f.bits) - 1
  parts = [(b >> (f.bits * j)) & mask for j in range(per)]
  v = Tensor.stack(*parts, axis=1).reshape(-1)[:n].cast(I32)
  if f.kind == "i":
    v = (v ^ (1 << (f.bits - 1))) - (1 << (f.bits - 1))
  return v.cast(f.storage).reshape(shape)


# ops whose functions read and make Stored tensors themselves; the tracer decodes a narrow input for any other
AWARE = {"Cast", "CastLike", "QuantizeLinear", "DequantizeLinear", "Constant", "Identity"}


def restore(o, f: Narrow):
  """An op's output, computed from inputs of type f (decoded), as type f again where it is f's computing type."""
  if not isinstance(o, Tensor) or isinstance(o, Stored):
    return o
  if f.is_float:
    return Stored(encode(o, f), f) if o.dtype == F32 else o
  return Stored(o, f) if o.dtype == f.storage else o
