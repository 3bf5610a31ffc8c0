"""Helpers shared by the experiment scripts: load a config file, rebuild a run's parameters."""

from __future__ import annotations

import importlib.util
import os

import flax.linen as nn
import jax
import ml_collections

from locvit import checkpoint as ckpt_lib
from locvit import sharding
from locvit.analysis.analyze import restore_params

IMAGE_SHAPE = (32, 32, 3)


def load_config(spec: str) -> ml_collections.ConfigDict:
  """``path/to/config.py[:arg]`` -> the ConfigDict of its ``get_config(arg)``."""
  path, _, arg = spec.partition(":")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"Config file {path!r} not found (expected path/to/config.py[:arg]).")
  module_spec = importlib.util.spec_from_file_location("run_config", path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(arg or None)


def initial_params(config: ml_collections.ConfigDict, model: nn.Module):
  """The trainer's step-0 parameters: ``model.init`` with ``key(seed + 1)`` (no ``config.init``)."""
  if config.get("init") is not None and config.init.name != "none":
    raise ValueError(f"config.init={config.init.name!r}: step 0 cannot be rebuilt from model.init.")
  init = lambda rng: sharding.init_model_variables(model, IMAGE_SHAPE, rng)[0]
  return nn.meta.unbox(jax.jit(init)(jax.random.key(config.seed + 1)))


def checkpoint_steps(workdir: str) -> list[int]:
  """Steps of the checkpoints kept in ``workdir/checkpoints`` (sorted; raises if none)."""
  checkpointer = ckpt_lib.Checkpointer(os.path.join(workdir, "checkpoints"), async_save=False)
  steps = sorted(checkpointer.manager.all_steps())
  checkpointer.close()
  if not steps:
    raise FileNotFoundError(f"No checkpoints in {workdir}/checkpoints.")
  return steps


def params_at(config: ml_collections.ConfigDict, model: nn.Module, workdir: str, step: int):
  """Host copy of the parameters of the checkpoint at ``step``."""
  return jax.device_get(restore_params(config, workdir, model, IMAGE_SHAPE, step)[0])
