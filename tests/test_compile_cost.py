"""Compile-time work grows with the size of what is produced: a graph twice as long costs about twice the rewriting.
Work is counted in pattern-matcher calls (deterministic), not seconds (noisy on a loaded machine)."""

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from aot.compiler import resolve
from aot.core.rewrite import PatternMatcher
from aot.scheduler.schedule import schedule

# doubling the graph may cost a little more than double (a longer chain has a few longer index expressions), but not
# the ~2.8x of the old quadratic walk (16 -> 32 blocks: 10982 -> 31106 calls; linear: 6024 -> 11972); the QOperator
# ladder's concats, found a level a round after a first round exponential in the depth, cost 55,775 calls at 8 blocks
# and 594k at 16 (11,705 now)
LINEAR_GROWTH = 2.3


def _dense_chain(blocks: int):
  """A DenseNet-like ladder: each block concatenates its input with a slice of relu(input * w), so every block's
  concat is read (padded) by the next one."""
  nodes, inits = [], []
  x, c = "x", 4
  for k in range(blocks):
    inits.append(numpy_helper.from_array(np.full((1, c, 1, 1), 0.5 + k / 64, np.float32), f"w{k}"))
    nodes.append(helper.make_node("Mul", [x, f"w{k}"], [f"m{k}"]))
    nodes.append(helper.make_node("Relu", [f"m{k}"], [f"r{k}"]))
    nodes.append(helper.make_node("Slice", [f"r{k}", "starts", "ends", "axes"], [f"g{k}"]))
    nodes.append(helper.make_node("Concat", [x, f"g{k}"], [f"x{k}"], axis=1))
    x, c = f"x{k}", c + 2
  for name, v in (("starts", [0]), ("ends", [2]), ("axes", [1])):
    inits.append(numpy_helper.from_array(np.array(v, np.int64), name))
  graph = helper.make_graph(
    nodes,
    "dense_chain",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
    [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, c, 8, 8])],
    inits,
  )
  return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _quantized_dense_chain(blocks: int):
  """The ladder in QOperator form: each block's uint8 concat (com.microsoft's QLinearConcat) is read by the next one
  and by the block's DequantizeLinear, each through its own dequantize/requantize chain of elementwise ops."""
  nodes, inits = [], []
  const = lambda name, v: inits.append(numpy_helper.from_array(np.asarray(v), name))
  const("s", np.float32(0.05))
  const("z", np.uint8(10))
  const("s2", np.float32(0.04))
  const("z2", np.uint8(12))
  const("z3", np.uint8(11))
  for name, v in (("starts", [0]), ("ends", [2]), ("axes", [1])):
    const(name, np.array(v, np.int64))
  x, c = "x", 4
  for k in range(blocks):
    const(f"w{k}", np.full((1, c, 1, 1), 0.5 + k / 64, np.float32))
    nodes.append(helper.make_node("DequantizeLinear", [x, "s", "z"], [f"d{k}"]))
    nodes.append(helper.make_node("Mul", [f"d{k}", f"w{k}"], [f"m{k}"]))
    nodes.append(helper.make_node("Relu", [f"m{k}"], [f"r{k}"]))
    nodes.append(helper.make_node("QuantizeLinear", [f"r{k}", "s2", "z2"], [f"q{k}"]))
    nodes.append(helper.make_node("Slice", [f"q{k}", "starts", "ends", "axes"], [f"g{k}"]))
    # (the output's zero point not the input's: requantized, not copied)
    concat = ["s", "z3", x, "s", "z", f"g{k}", "s2", "z2"]
    nodes.append(helper.make_node("QLinearConcat", concat, [f"x{k}"], axis=1, domain="com.microsoft"))
    x, c = f"x{k}", c + 2
  graph = helper.make_graph(
    nodes,
    "quantized_dense_chain",
    [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 4, 8, 8])],
    [helper.make_tensor_value_info(x, TensorProto.UINT8, [1, c, 8, 8])],
    inits,
  )
  return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13), helper.make_opsetid("com.microsoft", 1)])


def _schedule_work(model, monkeypatch) -> tuple[int, int]:
  """(kernels, pattern-matcher calls) of scheduling model."""
  calls = [0]
  rewrite = PatternMatcher.rewrite

  def counted(self, u, ctx=None):
    calls[0] += 1
    return rewrite(self, u, ctx)

  traced = resolve(model)
  monkeypatch.setattr(PatternMatcher, "rewrite", counted)
  sched = schedule(traced.outputs, traced.inputs, traced.output_names)
  monkeypatch.setattr(PatternMatcher, "rewrite", rewrite)
  return len(sched.kernels), calls[0]


# (the QOperator ladder at 8 and 16 blocks: its old exponential work at 32 would not end)
@pytest.mark.parametrize(
  "ladder, blocks", [(_dense_chain, 16), (_quantized_dense_chain, 8)], ids=["float", "qoperator"]
)
def test_concat_ladder_schedules_in_linear_work(monkeypatch, ladder, blocks):
  small_kernels, small = _schedule_work(ladder(blocks), monkeypatch)
  big_kernels, big = _schedule_work(ladder(2 * blocks), monkeypatch)
  # one kernel per block (each concat is read by the next block's multiply and its concat): twice the kernels...
  assert (small_kernels, big_kernels) == (blocks, 2 * blocks)
  # ...for about twice the work
  assert big / small < LINEAR_GROWTH, f"{blocks} -> {2 * blocks} blocks: {small} -> {big} rewrite calls"


def _encoder_layers(layers: int, width: int = 64, rows: int = 32):
  """`layers` residual blocks of one form, each its own weights: h = LayerNorm(h + relu(h @ W_k + b_k)), which
  onnxruntime (and the frontend, frontends/onnx_skip_ln.py) computes as a SkipLayerNormalization's 64-step
  recurrence per row."""
  rng = np.random.default_rng(0)
  nodes, inits, h = [], [], "x"
  for k in range(layers):
    for name, shape in ((f"w{k}", (width, width)), (f"b{k}", (width,)), (f"g{k}", (width,)), (f"e{k}", (width,))):
      inits.append(numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) / 8, name))
    nodes += [
      helper.make_node("MatMul", [h, f"w{k}"], [f"m{k}"]),
      helper.make_node("Add", [f"m{k}", f"b{k}"], [f"a{k}"]),
      helper.make_node("Relu", [f"a{k}"], [f"r{k}"]),
      helper.make_node("Add", [h, f"r{k}"], [f"s{k}"]),
      helper.make_node("LayerNormalization", [f"s{k}", f"g{k}", f"e{k}"], [f"h{k}"], epsilon=1e-5),
    ]
    h = f"h{k}"
  graph = helper.make_graph(
    nodes,
    "encoder_layers",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, rows, width])],
    [helper.make_tensor_value_info(h, TensorProto.FLOAT, [1, rows, width])],
    inits,
  )
  return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


# layers after the first cost what finding their form costs, not a lowering each (measured: 2 -> 8 layers, 4x the
# kernels: 1.55x the rewrite calls; lowered one by one, 4.05x)
REPEATED_LAYER_GROWTH = 2.0


def test_repeated_layers_are_lowered_once(monkeypatch):
  small_kernels, small = _schedule_work(_encoder_layers(2), monkeypatch)
  big_kernels, big = _schedule_work(_encoder_layers(8), monkeypatch)
  assert big_kernels == 4 * small_kernels
  assert big / small < REPEATED_LAYER_GROWTH, f"2 -> 8 layers: {small} -> {big} rewrite calls"


def test_repeated_layers_take_the_kernels_lowering_gives(monkeypatch):
  """A stage of a form lowered before takes that kernel over its own buffers: the same kernels, in the same order
  over the same buffers, as lowering every stage; and the model's answer is onnxruntime's, bit for bit (the layer
  norm is its recurrence)."""
  import onnxruntime

  import aot
  from aot.scheduler import schedule as scheduling

  model = _encoder_layers(3)
  traced = resolve(model)

  def kernels():
    sched = schedule(traced.outputs, traced.inputs, traced.output_names)
    names = {id(b): f"{b.kind}{k}" for k, b in enumerate(sched.scratch + sched.consts + sched.inputs + sched.outputs)}
    return [(k.name, k.ast, [names[id(b)] if id(b) in names else b.kind for b in k.bufs]) for k in sched.kernels]

  reused = kernels()
  monkeypatch.setattr(scheduling, "REUSE_FORMS", False)
  assert kernels() == reused
  monkeypatch.undo()
  x = np.random.default_rng(1).standard_normal((1, 32, 64)).astype(np.float32)
  want = onnxruntime.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
  np.testing.assert_array_equal(aot.load(aot.compile_model(model))(x), want)


# the layer norm's recurrence is a function whose result is stored (aot/scheduler/functions.py): its body is
# scheduled once, so 2 -> 8 layers cost about the same (measured 13,327 -> 12,445 calls; inlined: 1.55x)
SCHEDULED_ONCE_GROWTH = 1.2


def test_function_bodies_are_scheduled_once(monkeypatch):
  """Calls of a function whose results are stored take the kernels of its body, scheduled once: the same kernels,
  in the same order over the same buffers, as inlining every call, for work that does not grow with the calls."""
  from aot.scheduler import functions

  model = _encoder_layers(3)
  traced = resolve(model)

  def kernels():
    sched = schedule(traced.outputs, traced.inputs, traced.output_names)
    names = {id(b): f"{b.kind}{k}" for k, b in enumerate(sched.scratch + sched.consts + sched.inputs + sched.outputs)}
    return [(k.name, k.ast, [names.get(id(b), b.kind) for b in k.bufs]) for k in sched.kernels]

  once = kernels()
  monkeypatch.setattr(functions, "SCHEDULE_ONCE", False)
  assert kernels() == once
  _, inlined_small = _schedule_work(_encoder_layers(2), monkeypatch)
  _, inlined_big = _schedule_work(_encoder_layers(8), monkeypatch)
  monkeypatch.undo()
  _, small = _schedule_work(_encoder_layers(2), monkeypatch)
  _, big = _schedule_work(_encoder_layers(8), monkeypatch)
  assert big / small < SCHEDULED_ONCE_GROWTH <= inlined_big / inlined_small, (small, big, inlined_small, inlined_big)


def _lstm(steps: int, hidden: int = 64):
  """A bidirectional LSTM whose Y is read by a MatMul."""
  rng = np.random.default_rng(0)
  const = lambda name, *shape: numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) / 4, name)
  graph = helper.make_graph(
    [
      helper.make_node("LSTM", ["x", "w", "r", "b"], ["y"], hidden_size=hidden, direction="bidirectional"),
      helper.make_node("Reshape", ["y", "shape"], ["flat"]),
      helper.make_node("MatMul", ["flat", "m"], ["out"]),
    ],
    "qlstm",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [steps, 1, 16])],
    [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
    [
      const("w", 2, 4 * hidden, 16),
      const("r", 2, 4 * hidden, hidden),
      const("b", 2, 8 * hidden),
      const("m", 2 * hidden, 8),
      numpy_helper.from_array(np.array([steps, 2 * hidden], np.int64), "shape"),
    ],
  )
  return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_quantized_lstm_output_is_read_in_chunks():
  # a dynamically quantized bidirectional LSTM's Y (32 steps x 2 directions) read by the next dynamic quantization:
  # one concat of its 64 step outputs was lowered into each reader (the quantization's min and max, each then 64
  # gated loads an element; a CRNN's 80 took 0.9 s to lower apiece), now a concat of stored chunks of OUT_CHUNK steps
  # (frontends/onnx_ops_rnn.py _run_dirs)
  from aot.core.ir import Ops
  from aot.frontends.onnx_ops_rnn import OUT_CHUNK
  from aot.models.quantized import quantized

  model = quantized(_lstm(32), "dynamic")
  assert any(n.op_type == "DynamicQuantizeLSTM" for n in model.graph.node)
  traced = resolve(model)
  kernels = schedule(traced.outputs, traced.inputs, traced.output_names).kernels
  assert max(sum(u.op is Ops.LOAD for u in k.ast.toposort()) for k in kernels) <= 2 * OUT_CHUNK


@pytest.mark.parametrize("quantize", [False, True], ids=["float", "dynamic"])
def test_recurrence_steps_are_lowered_once(monkeypatch, quantize):
  """An unrolled recurrence's steps, each reading its row of the input product (a block of it: schedule.py
  _block_offset) and, quantized, staging the dequantized state its loop does not vary in, are one form: lowered once
  whatever the steps (the int8 CRNN lowered 222 stages, now 68), into the kernels lowering each step gives."""
  from aot.models.quantized import quantized
  from aot.scheduler import schedule as scheduling

  lowered = [0]
  lower_stage = scheduling.lower_stage

  def counted(*args):
    lowered[0] += 1
    return lower_stage(*args)

  def kernels(steps: int):
    model = quantized(_lstm(steps), "dynamic") if quantize else _lstm(steps)
    traced, lowered[0] = resolve(model), 0
    sched = schedule(traced.outputs, traced.inputs, traced.output_names)
    names = {id(b): f"{b.kind}{k}" for k, b in enumerate(sched.scratch + sched.consts + sched.inputs + sched.outputs)}
    return [(k.name, k.ast, [names.get(id(b), b.kind) for b in k.bufs]) for k in sched.kernels], lowered[0]

  monkeypatch.setattr(scheduling, "lower_stage", counted)
  (short, short_lowered), (long, long_lowered) = kernels(8), kernels(24)
  # (16 more steps in both directions: the output's chunks of OUT_CHUNK steps and the longer input product may
  # take a lowering or two; each step its own, as before: 14 -> 32 float, 32 -> 65 quantized)
  assert len(long) > len(short) and long_lowered - short_lowered <= 2, (short_lowered, long_lowered)
  monkeypatch.setattr(scheduling, "REUSE_FORMS", False)
  assert kernels(8)[0] == short


def test_constant_operands_are_read_as_views():
  """A kernel-level load at an index linear in the ranges, ungated and in bounds, evaluates (interpret.py
  _strided_load) as a strided view of its data, the values np.take gives: a VGG-19's weights packed with an index
  array and a gather took 2.5 s; a gated or out-of-bounds load still gathers, clamped."""
  from aot.core.dtype import dtypes
  from aot.core.interpret import evaluate
  from aot.core.ir import Ops, UOp

  rows, cols = (UOp(Ops.RANGE, dtypes.index, (), (n, size, "loop")) for n, size in ((0, 5), (1, 7)))
  data = {1: np.arange(100, dtype=np.float32)}
  glob = UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 1)

  def load(index, gate=True):
    return evaluate(
      UOp(Ops.LOAD, dtypes.float32, (glob, index, UOp.const(dtypes.bool, gate))), axes=[rows, cols], data=data
    )

  index = cols * 3 + rows * 13 + 4  # a transposed, offset read
  view = load(index)
  assert np.shares_memory(view, data[1])
  want = np.take(data[1], np.arange(7)[None, :] * 3 + np.arange(5)[:, None] * 13 + 4)
  np.testing.assert_array_equal(view, want)
  # past the end (its last index 4 + 4 * 20 + 6 * 3 = 102 of 100): clamped, as the gather is
  beyond = load(cols * 3 + rows * 20 + 4)
  assert not np.shares_memory(beyond, data[1])
  np.testing.assert_array_equal(
    beyond, np.take(data[1], np.arange(7)[None, :] * 3 + np.arange(5)[:, None] * 20 + 4, mode="clip")
  )
