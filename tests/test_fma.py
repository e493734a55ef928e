"""The fused multiply-add (Ops.FMA, Tensor.fma): x * y + z rounded once, against exact rational arithmetic; computed
so by the interpreter (constant folding), the c and llvm targets and the GPU targets' sources, on values where rounding
the product first, or rounding the exact sum through float64 first, gives another float; and QLinearAdd, whose
multiply-adds onnxruntime fuses, bit-equal to onnxruntime over every byte pair where unfused float32 is not."""

import math
import tempfile
from fractions import Fraction

import numpy as np
import pytest
from conftest import ort_session
from onnx import TensorProto as TP
from onnx import helper as oh
from onnx import numpy_helper

import aot
from aot.codegen.render.c import CRenderer
from aot.core.dtype import dtypes
from aot.core.interpret import fused_multiply_add
from aot.core.ir import Ops, UOp
from aot.core.symbolic import simplify
from aot.testing import assert_kernel_count

F32, F64, F16 = np.float32, np.float64, np.float16


def exact_fma(x, y, z, dt) -> np.ndarray:
  """x * y + z of finite floats as a rational, rounded to dt's nearest (ties to the even significand): an independent
  reference (float64's nearest first, then the best of it in dt and dt's two neighbours of that)."""
  out = []
  for a, b, c in zip(*(np.asarray(v, dt).ravel().tolist() for v in (x, y, z))):
    q = Fraction(a) * Fraction(b) + Fraction(c)
    near = dt(float(q))
    cands = [near, np.nextafter(near, dt(np.inf)), np.nextafter(near, dt(-np.inf))]
    err = [abs(Fraction(float(v)) - q) for v in cands]
    best = min(err)
    ties = [v for v, e in zip(cands, err) if e == best]
    bits = {2: np.uint16, 4: np.uint32, 8: np.uint64}[np.dtype(dt).itemsize]
    pick = next((v for v in ties if int(np.array(v).view(bits)) % 2 == 0), ties[0]) if len(ties) > 1 else ties[0]
    out.append(dt(0.0) if q == 0 else pick)
  return np.array(out, dt)


def sliver_case(dt) -> tuple:
  """x * y = 2^-p (1 + d) exactly, with 0 < d < 2^-p (p: dt's significand bits), and z = 1: the exact sum is just above
  the midpoint 1 + 2^-p, so one rounding goes up; the product rounded first is 2^-p, and the sum then a tie, which
  rounds to even, 1. x = 2^-p (1 + m 2^(1-p)), y = 1 - (2m - 1) 2^-p: d = (2^p - 4m^2 + 2m) 2^-2p, m the largest
  that keeps it positive. For float32 d = 2^-36, small enough that the sum rounded to float64 first is the midpoint
  too."""
  p = np.finfo(dt).nmant + 1
  m = math.isqrt(2**p) // 2 + 1
  while 4 * m * m - 2 * m >= 2**p:
    m -= 1
  x, y = 2.0**-p * (1 + m * 2.0 ** (1 - p)), 1 - (2 * m - 1) * 2.0**-p
  return dt(x), dt(y), dt(1.0)


def hard_cases(dt, n: int, seed: int) -> tuple:
  """n triples where z is close to -x * y (the product's low bits survive the cancellation, which the product rounded
  first loses), then the sliver case and its negation."""
  rng = np.random.default_rng(seed)
  # half's range: products well under its largest value
  scale = 2.0 ** rng.integers(-3, 4, (2, n)) if dt == F16 else 2.0 ** rng.integers(-8, 8, (2, n))
  x = (rng.uniform(1, 2, n) * scale[0]).astype(dt)
  y = (rng.uniform(-2, 2, n) * scale[1]).astype(dt)
  z = (-(x.astype(F64) * y.astype(F64)) * (1 + rng.uniform(-1e-3, 1e-3, n))).astype(dt)
  sx, sy, sz = sliver_case(dt)
  return np.append(x, [sx, -sx]).astype(dt), np.append(y, [sy, sy]).astype(dt), np.append(z, [sz, -sz]).astype(dt)


def _bits_equal(got, want):
  np.testing.assert_array_equal(np.asarray(got).view(np.uint8), np.asarray(want).view(np.uint8))


@pytest.mark.parametrize("dt", [F32, F16, F64])
def test_interpreter_rounds_once_where_rounding_twice_differs(dt):
  x, y, z = hard_cases(dt, 2000, 0)
  want = exact_fma(x, y, z, dt)
  _bits_equal(fused_multiply_add(x, y, z), want)
  with np.errstate(all="ignore"):
    unfused = x * y + z
  # the cases are ones where it matters: the separate float ops round differently on many of them
  assert (unfused != want).sum() >= 20
  assert (unfused != want)[-2:].all()
  if dt == F32:
    # ... and so does one rounding to float64 before the one to float32, on the sliver case
    twice = (x.astype(F64) * y.astype(F64) + z.astype(F64)).astype(dt)
    assert (twice != want)[-2:].all()


def test_interpreter_edge_values():
  # IEEE's special cases: an infinite addend to a finite product, inf * 0, signed zeros, an overflowing product
  inf, nan = np.inf, np.nan
  x = np.array([1e30, 0.0, -0.0, 1.0, 3e38, 2.0, -1.0], F32)
  y = np.array([1e30, inf, 1.0, 0.0, 10.0, 3.0, 1.0], F32)
  z = np.array([-inf, 1.0, -0.0, -0.0, -3e38, nan, 1.0], F32)
  got = fused_multiply_add(x, y, z)
  want = np.array([-inf, nan, -0.0, 0.0, inf, nan, 0.0], F32)
  np.testing.assert_array_equal(np.signbit(got[~np.isnan(want)]), np.signbit(want[~np.isnan(want)]))
  np.testing.assert_array_equal(got, want)
  # float64 (exact rationals, or math.fma where Python has it)
  x = np.array([1e300, 0.0, 1e300, -1.0, -0.0, 1e-300], F64)
  y = np.array([1e300, inf, 1e10, 1.0, 1.0, 1e-300], F64)
  z = np.array([-inf, 1.0, -1e300, 1.0, -0.0, -0.0], F64)
  got = fused_multiply_add(x, y, z)
  want = np.array([-inf, nan, inf, 0.0, -0.0, 0.0], F64)
  np.testing.assert_array_equal(got, want)
  np.testing.assert_array_equal(np.signbit(got[[0, 2, 3, 4, 5]]), [True, False, False, True, False])


@pytest.mark.parametrize("build", ["c", "c:x86-64", "llvm"])
def test_compiled_fma_rounds_once(build, tmp_path):
  # float32, float64 and half through the Tensor API, each operand a model input (nothing folds at compile time); on
  # an x86 CPU without FMA instructions (c:x86-64) float32 is the prelude's AOT_FMAF, rounded to odd in double
  target, _, cpu = build.partition(":")
  args = [hard_cases(F32, 256, 1), hard_cases(F64, 256, 2), hard_cases(F16, 256, 3)]
  flat = [v for triple in args for v in triple]
  fn = lambda *v: tuple(v[i].fma(v[i + 1], v[i + 2]) for i in range(0, len(v), 3))
  art = aot.compile_model(fn, flat, out_dir=tmp_path, target=target, cpu=cpu or "native")
  model = aot.load(art)
  try:
    outs = model(*flat)
  finally:
    model.close()
  for (x, y, z), got in zip(args, outs):
    _bits_equal(got, exact_fma(x, y, z, x.dtype.type))
  if target == "c":
    source = (art.dir / "src" / "model.c").read_text()
    assert "AOT_FMAF(" in source and "fma(" in source


def test_fma_is_elementwise_and_folds():
  # it fuses with its neighbours into one kernel, and on constants folds to the one-rounding value at compile time
  x = np.ones((4, 8), F32)
  assert_kernel_count(lambda a, b: (a + 1).fma(b, a * 2).relu().sum(axis=1), 1, [x, x])
  (x1, y1, z1) = (v[-2:] for v in hard_cases(F32, 0, 0))
  with tempfile.TemporaryDirectory() as d:
    art = aot.compile_model(lambda a: a + aot.Tensor(x1).fma(aot.Tensor(y1), aot.Tensor(z1)), [x1], out_dir=d)
    assert art.num_kernels == 1
    model = aot.load(art)
    try:
      got = model(np.zeros(2, F32))
    finally:
      model.close()
  _bits_equal(got, exact_fma(x1, y1, z1, F32))
  # ... and so does the kernel-level simplifier, on scalars
  for dt, npdt in ((dtypes.float32, F32), (dtypes.float64, F64)):
    x, y, z = sliver_case(npdt)
    folded = simplify(UOp.const(dt, float(x)).alu(Ops.FMA, UOp.const(dt, float(y)), UOp.const(dt, float(z))))
    assert folded.op is Ops.CONST and folded.arg == float(exact_fma([x], [y], [z], npdt)[0])


def test_integer_fma_is_the_separate_ops():
  x = np.array([3, -7, 100], np.int32)
  with tempfile.TemporaryDirectory() as d:
    model = aot.load(aot.compile_model(lambda a: a.fma(a, 5), [x], out_dir=d))
    try:
      np.testing.assert_array_equal(model(x), x * x + 5)
    finally:
      model.close()


def test_gpu_sources_spell_fma(tmp_path):
  # CUDA through the C library's fmaf (run on the CPU shim: the numbers), HIP through clang's builtin, Metal's own
  from aot.codegen.render.gpu import GPU_TARGETS, KERNEL_SOURCE

  x, y, z = hard_cases(F32, 64, 4)
  fn = lambda a, b, c: a.fma(b, c)
  for target, spelling in zip(GPU_TARGETS, ("fmaf(", "__builtin_fmaf(", "metal::fma(")):
    art = aot.compile_model(fn, [x, y, z], target=target, out_dir=tmp_path / target)
    assert spelling in (art.dir / "src" / KERNEL_SOURCE[target]).read_text()
  emulated = aot.load(aot.compile_model(fn, [x, y, z], target="cuda", emulate=True, out_dir=tmp_path / "emulated"))
  try:
    _bits_equal(emulated(x, y, z), exact_fma(x, y, z, F32))
  finally:
    emulated.close()


# scales with 4 significant digits, where rounding a*ra before adding it is a step off in hundreds of byte pairs
QLINEAR_ADD = {
  np.uint8: (0.0924, 35, 0.0744, 152, 0.0384, 54),
  np.int8: (0.0138, -5, 0.0474, 39, 0.0372, -20),
}


@pytest.mark.parametrize("target", ["c", "llvm"])
@pytest.mark.parametrize("dt", [np.uint8, np.int8])
def test_qlinear_add_equals_onnxruntime_on_every_byte_pair(dt, target):
  sa, za, sb, zb, sc, zc = QLINEAR_ADD[dt]
  info = np.iinfo(dt)
  values = np.arange(info.min, info.max + 1)
  a, b = (v.astype(dt).reshape(1, 1, 256, 256) for v in np.meshgrid(values, values, indexing="ij"))
  ty = TP.UINT8 if dt is np.uint8 else TP.INT8
  consts = {"as": F32(sa), "az": dt(za), "bs": F32(sb), "bz": dt(zb), "cs": F32(sc), "cz": dt(zc)}
  node = oh.make_node("QLinearAdd", ["a", "as", "az", "b", "bs", "bz", "cs", "cz"], ["y"], domain="com.microsoft")
  graph = oh.make_graph(
    [node],
    "g",
    [oh.make_tensor_value_info(n, ty, a.shape) for n in "ab"],
    [oh.make_tensor_value_info("y", ty, None)],
    [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()],
  )
  m = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17), oh.make_opsetid("com.microsoft", 1)])
  m.ir_version = 9
  (want,) = ort_session(m).run(None, {"a": a, "b": b})
  with tempfile.TemporaryDirectory() as d:
    art = aot.compile_model(m, out_dir=d, target=target)
    model = aot.load(art)
    try:
      got = model(a, b)
    finally:
      model.close()
  np.testing.assert_array_equal(got, want)
  # rounded twice in float32 (the products first), hundreds of the pairs come out a step away from onnxruntime's
  ra, rb = F32(sa) / F32(sc), F32(sb) / F32(sc)
  fixed = F32(zc) - fused_multiply_add(ra, F32(za), rb * F32(zb))
  unfused = np.clip(np.rint(a.astype(F32) * ra + (b.astype(F32) * rb + fixed)), info.min, info.max).astype(dt)
  assert (unfused != want).sum() >= 100


def test_renderer_table_has_fma_for_every_float_type():
  # half goes through double (one rounding of an exact product of halves), never through float's fmaf
  render = CRenderer.code_for_op[Ops.FMA]
  assert render(dtypes.float32, "a", "b", "c") == "AOT_FMAF(a, b, c)"
  assert render(dtypes.float64, "a", "b", "c") == "fma(a, b, c)"
  assert "fma((double)(a), (double)(b), (double)(c))" in render(dtypes.float16, "a", "b", "c")
