"""The LLVM renderer: the same linearized kernels the C renderer reads, as LLVM IR built with llvmlite, optimised by
LLVM's pass pipeline and emitted as an object file for a target triple and CPU.

Loop counters and accumulators live in allocas that LLVM's mem2reg turns into phis, so the renderer stays a walk
over the instruction list. exp/log/sqrt/sin/cos/floor/ceil/rint/trunc/fabs/pow/fma are LLVM intrinsics (LLVM knows
their semantics and vectorises them where the target has vector forms); the rest (tanh, erf, tan, asin, ...) are
libm calls: no intrinsic exists and an approximation of our own would need its own accuracy proof."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

import llvmlite.binding as llvm
from llvmlite import ir

from aot.codegen.render import llvm_object
from aot.codegen.render.linearize import (
  CORE_SPLIT,
  guards_divisor,
  in_pieces,
  is_outer,
  kernel_params,
  linearize,
  takes_runtime_size,
  widen_index,
)
from aot.core.dtype import DType, dtypes
from aot.core.ir import LIBM, GroupOp, Ops, ReduceOp, UOp
from aot.cpu import llvm_machine
from aot.errors import InvalidValueError


def ltype(dt: DType) -> ir.Type:
  """The type of a value in registers (bool is i1; in memory it is i8)."""
  if dt == dtypes.bool:
    return ir.IntType(1)
  if dt.is_float:
    return {2: ir.HalfType(), 4: ir.FloatType(), 8: ir.DoubleType()}[dt.itemsize]
  return ir.IntType(dt.itemsize * 8)


def mtype(dt: DType) -> ir.Type:
  return ir.IntType(8) if dt == dtypes.bool else ltype(dt)


# the libm functions LLVM has intrinsics for; the other LIBM entries are calls
INTRINSICS = {
  op: f"llvm.{LIBM[op]}"
  for op in (Ops.EXP, Ops.LOG, Ops.SQRT, Ops.SIN, Ops.COS, Ops.FLOOR, Ops.CEIL, Ops.ROUND, Ops.TRUNC)
}

# binary ops that are one IRBuilder method
FLOAT_BINARY = {Ops.ADD: "fadd", Ops.SUB: "fsub", Ops.MUL: "fmul", Ops.DIV: "fdiv", Ops.MOD: "frem"}
INT_WRAPPING = {Ops.ADD: "add", Ops.SUB: "sub", Ops.MUL: "mul"}  # take the nsw flag on index arithmetic
INT_BINARY = {Ops.AND: "and_", Ops.OR: "or_", Ops.XOR: "xor", Ops.SHL: "shl"}
# (signed, unsigned): integer division truncates toward zero, as C's
INT_SIGNED = {
  Ops.IDIV: ("sdiv", "udiv"),
  Ops.DIV: ("sdiv", "udiv"),
  Ops.MOD: ("srem", "urem"),
  Ops.SHR: ("ashr", "lshr"),
}


class KernelAttributes(ir.FunctionAttributes):
  """A kernel's attributes: llvmlite's, and LLVM's string attributes that keep memset and memcpy out of a loop (as
  C's no_builtin: codegen/render/c.py's no_idioms)."""

  _known = ir.FunctionAttributes._known | {'"no-builtin-memset"', '"no-builtin-memcpy"'}


@dataclass
class _Loop:
  """A counted loop being emitted: its counter (an alloca mem2reg turns into a phi), the block testing it, the block
  after it, and the counter's value in the body."""

  counter: ir.AllocaInstr
  it: ir.Type
  head: ir.Block
  exit: ir.Block
  i: ir.Instruction

  @staticmethod
  def begin(b: ir.IRBuilder, number: int, counter, it: ir.Type, lo, hi) -> _Loop:
    b.store(lo, counter)
    fn = b.block.function
    head, loop_body, exit_ = (fn.append_basic_block(f"{s}{number}") for s in ("head", "loop", "exit"))
    b.branch(head)
    b.position_at_end(head)
    i = b.load(counter)
    b.cbranch(b.icmp_signed("<", i, hi), loop_body, exit_)
    b.position_at_end(loop_body)
    return _Loop(counter, it, head, exit_, i)

  def end(self, b: ir.IRBuilder):
    b.store(b.add(b.load(self.counter), ir.Constant(self.it, 1), flags=["nsw"]), self.counter)
    b.branch(self.head)
    b.position_at_end(self.exit)


class LLVMRenderer:
  def __init__(self, module: ir.Module):
    self.module = module

  def _fn(self, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
    if name in self.module.globals:
      return self.module.globals[name]
    return ir.Function(self.module, ir.FunctionType(ret, args), name)

  def _math(self, b: ir.IRBuilder, op: Ops, dt: DType, *xs):
    # half goes through float, as the C target computes it; a half fma through double (c.py's fma_with says why)
    if dt == dtypes.float16 and op is Ops.FMA:
      wide = self._math(b, op, dtypes.float64, *[b.fpext(x, ir.DoubleType()) for x in xs])
      return b.fptrunc(wide, ir.HalfType())
    if dt == dtypes.float16:
      return b.fptrunc(self._math(b, op, dtypes.float32, *[b.fpext(x, ir.FloatType()) for x in xs]), ir.HalfType())
    t = ltype(dt)
    suffix = {4: "f32", 8: "f64"}[dt.itemsize]
    if op in INTRINSICS:
      return b.call(self._fn(f"{INTRINSICS[op]}.{suffix}", t, [t]), list(xs))
    if op is Ops.POW:
      return b.call(self._fn(f"llvm.pow.{suffix}", t, [t, t]), list(xs))
    if op is Ops.ABS:
      return b.call(self._fn(f"llvm.fabs.{suffix}", t, [t]), list(xs))
    if op is Ops.FMA:
      return b.call(self._fn(f"llvm.fma.{suffix}", t, [t, t, t]), list(xs))
    return b.call(self._fn(LIBM[op] + ("f" if dt.itemsize == 4 else ""), t, [t]), list(xs))

  def const(self, dt: DType, v) -> ir.Constant:
    if dt == dtypes.bool:
      return ir.Constant(ir.IntType(1), int(bool(v)))
    if dt.is_float:
      return ir.Constant(ltype(dt), float(v))
    return ir.Constant(ltype(dt), int(v) & ((1 << (dt.itemsize * 8)) - 1) if v < 0 and dt.kind == "u" else int(v))

  def identity(self, op: ReduceOp, dt: DType):
    return self.const(dt, op.identity(dt))

  def _declare(self, name: str, params: list, sized: bool) -> ir.Function:
    """The kernel's function: a pointer per buffer (none aliasing another), the run's size n_ of a ranged dim where
    a loop runs to it (sized: linearize.takes_runtime_size), then the slice [start, end) of the outermost output loop
    this call runs."""
    i32 = ir.IntType(32)
    ints = [i32] * (3 if sized else 2)
    fn = ir.Function(
      self.module, ir.FunctionType(ir.VoidType(), [mtype(p.dtype).as_pointer() for p in params] + ints), name
    )
    fn.attributes = KernelAttributes()
    fn.attributes.add("nounwind")
    for a in fn.args[: len(params)]:
      a.add_attribute("noalias")
    return fn

  def render_kernel(self, name: str, ast: UOp) -> ir.Function:
    ast = widen_index(ast)
    params = kernel_params(ast)
    i32 = ir.IntType(32)
    sized = takes_runtime_size(ast)
    fn = self._declare(name, params, sized)
    ptr = {p.slot: a for p, a in zip(params, fn.args)}
    start, end = fn.args[-2:]  # the slice of the outermost output loop this call runs
    size = fn.args[-3] if sized else None
    entry = fn.append_basic_block("entry")
    alloca_b = ir.IRBuilder(entry)
    body = fn.append_basic_block("body")
    b = ir.IRBuilder(body)
    vals: dict[UOp, object] = {}
    accs: dict[UOp, object] = {}
    loops: list[_Loop] = []

    def r(u: UOp):
      if u.op is Ops.CONST:
        return self.const(u.dtype, u.arg)
      if u.op is Ops.ACCUMULATE:
        return b.load(accs[u])
      return vals[u]

    def var(u: UOp):
      # the run's size, in the index type asked for (a widened kernel's)
      return size if ltype(u.dtype) == i32 else b.sext(size, ltype(u.dtype))

    def expr(u: UOp):
      # a piece's bound, computed from the values and loops around it
      if u.op is Ops.VAR:
        return var(u)
      return r(u) if u.op is Ops.CONST or u in vals else self.render_value(b, u, expr, ptr)

    def bound(x: int | UOp, it: ir.Type):
      return expr(x) if isinstance(x, UOp) else ir.Constant(it, x)

    # the innermost loop and the one around it in pieces (in_pieces): their instructions are emitted once per piece,
    # the gates a piece keeps constant as their values; pieces bounded by the loops around them stay loops
    pieces = in_pieces(ast, linearize(ast), CORE_SPLIT["llvm"])
    if any(piece is not None and piece.varies for _, _, piece, _ in pieces):
      fn.attributes.add('"no-builtin-memset"')
      fn.attributes.add('"no-builtin-memcpy"')
    for kind, u, piece, known in pieces:
      if kind == "loop":
        it = ltype(u.dtype)
        counter = alloca_b.alloca(it, name=f"r{u.number}")
        outer = is_outer(u)
        # a 64-bit counter (widen_index) still starts and ends where the int arguments say
        lo, hi = (
          (b.sext(x, it) if it != i32 else x for x in (start, end))
          if outer
          else (bound(piece.lo, it), bound(piece.hi, it))
        )
        if u.runtime and not outer:
          # (a loop to a run-time size is never cut in pieces; its extent is an index expression of n_)
          lo, hi = ir.Constant(it, 0), expr(u.extent)
          hi = b.sext(hi, it) if hi.type != it else hi
        loops.append(_Loop.begin(b, u.number, counter, it, lo, hi))
        vals[u] = loops[-1].i
      elif kind == "end":
        loops.pop().end(b)
      elif kind == "acc_init":
        accs[u] = alloca_b.alloca(ltype(u.dtype), name="acc")
        b.store(self.identity(u.reduce_op, u.dtype), accs[u])
      elif kind == "acc_update":
        acc = b.load(accs[u])
        b.store(self.combine(b, u.reduce_op, u.dtype, acc, r(u.src[0])), accs[u])
      elif kind == "store":
        buf, idx, val = u.src
        v = r(val)
        if buf.dtype == dtypes.bool:
          v = b.zext(v, ir.IntType(8))
        b.store(v, b.gep(ptr[buf.slot], [r(idx)], inbounds=True))
      else:
        if u.op is Ops.VAR:
          vals[u] = var(u)
        else:
          vals[u] = self.const(u.dtype, known[u]) if u in known else self.render_value(b, u, r, ptr)
    b.ret_void()
    alloca_b.branch(body)
    return fn

  def combine(self, b, op: ReduceOp, dt: DType, acc, v):
    if op is ReduceOp.SUM:
      return b.fadd(acc, v) if dt.is_float else b.add(acc, v)
    if op is ReduceOp.PROD:
      return b.fmul(acc, v) if dt.is_float else b.mul(acc, v)
    return self.maxmin(b, dt, v, acc, op is ReduceOp.MAX)

  def maxmin(self, b, dt: DType, x, y, is_max: bool):
    # numpy's maximum/minimum propagate NaN: keep x when it is NaN
    if dt.is_float:
      c = b.or_(b.fcmp_ordered(">" if is_max else "<", x, y), b.fcmp_unordered("uno", x, x))
    elif dt.kind == "u" or dt == dtypes.bool:
      c = b.icmp_unsigned(">" if is_max else "<", x, y)
    else:
      c = b.icmp_signed(">" if is_max else "<", x, y)
    return b.select(c, x, y)

  def int_division(self, b, op: Ops, dt: DType, x, y):
    """An integer x / y or x % y whose divisor may be 0 or -1 (linearize.guards_divisor): the division sees 1 instead
    (sdiv and udiv by 0, and sdiv of MIN by -1, are undefined and trap on x86), the results are numpy's."""
    signed, zero = dt.kind == "i", self.const(dt, 0)
    by_zero = b.icmp_unsigned("==", y, zero)
    by_minus_one = b.icmp_unsigned("==", y, self.const(dt, -1)) if signed else None
    safe = b.select(b.or_(by_zero, by_minus_one) if signed else by_zero, self.const(dt, 1), y)
    q = getattr(b, INT_SIGNED[op][not signed])(x, safe)
    if op is Ops.MOD:
      return q  # x % 1: 0, which x % 0 and x % -1 are
    if signed:
      q = b.select(by_minus_one, b.neg(x), q)  # a negation wraps: MIN / -1 is MIN
    return b.select(by_zero, zero, q)

  def cast(self, b, x, src: DType, dst: DType):
    fs, ft = ltype(src), ltype(dst)
    if src == dst:
      return x
    if dst == dtypes.bool:
      return (
        b.fcmp_unordered("!=", x, ir.Constant(fs, 0.0))
        if src.is_float
        else b.icmp_unsigned("!=", x, ir.Constant(fs, 0))
      )
    if src.is_float and dst.is_float:
      return b.fpext(x, ft) if dst.itemsize > src.itemsize else b.fptrunc(x, ft)
    if src.is_float:
      return b.fptoui(x, ft) if dst.kind == "u" else b.fptosi(x, ft)
    unsigned = src.kind in "ub"
    if dst.is_float:
      return b.uitofp(x, ft) if unsigned else b.sitofp(x, ft)
    if ft.width > fs.width:
      return b.zext(x, ft) if unsigned else b.sext(x, ft)
    return b.trunc(x, ft) if ft.width < fs.width else x

  def render_value(self, b, u: UOp, r, ptr):
    op, dt, s = u.op, u.dtype, u.src
    if op is Ops.LOAD:
      return self.load(b, u, r, ptr)
    if op is Ops.CAST:
      return self.cast(b, r(s[0]), s[0].dtype, dt)
    if op is Ops.BITCAST:
      # bool is i1 in registers but a byte in memory, which is what a bitcast reinterprets
      if s[0].dtype == dtypes.bool:
        return b.zext(r(s[0]), ltype(dt))
      if dt == dtypes.bool:
        return b.icmp_unsigned("!=", r(s[0]), ir.Constant(ltype(s[0].dtype), 0))
      return b.bitcast(r(s[0]), ltype(dt))
    xs = [r(x) for x in s]
    if op is Ops.WHERE:
      return b.select(*xs)
    if op in GroupOp.Compare:
      sd = s[0].dtype
      pred = {Ops.CMPLT: "<", Ops.CMPLE: "<=", Ops.CMPEQ: "==", Ops.CMPNE: "!="}[op]
      if sd.is_float:
        return b.fcmp_unordered(pred, *xs) if op is Ops.CMPNE else b.fcmp_ordered(pred, *xs)
      return (b.icmp_unsigned if sd.kind in "ub" else b.icmp_signed)(pred, *xs)
    if op in (Ops.MAX, Ops.MIN):
      return self.maxmin(b, dt, xs[0], xs[1], op is Ops.MAX)
    return self.float_value(b, u, xs) if dt.is_float else self.int_value(b, u, xs)

  def load(self, b, u: UOp, r, ptr):
    buf, idx, gate = u.src
    i = r(idx)
    dt = u.dtype
    gated = not (gate.op is Ops.CONST and gate.arg)
    if not gated:
      v = b.load(b.gep(ptr[buf.slot], [i], inbounds=True))
      return b.trunc(v, ir.IntType(1)) if dt == dtypes.bool else v
    # a gated load is a load under a branch, as C's `gate ? p[i] : 0` is: the loop vectoriser turns it into a masked
    # load of consecutive elements; reading element 0 when the gate is off (a select of the index) made the
    # addresses non-consecutive, gathered one by one (a convolution's padded im2col panel: 1.2x slower than C)
    before, fn = b.block, b.block.function
    load, merge = fn.append_basic_block("gated"), fn.append_basic_block("merged")
    b.cbranch(r(gate), load, merge)
    b.position_at_end(load)
    v = b.load(b.gep(ptr[buf.slot], [i], inbounds=True))
    if dt == dtypes.bool:
      v = b.trunc(v, ir.IntType(1))
    b.branch(merge)
    b.position_at_end(merge)
    phi = b.phi(v.type)
    phi.add_incoming(v, load)
    phi.add_incoming(self.const(dt, 0), before)
    return phi

  def float_value(self, b, u: UOp, xs: list):
    op, dt = u.op, u.dtype
    if op in FLOAT_BINARY:
      return getattr(b, FLOAT_BINARY[op])(*xs)
    if op is Ops.NEG:
      return b.fneg(xs[0])
    if op is Ops.RECIP:
      return b.fdiv(self.const(dt, 1.0), xs[0])
    if op is Ops.IDIV:
      return self._math(b, Ops.TRUNC, dt, b.fdiv(*xs))
    return self._math(b, op, dt, *xs)

  def int_value(self, b, u: UOp, xs: list):
    op, dt, s = u.op, u.dtype, u.src
    if guards_divisor(u):
      return self.int_division(b, op, dt, *xs)
    unsigned = dt.kind in "ub"
    # index arithmetic never wraps (a kernel where it could in 32 bits indexes in 64: linearize.widen_index): saying
    # so lets LLVM see consecutive addresses
    nsw = ["nsw"] if dt in (dtypes.index, dtypes.index64) else []
    if op in INT_WRAPPING:
      return getattr(b, INT_WRAPPING[op])(*xs, flags=nsw)
    if op in INT_BINARY:
      return getattr(b, INT_BINARY[op])(*xs)
    if op in INT_SIGNED:
      return getattr(b, INT_SIGNED[op][unsigned])(*xs)
    if op is Ops.NEG:
      return b.not_(xs[0]) if dt == dtypes.bool else b.neg(xs[0])
    if op is Ops.NOT:
      return b.not_(xs[0])
    if op is Ops.ABS:
      return b.select(b.icmp_signed("<", xs[0], self.const(dt, 0)), b.neg(xs[0]), xs[0]) if not unsigned else xs[0]
    if op is Ops.POW:
      f = self._math(
        b,
        Ops.POW,
        dtypes.float64,
        self.cast(b, xs[0], dt, dtypes.float64),
        self.cast(b, xs[1], s[1].dtype, dtypes.float64),
      )
      return self.cast(b, f, dtypes.float64, dt)
    if op in (Ops.FLOOR, Ops.CEIL, Ops.ROUND, Ops.TRUNC):
      return xs[0]
    raise NotImplementedError(f"LLVM renderer: no rule for {op.name} on {dt.name}")


def module_text(module: ir.Module) -> str:
  # only the C API is exported, as in the C target (llvmlite does not print a function's visibility itself)
  return re.sub(r"^define void @", "define hidden void @", str(module), flags=re.M)


def host_target() -> tuple[str, str, str]:
  """(triple, cpu, features) of this machine."""
  llvm.initialize_native_target()
  llvm.initialize_native_asmprinter()
  return llvm.get_default_triple(), llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten()


@dataclass(frozen=True)
class ObjectTarget:
  """What an LLVM module is compiled for: the triple, and the CPU and features NAME_create checks (aot/cpu.py)."""

  triple: str
  cpu: str
  features: str


def object_target(triple: str | None = None, cpu: str = "native") -> ObjectTarget:
  """The target of triple (default: this machine) and cpu, checked: an x86-64-v3 or armv8.2-a+dotprod becomes a
  feature list."""
  llvm.initialize_all_targets()
  host_triple = host_target()[0]
  triple = triple or host_triple
  if cpu == "native" and triple != host_triple:
    raise InvalidValueError(f"--cpu native means this machine; name a CPU for {triple} (e.g. generic)")
  machine = llvm_machine(cpu, None if triple == host_triple else triple)
  features = machine.features
  # strided reads (a weight read across output columns) vectorised as gathers are slower than scalar loads here
  if triple.startswith("x86_64"):
    features = ",".join(f for f in (features, "+prefer-no-gather", "+prefer-no-scatter") if f)
  try:
    llvm.Target.from_triple(triple)
  except RuntimeError as e:
    raise InvalidValueError(f"LLVM has no target for triple {triple!r}: {e}") from None
  return ObjectTarget(triple, machine.cpu, features)


def object_command(src: Path, out: Path, target: ObjectTarget) -> list[str]:
  """The command compiling the module in src to the object out, in a process of its own (llvm_object.py)."""
  return [sys.executable, llvm_object.__file__, str(src), str(out), target.triple, target.cpu, target.features]
