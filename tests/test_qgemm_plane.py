"""The int8 microkernel reading a same-width convolution's A from its input planes (aot_qgemm's plane,
runtime_c/aot_qgemm.c) rather than from the im2col's copy: its int32 and requantized results against numpy's
integer products over numpy's own im2col, bit for bit, on 1 and 3 threads; the geometries it must refuse; and the
planes' neighbouring pages unreadable, so that a lane read outside a plane crashes the test."""

import ctypes
import mmap

import numpy as np
import pytest
from test_int8 import DRIVER, QGemm, build_qgemm
from test_qim2col import QIm2col, out_size
from test_qim2col import reference as im2col_reference

from aot.codegen.lower.quant import pack_weights, requantize

PLANE_DRIVER = (
  DRIVER
  + r"""
__attribute__((visibility("default"))) int reads_plane(const aot_qim2col *p) { return aot_qgemm_reads_plane(p); }
"""
)


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
  return build_qgemm(tmp_path_factory.mktemp("qgemm_plane"), "native", driver=PLANE_DRIVER)


def has_avx512bw() -> bool:
  return " avx512bw" in open("/proc/cpuinfo").read()


class Guarded:
  """n bytes that end where an unreadable page begins, after one unreadable page too (mmap'd, protected by
  mprotect)."""

  def __init__(self, n: int):
    page = mmap.PAGESIZE
    body = -(-n // page) * page
    self.map = mmap.mmap(-1, body + 2 * page, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
    libc = ctypes.CDLL(None)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    for at in (base, base + page + body):
      assert libc.mprotect(at, page, 0) == 0
    self.address = base + page + body - n
    self.array = np.frombuffer(self.map, np.uint8, n, page + body - n)


# (C, H, W, KH, KW, (top, left, bottom, right) pads): stride 1 and as many outputs a row as the input has; a plane
# of 1, 3 and 5 columns, blocks of 64 outputs crossing rows, part blocks, K past one k slice (720, 1152) and at the
# longest the call keeps (4608), 1xK and Kx1, 7x7 taps, pads on one side (fewer output rows than input rows)
GEOMETRIES = [
  (16, 56, 56, 3, 3, (1, 1, 1, 1)),
  (80, 9, 9, 3, 3, (1, 1, 1, 1)),
  (128, 12, 12, 3, 3, (1, 1, 1, 1)),
  (512, 7, 7, 3, 3, (1, 1, 1, 1)),
  (3, 11, 11, 7, 7, (3, 3, 3, 3)),
  (5, 13, 40, 5, 5, (2, 2, 2, 2)),
  (4, 8, 12, 1, 5, (0, 2, 0, 2)),
  (4, 12, 8, 5, 1, (2, 0, 2, 0)),
  (3, 9, 10, 3, 3, (0, 0, 2, 2)),
  (3, 9, 10, 3, 3, (0, 1, 0, 1)),
  (2, 5, 3, 3, 3, (1, 1, 1, 1)),
  (6, 1, 1, 3, 3, (1, 1, 1, 1)),
  (2, 4, 5, 3, 3, (2, 1, 0, 1)),
]


def qgemm_over_planes(lib, x, x_addr, x_plane, KH, KW, pads, w, zero, signed, order, out, threads, bias, scale):
  """aot_qgemm with A read from the planes at x_addr (C planes x_plane apart, rows W long), its k in `order` of
  (c, kh, kw); the result into out (int32 [M][N], or 8-bit m-major as a convolution writes it: [N][M])."""
  C, H, W = x.shape
  OH, OW = out_size(H, W, KH, KW, (1, 1), pads)
  M, K, N = OH * OW, C * KH * KW, w.shape[1]
  sizes, stride, step = {0: C, 1: KH, 2: KW}, {}, M
  for axis in reversed(order):
    stride[axis] = step
    step *= sizes[axis]
  # the pad is the zero point's byte, as the plane's bytes are
  pad = zero & 0xFF
  p = QIm2col(x_addr, x_plane, W, H, W, KH, KW, 1, 1, pads[0], pads[1], None, stride[0], stride[1], stride[2])
  p.OH, p.OW, p.planes, p.pad = OH, OW, C, pad
  assert lib.reads_plane(ctypes.byref(p)) == int(has_avx512bw())
  # B's rows in A's k order
  k_of = np.arange(K).reshape(C, KH, KW).transpose(order).reshape(-1)
  packed, col_sum = pack_weights(np.ascontiguousarray(w[k_of]))
  eight = out.dtype != np.int32
  g = QGemm(M, N, K, None, M, int(signed), zero, packed.ctypes.data, col_sum.ctypes.data, bias.ctypes.data)
  g.scale = scale.ctypes.data if eight else None
  g.scale_step, g.out_type, g.out_zero = 1, {np.int32: 0, np.uint8: 1, np.int8: 2}[out.dtype.type], 3 if eight else 0
  g.c, g.ldc_m, g.ldc_n = out.ctypes.data, *((1, M) if eight else (N, 1))
  g.a_kmajor = 1
  g.plane = ctypes.addressof(p) if lib.reads_plane(ctypes.byref(p)) else None
  # without AVX-512 the call has A from nowhere: the im2col's copy is what it reads
  copy = None
  if g.plane is None:
    a = im2col_reference(x, KH, KW, (1, 1), pads, OH, OW, pad)
    copy = np.ascontiguousarray(a.transpose(*order, 3).reshape(K, M))
    g.a = copy.ctypes.data
  lib.qgemm(ctypes.byref(g), threads)


def expected(x, KH, KW, pads, w, zero, signed, bias):
  """numpy's int32 C[m][n] over numpy's im2col, A's padding its zero point."""
  C, H, W = x.shape
  OH, OW = out_size(H, W, KH, KW, (1, 1), pads)
  a = im2col_reference(x, KH, KW, (1, 1), pads, OH, OW, zero & 0xFF)
  a = a.reshape(C * KH * KW, OH * OW).astype(np.int64)
  if signed:
    a = (a ^ 0x80) - 128
  return ((a.T - zero) @ w.astype(np.int64) + bias).astype(np.int32)


@pytest.mark.parametrize("g", GEOMETRIES, ids=lambda g: "x".join(map(str, g[:5])) + "p" + "".join(map(str, g[5])))
@pytest.mark.parametrize("signed", [False, True], ids=["u8", "s8"])
def test_plane_reads_equal_numpy(lib, g, signed):
  C, H, W, KH, KW, pads = g
  r = np.random.default_rng(sum(g[:5]) + signed)
  N = 40
  w = r.integers(-128, 128, (C * KH * KW, N)).astype(np.int8)
  bias = r.integers(-5000, 5000, N).astype(np.int32)
  zero = int(r.integers(-128, 128)) if signed else int(r.integers(0, 256))
  # planes 37 bytes apart beyond their own size (a channel slice of a wider tensor) in guarded pages
  x_plane = H * W + 37
  buf = Guarded(C * x_plane - 37)
  buf.array[:] = r.integers(0, 256, buf.array.size, dtype=np.uint8)
  x = np.lib.stride_tricks.as_strided(buf.array, (C, H, W), (x_plane, W, 1))
  want = expected(x, KH, KW, pads, w, zero, signed, bias)
  M = want.shape[0]
  scale = r.uniform(1e-5, 3e-4, N).astype(np.float32)
  for order in ((0, 1, 2), (2, 1, 0)):
    for threads in (1, 3):
      got = np.zeros((M, N), np.int32)
      qgemm_over_planes(lib, x, buf.address, x_plane, KH, KW, pads, w, zero, signed, order, got, threads, bias, scale)
      np.testing.assert_array_equal(got, want, err_msg=f"k order {order}, {threads} threads")
    dt = np.int8 if signed else np.uint8
    got8 = np.zeros((N, M), dt)
    qgemm_over_planes(lib, x, buf.address, x_plane, KH, KW, pads, w, zero, signed, order, got8, 2, bias, scale)
    np.testing.assert_array_equal(got8.T, requantize(want, scale, 3, dt), err_msg=f"8-bit, k order {order}")


# geometries whose A the call must leave to the im2col: strides past 1, outputs a row fewer than the input's, rows
# longer than the plane's, K past the rows' table, more taps than its masks
REFUSED = {
  "stride 2": dict(SH=2, SW=2, OH=7, OW=7),
  "fewer columns": dict(OW=12),
  "padded rows": dict(x_row=15),
  "K past 4608": dict(planes=513),
  "taps past 49": dict(KH=5, KW=11, PH=2, PW=5),
}


@pytest.mark.parametrize("change", list(REFUSED), ids=list(REFUSED))
def test_geometries_left_to_the_im2col(lib, change):
  fields = dict(x_plane=196, x_row=14, H=14, W=14, KH=3, KW=3, SH=1, SW=1, PH=1, PW=1, OH=14, OW=14, planes=512)
  base = QIm2col(**fields, y_kh=3 * 196, y_kw=196)
  base.y_plane = 9 * 196
  assert lib.reads_plane(ctypes.byref(base)) == int(has_avx512bw())
  p = QIm2col(**{**fields, **REFUSED[change]})
  p.y_plane, p.y_kh, p.y_kw = p.KH * p.KW * p.OH * p.OW, p.KW * p.OH * p.OW, p.OH * p.OW
  assert lib.reads_plane(ctypes.byref(p)) == 0
