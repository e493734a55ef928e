"""The artifact from C: real programs compiled with cc and linked against libNAME.so."""

import subprocess

import numpy as np
import pytest
from conftest import TARGETS

import aot


def build_c(tmp_path, source: str, *arts) -> str:
  (tmp_path / "prog.c").write_text(source)
  cmd = ["cc", "-O1", "-Wall", "-Werror", "-std=c11", str(tmp_path / "prog.c"), "-o", str(tmp_path / "prog")]
  for a in arts:
    cmd += [f"-I{a.dir}", f"-L{a.dir}", f"-l{a.name}", f"-Wl,-rpath,{a.dir}"]
  subprocess.run(cmd + ["-lpthread"], check=True, capture_output=True, text=True)
  return str(tmp_path / "prog")


RUN_MNIST = r"""
#include <stdio.h>
#include "mnist.h"
static float in[MNIST_INPUT0_SIZE], out[MNIST_OUTPUT0_SIZE];
int main(int argc, char **argv) {
  FILE *f = fopen(argv[1], "rb");
  if (!f || fread(in, sizeof(float), MNIST_INPUT0_SIZE, f) != MNIST_INPUT0_SIZE) return 10;
  fclose(f);
  mnist_model *m = NULL;
  int st = mnist_create(&m);
  if (st != AOT_OK) { fprintf(stderr, "create: %d\n", st); return 11; }
  st = mnist_run(m, in, out);
  if (st != AOT_OK) { fprintf(stderr, "run: %s\n", mnist_last_error(m)); return 12; }
  for (int i = 0; i < MNIST_OUTPUT0_SIZE; i++) printf("%.9g\n", out[i]);
  mnist_destroy(m);
  return 0;
}
"""


@pytest.mark.parametrize("target", TARGETS)
def test_c_program_runs_mnist(tmp_path, compiled_model, target):
  art, model = compiled_model("mnist", target)
  x = model.example_inputs(3)[0]
  (tmp_path / "x.bin").write_bytes(x.tobytes())
  out = subprocess.run(
    [build_c(tmp_path, RUN_MNIST, art), str(tmp_path / "x.bin")], capture_output=True, text=True, check=True
  )
  got = np.array([float(v) for v in out.stdout.split()], dtype=np.float32).reshape(model.reference(x).shape)
  np.testing.assert_allclose(got, model.reference(x), rtol=1e-4, atol=1e-4)


ERRORS = r"""
#include <stdio.h>
#include <string.h>
#include "mnist.h"
static float in[MNIST_INPUT0_SIZE], out[MNIST_OUTPUT0_SIZE];
int main(void) {
  mnist_model *m = NULL;
  if (mnist_create(NULL) != AOT_ERR_NULL_ARGUMENT) return 1;
  if (mnist_create(&m) != AOT_OK) return 2;
  if (mnist_run(NULL, in, out) != AOT_ERR_NULL_ARGUMENT) return 3;
  if (mnist_run(m, NULL, out) != AOT_ERR_NULL_ARGUMENT) return 4;
  printf("%s\n", mnist_last_error(m));
  if (mnist_run(m, in, NULL) != AOT_ERR_NULL_ARGUMENT) return 5;
  printf("%s\n", mnist_last_error(m));
  if (mnist_set_threads(m, 0) != AOT_ERR_INVALID_ARGUMENT) return 7;
  if (mnist_set_threads(NULL, 2) != AOT_ERR_NULL_ARGUMENT) return 7;
  if (mnist_set_threads(m, 2) != AOT_OK) return 8;
  if (mnist_run(m, in, out) != AOT_OK) return 6;
  printf("%s\n", mnist_last_error(m));
  printf("%s\n", mnist_last_error(NULL));
  mnist_destroy(NULL);
  mnist_destroy(m);
  int shape[] = MNIST_INPUT0_SHAPE;
  printf("%d %d %d %d %d %s\n", MNIST_NUM_INPUTS, shape[0], shape[1], shape[2], shape[3], MNIST_INPUT0_NAME);
  return 0;
}
"""


@pytest.mark.parametrize("target", TARGETS)
def test_null_pointers_are_errors_not_crashes(tmp_path, compiled_model, target):
  art, _ = compiled_model("mnist", target)
  p = subprocess.run([build_c(tmp_path, ERRORS, art)], capture_output=True, text=True)
  assert p.returncode == 0, p.stderr
  lines = p.stdout.splitlines()
  assert "input 0 ('x') is NULL" in lines[0]
  assert "output 0" in lines[1] and "NULL" in lines[1]
  assert lines[2] == "no error"
  assert "NULL" in lines[3]
  assert lines[4] == "1 1 1 28 28 x"


THREADS = r"""
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include "mnist.h"
typedef struct { float in[MNIST_INPUT0_SIZE]; float out[MNIST_OUTPUT0_SIZE]; int threads, status; } job;
static void *work(void *p) {
  job *j = p;
  mnist_model *m;
  if ((j->status = mnist_create(&m)) != AOT_OK) return NULL;
  j->status = mnist_set_threads(m, j->threads);
  for (int it = 0; it < 20 && j->status == AOT_OK; it++) j->status = mnist_run(m, j->in, j->out);
  mnist_destroy(m);
  return NULL;
}
int main(void) {
  /* a and b run at once, each on its own pool (2 and 3 threads); a1 and b1 are their single-threaded answers */
  static job a = {.threads = 2}, b = {.threads = 3}, a1 = {.threads = 1}, b1 = {.threads = 1};
  for (int i = 0; i < MNIST_INPUT0_SIZE; i++) {
    a.in[i] = (float)((i * 37) % 11) / 11.0f;
    b.in[i] = (float)((i * 13) % 7) / 7.0f;
  }
  memcpy(a1.in, a.in, sizeof a.in);
  memcpy(b1.in, b.in, sizeof b.in);
  work(&a1);
  work(&b1);
  pthread_t ta, tb;
  pthread_create(&ta, NULL, work, &a); pthread_create(&tb, NULL, work, &b);
  pthread_join(ta, NULL); pthread_join(tb, NULL);
  if (a.status || b.status || a1.status || b1.status) return 1;
  if (memcmp(a.out, a1.out, sizeof a.out) != 0) return 2;
  if (memcmp(b.out, b1.out, sizeof b.out) != 0) return 4;
  if (memcmp(a.out, b.out, sizeof a.out) == 0) return 3;
  return 0;
}
"""


@pytest.mark.parametrize("target", TARGETS)
def test_two_instances_run_concurrently(tmp_path, split_every_kernel, target):
  # on 2 and 3 threads each, bitwise the single-threaded answers (tests run with AOT_NUM_THREADS=1, which the program
  # inherits: it sets its thread counts itself). mnist is too small to use the pool: compiled to split every kernel
  art = aot.compile_model("models:mnist", out_dir=tmp_path / "mnist", target=target)
  p = subprocess.run([build_c(tmp_path, THREADS, art)], capture_output=True, text=True)
  assert p.returncode == 0, f"exit {p.returncode} {p.stderr}"


TWO_MODELS = r"""
#include <stdio.h>
#include "mnist.h"
#include "mlp.h"
static float a[MNIST_INPUT0_SIZE], ao[MNIST_OUTPUT0_SIZE], b[MLP_INPUT0_SIZE], bo[MLP_OUTPUT0_SIZE];
int main(void) {
  mnist_model *m; mlp_model *n;
  if (mnist_create(&m) || mlp_create(&n)) return 1;
  if (mnist_run(m, a, ao) || mlp_run(n, b, bo)) return 2;
  mnist_destroy(m); mlp_destroy(n);
  printf("%d %d\n", MNIST_NUM_KERNELS, MLP_NUM_KERNELS);
  return 0;
}
"""


@pytest.mark.parametrize("target", TARGETS)
def test_two_models_link_into_one_program(tmp_path, compiled_model, target):
  (mnist, m1), (mlp, m2) = compiled_model("mnist", target), compiled_model("mlp", target)
  p = subprocess.run([build_c(tmp_path, TWO_MODELS, mnist, mlp)], capture_output=True, text=True)
  assert p.returncode == 0, p.stderr
  assert p.stdout.split() == [str(m1.expected_kernels), str(m2.expected_kernels)]


@pytest.mark.parametrize("target", TARGETS)
def test_only_the_api_is_exported(compiled_model, target):
  art, _ = compiled_model("mnist", target)
  syms = subprocess.run(
    ["nm", "-D", "--defined-only", str(art.library_path)], capture_output=True, text=True, check=True
  ).stdout
  exported = sorted(line.split()[-1] for line in syms.splitlines() if " T " in line)
  assert exported == ["mnist_create", "mnist_destroy", "mnist_last_error", "mnist_run", "mnist_set_threads"]


@pytest.mark.parametrize("target", TARGETS)
def test_header_is_valid_cplusplus(tmp_path, compiled_model, target):
  art, _ = compiled_model("mnist", target)
  (tmp_path / "a.cpp").write_text(
    '#include "mnist.h"\n'
    "int main() { mnist_model *m = nullptr; return mnist_create(&m) == AOT_OK ? (mnist_destroy(m), 0) : 1; }\n"
  )
  subprocess.run(
    [
      "c++",
      "-Wall",
      "-Werror",
      str(tmp_path / "a.cpp"),
      f"-I{art.dir}",
      f"-L{art.dir}",
      "-lmnist",
      f"-Wl,-rpath,{art.dir}",
      "-o",
      str(tmp_path / "a"),
    ],
    check=True,
    capture_output=True,
  )
  assert subprocess.run([str(tmp_path / "a")]).returncode == 0
