"""B's columns (codegen/lower/contract.py): where each lies in B and C, and the kernels that copy B out for the
microkernel, whole (dense_operand), a panel at a time into a thread's buffer (panel_operand), or for a stride-1
convolution's window the input once, padded, which the microkernel reads tap by tap in place (padded_copy).

Columns lie row-major over B's rows at the bound's sizes, except where one row is a loop to a run-time size after
fixed ones (a feature map's rows over a text line's width): they are then compact, row-major at the run's size, so that
a run's columns are contiguous in the order the kernel reads and writes them, and a panel holds as many of the fixed
rows as fit at the run's width (CompactPanel)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from aot.codegen.lower.window import padded_window, runtime_load
from aot.core.dtype import dtypes
from aot.core.interpret import evaluate_grid
from aot.core.ir import Ops, UOp, flat_of, prod, ranges_of
from aot.core.rewrite import graph_rewrite, substitute
from aot.core.symbolic import linear, pm_simplify

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


# a stride-1 convolution's window is read in place from a padded copy of its input (PaddedCopy), where the taps' copy
# (im2col: K x N floats written, then read back, shared by the M rows) costs more than the padded rows' extra columns,
# computed and dropped, and C's tiles stored through a copy where they cross a row: at most WINDOW_ROWS rows, or up to
# twice as many over a K of at most WINDOW_SHORT_K; a K of WINDOW_MIN_K at least, rows WINDOW_MIN_WIDTH wide at least
# and at most WINDOW_MAX_WIDEN as wide padded. Measured (1 thread, a convolution with bias and ReLU, interleaved,
# against the taps' copy in panels): 3x3 32->32 over 56x56 0.85x, 16->32 over 112x112 0.89x, 128->32 over 56x56 and
# 28x28 0.90x, 5x5 32->32 over 24x24 0.91x, 16->64 over 55x55 0.90x, 32->64 over 56x56 0.94x; as fast at 64 rows over
# a K of 576 or 1152, and at 128 rows over 288; slower at 128 rows over 576 (1.08x), over a K of 25 (MNIST's first
# conv, 1.08x) and over 8-wide rows (32->64 over 10x10, 1.41x: every tile crosses a row and the copies dominate)
WINDOW_ROWS, WINDOW_SHORT_K, WINDOW_MIN_K, WINDOW_MIN_WIDTH, WINDOW_MAX_WIDEN = 32, 288, 64, 16, 1.25


@dataclass(frozen=True)
class PaddedCopy:
  """B read in place from zero-padded copies of a convolution's input, one per panel of `rows` output rows that a
  task packs into its thread's buffer (as panel_operand's): [planes][rows + KH - 1][Wp], the padded positions those
  rows' windows read (Wp = wide = OW + KW - 1). The microkernel's column n = oh * Wp + ow of tap k = (plane, kh, kw)
  is copy[koff[k] + n - the panel's first column], its rows of columns Wp wide, of which it stores the first OW where
  C has them (the last KW - 1 are computed and dropped). pad: the kernel writing panel p's copy to its slot 0; floats:
  a copy's size with the slack a last tile reads past it; columns: the microkernel's, OH * Wp."""

  pad: UOp
  floats: int
  koff: tuple[int, ...]
  wide: int
  narrow: int  # OW
  rows: int
  columns: int


def _flat_step(group: tuple[UOp, ...], terms: dict) -> int | None:
  """The step of the group's flat index (row-major over its ranges) in terms (linear), when the terms step it so."""
  inner = prod(r.size for r in group[1:])
  step = terms.get(group[0], 0) // inner if inner else 0
  for i, r in enumerate(group):
    if terms.get(r) != step * prod(q.size for q in group[i + 1 :]):
      return None
  return step or None


def _window_ranges(c: Contraction, terms: dict) -> tuple | None:
  """(output rows, output columns, plane, kh, kw) of a window read at terms (linear) at stride 1: B's rows in two
  groups, each stepping as one flat range (a 2x2 pool after the convolution splits each into (o, p), 2o + p), the
  columns' by 1 and kw as they do, the rows' by a row and kh as they do; plane the k range left (None for one)."""
  if set(terms) - {*c.b.rows, *c.k} or any(t.op is not Ops.RANGE for t in terms):
    return None
  for at in range(1, len(c.b.rows)):
    rows, cols = c.b.rows[:at], c.b.rows[at:]
    row = _flat_step(rows, terms)
    if _flat_step(cols, terms) != 1 or row is None or row <= 1:
      continue
    kw = [r for r in c.k if terms.get(r) == 1]
    kh = [r for r in c.k if terms.get(r) == row and r not in kw]
    plane = [r for r in c.k if r not in (*kh, *kw)]
    if len(kw) == 1 and len(kh) == 1 and len(plane) <= 1:
      return rows, cols, (plane or [None])[0], kh[0], kw[0]
  return None


def padded_copy(c: Contraction, bufs: list, nr: int) -> PaddedCopy | None:
  """B read from padded copies of its input (PaddedCopy) when it is a gated load of a runtime input at a stride-1,
  undilated window and the copy pays (WINDOW_*); else None."""
  rows_pay = c.a.size <= WINDOW_ROWS or (c.a.size <= 2 * WINDOW_ROWS and c.K <= WINDOW_SHORT_K)
  if c.B != 1 or c.compact or not rows_pay or any(r.runtime for r in (*c.b.rows, *c.k)):
    return None
  if (found := runtime_load(c.b.expr)) is None:
    return None
  load, gates = found
  if bufs[load.src[0].arg].kind == "const" or (ranges := _window_ranges(c, linear(load.src[1])[0])) is None:
    return None
  rows, cols, plane, kh, kw = ranges
  OH, OW, zero = prod(r.size for r in rows), prod(r.size for r in cols), kh.const_like(0)
  Hp, Wp = OH + kh.size - 1, OW + kw.size - 1
  # (a tile crosses at most 5 of the copy's rows: runtime_c/aot_gemm.c window_rows)
  if Wp > WINDOW_MAX_WIDEN * OW or OW < max(WINDOW_MIN_WIDTH, 8) or c.K < WINDOW_MIN_K:
    return None
  # the window over one output row y and column x: each group's last range stands for it (its step is the group's)
  y, x = (UOp(Ops.RANGE, dtypes.index, (), (i, n, "loop")) for i, n in enumerate((OH, OW)))
  flat = {**{r: zero for r in (*rows[:-1], *cols[:-1])}, rows[-1]: y, cols[-1]: x}
  gates_yx = [substitute(g, flat) for g in gates]
  win = padded_window(gates_yx, y, kh, x, kw, 1, 1)
  axes = [*rows, kh, *cols, kw]
  if win is None or any(ranges_of(g) - set(axes) for g in gates):
    return None
  # ... which holds where the groups are split ranges: the gates the same over the split grid
  grid = [OH, kh.size, OW, kw.size]
  split = np.ones(grid, bool)
  for g in gates:
    split &= evaluate_grid(g, axes).astype(bool).reshape(grid)
  merged = np.ones(grid, bool)
  for g in gates_yx:
    merged &= evaluate_grid(g, [y, kh, x, kw]).astype(bool)
  if not np.array_equal(split, merged):
    return None
  # B at tap (0, 0) over every padded position is the copy, zero outside the input (its gates, checked over the grid)
  py, px = (UOp(Ops.RANGE, dtypes.index, (), (i, n, "loop")) for i, n in enumerate((Hp, Wp)))
  inside = np.ones((Hp, Wp), bool)
  for g in gates_yx:
    inside &= evaluate_grid(substitute(g, {kh: zero, kw: zero, y: py, x: px}), [py, px]).astype(bool)
  ys, xs = np.arange(Hp)[:, None] - win.PH, np.arange(Wp) - win.PW
  if not np.array_equal(inside, (ys >= 0) & (ys < win.H) & (xs >= 0) & (xs < win.W)):
    return None
  # panels of whole output rows, enough of them for the threads, but twice the window's extra rows at least (a 5x5
  # window over 20 rows in panels of 3 copied 7 rows a panel: 1.25x the taps' copy; a panel's rows past the last read
  # zeros)
  h = min(max(-(-OH // MIN_PANELS), 2 * (kh.size - 1)), OH)
  planes, high = plane.size if plane is not None else 1, h + kh.size - 1
  p = UOp(Ops.RANGE, dtypes.index, (), (0, -(-OH // h), "panels"))
  fresh = [UOp(Ops.RANGE, dtypes.index, (), (i + 1, n, "loop")) for i, n in enumerate((planes, high, Wp))]
  at = {**flat, kh: zero, kw: zero, rows[-1]: p * h + fresh[1], cols[-1]: fresh[2]}
  at |= {plane: fresh[0]} if plane is not None else {}
  idx = (fresh[0] * high + fresh[1]) * Wp + fresh[2]
  pad = UOp(Ops.STORE, dtypes.void, (UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 0), idx, substitute(c.b.expr, at)))
  step = {plane: high * Wp, kh: Wp, kw: 1}
  grid = np.meshgrid(*[np.arange(r.size) for r in c.k], indexing="ij")
  koff = sum(step[r] * g for r, g in zip(c.k, grid)).reshape(-1)
  floats = max(planes * high * Wp, int(koff.max()) + -(-h * Wp // nr) * nr)
  return PaddedCopy(graph_rewrite(pad, pm_simplify), floats, tuple(int(k) for k in koff), Wp, OW, h, OH * Wp)
