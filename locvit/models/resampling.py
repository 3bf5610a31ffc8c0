"""Antialiased separable resampling, and learned position embeddings carried to a new grid.

One filter serves two callers that compute the same coefficients: Pillow's ``Image.resize``
(``ImagingResample``, reproduced bit for bit by ``locvit.data.resample``) and PyTorch's
``F.interpolate(..., antialias=True, align_corners=False)``, which timm's
``resample_abs_pos_embed`` uses to fine-tune ViT/DeiT at another resolution. Per axis, output
pixel ``o`` reads the inputs around ``center = (o + 0.5) * scale`` (``scale = in / out``) through
the filter (Keys' cubic with a = -0.5, or the triangle) stretched by ``max(scale, 1)``, cut to the
input and normalised to sum 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def _bicubic(x: np.ndarray) -> np.ndarray:
  a, x = -0.5, np.abs(x)
  near = ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
  far = (((x - 5.0) * x + 8.0) * x - 4.0) * a
  return np.where(x < 1.0, near, np.where(x < 2.0, far, 0.0))


def _triangle(x: np.ndarray) -> np.ndarray:
  return np.maximum(1.0 - np.abs(x), 0.0)


# interpolation -> (the filter's support at scale 1, the filter); Pillow's bicubic and bilinear.
FILTERS = {"bicubic": (2.0, _bicubic), "bilinear": (1.0, _triangle)}


def tap_count(in_size: int, out_size: int, interpolation: str) -> int:
  """The window length (Pillow's ``ksize``) for resizing ``in_size`` pixels to ``out_size``."""
  support = FILTERS[interpolation][0] * max(in_size / out_size, 1.0)
  return 2 * math.ceil(support) + 1


def filter_coefficients(
  in_size: int, out_size: int, interpolation: str, width: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
  """``(first, weights)``: per output pixel the first input index it reads ``(out_size,)`` and its
  ``width`` normalised float64 weights ``(out_size, width)`` (zero past the window), in Pillow's
  operations and order (``precompute_coeffs``; PyTorch's ``_compute_index_ranges_weights`` is the
  same computation, in the input's float type). ``width`` defaults to ``tap_count(...)``."""
  width = tap_count(in_size, out_size, interpolation) if width is None else width
  if width < tap_count(in_size, out_size, interpolation):
    raise ValueError(f"width={width} is below the {in_size}->{out_size} window")
  support, kernel = FILTERS[interpolation]
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
  for j in range(width):  # Summed left to right, as both libraries do: the rounding sees it.
    total = total + k[:, j]
  k = np.where(total[:, None] != 0.0, k / np.where(total == 0.0, 1.0, total)[:, None], k)
  return first, k


def resampling_matrix(in_size: int, out_size: int, interpolation: str) -> np.ndarray:
  """``(out_size, in_size)`` float64: ``filter_coefficients`` as a dense matrix, so one axis of an
  array resamples as a matrix product."""
  first, weights = filter_coefficients(in_size, out_size, interpolation)
  matrix = np.zeros((out_size, in_size + weights.shape[1]))
  rows = np.arange(out_size)[:, None]
  matrix[rows, first[:, None] + np.arange(weights.shape[1])] = weights
  return matrix[:, :in_size]


def resize_grid(
  grid: np.ndarray, size: Sequence[int], interpolation: str = "bicubic"
) -> np.ndarray:
  """A float ``(H, W, C)`` array resampled to ``size = (h, w)``, as PyTorch's
  ``F.interpolate(x, size, mode=interpolation, antialias=True)`` on its NCHW transpose: separable,
  computed in float64 and returned in ``grid``'s dtype (PyTorch's float32 agrees to its rounding,
  a few units in the last place)."""
  h, w = grid.shape[:2]
  rows = resampling_matrix(h, size[0], interpolation)
  cols = resampling_matrix(w, size[1], interpolation)
  out = np.einsum("ph,hwc->pwc", rows, grid.astype(np.float64))
  out = np.einsum("qw,pwc->pqc", cols, out)
  return out.astype(grid.dtype)


def resample_abs_pos_embed(
  posemb: np.ndarray,
  new_size: Sequence[int],
  old_size: Sequence[int] | None = None,
  num_prefix_tokens: int = 1,
  interpolation: str = "bicubic",
) -> np.ndarray:
  """A learned ``(1, prefix + H*W, C)`` position embedding carried to a ``new_size = (h, w)`` patch
  grid, as timm's ``resample_abs_pos_embed`` does when a ViT/DeiT is built at another image size:
  the ``num_prefix_tokens`` rows (class, distillation token) are kept, the patch rows resampled as
  an image (bicubic, antialiased: ``resize_grid``). ``old_size`` defaults to the square grid.
  Unchanged when the grid already matches."""
  posemb = np.asarray(posemb)
  patches = posemb.shape[1] - num_prefix_tokens
  if old_size is None:
    side = math.isqrt(patches)
    if side * side != patches:
      raise ValueError(
        f"pos_embed has {patches} patch rows (after {num_prefix_tokens} prefix tokens), not a "
        "square grid: give its old_size"
      )
    old_size = (side, side)
  if tuple(old_size) == tuple(new_size):
    return posemb
  if old_size[0] * old_size[1] != patches:
    raise ValueError(f"pos_embed has {patches} patch rows, not a {old_size[0]}x{old_size[1]} grid")
  prefix, grid = posemb[:, :num_prefix_tokens], posemb[0, num_prefix_tokens:]
  grid = grid.reshape(*old_size, -1)
  resized = resize_grid(grid, new_size, interpolation).reshape(1, -1, grid.shape[-1])
  return np.concatenate([prefix, resized], axis=1)
