"""GPU targets (cuda, hip, metal): every model compiles for each with the c target's kernel list; the CUDA and HIP
kernel source, run on the CPU through the shim (emulate=True; a cooperative block's threads as coroutines meeting at
its barriers), matches the numpy references and onnxruntime; the host glue builds, links into a C program, and fails
cleanly where there is no GPU runtime."""

import ctypes
import functools
import os
import subprocess
import sys

import numpy as np
import pytest
from test_onnx_light import KERNELS as LIGHT_KERNELS
from test_onnx_light import assert_matches_onnxruntime, light_model

import aot
import aot.build
from aot.build import DEFAULT_OFFLOAD_ARCH, check_metal_syntax
from aot.codegen.render import gpu
from aot.codegen.render.gpu import GPU_TARGETS, KERNEL_SOURCE
from aot.compiler import render, resolve
from aot.errors import BuildError
from aot.models import NAMES, get
from aot.scheduler.schedule import schedule
from aot.testing import assert_kernel_count, kernel_count

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@functools.lru_cache(maxsize=None)
def _compiled(name: str, target: str, emulate: bool, out: str):
  return aot.compile_model(f"models:{name}", target=target, emulate=emulate, out_dir=out)


@pytest.fixture(scope="session")
def gpu_model(tmp_path_factory):
  """gpu_model(name, target, emulate=False) -> artifact, compiled once per test process."""
  base = tmp_path_factory.mktemp("gpu_models")
  return lambda name, target, emulate=False: _compiled(name, target, emulate, str(base / f"{name}_{target}_{emulate}"))


def rel_err(got, want) -> float:
  return float(np.max(np.abs(got.astype(np.float64) - want)) / np.max(np.abs(want)))


@pytest.mark.parametrize("target", GPU_TARGETS)
@pytest.mark.parametrize("name", NAMES)
def test_reference_model_builds_for_gpu_target_with_the_c_kernel_list(gpu_model, name, target):
  art = gpu_model(name, target)
  # the same kernel list as the CPU targets: one launch per kernel, in order
  assert_kernel_count(art, get(name).expected_kernels)
  assert art.num_kernels == kernel_count(f"models:{name}")
  assert len(art.manifest["gpu"]["launches"]) == art.num_kernels
  header = art.header_path.read_text()
  assert f"int {art.name}_run_device(" in header
  src = art.dir / "src"
  kernel_source = src / {"cuda": "kernels.cu", "hip": "kernels.hip", "metal": "kernels.metal"}[target]
  functions = {k.function for k in art.kernels}
  assert all(f" {fn}(" in kernel_source.read_text() for fn in functions)
  if target == "metal":
    # not built here: the sources, header and manifest, plus the macOS build recipe
    assert not art.library_path.exists() and (src / "build_macos.sh").exists() and (src / "aot_metal.m").exists()
  else:
    assert art.library_path.exists()
    # the GPU runtime is loaded at create time, never linked
    needed = subprocess.run(["readelf", "-d", str(art.library_path)], capture_output=True, text=True).stdout
    assert "libcuda" not in needed and "amdhip" not in needed


def test_hip_code_object_holds_every_offload_arch(gpu_model, tmp_path):
  bundle = (gpu_model("mnist", "hip").dir / "src" / "kernels.hipfb").read_bytes()
  assert bundle.startswith(b"__CLANG_OFFLOAD_BUNDLE__")
  assert all(f"amdgcn-amd-amdhsa--{a}".encode() in bundle for a in DEFAULT_OFFLOAD_ARCH)
  art = aot.compile_model("models:mlp", target="hip", offload_arch=("gfx942",), out_dir=tmp_path / "mlp")
  bundle = (art.dir / "src" / "kernels.hipfb").read_bytes()
  assert b"amdgcn-amd-amdhsa--gfx942" in bundle and b"gfx1100" not in bundle
  assert art.manifest["gpu"]["offload_arch"] == ["gfx942"]


def test_cuda_image_holds_cubin_and_ptx(gpu_model):
  fatbin = (gpu_model("mnist", "cuda").dir / "src" / "kernels.fatbin").read_bytes()
  assert b"\x7fELF" in fatbin  # the sm_90 cubin
  assert b".target sm_90" in fatbin and b".visible .entry" in fatbin  # the PTX, for GPUs newer than sm_90


@pytest.mark.parametrize("target", ["cuda", "hip"])
@pytest.mark.parametrize("name", NAMES)
def test_emulated_gpu_kernels_match_numpy_reference(gpu_model, name, target):
  # hip's source differs by its table (clang builtins for ids and math, aot_hip_math.h): it is checked too
  art = gpu_model(name, target, emulate=True)
  assert art.num_kernels == get(name).expected_kernels
  run, model = aot.load(art), get(name)
  for seed in (0, 1):
    xs = model.example_inputs(seed)
    got, want = run(*xs), model.reference(*xs)
    assert got.shape == want.shape
    assert rel_err(got, want) <= 1e-4, f"{name}: max relative error {rel_err(got, want):.2e}"


# light models fully built for every GPU target in the tests (all nine build: a few minutes more, so one stands for
# them here; the others render each target's sources, which is where a kernel count could differ)
LIGHT_BUILT = ("squeezenet",)
# light models whose emulated CUDA build runs against onnxruntime: their kernels are of every kind the nine have
# (convs with and without padding and stride, pools, concat, shuffle, LRN, softmax); the emulation runs the GPU
# kernels as scalar loops on the CPU, and the big six took 77 s of the suite for no other kernel
LIGHT_EMULATED = ("inception_v1", "shufflenet", "squeezenet")


@pytest.mark.parametrize("name", sorted(LIGHT_KERNELS))
def test_light_model_on_gpu_targets(name, tmp_path):
  """Emulated CUDA kernels match onnxruntime; every GPU target renders the c target's kernel list (and builds: hip
  and cuda libraries, metal's syntax check)."""
  model = light_model(name)
  if name in LIGHT_EMULATED:
    art = aot.compile_model(model, out_dir=tmp_path / "emulated", name=name, target="cuda", emulate=True)
    assert_kernel_count(art, LIGHT_KERNELS[name])
    assert_matches_onnxruntime(art, model, name)
  if name in LIGHT_BUILT:
    for target in GPU_TARGETS:
      built = aot.compile_model(model, out_dir=tmp_path / target, name=name, target=target)
      assert_kernel_count(built, LIGHT_KERNELS[name])
      assert built.library_path.exists() == (target != "metal")
  else:
    traced = resolve(model, name=name)
    sched = schedule(traced.outputs, traced.inputs, traced.output_names)
    for target in GPU_TARGETS:
      srcs = render(traced.name, sched, target)
      assert len(srcs.kernels) == len(srcs.launches) == LIGHT_KERNELS[name]
      assert all(f" {fn}(" in srcs.files[KERNEL_SOURCE[target]] for fn, _, _ in srcs.launches)


def test_odd_sized_elementwise_maps_to_guarded_blocks(tmp_path, monkeypatch):
  # 7*37*3 = 777 outputs: three full blocks and a partial one whose extra threads the bounds guard stops
  x = np.random.default_rng(0).standard_normal((3, 37, 7)).astype(np.float32)
  y = np.random.default_rng(1).standard_normal((7, 37, 1)).astype(np.float32)
  fn = lambda x, y: (x.permute(2, 1, 0) * y).exp() - y
  art = aot.compile_model(fn, [x, y], target="cuda", emulate=True, out_dir=tmp_path / "odd")
  (launch,) = art.manifest["gpu"]["launches"]
  assert not launch["cooperative"] and launch["block"] == gpu.BLOCK_THREADS
  assert launch["grid"] == -(-777 // gpu.BLOCK_THREADS)
  run = aot.load(art)
  x, y = (np.random.default_rng(seed).standard_normal(a.shape).astype(np.float32) for seed, a in ((2, x), (3, y)))
  want = np.exp(x.transpose(2, 1, 0) * y) - y
  # the threads of each block in each order: one thread per output, no order may change a result
  for order in ("forward", "reverse", "shuffle:1"):
    monkeypatch.setenv("AOT_GPU_SHIM_ORDER", order)
    np.testing.assert_allclose(run(x, y), want, rtol=1e-6, atol=1e-6, err_msg=f"thread order {order}")


@pytest.mark.parametrize("op", ["sum", "max", "mean"])
def test_large_reduction_to_small_output_is_cooperative(op, tmp_path, monkeypatch):
  # 5 outputs, each over 3*2000 elements (two reduce loops, flattened and split across the block), and a scalar
  x = np.random.default_rng(0).standard_normal((5, 3, 2000)).astype(np.float32)
  fn = lambda x: (getattr(x, op)(axis=(1, 2)), getattr(x.exp(), op)())
  assert 3 * 2000 >= gpu.COOP_MIN_REDUCE and 5 <= gpu.COOP_MAX_OUTPUTS
  # compiled for other values than it runs on
  compile_with = np.random.default_rng(1).standard_normal(x.shape).astype(np.float32)
  art = aot.compile_model(fn, [compile_with], target="cuda", emulate=True, out_dir=tmp_path / op)
  launches = art.manifest["gpu"]["launches"]
  assert all(l["cooperative"] and l["block"] == gpu.COOP_THREADS for l in launches)
  assert [l["grid"] for l in launches] == [5, 1]
  source = (art.dir / "src" / "kernels.cu").read_text()
  assert "__shared__" in source and "AOT_BARRIER" in source and "#define AOT_BARRIER __syncthreads()" in source
  run = aot.load(art)
  want = (getattr(np, op)(x, axis=(1, 2)), getattr(np, op)(np.exp(x)))
  # the shim runs the block's threads as coroutines meeting at the barriers, in each order: a barrier the source
  # lacks lets a thread read a partial result another has not written yet in at least one of them. A right kernel
  # gives the same bits in every order
  first = None
  for order in ("forward", "reverse", "shuffle:1", "shuffle:2"):
    monkeypatch.setenv("AOT_GPU_SHIM_ORDER", order)
    got = run(x)
    for g, w in zip(got, want):
      np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, err_msg=f"thread order {order}")
    if first is None:
      first = got
    for g, f in zip(got, first):
      np.testing.assert_array_equal(g, f, err_msg=f"thread order {order} against forward")


@pytest.mark.parametrize("target,library", [("cuda", "libcuda.so.1"), ("hip", "libamdhip64")])
def test_create_without_gpu_runtime_fails_with_status_and_message(gpu_model, target, library):
  art = gpu_model("mnist", target)
  lib = ctypes.CDLL(str(art.library_path))
  lib.mnist_last_error.restype = ctypes.c_char_p
  m = ctypes.c_void_p()
  status = lib.mnist_create(ctypes.byref(m))
  if status == 0:
    # a machine with this GPU: the model runs and matches its reference
    lib.mnist_destroy(m)
    model = get("mnist")
    xs = model.example_inputs(0)
    assert rel_err(aot.load(art)(*xs), model.reference(*xs)) <= 1e-4
    return
  # AOT_ERR_DEVICE, no model, and a message naming the runtime library that is missing (or has no device)
  assert status == 4 and not m.value
  message = lib.mnist_last_error(None).decode()
  assert library in message, message
  with pytest.raises(RuntimeError, match=library.replace(".", r"\.")):
    aot.load(art)


def test_gpu_library_links_into_a_c_program(gpu_model, tmp_path):
  art = gpu_model("mlp", "cuda")
  (tmp_path / "app.c").write_text(f"""#include <stdio.h>
#include "{art.name}.h"
int main(void) {{
  static float x[MLP_INPUT0_SIZE], y[MLP_OUTPUT0_SIZE];
  mlp_model *m = NULL;
  int st = mlp_create(&m);
  if (st != AOT_OK) {{ printf("create %d: %s\\n", st, mlp_last_error(NULL)); return st == AOT_ERR_DEVICE ? 0 : 1; }}
  st = mlp_run(m, x, y);
  mlp_destroy(m);
  printf("run %d\\n", st);
  return st;
}}
""")
  subprocess.run(
    ["cc", "app.c", f"-I{art.dir}", f"-L{art.dir}", f"-l{art.name}", f"-Wl,-rpath,{art.dir}", "-o", "app"],
    cwd=tmp_path,
    check=True,
  )
  out = subprocess.run([str(tmp_path / "app")], capture_output=True, text=True)
  assert out.returncode == 0, out.stdout + out.stderr
  assert out.stdout.startswith(("create 4: ", "run 0"))


def test_metal_syntax_check_rejects_broken_source(gpu_model, tmp_path):
  src = gpu_model("mnist", "metal").dir / "src"
  check_metal_syntax(src)
  (tmp_path / "kernels.metal").write_text(
    (src / "kernels.metal")
    .read_text()
    .replace("threadgroup_barrier", "threadgroup_barier", 1)
    .replace("const int gid", "const int gid = undefined_name; int gid2", 1)
  )
  with pytest.raises(BuildError, match="undefined_name|threadgroup_barier"):
    check_metal_syntax(tmp_path)


def test_missing_gpu_toolchain_is_one_line(monkeypatch, capsys, tmp_path):
  from aot import build, cli

  monkeypatch.setattr(build.shutil, "which", lambda *a, **k: None)
  assert cli.main(["models:mlp", "-o", str(tmp_path / "mlp"), "--target", "cuda", "--no-cache"]) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "nvcc" in err[0]
  assert cli.main(["models:mlp", "-o", str(tmp_path / "v"), "--target", "vulkan"]) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "unknown target 'vulkan'" in err[0] and "cuda, hip, metal" in err[0]
  with pytest.raises(ValueError, match="unknown target 'vulkan'"):
    aot.compile_model("models:mlp", target="vulkan")


def test_emit_source_for_gpu_targets(tmp_path, capsys):
  from aot import cli

  for target, f in (("hip", "kernels.hip"), ("metal", "kernels.metal"), ("cuda", "kernels.cu")):
    assert cli.main(["models:mlp", "-o", str(tmp_path / target), "--target", target, "--emit", "source"]) == 0
    assert (tmp_path / target / "src" / f).exists()


def test_gpu_check_script_fails_cleanly_without_a_gpu():
  sys.path.insert(0, os.path.join(ROOT, "scripts"))
  try:
    import gpu_check
  finally:
    sys.path.pop(0)
  if gpu_check.cuda_device() is None:
    pytest.skip("an NVIDIA GPU is present: the script runs for real (scripts/gpu_check.py)")
  out = subprocess.run(
    [sys.executable, os.path.join(ROOT, "scripts", "gpu_check.py")], capture_output=True, text=True, timeout=60
  )
  assert out.returncode == 1 and out.stderr.startswith("gpu_check: no ") and len(out.stderr.strip().splitlines()) == 1


def test_gpu_check_script_reports_with_the_emulated_kernels(monkeypatch, capsys, tmp_path):
  """The script's comparisons and report, run here with the emulated CUDA build standing in for the GPU."""
  sys.path.insert(0, os.path.join(ROOT, "scripts"))
  try:
    import gpu_check
  finally:
    sys.path.pop(0)
  compile_model = aot.compile_model
  monkeypatch.setattr(gpu_check, "cuda_device", lambda: None)
  monkeypatch.setattr(
    aot,
    "compile_model",
    lambda what, target="c", **kw: compile_model(what, target=target, emulate=target == "cuda", **kw),
  )
  assert gpu_check.main(["--models", "mlp,mnist", "--runs", "2", "--out", str(tmp_path)]) == 0
  lines = capsys.readouterr().out.strip().splitlines()
  assert lines[0].split()[:5] == ["model", "kernels", "rel_err_vs_ref", "rel_err_vs_c", "rel_err_vs_ort"]
  assert [l.split()[0] for l in lines[1:]] == ["mlp", "mnist", "PASS"]


def test_gpu_check_script_fails_on_a_wrong_artifact(monkeypatch, capsys, tmp_path):
  """The script's FAIL: the emulated CUDA build standing in for the GPU, its weights damaged after the build."""
  from conftest import corrupt_weights

  sys.path.insert(0, os.path.join(ROOT, "scripts"))
  try:
    import gpu_check
  finally:
    sys.path.pop(0)
  compile_model = aot.compile_model

  def damaged(what, target="c", **kw):
    art = compile_model(what, target=target, emulate=target == "cuda", **kw)
    if target == "cuda":
      corrupt_weights(art)
    return art

  monkeypatch.setattr(gpu_check, "cuda_device", lambda: None)
  monkeypatch.setattr(aot, "compile_model", damaged)
  assert gpu_check.main(["--models", "mlp", "--runs", "1", "--out", str(tmp_path)]) == 1
  lines = capsys.readouterr().out.strip().splitlines()
  assert lines[1].split()[0] == "mlp" and lines[-1] == f"FAIL: relative error above {gpu_check.MAX_REL_ERR}"


def test_hip_device_math_matches_numpy(tmp_path):
  """HIP kernels are built without ROCm's device libraries: the math the AMDGPU backend lacks comes from
  aot_hip_math.h, built from the functions it has. Its accuracy, checked on the CPU (the same header, compiled for
  the host, where the __builtin functions it builds on are libm's)."""
  import math

  from aot.build import emulator_cxx

  names = ["tanh", "erf", "tan", "sinh", "cosh", "atan", "asin", "acos", "asinh", "acosh", "atanh"]
  (tmp_path / "m.cpp").write_text(
    '#include "aot_hip_math.h"\n'
    + "".join(
      f'extern "C" void t_{n}(const float *x, float *y, int k) '
      f"{{ for (int i = 0; i < k; i++) y[i] = aot_{n}f(x[i]); }}\n"
      for n in names
    )
  )
  subprocess.run(
    [
      emulator_cxx(),
      "-O2",
      "-shared",
      "-fPIC",
      "-Wno-ignored-attributes",
      "-Wno-attributes",
      f"-I{os.path.join(ROOT, 'runtime_c')}",
      "m.cpp",
      "-o",
      "m.so",
    ],
    cwd=tmp_path,
    check=True,
  )
  lib = ctypes.CDLL(str(tmp_path / "m.so"))
  reference = {
    "erf": np.vectorize(math.erf),
    "asin": np.arcsin,
    "acos": np.arccos,
    "atan": np.arctan,
    "asinh": np.arcsinh,
    "acosh": np.arccosh,
    "atanh": np.arctanh,
  }
  domains = {
    "tan": (-1.5, 1.5),
    "asin": (-0.999, 0.999),
    "acos": (-0.999, 0.999),
    "atanh": (-0.99, 0.99),
    "acosh": (1.001, 100.0),
    "erf": (-6.0, 6.0),
  }
  for n in names:
    lo, hi = domains.get(n, (-20.0, 20.0))
    x = np.concatenate(
      [np.linspace(lo, hi, 4001), [1e-6, -1e-6, 1e-3, 2e-2, 0.3]] if lo < 0 else [np.linspace(lo, hi, 4001)]
    ).astype(np.float32)
    y = np.empty_like(x)
    getattr(lib, f"t_{n}")(x.ctypes.data_as(ctypes.c_void_p), y.ctypes.data_as(ctypes.c_void_p), len(x))
    want = (reference[n] if n in reference else getattr(np, n))(x.astype(np.float64))
    rel = np.max(np.abs(y - want) / np.maximum(np.abs(want), 1e-30))
    assert rel <= 1e-5, f"aot_{n}f: max relative error {rel:.2e}"


def test_half_and_integer_kernels_build_and_match_the_c_target(tmp_path):
  # CUDA spells half __half (nvcc cannot generate code for _Float16), Metal half; integers keep their widths
  for dt in (np.float16, np.int64, np.int8):
    x = (np.arange(1, 13).reshape(3, 4) % 5).astype(dt)
    fn = lambda x: ((x * 3 - 1).max(axis=1), (x + x).sum(axis=0))
    for target in GPU_TARGETS:
      aot.compile_model(fn, [x], target=target, out_dir=tmp_path / f"{dt.__name__}_{target}")
    got = aot.load(aot.compile_model(fn, [x], target="cuda", emulate=True, out_dir=tmp_path / "emulated"))(x)
    want = aot.load(aot.compile_model(fn, [x], target="c", out_dir=tmp_path / "c"))(x)
    for g, w in zip(got, want):
      np.testing.assert_array_equal(g, w)


def test_float64_math_the_gpu_target_lacks_is_a_clear_error(tmp_path):
  x = np.linspace(0, 1, 12, dtype=np.float64)
  with pytest.raises(aot.CompileError, match="target hip: float64 exp"):
    aot.compile_model(lambda x: x.exp(), [x], target="hip", out_dir=tmp_path / "hip")
  with pytest.raises(aot.CompileError, match="Metal has no float64"):
    aot.compile_model(lambda x: x + 1, [x], target="metal", out_dir=tmp_path / "metal")


@pytest.mark.parametrize(
  "target,define,library",
  [
    ("cuda", '-DCUDA_LIBRARY="libcuda.so.404"', "libcuda.so.404"),
    ("hip", '-DAOT_HIP_LIBRARIES="libamdhip64.so.404"', "libamdhip64.so.404"),
  ],
)
def test_gpu_glue_without_its_runtime_library_fails_with_its_name(gpu_model, tmp_path, target, define, library):
  """The missing-library path of the host glue, whatever this machine has installed: the glue built to look for a
  library that does not exist."""
  src = gpu_model("mlp", target).dir / "src"
  (tmp_path / "main.c").write_text("""#include <stdio.h>
#include "aot_gpu.h"
int main(void) {
  char error[AOT_ERROR_CAPACITY] = "";
  aot_gpu *g = (aot_gpu *)1;
  int st = aot_gpu_open(&g, "", 0, error);
  printf("%d %d %s\\n", st, g == NULL, error);
  return 0;
}
""")
  include = {"cuda": f"-I{aot.build.cuda_include()}", "hip": f"-I{aot.build.hip_include()}"}[target]
  subprocess.run(
    [
      "cc",
      define,
      include,
      f"-I{src}",
      "main.c",
      str(src / f"aot_{target}.c"),
      str(src / "aot_runtime.c"),
      "-ldl",
      "-o",
      "main",
    ],
    cwd=tmp_path,
    check=True,
  )
  out = subprocess.run([str(tmp_path / "main")], capture_output=True, text=True, check=True).stdout
  assert out.startswith("4 1 cannot load the ") and library in out, out
