"""Building an artifact's sources into libNAME.so with the system C compiler, in parallel, cached by content hash."""
from __future__ import annotations
import functools, hashlib, os, shutil, subprocess, tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

class BuildError(Exception):
  """The C compiler or linker failed on generated code (a compiler bug, not the user's)."""

def cc() -> str: return os.environ.get("CC", "cc")

def cflags(cpu: str) -> list[str]:
  # -fno-math-errno lets libm calls vectorise; no -ffast-math: results must stay within the tests' tolerances
  flags = ["-O2", f"-march={cpu}", "-fPIC", "-fvisibility=hidden", "-fno-math-errno", "-fno-trapping-math", "-std=gnu11"]
  # gcc 12's loop vectoriser miscompiles reductions over reversed reads (tests/test_ops.py, flip + sum): off for gcc
  return flags + (["-fno-tree-loop-vectorize"] if _is_gcc() else [])

@functools.lru_cache(maxsize=None)
def _is_gcc() -> bool:
  try: out = subprocess.run([cc(), "--version"], capture_output=True, text=True).stdout
  except OSError: return False
  return "clang" not in out and ("gcc" in out.lower() or "free software foundation" in out.lower())

def _cache_dir() -> Path:
  return Path(os.environ.get("AOT_CACHE_DIR", Path.home() / ".cache" / "aot-compiler"))

def _run(cmd: list[str], cwd: Path):
  p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
  if p.returncode != 0:
    raise BuildError(f"{' '.join(cmd)} failed:\n{p.stderr[-4000:]}")

def build_library(src_dir: Path, sources: list[str], out_path: Path, cpu: str = "native", cache: bool = True,
                  progress: Callable[[int, int], None] | None = None) -> bool:
  """Compile the C/assembly sources (names relative to src_dir) and link them into out_path.
  Returns True when the library came from the cache."""
  flags = cflags(cpu)
  h = hashlib.sha256(" ".join([cc()] + flags).encode())
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
    def compile_one(args):
      s, o = args
      _run([cc(), *flags, f"-Wa,-I{src_dir}", "-c", s, "-o", o], src_dir)
      done[0] += 1
      if progress: progress(done[0], len(sources))
    # the big kernel files first, so the last one to finish is a small one
    jobs = sorted(zip(sources, objs), key=lambda so: -(src_dir / so[0]).stat().st_size)
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as ex: list(ex.map(compile_one, jobs))
    tmp_so = Path(tmp) / "lib.so"
    _run([cc(), "-shared", "-o", str(tmp_so), *objs, "-lm", "-ldl"], src_dir)
    shutil.copyfile(tmp_so, out_path)
    if cache:
      try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        part = cached.with_suffix(f".{os.getpid()}.part")
        shutil.copyfile(tmp_so, part)
        os.replace(part, cached)
      except OSError: pass  # a read-only cache only costs time
  return False
