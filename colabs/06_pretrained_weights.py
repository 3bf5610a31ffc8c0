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
# # From published weights to predictions, a fine-tuned model, and ConViT's gates
#
# Published ConViT and DeiT weights (timm's `convit_tiny.fb_in1k`, ...) predict on a folder of
# your own images with their own preprocessing, fine-tune on your classes at your resolution
# (`configs/transfer.py`: DeiT's transfer recipe), and show what the pretrained model learned:
# its GPSA gates (ConViT Fig. 6) and attention maps (Fig. 7).
#
# Where the Hugging Face hub is reachable, name the weights and everything below runs on them:
#
# ```bash
# python -m locvit.main --mode=predict --config.init_from.weights=convit_tiny.fb_in1k \
#     --data=image_folder:PHOTOS --workdir=DIR        # DIR/predictions.jsonl, ImageNet names
# python -m locvit.main --config=transfer:convit_tiny,folder --data=image_folder:MINE \
#     --config.init_from.weights=convit_tiny.fb_in1k --workdir=RUN
# ```
#
# This notebook runs offline: it makes a small ConViT with timm's parameter names (4 blocks, 32x32
# images, 1000 ImageNet classes, random weights standing in for trained ones) and saves it as
# timm saves a model folder (`config.json` + `model.safetensors`, what the hub holds). Its
# predictions are arbitrary; the steps are the ones the real weights take.

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
import json
import tempfile

import jax
import numpy as np
from IPython.display import display

# %matplotlib inline
print("JAX", jax.__version__, jax.devices())
work = pathlib.Path(tempfile.mkdtemp())


def locvit_main(*args: str) -> str:
  """Runs `python -m locvit.main ARGS`, prints the command (paths under WORK) and its output."""
  command = [sys.executable, "-m", "locvit.main", *args]
  print("$ python", " ".join(command[1:]).replace(str(work), "WORK"))
  done = subprocess.run(command, capture_output=True, text=True)
  print((done.stdout + done.stderr).replace(str(work), "WORK").strip())
  done.check_returncode()
  return done.stdout


# %% [markdown]
# ## 1. "Published" weights: a timm model folder
#
# timm's ConViT-Ti with `img_size=32, patch_size=4, depth=4, local_up_to_layer=3`: 3 GPSA blocks,
# then the class token and one plain attention block. The weights come from timm if it is
# installed, else from locvit's PyTorch reference with timm's parameter names
# (`benchmarks/torch_reference.py`, in a checkout with PyTorch), else from random NumPy arrays of
# timm's names and shapes. `config.json` is the hub's: the architecture, its `model_args`, the
# class count and the preprocessing (`pretrained_cfg`).

# %%
from safetensors.numpy import save_file

from locvit.convert import expected_state_dict_shapes
from locvit.convert.timm import to_numpy

MODEL_ARGS = {"img_size": 32, "patch_size": 4, "depth": 4, "local_up_to_layer": 3}
LOCVIT_MODEL = [  # the same model as locvit's command line names it
  "--config.model.name=convit_tiny_patch4_32",
  "--config.model.overrides.depth=4",
  "--config.model.overrides.class_token_layer=3",
  "--config.model.overrides.layer_attention=('gpsa', 'gpsa', 'gpsa', 'mhsa')",
]
try:
  import torch

  torch.manual_seed(0)
  try:
    import timm

    reference = timm.create_model("convit_tiny", pretrained=False, **MODEL_ARGS)
  except ImportError:
    sys.path.insert(0, str(root / "benchmarks"))
    import torch_reference

    reference = torch_reference.build("convit_tiny", **MODEL_ARGS)
  with torch.no_grad():
    for p in reference.parameters():
      p.add_(0.05 * torch.randn_like(p))
  state_dict = {k: to_numpy(v) for k, v in reference.state_dict().items()}
except ImportError:
  shapes = expected_state_dict_shapes(
    "convit_tiny_patch4_32", depth=4, class_token_layer=3, layer_attention=("gpsa",) * 3 + ("mhsa",)
  )
  rng = np.random.default_rng(0)
  state_dict = {k: rng.normal(0, 0.05, s).astype(np.float32) for k, s in shapes.items()}

published = work / "convit_tiny_32"
published.mkdir()
save_file(
  {k: np.ascontiguousarray(v) for k, v in state_dict.items()}, published / "model.safetensors"
)
config_json = {
  "architecture": "convit_tiny",
  "num_classes": 1000,
  "model_args": MODEL_ARGS,
  "pretrained_cfg": {
    "input_size": [3, 32, 32],
    "interpolation": "bicubic",
    "crop_pct": 0.875,
    "crop_mode": "center",
    "mean": [0.485, 0.456, 0.406],
    "std": [0.229, 0.224, 0.225],
    "classifier": "head",
  },
}
(published / "config.json").write_text(json.dumps(config_json, indent=2))
print(sorted(p.name for p in published.iterdir()), len(state_dict), "tensors")

# %% [markdown]
# `locvit.convert.load_pretrained` reads such a folder, a weights file or a hub name (offline from
# the Hugging Face cache with `HF_HUB_OFFLINE=1`), converts it to locvit's parameters and says how
# to preprocess images for it; `num_classes=` and `img_size=` fit it to another task (a fresh
# head, `pos_embed` resampled as timm does), each change noted:

# %%
from locvit.convert import load_pretrained

pretrained = load_pretrained(published)
print(pretrained.model, pretrained.num_classes, pretrained.data_config)
print(pretrained.label_names[:3], "...")
refitted = load_pretrained(published, num_classes=10, img_size=48)
print("\n".join(refitted.notes))

# %% [markdown]
# ## 2. Predictions on your own folder
#
# Any folder of images works (`--data=image_folder:DIR`: its evaluation split `DIR/test/<class>/`,
# or loose images anywhere under `DIR`). Here: scikit-learn's 8x8 digits, upsampled to 32x32 RGB
# and written as PNG files, 40 training and 10 test images of each of the 10 digits.

# %%
from PIL import Image
from sklearn.datasets import load_digits

digits = load_digits()
folder = work / "digits"
counts = {}
for index, (pixels, label) in enumerate(zip(digits.images, digits.target, strict=True)):
  seen = counts.get(label, 0)
  if seen >= 50:
    continue
  counts[label] = seen + 1
  split = "train" if seen < 40 else "test"
  (folder / split / f"digit_{label}").mkdir(parents=True, exist_ok=True)
  image = Image.fromarray(np.uint8(pixels * 255 / 16)).resize((32, 32), Image.BICUBIC)
  image.convert("RGB").save(folder / split / f"digit_{label}" / f"{index:04d}.png")
print({split: len(list((folder / split).rglob("*.png"))) for split in ("train", "test")})

locvit_main(
  "--mode=predict",
  f"--config.init_from.weights={published}",
  f"--data=image_folder:{folder}",
  f"--workdir={work / 'predict_published'}",
)
lines = (work / "predict_published" / "predictions.jsonl").read_text().splitlines()
for line in lines[:3]:
  print(line)

# %% [markdown]
# ## 3. Fine-tuning on your classes
#
# `configs/transfer.py` holds DeiT's transfer recipe (SGD, lr 0.01 x batch / 512, weight decay
# 1e-4, DeiT's augmentation without random erasing or stochastic depth; facebookresearch/deit#45)
# for ConViT-Ti/S/B and DeiT-Ti/S/B on CIFAR-10/100 or a folder. The ImageNet head is replaced by
# a fresh 10-class one; everything else starts from the weights. The recipe runs 1000 epochs at
# batch 768; here 20 steps of 32 images on a CPU, so the scale-bound settings are shortened: 5
# warmup steps (the recipe's 5 epochs would be the whole run), lr 0.01 unscaled
# (`optimizer.lr_base_batch_size=0`) and no Mixup / CutMix; RandAugment and the rest stay. From
# random stand-in weights 20 steps barely move the model (in the run below the loss went from 2.33
# to 2.40 and the test top-1 stayed at chance, 10%): the cells show the path, not a result;
# docs/results.md has a CPU run from trained weights.

# %%
run = work / "finetune"
fine_tuning_steps = 20
train_output = locvit_main(
  "--config=transfer:convit_tiny,folder",
  f"--data=image_folder:{folder}",
  f"--config.init_from.weights={published}",
  *LOCVIT_MODEL,
  "--config.data.image_size=32",
  "--config.batch_size=32",
  f"--config.total_steps={fine_tuning_steps}",
  "--config.schedule.warmup_steps=5",
  "--config.optimizer.lr_base_batch_size=0",
  "--config.mixup.mixup_alpha=0",
  "--config.mixup.cutmix_alpha=0",
  "--config.log_every_steps=5",
  f"--workdir={run}",
)

# %% [markdown]
# The fine-tuned run's parameters become weights again with `python -m locvit.convert
# --workdir=RUN --output=DIR`, which predict like any other (the folder's class names label the
# 10 outputs):

# %%
tuned = work / "finetuned_weights"
command = [sys.executable, "-m", "locvit.convert", f"--workdir={run}", f"--output={tuned}"]
print(
  subprocess.run(command, check=True, capture_output=True, text=True).stdout.replace(
    str(work), "WORK"
  )
)
locvit_main(
  "--mode=predict",
  f"--config.init_from.weights={tuned}",
  f"--data=image_folder:{folder}",
  f"--workdir={work / 'predict_finetuned'}",
)
rows = [json.loads(line) for line in (work / "predict_finetuned" / "predictions.jsonl").open()]
correct = sum(row["top5_class"][0] == row["file"].split("/")[-2] for row in rows)
print(rows[0])
print(f"top-1 on the {len(rows)} test images: {correct / len(rows):.0%}")

# %% [markdown]
# ## 4. What the ConViT learned: gates (Fig. 6) and attention maps (Fig. 7)
#
# Both figures come from the weights alone, through the library's `locvit.analysis.plots`: each
# GPSA head's gate `sigmoid(lambda_h)` (1: positional attention, 0: content), here before and
# after fine-tuning, and the attention of one query patch (red box) in every block, each head's
# gate in its title. With the published ConViT-Ti at 224 px the same cells draw the paper's
# figures: gates that fall with depth, local heads in the first blocks.

# %%
from locvit.analysis import analyze, plots
from locvit.analysis.locality import parameter_statistics
from locvit.attention import TokenGrid
from locvit.convert import load_converted

model = pretrained.create_model()
before = pretrained.variables["params"]
after = load_converted(tuned)["params"]
steps = np.array([0, fine_tuning_steps])
gates = {
  layer: np.stack(
    [
      np.asarray(parameter_statistics(p[f"blocks_{layer}"]["attn"])["gate"])
      for p in (before, after)
    ]
  )
  for layer in range(3)
}
fig = plots.gate_figure(
  steps, gates, xlabel="fine-tuning step", title="GPSA gates: published -> fine-tuned"
)
display(fig)

test_image = folder / "test" / "digit_3"
image_path = sorted(test_image.iterdir())[0]
pixels = np.asarray(Image.open(image_path).convert("RGB"), np.float32) / 255.0
mean, std = np.array(pretrained.data_config.mean), np.array(pretrained.data_config.std)
normalised = ((pixels - mean) / std).astype(np.float32)
query = (3, 4)
fine_model = load_pretrained(tuned).create_model()
maps, map_gates = analyze.query_maps(fine_model, after, normalised, [0, 1, 2, 3], query)
fig = plots.attention_maps_figure(pixels, TokenGrid(8, 8), query, maps, map_gates, patch_size=4)
display(fig)
