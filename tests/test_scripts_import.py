"""Every script in benchmarks/ and experiments/ imports from a clean checkout.

A user runs ``python benchmarks/NAME.py`` from the repository root after ``pip install -e .``:
``locvit`` (with ``locvit.configs``) is importable, the repository root is not on ``sys.path``
(so a top-level ``configs`` package is not), and the script's own folder is. Each script is
loaded (not run) that way in a fresh interpreter.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(
  str(p.relative_to(ROOT))
  for folder in ("benchmarks", "experiments")
  for p in (ROOT / folder).rglob("*.py")
)

# sys.path[0] is the script's folder, as for `python SCRIPT`. The script runs under its file
# name (as tfds loads a builder), not as __main__: only its imports and definitions execute.
_LOAD = (
  "import os, runpy, sys; sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[1])); "
  "runpy.run_path(sys.argv[1], run_name=os.path.basename(sys.argv[1])[:-3])"
)


@pytest.fixture(scope="module")
def installed_env(tmp_path_factory):
  """Environment where only the ``locvit`` package is importable, as after ``pip install -e .``."""
  if "locvit" in {Path(p).name for p in sys.path if p}:
    pytest.skip("unexpected sys.path layout")
  site = tmp_path_factory.mktemp("site")
  (site / "locvit").symlink_to(ROOT / "locvit", target_is_directory=True)
  return dict(os.environ, PYTHONPATH=str(site), JAX_PLATFORMS="cpu")


def test_every_script_is_listed():
  assert "benchmarks/accelerator.py" in SCRIPTS
  assert "experiments/run_utils.py" in SCRIPTS


def test_scripts_import_from_a_clean_checkout(installed_env):
  procs = {}
  failures = []
  # Two at a time: each imports JAX.
  for i in range(0, len(SCRIPTS), 2):
    for script in SCRIPTS[i : i + 2]:
      procs[script] = subprocess.Popen(
        [sys.executable, "-c", _LOAD, script],
        cwd=ROOT,
        env=installed_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
      )
    for script in SCRIPTS[i : i + 2]:
      out, _ = procs[script].communicate(timeout=120)
      if procs[script].returncode:
        failures.append(f"{script}:\n{out[-2000:]}")
  assert not failures, "\n".join(failures)


def test_no_script_writes_into_docs_unless_told():
  """Was: experiments/cordonnier_centers.py --workdir=RUN, as the config docstrings print it,
  overwrote docs/figures/ (the committed figures of the documented runs) with RUN's."""
  import ast

  into_docs = []
  for script in SCRIPTS:
    for node in ast.walk(ast.parse((ROOT / script).read_text())):
      if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
        defaults = [k.value for k in node.keywords if k.arg == "default"]
        into_docs += [
          f"{script}: {d.value}"
          for d in defaults
          if isinstance(d, ast.Constant) and str(d.value).startswith("docs/")
        ]
  assert into_docs == []


@pytest.mark.parametrize(
  "script, model, args, written",
  [
    (
      "cordonnier_centers",
      ("cordonnier_sa", {"downsample": 2}),
      ["--workdir={run}"],
      ["cordonnier_centers.png", "cordonnier_center_paths.png", "cordonnier_final.png"],
    ),
    (
      "gmm_masks",
      ("gmm_vit_smalldata_d6_patch4_32", {"patch_size": 2, "layer_attention": ("gmm",) * 2}),
      ["--vit_workdir={run}", "--elm_workdir={run}", "--gmm_workdir={run}", "--layers=0,1"],
      [f"masks_{kind}_layer{i}.png" for kind in ("gmm", "elm") for i in (0, 1)],
    ),
  ],
)
def test_experiment_scripts_read_the_runs_own_config(
  script, model, args, written, tmp_path, monkeypatch
):
  """Was: the scripts, run as the config docstrings print them, rebuilt the shipped config's
  model with 10 classes, so a run on one's own data (12 classes here) or with other overrides
  stopped with 'written by an incompatible config ... to resume'."""
  import ml_collections

  from locvit import train
  from tests.train_utils import tiny_config

  c = tiny_config(total_steps=2)
  c.model.name = model[0]
  c.model.overrides = ml_collections.ConfigDict(
    {"embed_dim" if "gmm" in script else "hidden_dim": 16, "depth": 2, "num_heads": 4, **model[1]}
  )
  c.data.num_classes = 12
  run = str(tmp_path / "run")
  train.train_and_evaluate(c, run)
  monkeypatch.syspath_prepend(str(ROOT / "experiments"))
  module = __import__(script)
  module.main([a.format(run=run) for a in args])
  assert set(written) <= set(os.listdir(f"{run}/analysis"))
  # A mistyped workdir is refused, and nothing is created there (was: an empty checkpoints/).
  from run_utils import run_num_classes

  with pytest.raises(FileNotFoundError, match="No checkpoint found in"):
    run_num_classes(str(tmp_path / "typo"))
  assert not (tmp_path / "typo").exists()


def test_init_maps_see_the_images_at_the_models_size(tmp_path, monkeypatch, capsys):
  """Was: experiments/structinit_init_maps.py and python -m locvit.analysis.init_maps on a folder
  of 40x48 images drew the attention over a 10x12 (or 20x24) token grid, not the model's 8x8
  (16x16), without saying so. Both now feed the images as evaluation does."""
  from PIL import Image

  from locvit.analysis import init_maps

  (tmp_path / "train" / "cat").mkdir(parents=True)
  Image.new("RGB", (48, 40)).save(tmp_path / "train" / "cat" / "0.jpg")
  monkeypatch.syspath_prepend(str(ROOT / "experiments"))
  import structinit_init_maps

  fed = []
  record = lambda model, inits, images, out, **kwargs: fed.append(images.shape) or []
  monkeypatch.setattr(structinit_init_maps, "compare_inits", record)
  monkeypatch.setattr(init_maps, "compare_inits", record)
  folder, out = f"--image_folder={tmp_path}", f"--out={tmp_path / 'maps'}"
  structinit_init_maps.main([folder, out])
  assert init_maps.main([folder, out, "--inits=mimetic"]) == 0
  assert fed == [(1, 32, 32, 3), (1, 32, 32, 3)]
