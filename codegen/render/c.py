"""The C renderer: one C99 function per distinct kernel, from the linearized instruction list.
The table of ops is shared by every C-family target (C, CUDA, HIP, Metal): a new target overrides entries."""

from __future__ import annotations

import math

from aot.codegen.render.linearize import (
  CORE_SPLIT,
  Piece,
  guards_divisor,
  in_pieces,
  is_outer,
  kernel_params,
  linearize,
  reads_strided,
  takes_runtime_size,
  widen_index,
)
from aot.core.dtype import DType, dtypes, min_value, to_dtype
from aot.core.ir import LIBM, GroupOp, Ops, ReduceOp, UOp


def _fn(name: str):
  # libm spelling per float type; half computes in float
  def render(dt: DType, a: str) -> str:
    if dt == dtypes.float64:
      return f"{name}({a})"
    if dt == dtypes.float32:
      return f"{name}f({a})"
    return f"(({dt.cname}){name}f((float)({a})))"

  return lambda dt, a: render(dt, a)


def fma_with(double: str, single: str):
  # half through double, whose product of two halves is exact and whose one rounding to nearest is then never a
  # half's midpoint the exact sum is not
  def render(dt: DType, a: str, b: str, c: str) -> str:
    if dt == dtypes.float64:
      return f"{double}({a}, {b}, {c})"
    if dt == dtypes.float32:
      return f"{single}({a}, {b}, {c})"
    return f"(({dt.cname}){double}((double)({a}), (double)({b}), (double)({c})))"

  return render


def _maxmin(cmp: str):
  # numpy's maximum/minimum propagate NaN: keep a when it is NaN
  return lambda dt, a, b: (
    f"((({a}) {cmp} ({b}) || ({a}) != ({a})) ? ({a}) : ({b}))"
    if dt.is_float
    else f"(({a}) {cmp} ({b}) ? ({a}) : ({b}))"
  )


def abs_with(fabs):
  # a float's through the target's fabs; an integer's by a compare (C's abs() is int only)
  return lambda dt, a: fabs(dt, a) if dt.is_float else f"(({a}) < 0 ? -({a}) : ({a}))"


# tail_masked: the innermost loop of a kernel without sums (a copy: an im2col panel's pack, a dense operand, a pool
# written out), at least this long and not a whole number of 16-float vectors, has its remainder run as a masked
# vector iteration: clang ran the 8 columns left of a 56-wide row as scalar gated loads. 14 panels of a 3x3 conv's
# pack, thread CPU time, not inlined: ResNet-18's 64x56x56 0.262 -> 0.147 ms (clang-19; the llvm target's 0.129),
# VGG-19's 128x56x56 0.307 -> 0.174, 512x28x28 0.125 -> 0.074 (clang-14 0.236 -> 0.198, 0.133 -> 0.078). Not in a
# kernel that reads at a small stride (reads_strided: a pool's window at stride 2): masked, its interleaved loads
# became one scalar load and insert per element (SqueezeNet's 3x3/2 max pool over 64x111x111: clang-19 0.40 -> 0.15
# ms unmasked, clang-14 0.70 -> 0.19; gcc, which has no such hint, 0.19 either way). Nor in one that reads the buffer
# it writes (an epilogue applied in place): masked, its loop ran 2.5-4x slower (SqueezeNet's bias + ReLU over 27- and
# 55-wide rows, clang-19 0.0063 -> 0.0018 and 0.0072 -> 0.0025 ms unmasked, clang-14 alike), where a pack, which
# writes a panel of its own, stays faster masked
TAIL_MASKED_MIN, TAIL_MASKED_VECTOR = 16, 16
# no_idioms: a kernel whose loops run in pieces bounded by the loops around them (a padded conv's im2col pack:
# linearize.loop_pieces) has its padding pieces, a store of zeros 0-3 long, and its interior row copies made calls of
# memset and memcpy by clang's idiom recognition, one call per row piece (ResNet-18's 3x3 packs over 128x28x28:
# clang-14 0.19 -> 0.10 ms with the calls off); so it is told not to (gcc made two such calls, not per row)


def reads_own_output(ast: UOp) -> bool:
  """Does the kernel load from the buffer it stores to (slot 0)?"""
  return any(u.op is Ops.LOAD and u.src[0].slot == 0 for u in ast.toposort())


class CRenderer:
  kernel_prefix = '__attribute__((visibility("hidden"))) void'
  restrict = "restrict"
  # put before such a loop (KERNEL_PRELUDE); None where the target has no such hint
  tail_masked = "AOT_TAIL_MASKED"
  # put before a kernel with loops in pieces bounded by the loops around them (NO_IDIOMS)
  no_idioms = "AOT_NO_IDIOMS"
  code_for_op = {
    Ops.NEG: lambda dt, a: f"(-{a})" if dt != dtypes.bool else f"(!{a})",
    **{op: _fn(name) for op, name in LIBM.items()},
    Ops.SHL: lambda dt, a, b: f"({a}<<{b})",
    Ops.SHR: lambda dt, a, b: f"({a}>>{b})",
    Ops.RECIP: lambda dt, a: f"(({dt.cname})1/({a}))",
    Ops.ABS: abs_with(_fn("fabs")),
    Ops.NOT: lambda dt, a: f"(!{a})" if dt == dtypes.bool else f"(~{a})",
    Ops.ADD: lambda dt, a, b: f"({a}+{b})",
    Ops.SUB: lambda dt, a, b: f"({a}-{b})",
    Ops.MUL: lambda dt, a, b: f"({a}*{b})",
    Ops.DIV: lambda dt, a, b: f"({a}/{b})",
    Ops.IDIV: lambda dt, a, b: f"({a}/{b})",
    Ops.MOD: lambda dt, a, b: (
      (f"fmod({a}, {b})" if dt == dtypes.float64 else f"fmodf({a}, {b})") if dt.is_float else f"({a}%{b})"
    ),
    Ops.MAX: _maxmin(">"),
    Ops.MIN: _maxmin("<"),
    Ops.POW: lambda dt, a, b: f"pow({a}, {b})" if dt == dtypes.float64 else f"(({dt.cname})powf({a}, {b}))",
    Ops.CMPLT: lambda dt, a, b: f"({a}<{b})",
    Ops.CMPLE: lambda dt, a, b: f"({a}<={b})",
    Ops.CMPEQ: lambda dt, a, b: f"({a}=={b})",
    Ops.CMPNE: lambda dt, a, b: f"({a}!={b})",
    Ops.AND: lambda dt, a, b: f"({a}&&{b})" if dt == dtypes.bool else f"({a}&{b})",
    Ops.OR: lambda dt, a, b: f"({a}||{b})" if dt == dtypes.bool else f"({a}|{b})",
    Ops.XOR: lambda dt, a, b: f"({a}^{b})",
    Ops.WHERE: lambda dt, c, a, b: f"({c}?{a}:{b})",
    Ops.FMA: fma_with("fma", "AOT_FMAF"),
  }

  def prefix(self, ast: UOp) -> str:
    # gcc's loop vectoriser is off (build.py: it miscompiles a reduction); kernels without one get it back, which is
    # what makes an elementwise kernel or an operand copy vectorised
    if any(u.op is Ops.ACCUMULATE for u in ast.toposort()):
      return self.kernel_prefix
    return "AOT_LOOP_VECTORIZE " + self.kernel_prefix

  def literal(self, dt: DType, v) -> str:
    if dt == dtypes.bool:
      return "1" if v else "0"
    if dt.is_float:
      special = math.isnan(v) or math.isinf(v)
      s = "NAN" if math.isnan(v) else ("INFINITY" if v > 0 else "(-INFINITY)") if math.isinf(v) else float(v).hex()
      if dt == dtypes.float32 and not special:
        s += "f"
      if dt == dtypes.float16:
        s = f"(({dt.cname}){s})"
      return f"({s})" if s.startswith("-") else s
    if v == min_value(dt) and dt.itemsize >= 4:
      return f"(({dt.cname})({v + 1}{'LL' if dt.itemsize == 8 else ''}-1))"
    suffix = {8: "ULL" if dt.kind == "u" else "LL"}.get(dt.itemsize, "U" if dt.kind == "u" and dt.itemsize == 4 else "")
    s = f"{v}{suffix}" if dt == dtypes.index or dt.itemsize >= 4 else f"(({dt.cname}){v})"
    return f"({s})" if v < 0 else s

  def identity(self, op: ReduceOp, dt: DType) -> str:
    return self.literal(dt, op.identity(dt))

  def accumulate(self, op: ReduceOp, dt: DType, acc: str, v: str) -> str:
    if op is ReduceOp.SUM:
      return f"{acc} += {v};"
    if op is ReduceOp.PROD:
      return f"{acc} *= {v};"
    return f"{acc} = {self.code_for_op[Ops.MAX if op is ReduceOp.MAX else Ops.MIN](dt, v, acc)};"

  def param_decls(self, ast: UOp) -> list[str]:
    # start/end bound the outermost output loop: the slice of it one thread runs
    buffers = [
      f"{'' if p.slot == 0 else 'const '}{p.dtype.cname} *{self.restrict} d{p.slot}" for p in kernel_params(ast)
    ]
    # n_: the size of a dim that runs to a size given at run time (aot/scheduler/runtime_extent.py)
    return buffers + (["int n_"] if takes_runtime_size(ast) else []) + ["int start", "int end"]

  def render_kernel(self, name: str, ast: UOp) -> str:
    # a kernel that reads at a small stride, or its own output, keeps its tails unmasked (TAIL_MASKED_MIN)
    maskable = not any(u.op is Ops.ACCUMULATE for u in ast.toposort()) and not reads_strided(ast)
    maskable = maskable and not reads_own_output(ast)
    ast = widen_index(ast)
    names: dict[UOp, str] = {}

    def r(u: UOp) -> str:
      if u.op is Ops.CONST:
        return self.literal(u.dtype, u.arg)
      return names[u]

    def expr(u: UOp) -> str:
      # a piece's bound, written out from the values and loops around it
      return r(u) if u.op is Ops.CONST or u in names else self.render_value(u, expr)

    def bound(x: int | UOp, dt: DType) -> str:
      return expr(x) if isinstance(x, UOp) else self.literal(dt, x)

    program = linearize(ast)
    inner = next((u for kind, u in reversed(program) if kind == "loop"), None)
    # the innermost loop and the one around it in pieces (in_pieces): a body is written once per piece, the gates a
    # piece keeps constant written as their values
    pieces = in_pieces(ast, program, CORE_SPLIT["c"])
    prefix = self.prefix(ast)
    if self.no_idioms is not None and any(piece is not None and piece.varies for _, _, piece, _ in pieces):
      prefix = f"{self.no_idioms} {prefix}"
    lines, depth = [f"{prefix} {name}({', '.join(self.param_decls(ast))}) {{"], 1
    for kind, u, piece, known in pieces:
      ind = "  " * depth
      if kind == "loop":
        names[u] = f"r{u.number}"
        lo, hi = ("start", "end") if is_outer(u) else (bound(piece.lo, u.dtype), bound(piece.hi, u.dtype))
        lo = "0" if piece == Piece(0, u.size) and not is_outer(u) else lo
        if u.runtime and not is_outer(u):
          assert piece == Piece(0, u.size), "a loop to a run-time size is never cut in pieces"
          lo, hi = "0", expr(u.extent)
        if u is inner and not is_outer(u) and self.masks_tail(maskable, piece):
          lines.append(f"{ind}{self.tail_masked}")
        lines.append(f"{ind}for ({u.dtype.cname} {names[u]} = {lo}; {names[u]} < {hi}; {names[u]}++) {{")
        depth += 1
      elif kind == "end":
        depth -= 1
        lines.append("  " * depth + "}")
      elif kind == "acc_init":
        names.setdefault(u, f"acc{len(names)}")
        lines.append(f"{ind}{u.dtype.cname} {names[u]} = {self.identity(u.reduce_op, u.dtype)};")
      elif kind == "acc_update":
        lines.append(f"{ind}{self.accumulate(u.reduce_op, u.dtype, names[u], r(u.src[0]))}")
      elif kind == "store":
        lines.append(f"{ind}d{u.src[0].slot}[{r(u.src[1])}] = {r(u.src[2])};")
      else:
        # a body written once per piece (in_pieces) keeps its names
        names.setdefault(u, f"v{len(names)}")
        value = self.literal(u.dtype, known[u]) if u in known else self.render_value(u, r)
        lines.append(f"{ind}const {u.dtype.cname} {names[u]} = {value};")
    return "\n".join(lines + ["}"])

  def masks_tail(self, maskable: bool, piece: Piece) -> bool:
    """Does an innermost loop over the piece run its remainder masked (tail_masked)? maskable: the kernel has no sums,
    no reads at a small stride and none of its own output. A piece whose length varies with the loops around it (an
    im2col row's interior) may have a remainder."""
    fewest, most = piece.length()
    whole = fewest == most and most % TAIL_MASKED_VECTOR == 0
    return self.tail_masked is not None and maskable and most >= TAIL_MASKED_MIN and not whole

  def render_value(self, u: UOp, r) -> str:
    if u.op is Ops.VAR:
      return u.arg[0]
    if u.op is Ops.LOAD:
      buf, idx, gate = u.src
      access = f"d{buf.slot}[{r(idx)}]"
      return access if gate.op is Ops.CONST and gate.arg else f"({r(gate)} ? {access} : {self.literal(u.dtype, 0)})"
    if u.op is Ops.CAST:
      return (
        f"(({u.dtype.cname})({r(u.src[0])} != 0))" if u.dtype == dtypes.bool else f"(({u.dtype.cname}){r(u.src[0])})"
      )
    if u.op is Ops.BITCAST:
      return (
        f"({{ {u.dtype.cname} t_; {u.src[0].dtype.cname} s_ = {r(u.src[0])}; "
        f"__builtin_memcpy(&t_, &s_, sizeof t_); t_; }})"
      )
    if guards_divisor(u):
      return self.int_division(u.op, u.dtype, r(u.src[0]), r(u.src[1]))
    if u.op is Ops.IDIV and u.dtype.is_float:
      # IDIV truncates toward zero (aot/core/interpret.py), a float quotient too
      return self.code_for_op[Ops.TRUNC](u.dtype, self.code_for_op[Ops.DIV](u.dtype, r(u.src[0]), r(u.src[1])))
    if u.op in self.code_for_op:
      dt = u.src[-1].dtype if u.op in GroupOp.Compare else u.dtype
      return self.code_for_op[u.op](dt, *[r(s) for s in u.src])
    raise NotImplementedError(f"C renderer: no rule for {u.op.name}")

  def int_division(self, op: Ops, dt: DType, a: str, b: str) -> str:
    """An integer a / b or a % b whose divisor may be 0 or -1 (linearize.guards_divisor): those divisors never reach
    the division, which would trap; their results are numpy's."""
    zero, t = self.literal(dt, 0), dt.cname
    if op is Ops.MOD:
      bad = f"{b} == 0 || {b} == -1" if dt.kind == "i" else f"{b} == 0"
      return f"(({bad}) ? {zero} : ({t})({a} % {b}))"
    if dt.kind == "u":
      return f"({b} == 0 ? {zero} : ({t})({a} / {b}))"
    # a / -1 is a negated in unsigned arithmetic, which wraps: MIN / -1 is MIN
    neg = f"({t})(0 - ({to_dtype(f'uint{dt.itemsize * 8}').cname})({a}))"
    return f"({b} == 0 ? {zero} : {b} == -1 ? {neg} : ({t})({a} / {b}))"


KERNEL_PRELUDE = """#include <math.h>
#include <stdint.h>
#include <stdbool.h>
#if defined(__GNUC__) && !defined(__clang__)
#define AOT_LOOP_VECTORIZE __attribute__((optimize("tree-loop-vectorize")))
#else
#define AOT_LOOP_VECTORIZE
#endif
#if defined(__clang__)
#define AOT_TAIL_MASKED _Pragma("clang loop vectorize_predicate(enable)")
#define AOT_NO_IDIOMS __attribute__((no_builtin("memset", "memcpy")))
#else
#define AOT_TAIL_MASKED
#define AOT_NO_IDIOMS
#endif
#if defined(__clang__) && __clang_major__ < 15 && defined(__x86_64__) && !defined(__AVX512FP16__)
/* clang before 15 knows _Float16 on x86 only with AVX512-FP16 (not on a Zen 4, say); its __fp16 is the same IEEE half
   as a storage type whose arithmetic is float's, and the kernels only load, store and convert half (they compute in
   float) */
#define _Float16 __fp16
#endif
#if defined(__x86_64__) && !defined(__FMA__)
/* an x86 CPU without FMA instructions (-march=x86-64): libm's fmaf would be a call per element, which no loop
   vectorises (a 64x56x56 QLinearAdd 0.89 ms, its float64 form 0.33). Here the product is exact in double, the sum
   rounded to odd (the two-sum error says which way the exact sum lies), and that double rounded once to float is the
   one rounding of the exact sum (53 bits are 2 more than twice float's 24 needs); branch-free, so it vectorises */
static inline float AOT_FMAF(float a, float b, float c) {
  double p = (double)a * (double)b, s = p + (double)c, back = s - p;
  double err = (p - (s - back)) + ((double)c - back);
  int64_t bits;
  __builtin_memcpy(&bits, &s, sizeof bits);
  bits += (err != 0 && err == err && (bits & 1) == 0) ? ((err > 0) == (s > 0) ? 1 : -1) : 0;
  __builtin_memcpy(&s, &bits, sizeof s);
  return (float)s;
}
#else
#define AOT_FMAF fmaf
#endif
"""
