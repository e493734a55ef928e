"""Convolutions, pools and pads along a dim with a range (an OCR line's width, a sequence under 1-D convolutions):
one artifact laid out at a bound, each window's output run to its size at the call's (a stride-2 pool's
n // 2), each pad's bound compared with the call's size; checked against onnxruntime at the range's ends,
at primes and at sizes a stride leaves a remainder of, with the kernel list of a static compile; what the run-time
size cannot take yet is refused naming why."""

import json

import numpy as np
import pytest
from conftest import make, ort_session, outputs_on_threads
from onnx import TensorProto as TP
from onnx import helper as oh
from onnx import numpy_helper

import aot
from aot.errors import CompileError

RNG = np.random.default_rng(0)


def weight(*shape):
  return (RNG.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)


def conv1d_stack():
  """Over a sequence of 8 channels: a 'same' conv, a max pool of 2, a conv of stride 2 and pad 1, an average pool of 3
  with pads, a ReLU: its output's length (n + 2) // 4, derived from the input's by four windows."""
  nodes = [
    oh.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1]),
    oh.make_node("Relu", ["c1"], ["r1"]),
    oh.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2], strides=[2]),
    oh.make_node("Conv", ["p1", "w2"], ["c2"], pads=[1, 1], strides=[2]),
    oh.make_node("AveragePool", ["c2"], ["p2"], kernel_shape=[3], pads=[1, 1], count_include_pad=1),
    oh.make_node("Relu", ["p2"], ["y"]),
  ]
  inits = [numpy_helper.from_array(weight(16, 8, 3), "w1"), numpy_helper.from_array(weight(24, 16, 3), "w2")]
  return make(
    nodes,
    [oh.make_tensor_value_info("x", TP.FLOAT, [1, 8, "sequence"])],
    [oh.make_tensor_value_info("y", TP.FLOAT, None)],
    inits,
  )


@pytest.mark.parametrize("target", ["c", "llvm"])
def test_convolutions_and_pools_run_to_the_sizes_their_windows_leave(tmp_path, target):
  model = conv1d_stack()
  art = aot.compile_model(model, shapes={"sequence": (2, 90)}, out_dir=tmp_path / "dyn", target=target)
  static = aot.compile_model(model, shapes={"sequence": 61}, out_dir=tmp_path / "static")
  assert art.num_kernels == static.num_kernels
  manifest = json.loads((art.dir / f"{art.name}.json").read_text())
  assert manifest["outputs"][0]["shape"] == [1, 24, "(sequence+2)//4"]
  sess = ort_session(model)
  with aot.load(art) as m:
    # the ends, primes, and each remainder of the total stride 4
    for n in (2, 3, 4, 5, 13, 61, 87, 88, 89, 90):
      x = RNG.standard_normal((1, 8, n)).astype(np.float32)
      got, (want,) = m(x), sess.run(None, {"x": x})
      assert got.shape == want.shape
      np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def two_convs(second_pool: list[int], out: str) -> list:
  """x through two 3x3 convs with pads (weights w1, w2), each after its ReLU max pooled: 2x2, then second_pool (its
  kernel and stride) into out."""
  return [
    oh.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
    oh.make_node("Relu", ["c1"], ["r1"]),
    oh.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
    oh.make_node("Conv", ["p1", "w2"], ["c2"], pads=[1, 1, 1, 1]),
    oh.make_node("Relu", ["c2"], ["r2"]),
    oh.make_node("MaxPool", ["r2"], [out], kernel_shape=second_pool, strides=second_pool),
  ]


def line_recognizer(hidden: int = 0):
  """A text-line recogniser's shape, over images 8 high and of any width: 3x3 convs with pads, pools of 2x2 and 2x1,
  the height pooled away, with hidden > 0 a bidirectional LSTM over the columns, per column classes (a MatMul) and
  their softmax: [1, width // 4, 5]."""
  nodes = [
    *two_convs([2, 2], "p2"),
    oh.make_node("MaxPool", ["p2"], ["p3"], kernel_shape=[2, 1], strides=[2, 1]),
    oh.make_node("Squeeze", ["p3", "h"], ["sq"]),
  ]
  inits = {"w1": weight(12, 3, 3, 3), "w2": weight(16, 12, 3, 3), "h": np.array([2]), "fc": weight(2 * hidden or 16, 5)}
  if hidden:
    nodes += [
      oh.make_node("Transpose", ["sq"], ["steps"], perm=[2, 0, 1]),
      oh.make_node("LSTM", ["steps", "lw", "lr"], ["y"], hidden_size=hidden, direction="bidirectional"),
      oh.make_node("Transpose", ["y"], ["yt"], perm=[2, 0, 1, 3]),
      oh.make_node("Reshape", ["yt", "flat"], ["cols"]),
    ]
    inits |= {
      "lw": weight(2, 4 * hidden, 16),
      "lr": weight(2, 4 * hidden, hidden),
      "flat": np.array([1, -1, 2 * hidden]),
    }
  else:
    nodes.append(oh.make_node("Transpose", ["sq"], ["cols"], perm=[0, 2, 1]))
  nodes += [oh.make_node("MatMul", ["cols", "fc"], ["logits"]), oh.make_node("Softmax", ["logits"], ["probs"], axis=-1)]
  return make(
    nodes,
    [oh.make_tensor_value_info("x", TP.FLOAT, [1, 3, 8, "width"])],
    [oh.make_tensor_value_info("probs", TP.FLOAT, [1, "time", 5])],
    [numpy_helper.from_array(a, n) for n, a in inits.items()],
  )


def test_a_line_recognizer_reads_lines_of_every_width_of_its_range(tmp_path):
  # the image's rows are copied in at the bound's layout (3 x 8 blocks before the width), the classes written in
  # place, width // 4 rows of them
  model = line_recognizer()
  art = aot.compile_model(model, shapes={"width": (16, 120)}, out_dir=tmp_path / "dyn")
  assert art.num_kernels == aot.compile_model(model, shapes={"width": 64}, out_dir=tmp_path / "static").num_kernels
  sess = ort_session(model)
  with aot.load(art) as m:
    assert m.get_outputs()[0].shape == [1, "width//4", 5]
    for n in (16, 17, 18, 19, 37, 64, 119, 120):
      x = RNG.standard_normal((1, 3, 8, n)).astype(np.float32)
      got, (want,) = m(x), sess.run(None, {"x": x})
      assert got.shape == want.shape == (1, n // 4, 5)
      np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def feature_rows_over_width():
  """16 -> 24 -> 32 channels of 3x3 convolutions over 8 rows of any width, the first pooled 2x2 and the second 2x1:
  window matrices big enough to be packed a panel at a time, each column a (row, position) pair at the call's width."""
  inits = {"w1": weight(24, 16, 3, 3), "w2": weight(32, 24, 3, 3)}
  return make(
    two_convs([2, 1], "y"),
    [oh.make_tensor_value_info("x", TP.FLOAT, [1, 16, 16, "width"])],
    [oh.make_tensor_value_info("y", TP.FLOAT, None)],
    [numpy_helper.from_array(a, n) for n, a in inits.items()],
  )


@pytest.mark.parametrize("target", ["c", "llvm"])
def test_feature_rows_over_a_width_range_are_packed_at_each_calls_width(tmp_path, target):
  # the microkernel's columns run row by row at the call's width (contract.Contraction.compact), as many of a window
  # matrix's rows to a panel as fit at that width (columns.CompactPanel): the first one's 16 rows all in one at 32, 8
  # at 160, 3 at 401 (the sixth panel's last two past the end wrapped around), 1 at 1000; a panel ends in a partial
  # tile wherever the width leaves one, and the pools read each row's run of it
  model = feature_rows_over_width()
  art = aot.compile_model(model, shapes={"width": (4, 1000)}, out_dir=tmp_path / "dyn", target=target)
  assert art.num_kernels == aot.compile_model(model, shapes={"width": 64}, out_dir=tmp_path / "static").num_kernels
  sess = ort_session(model)
  with aot.load(art) as m:
    for n in (4, 5, 31, 32, 33, 97, 160, 401, 611, 999, 1000):
      x = RNG.standard_normal((1, 16, 16, n)).astype(np.float32)
      got, (want,) = m(x), sess.run(None, {"x": x})
      assert got.shape == want.shape == (1, 32, 4, n // 2)
      np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
  x = RNG.standard_normal((1, 16, 16, 211)).astype(np.float32)
  one, three = outputs_on_threads(art, {"x": x})
  np.testing.assert_array_equal(one, three)


def test_windows_along_the_range_under_the_sanitizers(tmp_path):
  # each tensor malloc'd at the call's size: the derived sizes' loops and copies touch nothing past them
  from test_sanitize import run_sanitized

  model = line_recognizer()
  art = aot.compile_model(model, shapes={"width": (16, 40)}, out_dir=tmp_path / "a", sanitize=True)
  sess = ort_session(model)
  for n in (16, 23, 40):
    x = RNG.standard_normal((1, 3, 8, n)).astype(np.float32)
    (got,) = run_sanitized(art, [x], tmp_path, sizes={"width": n})
    np.testing.assert_allclose(got, sess.run(None, {"x": x})[0], rtol=1e-4, atol=1e-6)


def test_a_pad_along_the_range_is_compared_with_the_size_of_each_call(tmp_path):
  model = make(
    [oh.make_node("MatMul", ["x", "w"], ["m"]), oh.make_node("Pad", ["m", "pads", "value"], ["y"])],
    [oh.make_tensor_value_info("x", TP.FLOAT, ["n", 6])],
    [oh.make_tensor_value_info("y", TP.FLOAT, None)],
    [
      numpy_helper.from_array(weight(6, 4), "w"),
      numpy_helper.from_array(np.array([1, 0, 2, 0]), "pads"),
      numpy_helper.from_array(np.array(2.0, np.float32), "value"),
    ],
  )
  art = aot.compile_model(model, shapes={"n": (1, 16)}, out_dir=tmp_path / "a")
  sess = ort_session(model)
  with aot.load(art) as m:
    for n in (1, 7, 16):
      x = RNG.standard_normal((n, 6)).astype(np.float32)
      got, (want,) = m(x), sess.run(None, {"x": x})
      assert got.shape == want.shape == (n + 3, 4)
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def pool_model(*pools):
  nodes = [
    oh.make_node(op, [f"t{i}"], [f"t{i + 1}"], kernel_shape=[k], strides=[s], pads=[lo, hi])
    for i, (op, k, s, lo, hi) in enumerate(pools)
  ]
  nodes[-1].output[0] = "y"
  return make(
    [oh.make_node("Identity", ["x"], ["t0"]), *nodes],
    [oh.make_tensor_value_info("x", TP.FLOAT, [1, 4, "n"])],
    [oh.make_tensor_value_info("y", TP.FLOAT, None)],
  )


@pytest.mark.parametrize(
  "pools, why",
  [
    # a window of 5 does not fit a sequence of 2: the range's low end is too low
    ([("MaxPool", 5, 1, 0, 0)], r"windows of 5 over it, which leave nothing at its size 2: raise the range's low end"),
    # a pool of stride 3 over another, computed in one kernel, divides its positions
    ([("AveragePool", 3, 2, 2, 1), ("AveragePool", 2, 2, 1, 0)], r"divides its positions \(MOD\)"),
  ],
)
def test_what_windows_along_the_range_cannot_take_yet_is_refused_saying_why(pools, why):
  with pytest.raises(CompileError, match=rf"dim 'n' cannot have a range: .*{why}"):
    aot.compile_model(pool_model(*pools), shapes={"n": (2, 30)})


def test_a_gpu_target_says_windows_along_the_range_are_for_the_cpu():
  with pytest.raises(CompileError, match=r"dim 'sequence' reaches convolutions, pools or pads, .* not on GPUs"):
    aot.compile_model(conv1d_stack(), shapes={"sequence": (2, 90)}, target="cuda")


def test_a_loop_to_the_run_size_compared_with_a_pad_is_not_peeled(tmp_path):
  # a pad's bounds would have cut the padded loop into pieces of constant bounds (a loop to a run-time size has
  # none: an internal error, found by aot/tools/fuzz_batch.py --axis 2)
  model = make(
    [oh.make_node("Pad", ["x", "pads"], ["p"]), oh.make_node("Abs", ["p"], ["a"]), oh.make_node("Log", ["a"], ["y"])],
    [oh.make_tensor_value_info("x", TP.FLOAT, [1, 6, "n", 4])],
    [oh.make_tensor_value_info("y", TP.FLOAT, None)],
    [numpy_helper.from_array(np.array([0, 0, 2, 0, 0, 0, 1, 0]), "pads")],
  )
  art = aot.compile_model(model, shapes={"n": (1, 9)}, out_dir=tmp_path / "a")
  sess = ort_session(model)
  with aot.load(art) as m:
    for n in (1, 5, 9):
      x = RNG.standard_normal((1, 6, n, 4)).astype(np.float32)
      got, (want,) = m(x), sess.run(None, {"x": x})
      assert got.shape == want.shape == (1, 6, n + 3, 4)
      np.testing.assert_allclose(got, want, rtol=1e-6)


def test_a_range_above_the_small_probe_sizes_is_probed_inside_it(tmp_path):
  # windows of 16 do not fit the small primes the proof probed a dim at (7): a range of 64..200 is probed at 67
  model = pool_model(("MaxPool", 16, 16, 0, 0), ("MaxPool", 2, 1, 0, 1))
  art = aot.compile_model(model, shapes={"n": (64, 200)}, out_dir=tmp_path / "a")
  sess = ort_session(model)
  with aot.load(art) as m:
    assert m.get_outputs()[0].shape == [1, 4, "n//16"]
    for n in (64, 95, 200):
      x = RNG.standard_normal((1, 4, n)).astype(np.float32)
      got, (want,) = m(x), sess.run(None, {"x": x})
      np.testing.assert_allclose(got, want, rtol=1e-6)


def test_a_mean_over_an_axis_windows_derive_divides_by_its_size_at_each_call(tmp_path):
  # a text classifier's shape: a strided conv over the sequence, then the mean over what is left of it
  model = make(
    [
      oh.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1], strides=[2]),
      oh.make_node("GlobalAveragePool", ["c"], ["y"]),
    ],
    [oh.make_tensor_value_info("x", TP.FLOAT, [1, 8, "n"])],
    [oh.make_tensor_value_info("y", TP.FLOAT, None)],
    [numpy_helper.from_array(weight(6, 8, 3), "w")],
  )
  art = aot.compile_model(model, shapes={"n": (3, 70)}, out_dir=tmp_path / "a")
  sess = ort_session(model)
  with aot.load(art) as m:
    for n in (3, 4, 37, 70):
      x = RNG.standard_normal((1, 8, n)).astype(np.float32)
      got, (want,) = m(x), sess.run(None, {"x": x})
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
