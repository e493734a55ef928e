"""The window geometry the runtime's depthwise kernel, 8-bit pool and 8-bit im2col share (the plane, window, stride,
padding and output fields of aot_depthwise, aot_qpool and aot_qim2col), and how it is read off a kernel's gates."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from aot.core.interpret import evaluate_grid
from aot.core.ir import Ops, UOp, ranges_of


@dataclass(frozen=True)
class Window:
  """A KH x KW window at strides (SH, SW) over H x W planes padded by PH rows above and PW columns left, giving
  OH x OW outputs (no dilation: each tap is one step from the next)."""

  H: int
  W: int
  KH: int
  KW: int
  SH: int
  SW: int
  PH: int
  PW: int
  OH: int
  OW: int
  # dilation: tap (kh, kw) at (kh * DH, kw * DW) (only the depthwise kernel takes one other than 1)
  DH: int = 1
  DW: int = 1

  @property
  def taps(self) -> int:
    """The window's taps over one plane's outputs."""
    return self.OH * self.OW * self.KH * self.KW

  def c_fields(self) -> str:
    """H, W, KH, KW, SH, SW, PH, PW as the C descriptors list them."""
    return f"{self.H}, {self.W}, {self.KH}, {self.KW}, {self.SH}, {self.SW}, {self.PH}, {self.PW}"


def valid_span(valid: np.ndarray) -> tuple[int, int] | None:
  """(first, count) of the valid padded positions when they are one run, else None."""
  idx = np.flatnonzero(valid)
  if idx.size == 0 or idx[-1] - idx[0] + 1 != idx.size:
    return None
  return int(idx[0]), int(idx.size)


def padded_window(
  gates: list[UOp], oh: UOp, kh: UOp, ow: UOp, kw: UOp, SH: int, SW: int, DH: int = 1, DW: int = 1
) -> Window | None:
  """The window of a load at (oh * SH + kh * DH - PH, ow * SW + kw * DW - PW) whose gates are exactly "padded row in
  [PH, PH + H) and padded column in [PW, PW + W)" (checked by evaluating them over their grid), else None."""
  KH, KW, OH, OW = kh.size, kw.size, oh.size, ow.size
  axes = [oh, kh, ow, kw]
  mask = np.ones((OH, KH, OW, KW), bool)
  for g in gates:
    if ranges_of(g) - set(axes):
      return None
    mask &= evaluate_grid(g, axes).astype(bool)
  rows_in, cols_in = (OH - 1) * SH + (KH - 1) * DH + 1, (OW - 1) * SW + (KW - 1) * DW + 1
  ih = np.arange(OH)[:, None] * SH + np.arange(KH) * DH
  iw = np.arange(OW)[:, None] * SW + np.arange(KW) * DW
  row_ok, col_ok = np.zeros(rows_in, bool), np.zeros(cols_in, bool)
  row_ok[ih.reshape(-1)] = mask.any(axis=(2, 3)).reshape(-1)
  col_ok[iw.reshape(-1)] = mask.any(axis=(0, 1)).reshape(-1)
  rs, cs = valid_span(row_ok), valid_span(col_ok)
  if rs is None or cs is None:
    return None
  (PH, H), (PW, W) = rs, cs
  if not np.array_equal(mask, row_ok[ih][:, :, None, None] & col_ok[iw][None, None, :, :]):
    return None
  return Window(H, W, KH, KW, SH, SW, PH, PW, OH, OW, DH, DW)


def runtime_load(expr: UOp) -> tuple[UOp, list[UOp]] | None:
  """The load under WHERE(gate, ., 0) wrappers, and every gate on the way (the value is 0 where one is false)."""
  gates = []
  while expr.op is Ops.WHERE and expr.src[2].op is Ops.CONST and expr.src[2].arg == 0:
    gates.append(expr.src[0])
    expr = expr.src[1]
  if expr.op is not Ops.LOAD:
    return None
  if not (expr.src[2].op is Ops.CONST and expr.src[2].arg is True):
    gates.append(expr.src[2])
  return expr, gates
