"""Quantized forms of float ONNX models, made with onnxruntime's own quantizer from seeded calibration data: what people
deploy on small machines, for the bench (python -m aot.tools.bench) and the int8 tests to run beside onnxruntime's int8.

  quantized(model, "qdq")        # quantize_static, QDQ format: per-channel int8 weights, uint8 activations
  quantized(model, "qoperator")  # quantize_static, QOperator format (QLinearConv, com.microsoft's QLinearAdd, ...)
  quantized(model, "dynamic")    # quantize_dynamic: int8 weights, DynamicQuantizeLinear + MatMulInteger
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

# calibration batches: enough for stable ranges, few enough that quantizing ResNet-50 stays a few seconds
CALIBRATION_BATCHES = 4
# the opset per-channel quantization needs
MIN_OPSET = 13
# onnxruntime.quantization's formats: static QDQ and QOperator, and quantize_dynamic
FORMS = ("qdq", "qoperator", "dynamic")


def quantized(model, form: str, seed: int = 0):
  """The onnx.ModelProto `model` quantized by onnxruntime.quantization in `form` (qdq, qoperator or dynamic);
  static forms calibrate on CALIBRATION_BATCHES seeded standard normal inputs."""
  import onnx
  import onnx.inliner
  import onnx.version_converter
  from onnxruntime.quantization import (
    CalibrationDataReader,
    QuantFormat,
    QuantType,
    quantize_dynamic,
    quantize_static,
  )
  from onnxruntime.quantization.shape_inference import quant_pre_process

  if form not in FORMS:
    raise ValueError(f"quantized: form must be one of {', '.join(FORMS)}, got {form!r}")
  # the quantizer does not look inside model-local functions (the reference transformer's layer): inline them
  model = onnx.inliner.inline_local_functions(model)
  # per-channel DequantizeLinear (its axis) needs opset 13, which the quantizer asks for but does not convert to
  if next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), MIN_OPSET) < MIN_OPSET:
    model = onnx.version_converter.convert_version(model, MIN_OPSET)
  # an IR 3 model lists its initializers as graph inputs; the preprocessing's optimizer renames and folds them but
  # keeps stale inputs (densenet121: 242), which the calibration session then asks to be fed: initializers only
  model = _initializers_not_inputs(model)
  with tempfile.TemporaryDirectory(prefix="aot_quant_") as d:
    src, pre, out = Path(d) / "f.onnx", Path(d) / "p.onnx", Path(d) / "q.onnx"
    onnx.save(model, src)
    # the quantizer's own preprocessing as its docs advise: shape inference, BatchNormalization folded into Conv,
    # transposed weights folded into constants (else their MatMul is not quantized)
    quant_pre_process(str(src), str(pre), skip_symbolic_shape=True)
    if form == "dynamic":
      quantize_dynamic(pre, out, weight_type=QuantType.QInt8)
      return _ir_for_opsets(onnx.load(out))
    rng = np.random.default_rng(seed)
    shapes = {
      i.name: [d.dim_value or 1 for d in i.type.tensor_type.shape.dim]
      for i in model.graph.input
      if i.name not in {t.name for t in model.graph.initializer}
    }

    class Calibration(CalibrationDataReader):
      def __init__(self):
        self.feeds = iter(
          [
            {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
            for _ in range(CALIBRATION_BATCHES)
          ]
        )

      def get_next(self):
        return next(self.feeds, None)

    quantize_static(
      pre,
      out,
      Calibration(),
      per_channel=True,
      weight_type=QuantType.QInt8,
      activation_type=QuantType.QUInt8,
      quant_format=QuantFormat.QDQ if form == "qdq" else QuantFormat.QOperator,
    )
    return _ir_for_opsets(onnx.load(out))


def _initializers_not_inputs(model):
  """A copy of `model` at the IR version its opsets need, with no initializer among its graph inputs."""
  import onnx

  inits = {t.name for t in model.graph.initializer}
  if not any(i.name in inits for i in model.graph.input):
    return model
  copy = onnx.ModelProto()
  copy.CopyFrom(model)
  kept = [i for i in copy.graph.input if i.name not in inits]
  del copy.graph.input[:]
  copy.graph.input.extend(kept)
  return _ir_for_opsets(copy)


def _ir_for_opsets(model):
  """The quantizer raises an old model's opset (onnx's light models: IR 3, opset 8) but not its IR version, under which
  its new initializers would have to be graph inputs too: the IR version those opsets need."""
  from onnx import helper

  model.ir_version = max(model.ir_version, helper.find_min_ir_version_for(list(model.opset_import), True))
  return model
