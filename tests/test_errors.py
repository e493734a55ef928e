"""One error tree (aot/errors.py): every error aot raises on purpose is an AotError; the user's problems are
CompileErrors, a bug of ours is an InternalError naming where it happened; the builtin types callers caught before stay
caught."""

import inspect
import re

import numpy as np
import pytest
from conftest import make
from onnx import TensorProto as TP
from onnx import helper as oh

import aot
from aot import errors
from aot.errors import AotError, CompileError, InternalError


def relu_model():
  return make(
    [oh.make_node("Relu", ["x"], ["y"], name="r1")],
    [oh.make_tensor_value_info("x", TP.FLOAT, [2, 3])],
    [oh.make_tensor_value_info("y", TP.FLOAT, [2, 3])],
  )


def test_every_error_is_an_aot_error_and_keeps_the_builtin_it_replaced():
  classes = [c for _, c in inspect.getmembers(errors, inspect.isclass) if c.__module__ == "aot.errors"]
  assert len(classes) >= 14 and all(issubclass(c, AotError) for c in classes)
  assert issubclass(errors.MissingToolError, errors.BuildError) and issubclass(errors.MissingToolError, RuntimeError)
  assert issubclass(errors.InputShapeError, ValueError) and issubclass(errors.InputDtypeError, TypeError)
  assert issubclass(errors.NeedsConstant, errors.Unsupported) and issubclass(errors.Unsupported, CompileError)
  assert issubclass(errors.KernelCountException, AssertionError)
  assert not issubclass(InternalError, CompileError) and not issubclass(errors.BuildError, CompileError)
  # the names users and op files import from the old places are the same classes
  import aot.build
  import aot.frontends.onnx
  import aot.testing

  assert aot.CompileError is CompileError and aot.build.BuildError is errors.BuildError
  assert aot.testing.KernelCountException is errors.KernelCountException
  assert aot.frontends.onnx.Unsupported is errors.Unsupported


def test_needs_inputs_is_a_constructor_field():
  assert CompileError("x").needs_inputs == frozenset()
  assert CompileError("x", {"a", "b"}).needs_inputs == {"a", "b"}
  assert errors.NeedsConstant("x", "shape").needs_inputs == {"shape"}
  assert CompileError("x", needs_shapes={"seq"}).needs_shapes == {"seq"} and CompileError("x").needs_shapes == set()
  # a Reshape whose shape is a model input: the error says which input --bind would pin
  m = make(
    [oh.make_node("Reshape", ["x", "shape"], ["y"], name="rs")],
    [oh.make_tensor_value_info("x", TP.FLOAT, [2, 3]), oh.make_tensor_value_info("shape", TP.INT64, [2])],
    [oh.make_tensor_value_info("y", TP.FLOAT, [3, 2])],
  )
  with pytest.raises(CompileError, match=r"Reshape node 'rs': .*--bind shape=VALUE") as e:
    aot.compile_model(m)
  assert e.value.needs_inputs == {"shape"}


def test_a_model_problem_in_a_converter_stays_a_compile_error():
  # Tensor.reshape's check (once a ValueError, now also a CompileError) is the model's fault, stated per node
  m = make(
    [oh.make_node("Reshape", ["x", "s"], ["y"], name="rs")],
    [oh.make_tensor_value_info("x", TP.FLOAT, [2, 3])],
    [oh.make_tensor_value_info("y", TP.FLOAT, None)],
    [oh.make_tensor("s", TP.INT64, [1], [4])],
  )
  with pytest.raises(
    CompileError,
    match=r"1 ONNX node\(s\) cannot be compiled: Reshape node 'rs': cannot reshape "
    r"\(2, 3\) \(6 elements\) to \(4,\)",
  ):
    aot.compile_model(m)
  with pytest.raises(ValueError, match=r"cannot reshape \(2, 3\)") as e:
    aot.compile_model(lambda x: x.reshape(4), [np.zeros((2, 3), np.float32)])
  assert isinstance(e.value, CompileError)


@pytest.fixture
def broken_relu(monkeypatch):
  """Relu's converter with a bug in it: an IndexError from our own code (which the frontend used to report as the
  model's node that "cannot be compiled")."""
  import aot.frontends.onnx_ops  # noqa: F401  (fills the op table)
  from aot.frontends.onnx import OPS

  def relu(ctx, x):
    return [x][1]

  monkeypatch.setitem(OPS, "Relu", [(1, relu)])


def test_a_bug_in_a_converter_is_an_internal_error_naming_the_node(broken_relu):
  with pytest.raises(
    InternalError,
    match=r"^internal compiler error in Relu node 'r1': IndexError: list index out of "
    r"range \(a bug in the compiler, not in the model: please report it\)$",
  ) as e:
    aot.compile_model(relu_model())
  assert not isinstance(e.value, CompileError) and "cannot be compiled" not in str(e.value)
  assert isinstance(e.value.__cause__, IndexError)


def test_the_cli_says_an_internal_error_is_one_in_one_line(broken_relu, tmp_path, capsys):
  import onnx

  from aot import cli

  onnx.save(relu_model(), tmp_path / "m.onnx")
  assert cli.main([str(tmp_path / "m.onnx"), "-o", str(tmp_path / "out")]) == 1
  err = capsys.readouterr().err
  assert err.splitlines() == [
    "compile-model: error: internal compiler error in Relu node 'r1': IndexError: list index "
    "out of range (a bug in the compiler, not in the model: please report it) (rerun with -v "
    "for the traceback)"
  ]


# a bug of ours past the frontend (the renderer, as the fuzzer found: seed 4242 case 704, seed 123 case 796) names
# the kernel, its function, the model output it writes and the stage; the IR keeps no link back to the ONNX nodes
RENDER_BUG = (
  r"internal compiler error in function m_f0 of kernel k0_e_2_3 \(writing output 'y'\) while rendering the kernels "
  r"for target c: KeyError: 'r0' \(a bug in the compiler, not in the model: please report it\)"
)


@pytest.fixture
def broken_renderer(monkeypatch):
  """The C renderer with a bug in it: a KeyError from our own code (which reached the user bare)."""
  from aot.codegen.render.c import CRenderer

  def render_kernel(self, name, ast):
    raise KeyError("r0")

  monkeypatch.setattr(CRenderer, "render_kernel", render_kernel)


def test_a_bug_in_the_renderer_is_an_internal_error_naming_the_kernel_and_stage(broken_renderer, tmp_path):
  with pytest.raises(InternalError, match=f"^{RENDER_BUG}$") as e:
    aot.compile_model(relu_model(), out_dir=tmp_path / "out", name="m")
  assert isinstance(e.value.__cause__, KeyError)
  # a Tensor program's kernels too, and nothing is left behind
  with pytest.raises(InternalError, match=r"^internal compiler error in function scale_f0 of kernel k0_e_3 "):
    aot.compile_model(lambda x: x * 2, [np.zeros(3, np.float32)], out_dir=tmp_path / "t", name="scale")
  assert not (tmp_path / "t").exists()


def test_a_bug_in_the_scheduler_or_the_build_names_its_stage(monkeypatch, tmp_path):
  import aot.compiler
  import aot.scheduler.schedule

  def lower_stage(ctx, x, buf):
    return [][0]

  with monkeypatch.context() as m:
    m.setattr(aot.scheduler.schedule, "lower_stage", lower_stage)
    with pytest.raises(
      InternalError,
      match=r"^internal compiler error in the kernel of the \w+ of shape \(2, 3\) \(writing output 'y'\) while "
      r"scheduling: IndexError: list index out of range \(a bug in the compiler",
    ):
      aot.compile_model(relu_model(), out_dir=tmp_path / "out")

  def build_library(*args, **kwargs):
    raise TypeError("an argument too many")

  monkeypatch.setattr(aot.compiler, "build_library", build_library)
  with pytest.raises(
    InternalError, match=r"^internal compiler error while building libm\.so: TypeError: an argument too many \(a bug"
  ):
    aot.compile_model(relu_model(), out_dir=tmp_path / "out", name="m")


def test_the_users_errors_and_the_systems_pass_through_unchanged(monkeypatch, tmp_path):
  import aot.compiler

  # the user's program raising is the user's own error, not the compiler's
  with pytest.raises(ZeroDivisionError):
    aot.compile_model(lambda x: x * (1 / 0), [np.zeros(3, np.float32)], out_dir=tmp_path / "a")
  with pytest.raises(ValueError, match="unknown reference model 'nope'") as e:
    aot.compile_model("models:nope", out_dir=tmp_path / "a")
  assert isinstance(e.value, CompileError)
  # a CompileError, a BuildError or an OSError raised past the frontend: the very same exception
  for err in (CompileError("a dim of 0"), errors.BuildError("cc failed"), PermissionError("read-only folder")):

    def render_stage(*args, err=err, **kwargs):
      raise err

    monkeypatch.setattr(aot.compiler, "render_stage", render_stage)
    with pytest.raises(type(err)) as e:
      aot.compile_model(relu_model(), out_dir=tmp_path / "b")
    assert e.value is err


def test_the_cli_reports_a_bug_past_the_frontend_as_an_internal_error(broken_renderer, tmp_path, capsys):
  import onnx

  from aot import cli

  onnx.save(relu_model(), tmp_path / "m.onnx")
  for emit in ([], ["--emit", "kernels"]):
    assert cli.main([str(tmp_path / "m.onnx"), "-o", str(tmp_path / "out"), *emit]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert re.fullmatch(f"compile-model: error: {RENDER_BUG} \\(rerun with -v for the traceback\\)", line), line


def test_loader_input_errors_name_the_input_and_keep_their_builtin_types(tmp_path):
  m = aot.load(
    aot.compile_model(
      lambda x, w: x * w, [np.zeros((2, 3), np.float32), np.zeros(3, np.float32)], out_dir=tmp_path, name="scale"
    )
  )
  x, w = np.ones((2, 3), np.float32), np.ones(3, np.float32)
  with pytest.raises(ValueError, match=r"^scale input 'x': expected shape \(2, 3\), got \(3, 2\)$") as e:
    m(x.T, w)
  assert isinstance(e.value, errors.InputShapeError)
  assert (e.value.input_name, e.value.expected, e.value.got) == ("x", (2, 3), (3, 2))
  with pytest.raises(TypeError, match=r"^scale input 'w': expected dtype float32, got int32$") as e:
    m(x, w.astype(np.int32))
  assert isinstance(e.value, errors.InputDtypeError) and e.value.input_name == "w"
  with pytest.raises(TypeError, match=r"scale takes 2 inputs \(x, w\), got 1") as e:
    m(x)
  assert isinstance(e.value, AotError)
  np.testing.assert_array_equal(m(x, np.array([1, 2, 3], np.float32)), np.tile(np.float32([1, 2, 3]), (2, 1)))
  m.close()
