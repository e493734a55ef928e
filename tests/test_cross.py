"""Cross-compilation: an aarch64 libNAME.so, linked into a C program built with Debian's aarch64 gcc, run under
qemu-user, printing the same numbers as the host."""

import shutil
import subprocess

import numpy as np
import pytest
from conftest import TARGETS
from test_c_api import RUN_MNIST

import aot
import aot.models

TRIPLE = "aarch64-linux-gnu"


def _elf_machine(path) -> int:
  data = open(path, "rb").read(20)
  assert data[:4] == b"\x7fELF"
  return int.from_bytes(data[18:20], "little")


@pytest.mark.parametrize("target", TARGETS)
def test_aarch64_artifact_runs_under_qemu(tmp_path, target):
  for tool in (f"{TRIPLE}-gcc", "qemu-aarch64"):
    assert shutil.which(tool), f"{tool} is missing: .ci/run installs gcc-aarch64-linux-gnu and qemu-user"
  model = aot.models.get("mnist")
  art = aot.compile_model("models:mnist", out_dir=tmp_path / "a64", target=target, triple=TRIPLE, cpu="generic")
  assert _elf_machine(art.library_path) == 183  # EM_AARCH64
  (tmp_path / "prog.c").write_text(RUN_MNIST)
  subprocess.run(
    [
      f"{TRIPLE}-gcc",
      "-O1",
      str(tmp_path / "prog.c"),
      f"-I{art.dir}",
      f"-L{art.dir}",
      "-lmnist",
      "-o",
      str(tmp_path / "prog"),
    ],
    check=True,
    capture_output=True,
  )
  x = model.example_inputs(4)[0]
  (tmp_path / "x.bin").write_bytes(x.tobytes())
  out = subprocess.run(
    [
      "qemu-aarch64",
      "-L",
      f"/usr/{TRIPLE}",
      "-E",
      f"LD_LIBRARY_PATH={art.dir}",
      str(tmp_path / "prog"),
      str(tmp_path / "x.bin"),
    ],
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert out.returncode == 0, out.stderr
  got = np.array([float(v) for v in out.stdout.split()], dtype=np.float32).reshape(1, 10)
  host = aot.load(aot.compile_model("models:mnist", target=target))(x)
  np.testing.assert_allclose(got, host, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(got, model.reference(x), rtol=1e-4, atol=1e-4)
