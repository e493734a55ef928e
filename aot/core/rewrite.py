"""Pattern rewriting: a pass is a PatternMatcher (a list of pattern -> function rules) applied by graph_rewrite."""

from __future__ import annotations

import inspect
from typing import Callable, Iterable

from aot.core.ir import Ops, UOp


class UPat:
  """A pattern over UOps. `op` is one Ops or a set; `src` a tuple of UPats matched in order; `name` binds the node."""

  __slots__ = ("ops", "src", "name", "arg", "dtype", "allow_any_len")

  def __init__(
    self, op=None, src: tuple | None = None, name: str | None = None, arg=None, dtype=None, allow_any_len: bool = False
  ):
    self.ops = None if op is None else (frozenset([op]) if isinstance(op, Ops) else frozenset(op))
    self.src, self.name, self.arg, self.dtype, self.allow_any_len = src, name, arg, dtype, allow_any_len

  @staticmethod
  def var(name: str, dtype=None) -> UPat:
    return UPat(name=name, dtype=dtype)

  @staticmethod
  def cvar(name: str) -> UPat:
    return UPat(Ops.CONST, name=name)

  def match(self, u: UOp, bound: dict) -> bool:
    if self.ops is not None and u.op not in self.ops:
      return False
    if self.arg is not None and u.arg != self.arg:
      return False
    if self.dtype is not None and u.dtype not in (
      self.dtype if isinstance(self.dtype, (set, frozenset, tuple)) else (self.dtype,)
    ):
      return False
    if self.name is not None:
      if (prev := bound.get(self.name)) is not None and prev is not u:
        return False
      bound[self.name] = u
    if self.src is not None:
      if len(u.src) < len(self.src) or (len(u.src) != len(self.src) and not self.allow_any_len):
        return False
      if not all(p.match(s, bound) for p, s in zip(self.src, u.src)):
        return False
    return True


class PatternMatcher:
  """Rules tried in order; the first whose pattern matches and whose function returns a UOp wins."""

  def __init__(self, rules: Iterable[tuple[UPat, Callable]]):
    self.rules = list(rules)
    self.by_op: dict[Ops, list] = {}
    for pat, fn in self.rules:
      takes_ctx = "ctx" in inspect.signature(fn).parameters
      for op in pat.ops if pat.ops is not None else list(Ops):
        self.by_op.setdefault(op, []).append((pat, fn, takes_ctx))

  def __add__(self, other: PatternMatcher) -> PatternMatcher:
    return PatternMatcher(self.rules + other.rules)

  def rewrite(self, u: UOp, ctx=None) -> UOp | None:
    for pat, fn, takes_ctx in self.by_op.get(u.op, ()):
      bound: dict = {}
      if pat.match(u, bound):
        ret = fn(ctx, **bound) if takes_ctx else fn(**bound)
        if ret is not None and ret is not u:
          return ret
    return None


def graph_rewrite(root: UOp, pm: PatternMatcher, ctx=None, leaf: Callable[[UOp], bool] | None = None) -> UOp:
  """Rewrite every node reachable from root to a fixed point. Rules are tried on a node before its sources are visited
  (so a rule can stop the walk, as lowering does at an INDEX) and again after its sources were rewritten. Nodes for
  which leaf is true are kept as they are and not walked into."""
  done: dict[UOp, UOp] = {}
  stack: list = [(root, 0, None)]
  while stack:
    u, stage, link = stack.pop()
    if stage == 2:  # u's result is link's result
      done[u] = done[link]
      continue
    if u in done:
      continue
    if leaf is not None and leaf(u):
      done[u] = u
      continue
    if stage == 0:
      if (new := pm.rewrite(u, ctx)) is not None:
        stack.append((u, 2, new))
        stack.append((new, 0, None))
        continue
      stack.append((u, 1, None))
      stack.extend((s, 0, None) for s in reversed(u.src) if s not in done)
      continue
    new_src = tuple(done[s] for s in u.src)
    if new_src != u.src:
      new = u.replace(src=new_src)
      stack.append((u, 2, new))
      stack.append((new, 0, None))
      continue
    if (new := pm.rewrite(u, ctx)) is not None:
      stack.append((u, 2, new))
      stack.append((new, 0, None))
      continue
    done[u] = u
  return done[root]


def substitute(root: UOp, mapping: dict[UOp, UOp]) -> UOp:
  """Replace nodes by others everywhere below root (used to inline calls and renumber kernels)."""
  done: dict[UOp, UOp] = {}
  for u in root.toposort(stop=lambda u: u in mapping):
    if u in mapping:
      done[u] = mapping[u]
      continue
    new_src = tuple(done[s] for s in u.src)
    done[u] = u if new_src == u.src else u.replace(src=new_src)
  return done[root]
