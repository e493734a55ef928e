"""ONNX models in: load and check a model, pin its symbolic dims, and map every node to Tensor ops through a table of
small functions (one per op and opset range, in onnx_ops*.py). Model-local functions become FUNCTION/CALL."""

from __future__ import annotations

import inspect
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
from onnx import numpy_helper

from aot.core.dtype import DType, Narrow, dtypes, to_dtype
from aot.core.ir import Ops
from aot.errors import AotError, CompileError, InternalError, NeedsConstant, Unsupported
from aot.frontends import narrow
from aot.frontends.onnx_infer import weightless
from aot.frontends.onnx_load import all_graphs, external_array, is_external, load_model, onnx_narrow, weight_bytes
from aot.frontends.tensor import Tensor, function
from aot.frontends.winograd import weights_budget
from aot.scheduler.kernel import Traced

# op_type (with domain prefix for non-default domains) -> [(since_version, fn)], newest first
OPS: dict[str, list[tuple[int, Callable]]] = {}
# (key, since) -> "file:line" of the registration, so that a second one for the same opset names both places
_PLACES: dict[tuple[str, int], str] = {}


def op(*names: str, since: int = 1, domain: str = ""):
  """Register fn for these op types from opset `since` on (until the next registration of the same op). One op and
  opset registered twice is an error at import: which one wins must not depend on the order modules are imported."""

  def register(fn):
    caller = sys._getframe(1)
    place = f"{Path(caller.f_code.co_filename).name}:{caller.f_lineno}"
    for n in names:
      key = f"{domain}::{n}" if domain else n
      if (key, since) in _PLACES:
        raise InternalError(
          f"op {key} from opset {since} is registered twice: at {_PLACES[key, since]} and at {place} (keep one)"
        )
      _PLACES[key, since] = place
      OPS.setdefault(key, []).append((since, fn))
      OPS[key].sort(key=lambda x: -x[0])
    return fn

  return register


def lookup(op_type: str, domain: str, opset: int) -> Callable | None:
  key = f"{domain}::{op_type}" if domain not in ("", "ai.onnx") else op_type
  for since, fn in OPS.get(key, []):
    if since <= opset:
      return fn
  return None


def onnx_type(elem_type: int) -> DType | Narrow:
  """What Cast's `to` and friends name: a narrow type or a DType."""
  return onnx_narrow(elem_type) or onnx_dtype(elem_type)


def onnx_dtype(elem_type: int) -> DType:
  try:
    return to_dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))
  except (TypeError, KeyError, ValueError):
    raise Unsupported(f"dtype {onnx.TensorProto.DataType.Name(elem_type)} is not supported")


def attribute_values(node: onnx.NodeProto) -> dict:
  out = {}
  for a in node.attribute:
    v = onnx.helper.get_attribute_value(a)
    if isinstance(v, bytes):
      v = v.decode()
    elif isinstance(v, onnx.TensorProto):
      v = numpy_helper.to_array(v)
    elif isinstance(v, list) and v and isinstance(v[0], bytes):
      v = [x.decode() for x in v]
    out[a.name] = v
  return out


@dataclass
class Node:
  """What an op function sees besides its inputs and attributes."""

  proto: onnx.NodeProto
  opset: int
  tracer: "Tracer"
  env: dict

  @property
  def name(self) -> str:
    return self.proto.name or self.proto.output[0]

  @property
  def num_outputs(self) -> int:
    return len(self.proto.output)

  def output_used(self, i: int) -> bool:
    return i < len(self.proto.output) and self.proto.output[i] != ""

  def const(self, t: Tensor | None, what: str = "input") -> np.ndarray | None:
    """The value of t, which must be computable at compile time (shape arithmetic, constants, bound inputs)."""
    if t is None:
      return None
    return constant_value(t, f"{what} of {self.proto.op_type} node '{self.name}'")

  def subgraph(self, g: onnx.GraphProto, inputs: list[Tensor]) -> list[Tensor]:
    """Run a subgraph (If/Loop/Scan body) with the outer scope visible."""
    env = dict(self.env)
    for vi, t in zip(g.input, inputs):
      env[vi.name] = t
    return self.tracer.run_graph(g, env, self.opset)


def constant_value(t: Tensor, what: str) -> np.ndarray:
  from aot.core.interpret import evaluate

  leaves = [
    u
    for u in t.uop.toposort()
    if u.op in (Ops.BUFFER, Ops.PARAM) and not (u.op is Ops.BUFFER and u.arg.kind == "const")
  ]
  if leaves:
    name = leaves[0].arg.name if leaves[0].op is Ops.BUFFER else leaves[0].arg[2]
    raise NeedsConstant(
      f"{what} must be known at compile time, but it depends on the model input '{name}' "
      f"(pin it with --bind {name}=VALUE, or use a static shape)",
      name,
    )
  from aot.core.rewrite import graph_rewrite
  from aot.scheduler.schedule import pm_prepare

  return np.asarray(evaluate(graph_rewrite(t.uop, pm_prepare)))


# sizes, indices and byte offsets are 64-bit signed integers in the kernels, the runtime and the header's macros
TENSOR_BYTES_MAX = (1 << 63) - 1


def check_size(what: str, t) -> None:
  """A tensor too big for 64-bit sizes is the model's limit, said as such (it would wrap, not fail, further on)."""
  if isinstance(t, Tensor) and t.numel() * t.dtype.itemsize > TENSOR_BYTES_MAX:
    raise Unsupported(
      f"{what} {t.shape} is {t.numel() * t.dtype.itemsize} bytes of {t.dtype.name}: more than the 2**63-1 that "
      "64-bit sizes reach"
    )


class _Poison:
  """The output of a node that failed: nodes reading it are skipped (their failure is not news)."""


POISON = _Poison()


@dataclass
class Tracer:
  model: onnx.ModelProto
  base_dir: Path | None = None  # the model file's folder, which external data locations are relative to
  errors: list = field(default_factory=list)
  needs_inputs: set = field(default_factory=set)
  functions: dict = field(default_factory=dict)
  produced: list | None = None  # (label, output UOps) of each main-graph node: frontends/batch_dims.py names them
  arrays: dict = field(default_factory=dict)  # the initializers' values read so far (LoadedOnnx.arrays)

  def run_graph(self, g: onnx.GraphProto, env: dict, opset: int) -> list:
    for init in g.initializer:
      if (read := self.arrays.get(id(init))) is None:
        read = self.arrays[id(init)] = (init, external_array(init, self.base_dir))
      env[init.name] = narrow.from_array(read[1])
    for node in g.node:
      ins = [None if n == "" else env.get(n, _missing(n)) for n in node.input]
      if any(x is POISON for x in ins):
        outs = [POISON] * len(node.output)
      else:
        try:
          outs = self.run_node(node, ins, env, opset)
        except CompileError as e:
          self.needs_inputs |= e.needs_inputs
          self.errors.append(f"{node.op_type} node '{node.name or node.output[0]}': {e}")
          outs = [POISON] * len(node.output)
        # ours but not the model's fault (an InternalError from a subgraph's node already names that node)
        except AotError:
          raise
        except Exception as e:
          # not one of our errors: a bug in a converter or below it, which the model's author cannot fix
          raise InternalError(
            f"internal compiler error in {node.op_type} node '{node.name or node.output[0]}': "
            f"{type(e).__name__}: {e} (a bug in the compiler, not in the model: please report it)"
          ) from e
      for name, t in zip(node.output, outs):
        if name:
          env[name] = t
      if self.produced is not None and g is self.model.graph:
        self.produced.append(
          (f"{node.op_type} node '{node.name or node.output[0]}'", [t.uop for t in outs if isinstance(t, Tensor)])
        )
    return [env.get(o.name, _missing(o.name)) for o in g.output]

  def run_node(self, node: onnx.NodeProto, ins: list, env: dict, opset: int) -> list:
    for x in ins:
      if isinstance(x, _Missing):
        raise Unsupported(f"input '{x.name}' is not produced by any node or graph input")
    attrs = attribute_values(node)
    fn = lookup(node.op_type, node.domain, self.opset_of(node.domain, opset))
    if fn is None:
      fproto = self.local_function(node)
      if fproto is None:
        raise Unsupported("operator not supported")
      return self.call_function(fproto, node, ins, attrs)
    ctx = Node(node, self.opset_of(node.domain, opset), self, env)
    sig = inspect.signature(fn)
    nin = sum(1 for p in sig.parameters.values() if p.kind is p.POSITIONAL_OR_KEYWORD) - 1
    for k in attrs:
      if k not in sig.parameters:
        raise Unsupported(f"attribute '{k}' is not supported")
    varargs = any(p.kind is p.VAR_POSITIONAL for p in sig.parameters.values())
    if len(ins) > nin and not varargs:
      raise Unsupported(f"{len(ins)} inputs given, at most {nin} supported")
    fmts = [narrow.fmt_of(x) for x in ins]
    wide = next((f for f in fmts if f is not None), None) if node.op_type not in narrow.AWARE else None
    # any other op computes a narrow float in float32 (the ints in their storage type): decode in, encode out
    if wide is not None:
      ins = [narrow.decode(x, f) if f is not None and f.is_float else x for x, f in zip(ins, fmts)]
    out = fn(ctx, *ins, **attrs)
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    if wide is not None:
      outs = [narrow.restore(o, wide) for o in outs]
    for name, o in zip(node.output, outs):
      check_size(f"output '{name}'", o)
    return outs + [None] * (len(node.output) - len(outs))

  def opset_of(self, domain: str, default: int) -> int:
    for o in self.model.opset_import:
      if o.domain == domain or (domain in ("", "ai.onnx") and o.domain in ("", "ai.onnx")):
        return o.version
    return default

  def local_function(self, node: onnx.NodeProto):
    for f in self.model.functions:
      if f.name == node.op_type and f.domain == node.domain:
        return f
    return None

  def call_function(self, f: onnx.FunctionProto, node: onnx.NodeProto, ins: list, attrs: dict) -> list:
    """A model-local function is traced once per argument signature into a FUNCTION; each node is a CALL."""
    defaults = {a.name: onnx.helper.get_attribute_value(a) for a in f.attribute_proto}
    attrs = {**defaults, **attrs}
    body_opset = {o.domain: o.version for o in f.opset_import}.get("", 1)

    def body(*args):
      g = onnx.helper.make_graph(
        [_bind_attrs(n, attrs) for n in f.node],
        f.name,
        [onnx.helper.make_value_info(n, onnx.TypeProto()) for n in f.input],
        [onnx.helper.make_value_info(n, onnx.TypeProto()) for n in f.output],
      )
      env = dict(zip(f.input, args))
      outs = self.run_graph(g, env, body_opset)
      if any(o is POISON for o in outs):
        raise Unsupported(f"function {f.name} has nodes that cannot be compiled")
      return tuple(outs)

    present = [x for x in ins if x is not None]
    key = (
      f.domain,
      f.name,
      repr(sorted(attrs.items(), key=lambda kv: kv[0])),
      tuple((x.shape, x.dtype) for x in present),
    )
    # a FUNCTION's parameters are plain tensors: a narrow argument's type, or a sequence, would be lost; inline it
    if any(narrow.fmt_of(x) or not isinstance(x, Tensor) for x in present):
      return list(body(*present))
    try:
      if key not in self.functions:
        self.functions[key] = function(body)
      outs = self.functions[key](*present)
    except NeedsConstant:
      outs = body(*present)  # the body needs an argument's value: trace it inline instead
    return list(outs)


@dataclass
class _Missing:
  name: str


def _missing(name: str) -> _Missing:
  return _Missing(name)


def _bind_attrs(n: onnx.NodeProto, attrs: dict) -> onnx.NodeProto:
  """A function body node with its attribute references (ref_attr_name) replaced by the caller's values."""
  if not any(a.ref_attr_name for a in n.attribute):
    return n
  new = onnx.NodeProto()
  new.CopyFrom(n)
  del new.attribute[:]
  for a in n.attribute:
    if a.ref_attr_name:
      if a.ref_attr_name in attrs:
        new.attribute.append(onnx.helper.make_attribute(a.name, attrs[a.ref_attr_name]))
    else:
      new.attribute.append(a)
  return new


def checker_complaint(model: onnx.ModelProto, path: Path | None = None) -> str | None:
  """The first line of what onnx's checker finds wrong with the model (it stops at the first problem), if anything.
  A model with external data is checked from its file (path): in memory, the checker looks for the data in the current
  folder; with the weights outside it, the file is small. One in memory is checked without its big weights (typed
  inputs in their place, frontends/onnx_infer.py): the checker serialises what it is given, 0.35 s of a 54 MB
  encoder's compile, and reads no weight's values."""
  external = path is not None and any(is_external(t) for g in all_graphs(model.graph) for t in g.initializer)
  try:
    onnx.checker.check_model(str(path) if external else weightless(model, value_info=True))
  except onnx.checker.ValidationError as e:
    # a graph output without a declared shape is common in hand-built models and harmless: shapes are inferred here
    if "Field 'shape' of 'type' is required" not in str(e):
      return str(e).splitlines()[0]
  return None


def _node_label(n: onnx.NodeProto) -> str:
  return f"{n.op_type} '{n.name or n.output[0]}'"


def graph_cycle(g: onnx.GraphProto) -> list[str] | None:
  """The nodes of one cycle in g's dataflow (a node reading what a later node computes from its own output), in
  order, the first repeated at the end; None when g has no cycle."""
  producer = {o: i for i, n in enumerate(g.node) for o in n.output if o}
  readers: list[list[int]] = [[] for _ in g.node]
  for i, n in enumerate(g.node):
    for x in n.input:
      if x in producer:
        readers[producer[x]].append(i)
  state = [0] * len(g.node)  # 0 not seen, 1 on the current path, 2 finished
  for root in range(len(g.node)):
    if state[root]:
      continue
    state[root] = 1
    path, stack = [root], [iter(readers[root])]
    while stack:
      j = next(stack[-1], None)
      if j is None:
        state[path.pop()] = 2
        stack.pop()
      elif state[j] == 1:
        return [_node_label(g.node[k]) for k in path[path.index(j) :] + [j]]
      elif state[j] == 0:
        state[j] = 1
        path.append(j)
        stack.append(iter(readers[j]))
  return None


def model_problems(model: onnx.ModelProto, path: Path | None = None) -> list[str]:
  """Everything found wrong with the model before tracing it, all at once: every unsupported op, every cycle, then
  onnx's checker (which names only the first problem it meets, and would hide the others)."""
  problems = opset_problems(model)
  if bad := unsupported_ops(model):
    problems.append(f"unsupported ONNX operators: {', '.join(bad)}")
  cycles = [f"graph '{g.name}' has a cycle: {' -> '.join(c)}" for g in all_graphs(model.graph) if (c := graph_cycle(g))]
  problems += cycles
  complaint = checker_complaint(model, path)
  # the checker's objection to a cycle is that the nodes are not in order, which the cycle already says
  if complaint and not (cycles and "topologically sorted" in complaint):
    problems.append(f"invalid ONNX model: {complaint}")
  return problems


def opset_problems(model: onnx.ModelProto) -> list[str]:
  """An opset newer than the installed onnx defines, for a domain onnx defines: what its ops mean is not known here
  (onnxruntime refuses it too). Other domains (com.microsoft, a custom one) are versioned by their owners: their op
  tables decide."""
  newest = {"": onnx.defs.onnx_opset_version(), "ai.onnx.ml": onnx.defs.onnx_ml_opset_version()}
  problems = []
  owners = [("the model", model.opset_import)] + [(f"function '{f.name}'", f.opset_import) for f in model.functions]
  for where, imports in owners:
    for o in imports:
      domain = "" if o.domain == "ai.onnx" else o.domain
      if domain in newest and o.version > newest[domain]:
        problems.append(
          f"{where} imports opset {o.version} of the {domain or 'default'} domain, newer than the installed onnx "
          f"{onnx.__version__} defines (up to {newest[domain]}): export the model for opset {newest[domain]} or older"
        )
  return problems


def unsupported_ops(model: onnx.ModelProto) -> list[str]:
  tracer = Tracer(model)
  local = {(f.domain, f.name) for f in model.functions}
  bad = []
  for n in [n for g in all_graphs(model.graph) for n in g.node] + [n for f in model.functions for n in f.node]:
    if (n.domain, n.op_type) in local:
      continue
    if lookup(n.op_type, n.domain, tracer.opset_of(n.domain, 1)) is None:
      bad.append(f"{n.op_type}{' (domain ' + n.domain + ')' if n.domain else ''} (node '{n.name or n.output[0]}')")
  return bad


def _unknown_dim(d, traced: int) -> bool:
  """A dim ONNX leaves open: a dim_param or nothing, or what exporters write for "unknown": a negative value, or 0
  (a real zero-size dim in ONNX, so only where the traced dim is not 0: the two cannot be told apart)."""
  return not d.HasField("dim_value") or d.dim_value < 0 or (d.dim_value == 0 and traced != 0)


def check_inferred_shapes(model: onnx.ModelProto, input_shapes: dict[str, tuple], outs: list) -> None:
  """ONNX's own shape inference, as a cross-check of ours: run from the input shapes the graph was traced with, and
  without the shapes the model declares (its outputs' and value_info: an exporter's claim, which onnxruntime too
  overrides with what it computes), a dim it infers must be the traced one."""
  # onnx's inference (1.23) keeps a ceil_mode pool's last window where it would start in the right padding;
  # onnxruntime and onnx's own reference evaluator drop it (found by aot/tools/fuzz.py): there it is no check
  if any(a.name == "ceil_mode" and a.i for g in all_graphs(model.graph) for n in g.node for a in n.attribute):
    return
  m = weightless(model)
  for vi in m.graph.input:
    if vi.name in input_shapes and vi.type.HasField("tensor_type"):
      vi.type.tensor_type.shape.Clear()
      for s in input_shapes[vi.name]:
        vi.type.tensor_type.shape.dim.add().dim_value = s
  for vi in m.graph.output:
    if vi.type.HasField("tensor_type"):
      vi.type.tensor_type.ClearField("shape")
  try:
    inferred = onnx.shape_inference.infer_shapes(m, strict_mode=False)
  except Exception:
    return  # inference gives up on some valid models; ours is the one that must work
  for vi, o in zip(inferred.graph.output, outs):
    if not (vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape")):
      continue
    dims = vi.type.tensor_type.shape.dim
    if len(dims) != len(o.shape) or any(not _unknown_dim(d, t) and d.dim_value != t for d, t in zip(dims, o.shape)):
      want = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in dims)
      raise CompileError(
        f"output '{vi.name}': ONNX shape inference gives {want}, the traced graph {o.shape} "
        f"(a frontend bug: please report it)"
      )


@dataclass
class LoadedOnnx:
  """An ONNX model read, fused and checked, ready to trace: a compile with a ranged dim traces it four times
  (frontends/batch_dims.py), and onnx's checker serialises the whole model on each call (0.35 s for a 54 MB
  encoder's weights)."""

  model: onnx.ModelProto
  folder: Path | None  # where its external weights are, for a model read from a file
  name: str  # the artifact's name unless the caller gives one: the file's stem, or the graph's name
  # each initializer's value, read once for every trace: by the id of its TensorProto, kept with it (protobuf makes
  # a message's Python object on access and may free it: an id alone could be another's later)
  arrays: dict[int, tuple[onnx.TensorProto, np.ndarray]] = field(default_factory=dict)


def load_checked(src) -> LoadedOnnx:
  """The model of a file or a ModelProto, as it is traced, once everything found wrong with it is reported."""
  import aot.frontends.onnx_ops  # noqa: F401  (registers the op table: what is unsupported)
  from aot.frontends.onnx_qdq import fuse_qdq
  from aot.frontends.onnx_skip_ln import fuse_skip_layer_norm

  if isinstance(src, LoadedOnnx):
    return src
  # QDQ groups run as onnxruntime runs them: as integer contractions (frontends/onnx_qdq.py, codegen/lower/quant.py)
  model = fuse_qdq(load_model(src), in_place=not isinstance(src, onnx.ModelProto))
  # Add + LayerNormalization as onnxruntime fuses and computes it (frontends/onnx_skip_ln.py)
  model = fuse_skip_layer_norm(model, in_place=model is not src)
  path = Path(src) if isinstance(src, (str, Path)) else None
  if problems := model_problems(model, path):
    raise CompileError("; ".join(problems))
  return LoadedOnnx(model, path.parent if path else None, path.stem if path else model.graph.name or "model")


def trace_onnx(src, shapes: dict | None = None, bind: dict | None = None, name: str | None = None, produced=None):
  """The ONNX model (a file, a ModelProto or a LoadedOnnx) as a traced Tensor program: (outputs, inputs) UOps ready
  for the scheduler (Tracer.produced)."""
  from aot.artifact import c_name

  loaded = load_checked(src)
  model = loaded.model
  g = model.graph
  ins = _GraphInputs(dict(shapes or {}), dict(bind or {}))
  inits = {i.name for i in g.initializer}
  for vi in g.input:
    if vi.name not in inits:
      ins.add(vi)
  ins.raise_problems()
  tracer = Tracer(model, loaded.folder, produced=produced, arrays=loaded.arrays)
  with weights_budget(weight_bytes(g)):
    outs = tracer.run_graph(g, ins.env, tracer.opset_of("", 1))
  if tracer.errors:
    raise CompileError(
      f"{len(tracer.errors)} ONNX node(s) cannot be compiled: " + "; ".join(tracer.errors), tracer.needs_inputs
    )
  flat = _flat_outputs(outs, g.output, ins.containers, ins.formats)
  formats, inputs = ins.formats, ins.inputs
  check_inferred_shapes(model, {t.uop.arg.name: formats.get(t.uop.arg.name, (None, t.shape))[1] for t in inputs}, outs)
  name = name or loaded.name
  return Traced(
    c_name(name), [t.uop for _, t in flat], [t.uop for t in inputs], [n for n, _ in flat], formats, ins.containers
  )


@dataclass
class _GraphInputs:
  """The graph's inputs as Tensors to trace with, and everything wrong with them, collected to be reported at once."""

  shapes: dict  # input name or dim_param -> what the user pinned it to
  bind: dict  # input name -> the value the user fixed it to (a constant in the traced graph)
  env: dict = field(default_factory=dict)  # input name -> its Tensor (or sequence, optional) to trace with
  inputs: list[Tensor] = field(default_factory=list)  # the buffers the caller passes, in order
  formats: dict[str, tuple[str, tuple]] = field(default_factory=dict)  # narrow inputs and outputs: (type, shape)
  containers: list[dict] = field(default_factory=list)  # sequence and optional inputs (and, later, outputs)
  problems: list[str] = field(default_factory=list)
  unpinned: list[str] = field(default_factory=list)  # dims with no size: "x[0] ('batch')"
  needs_shapes: set[str] = field(default_factory=set)

  def make(self, name: str, shape: tuple, dt) -> Tensor:
    t, raw = (
      _narrow_input(name, shape, dt, self.formats) if isinstance(dt, Narrow) else (Tensor.input(name, shape, dt),) * 2
    )
    self.inputs.append(raw)
    return t

  def add(self, vi: onnx.ValueInfoProto) -> None:
    if vi.name in self.bind:
      tt = vi.type.tensor_type
      self.env[vi.name] = narrow.from_array(np.asarray(self.bind[vi.name], dtype=onnx_type(tt.elem_type).np))
    elif vi.type.HasField("sequence_type") or vi.type.HasField("optional_type"):
      self._add_container(vi)
    elif not vi.type.HasField("tensor_type"):
      self.problems.append(f"input '{vi.name}' is not a tensor")
    else:
      self._add_tensor(vi)

  def _add_container(self, vi: onnx.ValueInfoProto) -> None:
    from aot.frontends.onnx_ops_sequence import NOT_GIVEN, ContainerShapeNeeded, container_input, container_kind

    start = len(self.inputs)
    element = lambda n, s, et: self.make(n, s, onnx_type(et))
    try:
      self.env[vi.name] = container_input(vi, self.shapes.get(vi.name, NOT_GIVEN), element)
    except (ValueError, Unsupported, CompileError) as e:
      self.problems.append(str(e))
      if isinstance(e, ContainerShapeNeeded):
        self.needs_shapes.add(vi.name)
      return
    kind = container_kind(self.env[vi.name])
    self.containers.append(
      {"name": vi.name, "kind": kind, "side": "input", "start": start, "count": len(self.inputs) - start}
    )

  def _add_tensor(self, vi: onnx.ValueInfoProto) -> None:
    try:
      dt = onnx_type(vi.type.tensor_type.elem_type)
    except Unsupported as e:
      self.problems.append(f"input '{vi.name}': {e}")
      return
    shape = self._shape(vi)
    if None in shape:
      self.needs_shapes.add(vi.name)
      return
    try:
      self.env[vi.name] = self.make(vi.name, shape, dt)
      check_size(f"input '{vi.name}'", self.inputs[-1])
    except CompileError as e:
      self.problems.append(str(e))

  def _shape(self, vi: onnx.ValueInfoProto) -> tuple:
    """The input's shape as pinned or declared, None for a dim neither gives a size (noted in `unpinned`)."""
    if vi.name in self.shapes:
      return tuple(int(s) for s in self.shapes[vi.name])
    shape = []
    for i, d in enumerate(vi.type.tensor_type.shape.dim):
      if d.HasField("dim_value") and d.dim_value >= 0:
        shape.append(d.dim_value)
      elif d.dim_param and d.dim_param in self.shapes:
        shape.append(int(self.shapes[d.dim_param]))
      else:
        # a negative size is how some exporters write an unknown one: it needs pinning like a dim_param
        why = f"'{d.dim_param}'" if d.dim_param else f"declared {d.dim_value}" if d.HasField("dim_value") else ""
        self.unpinned.append(f"{vi.name}[{i}]" + (f" ({why})" if why else ""))
        shape.append(None)
    return tuple(shape)

  def raise_problems(self) -> None:
    if self.unpinned:
      self.problems.append(
        f"unknown input dims must be pinned: {', '.join(self.unpinned)} "
        "(use --shape NAME=DIMxDIM or --shape DIM_PARAM=N)"
      )
    if self.problems:
      raise CompileError("; ".join(self.problems), needs_shapes=self.needs_shapes)


def _flat_outputs(outs: list, declared, containers: list[dict], formats: dict) -> list[tuple[str, Tensor]]:
  """The graph's outputs as (name, tensor) pairs, a sequence or optional output spread over its elements."""
  from aot.frontends.onnx_ops_sequence import container_output

  flat = []
  for o, vi in zip(outs, declared):
    try:
      kind, parts = container_output(o, vi.name)
    except ValueError as e:
      raise CompileError(str(e))
    if kind != "tensor":
      containers.append({"name": vi.name, "kind": kind, "side": "output", "start": len(flat), "count": len(parts)})
    elem = vi if kind == "tensor" else _element_info(vi)
    for n, t in parts:
      flat.append((n, _narrow_output(t, onnx.helper.make_value_info(n, elem.type) if elem else vi, formats)))
  if not flat:
    raise CompileError("the model has no output tensors (each output is an empty optional or sequence)")
  return flat


def _element_info(vi: onnx.ValueInfoProto) -> onnx.ValueInfoProto | None:
  """A sequence (or optional) output's element type, as the value info of one element (None: not declared)."""
  t = vi.type.optional_type.elem_type if vi.type.HasField("optional_type") else vi.type
  if t.HasField("sequence_type"):
    t = t.sequence_type.elem_type
  return onnx.helper.make_value_info(vi.name, t) if t.HasField("tensor_type") else None


def _narrow_input(name: str, shape: tuple, f: Narrow, formats: dict) -> tuple[Tensor, Tensor]:
  """A narrow input: (its Stored tensor, the buffer the caller passes: the codes, or the packed bytes)."""
  formats[name] = (f.name, shape)
  if not f.packed:
    raw = Tensor.input(name, shape, f.storage)
    return narrow.Stored(raw, f), raw
  raw = Tensor.input(name, (f.nbytes(math.prod(shape)),), dtypes.uint8)
  return narrow.Stored(narrow.unpack(raw, f, shape), f), raw


def _narrow_output(o: Tensor, vi: onnx.ValueInfoProto, formats: dict) -> Tensor:
  """An output as what the caller receives: a narrow one as its codes, or packed bytes."""
  f = onnx_narrow(vi.type.tensor_type.elem_type) if vi.type.HasField("tensor_type") else None
  f = f or narrow.fmt_of(o)
  if f is None:
    return o
  if narrow.fmt_of(o) != f:
    o = narrow.convert(o, f)
  formats[vi.name] = (f.name, o.shape)
  return narrow.pack(o, f) if f.packed else o
