"""Learned position embeddings carried to a new patch grid (fine-tuning at another resolution).

timm's ``resample_abs_pos_embed`` resizes the patch rows of a ViT/DeiT ``pos_embed`` as an image
with PyTorch's ``F.interpolate(mode='bicubic', antialias=True)``: Keys' cubic (a = -0.5) stretched
by the downscale factor, the window cut at the borders and renormalised. ``jax.image.resize``
with ``antialias=True`` computes the same separable filter; the tests check it against
``F.interpolate`` to 1e-6. locvit applies it to ConViT's ``pos_embed`` too (no prefix rows: the
class token joins after the GPSA blocks), which timm does not.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np


def resample_abs_pos_embed(
  posemb: np.ndarray,
  new_size: Sequence[int],
  old_size: Sequence[int] | None = None,
  num_prefix_tokens: int = 1,
  interpolation: str = "bicubic",
) -> np.ndarray:
  """A learned ``(1, prefix + H*W, C)`` position embedding carried to a ``new_size = (h, w)`` patch
  grid, as timm's ``resample_abs_pos_embed`` does when a ViT/DeiT is built at another image size:
  the ``num_prefix_tokens`` rows (class, distillation token) are kept, the patch rows resized as
  an ``H x W`` image (bicubic, antialiased when shrinking). ``old_size`` defaults to the square
  grid. Unchanged when the grid already matches; float32 NumPy out."""
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
  grid = jnp.asarray(grid, jnp.float32).reshape(*old_size, -1)
  resized = jax.image.resize(grid, (*new_size, grid.shape[-1]), interpolation, antialias=True)
  resized = np.asarray(resized, posemb.dtype).reshape(1, -1, grid.shape[-1])
  return np.concatenate([prefix, resized], axis=1)
