"""The runtimes the bench times ours against, in the same interleaved loop on the same inputs: onnxruntime (a test
dependency) and OpenVINO (the bench extra's: pip install 'aot-compiler[bench]'; without it the bench runs as before,
without its column)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

# the runtimes whose pool threads spin on after a run (onnxruntime's, ~30 ms of a core after each: its default, which
# its users run with and which its speed on several threads owes much to; measured on MobileNetV2, 2 threads, 2.2 ms
# spinning, 3.0 not): the bench pauses after their samples rather than turning it off
SPINNING = ("ort",)


def ort_session(model, threads: int, profile_prefix: str | None = None):
  """An onnxruntime CPU session for the model on this many threads, as a user's default one runs them; with
  profile_prefix, one that profiles its nodes into a file named so (InferenceSession.end_profiling)."""
  import onnxruntime as ort

  ort.set_default_logger_severity(3)
  so = ort.SessionOptions()
  so.intra_op_num_threads = so.inter_op_num_threads = threads
  if profile_prefix is not None:
    so.enable_profiling, so.profile_file_prefix = True, profile_prefix
  data = model.SerializeToString() if not isinstance(model, (str, Path)) else str(model)
  return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])


def openvino_version() -> str | None:
  """The installed OpenVINO's version, or None: it is the bench extra's (pip install 'aot-compiler[bench]'), and the
  bench runs without it, without its column."""
  try:
    import openvino
  except ImportError:
    return None
  return openvino.__version__


@cache
def _ov_core():
  import openvino

  return openvino.Core()


def _ov_session(model, threads: int):
  """An OpenVINO CPU infer request for the model, set as onnxruntime's session and our instance are: float32 (no
  bf16 where the CPU has it), this many threads, one stream, the latency hint."""
  data = str(model) if isinstance(model, (str, Path)) else model.SerializeToString()
  config = {
    "INFERENCE_PRECISION_HINT": "f32",
    "INFERENCE_NUM_THREADS": threads,
    "NUM_STREAMS": 1,
    "PERFORMANCE_HINT": "LATENCY",
  }
  core = _ov_core()
  return core.compile_model(core.read_model(data), "CPU", config).create_infer_request()


def first_output(outputs):
  """The first output of a run: ours (an array or a tuple), onnxruntime's (a list) or OpenVINO's (its OVDict)."""
  if hasattr(outputs, "to_tuple"):
    outputs = outputs.to_tuple()
  return outputs[0] if isinstance(outputs, (tuple, list)) else outputs


def anchor_runners(label: str, onnx_model, xs, thread_counts: list[int], openvino: bool) -> dict:
  """A run of each runtime we compare with, per thread count, returning its first output: onnxruntime's ("ort"),
  and OpenVINO's ("ov") where asked for, installed and able to take the model (else a line says why not)."""
  sessions = {n: ort_session(onnx_model, n) for n in thread_counts}
  feeds = {n: {i.name: x for i, x in zip(s.get_inputs(), xs)} for n, s in sessions.items()}
  runners = {("ort", n): (lambda s=s, feed=feeds[n]: first_output(s.run(None, feed))) for n, s in sessions.items()}
  if openvino and openvino_version() is not None:
    try:
      requests = {n: _ov_session(onnx_model, n) for n in thread_counts}
    except Exception as e:  # noqa: BLE001 (any failure of the optional anchor leaves the row without its column)
      print(f"{label}: no OpenVINO column: {str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__}")
      return runners
    for n, r in requests.items():
      runners["ov", n] = lambda r=r, feed=feeds[n]: first_output(r.infer(feed, share_inputs=True))
  return runners
