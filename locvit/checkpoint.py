"""Checkpoints with orbax: async saves, last-N plus best retention, data-iterator position, resume.

A checkpoint step directory holds three items:
- ``state``: the sharded ``TrainState`` (restored with the shardings of the abstract target);
- ``data``: the grain training-iterator position, one file per process;
- ``meta``: JSON with the config fingerprint, so an incompatible workdir is caught before compiling.

Orbax writes each step into a temporary directory and renames it when complete, so an interrupted
save never leaves a half-written checkpoint that would be picked up on resume.
"""

from __future__ import annotations

import json
import os
from typing import Any

import grain
import jax
import ml_collections
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as policies

BEST_METRIC = "eval/top1"
# Config fields whose change makes a checkpoint unusable for resuming.
FINGERPRINT_FIELDS = (
  "model",
  "data.image_size",
  "data.num_classes",
  "optimizer.name",
  "optimizer.decay_mask",
  "freeze",
  "grad_clip_norm",
)


def _get(config: ml_collections.ConfigDict, dotted: str) -> Any:
  value: Any = config
  for part in dotted.split("."):
    value = value.get(part) if hasattr(value, "get") else None
  return value.to_dict() if isinstance(value, ml_collections.ConfigDict) else value


def fingerprint(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """The JSON-able subset of the config a checkpoint depends on."""
  return json.loads(json.dumps({f: _get(config, f) for f in FINGERPRINT_FIELDS}, default=str))


def check_compatible(saved: dict[str, Any], config: ml_collections.ConfigDict, where: str) -> None:
  """Raises if the workdir's checkpoint came from an incompatible config."""
  current = fingerprint(config)
  diffs = [
    f"  {k}: checkpoint has {saved.get(k)!r}, config has {current[k]!r}"
    for k in FINGERPRINT_FIELDS
    if saved.get(k) != current[k]
  ]
  if diffs:
    raise ValueError(
      f"The checkpoint in {where} was written by an incompatible config:\n"
      + "\n".join(diffs)
      + "\nUse a fresh --workdir, or restore the original config values to resume."
    )


class Checkpointer:
  """Thin wrapper over ``ocp.CheckpointManager`` with locvit's items and retention policy."""

  def __init__(
    self, directory: str, *, keep: int = 3, keep_best: bool = True, async_save: bool = True
  ):
    self.directory = os.path.abspath(directory)
    preserve = [policies.LatestN(n=max(keep, 1))]
    if keep_best:
      preserve.append(
        policies.BestN(
          get_metric_fn=lambda m: m[BEST_METRIC], n=1, keep_checkpoints_without_metrics=False
        )
      )
    self.manager = ocp.CheckpointManager(
      self.directory,
      item_names=("state", "data", "meta"),
      options=ocp.CheckpointManagerOptions(
        enable_async_checkpointing=async_save,
        preservation_policy=policies.AnyPreservationPolicy(preserve),
        cleanup_tmp_directories=True,
      ),
    )

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def best_step(self) -> int | None:
    return self.manager.best_step()

  def saved_meta(self, step: int | None = None) -> dict[str, Any] | None:
    step = self.latest_step() if step is None else step
    if step is None:
      return None
    return self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]

  def save(
    self,
    step: int,
    state: Any,
    data_iter: grain.DatasetIterator | None,
    config: ml_collections.ConfigDict,
    metrics: dict[str, float] | None = None,
    force: bool = False,
  ) -> bool:
    items = {
      "state": ocp.args.StandardSave(state),
      "meta": ocp.args.JsonSave({"step": step, "config": fingerprint(config)}),
    }
    if data_iter is not None:
      items["data"] = grain.checkpoint.CheckpointSave(data_iter)
    best = (
      {BEST_METRIC: float(metrics[BEST_METRIC])} if metrics and BEST_METRIC in metrics else None
    )
    return self.manager.save(step, args=ocp.args.Composite(**items), metrics=best, force=force)

  def restore(
    self, step: int, abstract_state: Any, data_iter: grain.DatasetIterator | None = None
  ) -> Any:
    """Restores ``state`` into the shardings of ``abstract_state`` (and the iterator in place)."""
    items = {"state": ocp.args.StandardRestore(abstract_state)}
    if data_iter is not None:
      items["data"] = grain.checkpoint.CheckpointRestore(data_iter)
    return self.manager.restore(step, args=ocp.args.Composite(**items))["state"]

  def reached_preemption(self, step: int) -> bool:
    """Multi-host preemption notice (JAX's distributed preemption sync); False single-process."""
    return jax.process_count() > 1 and self.manager.reached_preemption(step)

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.close()
