"""Helpers for tests that pin how a model compiles."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from aot.artifact import Artifact
from aot.errors import KernelCountException


def kernel_count(what, example_inputs=None, **kw) -> int:
  """Kernels of an artifact, an artifact folder, or anything compile_model accepts (scheduled, not built)."""
  if isinstance(what, Artifact):
    return what.num_kernels
  if isinstance(what, (str, Path)) and Path(what).is_dir():
    return Artifact(Path(what)).num_kernels
  from aot.compiler import resolve
  from aot.scheduler.schedule import schedule

  traced = resolve(what, example_inputs, kw.get("name"))
  return len(schedule(traced.outputs, traced.inputs).kernels)


def assert_kernel_count(what, expected: int, example_inputs=None, **kw) -> None:
  got = kernel_count(what, example_inputs, **kw)
  if got != expected:
    raise KernelCountException(expected, got)


def randomize_constant_weights(model, seed: int = 0):
  """A copy of an ONNX model whose ConstantOfShape weights (as in onnx's 'light' test models, where every weight is
  0.02 and so every output is equal) become seeded random initializers of the same shape, scaled by the role the
  consumer gives them so that activations stay of order 1."""
  import onnx
  from onnx import numpy_helper

  rng = np.random.default_rng(seed)
  m = onnx.ModelProto()
  m.CopyFrom(model)
  g = m.graph
  consts = {i.name: numpy_helper.to_array(i) for i in g.initializer}
  users = {}
  for n in g.node:
    for k, name in enumerate(n.input):
      users.setdefault(name, (n, k))
  keep, drawn = [], []
  for n in g.node:
    if n.op_type != "ConstantOfShape" or n.input[0] not in consts:
      keep.append(n)
      continue
    shape = tuple(int(d) for d in consts[n.input[0]])
    user, slot = users.get(n.output[0], (None, 0))
    drawn.append((n.output[0], _weight_for(rng, shape, user.op_type if user is not None else "", slot)))
  del g.node[:]
  g.node.extend(keep)
  used = {name for n in g.node for name in n.input} | {o.name for o in g.output}
  inits = [i for i in g.initializer if i.name in used]
  del g.initializer[:]
  g.initializer.extend(inits)
  # (written in place: a TensorProto built apart and then added is copied again, 1 s of vgg19's 575 MB)
  for name, value in drawn:
    t = g.initializer.add()
    t.name, t.data_type, t.raw_data = name, onnx.TensorProto.FLOAT, value.tobytes()
    t.dims.extend(value.shape)
  new_inits = list(g.initializer)[len(inits) :]
  # before IR version 4 every initializer must also be a graph input
  names = {i.name for i in g.initializer}
  dropped = {i.name for i in model.graph.initializer} - names
  inputs = [i for i in g.input if i.name not in dropped and (i.name not in names or m.ir_version < 4)]
  if m.ir_version < 4:
    have = {i.name for i in inputs}
    inputs += [
      onnx.helper.make_tensor_value_info(i.name, i.data_type, list(i.dims)) for i in new_inits if i.name not in have
    ]
  del g.input[:]
  g.input.extend(inputs)
  return m


def _weight_for(rng, shape, user: str, slot: int) -> np.ndarray:
  """float32 drawn as float32, scaled in place: vgg19's 143M weights drawn in float64 and cast took 6 s a load."""
  fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
  if user == "BatchNormalization" and slot in (1, 4):
    return rng.uniform(0.5, 1.5, shape).astype(np.float32)  # scale, variance
  w = rng.standard_normal(shape, dtype=np.float32)
  w *= np.float32(np.sqrt(1.0 / fan_in) if user in ("Conv", "ConvTranspose", "Gemm", "MatMul") and slot == 1 else 0.1)
  return w  # (0.1: biases, shifts, means)
