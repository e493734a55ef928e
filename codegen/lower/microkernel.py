"""Contractions on the runtime's float microkernel (runtime_c/aot_gemm.c): the lowering of a kernel whose
contractions codegen/lower/contract.py found, and the call that runs one of them (GemmCall)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from aot.codegen.lower.calls import Call, CallContext, CallInfo, Lowered, copies_in_place, distinct_bytes, globals_read
from aot.codegen.lower.contract import STEP_MUL_ADD, STEP_OPS, Gemm
from aot.codegen.render.linearize import kernel_params, takes_runtime_size
from aot.core.ir import Ops, UOp, prod
from aot.scheduler.kernel import Buffer


def gemm_task_work(g: Gemm) -> list[int]:
  """The multiply-adds of each of a contraction's tasks (Gemm.tasks) in the order aot_gemm_run hands them out
  (runtime_c/aot_gemm.c: m blocks innermost, or a panel's row tiles): the blocks at the edges are smaller."""
  c, (mc, nc) = g.c, g.block
  M, N = c.a.size, c.N
  cols = [min(nc, N - n0) for n0 in range(0, N, nc)]
  step = mc if g.b.pack is None else g.tile[0]
  rows = [min(step, M - m0) for m0 in range(0, M, step)]
  return [m * n * c.K for _ in range(c.B) for n in cols for m in rows]


# the steps of k the microkernel prefetches B ahead when it streams it (runtime_c/aot_gemm.c STREAM_AHEAD)
STREAM_AHEAD = 64


def streams_b(g: Gemm) -> bool:
  """Does the microkernel prefetch B ahead (runtime_c/aot_gemm.c STREAM_AHEAD)? Where it reads B in place (packed
  weights, a view), which may come from memory as it goes: ResNet-18's swapped 7x7 convolutions (9.4 MB of weights as
  B) 2.72 -> 2.34 ms each, the model 2.6% faster, the BERT-like encoder 4-6%, the other models as fast (1 thread,
  interleaved). Not a B packed in panels or copied whole just before, which is in cache (panels: 4% slower with it),
  nor one whose K is no longer than the prefetch's reach, which would only fetch past the tile: ResNet-50's 1x1
  expansions (K = 64) ran 0.96 of its time without it, MobileNetV2's (K 16-64) 0.97-0.99, 1 and 2 threads."""
  return g.b.pack is None and g.b.dense is None and g.c.K > STREAM_AHEAD


def render_steps(steps, contract: bool, arg) -> str:
  """The fused epilogue's steps (contract.Step) as an array s on the stack that a runtime call's struct points to (its
  steps and nsteps: aot_gemm's, aot_depthwise's), "" for none; arg(slot) is a buffer's pointer. On the c target
  (contract) a multiply feeding an add is MUL_ADD: one expression, contracted where the kernel's would be."""
  if not steps:
    return ""
  ops = [STEP_OPS[s.op] for s in steps]
  if contract:
    for i, (s, t) in enumerate(zip(steps, steps[1:])):
      if s.op is Ops.MUL and t.op is Ops.ADD:
        ops[i] = STEP_MUL_ADD

  def step(s, op: int) -> str:
    where = "NULL" if s.slot is None else f"{arg(s.slot)} + {s.offset}"
    return f"{{{op}, {int(s.swapped)}, {float(s.value).hex()}f, {where}, {', '.join(map(str, s.strides))}}}"

  return f"aot_gemm_step s[] = {{{', '.join(step(s, op) for s, op in zip(steps, ops))}}}; "


def _rows_of(x, M: int, row: int, bound: int) -> bool:
  """Is an item stride x (run_dims.item_stride's: an int, or Rows of a dim run to a size given at run time) M rows
  of row elements? Rows are, where M is that dim at its bound, bound: rows then run on from item to item."""
  if isinstance(x, int):
    return x == M * row and not (bound and M == bound)
  return bool(bound) and M == bound and x.inner == row


@dataclass(frozen=True)
class ItemFold:
  """A contraction run once for all items of a ranged dim (codegen/render/run_dims.py), n_ of them at run time: their
  rows one after another in A and C (rows: M becomes n_ * M, B shared), or as the gemm's batch; with the strides of
  A, B and each step that say so (aot_operand's, aot_gemm_step's)."""

  rows: bool
  a: tuple[int, ...]
  b: tuple[int, ...]
  steps: tuple[tuple[int, int, int], ...] = ()


@dataclass(kw_only=True)
class GemmCall(Call):
  """A contraction run by the runtime's microkernel (codegen/lower/contract.py) over the kernel's buffers."""

  gemm: Gemm
  bufs: list[Buffer]  # the kernel's buffers by slot
  # the function packing B's panels (Operand.pack) and its arguments [(slot, buffer)], slot 0 being the panel
  pack: tuple[str, list] | None = None
  # the kernels are C (the c target): the fused epilogue's multiply-adds are contracted where the C compiler would
  contract: bool = False
  # run once for all items of a ranged dim (fold), split across the pool from this much work (0: the model does not
  # run on the pool: CallContext.threads, min_work)
  items: ItemFold | None = None
  split_work: int = 0
  # the bound of a dim run to a size given at run time (aot/scheduler/runtime_extent.py; 0: none): an M, N or K of
  # that size is n_, C's rows and batches kept as far apart as at the bound
  bound: int = 0
  # the dim's sizes at the bound -> their forms in the run's (CallContext.sizes): an M, N or K of one is its form of e_
  sizes: dict = field(default_factory=dict)
  pack_sized: bool = False

  def _size_arg(self) -> list[str]:
    return ["(void *)(intptr_t)e_"] if self.pack_sized else []

  @property
  def tasks(self) -> int:
    return self.gemm.tasks

  def fold(self, item) -> GemmCall | None:
    """This call over all n_ items at once (ItemFold), None where they cannot: item(buffer) is the elements from one
    item of a buffer to the next (None: one buffer all items share)."""
    g, c = self.gemm, self.gemm.c
    # (a B packed panel by panel is packed inside the tasks, from one item's buffers)
    ca, cb, cc = (item(self.bufs[s]) if s is not None else None for s in (g.a.slot, g.b.slot, g.result))
    ldc = g.ldc or c.b.size
    M = c.a.size
    rows_of = lambda x, row: _rows_of(x, M, row, self.bound)
    if c.B != 1 or self.pack is not None or g.a.pack is not None or cc is None or not rows_of(cc, ldc):
      return None
    ca, cb = (None if o.pack is not None else x for o, x in ((g.a, ca), (g.b, cb)))
    steps = [item(self.bufs[st.slot]) if st.slot is not None else None for st in g.steps]
    _, tile, row, k = g.a.strides
    # rows: A's rows evenly apart across its tiles and items (one row's stride is the item's), B and the steps'
    # per-row operands shared
    row = row if M > 1 else ca or 0
    step_m = [st.strides[1] if M > 1 or x is None else x for st, x in zip(g.steps, steps)]
    if (
      ca is not None
      and cb is None
      and not g.a.padded
      and (M == 1 or tile == g.tile[0] * row)
      and rows_of(ca, row)
      and all((x is None and m == 0) or (x is not None and rows_of(x, m)) for x, m in zip(steps, step_m))
    ):
      folded = [(st.strides[0], m, st.strides[2]) for st, m in zip(g.steps, step_m)]
      return replace(self, items=ItemFold(True, (g.a.strides[0], g.tile[0] * row, row, k), g.b.strides, tuple(folded)))
    # (items e_ rows apart run as the gemm's batch only at the bound: a stride of Rows is no constant)
    if any(not isinstance(x, (int, type(None))) for x in (ca, cb, *steps)) or self.bound == M:
      return None
    batch = lambda x, strides: (x or 0, *strides[1:])
    steps = tuple(batch(x, st.strides) for st, x in zip(g.steps, steps))
    return replace(self, items=ItemFold(False, batch(ca, g.a.strides), batch(cb, g.b.strides), steps))

  def describe(self, kernel: str) -> CallInfo:
    g, c = self.gemm, self.gemm.c
    # a B packed in panels is read from the buffers its pack kernel reads
    slots = [s for o in (g.a, g.b) if o.pack is None for s in [o.slot]] + [g.result]
    slots += [s for s, _ in self.pack[1] if s != 0] if self.pack else []
    return CallInfo(
      kernel,
      "aot_gemm_run",
      self.role,
      "microkernel",
      2 * c.B * c.a.size * c.b.size * c.K,
      distinct_bytes(self.bufs[s] for s in slots),
      [c.B, c.a.size, c.b.size, c.K],
      self.parallel,
      g.tasks,
      gemm_task_work(g),
    )

  def _size(self, ranges) -> str:
    """M, N or K: at a run's size, the form of its range to one (stage.py _runtime_sized) times the rest's sizes."""
    sized = next((r for r in ranges if r.runtime), None)
    if sized is None:
      return str(prod(r.size for r in ranges))
    rest = prod(r.size for r in ranges if r is not sized)
    return self.sizes[sized.size].c("(int)e_") + (f" * {rest}" if rest > 1 else "")

  def render(self, arg, tramps: dict) -> str:
    g, c, f = self.gemm, self.gemm.c, self.items
    batch, rows, depth = str(c.B), self._size(c.a.rows), self._size(c.k)
    # (a window read from a padded copy: the microkernel's columns, Contraction.N)
    cols = str(c.N) if c.window is not None else self._size(c.b.rows)
    if f is not None:
      batch, rows = ("1", f"(int)n_ * {rows}") if f.rows else ("(int)n_", rows)
    sized = any(r.runtime for r in (*c.a.rows, *c.b.rows, *c.k))

    def operand(o, strides) -> str:
      where = "NULL" if o.pack is not None else f"{arg(self.bufs[o.slot], o.slot)} + {o.offset}"
      return f"{{{where}, {', '.join(map(str, strides))}, {int(o.padded)}}}"

    # a panel of compact columns (columns.CompactPanel) holds its rows' columns at the run's size, its row stride
    # those in whole tiles (a run with none of them: no tasks)
    nc, b_strides, local = str(g.block[1]), f.b if f else g.b.strides, ""
    if (panel := g.b.compact) is not None:
      size, R = self.sizes[panel.bound].c("(int)e_"), g.tile[1]
      local = panel.columns_c(size) + " "
      nc, b_strides = "(nc_ > 0 ? nc_ : 1)", (*b_strides[:3], f"(nc_ + {R - 1}) / {R} * {R}")
    desc = (
      f"{batch}, {rows}, {cols}, {depth}, {g.tile[0]}, {g.tile[1]}, {g.block[0]}, {nc}, "
      f"{operand(g.a, f.a if f else g.a.strides)}, {operand(g.b, b_strides)}, "
      f"(float *){arg(self.bufs[g.result], g.result)} + {g.result_offset}, 0"
    )
    gsteps = g.steps if f is None else [replace(st, strides=x) for st, x in zip(g.steps, f.steps)]
    steps = local + render_steps(gsteps, self.contract, lambda slot: arg(self.bufs[slot], slot))
    tail = f", .steps = s, .nsteps = {len(g.steps)}" if g.steps else ""
    # C's rows as far apart as the output's (a last-axis concat's branch written in place)
    tail += f", .ldc = {g.ldc}" if g.ldc else ""
    tail += ", .stream_b = 1" if streams_b(g) else ""
    if c.window is not None:
      # a window's taps, read in place from a padded copy of the input (PaddedCopy.koff), in rows of columns wide, of
      # which C has the first OW, its rows as far apart as its own (N is the microkernel's columns, wide per row)
      steps = f"static const int k_[] = {{{', '.join(map(str, c.window.koff))}}}; " + steps
      tail += f", .koff = k_, .wide = {c.window.wide}, .narrow = {c.window.narrow}"
      tail += "" if g.ldc else f", .ldc = {c.b.size}"
    if sized:
      # (at a run-time size C's rows and batches lie as at the bound, not n_ apart)
      # (compact columns, contract.Contraction.compact: C's rows a run's columns apart)
      ldc = g.ldc or (cols if c.compact else c.b.size)
      ldcb = c.a.size * ldc if isinstance(ldc, int) else f"{c.a.size} * ({ldc})"
      tail += ("" if g.ldc else f", .ldc = {ldc}") + f", .ldcb = {ldcb}"
    split = "aot_parallel(m->pool, aot_gemm_run, &g, aot_gemm_tasks(&g))"
    if self.pack is None:
      run = split if self.parallel else "aot_gemm_run(&g, 0, aot_gemm_tasks(&g))"
      if f is not None and self.split_work and not self.parallel:
        # the items' work decides, at run time, as CallContext.parallel decides at compile time
        work = c.a.size * c.b.size * c.K
        run = f"if ((int64_t)n_ * {work} >= {self.split_work} && aot_gemm_tasks(&g) > 1) {split}; else {run}"
      return f"  {{ {steps}aot_gemm g = {{{desc}{tail}}}; {run}; }}"
    # the pack kernel is called over one panel [i, i + 1) with the thread's buffer as its slot 0
    fn, fargs = self.pack
    if fn not in tramps:
      unpack = ["panel" if s == 0 else f"(const {b.dtype.cname} *)a[{i}]" for i, (s, b) in enumerate(fargs)]
      # (a pack running a loop to a run-time size takes it after its pointers: LoopCall's n_)
      unpack += [f"(int)(intptr_t)a[{len(fargs)}]"] if self.pack_sized else []
      tramps[fn] = (
        f"static void pack_{fn}(void *c, float *panel, int i) {{ void **a = c; {fn}({', '.join(unpack)}, i, i + 1); }}"
      )
    ptrs = ", ".join(["NULL" if s == 0 else f"(void *){arg(b, s)}" for s, b in fargs] + self._size_arg())
    desc += f", pack_{fn}, a, m->panels, PANEL_FLOATS"
    # one slice per thread: the slice's start is the thread, whose panel buffer it packs into
    if self.parallel:
      tail += ", .slices = aot_pool_threads(m->pool)"
    run = "aot_parallel(m->pool, aot_gemm_run, &g, g.slices)" if self.parallel else "aot_gemm_run(&g, 0, 1)"
    return f"  {{ void *a[] = {{{ptrs}}}; {steps}aot_gemm g = {{{desc}{tail}}}; {run}; }}"


@dataclass
class GemmLowered(Lowered):
  """A kernel whose contractions run on the microkernel: each after the dense copies of its operands, then the
  epilogue pieces the microkernel did not apply to its tiles (Gemm.steps) nor leave done in place."""

  gemms: list[Gemm]

  runtime_sources = {"aot_gemm.c": ("aot_gemm_run", "aot_gemm_tasks")}

  def functions(self) -> dict[UOp, str]:
    names = super().functions()
    for i, g in enumerate(self.gemms):
      for side, o in zip("ab", (g.a, g.b)):
        if o.dense is not None:
          names.setdefault(o.dense, f"_dense{i}{side}")
        if o.pack is not None:
          names.setdefault(o.pack, f"_pack{i}{side}")
    return names

  def reads(self) -> set[int]:
    asts = [x for g in self.gemms for o in (g.a, g.b) for x in (o.dense, o.pack) if x is not None]
    # an operand the microkernel reads where it lies
    return super().reads() | globals_read(asts) | {o.slot for g in self.gemms for o in (g.a, g.b) if o.pack is None}

  def panel_floats(self) -> int:
    # (a padded copy's panel: PaddedCopy.floats)
    return max([g.c.window.floats if g.c.window else g.c.K * g.b.panel[1] for g in self.gemms], default=0)

  def calls(self, ctx: CallContext) -> list[Call]:
    bufs, calls = self.kernel.bufs, []
    for g in self.gemms:
      calls += [ctx.loop(o.dense, bufs, bufs[o.slot], "operand") for o in (g.a, g.b) if o.dense is not None]
      work = g.c.B * g.c.a.size * g.c.b.size * g.c.K
      pack, pack_sized = None, False
      if g.b.pack is not None:
        # B's panels are packed inside the gemm's tasks: the pack kernel is not a call of its own
        ast = ctx.optimized[g.b.pack]
        pack = (ctx.functions[ast], [(u.arg, None if u.arg == 0 else bufs[u.arg]) for u in kernel_params(ast)])
        pack_sized = takes_runtime_size(ast)
      parallel = ctx.parallel(g.tasks, work)
      calls.append(
        GemmCall(
          gemm=g,
          bufs=bufs,
          pack=pack,
          contract=ctx.target == "c",
          role="contraction",
          parallel=parallel,
          split_work=ctx.min_work if ctx.threads else 0,
          bound=ctx.bound,
          sizes=ctx.sizes,
          pack_sized=pack_sized,
        )
      )
    # an epilogue that only reads back what the microkernel wrote in place (a bare matmul or conv), or that the
    # microkernel applied to its tiles (Gemm.steps), is not run
    for last in self.pieces:
      if not (copies_in_place(last) or any(g.epilogue is last for g in self.gemms)):
        calls.append(ctx.loop(last, bufs, bufs[0], "epilogue", rebase=True))
    return calls
