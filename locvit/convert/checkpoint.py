"""Reading PyTorch weight files and writing / restoring converted Flax checkpoints (orbax)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

# Wrappers used by official checkpoints ({'model': state_dict, 'optimizer': ..., ...}).
WRAPPER_KEYS = ("model", "state_dict")


def unwrap_state_dict(obj: Mapping[str, Any]) -> Mapping[str, Any]:
  """Returns the state dict inside an official training checkpoint, else ``obj`` itself."""
  for key in WRAPPER_KEYS:
    if key in obj and isinstance(obj[key], Mapping):
      return unwrap_state_dict(obj[key])
  return obj


def read_state_dict(path: str | os.PathLike) -> Mapping[str, Any]:
  """Loads ``.pth`` / ``.pt`` / ``.bin`` (torch, ``weights_only=True``), ``.safetensors`` or
  ``.npz`` (NumPy arrays keyed by the timm parameter names; needs neither torch nor safetensors)."""
  path = os.fspath(path)
  if path.endswith(".npz"):
    import numpy as np

    with np.load(path) as archive:
      return {key: archive[key] for key in archive.files}
  if path.endswith(".safetensors"):
    try:
      from safetensors.numpy import load_file
    except ImportError as e:
      raise ImportError(
        f"Reading {path!r} needs the 'safetensors' package (pip install safetensors), "
        "or convert from a .pth file instead."
      ) from e
    try:
      return load_file(path)
    except TypeError:  # bfloat16 tensors have no NumPy dtype: read them through torch
      from safetensors.torch import load_file as load_torch

      return load_torch(path)
  try:
    import torch
  except ImportError as e:
    raise ImportError(f"Reading {path!r} needs PyTorch (pip install torch).") from e
  return unwrap_state_dict(torch.load(path, map_location="cpu", weights_only=True))


def save_converted(
  directory: str | os.PathLike,
  variables: Mapping[str, Any],
  *,
  metadata: Mapping[str, Any] | None = None,
  force: bool = False,
) -> str:
  """Writes ``{'params': ...}`` as an orbax checkpoint at ``directory``; returns its path."""
  import orbax.checkpoint as ocp

  directory = os.path.abspath(os.fspath(directory))
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(directory, dict(variables), force=force, custom_metadata=dict(metadata or {}))
    checkpointer.wait_until_finished()
  return directory


def load_converted(directory: str | os.PathLike) -> dict[str, Any]:
  """Restores the ``{'params': ...}`` written by ``save_converted`` / the CLI."""
  import orbax.checkpoint as ocp

  with ocp.StandardCheckpointer() as checkpointer:
    return checkpointer.restore(os.path.abspath(os.fspath(directory)))


def export_run(
  workdir: str,
  directory: str | os.PathLike,
  *,
  step: int | None = None,
  force: bool = False,
) -> tuple[str, dict[str, Any]]:
  """Writes the ConViT / DeiT parameters of a locvit run's checkpoint (the latest by default) as
  ``save_converted`` does, with the run's model name, overrides (``distilled=True`` for a
  distillation student) and class count as metadata;
  returns ``(path, metadata)``. The metadata also holds the run's evaluation preprocessing under
  timm's ``pretrained_cfg`` keys (``input_size``, ``mean``, ``std``, ``interpolation``,
  ``crop_pct``), so that ``load_pretrained`` and ``--mode=predict`` read images as the run
  evaluated them; the image channels are one per entry of its ``config.json``'s ``data.mean``
  (1 for the grayscale quickstart). Raises ValueError for a model ``from_timm`` does not convert."""
  import flax.linen as nn
  import jax

  from locvit.convert.timm import resolve_model_name
  from locvit.models import create_model
  from locvit.workdir import restore, saved_config

  saved = restore.saved_config(workdir, step)
  data = saved_config.read(saved_config.path(workdir)).data
  name = resolve_model_name(saved["model"]["name"])
  overrides = dict(saved["model"].get("overrides") or {})
  if saved.get("distillation.type") not in (None, "none"):  # build_model's distillation token
    overrides["distilled"] = True
  model = create_model(name, num_classes=saved["num_classes"], **overrides)
  size = saved["data.image_size"]
  params, _, step = restore.restore_model_variables(
    workdir, model, (size, size, len(data.mean)), step=step
  )
  metadata = {
    "model": name,
    "num_classes": saved["num_classes"],
    "overrides": {k: repr(v) for k, v in overrides.items()},
    "source": f"{workdir} (step {step})",
    "input_size": [len(data.mean), size, size],
    "mean": list(data.mean),
    "std": list(data.std),
    "interpolation": data.get("interpolation", "bicubic"),
    "crop_pct": data.get("eval_crop_pct", 1.0),
  }
  variables = {"params": jax.device_get(nn.meta.unbox(params))}
  return save_converted(directory, variables, metadata=metadata, force=force), metadata
