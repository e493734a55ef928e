"""Depthwise convolutions to the runtime's direct kernel (runtime_c/aot_direct.c), not to the microkernel.

A depthwise convolution (groups = channels) is a contraction whose batch is the plane (image x channel), whose
constant side has one row (M = 1: the plane's own filter) and whose K is the window (kh, kw): as a GEMM it fills one
of the microkernel's MR rows, spends its time on K = 9 packing and needs an im2col copy of its input first (in
MobileNetV2-like blocks it was ~15x slower than onnxruntime). The direct kernel reads the input where it lies, a
band of rows at a time, and keeps output segments in vector registers across the window's taps.

The shape is recognised from the contraction, not from the ONNX op: the runtime side must be one gated load at an
index linear in (oh, ow, kh, kw) with unit column stride plus any function of the plane (a table of plane starts:
a channel shuffle, a channel multiplier), and its gate must be exactly "inside an H x W plane" (checked by
evaluating it over its grid), which is what padding leaves. Anything else stays on codegen/lower/contract.py.
The kernel's remaining work (bias, batch norm, activation, residual add) is its epilogue kernel: applied by the
kernel to each output in registers before the store where it is a chain of adds, multiplies, max and min
(contract.fused_steps, as the microkernel applies its own), else called on each run of tasks a thread takes right
after computing their planes (they are still in cache). Threads take the tasks from a shared counter, so a thread
kept off its core holds up only the few it took last."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from aot.codegen.lower.calls import (
  Call,
  CallContext,
  CallInfo,
  LoopCall,
  Lowered,
  copies_in_place,
  distinct_bytes,
  trampoline,
)
from aot.codegen.lower.contract import (
  Contraction,
  Step,
  epilogue_kernel,
  evaluate_operand,
  find_contractions,
  fused_steps,
  result_index,
)
from aot.codegen.lower.microkernel import render_steps
from aot.codegen.lower.window import Window, padded_window, runtime_load
from aot.codegen.render.linearize import flop_count
from aot.core.dtype import dtypes
from aot.core.interpret import evaluate_grid
from aot.core.ir import Ops, UOp, prod, ranges_of
from aot.core.rewrite import graph_rewrite, substitute
from aot.core.symbolic import linear, pm_simplify

# the window sizes the direct kernel takes (taps per side): past 7x7 a window is a real reduction, left to the GEMM
MAX_WINDOW = 7
# strides it takes (each is a phase of the padded band)
MAX_STRIDE = 4
# floats of the runtime's stack band buffer (AOT_DEPTHWISE_BUFFER in runtime_c/aot_direct.h)
BAND_BUFFER = 8192
# the vector width the band's rows are padded to (16 floats with AVX-512; a multiple of AVX2's 8)
BAND_VECTOR = 16
# the most steps of a fused epilogue (AOT_DEPTHWISE_MAX_STEPS)
MAX_STEPS = 8


@dataclass(frozen=True)
class Depthwise:
  """One depthwise convolution as the runtime computes it (the fields of aot_depthwise)."""

  c: Contraction
  x_slot: int
  images: int  # planes per filter (batch images, which the filter does not vary with)
  x_row: int
  win: Window
  w_slot: int  # the filters, [planes][KH][KW]
  planes_slot: int  # x_planes, the table of where each plane starts (int32 bits in a constant)
  result: int  # slot of [planes][OH][OW]: the output itself, or a scratch buffer
  tasks: int  # planes are split into this many tasks, an epilogue call after each run of them a thread takes
  fused: bool  # the epilogue runs after each task (its outermost loop is the tasks')
  # the epilogue as steps the kernel applies to each output before storing it (then no epilogue call), as the
  # microkernel does (contract.fused_steps): a generated epilogue over 7x7 or 14x14 planes took as long as the
  # convolution (its rows are too short to vectorise)
  steps: tuple[Step, ...] = ()
  # C's row stride and offset as contract.fused_steps reads them of a Gemm: the result is [planes][OH][OW] from 0
  ldc = 0
  result_offset = 0
  # an input row's column step (1 but for a channels-last input: the channels')
  x_col: int = 1

  # planes per filter side's batch entry: the images, times the filters per input channel (a channel multiplier's m)
  @property
  def planes(self) -> int:
    return self.c.B * self.c.a.size * self.images

  @property
  def work(self) -> int:
    return self.planes * self.win.taps


def _multiplier_rows(c: Contraction) -> tuple[UOp, ...] | None:
  """The ranges a filter side may have as rows: none, or with a channel multiplier (output channel o reads input
  channel o // m) the filter index o % m of the output channel split into (group, filter): () when there is no
  such split, None when the contraction is a slice or some other split of the kernel's ranges."""
  if c.bounds:
    return None
  if not c.back:
    return ()
  back = dict(c.back)
  if len(back) != 2:
    return None
  outer, inner = sorted(back, key=lambda r: r.number)
  q, r = back[outer], back[inner]
  # the split of one kernel range o into (o // m, o % m), its group the whole batch (a task over o then owns the
  # planes (o // m, o % m, images), which lie together)
  if not (
    q.op is Ops.IDIV
    and r.op is Ops.MOD
    and q.src[0] is r.src[0]
    and r.src[0].op is Ops.RANGE
    and q.src[1].op is Ops.CONST
    and q.src[1].arg == inner.size == r.src[1].arg
    and c.batch == (outer,)
  ):
    return None
  return (inner,)


def match_depthwise(c: Contraction, bufs: list) -> dict | None:
  """The direct kernel's geometry for a contraction that is a depthwise convolution, else None."""
  allowed = _multiplier_rows(c)
  if allowed is None:
    return None
  sides = [s for s in (c.a, c.b) if set(s.rows) <= set(allowed)]
  if not c.batch or len(sides) != 1 or len(c.k) != 2:
    return None
  filt = sides[0]
  image = c.b if filt is c.a else c.a
  if len(image.rows) < 2:
    return None
  if any(bufs[u.src[0].arg].kind != "const" for u in filt.expr.toposort() if u.op is Ops.LOAD):
    return None
  found = runtime_load(image.expr)
  if found is None:
    return None
  load, gates = found
  if bufs[load.src[0].arg].kind == "const":
    return None
  terms, offset = linear(load.src[1])
  # rows before (oh, ow) are images (a batch the filter does not vary with)
  *extra, oh, ow = image.rows
  # planes in the result's order: batch (group), the filter's rows (a multiplier's filters), images
  planes_of = (*c.batch, *filt.rows, *extra)
  # terms in the plane's ranges only may be anything (a channel shuffle's divisions): the plane's offset is a table
  plane_terms = {t: k for t, k in terms.items() if ranges_of(t) <= set(planes_of)}
  terms = {t: k for t, k in terms.items() if t not in plane_terms}
  if any(t.op is not Ops.RANGE for t in terms):
    return None
  geometry = _geometry(terms, c.k, oh, ow)
  if geometry is None:
    return None
  kh, kw, x_row, x_col, SH, SW, DH, DW = geometry
  KH, KW, OW = kh.size, kw.size, ow.size
  if max(KH, KW) > MAX_WINDOW or not 1 <= SH <= MAX_STRIDE or not 1 <= SW <= MAX_STRIDE:
    return None
  win = padded_window(gates, oh, kh, ow, kw, SH, SW, DH, DW)
  # spread columns are a channels-last input's: the planes lie between them, and a row's end before the next row
  # starts (else kh and kw are the other way round, or the window strided and dilated in a plane of its own)
  if win is None or (x_col > 1 and (x_col * win.W > x_row or not all(0 < k < x_col for k in plane_terms.values()))):
    return None
  PH, PW = win.PH, win.PW
  # each plane's first element: the index at padded position (PH, PW), planes in the result's order (filter, image)
  shift = np.zeros([r.size for r in planes_of], np.int64) + offset + PH * x_row + PW * x_col
  for t, k in plane_terms.items():
    shift = shift + k * evaluate_grid(t, list(planes_of)).astype(np.int64)
  if shift.min() < 0 or shift.max() >= 1 << 31:
    return None
  # one band of the plane's rows must fit the runtime's buffer
  phase = -(-OW // BAND_VECTOR) * BAND_VECTOR + (KW - 1) * DW // SW
  if ((KH - 1) * DH + 1) * SW * phase > BAND_BUFFER:
    return None
  return dict(
    filt=filt,
    kh=kh,
    kw=kw,
    x_slot=load.src[0].arg,
    x_planes=shift.reshape(-1).astype(np.int32),
    images=prod(r.size for r in extra),
    extra=extra,
    x_row=x_row,
    x_col=x_col,
    win=win,
  )


def _geometry(terms: dict, k, oh: UOp, ow: UOp) -> tuple | None:
  """(kh, kw, x_row, x_col, SH, SW, DH, DW) of a window read at terms (linear): kw the window range with unit stride
  (the row's columns) and kh the other; or, at stride 1, a dilated window (atrous: DeepLab's and LRASPP's backbones),
  kw the range with the shorter step; or a channels-last input's (ConvNeXt's 7x7 depthwise convs read the layer
  norm's [H][W][C] output), its columns x_col apart and kw the range with the shorter step. None when the terms are no
  such window."""
  ka, kb = k
  kh, kw = (ka, kb) if terms.get(kb) == 1 else (kb, ka) if terms.get(ka) == 1 else (None, None)
  if set(terms) - {oh, ow, *k}:
    return None
  if kh is not None:
    x_row = terms.get(kh, 0)
    if x_row <= 0 or terms.get(ow, 0) <= 0 or terms.get(oh, 0) % x_row:
      return None
    return kh, kw, x_row, 1, terms.get(oh, 0) // x_row, terms[ow], 1, 1
  kh, kw = sorted(k, key=lambda r: terms.get(r, 0), reverse=True)
  x_row, step_h, x_col, step_w = terms.get(oh, 0), terms.get(kh, 0), terms.get(ow, 0), terms.get(kw, 0)
  if min(x_row, step_h, x_col, step_w) <= 0:
    return None
  # channels-last: the window's steps are the input's (stride s: the output's are s times them)
  if x_col > 1 and not x_col % step_w and not x_row % step_h:
    return kh, kw, step_h, step_w, x_row // step_h, x_col // step_w, 1, 1
  # dilated, at stride 1: the output row's step is the input row's (the kernel then reads x_row * (oh + kh * DH) +
  # ow * x_col + kw * DW * x_col, the load's own index, wherever its gates hold: padded_window checks them over the
  # whole grid)
  if step_w % x_col or not 1 < step_w // x_col < x_row or step_h % x_row:
    return None
  return kh, kw, x_row, x_col, 1, 1, step_h // x_row, step_w // x_col


def lower_depthwise(ast: UOp, bufs: list, make_buffer) -> tuple[UOp, list, list[Depthwise]] | None:
  """(the epilogue kernel, the kernel's buffers with new slots appended, its depthwise convolution) when the kernel's
  one contraction is a depthwise convolution, else None (codegen/lower/contract.py then takes it). make_buffer as in
  lower_contractions."""
  found = find_contractions(ast, (1, 1))
  if len(found) != 1 or any(u.op is Ops.ACCUMULATE and u is not found[0].acc for u in ast.toposort()):
    return None
  c = found[0]
  # the direct kernel's planes and tasks are the kernel's own loops: a contraction over a slice or a split of them
  # (a concat's branch, a grouped range) stays on the microkernel, except a channel multiplier's split of the
  # output channel (match_depthwise)
  if (g := match_depthwise(c, bufs)) is None:
    return None
  filt = g.pop("filt")
  extra = g.pop("extra")
  # the filter side evaluated as [planes][KH][KW]: k ordered (kh, kw)
  c = Contraction(c.acc, c.batch, (g.pop("kh"), g.pop("kw")), filt, c.b if filt is c.a else c.a, c.back)
  bufs = list(bufs)
  w = evaluate_operand(
    c, filt, 1, {u.src[0].arg: bufs[u.src[0].arg].data for u in filt.expr.toposort() if u.op is Ops.LOAD}
  )
  bufs.append(make_buffer("const", w.reshape(-1, c.K)))
  w_slot = len(bufs) - 1
  bufs.append(make_buffer("const", g.pop("x_planes").view(np.float32)))
  planes_slot = len(bufs) - 1
  in_place = (
    ast.op is Ops.STORE
    and bufs[0].dtype == dtypes.float32
    and linear(graph_rewrite(substitute(result_index(c), dict(c.back)), pm_simplify)) == linear(ast.src[1])
  )
  if in_place:
    result = 0
  else:
    bufs.append(make_buffer("scratch", c.B * c.a.size * c.b.size))
    result = len(bufs) - 1
  # a task is one iteration of the kernel's outermost loop when that is the first batch range (or the output channel
  # a multiplier splits, whose iterations are each one batch entry's filter): the epilogue then runs on the task's
  # planes after it; else each plane is a task and the epilogue runs after all
  first = dict(c.back).get(c.batch[0], c.batch[0])
  first = first.src[0] if first.op is Ops.IDIV else first
  fused = first.number == 0
  tasks = first.size if fused else c.B * c.a.size * prod(r.size for r in extra)
  last = epilogue_kernel(ast, {c.acc: (c, result, 0)})
  d = Depthwise(c, w_slot=w_slot, planes_slot=planes_slot, result=result, tasks=tasks, fused=fused, **g)
  # steps over a multiplier's split channel would index the kernel's channel, not the contraction's ranges
  steps = None if c.back else fused_steps(last, d)
  if steps and len(steps) <= MAX_STEPS and all(s.slot is None or s.strides[2] in (0, 1) for s in steps):
    d = replace(d, steps=steps)
  return last, bufs, [d]


@dataclass(kw_only=True)
class DepthwiseCall(Call):
  """A depthwise convolution run by the runtime's direct kernel over the kernel's buffers; epilogue: the call of the
  epilogue kernel it runs after each task's planes, when fused."""

  d: Depthwise
  bufs: list
  epilogue: LoopCall | None
  contract: bool = False  # the c target: as GemmCall.contract

  @property
  def tasks(self) -> int:
    return self.d.tasks

  def render(self, arg, tramps: dict[str, str]) -> str:
    d, b = self.d, self.bufs
    epilogue, pointers = "NULL, NULL", ""
    if self.epilogue is not None:
      fargs = self.epilogue.args
      pointers = f"void *a[] = {{{', '.join(f'(void *){arg(buf, s)}' for s, buf in fargs)}}}; "
      epilogue = f"{trampoline(tramps, self.epilogue.fn, fargs)}, a"
    w = d.win
    desc = (
      f"{arg(b[d.x_slot], d.x_slot)}, (const int *){arg(b[d.planes_slot], d.planes_slot)}, {d.images}, "
      f"{d.x_row}, {w.H}, {w.W}, "
      f"{arg(b[d.w_slot], d.w_slot)}, {w.KH}, {w.KW}, {w.SH}, {w.SW}, {w.PH}, {w.PW}, "
      f"(float *){arg(b[d.result], d.result)}, {w.OH}, {w.OW}, {d.planes}, {d.tasks}, {epilogue}"
    )
    if (w.DH, w.DW) != (1, 1):
      desc += f", .DH = {w.DH}, .DW = {w.DW}"
    if d.x_col != 1:
      desc += f", .x_col = {d.x_col}"
    steps = render_steps(d.steps, self.contract, lambda slot: arg(b[slot], slot))
    if d.steps:
      desc += f", .steps = s, .nsteps = {len(d.steps)}, .filters = {d.c.a.size}"
    run = (
      "aot_parallel(m->pool, aot_depthwise_run, &d, d.tasks)" if self.parallel else "aot_depthwise_run(&d, 0, d.tasks)"
    )
    return f"  {{ {pointers}{steps}aot_depthwise d = {{{desc}}}; {run}; }}"

  def describe(self, kernel: str) -> CallInfo:
    d, e = self.d, self.epilogue
    used = [self.bufs[s] for s in (d.x_slot, d.w_slot, d.planes_slot, d.result)] + [b for _, b in (e.args if e else [])]
    used += [self.bufs[s.slot] for s in d.steps if s.slot is not None]
    flops = 2 * d.work + (flop_count(e.ast) if e else 0) + len(d.steps) * d.planes * d.win.OH * d.win.OW
    return CallInfo(
      kernel, "aot_depthwise_run", self.role, "direct", flops, distinct_bytes(used), None, self.parallel, d.tasks
    )


@dataclass
class DirectLowered(Lowered):
  """A kernel whose one contraction is a depthwise convolution on the direct kernel, then its epilogue (pieces: the
  one epilogue kernel), after each task's planes when their loops agree."""

  convs: list[Depthwise]

  runtime_sources = {"aot_direct.c": ("aot_depthwise_run", "aot_depthwise_band_rows")}

  def calls(self, ctx: CallContext) -> list[Call]:
    bufs, calls = self.kernel.bufs, []
    (last,) = self.pieces
    epilogue = None if copies_in_place(last) else ctx.loop(last, bufs, bufs[0], "epilogue")
    for d in self.convs:
      # an epilogue the kernel applies as steps is not run
      after = None if d.steps else epilogue
      fused = after is not None and d.fused and after.extent == d.tasks
      parallel = ctx.parallel(d.tasks, d.work)
      contract = ctx.target == "c"
      calls.append(
        DepthwiseCall(
          d=d, bufs=bufs, epilogue=after if fused else None, role="depthwise", parallel=parallel, contract=contract
        )
      )
      if not fused and after is not None:
        calls.append(after)
    return calls
