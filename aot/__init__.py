"""aot: an ahead-of-time model compiler. Tensor programs (and ONNX models) -> a kernel list -> libNAME.so + NAME.h."""

__version__ = "0.1.0"
from aot.compiler import compile_model
from aot.core.dtype import DType, dtypes
from aot.errors import AotError, BuildError, CompileError, InternalError, RunError, UnsupportedCpuError
from aot.frontends.tensor import Tensor, function
from aot.loader import load
from aot.options import CompileOptions

__all__ = [
  "Tensor",
  "function",
  "compile_model",
  "CompileOptions",
  "load",
  "dtypes",
  "DType",
  "AotError",
  "CompileError",
  "BuildError",
  "InternalError",
  "RunError",
  "UnsupportedCpuError",
  "testing",
]


def __getattr__(name: str):
  # aot.testing (kernel-count assertions for users' tests) loads on first use: `import aot` loads no test helper
  if name == "testing":
    import importlib

    return importlib.import_module("aot.testing")
  raise AttributeError(f"module 'aot' has no attribute {name!r}")
