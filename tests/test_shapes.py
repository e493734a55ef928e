"""Shapes and the checks around them: unknown dims an exporter leaves in a model, impossible dims, and tensors past
2**31 elements (whose index arithmetic must not wrap in 32 bits). Results checked against onnxruntime or an
independent numpy computation."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper as oh
from onnx import numpy_helper

import aot
from aot.errors import CompileError
from aot.frontends.onnx import check_inferred_shapes
from aot.frontends.tensor import Tensor


def make(nodes, inputs, outputs, inits=(), opset=18):
  m = oh.make_model(
    oh.make_graph(nodes, "g", inputs, outputs, initializer=list(inits)), opset_imports=[oh.make_opsetid("", opset)]
  )
  m.ir_version = 9
  return m


def ort_run(model, feed):
  return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)


W = np.arange(6, dtype=np.float32).reshape(3, 2) / 4


def classifier(batch_in, batch_out):
  """A MatMul + Softmax classifier whose exporter wrote its batch dim as batch_in / batch_out (also in value_info)."""
  m = make(
    [oh.make_node("MatMul", ["x", "w"], ["l"]), oh.make_node("Softmax", ["l"], ["y"], axis=-1)],
    [oh.make_tensor_value_info("x", TP.FLOAT, [batch_in, 3])],
    [oh.make_tensor_value_info("y", TP.FLOAT, [batch_out, 2])],
    [numpy_helper.from_array(W, "w")],
  )
  m.graph.value_info.append(oh.make_tensor_value_info("l", TP.FLOAT, [batch_out, 2]))
  return m


@pytest.mark.parametrize("batch_out", [-1, 0, "batch", 7])
def test_unknown_output_dims_are_not_a_mismatch(batch_out):
  # a Paddle export declares its output (-1, 2); a 0 or a dim_param is the same unknown, and a wrong size is the
  # exporter's claim (onnxruntime overrides it with what the graph computes, and so does the frontend)
  m = classifier(1, batch_out)
  x = np.random.default_rng(0).standard_normal((1, 3)).astype(np.float32)
  art = aot.compile_model(m)
  np.testing.assert_allclose(aot.load(art)(x), ort_run(m, {"x": x})[0], rtol=1e-6)


def test_unknown_input_batch_is_pinned_and_checked_from_the_pinned_shape():
  m = classifier(-1, -1)
  with pytest.raises(CompileError, match=r"x\[0\] \(declared -1\)"):
    aot.compile_model(m)
  x = np.random.default_rng(1).standard_normal((4, 3)).astype(np.float32)
  art = aot.compile_model(m, shapes={"x": (4, 3)})
  np.testing.assert_allclose(aot.load(art)(x), ort_run(m, {"x": x})[0], rtol=1e-6)


def test_shape_inference_still_catches_a_traced_shape_onnx_disagrees_with():
  m = classifier(1, -1)
  wrong = Tensor.input("x", (3, 2))
  with pytest.raises(CompileError, match=r"output 'y': ONNX shape inference gives \(1, 2\), the traced graph \(3, 2\)"):
    check_inferred_shapes(m, {"x": (1, 3)}, [wrong])
  check_inferred_shapes(m, {"x": (1, 3)}, [Tensor.input("x", (1, 2))])


def test_negative_input_dim_is_rejected_naming_input_and_dim():
  m = make(
    [oh.make_node("Relu", ["x"], ["y"])],
    [oh.make_tensor_value_info("x", TP.FLOAT, [1, -3])],
    [oh.make_tensor_value_info("y", TP.FLOAT, None)],
  )
  with pytest.raises(CompileError, match=r"x\[1\] \(declared -3\)"):
    aot.compile_model(m)
  with pytest.raises(CompileError, match=r"input 'x' of shape \(1, -3\): dim 1 is -3"):
    aot.compile_model(m, shapes={"x": (1, -3)})
  with pytest.raises(CompileError, match=r"input 'a' of shape \(2, -1\): dim 1 is -1"):
    aot.compile_model(lambda a: a.relu(), [((2, -1), np.float32)])


def test_a_negative_dim_from_an_op_is_rejected_naming_the_node():
  # a Reshape to (-2, -3) has the right element count, and compiled into a kernel named k0_e_-2_-3
  for op, shape, what in (("Reshape", [-2, -3], "reshape"), ("ConstantOfShape", [2, -3], "expand")):
    nodes = (
      [oh.make_node("Reshape", ["x", "s"], ["y"], name="r")]
      if op == "Reshape"
      else [oh.make_node("ConstantOfShape", ["s"], ["c"], name="c"), oh.make_node("Add", ["c", "x"], ["y"])]
    )
    m = make(
      nodes,
      [oh.make_tensor_value_info("x", TP.FLOAT, [6] if op == "Reshape" else [1])],
      [oh.make_tensor_value_info("y", TP.FLOAT, None)],
      [numpy_helper.from_array(np.array(shape, np.int64), "s")],
    )
    with pytest.raises(CompileError, match=rf"{op} node '.': {what} to shape \({shape[0]}, -3\): a dim is a size"):
      aot.compile_model(m)
  with pytest.raises(ValueError, match=r"reshape to shape \(-2, -3\): a dim is a size"):
    aot.compile_model(lambda a: a.reshape(-2, -3), [((6,), np.float32)])


def test_zero_size_dims_keep_working():
  m = make(
    [oh.make_node("Relu", ["x"], ["r"]), oh.make_node("ReduceSum", ["r"], ["y"], keepdims=0)],
    [oh.make_tensor_value_info("x", TP.FLOAT, [0, 3])],
    [oh.make_tensor_value_info("y", TP.FLOAT, None)],
  )
  x = np.zeros((0, 3), np.float32)
  got = aot.load(aot.compile_model(m))(x)
  want = ort_run(m, {"x": x})[0]
  assert got.shape == want.shape == ()
  np.testing.assert_array_equal(got, want)
  art = aot.compile_model(lambda a, b: (a.relu(), b.sum(axis=0)), [((0, 3), np.float32), ((0, 2), np.float32)])
  outs = aot.load(art)(np.zeros((0, 3), np.float32), np.zeros((0, 2), np.float32))
  assert outs[0].shape == (0, 3)
  np.testing.assert_array_equal(outs[1], np.zeros(2, np.float32))


# *** past 2**31 elements: 64-bit index arithmetic where 32 bits would wrap, 32 bits elsewhere ***


@pytest.mark.parametrize("target", ["c", "llvm"])
def test_sum_of_a_lazily_expanded_scalar_past_2_31_elements(target):
  # the reduction loop runs 2**32 (ONNX) and 2**40 (Tensor API) times: its counter must not wrap (it did: the sum
  # came out 0, or the run failed). Integer sums, so the expected values are exact
  m = make(
    [oh.make_node("Expand", ["x", "shape"], ["e"]), oh.make_node("ReduceSum", ["e"], ["y"], keepdims=0)],
    [oh.make_tensor_value_info("x", TP.INT64, [])],
    [oh.make_tensor_value_info("y", TP.INT64, None)],
    [numpy_helper.from_array(np.array([2**32], np.int64), "shape")],
  )
  assert int(aot.load(aot.compile_model(m, target=target))(np.int64(3))) == 3 * 2**32
  art = aot.compile_model(lambda x: x.reshape(1).expand(2**40).sum(), [((), np.int64)], target=target)
  assert int(aot.load(art)(np.int64(-5))) == -5 * 2**40


N, STEP = 5 << 28, 575_000_001  # 3 * N > 2**31 elements, read every STEP-th


def strided(x):
  """Every STEP-th element of x broadcast to (3, N) and flattened: 7 elements, at flat indices up to 6 * STEP."""
  return x.reshape(3, 1).expand(3, N).reshape(3 * N)[: 7 * STEP].reshape(7, STEP)[:, 0]


@pytest.mark.parametrize("target", ["c", "llvm"])
def test_an_index_past_2_31_is_computed_in_64_bits(target):
  # r * STEP passes 2**31: in 32 bits it wrapped and read outside x (a wrong answer, silently)
  x = np.array([10, 20, 30], np.int64)
  got = aot.load(aot.compile_model(strided, [((3,), np.int64)], target=target))(x)
  np.testing.assert_array_equal(got, x[np.arange(7) * STEP // N])


def kernel_sources(fn, example_inputs, target):
  from aot.compiler import render, trace
  from aot.scheduler.schedule import schedule

  traced = trace(fn, example_inputs)
  files = render(traced.name, schedule(traced.outputs, traced.inputs), target).files
  return "\n".join(v for k, v in files.items() if k.endswith((".c", ".ll")))


def test_a_buffer_past_2_31_elements_is_indexed_in_64_bits_and_small_ones_in_32():
  # (built, not run: the output would take 2 GiB; run by hand, 2**31 + 1 int8 elements came out right on c and llvm)
  big = lambda x: x.reshape(1, 3).expand(715827883, 3) + 1  # 2**31 + 1 elements
  src = kernel_sources(big, [((3,), np.int8)], "c")
  assert "for (int64_t r0 = start; r0 < end; r0++)" in src and "for (int64_t r1 = 0; r1 < 3LL; r1++)" in src
  assert "add nsw i64" in kernel_sources(big, [((3,), np.int8)], "llvm")
  # one axis past 2**31 is one loop the runtime cannot split in int: it runs whole
  src = kernel_sources(lambda x: x.expand(2**31 + 1) + 1, [((1,), np.int8)], "c")
  assert "for (int64_t r0 = 0; r0 < 2147483649LL; r0++)" in src and ", 0, 1);" in src
  small = lambda x: x.reshape(1, 3).expand(1000, 3) + 1
  src = kernel_sources(small, [((3,), np.int8)], "c")
  assert "for (int r0 = start; r0 < end; r0++)" in src and "int64_t r" not in src
  assert " i64 " not in kernel_sources(small, [((3,), np.int8)], "llvm").split("define", 1)[1]


def test_a_gpu_target_refuses_what_it_would_index_in_32_bits():
  from aot.compiler import render, trace
  from aot.scheduler.schedule import schedule

  traced = trace(strided, [((3,), np.int64)])
  with pytest.raises(CompileError, match=r"indexes past 2\*\*31-1 elements, which this target computes in 32 bits"):
    render(traced.name, schedule(traced.outputs, traced.inputs), "cuda")


@pytest.mark.parametrize("op", ["CumSum", "CumProd"])
def test_a_cumulative_op_past_its_axis_limit_is_a_compile_error_naming_node_and_axis(op):
  # an axis of 2**34 elements: a user's limit (CUMULATIVE_AXIS_MAX), not a compiler bug
  from aot.frontends.onnx_ops_index import CUMULATIVE_AXIS_MAX

  n = 1 << 34
  m = make(
    [oh.make_node(op, ["x", "axis"], ["y"], name="cs")],
    [oh.make_tensor_value_info("x", TP.FLOAT, [2, n])],
    [oh.make_tensor_value_info("y", TP.FLOAT, [2, n])],
    [oh.make_tensor("axis", TP.INT64, [], [-1])],
    opset=26,
  )
  with pytest.raises(
    CompileError,
    match=rf"{op} node 'cs': axis 1 of input 'x' \(2, {n}\) has {n} elements; at most "
    rf"{CUMULATIVE_AXIS_MAX} are supported",
  ):
    aot.compile_model(m)


def test_a_tensor_past_64_bit_sizes_is_a_compile_error_naming_it():
  # its byte size would wrap in the kernels' int64 indices and the header's NAME_SIZE macros: refused, not compiled
  big = [1 << 31, 1 << 31]  # 2**62 float32 elements: 2**64 bytes
  relu = make(
    [oh.make_node("Relu", ["x"], ["y"])],
    [oh.make_tensor_value_info("x", TP.FLOAT, big)],
    [oh.make_tensor_value_info("y", TP.FLOAT, big)],
  )
  with pytest.raises(CompileError, match=rf"input 'x' \(2147483648, 2147483648\) is {1 << 64} bytes of float32"):
    aot.compile_model(relu)
  expand = make(
    [oh.make_node("Expand", ["x", "shape"], ["y"], name="e")],
    [oh.make_tensor_value_info("x", TP.FLOAT, [1])],
    [oh.make_tensor_value_info("y", TP.FLOAT, big)],
    [oh.make_tensor("shape", TP.INT64, [2], big)],
  )
  with pytest.raises(CompileError, match=r"Expand node 'e': output 'y' \(2147483648, 2147483648\) is \d+ bytes"):
    aot.compile_model(expand)
