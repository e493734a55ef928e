"""The loop nest the codegen produces: placement of values, shared reduction loops of upcast lanes."""

import numpy as np
import pytest
from conftest import TARGETS

import aot
from aot import Tensor
from aot.codegen.render.linearize import flop_count, linearize
from aot.codegen.render.opt import optimize
from aot.compiler import resolve
from aot.core.dtype import dtypes
from aot.core.ir import Ops
from aot.scheduler.schedule import schedule


def kernels(fn, *xs):
  t = resolve(fn, list(xs))
  return schedule(t.outputs, t.inputs).kernels


def test_upcast_lanes_share_one_reduction_loop():
  x, w = np.zeros((4, 32), np.float32), np.ones((32, 64), np.float32)
  (k,) = kernels(lambda x: x @ Tensor(w), x)
  prog = linearize(optimize(k.ast))
  loops = [u.arg for kind, u in prog if kind == "loop"]
  # rows, then columns in blocks of 8, then one reduction loop over 32
  assert [(size, kind) for _, size, kind in loops] == [(4, "loop"), (8, "loop"), (32, "reduce")]
  assert sum(kind == "acc_update" for kind, _ in prog) == 8 and sum(kind == "store" for kind, _ in prog) == 8
  # the unrolled kernel does the same arithmetic: 2 flops per multiply-add
  assert flop_count(optimize(k.ast)) == flop_count(k.ast) == 2 * 4 * 64 * 32


def test_a_value_is_computed_in_the_loop_it_varies_in():
  # the row max of softmax is a reduction inside the row loop, before (not inside) the loop over the row's elements
  (_, k) = kernels(lambda x: x.softmax(-1), np.zeros((3, 16), np.float32))
  kinds = [
    (kind, u.arg[2] if kind == "loop" else None) for kind, u in linearize(k.ast) if kind in ("loop", "end", "acc_init")
  ]
  assert kinds[:2] == [("loop", "loop"), ("acc_init", None)]


def test_an_index_adds_the_innermost_loops_term_last():
  # each read's index is the outer loops' part, computed outside the innermost loop, plus that loop's term: summed the
  # other way round, clang-19 took the index for an or of bits and a row's reads for unrelated addresses (scalar loop)
  x, y = np.zeros((8, 6, 4), np.float32), np.zeros((4, 6, 8), np.float32)
  (k,) = kernels(lambda x, y: x + y.permute(2, 1, 0), x, y)
  prog = linearize(optimize(k.ast))
  inner = next(u for kind, u in reversed(prog) if kind == "loop")
  start = prog.index(("loop", inner))
  body = prog[start : prog.index(("end", inner), start)]
  adds = [u for kind, u in body if kind == "value" and u.op is Ops.ADD and u.dtype == dtypes.index]
  term = lambda s: s is inner or (s.op is Ops.MUL and inner in s.src)
  # x's (and the output's) index and y's, each one add of its invariant part and the inner term
  assert len(adds) == 2 and all(term(u.src[1]) and inner not in u.src[0].toposort() for u in adds)


def grouped_1x1_model(cin: int = 24, cout: int = 64, groups: int = 4, h: int = 10, w: int = 12):
  """A grouped 1x1 convolution with 6 input channels per group (ShuffleNet's first stage), batch norm and ReLU: a
  reduction too short for the microkernel (codegen/lower/contract.py's MIN_K), left to the generated loops."""
  from onnx import TensorProto, helper, numpy_helper

  rng = np.random.default_rng(0)
  c = lambda name, x: numpy_helper.from_array(np.asarray(x, np.float32), name)
  inits = [
    c("w", rng.normal(0, 0.3, (cout, cin // groups, 1, 1))),
    c("s", rng.uniform(0.5, 1.5, cout)),
    c("b", rng.normal(0, 0.1, cout)),
    c("mean", rng.normal(0, 0.1, cout)),
    c("var", rng.uniform(0.5, 1.5, cout)),
  ]
  nodes = [
    helper.make_node("Conv", ["x", "w"], ["y"], group=groups),
    helper.make_node("BatchNormalization", ["y", "s", "b", "mean", "var"], ["z"]),
    helper.make_node("Relu", ["z"], ["out"]),
  ]
  graph = helper.make_graph(
    nodes,
    "grouped",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, h, w])],
    [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
    inits,
  )
  return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_short_grouped_sum_runs_lanes_of_channels_over_the_whole_plane():
  # the plane's rows and columns are one loop (it vectorises without a remainder per row), and 4 output channels of
  # a group are lanes of one reduction loop, sharing each load of the group's input (2-3.7x faster,
  # codegen/render/opt.py)
  t = resolve(grouped_1x1_model())
  (k,) = schedule(t.outputs, t.inputs).kernels
  prog = linearize(optimize(k.ast))
  loops = [u.arg for kind, u in prog if kind == "loop"]
  # (64 channels in lanes of 4: 16 iterations left for the threads, SHARED_LANES_MIN_SPLIT)
  assert [(size, kind) for _, size, kind in loops] == [(16, "loop"), (120, "loop"), (6, "reduce")]
  start = next(i for i, (kind, u) in enumerate(prog) if kind == "loop" and u.arg[2] == "reduce")
  body = prog[start : next(i for i, (kind, u) in enumerate(prog) if kind == "end" and u is prog[start][1])]
  loads = [u for kind, u in body if kind == "value" and u.op.name == "LOAD"]
  # one input load for the 4 lanes, one weight load each
  assert sum(kind == "acc_update" for kind, _ in body) == 4 and len(loads) == 5
  assert flop_count(optimize(k.ast)) == flop_count(k.ast)


def test_a_short_grouped_sum_matches_onnxruntime(tmp_path):
  ort = __import__("pytest").importorskip("onnxruntime")
  model = grouped_1x1_model(h=9, w=13)
  x = np.random.default_rng(1).standard_normal((1, 24, 9, 13), dtype=np.float32)
  ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
  for target in ("c", "llvm"):
    loaded = aot.load(aot.compile_model(model, out_dir=tmp_path / target, target=target))
    try:
      np.testing.assert_allclose(loaded(x), ref, rtol=1e-4, atol=1e-5)
    finally:
      loaded.close()


def test_a_small_window_is_written_out_inside_the_output_loop():
  # a 3x3 max pool's 9 terms are combined in the loop over output columns (which the C and LLVM loop vectorisers
  # then run across), with no 9-step reduction loop inside it; a 7x7 window (49 terms) keeps its loop
  x = np.zeros((1, 3, 23, 23), np.float32)
  for window, reduce_loops in ((3, 0), (7, 2)):
    (k,) = kernels(lambda x: x.max_pool2d(window, 2), x)
    loops = [u.arg for kind, u in linearize(optimize(k.ast)) if kind == "loop"]
    assert sum(kind == "reduce" for _, _, kind in loops) == reduce_loops
    assert loops[-1 - reduce_loops][1] == (23 - window) // 2 + 1


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(
  "op, attrs", [("MaxPool", {}), ("AveragePool", {"count_include_pad": 0}), ("AveragePool", {"count_include_pad": 1})]
)
def test_pools_with_written_out_windows_match_onnxruntime(op, attrs, target, tmp_path):
  # odd sizes and padding: the edge columns' terms are gated, 1 and 2 threads bitwise equal
  from onnx import helper
  from test_contract import check_against_onnxruntime, onnx_graph

  node = helper.make_node(op, ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], **attrs)
  x = np.random.default_rng(3).standard_normal((1, 5, 13, 11)).astype(np.float32)
  check_against_onnxruntime(onnx_graph([node], {"x": x.shape}, {}), {"x": x}, tmp_path, target)


def test_a_kernel_reading_at_a_small_stride_indexes_in_64_bits():
  # a 3x3/2 pool written out reads every 2nd element along its innermost loop: 64-bit indices let the vectorisers
  # see one interleaved load per window row; a contiguous elementwise kernel keeps 32-bit ones
  from aot.codegen.render.linearize import widen_index
  from aot.core.dtype import dtypes

  x = np.zeros((1, 3, 23, 23), np.float32)
  (pool,) = kernels(lambda x: x.max_pool2d(3, 2), x)
  (relu,) = kernels(lambda x: x.relu(), x)
  wide = lambda k: any(u.dtype == dtypes.index64 for u in widen_index(optimize(k.ast)).toposort())
  assert wide(pool) and not wide(relu)


def test_an_edge_gated_loop_runs_in_pieces_with_constant_gates():
  # a 3x3/1 average pool padded by 1: the column loop is cut where its gates change (c >= 1, c + 1 < 17), so the
  # interior piece's loads are plain ones, and so is the row loop around it (in_pieces), the columns' pieces inside
  # each row piece; a kernel with sums is left whole
  from aot.codegen.render.c import CRenderer
  from aot.codegen.render.linearize import loop_pieces

  x = np.zeros((1, 3, 17, 17), np.float32)
  (pool,) = kernels(lambda x: x.avg_pool2d(3, 1, padding=1), x)
  ast = optimize(pool.ast)
  rows, inner = [u for kind, u in linearize(ast) if kind == "loop"][-2:]
  bounds = lambda r: [(p.lo, p.hi) for p in loop_pieces(ast, r)]
  assert bounds(inner) == bounds(rows) == [(0, 1), (1, 16), (16, 17)]
  src = CRenderer().render_kernel("k", ast)
  starts = lambda r: [
    line.strip().split("=")[1].split(";")[0]
    for line in src.splitlines()
    if line.strip().startswith(f"for (int r{r.number} ")
  ]
  assert starts(rows) == [" 0", " 1", " 16"] and starts(inner) == [" 0", " 1", " 16"] * 3
  # a 5x5 window keeps its sum loops: its column loop, as gated, stays one loop
  (big,) = kernels(lambda x: x.avg_pool2d(5, 1, padding=2), x)
  ast = optimize(big.ast)
  columns = [u for kind, u in linearize(ast) if kind == "loop" and u.kind == "loop"][-1]
  assert columns.size == 17 and [(p.lo, p.hi) for p in loop_pieces(ast, columns)] == [(0, 17)]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("op, attrs", [("AveragePool", {"count_include_pad": 0}), ("MaxPool", {"ceil_mode": 1})])
def test_pools_run_in_pieces_match_onnxruntime(op, attrs, target, tmp_path):
  # a 3x3/1 window padded by 1 (three pieces), or a ceil-mode 3x3/2 one (its right edge gated: two), 1 and 2 threads
  # bitwise equal
  from onnx import helper
  from test_contract import check_against_onnxruntime, onnx_graph

  shape = (
    dict(kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])
    if op == "AveragePool"
    else dict(kernel_shape=[3, 3], strides=[2, 2])
  )
  node = helper.make_node(op, ["x"], ["y"], **shape, **attrs)
  x = np.random.default_rng(4).standard_normal((1, 4, 14, 19)).astype(np.float32)
  check_against_onnxruntime(onnx_graph([node], {"x": x.shape}, {}), {"x": x}, tmp_path, target)


def conv_packs(model) -> list:
  """The optimised kernels that pack a conv's window matrix a panel at a time (codegen/lower/columns.py's
  panel_operand)."""
  from aot.artifact import WeightsWriter
  from aot.codegen.lower.contract import gemm_tile
  from aot.codegen.lower.stage import lower_schedule

  t = resolve(model)
  sched = schedule(t.outputs, t.inputs, t.output_names)
  low = lower_schedule("m", sched, gemm_tile("native", None), WeightsWriter(None), "c")
  return [optimize(g.b.pack) for x in low.lowered for g in getattr(x, "gemms", []) if g.b.pack is not None]


# (kernel, stride, pads, input size): the padded windows of ResNet's and Inception's convs, over an input whose window
# matrix is packed in panels (a 3x3/2 one over 40x40 is small enough to be copied whole)
PADDED_CONVS = [
  ((3, 3), 1, [1, 1, 1, 1], 40),
  ((7, 7), 2, [3, 3, 3, 3], 40),
  ((3, 3), 2, [1, 1, 1, 1], 64),
  ((5, 5), 1, [2, 2, 2, 2], 40),
  ((1, 7), 1, [0, 3, 0, 3], 40),
  ((7, 1), 1, [3, 0, 3, 0], 40),
]


@pytest.mark.usefixtures("taps_copy")
@pytest.mark.parametrize("kernel, stride, pads, size", PADDED_CONVS)
def test_a_padded_conv_pack_runs_its_rows_in_pieces_bounded_by_the_taps(kernel, stride, pads, size, tmp_path):
  # the pack's gate on an input column, ow*stride + kw - pad >= 0 (and < W + pad), changes where the tap kw says: the
  # column loop runs in pieces bounded by kw (max(0, ceil((pad - kw) / stride)), ...), in each of which every such
  # gate is its value, so the interior copies plain rows; so does the row loop around it, by the row taps. Results
  # match onnxruntime on both CPU targets, 1 and 2 threads bitwise equal
  from onnx import helper
  from test_contract import check_against_onnxruntime, onnx_graph

  from aot.codegen.render.linearize import in_pieces, widen_index
  from aot.core.ir import ranges_of

  rng = np.random.default_rng(6)
  w = rng.standard_normal((16, 8, *kernel)).astype(np.float32)
  node = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=list(kernel), strides=[stride] * 2, pads=pads)
  x = rng.standard_normal((1, 8, size, size)).astype(np.float32)
  model = onnx_graph([node], {"x": x.shape}, {"w": w})
  (pack,) = conv_packs(model)
  ast = widen_index(pack)
  program = in_pieces(ast, linearize(ast))
  rows, columns = [u for kind, u, _, _ in program if kind == "loop"][-2:]
  # the loop the padding gates: the columns, or the rows of a 7x1 window
  gated = columns if kernel[1] > 1 else rows
  pieces = [p for kind, u, p, _ in program if kind == "loop" and u is gated]
  assert len(pieces) > 1 and any(p.varies for p in pieces)
  # no comparison along the gated loop is computed in it: each piece knows its value
  compared = [
    (u, known) for kind, u, _, known in program if kind == "value" and u.op is Ops.CMPLT and gated in ranges_of(u)
  ]
  assert compared and all(u in known for u, known in compared)
  for target in TARGETS:
    check_against_onnxruntime(model, {"x": x}, tmp_path, target)


def test_a_narrow_maps_pack_runs_its_rows_in_pieces(tmp_path):
  # a 14x14 map's 14-column rows are shorter than a vector but still cut in pieces by the taps (RegNetX's 3x3 grouped
  # convs, 16 channels a group: every element was a gated load, 0.188 -> 0.107 ms a conv); results match onnxruntime
  from onnx import helper
  from test_contract import check_against_onnxruntime, onnx_graph

  from aot.codegen.render.linearize import in_pieces, widen_index

  rng = np.random.default_rng(7)
  w = rng.standard_normal((160, 16, 3, 3)).astype(np.float32)
  node = helper.make_node("Conv", ["x", "w"], ["y"], group=10, pads=[1, 1, 1, 1])
  x = rng.standard_normal((1, 160, 14, 14)).astype(np.float32)
  model = onnx_graph([node], {"x": x.shape}, {"w": w})
  (pack,) = conv_packs(model)
  ast = widen_index(pack)
  program = in_pieces(ast, linearize(ast))
  columns = [u for kind, u, _, _ in program if kind == "loop"][-1]
  assert columns.size == 14 and len([u for kind, u, _, _ in program if kind == "loop" and u is columns]) > 1
  for target in TARGETS:
    check_against_onnxruntime(model, {"x": x}, tmp_path, target)


@pytest.mark.usefixtures("taps_copy")
@pytest.mark.parametrize("target", TARGETS)
def test_a_panel_pack_masks_its_rows_tail(target, tmp_path):
  # a 3x3 conv over 8x40x40 packs B in panels of 4 rows of 40: in C, the 40-wide row's interior (38 to 40 long, its
  # padding cut off: in_pieces) runs its last columns as a masked vector iteration (AOT_TAIL_MASKED; clang ran them
  # as scalar gated loads), the padding's pieces (0 or 1 long) and the loops around them as they are
  from onnx import helper
  from test_contract import check_against_onnxruntime, onnx_graph

  rng = np.random.default_rng(5)
  w = rng.standard_normal((16, 8, 3, 3)).astype(np.float32)
  node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])
  x = rng.standard_normal((1, 8, 40, 40)).astype(np.float32)
  model = onnx_graph([node], {"x": x.shape}, {"w": w})
  check_against_onnxruntime(model, {"x": x}, tmp_path, target)
  if target != "c":
    return
  from aot.compiler import render

  t = resolve(model)
  files = render("m", schedule(t.outputs, t.inputs, t.output_names), "c").files
  src = "\n".join(text for f, text in files.items() if f.endswith(".c"))
  pack = next(
    src[i : src.index("\n}\n", i)]
    for i in (src.index(line) for line in src.splitlines() if "_pack0b(" in line and line.endswith("{"))
  ).splitlines()
  loops = [i for i, line in enumerate(pack) if line.strip().startswith("for (")]
  masked = [i for i in loops if pack[i - 1].strip() == "AOT_TAIL_MASKED"]
  # the panel loop (the threads'), then channels, 3 taps, 3 taps, 4 rows in 3 pieces (padding above, interior,
  # below), in each the 40-wide row in 3 pieces
  columns = [i for i in loops if " r5 = " in pack[i]]
  assert len(loops) == 4 + 3 + 9 and len(columns) == 9 and masked == columns[1::3]


def test_an_epilogue_in_place_keeps_its_rows_tail_unmasked():
  # a conv's bias + ReLU over its 40-wide rows, applied in place (the kernel reads the buffer it writes): masked, its
  # loop ran 2.5-4x slower under clang, so only the pack (which writes a panel of its own) masks its tail
  import re

  from onnx import helper
  from test_contract import onnx_graph

  from aot.compiler import render

  rng = np.random.default_rng(5)
  w, b = rng.standard_normal((16, 8, 3, 3)).astype(np.float32), rng.standard_normal(16).astype(np.float32)
  nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])]
  t = resolve(onnx_graph(nodes, {"x": (1, 8, 40, 40)}, {"w": w, "b": b}))
  files = render("m", schedule(t.outputs, t.inputs, t.output_names), "c").files
  src = "\n".join(text for f, text in files.items() if f.endswith(".c"))
  bodies = [src[m.start() : src.index("\n}\n", m.start())] for m in re.finditer(r"void m_f\w*\([^)]*\) {", src)]
  in_place = [body for body in bodies if re.search(r"= d0\[", body)]
  packs = [body for body in bodies if "_pack" in body.splitlines()[0]]
  assert in_place and packs
  assert all("AOT_TAIL_MASKED" not in body for body in in_place)
  assert all("AOT_TAIL_MASKED" in body for body in packs)
