"""Indices out of range (issue 29, 4b): the generated Gather clamps them, so it never reads out of bounds, and the run
then fails with AOT_ERR_INDEX_RANGE, naming the input, the bad value's position and the valid range, as onnxruntime
refuses such input. Valid negative indices count from the end (ONNX) and still work."""

import subprocess

import numpy as np
import onnxruntime as ort
import pytest
from conftest import TARGETS
from onnx import TensorProto as TP
from onnx import helper as oh
from onnx import numpy_helper as nh
from test_c_api import build_c

import aot
from aot.errors import CompileError, IndexRangeError

VOCAB, TYPES, HIDDEN, BATCH, SEQ = 30, 2, 8, 2, 5


def embeddings(ids_type=TP.INT64, cast_ids: bool = False):
  """A BERT-style embedding: word and token-type tables gathered by two inputs, added, then a dense layer.
  cast_ids: input_ids arrive as int32 and are cast to int64 first (as some exports do)."""
  rng = np.random.default_rng(0)
  inits = [
    nh.from_array(rng.standard_normal((VOCAB, HIDDEN)).astype(np.float32), "word"),
    nh.from_array(rng.standard_normal((TYPES, HIDDEN)).astype(np.float32), "types"),
    nh.from_array(rng.standard_normal((HIDDEN, HIDDEN)).astype(np.float32), "dense"),
  ]
  nodes = [oh.make_node("Cast", ["input_ids"], ["ids"], to=TP.INT64)] if cast_ids else []
  nodes += [
    oh.make_node("Gather", ["word", "ids" if cast_ids else "input_ids"], ["w"], name="word_embeddings"),
    oh.make_node("Gather", ["types", "token_type_ids"], ["t"], name="token_type_embeddings"),
    oh.make_node("Add", ["w", "t"], ["e"]),
    oh.make_node("MatMul", ["e", "dense"], ["y"]),
  ]
  g = oh.make_graph(
    nodes,
    "emb",
    [
      oh.make_tensor_value_info("input_ids", ids_type, [BATCH, SEQ]),
      oh.make_tensor_value_info("token_type_ids", TP.INT64, [BATCH, SEQ]),
    ],
    [oh.make_tensor_value_info("y", TP.FLOAT, [BATCH, SEQ, HIDDEN])],
    inits,
  )
  return oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])


def valid_ids():
  rng = np.random.default_rng(1)
  return rng.integers(0, VOCAB, (BATCH, SEQ)), rng.integers(0, TYPES, (BATCH, SEQ))


@pytest.fixture(scope="module", params=TARGETS)
def emb(request, tmp_path_factory):
  m = embeddings()
  art = aot.compile_model(m, target=request.param, out_dir=tmp_path_factory.mktemp(f"emb_{request.param}"))
  return art, aot.load(art), ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("bad", [TYPES + 1, -5, 2**40, -(2**40)])
def test_a_token_type_out_of_range_is_an_error_naming_input_and_position(emb, bad):
  _, run, sess = emb
  ids, types = valid_ids()
  types[1, 3] = bad
  with pytest.raises(Exception):  # onnxruntime refuses it too
    sess.run(None, {"input_ids": ids, "token_type_ids": types})
  with pytest.raises(IndexRangeError) as e:
    run(ids, types)
  msg = str(e.value)
  assert f"input 'token_type_ids'[1, 3] is {bad}, outside [-2, 1]" in msg, msg
  assert "Gather node 'token_type_embeddings'" in msg, msg


def test_a_token_id_past_the_vocabulary_is_an_error(emb):
  _, run, _ = emb
  ids, types = valid_ids()
  ids[0, 4] = VOCAB
  want = rf"input 'input_ids'\[0, 4\] is {VOCAB}, outside \[-{VOCAB}, {VOCAB - 1}\]"
  with pytest.raises(IndexRangeError, match=want):
    run(ids, types)
  # the instance is still good: the next valid run works
  ids[0, 4] = 0
  run(ids, types)


def test_negative_indices_in_range_count_from_the_end(emb):
  _, run, sess = emb
  ids, types = valid_ids()
  ids[0, :] = [-1, -VOCAB, -7, 0, VOCAB - 1]
  types[1, :] = [-1, -2, 1, 0, -1]
  want = sess.run(None, {"input_ids": ids, "token_type_ids": types})[0]
  np.testing.assert_allclose(run(ids, types), want, rtol=1e-5, atol=1e-5)


def test_indices_through_a_cast_name_the_model_input(tmp_path):
  m = embeddings(TP.INT32, cast_ids=True)
  run = aot.load(aot.compile_model(m, out_dir=tmp_path))
  ids, types = valid_ids()
  ids = ids.astype(np.int32)
  ids[1, 0] = -VOCAB - 1
  with pytest.raises(IndexRangeError, match=rf"input 'input_ids'\[1, 0\] is {-VOCAB - 1}, outside"):
    run(ids, types)


def test_gather_elements_indices_are_checked(tmp_path):
  g = oh.make_graph(
    [oh.make_node("GatherElements", ["x", "i"], ["y"], axis=1, name="ge")],
    "ge",
    [oh.make_tensor_value_info("x", TP.FLOAT, [2, 3]), oh.make_tensor_value_info("i", TP.INT64, [2, 2])],
    [oh.make_tensor_value_info("y", TP.FLOAT, [2, 2])],
  )
  m = oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)])
  run = aot.load(aot.compile_model(m, out_dir=tmp_path))
  x = np.arange(6, dtype=np.float32).reshape(2, 3)
  np.testing.assert_array_equal(run(x, np.array([[0, -1], [2, -3]])), [[0, 2], [5, 3]])
  with pytest.raises(IndexRangeError, match=r"input 'i'\[1, 1\] is 3, .*GatherElements node 'ge'"):
    run(x, np.array([[0, -1], [2, 3]]))


def test_a_constant_index_out_of_range_is_a_compile_error():
  g = oh.make_graph(
    [oh.make_node("Gather", ["x", "i"], ["y"], axis=0, name="g")],
    "const_index",
    [oh.make_tensor_value_info("x", TP.FLOAT, [4, 3])],
    [oh.make_tensor_value_info("y", TP.FLOAT, [2, 3])],
    [nh.from_array(np.array([1, 4], dtype=np.int64), "i")],
  )
  with pytest.raises(CompileError, match=r"tensor 'i'\[1\] is 4, outside \[-4, 3\].*Gather node 'g'"):
    aot.compile_model(oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)]))


CHECK_STATUS = r"""
#include <stdio.h>
#include <string.h>
#include "emb.h"
static int64_t ids[EMB_INPUT0_SIZE], types[EMB_INPUT1_SIZE];
static float y[EMB_OUTPUT0_SIZE];
int main(void) {
  emb_model *m = NULL;
  if (emb_create(&m) != AOT_OK) return 10;
  if (emb_run(m, ids, types, y) != AOT_OK) return 11;
  types[7] = 2;
  int st = emb_run(m, ids, types, y);
  printf("%d %d\n%s\n", st, st == AOT_ERR_INDEX_RANGE, emb_last_error(m));
  emb_destroy(m);
  return 0;
}
"""


@pytest.mark.parametrize("target", TARGETS)
def test_c_api_returns_the_index_status(tmp_path, target):
  art = aot.compile_model(embeddings(), target=target, out_dir=tmp_path / "emb")
  p = subprocess.run([build_c(tmp_path, CHECK_STATUS, art)], capture_output=True, text=True)
  assert p.returncode == 0, p.stderr
  status, message = p.stdout.splitlines()
  assert status == "5 1", p.stdout
  assert message.startswith("input 'token_type_ids'[1, 2] is 2, outside [-2, 1]"), message


@pytest.mark.parametrize("target", ["cuda", "hip"])
def test_gpu_targets_build_without_the_checks(tmp_path, target):
  """The GPU hosts do not read checks back (a bad index is only clamped there): the checks' kernels are dropped and the
  model still matches onnxruntime (its kernels emulated on the CPU)."""
  m = embeddings()
  cpu = aot.compile_model(m, out_dir=tmp_path / "cpu")
  art = aot.compile_model(m, target=target, emulate=True, out_dir=tmp_path / target)
  assert art.num_kernels == cpu.num_kernels - 4  # two checks of two kernels each
  # what the inputs index is still known (--check draws valid ones)
  assert art.indexed_inputs == cpu.indexed_inputs == {"input_ids": VOCAB, "token_type_ids": TYPES}
  ids, types = valid_ids()
  ids[0, 0], types[1, 1] = -1, -2
  want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
    None, {"input_ids": ids, "token_type_ids": types}
  )[0]
  np.testing.assert_allclose(aot.load(art)(ids, types), want, rtol=1e-5, atol=1e-5)


def test_clamped_and_reported_under_the_sanitizers(tmp_path, monkeypatch):
  """ASan/UBSan builds (tests/test_sanitize.py's driver): valid negative indices read in bounds and match onnxruntime;
  2**40 is clamped (no out-of-bounds read, no overflow) and the run fails with the message, nothing else reported."""
  import test_sanitize
  from test_sanitize import run_sanitized

  m = embeddings()
  art = aot.compile_model(m, out_dir=tmp_path / "emb", sanitize=True)
  ids, types = valid_ids()
  ids[0, :2], types[1, :2] = [-1, -VOCAB], [-1, -2]
  want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
    None, {"input_ids": ids, "token_type_ids": types}
  )[0]
  np.testing.assert_allclose(run_sanitized(art, [ids, types], tmp_path)[0], want, rtol=1e-5, atol=1e-5)
  ids[1, 4] = 2**40
  # the driver returns at the failed run without freeing its buffers: not a leak of the artifact's
  monkeypatch.setitem(test_sanitize.SANITIZER_ENV, "ASAN_OPTIONS", "halt_on_error=1:abort_on_error=0:detect_leaks=0")
  with pytest.raises(AssertionError) as e:
    run_sanitized(art, [ids, types], tmp_path)
  report = str(e.value)
  assert f"run: input 'input_ids'[1, 4] is {2**40}, outside" in report, report
  assert "Sanitizer" not in report and "runtime error" not in report, report


def test_names_with_quotes_and_percent_signs_reach_the_message(tmp_path):
  # the names go into a C format string literal: escaped, not interpreted
  node, ids = 'we"ird %s \\ node', 'i%d "x"'
  g = oh.make_graph(
    [oh.make_node("Gather", ["x", ids], ["y"], axis=0, name=node)],
    "names",
    [oh.make_tensor_value_info(ids, TP.INT64, [3])],
    [oh.make_tensor_value_info("y", TP.FLOAT, [3, 2])],
    [nh.from_array(np.ones((4, 2), np.float32), "x")],
  )
  run = aot.load(aot.compile_model(oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)]), out_dir=tmp_path))
  with pytest.raises(IndexRangeError) as e:
    run(np.array([0, 9, 1]))
  assert f"input '{ids}'[1] is 9, outside [-4, 3], the axis of size 4 that Gather node '{node}' indexes" in str(e.value)
