"""A recurrence (LSTM, GRU, RNN) over a dim with a range: the sequence a text recogniser's convolutions leave of a
line's width, or a sequence input itself. One artifact laid out at the bound, its steps unrolled there and made only
as far as each call's length, the backward direction started and the final state read at the call's last step;
checked against onnxruntime at the range's ends, at primes and around the outputs' chunks of 8 steps, and what it
cannot take yet is refused naming why."""

import re

import numpy as np
import pytest
from conftest import make, ort_session, outputs_on_threads
from onnx import TensorProto as TP
from onnx import helper as oh
from onnx import numpy_helper
from test_window_dims import line_recognizer

import aot
from aot.errors import CompileError

RNG = np.random.default_rng(0)
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def weight(*shape):
  return (RNG.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)


def recurrence(op: str, direction: str, inputs=("x", "w", "r", "b"), outputs=("y",), I=6, H=5):
  """One op over x (n, 1, I): its W, R and B as initializers."""
  nd = 2 if direction == "bidirectional" else 1
  inits = [weight(nd, GATES[op] * H, I), weight(nd, GATES[op] * H, H), weight(nd, 2 * GATES[op] * H)]
  return make(
    [oh.make_node(op, list(inputs), list(outputs), hidden_size=H, direction=direction, name="rec")],
    [oh.make_tensor_value_info("x", TP.FLOAT, ["n", 1, I])],
    [oh.make_tensor_value_info(o, TP.FLOAT, None) for o in outputs if o],
    [numpy_helper.from_array(a, n) for a, n in zip(inits, ("w", "r", "b"))],
  )


@pytest.mark.parametrize("target", ["c", "llvm"])
@pytest.mark.parametrize(
  "op, direction", [("LSTM", "bidirectional"), ("GRU", "reverse"), ("RNN", "forward"), ("LSTM", "reverse")]
)
def test_a_recurrence_runs_as_many_steps_as_the_call_has(tmp_path, op, direction, target):
  model = recurrence(op, direction)
  art = aot.compile_model(model, shapes={"n": (1, 30)}, out_dir=tmp_path, target=target)
  sess = ort_session(model)
  with aot.load(art) as m:
    # the ends, primes, and either side of the outputs' chunks of 8 steps
    for n in (1, 2, 7, 8, 9, 17, 29, 30):
      x = RNG.standard_normal((n, 1, 6)).astype(np.float32)
      got, (want,) = m(x), sess.run(None, {"x": x})
      assert got.shape == want.shape
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_the_steps_past_the_call_are_not_made(tmp_path):
  # each step's kernels are guarded by the call's length: a step s runs where the run has more than s steps (the
  # first always does); without the guards every call would run the bound's 31 steps
  art = aot.compile_model(recurrence("LSTM", "bidirectional"), shapes={"n": (1, 30)}, out_dir=tmp_path)
  model_c = (art.dir / "src" / "model.c").read_text()
  assert {int(s) for s in re.findall(r"if \(e_ > (\d+)\)", model_c)} == set(range(1, 31))


def test_a_text_line_recogniser_runs_any_width(tmp_path):
  model = line_recognizer(hidden=6)
  art = aot.compile_model(model, shapes={"width": (16, 120)}, out_dir=tmp_path)
  sess = ort_session(model)
  with aot.load(art) as m:
    for w in (16, 17, 19, 37, 64, 119, 120):
      x = RNG.standard_normal((1, 3, 8, w)).astype(np.float32)
      got, (want,) = m(x), sess.run(None, {"x": x})
      assert got.shape == want.shape == (1, w // 4, 5)
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  x = RNG.standard_normal((1, 3, 8, 45)).astype(np.float32)
  one, three = outputs_on_threads(art, {"x": x})
  assert np.array_equal(one, three)


def test_a_recurrence_over_the_range_under_the_sanitizers(tmp_path):
  # each tensor malloc'd at the call's size: the reversals' gathers and the steps a call runs touch nothing past it
  from test_sanitize import run_sanitized

  model = line_recognizer(hidden=4)
  art = aot.compile_model(model, shapes={"width": (16, 40)}, out_dir=tmp_path, sanitize=True)
  sess = ort_session(model)
  for n in (16, 23, 40):
    x = RNG.standard_normal((1, 3, 8, n)).astype(np.float32)
    (got,) = run_sanitized(art, [x], tmp_path, sizes={"width": n})
    np.testing.assert_allclose(got, sess.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
  "op, direction, outputs",
  [
    ("LSTM", "bidirectional", ("y", "y_h", "y_c")),
    ("GRU", "reverse", ("", "y_h")),
    ("LSTM", "forward", ("", "", "y_c")),
  ],
)
def test_the_final_state_is_the_calls_last_step(tmp_path, op, direction, outputs):
  # Y_h and Y_c at the call's length: both directions end at its last step (the backward one runs the input reversed)
  model = recurrence(op, direction, outputs=outputs)
  art = aot.compile_model(model, shapes={"n": (1, 30)}, out_dir=tmp_path)
  sess = ort_session(model)
  with aot.load(art) as m:
    for n in (1, 8, 9, 30):
      x = RNG.standard_normal((n, 1, 6)).astype(np.float32)
      got, want = m(x), sess.run(None, {"x": x})
      for g, w in zip(got if isinstance(got, (list, tuple)) else [got], want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_sequence_lens_over_the_range_is_refused_naming_it():
  model = recurrence("LSTM", "forward", inputs=("x", "w", "r", "b", "lens"))
  model.graph.initializer.append(numpy_helper.from_array(np.array([3], np.int32), "lens"))
  with pytest.raises(CompileError, match=r"dim 'n' cannot have a range: .*LSTM node 'rec' masks its steps by seq"):
    aot.compile_model(model, shapes={"n": (4, 20)})


@pytest.mark.parametrize("target", ["cuda", "hip"])
def test_gpu_targets_launch_as_many_steps_as_the_call_has(tmp_path, target):
  # the kernel source on the CPU (tests/test_gpu.py's shim) against onnxruntime, and the device build's launches
  # guarded by the call's length as model.c's calls are on the CPU
  model = recurrence("LSTM", "bidirectional", outputs=("y", "y_h"))
  art = aot.compile_model(model, shapes={"n": (1, 30)}, target=target, emulate=True, out_dir=tmp_path / "emulated")
  sess = ort_session(model)
  with aot.load(art) as m:
    for n in (1, 9, 30):
      x = RNG.standard_normal((n, 1, 6)).astype(np.float32)
      for got, want in zip(m(x), sess.run(None, {"x": x})):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  built = aot.compile_model(model, shapes={"n": (1, 30)}, target=target, out_dir=tmp_path / "built")
  model_c = (built.dir / "src" / "model.c").read_text()
  assert {int(s) for s in re.findall(r"if \(e_ > (\d+)\)", model_c)} == set(range(1, 31))


def test_a_gpu_target_says_a_recurrence_after_windows_along_the_range_is_for_the_cpu():
  with pytest.raises(CompileError, match=r"dim 'width' reaches convolutions, pools or pads, .* not on GPUs"):
    aot.compile_model(line_recognizer(hidden=4), shapes={"width": (16, 40)}, target="cuda")


def test_a_recurrence_over_another_axis_is_walked_node_by_node():
  # the LSTM's steps are its 4 rows, its batch the ranged dim, which a mean then mixes (so it would run to its size
  # in loops at a bound): the same steps at every size, walked node by node, not taken whole; its input product
  # takes the batch and the steps as one axis, which a run-time size cannot take
  model = make(
    [
      oh.make_node("LSTM", ["x", "w", "r"], ["y"], hidden_size=5, direction="bidirectional"),
      oh.make_node("ReduceMean", ["y", "axes"], ["m"], keepdims=0),
    ],
    [oh.make_tensor_value_info("x", TP.FLOAT, [4, "n", 6])],
    [oh.make_tensor_value_info("m", TP.FLOAT, None)],
    [
      numpy_helper.from_array(weight(2, 20, 6), "w"),
      numpy_helper.from_array(weight(2, 20, 5), "r"),
      numpy_helper.from_array(np.array([2]), "axes"),
    ],
  )
  with pytest.raises(CompileError, match=r"dim 'n' cannot have a range: LSTM node 'y' merges it with another dim"):
    aot.compile_model(model, shapes={"n": (1, 12)})


def test_a_batch_first_recurrence_takes_a_batch_range_and_a_length_range(tmp_path):
  # batch run item by item, each item's steps to its length (layout 1: onnxruntime runs the layout 0 model, on the
  # input and output transposed)
  nodes = lambda layout: [
    oh.make_node("LSTM", ["x", "w", "r"], ["y"], hidden_size=5, direction="bidirectional", layout=layout)
  ]
  inits = [numpy_helper.from_array(weight(2, 20, 6), "w"), numpy_helper.from_array(weight(2, 20, 5), "r")]
  out = [oh.make_tensor_value_info("y", TP.FLOAT, None)]
  model = make(nodes(1), [oh.make_tensor_value_info("x", TP.FLOAT, ["batch", "n", 6])], out, inits)
  time_first = make(nodes(0), [oh.make_tensor_value_info("x", TP.FLOAT, ["n", "batch", 6])], out, inits)
  art = aot.compile_model(model, shapes={"batch": (1, 3), "n": (1, 20)}, out_dir=tmp_path)
  sess = ort_session(time_first)
  with aot.load(art) as m:
    for b, n in ((1, 1), (3, 7), (2, 20), (1, 9)):
      x = RNG.standard_normal((b, n, 6)).astype(np.float32)
      want = sess.run(None, {"x": x.transpose(1, 0, 2).copy()})[0].transpose(2, 0, 1, 3)
      np.testing.assert_allclose(m(x), want, rtol=1e-5, atol=1e-6)


def test_initial_states_as_inputs_and_peepholes_over_the_range(tmp_path):
  # the node's other inputs (initial_h, initial_c given at each call, the peepholes) are the graph's, read by the
  # steps; clip bounds every gate
  H, I = 5, 6
  inits = [weight(2, 4 * H, I), weight(2, 4 * H, H), weight(2, 8 * H), weight(2, 3 * H)]
  model = make(
    [
      oh.make_node(
        "LSTM", ["x", "w", "r", "b", "", "h0", "c0", "p"], ["y"], hidden_size=H, direction="bidirectional", clip=2.0
      )
    ],
    [oh.make_tensor_value_info(n, TP.FLOAT, s) for n, s in (("x", ["n", 1, I]), ("h0", [2, 1, H]), ("c0", [2, 1, H]))],
    [oh.make_tensor_value_info("y", TP.FLOAT, None)],
    [numpy_helper.from_array(a, n) for a, n in zip(inits, ("w", "r", "b", "p"))],
  )
  art = aot.compile_model(model, shapes={"n": (2, 25)}, out_dir=tmp_path)
  sess = ort_session(model)
  with aot.load(art) as m:
    for n in (2, 13, 25):
      feeds = {
        k: RNG.standard_normal(s).astype(np.float32)
        for k, s in (("x", (n, 1, I)), ("h0", (2, 1, H)), ("c0", (2, 1, H)))
      }
      np.testing.assert_allclose(m(**feeds), sess.run(None, feeds)[0], rtol=1e-5, atol=1e-6)
