"""Batch augmentations that run on device inside the jitted train step, and the normalisation
of the uint8 batches the host pipeline sends (train and eval steps).

With ``data.augment_on='device'`` the recipe's pad-and-crop and flip, and data.auto_augment
(``locvit.data.device_autoaugment``), run here too, per example, on the uint8 batch before
normalisation (``recipe_ops``), instead of on the host.

Random erasing (Zhong et al. 2020), Mixup (Zhang et al. 2018) and CutMix (Yun et al. 2019) with
timm's semantics, as used by the DeiT recipe (ConViT Table 1) and the GMM paper's small-ViT recipe.
They act on the normalised float batch, so the host pipeline stays uint8 and cheap, and draw all
randomness from a JAX key: a step's augmentation depends only on (seed, step), not on the device
or process count.

Order (as in timm): random erasing per example, then Mixup/CutMix across the batch, which also
turns integer labels into soft targets that fold in label smoothing:

    target = lam * smooth(one_hot(y)) + (1 - lam) * smooth(one_hot(y[::-1]))

where ``smooth(t) = (1 - eps) t + eps / num_classes`` (timm's ``mixup_target``).

Config (top-level fields of the experiment config, see ``locvit.configs.defaults``'
``mixup_config`` and ``erasing_config``)::

  mixup.mixup_alpha, mixup.cutmix_alpha   Beta(alpha, alpha) concentrations; 0 turns one off
  mixup.prob                              probability of mixing a batch (or an example)
  mixup.switch_prob                       probability of CutMix when both are on
  mixup.mode                              'batch' (one lam per batch, timm's default) | 'elem'
  mixup.correct_lam                       lam from the clipped CutMix box area (timm's default)
  random_erasing.prob, .mode ('pixel' | 'rand' | 'const'), .min_area, .max_area, .min_aspect,
  .aspect ('log_uniform' | 'uniform'), .fill (mode 'const''s per-channel values), .attempts
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from locvit.choices import Errors
from locvit.data import augment, device_autoaugment
from locvit.data.resample import PILLOW_ORDERS_PASSES, PRECISION_BITS, tap_tables

Array = jax.Array
MIXUP_MODES = ("batch", "elem")
ERASING_MODES = ("pixel", "rand", "const")
ERASING_ASPECTS = ("log_uniform", "uniform")


def normalize(images: Array, data_config: Any) -> Array:
  """uint8 ``(B, H, W, C)`` -> float32 ``(x / 255 - mean) / std`` with ``data.mean``/``data.std``
  (the host's ``augment.normalize`` constants). Batches cross to the device as uint8, a quarter
  of the bytes, and the host skips a float pass per image. A float batch is taken as already
  normalised and returned unchanged."""
  if images.dtype != jnp.uint8:
    return images
  scale, offset = augment.normalization_constants(
    tuple(data_config.mean), tuple(data_config.std), images.shape[-1]
  )
  return images.astype(jnp.float32) * scale - offset


# ----------------------------------------------------------------------------- recipe ops


def crop_at(images: Array, top: Array, left: Array, padding: int) -> Array:
  """The window at (top, left) of each zero-padded example: ``(B, H, W, C)`` -> same shape.

  ``top``/``left`` (B,) in [0, 2 * padding] are offsets into the padded image; the host op
  ``augment.random_crop_with_padding`` takes the window at ``top - padding`` in image coordinates,
  so the two agree pixel for pixel.
  """
  _, height, width, channels = images.shape
  pad = ((0, 0), (padding, padding), (padding, padding), (0, 0))
  padded = jnp.pad(images, pad)
  window = lambda image, y, x: jax.lax.dynamic_slice(image, (y, x, 0), (height, width, channels))
  return jax.vmap(window)(padded, top, left)


def pad_crop(key: Array, images: Array, padding: int) -> Array:
  """Random crop with zero padding (torchvision's ``RandomCrop(size, padding)``) per example:
  both offsets uniform in [0, 2 * padding], as the host op draws them."""
  k_top, k_left = jax.random.split(key)
  b = images.shape[0]
  top = jax.random.randint(k_top, (b,), 0, 2 * padding + 1)
  left = jax.random.randint(k_left, (b,), 0, 2 * padding + 1)
  return crop_at(images, top, left, padding)


def flip_where(images: Array, flip: Array) -> Array:
  """Mirrors the width axis of the examples where ``flip`` (B,) is true."""
  return jnp.where(flip[:, None, None, None], images[:, :, ::-1], images)


def random_flip(key: Array, images: Array) -> Array:
  """Horizontal flip of each example with probability 1/2."""
  return flip_where(images, jax.random.bernoulli(key, 0.5, (images.shape[0],)))


def _resample_width(image: Array, taps: Array) -> Array:
  """One Pillow pass along the width of an int32 ``(H, W, C)`` image: ``taps`` ``(out, 1 + K)``
  holds each output column's first input column and K fixed-point coefficients
  (``resample.taps``); rounded and clipped to 8 bits as Pillow does between passes."""
  first, coefficients = taps[:, 0], taps[:, 1:]
  total = jnp.full((image.shape[0], taps.shape[0], image.shape[2]), 1 << (PRECISION_BITS - 1))
  for j in range(coefficients.shape[1]):  # K gathers, each weighted: no (H, out, K, C) temporary.
    columns = jnp.take(image, jnp.minimum(first + j, image.shape[1] - 1), axis=1)
    total = total + columns * coefficients[None, :, j, None]
  return jnp.clip(jnp.right_shift(total, PRECISION_BITS), 0, 255)


def resize_from_taps(images: Array, taps: Array, transposed: Array) -> Array:
  """The device half of a random-resized crop: Pillow's separable resize of each uint8 canvas
  ``(B, S, S, C)`` with the host's ``taps`` ``(B, 2, size, 1 + K)`` (width pass, then height
  pass) in int32 arithmetic, equal to ``Image.resize`` bit for bit; examples sent
  ``transposed`` (B,) are transposed back. Returns uint8 ``(B, size, size, C)``."""

  def one(canvas: Array, taps: Array, transposed: Array) -> Array:
    x = _resample_width(canvas.astype(jnp.int32), taps[0])
    x = _resample_width(x.transpose(1, 0, 2), taps[1])  # The height pass, on the transpose.
    return jnp.where(transposed, x, x.transpose(1, 0, 2)).astype(jnp.uint8)

  return jax.vmap(one)(images, taps, transposed)


def random_resized_crop_boxes(
  key: Array,
  count: int,
  height: int,
  width: int,
  scale: tuple[float, float],
  ratio: tuple[float, float],
  attempts: int = 10,
) -> tuple[Array, Array, Array, Array]:
  """``count`` crop boxes ``(left, top, box_width, box_height)`` (int32) of a ``height x width``
  image, drawn as ``augment.random_resized_crop_box`` draws one (timm's ``RandomResizedCrop``):
  the first of ``attempts`` (area fraction in ``scale``, log-uniform aspect in ``ratio``) that
  fits, else the centre crop clamped to ``ratio``. The same distribution, from a JAX key."""
  area_key, ratio_key, top_key, left_key = jax.random.split(key, 4)
  area = (
    height
    * width
    * jax.random.uniform(area_key, (count, attempts), minval=scale[0], maxval=scale[1])
  )
  log_ratio = jax.random.uniform(
    ratio_key, (count, attempts), minval=math.log(ratio[0]), maxval=math.log(ratio[1])
  )
  box_w = jnp.round(jnp.sqrt(area * jnp.exp(log_ratio))).astype(jnp.int32)
  box_h = jnp.round(jnp.sqrt(area / jnp.exp(log_ratio))).astype(jnp.int32)
  fits = (box_w > 0) & (box_w <= width) & (box_h > 0) & (box_h <= height)
  first = jnp.argmax(fits, axis=1)[:, None]
  box_w, box_h = (jnp.take_along_axis(x, first, axis=1)[:, 0] for x in (box_w, box_h))
  top = jax.random.randint(top_key, (count,), 0, height - box_h + 1)
  left = jax.random.randint(left_key, (count,), 0, width - box_w + 1)
  x0, y0, x1, y1 = augment.random_resized_crop_box(height, width, None, scale, ratio, attempts=0)
  fallback = ~fits.any(axis=1)
  return (
    jnp.where(fallback, x0, left),
    jnp.where(fallback, y0, top),
    jnp.where(fallback, x1 - x0, box_w),
    jnp.where(fallback, y1 - y0, box_h),
  )


def random_resized_crop(key: Array, images: Array, data_config: Any) -> Array:
  """A random-resized crop drawn here, for whole images (the training split on the device): each
  example's box (``random_resized_crop_boxes``) resized to ``image_size`` with Pillow's taps for
  its extents (``resample.tap_tables``, their first index shifted by the box's offset), in the
  pass order Pillow would choose; equal to ``Image.resize`` of the cut box bit for bit."""
  count, height, width = images.shape[:3]
  size, interpolation = int(data_config.image_size), data_config.interpolation
  by_height, by_width = (jnp.asarray(t) for t in tap_tables(height, width, size, interpolation))
  scale, ratio = tuple(data_config.rrc_scale), tuple(data_config.rrc_ratio)
  left, top, box_w, box_h = random_resized_crop_boxes(key, count, height, width, scale, ratio)
  shrink = box_h - size
  height_first = PILLOW_ORDERS_PASSES & (shrink > 0) & (shrink > 2 * (box_w - size))
  # Pillow starts with the height only for a box taller than the output: never from images no
  # taller than it (CIFAR at 32), which then skip that order's passes.
  both_orders = PILLOW_ORDERS_PASSES and height > size

  def one(image, left, top, box_w, box_h, height_first):
    along_w = by_width[box_w].at[:, 0].add(left)
    along_h = by_height[box_h].at[:, 0].add(top)
    image = image.astype(jnp.int32)
    width_then_height = _resample_width(_resample_width(image, along_w).transpose(1, 0, 2), along_h)
    if not both_orders:
      return width_then_height.transpose(1, 0, 2)
    height_then_width = _resample_width(
      _resample_width(image.transpose(1, 0, 2), along_h).transpose(1, 0, 2), along_w
    )
    return jnp.where(height_first, height_then_width, width_then_height.transpose(1, 0, 2))

  out = jax.vmap(one)(images, left, top, box_w, box_h, height_first)
  return out.astype(jnp.uint8)


def _random_resized_crop_op(key: Array, images: Array, cfg: Any, batch: dict[str, Array]) -> Array:
  if "resize_taps" in batch:  # the host drew and cut the boxes
    return resize_from_taps(images, batch["resize_taps"], batch["resize_transposed"])
  return random_resized_crop(key, images, cfg)


_RECIPE_OPS = {
  "random_resized_crop": lambda key, images, cfg, batch, platform: _random_resized_crop_op(
    key, images, cfg, batch
  ),
  "pad_crop": lambda key, images, cfg, batch, platform: pad_crop(
    key, images, int(cfg.crop_padding)
  ),
  "hflip": lambda key, images, cfg, batch, platform: random_flip(key, images),
  "auto_augment": lambda key, images, cfg, batch, platform: device_autoaugment.auto_augment(
    key, images, cfg, platform=platform
  ),
}


def recipe_ops(key: Array, batch: dict[str, Array], data_config: Any, *, platform: str) -> Array:
  """The recipe ops that ``data.augment_on='device'`` moves here (``augment.split_train_ops``),
  in order, on the batch's uint8 images; each draws from its own key, per example (a
  random-resized crop reads the box the host cut, ``resample.crop_to_canvas``). Returns the
  images, unchanged when no op moved. ``platform``: the backend the step is compiled for (how
  ``device_autoaugment.auto_augment`` applies its ops)."""
  images, names = batch["image"], augment.split_train_ops(data_config)[1]
  if not names:
    return images
  for name, op_key in zip(names, jax.random.split(key, len(names)), strict=True):
    images = _RECIPE_OPS[name](op_key, images, data_config, batch, platform)
  return images


def mixing_enabled(mixup: Any) -> bool:
  """Whether the ``mixup`` block mixes anything: ``prob > 0`` and a positive Mixup or CutMix
  alpha (None: off)."""
  return mixup is not None and mixup.prob > 0 and (mixup.mixup_alpha > 0 or mixup.cutmix_alpha > 0)


def validate_mixup_config(mixup: Any, num_classes: Any, *, check_classes: bool = True) -> None:
  """Raises ValueError naming each bad field (a line each) and its valid range; runs before
  anything compiles. ``check_classes=False``: the class count is not known yet."""
  errors = Errors()
  for field in ("mixup_alpha", "cutmix_alpha"):
    if not mixup[field] >= 0:
      errors.add(f"mixup.{field}={mixup[field]!r} must be >= 0 (0 turns it off)")
  for field in ("prob", "switch_prob"):
    if not 0 <= mixup[field] <= 1:
      errors.add(f"mixup.{field}={mixup[field]!r} must be a probability in [0, 1]")
  if mixup.mode not in MIXUP_MODES:
    errors.add(f"mixup.mode={mixup.mode!r} is not one of {MIXUP_MODES}")
  errors.raise_all()
  if (
    check_classes
    and mixing_enabled(mixup)
    and not (isinstance(num_classes, int) and num_classes >= 2)
  ):
    raise ValueError(
      f"Mixup/CutMix mix one-hot targets, which needs integer class labels and num_classes >= 2; "
      f"got num_classes={num_classes!r}. Set data.num_classes or turn mixing off "
      "(mixup.mixup_alpha = mixup.cutmix_alpha = 0)."
    )


def validate_erasing_config(erasing: Any) -> None:
  """Raises ValueError naming each bad ``random_erasing`` field (a line each) and its valid
  range or choices."""
  errors = Errors()
  if not 0 <= erasing.prob <= 1:
    errors.add(f"random_erasing.prob={erasing.prob!r} must be a probability in [0, 1]")
  if erasing.mode not in ERASING_MODES:
    errors.add(f"random_erasing.mode={erasing.mode!r} is not one of {ERASING_MODES}")
  if not 0 < erasing.min_area <= erasing.max_area <= 1:
    errors.add(
      f"random_erasing.min_area={erasing.min_area!r}, max_area={erasing.max_area!r} must satisfy "
      "0 < min_area <= max_area <= 1"
    )
  if not 0 < erasing.min_aspect <= 1:
    errors.add(f"random_erasing.min_aspect={erasing.min_aspect!r} must be in (0, 1]")
  if erasing.aspect not in ERASING_ASPECTS:
    errors.add(f"random_erasing.aspect={erasing.aspect!r} is not one of {ERASING_ASPECTS}")
  if not (isinstance(erasing.attempts, int) and erasing.attempts >= 1):
    errors.add(f"random_erasing.attempts={erasing.attempts!r} must be an integer >= 1")
  if erasing.fill and erasing.mode != "const":
    errors.add(
      f"random_erasing.fill={tuple(erasing.fill)!r} is mode 'const''s colour; mode "
      f"{erasing.mode!r} draws its own: set random_erasing.mode='const' or fill=()"
    )
  errors.raise_all()


# ----------------------------------------------------------------------------- boxes


def _box_mask(height: int, width: int, top: Array, left: Array, h: Array, w: Array) -> Array:
  """(B, H, W) boolean masks of the boxes [top, top + h) x [left, left + w), one per example."""
  rows = jnp.arange(height)[None, :, None]
  cols = jnp.arange(width)[None, None, :]
  top, left, h, w = (a[:, None, None] for a in (top, left, h, w))
  return (rows >= top) & (rows < top + h) & (cols >= left) & (cols < left + w)


def cutmix_boxes(key: Array, lam: Array, height: int, width: int) -> tuple[Array, Array]:
  """timm's ``rand_bbox``: a box of area fraction ~(1 - lam), centred uniformly, then clipped.

  ``lam`` has shape (B,). Returns the (B, H, W) box masks and the corrected lam
  ``1 - clipped_area / (H W)`` (the fraction of each image left unpasted).
  """
  cut = jnp.sqrt(1.0 - lam)
  cut_h, cut_w = (cut * height).astype(jnp.int32), (cut * width).astype(jnp.int32)
  k_y, k_x = jax.random.split(key)
  cy = jax.random.randint(k_y, lam.shape, 0, height)
  cx = jax.random.randint(k_x, lam.shape, 0, width)
  y0, y1 = jnp.clip(cy - cut_h // 2, 0, height), jnp.clip(cy + cut_h // 2, 0, height)
  x0, x1 = jnp.clip(cx - cut_w // 2, 0, width), jnp.clip(cx + cut_w // 2, 0, width)
  masks = _box_mask(height, width, y0, x0, y1 - y0, x1 - x0)
  corrected = 1.0 - ((y1 - y0) * (x1 - x0)).astype(jnp.float32) / (height * width)
  return masks, corrected


# ----------------------------------------------------------------------------- random erasing


def random_erasing(key: Array, images: Array, erasing: Any) -> Array:
  """timm's ``RandomErasing`` (one box per example) on a normalised (B, H, W, C) batch.

  With probability ``prob`` an example gets one box of area fraction U(min_area, max_area) and
  aspect (height over width) in [min_aspect, 1 / min_aspect], log-uniform (``aspect``
  'log_uniform', timm) or uniform ('uniform', Zhong et al.'s code); the first of ``attempts``
  draws that fits is used (none fits: the example is unchanged). The box is filled with per-pixel
  N(0, 1) noise ('pixel'), one N(0, 1) colour per box ('rand') or the colour ``fill`` ('const';
  empty: zeros, in normalised space the mean colour).
  """
  if erasing.prob <= 0:
    return images
  b, height, width, channels = images.shape
  k_apply, k_area, k_aspect, k_top, k_left, k_fill = jax.random.split(key, 6)
  shape = (b, erasing.attempts)
  area = (
    height
    * width
    * jax.random.uniform(k_area, shape, minval=erasing.min_area, maxval=erasing.max_area)
  )
  if erasing.aspect == "uniform":
    lo, hi = erasing.min_aspect, 1.0 / erasing.min_aspect
    aspect = jax.random.uniform(k_aspect, shape, minval=lo, maxval=hi)
  else:
    log_aspect = math.log(erasing.min_aspect)
    aspect = jnp.exp(jax.random.uniform(k_aspect, shape, minval=log_aspect, maxval=-log_aspect))
  h = jnp.round(jnp.sqrt(area * aspect)).astype(jnp.int32)
  w = jnp.round(jnp.sqrt(area / aspect)).astype(jnp.int32)
  fits = (h < height) & (w < width)
  first = jnp.argmax(fits, axis=1)  # First attempt that fits (0 if none; masked out below).
  pick = lambda a: jnp.take_along_axis(a, first[:, None], axis=1)[:, 0]
  h, w = pick(h), pick(w)
  top = jnp.floor(jax.random.uniform(k_top, (b,)) * (height - h + 1)).astype(jnp.int32)
  left = jnp.floor(jax.random.uniform(k_left, (b,)) * (width - w + 1)).astype(jnp.int32)
  erase = jnp.any(fits, axis=1) & (jax.random.uniform(k_apply, (b,)) < erasing.prob)
  mask = _box_mask(height, width, top, left, h, w) & erase[:, None, None]
  if erasing.mode == "pixel":
    fill = jax.random.normal(k_fill, images.shape, images.dtype)
  elif erasing.mode == "rand":
    fill = jax.random.normal(k_fill, (b, 1, 1, channels), images.dtype)
  else:
    fill = jnp.asarray(tuple(erasing.fill) or 0.0, images.dtype)
  return jnp.where(mask[..., None], fill, images)


# ----------------------------------------------------------------------------- mixup / cutmix


def soft_targets(labels: Array, num_classes: int, label_smoothing: float) -> Array:
  """Smoothed one-hot targets: (1 - eps) one_hot + eps / num_classes."""
  one_hot = jax.nn.one_hot(labels, num_classes, dtype=jnp.float32)
  return one_hot * (1.0 - label_smoothing) + label_smoothing / num_classes


def symmetric_beta(key: Array, alpha: float, shape: tuple[int, ...]) -> Array:
  """Draws of Beta(alpha, alpha), the distribution of Mixup's and CutMix's lam.

  For alpha > 1/2, Ulrich's construction (Ulrich 1984, "Computer generation of distributions on
  the m-sphere"), with no loop: with U, V uniform on [0, 1),

      lam = (1 + sqrt(1 - U ** (2 / (2 alpha - 1))) * cos(2 pi V)) / 2

  A point of the unit disc at a uniform angle whose squared radius R^2 = 1 - U^(2/(2 alpha - 1))
  follows Beta(1, alpha - 1/2) has density proportional to (1 - r^2)^(alpha - 3/2); its first
  coordinate then has density proportional to (1 - x^2)^(alpha - 1), which is 2 lam - 1 for lam
  ~ Beta(alpha, alpha). At alpha = 1/2, the limit, the radius is 1 (the arcsine law).
  ``jax.random.beta`` draws with a rejection loop, and on a GPU each test of such a loop's
  condition is a copy to the host and a wait for the device, several per step. Below 1/2 this
  falls back to ``jax.random.beta`` (same distribution, with its loops).
  """
  if alpha < 0.5:
    return jax.random.beta(key, alpha, alpha, shape)
  k_radius, k_angle = jax.random.split(key)
  cos_angle = jnp.cos(2.0 * jnp.pi * jax.random.uniform(k_angle, shape))
  if alpha == 0.5:
    return 0.5 + 0.5 * cos_angle
  radius_squared = 1.0 - jax.random.uniform(k_radius, shape) ** (2.0 / (2.0 * alpha - 1.0))
  return 0.5 + 0.5 * jnp.sqrt(radius_squared) * cos_angle


def _sample_lam(key: Array, mixup: Any, shape: tuple[int, ...]) -> tuple[Array, Array]:
  """(lam, use_cutmix) per timm's ``_params_per_batch`` / ``_params_per_elem``; a lam whose
  alpha is 0 is never drawn (its kind is never chosen)."""
  k_switch, k_mix, k_cut, k_apply = jax.random.split(key, 4)
  if mixup.mixup_alpha > 0 and mixup.cutmix_alpha > 0:
    use_cutmix = jax.random.uniform(k_switch, shape) < mixup.switch_prob
    lam_mix = symmetric_beta(k_mix, mixup.mixup_alpha, shape)
    lam = jnp.where(use_cutmix, symmetric_beta(k_cut, mixup.cutmix_alpha, shape), lam_mix)
  elif mixup.cutmix_alpha > 0:
    use_cutmix = jnp.full(shape, True)
    lam = symmetric_beta(k_cut, mixup.cutmix_alpha, shape)
  else:
    use_cutmix = jnp.full(shape, False)
    lam = symmetric_beta(k_mix, mixup.mixup_alpha, shape)
  apply = jax.random.uniform(k_apply, shape) < mixup.prob
  return jnp.where(apply, lam, 1.0), use_cutmix & apply


def mix_batch(
  key: Array,
  images: Array,
  labels: Array,
  mixup: Any,
  num_classes: int,
  label_smoothing: float = 0.0,
) -> tuple[Array, Array]:
  """Mixup or CutMix of each example with its mirror in the batch (``x[::-1]``, as timm does).

  Returns the mixed images and soft targets (B, num_classes) that fold in label smoothing.
  In 'batch' mode one lam and one Mixup/CutMix choice serve the whole batch (timm's default);
  in 'elem' mode each example draws its own. With mixing off the images are unchanged and the
  targets are the smoothed one-hot labels.
  """
  targets = soft_targets(labels, num_classes, label_smoothing)
  if not mixing_enabled(mixup):
    return images, targets
  b, height, width, _ = images.shape
  k_lam, k_box = jax.random.split(key)
  shape = (1,) if mixup.mode == "batch" else (b,)
  lam, use_cutmix = _sample_lam(k_lam, mixup, shape)
  lam, use_cutmix = jnp.broadcast_to(lam, (b,)), jnp.broadcast_to(use_cutmix, (b,))
  # One box per batch in 'batch' mode: draw it for one example and broadcast.
  boxes, corrected = cutmix_boxes(k_box, lam[: shape[0]], height, width)
  boxes, corrected = jnp.broadcast_to(boxes, (b, height, width)), jnp.broadcast_to(corrected, (b,))
  if mixup.correct_lam:
    lam = jnp.where(use_cutmix, corrected, lam)
  flipped = images[::-1]
  paste = boxes & use_cutmix[:, None, None]
  blend = lam[:, None, None, None] * images + (1.0 - lam[:, None, None, None]) * flipped
  mixed = jnp.where(
    use_cutmix[:, None, None, None], jnp.where(paste[..., None], flipped, images), blend
  )
  targets = lam[:, None] * targets + (1.0 - lam[:, None]) * targets[::-1]
  return mixed.astype(images.dtype), targets


def augment_batch(
  key: Array,
  images: Array,
  labels: Array,
  *,
  mixup: Any,
  erasing: Any,
  num_classes: int,
  label_smoothing: float,
) -> tuple[Array, Array]:
  """Random erasing then Mixup/CutMix: (images, soft targets) for the training loss.

  The batch-level part of the DeiT recipe that ConViT trains with (Table 1) and of Li & Zhang's
  small-dataset recipe (Sec. 4.1)."""
  k_erase, k_mix = jax.random.split(key)
  if erasing is not None:
    images = random_erasing(k_erase, images, erasing)
  return mix_batch(k_mix, images, labels, mixup, num_classes, label_smoothing)
