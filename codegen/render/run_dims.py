"""NAME_run_dims: the C API of an artifact with a ranged dim (frontends/batch_dims.py). The caller passes each input's
shape beside its data and gets each output's shape back; the shapes are checked (the dim in its range and the same in
every input that has it, every other dim as compiled), then the items run one after another through the one-item run,
each on its own slice of every input and output that has the dim."""

from __future__ import annotations

import math

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
  from aot.codegen.render.host_cpu import _c_string, _percent

  bd = sched.batch
  ins, outs = param_names(sched)
  sins, souts = shape_names(sched)
  first = next(i for i, a in enumerate(bd.inputs) if a >= 0)
  fills = []
  for b, s, a in zip(sched.outputs, souts, bd.outputs):
    dims = [("n_" if j == a else str(size)) for j, size in enumerate(b.shape)]
    fills.append(f"  if ({s}) {{ {' '.join(f'{s}[{j}] = {x};' for j, x in enumerate(dims))} }}")
  item = [
    f"{n} + {math.prod(b.shape)} * b_" if a >= 0 else n
    for b, n, a in zip(sched.inputs + sched.outputs, ins + outs, bd.inputs + bd.outputs)
  ]
  where = f" (item %lld of dim '{_percent(bd.dim.name)}')"
  return f"""static int run_dims_locked({name}_model *m, {", ".join(run_dims_args(sched))}) {{
  m->error[0] = 0;
  int64_t n_ = 0;
{chr(10).join(_input_checks(sched, first))}
{chr(10).join(fills)}
  for (int64_t b_ = 0; b_ < n_; b_++) {{
    int status_ = run_locked(m, {", ".join(item)});
    if (status_ != AOT_OK) {{
      char why_[AOT_ERROR_CAPACITY];
      memcpy(why_, m->error, sizeof why_);
      return aot_fail(m->error, status_, {_c_string("%s" + where)}, why_, (long long)b_);
    }}
  }}
  return AOT_OK;
}}

API int {name}_run_dims({name}_model *m, {", ".join(run_dims_args(sched))}) {{
  if (!m) return AOT_ERR_NULL_ARGUMENT;
  pthread_mutex_lock(&m->lock);
  return unlock_with(m, run_dims_locked(m, {", ".join(n for pair in zip(ins + outs, sins + souts) for n in pair)}));
}}

"""
