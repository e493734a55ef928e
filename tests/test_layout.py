"""The project's structure, guarded: sizes of files and functions, what `import aot` loads, no import cycles."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# the compiler's folders and the package each is (pyproject.toml's package-dir)
PACKAGES = {"aot": "aot", "frontends": "aot.frontends", "codegen": "aot.codegen", "models": "aot.models"}
MAX_FILE_LINES = 800
MAX_FUNCTION_LINES = 100


def _python_files() -> list[Path]:
  skip = {"tests", ".venv", "build", ".git"}
  return sorted(
    p for p in ROOT.rglob("*.py") if not skip.intersection(p.relative_to(ROOT).parts) and "site-packages" not in p.parts
  )


def test_python_files_and_functions_are_short():
  files = _python_files()
  assert len(files) > 40, "the walk found too few files: is ROOT the repository?"
  long_files = [f"{p.relative_to(ROOT)}: {n}" for p in files if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES]
  long_functions = []
  for p in files:
    for node in ast.walk(ast.parse(p.read_text(), str(p))):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        n = node.end_lineno - node.lineno + 1
        if n > MAX_FUNCTION_LINES:
          long_functions.append(f"{p.relative_to(ROOT)}:{node.lineno} {node.name}: {n} lines")
  assert not long_files, f"files over {MAX_FILE_LINES} lines: {long_files}"
  assert not long_functions, f"functions over {MAX_FUNCTION_LINES} lines: {long_functions}"


def test_runtime_files_are_short():
  runtime = [p for p in (ROOT / "runtime_c").iterdir() if p.suffix in (".c", ".h", ".m", ".cpp", ".cu")]
  assert runtime, "no runtime_c files found"
  long = [f"{p.name}: {n}" for p in runtime if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES]
  assert not long, f"runtime_c files over {MAX_FILE_LINES} lines: {long}"
  functions = {f"{p.name}:{line}": n for p in runtime for line, n in _c_function_lengths(p.read_text())}
  assert len(functions) > 50, "too few C functions found: has the runtime's brace style changed?"
  long = [f"{where}: {n} lines" for where, n in functions.items() if n > MAX_FUNCTION_LINES]
  assert not long, f"runtime_c functions over {MAX_FUNCTION_LINES} lines: {long}"


def _c_function_lengths(text: str) -> list[tuple[int, int]]:
  """(first line, lines) of each function the runtime defines: its style opens a definition on a line at column 0
  ending in `{` and closes it with `}` at column 0."""
  found, start = [], None
  for i, line in enumerate(text.splitlines(), 1):
    if start is None and line[:1].isalpha() and "(" in line and line.rstrip().endswith("{"):
      start = i
    elif start is not None and line.startswith("}"):
      found.append((start, i - start + 1))
      start = None
  return found


def test_the_c_function_finder_measures_a_function():
  text = "static int f(int x) {\n  return x;\n}\nstruct s {\n  int a;\n};\nint g(void) {\n" + "  ;\n" * 3 + "}\n"
  assert _c_function_lengths(text) == [(1, 3), (7, 5)]


def test_import_aot_loads_no_tool():
  code = "import sys, aot; print('\\n'.join(sorted(m for m in sys.modules if m.startswith('aot'))))"
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True).stdout
  loaded = out.split()
  assert "aot.compiler" in loaded, loaded  # the walk saw aot's modules at all
  tools = [m for m in loaded if m.startswith("aot.tools") or m == "aot.testing"]
  assert not tools, f"import aot loads developer tools: {tools}"


def _module_name(path: Path) -> str:
  parts = list(path.relative_to(ROOT).with_suffix("").parts)
  parts = PACKAGES.get(parts[0], parts[0]).split(".") + parts[1:]
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _top_level_imports(path: Path, module: str, known: set[str]) -> set[str]:
  """The modules of ours that path imports when it is loaded: module-level statements only (not inside a function,
  which runs later), including those under `if`/`try` at the top but not `if TYPE_CHECKING`; `from x import y` counts
  x.y when that is a module."""
  package = module if path.name == "__init__.py" else module.rpartition(".")[0]
  found: set[str] = set()

  def visit(stmts):
    for s in stmts:
      if isinstance(s, ast.Import):
        found.update(a.name for a in s.names)
      elif isinstance(s, ast.ImportFrom):
        base = s.module or ""
        if s.level:
          base = ".".join(package.split(".")[: len(package.split(".")) - s.level + 1] + ([base] if base else []))
        found.add(base)
        found.update(f"{base}.{a.name}" for a in s.names)
      elif isinstance(s, ast.If) and "TYPE_CHECKING" in ast.unparse(s.test):
        visit(s.orelse)  # imports for the type checker only: not loaded at run time
      elif isinstance(s, (ast.If, ast.Try)):
        visit(s.body)
        visit(s.orelse)
        for h in getattr(s, "handlers", []):
          visit(h.body)
        visit(getattr(s, "finalbody", []))

  visit(ast.parse(path.read_text(), str(path)).body)
  # a module named by an import is loaded, as is every package above it, which is not a dependency of interest
  return {m for m in found if m in known and m != module}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
  """One import cycle in graph (a list of modules, first == last), or None."""
  state: dict[str, int] = {}
  stack: list[str] = []

  def walk(m: str) -> list[str] | None:
    state[m] = 1
    stack.append(m)
    for n in sorted(graph[m]):
      if state.get(n) == 1:
        return stack[stack.index(n) :] + [n]
      if n not in state and (c := walk(n)):
        return c
    stack.pop()
    state[m] = 2
    return None

  for m in sorted(graph):
    if m not in state and (c := walk(m)):
      return c
  return None


def test_no_import_cycle_outside_the_core():
  files = [p for p in _python_files() if p.relative_to(ROOT).parts[0] in PACKAGES]
  modules = {_module_name(p): p for p in files}
  assert {"aot.compiler", "aot.frontends.onnx", "aot.codegen.render.c"} <= set(modules), sorted(modules)[:20]
  known = set(modules)
  # the IR core may import itself in a loop (its modules are one unit); everything else is a DAG
  graph = {
    m: {n for n in _top_level_imports(p, m, known) if not n.startswith("aot.core.") and not _package_of(m, n)}
    for m, p in modules.items()
    if not m.startswith("aot.core.")
  }
  graph = {m: {n for n in deps if n in graph} for m, deps in graph.items()}
  assert _cycle(graph) is None, f"a file-level import cycle: {' -> '.join(_cycle(graph))}"


def _package_of(m: str, n: str) -> bool:
  """Is n a package that m lives in? Loading m loads it first; that is not a cycle of m's making."""
  return m.startswith(n + ".")


def test_cycle_finder_finds_a_cycle():
  # the check above can fail: a graph with a loop is reported, one without is not
  assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
  assert _cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_core_imports_only_itself_and_errors():
  # the IR core is the base every stage builds on: it knows nothing of them
  for p in (ROOT / "aot" / "core").glob("*.py"):
    for m in _top_level_imports(p, _module_name(p), {_module_name(q) for q in _python_files()}) | _inner_imports(p):
      if m.startswith("aot"):
        assert m.startswith("aot.core") or m == "aot.errors", f"{p.relative_to(ROOT)} imports {m}"


def _inner_imports(path: Path) -> set[str]:
  """Every absolute `import x` / `from x import ...` anywhere in path, function bodies included."""
  out = set()
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      out.update(a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
      out.add(node.module)
  return out
