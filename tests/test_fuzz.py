"""The differential fuzzer (aot/tools/fuzz.py) on a fixed set of seeds: every random graph compiles and matches
onnxruntime, on the c target under each C compiler and on llvm. Any number more by hand: python -m aot.tools.fuzz --seed
S --n N [--target llvm] [--cc gcc]."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from conftest import need

from aot.tools import fuzz

# (target, C compiler, seed, cases): 288 graphs on c under clang-19, 96 under gcc and under clang-14 (a compiler can
# miscompile what the others get right: clang 19's SLP vectoriser did, tests/test_compilers.py), 96 on llvm (its
# runtime built by the default compiler); each entry is a few batches, so pytest -n 2 shares them out
SUITE = (
  [("c", "clang-19", seed, 72) for seed in (1, 2, 3, 4)]
  + [("c", "gcc", seed, 48) for seed in (7, 8)]
  + [("c", "clang-14", seed, 48) for seed in (9, 10)]
  + [("llvm", None, seed, 48) for seed in (5, 6)]
)


@pytest.mark.parametrize(
  "target,cc,seed,n", SUITE, ids=[f"{t}{f'-{cc}' if cc else ''}-seed{s}" for t, cc, s, _ in SUITE]
)
def test_random_graphs_match_onnxruntime(target, cc, seed, n):
  if cc:
    need(cc)
  failures = fuzz.fuzz(seed, n, target, cc=cc)
  if failures:
    pytest.fail("\n\n".join(f.report() for f in failures), pytrace=False)


def test_cases_are_deterministic():
  for i in range(20):
    a, b = fuzz.generate(9, i), fuzz.generate(9, i)
    assert a.model().SerializeToString() == b.model().SerializeToString()
    assert a.feeds.keys() == b.feeds.keys() and all(np.array_equal(a.feeds[k], b.feeds[k]) for k in a.feeds)
  assert fuzz.generate(9, 0).model().SerializeToString() != fuzz.generate(10, 0).model().SerializeToString()


def test_generator_shapes_are_onnx_shapes():
  """The shapes the generator works with are the ones ONNX infers (except ceil_mode pools, where onnx's inference
  keeps a last window that starts in the padding and onnxruntime, whose shape the generator follows, drops it)."""
  checked = 0
  for i in range(150):
    case = fuzz.generate(21, i)
    case.shaped = True  # the checker wants declared output shapes (aot does not)
    model = case.model()
    onnx.checker.check_model(model)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    shapes = {
      vi.name: tuple(d.dim_value for d in vi.type.tensor_type.shape.dim)
      for vi in list(inferred.graph.value_info) + list(inferred.graph.output)
    }
    if any(a.name == "ceil_mode" and a.i for n in model.graph.node for a in n.attribute):
      continue
    for v in case.values:
      if v.name in shapes:
        assert shapes[v.name] == v.shape, f"case {i} value {v.name}: onnx infers {shapes[v.name]}, generator {v.shape}"
        checked += 1
  assert checked > 500


def test_compare_is_exact_or_scaled_and_nan_aware():
  x = np.array([1.0, -2.5, np.nan, np.inf], np.float32)
  assert fuzz.compare(x.copy(), x, exact=True, rtol=0, scale=0) is None
  one_ulp = x.copy()
  one_ulp[0] = np.nextafter(np.float32(1), np.float32(2))
  assert "1 of 4 elements differ" in fuzz.compare(one_ulp, x, exact=True, rtol=0, scale=0)
  assert fuzz.compare(one_ulp, x, exact=False, rtol=1e-4, scale=1) is None
  for bad in ([1.0, -2.5, 0.0, np.inf], [1.0, -2.5, np.nan, -np.inf], [1.0, -2.4, np.nan, np.inf]):
    assert "1 of 4 elements differ" in fuzz.compare(np.array(bad, np.float32), x, exact=False, rtol=1e-4, scale=1)
  assert "dtype" in fuzz.compare(x.astype(np.float64), x, exact=False, rtol=1e-4, scale=1)
  assert "differ" in fuzz.compare(np.array([True, False]), np.array([True, True]), exact=True, rtol=0, scale=0)


def test_a_failure_is_reported_and_saved(tmp_path):
  case = fuzz.generate(3, 5)
  f = fuzz.Failure(case, "c", "mismatch", "output x: 1 of 4 elements differ")
  text = f.report()
  assert "seed 3 case 5" in text and "python -m aot.tools.fuzz --seed 3 --case 5 --target c" in text
  assert case.nodes[0].op_type in text
  path = f.save(tmp_path)
  assert onnx.load(str(path)).SerializeToString() == case.model().SerializeToString()
  saved = np.load(str(path).replace(".onnx", "_inputs.npz"))
  assert sorted(saved.files) == sorted(case.feeds)


def test_the_command_line_reports_and_saves_a_wrong_answer(tmp_path, monkeypatch, capsys):
  """A compiler whose every output is off by one (or negated, for booleans): each case fails, alone too, and --save
  writes it."""

  def off_by_one(cases, target, folder):
    env = fuzz.reference(cases)
    return {
      v.name: ~env[v.name] if env[v.name].dtype == bool else env[v.name] + np.ones((), env[v.name].dtype)
      for c in cases
      for v in c.outputs
    }

  monkeypatch.setattr(fuzz, "compiled", off_by_one)
  assert fuzz.main(["--seed", "4", "--n", "3", "-q", "--save", str(tmp_path)]) == 1
  out = capsys.readouterr().out
  assert out.count("FAIL seed 4 case") == 3 and "0/3 cases match onnxruntime" in out
  assert len(list(tmp_path.glob("fuzz_seed4_case*_c.onnx"))) == 3


def test_cc_builds_with_that_compiler_and_goes_into_the_reproduce_line(monkeypatch, capsys):
  need("gcc")
  built_with = []

  def off_by_one(cases, target, folder):
    built_with.append(os.environ.get("CC"))
    env = fuzz.reference(cases)
    return {v.name: ~env[v.name] if env[v.name].dtype == bool else env[v.name] + 1 for c in cases for v in c.outputs}

  monkeypatch.setattr(fuzz, "compiled", off_by_one)
  monkeypatch.setenv("CC", "the-default-cc")
  assert fuzz.main(["--seed", "4", "--n", "2", "-q", "--cc", "gcc"]) == 1
  out = capsys.readouterr().out
  assert "python -m aot.tools.fuzz --seed 4 --case 0 --target c --cc gcc" in out and "(seed 4, target c, cc gcc," in out
  # the batch and each case's retry alone, all under gcc; $CC as it was after
  assert built_with == ["gcc"] * 3 and os.environ["CC"] == "the-default-cc"
  with pytest.raises(SystemExit):
    fuzz.main(["--n", "1", "--cc", "no-such-cc-19"])
  assert "--cc no-such-cc-19: no such compiler on PATH" in capsys.readouterr().err


# *** what the fuzzer found, kept as plain tests ***


def _ort_and_aot(model: onnx.ModelProto, feeds: dict, tmp_path):
  import onnxruntime as ort

  import aot

  want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
  art = aot.compile_model(model, out_dir=tmp_path / "m")
  return aot.load(art, threads=1)(*[feeds[t.name] for t in art.inputs]), want


def _model(nodes, inputs, inits) -> onnx.ModelProto:
  from onnx import helper, numpy_helper

  g = helper.make_graph(
    nodes,
    "found",
    inputs,
    [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
    [numpy_helper.from_array(v, k) for k, v in inits.items()],
  )
  return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


def test_found_a_folded_scalar_keeps_its_shape(tmp_path):
  """seed 2 case 233: Where(True, 0.5, ReduceMax(constant)) folds to a 0-d constant, which came out shape (1,)."""
  from onnx import helper

  w = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
  nodes = [helper.make_node("ReduceMax", ["w"], ["r"], keepdims=0), helper.make_node("Where", ["c", "a", "r"], ["y"])]
  model = _model(nodes, [], {"w": w, "c": np.asarray(True), "a": np.asarray(0.5, np.float32)})
  got, want = _ort_and_aot(model, {}, tmp_path)
  assert got.shape == want.shape == () and got == want


def test_found_a_ceil_mode_pool_whose_last_window_starts_in_the_padding(tmp_path):
  """onnx's shape inference counts that window, onnxruntime (and onnx's reference evaluator) do not: with no output
  shape declared, the model was rejected as a frontend bug."""
  from onnx import helper

  model = _model(
    [helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[1], strides=[2], ceil_mode=1)],
    [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 1, 8])],
    {},
  )
  x = np.arange(8, dtype=np.float32).reshape(1, 1, 8)
  got, want = _ort_and_aot(model, {"x": x}, tmp_path)
  assert want.shape == (1, 1, 4)
  np.testing.assert_array_equal(got, want)


def test_found_an_upcast_lane_that_reads_only_padding(tmp_path):
  """seed 81 case 119: in this ConvTranspose's kernel one unrolled lane of the output loop reads only padding, so its
  accumulator varies in no output loop; placed outside them, it opened the lanes' shared reduction loops there, around
  the other lanes' reads of the output index (KeyError on a RANGE while rendering)."""
  from onnx import helper

  rng = np.random.default_rng(0)
  node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], dilations=[2, 2], pads=[3, 0, 0, 1], strides=[1, 2])
  model = _model(
    [node],
    [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 2, 3, 8])],
    {"w": rng.standard_normal((2, 1, 3, 2)).astype(np.float32)},
  )
  x = rng.standard_normal((1, 2, 3, 8)).astype(np.float32)
  got, want = _ort_and_aot(model, {"x": x}, tmp_path)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("target", ["c", "llvm"])
def test_found_a_padding_only_lane_read_after_its_sums(tmp_path, target):
  """seed 4242 case 704: in this grouped, dilated, strided ConvTranspose one unrolled lane of the output loop reads
  only padding, so its sum varies in fewer loops than the lanes' shared reduction nest; the division by a runtime
  scalar reading it was placed by its own loops, before the nest had run (KeyError on an ACCUMULATE while rendering)."""
  import onnxruntime as ort
  from onnx import helper

  import aot

  rng = np.random.default_rng(0)
  conv = helper.make_node(
    "ConvTranspose",
    ["x", "w"],
    ["t"],
    dilations=[2, 1],
    group=8,
    kernel_shape=[2, 2],
    pads=[0, 1, 1, 0],
    strides=[2, 1],
  )
  inputs = [
    helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 8, 8, 15]),
    helper.make_tensor_value_info("s", onnx.TensorProto.FLOAT, []),
  ]
  model = _model(
    [conv, helper.make_node("Div", ["t", "s"], ["y"])],
    inputs,
    {"w": rng.standard_normal((8, 3, 2, 2)).astype(np.float32)},
  )
  feeds = {"x": rng.standard_normal((1, 8, 8, 15)).astype(np.float32), "s": np.asarray(1.5, np.float32)}
  want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
  art = aot.compile_model(model, target=target, out_dir=tmp_path / "m")
  got = aot.load(art, threads=1)(feeds["x"], feeds["s"])
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _matmul_then(rng, nodes: list, inits: dict) -> onnx.ModelProto:
  from onnx import helper

  inits = {"w": rng.standard_normal((64, 64)).astype(np.float32), **inits}
  x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [48, 64])
  return _model([helper.make_node("MatMul", ["x", "w"], ["mm"]), *nodes], [x], inits)


@pytest.mark.parametrize("target", ["c", "llvm"])
@pytest.mark.parametrize("joined", ["pad", "concat"])
def test_found_a_matmul_joined_then_summed_over_the_joined_axis(tmp_path, target, joined):
  """seed 123 case 796 (Pad) and seed 2718 case 900 (Concat): a matmul's result padded or concatenated on an axis, then
  reduced over that axis in the same kernel. The epilogue was cut into one piece per slice of the axis, as for a concat
  that is stored, which made the sum's loop variable an expression ('CONST/ADD has no field of RANGE's arg')."""
  import onnxruntime as ort
  from onnx import helper

  import aot

  rng = np.random.default_rng(0)
  axes = np.asarray([0, 1] if joined == "pad" else [0, -1], np.int64)
  if joined == "pad":
    pad = helper.make_node("Pad", ["mm", "pads", "", "pad_axes"], ["j"], mode="constant")
    reduce = helper.make_node("ReduceMean", ["j", "axes"], ["y"], keepdims=1)
    model = _matmul_then(rng, [pad, reduce], {"pads": np.asarray([1, -1]), "pad_axes": np.asarray([-1]), "axes": axes})
  else:
    inits = {
      "top": rng.standard_normal((2, 64)).astype(np.float32),
      "bottom": rng.standard_normal((1, 64)).astype(np.float32),
      "axes": axes,
    }
    concat = helper.make_node("Concat", ["top", "mm", "bottom"], ["j"], axis=-2)
    reduce = helper.make_node("ReduceMin", ["j", "axes"], ["y"], keepdims=0)
    model = _matmul_then(rng, [concat, reduce], inits)
  x = rng.standard_normal((48, 64)).astype(np.float32)
  want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
  art = aot.compile_model(model, target=target, out_dir=tmp_path / "m")
  np.testing.assert_allclose(aot.load(art, threads=1)(x), want, rtol=1e-4, atol=1e-4)
