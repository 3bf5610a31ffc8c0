"""Token-grid geometry shared by every positional term.

All four papers put the convolutional prior into attention through the *relative* geometry of the
token grid. This module computes that geometry once per grid size, as NumPy constants, so no layer
ever rebuilds it per example. ``in_graph=True`` builds the same values from ``iota`` inside the
traced program instead: a layer applied many times (ConViT's ten GPSA layers) then adds a few
instructions, which XLA shares, rather than a dense (N, N, 3) constant per layer.

Conventions (matching the reference implementations):
- tokens are numbered row-major: token ``i = row * width + col``;
- offsets are *key minus query*: ``delta[i, j] = position(j) - position(i)``;
- ``dx`` is the column offset and ``dy`` the row offset.
"""

from __future__ import annotations

import dataclasses
import functools
import numbers

import jax
import jax.numpy as jnp
import numpy as np


def is_integer(value) -> bool:
  """An integer (Python's or NumPy's), not a bool: ``True`` is an ``int`` to Python but never a
  count here."""
  return isinstance(value, numbers.Integral) and not isinstance(value, bool)


# A static pytree (no leaves, the grid itself as the tree's structure): it passes through JAX and
# Flax transforms as a plain keyword argument (``nn.remat(GPSA)(...)(x, grid=grid)``, ``jax.jit``,
# ``jax.vmap``) without ``static_argnums``.
@jax.tree_util.register_static
@dataclasses.dataclass(frozen=True)
class TokenGrid:
  """A ``height x width`` grid of patch tokens."""

  height: int
  width: int

  def __post_init__(self):
    sides = (self.height, self.width)
    if not all(is_integer(side) for side in sides):
      raise ValueError(
        f"TokenGrid needs integer sides (patch rows, patch columns), got "
        f"{self.height!r}x{self.width!r}."
      )
    if self.height < 1 or self.width < 1:
      raise ValueError(f"TokenGrid needs positive sides, got {self.height}x{self.width}.")

  @property
  def num_tokens(self) -> int:
    """N = height * width."""
    return self.height * self.width

  @property
  def is_square(self) -> bool:
    """Whether height == width (the papers' masks and learned tables assume it)."""
    return self.height == self.width

  def require_square(self, what: str) -> None:
    """Raises a clear error for variants that are only defined on square grids."""
    if not self.is_square:
      raise ValueError(
        f"{what} requires a square token grid, got {self.height}x{self.width}. "
        "Use a square image size (image_size divisible by patch_size in both dimensions)."
      )


def _offsets(grid: TokenGrid, xp):
  rows, cols = xp.divmod(xp.arange(grid.num_tokens, dtype=xp.int32), grid.width)
  dy = rows[None, :] - rows[:, None]
  dx = cols[None, :] - cols[:, None]
  return xp.stack([dy, dx], axis=-1)


def _gpsa_features(grid: TokenGrid, xp):
  offsets = _offsets(grid, xp).astype(xp.float32)
  dy, dx = offsets[..., 0], offsets[..., 1]
  return xp.stack([dx, dy, dx**2 + dy**2], axis=-1)


def _frozen(array: np.ndarray) -> np.ndarray:
  array.setflags(write=False)
  return array


@functools.lru_cache(maxsize=64)
def relative_offsets(grid: TokenGrid) -> np.ndarray:
  """Returns ``(N, N, 2)`` int32 offsets ``(dy, dx)`` of key ``j`` relative to query ``i``.

  The shift ``delta = k - q`` of Cordonnier et al. (Eq. 8) and ``delta_ij`` of ConViT (Eqs. 4, 8).
  """
  return _frozen(_offsets(grid, np))


@functools.lru_cache(maxsize=64)
def squared_distances(grid: TokenGrid) -> np.ndarray:
  """Returns ``(N, N)`` float32 squared Euclidean distances ``dx^2 + dy^2`` between tokens.

  ``x^2 + y^2`` of Li & Zhang's Eqs. 1-2 and ``||delta||^2`` of ConViT Eq. 5.
  """
  offsets = relative_offsets(grid).astype(np.float32)
  out = np.sum(offsets**2, axis=-1)
  out.setflags(write=False)
  return out


def gpsa_relative_features(grid: TokenGrid, in_graph: bool = False) -> np.ndarray | jnp.ndarray:
  """Returns ConViT's ``(N, N, 3)`` relative features ``(dx, dy, dx^2 + dy^2)`` (float32).

  ``r_delta`` of ConViT Eq. 5 with ``D_pos = 3`` (Sec. 3), in timm's order (squared norm last).
  ``in_graph=True``: the same values as a ``jax.numpy`` computation (see the module docstring).
  """
  return _gpsa_features(grid, jnp) if in_graph else _cached_gpsa_features(grid)


@functools.lru_cache(maxsize=64)
def _cached_gpsa_features(grid: TokenGrid) -> np.ndarray:
  return _frozen(_gpsa_features(grid, np))


def grid_from_tokens(num_tokens: int) -> TokenGrid:
  """Infers a square grid from a token count, with a clear error when it is not square."""
  side = round(num_tokens**0.5)
  if side * side != num_tokens:
    raise ValueError(
      f"Cannot infer a square token grid from {num_tokens} tokens; pass "
      "grid=TokenGrid(HEIGHT, WIDTH) of the patch tokens."
    )
  return TokenGrid(side, side)


def check_grid_tokens(grid: TokenGrid | None, num_tokens: int) -> TokenGrid:
  """``grid`` (inferred as square when None), with a clear error when it has another token count."""
  grid = grid or grid_from_tokens(num_tokens)
  if grid.num_tokens != num_tokens:
    raise ValueError(
      f"Grid {grid.height}x{grid.width} ({grid.num_tokens} tokens) does not match the "
      f"{num_tokens} tokens given: pass grid=TokenGrid(HEIGHT, WIDTH) of the patch tokens (this "
      "layer takes no class token)."
    )
  return grid
