"""A seeded differential fuzzer: random small ONNX graphs, compiled with aot and compared with onnxruntime.

  python -m aot.tools.fuzz --seed S --n N [--target c|llvm] [--cc COMPILER] [--case I] [--save DIR]

Case i of seed S is drawn from numpy's Generator seeded with (S, i) alone, so any case reproduces by itself
(`--case I`). Cases are compiled BATCH to a model (one graph holding every case's nodes and outputs), since the C
build is most of a compile's time; a batch that fails to compile or run is retried case by case to name the cases at
fault. Tolerances follow each value's history: a value the generator knows to be exact (integers, and floats on a grid
of 2**-grain small enough that every sum and product is representable) must match bit for bit; a rounded one within
RTOL of the magnitudes its rounding errors scale with, measured on onnxruntime's own intermediate values."""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import onnx
from onnx import helper, numpy_helper

from aot.tools.fuzz_cases import Case, merged
from aot.tools.fuzz_graphs import generate

# cases per compiled model: the C build is most of a compile's time. CPU per 96 cases on c with an empty build cache:
# 5.4 s in batches of 12, 4.4 s of 24, 3.6 s of 48; a smaller batch is cheaper to retry case by case when it fails
BATCH = 24
# relative tolerance of rounded values, by the lowest precision in their history
RTOL = {"float32": 1e-4, "float16": 1e-2}

# *** running and comparing ***


def graph_text(case: Case) -> str:
  # printable_graph names initializers without printing their values (onnx.printer.to_text, its successor, prints them)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    return helper.printable_graph(case.model().graph)


@dataclass
class Failure:
  case: Case
  target: str
  kind: str  # "mismatch", "compile", "run", "reference"
  message: str
  # the C compiler the case was built with ($CC), when one was named
  cc: str | None = None

  def report(self) -> str:
    c = self.case
    on, again = (f", cc {self.cc}", f" --cc {self.cc}") if self.cc else ("", "")
    return (
      f"FAIL seed {c.seed} case {c.index} (target {self.target}{on}): {self.kind}\n{c.describe()}\n"
      f"{graph_text(c)}\n{self.message}\n"
      f"reproduce: python -m aot.tools.fuzz --seed {c.seed} --case {c.index} --target {self.target}{again}"
    )

  def save(self, folder: Path) -> Path:
    """The case as an ONNX model, its inputs (.npz) and the report, in folder; returns the model's path."""
    folder.mkdir(parents=True, exist_ok=True)
    stem = folder / f"fuzz_seed{self.case.seed}_case{self.case.index}_{self.target}{f'_{self.cc}' if self.cc else ''}"
    onnx.save(self.case.model(), f"{stem}.onnx")
    np.savez(f"{stem}_inputs.npz", **self.case.feeds)
    Path(f"{stem}.txt").write_text(self.report() + "\n")
    return Path(f"{stem}.onnx")


def compare(got: np.ndarray, want: np.ndarray, exact: bool, rtol: float, scale: float) -> str | None:
  """Why got is not want, or None. NaN must meet NaN and an infinity the same infinity; finite values must be equal
  when exact, else within rtol * (|want| + scale), scale being the magnitude rounding errors grew with."""
  got, want = np.asarray(got), np.asarray(want)
  if got.shape != want.shape:
    return f"shape {got.shape}, onnxruntime {want.shape}"
  if got.dtype != want.dtype:
    return f"dtype {got.dtype}, onnxruntime {want.dtype}"
  if want.dtype.kind not in "fc":
    bad = got != want
    tol = np.zeros(want.shape)
  else:
    g, w = got.astype(np.float64), want.astype(np.float64)
    nan = np.isnan(g) != np.isnan(w)
    inf = (np.isinf(g) | np.isinf(w)) & ~(g == w)
    finite = np.isfinite(g) & np.isfinite(w)
    tol = np.zeros(want.shape) if exact else rtol * (np.abs(w) + scale)
    with np.errstate(invalid="ignore"):  # inf - inf, where finite is False anyway
      bad = nan | inf | (finite & (np.abs(g - w) > tol))
  if not bad.any():
    return None
  i = tuple(int(j) for j in np.argwhere(bad)[0])
  with np.errstate(invalid="ignore"):  # inf - inf
    diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
  worst = f", max |diff| {np.nanmax(np.where(bad, diff, 0)):.3g}"
  return (
    f"{int(bad.sum())} of {bad.size} elements differ{worst}; first at {list(i)}: got {got[i]!r}, "
    f"onnxruntime {want[i]!r} (tolerance {'exact' if exact else f'{float(tol[i]):.3g}'})"
  )


def reference(cases: list[Case]) -> dict[str, np.ndarray]:
  """onnxruntime's value of every input, constant and node output of the cases."""
  import onnxruntime as ort

  ort.set_default_logger_severity(3)
  opts = ort.SessionOptions()
  opts.intra_op_num_threads = opts.inter_op_num_threads = 1
  # its graph rewrites are not the reference: the ops' own kernels are
  opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
  model = merged(cases, extra_outputs=True)
  sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
  feeds = {k: v for c in cases for k, v in c.feeds.items()}
  env = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
  env.update(feeds)
  env.update({t.name: numpy_helper.to_array(t) for c in cases for t in c.inits})
  return env


def compiled(cases: list[Case], target: str, folder: Path) -> dict[str, np.ndarray]:
  """The artifact's outputs for the cases, compiled as one model."""
  import aot

  art = aot.compile_model(merged(cases), target=target, out_dir=folder)
  feeds = {k: v for c in cases for k, v in c.feeds.items()}
  model = aot.load(art, threads=1)
  try:
    outs = model(*[feeds[t.name] for t in art.inputs])
  finally:
    model.close()
  outs = outs if isinstance(outs, tuple) else (outs,)
  return dict(zip([t.name for t in art.outputs], outs))


def check(case: Case, got: dict, env: dict, target: str) -> Failure | None:
  problems = []
  for v in case.outputs:
    scale = v.err(env)
    why = compare(
      got[v.name],
      env[v.name],
      v.grain is not None,
      RTOL["float16" if v.lowp else v.dtype] if v.is_float else 0.0,
      scale,
    )
    if why:
      problems.append(f"output {v.name} ({v.dtype}{list(v.shape)}): {why}")
  return Failure(case, target, "mismatch", "\n".join(problems)) if problems else None


def _first_lines(e: Exception, n: int = 6) -> str:
  text = f"{type(e).__name__}: {e}".strip().splitlines()
  return "\n".join(text[:n]) + ("\n..." if len(text) > n else "")


def run_batch(cases: list[Case], target: str, folder: Path) -> list[Failure]:
  """Compile and check the cases as one model; when that fails as a whole, one case at a time."""
  try:
    env = reference(cases)
  except Exception as e:
    if len(cases) > 1:
      return [f for c in cases for f in run_batch([c], target, folder)]
    return [Failure(cases[0], target, "reference", f"onnxruntime rejects the case (a fuzzer bug): {_first_lines(e)}")]
  try:
    got = compiled(cases, target, folder / f"b{cases[0].index}_{len(cases)}")
  except Exception as e:
    if len(cases) > 1:
      return [f for c in cases for f in run_batch([c], target, folder)]
    return [Failure(cases[0], target, "compile or run", _first_lines(e))]
  failures = [f for c in cases if (f := check(c, got, env, target))]
  if len(cases) > 1:
    # a mismatch is reported as the case alone gives it (or said to need its batch)
    alone = []
    for f in failures:
      again = run_batch([f.case], target, folder)
      alone += again or [Failure(f.case, target, f.kind, f.message + "\n(only in a batch: alone, the case matches)")]
    failures = alone
  return failures


@contextlib.contextmanager
def c_compiler(cc: str | None) -> Iterator[None]:
  """$CC set to cc while the block runs (the build reads it: aot/build.py's cc), then as it was; None: unchanged."""
  if cc is None:
    yield
    return
  before = os.environ.get("CC")
  os.environ["CC"] = cc
  try:
    yield
  finally:
    if before is None:
      del os.environ["CC"]
    else:
      os.environ["CC"] = before


def fuzz(
  seed: int,
  n: int,
  target: str = "c",
  start: int = 0,
  batch: int = BATCH,
  say: Callable[[str], None] | None = None,
  cc: str | None = None,
) -> list[Failure]:
  """Cases start .. start+n-1 of seed, compiled for target (its C built by cc, else the default compiler) and compared
  with onnxruntime; the failures."""
  failures: list[Failure] = []
  with tempfile.TemporaryDirectory(prefix="aot_fuzz_") as tmp, c_compiler(cc):
    for lo in range(start, start + n, batch):
      cases = [generate(seed, i) for i in range(lo, min(lo + batch, start + n))]
      found = run_batch(cases, target, Path(tmp))
      for f in found:
        f.cc = cc
      failures += found
      if say:
        say(f"cases {lo}..{lo + len(cases) - 1}: {len(found)} failed")
  return failures


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(prog="python -m aot.tools.fuzz", description=__doc__.splitlines()[0])
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--n", type=int, default=100, help="cases to run (default 100)")
  p.add_argument("--start", type=int, default=0, help="first case index (default 0)")
  p.add_argument("--case", type=int, help="run only this case of the seed")
  p.add_argument("--target", choices=["c", "llvm"], default="c")
  p.add_argument(
    "--cc",
    metavar="COMPILER",
    help="the C compiler to build with (gcc, clang-14, ...; default: $CC, else the newest clang on PATH, else gcc)",
  )
  p.add_argument("--batch", type=int, default=BATCH, help=f"cases per compiled model (default {BATCH})")
  p.add_argument("--save", type=Path, metavar="DIR", help="write each failing case's model, inputs and report here")
  p.add_argument("--show", action="store_true", help="print the cases' graphs (with --case: the one case)")
  p.add_argument("-q", "--quiet", action="store_true", help="print only failures and the summary")
  args = p.parse_args(argv)
  if args.cc is not None and not shutil.which(args.cc):
    p.error(f"--cc {args.cc}: no such compiler on PATH")
  start, n = (args.case, 1) if args.case is not None else (args.start, args.n)
  if args.show:
    for i in range(start, start + n):
      c = generate(args.seed, i)
      print(f"seed {args.seed} case {i}\n{c.describe()}\n{graph_text(c)}\n")
  t0 = time.perf_counter()
  say = None if args.quiet else lambda s: print(s, flush=True)
  failures = fuzz(args.seed, n, args.target, start, args.batch, say, args.cc)
  for f in failures:
    print("\n" + f.report())
    if args.save:
      print(f"saved: {f.save(args.save)}")
  print(
    f"\n{n - len({f.case.index for f in failures})}/{n} cases match onnxruntime (seed {args.seed}, target "
    f"{args.target}{f', cc {args.cc}' if args.cc else ''}, {time.perf_counter() - t0:.1f} s)"
  )
  return 1 if failures else 0


if __name__ == "__main__":
  sys.exit(main())
