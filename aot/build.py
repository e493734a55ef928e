"""Building an artifact's sources into libNAME.so with the system C compiler, in parallel, cached by content hash."""
from __future__ import annotations
import functools, hashlib, os, shutil, subprocess, tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

class BuildError(Exception):
  """The C compiler or linker failed on generated code (a compiler bug, not the user's)."""

def cc(triple: str | None = None) -> str:
  """The C compiler: $CC; else clang where installed, whose loop vectoriser we can leave on (gcc 12's miscompiles a
  reduction, so with gcc it is off wherever a kernel reduces: ResNet-18 builds 1.45x slower); else cc. For a cross
  build, the triple's gcc (Debian's gcc-aarch64-linux-gnu, say)."""
  if triple: return os.environ.get("CROSS_CC", f"{triple}-gcc")
  return os.environ.get("CC") or _clang() or "cc"

@functools.lru_cache(maxsize=None)
def _clang() -> str | None:
  return next((c for c in ("clang", "clang-19") if shutil.which(c)), None)

def cflags(cpu: str, triple: str | None = None) -> list[str]:
  arch = ([] if cpu in ("native", "generic") else [f"-mcpu={cpu}"]) if triple else [f"-march={cpu}"]
  # -fno-math-errno lets libm calls vectorise; no -ffast-math: results must stay within the tests' tolerances
  flags = ["-O2", *arch, "-fPIC", "-fvisibility=hidden", "-fno-math-errno", "-fno-trapping-math", "-std=gnu11"]
  kind = _kind(cc(triple))
  # gcc 12's loop vectoriser miscompiles reductions over reversed reads (tests/test_gcc.py, flip + sum): off for gcc
  if kind == "gcc": flags.append("-fno-tree-loop-vectorize")
  # clang vectorises strided reads (a pool's stride-2 window) with AVX-512 gathers, slower than scalar loads here
  # (mnist's c build was 2x slower); the llvm target says the same with +prefer-no-gather
  if kind == "clang" and (triple or "x86_64").startswith("x86_64"): flags += ["-mno-gather", "-mno-scatter"]
  return flags

@functools.lru_cache(maxsize=None)
def _kind(compiler: str) -> str | None:
  """gcc or clang (by what --version says), or None."""
  try: out = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
  except OSError: return None
  if "clang" in out: return "clang"
  return "gcc" if "gcc" in out.lower() or "free software foundation" in out.lower() else None

def _cache_dir() -> Path:
  return Path(os.environ.get("AOT_CACHE_DIR", Path.home() / ".cache" / "aot-compiler"))

def _run(cmd: list[str], cwd: Path):
  p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
  if p.returncode != 0:
    raise BuildError(f"{' '.join(cmd)} failed:\n{p.stderr[-4000:]}")

def build_library(src_dir: Path, sources: list[str], out_path: Path, cpu: str = "native", cache: bool = True,
                  progress: Callable[[int, int], None] | None = None, triple: str | None = None) -> bool:
  """Compile the C, assembly and LLVM IR sources (names relative to src_dir) and link them into out_path.
  Returns True when the library came from the cache."""
  compiler, flags = cc(triple), cflags(cpu, triple)
  # "native" means this machine's CPU, which a hash of the sources does not see
  from aot.codegen.llvm import host_target
  flags = flags + [f"--target={triple or host_target()[0]}", f"--cpu={cpu if cpu != 'native' else host_target()[1]}"]
  # headers are part of what a source means (NAME.h holds the arena size model.c allocates)
  headers = b"".join(p.name.encode() + p.read_bytes() for p in sorted(src_dir.glob("*.h")))
  h = hashlib.sha256(" ".join([compiler] + flags).encode() + headers)
  for s in sorted(sources) + ["weights.bin"]:
    if (src_dir / s).exists(): h.update(s.encode()); h.update((src_dir / s).read_bytes())
  key = h.hexdigest()[:32]
  cached = _cache_dir() / key / "lib.so"
  if cache and cached.exists():
    shutil.copyfile(cached, out_path)
    return True
  with tempfile.TemporaryDirectory(prefix="aot_build_") as tmp:
    objs = [str(Path(tmp) / (Path(s).stem + ".o")) for s in sources]
    done = [0]
    cflags_ = [f for f in flags if not f.startswith("--")]
    def compile_one(args):
      s, o = args
      # objects are cached too: the runtime, and kernels shared by many models, compile once
      oh = hashlib.sha256(" ".join([compiler, *flags, Path(s).suffix]).encode() + headers + (src_dir / s).read_bytes())
      if s == "model.c" and (src_dir / "weights.bin").exists(): oh.update((src_dir / "weights.bin").read_bytes())
      cached_o = _cache_dir() / "obj" / (oh.hexdigest()[:32] + ".o")
      if cache and cached_o.exists(): shutil.copyfile(cached_o, o)
      elif s.endswith(".ll"):
        from aot.codegen.llvm import compile_module
        Path(o).write_bytes(compile_module((src_dir / s).read_text(), triple, cpu))
      else: _run([compiler, *cflags_, f"-Wa,-I{src_dir}", "-c", s, "-o", o], src_dir)
      if cache and not cached_o.exists(): _store(Path(o), cached_o)
      done[0] += 1
      if progress: progress(done[0], len(sources))
    # the big kernel files first, so the last one to finish is a small one
    jobs = sorted(zip(sources, objs), key=lambda so: -(src_dir / so[0]).stat().st_size)
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as ex: list(ex.map(compile_one, jobs))
    tmp_so = Path(tmp) / "lib.so"
    _run([compiler, "-shared", "-pthread", "-o", str(tmp_so), *objs, "-lm", "-ldl"], src_dir)
    shutil.copyfile(tmp_so, out_path)
    if cache: _store(tmp_so, cached)
  return False

def _store(path: Path, cached: Path):
  """Put a file into the cache atomically (concurrent builds may store the same key)."""
  try:
    cached.parent.mkdir(parents=True, exist_ok=True)
    part = cached.with_name(f"{cached.name}.{os.getpid()}.{id(path)}.part")
    shutil.copyfile(path, part)
    os.replace(part, cached)
  except OSError: pass  # a read-only cache only costs time
