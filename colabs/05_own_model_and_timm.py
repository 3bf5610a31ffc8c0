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
# # Your own model with locvit's attention layers, and timm weights in Flax
#
# Part 1 drops a ConViT GPSA layer and a Gaussian-mixture-mask attention layer into a Flax module
# written from scratch: they are ordinary `flax.linen` modules called on `(batch, tokens, channels)`
# with the token grid. Part 2 converts a PyTorch/timm ConViT state dict into Flax variables with
# `locvit.convert` and checks that the logits agree.

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
# ## 1. GPSA and GMM attention inside a user-defined module
#
# `GPSA` and `GMMAttention` (from `locvit.attention`) take `(B, N, C)` tokens and a `TokenGrid`
# saying how the `N` tokens lie on the image; they build their positional terms from it (once per
# call, shared by the batch). Everything else here is plain Flax.

# %%
import flax.linen as nn

from locvit.attention import GPSA, GMMAttention, TokenGrid


class TinyLocalNet(nn.Module):
  """Patchify -> GPSA block -> GMM-attention block -> MLP -> mean pool -> classifier."""

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
      nn.LayerNorm()(x), grid=grid, train=train
    )
    x = x + GMMAttention(num_heads=4, num_kernels=3, kernel="intended", name="gmm")(
      nn.LayerNorm()(x), grid=grid, train=train
    )
    x = x + nn.Dense(self.dim)(nn.gelu(nn.Dense(2 * self.dim)(nn.LayerNorm()(x))))
    return nn.Dense(self.num_classes, name="head")(nn.LayerNorm()(x).mean(axis=1))


from locvit.analysis.init_maps import load_images
from locvit.data import DigitsSource

images = load_images(DigitsSource("test"), 16, mean=(0.5,), std=(0.5,))  # (16, 8, 8, 1)
net = TinyLocalNet()
variables = nn.meta.unbox(net.init(jax.random.key(0), images[:1]))
logits = jax.jit(net.apply)(variables, images)
print("logits", logits.shape)
for name in ("gpsa", "gmm"):
  print(f"{name} parameters:", jax.tree.map(lambda a: a.shape, variables["params"][name]))

# %% [markdown]
# With `mutable=["intermediates"]` the layers record what they computed: the attention maps
# `(B, H, N, N)`, GPSA's positional attention `softmax(v_pos . r)` and gates `sigmoid(lambda)`,
# and the GMM mask table `(H, N, N)`. Below, for one digit and the query patch in the red box:
# GPSA at its convolutional (local) init, where each head attends around one offset of a 2x2
# kernel (at init the content softmax is nearly uniform, so the mixed attention is the positional
# one, weighted by the gate `g = sigmoid(1) = 0.73`), and the GMM layer, whose random mask
# (`alpha ~ N(0, 2^2)`, `sigma ~ N(10, 10^2)`, shown centred on 0: red positive, blue negative)
# multiplies the content logits. Those are small at init, so the GMM attention is nearly uniform
# (about 1/64 on every patch), the digit's strokes showing faintly through. Each row has one
# colour scale (its colour bar).

# %%
from locvit.analysis import plots

_, state = net.apply(variables, images[:1], mutable=["intermediates"])
inter = state["intermediates"]
for path, value in jax.tree_util.tree_flatten_with_path(inter)[0]:
  print("/".join(str(getattr(p, "key", getattr(p, "idx", p))) for p in path), value.shape)

query = (3, 4)
q = query[0] * 8 + query[1]
rows = {
  "GPSA attention": inter["gpsa"]["attention"][0][0],  # (H, N, N) of image 0
  "GPSA positional": inter["gpsa"]["pos_attention"][0],
  "GMM attention": inter["gmm"]["attention"][0][0],
  "GMM mask": inter["gmm"]["mask"]["table"][0],
}
gates = inter["gpsa"]["gate"][0]
fig, axes = plt.subplots(len(rows), 5, figsize=(11, 8.6), layout="constrained")
axes[0, 0].imshow(images[0, ..., 0], cmap="gray")
axes[0, 0].set_title("input", fontsize=8)
for r, (label, maps) in enumerate(rows.items()):
  panels = [np.asarray(maps[h, q]).reshape(8, 8) for h in range(4)]
  # One colour scale per row (its colour bar): the mask centred on 0, attention from 0.
  if "mask" in label:
    norm = matplotlib.colors.CenteredNorm(halfrange=max(np.abs(p).max() for p in panels))
    cmap, bar_label = "RdBu_r", "mask value"
  else:
    norm, cmap, bar_label = plots.shared_norm(panels, vmin=0.0), "viridis", "attention"
  axes[r, 1].set_ylabel(label, fontsize=9)
  for h, panel in enumerate(panels):
    axes[r, h + 1].imshow(panel, cmap=cmap, norm=norm)
    title = f"head {h}" + (f"  g={gates[h]:.2f}" if label.startswith("GPSA") else "")
    axes[r, h + 1].set_title(title, fontsize=8)
  bar = fig.colorbar(matplotlib.cm.ScalarMappable(norm, cmap), ax=axes[r, 1:], shrink=0.9)
  bar.set_label(bar_label, fontsize=8)
  for ax in axes[r, (0 if r == 0 else 1) :]:
    ax.add_patch(
      matplotlib.patches.Rectangle(
        (query[1] - 0.5, query[0] - 0.5), 1, 1, fill=False, ec="red", lw=1.5
      )
    )
  for ax in axes[r]:
    ax.set_xticks([])
    ax.set_yticks([])
  if r:
    axes[r, 0].axis("off")

# %% [markdown]
# The same layers are registered as attention kinds (`'gpsa'`, `'psa'`, `'gmm'`, `'elm'`,
# `'quadratic'`, ...), so the library's `VisionTransformer` can use them per layer, e.g.
# `create_model("deit_tiny_patch4_32", num_heads=4, layer_attention=("gpsa",) * 4 + ("mhsa",)
# * 8, class_token_layer=4)` (4 heads as in ConViT-Ti: GPSA's local init places a square number
# of heads on a kernel); `locvit.attention.register_attention(name)` adds your own kind.
#
# ## 2. Converting a timm checkpoint
#
# `locvit.convert.from_timm(model_name, state_dict, **overrides)` maps timm's parameter names
# (`blocks.3.attn.qk.weight`, `pos_embed`, ...) onto locvit's ConViT/DeiT parameter tree,
# transposing and reshaping PyTorch's `(out, in)` weights, and refuses a state dict with missing,
# unexpected or mis-shaped keys (listing all of them). It accepts torch tensors or NumPy arrays.
#
# Here a ConViT-Ti for 32x32 images (patch 4, 10 classes, 12 layers of which 10 GPSA) stands in
# for a real checkpoint. Its weights come from, in order of preference:
#
# 1. **timm**, if installed: `timm.create_model("convit_tiny", pretrained=False, img_size=32,
#    patch_size=4, num_classes=10)`: random weights, no download;
# 2. locvit's PyTorch reference ConViT (`benchmarks/torch_reference.py`, what the test suite uses),
#    when this notebook runs from a locvit checkout with PyTorch;
# 3. without PyTorch: a NumPy state dict with timm's names and random values. The conversion runs,
#    but there is no PyTorch model to compare the logits with, and the command line (which reads
#    `.pth` or `.safetensors` files) is skipped.
#
# Noise is added to every weight so that identity or zero initialisations cannot hide a
# transposed matrix.

# %%
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

    reference = timm.create_model(
      "convit_tiny", pretrained=False, img_size=32, patch_size=4, num_classes=num_classes
    )
    source = f"timm {timm.__version__}"
  except ImportError:
    if (root / "benchmarks" / "torch_reference.py").exists():
      sys.path.insert(0, str(root / "benchmarks"))
      import torch_reference

      reference = torch_reference.build(
        "convit_tiny", img_size=32, patch_size=4, num_classes=num_classes
      )
      source = "benchmarks/torch_reference.py"
if reference is not None:
  with torch.no_grad():
    for p in reference.parameters():
      p.add_(0.05 * torch.randn_like(p))
  state_dict = reference.eval().state_dict()
else:
  rng = np.random.default_rng(0)
  state_dict = {k: rng.normal(0, 0.05, s).astype(np.float32) for k, s in shapes.items()}
print("weights from:", source)

# %%
variables = from_timm(name, state_dict, num_classes=num_classes)
model = create_model(name, num_classes=num_classes)
x = np.random.default_rng(1).normal(size=(8, 32, 32, 3)).astype(np.float32)  # NHWC for Flax
flax_logits = np.asarray(jax.jit(model.apply)(variables, x))
print("Flax logits", flax_logits.shape)
if reference is not None:
  with torch.no_grad():
    torch_logits = reference(torch.from_numpy(x).permute(0, 3, 1, 2)).numpy()  # NCHW
  error = np.abs(flax_logits - torch_logits).max()
  print(f"max |Flax - PyTorch| = {error:.1e}")
  assert error < 1e-4
  plt.figure(figsize=(3.6, 3.4))
  plt.scatter(torch_logits.ravel(), flax_logits.ravel(), s=8)
  plt.xlabel(f"PyTorch logits ({source})")
  plt.ylabel("converted Flax logits")
  plt.title(f"max difference {error:.0e}", fontsize=9)
  plt.show()

# %% [markdown]
# ### The command line
#
# `python -m locvit.convert` reads a `.pth`/`.pt`/`.bin` file (also an official training checkpoint
# that wraps the weights as `{"model": state_dict, ...}`), a `.safetensors` file or a `.npz` of
# NumPy arrays, converts it and writes an orbax checkpoint that `locvit.convert.load_converted`
# restores; `--override FIELD=VALUE` passes the model fields a checkpoint was trained with (e.g.
# `--override depth=6`). Here it converts the state dict above after saving it to a file (no
# network needed):

# %%
import subprocess
import tempfile

from locvit.convert import load_converted
from locvit.convert.timm import to_numpy

# A .npz of the timm-named arrays needs no PyTorch (a .pth / .safetensors file works the same).
tmp = pathlib.Path(tempfile.mkdtemp())
np.savez(tmp / "convit_tiny_32.npz", **{k: to_numpy(v) for k, v in state_dict.items()})
command = [
  sys.executable,
  "-m",
  "locvit.convert",
  f"--model={name}",
  f"--num_classes={num_classes}",
  f"--input={tmp / 'convit_tiny_32.npz'}",
  f"--output={tmp / 'flax'}",
]
print("$ python", " ".join(command[1:]).replace(str(tmp), "DIR"))
converted = subprocess.run(command, check=True, capture_output=True, text=True)
print(converted.stdout.replace(str(tmp), "DIR"))
restored = load_converted(tmp / "flax")
same = np.array_equal(np.asarray(jax.jit(model.apply)(restored, x)), flax_logits)
print("restored checkpoint gives the same logits:", same)
assert same

# %% [markdown]
# ### A real pretrained checkpoint
#
# With network access, download timm's weights once and convert them (the same two steps work for
# `convit_small`, `convit_base` and `deit_{tiny,small,base}_patch16_224`):
#
# ```bash
# pip install timm
# python - <<'EOF'
# import timm, torch
# model = timm.create_model("convit_tiny", pretrained=True)   # downloads from the Hugging Face Hub
# torch.save(model.state_dict(), "convit_tiny.pth")
# EOF
# python -m locvit.convert --model=convit_tiny --input=convit_tiny.pth \
#     --output=/tmp/convit_tiny_flax
# ```
#
# ```python
# from locvit.convert import load_converted
# from locvit.models import create_model
# variables = load_converted("/tmp/convit_tiny_flax")
# # images: (B, 224, 224, 3) NHWC, normalised with ImageNet mean/std
# logits = create_model("convit_tiny").apply(variables, images)
# ```
#
# A checkpoint fine-tuned with a different head needs `--num_classes`; a `.safetensors` file from
# the Hugging Face Hub can be passed to `--input` directly (with `pip install safetensors`).
