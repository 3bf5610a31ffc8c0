# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # locvit quickstart: train a ConViT, evaluate it, plot the curves
#
# A small ConViT (GPSA layers, then MHSA with the class token inserted late) trained for a minute on
# scikit-learn's 8x8 digits, which ship with scikit-learn: no download needed.

# %%
# Install locvit from its checkout: the folder above this notebook. locvit is not on a package
# index, so on Colab the checkout is a copy of the repository at /content/locvit: this cell unpacks
# /content/locvit.zip (made by `git archive`, uploaded with the Files pane) there, or uses a clone.
# Its requirements are lower bounds (README: "Installed versions"): Colab keeps its own jax when
# it is recent enough.
import importlib.util
import os
import pathlib
import subprocess
import sys
import zipfile

root = pathlib.Path("/content/locvit" if "google.colab" in sys.modules else "..").resolve()
if not (root / "setup.cfg").exists() and root.with_suffix(".zip").exists():
  zipfile.ZipFile(root.with_suffix(".zip")).extractall(root)
if not (root / "setup.cfg").exists():
  raise FileNotFoundError(
    f"no copy of locvit at {root}: run `git archive --format=zip -o locvit.zip HEAD` in your "
    "checkout, upload locvit.zip to /content (Files pane), and run this cell again"
  )
if importlib.util.find_spec("locvit") is None:
  subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-e", str(root)], check=True)
os.chdir(root)

# %%
import jax
import jax.numpy as jnp

# %matplotlib inline
print("JAX", jax.__version__, jax.devices())

# %% [markdown]
# ## A model from the registry

# %%
from locvit.models import create_model, list_models
from locvit.models.convit import convit_overrides

print(len(list_models()), "registered models, e.g.", list_models("convit")[:6])
model = create_model(
  "convit_tiny_patch2_32",
  num_classes=10,
  embed_dim=64,
  num_heads=4,
  **convit_overrides(local_up_to_layer=3, depth=4),
)
variables = model.init(jax.random.key(0), jnp.zeros((1, 8, 8, 1)))
print(sum(x.size for x in jax.tree.leaves(variables)), "parameters")

# %% [markdown]
# ## Train with the same loop as `python -m locvit.main`

# %%
import tempfile

from locvit import train
from locvit.configs.quickstart import get_config
from locvit.metrics import read_metrics
from locvit.run import evaluation

config = get_config()
config.model.name = "convit_tiny_patch2_32"
config.model.overrides.update(convit_overrides(local_up_to_layer=3, depth=4))
config.num_epochs = float(os.environ.get("LOCVIT_NB_EPOCHS", 15))
workdir = tempfile.mkdtemp()
final = train.train_and_evaluate(config, workdir)
final

# %% [markdown]
# The curves as `python -m locvit.main --workdir=DIR --mode=analyze` draws them
# (`training_curves.png`): train and eval loss, and eval top-1 / top-5 in % (top-5 in rings).

# %%
from IPython.display import display

from locvit.analysis import analyze, plots

display(plots.training_curves_figure(analyze.training_series(read_metrics(workdir))))
assert final["eval/top1"] > 0.8

# %% [markdown]
# ## Evaluate the saved checkpoint (what `--mode=eval` does)

# %%
again = evaluation.evaluate_checkpoint(config, workdir)
print(again)
assert abs(again["eval/top1"] - final["eval/top1"]) < 1e-6
