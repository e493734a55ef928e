"""`python -m aot.tools.bench --dynamic`: an artifact compiled once for a range of a dim (--shape batch=LO..HI, or
sequence=LO..HI: one that attention mixes, frontends/extent_dims.py), timed at sizes across the range against a
static compile at each size and against onnxruntime, in one process, interleaved, one thread. The bundled reference
models' ONNX forms with a symbolic batch or sequence (models/onnx_forms.py)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

# per model: the dim given a range, the range, and the sizes timed (the bounds, an odd prime between); NAME:sequence
# has its axis 1 symbolic, NAME:batch+sequence both, NAME:dynamic:... is onnxruntime's quantize_dynamic of it
# (models/quantized.py); real:NAME are the bench's real models (aot/tools/real_models.py,
# exported from torch with a symbolic batch or sequence: the bench extra). Two dims: their names, ranges and sizes
DYNAMIC_MODELS = {
  "mlp": ("batch", (1, 64), (1, 7, 64)),
  "mnist": ("batch", (1, 64), (1, 7, 64)),
  "resnet18": ("batch", (1, 16), (1, 5, 16)),
  "transformer": ("batch", (1, 8), (1, 3, 8)),
  "transformer:sequence": ("sequence", (1, 128), (1, 61, 128)),
  "transformer:batch+sequence": (("batch", "sequence"), ((1, 4), (1, 128)), ((1, 1), (3, 61), (4, 128))),
  "transformer:dynamic:sequence": ("sequence", (1, 128), (1, 61, 128)),
  "real:bert6": ("batch", (1, 8), (1, 3, 8)),
  "real:bert6:sequence": ("sequence", (1, 256), (1, 7, 61, 128, 256)),
  "real:bert6:batch+sequence": (
    ("batch", "sequence"),
    ((1, 8), (1, 256)),
    ((1, 1), (3, 7), (8, 61), (2, 256), (8, 256)),
  ),
  "real:yolov8n": ("batch", (1, 4), (1, 3, 4)),
  # a text line's width through convolutions and pools, 4 columns a step
  "real:crnn_ctc:width": ("width", (32, 640), (32, 160, 331, 640)),
  # the same with its two bidirectional LSTM layers over the steps (width / 4 of them at a run)
  "real:crnn:width": ("width", (32, 640), (32, 160, 331, 640)),
}
# a token id input's values: below the smallest vocabulary of the models above
TOKEN_IDS = 1000


def _input_at(info, at: dict) -> np.ndarray:
  """A seeded input of onnxruntime's NodeArg info with its ranged dims at their sizes in at (another symbolic dim at
  1): token ids for an integer one."""
  shape = [at.get(d, 1) if isinstance(d, str) else d for d in info.shape]
  rng = np.random.default_rng(sum(at.values()))
  if "int" in info.type:
    return rng.integers(0, TOKEN_IDS, shape).astype(np.int64)
  return rng.standard_normal(shape).astype(np.float32)


def _model_path(name: str, dims: tuple, tmp: Path, models_dir: Path | None) -> Path:
  from aot.models.onnx_forms import onnx_model, with_batch_dim
  from aot.tools.real_models import real_model_path

  base = name.removeprefix("real:").split(":")[0]
  if name.startswith("real:"):
    return real_model_path(base, models_dir, **{d: True for d in dims})
  model = onnx_model(base)
  if "batch" in dims:
    model = with_batch_dim(model)
  if "sequence" in dims:
    for vi in list(model.graph.input) + list(model.graph.output):
      vi.type.tensor_type.shape.dim[1].dim_param = "sequence"
  if ":dynamic:" in name:
    from aot.models.quantized import quantized

    model = quantized(model, "dynamic")
  path = tmp / f"{name.replace(':', '_')}.onnx"
  path.write_bytes(model.SerializeToString())
  return path


def _compiled_cold(path: Path, shapes: dict, out_dir: Path):
  """The artifact compiled in a process of its own, with no compile cache (as a user's first compile: the static
  compiles after a dynamic one in this process would find its runtime objects built), and the compile's seconds."""
  import json
  import subprocess
  import sys

  from aot.artifact import Artifact

  script = (
    "import json, sys, time, aot; t = time.perf_counter(); "
    "aot.compile_model(sys.argv[1], shapes=json.loads(sys.argv[2]), out_dir=sys.argv[3], cache=False); "
    "print(time.perf_counter() - t)"
  )
  done = subprocess.run(
    [sys.executable, "-c", script, str(path), json.dumps(shapes), str(out_dir)], capture_output=True, text=True
  )
  if done.returncode:
    raise RuntimeError(f"compiling {path.name} with {shapes} failed:\n{done.stderr}")
  return Artifact(out_dir), float(done.stdout.split()[-1])


def dynamic_rows(names: list[str], repeats: int, budget_s: float, models_dir: Path | None = None) -> list[dict]:
  """One row per model and size: the dynamic artifact's time over the static one's and over onnxruntime's, the
  kernel counts, and both compile times."""
  import aot
  from aot.tools.anchors import ort_session
  from aot.tools.bench import _time

  rows = []
  with tempfile.TemporaryDirectory(prefix="aot_dynamic_bench_") as tmp:
    for name in names:
      dims, ranges, sizes = DYNAMIC_MODELS[name]
      if isinstance(dims, str):
        dims, ranges, sizes = (dims,), (ranges,), tuple((n,) for n in sizes)
      path = _model_path(name, dims, Path(tmp), models_dir)
      folder = Path(tmp) / f"{name}_dyn".replace(":", "_").replace("+", "_")
      dyn_art, dyn_s = _compiled_cold(path, dict(zip(dims, ranges)), folder)
      sess = ort_session(path, 1)
      with aot.load(dyn_art, threads=1) as dyn:
        for n in sizes:
          at = dict(zip(dims, n))
          st_art, st_s = _compiled_cold(path, at, folder.with_name(f"{folder.name}_{'x'.join(map(str, n))}"))
          feed = {i.name: _input_at(i, at) for i in sess.get_inputs()}
          with aot.load(st_art, threads=1) as st:
            got, want = dyn(feed), sess.run(None, feed)[0]
            fns = {
              "dynamic": lambda: dyn(feed),
              "static": lambda: st(feed),
              "onnxruntime": lambda: sess.run(None, feed),
            }
            t = _time(fns, repeats, budget_s)
          rows.append(
            {
              "model": name,
              "range": ",".join(f"{d}={lo}..{hi}" for d, (lo, hi) in zip(dims, ranges)),
              "size": "x".join(map(str, n)),
              "dynamic ms": round(t["dynamic"] * 1e3, 3),
              "static ms": round(t["static"] * 1e3, 3),
              "dyn/static": round(t["dynamic"] / t["static"], 3),
              "dyn/ort": round(t["dynamic"] / t["onnxruntime"], 3),
              "kernels dyn/static": f"{dyn_art.num_kernels}/{st_art.num_kernels}",
              "compile s dyn/static": f"{dyn_s:.1f}/{st_s:.1f}",
              "max rel err vs ort": float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30)),
            }
          )
          print(rows[-1], flush=True)
  return rows
