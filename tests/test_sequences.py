"""Sequences and optionals inside a graph (compile-time lists of tensors) against onnx's reference implementation."""

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from aot.compiler import compile_model
from aot.errors import CompileError
from aot.loader import load

F = TensorProto.FLOAT


def _model(nodes, inputs, outputs):
  g = helper.make_graph(
    nodes,
    "g",
    inputs,
    outputs,
    [
      helper.make_tensor("pos", TensorProto.INT64, [], [1]),
      helper.make_tensor("sizes", TensorProto.INT64, [3], [1, 2, 3]),
    ],
  )
  return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


def test_sequence_ops(tmp_path):
  nodes = [
    helper.make_node("SplitToSequence", ["x", "sizes"], ["parts"], axis=1),  # widths 1, 2, 3
    helper.make_node("SequenceErase", ["parts", "pos"], ["two"]),  # widths 1, 3
    helper.make_node("SequenceInsert", ["two", "y"], ["three"]),  # widths 1, 3, 2
    helper.make_node("ConcatFromSequence", ["three"], ["cat"], axis=1),
    helper.make_node("SequenceLength", ["three"], ["len"]),
    helper.make_node("SequenceAt", ["three", "pos"], ["at"]),
    helper.make_node("SplitToSequence", ["x"], ["rows"], keepdims=0),
    helper.make_node("ConcatFromSequence", ["rows"], ["stacked"], axis=-1, new_axis=1),
    helper.make_node("SequenceEmpty", [], ["empty"]),
    helper.make_node("SequenceConstruct", ["x", "x"], ["pair"]),
    helper.make_node(
      "SequenceMap",
      ["pair"],
      ["doubled"],
      body=helper.make_graph(
        [helper.make_node("Add", ["e", "e"], ["d"])],
        "body",
        [helper.make_tensor_value_info("e", F, None)],
        [helper.make_tensor_value_info("d", F, None)],
      ),
    ),
    helper.make_node("ConcatFromSequence", ["doubled"], ["dcat"], axis=0),
    helper.make_node("Optional", ["x"], ["opt"]),
    helper.make_node("OptionalHasElement", ["opt"], ["has"]),
    helper.make_node("OptionalGetElement", ["opt"], ["got"]),
    helper.make_node("OptionalHasElement", [], ["none"]),
  ]
  outs = ["cat", "len", "at", "stacked", "dcat", "has", "got", "none"]
  m = _model(
    nodes,
    [helper.make_tensor_value_info("x", F, [2, 6]), helper.make_tensor_value_info("y", F, [2, 2])],
    [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outs],
  )
  rng = np.random.default_rng(0)
  x, y = rng.standard_normal((2, 6)).astype(np.float32), rng.standard_normal((2, 2)).astype(np.float32)
  got = load(compile_model(m, out_dir=tmp_path, name="m"))(x, y)
  want = ReferenceEvaluator(m).run(None, {"x": x, "y": y})
  # onnx 1.23's reference Optional wraps its tensor in an extra axis; OptionalGetElement gives the tensor back
  want[outs.index("got")] = x
  for o, g, w in zip(outs, got, want):
    np.testing.assert_array_equal(g, w, err_msg=o)


def test_sequences_in_and_out_are_lists_at_load_and_tensors_at_the_c_api(tmp_path):
  """A sequence input of 3 and output of 4 tensors: x_0..x_2 and y_0..y_3 in the header, lists through aot.load."""
  seq = helper.make_tensor_sequence_value_info
  nodes = [
    helper.make_node("SequenceInsert", ["x", "t"], ["y"]),
    helper.make_node("ConcatFromSequence", ["y"], ["c"], axis=0),
  ]
  m = _model(
    nodes,
    [seq("x", F, None), helper.make_tensor_value_info("t", F, [2])],
    [seq("y", F, None), helper.make_tensor_value_info("c", F, None)],
  )
  art = compile_model(m, out_dir=tmp_path, name="m", shapes={"x": [(1,), (2,), (3,)]})
  header = (tmp_path / "m.h").read_text()
  # (t is a name the profiled run declares for itself: the parameter is t_, aot/artifact.py GENERATED_NAMES)
  assert (
    "const float *x_0, const float *x_1, const float *x_2, const float *t_, float *y_0, float *y_1, float *y_2, "
    "float *y_3, float *c" in header
  ), header
  xs, t = (
    [np.arange(1, dtype=np.float32), np.arange(2, dtype=np.float32) + 5, -np.arange(3, dtype=np.float32)],
    np.array([7, 8], np.float32),
  )
  run = load(art)
  got_y, got_c = run(xs, t)
  want_y, want_c = ReferenceEvaluator(m).run(None, {"x": xs, "t": t})
  assert isinstance(got_y, list) and len(got_y) == len(want_y) == 4
  for g, w in zip(got_y + [got_c], want_y + [want_c]):
    np.testing.assert_array_equal(g, w)
  with pytest.raises(ValueError, match=r"m input 'x': expected a sequence \(list\) of 3 tensors, got 2 tensors"):
    run(xs[:2], t)


def test_sequence_input_without_its_length_names_the_input(tmp_path):
  m = _model(
    [helper.make_node("ConcatFromSequence", ["x"], ["c"], axis=0)],
    [helper.make_tensor_sequence_value_info("x", F, None)],
    [helper.make_tensor_value_info("c", F, None)],
  )
  with pytest.raises(
    CompileError,
    match=r"input 'x' is a sequence: its length and element shapes must be known at "
    r"compile time \(shapes=\{'x': \[shape, \.\.\.\]\}, "
    r"or --shape x=\[DIMS,\.\.\.\]\)",
  ):
    compile_model(m, out_dir=tmp_path, name="m")


@pytest.mark.parametrize("present", [True, False])
def test_optional_input_present_or_empty(tmp_path, present):
  opt = helper.make_tensor_type_proto(F, [3])
  m = _model(
    [helper.make_node("OptionalHasElement", ["o"], ["has"])],
    [helper.make_value_info("o", helper.make_optional_type_proto(opt))],
    [helper.make_tensor_value_info("has", TensorProto.BOOL, None)],
  )
  art = compile_model(m, out_dir=tmp_path, name="m", shapes={"o": [3] if present else None})
  x = np.ones(3, np.float32) if present else None
  got = load(art)(x)
  assert got == ReferenceEvaluator(m).run(None, {"o": x})[0] == np.bool_(present)
  assert len(art.inputs) == (1 if present else 0)


def test_loop_building_a_sequence_from_an_optional_input(tmp_path):
  """onnx's test_loop16_seq_none, which its runner cannot compare (it recurses into the 0-d first element)."""
  from onnx.backend.test.loader import load_model_tests

  case = next(c for c in load_model_tests(kind="node") if c.name == "test_loop16_seq_none")
  ins, (want,) = case.data_sets[0]
  from aot.frontends.onnx_ops_sequence import container_spec

  art = compile_model(
    case.model,
    out_dir=tmp_path,
    name="m",
    bind={"trip_count": ins[0], "cond": ins[1]},
    shapes={"opt_seq": container_spec(ins[2])},
  )
  got = load(art)(ins[2])
  assert len(got) == len(want) == 6
  for g, w in zip(got, want):
    np.testing.assert_array_equal(g, w)


def test_position_out_of_range_names_the_node(tmp_path):
  m = _model(
    [
      helper.make_node("SequenceConstruct", ["x"], ["s"]),
      helper.make_node("SequenceAt", ["s", "sizes3"], ["y"], name="at"),
    ],
    [helper.make_tensor_value_info("x", F, [2])],
    [helper.make_tensor_value_info("y", F, [2])],
  )
  m.graph.initializer.append(helper.make_tensor("sizes3", TensorProto.INT64, [], [3]))
  with pytest.raises(CompileError, match="SequenceAt node 'at': position 3 is outside a sequence of length 1"):
    compile_model(m, out_dir=tmp_path, name="m")
