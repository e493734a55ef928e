"""ONNX control flow with static shapes: If folds when its condition is known (else both branches run and the result
is selected), Loop and Scan unroll over a trip count known at compile time."""

from __future__ import annotations

import numpy as np

from aot.frontends.onnx import NeedsConstant, Unsupported, op
from aot.frontends.tensor import Tensor


def _known(n, t: Tensor):
  """t's value if the compiler can know it, else None."""
  try:
    return n.const(t, "condition")
  except NeedsConstant:
    return None


@op("If")
def if_(n, cond, then_branch=None, else_branch=None):
  c = _known(n, cond)
  if c is not None:
    return n.subgraph(then_branch if bool(np.asarray(c).reshape(-1)[0]) else else_branch, [])
  a, b = n.subgraph(then_branch, []), n.subgraph(else_branch, [])
  if not all(isinstance(x, Tensor) for x in a + b):
    n.const(cond, "the condition of an If whose branches give sequences or optionals")  # a list is not selected
  for x, y in zip(a, b):
    if x.shape != y.shape or x.dtype != y.dtype:
      raise Unsupported(
        f"the condition is only known at run time and the branches give different results "
        f"({x.shape} {x.dtype.name} vs {y.shape} {y.dtype.name}); pin the inputs it depends on with --bind"
      )
  c = cond.reshape(())
  return [c.where(x, y) for x, y in zip(a, b)]


@op("Loop")
def loop(n, trip_count=None, cond=None, *carried, body=None):
  m = _known(n, trip_count) if trip_count is not None else None
  keep_going = _known(n, cond) if cond is not None else np.array(True)
  if m is None and keep_going is None:
    # unrolling needs the trip count: say which input decides it, so it can be bound (--bind)
    n.const(trip_count if trip_count is not None else cond, "the trip count")
  m = int(np.asarray(m).reshape(-1)[0]) if m is not None else None
  n_carried = len(carried)
  vals, scans, i = list(carried), [], 0
  active = None  # a run-time condition: iterations after it turns false leave the values unchanged
  limit = m if m is not None else LOOP_UNROLL_LIMIT
  while i < limit:
    if keep_going is not None and not bool(np.asarray(keep_going).reshape(-1)[0]):
      break
    c_in = Tensor(np.array(True)) if active is None else active
    outs = n.subgraph(body, [Tensor(np.array(i, dtype=np.int64)), c_in, *vals])
    new_cond, new_vals, scan_outs = outs[0], outs[1 : 1 + n_carried], outs[1 + n_carried :]
    if active is not None:
      new_vals = [active.where(v, old) for v, old in zip(new_vals, vals)]
      if scan_outs:
        raise Unsupported("scan outputs with a condition known only at run time have a run-time length")
    vals = list(new_vals)
    scans.append(scan_outs)
    keep_going = _known(n, new_cond)
    if keep_going is None:
      if m is None:
        raise Unsupported("the loop condition is only known at run time and there is no trip count")
      active = new_cond.reshape(()) if active is None else active & new_cond.reshape(())
      keep_going = None
    i += 1
  if i >= LOOP_UNROLL_LIMIT and m is None:
    raise Unsupported(f"the loop runs more than {LOOP_UNROLL_LIMIT} iterations")
  n_scan = len(body.output) - 1 - n_carried
  stacked = [Tensor.stack([s[k] for s in scans], axis=0) if scans else None for k in range(n_scan)]
  if any(s is None for s in stacked):
    raise Unsupported("a loop with zero iterations has empty scan outputs of unknown shape")
  return vals + stacked


# a loop whose trip count comes only from its condition is unrolled at most this far
LOOP_UNROLL_LIMIT = 1024


@op("Scan", since=9)
def scan(
  n,
  *inputs,
  body=None,
  num_scan_inputs=0,
  scan_input_axes=None,
  scan_input_directions=None,
  scan_output_axes=None,
  scan_output_directions=None,
):
  n_state = len(inputs) - num_scan_inputs
  states, xs = list(inputs[:n_state]), inputs[n_state:]
  in_axes = [a % x.ndim for a, x in zip(scan_input_axes or [0] * len(xs), xs)]
  in_dirs = scan_input_directions or [0] * len(xs)
  length = xs[0].shape[in_axes[0]] if xs else 0
  per_step = []
  for t in range(length):
    step_in = []
    for x, ax, d in zip(xs, in_axes, in_dirs):
      k = length - 1 - t if d else t
      step_in.append(x.shrink([(k, k + 1) if i == ax else None for i in range(x.ndim)]).squeeze(ax))
    outs = n.subgraph(body, [*states, *step_in])
    states = outs[:n_state]
    per_step.append(outs[n_state:])
  n_out = len(body.output) - n_state
  out_axes = scan_output_axes or [0] * n_out
  out_dirs = scan_output_directions or [0] * n_out
  results = []
  for k in range(n_out):
    seq = [s[k] for s in per_step]
    if out_dirs[k]:
      seq = seq[::-1]
    ax = out_axes[k] % (seq[0].ndim + 1)
    results.append(Tensor.stack(seq, axis=ax))
  return states + results


@op("Scan", since=8)
def scan_v8(n, sequence_lens, *inputs, body=None, num_scan_inputs=0, directions=None):
  if sequence_lens is not None:
    raise Unsupported("sequence_lens is not supported")
  # opset 8 puts a batch axis first: each batch element is one opset-9 scan, and the results are stacked
  per_batch = [
    scan(n, *[x[b] for x in inputs], body=body, num_scan_inputs=num_scan_inputs, scan_input_directions=directions)
    for b in range(inputs[0].shape[0])
  ]
  return [Tensor.stack([pb[k] for pb in per_batch], axis=0) for k in range(len(per_batch[0]))]
