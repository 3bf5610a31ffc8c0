"""Reduced-scale sample-efficiency experiment (the idea of ConViT Table 2 / Fig. 2, on a CPU):
ConViT vs DeiT of the same size, trained identically on 10% of CIFAR-10.

  python -m locvit.data.prepare cifar10 --format=jpeg --out=/tmp/cifar10   # JPEG q75 folders
  export CIFAR10_ROOT=/tmp/cifar10
  python -m locvit.main --config=configs/convit_cifar10_small.py:convit --workdir=DIR_C
  python -m locvit.main --config=configs/convit_cifar10_small.py:deit --workdir=DIR_D
  python -m locvit.main --workdir=DIR_C --mode=analyze   # Figs. 5-7 for the run

Data: the image-folder copy of CIFAR-10 (JPEG q75: ``python -m locvit.data.prepare cifar10
--format=jpeg``), the first 10% of each class (``data.train_fraction=0.1``: 500 images per
class, 5,000 in all, the official per-class subsampling), 32x32, random crop (padding 4) +
flip, CIFAR-10 mean/std; evaluation on the full 10,000-image test split. ``data.root`` comes
from ``$CIFAR10_ROOT`` (or ``--data=image_folder:DIR``).

Models (both 4 heads x 48 = 192 channels, depth 6, MLP ratio 4, patch 4 -> 8x8 patches, about
2.7M parameters; each family keeps its own qkv bias, False for ConViT and True for DeiT):

- ``convit``: ``convit_tiny_patch4_32`` with 4 GPSA layers then 2 MHSA layers, the class token
  inserted before block 4 (``convit_overrides(4, 6)``), locality strength 1;
- ``deit``: ``deit_tiny_patch4_32`` with ``num_heads=4, embed_dim=192, depth=6``.

Training, identical for both: AdamW lr 1e-3 (batch 128), eps 1e-8, weight decay 0.05 with the
official ConViT mask, 2 warmup epochs from 1e-6 then cosine to 1e-5, label smoothing 0.1,
stochastic depth 0.1, ``TOTAL_STEPS = 360`` steps (46,080 images, about 9 epochs of the 5,000),
evaluations at the middle and the end. Budget: the runs of docs/results.md took 15-21 minutes
each on 2 shared CPU cores (the time column there; the step rate depends on the machine's load
and on ``--cpu_malloc``). Locality metrics (real per-layer inputs) are logged at each evaluation.
"""

import ml_collections

from locvit.configs.args import Field, parse
from locvit.configs.common import base_config, cifar10_image_folder
from locvit.configs.convit_common import set_overrides
from locvit.configs.defaults import CIFAR10_MEAN, CIFAR10_STD, analysis_config, convit_overrides

HEADS, HEAD_DIM, DEPTH, GPSA_LAYERS = 4, 48, 6, 4
BATCH_SIZE = 128
TOTAL_STEPS = 360
MODELS = {
  "convit": ("convit_tiny_patch4_32", convit_overrides(GPSA_LAYERS, DEPTH)),
  "deit": (
    "deit_tiny_patch4_32",
    {"num_heads": HEADS, "embed_dim": HEADS * HEAD_DIM, "depth": DEPTH},
  ),
}


ARGS = {"model": Field("convit", MODELS)}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  (name,) = parse(__file__, arg, ARGS).values()
  model, overrides = MODELS[name]
  c = base_config()
  c.model.name = model
  set_overrides(c, drop_path_rate=0.1, **overrides)

  cifar10_image_folder(c, train_fraction=0.1)
  c.data.image_size = 32
  c.data.train_augment = "crop_flip"
  c.data.crop_padding = 4
  c.data.mean, c.data.std = CIFAR10_MEAN, CIFAR10_STD

  c.batch_size = BATCH_SIZE
  c.total_steps = TOTAL_STEPS
  c.optimizer.name = "adamw"
  c.optimizer.lr = 1e-3
  c.optimizer.eps = 1e-8
  c.optimizer.weight_decay = 0.05
  c.optimizer.decay_mask = "official_convit"
  c.schedule.name = "cosine"
  c.schedule.warmup_epochs = 2.0
  c.schedule.warmup_init_lr = 1e-6
  c.schedule.min_lr = 1e-5
  c.label_smoothing = 0.1

  c.log_every_steps = 20
  c.eval_every_steps = TOTAL_STEPS // 2
  c.checkpoint_every_steps = TOTAL_STEPS // 2
  c.analysis = analysis_config()
  c.analysis.locality = True
  c.analysis.locality_mode = "per_layer"
  c.analysis.map_layers = (1, GPSA_LAYERS)
  return c
