"""Add + LayerNormalization to com.microsoft's SkipLayerNormalization where onnxruntime's graph optimizer fuses them
(its default level; onnxruntime/core/optimizer/skip_layer_norm_fusion.cc): an ONNX graph rewrite before the model is
read (frontends/onnx.py), so that the pattern is computed as onnxruntime's SkipLayerNormalization kernel computes it
(frontends/onnx_ops_contrib.py: a float32 Welford mean, not the plain LayerNormalization kernel's double sum). A row
a ulp apart just before a DynamicQuantizeLinear moves its scale and then 3-4e-3 of the dynamically quantized
transformer's output (seeds 7 and 9, issue 14).

onnxruntime's conditions, all of them here: the LayerNormalization (float inputs) reads an Add whose inputs are both
3-D of the same static dims (the first may be the same dim_param), read by nothing else and not a graph output. An
Add before it on either side that adds a 1-D constant bias over the last axis (read by nothing else either) goes in
as the fused node's bias, which onnxruntime adds after the skip: (a + skip) + bias, not (a + bias) + skip. Not
fused here: a bias Add after a MatMul, or after quantize_dynamic's MatMulInteger -> Cast -> Mul, which onnxruntime's
MatMul fusions take first (into Gemm, MatMulIntegerToFloat, DynamicQuantizeMatMul; the float and the dynamic
reference transformers). Only float32 (our SkipLayerNormalization computes other types as LayerNormalization of the
sum, as before) and only a LayerNormalization over the last axis (onnxruntime's fusion does not check the axis)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MS = "com.microsoft"
# the fused node's epsilon where the LayerNormalization has none (onnxruntime's kDefaultSkipLayerNormEpsilon)
DEFAULT_EPSILON = 1e-12
# producers whose bias Add onnxruntime fuses into the product before it fuses the layer norm
_BIAS_TAKEN_BY = {"MatMul", "Gemm", "FusedMatMul"}
FLOAT = 1  # TensorProto.FLOAT


def _candidates(g) -> list:
  """LayerNormalization nodes that read an Add's output: no shape inference is needed for a model without any."""
  adds = {n.output[0] for n in g.node if n.op_type == "Add" and n.domain in ("", "ai.onnx")}
  return [n for n in g.node if n.op_type == "LayerNormalization" and n.domain in ("", "ai.onnx") and n.input[0] in adds]


def _value_types(model) -> dict:
  """name -> TypeProto's tensor_type for every value shape inference types (the model as declared, as onnxruntime
  sees it)."""
  import onnx

  from aot.frontends.onnx_infer import weightless

  # (the weights left out: inference of ViT-B/16 with its 344 MB serialised took 1 of its 8 s of compile)
  try:
    inferred = onnx.shape_inference.infer_shapes(weightless(model, value_info=True), strict_mode=False, data_prop=True)
  except Exception:
    return {}
  g = inferred.graph
  types = {
    vi.name: vi.type.tensor_type for vi in [*g.input, *g.value_info, *g.output] if vi.type.HasField("tensor_type")
  }
  for t in g.initializer:
    tt = onnx.TypeProto().tensor_type
    tt.elem_type = t.data_type
    for d in t.dims:
      tt.shape.dim.add().dim_value = d
    types[t.name] = tt
  return types


def _dims(types: dict, name: str):
  tt = types.get(name)
  return list(tt.shape.dim) if tt is not None and tt.HasField("shape") else None


def _float(types: dict, names) -> bool:
  return all(n == "" or (n in types and types[n].elem_type == FLOAT) for n in names)


def _first_add_ok(add, types: dict) -> bool:
  # CheckFirstAdd: both inputs 3-D, every dim the same value (the first may be the same dim_param instead)
  a, b = _dims(types, add.input[0]), _dims(types, add.input[1])
  if a is None or b is None or len(a) != 3 or len(b) != 3:
    return False
  for i, (x, y) in enumerate(zip(a, b)):
    same_value = x.HasField("dim_value") and y.HasField("dim_value") and x.dim_value == y.dim_value
    same_param = i == 0 and x.HasField("dim_param") and y.HasField("dim_param") and x.dim_param == y.dim_param
    if not (same_value or same_param):
      return False
  return True


def _second_add_ok(add, types: dict, constants: set) -> bool:
  # CheckSecondAdd: a constant 1-D bias as long as the 3-D input's last dim
  if add.input[1] not in constants:
    return False
  a, b = _dims(types, add.input[0]), _dims(types, add.input[1])
  return (
    a is not None
    and b is not None
    and len(a) == 3
    and len(b) == 1
    and a[2].HasField("dim_value")
    and b[0].HasField("dim_value")
    and a[2].dim_value == b[0].dim_value
  )


def _last_axis(ln, types: dict) -> bool:
  axis = next((a.i for a in ln.attribute if a.name == "axis"), -1)
  rank = len(_dims(types, ln.input[0]) or [])
  return axis == -1 or (rank > 0 and axis == rank - 1)


@dataclass
class _Fusion:
  ln: Any  # the LayerNormalization NodeProto that becomes the SkipLayerNormalization
  inputs: list[str]  # the fused node's input, skip and (Formats 1 and 2) bias
  removed: list  # the Add NodeProtos it takes in


@dataclass
class _Graph:
  """What onnxruntime's conditions ask of the graph: each value's type, producer and number of readers, and which
  values are graph outputs or constants."""

  types: dict
  producer: dict
  uses: dict
  outputs: set
  constants: set

  @staticmethod
  def of(model) -> _Graph:
    g = model.graph
    uses: dict = {}
    for n in g.node:
      for i in n.input:
        uses[i] = uses.get(i, 0) + 1
      # a value a subgraph reads is one more edge (an implicit input of its node)
      for a in n.attribute:
        for sub in [a.g] if a.HasField("g") else list(a.graphs):
          for sn in sub.node:
            for i in sn.input:
              uses[i] = uses.get(i, 0) + 1
    graph_inputs = {i.name for i in g.input}
    # initializers onnxruntime treats as constant (not overridable as inputs), and Constant nodes it folds into them
    constants = {t.name for t in g.initializer if t.name not in graph_inputs}
    constants |= {n.output[0] for n in g.node if n.op_type == "Constant" and n.domain in ("", "ai.onnx")}
    producer = {o: n for n in g.node for o in n.output if o}
    return _Graph(_value_types(model), producer, uses, {o.name for o in g.output}, constants)

  def single_use(self, add) -> bool:
    return self.uses.get(add.output[0], 0) == 1 and add.output[0] not in self.outputs

  def bias_add(self, name: str):
    """The Add producing `name` if onnxruntime takes it into the fusion as the bias, else None."""
    add = self.producer.get(name)
    if add is None or add.op_type != "Add" or add.domain not in ("", "ai.onnx"):
      return None
    if not self.single_use(add) or not _float(self.types, add.input):
      return None
    if not _second_add_ok(add, self.types, self.constants):
      return None
    before = self.producer.get(add.input[0])
    if before is not None and (
      before.op_type in _BIAS_TAKEN_BY
      or (before.op_type == "Mul" and (c := self.producer.get(before.input[0])) is not None and c.op_type == "Cast")
    ):
      return None
    return add

  def fusion(self, ln) -> _Fusion | None:
    """How onnxruntime fuses this LayerNormalization with the Add(s) before it, or None where it does not."""
    add1 = self.producer[ln.input[0]]
    if not (_float(self.types, ln.input) and _float(self.types, add1.input) and _last_axis(ln, self.types)):
      return None
    if not self.single_use(add1) or not _first_add_ok(add1, self.types):
      return None
    ins, removed = [add1.input[0], add1.input[1]], [add1]
    # Format 1 (the bias before the first input), else Format 2 (before the second), else Format 3 (none)
    for side in (0, 1):
      if (add2 := self.bias_add(add1.input[side])) is not None:
        ins[side] = add2.input[0]
        ins.append(add2.input[1])
        removed.append(add2)
        break
    return _Fusion(ln, ins, removed)


def fuse_skip_layer_norm(model, in_place: bool = False):
  """The model with each Add (+ bias Add) + LayerNormalization onnxruntime fuses as one com.microsoft
  SkipLayerNormalization (module docstring). The model itself is changed only when in_place; else fused in a copy."""
  import onnx

  if not _candidates(model.graph):
    return model
  graph = _Graph.of(model)
  fusions = [f for ln in _candidates(model.graph) if (f := graph.fusion(ln)) is not None]
  if not fusions:
    return model
  if not in_place:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    model = copy
  _rewrite(model, fusions)
  return model


def _rewrite(model, fusions: list[_Fusion]) -> None:
  """Each fused LayerNormalization replaced by its SkipLayerNormalization in place, and the Adds it took in removed."""
  from onnx import helper

  g = model.graph
  by_output = {n.output[0]: k for k, n in enumerate(g.node)}
  for f in fusions:
    ln, ins = f.ln, f.inputs
    beta = ln.input[2] if len(ln.input) > 2 else ""
    eps = next((a.f for a in ln.attribute if a.name == "epsilon"), DEFAULT_EPSILON)
    fused = helper.make_node(
      "SkipLayerNormalization", [ins[0], ins[1], ln.input[1], beta, *ins[2:]], list(ln.output), domain=MS
    )
    fused.name = f"{ln.name or ln.output[0]}_skip"
    fused.attribute.append(helper.make_attribute("epsilon", eps))
    g.node[by_output[ln.output[0]]].CopyFrom(fused)
  # the fused Adds (each read only by what is now the SkipLayerNormalization)
  gone = {n.output[0] for f in fusions for n in f.removed}
  keep = [n for n in g.node if not (n.op_type == "Add" and n.output[0] in gone)]
  del g.node[:]
  g.node.extend(keep)
  if not any(o.domain == MS for o in model.opset_import):
    model.opset_import.append(helper.make_opsetid(MS, 1))
