"""The bench's real-model set (--real): architectures deployed on CPUs, written in torch with seeded random weights and
exported to ONNX (opset 17, static shapes), so that anyone can rebuild the same files without downloading weights.

  yolov8n      a YOLOv8n-style detector at 320x320 (Conv-BN-SiLU, C2f, SPPF, an FPN/PAN neck, decoupled heads, the
               DFL box decode), written here: no ultralytics
  dbnet        a DB text detector at 640x640 (a small ResNet, an FPN, the upsampling probability head)
  crnn         a CRNN text recogniser, 1x3x32x160 (a conv stack, two bidirectional LSTM layers, per-step classes)
  crnn_ctc     the same without its LSTM (per-column classes from the conv stack), for the dynamic bench's width
               range (not in the static set)
  mobilenetv2, mobilenetv3_small   torchvision's, weights=None
  bert6        a BERT-like encoder, 6 layers of torch.nn.TransformerEncoder, MiniLM-sized (384 wide), sequence 128

torch (and torchvision) are the bench extra's (pip install .[bench]), never the package's: the exported files are
cached in a folder (~/.cache/aot-bench, or --models-dir), and a cached file is used without importing torch.
"""

from __future__ import annotations

import os
from pathlib import Path

OPSET = 17
SEED = 0
REAL_MODELS = ("yolov8n", "dbnet", "crnn", "mobilenetv2", "mobilenetv3_small", "bert6")


class RealModelError(Exception):
  """A real model could not be built: torch missing, or an unknown name."""


def default_models_dir() -> Path:
  return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "aot-bench"


def real_model_path(
  name: str, models_dir: Path | None = None, batch: bool = False, sequence: bool = False, width: bool = False
) -> Path:
  """The cached ONNX file of real model NAME, exported first if it is not there yet; batch: with a symbolic batch
  dim (its inputs' and outputs' first), as exporters write one (the bench's --dynamic); sequence, width: its sequence
  or image width symbolic (export)."""
  if name not in _BUILDERS:
    raise RealModelError(f"unknown real model {name!r}: the real models are {', '.join(REAL_MODELS)}")
  flags = "".join(f"_{f}" for f, on in (("batch", batch), ("sequence", sequence), ("width", width)) if on)
  path = Path(models_dir or default_models_dir()) / f"{name}{flags}.onnx"
  if not path.is_file():
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    export(name, tmp, batch=batch, sequence=sequence, width=width)
    # a run stopped half-way leaves no half-written file behind for the next run to take
    tmp.replace(path)
  return path


def export(name: str, path: Path, batch: bool = False, sequence: bool = False, width: bool = False, **sizes) -> None:
  """Real model NAME exported to PATH with seeded weights (eval mode: BatchNorm folded into the convs by the
  exporter), its batch dim symbolic with batch, its sequence (axis 1: bert6's, up to 512 positions) with sequence,
  an image's width (its input's axis 3, its output's 1: a text line's columns) with width; sizes (its builder's
  keywords: size, layers, ...) shrink it for a quick test, never for the bench."""
  try:
    import torch
  except ImportError:
    raise RealModelError(
      f"real model {name!r} is exported from torch, which is not installed: pip install torch torchvision "
      "(or the bench extra: pip install 'aot-compiler[bench]')"
    ) from None
  import warnings

  torch.manual_seed(SEED)
  if sequence:
    sizes.setdefault("positions", 512)
  module, example, input_names, output_names = _BUILDERS[name](**sizes)
  axes = {0: "batch"} if batch else {}
  axes |= {1: "sequence"} if sequence else {}
  ins, outs = ({**axes, 3: "width"}, {**axes, 1: "time"}) if width else (axes, axes)
  module.eval()
  # (not under torch.no_grad: there TransformerEncoderLayer takes its fused fast path, an op with no ONNX form)
  with warnings.catch_warnings():
    # the TorchScript exporter warns that it is the legacy one (the new one needs onnxscript, and is not needed)
    warnings.simplefilter("ignore")
    torch.onnx.export(
      module,
      example,
      str(path),
      opset_version=OPSET,
      dynamo=False,
      input_names=input_names,
      output_names=output_names,
      do_constant_folding=True,
      dynamic_axes={**{n: ins for n in input_names}, **{n: outs for n in output_names}} if ins else None,
    )


# ---- YOLOv8n-style detector (width 0.25, depth 0.33 of YOLOv8's) ----


def _yolo_blocks():
  import torch
  from torch import nn

  class ConvBnSiLU(nn.Module):
    def __init__(self, c1, c2, k=1, s=1):
      super().__init__()
      self.conv = nn.Conv2d(c1, c2, k, s, k // 2, bias=False)
      self.bn = nn.BatchNorm2d(c2, eps=1e-3)
      self.act = nn.SiLU()

    def forward(self, x):
      return self.act(self.bn(self.conv(x)))

  class Bottleneck(nn.Module):
    def __init__(self, c, shortcut):
      super().__init__()
      self.cv1, self.cv2, self.add = ConvBnSiLU(c, c, 3), ConvBnSiLU(c, c, 3), shortcut

    def forward(self, x):
      y = self.cv2(self.cv1(x))
      return x + y if self.add else y

  class C2f(nn.Module):
    def __init__(self, c1, c2, n=1, shortcut=False):
      super().__init__()
      self.c = c2 // 2
      self.cv1 = ConvBnSiLU(c1, 2 * self.c)
      self.cv2 = ConvBnSiLU((2 + n) * self.c, c2)
      self.m = nn.ModuleList(Bottleneck(self.c, shortcut) for _ in range(n))

    def forward(self, x):
      y = list(self.cv1(x).chunk(2, 1))
      y.extend(m(y[-1]) for m in self.m)
      return self.cv2(torch.cat(y, 1))

  class SPPF(nn.Module):
    def __init__(self, c1, c2, k=5):
      super().__init__()
      self.cv1, self.cv2 = ConvBnSiLU(c1, c1 // 2), ConvBnSiLU(c1 // 2 * 4, c2)
      self.m = nn.MaxPool2d(k, 1, k // 2)

    def forward(self, x):
      y = [self.cv1(x)]
      y.extend(self.m(y[-1]) for _ in range(3))
      return self.cv2(torch.cat(y, 1))

  return ConvBnSiLU, C2f, SPPF


def _yolov8n(size: int = 320, classes: int = 80):
  import torch
  from torch import nn

  Conv, C2f, SPPF = _yolo_blocks()
  reg_max, strides = 16, (8, 16, 32)

  class Detect(nn.Module):
    """Decoupled box (DFL distributions) and class branches per level, decoded to boxes in pixels."""

    def __init__(self, chs):
      super().__init__()
      c2, c3 = max(16, chs[0] // 4, 4 * reg_max), max(chs[0], min(classes, 100))
      branch = lambda c, mid, out: nn.Sequential(Conv(c, mid, 3), Conv(mid, mid, 3), nn.Conv2d(mid, out, 1))
      self.box = nn.ModuleList(branch(c, c2, 4 * reg_max) for c in chs)
      self.cls = nn.ModuleList(branch(c, c3, classes) for c in chs)
      self.dfl = nn.Conv2d(reg_max, 1, 1, bias=False).requires_grad_(False)
      self.dfl.weight.data[:] = torch.arange(reg_max, dtype=torch.float32).view(1, reg_max, 1, 1)
      points, stride = [], []
      for s in strides:
        n = size // s
        sy, sx = torch.meshgrid(torch.arange(n) + 0.5, torch.arange(n) + 0.5, indexing="ij")
        points.append(torch.stack((sx, sy), -1).view(-1, 2))
        stride.append(torch.full((n * n, 1), float(s)))
      self.register_buffer("anchors", torch.cat(points).transpose(0, 1).unsqueeze(0))
      self.register_buffer("strides", torch.cat(stride).transpose(0, 1).unsqueeze(0))

    def forward(self, xs):
      outs = [torch.cat((b(x), c(x)), 1).flatten(2) for x, b, c in zip(xs, self.box, self.cls)]
      y = torch.cat(outs, 2)
      box, cls = y.split((4 * reg_max, classes), 1)
      a = box.shape[2]
      n = box.shape[0]
      dist = self.dfl(box.view(n, 4, reg_max, a).transpose(2, 1).softmax(1)).view(n, 4, a)
      lt, rb = dist.chunk(2, 1)
      x1y1, x2y2 = self.anchors - lt, self.anchors + rb
      xywh = torch.cat(((x1y1 + x2y2) / 2, x2y2 - x1y1), 1) * self.strides
      return torch.cat((xywh, cls.sigmoid()), 1)

  class YOLOv8n(nn.Module):
    def __init__(self):
      super().__init__()
      self.b1 = nn.Sequential(Conv(3, 16, 3, 2), Conv(16, 32, 3, 2), C2f(32, 32, 1, True), Conv(32, 64, 3, 2))
      self.b2 = nn.Sequential(C2f(64, 64, 2, True))  # P3, stride 8
      self.b3 = nn.Sequential(Conv(64, 128, 3, 2), C2f(128, 128, 2, True))  # P4, stride 16
      self.b4 = nn.Sequential(Conv(128, 256, 3, 2), C2f(256, 256, 1, True), SPPF(256, 256))  # P5, stride 32
      self.up = nn.Upsample(scale_factor=2, mode="nearest")
      self.td4, self.td3 = C2f(384, 128), C2f(192, 64)
      self.down3, self.bu4 = Conv(64, 64, 3, 2), C2f(192, 128)
      self.down4, self.bu5 = Conv(128, 128, 3, 2), C2f(384, 256)
      self.detect = Detect((64, 128, 256))

    def forward(self, x):
      p3 = self.b2(self.b1(x))
      p4 = self.b3(p3)
      p5 = self.b4(p4)
      t4 = self.td4(torch.cat((self.up(p5), p4), 1))
      n3 = self.td3(torch.cat((self.up(t4), p3), 1))
      n4 = self.bu4(torch.cat((self.down3(n3), t4), 1))
      n5 = self.bu5(torch.cat((self.down4(n4), p5), 1))
      return self.detect([n3, n4, n5])

  return YOLOv8n(), (torch.randn(1, 3, size, size),), ["images"], ["output0"]


# ---- DB text detector ----


def _dbnet(size: int = 640):
  import torch
  from torch import nn
  from torch.nn import functional as F

  def cbr(c1, c2, k=3, s=1):
    return nn.Sequential(nn.Conv2d(c1, c2, k, s, k // 2, bias=False), nn.BatchNorm2d(c2), nn.ReLU(inplace=True))

  class BasicBlock(nn.Module):
    def __init__(self, c1, c2, s):
      super().__init__()
      self.body = nn.Sequential(cbr(c1, c2, 3, s), nn.Conv2d(c2, c2, 3, 1, 1, bias=False), nn.BatchNorm2d(c2))
      same = s == 1 and c1 == c2
      self.skip = nn.Identity() if same else nn.Sequential(nn.Conv2d(c1, c2, 1, s, bias=False), nn.BatchNorm2d(c2))

    def forward(self, x):
      return F.relu(self.body(x) + self.skip(x))

  class DBNet(nn.Module):
    def __init__(self, widths=(24, 48, 96, 192), inner=64):
      super().__init__()
      self.stem = nn.Sequential(cbr(3, 16, 3, 2), cbr(16, widths[0], 3, 2))  # stride 4
      c, stages = widths[0], []
      for i, w in enumerate(widths):
        stages.append(nn.Sequential(BasicBlock(c, w, 1 if i == 0 else 2), BasicBlock(w, w, 1)))
        c = w
      self.stages = nn.ModuleList(stages)
      self.lateral = nn.ModuleList(nn.Conv2d(w, inner, 1, bias=False) for w in widths)
      self.smooth = nn.ModuleList(nn.Conv2d(inner, inner // 4, 3, 1, 1, bias=False) for _ in widths)
      self.head = nn.Sequential(
        cbr(inner, inner // 4),
        nn.ConvTranspose2d(inner // 4, inner // 4, 2, 2),
        nn.BatchNorm2d(inner // 4),
        nn.ReLU(inplace=True),
        nn.ConvTranspose2d(inner // 4, 1, 2, 2),
        nn.Sigmoid(),
      )

    def forward(self, x):
      feats, x = [], self.stem(x)
      for stage in self.stages:
        x = stage(x)
        feats.append(x)
      lat = [conv(f) for conv, f in zip(self.lateral, feats)]
      for i in range(len(lat) - 1, 0, -1):
        lat[i - 1] = lat[i - 1] + F.interpolate(lat[i], scale_factor=2.0, mode="nearest")
      up = lambda x, scale: F.interpolate(x, scale_factor=float(scale), mode="nearest")
      outs = [up(s(p), 2**i) for i, (s, p) in enumerate(zip(self.smooth, lat))]
      return self.head(torch.cat(outs[::-1], 1))

  return DBNet(), (torch.randn(1, 3, size, size),), ["x"], ["maps"]


# ---- CRNN text recogniser ----


def _crnn(height: int = 32, width: int = 160, classes: int = 97, recurrent: bool = True):
  import torch
  from torch import nn

  def cbr(c1, c2):
    return [nn.Conv2d(c1, c2, 3, 1, 1, bias=False), nn.BatchNorm2d(c2), nn.ReLU(inplace=True)]

  class CRNN(nn.Module):
    def __init__(self, hidden=128):
      super().__init__()
      # height 32 down to 1, width 160 to 40 time steps
      self.cnn = nn.Sequential(
        *cbr(3, 32), nn.MaxPool2d(2),
        *cbr(32, 64), nn.MaxPool2d(2),
        *cbr(64, 128), *cbr(128, 128), nn.MaxPool2d((2, 1)),
        *cbr(128, 256), *cbr(256, 256), nn.MaxPool2d((2, 1)),
        *cbr(256, 256), nn.MaxPool2d((2, 1)),
      )  # fmt: skip
      self.rnn = nn.LSTM(256, hidden, num_layers=2, bidirectional=True, batch_first=True) if recurrent else None
      self.fc = nn.Linear(2 * hidden if recurrent else 256, classes)

    def forward(self, x):
      f = self.cnn(x).squeeze(2).permute(0, 2, 1)  # [1, time, channels]
      y = self.rnn(f)[0] if self.rnn is not None else f
      return self.fc(y).softmax(2)

  return CRNN(), (torch.randn(1, 3, height, width),), ["x"], ["probs"]


# ---- torchvision's mobile classifiers ----


def _torchvision(name: str):
  import torch
  import torchvision

  return getattr(torchvision.models, name)(weights=None), (torch.randn(1, 3, 224, 224),), ["input"], ["logits"]


# ---- BERT-like encoder ----


def _bert6(seq: int = 128, vocab: int = 30522, width: int = 384, layers: int = 6, heads: int = 12, positions: int = 0):
  # positions: a table of that many positions, the first sequence-many read (an export with a symbolic sequence);
  # 0: exactly seq of them, all read
  import torch
  from torch import nn

  class Encoder(nn.Module):
    def __init__(self):
      super().__init__()
      self.tokens, self.positions = nn.Embedding(vocab, width), nn.Embedding(positions or seq, width)
      self.norm = nn.LayerNorm(width, eps=1e-12)
      layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, activation="gelu", batch_first=True)
      # (torch's attention exports its sequence length as a constant: a symbolic one takes the same layer written out)
      self.encoder = (
        nn.Sequential(*[_Layer(width, heads) for _ in range(layers)])
        if positions
        else nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
      )
      self.register_buffer("pos", torch.arange(positions or seq).unsqueeze(0))

    def forward(self, ids):
      pos = self.pos[:, : ids.shape[1]] if positions else self.pos
      return self.encoder(self.norm(self.tokens(ids) + self.positions(pos)))

  ids = torch.randint(0, vocab, (1, seq), dtype=torch.int64)
  return Encoder(), (ids,), ["input_ids"], ["hidden"]


def _Layer(width: int, heads: int):
  """A post-norm encoder layer as torch.nn.TransformerEncoderLayer computes it (GELU, no dropout), its reshapes
  reading the batch and sequence from the input."""
  import torch
  from torch import nn

  class Layer(nn.Module):
    def __init__(self):
      super().__init__()
      self.qkv, self.out = nn.Linear(width, 3 * width), nn.Linear(width, width)
      self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)
      self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)

    def forward(self, x):
      q, k, v = self.qkv(x).view(x.shape[0], -1, 3, heads, width // heads).permute(2, 0, 3, 1, 4)
      a = torch.softmax(q @ k.transpose(-2, -1) / (width // heads) ** 0.5, -1) @ v
      x = self.norm1(x + self.out(a.transpose(1, 2).reshape(x.shape[0], -1, width)))
      return self.norm2(x + self.down(nn.functional.gelu(self.up(x))))

  return Layer()


_BUILDERS = {
  "yolov8n": _yolov8n,
  "dbnet": _dbnet,
  "crnn": _crnn,
  "crnn_ctc": lambda **sizes: _crnn(recurrent=False, **sizes),
  "mobilenetv2": lambda: _torchvision("mobilenet_v2"),
  "mobilenetv3_small": lambda: _torchvision("mobilenet_v3_small"),
  "bert6": _bert6,
}
