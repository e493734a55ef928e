"""The int8 microkernel (runtime_c/aot_qgemm.c) on the awkward shapes quantized CNNs have (few rows: a 7x7 layer's 49;
short K: a stem's 147; K and N off the packing's multiples), in both of its A layouts and both C layouts, built by
each compiler a user may have, against an independent numpy computation, and the same bytes on any thread count."""

import ctypes
import shutil

import numpy as np
import pytest
from test_int8 import QGemm, build_qgemm

from aot.build import cc
from aot.codegen.lower.quant import pack_weights, requantize

BUILDS = [(cc(), "native"), (cc(), "x86-64-v3"), (cc(), "x86-64")] + (
  [("gcc", "native")] if shutil.which("gcc") else []
)


@pytest.fixture(scope="module", params=BUILDS, ids=lambda b: f"{b[0]}-{b[1]}")
def lib(request, tmp_path_factory):
  """Built for this CPU (AVX-512 VNNI where it has it), for AVX2 (the portable micro) and for SSE2 alone (the scalar
  requantization), by the default compiler, and by gcc, whose flags differ (build.cflags: its loop vectoriser off)."""
  compiler, cpu = request.param
  return build_qgemm(tmp_path_factory.mktemp(f"qgemm_{compiler}_{cpu}"), cpu, compiler)


def run(lib, a, w, a_zero, bias, scale, out_zero, out_dtype, threads, conv_layout):
  """C = (a - a_zero) @ w + bias (requantized when scale is given). conv_layout: A handed over k-major ([K][M], an
  im2col) and C written m-contiguous ([N][M], a convolution's NCHW output), else both row-major."""
  M, K = a.shape
  N = w.shape[1]
  packed, col_sum = pack_weights(w)
  a_mem = np.ascontiguousarray(a.T if conv_layout else a)
  out = np.zeros((N, M) if conv_layout else (M, N), out_dtype)
  scale = None if scale is None else np.ascontiguousarray(np.atleast_1d(scale), np.float32)
  ptr = lambda x: None if x is None else x.ctypes.data
  out_type = {np.int32: 0, np.uint8: 1, np.int8: 2}[out_dtype]
  ldc = (1, M) if conv_layout else (N, 1)
  g = QGemm(M, N, K, ptr(a_mem), M if conv_layout else K, int(a.dtype == np.int8), a_zero, ptr(packed), ptr(col_sum))
  g.bias, g.scale, g.out_type, g.out_zero, g.c = ptr(bias), ptr(scale), out_type, out_zero, ptr(out)
  g.scale_step = 0 if scale is None or scale.size == 1 else 1
  g.ldc_m, g.ldc_n, g.a_kmajor = *ldc, int(conv_layout)
  lib.qgemm(ctypes.byref(g), threads)
  return out.T if conv_layout else out


def reference(a, w, a_zero, bias):
  # float64 products and sums of integers below 2^53 are exact: BLAS speed for the big K
  acc = (a.astype(np.float64) - a_zero) @ w.astype(np.float64) + bias
  return acc.astype(np.int64).astype(np.int32)


SHAPES = [
  # (M, N, K): a vector; a 7x7 layer's 49 rows (7 of an 8-row tile idle) over K = 4608 and over a K past it; one row
  # more than 49; a 14x14 layer's 196; a stem's K = 147 over several 64-row blocks; K below one group of 4
  (1, 45, 4611),
  (7, 33, 147),
  (49, 520, 4608),
  (49, 100, 4614),
  (50, 200, 1030),
  (196, 269, 2306),
  (700, 64, 147),
  (196, 70, 3),
]


@pytest.mark.parametrize("M,N,K", SHAPES)
@pytest.mark.parametrize("conv_layout", [False, True])
def test_int32_sums(lib, M, N, K, conv_layout):
  rng = np.random.default_rng(M + 7 * N + 13 * K)
  a = rng.integers(0, 256, (M, K)).astype(np.uint8)
  # the extremes: 255 * -128 summed over the whole K
  a[0] = 255
  w = rng.integers(-128, 128, (K, N)).astype(np.int8)
  w[:, -1] = -128
  bias = rng.integers(-5000, 5000, N).astype(np.int32)
  want = reference(a, w, 3, bias)
  got = [run(lib, a, w, 3, bias, None, 0, np.int32, t, conv_layout) for t in (1, 2, 3)]
  np.testing.assert_array_equal(got[0], want)
  assert all(g.tobytes() == got[0].tobytes() for g in got[1:])


@pytest.mark.parametrize("M,N,K", SHAPES)
@pytest.mark.parametrize("out_dtype,out_zero", [(np.uint8, 7), (np.int8, -3)])
def test_requantized(lib, M, N, K, out_dtype, out_zero):
  rng = np.random.default_rng(M * N + K)
  a = rng.integers(-128, 128, (M, K)).astype(np.int8)
  w = rng.integers(-128, 128, (K, N)).astype(np.int8)
  bias = rng.integers(-5000, 5000, N).astype(np.int32)
  acc = reference(a, w, -9, bias)
  # per-column scales putting most results inside the range and some past its ends
  scale = (rng.uniform(0.5, 2.0, N) * 60 / (acc.std() + 1)).astype(np.float32)
  want = requantize(acc, scale, out_zero, out_dtype)
  info = np.iinfo(out_dtype)
  assert 0 < np.mean((want == info.min) | (want == info.max)) < 0.9
  for conv_layout in (False, True):
    got = [run(lib, a, w, -9, bias, scale, out_zero, out_dtype, t, conv_layout) for t in (1, 2)]
    np.testing.assert_array_equal(got[0], want)
    assert got[1].tobytes() == got[0].tobytes()


def ties(acc: np.ndarray, scale: np.ndarray, out_zero: int, out_dtype) -> dict[str, int]:
  """How many exact products acc * scale lie halfway between integers and come out inside the output's range, by their
  sign and by which way half to even takes them (down to an even n from n + 0.5, or up to one)."""
  exact = acc.astype(np.float64) * scale.astype(np.float64)
  half = (exact - np.floor(exact)) == 0.5
  info = np.iinfo(out_dtype)
  inside = (np.floor(exact) + out_zero >= info.min) & (np.ceil(exact) + out_zero <= info.max)
  down = np.floor(exact) % 2 == 0
  t = half & inside
  return {
    "positive, down": int(np.sum(t & (exact > 0) & down)),
    "positive, up": int(np.sum(t & (exact > 0) & ~down)),
    "negative, down": int(np.sum(t & (exact < 0) & down)),
    "negative, up": int(np.sum(t & (exact < 0) & ~down)),
  }


@pytest.mark.parametrize("M,N,K", [(37, 45, 19), (49, 70, 147), (16, 16, 4)])
@pytest.mark.parametrize("out_dtype,out_zero", [(np.uint8, 131), (np.int8, -5)])
@pytest.mark.parametrize("scales", ["below_one", "with_big", "one"])
def test_requantized_ties_round_half_to_even(lib, M, N, K, out_dtype, out_zero, scales):
  """Power-of-two scales make products exactly halfway between integers, of both signs, on both sides of an even
  number: each build's requantization (AVX-512's conversion, with and without its clamp; AVX2's; SSE2's rintf; gcc's)
  rounds them to even, as np.rint does, in both C layouts. with_big: a scale of 4 among them (the clamped path);
  one: a single scale for every column."""
  rng = np.random.default_rng(M + N + K)
  a = rng.integers(-128, 128, (M, K)).astype(np.int8)
  w = rng.integers(-3, 4, (K, N)).astype(np.int8)
  bias = rng.integers(-40, 41, N).astype(np.int32)
  acc = reference(a, w, -7, bias)
  powers = {"below_one": [2.0**-k for k in (1, 2, 3, 4)], "with_big": [0.5, 0.25, 4.0], "one": [0.5]}[scales]
  scale = np.array([powers[n % len(powers)] for n in range(1 if scales == "one" else N)], np.float32)
  # sums near zero, so that the halves fall inside the output's range: the mean of each column taken away by bias
  bias = (bias - np.round(acc.mean(axis=0))).astype(np.int32)
  acc = reference(a, w, -7, bias)
  count = ties(acc, np.broadcast_to(scale, (N,)), out_zero, out_dtype)
  assert min(count.values()) >= 5, f"too few ties to test: {count}"
  info = np.iinfo(out_dtype)
  # the products are exact in float32 and float64 alike (a power of two times an integer below 2^24)
  want = np.clip(np.rint(acc.astype(np.float64) * scale) + out_zero, info.min, info.max).astype(out_dtype)
  for conv_layout in (False, True):
    for threads in (1, 2):
      got = run(lib, a, w, -7, bias, scale, out_zero, out_dtype, threads, conv_layout)
      wrong = np.argwhere(got != want)
      assert not wrong.size, (
        f"{len(wrong)} of {want.size} wrong (conv_layout {conv_layout}), first at {tuple(wrong[0])}: "
        f"{acc[tuple(wrong[0])]} * {np.broadcast_to(scale, (N,))[wrong[0][1]]} gave {got[tuple(wrong[0])]}, "
        f"np.rint {want[tuple(wrong[0])]}"
      )
