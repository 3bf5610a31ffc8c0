"""The import graph of ``locvit/``, read from the source: no cycles, and imports go down the layers.

Every ``import`` statement counts, including those inside functions (lazy imports), so a lazy
import cannot hide a cycle. Importing ``a.b.c`` also runs the ``__init__`` of the packages ``a.b``
(unless the importer is inside it), so the graph has an edge to each of them too.

The shipped configs (``configs/``, the package ``locvit.configs``) are plain data: they import only
the standard library, ``ml_collections`` and each other, so loading one does not import JAX.
"""

from __future__ import annotations

import ast
import dataclasses
import graphlib
import itertools
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent / "locvit"
CONFIGS = ROOT.parent / "configs"

# Lowest first. A module may import its own group (top-level module or subpackage of locvit) and
# the groups of lower layers, never a group of its own layer or a higher one.
LAYERS = (
  # Choice errors; the shipped configs and the default blocks they build on
  # (``configs/defaults.py``): plain data that the library modules consuming them import.
  ("choices", "configs"),
  # The machine: the kernel setting, sharding, XLA options, the allocator, FLOP counts. No model
  # knowledge.
  ("platform",),
  # Everything a run keeps in its directory: paths and bucket clients, the outage deadline, the
  # lock, checkpoints, checksums, provenance, restore, the saved config and the fingerprint.
  ("workdir",),
  ("metrics",),  # the metric writer (through the workdir's paths and its outage deadline)
  ("attention",),  # positional terms, the attention core
  ("models",),  # backbones, registry, build_model, parameter surgery
  ("init", "data", "convert", "optim", "distill"),  # use models, never each other
  ("analysis",),  # reports and plots
  ("run",),  # the run bundle, the state, the step, the evaluation pass
  ("train",),  # the loop; analysis reaches it only as hooks passed in
  ("main",),  # the CLI
  ("reproduce",),  # plans of runs: trains through train, beside the CLI
  ("locvit",),  # the package's top-level names (create_model, list_models), loaded on first use
)


@dataclasses.dataclass(frozen=True)
class Import:
  source: str  # importing module
  target: str  # imported module
  line: int
  lazy: bool  # inside a function: runs at its first call, not at import

  def where(self) -> str:
    path = module_files()[self.source].relative_to(ROOT.parent)
    return f"{path}:{self.line}{' (lazy)' if self.lazy else ''}"


def module_files() -> dict[str, pathlib.Path]:
  """``{'locvit.models.vit': path, 'locvit.models': .../models/__init__.py, ...}``."""
  files = {}
  for path in sorted(ROOT.rglob("*.py")):
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
  return files


def _package(module: str, path: pathlib.Path) -> str:
  return module if path.name == "__init__.py" else module.rpartition(".")[0]


def _imported_names(node: ast.AST, module: str, path: pathlib.Path, modules) -> list[str]:
  if isinstance(node, ast.Import):
    return [alias.name for alias in node.names]
  if not isinstance(node, ast.ImportFrom):
    return []
  base = node.module or ""
  if node.level:  # relative: from the importer's package, up level - 1
    package = _package(module, path).split(".")
    base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
  # `from pkg import sub` imports the submodule; `from pkg import name` runs pkg's __init__.
  return [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]


def imports() -> list[Import]:
  """Every import of one locvit module by another, each with the package inits it runs."""
  modules = module_files()
  found = []
  for module, path in modules.items():
    tree = ast.parse(path.read_text(), filename=str(path))
    lazy_nodes = {
      id(inner)
      for outer in ast.walk(tree)
      if isinstance(outer, (ast.FunctionDef, ast.AsyncFunctionDef))
      for inner in ast.walk(outer)
    }
    own_packages = _package(module, path).split(".")
    own = {".".join(own_packages[:i]) for i in range(1, len(own_packages) + 1)}
    for node in ast.walk(tree):
      for name in _imported_names(node, module, path, modules):
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
          target = ".".join(parts[:i])
          is_init = i < len(parts)  # an enclosing package, run before the module itself
          if target in modules and target != module and not (is_init and target in own):
            found.append(Import(module, target, node.lineno, id(node) in lazy_nodes))
  return found


def group(module: str) -> str:
  """'locvit.models.vit' -> 'models'; 'locvit.train' -> 'train'; 'locvit' -> 'locvit'."""
  parts = module.split(".")
  return parts[1] if len(parts) > 1 else parts[0]


def layer_of(name: str) -> int:
  for index, names in enumerate(LAYERS):
    if name in names:
      return index
  raise KeyError(name)


def test_every_module_is_in_a_layer():
  missing = sorted({group(m) for m in module_files()} - {g for names in LAYERS for g in names})
  assert not missing, f"locvit modules/packages in no layer: {missing}; add them to LAYERS."


def test_no_import_cycles_lazy_imports_included():
  edges: dict[tuple[str, str], Import] = {}
  for imp in imports():
    edges.setdefault((imp.source, imp.target), imp)
  sorter = graphlib.TopologicalSorter()
  for source, target in edges:
    sorter.add(source, target)
  try:
    sorter.prepare()
  except graphlib.CycleError as error:
    cycle = error.args[1][::-1]  # graphlib lists it against the edges' direction
    steps = [f"{a} -> {b}  [{edges[a, b].where()}]" for a, b in itertools.pairwise(cycle)]
    pytest.fail("import cycle:\n  " + "\n  ".join(steps))


def test_imports_go_down_the_layers():
  wrong = []
  for imp in imports():
    source, target = group(imp.source), group(imp.target)
    if source != target and layer_of(target) >= layer_of(source):
      wrong.append(f"{imp.source} imports {imp.target}  [{imp.where()}]")
  assert not wrong, "imports against the layer order (see LAYERS):\n  " + "\n  ".join(wrong)


def test_the_checks_see_lazy_imports_and_name_the_cycle(tmp_path, monkeypatch):
  """On a two-module package with a lazy back-import, the cycle test fails naming both edges."""
  package = tmp_path / "locvit"
  (package / "sub").mkdir(parents=True)
  (package / "__init__.py").write_text("")
  (package / "sub" / "__init__.py").write_text("")
  (package / "sub" / "low.py").write_text("def f():\n  from locvit import high\n")
  (package / "high.py").write_text("from locvit.sub.low import f\n")
  monkeypatch.setitem(globals(), "ROOT", package)
  found = {(i.source, i.target, i.lazy) for i in imports()}
  assert found == {
    ("locvit.sub.low", "locvit.high", True),
    ("locvit.high", "locvit.sub.low", False),
    ("locvit.high", "locvit.sub", False),  # the package init runs first
  }
  with pytest.raises(pytest.fail.Exception) as failure:
    test_no_import_cycles_lazy_imports_included()
  message = str(failure.value)
  assert "import cycle:" in message
  assert "locvit.sub.low -> locvit.high  [locvit/sub/low.py:2 (lazy)]" in message
  assert "locvit.high -> locvit.sub.low  [locvit/high.py:1]" in message


# ------------------------------------------------------------------------------------------------
# The shipped configs

CONFIG_IMPORTS = ("ml_collections", "locvit.configs")  # and the standard library


def config_imports_outside_their_layer(path: pathlib.Path) -> list[str]:
  """The imports of config file ``path`` (inside functions too) other than the standard library,
  ``ml_collections`` and ``locvit.configs`` modules, as ``'FILE:LINE imports NAME'``."""
  wrong = []
  for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
    if isinstance(node, ast.Import):
      names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and not node.level:  # relative: another config
      # `from locvit import configs` imports locvit.configs; `from locvit import data` does not.
      names = [f"{node.module}.{alias.name}" for alias in node.names]
    else:
      continue
    for name in names:
      allowed = name.split(".")[0] in sys.stdlib_module_names or any(
        name == prefix or name.startswith(prefix + ".") for prefix in CONFIG_IMPORTS
      )
      if not allowed:
        wrong.append(f"{path.name}:{node.lineno} imports {name}")
  return wrong


def test_shipped_configs_import_only_the_standard_library_ml_collections_and_configs():
  paths = sorted(CONFIGS.glob("*.py"))
  assert len(paths) > 20 and CONFIGS / "defaults.py" in paths
  wrong = [line for path in paths for line in config_imports_outside_their_layer(path)]
  assert not wrong, (
    "configs import only the standard library, ml_collections and locvit.configs (move plain "
    "data to configs/defaults.py):\n  " + "\n  ".join(wrong)
  )


def test_the_config_check_sees_library_imports_inside_functions(tmp_path):
  path = tmp_path / "bad.py"
  path.write_text(
    "import os\nimport ml_collections\nfrom locvit.configs import defaults\n"
    "from locvit.configs.common import base_config\nfrom locvit import configs\n"
    "from locvit import data\n\n"
    "def get_config():\n  from locvit.data import CIFAR10_MEAN\n  import jax\n"
  )
  assert config_imports_outside_their_layer(path) == [
    "bad.py:6 imports locvit.data",
    "bad.py:9 imports locvit.data.CIFAR10_MEAN",
    "bad.py:10 imports jax",
  ]


def test_loading_every_shipped_config_imports_no_jax():
  """As ``main`` loads a config (by path) and as a user imports one (``locvit.configs.NAME``)."""
  script = textwrap.dedent(
    f"""
    import importlib, importlib.util, pathlib, sys
    import locvit.configs.convit_s
    for path in sorted(pathlib.Path({str(CONFIGS)!r}).glob("*.py")):
      spec = importlib.util.spec_from_file_location("config_" + path.stem, path)
      module = importlib.util.module_from_spec(spec)
      spec.loader.exec_module(module)
      if hasattr(module, "get_config"):
        module.get_config()
    print(sorted(m for m in ("jax", "flax", "optax") if m in sys.modules))
    """
  )
  result = subprocess.run(
    [sys.executable, "-c", script],
    cwd=ROOT.parent,
    env={**os.environ, "PYTHONPATH": str(ROOT.parent)},
    capture_output=True,
    text=True,
    timeout=120,
  )
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip() == "[]", result.stdout
