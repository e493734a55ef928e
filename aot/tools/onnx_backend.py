"""A standard onnx.backend Backend over compiled artifacts, so onnx.backend.test runs every node case through
compile -> libNAME.so -> aot.load."""

from __future__ import annotations

import tempfile

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep


class AotRep(BackendRep):
  """A compiled model. Inputs whose values decide shapes (a Reshape's shape fed as a graph input, say) are bound at
  the first run and the model is compiled for those values, once per distinct set of values; inputs whose shapes
  ONNX leaves open (a sequence's length, a dim_param) are pinned the same way, from the shapes of those values."""

  def __init__(self, model: onnx.ModelProto, **kw):
    from aot.errors import CompileError

    self.onnx_model, self.kw, self.compiled = model, kw, {}
    self.input_names = [i.name for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}]
    self.bound: tuple = ()
    # an optional input's presence is its value's: compile at the first run
    self.by_shape = any(i.type.HasField("optional_type") for i in model.graph.input)
    if self.by_shape:
      return
    try:
      self._compile({})
    except CompileError as e:
      if not e.needs_inputs and not e.needs_shapes:
        raise
      self.bound = tuple(sorted(e.needs_inputs))
      self.by_shape = bool(e.needs_shapes)

  def _compile(self, bind: dict, shapes: dict | None = None):
    from aot.compiler import compile_model
    from aot.loader import load

    key = (tuple((k, v.tobytes(), v.dtype.str, v.shape) for k, v in sorted(bind.items())), repr(shapes))
    if key not in self.compiled:
      d = tempfile.TemporaryDirectory(prefix="aot_backend_")
      art = compile_model(self.onnx_model, out_dir=d.name, name="model", bind=bind, shapes=shapes, **self.kw)
      self.compiled[key] = (d, art, load(art))
    return self.compiled[key]

  def run(self, inputs, **kwargs):
    if isinstance(inputs, dict):
      inputs = [inputs[n] for n in self.input_names]
    if isinstance(inputs, np.ndarray):
      inputs = [inputs]
    from aot.errors import CompileError
    from aot.frontends.onnx_ops_sequence import container_spec

    values = dict(zip(self.input_names, [_value(x) for x in inputs]))
    while True:
      shapes = {n: container_spec(v) for n, v in values.items()} if self.by_shape else None
      try:
        _, _, model = self._compile({k: values[k] for k in self.bound}, shapes)
        break
      except CompileError as e:
        more = set(e.needs_inputs) - set(self.bound)
        if not more and (self.by_shape or not e.needs_shapes):
          raise
        self.bound = tuple(sorted(set(self.bound) | more))
        self.by_shape = self.by_shape or bool(e.needs_shapes)
    outs = model(*[values[n] for n in self.input_names if n not in self.bound])
    return tuple(outs) if isinstance(outs, tuple) else (outs,)


def _value(x):
  """A run's input as aot.load takes it: an array, a list of arrays (a sequence), or None (an empty optional)."""
  if x is None:
    return None
  if isinstance(x, (list, tuple)):
    return [np.asarray(e) for e in x]
  return np.asarray(x)


class AotBackend(Backend):
  target = "c"

  @classmethod
  def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs) -> AotRep:
    super().prepare(model, device, **kwargs)
    return AotRep(model, **{"target": cls.target, **kwargs})

  @classmethod
  def run_model(cls, model, inputs, device="CPU", **kwargs):
    return cls.prepare(model, device, **kwargs).run(inputs)

  @classmethod
  def supports_device(cls, device: str) -> bool:
    return device.upper() == "CPU"


class AotLLVMBackend(AotBackend):
  """The same backend with kernels compiled through LLVM."""

  target = "llvm"


prepare = AotBackend.prepare
run_model = AotBackend.run_model
supports_device = AotBackend.supports_device
