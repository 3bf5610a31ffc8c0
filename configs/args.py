"""The one parser of a config's argument, ``--config=FILE:ARG`` (``get_config(ARG)``).

ARG is comma-separated fields, by position (``cifar10,impulse3``) or by name
(``gpsa=6,alpha=2``); a missing or empty field takes its default. ``choose`` then checks a value
against the config's choices. Every error names the config file, the bad argument and what is
valid::

  dataset, init = parse(__file__, arg, {"dataset": "cifar10", "init": "impulse3"}).values()
  choose(__file__, "dataset", dataset, DATASETS)
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Collection, Mapping
from typing import Any


def parse(config_file: str, arg: str | None, defaults: Mapping[str, Any]) -> dict[str, Any]:
  """``{field: value}`` for the fields of ``defaults``, in their order, from ``arg``.

  A value given takes the type of its field's default (int, float or str).
  """
  name = os.path.basename(config_file)
  fields = list(defaults)
  values = dict(defaults)
  given = set()
  items = [item.strip() for item in arg.split(",")] if arg else []
  if len(items) > len(fields):
    raise ValueError(
      f"{name} takes at most {len(fields)} comma-separated fields ({','.join(fields)}), got {arg!r}"
    )
  for position, item in enumerate(items):
    key, by_name, text = item.partition("=")
    if by_name:
      key, text = key.strip(), text.strip()
      if key not in defaults:
        raise ValueError(
          f"unknown field {key!r} in {arg!r} for {name}; fields: {', '.join(fields)}"
        )
    else:
      key, text = fields[position], item
    if key in given:
      raise ValueError(f"field {key!r} given twice in {arg!r} for {name}")
    given.add(key)
    if text:
      values[key] = _convert(name, key, text, type(defaults[key]))
  return values


def _convert(name: str, key: str, text: str, kind: type) -> Any:
  if kind not in (int, float):
    return text
  try:
    return kind(text)
  except ValueError:
    raise ValueError(
      f"{key}={text!r} for {name} is not {'an int' if kind is int else 'a number'}"
    ) from None


def choose(config_file: str, what: str, value: Any, choices: Collection[Any]) -> Any:
  """``value`` if it is one of ``choices``; else a ValueError suggesting the closest ones."""
  if value in choices:
    return value
  names = [str(choice) for choice in choices]
  close = difflib.get_close_matches(str(value), names, n=3)
  hint = f"did you mean {' or '.join(close)}? " if close else ""
  raise ValueError(
    f"unknown {what} {value!r} for {os.path.basename(config_file)}; {hint}"
    f"choices: {', '.join(names)}"
  )
