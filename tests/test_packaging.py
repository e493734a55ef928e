"""An artifact links as a library does: a SONAME, a pkg-config file and a CMake package, each used here as a user
would, from a C and a C++ program built outside the artifact's folder, whose output is checked against numpy; linked
statically (libNAME.a), the program runs with the artifact gone; NAME.hpp, the C++ class over the C API."""

import os
import shutil
import subprocess

import numpy as np
import pytest

import aot
import aot.artifact
from aot.models import get

APP_C = r"""
#include <stdio.h>
#include "mnist.h"
int main(void) {
  static float x[MNIST_INPUT0_SIZE], y[MNIST_OUTPUT0_SIZE];
  for (int i = 0; i < MNIST_INPUT0_SIZE; i++) x[i] = (float)(i % 7) / 7.0f;
  mnist_model *m;
  if (mnist_create(&m) != AOT_OK) {
    fprintf(stderr, "%s\n", mnist_last_error(NULL));
    return 1;
  }
  if (mnist_run(m, x, y) != AOT_OK) return 1;
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


def _moved_away(art, tmp_path):
  """A copy of the artifact's folder, which a test may delete after linking against it."""
  copy = tmp_path / "artifact" / art.dir.name
  shutil.copytree(art.dir, copy)
  return copy


def test_a_static_program_links_with_pkg_config_and_runs_with_the_artifact_gone(mnist, tmp_path):
  art, want = mnist
  copy = _moved_away(art, tmp_path)
  (tmp_path / "app.c").write_text(APP_C)
  env = {**os.environ, "PKG_CONFIG_PATH": str(copy)}
  flags = _run(["pkg-config", "--static", "--cflags", "--libs", "mnist"], tmp_path, env).split()
  assert {"-lm", "-ldl", "-pthread"} <= set(flags), flags
  # -static: -lmnist is libmnist.a, and the program needs no shared library at all
  _run(["cc", "app.c", "-o", "app", *flags, "-static"], tmp_path)
  shutil.rmtree(copy)
  _check_output(_run([str(tmp_path / "app")], tmp_path), want)


APP_HPP = r"""
#include <cstdio>
#include <vector>
#include "mnist.hpp"
int main() {
  std::vector<float> x(MNIST_INPUT0_SIZE), y;
  for (int i = 0; i < MNIST_INPUT0_SIZE; i++) x[i] = float(i % 7) / 7.0f;
  mnist::Model model;
  try {
    model.set_threads(0);
    return 2;
  } catch (const mnist::Error &e) {
    std::fprintf(stderr, "%d %s\n", e.status(), e.what());
    if (e.status() != AOT_ERR_INVALID_ARGUMENT) return 3;
  }
  try {
    std::vector<float> short_input(3);
    model.run(short_input, y);
    return 4;
  } catch (const std::runtime_error &e) {
    std::fprintf(stderr, "%s\n", e.what());
  }
  mnist::Model moved = std::move(model);
  moved.set_threads(1);
  if (moved.threads() != 1) return 5;
  moved.run(x, y);
  std::printf("%s\n", mnist::Model::version());
  for (float v : y) std::printf("%.9g\n", v);
  return 0;
}
"""


def _cmake_app(tmp_path, language: str, source: str, text: str, packages: dict) -> None:
  """Configure and build tmp_path/build/app from source, linked with the imported targets of packages
  ({name: (config folder, target)})."""
  (tmp_path / source).write_text(text)
  (tmp_path / "CMakeLists.txt").write_text(
    f"cmake_minimum_required(VERSION 3.16)\nproject(app {language})\n"
    + ("set(CMAKE_CXX_STANDARD 17)\nset(CMAKE_CXX_STANDARD_REQUIRED ON)\n" if language == "CXX" else "")
    + "".join(f"find_package({n} CONFIG REQUIRED)\n" for n in packages)
    + f"add_executable(app {source})\n"
    + f"target_link_libraries(app PRIVATE {' '.join(t for _, t in packages.values())})\n"
  )
  dirs = [f"-D{n}_DIR={d}" for n, (d, _) in packages.items()]
  _run(["cmake", "-S", ".", "-B", "build", *dirs], tmp_path)
  _run(["cmake", "--build", "build"], tmp_path)


@pytest.mark.parametrize("language", ["C", "CXX"])
def test_a_cmake_project_links_the_static_target_and_runs_with_the_artifact_gone(mnist, tmp_path, language):
  art, want = mnist
  copy = _moved_away(art, tmp_path)
  source, text = ("app.c", APP_C) if language == "C" else ("app.cpp", APP_HPP)
  _cmake_app(tmp_path, language, source, text, {"mnist": (copy, "mnist::mnist_static")})
  shutil.rmtree(copy)
  p = subprocess.run([str(tmp_path / "build" / "app")], cwd="/", capture_output=True, text=True)
  assert p.returncode == 0, p.stderr
  out = p.stdout.split()
  if language == "CXX":
    # NAME_version(): the aot that compiled the library; the failed set_threads(0) threw with its status
    assert out.pop(0) == aot.__version__
    assert p.stderr.startswith("3 mnist_set_threads: the thread count must be at least 1, got 0 (status 3)"), p.stderr
    assert "tensor 'x' has 3 elements, the model takes 784" in p.stderr
  _check_output(" ".join(out), want)


def test_the_cpp_header_through_the_shared_target(mnist, tmp_path):
  art, want = mnist
  _cmake_app(tmp_path, "CXX", "app.cpp", APP_HPP, {"mnist": (art.dir, "mnist::mnist")})
  out = _run([str(tmp_path / "build" / "app")], "/").split()
  assert out.pop(0) == aot.__version__
  _check_output(" ".join(out), want)


TWO_MODELS = r"""
#include <stdio.h>
#include "mnist.h"
#include "OTHER.h"
int main(void) {
  static float x[MNIST_INPUT0_SIZE], y[MNIST_OUTPUT0_SIZE], a[OTHER_INPUT0_SIZE], b[OTHER_OUTPUT0_SIZE];
  for (int i = 0; i < MNIST_INPUT0_SIZE; i++) x[i] = (float)(i % 7) / 7.0f;
  mnist_model *m;
  OTHER_model *o;
  if (mnist_create(&m) || OTHER_create(&o) || mnist_run(m, x, y) || OTHER_run(o, a, b)) return 1;
  for (int i = 0; i < MNIST_OUTPUT0_SIZE; i++) printf("%.9g\n", y[i]);
  mnist_destroy(m);
  OTHER_destroy(o);
  return 0;
}
"""


@pytest.mark.parametrize("builder", ["gcc", "clang-14", "clang-19"])
def test_two_models_static_archives_link_into_one_program(mnist, tmp_path, monkeypatch, builder):
  """Each archive holds its own copy of the runtime (aot_arena_alloc, the pool, ...): made local to it, or the link
  fails with duplicate symbols. The second model is built by each C compiler, the first by the default one."""
  art, want = mnist
  assert shutil.which(builder), f"{builder} is not installed"
  monkeypatch.setenv("CC", builder)
  other_name = "mnist_" + builder.replace("-", "")
  other = aot.compile_model("models:mnist", out_dir=tmp_path / other_name, name=other_name)
  upper = other_name.upper()
  text = TWO_MODELS.replace("OTHER_INPUT", f"{upper}_INPUT").replace("OTHER_OUTPUT", f"{upper}_OUTPUT")
  (tmp_path / "app.c").write_text(text.replace("OTHER", other_name))
  env = {**os.environ, "PKG_CONFIG_PATH": f"{art.dir}:{other.dir}"}
  flags = _run(["pkg-config", "--static", "--cflags", "--libs", "mnist", other_name], tmp_path, env).split()
  _run([builder, "app.c", "-o", "app", *flags, "-static"], tmp_path)
  _check_output(_run([str(tmp_path / "app")], tmp_path), want)


APP_WEIGHTS_C = (
  APP_C.replace("mnist", "mnistw")
  .replace("MNIST", "MNISTW")
  .replace("int main(void) {", "int main(int argc, char **argv) {")
  .replace("mnistw_create(&m)", "(argc > 1 ? mnistw_create_with_weights(&m, argv[1]) : mnistw_create(&m))")
)


@pytest.fixture(scope="module")
def external(tmp_path_factory):
  """mnist with its weights in mnistw.weights (WEIGHTS_INLINE_MAX lowered: mnist's are 350 KB), and two programs
  linked with its static archive: app (the C library shared), app_static (-static: no dynamic loader at all)."""
  d = tmp_path_factory.mktemp("ext")
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(aot.artifact, "WEIGHTS_INLINE_MAX", 1024)
    art = aot.compile_model("models:mnist", out_dir=d / "mnistw", name="mnistw")
  assert art.manifest["weights_file"] == "mnistw.weights"
  (d / "app.c").write_text(APP_WEIGHTS_C)
  cmd = ["cc", "app.c", f"-I{art.dir}", str(art.static_library_path), "-lm", "-ldl", "-pthread", "-o", "app"]
  _run(cmd, d)
  _run([*cmd[:-1], "app_static", "-static"], d)
  return art, d / "app"


@pytest.mark.parametrize("name", ["app", "app_static"])
def test_a_static_program_finds_the_weights_beside_itself(mnist, external, tmp_path, name):
  art, app = external
  program = app.with_name(name)
  _, want = mnist
  (tmp_path / "bin").mkdir()
  shutil.copy(program, tmp_path / "bin" / "app")
  # run through PATH from elsewhere: its argv[0] is a bare name, so the program's own path must come from the system
  env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}
  p = subprocess.run(["app"], cwd="/", capture_output=True, text=True, env=env)
  assert p.returncode == 1
  assert f"cannot open {tmp_path / 'bin' / 'mnistw.weights'}, the weights of libmnistw.so (looked for" in p.stderr
  shutil.copy(art.dir / "mnistw.weights", tmp_path / "bin")
  _check_output(_run(["app"], "/", env), want)


def test_a_static_program_takes_the_weights_path_it_is_given(mnist, external, tmp_path):
  art, program = external
  _, want = mnist
  weights = tmp_path / "elsewhere.bin"
  shutil.copy(art.dir / "mnistw.weights", weights)
  _check_output(_run([str(program), str(weights)], "/"), want)
  p = subprocess.run([str(program), str(tmp_path / "missing.bin")], capture_output=True, text=True)
  assert p.returncode == 1 and f"cannot open {tmp_path / 'missing.bin'}, the weights of libmnistw.so\n" == p.stderr


def test_the_version_and_abi_are_in_the_header_and_manifest(mnist):
  art, _ = mnist
  header = art.header_path.read_text()
  assert f"#define MNIST_ABI_VERSION {aot.artifact.ABI_VERSION} " in header
  assert "const char *mnist_version(void);" in header
  assert art.manifest["abi_version"] == aot.artifact.ABI_VERSION == 1


APP_MIXED = r"""
#include <cstdio>
#include "mixed.hpp"
int main() {
  mixed::Model m;
  const uint16_t a[6] = {0x3c00, 0, 0xbc00, 0x3c00, 0x8000, 0x4000};  // 1, 0, -1, 1, -0, 2 as half bits
  const int64_t b[4] = {1, 2, 3, -4};
  const float n[2] = {1.5f, -2};
  bool o0[6];
  int64_t o1[4];
  float o2[2];
  m.run(a, 6, b, 4, n, 2, o0, 6, o1, 4, o2, 2);
  for (bool v : o0) std::printf("%d ", v);
  for (int64_t v : o1) std::printf("%lld ", (long long)v);
  for (float v : o2) std::printf("%g ", v);
  return 0;
}
"""


@pytest.mark.parametrize("cxx", ["g++", "clang++-14", "clang++-19"])
def test_the_headers_are_cpp_with_any_tensor_types_and_names(tmp_path, cxx):
  # an input called `new`: a C name, a C++ keyword, which NAME.h and NAME.hpp rename; half, int64 and bool tensors
  def mixed(a, b, new):
    return a > 0, b + 1, new * 2

  ins = [np.array([1, 0, -1, 1, -0.0, 2], np.float16), np.array([1, 2, 3, -4]), np.array([1.5, -2], np.float32)]
  art = aot.compile_model(mixed, ins, out_dir=tmp_path / "mixed", name="mixed")
  assert "const float *new_" in art.header_path.read_text()
  (tmp_path / "app.cpp").write_text(APP_MIXED)
  flags = ["-std=c++17", "-Wall", "-Wextra", "-Wshadow", "-Werror", f"-I{art.dir}"]
  _run([cxx, *flags, "app.cpp", str(art.static_library_path), "-lm", "-ldl", "-pthread", "-o", "app"], tmp_path)
  want = [*(ins[0] > 0).astype(int), *(ins[1] + 1), *(ins[2] * 2)]
  assert [float(v) for v in _run([str(tmp_path / "app")], tmp_path).split()] == [float(v) for v in want]
