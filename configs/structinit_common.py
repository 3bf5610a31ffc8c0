"""Shared pieces of the structured-initialization configs (Zheng, Li, Lucey 2024).

Small-dataset recipe: the ``cifar_small`` preset (``configs/recipes.py``; paper Sec. 5.1 and the
reference README): AdamW lr 1e-3, eps 1e-3, weight decay 0.01, gradient clipping 3.0, 200 epochs,
batch 512, cosine with 10 warmup epochs to 1e-6, RandAugment rand-m9-mstd0.5-inc1, label
smoothing 0.1, no mixup/cutmix, no random erasing, flip only (the reference's ``--scale 1 1
--ratio 1 1`` make its random-resized crop a plain resize), the rate updated once per epoch with
timm's cosine counted from epoch 0 (``schedule.update_every='epoch'``, ``warmup_prefix=False``),
mixed precision (the README's ``--amp``, fp16 there; bf16 compute with float32 parameters here,
``--config.mixed_precision=False`` for float32).

ImageNet-1K recipe (README): 300 epochs, batch 4096 (8 x 512), lr 4e-3 at batch 4096 (linear
scaling), eps 1e-8, weight decay 0.05, 50 warmup epochs, no clipping, random-resized crop + flip,
RandAugment, CutMix 0.8, Mixup 1.0, random erasing 0.25 (pixel mode), label smoothing 0.1.

Data (``configs/datasets.py``): CIFAR-10 / CIFAR-100 / SVHN / ImageNet from TFDS (``cifar10``,
``cifar100``, ``svhn_cropped``, ``imagenet2012``; offline they need a prepared ``data_dir``), or
from the image folder given by ``--data=image_folder:ROOT`` or ``$CIFAR10_ROOT``
(``$CIFAR100_ROOT``, ``$SVHN_ROOT``, ``$IMAGENET_ROOT``).

Inits (``config.init``, applied by ``locvit.init.apply_init`` after the model is initialised):
'trunc_normal', 'kaiming_uniform', 'mimetic' (alpha = beta = 0.7, the README's
``mimetic0.7_0.7``), 'impulse3' and 'impulse5' (Imp.-3 / Imp.-5). The impulse solve uses the
paper's 10,000 Adam steps (``init.solver='paper'``); ``--config.init.solver=fast`` takes 500 steps
at the same quality (docs/benchmarks.md).
"""

from __future__ import annotations

from typing import Any

import ml_collections

from locvit.configs import recipes
from locvit.configs.args import choose
from locvit.configs.common import base_config
from locvit.configs.datasets import use_dataset
from locvit.configs.defaults import IMAGENET_MEAN, IMAGENET_STD, init_config

# dataset -> image size, normalisation (the usual statistics); where the data is read from, the
# class count and the splits: ``configs/datasets.py``.
DATASETS: dict[str, dict[str, Any]] = {
  "cifar10": dict(
    image_size=32,
    mean=(0.4914, 0.4822, 0.4465),
    std=(0.2470, 0.2435, 0.2616),
  ),
  "cifar100": dict(
    image_size=32,
    mean=(0.5071, 0.4865, 0.4409),
    std=(0.2673, 0.2564, 0.2762),
  ),
  "svhn": dict(
    image_size=32,
    mean=(0.4377, 0.4438, 0.4728),
    std=(0.1980, 0.2010, 0.1970),
  ),
  "imagenet": dict(
    image_size=224,
    mean=IMAGENET_MEAN,
    std=IMAGENET_STD,
  ),
}
INITS = ("trunc_normal", "kaiming_uniform", "mimetic", "impulse3", "impulse5")


def init_block(name: str, **overrides: Any) -> ml_collections.ConfigDict:
  """``config.init`` for one of ``INITS`` (impulseF means the impulse init with filter F)."""
  choose(__file__, "init", name, INITS)
  if name.startswith("impulse"):
    return init_config("impulse", filter_size=int(name[len("impulse") :]), **overrides)
  return init_config(name, **overrides)


def small_data_config(dataset: str, model: str, init: str) -> ml_collections.ConfigDict:
  """Base config + the small-dataset recipe on ``dataset`` for ``model`` with ``init``."""
  choose(__file__, "dataset", dataset, ("cifar10", "cifar100", "svhn"))
  c = base_config()
  c.model.name = model
  data = DATASETS[dataset]
  use_dataset(c, dataset)
  c.data.image_size = data["image_size"]
  c.data.mean, c.data.std = data["mean"], data["std"]
  recipes.apply(c, "cifar_small")
  c.init = init_block(init)
  return c


def imagenet_config(model: str, init: str) -> ml_collections.ConfigDict:
  """The ImageNet-1K recipe (Table 2, last column) for ``model`` with ``init``."""
  c = small_data_config("cifar10", model, init)
  data = DATASETS["imagenet"]
  use_dataset(c, "imagenet")
  c.data.image_size = data["image_size"]
  c.data.mean, c.data.std = data["mean"], data["std"]
  c.data.rrc_scale = (0.08, 1.0)
  c.data.rrc_ratio = (3.0 / 4.0, 4.0 / 3.0)
  c.data.interpolation = "bicubic"
  c.data.eval_crop_pct = 0.875
  c.mixup.mixup_alpha, c.mixup.cutmix_alpha = 1.0, 0.8
  c.random_erasing.prob = 0.25
  c.optimizer.lr = 4e-3
  c.optimizer.lr_base_batch_size = 4096
  c.optimizer.eps = 1e-8
  c.optimizer.weight_decay = 0.05
  c.schedule.warmup_epochs = 50.0
  c.grad_clip_norm = 0.0
  c.num_epochs = 300.0
  c.batch_size = 4096  # 8 GPUs x 512 in the README
  return c
