import functools
import pytest
import aot
from aot.models import get

@functools.lru_cache(maxsize=None)
def _compiled(name: str, out_dir: str):
  return aot.compile_model(f"models:{name}", out_dir=out_dir)

@pytest.fixture(scope="session")
def compiled_model(tmp_path_factory):
  """compiled_model(name) -> (artifact, ReferenceModel); each model is compiled once per test process."""
  base = tmp_path_factory.mktemp("models")
  return lambda name: (_compiled(name, str(base / name)), get(name))
