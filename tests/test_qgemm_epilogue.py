"""The int8 microkernel's requantizing epilogue (runtime_c/aot_qgemm.c): clamp(rint(float(C) * scale) + zero) in
onnxruntime's order, rounding half to even, saturating at both ends, for uint8 and int8 outputs, one scale or one per
column (below 1, where the runtime skips the float clamp, and above, where it needs it), zero points at the ends of
the range, M and N leaving part 16 x 16 blocks, written m-contiguous (a convolution's) and n-contiguous, built by
each compiler a user may have and for AVX-512 without VBMI and for AVX2, against an independent numpy computation."""

import shutil

import numpy as np
import pytest
from test_int8 import build_qgemm
from test_qgemm_shapes import run

COMPILERS = [c for c in ("gcc", "clang-14", "clang-19") if shutil.which(c)]
# this CPU's path by each compiler; AVX-512 without VBMI (the in-lane transpose) and AVX2 by the last
BUILDS = [(c, "native") for c in COMPILERS] + [(COMPILERS[-1], "skylake-avx512"), (COMPILERS[-1], "x86-64-v3")]


@pytest.fixture(scope="module", params=BUILDS, ids=lambda b: f"{b[0]}-{b[1]}")
def lib(request, tmp_path_factory):
  compiler, cpu = request.param
  return build_qgemm(tmp_path_factory.mktemp(f"qepilogue_{compiler}_{cpu}"), cpu, compiler)


def onnxruntime_requantize(a, w, a_zero, bias, scale, out_zero, out_dtype):
  """onnxruntime's requantization of the exact int32 sums: float32(sum) * scale in float32, clamped to the output's
  range less the zero point, rounded half to even, plus the zero point."""
  acc = (a.astype(np.int64) - a_zero) @ w.astype(np.int64) + bias
  r = acc.astype(np.int32).astype(np.float32) * np.float32(scale)
  info = np.iinfo(out_dtype)
  r = np.clip(r, np.float32(info.min - out_zero), np.float32(info.max - out_zero))
  return (np.rint(r).astype(np.int32) + out_zero).astype(out_dtype)


def operands(M, N, K, rng):
  """A and B whose sums reach far past the output's range both ways (rows of 255 against columns of 127 and -128),
  and otherwise small: scales of 1/2 and 3/2 put odd sums exactly half way between two integers."""
  a = rng.integers(0, 40, (M, K)).astype(np.uint8)
  w = (rng.integers(-1, 2, (K, N)) * (rng.random((K, N)) < 0.05)).astype(np.int8)
  a[:: max(M // 5, 1)] = 255
  w[:, ::3] = 127
  w[:, 1::3] = -128
  a[M // 2] = 0
  bias = rng.integers(-20, 20, N).astype(np.int32)
  return a, w, bias


# per-column scales: below 1 (no float clamp), halves, above 1, one large enough that float(C) * scale passes 2^31
COLUMN_SCALES = np.array([0.5, 1.5, 0.0009, 3.0e5, 2.0**-20, 0.99999994, 1.0, 2.5, 0.25, 1e-3], np.float32)
# (M, N): the stem's 12544 rows (196 whole blocks of 64), a 7x7 layer's 49, 17 (one part block of 16 rows), 1; N of
# whole 16-column blocks, 17 (one past), 1, 130 (a task of 128 and one of 2)
SIZES = [(12544, 64), (49, 17), (17, 130), (1, 1), (49, 130), (17, 64), (1, 17), (12544, 1)]


@pytest.mark.parametrize("M,N", SIZES)
@pytest.mark.parametrize("out_dtype", [np.uint8, np.int8])
def test_requantized_outputs(lib, M, N, out_dtype):
  K = 147
  rng = np.random.default_rng(M * 7 + N)
  a, w, bias = operands(M, N, K, rng)
  info = np.iinfo(out_dtype)
  per_column = np.resize(COLUMN_SCALES, N)
  for scale in (np.float32(0.5), np.float32(1.5), np.float32(0.0009), per_column):
    for out_zero in (info.min, info.max, 0 if out_dtype == np.int8 else 128):
      want = onnxruntime_requantize(a, w, 4, bias, scale, out_zero, out_dtype)
      for conv_layout in (True, False):
        got = run(lib, a, w, 4, bias, scale, out_zero, out_dtype, 1, conv_layout)
        np.testing.assert_array_equal(got, want, err_msg=f"scale {scale}, zero {out_zero}, conv {conv_layout}")


def test_cases_reach_the_edges():
  """The operands above do reach both ends of the range, and sums exactly half way between two integers."""
  M, N = 49, 130
  a, w, bias = operands(M, N, 147, np.random.default_rng(0))
  acc = (a.astype(np.int64) - 4) @ w.astype(np.int64) + bias
  assert (acc * 0.0009 > 300).any() and (acc * 0.0009 < -300).any()
  # odd sums at scale 1/2: half of them round down to even, half up
  halves = acc[acc % 2 == 1] * 0.5
  assert (np.rint(halves) < halves).any() and (np.rint(halves) > halves).any()
  # a sum times 3e5 past 2^31, and sums not saturating at every scale below 1
  assert (np.abs(acc) * 3.0e5 > 2.0**31).any()
  assert (np.abs(acc * 0.5) < 100).mean() > 0.2
