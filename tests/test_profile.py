"""The profiler (aot/tools/profile.py): a timed build that computes what the normal one does, a normal one with no
timing; and the bench's memory columns."""

import ctypes
import json
import re
import subprocess
import sys

import numpy as np
import pytest

import aot
from aot.frontends.tensor import Tensor
from aot.models import get
from aot.tools.profile import busiest_share, format_profile, load_calls, profile_artifact, thread_bound


@pytest.fixture(scope="module")
def mnist_builds(tmp_path_factory):
  """(normal, profile) builds of mnist (convolutions with im2col copies, matmuls, epilogues), c target, cached: the
  profile build first, so a shared cache entry would hand its library to the normal build."""
  base = tmp_path_factory.mktemp("profile")
  timed = aot.compile_model("models:mnist", out_dir=base / "timed", profile=True)
  return aot.compile_model("models:mnist", out_dir=base / "normal"), timed


def _timed_calls(model_c: str) -> list[str]:
  """The function each timed block of a profile build's model.c calls, in order (the microkernel as aot_gemm_run)."""
  blocks = re.findall(r"double t_ = aot_profile_now\(\);\n(.*?)\n\s*m->profile\[(\d+)\]", model_c, re.S)
  assert [int(i) for _, i in blocks] == list(range(len(blocks)))

  def function(line: str) -> str:
    if "aot_gemm_run" in line:
      return "aot_gemm_run"
    on_pool = re.search(r"aot_parallel\(m->pool, run_(\w+),", line)
    return on_pool.group(1) if on_pool else re.match(r"\s*(\w+)\(", line).group(1)

  return [function(line) for line, _ in blocks]


def test_normal_build_has_no_profile_symbol(mnist_builds):
  normal, timed = mnist_builds
  assert not hasattr(ctypes.CDLL(str(normal.library_path)), "mnist_profile")
  assert hasattr(ctypes.CDLL(str(timed.library_path)), "mnist_profile")
  assert "clock_gettime" not in (normal.dir / "src" / "model.c").read_text()
  assert "MNIST_PROFILE_CALLS" not in normal.header_path.read_text()
  with pytest.raises(ValueError, match="not a profile build"):
    profile_artifact(normal)


def test_profile_build_computes_bitwise_what_the_normal_one_does(mnist_builds):
  normal, timed = mnist_builds
  ref = get("mnist")
  x = ref.example_inputs(seed=3)
  a, b = aot.load(normal)(*x), aot.load(timed)(*x)
  np.testing.assert_allclose(a, ref.reference(*x), rtol=1e-4, atol=1e-4)
  assert a.tobytes() == b.tobytes()


def test_calls_match_the_kernel_list_and_model_c(mnist_builds):
  _, timed = mnist_builds
  calls = load_calls(timed)
  model_c = (timed.dir / "src" / "model.c").read_text()
  assert [c.function for c in calls] == _timed_calls(model_c)
  assert f"#define MNIST_PROFILE_CALLS {len(calls)}" in timed.header_path.read_text()
  kernels = {k.name: k.function for k in timed.kernels}
  # every kernel's calls, in kernel order: its operands' copies and contractions, then its epilogue or itself
  assert list(dict.fromkeys(c.kernel for c in calls)) == list(kernels)
  for c in calls:
    if c.role == "contraction":
      assert (c.path, c.function) == ("microkernel", "aot_gemm_run")
    elif c.role == "operand":
      assert c.function.startswith(kernels[c.kernel] + "_dense") and c.path == "copy"
    else:
      assert c.function == kernels[c.kernel] and c.path == "loop"
  # mnist's convolutions and its dense layer contract; its last kernel (the small 10-wide one) is a loop
  assert sum(c.path == "microkernel" for c in calls) == model_c.count("aot_gemm_run(&g") == 4
  # a contraction's flops are 2 M N K: the first convolution is 32 channels x 24x24 positions x 5x5 window
  assert calls[[c.path for c in calls].index("microkernel")].flops == 2 * 32 * 24 * 24 * 25


def test_call_times_add_up_to_the_run(mnist_builds):
  _, timed = mnist_builds
  p = profile_artifact(timed, budget_s=0.5)
  assert p["runs"] >= 3 and len(p["calls"]) == len(load_calls(timed))
  # the calls are all of the run but its checks and the pool's rest; the run is all of a call from Python but cffi's
  assert 0.8 * p["total_ms"] <= p["calls_ms"] <= p["total_ms"] <= p["wall_ms"]
  assert all(r["ms"] > 0 for r in p["calls"]) and [r["ms"] for r in p["calls"]] == sorted(
    (r["ms"] for r in p["calls"]), reverse=True
  )
  assert abs(sum(r["share"] for r in p["calls"]) - p["calls_ms"] / p["total_ms"]) < 1e-9
  text = format_profile(p)
  lines = text.splitlines()
  assert lines[-2].startswith("total ") and lines[-1].startswith("on 2 threads: ")
  assert "microkernel" in text and "k4_r_1_10" in text
  assert p["cpu_ms"] == p["cpu_all_ms"] == 0


def test_a_batch_range_times_each_call_over_its_items(tmp_path):
  """Over a batch range, model.c runs some calls once over all items (folded) and the rest item by item in loops:
  each call is timed on its own all the same, and its work counted for as many items as the run has."""
  from aot.models.onnx_forms import onnx_model, with_batch_dim

  timed = aot.compile_model(
    with_batch_dim(onnx_model("mnist")), shapes={"batch": (1, 8)}, out_dir=tmp_path / "timed", profile=True
  )
  calls, model_c = load_calls(timed), (timed.dir / "src" / "model.c").read_text()
  assert [c.function for c in calls] == _timed_calls(model_c)
  assert "for (int64_t b_ = 0; b_ < n_; b_++)" in model_c and "const int64_t b_ = 0;" in model_c
  x = np.random.default_rng(0).standard_normal((5, 1, 28, 28)).astype(np.float32)
  p = profile_artifact(timed, inputs=[x], budget_s=0.5)
  assert 0.8 * p["total_ms"] <= p["calls_ms"] <= p["total_ms"] <= p["wall_ms"]
  assert all(r["ms"] > 0 for r in p["calls"])
  assert p["gflop"] == pytest.approx(5 * sum(c.flops for c in calls) / 1e9)


def test_thread_cpu_times(mnist_builds):
  _, timed = mnist_builds
  p = profile_artifact(timed, budget_s=0.2, threads=2, cpu=True)
  # each call's (serial here: mnist is too small for the pool) on its one thread
  assert all(r["cpu_ms"] == r["cpu_all_ms"] > 0 for r in p["calls"]) and 0 < p["cpu_ms"] <= 1.2 * p["total_ms"]
  assert "thread CPU time: " in format_profile(p)


def test_profile_is_for_cpu_targets():
  with pytest.raises(ValueError, match="profile is for the CPU targets"):
    aot.compile_model("models:mlp", target="cuda", profile=True)


def test_cli_profile_writes_the_table_and_json(tmp_path):
  p = subprocess.run(
    [sys.executable, "-m", "aot.cli", "models:mlp", "-o", str(tmp_path), "--profile"], capture_output=True, text=True
  )
  assert p.returncode == 0, p.stderr
  # three microkernel calls: each layer's bias (and ReLU) is applied to the finished tiles, not by a call of its own
  assert re.search(r"^total [\d.]+ ms per run \([\d.]+ ms in 3 calls\)", p.stdout, re.M)
  prof = json.loads((tmp_path / "profile.json").read_text())
  assert {r["kernel"] for r in prof["calls"]} == {"k0_r_8_256", "k1_r_8_128", "k2_r_8_10"}
  # the folder stays an artifact: profile.json is not taken for its manifest
  x = np.random.default_rng(0).standard_normal((8, 784)).astype(np.float32)
  ref = get("mlp")
  np.testing.assert_allclose(aot.load(tmp_path)(x), ref.reference(x), rtol=1e-4, atol=1e-5)


def test_bench_rows_give_weights_and_arena_against_the_model(tmp_path):
  from onnx import numpy_helper

  from aot.models.onnx_forms import onnx_model
  from aot.tools.bench import bench_model, slower_note

  form, ref = onnx_model("mlp"), get("mlp")
  rows = bench_model("mlp", form, form, lambda art: ref.example_inputs(0), [1, 2], ["c"], 3, 0.1)
  assert [r["threads"] for r in rows] == [1, 2] and all(r["c_rel_err"] < 1e-4 for r in rows)
  own = sum(numpy_helper.to_array(t).nbytes for t in form.graph.initializer)
  # the blob holds mlp's three weight matrices packed in tiles and its biases: about the model's own bytes
  assert 1.0 <= rows[0]["weights_x"] <= 1.2 and rows[0]["weights_x"] == round(rows[0]["weights_mb"] * 1e6 / own, 2)
  # the largest tensor is the (8, 784) input
  assert rows[0]["arena_x"] == round(aot.compile_model(form, out_dir=tmp_path).arena_bytes / (8 * 784 * 4), 1)
  fast, slow = {"model": "a", "threads": 1, "c_vs_ort": 0.9}, {"model": "b", "threads": 2, "c_vs_ort": 3.0}
  assert slower_note([fast, slow], ["c"]) == "Slower than onnxruntime: b (2t: c 3.0x)."


def test_bench_times_every_thread_count_in_one_interleaved_run(monkeypatch, tmp_path):
  """All thread counts of a model, ours and onnxruntime's, are timed in one round-robin (timed one after the other,
  the 2t/1t ratio of int8 ResNet-50 moved 1.5-2.1 over runs on a loaded machine), each on its own instance; each row
  gives its speed-up over the 1-thread row of that run."""
  import os

  import aot.tools.bench
  from aot.models.onnx_forms import onnx_model

  form, ref = onnx_model("mlp"), get("mlp")
  # two instances of one library keep their own pools: 0 and 2 workers beside the caller
  art = aot.compile_model(form, out_dir=tmp_path)
  before = len(os.listdir("/proc/self/task"))
  one, three = aot.load(art, threads=1), aot.load(art, threads=3)
  assert len(os.listdir("/proc/self/task")) - before == 2
  three.close()
  assert len(os.listdir("/proc/self/task")) == before
  one.close()

  calls, timed = [], aot.tools.bench._time
  monkeypatch.setattr(aot.tools.bench, "_time", lambda fns, *a: calls.append(sorted(fns, key=str)) or timed(fns, *a))
  rows = aot.tools.bench.bench_model("mlp", form, form, lambda art: ref.example_inputs(0), [1, 2, 3], ["c"], 3, 0.1)
  assert calls == [[("c", 1), ("c", 2), ("c", 3), ("ort", 1), ("ort", 2), ("ort", 3)]]
  assert [r["threads"] for r in rows] == [1, 2, 3] and all(r["c_rel_err"] < 1e-4 for r in rows)
  assert rows[0]["c_x_1t"] == rows[0]["ort_x_1t"] == 1.0 and all(r["c_x_1t"] > 0 and r["ort_x_1t"] > 0 for r in rows)
  # the milliseconds are rounded to 3 places: the speed-up from them is close
  assert abs(rows[2]["c_x_1t"] / (rows[0]["c_ms"] / rows[2]["c_ms"]) - 1) < 0.1


def test_bench_times_a_fast_call_in_batches_the_same_for_every_fn():
  """A sample of a call much shorter than SAMPLE_S is a batch of calls (one call timed alone is mostly the clock and
  the load), the same number for each fn compared, and the result is per call."""
  import time

  from aot.tools.bench import SAMPLE_S, _time

  counts = {"fast": 0, "slow": 0}

  def fast():
    counts["fast"] += 1

  def slow():
    counts["slow"] += 1
    t = time.perf_counter()
    while time.perf_counter() - t < 1e-4:
      pass

  med = _time({"fast": fast, "slow": slow}, 3, 0.0)
  assert counts["fast"] == counts["slow"] > 3 * 10
  assert 1e-4 <= med["slow"] < SAMPLE_S and med["fast"] < med["slow"]


@pytest.mark.parametrize(
  "argv, says",
  [
    (["--models", "light:resnet50:qdq"], "light models go as arguments (light:NAME)"),
    (["--models", "resnet18:qdqq"], "unknown model 'resnet18:qdqq'"),
    (["--models", "", "light:resnet5"], "onnx's light models are squeezenet"),
    (["--models", "", "missing.onnx"], "missing.onnx: no such ONNX file"),
    (["--profile", "models:transformr"], "unknown model 'transformr'"),
  ],
)
def test_bench_names_an_unknown_model_before_it_compiles_anything(argv, says, capsys):
  from aot.tools.bench import main

  with pytest.raises(SystemExit) as e:
    main(argv)
  assert e.value.code == 2 and says in capsys.readouterr().err


def _contraction_flops(model) -> int:
  """2 x the multiply-adds of a model's Conv and Gemm nodes, from ONNX's own shape inference: the analytic count,
  2 N K (C / groups) R S H W per convolution."""
  import onnx

  model = onnx.shape_inference.infer_shapes(model)
  shapes = {
    v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
    for v in [*model.graph.value_info, *model.graph.output, *model.graph.input]
  }
  shapes |= {t.name: list(t.dims) for t in model.graph.initializer}
  total = 0
  for n in model.graph.node:
    if n.op_type in ("Conv", "Gemm"):
      w, out = shapes[n.input[1]], shapes[n.output[0]]
      # a Gemm's weight is (K, N) or, transposed, (N, K): either way the output has N columns and K is the other dim
      total += 2 * int(np.prod(out)) * (int(np.prod(w[1:])) if n.op_type == "Conv" else int(np.prod(w)) // out[-1])
  return total


def test_flop_count_counts_each_concat_branch_over_its_own_slice():
  # a concat of two convolutions is one kernel whose value selects between the two sums; its generated loops compute
  # both sums at every output element, but the model's work is each branch over its own channels
  from onnx import TensorProto, helper, numpy_helper

  from aot.codegen.render.linearize import flop_count
  from aot.compiler import resolve
  from aot.scheduler.schedule import schedule

  rng = np.random.default_rng(0)
  N, C, H, W = 1, 5, 9, 11
  branches = [(6, 3), (4, 5)]  # (out channels, square window), 'same' padding
  inits = [
    numpy_helper.from_array(rng.standard_normal((k, C, r, r)).astype(np.float32), f"w{i}")
    for i, (k, r) in enumerate(branches)
  ]
  nodes = [helper.make_node("Conv", ["x", f"w{i}"], [f"y{i}"], pads=[r // 2] * 4) for i, (k, r) in enumerate(branches)]
  nodes.append(helper.make_node("Concat", ["y0", "y1"], ["y"], axis=1))
  x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [N, C, H, W])
  graph = helper.make_graph(
    nodes, "concat_convs", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits
  )
  model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
  t = resolve(model)
  sched = schedule(t.outputs, t.inputs, t.output_names)
  analytic = sum(2 * N * C * k * r * r * H * W for k, r in branches)
  assert analytic == _contraction_flops(model)
  # one kernel computes both branches, joined by an add per output element (the other branch is zero there); its
  # loops execute each sum at all 10 channels
  joins = N * 10 * H * W
  assert len(sched.kernels) == 1 and flop_count(sched.kernels[0].ast) == 2 * N * C * 10 * (9 + 25) * H * W + joins
  assert flop_count(sched.kernels[0].ast, live_only=True) == analytic + joins


@pytest.mark.parametrize("name", ["squeezenet", "densenet121"])
def test_flop_count_of_concat_heavy_light_models_is_their_contractions(name):
  # densenet121: 2.87 GMAC, 5.7 GFLOP (the count was 26.7 before gated branches were counted over their slices)
  from test_onnx_light import light_model

  from aot.codegen.render.linearize import flop_count
  from aot.compiler import resolve
  from aot.scheduler.schedule import schedule

  model = light_model(name)
  t = resolve(model)
  sched = schedule(t.outputs, t.inputs, t.output_names)
  ours, contractions = sum(flop_count(k.ast, live_only=True) for k in sched.kernels), _contraction_flops(model)
  # the rest is elementwise work (bias, batch norm, ReLU, pooling): a few percent
  assert contractions <= ours <= 1.05 * contractions


def test_big_calls_split_evenly_across_threads(tmp_path):
  """Every call doing real work splits across the pool into tasks that share out evenly over 2 threads (the bar of
  2 threads >= 1.7x as fast as 1 needs it): a 3x3 convolution (its im2col panels), a 1x1 one with a pool after it, a
  concat and the epilogues and BN-ReLU pass between them, at DenseNet's 28x28 shape."""
  rng = np.random.default_rng(0)
  w3 = rng.standard_normal((32, 128, 3, 3)).astype(np.float32)
  w1 = rng.standard_normal((128, 160, 1, 1)).astype(np.float32)
  scale, shift = (rng.standard_normal((1, 160, 1, 1)).astype(np.float32) for _ in range(2))

  def block(x):
    y = Tensor.cat([x, x.relu().conv2d(Tensor(w3), padding=1)], 1)
    y = (y * Tensor(scale) + Tensor(shift)).relu().conv2d(Tensor(w1)).relu()
    return y.avg_pool2d(2)

  art = aot.compile_model(block, [((1, 128, 28, 28), np.float32)], out_dir=tmp_path, profile=True, name="block")
  calls = load_calls(art)
  big = [c for c in calls if c.flops >= 1 << 20 or c.bytes >= 1 << 18]
  # (the pooled 1x1 convolution reads its input where it lies: its columns go by their step in the input, so the
  # pool's 2x2 windows are whole runs of it, not a gathered copy: codegen/lower/contract.py _row_order)
  assert {c.path for c in big} == {"microkernel", "loop"}
  for c in big:
    assert c.parallel, f"{c.kernel} ({c.function}, {c.path} {c.role}) runs on one thread"
    # 0.6: the 3x3 convolution's panels are 8 output rows each (whole tiles of 32 columns), so 28 rows are 8, 8, 8, 4
    assert busiest_share(vars(c), 2) <= 0.6, f"{c.kernel} ({c.function}): {c.tasks} tasks {c.task_work} share unevenly"
  # the bound from these calls taken at their flops: near 2 on 2 threads, and exactly 1 on one
  p = {"total_ms": sum(c.flops + c.bytes for c in calls), "calls": [vars(c) | {"ms": c.flops + c.bytes} for c in calls]}
  p["calls_ms"] = p["total_ms"]
  assert thread_bound(p, 2)["bound"] >= 1.8 and thread_bound(p, 1)["bound"] == pytest.approx(1.0)


def _conv_relu_model(path):
  import onnx
  from onnx import TensorProto, helper

  w = np.random.default_rng(0).standard_normal((16, 3, 3, 3)).astype(np.float32)
  graph = helper.make_graph(
    [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])],
    "conv_relu",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 32, 32])],
    [onnx.numpy_helper.from_array(w, "w")],
  )
  onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
  return path


def test_bench_profile_prints_onnxruntimes_nodes_beside_the_calls(tmp_path):
  """An ONNX model's profile has onnxruntime's per-node times on the same inputs beside our calls' (its session
  profiling): its conv, with the shapes it ran at, and the nodes' shares of their sum."""
  path = _conv_relu_model(tmp_path / "conv_relu.onnx")
  out = tmp_path / "profile.json"
  argv = [str(path), "--profile", "--targets", "c", "--top", "3", "--budget", "0.2", "--json", str(out)]
  r = subprocess.run([sys.executable, "-m", "aot.tools.bench", *argv], capture_output=True, text=True)
  assert r.returncode == 0, r.stderr
  ours, _, theirs = r.stdout.partition("onnxruntime, the same inputs (1 thread")
  assert "aot_gemm_run" in ours and theirs
  assert re.search(r"%\s+\d+\.\d+\s+\w*Conv\s+\S+: 1x3x32x32, 16x3x3x3 -> 1x16x32x32", theirs), theirs
  (p,) = json.loads(out.read_text())
  nodes = p["onnxruntime"]
  assert nodes and all(n["ms"] > 0 for n in nodes) and abs(sum(n["share"] for n in nodes) - 1) < 1e-9
  assert [n["ms"] for n in nodes] == sorted((n["ms"] for n in nodes), reverse=True)
  # (the models:NAME form is a Tensor program, which onnxruntime does not run: our table alone)
  r = subprocess.run(
    [sys.executable, "-m", "aot.tools.bench", "models:mlp", "--profile", "--targets", "c", "--budget", "0.2"],
    capture_output=True,
    text=True,
  )
  assert r.returncode == 0 and "onnxruntime" not in r.stdout, r.stderr
