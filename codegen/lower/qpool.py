"""8-bit max pools to the runtime's pool (aot_qpool in runtime_c/aot_qpool.c), not to a generated loop.

A max pool over uint8 or int8 planes (QOperator's MaxPool, QDQ's once fused to one) is, as a generated loop, a max
over the window's gated taps at the pool's stride: the compilers vectorise it as byte inserts or not at all
(ResNet-18's 3x3/2 pool over 64x112x112 ran at 4 GB/s, 0.51 ms). The runtime's pool is separable and runs along
contiguous bytes (0.10 ms). Integer max has no NaN to propagate, so skipping the padding is exact.

The shape is recognised from the kernel, as codegen/lower/direct.py recognises a depthwise convolution: a MAX of one
gated 8-bit load over two window ranges, at an index linear in (planes, oh, ow, kh, kw) with unit steps along the window
and the plane's row, whose gate is exactly "inside an H x W plane" (checked by evaluating it over its grid). What
the kernel does with the pooled bytes (a dequantization) is an epilogue kernel reading them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from aot.codegen.lower.calls import Call, CallContext, CallInfo, Lowered, distinct_bytes
from aot.codegen.lower.window import Window, padded_window
from aot.core.dtype import dtypes
from aot.core.ir import Ops, ReduceOp, UOp, flat_of, prod, ranges_of
from aot.core.rewrite import graph_rewrite, substitute
from aot.core.symbolic import flat_stride, linear, pm_simplify
from aot.scheduler.kernel import Buffer

# bytes of the runtime's row buffer (AOT_QPOOL_ROW in runtime_c/aot_qpool.h), less the vector read past a row's end
ROW_BUFFER = 4096 - 64
# windows wider than this are reductions to leave to the generated loop (a global pool's)
MAX_WINDOW = 16

# (the runtime's im2col writes A at every stride, 1 too: in ResNet-18's QDQ run, thread CPU, clang-19, the generated
# stride-1 copy against the runtime's: 3x3/1 over 64x56x56 0.069 vs 0.035 ms, 256x14x14 0.14 vs 0.031, 512x7x7 0.054
# vs 0.036; before its padded-plane buffer and one-vector rows, the runtime's was the slower at stride 1: medians of
# 41 calls, before -> after, 3x3/1 over 64x56x56 0.074 -> 0.026, 512x7x7 0.068 -> 0.028, 3x3/2 over 256x14x14
# 0.065 -> 0.019)

_SIGNED = {dtypes.uint8: False, dtypes.int8: True}


@dataclass
class QPool:
  """One 8-bit max pool as aot_qpool_run computes it (the fields of aot_qpool), over a kernel's buffer slots."""

  x_slot: int
  x_offset: int
  x_plane: int
  x_row: int
  x_signed: bool
  win: Window
  y_slot: int
  y_offset: int
  y_plane: int
  y_row: int
  planes: int

  @property
  def tasks(self) -> int:
    return self.planes

  @property
  def work(self) -> int:
    return self.planes * self.win.taps

  def call(self, bufs: list, parallel: bool, role: str) -> RuntimeCall:
    p, w = self, self.win
    desc = (
      f"(const uint8_t *){{x}} + {p.x_offset}, {p.x_plane}, {p.x_row}, {w.H}, {w.W}, {int(p.x_signed)}, {w.KH}, "
      f"{w.KW}, {w.SH}, {w.SW}, {w.PH}, {w.PW}, 1, 1, (uint8_t *){{y}} + {p.y_offset}, {p.y_plane}, {p.y_row}, "
      f"{w.OH}, {w.OW}, {p.planes}"
    )
    slots = {"x": self.x_slot, "y": self.y_slot}
    return RuntimeCall(
      name="aot_qpool",
      desc=desc,
      slots=slots,
      count=p.planes,
      bufs=bufs,
      path="int8 pool",
      role=role,
      parallel=parallel,
    )


@dataclass(kw_only=True)
class RuntimeCall(Call):
  """A call of one of the runtime's 8-bit routines (NAME_run over an aot_NAME descriptor whose text desc names the
  kernel's buffers {name}: slots, in count tasks), rendered into model.c beside QGemmCall; path for the profile."""

  name: str
  desc: str
  slots: dict
  count: int
  bufs: list
  path: str
  when: str = ""  # a C condition on the descriptor p: the call runs only where it holds

  @property
  def tasks(self) -> int:
    return self.count

  def describe(self, kernel: str) -> CallInfo:
    nbytes = distinct_bytes(self.bufs[s] for s in self.slots.values())
    return CallInfo(kernel, f"{self.name}_run", self.role, self.path, 0, nbytes, None, self.parallel, self.tasks)

  def render(self, arg, tramps: dict[str, str]) -> str:
    run = f"{self.name}_run(&p, 0, {self.tasks})"
    if self.parallel:
      run = f"aot_parallel(m->pool, {self.name}_run, &p, {self.tasks})"
    if self.when:
      run = f"if ({self.when}) {run}"
    return f"  {{ {self.name} p = {{{self.initializer(arg)}}}; {run}; }}"

  def initializer(self, arg) -> str:
    """The descriptor's fields, its buffers named by arg (the renderer's)."""
    return self.desc.format(**{n: arg(self.bufs[s], s) for n, s in self.slots.items()})


@dataclass
class PoolLowered(Lowered):
  """A kernel whose one reduction is an 8-bit max pool on the runtime's pool, then the kernel reading the pooled
  bytes (pieces: it, or none when the pool writes the output itself)."""

  pools: list[QPool]

  runtime_sources = {"aot_qpool.c": ("aot_qpool_run",)}

  # (the name an int8 kernel with no generated function has reported since the pool shared the int8 path)
  runtime_entry = "aot_qgemm_run"

  def calls(self, ctx: CallContext) -> list[Call]:
    bufs = self.kernel.bufs
    calls: list[Call] = [p.call(bufs, ctx.parallel(p.tasks, p.work), "int8 pool") for p in self.pools]
    return calls + [ctx.loop(e, bufs, bufs[0], "epilogue") for e in self.pieces]


def _window(acc: UOp, bufs: list) -> dict | None:
  """The pool's geometry of an 8-bit MAX accumulate over a window of one gated load, else None."""
  if acc.arg is not ReduceOp.MAX or acc.dtype not in _SIGNED or len(acc.src) != 3:
    return None
  # the gates' else is the type's minimum, the max's identity: a padded tap is one skipped
  expr, gates, low = acc.src[0], [], np.iinfo(acc.dtype.np).min
  while expr.op is Ops.WHERE and expr.src[2].op is Ops.CONST and expr.src[2].arg == low:
    gates.append(expr.src[0])
    expr = expr.src[1]
  # (an int8 tap gated to 0, a zero padding's, is a value, not one skipped: not a pool's window)
  if expr.op is not Ops.LOAD or expr.dtype != acc.dtype:
    return None
  load = expr
  if not (load.src[2].op is Ops.CONST and load.src[2].arg is True):
    gates.append(load.src[2])
  rows = sorted(ranges_of(acc) - set(acc.src[1:]), key=lambda r: r.number)
  terms = linear(load.src[1])[0]
  if len(rows) < 2:
    return None
  *planes, oh, ow = rows
  ka, kb = acc.src[1:]
  # kw is the window range with unit stride (the row's columns), kh the other (no dilation)
  kh, kw = (ka, kb) if terms.get(kb) == 1 else (kb, ka) if terms.get(ka) == 1 else (None, None)
  if kh is None or max(kh.size, kw.size) > MAX_WINDOW:
    return None
  g = window_geometry(load, gates, planes, oh, ow, kh, kw)
  if g is None or not _fits(g["win"]):
    return None
  return dict(load=load, rows=rows, x_signed=_SIGNED[acc.dtype], planes=prod(r.size for r in planes), **g)


def window_geometry(load: UOp, gates: list[UOp], planes, oh: UOp, ow: UOp, kh: UOp, kw: UOp) -> dict | None:
  """The window's geometry of a load at planes x (oh * SH + kh - PH) x (ow * SW + kw - PW) of H x W planes (a
  pool's or a convolution's input), whose gates are exactly "inside the plane": the fields of aot_qpool and
  aot_qim2col, else None."""
  terms, offset = linear(load.src[1])
  # a window one wide or one high may come as a one-long range the index does not name: kw then at unit step, kh at
  # the output row's (a stride of 1 over rows SH apart)
  unit_kw = 1 if kw.size == 1 else 0
  if any(t.op is not Ops.RANGE for t in terms) or set(terms) - {*planes, oh, ow, kh, kw} or terms.get(kw, unit_kw) != 1:
    return None
  x_row, SW = terms.get(kh, terms.get(oh, 0) if kh.size == 1 else 0), terms.get(ow, 0)
  if x_row <= 0 or SW <= 0 or terms.get(oh, 0) <= 0 or terms[oh] % x_row:
    return None
  x_plane = flat_stride(planes, terms)
  if x_plane is None or (planes and x_plane <= 0 and prod(r.size for r in planes) > 1):
    return None
  win = padded_window(gates, oh, kh, ow, kw, terms[oh] // x_row, SW)
  if win is None:
    return None
  # the first plane's element (0, 0)
  x_offset = offset + win.PH * x_row + win.PW
  if x_offset < 0 or win.W > x_row:
    return None
  return dict(x_offset=x_offset, x_plane=x_plane, x_row=x_row, win=win)


def _fits(w: Window) -> bool:
  """Does a row with its padding fit the runtime's row buffer?"""
  return max((w.OW - 1) * w.SW + w.KW, w.PW + w.W) <= ROW_BUFFER


def lower_qpool(ast: UOp, bufs: list):
  """(the kernel's buffers with new slots appended, the buffers made for them, its QPool, the kernel reading the
  pooled bytes or None) when the kernel's one reduction is an 8-bit max pool, else None."""
  if ast.op is not Ops.STORE:
    return None
  accs = [u for u in ast.src[2].toposort() if u.op is Ops.ACCUMULATE]
  if len(accs) != 1 or (g := _window(accs[0], bufs)) is None:
    return None
  acc, load, rows = accs[0], g.pop("load"), g.pop("rows")
  *planes, oh, ow = rows
  bufs, made = list(bufs), []
  bare = ast.src[2] is acc and bufs[0].dtype == acc.dtype
  terms, offset = linear(ast.src[1])
  if bare and set(terms) == set(rows) and terms[ow] == 1 and offset >= 0:
    y_plane, y_row = flat_stride(planes, terms), terms[oh]
    if y_plane is not None and y_row >= g["win"].OW:
      return bufs, made, [QPool(load.src[0].arg, y_slot=0, y_offset=offset, y_plane=y_plane, y_row=y_row, **g)], None
  # else the pooled bytes go to a scratch [planes][OH][OW] that the rest of the kernel reads
  win = g["win"]
  bufs.append(b := Buffer("scratch", acc.dtype, g["planes"] * win.OH * win.OW, "qpool"))
  made.append(b)
  slot = len(bufs) - 1
  at = flat_of(rows)
  read = UOp(Ops.LOAD, acc.dtype, (UOp(Ops.DEFINE_GLOBAL, acc.dtype, (), slot), at, UOp.const(dtypes.bool, True)))
  pool = QPool(load.src[0].arg, y_slot=slot, y_offset=0, y_plane=win.OH * win.OW, y_row=win.OW, **g)
  return bufs, made, [pool], graph_rewrite(substitute(ast, {acc: read}), pm_simplify)


@dataclass
class QIm2col:
  """An 8-bit convolution's k-major A as aot_qim2col_run writes it (the fields of aot_qim2col), over a kernel's
  buffer slots."""

  x_slot: int
  x_offset: int
  x_plane: int
  x_row: int
  win: Window
  y_slot: int
  y_plane: int
  y_kh: int
  y_kw: int
  planes: int
  pad: int

  def call(self, bufs: list, parallel: bool, role: str) -> RuntimeCall:
    p, w = self, self.win
    desc = (
      f"(const uint8_t *){{x}} + {p.x_offset}, {p.x_plane}, {p.x_row}, {w.c_fields()}, "
      f"(uint8_t *){{y}}, {p.y_plane}, {p.y_kh}, {p.y_kw}, {w.OH}, {w.OW}, {p.planes}, {p.pad}"
    )
    # not where the contraction reads A from the planes itself (QGemmCall: the same descriptor)
    when = "!aot_qgemm_reads_plane(&p)"
    slots = {"x": p.x_slot, "y": p.y_slot}
    return RuntimeCall(
      name="aot_qim2col",
      desc=desc,
      slots=slots,
      count=p.tasks,
      bufs=bufs,
      path="copy",
      when=when,
      role=role,
      parallel=parallel,
    )

  @property
  def tasks(self) -> int:
    return self.planes * self.win.KH


def im2col(load: UOp, gates: list[UOp], m_rows, k, pad: int, x_slot: int, y_slot: int) -> QIm2col | None:
  """The runtime's im2col for a dense k-major A of an int8 convolution over one image (m the output's (oh, ow), k
  its (c, kh, kw) in any order, or (c, kw) and (c, kh) where the window is one high or one wide), read from an 8-bit
  buffer inside its planes and pad elsewhere; else None."""
  if len(m_rows) != 2 or len(k) not in (2, 3):
    return None
  terms = linear(load.src[1])[0]
  kw = next((r for r in k if terms.get(r) == 1), None)
  rest = sorted((r for r in k if r is not kw), key=lambda r: terms.get(r, 0))
  # the window's missing range (1xK's kh, Kx1's kw, or one input plane's c) one long, numbered past the kernel's
  unit = UOp(Ops.RANGE, dtypes.index, (), (1 + max(r.number for r in ranges_of(load) | {*k, *m_rows}), 1, "reduce"))
  if len(k) == 3 and kw is not None:
    candidates = [(rest[1], rest[0], kw)]
  elif len(k) == 2 and kw is not None:
    candidates = [(rest[0], unit, kw), (unit, rest[0], kw)]
  elif len(k) == 2:
    candidates = [(rest[1], rest[0], unit)]
  else:
    return None
  oh, ow = m_rows
  for c, kh, kw in candidates:
    g = window_geometry(load, gates, [c], oh, ow, kh, kw)
    if g is not None and _fits(g["win"]):
      break
  else:
    return None
  # A's row of tap (c, kh, kw) is its flat index over k (in k's order) times M (a one-long range is at 0)
  M, stride = oh.size * ow.size, {}
  for r in reversed(k):
    stride[r] = M
    M *= r.size
  return QIm2col(
    x_slot,
    **g,
    y_slot=y_slot,
    y_plane=stride.get(c, 0),
    y_kh=stride.get(kh, 0),
    y_kw=stride.get(kw, 0),
    planes=c.size,
    pad=pad & 0xFF,
  )
