"""The session-style calls of a loaded model, against onnxruntime's InferenceSession on the same ONNX model: the same
script runs with either session object."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, save

import aot
from aot.errors import AotError, InputCountError, InputShapeError, ModelClosedError


@pytest.fixture(scope="module")
def two_by_two(tmp_path_factory):
  """An ONNX model with two inputs (declared b, then a) and two outputs (sum, then scaled), and its artifact."""
  folder = tmp_path_factory.mktemp("session")
  f = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [2, 3])
  g = helper.make_graph(
    [helper.make_node("Add", ["a", "b"], ["sum"]), helper.make_node("Mul", ["sum", "a"], ["scaled"])],
    "two_by_two",
    [f("b"), f("a")],
    [f("sum"), f("scaled")],
  )
  path = folder / "two_by_two.onnx"
  save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
  aot.compile_model(str(path), out_dir=folder / "art")
  return path, folder / "art"


def _script(session, feeds):
  """What a user's onnxruntime script does with its session."""
  names = [i.name for i in session.get_inputs()]
  outs = session.run(None, {n: feeds[n] for n in names})
  last = session.run([session.get_outputs()[1].name], feeds)[0]
  return names, [o.name for o in session.get_outputs()], outs, last


def test_a_script_written_for_onnxruntime_runs_unchanged(two_by_two):
  path, folder = two_by_two
  rng = np.random.default_rng(3)
  feeds = {"a": rng.standard_normal((2, 3), dtype=np.float32), "b": rng.standard_normal((2, 3), dtype=np.float32)}
  want = _script(ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]), feeds)
  with aot.load(folder) as session:
    got = _script(session, feeds)
  assert got[:2] == want[:2] == (["b", "a"], ["sum", "scaled"])
  for g, w in zip(got[2] + [got[3]], want[2] + [want[3]]):
    np.testing.assert_allclose(g, w, rtol=1e-6)


def test_inputs_and_outputs_are_described_as_onnxruntime_does(two_by_two):
  path, folder = two_by_two
  sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
  with aot.load(folder) as m:
    for ours, theirs in ((m.get_inputs(), sess.get_inputs()), (m.get_outputs(), sess.get_outputs())):
      assert [(i.name, i.shape, i.type) for i in ours] == [(i.name, i.shape, i.type) for i in theirs]
    assert m.get_inputs()[0].dtype == np.float32


def test_inputs_by_keyword_by_dict_and_in_order_agree(two_by_two):
  _, folder = two_by_two
  a, b = np.full((2, 3), 2, np.float32), np.arange(6, dtype=np.float32).reshape(2, 3)
  with aot.load(folder / "libtwo_by_two.so") as m:
    in_order = m(b, a)
    for got in (m(a=a, b=b), m({"b": b, "a": a})):
      for g, w in zip(got, in_order):
        np.testing.assert_array_equal(g, w)
    np.testing.assert_array_equal(in_order[1], (a + b) * a)


def test_a_wrong_feed_names_what_is_wrong(two_by_two):
  _, folder = two_by_two
  x = np.zeros((2, 3), np.float32)
  with aot.load(folder) as m:
    with pytest.raises(InputCountError, match=r"no input 'c'; missing 'b'"):
      m(a=x, c=x)
    with pytest.raises(InputCountError, match="in order or by name, not both"):
      m(x, a=x)
    with pytest.raises(InputCountError, match="has no output 'nope'"):
      m.run(["nope"], {"a": x, "b": x})


def test_leaving_the_with_block_closes_the_model(two_by_two):
  _, folder = two_by_two
  x = np.zeros((2, 3), np.float32)
  with aot.load(folder) as m:
    m(x, x)
  with pytest.raises(ModelClosedError):
    m(x, x)
  assert issubclass(aot.RunError, AotError) and issubclass(aot.RunError, RuntimeError)


def test_outputs_are_written_into_the_callers_arrays(two_by_two):
  _, folder = two_by_two
  rng = np.random.default_rng(5)
  a, b = rng.standard_normal((2, 3), dtype=np.float32), rng.standard_normal((2, 3), dtype=np.float32)
  dense, wide = np.full((2, 3), np.nan, np.float32), np.full((2, 6), np.nan, np.float32)
  strided = wide[:, ::2]
  with aot.load(folder) as m:
    got = m(b, a, out=(dense, strided))
    assert got[0] is dense and got[1] is strided
    np.testing.assert_allclose(dense, a + b, rtol=1e-6)
    np.testing.assert_allclose(strided, (a + b) * a, rtol=1e-6)
    assert np.isnan(wide[:, 1::2]).all()  # a strided out= array is filled where it views, nowhere else
    # an out= array that is one of the inputs: the inputs are read whole before the output is written
    b_copy = b.copy()
    m(b, a, out=(b, dense))
    np.testing.assert_allclose(b, a + b_copy, rtol=1e-6)
    np.testing.assert_allclose(dense, (a + b_copy) * a, rtol=1e-6)


def test_a_contiguous_out_array_is_written_without_a_copy(two_by_two, monkeypatch):
  _, folder = two_by_two
  x = np.ones((2, 3), np.float32)
  outs = (np.empty((2, 3), np.float32), np.empty((2, 3), np.float32))
  with aot.load(folder) as m:
    written = []
    run = m._run
    monkeypatch.setattr(m, "_run", lambda model, *ptrs: written.extend(ptrs[2:]) or run(model, *ptrs))
    m(x, x, out=outs)
  assert [int(m.ffi.cast("uintptr_t", p)) for p in written] == [o.ctypes.data for o in outs]
  np.testing.assert_array_equal(outs[1], np.full((2, 3), 2, np.float32))


def test_a_wrong_out_array_names_the_output(two_by_two):
  _, folder = two_by_two
  x = np.zeros((2, 3), np.float32)
  with aot.load(folder) as m:
    with pytest.raises(InputShapeError, match=r"output 'scaled': out= needs a writable float32 array of shape"):
      m(x, x, out=(np.empty((2, 3), np.float32), np.empty((3, 2), np.float32)))
    with pytest.raises(InputShapeError, match="output 'sum'.*got float64"):
      m(x, x, out=(np.empty((2, 3)), np.empty((2, 3), np.float32)))
    frozen = np.empty((2, 3), np.float32)
    frozen.flags.writeable = False
    with pytest.raises(InputShapeError, match="got a read-only float32"):
      m(x, x, out=(frozen, np.empty((2, 3), np.float32)))
    with pytest.raises(InputCountError, match="2 outputs, out= gave 1"):
      m(x, x, out=np.empty((2, 3), np.float32))
    both = np.empty((2, 3), np.float32)
    with pytest.raises(InputShapeError, match="overlap one another"):
      m(x, x, out=(both, both))


@pytest.mark.parametrize("name", ["mlp", "mnist", "resnet18", "transformer"])
def test_the_reference_models_answer_a_session_script_as_onnxruntime_does(name, tmp_path):
  import onnx

  from aot.models.onnx_forms import onnx_model

  path = tmp_path / f"{name}.onnx"
  onnx.save(onnx_model(name), str(path))
  aot.compile_model(str(path), out_dir=tmp_path / "art")
  sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
  rng = np.random.default_rng(7)
  feeds = {i.name: rng.standard_normal(i.shape).astype(np.float32) for i in sess.get_inputs()}
  with aot.load(tmp_path / "art") as m:
    assert [(i.name, i.shape, i.type) for i in m.get_inputs()] == [(i.name, i.shape, i.type) for i in sess.get_inputs()]
    assert [o.name for o in m.get_outputs()] == [o.name for o in sess.get_outputs()]
    for got, want in zip(m.run(None, feeds), sess.run(None, feeds)):
      np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
