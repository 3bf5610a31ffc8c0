"""Data configuration: defaults and validation.

`default_data_config()` (plain data, ``locvit.configs.defaults.data_config``) is meant to be
attached to a top-level config as `config.data`. Every
consumer calls `validate_data_config` first, so a typo in a field value fails at start-up with a
message naming the field, the bad value and the valid choices instead of deep inside a worker.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Sequence
from typing import Any

from locvit.choices import Errors, check_choice
from locvit.configs import datasets
from locvit.configs.defaults import data_config as default_data_config
from locvit.configs.defaults import with_defaults
from locvit.data import augment, autoaugment

SOURCES = ("digits", "image_folder", "tfds")
ON_CORRUPT = ("error", "skip")
INTERPOLATIONS = ("bicubic", "bilinear")
AUGMENT_ON = ("device", "host")
TRAIN_SPLIT_ON = ("device", "host")


def check_train_split_on_device(cfg: Any) -> None:
  """``data.train_split_on='device'`` needs host ops that draw nothing (applied once, at load)."""
  if cfg.train_split_on != "device":
    return
  random_ops = [op for op in augment.split_train_ops(cfg)[0] if op not in augment.DETERMINISTIC_OPS]
  if random_ops:
    hint = (
      "set data.augment_on='device' to run them in the train step"
      if cfg.augment_on == "host" and all(op in augment.DEVICE_OPS for op in random_ops)
      else "set data.train_split_on='host'"
    )
    raise ValueError(
      f"data.train_split_on='device' sends the step decoded images, but the host ops "
      f"{', '.join(random_ops)} of data.train_augment={cfg.train_augment!r} draw new values each "
      f"epoch; {hint}"
    )


def _choice(cfg: Any, field: str, choices: Sequence[str]) -> None:
  check_choice(f"data.{field}", cfg[field], sorted(choices))


def _number(cfg: Any, field: str, *, lo: float, hi: float, lo_open: bool, integer: bool) -> None:
  value = cfg[field]
  kind = numbers.Integral if integer else numbers.Real
  ok = isinstance(value, kind) and not isinstance(value, bool)
  if ok:
    ok = (value > lo if lo_open else value >= lo) and value <= hi
  if not ok:
    lo_b = "(" if lo_open else "["
    what = "an integer" if integer else "a number"
    raise ValueError(f"data.{field}={value!r} must be {what} in {lo_b}{lo}, {hi}]")


SPLIT_FORMS = "NAME or NAME[START:STOP] with integers or percentages (test[:500], train[:90%])"
_SPLIT = re.compile(r"(?P<name>[^\[\]]+)(?:\[(?P<start>-?\d+%?)?:(?P<stop>-?\d+%?)?\])?")


def parse_split(split: str) -> tuple[str, str | None, str | None]:
  """``'train[10%:]'`` -> ``('train', '10%', None)``: the split folder and the slice's bounds, as
  TFDS writes them. Raises ValueError naming the valid forms."""
  match = _SPLIT.fullmatch(split.strip())
  if not match:
    raise ValueError(f"split {split!r} is not {SPLIT_FORMS}")
  return match["name"], match["start"], match["stop"]


def _folder_split(cfg: Any, field: str) -> None:
  try:
    parse_split(cfg[field])
  except ValueError:
    raise ValueError(
      f"data.{field}={cfg[field]!r} is not a split of an image folder: {SPLIT_FORMS}"
    ) from None


def _pair(cfg: Any, field: str, *, lo: float, hi: float) -> None:
  value = cfg[field]
  try:
    a, b = (float(v) for v in value)
    ok = lo < a <= b <= hi
  except (TypeError, ValueError):
    ok = False
  if not ok:
    raise ValueError(f"data.{field}={value!r} must be a pair (a, b) with {lo} < a <= b <= {hi}")


def checked_data_config(cfg: Any) -> Any:
  """``cfg`` completed with ``default_data_config()``'s fields it lacks (an older run's
  config.json), then validated; the data entry points read fields of the result directly."""
  cfg = with_defaults(cfg, default_data_config())
  validate_data_config(cfg)
  return cfg


def validate_data_config(cfg: Any) -> None:
  """Raises ValueError naming each bad field (a line each), the bad value and the valid
  choices/range; a field ``cfg`` lacks takes its default (``checked_data_config``)."""
  cfg = with_defaults(cfg, default_data_config())
  errors = Errors()
  for field, choices in [
    ("source", SOURCES),
    ("on_corrupt", ON_CORRUPT),
    ("interpolation", INTERPOLATIONS),
    ("train_augment", augment.list_recipes()),
    ("augment_on", AUGMENT_ON),
    ("train_split_on", TRAIN_SPLIT_ON),
  ]:
    errors.check(_choice, cfg, field, choices)
  if cfg.train_augment in augment.list_recipes() and cfg.augment_on in AUGMENT_ON:
    errors.check(augment.split_train_ops, cfg)  # Raises when 'device' moves nothing.
    errors.check(check_train_split_on_device, cfg)
  if cfg.source == "tfds" and (not isinstance(cfg.name, str) or not cfg.name):
    errors.add(f"data.name={cfg.name!r} must be a TFDS dataset name when source='tfds'")
  if cfg.source == "image_folder" and not cfg.root:
    errors.add(
      f"data.root={cfg.root!r} must be set when source='image_folder': "
      + datasets.missing_root_hint(cfg.name)
    )
  for field in ("train_split", "eval_split"):
    if not isinstance(cfg[field], str) or not cfg[field]:
      errors.add(f"data.{field}={cfg[field]!r} must be a non-empty split name")
    elif cfg.source == "image_folder":
      errors.check(_folder_split, cfg, field)
  integer, fraction = dict(lo_open=False, integer=True), dict(lo_open=True, integer=False)
  numbers = [
    ("image_size", dict(lo=1, hi=1 << 16, **integer)),
    ("num_classes", dict(lo=1, hi=1 << 31, **integer)),
    ("train_fraction", dict(lo=0.0, hi=1.0, **fraction)),
    ("class_limit", dict(lo=1, hi=1 << 31, **integer)),
    ("auto_augment_fill", dict(lo=0, hi=255, **integer)),
    ("repeated_augmentations", dict(lo=1, hi=1 << 16, **integer)),
    ("crop_padding", dict(lo=0, hi=1 << 16, **integer)),
    ("eval_crop_pct", dict(lo=0.0, hi=1.0, **fraction)),
    ("decoded_cache_mb", dict(lo=0, hi=1 << 40, lo_open=False, integer=False)),
    ("num_threads", dict(lo=0, hi=1024, **integer)),
    ("num_workers", dict(lo=0, hi=1024, **integer)),
    ("prefetch", dict(lo=0, hi=1 << 20, **integer)),
  ]
  if isinstance(cfg.image_size, int):
    numbers.append(("rrc_canvas", dict(lo=cfg.image_size, hi=1 << 16, **integer)))
  optional = ("num_classes", "class_limit", "auto_augment_fill", "rrc_canvas")  # None: not set
  for field, bounds in numbers:
    if cfg[field] is not None or field not in optional:
      errors.check(_number, cfg, field, **bounds)
  for field, bounds in (
    ("rrc_scale", dict(lo=0.0, hi=1.0)),
    ("rrc_ratio", dict(lo=0.0, hi=math.inf)),
  ):
    errors.check(_pair, cfg, field, **bounds)
  errors.check(autoaugment.check_auto_augment, cfg.auto_augment)
  mean, std = tuple(cfg.mean), tuple(cfg.std)
  if not mean or len(mean) != len(std):
    errors.add(f"data.mean={mean!r} and data.std={std!r} must be tuples of equal length")
  if any(s <= 0 for s in std):
    errors.add(f"data.std={std!r} must be positive")
  errors.raise_all()
