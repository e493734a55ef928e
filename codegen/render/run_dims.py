"""NAME_run_dims: the C API of an artifact with a ranged dim (frontends/batch_dims.py). The caller passes each input's
shape beside its data and gets each output's shape back; the shapes are checked (the dim in its range and the same in
every input that has it, every other dim as compiled), then the one-item program's calls run over the n_ items: once
for all of them where a call can (Call.fold: a contraction's rows or batch, its weights read once), the calls between
those one item after another.

The arena holds each scratch buffer's items one after another (item b of a buffer the one-item plan puts at offset o
is at checks_bytes + hi * o + b * its bytes: the plan's buffers scaled by the largest size, so no two overlap), after
the index checks' results of every item (scratch_item); then the buffers that only the calls of one item loop use,
which every item reuses (plan_items).

A dim run to a size given at run time reads and writes an input or output in place when every dim before it is 1;
one with others before it is staged (Staged): copied into its layout at the bound in the arena, after the plan, before
the kernels, and out of it after them, e_ rows of each block."""

from __future__ import annotations

from dataclasses import dataclass, field

from aot.artifact import api_type, param_names
from aot.core.ir import prod
from aot.dim_size import DimSize
from aot.scheduler.kernel import Buffer, Schedule
from aot.scheduler.memory import align_up, memory_plan
from aot.scheduler.runtime_extent import blocks_before


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


def ranged(sched: Schedule) -> list[tuple[object, str]]:
  """The schedule's ranged dims (frontends/batch_dims.py BatchDim), each with its size's name in model.c: n_ for the
  items' count, e_ for a dim run to a size given at run time."""
  return [(d, v) for d, v in ((sched.batch, "n_"), (sched.extent, "e_")) if d is not None]


def run_dims_decl(name: str, sched: Schedule) -> str:
  ds = [d.dim for d, _ in ranged(sched)]
  which = " and ".join(f"dim '{d.name}' is any size in {d.lo}..{d.hi}" for d in ds)
  return f"""/* runs the model on inputs whose {which} (the same in every input
   that has it; every other dim as compiled): each tensor's data (dense row-major) then its shape (RANK int64_t),
   for the inputs then the outputs. An output's shape is written there (its pointer may be NULL); its buffer must
   hold that many elements ({name.upper()}_OUTPUTi_SIZE at the largest). A shape outside the range is
   AOT_ERR_INVALID_ARGUMENT, naming the input and the dim */
int {name}_run_dims({name}_model *m, {", ".join(run_dims_args(sched))});
"""


def run_dims_meta(P: str, sched: Schedule) -> list[str]:
  """NAME.h's defines for the ranged dims: each one's name and bounds, and which axis of each input and output it is."""
  meta = [f"#define {P}_NUM_DIMS {len(ranged(sched))}"]
  for j, (d, _) in enumerate(ranged(sched)):
    meta += [
      f'#define {P}_DIM{j}_NAME "{d.dim.name}"',
      f"#define {P}_DIM{j}_MIN {d.dim.lo}",
      f"#define {P}_DIM{j}_MAX {d.dim.hi}",
    ]
    for kind, axes in (("INPUT", d.inputs), ("OUTPUT", d.outputs)):
      meta += [f"#define {P}_{kind}{i}_DIM{j}_AXIS {a}" for i, a in enumerate(axes)]
  return meta


def largest(sched: Schedule, b: Buffer, kind: str, i: int) -> tuple:
  """Input or output i's shape at the largest size of each ranged dim (an item's shape has 1 there, a bound's its
  bound)."""
  shape = list(b.shape)
  for d, _ in ranged(sched):
    if (a := (d.inputs if kind == "INPUT" else d.outputs)[i]) >= 0:
      shape[a] = d.axis_form(b.shape[a]).at(d.dim.hi)
  return tuple(shape)


def _fail(status: str, fmt: str, *args: str) -> str:
  """A failed run's return: fmt is a printf format (names in it escaped by _percent)."""
  from aot.codegen.render.host_cpu import _c_string

  return f"return aot_fail(m->error, {status}, {', '.join([_c_string(fmt), *args])});"


def _input_checks(sched: Schedule) -> list[str]:
  """Each input's shape: NULL, a dim outside its range or unlike the first input's, another dim not as compiled."""
  from aot.codegen.render.host_cpu import _percent

  sins, _ = shape_names(sched)
  # per input axis: the ranged dim there and its size's name
  at = [{(d.inputs[i]): (d, v) for d, v in ranged(sched) if d.inputs[i] >= 0} for i in range(len(sched.inputs))]
  firsts = {v: next(i for i, a in enumerate(d.inputs) if a >= 0) for d, v in ranged(sched)}
  lines = []
  for i, (b, s) in enumerate(zip(sched.inputs, sins)):
    bn = _percent(b.name)
    null = f"input {i} ('{bn}') shape is NULL"
    lines.append(f"  if (!{s}) {_fail('AOT_ERR_NULL_ARGUMENT', null)}")
    for j, size in enumerate(b.shape):
      got = f"(long long){s}[{j}]"
      if j in at[i]:
        d, v = at[i][j]
        dim, lo, hi = _percent(d.dim.name), d.dim.lo, d.dim.hi
        outside = f"input '{bn}' dim {j} ('{dim}') is %lld, outside {lo}..{hi}"
        lines.append(f"  if ({s}[{j}] < {lo} || {s}[{j}] > {hi}) {_fail('AOT_ERR_INVALID_ARGUMENT', outside, got)}")
        if i != firsts[v]:
          n0 = _percent(sched.inputs[firsts[v]].name)
          unlike = f"input '{bn}' dim {j} ('{dim}') is %lld, but input '{n0}' has %lld"
          lines.append(f"  if ({s}[{j}] != {v}) {_fail('AOT_ERR_INVALID_ARGUMENT', unlike, got, f'(long long){v}')}")
        else:
          lines.append(f"  {v} = {s}[{j}];")
      else:
        want = f"input '{bn}' dim {j} is %lld, the model takes {size}"
        lines.append(f"  if ({s}[{j}] != {size}) {_fail('AOT_ERR_INVALID_ARGUMENT', want, got)}")
  return lines


def run_dims_c(name: str, sched: Schedule) -> str:
  """run_dims_locked and NAME_run_dims, over model.c's run_locked (the one-item run)."""
  ins, outs = param_names(sched)
  sins, souts = shape_names(sched)
  fills = []
  for i, (b, s) in enumerate(zip(sched.outputs, souts)):
    dims = [str(size) for size in b.shape]
    for d, v in ranged(sched):
      if (a := d.outputs[i]) >= 0:
        # (a dim run to a size may reach an output through windows: its size there is their form of e_)
        dims[a] = d.axis_form(b.shape[a]).c(v)
    fills.append(f"  if ({s}) {{ {' '.join(f'{s}[{j}] = {x};' for j, x in enumerate(dims))} }}")
  sizes = [v for _, v in ranged(sched)]
  return f"""static int run_dims_locked({name}_model *m, {", ".join(run_dims_args(sched))}) {{
  m->error[0] = 0;
  int64_t {", ".join(f"{v} = 0" for v in sizes)};
{chr(10).join(_input_checks(sched))}
{chr(10).join(fills)}
  return run_locked(m, {", ".join(ins + outs + sizes)});
}}

API int {name}_run_dims({name}_model *m, {", ".join(run_dims_args(sched))}) {{
  if (!m) return AOT_ERR_NULL_ARGUMENT;
  pthread_mutex_lock(&m->lock);
  return unlock_with(m, run_dims_locked(m, {", ".join(n for pair in zip(ins + outs, sins + souts) for n in pair)}));
}}

"""


def checks_bytes(sched: Schedule) -> int:
  """The arena's first bytes: every item's index check results (int64 [position, value] per check)."""
  return align_up(sched.batch.dim.hi * 2 * len(sched.checks) * 8)


def batch_arena(sched: Schedule, item_arena: int) -> int:
  """The arena of an artifact with a ranged dim: the checks, then the one-item plan at the largest size, or once
  where the items run the whole program one after another, every item's scratch in one place (items_apart)."""
  return checks_bytes(sched) + (sched.batch.dim.hi if sched.items_apart else 1) * item_arena


@dataclass(frozen=True)
class Rows:
  """An item stride of inner elements times the run's size e_ of a dim run to a size given at run time: a buffer
  whose outermost dim is that one, its items packed one after another at that size (an item's rows at the bound's
  strides are a prefix), so that a contraction's rows run on over all items' rows (GemmCall.fold)."""

  inner: int


def item_stride(sched: Schedule):
  """item(buffer): the elements from one item of it to the next (an int, or Rows); None for a buffer the items
  share (a constant, an input or output without the dim), and for every buffer of a schedule without a ranged
  dim."""
  bd, e = sched.batch, sched.extent
  if bd is None:
    return lambda b: None
  own = {id(b) for b, a in zip(sched.inputs + sched.outputs, bd.inputs + bd.outputs) if a >= 0}

  def item(b: Buffer):
    if not (b.kind in ("scratch", "check") or id(b) in own):
      return None
    # (outermost: every dim before the first of the bound's size is 1, and the bound occurs once)
    lead = next((s for s in b.shape if s != 1), None)
    if e is not None and b.kind != "check" and lead == e.bound and b.shape.count(e.bound) == 1:
      return Rows(b.size // e.bound)
    return b.size

  return item


def scratch_item(sched: Schedule, b: Buffer) -> tuple[int, int | str]:
  """A scratch buffer's item 0 in the arena, and the bytes from one item to the next (the module's layout; an
  expression of e_ for Rows)."""
  if (at := sched.items_share.get(id(b))) is not None:
    return at, 0
  if not sched.items_apart:
    return checks_bytes(sched) + b.offset, 0
  return checks_bytes(sched) + sched.batch.dim.hi * b.offset, item_bytes(b, item_stride(sched)(b))


def item_bytes(b: Buffer, step) -> int | str:
  """The bytes from one item of b to the next, for item_stride's step: an expression of e_ for Rows."""
  return f"{step.inner * b.dtype.itemsize} * e_" if isinstance(step, Rows) else b.nbytes


def item_pointer(sched: Schedule, b: Buffer, where: str) -> str:
  """where (a buffer's pointer in the one-item program) at item b_."""
  if b.kind == "scratch":
    at, step = scratch_item(sched, b)
    return f"(A + {at} + b_ * {step})"
  if b.kind == "check":
    return f"({where} + b_ * {2 * len(sched.checks)})"
  step = item_stride(sched)(b)
  if step is None:
    return where
  return f"({where} + b_ * {step.inner} * e_)" if isinstance(step, Rows) else f"({where} + b_ * {step})"


@dataclass
class Segment:
  """Calls model.c runs together over the items (item_statements): one folded call, or the calls between folded ones,
  run one item after another. The arena is planned by segments (memory_plan takes them as kernels): within a
  segment, items interleave, so every buffer its calls touch lives for all of it."""

  bufs: list = field(default_factory=list)
  folded: bool = False


def item_segments(sched: Schedule, low) -> list[Segment]:
  """The segments of a lowered schedule (codegen/lower/stage.py LoweredSchedule) in order, each with its calls'
  kernels' buffers."""
  item, out = item_stride(sched), []
  for lowered, calls in zip(low.lowered, low.kernel_calls):
    for call in calls:
      if _folds(sched, call, item):
        out.append(Segment(list(lowered.kernel.bufs), folded=True))
        out.append(Segment())
      else:
        if not out:
          out.append(Segment())
        out[-1].bufs += lowered.kernel.bufs
  return [seg for seg in out if seg.bufs]


def plan_items(sched: Schedule, low) -> int:
  """The arena of a CPU schedule with a batch dim (codegen/lower/stage.py LoweredSchedule low), its scratch placed
  (items_apart and items_share set). A buffer that only the calls of one item loop use is dead before the loop's next
  item starts: one copy for all items, planned by kernels (as a static compile's: each item's attention scores, then
  its probabilities, in the memory its last layer's used, still in cache: MiniLM at 8 sentences of 61 tokens 117 ->
  98 ms, a static compile 94; ResNet-18 at 16 images 505 -> 445); the rest, each item's own (the module's layout)."""
  sched.items_apart = items_apart(sched, low)
  if not sched.items_apart:
    return batch_arena(sched, memory_plan(low.segments, low.scratch))
  segments = item_segments(sched, low)
  users: dict[int, set[int]] = {}  # buffer id -> the segments that touch it
  for i, seg in enumerate(segments):
    for b in seg.bufs:
      users.setdefault(id(b), set()).add(i)
  one_loop = {k for k, at in users.items() if len(at) == 1 and not segments[min(at)].folded}
  shared = [b for b in low.scratch if b.kind == "scratch" and id(b) in one_loop]
  own = [b for b in low.scratch if not (b.kind == "scratch" and id(b) in one_loop)]
  base = align_up(batch_arena(sched, memory_plan(segments, own)))
  top = memory_plan(low.segments, shared)
  sched.items_share = {id(b): base + b.offset for b in shared}
  return base + top


def item_statements(sched: Schedule, calls: list, render, each_call: bool = False) -> list[str]:
  """model.c's statements over the items: a call folded over all of them runs once (at item 0); the calls between
  folded ones run one item after another, all of them for an item before the next (its activations still in cache:
  ResNet-18 at 16 items 0.92x a static batch's time, call by call over the items 1.01x). render(i, call) is the
  statement of call i of the kernel list (or of its fold). each_call: every call over the items before the next (a
  GPU target's launches: the arena is planned by kernels there)."""
  item, out, loop = item_stride(sched), [], []

  def close_loop():
    if loop:
      out.append("  for (int64_t b_ = 0; b_ < n_; b_++) {\n" + "\n".join(loop) + "\n  }")
      loop.clear()

  for i, call in enumerate(calls):
    if _folds(sched, call, item) and (folded := call.fold(item)) is not None:
      close_loop()
      out.append(f"  {{ const int64_t b_ = 0; (void)b_;\n  {render(i, folded).strip()}\n  }}")
    else:
      loop.append("  " + render(i, call).strip())
      if each_call:
        close_loop()
  close_loop()
  return out


def _folds(sched: Schedule, call, item) -> bool:
  """Does a call run once over all items (Call.fold)? Only where the items keep their scratch apart (items_apart)."""
  return sched.items_apart and call.fold(item) is not None


def items_apart(sched: Schedule, low) -> bool:
  """Does each item keep its scratch apart, or (beside a dim run to a size given at run time, where no call folds
  over the items) do the items run the whole program one after another, every item's scratch in one place?"""
  item = item_stride(sched)
  return sched.extent is None or any(c.fold(item) is not None for c in low.calls)


def item_checks_c(sched: Schedule, check_c) -> str:
  """After the kernels: each item's index checks (check_c(i, check) a check's lines over checks_), the first failure
  naming its item."""
  lines = "".join(check_c(i, c.check, sched.batch.dim.name) for i, c in enumerate(sched.checks))
  return f"""  int status_ = AOT_OK;
  for (int64_t b_ = 0; b_ < n_ && status_ == AOT_OK; b_++) {{
    const int64_t *checks_ = (const int64_t *)A + b_ * {2 * len(sched.checks)};
{lines}  }}
  return status_;"""


@dataclass(frozen=True)
class Staged:
  """An input or output of a dim run to a size given at run time with other dims before it (the module's docstring):
  blocks of its rows, each a position's bytes, at offset in the arena at the bound's layout."""

  buffer: Buffer
  name: str  # its parameter in model.c
  blocks: int  # the product of the dims before the dim
  row_bytes: int  # one position's bytes: the product of the dims after it
  offset: int
  rows: DimSize  # the rows of a block: the dim's, or their form where windows derived its axis (aot/dim_size.py)
  bound_rows: int  # those at the bound, a block's in the arena


def staged_io(sched: Schedule, arena: int) -> tuple[list[Staged], int]:
  """The inputs and outputs to stage, placed after an arena of this size, and the arena with them."""
  ext, staged = sched.extent, []
  if ext is None or sched.batch is not None:
    return staged, arena
  names = param_names(sched)
  for b, a, name in zip(sched.inputs + sched.outputs, ext.inputs + ext.outputs, names[0] + names[1]):
    if (blocks := blocks_before(b.shape, a)) > 1:
      row_bytes = prod(b.shape[a + 1 :]) * b.dtype.itemsize
      staged.append(Staged(b, name, blocks, row_bytes, arena, ext.size_at(b.shape[a]), b.shape[a]))
      arena += align_up(b.nbytes)
  return staged, arena


def staging_c(sched: Schedule, side: str) -> list[str]:
  """model.c's copies of the staged inputs into the arena (side "in", before the kernels) or of the staged outputs
  out of it (side "out", after them): e_ rows of each block."""
  lines = []
  for st in sched.staged:
    if (st.buffer.kind == "input") != (side == "in"):
      continue
    rows = st.rows.c("e_")
    at, caller = (
      f"A + {st.offset} + o_ * {st.bound_rows * st.row_bytes}",
      f"(unsigned char *){st.name} + o_ * {rows} * {st.row_bytes}",
    )
    dst, src = (at, caller) if side == "in" else (caller, at)
    lines.append(
      f"  for (int64_t o_ = 0; o_ < {st.blocks}; o_++) memcpy({dst}, {src}, (size_t){rows} * {st.row_bytes});"
    )
  return lines
