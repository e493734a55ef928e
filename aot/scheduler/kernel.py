"""The types every stage shares: a traced program (frontend -> scheduler), its buffers, and the scheduled kernel list
(scheduler -> memory plan -> renderers -> artifact writer)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from aot.core.dtype import DType
from aot.core.ir import IndexCheck, UOp


@dataclass
class Traced:
  """A program as the frontends hand it to the scheduler: its output and input UOps."""

  name: str
  outputs: list[UOp]
  inputs: list[UOp]
  output_names: list[str] | None = None
  formats: dict | None = None  # narrow inputs and outputs (frontends/onnx.py): name -> (type name, logical shape)
  containers: list | None = None  # sequence/optional inputs and outputs as runs of C API tensors (frontends/onnx.py)
  batch: object = None  # a dim with a range, run as a loop over one-item runs (frontends/batch_dims.py BatchDim)
  # a dim with a range whose loops run to the size a run is given (frontends/extent_dims.py; BatchDim, "extent")
  extent: object = None


@dataclass(eq=False)
class Buffer:
  kind: str  # "input" | "output" | "const" | "scratch" | "check" (an index check's result: aot/core/ir.py IndexCheck)
  dtype: DType
  size: int  # elements
  name: str = ""
  index: int = -1  # position among inputs/outputs
  shape: tuple = ()
  data: np.ndarray | None = None
  offset: int = 0  # bytes into the arena (scratch) or the weights blob (const)

  @property
  def nbytes(self) -> int:
    return self.size * self.dtype.itemsize

  def __repr__(self) -> str:
    return f"{self.kind}:{self.name or '?'}[{self.size}]{self.dtype.name}"


@dataclass(frozen=True)
class StepGuard:
  """A stage made by one step of a recurrence over a ranged dim (frontends/onnx_ops_rnn.py _run_steps), which the run
  makes only where the recurrence's length at its size passes the step: the length at the bound, the step."""

  length: int
  step: int


@dataclass(eq=False)
class Kernel:
  name: str
  ast: UOp  # STORE(DEFINE_GLOBAL(0), index, value) over RANGEs and ACCUMULATEs
  bufs: list[Buffer]  # argument slot -> buffer; slot 0 is written
  shape: tuple[int, ...]  # the stored tensor's shape
  # a recurrence's step over a ranged dim: run only where the run's length passes it (scheduler/runtime_extent.py)
  step: StepGuard | None = None

  @property
  def out(self) -> Buffer:
    return self.bufs[0]


@dataclass
class Schedule:
  kernels: list[Kernel]
  inputs: list[Buffer]
  outputs: list[Buffer]
  consts: list[Buffer] = field(default_factory=list)
  scratch: list[Buffer] = field(default_factory=list)
  # inputs and outputs of a narrow type (aot/core/dtype.py: NARROW) by name: (type name, logical shape); their buffers
  # hold its codes or packed bytes
  formats: dict = field(default_factory=dict)
  # sequence and optional inputs and outputs (frontends/onnx_ops_sequence.py): {name, kind, side, start, count} each
  containers: list = field(default_factory=list)
  # a dim with a range, run as a loop over one-item runs (frontends/batch_dims.py BatchDim); None: a static artifact
  batch: object = None
  # a dim with a range whose loops run to the size a run is given (frontends/extent_dims.py; BatchDim, "extent")
  extent: object = None
  # the index checks the run makes after its kernels (aot/core/ir.py: IndexCheck)
  checks: list[IndexCheckCall] = field(default_factory=list)
  # a ranged dim's items each keep their scratch apart (codegen/render/run_dims.py items_apart; set when rendered)
  items_apart: bool = True
  # ... but for these, by buffer id: their one place in the arena, shared by all items (run_dims.plan_items)
  items_share: dict = field(default_factory=dict)
  # model inputs that are indices (checked or not: GPU targets drop the checks), by name: the smallest axis' size
  indexed: dict[str, int] = field(default_factory=dict)
  # inputs and outputs copied to and from the arena at a dim's bound (codegen/render/run_dims.py Staged; set when
  # rendered)
  staged: list = field(default_factory=list)


@dataclass
class IndexCheckCall:
  """An index check as scheduled: a kernel writes its check tensor (int64 [first bad position or numel, value]) to
  buffer, kind "check", which the run reads after its kernels."""

  buffer: Buffer
  check: IndexCheck
