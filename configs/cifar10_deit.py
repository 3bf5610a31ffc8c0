"""DeiT-Ti at patch 4 on CIFAR-10 (32x32): the small-image baseline every paper compares against.

  python -m locvit.main --config=configs/cifar10_deit.py --workdir=DIR

Data: TFDS ``cifar10`` (prepared once, see the README), or the image folder ROOT/{train,test}/
<class>/*.jpg given by ``--data=image_folder:ROOT`` or ``$CIFAR10_ROOT`` (``configs/datasets.py``).

Recipe: AdamW 1e-3, wd 0.05, 5 warmup epochs then cosine, 100 epochs, batch 128, random crop
(pad 4) + flip, label smoothing 0.1, drop path 0.1. A baseline, not a paper table.
"""

from locvit.configs.common import base_config
from locvit.configs.datasets import use_dataset
from locvit.configs.defaults import CIFAR10_MEAN, CIFAR10_STD


def get_config():
  c = base_config()
  use_dataset(c, "cifar10")
  c.data.image_size = 32
  c.data.train_augment = "crop_flip"
  c.data.mean, c.data.std = CIFAR10_MEAN, CIFAR10_STD
  c.model.name = "deit_tiny_patch4_32"
  c.batch_size = 128
  c.num_epochs = 100
  c.optimizer.lr = 1e-3
  c.optimizer.weight_decay = 0.05
  c.schedule.warmup_epochs = 5
  c.label_smoothing = 0.1
  c.log_every_steps = 100
  c.eval_every_steps = 2000
  c.checkpoint_every_steps = 2000
  return c
