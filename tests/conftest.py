import functools
import os
import shutil
import subprocess
import tempfile

import numpy as np
import pytest
from onnx import helper as oh

import aot
from aot.models import get

# pytest -n 2 already keeps both cores busy: one kernel thread per worker (tests of threading set their own)
os.environ.setdefault("AOT_NUM_THREADS", "1")
# thread tests ask for more threads than this machine's cores, to test the split: no cap to the cores (NAME.h)
os.environ.setdefault("AOT_OVERSUBSCRIBE", "1")

# every test that runs compiled code runs it for each of these targets
TARGETS = ("c", "llvm")
# the C compilers the c target is tested under (.ci/run installs them): gcc, Debian 12's default clang and clang-19
COMPILERS = ("gcc", "clang-14", "clang-19")


def run_cpp_app(source: str, art_dir, lib: str, tmp_path) -> list[str]:
  """The lines a C++17 program prints, built from source against the artifact in art_dir (its lib, NAME.hpp)."""
  (tmp_path / "app.cpp").write_text(source)
  flags = [f"-I{art_dir}", f"-L{art_dir}", f"-l{lib}", f"-Wl,-rpath,{art_dir}"]
  subprocess.run([need("g++"), "-std=c++17", "app.cpp", *flags, "-o", "appxx"], cwd=tmp_path, check=True)
  return subprocess.run(["./appxx"], cwd=tmp_path, capture_output=True, text=True, check=True).stdout.splitlines()


def need(compiler: str) -> str:
  """The compiler's path; a skip where it is not installed, a failure in CI (.ci/run installs all of them)."""
  if path := shutil.which(compiler):
    return path
  if os.environ.get("CI", "") not in ("", "0", "false"):
    pytest.fail(f"{compiler} is not installed (.ci/run installs it)")
  pytest.skip(f"{compiler} is not installed")


@functools.lru_cache(maxsize=None)
def _compiled(name: str, target: str, out_dir: str):
  return aot.compile_model(f"models:{name}", out_dir=out_dir, target=target)


@pytest.fixture(scope="session")
def compiled_model(tmp_path_factory):
  """compiled_model(name, target="c") -> (artifact, ReferenceModel); each is compiled once per test process."""
  base = tmp_path_factory.mktemp("models")
  return lambda name, target="c": (_compiled(name, target, str(base / f"{name}_{target}")), get(name))


@pytest.fixture
def taps_copy(monkeypatch):
  """Convolutions compiled under this fixture copy their windows out tap by tap (im2col, whole or in panels) whatever
  their output channels: the few-channel ones these tests use read a padded copy in place (columns.padded_copy)."""
  import aot.codegen.lower.columns

  monkeypatch.setattr(aot.codegen.lower.columns, "WINDOW_ROWS", 0)


@pytest.fixture
def split_every_kernel(monkeypatch):
  """Artifacts compiled under this fixture split every kernel with an outer loop across the pool, however little work
  it does (the thresholds in codegen/lower/stage.py are about speed): small, odd shapes then test the split itself."""
  import aot.codegen.lower.stage

  monkeypatch.setattr(aot.codegen.lower.stage, "PARALLEL_MIN_WORK", 0)
  monkeypatch.setattr(aot.codegen.lower.stage, "MODEL_PARALLEL_MIN_WORK", 0)


class _Current:
  target = "c"


@pytest.fixture(params=TARGETS)
def each_target(request):
  """pytestmark = pytest.mark.usefixtures("each_target") runs every test of a module once per target (for run())."""
  _Current.target = request.param


def fresh_like(a: np.ndarray, seed: int) -> np.ndarray:
  """Seeded values of a's shape and dtype, unrelated to a's own."""
  rng = np.random.default_rng(seed)
  if a.dtype == np.bool_:
    return rng.random(a.shape) < 0.5
  if a.dtype.kind in "iu":
    return rng.integers(0, 8, a.shape).astype(a.dtype)
  return rng.standard_normal(a.shape).astype(a.dtype)


def run(fn, *arrays):
  """Compile fn on the current target for fresh arrays of these inputs' shapes and dtypes, load the artifact and run it
  on these inputs: what it returns comes from the inputs it ran on, not from values seen at compile time (a test's
  expectation, computed from these arrays, checks that)."""
  arrays = [np.asarray(a) for a in arrays]
  compile_with = [fresh_like(a, 1000 + i) for i, a in enumerate(arrays)]
  with tempfile.TemporaryDirectory(prefix="aot_test_") as d:
    model = aot.load(aot.compile_model(fn, compile_with, out_dir=d, target=_Current.target))
    try:
      return model(*arrays)
    finally:
      model.close()


def make(nodes, inputs, outputs, inits=()):
  """An ONNX model (opset 18) of the graph's nodes, value infos and initializers, as the tests write them."""
  m = oh.make_model(
    oh.make_graph(nodes, "g", inputs, outputs, initializer=list(inits)), opset_imports=[oh.make_opsetid("", 18)]
  )
  m.ir_version = 9
  return m


def ort_session(model, optimized_path=None):
  """onnxruntime's CPU session of model (a ModelProto) on one thread, the reference the quantized tests compare with;
  its optimized graph written to optimized_path when given (which ops it fused)."""
  import onnxruntime as ort

  opts = ort.SessionOptions()
  opts.intra_op_num_threads = 1
  if optimized_path is not None:
    opts.optimized_model_filepath = str(optimized_path)
  return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def outputs_on_threads(art, feeds: dict, threads=(1, 3)) -> list:
  """The artifact's outputs on feeds for each thread count, loaded and closed for each."""
  outs = []
  for t in threads:
    model = aot.load(art, threads=t)
    try:
      outs.append(model(*feeds.values()))
    finally:
      model.close()
  return outs


def run_without_call(fn, x: np.ndarray, out_dir, target: str, call: str) -> np.ndarray:
  """fn of one array compiled for target and run on x; on the c target its generated C calls `call` (a libm function
  the compiler computes as arithmetic instead) nowhere."""
  art = aot.compile_model(fn, [x], out_dir=out_dir, target=target)
  if target == "c":
    assert f"{call}(" not in (art.dir / "src" / "model.c").read_text()
  loaded = aot.load(art)
  try:
    return loaded(x)
  finally:
    loaded.close()


def run_body(src: str) -> str:
  """The generated run's body in a model.c (its kernel calls): NAME_run is a wrapper taking the instance's lock around
  run_locked (codegen/render/host_cpu.py)."""
  start = src.index("static int run_locked(")
  return src[start : src.index("\n}\n", start)]


def corrupt_weights(art) -> None:
  """Make an artifact wrong the way a damaged file would: the weights linked into its library (found by their bytes,
  src/weights.bin) negated in place."""
  blob = (art.dir / "src" / "weights.bin").read_bytes()
  lib = bytearray(art.library_path.read_bytes())
  at = lib.find(blob)
  assert at >= 0 and lib.find(blob, at + 1) < 0, "the weights are not in the library exactly once"
  n = len(blob) // 4 * 4
  lib[at : at + n] = (-np.frombuffer(blob[:n], np.float32)).tobytes()
  art.library_path.write_bytes(bytes(lib))
