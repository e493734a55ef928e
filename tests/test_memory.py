"""The memory plan (aot/scheduler/memory.py) checked from what it hands the code generator, not from its own reasoning:
every
scratch buffer's offset, against lifetimes read off the kernel list the artifact runs in order. Two buffers that are
alive at once never share a byte of the arena, whatever numbers flow through them; and a model whose output would come
out visibly wrong if a buffer were reused too early matches numpy."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import aot
import aot.compiler
from aot.scheduler.kernel import Buffer, Kernel
from aot.scheduler.memory import ALIGN, memory_plan
from aot.tools import fuzz
from aot.tools.fuzz_cases import merged

# the bundled reference models, and quantized forms whose int8 lowering makes scratch buffers of its own
MODELS = ("mlp", "mnist", "resnet18", "transformer")
QUANTIZED = (("mnist", "qdq"), ("transformer", "dynamic"))
# fuzz graphs whose plans are checked: a seed CI's fuzzing does not use, enough cases for pools, convs and concats
FUZZ_SEED, FUZZ_CASES = 31, 120


@dataclass
class Plan:
  """What the planner was asked and what it answered: the kernels in run order, the scratch buffers, the arena size."""

  kernels: list[Kernel]
  scratch: list[Buffer]
  arena: int


@dataclass
class Life:
  """A scratch buffer's lifetime in kernel indices, both ends inclusive: from its first write to its last use."""

  buf: Buffer
  first: int
  last: int


def plans_of(what, target: str = "c", **kw) -> list[Plan]:
  """Every memory plan made while rendering what (resolve, schedule and render: nothing is built)."""
  plans = []

  def spy(kernels, scratch):
    arena = memory_plan(kernels, scratch)
    plans.append(Plan(list(kernels), list(scratch), arena))
    return arena

  mp = pytest.MonkeyPatch()
  mp.setattr(aot.compiler, "memory_plan", spy)
  try:
    traced = aot.compiler.resolve(what, **kw)
    sched = aot.compiler.schedule(traced.outputs, traced.inputs, traced.output_names)
    sched.formats, sched.containers = traced.formats or {}, traced.containers or []
    aot.compiler.render(traced.name, sched, target)
  finally:
    mp.undo()
  assert plans, "render made no memory plan"
  return plans


def lifetimes(plan: Plan) -> list[Life]:
  """Each scratch buffer's lifetime from the kernel list alone: kernel i writes its slot 0 and reads the others (a
  buffer the lowering made for one kernel's own use, a packed panel say, may sit in any slot of that kernel). A
  buffer read by a kernel before any kernel wrote it is a planning bug of its own and fails here."""
  uses: dict[int, list[tuple[int, int]]] = {}
  for i, k in enumerate(plan.kernels):
    for slot, b in enumerate(k.bufs):
      uses.setdefault(id(b), []).append((i, slot))
  lives = []
  for b in plan.scratch:
    seen = uses.get(id(b), [])
    if not seen:
      continue
    written = [i for i, slot in seen if slot == 0]
    kernels = {i for i, _ in seen}
    first = min(written) if written else min(kernels)
    if not written:
      assert len(kernels) == 1, f"{b} is read by kernels {sorted(kernels)} and written by none"
    assert min(kernels) >= first, f"{b} is read by kernel {min(kernels)} before kernel {first} writes it"
    lives.append(Life(b, first, max(kernels)))
  return lives


def overlapping_neighbours(plan: Plan) -> list[str]:
  """Pairs of buffers alive in one kernel at once whose arena bytes overlap, and any buffer outside the arena or
  misaligned; empty when the plan is sound."""
  problems = []
  lives = lifetimes(plan)
  for life in lives:
    b = life.buf
    if b.offset % ALIGN or b.offset < 0 or b.offset + b.nbytes > plan.arena:
      problems.append(f"{b} at {b.offset} (+{b.nbytes}) is misaligned or outside the {plan.arena}-byte arena")
  for n, a in enumerate(lives):
    for b in lives[n + 1 :]:
      if a.last < b.first or b.last < a.first or not a.buf.nbytes or not b.buf.nbytes:
        continue
      if a.buf.offset < b.buf.offset + b.buf.nbytes and b.buf.offset < a.buf.offset + a.buf.nbytes:
        problems.append(
          f"{a.buf} (kernels {a.first}..{a.last}, bytes {a.buf.offset}..{a.buf.offset + a.buf.nbytes}) and "
          f"{b.buf} (kernels {b.first}..{b.last}, bytes {b.buf.offset}..{b.buf.offset + b.buf.nbytes}) share bytes"
        )
  return problems


def check_plans(plans: list[Plan], what: str) -> int:
  """Fail with every overlap found; return how many of the plans put two buffers at one offset (the test's own check
  that there was reuse to get wrong)."""
  problems = [p for plan in plans for p in overlapping_neighbours(plan)]
  assert not problems, f"{what}:\n" + "\n".join(problems[:10])
  return sum(len({b.offset for b in p.scratch if b.nbytes}) < len([b for b in p.scratch if b.nbytes]) for p in plans)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("target", ["c", "cuda"])
def test_bundled_models_never_share_bytes_between_live_buffers(name, target):
  # the CPU targets plan over the lowered kernels (contractions with their packing buffers), the GPU ones over the
  # schedule's: rendering a cuda artifact's sources needs no CUDA
  plans = plans_of(f"models:{name}", target)
  reused = check_plans(plans, f"{name} ({target})")
  if name != "mlp":  # the mlp's two hidden layers are too few to reuse anything; the others reuse the arena
    assert reused, f"{name}: no two buffers share an offset, so the check saw no reuse"


@pytest.mark.parametrize("name,form", QUANTIZED, ids=[f"{n}:{f}" for n, f in QUANTIZED])
def test_quantized_models_never_share_bytes_between_live_buffers(name, form):
  from aot.models.onnx_forms import onnx_model
  from aot.models.quantized import quantized

  check_plans(plans_of(quantized(onnx_model(name), form)), f"{name}:{form}")


def test_fuzz_graphs_never_share_bytes_between_live_buffers():
  # cases one at a time, and merged as the fuzzer compiles them (one model of BATCH cases: more buffers to place)
  cases = [fuzz.generate(FUZZ_SEED, i) for i in range(FUZZ_CASES)]
  models = [(f"case {c.index}", c.model()) for c in cases]
  models += [(f"cases {i}..", merged(cases[i : i + fuzz.BATCH])) for i in range(0, FUZZ_CASES, fuzz.BATCH)]
  reused = 0
  for what, model in models:
    try:
      plans = plans_of(model)
    except Exception as e:  # a graph the compiler rejects is the fuzzer's business (tests/test_fuzz.py), not this one's
      pytest.fail(f"fuzz seed {FUZZ_SEED} {what} does not render: {type(e).__name__}: {e}")
    reused += check_plans(plans, f"fuzz seed {FUZZ_SEED} {what}")
  assert reused >= 10, f"only {reused} of {len(models)} fuzz graphs reused arena bytes"


def transpose_add_chain(n: int = 24) -> onnx.ModelProto:
  """t = a @ b; u = t + t^T (t read through a permuted index in the kernel that writes u); y = u @ c. t and u are both
  scratch; u written over t's bytes would read half of t already overwritten."""
  rng = np.random.default_rng(0)
  b, c = (rng.standard_normal((n, n), dtype=np.float32) for _ in range(2))
  nodes = [
    helper.make_node("MatMul", ["a", "b"], ["t"]),
    helper.make_node("Transpose", ["t"], ["tt"], perm=[1, 0]),
    helper.make_node("Add", ["tt", "t"], ["u"]),
    helper.make_node("MatMul", ["u", "c"], ["y"]),
  ]
  graph = helper.make_graph(
    nodes,
    "transpose_add",
    [helper.make_tensor_value_info("a", TensorProto.FLOAT, [n, n])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    [numpy_helper.from_array(b, "b"), numpy_helper.from_array(c, "c")],
  )
  return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_a_transposed_last_read_is_not_overwritten(tmp_path):
  model = transpose_add_chain()
  b, c = (numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer)
  a = np.random.default_rng(1).standard_normal((24, 24), dtype=np.float32)
  t = a.astype(np.float64) @ b
  want = (t + t.T) @ c
  for target in ("c", "llvm"):
    got = aot.load(aot.compile_model(model, out_dir=tmp_path / target, target=target), threads=1)(a)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max(), err_msg=target)
  # t (kernel 0's output) and u (kernel 1's, from t read transposed) are alive at once: separate bytes
  (plan,) = plans_of(model)
  assert [len(k.bufs) for k in plan.kernels] == [3, 2, 3] and not overlapping_neighbours(plan)


def test_the_check_finds_a_buffer_moved_onto_a_live_ones_bytes():
  """The check itself can fail: in mnist's plan, one buffer moved onto the bytes of another alive at the same time."""
  (plan,) = plans_of("models:mnist")
  lives = lifetimes(plan)
  a, b = next((a, b) for a in lives for b in lives if a is not b and a.first <= b.last and b.first <= a.last)
  b.buf.offset = a.buf.offset
  assert any("share bytes" in p for p in overlapping_neighbours(plan))
