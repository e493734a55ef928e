"""ONNX forms of the bundled reference models, built with onnx.helper from the very same `_weights()` arrays.

`onnx_model(name)` gives an onnx.ModelProto whose graph mirrors the model's Tensor forward op for op (Gemm for linear,
Conv/BatchNormalization/MaxPool for the CNNs, a model-local FunctionProto for the transformer's `@aot.function` layer),
so onnxruntime can check and time it and the ONNX frontend can be compared with the Tensor frontend on the same model.
Input names and shapes equal the Tensor model's `inputs`; the single output is named "output".
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 20  # first opset with Gelu
IR_VERSION = 10  # onnx 1.16's IR version: accepted by onnxruntime 1.32 and by the checker for opset 20
FUNCTION_DOMAIN = "aot.models"


def _f32(name: str, shape) -> onnx.ValueInfoProto:
  return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))


def _init(p: dict[str, np.ndarray]) -> list[onnx.TensorProto]:
  return [numpy_helper.from_array(np.ascontiguousarray(v), name=k) for k, v in p.items()]


def _model(name: str, nodes, inputs, out_shape, p: dict, functions=(), domains=()) -> onnx.ModelProto:
  graph = helper.make_graph(nodes, name, [_f32(n, s) for n, s, _ in inputs], [_f32("output", out_shape)], _init(p))
  opsets = [helper.make_opsetid("", OPSET)] + [helper.make_opsetid(d, 1) for d in domains]
  m = helper.make_model(graph, opset_imports=opsets, functions=list(functions), producer_name="aot.models")
  m.ir_version = IR_VERSION
  onnx.checker.check_model(m, full_check=True)
  return m


class _Names:
  """Fresh intermediate value names, readable in a graph dump."""

  def __init__(self):
    self.n = 0

  def __call__(self, hint: str) -> str:
    self.n += 1
    return f"{hint}_{self.n}"


# ---------------------------------------------------------------------------------------------------------------- mlp


def _mlp() -> onnx.ModelProto:
  from . import mlp

  p, model = mlp._weights(), mlp.build()
  nodes, x = [], model.inputs[0][0]
  for i in range(3):
    y = "output" if i == 2 else f"fc{i}"
    nodes.append(helper.make_node("Gemm", [x, f"w{i}", f"b{i}"], [y], name=f"fc{i}", transB=1))
    if i < 2:
      nodes.append(helper.make_node("Relu", [y], [f"relu{i}"], name=f"relu{i}"))
      x = f"relu{i}"
  return _model("mlp", nodes, model.inputs, (mlp.BATCH, 10), p)


# -------------------------------------------------------------------------------------------------------------- mnist


def _mnist() -> onnx.ModelProto:
  from . import mnist

  p, model = mnist._weights(), mnist.build()
  nodes, fresh = [], _Names()

  def node(op, ins, **attrs):
    out = fresh(op.lower())
    nodes.append(helper.make_node(op, ins, [out], name=out, **attrs))
    return out

  ks = {n: k for n, _, _, k in mnist.CONVS}
  conv = lambda x, n: node("Relu", [node("Conv", [x, f"{n}_w", f"{n}_b"], kernel_shape=[ks[n]] * 2)])
  bn = lambda x, n: node("BatchNormalization", [x, f"{n}_w", f"{n}_b", f"{n}_mean", f"{n}_var"], epsilon=1e-5)
  pool = lambda x: node("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2])
  x = pool(bn(conv(conv(model.inputs[0][0], "c1"), "c2"), "bn1"))
  x = pool(bn(conv(conv(x, "c3"), "c4"), "bn2"))
  x = node("Flatten", [x], axis=1)
  nodes.append(helper.make_node("Gemm", [x, "fc_w", "fc_b"], ["output"], name="fc", transB=1))
  return _model("mnist", nodes, model.inputs, (1, 10), p)


# ----------------------------------------------------------------------------------------------------------- resnet18


def _resnet18() -> onnx.ModelProto:
  from . import resnet18

  p, model = resnet18._weights(), resnet18.build()
  nodes, fresh = [], _Names()

  def node(op, ins, hint=None, **attrs):
    out = fresh(hint or op.lower())
    nodes.append(helper.make_node(op, ins, [out], name=out, **attrs))
    return out

  def conv(x, n, stride=1, padding=0):
    k = p[f"{n}.weight"].shape[-1]
    return node("Conv", [x, f"{n}.weight"], n, kernel_shape=[k, k], strides=[stride] * 2, pads=[padding] * 4)

  bn = lambda x, n: node(
    "BatchNormalization", [x] + [f"{n}.{t}" for t in ("weight", "bias", "running_mean", "running_var")], n, epsilon=1e-5
  )
  relu = lambda x: node("Relu", [x])
  x = relu(bn(conv(model.inputs[0][0], "conv1", stride=2, padding=3), "bn1"))
  x = node("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
  for s, b, cin, cout, stride in resnet18.BLOCKS:
    pre = f"layer{s}.{b}"
    out = relu(bn(conv(x, f"{pre}.conv1", stride, 1), f"{pre}.bn1"))
    out = bn(conv(out, f"{pre}.conv2", 1, 1), f"{pre}.bn2")
    if f"{pre}.downsample.0.weight" in p:
      x = bn(conv(x, f"{pre}.downsample.0", stride), f"{pre}.downsample.1")
    x = relu(node("Add", [out, x]))
  x = node("Flatten", [node("GlobalAveragePool", [x])], axis=1)
  nodes.append(helper.make_node("Gemm", [x, "fc.weight", "fc.bias"], ["output"], name="fc", transB=1))
  return _model("resnet18", nodes, model.inputs, (1, 1000), p)


# -------------------------------------------------------------------------------------------------------- transformer


def _transformer_layer() -> onnx.FunctionProto:
  """The `@aot.function` layer of models/transformer.py as a model-local function: activations first, then the weights
  in LAYER_PARAMS order, all as inputs (the weights are not captured in the body)."""
  from . import transformer as t

  nodes, fresh = [], _Names()

  def node(op, ins, hint=None, **attrs):
    out = fresh(hint or op.lower())
    nodes.append(helper.make_node(op, ins, [out], **attrs))
    return out

  def const(hint, value):
    return node("Constant", [], hint, value=numpy_helper.from_array(np.asarray(value)))

  # torch-style (out, in) weights: x.linear(w, b) = x @ w^T + b
  linear = lambda x, w, b: node("Add", [node("MatMul", [x, node("Transpose", [w], perm=[1, 0])]), b])
  to_heads = const("to_heads", np.array([0, 0, t.HEADS, t.HEAD_DIM], dtype=np.int64))  # 0 keeps n and s
  from_heads = const("from_heads", np.array([0, 0, t.WIDTH], dtype=np.int64))
  scale = const("scale", np.float32(math.sqrt(t.HEAD_DIM)))
  heads = lambda y: node("Transpose", [node("Reshape", [y, to_heads])], perm=[0, 2, 1, 3])  # -> (n, heads, s, head_dim)
  x = "x"
  q, k, v = (heads(linear(x, f"w{c}", f"b{c}")) for c in "qkv")
  att = node("Softmax", [node("Div", [node("MatMul", [q, node("Transpose", [k], perm=[0, 1, 3, 2])]), scale])], axis=-1)
  a = node("Reshape", [node("Transpose", [node("MatMul", [att, v])], perm=[0, 2, 1, 3]), from_heads])
  a = linear(a, "wo", "bo")
  x = node("LayerNormalization", [node("Add", [x, a]), "ln1_w", "ln1_b"], axis=-1, epsilon=1e-5)
  h = linear(node("Gelu", [linear(x, "w1", "b1")], approximate="none"), "w2", "b2")
  nodes.append(
    helper.make_node("LayerNormalization", [node("Add", [x, h]), "ln2_w", "ln2_b"], ["y"], axis=-1, epsilon=1e-5)
  )
  return helper.make_function(
    FUNCTION_DOMAIN, "layer", ["x", *t.LAYER_PARAMS], ["y"], nodes, [helper.make_opsetid("", OPSET)]
  )


def _transformer() -> onnx.ModelProto:
  from . import transformer as t

  p, model = t._weights(), t.build()
  nodes, x = [], model.inputs[0][0]
  for i in range(t.LAYERS):
    y = "output" if i == t.LAYERS - 1 else f"layer{i}"
    nodes.append(
      helper.make_node(
        "layer", [x, *(f"l{i}.{n}" for n in t.LAYER_PARAMS)], [y], name=f"layer{i}", domain=FUNCTION_DOMAIN
      )
    )
    x = y
  return _model(
    "transformer",
    nodes,
    model.inputs,
    (1, t.SEQ, t.WIDTH),
    p,
    functions=[_transformer_layer()],
    domains=[FUNCTION_DOMAIN],
  )


_BUILDERS = {"mlp": _mlp, "mnist": _mnist, "resnet18": _resnet18, "transformer": _transformer}


def onnx_model(name: str) -> onnx.ModelProto:
  """The ONNX form of bundled reference model `name` (mlp, mnist, resnet18 or transformer): same weights, same inputs,
  one output named "output". A fresh ModelProto on every call, checked with onnx.checker (full_check)."""
  if name not in _BUILDERS:
    raise ValueError(f"unknown reference model {name!r}; the bundled models are: {', '.join(_BUILDERS)}")
  return _BUILDERS[name]()


def with_batch_dim(model: onnx.ModelProto, dim_param: str = "batch") -> onnx.ModelProto:
  """The model with the first dim of every input and output symbolic (dim_param), as exporters write a batch: the
  graphs above compute every size from their inputs, so they run at any batch."""
  for vi in list(model.graph.input) + list(model.graph.output):
    d = vi.type.tensor_type.shape.dim[0]
    d.Clear()
    d.dim_param = dim_param
  return model
