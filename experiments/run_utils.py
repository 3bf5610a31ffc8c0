"""Helpers shared by the experiment scripts: load a config file, rebuild a run's parameters."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import flax.linen as nn
import jax
import ml_collections

from locvit.analysis.analyze import restore_params
from locvit.configs.common import complete_config
from locvit.platform import sharding
from locvit.run import config as run_config
from locvit.workdir import checkpoint, restore, saved_config


def image_shape(config: ml_collections.ConfigDict) -> tuple[int, int, int]:
  """The shape of the model's input images: ``data.image_size`` square, a channel per entry of
  the normalisation's ``data.mean``."""
  return (config.data.image_size, config.data.image_size, len(config.data.mean))


def run(main: Callable[[], None]) -> None:
  """Runs a script's ``main``; a bad argument (a missing run, config or image folder) is one line
  on stderr and exit status 2, as locvit.main reports it, not a traceback."""
  try:
    main()
  except (ValueError, FileNotFoundError) as e:
    print(f"{os.path.basename(sys.argv[0])}: error: {e}", file=sys.stderr)
    sys.exit(2)


def load_config(spec: str | None, workdir: str | None = None) -> ml_collections.ConfigDict:
  """``path/to/config.py[:arg]`` (or a shipped config's ``NAME[:arg]``) -> the ConfigDict of its
  ``get_config(arg)``; None: the config
  the run in ``workdir`` saved (``WORKDIR/config.json``: its overrides, data and class count)."""
  if spec is None:
    saved = saved_config.path(workdir)
    if not saved.exists():
      raise FileNotFoundError(
        f"{saved} does not exist (no training run saved its config there): give the run's "
        "--workdir, or its config as --config=path/to/config.py[:arg]"
      )
    return complete_config(saved_config.read(str(saved)))
  return run_config.load(spec)  # as locvit.main's --config (a ConfigError is a ValueError)


def run_num_classes(workdir: str) -> int:
  """The class count the head of ``workdir``'s checkpoints was built for."""
  return int(restore.saved_config(workdir)["num_classes"])


def initial_params(config: ml_collections.ConfigDict, model: nn.Module):
  """The trainer's step-0 parameters: ``model.init`` with ``key(seed + 1)`` (no ``config.init``)."""
  if config.get("init") is not None and config.init.name != "none":
    raise ValueError(f"config.init={config.init.name!r}: step 0 cannot be rebuilt from model.init.")
  init = lambda rng: sharding.init_model_variables(model, image_shape(config), rng)[0]
  return nn.meta.unbox(jax.jit(init)(jax.random.key(config.seed + 1)))


def checkpoint_steps(workdir: str) -> list[int]:
  """Steps of the checkpoints kept in ``workdir/checkpoints`` (sorted; raises if none)."""
  checkpointer = checkpoint.Checkpointer(
    os.path.join(workdir, "checkpoints"), async_save=False, read_only=True
  )
  steps = sorted(checkpointer.manager.all_steps())
  checkpointer.close()
  if not steps:
    raise FileNotFoundError(f"No checkpoints in {workdir}/checkpoints.")
  return steps


def params_at(config: ml_collections.ConfigDict, model: nn.Module, workdir: str, step: int):
  """Host copy of the parameters of the checkpoint at ``step``."""
  return jax.device_get(restore_params(config, workdir, model, image_shape(config), step)[0])
