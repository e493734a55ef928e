"""NAME_run_dims: the C API of an artifact with a ranged dim (frontends/batch_dims.py). The caller passes each input's
shape beside its data and gets each output's shape back; the shapes are checked (the dim in its range and the same in
every input that has it, every other dim as compiled), then the one-item program's calls run over the n_ items: once
for all of them where a call can (Call.fold: a contraction's rows or batch, its weights read once), the calls between
those one item after another.

The arena holds each scratch buffer's items one after another (item b of a buffer the one-item plan puts at offset o
is at checks_bytes + hi * o + b * its bytes: the plan's buffers scaled by the largest size, so no two overlap), after
the index checks' results of every item (scratch_item)."""

from __future__ import annotations

from dataclasses import dataclass, field

from aot.artifact import api_type, param_names
from aot.scheduler.kernel import Buffer, Schedule


def shape_names(sched: Schedule) -> tuple[list[str], list[str]]:
  """The shape parameter of each input and output: NAME_shape, unless a tensor is called that."""
  ins, outs = param_names(sched)
  used, out = set(ins + outs), []
  for n in ins + outs:
    s = f"{n}_shape"
    while s in used:
      s += "_"
    used.add(s)
    out.append(s)
  return out[: len(ins)], out[len(ins) :]


def run_dims_args(sched: Schedule) -> list[str]:
  """NAME_run_dims' parameters: each input's data and shape, then each output's."""
  ins, outs = param_names(sched)
  sins, souts = shape_names(sched)
  args = []
  for b, n, s in zip(sched.inputs, ins, sins):
    args += [f"const {api_type(b.dtype)} *{n}", f"const int64_t *{s}"]
  for b, n, s in zip(sched.outputs, outs, souts):
    args += [f"{api_type(b.dtype)} *{n}", f"int64_t *{s}"]
  return args


def run_dims_decl(name: str, sched: Schedule) -> str:
  d = sched.batch.dim
  return f"""/* runs the model on inputs whose dim '{d.name}' is any size in {d.lo}..{d.hi} (the same in every input
   that has it; every other dim as compiled): each tensor's data (dense row-major) then its shape (RANK int64_t),
   for the inputs then the outputs. An output's shape is written there (its pointer may be NULL); its buffer must
   hold that many elements ({name.upper()}_OUTPUTi_SIZE at the largest). A shape outside the range is
   AOT_ERR_INVALID_ARGUMENT, naming the input and the dim */
int {name}_run_dims({name}_model *m, {", ".join(run_dims_args(sched))});
"""


def run_dims_meta(P: str, sched: Schedule) -> list[str]:
  """NAME.h's defines for the ranged dim: its name and bounds, and which axis of each input and output it is."""
  d = sched.batch.dim
  meta = [
    f"#define {P}_NUM_DIMS 1",
    f'#define {P}_DIM0_NAME "{d.name}"',
    f"#define {P}_DIM0_MIN {d.lo}",
    f"#define {P}_DIM0_MAX {d.hi}",
  ]
  for kind, axes in (("INPUT", sched.batch.inputs), ("OUTPUT", sched.batch.outputs)):
    meta += [f"#define {P}_{kind}{i}_DIM0_AXIS {a}" for i, a in enumerate(axes)]
  return meta


def largest(b: Buffer, axis: int, hi: int) -> tuple:
  """The buffer's shape at the largest size of the dim (its one-item shape has 1 there)."""
  return tuple(hi if i == axis else s for i, s in enumerate(b.shape))


def _fail(status: str, fmt: str, *args: str) -> str:
  """A failed run's return: fmt is a printf format (names in it escaped by _percent)."""
  from aot.codegen.render.host_cpu import _c_string

  return f"return aot_fail(m->error, {status}, {', '.join([_c_string(fmt), *args])});"


def _input_checks(sched: Schedule, first: int) -> list[str]:
  """Each input's shape: NULL, a dim outside its range or unlike the first input's, another dim not as compiled."""
  from aot.codegen.render.host_cpu import _percent

  (sins, _), dim = shape_names(sched), _percent(sched.batch.dim.name)
  lo, hi = sched.batch.dim.lo, sched.batch.dim.hi
  lines, n0 = [], _percent(sched.inputs[first].name)
  for i, (b, s, a) in enumerate(zip(sched.inputs, sins, sched.batch.inputs)):
    bn = _percent(b.name)
    null = f"input {i} ('{bn}') shape is NULL"
    lines.append(f"  if (!{s}) {_fail('AOT_ERR_NULL_ARGUMENT', null)}")
    for j, size in enumerate(b.shape):
      got = f"(long long){s}[{j}]"
      if j == a:
        outside = f"input '{bn}' dim {j} ('{dim}') is %lld, outside {lo}..{hi}"
        lines.append(f"  if ({s}[{j}] < {lo} || {s}[{j}] > {hi}) {_fail('AOT_ERR_INVALID_ARGUMENT', outside, got)}")
        if i != first:
          unlike = f"input '{bn}' dim {j} ('{dim}') is %lld, but input '{n0}' has %lld"
          lines.append(f"  if ({s}[{j}] != n_) {_fail('AOT_ERR_INVALID_ARGUMENT', unlike, got, '(long long)n_')}")
      else:
        want = f"input '{bn}' dim {j} is %lld, the model takes {size}"
        lines.append(f"  if ({s}[{j}] != {size}) {_fail('AOT_ERR_INVALID_ARGUMENT', want, got)}")
    if i == first:
      lines.append(f"  n_ = {s}[{a}];")
  return lines


def run_dims_c(name: str, sched: Schedule) -> str:
  """run_dims_locked and NAME_run_dims, over model.c's run_locked (the one-item run)."""
  bd = sched.batch
  ins, outs = param_names(sched)
  sins, souts = shape_names(sched)
  first = next(i for i, a in enumerate(bd.inputs) if a >= 0)
  fills = []
  for b, s, a in zip(sched.outputs, souts, bd.outputs):
    dims = [("n_" if j == a else str(size)) for j, size in enumerate(b.shape)]
    fills.append(f"  if ({s}) {{ {' '.join(f'{s}[{j}] = {x};' for j, x in enumerate(dims))} }}")
  return f"""static int run_dims_locked({name}_model *m, {", ".join(run_dims_args(sched))}) {{
  m->error[0] = 0;
  int64_t n_ = 0;
{chr(10).join(_input_checks(sched, first))}
{chr(10).join(fills)}
  return run_locked(m, {", ".join(ins + outs)}, n_);
}}

API int {name}_run_dims({name}_model *m, {", ".join(run_dims_args(sched))}) {{
  if (!m) return AOT_ERR_NULL_ARGUMENT;
  pthread_mutex_lock(&m->lock);
  return unlock_with(m, run_dims_locked(m, {", ".join(n for pair in zip(ins + outs, sins + souts) for n in pair)}));
}}

"""


def checks_bytes(sched: Schedule) -> int:
  """The arena's first bytes: every item's index check results (int64 [position, value] per check)."""
  from aot.scheduler.memory import align_up

  return align_up(sched.batch.dim.hi * 2 * len(sched.checks) * 8)


def batch_arena(sched: Schedule, item_arena: int) -> int:
  """The arena of an artifact with a ranged dim: the checks, then the one-item plan at the largest size."""
  return checks_bytes(sched) + sched.batch.dim.hi * item_arena


def item_stride(sched: Schedule):
  """item(buffer): the elements from one item of it to the next; None for a buffer the items share (a constant, an
  input or output without the dim), and for every buffer of a schedule without a ranged dim."""
  bd = sched.batch
  if bd is None:
    return lambda b: None
  own = {id(b) for b, a in zip(sched.inputs + sched.outputs, bd.inputs + bd.outputs) if a >= 0}
  return lambda b: b.size if b.kind in ("scratch", "check") or id(b) in own else None


def scratch_item(sched: Schedule, b: Buffer) -> tuple[int, int]:
  """A scratch buffer's item 0 in the arena, and the bytes from one item to the next (the module's layout)."""
  return checks_bytes(sched) + sched.batch.dim.hi * b.offset, b.nbytes


def item_pointer(sched: Schedule, b: Buffer, where: str) -> str:
  """where (a buffer's pointer in the one-item program) at item b_."""
  if b.kind == "scratch":
    at, step = scratch_item(sched, b)
    return f"(A + {at} + b_ * {step})"
  if b.kind == "check":
    return f"({where} + b_ * {2 * len(sched.checks)})"
  return f"({where} + b_ * {b.size})" if item_stride(sched)(b) else where


@dataclass
class Segment:
  """Calls model.c runs together over the items (item_statements): one folded call, or the calls between folded ones,
  run one item after another. The arena is planned by segments (memory_plan takes them as kernels): within a
  segment, items interleave, so every buffer its calls touch lives for all of it."""

  bufs: list = field(default_factory=list)


def item_segments(sched: Schedule, low) -> list[Segment]:
  """The segments of a lowered schedule (codegen/lower/stage.py LoweredSchedule) in order, each with its calls'
  kernels' buffers."""
  item, out = item_stride(sched), []
  for lowered, calls in zip(low.lowered, low.kernel_calls):
    for call in calls:
      if call.fold(item) is not None:
        out.append(Segment(list(lowered.kernel.bufs)))
        out.append(Segment())
      else:
        if not out:
          out.append(Segment())
        out[-1].bufs += lowered.kernel.bufs
  return [seg for seg in out if seg.bufs]


def item_statements(sched: Schedule, calls: list, render, each_call: bool = False) -> list[str]:
  """model.c's statements over the items: a call folded over all of them runs once (at item 0); the calls between
  folded ones run one item after another, all of them for an item before the next (its activations still in cache:
  ResNet-18 at 16 items 0.92x a static batch's time, call by call over the items 1.01x). render(call) is a call's
  statement. each_call: every call over the items before the next (a GPU target's launches: the arena is planned
  by kernels there)."""
  item, out, loop = item_stride(sched), [], []

  def close_loop():
    if loop:
      out.append("  for (int64_t b_ = 0; b_ < n_; b_++) {\n" + "\n".join(loop) + "\n  }")
      loop.clear()

  for call in calls:
    if (folded := call.fold(item)) is not None:
      close_loop()
      out.append(f"  {{ const int64_t b_ = 0; (void)b_;\n  {render(folded).strip()}\n  }}")
    else:
      loop.append("  " + render(call).strip())
      if each_call:
        close_loop()
  close_loop()
  return out


def item_checks_c(sched: Schedule, check_c) -> str:
  """After the kernels: each item's index checks (check_c(i, check) a check's lines over checks_), the first failure
  naming its item."""
  lines = "".join(check_c(i, c.check, sched.batch.dim.name) for i, c in enumerate(sched.checks))
  return f"""  int status_ = AOT_OK;
  for (int64_t b_ = 0; b_ < n_ && status_ == AOT_OK; b_++) {{
    const int64_t *checks_ = (const int64_t *)A + b_ * {2 * len(sched.checks)};
{lines}  }}
  return status_;"""
