"""Training recipes shared by the paper configs."""

from __future__ import annotations

import ml_collections

from locvit.data import IMAGENET_MEAN, IMAGENET_STD


def deit_recipe(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """DeiT's ImageNet recipe (Touvron et al. 2021), which ConViT keeps unchanged (ConViT Sec. 3).

  Fills the fields that exist: AdamW (b1 0.9, b2 0.999, eps 1e-8, weight decay 0.05) at lr
  5e-4 x batch / 512, batch 1024, 300 epochs, linear warmup over 5 epochs from 1e-6 then cosine
  to 1e-5 (per step here; timm steps it per epoch), label smoothing 0.1, stochastic depth 0.1,
  no gradient clipping, bicubic random-resized crop (scale 0.08-1, ratio 3/4-4/3) and flip,
  eval resize to 256/224 of the size and centre crop (crop fraction 0.875), ImageNet mean/std.

  Not expressible yet (pending: augmentation issue): RandAugment rand-m9-mstd0.5-inc1, mixup 0.8
  and cutmix 1.0 (switch probability 0.5, soft-target loss), random erasing 0.25 (pixel mode),
  repeated augmentation x3 (the released ConViT main.py draws batches with a class-weighted
  WeightedRandomSampler instead; its RASampler call is commented out).

  Leaves the model, the data source and the image size to the caller. Returns ``c``.
  """
  c.optimizer.name = "adamw"
  c.optimizer.lr = 5e-4
  c.optimizer.lr_base_batch_size = 512
  c.optimizer.b1 = 0.9
  c.optimizer.b2 = 0.999
  c.optimizer.eps = 1e-8
  c.optimizer.weight_decay = 0.05
  c.schedule.name = "cosine"
  c.schedule.warmup_epochs = 5.0
  c.schedule.warmup_steps = 0
  c.schedule.warmup_init_lr = 1e-6
  c.schedule.min_lr = 1e-5
  c.num_epochs = 300.0
  c.total_steps = -1
  c.batch_size = 1024
  c.label_smoothing = 0.1
  c.grad_clip_norm = 0.0
  c.model.overrides.drop_path_rate = 0.1
  c.data.train_augment = "rrc_flip"
  c.data.rrc_scale = (0.08, 1.0)
  c.data.rrc_ratio = (3.0 / 4.0, 4.0 / 3.0)
  c.data.interpolation = "bicubic"
  c.data.eval_crop_pct = 0.875
  c.data.mean = IMAGENET_MEAN
  c.data.std = IMAGENET_STD
  return c
