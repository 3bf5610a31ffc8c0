"""The resolved config a run keeps in its workdir: ``DIR/config.json``.

Written at the start of every training run (process 0, atomically): the full config as readable
JSON, the command line that started the run, and the types JSON cannot hold (tuples, typed
``None`` placeholders), so that reading it back gives the same ``ConfigDict``, command-line
overrides included. ``--mode=eval`` and ``--mode=analyze`` with only ``--workdir`` use it.

This file is also an ml-collections config file: ``get_config('DIR/config.json')`` is what the CLI
runs for ``--config=DIR/config.json`` (config_flags loads config files by path), so overrides on
the command line apply to a saved config as to any other.
"""

from __future__ import annotations

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


def write(workdir: str, config: ml_collections.ConfigDict, argv: Sequence[str] | None = None):
  """Writes ``DIR/config.json`` atomically (a temporary file renamed over it); ``argv`` defaults to
  the command line that started this process."""
  paths.write_atomically(path(workdir), json.dumps(record(config, argv), indent=2) + "\n")


def record(config: ml_collections.ConfigDict, argv: Sequence[str] | None = None) -> dict[str, Any]:
  """What ``DIR/config.json`` holds for ``config``: the command (``argv``, default this process's
  command line), the config as JSON and the types JSON drops (``read`` restores them)."""
  argv = list(sys.orig_argv if argv is None else argv)
  return {
    "command": shlex.join(argv),
    "config": json.loads(config.to_json_best_effort()),
    "types": _lost_types(config),
  }


def _as_tuple(value: list) -> tuple:
  return tuple(_as_tuple(v) if isinstance(v, list) else v for v in value)


def _restore_types(tree: dict[str, Any], types: dict[str, str], prefix: str = "") -> dict:
  out = {}
  for key, value in tree.items():
    name = f"{prefix}{key}"
    if isinstance(value, dict):
      value = _restore_types(value, types, name + ".")
    elif types.get(name) == "tuple":
      value = _as_tuple(value)
    elif value is None and name in types:
      value = ml_collections.config_dict.placeholder(_TYPES[types[name]])
    out[key] = value
  return out


def read(config_path: str) -> ml_collections.ConfigDict:
  """The ``ConfigDict`` saved in ``config_path`` (a ``config.json``), with its types restored."""
  try:
    record = json.loads(epath.Path(config_path).read_text())
    config = record["config"]
  except (ValueError, KeyError, TypeError) as e:  # a damaged or foreign file
    raise ValueError(
      f"{config_path} is not a readable run config ({type(e).__name__}: {e}); restore it, or "
      "give --config=FILE"
    ) from None
  return ml_collections.ConfigDict(_restore_types(config, record.get("types", {})))


def get_config(config_path: str) -> ml_collections.ConfigDict:
  """ml-collections entry point: ``--config=locvit/workdir/saved_config.py:DIR/config.json``."""
  return read(config_path)


def config_file_argument(config_path: str | os.PathLike) -> str:
  """The ``--config`` value config_flags loads ``config_path`` (a ``config.json``) with: this file,
  whose ``get_config`` reads it. It imports no JAX, so loading it as a config file stays light."""
  return f"{os.path.abspath(__file__)}:{config_path}"
