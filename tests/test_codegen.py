"""The loop nest the codegen produces: placement of values, shared reduction loops of upcast lanes."""
import numpy as np
import pytest
import aot
from aot import Tensor
from aot.compiler import resolve
from aot.schedule import schedule
from aot.codegen.linearize import linearize, flop_count
from aot.codegen.opt import optimize
from conftest import TARGETS

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
  kinds = [(kind, u.arg[2] if kind == "loop" else None) for kind, u in linearize(k.ast) if kind in ("loop", "end", "acc_init")]
  assert kinds[:2] == [("loop", "loop"), ("acc_init", None)]

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
@pytest.mark.parametrize("op, attrs", [("MaxPool", {}), ("AveragePool", {"count_include_pad": 0}),
                                       ("AveragePool", {"count_include_pad": 1})])
def test_pools_with_written_out_windows_match_onnxruntime(op, attrs, target, tmp_path):
  # odd sizes and padding: the edge columns' terms are gated, 1 and 2 threads bitwise equal
  from onnx import helper
  from test_contract import onnx_graph, check_against_onnxruntime
  node = helper.make_node(op, ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], **attrs)
  x = np.random.default_rng(3).standard_normal((1, 5, 13, 11)).astype(np.float32)
  check_against_onnxruntime(onnx_graph([node], {"x": x.shape}, {}), {"x": x}, tmp_path, target)

def test_a_kernel_reading_at_a_small_stride_indexes_in_64_bits():
  # a 3x3/2 pool written out reads every 2nd element along its innermost loop: 64-bit indices let the vectorisers
  # see one interleaved load per window row; a contiguous elementwise kernel keeps 32-bit ones
  from aot.codegen.linearize import widen_index
  from aot.dtype import dtypes
  x = np.zeros((1, 3, 23, 23), np.float32)
  (pool,) = kernels(lambda x: x.max_pool2d(3, 2), x)
  (relu,) = kernels(lambda x: x.relu(), x)
  wide = lambda k: any(u.dtype == dtypes.index64 for u in widen_index(optimize(k.ast)).toposort())
  assert wide(pool) and not wide(relu)
