"""The loop nest the codegen produces: placement of values, shared reduction loops of upcast lanes."""
import numpy as np
import aot
from aot import Tensor
from aot.compiler import resolve
from aot.schedule import schedule
from aot.codegen.linearize import linearize, flop_count
from aot.codegen.opt import optimize

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
