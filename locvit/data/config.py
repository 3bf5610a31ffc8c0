"""Data configuration: defaults and validation.

`default_data_config()` is meant to be attached to a top-level config as `config.data`. Every
consumer calls `validate_data_config` first, so a typo in a field value fails at start-up with a
message naming the field, the bad value and the valid choices instead of deep inside a worker.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import ml_collections

from locvit.choices import check_choice
from locvit.data import augment, autoaugment

# ImageNet statistics in [0, 1] units, the usual default for ViT/DeiT/ConViT recipes.
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2023, 0.1994, 0.2010)

SOURCES = ("digits", "image_folder", "tfds")
ON_CORRUPT = ("error", "skip")
INTERPOLATIONS = ("bicubic", "bilinear")
AUGMENT_ON = ("device", "host")


def default_data_config() -> ml_collections.ConfigDict:
  """Returns the default data config (the offline 8x8 digits quickstart, no augmentation).

  CIFAR/ImageNet configs set `source`, `name`/`root`, `image_size`, `train_augment` ('crop_flip'
  or 'rrc_flip') and usually `mean`/`std`.

  Fields:
    source: 'digits' | 'tfds' | 'image_folder'.
    name: TFDS dataset name, used when source == 'tfds'.
    data_dir: TFDS data_dir (None -> TFDS default, ~/tensorflow_datasets or $TFDS_DATA_DIR).
    root: image-folder root laid out as ROOT/{train,test}/<class>/*.{jpg,jpeg,png}.
    train_split, eval_split: split names (TFDS split strings are passed through).
    image_size: final square side fed to the model.
    num_classes: None -> taken from the source.
    train_fraction: keep the first int(n_c * f) train examples of each class (>= 1).
    class_limit: None, or k >= 1: keep only examples with label < k in every split (e.g. the
      first 100 ImageNet classes of ConViT Table 3); the source then has k classes.
    on_corrupt: 'error' | 'skip' for unreadable image files.
    train_augment: a recipe name registered in `locvit.data.augment` ('none', 'crop_flip',
      'rrc_flip', ...).
    auto_augment: None, or a RandAugment / AutoAugment string applied to training images after
      the recipe's ops: 'rand-m9-mstd0.5-inc1' (timm RandAugment), 'autoaug-cifar10',
      'autoaug-svhn', 'autoaug-imagenet' (paper policies, torchvision bins), 'original', 'v0'
      (timm's ImageNet policies); see `locvit.data.autoaugment`.
    auto_augment_fill: None (fill geometric auto_augment ops with round(255 * mean), as timm) or
      an int 0..255 used on every channel (128: timm's op default and the GMM code's).
    repeated_augmentations: k >= 1. Each epoch takes the first ceil(n / k) examples of its
      permutation, each k times with different augmentations; the epoch keeps n examples (DeiT's
      RASampler). 1: off.
    crop_padding, rrc_scale, rrc_ratio, interpolation: augmentation parameters (interpolation is
      also the resampling of auto_augment's geometric ops).
    eval_crop_pct: eval resizes the shorter side to image_size / eval_crop_pct, then centre-crops.
    mean, std: per-channel normalisation in [0, 1] units. A 3-tuple applied to 1-channel images
      is averaged to one value.
    augment_on: 'host' | 'device'. 'device' moves the trailing run of pad-crop, flip and
      auto_augment (RandAugment / AutoAugment, ``locvit.data.device_autoaugment``) into the
      jitted train step (``locvit.data.device_augment``, per-example draws from the step's key);
      the host keeps the ops before them (decode, resize, random-resized crop). The device
      auto_augment ops agree with Pillow's within one grey level per pixel; its random stream
      differs from the host's, its distributions do not. 'host' runs every op on the host,
      timm's exact code path.
    decoded_cache_mb: memory budget (MB per process) for keeping a split's decoded images
      (``locvit.data.decoded``); a larger split keeps streaming. 0: always stream.
    num_threads: threads decoding/augmenting batches (grain ReadOptions.num_threads).
    prefetch: number of batches buffered ahead (grain ReadOptions.prefetch_buffer_size).
  """
  c = ml_collections.ConfigDict()
  c.source = "digits"
  c.name = "cifar10"
  # Typed placeholders (None by default) so `--config.data.root=DIR` works on the command line.
  c.data_dir = ml_collections.config_dict.placeholder(str)
  c.root = ml_collections.config_dict.placeholder(str)
  c.train_split = "train"
  c.eval_split = "test"
  c.image_size = 8
  c.num_classes = ml_collections.config_dict.placeholder(int)
  c.train_fraction = 1.0
  c.class_limit = ml_collections.config_dict.placeholder(int)
  c.on_corrupt = "error"
  c.train_augment = "none"
  c.auto_augment = ml_collections.config_dict.placeholder(str)
  c.auto_augment_fill = ml_collections.config_dict.placeholder(int)
  c.repeated_augmentations = 1
  c.crop_padding = 4
  c.rrc_scale = (0.08, 1.0)
  c.rrc_ratio = (3.0 / 4.0, 4.0 / 3.0)
  c.interpolation = "bicubic"
  c.eval_crop_pct = 1.0
  c.mean = IMAGENET_MEAN
  c.std = IMAGENET_STD
  c.augment_on = "host"
  c.decoded_cache_mb = 4096
  c.num_threads = 4
  c.prefetch = 4
  return c


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


def validate_data_config(cfg: Any) -> None:
  """Raises ValueError naming the field, the bad value and the valid choices/range."""
  _choice(cfg, "source", SOURCES)
  _choice(cfg, "on_corrupt", ON_CORRUPT)
  _choice(cfg, "interpolation", INTERPOLATIONS)
  _choice(cfg, "train_augment", augment.list_recipes())
  if "augment_on" in cfg:  # Older run configs (DIR/config.json) lack the field: 'host'.
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
  if cfg.get("class_limit") is not None:
    _number(cfg, "class_limit", lo=1, hi=1 << 31, lo_open=False, integer=True)
  autoaugment.validate(cfg.get("auto_augment"))
  if cfg.get("auto_augment_fill") is not None:
    _number(cfg, "auto_augment_fill", lo=0, hi=255, lo_open=False, integer=True)
  if "repeated_augmentations" in cfg:
    _number(cfg, "repeated_augmentations", lo=1, hi=1 << 16, lo_open=False, integer=True)
  _number(cfg, "crop_padding", lo=0, hi=1 << 16, lo_open=False, integer=True)
  _number(cfg, "eval_crop_pct", lo=0.0, hi=1.0, lo_open=True, integer=False)
  _pair(cfg, "rrc_scale", lo=0.0, hi=1.0)
  _pair(cfg, "rrc_ratio", lo=0.0, hi=float("inf"))
  if "decoded_cache_mb" in cfg:
    _number(cfg, "decoded_cache_mb", lo=0, hi=1 << 40, lo_open=False, integer=False)
  _number(cfg, "num_threads", lo=0, hi=1024, lo_open=False, integer=True)
  _number(cfg, "prefetch", lo=0, hi=1 << 20, lo_open=False, integer=True)
  mean, std = tuple(cfg.mean), tuple(cfg.std)
  if not mean or len(mean) != len(std):
    raise ValueError(f"data.mean={mean!r} and data.std={std!r} must be tuples of equal length")
  if any(s <= 0 for s in std):
    raise ValueError(f"data.std={std!r} must be positive")
