"""compile-model: the command line."""
from __future__ import annotations
import argparse, sys, time, traceback
from pathlib import Path
import numpy as np

def _graph_text(outputs) -> str:
  from aot.ir import UOp, Ops
  from aot.schedule import pm_prepare
  from aot.rewrite import graph_rewrite
  from aot.dtype import dtypes
  sink = graph_rewrite(UOp(Ops.SINK, dtypes.void, tuple(outputs)), pm_prepare)
  names: dict = {}
  lines = []
  for u in sink.toposort():
    names[u] = f"%{len(names)}"
    arg = u.arg if u.op is not Ops.BUFFER else u.arg
    src = " ".join(names[s] for s in u.src)
    lines.append(f"{names[u]:>6} = {u.op.name:<11} {u.dtype.name:<8} {str(u.shape) if u.op is not Ops.SINK else '':<18} {src} {'' if arg is None else arg}")
  return "\n".join(lines)

def _kernel_lines(kernels) -> list[str]:
  return [f"  {i:3d}  {k.name:<32} shape {tuple(k.shape)}  fn {k.function}" for i, k in enumerate(kernels)]

def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(prog="compile-model", description="Compile a model ahead of time into libNAME.so + NAME.h.")
  p.add_argument("model", help="a bundled reference model, models:NAME (mlp, mnist, resnet18, transformer)")
  p.add_argument("-o", "--out", required=True, help="output folder for the artifact")
  p.add_argument("--name", help="C prefix of the artifact's API (default: the model's name)")
  p.add_argument("--target", default="c", choices=["c"], help="code generator (default: c)")
  p.add_argument("--cpu", default="native", help="CPU to compile for, as -march takes it (default: native)")
  p.add_argument("--emit", choices=["graph", "kernels", "source"], help="stop after this stage and show it")
  p.add_argument("--check", action="store_true", help="run the artifact on a seeded input and compare with the reference")
  p.add_argument("--no-cache", action="store_true", help="always run the C compiler (ignore the build cache)")
  p.add_argument("-v", "--verbose", action="store_true", help="show progress and full tracebacks")
  args = p.parse_args(argv)
  try: return _run(args)
  except KeyboardInterrupt: return 130
  except Exception as e:
    if args.verbose: traceback.print_exc()
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    print(f"compile-model: error: {msg}", file=sys.stderr)
    return 1

def _run(args) -> int:
  import aot
  from aot.compiler import resolve, render_sources
  from aot.schedule import schedule
  if not args.model.startswith("models:"):
    raise ValueError(f"{args.model!r}: expected models:NAME (one of mlp, mnist, resnet18, transformer)")
  say = (lambda s: print(f"  .. {s}", file=sys.stderr)) if args.verbose else (lambda s: None)
  out = Path(args.out)
  if args.emit in ("graph", "kernels", "source"):
    traced = resolve(args.model, name=args.name)
    if args.emit == "graph": print(_graph_text(traced.outputs)); return 0
    sched = schedule(traced.outputs, traced.inputs)
    files, infos, arena, _ = render_sources(traced.name, sched)
    if args.emit == "kernels":
      print(f"{traced.name}: {len(infos)} kernels, arena {arena} bytes")
      print("\n".join(_kernel_lines(infos)))
      return 0
    (out / "src").mkdir(parents=True, exist_ok=True)
    for f, text in files.items(): (out / "src" / f).write_text(text)
    print(f"{traced.name}: wrote {len(files)} sources to {out / 'src'}")
    return 0
  t0 = time.perf_counter()
  last = [0.0]
  def progress(s: str):
    # C compilation of big models takes a while: say how far it got, at most a few times a second
    if args.verbose or (s.startswith("compiled") and time.perf_counter() - last[0] > 0.5):
      last[0] = time.perf_counter()
      print(f"  .. {s}", file=sys.stderr)
  art = aot.compile_model(args.model, target=args.target, out_dir=out, name=args.name, cpu=args.cpu,
                          cache=not args.no_cache, progress=progress)
  print(f"{art.name}: {art.num_kernels} kernels (target {art.target}), compiled in {time.perf_counter() - t0:.1f} s")
  print("\n".join(_kernel_lines(art.kernels)))
  print(f"arena: {art.arena_bytes} bytes ({art.arena_bytes / 2**20:.2f} MiB); weights: {art.weights_bytes} bytes")
  print(f"wrote {art.library_path}, {art.header_path}, {art.dir / (art.name + '.json')}, {art.dir / 'src'}/")
  if args.check: return _check(art, args.model)
  return 0

def _check(art, model: str) -> int:
  import aot
  from aot.models import get
  ref = get(model.split(":", 1)[1])
  xs = ref.example_inputs(seed=0)
  run = aot.load(art)
  got = run(*xs)
  times = []
  for _ in range(5):
    t = time.perf_counter(); run(*xs); times.append(time.perf_counter() - t)
  want = ref.reference(*xs)
  err = float(np.max(np.abs(got.astype(np.float64) - want)))
  rel = err / max(float(np.max(np.abs(want))), 1e-30)
  ok = rel <= 1e-4
  print(f"check vs numpy reference: max abs err {err:.3e}, max rel err {rel:.3e} -> {'PASS' if ok else 'FAIL'}; "
        f"latency {np.median(times) * 1e3:.2f} ms (median of 5)")
  return 0 if ok else 1

if __name__ == "__main__": sys.exit(main())
