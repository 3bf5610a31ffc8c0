"""Pieces shared by the ConViT paper configs (d'Ascoli et al. 2021).

Weight decay: ``optimizer.decay_mask='official_convit'`` is the faithful default for every model
the ConViT repository trained (its optimizer is built on the DDP-wrapped model, so ``pos_embed``,
``cls_token`` and ``pos_proj`` kernels are decayed); the DeiT rows marked * in Table 1 come from
the DeiT paper, whose code decays as intended (``'intended'``). Override with
``--config.optimizer.decay_mask=intended`` for the corrected behaviour.

Locality logging (``config.analysis``, see ``locvit.analysis.locality``) is on, in the official
'faithful' mode, so the Figs. 5-6 curves can be compared with the paper's.
"""

from __future__ import annotations

from typing import Any

import ml_collections

from locvit.configs import recipes
from locvit.configs.common import base_config
from locvit.configs.datasets import use_dataset
from locvit.configs.defaults import analysis_config

IMAGENET_TRAIN_IMAGES = 1_281_167
# The first 100 classes hold about 1,280 training images each (the ImageNet average); only used
# to place evaluations about once per epoch.
IMAGENET100_TRAIN_IMAGES = 128_000
# The "+" models (64 channels per head): lr 5e-4 -> 4e-4 and batch 1024 -> 512 (Sec. 3).
PLUS_LR, PLUS_BATCH = 4e-4, 512


def paper_config(
  model_name: str, *, decay_mask: str = "official_convit"
) -> ml_collections.ConfigDict:
  """``base_config`` + the DeiT recipe + ``model_name`` (+ the "+" changes for "+" models)."""
  c = recipes.apply(base_config(), "deit")
  c.model.name = model_name
  if model_name.endswith("_plus"):
    c.optimizer.lr, c.batch_size = PLUS_LR, PLUS_BATCH
  c.optimizer.decay_mask = decay_mask
  c.analysis = analysis_config()
  c.analysis.locality = True
  c.analysis.locality_mode = "faithful"
  c.log_every_steps = 100
  return c


def every_epoch(c: ml_collections.ConfigDict, train_images: int) -> None:
  """Evaluate and checkpoint about once per epoch of the full training set."""
  c.eval_every_steps = max(train_images // c.batch_size, 1)
  c.checkpoint_every_steps = c.eval_every_steps


def imagenet(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """ImageNet-1k at 224x224: TFDS (prepare ``imagenet2012`` once, see ``convit_s.py``), or the
  image folder ROOT/{train,val}/<wnid>/*.JPEG given by ``--data=image_folder:ROOT`` or
  ``$IMAGENET_ROOT``."""
  use_dataset(c, "imagenet")
  c.data.image_size = 224
  every_epoch(c, IMAGENET_TRAIN_IMAGES)
  return c


def imagenet100(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The first 100 ImageNet classes (Table 3, Fig. 8) at 224x224, from an ImageNet image folder.

  The official code keeps the first 100 class directories in sorted (WordNet id) order, in
  train and val alike: ``data.class_limit=100`` on the image folder at ``$IMAGENET_ROOT`` (or
  ``--data=image_folder:ROOT``; layout ROOT/{train,val}/<wnid>/*.JPEG) does the same. (TFDS works
  too with ``class_limit``, but finding the labels decodes every training record.)
  """
  use_dataset(c, "imagenet", source="image_folder")
  c.data.image_size = 224
  c.data.class_limit = 100
  c.data.num_classes = 100
  every_epoch(c, IMAGENET100_TRAIN_IMAGES)
  return c


def set_overrides(c: ml_collections.ConfigDict, **overrides: Any) -> ml_collections.ConfigDict:
  """Adds module-field overrides (e.g. ``convit_overrides(...)``, ``attention_kwargs``)."""
  c.model.overrides.update(overrides)
  return c
