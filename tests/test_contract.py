"""Contractions on the runtime's microkernel (codegen/contract.py, runtime_c/aot_gemm.c): every operand form (packed
constant, strided view, dense copy), edges that fill no whole tile, batches, swapped operands, epilogues in place and
through a scratch matrix, against numpy in float64. Each artifact runs on inputs other than those it was compiled with,
on 1, 2 and 3 threads, bitwise the same, compiled to split every kernel across the pool (split_every_kernel in
conftest.py): odd extents, so a split that lost its remainder rows would show."""
import numpy as np
import pytest
import aot
from aot.frontends.tensor import Tensor
from conftest import TARGETS, fresh_like

rng = np.random.default_rng(0)
f32 = lambda *shape: rng.standard_normal(shape, dtype=np.float32)

def compiled(fn, xs, tmp_path, target, **kw):
  """(outputs, the inputs they were computed from, the number of microkernel calls in the artifact's model.c, its
  kernel count). Compiled with xs, run on fresh inputs of their shapes on 1, 2 and 3 threads (bitwise equal)."""
  art = aot.compile_model(fn, xs, out_dir=tmp_path / target, target=target, **kw)
  fresh = [fresh_like(x, 100 + i) for i, x in enumerate(xs)]
  outs = []
  for threads in (1, 2, 3):
    model = aot.load(art, threads=threads)
    try: outs.append(model(*fresh))
    finally: model.close()
  for n, out in zip((2, 3), outs[1:]):
    np.testing.assert_array_equal(out, outs[0], err_msg=f"{n} threads differ from 1")
  return outs[0], fresh, (art.dir / "src" / "model.c").read_text().count("aot_gemm g ="), art.num_kernels

def conv_ref(x, w, stride=1, padding=0):
  x, w = x.astype(np.float64), w.astype(np.float64)
  x = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
  win = np.lib.stride_tricks.sliding_window_view(x, w.shape[2:], axis=(2, 3))[:, :, ::stride, ::stride]
  return np.einsum("nchwij,ocij->nohw", win, w)

def close(out, ref):
  np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())

W_CONST, W1, W2 = f32(100, 77), f32(96, 64, 3, 3), f32(96, 32, 1, 1)
CASES = {
  # name: (program, inputs, numpy reference, microkernel calls)
  "runtime operands, odd sizes": (lambda a, b: a @ b, [f32(37, 71), f32(71, 45)],
                                  lambda a, b: a.astype(np.float64) @ b, 1),
  "constant B packed ahead": (lambda a: (a @ Tensor(W_CONST)).relu(), [f32(33, 100)],
                              lambda a: np.maximum(a.astype(np.float64) @ W_CONST, 0), 1),
  "constant transposed (linear)": (lambda a: a.linear(Tensor(W_CONST.T.copy())), [f32(21, 100)],
                                   lambda a: a.astype(np.float64) @ W_CONST, 1),
  "runtime B read across its lanes (dense copy)": (lambda a, b: a @ b.transpose(-2, -1), [f32(40, 64), f32(50, 64)],
                                                   lambda a, b: a.astype(np.float64) @ b.T, 1),
  "batched, odd M, N, K": (lambda a, b: a @ b, [f32(3, 21, 63), f32(3, 63, 41)],
                           lambda a, b: a.astype(np.float64) @ b, 1),
  "conv 3x3 padded (im2col), bias and relu in place": (
    lambda x: x.conv2d(Tensor(W1), Tensor(np.arange(96, dtype=np.float32)), padding=1).relu(), [f32(2, 64, 13, 11)],
    lambda x: np.maximum(conv_ref(x, W1, padding=1) + np.arange(96).reshape(1, -1, 1, 1), 0), 1),
  "conv 1x1 stride 2": (lambda x: x.conv2d(Tensor(W2), stride=2), [f32(1, 32, 15, 15)], lambda x: conv_ref(x, W2, 2), 1),
  "conv then global average pool (result through scratch)": (
    lambda x: x.conv2d(Tensor(W1), padding=1).relu().mean((2, 3)), [f32(1, 64, 9, 9)],
    lambda x: np.maximum(conv_ref(x, W1, padding=1), 0).mean((2, 3)), 1),
  "two contractions in one kernel (a block's residual conv)": (
    lambda x, y: (x.conv2d(Tensor(W1), padding=1) + y.conv2d(Tensor(W2))).relu(), [f32(1, 64, 10, 10), f32(1, 32, 10, 10)],
    lambda x, y: np.maximum(conv_ref(x, W1, padding=1) + conv_ref(y, W2), 0), 2),
}

@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_contraction_matches_numpy(case, target, tmp_path, split_every_kernel):
  fn, xs, ref, calls = CASES[case]
  out, fresh, gemms, kernels = compiled(fn, xs, tmp_path, target)
  close(out, ref(*fresh))
  assert gemms == calls, f"{gemms} microkernel calls, expected {calls}"

_X7 = f32(1, 128, 7, 7)

@pytest.mark.parametrize("target", TARGETS)
def test_small_images_swap_operands(target, tmp_path, split_every_kernel):
  # 7x7 = 49 positions fill two 32-lane tiles to 77%; 128 channels fill them whole, and K = 1152 pays for the swap
  w = f32(128, 128, 3, 3)
  out, (x,), gemms, kernels = compiled(lambda x: x.conv2d(Tensor(w), padding=1).relu(), [_X7], tmp_path, target)
  close(out, np.maximum(conv_ref(x, w, padding=1), 0))
  # swapped: the weights are B (32-lane tiles of output channels), so C is a scratch matrix and not the output
  model_c = (tmp_path / target / "src" / "model.c").read_text()
  assert gemms == 1 and kernels == 1 and "49, 128, 1152, 8, 32" in model_c

@pytest.mark.parametrize("target", TARGETS)
def test_avx2_tiles(target, tmp_path, split_every_kernel):
  # a CPU without 16-float vectors gets the 6x16 microkernel; it runs here too (AVX-512 machines run AVX2 code)
  fn, xs, ref, calls = CASES["conv 3x3 padded (im2col), bias and relu in place"]
  out, fresh, gemms, _ = compiled(fn, xs, tmp_path, target, cpu="x86-64-v3")
  close(out, ref(*fresh))
  assert "6, 16" in (tmp_path / target / "src" / "model.c").read_text()

def test_bare_product_runs_no_epilogue(tmp_path):
  # the microkernel writes a bare matmul's result in place: reading it back and storing it again would be a wasted pass
  a, b = f32(64, 96), f32(96, 80)
  def run_body(fn, d):
    art = aot.compile_model(fn, [a], out_dir=tmp_path / d, target="c", name="m")
    src = (art.dir / "src" / "model.c").read_text()
    return art, src[src.index("API int m_run"):src.index("API int m_set_threads")]
  art, body = run_body(lambda p: p @ Tensor(b), "bare")
  assert "m_f0(" not in body and "aot_gemm_run" in body
  fresh = fresh_like(a, 1)
  close(aot.load(art)(fresh), fresh.astype(np.float64) @ b)
  art, body = run_body(lambda p: (p @ Tensor(b)).relu(), "relu")
  assert "m_f0(" in body
  close(aot.load(art)(fresh), np.maximum(fresh.astype(np.float64) @ b, 0))
