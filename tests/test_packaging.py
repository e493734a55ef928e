"""An artifact links as a library does: a SONAME, a pkg-config file and a CMake package, each used here as a user
would, from a C and a C++ program built outside the artifact's folder, whose output is checked against numpy."""

import os
import shutil
import subprocess

import numpy as np
import pytest

import aot
from aot.models import get

APP_C = r"""
#include <stdio.h>
#include "mnist.h"
int main(void) {
  static float x[MNIST_INPUT0_SIZE], y[MNIST_OUTPUT0_SIZE];
  for (int i = 0; i < MNIST_INPUT0_SIZE; i++) x[i] = (float)(i % 7) / 7.0f;
  mnist_model *m;
  if (mnist_create(&m) != AOT_OK || mnist_run(m, x, y) != AOT_OK) return 1;
  for (int i = 0; i < MNIST_OUTPUT0_SIZE; i++) printf("%.9g\n", y[i]);
  mnist_destroy(m);
  return 0;
}
"""

APP_CPP = r"""
#include <cstdio>
#include <memory>
#include <vector>
#include "mnist.h"
int main() {
  std::vector<float> x(MNIST_INPUT0_SIZE), y(MNIST_OUTPUT0_SIZE);
  for (int i = 0; i < MNIST_INPUT0_SIZE; i++) x[i] = float(i % 7) / 7.0f;
  mnist_model *raw = nullptr;
  if (mnist_create(&raw) != AOT_OK) return 1;
  std::unique_ptr<mnist_model, void (*)(mnist_model *)> m(raw, mnist_destroy);
  if (mnist_run(m.get(), x.data(), y.data()) != AOT_OK) return 1;
  for (float v : y) std::printf("%.9g\n", v);
  return 0;
}
"""


@pytest.fixture(scope="module")
def mnist(tmp_path_factory):
  folder = tmp_path_factory.mktemp("pkg") / "mnist"
  art = aot.compile_model("models:mnist", out_dir=folder)
  model = get("mnist")
  x = (np.arange(np.prod(model.inputs[0][1])) % 7).astype(np.float32).reshape(model.inputs[0][1]) / np.float32(7)
  return art, model.reference(x).reshape(-1)


def _run(cmd, cwd, env=None):
  p = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env)
  assert p.returncode == 0, f"{' '.join(map(str, cmd))}:\n{p.stdout}\n{p.stderr}"
  return p.stdout


def _check_output(out: str, want: np.ndarray) -> None:
  np.testing.assert_allclose(np.array(out.split(), np.float32), want, rtol=1e-4, atol=1e-5)


def test_the_library_is_named_by_its_soname_and_states_its_version(mnist):
  art, _ = mnist
  dynamic = _run(["readelf", "-d", str(art.library_path)], art.dir)
  assert "Library soname: [libmnist.so]" in dynamic
  assert f'#define MNIST_AOT_VERSION "{aot.__version__}"' in art.header_path.read_text()


def test_a_c_program_builds_with_pkg_config_and_runs_from_anywhere(mnist, tmp_path):
  art, want = mnist
  (tmp_path / "app.c").write_text(APP_C)
  env = {**os.environ, "PKG_CONFIG_PATH": str(art.dir)}
  flags = _run(["pkg-config", "--cflags", "--libs", "mnist"], tmp_path, env).split()
  _run(["cc", "app.c", "-o", "app", *flags], tmp_path)
  elsewhere = tmp_path / "elsewhere"
  elsewhere.mkdir()
  _check_output(_run([str(tmp_path / "app")], elsewhere), want)


@pytest.mark.parametrize("language", ["C", "CXX"])
def test_a_cmake_project_finds_the_model_as_a_package(mnist, tmp_path, language):
  art, want = mnist
  source = "app.c" if language == "C" else "app.cpp"
  (tmp_path / source).write_text(APP_C if language == "C" else APP_CPP)
  (tmp_path / "CMakeLists.txt").write_text(
    f"cmake_minimum_required(VERSION 3.16)\nproject(app {language})\n"
    + ("set(CMAKE_CXX_STANDARD 17)\n" if language == "CXX" else "")
    + f"find_package(mnist CONFIG REQUIRED)\nadd_executable(app {source})\n"
    + "target_link_libraries(app PRIVATE mnist::mnist)\n"
  )
  build = tmp_path / "build"
  _run(["cmake", "-S", ".", "-B", "build", f"-Dmnist_DIR={art.dir}"], tmp_path)
  _run(["cmake", "--build", "build"], tmp_path)
  # the program finds libmnist.so by the rpath CMake writes for an imported target, wherever it runs from
  _check_output(_run([str(build / "app")], "/"), want)


def test_the_link_files_name_their_own_folder_so_a_moved_artifact_still_links(mnist, tmp_path):
  art, want = mnist
  moved = tmp_path / "moved" / "mnist"
  shutil.copytree(art.dir, moved)
  (tmp_path / "app.c").write_text(APP_C)
  env = {**os.environ, "PKG_CONFIG_PATH": str(moved)}
  flags = _run(["pkg-config", "--cflags", "--libs", "mnist"], tmp_path, env).split()
  assert all(str(art.dir) not in f for f in flags), flags
  _run(["cc", "app.c", "-o", "app", *flags], tmp_path)
  _check_output(_run([str(tmp_path / "app")], tmp_path), want)
