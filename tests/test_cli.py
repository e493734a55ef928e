"""compile-model end to end, in a subprocess, as a user runs it."""

import io
import json
import re
import subprocess
import sys

import pytest


def cli(*args, cwd=None):
  return subprocess.run([sys.executable, "-m", "aot.cli", *args], capture_output=True, text=True, cwd=cwd)


def test_compile_and_check_a_bundled_model(tmp_path):
  p = cli("models:mlp", "-o", str(tmp_path / "out"), "--check")
  assert p.returncode == 0, p.stderr
  assert "mlp: 3 kernels" in p.stdout and "k0_r_8_256" in p.stdout
  assert "arena:" in p.stdout and "PASS" in p.stdout
  manifest = json.loads((tmp_path / "out" / "mlp.json").read_text())
  assert [k["name"] for k in manifest["kernels"]] == ["k0_r_8_256", "k1_r_8_128", "k2_r_8_10"]
  assert (tmp_path / "out" / "libmlp.so").exists() and (tmp_path / "out" / "mlp.h").exists()
  assert (tmp_path / "out" / "src" / "model.c").exists()


def test_name_sets_the_c_prefix(tmp_path):
  p = cli("models:mlp", "-o", str(tmp_path), "--name", "digits")
  assert p.returncode == 0, p.stderr
  assert "int digits_run(digits_model *m" in (tmp_path / "digits.h").read_text()


def test_unknown_model_is_one_clear_line(tmp_path):
  p = cli("models:nope", "-o", str(tmp_path / "out"))
  assert p.returncode == 1
  assert p.stderr.strip().splitlines() == [
    "compile-model: error: unknown reference model 'nope'; the bundled models are: mlp, mnist, resnet18, transformer"
  ]
  assert "Traceback" not in p.stderr and not (tmp_path / "out").exists()


def test_verbose_error_shows_the_traceback(tmp_path):
  p = cli("models:nope", "-o", str(tmp_path), "-v")
  assert p.returncode == 1 and "Traceback" in p.stderr


def test_usage_error_exits_2():
  p = cli("models:mlp")
  assert p.returncode == 2 and "-o" in p.stderr


def test_emit_kernels_and_graph_do_not_build(tmp_path):
  p = cli("models:mnist", "-o", str(tmp_path), "--emit", "kernels")
  assert p.returncode == 0 and "mnist: 5 kernels" in p.stdout and "k4_r_1_10" in p.stdout
  p = cli("models:mnist", "-o", str(tmp_path), "--emit", "graph")
  assert p.returncode == 0 and "REDUCE" in p.stdout and "BUFFER" in p.stdout
  p = cli("models:mnist", "-o", str(tmp_path), "--emit", "source")
  assert p.returncode == 0 and "void mnist_f4(" in (tmp_path / "src" / "model.c").read_text()
  assert not list(tmp_path.glob("*.so"))


def test_llvm_target_and_its_source(tmp_path):
  p = cli("models:mnist", "-o", str(tmp_path / "ll"), "--target", "llvm", "--check")
  assert p.returncode == 0, p.stderr
  assert "(target llvm)" in p.stdout and "PASS" in p.stdout
  # one function per kernel (matmul-like ones add copies of their operands, named _dense)
  assert (
    len(re.findall(r"define hidden void @\"mnist_f\d+\"\(", (tmp_path / "ll" / "src" / "kernels0.ll").read_text())) == 5
  )
  p = cli("models:mnist", "-o", str(tmp_path / "src_only"), "--target", "llvm", "--emit", "source")
  assert p.returncode == 0 and (tmp_path / "src_only" / "src" / "kernels0.ll").exists()


def test_unknown_triple_is_one_line(tmp_path):
  p = cli(
    "models:mlp", "-o", str(tmp_path / "x"), "--target", "llvm", "--triple", "nonsense-triple", "--cpu", "generic"
  )
  assert p.returncode == 1 and len(p.stderr.strip().splitlines()) == 1 and "nonsense-triple" in p.stderr


def test_no_progress_lines_without_verbose(tmp_path):
  # --no-cache: the C compiler runs, and with it the progress callback
  p = cli("models:mlp", "-o", str(tmp_path / "out"), "--no-cache")
  assert p.returncode == 0 and "mlp: 3 kernels" in p.stdout
  assert p.stderr == ""
  p = cli("models:mlp", "-o", str(tmp_path / "out"), "--no-cache", "-v")
  assert p.returncode == 0 and "  .. compiled 1/" in p.stderr and "  .. scheduled 3 kernels" in p.stderr


def test_quiet_prints_nothing_but_errors(tmp_path):
  p = cli("models:mlp", "-o", str(tmp_path / "out"), "--no-cache", "--check", "-q")
  assert p.returncode == 0 and (p.stdout, p.stderr) == ("", "")
  assert (tmp_path / "out" / "libmlp.so").exists()
  p = cli("models:nope", "-o", str(tmp_path / "out"), "-q")
  assert p.returncode == 1 and p.stdout == "" and p.stderr.startswith("compile-model: error: unknown reference model")
  assert cli("models:mlp", "-o", str(tmp_path / "out"), "-q", "-v").returncode == 2


class FakeTerminal(io.StringIO):
  def isatty(self):
    return True


def test_progress_bar_on_a_terminal_after_a_delay():
  from aot.cli import PROGRESS_DELAY_S, Progress

  now = [0.0]
  term = FakeTerminal()
  progress = Progress(term, clock=lambda: now[0])
  progress("scheduled 40 kernels")
  assert term.getvalue() == ""  # a short compile shows nothing
  now[0] = PROGRESS_DELAY_S + 1
  progress("compiled 1/4 sources")
  progress("compiled 2/4 sources")
  # one line, each update replacing the last: a carriage return and an erase, never a newline
  shown = term.getvalue()
  assert "\n" not in shown and shown.count("\r\x1b[K") == 2
  assert shown.endswith("\r\x1b[K[" + "#" * 12 + "." * 12 + "] compiled 2/4 sources  3 s")
  progress.close()
  assert term.getvalue().endswith("\r\x1b[K") and "\n" not in term.getvalue()


@pytest.mark.parametrize("stream, flags", [(io.StringIO(), {}), (FakeTerminal(), {"quiet": True})])
def test_no_progress_bar_in_a_pipe_or_with_quiet(stream, flags):
  from aot.cli import PROGRESS_DELAY_S, Progress

  progress = Progress(stream, clock=iter([0.0, PROGRESS_DELAY_S + 1, PROGRESS_DELAY_S + 2]).__next__, **flags)
  progress("compiled 1/2 sources")
  progress("compiled 2/2 sources")
  progress.close()
  assert stream.getvalue() == ""


@pytest.fixture
def damaged_builds(monkeypatch):
  """aot.compile_model, as the CLI calls it, damages each artifact's weights after building it."""
  from conftest import corrupt_weights

  import aot

  compile_model = aot.compile_model

  def damaged(*a, **kw):
    art = compile_model(*a, **kw)
    corrupt_weights(art)
    return art

  monkeypatch.setattr(aot, "compile_model", damaged)


def test_check_reports_fail_on_a_wrong_artifact(damaged_builds, capsys, tmp_path):
  """--check on an artifact whose weights were damaged after it was built: FAIL and exit 1."""
  from aot import cli

  assert cli.main(["models:mlp", "-o", str(tmp_path / "out"), "--check"]) == 1
  check = capsys.readouterr().out.strip().splitlines()[-1]
  assert check.startswith("check vs numpy reference: ") and "-> FAIL" in check, check


def test_check_a_narrow_model_against_onnx_reference(tmp_path):
  """onnxruntime has no bfloat16 Mul nor float8 Cast kernels: --check compares with onnx.reference and says so."""
  from onnx import TensorProto, helper, save

  BF, F8 = TensorProto.BFLOAT16, TensorProto.FLOAT8E4M3FN
  g = helper.make_graph(
    [helper.make_node("Mul", ["x", "x"], ["sq"]), helper.make_node("Cast", ["sq"], ["y"], to=F8)],
    "narrow",
    [helper.make_tensor_value_info("x", BF, [4, 8])],
    [helper.make_tensor_value_info("sq", BF, [4, 8]), helper.make_tensor_value_info("y", F8, [4, 8])],
  )
  save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]), str(tmp_path / "narrow.onnx"))
  p = cli(str(tmp_path / "narrow.onnx"), "-o", str(tmp_path / "out"), "--check")
  assert p.returncode == 0, p.stderr
  line = p.stdout.strip().splitlines()[-1]
  assert re.match(
    r"check vs onnx\.reference \(onnxruntime cannot run it: .+\): max abs err 0\.000e\+00, .* -> PASS", line
  ), line


def test_shape_pins_a_sequence_input_and_check_compares_lists(tmp_path):
  from onnx import TensorProto, helper, save

  seq = helper.make_tensor_sequence_value_info
  F = TensorProto.FLOAT
  g = helper.make_graph(
    [
      helper.make_node("SequenceInsert", ["x", "t"], ["y"]),
      helper.make_node("ConcatFromSequence", ["y"], ["c"], axis=0),
    ],
    "s",
    [seq("x", F, None), helper.make_tensor_value_info("t", F, [1, 4])],
    [seq("y", F, None), helper.make_tensor_value_info("c", F, None)],
  )
  save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]), str(tmp_path / "seq.onnx"))
  p = cli(str(tmp_path / "seq.onnx"), "-o", str(tmp_path / "out"), "--shape", "x=[3x4,2x4]", "--check")
  assert p.returncode == 0, p.stderr
  assert "check vs onnxruntime: max abs err 0.000e+00" in p.stdout and "PASS" in p.stdout, p.stdout
  # (t is a name the profiled run declares for itself: the parameter is t_, aot/artifact.py GENERATED_NAMES)
  assert (
    "const float *x_0, const float *x_1, const float *t_, float *y_0, float *y_1, float *y_2, float *c"
    in (tmp_path / "out" / "seq.h").read_text()
  )


def embeddings_model(path):
  """A BERT-style embedding (word and token-type tables gathered by two int64 inputs) saved at path."""
  import numpy as np
  from onnx import TensorProto, helper, numpy_helper, save

  rng = np.random.default_rng(0)
  tables = [("word", 30), ("types", 2)]
  inits = [numpy_helper.from_array(rng.standard_normal((n, 8)).astype(np.float32), name) for name, n in tables]
  g = helper.make_graph(
    [
      helper.make_node("Gather", ["word", "input_ids"], ["w"], name="word_embeddings"),
      helper.make_node("Gather", ["types", "token_type_ids"], ["t"], name="token_type_embeddings"),
      helper.make_node("Add", ["w", "t"], ["y"]),
    ],
    "emb",
    [
      helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "sequence"])
      for n in ("input_ids", "token_type_ids")
    ],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    inits,
  )
  save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def test_check_draws_indices_within_the_tables_they_index(tmp_path):
  """Seeded integers in [0, 4) were out of range for a 2-row token-type table: onnxruntime refused them and --check
  ended in numpy's bare 'index 3 is out of bounds'. An input the artifact checks as indices stays within its axis."""
  embeddings_model(tmp_path / "emb.onnx")
  p = cli(
    str(tmp_path / "emb.onnx"), "-o", str(tmp_path / "out"), "--shape", "batch=2", "--shape", "sequence=16", "--check"
  )
  assert p.returncode == 0, p.stderr
  assert "check vs onnxruntime: max abs err" in p.stdout and "-> PASS" in p.stdout, p.stdout


def test_check_input_takes_inputs_from_files_and_a_bad_one_is_named(tmp_path):
  import numpy as np

  embeddings_model(tmp_path / "emb.onnx")
  args = [str(tmp_path / "emb.onnx"), "-o", str(tmp_path / "out"), "--shape", "batch=1", "--shape", "sequence=4"]
  np.save(tmp_path / "ids.npy", np.array([[1, 29, -30, 5]]))
  np.save(tmp_path / "types.npy", np.array([[0, 1, -1, 0]]))
  p = cli(
    *args,
    "--check",
    "--check-input",
    f"input_ids={tmp_path / 'ids.npy'}",
    "--check-input",
    f"token_type_ids={tmp_path / 'types.npy'}",
  )
  assert p.returncode == 0 and "-> PASS" in p.stdout, p.stdout + p.stderr
  # a token type of 3: the artifact refuses it first, naming the input and the position; one line, no traceback
  np.save(tmp_path / "types.npy", np.array([[0, 1, 3, 0]]))
  p = cli(*args, "--check", "--check-input", f"token_type_ids={tmp_path / 'types.npy'}")
  assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
  assert p.stderr.startswith(
    "compile-model: error: --check: the artifact refused its inputs: input 'token_type_ids'[0, 2] is 3"
  ), p.stderr
  assert "--check-input NAME=FILE.npy" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
  # inputs that do not fit: named
  np.save(tmp_path / "types.npy", np.zeros((2, 4), np.int64))
  p = cli(*args, "--check", "--check-input", f"token_type_ids={tmp_path / 'types.npy'}")
  assert p.returncode == 1 and "token_type_ids" in p.stderr and "shape (2, 4), the input is (1, 4)" in p.stderr, (
    p.stderr
  )
  p = cli(*args, "--check", "--check-input", f"segment_ids={tmp_path / 'types.npy'}")
  assert p.returncode == 1 and "no input 'segment_ids' (inputs: input_ids, token_type_ids)" in p.stderr, p.stderr


def test_an_input_the_reference_refuses_is_named(tmp_path):
  """Where the artifact does not check (a GPU target only clamps), onnxruntime is the one refusing: the error names
  the model input that reaches the node onnxruntime failed in, not only onnxruntime's message."""
  import numpy as np

  from aot import check

  embeddings_model(tmp_path / "emb.onnx")
  np.save(tmp_path / "types.npy", np.array([[0, 1, 3, 0]]))
  with pytest.raises(check.CheckInputError) as e:
    check._onnx_reference(
      str(tmp_path / "emb.onnx"),
      {"input_ids": np.zeros((1, 4), np.int64), "token_type_ids": np.load(tmp_path / "types.npy")},
      {},
      given={"token_type_ids"},
    )
  msg = str(e.value)
  assert "onnxruntime refused input 'token_type_ids' (given) in node 'token_type_embeddings'" in msg, msg
  assert "idx=3" in msg and "--check-input" in msg, msg


def sigmoid_of_large_negative_logits(path):
  """x @ W squashed into logits in [-26, -11], then Sigmoid: onnxruntime's float32 sigmoid there is off by ~1e-7, many
  times the true values (PP-OCR detectors end this way)."""
  import numpy as np
  from onnx import TensorProto, helper, numpy_helper, save

  w = np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)
  inits = [
    numpy_helper.from_array(w, "w"),
    numpy_helper.from_array(np.full((8,), 7.5, np.float32), "half"),
    numpy_helper.from_array(np.full((8,), -18.5, np.float32), "mid"),
  ]
  g = helper.make_graph(
    [
      helper.make_node("MatMul", ["x", "w"], ["h"]),
      helper.make_node("Tanh", ["h"], ["t"]),
      helper.make_node("Mul", ["t", "half"], ["u"]),
      helper.make_node("Add", ["u", "mid"], ["logits"]),
      helper.make_node("Sigmoid", ["logits"], ["y"]),
    ],
    "det",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 8])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 8])],
    inits,
  )
  save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def test_check_judges_in_float64_where_onnxruntime_rounds_a_sigmoid(tmp_path):
  """onnxruntime's own error (~7e-3 of the largest output) is not blamed on the artifact: where the two disagree, a
  float64 evaluation of the model decides, and the line says so."""
  sigmoid_of_large_negative_logits(tmp_path / "det.onnx")
  p = cli(str(tmp_path / "det.onnx"), "-o", str(tmp_path / "out"), "--check")
  assert p.returncode == 0, p.stdout + p.stderr
  line = p.stdout.strip().splitlines()[-1]
  assert line.startswith("check vs onnxruntime: ") and "(they disagree)" in line, line
  assert "vs float64 evaluation (onnxruntime on a float64 copy of the model)" in line and "-> PASS" in line, line
  own = float(re.search(r"the float32 reference's own max rel err: ([0-9.e+-]+)", line).group(1))
  assert own > 1e-3, line  # onnxruntime's sigmoid really is off here: the test exercises the case


def test_check_still_fails_a_wrong_artifact_judged_in_float64(damaged_builds, capsys, tmp_path):
  from aot import cli as cli_module

  sigmoid_of_large_negative_logits(tmp_path / "det.onnx")
  assert cli_module.main([str(tmp_path / "det.onnx"), "-o", str(tmp_path / "out"), "--check"]) == 1
  line = capsys.readouterr().out.strip().splitlines()[-1]
  assert "vs float64 evaluation" in line and "-> FAIL" in line, line


@pytest.mark.parametrize("dtype", ["INT16", "UINT16", "UINT32", "UINT64"])
def test_check_feeds_every_integer_dtype_as_itself(tmp_path, dtype):
  """--check's seeded inputs and --bind values take the model's own integer dtype (not float32), so onnxruntime
  accepts them and the comparison is of the same values."""
  from onnx import TensorProto, helper, save

  it = getattr(TensorProto, dtype)
  nodes = [
    helper.make_node("Cast", ["n"], ["nf"], to=TensorProto.FLOAT),
    helper.make_node("Cast", ["k"], ["kf"], to=TensorProto.FLOAT),
    helper.make_node("Mul", ["nf", "kf"], ["y"]),
  ]
  g = helper.make_graph(
    nodes,
    "ints",
    [helper.make_tensor_value_info("n", it, [2, 3]), helper.make_tensor_value_info("k", it, [])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
  )
  save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)]), str(tmp_path / "ints.onnx"))
  p = cli(str(tmp_path / "ints.onnx"), "-o", str(tmp_path / "out"), "--bind", "k=3", "--check")
  assert p.returncode == 0, p.stdout + p.stderr
  line = p.stdout.strip().splitlines()[-1]
  assert re.match(r"check vs onnxruntime: max abs err 0\.000e\+00, .* -> PASS", line), line


def test_version_prints_the_package_version():
  import aot

  p = cli("--version")
  assert p.returncode == 0, p.stderr
  assert p.stdout.strip() == f"compile-model (aot) {aot.__version__}"
