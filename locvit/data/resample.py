"""Pillow's resize written as per-pixel taps, so a random-resized crop can finish on the device.

Pillow (``ImagingResample``) resizes an 8-bit image in two passes, width first (height first in
the cases of ``vertical_first``): output pixel ``o`` of a pass is
``clip((sum_j k[o, j] * in[start[o] + j] + 2^21) >> 22)``, where the coefficients are the filter
(bicubic with a = -0.5, or the triangle) centred on the output pixel's footprint, stretched by the
downscale factor, cut to the input, normalised to sum 1 and rounded to 22-bit fixed point; the
rounded 8-bit result of the first pass feeds the second. ``taps`` computes those start indices
and integer coefficients on the host in float64, as Pillow does, so the device applies them with
int32 arithmetic and reproduces ``Image.resize`` bit for bit
(``device_augment.resize_from_taps``).

Under ``data.augment_on='device'`` a random-resized crop splits in two. The host decodes, draws
the crop box exactly as the host op does (``augment.random_resized_crop_box``, the same draws
from the same generator) and cuts it out with the taps of its width and height (``box_cutter``);
the batch carries the boxes at the top-left of fixed ``data.rrc_canvas`` squares (``on_canvas``)
and the device resizes them. A crop larger than the canvas is resized on the host instead and
sent with identity taps, so every example is Pillow's output either way. With the training split
held on the device (``data.train_split_on='device'``) the step draws the box itself and reads its
taps from ``tap_tables``: Pillow's output for that box, from another random stream.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import PIL

from locvit.data import augment

PRECISION_BITS = 22  # Pillow's fixed point for 8-bit images: 32 - 8 bits - 2 bits of headroom.
PILLOW_ORDERS_PASSES = int(PIL.__version__.split(".")[0]) >= 13  # See `vertical_first`.


def _bicubic(x: np.ndarray) -> np.ndarray:
  a, x = -0.5, np.abs(x)
  near = ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
  far = (((x - 5.0) * x + 8.0) * x - 4.0) * a
  return np.where(x < 1.0, near, np.where(x < 2.0, far, 0.0))


def _triangle(x: np.ndarray) -> np.ndarray:
  return np.maximum(1.0 - np.abs(x), 0.0)


# interpolation -> (the filter's support at scale 1, the filter); Pillow's bicubic and bilinear.
_FILTERS = {"bicubic": (2.0, _bicubic), "bilinear": (1.0, _triangle)}


def tap_count(in_size: int, out_size: int, interpolation: str) -> int:
  """Pillow's window length (``ksize``) for resizing ``in_size`` pixels to ``out_size``."""
  support = _FILTERS[interpolation][0] * max(in_size / out_size, 1.0)
  return 2 * math.ceil(support) + 1


@functools.lru_cache(maxsize=8192)
def taps(in_size: int, out_size: int, interpolation: str, width: int) -> np.ndarray:
  """``(out_size, 1 + width)`` int32: per output pixel the first input index it reads, then
  ``width`` fixed-point coefficients (zero past Pillow's window), as ``Image.resize`` computes
  them for this axis (``precompute_coeffs``, in the same float64 operations and order).
  ``width`` must be at least ``tap_count(...)``."""
  if width < tap_count(in_size, out_size, interpolation):
    raise ValueError(f"width={width} is below the {in_size}->{out_size} window")
  support, kernel = _FILTERS[interpolation]
  scale = in_size / out_size
  filterscale = max(scale, 1.0)
  support *= filterscale
  center = (np.arange(out_size) + 0.5) * scale
  first = np.maximum(np.trunc(center - support + 0.5), 0).astype(np.int64)
  count = np.minimum(np.trunc(center + support + 0.5), in_size).astype(np.int64) - first
  offset = np.arange(width)
  k = kernel(((first[:, None] + offset) - center[:, None] + 0.5) * (1.0 / filterscale))
  k = np.where(offset < count[:, None], k, 0.0)
  total = np.zeros(out_size)
  for j in range(width):  # Summed left to right, as Pillow does: the rounding below sees it.
    total = total + k[:, j]
  k = np.where(total[:, None] != 0.0, k / np.where(total == 0.0, 1.0, total)[:, None], k)
  k = k * (1 << PRECISION_BITS)
  fixed = np.where(k < 0, np.trunc(k - 0.5), np.trunc(k + 0.5))
  out = np.concatenate([first[:, None], fixed], axis=1).astype(np.int32)
  out.setflags(write=False)
  return out


def tap_tables(
  height: int, width: int, size: int, interpolation: str
) -> tuple[np.ndarray, np.ndarray]:
  """``(by_height, by_width)``: ``taps(n, size, ...)`` for every box extent ``n`` of a
  ``height x width`` image, as ``(height + 1, size, 1 + K)`` and ``(width + 1, size, 1 + K)``
  int32 tables indexed by ``n`` (row 0 repeats row 1), K the largest window. A box drawn on the
  device looks its taps up here and shifts their first index by its offset."""
  width_k = tap_count(max(height, width), size, interpolation)
  tables = []
  for extent in (height, width):
    rows = [taps(n, size, interpolation, width_k) for n in range(1, extent + 1)]
    tables.append(np.stack(rows[:1] + rows))
  return tables[0], tables[1]


def canvas_size(data_config: Any) -> int:
  """The square canvas a device random-resized crop travels on: ``data.rrc_canvas``, or twice
  ``data.image_size`` when it is None."""
  return int(data_config.rrc_canvas or 2 * data_config.image_size)


def vertical_first(in_height: int, in_width: int, out_height: int, out_width: int) -> bool:
  """Whether Pillow runs the vertical pass first: from Pillow 13 on, when the height shrinks by
  more than twice as many pixels as the width (``ImagingResampleInner``); always width first
  before. The rounding between the passes makes the order visible in the result."""
  shrink = in_height - out_height
  return PILLOW_ORDERS_PASSES and shrink > 0 and shrink > 2 * (in_width - out_width)


def box_cutter(data_config: Any) -> Callable[[np.ndarray, np.random.Generator], dict]:
  """The host half of a device random-resized crop: ``cut(image, rng)`` returns
  ``{'image': the cut box, 'resize_taps': (2, size, 1 + K) int32, 'resize_transposed': bool}``;
  ``on_canvas`` then places a batch's boxes at the top-left of ``canvas_size`` squares.

  The box is ``augment.random_resized_crop_box``'s, drawn first from ``rng`` as the host op
  draws it. The device resamples the canvas's width with ``resize_taps[0]``, then its height
  with ``resize_taps[1]``; where Pillow would start with the height, the box travels transposed
  (``resize_transposed``) and the device transposes the result back.
  """
  size, interpolation = int(data_config.image_size), data_config.interpolation
  scale, ratio = tuple(data_config.rrc_scale), tuple(data_config.rrc_ratio)
  side = canvas_size(data_config)
  count = tap_count(side, size, interpolation)

  def cut(image: np.ndarray, rng: np.random.Generator) -> dict:
    x0, y0, x1, y1 = augment.random_resized_crop_box(*image.shape[:2], rng, scale, ratio)
    crop = image[y0:y1, x0:x1]
    if crop.shape[0] > side or crop.shape[1] > side:  # Too big to travel: Pillow resizes it here.
      crop = augment.resize(crop, (size, size), interpolation)
    transposed = vertical_first(crop.shape[0], crop.shape[1], size, size)
    if transposed:
      crop = crop.transpose(1, 0, 2)
    first, second = (taps(n, size, interpolation, count) for n in (crop.shape[1], crop.shape[0]))
    return {
      "image": crop,
      "resize_taps": np.stack([first, second]),
      "resize_transposed": np.bool_(transposed),
    }

  return cut


def on_canvas(boxes: Sequence[np.ndarray], side: int) -> np.ndarray:
  """``(B, side, side, C)`` uint8 with each box at the top-left of its square, zeros elsewhere
  (which no tap reads): the batch is written once, with no per-example canvas."""
  out = np.zeros((len(boxes), side, side, boxes[0].shape[2]), np.uint8)
  for canvas, box in zip(out, boxes, strict=True):
    canvas[: box.shape[0], : box.shape[1]] = box
  return out
