"""Epilogues the microkernel applies to each finished tile (codegen/lower/contract.py fused_steps, runtime_c/aot_gemm.c
apply_steps): conv + batch norm + ReLU, conv + bias + ReLU6, conv + bias + residual + ReLU, matmul + bias, on odd
M, N and K (edge tiles), split across 1, 2 and 3 threads. Each is compared bitwise with the same model built with its
epilogue as a kernel pass of its own (FUSE_EPILOGUES off), and with onnxruntime; the fused build runs no epilogue."""

import numpy as np
import pytest
from conftest import TARGETS, run_body
from test_contract import close, onnx_graph

import aot
import aot.codegen.lower.contract as contract

rng = np.random.default_rng(11)
f32 = lambda *shape: rng.standard_normal(shape, dtype=np.float32)


def _conv_weights(cout: int = 20, cin: int = 8) -> dict[str, np.ndarray]:
  return {
    "w": f32(cout, cin, 3, 3),
    "b": f32(cout),
    "s": f32(cout),
    "t": f32(cout),
    "mu": f32(cout),
    "var": rng.uniform(0.5, 2.0, cout).astype(np.float32),
  }


def _cases():
  from onnx import helper

  node = helper.make_node
  conv = node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1])
  x = {"x": (1, 8, 13, 11)}
  w = _conv_weights()
  clip = {"lo": np.array(0, np.float32), "hi": np.array(6, np.float32)}
  return {
    "conv + batch norm + relu": (
      onnx_graph(
        [conv, node("BatchNormalization", ["c", "s", "t", "mu", "var"], ["n"]), node("Relu", ["n"], ["y"])], x, w
      ),
      x,
    ),
    "conv + bias + relu6": (
      onnx_graph([conv, node("Clip", ["c", "lo", "hi"], ["y"])], x, {k: w[k] for k in ("w", "b")} | clip),
      x,
    ),
    "conv + bias + residual + relu": (
      onnx_graph(
        [conv, node("Add", ["c", "r"], ["a"]), node("Relu", ["a"], ["y"])],
        x | {"r": (1, 20, 13, 11)},
        {k: w[k] for k in ("w", "b")},
      ),
      x | {"r": (1, 20, 13, 11)},
    ),
    # each branch's epilogue is a slice of the kernel's (split_by_slices): each branch's microkernel call applies its
    # own
    "concat of conv + bias + relu branches": (
      onnx_graph(
        [
          node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
          node("Relu", ["c1"], ["y1"]),
          node("Conv", ["x", "w", "b"], ["c2"], pads=[1, 1, 1, 1]),
          node("Relu", ["c2"], ["y2"]),
          node("Concat", ["y1", "y2"], ["y"], axis=1),
        ],
        x,
        {"w1": f32(12, 8, 3, 3), "b1": f32(12), "w": w["w"], "b": w["b"]},
      ),
      x,
    ),
    # a last-axis concat: each branch's C lies in the output with its rows as far apart as the output's (ldc)
    "last-axis concat of matmul and matmul + bias + relu": (
      onnx_graph(
        [
          node("MatMul", ["x", "W1"], ["p1"]),
          node("MatMul", ["x", "W"], ["p2"]),
          node("Add", ["p2", "B"], ["q2"]),
          node("Relu", ["q2"], ["r2"]),
          node("Concat", ["p1", "r2"], ["y"], axis=1),
        ],
        {"x": (37, 53)},
        {"W1": f32(53, 40), "W": f32(53, 45), "B": f32(45)},
      ),
      {"x": (37, 53)},
    ),
    "matmul + bias, odd M, N, K": (
      onnx_graph(
        [node("MatMul", ["x", "W"], ["c"]), node("Add", ["c", "B"], ["y"])],
        {"x": (37, 53)},
        {"W": f32(53, 45), "B": f32(45)},
      ),
      {"x": (37, 53)},
    ),
  }


CASES = _cases()


def _run(model, feeds: dict, out_dir, target: str, cpu: str) -> tuple[list[np.ndarray], str]:
  """The outputs on 1, 2 and 3 threads, and the body of m_run (the calls)."""
  art = aot.compile_model(model, out_dir=out_dir, target=target, name="m", cpu=cpu)
  src = (art.dir / "src" / "model.c").read_text()
  outs = []
  for threads in (1, 2, 3):
    m = aot.load(art, threads=threads)
    try:
      outs.append(m(*feeds.values()))
    finally:
      m.close()
  return outs, run_body(src)


def _calls_epilogue(body: str) -> bool:
  """Does m_run call the kernel's own function m_f0 or one of its slices (directly, or on the pool through a
  trampoline)?"""
  return "m_f0(" in body or "run_m_f0," in body or "m_f0_slice" in body


def _check_fused(case: str, target: str, tmp_path, monkeypatch, cpu: str = "native"):
  import onnxruntime as ort

  model, shapes = CASES[case]
  feeds = {n: np.random.default_rng(3).standard_normal(s, dtype=np.float32) for n, s in shapes.items()}
  fused, body = _run(model, feeds, tmp_path / "fused", target, cpu)
  # the epilogue is steps of the microkernel's calls, and its kernel (m_f0, or its slices) is not called
  assert ".nsteps =" in body and not _calls_epilogue(body)
  monkeypatch.setattr(contract, "FUSE_EPILOGUES", False)
  separate, body = _run(model, feeds, tmp_path / "separate", target, cpu)
  assert ".nsteps" not in body and _calls_epilogue(body)
  for threads, out in zip((1, 2, 3), fused):
    np.testing.assert_array_equal(
      out, separate[0], err_msg=f"fused on {threads} threads differs from the epilogue pass"
    )
  for threads, out in zip((2, 3), separate[1:]):
    np.testing.assert_array_equal(out, separate[0], err_msg=f"{threads} threads differ from 1")
  want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
  close(fused[0], want)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_fused_epilogue_is_bitwise_the_separate_one(case, target, tmp_path, monkeypatch, split_every_kernel):
  _check_fused(case, target, tmp_path, monkeypatch)


@pytest.mark.parametrize("target", TARGETS)
def test_fused_batch_norm_built_by_gcc(target, tmp_path, monkeypatch, split_every_kernel):
  # gcc contracts the kernel's (acc + b) * s + t into a multiply-add where clang does not: the fused steps round as
  # the kernels of each target do (a c build's as its compiler contracts them, llvm's never)
  monkeypatch.setenv("CC", "gcc")
  _check_fused("conv + batch norm + relu", target, tmp_path, monkeypatch)


@pytest.mark.parametrize("case", ["conv + batch norm + relu", "matmul + bias, odd M, N, K"])
def test_fused_epilogue_on_avx2_tiles(case, tmp_path, monkeypatch, split_every_kernel):
  # the 6x16 microkernel applies the steps to its own accumulators (8-float vectors)
  _check_fused(case, "c", tmp_path, monkeypatch, cpu="x86-64-v3")


@pytest.mark.parametrize("target", TARGETS)
def test_last_axis_concat_branches_write_in_place(target, tmp_path):
  # both branches' microkernel calls write their columns of the output (row stride 85): no scratch matrix, no copy
  model, _ = CASES["last-axis concat of matmul and matmul + bias + relu"]
  art = aot.compile_model(model, out_dir=tmp_path, target=target, name="m")
  src = (art.dir / "src" / "model.c").read_text()
  body = run_body(src)
  assert body.count(".ldc = 85") == 2 and not _calls_epilogue(body)
  assert art.arena_bytes == 0


def test_unfusable_epilogue_keeps_its_pass(tmp_path):
  # a sigmoid is no chain of add, multiply, max and min: the epilogue stays a kernel pass
  from onnx import helper

  x = {"x": (1, 8, 13, 11)}
  model = onnx_graph(
    [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Sigmoid", ["c"], ["y"])],
    x,
    {k: _conv_weights()[k] for k in ("w", "b")},
  )
  art = aot.compile_model(model, out_dir=tmp_path, target="c", name="m")
  src = (art.dir / "src" / "model.c").read_text()
  assert ".nsteps" not in src and _calls_epilogue(run_body(src))
