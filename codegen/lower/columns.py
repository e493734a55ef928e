"""B's columns (codegen/lower/contract.py): where each lies in B and C, and the kernels that copy B out for the
microkernel, whole (dense_operand) or a panel at a time into a thread's buffer (panel_operand).

Columns lie row-major over B's rows at the bound's sizes, except where one row is a loop to a run-time size after
fixed ones (a feature map's rows over a text line's width): they are then compact, row-major at the run's size, so that
a run's columns are contiguous in the order the kernel reads and writes them, and a panel holds as many of the fixed
rows as fit at the run's width (CompactPanel)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from aot.core.dtype import dtypes
from aot.core.ir import Ops, UOp, flat_of, prod
from aot.core.rewrite import graph_rewrite, substitute
from aot.core.symbolic import pm_simplify

if TYPE_CHECKING:
  from aot.codegen.lower.contract import Contraction, Side

# an outermost loop shorter than this splits unevenly across threads
MIN_SPLIT = 16
# a B operand copied whole (im2col) is written out one panel of columns at a time instead when the whole copy is
# bigger than this: each task packs its panel into a buffer of its thread's and runs every row block over it while it
# sits in L2 (1 MiB per core here), rather than writing the whole matrix to memory and reading it back. What must sit
# there is one K slice of the panel (GEMM_KC rows: the microkernel walks K in slices), so a long K does not narrow the
# panel: VGG-19's 512x28x28 3x3 convs (K = 4608) ran in 1-row panels of 28 columns, each streaming all 9.4 MB of the
# weights past 28 columns, and run in 8-row panels of 224 now (a thread's buffer 0.6 -> 4.1 MB): 22.3 -> 20.3
# ms, 256x56x56 (K = 2304) 20.3 -> 18.1 ms (thread CPU time, interleaved; 37.0 -> 22.7 ms while the memory was busy)
PANEL_MAX_BYTES = 3 << 19
# K's slice in runtime_c/aot_gemm.c (KC)
GEMM_KC = 1024
# ... or when it is bigger than DENSE_SMALL and than DENSE_GROWTH times the runtime tensors it is copied from (a 5x5
# window matrix is 25x its input): a whole copy that many times an activation makes the arena a multiple of the model's
# tensors (MNIST's 5x5 conv: a 1.28 MB copy of a 74 KB input, the arena 19.9x the largest tensor), while its panels
# take one L2-sized buffer per thread, and are written and read there (SqueezeNet's stem, a 1.33 MB copy of a 0.6 MB
# input: 3% faster in panels, thread CPU time interleaved). Only where the panels fill the microkernel's tiles
# (PANEL_MIN_TILE_USE): a 13x13 image cut into 1-row panels wastes 60% of a 32-lane tile, 27x27 in 3-row panels 16%
# (SqueezeNet's 3x3 convs: 2% slower than whole copies, measured interleaved), and stays a whole copy.
DENSE_SMALL, DENSE_GROWTH, PANEL_MIN_TILE_USE = 1 << 18, 1, 0.9
# panels a B operand is cut into at least (when it can be), so threads have tasks to share
MIN_PANELS = 8
# a panel pays by being read by every row tile of A while it is in cache: with fewer rows than this (a depthwise
# convolution's M = 1 per channel) B is read once either way, and per-panel calls only add work (ShuffleNet: 2.58x
# -> 2.83x onnxruntime with panels)
MIN_PANEL_ROWS = 8
# a panel of compact columns (CompactPanel) holds as many of B's fixed rows as fit this much of a K slice at each
# call's width: PANEL_MAX_BYTES, the most a static panel takes, ran the CRNN over widths 32..640 (1 thread,
# interleaved) 1.8 / 2.6 / 0.4 / 6.7% slower at 32 / 160 / 331 / 640 (a 640-column panel where static compiles take
# 160), a quarter as fast as half but 3.1% slower at 160 (3 of 4 rows, then 1); the rows shared evenly, within 1%
COMPACT_PANEL_BYTES = PANEL_MAX_BYTES // 2


def _sized_at(rows: tuple[UOp, ...]) -> int | None:
  """Where the one loop to a run-time size among these rows is, when it comes after fixed ones (a feature map's rows
  before a text line's width); else None."""
  sized = [i for i, r in enumerate(rows) if r.runtime]
  return sized[0] if len(sized) == 1 and sized[0] > 0 else None


def compact_rows(rows: tuple[UOp, ...]) -> bool:
  """Are these rows' columns compact: row-major at the run's size (compact_columns)?"""
  return _sized_at(rows) is not None


def compact_size(rows: tuple[UOp, ...]) -> UOp:
  """The columns of compact rows (compact_rows) at the run's size."""
  at = _sized_at(rows)
  return prod(r.size for i, r in enumerate(rows) if i != at) * rows[at].extent


def compact_columns(rows: tuple[UOp, ...]) -> UOp:
  """The flat column of B's rows: row-major at the run's size where they are compact (compact_rows), so that B and C
  hold a run's columns contiguously, in the order the kernel reads and writes them; else row-major at the bound."""
  if (at := _sized_at(rows)) is None:
    return flat_of(rows)
  inner = prod(r.size for r in rows[at + 1 :])
  return (flat_of(rows[:at]) * rows[at].extent + rows[at]) * inner + flat_of(rows[at + 1 :])


def tile_use(m: int, n: int, tile: tuple[int, int]) -> float:
  """The fraction of the microkernel's tiles that holds real rows and columns (the rest is padding)."""
  return m / (-(-m // tile[0]) * tile[0]) * n / (-(-n // tile[1]) * tile[1])


def _unflat(flat: UOp, ranges) -> dict[UOp, UOp]:
  """Each range's value at a flat index; the modulo keeps the outermost in bounds past the end (padding rows)."""
  out, stride = {}, 1
  for r in reversed(ranges):
    out[r] = (flat // stride) % r.size
    stride *= r.size
  return out


def dense_operand(c: Contraction, side: Side, is_b: bool, rows: int) -> UOp:
  """A kernel writing a runtime operand out as a dense row-major matrix: A as [batch][rows][k], B as [batch][k][rows]
  (n contiguous, as the microkernel's vector loads want it), rows padded to whole tiles (left unwritten)."""
  # B's rows are written whole (n innermost: contiguous writes, reads along a convolution's rows), except that a k
  # too short to split across threads (an RGB input's 3 channels) goes inside n's outer ranges
  if not is_b:
    order = [*c.batch, *side.rows, *c.k]
  elif c.k[0].size < MIN_SPLIT:
    order = [*c.batch, *side.rows[:-1], *c.k, *side.rows[-1:]]
  else:
    order = [*c.batch, *c.k, *side.rows]
  fresh = {r: UOp(Ops.RANGE, dtypes.index, (), (i, r.size, "loop")) for i, r in enumerate(order)}
  batch, k = (flat_of([fresh[r] for r in g]) for g in (c.batch, c.k))
  own = substitute(compact_columns(side.rows), fresh) if is_b else flat_of([fresh[r] for r in side.rows])
  idx = (batch * c.K + k) * rows + own if is_b else (batch * rows + own) * c.K + k
  store = UOp(
    Ops.STORE, dtypes.void, (UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 0), idx, substitute(side.expr, fresh))
  )
  return graph_rewrite(store, pm_simplify)


def panel_rows(c: Contraction, side: Side, nr: int, source_bytes: int = 0) -> int | None:
  """Rows h of B's outermost own range per panel (a panel is h whole rows of the rest: for a convolution's input
  window, h output rows), or None when B is copied whole (small enough to stay in L2, and not many times the
  source_bytes of runtime tensors it is copied from)."""
  cut, rest = panel_cut(c, side)
  outer, inner = prod(r.size for r in cut), prod(r.size for r in rest)
  whole = c.B * side.size * c.K * 4
  grown = whole > max(DENSE_SMALL, DENSE_GROWTH * source_bytes)
  if (whole <= PANEL_MAX_BYTES and not grown) or c.a.size < MIN_PANEL_ROWS:
    return None
  # a panel's number is the batch's times the panels at the bound, the runtime's the batch's times those at n_
  if c.B > 1 and any(r.runtime for r in side.rows):
    return None
  # (compact columns: a panel's rows are as many as fit at each run's width, CompactPanel)
  if c.compact:
    return 1
  fits = [h for h in range(1, outer + 1) if h == 1 or h * inner * min(c.K, GEMM_KC) * 4 <= PANEL_MAX_BYTES]
  # panels of whole tiles (an edge tile takes the microkernel's slow path in every panel); then enough panels for
  # the threads; then the fewest padding lanes; then the smallest panel
  h = max(
    fits,
    key=lambda h: (
      h * inner % nr == 0,
      c.B * -(-outer // h) >= MIN_PANELS,
      round(tile_use(1, h * inner, (1, nr)), 2),
      -h,
    ),
  )
  if whole <= PANEL_MAX_BYTES and tile_use(1, h * inner, (1, nr)) < PANEL_MIN_TILE_USE:
    return None
  return h


def panel_cut(c: Contraction, side: Side) -> tuple[tuple[UOp, ...], tuple[UOp, ...]]:
  """(the rows a panel takes h of, the rows it takes whole): B's outermost row and the rest, or where its columns are
  compact (Contraction.compact) its fixed rows flattened and the run-time one."""
  at = _sized_at(side.rows) if c.compact else 1
  return side.rows[:at], side.rows[at:]


def panel_operand(c: Contraction, side: Side, h: int, ld: int) -> UOp:
  """A kernel writing panel p of a B operand as a dense [k][ld] matrix (columns contiguous, ld a whole number of
  tiles): its outermost loop runs over the panels (batch, then h-row slices of B's outermost row range, the last one
  cut short), and a call over [p, p + 1) writes that one panel to its slot 0."""
  (outer,), rest = panel_cut(c, side)
  panels = -(-outer.size // h)
  # ("panels": a loop of the lowering's own, which a dim run to a run-time size never is, whatever its size)
  p = UOp(Ops.RANGE, dtypes.index, (), (0, c.B * panels, "panels"))
  # a placeholder for the h rows in the panel, unlike any of the operand's ranges
  order = [*c.k, UOp(Ops.RANGE, dtypes.index, (), (-1, h, "panel")), *rest]
  fresh = {r: UOp(Ops.RANGE, dtypes.index, (), (i + 1, r.size, "loop")) for i, r in enumerate(order)}
  # the last panel's rows past the end wrap around to real ones: their columns are packed, never used
  sub = {
    **{r: fresh[r] for r in (*c.k, *rest)},
    **_unflat(p // panels, c.batch),
    outer: ((p % panels) * h + fresh[order[len(c.k)]]) % outer.size,
  }
  own = flat_of([fresh[r] for r in order[len(c.k) :]])
  idx = flat_of([fresh[r] for r in c.k]) * ld + own
  store = UOp(Ops.STORE, dtypes.void, (UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 0), idx, substitute(side.expr, sub)))
  return graph_rewrite(store, pm_simplify)


@dataclass(frozen=True)
class CompactPanel:
  """A panel of compact columns as a run's size shapes it: held(n) of B's fixed rows (panel_cut's, rows of them), as
  many as fit positions positions of the run-time row (COMPACT_PANEL_BYTES of a K slice), at least one, the rows then
  shared evenly between the panels that takes (no small last one, its tiles partial); each position row columns wide.
  The pack kernel takes held from n_ (held), the call from e_ (columns_c): one formula, written for each."""

  positions: int
  rows: int
  row: int
  bound: int  # the run-time row's size at the bound

  @staticmethod
  def of(c: Contraction, side: Side) -> CompactPanel:
    cut, (sized, *inner) = panel_cut(c, side)
    row = prod(r.size for r in inner)
    positions = COMPACT_PANEL_BYTES // (min(c.K, GEMM_KC) * 4 * row)
    return CompactPanel(positions, prod(r.size for r in cut), row, sized.size)

  def held(self, size: UOp) -> UOp:
    """The rows a panel holds where the run-time row is size long."""
    one, rows = size.const_like(1), size.const_like(self.rows)
    fit = size.const_like(self.positions) // UOp(Ops.MAX, size.dtype, (size, one))
    fit = UOp(Ops.MIN, size.dtype, (UOp(Ops.MAX, size.dtype, (fit, one)), rows))
    panels = (rows + fit - 1) // fit
    return (rows + panels - 1) // panels

  def columns_c(self, size: str) -> str:
    """C declarations of a panel's columns, nc_, where the run-time row is size long (a C int expression): held's."""
    rows = self.rows
    fit = f"g_ = {self.positions} / (f_ > 1 ? f_ : 1), h_ = g_ < 1 ? 1 : g_ > {rows} ? {rows} : g_"
    panels = f"p_ = ({rows} + h_ - 1) / h_"
    return f"const int f_ = {size}, {fit}, {panels}, nc_ = ({rows} + p_ - 1) / p_ * f_ * {self.row};"

  @property
  def columns(self) -> int:
    """The most columns a panel holds: one row however long, else as many positions as fit, at most every row's."""
    return self.row * min(max(self.positions, self.bound), self.rows * self.bound)


def compact_panel_operand(c: Contraction, side: Side, panel: CompactPanel, R: int) -> UOp:
  """panel_operand for compact columns: a call over [p, p + 1) writes panel p (batch, then held rows at a time of the
  fixed rows, the last one cut short) as a dense [k][ld] matrix, ld its columns at the run's size in whole tiles."""
  cut, rest = panel_cut(c, side)
  sized = rest[0]
  held = panel.held(sized.extent)
  panels = (held + (panel.rows - 1)) // held
  p = UOp(Ops.RANGE, dtypes.index, (), (0, c.B * panel.rows, "panels"))
  first = (p % panels) * held
  # the panel's rows, a loop to a count computed from the run's size ("rows": not one of the dim's positions, which
  # aot/scheduler/runtime_extent.py checks are used only as addresses); the last panel's past the end wrap around to
  # real ones (_unflat): their columns are packed, never used
  k = {r: UOp(Ops.RANGE, dtypes.index, (), (i + 1, r.size, "loop")) for i, r in enumerate(c.k)}
  rows = UOp(Ops.RANGE, dtypes.index, (), (len(c.k) + 1, panel.rows, "rows", held))
  sub = {**k, **_unflat(p // panels, c.batch), **_unflat(first + rows, cut)}
  own, at = _one_run(side.expr, sub, rest, len(c.k) + 2) or _each_row(rest, len(c.k) + 2, panel.row)
  ld = (held * sized.extent * panel.row + (R - 1)) // R * R
  idx = flat_of(list(k.values())) * ld + rows * sized.extent * panel.row + at
  store = UOp(
    Ops.STORE, dtypes.void, (UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 0), idx, substitute(side.expr, sub | own))
  )
  return graph_rewrite(store, pm_simplify)


def _each_row(rest: tuple[UOp, ...], number: int, row: int) -> tuple[dict[UOp, UOp], UOp]:
  """(the run-time row and the fixed ones inside it as loops of their own, numbered from number on; a column's place
  in a held row)."""
  own = {r: UOp(Ops.RANGE, dtypes.index, (), (number + i, r.size, "loop")) for i, r in enumerate(rest)}
  return own, own[rest[0]] * row + flat_of([own[r] for r in rest[1:]])


def _one_run(expr: UOp, sub: dict, rest: tuple[UOp, ...], number: int) -> tuple[dict[UOp, UOp], UOp] | None:
  """_each_row's as one loop over a held row's columns, where the operand reads them as one run (a convolution's
  window over a width its 2x2 pool then takes in pairs: positions 2 w + i, i < 2): the pack's innermost loop then
  runs whole rows, not runs of 2. None where the operand reads a position or one inside it alone (the loop's counter
  divided: runtime_extent refuses a run-time counter divided)."""
  sized, inner = rest[0], prod(r.size for r in rest[1:])
  # (a row of the dim's own size, merged with another: a loop of a multiple of the bound, which runtime_extent refuses)
  if inner == 1 or sized.extent.op is Ops.VAR:
    return None
  run = UOp(Ops.RANGE, dtypes.index, (), (number, sized.size * inner, "loop", sized.extent * inner))
  own = {sized: run // inner, **_unflat(run % inner, rest[1:])}
  value = graph_rewrite(substitute(expr, sub | own), pm_simplify)
  if any(u.op in (Ops.IDIV, Ops.MOD) and run in u.toposort() for u in value.toposort()):
    return None
  return own, run
