"""Every fenced code block of README.md runs as written, in the README's order, in one temporary folder: the blocks
that build build/mnist come before those that link against it, as a reader would run them.

How a block runs depends on what it is:
- `sh`: bash, with this environment's scripts (compile-model, python) first on PATH; it must exit 0.
- `python`: a script run by this interpreter; it must exit 0 (its own asserts are the checks). A script with a line
  `X = Y  # was: X = Z` (a session made by aot where onnxruntime's was) also runs with that line as it was, and both
  must print the same numbers: the swap is the only edit.
- `c` or `cpp` with a `main`: saved as the file the next `sh` block names (`cc app.c ...`, `app.cpp` in a CMake list),
  which builds and runs it; `cmake`: saved as CMakeLists.txt for the next `sh` block.
- `c` without one: an excerpt of an artifact's header, compiled after that header (so a declaration that disagrees
  with it is an error), and every NAME_ macro it names must be defined there; `mnist_run_device` is the GPU targets'
  API, checked against the cuda target's header (emitted without nvcc).
- no language, starting with `compile-model `: the command line's synopsis; its options are exactly those of
  `compile-model --help`.
- no language, lines starting with `$ `: a transcript; the commands run, and every output line shown (numbers, kernel
  and function names aside) is a line of their output.
A block the suite cannot run has `<!-- not run: why -->` on the line before it.
"""

import json
import re
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from aot.models import get

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PERFORMANCE = ROOT / "docs" / "PERFORMANCE.md"
NOT_RUN = re.compile(r"<!--\s*not run:\s*(.+?)\s*-->")
# a command's limit: the slowest block compiles MNIST cold (a few seconds)
BLOCK_TIMEOUT_S = 300


@dataclass
class Block:
  line: int  # of the opening fence, 1-based
  lang: str
  text: str
  not_run: str | None  # why, from the marker on the line before the fence

  def __str__(self):
    return f"README.md:{self.line} ({self.lang or 'no language'})"


def readme_blocks(text: str) -> list[Block]:
  lines, blocks, i = text.splitlines(), [], 0
  while i < len(lines):
    m = re.match(r"^```(\w*)\s*$", lines[i])
    if not m:
      i += 1
      continue
    end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
    assert end is not None, f"README.md:{i + 1}: a code block is not closed"
    before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
    why = NOT_RUN.search(before)
    blocks.append(Block(i + 1, m.group(1), "\n".join(lines[i + 1 : end]) + "\n", why.group(1) if why else None))
    i = end + 1
  return blocks


def kind(block: Block) -> str:
  if block.not_run:
    return "not run"
  if block.lang in ("sh", "python"):
    return block.lang
  if block.lang in ("c", "cpp") and re.search(r"\bint\s+main\s*\(", block.text):
    return "c program"
  if block.lang == "c":
    return "c excerpt"
  if block.lang == "cmake":
    return "cmake"
  if block.lang == "" and block.text.startswith("compile-model "):
    return "synopsis"
  if block.lang == "" and block.text.startswith("$ "):
    return "transcript"
  return "unknown"


def _env() -> dict:
  import os

  scripts = {sysconfig.get_path("scripts"), str(Path(sys.executable).parent)}
  return {**os.environ, "PATH": os.pathsep.join([*scripts, os.environ.get("PATH", "")])}


def _sh(cmd: str, cwd: Path, block: Block) -> str:
  r = subprocess.run(
    ["bash", "-eo", "pipefail", "-c", cmd], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S
  )
  assert r.returncode == 0, f"{block} exited {r.returncode}:\n{cmd}\n--- stdout\n{r.stdout}\n--- stderr\n{r.stderr}"
  return r.stdout


def run_python(block: Block, cwd: Path, _) -> None:
  script = cwd / f"readme_{block.line}.py"
  script.write_text(block.text)
  out = _sh(f"{sys.executable} {script.name}", cwd, block)
  swapped = re.sub(r"^(\s*)(\w+) = .*#\s*was:\s*(\2 = .*)$", r"\1\3", block.text, flags=re.M)
  if swapped != block.text:
    script.write_text(swapped)
    before = _sh(f"{sys.executable} {script.name}", cwd, block)
    np.testing.assert_allclose(_numbers(out), _numbers(before), rtol=1e-4, atol=1e-5, err_msg=f"{block}: swapped")


def _numbers(out: str) -> list[float]:
  nums = [float(v) for v in re.findall(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?", out)]
  assert nums, f"nothing printed to compare: {out!r}"
  return nums


def run_sh(block: Block, cwd: Path, _) -> None:
  if not APP_RUN.search(block.text):
    _sh(block.text, cwd, block)
    return
  # each line that runs an example program is checked on its own: the C and C++ examples print MNIST's 10 outputs
  # for a zero input, which must be the numpy reference's
  want = get("mnist").reference(np.zeros((1, 1, 28, 28), np.float32)).reshape(-1)
  for line in block.text.splitlines():
    out = _sh(line, cwd, block)
    if APP_RUN.search(line):
      got = np.array([float(v) for v in out.split()[-want.size :]])
      np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=f"{block}: {line}")


# a command line that runs an example program: ./app, ./build/app/app, ... && ./app
APP_RUN = re.compile(r"(?:^|&&\s*)\./[\w/-]*app$", re.M)


def run_c_program(block: Block, cwd: Path, later: list[Block]) -> None:
  ext = "cpp" if block.lang == "cpp" else "c"
  names = [re.search(rf"\b(\w+\.{ext})\b", b.text) for b in later if b.lang in ("sh", "cmake")]
  source = next((n for n in names if n), None)
  assert source, f"{block}: a program, but no later sh or cmake block names its file (`cc NAME.{ext} ...`)"
  (cwd / source.group(1)).write_text(block.text)


def run_cmake(block: Block, cwd: Path, _) -> None:
  (cwd / "CMakeLists.txt").write_text(block.text)


def run_c_excerpt(block: Block, cwd: Path, _) -> None:
  names = set(re.findall(r"\b([a-z]\w*)_(?:create|run|run_device|destroy)\b", block.text))
  assert len(names) == 1, f"{block}: a header excerpt should name one artifact's functions, found {names}"
  name = names.pop()
  if "_run_device" in block.text:
    _sh(f"compile-model models:{name} -o build/{name}-cuda --target cuda --emit source", cwd, block)
    header = cwd / "build" / f"{name}-cuda" / "src" / f"{name}.h"
  else:
    header = cwd / "build" / name / f"{name}.h"
  assert header.exists(), f"{block}: {header.relative_to(cwd)} is not there (an earlier block should build it)"
  macros = sorted(set(re.findall(rf"\b{name.upper()}_[A-Z0-9_]+\b", block.text)))
  checks = "".join(f"#ifndef {m}\n#error {m} is not in {header.name}\n#endif\n" for m in macros)
  (cwd / "excerpt.c").write_text(f'#include "{header}"\n{block.text}{checks}')
  _sh("cc -std=c11 -fsyntax-only -Werror excerpt.c", cwd, block)


def _options(text: str) -> set[str]:
  return set(re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", text)) - {"-h", "--help"}


def run_synopsis(block: Block, cwd: Path, _) -> None:
  usage = _sh("compile-model --help", cwd, block).split("\n\n")[0]
  assert _options(block.text) == _options(usage), f"{block}: the synopsis' options differ from --help's:\n{usage}"


def _form(line: str) -> str:
  """A profile or log line with what changes from run to run (numbers, kernel and function names) left out."""
  line = re.sub(r"\bk\d+(?:_r)?(?:_\d+)*\b", "K", line)
  line = re.sub(r"\(\w+\)", "(F)", line)
  line = re.sub(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?(?:x\d+)*", "N", line)
  # the paths' shares come in the order of their size
  line = re.sub(r"by path: .*", lambda m: re.sub(r"[a-z]+ N%", "P N%", m.group()), line)
  return " ".join(line.split())


def run_transcript(block: Block, cwd: Path, _) -> None:
  out, shown = [], []
  for line in block.text.splitlines():
    if line.startswith("$ "):
      out += _sh(line[2:], cwd, block).splitlines()
    elif line.strip() != "...":
      shown.append(line)
  forms = {_form(o) for o in out}
  missing = [s for s in shown if _form(s) not in forms]
  assert not missing, f"{block}: lines shown that the output has no line like:\n" + "\n".join(missing + ["---"] + out)


RUNNERS = {
  "sh": run_sh,
  "python": run_python,
  "c program": run_c_program,
  "c excerpt": run_c_excerpt,
  "cmake": run_cmake,
  "synopsis": run_synopsis,
  "transcript": run_transcript,
}


def test_every_block_is_run_or_says_why_not():
  blocks = readme_blocks(README.read_text())
  unknown = [str(b) for b in blocks if kind(b) == "unknown"]
  assert not unknown, f"blocks this test cannot run (see its docstring, or mark one <!-- not run: why -->): {unknown}"
  # the README's own set-up commands and its diagram; a new exemption needs a reason good enough to raise this
  skipped = [b for b in blocks if b.not_run]
  assert len(skipped) <= 3, [f"{b}: {b.not_run}" for b in skipped]


def test_readme_blocks_run_in_order(tmp_path):
  blocks = [b for b in readme_blocks(README.read_text()) if kind(b) != "not run"]
  for i, block in enumerate(blocks):
    runner = RUNNERS.get(kind(block))
    if runner is None:
      pytest.fail(f"{block}: no way to run it (test_every_block_is_run_or_says_why_not says more)")
    runner(block, tmp_path, blocks[i + 1 :])


# the README is for users: short (a C++ and a Python integration path included, its results table the zoo's and the
# real models' rows), with no development diary in it or in the other documents
README_MAX_LINES = 350
DOCS = ("README.md", "CONTRIBUTING.md", "CHANGELOG.md", "docs/ARCHITECTURE.md", "docs/PERFORMANCE.md")
DIARY = re.compile(r"\b(this stop|last stop|tried and not kept|not kept)\b|`[0-9a-f]{7,40}`", re.I)


def test_readme_is_short():
  lines = README.read_text().count("\n")
  assert lines <= README_MAX_LINES, f"README.md has {lines} lines, over {README_MAX_LINES}: move reference to docs/"


@pytest.mark.parametrize("doc", DOCS)
def test_docs_keep_no_diary(doc):
  text = (ROOT / doc).read_text()
  found = [f"{doc}:{text.count(chr(10), 0, m.start()) + 1}: {m.group()}" for m in DIARY.finditer(text)]
  assert not found, f"a development diary's words (history goes to CHANGELOG.md, without commit hashes): {found}"


def _between(text: str, marker: str) -> str:
  m = re.search(rf"<!-- {marker}:start -->\n(.*?)\n<!-- {marker}:end -->", text, re.S)
  assert m, f"no <!-- {marker}:start/end --> markers"
  return m.group(1)


def test_results_are_the_bench_tables_of_the_saved_rows():
  # docs/PERFORMANCE.md's tables and the README's summary are written by the bench from docs/performance.json:
  # a figure edited by hand, or a table written from other rows, differs from what the bench writes
  from aot.tools.bench import performance_tables, summary_table

  run = json.loads((ROOT / "docs" / "performance.json").read_text())
  assert _between(PERFORMANCE.read_text(), "bench") == performance_tables(run)
  assert _between(README.read_text(), "bench") == summary_table(run["rows"], run["targets"])


def test_bench_rewrites_the_published_tables_from_the_saved_rows(tmp_path, capsys):
  # `--rows` times nothing: from the saved run it writes back exactly what the two files hold
  from aot.tools.bench import main

  doc, readme = tmp_path / "PERFORMANCE.md", tmp_path / "README.md"
  doc.write_text(
    re.sub(r"(<!-- bench:start -->\n).*?(<!-- bench:end -->)", r"\1\2", PERFORMANCE.read_text(), flags=re.S)
  )
  readme.write_text(re.sub(r"(<!-- bench:start -->\n).*?(<!-- bench:end -->)", r"\1\2", README.read_text(), flags=re.S))
  assert main(["--rows", str(ROOT / "docs" / "performance.json"), "--doc", str(doc), "--readme", str(readme)]) == 0
  assert doc.read_text() == PERFORMANCE.read_text() and readme.read_text() == README.read_text()
  assert "Slower than onnxruntime" in capsys.readouterr().out
