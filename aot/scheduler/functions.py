"""Functions scheduled once: a call of a function whose results are all materialised (each output CONTIGUOUS) is not
inlined; the function's body is scheduled on its own and every call takes its kernels with the call's buffers. What
inlining would have fused across the call is a stage either way (the results are stored), so the kernels are the
same; what is saved is the walk over every call's copy of the body: an encoder's 13 Welford layer norms
(frontends/onnx_ops_contrib.py: a 384-step recurrence each) were 50k inlined nodes, 3 s of a 6 s compile.
A body whose schedule has index checks is inlined as before (the checks belong to the whole model's run)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from aot.core.dtype import dtypes
from aot.core.ir import BufferArg, Ops, UOp
from aot.core.rewrite import substitute
from aot.scheduler.kernel import Buffer, Kernel, Schedule


@dataclasses.dataclass
class CallSite:
  """A call kept out of the graph: its arguments (nodes of the graph, stored before the call's kernels run) and a
  placeholder BUFFER of kind "scratch" per function output, which the graph reads instead of the call."""

  body: Schedule
  args: list[UOp]
  results: list[UOp]


# a materialised function's body is scheduled once (off: every call inlined, for tests comparing the two)
SCHEDULE_ONCE = True


def materialised(fn: UOp) -> bool:
  return all(o.op is Ops.CONTIGUOUS for o in fn.src)


def _body_schedule(fn: UOp, schedule: Callable) -> Schedule:
  params = sorted((p for p in fn.toposort() if p.op is Ops.PARAM), key=lambda p: p.arg[0])
  ins = [UOp(Ops.BUFFER, p.dtype, (), BufferArg(p.arg[2], p.arg[1], "input")) for p in params]
  mapping = dict(zip(params, ins))
  outs = [substitute(o, mapping) for o in fn.src]
  for u in UOp(Ops.SINK, dtypes.void, tuple(outs)).toposort():
    u.shape  # noqa: B018 (shapes are derived on first use, recursively: bottom up, a 768-step recurrence stays shallow)
  return schedule(outs, ins, [f"{fn.arg}{k}" for k in range(len(outs))])


def separate_calls(outputs: list[UOp], schedule: Callable) -> tuple[list[UOp], list[CallSite]]:
  """The outputs with every call of a materialised function (innermost first) replaced by its placeholders, and the
  calls. Calls of one function with the same arguments are one call; each function is scheduled once."""
  bodies: dict[UOp, Schedule | None] = {}
  sites: dict[tuple, CallSite] = {}
  done: dict[UOp, UOp] = {}
  for u in UOp(Ops.SINK, dtypes.void, tuple(outputs)).toposort():
    src = tuple(done[s] for s in u.src)
    if u.op is Ops.CALL and SCHEDULE_ONCE and materialised(fn := src[0]):
      if fn not in bodies:
        body = _body_schedule(fn, schedule)
        bodies[fn] = body if not body.checks else None
      if bodies[fn] is not None:
        key = src
        if key not in sites:
          results = [
            UOp(Ops.BUFFER, o.dtype, (), BufferArg(f"{fn.arg}_result{k}", o.shape, "scratch"))
            for k, o in enumerate(fn.src)
          ]
          sites[key] = CallSite(bodies[fn], list(src[1:]), results)
        done[u] = sites[key].results[u.arg]
        continue
    done[u] = u if src == u.src else u.replace(src=src)
  return [done[o] for o in outputs], list(sites.values())


def call_kernels(site: CallSite, args: list[Buffer], results: list[Buffer]) -> list[Kernel]:
  """The body's kernels over this call's buffers: its inputs are the arguments' buffers, its outputs the results',
  and each of its scratch buffers one of the call's own (the memory plan lets calls share their space)."""
  body = site.body
  mapping = {id(b): a for b, a in zip(body.inputs, args)} | {id(b): r for b, r in zip(body.outputs, results)}
  mapping |= {id(b): dataclasses.replace(b) for b in body.scratch}
  return [Kernel(k.name, k.ast, [mapping.get(id(b), b) for b in k.bufs], k.shape) for k in body.kernels]


def place_calls(ctx, sites: list[CallSite], args: list[UOp], lowered: dict, deps: dict) -> dict:
  """Each call's kernels (separate_calls) under its first result's buffer id, which the kernel order then reaches
  as it reaches a stage: after the buffers of the call's arguments, before what reads a result."""
  calls: dict[int, list[Kernel]] = {}
  for site in sites:
    arg_bufs = [ctx.buffer_of(a) if a.op is Ops.BUFFER else ctx.stages[a] for a in args[: len(site.args)]]
    args = args[len(site.args) :]
    results = [ctx.buffer_of(r) for r in site.results]
    calls[id(results[0])] = call_kernels(site, arg_bufs, results)
    for k, r in enumerate(results):
      lowered[id(r)], deps[id(r)] = None, results[:k] or arg_bufs
  return calls


def renumbered(k: Kernel, i: int) -> Kernel:
  return dataclasses.replace(k, name=f"k{i}_" + k.name.split("_", 1)[1])
