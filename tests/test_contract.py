"""Contractions on the runtime's microkernel (codegen/lower/contract.py, runtime_c/aot_gemm.c): every operand form
(packed constant, strided view, dense copy), edges that fill no whole tile, batches, swapped operands, epilogues in
place and through a scratch matrix, against numpy in float64. Each artifact runs on inputs other than those it was
compiled with, on 1, 2 and 3 threads, bitwise the same, compiled to split every kernel across the pool
(split_every_kernel in conftest.py): odd extents, so a split that lost its remainder rows would show."""

import numpy as np
import pytest
from conftest import TARGETS, fresh_like, outputs_on_threads, run_body

import aot
from aot.frontends.tensor import Tensor

rng = np.random.default_rng(0)
f32 = lambda *shape: rng.standard_normal(shape, dtype=np.float32)


def compiled(fn, xs, tmp_path, target, **kw):
  """(outputs, the inputs they were computed from, the number of microkernel calls in the artifact's model.c, its
  kernel count). Compiled with xs, run on fresh inputs of their shapes on 1, 2 and 3 threads (bitwise equal)."""
  art = aot.compile_model(fn, xs, out_dir=tmp_path / target, target=target, **kw)
  fresh = [fresh_like(x, 100 + i) for i, x in enumerate(xs)]
  outs = outputs_on_threads(art, dict(enumerate(fresh)), (1, 2, 3))
  for n, out in zip((2, 3), outs[1:]):
    np.testing.assert_array_equal(out, outs[0], err_msg=f"{n} threads differ from 1")
  return outs[0], fresh, (art.dir / "src" / "model.c").read_text().count("aot_gemm g ="), art.num_kernels


def conv_ref(x, w, stride=1, padding=0):
  x, w = x.astype(np.float64), w.astype(np.float64)
  x = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
  win = np.lib.stride_tricks.sliding_window_view(x, w.shape[2:], axis=(2, 3))[:, :, ::stride, ::stride]
  return np.einsum("nchwij,ocij->nohw", win, w)


def close(out, ref):
  np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


W_CONST, W1, W2 = f32(100, 77), f32(96, 64, 3, 3), f32(96, 32, 1, 1)
CASES = {
  # name: (program, inputs, numpy reference, microkernel calls)
  "runtime operands, odd sizes": (
    lambda a, b: a @ b,
    [f32(37, 71), f32(71, 45)],
    lambda a, b: a.astype(np.float64) @ b,
    1,
  ),
  "constant B packed ahead": (
    lambda a: (a @ Tensor(W_CONST)).relu(),
    [f32(33, 100)],
    lambda a: np.maximum(a.astype(np.float64) @ W_CONST, 0),
    1,
  ),
  "constant transposed (linear)": (
    lambda a: a.linear(Tensor(W_CONST.T.copy())),
    [f32(21, 100)],
    lambda a: a.astype(np.float64) @ W_CONST,
    1,
  ),
  "runtime B read across its lanes (dense copy)": (
    lambda a, b: a @ b.transpose(-2, -1),
    [f32(40, 64), f32(50, 64)],
    lambda a, b: a.astype(np.float64) @ b.T,
    1,
  ),
  "batched, odd M, N, K": (
    lambda a, b: a @ b,
    [f32(3, 21, 63), f32(3, 63, 41)],
    lambda a, b: a.astype(np.float64) @ b,
    1,
  ),
  "conv 3x3 padded (im2col), bias and relu in place": (
    lambda x: x.conv2d(Tensor(W1), Tensor(np.arange(96, dtype=np.float32)), padding=1).relu(),
    [f32(2, 64, 13, 11)],
    lambda x: np.maximum(conv_ref(x, W1, padding=1) + np.arange(96).reshape(1, -1, 1, 1), 0),
    1,
  ),
  "conv 1x1 stride 2": (
    lambda x: x.conv2d(Tensor(W2), stride=2),
    [f32(1, 32, 15, 15)],
    lambda x: conv_ref(x, W2, 2),
    1,
  ),
  "conv then global average pool (result through scratch)": (
    lambda x: x.conv2d(Tensor(W1), padding=1).relu().mean((2, 3)),
    [f32(1, 64, 9, 9)],
    lambda x: np.maximum(conv_ref(x, W1, padding=1), 0).mean((2, 3)),
    1,
  ),
  "two contractions in one kernel (a block's residual conv)": (
    lambda x, y: (x.conv2d(Tensor(W1), padding=1) + y.conv2d(Tensor(W2))).relu(),
    [f32(1, 64, 10, 10), f32(1, 32, 10, 10)],
    lambda x, y: np.maximum(conv_ref(x, W1, padding=1) + conv_ref(y, W2), 0),
    2,
  ),
}


@pytest.fixture
def whole_kernels(monkeypatch):
  """No arena goal: a one-layer model's window matrix is many times its only tensors, and the goal would cut its
  kernel into pieces (codegen/lower/pieces.py); the tests using this check the whole kernel's calls."""
  from aot.codegen.lower import stage

  monkeypatch.setattr(stage, "ARENA_GOAL", 1 << 20)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_contraction_matches_numpy(case, target, tmp_path, split_every_kernel, whole_kernels):
  fn, xs, ref, calls = CASES[case]
  out, fresh, gemms, kernels = compiled(fn, xs, tmp_path, target)
  close(out, ref(*fresh))
  assert gemms == calls, f"{gemms} microkernel calls, expected {calls}"


_X7 = f32(1, 128, 7, 7)


@pytest.mark.parametrize("target", TARGETS)
def test_small_images_swap_operands(target, tmp_path, split_every_kernel, whole_kernels):
  # 7x7 = 49 positions fill two 32-lane tiles to 77%; 128 channels fill them whole, and K = 1152 pays for the swap
  w = f32(128, 128, 3, 3)
  out, (x,), gemms, kernels = compiled(lambda x: x.conv2d(Tensor(w), padding=1).relu(), [_X7], tmp_path, target)
  close(out, np.maximum(conv_ref(x, w, padding=1), 0))
  # swapped: the weights are B (32-lane tiles of output channels), so C is a scratch matrix and not the output
  model_c = (tmp_path / target / "src" / "model.c").read_text()
  assert gemms == 1 and kernels == 1 and "49, 128, 1152, 8, 32" in model_c


@pytest.mark.parametrize("target", TARGETS)
def test_avx2_tiles(target, tmp_path, split_every_kernel):
  # a CPU without 16-float vectors gets the 6x16 microkernel; it runs here too (AVX-512 machines run AVX2 code)
  fn, xs, ref, calls = CASES["conv 3x3 padded (im2col), bias and relu in place"]
  out, fresh, gemms, _ = compiled(fn, xs, tmp_path, target, cpu="x86-64-v3")
  close(out, ref(*fresh))
  assert "6, 16" in (tmp_path / target / "src" / "model.c").read_text()


@pytest.mark.parametrize("n", [41, 48, 49, 169])
def test_narrow_edge_tiles(n, tmp_path, split_every_kernel):
  # a last column tile of at most 16 lanes runs the 8x16 microkernel (169 = 5 x 32 + 9, a 13x13 image), one of 17
  # the full 8x32 one: the same sums either way, read in place (a runtime B) or from a packed constant
  w, wb = f32(50, 64), f32(64, n)
  fn = lambda x, y: ((x @ Tensor(w)).relu() @ Tensor(wb)) + (x @ y)
  out, (x, y), gemms, _ = compiled(fn, [f32(37, 50), f32(50, n)], tmp_path, "c", cpu="x86-64-v4")
  x64 = x.astype(np.float64)
  close(out, np.maximum(x64 @ w, 0) @ wb + x64 @ y)
  assert gemms == 3


W_LONG, ROW_BIAS = f32(37, 1100), f32(37, 1)


@pytest.mark.parametrize("in_arena", [False, True])
def test_edge_tiles_are_stored_in_place_of_c_over_k_slices_and_epilogues(in_arena, tmp_path, split_every_kernel):
  # an edge tile (37 = 4 x 8 + 5 rows, 49 = 32 + 17 and 16 + 1 columns) is computed whole and only its part inside C
  # stored, over two slices of K = 1100 (the second adds to what the first stored), with a per-row bias (applied in
  # the registers on column edges) and a residual (a per-column operand: applied after the store on edges)
  def fn(x, r):
    x = x.sigmoid().contiguous() if in_arena else x
    return ((Tensor(W_LONG) @ x) + Tensor(ROW_BIAS) + r).relu()

  out, (x, r), gemms, _ = compiled(fn, [f32(1100, 49), f32(37, 49)], tmp_path, "c", cpu="x86-64-v4")
  x64 = 1 / (1 + np.exp(-x.astype(np.float64))) if in_arena else x.astype(np.float64)
  close(out, np.maximum(W_LONG.astype(np.float64) @ x64 + ROW_BIAS + r, 0))
  assert gemms == 1


W_EDGE = f32(72, 64)


def arena_b_product(x):
  """A constant A times a B the arena holds (a stored activation, as a 1x1 convolution's input), relu'd."""
  return (Tensor(W_EDGE) @ x.sigmoid().contiguous()).relu()


@pytest.mark.parametrize("n", [49, 17, 196])
def test_an_arena_b_is_read_in_whole_tiles_past_its_last_column(n, tmp_path, split_every_kernel):
  # a B in the arena is read a whole tile at a time past its last column (the next k's columns, and past the last
  # k the arena's slack), its edge tile not copied for every task: 7x7 maps' 1x1 convs (RegNet, MobileNetV2) ran
  # 49 columns slower than 64 (400x49x400: 132 -> 148 GFLOP/s); the model's input, memory the caller owns, is not
  out, (x,), gemms, _ = compiled(arena_b_product, [f32(64, n)], tmp_path, "c")
  sig = 1 / (1 + np.exp(-x.astype(np.float64)))
  close(out, np.maximum(W_EDGE.astype(np.float64) @ sig, 0))
  src = (tmp_path / "c" / "src" / "model.c").read_text()
  # the B operand's descriptor: {pointer, batch, tile, row, k, padded}
  assert gemms == 1 and f", 32, 1, {n}, 1}}, " in src, src
  _, _, _, _ = compiled(lambda x: (Tensor(W_EDGE) @ x).relu(), [f32(64, n)], tmp_path / "input", "c")
  assert f", 32, 1, {n}, 0}}, " in (tmp_path / "input" / "c" / "src" / "model.c").read_text()


def test_bare_product_runs_no_epilogue(tmp_path):
  # the microkernel writes a bare matmul's result in place: reading it back and storing it again would be a wasted pass
  a, b = f32(64, 96), f32(96, 80)

  def compile_run_body(fn, d):
    art = aot.compile_model(fn, [a], out_dir=tmp_path / d, target="c", name="m")
    return art, run_body((art.dir / "src" / "model.c").read_text())

  art, body = compile_run_body(lambda p: p @ Tensor(b), "bare")
  assert "m_f0(" not in body and "aot_gemm_run" in body
  fresh = fresh_like(a, 1)
  close(aot.load(art)(fresh), fresh.astype(np.float64) @ b)
  # a ReLU is applied to each finished tile by the microkernel (a fused epilogue step), not by a pass of its own
  art, body = compile_run_body(lambda p: (p @ Tensor(b)).relu(), "relu")
  assert "m_f0(" not in body and ".nsteps = 1" in body
  close(aot.load(art)(fresh), np.maximum(fresh.astype(np.float64) @ b, 0))
  # an epilogue that is no chain of steps still runs as a kernel
  art, body = compile_run_body(lambda p: (p @ Tensor(b)).exp(), "exp")
  assert "m_f0(" in body and ".nsteps" not in body
  close(aot.load(art)(fresh), np.exp(fresh.astype(np.float64) @ b))


# *** concatenated and grouped contractions: each branch and each group is its own contraction, no work on zeros ***


def planned(model) -> tuple[list[tuple[int, int, int, int]], int]:
  """((batch, M, N, K) of each microkernel call the compiler plans, accumulators left to the generated loops)."""
  from aot.codegen.lower.contract import lower_contractions
  from aot.compiler import resolve
  from aot.core.dtype import dtypes
  from aot.core.ir import Ops
  from aot.scheduler.kernel import Buffer
  from aot.scheduler.schedule import schedule

  traced = resolve(model)
  shapes, left = [], 0

  def make(kind, x):
    return Buffer(kind, dtypes.float32, x.size, data=x) if kind == "const" else Buffer(kind, dtypes.float32, x)

  for k in schedule(traced.outputs, traced.inputs).kernels:
    last, _, gemms = lower_contractions(k.ast, k.bufs, (8, 32), make)
    shapes += [(g.c.B, g.c.a.size, g.c.b.size, g.c.K) for g in gemms]
    left += sum(u.op is Ops.ACCUMULATE for u in last.toposort())
  return shapes, left


def onnx_graph(nodes, inputs: dict[str, tuple], weights: dict[str, np.ndarray]):
  from onnx import TensorProto, helper, numpy_helper

  g = helper.make_graph(
    nodes,
    "g",
    [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    [numpy_helper.from_array(w, n) for n, w in weights.items()],
  )
  return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def check_against_onnxruntime(model, xs: dict[str, np.ndarray], tmp_path, target: str) -> dict:
  """Compile, run at 1 and 2 threads (bitwise equal), compare with onnxruntime; the artifact's manifest."""
  import json

  import onnxruntime as ort

  art = aot.compile_model(model, out_dir=tmp_path / target, target=target, name="m")
  want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, xs)[0]
  outs = outputs_on_threads(art, xs, (1, 2))
  close(outs[0], want)
  assert np.array_equal(outs[0], outs[1])
  return json.loads((art.dir / "m.json").read_text())


def conv_macs(cout, cin_per_group, kernel, out_hw) -> int:
  return cout * cin_per_group * kernel * kernel * out_hw


@pytest.mark.parametrize("target", TARGETS)
def test_concat_of_convs_runs_each_branch_on_its_slice(target, tmp_path):
  # a fire module's expand layer: Concat(Relu(1x1 conv), Relu(3x3 conv)) then an epilogue after the concat; the
  # concat's gate used to make the channel a batch axis of M = 1, computing each branch for all channels
  from onnx import helper

  w = {"w1": f32(24, 16, 1, 1), "b1": f32(24), "w2": f32(48, 16, 3, 3), "b2": f32(48)}
  nodes = [
    helper.make_node("Conv", ["x", "w1", "b1"], ["c1"]),
    helper.make_node("Relu", ["c1"], ["r1"]),
    helper.make_node("Conv", ["x", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
    helper.make_node("Concat", ["r1", "c2"], ["cat"], axis=1),
    helper.make_node("Relu", ["cat"], ["y"]),
  ]
  model = onnx_graph(nodes, {"x": (1, 16, 16, 16)}, w)
  shapes, left = planned(model)
  # each branch is one call with M = its own channels, and the multiply-adds are the model's
  assert sorted(shapes) == sorted([(1, 24, 256, 16), (1, 48, 256, 144)]) and left == 0
  assert sum(b * m * n * k for b, m, n, k in shapes) == conv_macs(24, 16, 1, 256) + conv_macs(48, 16, 3, 256)
  manifest = check_against_onnxruntime(model, {"x": f32(1, 16, 16, 16)}, tmp_path, target)
  # the weights packed once (M = 24 and 48 fill whole tiles), no per-channel copies of the im2col matrix
  assert manifest["weights_bytes"] <= 1.2 * sum(a.nbytes for a in w.values())
  assert manifest["arena_bytes"] <= 2 * 144 * 256 * 4


@pytest.mark.parametrize("target", TARGETS)
def test_concat_of_matmuls_runs_each_branch_on_its_slice(target, tmp_path):
  from onnx import helper

  w = {"m1": f32(64, 64), "m2": f32(64, 96)}
  nodes = [
    helper.make_node("MatMul", ["a", "m1"], ["p1"]),
    helper.make_node("MatMul", ["a", "m2"], ["p2"]),
    helper.make_node("Relu", ["p2"], ["r2"]),
    helper.make_node("Concat", ["p1", "r2"], ["y"], axis=1),
  ]
  model = onnx_graph(nodes, {"a": (48, 64)}, w)
  shapes, left = planned(model)
  assert sorted(shapes) == [(1, 48, 64, 64), (1, 48, 96, 64)] and left == 0
  manifest = check_against_onnxruntime(model, {"a": f32(48, 64)}, tmp_path, target)
  assert manifest["weights_bytes"] <= 1.2 * sum(a.nbytes for a in w.values())


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("groups", [2, 4])
def test_grouped_conv_is_a_batch_over_groups(groups, target, tmp_path):
  # AlexNet's and ShuffleNet's grouped convolutions: the group is the batch, each group's channels are M (they were
  # a batch of M = 1 with the input's window copied per output channel)
  from onnx import helper

  cin, cout = 8 * groups, 24 * groups
  w = {"w": f32(cout, cin // groups, 3, 3), "b": f32(cout)}
  nodes = [
    helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], group=groups),
    helper.make_node("Relu", ["c"], ["y"]),
  ]
  model = onnx_graph(nodes, {"x": (1, cin, 16, 16)}, w)
  shapes, left = planned(model)
  assert shapes == [(groups, 24, 256, 72)] and left == 0
  manifest = check_against_onnxruntime(model, {"x": f32(1, cin, 16, 16)}, tmp_path, target)
  # no dense expansion of the weights over the groups
  assert manifest["weights_bytes"] <= 1.2 * sum(a.nbytes for a in w.values())


@pytest.mark.parametrize("target", TARGETS)
def test_concat_branches_share_one_window_copy(target, tmp_path):
  # two 3x3 convolutions of one input, concatenated: the input's windows (im2col) are written once for both branches
  # (of more output channels than read a padded copy in place: columns.WINDOW_ROWS)
  w1, w2, x = f32(72, 16, 3, 3), f32(96, 16, 3, 3), f32(1, 16, 12, 12)
  fn = lambda x: Tensor.cat([x.conv2d(Tensor(w1), padding=1).relu(), x.conv2d(Tensor(w2), padding=1)], 1)
  out, (x,), gemms, kernels = compiled(fn, [x], tmp_path, target, name="m")
  close(out, np.concatenate([np.maximum(conv_ref(x, w1, padding=1), 0), conv_ref(x, w2, padding=1)], 1))
  src = (tmp_path / target / "src" / "model.c").read_text()
  body = run_body(src)
  assert gemms == 2 and body.count("_dense") == 1


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("groups, shape", [(1, (1, 128, 30, 28)), (2, (1, 64, 40, 40)), (1, (1, 32, 24, 24))])
def test_big_window_matrix_is_packed_a_panel_at_a_time(groups, shape, target, tmp_path):
  # a window matrix (im2col) bigger than PANEL_MAX_BYTES, or one under it but many times its input (the third: 663 KB,
  # 9x), is never written whole: each task packs its panel of output rows into its thread's buffer (30 rows in panels
  # of 8 leave the last one short; a grouped conv's panels run over the groups too), so the arena holds the input and
  # the output only
  from aot.codegen.lower.columns import DENSE_GROWTH, DENSE_SMALL, PANEL_MAX_BYTES

  cin, n = shape[1], shape[2] * shape[3]
  w, x = f32(16 * groups, cin // groups, 3, 3), f32(*shape)
  whole = cin * 9 * n * 4
  assert whole > PANEL_MAX_BYTES or whole > max(DENSE_SMALL, DENSE_GROWTH * x.nbytes)
  art = aot.compile_model(
    lambda x: x.conv2d(Tensor(w), padding=1, groups=groups).relu(),
    [x],
    out_dir=tmp_path / target,
    target=target,
    name="m",
  )
  g = cin // groups
  ref = np.concatenate(
    [conv_ref(x[:, i * g : (i + 1) * g], w[i * 16 : (i + 1) * 16], padding=1) for i in range(groups)], 1
  )
  outs = outputs_on_threads(art, {"x": x}, (1, 2))
  close(outs[0], np.maximum(ref, 0))
  assert np.array_equal(outs[0], outs[1])
  body = (art.dir / "src" / "model.c").read_text()
  assert "_pack" in body and "_dense" not in body
  assert art.arena_bytes <= (x.size + ref.size) * 4 + 4096


@pytest.mark.parametrize("target", TARGETS)
def test_big_input_of_a_1x1_conv_is_packed_a_panel_at_a_time(target, tmp_path):
  # the input of a 1x1 conv is a plain view of B, but one bigger than PANEL_MAX_BYTES is packed in panels: its rows of
  # K lie N apart (a 2304 x 4 x 160 input: 7.4 ms read in place, 5.4 from panels)
  from aot.codegen.lower.columns import PANEL_MAX_BYTES

  w, x = f32(64, 512, 1, 1), f32(1, 512, 8, 160)
  assert x.nbytes > PANEL_MAX_BYTES
  art = aot.compile_model(lambda x: x.conv2d(Tensor(w)).relu(), [x], out_dir=tmp_path / target, target=target)
  assert "_pack" in (art.dir / "src" / "model.c").read_text()
  outs = outputs_on_threads(art, {"x": x}, (1, 2))
  close(outs[0], np.maximum(conv_ref(x, w), 0))
  assert np.array_equal(outs[0], outs[1])


@pytest.mark.parametrize("target", TARGETS)
def test_batched_b_view_is_read_in_place_where_each_batch_fits_l2(target, tmp_path):
  # a batch of B views bigger than PANEL_MAX_BYTES in all, each under it (Winograd's 16 products over a 28x28 map,
  # 64 channels), is read where it lies: packed in panels of one tile each it ran at 67 GFLOP/s, in place 119
  from aot.codegen.lower.columns import PANEL_MAX_BYTES

  u, v = f32(16, 64, 64), f32(16, 64, 784)
  assert v[0].nbytes <= PANEL_MAX_BYTES < v.nbytes
  art = aot.compile_model(lambda v: Tensor(u) @ v, [v], out_dir=tmp_path / target, target=target)
  assert "_pack" not in (art.dir / "src" / "model.c").read_text()
  outs = outputs_on_threads(art, {"v": v}, (1, 2))
  close(outs[0], u.astype(np.float64) @ v)
  assert np.array_equal(outs[0], outs[1])


def test_b_read_in_place_is_prefetched_and_panels_are_not(tmp_path):
  # the microkernel prefetches a B it reads where it lies (weights, which may stream from memory: streams_b), not one
  # packed in panels by the task just before (in cache: the prefetches cost 4% there)
  w7, w56 = f32(256, 256, 3, 3), f32(64, 64, 3, 3)
  small = aot.compile_model(lambda x: x.conv2d(Tensor(w7), padding=1), [f32(1, 256, 7, 7)], out_dir=tmp_path / "a")
  big = aot.compile_model(lambda x: x.conv2d(Tensor(w56), padding=1), [f32(1, 64, 56, 56)], out_dir=tmp_path / "b")
  # (the 7x7 map's 49 positions are the rows, its weights B; the 56x56 map's window matrix is B, in panels)
  assert ".stream_b = 1" in (small.dir / "src" / "model.c").read_text()
  body = (big.dir / "src" / "model.c").read_text()
  assert "_pack" in body and ".stream_b" not in body


def test_b_no_longer_than_the_prefetchs_reach_is_not_prefetched(tmp_path):
  # a 1x1 convolution over 64 channels reads B in place over 64 steps of k: a prefetch STREAM_AHEAD steps ahead would
  # only fetch rows past the tile's (ResNet-50's expansions: 4% faster without); over 65 it prefetches
  from aot.codegen.lower.microkernel import STREAM_AHEAD

  sources = []
  for k in (STREAM_AHEAD, STREAM_AHEAD + 1):
    x, w = f32(1, k, 56, 56), f32(256, k, 1, 1)
    art = aot.compile_model(lambda x: x.conv2d(Tensor(w)), [x], out_dir=tmp_path / str(k))
    sources.append((art.dir / "src" / "model.c").read_text())
    close(aot.load(art)(x), np.einsum("ok,bkhw->bohw", w[:, :, 0, 0].astype(np.float64), x.astype(np.float64)))
  assert "aot_gemm g" in sources[0] and ".stream_b" not in sources[0]
  assert ".stream_b = 1" in sources[1]


@pytest.mark.parametrize("target", TARGETS)
def test_one_panel_splits_its_rows_between_threads(target, tmp_path):
  # a window matrix of one panel (the CRNN's 256x4x40 3x3 convs: 160 columns, whole tiles) was one task, run on one
  # thread however many there were; now each thread packs the panel for a group of its rows (runtime_c/aot_gemm.c
  # panel_groups): the same answer, bit for bit, on 1, 2 and 3 threads
  w, x = f32(64, 256, 3, 3), f32(1, 256, 4, 40)
  art = aot.compile_model(lambda x: x.conv2d(Tensor(w), padding=1), [x], out_dir=tmp_path / target, target=target)
  body = (art.dir / "src" / "model.c").read_text()
  assert "_pack" in body and ".slices = aot_pool_threads(m->pool)" in body
  outs = outputs_on_threads(art, {"x": x}, (1, 2, 3))
  close(outs[0], conv_ref(x, w, padding=1))
  assert np.array_equal(outs[0], outs[1]) and np.array_equal(outs[0], outs[2])


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("pads", [0, 1])
def test_strided_panel_pack_runs_its_rows_unmasked(pads, target, tmp_path):
  # a 3x3/2 conv packs B in panels whose innermost loop reads every 2nd input column: in C that loop is not run as a
  # masked vector iteration (AOT_TAIL_MASKED), which assembled each strided read element by element (SqueezeNet's
  # stem 4.5x slower than without the mask), padded (ResNet's downsampling convs) or not
  from onnx import helper

  from aot.compiler import render, resolve
  from aot.scheduler.schedule import schedule

  w = f32(16, 8, 3, 3)
  node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[pads] * 4, strides=[2, 2])
  model = onnx_graph([node], {"x": (1, 8, 81, 81)}, {"w": w})
  check_against_onnxruntime(model, {"x": f32(1, 8, 81, 81)}, tmp_path, target)
  if target != "c":
    return
  t = resolve(model)
  src = "\n".join(text for f, text in render("m", schedule(t.outputs, t.inputs), "c").files.items() if f.endswith(".c"))
  start = src.index("void m_f0_pack0b(")
  pack = src[start : src.index("\n}\n", start)].splitlines()
  rows = [i for i, line in enumerate(pack) if line.strip().startswith("for (")][-1]
  assert f"< {40 + pads}" in pack[rows] and "AOT_TAIL_MASKED" not in pack[rows - 1]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("pool", [(2, 1), (2, 2)], ids=["2x1", "2x2"])
def test_pooled_conv_packs_whole_rows(pool, target, tmp_path, whole_kernels, taps_copy):
  # a conv whose max pool runs over its result (C a scratch the kernel pools): B's columns go by their step in the
  # input, so the pool's window rows are not innermost and the copy's inner loop runs along a whole input row (the
  # CRNN's conv + 2x1 pools: a copy loop of 2 innermost, 0.85 -> 0.73 ms for its 256x160x2304 layer)
  from onnx import helper

  from aot.compiler import render, resolve
  from aot.scheduler.schedule import schedule

  nodes = [
    helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
    helper.make_node("MaxPool", ["c"], ["y"], kernel_shape=list(pool), strides=list(pool)),
  ]
  model = onnx_graph(nodes, {"x": (1, 16, 8, 40)}, {"w": f32(32, 16, 3, 3)})
  check_against_onnxruntime(model, {"x": f32(1, 16, 8, 40)}, tmp_path, target)
  # (a 2x2 pool's window columns stay next to each other, innermost: the renderer does not merge the copy's loop over
  # a pair with the loop over the pairs where the padding's gates read them)
  if target != "c" or pool != (2, 1):
    return
  t = resolve(model)
  src = "\n".join(text for f, text in render("m", schedule(t.outputs, t.inputs), "c").files.items() if f.endswith(".c"))
  # B's copy (a dense one at this size)
  start = src.index("void m_f0_dense0b(")
  copy = src[start : src.index("\n}\n", start)].splitlines()
  inner = [line for line in copy if line.strip().startswith("for (")][-1]
  # the innermost loop runs over the row's columns (40, or a padded run of them), not over the window's 2 rows
  assert "< 2;" not in inner and "< 2LL;" not in inner, inner


@pytest.mark.parametrize("target", TARGETS)
def test_long_reduction_keeps_wide_panels(target, tmp_path, taps_copy):
  # K = 2304 > GEMM_KC: only a K slice of the panel has to sit in L2, so a 28x28 image is packed in panels of 8 rows
  # (224 columns, 7 whole tiles), not of 1 row (28 columns: the weights streamed past every 28 columns)
  from onnx import helper

  from aot.codegen.lower.columns import GEMM_KC

  w = f32(16, 256, 3, 3)
  assert 256 * 9 > GEMM_KC
  node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])
  model = onnx_graph([node], {"x": (1, 256, 28, 28)}, {"w": w})
  check_against_onnxruntime(model, {"x": f32(1, 256, 28, 28)}, tmp_path, target)
  # batch, M, N, K, the tile, then the rows and columns of one task: the panel's
  assert "aot_gemm g = {1, 16, 784, 2304, 8, 32, 16, 224," in (tmp_path / target / "src" / "model.c").read_text()


@pytest.mark.parametrize("target", TARGETS)
def test_task_blocks_shrink_their_longer_side(target, tmp_path, whole_kernels):
  # a swapped 7x7 conv (M = 49 positions, N = 256 channels, K = 2304) split into MIN_TASKS tasks: blocks of 16 rows x
  # 32 columns, not rows first down to one tile (8 x 32 here; ResNet's 512-channel ones were 8 x 64, each task
  # re-reading its block of weights for 8 rows)
  from onnx import helper

  w = f32(256, 256, 3, 3)
  node = helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1])
  model = onnx_graph([node, helper.make_node("Relu", ["c"], ["y"])], {"x": (1, 256, 7, 7)}, {"w": w})
  check_against_onnxruntime(model, {"x": f32(1, 256, 7, 7)}, tmp_path, target)
  assert "aot_gemm g = {1, 49, 256, 2304, 8, 32, 16, 32," in (tmp_path / target / "src" / "model.c").read_text()


@pytest.mark.parametrize("target", TARGETS)
def test_a_short_reduction_into_a_big_result_runs_tasks_of_whole_rows(target, tmp_path, whole_kernels):
  # MobileNetV2's expansion, a 1x1 conv of 16 -> 96 channels over 112x112 (K = 16, C 4.8 MB): tasks of one tile of rows
  # over a third of N each (36 of them), not 96 rows x 128 columns (98), which wrote C in runs of 512 bytes
  from onnx import helper

  node = helper.make_node("Conv", ["x", "w"], ["c"])
  model = onnx_graph([node, helper.make_node("Relu", ["c"], ["y"])], {"x": (1, 16, 112, 112)}, {"w": f32(96, 16, 1, 1)})
  check_against_onnxruntime(model, {"x": f32(1, 16, 112, 112)}, tmp_path, target)
  assert "aot_gemm g = {1, 96, 12544, 16, 8, 32, 8, 4192," in (tmp_path / target / "src" / "model.c").read_text()


POOLED_CONV = (  # a 1x1 conv's 64 x 32 x 32 result (256 KB) max-pooled 2x2 to 64 KB, the largest tensor, then a conv
  [
    ("Conv", ["x", "w1"], ["c"], {}),
    ("Relu", ["c"], ["r"], {}),
    ("MaxPool", ["r"], ["p"], {"kernel_shape": [2, 2], "strides": [2, 2]}),
    ("Conv", ["p", "w2"], ["y"], {}),
  ],
  {"x": (1, 8, 32, 32)},
  {"w1": f32(64, 8, 1, 1), "w2": f32(4, 64, 1, 1)},
  64 * 16 * 16 * 4,
)
SWAPPED_WINDOWS = (  # a 3x3 conv over 2 x 40 positions, swapped (80 rows fill 8-row tiles): windows 9x the input
  [
    ("Conv", ["x", "w1"], ["c"], {"pads": [1] * 4}),
    ("MaxPool", ["c"], ["y"], {"kernel_shape": [2, 1], "strides": [2, 1]}),
  ],
  {"x": (1, 128, 2, 40)},
  {"w1": f32(128, 128, 3, 3)},
  128 * 2 * 40 * 4,
)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", [POOLED_CONV, SWAPPED_WINDOWS], ids=["pooled result", "swapped window matrix"])
def test_big_scratch_runs_in_pieces_within_the_arena_goal(case, target, tmp_path, monkeypatch, split_every_kernel):
  # a contraction whose result matrix (pooled after it) or dense window matrix would take the arena past ARENA_GOAL
  # times the largest tensor runs in pieces along an output range, each piece's scratch over the last one's: within
  # the goal, where the whole kernel's was not, and the same bits
  from onnx import helper

  from aot.codegen.lower import stage
  from aot.codegen.lower.pieces import ARENA_GOAL

  nodes, inputs, weights, largest = case
  model = onnx_graph([helper.make_node(op, i, o, **a) for op, i, o, a in nodes], inputs, weights)
  xs = {n: f32(*s) for n, s in inputs.items()}
  cut = check_against_onnxruntime(model, xs, tmp_path / "cut", target)
  monkeypatch.setattr(stage, "ARENA_GOAL", 1 << 20)
  whole = check_against_onnxruntime(model, xs, tmp_path / "whole", target)
  assert run_body((tmp_path / "cut" / target / "src" / "model.c").read_text()).count("aot_gemm g =") > 1
  assert cut["arena_bytes"] <= ARENA_GOAL * largest < whole["arena_bytes"]
  outs = [aot.load(tmp_path / d / target, threads=1)(*xs.values()) for d in ("cut", "whole")]
  assert np.array_equal(*outs)
