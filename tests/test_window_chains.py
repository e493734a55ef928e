"""Chains of windowed reductions (pools) and what reads them: each pool is computed once, in a kernel of its own, when
fusing it into its reader would run its window loop again (aot/scheduler/schedule.py: a stage found late in a round,
PAD_REDUCE_WASTE). YOLO's SPPF block (x -> three chained 5x5 max-pools, concat [x, p1, p2, p3]) is the model case:
its concat recomputed the first two pools its pool kernels had already stored, and ran the third pool's loop over all
four slices of the concat."""

import numpy as np
import pytest
from conftest import TARGETS, ort_session
from onnx import TensorProto, helper

import aot
from aot.compiler import resolve
from aot.core.ir import Ops
from aot.scheduler.schedule import schedule
from aot.testing import assert_kernel_count

rng = np.random.default_rng(5)


def _model(nodes, x_shape, weights=None):
  g = helper.make_graph(
    nodes,
    "g",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    [helper.make_tensor(n, TensorProto.FLOAT, w.shape, w.reshape(-1)) for n, w in (weights or {}).items()],
  )
  return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _pool(kind: str, x: str, y: str, k: int = 5, **kw):
  extra = {"count_include_pad": 0} if kind == "AveragePool" else {}
  return helper.make_node(kind, [x], [y], kernel_shape=[k, k], pads=[k // 2] * 4, **extra, **kw)


def _sppf(kind: str, channels: int = 16):
  nodes = [_pool(kind, "x", "p1"), _pool(kind, "p1", "p2"), _pool(kind, "p2", "p3")]
  nodes.append(helper.make_node("Concat", ["x", "p1", "p2", "p3"], ["y"], axis=1))
  return _model(nodes, [1, channels, 10, 10])


def _window_loops(model) -> list[int]:
  """Per scheduled kernel, how many accumulations it runs: a pool recomputed inside its reader shows as one more."""
  traced = resolve(model)
  kernels = schedule(traced.outputs, traced.inputs).kernels
  return [sum(u.op is Ops.ACCUMULATE for u in k.ast.toposort()) for k in kernels]


def _check(model, target: str, tmp_path, x_shape, atol=1e-5):
  x = rng.standard_normal(x_shape, dtype=np.float32)
  want = ort_session(model).run(None, {"x": x})[0]
  m = aot.load(aot.compile_model(model, out_dir=tmp_path / target, target=target, name="m"))
  try:
    np.testing.assert_allclose(m(x), want, rtol=1e-5, atol=atol)
  finally:
    m.close()


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("kind", ["MaxPool", "AveragePool"])
def test_sppf_computes_each_pool_once(kind, target, tmp_path):
  model = _sppf(kind)
  _check(model, target, tmp_path, (1, 16, 10, 10))
  # three pools of one window loop each (a 5x5 max pool two, one per axis: frontends/onnx_ops_nn.py
  # SEPARABLE_POOL_TAPS), and the concat a copy of four buffers: before, the concat ran the loops of pools the pool
  # kernels had stored (3 loops) or the last pool's loop over all 64 channels
  passes = 2 if kind == "MaxPool" else 1
  assert _window_loops(model) == [1] * 3 * passes + [0]
  assert_kernel_count(model, 3 * passes + 1)


@pytest.mark.parametrize(
  "kernel, pads, dilation, shape",
  [
    ((5, 5), (2, 2, 2, 2), 1, (1, 8, 10, 10)),
    ((5, 5), (0, 0, 0, 0), 1, (1, 3, 9, 11)),
    ((7, 5), (3, 1, 2, 2), 1, (2, 3, 12, 9)),
    ((5, 5), (4, 4, 4, 4), 2, (1, 2, 13, 13)),
    ((3, 3, 3), (1, 1, 1, 1, 1, 1), 1, (1, 2, 6, 7, 5)),
    ((25,), (12, 12), 1, (1, 3, 40)),
  ],
)
def test_wide_max_pool_one_axis_at_a_time(kernel, pads, dilation, shape, tmp_path):
  """A stride-1 max pool of 25 taps or more is a pass per axis: onnxruntime's answer bit for bit, and a NaN anywhere
  in a window is the window's max (numpy's, as the single pass computed it; onnxruntime's pool skips it)."""
  node = helper.make_node(
    "MaxPool", ["x"], ["y"], kernel_shape=list(kernel), pads=list(pads), dilations=[dilation] * len(kernel)
  )
  model = _model([node], list(shape))
  assert _window_loops(model) == [1] * len(kernel)
  x = rng.standard_normal(shape, dtype=np.float32)
  x.flat[3] = -np.inf
  m = aot.load(aot.compile_model(model, out_dir=tmp_path, name="m"))
  try:
    np.testing.assert_array_equal(m(x), ort_session(model).run(None, {"x": x})[0])
    x.flat[[5, x[0, 0].size + 7]] = np.nan
    nd = len(kernel)
    padded = np.pad(x, [(0, 0)] * 2 + list(zip(pads[:nd], pads[nd:])), constant_values=-np.inf)
    win = np.lib.stride_tricks.sliding_window_view(
      padded, [(k - 1) * dilation + 1 for k in kernel], tuple(range(2, 2 + nd))
    )
    want = win[(...,) + (slice(None, None, dilation),) * nd].max(tuple(range(-nd, 0)))
    np.testing.assert_array_equal(m(x), want)
  finally:
    m.close()


def test_pool_read_by_a_concat_and_the_next_pool_is_stored_once():
  # p feeds the next pool and the concat: the concat loads it rather than pooling x again; q fills half the concat,
  # where its loop over the other half costs no more than storing it (PAD_REDUCE_WASTE), so it stays fused
  nodes = [
    helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
    _pool("MaxPool", "p", "q", k=3),
    helper.make_node("Concat", ["p", "q"], ["y"], axis=1),
  ]
  assert _window_loops(_model(nodes, [1, 8, 12, 12])) == [1, 1]


@pytest.mark.parametrize("kind", ["MaxPool", "AveragePool"])
def test_convolution_reads_a_chain_of_pools_once_stored(kind, tmp_path):
  w = rng.standard_normal((16, 8, 3, 3), dtype=np.float32)
  conv = helper.make_node("Conv", ["q", "w"], ["y"], kernel_shape=[3, 3], pads=[1] * 4)
  model = _model([_pool(kind, "x", "p", k=3), _pool(kind, "p", "q", k=3), conv], [1, 8, 12, 12], {"w": w})
  _check(model, "c", tmp_path, (1, 8, 12, 12), atol=1e-4)
  # each pool a kernel, then the convolution over the stored second pool (its window read at 9 offsets per output)
  assert _window_loops(model) == [1, 1, 1]


def _upsample_concat(x_shape: tuple, b_shape: tuple):
  """YOLOv8's neck: Resize(nearest, x2) of x, then Concat with b (a backbone feature) along the channels; with
  seeded inputs."""
  g = helper.make_graph(
    [
      helper.make_node("Resize", ["x", "", "s"], ["u"], mode="nearest"),
      helper.make_node("Concat", ["u", "b"], ["y"], axis=1),
    ],
    "g",
    [
      helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape)),
      helper.make_tensor_value_info("b", TensorProto.FLOAT, list(b_shape)),
    ],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    [helper.make_tensor("s", TensorProto.FLOAT, [4], np.array([1, 1, 2, 2], np.float32))],
  )
  feeds = {"x": rng.standard_normal(x_shape, dtype=np.float32), "b": rng.standard_normal(b_shape, dtype=np.float32)}
  return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), feeds


def _matches_onnxruntime(art, model, feeds):
  m = aot.load(art)
  try:
    np.testing.assert_array_equal(m(*feeds.values()), ort_session(model).run(None, feeds)[0])
  finally:
    m.close()


@pytest.mark.parametrize("target", TARGETS)
def test_nearest_upsample_into_a_concat_is_one_copy(target, tmp_path):
  # the resize's gathers by index tables (0, 0, 1, 1, ...) are a broadcast (aot/scheduler/schedule.py
  # _repeat_gather): one kernel, where the second axis' gather read the first at indices it could not bound and
  # stored it (2 kernels)
  model, feeds = _upsample_concat((1, 6, 5, 7), (1, 3, 10, 14))
  assert_kernel_count(model, 1)
  _matches_onnxruntime(aot.compile_model(model, out_dir=tmp_path / target, target=target, name="m"), model, feeds)


def test_concat_kernel_is_cut_at_its_branches(tmp_path):
  # a concat written by generated loops runs one function per branch's run of the concat axis
  # (codegen/lower/contract.py split_by_gates): each reads its own input, where one function evaluated both under
  # gates at every element (0.121 -> 0.032 ms at YOLOv8n's 192x40x40)
  model, feeds = _upsample_concat((1, 16, 20, 20), (1, 8, 40, 40))
  assert_kernel_count(model, 1)
  art = aot.compile_model(model, out_dir=tmp_path, name="m")
  src = (art.dir / "src" / "model.c").read_text()
  heads = [line for line in src.splitlines() if line.startswith("AOT_LOOP_VECTORIZE") and " m_f0" in line]
  assert len(heads) == 2 and all(h.count("const float *restrict") == 1 for h in heads)
  _matches_onnxruntime(art, model, feeds)
