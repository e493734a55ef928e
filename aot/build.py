"""Building an artifact's sources into libNAME.so, one build step per toolchain: the CPU targets' C, assembly and LLVM
IR with the system C compiler (in parallel, objects and libraries cached by content hash); a GPU target's device code
with nvcc or clang-19 and its host code with the C compiler (cached by the hash of every source and command); Metal's
syntax check. Every command goes through run_build_command; every cached file through one cache folder."""

from __future__ import annotations

import atexit
import functools
import hashlib
import importlib.resources
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from aot.archive import write_archive
from aot.cache import cache_dir, fetch, store
from aot.codegen.render.gpu import DEVICE_IMAGE, HOST_GLUE, KERNEL_SOURCE
from aot.cpu import CHECK_HEADER, CHECK_SOURCE, arch_flags, baseline_cpu, cpu_target
from aot.errors import BuildError, MissingToolError


def _which(names: tuple[str, ...], what: str) -> str:
  for n in names:
    if p := shutil.which(n):
      return p
  raise MissingToolError(f"{what} not found (looked for {', '.join(names)})")


def clang() -> str:
  return _which(
    (os.environ.get("AOT_CLANG", "clang-19"), "clang-19", "clang"), "clang-19 (Debian: apt-get install clang-19 lld-19)"
  )


def nvcc() -> str:
  return _which(("nvcc", "/usr/local/cuda/bin/nvcc"), "nvcc (the CUDA toolkit)")


def cuda_include() -> str:
  """The folder holding cuda.h: beside nvcc's toolkit, or the usual install places."""
  candidates = [
    os.environ.get("CUDA_HOME", ""),
    "/usr/local/cuda",
    *sorted(Path("/usr/local").glob("cuda-*"), reverse=True),
  ]
  for c in candidates:
    if c and (Path(c) / "include" / "cuda.h").exists():
      return str(Path(c) / "include")
  raise MissingToolError("cuda.h not found (set CUDA_HOME to the CUDA toolkit, e.g. /usr/local/cuda-13.0)")


def hip_include() -> str:
  for c in ("/opt/rocm/include", "/usr/include"):
    if (Path(c) / "hip" / "hip_runtime_api.h").exists():
      return c
  raise MissingToolError("hip/hip_runtime_api.h not found (Debian: apt-get install libamdhip64-dev)")


def emulator_cxx() -> str:
  """The C++ compiler for emulated kernels: clang (also knows _Float16 in C++), else g++."""
  return _which(("clang++-19", "clang++", "g++", "c++"), "a C++ compiler (clang++-19 or g++)")


# AMD architectures a hip artifact carries code for: MI200-series (CDNA2) and Radeon RX 7900 (RDNA3)
DEFAULT_OFFLOAD_ARCH = ("gfx90a", "gfx1100")
# NVIDIA: a cubin for Hopper (sm_90) and PTX for compute_90, which newer GPUs' drivers JIT-compile
CUDA_ARCH = "90"
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
  if triple:
    return os.environ.get("CROSS_CC", f"{triple}-gcc")
  return os.environ.get("CC") or _find_cc(os.environ.get("PATH", os.defpath))


def _find_cc(path: str) -> str:
  # cached by PATH and its folders' times: listing PATH took 5 ms (six times a build), and a compiler installed while
  # we run changes its folder's time, so it is still seen
  dirs = [d for d in path.split(os.pathsep) if os.path.isdir(d)]
  return _find_cc_in(path, tuple(os.stat(d).st_mtime_ns for d in dirs))


@functools.lru_cache(maxsize=16)
def _find_cc_in(path: str, times: tuple) -> str:
  versions = [
    int(m.group(1))
    for d in path.split(os.pathsep)
    if os.path.isdir(d)
    for f in os.listdir(d)
    if (m := re.fullmatch(r"clang-(\d+)", f)) and int(m.group(1)) >= OLDEST_CLANG
  ]
  names = [f"clang-{v}" for v in sorted(set(versions), reverse=True)] + ["clang", "gcc"]
  return next((c for c in names if shutil.which(c, path=path)), "cc")


def cflags(cpu: str, triple: str | None = None, sanitize: bool = False) -> list[str]:
  arch = arch_flags(cpu, triple)
  # -fno-math-errno lets libm calls vectorise; no -ffast-math: results must stay within the tests' tolerances
  flags = ["-O2", *arch, "-fPIC", "-fvisibility=hidden", "-fno-math-errno", "-fno-trapping-math", "-std=gnu11"]
  compiler = cc(triple)
  kind = _kind(compiler)
  optional = []
  # gcc 12's loop vectoriser miscompiles reductions over reversed reads (tests/test_gcc.py, flip + sum): off for gcc
  if kind == "gcc":
    optional.append("-fno-tree-loop-vectorize")
  # clang vectorises strided reads (a pool's stride-2 window) with AVX-512 gathers, slower than scalar loads here
  # (mnist's c build was 2x slower); the llvm target says the same with +prefer-no-gather. clang 14 lacks the flags
  if kind == "clang" and (triple or "x86_64").startswith("x86_64"):
    optional += ["-mno-gather", "-mno-scatter"]
  # -march of an Intel AVX-512 server CPU prefers 256-bit vectors: clang then splits the float microkernel's 16-lane
  # vector types in two and the vectorisers stop at 8 lanes. 512 (ignored without AVX-512), interleaved on a
  # Sapphire-Rapids-class CPU, clang-19, whole runs 512/256: light ResNet-50 0.67, SqueezeNet 0.68, DenseNet-121 0.70,
  # Inception-v1 0.75, ShuffleNet 0.85, resnet18:qdq 0.96, the dynamically quantized transformer 0.92
  if (triple or "x86_64").startswith("x86_64"):
    optional.append("-mprefer-vector-width=512")
  flags += [f for f in optional if _accepts(compiler_identity(compiler), f)]
  return flags + list(SANITIZE_FLAGS) if sanitize else flags


# flags for the generated kernels only (model.c, kernelsN.c), by compiler kind. clang's SLP vectoriser (straight-line
# code into vectors) miscompiled one: clang 19.1 built a strided conv's fully unrolled channels, some lanes of which
# multiply a padding tap's 0.0f, into 16-lane vectors whose padding lanes were poison, and wrong numbers came out with
# AVX-512 (tests/test_compilers.py::test_a_strided_conv_with_padding_taps; LLVM 22, llvmlite's, gets the same IR
# right). Without SLP the mlp, mnist, ResNet-18 and the float transformer run within 2% of their time with it, but
# transformer:dynamic 1.13-1.17x and ShuffleNet 1.02-1.13x slower (clang-19, 1 thread). The runtime's own files keep
# it (aot_qgemm.c's code changes without it) and are tested under each compiler
KERNEL_FLAGS = {"clang": ("-fno-slp-vectorize",)}


def kernel_flags(triple: str | None = None) -> list[str]:
  """What the generated kernels are compiled with beyond cflags (KERNEL_FLAGS, those the compiler takes)."""
  compiler = cc(triple)
  wanted = KERNEL_FLAGS.get(_kind(compiler) or "", ())
  return [f for f in wanted if _accepts(compiler_identity(compiler), f)]


def is_runtime_source(name: str) -> bool:
  """Is name one of the runtime's own files (runtime_c/), rather than a generated one?"""
  return importlib.resources.files("aot.runtime_c").joinpath(name).is_file()


def compiler_identity(compiler: str) -> tuple[str, str]:
  """Where the compiler really is (symlinks followed) and what its --version says: a build cached under one compiler
  is not reused under another that answers to the same name."""
  found = shutil.which(compiler)
  return (os.path.realpath(found) if found else compiler), _version(os.path.realpath(found) if found else compiler)


@functools.lru_cache(maxsize=None)
def _version(compiler: str) -> str:
  try:
    return subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout.strip()
  except OSError:
    return ""


@functools.lru_cache(maxsize=None)
def _accepts(identity: tuple[str, str], flag: str) -> bool:
  """Does the compiler take flag without a word? An unknown flag is an error to clang and gcc, one that does not apply
  only a warning ("argument unused during compilation"): either way it is dropped. Probed once per compiler."""
  with tempfile.TemporaryDirectory(prefix="aot_probe_") as d:
    (Path(d) / "probe.c").write_text("int aot_probe;\n")
    cmd = [identity[0], flag, "-c", "probe.c", "-o", "probe.o"]
    try:
      p = subprocess.run(cmd, cwd=d, capture_output=True, text=True)
    except OSError:
      return False
  return p.returncode == 0 and not (p.stderr.strip() or p.stdout.strip())


def _kind(compiler: str) -> str | None:
  """gcc or clang (by what --version says), or None."""
  out = _version(compiler_identity(compiler)[0])
  if "clang" in out:
    return "clang"
  return "gcc" if "gcc" in out.lower() or "free software foundation" in out.lower() else None


def soname_flag(library: Path) -> str:
  """The library's SONAME, its own file name: a program linked against it records libNAME.so, not the path it was
  linked from, and finds it through its rpath or LD_LIBRARY_PATH."""
  return f"-Wl,-soname,{library.name}"


def run_build_command(cmd: list[str], cwd: Path) -> None:
  """Run one compiler or linker command; a failure is a BuildError with the command and the compiler's first error
  lines (from stderr or stdout: some compilers and wrappers write errors to stdout)."""
  try:
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
  except OSError as e:
    raise BuildError(f"{' '.join(cmd)} failed: cannot run {cmd[0]}: {e.strerror}") from None
  if p.returncode != 0:
    raise BuildError(f"{' '.join(cmd)} failed (exit {p.returncode}):\n{_first_errors(p.stderr + p.stdout)}")


def _first_errors(output: str) -> str:
  lines = [ln.rstrip() for ln in output.splitlines() if ln.strip()]
  if not lines:
    return "(the compiler printed nothing)"
  first = next((i for i, ln in enumerate(lines) if re.search(r"\berror\b", ln, re.IGNORECASE)), 0)
  shown = lines[first : first + ERROR_LINES]
  more = len(lines) - first - len(shown)
  return "\n".join(ln[:300] for ln in shown) + (f"\n... ({more} more lines)" if more > 0 else "")


@dataclass(frozen=True)
class Toolchain:
  """The compiler and flags a CPU build compiles with, and what keys its objects: build_library's, and the runtime
  prebuild's (one key for both, so a prebuilt object is the one the build would make)."""

  compiler: str
  ident: str  # the compiler's identity (compiler_identity), not its name
  flags: tuple  # the C flags, then --target/--cpu/--cpu-features tags that key the objects and are not passed
  check_flags: tuple  # CHECK_SOURCE's: the architecture's baseline
  kernel_only: tuple  # the generated kernels' extra flags (kernel_flags)
  check_header: str  # CHECK_HEADER's text

  def own_flags(self, s: str) -> list[str]:
    """What source s gets beyond the flags: the kernel-only ones for a generated C file."""
    return list(self.kernel_only) if s.endswith(".c") and not is_runtime_source(s) else []

  def command(self, src_dir: Path, s: str, o: str) -> list[str]:
    flags = self.check_flags if s == CHECK_SOURCE else [f for f in self.flags if not f.startswith("--")]
    return [self.compiler, *flags, *self.own_flags(s), f"-Wa,-I{src_dir}", "-c", s, "-o", o]

  def object_key(self, src_dir: Path, s: str) -> str:
    # an object's key holds the headers its source includes, not every header: NAME.h differs per model, and with it
    # in every key the runtime's files (14 s of a small model's 15 s of compiling) compiled anew for each model
    included = b"".join(h.encode() + (src_dir / h).read_bytes() for h in included_headers(src_dir, s))
    flags = self.flags if s != CHECK_SOURCE else self.check_flags
    words = " ".join([self.ident, *flags, *self.own_flags(s), Path(s).suffix])
    h = hashlib.sha256(words.encode() + included + (src_dir / s).read_bytes())
    if s == "model.c" and (src_dir / "weights.bin").exists():
      h.update((src_dir / "weights.bin").read_bytes())
    return h.hexdigest()[:32]


def toolchain(cpu: str, triple: str | None, sanitize: bool, llvm: bool) -> Toolchain:
  compiler, flags = cc(triple), cflags(cpu, triple, sanitize)
  # "native" means this machine's CPU, which a hash of the sources does not see
  from aot.codegen.render.llvm import host_target

  flags = flags + [f"--target={triple or host_target()[0]}", f"--cpu={cpu if cpu != 'native' else host_target()[1]}"]
  # what NAME_create checks the CPU has, part of every key; the llvm target's machine is made of those features
  # (aot/cpu.py llvm_machine)
  target = cpu_target(cpu, triple, llvm=llvm)
  flags.append(f"--cpu-features={','.join(target.features)}")
  # the check runs before anything built for the target does: it is built for the architecture's baseline
  check_flags = cflags(baseline_cpu(triple), triple, sanitize)
  ident = "\0".join(compiler_identity(compiler))
  return Toolchain(compiler, ident, tuple(flags), tuple(check_flags), tuple(kernel_flags(triple)), target.header())


# the runtime's files nearly every CPU artifact compiles, and the slowest to (aot_gemm.c 1 s of a 6 s compile):
# prebuild_runtime compiles them while the model is traced and scheduled, on a core that work leaves idle
PREBUILT = ("aot_gemm.c", "aot_runtime.c")
# object key -> its prebuild (a path to the object, None when it failed: the build then compiles it and says why)
_prebuilt: dict[str, Future] = {}
_prebuild_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="aot_prebuild")


def prebuild_runtime(cpu: str, triple: str | None, sanitize: bool, llvm: bool, cache: bool) -> None:
  """Start compiling PREBUILT in the background for a build with these settings, unless cached or under way;
  build_library takes each object when it comes to that source."""
  tc = toolchain(cpu, triple, sanitize, llvm)
  runtime = Path(str(importlib.resources.files("aot.runtime_c")))
  for s in PREBUILT:
    key = tc.object_key(runtime, s)
    if key not in _prebuilt and not (cache and (cache_dir() / "obj" / f"{key}.o").exists()):
      _prebuilt[key] = _prebuild_pool.submit(_prebuild_one, tc, runtime, s, key, cache)


@atexit.register
def _drop_prebuilt() -> None:
  # objects no build took (a model that calls no gemm) leave with the process
  for job in _prebuilt.values():
    if job.done() and job.result() is not None:
      shutil.rmtree(job.result().parent, ignore_errors=True)


def _prebuild_one(tc: Toolchain, runtime: Path, s: str, key: str, cache: bool) -> Path | None:
  # any failure (the compiler's, a full disk) leaves the object to the build, which then reports it
  try:
    out = Path(tempfile.mkdtemp(prefix="aot_prebuild_")) / f"{key}.o"
    run_build_command(tc.command(runtime, s, str(out)), runtime)
  except (BuildError, OSError):
    return None
  if cache:
    store(out, cache_dir() / "obj" / f"{key}.o")
  return out


def _take_prebuilt(key: str, o: str) -> bool:
  """The prebuilt object of this key copied to o, if one was started (waiting for it to finish)."""
  job = _prebuilt.pop(key, None)
  made = job.result() if job is not None else None
  if made is None:
    return False
  shutil.copyfile(made, o)
  shutil.rmtree(made.parent, ignore_errors=True)
  return True


def build_library(
  src_dir: Path,
  sources: list[str],
  out_path: Path,
  cpu: str = "native",
  cache: bool = True,
  progress: Callable[[int, int], None] | None = None,
  triple: str | None = None,
  sanitize: bool = False,
) -> bool:
  """Compile the C, assembly and LLVM IR sources (names relative to src_dir) and link them into out_path, and archive
  the same objects into the static library beside it (static_library_path); sanitize builds the C with
  AddressSanitizer and UBSan (SANITIZE_FLAGS). Returns True when the libraries came from the cache."""
  tc = toolchain(cpu, triple, sanitize, llvm=any(s.endswith(".ll") for s in sources))
  # what NAME_create checks the CPU has: written before the hashes below, which it is part of
  (src_dir / CHECK_HEADER).write_text(tc.check_header)
  # headers are part of what a source means (NAME.h holds the arena size model.c allocates): those the sources
  # include, not every header in src_dir, so that editing a runtime part the model does not call keeps its library
  source_headers = sorted({h for s in sources for h in included_headers(src_dir, s)})
  headers = b"".join(h.encode() + (src_dir / h).read_bytes() for h in source_headers)
  link_flags = [soname_flag(out_path)] + ([f for f in SANITIZE_FLAGS if f.startswith("-fsanitize")] if sanitize else [])
  h = hashlib.sha256(" ".join([tc.ident, *tc.flags, *tc.kernel_only, *link_flags]).encode() + headers)
  for s in sorted(sources) + ["weights.bin"]:
    if (src_dir / s).exists():
      h.update(s.encode() + (src_dir / s).read_bytes())
  key = h.hexdigest()[:32]
  cached, cached_a = cache_dir() / key / "lib.so", cache_dir() / key / static_library_path(out_path).name
  # both, or a build: a trim may have taken one (the objects it then links are likely still cached)
  if cache and fetch(cached_a, static_library_path(out_path)) and fetch(cached, out_path):
    return True
  compiler = tc.compiler
  llvm_target = None
  modules = sum(s.endswith(".ll") for s in sources)
  if modules:
    from aot.codegen.render.llvm import object_command, object_target
    from aot.codegen.render.llvm_object import emit_object

    llvm_target = object_target(triple, cpu)
  with tempfile.TemporaryDirectory(prefix="aot_build_") as tmp:
    objs = [str(Path(tmp) / (Path(s).stem + ".o")) for s in sources]
    done = [0]

    def compile_one(args):
      s, o = args
      # objects are cached too: the runtime, and kernels shared by many models, compile once
      okey = tc.object_key(src_dir, s)
      cached_o = cache_dir() / "obj" / (okey + ".o")
      if not _take_prebuilt(okey, o) and not (cache and fetch(cached_o, Path(o))):
        if s.endswith(".ll") and sys.executable and modules > 1:
          run_build_command(object_command(src_dir / s, Path(o), llvm_target), src_dir)
        elif s.endswith(".ll"):
          # in this process where there is one module (nothing to run beside it: a process of its own cost 0.09 s of
          # a node case's 0.24 s compile) or no interpreter to start (Python embedded in another program)
          t = llvm_target
          Path(o).write_bytes(emit_object((src_dir / s).read_text(), t.triple, t.cpu, t.features))
        else:
          run_build_command(tc.command(src_dir, s, o), src_dir)
        if cache:
          store(Path(o), cached_o)
      done[0] += 1
      if progress:
        progress(done[0], len(sources))

    # the runtime's files first (dense code: aot_qgemm.c's 19 KB take 0.8 s, a generated file of 84 KB 0.3 s), then
    # the big kernel files, so the last one to finish is a small one
    jobs = sorted(zip(sources, objs), key=lambda so: (not is_runtime_source(so[0]), -(src_dir / so[0]).stat().st_size))
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as ex:
      list(ex.map(compile_one, jobs))
    tmp_so = Path(tmp) / "lib.so"
    tmp_a = Path(tmp) / static_library_path(out_path).name

    def archive():
      build_static_archive(compiler, objs, tmp_a, triple, src_dir)
      shutil.copyfile(tmp_a, static_library_path(out_path))
      if cache:
        store(tmp_a, cached_a)

    # the archive beside the link: both only read the objects, and with big weights linked in, each rewrites them
    # (ResNet-18's 47 MB: the archive's three steps 1 s, the link 0.4 s)
    with ThreadPoolExecutor(max_workers=1) as ex:
      archived = ex.submit(archive)
      link = [compiler, "-shared", "-pthread", *link_flags, "-o", str(tmp_so), *objs, "-lm", "-ldl"]
      run_build_command(link, src_dir)
      archived.result()
    shutil.copyfile(tmp_so, out_path)
    if cache:
      store(tmp_so, cached)
  return False


def static_library_path(library: Path) -> Path:
  """libNAME.a beside libNAME.so."""
  return library.with_suffix(".a")


def build_static_archive(compiler: str, objs: list[str], out: Path, triple: str | None, cwd: Path) -> None:
  """libNAME.a from the objects of libNAME.so: linked into one relocatable object (the compiler driver's -r, which
  knows the target's linker), whose hidden symbols (the runtime's aot_* functions, the kernels, the weights: what the
  .so keeps to itself) are then made local, then archived. Hidden visibility alone does not keep a static link from
  clashing: two models' archives in one program would each define aot_arena_alloc. Left global: the C API, as the .so
  exports it."""
  combined = out.with_name(f"{out.stem}.o")
  # the linker the driver runs, called directly: the driver's start took 25 ms of a 30 ms step
  run_build_command([_linker(compiler), "-r", "-o", str(combined), *objs], cwd)
  run_build_command([binutil("objcopy", triple), "--localize-hidden", str(combined)], cwd)
  out.unlink(missing_ok=True)
  if not write_archive(combined, out):
    run_build_command([binutil("ar", triple), "rcs", str(out), str(combined)], cwd)


@functools.lru_cache(maxsize=None)
def _linker(compiler: str) -> str:
  """The linker compiler runs (-print-prog-name=ld: gcc's name on PATH, clang's path, a cross gcc's own)."""
  found = subprocess.run([compiler, "-print-prog-name=ld"], capture_output=True, text=True).stdout.strip()
  return found or "ld"


def binutil(tool: str, triple: str | None) -> str:
  """objcopy or ar for the target: a cross build's own (aarch64-linux-gnu-objcopy), else LLVM's, which know every
  target; natively binutils' own, else LLVM's."""
  llvm = (f"llvm-{tool}-19", f"llvm-{tool}")
  names = (f"{triple}-{tool}", *llvm, tool) if triple else (tool, *llvm)
  return _which(names, f"{tool} (Debian: apt-get install binutils)")


_INCLUDE = re.compile(rb'^\s*#\s*include\s*"([^"]+)"', re.MULTILINE)


def included_headers(src_dir: Path, source: str) -> list[str]:
  """The headers in src_dir that source includes with #include "...", directly or through another header, sorted."""
  seen: set[str] = set()
  todo = [source]
  while todo:
    for name in _INCLUDE.findall((src_dir / todo.pop()).read_bytes()):
      h = name.decode()
      if h not in seen and (src_dir / h).is_file():
        seen.add(h)
        todo.append(h)
  return sorted(seen)


def gpu_build_steps(target: str, src: Path, out: Path, emulate: bool, offload_arch, cpu: str):
  """The commands that build libNAME.so from src/ (each run in src/), in order."""
  c_flags = ["-O2", "-fPIC", "-fvisibility=hidden", "-fno-math-errno", "-std=gnu11", f"-Wa,-I{src}"]
  # the host code of a GPU library only launches kernels: built for any x86-64 (or the cpu asked for); an emulated
  # build runs its kernels on this CPU, so it is built for it, like the CPU targets
  if cpu != "generic" and (emulate or cpu != "native"):
    c_flags.append(f"-march={cpu}")
  tmp = Path(tempfile.mkdtemp(prefix="aot_gpu_build_"))
  steps, objs = [], []

  def compile_c(s: str, extra=()):
    o = str(tmp / (Path(s).stem + ".o"))
    objs.append(o)
    steps.append([cc(), *c_flags, *extra, "-c", s, "-o", o])

  if emulate:
    o = str(tmp / "emulate.o")
    objs.append(o)
    steps.append(_emulator_step(cpu, o))
    compile_c("model.c")
    compile_c("aot_runtime.c")
    # an emulated build's host is model.c of the CPU targets: its create checks the CPU as theirs does
    (src / CHECK_HEADER).write_text(cpu_target(cpu).header())
    compile_c(CHECK_SOURCE, arch_flags(baseline_cpu(None), None))
    link = [emulator_cxx(), "-shared", "-pthread", soname_flag(out), "-o", str(out), *objs, "-lm", "-ldl"]
    return steps + [link], tmp
  device, glue_flags = _device_step(target, offload_arch)
  steps.append(device)
  for s, extra in (("model.c", ()), ("aot_runtime.c", ()), (HOST_GLUE[target], glue_flags)):
    compile_c(s, extra)
  # the GPU runtime is dlopen'ed at create time: the library links against nothing of it
  return steps + [[cc(), "-shared", "-pthread", soname_flag(out), "-o", str(out), *objs, "-lm", "-ldl"]], tmp


def _emulator_step(cpu: str, o: str) -> list[str]:
  """The command compiling an emulated build's kernels (emulate.cpp, the kernel source over aot_gpu_shim.h) to o."""
  # C++17, not gnu++17: no contraction of a*b+c into fma, so results match the CPU targets' rounding
  return [
    emulator_cxx(),
    "-O2",
    "-fPIC",
    "-fvisibility=hidden",
    "-fno-math-errno",
    "-std=c++17",
    "-w",
    *([f"-march={cpu}"] if cpu != "generic" else []),
    "-c",
    "emulate.cpp",
    "-o",
    o,
  ]


def _device_step(target: str, offload_arch) -> tuple[list[str], list[str]]:
  """The command building the device image of a CUDA or HIP build, and the flags its host glue compiles with."""
  if target == "cuda":
    # uncompressed: the PTX stays readable in the artifact (and the driver skips a decompression at load)
    return [
      nvcc(),
      "-fatbin",
      "-O3",
      "-std=c++17",
      "--no-compress",
      f"-gencode=arch=compute_{CUDA_ARCH},code=sm_{CUDA_ARCH}",
      f"-gencode=arch=compute_{CUDA_ARCH},code=compute_{CUDA_ARCH}",
      "-I.",
      KERNEL_SOURCE[target],
      "-o",
      DEVICE_IMAGE[target],
    ], [f"-I{cuda_include()}"]
  arches = [f"--offload-arch={a}" for a in (offload_arch or DEFAULT_OFFLOAD_ARCH)]
  return [
    clang(),
    "-x",
    "hip",
    *arches,
    "-nogpulib",
    "-nogpuinc",
    "--cuda-device-only",
    "-O3",
    "-std=c++17",
    "-I.",
    "-c",
    KERNEL_SOURCE[target],
    "-o",
    DEVICE_IMAGE[target],
  ], [f"-I{hip_include()}"]


def build_gpu_library(target: str, src: Path, out: Path, emulate: bool, offload_arch, cpu: str, cache: bool) -> bool:
  """Build src/ into out, and the device image into src/ (both cached by the hash of every source and command, with
  the build's own paths left out). Returns True when they came from the cache."""
  steps, tmp = gpu_build_steps(target, src, out, emulate, offload_arch, cpu)
  try:
    paths = {str(src): "SRC", str(tmp): "TMP", str(out): "OUT"}

    def portable(arg: str) -> str:
      for p, name in paths.items():
        arg = arg.replace(p, name)
      return arg

    # "native" means this machine's CPU, which the command line does not say
    from aot.codegen.render.llvm import host_target

    h = hashlib.sha256(json.dumps([host_target()] + [[portable(a) for a in s] for s in steps]).encode())
    for f in sorted(src.iterdir()):
      if f.is_file():
        h.update(f.name.encode() + f.read_bytes())
    cached = cache_dir() / f"gpu-{h.hexdigest()[:32]}"
    image = None if emulate else DEVICE_IMAGE[target]
    if cache and (image is None or fetch(cached / image, src / image)) and fetch(cached / "lib.so", out):
      return True
    for s in steps:
      run_build_command(s, src)
    if cache:
      if image:
        store(src / image, cached / image)
      store(out, cached / "lib.so")
    return False
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


def check_metal_syntax(src: Path) -> None:
  """Compile kernels.metal as C++ with clang and a stand-in for <metal_stdlib> (runtime_c/aot_metal_shim.h): catches
  syntax and type errors in the generated source (it cannot catch what only Apple's compiler rejects)."""
  runtime = importlib.resources.files("aot.runtime_c")
  with tempfile.TemporaryDirectory(prefix="aot_metal_") as d:
    (Path(d) / "metal_stdlib").write_text(runtime.joinpath("aot_metal_shim.h").read_text())
    run_build_command(
      [
        clang(),
        "-x",
        "c++",
        "-std=c++17",
        "-fsyntax-only",
        "-Wall",
        "-Werror",
        "-Wno-unknown-attributes",
        "-Wno-unused-variable",
        "-Wno-unused-function",
        "-I",
        d,
        str(src / "kernels.metal"),
      ],
      src,
    )


def gpu_manifest(target: str, emulate: bool, launches: list, offload_arch) -> dict:
  """The manifest's "gpu" field: each kernel's launch, and what device code the build made."""
  gpu = {
    "emulated": emulate,
    "launches": [
      {"function": fn, "grid": l.grid, "block": l.block, "cooperative": l.cooperative} for fn, _, l in launches
    ],
  }
  if target == "hip":
    gpu["offload_arch"] = list(offload_arch or DEFAULT_OFFLOAD_ARCH)
  if target == "cuda" and not emulate:
    gpu["cuda_arch"] = [f"sm_{CUDA_ARCH}", f"compute_{CUDA_ARCH}"]
  if target == "metal":
    gpu["built"] = "on macOS: sh src/build_macos.sh"
  return gpu
