"""The one parser of a config's argument, ``--config=FILE:ARG`` (``get_config(ARG)``).

ARG is comma-separated fields, by position (``cifar10,impulse3``) or by name
(``gpsa=6,alpha=2``); a missing or empty field takes its default (``,impulse5``). A config
declares its fields once, as a module-level ``ARGS`` of ``Field``s (default, choices), which
``parse`` checks and ``python -m locvit.main --list_configs`` prints
(``structinit_datasets:{cifar10,cifar100,svhn,imagenet},{trunc_normal,...}``). Every error names
the config file, the bad argument and what is valid::

  ARGS = {"dataset": Field("cifar10", DATASETS), "init": Field("impulse3", INITS)}
  dataset, init = parse(__file__, arg, ARGS).values()
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Collection, Mapping
from typing import Any, NamedTuple


class Field(NamedTuple):
  """One field of a config's argument: its default and, if not any value of the default's type,
  its choices; ``what`` names the field in errors (default: its key)."""

  default: Any
  choices: Collection[Any] | None = None
  what: str | None = None


def parse(config_file: str, arg: str | None, defaults: Mapping[str, Any | Field]) -> dict[str, Any]:
  """``{field: value}`` for the fields of ``defaults``, in their order, from ``arg``.

  ``defaults`` maps each field to its default or to a ``Field``. A value given takes the type of
  its field's default (int, float or str); a ``Field``'s choices are checked (``choose``).
  """
  name = os.path.basename(config_file)
  specs = {k: v if isinstance(v, Field) else Field(v) for k, v in defaults.items()}
  defaults = {k: spec.default for k, spec in specs.items()}
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
  for key, spec in specs.items():
    if spec.choices is not None:
      choose(config_file, spec.what or key, values[key], spec.choices)
  return values


def usage(
  fields: Mapping[str, Any | Field], pairs: Mapping[str, Collection[str]] | None = None
) -> str:
  """The argument's form as ``--list_configs`` prints it: ``{a,b},{c,d}`` for fields with
  choices, ``name=INT`` / ``name=FLOAT`` / ``name=TEXT`` for the others; ``pairs`` (a config's
  ``PAIRS``: ``{'dataset,size': ['cifar10,d9', ...]}``), the only combinations of some fields that
  run, follow in parentheses."""
  parts = []
  for key, spec in fields.items():
    spec = spec if isinstance(spec, Field) else Field(spec)
    if spec.choices is not None:
      parts.append("{" + ",".join(str(choice) for choice in spec.choices) + "}")
    else:
      kind = {int: "INT", float: "FLOAT"}.get(type(spec.default), "TEXT")
      parts.append(f"{key}={kind}")
  only = "; ".join(f"{what}: only {' | '.join(valid)}" for what, valid in (pairs or {}).items())
  return ",".join(parts) + (f" ({only})" if only else "")


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
