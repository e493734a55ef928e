"""The c target built by gcc, the compiler it falls back to where clang is not installed (build.cc). gcc 12's loop
vectoriser miscompiles a reduction over reversed reads, so build.py keeps it off wherever a kernel reduces: these
tests keep that path checked while the rest of the suite builds with clang where it is there."""

import numpy as np
import pytest

import aot
from aot.frontends.tensor import Tensor
from aot.models import get


@pytest.fixture(autouse=True)
def gcc(monkeypatch):
  monkeypatch.setenv("CC", "gcc")


@pytest.mark.parametrize("name", ["mnist", "transformer"])
def test_reference_model_built_by_gcc(name, tmp_path):
  art = aot.compile_model(f"models:{name}", out_dir=tmp_path, target="c")
  ref = get(name)
  x = ref.example_inputs(3)
  np.testing.assert_allclose(aot.load(art)(*x), ref.reference(*x), rtol=1e-4, atol=1e-4)


def test_reversed_reduction_built_by_gcc(tmp_path):
  # the reduction gcc 12's loop vectoriser got wrong (a flip summed): right with it off
  a = np.random.default_rng(0).standard_normal((37, 29), dtype=np.float32)
  art = aot.compile_model(lambda x: x.flip(0).sum(0), [a], out_dir=tmp_path, target="c")
  np.testing.assert_allclose(aot.load(art)(a), np.flip(a, 0).astype(np.float64).sum(0), rtol=1e-5, atol=1e-5)


def test_convolution_built_by_gcc(tmp_path):
  rng = np.random.default_rng(1)
  x, w = rng.standard_normal((1, 16, 12, 12), dtype=np.float32), rng.standard_normal((24, 16, 3, 3), dtype=np.float32)
  art = aot.compile_model(
    lambda t: t.conv2d(Tensor(w), padding=1).relu().max_pool2d(2), [x], out_dir=tmp_path, target="c"
  )
  xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
  conv = np.einsum("nchwij,ocij->nohw", np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3)), w)
  ref = np.maximum(conv, 0).reshape(1, 24, 6, 2, 6, 2).max((3, 5))
  np.testing.assert_allclose(aot.load(art)(x), ref, rtol=1e-4, atol=1e-4)
