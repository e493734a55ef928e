"""The ONNX backend node test suite (the cases shipped inside the onnx package): each case compiled to a .so through
aot/tools/onnx_backend.py, run on every target, and its outputs compared as onnx's own runner compares them
(Runner.assert_similar_outputs, with the case's tolerances).

Cases that share an ONNX version and opsets, and take and give tensors only, are compiled in chunks: their graphs
side by side in one model (each case's names prefixed), one library per chunk. A case's own C build (the compiler's
start, a compile and a link: 0.15 s) was most of its test, and 3,600 of them the suite's longest part; in chunks of
CHUNK a case costs about a third of that. Each case is still a test of its own, run on the worker that builds its
chunk (xdist_group, with --dist loadgroup in pyproject.toml); where a chunk does not compile or run, its cases run one
at a time, so that a failure names its case and says what it is."""

import functools
import re
import warnings

import pytest
from conftest import TARGETS
from onnx import compose
from onnx.backend.test.loader import load_model_tests
from onnx.backend.test.runner import Runner, _normalize_tensor
from onnx_exclusions import EXCLUDED

from aot.tools.onnx_backend import AotBackend, AotLLVMBackend

# the onnx.backend entry each target is compiled through (its prepare checks the model with onnx's checker first)
BACKENDS = {"c": AotBackend, "llvm": AotLLVMBackend}
# cases per chunk: the chunk's compile grows with it, the share of a C build per case falls (30: 1.4 s, 0.05 s a case)
CHUNK = 30


def _cases() -> dict:
  """The node cases onnx ships, by name, less the excluded ones (not collected at all: a skipped test would look like
  a missing feature)."""
  excluded = re.compile("|".join(f"(?:{p})" for p, _ in EXCLUDED))
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # (onnx's case generators overflow casts on purpose)
    return {c.name: c for c in load_model_tests(kind="node") if not excluded.search(c.name)}


CASES = _cases()


def _chunk_key(case) -> tuple | None:
  """What cases must share to be one model (compose.merge_models: the ONNX version and opsets); None for a case that
  runs alone: several data sets, local functions, or an input or output other than a tensor."""
  m = case.model
  tensors = all(v.type.HasField("tensor_type") for v in [*m.graph.input, *m.graph.output])
  if len(case.data_sets) != 1 or m.functions or not tensors:
    return None
  return m.ir_version, tuple(sorted((o.domain, o.version) for o in m.opset_import))


def _chunks() -> dict[str, list[str]]:
  """Chunk name -> its cases, in onnx's order; a case that runs alone is a chunk of its own."""
  by_key: dict = {}
  for name, case in CASES.items():
    by_key.setdefault(_chunk_key(case) or name, []).append(name)
  chunks = {}
  for i, names in enumerate(by_key.values()):
    for j in range(0, len(names), CHUNK):
      chunks[f"chunk{i}_{j // CHUNK}"] = names[j : j + CHUNK]
  return chunks


CHUNKS = _chunks()
CHUNK_OF = {name: chunk for chunk, names in CHUNKS.items() for name in names}


def _run_alone(target: str, name: str) -> list:
  """The case compiled alone: its outputs for each of its data sets."""
  case = CASES[name]
  rep = BACKENDS[target].prepare(case.model)
  return [rep.run([_normalize_tensor(x) for x in inputs]) for inputs, _ in case.data_sets]


def _merged(chunk: str):
  """The chunk's cases side by side in one model, case i's names prefixed c{i}_ (inputs, outputs, nodes, weights)."""
  merged = None
  for i, name in enumerate(CHUNKS[chunk]):
    part = compose.add_prefix(CASES[name].model, f"c{i}_")
    merged = part if merged is None else compose.merge_models(merged, part, io_map=[])
  merged.graph.name = chunk
  return merged


@functools.lru_cache(maxsize=None)
def _chunk_outputs(target: str, chunk: str) -> dict[str, list] | None:
  """Each case's outputs (one data set) from its chunk compiled as one model; None where that model does not compile
  or run (its cases then run alone)."""
  names = CHUNKS[chunk]
  if len(names) == 1:
    return None
  merged = _merged(chunk)
  feed = {}
  for i, name in enumerate(names):
    (inputs, _), graph = CASES[name].data_sets[0], CASES[name].model.graph
    feed |= {f"c{i}_{v.name}": _normalize_tensor(x) for v, x in zip(graph.input, inputs)}
  try:
    outs = dict(zip([o.name for o in merged.graph.output], BACKENDS[target].prepare(merged).run(feed)))
  except Exception:
    return None
  return {name: [[outs[f"c{i}_{o.name}"] for o in CASES[name].model.graph.output]] for i, name in enumerate(names)}


@pytest.mark.parametrize(
  "target, name",
  [pytest.param(t, n, marks=pytest.mark.xdist_group(f"{t}_{CHUNK_OF[n]}")) for t in TARGETS for n in CASES],
)
def test_node_case(target: str, name: str):
  case = CASES[name]
  chunk = _chunk_outputs(target, CHUNK_OF[name])
  outputs = chunk[name] if chunk is not None else _run_alone(target, name)
  for (_, refs), outs in zip(case.data_sets, outputs, strict=True):
    Runner.assert_similar_outputs([_normalize_tensor(r) for r in refs], outs, rtol=case.rtol, atol=case.atol)


def test_every_case_onnx_ships_is_run_or_excluded_by_name():
  """The collected cases and the exclusions' matches are all of onnx's node cases, and a chunk's graphs keep every
  case's inputs and outputs apart (each case's names prefixed, none shared)."""
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    everything = [c.name for c in load_model_tests(kind="node")]
  excluded = [n for n in everything if any(re.search(p, n) for p, _ in EXCLUDED)]
  assert sorted(CASES) == sorted(set(everything) - set(excluded)) and len(CASES) > 1700
  assert sorted(CHUNK_OF) == sorted(CASES) and max(len(n) for n in CHUNKS.values()) == CHUNK
  chunk, names = next((c, n) for c, n in CHUNKS.items() if len(n) > 1)
  graph = _merged(chunk).graph
  io = [v.name for v in [*graph.input, *graph.output]]
  cases = [CASES[n].model.graph for n in names]
  own = [f"c{i}_{v.name}" for i, g in enumerate(cases) for v in [*g.input, *g.output]]
  assert len(io) == len(set(io)) and sorted(io) == sorted(own)
