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
# # Locality of a trained ConViT: gates, nonlocality, attention maps, attention centres
#
# ConViT's gated positional self-attention (GPSA, d'Ascoli et al. 2021) mixes a content softmax with
# a positional softmax, `A = (1 - g) softmax(QK^T) + g softmax(v_pos . r)`, with a learned gate
# `g = sigmoid(lambda)` per head. This notebook trains a small ConViT for a few seconds on
# scikit-learn's 8x8 digits (no download) and looks at what the library measures:
#
# * the gates `sigmoid(lambda_h)` of every GPSA head over training (paper Fig. 6) and at the end;
# * the nonlocality of every layer (Eq. 8: mean distance, in patches, from a query to what it
#   attends to) over training (Fig. 5) and per head;
# * the attention maps of one query patch (Fig. 7);
# * the attention centres `Delta_h` and spans read from `pos_proj`, drawn as Cordonnier-style
#   contours.
#
# Everything is computed by `locvit.analysis` (`locality`, `analyze`, `plots`, `centers`);
# the notebook only arranges the figures. The same figures come from a real run with
# `python -m locvit.main --config=... --workdir=DIR --mode=analyze`.

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
import matplotlib
import matplotlib.pyplot as plt
import numpy as np

# %matplotlib inline
print("JAX", jax.__version__, jax.devices())

# %% [markdown]
# ## Train a small ConViT for a few seconds
#
# The quickstart config on digits, with a ConViT instead of the DeiT: patch size 1 (an 8x8 token
# grid), 9 heads so the local init places them on a 3x3 kernel, 3 GPSA layers and 1 MHSA layer
# (the class token joins before it). `config.analysis.locality = True` makes the trainer log
# nonlocality, gates and centres at every evaluation, as during a full run.

# %%
import tempfile

from locvit import train
from locvit.analysis.hooks import training_hooks
from locvit.configs.quickstart import get_config
from locvit.metrics import read_metrics
from locvit.models import build_model
from locvit.models.convit import convit_overrides

config = get_config()
config.model.name = "convit_tiny_patch2_32"
config.model.overrides.update(
  embed_dim=72, num_heads=9, patch_size=1, **convit_overrides(local_up_to_layer=3, depth=4)
)
config.analysis.locality = True  # nonlocality / gates / centres at each evaluation
config.analysis.locality_num_images = 32
config.batch_size = 32
config.total_steps = int(os.environ.get("LOCVIT_NB_STEPS", 60))
config.schedule.warmup_steps = 10
config.optimizer.lr = 3e-3
config.eval_every_steps = 15  # each evaluation also logs the locality metrics
config.eval_batch_size = 360  # the whole digits test split in one batch
config.checkpoint_every_steps = 0  # only the final checkpoint
workdir = tempfile.mkdtemp()
result = train.train_and_evaluate(config, workdir, **training_hooks())  # + locality logger
result

# %% [markdown]
# ## Gates and nonlocality over training (paper Figs. 5 and 6)
#
# `analyze.locality_series` turns the logged `locality/...` records into arrays; `plots` draws the
# paper's figures (matplotlib `Figure`s, shown with `display`). At initialisation every gate is
# `sigmoid(1) = 0.73` and every GPSA head attends around its kernel offset; the MHSA layer, with
# no positional term, attends almost uniformly (high nonlocality).

# %%
from IPython.display import display

from locvit.analysis import analyze, locality, plots

records = read_metrics(workdir)
steps, series = analyze.locality_series(records)  # {name: {layer: (evaluations, heads)}}
epochs = steps * analyze.epochs_per_step(records)
display(
  plots.nonlocality_figure(
    epochs, {i: v.mean(axis=1) for i, v in series["nonlocality"].items()}, xlabel="epoch"
  )
)
display(plots.gate_figure(epochs, series["gate"], xlabel="epoch"))

# %% [markdown]
# Sixty steps (1.4 epochs) barely move the gates: in the paper (Figs. 5-6) they separate over
# hundreds of epochs, the early layers staying positional and the later ones turning to content.
# The notebook keeps the run short so that it finishes in seconds; set `LOCVIT_NB_STEPS` (e.g.
# 2000, about 45 epochs) before running it to follow the curves further.
#
# ## The trained model: gates and nonlocality per head
#
# The last logged evaluation holds every head's statistics (from `locality.layer_statistics`, on
# the first 32 test images). A gate near 1 means the head attends by position (convolution-like),
# near 0 by content. The MHSA layer (layer 3, no positional term) attends far more globally.

# %%
final = {name: {i: v[-1] for i, v in layers.items()} for name, layers in series.items()}
model = build_model(config, num_classes=10)
kinds = locality.layer_kinds(model)
gpsa_layers = sorted(final["gate"])
layers = sorted(final["nonlocality"])

gates = np.stack([final["gate"][i] for i in gpsa_layers])
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.2))
im = ax1.imshow(gates, cmap="Reds", vmin=0, vmax=1)
ax1.set(
  xlabel="head",
  ylabel="GPSA layer",
  yticks=range(len(gpsa_layers)),
  yticklabels=gpsa_layers,
  title=rf"gate $\sigma(\lambda_h)$ at step {steps[-1]}",
)
for (r, c), g in np.ndenumerate(gates):
  ax1.text(c, r, f"{g:.2f}", ha="center", va="center", fontsize=7)
fig.colorbar(im, ax=ax1, fraction=0.025)
for i in layers:
  heads = final["nonlocality"][i]
  ax2.scatter(np.full(len(heads), i), heads, s=14, alpha=0.6)
  ax2.plot(i, heads.mean(), "k_", ms=20, mew=2)
ax2.set(
  xticks=layers,
  xticklabels=[f"{i}\n{kinds[i]}" for i in layers],
  xlabel="layer",
  ylabel="nonlocality (patches)",
  title="nonlocality per head (dots) and mean (bar)",
)
plt.tight_layout()
plt.show()

# %% [markdown]
# ## Attention maps of one query patch (paper Fig. 7)
#
# Restore the final checkpoint; `analyze.query_maps` runs the model with
# `apply_with_intermediates` and returns, per layer, the attention of the chosen query patch over
# all patches (class token dropped, rows renormalised); `plots.attention_maps_figure` draws them
# on a log scale, each head's gate on a white-to-red background. The query is boxed in red.

# %%
images = locality.fixed_eval_images(config, 1)
params, step = analyze.restore_params(config, workdir, model, images.shape[1:])
query = (3, 4)  # (row, col) of the query patch on the 8x8 grid
grid = locality.token_grid(model, images)
maps, map_gates = analyze.query_maps(model, params, images[0], range(model.depth), query)
display(
  plots.attention_maps_figure(
    analyze.display_image(config, images[0]),
    grid,
    query,
    maps,
    map_gates,
    patch_size=model.patch_size,
  )
)

# %% [markdown]
# ## Attention centres from `pos_proj` (Cordonnier-style)
#
# The positional logits of head `h` are `w . (dx, dy, dx^2 + dy^2)`, i.e. `-||delta - Delta_h||^2 /
# span_h + const`: a Gaussian around the centre `Delta_h` with variance `span_h / 2`.
# `locality.attention_centres` reads `Delta_h` and `span_h` from `pos_proj` (logged as
# `center_dx`, `center_dy`, `span`); the contours use `locvit.analysis.centers`
# (`gaussian_mass_levels`, `gaussian_on_mesh`) as in Cordonnier et al.'s Figs. 3-4: per head, the
# region holding 50% (solid) and 90% (dotted) of the positional attention around the query (black
# square). Thin lines trace each centre over training, dots mark the end; a head whose centre
# leaves the window, or that has none (it prefers far keys), is named in its panel's corner
# (`centers.note_outside`). The local init puts the 9 heads on a 3x3 kernel with span 1
# (`locality_strength = 1`).

# %%
from locvit.analysis import centers

window, masses = 7, (0.5, 0.9)
levels = np.sort(centers.gaussian_mass_levels(masses))  # ascending: 90%, then 50% mass
axis = np.linspace(-window / 2, window / 2, 141)
d1, d2 = np.meshgrid(axis, axis, indexing="ij")  # d1: row offset (dy), d2: column offset (dx)
fig, axes = plt.subplots(1, len(gpsa_layers), figsize=(3.6 * len(gpsa_layers), 3.8))
for ax, i in zip(axes, gpsa_layers):
  for h, span in enumerate(final["span"][i]):
    colour = f"C{h % 10}"
    track_x, track_y = series["center_dx"][i][:, h], series["center_dy"][i][:, h]
    ax.plot(track_x, track_y, color=colour, lw=0.8)
    ax.plot(track_x[-1], track_y[-1], "o", color=colour, ms=4)
    if span <= 0:  # w_2 > 0: the head prefers far patches, no Gaussian to draw
      continue
    centre = np.array([track_y[-1], track_x[-1]])
    density = centers.gaussian_on_mesh(centre, np.eye(2) * 2 / span, d1, d2)
    ax.contour(d2, d1, density, levels=levels, colors=[colour], linestyles=["dotted", "solid"])
  ax.add_patch(matplotlib.patches.Rectangle((-0.5, -0.5), 1, 1, fill=False, ec="black", lw=2))
  # (row, col) of each head's final centre, NaN without one; heads beyond the window are named.
  ends = np.stack([series["center_dy"][i][-1], series["center_dx"][i][-1]], axis=-1)
  centers.note_outside(ax, np.where(final["span"][i][:, None] > 0, ends, np.nan), window / 2)
  ax.set(
    xlim=(-window / 2, window / 2),
    ylim=(window / 2, -window / 2),
    aspect="equal",
    xlabel="dx (patches)",
    title=f"layer {i}",
  )
  ax.grid(lw=0.3)
axes[0].set_ylabel("dy (patches)")
plt.tight_layout()
plt.show()
for i in gpsa_layers:
  print(
    f"layer {i}: |Delta| per head",
    np.round(final["center_distance"][i], 2),
    " span",
    np.round(final["span"][i], 2),
  )

# %% [markdown]
# A head's nonlocality follows from its gate and its centre: a large gate and a small span attend
# like a small convolution, a small gate attends by content. `config.analysis.locality_mode =
# "faithful"` gives the official repository's variant of Eq. 8 (every layer applied to the raw
# patch embeddings), and `python -m locvit.main --config=... --workdir=DIR --mode=analyze` writes
# these figures for any run.
