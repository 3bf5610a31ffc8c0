"""Small configs and helpers shared by the training-system tests."""

import contextlib
import os
import signal

from configs.common import base_config
from locvit import metrics


def tiny_config(**top_level):
  """A 2-block ViT on the digits data; a step takes milliseconds."""
  c = base_config()
  c.data.source = "digits"
  c.data.image_size = 8
  c.data.train_augment = "none"
  c.data.mean, c.data.std = (0.5,), (0.5,)
  c.model.name = "deit_tiny_patch2_32"
  c.model.overrides.embed_dim = 32
  c.model.overrides.depth = 2
  c.model.overrides.num_heads = 2
  c.model.overrides.drop_path_rate = 0.1
  c.model.overrides.drop_rate = 0.1
  c.batch_size = 32
  c.total_steps = 6
  c.schedule.warmup_steps = 2
  c.log_every_steps = 1
  c.eval_every_steps = 0
  c.checkpoint_every_steps = 0
  c.async_checkpointing = False
  for key, value in top_level.items():
    c[key] = value
  return c


@contextlib.contextmanager
def sigterm_after_step(step: int, signum: int = signal.SIGTERM):
  """Sends this process SIGTERM (or ``signum``) right after the metrics of ``step`` are written."""
  orig_write = metrics.MetricWriter.write

  def write_and_signal(self, at_step, record):
    orig_write(self, at_step, record)
    if at_step == step:
      os.kill(os.getpid(), signum)

  metrics.MetricWriter.write = write_and_signal
  try:
    yield
  finally:
    metrics.MetricWriter.write = orig_write
