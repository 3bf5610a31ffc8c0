"""Shared pieces of the GMM / ELM paper configs (Li & Zhang, "RetNet Viewed through Convolution").

Recipe: the ``small_vit`` preset (``configs/recipes.py``; paper Sec. 4.1 and the official
``main.py``): AdamW lr 1e-3, weight decay 0.05 on every parameter, batch 128, cosine from 1e-6 with
warmup, label smoothing 0.1, stochastic depth 0.1, RandomCrop (pad 4) + flip, AutoAugment (the
CIFAR-10 policy for CIFAR, the SVHN policy for SVHN, the ImageNet policy for Tiny-ImageNet),
random erasing 0.25, CutMix (beta 1) and Mixup (alpha 1) with probability 0.5, switch 0.5. The
official "epoch" is 3 shuffled passes over the data, so 300 locvit epochs (30 warmup) are the
official 100 (10 warmup). Random erasing fills its box with the numbers of the dataset's mean
written into the normalised image, as the official ``main.py`` passes ``mean=data_info['stat'][0]``
to ``utils/random_erasing.py``. Float32, as the official code (no autocast).

The paper's ViT (``vit_smalldata_*``, the official ``models/vit.py``) also gets the official
initialisation and stochastic depth: ``init.name='xavier_normal'`` (xavier-normal Linear weights,
zero biases, ``torch.randn`` position embedding and class token) and
``model.overrides.drop_path_schedule='constant'`` (one ``DropPath(0.1)`` on both branches of
every block). locvit's forms: ``--config.init.name=none`` (trunc-normal 0.02) and
``--config.model.overrides.drop_path_schedule=linear`` (0 to 0.1 over depth).

Data (``configs/datasets.py``): CIFAR-10 / CIFAR-100 / SVHN from TFDS (``cifar10``, ``cifar100``,
``svhn_cropped``; a prepared ``data_dir`` is needed offline), or from the image folder given by
``--data=image_folder:ROOT`` or ``$CIFAR10_ROOT`` / ``$CIFAR100_ROOT`` / ``$SVHN_ROOT``
(``ROOT/{train,test}/<class>/*.jpg``); Tiny-ImageNet from the image folder
``ROOT/{train,val}/<wnid>/*.JPEG`` given the same way (``$TINYIMAGENET_ROOT``; the official ``val``
split must first be sorted into class folders).
"""

from __future__ import annotations

from typing import Any

import ml_collections

from locvit.configs import recipes
from locvit.configs.common import base_config
from locvit.configs.datasets import use_dataset
from locvit.configs.defaults import init_config

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
    mean=(0.5070, 0.4865, 0.4409),  # the official utils/dataloader.py's (0.5071 elsewhere)
    std=(0.2673, 0.2564, 0.2762),
  ),
  "svhn": dict(
    image_size=32,
    mean=(0.4377, 0.4438, 0.4728),
    std=(0.1980, 0.2010, 0.1970),
  ),
  "tinyimagenet": dict(
    image_size=64,
    mean=(0.4802, 0.4481, 0.3975),
    std=(0.2770, 0.2691, 0.2821),
  ),
}

# dataset -> the AutoAugment policy of the official code.
AUTOAUGMENT_POLICY = {
  "cifar10": "autoaug-cifar10",
  "cifar100": "autoaug-cifar10",
  "svhn": "autoaug-svhn",
  "tinyimagenet": "autoaug-imagenet",
}


def gmm_config(
  model: str, dataset: str, *, table: str, row: str, top1: float | None, params: str | None = None
) -> ml_collections.ConfigDict:
  """The paper's recipe for ``model`` on ``dataset``, with the paper's number in ``c.paper``."""
  data = DATASETS[dataset]
  c = base_config()
  use_dataset(c, dataset)
  c.data.image_size = data["image_size"]
  c.data.mean, c.data.std = data["mean"], data["std"]
  c.model.name = model
  recipes.apply(c, "small_vit")
  c.data.auto_augment = AUTOAUGMENT_POLICY[dataset]
  c.random_erasing.fill = data["mean"]
  if "vit_smalldata_" in model:
    official_vit(c)
  c.log_every_steps = 100
  c.eval_every_steps = 6000
  c.checkpoint_every_steps = 6000

  c.paper = ml_collections.ConfigDict()
  c.paper.table = table
  c.paper.row = row
  c.paper.dataset = dataset
  c.paper.top1 = top1  # a fraction, like eval/top1
  c.paper.params = params
  return c


def official_vit(c: ml_collections.ConfigDict) -> None:
  """The official ViT's initialisation and constant stochastic depth (``models/vit.py``)."""
  c.init = init_config("xavier_normal")
  c.model.overrides.drop_path_schedule = "constant"


def locvit_vit(c: ml_collections.ConfigDict) -> None:
  """locvit's forms of what ``official_vit`` and the recipe's random erasing set: the model's own
  trunc-normal init, drop path 0 to 0.1 over depth, per-pixel noise in boxes of log-uniform
  aspect (timm's ``RandomErasing``, 10 draws)."""
  c.init = init_config("none")
  c.model.overrides.drop_path_schedule = "linear"
  c.random_erasing.mode = "pixel"
  c.random_erasing.fill = ()
  c.random_erasing.aspect = "log_uniform"
  c.random_erasing.attempts = 10


def smallvit_name(size: str, dataset: str, mask: str | None, *, patch4_64: bool = False) -> str:
  """Registered name of the paper's ViT of ``size`` for ``dataset`` (patch 4 / 8 per size)."""
  res = "patch4_32" if DATASETS[dataset]["image_size"] == 32 else "patch8_64"
  if patch4_64:
    res = "patch4_64"
  return f"{mask + '_' if mask else ''}vit_smalldata_{size}_{res}"
