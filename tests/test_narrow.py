"""The narrow storage types, value by value: every code of each type decoded, and floats (every representable value,
the ties between neighbours and either side of them, NaN, Inf, out of range, saturate on and off) encoded, through
one compiled Cast graph per type, against onnx's reference implementation (which converts with ml_dtypes)."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from aot.compiler import compile_model
from aot.core.dtype import NARROW
from aot.loader import load

# onnx.reference casts NaN and out-of-range floats to the ints with numpy, which warns
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def all_codes(f) -> np.ndarray:
  """Every value of f, as an ml_dtypes array."""
  if f.kind in ("i", "u"):
    lo = -(1 << (f.bits - 1)) if f.kind == "i" else 0
    return np.arange(lo, lo + (1 << f.bits)).astype(f.np)
  return np.arange(1 << f.bits, dtype=f.storage.np).view(f.np)


def floats_for(f) -> np.ndarray:
  """float32 inputs that exercise every rounding decision of an encode to f."""
  v = np.unique(all_codes(f).astype(np.float32))
  v = v[np.isfinite(v)]
  mid = (v[:-1].astype(np.float64) + v[1:]) / 2  # the ties, exact in float32 for all of these formats
  mid = mid.astype(np.float32)
  near = np.concatenate([np.nextafter(mid, np.float32(np.inf)), np.nextafter(mid, np.float32(-np.inf))])
  top = np.float32(np.abs(v).max())
  with np.errstate(over="ignore"):
    beyond = np.array(
      [top * 1.01, top * 1.06, top * 2, 1e38, 3.4e38, np.inf, -np.inf, np.nan, -np.nan, 1e-45, 1e-30, 0.0, -0.0],
      np.float32,
    )
  out = np.concatenate([v, mid, near, beyond, -beyond, -v])
  if f.kind == "float" and not f.special:
    out = out[~np.isnan(out)]  # float4e2m1 has no NaN: ONNX leaves it open
  if f.kind == "e8m0":
    out = np.abs(out)  # e8m0 has no sign: a negative input is undefined in ONNX
  return out


def cast_model(f, n_codes: int, n_floats: int) -> onnx.ModelProto:
  """codes -> float32, and float32 -> f with saturate on and off (e8m0: also each rounding mode)."""
  t = getattr(TensorProto, f.onnx)
  nodes = [
    helper.make_node("Cast", ["codes"], ["decoded"], to=TensorProto.FLOAT),
    helper.make_node("Cast", ["x"], ["sat"], to=t, saturate=1),
    helper.make_node("Cast", ["x"], ["nosat"], to=t, saturate=0),
  ]
  outs = [
    helper.make_tensor_value_info("decoded", TensorProto.FLOAT, [n_codes]),
    helper.make_tensor_value_info("sat", t, [n_floats]),
    helper.make_tensor_value_info("nosat", t, [n_floats]),
  ]
  if f.kind == "e8m0":
    for mode in ("down", "nearest"):
      for sat in (0, 1):
        nodes.append(helper.make_node("Cast", ["x"], [f"{mode}{sat}"], to=t, saturate=sat, round_mode=mode))
        outs.append(helper.make_tensor_value_info(f"{mode}{sat}", t, [n_floats]))
  ins = [
    helper.make_tensor_value_info("codes", t, [n_codes]),
    helper.make_tensor_value_info("x", TensorProto.FLOAT, [n_floats]),
  ]
  g = helper.make_graph(nodes, f"cast_{f.name}", ins, outs)
  return helper.make_model(g, opset_imports=[helper.make_opsetid("", 25)])


def same_codes(f, got: np.ndarray, want: np.ndarray) -> np.ndarray:
  """Elementwise: the same code, or both NaN (the payload of a NaN is not specified)."""
  assert got.dtype == want.dtype == f.np
  if f.kind in ("i", "u"):
    return got.astype(np.int8) == want.astype(np.int8)
  raw = lambda a: a.view(f.storage.np)
  return (raw(got) == raw(want)) | (np.isnan(got.astype(np.float32)) & np.isnan(want.astype(np.float32)))


@pytest.mark.parametrize("target", ["c", "llvm"])
@pytest.mark.parametrize("name", list(NARROW))
def test_cast_every_value(name, target, tmp_path):
  f = NARROW[name]
  codes, x = all_codes(f), floats_for(f)
  model = cast_model(f, codes.size, x.size)
  got = load(compile_model(model, out_dir=tmp_path, name="m", target=target))(codes, x)
  want = ReferenceEvaluator(model).run(None, {"codes": codes, "x": x})
  dec = got[0]
  np.testing.assert_array_equal(np.isnan(dec), np.isnan(want[0]), err_msg=f"{name}: NaN codes decoded")
  np.testing.assert_array_equal(
    dec.view(np.uint32)[~np.isnan(dec)], want[0].view(np.uint32)[~np.isnan(dec)], err_msg=f"{name}: decoding"
  )
  for out, g, w in zip(model.graph.output[1:], got[1:], want[1:]):
    ok = same_codes(f, g, w)
    assert ok.all(), f"{name} {out.name}: {x[~ok][:6]} -> {g[~ok][:6]}, onnx.reference {w[~ok][:6]}"


def test_packed_io_and_header(tmp_path):
  """int4 through the C API: two a byte, the first in the low nibble, sign-extended; the header names the format."""
  g = helper.make_graph(
    [helper.make_node("Identity", ["x"], ["y"])],
    "g",
    [helper.make_tensor_value_info("x", TensorProto.INT4, [3])],
    [helper.make_tensor_value_info("y", TensorProto.INT4, [3])],
  )
  art = compile_model(helper.make_model(g, opset_imports=[helper.make_opsetid("", 25)]), out_dir=tmp_path, name="m")
  x = np.array([-8, 7, -1]).astype(NARROW["int4"].np)
  y = load(art)(x)
  assert y.dtype == x.dtype and np.array_equal(y.astype(np.int8), [-8, 7, -1])
  assert np.array_equal(NARROW["int4"].to_storage(x), [0x78, 0x0F])
  header = art.header_path.read_text()
  assert "const uint8_t *x" in header and '"int4"' in header and "2 elements a byte" in header


def test_bf16_through_a_model_local_function(tmp_path):
  """A narrow argument of a model-local function keeps its type (it is traced inline, not as a FUNCTION)."""
  fn = helper.make_function(
    "local", "dbl", ["a"], ["b"], [helper.make_node("Add", ["a", "a"], ["b"])], [helper.make_opsetid("", 21)]
  )
  g = helper.make_graph(
    [helper.make_node("dbl", ["x"], ["y"], domain="local")],
    "g",
    [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [4])],
    [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [4])],
  )
  m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("local", 1)], functions=[fn])
  x = np.array([1.5, -2, 3.25, 100], NARROW["bfloat16"].np)
  got = load(compile_model(m, out_dir=tmp_path, name="m"))(x)
  np.testing.assert_array_equal(got.view(np.uint16), ReferenceEvaluator(m).run(None, {"x": x})[0].view(np.uint16))
