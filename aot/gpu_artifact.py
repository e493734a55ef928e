"""GPU artifacts (targets cuda, hip, metal): the schedule's kernel list rendered by codegen/gpu.py, the device code built
with the target's compiler and embedded in libNAME.so, and a generated model.c that launches the kernels in order over
a device arena through runtime_c/aot_gpu.h (one implementation per GPU runtime, loaded at create time).

Also the emulated variant (`emulate=True`, cuda or hip): the same kernel source compiled for the CPU with
runtime_c/aot_gpu_shim.h, which runs each kernel's grid as loops, behind the ordinary CPU model.c. It is a normal CPU
library with the usual C API, so the loader and the model tests check the GPU kernels' numbers without a GPU."""
from __future__ import annotations
import hashlib, importlib.resources, json, os, shutil, tempfile, time
from pathlib import Path
from typing import Callable
from aot.artifact import (Artifact, KernelInfo, api_type, param_names, render_header, render_model_c, render_weights_asm,
                          write_manifest, install, make_stage, place_sources, WEIGHTS_INLINE_MAX,
                          _external_weights_c, ExternalWeights, WeightsWriter, weights_checksum)
from aot.build import _cache_dir, _store, cc, run_build_command as _run
from aot.codegen.c import CRenderer
from aot.codegen.gpu import RENDERERS, Launch, plan_launch
from aot.memory import memory_plan, align_up
from aot.ir import release_mapped_pages
from aot.schedule import Schedule, Buffer

GPU_TARGETS = ("cuda", "hip", "metal")
# AMD architectures a hip artifact carries code for: MI200-series (CDNA2) and Radeon RX 7900 (RDNA3)
DEFAULT_OFFLOAD_ARCH = ("gfx90a", "gfx1100")
# NVIDIA: a cubin for Hopper (sm_90) and PTX for compute_90, which newer GPUs' drivers JIT-compile
CUDA_ARCH = "90"
KERNEL_SOURCE = {"cuda": "kernels.cu", "hip": "kernels.hip", "metal": "kernels.metal"}
DEVICE_IMAGE = {"cuda": "kernels.fatbin", "hip": "kernels.hipfb", "metal": "kernels.metal"}
HOST_GLUE = {"cuda": "aot_cuda.c", "hip": "aot_hip.c", "metal": "aot_metal.m"}

from aot.errors import MissingToolError

def _which(names: tuple[str, ...], what: str) -> str:
  for n in names:
    if p := shutil.which(n): return p
  raise MissingToolError(f"{what} not found (looked for {', '.join(names)})")

def clang() -> str:
  return _which((os.environ.get("AOT_CLANG", "clang-19"), "clang-19", "clang"), "clang-19 (Debian: apt-get install clang-19 lld-19)")

def nvcc() -> str:
  return _which(("nvcc", "/usr/local/cuda/bin/nvcc"), "nvcc (the CUDA toolkit)")

def cuda_include() -> str:
  """The folder holding cuda.h: beside nvcc's toolkit, or the usual install places."""
  candidates = [os.environ.get("CUDA_HOME", ""), "/usr/local/cuda", *sorted(Path("/usr/local").glob("cuda-*"), reverse=True)]
  for c in candidates:
    if c and (Path(c) / "include" / "cuda.h").exists(): return str(Path(c) / "include")
  raise MissingToolError("cuda.h not found (set CUDA_HOME to the CUDA toolkit, e.g. /usr/local/cuda-13.0)")

def hip_include() -> str:
  for c in ("/opt/rocm/include", "/usr/include"):
    if (Path(c) / "hip" / "hip_runtime_api.h").exists(): return c
  raise MissingToolError("hip/hip_runtime_api.h not found (Debian: apt-get install libamdhip64-dev)")

def emulator_cxx() -> str:
  """The C++ compiler for emulated kernels: clang (also knows _Float16 in C++), else g++."""
  return _which(("clang++-19", "clang++", "g++", "c++"), "a C++ compiler (clang++-19 or g++)")

def _write_weights(sched: Schedule, weights: WeightsWriter) -> WeightsWriter:
  """The model's constants into the weights file one at a time (a mapped weight's pages released after)."""
  for b in sched.consts:
    weights.add(b)
    release_mapped_pages(b.data)
  weights.close()
  if weights.size > WEIGHTS_INLINE_MAX and weights.path is not None: weights.checksum = weights_checksum(weights.path)
  return weights

def _incbin_asm(symbol: str, path: str) -> str:
  """Links a file into the library as bytes, with an end symbol for its size."""
  lines = [".pushsection .rodata", ".balign 64", f".globl {symbol}", f".hidden {symbol}", f"{symbol}:",
           f'.incbin \\"{path}\\"', f".globl {symbol}_end", f".hidden {symbol}_end", f"{symbol}_end:", ".byte 0",
           ".popsection"]
  return "__asm__(\n" + "\n".join(f'  "{l}\\n"' for l in lines) + "\n);\n"

def render_gpu_model_c(name: str, sched: Schedule, launches: list[tuple[str, list[Buffer], Launch]],
                       functions: list[str], target: str, external_weights: ExternalWeights | None = None) -> str:
  """The C API over the GPU kernel list: create loads the device code and uploads the weights once; run copies the
  inputs in, launches every kernel in order, copies the outputs out; run_device takes device pointers.
  external_weights: NAME.weights when the weights are not linked in (mapped, checked, uploaded, unmapped)."""
  ins, outs = param_names(sched)
  io = sched.inputs + sched.outputs
  args = [f"const {api_type(b.dtype)} *{n}" for b, n in zip(sched.inputs, ins)] + \
         [f"{api_type(b.dtype)} *{n}" for b, n in zip(sched.outputs, outs)]
  slot = {id(b): i for i, b in enumerate(io)}
  def ptr(b: Buffer) -> str:
    if b.kind == "scratch": return f"A + {b.offset}ULL"
    if b.kind == "const": return f"W + {b.offset}ULL"
    return f"io[{slot[id(b)]}]"
  fn_index = {f: i for i, f in enumerate(functions)}
  body = [f"  {{ const aot_devptr a[] = {{{', '.join(ptr(b) for b in bufs)}}};\n"
          f"    if ((st = aot_gpu_launch(m->gpu, m->fn[{fn_index[fn]}], {l.grid}u, {l.block}u, a, {len(bufs)}, m->error)) != AOT_OK) return st; }}"
          for fn, bufs, l in launches]
  checks = [f'  if (!{n}) return aot_fail(m->error, AOT_ERR_NULL_ARGUMENT, "{kind} {i} (\'{b.name}\') is NULL");'
            for kind, bufs, names in (("input", sched.inputs, ins), ("output", sched.outputs, outs))
            for i, (b, n) in enumerate(zip(bufs, names))]
  as_dev = ", ".join(f"(aot_devptr)(uintptr_t){n}" for n in ins + outs)
  up = [f"  if ((st = aot_gpu_upload(m->gpu, m->io[{i}], {n}, {b.nbytes}ULL, m->error)) != AOT_OK) return st;"
        for i, (b, n) in enumerate(zip(sched.inputs, ins))]
  down = [f"  if ((st = aot_gpu_download(m->gpu, {n}, m->io[{len(ins) + i}], {b.nbytes}ULL, m->error)) != AOT_OK) return st;"
          for i, (b, n) in enumerate(zip(sched.outputs, outs))]
  P = name.upper()
  if external_weights:
    weights_decl = _external_weights_c(name, external_weights)
    upload = (f"  const unsigned char *host_weights = NULL;\n"
              f"  if (st == AOT_OK) st = load_weights(create_error, &host_weights);\n"
              f"  if (st == AOT_OK) st = aot_gpu_upload(m->gpu, m->weights, host_weights, {P}_WEIGHTS_BYTES, create_error);\n"
              f"  /* on the device now: the host copy is not needed any more */\n"
              f"  if (host_weights) munmap((void *)host_weights, (size_t){external_weights.nbytes}ULL);")
  else:
    weights_decl = f"extern const unsigned char {name}_weights[];"
    upload = f"  if (st == AOT_OK) st = aot_gpu_upload(m->gpu, m->weights, {name}_weights, {P}_WEIGHTS_BYTES, create_error);"
  return f"""/* {name}: the C API over the GPU kernel list (target {target}), generated by aot-compiler */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdbool.h>
#include <stdlib.h>
#include "aot_runtime.h"
#include "aot_gpu.h"
#include "{name}.h"
#define API __attribute__((visibility("default")))

{weights_decl}
extern const unsigned char {name}_image[], {name}_image_end[];  /* the device code */
static const char *const function_names[{len(functions)}] = {{{', '.join(f'"{f}"' for f in functions)}}};
static const size_t io_bytes[{max(len(io), 1)}] = {{{', '.join(f'{b.nbytes}ULL' for b in io) or '0'}}};

struct {name}_model {{
  aot_gpu *gpu;
  void *fn[{len(functions)}];
  aot_devptr arena, weights, io[{max(len(io), 1)}];  /* device memory: arena, weights, the run's inputs and outputs */
  char error[AOT_ERROR_CAPACITY];
}};

/* why the last {name}_create on this thread failed ({name}_last_error(NULL) returns it: there is no model to ask) */
static _Thread_local char create_error[AOT_ERROR_CAPACITY];

API void {name}_destroy({name}_model *m) {{
  if (!m) return;
  if (m->gpu) {{
    aot_gpu_free(m->gpu, m->arena);
    aot_gpu_free(m->gpu, m->weights);
    for (int i = 0; i < {len(io)}; i++) aot_gpu_free(m->gpu, m->io[i]);
    aot_gpu_close(m->gpu);
  }}
  free(m);
}}

API int {name}_create({name}_model **out) {{
  if (!out) return aot_fail(create_error, AOT_ERR_NULL_ARGUMENT, "{name}_create: out is NULL");
  *out = NULL;
  {name}_model *m = calloc(1, sizeof *m);
  if (!m) return aot_fail(create_error, AOT_ERR_OUT_OF_MEMORY, "out of memory");
  int st = aot_gpu_open(&m->gpu, {name}_image, (size_t)({name}_image_end - {name}_image), create_error);
  for (int i = 0; st == AOT_OK && i < {len(functions)}; i++) st = aot_gpu_function(m->gpu, function_names[i], &m->fn[i], create_error);
  if (st == AOT_OK) st = aot_gpu_alloc(m->gpu, {P}_ARENA_BYTES, &m->arena, create_error);
  if (st == AOT_OK) st = aot_gpu_alloc(m->gpu, {P}_WEIGHTS_BYTES, &m->weights, create_error);
  /* the weights go to the device once, here */
{upload}
  for (int i = 0; st == AOT_OK && i < {len(io)}; i++) st = aot_gpu_alloc(m->gpu, io_bytes[i], &m->io[i], create_error);
  if (st != AOT_OK) {{ {name}_destroy(m); return st; }}
  create_error[0] = 0;
  *out = m;
  return AOT_OK;
}}

static int launch_all({name}_model *m, const aot_devptr *io) {{
  const aot_devptr A = m->arena, W = m->weights;
  int st;
  (void)A; (void)W; (void)io;
{chr(10).join(body)}
  return aot_gpu_sync(m->gpu, m->error);
}}

API int {name}_run_device({name}_model *m, {', '.join(args)}) {{
  if (!m) return AOT_ERR_NULL_ARGUMENT;
{chr(10).join(checks)}
  m->error[0] = 0;
  const aot_devptr io[] = {{{as_dev or '0'}}};
  return launch_all(m, io);
}}

API int {name}_run({name}_model *m, {', '.join(args)}) {{
  if (!m) return AOT_ERR_NULL_ARGUMENT;
{chr(10).join(checks)}
  m->error[0] = 0;
  int st;
{chr(10).join(up)}
  if ((st = launch_all(m, m->io)) != AOT_OK) return st;
{chr(10).join(down)}
  (void)st;
  return AOT_OK;
}}

/* kernels run on the GPU: the host thread count changes nothing (accepted for the common API) */
API int {name}_set_threads({name}_model *m, int n) {{
  if (!m) return AOT_ERR_NULL_ARGUMENT;
  if (n < 1) return aot_fail(m->error, AOT_ERR_INVALID_ARGUMENT, "the thread count must be at least 1, got %d", n);
  return AOT_OK;
}}

API const char *{name}_last_error(const {name}_model *m) {{
  if (!m) return create_error[0] ? create_error : "the model pointer is NULL";
  return m->error[0] ? m->error : "no error";
}}
"""

def _gpu_header(name: str, sched: Schedule, arena: int, num_kernels: int, target: str, weights: int) -> str:
  """The common header plus the GPU entry point (run on device pointers) and the weights size."""
  ins, outs = param_names(sched)
  args = [f"const {api_type(b.dtype)} *{n}" for b, n in zip(sched.inputs, ins)] + \
         [f"{api_type(b.dtype)} *{n}" for b, n in zip(sched.outputs, outs)]
  header = render_header(name, sched, arena, num_kernels, target)
  anchor = f"void {name}_destroy("
  assert anchor in header, "render_header changed: the GPU entry point has no place"
  extra = (f"/* runs the model on device pointers (CUDA/HIP device memory): no copies. After a failed {name}_create,\n"
           f"   {name}_last_error(NULL) says why (no GPU runtime, driver or device) */\n"
           f"int {name}_run_device({name}_model *m, {', '.join(args)});\n")
  header = header.replace(anchor, extra + anchor, 1)
  return header.replace(f"#define {name.upper()}_ARENA_BYTES {arena}\n",
                        f"#define {name.upper()}_ARENA_BYTES {arena}\n#define {name.upper()}_WEIGHTS_BYTES {weights}\n", 1)

def _function_names(name: str, sched: Schedule) -> dict:
  functions: dict = {}
  for k in sched.kernels:
    # kernels that do the same work on different buffers share one function (as on the CPU targets)
    if k.ast not in functions: functions[k.ast] = f"{name}_{k.name.split('_', 1)[0].replace('k', 'f')}"
  return functions

def render_gpu_sources(name: str, sched: Schedule, target: str, emulate: bool = False,
                       weights: WeightsWriter | None = None):
  """Source files of a GPU artifact, its kernel list, arena size, weights (written by `weights`, laid out only when
  None) and launches (grid, block)."""
  if emulate and target not in ("cuda", "hip"):
    raise ValueError("emulate=True runs the CUDA or HIP kernel source on the CPU: target must be cuda or hip")
  if target not in GPU_TARGETS: raise ValueError(f"unknown GPU target {target!r}; available: {', '.join(GPU_TARGETS)}")
  arena = memory_plan(sched.kernels, sched.scratch)
  weights = _write_weights(sched, weights or WeightsWriter(None))
  functions = _function_names(name, sched)
  launch = {ast: plan_launch(ast) for ast in functions}
  renderer = RENDERERS[target]()
  files = {KERNEL_SOURCE[target]: renderer.render_source(functions)}
  infos = [KernelInfo(k.name, functions[k.ast], k.shape) for k in sched.kernels]
  launches = [(functions[k.ast], k.bufs, launch[k.ast]) for k in sched.kernels]
  # weights above WEIGHTS_INLINE_MAX are a file beside the library, as on the CPU targets
  external = ExternalWeights(weights.size, weights.checksum or 0) if weights.size > WEIGHTS_INLINE_MAX else None
  if emulate:
    # one wrapper per function runs blocks [start, end) of its grid (the CPU runtime's pool splits the grid); a
    # cooperative kernel's threads run as coroutines that meet at its barriers (aot_gpu_shim.h)
    wrappers, protos = [], []
    for ast, fn in functions.items():
      params = CRenderer().param_decls(ast)
      call = ", ".join(p.split()[-1] for p in params[:-2])
      wrappers.append(f'extern "C" __attribute__((visibility("hidden"))) void {fn}_blocks('
                      f"{', '.join(p.replace(' *restrict ', ' *') for p in params)}) {{\n"
                      f"  aot_shim_blocks(start, end, {launch[ast].block}u, {str(launch[ast].cooperative).lower()}, "
                      f"[&] {{ {fn}({call}); }});\n}}")
      protos.append(f"void {fn}_blocks({', '.join(params)});")
    files["emulate.cpp"] = (f"/* runs {KERNEL_SOURCE[target]} on the CPU: see aot_gpu_shim.h */\n"
                            f'#include "aot_gpu_shim.h"\n#include "{KERNEL_SOURCE[target]}"\n\n' + "\n".join(wrappers) + "\n")
    calls = [(f"{fn}_blocks", list(enumerate(bufs)), l.grid, l.grid > 1) for fn, bufs, l in launches]
    model = "#include <stdint.h>\n#include <stdbool.h>\n" + render_model_c(name, sched, calls, protos, external)
    files["model.c"] = "#define _GNU_SOURCE\n" + model + ("" if external else render_weights_asm(name))
    files[f"{name}.h"] = render_header(name, sched, arena, len(sched.kernels), f"{target}, emulated on the CPU")
  elif target == "metal":
    # Mach-O assembly (macOS): the weights and the Metal source linked in as bytes
    files["model.c"] = render_gpu_model_c(name, sched, launches, list(functions.values()), target, external)
    linked = [] if external else [f".globl _{name}_weights", f".private_extern _{name}_weights", f"_{name}_weights:",
                                  '.incbin "weights.bin"', ".byte 0", ".p2align 6"]
    files["blobs_macos.S"] = "\n".join([
      ".section __TEXT,__const", ".p2align 6", *linked, f".globl _{name}_image",
      f".private_extern _{name}_image", f"_{name}_image:", f'.incbin "{DEVICE_IMAGE[target]}"',
      f".globl _{name}_image_end", f".private_extern _{name}_image_end", f"_{name}_image_end:", ".byte 0", ""])
    files["build_macos.sh"] = _macos_build_script(name)
    files[f"{name}.h"] = _gpu_header(name, sched, arena, len(sched.kernels), target, weights.size)
  else:
    files["model.c"] = (render_gpu_model_c(name, sched, launches, list(functions.values()), target, external)
                        + ("" if external else render_weights_asm(name)) + _incbin_asm(f"{name}_image", DEVICE_IMAGE[target]))
    files[f"{name}.h"] = _gpu_header(name, sched, arena, len(sched.kernels), target, weights.size)
  return files, infos, arena, weights, launches

def _macos_build_script(name: str) -> str:
  return f"""#!/bin/sh
# Builds lib{name}.dylib on macOS (Xcode command line tools: xcode-select --install). Run from anywhere:
#   sh src/build_macos.sh
# The Metal kernels (kernels.metal, linked in as text) are compiled for the Mac's GPU when {name}_create runs.
set -e
cd "$(dirname "$0")"
xcrun clang -O2 -fPIC -fvisibility=hidden -fobjc-arc -dynamiclib -std=gnu11 \\
  -o ../lib{name}.dylib model.c aot_runtime.c blobs_macos.S -x objective-c aot_metal.m \\
  -framework Metal -framework Foundation
echo "built $(cd .. && pwd)/lib{name}.dylib"
"""

def build_steps(target: str, src: Path, out: Path, emulate: bool, offload_arch, cpu: str):
  """The commands that build libNAME.so from src/ (each run in src/), in order."""
  c_flags = ["-O2", "-fPIC", "-fvisibility=hidden", "-fno-math-errno", "-std=gnu11", f"-Wa,-I{src}"]
  # the host code of a GPU library only launches kernels: built for any x86-64 (or the cpu asked for); an emulated
  # build runs its kernels on this CPU, so it is built for it, like the CPU targets
  if cpu != "generic" and (emulate or cpu != "native"): c_flags.append(f"-march={cpu}")
  tmp = Path(tempfile.mkdtemp(prefix="aot_gpu_build_"))
  steps, objs = [], []
  def compile_c(s: str, extra=()):
    o = str(tmp / (Path(s).stem + ".o")); objs.append(o)
    steps.append([cc(), *c_flags, *extra, "-c", s, "-o", o])
  if emulate:
    o = str(tmp / "emulate.o"); objs.append(o)
    # C++17, not gnu++17: no contraction of a*b+c into fma, so results match the CPU targets' rounding
    steps.append([emulator_cxx(), "-O2", "-fPIC", "-fvisibility=hidden", "-fno-math-errno", "-std=c++17", "-w",
                  *([f"-march={cpu}"] if cpu != "generic" else []), "-c", "emulate.cpp", "-o", o])
    compile_c("model.c"); compile_c("aot_runtime.c")
    link = [emulator_cxx(), "-shared", "-pthread", "-o", str(out), *objs, "-lm", "-ldl"]
    return steps + [link], tmp
  if target == "cuda":
    # uncompressed: the PTX stays readable in the artifact (and the driver skips a decompression at load)
    steps.append([nvcc(), "-fatbin", "-O3", "-std=c++17", "--no-compress", f"-gencode=arch=compute_{CUDA_ARCH},code=sm_{CUDA_ARCH}",
                  f"-gencode=arch=compute_{CUDA_ARCH},code=compute_{CUDA_ARCH}", "-I.", KERNEL_SOURCE[target],
                  "-o", DEVICE_IMAGE[target]])
    glue_flags = [f"-I{cuda_include()}"]
  else:
    arches = [f"--offload-arch={a}" for a in (offload_arch or DEFAULT_OFFLOAD_ARCH)]
    steps.append([clang(), "-x", "hip", *arches, "-nogpulib", "-nogpuinc", "--cuda-device-only", "-O3", "-std=c++17",
                  "-I.", "-c", KERNEL_SOURCE[target], "-o", DEVICE_IMAGE[target]])
    glue_flags = [f"-I{hip_include()}"]
  compile_c("model.c"); compile_c("aot_runtime.c"); compile_c(HOST_GLUE[target], glue_flags)
  # the GPU runtime is dlopen'ed at create time: the library links against nothing of it
  return steps + [[cc(), "-shared", "-pthread", "-o", str(out), *objs, "-lm", "-ldl"]], tmp

def build_gpu_library(target: str, src: Path, out: Path, emulate: bool, offload_arch, cpu: str, cache: bool) -> bool:
  """Build src/ into out, and the device image into src/ (both cached by the hash of every source and command, with
  the build's own paths left out). Returns True when they came from the cache."""
  steps, tmp = build_steps(target, src, out, emulate, offload_arch, cpu)
  try:
    paths = {str(src): "SRC", str(tmp): "TMP", str(out): "OUT"}
    def portable(arg: str) -> str:
      for p, name in paths.items(): arg = arg.replace(p, name)
      return arg
    # "native" means this machine's CPU, which the command line does not say
    from aot.codegen.llvm import host_target
    h = hashlib.sha256(json.dumps([host_target()] + [[portable(a) for a in s] for s in steps]).encode())
    for f in sorted(src.iterdir()):
      if f.is_file(): h.update(f.name.encode()); h.update(f.read_bytes())
    cached = _cache_dir() / f"gpu-{h.hexdigest()[:32]}"
    image = None if emulate else DEVICE_IMAGE[target]
    if cache and (cached / "lib.so").exists() and (image is None or (cached / image).exists()):
      shutil.copyfile(cached / "lib.so", out)
      if image: shutil.copyfile(cached / image, src / image)
      return True
    for s in steps: _run(s, src)
    if cache:
      if image: _store(src / image, cached / image)
      _store(out, cached / "lib.so")
    return False
  finally:
    shutil.rmtree(tmp, ignore_errors=True)

def check_metal_syntax(src: Path) -> None:
  """Compile kernels.metal as C++ with clang and a stand-in for <metal_stdlib> (runtime_c/aot_metal_shim.h): catches
  syntax and type errors in the generated source (it cannot catch what only Apple's compiler rejects)."""
  runtime = importlib.resources.files("aot.runtime_c")
  with tempfile.TemporaryDirectory(prefix="aot_metal_") as d:
    (Path(d) / "metal_stdlib").write_text(runtime.joinpath("aot_metal_shim.h").read_text())
    _run([clang(), "-x", "c++", "-std=c++17", "-fsyntax-only", "-Wall", "-Werror", "-Wno-unknown-attributes",
          "-Wno-unused-variable", "-Wno-unused-function", "-I", d, str(src / "kernels.metal")], src)

def compile_gpu_model(name: str, sched: Schedule, target: str, out_dir, cpu: str = "native", cache: bool = True,
                      progress: Callable[[str], None] | None = None, offload_arch=None, emulate: bool = False,
                      started: float | None = None) -> Artifact:
  """The GPU half of compile_model: sources, build (not for metal on Linux: the sources, header and manifest, plus
  src/build_macos.sh), manifest, in a staging folder moved into place when everything worked."""
  t0 = started or time.perf_counter()
  say = progress or (lambda s: None)
  out, stage = make_stage(name, out_dir)
  try:
    files, infos, arena, weights, launches = render_gpu_sources(name, sched, target, emulate,
                                                                WeightsWriter(stage / "weights.part"))
    place_sources(stage, name, files, weights.path)
    src = stage / "src"
    external = weights.size > WEIGHTS_INLINE_MAX
    runtime = importlib.resources.files("aot.runtime_c")
    shipped = ["aot_runtime.c", "aot_runtime.h"] + (["aot_hip_math.h"] if target == "hip" else []) + \
              (["aot_gpu_shim.h"] if emulate else ["aot_gpu.h", HOST_GLUE[target]])
    for f in shipped: (src / f).write_text(runtime.joinpath(f).read_text())
    if target == "metal":
      check_metal_syntax(src)
      say("checked the Metal source's syntax (clang, C++ with a metal_stdlib stand-in); build on macOS: src/build_macos.sh")
    else:
      build_gpu_library(target, src, stage / f"lib{name}.so", emulate, offload_arch, cpu, cache)
      say(f"built lib{name}.so")
    shutil.copyfile(src / f"{name}.h", stage / f"{name}.h")
    manifest = stage / f"{name}.json"
    write_manifest(manifest, name, target, cpu, None, sched, infos, arena, sum(align_up(b.nbytes) for b in sched.scratch),
                   weights.size, time.perf_counter() - t0, weights.checksum)
    m = json.loads(manifest.read_text())
    m["weights_file"] = f"{name}.weights" if external else None
    m["gpu"] = {"emulated": emulate, "launches": [{"function": fn, "grid": l.grid, "block": l.block,
                                                   "cooperative": l.cooperative} for fn, _, l in launches]}
    if target == "hip": m["gpu"]["offload_arch"] = list(offload_arch or DEFAULT_OFFLOAD_ARCH)
    if target == "cuda" and not emulate: m["gpu"]["cuda_arch"] = [f"sm_{CUDA_ARCH}", f"compute_{CUDA_ARCH}"]
    if target == "metal": m["gpu"]["built"] = "on macOS: sh src/build_macos.sh"
    manifest.write_text(json.dumps(m, indent=1))
    install(stage, out)
  finally:
    shutil.rmtree(stage, ignore_errors=True)
  return Artifact(out)
