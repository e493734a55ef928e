"""The ONNX backend node test suite (the cases shipped inside the onnx package), each compiled to a .so and run, on
every target."""

import re
import warnings

import onnx.backend.test
from onnx_exclusions import EXCLUDED

from aot.tools.onnx_backend import AotBackend, AotLLVMBackend

warnings.filterwarnings("ignore", category=RuntimeWarning)
_excluded = re.compile("|".join(f"(?:{p})" for p, _ in EXCLUDED))


def node_cases(backend):
  cls = onnx.backend.test.BackendTest(backend, __name__).test_cases["OnnxBackendNodeModelTest"]
  # excluded cases are not collected at all (a skipped test would look like a missing feature)
  for name in [n for n in dir(cls) if n.startswith("test_")]:
    if _excluded.search(name.removesuffix("_cpu")) or not name.endswith("_cpu"):
      delattr(cls, name)
  return cls


OnnxBackendNodeModelTest = node_cases(AotBackend)
OnnxBackendNodeModelTestLLVM = type("OnnxBackendNodeModelTestLLVM", (node_cases(AotLLVMBackend),), {})
