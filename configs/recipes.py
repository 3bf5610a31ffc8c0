"""The papers' training recipes as presets: plain config fragments a config applies, then overrides.

    c = recipes.apply(base_config(), "deit")   # or recipes.deit(c)
    c.optimizer.lr = ...                       # a preset is only field assignments

- ``deit``: ConViT Tables 1-4 (ImageNet) and appendix C; DeiT / ConViT ``main.py`` defaults.
- ``cifar_small``: structured initialization on small datasets; the reference README, Sec. 5.1.
- ``small_vit``: GMM / ELM masks (ViT, Swin, CaiT, PiT, T2T); the GMM code's ``main.py``.
- ``sgd_cifar``: Cordonnier et al.'s attention-only CIFAR-10 models; epfml/attention-cnn.

A preset sets the optimizer, schedule, augmentation (host: `data.*`; device: `mixup.*`,
`random_erasing.*`), regularization and batch size; it leaves the model, the data source, the image
size and the normalisation statistics to the caller.
"""

from __future__ import annotations

from collections.abc import Callable

import ml_collections

from locvit.configs.defaults import IMAGENET_MEAN, IMAGENET_STD

RANDAUGMENT = "rand-m9-mstd0.5-inc1"  # timm's string: magnitude 9, noise std 0.5, increasing ops


def deit(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """DeiT's ImageNet recipe (Touvron et al. 2021), kept unchanged by ConViT (Sec. 3, Table 1).

  AdamW (0.9, 0.999, eps 1e-8, weight decay 0.05) at lr 5e-4 x batch / 512, batch 1024, 300
  epochs, linear warmup over 5 epochs from 1e-6 then cosine to 1e-5 (timm's, counted from epoch
  0), the rate updated once per epoch (``lr_scheduler.step(epoch)`` after each epoch of ConViT's
  ``main.py``, which therefore trains epoch e + 1 at the rate of epoch e;
  ``--config.schedule.update_every=step`` for per-step), no gradient clipping; bicubic
  random-resized crop (scale 0.08-1, ratio 3/4-4/3) + flip, RandAugment rand-m9-mstd0.5-inc1,
  random erasing 0.25 (pixel mode), repeated augmentation x3, Mixup 0.8 / CutMix 1.0 (switch 0.5,
  every batch), label smoothing 0.1, stochastic depth 0.1; eval resize to size / 0.875 and centre
  crop; ImageNet mean/std; mixed precision (the reference's ``torch.cuda.amp.autocast``, fp16
  there, bf16 here).

  The released ConViT ``main.py`` samples with ``RASampler`` (``--repeated-aug`` on by default) and
  has no weighted sampler: DeiT's repeated augmentation x3, as here.
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
  c.schedule.update_every = "epoch"
  c.schedule.warmup_prefix = False  # timm's CosineLRScheduler: the cosine counts from epoch 0
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
  c.data.auto_augment = RANDAUGMENT
  c.data.repeated_augmentations = 3
  c.data.eval_crop_pct = 0.875
  c.data.mean = IMAGENET_MEAN
  c.data.std = IMAGENET_STD
  c.mixup.mixup_alpha = 0.8
  c.mixup.cutmix_alpha = 1.0
  c.mixup.prob = 1.0
  c.mixup.switch_prob = 0.5
  c.mixup.mode = "batch"
  c.random_erasing.prob = 0.25
  c.random_erasing.mode = "pixel"
  c.mixed_precision = True
  return c


def cifar_small(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Structured initialization's small-dataset recipe (Zheng et al., Sec. 5.1; reference README).

  AdamW lr 1e-3 (0.9, 0.999, eps 1e-3), weight decay 0.01, gradient clipping 3.0, batch 512,
  200 epochs, 10 warmup epochs from 1e-5 then cosine to 1e-6 counted from epoch 0, the rate
  updated once per epoch (timm's scheduler without ``--sched-on-updates``), RandAugment
  rand-m9-mstd0.5-inc1, label smoothing 0.1, no Mixup/CutMix, no random erasing, no stochastic
  depth, mixed precision (the README's ``--amp``: fp16 there, bf16 here). The reference's
  ``--scale 1 1 --ratio 1 1`` make its random-resized crop a plain resize of the whole image to
  its own size, which PIL returns unchanged whatever the interpolation (its
  ``--train-interpolation random`` draws one): only the flip remains.
  """
  c.optimizer.name = "adamw"
  c.optimizer.lr = 1e-3
  c.optimizer.lr_base_batch_size = 0
  c.optimizer.b1 = 0.9
  c.optimizer.b2 = 0.999
  c.optimizer.eps = 1e-3
  c.optimizer.weight_decay = 0.01
  c.schedule.name = "cosine"
  c.schedule.warmup_epochs = 10.0
  c.schedule.warmup_steps = 0
  c.schedule.warmup_init_lr = 1e-5
  c.schedule.min_lr = 1e-6
  c.schedule.update_every = "epoch"
  c.schedule.warmup_prefix = False  # timm's CosineLRScheduler: the cosine counts from epoch 0
  c.grad_clip_norm = 3.0
  c.num_epochs = 200.0
  c.total_steps = -1
  c.batch_size = 512
  c.label_smoothing = 0.1
  c.data.train_augment = "rrc_flip"
  c.data.rrc_scale = (1.0, 1.0)
  c.data.rrc_ratio = (1.0, 1.0)
  c.data.eval_crop_pct = 1.0
  c.data.auto_augment = RANDAUGMENT
  c.data.repeated_augmentations = 1
  c.mixup.mixup_alpha = 0.0
  c.mixup.cutmix_alpha = 0.0
  c.random_erasing.prob = 0.0
  c.mixed_precision = True
  return c


def small_vit(
  c: ml_collections.ConfigDict, policy: str = "autoaug-cifar10"
) -> ml_collections.ConfigDict:
  """The GMM paper's recipe for small ViTs (Li & Zhang, Sec. 4.1; the official ``main.py``).

  AdamW lr 1e-3, weight decay 0.05 on every parameter, batch 128, 10 warmup epochs from 1e-6 then
  cosine to 1e-6 per step, label smoothing 0.1, stochastic depth 0.1; RandomCrop (pad 4) + flip,
  AutoAugment (``policy``: the CIFAR-10 policy for CIFAR, 'autoaug-svhn', or 'autoaug-imagenet'
  for Tiny-ImageNet), random erasing 0.25 as the official ``utils/random_erasing.py`` (area
  0.02-0.4, aspect uniform in 0.3-1/0.3, 100 draws, a constant fill: the caller sets
  ``random_erasing.fill`` to the numbers of the dataset's mean, which the official code writes
  into the normalised image), CutMix (beta 1) and Mixup (alpha 1) applied with probability 0.5,
  switching 0.5; AutoAugment fills with (128, 128, 128) (torchvision's default, which the
  official code uses); float32 (the official code has no autocast). The official "epoch" is 3
  fresh shuffled passes over the data (its ``RASampler(..., 1, 3)`` makes one copy per image and
  a 3x longer epoch, not DeiT's repeated augmentation): 300 locvit epochs with 30 warmup epochs
  are the official 100 and 10.
  """
  c.optimizer.name = "adamw"
  c.optimizer.lr = 1e-3
  c.optimizer.lr_base_batch_size = 0
  c.optimizer.weight_decay = 0.05
  c.optimizer.decay_mask = "all"  # the official optimizer decays every parameter
  c.schedule.name = "cosine"
  c.schedule.warmup_epochs = 30.0
  c.schedule.warmup_steps = 0
  c.schedule.warmup_init_lr = 1e-6
  c.schedule.min_lr = 1e-6
  c.num_epochs = 300.0
  c.total_steps = -1
  c.batch_size = 128
  c.label_smoothing = 0.1
  c.grad_clip_norm = 0.0
  c.model.overrides.drop_path_rate = 0.1
  c.data.train_augment = "crop_flip"
  c.data.crop_padding = 4
  c.data.auto_augment = policy
  c.data.auto_augment_fill = 128
  c.data.repeated_augmentations = 1
  c.mixup.mixup_alpha = 1.0
  c.mixup.cutmix_alpha = 1.0
  c.mixup.prob = 0.5
  c.mixup.switch_prob = 0.5
  c.mixup.mode = "batch"
  c.random_erasing.prob = 0.25
  c.random_erasing.mode = "const"
  c.random_erasing.max_area = 0.4
  c.random_erasing.min_aspect = 0.3
  c.random_erasing.aspect = "uniform"
  c.random_erasing.attempts = 100
  c.mixed_precision = False
  return c


def sgd_cifar(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Cordonnier et al.'s CIFAR-10 recipe (epfml/attention-cnn): SGD lr 0.1, momentum 0.9, weight
  decay 1e-4 on every parameter but the Gaussian centres and spreads, batch 100, 300 epochs,
  cosine with 5% linear warmup from 0, the rate updated once per epoch (the reference's
  ``scheduler.step(global_step)`` at each epoch's start, so its first epoch runs at lr 0), random
  crop (pad 4) + flip, no label smoothing, no Mixup/CutMix/erasing, float32."""
  c.optimizer.name = "sgd"
  c.optimizer.lr = 0.1
  c.optimizer.lr_base_batch_size = 0
  c.optimizer.momentum = 0.9
  c.optimizer.nesterov = False
  c.optimizer.weight_decay = 1e-4
  c.schedule.name = "cosine"
  c.num_epochs = 300.0
  c.total_steps = -1
  c.schedule.warmup_epochs = 0.05 * c.num_epochs
  c.schedule.warmup_steps = 0
  c.schedule.warmup_init_lr = 0.0
  c.schedule.min_lr = 0.0
  c.schedule.update_every = "epoch"
  c.optimizer.decay_mask = "official_cordonnier"
  c.mixed_precision = False
  c.batch_size = 100
  c.label_smoothing = 0.0
  c.grad_clip_norm = 0.0
  c.data.train_augment = "crop_flip"
  c.data.crop_padding = 4
  c.data.auto_augment = None
  c.data.repeated_augmentations = 1
  c.mixup.mixup_alpha = 0.0
  c.mixup.cutmix_alpha = 0.0
  c.random_erasing.prob = 0.0
  return c


PRESETS: dict[str, Callable[[ml_collections.ConfigDict], ml_collections.ConfigDict]] = {
  "deit": deit,
  "cifar_small": cifar_small,
  "small_vit": small_vit,
  "sgd_cifar": sgd_cifar,
}


def apply(c: ml_collections.ConfigDict, name: str) -> ml_collections.ConfigDict:
  """Applies preset ``name`` to ``c`` (in place) and records it as ``c.recipe``."""
  if name not in PRESETS:
    raise ValueError(f"Unknown recipe {name!r}. Valid recipes: {sorted(PRESETS)}.")
  PRESETS[name](c)
  with c.unlocked():
    c.recipe = name
  return c


deit_recipe = deit  # the name the ConViT configs used before the presets existed
