"""Contractions to packed matrix multiplies: the rewrite that makes matmul- and conv-like kernels fast on the CPU.

A contraction is a sum over k of a product of two operands, acc[b, m, n] = sum_k A[b, m, k] * B[b, n, k], where A
varies only with (batch, m, k) and B only with (batch, n, k): a matmul, a convolution (k = input channel and window,
n = output position, m = output channel), attention's batched products. Such an accumulator is computed by the
runtime's microkernel (runtime_c/aot_gemm.c) into a scratch matrix, and the kernel around it (bias, batch norm,
residual add, activation, pooling) becomes an epilogue kernel that reads that matrix instead of summing.

Each operand reaches the microkernel in one of three forms (strides in the runtime's aot_operand):
- a constant (weights, possibly through index arithmetic and padding) is evaluated and packed at compile time in
  tiles ([tiles][K][R], R the tile's rows), which the inner loop reads contiguously: constants cost nothing to
  reorder ahead of time;
- a runtime operand that is a plain strided view of a buffer (a matmul's input, a 1x1 convolution's input) is read
  where it lies;
- any other runtime operand (a convolution's window with its padding gates, a transposed view B would read across
  its lanes) is first written out as a dense matrix by a generated kernel (im2col, for a convolution), with the loops
  ordered so that it reads and writes contiguously.

n is the side that holds the kernel's innermost output loop, so the microkernel's vector lanes run along the axis the
epilogue writes contiguously."""
from __future__ import annotations
from dataclasses import dataclass
import numpy as np
from aot.dtype import dtypes
from aot.ir import UOp, Ops, ReduceOp, prod
from aot.interpret import NP_ALU
from aot.rewrite import substitute, graph_rewrite
from aot.symbolic import pm_simplify, linear

# a contraction smaller than this (multiply-adds) is not worth a call into the microkernel and its packing
MIN_WORK = 1 << 15
# a reduction shorter than this is mostly packing overhead
MIN_K = 8
# tasks a contraction is split into at least (when it is big enough): threads take them as they finish the last, so
# a few per thread keep them balanced
MIN_TASKS = 32
# swap the operands when the fraction of the microkernel's tiles they fill grows by more than this over K (the swap
# costs the epilogue a pass over the result read across its loops, which a long reduction hides): measured on
# ResNet's 7x7 layers (K >= 2304: faster) and a 14x14 1x1 conv (K = 256: slower)
SWAP_GAIN = 100
# an outermost loop shorter than this splits unevenly across threads
MIN_SPLIT = 16
# block sizes in tiles: a B block (KC x nc floats per K slice) and the A tiles passing over it stay in L2
NC_TILES, MC_TILES = 4, 32

def gemm_tile(cpu: str, triple: str | None) -> tuple[int, int]:
  """(MR, NR) of the microkernel to use: 8x32 where 16-float vectors exist (AVX-512), else 6x16."""
  if triple is not None and not triple.startswith("x86_64"): return (6, 16)
  if cpu == "native":
    from llvmlite import binding as llvm
    return (8, 32) if "+avx512f" in llvm.get_host_cpu_features().flatten() else (6, 16)
  wide = ("avx512", "x86-64-v4", "znver4", "znver5", "sapphirerapids", "icelake", "tigerlake", "cascadelake", "cooperlake")
  return (8, 32) if any(w in cpu for w in wide) else (6, 16)

@dataclass(frozen=True)
class Side:
  expr: UOp                    # the operand's value, a function of (batch, rows, k) ranges
  rows: tuple[UOp, ...]        # its own free ranges (m for A, n for B), outer first
  @property
  def size(self) -> int: return prod(r.arg[1] for r in self.rows)

@dataclass(frozen=True)
class Contraction:
  acc: UOp
  batch: tuple[UOp, ...]
  k: tuple[UOp, ...]
  a: Side
  b: Side
  @property
  def B(self) -> int: return prod(r.arg[1] for r in self.batch)
  @property
  def K(self) -> int: return prod(r.arg[1] for r in self.k)

def _ranges(u: UOp) -> set[UOp]: return {r for r in u.toposort() if r.op is Ops.RANGE}

def _tile_use(m: int, n: int, tile: tuple[int, int]) -> float:
  """The fraction of the microkernel's tiles that holds real rows and columns (the rest is padding)."""
  return m / (-(-m // tile[0]) * tile[0]) * n / (-(-n // tile[1]) * tile[1])

def find_contractions(ast: UOp, tile: tuple[int, int]) -> list[Contraction]:
  """The float32 sum-of-products accumulators of a kernel whose operands separate into (batch, m, k) x (batch, n, k)."""
  found = []
  for acc in ast.toposort():
    if acc.op is not Ops.ACCUMULATE or acc.arg is not ReduceOp.SUM or acc.dtype != dtypes.float32: continue
    prod_ = acc.src[0]
    if prod_.op is not Ops.MUL or any(s.dtype != dtypes.float32 for s in prod_.src): continue
    x, y = prod_.src
    # an operand that sums itself, or reads the kernel's own output, stays in the generic loops
    if any(u.op is Ops.ACCUMULATE or (u.op is Ops.DEFINE_GLOBAL and u.arg == 0) for s in (x, y) for u in s.toposort()): continue
    k = tuple(acc.src[1:])
    dx, dy = _ranges(x) - set(k), _ranges(y) - set(k)
    batch = tuple(sorted(dx & dy, key=lambda r: r.arg[0]))
    mx, ny = dx - set(batch), dy - set(batch)
    if not mx | ny: continue
    # the side holding the innermost output loop is n: the microkernel's vector lanes run along it
    if max(mx | ny, key=lambda r: r.arg[0]) in mx: (x, mx), (y, ny) = (y, ny), (x, mx)
    # ... unless the other way round wastes fewer lanes on padding (a 7x7 image's 49 positions fill two 32-lane tiles
    # to 77%, 512 channels fill them all), by enough to pay for the epilogue reading the result across its loops
    size = lambda rs: prod(r.arg[1] for r in rs)
    gain = _tile_use(size(ny), size(mx), tile) - _tile_use(size(mx), size(ny), tile)
    if gain * prod(r.arg[1] for r in k) > SWAP_GAIN:
      (x, mx), (y, ny) = (y, ny), (x, mx)
    c = Contraction(acc, batch, k, Side(x, tuple(sorted(mx, key=lambda r: r.arg[0]))),
                    Side(y, tuple(sorted(ny, key=lambda r: r.arg[0]))))
    if c.K >= MIN_K and c.B * c.a.size * c.b.size * c.K >= MIN_WORK: found.append(c)
  return found

def _flat(ranges) -> UOp:
  """The row-major flat index of ranges (outer first)."""
  out, stride = UOp.const(dtypes.index, 0), 1
  for r in reversed(ranges):
    out, stride = r * stride + out, stride * r.arg[1]
  return out

def _unflat(flat: UOp, ranges) -> dict[UOp, UOp]:
  """Each range's value at a flat index; the modulo keeps the outermost in bounds past the end (padding rows)."""
  out, stride = {}, 1
  for r in reversed(ranges):
    out[r] = (flat // stride) % r.arg[1]
    stride *= r.arg[1]
  return out

def dense_operand(c: Contraction, side: Side, is_b: bool, rows: int) -> UOp:
  """A kernel writing a runtime operand out as a dense row-major matrix: A as [batch][rows][k], B as [batch][k][rows]
  (n contiguous, as the microkernel's vector loads want it), rows padded to whole tiles (left unwritten)."""
  # B's rows are written whole (n innermost: contiguous writes, reads along a convolution's rows), except that a k
  # too short to split across threads (an RGB input's 3 channels) goes inside n's outer ranges
  if not is_b: order = [*c.batch, *side.rows, *c.k]
  elif c.k[0].arg[1] < MIN_SPLIT: order = [*c.batch, *side.rows[:-1], *c.k, *side.rows[-1:]]
  else: order = [*c.batch, *c.k, *side.rows]
  fresh = {r: UOp(Ops.RANGE, dtypes.index, (), (i, r.arg[1], "loop")) for i, r in enumerate(order)}
  batch, own, k = (_flat([fresh[r] for r in g]) for g in (c.batch, side.rows, c.k))
  idx = (batch * c.K + k) * rows + own if is_b else (batch * rows + own) * c.K + k
  store = UOp(Ops.STORE, dtypes.void, (UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), 0), idx, substitute(side.expr, fresh)))
  return graph_rewrite(store, pm_simplify)

def _view(side: Side, c: Contraction) -> tuple[int, int, tuple[int, int, int]] | None:
  """(slot, offset, (batch, row, k) strides) when the operand is a plain load of a buffer at an index linear in each
  group of ranges flattened (so it can be read where it lies), else None."""
  x = side.expr
  if x.op is not Ops.LOAD or not (x.src[2].op is Ops.CONST and x.src[2].arg): return None
  terms, offset = linear(x.src[1])
  if offset < 0 or any(t.op is not Ops.RANGE for t in terms): return None
  strides = []
  for group in (c.batch, side.rows, c.k):
    inner = terms.get(group[-1], 0) if group else 0
    size = 1
    for r in reversed(group):
      if terms.get(r, 0) != inner * size: return None
      size *= r.arg[1]
    strides.append(inner)
  return x.src[0].arg, offset, tuple(strides)

def result_index(c: Contraction) -> UOp:
  """Where acc[batch, m, n] lies in the result matrix C[batch][m][n]."""
  return (_flat(c.batch) * c.a.size + _flat(c.a.rows)) * c.b.size + _flat(c.b.rows)

def epilogue_kernel(ast: UOp, results: dict[UOp, tuple[Contraction, int]]) -> UOp:
  """The kernel with each contraction's accumulator read from its result matrix (a new slot, or the output)."""
  true = UOp.const(dtypes.bool, True)
  # in place, the read is at the store's own index node: the same address in the same form, which the C and LLVM
  # vectorisers need to see (an equal index built differently got a runtime overlap check that always failed, and
  # ran the scalar loop: 3x slower on a 128x112x112 batch norm + ReLU6)
  index = lambda c, slot: ast.src[1] if slot == 0 and ast.op is Ops.STORE else result_index(c)
  loads = {c.acc: UOp(Ops.LOAD, dtypes.float32, (UOp(Ops.DEFINE_GLOBAL, dtypes.float32, (), slot), index(c, slot), true))
           for c, slot in results.values()}
  return graph_rewrite(substitute(ast, loads), pm_simplify)

def evaluate_operand(c: Contraction, side: Side, tile: int, data: dict[int, np.ndarray]) -> np.ndarray:
  """A constant operand evaluated over its whole (batch, rows, k) grid with numpy and packed as
  [batch][tiles][K][tile], zero-padded: what the microkernel reads in place of a pack kernel's output."""
  axes = list(c.batch) + list(side.rows) + list(c.k)
  shape = tuple(r.arg[1] for r in axes)
  vals: dict[UOp, np.ndarray] = {}
  with np.errstate(all="ignore"):
    for u in side.expr.toposort():
      if u.op is Ops.RANGE:
        vals[u] = np.arange(u.arg[1], dtype=np.int64).reshape([-1 if a is u else 1 for a in axes])
      elif u.op is Ops.CONST: vals[u] = np.array(u.arg, dtype=np.int64 if u.dtype == dtypes.index else u.dtype.np)
      elif u.op is Ops.DEFINE_GLOBAL: continue
      elif u.op is Ops.LOAD:
        flat, idx, gate = data[u.src[0].arg].reshape(-1), vals[u.src[1]], vals[u.src[2]]
        vals[u] = np.where(gate, flat[np.where(gate, idx, 0)], np.zeros((), flat.dtype))
      elif u.op is Ops.CAST: vals[u] = vals[u.src[0]].astype(u.dtype.np)
      elif u.op in NP_ALU:
        dt = np.int64 if u.dtype == dtypes.index else u.dtype.np
        vals[u] = np.asarray(NP_ALU[u.op](*[vals[s] for s in u.src])).astype(dt, copy=False)
      else: raise NotImplementedError(f"cannot evaluate {u.op.name} in a constant operand")
  grid = np.broadcast_to(vals[side.expr], shape).reshape(c.B, side.size, c.K).astype(np.float32)
  tiles = -(-side.size // tile)
  padded = np.zeros((c.B, tiles * tile, c.K), np.float32)
  padded[:, :side.size] = grid
  return np.ascontiguousarray(padded.reshape(c.B, tiles, tile, c.K).transpose(0, 1, 3, 2))

def blocks(c: Contraction, mr: int, nr: int) -> tuple[int, int]:
  """(mc, nc): rows of A and columns of B one task computes, shrunk until there are MIN_TASKS tasks when possible."""
  up = lambda n, t: -(-n // t) * t
  mc, nc = min(up(c.a.size, mr), MC_TILES * mr), min(up(c.b.size, nr), NC_TILES * nr)
  tasks = lambda: c.B * -(-c.a.size // mc) * -(-c.b.size // nc)
  while tasks() < MIN_TASKS and mc > mr: mc = up(mc // 2, mr)
  while tasks() < MIN_TASKS and nc > nr: nc = up(nc // 2, nr)
  return mc, nc

@dataclass
class Operand:
  """How the runtime reads an operand: a buffer slot, an offset into it and aot_operand's strides (batch, tile, row,
  k), and the kernel that writes that buffer first when it is a dense copy."""
  slot: int
  offset: int
  strides: tuple[int, int, int, int]
  padded: bool                 # whole tiles may be read past the last row
  dense: UOp | None = None

@dataclass
class Gemm:
  """One contraction as the runtime computes it: sizes, tiles and blocks, its operands, its result's slot."""
  c: Contraction
  tile: tuple[int, int]
  block: tuple[int, int]
  a: Operand
  b: Operand
  result: int                             # slot of the matrix C[batch][m][n]: a scratch buffer, or the output
  @property
  def tasks(self) -> int:
    c, (mc, nc) = self.c, self.block
    return c.B * -(-c.a.size // mc) * -(-c.b.size // nc)

def _operand(c: Contraction, side: Side, is_b: bool, R: int, bufs: list, new_slot, make_buffer) -> Operand:
  """The cheapest form of one operand (module docstring): packed constant, view, or dense copy."""
  slots = {u.src[0].arg for u in side.expr.toposort() if u.op is Ops.LOAD}
  if all(bufs[s].kind == "const" for s in slots):
    packed = evaluate_operand(c, side, R, {s: bufs[s].data for s in slots})
    return Operand(new_slot(make_buffer("const", packed)), 0, (packed[0].size, c.K * R, 1, R), True)
  # B's lanes must be contiguous: a view of B needs row stride 1
  if (view := _view(side, c)) is not None and (not is_b or view[2][1] == 1):
    slot, offset, (sb, sr, sk) = view
    return Operand(slot, offset, (sb, R * sr, sr, sk), False)
  # rows padded to whole tiles, so the microkernel reads edge tiles in place
  rows, K = -(-side.size // R) * R, c.K
  slot = new_slot(make_buffer("scratch", c.B * rows * K))
  return Operand(slot, 0, (rows * K, R, 1, rows) if is_b else (rows * K, R * K, K, 1), True,
                 dense_operand(c, side, is_b, rows))

def lower_contractions(ast: UOp, bufs: list, tile: tuple[int, int], make_buffer) -> tuple[UOp, list, list[Gemm]]:
  """(the kernel that runs last, the kernel's buffers with new slots appended, its gemms). make_buffer(kind, array or
  size) makes a constant buffer holding an array, or a float32 scratch buffer of a size."""
  found = find_contractions(ast, tile)
  if not found: return ast, bufs, []
  bufs, gemms, results = list(bufs), [], {}
  def new_slot(b) -> int: bufs.append(b); return len(bufs) - 1
  for c in found:
    mr, nr = tile
    a = _operand(c, c.a, False, mr, bufs, new_slot, make_buffer)
    b = _operand(c, c.b, True, nr, bufs, new_slot, make_buffer)
    # the output itself holds C when the kernel writes each element where C has it: the epilogue then reads and writes
    # in place, and no scratch matrix is needed
    in_place = (ast.op is Ops.STORE and bufs[0].dtype == dtypes.float32 and not results and
                linear(graph_rewrite(result_index(c), pm_simplify)) == linear(ast.src[1]))
    results[c.acc] = (c, 0 if in_place else new_slot(make_buffer("scratch", c.B * c.a.size * c.b.size)))
    gemms.append(Gemm(c, tile, blocks(c, mr, nr), a, b, results[c.acc][1]))
  return epilogue_kernel(ast, results), bufs, gemms
