"""The fuzzer's contraction and window ops: MatMul and Gemm (big enough in a big case to reach the runtime's
microkernel), Conv, pooling, ConvTranspose and Resize over (N, C, L) or (N, C, H, W) values, with the window arithmetic
(pads, strides, dilations, auto_pad, ceil_mode) drawn where onnxruntime agrees on it (fuzz_cases.REFERENCE_LIMITS)."""

from __future__ import annotations

import math

from aot.tools.fuzz_cases import Builder, Value, exact_grain, mag_ok, moved


def _weight(b: Builder, shape, x: Value, const_p: float = 0.7) -> Value:
  """A contraction's second operand: exact (grid) when x is, mostly a constant."""
  return b.leaf(
    shape,
    "float32",
    "grid" if x.grain is not None and b.chance(0.7) else "normal",
    const=True if b.chance(const_p) else None,
  )


def _contraction(x: Value, w: Value, k: int, shape, lowp: bool = False) -> dict:
  mag = x.mag * w.mag * k
  grain = None if x.grain is None or w.grain is None else x.grain + w.grain
  return {
    "shape": tuple(shape),
    "dtype": "float32",
    "mag": mag,
    "grain": exact_grain("float32", mag, grain),
    "lowp": lowp or x.lowp,
    "err": lambda env, ex=x.err, ew=w.err: ex(env) * ew(env) * k,
  }


def gen_matmul(b: Builder, x: Value) -> bool:
  if x.dtype != "float32" or x.rank == 0 or x.rank > 4:
    return False
  n = b.pick([32, 33, 64] if b.big else [1, 2, 3, 5, 8])
  if x.rank >= 2 and b.chance(0.25):
    # x on the right: (m, K) @ x with K = x.shape[-2]
    k, m = x.shape[-2], b.pick([32, 48] if b.big else [1, 2, 4])
    w = _weight(b, (m, k), x)
    shape = x.shape[:-2] + (m, x.shape[-1])
    if math.prod(shape) > b.max_numel:
      return False
    out = _contraction(x, w, k, shape)
    if not mag_ok(out["mag"]):
      return False
    b.node("MatMul", [w, x], [out])
    return True
  k = x.shape[-1]
  form = "2d" if b.big else b.pick(["2d", "2d", "batched", "vector"])
  if form == "vector":
    wshape, shape = (k,), x.shape[:-1]
  elif form == "batched" and x.rank >= 2:
    batch = tuple(b.pick([d, 1]) for d in x.shape[:-2])
    wshape, shape = batch + (k, n), x.shape[:-1] + (n,)
  elif x.rank == 1 and b.chance(0.3):
    wshape, shape = (2, k, n), (2, n)
  else:
    wshape, shape = (k, n), x.shape[:-1] + (n,)
  if math.prod(shape) > b.max_numel:
    return False
  w = _weight(b, wshape, x)
  out = _contraction(x, w, k, shape)
  if not mag_ok(out["mag"]):
    return False
  b.node("MatMul", [x, w], [out])
  return True


def gen_gemm(b: Builder, x: Value) -> bool:
  if x.dtype != "float32" or x.rank != 2:
    return False
  trans_a, trans_b = int(b.chance(0.3)), int(b.chance(0.4))
  m, k = x.shape[::-1] if trans_a else x.shape
  n = b.pick([8, 16, 33] if b.big else [1, 3, 4, 7])
  w = _weight(b, (n, k) if trans_b else (k, n), x)
  alpha, beta = b.pick([1.0, 1.0, 0.5, 2.0, -1.0]), b.pick([1.0, 1.0, 0.5, -2.0])
  out = _contraction(x, w, k, (m, n))
  out["mag"] *= abs(alpha)
  out["err"] = lambda env, e=out["err"], a=abs(alpha): a * e(env)
  shift = {0.5: 1}.get(alpha, 0)
  ins = [x, w]
  if b.chance(0.7):
    c = b.leaf(b.pick([(), (n,), (1, n), (m, 1), (m, n)]), "float32", const=True if b.chance(0.7) else None)
    ins.append(c)
    out["mag"] += abs(beta) * c.mag
    cg = None if c.grain is None else c.grain + {0.5: 1}.get(beta, 0)
    out["err"] = lambda env, e=out["err"], ec=c.err, be=abs(beta): e(env) + be * ec(env)
  else:
    cg, beta = 0, 1.0
  g = out["grain"]
  out["grain"] = exact_grain("float32", out["mag"], None if g is None else g + shift, cg)
  if not mag_ok(out["mag"]):
    return False
  b.node("Gemm", ins, [out], alpha=alpha, beta=beta, transA=trans_a, transB=trans_b)
  return True


def _image(b: Builder, x: Value) -> bool:
  """Does x suit a conv or a pool: (N, C, L) or (N, C, H, W), small?"""
  return (
    x.dtype == "float32"
    and x.rank in (3, 4)
    and x.shape[0] <= 2
    and x.shape[1] <= (16 if b.big else 8)
    and min(x.shape[2:]) >= 1
    and max(x.shape[2:]) <= (16 if b.big else 12)
  )


def _window(b: Builder, spatial, pool: bool, dilate: bool = True):
  """Kernel, strides, dilations, pads and auto_pad for a window over these spatial dims, or None."""
  nd = len(spatial)
  kernel = [int(b.rng.integers(1, min(3, d) + 1)) for d in spatial]
  strides = [b.pick([1, 1, 2]) for _ in spatial]
  dil = [b.pick([1, 1, 2]) if dilate else 1 for _ in spatial]
  auto = b.pick(["NOTSET"] * 6 + ["SAME_UPPER", "SAME_LOWER", "VALID"])
  # onnxruntime rejects dilated SAME convs, and sizes dilated SAME pools wrongly: the reference cannot say
  if auto.startswith("SAME"):
    dil = [1] * nd
  eff = [(k - 1) * di + 1 for k, di in zip(kernel, dil)]
  # ... and SAME windows whose stride is longer than the window (padding them would take a negative amount)
  if auto.startswith("SAME"):
    strides = [min(s, e) for s, e in zip(strides, eff)]
  # a pool's padding stays under its window (onnxruntime rejects more)
  limits = (kernel if pool else eff) * 2
  pads = [0] * (2 * nd) if auto != "NOTSET" else [int(b.rng.integers(0, lim)) for lim in limits]
  return kernel, strides, dil, pads, auto, eff


def _out_size(d: int, k_eff: int, s: int, lo: int, hi: int, auto: str, ceil: bool = False) -> int:
  if auto in ("SAME_UPPER", "SAME_LOWER"):
    return -(-d // s)
  if auto == "VALID":
    return (d - k_eff) // s + 1 if d >= k_eff else 0
  span = d + lo + hi - k_eff
  if span < 0:
    return 0
  out = (-(-span // s) if ceil else span // s) + 1
  # a last window starting in the right padding is dropped
  if ceil and (out - 1) * s >= d + lo:
    out -= 1
  return out


def _window_attrs(kernel, strides, dil, pads, auto, dilations: bool = True) -> dict:
  attrs: dict = {"kernel_shape": kernel}
  if any(s != 1 for s in strides):
    attrs["strides"] = strides
  if dilations and any(d != 1 for d in dil):
    attrs["dilations"] = dil
  if auto != "NOTSET":
    attrs["auto_pad"] = auto
  elif any(pads):
    attrs["pads"] = pads
  return attrs


def gen_conv(b: Builder, x: Value) -> bool:
  if not _image(b, x):
    return False
  n, c, *spatial = x.shape
  groups = b.pick([g for g in range(1, c + 1) if c % g == 0] + ([1, 1, 1] if b.big else []))
  m = groups * b.pick([1, 1, 2]) * (b.pick([4, 8]) if b.big and groups < 4 else 1)
  kernel, strides, dil, pads, auto, eff = _window(b, spatial, pool=False)
  nd = len(spatial)
  out = [_out_size(d, e, s, pads[i], pads[i + nd], auto) for i, (d, e, s) in enumerate(zip(spatial, eff, strides))]
  if min(out) < 1 or n * m * math.prod(out) > b.max_numel:
    return False
  w = _weight(b, (m, c // groups, *kernel), x, const_p=0.85)
  desc = _contraction(x, w, (c // groups) * math.prod(kernel), (n, m, *out))
  ins = [x, w]
  if b.chance(0.6):
    bias = b.leaf((m,), "float32", const=True if b.chance(0.8) else None)
    ins.append(bias)
    desc["mag"] += bias.mag
    desc["grain"] = exact_grain("float32", desc["mag"], desc["grain"], bias.grain)
    desc["err"] = lambda env, e=desc["err"], eb=bias.err: e(env) + eb(env)
  if not mag_ok(desc["mag"]):
    return False
  attrs = _window_attrs(kernel, strides, dil, pads, auto)
  if b.chance(0.3):
    del attrs["kernel_shape"]  # taken from the weight's shape
  b.node("Conv", ins, [desc], group=groups, **attrs)
  return True


def gen_pool(b: Builder, x: Value) -> bool:
  if not _image(b, x):
    return False
  n, c, *spatial = x.shape
  op = b.pick(["MaxPool", "MaxPool", "AveragePool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"])
  if op.startswith("Global"):
    exact = op == "GlobalMaxPool"
    b.node(op, [x], [{**moved(x, (n, c) + (1,) * len(spatial)), "grain": x.grain if exact else None}])
    return True
  kernel, strides, dil, pads, auto, eff = _window(b, spatial, pool=True, dilate=op == "MaxPool")
  ceil = b.chance(0.3) and auto == "NOTSET"
  nd = len(spatial)
  out = [
    _out_size(d, e, s, pads[i], pads[i + nd], auto, ceil) for i, (d, e, s) in enumerate(zip(spatial, eff, strides))
  ]
  if min(out) < 1:
    return False
  attrs = _window_attrs(kernel, strides, dil, pads, auto, dilations=op == "MaxPool")
  if ceil:
    attrs["ceil_mode"] = 1
  if op == "AveragePool" and b.chance(0.5):
    attrs["count_include_pad"] = 1
  b.node(op, [x], [{**moved(x, (n, c, *out)), "grain": x.grain if op == "MaxPool" else None}], **attrs)
  return True


def gen_conv_transpose(b: Builder, x: Value) -> bool:
  if not _image(b, x):
    return False
  n, c, *spatial = x.shape
  groups = b.pick([g for g in range(1, c + 1) if c % g == 0])
  per_group = b.pick([1, 2, 3])
  kernel = [int(b.rng.integers(1, 4)) for _ in spatial]
  strides = [b.pick([1, 2, 2, 3]) for _ in spatial]
  dil = [b.pick([1, 1, 2]) for _ in spatial]
  eff = [(k - 1) * d + 1 for k, d in zip(kernel, dil)]
  pads = [int(b.rng.integers(0, e)) for e in eff] + [int(b.rng.integers(0, e)) for e in eff]
  # output_padding below the stride (the spec allows below the dilation too; onnxruntime does not)
  extra = [int(b.rng.integers(0, s)) if b.chance(0.3) else 0 for s in strides]
  nd = len(spatial)
  out = [
    s * (i - 1) + o + e - pads[j] - pads[j + nd] for j, (i, s, o, e) in enumerate(zip(spatial, strides, extra, eff))
  ]
  m = groups * per_group
  if min(out) < 1 or n * m * math.prod(out) > b.max_numel:
    return False
  w = _weight(b, (c, per_group, *kernel), x, const_p=0.85)
  # each output sums at most C/g * prod(kernel) products
  desc = _contraction(x, w, (c // groups) * math.prod(kernel), (n, m, *out))
  if not mag_ok(desc["mag"]):
    return False
  attrs: dict = {"group": groups, "strides": strides, "pads": pads}
  if any(d != 1 for d in dil):
    attrs["dilations"] = dil
  if any(extra):
    attrs["output_padding"] = extra
  if b.chance(0.5):
    attrs["kernel_shape"] = kernel
  b.node("ConvTranspose", [x, w], [desc], **attrs)
  return True


def gen_resize(b: Builder, x: Value) -> bool:
  """Nearest or linear upsampling by whole factors over the spatial dims (as detection and segmentation heads do)."""
  if not _image(b, x):
    return False
  n, c, *spatial = x.shape
  factors = [b.pick([1, 2, 2, 3]) for _ in spatial]
  shape = (n, c, *(d * f for d, f in zip(spatial, factors)))
  if math.prod(shape) > b.max_numel:
    return False
  mode = b.pick(["nearest", "nearest", "linear"])
  attrs: dict = {"mode": mode}
  if mode == "nearest":
    attrs.update(
      b.pick(
        [
          {"coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"},
          {"coordinate_transformation_mode": "half_pixel", "nearest_mode": "round_prefer_floor"},
        ]
      )
    )
  else:
    attrs["coordinate_transformation_mode"] = b.pick(["half_pixel", "asymmetric", "align_corners"])
  if b.chance(0.5):
    ins = [x, "", b.scalar([1.0, 1.0, *map(float, factors)], "float32")]
  else:
    ins = [x, "", "", b.ints(list(shape), "sizes")]
  b.node("Resize", ins, [{**moved(x, shape), "grain": x.grain if mode == "nearest" else None}], **attrs)
  return True
