"""What --cpu means for a CPU build: the compiler flags it becomes, the instruction set extensions the compiler then
uses (probed from the compiler itself, `cc -march=X -dM -E`, cached per compiler and flags), the LLVM target
machine's CPU and features for the llvm target, and the header NAME_create's CPU check reads (runtime_c/aot_cpu.c):
an artifact run on a CPU lacking one of them fails at create with AOT_ERR_UNSUPPORTED_CPU instead of dying with
SIGILL in the first kernel."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from aot.errors import InvalidValueError, MissingToolError

# x86-64's portable levels (psABI): v2 adds SSE4.2 and POPCNT, v3 AVX2, FMA, BMI2, F16C, v4 AVX-512 F/BW/CD/DQ/VL
X86_LEVELS = ("x86-64", "x86-64-v2", "x86-64-v3", "x86-64-v4")
# what --cpu may look like: a compiler's CPU or architecture name, with +extension suffixes on aarch64
CPU_SYNTAX = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
# the runtime file holding the check, built without -march: it must run on any CPU of the architecture
CHECK_SOURCE = "aot_cpu.c"
# the header the build writes into src/ for it: what this build needs
CHECK_HEADER = "aot_cpu_target.h"


@dataclass(frozen=True)
class X86Feature:
  """An x86 extension: its LLVM (and gcc -m) name, the macro the compiler defines when it may use it, its CPUID bit
  (leaf, subleaf, register 0-3 = eax-edx, bit) and the XCR0 bits the OS must have enabled for its registers."""

  name: str
  macro: str
  leaf: int
  subleaf: int
  reg: int
  bit: int
  state: int = 0


YMM, ZMM, TILE = 0x6, 0xE6, 0x60000
EAX, EBX, ECX, EDX = range(4)
_F = X86Feature
X86_FEATURES = (
  _F("sse3", "__SSE3__", 1, 0, ECX, 0),
  _F("pclmul", "__PCLMUL__", 1, 0, ECX, 1),
  _F("ssse3", "__SSSE3__", 1, 0, ECX, 9),
  _F("fma", "__FMA__", 1, 0, ECX, 12, YMM),
  _F("cx16", "__GCC_HAVE_SYNC_COMPARE_AND_SWAP_16", 1, 0, ECX, 13),
  _F("sse4.1", "__SSE4_1__", 1, 0, ECX, 19),
  _F("sse4.2", "__SSE4_2__", 1, 0, ECX, 20),
  _F("movbe", "__MOVBE__", 1, 0, ECX, 22),
  _F("popcnt", "__POPCNT__", 1, 0, ECX, 23),
  _F("aes", "__AES__", 1, 0, ECX, 25),
  _F("xsave", "__XSAVE__", 1, 0, ECX, 26),
  _F("avx", "__AVX__", 1, 0, ECX, 28, YMM),
  _F("f16c", "__F16C__", 1, 0, ECX, 29, YMM),
  _F("rdrnd", "__RDRND__", 1, 0, ECX, 30),
  _F("fsgsbase", "__FSGSBASE__", 7, 0, EBX, 0),
  _F("bmi", "__BMI__", 7, 0, EBX, 3),
  _F("avx2", "__AVX2__", 7, 0, EBX, 5, YMM),
  _F("bmi2", "__BMI2__", 7, 0, EBX, 8),
  _F("avx512f", "__AVX512F__", 7, 0, EBX, 16, ZMM),
  _F("avx512dq", "__AVX512DQ__", 7, 0, EBX, 17, ZMM),
  _F("rdseed", "__RDSEED__", 7, 0, EBX, 18),
  _F("adx", "__ADX__", 7, 0, EBX, 19),
  _F("avx512ifma", "__AVX512IFMA__", 7, 0, EBX, 21, ZMM),
  _F("clflushopt", "__CLFLUSHOPT__", 7, 0, EBX, 23),
  _F("clwb", "__CLWB__", 7, 0, EBX, 24),
  _F("avx512cd", "__AVX512CD__", 7, 0, EBX, 28, ZMM),
  _F("sha", "__SHA__", 7, 0, EBX, 29),
  _F("avx512bw", "__AVX512BW__", 7, 0, EBX, 30, ZMM),
  _F("avx512vl", "__AVX512VL__", 7, 0, EBX, 31, ZMM),
  _F("avx512vbmi", "__AVX512VBMI__", 7, 0, ECX, 1, ZMM),
  _F("avx512vbmi2", "__AVX512VBMI2__", 7, 0, ECX, 6, ZMM),
  _F("gfni", "__GFNI__", 7, 0, ECX, 8),
  _F("vaes", "__VAES__", 7, 0, ECX, 9, YMM),
  _F("vpclmulqdq", "__VPCLMULQDQ__", 7, 0, ECX, 10, YMM),
  _F("avx512vnni", "__AVX512VNNI__", 7, 0, ECX, 11, ZMM),
  _F("avx512bitalg", "__AVX512BITALG__", 7, 0, ECX, 12, ZMM),
  _F("avx512vpopcntdq", "__AVX512VPOPCNTDQ__", 7, 0, ECX, 14, ZMM),
  _F("rdpid", "__RDPID__", 7, 0, ECX, 22),
  _F("avx512vp2intersect", "__AVX512VP2INTERSECT__", 7, 0, EDX, 8, ZMM),
  _F("serialize", "__SERIALIZE__", 7, 0, EDX, 14),
  _F("amx-bf16", "__AMX_BF16__", 7, 0, EDX, 22, TILE),
  _F("avx512fp16", "__AVX512FP16__", 7, 0, EDX, 23, ZMM),
  _F("amx-tile", "__AMX_TILE__", 7, 0, EDX, 24, TILE),
  _F("amx-int8", "__AMX_INT8__", 7, 0, EDX, 25, TILE),
  _F("avxvnni", "__AVXVNNI__", 7, 1, EAX, 4, YMM),
  _F("avx512bf16", "__AVX512BF16__", 7, 1, EAX, 5, ZMM),
  _F("xsaveopt", "__XSAVEOPT__", 0xD, 1, EAX, 0),
  _F("xsavec", "__XSAVEC__", 0xD, 1, EAX, 1),
  _F("xsaves", "__XSAVES__", 0xD, 1, EAX, 3),
  _F("sahf", "__LAHF_SAHF__", 0x80000001, 0, ECX, 0),
  _F("lzcnt", "__LZCNT__", 0x80000001, 0, ECX, 5),
  _F("sse4a", "__SSE4A__", 0x80000001, 0, ECX, 6),
  _F("prfchw", "__PRFCHW__", 0x80000001, 0, ECX, 8),
  _F("xop", "__XOP__", 0x80000001, 0, ECX, 11, YMM),
  _F("fma4", "__FMA4__", 0x80000001, 0, ECX, 16, YMM),
  _F("tbm", "__TBM__", 0x80000001, 0, ECX, 21),
  _F("clzero", "__CLZERO__", 0x80000008, 0, EBX, 0),
)


@dataclass(frozen=True)
class ArmFeature:
  """An aarch64 extension: its LLVM name, the ACLE macro, and its bit in the kernel's AT_HWCAP (word 1) or
  AT_HWCAP2 (word 2)."""

  name: str
  macro: str
  word: int
  bit: int


_A = ArmFeature
ARM_FEATURES = (
  _A("neon", "__ARM_NEON", 1, 1),
  _A("aes", "__ARM_FEATURE_AES", 1, 3),
  _A("sha2", "__ARM_FEATURE_SHA2", 1, 6),
  _A("crc", "__ARM_FEATURE_CRC32", 1, 7),
  _A("lse", "__ARM_FEATURE_ATOMICS", 1, 8),
  _A("fullfp16", "__ARM_FEATURE_FP16_VECTOR_ARITHMETIC", 1, 10),
  _A("rdm", "__ARM_FEATURE_QRDMX", 1, 12),
  _A("jsconv", "__ARM_FEATURE_JCVT", 1, 13),
  _A("complxnum", "__ARM_FEATURE_COMPLEX", 1, 14),
  _A("rcpc", "__ARM_FEATURE_RCPC", 1, 15),
  _A("sha3", "__ARM_FEATURE_SHA3", 1, 17),
  _A("dotprod", "__ARM_FEATURE_DOTPROD", 1, 20),
  _A("sve", "__ARM_FEATURE_SVE", 1, 22),
  _A("fp16fml", "__ARM_FEATURE_FP16_FML", 1, 23),
  _A("sve2", "__ARM_FEATURE_SVE2", 2, 1),
  _A("fptoint", "__ARM_FEATURE_FRINT", 2, 8),
  _A("i8mm", "__ARM_FEATURE_MATMUL_INT8", 2, 13),
  _A("bf16", "__ARM_FEATURE_BF16_VECTOR_ARITHMETIC", 2, 14),
)


def is_x86(triple: str | None) -> bool:
  return (triple or "x86_64").startswith(("x86_64", "i686", "i386"))


def _table(triple: str | None) -> tuple:
  if is_x86(triple):
    return X86_FEATURES
  return ARM_FEATURES if triple.startswith(("aarch64", "arm64")) else ()


def is_arch_string(cpu: str) -> bool:
  """Is cpu an architecture (armv8.2-a+dotprod, x86-64-v3) rather than a CPU (cortex-a76, skylake)?"""
  return cpu.startswith(("armv", "x86-64"))


def arch_flags(cpu: str, triple: str | None) -> list[str]:
  """The compiler flags --cpu becomes: -march on x86 (generic is x86-64, which gcc's -march takes); for a cross
  build, -march for an architecture string (armv8.2-a+dotprod) and -mcpu for a CPU (cortex-a76)."""
  if not triple:
    return [f"-march={'x86-64' if cpu == 'generic' else cpu}"]
  if cpu in ("native", "generic"):
    return []
  return [f"-march={cpu}"] if is_arch_string(cpu) else [f"-mcpu={cpu}"]


def baseline_cpu(triple: str | None) -> str:
  """The --cpu every CPU of the architecture runs: what the check itself is built for."""
  return "x86-64" if is_x86(triple) else "generic"


@dataclass(frozen=True)
class CpuTarget:
  """What a CPU build was made for: --cpu as asked, the CPU the compiler resolved it to, and the extensions (names in
  the feature tables above) its code may use: the C compiler's, plus the LLVM target machine's for the llvm target."""

  cpu: str
  resolved: str
  features: tuple[str, ...]
  triple: str | None = None

  def header(self) -> str:
    """aot_cpu_target.h: the features NAME_create checks, as the table entries runtime_c/aot_cpu.c reads."""
    wanted = set(self.features)
    rows = [f for f in _table(self.triple) if f.name in wanted]
    if is_x86(self.triple):
      entries = [f'{{"{f.name}", {f.leaf:#x}u, {f.subleaf}u, {f.reg}u, {f.bit}u, {f.state:#x}ull}}' for f in rows]
    else:
      entries = [f'{{"{f.name}", {f.word}, {f.bit}}}' for f in rows]
    built_for = f"--cpu {self.cpu}" + (f" (resolved: {self.resolved})" if self.resolved != self.cpu else "")
    return (
      "/* generated by aot (aot/cpu.py): the instruction set extensions this build's code may use, which\n"
      "   NAME_create checks the CPU has (runtime_c/aot_cpu.c) */\n"
      f"#define AOT_CPU_BUILT_FOR {json.dumps(built_for)}\n"
      f"#define AOT_CPU_REQUIRED {{ {', '.join(entries)} }}\n"
      f"#define AOT_CPU_REQUIRED_COUNT {len(entries)}\n"
    )


def cpu_target(cpu: str, triple: str | None = None, llvm: bool = False) -> CpuTarget:
  """The build's CpuTarget: the C compiler's probe, with the llvm target's own features added (llvm_machine)."""
  probed = probe(cpu, triple)
  if not llvm:
    return probed
  extra = set(llvm_machine(cpu, triple).enabled) - set(probed.features)
  names = [f.name for f in _table(triple) if f.name in set(probed.features) | extra]
  return CpuTarget(probed.cpu, probed.resolved, tuple(names), triple)


def probe(cpu: str, triple: str | None = None) -> CpuTarget:
  """The C compiler's answer for --cpu (cached in memory and in the build cache: a probe runs the compiler twice)."""
  from aot.build import cc, compiler_identity

  compiler = cc(triple)
  return _probe(cpu, triple, compiler, compiler_identity(compiler))


@functools.lru_cache(maxsize=None)
def _probe(cpu: str, triple: str | None, compiler: str, identity: tuple[str, str]) -> CpuTarget:
  from aot.cache import cache_dir, store

  flags = arch_flags(cpu, triple)
  key = hashlib.sha256(json.dumps([identity, flags, triple, [f.macro for f in _table(triple)]]).encode())
  cached = cache_dir() / "cpu" / f"{key.hexdigest()[:32]}.json"
  try:
    found = json.loads(cached.read_text())
    return CpuTarget(cpu, found["resolved"], tuple(found["features"]), triple)
  except (OSError, ValueError, KeyError):
    pass
  macros = _run(identity[0], [*flags, "-dM", "-E", "-x", "c", os.devnull], cpu, triple, compiler)
  defined = set(re.findall(r"^#define (\w+)", macros, re.MULTILINE))
  target = CpuTarget(cpu, _resolved(identity, flags, cpu, triple), _features(defined, triple), triple)
  with tempfile.TemporaryDirectory(prefix="aot_probe_") as d:
    answer = Path(d) / "probe.json"
    answer.write_text(json.dumps({"resolved": target.resolved, "features": list(target.features)}))
    store(answer, cached)
  return target


def _features(defined: set[str], triple: str | None) -> tuple[str, ...]:
  names = [f.name for f in _table(triple) if f.macro in defined]
  # gcc names lzcnt's macro after AMD's ABM as well; either means the compiler may emit lzcnt
  if is_x86(triple) and "__ABM__" in defined and "lzcnt" not in names:
    names = [f.name for f in X86_FEATURES if f.name in {*names, "lzcnt"}]
  return tuple(names)


def _run(compiler: str, args: list[str], cpu: str, triple: str | None, name: str = "") -> str:
  try:
    p = subprocess.run([compiler, *args], capture_output=True, text=True)
  except OSError as e:
    what = f"the C compiler for {triple}" if triple else "the C compiler"
    raise MissingToolError(f"{compiler}, {what}, cannot run: {e.strerror}") from None
  if p.returncode != 0:
    first = next((ln.strip() for ln in p.stderr.splitlines() if "error" in ln), p.stderr.strip()[:200])
    who = name or Path(compiler).name
    raise InvalidValueError(f"--cpu {cpu!r} is not a CPU {who} knows ({first}); {accepted(triple)}")
  return p.stdout + p.stderr


def accepted(triple: str | None) -> str:
  """The forms --cpu takes, for an error message."""
  if is_x86(triple):
    return (
      "use native (this machine's CPU), generic or a portable level (x86-64, x86-64-v2, x86-64-v3, x86-64-v4), or a "
      "CPU name as the compiler's -march takes it (haswell, skylake-avx512, znver4, sapphirerapids)"
    )
  return (
    f"for {triple} use generic, an architecture with extensions (armv8-a, armv8.2-a+dotprod, armv8.2-a+fp16+dotprod) "
    "or a CPU name as the compiler's -mcpu takes it (cortex-a76, neoverse-n1)"
  )


def _resolved(identity: tuple[str, str], flags: list[str], cpu: str, triple: str | None) -> str:
  """The CPU the compiler made of --cpu: gcc's -Q --help=target, clang's -target-cpu (native becomes a name)."""
  if "clang" in identity[1]:
    out = _run(identity[0], [*flags, "-###", "-c", "-x", "c", os.devnull], cpu, triple)
    m = re.search(r'"-target-cpu" "([^"]+)"', out)
  else:
    out = _run(identity[0], [*flags, "-Q", "--help=target"], cpu, triple)
    option = "march" if is_x86(triple) or is_arch_string(cpu) or cpu == "generic" else "mcpu"
    m = re.search(rf"^\s+-{option}=\s+(\S+)", out, re.MULTILINE)
  return m.group(1) if m else cpu


@dataclass(frozen=True)
class LlvmMachine:
  """The llvm target's TargetMachine for --cpu: its CPU name and feature string, and the table's features it has."""

  cpu: str
  features: str
  enabled: tuple[str, ...]


def llvm_machine(cpu: str, triple: str | None = None) -> LlvmMachine:
  """native: this machine's CPU and features as LLVM detects them. Otherwise the C compiler's features for --cpu made
  explicit (+ for those it uses, - for the rest of the table), so the llvm kernels use exactly what the check covers
  whatever LLVM's own idea of the CPU; an architecture string (armv8.2-a+dotprod) becomes LLVM's generic CPU."""
  from aot.codegen.render.llvm import host_target

  table = _table(triple)
  if cpu == "native":
    _, host_cpu, host_features = host_target()
    on = set(f[1:] for f in host_features.split(",") if f.startswith("+"))
    return LlvmMachine(host_cpu, host_features, tuple(f.name for f in table if f.name in on))
  on = set(probe(cpu, triple).features)
  flags = [("+" if f.name in on else "-") + f.name for f in table]
  name = cpu
  if is_arch_string(cpu) and not is_x86(triple):
    name = "generic"
    if m := re.match(r"armv(\d+(?:\.\d+)?)-a", cpu):
      flags.insert(0, f"+v{m.group(1)}a")
  elif cpu == "generic" and is_x86(triple):
    name = "x86-64"
  return LlvmMachine(name, ",".join(flags), tuple(sorted(on)))
