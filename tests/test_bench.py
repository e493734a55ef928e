"""The bench's optional anchors and model sets: OpenVINO's column where openvino is installed (and a line saying it is
absent where not), and the real-model set's torch builders. openvino and torch are the bench extra's, not the tests':
only the tests of those extras skip without them."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper


def _small_model():
  """relu(x @ w + b) on [4, 16]: compiles in a moment, so that what is tested is the bench around it."""
  rng = np.random.default_rng(0)
  inits = [
    numpy_helper.from_array(rng.standard_normal((16, 8)).astype(np.float32), "w"),
    numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b"),
  ]
  nodes = [
    helper.make_node("MatMul", ["x", "w"], ["xw"]),
    helper.make_node("Add", ["xw", "b"], ["z"]),
    helper.make_node("Relu", ["z"], ["y"]),
  ]
  graph = helper.make_graph(
    nodes,
    "small",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
    inits,
  )
  return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_without_openvino_the_bench_says_its_column_is_absent(tmp_path, monkeypatch, capsys):
  from aot.tools.bench import main

  monkeypatch.setitem(sys.modules, "openvino", None)  # import openvino raises ImportError
  path = tmp_path / "small.onnx"
  path.write_bytes(_small_model().SerializeToString())
  argv = ["--models", "", str(path), "--targets", "c", "--repeats", "3", "--budget", "0.01"]
  assert main([*argv, "--json", str(tmp_path / "r")]) == 0
  out = capsys.readouterr().out
  assert "OpenVINO is not installed: no OpenVINO column" in out and "Traceback" not in out
  (row,) = json.loads((tmp_path / "r").read_text())["rows"]
  assert row["c_rel_err"] < 1e-5 and row["c_vs_ort"] > 0
  assert not [k for k in row if "ov" in k.split("_")]


def test_openvino_is_timed_in_the_same_round_robin_and_compared(monkeypatch):
  openvino = pytest.importorskip("openvino")
  import aot.tools.bench
  from aot.tools.anchors import _ov_session

  model = _small_model()
  calls, timed = [], aot.tools.bench._time
  monkeypatch.setattr(aot.tools.bench, "_time", lambda fns, *a: calls.append(sorted(fns, key=str)) or timed(fns, *a))
  x = np.random.default_rng(1).standard_normal((4, 16)).astype(np.float32)
  rows = aot.tools.bench.bench_model("small", model, model, lambda art: [x], [1, 2], ["c"], 3, 0.01, openvino=True)
  assert calls == [[("c", 1), ("c", 2), ("ort", 1), ("ort", 2), ("ov", 1), ("ov", 2)]]
  for r in rows:
    assert "ov_ms" in r and r["c_vs_ov"] > 0 and r["ov_x_1t"] > 0 and r["ov_rel_err"] < 1e-5
  # OpenVINO's run as ours and onnxruntime's: float32, this many threads, one stream
  compiled = _ov_session(model, 2).get_compiled_model()
  assert compiled.get_property("INFERENCE_NUM_THREADS") == 2 and compiled.get_property("NUM_STREAMS") == 1
  assert compiled.get_property("INFERENCE_PRECISION_HINT") == openvino.Type.f32
  w, b = (numpy_helper.to_array(t) for t in model.graph.initializer)
  want = np.maximum(x @ w + b, 0)
  np.testing.assert_allclose(_ov_session(model, 1).infer({"x": x}).to_tuple()[0], want, rtol=1e-5, atol=1e-5)


def test_a_runtime_that_spins_after_its_run_gets_a_pause_and_every_sample_a_settling_call(monkeypatch):
  # onnxruntime's threads spin ~30 ms after a run (its default, kept): the next sample would share the cores with them
  import aot.tools.bench as bench

  log, now = [], [0.0]
  monkeypatch.setattr(bench.time, "sleep", lambda s: log.append(("pause", s)))
  monkeypatch.setattr(bench.time, "perf_counter", lambda: now[0])

  def runner(name):
    def run():
      now[0] += 0.01  # 10 ms a call: one call a sample
      log.append(name)

    return run

  fns = {("c", 2): runner("c"), ("ort", 2): runner("ort")}
  bench._time(fns, 2, 100.0, frozenset({("ort", 2)}))
  rounds = log[4:]  # after two calls of each to warm up and measure one
  assert rounds == ["c", "c", "ort", "ort", ("pause", bench.SPIN_TAIL_S)] * 2
  log.clear()
  bench._time(fns, 2, 100.0)
  assert log[4:] == ["c", "ort"] * 2  # none spins: neither pauses nor settling calls


def test_tables_give_ours_over_openvino_beside_onnxruntime_where_the_rows_have_it():
  from aot.tools.bench import performance_tables, slower_note, summary_table

  with_ov = {"model": "a", "gflop": 1.0, "threads": 1, "c_ms": 2.0, "ort_ms": 4.0, "ov_ms": 1.0, "c_vs_ort": 0.5}
  with_ov |= {"c_vs_ov": 2.0, "ov_rel_err": 1e-7}
  without = {k: v for k, v in with_ov.items() if "ov" not in k.split("_")}
  summary = summary_table([with_ov], ["c"]).splitlines()
  assert summary[0] == "| model | c, 1 thread | c/OpenVINO, 1 thread |" and summary[2] == "| a | 0.5 | 2.0 |"
  assert summary_table([without], ["c"]).splitlines()[0] == "| model | c, 1 thread |"
  assert slower_note([with_ov], ["c"]).splitlines() == [
    "Nowhere slower than onnxruntime (by more than 5%).",
    "Slower than OpenVINO: a (1t: c 2.0x).",
  ]
  assert slower_note([without], ["c"]) == "Nowhere slower than onnxruntime (by more than 5%)."
  run = {"command": "bench", "machine": "m", "targets": ["c"], "rows": [with_ov]}
  header = performance_tables(run).split("### Float models\n\n")[1].splitlines()[0]
  assert header == "| model | gflop | threads | c_ms | ort_ms | ov_ms | c_vs_ort | c_vs_ov | ov_rel_err |"
  assert "ov_ms" not in performance_tables({**run, "rows": [without]})


def test_an_unknown_real_model_is_named_before_anything_compiles(capsys):
  from aot.tools.bench import main

  with pytest.raises(SystemExit):
    main(["--models", "", "real:yolov9"])
  assert "unknown model 'real:yolov9': the real models are yolov8n, dbnet" in capsys.readouterr().err


def test_a_real_model_without_torch_is_one_line(tmp_path, monkeypatch):
  from aot.tools.bench import main

  monkeypatch.setitem(sys.modules, "torch", None)
  with pytest.raises(SystemExit, match="real model 'crnn' is exported from torch, which is not installed"):
    main(["--models", "", "real:crnn", "--models-dir", str(tmp_path)])
  assert not list(tmp_path.iterdir())


# the architectures written here (mobilenetv2 and v3 are torchvision's own builders), made small where their builders
# allow, so that the export is quick: the graph (the ops, their attributes, static shapes) is the bench's
@pytest.mark.parametrize(
  "name, sizes",
  [("yolov8n", {"size": 64}), ("dbnet", {"size": 64}), ("crnn", {}), ("bert6", {"layers": 1, "vocab": 1000})],
)
def test_real_model_builders_export_models_the_onnx_checker_takes(name, sizes, tmp_path):
  pytest.importorskip("torch")
  import onnx

  from aot.tools.real_models import OPSET, export, real_model_path

  path = tmp_path / f"{name}.onnx"
  export(name, path, **sizes)
  onnx.checker.check_model(str(path), full_check=True)
  model = onnx.load(path)
  assert model.opset_import[0].version == OPSET
  # static shapes: every input dimension a number
  assert all(d.HasField("dim_value") for i in model.graph.input for d in i.type.tensor_type.shape.dim)
  if not sizes:
    # the bench's own file, exported once into the folder and taken from it after
    cached = real_model_path(name, tmp_path / "cache")
    assert [p.name for p in cached.parent.iterdir()] == [path.name]
    mtime = cached.stat().st_mtime_ns
    assert real_model_path(name, tmp_path / "cache") == cached and cached.stat().st_mtime_ns == mtime


def test_the_recorded_command_reruns_as_given():
  import shlex

  from aot.tools.bench import _command, _parser

  ap = _parser()
  argv = ["--models", "", "--repeats", "7", "--real", "--no-openvino", "real:crnn", "x.onnx"]
  command = _command(ap.parse_args(argv), ap)
  assert command == "python -m aot.tools.bench --models '' --repeats 7 --threads 1 --real --no-openvino x.onnx"
  assert ap.parse_args(shlex.split(command)[3:]) == ap.parse_args([*argv[:-2], "x.onnx"])


def test_a_model_openvino_cannot_take_is_a_line_and_a_row_without_its_column(monkeypatch, capsys):
  import aot.tools.anchors
  from aot.tools.bench import bench_model

  def refuse(model, threads):
    raise RuntimeError("Check 'unknown_operators.empty()' failed\nmore detail")

  monkeypatch.setattr(aot.tools.anchors, "openvino_version", lambda: "2099.0")
  monkeypatch.setattr(aot.tools.anchors, "_ov_session", refuse)
  model, x = _small_model(), np.ones((4, 16), np.float32)
  (row,) = bench_model("small", model, model, lambda art: [x], [1], ["c"], 3, 0.01, openvino=True)
  assert "small: no OpenVINO column: Check 'unknown_operators.empty()' failed\n" in capsys.readouterr().out
  assert row["c_vs_ort"] > 0 and not [k for k in row if "ov" in k.split("_")]
