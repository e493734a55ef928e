"""NaN-propagating max/min: pools written out and long reductions run in blocks (codegen/render/opt.py maxmin_blocks)
keep the sequential order's result bit for bit: a NaN wins (the last one in order, with its payload), otherwise the
extreme, a tie of -0 and +0 going to the zero that comes first (onnxruntime's vectorised max/min take either)."""

import numpy as np
import pytest
from onnx import TensorProto, helper

import aot
from aot.codegen.render.c import CRenderer
from aot.codegen.render.linearize import linearize
from aot.codegen.render.opt import MAXMIN_BLOCKS, WIDE_SUM_BLOCK, optimize
from aot.compiler import resolve
from aot.scheduler.schedule import schedule

MAXMIN_BLOCK = MAXMIN_BLOCKS[0]


def kernels(fn, *xs):
  t = resolve(fn, list(xs))
  return schedule(t.outputs, t.inputs).kernels


def test_a_long_max_min_is_combined_in_blocks_of_neighbours():
  # one value from 4x256: the reduction's innermost loop runs over blocks of MAXMIN_BLOCK, whose loads are combined
  # in one update; a long sum too, in float64 (codegen/render/opt.py wide_sums); a max too short to pay keeps its loop
  x = np.zeros((4, 256), np.float32)
  blocks = ((lambda x: x.max(), MAXMIN_BLOCK), (lambda x: x.min(), MAXMIN_BLOCK), (lambda x: x.sum(), WIDE_SUM_BLOCK))
  for fn, block in blocks:
    (k,) = kernels(fn, x)
    prog = linearize(optimize(k.ast))
    loops = [u.arg for kind, u in prog if kind == "loop"]
    assert [(size, kind) for _, size, kind in loops] == [(4, "reduce"), (256 // block, "reduce")]
    assert sum(kind == "value" and u.op.name == "LOAD" for kind, u in prog) == block
  (k,) = kernels(lambda x: x.max(), np.zeros((4, 16), np.float32))
  assert [u.arg[1] for kind, u in linearize(optimize(k.ast)) if kind == "loop"] == [4, 16]
  # 1000 terms: blocks of 8, which divide them
  (k,) = kernels(lambda x: x.max(), np.zeros((1, 1000), np.float32))
  assert [u.arg[1] for kind, u in linearize(optimize(k.ast)) if kind == "loop"][-1] == 1000 // MAXMIN_BLOCKS[1]
  # a min computed once for a kernel of many outputs (x less its min; DynamicQuantizeLinear's zero point) runs in
  # blocks too, the output loop still upcast in lanes of 8
  (k,) = kernels(lambda x: x - x.min(), np.zeros((64, 256), np.float32))
  loops = [u.arg[1:] for kind, u in linearize(optimize(k.ast)) if kind == "loop"]
  assert loops == [(64, "reduce"), (256 // MAXMIN_BLOCK, "reduce"), (64, "loop"), (256 // 8, "loop")]


def test_softmax_row_max_runs_in_blocks_once_per_row():
  # softmax over rows of 128: each row's max, read by all of the row's lanes, runs over blocks once per row; its
  # sum of the stored exponentials in float64 over blocks of WIDE_SUM_BLOCK
  x = np.zeros((4, 32, 128), np.float32)
  first, second = (linearize(optimize(k.ast)) for k in kernels(lambda x: x.softmax(-1), x))
  loops = lambda prog: [u.arg[1:] for kind, u in prog if kind == "loop"]
  assert loops(first) == [(4, "loop"), (32, "loop"), (128 // MAXMIN_BLOCK, "reduce"), (128 // 8, "loop")]
  assert (128 // WIDE_SUM_BLOCK, "reduce") in loops(second)
  # many rows each read by their own output (a ReduceMax over the last axis): the rows are upcast's lanes already
  (k,) = kernels(lambda x: x.max(-1), x)
  assert (128, "reduce") in loops(linearize(optimize(k.ast)))


def test_a_strided_pool_keeps_its_rows_tail_unmasked():
  # a 3x3/2 max pool with 31-wide output rows reads every 2nd column: its tail is not a masked vector iteration
  # (clang ran the masked form's interleaved loads as one scalar load per element, 2.6x slower), while a 3x3/1
  # pool's 63-wide rows (contiguous reads) keep it
  x = np.zeros((1, 4, 40, 63), np.float32)
  for stride, masked in ((2, 0), (1, 1)):
    (k,) = kernels(lambda x: x.max_pool2d(3, stride), x)
    src = CRenderer().render_kernel("pool", optimize(k.ast))
    assert src.count("AOT_TAIL_MASKED") == masked, src


def _specials(rng, shape, kind: str) -> np.ndarray:
  """Normal values with zeros of both signs, infinities and, for kind "nan", NaNs of distinct payloads and signs;
  for "max_ties"/"min_ties" all values on one side of zero, so that the extreme is a tie of -0 and +0."""
  x = rng.standard_normal(shape).astype(np.float32)
  if kind == "max_ties":
    x = -np.abs(x)
  if kind == "min_ties":
    x = np.abs(x)
  flat = x.reshape(-1)
  n = flat.size
  flat[rng.choice(n, n // 8, replace=False)] = 0.0
  flat[rng.choice(n, n // 8, replace=False)] = -0.0
  if kind == "nan":
    flat[rng.choice(n, 8, replace=False)] = np.inf
    flat[rng.choice(n, 8, replace=False)] = -np.inf
    bits = flat.view(np.uint32)
    at = rng.choice(n, 12, replace=False)
    bits[at] = np.array([0x7FC00000 + 7 * i if i % 2 else 0xFFC00000 + 5 * i for i in range(12)], np.uint32)
  return x


def _sequential(terms: np.ndarray, is_max: bool) -> np.ndarray:
  """The sequential result over the last axis, not as a fold: the last NaN if there is one, else the first term
  equal to the extreme."""
  nan = np.isnan(terms)
  k = terms.shape[-1]
  last_nan = k - 1 - np.argmax(nan[..., ::-1], axis=-1)
  clean = np.where(nan, -np.inf if is_max else np.inf, terms)
  extreme = clean.max(-1) if is_max else clean.min(-1)
  first = np.argmax(clean == extreme[..., None], axis=-1)
  at = np.where(nan.any(-1), last_nan, first)
  return np.take_along_axis(terms, at[..., None], -1)[..., 0]


def _windows(x: np.ndarray, stride: int, pad: int) -> np.ndarray:
  """A 3x3 pool's windows, [N, C, H', W', 9] in row-major order; padding reads -inf."""
  x = np.pad(x, [(0, 0), (0, 0), (pad, pad), (pad, pad)], constant_values=-np.inf)
  w = np.lib.stride_tricks.sliding_window_view(x, (3, 3), axis=(2, 3))[:, :, ::stride, ::stride]
  return w.reshape(*w.shape[:4], 9)


A, B, C = (1, 4, 40, 63), (3, 40, 64), (2, 24, 128)
OUTPUTS = ("pool2", "pool1", "max", "min", "rowmax", "centred", "shifted")


def _model():
  f = TensorProto.FLOAT
  nodes = [
    helper.make_node("MaxPool", ["a"], ["pool2"], kernel_shape=[3, 3], strides=[2, 2]),
    helper.make_node("MaxPool", ["a"], ["pool1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
    helper.make_node("ReduceMax", ["b"], ["max"], keepdims=0),
    helper.make_node("ReduceMin", ["b"], ["min"], keepdims=0),
    # a few values, each from a long reduction
    helper.make_node("ReduceMax", ["b", "axes"], ["rowmax"], keepdims=0),
    # many values, all reading one long reduction
    helper.make_node("ReduceMin", ["b"], ["bmin"], keepdims=1),
    helper.make_node("Sub", ["b", "bmin"], ["centred"]),
    # softmax's first step: each row less its max, the max computed once per row for the row's lanes
    helper.make_node("ReduceMax", ["c", "last"], ["cmax"], keepdims=1),
    helper.make_node("Sub", ["c", "cmax"], ["shifted"]),
  ]
  graph = helper.make_graph(
    nodes,
    "g",
    [helper.make_tensor_value_info(n, f, shape) for n, shape in (("a", A), ("b", B), ("c", C))],
    [helper.make_tensor_value_info(n, f, None) for n in OUTPUTS],
    [
      helper.make_tensor("axes", TensorProto.INT64, [2], [1, 2]),
      helper.make_tensor("last", TensorProto.INT64, [1], [-1]),
    ],
  )
  return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _same_bits(got, want) -> bool:
  got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
  return got.shape == want.shape and np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("build", ["c:clang-19", "c:gcc", "c:clang-14", "llvm"])
def test_max_min_keep_the_sequential_result_bit_for_bit(build, tmp_path, monkeypatch):
  import onnxruntime as ort
  from test_compilers import need

  target, _, compiler = build.partition(":")
  if compiler:
    need(compiler)
    monkeypatch.setenv("CC", compiler)
  model = _model()
  art = aot.compile_model(model, out_dir=tmp_path, target=target, name="m")
  sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
  runs = [aot.load(art, threads=n) for n in (1, 2, 3)]
  rng = np.random.default_rng(11)
  try:
    for kind in ("max_ties", "min_ties", "nan"):
      a = _specials(rng, A, "max_ties" if kind == "min_ties" else kind)
      b = _specials(rng, B, kind)
      c = _specials(rng, C, "max_ties" if kind == "min_ties" else kind)
      outs = [r(a, b, c) for r in runs]
      for out in outs[1:]:
        assert all(_same_bits(x, y) for x, y in zip(outs[0], out)), f"{kind}: threads differ"
      with np.errstate(invalid="ignore"):  # inf - inf in a row whose max is inf
        shifted = c - _sequential(c, True)[..., None]
      want = {
        "pool2": _sequential(_windows(a, 2, 0), True),
        "pool1": _sequential(_windows(a, 1, 1), True),
        "max": _sequential(b.reshape(-1), True),
        "min": _sequential(b.reshape(-1), False),
        "rowmax": _sequential(b.reshape(3, -1), True),
        "centred": b - _sequential(b.reshape(-1), False),
        "shifted": shifted,
      }
      got = dict(zip(OUTPUTS, outs[0]))
      for name in want:
        assert _same_bits(got[name], want[name]), f"{kind}: {name}"
      if kind != "nan":
        # onnxruntime's max/min skip a NaN past the first term, and its vectorised ones take either zero of a tie:
        # without NaNs the values are the same
        for name, ref in zip(OUTPUTS, sess.run(None, {"a": a, "b": b, "c": c})):
          assert np.array_equal(got[name], ref), f"{kind}: {name} against onnxruntime"
  finally:
    for r in runs:
      r.close()
