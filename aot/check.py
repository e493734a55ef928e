"""compile-model --check: run the artifact on seeded (or given) inputs and compare with a reference that is not ours
(onnxruntime, onnx.reference, a bundled model's numpy reference), judged in float64 where the float32 reference
disagrees with us."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import numpy as np

from aot.errors import AotError, IndexRangeError

# relative error --check accepts: float32 rounding in a different order; a narrow float output may differ by one of
# its own steps (2**-7 for bfloat16, 2**-3 for float8e4m3) where the two round a float32 value lying between codes
CHECK_RTOL = 1e-4
# the integers a seeded input holds, [0, RANDOM_INT_HIGH), unless it indexes a smaller axis
RANDOM_INT_HIGH = 4


class CheckInputError(AotError):
  """--check's inputs do not fit the model, or the artifact or the reference refuses them: the message names the
  input and says how to give valid ones (--check-input NAME=FILE.npy)."""


def random_inputs(inputs, seed: int = 0, indexed: dict[str, int] | None = None) -> list[np.ndarray]:
  """Seeded inputs of the right shapes and dtypes: normal floats, small non-negative integers, random bools. An
  integer input that indexes an axis (Artifact.indexed_inputs: an embedding's token ids) stays below its size, so
  that the run and the reference take it."""
  rng = np.random.default_rng(seed)
  high = {name: min(size, RANDOM_INT_HIGH) for name, size in (indexed or {}).items()}
  out = []
  for t in inputs:
    dt = t.narrow.np if getattr(t, "narrow", None) else t.dtype.np
    if getattr(t, "narrow", None):
      out.append(rng.integers(0, 2, t.shape).astype(np.float32).astype(dt))
    elif t.dtype.is_float:
      out.append(rng.standard_normal(t.shape).astype(dt))
    elif t.dtype.kind == "b":
      out.append(rng.random(t.shape) < 0.5)
    else:
      out.append(rng.integers(0, high.get(t.name, RANDOM_INT_HIGH), t.shape).astype(dt))
  return out


def given_inputs(art, files: dict[str, str], xs: list[np.ndarray], inputs=None) -> list[np.ndarray]:
  """xs with the inputs given as NAME=FILE.npy (--check-input) in place of the seeded ones (inputs: the artifact's
  at the size checked)."""
  inputs = art.inputs if inputs is None else inputs
  names = [t.name for t in inputs]
  out = list(xs)
  for name, file in files.items():
    if name not in names:
      known = ", ".join(names)
      raise CheckInputError(f"--check-input {name}={file}: the model has no input '{name}' (inputs: {known})")
    t = inputs[names.index(name)]
    try:
      x = np.load(file, allow_pickle=False)
    except (OSError, ValueError) as e:
      raise CheckInputError(f"--check-input {name}={file}: cannot read it as a .npy array ({e})") from None
    want = t.narrow.np if t.narrow else t.dtype.np
    if x.shape != tuple(t.shape):
      raise CheckInputError(f"--check-input {name}={file}: shape {x.shape}, the input is {tuple(t.shape)}")
    if x.dtype != want and not np.can_cast(x.dtype, want, "same_kind"):
      raise CheckInputError(f"--check-input {name}={file}: dtype {x.dtype}, the input is {np.dtype(want)}")
    out[names.index(name)] = x.astype(want)
  return out


def check(art, model: str, bind: dict, quiet: bool = False, files: dict[str, str] | None = None) -> int:
  """Run art and the reference on the same inputs, print the comparison (PASS/FAIL, latency); 0 on PASS, else 1.
  An artifact with a batch range is checked at both ends of it (the inputs given, at their own size)."""
  import aot

  run = aot.load(art)
  if not art.dims:
    return _check_at(art, art.inputs, art.outputs, run, model, bind, quiet, files, "")
  ends = [{d["name"]: d[end] for d in art.dims} for end in ("min", "max")]
  sizes = [_given_sizes(art, files)] if files else [e for i, e in enumerate(ends) if e not in ends[:i]]
  failed = 0
  for n in sizes:
    ins, outs = art.at_size(n)
    label = ", ".join(f"{k}={v}" for k, v in n.items())
    failed |= _check_at(art, ins, outs, run, model, bind, quiet, files, f"{label}: ")
  return failed


def _given_sizes(art, files: dict[str, str]) -> dict:
  """Each ranged dim's size in the --check-input files (of the first input given that has it), else its largest."""
  sizes = {}
  for d in art.dims:
    for t in art.inputs:
      if t.name in files and d["name"] in t.shape:
        sizes[d["name"]] = int(np.load(files[t.name], mmap_mode="r").shape[t.shape.index(d["name"])])
        break
    else:
      sizes[d["name"]] = d["max"]
  return sizes


def _check_at(art, inputs, outputs, run, model, bind, quiet, files, label: str) -> int:
  """check at one size of the inputs and outputs (label: which, for the line printed)."""
  if model.startswith("models:"):
    from aot.models import get

    if files:
      raise CheckInputError("--check-input is for ONNX models: a bundled model is checked on its own example inputs")
    ref = get(model.split(":", 1)[1])
    xs = ref.example_inputs(seed=0)
    got = _run_artifact(run, xs)
    want, against = [ref.reference(*xs)], "numpy reference"
  else:
    xs = given_inputs(art, files or {}, random_inputs(inputs, indexed=art.indexed_inputs), inputs)
    feed = {t.name: x for t, x in zip(inputs, xs)}
    if art.containers:
      # a sequence input is one list (an optional one array or None) for the artifact and both references
      from aot.loader import _grouped, _runs

      runs = _runs(art, "input")
      xs = [_grouped(xs, kind, start, count) for _, kind, start, count in runs]
      feed = {name: x for (name, *_), x in zip(runs, xs)}
    got = _run_artifact(run, xs)
    want, against = _onnx_reference(model, feed, bind, given=set(files or {}))
  got = list(got) if isinstance(got, tuple) else [got]
  # sequence outputs (lists) and optional ones (None when empty) compared tensor by tensor
  flat = lambda vs: [t for v in vs for t in (v if isinstance(v, list) else [] if v is None else [v])]
  got, want = flat(got), flat(want)
  times = []
  for _ in range(5):
    t = time.perf_counter()
    run(*xs)
    times.append(time.perf_counter() - t)
  tol = _check_tolerance(outputs)
  err, rel = _errors(got, want)
  same_shapes = all(g.shape == np.shape(w) for g, w in zip(got, want))
  ok = rel <= tol and same_shapes
  line = f"{label}check vs {against}: max abs err {err:.3e}, max rel err {rel:.3e}"
  if not ok and not model.startswith("models:") and same_shapes:
    # the float32 reference rounds too (onnxruntime's sigmoid of a large negative logit is off by ~1e-7, many times
    # the value): where it and we disagree, a float64 evaluation of the model says which of us is right
    line += " (they disagree)"
    judged = _float64_judgement(model, feed, bind, got, want, tol)
    line += judged[1]
    ok = judged[0]
  line += f" -> {'PASS' if ok else 'FAIL'}; latency {np.median(times) * 1e3:.2f} ms (median of 5)"
  # -q: a failed check is an error, a passed one is not
  if not quiet:
    print(line)
  elif not ok:
    print(f"compile-model: error: {line}", file=sys.stderr)
  return 0 if ok else 1


def _errors(got, want) -> tuple[float, float]:
  """(max abs error, that over the largest magnitude of the reference's outputs)."""
  want = [np.asarray(w).astype(np.float64) for w in want]
  err = max([float(np.max(np.abs(g.astype(np.float64) - w), initial=0)) for g, w in zip(got, want)], default=0.0)
  scale = max(max([float(np.max(np.abs(w), initial=0)) for w in want], default=0.0), 1e-30)
  return err, err / scale


def _run_artifact(run, xs):
  try:
    return run(*xs)
  except IndexRangeError as e:
    raise CheckInputError(f"--check: the artifact refused its inputs: {_after_colon(e)}; {_GIVE}") from None


_GIVE = "give valid ones with --check-input NAME=FILE.npy"


def _after_colon(e: Exception) -> str:
  return str(e).split(": ", 1)[-1]


def _onnx_reference(model: str, feed: dict, bind: dict, given: set[str]) -> tuple[list, str]:
  """The model's outputs from onnxruntime, else (a type or op it has no kernel for) onnx.reference, and which."""
  try:
    import onnxruntime as ort
  except ImportError:
    raise RuntimeError("--check on an ONNX model needs onnxruntime (pip install onnxruntime)") from None
  try:
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    ort_feed = _with_bind(model, feed, bind)
  except Exception as e:  # noqa: BLE001  (onnxruntime's own exception types: a type or op it has no kernel for)
    return _reference_evaluator(model, feed, bind, e, given)
  try:
    return sess.run(None, ort_feed), "onnxruntime"
  except Exception as e:  # noqa: BLE001
    if type(e).__name__ != "InvalidArgument":
      return _reference_evaluator(model, feed, bind, e, given)
    # onnxruntime refuses these inputs (an index out of range, say): name the model inputs its failing node reads
    msg = str(e).strip().splitlines()[0]
    node = re.search(r"Name:'([^']*)'", msg)
    why = msg.split("Status Message: ", 1)[-1]
    names = _inputs_reaching(model, node.group(1)) if node else []
    what = ", ".join(f"'{n}'{' (given)' if n in given else ' (random)'}" for n in names)
    what = f"input {what}" if names else "the inputs"
    where = f" in node '{node.group(1)}'" if node else ""
    raise CheckInputError(f"--check: onnxruntime refused {what}{where}: {why}; {_GIVE}") from None


def _reference_evaluator(model: str, feed: dict, bind: dict, ort_error: Exception, given: set[str]):
  # onnxruntime has no kernels for most narrow types (bfloat16 arithmetic, float8, 4- and 2-bit): onnx's reference
  # implementation has them all
  from onnx.reference import ReferenceEvaluator

  why = _first_line(ort_error)[:160]
  feed = _with_bind(model, feed, bind)
  try:
    want = ReferenceEvaluator(model).run(None, feed)
  except Exception as e:  # noqa: BLE001  (numpy's own errors on inputs the model cannot take)
    ints = [k for k, v in feed.items() if np.asarray(v).dtype.kind in "iu"]
    which = f"; integer inputs: {', '.join(repr(k) + (' (given)' if k in given else ' (random)') for k in ints)}"
    raise CheckInputError(
      f"--check: onnx.reference refused the inputs ({type(e).__name__}: {_first_line(e)}){which if ints else ''}; "
      f"{_GIVE}"
    ) from None
  return want, f"onnx.reference (onnxruntime cannot run it: {why})"


def _first_line(e: Exception) -> str:
  return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def _inputs_reaching(model: str, node_name: str) -> list[str]:
  """The graph inputs whose values reach node node_name's inputs (through any nodes before it)."""
  import onnx

  g = onnx.load(model, load_external_data=False).graph
  producer = {o: n for n in g.node for o in n.output}
  inputs = {i.name for i in g.input} - {t.name for t in g.initializer}
  start = [n for n in g.node if (n.name or n.output[0]) == node_name]
  seen, todo, found = set(), [x for n in start for x in n.input], []
  while todo:
    x = todo.pop()
    if x in seen:
      continue
    seen.add(x)
    if x in inputs:
      found.append(x)
    elif x in producer:
      todo += producer[x].input
  return sorted(found)


def _float64_judgement(model: str, feed: dict, bind: dict, got, want, tol: float) -> tuple[bool, str]:
  """(PASS?, what to add to the line): our outputs against a float64 evaluation of the model, and the float32
  reference's error against it."""
  try:
    exact, how = float64_reference(model, _with_bind(model, feed, bind))
  except Exception as e:  # noqa: BLE001  (a model that has no float64 form: quantized ops, fixed-type inputs)
    return False, f"; no float64 evaluation ({type(e).__name__}: {_first_line(e)[:120]})"
  if len(exact) != len(want) or any(np.shape(e) != np.shape(w) for e, w in zip(exact, want)):
    return False, f"; the float64 evaluation ({how}) has other outputs"
  err, rel = _errors(got, exact)
  _, ref_rel = _errors([np.asarray(w) for w in want], exact)
  return rel <= tol, (
    f"; vs float64 evaluation ({how}): max abs err {err:.3e}, max rel err {rel:.3e} "
    f"(the float32 reference's own max rel err: {ref_rel:.3e})"
  )


def float64_reference(model: str, feed: dict) -> tuple[list[np.ndarray], str]:
  """The model's outputs computed in float64: a copy with every float32 value, type and cast made float64, run by
  onnxruntime where it has float64 kernels for every node, else by onnx.reference (slow on big convolutions)."""
  import onnx

  m = onnx.load(model)
  _to_float64(m.graph)
  wide = lambda v: v.astype(np.float64) if isinstance(v, np.ndarray) and v.dtype == np.float32 else v
  feed = {k: wide(v) for k, v in feed.items()}
  try:
    import onnxruntime as ort

    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feed), "onnxruntime on a float64 copy of the model"
  except Exception:  # noqa: BLE001  (no float64 kernel for some node: Conv, Resize's float scales)
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(m).run(None, feed), "onnx.reference on a float64 copy of the model"


def _to_float64(g) -> None:
  """Every float32 tensor, type and cast target in graph g (and its subgraphs) made float64, in place."""
  import onnx
  from onnx import TensorProto, numpy_helper

  F, D = TensorProto.FLOAT, TensorProto.DOUBLE

  def tensor(t) -> None:
    if t.data_type == F:
      t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float64), t.name))

  for t in g.initializer:
    tensor(t)
  for vi in [*g.input, *g.output, *g.value_info]:
    if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type == F:
      vi.type.tensor_type.elem_type = D
  for n in g.node:
    for a in n.attribute:
      if a.type == onnx.AttributeProto.TENSOR:
        tensor(a.t)
      elif a.type == onnx.AttributeProto.GRAPH:
        _to_float64(a.g)
      elif a.type == onnx.AttributeProto.GRAPHS:
        for sub in a.graphs:
          _to_float64(sub)
      elif a.name in ("to", "dtype") and a.type == onnx.AttributeProto.INT and a.i == F:
        a.i = D


def _check_tolerance(outputs) -> float:
  steps = [2.0**-t.narrow.man_bits for t in outputs if getattr(t, "narrow", None) and t.narrow.kind == "float"]
  steps += [2.0**-7 for t in outputs if getattr(t, "narrow", None) and t.narrow.kind == "bf16"]
  return max([CHECK_RTOL] + steps)


def _with_bind(model: str, feed: dict, bind: dict) -> dict:
  """feed and the --bind values, each as its graph input's dtype (the model read once, without its weights)."""
  if not bind:
    return feed
  import onnx

  dtypes = {i.name: i.type.tensor_type.elem_type for i in onnx.load(model, load_external_data=False).graph.input}
  return {**feed, **{k: np.asarray(v, dtype=onnx.helper.tensor_dtype_to_np_dtype(dtypes[k])) for k, v in bind.items()}}


def load_npy_pins(items: list[str]) -> dict[str, str]:
  """--check-input NAME=FILE.npy items as {name: file}."""
  out = {}
  for it in items:
    name, eq, file = it.partition("=")
    if not eq or not name or not file:
      raise CheckInputError(f"--check-input {it!r}: expected NAME=FILE.npy")
    if not Path(file).is_file():
      raise CheckInputError(f"--check-input {it}: no such file {file}")
    out[name] = file
  return out
