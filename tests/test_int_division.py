"""Integer division and remainder, int8 to int64, on the CPU targets: ONNX Div (truncated toward zero, as
onnxruntime), Mod with fmod=0 (the divisor's sign, numpy's np.mod) and fmod=1 (the dividend's sign, C's fmod), and
the Tensor API's // and % (C's: truncated, the dividend's sign; docs/ARCHITECTURE.md), with negative operands, the
extremes and the divisors C leaves undefined. Those are defined as numpy computes them: MIN / -1 wraps to MIN (as
onnxruntime's int8-int32 Div; its int64 Div traps), MIN % -1 is 0, and x / 0 and x % 0 are 0 (onnxruntime refuses
a zero divisor with an error). The compiled code runs in a subprocess, so a trap is a failure, not a crash of the run.
The references are Python's exact integers."""

import subprocess
import sys

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper

import aot

DTYPES = (np.int8, np.int16, np.int32, np.int64)
ONNX_OPS = (("Div", {}), ("Mod", {"fmod": 0}), ("Mod", {"fmod": 1}))


def operands(dt) -> tuple[np.ndarray, np.ndarray]:
  """Every pair of a few dividends and divisors: both signs, 0, +-1, the extremes (MIN / -1 among them)."""
  lo, hi = int(np.iinfo(dt).min), int(np.iinfo(dt).max)
  dividends = [0, 1, -1, 7, -7, 6, -6, 100, -100, hi, lo, lo + 1, hi - 1]
  divisors = [1, -1, 2, -2, 3, -3, 7, -7, 10, -10, hi, lo, 0]
  a, b = zip(*[(x, y) for x in dividends for y in divisors])
  return np.array(a, dt), np.array(b, dt)


def _wrap(v: int, dt) -> int:
  bits = np.iinfo(dt).bits
  v &= (1 << bits) - 1
  return v - (1 << bits) if v >= 1 << (bits - 1) else v


def _trunc_div(x: int, y: int) -> int:
  q = abs(x) // abs(y)
  return q if (x < 0) == (y < 0) else -q


# exact references on Python integers, wrapped to the type; a zero divisor gives 0
REFERENCE = {
  "div": lambda x, y: _trunc_div(x, y) if y else 0,
  "mod": lambda x, y: x % y if y else 0,  # Python's %: the divisor's sign
  "fmod": lambda x, y: x - y * _trunc_div(x, y) if y else 0,
}


def reference(kind: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
  return np.array([_wrap(REFERENCE[kind](int(x), int(y)), a.dtype) for x, y in zip(a, b)], a.dtype)


def test_references_agree_with_numpy():
  # the Python references are numpy's np.mod and np.fmod, and numpy's truncated quotient, on every pair
  for dt in DTYPES:
    a, b = operands(dt)
    with np.errstate(all="ignore"):
      np.testing.assert_array_equal(reference("mod", a, b), np.mod(a, b))
      np.testing.assert_array_equal(reference("fmod", a, b), np.fmod(a, b))
      q = (a - np.fmod(a, b)) // np.where(b == 0, 1, b)
      np.testing.assert_array_equal(reference("div", a, b), np.where(b == 0, 0, q))


def _onnx_model(n: int | None = None):
  """Div, Mod fmod=0 and fmod=1 for each type; of n elements (a dim of its own per type when None)."""
  nodes, inputs, outputs = [], [], []
  for dt in DTYPES:
    t, bits = helper.np_dtype_to_tensor_dtype(np.dtype(dt)), np.iinfo(dt).bits
    dim = n or f"n{bits}"
    inputs += [helper.make_tensor_value_info(f"{v}{bits}", t, [dim]) for v in "ab"]
    for op, kw in ONNX_OPS:
      out = f"{op}{kw.get('fmod', '')}_{bits}"
      nodes.append(helper.make_node(op, [f"a{bits}", f"b{bits}"], [out], **kw))
      outputs.append(helper.make_tensor_value_info(out, t, [dim]))
  graph = helper.make_graph(nodes, "int_division", inputs, outputs)
  # opset 14: Div takes int8 and int16
  return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])


_RUN = """
import sys, numpy as np, aot
arrays = np.load(sys.argv[2])
outs = aot.load(sys.argv[1])(*[arrays[f"arr_{i}"] for i in range(len(arrays.files))])
np.savez(sys.argv[3], *(outs if isinstance(outs, (list, tuple)) else [outs]))
"""


def run_in_subprocess(art, inputs: list[np.ndarray], tmp_path) -> list[np.ndarray]:
  np.savez(tmp_path / "in.npz", *inputs)
  p = subprocess.run(
    [sys.executable, "-c", _RUN, str(art.dir), str(tmp_path / "in.npz"), str(tmp_path / "out.npz")],
    capture_output=True,
    text=True,
    timeout=120,
  )
  # a negative code is a signal (SIGFPE: -8)
  assert p.returncode == 0, f"the model's run ended with {p.returncode}: {p.stderr[-2000:]}"
  outs = np.load(tmp_path / "out.npz")
  return [outs[f"arr_{i}"] for i in range(len(outs.files))]


@pytest.mark.parametrize("target", ["c", "llvm"])
def test_onnx_div_and_mod_on_signed_integers(target, tmp_path):
  model = _onnx_model(len(operands(np.int8)[0]))
  art = aot.compile_model(model, out_dir=tmp_path / "art", name="int_division", target=target)
  inputs = [x for dt in DTYPES for x in operands(dt)]
  got = iter(run_in_subprocess(art, inputs, tmp_path))
  for dt in DTYPES:
    a, b = operands(dt)
    for op, kw in ONNX_OPS:
      kind = {"Div": "div", 0: "mod", 1: "fmod"}[kw.get("fmod", op)]
      out = next(got)
      assert out.dtype == dt
      bad = [(x, y, g, w) for x, y, g, w in zip(a, b, out, reference(kind, a, b)) if g != w]
      assert not bad, f"{target} {op}{kw} {np.dtype(dt).name}: (a, b, got, want) {bad[:8]}"


def test_onnx_div_and_mod_reference_is_onnxruntimes_where_it_defines_one():
  # onnxruntime on the pairs it defines (no zero divisor; no MIN / -1, which traps in its int64 Div)
  session = ort.InferenceSession(_onnx_model().SerializeToString(), providers=["CPUExecutionProvider"])
  feeds, kept = {}, {}
  for dt in DTYPES:
    a, b = operands(dt)
    kept[dt] = (b != 0) & ~((a == np.iinfo(dt).min) & (b == -1))
    bits = np.iinfo(dt).bits
    feeds[f"a{bits}"], feeds[f"b{bits}"] = a[kept[dt]], b[kept[dt]]
  got = iter(session.run(None, feeds))
  for dt in DTYPES:
    a, b = (x[kept[dt]] for x in operands(dt))
    for op, kw in ONNX_OPS:
      kind = {"Div": "div", 0: "mod", 1: "fmod"}[kw.get("fmod", op)]
      np.testing.assert_array_equal(next(got), reference(kind, a, b), err_msg=f"{op}{kw} {np.dtype(dt).name}")


@pytest.mark.parametrize("target", ["c", "llvm"])
def test_tensor_floor_division_and_remainder_on_signed_integers(target, tmp_path):
  # // truncates toward zero and % takes the dividend's sign, as C's (not Python's) do
  inputs = [x for dt in DTYPES for x in operands(dt)]

  def fn(*xs):
    return tuple(r for a, b in zip(xs[::2], xs[1::2]) for r in (a // b, a % b))

  art = aot.compile_model(fn, inputs, out_dir=tmp_path / "art", name="tensor_division", target=target)
  got = iter(run_in_subprocess(art, inputs, tmp_path))
  for dt in DTYPES:
    a, b = operands(dt)
    for what, kind in (("//", "div"), ("%", "fmod")):
      out = next(got)
      bad = [(x, y, g, w) for x, y, g, w in zip(a, b, out, reference(kind, a, b)) if g != w]
      assert not bad, f"{target} a {what} b, {np.dtype(dt).name}: (a, b, got, want) {bad[:8]}"


def test_the_fuzzer_draws_integer_div_and_mod_with_nonzero_divisors():
  # aot/fuzz_graphs.int_division: each kind on int32/int64 operands, its divisor a Where that makes zeros ones
  # (tests/test_fuzz.py runs such cases against onnxruntime: seed 6 on llvm has two)
  from onnx import numpy_helper

  from aot.tools.fuzz_graphs import generate

  kinds = set()
  for i in range(96):
    case = generate(9001, i)
    made = {o: n for n in case.nodes for o in n.output}
    inits = {t.name: numpy_helper.to_array(t) for t in case.inits}
    for n in case.nodes:
      if n.op_type in ("Div", "Mod") and n.input[1] in made and made[n.input[1]].op_type == "Where":
        where = made[n.input[1]]
        equal = made[where.input[0]]
        assert equal.op_type == "Equal" and inits[equal.input[1]] == 0 and inits[where.input[1]] == 1
        kinds.add((n.op_type, next((a.i for a in n.attribute if a.name == "fmod"), None)))
  assert kinds == {("Div", None), ("Mod", 0), ("Mod", 1)}


@pytest.mark.parametrize("target", ["c", "llvm"])
def test_unsigned_division_by_zero_is_zero(target, tmp_path):
  # udiv and urem by 0 trap too; numpy's x // 0 and x % 0 on unsigned types are 0
  unsigned = (np.uint8, np.uint16, np.uint32, np.uint64)
  inputs = []
  for dt in unsigned:
    hi = int(np.iinfo(dt).max)
    pairs = [(x, y) for x in (0, 1, 5, 200, hi, hi - 1) for y in (0, 1, 2, 7, hi)]
    inputs += [np.array([x for x, _ in pairs], dt), np.array([y for _, y in pairs], dt)]

  def fn(*xs):
    return tuple(r for a, b in zip(xs[::2], xs[1::2]) for r in (a // b, a % b))

  art = aot.compile_model(fn, inputs, out_dir=tmp_path / "art", name="unsigned_division", target=target)
  got = iter(run_in_subprocess(art, inputs, tmp_path))
  for a, b in zip(inputs[::2], inputs[1::2]):
    q = [int(x) // int(y) if y else 0 for x, y in zip(a, b)]
    r = [int(x) % int(y) if y else 0 for x, y in zip(a, b)]
    np.testing.assert_array_equal(next(got), np.array(q, a.dtype), err_msg=f"{target} {a.dtype} //")
    np.testing.assert_array_equal(next(got), np.array(r, a.dtype), err_msg=f"{target} {a.dtype} %")


def test_metal_source_of_integer_division_type_checks(tmp_path):
  # the guarded divisions in Metal's spelling (char, uchar, long; build.check_metal_syntax), which cannot run here
  xs = [np.array([1, 2], dt) for dt in (np.int8, np.int8, np.uint32, np.uint32, np.int64, np.int64)]
  art = aot.compile_model(
    lambda a, b, c, d, e, f: (a // b, a % b, c // d, c % d, e // f, e % f), xs, target="metal", out_dir=tmp_path / "m"
  )
  source = (art.dir / "src" / "kernels.metal").read_text()
  assert "== -1 ?" in source and "(char)(0 - (uchar)" in source
