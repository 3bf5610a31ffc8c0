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
# # Gaussian mixture (GMM) and element-wise (ELM) attention masks
#
# Li & Zhang ("RetNet viewed through convolution") give self-attention a convolutional prior by
# multiplying the scaled logits with a mask that depends on the distance between query and key:
# `softmax((q k^T / sqrt(d)) * M) v` (Eq. 9, the official code's `combine='multiply'`).
#
# * **GMM** (Eq. 1): per head, `M_h(d) = sum_k alpha_kh exp(-d^2 / (2 sigma_kh^2))`, a mixture of
#   `K` Gaussians of the query-key distance `d` on the token grid: `2 K H` parameters per layer.
# * **ELM**: a free `N x N` table per layer, shared by the heads, initialised to zeros.
#
# This notebook builds both masks with `locvit.attention.masks`, shows how `alpha` and `sigma`
# shape them, and shows the float32 underflow of the official ("faithful") way of computing the
# Gaussian kernel.

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
# ## A GMM mask at initialisation
#
# `GaussianMixtureMask` is a Linen module called with the token grid; it returns the `(H, N, N)`
# table (no batch dimension: it is computed once per call and shared by all images). At init,
# `alpha ~ N(0, 2^2)` and `sigma ~ N(10, 10^2)` (Sec. 4.2). `locvit.analysis.masks.unfold_mask`
# lays every query's row out on the grid, tiled by query: tile `(r, c)` is the "convolution
# kernel" the mask applies around query `(r, c)`.

# %%
import flax.linen as nn

from locvit.analysis.masks import unfold_mask
from locvit.attention import TokenGrid, squared_distances
from locvit.attention.masks import (
  ElementwiseMask,
  GaussianMixtureMask,
  gaussian_base_table,
  gaussian_mixture,
)

grid = TokenGrid(8, 8)
gmm = GaussianMixtureMask(num_heads=4, num_kernels=5, kernel="intended")
variables = nn.meta.unbox(gmm.init(jax.random.key(0), grid))  # plain arrays, no axis names
table = np.asarray(gmm.apply(variables, grid))
print(
  "alpha",
  variables["params"]["alpha"].shape,
  " sigma",
  variables["params"]["sigma"].shape,
  " table",
  table.shape,
)

fig, axes = plt.subplots(2, 4, figsize=(12, 6.2))
for h in range(4):
  for row, image in enumerate((table[h], unfold_mask(table[h], grid))):
    im = axes[row, h].imshow(image, cmap="RdBu_r", norm=matplotlib.colors.CenteredNorm())
    axes[row, h].set_xticks([])
    axes[row, h].set_yticks([])
    fig.colorbar(im, ax=axes[row, h], fraction=0.046)
  axes[0, h].set_title(f"head {h}")
axes[0, 0].set_ylabel("M (N x N)")
axes[1, 0].set_ylabel("unfolded per query")
plt.tight_layout()
plt.show()

# %% [markdown]
# ## How alpha and sigma shape the mask
#
# One Gaussian (`K = 1`) for the centre query of a 15x15 grid. `sigma` sets the width; `alpha` the
# sign and height. Because the mask *multiplies* the logits, `M = 0` does not block a key: it sets
# its logit to 0. A positive `alpha` keeps (and scales) the logits of nearby keys, a negative one
# flips their sign. The last row mixes two kernels: a narrow positive and a wide negative
# Gaussian make a centre-surround mask.
#
# Below each mask: the attention of that query when every content logit `q.k / sqrt(d)` equals 2,
# `softmax(2 M)`, i.e. what the mask alone does to a query that likes every key equally.

# %%
big = TokenGrid(15, 15)
centre = 7 * 15 + 7
sigmas = [0.7, 1.5, 3.0, 6.0]
rows = [
  ("alpha = 2", lambda s: ([2.0], [s])),
  ("alpha = -2", lambda s: ([-2.0], [s])),
  ("alpha = (3, -1),\nsigma = (s, 3 s)", lambda s: ([3.0, -1.0], [s, 3 * s])),
]
fig, axes = plt.subplots(2 * len(rows), len(sigmas), figsize=(9.5, 12.5))
for r, (label, params) in enumerate(rows):
  for c, s in enumerate(sigmas):
    alpha, sigma = (jnp.asarray(v)[:, None] for v in params(s))  # (K, H=1)
    mask = np.asarray(gaussian_mixture(alpha, sigma, big, kernel="intended"))[0, centre]
    attention = np.asarray(jax.nn.softmax(2.0 * mask))
    top, bottom = axes[2 * r, c], axes[2 * r + 1, c]
    im = top.imshow(mask.reshape(15, 15), cmap="RdBu_r", norm=matplotlib.colors.CenteredNorm())
    fig.colorbar(im, ax=top, fraction=0.046)
    im = bottom.imshow(attention.reshape(15, 15), cmap="viridis")
    fig.colorbar(im, ax=bottom, fraction=0.046)
    if r == 0:
      top.set_title(f"sigma = {s}")
  axes[2 * r, 0].set_ylabel(f"M: {label}", fontsize=9)
  axes[2 * r + 1, 0].set_ylabel("softmax(2 M)", fontsize=9)
for ax in axes.flat:
  ax.set_xticks([])
  ax.set_yticks([])
plt.tight_layout()
plt.show()

# %% [markdown]
# ## ELM: a free table, zero at init
#
# `ElementwiseMask` holds one `(N, N)` parameter per layer, broadcast to every head. The official
# init is zeros, so at initialisation every logit is multiplied by 0 and the attention is uniform;
# training can then shape the table freely (`N^2` parameters instead of GMM's `2 K H`).
# `GMMAttention` and `ELMAttention` (attention kinds `'gmm'` and `'elm'`) wrap the masks in the
# library's attention module; applied with `mutable=["intermediates"]` they record their attention
# maps and mask tables.

# %%
from locvit.attention.masks import ELMAttention, GMMAttention

elm = ElementwiseMask(num_heads=4)
elm_vars = nn.meta.unbox(elm.init(jax.random.key(0), grid))
print(
  "ELM parameter",
  elm_vars["params"]["elm"].shape,
  "-> table",
  elm.apply(elm_vars, grid).shape,
  f"({grid.num_tokens**2} parameters vs {2 * 5 * 4} for a 5-kernel GMM with 4 heads)",
)

x = jax.random.normal(jax.random.key(1), (2, grid.num_tokens, 64))  # (batch, tokens, channels)
elm_layer = ELMAttention(num_heads=4)
elm_params = elm_layer.init(jax.random.key(2), x, grid=grid)
_, state = elm_layer.apply(elm_params, x, grid=grid, mutable=["intermediates"])
attention = state["intermediates"]["attention"][0]  # (B, H, N, N)
print(
  "ELM attention at init is uniform (1/N everywhere):",
  bool(jnp.allclose(attention, 1 / grid.num_tokens)),
)

# A GMM mask is an ELM table of a special form: write the GMM layer's table into an ELM layer
# with the same q/k/v weights and the two attention maps agree.
gmm_layer = GMMAttention(num_heads=1, kernel="intended")
gmm_params = gmm_layer.init(jax.random.key(3), x, grid=grid)
_, gmm_state = gmm_layer.apply(gmm_params, x, grid=grid, mutable=["intermediates"])
elm_params = {
  "params": {
    **gmm_params["params"],
    "mask": {"elm": gmm_state["intermediates"]["mask"]["table"][0][0]},
  }
}
_, elm_state = ELMAttention(num_heads=1).apply(elm_params, x, grid=grid, mutable=["intermediates"])
difference = jnp.abs(
  gmm_state["intermediates"]["attention"][0] - elm_state["intermediates"]["attention"][0]
).max()
print(f"GMM vs ELM holding the GMM table: max |attention difference| = {difference:.1e}")

# %% [markdown]
# ## Faithful vs intended Gaussian kernel: float32 underflow
#
# The official code computes each Gaussian as a power of a base table,
# `B ** (1 / sigma^2)` with `B = exp(-d^2) ** 0.5` (`kernel='faithful'`). In exact arithmetic this
# is `exp(-d^2 / (2 sigma^2))` (`kernel='intended'`). In float32, `exp(-d^2)` is exactly 0 once
# `d^2 >= 104`, and `0 ** (1 / sigma^2) = 0` whatever `sigma` is: every key farther than about 10.2
# patches gets a mask of exactly 0, even when `sigma` is large and the intended value is close to 1.
# On 8x8 grids (CIFAR at patch 4) the largest `d^2` is 98, so nothing happens; on a 16x16 grid
# (ImageNet at patch 14, CIFAR at patch 2) a third of the table is zeroed.

# %%
grid16 = TokenGrid(16, 16)
d2 = squared_distances(grid16)
sigmas = jnp.asarray([[1.0, 3.0, 10.0]])  # (K=1, H=3)
ones = jnp.ones_like(sigmas)
faithful = np.asarray(gaussian_mixture(ones, sigmas, grid16, kernel="faithful"))
intended = np.asarray(gaussian_mixture(ones, sigmas, grid16, kernel="intended"))
base_zeros = int(np.sum(gaussian_base_table(grid16) == 0))
print(f"16x16 grid: base table B has {base_zeros:,} zeros of {d2.size:,} entries")
for h, s in enumerate(sigmas[0]):
  print(
    f"  sigma={float(s):4.1f}: faithful zeros {np.sum(faithful[h] == 0):6,}   "
    f"intended zeros {np.sum(intended[h] == 0):6,}   largest |difference| "
    f"{np.abs(faithful[h] - intended[h]).max():.3f}"
  )

levels, first = np.unique(d2, return_index=True)
rows, cols = np.unravel_index(first, d2.shape)
fig, axes = plt.subplots(1, 3, figsize=(15, 4.2), width_ratios=(1.3, 1, 1))
for h, s in enumerate(sigmas[0]):
  colour = f"C{h}"
  axes[0].plot(levels, intended[h][rows, cols], color=colour, label=f"intended, sigma={float(s):g}")
  axes[0].plot(
    levels, faithful[h][rows, cols], "--", color=colour, lw=2, label=f"faithful, sigma={float(s):g}"
  )
axes[0].axvline(104, color="gray", lw=0.8)
axes[0].text(106, 0.9, "exp(-d^2) = 0\nin float32", fontsize=8)
axes[0].set(
  xlabel="squared distance d^2 (patches^2)",
  ylabel="mask value (alpha = 1)",
  title="kernel vs distance on a 16x16 grid",
)
axes[0].legend(fontsize=7)
corner = 0  # query in the top-left corner
for ax, (name, t) in zip(axes[1:], [("intended", intended), ("faithful", faithful)]):
  im = ax.imshow(t[2, corner].reshape(16, 16), cmap="viridis", vmin=0, vmax=1)
  zero = np.ma.masked_where(t[2, corner].reshape(16, 16) != 0, np.ones((16, 16)))
  ax.imshow(zero, cmap="autumn", alpha=0.8)
  ax.set(title=f"{name}, sigma=10, query (0, 0)\nred: exactly 0", xticks=[], yticks=[])
  fig.colorbar(im, ax=ax, fraction=0.046)
plt.tight_layout()
plt.show()

# %% [markdown]
# The intended kernel has zeros too at `sigma = 1`: there `exp(-d^2 / 2)` is truly below float32's
# smallest number, which changes nothing. The faithful zeros replace values up to 0.6.
#
# Choose the kernel with `kernel='faithful' | 'intended'` on the mask modules, or through a
# backbone's `attention_kwargs`:
#
# ```python
# from locvit.attention.masks import mask_attention_kwargs
# from locvit.models import create_model
#
# model = create_model("gmm_vit_smalldata_d9_patch4_32",
#                      attention_kwargs=mask_attention_kwargs("gmm", kernel="intended"))
# ```
#
# `combine='add'` adds the mask to the logits instead, as the paper's text describes, and runs in
# the fused attention kernel.
