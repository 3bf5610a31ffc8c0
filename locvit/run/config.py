"""A run's config from the command line, the one loader (``locvit.main``, ``locvit.reproduce``
and the ``experiments/`` scripts use it): finding it (a file, a shipped config's ``NAME[:ARGS]``,
a saved ``config.json`` or a workdir holding one: ``resolve_config``), loading it (``load``), the
``--config.*`` overrides (the model's by their type in the model: ``split_model_overrides``),
``--data`` (``with_data``) and its local paths made absolute (``with_absolute_paths``).
``locvit.main`` keeps the flags, the modes and the exits; the checks of the values are
``locvit.run.checks``."""

from __future__ import annotations

import ast
import difflib
import importlib
import importlib.util
import os
import re
from collections.abc import Iterator, Sequence

import ml_collections
from absl import flags
from ml_collections import config_flags

import locvit.configs
from locvit.configs import args as config_args
from locvit.configs import datasets
from locvit.workdir import paths, saved_config

WEIGHTS_CONFIG = "pretrained"  # the shipped config of a command that names only the weights


class ConfigError(ValueError):
  """A mistake on the command line, reported as one line before anything runs."""


# ------------------------------------------------------------------------------------------------
# --config: a file, a shipped config's name, a saved config.json, or the one saved in --workdir


def shipped_configs_dir() -> str:
  """The directory of the configs shipped with locvit (``configs/`` in a checkout)."""
  return next(iter(locvit.configs.__path__))


def shipped_config_names() -> list[str]:
  """The runnable shipped configs (files with a ``get_config``), e.g. ``convit_s``."""
  directory = shipped_configs_dir()
  names = []
  for filename in sorted(os.listdir(directory)):
    if filename.endswith(".py"):
      with open(os.path.join(directory, filename)) as f:
        if re.search(r"^def get_config\(", f.read(), re.MULTILINE):
          names.append(filename[:-3])
  return names


def config_summary(name: str) -> str:
  """The first paragraph of a shipped config's docstring, as one line."""
  with open(os.path.join(shipped_configs_dir(), name + ".py")) as f:
    docstring = ast.get_docstring(ast.parse(f.read())) or ""
  return " ".join(docstring.split("\n\n", 1)[0].split())


def config_usage(name: str) -> str:
  """``NAME`` or ``NAME:ARG`` with the argument's fields and choices (``configs.args.usage``),
  e.g. ``gmm_table2:{vit,swin},{base,gmm}``."""
  module = importlib.import_module(f"locvit.configs.{name}")
  fields, pairs = getattr(module, "ARGS", None), getattr(module, "PAIRS", {})
  return f"{name}:{config_args.usage(fields, pairs)}" if fields else name


def list_configs_text() -> str:
  """``--list_configs``: each shipped config with its argument's choices, then its summary (the
  docstring's first paragraph) on an indented line."""
  return "\n".join(
    f"{config_usage(name)}\n  {config_summary(name)}" for name in shipped_config_names()
  )


def resolve_config(value: str) -> str:
  """The ``--config`` value config_flags should load: ``value`` if it names a file; a shipped
  config's file for ``NAME[:ARG]`` or ``configs/NAME.py[:ARG]`` that is not a file here; the saved
  config loader for a ``config.json`` or a workdir holding one. Raises ``ConfigError`` otherwise."""
  path, sep, arg = value.partition(":")
  if os.path.isdir(path) and os.path.isfile(saved_config.path(path)):
    path = str(saved_config.path(path))  # an epath.Path: no endswith
  if path.endswith(".json") and os.path.isfile(path):
    if sep:
      raise ConfigError(f"--config={value}: a saved config.json takes no ':ARG'")
    return saved_config.config_file_argument(path)
  if os.path.isfile(path):
    return value
  name = os.path.basename(path).removesuffix(".py")
  names = shipped_config_names()
  if name in names:
    return os.path.join(shipped_configs_dir(), name + ".py") + sep + arg
  close = difflib.get_close_matches(name, names, n=3)
  hint = f"did you mean {' or '.join(close)}?" if close else f"shipped configs: {', '.join(names)}"
  raise ConfigError(f"--config={value}: no such file, and no shipped config {name!r}; {hint}")


def flag_values(argv: Sequence[str], name: str) -> Iterator[tuple[int, str | None]]:
  """(index, value) of each ``--name=value`` / ``--name value`` in ``argv``, in order."""
  for i, arg in enumerate(argv):
    match = re.fullmatch(rf"--?{re.escape(name)}(=(.*))?", arg, re.DOTALL)
    if match:
      if match.group(1) is not None:
        yield i, match.group(2)
      else:
        yield i, argv[i + 1] if i + 1 < len(argv) else None


def flag_value(argv: Sequence[str], name: str) -> tuple[int, str | None]:
  """(index, value) of the first ``--name=value`` / ``--name value`` in ``argv``, or (-1,
  None)."""
  return next(flag_values(argv, name), (-1, None))


def resolve_config_argv(argv: Sequence[str]) -> list[str]:
  """``argv`` with ``--config`` resolved (``resolve_config``), or, when absent, set to the config
  saved in ``--workdir``."""
  argv = list(argv)
  index, value = flag_value(argv, "config")
  if value is not None:
    resolved = resolve_config(value)
    if argv[index].startswith(("--config=", "-config=")):
      argv[index] = f"--config={resolved}"
    else:
      argv[index + 1] = resolved
    return argv
  _, workdir = flag_value(argv, "workdir")
  if workdir is None:
    return argv  # absl reports the missing --workdir
  saved = saved_config.path(workdir)
  if not saved.is_file() and any(flag_values(argv, "config.init_from.weights")):
    return [argv[0], f"--config={resolve_config(WEIGHTS_CONFIG)}", *argv[1:]]
  if not saved.is_file():
    raise ConfigError(f"no --config given and {saved} does not exist (no run saved its config)")
  return [argv[0], f"--config={saved_config.config_file_argument(saved)}", *argv[1:]]


def _config_as_loaded(argv: Sequence[str]) -> ml_collections.ConfigDict | None:
  """The resolved ``--config`` as config_flags loads it, before the overrides; None if it fails
  (config_flags then reports the config's own error)."""
  _, value = flag_value(argv, "config")
  if value is None:
    return None
  try:
    return _load_resolved(value)
  except Exception:
    return None


def load(value: str) -> ml_collections.ConfigDict:
  """The config ``value`` names (``resolve_config``: a file, a shipped config's ``NAME[:ARG]``, a
  saved ``config.json`` or a workdir holding one), as config_flags loads it: ``get_config(ARG)``,
  no overrides; its local paths absolute (``with_absolute_paths``). A name that finds nothing
  raises ``ConfigError``."""
  return with_absolute_paths(_load_resolved(resolve_config(value)))


def _load_resolved(value: str) -> ml_collections.ConfigDict:
  """``get_config(ARG)`` of the file of a resolved ``--config`` value, ``FILE[:ARG]``."""
  path, _, arg = value.partition(":")
  spec = importlib.util.spec_from_file_location("locvit_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(*([arg] if arg else []))


# --config.model.overrides.FIELD[=VALUE] and --noconfig.model.overrides.FIELD (a bool's False)
_MODEL_OVERRIDE = re.compile(r"--?(no)?config\.model\.overrides\.(\w+)(?:=(.*))?", re.DOTALL)


def _model_name(argv: Sequence[str], config: ml_collections.ConfigDict) -> str:
  """The model ``argv`` runs: its last ``--config.model.name``, else the config's."""
  values = [value for _, value in flag_values(argv, "config.model.name") if value is not None]
  return values[-1] if values else config.model.name


def split_model_overrides(argv: Sequence[str]) -> tuple[list[str], dict[str, object]]:
  """(``argv`` less its ``--config.model.overrides.FIELD`` flags, {FIELD: value}): config_flags
  overrides only the fields a config has, and reads a value by the type of the config's, so every
  model field is read here by its type in the model (``registry.parse_override``: ``false`` is
  False). As absl's flags: ``=VALUE`` or the next argument, a bool bare (True) or with the prefix
  ``no`` (False). A name or value the model does not take raises ``ConfigError``. ``argv`` stays
  whole if the config does not load (config_flags then reports why)."""
  if not any(_MODEL_OVERRIDE.fullmatch(arg) for arg in argv):
    return list(argv), {}
  config = _config_as_loaded(argv)  # once, not per flag
  if config is None:
    return list(argv), {}
  from locvit.models import registry  # the model stack: only for a command line that needs it

  name = _model_name(argv, config)
  kept, added = [], {}
  rest = iter(argv)
  for arg in rest:
    match = _MODEL_OVERRIDE.fullmatch(arg)
    if arg == "--":  # absl's end of flags
      return [*kept, arg, *rest], added
    if not match:
      kept.append(arg)
      continue
    negated, field, text = match.groups()
    try:
      if text is None and registry.boolean_override(name, field):
        text = "false" if negated else "true"
      elif negated or text is None:
        registry.check_overrides(name, [field])  # a field the model lacks: that line first
        if negated:
          raise ConfigError(f"{arg}: the prefix 'no' is for bool fields; {field} is not one")
        text = next(rest, None)
        if text is None:
          raise ConfigError(f"{arg}: needs a value ({arg}=VALUE)")
      added[field] = registry.parse_override(name, field, text)
    except ValueError as e:
      raise ConfigError(str(e)) from None
  return kept, added


def command_line_config(argv: Sequence[str]) -> ml_collections.ConfigDict:
  """The config ``python -m locvit.main ARGV...`` runs (``argv[0]`` the program), as ``the_config``
  gives it: flagfiles read, ``--config`` resolved, overrides and ``--data`` applied, local paths
  absolute (``with_absolute_paths``); flags other than ``--config*`` and ``--data`` are ignored.
  Unchecked (``check_config``); nothing created."""
  argv, added = config_argv(argv)
  values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", flag_values=values, sys_argv=argv, lock_config=True)
  values(argv, known_only=True)
  config = with_data(add_model_overrides(values.config, added), flag_value(argv, "data")[1])
  return with_absolute_paths(config)


def explain_override(argv: Sequence[str]) -> str | None:
  """The first ``--config.A.B=V`` naming a field the config lacks, as a one-line message."""
  config = _config_as_loaded(argv)
  if config is None:
    return None
  for flag in argv:
    match = re.fullmatch(r"--?config\.([\w.]+)(=.*)?", flag)
    if not match:
      continue
    node, parts = config, match.group(1).split(".")
    for depth, part in enumerate(parts):
      where = ".".join(["config", *parts[:depth]])
      if not isinstance(node, ml_collections.ConfigDict):
        return f"{flag}: {where} is not a config block"
      if part not in node:
        close = difflib.get_close_matches(part, list(node), n=3)
        hint = f"did you mean {' or '.join(close)}?" if close else f"fields: {', '.join(node)}"
        return f"{flag}: {where} has no field {part!r}; {hint}"
      node = node[part]
  return None


def config_argv(argv: Sequence[str]) -> tuple[list[str], dict[str, object]]:
  """(``argv`` with its flagfiles read and ``--config`` resolved, less the model overrides; the
  model overrides: ``split_model_overrides``)."""
  argv = flags.FLAGS.read_flags_from_files(argv, force_gnu=False)  # as config_flags reads them
  return split_model_overrides(resolve_config_argv(argv))


def add_model_overrides(
  config: ml_collections.ConfigDict, added: dict[str, object]
) -> ml_collections.ConfigDict:
  """``config`` (changed in place) with the fields ``added`` in its ``model.overrides``."""
  if added:
    with config.unlocked():
      config.model.overrides = {**(config.model.overrides or {}), **added}
  return config


def with_data(config: ml_collections.ConfigDict, data: str | None) -> ml_collections.ConfigDict:
  """``config`` reading its data as ``--data`` says, if given."""
  if data is None:
    return config
  try:
    return datasets.apply_data_flag(config, data)
  except ValueError as e:
    raise ConfigError(str(e)) from None


# Local paths that a run's saved config.json must find from any directory (eval, analyze, a
# resume): however given (--data, an override such as --config.data.root=mine/c10, $CIFAR10_ROOT
# read by a config), they are saved absolute.
PATH_FIELDS = (
  ("data", "root"),
  ("data", "data_dir"),
  ("init_from", "workdir"),
  ("distillation", "teacher_workdir"),
)


def with_absolute_paths(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """``config`` with its data folders (``data.root``, ``data.data_dir``), teacher and init
  workdirs and local weights file made absolute against the working directory (in place), so the
  saved ``config.json`` finds them from any directory; bucket URLs (``gs://...``) and hub names
  unchanged.

  The one place a config's paths are made absolute: the configs and ``--data``
  (``configs/datasets.py``) keep a path as given, and the loader applies this at launch
  (``locvit.main``'s config, ``command_line_config``, ``load``, the reproduce plans)."""
  for block, field in PATH_FIELDS:
    if config.get(block) is not None and config[block].get(field):
      config[block][field] = _absolute(config[block][field])
  weights = config.init_from.get("weights") if config.get("init_from") is not None else None
  if weights and os.path.exists(weights):  # a local file; a hub name stays as it is
    config.init_from.weights = _absolute(weights)
  return config


def _absolute(path: str) -> str:
  return path if paths.is_object_store(path) else os.path.abspath(path)
