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
# # Structured (impulse) initialization of attention
#
# Zheng, Li and Lucey initialise a ViT so that, before any training, every attention head acts like
# an `f x f` *impulse* convolution: head `h` attends from each patch to the patch at one fixed
# offset `(m, n)`. No data is used: `Q[h]` and `K[h]` are solved with Adam so that
# `softmax(X Q[h] K[h]^T X^T / sqrt(hd))` matches the impulse's `N x N` convolution matrix on a
# pseudo input `X = LayerNorm(sin-cos position embedding)` (Algorithm 1, Eq. 8).
#
# This notebook solves Q/K for a small ViT with `locvit.init.solve_impulse`, shows the target
# matrices next to what the solver reaches, and compares the impulse init with mimetic
# (Trockman & Kolter) and random trunc-normal init, on the pseudo input and on real images.

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
import matplotlib
import matplotlib.pyplot as plt
import numpy as np

# %matplotlib inline
print("JAX", jax.__version__, jax.devices())

# %% [markdown]
# ## Solve Q/K for impulse targets
#
# A ViT with 9 heads of width 8 on the 8x8 token grid of scikit-learn's digits (patch size 1).
# `cover_offsets=True` gives the 9 heads the 9 offsets of a 3x3 filter (the reference draws them
# at random, with replacement). The paper's solver runs 10,000 Adam steps at lr 1e-4; 1,000 steps at
# lr 1e-2 reach the same argmax on this small grid in well under a second. For ViT-sized problems
# the `init.solver='fast'` preset (500 steps) reaches the paper's quality in about 6 s for the 12
# layers of ViT-T (docs/benchmarks.md). Solutions are cached on disk (`cache_dir`), keyed by the
# solver settings, the shapes and the seed.

# %%
import tempfile

from locvit.attention import TokenGrid
from locvit.init import (
  apply_init,
  impulse_attention_matrix,
  init_config,
  pseudo_input,
  solve_impulse,
  solver_config,
)
from locvit.init.impulse import attention_logits_dense

grid = TokenGrid(8, 8)
dim, heads, depth = 72, 9, 2
head_dim = dim // heads
impulse_cfg = init_config(
  "impulse",
  filter_size=3,
  mode="different",
  cover_offsets=True,
  steps=1000,
  lr=1e-2,
  seed=0,
  cache_dir=tempfile.mkdtemp(),
)
solution = solve_impulse(
  solver_config(impulse_cfg),
  grid,
  dim,
  heads,
  head_dim,
  depth,
  seed=impulse_cfg.seed,
  cache_dir=impulse_cfg.cache_dir,
)
print(solution.report())
print(f"compile {solution.compile_seconds:.1f}s, solve {solution.solve_seconds:.2f}s")

# %% [markdown]
# ## Targets and achieved attention on the pseudo input
#
# Top: the impulse target of each head of layer 0, an `N x N` matrix (`N = 64`). A shift by
# `(m, n)` is the diagonal at offset `8 m + n`; rows whose key falls outside the grid are zero (zero
# padding). Bottom: `softmax(X Q K^T X^T / sqrt(hd))` with the solved `Q`, `K`. The second figure
# shows the same for one query patch (red box), laid out on the 8x8 grid: the learned
# "convolution kernel" of every head.

# %%
X = pseudo_input("pe", grid, dim)  # LayerNorm(sin-cos PE), the solver's input


def pseudo_attention(q, k):
  """(H, N, N) softmax(X Q K^T X^T / sqrt(hd)) for q: (H, D, hd), k: (H, hd, D)."""
  return np.asarray(jax.nn.softmax(attention_logits_dense(q, k, X, head_dim**-0.5), axis=-1))


offsets = solution.offsets[solution.layer_solve[0]]  # (H, 2) row/column shift per head
targets = impulse_attention_matrix(grid, offsets)  # (H, N, N)
achieved = pseudo_attention(*solution.layer(0))


def show_heads(rows, labels, query=None, size=1.45, vmax=1.0):
  """One panel per head and row, all on one colour scale from 0 to vmax (its colour bar; an
  arrow at its top where larger values are drawn in the top colour)."""
  fig, axes = plt.subplots(
    len(rows),
    heads,
    figsize=(size * heads + 1, size * len(rows)),
    squeeze=False,
    layout="constrained",
  )
  for r, (maps, label) in enumerate(zip(rows, labels)):
    for h in range(heads):
      ax = axes[r, h]
      if query is None:
        ax.imshow(maps[h], cmap="viridis", vmin=0, vmax=vmax)
      else:
        ax.imshow(
          maps[h][query[0] * grid.width + query[1]].reshape(grid.height, grid.width),
          cmap="viridis",
          vmin=0,
          vmax=vmax,
        )
        ax.add_patch(
          matplotlib.patches.Rectangle(
            (query[1] - 0.5, query[0] - 0.5), 1, 1, fill=False, ec="red", lw=1.5
          )
        )
      ax.set_xticks([])
      ax.set_yticks([])
      if r == 0:
        ax.set_title(f"head {h} ({offsets[h][0]:+d},{offsets[h][1]:+d})", fontsize=8)
    axes[r, 0].set_ylabel(label, fontsize=9)
  clipped = max(float(np.max(maps)) for maps in rows) > vmax
  scale = matplotlib.cm.ScalarMappable(matplotlib.colors.Normalize(0, vmax), cmap="viridis")
  bar = fig.colorbar(scale, ax=axes, shrink=0.9, extend="max" if clipped else "neither")
  bar.set_label("attention" + (f"\n(above {vmax:g}: top colour)" if clipped else ""), fontsize=8)
  plt.show()


show_heads([targets, achieved], ["target", "solved"])
show_heads([targets, achieved], ["target", "solved"], query=(3, 4))

# %% [markdown]
# ## Impulse vs mimetic vs random initialization in a model
#
# `apply_init` writes an initialization into a freshly initialised params tree: here a 2-layer
# structured-init ViT (`structvit_*`: sin-cos positions, global average pooling). The impulse init
# finds the solution in the cache and writes it; mimetic init sets `W_q W_k^T` to the best rank-`hd`
# approximation of `alpha Z + beta I` (`Z` random: a bias towards attending to the query itself,
# weak here since `hd = 8` of `D = 72` directions are kept); trunc-normal is timm's random init.
#
# First the solver's own measure, on the pseudo input: per head, the Eq. 8 error
# `mean((A - H_impulse)^2)`
# and the fraction of query rows whose largest attention is the target key.

# %%
import flax.linen as nn

from locvit.models import create_model

model = create_model(
  "structvit_d8_dim64_h4_patch2_32",
  num_classes=10,
  embed_dim=dim,
  num_heads=heads,
  depth=depth,
  patch_size=1,
)
params = nn.meta.unbox(jax.jit(model.init)(jax.random.key(0), jnp.zeros((1, 8, 8, 1)))["params"])
inits = {
  "impulse": impulse_cfg,
  "mimetic": init_config("mimetic"),
  "trunc_normal": init_config("trunc_normal"),
}
initialised = {name: apply_init(cfg, params, model, image_size=8) for name, cfg in inits.items()}


def qk_heads(p, layer):
  """(Q, K) of a layer as the solver sees them: (H, D, hd) and (H, hd, D)."""
  kernel = p[f"blocks_{layer}"]["attn"]["qkv"]["kernel"]  # (D, 3, H, hd)
  return kernel[:, 0].transpose(1, 0, 2), kernel[:, 1].transpose(1, 2, 0)


def errors(attention, target):
  """Per head: Eq. 8 error and the argmax hit rate over rows with an in-grid target."""
  mse = ((attention - target) ** 2).mean(axis=(1, 2))
  valid = target.sum(-1) > 0
  hits = (attention.argmax(-1) == target.argmax(-1)) & valid
  return mse, hits.sum(-1) / valid.sum(-1)


on_pseudo = {name: pseudo_attention(*qk_heads(p, 0)) for name, p in initialised.items()}
fig, axes = plt.subplots(1, 2, figsize=(11, 3))
width = 0.27
for i, (name, attention) in enumerate(on_pseudo.items()):
  mse, hit = errors(attention, targets)
  axes[0].bar(np.arange(heads) + (i - 1) * width, mse, width, label=name)
  axes[1].bar(np.arange(heads) + (i - 1) * width, hit, width, label=name)
  print(f"{name:>12}: Eq. 8 error {mse.mean():.2e}   argmax on target {hit.mean():.2f}")
axes[0].set(yscale="log", xlabel="head (layer 0)", ylabel="mean (A - H)^2", title="Eq. 8 error")
axes[1].set(
  xlabel="head (layer 0)",
  ylabel="fraction of rows",
  ylim=(0, 1.2),
  title="argmax = impulse target",
)
axes[1].legend(fontsize=8, ncol=3, loc="upper center")
plt.tight_layout()
plt.show()
show_heads([targets, *list(on_pseudo.values())], ["target", *list(on_pseudo)], query=(3, 4))

# %% [markdown]
# ## On real images
#
# In the network, the first layer sees `LayerNorm(patch embedding + position embedding)` of real
# digits, and the q/k biases and patch embedding of the base init (PyTorch's default, as in the
# reference) add content to the pseudo input. `init_maps.attention_maps` averages every layer's
# attention over 128 test digits (the paper's Fig. 3 does this on CIFAR-10); the colour scale
# below stops at 0.2 (uniform attention is 1/64 = 0.016). The impulse heads keep their shifted
# diagonal, blurred by the image content; mimetic init gives a faint banded pattern, random init a
# nearly uniform map. The printed errors compare each init with the impulse targets of that layer.

# %%
from locvit.analysis import init_maps
from locvit.data import DigitsSource

images = init_maps.load_images(DigitsSource("test"), 128, mean=(0.5,), std=(0.5,))
apply = init_maps.intermediates_fn(model)  # compiled once for all inits
maps = {
  name: init_maps.attention_maps(model, p, images, apply=apply) for name, p in initialised.items()
}
show_heads([targets] + [m[0] for m in maps.values()], ["target", *list(maps)], vmax=0.2)
for name, m in maps.items():
  for layer in range(depth):
    layer_targets = impulse_attention_matrix(grid, solution.offsets[solution.layer_solve[layer]])
    mse, hit = errors(m[layer], layer_targets)
    print(
      f"{name:>12} layer {layer}: Eq. 8 error {mse.mean():.2e}   argmax on target {hit.mean():.2f}"
    )

# %% [markdown]
# The same comparison at the paper's scale (ViT-T on CIFAR-10, 16x16 tokens) is
# `python -m locvit.analysis.init_maps --model=structvit_tiny_patch2_32
# --inits=impulse,mimetic,trunc_normal --image_folder=DIR --out=OUT`, and training with an init is
# `--config.init.name=impulse` (see `configs/structinit_*.py`).
