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
%matplotlib inline
print("JAX", jax.__version__, jax.devices())
"""


def notebook(name: str, cells: list[tuple[str, str]]) -> None:
  nb = nbformat.v4.new_notebook()
  nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
  for index, (kind, text) in enumerate(cells):
    make = nbformat.v4.new_markdown_cell if kind == "md" else nbformat.v4.new_code_cell
    # Fixed cell ids (nbformat draws random ones): regenerating leaves unchanged notebooks alone.
    nb.cells.append(make(text.strip("\n"), id=f"cell-{index:02d}"))
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


LOCALITY = [
  (
    "md",
    """
# Locality of a trained ConViT: gates, nonlocality, attention maps, attention centres

ConViT's gated positional self-attention (GPSA, d'Ascoli et al. 2021) mixes a content softmax with
a positional softmax, `A = (1 - g) softmax(QK^T) + g softmax(v_pos . r)`, with a learned gate
`g = sigmoid(lambda)` per head. This notebook trains a small ConViT for a few seconds on
scikit-learn's 8x8 digits (no download) and looks at what the library measures:

* the gates `sigmoid(lambda_h)` of every GPSA head over training (paper Fig. 6) and at the end;
* the nonlocality of every layer (Eq. 8: mean distance, in patches, from a query to what it
  attends to) over training (Fig. 5) and per head;
* the attention maps of one query patch (Fig. 7);
* the attention centres `Delta_h` and spans read from `pos_proj`, drawn as Cordonnier-style
  contours.

Everything is computed by `locvit.analysis` (`locality`, `analyze`, `plots`, `centers`);
the notebook only arranges the figures. The same figures come from a real run with
`python -m locvit.main --config=... --workdir=DIR --mode=analyze`.
""",
  ),
  ("code", INSTALL),
  ("code", SETUP),
  (
    "md",
    """
## Train a small ConViT for a few seconds

The quickstart config on digits, with a ConViT instead of the DeiT: patch size 1 (an 8x8 token
grid), 9 heads so the local init places them on a 3x3 kernel, 3 GPSA layers and 1 MHSA layer
(the class token joins before it). `config.analysis.locality = True` makes the trainer log
nonlocality, gates and centres at every evaluation, as during a full run.
""",
  ),
  (
    "code",
    """
import tempfile
from configs.quickstart import get_config
from locvit import train
from locvit.analysis.hooks import training_hooks
from locvit.metrics import read_metrics
from locvit.models.convit import convit_overrides

config = get_config()
config.model.name = "convit_tiny_patch2_32"
config.model.overrides.update(embed_dim=72, num_heads=9, patch_size=1,
                              **convit_overrides(local_up_to_layer=3, depth=4))
config.analysis.locality = True          # nonlocality / gates / centres at each evaluation
config.analysis.locality_num_images = 32
config.batch_size = 32
config.total_steps = int(os.environ.get("LOCVIT_NB_STEPS", 60))
config.schedule.warmup_steps = 10
config.optimizer.lr = 3e-3
config.eval_every_steps = 15             # each evaluation also logs the locality metrics
config.eval_batch_size = 360             # the whole digits test split in one batch
config.checkpoint_every_steps = 0        # only the final checkpoint
workdir = tempfile.mkdtemp()
result = train.train_and_evaluate(config, workdir, **training_hooks())  # + locality logger
result
""",
  ),
  (
    "md",
    """
## Gates and nonlocality over training (paper Figs. 5 and 6)

`analyze.locality_series` turns the logged `locality/...` records into arrays; `plots` draws the
paper's figures (matplotlib `Figure`s, shown with `display`). At initialisation every gate is
`sigmoid(1) = 0.73` and every GPSA head attends around its kernel offset; the MHSA layer, with
no positional term, attends almost uniformly (high nonlocality).
""",
  ),
  (
    "code",
    """
from IPython.display import display
from locvit.analysis import analyze, locality, plots

records = read_metrics(workdir)
steps, series = analyze.locality_series(records)   # {name: {layer: (evaluations, heads)}}
epochs = steps * analyze.epochs_per_step(records)
display(plots.nonlocality_figure(
    epochs, {i: v.mean(axis=1) for i, v in series["nonlocality"].items()}, xlabel="epoch"))
display(plots.gate_figure(epochs, series["gate"], xlabel="epoch"))
""",
  ),
  (
    "md",
    """
Sixty steps (1.3 epochs) barely move the gates: in the paper (Figs. 5-6) they separate over
hundreds of epochs, the early layers staying positional and the later ones turning to content.
The notebook keeps the run short so that it finishes in seconds; set `LOCVIT_NB_STEPS` (e.g.
2000, about 45 epochs) before running it to follow the curves further.

## The trained model: gates and nonlocality per head

The last logged evaluation holds every head's statistics (from `locality.layer_statistics`, on
the first 32 test images). A gate near 1 means the head attends by position (convolution-like),
near 0 by content. The MHSA layer (layer 3, no positional term) attends far more globally.
""",
  ),
  (
    "code",
    r"""
final = {name: {i: v[-1] for i, v in layers.items()} for name, layers in series.items()}
model = train.build_model(config, num_classes=10)
kinds = locality.layer_kinds(model)
gpsa_layers = sorted(final["gate"])
layers = sorted(final["nonlocality"])

gates = np.stack([final["gate"][i] for i in gpsa_layers])
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.2))
im = ax1.imshow(gates, cmap="Reds", vmin=0, vmax=1)
ax1.set(xlabel="head", ylabel="GPSA layer", yticks=range(len(gpsa_layers)),
        yticklabels=gpsa_layers, title=r"gate $\sigma(\lambda_h)$ at step %d" % steps[-1])
for (r, c), g in np.ndenumerate(gates):
  ax1.text(c, r, f"{g:.2f}", ha="center", va="center", fontsize=7)
fig.colorbar(im, ax=ax1, fraction=0.025)
for i in layers:
  heads = final["nonlocality"][i]
  ax2.scatter(np.full(len(heads), i), heads, s=14, alpha=0.6)
  ax2.plot(i, heads.mean(), "k_", ms=20, mew=2)
ax2.set(xticks=layers, xticklabels=[f"{i}\n{kinds[i]}" for i in layers], xlabel="layer",
        ylabel="nonlocality (patches)", title="nonlocality per head (dots) and mean (bar)")
plt.tight_layout(); plt.show()
""",
  ),
  (
    "md",
    """
## Attention maps of one query patch (paper Fig. 7)

Restore the final checkpoint; `analyze.query_maps` runs the model with
`apply_with_intermediates` and returns, per layer, the attention of the chosen query patch over
all patches (class token dropped, rows renormalised); `plots.attention_maps_figure` draws them
on a log scale, each head's gate on a white-to-red background. The query is boxed in red.
""",
  ),
  (
    "code",
    """
images = locality.fixed_eval_images(config, 1)
params, step = analyze.restore_params(config, workdir, model, images.shape[1:])
query = (3, 4)   # (row, col) of the query patch on the 8x8 grid
grid = locality.token_grid(model, images)
maps, map_gates = analyze.query_maps(model, params, images[0], range(model.depth), query)
display(plots.attention_maps_figure(analyze.display_image(config, images[0]), grid, query, maps,
                                    map_gates, patch_size=model.patch_size))
""",
  ),
  (
    "md",
    """
## Attention centres from `pos_proj` (Cordonnier-style)

The positional logits of head `h` are `w . (dx, dy, dx^2 + dy^2)`, i.e. `-||delta - Delta_h||^2 /
span_h + const`: a Gaussian around the centre `Delta_h` with variance `span_h / 2`.
`locality.attention_centres` reads `Delta_h` and `span_h` from `pos_proj` (logged as
`center_dx`, `center_dy`, `span`); the contours use `locvit.analysis.centers`
(`gaussian_mass_levels`, `gaussian_on_mesh`) as in Cordonnier et al.'s Figs. 3-4: per head, the
region holding 50% (solid) and 90% (dotted) of the positional attention around the query (black
square). Thin lines trace each centre over training, dots mark the end. The local init puts the
9 heads on a 3x3 kernel with span 1 (`locality_strength = 1`).
""",
  ),
  (
    "code",
    """
from locvit.analysis import centers

window, masses = 7, (0.5, 0.9)
levels = np.sort(centers.gaussian_mass_levels(masses))     # ascending: 90%, then 50% mass
axis = np.linspace(-window / 2, window / 2, 141)
d1, d2 = np.meshgrid(axis, axis, indexing="ij")   # d1: row offset (dy), d2: column offset (dx)
fig, axes = plt.subplots(1, len(gpsa_layers), figsize=(3.6 * len(gpsa_layers), 3.8))
for ax, i in zip(axes, gpsa_layers):
  for h, span in enumerate(final["span"][i]):
    colour = f"C{h % 10}"
    track_x, track_y = series["center_dx"][i][:, h], series["center_dy"][i][:, h]
    ax.plot(track_x, track_y, color=colour, lw=0.8)
    ax.plot(track_x[-1], track_y[-1], "o", color=colour, ms=4)
    if span <= 0:   # w_2 > 0: the head prefers far patches, no Gaussian to draw
      continue
    centre = np.array([track_y[-1], track_x[-1]])
    density = centers.gaussian_on_mesh(centre, np.eye(2) * 2 / span, d1, d2)
    ax.contour(d2, d1, density, levels=levels, colors=[colour], linestyles=["dotted", "solid"])
  ax.add_patch(matplotlib.patches.Rectangle((-0.5, -0.5), 1, 1, fill=False, ec="black", lw=2))
  ax.set(xlim=(-window / 2, window / 2), ylim=(window / 2, -window / 2), aspect="equal",
         xlabel="dx (patches)", title=f"layer {i}")
  ax.grid(lw=0.3)
axes[0].set_ylabel("dy (patches)")
plt.tight_layout(); plt.show()
for i in gpsa_layers:
  print(f"layer {i}: |Delta| per head", np.round(final["center_distance"][i], 2),
        " span", np.round(final["span"][i], 2))
""",
  ),
  (
    "md",
    """
A head's nonlocality follows from its gate and its centre: a large gate and a small span attend
like a small convolution, a small gate attends by content. `config.analysis.locality_mode =
"faithful"` gives the official repository's variant of Eq. 8 (every layer applied to the raw
patch embeddings), and `python -m locvit.main --config=... --workdir=DIR --mode=analyze` writes
these figures for any run.
""",
  ),
]


STRUCTURED_INIT = [
  (
    "md",
    """
# Structured (impulse) initialization of attention

Zheng, Li and Lucey initialise a ViT so that, before any training, every attention head acts like
an `f x f` *impulse* convolution: head `h` attends from each patch to the patch at one fixed
offset `(m, n)`. No data is used: `Q[h]` and `K[h]` are solved with Adam so that
`softmax(X Q[h] K[h]^T X^T / sqrt(hd))` matches the impulse's `N x N` convolution matrix on a
pseudo input `X = LayerNorm(sin-cos position embedding)` (Algorithm 1, Eq. 8).

This notebook solves Q/K for a small ViT with `locvit.init.solve_impulse`, shows the target
matrices next to what the solver reaches, and compares the impulse init with mimetic
(Trockman & Kolter) and random trunc-normal init, on the pseudo input and on real images.
""",
  ),
  ("code", INSTALL),
  ("code", SETUP),
  (
    "md",
    """
## Solve Q/K for impulse targets

A ViT with 9 heads of width 8 on the 8x8 token grid of scikit-learn's digits (patch size 1).
`cover_offsets=True` gives the 9 heads the 9 offsets of a 3x3 filter (the reference draws them
at random, with replacement). The paper's solver runs 10,000 Adam steps at lr 1e-4; 1,000 steps at
lr 1e-2 reach the same argmax on this small grid in well under a second. Solutions are cached on
disk (`cache_dir`), keyed by the solver settings, the shapes and the seed.
""",
  ),
  (
    "code",
    """
import tempfile
from locvit.attention import TokenGrid
from locvit.init import (apply_init, impulse_attention_matrix, init_config, pseudo_input,
                         solve_impulse, solver_config)
from locvit.init.impulse import attention_logits_dense

grid = TokenGrid(8, 8)
dim, heads, depth = 72, 9, 2
head_dim = dim // heads
impulse_cfg = init_config("impulse", filter_size=3, mode="different", cover_offsets=True,
                          steps=1000, lr=1e-2, seed=0, cache_dir=tempfile.mkdtemp())
solution = solve_impulse(solver_config(impulse_cfg), grid, dim, heads, head_dim, depth,
                         seed=impulse_cfg.seed, cache_dir=impulse_cfg.cache_dir)
print(solution.report())
print(f"compile {solution.compile_seconds:.1f}s, solve {solution.solve_seconds:.2f}s")
""",
  ),
  (
    "md",
    """
## Targets and achieved attention on the pseudo input

Top: the impulse target of each head of layer 0, an `N x N` matrix (`N = 64`). A shift by
`(m, n)` is the diagonal at offset `8 m + n`; rows whose key falls outside the grid are zero (zero
padding). Bottom: `softmax(X Q K^T X^T / sqrt(hd))` with the solved `Q`, `K`. The second figure
shows the same for one query patch (red box), laid out on the 8x8 grid: the learned
"convolution kernel" of every head.
""",
  ),
  (
    "code",
    """
X = pseudo_input("pe", grid, dim)          # LayerNorm(sin-cos PE), the solver's input


def pseudo_attention(q, k):
  \"\"\"(H, N, N) softmax(X Q K^T X^T / sqrt(hd)) for q: (H, D, hd), k: (H, hd, D).\"\"\"
  return np.asarray(jax.nn.softmax(attention_logits_dense(q, k, X, head_dim**-0.5), axis=-1))


offsets = solution.offsets[solution.layer_solve[0]]     # (H, 2) row/column shift per head
targets = impulse_attention_matrix(grid, offsets)       # (H, N, N)
achieved = pseudo_attention(*solution.layer(0))

def show_heads(rows, labels, query=None, size=1.45, vmax=1.0):
  fig, axes = plt.subplots(len(rows), heads, figsize=(size * heads, size * len(rows)),
                           squeeze=False)
  for r, (maps, label) in enumerate(zip(rows, labels)):
    for h in range(heads):
      ax = axes[r, h]
      if query is None:
        ax.imshow(maps[h], cmap="viridis", vmin=0, vmax=vmax)
      else:
        ax.imshow(maps[h][query[0] * grid.width + query[1]].reshape(grid.height, grid.width),
                  cmap="viridis", vmin=0, vmax=vmax)
        ax.add_patch(matplotlib.patches.Rectangle((query[1] - .5, query[0] - .5), 1, 1,
                                                  fill=False, ec="red", lw=1.5))
      ax.set_xticks([]); ax.set_yticks([])
      if r == 0:
        ax.set_title(f"head {h} ({offsets[h][0]:+d},{offsets[h][1]:+d})", fontsize=8)
    axes[r, 0].set_ylabel(label, fontsize=9)
  plt.tight_layout(); plt.show()

show_heads([targets, achieved], ["target", "solved"])
show_heads([targets, achieved], ["target", "solved"], query=(3, 4))
""",
  ),
  (
    "md",
    """
## Impulse vs mimetic vs random initialization in a model

`apply_init` writes an initialization into a freshly initialised params tree: here a 2-layer
structured-init ViT (`structvit_*`: sin-cos positions, global average pooling). The impulse init
finds the solution in the cache and writes it; mimetic init sets `W_q W_k^T` to the best rank-`hd`
approximation of `alpha Z + beta I` (`Z` random: a bias towards attending to the query itself,
weak here since `hd = 8` of `D = 72` directions are kept); trunc-normal is timm's random init.

First the solver's own measure, on the pseudo input: per head, the Eq. 8 error
`mean((A - H_impulse)^2)` and the fraction of query rows whose largest attention is the target key.
""",
  ),
  (
    "code",
    """
import flax.linen as nn
from locvit.models import create_model

model = create_model("structvit_d8_dim64_h4_patch2_32", num_classes=10, embed_dim=dim,
                     num_heads=heads, depth=depth, patch_size=1)
params = nn.meta.unbox(jax.jit(model.init)(jax.random.key(0), jnp.zeros((1, 8, 8, 1)))["params"])
inits = {"impulse": impulse_cfg, "mimetic": init_config("mimetic"),
         "trunc_normal": init_config("trunc_normal")}
initialised = {name: apply_init(cfg, params, model, image_size=8) for name, cfg in inits.items()}


def qk_heads(p, layer):
  \"\"\"(Q, K) of a layer as the solver sees them: (H, D, hd) and (H, hd, D).\"\"\"
  kernel = p[f"blocks_{layer}"]["attn"]["qkv"]["kernel"]          # (D, 3, H, hd)
  return kernel[:, 0].transpose(1, 0, 2), kernel[:, 1].transpose(1, 2, 0)


def errors(attention, target):
  \"\"\"Per head: Eq. 8 error and the argmax hit rate over rows with an in-grid target.\"\"\"
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
axes[1].set(xlabel="head (layer 0)", ylabel="fraction of rows", ylim=(0, 1.05),
            title="argmax = impulse target")
axes[1].legend(fontsize=8); plt.tight_layout(); plt.show()
show_heads([targets] + list(on_pseudo.values()), ["target"] + list(on_pseudo), query=(3, 4))
""",
  ),
  (
    "md",
    """
## On real images

In the network, the first layer sees `LayerNorm(patch embedding + position embedding)` of real
digits, and the q/k biases and patch embedding of the base init (PyTorch's default, as in the
reference) add content to the pseudo input. `init_maps.attention_maps` averages every layer's
attention over 128 test digits (the paper's Fig. 3 does this on CIFAR-10); the colour scale
below stops at 0.2 (uniform attention is 1/64 = 0.016). The impulse heads keep their shifted
diagonal, blurred by the image content; mimetic init gives a faint banded pattern, random init a
nearly uniform map. The printed errors compare each init with the impulse targets of that layer.
""",
  ),
  (
    "code",
    """
from locvit.analysis import init_maps
from locvit.data import DigitsSource

images = init_maps.load_images(DigitsSource("test"), 128, mean=(0.5,), std=(0.5,))
apply = init_maps.intermediates_fn(model)             # compiled once for all inits
maps = {name: init_maps.attention_maps(model, p, images, apply=apply)
        for name, p in initialised.items()}
show_heads([targets] + [m[0] for m in maps.values()], ["target"] + list(maps), vmax=0.2)
for name, m in maps.items():
  for layer in range(depth):
    layer_targets = impulse_attention_matrix(grid, solution.offsets[solution.layer_solve[layer]])
    mse, hit = errors(m[layer], layer_targets)
    print(f"{name:>12} layer {layer}: Eq. 8 error {mse.mean():.2e}   "
          f"argmax on target {hit.mean():.2f}")
""",
  ),
  (
    "md",
    """
The same comparison at the paper's scale (ViT-T on CIFAR-10, 16x16 tokens) is
`python -m locvit.analysis.init_maps --model=structvit_tiny_patch2_32
--inits=impulse,mimetic,trunc_normal --image_folder=DIR --out=OUT`, and training with an init is
`--config.init.name=impulse` (see `configs/structinit_*.py`).
""",
  ),
]


GMM_MASKS = [
  (
    "md",
    """
# Gaussian mixture (GMM) and element-wise (ELM) attention masks

Li & Zhang ("RetNet viewed through convolution") give self-attention a convolutional prior by
multiplying the scaled logits with a mask that depends on the distance between query and key:
`softmax((q k^T / sqrt(d)) * M) v` (Eq. 9, the official code's `combine='multiply'`).

* **GMM** (Eq. 1): per head, `M_h(d) = sum_k alpha_kh exp(-d^2 / (2 sigma_kh^2))`, a mixture of
  `K` Gaussians of the query-key distance `d` on the token grid: `2 K H` parameters per layer.
* **ELM**: a free `N x N` table per layer, shared by the heads, initialised to zeros.

This notebook builds both masks with `locvit.attention.masks`, shows how `alpha` and `sigma`
shape them, and shows the float32 underflow of the official ("faithful") way of computing the
Gaussian kernel.
""",
  ),
  ("code", INSTALL),
  ("code", SETUP),
  (
    "md",
    """
## A GMM mask at initialisation

`GaussianMixtureMask` is a Linen module called with the token grid; it returns the `(H, N, N)`
table (no batch dimension: it is computed once per call and shared by all images). At init,
`alpha ~ N(0, 2^2)` and `sigma ~ N(10, 10^2)` (Sec. 4.2). `locvit.analysis.masks.unfold_mask`
lays every query's row out on the grid, tiled by query: tile `(r, c)` is the "convolution
kernel" the mask applies around query `(r, c)`.
""",
  ),
  (
    "code",
    """
import flax.linen as nn
from locvit.analysis.masks import unfold_mask
from locvit.attention import TokenGrid, squared_distances
from locvit.attention.masks import (ElementwiseMask, GaussianMixtureMask, gaussian_base_table,
                                    gaussian_mixture)

grid = TokenGrid(8, 8)
gmm = GaussianMixtureMask(num_heads=4, num_kernels=5, kernel="intended")
variables = nn.meta.unbox(gmm.init(jax.random.key(0), grid))   # plain arrays, no axis names
table = np.asarray(gmm.apply(variables, grid))
print("alpha", variables["params"]["alpha"].shape, " sigma", variables["params"]["sigma"].shape,
      " table", table.shape)

fig, axes = plt.subplots(2, 4, figsize=(12, 6.2))
for h in range(4):
  for row, image in enumerate((table[h], unfold_mask(table[h], grid))):
    im = axes[row, h].imshow(image, cmap="RdBu_r", norm=matplotlib.colors.CenteredNorm())
    axes[row, h].set_xticks([]); axes[row, h].set_yticks([])
    fig.colorbar(im, ax=axes[row, h], fraction=0.046)
  axes[0, h].set_title(f"head {h}")
axes[0, 0].set_ylabel("M (N x N)"); axes[1, 0].set_ylabel("unfolded per query")
plt.tight_layout(); plt.show()
""",
  ),
  (
    "md",
    """
## How alpha and sigma shape the mask

One Gaussian (`K = 1`) for the centre query of a 15x15 grid. `sigma` sets the width; `alpha` the
sign and height. Because the mask *multiplies* the logits, `M = 0` does not block a key: it sets
its logit to 0. A positive `alpha` keeps (and scales) the logits of nearby keys, a negative one
flips their sign. The last row mixes two kernels: a narrow positive and a wide negative
Gaussian make a centre-surround mask.

Below each mask: the attention of that query when every content logit `q.k / sqrt(d)` equals 2,
`softmax(2 M)`, i.e. what the mask alone does to a query that likes every key equally.
""",
  ),
  (
    "code",
    """
big = TokenGrid(15, 15)
centre = 7 * 15 + 7
sigmas = [0.7, 1.5, 3.0, 6.0]
rows = [("alpha = 2", lambda s: ([2.0], [s])), ("alpha = -2", lambda s: ([-2.0], [s])),
        ("alpha = (3, -1),\\nsigma = (s, 3 s)", lambda s: ([3.0, -1.0], [s, 3 * s]))]
fig, axes = plt.subplots(2 * len(rows), len(sigmas), figsize=(9.5, 12.5))
for r, (label, params) in enumerate(rows):
  for c, s in enumerate(sigmas):
    alpha, sigma = (jnp.asarray(v)[:, None] for v in params(s))      # (K, H=1)
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
  ax.set_xticks([]); ax.set_yticks([])
plt.tight_layout(); plt.show()
""",
  ),
  (
    "md",
    """
## ELM: a free table, zero at init

`ElementwiseMask` holds one `(N, N)` parameter per layer, broadcast to every head. The official
init is zeros, so at initialisation every logit is multiplied by 0 and the attention is uniform;
training can then shape the table freely (`N^2` parameters instead of GMM's `2 K H`).
`GMMAttention` and `ELMAttention` (attention kinds `'gmm'` and `'elm'`) wrap the masks in the
library's attention module; applied with `mutable=["intermediates"]` they record their attention
maps and mask tables.
""",
  ),
  (
    "code",
    """
from locvit.attention.masks import ELMAttention, GMMAttention

elm = ElementwiseMask(num_heads=4)
elm_vars = nn.meta.unbox(elm.init(jax.random.key(0), grid))
print("ELM parameter", elm_vars["params"]["elm"].shape, "-> table", elm.apply(elm_vars, grid).shape,
      f"({grid.num_tokens ** 2} parameters vs {2 * 5 * 4} for a 5-kernel GMM with 4 heads)")

x = jax.random.normal(jax.random.key(1), (2, grid.num_tokens, 64))    # (batch, tokens, channels)
elm_layer = ELMAttention(num_heads=4)
elm_params = elm_layer.init(jax.random.key(2), x, grid=grid)
_, state = elm_layer.apply(elm_params, x, grid=grid, mutable=["intermediates"])
attention = state["intermediates"]["attention"][0]                    # (B, H, N, N)
print("ELM attention at init is uniform (1/N everywhere):",
      bool(jnp.allclose(attention, 1 / grid.num_tokens)))

# A GMM mask is an ELM table of a special form: write the GMM layer's table into an ELM layer
# with the same q/k/v weights and the two attention maps agree.
gmm_layer = GMMAttention(num_heads=1, kernel="intended")
gmm_params = gmm_layer.init(jax.random.key(3), x, grid=grid)
_, gmm_state = gmm_layer.apply(gmm_params, x, grid=grid, mutable=["intermediates"])
elm_params = {"params": {**gmm_params["params"],
                         "mask": {"elm": gmm_state["intermediates"]["mask"]["table"][0][0]}}}
_, elm_state = ELMAttention(num_heads=1).apply(elm_params, x, grid=grid, mutable=["intermediates"])
difference = jnp.abs(gmm_state["intermediates"]["attention"][0]
                     - elm_state["intermediates"]["attention"][0]).max()
print(f"GMM vs ELM holding the GMM table: max |attention difference| = {difference:.1e}")
""",
  ),
  (
    "md",
    """
## Faithful vs intended Gaussian kernel: float32 underflow

The official code computes each Gaussian as a power of a base table,
`B ** (1 / sigma^2)` with `B = exp(-d^2) ** 0.5` (`kernel='faithful'`). In exact arithmetic this
is `exp(-d^2 / (2 sigma^2))` (`kernel='intended'`). In float32, `exp(-d^2)` is exactly 0 once
`d^2 >= 104`, and `0 ** (1 / sigma^2) = 0` whatever `sigma` is: every key farther than about 10.2
patches gets a mask of exactly 0, even when `sigma` is large and the intended value is close to 1.
On 8x8 grids (CIFAR at patch 4) the largest `d^2` is 98, so nothing happens; on a 16x16 grid
(ImageNet at patch 14, CIFAR at patch 2) a third of the table is zeroed.
""",
  ),
  (
    "code",
    """
grid16 = TokenGrid(16, 16)
d2 = squared_distances(grid16)
sigmas = jnp.asarray([[1.0, 3.0, 10.0]])                      # (K=1, H=3)
ones = jnp.ones_like(sigmas)
faithful = np.asarray(gaussian_mixture(ones, sigmas, grid16, kernel="faithful"))
intended = np.asarray(gaussian_mixture(ones, sigmas, grid16, kernel="intended"))
base_zeros = int(np.sum(gaussian_base_table(grid16) == 0))
print(f"16x16 grid: base table B has {base_zeros:,} zeros of {d2.size:,} entries")
for h, s in enumerate(sigmas[0]):
  print(f"  sigma={float(s):4.1f}: faithful zeros {np.sum(faithful[h] == 0):6,}   "
        f"intended zeros {np.sum(intended[h] == 0):6,}   largest |difference| "
        f"{np.abs(faithful[h] - intended[h]).max():.3f}")

levels, first = np.unique(d2, return_index=True)
rows, cols = np.unravel_index(first, d2.shape)
fig, axes = plt.subplots(1, 3, figsize=(15, 4.2), width_ratios=(1.3, 1, 1))
for h, s in enumerate(sigmas[0]):
  colour = f"C{h}"
  axes[0].plot(levels, intended[h][rows, cols], color=colour, label=f"intended, sigma={float(s):g}")
  axes[0].plot(levels, faithful[h][rows, cols], "--", color=colour, lw=2,
               label=f"faithful, sigma={float(s):g}")
axes[0].axvline(104, color="gray", lw=0.8)
axes[0].text(106, 0.9, "exp(-d^2) = 0\\nin float32", fontsize=8)
axes[0].set(xlabel="squared distance d^2 (patches^2)", ylabel="mask value (alpha = 1)",
            title="kernel vs distance on a 16x16 grid")
axes[0].legend(fontsize=7)
corner = 0                                                     # query in the top-left corner
for ax, (name, t) in zip(axes[1:], [("intended", intended), ("faithful", faithful)]):
  im = ax.imshow(t[2, corner].reshape(16, 16), cmap="viridis", vmin=0, vmax=1)
  zero = np.ma.masked_where(t[2, corner].reshape(16, 16) != 0, np.ones((16, 16)))
  ax.imshow(zero, cmap="autumn", alpha=0.8)
  ax.set(title=f"{name}, sigma=10, query (0, 0)\\nred: exactly 0", xticks=[], yticks=[])
  fig.colorbar(im, ax=ax, fraction=0.046)
plt.tight_layout(); plt.show()
""",
  ),
  (
    "md",
    """
The intended kernel has zeros too at `sigma = 1`: there `exp(-d^2 / 2)` is truly below float32's
smallest number, which changes nothing. The faithful zeros replace values up to 0.6.

Choose the kernel with `kernel='faithful' | 'intended'` on the mask modules, or through a
backbone's `attention_kwargs`:

```python
from locvit.attention.masks import mask_attention_kwargs
model = create_model("gmm_vit_smalldata_d9_patch4_32",
                     attention_kwargs=mask_attention_kwargs("gmm", kernel="intended"))
```

`combine='add'` adds the mask to the logits instead, as the paper's text describes, and runs in
the fused attention kernel.
""",
  ),
]


OWN_MODEL = [
  (
    "md",
    """
# Your own model with locvit's attention layers, and timm weights in Flax

Part 1 drops a ConViT GPSA layer and a Gaussian-mixture-mask attention layer into a Flax module
written from scratch: they are ordinary `flax.linen` modules called on `(batch, tokens, channels)`
with the token grid. Part 2 converts a PyTorch/timm ConViT state dict into Flax variables with
`locvit.convert` and checks that the logits agree.
""",
  ),
  ("code", INSTALL),
  ("code", SETUP),
  (
    "md",
    """
## 1. GPSA and GMM attention inside a user-defined module

`GPSA` and `GMMAttention` (from `locvit.attention`) take `(B, N, C)` tokens and a `TokenGrid`
saying how the `N` tokens lie on the image; they build their positional terms from it (once per
call, shared by the batch). Everything else here is plain Flax.
""",
  ),
  (
    "code",
    """
import flax.linen as nn
from locvit.attention import GPSA, GMMAttention, TokenGrid


class TinyLocalNet(nn.Module):
  \"\"\"Patchify -> GPSA block -> GMM-attention block -> MLP -> mean pool -> classifier.\"\"\"
  num_classes: int = 10
  dim: int = 64
  patch: int = 1

  @nn.compact
  def __call__(self, images, train: bool = False):
    x = nn.Conv(self.dim, (self.patch, self.patch), strides=self.patch, name="patchify")(images)
    batch, height, width, _ = x.shape
    grid = TokenGrid(height, width)
    x = x.reshape(batch, height * width, self.dim)
    x = x + GPSA(num_heads=4, locality_strength=1.0, name="gpsa")(
        nn.LayerNorm()(x), grid=grid, train=train)
    x = x + GMMAttention(num_heads=4, num_kernels=3, kernel="intended", name="gmm")(
        nn.LayerNorm()(x), grid=grid, train=train)
    x = x + nn.Dense(self.dim)(nn.gelu(nn.Dense(2 * self.dim)(nn.LayerNorm()(x))))
    return nn.Dense(self.num_classes, name="head")(nn.LayerNorm()(x).mean(axis=1))


from locvit.data import DigitsSource
from locvit.analysis.init_maps import load_images

images = load_images(DigitsSource("test"), 16, mean=(0.5,), std=(0.5,))   # (16, 8, 8, 1)
net = TinyLocalNet()
variables = nn.meta.unbox(net.init(jax.random.key(0), images[:1]))
logits = jax.jit(net.apply)(variables, images)
print("logits", logits.shape)
for name in ("gpsa", "gmm"):
  print(f"{name} parameters:", jax.tree.map(lambda a: a.shape, variables["params"][name]))
""",
  ),
  (
    "md",
    """
With `mutable=["intermediates"]` the layers record what they computed: the attention maps
`(B, H, N, N)`, GPSA's positional attention `softmax(v_pos . r)` and gates `sigmoid(lambda)`,
and the GMM mask table `(H, N, N)`. Below, for one digit and the query patch in the red box:
GPSA at its convolutional (local) init, where each head attends around one offset of a 2x2
kernel (at init the content softmax is nearly uniform, so the mixed attention is the positional
one, weighted by the gate `g = sigmoid(1) = 0.73`), and the GMM layer, whose random mask
(`alpha ~ N(0, 2^2)`, `sigma ~ N(10, 10^2)`, shown centred on 0: red positive, blue negative)
multiplies the content logits, so the digit's strokes show through.
""",
  ),
  (
    "code",
    """
_, state = net.apply(variables, images[:1], mutable=["intermediates"])
inter = state["intermediates"]
for path, value in jax.tree_util.tree_flatten_with_path(inter)[0]:
  print("/".join(str(getattr(p, "key", getattr(p, "idx", p))) for p in path), value.shape)

query = (3, 4)
q = query[0] * 8 + query[1]
rows = {
  "GPSA attention": inter["gpsa"]["attention"][0][0],           # (H, N, N) of image 0
  "GPSA positional": inter["gpsa"]["pos_attention"][0],
  "GMM attention": inter["gmm"]["attention"][0][0],
  "GMM mask": inter["gmm"]["mask"]["table"][0],
}
gates = inter["gpsa"]["gate"][0]
fig, axes = plt.subplots(len(rows), 5, figsize=(10, 8.6))
axes[0, 0].imshow(images[0, ..., 0], cmap="gray")
axes[0, 0].set_title("input", fontsize=8)
for r, (label, maps) in enumerate(rows.items()):
  axes[r, 1].set_ylabel(label, fontsize=9)
  for h in range(4):
    style = dict(cmap="RdBu_r", norm=matplotlib.colors.CenteredNorm()) if "mask" in label else {}
    axes[r, h + 1].imshow(np.asarray(maps[h, q]).reshape(8, 8), **style)
    title = f"head {h}" + (f"  g={gates[h]:.2f}" if label.startswith("GPSA") else "")
    axes[r, h + 1].set_title(title, fontsize=8)
  for ax in axes[r, (0 if r == 0 else 1):]:
    ax.add_patch(matplotlib.patches.Rectangle((query[1] - .5, query[0] - .5), 1, 1,
                                              fill=False, ec="red", lw=1.5))
  for ax in axes[r]:
    ax.set_xticks([]); ax.set_yticks([])
  if r:
    axes[r, 0].axis("off")
""",
  ),
  (
    "md",
    """
The same layers are registered as attention kinds (`'gpsa'`, `'psa'`, `'gmm'`, `'elm'`,
`'quadratic'`, ...), so the library's `VisionTransformer` can use them per layer, e.g.
`create_model("deit_tiny_patch4_32", layer_attention=("gpsa",) * 4 + ("mhsa",) * 8,
class_token_layer=4)`; `locvit.attention.register_attention(name)` adds your own kind.

## 2. Converting a timm checkpoint

`locvit.convert.from_timm(model_name, state_dict, **overrides)` maps timm's parameter names
(`blocks.3.attn.qk.weight`, `pos_embed`, ...) onto locvit's ConViT/DeiT parameter tree,
transposing and reshaping PyTorch's `(out, in)` weights, and refuses a state dict with missing,
unexpected or mis-shaped keys (listing all of them). It accepts torch tensors or NumPy arrays.

Here a ConViT-Ti for 32x32 images (patch 4, 10 classes, 12 layers of which 10 GPSA) stands in
for a real checkpoint. Its weights come from, in order of preference:

1. **timm**, if installed: `timm.create_model("convit_tiny", pretrained=False, img_size=32,
   patch_size=4, num_classes=10)`: random weights, no download;
2. locvit's PyTorch reference ConViT (`tests/torch_reference.py`, what the test suite uses),
   when this notebook runs from a locvit checkout with PyTorch;
3. without PyTorch: a NumPy state dict with timm's names and random values. The conversion runs,
   but there is no PyTorch model to compare the logits with, and the command line (which reads
   `.pth` or `.safetensors` files) is skipped.

Noise is added to every weight so that identity or zero initialisations cannot hide a
transposed matrix.
""",
  ),
  (
    "code",
    """
from locvit.convert import expected_state_dict_shapes, from_timm
from locvit.models import create_model

name, num_classes = "convit_tiny_patch4_32", 10
shapes = expected_state_dict_shapes(name, num_classes=num_classes)
print(f"{name}: {len(shapes)} tensors, e.g.")
for key in [k for k in shapes if not k.startswith("blocks.") or k.startswith("blocks.0.")]:
  print(f"  {key:32s} {shapes[key]}")

try:
  import torch
except ImportError:
  torch = None
reference, source = None, "NumPy (no PyTorch)"
if torch is not None:
  torch.manual_seed(0)
  try:
    import timm
    reference = timm.create_model("convit_tiny", pretrained=False, img_size=32, patch_size=4,
                                  num_classes=num_classes)
    source = f"timm {timm.__version__}"
  except ImportError:
    if (root / "tests" / "torch_reference.py").exists():
      sys.path.insert(0, str(root / "tests"))
      import torch_reference
      reference = torch_reference.build("convit_tiny", img_size=32, patch_size=4,
                                        num_classes=num_classes)
      source = "tests/torch_reference.py"
if reference is not None:
  with torch.no_grad():
    for p in reference.parameters():
      p.add_(0.05 * torch.randn_like(p))
  state_dict = reference.eval().state_dict()
else:
  rng = np.random.default_rng(0)
  state_dict = {k: rng.normal(0, 0.05, s).astype(np.float32) for k, s in shapes.items()}
print("weights from:", source)
""",
  ),
  (
    "code",
    """
variables = from_timm(name, state_dict, num_classes=num_classes)
model = create_model(name, num_classes=num_classes)
x = np.random.default_rng(1).normal(size=(8, 32, 32, 3)).astype(np.float32)   # NHWC for Flax
flax_logits = np.asarray(jax.jit(model.apply)(variables, x))
print("Flax logits", flax_logits.shape)
if reference is not None:
  with torch.no_grad():
    torch_logits = reference(torch.from_numpy(x).permute(0, 3, 1, 2)).numpy()   # NCHW
  error = np.abs(flax_logits - torch_logits).max()
  print(f"max |Flax - PyTorch| = {error:.1e}")
  assert error < 1e-4
  plt.figure(figsize=(3.6, 3.4))
  plt.scatter(torch_logits.ravel(), flax_logits.ravel(), s=8)
  plt.xlabel(f"PyTorch logits ({source})"); plt.ylabel("converted Flax logits")
  plt.title(f"max difference {error:.0e}", fontsize=9); plt.show()
""",
  ),
  (
    "md",
    """
### The command line

`python -m locvit.convert` reads a `.pth`/`.pt`/`.bin` file (also an official training checkpoint
that wraps the weights as `{"model": state_dict, ...}`), a `.safetensors` file or a `.npz` of
NumPy arrays, converts it and writes an orbax checkpoint that `locvit.convert.load_converted`
restores; `--override FIELD=VALUE` passes the model fields a checkpoint was trained with (e.g.
`--override depth=6`). Here it converts the state dict above after saving it to a file (no
network needed):
""",
  ),
  (
    "code",
    """
import subprocess, tempfile
from locvit.convert import load_converted
from locvit.convert.timm import to_numpy

# A .npz of the timm-named arrays needs no PyTorch (a .pth / .safetensors file works the same).
tmp = pathlib.Path(tempfile.mkdtemp())
np.savez(tmp / "convit_tiny_32.npz", **{k: to_numpy(v) for k, v in state_dict.items()})
command = [sys.executable, "-m", "locvit.convert", f"--model={name}",
           f"--num_classes={num_classes}", f"--input={tmp / 'convit_tiny_32.npz'}",
           f"--output={tmp / 'flax'}"]
print("$ python", " ".join(command[1:]).replace(str(tmp), "DIR"))
print(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
restored = load_converted(tmp / "flax")
same = np.array_equal(np.asarray(jax.jit(model.apply)(restored, x)), flax_logits)
print("restored checkpoint gives the same logits:", same)
assert same
""",
  ),
  (
    "md",
    """
### A real pretrained checkpoint

With network access, download timm's weights once and convert them (the same two steps work for
`convit_small`, `convit_base` and `deit_{tiny,small,base}_patch16_224`):

```bash
pip install timm
python - <<'EOF'
import timm, torch
model = timm.create_model("convit_tiny", pretrained=True)   # downloads from the Hugging Face Hub
torch.save(model.state_dict(), "convit_tiny.pth")
EOF
python -m locvit.convert --model=convit_tiny --input=convit_tiny.pth --output=/tmp/convit_tiny_flax
```

```python
from locvit.convert import load_converted
from locvit.models import create_model
variables = load_converted("/tmp/convit_tiny_flax")
logits = create_model("convit_tiny").apply(variables, images)   # images: (B, 224, 224, 3) NHWC,
                                                                # normalised with ImageNet mean/std
```

A checkpoint fine-tuned with a different head needs `--num_classes`; a `.safetensors` file from
the Hugging Face Hub can be passed to `--input` directly (with `pip install safetensors`).
""",
  ),
]


if __name__ == "__main__":
  notebook("01_quickstart.ipynb", QUICKSTART)
  notebook("02_locality_analysis.ipynb", LOCALITY)
  notebook("03_structured_init.ipynb", STRUCTURED_INIT)
  notebook("04_gmm_masks.ipynb", GMM_MASKS)
  notebook("05_own_model_and_timm.ipynb", OWN_MODEL)
