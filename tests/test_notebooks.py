"""The committed notebooks are the executed form of their jupytext sources (issue 17).

colabs/NN_name.py (jupytext percent format, linted by ruff) is the source; colabs/NN_name.ipynb is
generated from it, executed and committed with its outputs (colabs/README.md). pytest's nbmake
plugin executes the .ipynb files again in CI. Runtime: about 5 s (most of it importing
locvit for the names in the Markdown).
"""

import configparser
import glob
import os
import re
import subprocess
import sys

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
  assert len(SOURCES) == 6
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


def test_every_module_name_field_and_file_in_the_markdown_exists():
  """The notebooks' Markdown names ``python -m`` modules, ``locvit.a.b`` names, ``--config.FIELD``
  fields and repository files that exist as printed (as tests/test_doc_blocks.py checks the
  docs)."""
  from tests.test_doc_blocks import missing_modules_names_and_fields

  missing = []
  for source in SOURCES:
    name = os.path.basename(source)
    markdown = [text for kind, text in cells(jupytext.read(source)) if kind == "markdown"]
    text = "\n".join(markdown)
    missing += missing_modules_names_and_fields(name, text)
    for file in re.findall(r"(?<![\w/.$~])((?:configs|tests|docs)/[\w/.*-]*\w)", text):
      if not glob.glob(os.path.join(ROOT, file)):
        missing.append(f"{name}: no file {file}")
  assert not missing, "\n".join(missing)


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
  # The floors of the JAX family are the releases measured to pass (README "Installed versions").
  floors = dict(r.strip().split(">=") for r in requirements)
  with open(os.path.join(ROOT, "ci", "min-versions.txt")) as f:
    measured = dict(line.strip().split("==") for line in f if line.strip()[:1].isalpha())
  assert {name: floors[name] for name in measured if name != "jaxlib"} == {
    name: version for name, version in measured.items() if name != "jaxlib"
  }
  assert measured["jaxlib"] == measured["jax"]


def run_colab_install_cell(content: str) -> subprocess.CompletedProcess:
  """The install cell (the same in every notebook), run as on Colab, with CONTENT as /content."""
  (cell,) = {jupytext.read(source).cells[1].source for source in SOURCES}
  cell = cell.replace('"/content/locvit"', repr(os.path.join(content, "locvit")))
  colab = "import sys, types; sys.modules['google.colab'] = types.ModuleType('google.colab')\n"
  return subprocess.run(
    [sys.executable, "-c", colab + cell], capture_output=True, text=True, cwd=content, timeout=60
  )


def test_on_colab_without_a_copy_the_install_cell_says_the_one_command_to_run(tmp_path):
  result = run_colab_install_cell(str(tmp_path))
  assert result.returncode == 1
  assert result.stderr.strip().splitlines()[-1] == (
    f"FileNotFoundError: no copy of locvit at {tmp_path / 'locvit'}: run `git archive --format=zip"
    " -o locvit.zip HEAD` in your checkout, upload locvit.zip to /content (Files pane), and run "
    "this cell again"
  )


def test_on_colab_the_install_cell_unpacks_the_uploaded_archive(tmp_path):
  # The archive a user makes by the command above (of the committed tree).
  archive = ["git", "archive", "--format=zip", "-o", str(tmp_path / "locvit.zip"), "HEAD"]
  subprocess.run(archive, cwd=ROOT, check=True)
  result = run_colab_install_cell(str(tmp_path))
  assert result.returncode == 0, result.stderr
  assert (tmp_path / "locvit" / "setup.cfg").exists()
  assert (tmp_path / "locvit" / "colabs" / "01_quickstart.ipynb").exists()
