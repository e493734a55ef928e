"""A batch dim with a range (--shape batch=LO..HI): one artifact that takes any size in the range, checked against
onnxruntime at the bounds and at odd sizes between; the kernel list is the one-item compile's; a dim that some op
mixes is refused naming the node; a size outside the range is refused at run time naming the input and the dim."""

import json
import re
import subprocess

import numpy as np
import pytest
from conftest import make, need, ort_session, outputs_on_threads, run_cpp_app
from onnx import TensorProto as TP
from onnx import helper as oh
from onnx import numpy_helper

import aot
from aot.errors import CompileError, IndexRangeError, InputShapeError
from aot.models.onnx_forms import onnx_model, with_batch_dim
from aot.options import DimRange

W = np.random.default_rng(0).standard_normal((6, 4)).astype(np.float32)


def x_info(name="x", shape=("batch", 6)):
  return oh.make_tensor_value_info(name, TP.FLOAT, list(shape))


def y_info(name="y", shape=("batch", 4)):
  return oh.make_tensor_value_info(name, TP.FLOAT, list(shape))


def feed_at(sess, n: int, seed: int = 0) -> dict:
  rng = np.random.default_rng(seed + n)
  return {
    i.name: rng.standard_normal([n if isinstance(d, str) else d for d in i.shape]).astype(np.float32)
    for i in sess.get_inputs()
  }


@pytest.mark.parametrize(
  "name,lo,hi,sizes",
  [("mlp", 1, 64, (1, 13, 64)), ("mnist", 1, 8, (1, 7, 8)), ("transformer", 1, 4, (1, 3, 4)), ("resnet18", 1, 3, (3,))],
)
def test_reference_models_run_at_every_size_of_the_range(tmp_path, name, lo, hi, sizes):
  model = with_batch_dim(onnx_model(name))
  art = aot.compile_model(model, shapes={"batch": (lo, hi)}, out_dir=tmp_path / "dyn")
  one = aot.compile_model(model, shapes={"batch": 1}, out_dir=tmp_path / "one")
  # the kernel list is the one-item compile's, whatever the size
  assert [k.function for k in art.kernels] == [k.function for k in one.kernels]
  # each item keeps its own buffers, but one copy of those only one item's loop of calls uses (run_dims.plan_items):
  # the arena is about the largest batch's (with a copy per item of those, ResNet-18's at 1..3 was 3.6 times it)
  assert art.arena_bytes <= 1.5 * hi * one.arena_bytes
  sess = ort_session(model)
  with aot.load(art) as m:
    assert m.get_inputs()[0].shape[0] == "batch" and m.get_outputs()[0].shape[0] == "batch"
    for n in sizes:
      feed = feed_at(sess, n)
      got, (want,) = m(feed), sess.run(None, feed)
      assert got.shape == want.shape == (n, *want.shape[1:])
      np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("name,n", [("mnist", 5), ("mlp", 61)])
def test_the_same_outputs_bitwise_on_one_and_three_threads(tmp_path, name, n):
  # the mlp's contractions run once over all items (their rows one after another), split across threads by the items'
  # work at run time
  model = with_batch_dim(onnx_model(name))
  art = aot.compile_model(model, shapes={"batch": DimRange(1, 64)}, out_dir=tmp_path / "a")
  feed = feed_at(ort_session(model), n)
  one, three = outputs_on_threads(art, feed)
  assert one.shape == (n, 10) and np.array_equal(one, three)
  np.testing.assert_allclose(one, ort_session(model).run(None, feed)[0], rtol=1e-4, atol=1e-5)


def test_a_bad_index_names_its_item(tmp_path):
  emb = np.random.default_rng(2).standard_normal((10, 6)).astype(np.float32)
  model = make(
    [oh.make_node("Gather", ["emb", "ids"], ["e"]), oh.make_node("MatMul", ["e", "w"], ["y"])],
    [oh.make_tensor_value_info("ids", TP.INT64, ["batch", 3])],
    [oh.make_tensor_value_info("y", TP.FLOAT, ["batch", 3, 4])],
    [numpy_helper.from_array(emb, "emb"), numpy_helper.from_array(W, "w")],
  )
  art = aot.compile_model(model, shapes={"batch": (1, 4)}, out_dir=tmp_path / "a")
  ids = np.array([[1, 2, 3], [4, 5, 6], [7, 8, 9]])
  with aot.load(art) as m:
    np.testing.assert_allclose(m(ids), emb[ids] @ W, rtol=1e-5, atol=1e-6)
    ids[2, 1] = 12
    with pytest.raises(IndexRangeError, match=r"input 'ids'\[0, 1\] is 12, outside .* \(item 2 of dim 'batch'\)"):
      m(ids)


def test_a_size_outside_the_range_or_unlike_another_inputs_is_refused(tmp_path):
  model = make(
    [oh.make_node("Add", ["x", "z"], ["s"]), oh.make_node("MatMul", ["s", "w"], ["y"])],
    [x_info(), x_info("z")],
    [y_info()],
    [numpy_helper.from_array(W, "w")],
  )
  art = aot.compile_model(model, shapes={"batch": (2, 5)}, out_dir=tmp_path / "a")
  ok = np.ones((3, 6), np.float32)
  with aot.load(art) as m:
    np.testing.assert_allclose(m(ok, 2 * ok), np.full((3, 4), 3 * W.sum(0)), rtol=1e-5)
    with pytest.raises(InputShapeError, match=r"input 'x' dim 0 \('batch'\) is 6, outside 2\.\.5"):
      m(np.ones((6, 6), np.float32), np.ones((6, 6), np.float32))
    with pytest.raises(InputShapeError, match=r"input 'z' dim 0 \('batch'\) is 4, but input 'x' has 3"):
      m(ok, np.ones((4, 6), np.float32))
    with pytest.raises(InputShapeError, match=r"expected shape \(3, 6\), got \(3, 5\)"):
      m(ok, np.ones((3, 5), np.float32))


# each: nodes after m = x @ w, and the output's shape. The dim is then no batch dim: it runs to the call's size in one
# program (frontends/extent_dims.py)
EXTENTS = {
  "a mean over the batch": ([oh.make_node("ReduceMean", ["m", "axes0"], ["y"], keepdims=1)], (1, 4)),
  # (copied out of the bound's layout, 4 rows of n: codegen/render/run_dims.py Staged)
  "an output whose items are not one after another": (
    [oh.make_node("Transpose", ["m"], ["y"], perm=[1, 0])],
    (4, "batch"),
  ),
}


@pytest.mark.parametrize("case", EXTENTS)
def test_a_dim_an_op_mixes_runs_to_the_size_of_each_call(tmp_path, case):
  nodes, shape = EXTENTS[case]
  inits = [numpy_helper.from_array(W, "w"), numpy_helper.from_array(np.array([0]), "axes0")]
  model = make([oh.make_node("MatMul", ["x", "w"], ["m"]), *nodes], [x_info()], [y_info(shape=shape)], inits)
  art = aot.compile_model(model, shapes={"batch": (1, 8)}, out_dir=tmp_path / "a")
  assert json.loads((art.dir / f"{art.name}.json").read_text())["dims"][0]["runs"] == "extent"
  with aot.load(art) as m:
    for n in (1, 5, 8):
      feed = feed_at(ort_session(model), n)
      np.testing.assert_allclose(m(feed["x"]), ort_session(model).run(None, feed)[0], rtol=1e-5, atol=1e-6)


# each: nodes after x -> y, and what the refusal names
MIXING = {
  "a value from the batch size": (
    [
      oh.make_node("Shape", ["m"], ["sh"]),
      oh.make_node("Cast", ["sh"], ["shf"], to=TP.FLOAT),
      oh.make_node("ReduceMax", ["shf"], ["n"], keepdims=0),
      oh.make_node("Mul", ["m", "n"], ["y"]),
    ],
    "",
    4,
    "(from its size|differs along it)",
  ),
  "the batch flattened with the features": (
    [oh.make_node("Flatten", ["m"], ["f"], axis=0), oh.make_node("Softmax", ["f"], ["y"], axis=1)],
    "",
    None,
    "",
  ),
}


@pytest.mark.parametrize("case", MIXING)
def test_a_dim_that_an_op_mixes_is_refused_naming_the_node(case):
  nodes, node, width, why = MIXING[case]
  out = y_info() if width else oh.make_tensor_value_info("y", TP.FLOAT, None)
  inits = [numpy_helper.from_array(W, "w"), numpy_helper.from_array(np.array([0]), "axes0")]
  model = make([oh.make_node("MatMul", ["x", "w"], ["m"]), *nodes], [x_info()], [out], inits)
  with pytest.raises(CompileError, match=rf"dim 'batch' cannot have a range: {node}.*{why}.*--shape batch=N"):
    aot.compile_model(model, shapes={"batch": (1, 8)})


def test_an_output_whose_shape_changes_at_size_1_is_refused(tmp_path):
  # a Squeeze without axes drops the batch dim at size 1 (onnxruntime's output is (6,) at batch 1, (n, 6) at n): the
  # artifact described it at the probes' rank and wrote it at the item's, past the output's buffer (a crash found by
  # aot/tools/fuzz_batch.py, seed 12 case 28); with its axes given it runs
  axes = numpy_helper.from_array(np.array([1]), "axes")
  nodes = lambda squeeze: [
    oh.make_node("Unsqueeze", ["x", "axes"], ["u"]),
    oh.make_node("Squeeze", ["u", "axes"] if squeeze else ["u"], ["y"]),
  ]
  out = oh.make_tensor_value_info("y", TP.FLOAT, None)
  with pytest.raises(CompileError, match=r"output 'y' is \(6,\) at size 1 of it, not \(1, 6\).*Squeeze node"):
    aot.compile_model(make(nodes(False), [x_info()], [out], [axes]), shapes={"batch": (1, 8)})
  model = make(nodes(True), [x_info()], [out], [axes])
  sess = ort_session(model)
  with aot.load(aot.compile_model(model, shapes={"batch": (1, 8)}, out_dir=tmp_path)) as m:
    for n in (1, 5, 8):
      x = feed_at(sess, n)["x"]
      np.testing.assert_array_equal(m(x), x)


def test_a_constant_broadcast_along_the_batch_runs(tmp_path):
  # ConstantOfShape(Shape(x)) is the same at every item: a batch dim still
  model = make(
    [
      oh.make_node("Shape", ["x"], ["sh"]),
      oh.make_node("ConstantOfShape", ["sh"], ["c"], value=numpy_helper.from_array(np.array([0.5], np.float32))),
      oh.make_node("Add", ["x", "c"], ["a"]),
      oh.make_node("MatMul", ["a", "w"], ["y"]),
    ],
    [x_info()],
    [y_info()],
    [numpy_helper.from_array(W, "w")],
  )
  art = aot.compile_model(model, shapes={"x": (DimRange(1, 6), 6)}, out_dir=tmp_path / "a")
  x = np.random.default_rng(1).standard_normal((5, 6)).astype(np.float32)
  with aot.load(art) as m:
    np.testing.assert_allclose(m(x), ort_session(model).run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_the_batch_inside_a_merged_axis_and_a_shape_read_for_its_last_dim_run(tmp_path):
  # torch's attention export: (sequence, batch) merged into one axis of rows (the batch its inner factor) for the
  # projection, shaped back after; the scale from the input's Shape, a constant that differs with the batch but whose
  # used part does not
  inits = [
    numpy_helper.from_array(W, "w"),
    numpy_helper.from_array(np.array([-1, 6]), "rows"),
    numpy_helper.from_array(np.array([5, -1, 4]), "back"),
    numpy_helper.from_array(np.array([-1]), "last"),
    numpy_helper.from_array(np.array([2**31]), "end"),
  ]
  model = make(
    [
      oh.make_node("Transpose", ["x"], ["t"], perm=[1, 0, 2]),
      oh.make_node("Reshape", ["t", "rows"], ["r"]),
      oh.make_node("MatMul", ["r", "w"], ["p"]),
      oh.make_node("Reshape", ["p", "back"], ["q"]),
      oh.make_node("Transpose", ["q"], ["o"], perm=[1, 0, 2]),
      oh.make_node("Shape", ["x"], ["sh"]),
      oh.make_node("Slice", ["sh", "last", "end"], ["d"]),
      oh.make_node("Cast", ["d"], ["df"], to=TP.FLOAT),
      oh.make_node("Sqrt", ["df"], ["sd"]),
      oh.make_node("Div", ["o", "sd"], ["y"]),
    ],
    [x_info("x", ("batch", 5, 6))],
    [y_info("y", ("batch", 5, 4))],
    inits,
  )
  art = aot.compile_model(model, shapes={"batch": (1, 7)}, out_dir=tmp_path / "a")
  sess = ort_session(model)
  with aot.load(art) as m:
    for n in (1, 4, 7):
      feed = feed_at(sess, n)
      np.testing.assert_allclose(m(feed), sess.run(None, feed)[0], rtol=1e-5, atol=1e-6)


def test_bad_ranges_and_two_ranges_are_refused():
  model = make([oh.make_node("MatMul", ["x", "w"], ["y"])], [x_info()], [y_info()], [numpy_helper.from_array(W, "w")])
  with pytest.raises(CompileError, match="the range 5..2 is not one"):
    aot.compile_model(model, shapes={"batch": (5, 2)})
  with pytest.raises(CompileError, match="two dims with a range"):
    aot.compile_model(model, shapes={"batch": (1, 4), "x": (DimRange(1, 4), DimRange(2, 6)), "other": (1, 3)})
  with pytest.raises(CompileError, match="for the c, llvm, cuda and hip targets"):
    aot.compile_model(model, shapes={"batch": (1, 4)}, target="metal")


@pytest.mark.parametrize("target", ["cuda", "hip"])
def test_gpu_targets_take_a_batch_range(tmp_path, target):
  # the host launches each kernel for every item (device buffers at the largest size); run under the emulator here,
  # and built for the device (nvcc, clang-19's HIP), whose library has NAME_run_dims and no NAME_run_device
  model = with_batch_dim(onnx_model("mnist"))
  emulated = aot.compile_model(model, shapes={"batch": (1, 6)}, target=target, emulate=True, out_dir=tmp_path / "e")
  sess = ort_session(model)
  with aot.load(emulated) as m:
    for n in (1, 5):
      feed = feed_at(sess, n)
      np.testing.assert_allclose(m(feed), sess.run(None, feed)[0], rtol=1e-4, atol=1e-5)
  built = aot.compile_model(model, shapes={"batch": (1, 6)}, target=target, out_dir=tmp_path / "d")
  header = built.header_path.read_text()
  assert "mnist_run_dims(" in header and "run_device" not in header and built.library_path.exists()


C_APP = r"""
#include <stdio.h>
#include "mlp_b.h"
int main(void) {
  mlp_b_model *m;
  if (mlp_b_create(&m)) return 1;
  static float x[MLP_B_INPUT0_SIZE], y[MLP_B_OUTPUT0_SIZE];
  for (int i = 0; i < MLP_B_INPUT0_SIZE; i++) x[i] = (float)(i % 7) / 7.0f;
  int64_t x_shape[2] = {3, 784}, y_shape[2] = {0, 0};
  int s = mlp_b_run_dims(m, x, x_shape, y, y_shape);
  printf("%d %lld %lld %s\n", s, (long long)y_shape[0], (long long)y_shape[1], MLP_B_DIM0_NAME);
  for (int i = 0; i < 30; i++) printf("%.6f\n", y[i]);
  x_shape[0] = MLP_B_DIM0_MAX + 1;
  s = mlp_b_run_dims(m, x, x_shape, y, y_shape);
  printf("%d %s\n", s, mlp_b_last_error(m));
  mlp_b_destroy(m);
  return 0;
}
"""


CPP_APP = r"""
#include <cstdio>
#include <vector>
#include "mlp_b.hpp"
int main() {
  mlp_b::Model m;
  std::vector<float> x(2 * 784, 0.25f), y(MLP_B_OUTPUT0_SIZE);
  int64_t x_shape[2] = {2, 784}, y_shape[2];
  m.run(x.data(), x_shape, y.data(), y_shape);
  std::printf("%lld %.6f %.6f\n", (long long)y_shape[0], y[0], y[10]);
  x_shape[0] = 0;
  try { m.run(x.data(), x_shape, y.data(), y_shape); } catch (const mlp_b::Error &e) { std::printf("%s\n", e.what()); }
}
"""


def test_the_c_api_takes_each_inputs_shape_and_writes_each_outputs(tmp_path):
  model = with_batch_dim(onnx_model("mlp"))
  (tmp_path / "mlp_b.onnx").write_bytes(model.SerializeToString())
  out = tmp_path / "mlp_b"
  done = subprocess.run(
    ["compile-model", str(tmp_path / "mlp_b.onnx"), "-o", str(out), "--shape", "batch=1..8", "--check"],
    check=True,
    capture_output=True,
    text=True,
  ).stdout
  # --check runs both ends of the range against onnxruntime
  assert re.search(r"^batch=1: check vs onnxruntime: .* -> PASS", done, re.MULTILINE), done
  assert re.search(r"^batch=8: check vs onnxruntime: .* -> PASS", done, re.MULTILINE), done
  manifest = json.loads((out / "mlp_b.json").read_text())
  assert manifest["dims"] == [{"name": "batch", "min": 1, "max": 8, "runs": "items"}]
  assert manifest["inputs"][0]["shape"] == ["batch", 784]
  (tmp_path / "app.c").write_text(C_APP)
  cc = need("gcc")
  subprocess.run(
    [cc, "app.c", f"-I{out}", f"-L{out}", "-lmlp_b", f"-Wl,-rpath,{out}", "-o", "app"], cwd=tmp_path, check=True
  )
  lines = subprocess.run(["./app"], cwd=tmp_path, capture_output=True, text=True, check=True).stdout.splitlines()
  assert lines[0] == "0 3 10 batch"
  x = (np.arange(3 * 784) % 7 / 7).astype(np.float32).reshape(3, 784)
  want = ort_session(model).run(None, {"x": x})[0]
  np.testing.assert_allclose(np.array(lines[1:31], float).reshape(3, 10), want, rtol=1e-4, atol=1e-5)
  assert lines[31] == "3 input 'x' dim 0 ('batch') is 9, outside 1..8"
  # the C++ class over it: Model::run with each tensor's shape, a failure thrown
  lines = run_cpp_app(CPP_APP, out, "mlp_b", tmp_path)
  want = ort_session(model).run(None, {"x": np.full((2, 784), 0.25, np.float32)})[0]
  assert lines[0].split()[0] == "2"
  np.testing.assert_allclose([float(v) for v in lines[0].split()[1:]], [want[0, 0], want[1, 0]], rtol=1e-4, atol=1e-5)
  assert lines[1] == "mlp_b_run_dims: input 'x' dim 0 ('batch') is 0, outside 1..8 (status 3)"


def test_random_graphs_with_a_batch_range_match_onnxruntime_or_are_refused():
  # the fuzzer's graphs with their inputs' first dim a batch range (aot/tools/fuzz_batch.py): most mix it or hold a
  # constant shape and are refused; the rest must match onnxruntime at sizes 1, their own and past it (these seeds
  # have 16 such cases)
  from aot.tools.fuzz_batch import fuzz_batch

  counts, failures = fuzz_batch(5, 96)
  more, more_failures = fuzz_batch(3, 96)
  assert not failures + more_failures, "\n\n".join(failures + more_failures)
  assert counts["ok"] + more["ok"] >= 12, (counts, more)
