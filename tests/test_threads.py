"""The thread pool: kernels split their outermost loop across threads, and the results are bitwise the same."""

import numpy as np
import pytest
from conftest import TARGETS

import aot
import aot.models


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", ["resnet18", "transformer"])
def test_results_are_bitwise_identical_for_any_thread_count(compiled_model, name, target):
  art, model = compiled_model(name, target)
  x = model.example_inputs(7)
  one = aot.load(art, threads=1)(*x)
  # 8: more threads than this machine's cores, so that threads wake late and others take their slices
  for n in (2, 3, 8):
    many = aot.load(art, threads=n)(*x)
    assert np.array_equal(one.view(np.uint32), many.view(np.uint32)), f"{n} threads differ from 1"
  np.testing.assert_allclose(one, model.reference(*x), rtol=1e-4, atol=1e-4)


def test_thread_count_must_be_positive(compiled_model):
  art, _ = compiled_model("mlp")
  m = aot.load(art)
  with pytest.raises(ValueError, match="at least 1, got 0"):
    m.set_threads(0)
  m.set_threads(2)
  x = aot.models.get("mlp").example_inputs(0)
  np.testing.assert_allclose(m(*x), aot.models.get("mlp").reference(*x), rtol=1e-4, atol=1e-5)
