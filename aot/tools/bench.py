"""Benchmark: our artifacts (c and llvm targets) against onnxruntime, and OpenVINO where it is installed, in one
process, interleaved, on the same seeded input, after warm-up. Ratios are what to compare: absolute times move with
the machine's load. OpenVINO and torch (for --real) are the bench extra: pip install '.[bench]'.

  python -m aot.tools.bench                         # the bundled reference models
  python -m aot.tools.bench model.onnx ... --json out.json --threads 1
  python -m aot.tools.bench light:resnet50           # an architecture that ships with onnx, seeded random weights
  python -m aot.tools.bench --zoo --threads 1,2      # the reference models and all nine light models (long)
  python -m aot.tools.bench --real --models ''       # the real-model set: YOLOv8n, DBNet, CRNN, MobileNetV2/V3,
      # a BERT-like encoder (aot/tools/real_models.py), exported from torch once into ~/.cache/aot-bench
  python -m aot.tools.bench --models resnet18:qdq light:resnet50:qdq   # quantized by onnxruntime's quantizer (qdq,
      # qoperator, dynamic: models/quantized.py), timed beside onnxruntime's own int8 run
  python -m aot.tools.bench --profile light:squeezenet models:resnet18 --targets c   # where each model's run goes
  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OPENBLAS_NUM_THREADS=1 python -m aot.tools.bench --micro
      # 1024^3 matmul and a 3x3 conv vs numpy's matmul (1 thread; unset a forced OpenBLAS core type, which slows numpy)
  python -m aot.tools.bench --scale 1               # an MLP with 1 GB of weights in external data
  (aot/tools/scale_bench.py)
  python -m aot.tools.bench --zoo --threads 1,2 --json docs/performance.json --doc docs/PERFORMANCE.md \\
      --readme README.md                             # the published tables: the rows, the tables, the README's summary
  python -m aot.tools.bench --rows docs/performance.json --doc docs/PERFORMANCE.md --readme README.md   # the same
      # tables from the saved rows, timing nothing
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from aot.tools.anchors import SPINNING, anchor_runners, first_output, openvino_version
from aot.tools.real_models import REAL_MODELS, RealModelError, real_model_path

# the reference models quantized with onnxruntime's quantizer (models/quantized.py), timed by default beside its int8
INT8_MODELS = ("resnet18:qdq", "resnet18:qoperator", "transformer:dynamic")
# onnx's light models (backend/test/data/light), the architectures --zoo times beside the reference models
LIGHT_MODELS = (
  "squeezenet",
  "shufflenet",
  "inception_v1",
  "inception_v2",
  "densenet121",
  "bvlc_alexnet",
  "resnet50",
  "zfnet512",
  "vgg19",
)


# a sample times this long at least (whole calls of one fn in a row): a 0.15 ms model timed one call at a time, 20
# times, gave ratios from 1.24 to 1.6 over runs of the bench; batches of calls give the same ratio each run
SAMPLE_S = 0.005


# with more than one thread, onnxruntime's pool threads spin on after its run (~30 ms of a core each time, the
# process's CPU time over a pause), on the cores the next fn needs (measured: our MobileNetV2 on 2 threads, right
# after onnxruntime's 2-thread run, 3.4 ms a call; after a 50 ms pause 2.5; alone 2.3-2.5), and the first call
# after another engine's finds the caches full of the other's
# data: a sample of such a runtime is followed by this pause, and where there is one every sample by an untimed call
# (ours rest their threads at the end of a run)
SPIN_TAIL_S = 0.06


def _time(fns: dict, repeats: int, budget_s: float, spinning=frozenset()) -> dict[str, float]:
  """Median seconds per call of each fn, samples interleaved round-robin so load changes hit all of them alike; a
  sample is as many calls in a row as take SAMPLE_S, the same number for every fn. The fns named in spinning leave
  threads spinning after they return: SPIN_TAIL_S after their samples, and an untimed call before every sample."""
  once = {}
  for k, f in fns.items():
    f()  # warm-up
    t = time.perf_counter()
    f()
    once[k] = time.perf_counter() - t
  calls = max(1, math.ceil(SAMPLE_S / max(min(once.values()), 1e-9)))
  times = {k: [] for k in fns}
  t_end = time.perf_counter() + budget_s
  for i in range(repeats):
    for k, f in fns.items():
      if spinning:
        f()
      t = time.perf_counter()
      for _ in range(calls):
        f()
      times[k].append((time.perf_counter() - t) / calls)
      if k in spinning:
        time.sleep(SPIN_TAIL_S)
    if i >= 2 and time.perf_counter() > t_end:
      break
  return {k: statistics.median(v) for k, v in times.items()}


def bench_model(
  label: str,
  what,
  onnx_model,
  inputs_for,
  thread_counts: list[int],
  targets,
  repeats: int,
  budget_s: float,
  openvino: bool = False,
) -> list[dict]:
  """One row per thread count; the model is compiled once for each target. Every thread count of every target, and
  onnxruntime's (and with openvino OpenVINO's, where it is installed), is timed in one interleaved round-robin
  (_time): an instance (aot.load: its own arena and pool) and an onnxruntime session per thread count. Timed one
  thread count after the other, the 2t/1t ratio of int8 ResNet-50 on this noisy 2-core machine came out 1.57, 1.50
  and 2.12 in three runs (onnxruntime's own 1.1 to 1.6): the rows were measured at different moments, under
  different loads. {t}_x_1t and ort_x_1t are each row's speed-up over the 1-thread row of the same run (when the
  thread counts include 1)."""
  import aot

  stats = _model_stats(what, onnx_model)
  arts, compile_s = {}, {}
  for t in targets:
    t0 = time.perf_counter()
    arts[t] = aot.compile_model(what, target=t, out_dir=tempfile.mkdtemp(prefix=f"bench_{t}_"), cache=False)
    compile_s[t] = time.perf_counter() - t0
  art = arts[targets[0]]
  xs = inputs_for(art)
  # keyed (target, threads), onnxruntime's target "ort", OpenVINO's "ov"
  models = {(t, n): aot.load(arts[t], threads=n) for t in targets for n in thread_counts}
  runners = {k: (lambda m=m: first_output(m(*xs))) for k, m in models.items()}
  anchors = anchor_runners(label, onnx_model, xs, thread_counts, openvino) if onnx_model is not None else {}
  runners.update(anchors)
  # the budget was each thread count's when they were timed apart: the same samples per row
  spinning = frozenset(k for k in anchors if k[0] in SPINNING and k[1] > 1)
  med = _time(runners, repeats, budget_s * len(thread_counts), spinning)
  names = [a for a in ("ort", "ov") if (a, thread_counts[0]) in anchors]
  rows = []
  for threads in thread_counts:
    ref = anchors["ort", threads]() if names else None
    row = {"model": label, "gflop": round(stats.gflop, 4), "threads": threads, **_memory(art, stats)}
    for t in targets:
      row[f"{t}_ms"] = round(med[t, threads] * 1e3, 3)
      row[f"{t}_gflops"] = round(stats.gflop / med[t, threads], 2) if med[t, threads] else None
      row[f"{t}_compile_s"] = round(compile_s[t], 2)
      for a in names:
        row[f"{t}_vs_{a}"] = round(med[t, threads] / med[a, threads], 2)
    for a in names:
      row[f"{a}_ms"] = round(med[a, threads] * 1e3, 3)
    # ours and OpenVINO's output against onnxruntime's
    for t in [t for t in targets + names if t != "ort" and ref is not None]:
      out = runners[t, threads]()
      row[f"{t}_rel_err"] = float(np.max(np.abs(out - ref)) / max(np.max(np.abs(ref)), 1e-30))
    if 1 in thread_counts:
      for t in targets + names:
        row[f"{t}_x_1t"] = round(med[t, 1] / med[t, threads], 2)
    if "c" in targets and "llvm" in targets:
      row["llvm_over_c"] = round(med["llvm", threads] / med["c", threads], 2)
    rows.append(row)
  print("\n".join(table(rows, targets).splitlines()[2:]), file=sys.stderr, flush=True)
  # an instance per thread count and target holds an arena (ResNet-50's: 8 MB) and a pool's threads, a session the
  # weights again: freed before the next model
  for m in models.values():
    m.close()
  anchors.clear()
  runners.clear()
  # each build is 0.1-0.5 GB (ResNet-50's weights, its objects): a zoo run left gigabytes in the temp folder
  for a in arts.values():
    shutil.rmtree(a.dir, ignore_errors=True)
  return rows


@dataclass
class _ModelStats:
  """What a row says of the model itself: its GFLOP per run, the largest tensor a kernel writes or the model takes
  or gives, and the weights the ONNX file ships (0 for a Tensor program)."""

  gflop: float
  largest_bytes: int
  own_weight_bytes: int


def _model_stats(what, onnx_model) -> _ModelStats:
  from aot.codegen.render.linearize import flop_count
  from aot.compiler import resolve
  from aot.scheduler.schedule import schedule

  traced = resolve(what)
  sched = schedule(traced.outputs, traced.inputs, traced.output_names)
  return _ModelStats(
    gflop=sum(flop_count(k.ast, live_only=True) for k in sched.kernels) / 1e9,
    largest_bytes=max(b.nbytes for k in sched.kernels for b in k.bufs[:1] + sched.inputs + sched.outputs),
    own_weight_bytes=_onnx_weight_bytes(onnx_model) if onnx_model is not None else 0,
  )


def _memory(art, stats: _ModelStats) -> dict:
  """A row's memory columns: the arena against the largest tensor, the weights blob against the model's own."""
  row = {
    "kernels": art.num_kernels,
    "weights_mb": round(art.weights_bytes / 1e6, 2),
    "arena_mb": round(art.arena_bytes / 1e6, 2),
    "arena_x": round(art.arena_bytes / stats.largest_bytes, 1),
  }
  if stats.own_weight_bytes:
    row["weights_x"] = round(art.weights_bytes / stats.own_weight_bytes, 2)
  return row


def _onnx_weight_bytes(model) -> int:
  """Bytes of an ONNX model's initializers and Constant tensors: the weights it ships."""
  import onnx

  from aot.frontends.onnx_load import weight_bytes

  return weight_bytes((onnx.load(str(model)) if isinstance(model, (str, Path)) else model).graph)


def _onnx_arg(path: str, models_dir: Path | None = None):
  """(label, ModelProto) of a command-line model: a file, light:NAME, one of the architectures that ship with onnx
  (backend/test/data/light) with seeded random weights in place of their constant ones, or real:NAME, one of the
  real-model set (exported once into models_dir)."""
  import onnx

  if path.startswith("real:"):
    name = path.removeprefix("real:")
    return name, onnx.load(real_model_path(name, models_dir))
  if path.startswith("light:"):
    from aot.testing import randomize_constant_weights

    name, _, quant = path.split(":", 1)[1].partition(":")
    light = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / f"light_{name}.onnx"
    model = randomize_constant_weights(onnx.load(light))
    if not quant:
      return f"light {name}", model
    from aot.models.quantized import quantized

    return f"light {name} {quant}", quantized(model, quant)
  return Path(path).stem, onnx.load(path)


def _qlinear_matmul(rng, n: int):
  """A QLinearMatMul of uint8 [n, n] inputs by constant int8 [n, n] weights (per-column scales): the int8
  microkernel."""
  from onnx import TensorProto, helper, numpy_helper

  c = lambda name, x: numpy_helper.from_array(np.asarray(x), name)
  inits = [
    c("xs", np.float32(0.02)),
    c("xz", np.uint8(128)),
    c("w", rng.integers(-127, 128, (n, n)).astype(np.int8)),
    c("ws", rng.uniform(1e-3, 2e-3, n).astype(np.float32)),
    c("wz", np.zeros(n, np.int8)),
    c("ys", np.float32(8.0)),
    c("yz", np.uint8(128)),
  ]
  node = helper.make_node("QLinearMatMul", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["y"])
  g = helper.make_graph(
    [node],
    "qmatmul",
    [helper.make_tensor_value_info("x", TensorProto.UINT8, [n, n])],
    [helper.make_tensor_value_info("y", TensorProto.UINT8, [n, n])],
    inits,
  )
  return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def micro(targets, threads: int, budget_s: float) -> list[dict]:
  """The two kernels that decide CNN and transformer speed, against numpy's matmul (its BLAS) in the same run."""
  import aot
  from aot.frontends.tensor import Tensor

  rng = np.random.default_rng(0)
  a, b = rng.standard_normal((1024, 1024), dtype=np.float32), rng.standard_normal((1024, 1024), dtype=np.float32)
  x, w = rng.standard_normal((1, 64, 56, 56), dtype=np.float32), rng.standard_normal((64, 64, 3, 3), dtype=np.float32)
  cases = [
    ("matmul 1024^3", lambda p: p @ Tensor(b), [a], 2 * 1024**3),
    ("conv 3x3 56x56x64->64", lambda p: p.conv2d(Tensor(w), padding=1), [x], 2 * 56 * 56 * 64 * 64 * 9),
    (
      "int8 matmul 1024^3",
      _qlinear_matmul(rng, 1024),
      [rng.integers(0, 256, (1024, 1024)).astype(np.uint8)],
      2 * 1024**3,
    ),
  ]
  rows = []
  for label, fn, xs, flops in cases:
    runners = {"numpy matmul": lambda: a @ b}
    loaded = []
    for t in targets:
      out = tempfile.mkdtemp(prefix="micro_")
      m = aot.load(aot.compile_model(fn, xs, target=t, out_dir=out), threads=threads)
      runners[t] = lambda m=m, xs=xs: m(*xs)
      loaded.append((m, out))
    med = _time(runners, 10, budget_s)
    for m, out in loaded:
      m.close()
      shutil.rmtree(out, ignore_errors=True)
    row = {
      "kernel": label,
      "threads": threads,
      "numpy_matmul_gflops": round(2 * 1024**3 / med["numpy matmul"] / 1e9, 1),
    }
    for t in targets:
      row[f"{t}_gflops"] = round(flops / med[t] / 1e9, 2)
      row[f"{t}_pct_of_numpy"] = round(100 * row[f"{t}_gflops"] / row["numpy_matmul_gflops"], 1)
    rows.append(row)
  return rows


def table(rows: list[dict], targets, cols: list[str] | None = None) -> str:
  """Rows as a Markdown table: every column (cols, else all the bench writes) that some row has."""
  if cols is None:
    cols = (
      ["model", "gflop", "threads", "kernels", "weights_mb", "weights_x", "arena_mb", "arena_x"]
      + [f"{t}_ms" for t in targets]
      + ["ort_ms", "ov_ms"]
      + [f"{t}_vs_{a}" for a in ("ort", "ov") for t in targets]
      + [f"{t}_x_1t" for t in targets]
      + ["ort_x_1t", "ov_x_1t"]
      + [f"{t}_gflops" for t in targets]
      + ["llvm_over_c"]
      + [f"{t}_compile_s" for t in targets]
      + [f"{t}_rel_err" for t in targets]
      + ["ov_rel_err"]
    )
  cols = [c for c in cols if any(c in r for r in rows)]
  fmt = lambda v: f"{v:.1e}" if isinstance(v, float) and abs(v) < 1e-2 and v != 0 else str(v)
  lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
  lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |" for r in rows]
  return "\n".join(lines)


def _is_int8(row: dict) -> bool:
  """A row of a quantized model: NAME:FORM (bundled) or "light NAME FORM"."""
  return ":" in row["model"] or len(row["model"].split()) == 3


def performance_tables(run: dict) -> str:
  """docs/PERFORMANCE.md's generated part: the command and machine, then the float and int8 models against
  onnxruntime, the speed-up on more threads, and memory and compile time, each model once."""
  rows, targets = run["rows"], run["targets"]
  per = lambda *names: [f"{t}_{n}" for n in names for t in targets]
  # (OpenVINO's columns are in the rows of a run that had it installed)
  speed = ["model", "threads", *per("ms"), "ort_ms", "ov_ms", *per("vs_ort", "vs_ov")]
  first = min(r["threads"] for r in rows)
  sections = [
    (
      "Float models",
      [r for r in rows if not _is_int8(r)],
      [
        *["model", "gflop", "threads", *per("ms"), "ort_ms", "ov_ms", *per("vs_ort", "vs_ov", "gflops")],
        *["llvm_over_c", *per("rel_err"), "ov_rel_err"],
      ],
    ),
    (
      "Int8 models, beside onnxruntime's own int8 run",
      [r for r in rows if _is_int8(r)],
      [*speed, *per("rel_err"), "ov_rel_err"],
    ),
    (
      "Threads: each row's speed-up over 1 thread",
      [r for r in rows if r["threads"] > 1],
      ["model", "threads", *per("x_1t"), "ort_x_1t", "ov_x_1t"],
    ),
    (
      "Memory and compile time",
      [r for r in rows if r["threads"] == first],
      ["model", "kernels", "weights_mb", "weights_x", "arena_mb", "arena_x", *per("compile_s")],
    ),
  ]
  parts = [f"`{run['command']}` on {run['machine']}:"]
  for title, part, cols in sections:
    if part and any(c in r for r in part for c in cols[2:]):
      parts += [f"### {title}", table(part, targets, cols)]
  parts.append(slower_note(rows, targets))
  return "\n\n".join(parts)


def summary_table(rows: list[dict], targets) -> str:
  """The README's short table: each model's time over onnxruntime's, per target and thread count; over OpenVINO's
  too where the rows have it."""
  threads = sorted({r["threads"] for r in rows})
  anchors = [("ort", "")] + [("ov", "/OpenVINO")] * any(f"{t}_vs_ov" in r for r in rows for t in targets)
  col = lambda t, a, n: f"{t}{a}, {n} thread{'s' * (n > 1)}"
  cols = [col(t, name, n) for n in threads for _, name in anchors for t in targets]
  by_model: dict[str, dict] = {}
  for r in rows:
    by_model.setdefault(r["model"], {}).update(
      {col(t, name, r["threads"]): r.get(f"{t}_vs_{a}", "") for a, name in anchors for t in targets}
    )
  lines = ["| model | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
  lines += [f"| {m} | " + " | ".join(str(v.get(c, "")) for c in cols) + " |" for m, v in by_model.items()]
  return "\n".join(lines)


# slower than onnxruntime by more than this is named under the table (run-to-run noise on a shared machine is ~5%)
SLOWER_NOTE_RATIO = 1.05


def slower_note(rows: list[dict], targets) -> str:
  """One line naming the rows where we are slower than onnxruntime, slowest first; another for OpenVINO where the
  rows have its column."""
  notes = []
  for a, name in (("ort", "onnxruntime"), ("ov", "OpenVINO")):
    if a == "ov" and not any(f"{t}_vs_ov" in r for r in rows for t in targets):
      continue
    slow = [(max(r.get(f"{t}_vs_{a}", 0) for t in targets), r) for r in rows]
    slow = sorted(((x, r) for x, r in slow if x > SLOWER_NOTE_RATIO), key=lambda xr: -xr[0])
    if not slow:
      notes.append(f"Nowhere slower than {name} (by more than 5%).")
      continue
    ratios = lambda r: ", ".join(f"{t} {r[f'{t}_vs_{a}']}x" for t in targets if f"{t}_vs_{a}" in r)
    notes.append(f"Slower than {name}: " + ", ".join(f"{r['model']} ({r['threads']}t: {ratios(r)})" for _, r in slow))
    notes[-1] += "."
  return "\n".join(notes)


def _parser() -> argparse.ArgumentParser:
  ap = argparse.ArgumentParser(
    prog="python -m aot.tools.bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  ap.add_argument(
    "onnx",
    nargs="*",
    help="ONNX models to time besides the bundled reference models (a file, "
    "light:NAME for onnx's light models with seeded random weights, light:NAME:FORM quantized, or real:NAME)",
  )
  ap.add_argument(
    "--models",
    default="mlp,mnist,resnet18,transformer," + ",".join(INT8_MODELS),
    help="bundled models to time ('' for none); NAME:FORM quantized (qdq, qoperator, dynamic)",
  )
  ap.add_argument("--zoo", action="store_true", help="also time all nine of onnx's light models (light:NAME)")
  ap.add_argument(
    "--real",
    action="store_true",
    help="also time the real-model set (real:NAME: aot/tools/real_models.py), exported from torch once and cached",
  )
  ap.add_argument("--models-dir", type=Path, help="where the real models' ONNX files are cached (~/.cache/aot-bench)")
  ap.add_argument("--no-openvino", action="store_true", help="leave OpenVINO's column out even where it is installed")
  ap.add_argument("--targets", default="c,llvm")
  ap.add_argument("--threads", default="1", help="comma-separated thread counts, e.g. 1,2")
  ap.add_argument("--repeats", type=int, default=20)
  ap.add_argument(
    "--budget", type=float, default=20.0, help="seconds of timing per model and thread count at most (after 3 rounds)"
  )
  ap.add_argument("--json", help="write the rows here as JSON, with the command and the machine")
  ap.add_argument(
    "--doc", help="write the tables between the bench's markers of this Markdown file (docs/PERFORMANCE.md)"
  )
  ap.add_argument("--readme", help="write the short results table between the bench markers of this README")
  ap.add_argument(
    "--rows",
    metavar="JSON",
    help="time nothing: the tables from the rows a run wrote with --json (for --doc and --readme)",
  )
  ap.add_argument(
    "--profile",
    action="store_true",
    help="profile the models given (models:NAME, a file or light:NAME) "
    "instead: each kernel call's time, GFLOP/s, bytes and path (aot/tools/profile.py); --json writes them",
  )
  ap.add_argument("--top", type=int, default=20, help="--profile: show this many of the slowest calls")
  ap.add_argument(
    "--micro",
    action="store_true",
    help="time the 1024^3 matmul (float, int8) and 3x3 conv kernels against numpy instead",
  )
  ap.add_argument(
    "--scale",
    type=float,
    metavar="GB",
    help="instead: compile an MLP with GB of weights in external data "
    "in a subprocess; its compile time and peak RSS, the artifact's size and create time, its error vs "
    "onnxruntime (--json writes the row)",
  )
  ap.add_argument(
    "--dynamic",
    action="store_true",
    help="instead: the reference models (and with --real the real ones that have a batch) compiled once for a batch "
    "range (--shape batch=LO..HI), timed at sizes across it against a static compile at each size and onnxruntime, "
    "1 thread (aot/tools/dynamic_bench.py)",
  )
  return ap


def main(argv=None) -> int:
  ap = _parser()
  args = ap.parse_args(argv)
  if (problem := _unknown_model(args.models, args.onnx)) is not None:
    ap.error(problem)
  targets = [t for t in args.targets.split(",") if t]
  if args.scale is not None:
    return _run_scale(args)
  if args.micro:
    return _run_micro(args, targets)
  if args.dynamic:
    return _run_dynamic(args)
  if args.zoo:
    args.onnx += [f"light:{n}" for n in LIGHT_MODELS if f"light:{n}" not in args.onnx]
  if args.real:
    args.onnx += [f"real:{n}" for n in REAL_MODELS if f"real:{n}" not in args.onnx]
  if not args.rows:
    _export_real(args.onnx, args.models_dir)
  if args.profile:
    return _profile(args.onnx, targets, [int(t) for t in args.threads.split(",")], args)
  if args.rows:
    run = _saved_run(Path(args.rows))
    rows, targets = run["rows"], run["targets"]
  else:
    rows = _run_bench(args, targets)
    run = {"command": _command(args, ap), "machine": machine(), "targets": targets, "rows": rows}
  print(table(rows, targets))
  print(slower_note(rows, targets))
  if args.json:
    Path(args.json).write_text(json.dumps(run, indent=1))
  if args.doc:
    _replace_between(Path(args.doc), "bench", performance_tables(run))
  if args.readme:
    _replace_between(Path(args.readme), "bench", summary_table(rows, targets))
  return 0


def _saved_run(path: Path) -> dict:
  """What a run wrote with --json: its command, machine, targets and rows."""
  try:
    run = json.loads(path.read_text())
  except (OSError, ValueError) as e:
    raise SystemExit(f"--rows {path}: {e}") from None
  if not isinstance(run, dict) or not {"command", "machine", "targets", "rows"} <= run.keys():
    raise SystemExit(f"--rows {path}: not a bench run's --json (command, machine, targets and rows)")
  return run


def _run_bench(args, targets) -> list[dict]:
  """Every model asked for, timed; the rows by thread count, then in the order the models were given."""
  from aot.check import random_inputs
  from aot.models import get

  thread_counts = [int(t) for t in args.threads.split(",")]
  openvino = not args.no_openvino and openvino_version() is not None
  if not args.no_openvino and not openvino:
    print("OpenVINO is not installed: no OpenVINO column (pip install openvino, or 'aot-compiler[bench]')")
  rows = []
  for name in [m for m in args.models.split(",") if m]:
    ref = get(name.partition(":")[0])
    # the ONNX form, compiled and given to onnxruntime alike (its kernels are the Tensor form's)
    form = _reference_form(name)
    inputs = lambda art, r=ref: r.example_inputs(0)
    rows += bench_model(name, form, form, inputs, thread_counts, targets, args.repeats, args.budget, openvino)
  for path in args.onnx:
    label, model = _onnx_arg(path, args.models_dir)
    inputs = lambda art: random_inputs(art.inputs, indexed=art.indexed_inputs)
    rows += bench_model(label, model, model, inputs, thread_counts, targets, args.repeats, args.budget, openvino)
  return sorted(rows, key=lambda r: r["threads"])


def _command(args, ap) -> str:
  """The command as run: every option not at its default, and the models and files beyond the defaults."""
  # (quoted: --models '' had read as "--models --repeats 7", the next option taken for its value)
  options = [f" --{o} {shlex.quote(str(getattr(args, o)))}" for o in ("models", "targets", "repeats", "budget")]
  options = [
    t for o, t in zip(("models", "targets", "repeats", "budget"), options) if getattr(args, o) != ap.get_default(o)
  ]
  extra = [
    o
    for o in args.onnx
    if not (args.zoo and o.removeprefix("light:") in LIGHT_MODELS)
    and not (args.real and o.removeprefix("real:") in REAL_MODELS)
  ]
  sets = " --zoo" * args.zoo + " --real" * args.real + " --no-openvino" * args.no_openvino
  return f"python -m aot.tools.bench{''.join(options)} --threads {args.threads}{sets}" + "".join(f" {o}" for o in extra)


def machine() -> str:
  """The CPU's model name and how many cores this process may use: what a table's times hold for."""
  name = "an unknown CPU"
  try:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
      if line.startswith("model name"):
        name = line.split(":", 1)[1].strip()
        break
  except OSError:
    pass
  return f"{name}, {len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()} cores"


def _run_scale(args) -> int:
  from aot.tools.scale_bench import scale

  row = scale(args.scale)
  print(_plain_table([row]))
  if args.json:
    Path(args.json).write_text(json.dumps(row, indent=1))
  return 0


def _run_dynamic(args) -> int:
  from aot.tools.dynamic_bench import DYNAMIC_MODELS, dynamic_rows

  real = [m for m in DYNAMIC_MODELS if m.startswith("real:")] if args.real else []
  asked = [m for m in args.models.split(",") + real if m in DYNAMIC_MODELS]
  names = asked or [m for m in DYNAMIC_MODELS if not m.startswith("real:")]
  rows = dynamic_rows(names, args.repeats, args.budget, args.models_dir)
  print(_plain_table(rows))
  if args.json:
    Path(args.json).write_text(json.dumps(rows, indent=1))
  if args.doc:
    command = "python -m aot.tools.bench --dynamic" + " --real" * args.real + f" --models {args.models}" * args.real
    _replace_between(Path(args.doc), "dynamic", f"`{command}` on {machine()}, 1 thread:\n\n{_plain_table(rows)}")
  return 0


def _run_micro(args, targets) -> int:
  rows = [r for n in args.threads.split(",") for r in micro(targets, int(n), args.budget)]
  text = _plain_table(rows)
  print(text)
  if args.json:
    Path(args.json).write_text(json.dumps(rows, indent=1))
  if args.doc:
    command = f"python -m aot.tools.bench --micro --threads {args.threads}"
    _replace_between(Path(args.doc), "micro", f"`{command}` on {machine()} (OpenBLAS {_openblas()}):\n\n{text}")
  return 0


def _plain_table(rows: list[dict]) -> str:
  """A Markdown table of rows that share their keys, in the first row's order."""
  cols = list(rows[0])
  lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
  return "\n".join(lines + ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows])


def _forms() -> str:
  """How a model is asked for quantized, for the messages below."""
  from aot.models.quantized import FORMS

  return f"NAME:FORM quantized, FORM one of {', '.join(FORMS)}"


def _unknown_bundled(name: str) -> str | None:
  """What is wrong with a bundled model's name (NAME or NAME:FORM), or None."""
  from aot.models import NAMES
  from aot.models.quantized import FORMS

  base, _, form = name.partition(":")
  if base in NAMES and (not form or form in FORMS):
    return None
  hint = "; onnx's light models go as arguments (light:NAME), not --models" if base == "light" else ""
  return f"unknown model {name!r}: the bundled models are {', '.join(NAMES)} ({_forms()}){hint}"


def _unknown_model(models: str, onnx_args: list[str]) -> str | None:
  """What is wrong with the models asked for, before anything is compiled (a wrong name had been a traceback at its
  turn, minutes into a run), or None."""
  from aot.models.quantized import FORMS

  # (--dynamic's NAME:sequence: a bundled model with its sequence symbolic, aot/tools/dynamic_bench.py)
  for name in [m.removesuffix(":sequence").removesuffix(":batch+sequence") for m in models.split(",") if m]:
    if (problem := _unknown_bundled(name)) is not None:
      return f"--models: {problem}"
  for path in onnx_args:
    if path.startswith("models:"):
      # (the profiler's: a bundled model by name)
      if (problem := _unknown_bundled(path.removeprefix("models:"))) is not None:
        return problem
    elif path.startswith("light:"):
      base, _, form = path.removeprefix("light:").partition(":")
      if base not in LIGHT_MODELS or (form and form not in FORMS):
        return f"unknown model {path!r}: onnx's light models are {', '.join(LIGHT_MODELS)} ({_forms()})"
    elif path.startswith("real:"):
      if path.removeprefix("real:") not in REAL_MODELS:
        return f"unknown model {path!r}: the real models are {', '.join(REAL_MODELS)}"
    elif not Path(path).is_file():
      return f"{path}: no such ONNX file"
  return None


def _reference_form(name: str):
  """The ONNX form of bundled model NAME, or for NAME:FORM that form quantized by onnxruntime's quantizer."""
  from aot.models.onnx_forms import onnx_model

  base, _, form = name.partition(":")
  if not form:
    return onnx_model(base)
  from aot.models.quantized import quantized

  return quantized(onnx_model(base), form)


def _profile_arg(what: str, models_dir: Path | None):
  """A model to profile: models:NAME (the Tensor form), models:NAME:FORM (its ONNX form quantized), or _onnx_arg's."""
  if not what.startswith("models:"):
    return _onnx_arg(what, models_dir)[1]
  name = what[len("models:") :]
  return _reference_form(name) if ":" in name else what


def _profile(models: list[str], targets, threads: list[int], args) -> int:
  """Profile builds of each model for each target and thread count: the tables, and with --json all of them."""
  import onnx

  import aot
  from aot.check import random_inputs
  from aot.tools.profile import cpu_speedup, format_nodes, onnxruntime_nodes, profile_and_report

  if not models:
    raise SystemExit(
      "python -m aot.tools.bench --profile: name the models to profile (models:NAME, models:NAME:FORM, a file, "
      "light:NAME, light:NAME:FORM)"
    )
  profiles = []
  for what in models:
    model = _profile_arg(what, args.models_dir)
    for t in targets:
      out = Path(tempfile.mkdtemp(prefix=f"profile_{t}_"))
      art = aot.compile_model(model, target=t, out_dir=out, profile=True)
      xs = random_inputs(art.at_size()[0], indexed=art.indexed_inputs)
      one = None
      for n in threads:
        p = profile_and_report(art, out / "profile.json", n, args.budget, args.top, len(threads) > 1, xs)
        if isinstance(model, onnx.ModelProto):
          # (the anchor's layers beside our calls: which of ours loses, against which of its nodes)
          p["onnxruntime"] = onnxruntime_nodes(model, xs, n, args.budget)
          print(format_nodes(p["onnxruntime"], n, args.top))
        profiles.append({"what": what, **p})
        one = p if n == 1 else one
        if one and n > 1:
          # from thread CPU times, so that a loaded machine (whose wall-clock speedups mean little) still tells
          print(
            f"{n} threads: {cpu_speedup(one, p):.2f}x as fast as 1 on free cores (from thread CPU times), doing "
            f"{p['cpu_all_ms'] / one['cpu_all_ms']:.2f}x the work"
          )
        print()
  if args.json:
    Path(args.json).write_text(json.dumps(profiles, indent=1))
  return 0


def _export_real(args: list[str], models_dir: Path | None):
  """Every real:NAME asked for exported (or found cached) before anything is timed: a missing torch is one line, not
  a traceback minutes into a run."""
  for what in [a for a in args if a.startswith("real:")]:
    try:
      real_model_path(what.removeprefix("real:"), models_dir)
    except RealModelError as e:
      raise SystemExit(f"python -m aot.tools.bench: {e}") from None


def _replace_between(path: Path, marker: str, text: str):
  """The file's text between <!-- marker:start --> and <!-- marker:end --> becomes text."""
  import re

  if not path.is_file():
    raise SystemExit(f"{path}: no such file to write the bench's tables into")
  new, found = re.subn(
    rf"(<!-- {marker}:start -->\n).*?(<!-- {marker}:end -->)",
    lambda m: m.group(1) + text + "\n" + m.group(2),
    path.read_text(),
    flags=re.S,
  )
  if not found:
    raise SystemExit(f"{path}: no <!-- {marker}:start --> ... <!-- {marker}:end --> markers to write between")
  path.write_text(new)


def _openblas() -> str:
  # OPENBLAS_CORETYPE pins numpy's BLAS to an older kernel on some machines (and slows it): say which one ran
  core = os.environ.get("OPENBLAS_CORETYPE")
  return f"core type forced to {core}: numpy is slower than it can be" if core else "core type auto-detected"


if __name__ == "__main__":
  sys.exit(main())
