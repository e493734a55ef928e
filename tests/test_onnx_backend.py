"""The ONNX backend node test suite (the cases shipped inside the onnx package), each compiled to a .so and run."""
import re, warnings
import onnx.backend.test
from aot.onnx_backend import AotBackend
from onnx_exclusions import EXCLUDED

warnings.filterwarnings("ignore", category=RuntimeWarning)
_suite = onnx.backend.test.BackendTest(AotBackend, __name__)
_excluded = re.compile("|".join(f"(?:{p})" for p, _ in EXCLUDED))

OnnxBackendNodeModelTest = _suite.test_cases["OnnxBackendNodeModelTest"]
# excluded cases are not collected at all (a skipped test would look like a missing feature)
for _name in [n for n in dir(OnnxBackendNodeModelTest) if n.startswith("test_")]:
  if _excluded.search(_name.removesuffix("_cpu")) or not _name.endswith("_cpu"): delattr(OnnxBackendNodeModelTest, _name)
