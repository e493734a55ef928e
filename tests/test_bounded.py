"""Compile-time work and memory are bounded by what is produced: a text-detection-like model (convolutions, a
ConvTranspose with stride 2, a nearest Resize, 640x640) compiles in seconds with a compile-time peak and a weights blob
that are small multiples of its weights and largest activation, and a constant operand that a packed copy would repeat
many times over (a weight gated by the output position) is not packed."""

import json
import resource
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from test_onnx_light import assert_matches_onnxruntime, light_model

import aot
from aot.artifact import Artifact
from aot.frontends.tensor import Tensor

# the compile's traced peak (numpy arrays included) may be at most this many times the model's weights plus its
# largest activation: the packed weights, their tile padding and an evaluation's temporaries are a few copies
PEAK_PER_SIZE = 4
# the weights blob may be at most this many times the model's weights (packed copies, tile padding)
BLOB_PER_WEIGHTS = 4
# a compile that takes longer than this is doing work out of proportion to a model this small (it takes 1-4 s here)
COMPILE_SECONDS = 60
# the compiling subprocess's address space: on a compiler that packs a huge constant it fails with a MemoryError
# here instead of taking the machine's memory (the unbounded compile asked for a 142 GiB index grid)
ADDRESS_SPACE = 6 << 30


def detection_head(size: int = 640) -> onnx.ModelProto:
  """Conv(3->24, s2) -> ReLU -> Conv(24->96, s2) -> ReLU -> ConvTranspose(96->24, 3x3, s2) -> Resize(nearest, x2):
  the shape of a text detector's upsampling path, with seeded random weights."""
  rng = np.random.default_rng(0)
  weight = lambda *shape: (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)
  inits = {
    "w1": weight(24, 3, 3, 3),
    "b1": weight(24, 1),
    "w2": weight(96, 24, 3, 3),
    "b2": weight(96, 1),
    "wt": weight(96, 24, 3, 3),
    "bt": weight(24, 1),
    "scales": np.array([1, 1, 2, 2], np.float32),
  }
  inits = {k: v.reshape(-1) if k.startswith("b") else v for k, v in inits.items()}
  conv = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
  nodes = [
    helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], **conv),
    helper.make_node("Relu", ["c1"], ["r1"]),
    helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], **conv),
    helper.make_node("Relu", ["c2"], ["r2"]),
    helper.make_node("ConvTranspose", ["r2", "wt", "bt"], ["t"], output_padding=[1, 1], **conv),
    helper.make_node("Resize", ["t", "", "scales"], ["y"], mode="nearest"),
  ]
  x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])
  y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 24, size, size])
  tensors = [numpy_helper.from_array(v, k) for k, v in inits.items()]
  graph = helper.make_graph(nodes, "detection_head", [x], [y], tensors)
  return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def weight_and_activation_bytes(model: onnx.ModelProto) -> tuple[int, int]:
  """(bytes of the initializers, bytes of the largest tensor shape inference gives)."""
  weights = sum(numpy_helper.to_array(i).nbytes for i in model.graph.initializer)
  g = onnx.shape_inference.infer_shapes(model).graph
  tensors = [*g.input, *g.value_info, *g.output]
  sizes = [4 * int(np.prod([d.dim_value for d in v.type.tensor_type.shape.dim])) for v in tensors]
  return weights, max(sizes)


def _compile_traced(model_path: str, out_dir: str, measured: str) -> None:
  """(In the subprocess) compile the model under tracemalloc; write the traced peak and the time to `measured`."""
  tracemalloc.start()
  t0 = time.perf_counter()
  aot.compile_model(model_path, out_dir=out_dir)
  seconds = time.perf_counter() - t0
  peak = tracemalloc.get_traced_memory()[1]
  Path(measured).write_text(json.dumps({"peak": peak, "seconds": seconds}))


def _limit_address_space():
  resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


@pytest.fixture(scope="module")
def head(tmp_path_factory):
  """(model, artifact, measured) for detection_head(), compiled once in a memory-limited subprocess."""
  d = tmp_path_factory.mktemp("bounded")
  model = detection_head()
  onnx.save(model, d / "head.onnx")
  out = d / "head"
  args = [sys.executable, __file__, str(d / "head.onnx"), str(out), str(d / "measured.json")]
  run = subprocess.run(args, capture_output=True, text=True, preexec_fn=_limit_address_space, timeout=600)
  assert run.returncode == 0, f"compile failed:\n{run.stderr[-3000:]}"
  return model, Artifact(out), json.loads((d / "measured.json").read_text())


def test_detection_head_compiles_quickly_and_matches_onnxruntime(head):
  model, art, measured = head
  assert measured["seconds"] <= COMPILE_SECONDS, f"compile took {measured['seconds']:.1f} s"
  # each convolution is one product on the microkernel: the ConvTranspose does not recompute the convolution before
  # it once per tap in its own loops (which also makes this model take minutes to run)
  gemms = (art.dir / "src" / "model.c").read_text().count("aot_gemm g =")
  assert gemms == 3, f"{gemms} microkernel calls, expected one per convolution (3)"
  assert_matches_onnxruntime(art, model, "detection_head")


def test_compile_peak_is_a_small_multiple_of_weights_and_activations(head):
  model, art, measured = head
  weights, activation = weight_and_activation_bytes(model)
  mib = lambda n: f"{n / 2**20:.2f} MiB"
  assert measured["peak"] <= PEAK_PER_SIZE * (weights + activation), (
    f"traced peak {mib(measured['peak'])} for {mib(weights)} of weights, largest activation {mib(activation)}"
  )


def test_weights_blob_is_a_small_multiple_of_the_weights(head):
  model, art, _ = head
  weights, _ = weight_and_activation_bytes(model)
  assert art.weights_bytes <= BLOB_PER_WEIGHTS * weights, f"blob {art.weights_bytes} B, weights {weights} B"


def test_constant_gated_per_batch_position_is_not_packed(tmp_path):
  # out[p, n] = sum_k x[p, k] * W[n, k] * mask[p]: the constant operand W * mask varies with p, which x shares, so a
  # packed copy would hold W once per p (2048 x 64 x 64 floats, 32 MiB, for 24 KiB of constants)
  rng = np.random.default_rng(0)
  P, N, K = 2048, 64, 64
  w, mask = rng.standard_normal((N, K), dtype=np.float32), (rng.random(P) < 0.5).astype(np.float32)
  x = rng.standard_normal((P, K), dtype=np.float32)
  fn = lambda x: (x.reshape(P, 1, K) * (Tensor(w).reshape(1, N, K) * Tensor(mask).reshape(P, 1, 1))).sum(-1)
  art = aot.compile_model(fn, [x], out_dir=tmp_path / "gated")
  model = aot.load(art)
  try:
    out = model(x)
  finally:
    model.close()
  want = (x.astype(np.float64) @ w.T.astype(np.float64)) * mask[:, None]
  np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
  assert art.weights_bytes <= BLOB_PER_WEIGHTS * (w.nbytes + mask.nbytes), f"{art.weights_bytes} B of weights blob"


def test_light_squeezenet_weights_blob_is_a_small_multiple_of_the_weights(tmp_path):
  # its fire modules concatenate two convolutions in one kernel, each branch's weights gated by the output channel: a
  # packed copy per channel made a 39 MB blob of 4.7 MB of weights
  model = light_model("squeezenet")
  art = aot.compile_model(model, out_dir=tmp_path / "squeezenet")
  weights, _ = weight_and_activation_bytes(model)
  assert art.weights_bytes <= BLOB_PER_WEIGHTS * weights, f"blob {art.weights_bytes} B, weights {weights} B"


if __name__ == "__main__":
  _compile_traced(*sys.argv[1:4])
