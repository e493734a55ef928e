"""The fuzzer's random graphs (aot/tools/fuzz_graphs.py) with a ranged dim: every input's first dim (or --axis A),
where all of them share its size, made the symbolic dim 'batch' and compiled for 1..size+3. The compile must refuse
the dim with a CompileError (an op it cannot take, or the graph holds a constant shape) or give, at sizes 1, the
graph's own and the largest, what onnxruntime gives for the same model and inputs (each input's slices along the dim
repeated to the size). A dim no op mixes runs item by item (frontends/batch_dims.py), one that ops mix to the run's
size (frontends/extent_dims.py).

  python -m aot.tools.fuzz_batch --seed S --n N [--axis A]"""

from __future__ import annotations

import argparse
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import onnx

# the range compiled past the graph's own size: sizes that leave the one-item program's arena partly used
EXTRA = 3


def batched(model: onnx.ModelProto, axis: int = 0) -> int | None:
  """Mark dim axis of the model's inputs as 'batch', in place; the size it had, or None where the inputs do not all
  have it at one size (of at least 2: a dim of 1 broadcasts)."""
  ins = list(model.graph.input)
  if not ins or any(len(vi.type.tensor_type.shape.dim) <= axis for vi in ins):
    return None
  sizes = {vi.type.tensor_type.shape.dim[axis].dim_value for vi in ins}
  if len(sizes) != 1 or sizes == {1}:
    return None
  (size,) = sizes
  for vi in ins:
    vi.type.tensor_type.shape.dim[axis].dim_param = "batch"
  for vi in model.graph.output:
    vi.type.tensor_type.ClearField("shape")  # (onnxruntime infers them at each size)
  return size


def check_case(seed: int, index: int, folder: Path, axis: int = 0) -> tuple[str, str]:
  """(outcome, details): skipped, refused, ok, or failed with why."""
  import onnxruntime as ort

  import aot
  from aot.errors import CompileError
  from aot.tools.fuzz import compare
  from aot.tools.fuzz_graphs import generate

  case = generate(seed, index)
  model = case.model()
  size = batched(model, axis)
  if size is None:
    return "skipped", ""
  try:
    art = aot.compile_model(model, shapes={"batch": (1, size + EXTRA)}, out_dir=folder / f"c{index}")
  except CompileError as e:
    return "refused", str(e)
  opts = ort.SessionOptions()
  opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
  sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
  problems = []
  with aot.load(art, threads=1) as m:
    for n in sorted({1, size, size + EXTRA}):
      feeds = {
        k: np.take(np.concatenate([x] * -(-n // size), axis=axis), range(n), axis=axis) for k, x in case.feeds.items()
      }
      try:
        want = sess.run(None, feeds)
      except Exception:  # noqa: BLE001  (onnxruntime's own limits at a size: a Resize of 5-D inputs)
        continue
      got = m(feeds)
      for o, g, w in zip(sess.get_outputs(), got if isinstance(got, tuple) else (got,), want):
        scale = float(np.abs(w).max()) if w.size and w.dtype.kind == "f" else 0.0
        if why := compare(g, w, False, 1e-3, scale):
          problems.append(f"size {n}, output {o.name}: {why}")
  return ("failed", "\n".join(problems)) if problems else ("ok", "")


def fuzz_batch(seed: int, n: int, axis: int = 0) -> tuple[Counter, list[str]]:
  """The outcomes of n cases of seed, and a report of each that failed."""
  counts, failures = Counter(), []
  with tempfile.TemporaryDirectory(prefix="aot_fuzz_batch_") as d:
    for i in range(n):
      outcome, why = check_case(seed, i, Path(d), axis)
      counts[outcome] += 1
      if outcome == "failed":
        failures.append(f"seed {seed} case {i}:\n{why}")
  return counts, failures


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(prog="python -m aot.tools.fuzz_batch", description=__doc__.split("\n\n")[0])
  ap.add_argument("--seed", type=int, default=1)
  ap.add_argument("--n", type=int, default=96)
  ap.add_argument("--axis", type=int, default=0, help="the inputs' dim given the range")
  args = ap.parse_args(argv)
  counts, failures = fuzz_batch(args.seed, args.n, args.axis)
  print("\n\n".join(failures))
  print(", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
  return 1 if failures else 0


if __name__ == "__main__":
  raise SystemExit(main())
