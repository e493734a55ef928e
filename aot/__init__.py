"""aot: an ahead-of-time model compiler. Tensor programs (and ONNX models) -> a kernel list -> libNAME.so + NAME.h."""
__version__ = "0.1.0"
from aot.dtype import dtypes, DType
from aot.frontends.tensor import Tensor, function
from aot.compiler import compile_model
from aot.loader import load
from aot.errors import AotError, CompileError, BuildError, InternalError
from aot import testing

__all__ = ["Tensor", "function", "compile_model", "load", "dtypes", "DType", "AotError", "CompileError", "BuildError",
           "InternalError", "testing"]
