"""aot: an ahead-of-time model compiler. Tensor programs (and ONNX models) -> a kernel list -> libNAME.so + NAME.h."""

__version__ = "0.1.0"
from aot import testing
from aot.compiler import compile_model
from aot.dtype import DType, dtypes
from aot.errors import AotError, BuildError, CompileError, InternalError
from aot.frontends.tensor import Tensor, function
from aot.loader import load

__all__ = [
  "Tensor",
  "function",
  "compile_model",
  "load",
  "dtypes",
  "DType",
  "AotError",
  "CompileError",
  "BuildError",
  "InternalError",
  "testing",
]
