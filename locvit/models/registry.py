"""Model registry: ``create_model(name, num_classes=..., **overrides)`` and ``list_models()``.

Every family's names come from the ``MODELS`` table of its module, all listed in ``FAMILIES``
below: ``name -> (build(num_classes), image size)``. Names are generated from each paper's sizes
and resolutions, so ``list_models('PATTERN')`` (or ``python -m locvit.main --list_models``) is how
to find them; each module's ``MODELS`` shows how they are formed. ``register_model`` adds a user's
own model.
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
from collections.abc import Callable
from typing import Any

import flax.linen as nn

from locvit.models import (
  cait,
  convit,
  convmixer,
  cordonnier,
  deit,
  pit,
  resnet,
  small_vit,
  structured_vit,
  swin,
  t2t,
)
from locvit.ops import resolve_implementation

FAMILIES = {
  "deit": deit.MODELS,  # DeiT (Touvron et al.), at 224 and small-image resolutions
  "convit": convit.MODELS,  # ConViT (d'Ascoli et al.)
  "cordonnier": cordonnier.MODELS,  # Cordonnier et al.'s attention-only CIFAR networks
  "resnet": resnet.MODELS,  # CNN baselines and teachers
  "small_vit": small_vit.MODELS,  # the GMM paper's small-data ViTs, plain and masked
  "cait": cait.MODELS,  # the GMM paper's small-data CaiT, PiT, Swin and T2T, plain and masked
  "pit": pit.MODELS,
  "swin": swin.MODELS,
  "t2t": t2t.MODELS,
  "structured_vit": structured_vit.MODELS,  # structured initialization's ViTs
  "convmixer": convmixer.MODELS,  # structured initialization's ConvMixers
}

_MODELS: dict[str, Callable[..., nn.Module]] = {}
_DEFAULT_IMAGE_SIZE: dict[str, int] = {}


def register_model(name: str, *, image_size: int) -> Callable:
  """Decorator adding ``fn(num_classes) -> nn.Module`` under ``name`` (a user's own model)."""

  def wrap(fn):
    if name in _MODELS:
      raise ValueError(f"Model {name!r} is already registered.")
    _MODELS[name] = fn
    _DEFAULT_IMAGE_SIZE[name] = image_size
    return fn

  return wrap


for _table in FAMILIES.values():
  for _name, (_build, _image_size) in _table.items():
    register_model(_name, image_size=_image_size)(_build)


def list_models(pattern: str | None = None) -> list[str]:
  """Registered model names, sorted; ``pattern`` filters them as a shell glob, as timm's does
  (``list_models("convit*")``), and a pattern without ``*?[`` as a substring."""
  if pattern is None:
    return sorted(_MODELS)
  if not any(c in pattern for c in "*?["):
    pattern = f"*{pattern}*"
  return sorted(fnmatch.filter(_MODELS, pattern))


def _unknown(name: str) -> ValueError:
  close = difflib.get_close_matches(name, _MODELS, n=3)
  hint = f"did you mean {' or '.join(close)}? " if close else ""
  return ValueError(
    f"unknown model {name!r}; {hint}`python -m locvit.main --list_models='PATTERN'` lists the "
    f"{len(_MODELS)} names"
  )


def default_image_size(name: str) -> int:
  """The image side a registered model was defined for (e.g. 32 or 224); raises ValueError
  with close matches for an unknown name."""
  if name not in _MODELS:
    raise _unknown(name)
  return _DEFAULT_IMAGE_SIZE[name]


def _fields(model: nn.Module) -> set[str]:
  return {f.name for f in dataclasses.fields(model)} - {"parent", "name"}


def check_overrides(name: str, overrides: Any) -> None:
  """Raises ``ValueError``, a line per name of ``overrides`` that is not a field of the registered
  model ``name`` (``model.overrides.dept: deit_tiny_patch2_32 has no field 'dept'; did you mean
  depth?``); nothing for an unknown model (``create_model`` names it)."""
  if name not in _MODELS:
    return
  fields = sorted(_fields(_MODELS[name](1)))
  lines = []
  for bad in sorted(set(overrides) - set(fields)):
    close = difflib.get_close_matches(bad, fields, n=3)
    hint = f"did you mean {' or '.join(close)}?" if close else f"fields: {', '.join(fields)}"
    lines.append(f"model.overrides.{bad}: {name} has no field {bad!r}; {hint}")
  if lines:
    raise ValueError("\n".join(lines))


def create_model(name: str, num_classes: int = 1000, **overrides: Any) -> nn.Module:
  """Builds a registered model; ``overrides`` replace fields of the module (e.g. ``depth=6``).

  The kernel setting ``attention_implementation`` is resolved here, once (``locvit.ops``): None
  becomes 'cpu_kernels' (the CPU code paths) on CPU and stays None (JAX's choice) elsewhere.
  """
  if name not in _MODELS:
    raise _unknown(name)
  model = _MODELS[name](num_classes)
  fields = _fields(model)
  check_overrides(name, overrides)
  if "attention_implementation" in fields:
    implementation = overrides.get("attention_implementation", model.attention_implementation)
    overrides["attention_implementation"] = resolve_implementation(implementation)
  model = model.clone(**overrides) if overrides else model
  if hasattr(model, "check"):
    model.check()
  return model
