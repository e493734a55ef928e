"""--cpu and the CPU check at create: an artifact run on a CPU lacking an extension it was compiled for fails at
NAME_create with AOT_ERR_UNSUPPORTED_CPU naming them (not SIGILL), checked for real under qemu-user's emulated older
CPUs; the manifest's feature list is the compiler's own; the portable levels build and run where they should."""

import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
from conftest import COMPILERS, TARGETS, need

import aot
import aot.models
from aot.build import cc
from aot.cpu import ARM_FEATURES, X86_FEATURES
from aot.errors import InvalidValueError

AOT_ERR_UNSUPPORTED_CPU = 6
TRIPLE = "aarch64-linux-gnu"
# what qemu's Nehalem model has of the feature table (the rest of x86-64-v2's: SSE4.2, POPCNT, CMPXCHG16B, LAHF)
NEHALEM = {"sse3", "ssse3", "cx16", "sse4.1", "sse4.2", "popcnt", "sahf"}
X86_LEVELS_ORDER = ["x86-64", "x86-64-v2", "x86-64-v3", "x86-64-v4"]

# create's status and NAME_last_error(NULL), then the outputs when create worked
PROBE_MNIST = r"""
#include <stdio.h>
#include "mnist.h"
static float in[MNIST_INPUT0_SIZE], out[MNIST_OUTPUT0_SIZE];
int main(int argc, char **argv) {
  FILE *f = fopen(argv[1], "rb");
  if (!f || fread(in, sizeof(float), MNIST_INPUT0_SIZE, f) != MNIST_INPUT0_SIZE) return 10;
  fclose(f);
  mnist_model *m = NULL;
  int st = mnist_create(&m);
  printf("%d\n%s\n", st, st == AOT_OK ? "ok" : mnist_last_error(NULL));
  if (st != AOT_OK) return m != NULL;
  if (mnist_run(m, in, out) != AOT_OK) return 12;
  for (int i = 0; i < MNIST_OUTPUT0_SIZE; i++) printf("%.9g\n", out[i]);
  mnist_destroy(m);
  return 0;
}
"""


def _run_emulated(tmp_path, art, qemu_cpu: str, triple: str | None = None):
  """Build PROBE_MNIST against art, run it under qemu-user as qemu_cpu on an mnist input: (status, message, outputs,
  the input)."""
  compiler = need(f"{triple}-gcc" if triple else "gcc")
  qemu = need("qemu-aarch64" if triple else "qemu-x86_64")
  (tmp_path / "probe.c").write_text(PROBE_MNIST)
  prog = tmp_path / f"probe_{art.dir.name}"
  cmd = [compiler, "-O1", "-std=c11", str(tmp_path / "probe.c"), f"-I{art.dir}", f"-L{art.dir}", "-lmnist"]
  subprocess.run([*cmd, "-o", str(prog)], check=True, capture_output=True, text=True)
  x = aot.models.get("mnist").example_inputs(7)[0]
  (tmp_path / "x.bin").write_bytes(x.tobytes())
  sysroot = ["-L", f"/usr/{triple}"] if triple else []
  env = ["-E", f"LD_LIBRARY_PATH={art.dir}"]
  p = subprocess.run(
    [qemu, "-cpu", qemu_cpu, *sysroot, *env, str(prog), str(tmp_path / "x.bin")],
    capture_output=True,
    text=True,
    timeout=300,
  )
  # a SIGILL is what this check exists to prevent: it shows as a negative return code
  assert p.returncode in (0, 1), f"exit {p.returncode}: {p.stderr[-2000:]}"
  lines = p.stdout.splitlines()
  outputs = np.array([float(v) for v in lines[2:]], dtype=np.float32)
  return int(lines[0]), lines[1], outputs, x


def _named(message: str) -> list[str]:
  """The features a create error names (between 'lacks' and ';')."""
  m = re.search(r"this CPU lacks (.*?); the library was built for --cpu", message)
  assert m, message
  return [f for f in m.group(1).split(", ") if f != "..."]


@pytest.fixture(params=COMPILERS)
def compiler(request, monkeypatch):
  need(request.param)
  monkeypatch.setenv("CC", request.param)
  return request.param


def test_a_native_build_fails_create_on_an_older_cpu(tmp_path, compiler):
  art = aot.compile_model("models:mnist", out_dir=tmp_path / "native", cpu="native")
  features = art.manifest["cpu_features"]
  missing = [f for f in features if f not in NEHALEM]
  assert "avx2" in features, f"this test needs a build machine with AVX2 at least: {features}"
  status, message, _, _ = _run_emulated(tmp_path, art, "Nehalem")
  assert status == AOT_ERR_UNSUPPORTED_CPU, message
  named = _named(message)
  # the first missing ones in the table's order, none that the emulated CPU has, and avx2 (and avx512f, on an
  # AVX-512 build machine) among them
  assert named == missing[: len(named)], (named, missing)
  assert "avx2" in named and ("avx512f" in named) == ("avx512f" in features), message
  assert "--cpu native" in message and art.manifest["cpu_resolved"] in message


def test_an_avx512_build_names_what_haswell_lacks(tmp_path):
  """qemu's TCG implements AVX2 but not AVX-512: a Haswell lacks exactly the x86-64-v4 extensions."""
  art = aot.compile_model("models:mnist", out_dir=tmp_path / "v4", cpu="x86-64-v4")
  status, message, _, _ = _run_emulated(tmp_path, art, "Haswell")
  assert status == AOT_ERR_UNSUPPORTED_CPU
  assert sorted(_named(message)) == ["avx512bw", "avx512cd", "avx512dq", "avx512f", "avx512vl"], message
  assert "--cpu x86-64-v4" in message


@pytest.mark.parametrize("target", TARGETS)
def test_portable_levels_under_an_emulated_nehalem(tmp_path, target):
  """x86-64-v3 fails at create naming AVX2 and FMA; x86-64-v2 runs and matches numpy, on the same emulated CPU."""
  v3 = aot.compile_model("models:mnist", out_dir=tmp_path / "v3", cpu="x86-64-v3", target=target)
  status, message, _, _ = _run_emulated(tmp_path, v3, "Nehalem")
  assert status == AOT_ERR_UNSUPPORTED_CPU
  assert {"avx", "avx2", "fma", "bmi2", "f16c"} <= set(_named(message)), message
  assert not any(f.startswith("avx512") for f in _named(message)), message
  v2 = aot.compile_model("models:mnist", out_dir=tmp_path / "v2", cpu="x86-64-v2", target=target)
  status, message, got, x = _run_emulated(tmp_path, v2, "Nehalem")
  assert (status, message) == (0, "ok")
  want = aot.models.get("mnist").reference(x)
  np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cpu", ["native", "x86-64-v2", "x86-64-v3", "x86-64-v4"])
def test_the_manifest_lists_what_the_compiler_enables(tmp_path, compiler, cpu):
  art = aot.compile_model("models:mnist", out_dir=tmp_path / cpu, cpu=cpu)
  macros = subprocess.run(
    [cc(), f"-march={cpu}", "-dM", "-E", "-x", "c", os.devnull], capture_output=True, text=True, check=True
  ).stdout
  defined = set(re.findall(r"^#define (\w+)", macros, re.MULTILINE))
  want = [f.name for f in X86_FEATURES if f.macro in defined or (f.name == "lzcnt" and "__ABM__" in defined)]
  assert art.manifest["cpu"] == cpu
  assert art.manifest["cpu_features"] == want
  levels = {
    "x86-64-v2": {"sse4.2", "popcnt", "ssse3", "cx16", "sahf"},
    "x86-64-v3": {"avx", "avx2", "fma", "bmi", "bmi2", "f16c", "lzcnt", "movbe"},
    "x86-64-v4": {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"},
  }
  for level, has in levels.items():
    enabled = cpu == "native" or X86_LEVELS_ORDER.index(level) <= X86_LEVELS_ORDER.index(cpu)
    if enabled and cpu != "native":
      assert has <= set(want), (level, want)
    elif not enabled:
      assert not has & set(want), (level, want)
  if cpu == "native":
    assert art.manifest["cpu_resolved"] not in ("native", ""), art.manifest
  else:
    assert art.manifest["cpu_resolved"] == cpu


def test_the_llvm_targets_features_are_checked(tmp_path):
  """The llvm target's kernels are compiled by llvmlite for this machine's CPU: its features are in the manifest and
  the check, and an emulated Haswell is refused at create on an AVX-512 machine."""
  from llvmlite import binding as llvm

  art = aot.compile_model("models:mnist", out_dir=tmp_path / "llvm", target="llvm", cpu="native")
  host = {f[1:] for f in llvm.get_host_cpu_features().flatten().split(",") if f.startswith("+")}
  features = set(art.manifest["cpu_features"])
  assert {f.name for f in X86_FEATURES if f.name in host} <= features
  status, message, _, _ = _run_emulated(tmp_path, art, "Haswell")
  if "avx512f" in host:
    assert status == AOT_ERR_UNSUPPORTED_CPU and "avx512f" in _named(message), message
  if status == AOT_ERR_UNSUPPORTED_CPU:
    assert set(_named(message)) <= features, message
  else:  # a build machine without AVX-512: Haswell has its AVX2 and FMA
    assert status == 0 and "avx2" in features, message


@pytest.mark.parametrize("target", TARGETS)
def test_an_aarch64_build_checks_its_extensions(tmp_path, target):
  """armv8.2-a+dotprod (an -march, not an -mcpu): refused on an emulated Cortex-A53 (ARMv8.0) naming dotprod, run on
  qemu's max CPU with mnist's numbers."""
  need(f"{TRIPLE}-gcc")
  art = aot.compile_model(
    "models:mnist", out_dir=tmp_path / "a64", target=target, triple=TRIPLE, cpu="armv8.2-a+dotprod"
  )
  features = art.manifest["cpu_features"]
  assert {"neon", "dotprod", "lse", "rdm"} <= set(features) <= {f.name for f in ARM_FEATURES}
  status, message, _, _ = _run_emulated(tmp_path, art, "cortex-a53", TRIPLE)
  assert status == AOT_ERR_UNSUPPORTED_CPU
  assert {"dotprod", "lse", "rdm"} <= set(_named(message)) and "neon" not in _named(message), message
  status, message, got, x = _run_emulated(tmp_path, art, "max", TRIPLE)
  assert (status, message) == (0, "ok")
  want = aot.models.get("mnist").reference(x)
  np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
  "cpu, triple, says",
  [
    ("pentium9000", None, "x86-64-v3"),
    ("-O3", None, "x86-64-v3"),
    ("", None, "x86-64-v3"),
    ("armv8.2-a+nosuchthing", TRIPLE, "armv8.2-a+dotprod"),
  ],
)
def test_a_bad_cpu_is_named_with_the_accepted_forms(tmp_path, cpu, triple, says):
  if triple:
    need(f"{triple}-gcc")
  with pytest.raises(InvalidValueError) as e:
    aot.compile_model("models:mnist", out_dir=tmp_path / "bad", cpu=cpu, triple=triple)
  assert repr(cpu) in str(e.value) and says in str(e.value)
  # native is this machine: not a form a cross build takes
  assert ("native" in str(e.value)) == (triple is None), str(e.value)
  assert not (tmp_path / "bad").exists()


def test_the_cli_takes_a_portable_level(tmp_path):
  out = subprocess.run(
    [shutil.which("compile-model") or "compile-model", "models:mnist", "-o", str(tmp_path / "m"), "--cpu", "x86-64-v3"],
    capture_output=True,
    text=True,
  )
  assert out.returncode == 0, out.stderr
  assert "avx2" in aot.load(tmp_path / "m").artifact.manifest["cpu_features"]


def test_the_python_loader_raises_unsupported_cpu_error(tmp_path):
  """aot.load under an emulated Haswell: an x86-64-v4 build's create fails as UnsupportedCpuError (a RunError) whose
  message is the library's, naming AVX-512 F."""
  art = aot.compile_model("models:mnist", out_dir=tmp_path / "v4", cpu="x86-64-v4")
  script = (
    "import aot, sys\n"
    "try:\n"
    f"  aot.load({str(art.dir)!r})\n"
    "except aot.UnsupportedCpuError as e:\n"
    "  print(isinstance(e, aot.RunError), e.status, e)\n"
  )
  p = subprocess.run(
    [need("qemu-x86_64"), "-cpu", "Haswell", sys.executable, "-c", script], capture_output=True, text=True, timeout=300
  )
  assert p.returncode == 0, p.stderr[-2000:]
  assert p.stdout.startswith(f"True {AOT_ERR_UNSUPPORTED_CPU} mnist_create failed"), p.stdout
  assert "avx512f" in _named(p.stdout) and "--cpu x86-64-v4" in p.stdout, p.stdout
