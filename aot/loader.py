"""Calling an artifact from Python: numpy arrays in, numpy arrays out, through cffi (ABI mode: no compiler needed)."""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import cffi
import numpy as np

from aot.artifact import Artifact, api_type
from aot.errors import (
  ArtifactError,
  IndexRangeError,
  InputCountError,
  InputDtypeError,
  InputShapeError,
  InvalidArgumentError,
  ModelClosedError,
  RunError,
  UnsupportedCpuError,
)

# runtime_c/aot_core.h: a value a call cannot take
AOT_ERR_INVALID_ARGUMENT = 3
# runtime_c/aot_core.h: a run given an index outside the axis it indexes
AOT_ERR_INDEX_RANGE = 5
# runtime_c/aot_core.h: create on a CPU lacking an extension the library was built for (--cpu)
AOT_ERR_UNSUPPORTED_CPU = 6

_ffi_lock = threading.Lock()
# numbers the hard links libraries are opened through (_open_library)
_link_numbers = itertools.count()
# libraries opened under their own path (where no link could be made): path -> [inode, models holding it open]
_opened_in_place: dict[str, list[int]] = {}


def dim_sizes(a: Artifact, arrays) -> dict[str, int]:
  """Each ranged dim's size (by name) in these inputs of artifact a: in its range and the same in every input that
  has it, else an InputShapeError naming the input and the dim."""
  sizes = {}
  for dim in a.dims:
    name, n, first = dim["name"], None, None
    for t, x in zip(a.inputs, arrays):
      if name not in t.shape:
        continue
      shape, axis = np.shape(x), t.shape.index(name)
      if len(shape) != len(t.shape):
        raise InputShapeError(
          f"{a.name} input '{t.name}': expected shape {t.shape}, got {shape}", t.name, t.shape, shape
        )
      size = shape[axis]
      why = f"outside {dim['min']}..{dim['max']}" if not dim["min"] <= size <= dim["max"] else ""
      why = why or (f"but input '{first}' has {n}" if n is not None and size != n else "")
      if why:
        raise InputShapeError(
          f"{a.name} input '{t.name}' dim {axis} ('{name}') is {size}, {why}", t.name, t.shape, shape
        )
      n, first = size, first or t.name
    sizes[name] = n
  return sizes


class LoadedModel:
  """One instance of a compiled model (its own arena). Calling it checks every input's shape and dtype. Threads may
  share it: the library runs one call on an instance at a time (NAME.h); close() waits for the calls under way."""

  def __init__(self, artifact: Artifact, threads: int | None = None):
    self.artifact = a = artifact
    # the calls under way, which close() waits for: the C instance must not be destroyed under one
    self._calls, self._idle = 0, threading.Condition()
    self.ffi = ffi = cffi.FFI()
    n = a.name
    args = [f"const {api_type(t.dtype)} *" for t in a.inputs] + [f"{api_type(t.dtype)} *" for t in a.outputs]
    # an artifact with a ranged dim takes each tensor's shape after its data (NAME_run_dims)
    shaped = [f"{p}, {'const ' if i < len(a.inputs) else ''}int64_t *" for i, p in enumerate(args)]
    run = f"{n}_run_dims({n}_model *m, {', '.join(shaped)})" if a.dims else f"{n}_run({n}_model *m, {', '.join(args)})"
    ffi.cdef(f"""typedef struct {n}_model {n}_model;
      int {n}_create({n}_model **out); int {run};
      int {n}_set_threads({n}_model *m, int n); int {n}_threads(const {n}_model *m);
      void {n}_destroy({n}_model *m); const char *{n}_last_error(const {n}_model *m);""")
    self.lib, self._in_place = _open_library(ffi, a)
    self._run = getattr(self.lib, f"{n}_run_dims" if a.dims else f"{n}_run")
    self._destroy = getattr(self.lib, f"{n}_destroy")
    self._last_error = getattr(self.lib, f"{n}_last_error")
    out = ffi.new(f"{n}_model **")
    if (status := getattr(self.lib, f"{n}_create")(out)) != 0:
      hint = ""
      # GPU targets, a mapped weights file and the CPU check say why create failed through last_error(NULL)
      if "gpu" in a.manifest or a.manifest.get("weights_file") or status == AOT_ERR_UNSUPPORTED_CPU:
        hint = ": " + ffi.string(self._last_error(ffi.NULL)).decode()
      error = UnsupportedCpuError if status == AOT_ERR_UNSUPPORTED_CPU else RunError
      raise error(f"{n}_create failed with status {status}{hint}", status)
    self._model = out[0]
    self._ptr_types = args
    # a ranged dim's size -> the inputs and outputs at it, and their shapes as the C API takes them (_at_sizes)
    self._sizes: dict[int, tuple] = {}
    # what get_inputs / get_outputs say, and the order a feed by name is put in: the artifact's, made once
    self._inputs, self._outputs = _infos(a, "input"), _infos(a, "output")
    if threads is not None:
      self.set_threads(threads)

  def set_threads(self, n: int) -> None:
    """Run the kernels on n threads, at most the cores the process may run on (NAME.h; results are bitwise the same
    for any n): threads says how many it took."""
    with self._call() as model:
      if (status := getattr(self.lib, f"{self.artifact.name}_set_threads")(model, int(n))) != 0:
        why = self.ffi.string(self._last_error(model)).decode()
        raise (InvalidArgumentError if status == AOT_ERR_INVALID_ARGUMENT else RunError)(why, status)

  @property
  def threads(self) -> int:
    """The threads the kernels run on (1: the calling thread alone)."""
    with self._call() as model:
      return getattr(self.lib, f"{self.artifact.name}_threads")(model)

  @contextlib.contextmanager
  def _call(self):
    """The C instance, counted as in use until the block ends."""
    with self._idle:
      if (model := getattr(self, "_model", None)) is None:
        raise ModelClosedError(f"{self.artifact.name} (loaded from {self.artifact.dir}) is closed: load it again")
      self._calls += 1
    try:
      yield model
    finally:
      with self._idle:
        self._calls -= 1
        self._idle.notify_all()

  def get_inputs(self) -> list[TensorInfo]:
    """The inputs a call takes, in order (onnxruntime's InferenceSession.get_inputs: name, shape, type)."""
    return list(self._inputs)

  def get_outputs(self) -> list[TensorInfo]:
    """The outputs a call returns, in order."""
    return list(self._outputs)

  def run(self, output_names: list[str] | None, input_feed: dict) -> list:
    """onnxruntime's InferenceSession.run: the outputs named (all when None), in that order, as a list, from the
    inputs fed by name."""
    outs = self(input_feed)
    outs = list(outs) if isinstance(outs, tuple) else [outs]
    if output_names is None:
      return outs
    names = [i.name for i in self._outputs]
    if unknown := [n for n in output_names if n not in names]:
      raise InputCountError(f"{self.artifact.name} has no output {', '.join(map(repr, unknown))}: it has {names}")
    return [outs[names.index(n)] for n in output_names]

  def __enter__(self) -> LoadedModel:
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def __call__(self, *arrays: np.ndarray, out=None, **feeds):
    """The outputs (one array, or a tuple) for the inputs in order, or fed by name: keywords, or one dict. out: arrays
    to write the outputs into (one, or one per output in order), returned as the outputs; each must have the
    output's shape and dtype, and is written in place without a copy where it is C-contiguous. An input named out is
    fed by dict."""
    a = self.artifact
    given = arrays[0] if len(arrays) == 1 and isinstance(arrays[0], dict) else None
    if feeds or given is not None:
      arrays = self._by_name({**(given or {}), **feeds}, mixed=given is None and bool(arrays))
    if a.containers:
      arrays = _flatten_containers(a, arrays)
    if len(arrays) != len(a.inputs):
      raise InputCountError(
        f"{a.name} takes {len(a.inputs)} inputs ({', '.join(t.name for t in a.inputs)}), got {len(arrays)}"
      )
    tins, touts, shapes = self._at_sizes(arrays) if a.dims else (a.inputs, a.outputs, None)
    ins = [self._input(t, x) for t, x in zip(tins, arrays)]
    targets = self._out_targets(out, touts)
    outs = [o if _writes_in_place(t, o, ins) else _empty(t) for t, o in zip(touts, targets)]
    ptrs = [self.ffi.cast(pt, x.ctypes.data) for pt, x in zip(self._ptr_types, ins + outs)]
    if shapes is not None:
      ptrs = [p for pair in zip(ptrs, shapes) for p in pair]
    with self._call() as model:
      # last_error is this thread's own call's message, whatever other threads ran on the instance since
      if (status := self._run(model, *ptrs)) != 0:
        why = self.ffi.string(self._last_error(model)).decode()
        if status == AOT_ERR_INDEX_RANGE:
          raise IndexRangeError(f"{a.name}_run: {why}")
        raise RunError(f"{a.name}_run failed (status {status}): {why}", status)
    outs = [t.narrow.from_storage(x, t.shape) if t.narrow else x for t, x in zip(touts, outs)]
    for i, (o, x) in enumerate(zip(targets, outs)):
      if o is not None and o is not x:
        o[...] = x
        outs[i] = o
    if a.containers:
      outs = [_grouped(outs, kind, start, count) for _, kind, start, count in _runs(a, "output")]
    return outs[0] if len(outs) == 1 else tuple(outs)

  def _at_sizes(self, arrays) -> tuple[list, list, list]:
    """The inputs and outputs with each ranged dim at the size the inputs have (dim_sizes), and their shapes as C
    arrays."""
    a, sizes = self.artifact, dim_sizes(self.artifact, arrays)
    key = tuple(sizes.values())
    if key not in self._sizes:
      # made once per size: a small model's call is a few microseconds
      tins, touts = a.at_size(sizes)
      self._sizes[key] = (tins, touts, [self.ffi.new("int64_t[]", list(t.shape) or [0]) for t in tins + touts])
    return self._sizes[key]

  def _input(self, t, x) -> np.ndarray:
    """An input as the C API takes it: checked against the artifact's shape and dtype, dense."""
    x = np.asarray(x)
    if x.shape != t.shape:
      raise InputShapeError(
        f"{self.artifact.name} input '{t.name}': expected shape {t.shape}, got {x.shape}", t.name, t.shape, x.shape
      )
    want = t.narrow.np if t.narrow else t.dtype.np
    if x.dtype != want:
      raise InputDtypeError(
        f"{self.artifact.name} input '{t.name}': expected dtype {want.name}, got {x.dtype}", t.name, want, x.dtype
      )
    # a narrow type crosses the C API as its codes, the 4- and 2-bit ones packed
    return t.narrow.to_storage(x) if t.narrow else np.ascontiguousarray(x)

  def _out_targets(self, out, outputs: list) -> list:
    """The caller's out= array of each C API output (None where it gave none), checked against the output (outputs:
    the artifact's, at this call's sizes)."""
    a = self.artifact
    if out is None:
      return [None] * len(a.outputs)
    if a.containers:
      raise InputCountError(f"{a.name} has sequence or optional inputs or outputs: out= takes plain tensors only")
    given = [out] if isinstance(out, np.ndarray) else list(out)
    if len(given) != len(a.outputs):
      raise InputCountError(f"{a.name} has {len(a.outputs)} outputs, out= gave {len(given)} arrays")
    for t, o in zip(outputs, given):
      want = t.narrow.np if t.narrow else t.dtype.np
      if not isinstance(o, np.ndarray) or o.shape != t.shape or o.dtype != want or not o.flags.writeable:
        got = f"{'' if o.flags.writeable else 'a read-only '}{o.dtype} {o.shape}" if isinstance(o, np.ndarray) else o
        raise InputShapeError(
          f"{a.name} output '{t.name}': out= needs a writable {want.name} array of shape {t.shape}, got {got}",
          t.name,
          (want.name, t.shape),
          got,
        )
    if any(np.shares_memory(o, p) for i, o in enumerate(given) for p in given[:i]):
      raise InputShapeError(f"{a.name}: out= arrays overlap one another", "out", "separate arrays", "overlapping")
    return given

  def _by_name(self, feed: dict, mixed: bool) -> tuple:
    """The inputs of a feed by name, in the call's order; every input named once."""
    names = [i.name for i in self._inputs]
    unknown, missing = [n for n in feed if n not in names], [n for n in names if n not in feed]
    if mixed or unknown or missing:
      why = "inputs in order or by name, not both" if mixed else ""
      why += f"no input {', '.join(map(repr, unknown))}" if unknown else ""
      why += f"{'; ' if why else ''}missing {', '.join(map(repr, missing))}" if missing else ""
      raise InputCountError(f"{self.artifact.name} takes inputs {names}: {why}")
    return tuple(feed[n] for n in names)

  def close(self):
    """Destroy the instance (once the calls under way are done; a call after this is a ModelClosedError) and unload
    the library. Unloading matters: glibc knows a loaded library by its file's inode, and a deleted artifact's inode
    can be reused by a new one, which dlopen would then mistake for the old."""
    idle = getattr(self, "_idle", None)
    if idle is None:  # __init__ failed before anything was made
      return
    with idle:
      # refuse new calls first: waiting for none to be under way while they kept coming could wait forever
      model, self._model = getattr(self, "_model", None), None
      while self._calls:
        idle.wait()
    if model is not None:
      self._destroy(model)
    if getattr(self, "lib", None) is not None:
      with _ffi_lock:
        self.ffi.dlclose(self.lib)
        if self._in_place:
          _release_in_place(self._in_place)
      self.lib = None

  def __del__(self):
    self.close()


def _open_library(ffi: cffi.FFI, a: Artifact):
  """(the library opened, the path it was opened in place under or None). glibc's dlopen returns the library already
  loaded under the same path, however the file changed since: after a recompile into the folder of a model still
  loaded, dlopen(path) would run the old build's code (and crash where the new one's arguments are smaller). So it is
  opened through a new hard link beside it (the weights file is found beside the name opened), a name never loaded
  before: glibc then matches an already loaded library only by the file's inode, which is the same file. The link goes
  once opened."""
  path = a.library_path
  if not path.exists():
    raise ArtifactError(f"{a.dir} is not a whole artifact: {path.name} is missing")
  link = path.with_name(f".{path.name}.{os.getpid()}.{next(_link_numbers)}")
  try:
    os.link(path, link)
  except OSError:  # a folder we cannot write to, or a file system without hard links
    return _open_in_place(ffi, path), str(path)
  try:
    with _ffi_lock:
      return ffi.dlopen(str(link)), None
  finally:
    link.unlink(missing_ok=True)


def _open_in_place(ffi: cffi.FFI, path: Path):
  """dlopen(path) itself, refused when an older build of path is still loaded through it (a stale library)."""
  key, inode = str(path), path.stat().st_ino
  with _ffi_lock:
    held = _opened_in_place.get(key)
    if held and held[0] != inode:
      raise ArtifactError(
        f"{path} was rebuilt while {held[1]} model(s) loaded from its older build are still open, and its folder "
        "takes no hard link to load the new one beside them: close() those models first"
      )
    lib = ffi.dlopen(key)
    _opened_in_place[key] = [inode, (held[1] if held else 0) + 1]
  return lib


def _release_in_place(key: str) -> None:
  """A model opened in place (_open_in_place) is closed; the caller holds _ffi_lock."""
  held = _opened_in_place[key]
  held[1] -= 1
  if not held[1]:
    del _opened_in_place[key]


def _writes_in_place(t, o: np.ndarray | None, ins: list) -> bool:
  """Can the C API write output t straight into the caller's out= array o? Not where o is strided, where t is a
  narrow type (the C API writes its codes, decoded after), nor where o shares memory with an input (the C API's
  outputs must not overlap its inputs): those are computed beside and copied in."""
  if o is None or t.narrow or not o.flags.c_contiguous:
    return False
  return not any(np.shares_memory(o, x) for x in ins)


def _empty(t) -> np.ndarray:
  """A new array an output is written into, as the C API writes it (a packed narrow type as its bytes)."""
  return np.empty(t.narrow.nbytes(math.prod(t.shape)) if t.narrow and t.narrow.packed else t.shape, dtype=t.dtype.np)


def _runs(a: Artifact, side: str) -> list[tuple[str, str | None, int, int]]:
  """The Python-level inputs or outputs over the C API's tensors: (name, container kind or None, first, count)."""
  tensors = a.inputs if side == "input" else a.outputs
  runs = sorted((c for c in a.containers if c["side"] == side), key=lambda c: c["start"])
  out, i = [], 0
  for c in runs + [{"name": None, "kind": None, "start": len(tensors), "count": 0}]:
    for j in range(i, c["start"]):
      out.append((tensors[j].name, None, j, 1))
    if c["kind"]:
      out.append((c["name"], c["kind"], c["start"], c["count"]))
    i = max(i, c["start"] + c["count"])
  return out


def _flatten_containers(a: Artifact, args: tuple) -> list:
  """The arguments with each sequence (a list) and optional (an array or None) spread into its C API tensors."""
  runs = _runs(a, "input")
  if len(args) != len(runs):
    raise InputCountError(f"{a.name} takes {len(runs)} inputs ({', '.join(r[0] for r in runs)}), got {len(args)}")
  flat = []
  for (name, kind, _, count), x in zip(runs, args):
    if kind == "sequence":
      if not isinstance(x, (list, tuple)) or len(x) != count:
        got = f"{len(x)} tensors" if isinstance(x, (list, tuple)) else type(x).__name__
        raise InputShapeError(
          f"{a.name} input '{name}': expected a sequence (list) of {count} tensors, got {got}", name, count, got
        )
      flat += list(x)
    elif kind == "optional":
      if (x is None) != (count == 0):
        raise InputShapeError(
          f"{a.name} input '{name}': compiled as an optional that is "
          f"{'empty: pass None' if count == 0 else 'present: pass its tensor'}",
          name,
          "present" if count else "None",
          "None" if x is None else "present",
        )
      flat += [] if x is None else [x]
    else:
      flat.append(x)
  return flat


def _grouped(outs: list, kind: str | None, start: int, count: int):
  if kind == "sequence":
    return outs[start : start + count]
  if kind == "optional":
    return outs[start] if count else None
  return outs[start]


@dataclass(frozen=True)
class TensorInfo:
  """An input or output of a loaded model, as onnxruntime's NodeArg describes one: its name, shape (a list; a
  sequence input's is its element count) and ONNX type ("tensor(float)", "seq(tensor(float))"); dtype is numpy's."""

  name: str
  shape: list
  type: str
  dtype: np.dtype | None


def _infos(a: Artifact, side: str) -> list[TensorInfo]:
  tensors = a.inputs if side == "input" else a.outputs
  infos = []
  for name, kind, start, count in _runs(a, side):
    t = tensors[start] if count else None
    dtype = None if t is None else np.dtype(t.narrow.np if t.narrow else t.dtype.np)
    elem = "?" if dtype is None else f"tensor({_ONNX_TYPE_NAMES.get(dtype.name, dtype.name)})"
    if kind == "sequence":
      infos.append(TensorInfo(name, [count], f"seq({elem})", dtype))
    elif kind == "optional":
      infos.append(TensorInfo(name, list(t.shape) if t else [], f"optional({elem})", dtype))
    else:
      infos.append(TensorInfo(name, list(t.shape), elem, dtype))
  return infos


# numpy's dtype names where ONNX's type strings say otherwise
_ONNX_TYPE_NAMES = {"float32": "float", "float64": "double"}


def load(what, threads: int | None = None) -> LoadedModel:
  """A callable over a compiled artifact: an Artifact, its folder, or its libNAME.so. threads: how many threads its
  kernels run on (default: AOT_NUM_THREADS, else the cores the process may run on; at most those cores: NAME.h). Use
  it as a context manager to close it at the end."""
  if isinstance(what, Artifact):
    return LoadedModel(what, threads)
  path = Path(what)
  if path.is_file() and path.name.startswith("lib") and path.suffix == ".so":
    path = path.parent  # the library's own folder holds its manifest
  return LoadedModel(Artifact(path), threads)
