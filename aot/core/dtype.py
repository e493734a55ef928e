"""Element types: one DType per numpy dtype the compiler supports, with numpy's promotion rules."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from aot.errors import InvalidTypeError


@dataclass(frozen=True, eq=True)
class DType:
  name: str
  itemsize: int
  kind: str  # 'f' float, 'i' signed int, 'u' unsigned int, 'b' bool
  cname: str  # C type used in kernels and in the artifact's header

  @property
  def np(self) -> np.dtype:
    return np.dtype(self.name)

  @property
  def is_float(self) -> bool:
    return self.kind == "f"

  @property
  def is_int(self) -> bool:
    return self.kind in "iu"

  def __repr__(self) -> str:
    return f"dtypes.{self.name}"


class dtypes:
  bool = DType("bool", 1, "b", "bool")
  int8 = DType("int8", 1, "i", "int8_t")
  int16 = DType("int16", 2, "i", "int16_t")
  int32 = DType("int32", 4, "i", "int32_t")
  int64 = DType("int64", 8, "i", "int64_t")
  uint8 = DType("uint8", 1, "u", "uint8_t")
  uint16 = DType("uint16", 2, "u", "uint16_t")
  uint32 = DType("uint32", 4, "u", "uint32_t")
  uint64 = DType("uint64", 8, "u", "uint64_t")
  float16 = DType("float16", 2, "f", "_Float16")
  float32 = DType("float32", 4, "f", "float")
  float64 = DType("float64", 8, "f", "double")
  # index arithmetic inside kernels; 32 bits keeps loops vectorisable and covers 2**31 elements
  index = DType("index", 4, "i", "int")
  # the same in a kernel where a loop or an index can pass 2**31-1 (codegen/render/linearize.py: widen_index)
  index64 = DType("index64", 8, "i", "int64_t")
  void = DType("void", 0, "v", "void")
  default_float = float32
  default_int = int32


ALL = tuple(v for v in vars(dtypes).values() if isinstance(v, DType) and v.name not in ("index", "index64", "void"))
_BY_NAME = {d.name: d for d in ALL}


def to_dtype(x) -> DType:
  """A DType from a DType, a numpy dtype or type, or a name."""
  if isinstance(x, DType):
    return x
  name = np.dtype(x).name
  if name not in _BY_NAME:
    raise InvalidTypeError(f"unsupported dtype {name}; supported: {', '.join(_BY_NAME)}")
  return _BY_NAME[name]


def promote(a: DType, b: DType) -> DType:
  """numpy's promotion of two array dtypes, kept inside the supported set (int64 with uint64 gives float64, as
  numpy)."""
  if a == b:
    return a
  return to_dtype(np.promote_types(a.np, b.np))


def min_value(d: DType):
  if d.is_float:
    return -float("inf")
  if d.kind == "b":
    return False
  return int(np.iinfo(_int_np(d)).min)


def max_value(d: DType):
  if d.is_float:
    return float("inf")
  if d.kind == "b":
    return True
  return int(np.iinfo(_int_np(d)).max)


def _int_np(d: DType):
  # the kernel index types have no numpy type of their own
  return {dtypes.index: np.int32, dtypes.index64: np.int64}.get(d) or d.np


# *** narrow storage types ***
# Element types with no C arithmetic of their own: they live in memory (inputs, outputs, weights) as the bits of a
# storage type and are computed through float32; frontends/narrow.py converts, exactly as ONNX's Cast says.


@dataclass(frozen=True)
class Narrow:
  name: str  # the ml_dtypes spelling, which numpy arrays of the type carry
  onnx: str  # the TensorProto.DataType name
  bits: int  # per element in memory: 4 and 2 pack two or four to a byte, the first in the low bits
  storage: DType  # what one unpacked element is inside the kernels: its code bits, or its value for the ints
  kind: str  # 'bf16' | 'float' (a small float with sign, exp_bits, man_bits) | 'e8m0' | 'i' | 'u'
  exp_bits: int = 0
  man_bits: int = 0
  bias: int = 0
  special: str = ""  # the float's NaN/Inf codes: 'fn' (all ones NaN), 'fnuz' (NaN at -0), 'ieee', '' (none)

  @property
  def np(self) -> np.dtype:
    import ml_dtypes

    return np.dtype(getattr(ml_dtypes, self.name))

  @property
  def packed(self) -> bool:
    return self.bits < 8

  @property
  def is_float(self) -> bool:
    return self.kind not in ("i", "u")

  def nbytes(self, n: int) -> int:
    return -(-n * self.bits // 8)

  def to_storage(self, arr: np.ndarray) -> np.ndarray:
    """An array of this type (ml_dtypes: one element a byte, or two for bf16) as what the C API takes."""
    arr = np.ascontiguousarray(arr, dtype=self.np)
    if not self.packed:
      return arr.view(self.storage.np)
    per = 8 // self.bits
    codes = arr.reshape(-1).view(np.uint8) & ((1 << self.bits) - 1)
    codes = np.concatenate([codes, np.zeros(-codes.size % per, np.uint8)]).reshape(-1, per)
    return np.bitwise_or.reduce(codes << (self.bits * np.arange(per, dtype=np.uint8)), axis=1).astype(np.uint8)

  def from_storage(self, raw: np.ndarray, shape: tuple) -> np.ndarray:
    """The inverse of to_storage."""
    if not self.packed:
      return raw.view(self.np).reshape(shape)
    per = 8 // self.bits
    codes = (raw[:, None] >> (self.bits * np.arange(per, dtype=np.uint8))) & ((1 << self.bits) - 1)
    return codes.reshape(-1)[: int(np.prod(shape, dtype=np.int64))].view(self.np).reshape(shape)

  def __repr__(self) -> str:
    return f"narrow.{self.name}"


NARROW = {
  n.name: n
  for n in (
    Narrow("bfloat16", "BFLOAT16", 16, dtypes.uint16, "bf16"),
    Narrow("float8_e4m3fn", "FLOAT8E4M3FN", 8, dtypes.uint8, "float", 4, 3, 7, "fn"),
    Narrow("float8_e4m3fnuz", "FLOAT8E4M3FNUZ", 8, dtypes.uint8, "float", 4, 3, 8, "fnuz"),
    Narrow("float8_e5m2", "FLOAT8E5M2", 8, dtypes.uint8, "float", 5, 2, 15, "ieee"),
    Narrow("float8_e5m2fnuz", "FLOAT8E5M2FNUZ", 8, dtypes.uint8, "float", 5, 2, 16, "fnuz"),
    Narrow("float8_e8m0fnu", "FLOAT8E8M0", 8, dtypes.uint8, "e8m0"),
    Narrow("float4_e2m1fn", "FLOAT4E2M1", 4, dtypes.uint8, "float", 2, 1, 1, ""),
    Narrow("int4", "INT4", 4, dtypes.int8, "i"),
    Narrow("uint4", "UINT4", 4, dtypes.uint8, "u"),
    Narrow("int2", "INT2", 2, dtypes.int8, "i"),
    Narrow("uint2", "UINT2", 2, dtypes.uint8, "u"),
  )
}


def narrow_of(x) -> Narrow | None:
  """The narrow type of a numpy dtype (an ml_dtypes one), a Narrow or its name; None for any other type."""
  if isinstance(x, Narrow):
    return x
  if isinstance(x, str):
    return NARROW.get(x)
  try:
    return NARROW.get(np.dtype(x).name)
  except TypeError:
    return None
