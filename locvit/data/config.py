"""Data configuration: defaults and validation.

`default_data_config()` (plain data, ``locvit.configs.defaults.data_config``) is meant to be
attached to a top-level config as `config.data`. Every
consumer calls `validate_data_config` first, so a typo in a field value fails at start-up with a
message naming the field, the bad value and the valid choices instead of deep inside a worker.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

from locvit.choices import check_choice

# Plain data beside the shipped configs (which must not import JAX); the library names stay.
from locvit.configs.defaults import (  # noqa: F401
  CIFAR10_MEAN,
  CIFAR10_STD,
  IMAGENET_MEAN,
  IMAGENET_STD,
  with_defaults,
)
from locvit.configs.defaults import data_config as default_data_config
from locvit.data import augment, autoaugment

SOURCES = ("digits", "image_folder", "tfds")
ON_CORRUPT = ("error", "skip")
INTERPOLATIONS = ("bicubic", "bilinear")
AUGMENT_ON = ("device", "host")


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
  """Raises ValueError naming the field, the bad value and the valid choices/range; a field
  ``cfg`` lacks takes its default (``checked_data_config``)."""
  cfg = with_defaults(cfg, default_data_config())
  _choice(cfg, "source", SOURCES)
  _choice(cfg, "on_corrupt", ON_CORRUPT)
  _choice(cfg, "interpolation", INTERPOLATIONS)
  _choice(cfg, "train_augment", augment.list_recipes())
  _choice(cfg, "augment_on", AUGMENT_ON)
  augment.split_train_ops(cfg)  # Raises when 'device' moves nothing.
  if cfg.source == "tfds" and (not isinstance(cfg.name, str) or not cfg.name):
    raise ValueError(f"data.name={cfg.name!r} must be a TFDS dataset name when source='tfds'")
  if cfg.source == "image_folder" and not cfg.root:
    raise ValueError(
      f"data.root={cfg.root!r} must be set when source='image_folder': the CIFAR-10 configs read "
      "$CIFAR10_ROOT (or give --config.data.root=DIR); prepare DIR with "
      "`python -m locvit.data.prepare cifar10 --out=DIR`"
    )
  for field in ("train_split", "eval_split"):
    if not isinstance(cfg[field], str) or not cfg[field]:
      raise ValueError(f"data.{field}={cfg[field]!r} must be a non-empty split name")
  _number(cfg, "image_size", lo=1, hi=1 << 16, lo_open=False, integer=True)
  if cfg.num_classes is not None:
    _number(cfg, "num_classes", lo=1, hi=1 << 31, lo_open=False, integer=True)
  _number(cfg, "train_fraction", lo=0.0, hi=1.0, lo_open=True, integer=False)
  if cfg.class_limit is not None:
    _number(cfg, "class_limit", lo=1, hi=1 << 31, lo_open=False, integer=True)
  autoaugment.validate(cfg.auto_augment)
  if cfg.auto_augment_fill is not None:
    _number(cfg, "auto_augment_fill", lo=0, hi=255, lo_open=False, integer=True)
  _number(cfg, "repeated_augmentations", lo=1, hi=1 << 16, lo_open=False, integer=True)
  _number(cfg, "crop_padding", lo=0, hi=1 << 16, lo_open=False, integer=True)
  _number(cfg, "eval_crop_pct", lo=0.0, hi=1.0, lo_open=True, integer=False)
  _pair(cfg, "rrc_scale", lo=0.0, hi=1.0)
  _pair(cfg, "rrc_ratio", lo=0.0, hi=float("inf"))
  if cfg.rrc_canvas is not None:
    _number(cfg, "rrc_canvas", lo=cfg.image_size, hi=1 << 16, lo_open=False, integer=True)
  _number(cfg, "decoded_cache_mb", lo=0, hi=1 << 40, lo_open=False, integer=False)
  _number(cfg, "num_threads", lo=0, hi=1024, lo_open=False, integer=True)
  _number(cfg, "num_workers", lo=0, hi=1024, lo_open=False, integer=True)
  _number(cfg, "prefetch", lo=0, hi=1 << 20, lo_open=False, integer=True)
  mean, std = tuple(cfg.mean), tuple(cfg.std)
  if not mean or len(mean) != len(std):
    raise ValueError(f"data.mean={mean!r} and data.std={std!r} must be tuples of equal length")
  if any(s <= 0 for s in std):
    raise ValueError(f"data.std={std!r} must be positive")
