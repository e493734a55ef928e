"""ONNX sequences and optionals, as compile-time containers: a sequence is a list of tensors whose length (and every
position an op reads or writes) is known when the graph is traced; an optional is a tensor or sequence, or nothing.
A sequence model input or output is N tensors at the C API (NAME_0 .. NAME_{N-1}), its length and element shapes
given at compile time (shapes={NAME: [shape, ...]}); an optional one is its value's tensors, none when empty
(shapes={NAME: None}). The manifest's "containers" say which C API tensors make up each, so aot.load takes and
returns Python lists (and None)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from aot.core.dtype import DType, dtypes
from aot.errors import InvalidValueError
from aot.frontends.onnx import Unsupported, onnx_dtype, onnx_type, op
from aot.frontends.tensor import Tensor


@dataclass(frozen=True)
class Sequence:
  items: tuple
  dtype: DType | None = None  # of an empty sequence's elements (SequenceEmpty's dtype)


@dataclass(frozen=True)
class Optional:
  value: object = None  # a Tensor, a Sequence, or None for an empty optional


def _seq(n, s, what: str = "input") -> Sequence:
  if not isinstance(s, Sequence):
    raise Unsupported(f"{what} is not a sequence")
  return s


def _position(n, s: Sequence, position, insert: bool = False) -> int:
  """A position (negative from the end) that must be known at compile time, checked against the length."""
  length = len(s.items)
  if position is None:
    return length if insert else length - 1
  p = int(np.asarray(n.const(position, "position")).reshape(-1)[0])
  hi = length if insert else length - 1
  if not -length <= p <= hi:
    raise InvalidValueError(f"position {p} is outside a sequence of length {length}")
  return p + length if p < 0 else p


@op("SequenceEmpty", since=11)
def sequence_empty(n, dtype=1):
  return Sequence((), onnx_dtype(dtype))


@op("SequenceConstruct", since=11)
def sequence_construct(n, *inputs):
  return Sequence(tuple(inputs))


@op("SequenceInsert", since=11)
def sequence_insert(n, s, tensor, position=None):
  s = _seq(n, s)
  p = _position(n, s, position, insert=True)
  return Sequence(s.items[:p] + (tensor,) + s.items[p:], s.dtype)


@op("SequenceErase", since=11)
def sequence_erase(n, s, position=None):
  s = _seq(n, s)
  p = _position(n, s, position)
  return Sequence(s.items[:p] + s.items[p + 1 :], s.dtype)


@op("SequenceAt", since=11)
def sequence_at(n, s, position):
  s = _seq(n, s)
  return s.items[_position(n, s, position)]


@op("SequenceLength", since=11)
def sequence_length(n, s):
  return Tensor(np.int64(len(_seq(n, s).items)), dtypes.int64)


@op("SplitToSequence", since=11)
def split_to_sequence(n, x, split=None, axis=0, keepdims=1):
  a = axis % x.ndim
  d = x.shape[a]
  bounds = lambda lo, hi: [(lo, hi) if j == a else None for j in range(x.ndim)]
  if split is None:
    parts = [x.shrink(bounds(i, i + 1)) for i in range(d)]
    return Sequence(tuple(parts if keepdims else [p.squeeze(a) for p in parts]))
  sizes = np.asarray(n.const(split, "split")).reshape(-1).tolist()
  if np.ndim(n.const(split, "split")) == 0:
    k = int(sizes[0])
    sizes = [min(k, d - i) for i in range(0, d, k)]
  if sum(sizes) != d:
    raise InvalidValueError(f"split sizes {sizes} do not add up to {d}")
  offs = np.cumsum([0] + [int(s) for s in sizes])
  return Sequence(tuple(x.shrink(bounds(int(offs[i]), int(offs[i + 1]))) for i in range(len(sizes))))


@op("ConcatFromSequence", since=11)
def concat_from_sequence(n, s, axis=0, new_axis=0):
  s = _seq(n, s)
  if not s.items:
    raise InvalidValueError("ConcatFromSequence of an empty sequence")
  if new_axis:
    return Tensor.stack(*s.items, axis=axis % (s.items[0].ndim + 1))
  return Tensor.cat(list(s.items), axis=axis % s.items[0].ndim)


@op("SequenceMap", since=17)
def sequence_map(n, s, *more, body=None):
  """The body once per element; further inputs that are sequences are read at the same position, tensors whole."""
  s = _seq(n, s)
  for m in more:
    if isinstance(m, Sequence) and len(m.items) != len(s.items):
      raise InvalidValueError(f"sequences of lengths {len(s.items)} and {len(m.items)}")
  outs = [
    n.subgraph(body, [s.items[i]] + [m.items[i] if isinstance(m, Sequence) else m for m in more])
    for i in range(len(s.items))
  ]
  return [Sequence(tuple(o[k] for o in outs)) for k in range(len(body.output))]


@op("Optional", since=15)
def optional(n, x=None, type=None):
  return Optional(x)


@op("OptionalHasElement", since=15)
def optional_has_element(n, x=None):
  present = x is not None and not (isinstance(x, Optional) and x.value is None)
  return Tensor(np.bool_(present), dtypes.bool)


@op("OptionalGetElement", since=15)
def optional_get_element(n, x):
  if not isinstance(x, Optional):
    return x
  if x.value is None:
    raise InvalidValueError("OptionalGetElement of an empty optional")
  return x.value


# *** sequences and optionals as model inputs and outputs ***


class ContainerShapeNeeded(InvalidValueError):
  """A sequence or optional model input whose length (or presence) and element shapes were not given."""


NOT_GIVEN = object()  # shapes= says nothing of a container input (None says an optional is empty)


def container_input(vi, spec, make_tensor) -> object:
  """The Sequence / Optional a container input stands for, its elements made by make_tensor(name, shape, onnx elem
  type). spec: what shapes= gives for it: a list of element shapes (a sequence), a shape or None (an optional)."""
  t = vi.type
  if t.HasField("optional_type"):
    inner = t.optional_type.elem_type
    if spec is NOT_GIVEN and inner.HasField("tensor_type"):
      dims = inner.tensor_type.shape.dim
      if inner.tensor_type.HasField("shape") and all(d.HasField("dim_value") and d.dim_value >= 0 for d in dims):
        spec = [d.dim_value for d in dims]  # an optional tensor of a static shape: present unless said otherwise
    if spec is NOT_GIVEN:
      raise ContainerShapeNeeded(
        f"input '{vi.name}' is an optional: whether it is present, and its shape, must be "
        f"known at compile time (shapes={{'{vi.name}': shape or None}}, "
        f"or --shape {vi.name}=DIMS|none)"
      )
    if spec is None:
      return Optional(None)
    if inner.HasField("tensor_type"):
      if _is_shape(spec):
        return Optional(make_tensor(vi.name, tuple(spec), inner.tensor_type.elem_type))
      raise InvalidValueError(f"input '{vi.name}' is an optional tensor: give its shape, or None when it is absent")
    t = inner
  if not t.HasField("sequence_type") or not t.sequence_type.elem_type.HasField("tensor_type"):
    raise InvalidValueError(
      f"input '{vi.name}': only sequences of tensors and optionals of tensors or of sequences are supported"
    )
  if not isinstance(spec, (list, tuple)) or not all(_is_shape(e) for e in spec):
    raise ContainerShapeNeeded(
      f"input '{vi.name}' is a sequence: its length and element shapes must be known at "
      f"compile time (shapes={{'{vi.name}': [shape, ...]}}, or --shape {vi.name}=[DIMS,...])"
    )
  et = t.sequence_type.elem_type.tensor_type.elem_type
  items = tuple(make_tensor(f"{vi.name}_{i}", tuple(e), et) for i, e in enumerate(spec))
  seq = Sequence(items, onnx_type(et) if not items else None)
  return Optional(seq) if vi.type.HasField("optional_type") else seq


def _is_shape(x) -> bool:
  return isinstance(x, (list, tuple)) and all(isinstance(d, (int, np.integer)) for d in x)


def container_kind(value) -> str:
  """How aot.load passes a container: 'sequence' (a list) or 'optional' (an array, or None)."""
  inner = value.value if isinstance(value, Optional) else value
  return "sequence" if isinstance(inner, Sequence) else "optional"


def container_output(value, name: str) -> tuple[str, list[tuple[str, Tensor]]]:
  """(kind, [(C API name, tensor)]) of a graph output: 'tensor', 'sequence' (NAME_i) or 'optional' (0 or 1)."""
  if isinstance(value, Optional) and not isinstance(value.value, Sequence):
    return "optional", [] if value.value is None else [(name, value.value)]
  if isinstance(value, Optional):
    value = value.value
  if isinstance(value, Sequence):
    return "sequence", [(f"{name}_{i}", t) for i, t in enumerate(value.items)]
  if isinstance(value, Tensor):
    return "tensor", [(name, value)]
  raise InvalidValueError(f"output '{name}' is not a tensor, a sequence of tensors nor an optional")


def container_spec(value) -> object:
  """What shapes= takes for a container input's value: the inverse of container_input (lists, arrays, None)."""
  if value is None:
    return None
  if isinstance(value, (list, tuple)):
    return [list(np.shape(v)) for v in value]
  return list(np.shape(value))
