"""On a machine with an NVIDIA GPU: compile the reference models for target cuda, run them on the GPU, compare with
the c target, the models' numpy references and onnxruntime (on each model's ONNX form), and print latencies.

  python scripts/gpu_check.py [--models mlp,mnist,resnet18,transformer] [--runs 20] [--out build/gpu_check]

Exits 1 with one line when there is no usable GPU or driver (it checks before compiling anything), and 1 when a
model's relative error is above 1e-4."""

from __future__ import annotations

import argparse
import ctypes
import sys
import time
from pathlib import Path

import numpy as np

# the tolerance every target is held to against the numpy references (tests/test_models.py)
MAX_REL_ERR = 1e-4


def cuda_device() -> str | None:
  """None when a CUDA device is usable, else why not (one line)."""
  try:
    lib = ctypes.CDLL("libcuda.so.1")
  except OSError as e:
    return f"no NVIDIA driver: cannot load libcuda.so.1 ({e})"
  if (r := lib.cuInit(0)) != 0:
    return f"no usable NVIDIA GPU: cuInit failed with CUDA error {r}"
  n = ctypes.c_int(0)
  if lib.cuDeviceGetCount(ctypes.byref(n)) != 0 or n.value < 1:
    return "no NVIDIA GPU found (cuDeviceGetCount is 0)"
  return None


def _median_ms(fn, runs: int) -> float:
  fn()  # warm up (the first run loads code and touches memory)
  times = []
  for _ in range(runs):
    t = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t)
  return float(np.median(times)) * 1e3


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--models", default="mlp,mnist,resnet18,transformer")
  p.add_argument("--runs", type=int, default=20)
  p.add_argument("--out", default="build/gpu_check")
  args = p.parse_args(argv)
  if (why := cuda_device()) is not None:
    print(f"gpu_check: {why}", file=sys.stderr)
    return 1
  import aot
  from aot.models import get

  ok = True
  from aot.models.onnx_forms import onnx_model

  try:
    import onnxruntime as ort
  except ImportError:
    ort = None
  print(
    f"{'model':<12} {'kernels':>7} {'rel_err_vs_ref':>14} {'rel_err_vs_c':>12} {'rel_err_vs_ort':>14} {'cuda_ms':>8} "
    f"{'c_ms':>8} {'ort_ms':>8} {'compile_s':>9}"
  )
  for name in args.models.split(","):
    model = get(name)
    t = time.perf_counter()
    gpu_art = aot.compile_model(f"models:{name}", target="cuda", out_dir=Path(args.out) / f"{name}_cuda")
    compile_s = time.perf_counter() - t
    c_art = aot.compile_model(f"models:{name}", target="c", out_dir=Path(args.out) / f"{name}_c")
    gpu, cpu = aot.load(gpu_art), aot.load(c_art)
    xs = model.example_inputs(0)
    got, ref, c_out = gpu(*xs), model.reference(*xs), cpu(*xs)
    rel_ref = float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))
    rel_c = float(np.max(np.abs(got - c_out)) / np.max(np.abs(c_out)))
    rel_ort, ort_ms = float("nan"), float("nan")
    if ort is not None:
      sess = ort.InferenceSession(onnx_model(name).SerializeToString(), providers=["CPUExecutionProvider"])
      feed = {i.name: x for i, x in zip(sess.get_inputs(), xs)}
      want = sess.run(None, feed)[0]
      rel_ort = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
      ort_ms = _median_ms(lambda: sess.run(None, feed), max(3, args.runs // 5))
      ok &= rel_ort <= MAX_REL_ERR
    ok &= rel_ref <= MAX_REL_ERR
    print(
      f"{name:<12} {gpu_art.num_kernels:>7} {rel_ref:>14.2e} {rel_c:>12.2e} {rel_ort:>14.2e} "
      f"{_median_ms(lambda: gpu(*xs), args.runs):>8.3f} {_median_ms(lambda: cpu(*xs), max(3, args.runs // 5)):>8.3f} "
      f"{ort_ms:>8.3f} {compile_s:>9.1f}"
    )
    gpu.close()
    cpu.close()
  print("PASS" if ok else f"FAIL: relative error above {MAX_REL_ERR}")
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
