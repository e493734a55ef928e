"""Element types: one DType per numpy dtype the compiler supports, with numpy's promotion rules."""
from __future__ import annotations
from dataclasses import dataclass
import numpy as np

@dataclass(frozen=True, eq=True)
class DType:
  name: str
  itemsize: int
  kind: str        # 'f' float, 'i' signed int, 'u' unsigned int, 'b' bool
  cname: str       # C type used in kernels and in the artifact's header

  @property
  def np(self) -> np.dtype: return np.dtype(self.name)
  @property
  def is_float(self) -> bool: return self.kind == 'f'
  @property
  def is_int(self) -> bool: return self.kind in 'iu'
  def __repr__(self) -> str: return f"dtypes.{self.name}"

class dtypes:
  bool = DType("bool", 1, 'b', "bool")
  int8 = DType("int8", 1, 'i', "int8_t")
  int16 = DType("int16", 2, 'i', "int16_t")
  int32 = DType("int32", 4, 'i', "int32_t")
  int64 = DType("int64", 8, 'i', "int64_t")
  uint8 = DType("uint8", 1, 'u', "uint8_t")
  uint16 = DType("uint16", 2, 'u', "uint16_t")
  uint32 = DType("uint32", 4, 'u', "uint32_t")
  uint64 = DType("uint64", 8, 'u', "uint64_t")
  float16 = DType("float16", 2, 'f', "_Float16")
  float32 = DType("float32", 4, 'f', "float")
  float64 = DType("float64", 8, 'f', "double")
  # index arithmetic inside kernels; 32 bits keeps loops vectorisable and covers 2**31 elements
  index = DType("index", 4, 'i', "int")
  # the same in a kernel where a loop or an index can pass 2**31-1 (codegen/linearize.py: widen_index)
  index64 = DType("index64", 8, 'i', "int64_t")
  void = DType("void", 0, 'v', "void")
  default_float = float32
  default_int = int32

ALL = tuple(v for v in vars(dtypes).values() if isinstance(v, DType) and v.name not in ("index", "index64", "void"))
_BY_NAME = {d.name: d for d in ALL}

def to_dtype(x) -> DType:
  """A DType from a DType, a numpy dtype or type, or a name."""
  if isinstance(x, DType): return x
  name = np.dtype(x).name
  if name not in _BY_NAME: raise TypeError(f"unsupported dtype {name}; supported: {', '.join(_BY_NAME)}")
  return _BY_NAME[name]

def promote(a: DType, b: DType) -> DType:
  """numpy's promotion of two array dtypes, kept inside the supported set (int64 with uint64 gives float64, as numpy)."""
  if a == b: return a
  return to_dtype(np.promote_types(a.np, b.np))

def min_value(d: DType):
  if d.is_float: return -float("inf")
  if d.kind == 'b': return False
  return int(np.iinfo(_int_np(d)).min)

def max_value(d: DType):
  if d.is_float: return float("inf")
  if d.kind == 'b': return True
  return int(np.iinfo(_int_np(d)).max)

def _int_np(d: DType):
  # the kernel index types have no numpy type of their own
  return {dtypes.index: np.int32, dtypes.index64: np.int64}.get(d) or d.np
