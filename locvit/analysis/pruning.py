"""Head pruning of a finished training run (Cordonnier et al., appendix E): its checkpoint is
restored and its degenerate heads removed, with a size/FLOPs report.

The surgery itself (criteria, ``prune_heads``, ``PruneReport``) is ``locvit.models.surgery``::

  params, report = prune_checkpoint(config, workdir)
  print(report.summary())
"""

from __future__ import annotations

from typing import Any

from locvit.attention import TokenGrid
from locvit.configs.common import complete_config
from locvit.models.factory import build_model
from locvit.models.surgery import PruneReport, PruneThresholds, prune_degenerate_heads
from locvit.workdir import restore


def load_params(
  config: Any,
  workdir: str,
  *,
  step: int | None = None,
  num_classes: int | None = None,
  channels: int = 3,
) -> tuple[Any, int]:
  """``(params, step)`` of a training run's checkpoint (latest, or ``step``), on one device.

  ``config`` is the run's config (the model is rebuilt from it); ``num_classes`` defaults to
  ``config.data.num_classes`` or 10; images are ``data.image_size`` squared with ``channels``.
  """
  config = complete_config(config)
  classes = num_classes or config.data.num_classes or 10
  model = build_model(config, classes)
  size = config.data.image_size
  params, _, step = restore.restore_model_variables(
    workdir, model, (size, size, channels), step=step
  )
  return params, step


def prune_checkpoint(
  config: Any,
  workdir: str,
  *,
  step: int | None = None,
  thresholds: PruneThresholds = PruneThresholds(),
  num_classes: int | None = None,
  channels: int = 3,
) -> tuple[Any, PruneReport]:
  """Loads a finished run's parameters and prunes its degenerate heads (appendix E).

  The grid for the FLOPs count is the model's token grid (``image_size / downsample``).
  Start the pruned run from the returned params with ``layer_heads=report.layer_heads()``.
  """
  config = complete_config(config)
  params, _ = load_params(config, workdir, step=step, num_classes=num_classes, channels=channels)
  # A model field, set only for the models that have one: not a config default.
  downsample = config.model.overrides.get("downsample", 2)
  side = config.data.image_size // downsample
  return prune_degenerate_heads(params, grid=TokenGrid(side, side), thresholds=thresholds)
