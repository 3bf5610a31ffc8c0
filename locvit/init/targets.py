"""Impulse-filter attention targets (Zheng, Li, Lucey: Sec. 4.1, Eq. 7, Algorithm 1 line 2).

An ``f x f`` impulse filter has a single 1 at tap ``k``; as a convolution on the token grid it moves
every token by the offset ``(m, n) = (k // f - f // 2, k % f - f // 2)`` (rows, cols). Its
``N x N`` convolution matrix (Appendix A, Eqs. 10-12, with zero padding) has row ``i = (r, c)``
one-hot at key ``(r + m, c + n)``, and an all-zero row when that key falls outside the grid.
That matrix is the target of one attention head.

Offsets are drawn as the reference does: ``k_h = randint(0, f * f)`` per head, independently and
with replacement; ``cover=True`` instead makes the heads cover all ``f^2`` offsets once there are
at least ``f^2`` heads (distinct offsets when there are fewer).
"""

from __future__ import annotations

import numpy as np

from locvit.attention import TokenGrid


def check_filter_size(filter_size: int, grid: TokenGrid) -> None:
  """Raises ValueError unless ``filter_size`` is an odd positive integer that fits the grid."""
  if isinstance(filter_size, bool) or not isinstance(filter_size, int | np.integer):
    raise ValueError(f"filter_size must be an odd integer (3, 5, ...), got {filter_size!r}.")
  if filter_size < 1 or filter_size % 2 == 0:
    raise ValueError(
      f"filter_size={filter_size} is not valid: impulse filters need an odd size (1, 3, 5, ...) "
      "so that the filter has a centre tap."
    )
  if filter_size > min(grid.height, grid.width):
    raise ValueError(
      f"filter_size={filter_size} is larger than the {grid.height}x{grid.width} token grid; "
      f"valid odd sizes are at most {min(grid.height, grid.width)}."
    )


def tap_to_offset(taps: np.ndarray, filter_size: int) -> np.ndarray:
  """Impulse tap index ``k`` -> ``(m, n)`` row/col offsets, shape ``(..., 2)`` int32.

  The shift of the ``f x f`` impulse filter with its 1 at tap ``k`` (Zheng, Li, Lucey Sec. 4.1).
  """
  taps = np.asarray(taps)
  half = filter_size // 2
  return np.stack([taps // filter_size - half, taps % filter_size - half], -1).astype(np.int32)


def draw_taps(
  rng: np.random.Generator, num_heads: int, filter_size: int, cover: bool = False
) -> np.ndarray:
  """Impulse tap index per head, in ``[0, f^2)``: the random impulse filters of Zheng, Li, Lucey
  Sec. 4.1 (one per head).

  ``cover=False``: independent uniform draws with replacement (the reference's ``randint``).
  ``cover=True``: a random permutation of all ``f^2`` taps for the first ``f^2`` heads (so every
  offset is used when ``num_heads >= f^2``), the remaining heads drawn with replacement.
  """
  taps = filter_size * filter_size
  if not cover:
    return rng.integers(0, taps, num_heads).astype(np.int32)
  perm = rng.permutation(taps).astype(np.int32)
  if num_heads <= taps:
    return perm[:num_heads]
  return np.concatenate([perm, rng.integers(0, taps, num_heads - taps).astype(np.int32)])


def impulse_key_indices(grid: TokenGrid, offsets: np.ndarray) -> np.ndarray:
  """Target key of every query for each ``(m, n)`` offset: ``(..., N)`` int32, -1 if outside.

  The one-hot column of each row of ``H_impulse`` (Zheng, Li, Lucey Eq. 7, Appendix A), stored
  sparsely for the solver.

  ``offsets`` has shape ``(..., 2)``; tokens are numbered row-major (``i = row * width + col``).
  """
  offsets = np.asarray(offsets, np.int32)
  rows, cols = np.divmod(np.arange(grid.num_tokens, dtype=np.int32), grid.width)
  key_rows = rows + offsets[..., 0:1]
  key_cols = cols + offsets[..., 1:2]
  inside = (key_rows >= 0) & (key_rows < grid.height) & (key_cols >= 0) & (key_cols < grid.width)
  return np.where(inside, key_rows * grid.width + key_cols, -1).astype(np.int32)


def impulse_attention_matrix(grid: TokenGrid, offsets: np.ndarray) -> np.ndarray:
  """Dense ``(..., N, N)`` float32 impulse convolution matrices ``H_impulse`` (Zheng, Li, Lucey
  Eq. 7; Appendix A, Eqs. 10-12, zero padding)."""
  index = impulse_key_indices(grid, offsets)
  keys = np.arange(grid.num_tokens, dtype=np.int32)
  return (index[..., None] == keys).astype(np.float32)
