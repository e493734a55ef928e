"""The int8 microkernel's split of K into slices (runtime_c/aot_qgemm.c: K whole up to QKC_ONE, else slices of equal
length) and of M into tiles, on the lengths where the split changes (K = 576 in one slice, 644 just past it, 147 and
4608 of ResNet's stem and 7x7 layers; M = 49, 41, 196, 7, 1 with their part tiles), built by each compiler a user
may have, against an independent numpy integer computation."""

import shutil

import numpy as np
import pytest
from test_int8 import build_qgemm
from test_qgemm_shapes import reference, run

COMPILERS = [c for c in ("gcc", "clang-14", "clang-19") if shutil.which(c)]
# this CPU's path (AVX-512 VNNI here) by each compiler, and AVX2's, whose widened A is as long as the longest slice
BUILDS = [(c, "native") for c in COMPILERS] + [(COMPILERS[-1], "x86-64-v3")]


@pytest.fixture(scope="module", params=BUILDS, ids=lambda b: f"{b[0]}-{b[1]}")
def lib(request, tmp_path_factory):
  compiler, cpu = request.param
  return build_qgemm(tmp_path_factory.mktemp(f"qtiles_{compiler}_{cpu}"), cpu, compiler)


# (M, K): K in one slice (576, 640) and just past it (644: two of 324); the stem's 147; 4608 in slices of 256 where M
# fits one block, 1152 in three of 384 where it does not; M of 8-row tiles and part tiles (49 = 6 x 8 + 1, 41, 196 =
# 3 x 64 + 4, 7, 1)
SHAPES = [(49, 576), (196, 576), (41, 640), (7, 644), (65, 644), (1, 147), (196, 147), (49, 4608), (41, 1152)]


@pytest.mark.parametrize("M,K", SHAPES)
@pytest.mark.parametrize("conv_layout", [False, True])
def test_int32_sums_over_slices(lib, M, K, conv_layout):
  N = 40
  rng = np.random.default_rng(M * 31 + K)
  a = rng.integers(0, 256, (M, K)).astype(np.uint8)
  w = rng.integers(-128, 128, (K, N)).astype(np.int8)
  # the largest sums, where a slice counted twice or dropped cannot cancel
  a[-1] = 255
  w[:, 0] = -128
  bias = rng.integers(-5000, 5000, N).astype(np.int32)
  want = reference(a, w, 5, bias)
  got = run(lib, a, w, 5, bias, None, 0, np.int32, 1, conv_layout)
  np.testing.assert_array_equal(got, want)
  # on 2 threads, the same bytes
  assert run(lib, a, w, 5, bias, None, 0, np.int32, 2, conv_layout).tobytes() == got.tobytes()
