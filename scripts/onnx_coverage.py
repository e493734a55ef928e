"""Run the ONNX backend node suite through compiled artifacts and write the coverage table into README.md.

python scripts/onnx_coverage.py            # runs tests/test_onnx_backend.py with pytest -n 2, updates README.md
python scripts/onnx_coverage.py --print    # print the table only
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import warnings
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from onnx_exclusions import EXCLUDED  # noqa: E402


def all_cases() -> list[str]:
  warnings.filterwarnings("ignore")
  from onnx.backend.test.loader import load_model_tests

  return [c.name for c in load_model_tests(kind="node")]


def run_suite(junit: str | None = None) -> dict[str, dict[str, str]]:
  """{target: {case: passed|failed}} from a pytest junit file (run the suite when none is given)."""
  with tempfile.TemporaryDirectory() as d:
    xml = Path(junit) if junit else Path(d) / "junit.xml"
    if not junit:
      subprocess.run(
        [
          sys.executable,
          "-m",
          "pytest",
          "-q",
          "-n",
          "2",
          "-p",
          "no:cacheprovider",
          f"--junitxml={xml}",
          "tests/test_onnx_backend.py",
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
      )
    results: dict = {"c": {}, "llvm": {}}
    for tc in ET.parse(xml).getroot().iter("testcase"):
      # (one test per target and case: test_node_case[TARGET-CASE], and under xdist @ its chunk's group)
      if not (m := re.fullmatch(r"test_node_case\[(\w+)-(\w+)\](@\w+)?", tc.get("name", ""))):
        continue
      bad = tc.find("failure") is not None or tc.find("error") is not None
      results[m[1]][m[2]] = "failed" if bad else "passed"
  return results


def table(cases: list[str], results: dict[str, dict[str, str]]) -> str:
  reasons: Counter = Counter()
  for c in cases:
    for pat, why in EXCLUDED:
      if re.search(pat, c):
        reasons[why] += 1
        break
  count = lambda t, v: sum(1 for c in cases if results[t].get(c) == v)
  excluded = sum(reasons.values())
  lines = [
    "| ONNX backend node cases | c | llvm |",
    "| --- | --- | --- |",
    f"| passed (compiled to a .so, run, compared) | **{count('c', 'passed')}** | **{count('llvm', 'passed')}** |",
    f"| failed | {count('c', 'failed')} | {count('llvm', 'failed')} |",
    f"| excluded (below) | {excluded} | {excluded} |",
    f"| total shipped with onnx | {len(cases)} | {len(cases)} |",
    "",
    "| excluded family | cases |",
    "| --- | --- |",
  ]
  lines += [f"| {why} | {n} |" for why, n in reasons.most_common()]
  return "\n".join(lines)


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--print", action="store_true", help="print the table, do not touch README.md")
  ap.add_argument("--junit", help="read results from this pytest junit file instead of running the suite")
  args = ap.parse_args()
  text = table(all_cases(), run_suite(args.junit))
  print(text)
  if not args.print:
    readme = ROOT / "README.md"
    s = readme.read_text()
    new = re.sub(
      r"(<!-- onnx-coverage:start -->\n).*?(<!-- onnx-coverage:end -->)",
      lambda m: m.group(1) + text + "\n" + m.group(2),
      s,
      flags=re.S,
    )
    readme.write_text(new)


if __name__ == "__main__":
  main()
