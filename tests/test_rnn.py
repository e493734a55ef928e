"""ONNX RNN, GRU and LSTM against onnxruntime (directions, initial states, sequence lengths, layouts), and how they
compile: the input product for every step as one kernel, a fixed number of kernels per step, and each weight in the
blob once (not once per unrolled step)."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper as oh

import aot
from aot.testing import assert_kernel_count

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def _model(op, T, B, I, H, direction="forward", layout=0, seq=False, init=False, seed=0, **attrs):
  """An op node with seeded W, R, B (and P for LSTM's peepholes when attrs asks for them) as initializers; X,
  sequence_lens, initial_h and initial_c as inputs. -> (model, feed)."""
  rng = np.random.default_rng(seed)
  nd, g = 2 if direction == "bidirectional" else 1, GATES[op]
  peep = attrs.pop("peepholes", False)
  inits = {
    "W": rng.standard_normal((nd, g * H, I)) * 0.3,
    "R": rng.standard_normal((nd, g * H, H)) * 0.3,
    "B": rng.standard_normal((nd, 2 * g * H)) * 0.3,
  }
  if peep:
    inits["P"] = rng.standard_normal((nd, 3 * H)) * 0.3
  xs = (T, B, I) if layout == 0 else (B, T, I)
  feed = {"X": rng.standard_normal(xs).astype(np.float32)}
  hs = (nd, B, H) if layout == 0 else (B, nd, H)
  # sequence_lens is a constant: the unrolled steps are fixed when it is compiled
  seq_lens = rng.integers(1, T + 1, B).astype(np.int32) if seq else None
  if init:
    feed["initial_h"] = rng.standard_normal(hs).astype(np.float32)
    if op == "LSTM":
      feed["initial_c"] = rng.standard_normal(hs).astype(np.float32)
  names = ["X", "W", "R", "B", "sequence_lens", "initial_h"] + (["initial_c", "P"] if op == "LSTM" else [])
  ins = [n if n in feed or n in inits or (n == "sequence_lens" and seq) else "" for n in names]
  outs = ["Y", "Y_h"] + (["Y_c"] if op == "LSTM" else [])
  node = oh.make_node(op, ins, outs, hidden_size=H, direction=direction, layout=layout, **attrs)
  graph = oh.make_graph(
    [node],
    op.lower(),
    [oh.make_tensor_value_info(k, TP.FLOAT, v.shape) for k, v in feed.items()],
    [oh.make_tensor_value_info(o, TP.FLOAT, None) for o in outs],
    [oh.make_tensor(k, TP.FLOAT, v.shape, v.astype(np.float32).ravel()) for k, v in inits.items()]
    + ([oh.make_tensor("sequence_lens", TP.INT32, (B,), seq_lens)] if seq else []),
  )
  return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 14)]), feed


def _reference(model, feed):
  """onnxruntime's outputs; for layout 1 (batch first), which onnxruntime does not run, those of the layout 0 model
  on the transposed inputs, transposed back."""
  node = model.graph.node[0]
  if not any(a.name == "layout" and a.i == 1 for a in node.attribute):
    return ort.InferenceSession(model.SerializeToString()).run(None, feed)
  swap = lambda a: np.swapaxes(a, 0, 1) if a.ndim == 3 else a
  feed0 = {k: swap(v) for k, v in feed.items()}
  m0 = onnx.ModelProto()
  m0.CopyFrom(model)
  for a in m0.graph.node[0].attribute:
    if a.name == "layout":
      a.i = 0
  for i in m0.graph.input:
    i.type.tensor_type.shape.CopyFrom(oh.make_tensor_type_proto(TP.FLOAT, feed0[i.name].shape).tensor_type.shape)
  y, *states = ort.InferenceSession(m0.SerializeToString()).run(None, feed0)
  return [y.transpose(2, 0, 1, 3), *[swap(s) for s in states]]


def _check(model, feed, tmp_path, atol=2e-5, target="c"):
  ref = _reference(model, feed)
  art = aot.compile_model(model, out_dir=tmp_path, target=target)
  got = aot.load(art)(**feed)
  got = list(got.values()) if isinstance(got, dict) else list(got) if isinstance(got, (list, tuple)) else [got]
  assert len(got) == len(ref)
  for g, r in zip(got, ref):
    np.testing.assert_allclose(np.asarray(g), r, rtol=1e-5, atol=atol)
  return art


CASES = [
  # op, direction, layout, sequence_lens, initial states, (T, B, I, H)
  ("LSTM", "forward", 0, False, False, (5, 2, 7, 6)),
  ("LSTM", "reverse", 0, False, True, (4, 3, 5, 8)),
  ("LSTM", "bidirectional", 1, False, True, (6, 2, 9, 5)),
  ("LSTM", "bidirectional", 0, True, True, (5, 3, 4, 4)),
  # big enough that the recurrent product runs on the microkernel, the gates in its epilogue
  ("LSTM", "bidirectional", 0, False, True, (4, 1, 32, 128)),
  ("GRU", "forward", 0, False, True, (5, 2, 7, 6)),
  ("GRU", "bidirectional", 1, True, False, (4, 3, 5, 8)),
  ("GRU", "reverse", 0, False, False, (3, 1, 40, 64)),
  ("GRU", "bidirectional", 0, False, True, (3, 1, 32, 128)),
  ("RNN", "forward", 0, False, True, (3, 2, 32, 256)),
  ("RNN", "bidirectional", 0, False, True, (5, 2, 7, 6)),
  ("RNN", "reverse", 1, True, False, (4, 3, 5, 8)),
  # more steps than a stored chunk of the outputs (onnx_ops_rnn.OUT_CHUNK)
  ("LSTM", "bidirectional", 0, True, False, (11, 2, 4, 8)),
  ("GRU", "bidirectional", 1, False, True, (17, 1, 4, 8)),
]


@pytest.mark.parametrize("op,direction,layout,seq,init,size", CASES)
def test_recurrent_matches_onnxruntime(op, direction, layout, seq, init, size, tmp_path):
  _check(*_model(op, *size, direction=direction, layout=layout, seq=seq, init=init), tmp_path)


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_recurrent_on_the_llvm_target(op, tmp_path):
  # the steps' shared functions read the input product through advanced pointers (calls.py rebase_reads)
  _check(*_model(op, 4, 2, 16, 128, direction="bidirectional", init=True), tmp_path, target="llvm")


@pytest.mark.parametrize(
  "op,attrs",
  [
    ("GRU", {"linear_before_reset": 1}),
    ("LSTM", {"peepholes": True}),
    ("LSTM", {"input_forget": 1, "clip": 0.5}),
    ("LSTM", {"activations": ["HardSigmoid", "Tanh", "Relu"] * 2}),
  ],
)
def test_recurrent_variants_match_onnxruntime(op, attrs, tmp_path):
  direction = "bidirectional" if "activations" in attrs else "forward"
  _check(*_model(op, 4, 2, 5, 6, direction=direction, init=True, **attrs), tmp_path)


# Kernels per unrolled step, the directions batched (step s runs the forward direction's time s and the backward's
# T-1-s: one batched product), each for a reason. LSTM 2: the recurrent product h R^T plus the step's projected input,
# its four gates activated in the epilogue; h and c side by side (one tensor: the next step reads both, Y reads h).
# GRU 2: the product for z and r, its epilogue writing z beside r * h (the operand of the second product); that
# product with the new h in its epilogue. GRU with linear_before_reset 2: h R^T for all three gates, read in three
# slices; the new h, its gates computed there (the first step 1: h = 0, no product). RNN 1: the product with its
# activation in the epilogue. Besides the steps: X beside X reversed in time (the backward direction's steps in the
# order they run), the input product for every step and both directions (1), Y (1), and Y_h, Y_c (1 each: the last
# states).
PER_STEP = [
  ("LSTM", {}, lambda T: 2 * T + 1 + 1 + 1 + 2),
  ("GRU", {}, lambda T: 2 * T + 1 + 1 + 1 + 1),
  ("GRU", {"linear_before_reset": 1}, lambda T: 2 * T - 1 + 1 + 1 + 1 + 1),
  ("RNN", {}, lambda T: T + 1 + 1 + 1 + 1),
]


@pytest.mark.parametrize("op,attrs,kernels", PER_STEP)
def test_kernels_per_step(op, attrs, kernels):
  for T in (6, 7):
    model, _ = _model(op, T, 1, 64, 64, direction="bidirectional", **attrs)
    assert_kernel_count(model, kernels(T))


def test_weights_are_stored_once_not_per_step(tmp_path):
  # 12 steps each direction, each product (on the microkernel) packing R: one packed copy of it, not 12
  model, feed = _model("LSTM", 12, 1, 64, 128, direction="bidirectional")
  art = _check(model, feed, tmp_path)
  model_bytes = sum(np.prod(i.dims) * 4 for i in model.graph.initializer)
  assert art.weights_bytes <= 1.2 * model_bytes, (art.weights_bytes, model_bytes)


def test_the_input_product_is_one_kernel_for_all_steps_and_directions():
  # X (T, B, I) by both directions' W at once: one batched (2, T*B, 4H) product, in step order (T, 2, B, 4H), not
  # one per step and direction
  model, _ = _model("LSTM", 8, 2, 16, 32, direction="bidirectional")
  from aot.compiler import resolve
  from aot.scheduler.schedule import schedule

  traced = resolve(model, None, None)
  kernels = schedule(traced.outputs, traced.inputs).kernels
  assert [k.shape for k in kernels if k.shape[-1] == 4 * 32 and k.shape[0] == 8] == [(8, 2, 2, 4 * 32)]


def test_the_steps_share_their_functions(tmp_path):
  # each step's kernels differ only by which row of the input product they read: one generated function per kind
  # of step, however many steps (the first step, h = 0, has its own), so the C to compile does not grow with T
  # (both have a last chunk of outputs of one step: onnx_ops_rnn.OUT_CHUNK)
  functions = []
  for T in (17, 25):
    model, feed = _model("LSTM", T, 1, 16, 128, direction="bidirectional")
    art = _check(model, feed, tmp_path / str(T))
    functions.append(len({k.function for k in art.kernels}))
  assert functions[0] == functions[1]


def test_the_quantized_steps_share_their_functions(tmp_path):
  # onnxruntime's dynamic quantization makes the LSTM a DynamicQuantizeLSTM: each step's int8 product has an epilogue
  # (the gates) reading its row of the input product; rendered with its own offset it was one function a step (a
  # CRNN's 80 steps: 136 functions, its C build 3.9 s; shared: 58, 1.3 s)
  from aot.models.quantized import quantized

  functions = []
  for T in (17, 25):
    model, feed = _model("LSTM", T, 1, 16, 64, direction="bidirectional")
    model = quantized(model, "dynamic")
    assert any(n.op_type == "DynamicQuantizeLSTM" for n in model.graph.node)
    want = ort.InferenceSession(model.SerializeToString()).run(None, feed)
    art = aot.compile_model(model, out_dir=tmp_path / str(T))
    got = aot.load(art)(**feed)
    for g, w in zip(got.values() if isinstance(got, dict) else got, want):
      np.testing.assert_allclose(np.asarray(g), w, rtol=1e-5, atol=1e-5)
    functions.append(len({k.function for k in art.kernels}))
  assert functions[0] == functions[1]
