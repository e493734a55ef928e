"""Reading an ONNX model: the file without its external weights, which stay where they are and are mapped as the
graph is traced (a read-only memory map for a plain numeric type: never copied into the heap), each checked to lie
inside the model's folder."""

from __future__ import annotations

import math
import os
from pathlib import Path, PurePosixPath

import numpy as np
import onnx
from onnx import numpy_helper

from aot.core.dtype import NARROW, Narrow
from aot.errors import CompileError


def load_model(src) -> onnx.ModelProto:
  """The model without its external weights: initializers stored outside the file stay there and are mapped when the
  graph is traced (external_array); a Constant node's external tensor is read now."""
  if isinstance(src, onnx.ModelProto):
    return src
  path = Path(src)
  if not path.exists():
    raise FileNotFoundError(f"{path}: no such file")
  try:
    model = onnx.load(str(path), load_external_data=False)
  except Exception as e:
    why = str(e).splitlines()[0] if str(e) else "truncated or corrupt"
    raise CompileError(f"{path}: not a readable ONNX model ({type(e).__name__}: {why})")
  try:
    for g in all_graphs(model.graph):
      for t in g.initializer:
        if is_external(t):
          _external_extent(t, path.parent)
      for n in g.node:
        for a in n.attribute:
          if a.type == onnx.AttributeProto.TENSOR and is_external(a.t):
            file, offset, nbytes = _external_extent(a.t, path.parent)
            a.t.CopyFrom(_exact(a.t, file, offset, nbytes))
            onnx.external_data_helper.load_external_data_for_tensor(a.t, str(file.parent))
  except CompileError as e:
    raise CompileError(f"{path}: {e}")
  except Exception as e:
    raise CompileError(f"{path}: cannot load external weights: {e}")
  return model


def is_external(t: onnx.TensorProto) -> bool:
  return t.data_location == onnx.TensorProto.EXTERNAL


# element types whose external bytes are the numpy array itself (little-endian, one item per element): these are
# memory-mapped; the others (bfloat16, float8, 4-bit, strings) are read and converted by onnx
_MAPPED_TYPES = {
  onnx.TensorProto.FLOAT,
  onnx.TensorProto.DOUBLE,
  onnx.TensorProto.FLOAT16,
  onnx.TensorProto.BOOL,
  onnx.TensorProto.INT8,
  onnx.TensorProto.INT16,
  onnx.TensorProto.INT32,
  onnx.TensorProto.INT64,
  onnx.TensorProto.UINT8,
  onnx.TensorProto.UINT16,
  onnx.TensorProto.UINT32,
  onnx.TensorProto.UINT64,
}


def _external_extent(t: onnx.TensorProto, base: Path) -> tuple[Path, int, int]:
  """(file, offset, bytes) of an external initializer, checked against the file's size. A missing offset is the
  file's start and a missing length the tensor's own size, as onnxruntime reads them (onnx.load reads the rest of
  the file: the same bytes when nothing follows them)."""
  info = onnx.external_data_helper.ExternalDataInfo(t)
  file = _external_file(t.name, info.location, base)
  if not file.is_file():
    raise CompileError(f"initializer '{t.name}': its external data {file} does not exist")
  offset = info.offset or 0
  nbytes = info.length if info.length is not None else _tensor_bytes(t)
  size = file.stat().st_size
  if offset + nbytes > size:
    raise CompileError(
      f"initializer '{t.name}': needs bytes {offset}..{offset + nbytes} of {file}, which holds {size} (truncated?)"
    )
  return file, offset, nbytes


def _exact(t: onnx.TensorProto, file: Path, offset: int, nbytes: int) -> onnx.TensorProto:
  """A copy of t naming the bytes _external_extent found and checked, for onnx to read and convert: its reader would
  take the rest of the file for a missing length, and refuses a location that passes through a link."""
  out = onnx.TensorProto()
  out.CopyFrom(t)
  del out.external_data[:]
  for key, value in (("location", file.name), ("offset", offset), ("length", nbytes)):
    out.external_data.add(key=key, value=str(value))
  return out


def _tensor_bytes(t: onnx.TensorProto) -> int:
  """The bytes of t's data as ONNX stores it: the 4- and 2-bit types packed, the others one item per element."""
  n = math.prod(t.dims)
  if f := onnx_narrow(t.data_type):
    return f.nbytes(n)
  return n * np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize


def weight_bytes(g: onnx.GraphProto) -> int:
  """The bytes of the weights a graph ships: its initializers and Constant tensors, as stored (external data unread)."""
  consts = [a.t for n in g.node if n.op_type == "Constant" for a in n.attribute if a.type == onnx.AttributeProto.TENSOR]
  return sum(_tensor_bytes(t) for t in [*g.initializer, *consts])


# links one external data location may pass through before it is taken for a loop (Linux's own limit)
EXTERNAL_LINKS_MAX = 40


def _external_file(tensor: str, location: str, base: Path) -> Path:
  """The file an external data location names, which must lie in the model's folder or below it, as onnx and
  onnxruntime require: an absolute location, a `..` above the folder or a link inside it to a file outside is
  refused. Decided from the location's text and the links met on the way, each inside the folder: nothing outside
  it is opened or stat'ed first, so a model cannot make the compiler read a file elsewhere or say its size."""
  root = Path(os.path.realpath(base))
  refuse = f"initializer '{tensor}': external data location {location!r} is refused: it "
  where = f"outside the model's folder {root} (onnx and onnxruntime require external data inside it)"
  if not location:
    raise CompileError(f"initializer '{tensor}' is external but has no location")
  if PurePosixPath(location).is_absolute():
    raise CompileError(refuse + f"is an absolute path, which may name a file {where}")
  parts, below, links = list(PurePosixPath(location).parts), [], 0
  while parts:
    part = parts.pop(0)
    if part == "..":
      if not below:
        raise CompileError(refuse + f"leads {where}")
      below.pop()
    elif part != ".":
      here = root.joinpath(*below, part)
      if not here.is_symlink():
        below.append(part)
        continue
      links += 1
      target = PurePosixPath(os.readlink(here))
      if links > EXTERNAL_LINKS_MAX:
        raise CompileError(refuse + f"passes through more than {EXTERNAL_LINKS_MAX} links (a loop?)")
      if target.is_absolute():
        if not target.is_relative_to(root):
          raise CompileError(refuse + f"passes through the link {here.relative_to(root)}, which leads {where}")
        below, target = [], target.relative_to(root)
      parts = list(target.parts) + parts
  return root.joinpath(*below)


def external_array(t: onnx.TensorProto, base: Path | None) -> np.ndarray:
  """An initializer's value; external data of a plain numeric type is a read-only memory map of its file, so weights
  are paged in as the compiler reads them and never copied into the heap."""
  if not is_external(t):
    return numpy_helper.to_array(t)
  if base is None:
    raise CompileError(f"initializer '{t.name}' has external data: compile the model from its file")
  file, offset, nbytes = _external_extent(t, base)
  if t.data_type not in _MAPPED_TYPES or math.prod(t.dims) == 0:
    return numpy_helper.to_array(_exact(t, file, offset, nbytes), str(file.parent))
  dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type)).newbyteorder("<")
  if nbytes != math.prod(t.dims) * dtype.itemsize:
    raise CompileError(f"initializer '{t.name}': {nbytes} bytes of external data for {math.prod(t.dims)} {dtype} items")
  return np.memmap(file, dtype=dtype, mode="r", offset=offset, shape=tuple(t.dims))


def all_graphs(g: onnx.GraphProto):
  yield g
  for n in g.node:
    for a in n.attribute:
      if a.type == onnx.AttributeProto.GRAPH:
        yield from all_graphs(a.g)
      if a.type == onnx.AttributeProto.GRAPHS:
        for sg in a.graphs:
          yield from all_graphs(sg)


def onnx_narrow(elem_type: int) -> Narrow | None:
  """The narrow storage type (aot/core/dtype.py: NARROW) an ONNX element type is, if it is one."""
  name = onnx.TensorProto.DataType.Name(elem_type) if elem_type in onnx.TensorProto.DataType.values() else ""
  return next((f for f in NARROW.values() if f.onnx == name), None)
