"""`python -m aot.tools.bench --scale GB`: how the compiler copes with big weights. It writes an MLP with GB of float32
weights in ONNX external data (layers of width x width MatMul + Add + Tanh, batch 4) one layer at a time, compiles it
in a subprocess (so its peak RSS is the compiler's alone), then reports compile time, that peak, the artifact's size,
the time of NAME_create, and the output against onnxruntime."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

MLP_WIDTH = 4096  # 64 MB of float32 weights per layer
MLP_BATCH = 4


def write_external_mlp(
  path: Path, weight_bytes: int, width: int = MLP_WIDTH, seed: int = 0, data_dir: Path | None = None
) -> Path:
  """An ONNX MLP at path with about weight_bytes of float32 weights in external data (data_dir/NAME.data, beside the
  model unless given), written layer by layer so that no more than one layer is ever in memory. Returns the path."""
  from onnx import TensorProto, helper

  layers = max(1, round(weight_bytes / (width * width * 4)))
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  data_dir = Path(data_dir) if data_dir is not None else path.parent
  data_dir.mkdir(parents=True, exist_ok=True)
  data = data_dir / f"{path.stem}.data"
  location = os.path.relpath(data, path.parent)  # ONNX wants the location relative to the model
  rng = np.random.default_rng(seed)
  inits, nodes, offset = [], [], 0
  with open(data, "wb") as f:

    def external(name: str, x: np.ndarray) -> TensorProto:
      nonlocal offset
      t = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=x.shape)
      f.write(x.tobytes())
      t.data_location = TensorProto.EXTERNAL
      for k, v in (("location", location), ("offset", str(offset)), ("length", str(x.nbytes))):
        t.external_data.add(key=k, value=v)
      offset += x.nbytes
      return t

    x = "x"
    for i in range(layers):
      # weights scaled so the activations stay of order one through the tanh chain
      w = (rng.standard_normal((width, width), dtype=np.float32) / np.float32(np.sqrt(width))).astype(np.float32)
      inits += [external(f"w{i}", w), external(f"b{i}", rng.standard_normal(width, dtype=np.float32) * 0.1)]
      del w
      nodes += [
        helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"]),
        helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"]),
        helper.make_node("Tanh", [f"a{i}"], [f"y{i}"]),
      ]
      x = f"y{i}"
  graph = helper.make_graph(
    nodes,
    "scale_mlp",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [MLP_BATCH, width])],
    [helper.make_tensor_value_info(x, TensorProto.FLOAT, [MLP_BATCH, width])],
    initializer=inits,
  )
  model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
  path.write_bytes(model.SerializeToString())
  return path


# run in the subprocess: compile, then report the compiler's own numbers on one JSON line; start_rss is the process
# with the compiler imported and llvmlite's target loaded, before the model is read. The peak is VmHWM (this process's
# own address space), not ru_maxrss: Linux carries ru_maxrss over fork and exec, so a child of a big pytest worker
# reported the worker's peak (2.1 GB over start after the parent had touched 2 GB, against 32 MB alone)
_COMPILE = """
import json, re, resource, sys, time
import aot, aot.compiler, aot.frontends.onnx, aot.frontends.onnx_ops
from aot.codegen.lower.contract import gemm_tile
gemm_tile("native", None)
start = int(open("/proc/self/statm").read().split()[1]) * resource.getpagesize()
t = time.perf_counter()
art = aot.compile_model(sys.argv[1], out_dir=sys.argv[2], cache=False)
print(json.dumps({"compile_s": time.perf_counter() - t, "start_rss": start,
                  "peak_rss": int(re.search(r"VmHWM:\\s*(\\d+) kB", open("/proc/self/status").read())[1]) * 1024}))
"""


def compile_in_subprocess(model: Path, out: Path) -> dict:
  """compile_s, start_rss and peak_rss (bytes) of compiling model into out in a fresh Python process."""
  r = subprocess.run([sys.executable, "-c", _COMPILE, str(model), str(out)], capture_output=True, text=True)
  if r.returncode != 0:
    raise RuntimeError(f"compiling {model} failed:\n{r.stderr[-4000:]}")
  return json.loads(r.stdout.strip().splitlines()[-1])


def create_seconds(art, repeats: int = 3) -> float:
  """The fastest of a few NAME_create calls (each instance destroyed after), the library loaded once."""
  from aot.loader import load

  m = load(art)
  create, destroy = getattr(m.lib, f"{art.name}_create"), getattr(m.lib, f"{art.name}_destroy")
  best = float("inf")
  for _ in range(repeats):
    out = m.ffi.new(f"{art.name}_model **")
    t = time.perf_counter()
    status = create(out)
    best = min(best, time.perf_counter() - t)
    if status != 0:
      raise RuntimeError(f"{art.name}_create failed: {m.ffi.string(m._last_error(m.ffi.NULL)).decode()}")
    destroy(out[0])
  m.close()
  return best


def scale(gb: float, keep: bool = False) -> dict:
  """Write, compile and check the MLP of gb GB of weights; one row of numbers."""
  import shutil

  import onnxruntime as ort

  from aot.artifact import Artifact
  from aot.loader import load

  work = Path(tempfile.mkdtemp(prefix="aot_scale_"))
  try:
    model = write_external_mlp(work / "mlp.onnx", int(gb * (1 << 30)))
    weights = sum(f.stat().st_size for f in work.glob("*.data"))
    r = compile_in_subprocess(model, work / "art")
    art = Artifact(work / "art")
    size = sum(f.stat().st_size for f in art.dir.rglob("*") if f.is_file())
    x = np.random.default_rng(1).standard_normal((MLP_BATCH, MLP_WIDTH), dtype=np.float32)
    m = load(art)
    got = m(x)
    m.close()
    so = ort.SessionOptions()
    so.log_severity_level = 3
    want = ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    return {
      "weights_gb": round(weights / (1 << 30), 3),
      "compile_s": round(r["compile_s"], 2),
      "peak_rss_gb": round(r["peak_rss"] / (1 << 30), 3),
      "rss_over_start_gb": round((r["peak_rss"] - r["start_rss"]) / (1 << 30), 3),
      "artifact_gb": round(size / (1 << 30), 3),
      "create_ms": round(create_seconds(art) * 1e3, 2),
      "max_abs_err": float(np.max(np.abs(got - want))),
      **({"folder": str(work)} if keep else {}),
    }
  finally:
    if not keep:
      shutil.rmtree(work, ignore_errors=True)
