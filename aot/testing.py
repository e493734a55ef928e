"""Helpers for tests that pin how a model compiles."""
from __future__ import annotations
from pathlib import Path
from aot.artifact import Artifact

class KernelCountException(AssertionError):
  """The number of kernels a model compiles to changed."""
  def __init__(self, expected: int, got: int):
    super().__init__(f"expected {expected} kernels, got {got}")
    self.expected, self.got = expected, got

def kernel_count(what, example_inputs=None, **kw) -> int:
  """Kernels of an artifact, an artifact folder, or anything compile_model accepts (scheduled, not built)."""
  if isinstance(what, Artifact): return what.num_kernels
  if isinstance(what, (str, Path)) and Path(what).is_dir(): return Artifact(Path(what)).num_kernels
  from aot.compiler import resolve
  from aot.schedule import schedule
  traced = resolve(what, example_inputs, kw.get("name"))
  return len(schedule(traced.outputs, traced.inputs).kernels)

def assert_kernel_count(what, expected: int, example_inputs=None, **kw) -> None:
  got = kernel_count(what, example_inputs, **kw)
  if got != expected: raise KernelCountException(expected, got)
