"""The memory plan: every scratch buffer gets an offset in one arena, reusing space between buffers whose lifetimes
(first write to last read, in kernel order) do not overlap."""

from __future__ import annotations

from itertools import accumulate

from aot.scheduler.kernel import Buffer, Kernel

ALIGN = 64  # a cache line, and enough for any vector load


def align_up(n: int) -> int:
  return (n + ALIGN - 1) // ALIGN * ALIGN


def lifetimes(kernels: list[Kernel]) -> tuple[dict[int, int], dict[int, int]]:
  """The first and the last kernel each buffer is used by (by buffer id)."""
  first: dict[int, int] = {}
  last: dict[int, int] = {}
  for i, k in enumerate(kernels):
    for b in k.bufs:
      first.setdefault(id(b), i)
      last[id(b)] = i
  return first, last


def live_bytes(kernels: list[Kernel]) -> list[int]:
  """The arena bytes of the scratch buffers alive at each kernel (used before it and after it, or by it): what any
  plan holds there at least."""
  first, last = lifetimes(kernels)
  change = [0] * (len(kernels) + 1)
  for b in {id(b): b for k in kernels for b in k.bufs if b.kind == "scratch"}.values():
    change[first[id(b)]] += align_up(b.nbytes)
    change[last[id(b)] + 1] -= align_up(b.nbytes)
  return list(accumulate(change))[:-1]


def memory_plan(kernels: list[Kernel], scratch: list[Buffer]) -> int:
  """Assign buf.offset to each scratch buffer; return the arena size in bytes. Largest first, best fit."""
  first, last = lifetimes(kernels)
  placed: list[tuple[int, int, int, int]] = []  # (offset, end, first, last)
  arena = 0
  for b in sorted(scratch, key=lambda b: (-b.nbytes, first.get(id(b), 0))):
    lo, hi, size = first.get(id(b), 0), last.get(id(b), 0), align_up(b.nbytes)
    busy = sorted((o, e) for o, e, f, l in placed if not (l < lo or f > hi))
    best, best_gap, cur = None, None, 0
    for o, e in busy:
      if o - cur >= size and (best_gap is None or o - cur < best_gap):
        best, best_gap = cur, o - cur
      cur = max(cur, e)
    if best is None:
      best = cur
    b.offset = best
    placed.append((best, best + size, lo, hi))
    arena = max(arena, best + size)
  return arena
