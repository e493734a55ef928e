"""A stride-1 convolution's window read in place from padded copies of its input (codegen/lower/columns.py
padded_copy, runtime_c/aot_gemm.c window_rows): each task copies its panel of output rows' input rows, padded, and the
microkernel reads the taps there, its columns in the copy's rows (Wp wide), each tile stored where the output has it.
Against numpy in float64 over geometries whose tiles cross the copy's rows and end past it (widths 20 to 57; 3x3, 5x5
and 9x9 windows; even, odd, one-sided and no padding; one input plane; rows that fill no whole tile), a 2x2 pool after
the convolution (its rows split in two), the epilogue's steps in the tile (bias, ReLU) and after the store (a
residual), on 1, 2 and 3 threads bitwise, split into every task there is; built by each C compiler; on the 6x16 tile
(no AVX-512); and the shapes where the copy does not pay keeping the taps' copy."""

import numpy as np
import pytest
from conftest import COMPILERS, TARGETS, outputs_on_threads
from test_contract import close, compiled
from test_conv_taps import reference

import aot
from aot.frontends.tensor import Tensor

rng = np.random.default_rng(7)
f32 = lambda *shape: rng.standard_normal(shape, dtype=np.float32)


def conv_ref(x, w, pads):
  """float64 convolution at stride 1, pads ((top, bottom), (left, right))."""
  return reference(x, w, (1, 1), pads, (1, 1))


def run(fn, xs, tmp_path, target="c"):
  """(the outputs on fresh inputs, those inputs, model.c): test_contract's compiled, on 1, 2 and 3 threads bitwise."""
  out, fresh, _, _ = compiled(fn, xs, tmp_path, target)
  return out, fresh, (tmp_path / target / "src" / "model.c").read_text()


GEOMETRIES = [
  # (input planes, output channels, height, width, window, pads ((top, bottom), (left, right)))
  (16, 32, 20, 23, 3, ((1, 1), (1, 1))),
  (8, 20, 13, 57, 3, ((1, 1), (1, 1))),
  (12, 64, 11, 28, 3, ((1, 1), (1, 1))),
  (1, 16, 30, 40, 9, ((4, 4), (0, 0))),
  (5, 24, 19, 33, 5, ((2, 2), (2, 2))),
  (8, 32, 17, 26, 3, ((0, 2), (2, 0))),
]


@pytest.mark.usefixtures("split_every_kernel")
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=lambda g: "x".join(map(str, g[:5])))
def test_window_read_from_a_padded_copy(geometry, target, tmp_path):
  cin, cout, h, w, k, pads = geometry
  x, wt, bias = f32(1, cin, h, w), f32(cout, cin, k, k), f32(cout)
  fn = lambda x: x.conv2d(Tensor(wt), Tensor(bias), padding=[p for pair in zip(*pads) for p in pair]).relu()
  out, (x,), src = run(fn, [x], tmp_path, target)
  assert ".koff = k_" in src
  close(out, np.maximum(conv_ref(x, wt, pads) + bias[:, None, None], 0))


@pytest.mark.usefixtures("split_every_kernel")
@pytest.mark.parametrize("target", TARGETS)
def test_window_under_a_pool_and_a_residual(target, tmp_path):
  # a 2x2 max pool after the convolution splits its rows and columns in two each (MNIST's 5x5 convs), which still step
  # as one; a residual is read by column, so the steps run after the tiles are stored
  x, r, w1, w2 = f32(1, 8, 26, 40), f32(1, 24, 13, 20), f32(24, 8, 3, 3), f32(24, 24, 3, 3)
  fn = lambda x, r: (x.conv2d(Tensor(w1), padding=1).max_pool2d(2).conv2d(Tensor(w2), padding=1) + r).relu()
  out, (x, r), src = run(fn, [x, r], tmp_path, target)
  assert src.count(".koff = k_") == 2
  pooled = conv_ref(x, w1, ((1, 1), (1, 1))).reshape(1, 24, 13, 2, 20, 2).max(axis=(3, 5))
  close(out, np.maximum(conv_ref(pooled, w2, ((1, 1), (1, 1))) + r, 0))


def test_window_on_the_6x16_tile(tmp_path):
  # a CPU without AVX-512 runs 6x16 tiles (gemm_tile): the window's variant of that microkernel
  x, wt = f32(1, 8, 20, 41), f32(20, 8, 3, 3)
  art = aot.compile_model(lambda x: x.conv2d(Tensor(wt), padding=1).relu(), [x], out_dir=tmp_path, cpu="x86-64-v3")
  src = (art.dir / "src" / "model.c").read_text()
  assert ".koff = k_" in src and "aot_gemm g = {1, 20, 860, 72, 6, 16," in src
  outs = outputs_on_threads(art, {"x": x}, (1, 2))
  np.testing.assert_array_equal(outs[1], outs[0])
  close(outs[0], np.maximum(conv_ref(x, wt, ((1, 1), (1, 1))), 0))


@pytest.mark.parametrize("cc", COMPILERS)
def test_window_built_by_each_compiler(cc, tmp_path, monkeypatch):
  monkeypatch.setenv("CC", cc)
  x, wt = f32(1, 16, 21, 40), f32(24, 16, 3, 3)
  out, (x,), src = run(lambda x: x.conv2d(Tensor(wt), padding=1), [x], tmp_path)
  assert ".koff = k_" in src
  close(out, conv_ref(x, wt, ((1, 1), (1, 1))))


@pytest.mark.parametrize(
  "cin, cout, size, k",
  [(64, 128, 28, 3), (32, 64, 10, 3), (1, 32, 28, 5)],
  ids=["128-rows-over-576", "8-wide-rows", "k-of-25"],
)
def test_where_the_padded_copy_does_not_pay_the_taps_are_copied(cin, cout, size, k, tmp_path):
  # 128 output channels share the taps' copy (im2col) over a K of 576; over 8-wide rows every tile crosses a row;
  # a K of 25 copies little: there the padded copy's extra columns and stores cost more (columns.WINDOW_*)
  x, wt = f32(1, cin, size, size), f32(cout, cin, k, k)
  out, (x,), src = run(lambda x: x.conv2d(Tensor(wt)), [x], tmp_path)
  assert "aot_gemm g" in src and ".koff" not in src
  close(out, conv_ref(x, wt, ((0, 0), (0, 0))))
