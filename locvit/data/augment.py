"""Per-example NumPy augmentation ops and a registry of named ops and recipes.

Every op maps a uint8 HWC image and an `np.random.Generator` to a uint8 HWC image, so the result is
deterministic given the generator. Images stay uint8 on the host; the jitted train and eval steps
normalise the batch on the device (`device_augment.normalize`, with `normalization_constants`),
which keeps per-example host work, memory and transfers small.

Extending: register an op factory with `@register_op("name")` (it receives the data config and
returns `fn(image, rng) -> image`), then a recipe with `register_recipe("name", ["op", ...])`.
`data.train_augment` names a recipe. `data.auto_augment` (RandAugment / AutoAugment, see
`locvit.data.autoaugment`, which registers it on import of `locvit.data`) is the op
"auto_augment", appended after the recipe's ops (after the crop and flip, as timm orders them)
unless the recipe already lists it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from PIL import Image

Op = Callable[[np.ndarray, np.random.Generator], np.ndarray]
OpFactory = Callable[[Any], Op]

_RESAMPLE = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC}


# ----------------------------------------------------------------------------- primitive ops


def to_pil(image: np.ndarray) -> Image.Image:
  """uint8 HWC (C = 1 or 3) -> PIL image (mode "L" or "RGB")."""
  if image.ndim == 3 and image.shape[2] == 1:
    image = image[:, :, 0]  # 2-D uint8 -> mode "L".
  return Image.fromarray(np.ascontiguousarray(image))


def from_pil(img: Image.Image, channels: int) -> np.ndarray:
  """PIL image -> uint8 HWC with `channels` channels (restores the axis of 1-channel images)."""
  out = np.asarray(img, dtype=np.uint8)
  return out[:, :, None] if channels == 1 and out.ndim == 2 else out


def resize(
  image: np.ndarray,
  size: tuple[int, int],
  interpolation: str = "bilinear",
  box: tuple[float, float, float, float] | None = None,
) -> np.ndarray:
  """Resizes (optionally the sub-`box` (x0, y0, x1, y1) of) `image` to `size` = (h, w) with PIL."""
  h, w = size
  if box is None and image.shape[:2] == (h, w):
    return image
  img = to_pil(image).resize((w, h), resample=_RESAMPLE[interpolation], box=box)
  return from_pil(img, image.shape[2])


def random_crop_with_padding(
  image: np.ndarray, rng: np.random.Generator, size: int, padding: int
) -> np.ndarray:
  """Zero-pads by `padding` on each side, then takes a random `size` x `size` window.

  Equivalent to slicing `np.pad(image, padding)`, but copies only the overlap into a zero
  canvas (np.pad costs more than the rest of the CIFAR recipe together).
  """
  h, w = image.shape[:2]
  ph, pw = h + 2 * padding, w + 2 * padding
  if ph < size or pw < size:
    raise ValueError(f"cannot crop {size}x{size} from a padded {ph}x{pw} image")
  top = int(rng.integers(0, ph - size + 1)) - padding  # Window origin in image coordinates.
  left = int(rng.integers(0, pw - size + 1)) - padding
  if top == 0 and left == 0 and h == w == size:
    return image
  out = np.zeros((size, size, image.shape[2]), image.dtype)
  y0, y1 = max(top, 0), min(top + size, h)
  x0, x1 = max(left, 0), min(left + size, w)
  if y1 > y0 and x1 > x0:  # The window can miss the image entirely when padding > size.
    out[y0 - top : y1 - top, x0 - left : x1 - left] = image[y0:y1, x0:x1]
  return out


def horizontal_flip(image: np.ndarray, rng: np.random.Generator, p: float = 0.5) -> np.ndarray:
  """Mirrors the width axis with probability `p`."""
  if rng.random() < p:
    return image[:, ::-1]
  return image


def random_resized_crop(
  image: np.ndarray,
  rng: np.random.Generator,
  size: int,
  scale: Sequence[float] = (0.08, 1.0),
  ratio: Sequence[float] = (3.0 / 4.0, 4.0 / 3.0),
  interpolation: str = "bicubic",
  attempts: int = 10,
) -> np.ndarray:
  """Inception-style random resized crop, as torchvision's ``RandomResizedCrop`` (timm's) does
  it: the box of `random_resized_crop_box` is cut out, then resized to `size` x `size`, so the
  filter never reads past the box."""
  x0, y0, x1, y1 = random_resized_crop_box(
    image.shape[0], image.shape[1], rng, scale, ratio, attempts
  )
  return resize(image[y0:y1, x0:x1], (size, size), interpolation)


def random_resized_crop_box(
  height: int,
  width: int,
  rng: np.random.Generator,
  scale: Sequence[float] = (0.08, 1.0),
  ratio: Sequence[float] = (3.0 / 4.0, 4.0 / 3.0),
  attempts: int = 10,
) -> tuple[int, int, int, int]:
  """The crop box (x0, y0, x1, y1) of a random resized crop of a `height` x `width` image.

  Samples an area fraction in `scale` and a log-uniform aspect ratio in `ratio`; after
  `attempts` failures falls back to a centre crop clamped to `ratio`. It needs only the image's
  size, so it can be drawn before decoding (from a JPEG's header).
  """
  h, w = height, width
  area = h * w
  log_ratio = (np.log(ratio[0]), np.log(ratio[1]))
  for _ in range(attempts):
    target_area = area * rng.uniform(scale[0], scale[1])
    aspect = float(np.exp(rng.uniform(*log_ratio)))
    cw = round(np.sqrt(target_area * aspect))
    ch = round(np.sqrt(target_area / aspect))
    if 0 < cw <= w and 0 < ch <= h:
      top = int(rng.integers(0, h - ch + 1))
      left = int(rng.integers(0, w - cw + 1))
      break
  else:
    in_ratio = w / h
    if in_ratio < ratio[0]:
      cw, ch = w, round(w / ratio[0])
    elif in_ratio > ratio[1]:
      ch, cw = h, round(h * ratio[1])
    else:
      cw, ch = w, h
    top, left = (h - ch) // 2, (w - cw) // 2
  return left, top, left + cw, top + ch


def resize_center_crop(
  image: np.ndarray, size: int, crop_pct: float = 1.0, interpolation: str = "bicubic"
) -> np.ndarray:
  """Eval transform: shorter side -> floor(size / crop_pct), then centre crop `size` x `size`.

  timm's ``create_transform(is_training=False)`` pixel for pixel: torchvision's ``Resize(short)``
  (the longer side ``int(short * long / shorter)``, truncated) and ``CenterCrop(size)`` (the
  offset ``round((n - size) / 2)``, halves to even). With crop_pct == 1 and a square input this is
  a plain resize (a no-op at the right size).
  """
  h, w = image.shape[:2]
  short = math.floor(size / crop_pct)
  if h <= w:
    nh, nw = short, int(short * w / h)
  else:
    nh, nw = int(short * h / w), short
  image = resize(image, (nh, nw), interpolation)
  top, left = round((nh - size) / 2), round((nw - size) / 2)
  return image[top : top + size, left : left + size]


def normalization_constants(
  mean: Sequence[float], std: Sequence[float], channels: int
) -> tuple[np.ndarray, np.ndarray]:
  """float32 ``(scale, offset)`` per channel: ``x * scale - offset = (x / 255 - mean) / std``."""
  mean_a, std_a = _channel_stats(mean, std, channels)
  return (1.0 / (255.0 * std_a)).astype(np.float32), (mean_a / std_a).astype(np.float32)


def normalize(image: np.ndarray, mean: Sequence[float], std: Sequence[float]) -> np.ndarray:
  """uint8 (..., C) -> float32 (x / 255 - mean) / std. Works per example or per batch. (The
  training and eval steps do the same on the device: ``device_augment.normalize``.)"""
  scale, offset = normalization_constants(mean, std, image.shape[-1])
  out = image.astype(np.float32)
  out *= scale
  out -= offset
  return out


normalize_batch = normalize  # Same arithmetic; the pipeline calls it once per batch.


def _channel_stats(
  mean: Sequence[float], std: Sequence[float], channels: int
) -> tuple[np.ndarray, np.ndarray]:
  m, s = np.asarray(mean, np.float64), np.asarray(std, np.float64)
  if m.size == channels or m.size == 1:
    return m, s
  if channels == 1:
    # An RGB mean/std (e.g. the ImageNet default) on grayscale data: use the channel average.
    return m.mean(keepdims=True), s.mean(keepdims=True)
  raise ValueError(f"data.mean/std have {m.size} values but the images have {channels} channels")


# ----------------------------------------------------------------------------- registry

_OPS: dict[str, OpFactory] = {}
_RECIPES: dict[str, tuple[str, ...]] = {}


def register_op(name: str) -> Callable[[OpFactory], OpFactory]:
  """Decorator registering `factory(data_config) -> op` under `name`."""

  def deco(factory: OpFactory) -> OpFactory:
    if name in _OPS:
      raise ValueError(f"augmentation op {name!r} is already registered")
    _OPS[name] = factory
    return factory

  return deco


def register_recipe(name: str, ops: Sequence[str]) -> None:
  """Registers a train augmentation recipe: op names applied in order."""
  unknown = [o for o in ops if o not in _OPS]
  if unknown:
    raise ValueError(f"recipe {name!r} uses unknown ops {unknown}; known: {sorted(_OPS)}")
  _RECIPES[name] = tuple(ops)


def list_ops() -> list[str]:
  """Registered augmentation op names, sorted."""
  return sorted(_OPS)


def list_recipes() -> list[str]:
  """Registered recipe names (valid values of ``data.train_augment``), sorted."""
  return sorted(_RECIPES)


def compose(ops: Sequence[Op]) -> Op:
  """Chains ops; each draws from the same generator in order."""

  def apply(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    for op in ops:
      image = op(image, rng)
    return image

  return apply


def train_op_names(cfg: Any) -> tuple[str, ...]:
  """Op names of the train transform: the recipe's, then "auto_augment" if data.auto_augment."""
  if cfg.train_augment not in _RECIPES:
    raise ValueError(f"data.train_augment={cfg.train_augment!r} is not one of {list_recipes()}")
  names = _RECIPES[cfg.train_augment]
  if cfg.auto_augment and "auto_augment" not in names:
    names += ("auto_augment",)
  return names


# Ops that data.augment_on='device' moves into the jitted train step (`device_augment` and
# `device_autoaugment` implement them; the host keeps the box draw and the cut of a random-resized
# crop, `resample.crop_to_canvas`). Only a trailing run of them moves, so the ops keep their
# order: crop_flip + auto_augment moves pad_crop, hflip and auto_augment.
DEVICE_OPS = ("random_resized_crop", "pad_crop", "hflip", "auto_augment")
# Host ops that draw nothing: the same output every epoch, so data.train_split_on='device' applies
# them once, when the split is loaded.
DETERMINISTIC_OPS = ("resize", "resize_center_crop")


def split_train_ops(cfg: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
  """(host op names, device op names) of the train transform under ``data.augment_on``.

  Raises ValueError when 'device' would move nothing (the transform does not end with a pad-crop,
  a flip or data.auto_augment).
  """
  names = train_op_names(cfg)
  if cfg.augment_on == "host":
    return names, ()
  k = len(names)
  while k and names[k - 1] in DEVICE_OPS and names[k : k + 1] != ("random_resized_crop",):
    k -= 1  # A random-resized crop moves only as the first device op: the host cuts its box.
  if k == len(names):
    raise ValueError(
      f"data.augment_on='device' moves a trailing run of {', '.join(DEVICE_OPS)} into the train "
      f"step, but data.train_augment={cfg.train_augment!r} ends with {names[-1]!r}, which runs "
      "on the host only; set data.augment_on='host'"
    )
  return names[:k], names[k:]


def build_train_transform(cfg: Any) -> Op:
  """The per-example host train transform for `cfg.train_augment` (+ `cfg.auto_augment`), less
  the ops that data.augment_on='device' moves into the train step.

  Output is image_size^2 uint8.
  """
  return compose([_OPS[name](cfg) for name in split_train_ops(cfg)[0]])


def build_eval_transform(cfg: Any) -> Callable[[np.ndarray], np.ndarray]:
  """Deterministic eval transform: resize shorter side + centre crop."""
  size, pct, interp = cfg.image_size, cfg.eval_crop_pct, cfg.interpolation
  return lambda image: resize_center_crop(image, size, pct, interp)


@register_op("resize_center_crop")
def _resize_center_crop_op(cfg: Any) -> Op:
  eval_fn = build_eval_transform(cfg)
  return lambda image, rng: eval_fn(image)


@register_op("resize")
def _resize_op(cfg: Any) -> Op:
  # Brings any input to image_size^2 as evaluation sees it: shorter side to image_size, then the
  # centre (a plain resize of a square image; a no-op when it already is, e.g. CIFAR at 32). A
  # squash of 40x48 images trained on shapes the evaluation's centre crop never shows.
  size, interp = cfg.image_size, cfg.interpolation
  return lambda image, rng: resize_center_crop(image, size, 1.0, interp)


@register_op("pad_crop")
def _pad_crop_op(cfg: Any) -> Op:
  size, pad = cfg.image_size, cfg.crop_padding
  return lambda image, rng: random_crop_with_padding(image, rng, size, pad)


@register_op("random_resized_crop")
def _rrc_op(cfg: Any) -> Op:
  size, scale, ratio, interp = cfg.image_size, cfg.rrc_scale, cfg.rrc_ratio, cfg.interpolation
  return lambda image, rng: random_resized_crop(image, rng, size, scale, ratio, interp)


@register_op("hflip")
def _hflip_op(cfg: Any) -> Op:
  return lambda image, rng: horizontal_flip(image, rng)


register_recipe("none", ["resize_center_crop"])
register_recipe("crop_flip", ["resize", "pad_crop", "hflip"])
register_recipe("rrc_flip", ["random_resized_crop", "hflip"])
