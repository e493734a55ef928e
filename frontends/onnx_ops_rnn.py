"""ONNX recurrent operators, unrolled over the sequence length (a ranged one's bound: _run_steps): RNN, GRU, LSTM
and their shared helpers (activations, the step loop, outputs), and the stateful CausalConvWithState and
LinearAttention.

RNN, GRU and LSTM: the input product for every step and direction is one batched matmul ahead of the recurrence
(_project); each step then runs both directions as one batch: a product h R^T with the gates in its epilogue, and for
LSTM one kernel writing h beside c (GRU: two products). Each step's state is a stage from the start, and the steps'
kernels read the input product at one offset each, so they share their generated functions (calls.py rebase_reads)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from aot.core.dtype import dtypes
from aot.core.ir import Ops, UOp
from aot.core.rewrite import substitute
from aot.frontends.batch_dims import note_recurrence, recurrence_at_run
from aot.frontends.onnx import Unsupported, op
from aot.frontends.onnx_ops_attention import _heads
from aot.frontends.onnx_ops_nn import _conv, _f32, _reduce
from aot.frontends.tensor import Tensor
from aot.scheduler.kernel import StepGuard

# *** recurrent layers: unrolled over the sequence length ***

_ACT = {
  "relu": lambda x, a, b: x.relu(),
  "tanh": lambda x, a, b: x.tanh(),
  "sigmoid": lambda x, a, b: x.sigmoid(),
  "affine": lambda x, a, b: x * a + b,
  "leakyrelu": lambda x, a, b: (x < 0).where(x * a, x),
  "thresholdedrelu": lambda x, a, b: (x > a).where(x, 0.0),
  "scaledtanh": lambda x, a, b: (x * b).tanh() * a,
  "hardsigmoid": lambda x, a, b: (x * a + b).maximum(0).minimum(1),
  "elu": lambda x, a, b: (x < 0).where(a * (x.exp() - 1), x),
  "softsign": lambda x, a, b: x / (x.abs() + 1),
  "softplus": lambda x, a, b: (x.exp() + 1).log(),
}
_ACT_DEFAULTS = {
  "leakyrelu": (0.01, 0.0),
  "thresholdedrelu": (1.0, 0.0),
  "hardsigmoid": (0.2, 0.5),
  "elu": (1.0, 0.0),
  "scaledtanh": (1.0, 1.0),
  "affine": (1.0, 0.0),
}


@dataclass(frozen=True)
class Activation:
  """One of a recurrent layer's activations: its (lower-case) name and alpha, beta."""

  name: str
  alpha: float
  beta: float

  def __call__(self, x):
    return _ACT[self.name](x, self.alpha, self.beta)


def _activations(names, alphas, betas, defaults, ndir):
  """One list of Activations per direction; alpha/beta are consumed in order by the activations that take them."""
  names = list(names) if names else defaults * ndir
  alphas, betas = list(alphas or []), list(betas or [])
  fns = []
  for nm in names:
    k = nm.lower()
    if k not in _ACT:
      raise Unsupported(f"activation {nm!r}")
    a, b = _ACT_DEFAULTS.get(k, (0.0, 0.0))
    if k in _ACT_DEFAULTS:
      if alphas:
        a = alphas.pop(0)
      if betas and k in ("hardsigmoid", "scaledtanh", "affine"):
        b = betas.pop(0)
    fns.append(Activation(k, a, b))
  per = len(names) // ndir
  return [fns[d * per : (d + 1) * per] for d in range(ndir)]


def _sigmoid_tanh(x, tanh_from: int):
  """sigmoid of x's columns before tanh_from and tanh of the rest, as one expression over the whole tensor
  (tanh(x) = 2 sigmoid(2x) - 1): each gate slice read alone would make the product's result a stage the activations
  are computed from in the next kernel; activated as one tensor they are the product's epilogue."""
  s = np.ones(x.shape[-1], dtype=x.dtype.np)
  s[tanh_from:] = 2
  return (x * Tensor(s)).sigmoid() * Tensor(s) - Tensor(s - 1)


def _project(x, w, bias, ndir, direction):
  """Every step's input product at once, both directions in one batched matmul over T*B rows, with the input-side
  bias: X (T, B, I) times W^T, in the order the steps run (the backward direction's reversed), as (T, ndir, B, G*H):
  step s reads [s] at one place, so every step's kernels are the same functions (calls.py rebase_reads); the
  recurrence multiplies by R only. Unrolled per step, W was packed once per step and each product had one row."""
  T, B, I = x.shape
  gh = w.shape[1]
  xs = Tensor.stack([x.flip(0) if _reversed(direction, d) else x for d in range(ndir)]).reshape(ndir, T * B, I)
  xw = xs.matmul(w.transpose(1, 2)) + bias.reshape(ndir, 1, gh)
  return xw.reshape(ndir, T, B, gh).permute(1, 0, 2, 3).contiguous()


# steps per stored chunk of the outputs (_run_steps)
OUT_CHUNK = 8


def _reversed(direction, d) -> bool:
  return direction == "reverse" or d == 1


def _act(fns, x):
  """x (ndir, ...) through each direction's activation fns[d]: one expression where they are the same."""
  if all(f == fns[0] for f in fns):
    return fns[0](x)
  return Tensor.cat([f(x[d : d + 1]) for d, f in enumerate(fns)], 0)


def _run_steps(x, proj, ndir, direction, lens, step, init, given):
  """Run step(x_s, state) -> (h, state) over the steps of x (T, B, I) and its input product proj, the directions
  batched ((ndir, B, ...) tensors: step s is the forward direction's time s and the backward's T-1-s, the products one
  batched call): (each direction's outputs by time, each direction's final state). Steps past a sequence's length
  keep the state and output zeros. Along a dim with a range (frontends/extent_dims.py) T is the bound's: each step's
  stages are marked with it (StepGuard), and the backward direction's reversals and the final state are made at the
  run's length (_finals_at_run). given: the node's other inputs (its weights, initial state: the graph's nodes, not
  the recurrence's own)."""
  T, ranged = x.shape[0], recurrence_at_run()
  times = [[T - 1 - s if _reversed(direction, d) else s for d in range(ndir)] for s in range(T)]
  state, outs, states = init, [], []
  for s in range(T):
    h, new = step(proj[s], state)
    if lens is not None:
      live = Tensor(np.stack([t < lens for t in times[s]]).reshape(ndir, -1, 1))
      new = tuple(live.where(nv, ov) for nv, ov in zip(new, state))
      h = live.where(h, 0.0)
    # each step's state is read by the next step's kernels and the output's: stored as it is made, not found one
    # step per round by the scheduler's fixpoint (a 40-step CRNN took 80 rounds, most of its 56 s compile)
    state = tuple(_stored(x) for x in new)
    state = _of_step(state, StepGuard(T, s)) if ranged else state
    outs.append(state[0] if lens is None else h)
    states.append(state)
  # the outputs (T, ndir, B, H) in two levels, chunks of steps stored and then Y from the chunks: a concat of n
  # pieces evaluates n gated loads an element, and 80 (40 steps, 2 directions) took a CRNN's Y 0.17 ms a layer
  finals = [tuple(x[d] for x in state) for d in range(ndir)]
  if T <= OUT_CHUNK and not ranged:
    y = Tensor.stack([outs[times[t][d]][d] for t in range(T) for d in range(ndir)])
    return y.reshape(T, ndir, *outs[0].shape[1:]), finals
  steps = _stacked(outs, OUT_CHUNK, T if ranged else 0)
  y = Tensor.stack([steps[:, d].flip(0) if _reversed(direction, d) else steps[:, d] for d in range(ndir)], axis=1)
  if ranged:
    last = _finals_at_run(steps, states) if lens is None else [Tensor.stack(f) for f in zip(*finals)]
    finals = [tuple(f[d] for f in last) for d in range(ndir)]
    note_recurrence(x.uop, [y.uop, *(f.uop for f in last)], [t.uop for t in given if t is not None], lens is not None)
  return y, finals


def _finals_at_run(steps: Tensor, states: list[tuple[Tensor, ...]]) -> list[Tensor]:
  """Each part of the final state (h, and LSTM's c), (ndir, B, H), where the run's length is given at run time: both
  directions end at step T(n) - 1 (the backward one runs the input reversed), read as the first of the steps' states
  reversed along the steps, a reversal the proof makes at the run's length (extent_dims._reversed_at_run)."""
  T = len(states)
  parts = [steps] + [_stacked([st[k] for st in states], OUT_CHUNK, T) for k in range(1, len(states[0]))]
  return [p.flip(0)[0] for p in parts]


def _rnn_setup(n, x, w, r, b, seq_lens, h0, layout, direction, gates, extra=None):
  if layout:
    x = x.transpose(0, 1)
  T, B = x.shape[:2]
  H = r.shape[-1]
  ndir = 2 if direction == "bidirectional" else 1
  if b is None:
    b = Tensor(np.zeros((ndir, 2 * gates * H), dtype=x.dtype.np))
  if h0 is not None and layout:
    h0 = h0.transpose(0, 1)
  lens = n.const(seq_lens, "sequence_lens") if seq_lens is not None else None
  if lens is not None and (lens == T).all():
    lens = None
  return x, T, B, H, ndir, b, h0, lens


def _run_dirs(x, T, ndir, direction, lens, step, init):
  """Run step(d, x_t, state) -> (h, state) over time in each direction apart (the quantized LSTM, whose products
  quantize each direction's h with its own range): _run_steps' result (Y one concat of every step's output)."""
  ys, finals = [], []
  for d in range(ndir):
    rev = direction == "reverse" or d == 1
    state, out = init(d), [None] * T
    for t in reversed(range(T)) if rev else range(T):
      h, new = step(d, x[t], state)
      if lens is not None:
        live = Tensor((t < lens).reshape(-1, 1))
        new = tuple(live.where(nv, ov) for nv, ov in zip(new, state))
        h = live.where(h, 0.0)
      # each step's state is read by the next step's kernels and the output's: stored as it is made, not found one
      # step per round by the scheduler's fixpoint (a 40-step CRNN took 80 rounds, most of its 56 s compile)
      state = tuple(_stored(s) for s in new)
      out[t] = state[0] if lens is None else h
    ys.append(out)
    finals.append(state)
  # Y from stored chunks of steps, as _run_steps builds it: one concat of all 80 steps (a 40-step bidirectional
  # layer) was lowered into each reader (the next layer's dynamic quantization, its min and its max: 0.9 s each)
  # and evaluated 80 gated loads an element there
  y = _stacked([y[t] for t in range(T) for y in ys], OUT_CHUNK * ndir)
  return y.reshape(T, ndir, *ys[0][0].shape), finals


def _stacked(pieces: list[Tensor], chunk: int, steps: int = 0) -> Tensor:
  """The pieces stacked, in stored chunks of this many when there are more (a concat of n pieces evaluates n gated
  loads an element wherever it is read). steps: the pieces are a recurrence's steps over a ranged dim (its length
  at the bound): a chunk is stored only where the run reaches its first step (StepGuard)."""
  if len(pieces) <= chunk:
    return Tensor.stack(pieces)
  stored = [_stored(Tensor.stack(pieces[i : i + chunk])) for i in range(0, len(pieces), chunk)]
  if steps:
    stored = [_of_step((c,), StepGuard(steps, i * chunk))[0] for i, c in enumerate(stored)]
  return Tensor.cat(stored)


def _viewed(x: Tensor) -> UOp:
  """The node x is a slice or reshape of (x's own where it is neither)."""
  u = x.uop
  while u.op in (Ops.SHRINK, Ops.RESHAPE):
    u = u.src[0]
  return u


def _stored(x: Tensor) -> Tensor:
  """x as a stage of its own (stored once, read by the next step and the outputs); a value the step also reads itself
  (LSTM's c) is stored before those reads, else its stage would be copied into this one."""
  return x if _viewed(x).op is Ops.CONTIGUOUS else x.contiguous()


def _of_step(xs: tuple[Tensor, ...], guard: StepGuard) -> tuple[Tensor, ...]:
  """xs (views of stored stages: _stored) with their stages marked as made by a recurrence's step, which the run
  makes only where its length passes the step (aot/scheduler/runtime_extent.py guard_steps)."""
  roots = {u: UOp(Ops.CONTIGUOUS, u.dtype, u.src, guard) for u in map(_viewed, xs)}
  return tuple(Tensor(substitute(x.uop, roots)) for x in xs)


def _rnn_outputs(y, finals, layout, x_dtype):
  hs = [Tensor.stack([f[i] for f in finals], axis=0) for i in range(len(finals[0]))]
  if layout:
    y, hs = y.permute(2, 0, 1, 3), [h.transpose(0, 1) for h in hs]
  return (y.cast(x_dtype), *[h.cast(x_dtype) for h in hs])


def _clip(x, clip):
  return x.maximum(-clip).minimum(clip) if clip is not None else x


@op("RNN", since=7)
def rnn(
  n,
  x,
  w,
  r,
  b=None,
  sequence_lens=None,
  initial_h=None,
  activation_alpha=None,
  activation_beta=None,
  activations=None,
  clip=None,
  direction="forward",
  hidden_size=None,
  layout=0,
):
  x, T, B, H, ndir, b, h0, lens = _rnn_setup(n, x, w, r, b, sequence_lens, initial_h, layout, direction, 1)
  given = (w, r, b, initial_h)
  acts = _activations(activations, activation_alpha, activation_beta, ["Tanh"], ndir)
  proj = _project(x, w, b[:, :H] + b[:, H:], ndir, direction)
  rt = r.transpose(1, 2)

  def step(xs, st):
    h = _act([a[0] for a in acts], _clip(xs + st[0].matmul(rt), clip))
    return h, (h,)

  init = (h0 if h0 is not None else Tensor(np.zeros((ndir, B, H), dtype=x.dtype.np)),)
  return _rnn_outputs(*_run_steps(x, proj, ndir, direction, lens, step, init, given), layout, x.dtype)


@op("GRU", since=7)
def gru(
  n,
  x,
  w,
  r,
  b=None,
  sequence_lens=None,
  initial_h=None,
  activation_alpha=None,
  activation_beta=None,
  activations=None,
  clip=None,
  direction="forward",
  hidden_size=None,
  layout=0,
  linear_before_reset=0,
):
  x, T, B, H, ndir, b, h0, lens = _rnn_setup(n, x, w, r, b, sequence_lens, initial_h, layout, direction, 3)
  given = (w, r, b, initial_h)
  acts = _activations(activations, activation_alpha, activation_beta, ["Sigmoid", "Tanh"], ndir)
  rb = b[:, 3 * H :]
  # the hidden gate's recurrent bias is inside the reset gate's product with linear_before_reset, else beside it
  in_bias = rb if not linear_before_reset else Tensor.cat([rb[:, : 2 * H], rb[:, 2 * H :] * 0], 1)
  proj = _project(x, w, b[:, : 3 * H] + in_bias, ndir, direction)
  ones = Tensor(np.ones((ndir, B, H), dtype=x.dtype.np))
  f, g = (lambda x: _act([a[0] for a in acts], x)), (lambda x: _act([a[1] for a in acts], x))

  def step(xw, st):
    hp = st[0]
    if linear_before_reset:
      # the gates activated apart, each read once: all of them computed in the kernel of h
      hr = hp.matmul(r.transpose(1, 2))
      z = f(_clip(xw[..., :H] + hr[..., :H], clip))
      rbh = rb[:, 2 * H :].reshape(ndir, 1, H)
      hh = f(_clip(xw[..., H : 2 * H] + hr[..., H : 2 * H], clip)) * (hr[..., 2 * H :] + rbh)
    else:
      # z beside r * h (the second product's operand) as one tensor, the first product's epilogue: each column's
      # activation read once, where z and r apart were a stage and r * h another
      zrh = f(_clip(xw[..., : 2 * H] + hp.matmul(r[:, : 2 * H].transpose(1, 2)), clip)) * Tensor.cat([ones, hp], 2)
      z, hh = zrh[..., :H], zrh[..., H:].matmul(r[:, 2 * H :].transpose(1, 2))
    # (1 - z) ht + z hp with ht read once, so it is computed where h is (the last product's epilogue)
    h = hp + (1 - z) * (g(_clip(xw[..., 2 * H :] + hh, clip)) - hp)
    return h, (h,)

  init = (h0 if h0 is not None else Tensor(np.zeros((ndir, B, H), dtype=x.dtype.np)),)
  return _rnn_outputs(*_run_steps(x, proj, ndir, direction, lens, step, init, given), layout, x.dtype)


@op("LSTM", since=7)
def lstm(
  n,
  x,
  w,
  r,
  b=None,
  sequence_lens=None,
  initial_h=None,
  initial_c=None,
  p=None,
  activation_alpha=None,
  activation_beta=None,
  activations=None,
  clip=None,
  direction="forward",
  hidden_size=None,
  input_forget=0,
  layout=0,
):
  x, T, B, H, ndir, b, h0, lens = _rnn_setup(n, x, w, r, b, sequence_lens, initial_h, layout, direction, 4)
  given = (w, r, b, initial_h, initial_c, p)
  if initial_c is not None and layout:
    initial_c = initial_c.transpose(0, 1)
  acts = _activations(activations, activation_alpha, activation_beta, ["Sigmoid", "Tanh", "Tanh"], ndir)
  proj = _project(x, w, b[:, : 4 * H] + b[:, 4 * H :], ndir, direction)
  rt, peep = r.transpose(1, 2), p.reshape(ndir, 1, 3 * H) if p is not None else None

  def step(xs, st):
    return lstm_cell(acts, xs + st[0].matmul(rt), st[1], peep, H, clip, input_forget)

  zeros = Tensor(np.zeros((ndir, B, H), dtype=x.dtype.np))
  init = (h0 if h0 is not None else zeros, initial_c if initial_c is not None else zeros)
  return _rnn_outputs(*_run_steps(x, proj, ndir, direction, lens, step, init, given), layout, x.dtype)


def lstm_cell(acts, gts, cp, p, H, clip, input_forget):
  """One LSTM step from its gate pre-activations gts (..., 4H, gates i o f c), its directions on the first axis with
  their activations acts[d] (one direction: 2-D gts): -> (h, (h, c)). With the default activations and no peepholes
  the gates are activated as one tensor (_sigmoid_tanh), in the product's epilogue."""
  f, g, hf = [lambda x, k=k: _act([a[k] for a in acts], x) for k in range(3)]
  if p is None and all((a[0].name, a[1].name) == ("sigmoid", "tanh") for a in acts):
    a = _sigmoid_tanh(_clip(gts, clip), 3 * H)
    i, o, fg, gg = a[..., :H], a[..., H : 2 * H], a[..., 2 * H : 3 * H], a[..., 3 * H :]
    # h and c stored side by side, by one kernel: c is computed for each half (a few operations), as one c read at
    # two places would be a stage, a kernel of its own; the two are written apart (operands swapped) so that they are
    # not one node
    c = (1 - i if input_forget else fg) * cp + i * gg
    c_again = gg * i + cp * (-i + 1 if input_forget else fg)
    hc = Tensor.cat([o * hf(c_again), c], -1).contiguous()
    return hc[..., :H], (hc[..., :H], hc[..., H:])

  def gate(k, c):
    # without peepholes nothing is added: 0 * c is a product a kernel would compute (NaN for an infinite c)
    pre = gts[..., k * H : (k + 1) * H]
    return pre + p[..., k * H : (k + 1) * H] * c if p is not None else pre

  i = f(_clip(gate(0, cp), clip))
  fg = 1 - i if input_forget else f(_clip(gate(2, cp), clip))
  c = _stored(fg * cp + i * g(_clip(gts[..., 3 * H :], clip)))
  o = f(_clip(gate(1, c), clip))
  h = o * hf(c)
  return h, (h, c)


@op("CausalConvWithState", since=27)
def causal_conv_with_state(n, x, w, b=None, past_state=None, activation="none"):
  if activation not in ("none", "silu", "swish"):
    raise Unsupported(f"activation {activation!r}")
  B, C, L = x.shape
  k = w.shape[2]
  pad = past_state if past_state is not None else Tensor(np.zeros((B, C, k - 1), dtype=x.dtype.np))
  padded = Tensor.cat([pad, x], 2) if k > 1 else x
  y = _conv(padded, w, b, (1,), 0, (1,), C).cast(x.dtype)
  if activation != "none":
    y = (_f32(y) * _f32(y).sigmoid()).cast(x.dtype)
  return y, padded.shrink([None, None, (padded.shape[2] - (k - 1), padded.shape[2])])


@op("LinearAttention", since=27)
def linear_attention(
  n,
  q,
  k,
  v,
  past_state=None,
  decay=None,
  beta=None,
  chunk_size=None,
  kv_num_heads=None,
  q_num_heads=None,
  scale=None,
  update_rule="gated_delta",
):
  """The recurrent form, unrolled over the (static) sequence: state (B, Hkv, dk, dv) updated once per step."""
  if update_rule not in ("linear", "gated", "delta", "gated_delta"):
    raise Unsupported(f"update_rule {update_rule!r}")
  f = dtypes.float32
  B, T, _ = q.shape
  q4, k4, v4 = [_heads(t, h).cast(f) for t, h in ((q, q_num_heads), (k, kv_num_heads), (v, kv_num_heads))]
  dk, dv, grp = q4.shape[-1], v4.shape[-1], q_num_heads // kv_num_heads
  if decay is not None:
    decay = (
      decay.reshape(B, T, kv_num_heads, 1).permute(0, 2, 1, 3)
      if decay.shape[-1] == kv_num_heads
      else _heads(decay, kv_num_heads)
    ).cast(f)
  if beta is not None:
    beta = beta.reshape(B, T, beta.shape[-1], 1).permute(0, 2, 1, 3).cast(f)
  state = past_state.cast(f) if past_state is not None else Tensor(np.zeros((B, kv_num_heads, dk, dv), np.float32))
  sc = float(scale) if scale else 1.0 / math.sqrt(dk)
  outs = []
  for i in range(T):
    kt, vt = k4[:, :, i, :], v4[:, :, i, :]
    if decay is not None:
      state = state * decay[:, :, i, :].exp().unsqueeze(-1)
    if beta is not None:
      vt = beta[:, :, i, :] * (vt - _reduce(state * kt.unsqueeze(-1), "sum", (2,)))
    state = state + kt.unsqueeze(-1) * vt.unsqueeze(-2)
    rd = state if grp == 1 else state.unsqueeze(2).expand(B, kv_num_heads, grp, dk, dv).reshape(B, q_num_heads, dk, dv)
    outs.append(_reduce(q4[:, :, i, :].unsqueeze(-1) * rd, "sum", (2,)) * sc)
  y = Tensor.stack(outs, axis=2).permute(0, 2, 1, 3).reshape(B, T, -1).cast(q.dtype)
  return y, state.cast(past_state.dtype if past_state is not None else q.dtype)
