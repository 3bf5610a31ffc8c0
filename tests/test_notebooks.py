"""The committed notebooks are the executed form of their jupytext sources (issue 17).

colabs/NN_name.py (jupytext percent format, linted by ruff) is the source; colabs/NN_name.ipynb is
generated from it, executed and committed with its outputs (colabs/README.md). pytest's nbmake
plugin executes the .ipynb files again in CI. Runtime: about 1 s.
"""

import configparser
import glob
import os
import re

import jupytext
import nbformat
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLABS = os.path.join(ROOT, "colabs")
SOURCES = sorted(glob.glob(os.path.join(COLABS, "[0-9]*.py")))
MAX_BYTES = 1_000_000


def cells(notebook) -> list[tuple[str, str]]:
  return [(cell.cell_type, cell.source) for cell in notebook.cells]


def test_every_notebook_has_a_source_and_every_source_a_notebook():
  notebooks = sorted(glob.glob(os.path.join(COLABS, "*.ipynb")))
  assert len(SOURCES) == 5
  assert [p[: -len(".py")] for p in SOURCES] == [p[: -len(".ipynb")] for p in notebooks]


@pytest.mark.parametrize("source", SOURCES, ids=os.path.basename)
def test_committed_notebook_is_in_sync_with_its_source_and_executed(source):
  notebook_path = source[: -len(".py")] + ".ipynb"
  regenerate = "regenerate it: see colabs/README.md"
  expected = jupytext.read(source)
  committed = nbformat.read(notebook_path, as_version=4)
  assert cells(committed) == cells(expected), f"{notebook_path} differs from {source}: {regenerate}"
  code = [cell for cell in committed.cells if cell.cell_type == "code"]
  # Executed top to bottom in one kernel, without errors, with its figures.
  assert [cell.execution_count for cell in code] == list(range(1, len(code) + 1)), regenerate
  outputs = [output for cell in code for output in cell.outputs]
  assert not [o for o in outputs if o.output_type == "error"]
  assert any("image/png" in o.get("data", {}) for o in outputs), f"{notebook_path}: no figure"
  assert os.path.getsize(notebook_path) < MAX_BYTES


def test_install_cells_pin_nothing_and_name_no_url():
  for source in SOURCES:
    with open(source) as f:
      text = f.read()
    assert not re.search(r"\bjax(lib)?\s*==", text), source
    assert "git+" not in text and "github.com/locvit" not in text, source
    assert '"pip", "install", "-q", "-e", str(root)' in text, source  # the checkout itself


def test_requirements_are_lower_bounds():
  # A runtime with newer packages (Colab's jax and jaxlib) keeps them when locvit is installed.
  setup = configparser.ConfigParser()
  setup.read(os.path.join(ROOT, "setup.cfg"))
  requirements = [r for r in setup["options"]["install_requires"].split("\n") if r.strip()]
  assert requirements and all(
    re.fullmatch(r"[\w.-]+(\[[\w,-]+\])?>=[\w.]+", r.strip()) for r in requirements
  )
