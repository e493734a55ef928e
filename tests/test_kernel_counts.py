"""Kernel counts of small graphs whose right count is known, and the exception that reports a changed count."""

import numpy as np
import pytest

import aot
from aot import Tensor
from aot.testing import KernelCountException, assert_kernel_count

rng = np.random.default_rng(0)
X = rng.standard_normal((8, 32)).astype(np.float32)
W = rng.standard_normal((32, 16)).astype(np.float32)
B = rng.standard_normal((16,)).astype(np.float32)


def test_linear_relu_is_one_kernel():
  # the matmul's reduce, the bias add and the relu all happen per output element: one loop nest
  assert_kernel_count(lambda x: (x @ Tensor(W) + Tensor(B)).relu(), 1, [X])


def test_elementwise_chain_is_one_kernel():
  assert_kernel_count(lambda x: ((x * 2 + 1).exp().sqrt() - x).abs(), 1, [X])


def test_reduce_with_elementwise_around_it_is_one_kernel():
  # exp before the sum and the scaling after it fuse into the reduction's kernel
  assert_kernel_count(lambda x: (x.exp().sum(1) * 0.5 + 1).sqrt(), 1, [X])


def test_softmax_is_two_kernels():
  # max and sum are each computed once per row, outside the loop over the row: exp(x - max) is stored because both
  # the sum and the division read it (at different indices), and the division kernel computes the sum first
  assert_kernel_count(lambda x: x.softmax(-1), 2, [X])


def test_softmax_over_first_axis_stores_the_reductions():
  # reducing over the outer axis would put the max inside the inner loop it does not vary in: it is stored instead
  assert_kernel_count(lambda x: x.softmax(0), 4, [X])


def test_layernorm_is_two_kernels():
  # x - mean is read by the variance and by the output at different indices: stored once, then one output kernel
  assert_kernel_count(lambda x: x.layernorm(), 2, [X])


def test_two_matmuls_are_two_kernels():
  # the hidden activation would be recomputed for every output column if fused, so it is stored
  W2 = rng.standard_normal((16, 4)).astype(np.float32)
  assert_kernel_count(lambda x: (x @ Tensor(W)).relu() @ Tensor(W2), 2, [X])


def test_value_read_twice_at_the_same_index_is_not_stored():
  # gelu reads its input several times, always at the same element: fused with the matmul
  assert_kernel_count(lambda x: (x @ Tensor(W) + Tensor(B)).gelu(), 1, [X])


def test_constant_subgraphs_fold():
  # batchnorm's scale and shift depend only on constants: they are computed at compile time
  c = 16
  mean, var = Tensor(rng.standard_normal(c).astype(np.float32)), Tensor(rng.uniform(0.5, 1, c).astype(np.float32))
  fn = lambda x: (
    (x @ Tensor(W))
    .reshape(8, 16, 1, 1)
    .batchnorm(mean, var, Tensor(np.ones(c, np.float32)), Tensor(np.zeros(c, np.float32)))
  )
  assert_kernel_count(fn, 1, [X])
  # a program of constants only is one copy of the folded result
  folded = lambda x: x * 0 + (Tensor(W) * 2 + 1).sum(0)
  assert_kernel_count(folded, 1, [np.zeros(16, np.float32)])


def test_wrong_expectation_raises_with_both_numbers():
  with pytest.raises(KernelCountException, match="7") as e:
    assert_kernel_count(lambda x: x.softmax(-1), 7, [X])
  assert e.value.expected == 7 and e.value.got == 2
  assert "7" in str(e.value) and "2" in str(e.value)


def test_assert_kernel_count_accepts_artifacts_folders_and_model_names(tmp_path):
  art = aot.compile_model(lambda x: x.softmax(-1), [X], out_dir=tmp_path / "sm")
  assert_kernel_count(art, 2)
  assert_kernel_count(tmp_path / "sm", 2)
  assert_kernel_count(str(tmp_path / "sm"), 2)
  assert_kernel_count("models:mlp", aot.models.get("mlp").expected_kernels)


def test_function_is_traced_once_and_checks_its_arguments():
  traces = []

  @aot.function
  def block(x, w):
    traces.append(1)
    return (x @ w).relu()

  w1, w2 = (
    Tensor(rng.standard_normal((32, 32)).astype(np.float32)),
    Tensor(rng.standard_normal((32, 32)).astype(np.float32)),
  )
  fn = lambda x: block(block(x, w1), w2)
  art = aot.compile_model(fn, [X])
  assert len(traces) == 1 and art.num_kernels == 2
  got = aot.load(art)(X)
  np.testing.assert_allclose(
    got, np.maximum(np.maximum(X @ w1.uop.arg.data.array, 0) @ w2.uop.arg.data.array, 0), rtol=1e-4, atol=1e-4
  )
  with pytest.raises(TypeError, match=r"argument 'x'.*\(8, 32\).*\(4, 32\)"):
    block(Tensor(X[:4]), w1)
  with pytest.raises(TypeError, match=r"argument 'w'.*float32.*int32"):
    block(Tensor(X), Tensor(np.zeros((32, 32), np.int32)))


def test_skip_layer_norm_recurrence_is_one_kernel_per_128_steps():
  # onnxruntime's Welford recurrence (frontends/onnx_ops_contrib.py) over rows of 256: two kernels of 128 steps
  # (their state and the row's mean and std each packed in a uint64), then the output. A bitcast reader made its
  # value a stage of its own, and each stage then read the chain's steps: 514
  from aot.frontends.onnx_ops_contrib import _welford_layer_norm

  x = rng.standard_normal((32, 256)).astype(np.float32)
  gamma = Tensor(rng.standard_normal(256).astype(np.float32))
  assert_kernel_count(lambda t: _welford_layer_norm(t, gamma, None, 1e-5)[0], 3, [x])
