"""The runtime's int8 microkernel (runtime_c/aot_qgemm.c) as model.c calls it: one int8 contraction (QGemm, the
fields of aot_qgemm, which codegen/lower/quant.py finds), its call, and the lowering of a kernel made of them."""

from __future__ import annotations

from dataclasses import dataclass

from aot.codegen.lower.calls import Call, CallContext, CallInfo, Lowered, distinct_bytes
from aot.codegen.lower.qpool import QIm2col
from aot.core.ir import UOp


@dataclass
class QGemm:
  """One int8 contraction as aot_qgemm computes it, over a kernel's buffer slots."""

  M: int
  N: int
  K: int
  a_slot: int
  a_offset: int
  lda: int
  a_signed: bool
  a_zero: int
  b_slot: int  # packed weights; col_sum, bias (or None), scale (None: int32 out): their own slots
  col_sum_slot: int
  bias_slot: int | None
  scale_slot: int | None
  scale_step: int
  out_type: int
  out_zero: int
  ldc: tuple[int, int]
  dense: UOp | None  # the kernel writing A as a dense [M][K] byte matrix into a_slot, unless A is a view
  c_slot: int = 0  # where the requantized result goes: the output, or a scratch the epilogue reads
  k_major: bool = False  # A lies as [K][M] (lda its k stride), not [M][K]
  zero_slot: int | None = None  # A's zero point computed at run time: a 1-element int32 scratch that zero writes
  zero: UOp | None = None
  im2col: QIm2col | None = None  # the runtime writes the dense A instead (an 8-bit convolution's input)
  c_offset: int = 0  # C's first element in c_slot (one image's contraction of a batch)

  @property
  def tasks(self) -> int:
    return -(-self.M // 64) * -(-self.N // 128)

  @property
  def work(self) -> int:
    return self.M * self.N * self.K


@dataclass(kw_only=True)
class QGemmCall(Call):
  """aot_qgemm over the kernel's buffers (rendered into model.c beside GemmCall)."""

  q: QGemm
  bufs: list
  # the bound of a dim run to a size given at run time (aot/scheduler/runtime_extent.py; 0: none): an M of that size
  # is the run's, e_ in model.c (codegen/lower/stage.py lower_runtime_sized)
  bound: int = 0

  @property
  def tasks(self) -> int:
    return self.q.tasks

  def describe(self, kernel: str) -> CallInfo:
    q = self.q
    nbytes = distinct_bytes(self.bufs[s] for s in (q.a_slot, q.b_slot, q.c_slot))
    flops = 2 * q.M * q.N * q.K
    return CallInfo(
      kernel, "aot_qgemm_run", self.role, "int8 microkernel", flops, nbytes, [1, q.M, q.N, q.K], self.parallel, q.tasks
    )

  def render(self, arg, tramps: dict[str, str]) -> str:
    q, b = self.q, self.bufs
    ptr = lambda ty, s: f"(const {ty} *){arg(b[s], s)}" if s is not None else "NULL"
    c = f"({arg(b[q.c_slot], q.c_slot)} + {q.c_offset})" if q.c_offset else arg(b[q.c_slot], q.c_slot)
    rows = "(int)e_" if self.bound and q.M == self.bound else str(q.M)
    desc = (
      f"{rows}, {q.N}, {q.K}, (const uint8_t *){arg(b[q.a_slot], q.a_slot)} + {q.a_offset}, {q.lda}, "
      f"{int(q.a_signed)}, {q.a_zero}, (const int8_t *){arg(b[q.b_slot], q.b_slot)}, "
      f"{ptr('int32_t', q.col_sum_slot)}, {ptr('int32_t', q.bias_slot)}, {ptr('float', q.scale_slot)}, "
      f"{q.scale_step}, {q.out_type}, {q.out_zero}, (void *){c}, {q.ldc[0]}, "
      f"{q.ldc[1]}, 0, {int(q.k_major)}, {ptr('int32_t', q.zero_slot)}"
    )
    run = (
      # the thread count splits the task grid into regions, one per slice (aot_qgemm.slices)
      "g.slices = aot_pool_threads(m->pool); aot_parallel(m->pool, aot_qgemm_run, &g, aot_qgemm_tasks(&g))"
      if self.parallel
      else "aot_qgemm_run(&g, 0, aot_qgemm_tasks(&g))"
    )
    if q.im2col is None:
      return f"  {{ aot_qgemm g = {{{desc}, NULL}}; {run}; }}"
    # A from the convolution's planes where the runtime reads them itself (its im2col call then skipped)
    planes = q.im2col.call(b, False, "operand").initializer(arg)
    desc += ", aot_qgemm_reads_plane(&plane) ? &plane : NULL"
    return f"  {{ aot_qim2col plane = {{{planes}}}; aot_qgemm g = {{{desc}}}; {run}; }}"


@dataclass
class QGemmLowered(Lowered):
  """A kernel whose int8 contractions run on the runtime's int8 microkernel: each after what writes its A (a zero
  point computed at run time, a generated dense copy or the runtime's im2col), then the epilogue reading their
  results (pieces: it, else A's copy; none for a bare matmul read in place)."""

  runtime_sources = {
    "aot_qgemm.c": ("aot_qgemm_run", "aot_qgemm_tasks", "aot_qgemm_reads_plane"),
    "aot_qim2col.c": ("aot_qim2col_run",),
  }

  qgemms: list[QGemm]
  epilogue: UOp | None  # the kernel reading their results

  runtime_entry = "aot_qgemm_run"

  def functions(self) -> dict[UOp, str]:
    names = super().functions()
    for i, q in enumerate(self.qgemms):
      if q.dense is not None:
        names.setdefault(q.dense, f"_dense{i}")
      if q.zero is not None:
        names.setdefault(q.zero, f"_zero{i}")
    return names

  def calls(self, ctx: CallContext) -> list[Call]:
    bufs, calls = self.kernel.bufs, []
    for q in self.qgemms:
      # a zero point computed at run time first: A's copy and the microkernel read it
      if q.zero is not None:
        calls.append(ctx.loop(q.zero, bufs, bufs[q.zero_slot], "operand"))
      if q.dense is not None:
        calls.append(ctx.loop(q.dense, bufs, bufs[q.a_slot], "operand"))
      if q.im2col is not None:
        calls.append(q.im2col.call(bufs, ctx.parallel(q.im2col.tasks, q.M * q.K), "operand"))
      parallel = ctx.parallel(q.tasks, q.work)
      calls.append(QGemmCall(q=q, bufs=bufs, role="int8 contraction", parallel=parallel, bound=ctx.bound))
    if self.epilogue is not None:
      calls.append(ctx.loop(self.epilogue, bufs, bufs[0], "epilogue", rebase=True))
    return calls
