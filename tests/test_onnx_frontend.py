"""The ONNX frontend as a user meets it: files, symbolic dims, bound inputs, errors. Results checked against
onnxruntime."""

import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper as oh

import aot
from aot.errors import CompileError, InternalError
from aot.testing import assert_kernel_count


def ort_run(model, feed):
  sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
  return sess.run(None, feed)


def make(nodes, inputs, outputs, inits=(), opset=18, functions=()):
  g = oh.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
  m = oh.make_model(g, opset_imports=[oh.make_opsetid("", opset)], functions=list(functions))
  m.ir_version = 9
  return m


def test_unsupported_ops_are_all_listed_at_once():
  m = make(
    [
      oh.make_node("Relu", ["x"], ["a"]),
      oh.make_node("Unique", ["a"], ["b"], name="u1"),
      oh.make_node("NonMaxSuppression", ["b", "b"], ["c"], name="nms"),
    ],
    [oh.make_tensor_value_info("x", TP.FLOAT, [4])],
    [oh.make_tensor_value_info("c", TP.INT64, None)],
  )
  with pytest.raises(CompileError, match="Unique") as e:
    aot.compile_model(m)
  msg = str(e.value)
  assert "Unique (node 'u1')" in msg and "NonMaxSuppression (node 'nms')" in msg and "\n" not in msg


def test_unknown_ops_are_all_named_before_the_checker_complaint():
  # onnx's checker stops at the first op it does not know; every unsupported op is named before what it says
  m = make(
    [
      oh.make_node("Foo", ["x"], ["a"], name="f1"),
      oh.make_node("Relu", ["a"], ["b"]),
      oh.make_node("Bar", ["b"], ["y"], name="b1", domain="com.example"),
    ],
    [oh.make_tensor_value_info("x", TP.FLOAT, [4])],
    [oh.make_tensor_value_info("y", TP.FLOAT, [4])],
  )
  with pytest.raises(
    CompileError,
    match=r"unsupported ONNX operators: Foo \(node 'f1'\), Bar \(domain com.example\) "
    r"\(node 'b1'\); invalid ONNX model: No Op registered for Foo",
  ):
    aot.compile_model(m)


def test_an_op_registered_twice_for_one_opset_is_an_error_naming_both_places(monkeypatch):
  # which of two converters wins must not depend on the order the op modules are imported in
  from aot.frontends import onnx as frontend

  monkeypatch.setattr(frontend, "OPS", {})
  monkeypatch.setattr(frontend, "_PLACES", {})
  first = sys._getframe().f_lineno + 1
  frontend.op("Twice", since=13)(lambda n, x: x)
  frontend.op("Twice", since=1)(lambda n, x: -x)  # another opset range of the same op
  frontend.op("Twice", since=13, domain="com.example")(lambda n, x: x)  # the same name in another domain
  with pytest.raises(InternalError) as e:
    second = sys._getframe().f_lineno + 1
    frontend.op("Twice", since=13)(lambda n, x: x + 1)
  assert str(e.value) == (
    f"op Twice from opset 13 is registered twice: at test_onnx_frontend.py:{first} and at "
    f"test_onnx_frontend.py:{second} (keep one)"
  )
  assert [since for since, _ in frontend.OPS["Twice"]] == [13, 1]


@pytest.mark.parametrize("axis", [0, 1, -1, None])
def test_hardmax_before_opset_13_is_one_hot_over_the_flattened_tail(axis, tmp_path):
  # opset 1-12: the input is viewed as 2-D at `axis` and one element of each whole row is 1 (onnx.reference applies
  # opset 13's per-axis rule to every opset, so onnxruntime is the reference); an axis out of range is the model's error
  x = np.random.default_rng(0).standard_normal((3, 4, 5)).astype(np.float32)
  x[1, 2, :] = 7.0  # a tie: the first one wins
  kw = {} if axis is None else {"axis": axis}
  m = make(
    [oh.make_node("Hardmax", ["x"], ["y"], **kw)],
    [oh.make_tensor_value_info("x", TP.FLOAT, [3, 4, 5])],
    [oh.make_tensor_value_info("y", TP.FLOAT, [3, 4, 5])],
    opset=11,
  )
  got = aot.load(aot.compile_model(m, out_dir=tmp_path, name="hardmax"))(x)
  np.testing.assert_array_equal(got, ort_run(m, {"x": x})[0])


def test_hardmax_before_opset_13_rejects_an_axis_out_of_range():
  m = make(
    [oh.make_node("Hardmax", ["x"], ["y"], axis=3, name="hm")],
    [oh.make_tensor_value_info("x", TP.FLOAT, [3, 4, 5])],
    [oh.make_tensor_value_info("y", TP.FLOAT, [3, 4, 5])],
    opset=11,
  )
  with pytest.raises(CompileError, match=r"Hardmax node 'hm': axis 3 is out of range for rank 3"):
    aot.compile_model(m)


@pytest.mark.parametrize("declared", [None, [4]])
def test_a_cycle_names_its_nodes(declared):
  # (a declared output shape lets onnx's checker run, which says only that the nodes are out of order)
  m = make(
    [
      oh.make_node("Neg", ["x"], ["n"], name="first"),
      oh.make_node("Relu", ["n"], ["a"], name="r"),
      oh.make_node("Add", ["a", "c"], ["b"], name="add"),
      oh.make_node("Abs", ["b"], ["c"], name="abs"),
      oh.make_node("Neg", ["b"], ["y"], name="last"),
    ],
    [oh.make_tensor_value_info("x", TP.FLOAT, [4])],
    [oh.make_tensor_value_info("y", TP.FLOAT, declared)],
  )
  with pytest.raises(CompileError, match=r"^graph 'g' has a cycle: Add 'add' -> Abs 'abs' -> Add 'add'$"):
    aot.compile_model(m)


def test_symbolic_dims_must_be_pinned_and_can_be(tmp_path):
  m = make(
    [oh.make_node("Relu", ["x"], ["a"]), oh.make_node("Add", ["a", "y"], ["b"])],
    [oh.make_tensor_value_info("x", TP.FLOAT, ["batch", 8]), oh.make_tensor_value_info("y", TP.FLOAT, ["batch", "n"])],
    [oh.make_tensor_value_info("b", TP.FLOAT, ["batch", 8])],
  )
  with pytest.raises(CompileError, match="'batch'") as e:
    aot.compile_model(m)
  assert "x[0] ('batch')" in str(e.value) and "y[0] ('batch')" in str(e.value) and "y[1] ('n')" in str(e.value)
  art = aot.compile_model(m, shapes={"batch": 3, "y": (3, 8)})
  x, y = np.random.default_rng(0).standard_normal((2, 3, 8)).astype(np.float32)
  np.testing.assert_allclose(aot.load(art)(x, y), ort_run(m, {"x": x, "y": y})[0], rtol=1e-6)


def test_shape_arithmetic_folds_at_compile_time():
  # Shape -> Gather -> Concat -> Reshape: the target shape is known when compiling, so only the Relu remains
  nodes = [
    oh.make_node("Shape", ["x"], ["s"]),
    oh.make_node("Gather", ["s", "zero"], ["d0"], axis=0),
    oh.make_node("Concat", ["d0", "minus1"], ["shape"], axis=0),
    oh.make_node("Reshape", ["x", "shape"], ["r"]),
    oh.make_node("Relu", ["r"], ["y"]),
  ]
  inits = [oh.make_tensor("zero", TP.INT64, [1], [0]), oh.make_tensor("minus1", TP.INT64, [1], [-1])]
  m = make(
    nodes,
    [oh.make_tensor_value_info("x", TP.FLOAT, [2, 3, 4])],
    [oh.make_tensor_value_info("y", TP.FLOAT, None)],
    inits,
  )
  assert_kernel_count(m, 1)
  x = np.random.default_rng(1).standard_normal((2, 3, 4)).astype(np.float32)
  np.testing.assert_allclose(aot.load(aot.compile_model(m))(x), ort_run(m, {"x": x})[0])


def _if_on_rate():
  # if sr == 16000 then x * 2 else x[:2] (different shapes: only compilable when sr is pinned)
  then_g = oh.make_graph(
    [oh.make_node("Mul", ["x", "two"], ["t"])], "then", [], [oh.make_tensor_value_info("t", TP.FLOAT, None)]
  )
  else_g = oh.make_graph(
    [oh.make_node("Slice", ["x", "s0", "s1"], ["e"])], "else", [], [oh.make_tensor_value_info("e", TP.FLOAT, None)]
  )
  nodes = [
    oh.make_node("Equal", ["sr", "rate"], ["c"]),
    oh.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g),
  ]
  inits = [
    oh.make_tensor("two", TP.FLOAT, [], [2.0]),
    oh.make_tensor("rate", TP.INT64, [], [16000]),
    oh.make_tensor("s0", TP.INT64, [1], [0]),
    oh.make_tensor("s1", TP.INT64, [1], [2]),
  ]
  return make(
    nodes,
    [oh.make_tensor_value_info("x", TP.FLOAT, [4]), oh.make_tensor_value_info("sr", TP.INT64, [])],
    [oh.make_tensor_value_info("y", TP.FLOAT, None)],
    inits,
  )


def test_bound_scalar_input_folds_control_flow():
  m = _if_on_rate()
  with pytest.raises(CompileError, match="--bind"):
    aot.compile_model(m)
  x = np.arange(4, dtype=np.float32)
  for sr in (16000, 8000):
    art = aot.compile_model(m, bind={"sr": sr})
    assert [t.name for t in art.inputs] == ["x"]
    np.testing.assert_allclose(aot.load(art)(x), ort_run(m, {"x": x, "sr": np.array(sr)})[0])


def test_external_data_weights(tmp_path):
  w = np.random.default_rng(2).standard_normal((64, 64)).astype(np.float32)
  m = make(
    [oh.make_node("MatMul", ["x", "w"], ["y"])],
    [oh.make_tensor_value_info("x", TP.FLOAT, [2, 64])],
    [oh.make_tensor_value_info("y", TP.FLOAT, [2, 64])],
    [onnx.numpy_helper.from_array(w, "w")],
  )
  onnx.save_model(
    m,
    str(tmp_path / "m.onnx"),
    save_as_external_data=True,
    all_tensors_to_one_file=True,
    location="m.data",
    size_threshold=0,
  )
  assert (tmp_path / "m.data").exists()
  x = np.random.default_rng(3).standard_normal((2, 64)).astype(np.float32)
  art = aot.compile_model(str(tmp_path / "m.onnx"), out_dir=tmp_path / "out")
  np.testing.assert_allclose(aot.load(art)(x), x @ w, rtol=1e-5, atol=1e-5)


def cli(*args):
  return subprocess.run([sys.executable, "-m", "aot.cli", *args], capture_output=True, text=True)


def test_cli_compiles_and_checks_an_onnx_file(tmp_path):
  m = make(
    [oh.make_node("Relu", ["x"], ["a"]), oh.make_node("Sigmoid", ["a"], ["y"])],
    [oh.make_tensor_value_info("x", TP.FLOAT, ["batch", 16])],
    [oh.make_tensor_value_info("y", TP.FLOAT, None)],
  )
  onnx.save(m, str(tmp_path / "m.onnx"))
  p = cli(str(tmp_path / "m.onnx"), "-o", str(tmp_path / "out"), "--shape", "x=4x16", "--check")
  assert p.returncode == 0, p.stderr
  assert "check vs onnxruntime" in p.stdout and "PASS" in p.stdout
  assert (tmp_path / "out" / "libm.so").exists()


def test_cli_bind(tmp_path):
  onnx.save(_if_on_rate(), str(tmp_path / "if.onnx"))
  p = cli(str(tmp_path / "if.onnx"), "-o", str(tmp_path / "out"), "--bind", "sr=8000", "--check")
  assert p.returncode == 0, p.stderr
  assert "PASS" in p.stdout


def test_cli_unsupported_op_is_one_line_and_writes_nothing(tmp_path):
  m = make(
    [oh.make_node("Unique", ["x"], ["y"], name="u")],
    [oh.make_tensor_value_info("x", TP.FLOAT, [4])],
    [oh.make_tensor_value_info("y", TP.FLOAT, None)],
  )
  onnx.save(m, str(tmp_path / "u.onnx"))
  p = cli(str(tmp_path / "u.onnx"), "-o", str(tmp_path / "out"))
  assert p.returncode == 1
  assert p.stderr.strip().splitlines() == ["compile-model: error: unsupported ONNX operators: Unique (node 'u')"]
  assert not (tmp_path / "out").exists()


def test_cli_corrupt_file_is_one_line_and_writes_nothing(tmp_path):
  m = make(
    [oh.make_node("Relu", ["x"], ["y"])],
    [oh.make_tensor_value_info("x", TP.FLOAT, [4])],
    [oh.make_tensor_value_info("y", TP.FLOAT, None)],
  )
  data = m.SerializeToString()
  (tmp_path / "bad.onnx").write_bytes(data[: len(data) // 2])
  p = cli(str(tmp_path / "bad.onnx"), "-o", str(tmp_path / "out"))
  assert p.returncode == 1 and len(p.stderr.strip().splitlines()) == 1
  assert "not a readable ONNX model" in p.stderr or "invalid ONNX model" in p.stderr
  assert not (tmp_path / "out").exists()
  p = cli(str(tmp_path / "missing.onnx"), "-o", str(tmp_path / "out"))
  assert p.returncode == 1 and "no such file" in p.stderr


def _relu(imports: list, op="Relu", domain=""):
  g = oh.make_graph(
    [oh.make_node(op, ["x"], ["y"], domain=domain)],
    "g",
    [oh.make_tensor_value_info("x", TP.FLOAT, [2, 3])],
    [oh.make_tensor_value_info("y", TP.FLOAT, [2, 3])],
  )
  return oh.make_model(g, opset_imports=[oh.make_opsetid(d, v) for d, v in imports])


@pytest.mark.parametrize(
  "domain,version,named",
  [
    ("", 99, "default"),
    ("ai.onnx", onnx.defs.onnx_opset_version() + 1, "default"),
    ("ai.onnx.ml", onnx.defs.onnx_ml_opset_version() + 1, "ai.onnx.ml"),
  ],
)
def test_an_opset_newer_than_onnx_defines_is_refused_naming_it(domain, version, named):
  # what such an opset's ops mean is not known here (onnxruntime refuses these models too)
  imports = [(domain, version)] if domain != "ai.onnx.ml" else [("", 18), (domain, version)]
  with pytest.raises(CompileError, match=rf"imports opset {version} of the {named} domain, newer than the installed"):
    aot.compile_model(_relu(imports))


def test_the_newest_opset_and_other_domains_versions_still_compile():
  x = np.random.default_rng(2).standard_normal((2, 3)).astype(np.float32)
  newest = _relu([("", onnx.defs.onnx_opset_version())])
  np.testing.assert_array_equal(aot.load(aot.compile_model(newest))(x), np.maximum(x, 0))
  # com.microsoft's and a custom domain's versions are their owners' to define: the op table decides
  gelu = _relu([("", 18), ("com.microsoft", 1), ("my.domain", 99)], "Gelu", "com.microsoft")
  np.testing.assert_allclose(aot.load(aot.compile_model(gelu))(x), ort_run(gelu, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_a_graph_named_past_a_file_names_length_compiles(tmp_path):
  """A graph named by its exporter after all its nodes (300 characters here, past the 255 bytes of a file name) is
  compiled under a name cut to C_NAME_MAX with a hash of the rest: two such names stay apart, the files are written."""
  from aot.artifact import C_NAME_MAX

  x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
  names = []
  for tail in "ab":
    x_info, y_info = (oh.make_tensor_value_info(n, TP.FLOAT, [2, 3]) for n in "xy")
    model = make([oh.make_node("Relu", ["x"], ["y"])], [x_info], [y_info])
    model.graph.name = "relu_" * 59 + tail
    art = aot.compile_model(model, out_dir=tmp_path / tail)
    assert len(art.name) == C_NAME_MAX and (tmp_path / tail / f"lib{art.name}.so").exists()
    np.testing.assert_array_equal(aot.load(art)(x), np.maximum(x, 0))
    names.append(art.name)
  assert names[0] != names[1]
