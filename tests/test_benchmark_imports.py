"""The import graph of ``benchmarks/``, read from the source: no cycle, nothing from ``tests/``,
no other module's private names, and no script named like a library module.

A script runs as ``python benchmarks/NAME.py`` with its own folder first on ``sys.path``, so
``import kit`` is ``benchmarks/kit.py``; a benchmark named like a ``locvit`` module (say
``device_augment``) reads as that module in tracebacks, profiles and ``import`` lines.
"""

from __future__ import annotations

import ast
import graphlib
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"


def local_imports() -> dict[str, list[tuple[str, str | None, int]]]:
  """Per benchmark module, ``(imported module, imported name or None, line)`` of every import
  statement (inside functions too) whose top-level module is ``tests`` or a benchmark module."""
  modules = {path.stem for path in BENCHMARKS.glob("*.py")}
  graph = {}
  for path in sorted(BENCHMARKS.glob("*.py")):
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Import):
        found += [(alias.name, None, node.lineno) for alias in node.names]
      elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        found += [(node.module, alias.name, node.lineno) for alias in node.names]
    keep = lambda module: module.split(".")[0] in modules | {"tests", "benchmarks"}
    graph[path.stem] = [entry for entry in found if keep(entry[0])]
  return graph


def test_benchmarks_import_no_cycle_nothing_from_tests_and_no_private_name():
  graph = local_imports()
  from_tests = [
    f"benchmarks/{source}.py:{line}: {module}"
    for source, imports in graph.items()
    for module, name, line in imports
    if module.split(".")[0] == "tests" or (module == "benchmarks" and name == "tests")
  ]
  assert from_tests == []
  private = [
    f"benchmarks/{source}.py:{line}: {module}.{name}"
    for source, imports in graph.items()
    for module, name, line in imports
    if name and name.startswith("_")
  ]
  # ... nor as an attribute of an imported benchmark module (``accelerator._config_32``).
  for path in sorted(BENCHMARKS.glob("*.py")):
    imported = {module for module, name, _ in graph[path.stem] if name is None}
    for node in ast.walk(ast.parse(path.read_text())):
      if (
        isinstance(node, ast.Attribute)
        and node.attr.startswith("_")
        and isinstance(node.value, ast.Name)
        and node.value.id in imported
      ):
        private.append(f"benchmarks/{path.name}:{node.lineno}: {node.value.id}.{node.attr}")
  assert private == []
  edges = {
    source: {module.split(".")[0] for module, _, _ in imports} for source, imports in graph.items()
  }
  graphlib.TopologicalSorter(edges).prepare()  # raises CycleError naming the circle


def test_no_benchmark_is_named_like_a_library_module():
  library = {path.stem for path in (ROOT / "locvit").rglob("*.py")}
  assert sorted(path.stem for path in BENCHMARKS.glob("*.py") if path.stem in library) == []
