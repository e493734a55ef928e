"""What compile_model is asked to do, as one value: the Python API and the CLI build it, the driver's stages read it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, NamedTuple

from aot.codegen.render.gpu import GPU_TARGETS
from aot.cpu import CPU_SYNTAX, accepted
from aot.errors import InvalidValueError

# the CPU targets, then the GPU ones (rendered by codegen/render/gpu.py, their host code by codegen/render/host_gpu.py)
TARGETS = ("c", "llvm", *GPU_TARGETS)


class DimRange(NamedTuple):
  """The sizes a dim takes at run time, low to high inclusive (--shape batch=1..64; shapes={"batch": (1, 64)})."""

  lo: int
  hi: int

  def __str__(self) -> str:
    return f"{self.lo}..{self.hi}"


@dataclass(frozen=True)
class CompileOptions:
  """compile_model's options (its docstring says what each does), checked once when made: an option that does not fit
  the target is an InvalidValueError naming both. sanitize None is AOT_SANITIZE=1 in the environment, read here."""

  target: str = "c"
  out_dir: object = None
  name: str | None = None
  cpu: str = "native"
  cache: bool = True
  progress: Callable[[str], None] | None = None
  shapes: dict | None = None
  bind: dict | None = None
  triple: str | None = None
  offload_arch: tuple[str, ...] | None = None
  emulate: bool = False
  profile: bool = False
  sanitize: bool | None = None
  winograd: bool = True

  def __post_init__(self):
    if self.sanitize is None:
      # frozen: the environment's answer is stored once, so every stage sees the same one
      object.__setattr__(self, "sanitize", os.environ.get("AOT_SANITIZE", "") not in ("", "0"))
    # the order is the order of the messages a user fixes one at a time: the target first
    for broken, why in _RULES:
      if broken(self):
        raise InvalidValueError(why(self))

  @property
  def gpu(self) -> bool:
    """Is the build a GPU one (its kernels one launch each): a GPU target, or CUDA/HIP emulated on the CPU."""
    return self.target in GPU_TARGETS or self.emulate

  def say(self, step: str) -> None:
    """Report a step to progress, if given."""
    if self.progress is not None:
      self.progress(step)


def _emulation(o: CompileOptions) -> str:
  return " emulation" if o.emulate else ""


# (broken, message): the options that cannot go together, checked in this order
_RULES: tuple[tuple[Callable[[CompileOptions], bool], Callable[[CompileOptions], str]], ...] = (
  # a typo in the target would otherwise surface as a missing renderer deep in the driver
  (lambda o: o.target not in TARGETS, lambda o: f"unknown target {o.target!r}; available: {', '.join(TARGETS)}"),
  # the rest of a bad --cpu is the compiler's to say (aot/cpu.py probes it); this keeps a flag or a blank out of -march
  (
    lambda o: not isinstance(o.cpu, str) or not CPU_SYNTAX.fullmatch(o.cpu),
    lambda o: f"--cpu {o.cpu!r} is not a CPU name: {accepted(o.triple)}",
  ),
  # the profiler times model.c's calls: a GPU host has no such list
  (
    lambda o: o.profile and o.gpu,
    lambda o: f"profile is for the CPU targets (c, llvm), not {o.target}{_emulation(o)}",
  ),
  # a GPU build's device code has its own architecture (offload_arch); the host is built for this machine
  (
    lambda o: o.gpu and bool(o.triple),
    lambda o: f"--triple is for the CPU targets; target {o.target} builds device code for the GPU",
  ),
  # the sanitizers instrument the CPU build's C; nvcc and the HIP device compile take no such flags
  (lambda o: o.gpu and o.sanitize, lambda o: f"sanitize is for the CPU targets (c, llvm), not {o.target}"),
  # only CUDA and HIP kernel sources have a CPU emulation shim (aot_gpu_shim.h)
  (
    lambda o: o.emulate and o.target not in ("cuda", "hip"),
    lambda o: "emulate=True runs the CUDA or HIP kernel source on the CPU: target must be cuda or hip",
  ),
)
