"""The artifact: libNAME.so, NAME.h (the C API with a per-model prefix), NAME.json (the manifest), src/."""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from aot.core.dtype import DType, Narrow, dtypes, narrow_of, to_dtype
from aot.core.ir import file_mapping
from aot.dim_size import size_of
from aot.errors import ArtifactError
from aot.scheduler.kernel import Buffer, Schedule

# a model's name is its files' (NAMEConfig.cmake, libNAME.so) and its symbols' prefix: a longer one (a graph named by
# an exporter after all its nodes) keeps this much and a hash of the rest, within a file name's 255 bytes
C_NAME_MAX = 200


def c_name(name: str) -> str:
  s = re.sub(r"\W", "_", name)
  s = s if s and not s[0].isdigit() else f"m_{s}"
  if len(s) > C_NAME_MAX:
    s = f"{s[: C_NAME_MAX - 9]}_{hashlib.sha256(s.encode()).hexdigest()[:8]}"
  return s


def api_type(dt: DType) -> str:
  # the header must be valid C and C++ everywhere: half crosses the API as its bits
  return "uint16_t" if dt == dtypes.float16 else dt.cname


# names C allows that C++ reserves: NAME.h is C and C++, so a parameter called so gets a trailing _ (and NAME.hpp's
# namespace, a model called so)
CPP_KEYWORDS = frozenset(
  "alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t char16_t char32_t class compl "
  "concept const consteval constexpr constinit const_cast continue co_await co_return co_yield decltype default "
  "delete do double dynamic_cast else enum explicit export extern false float for friend goto if inline int long "
  "mutable namespace new noexcept not not_eq nullptr operator or or_eq private protected public register "
  "reinterpret_cast requires return short signed sizeof static static_assert static_cast struct switch template this "
  "thread_local throw true try typedef typeid typename union unsigned using virtual void volatile wchar_t while xor "
  "xor_eq std restrict".split()
)


# the names model.c's run functions declare beside the tensors' (the instance m, the arena A, the weights W; a call's
# pointers a, gemm g, steps s, depthwise d, pool p, timer t, ...): a tensor called so gets a trailing _ as a parameter,
# else the call's own name hid it (a model whose output was called "a" crashed: void *a[] = {(float *)a, ...})
GENERATED_NAMES = frozenset("m A W a d g p s t i k st io plane b_ n_ checks_ status_ cpu_status".split())


def param_names(sched: Schedule) -> tuple[list[str], list[str]]:
  used: set = set()

  def unique(n: str) -> str:
    n = c_name(n)
    while n in used or n in GENERATED_NAMES or n in CPP_KEYWORDS:
      n += "_"
    used.add(n)
    return n

  return [unique(b.name) for b in sched.inputs], [unique(b.name) for b in sched.outputs]


# the C API's number (NAME_ABI_VERSION in NAME.h, "abi_version" in NAME.json): bumped when an entry point changes its
# signature or meaning, so that a program built against one artifact's header can tell whether another's fits
ABI_VERSION = 1

# weights above this size go to NAME.weights beside the library and are mmapped at create time, rather than linked in:
# a library of hundreds of MB is slow to link, copy and cache
WEIGHTS_INLINE_MAX = 64 << 20
# constants up to this size are stored once however many copies of them a compile makes (WeightsWriter)
SHARE_MAX = 16 << 20
# NAME_create checks a mapped weights file's size and a checksum of this many blocks of this many bytes spread evenly
# over it (all of it when smaller): 256 KB read whatever the size, so a 1 GB model still creates in milliseconds; it
# catches a truncated file, one from another build, one rewritten, not a flipped bit between the blocks
WEIGHTS_CHECK_BLOCKS = 64
WEIGHTS_CHECK_BLOCK_BYTES = 4096


@dataclass(frozen=True)
class ExternalWeights:
  """NAME.weights as the library expects it at create."""

  nbytes: int
  checksum: int


def weights_checksum(data) -> int:
  """The checksum NAME_create computes (load_weights below): the 64-bit words of the sampled blocks, each times an odd
  number that grows with its place (so a changed or moved word changes the sum), added modulo 2**64. data: the
  weights' bytes, or a path to them (only the blocks are read)."""
  import numpy as np

  size = Path(data).stat().st_size if isinstance(data, (str, Path)) else len(data)
  n, block = WEIGHTS_CHECK_BLOCKS, WEIGHTS_CHECK_BLOCK_BYTES
  spans = [(0, size)] if size <= n * block else [(i * (size - block) // (n - 1) // 8 * 8, block) for i in range(n)]
  if isinstance(data, (str, Path)):
    with open(data, "rb") as f:
      chunks = [os.pread(f.fileno(), m - m % 8, a) for a, m in spans]
  else:
    chunks = [bytes(data[a : a + m - m % 8]) for a, m in spans]
  words = np.frombuffer(b"".join(chunks), dtype="<u8")
  odd = np.arange(len(words), dtype=np.uint64) * np.uint64(2) + np.uint64(1)
  return int(np.sum(words * odd, dtype=np.uint64))


@dataclass(frozen=True)
class KernelInfo:
  name: str
  function: str
  shape: tuple


@dataclass(frozen=True)
class TensorInfo:
  name: str
  shape: tuple
  dtype: DType  # of the buffer the C API takes: for a narrow type, its storage
  narrow: Narrow | None = None


# what every manifest has (the rest has defaults): a manifest without one of them is not one this loader can read
MANIFEST_KEYS = ("name", "target", "arena_bytes", "weights_bytes", "kernels", "inputs", "outputs")


def _manifest_path(d: Path) -> Path:
  """The artifact's manifest: the NAME.json beside NAME.h (a profile build's folder also holds profile.json)."""
  found = sorted(d.glob("*.json"))
  manifests = [p for p in found if p.with_suffix(".h").exists()]
  if len(manifests) == 1:
    return manifests[0]
  if not d.is_dir():
    raise ArtifactError(f"{d} is not an artifact folder: no such folder")
  if manifests:
    names = ", ".join(p.name for p in manifests)
    raise ArtifactError(f"{d} holds {len(manifests)} artifacts ({names}): compile each into its own folder")
  # a NAME.json whose library is here, else any: the header is what is missing
  lone = [p for p in found if (d / f"lib{p.stem}.so").exists()] or found
  if lone:
    raise ArtifactError(f"{d} is not a whole artifact: {lone[0].name} is there, but not {lone[0].stem}.h beside it")
  raise ArtifactError(f"{d} is not an artifact folder: no NAME.json and NAME.h in it")


def _read_manifest(path: Path) -> dict:
  try:
    m = json.loads(path.read_text())
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ArtifactError(f"{path} is not a manifest aot can read (truncated or damaged? {e}): compile again") from None
  missing = [k for k in MANIFEST_KEYS if not isinstance(m, dict) or k not in m]
  if missing:
    raise ArtifactError(f"{path} is not a manifest aot can read: no {', '.join(map(repr, missing))} in it")
  return m


class Artifact:
  """A compiled model on disk, described by its manifest."""

  def __init__(self, path):
    self.dir = Path(path)
    self.manifest = m = _read_manifest(_manifest_path(self.dir))
    self.name: str = m["name"]
    self.target: str = m["target"]
    self.arena_bytes: int = m["arena_bytes"]
    # every buffer placed in the arena, added up: what it would take without reusing memory between them
    self.arena_holds_bytes: int = m.get("arena_holds_bytes", m["arena_bytes"])
    self.weights_bytes: int = m["weights_bytes"]
    self.kernels = [KernelInfo(k["name"], k["function"], tuple(k["shape"])) for k in m["kernels"]]
    info = lambda t: TensorInfo(
      t["name"], tuple(t["shape"]), to_dtype(t.get("storage", t["dtype"])), narrow_of(t["dtype"])
    )
    self.inputs = [info(t) for t in m["inputs"]]
    self.outputs = [info(t) for t in m["outputs"]]
    self.compile_seconds: float = m.get("compile_seconds", 0.0)
    # sequence and optional inputs/outputs: runs of the tensors above that aot.load passes as one list (or None)
    self.containers: list[dict] = m.get("containers", [])
    # model inputs that are indices (aot/core/ir.py IndexCheck), by name: the size of the smallest axis each indexes
    self.indexed_inputs: dict[str, int] = m.get("indexed_inputs", {})
    # dims with a range ({name, min, max}): named in the shapes of the inputs and outputs that have them
    self.dims: list[dict] = m.get("dims", [])

  def at_size(self, sizes: dict | None = None) -> tuple[list[TensorInfo], list[TensorInfo]]:
    """The inputs and outputs with each ranged dim (dims: frontends/batch_dims.py) at its size in sizes (by name), by
    default its largest; a static artifact's as they are."""
    n = {d["name"]: (sizes or {}).get(d["name"], d["max"]) for d in self.dims}
    at = lambda t: TensorInfo(t.name, tuple(size_of(d, n) for d in t.shape), t.dtype, t.narrow)
    return [at(t) for t in self.inputs], [at(t) for t in self.outputs]

  @property
  def library_path(self) -> Path:
    return self.dir / f"lib{self.name}.so"

  @property
  def static_library_path(self) -> Path:
    """libNAME.a (CPU targets): the library's objects, linked into a program with no libNAME.so to find at run time."""
    return self.dir / f"lib{self.name}.a"

  @property
  def header_path(self) -> Path:
    return self.dir / f"{self.name}.h"

  @property
  def num_kernels(self) -> int:
    return len(self.kernels)

  def __repr__(self) -> str:
    return f"<Artifact {self.name} {self.target} {len(self.kernels)} kernels, arena {self.arena_bytes} B at {self.dir}>"


def make_stage(name: str, out_dir) -> tuple[Path, Path]:
  """(out, stage): the artifact's folder, and a staging folder beside it with an empty src/. The build happens there,
  and install() moves it into place only when everything worked: a failure leaves nothing behind."""
  import tempfile

  out = Path(out_dir) if out_dir is not None else Path(tempfile.mkdtemp(prefix=f"aot_{name}_"))
  stage = Path(tempfile.mkdtemp(prefix=".aot_stage_", dir=out.parent if out.parent.exists() else None))
  (stage / "src").mkdir()
  return out, stage


def release_mapped_pages(x) -> None:
  """Drop the pages of a memory-mapped array (an ONNX model's external weights) from this process's resident memory:
  the file is read-only, so a later read pages them in again. Anything else is left alone."""
  import mmap

  if (m := file_mapping(x)) is not None:
    m.madvise(mmap.MADV_DONTNEED)


class WeightsWriter:
  """The weights blob written to a file as its constants are made: each goes to its offset and can then be dropped,
  so the blob is never in memory as a whole. path None: only the layout (offsets and size), nothing written."""

  def __init__(self, path: Path | None):
    self.path, self.size = path, 0
    # offsets of the constants written so far, by contents (up to SHARE_MAX bytes): an unrolled recurrent layer packs
    # its R once per step, and its gate constants are made per step; each is stored once (a CRNN's blob was 13x its
    # model's weights). Bigger constants are not hashed: nothing repeats them, and a 1 GB model would pay for it.
    self.by_contents: dict[tuple, int] = {}
    self.checksum: int | None = None  # of the finished file, when it is NAME.weights (weights_checksum)
    self.file = open(path, "wb") if path is not None else None

  def add(self, b: Buffer) -> None:
    """Place the constant b at the end of the blob (b.offset) and write its data there."""
    import numpy as np

    from aot.scheduler.memory import align_up

    data = np.ascontiguousarray(b.data, dtype=b.dtype.np).reshape(-1).view(np.uint8) if b.data is not None else None
    key = None
    if data is not None and 0 < b.nbytes <= SHARE_MAX:
      key = (b.nbytes, hashlib.blake2b(data.data, digest_size=16).digest())
      if key in self.by_contents:
        b.offset = self.by_contents[key]
        return
    b.offset = self.size
    self.size = align_up(b.offset + b.nbytes)
    if key is not None:
      self.by_contents[key] = b.offset
    if self.file is not None and b.nbytes:
      self.file.seek(b.offset)
      self.file.write(data.data)

  def add_consts(self, bufs) -> None:
    """Write the constants bufs in order, each mapped weight's pages released once written."""
    for b in bufs:
      self.add(b)
      release_mapped_pages(b.data)

  def close(self) -> None:
    """Finish the file: the padding after the last constant is zeros, like the gaps between them."""
    if self.file is not None:
      self.file.truncate(self.size)
      self.file.close()
      self.file = None

  def finish(self) -> ExternalWeights | None:
    """Close the file; above WEIGHTS_INLINE_MAX it is NAME.weights beside the library, checked at create (its
    checksum kept here for the manifest)."""
    self.close()
    external = (
      ExternalWeights(self.size, weights_checksum(self.path) if self.path else 0)
      if self.size > WEIGHTS_INLINE_MAX
      else None
    )
    self.checksum = external.checksum if external else None
    return external


def place_sources(stage: Path, name: str, files: dict[str, str], blob: bytes | Path) -> None:
  """The sources into stage/src/, and the weights (bytes, or a file a WeightsWriter wrote, moved) to src/weights.bin,
  linked in, or to NAME.weights beside the library when bigger than WEIGHTS_INLINE_MAX."""
  for fname, text in files.items():
    (stage / "src" / fname).write_text(text)
  size = blob.stat().st_size if isinstance(blob, Path) else len(blob)
  dest = stage / "src" / "weights.bin" if size <= WEIGHTS_INLINE_MAX else stage / f"{name}.weights"
  if isinstance(blob, Path):
    blob.replace(dest)
  else:
    dest.write_bytes(blob)


def install(stage: Path, out: Path):
  """Move a built artifact from its staging folder into out, replacing the artifact there: a failed build never
  leaves a mix of old and new files."""
  import shutil

  out.mkdir(parents=True, exist_ok=True)
  for pattern in ("*.json", "lib*.so", "lib*.a", "*.h", "*.hpp", "*.weights"):
    for old in out.glob(pattern):
      old.unlink()
  if (out / "src").exists():
    shutil.rmtree(out / "src")
  for p in stage.iterdir():
    shutil.move(str(p), str(out / p.name))


@dataclass(frozen=True)
class Built:
  """What the driver made, for NAME.json: the target it built for, the kernel list, the arena (its size, and the bytes
  of every buffer placed in it), the weights (size, and checksum when external) and the compile's time; gpu: a GPU
  target's own fields (aot/build.py gpu_manifest); cpu_target: a CPU target's (what --cpu resolved to)."""

  name: str
  target: str
  cpu: str
  triple: str | None
  kernels: list[KernelInfo]
  arena: int
  arena_holds: int
  weights: int
  weights_checksum: int | None
  seconds: float
  gpu: dict | None = None
  # a CPU build's aot/cpu.py CpuTarget: the CPU the compiler made of --cpu, the extensions NAME_create checks for
  cpu_target: object = None


def write_manifest(path: Path, sched: Schedule, built: Built) -> None:
  """NAME.json: the schedule's inputs and outputs, and what was built from it."""
  from aot import __version__

  dims = [d for d in (sched.batch, sched.extent) if d is not None]

  def t(b: Buffer, side: str, i: int) -> dict:
    # (an output's axis that windows derived from a dim run to a size is named by their form: aot/dim_size.py)
    named = {
      a: d.axis_form(b.shape[a]).text(d.dim.name)
      for d in dims
      if (a := (d.inputs if side == "input" else d.outputs)[i]) >= 0
    }
    if named:
      # a ranged dim is named in the shape, as ONNX and onnxruntime write a symbolic one
      return {"name": b.name, "shape": [named.get(a, s) for a, s in enumerate(b.shape)], "dtype": b.dtype.name}
    if b.name not in sched.formats:
      return {"name": b.name, "shape": list(b.shape), "dtype": b.dtype.name}
    fmt, shape = sched.formats[b.name]
    return {"name": b.name, "shape": list(shape), "dtype": fmt, "storage": b.dtype.name, "storage_shape": list(b.shape)}

  external = built.weights > WEIGHTS_INLINE_MAX
  path.write_text(
    json.dumps(
      {
        "name": built.name,
        "target": built.target,
        "cpu": built.cpu,
        **(
          {"cpu_resolved": built.cpu_target.resolved, "cpu_features": list(built.cpu_target.features)}
          if built.cpu_target is not None
          else {}
        ),
        "triple": built.triple,
        "compiler": f"aot-compiler {__version__}",
        "abi_version": ABI_VERSION,
        "inputs": [t(b, "input", i) for i, b in enumerate(sched.inputs)],
        "outputs": [t(b, "output", i) for i, b in enumerate(sched.outputs)],
        **({"dims": [_dim_entry(d) for d in dims]} if dims else {}),
        "kernels": [{"name": k.name, "function": k.function, "shape": list(k.shape)} for k in built.kernels],
        "arena_bytes": built.arena,
        "arena_holds_bytes": built.arena_holds,
        "weights_bytes": built.weights,
        "weights_file": f"{built.name}.weights" if external else None,
        **(
          {"weights_checksum": f"{built.weights_checksum:016x}"}
          if external and built.weights_checksum is not None
          else {}
        ),
        **({"containers": sched.containers} if sched.containers else {}),
        # inputs that are indices, and the size of the smallest axis each indexes: --check draws valid ones
        **({"indexed_inputs": sched.indexed} if sched.indexed else {}),
        "compile_seconds": round(built.seconds, 3),
        **({"gpu": built.gpu} if built.gpu is not None else {}),
      },
      indent=1,
    )
  )


def _dim_entry(batch) -> dict:
  """A ranged dim in the manifest: its name and bounds, and how it runs (frontends/batch_dims.py)."""
  return {"name": batch.dim.name, "min": batch.dim.lo, "max": batch.dim.hi, "runs": batch.runs}


def write_link_files(folder: Path, name: str, static: bool) -> None:
  """NAME.pc (pkg-config) and NAMEConfig.cmake (find_package(NAME) -> the imported target NAME::NAME) beside the
  library: both name the folder they are in, so a moved artifact still links. static (CPU targets, which have
  libNAME.a): also what a static link needs, Libs.private and the imported target NAME::NAME_static."""
  from aot import __version__

  # what the runtime calls: libm, dlopen/dladdr (external weights), pthreads; a static link must name them itself
  private = "Libs.private: -lm -ldl -pthread\n" if static else ""
  (folder / f"{name}.pc").write_text(
    f"""# {name}: a model compiled ahead of time by aot (compile-model); PKG_CONFIG_PATH=this folder
# a static program: cc app.c $(pkg-config --static --cflags --libs {name}) -static
prefix=${{pcfiledir}}
{"staticlib=${prefix}/lib" + name + ".a" + chr(10) if static else ""}
Name: {name}
Description: the {name} model compiled by aot
Version: {__version__}
Cflags: -I${{prefix}}
Libs: -L${{prefix}} -l{name} -Wl,-rpath,${{prefix}}
{private}"""
  )
  (folder / f"{name}Config.cmake").write_text(
    f"""# {name}: a model compiled ahead of time by aot (compile-model). find_package({name} CONFIG PATHS this folder)
# gives the imported target {name}::{name}: its header's folder and libNAME.so, which the program finds by rpath
set({name}_VERSION "{__version__}")
if(NOT TARGET {name}::{name})
  add_library({name}::{name} SHARED IMPORTED)
  set_target_properties({name}::{name} PROPERTIES
    IMPORTED_LOCATION "${{CMAKE_CURRENT_LIST_DIR}}/lib{name}.so"
    IMPORTED_SONAME "lib{name}.so"
    INTERFACE_INCLUDE_DIRECTORIES "${{CMAKE_CURRENT_LIST_DIR}}")
endif()
{_cmake_static_target(name) if static else ""}"""
  )


def _cmake_static_target(name: str) -> str:
  return f"""# {name}::{name}_static: lib{name}.a, linked into the program (nothing to find at run time but
# NAME.weights, if the model has one), with the system libraries the runtime calls
if(NOT TARGET {name}::{name}_static)
  include(CMakeFindDependencyMacro)
  find_dependency(Threads)
  add_library({name}::{name}_static STATIC IMPORTED)
  set_target_properties({name}::{name}_static PROPERTIES
    IMPORTED_LOCATION "${{CMAKE_CURRENT_LIST_DIR}}/lib{name}.a"
    IMPORTED_LINK_INTERFACE_LANGUAGES "C"
    INTERFACE_INCLUDE_DIRECTORIES "${{CMAKE_CURRENT_LIST_DIR}}"
    INTERFACE_LINK_LIBRARIES "m;${{CMAKE_DL_LIBS}};Threads::Threads")
endif()
"""
