"""NaN, infinities and signed zeros through the elementwise ops whose answer depends on them, on every target (the GPU
targets' CUDA and HIP kernel source run on the CPU through the shim; Metal's source is the same graph with its own
spelling of the ops and cannot run here). The reference is onnx.reference; a zero's sign is checked where onnxruntime
agrees with it (Relu(-0) is +0 in onnx.reference and -0 in onnxruntime: either is right)."""

import warnings

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import aot

# (target, emulate): the CPU targets and the GPU kernel sources the shim runs
TARGETS = [("c", False), ("llvm", False), ("cuda", True), ("hip", True)]

NAN = np.float32("nan")
# x and y pair NaN with NaN, with ordinary values and infinities, zeros of both signs with each other, and halves
# (Round's ties) with both signs
X, Y = np.array(
  [
    (NAN, 1.0),
    (-NAN, NAN),
    (NAN, -np.inf),
    (np.inf, 2.0),
    (-np.inf, NAN),
    (0.0, -0.0),
    (-0.0, 0.0),
    (0.5, np.inf),
    (-0.5, -np.inf),
    (1.5, NAN),
    (-1.5, 0.5),
    (2.5, 3.0),
    (-2.5, -3.7),
    (3.7, 3.7),
    (-3.7, 2.0),
    (1.0, -np.inf),
    (-2.0, -2.0),
    (7.0, 2.0),
    (-7.0, 2.0),
    (1e30, NAN),
  ],  # fmt: skip
  np.float32,
).T.copy()

# exact ops (no rounding of their own): their values bit for bit; the others within libm's accuracy
EXACT = {"Sign", "Relu", "Abs", "Neg", "Ceil", "Floor", "Round", "Max", "Min", "Clip", "LeakyRelu", "PRelu", "Mod"}
EXACT |= {"ThresholdedRelu", "Shrink", "Where"}
BOOL_OUT = {"IsNaN", "IsInf", "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"}
UNARY = ["Sign", "Relu", "Abs", "Neg", "Ceil", "Floor", "Round", "IsNaN", "Softplus", "Softsign", "Sigmoid", "Tanh"]
UNARY += ["Exp", "Elu", "Selu", "Celu", "HardSigmoid", "HardSwish", "Erf", "Sqrt", "Log", "Reciprocal", "Mish", "Gelu"]
NODES = [(op, ["x"], {}) for op in UNARY] + [
  ("LeakyRelu", ["x"], dict(alpha=0.1)),
  ("ThresholdedRelu", ["x"], dict(alpha=0.3)),
  ("Shrink", ["x"], dict(lambd=0.4, bias=0.1)),
  ("IsInf", ["x"], {}),
  ("IsInf", ["x"], dict(detect_negative=0)),
  ("IsInf", ["x"], dict(detect_positive=0)),
  ("Max", ["x", "y"], {}),
  ("Min", ["x", "y"], {}),
  ("Max", ["y", "x"], {}),
  ("Min", ["y", "x"], {}),
  ("Max", ["x", "y", "x"], {}),
  ("Equal", ["x", "y"], {}),
  ("Less", ["x", "y"], {}),
  ("LessOrEqual", ["x", "y"], {}),
  ("Greater", ["x", "y"], {}),
  ("GreaterOrEqual", ["x", "y"], {}),
  ("Mod", ["x", "y"], dict(fmod=1)),
  ("Div", ["x", "y"], {}),
  ("Pow", ["x", "y"], {}),
  ("Clip", ["x", "lo", "hi"], {}),
  ("Clip", ["x", "", "hi"], {}),
  ("PRelu", ["x", "slope"], {}),
]


def nan_model():
  n = len(X)
  nodes = [helper.make_node(op, ins, [f"o{i}"], **kw) for i, (op, ins, kw) in enumerate(NODES)]
  outs = [
    helper.make_tensor_value_info(f"o{i}", TensorProto.BOOL if op in BOOL_OUT else TensorProto.FLOAT, [n])
    for i, (op, _, _) in enumerate(NODES)
  ]
  consts = {"lo": -1.0, "hi": 2.0, "slope": 0.25}
  inits = [numpy_helper.from_array(np.array(v, np.float32), k) for k, v in consts.items()]
  inputs = [helper.make_tensor_value_info(k, TensorProto.FLOAT, [n]) for k in ("x", "y")]
  graph = helper.make_graph(nodes, "nan_ops", inputs, outs, inits)
  return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def assert_same_specials(what: str, got: np.ndarray, want: np.ndarray, other: np.ndarray, exact: bool):
  """got has NaN where want has, the same infinities and values, and each zero's sign where want and other agree."""
  assert (got.dtype, got.shape) == (want.dtype, want.shape), (
    f"{what}: {got.dtype}{got.shape}, want {want.dtype}{want.shape}"
  )
  if want.dtype == np.bool_:
    np.testing.assert_array_equal(got, want, err_msg=f"{what}: x={X}, y={Y}")
    return
  nan = np.isnan(want)
  np.testing.assert_array_equal(np.isnan(got), nan, err_msg=f"{what}: NaN positions (got {got}, want {want})")
  if exact:
    np.testing.assert_array_equal(got[~nan], want[~nan], err_msg=f"{what}: x={X[~nan]}")
  else:
    np.testing.assert_allclose(got[~nan], want[~nan], rtol=1e-5, atol=1e-6, err_msg=f"{what}: x={X[~nan]}")
  agreed = ~nan & (want == 0) & (np.signbit(want) == np.signbit(other))
  np.testing.assert_array_equal(np.signbit(got[agreed]), np.signbit(want[agreed]), err_msg=f"{what}: zero's sign")


@pytest.fixture(scope="module")
def references():
  model = nan_model()
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", RuntimeWarning)  # numpy's invalid-value warnings are what this feeds it
    want = ReferenceEvaluator(model).run(None, {"x": X, "y": Y})
  session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
  return model, want, session.run(None, {"x": X, "y": Y})


@pytest.mark.parametrize("target,emulate", TARGETS)
def test_nan_inf_and_signed_zero_through_elementwise_ops_match_onnx_reference(references, target, emulate, tmp_path):
  model, want, other = references
  art = aot.compile_model(model, out_dir=tmp_path / target, name="nan_ops", target=target, emulate=emulate)
  got = aot.load(art)(X, Y)
  for (op, ins, kw), g, w, o in zip(NODES, got, want, other):
    assert_same_specials(f"{target}: {op}({', '.join(ins)}){kw or ''}", g, w, o, op in EXACT)


def test_sign_of_nan_is_nan_in_float16_and_float64(tmp_path):
  # the Tensor API's sign, in the types ONNX's Sign takes besides float32; numpy's np.sign is the reference
  for dt in (np.float16, np.float64):
    x = np.where(np.abs(X) > 1e4, np.inf, X).astype(dt)  # 1e30: inf in float16 too
    for target in ("c", "llvm"):
      art = aot.compile_model(lambda x: x.sign(), [x], target=target, out_dir=tmp_path / f"{target}_{dt.__name__}")
      got = aot.load(art)(x)
      np.testing.assert_array_equal(got, np.sign(x), err_msg=f"{target} {dt.__name__}")


@pytest.mark.parametrize("target,emulate", TARGETS)
def test_tensor_float_floor_division_and_remainder_truncate_as_c(target, emulate, tmp_path):
  """The Tensor API's // and % on floats are C's (IR IDIV and MOD, docs/ARCHITECTURE.md): the quotient truncated
  toward zero (np.trunc of the true quotient) and fmod, NaN where either is NaN or the divisor is 0."""

  def fn(a, b):
    return a // b, a % b, a.maximum(b), a.minimum(b), a.maximum(-1.0).minimum(2.0), a.relu(), a.sign()

  art = aot.compile_model(fn, [X, Y], target=target, emulate=emulate, out_dir=tmp_path / target)
  got = aot.load(art)(X, Y)
  with np.errstate(all="ignore"):
    want = [np.trunc(X / Y), np.fmod(X, Y), np.maximum(X, Y), np.minimum(X, Y), np.clip(X, -1, 2), np.maximum(X, 0)]
    want.append(np.sign(X))
  names = ["//", "%", "maximum", "minimum", "clip", "relu", "sign"]
  for name, g, w in zip(names, got, want):
    # a tie of -0 and +0 in max/min may give either zero (onnxruntime's vectorised kernels do): -w never agrees
    other = w if name in ("//", "%", "sign") else -w
    assert_same_specials(f"{target}: {name}", g, w, other, exact=True)


@pytest.mark.parametrize("target", ["c", "llvm"])
def test_nan_through_max_min_reductions_and_arg_reductions_match_onnx_reference(target, tmp_path):
  """A NaN in a row is that row's max and min and its first NaN their arg (numpy's, onnx.reference's).
  onnxruntime is not the reference here: its ReduceMax and ArgMax skip a NaN or not by where it is ([1, nan, 3,
  -inf] has max 3 and argmax 2; [nan, -inf, inf, 1] has max nan)."""
  x = np.array([[1, NAN, 3, -np.inf], [np.inf, 2, NAN, NAN], [-0.0, 0.0, 5, 4], [NAN, -np.inf, np.inf, 1]], np.float32)
  specs = [("ReduceMax", {}), ("ReduceMin", {}), ("ArgMax", {"axis": 1}), ("ArgMin", {"axis": 1}), ("Hardmax", {})]
  nodes = [
    helper.make_node(op, ["x", "axes"] if op.startswith("Reduce") else ["x"], [f"o{i}"], **kw)
    for i, (op, kw) in enumerate(specs)
  ]
  outs = [
    helper.make_tensor_value_info(f"o{i}", TensorProto.INT64 if op.startswith("Arg") else TensorProto.FLOAT, None)
    for i, (op, _) in enumerate(specs)
  ]
  axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
  graph = helper.make_graph(nodes, "nan_reduce", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])], outs)
  graph.initializer.append(axes)
  model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", RuntimeWarning)
    want = ReferenceEvaluator(model).run(None, {"x": x})
  got = aot.load(aot.compile_model(model, out_dir=tmp_path / target, name="nan_reduce", target=target))(x)
  for (op, _), g, w in zip(specs, got, want):
    np.testing.assert_array_equal(g, w, err_msg=f"{target}: {op} of {x}")


def test_metal_source_of_the_same_graph_type_checks(references, tmp_path):
  # Metal cannot run here: its kernel source, the same graph in its own spelling, is type-checked as C++ against
  # runtime_c/aot_metal_shim.h (build.check_metal_syntax, -Werror), as compile_model does for target metal
  art = aot.compile_model(references[0], out_dir=tmp_path / "metal", name="nan_ops", target="metal")
  assert (art.dir / "src" / "kernels.metal").exists()
