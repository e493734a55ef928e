"""The c target under every C compiler a user may have: gcc, Debian 12's default clang (14, also as a plain `clang`)
and clang-19. Flags one of them lacks are probed and dropped, the build cache tells them apart, and a compiler's
failure reaches the user with the compiler's own words. Set CI=true to make a missing compiler a failure."""

import ctypes
import importlib.resources
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import COMPILERS, need
from onnx import TensorProto, helper

import aot
from aot import build
from aot.errors import BuildError
from aot.models import get


@pytest.fixture(params=COMPILERS)
def compiler(request, monkeypatch):
  need(request.param)
  monkeypatch.setenv("CC", request.param)
  return request.param


def check_reference_model(name: str, out_dir):
  art = aot.compile_model(f"models:{name}", out_dir=out_dir, target="c")
  ref = get(name)
  x = ref.example_inputs(3)
  np.testing.assert_allclose(aot.load(art)(*x), ref.reference(*x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["mlp", "mnist"])
def test_reference_model(compiler, name, tmp_path):
  check_reference_model(name, tmp_path)


def test_resnet18_under_clang_14(monkeypatch, tmp_path):
  # the biggest reference model, under the compiler most likely to differ (clang-19 builds it in test_models.py)
  need("clang-14")
  monkeypatch.setenv("CC", "clang-14")
  check_reference_model("resnet18", tmp_path)


def op_chain() -> onnx.ModelProto:
  """Transpose, a reversed Slice (the read gcc 12's vectoriser got wrong), a broadcasting Mul, ReduceSum over two
  axes, Tanh."""
  const = lambda name, v: helper.make_tensor(name, TensorProto.INT64, [len(v)], v)
  nodes = [
    helper.make_node("Transpose", ["x"], ["t"], perm=[2, 0, 1]),
    helper.make_node("Slice", ["t", "starts", "ends", "axes", "steps"], ["s"]),
    helper.make_node("Mul", ["s", "y"], ["m"]),
    helper.make_node("ReduceSum", ["m", "raxes"], ["r"], keepdims=1),
    helper.make_node("Tanh", ["r"], ["out"]),
  ]
  graph = helper.make_graph(
    nodes,
    "chain",
    [
      helper.make_tensor_value_info("x", TensorProto.FLOAT, [6, 7, 9]),
      helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 1]),
    ],
    [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
    initializer=[
      const("starts", [-1]),
      const("ends", [-100]),
      const("axes", [0]),
      const("steps", [-1]),
      const("raxes", [0, 2]),
    ],
  )
  return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_onnx_op_chain_with_a_reduction(compiler, tmp_path):
  model = op_chain()
  rng = np.random.default_rng(0)
  x, y = rng.standard_normal((6, 7, 9), dtype=np.float32), rng.standard_normal((1, 6, 1), dtype=np.float32)
  session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
  want = session.run(None, {"x": x, "y": y})[0]
  got = aot.load(aot.compile_model(model, out_dir=tmp_path, target="c"))(x, y)
  assert got.shape == want.shape == (1, 6, 1)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def strided_conv_with_padding_taps() -> onnx.ModelProto:
  """issue 29's graph: a 1x3 conv at stride 2 over a gathered row of 5, whose last output column's two right taps are
  padding; the pool's result is an output too, so the row is a buffer and the conv a kernel of its own."""
  rng = np.random.default_rng(0)
  w, b = rng.standard_normal((6, 1, 1, 3), dtype=np.float32), rng.standard_normal(6, dtype=np.float32)
  nodes = [
    helper.make_node("AveragePool", ["x"], ["pooled"], kernel_shape=[1], count_include_pad=1),
    helper.make_node("Gather", ["pooled", "row"], ["g"], axis=-2),
    helper.make_node("Conv", ["g", "w", "b"], ["y"], kernel_shape=[1, 3], strides=[2, 2], pads=[0, 0, 0, 2]),
  ]
  graph = helper.make_graph(
    nodes,
    "strided_conv",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 5])],
    [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "pooled")],
    initializer=[
      helper.make_tensor("row", TensorProto.INT64, [1, 1], [1]),
      helper.make_tensor("w", TensorProto.FLOAT, w.shape, w.ravel()),
      helper.make_tensor("b", TensorProto.FLOAT, b.shape, b),
    ],
  )
  return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_a_strided_conv_with_padding_taps(compiler, tmp_path):
  # clang 19's SLP vectoriser made the padding taps' lanes garbage on an AVX-512 host: 5 of 18 values off by up to 0.2
  model = strided_conv_with_padding_taps()
  x = np.random.default_rng(1).standard_normal((1, 3, 5), dtype=np.float32)
  session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
  want = session.run(None, {"x": x})
  got = aot.load(aot.compile_model(model, out_dir=tmp_path, target="c"), threads=1)(x)
  assert got[0].shape == want[0].shape == (1, 6, 1, 3)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_half_tensors_build_and_round_exactly(compiler, tmp_path):
  # clang 14 knows _Float16 on x86 only with AVX512-FP16: on a CPU without it (a Zen 4) every float16 model failed to
  # build under clang-14. The reference is float64 rounded once to half: onnxruntime's half Mul is 1 ulp off it in
  # about half of these products (the less exact side), so it is only held to that ulp
  nodes = [
    helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16),
    helper.make_node("Mul", ["h", "h"], ["sq"]),
    helper.make_node("Cast", ["sq"], ["y"], to=TensorProto.FLOAT),
  ]
  graph = helper.make_graph(
    nodes,
    "half",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 33])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 33]), helper.make_tensor_value_info("sq", 10, [4, 33])],
  )
  model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
  x = np.random.default_rng(2).standard_normal((4, 33), dtype=np.float32) * 100
  h = x.astype(np.float16).astype(np.float64)
  with np.errstate(over="ignore"):
    exact = (h * h).astype(np.float16)
  y, sq = aot.load(aot.compile_model(model, out_dir=tmp_path, target="c"))(x)
  np.testing.assert_array_equal(sq, exact)
  np.testing.assert_array_equal(y, exact.astype(np.float32))
  ort_sq = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[1]
  np.testing.assert_allclose(sq, ort_sq, rtol=2**-10)


def test_clang_builds_the_generated_kernels_without_slp(compiler, tmp_path, monkeypatch):
  # the test above's guard on a host without AVX-512, where clang 19 got that conv right with SLP on too
  commands, run = [], build.run_build_command
  monkeypatch.setattr(build, "run_build_command", lambda cmd, cwd: commands.append(cmd) or run(cmd, cwd))
  # (none of an earlier compile's runtime prebuilds is left to take: this build compiles every file it links)
  monkeypatch.setattr(build, "_prebuilt", {})
  aot.compile_model("models:mlp", out_dir=tmp_path, target="c", cache=False)
  built = {cmd[cmd.index("-c") + 1]: cmd for cmd in commands if "-c" in cmd}
  assert {"model.c", "aot_gemm.c"} <= set(built)
  slp_off = compiler != "gcc"
  assert ("-fno-slp-vectorize" in built["model.c"]) == slp_off
  assert "-fno-slp-vectorize" not in built["aot_gemm.c"]


@pytest.fixture
def plain_clang(tmp_path, monkeypatch):
  """A folder first on PATH whose `clang` is clang 14 (Debian 12's clang package); returns the link."""
  clang14 = need("clang-14")
  (tmp_path / "bin").mkdir()
  link = tmp_path / "bin" / "clang"
  link.symlink_to(clang14)
  monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
  monkeypatch.setenv("CC", "clang")
  return link


def test_plain_clang_14_builds_a_model(plain_clang, tmp_path):
  # clang 14 rejects -mno-gather/-mno-scatter, which clang 19 takes: probed and dropped, so the build works
  assert "-mno-gather" not in build.cflags("native")
  check_reference_model("mnist", tmp_path / "mnist")


def test_flags_are_probed_per_compiler(monkeypatch):
  need("clang-19")
  monkeypatch.setenv("CC", "clang-19")
  assert {"-mno-gather", "-mno-scatter"} <= set(build.cflags("native"))
  need("gcc")
  monkeypatch.setenv("CC", "gcc")
  flags = build.cflags("native")
  assert "-fno-tree-loop-vectorize" in flags and "-mno-gather" not in flags


def fake_compiler(path, script: str) -> str:
  path.write_text("#!/bin/sh\n" + script)
  path.chmod(0o755)
  return str(path)


def test_a_flag_that_only_warns_is_dropped(tmp_path):
  # clang takes some flags it cannot use with only a warning ("argument unused during compilation")
  gcc = need("gcc")
  cc = fake_compiler(
    tmp_path / "warncc",
    f'case "$*" in *-mfancy*) echo "warning: argument unused during '
    f'compilation: \'-mfancy\'" >&2; exit 0;; esac\nexec {gcc} "$@"\n',
  )
  assert not build._accepts(build.compiler_identity(cc), "-mfancy")
  assert build._accepts(build.compiler_identity(cc), "-O2")


def test_newest_clang_on_path_is_preferred(tmp_path):
  for name in ("clang", "clang-14", "clang-17", "clang-9", "gcc"):
    fake_compiler(tmp_path / name, "exit 0\n")
  assert build._find_cc(str(tmp_path)) == "clang-17"
  for name in ("clang-14", "clang-17"):
    (tmp_path / name).unlink()
  assert build._find_cc(str(tmp_path)) == "clang"
  (tmp_path / "clang").unlink()
  assert build._find_cc(str(tmp_path)) == "gcc"


def test_the_build_cache_tells_compilers_of_one_name_apart(plain_clang, tmp_path, monkeypatch):
  monkeypatch.setenv("AOT_CACHE_DIR", str(tmp_path / "cache"))
  # no optional flags for either compiler: only the compiler's identity can keep their builds apart
  monkeypatch.setattr(build, "_accepts", lambda identity, flag: False)
  src = tmp_path / "src"
  src.mkdir()
  (src / "a.c").write_text("int aot_answer(void) { return 42; }\n")
  out = tmp_path / "liba.so"
  assert build.build_library(src, ["a.c"], out) is False
  assert build.build_library(src, ["a.c"], out) is True
  # the same name, now another compiler: nothing of the first one's build is reused
  plain_clang.unlink()
  plain_clang.symlink_to(need("clang-19"))
  assert build.build_library(src, ["a.c"], out) is False


def test_an_object_is_keyed_by_the_headers_its_source_includes(tmp_path, monkeypatch):
  monkeypatch.setenv("AOT_CACHE_DIR", str(tmp_path / "cache"))
  src = tmp_path / "src"
  src.mkdir()
  (src / "answer.h").write_text('#include "base.h"\n#define ANSWER (BASE + 2)\n')
  (src / "base.h").write_text("#define BASE 40\n")
  (src / "m.h").write_text("/* a model's own header: a.c and b.c do not include it */\n")
  (src / "a.c").write_text(
    '#include "answer.h"\n__attribute__((visibility("default"))) int aot_answer(void) { return ANSWER; }\n'
  )
  (src / "b.c").write_text("int aot_other(void) { return 7; }\n")
  assert build.included_headers(src, "a.c") == ["answer.h", "base.h"] and build.included_headers(src, "b.c") == []
  objects = lambda: sorted((tmp_path / "cache" / "obj").glob("*.o"))
  answer = lambda lib: ctypes.CDLL(str(lib)).aot_answer()
  # each library in its own folder under one name, as artifacts are: the name is its SONAME, part of the key
  lib = lambda n: (tmp_path / n).mkdir() or tmp_path / n / "libanswer.so"
  assert build.build_library(src, ["a.c", "b.c"], lib("1")) is False
  first = objects()
  assert len(first) == 2
  # a header no source includes (another model's): the library and its objects are the ones already built
  (src / "m.h").write_text("/* another model */\n")
  assert build.build_library(src, ["a.c", "b.c"], lib("2")) is True
  assert objects() == first and answer(tmp_path / "2" / "libanswer.so") == 42
  # a header a.c includes through another one: a.c compiles anew, b.c does not
  (src / "base.h").write_text("#define BASE 50\n")
  assert build.build_library(src, ["a.c", "b.c"], lib("3")) is False
  assert len(objects()) == 3 and answer(tmp_path / "3" / "libanswer.so") == 52


def test_editing_the_int8_runtime_rebuilds_no_float_model(tmp_path, monkeypatch):
  # the runtime read from a copy: its int8 parts' headers edited, the mlp (the float microkernel only) builds from the
  # cache, each object and the library; its own microkernel's header edited, what includes it compiles anew
  monkeypatch.setenv("AOT_CACHE_DIR", str(tmp_path / "cache"))
  runtime = tmp_path / "runtime_c"
  shutil.copytree(str(importlib.resources.files("aot.runtime_c")), runtime)
  files = importlib.resources.files
  monkeypatch.setattr(importlib.resources, "files", lambda p: runtime if p == "aot.runtime_c" else files(p))
  objects = lambda: sorted(p.name for p in (tmp_path / "cache" / "obj").glob("*.o"))
  libraries = lambda: sorted(p.parent.name for p in (tmp_path / "cache").glob("*/lib.so"))
  check_reference_model("mlp", tmp_path / "first")
  built = objects(), libraries()
  assert len(built[0]) >= 3 and len(built[1]) == 1
  for h in ("aot_qgemm.h", "aot_qim2col.h", "aot_qpool.h", "aot_qvec.h", "aot_qmicro.h"):
    (runtime / h).write_text((runtime / h).read_text() + "/* edited */\n")
  check_reference_model("mlp", tmp_path / "int8-edited")
  assert (objects(), libraries()) == built
  (runtime / "aot_gemm.h").write_text((runtime / "aot_gemm.h").read_text() + "/* edited */\n")
  check_reference_model("mlp", tmp_path / "gemm-edited")
  # model.c and aot_gemm.c include it, aot_runtime.c and the kernels do not
  assert len(objects()) == len(built[0]) + 2 and len(libraries()) == 2


def runtime_functions(lib) -> set[str]:
  """The runtime's entry points that a library holds (hidden symbols: nm lists them from the symbol table)."""
  out = subprocess.run(["nm", str(lib)], capture_output=True, text=True, check=True).stdout
  return {ln.split()[-1] for ln in out.splitlines() if ln.split()[-1] in RUNTIME_ENTRIES}


RUNTIME_ENTRIES = {"aot_gemm_run", "aot_depthwise_run", "aot_qgemm_run", "aot_qpool_run", "aot_qim2col_run"}


def test_an_artifact_links_only_the_runtime_its_kernels_call(tmp_path):
  x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])
  y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])
  relu = helper.make_model(
    helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu", [x], [y]),
    opset_imports=[helper.make_opsetid("", 17)],
  )
  art = aot.compile_model(relu, out_dir=tmp_path / "relu")
  v = np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)
  np.testing.assert_array_equal(aot.load(art)(v), np.maximum(v, 0))
  assert runtime_functions(art.library_path) == set()
  # the mlp's contractions run on the float microkernel, and on nothing else of the runtime's
  check_reference_model("mlp", tmp_path / "mlp")
  assert runtime_functions(tmp_path / "mlp" / "libmlp.so") == {"aot_gemm_run"}


@pytest.mark.parametrize("cc", COMPILERS)
def test_an_avx512_build_runs_the_float_microkernel_16_lanes_wide(cc, tmp_path, monkeypatch):
  # -march of an Intel AVX-512 server CPU prefers 256-bit vectors, and clang then split the microkernel's 16-lane
  # vector types in two (ResNet-50 1.5x slower); built for one, not run, so any x86-64 host checks it
  need(cc)
  monkeypatch.setenv("CC", cc)
  art = aot.compile_model("models:mlp", out_dir=tmp_path, target="c", cpu="skylake-avx512")
  out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(art.library_path)], capture_output=True, text=True)
  # the microkernel's code: aot_gemm_run and what the compiler left uninlined of it (gcc: microkernel_8x32, ...)
  bodies = {m.group(1): b for b in out.stdout.split("\n\n") if (m := re.match(r"[0-9a-f]+ <([^>]+)>:", b.strip()))}
  gemm = [b for name, b in bodies.items() if name == "aot_gemm_run" or name.startswith("microkernel_")]
  assert gemm and any("%zmm" in b for b in gemm)


# a compiler that fails on model.c with a known message (on stderr or stdout), and is gcc otherwise
REFUSE_MODEL_C = (
  'for a in "$@"; do\n'
  '  [ "$a" = model.c ] && {{ echo "model.c:1:1: error: {message}" {to}; exit 1; }}\n'
  'done\nexec {gcc} "$@"\n'
)


@pytest.mark.parametrize("to", ["stderr", "stdout"])
def test_a_failed_build_shows_the_compilers_message(to, tmp_path, monkeypatch):
  gcc = need("gcc")
  message = f"the test compiler refuses model.c on {to}"
  script = REFUSE_MODEL_C.format(message=message, to=">&2" if to == "stderr" else "", gcc=gcc)
  monkeypatch.setenv("CC", fake_compiler(tmp_path / "refusing-cc", script))
  with pytest.raises(BuildError, match=rf"-c model\.c .* failed \(exit 1\):\nmodel.c:1:1: error: {message}"):
    aot.compile_model("models:mlp", out_dir=tmp_path / "out", cache=False)
  assert not (tmp_path / "out").exists()
  # and compile-model prints it, not just the command
  p = subprocess.run(
    [sys.executable, "-m", "aot.cli", "models:mlp", "-o", str(tmp_path / "out"), "--no-cache"],
    capture_output=True,
    text=True,
  )
  assert p.returncode == 1 and "Traceback" not in p.stderr
  assert f"error: {message}" in p.stderr, p.stderr
