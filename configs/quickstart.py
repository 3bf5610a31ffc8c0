"""Quickstart: a small DeiT-style ViT on scikit-learn's 8x8 digits, offline, ~1 minute on 2 cores.

  python -m locvit.main --config=configs/quickstart.py --workdir=/tmp/locvit-quickstart

Reaches >= 0.90 eval top-1 (the test suite checks it) and writes checkpoints and metrics.jsonl.

The model is the registered ``deit_tiny_patch2_32`` (DeiT-Tiny with 2x2 patches, named after its
published 32x32 configuration) made smaller by ``model.overrides``: width 64, 4 blocks, 4 heads,
on 8x8 images. Registered names keep the published sizes; overrides change them per run.
"""

from locvit.configs.common import base_config


def get_config():
  c = base_config()
  c.data.source = "digits"
  c.data.name = "digits"  # a label only (TFDS reads it); scikit-learn ships the images
  c.data.image_size = 8
  c.data.train_augment = "none"
  c.data.mean = (0.5,)
  c.data.std = (0.5,)
  c.model.name = "deit_tiny_patch2_32"
  c.model.overrides.embed_dim = 64
  c.model.overrides.depth = 4
  c.model.overrides.num_heads = 4
  c.model.overrides.drop_path_rate = 0.0
  c.batch_size = 64
  c.num_epochs = 30
  c.optimizer.lr = 2e-3
  c.optimizer.weight_decay = 0.05
  c.schedule.warmup_epochs = 2
  c.label_smoothing = 0.1
  c.log_every_steps = 50
  c.eval_every_steps = 200
  c.checkpoint_every_steps = 200
  return c
