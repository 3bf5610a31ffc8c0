"""Checkpoints with orbax: async saves, last-N plus best retention, data-iterator position, resume.

``DIR/<step>`` keeps the last N steps and ``DIR/best/<step>`` the best one. A step holds:
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

import flax.linen as nn
import grain
import jax
import jax.numpy as jnp
import ml_collections
import orbax.checkpoint as ocp

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
  "distillation.type",  # the student gains a distillation token and head
  "ema.enabled",  # the state gains the EMA weights (derived: ema.decay > 0)
)


def _get(config: ml_collections.ConfigDict, dotted: str) -> Any:
  if dotted == "ema.enabled":
    ema = config.get("ema")
    return bool(ema is not None and ema.decay > 0)
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
  # Fields absent from an older checkpoint's metadata are not compared.
  diffs = [
    f"  {k}: checkpoint has {saved.get(k)!r}, config has {current[k]!r}"
    for k in FINGERPRINT_FIELDS
    if k in saved and saved[k] != current[k]
  ]
  if diffs:
    raise ValueError(
      f"The checkpoint in {where} was written by an incompatible config:\n"
      + "\n".join(diffs)
      + "\nUse a fresh --workdir, or restore the original config values to resume."
    )


def _manager(
  directory: str, keep: int, async_save: bool, read_only: bool = False
) -> ocp.CheckpointManager:
  # Read-only: creates no directory (a mistyped --workdir stays absent) and starts no background
  # clean-up of temporary directories (which could outlive a process that exits at once).
  return ocp.CheckpointManager(
    directory,
    item_names=("state", "data", "meta"),
    options=ocp.CheckpointManagerOptions(
      max_to_keep=keep,
      enable_async_checkpointing=async_save,
      cleanup_tmp_directories=not read_only,
      create=not read_only,
      read_only=read_only,
    ),
  )


class Checkpointer:
  """Orbax managers for ``DIR`` (the last ``keep`` steps, for resuming) and ``DIR/best`` (the
  step with the highest ``eval/top1`` so far).

  Keeping "best" in its own manager means newer steps can never rotate it out, also across
  restarts.
  """

  def __init__(
    self,
    directory: str,
    *,
    keep: int = 3,
    keep_best: bool = True,
    async_save: bool = True,
    read_only: bool = False,
  ):
    self.directory = os.path.abspath(directory)
    self.manager = _manager(self.directory, max(keep, 1), async_save, read_only)
    best_dir = os.path.join(self.directory, "best")
    self.best = _manager(best_dir, 1, async_save, read_only) if keep_best else None

  def latest_step(self) -> int | None:
    """The newest saved step in ``DIR``, or None when there is none."""
    return self.manager.latest_step()

  def best_step(self) -> int | None:
    """The step kept in ``DIR/best``, or None (nothing saved yet, or ``keep_best=False``)."""
    return self.best.latest_step() if self.best is not None else None

  def best_score(self) -> float | None:
    """``eval/top1`` of the best checkpoint (read from its metadata), or None."""
    step = self.best_step()
    if step is None:
      return None
    meta = self.best.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
    return meta["metrics"][BEST_METRIC]

  def saved_meta(self, step: int | None = None) -> dict[str, Any] | None:
    """The ``meta`` JSON (step, config fingerprint, eval metrics) of ``step`` (default: latest),
    or None when nothing is saved."""
    step = self.latest_step() if step is None else step
    if step is None:
      return None
    return self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]

  def _items(self, step, state, data_iter, config, metrics) -> ocp.args.Composite:
    items = {
      "state": ocp.args.StandardSave(state),
      "meta": ocp.args.JsonSave({"step": step, "config": fingerprint(config), "metrics": metrics}),
    }
    if data_iter is not None:
      items["data"] = grain.checkpoint.CheckpointSave(data_iter)
    return ocp.args.Composite(**items)

  def save(
    self,
    step: int,
    state: Any,
    data_iter: grain.DatasetIterator | None,
    config: ml_collections.ConfigDict,
    metrics: dict[str, Any] | None = None,
    force: bool = False,
  ) -> bool:
    """Saves ``step``; also replaces the best checkpoint when ``eval/top1`` improves on it."""
    metrics = {k: float(v) for k, v in (metrics or {}).items() if k.startswith("eval/")}
    saved = self.manager.save(
      step, args=self._items(step, state, data_iter, config, metrics), force=force
    )
    if self.best is not None and BEST_METRIC in metrics:
      best = self.best_score()
      if best is None or metrics[BEST_METRIC] > best:
        self.best.save(step, args=self._items(step, state, None, config, metrics), force=True)
    return saved

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
    """Blocks until every asynchronous save (last-N and best) has been committed."""
    self.manager.wait_until_finished()
    if self.best is not None:
      self.best.wait_until_finished()

  def close(self) -> None:
    """Waits for pending saves and releases both managers."""
    self.manager.close()
    if self.best is not None:
      self.best.close()


# ------------------------------------------------------------------------------------------------
# Restoring a model's variables (no optimizer state) for evaluation, analysis, teachers, fine-tuning


def restore_variables_args(abstract: dict[str, Any]) -> ocp.args.Composite:
  """Restore args for a subset (``params``, ``model_state``) of a saved TrainState."""
  return ocp.args.Composite(
    state=ocp.args.PyTreeRestore(
      item=abstract,
      restore_args=jax.tree.map(lambda a: ocp.ArrayRestoreArgs(sharding=a.sharding), abstract),
      partial_restore=True,
    )
  )


def model_variable_shapes(model: nn.Module, image_shape: tuple[int, ...]) -> tuple[Any, Any]:
  """Boxed abstract ``(params, other collections)`` of ``model`` (shapes and logical axes)."""
  variables = jax.eval_shape(
    lambda rng: model.init({"params": rng}, jnp.zeros((1, *image_shape), jnp.float32)),
    jax.random.key(0),
  )
  return variables["params"], {k: v for k, v in variables.items() if k != "params"}


def _reader(workdir: str) -> Checkpointer:
  return Checkpointer(os.path.join(workdir, "checkpoints"), async_save=False, read_only=True)


def restore_model_variables(
  workdir: str,
  model: nn.Module,
  image_shape: tuple[int, ...],
  *,
  step: int | None = None,
  shardings: tuple[Any, Any] | None = None,
  config: ml_collections.ConfigDict | None = None,
) -> tuple[Any, Any, int]:
  """``(params, model_state, step)`` from ``workdir/checkpoints`` (the latest step by default).

  Restores into ``shardings`` (a ``(params, model_state)`` pair of sharding trees) or onto the
  first device. With ``config``, first checks the checkpoint was written by a compatible config.
  Raises FileNotFoundError naming the directory when it holds no checkpoint.
  """
  checkpointer = _reader(workdir)
  try:
    step = checkpointer.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"No checkpoint found in {workdir}/checkpoints.")
    if step not in checkpointer.manager.all_steps():
      raise FileNotFoundError(
        f"No checkpoint for step {step} in {workdir}/checkpoints; saved steps: "
        f"{sorted(checkpointer.manager.all_steps())}."
      )
    if config is not None:
      check_compatible(checkpointer.saved_meta(step)["config"], config, workdir)
    abstract = nn.meta.unbox(model_variable_shapes(model, image_shape))
    if shardings is None:
      device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
      shardings = jax.tree.map(lambda _: device, abstract)
    abstract = jax.tree.map(
      lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings
    )
    restored = checkpointer.manager.restore(
      step, args=restore_variables_args({"params": abstract[0], "model_state": abstract[1]})
    )["state"]
  finally:
    checkpointer.close()
  return restored["params"], restored["model_state"], step


def saved_model_config(workdir: str, step: int | None = None) -> dict[str, Any]:
  """The ``model`` entry (name, overrides) of the config that wrote ``workdir``'s checkpoint."""
  checkpointer = _reader(workdir)
  try:
    meta = checkpointer.saved_meta(step)
  finally:
    checkpointer.close()
  if meta is None:
    raise FileNotFoundError(f"No checkpoint found in {workdir}/checkpoints.")
  return meta["config"]["model"]


def restore_ema_params(workdir: str, step: int, shardings: Any, boxed_params: Any) -> Any:
  """The EMA weights (``TrainState.ema_params``) saved at ``step``, in ``shardings``."""
  abstract = jax.tree.map(
    lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
    nn.meta.unbox(boxed_params),
    shardings,
  )
  checkpointer = _reader(workdir)
  try:
    restored = checkpointer.manager.restore(
      step, args=restore_variables_args({"ema_params": abstract})
    )
  finally:
    checkpointer.close()
  return restored["state"]["ema_params"]
