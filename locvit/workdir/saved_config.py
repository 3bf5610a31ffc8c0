"""The resolved config a run keeps in its workdir: ``DIR/config.json``.

Written at the start of every training run (process 0, atomically): the full config as readable
JSON, the command line that started the run, the types JSON cannot hold (tuples, typed
``None`` placeholders) and the fields that refer to the seed (``references``: a config's
``c.init.seed = c.get_ref('seed')``, which JSON would save as the value it had), so that reading
it back gives the same ``ConfigDict``, command-line overrides included, and a changed seed moves
those fields as it does in the original config (``--config.seed``, the seeds of a side-by-side
run). ``--mode=eval`` and ``--mode=analyze`` with only ``--workdir`` use it; so does a restart.
A ``config.json`` written before ``references`` existed reads as before, its values plain.

This file is also an ml-collections config file: ``get_config('DIR/config.json')`` is what the CLI
runs for ``--config=DIR/config.json`` (config_flags loads config files by path), so overrides on
the command line apply to a saved config as to any other.
"""

from __future__ import annotations

import copy
import json
import os
import shlex
import sys
from collections.abc import Sequence
from typing import Any

import ml_collections
from etils import epath

from locvit.workdir import paths

FILENAME = "config.json"
_TYPES = {"bool": bool, "int": int, "float": float, "str": str}


def path(workdir: str) -> epath.Path:
  """``DIR/config.json``."""
  return paths.path(workdir) / FILENAME


def _lost_types(config: ml_collections.ConfigDict, prefix: str = "") -> dict[str, str]:
  """Dotted field -> 'tuple' or the scalar type of a ``None`` placeholder: what JSON drops."""
  types = {}
  for key in config:
    value, name = config[key], f"{prefix}{key}"
    if isinstance(value, ml_collections.ConfigDict):
      types.update(_lost_types(value, name + "."))
    elif isinstance(value, tuple):
      types[name] = "tuple"
    elif value is None and config.get_type(key).__name__ in _TYPES:
      types[name] = config.get_type(key).__name__
  return types


def leaves(config: ml_collections.ConfigDict, prefix: str = "") -> dict[str, Any]:
  """Dotted field -> value of every field of ``config`` that is not a block (references
  resolved)."""
  out = {}
  for key in config:
    value, name = config[key], f"{prefix}{key}"
    if isinstance(value, ml_collections.ConfigDict):
      out.update(leaves(value, name + "."))
    else:
      out[name] = value
  return out


def seed_references(config: ml_collections.ConfigDict) -> dict[str, str]:
  """Dotted field -> ``'seed'`` for each field that refers to ``config.seed``: the fields that
  move to the seed's new value when the seed of a copy moves (ml-collections does not say what a
  reference refers to). A field computed from the seed (``get_ref('seed') + 1``) is no reference
  to it and keeps its value (``locvit.run.seeds`` refuses such a field side by side)."""
  seed = config.get("seed")
  if type(seed) is not int:
    return {}
  moved = copy.deepcopy(config)
  moved.seed = seed + 1
  before, after = leaves(config), leaves(moved)
  return {
    name: "seed"
    for name, value in after.items()
    if name != "seed" and (before[name], value) == (seed, seed + 1)
  }


def write(workdir: str, config: ml_collections.ConfigDict, argv: Sequence[str] | None = None):
  """Writes ``DIR/config.json`` atomically (a temporary file renamed over it); ``argv`` defaults to
  the command line that started this process."""
  paths.write_atomically(path(workdir), json.dumps(record(config, argv), indent=2) + "\n")


def record(config: ml_collections.ConfigDict, argv: Sequence[str] | None = None) -> dict[str, Any]:
  """What ``DIR/config.json`` holds for ``config``: the command (``argv``, default this process's
  command line), the config as JSON, the types JSON drops and the fields that refer to the seed
  (``from_record`` restores both)."""
  argv = list(sys.orig_argv if argv is None else argv)
  return {
    "command": shlex.join(argv),
    "config": json.loads(config.to_json_best_effort()),
    "types": _lost_types(config),
    "references": seed_references(config),
  }


def _as_tuple(value: list) -> tuple:
  return tuple(_as_tuple(v) if isinstance(v, list) else v for v in value)


def _restore_types(
  tree: dict[str, Any], types: dict[str, str], references: dict[str, str], prefix: str = ""
) -> dict:
  """``tree`` with its tuples and typed ``None`` placeholders back, and a placeholder of its
  value's type at each field in ``references`` (a field, not a shared reference: overriding it
  then leaves the field it refers to as it is, as in the original config)."""
  out = {}
  for key, value in tree.items():
    name = f"{prefix}{key}"
    if isinstance(value, dict):
      value = _restore_types(value, types, references, name + ".")
    elif types.get(name) == "tuple":
      value = _as_tuple(value)
    elif value is None and name in types:
      value = ml_collections.config_dict.placeholder(_TYPES[types[name]])
    elif name in references:
      value = ml_collections.config_dict.placeholder(type(value))
    out[key] = value
  return out


def _field(config: ml_collections.ConfigDict, dotted: str) -> tuple[ml_collections.ConfigDict, str]:
  """(the block holding the field ``dotted``, its name in that block)."""
  *blocks, key = dotted.split(".")
  for block in blocks:
    config = config[block]
  return config, key


def from_record(record: dict[str, Any]) -> ml_collections.ConfigDict:
  """The ``ConfigDict`` a ``record`` describes: its types restored, and each of its
  ``references`` a reference again (absent in an older ``config.json``: plain values)."""
  references = record.get("references", {})
  config = ml_collections.ConfigDict(
    _restore_types(record["config"], record.get("types", {}), references)
  )
  for name, target in references.items():
    block, key = _field(config, name)
    target_block, target_key = _field(config, target)
    block[key] = target_block.get_ref(target_key)
  return config


def read(config_path: str) -> ml_collections.ConfigDict:
  """The ``ConfigDict`` saved in ``config_path`` (a ``config.json``), with its types and its
  references to the seed restored (``from_record``)."""
  try:
    return from_record(json.loads(epath.Path(config_path).read_text()))
  except (ValueError, KeyError, TypeError) as e:  # a damaged or foreign file
    raise ValueError(
      f"{config_path} is not a readable run config ({type(e).__name__}: {e}); restore it, or "
      "give --config=FILE"
    ) from None


def get_config(config_path: str) -> ml_collections.ConfigDict:
  """ml-collections entry point: ``--config=locvit/workdir/saved_config.py:DIR/config.json``."""
  return read(config_path)


def config_file_argument(config_path: str | os.PathLike) -> str:
  """The ``--config`` value config_flags loads ``config_path`` (a ``config.json``) with: this file,
  whose ``get_config`` reads it. It imports no JAX, so loading it as a config file stays light."""
  return f"{os.path.abspath(__file__)}:{config_path}"
