"""The model as ONNX's shape inference reads it: the frontend cross-checks the shapes it traced against ONNX's
(frontends/onnx.py check_inferred_shapes), and the skip-layer-norm fusion asks for value types
(frontends/onnx_skip_ln.py)."""

from __future__ import annotations

import math

import onnx

# shape inference reads the values of initializers that are shapes, axes, pads (a few elements each); a bigger one
# is given to it as a typed input, so that the cross-check costs what the graph does, not what its weights do
SHAPE_INFERENCE_CONST_MAX = 1 << 10


def weightless(model: onnx.ModelProto, value_info: bool = False) -> onnx.ModelProto:
  """The model as ONNX's shape inference needs it: its nodes, inputs and outputs (and its value_info where asked),
  the initializers of up to SHAPE_INFERENCE_CONST_MAX elements, each bigger one a typed graph input."""
  m = onnx.ModelProto(ir_version=model.ir_version, opset_import=model.opset_import, functions=model.functions)
  m.graph.name = model.graph.name
  m.graph.node.extend(model.graph.node)
  m.graph.input.extend(model.graph.input)
  m.graph.output.extend(model.graph.output)
  if value_info:
    m.graph.value_info.extend(model.graph.value_info)
  m.graph.sparse_initializer.extend(model.graph.sparse_initializer)
  declared = {vi.name for vi in model.graph.input}
  for init in model.graph.initializer:
    if math.prod(init.dims) <= SHAPE_INFERENCE_CONST_MAX:
      m.graph.initializer.append(init)
    elif init.name not in declared:
      m.graph.input.append(onnx.helper.make_tensor_value_info(init.name, init.data_type, init.dims))
  return m
