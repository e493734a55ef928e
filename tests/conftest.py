import functools, os, tempfile
import numpy as np
import pytest
import aot
from aot.models import get

# pytest -n 2 already keeps both cores busy: one kernel thread per worker (tests of threading set their own)
os.environ.setdefault("AOT_NUM_THREADS", "1")

# every test that runs compiled code runs it for each of these targets
TARGETS = ("c", "llvm")

@functools.lru_cache(maxsize=None)
def _compiled(name: str, target: str, out_dir: str):
  return aot.compile_model(f"models:{name}", out_dir=out_dir, target=target)

@pytest.fixture(scope="session")
def compiled_model(tmp_path_factory):
  """compiled_model(name, target="c") -> (artifact, ReferenceModel); each is compiled once per test process."""
  base = tmp_path_factory.mktemp("models")
  return lambda name, target="c": (_compiled(name, target, str(base / f"{name}_{target}")), get(name))

class _Current:
  target = "c"

@pytest.fixture(params=TARGETS)
def each_target(request):
  """pytestmark = pytest.mark.usefixtures("each_target") runs every test of a module once per target (for run())."""
  _Current.target = request.param

def run(fn, *arrays):
  """Compile fn for these example inputs on the current target, load the artifact and run it on the same inputs."""
  arrays = [np.asarray(a) for a in arrays]
  with tempfile.TemporaryDirectory(prefix="aot_test_") as d:
    model = aot.load(aot.compile_model(fn, arrays, out_dir=d, target=_Current.target))
    try: return model(*arrays)
    finally: model.close()
