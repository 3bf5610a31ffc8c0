"""Restoring a model's variables (no optimizer state) from a workdir's checkpoints: for
evaluation, analysis, distillation teachers and fine-tuning (``config.init_from``).

Reads through ``locvit.workdir.checkpoint.Checkpointer`` (read-only) and verifies the step's
checksums first, so a damaged step is named instead of restored.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import orbax.checkpoint as ocp

from locvit.platform.sharding import model_variable_shapes, with_shardings
from locvit.workdir import paths
from locvit.workdir.checkpoint import Checkpointer, DamagedCheckpointError
from locvit.workdir.checksums import verify_checksums


def restore_variables_args(abstract: dict[str, Any]) -> ocp.args.Composite:
  """Restore args for a subset (``params``, ``model_state``) of a saved TrainState."""
  return ocp.args.Composite(
    state=ocp.args.PyTreeRestore(
      item=abstract,
      restore_args=jax.tree.map(lambda a: ocp.ArrayRestoreArgs(sharding=a.sharding), abstract),
      partial_restore=True,
    )
  )


def _reader(workdir: str) -> Checkpointer:
  return Checkpointer(paths.path(workdir) / "checkpoints", async_save=False, read_only=True)


def vetted_step(
  workdir: str, step: int | None = None, check: Callable[[dict[str, Any]], None] | None = None
) -> int:
  """The checkpoint step of ``workdir`` to restore (the latest by default), once it is known to
  exist, to be intact (its checksums) and to pass ``check(meta)`` (a compatible config).

  Needs no model: callers vet the step before they build or trace one, so that a refusal comes
  before anything the model prints. Raises FileNotFoundError naming the directory when it holds
  no checkpoint, DamagedCheckpointError for a damaged step.
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
    problem = verify_checksums(checkpointer.directory / str(step))
    if problem is not None:
      raise DamagedCheckpointError(
        f"Checkpoint step {step} in {workdir}/checkpoints is damaged: {problem}. Saved steps: "
        f"{sorted(checkpointer.manager.all_steps())}; pick another with --step."
      )
    if check is not None:
      check(checkpointer.saved_meta(step))
  finally:
    checkpointer.close()
  return step


def read_model_variables(
  workdir: str,
  model: nn.Module,
  image_shape: tuple[int, ...],
  step: int,
  shardings: tuple[Any, Any] | None = None,
) -> tuple[Any, Any]:
  """``(params, model_state)`` of the ``vetted_step`` ``step``, into ``shardings`` (a
  ``(params, model_state)`` pair of sharding trees) or onto the first device."""
  abstract = nn.meta.unbox(model_variable_shapes(model, image_shape))
  if shardings is None:
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    shardings = jax.tree.map(lambda _: device, abstract)
  abstract = with_shardings(abstract, shardings)
  checkpointer = _reader(workdir)
  try:
    restored = checkpointer.manager.restore(
      step, args=restore_variables_args({"params": abstract[0], "model_state": abstract[1]})
    )["state"]
  finally:
    checkpointer.close()
  return restored["params"], restored["model_state"]


def restore_model_variables(
  workdir: str,
  model: nn.Module,
  image_shape: tuple[int, ...],
  *,
  step: int | None = None,
  shardings: tuple[Any, Any] | None = None,
  check: Callable[[dict[str, Any]], None] | None = None,
) -> tuple[Any, Any, int]:
  """``(params, model_state, step)`` from ``workdir/checkpoints`` (the latest step by default):
  ``vetted_step`` then ``read_model_variables``."""
  step = vetted_step(workdir, step, check)
  return *read_model_variables(workdir, model, image_shape, step, shardings), step


def saved_config(workdir: str, step: int | None = None) -> dict[str, Any]:
  """The config fingerprint (``fingerprint.fingerprint``: model, data, class count) saved with
  ``workdir``'s checkpoint (the latest by default); read only, nothing is created."""
  checkpointer = _reader(workdir)
  try:
    meta = checkpointer.saved_meta(step)
  finally:
    checkpointer.close()
  if meta is None:
    raise FileNotFoundError(f"No checkpoint found in {workdir}/checkpoints.")
  return meta["config"]


def saved_model_config(workdir: str, step: int | None = None) -> dict[str, Any]:
  """The ``model`` entry (name, overrides) of the config that wrote ``workdir``'s checkpoint."""
  return saved_config(workdir, step)["model"]


def restore_ema_params(workdir: str, step: int, shardings: Any, boxed_params: Any) -> Any:
  """The EMA weights (``TrainState.ema_params``) saved at ``step``, in ``shardings``."""
  abstract = with_shardings(nn.meta.unbox(boxed_params), shardings)
  checkpointer = _reader(workdir)
  try:
    restored = checkpointer.manager.restore(
      step, args=restore_variables_args({"ema_params": abstract})
    )
  finally:
    checkpointer.close()
  return restored["state"]["ema_params"]
