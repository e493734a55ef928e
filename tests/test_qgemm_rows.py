"""The int8 microkernel's calls over a block's rows (runtime_c/aot_qgemm.c, aot_qmicro.h): where a block's last tile
has 1 to MICRO_MORE rows it is summed in one call with the whole tile before it (49 = 5 x 8 + 9, 42 = 4 x 8 + 10,
35 = 3 x 8 + 11, 12 = 8 + 4, 57 = 6 x 8 + 9, 97 = 64 + 3 x 8 + 9), else alone (13 = 8 + 5, 14, 21, a lone tile of 5
to 7, 196 = 3 x 64 + 4, whose 4 are a block of their own); K in many slices (4608), in one with a part group (148),
in one (64). Built by each compiler a user may have, against an independent numpy integer computation, on 1 and 2
threads, with A row-major and k-major."""

import numpy as np
import pytest
from test_qgemm_shapes import reference, run
from test_qgemm_tiles import lib  # noqa: F401 (the fixture: this CPU's path by each compiler, and AVX2's)

ROWS = [49, 35, 42, 12, 9, 13, 14, 21, 5, 6, 7, 57, 196, 97]


@pytest.mark.parametrize("K", [4608, 148, 64])
@pytest.mark.parametrize("M", ROWS)
@pytest.mark.parametrize("conv_layout", [False, True])
def test_rows_of_a_block(lib, M, K, conv_layout):  # noqa: F811
  N = 40
  rng = np.random.default_rng(M * 1009 + K)
  a = rng.integers(0, 256, (M, K)).astype(np.uint8)
  w = rng.integers(-128, 128, (K, N)).astype(np.int8)
  # the largest sums in the last rows (those summed with the tile before them), where a row dropped, counted twice or
  # read from its neighbour cannot cancel
  a[-1] = 255
  a[-2 if M > 1 else -1, : K // 2] = 0
  w[:, 0] = -128
  bias = rng.integers(-5000, 5000, N).astype(np.int32)
  want = reference(a, w, 3, bias)
  got = run(lib, a, w, 3, bias, None, 0, np.int32, 1, conv_layout)
  np.testing.assert_array_equal(got, want)
  assert run(lib, a, w, 3, bias, None, 0, np.int32, 2, conv_layout).tobytes() == got.tobytes()
