"""Building an artifact's sources into libNAME.so with the system C compiler, in parallel, cached by content hash."""
from __future__ import annotations
import functools, hashlib, os, re, shutil, subprocess, tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable
from aot.errors import BuildError

# the oldest clang looked for by version (clang-N): Debian 12's default; a plain `clang` of any version comes after
OLDEST_CLANG = 14
# lines of the compiler's output a BuildError shows: the first error and its context, not a page of notes
ERROR_LINES = 12
# a sanitizer build (compile_model(sanitize=True) or AOT_SANITIZE=1): out-of-bounds reads and writes, use after free,
# leaks and undefined behaviour in the runtime and the kernels stop the program with a report; frame pointers make its
# stack traces whole
SANITIZE_FLAGS = ("-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-g")

def cc(triple: str | None = None) -> str:
  """The C compiler: $CC; else the newest clang-N on PATH (N >= 14), whose loop vectoriser we can leave on (gcc 12's
  miscompiles a reduction, so with gcc it is off wherever a kernel reduces: ResNet-18 builds 1.45x slower); else a
  plain clang; else gcc; else cc. For a cross build, the triple's gcc (Debian's gcc-aarch64-linux-gnu, say)."""
  if triple: return os.environ.get("CROSS_CC", f"{triple}-gcc")
  return os.environ.get("CC") or _find_cc(os.environ.get("PATH", os.defpath))

def _find_cc(path: str) -> str:
  # not cached: listing PATH takes a millisecond, and a compiler installed while we run is then seen
  versions = [int(m.group(1)) for d in path.split(os.pathsep) if os.path.isdir(d) for f in os.listdir(d)
              if (m := re.fullmatch(r"clang-(\d+)", f)) and int(m.group(1)) >= OLDEST_CLANG]
  names = [f"clang-{v}" for v in sorted(set(versions), reverse=True)] + ["clang", "gcc"]
  return next((c for c in names if shutil.which(c, path=path)), "cc")

def cflags(cpu: str, triple: str | None = None, sanitize: bool = False) -> list[str]:
  arch = ([] if cpu in ("native", "generic") else [f"-mcpu={cpu}"]) if triple else [f"-march={cpu}"]
  # -fno-math-errno lets libm calls vectorise; no -ffast-math: results must stay within the tests' tolerances
  flags = ["-O2", *arch, "-fPIC", "-fvisibility=hidden", "-fno-math-errno", "-fno-trapping-math", "-std=gnu11"]
  compiler = cc(triple)
  kind = _kind(compiler)
  optional = []
  # gcc 12's loop vectoriser miscompiles reductions over reversed reads (tests/test_gcc.py, flip + sum): off for gcc
  if kind == "gcc": optional.append("-fno-tree-loop-vectorize")
  # clang vectorises strided reads (a pool's stride-2 window) with AVX-512 gathers, slower than scalar loads here
  # (mnist's c build was 2x slower); the llvm target says the same with +prefer-no-gather. clang 14 lacks the flags
  if kind == "clang" and (triple or "x86_64").startswith("x86_64"): optional += ["-mno-gather", "-mno-scatter"]
  flags += [f for f in optional if _accepts(compiler_identity(compiler), f)]
  return flags + list(SANITIZE_FLAGS) if sanitize else flags

def compiler_identity(compiler: str) -> tuple[str, str]:
  """Where the compiler really is (symlinks followed) and what its --version says: a build cached under one compiler
  is not reused under another that answers to the same name."""
  found = shutil.which(compiler)
  return (os.path.realpath(found) if found else compiler), _version(os.path.realpath(found) if found else compiler)

@functools.lru_cache(maxsize=None)
def _version(compiler: str) -> str:
  try: return subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout.strip()
  except OSError: return ""

@functools.lru_cache(maxsize=None)
def _accepts(identity: tuple[str, str], flag: str) -> bool:
  """Does the compiler take flag without a word? An unknown flag is an error to clang and gcc, one that does not apply
  only a warning ("argument unused during compilation"): either way it is dropped. Probed once per compiler."""
  with tempfile.TemporaryDirectory(prefix="aot_probe_") as d:
    (Path(d) / "probe.c").write_text("int aot_probe;\n")
    cmd = [identity[0], flag, "-c", "probe.c", "-o", "probe.o"]
    try: p = subprocess.run(cmd, cwd=d, capture_output=True, text=True)
    except OSError: return False
  return p.returncode == 0 and not (p.stderr.strip() or p.stdout.strip())

def _kind(compiler: str) -> str | None:
  """gcc or clang (by what --version says), or None."""
  out = _version(compiler_identity(compiler)[0])
  if "clang" in out: return "clang"
  return "gcc" if "gcc" in out.lower() or "free software foundation" in out.lower() else None

def _cache_dir() -> Path:
  return Path(os.environ.get("AOT_CACHE_DIR", Path.home() / ".cache" / "aot-compiler"))

def run_build_command(cmd: list[str], cwd: Path) -> None:
  """Run one compiler or linker command; a failure is a BuildError with the command and the compiler's first error
  lines (from stderr or stdout: some compilers and wrappers write errors to stdout)."""
  try: p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
  except OSError as e: raise BuildError(f"{' '.join(cmd)} failed: cannot run {cmd[0]}: {e.strerror}") from None
  if p.returncode != 0:
    raise BuildError(f"{' '.join(cmd)} failed (exit {p.returncode}):\n{_first_errors(p.stderr + p.stdout)}")

def _first_errors(output: str) -> str:
  lines = [ln.rstrip() for ln in output.splitlines() if ln.strip()]
  if not lines: return "(the compiler printed nothing)"
  first = next((i for i, ln in enumerate(lines) if re.search(r"\berror\b", ln, re.IGNORECASE)), 0)
  shown = lines[first:first + ERROR_LINES]
  more = len(lines) - first - len(shown)
  return "\n".join(ln[:300] for ln in shown) + (f"\n... ({more} more lines)" if more > 0 else "")

def build_library(src_dir: Path, sources: list[str], out_path: Path, cpu: str = "native", cache: bool = True,
                  progress: Callable[[int, int], None] | None = None, triple: str | None = None,
                  sanitize: bool = False) -> bool:
  """Compile the C, assembly and LLVM IR sources (names relative to src_dir) and link them into out_path; sanitize
  builds the C with AddressSanitizer and UBSan (SANITIZE_FLAGS). Returns True when the library came from the cache."""
  compiler, flags = cc(triple), cflags(cpu, triple, sanitize)
  # "native" means this machine's CPU, which a hash of the sources does not see
  from aot.codegen.llvm import host_target
  flags = flags + [f"--target={triple or host_target()[0]}", f"--cpu={cpu if cpu != 'native' else host_target()[1]}"]
  # headers are part of what a source means (NAME.h holds the arena size model.c allocates)
  headers = b"".join(p.name.encode() + p.read_bytes() for p in sorted(src_dir.glob("*.h")))
  # the compiler's identity, not its name: `clang` may be clang 14 today and clang 19 tomorrow
  ident = "\0".join(compiler_identity(compiler))
  h = hashlib.sha256(" ".join([ident] + flags).encode() + headers)
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
      oh = hashlib.sha256(" ".join([ident, *flags, Path(s).suffix]).encode() + headers + (src_dir / s).read_bytes())
      if s == "model.c" and (src_dir / "weights.bin").exists(): oh.update((src_dir / "weights.bin").read_bytes())
      cached_o = _cache_dir() / "obj" / (oh.hexdigest()[:32] + ".o")
      if cache and cached_o.exists(): shutil.copyfile(cached_o, o)
      elif s.endswith(".ll"):
        from aot.codegen.llvm import compile_module
        Path(o).write_bytes(compile_module((src_dir / s).read_text(), triple, cpu))
      else: run_build_command([compiler, *cflags_, f"-Wa,-I{src_dir}", "-c", s, "-o", o], src_dir)
      if cache and not cached_o.exists(): _store(Path(o), cached_o)
      done[0] += 1
      if progress: progress(done[0], len(sources))
    # the big kernel files first, so the last one to finish is a small one
    jobs = sorted(zip(sources, objs), key=lambda so: -(src_dir / so[0]).stat().st_size)
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as ex: list(ex.map(compile_one, jobs))
    tmp_so = Path(tmp) / "lib.so"
    link_flags = [f for f in SANITIZE_FLAGS if f.startswith("-fsanitize")] if sanitize else []
    run_build_command([compiler, "-shared", "-pthread", *link_flags, "-o", str(tmp_so), *objs, "-lm", "-ldl"], src_dir)
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
