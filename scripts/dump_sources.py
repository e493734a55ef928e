"""Every target's generated sources for a fixed set of graphs, into one folder per (graph, variant): run it before and
after a refactoring that must not change what is generated, and `diff -r` the two folders.

  python scripts/dump_sources.py OUT [--jobs 2]

The graphs: the bundled reference models, their ONNX forms and onnxruntime-quantized forms, five of onnx's light
models (two quantized) and three seeds of the fuzzer's merged graphs. Sources come from `compile-model --emit source`
(c and llvm for every graph; the GPU targets, another CPU and a cross triple for some), and the profile and emulated
builds from compile_model, whose src/ is copied.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import onnx

BUNDLED = ("mlp", "mnist", "resnet18", "transformer")
LIGHT = ("squeezenet", "shufflenet", "inception_v1", "densenet121", "bvlc_alexnet")
LIGHT_INT8 = ("squeezenet:qdq", "shufflenet:qoperator")
QUANTIZED = ("resnet18:qdq", "resnet18:qoperator", "transformer:dynamic", "mnist:qdq")
FUZZ_SEEDS = (11, 12, 13)
FUZZ_CASES = 60
CPU_VARIANTS = (("--target", "c", "--cpu", "x86-64-v3"), ("--target", "c", "--triple", "aarch64-linux-gnu"))


def _graphs(folder: Path) -> dict[str, str]:
  """Each graph's name and what compile-model takes for it (models:NAME or an .onnx file written to folder)."""
  from aot.models.onnx_forms import onnx_model
  from aot.models.quantized import quantized
  from aot.tools.bench import _onnx_arg
  from aot.tools.fuzz_cases import merged
  from aot.tools.fuzz_graphs import generate

  graphs = {f"models-{n}": f"models:{n}" for n in BUNDLED}
  protos = {f"onnx-{n}": onnx_model(n) for n in BUNDLED}
  for q in QUANTIZED:
    base, form = q.split(":")
    protos[f"int8-{base}-{form}"] = quantized(onnx_model(base), form)
  for n in LIGHT + LIGHT_INT8:
    protos[f"light-{n.replace(':', '-')}"] = _onnx_arg(f"light:{n}")[1]
  for s in FUZZ_SEEDS:
    protos[f"fuzz-{s}"] = merged([generate(s, i) for i in range(FUZZ_CASES)])
  for name, proto in protos.items():
    onnx.save(proto, folder / f"{name}.onnx")
    graphs[name] = str(folder / f"{name}.onnx")
  return graphs


def _jobs(graphs: dict[str, str]) -> list[tuple[str, list[str]]]:
  """(output folder name, compile-model arguments) of each dump."""
  jobs = []
  for name, model in graphs.items():
    targets = ["c", "llvm"]
    if name.startswith(("models-", "onnx-", "fuzz-11", "int8-")):
      targets += ["cuda", "hip", "metal"]
    jobs += [(f"{name}.{t}", [model, "--target", t]) for t in targets]
    if name in ("models-resnet18", "models-transformer", "int8-resnet18-qdq", "light-shufflenet", "fuzz-12"):
      jobs += [(f"{name}.{'-'.join(v[3:])}", [model, *v]) for v in CPU_VARIANTS]
  return jobs


def _emit(job: tuple[str, list[str]], out: Path) -> str:
  from aot.cli import main

  folder, args = job
  rc = main([*args, "--emit", "source", "-q", "-o", str(out / folder)])
  return f"{folder}: rc {rc}"


def _built(out: Path) -> None:
  """The profile and emulated variants, which --emit does not make: built, their src/ kept."""
  import aot

  builds = {
    "models-mnist.profile": dict(what="models:mnist", profile=True),
    "models-transformer.profile": dict(what="models:transformer", profile=True, target="llvm"),
    "models-mnist.emulate-cuda": dict(what="models:mnist", target="cuda", emulate=True),
    "models-mlp.emulate-hip": dict(what="models:mlp", target="hip", emulate=True),
  }
  for folder, kw in builds.items():
    with tempfile.TemporaryDirectory() as tmp:
      what = kw.pop("what")
      art = aot.compile_model(what, out_dir=Path(tmp) / "a", **kw)
      shutil.copytree(art.dir / "src", out / folder / "src")
    print(f"{folder}: built")


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("out")
  ap.add_argument("--jobs", type=int, default=2)
  args = ap.parse_args()
  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  with tempfile.TemporaryDirectory() as tmp:
    graphs = _graphs(Path(tmp))
    with ProcessPoolExecutor(args.jobs) as pool:
      for line in pool.map(_emit, _jobs(graphs), [out] * len(_jobs(graphs))):
        print(line, flush=True)
  _built(out)
  return 0


if __name__ == "__main__":
  sys.exit(main())
