"""The profiler: where a model's run goes, call by call.

A profile build (compile_model(..., profile=True), `compile-model --profile`, `python -m aot.tools.bench --profile`)
times every call of model.c's kernel list with clock_gettime into its instance and exports NAME_profile to read the
sums; a normal build renders none of that (its model.c, and so its cache entry, differ). Each call describes itself
(codegen/lower/calls.py: Call.describe, into the build's CALLS_FILE); it is one of:
- the runtime's microkernel over a contraction ("microkernel"),
- the runtime's depthwise convolution, with its epilogue after each task's planes when fused ("direct"),
- a generated kernel: a dense operand's copy (im2col), an epilogue, or a whole kernel; "copy" when it does no
  floating-point arithmetic (data movement only), else "loop" (generated loops).
The table gives each call's share of the run, its time, GFLOP/s and the bytes of the buffers it reads and writes, by
the schedule kernel it belongs to. Flops are those the call executes (a contraction's 2 B M N K, a loop's
flop_count), which is more than the model needs where a kernel computes values it then drops.

Beside it, for an ONNX model, the bench prints onnxruntime's own per-node times on the same inputs (its session
profiling: onnxruntime_nodes), so that a kernel that loses can be named against the anchor's layer."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from aot.codegen.lower.calls import CALLS_FILE, CallInfo
from aot.loader import dim_sizes

# runs after warm-up: at least MIN_RUNS, more while they fit in the budget, at most MAX_RUNS
WARMUP_RUNS, MIN_RUNS, MAX_RUNS = 2, 3, 50


def load_calls(art) -> list[CallInfo]:
  path = art.dir / "src" / CALLS_FILE
  if not path.exists():
    raise ValueError(
      f"{art.dir} is not a profile build (no src/{CALLS_FILE}): compile it with profile=True or --profile"
    )
  return [CallInfo(**d) for d in json.loads(path.read_text())]


def profile_artifact(
  art, inputs: list[np.ndarray] | None = None, threads: int = 1, budget_s: float = 5.0, cpu: bool = False
) -> dict:
  """Run a profile build on seeded inputs (warm-up, then MIN_RUNS..MAX_RUNS runs within budget_s) and return the
  profile: per call its mean time and share of the run, GFLOP/s and bytes, sorted by time, the run's total as the
  library timed it, and wall_ms, the time per call from Python (the total plus the call's own overhead).
  cpu: time each call in thread CPU time too (cpu_ms: on its busiest thread; cpu_all_ms: on all), which a loaded
  machine inflates far less than wall time; it adds two clock reads (system calls) between calls."""
  import aot
  from aot.check import random_inputs

  infos = load_calls(art)
  model = aot.load(art, threads=threads)
  try:
    # (an artifact with a batch range at its largest size)
    xs = inputs if inputs is not None else random_inputs(art.at_size()[0], indexed=art.indexed_inputs)
    # the library the model was loaded from (by its path, dlopen could return an older build's: aot/loader.py)
    model.ffi.cdef(
      f"int {art.name}_profile({art.name}_model *m, double *out, int n);"
      f"int {art.name}_profile_cpu({art.name}_model *m, int on);"
    )
    read = getattr(model.lib, f"{art.name}_profile")
    handle = model._model
    if cpu:
      getattr(model.lib, f"{art.name}_profile_cpu")(handle, 1)
    # per call: wall seconds, then (after the run's) thread CPU seconds on its busiest thread and on all its threads
    sums = model.ffi.new("double[]", 3 * len(infos) + 1)
    for _ in range(WARMUP_RUNS):
      model(*xs)
    if read(handle, model.ffi.NULL, 0) != 0:
      raise RuntimeError(f"{art.name}_profile failed")
    runs, wall = _timed_runs(lambda: model(*xs), budget_s)
    if read(handle, sums, len(sums)) != 0:
      raise RuntimeError(f"{art.name}_profile failed")
  finally:
    model.close()
  n = len(infos)
  total = sums[n] / runs
  rows, items = [], _items(art, xs)
  for i, one in enumerate(infos):
    info = replace(one, flops=one.flops * items, bytes=one.bytes * items)
    s = sums[i] / runs
    rows.append(
      {
        **asdict(info),
        "call": i,
        "ms": s * 1e3,
        "share": s / total if total else 0.0,
        "gflops": info.flops / s / 1e9 if s else 0.0,
        "gb_per_s": info.bytes / s / 1e9 if s else 0.0,
        "cpu_ms": sums[n + 1 + i] / runs * 1e3,
        "cpu_all_ms": sums[2 * n + 1 + i] / runs * 1e3,
      }
    )
  rows.sort(key=lambda r: -r["ms"])
  by_path = {}
  for r in rows:
    by_path[r["path"]] = by_path.get(r["path"], 0.0) + r["ms"]
  flops = sum(i.flops for i in infos) * items
  p = {
    "model": art.name,
    "target": art.target,
    "threads": threads,
    "runs": runs,
    "total_ms": total * 1e3,
    "wall_ms": wall * 1e3,
    "calls_ms": sum(r["ms"] for r in rows),
    "gflop": flops / 1e9,
    "gflops": flops / total / 1e9 if total else 0.0,
    "by_path_ms": by_path,
    "calls": rows,
    # thread CPU time, which a loaded machine does not inflate as it does wall time: the calls' busiest threads
    # (the run on as many free cores) and all their threads (the work, with what splitting adds to it)
    "cpu_ms": sum(r["cpu_ms"] for r in rows),
    "cpu_all_ms": sum(r["cpu_all_ms"] for r in rows),
  }
  return p | thread_bound(p, BOUND_THREADS) if threads == 1 else p


def _timed_runs(call, budget_s: float) -> tuple[int, float]:
  """call() MIN_RUNS to MAX_RUNS times, more while they fit in budget_s: how many times, and the seconds per call."""
  runs, t0 = 0, time.perf_counter()
  while runs < MIN_RUNS or (runs < MAX_RUNS and time.perf_counter() < t0 + budget_s):
    call()
    runs += 1
  return runs, (time.perf_counter() - t0) / runs


def _items(art, xs: list[np.ndarray]) -> int:
  """How many items of a batch range (a dim whose items run the one-item program: frontends/batch_dims.py) the
  inputs hold: a call describes its work for one item (and where a dim runs to its size in the program, for the
  dim's bound)."""
  sizes = dim_sizes(art, xs)
  return next((sizes[d["name"]] for d in art.dims if d["runs"] == "items"), 1)


# the thread count a 1-thread profile's Amdahl bound is given for
BOUND_THREADS = 2


def thread_bound(p: dict, threads: int) -> dict:
  """How fast `threads` threads could run a 1-thread profile's calls at best (load-independent, unlike timing them):
  a call that does not split runs whole on one thread, one that does takes the time of its biggest share of tasks
  (ceil(tasks / threads) of them, tasks taken as equal), and the time outside the calls stays serial.
  serial_share: of the run in calls that do not split (and outside the calls); uneven_share: lost to splits whose
  tasks do not share out evenly (3 tasks over 2 threads: one thread runs 2); bound: the speedup this allows."""
  rest = max(p["total_ms"] - p["calls_ms"], 0.0)
  serial = rest + sum(r["ms"] for r in p["calls"] if not r["parallel"])
  split = sum(r["ms"] * busiest_share(r, threads) for r in p["calls"] if r["parallel"])
  ideal = sum(r["ms"] for r in p["calls"] if r["parallel"]) / threads
  total = p["total_ms"]
  return {
    "bound_threads": threads,
    "serial_share": serial / total if total else 0.0,
    "uneven_share": (split - ideal) / total if total else 0.0,
    "bound": total / (serial + split) if serial + split else 1.0,
  }


# the paths whose tasks threads take from a shared counter as they finish (the rest split into one slice per thread)
SHARED_TASKS = ("microkernel", "int8 microkernel", "direct")


def cpu_speedup(one: dict, many: dict) -> float:
  """How much faster than `one` (a 1-thread profile timed with cpu=True) `many` (the same build on more threads,
  cpu=True)
  would run on free cores, from thread CPU times: a slice's CPU time does not grow while its thread waits for a core,
  so a split call takes its busiest slice; but where tasks go to whichever thread is running (SHARED_TASKS), a thread
  kept off its core leaves its tasks to the other, so such a call takes its threads' CPU time shared as its tasks
  allow (busiest_share)."""
  n = many["threads"]

  def took(r: dict) -> float:
    if r["parallel"] and r["path"] in SHARED_TASKS:
      return r["cpu_all_ms"] * busiest_share(r, n)
    return r["cpu_ms"]

  return one["cpu_ms"] / sum(took(r) for r in many["calls"])


def busiest_share(call: dict, threads: int) -> float:
  """The share of a split call's work its busiest thread does: a generated loop's iterations are cut into one slice per
  thread (ceil(tasks / threads) of them in the biggest); a contraction's tasks go to whichever thread is free first,
  so its edge blocks count at their size (the depthwise kernel's tasks, all of one size, share out as a slice's)."""
  work = call.get("task_work")
  if not work:
    return -(-call["tasks"] // threads) / call["tasks"]
  free = [0] * threads
  for w in work:
    free[free.index(min(free))] += w
  return max(free) / sum(work)


def format_profile(p: dict, top: int | None = None) -> str:
  """The profile as a table, slowest call first (tasks: how many it splits into, - when it runs on one thread), a
  total line, and for a 1-thread profile the bound on 2 threads (thread_bound)."""
  head = (
    f"{'share':>6} {'ms':>9} {'GFLOP/s':>8} {'MB':>8} {'GB/s':>6} {'tasks':>5}  {'path':<11} {'role':<11} "
    "kernel (function)"
  )
  lines = [
    f"{p['model']} (target {p['target']}, {p['threads']} thread{'s' if p['threads'] > 1 else ''}, "
    f"mean of {p['runs']} runs)",
    head,
  ]
  for r in p["calls"][:top]:
    gemm = f" {r['gemm'][0]}x{r['gemm'][1]}x{r['gemm'][2]}x{r['gemm'][3]} (BxMxNxK)" if r.get("gemm") else ""
    lines.append(
      f"{100 * r['share']:5.1f}% {r['ms']:9.3f} {r['gflops']:8.2f} {r['bytes'] / 1e6:8.2f} "
      f"{r['gb_per_s']:6.1f} {r['tasks'] if r['parallel'] else '-':>5}  {r['path']:<11} {r['role']:<11} "
      f"{r['kernel']} ({r['function']}){gemm}"
    )
  if top is not None and len(p["calls"]) > top:
    lines.append(f"  ... {len(p['calls']) - top} more calls")
  lines.append(
    f"total {p['total_ms']:.3f} ms per run ({p['calls_ms']:.3f} ms in {len(p['calls'])} calls), "
    f"{p['gflop']:.3f} GFLOP, {p['gflops']:.2f} GFLOP/s; by path: "
    + ", ".join(f"{k} {100 * v / p['total_ms']:.1f}%" for k, v in p["by_path_ms"].items())
  )
  if p["cpu_all_ms"]:
    lines.append(
      f"thread CPU time: {p['cpu_ms']:.3f} ms on the calls' busiest threads, {p['cpu_all_ms']:.3f} ms on all"
    )
  if "bound" in p:
    lines.append(
      f"on {p['bound_threads']} threads: {100 * p['serial_share']:.1f}% of the run does not split, "
      f"{100 * p['uneven_share']:.1f}% is lost to uneven splits; at best {p['bound']:.2f}x as fast as 1"
    )
  return "\n".join(lines)


def write_profile(p: dict, path: Path) -> None:
  Path(path).write_text(json.dumps(p, indent=1))


def profile_and_report(
  art,
  json_path: Path,
  threads: int = 1,
  budget_s: float = 5.0,
  top: int | None = None,
  cpu: bool = False,
  inputs: list[np.ndarray] | None = None,
) -> dict:
  """Profile a profile build, print the table, write the profile as JSON to json_path (compile-model and the bench)."""
  p = profile_artifact(art, inputs=inputs, threads=threads, budget_s=budget_s, cpu=cpu)
  print(format_profile(p, top))
  write_profile(p, json_path)
  return p


def onnxruntime_nodes(model, inputs: list[np.ndarray], threads: int = 1, budget_s: float = 2.0) -> list[dict]:
  """onnxruntime's time per node of its optimized graph (the bench's session: aot/tools/anchors.py ort_session), run
  on these inputs with its session profiling after warm-up: per node its op, name, input and output shapes, the
  median of its times in ms and its share of the nodes' sum, slowest first. model: a ModelProto or a path."""
  import tempfile

  from aot.tools.anchors import ort_session

  with tempfile.TemporaryDirectory(prefix="ort_profile_") as tmp:
    session = ort_session(model, threads, profile_prefix=str(Path(tmp) / "ort"))
    feed = {i.name: x for i, x in zip(session.get_inputs(), inputs)}
    for _ in range(WARMUP_RUNS):
      session.run(None, feed)
    _timed_runs(lambda: session.run(None, feed), budget_s)
    events = json.loads(Path(session.end_profiling()).read_text())
  times: dict[str, list[float]] = {}
  about: dict[str, dict] = {}
  shapes = lambda ts: [next(iter(t.values())) for t in ts or []]
  for e in events:
    if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
      name = e["name"].removesuffix("_kernel_time")
      times.setdefault(name, []).append(e["dur"] / 1e3)
      args = e.get("args", {})
      about[name] = {
        "op": args.get("op_name", "?"),
        "inputs": shapes(args.get("input_type_shape")),
        "outputs": shapes(args.get("output_type_shape")),
      }
  # (the warm-up runs are profiled too: the median over all runs)
  rows = [{"node": n, **about[n], "ms": float(np.median(t))} for n, t in times.items()]
  total = sum(r["ms"] for r in rows) or 1.0
  return sorted(({**r, "share": r["ms"] / total} for r in rows), key=lambda r: -r["ms"])


def format_nodes(rows: list[dict], threads: int, top: int | None = None) -> str:
  """onnxruntime_nodes as a table, slowest node first, and the nodes' sum."""
  lines = [
    f"onnxruntime, the same inputs ({threads} thread{'s' if threads > 1 else ''}, its session profiling, medians)",
    f"{'share':>6} {'ms':>9}  {'op':<20} node: input shapes -> output shapes",
  ]
  for r in rows[:top]:
    ins = ", ".join("x".join(map(str, s)) for s in r["inputs"])
    outs = ", ".join("x".join(map(str, s)) for s in r["outputs"])
    lines.append(f"{100 * r['share']:5.1f}% {r['ms']:9.3f}  {r['op']:<20} {r['node']}: {ins} -> {outs}")
  if top is not None and len(rows) > top:
    lines.append(f"  ... {len(rows) - top} more nodes")
  lines.append(f"total {sum(r['ms'] for r in rows):.3f} ms in {len(rows)} nodes")
  return "\n".join(lines)
