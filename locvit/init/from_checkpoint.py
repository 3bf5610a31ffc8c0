"""Starting a run from another run's parameters, optionally after pruning degenerate heads.

Cordonnier et al., appendix E: train the generalized quadratic model, prune the heads whose
Gaussian has collapsed, then continue training at lr / 10 from the pruned parameters. Config::

  config.init_from.workdir                  the source run's --workdir ('' or None: off)
  config.init_from.step                     -1: its latest checkpoint
  config.init_from.prune_degenerate_heads   prune before starting (``locvit.models.surgery``)
  config.init_from.min_sq_spread, min_eigenvalue, max_condition   the pruning thresholds

The source model is rebuilt from the source checkpoint's metadata. With pruning, the new run's
``model.overrides.layer_heads`` is set to the heads left (an explicit, different value is an
error). Only the parameters and the model state (BatchNorm statistics) are taken; the optimizer
state, the step and the data position start fresh. A resumed run restores its own checkpoint and
does not read the source parameters again, but still reads its metadata and, with pruning, its
parameters to recompute ``layer_heads``, so keep the source workdir while the run lasts.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import ml_collections
import numpy as np
from absl import logging

from locvit.attention.geometry import TokenGrid

# Plain data beside the shipped configs (which must not import JAX); the library names stay.
from locvit.models import create_model, surgery
from locvit.workdir import restore


@dataclasses.dataclass(frozen=True)
class Warmstart:
  """Source parameters (host NumPy, already pruned if asked) and the pruning report or None."""

  params: Any
  model_state: Any
  step: int
  report: Any = None


def enabled(config: ml_collections.ConfigDict) -> bool:
  """Whether ``config.init_from.workdir`` names a run to initialise from."""
  return config.init_from is not None and bool(config.init_from.workdir)


def load(
  config: ml_collections.ConfigDict, num_classes: int, image_shape: tuple[int, ...]
) -> Warmstart:
  """Restores (and prunes) the source run's variables; see the module docstring."""
  init_from = config.init_from
  step = None if init_from.step < 0 else init_from.step
  saved = restore.saved_model_config(init_from.workdir, step)
  model = create_model(saved["name"], num_classes=num_classes, **(saved.get("overrides") or {}))
  params, model_state, step = restore.restore_model_variables(
    init_from.workdir, model, image_shape, step=step
  )
  params, model_state = jax.device_get((params, model_state))
  report = None
  if init_from.prune_degenerate_heads:
    thresholds = surgery.PruneThresholds(
      min_sq_spread=init_from.min_sq_spread,
      min_eigenvalue=init_from.min_eigenvalue,
      max_condition=init_from.max_condition,
    )
    side = image_shape[0] // int(getattr(model, "downsample", 1) or 1)
    params, report = surgery.prune_degenerate_heads(
      params, grid=TokenGrid(side, side), thresholds=thresholds
    )
    logging.info("Pruned %s (step %d):\n%s", init_from.workdir, step, report.summary())
  return Warmstart(params, model_state, step, report)


def apply_layer_heads(config: ml_collections.ConfigDict, warm: Warmstart) -> None:
  """Sets ``model.overrides.layer_heads`` to the heads pruning left (in place)."""
  if warm.report is None:
    return
  heads = tuple(int(h) for h in warm.report.layer_heads())
  current = config.model.overrides.get("layer_heads")
  if current is not None and tuple(current) != heads:
    raise ValueError(
      f"model.overrides.layer_heads={tuple(current)} differs from the heads left after pruning "
      f"{config.init_from.workdir}: {heads}. Remove the override or set it to {heads}."
    )
  with config.unlocked():
    config.model.overrides.layer_heads = heads


def check_matches(source: Any, target: Any, what: str) -> None:
  """The source tree must have exactly the new model's structure and shapes."""
  src = {
    jax.tree_util.keystr(p): np.shape(v) for p, v in jax.tree_util.tree_leaves_with_path(source)
  }
  dst = {
    jax.tree_util.keystr(p): tuple(v.shape) for p, v in jax.tree_util.tree_leaves_with_path(target)
  }
  if src != dst:
    missing, extra = sorted(set(dst) - set(src)), sorted(set(src) - set(dst))
    shapes = sorted(k for k in set(src) & set(dst) if src[k] != dst[k])
    raise ValueError(
      f"init_from: the source {what} do not fit the new model. Missing: {missing[:5]}; "
      f"unexpected: {extra[:5]}; different shapes: {[(k, src[k], dst[k]) for k in shapes[:5]]}."
    )
