"""What a checkpoint records of the run's config: the fingerprint, which must match to resume
from it, and the hyperparameters, whose change on resume is allowed but reported (one warning,
and an entry in ``DIR/resume_log.json``).
"""

from __future__ import annotations

import json
import time
from typing import Any

import jax
import ml_collections
from absl import logging

from locvit.configs.common import base_config, complete_config
from locvit.workdir.lock import paths

# Config fields whose change makes a checkpoint unusable for resuming.
FINGERPRINT_FIELDS = (
  "model",
  "data.source",
  "data.name",
  "data.image_size",
  "data.num_classes",
  "num_classes",  # derived: the class count the head was built for (data.num_classes or source's)
  "optimizer.name",
  "optimizer.decay_mask",
  "optimizer.flatten",  # the optimizer state: one flat vector per moment, or one per parameter
  "freeze",
  "grad_clip_norm",
  "distillation.type",  # the student gains a distillation token and head
  "ema.enabled",  # the state gains the EMA weights (derived: ema.decay > 0)
)


# Fields whose change on resume is allowed but reported (one warning, and RESUME_LOG).
HYPERPARAMETER_FIELDS = (
  "optimizer",
  "schedule",
  "batch_size",
  "grad_accum_steps",
  "total_steps",
  "num_epochs",
  "label_smoothing",
  "data.root",
)
RESUME_LOG = "resume_log.json"  # in the workdir: one entry per resume with changed fields


def _get(config: ml_collections.ConfigDict, dotted: str, num_classes: int | None = None) -> Any:
  if dotted == "ema.enabled":
    return bool(config.ema is not None and config.ema.decay > 0)
  if dotted == "num_classes":
    return num_classes if num_classes is not None else config.data.num_classes
  value: Any = config
  for part in dotted.split("."):
    value = value[part] if isinstance(value, ml_collections.ConfigDict) and part in value else None
  return value.to_dict() if isinstance(value, ml_collections.ConfigDict) else value


def _with_defaults(saved: Any, default: Any) -> Any:
  """A recorded value with what an older version did not record (an absent field, a None where
  the field did not exist yet) taken from the default, as ``complete_config`` does to a config."""
  if saved is None:
    return default
  if isinstance(saved, dict) and isinstance(default, dict):
    return {**default, **{k: _with_defaults(v, default.get(k)) for k, v in saved.items()}}
  return saved


def _recorded_with_defaults(recorded: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
  """Both sides of a comparison go through this, so that a block a config sets to None (off)
  compares equal to the same None recorded earlier."""
  return {k: _with_defaults(v, defaults.get(k)) for k, v in recorded.items()}


def _jsonable(fields, config, num_classes) -> dict[str, Any]:
  config = complete_config(config)  # a field the config lacks counts as its default
  return json.loads(json.dumps({f: _get(config, f, num_classes) for f in fields}, default=str))


def fingerprint(
  config: ml_collections.ConfigDict, num_classes: int | None = None
) -> dict[str, Any]:
  """The JSON-able subset of the config a checkpoint depends on."""
  return _jsonable(FINGERPRINT_FIELDS, config, num_classes)


def hyperparameters(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """The training settings recorded with each checkpoint (a change is reported on resume)."""
  return _jsonable(HYPERPARAMETER_FIELDS, config, None)


def check_compatible(
  saved: dict[str, Any],
  config: ml_collections.ConfigDict,
  where: str,
  num_classes: int | None = None,
) -> None:
  """Raises if the workdir's checkpoint came from an incompatible config (model, dataset, ...)."""
  defaults = fingerprint(base_config())
  current = _recorded_with_defaults(fingerprint(config, num_classes), defaults)
  saved = _recorded_with_defaults(saved, defaults)
  # Fields absent from an older checkpoint's metadata are not compared, nor a class count the
  # caller does not know.
  diffs = [
    f"  {k}: checkpoint has {saved.get(k)!r}, config has {current[k]!r}"
    for k in FINGERPRINT_FIELDS
    if k in saved and saved[k] != current[k] and not (k == "num_classes" and current[k] is None)
  ]
  if diffs:
    raise ValueError(
      f"The checkpoint in {where} was written by an incompatible config:\n"
      + "\n".join(diffs)
      + "\nUse a fresh --workdir, or restore the original config values to resume."
    )


def _leaves(value: Any, prefix: str) -> dict[str, Any]:
  """``{'optimizer.lr': 0.001, ...}`` for a nested dict under the name ``prefix``."""
  if isinstance(value, dict):
    return {k: v for key in value for k, v in _leaves(value[key], f"{prefix}.{key}").items()}
  return {prefix: value}


def _as_set(field: str, value: Any) -> str:
  if field == "total_steps" and isinstance(value, int) and value <= 0:
    return "unset (from num_epochs)"  # -1 is the config's "not set"
  return repr(value)


def describe_changes(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
  """``['optimizer.lr: 0.001 -> 0.0005', ...]``: each changed leaf, as the user would set it."""
  lines = []
  for field in saved:
    old, new = _leaves(saved[field], field), _leaves(current[field], field)
    for leaf in sorted(old.keys() | new.keys()):
      if old.get(leaf) != new.get(leaf):
        lines.append(f"{leaf}: {_as_set(leaf, old.get(leaf))} -> {_as_set(leaf, new.get(leaf))}")
  return lines


def report_changed_hyperparameters(
  saved_meta: dict[str, Any], config: ml_collections.ConfigDict, workdir: str, step: int
) -> list[str]:
  """Lists training settings changed since ``step`` was saved in ONE warning, and appends them to
  ``workdir/resume_log.json``; returns the changed field names (none for older checkpoints)."""
  defaults = hyperparameters(base_config())
  saved = _recorded_with_defaults(saved_meta.get("hyperparameters") or {}, defaults)
  current = _recorded_with_defaults(hyperparameters(config), defaults)
  changed = [k for k in HYPERPARAMETER_FIELDS if k in saved and saved[k] != current[k]]
  if not changed:
    return []
  lines = describe_changes({k: saved[k] for k in changed}, {k: current[k] for k in changed})
  logging.warning(
    "Resuming from step %d with changed training settings: %s", step, "; ".join(lines)
  )
  if jax.process_index() == 0:
    path = paths.path(workdir) / RESUME_LOG
    log = json.loads(path.read_text()) if path.exists() else []
    log.append(
      {
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "step": step,
        "changed": {k: {"checkpoint": saved[k], "config": current[k]} for k in changed},
      }
    )
    paths.write_atomically(path, json.dumps(log, indent=1))
  return changed


def checkpoint_meta(config: ml_collections.ConfigDict, num_classes: int | None = None) -> dict:
  """The ``meta`` a checkpoint keeps of ``config`` (``Checkpointer.save``)."""
  return {"config": fingerprint(config, num_classes), "hyperparameters": hyperparameters(config)}
