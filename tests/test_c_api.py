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


SHARED = r"""
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "mnist.h"
#define CALLERS 4
#define INPUTS 8
#define CALLS 300
static float in[INPUTS][MNIST_INPUT0_SIZE], want[INPUTS][MNIST_OUTPUT0_SIZE];
static mnist_model *shared;
typedef struct { int first, wrong, status, lost_message; } caller;
static void *work(void *p) {
  caller *c = p;
  float out[MNIST_OUTPUT0_SIZE];
  for (int it = 0; it < CALLS; it++) {
    int k = (c->first + it) % INPUTS;
    /* caller 0 also makes failing calls: the message it reads is its own call's, whatever the others ran since */
    if (c->first == 0 && it % 4 == 0) {
      if (mnist_run(shared, in[k], NULL) != AOT_ERR_NULL_ARGUMENT) { c->status = 100; return NULL; }
      if (!strstr(mnist_last_error(shared), "output 0")) c->lost_message++;
      continue;
    }
    int st = mnist_run(shared, in[k], out);
    if (st != AOT_OK) { c->status = st; return NULL; }
    if (memcmp(out, want[k], sizeof out) != 0) c->wrong++;
  }
  return NULL;
}
int main(int argc, char **argv) {
  for (int k = 0; k < INPUTS; k++)
    for (int i = 0; i < MNIST_INPUT0_SIZE; i++) in[k][i] = (float)(((i + 1) * (7 * k + 3)) % 17) / 17.0f;
  if (mnist_create(&shared) != AOT_OK || mnist_set_threads(shared, atoi(argv[1])) != AOT_OK) return 1;
  /* the answers of one call at a time */
  for (int k = 0; k < INPUTS; k++)
    if (mnist_run(shared, in[k], want[k]) != AOT_OK) return 2;
  if (memcmp(want[0], want[1], sizeof want[0]) == 0) return 3;
  pthread_t t[CALLERS];
  caller c[CALLERS];
  memset(c, 0, sizeof c);
  for (int i = 0; i < CALLERS; i++) {
    c[i].first = i;
    pthread_create(&t[i], NULL, work, &c[i]);
  }
  int wrong = 0, lost = 0;
  for (int i = 0; i < CALLERS; i++) {
    pthread_join(t[i], NULL);
    if (c[i].status) return 4;
    wrong += c[i].wrong;
    lost += c[i].lost_message;
  }
  mnist_destroy(shared);
  printf("%d wrong of %d, %d messages lost\n", wrong, CALLERS * CALLS, lost);
  return wrong || lost ? 5 : 0;
}
"""


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("target", TARGETS)
def test_one_instance_shared_by_threads(tmp_path, split_every_kernel, target, threads):
  # four threads calling one instance at once get, bitwise, the answers of one call at a time (each call's kernels on
  # the instance's pool of 1 or 2 threads): the calls take turns. Without that, they share the arena's intermediate
  # buffers (some answers wrong with AOT_OK) and its pool (which hangs). mnist compiled to split every kernel, so
  # that the pool is used
  art = aot.compile_model("models:mnist", out_dir=tmp_path / "mnist", target=target)
  try:
    p = subprocess.run([build_c(tmp_path, SHARED, art), str(threads)], capture_output=True, text=True, timeout=120)
  except subprocess.TimeoutExpired:
    pytest.fail("four threads calling one instance did not finish in 120 s (a pool entered from several threads)")
  assert p.returncode == 0, f"exit {p.returncode}: {p.stdout} {p.stderr}"


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
  api = [
    "mnist_create",
    "mnist_destroy",
    "mnist_last_error",
    "mnist_run",
    "mnist_set_executor",
    "mnist_set_threads",
    "mnist_threads",
    "mnist_version",
  ]
  assert exported == api
  # the static archive's global symbols are the same: the runtime's are local to it, or two models' would clash
  archive = subprocess.run(
    ["nm", "--defined-only", "--extern-only", str(art.static_library_path)], capture_output=True, text=True, check=True
  ).stdout
  assert sorted(line.split()[-1] for line in archive.splitlines() if line.count(" ") == 2) == api


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


def test_tensors_named_as_generated_code_names_its_own(tmp_path):
  # model.c's run declares names of its own beside the tensors' (a call's pointer array a, gemm g, steps s,
  # depthwise d, ...): tensors called so are renamed as C parameters (aot/artifact.py GENERATED_NAMES), where an
  # output called "a" crashed the run (`void *a[] = {(float *)a, ...}` read the array being declared). Each kind of
  # call is here: a depthwise convolution with a generated epilogue, a gemm with fused steps, loops on the pool
  import onnxruntime
  from onnx import TensorProto, helper, numpy_helper

  from aot.artifact import GENERATED_NAMES

  rng = np.random.default_rng(3)
  const = lambda name, *shape: numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
  f32 = lambda name, shape: helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)
  names = sorted(GENERATED_NAMES)
  nodes = [
    helper.make_node("Conv", ["a", "w", "bias"], ["conv"], group=64, kernel_shape=[5, 5], pads=[2] * 4),
    helper.make_node("HardSwish", ["conv"], [names[0]]),
    helper.make_node("Gemm", ["d", "wg", "bg"], ["mm"]),
    helper.make_node("Relu", ["mm"], [names[1]]),
  ] + [helper.make_node("Sigmoid", ["g"], [n]) for n in names[2:] if n not in ("a", "d", "g")]
  outs = [names[0], names[1]] + [n for n in names[2:] if n not in ("a", "d", "g")]
  graph = helper.make_graph(
    nodes,
    "names",
    [f32("a", [1, 64, 7, 7]), f32("d", [8, 64]), f32("g", [1, 64, 32, 32])],
    [f32(n, None) for n in outs],
    [const("w", 64, 1, 5, 5), const("bias", 64), const("wg", 64, 48), const("bg", 48)],
  )
  model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
  feeds = {
    n: rng.standard_normal(s).astype(np.float32)
    for n, s in (("a", (1, 64, 7, 7)), ("d", (8, 64)), ("g", (1, 64, 32, 32)))
  }
  want = onnxruntime.InferenceSession(model.SerializeToString()).run(None, feeds)
  m = aot.load(aot.compile_model(model, out_dir=tmp_path, name="names"), threads=2)
  try:
    for got, ref in zip(m(**feeds), want):
      np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
  finally:
    m.close()
