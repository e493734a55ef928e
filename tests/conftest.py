import functools, os
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
