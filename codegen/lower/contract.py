"""Contractions to packed matrix multiplies: the rewrite that makes matmul- and conv-like kernels fast on the CPU.

A contraction is a sum over k of a product of two operands, acc[b, m, n] = sum_k A[b, m, k] * B[b, n, k], where A
varies only with (batch, m, k) and B only with (batch, n, k): a matmul, a convolution (k = input channel and window,
n = output position, m = output channel), attention's batched products. Such an accumulator is computed by the
runtime's microkernel (runtime_c/aot_gemm.c) into a scratch matrix, and the kernel around it (bias, batch norm,
residual add, activation, pooling) becomes an epilogue kernel that reads that matrix instead of summing.

Each operand reaches the microkernel in one of three forms (strides in the runtime's aot_operand):
- a constant (weights, possibly through index arithmetic and padding) is evaluated and packed at compile time in
  tiles ([tiles][K][R], R the tile's rows), which the inner loop reads contiguously: constants cost nothing to
  reorder ahead of time, as long as the packed copy does not repeat them many times over (PACK_GROWTH);
- a runtime operand that is a plain strided view of a buffer (a matmul's input, a 1x1 convolution's input) is read
  where it lies, unless it is a B big enough to be packed in panels (panel_rows) whose every batch is: its rows of K
  are N apart, and the microkernel walking them there took a 1x1 convolution over a 2304 x 4 x 160 input 7.4 ms, from
  its panels 5.4 (1 thread); a batch of small ones stays in L2 (Winograd's 16 products over a 28x28 map, 64
  channels: 67 GFLOP/s in panels of one tile, 119 in place);
- any other runtime operand (a convolution's window with its padding gates, a transposed view B would read across
  its lanes) is first written out as a dense matrix by a generated kernel (im2col, for a convolution), with the loops
  ordered so that it reads and writes contiguously.

n is the side that holds the kernel's innermost output loop, so the microkernel's vector lanes run along the axis the
epilogue writes contiguously."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from aot.codegen.lower.columns import (
  PANEL_MAX_BYTES,
  CompactPanel,
  PaddedCopy,
  compact_columns,
  compact_panel_operand,
  compact_rows,
  compact_size,
  dense_operand,
  padded_copy,
  panel_cut,
  panel_operand,
  panel_rows,
  tile_use,
)
from aot.codegen.render.linearize import is_outer
from aot.core.dtype import dtypes
from aot.core.interpret import evaluate
from aot.core.ir import Ops, ReduceOp, UOp, flat_of, prod, ranges_of
from aot.core.rewrite import graph_rewrite, substitute
from aot.core.symbolic import flat_stride, linear, pm_simplify
from aot.scheduler.schedule import pm_gated_off

# a contraction smaller than this (multiply-adds) is not worth a call into the microkernel and its packing
MIN_WORK = 1 << 15
# a reduction shorter than this is mostly packing overhead
MIN_K = 8
# tasks a contraction is split into at least (when it is big enough): threads take them as they finish the last, so
# a few per thread keep them balanced
MIN_TASKS = 32
# swap the operands when the fraction of the microkernel's tiles they fill grows by more than this over K (the swap
# costs the epilogue a pass over the result read across its loops, which a long reduction hides): measured on
# ResNet's 7x7 layers (K >= 2304: faster) and a 14x14 1x1 conv (K = 256: slower)
SWAP_GAIN = 100
# block sizes in tiles: a B block (KC x nc floats per K slice) and the A tiles passing over it stay in L2
NC_TILES, MC_TILES = 4, 32
# ... but a contraction over at most SHORT_K steps of k (a 1x1 convolution of few channels) into a C of at least
# SHORT_K_MIN_C elements writes C about as fast as it computes it: its tasks take one tile of rows over all of N (cut
# into as few pieces as give MIN_TASKS), each writing its rows in long runs, where 96 rows x 128 columns a task wrote
# 96 runs of 512 bytes. MobileNetV2 (expansions of K 16-64 into C up to 96 x 12544), interleaved: 1 thread 0.96-0.98,
# 2 threads 0.94-0.96 of its time; a smaller C (MobileNetV3-small's) 1.5-3% slower, so left as it was
SHORT_K, SHORT_K_MIN_C = 64, 1 << 18
# a packed constant holds each element the operand reads once, plus tile padding (under 2x once the rows fill a tile);
# one bigger than this many times the constants it is computed from repeats them, and is read at run time instead:
# a weight gated by the output position, packed once per position (a text-detection model asked for 1 TB), or a
# concat's branch weights gated by the output channel, packed once per channel into a tile of 8 rows with 1 used
# (DenseNet-121: a 1.2 GB blob for 31 MB of weights; in loops it runs 2.6x as fast, SqueezeNet 3x)
PACK_GROWTH = 4
# ... unless it is smaller than this (elements): a small matrix's tile padding alone can pass PACK_GROWTH
PACK_SMALL = 1 << 16


def gemm_tile(cpu: str, triple: str | None) -> tuple[int, int]:
  """(MR, NR) of the microkernel to use: 8x32 where 16-float vectors exist (AVX-512), else 6x16."""
  if triple is not None and not triple.startswith("x86_64"):
    return (6, 16)
  if cpu == "native":
    from llvmlite import binding as llvm

    return (8, 32) if "+avx512f" in llvm.get_host_cpu_features().flatten() else (6, 16)
  wide = (
    "avx512",
    "x86-64-v4",
    "znver4",
    "znver5",
    "sapphirerapids",
    "icelake",
    "tigerlake",
    "cascadelake",
    "cooperlake",
  )
  return (8, 32) if any(w in cpu for w in wide) else (6, 16)


@dataclass(frozen=True)
class Side:
  expr: UOp  # the operand's value, a function of (batch, rows, k) ranges
  rows: tuple[UOp, ...]  # its own free ranges (m for A, n for B), outer first

  @property
  def size(self) -> int:
    return prod(r.size for r in self.rows)


@dataclass(frozen=True)
class Contraction:
  acc: UOp
  batch: tuple[UOp, ...]
  k: tuple[UOp, ...]
  a: Side
  b: Side
  # the contraction's own ranges where they are a slice or a split of the kernel's output ranges, as expressions of
  # the kernel's ranges (the epilogue reads the result through them)
  back: tuple[tuple[UOp, UOp], ...] = ()
  # (kernel range, start, end): outside this slice of an output range the accumulator is zero (a concat's branch)
  bounds: tuple[tuple[UOp, int, int], ...] = ()
  # B read in place from a padded copy of a convolution's input (columns.padded_copy)
  window: PaddedCopy | None = None

  @property
  def B(self) -> int:
    return prod(r.size for r in self.batch)

  @property
  def K(self) -> int:
    return prod(r.size for r in self.k)

  @property
  def N(self) -> int:
    """The microkernel's columns: B's, or a padded copy's rows of them (PaddedCopy.columns)."""
    return self.window.columns if self.window is not None else self.b.size

  @property
  def compact(self) -> bool:
    """Do B's rows hold a loop to a run-time size after fixed ones, its columns then laid out compactly at the run's
    size (columns.compact_columns)?"""
    return compact_rows(self.b.rows)


# index arithmetic, and loads that a known gate turns off read nothing
pm_operand = pm_simplify + pm_gated_off


def _zero_when(x: UOp, y: UOp, cmp: UOp, value: bool) -> bool:
  """Is the product x * y zero wherever the comparison cmp has this value (one operand reads only gated-off loads)?"""
  sub = {cmp: UOp.const(dtypes.bool, value)}
  return any((z := graph_rewrite(substitute(s, sub), pm_operand)).op is Ops.CONST and z.arg == 0 for s in (x, y))


def gate_slices(x: UOp, y: UOp, outs: set[UOp]) -> tuple[dict[UOp, int], dict[UOp, int]]:
  """(start, end) per output range: outside [start, end) of that range the product x * y is zero, because a gate
  `r < c` on it turns off every load of one operand (a concat's branch)."""
  start, end = {r: 0 for r in outs}, {r: r.size for r in outs}
  cmps = {
    u for s in (x, y) for u in s.toposort() if u.op is Ops.CMPLT and u.src[0] in outs and u.src[1].op is Ops.CONST
  }
  for cmp in sorted(cmps, key=lambda u: (u.src[0].number, u.src[1].arg)):
    r, c = cmp.src[0], cmp.src[1].arg
    if _zero_when(x, y, cmp, False):
      end[r] = min(end[r], c)
    elif _zero_when(x, y, cmp, True):
      start[r] = max(start[r], c)
  return start, end


def _slice_and_split(x: UOp, y: UOp, k: tuple[UOp, ...]) -> tuple[UOp, UOp, dict[UOp, UOp], list]:
  """The operands over the contraction's own ranges, those ranges as expressions of the kernel's, and the slices.
  - A gate that confines the product to a slice [start, end) of an output range (a concat's `c < 64 ? a : b` pushed
    into the operands, so each branch only reads under it) slices that range: the branch is computed for its own
    channels only, and the gate no longer makes the other operand vary with the channel (which made it a batch axis
    of M = 1, copied per channel).
  - A range both operands read, one of them only through r // d (a grouped convolution's group), splits into
    (r // d, r % d): the group is the batch, and r % d is M or N."""
  kset = set(k)
  outs = (ranges_of(x) | ranges_of(y)) - kset
  start, end = gate_slices(x, y, outs)
  # an empty slice is a product that is zero everywhere: left to the generic loops
  sliced = [r for r in sorted(outs, key=lambda r: r.number) if 0 < end[r] - start[r] < r.size]
  # the slice keeps its range's number (it replaces it) with its own size, so it is a new node
  fresh = {r: UOp(Ops.RANGE, dtypes.index, (), (r.number, end[r] - start[r], r.kind)) for r in sliced}
  back = {fresh[r]: r - start[r] for r in sliced}
  sub = {r: fresh[r] + start[r] for r in sliced}
  x, y = (graph_rewrite(substitute(s, sub), pm_operand) for s in (x, y))
  for r in sorted((ranges_of(x) & ranges_of(y)) - kset, key=lambda r: r.number):
    divisors = {
      u.src[1].arg
      for s in (x, y)
      for u in s.toposort()
      if u.op in (Ops.IDIV, Ops.MOD) and u.src[0] is r and u.src[1].op is Ops.CONST
    }
    for d in sorted(d for d in divisors if 1 < d < r.size and r.size % d == 0):
      # the inner range numbers between r and the next range, so the loop order is kept
      outer = UOp(Ops.RANGE, dtypes.index, (), (r.number, r.size // d, r.kind))
      inner = UOp(Ops.RANGE, dtypes.index, (), (r.number + 0.5, d, r.kind))
      nx, ny = (graph_rewrite(substitute(s, {r: outer * d + inner}), pm_operand) for s in (x, y))
      if inner in ranges_of(nx) and inner in ranges_of(ny):
        continue
      x, y = nx, ny
      e = back.pop(r, r)
      back[outer], back[inner] = e // d, e % d
      break
  return x, y, back, [(r, start[r], end[r]) for r in sliced]


def _row_order(expr: UOp, rows: set, is_b: bool) -> tuple[UOp, ...]:
  """An operand's free ranges, outer first: in loop order, unless one is the window of a reduction the kernel makes
  of the result (a max pool after a convolution: C is then a scratch matrix only the kernel reads), when they go by
  their step in the operand's source, largest first, so that its copy reads and writes rows contiguously (the CRNN's
  conv + 2x1 pool took each pooled column's two rows innermost: a copy loop of 2)."""
  ordered = tuple(sorted(rows, key=lambda r: r.number))
  loads = [u for u in expr.toposort() if u.op is Ops.LOAD]
  if any(r.kind == "reduce" for r in rows) and len(loads) == 1:
    terms = linear(loads[0].src[1])[0]
    ordered = tuple(sorted(ordered, key=lambda r: -terms.get(r, 0)))
  # a loop to a run-time size (aot/scheduler/runtime_extent.py) innermost, B's, stays there: B's and C's columns are
  # then compact at the run's size (compact_columns). Taken first instead (a text line's width before a feature map's
  # 4 rows: the rows it runs a prefix of the matrix at the bound's strides), the window matrix was packed and C read
  # across their loops: the CRNN over a width range, 160 columns, its convolutions' packs 0.38 -> 1.09 ms of a 5.3 ms
  # static run, its epilogues 0.05 -> 0.3 ms
  if is_b and compact_rows(ordered):
    return ordered
  return tuple(sorted(ordered, key=lambda r: not r.runtime))


def find_contractions(ast: UOp, tile: tuple[int, int]) -> list[Contraction]:
  """The float32 sum-of-products accumulators of a kernel whose operands separate into (batch, m, k) x (batch, n, k)."""
  found = []
  for acc in ast.toposort():
    if acc.op is not Ops.ACCUMULATE or acc.arg is not ReduceOp.SUM or acc.dtype != dtypes.float32:
      continue
    prod_ = acc.src[0]
    if prod_.op is not Ops.MUL or any(s.dtype != dtypes.float32 for s in prod_.src):
      continue
    x, y = prod_.src
    # an operand that sums itself, or reads the kernel's own output, stays in the generic loops
    if any(u.op is Ops.ACCUMULATE or (u.op is Ops.DEFINE_GLOBAL and u.arg == 0) for s in (x, y) for u in s.toposort()):
      continue
    k = tuple(acc.src[1:])
    x, y, back, bounds = _slice_and_split(x, y, k)
    dx, dy = ranges_of(x) - set(k), ranges_of(y) - set(k)
    batch = tuple(sorted(dx & dy, key=lambda r: r.number))
    mx, ny = dx - set(batch), dy - set(batch)
    if not mx | ny:
      continue
    # the side holding the innermost output loop is n: the microkernel's vector lanes run along it
    if max(mx | ny, key=lambda r: r.number) in mx:
      (x, mx), (y, ny) = (y, ny), (x, mx)
    # ... unless the other way round wastes fewer lanes on padding (a 7x7 image's 49 positions fill two 32-lane tiles
    # to 77%, 512 channels fill them all), by enough to pay for the epilogue reading the result across its loops
    size = lambda rs: prod(r.size for r in rs)
    gain = tile_use(size(ny), size(mx), tile) - tile_use(size(mx), size(ny), tile)
    if gain * prod(r.size for r in k) > SWAP_GAIN:
      (x, mx), (y, ny) = (y, ny), (x, mx)
    a, b = Side(x, _row_order(x, mx, False)), Side(y, _row_order(y, ny, True))
    c = Contraction(acc, batch, k, a, b, tuple(back.items()), tuple(bounds))
    if c.K >= MIN_K and c.B * c.a.size * c.b.size * c.K >= MIN_WORK:
      found.append(c)
  return found


def _view(side: Side, c: Contraction) -> tuple[int, int, tuple[int, int, int]] | None:
  """(slot, offset, (batch, row, k) strides) when the operand is a plain load of a buffer at an index linear in each
  group of ranges flattened (so it can be read where it lies), else None."""
  x = side.expr
  if x.op is not Ops.LOAD or not (x.src[2].op is Ops.CONST and x.src[2].arg):
    return None
  terms, offset = linear(x.src[1])
  if offset < 0 or any(t.op is not Ops.RANGE for t in terms):
    return None
  strides = tuple(flat_stride(group, terms) for group in (c.batch, side.rows, c.k))
  if None in strides:
    return None
  return x.src[0].arg, offset, strides


def result_index(c: Contraction, ldc: int = 0) -> UOp:
  """Where acc[batch, m, n] lies in the result matrix C[batch][m][n], its rows ldc apart (0: N, dense)."""
  # (compact columns: C's rows those of a run apart too)
  rows = ldc or (compact_size(c.b.rows) if c.compact else c.b.size)
  return (flat_of(c.batch) * c.a.size + flat_of(c.a.rows)) * rows + compact_columns(c.b.rows)


def _inside(c: Contraction) -> UOp:
  """Where the accumulator can be nonzero: inside its slices of the kernel's output ranges."""
  cond = UOp.const(dtypes.bool, True)
  for r, start, end in c.bounds:
    cond = cond & r.ge(start) & r.lt(end)
  return cond


def _result_in_kernel(c: Contraction, ldc: int = 0) -> UOp:
  """result_index in the kernel's own ranges."""
  return graph_rewrite(substitute(result_index(c, ldc), dict(c.back)), pm_simplify)


def epilogue_kernel(ast: UOp, results: dict[UOp, tuple]) -> UOp:
  """The kernel with each contraction's accumulator read from its result matrix (a new slot, or the output at an
  offset, and a row stride when not 0), gated to its slice: outside it the accumulator is zero. results: by
  accumulator, (contraction, slot, offset) or (contraction, slot, offset, row stride)."""

  def index(c: Contraction, slot: int, offset: int, ldc: int = 0) -> UOp:
    at = _result_in_kernel(c, ldc) + offset
    # in place, the read is at the store's own index node: the same address in the same form, which the C and LLVM
    # vectorisers need to see (an equal index built differently got a runtime overlap check that always failed, and
    # ran the scalar loop: 3x slower on a 128x112x112 batch norm + ReLU6)
    if slot == 0 and ast.op is Ops.STORE and linear(at) == linear(ast.src[1]):
      return ast.src[1]
    return at

  loads = {
    c.acc: UOp(
      Ops.LOAD, dtypes.float32, (UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), slot), index(c, slot, *where), _inside(c))
    )
    for c, slot, *where in results.values()
  }
  return graph_rewrite(substitute(ast, loads), pm_simplify)


def split_by_slices(ast: UOp, gemms: list[Gemm]) -> list[UOp]:
  """The epilogue as one kernel per slice of the output range its contractions' slices cut it into (a concat's
  branches, and the gaps between them): each piece reads its own branch only, where the whole kernel evaluated
  every branch under gates at every element."""
  cut = {r for g in gemms for r, _, _ in g.c.bounds}
  if len(cut) != 1 or any(not g.c.bounds for g in gemms):
    return [ast]
  (r,) = cut
  edges = sorted({0, r.size} | {x for g in gemms for q, start, end in g.c.bounds for x in (start, end)})
  return range_pieces(ast, r, edges)


def range_pieces(ast: UOp, r: UOp, edges: list[int]) -> list[UOp]:
  """ast once per run [lo, hi) of range r between the edges (r = lo + a range of hi - lo), simplified."""
  # a range the kernel sums over (a concat's or pad's axis reduced after it) is not cut: each piece would store
  # its part of the sum over the others', and an ACCUMULATE's ranges would become sums (fuzzer: seed 123 case 796)
  if len(edges) == 2 or any(u.op is Ops.ACCUMULATE and r in u.src[1:] for u in ast.toposort()):
    return [ast]
  # each piece's range keeps r's number with the piece's size (the loop order stays), so it is a new node
  return [
    graph_rewrite(substitute(ast, {r: UOp(Ops.RANGE, dtypes.index, (), (r.number, hi - lo, r.kind)) + lo}), pm_operand)
    for lo, hi in zip(edges, edges[1:])
  ]


# a loop kernel is cut into this many pieces at most (each a call of its own)
GATE_PIECES_MAX = 8
# ... and only when it writes this many elements (a call costs about a microsecond)
GATE_SPLIT_MIN = 1 << 14


def split_by_gates(ast: UOp, size: int) -> list[UOp]:
  """A loop kernel whose outermost range is compared with constants (a concat's branches) as one kernel per run of
  that range between them: each piece's gates fold and it reads its own branch only, where the whole kernel
  evaluated every branch under gates at every element (YOLOv8's neck, the concat of an upsample and a feature: 2.5 G
  elements/s). size: the elements it writes."""
  if size < GATE_SPLIT_MIN:
    return [ast]
  topo = ast.toposort()
  if (r := next((u for u in topo if u.op is Ops.RANGE and is_outer(u)), None)) is None:
    return [ast]
  cuts = {u.src[1].arg for u in topo if u.op is Ops.CMPLT and u.src[0] is r and u.src[1].op is Ops.CONST}
  edges = sorted({0, r.size} | {c for c in cuts if 0 < c < r.size})
  return [ast] if len(edges) - 1 > GATE_PIECES_MAX else range_pieces(ast, r, edges)


def _in_place_offset(ast: UOp, out, c: Contraction, placed: list[Contraction]) -> tuple[int, int] | None:
  """(where the result matrix starts in the kernel's output, its row stride or 0 for N), when the kernel writes each
  element where C has it (a slice's C at the slice's start; a slice of the last axis, a concat's branch there, with
  C's rows as far apart as the output's) and no contraction already placed there writes the same elements; else
  None."""
  if ast.op is not Ops.STORE or out.dtype != dtypes.float32 or c.compact:
    return None
  out_terms, out_const = linear(ast.src[1])
  # the output's row stride, when m's innermost range is one of the kernel's (not sliced or split)
  ldcs = [0]
  if c.a.rows and out_terms.get(c.a.rows[-1], 0) > c.b.size:
    ldcs.append(out_terms[c.a.rows[-1]])
  for ldc in ldcs:
    terms, const = linear(_result_in_kernel(c, ldc))
    if terms == out_terms and out_const >= const:
      break
  else:
    return None

  # contractions in place at once are branches of a concat: slices of one range that do not overlap
  def disjoint(p: Contraction) -> bool:
    return any(r is q and (end <= qs or qe <= start) for r, start, end in c.bounds for q, qs, qe in p.bounds)

  return (out_const - const, ldc) if all(disjoint(p) for p in placed) else None


def _packed_size(c: Contraction, side: Side, tile: int) -> int:
  """Elements of an operand packed as [batch][tiles][K][tile]."""
  return c.B * -(-side.size // tile) * tile * c.K


def _packs(c: Contraction, side: Side, tile: int, consts: list[np.ndarray]) -> bool:
  """Is the packed copy of a constant operand not much bigger than the constants it is computed from?"""
  return _packed_size(c, side, tile) <= max(PACK_SMALL, PACK_GROWTH * sum(x.size for x in consts))


def evaluate_operand(c: Contraction, side: Side, tile: int, data: dict[int, np.ndarray]) -> np.ndarray:
  """A constant operand evaluated with numpy and packed as [batch][tiles][K][tile], zero-padded: what the microkernel
  reads in place of a pack kernel's output. The evaluator computes each node over the ranges it depends on only
  (size-1 axes elsewhere) and drops it after its last use: the work and memory are a small multiple of the packed
  result's (4x for a conv's weights: the int64 index over (rows, k) is twice the packed floats)."""
  axes = [*c.batch, *side.rows, *c.k]
  value = evaluate(side.expr, axes=axes, data=data).astype(np.float32, copy=False)
  grid = np.broadcast_to(value, [r.size for r in axes]).reshape(c.B, side.size, c.K)
  tiles, whole = -(-side.size // tile), side.size // tile
  packed = np.zeros((c.B, tiles, c.K, tile), np.float32)
  rows = packed.transpose(0, 1, 3, 2)
  rows[:, :whole] = grid[:, : whole * tile].reshape(c.B, whole, tile, c.K)
  if whole < tiles:
    rows[:, whole, : side.size - whole * tile] = grid[:, whole * tile :]
  return packed


def blocks(c: Contraction, mr: int, nr: int, panel: int = 0) -> tuple[int, int]:
  """(mc, nc): rows of A and columns of B one task computes, shrunk until there are MIN_TASKS tasks when possible.
  panel: the columns of a packed B panel, which are one task's (its row blocks all run over the panel it packed)."""
  up = lambda n, t: -(-n // t) * t
  if panel:
    return min(up(c.a.size, mr), MC_TILES * mr), panel
  if c.K <= SHORT_K and c.B * c.a.size * c.N >= SHORT_K_MIN_C:
    pieces = -(-MIN_TASKS // (c.B * -(-c.a.size // mr)))
    return mr, up(-(-c.N // pieces), nr)
  mc, nc = min(up(c.a.size, mr), MC_TILES * mr), min(up(c.N, nr), NC_TILES * nr)
  tasks = lambda: c.B * -(-c.a.size // mc) * -(-c.N // nc)
  # the longer side first: a task reads mc x K of A and K x nc of B for mc x nc x K multiply-adds, so square blocks
  # read the least (rows first had a swapped 7x7 conv's 49 rows in blocks of 8, each re-reading its 64 x 4608 block
  # of weights)
  while tasks() < MIN_TASKS and (mc > mr or nc > nr):
    if nc > nr and (nc > mc or mc == mr):
      nc = up(nc // 2, nr)
    else:
      mc = up(mc // 2, mr)
  return mc, nc


@dataclass
class Operand:
  """How the runtime reads an operand: a buffer slot, an offset into it and aot_operand's strides (batch, tile, row,
  k), and the kernel that writes that buffer first when it is a dense copy."""

  slot: int
  offset: int
  strides: tuple[int, int, int, int]
  padded: bool  # whole tiles may be read past the last row
  dense: UOp | None = None
  # a B operand packed a panel at a time (panel_operand) into its thread's buffer: the kernel, the panel's columns and
  # its row stride (slot and offset are then unused; the strides are the panel's)
  pack: UOp | None = None
  panel: tuple[int, int] = (0, 0)
  # ... of compact columns (Contraction.compact): as the run's size shapes it, panel the most columns it holds
  compact: CompactPanel | None = None


# the ops of an epilogue step the microkernel applies to each finished tile (aot_gemm_step in runtime_c/aot_gemm.h)
STEP_OPS = {Ops.ADD: 0, Ops.MUL: 1, Ops.MAX: 2, Ops.MIN: 3}
# ... and a multiply whose result the next step adds to, in one expression (AOT_STEP_MUL_ADD)
STEP_MUL_ADD = 4
# the fused epilogue is on: off, every epilogue is a kernel pass of its own (the tests compare the two bitwise).
# Measured fused / separate (1 thread, thread CPU time, interleaved, loaded machine; c, llvm): SqueezeNet 0.97-0.99,
# 0.95-0.97; MNIST 1.01-1.05, 0.97-1.02; ResNet-18 1.02-1.04, 1.01-1.03; ResNet-50 1.00-1.05, 1.01-1.05: the separate
# passes were already cheap here (C still in L2), and the steps cost about as much on ResNet's long-K tiles. On a quiet
# machine (wall = thread CPU time, 12 s interleaved): SqueezeNet 0.968, 0.980; MNIST 0.972, 0.977; ResNet-18 0.994,
# 1.008; ResNet-50 0.991, 0.998: never slower beyond noise, so it stays on
FUSE_EPILOGUES = True


@dataclass(frozen=True)
class Step:
  """v = op(v, x) (op(x, v) when swapped) on an element v of C at (batch, m, n): x is value when slot is None, else
  slot's element offset + batch * strides[0] + m * strides[1] + n * strides[2]."""

  op: Ops
  swapped: bool
  value: float = 0.0
  slot: int | None = None
  offset: int = 0
  strides: tuple[int, int, int] = (0, 0, 0)


@dataclass
class Gemm:
  """One contraction as the runtime computes it: sizes, tiles and blocks, its operands, its result's slot."""

  c: Contraction
  tile: tuple[int, int]
  block: tuple[int, int]
  a: Operand
  b: Operand
  result: int  # slot of the matrix C[batch][m][n]: a scratch buffer, or the output
  result_offset: int = 0  # elements into that buffer (a concat's branch writes its slice)
  ldc: int = 0  # C's row stride there, 0 for N (a last-axis concat's branch: the output's)
  steps: tuple[Step, ...] = ()  # the epilogue, applied to each finished tile (fused_steps) ...
  epilogue: UOp | None = None  # ... in place of this epilogue kernel (fuse_epilogues)

  @property
  def tasks(self) -> int:
    """The most tasks it splits into: a block each, or for a B packed in panels a row tile of a panel each (the
    runtime cuts a panel's rows into groups when threads outnumber the panels: runtime_c/aot_gemm.c panel_groups)."""
    c, (mc, nc) = self.c, self.block
    rows = -(-c.a.size // self.tile[0]) if self.b.pack is not None else -(-c.a.size // mc)
    return c.B * -(-c.N // nc) * rows


def _constants(side: Side, bufs: list) -> dict[int, np.ndarray] | None:
  """The arrays a constant operand is computed from, by slot; None when it reads a runtime buffer."""
  slots = {u.src[0].arg for u in side.expr.toposort() if u.op is Ops.LOAD}
  return {s: bufs[s].data for s in slots} if all(bufs[s].kind == "const" for s in slots) else None


def _readable(c: Contraction, side: Side, is_b: bool) -> tuple[int, int, tuple[int, int, int]] | None:
  """The operand's view (_view) when the microkernel can read it there: B's lanes must be contiguous (row stride 1)."""
  # (B's compact columns are not where the bound's strides have them)
  if is_b and c.compact:
    return None
  view = _view(side, c)
  return view if view is not None and (not is_b or view[2][1] == 1) else None


def _bounded(c: Contraction, side: Side, is_b: bool, R: int, bufs: list) -> bool:
  """Can the operand be formed without copying a constant many times over? A constant too big to pack that is no
  plain view would be as big in a dense copy: the contraction stays in the kernel's loops."""
  consts = _constants(side, bufs)
  return consts is None or _packs(c, side, R, list(consts.values())) or _readable(c, side, is_b) is not None


def _source_bytes(side: Side, bufs: list) -> int:
  """Bytes of the buffers an operand is computed from."""
  return sum(bufs[s].nbytes for s in {u.src[0].arg for u in side.expr.toposort() if u.op is Ops.LOAD})


def operand_form(c: Contraction, side: Side, is_b: bool, R: int, bufs: list) -> str:
  """The cheapest form of one operand (module docstring): "packed" (a constant), "view" (read where it lies),
  "panels" (B copied a panel at a time into its thread's buffer), "dense" (copied whole into the arena) or "window"
  (a convolution's input copied padded, read tap by tap: Contraction.window)."""
  if is_b and c.window is not None:
    return "window"
  consts = _constants(side, bufs)
  # (compact columns are laid out at the run's size, which a constant packed at compile time is not)
  if consts is not None and _packs(c, side, R, list(consts.values())) and not (is_b and c.compact):
    return "packed"
  # (a B big enough for panels is read contiguously from them rather than where it lies, where one batch's passes
  # PANEL_MAX_BYTES: module docstring)
  view = _readable(c, side, is_b) is not None
  big = not view or side.size * c.K * 4 > PANEL_MAX_BYTES
  if is_b and big and panel_rows(c, side, R, _source_bytes(side, bufs)) is not None:
    return "panels"
  if view:
    return "view"
  return "dense"


def _operand(c: Contraction, side: Side, is_b: bool, R: int, bufs: list, new_slot, make_buffer) -> Operand:
  """The operand in its form (operand_form)."""
  form = operand_form(c, side, is_b, R, bufs)
  if form == "window":
    # (a panel's copy, its columns whole rows of Wp: PaddedCopy)
    columns = c.window.rows * c.window.wide
    return Operand(-1, 0, (0, R, 1, 0), True, pack=c.window.pad, panel=(columns, columns))
  if form == "packed":
    packed = evaluate_operand(c, side, R, _constants(side, bufs))
    return Operand(new_slot(make_buffer("const", packed)), 0, (packed[0].size, c.K * R, 1, R), True)
  if form == "view":
    slot, offset, (sb, sr, sk) = _readable(c, side, is_b)
    # a B in the arena is read past its last column in whole tiles: the columns past it are the next k's, and past
    # the last k the arena's slack (AOT_ARENA_SLACK in runtime_c/aot_runtime.c) or the next buffer's bytes, into
    # lanes whose sums are dropped. Its edge tile copied instead cost each task a K x 32 copy: a 7x7 map's 1x1 conv
    # (49 columns) ran slower than an 8x8 one's (400x49x400 0.130 vs 0.099 ms; read in place 0.106). The caller's
    # memory (an input) and the weights' are not read past
    return Operand(slot, offset, (sb, R * sr, sr, sk), is_b and bufs[slot].kind == "scratch")
  if form == "panels" and c.compact:
    panel = CompactPanel.of(c, side)
    ld = -(-panel.columns // R) * R
    pack = compact_panel_operand(c, side, panel, R)
    return Operand(-1, 0, (0, R, 1, ld), True, pack=pack, panel=(panel.columns, ld), compact=panel)
  if form == "panels":
    h = panel_rows(c, side, R, _source_bytes(side, bufs))
    cols = h * prod(r.size for r in panel_cut(c, side)[1])
    ld = -(-cols // R) * R
    return Operand(-1, 0, (0, R, 1, ld), True, pack=panel_operand(c, side, h, ld), panel=(cols, ld))
  # rows padded to whole tiles, so the microkernel reads edge tiles in place
  rows, K = -(-side.size // R) * R, c.K
  slot = new_slot(make_buffer("scratch", c.B * rows * K))
  return Operand(
    slot, 0, (rows * K, R, 1, rows) if is_b else (rows * K, R * K, K, 1), True, dense_operand(c, side, is_b, rows)
  )


def _step_operand(x: UOp, c: Contraction) -> Step | None:
  """The leaf of an epilogue step (its op set later): a float constant, or a load of another buffer at an index linear
  in the flattened batch, m and n (a per-channel bias or scale, a residual read where C's element lies)."""
  if x.dtype != dtypes.float32:
    return None
  if x.op is Ops.CONST:
    return Step(Ops.ADD, False, float(x.arg)) if np.isfinite(x.arg) else None
  if x.op is not Ops.LOAD or x.src[0].arg == 0 or not (x.src[2].op is Ops.CONST and x.src[2].arg is True):
    return None
  terms, offset = linear(x.src[1])
  if offset < 0 or any(t.op is not Ops.RANGE for t in terms) or not set(terms) <= {*c.batch, *c.a.rows, *c.b.rows}:
    return None
  strides = tuple(flat_stride(group, terms) for group in (c.batch, c.a.rows, c.b.rows))
  return None if None in strides else Step(Ops.ADD, False, 0.0, x.src[0].arg, offset, strides)


def fused_steps(ast: UOp, g: Gemm, written: set[int] = frozenset()) -> tuple[Step, ...] | None:
  """The epilogue as steps the microkernel applies to each finished tile, when it is out[i] = f(C[i]) in place with f
  a chain of add, multiply, max and min of C's element with constants, per-row or per-column vectors or another
  buffer's element (bias, scale, ReLU and clip, a residual): the same ops in the same order, so bitwise the same
  result (a multiply feeding an add, which a C compiler may contract into one multiply-add, is rendered as the
  runtime's MUL_ADD on the c target: GemmCall). The kernel runs over the contraction's own ranges (a whole kernel, or
  a concat's slice: split_by_slices); written: slots the kernel's other contractions write, which no step may read."""
  c = g.c
  if not FUSE_EPILOGUES or ast.op is not Ops.STORE or g.result != 0:
    return None
  store_at = linear(ast.src[1])
  if store_at != linear(result_index(c, g.ldc) + g.result_offset):
    return None
  steps, v = [], ast.src[2]
  while not (v.op is Ops.LOAD and v.src[0].arg == 0):
    if v.op not in STEP_OPS or len(v.src) != 2:
      return None
    holds = [any(u.op is Ops.DEFINE_GLOBAL and u.arg == 0 for u in s.toposort()) for s in v.src]
    if holds.count(True) != 1:
      return None
    path = holds.index(True)
    leaf = _step_operand(v.src[1 - path], c)
    if leaf is None or leaf.slot in written:
      return None
    steps.append(replace(leaf, op=v.op, swapped=path == 1))
    v = v.src[path]
  if not (v.src[2].op is Ops.CONST and v.src[2].arg is True) or linear(v.src[1]) != store_at:
    return None
  steps.reverse()
  return tuple(steps) if steps else None


def lowerable_contractions(ast: UOp, bufs: list, tile: tuple[int, int]) -> list[Contraction]:
  """The kernel's contractions whose operands can be formed without copying a constant many times over (_bounded),
  each with B read from a padded copy of its input where that pays (_windowed)."""
  return [
    _windowed(c, bufs, tile)
    for c in find_contractions(ast, tile)
    if _bounded(c, c.a, False, tile[0], bufs) and _bounded(c, c.b, True, tile[1], bufs)
  ]


def _windowed(c: Contraction, bufs: list, tile: tuple[int, int]) -> Contraction:
  """The contraction reading B from a padded copy of a convolution's input (columns.padded_copy) where B would be
  copied tap by tap and A is packed weights (the microkernel reads them so then), else as it is."""
  if operand_form(c, c.b, True, tile[1], bufs) not in ("panels", "dense"):
    return c
  if operand_form(c, c.a, False, tile[0], bufs) != "packed":
    return c
  window = padded_copy(c, bufs, tile[1])
  return c if window is None else replace(c, window=window)


def _copy_key(c: Contraction, side: Side, is_b: bool) -> tuple:
  """An operand compared over positional ranges (each reduce has its own ranges): equal keys, equal copies."""
  axes = [*c.batch, *side.rows, *c.k]
  canon = {r: UOp(Ops.RANGE, dtypes.index, (), (i, r.size, "loop")) for i, r in enumerate(axes)}
  return (substitute(side.expr, canon), len(c.batch), len(side.rows), is_b)


def scratch_floats(ast: UOp, bufs: list, tile: tuple[int, int], found: list[Contraction] | None = None) -> int:
  """The floats of arena scratch lower_contractions makes for the kernel (its dense operand copies and the result
  matrices the output does not hold), from the same decisions, making nothing. found: its lowerable_contractions."""
  total, copies, placed = 0, set(), []
  for c in lowerable_contractions(ast, bufs, tile) if found is None else found:
    for side, is_b, R in ((c.a, False, tile[0]), (c.b, True, tile[1])):
      key = _copy_key(c, side, is_b)
      if key not in copies and operand_form(c, side, is_b, R, bufs) == "dense":
        copies.add(key)
        total += c.B * -(-side.size // R) * R * c.K
    if _in_place_offset(ast, bufs[0], c, placed) is None:
      total += c.B * c.a.size * c.b.size
    else:
      placed.append(c)
  return total


def lower_contractions(
  ast: UOp,
  bufs: list,
  tile: tuple[int, int],
  make_buffer,
  consts: dict | None = None,
  found: list[Contraction] | None = None,
) -> tuple[UOp, list, list[Gemm]]:
  """(the kernel that runs last, the kernel's buffers with new slots appended, its gemms). make_buffer(kind, array or
  size) makes a constant buffer holding an array, or a float32 scratch buffer of a size. consts: the constant
  operands formed for the other pieces of one kernel (pieces.py), by _copy_key: taken from and added to, so that a
  weight every piece reads is packed once. found: the kernel's lowerable_contractions, when known."""
  found = lowerable_contractions(ast, bufs, tile) if found is None else found
  if not found:
    return ast, bufs, []
  bufs, gemms, results = list(bufs), [], {}

  def new_slot(b) -> int:
    bufs.append(b)
    return len(bufs) - 1

  # concat branches often read one input the same way (the same window of it): its dense copy is written once
  copies: dict[tuple, Operand] = {}

  def operand(c: Contraction, side: Side, is_b: bool, R: int) -> Operand:
    key = _copy_key(c, side, is_b)
    if key in copies:
      return copies[key]
    if consts is not None and key in consts:
      return consts[key]
    o = _operand(c, side, is_b, R, bufs, new_slot, make_buffer)
    if o.dense is not None:
      copies[key] = replace(o, dense=None)
    elif consts is not None and o.pack is None and bufs[o.slot].kind == "const":
      consts[key] = o
    return o

  for c in found:
    mr, nr = tile
    a, b = operand(c, c.a, False, mr), operand(c, c.b, True, nr)
    # the output itself holds C when the kernel writes each element where C has it: the epilogue then reads and writes
    # in place, and no scratch matrix is needed
    place = _in_place_offset(ast, bufs[0], c, [p for p, slot, *_ in results.values() if slot == 0])
    results[c.acc] = (
      (c, 0, *place) if place is not None else (c, new_slot(make_buffer("scratch", c.B * c.a.size * c.b.size)), 0, 0)
    )
    gemms.append(Gemm(c, tile, blocks(c, mr, nr, b.panel[0]), a, b, *results[c.acc][1:]))
  return epilogue_kernel(ast, results), bufs, gemms


def fuse_epilogues(pieces: list[UOp], gemms: list[Gemm]) -> None:
  """Each epilogue piece (split_by_slices) that is one contraction's result through a chain of steps becomes that
  contraction's steps (Gemm.steps), and the piece its Gemm.epilogue: the microkernel applies them, the piece is not
  run."""
  written = {g.result for g in gemms}
  for piece in pieces:
    for g in gemms:
      if g.steps or (steps := fused_steps(piece, g, written)) is None:
        continue
      g.steps, g.epilogue = steps, piece
      break
