"""Sequences and optionals inside a graph (compile-time lists of tensors) against onnx's reference implementation."""
import numpy as np
import pytest
from onnx import helper, TensorProto
from onnx.reference import ReferenceEvaluator
from aot.compiler import compile_model
from aot.loader import load
from aot.errors import CompileError

F = TensorProto.FLOAT

def _model(nodes, inputs, outputs):
  g = helper.make_graph(nodes, "g", inputs, outputs,
                        [helper.make_tensor("pos", TensorProto.INT64, [], [1]),
                         helper.make_tensor("sizes", TensorProto.INT64, [3], [1, 2, 3])])
  return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])

def test_sequence_ops(tmp_path):
  nodes = [
    helper.make_node("SplitToSequence", ["x", "sizes"], ["parts"], axis=1),           # widths 1, 2, 3
    helper.make_node("SequenceErase", ["parts", "pos"], ["two"]),                     # widths 1, 3
    helper.make_node("SequenceInsert", ["two", "y"], ["three"]),                      # widths 1, 3, 2
    helper.make_node("ConcatFromSequence", ["three"], ["cat"], axis=1),
    helper.make_node("SequenceLength", ["three"], ["len"]),
    helper.make_node("SequenceAt", ["three", "pos"], ["at"]),
    helper.make_node("SplitToSequence", ["x"], ["rows"], keepdims=0),
    helper.make_node("ConcatFromSequence", ["rows"], ["stacked"], axis=-1, new_axis=1),
    helper.make_node("SequenceEmpty", [], ["empty"]),
    helper.make_node("SequenceConstruct", ["x", "x"], ["pair"]),
    helper.make_node("SequenceMap", ["pair"], ["doubled"], body=helper.make_graph(
      [helper.make_node("Add", ["e", "e"], ["d"])], "body", [helper.make_tensor_value_info("e", F, None)],
      [helper.make_tensor_value_info("d", F, None)])),
    helper.make_node("ConcatFromSequence", ["doubled"], ["dcat"], axis=0),
    helper.make_node("Optional", ["x"], ["opt"]),
    helper.make_node("OptionalHasElement", ["opt"], ["has"]),
    helper.make_node("OptionalGetElement", ["opt"], ["got"]),
    helper.make_node("OptionalHasElement", [], ["none"]),
  ]
  outs = ["cat", "len", "at", "stacked", "dcat", "has", "got", "none"]
  m = _model(nodes, [helper.make_tensor_value_info("x", F, [2, 6]), helper.make_tensor_value_info("y", F, [2, 2])],
             [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outs])
  rng = np.random.default_rng(0)
  x, y = rng.standard_normal((2, 6)).astype(np.float32), rng.standard_normal((2, 2)).astype(np.float32)
  got = load(compile_model(m, out_dir=tmp_path, name="m"))(x, y)
  want = ReferenceEvaluator(m).run(None, {"x": x, "y": y})
  # onnx 1.23's reference Optional wraps its tensor in an extra axis; OptionalGetElement gives the tensor back
  want[outs.index("got")] = x
  for o, g, w in zip(outs, got, want):
    np.testing.assert_array_equal(g, w, err_msg=o)

def test_sequence_output_is_a_clear_error(tmp_path):
  m = _model([helper.make_node("SequenceConstruct", ["x"], ["s"])], [helper.make_tensor_value_info("x", F, [2])],
             [helper.make_tensor_value_info("s", TensorProto.UNDEFINED, None)])
  with pytest.raises(CompileError, match="output 's' is not a tensor"):
    compile_model(m, out_dir=tmp_path, name="m")

def test_position_out_of_range_names_the_node(tmp_path):
  m = _model([helper.make_node("SequenceConstruct", ["x"], ["s"]), helper.make_node("SequenceAt", ["s", "sizes3"], ["y"],
                                                                                       name="at")],
             [helper.make_tensor_value_info("x", F, [2])], [helper.make_tensor_value_info("y", F, [2])])
  m.graph.initializer.append(helper.make_tensor("sizes3", TensorProto.INT64, [], [3]))
  with pytest.raises(CompileError, match="SequenceAt node 'at': position 3 is outside a sequence of length 1"):
    compile_model(m, out_dir=tmp_path, name="m")
