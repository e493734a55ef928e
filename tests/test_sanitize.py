"""The artifact's C (runtime and kernels) built with AddressSanitizer and UBSan (compile_model(sanitize=True), or
AOT_SANITIZE=1), run from a C program built with the same sanitizers, on 1 and 2 threads, its inputs and outputs in
buffers of exactly their size: any out-of-bounds access, use after free, leak or undefined behaviour halts it with a
report, and the outputs must still match the reference."""

import os
import subprocess

import numpy as np
import onnxruntime as ort
import pytest
from test_onnx_light import light_model

import aot
from aot.artifact import api_type
from aot.build import SANITIZE_FLAGS, cc
from aot.models import get

SANITIZER_ENV = {
  "ASAN_OPTIONS": "halt_on_error=1:abort_on_error=0:detect_leaks=1",
  "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
}


def driver_source(art, flaw: str | None = None, sizes: dict | None = None) -> str:
  """A C program: argv[1] is how many runs, argv[2..] the inputs' files then the outputs' files; each tensor lives in
  a malloc'd buffer of its size, so the sanitizer sees any access past its end. flaw: "short" makes the last
  output's buffer one byte short, "leak" skips destroy (to show the sanitizers catch both). sizes: an artifact with
  ranged dims runs at these (NAME_run_dims, each tensor's shape after it; its buffers that size)."""
  n = art.name
  nbytes = lambda t: t.dtype.itemsize * int(np.prod(t.shape))
  ins, outs = art.at_size(sizes)
  tensors = [("in", i, t) for i, t in enumerate(ins)] + [("out", i, t) for i, t in enumerate(outs)]
  short = {len(tensors) - 1} if flaw == "short" else set()
  decls = "\n".join(
    f"  {api_type(t.dtype)} *{k}{i} = malloc({max(nbytes(t) - (j in short), 1)});"
    for j, (k, i, t) in enumerate(tensors)
  )
  reads = "\n".join(
    f"  if (!io(argv[{j + 2}], in{i}, {nbytes(t)}, 0)) return 10;"
    for j, (_, i, t) in enumerate(tensors[: len(art.inputs)])
  )
  writes = "\n".join(
    f"  if (!io(argv[{len(art.inputs) + j + 2}], out{i}, {nbytes(t)}, 1)) return 14;"
    for j, (_, i, t) in enumerate(tensors[len(art.inputs) :])
  )
  args = ", ".join(f"{k}{i}" for k, i, _ in tensors)
  run = f"{n}_run(m, {args})"
  if art.dims:
    decls += "".join(f"\n  int64_t s{k}{i}[] = {{{', '.join(map(str, t.shape)) or '0'}}};" for k, i, t in tensors)
    run = f"{n}_run_dims(m, {', '.join(f'{k}{i}, s{k}{i}' for k, i, _ in tensors)})"
  frees = " ".join(f"free({k}{i});" for k, i, _ in tensors)
  return f"""#include <stdio.h>
#include <stdlib.h>
#include "{n}.h"
static int io(const char *path, void *p, size_t n, int write) {{
  FILE *f = fopen(path, write ? "wb" : "rb");
  if (!f) return 0;
  size_t done = write ? fwrite(p, 1, n, f) : fread(p, 1, n, f);
  fclose(f);
  return done == n;
}}
int main(int argc, char **argv) {{
  (void)argc;
{decls}
{reads}
  {n}_model *m = NULL;
  if ({n}_create(&m) != AOT_OK) return 11;
  for (int it = 0; it < atoi(argv[1]); it++)
    if ({run} != AOT_OK) {{ fprintf(stderr, "run: %s\\n", {n}_last_error(m)); return 12; }}
{writes}
  {"" if flaw == "leak" else f"{n}_destroy(m);"}
  {frees}
  return 0;
}}
"""


def run_sanitized(
  art, xs: list[np.ndarray], tmp_path, flaw: str | None = None, sizes: dict | None = None
) -> list[np.ndarray]:
  """Outputs of the artifact on xs, from the sanitized driver: twice on 1 thread (the second run finds the arena as
  the first left it), once on 2 threads, which must agree bitwise. sizes: a ranged artifact's (driver_source)."""
  (tmp_path / "driver.c").write_text(driver_source(art, flaw, sizes))
  prog = tmp_path / "driver"
  link = [f"-I{art.dir}", f"-L{art.dir}", f"-l{art.name}", f"-Wl,-rpath,{art.dir}"]
  p = subprocess.run(
    [cc(), "-O1", *SANITIZE_FLAGS, "-std=c11", str(tmp_path / "driver.c"), "-o", str(prog), *link, "-lpthread"],
    capture_output=True,
    text=True,
  )
  assert p.returncode == 0, p.stderr
  ins = [tmp_path / f"in{i}.bin" for i in range(len(xs))]
  for f, x in zip(ins, xs):
    f.write_bytes(np.ascontiguousarray(x).tobytes())
  results = []
  for threads, runs in ((1, 2), (2, 1)):
    outs = [tmp_path / f"out{i}_{threads}.bin" for i in range(len(art.outputs))]
    env = {**os.environ, **SANITIZER_ENV, "AOT_NUM_THREADS": str(threads)}
    p = subprocess.run([str(prog), str(runs), *map(str, ins), *map(str, outs)], capture_output=True, text=True, env=env)
    assert p.returncode == 0 and "Sanitizer" not in p.stderr and "runtime error" not in p.stderr, (
      f"{art.name} on {threads} threads (exit {p.returncode}):\n{p.stderr[-3000:]}"
    )
    results.append([np.fromfile(f, dtype=t.dtype.np).reshape(t.shape) for f, t in zip(outs, art.at_size(sizes)[1])])
  for a, b in zip(*results):
    np.testing.assert_array_equal(a, b)
  return results[0]


@pytest.mark.parametrize("name", ["mlp", "mnist", "resnet18", "transformer"])
def test_reference_model_under_sanitizers(name, tmp_path):
  art = aot.compile_model(f"models:{name}", out_dir=tmp_path / name, sanitize=True)
  ref = get(name)
  xs = ref.example_inputs(3)
  got = run_sanitized(art, xs, tmp_path)
  np.testing.assert_allclose(got[0], ref.reference(*xs), rtol=1e-4, atol=1e-4)


# the cheapest two to run unvectorised under the sanitizers (inception_v1 took 100 s, shufflenet 23 s): bvlc_alexnet's
# 240 MB of weights are the external NAME.weights file, mmapped at create time
@pytest.mark.parametrize("name", ["squeezenet", "bvlc_alexnet"])
def test_light_model_under_sanitizers(name, tmp_path):
  model = light_model(name)
  art = aot.compile_model(model, out_dir=tmp_path / name, name=name, sanitize=True)
  x = np.random.default_rng(1).standard_normal(art.inputs[0].shape).astype(np.float32)
  want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
    None, {art.inputs[0].name: x}
  )[0]
  got = run_sanitized(art, [x], tmp_path)[0]
  assert np.max(np.abs(got - want)) / np.max(np.abs(want)) <= 1e-4


def test_an_arena_b_read_past_its_last_column_stays_in_the_arena(tmp_path):
  # the microkernel reads an arena B's last tile whole, past the buffer's last k (test_contract.py): the arena's
  # slack (AOT_ARENA_SLACK) holds those reads, where AddressSanitizer would report a read past the allocation
  from test_contract import W_EDGE, arena_b_product

  x = np.random.default_rng(2).standard_normal((64, 49)).astype(np.float32)
  art = aot.compile_model(arena_b_product, [x], out_dir=tmp_path / "art", sanitize=True)
  (got,) = run_sanitized(art, [x], tmp_path)
  want = np.maximum(W_EDGE.astype(np.float64) @ (1 / (1 + np.exp(-x.astype(np.float64)))), 0)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_sanitize_comes_from_the_environment_and_is_cached_apart(tmp_path, monkeypatch):
  plain = aot.compile_model("models:mlp", out_dir=tmp_path / "plain")
  monkeypatch.setenv("AOT_SANITIZE", "1")
  sanitized = aot.compile_model("models:mlp", out_dir=tmp_path / "sanitized")
  # a cache entry shared with the plain build would give back its library, without the sanitizers' calls
  assert b"__asan_" in sanitized.library_path.read_bytes() and b"__asan_" not in plain.library_path.read_bytes()
  run_sanitized(sanitized, get("mlp").example_inputs(0), tmp_path)


# the leak report's last line: its first scrolls out of the message once the leaked allocations are many
@pytest.mark.parametrize("flaw, report", [("short", "heap-buffer-overflow"), ("leak", r"byte\(s\) leaked in")])
def test_the_sanitizers_do_report(flaw, report, tmp_path):
  # the check above is only worth something if a flaw fails it: an output buffer one byte short, an unfreed model
  art = aot.compile_model("models:mlp", out_dir=tmp_path / "mlp", sanitize=True)
  with pytest.raises(AssertionError, match=report):
    run_sanitized(art, get("mlp").example_inputs(0), tmp_path, flaw)
