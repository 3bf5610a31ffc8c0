"""Model registry: ``create_model(name, num_classes=..., **overrides)`` and ``list_models()``.

Every family's names come from the ``MODELS`` table of its module, all listed in ``FAMILIES``
below: ``name -> (build(num_classes), image size)``. Names are generated from each paper's sizes
and resolutions, so ``list_models('PATTERN')`` (or ``python -m locvit.main --list_models``) is how
to find them; each module's ``MODELS`` shows how they are formed. ``register_model`` adds a user's
own model.
"""

from __future__ import annotations

import ast
import collections.abc
import dataclasses
import difflib
import fnmatch
import functools
import types
import typing
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
from absl import flags

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
from locvit.platform.ops import resolve_implementation

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


@functools.cache
def _field_types(name: str) -> dict[str, Any]:
  """The registered model ``name``'s fields and their annotations, resolved (``int``,
  ``Sequence[int] | None``, ``Literal['token', 'gap']``)."""
  model = _MODELS[name](1)
  hints = typing.get_type_hints(type(model))
  return {field: hints.get(field, Any) for field in _fields(model)}


def _without_none(annotation: Any) -> tuple[Any, bool]:
  """(``annotation`` less ``| None``, whether it had it); a union of several types is ``Any``."""
  args = typing.get_args(annotation)
  if typing.get_origin(annotation) in (typing.Union, types.UnionType) and type(None) in args:
    rest = tuple(a for a in args if a is not type(None))
    return (rest[0] if len(rest) == 1 else Any), True
  return annotation, False


def _is_sequence(annotation: Any) -> bool:
  origin = typing.get_origin(annotation) or annotation
  return isinstance(origin, type) and issubclass(origin, collections.abc.Sequence | tuple)


def _is_mapping(annotation: Any) -> bool:
  origin = typing.get_origin(annotation) or annotation
  return isinstance(origin, type) and issubclass(origin, collections.abc.Mapping)


def _item(annotation: Any, value: Any) -> Any:
  """A literal's item as the sequence's item type says; ValueError if it is not one."""
  if annotation is float and isinstance(value, int | float) and not isinstance(value, bool):
    return float(value)
  if annotation in (int, str, bool) and type(value) is not annotation:
    raise ValueError(value)
  return value


def _parse_as(annotation: Any, text: str) -> Any:
  """``text`` as a value of ``annotation``; ValueError (or SyntaxError) if it does not fit."""
  annotation, optional = _without_none(annotation)
  if optional and text == "None":
    return None
  if annotation is bool:
    return flags.BooleanParser().parse(text)  # true/false, 1/0, any case
  if annotation in (int, float, str):
    return annotation(text)
  if typing.get_origin(annotation) is typing.Literal:
    if text not in map(str, typing.get_args(annotation)):
      raise ValueError(text)
    return text
  if _is_sequence(annotation) or _is_mapping(annotation):
    value = ast.literal_eval(text)
    if _is_mapping(annotation):
      if not isinstance(value, dict):
        raise ValueError(text)
      return value
    if not isinstance(value, list | tuple):
      raise ValueError(text)
    item = (typing.get_args(annotation) or (Any,))[0]
    return tuple(_item(item, v) for v in value)
  try:  # Any (a dtype): a Python literal, else the text
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text


def _expected(annotation: Any) -> str:
  """What a field of ``annotation`` takes, in words: ``an int``, ``a tuple of ints ...``."""
  annotation, optional = _without_none(annotation)
  item = (typing.get_args(annotation) or (Any,))[0]
  words = {int: "ints", float: "floats", str: "strings", bool: "bools"}
  if annotation is bool:
    text = "a bool (true or false, 1 or 0)"
  elif annotation in (int, float):
    text = f"a{'n' if annotation is int else ''} {annotation.__name__}"
  elif typing.get_origin(annotation) is typing.Literal:
    text = f"one of {', '.join(map(str, typing.get_args(annotation)))}"
  elif _is_mapping(annotation):
    text = "a dict literal ({'key': value, ...})"
  elif _is_sequence(annotation):
    text = f"a tuple of {words.get(item, 'values')} (a list or tuple literal)"
  else:
    text = "a value"
  return text + (" or None" if optional else "")


def parse_override(name: str, field: str, text: str) -> Any:
  """The command line's text for the field ``field`` of the registered model ``name`` (e.g.
  ``--config.model.overrides.FIELD=TEXT``), read as the field's type says: a bool as absl reads
  one (true/false, 1/0), an int or float, a tuple from a list or tuple literal, a dict literal,
  one of a ``Literal``'s choices, ``None`` where the field allows it; a string field takes the
  text as it is. Raises ``ValueError`` with one line: ``check_overrides``'s for a field the model
  lacks, else ``model.overrides.FIELD=TEXT: NAME's FIELD takes TYPE``."""
  if name not in _MODELS:
    raise _unknown(name)
  check_overrides(name, [field])
  annotation = _field_types(name)[field]
  try:
    return _parse_as(annotation, text)
  except (ValueError, SyntaxError, TypeError):
    raise ValueError(
      f"model.overrides.{field}={text}: {name}'s {field} takes {_expected(annotation)}"
    ) from None


def boolean_override(name: str, field: str) -> bool:
  """Whether the field ``field`` of the registered model ``name`` is a bool (or ``bool | None``):
  on a command line it may stand bare (True) or with the prefix ``no`` (False), as absl's."""
  if name not in _MODELS:
    return False
  return _without_none(_field_types(name).get(field))[0] is bool


def create_model(name: str, num_classes: int = 1000, **overrides: Any) -> nn.Module:
  """Builds a registered model; ``overrides`` replace fields of the module (e.g. ``depth=6``).

  The kernel setting ``attention_implementation`` is resolved here, once, for the default backend
  (``locvit.platform.ops.resolve_implementation``): None becomes 'cpu_kernels' (the CPU code
  paths) on CPU and stays None (JAX's choice) elsewhere.
  """
  if name not in _MODELS:
    raise _unknown(name)
  model = _MODELS[name](num_classes)
  fields = _fields(model)
  check_overrides(name, overrides)
  if "attention_implementation" in fields:
    implementation = overrides.get("attention_implementation", model.attention_implementation)
    overrides["attention_implementation"] = resolve_implementation(
      implementation, jax.default_backend()
    )
  model = model.clone(**overrides) if overrides else model
  if hasattr(model, "check"):
    model.check()
  return model
