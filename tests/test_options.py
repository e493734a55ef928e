"""compile_model's options as one value (aot/options.py): checked once when made, built alike by Python and the CLI."""

from __future__ import annotations

import numpy as np
import pytest

import aot
from aot.errors import InvalidTypeError, InvalidValueError
from aot.options import CompileOptions


def affine(x):
  return x * 2.0 + 1.0


@pytest.mark.parametrize(
  "kw, message",
  [
    (dict(target="vulkan"), "unknown target 'vulkan'; available: c, llvm, cuda, hip, metal"),
    (dict(target="cuda", profile=True), "profile is for the CPU targets (c, llvm), not cuda"),
    (dict(target="hip", emulate=True, profile=True), "profile is for the CPU targets (c, llvm), not hip emulation"),
    (dict(target="hip", triple="aarch64-linux-gnu"), "--triple is for the CPU targets; target hip builds"),
    (dict(target="metal", sanitize=True), "sanitize is for the CPU targets (c, llvm), not metal"),
    (dict(target="metal", emulate=True), "emulate=True runs the CUDA or HIP kernel source on the CPU"),
  ],
)
def test_options_that_do_not_fit_are_refused_when_made(kw, message):
  with pytest.raises(InvalidValueError) as e:
    CompileOptions(**kw)
  assert str(e.value).startswith(message)
  # compile_model's keywords are the same options, refused before the model is read
  with pytest.raises(InvalidValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
    aot.compile_model("models:not-read", **kw)


def test_sanitize_defaults_to_the_environment(monkeypatch):
  monkeypatch.setenv("AOT_SANITIZE", "1")
  assert CompileOptions().sanitize is True
  with pytest.raises(InvalidValueError, match="sanitize is for the CPU targets"):
    CompileOptions(target="cuda")
  monkeypatch.setenv("AOT_SANITIZE", "0")
  assert CompileOptions().sanitize is False and CompileOptions(sanitize=True).sanitize is True


def test_options_and_keywords_build_the_same_artifact(tmp_path):
  x = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
  steps: list[str] = []
  by_kw = aot.compile_model(affine, [x], out_dir=tmp_path / "kw", name="m", progress=steps.append)
  opts = CompileOptions(out_dir=tmp_path / "opts", name="m")
  by_opts = aot.compile_model(affine, [x], options=opts)
  assert [k.function for k in by_kw.kernels] == [k.function for k in by_opts.kernels]
  assert (by_kw.dir / "src" / "model.c").read_text() == (by_opts.dir / "src" / "model.c").read_text()
  np.testing.assert_allclose(aot.load(by_opts)(x), x.astype(np.float64) * 2 + 1, rtol=1e-6)
  assert steps[0] == "scheduled 1 kernels", steps
  with pytest.raises(InvalidTypeError, match="options or keywords, not both"):
    aot.compile_model(affine, [x], options=opts, target="llvm")
  with pytest.raises(TypeError):
    aot.compile_model(affine, [x], no_such_option=True)


def test_the_cli_builds_the_options(monkeypatch, tmp_path):
  from aot import cli

  seen = []
  monkeypatch.setattr(aot, "compile_model", lambda what, options: seen.append((what, options)) or 1 / 0)
  argv = ["models:mlp", "-o", str(tmp_path), "--target", "llvm", "--cpu", "x86-64-v2", "--shape", "x=2x3"]
  assert cli.main([*argv, "--bind", "n=4", "--no-cache", "-q"]) == 1  # the stand-in fails after recording
  ((what, opts),) = seen
  assert what == "models:mlp" and isinstance(opts, CompileOptions)
  assert (opts.target, opts.cpu, opts.cache, opts.shapes, opts.bind) == (
    "llvm",
    "x86-64-v2",
    False,
    {"x": (2, 3)},
    {"n": 4},
  )
  assert opts.out_dir == tmp_path and opts.progress is not None
