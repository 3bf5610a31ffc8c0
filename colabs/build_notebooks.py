"""Writes the notebooks in colabs/ from the cell lists below (outputs are not committed).

  python colabs/build_notebooks.py

Keeping the source here makes notebook diffs reviewable; CI executes the .ipynb files with nbmake.
"""

from __future__ import annotations

import pathlib

import nbformat

HERE = pathlib.Path(__file__).parent

INSTALL = """\
# Colab / a fresh laptop: install locvit with pinned versions (skipped when already installed).
try:
  import locvit
except ImportError:
  %pip install -q "jax==0.10.2" "flax==0.12.8" "optax==0.2.8" "orbax-checkpoint==0.12.8" \\
      "grain==0.2.18" "ml-collections==1.1.0" "chex==0.1.92" "tensorflow-datasets==4.9.10" \\
      "scikit-learn" "matplotlib" "tensorboardX" "git+https://github.com/locvit/locvit"
"""

SETUP = """\
import os, sys, pathlib
# Run from a checkout: make configs/ importable and keep the notebook fast on CPU.
root = pathlib.Path.cwd()
while not (root / "configs").exists() and root != root.parent:
  root = root.parent
sys.path.insert(0, str(root))
os.chdir(root)
import jax, jax.numpy as jnp, numpy as np
import matplotlib
import matplotlib.pyplot as plt
print("JAX", jax.__version__, jax.devices())
"""


def notebook(name: str, cells: list[tuple[str, str]]) -> None:
  nb = nbformat.v4.new_notebook()
  nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
  for kind, text in cells:
    make = nbformat.v4.new_markdown_cell if kind == "md" else nbformat.v4.new_code_cell
    nb.cells.append(make(text.strip("\n")))
  nbformat.write(nb, HERE / name)


QUICKSTART = [
  (
    "md",
    """
# locvit quickstart: train a ConViT, evaluate it, plot the curves

A small ConViT (GPSA layers, then MHSA with the class token inserted late) trained for a minute on
scikit-learn's 8x8 digits, which ship with scikit-learn: no download needed.
""",
  ),
  ("code", INSTALL),
  ("code", SETUP),
  ("md", "## A model from the registry"),
  (
    "code",
    """
from locvit.models import create_model, list_models
from locvit.models.convit import convit_overrides
print(len(list_models()), "registered models, e.g.", list_models("convit")[:6])
model = create_model("convit_tiny_patch2_32", num_classes=10, embed_dim=64, num_heads=4,
                     **convit_overrides(local_up_to_layer=3, depth=4))
variables = model.init(jax.random.key(0), jnp.zeros((1, 8, 8, 1)))
print(sum(x.size for x in jax.tree.leaves(variables)), "parameters")
""",
  ),
  ("md", "## Train with the same loop as `python -m locvit.main`"),
  (
    "code",
    """
import tempfile
from configs.quickstart import get_config
from locvit import train
from locvit.metrics import read_metrics

config = get_config()
config.model.name = "convit_tiny_patch2_32"
config.model.overrides.update(convit_overrides(local_up_to_layer=3, depth=4))
config.num_epochs = float(os.environ.get("LOCVIT_NB_EPOCHS", 15))
workdir = tempfile.mkdtemp()
final = train.train_and_evaluate(config, workdir)
final
""",
  ),
  (
    "code",
    """
records = read_metrics(workdir)
train_steps = [r["step"] for r in records if "train/loss" in r]
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.5))
ax1.plot(train_steps, [r["train/loss"] for r in records if "train/loss" in r])
ax1.set(xlabel="step", ylabel="train loss", title="loss")
evals = [r for r in records if "eval/top1" in r]
ax2.plot([r["step"] for r in evals], [r["eval/top1"] for r in evals], "o-", label="top-1")
ax2.plot([r["step"] for r in evals], [r["eval/top5"] for r in evals], "s--", label="top-5")
ax2.set(xlabel="step", ylabel="accuracy", ylim=(0, 1.02), title="evaluation"); ax2.legend()
plt.show()
assert final["eval/top1"] > 0.8
""",
  ),
  ("md", "## Evaluate the saved checkpoint (what `--mode=eval` does)"),
  (
    "code",
    """
again = train.evaluate_checkpoint(config, workdir)
print(again)
assert abs(again["eval/top1"] - final["eval/top1"]) < 1e-6
""",
  ),
]


if __name__ == "__main__":
  notebook("01_quickstart.ipynb", QUICKSTART)
