"""The ONNX forms of the bundled models (models/onnx_forms.py): onnxruntime shows each is the same model as its numpy
reference, and the ONNX frontend compiles it to the same kernels and the same outputs as the Tensor frontend."""

import functools

import numpy as np
import onnx
import pytest

import aot
from aot.compiler import resolve
from aot.core.ir import Ops
from aot.models import NAMES, get
from aot.models.onnx_forms import FUNCTION_DOMAIN, OPSET, onnx_model
from aot.testing import assert_kernel_count, kernel_count

ort = pytest.importorskip("onnxruntime")

SEEDS = (0, 1)


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
  return float(np.max(np.abs(got.astype(np.float64) - want)) / np.max(np.abs(want)))


class Forms:
  """Per model, built once per module: the ONNX proto, its onnxruntime session and the ONNX frontend's artifact
  (or the exception compiling it raised, re-raised by each test that needs it)."""

  def __init__(self, base):
    self.base = base

  @functools.lru_cache(maxsize=None)
  def proto(self, name: str) -> onnx.ModelProto:
    return onnx_model(name)

  @functools.lru_cache(maxsize=None)
  def session(self, name: str):
    return ort.InferenceSession(self.proto(name).SerializeToString(), providers=["CPUExecutionProvider"])

  def run_ort(self, name: str, xs: list[np.ndarray]) -> np.ndarray:
    model = get(name)
    return self.session(name).run(["output"], {n: x for (n, _, _), x in zip(model.inputs, xs)})[0]

  @functools.lru_cache(maxsize=None)
  def _compiled(self, name: str):
    try:
      return aot.compile_model(self.proto(name), out_dir=self.base / name, name=f"{name}_onnx"), None
    except Exception as e:
      return None, e

  def artifact(self, name: str):
    art, err = self._compiled(name)
    if err is not None:
      raise err
    return art


@pytest.fixture(scope="module")
def forms(tmp_path_factory):
  return Forms(tmp_path_factory.mktemp("onnx_forms"))


@pytest.mark.parametrize("name", NAMES)
def test_onnx_form_is_well_formed(forms, name):
  m, model = forms.proto(name), get(name)
  onnx.checker.check_model(m, full_check=True)
  assert {o.domain: o.version for o in m.opset_import}.get("", 0) >= OPSET >= 20
  inits = {i.name for i in m.graph.initializer}
  graph_inputs = [
    (i.name, tuple(d.dim_value for d in i.type.tensor_type.shape.dim)) for i in m.graph.input if i.name not in inits
  ]
  assert graph_inputs == [(n, tuple(shape)) for n, shape, _ in model.inputs]
  assert [o.name for o in m.graph.output] == ["output"]


def test_transformer_layer_is_a_model_local_function(forms):
  m = forms.proto("transformer")
  assert [(f.domain, f.name) for f in m.functions] == [(FUNCTION_DOMAIN, "layer")]
  calls = [n for n in m.graph.node if (n.domain, n.op_type) == (FUNCTION_DOMAIN, "layer")]
  assert len(calls) == 2 and len(m.graph.node) == 2
  # the same body, called with each layer's own weights (graph initializers passed as node inputs)
  inits = {i.name for i in m.graph.initializer}
  w0, w1 = (set(c.input[1:]) for c in calls)
  assert w0 and w1 and not (w0 & w1) and w0 | w1 <= inits
  assert calls[1].input[0] == calls[0].output[0]


def test_transformer_onnx_layer_is_traced_once(forms):
  # as the Tensor form's @aot.function layer (tests/test_models.py): one FUNCTION body, two CALLs
  traced = resolve(forms.proto("transformer"))
  nodes = {u for o in traced.outputs for u in o.toposort()}
  assert len([u for u in nodes if u.op is Ops.FUNCTION]) == 1 and len([u for u in nodes if u.op is Ops.CALL]) == 2


@pytest.mark.parametrize("name", NAMES)
def test_onnxruntime_matches_numpy_reference(forms, name):
  model = get(name)
  for seed in SEEDS:
    xs = model.example_inputs(seed)
    got, want = forms.run_ort(name, xs), model.reference(*xs)
    assert got.shape == want.shape and got.dtype == np.float32
    assert (rel := rel_err(got, want)) <= 1e-4, f"{name} seed {seed}: onnxruntime vs numpy max relative error {rel:.2e}"


@pytest.mark.parametrize("name", NAMES)
def test_onnx_frontend_matches_onnxruntime_and_tensor_frontend(forms, compiled_model, name):
  tensor_art, model = compiled_model(name)
  run_onnx, run_tensor = aot.load(forms.artifact(name)), aot.load(tensor_art)
  for seed in SEEDS:
    xs = model.example_inputs(seed)
    got, want_ort, want_tensor = run_onnx(*xs), forms.run_ort(name, xs), run_tensor(*xs)
    assert got.shape == want_ort.shape == want_tensor.shape and got.dtype == np.float32
    assert (rel := rel_err(got, want_ort)) <= 1e-4, f"{name} seed {seed}: aot(onnx) vs onnxruntime {rel:.2e}"
    assert (rel := rel_err(got, want_tensor)) <= 1e-5, f"{name} seed {seed}: aot(onnx) vs aot(tensor) {rel:.2e}"


@pytest.mark.parametrize("name", NAMES)
def test_both_frontends_compile_to_the_pinned_kernel_count(forms, compiled_model, name):
  tensor_art, model = compiled_model(name)
  onnx_art = forms.artifact(name)
  counts = {"tensor": kernel_count(tensor_art), "onnx": kernel_count(onnx_art)}
  assert counts["onnx"] == counts["tensor"], f"{name}: kernel counts differ between the frontends: {counts}"
  assert_kernel_count(onnx_art, model.expected_kernels)
  assert_kernel_count(tensor_art, model.expected_kernels)
