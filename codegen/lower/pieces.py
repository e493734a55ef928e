"""A contraction kernel run in pieces along one of its output ranges, to bound the arena scratch its lowering makes.

While a contraction kernel runs, the arena holds the dense copies of its operands (a convolution's window matrix, 9x
its input for a 3x3 window) and its result matrix when the output cannot hold it (a convolution followed by a 2x2 max
pool: 4x the pooled output). Where they would take the bytes alive at the kernel past ARENA_GOAL times the model's
largest tensor, the kernel is cut along one of its output ranges into equal pieces, each lowered on its own
(contract.py: smaller copies and result matrix) and run after the one before it. The memory plan takes each piece's
calls as a step of their own (Lowered.segments), so each piece's scratch reuses the bytes of the one before. Each
element is summed as in the whole kernel (k ascending, whatever the blocks), so the results are the same bits."""

from __future__ import annotations

from dataclasses import dataclass

from aot.codegen.lower.calls import Call, CallContext, Lowered
from aot.codegen.lower.contract import Contraction, Side, operand_form, range_pieces, scratch_floats
from aot.codegen.lower.microkernel import GemmLowered
from aot.core.ir import Ops, UOp, ranges_of
from aot.scheduler.kernel import Kernel

# the arena is held to this many times the model's largest tensor where cutting contraction kernels can do it. The
# CRNN's first convolution (a 32 x 32 x 160 result pooled 2x2) took it to 5x, its last (a 3x3 window matrix over 2 x
# 40 positions, 9x its input, swapped so that the positions fill the microkernel's 8-row tiles) to 5.8x; each in 2
# pieces, 3.5x, and the run as fast (0.98x, 1 thread, interleaved). A one-layer model is cut too (its only tensors
# are small): 3x3 convs over 7x7 images, 128 to 512 channels, in 7 pieces ran 0.94-0.99x the whole kernel's time
ARENA_GOAL = 4
# a kernel is cut into this many pieces at most: each piece's calls read the whole of the operands the cut range does
# not run along (the weights, from L3 again once per piece)
PIECES_MAX = 8


def _copied_ranges(found: list[Contraction], bufs: list, tile: tuple[int, int]) -> list[set[int]]:
  """The numbers of the ranges each operand copied at run time (whole or in panels) varies with."""
  return [
    {r.arg[0] for r in ranges_of(side.expr)}
    for c in found
    for side, is_b, R in ((c.a, False, tile[0]), (c.b, True, tile[1]))
    if operand_form(c, side, is_b, R, bufs) in ("dense", "panels")
  ]


def _scratch_bound(found: list[Contraction], bufs: list, tile: tuple[int, int]) -> int:
  """At least scratch_floats, cheaply: every result matrix, and every operand read at run time copied whole."""
  total = 0
  for c in found:
    total += c.B * c.a.size * c.b.size
    for side, R in ((c.a, tile[0]), (c.b, tile[1])):
      if _runtime(side, bufs):
        total += c.B * -(-side.size // R) * R * c.K
  return total


def _runtime(side: Side, bufs: list) -> bool:
  """Does the operand read a buffer computed at run time?"""
  return any(u.op is Ops.LOAD and bufs[u.src[0].arg].kind != "const" for u in side.expr.toposort())


def scratch_pieces(
  ast: UOp, bufs: list, tile: tuple[int, int], budget: int, found: list[Contraction]
) -> list[UOp] | None:
  """The kernel cut along one of its output ranges into the fewest equal pieces (at most PIECES_MAX) whose scratch
  each takes at most budget bytes, the outermost range first; None when the whole kernel's fits, or no cut does.
  found: the whole kernel's lowerable_contractions."""
  if ast.op is not Ops.STORE or 4 * _scratch_bound(found, bufs, tile) <= budget:
    return None
  if 4 * scratch_floats(ast, bufs, tile, found) <= budget:
    return None
  copied = _copied_ranges(found, bufs, tile)
  best = None
  for r in sorted(ranges_of(ast.src[1]), key=lambda r: r.arg[0]):
    # along a range some copied operand does not vary with, every piece would copy all of it again
    if any(r.arg[0] not in nums for nums in copied):
      continue
    # equal pieces fill the microkernel's tiles alike (an uneven cut leaves one piece an edge tile of its own)
    for n in (n for n in range(2, min(r.size, PIECES_MAX) + 1) if r.size % n == 0):
      if best is not None and n >= len(best):
        break
      pieces = range_pieces(ast, r, [r.size * i // n for i in range(n + 1)])
      if len(pieces) == n and all(4 * scratch_floats(p, bufs, tile) <= budget for p in pieces):
        best = pieces
        break
  return best


@dataclass
class PiecedLowered(Lowered):
  """A kernel lowered piece by piece (scratch_pieces): each part over the kernel's buffers, made[j] the slots part j
  added (its scratch and constants); pieces are all the parts' generated functions."""

  parts: list[Lowered]
  made: list[range]

  runtime_sources = GemmLowered.runtime_sources

  def functions(self) -> dict[UOp, str]:
    names: dict[UOp, str] = {}
    for j, part in enumerate(self.parts):
      for ast, suffix in part.functions().items():
        names.setdefault(ast, suffix if j == 0 else f"_piece{j}{suffix}")
    return names

  def main(self) -> UOp | None:
    return self.parts[0].main()

  def reads(self) -> set[int]:
    return set().union(*(part.reads() for part in self.parts))

  def panel_floats(self) -> int:
    return max(part.panel_floats() for part in self.parts)

  def segments(self) -> list[Kernel]:
    # each part touches the kernel's own buffers and the slots it made, none of the other parts'
    k, own = self.kernel, self.kernel.bufs[: self.made[0].start]
    return [Kernel(k.name, k.ast, [*own, *(k.bufs[s] for s in made)], k.shape) for made in self.made]

  def calls(self, ctx: CallContext) -> list[Call]:
    return [call for part in self.parts for call in part.calls(ctx)]
