"""Each instruction-set path of the int8 microkernel (runtime_c/aot_qmicro.h's micro) against an independent numpy
computation, bit for bit: x86's AVX2 and AVX-VNNI paths and the portable one on this machine, aarch64's NEON, sdot and
usdot paths cross-built and run under qemu-aarch64. Each build is checked to hold its path's instructions, so a
change of the preprocessor tests that sent a build to another path fails here too."""

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from aot.build import cc, cflags
from aot.codegen.lower.quant import pack_weights

RUNTIME = Path(__file__).resolve().parent.parent / "runtime_c"
TRIPLE = "aarch64-linux-gnu"

# a C program: the cases of argv[1] through the kernel on one thread, the results to argv[2]. A case is a header of
# 9 int32 (M, N, K, a_signed, a_zero, out_type, out_zero, number of scales, a_kmajor), then A's M*K bytes, packed B,
# col_sum and bias (N int32 each), the scales (float)
DRIVER = r"""
#include <stdio.h>
#include <stdlib.h>
#include "aot_runtime.h"

static void *read_n(FILE *f, size_t n) {
  void *p = malloc(n ? n : 1);
  if (n && fread(p, n, 1, f) != 1) exit(2);
  return p;
}

int main(int argc, char **argv) {
  if (argc != 3) return 1;
  FILE *in = fopen(argv[1], "rb"), *out = fopen(argv[2], "wb");
  int h[9];
  while (fread(h, sizeof h, 1, in) == 1) {
    const int M = h[0], N = h[1], K = h[2], K4 = (K + 3) / 4 * 4, NP = (N + QNR - 1) / QNR * QNR;
    const size_t elem = h[5] == AOT_QGEMM_INT32 ? 4 : 1;
    void *a = read_n(in, (size_t)M * K), *b = read_n(in, (size_t)NP * K4);
    int32_t *col_sum = read_n(in, 4 * (size_t)N), *bias = read_n(in, 4 * (size_t)N);
    float *scale = read_n(in, 4 * (size_t)h[7]);
    void *c = calloc((size_t)M * N, elem);
    aot_qgemm g = {.M = M, .N = N, .K = K, .a = a, .lda = h[8] ? M : K, .a_signed = h[3], .a_zero = h[4], .b = b,
                   .col_sum = col_sum, .bias = bias, .scale = h[7] ? scale : NULL, .scale_step = h[7] > 1,
                   .out_type = h[5], .out_zero = h[6], .c = c, .ldc_m = N, .ldc_n = 1, .a_kmajor = h[8]};
    aot_qgemm_run(&g, 0, aot_qgemm_tasks(&g));
    fwrite(c, elem, (size_t)M * N, out);
    free(a), free(b), free(col_sum), free(bias), free(scale), free(c);
  }
  fclose(out);
  return 0;
}
"""

# path: (where it runs, the flags it is built with, an instruction only that path's micro has)
PATHS = {
  "portable": ("x86", ["-march=x86-64"], None),
  "avx2": ("x86", ["-march=x86-64-v3"], "vpmaddwd %ymm"),
  "avx-vnni": ("x86", ["-march=x86-64-v3", "-mavxvnni"], "vpdpbusd %ymm"),
  "neon": ("aarch64", ["-march=armv8-a"], "smlal2"),
  "sdot": ("aarch64", ["-march=armv8.2-a+dotprod"], "sdot"),
  "usdot": ("aarch64", ["-march=armv8.2-a+dotprod+i8mm"], "sudot"),
}


def _cpu_flags() -> set[str]:
  lines = Path("/proc/cpuinfo").read_text().splitlines()
  return {f for line in lines if line.startswith("flags") for f in line.split()}


def _avx_vnni_run(flags: list[str]) -> tuple[list[str], list[str]]:
  """(build flags, command prefix) that run the AVX-VNNI path here: natively where the CPU has AVX-VNNI; where it
  has AVX-512 VNNI and VL instead (Zen 4), natively with the path's dot products in AVX-512VL's encoding (the same
  instruction and sums: AOT_QMICRO_EVEX_DPBUSD, without -mavxvnni), as no qemu emulates AVX-VNNI (10.0's TCG has
  none); else under qemu, which then fails with an illegal instruction rather than pass untested"""
  cpu = _cpu_flags()
  if "avx_vnni" in cpu:
    return flags, []
  if {"avx512_vnni", "avx512vl"} <= cpu:
    return [f for f in flags if f != "-mavxvnni"] + ["-mavx512vnni", "-mavx512vl", "-DAOT_QMICRO_EVEX_DPBUSD"], []
  return flags, ["qemu-x86_64", "-cpu", "max"]


def _build(path: str, d: Path) -> tuple[list[str], Path]:
  """The driver and the runtime's kernel built for one path: (the command prefix that runs it, the program)."""
  where, flags, _ = PATHS[path]
  (d / "driver.c").write_text(DRIVER)
  prog = d / "prog"
  sources = [str(d / "driver.c"), str(RUNTIME / "aot_qgemm.c")]
  if where == "x86":
    # the project's flags for x86-64 with the path's -march (and -mavxvnni) in place of the cpu's
    base = [f for f in cflags("x86-64") if not f.startswith("-march")]
    flags, runner = _avx_vnni_run(flags) if path == "avx-vnni" else (flags, [])
    subprocess.run([cc(), *base, *flags, f"-I{RUNTIME}", *sources, "-o", str(prog), "-lm"], check=True)
  else:
    for tool in (f"{TRIPLE}-gcc", "qemu-aarch64"):
      assert shutil.which(tool), f"{tool} is missing: .ci/run installs gcc-aarch64-linux-gnu and qemu-user"
    base = [f for f in cflags("generic", TRIPLE) if not f.startswith("-mcpu")]
    subprocess.run([f"{TRIPLE}-gcc", *base, *flags, f"-I{RUNTIME}", *sources, "-o", str(prog), "-lm"], check=True)
    # -cpu max has dotprod and i8mm
    runner = ["qemu-aarch64", "-cpu", "max", "-L", f"/usr/{TRIPLE}"]
  return runner, prog


def _kernel_instructions(path: str, prog: Path) -> str:
  """The disassembly of aot_qgemm_run (micro inlined into it) and of micro where it is not."""
  objdump = "objdump" if PATHS[path][0] == "x86" else f"{TRIPLE}-objdump"
  listing = subprocess.run([objdump, "-d", "--no-show-raw-insn", str(prog)], capture_output=True, text=True).stdout
  functions = re.split(r"\n(?=[0-9a-f]+ <)", listing)
  return "\n".join(f for f in functions if re.match(r"[0-9a-f]+ <(aot_qgemm_run|micro)[.>]", f))


# (M, N, K, A's dtype, a_kmajor, out dtype): tails of every kind: M past QMR (8) and QMC (64), N past QNR (32) and
# QNC (128), K past a group of 4 and the k slice QKC (512, so the microkernel accumulates over calls)
CASES = [
  (1, 1, 1, np.uint8, 0, np.int32),
  (7, 33, 5, np.int8, 0, np.int32),
  (9, 31, 1030, np.uint8, 0, np.int32),
  (65, 129, 515, np.int8, 0, np.int32),
  (13, 70, 301, np.uint8, 1, np.int32),
  (37, 45, 77, np.uint8, 0, np.uint8),
  (20, 40, 518, np.int8, 1, np.int8),
]


def _cases():
  """[(header, arrays, wanted result)] of CASES, seeded; the wanted result from numpy in int64."""
  rng = np.random.default_rng(14)
  out = []
  for M, N, K, a_dtype, kmajor, out_dtype in CASES:
    info = np.iinfo(a_dtype)
    a = rng.integers(info.min, info.max + 1, (M, K)).astype(a_dtype)
    w = rng.integers(-128, 128, (K, N)).astype(np.int8)
    # the extremes: 255 * -128 summed in pairs is where a u8 x s8 pairwise int16 add saturates, 0 (-128 to sdot) *
    # -128 the largest signed product
    a[0, :] = info.max
    if M > 1:
      a[1, :] = info.min
    w[:, 0] = -128
    if N > 1:
      w[:, 1] = 127
    zero = int(rng.integers(info.min, info.max + 1))
    bias = rng.integers(-1000, 1000, N).astype(np.int32)
    if out_dtype == np.uint8:
      # small sums on columns 2 and 3, whose scale 0.5 puts the odd ones halfway between integers: round to even
      w[:, 2:4] = 0
      w[:2, 2:4] = rng.integers(-1, 2, (2, 2))
      bias[2:4] = rng.integers(-9, 10, 2)
    acc = (a.astype(np.int64) - zero) @ w.astype(np.int64) + bias
    assert np.abs(acc).max() < 2**31
    want, scale, out_zero = acc.astype(np.int32), np.zeros(0, np.float32), 0
    if out_dtype != np.int32:
      # per column for uint8, one for all for int8: a typical sum to about 60, so that some saturate
      scale = (rng.uniform(0.5, 2.0, N if out_dtype == np.uint8 else 1) * 60 / np.median(np.abs(acc))).astype(
        np.float32
      )
      out_zero = 131 if out_dtype == np.uint8 else -5
      if out_dtype == np.uint8:
        scale[2:4] = 0.5
        assert np.sum(acc[:, 2:4] % 2 == 1) > 5
      o = np.iinfo(out_dtype)
      want = np.clip(np.rint(acc.astype(np.float32) * scale) + out_zero, o.min, o.max).astype(out_dtype)
      # both ends saturate, and values lie between
      assert 0.05 < np.mean((want == o.min) | (want == o.max)) < 0.9
    packed, col_sum = pack_weights(w)
    header = np.array([M, N, K, a_dtype == np.int8, zero, {np.int32: 0, np.uint8: 1, np.int8: 2}[out_dtype]], np.int32)
    header = np.concatenate([header, np.array([out_zero, scale.size, kmajor], np.int32)])
    a_laid = np.ascontiguousarray(a.T if kmajor else a)
    out.append((header, [a_laid, packed, col_sum, bias, scale], want))
  return out


@pytest.mark.parametrize("path", list(PATHS))
def test_micro_path_equals_numpy(path, tmp_path):
  runner, prog = _build(path, tmp_path)
  listing = _kernel_instructions(path, prog)
  assert "aot_qgemm_run" in listing
  signature = PATHS[path][2]
  if signature:
    assert signature in listing, f"the {path} build does not hold its path's {signature}"
  else:
    # the portable build has none of the AVX2 paths' multiplies
    assert not any(s in listing for s in ("vpmaddwd %ymm", "vpdpbusd")), listing
  cases = _cases()
  (tmp_path / "in.bin").write_bytes(b"".join(h.tobytes() + b"".join(x.tobytes() for x in xs) for h, xs, _ in cases))
  run = subprocess.run(
    [*runner, str(prog), str(tmp_path / "in.bin"), str(tmp_path / "out.bin")], capture_output=True, timeout=300
  )
  assert run.returncode == 0, run.stderr.decode()
  data, at = (tmp_path / "out.bin").read_bytes(), 0
  for (M, N, K, _, kmajor, out_dtype), (_, _, want) in zip(CASES, cases):
    n = want.size * np.dtype(out_dtype).itemsize
    got = np.frombuffer(data[at : at + n], out_dtype).reshape(want.shape)
    at += n
    np.testing.assert_array_equal(got, want, err_msg=f"{path}: M={M} N={N} K={K} kmajor={kmajor} {out_dtype}")
  assert at == len(data)


@pytest.mark.parametrize("kind,per_channel,activations", [("conv", True, "u8"), ("wide conv", False, "s8")])
def test_qdq_conv_on_the_avx2_path_equals_onnxruntime(kind, per_channel, activations, tmp_path):
  """A whole model built for an x86-64 without AVX-512 runs its convolution on the AVX2 microkernel, exactly."""
  from conftest import ort_session
  from test_int8 import _qdq_model

  import aot

  model = _qdq_model(kind, per_channel, activations, tmp_path)
  art = aot.compile_model(model, out_dir=tmp_path / "art", cpu="x86-64-v3")
  assert "aot_qgemm_run" in (art.dir / "src" / "model.c").read_text()
  listing = subprocess.run(["objdump", "-d", str(art.library_path)], capture_output=True, text=True).stdout
  assert "vpmaddwd" in listing and "vpdpbusd" not in listing
  sess = ort_session(model)
  name, shape = sess.get_inputs()[0].name, sess.get_inputs()[0].shape
  dt = np.uint8 if activations == "u8" else np.int8
  x = np.random.default_rng(8).integers(np.iinfo(dt).min, np.iinfo(dt).max + 1, shape).astype(dt)
  want = sess.run(None, {name: x})[0]
  np.testing.assert_array_equal(aot.load(art)(x), want)
