"""compile-model: the command line."""

from __future__ import annotations

import argparse
import re
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import TextIO

from aot import __version__

# a compile shorter than this shows no progress bar: a bar that flashes up and is erased at once is only noise
PROGRESS_DELAY_S = 2.0
PROGRESS_BAR_WIDTH = 24


class Progress:
  """What compile-model says on stderr while it works: with -v every step on its own line; on a terminal, once the
  compile has taken PROGRESS_DELAY_S, one line (the step, and a bar of the sources compiled) rewritten in place and
  erased at the end; otherwise (a pipe, a log, -q) nothing."""

  def __init__(self, stream: TextIO, verbose: bool = False, quiet: bool = False, clock=time.perf_counter):
    self.stream, self.verbose, self.clock, self.t0 = stream, verbose and not quiet, clock, clock()
    self.bar = not quiet and not verbose and stream.isatty()
    self.shown = False

  def __call__(self, step: str) -> None:
    if self.verbose:
      print(f"  .. {step}", file=self.stream, flush=True)
      return
    elapsed = self.clock() - self.t0
    if not self.bar or elapsed < PROGRESS_DELAY_S:
      return
    line = f"{step}  {elapsed:.0f} s"
    if m := re.fullmatch(r"compiled (\d+)/(\d+) sources", step):
      filled = PROGRESS_BAR_WIDTH * int(m.group(1)) // max(int(m.group(2)), 1)
      line = f"[{'#' * filled}{'.' * (PROGRESS_BAR_WIDTH - filled)}] {line}"
    # \r and erase-to-end-of-line: the line replaces the last one, whatever its length
    self.stream.write(f"\r\x1b[K{line}")
    self.stream.flush()
    self.shown = True

  def close(self) -> None:
    """Erase the bar, so what follows starts on a clean line."""
    if self.shown:
      self.stream.write("\r\x1b[K")
      self.stream.flush()
      self.shown = False


def _graph_text(outputs) -> str:
  from aot.core.dtype import dtypes
  from aot.core.ir import Ops, UOp
  from aot.core.rewrite import graph_rewrite
  from aot.scheduler.schedule import pm_prepare

  sink = graph_rewrite(UOp(Ops.SINK, dtypes.void, tuple(outputs)), pm_prepare)
  names: dict = {}
  lines = []
  for u in sink.toposort():
    names[u] = f"%{len(names)}"
    arg = u.arg if u.op is not Ops.BUFFER else u.arg
    src = " ".join(names[s] for s in u.src)
    shape = str(u.shape) if u.op is not Ops.SINK else ""
    lines.append(f"{names[u]:>6} = {u.op.name:<11} {u.dtype.name:<8} {shape:<18} {src} {'' if arg is None else arg}")
  return "\n".join(lines)


def _kernel_lines(kernels) -> list[str]:
  return [f"  {i:3d}  {k.name:<32} shape {tuple(k.shape)}  fn {k.function}" for i, k in enumerate(kernels)]


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(
    prog="compile-model", description="Compile a model ahead of time into libNAME.so + NAME.h."
  )
  _add_build_arguments(p)
  _add_action_arguments(p)
  p.add_argument("--version", action="version", version=f"compile-model (aot) {__version__}")
  p.add_argument(
    "--clear-cache",
    action=_ClearCache,
    help="empty the build cache (AOT_CACHE_DIR, else ~/.cache/aot-compiler; capped at AOT_CACHE_MAX_MB, "
    "default 1024) and exit",
  )
  return p


class _ClearCache(argparse.Action):
  """--clear-cache: a command of its own, like --version (no model or -o needed)."""

  def __init__(self, option_strings, dest, **kwargs):
    super().__init__(option_strings, dest, nargs=0, **kwargs)

  def __call__(self, parser, namespace, values, option_string=None):
    from aot import cache

    removed = cache.clear()
    print(f"removed {removed.files} files ({removed.bytes / 2**20:.1f} MiB) from {cache.cache_dir()}")
    parser.exit(0)


def _add_build_arguments(p: argparse.ArgumentParser) -> None:
  """What to compile, for what, and into where: the arguments that become CompileOptions (_options)."""
  p.add_argument(
    "model",
    help="an ONNX file (model.onnx), or a bundled reference model: models:NAME (mlp, mnist, resnet18, transformer)",
  )
  p.add_argument("-o", "--out", required=True, help="output folder for the artifact")
  p.add_argument("--name", help="C prefix of the artifact's API (default: the model's name)")
  p.add_argument(
    "--target",
    default="c",
    metavar="{c,llvm,cuda,hip,metal}",
    help="code generator: c (C kernels, system compiler) or llvm (LLVM IR through llvmlite); GPU: cuda (nvcc), "
    "hip (clang-19, AMD), metal (sources + build_macos.sh); default c",
  )
  p.add_argument("--offload-arch", help="hip: comma-separated AMD GPU architectures (default gfx90a,gfx1100)")
  p.add_argument(
    "--cpu",
    default="native",
    help="CPU to compile for (default: native, this machine; e.g. x86-64-v3 for a portable build)",
  )
  p.add_argument("--triple", help="cross-compile for a target triple, e.g. aarch64-linux-gnu (needs TRIPLE-gcc)")
  p.add_argument(
    "--shape",
    action="append",
    default=[],
    metavar="NAME=DIMS",
    help="pin an input's shape (input=1x3x224x224) or a symbolic dim (batch=1), or give a batch dim a range the "
    "artifact takes at run time (batch=1..64, input=1..8x3x224x224); a sequence input's "
    "length and element shapes (seq=[3x4,2x4]); an optional input's as absent (opt=none); repeatable",
  )
  p.add_argument(
    "--bind",
    action="append",
    default=[],
    metavar="NAME=VALUE",
    help="pin a scalar input to a value at compile time (sr=16000), so control flow on it folds; repeatable",
  )
  p.add_argument("--no-cache", action="store_true", help="always run the C compiler (ignore the build cache)")
  p.add_argument(
    "--no-winograd", action="store_true", help="sum 3x3 convolutions directly (Winograd's weights are 16/9 the size)"
  )


def _add_action_arguments(p: argparse.ArgumentParser) -> None:
  """What to do besides building (stop early, check, profile) and how much to say."""
  p.add_argument("--emit", choices=["graph", "kernels", "source"], help="stop after this stage and show it")
  p.add_argument(
    "--check",
    action="store_true",
    help="run the artifact on a seeded input and compare with the reference (onnxruntime; judged in float64 "
    "where the two disagree)",
  )
  p.add_argument(
    "--check-input",
    action="append",
    default=[],
    metavar="NAME=FILE.npy",
    help="--check: take this input from a .npy file instead of seeded random values; repeatable",
  )
  p.add_argument(
    "--profile",
    action="store_true",
    help="build a timed variant, run it on a seeded input and show each kernel call's time (also OUT/profile.json)",
  )
  talk = p.add_mutually_exclusive_group()
  talk.add_argument("-v", "--verbose", action="store_true", help="show every step and full tracebacks")
  talk.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors (and what --emit asks for)")


def main(argv: list[str] | None = None) -> int:
  # `compile-model ... | head` closing the pipe is not an error
  signal.signal(signal.SIGPIPE, signal.SIG_DFL)
  args = _parser().parse_args(argv)
  try:
    return _run(args)
  except KeyboardInterrupt:
    return 130
  except Exception as e:
    if args.verbose:
      traceback.print_exc()
    from aot.errors import BuildError, InternalError

    lines = str(e).strip().splitlines() or [type(e).__name__]
    # one line, except a compiler's failure: its command and the compiler's own first error lines (bounded by build.py)
    msg = "\n".join(lines) if isinstance(e, BuildError) else lines[0]
    # a bug of ours: the traceback is what a report needs
    if isinstance(e, InternalError) and not args.verbose:
      msg += " (rerun with -v for the traceback)"
    print(f"compile-model: error: {msg}", file=sys.stderr)
    return 1


def _options(args, progress=None):
  """The CompileOptions the arguments ask for: checked here, before any model is read (an unknown target is one line
  and exit 1, like a missing toolchain)."""
  from aot.options import CompileOptions

  return CompileOptions(
    target=args.target,
    out_dir=Path(args.out),
    name=args.name,
    cpu=args.cpu,
    cache=not args.no_cache,
    progress=progress,
    shapes=_pins(args.shape, "--shape", _dims),
    bind=_pins(args.bind, "--bind", _number),
    triple=args.triple,
    offload_arch=tuple(args.offload_arch.split(",")) if args.offload_arch else None,
    profile=args.profile,
    winograd=not args.no_winograd,
  )


def _emit(args, opts) -> int:
  """--emit: the stages compile_model runs, as far as it asks; a bug in them is an InternalError saying where, as
  there."""
  from aot.artifact import WeightsWriter
  from aot.compiler import bugs_as_internal_errors, lower_stage, render_stage, schedule_stage, trace_stage

  with bugs_as_internal_errors():
    traced = trace_stage(args.model, None, opts)
    if args.emit == "graph":
      print(_graph_text(traced.outputs))
      return 0
    sched = schedule_stage(traced, opts)
    weights = WeightsWriter(None)
    srcs = render_stage(traced.name, sched, lower_stage(traced.name, sched, opts, weights), opts, weights)
  if args.emit == "kernels":
    print(f"{traced.name}: {len(srcs.kernels)} kernels, arena {srcs.arena} bytes")
    print("\n".join(_kernel_lines(srcs.kernels)))
    return 0
  out = Path(args.out)
  (out / "src").mkdir(parents=True, exist_ok=True)
  for f, text in srcs.files.items():
    (out / "src" / f).write_text(text)
  print(f"{traced.name}: wrote {len(srcs.files)} sources to {out / 'src'}")
  return 0


def _run(args) -> int:
  import dataclasses

  import aot

  opts = _options(args)
  if not args.model.startswith("models:") and not args.model.endswith(".onnx"):
    raise ValueError(
      f"{args.model!r}: expected an .onnx file or models:NAME (one of mlp, mnist, resnet18, transformer)"
    )
  if args.emit in ("graph", "kernels", "source"):
    return _emit(args, opts)
  out = Path(args.out)
  if args.check and args.triple:
    raise ValueError("--check runs the artifact here: it cannot check a cross-compiled one")
  if args.check_input and not args.check:
    raise ValueError("--check-input gives --check its inputs: add --check")
  from aot.check import check, load_npy_pins

  check_files = load_npy_pins(args.check_input)
  t0 = time.perf_counter()
  progress = Progress(sys.stderr, args.verbose, args.quiet)
  try:
    art = aot.compile_model(args.model, options=dataclasses.replace(opts, progress=progress))
  finally:
    progress.close()
  if not args.quiet:
    _summary(art, time.perf_counter() - t0)
  if args.profile:
    if args.triple:
      raise ValueError("--profile runs the artifact here: it cannot profile a cross-compiled one")
    from aot.tools.profile import profile_and_report

    profile_and_report(art, out / "profile.json")
  return check(art, args.model, opts.bind, args.quiet, check_files) if args.check else 0


def _summary(art, seconds: float) -> None:
  print(f"{art.name}: {art.num_kernels} kernels (target {art.target}), compiled in {seconds:.1f} s")
  print("\n".join(_kernel_lines(art.kernels)))
  print(f"arena: {art.arena_bytes} bytes ({art.arena_bytes / 2**20:.2f} MiB); weights: {art.weights_bytes} bytes")
  built = art.manifest.get("gpu", {}).get("built", "")
  library = art.library_path if art.library_path.exists() else f"(no library here; {built})"
  print(f"wrote {library}, {art.header_path}, {art.dir / (art.name + '.json')}, {art.dir / 'src'}/")


def _pins(items: list[str], flag: str, parse) -> dict:
  out = {}
  for it in items:
    name, eq, value = it.partition("=")
    if not eq or not name:
      raise ValueError(f"{flag} {it!r}: expected NAME=VALUE")
    out[name] = parse(value, f"{flag} {it}")
  return out


def _dims(v: str, where: str):
  if v.lower() == "none":
    return None
  if v.startswith("[") and v.endswith("]"):
    items = [e.strip() for e in v[1:-1].split(",") if e.strip()]
    return [(d,) if isinstance(d := _dims(e, where), int) else d for e in items]
  try:
    dims = tuple(_dim(d) for d in v.lower().split("x"))
  except ValueError:
    raise ValueError(
      f"{where}: dims must be integers or ranges LOW..HIGH separated by x, like 1x3x224x224 or 1..8x3x224x224"
    ) from None
  return dims[0] if len(dims) == 1 else dims


def _dim(d: str):
  """One dim of --shape: a size, or a range LOW..HIGH (aot.options.DimRange)."""
  from aot.options import DimRange

  lo, dots, hi = d.partition("..")
  return DimRange(int(lo), int(hi)) if dots else int(d)


def _number(v: str, where: str):
  for parse in (int, float):
    try:
      return parse(v)
    except ValueError:
      pass
  raise ValueError(f"{where}: the value must be a number")


if __name__ == "__main__":
  sys.exit(main())
