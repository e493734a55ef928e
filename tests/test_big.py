"""Big weights: external ONNX data is streamed into the artifact's weights file (the compiler's memory stays far below
the weights), and NAME_create maps that file, checking its size and checksum."""

import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto
from onnx import helper as oh

import aot
from aot.artifact import WEIGHTS_INLINE_MAX, Artifact
from aot.tools.scale_bench import compile_in_subprocess, create_seconds, write_external_mlp

# 20 layers of 1024x1024: 80 MB, past WEIGHTS_INLINE_MAX, so the weights are the mapped NAME.weights file
WIDTH, WEIGHT_BYTES = 1024, 80 << 20
# the compiler's resident memory above its start (imported, llvmlite loaded), per byte of the model's weights: streamed,
# it is about one layer's packing (0.47 measured alone, up to 1.07 seen when the suite runs on 2 workers: not yet
# understood); holding the weights in the heap and then the blob was 5.4. Issue 15's bar: weights + 50%
COMPILE_RSS_OVER_WEIGHTS = 1.5
# NAME_create maps the file and reads 64 blocks of it: 0.1 ms measured; a copy of 80 MB would take tens of ms
CREATE_MAX_S = 0.01


@pytest.fixture(scope="module")
def big(tmp_path_factory):
  """(model path, artifact, the compile subprocess's numbers): compiled once for the module."""
  d = tmp_path_factory.mktemp("big")
  model = write_external_mlp(d / "mlp.onnx", WEIGHT_BYTES, width=WIDTH)
  numbers = compile_in_subprocess(model, d / "art")
  return model, Artifact(d / "art"), numbers


def ort_run(model: Path, x: np.ndarray) -> np.ndarray:
  return ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_big_mlp_compiles_within_memory_bound_and_matches_onnxruntime(big):
  model, art, numbers = big
  weights = (model.parent / "mlp.data").stat().st_size
  assert weights > WEIGHTS_INLINE_MAX
  assert numbers["peak_rss"] - numbers["start_rss"] <= COMPILE_RSS_OVER_WEIGHTS * weights, numbers
  assert art.manifest["weights_file"] == "mlp.weights"
  assert (art.dir / "mlp.weights").stat().st_size == art.weights_bytes
  assert not (art.dir / "src" / "weights.bin").exists()
  x = np.random.default_rng(1).standard_normal((4, WIDTH)).astype(np.float32)
  with_model = aot.load(art)
  np.testing.assert_allclose(with_model(x), ort_run(model, x), rtol=1e-4, atol=1e-4)
  with_model.close()


def _maps_of(path: Path) -> list[str]:
  return [line for line in Path("/proc/self/maps").read_text().splitlines() if line.endswith(str(path))]


def test_create_maps_the_weights_file_and_instances_share_it(big):
  model, art, _ = big
  assert create_seconds(art) <= CREATE_MAX_S
  weights = (art.dir / "mlp.weights").resolve()
  before = len(_maps_of(weights))
  a, b = aot.load(art), aot.load(art)
  maps = _maps_of(weights)
  # each instance is a read-only map of the file (pages of the page cache, shared), not a copy on the heap
  assert len(maps) == before + 2 and all(line.split()[1] == "r--p" for line in maps)
  x = np.random.default_rng(2).standard_normal((4, WIDTH)).astype(np.float32)
  np.testing.assert_array_equal(a(x), b(x))
  np.testing.assert_allclose(a(x), ort_run(model, x), rtol=1e-4, atol=1e-4)
  a.close()
  b.close()
  assert len(_maps_of(weights)) == before


@pytest.fixture
def copy_of(big, tmp_path):
  """A copy of the artifact, to damage."""
  shutil.copytree(big[1].dir, tmp_path / "art")
  return Artifact(tmp_path / "art")


# loads the artifact in argv[1]; a failed create is its message on stderr and exit 3
LOAD = """
import sys, aot
try:
  aot.load(sys.argv[1]).close()
except RuntimeError as e:
  sys.exit(f"create failed: {e}")
"""


def test_truncated_weights_file_is_an_error_at_create(copy_of):
  # in a process of its own: a create that maps the short file without checking its size dies of SIGBUS when it reads
  # past the end, which would end this test run rather than fail this test
  path = copy_of.dir / "mlp.weights"
  size = path.stat().st_size
  with open(path, "r+b") as f:
    f.truncate(size - 4096)
  p = subprocess.run([sys.executable, "-c", LOAD, str(copy_of.dir)], capture_output=True, text=True, timeout=300)
  assert p.returncode >= 0, f"create crashed ({signal.Signals(-p.returncode).name}) on a truncated weights file"
  assert p.returncode != 0, "create did not fail on a truncated weights file"
  assert re.search(
    rf"mlp_create failed .*{re.escape(str(path))} is {size - 4096} bytes, libmlp.so expects {size}: truncated", p.stderr
  ), p.stderr


def test_rewritten_weights_file_is_a_checksum_error_at_create(copy_of):
  path = copy_of.dir / "mlp.weights"
  # the same size, other weights: a file from another build of the model
  other = np.random.default_rng(3).standard_normal(path.stat().st_size // 4).astype(np.float32)
  path.write_bytes(other.tobytes())
  with pytest.raises(
    RuntimeError,
    match=rf"{re.escape(str(path))}: checksum [0-9a-f]{{16}}, libmlp.so expects "
    rf"{copy_of.manifest['weights_checksum']}: the file is damaged",
  ):
    aot.load(copy_of)


def test_missing_weights_file_is_an_error_at_create(copy_of):
  (copy_of.dir / "mlp.weights").unlink()
  with pytest.raises(RuntimeError, match=r"cannot open .*mlp\.weights, the weights of libmlp\.so"):
    aot.load(copy_of)


def test_external_data_in_a_subfolder_compiled_from_elsewhere(tmp_path, monkeypatch):
  model = write_external_mlp(tmp_path / "model" / "small.onnx", 1 << 20, width=256, data_dir=tmp_path / "model" / "w")
  loc = onnx.load(str(model), load_external_data=False).graph.initializer[0].external_data[0].value
  assert loc == "w/small.data"
  elsewhere = tmp_path / "cwd"
  elsewhere.mkdir()
  monkeypatch.chdir(elsewhere)
  art = aot.compile_model(model, out_dir=tmp_path / "out")
  x = np.random.default_rng(4).standard_normal((4, 256)).astype(np.float32)
  np.testing.assert_allclose(aot.load(art)(x), ort_run(model, x), rtol=1e-4, atol=1e-4)


def test_missing_or_short_external_data_is_a_compile_error(tmp_path):
  model = write_external_mlp(tmp_path / "m.onnx", 1 << 20, width=256)
  data = tmp_path / "m.data"
  size = data.stat().st_size
  with open(data, "r+b") as f:
    f.truncate(size - 100)
  with pytest.raises(
    aot.CompileError,
    match=rf"initializer 'b3': needs bytes \d+\.\.{size} of .*m\.data, which holds "
    rf"{size - 100} \(truncated\?\)",
  ):
    aot.compile_model(model, out_dir=tmp_path / "out")
  data.unlink()
  with pytest.raises(aot.CompileError, match=r"initializer 'w0': its external data .*m\.data does not exist"):
    aot.compile_model(model, out_dir=tmp_path / "out")


def _external_model(folder: Path, locations: dict, dtype=TensorProto.FLOAT) -> Path:
  """A model at folder/m.onnx computing y = x + w0 + w1 (3x4), each w an initializer of the given type stored
  externally under the given key/value pairs, cast to float."""
  inits, nodes, last = [], [], "x"
  for i, keys in enumerate(locations):
    t = TensorProto(name=f"w{i}", data_type=dtype, dims=[3, 4], data_location=TensorProto.EXTERNAL)
    for k, v in keys.items():
      t.external_data.add(key=k, value=v)
    inits.append(t)
    nodes += [oh.make_node("Cast", [f"w{i}"], [f"c{i}"], to=TensorProto.FLOAT)]
    nodes += [oh.make_node("Add", [last, f"c{i}"], [f"s{i}"])]
    last = f"s{i}"
  nodes.append(oh.make_node("Identity", [last], ["y"]))
  g = oh.make_graph(
    nodes,
    "g",
    [oh.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
    [oh.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])],
    inits,
  )
  folder.mkdir(parents=True, exist_ok=True)
  onnx.save(oh.make_model(g, opset_imports=[oh.make_opsetid("", 18)]), folder / "m.onnx")
  return folder / "m.onnx"


@pytest.mark.parametrize(
  "dtype", [TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16], ids=["float", "float16", "bfloat16"]
)
def test_external_data_with_only_a_location_is_read_as_onnxruntime_reads_it(tmp_path, dtype):
  # no offset: the file's start; no length: the tensor's own size, as onnxruntime reads it (w1's file has bytes after
  # it, which onnxruntime ignores); float and float16 are memory-mapped, bfloat16 is read and converted by onnx
  import ml_dtypes

  np_type = {TensorProto.FLOAT: np.float32, TensorProto.FLOAT16: np.float16, TensorProto.BFLOAT16: ml_dtypes.bfloat16}
  w = [np.linspace(-2, 2, 12).astype(np_type[dtype]), np.arange(12).astype(np_type[dtype])]
  (tmp_path / "w0.bin").write_bytes(w[0].tobytes())
  (tmp_path / "w1.bin").write_bytes(w[1].tobytes() + b"\x7f" * 10)
  model = _external_model(tmp_path, [{"location": "w0.bin"}, {"location": "w1.bin"}], dtype)
  x = np.random.default_rng(9).standard_normal((3, 4)).astype(np.float32)
  got = aot.load(aot.compile_model(model, out_dir=tmp_path / "out"))(x)
  np.testing.assert_array_equal(got, ort_run(model, x))


def _refuse_touching(monkeypatch, outside: Path) -> list:
  """Record every stat, open or map of `outside` (the file a model must not make us read), making it fail."""
  import builtins
  import os

  touched = []
  for mod, name in [(os, "stat"), (os, "open"), (builtins, "open"), (np, "memmap")]:
    real = getattr(mod, name)

    def spy(path, *a, _real=real, **k):
      if isinstance(path, (str, Path)) and Path(path).name == outside.name:
        touched.append(str(path))
        raise PermissionError(f"test: {path} must not be touched")
      return _real(path, *a, **k)

    monkeypatch.setattr(mod, name, spy)
  return touched


@pytest.mark.parametrize("how", ["dotdot", "absolute", "link", "link_in_a_subfolder"])
def test_external_data_outside_the_model_folder_is_refused_before_it_is_touched(tmp_path, monkeypatch, how):
  # onnx.load and onnxruntime refuse such a location too; the message must not say the file's size, nor may the
  # compiler stat or read the file first
  outside = tmp_path / "secret.bin"
  outside.write_bytes(b"\0" * 4812)
  folder = tmp_path / "model"
  (folder / "sub").mkdir(parents=True)
  location = {"dotdot": "sub/../../secret.bin", "absolute": str(outside), "link": "link.bin"}.get(
    how, "sub/up/secret.bin"
  )
  if how == "link":
    (folder / "link.bin").symlink_to(outside)
  if how == "link_in_a_subfolder":
    (folder / "sub" / "up").symlink_to("../..")
  model = _external_model(folder, [{"location": location, "offset": "0", "length": "4800"}])
  touched = _refuse_touching(monkeypatch, outside)
  with pytest.raises(aot.CompileError, match=r"initializer 'w0': external data location .* is refused") as e:
    aot.compile_model(model, out_dir=tmp_path / "out")
  assert "outside the model's folder" in str(e.value) and "4812" not in str(e.value)
  assert touched == []
