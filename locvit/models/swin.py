"""Swin Transformer for small datasets (Liu et al. 2021), with GMM / ELM masks in its windows.

The configuration of Li & Zhang (GMM paper, Tables 1 and 2, official ``create_model``): patch 2
on 32x32 (4 on 64x64), embed 96, depths (2, 6, 4), heads (3, 6, 12), window 4, MLP ratio 2,
absolute position embedding, patch norm, drop path linearly spaced to 0.1, mean pooling.

Inside each window, the logits are ``((q k^T) / sqrt(d)) * M + B_rel + S`` (``M`` the mask on the
window's ``w x w`` token grid, ``B_rel`` the relative position bias, ``S`` the shifted-window mask
of 0 / -100): the mask acts after the scaling and before the bias and the shift mask, as in the
official code. ``attention`` picks 'mhsa' (no mask), 'gmm' or 'elm'; ``attention_kwargs`` holds
the mask options (``num_kernels``, ``kernel``, ``combine``...). With 'add' the mask is added
instead of multiplied.

Stage layout follows the reference: blocks alternate shift 0 and ``window // 2``; when a stage's
grid side is ``<= window`` the window shrinks to it and the shift is 0 (the third stage at 32x32
is a single 4x4 window). A window that does not tile the stage grid is an error.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from locvit.attention.attention import Attention
from locvit.attention.core import Term
from locvit.attention.geometry import TokenGrid, relative_offsets
from locvit.attention.masks import MASK_KINDS, mask_terms
from locvit.attention.projections import partitioned, trunc_normal
from locvit.models.layers import (
  AttentionSettings,
  BlockSettings,
  block_settings,
  classify,
  dense,
  embed_patches,
  layer_norm,
  learned_position_embedding,
  mlp_residual,
  pre_norm_residual,
)
from locvit.models.smalldata import (
  SmallDataBackbone,
  check_attention,
  check_stages,
  smalldata_models,
)

Array = jax.Array
SWIN_ATTENTION = ("mhsa", *MASK_KINDS)
SHIFT_MASK_VALUE = -100.0  # the reference's value for pairs from different shifted regions


def stage_windows(grid: TokenGrid, window_size: int, depth: int) -> list[tuple[int, int]]:
  """``(window, shift)`` per block of a stage on ``grid``, with a clear error if it cannot tile."""
  window = window_size
  shift = window_size // 2
  if min(grid.height, grid.width) <= window_size:
    window, shift = min(grid.height, grid.width), 0
  if grid.height % window or grid.width % window:
    valid = [
      w
      for w in range(1, min(grid.height, grid.width) + 1)
      if grid.height % w == 0 and grid.width % w == 0
    ]
    raise ValueError(
      f"Swin window_size={window} does not tile the {grid.height}x{grid.width} token grid of a "
      f"stage. Valid window sizes for this grid: {valid}; or change image_size / patch_size."
    )
  return [(window, 0 if i % 2 == 0 else shift) for i in range(depth)]


@functools.lru_cache(maxsize=32)
def relative_position_index(window: int) -> np.ndarray:
  """(N, N) index into the ``(2w-1)^2`` bias table, query-minus-key offsets (reference layout)."""
  offsets = -relative_offsets(TokenGrid(window, window))  # query minus key
  index = (offsets[..., 0] + window - 1) * (2 * window - 1) + (offsets[..., 1] + window - 1)
  index.setflags(write=False)
  return index


@functools.lru_cache(maxsize=32)
def shift_mask(grid: TokenGrid, window: int, shift: int) -> np.ndarray:
  """``(num_windows, w*w, w*w)`` 0 / -100 mask of the shifted windows (Swin Sec. 3.2)."""
  labels = np.zeros((grid.height, grid.width), np.float32)
  cuts = lambda n: (slice(0, n - window), slice(n - window, n - shift), slice(n - shift, n))
  count = 0
  for rows in cuts(grid.height):
    for cols in cuts(grid.width):
      labels[rows, cols] = count
      count += 1
  windows = partition(labels[None, :, :, None], window)[..., 0]  # (nW, w*w)
  same = windows[:, None, :] == windows[:, :, None]
  out = np.where(same, 0.0, SHIFT_MASK_VALUE).astype(np.float32)
  out.setflags(write=False)
  return out


def partition(x: Any, window: int) -> Any:
  """(B, H, W, C) -> (B * nW, w*w, C), windows in row-major order (NumPy or JAX)."""
  b, h, w, c = x.shape
  x = x.reshape(b, h // window, window, w // window, window, c).transpose(0, 1, 3, 2, 4, 5)
  return x.reshape(-1, window * window, c)


def unpartition(x: Array, window: int, height: int, width: int) -> Array:
  """Inverse of ``partition``: (B * nW, w*w, C) -> (B, H, W, C)."""
  c = x.shape[-1]
  x = x.reshape(-1, height // window, width // window, window, window, c)
  return x.transpose(0, 1, 3, 2, 4, 5).reshape(-1, height, width, c)


class WindowAttention(AttentionSettings):
  """Window multi-head self-attention: the shared ``Attention`` layer on the window's tokens with
  the terms mask (multiply or add), relative position bias (add), shift mask (add), in that order.
  """

  num_heads: int
  window: int
  qkv_bias: bool = True

  @nn.compact
  def __call__(self, x: Array, shift: Array | None, *, train: bool = False) -> Array:
    layer = Attention(self.num_heads, qkv_bias=self.qkv_bias, **self.layer_fields())
    nn.share_scope(self, layer)  # its qkv / proj stay this module's parameters (checkpoints)
    grid = TokenGrid(self.window, self.window)
    terms = mask_terms(
      self.attention, self.num_heads, grid, self.attention_kwargs, self.implementation
    )
    size = 2 * self.window - 1
    table = self.param(
      "relative_position_bias_table",
      partitioned(trunc_normal, (None, "heads")),
      (size * size, self.num_heads),
      self.param_dtype,
    )
    bias = table.astype(jnp.float32)[relative_position_index(self.window)]  # (N, N, H)
    terms += (Term(jnp.transpose(bias, (2, 0, 1)), "add"),)
    if shift is not None:  # (nW, N, N), per window of every image: (B * nW, 1, N, N)
      per_window = jnp.tile(shift[:, None], (x.shape[0] // shift.shape[0], 1, 1, 1))
      terms += (Term(per_window, "add"),)
    return layer(x, grid=grid, terms=terms, train=train)


class SwinBlock(BlockSettings):
  """``x + dp(W-MSA(LN(x)))`` (shifted when ``shift > 0``), then ``x + dp(MLP(LN(x)))``."""

  num_heads: int
  window: int
  shift: int
  mlp_ratio: float = 2.0
  qkv_bias: bool = True

  @nn.compact
  def __call__(self, x: Array, *, grid: TokenGrid, train: bool = False) -> Array:
    rate = self.drop_path
    x = pre_norm_residual(
      self, x, "norm1", lambda y: self._attend(y, grid, train), rate=rate, train=train
    )
    return mlp_residual(self, x, int(x.shape[-1] * self.mlp_ratio), rate=rate, train=train)

  def _attend(self, y: Array, grid: TokenGrid, train: bool) -> Array:
    """Window attention of normalised tokens ``y``, shifted by ``shift``, back to ``(B, N, C)``."""
    b, n, c = y.shape
    y = y.reshape(b, grid.height, grid.width, c)
    if self.shift:
      y = jnp.roll(y, (-self.shift, -self.shift), axis=(1, 2))
    mask = jnp.asarray(shift_mask(grid, self.window, self.shift)) if self.shift else None
    y = WindowAttention(
      self.num_heads,
      self.window,
      self.qkv_bias,
      attention=self.attention,
      attention_kwargs=self.attention_kwargs,
      **self.attention_fields(),
    )(partition(y, self.window), mask, train=train)
    y = unpartition(y, self.window, grid.height, grid.width)
    if self.shift:
      y = jnp.roll(y, (self.shift, self.shift), axis=(1, 2))
    return y.reshape(b, n, c)


class PatchMerging(nn.Module):
  """2x2 neighbourhood concat (x0, x1, x2, x3 as the reference), LayerNorm, Linear 4C -> 2C."""

  norm_eps: float = 1e-5
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  implementation: str | None = None

  @nn.compact
  def __call__(self, x: Array, grid: TokenGrid) -> tuple[Array, TokenGrid]:
    if grid.height % 2 or grid.width % 2:
      raise ValueError(
        f"Swin patch merging needs an even token grid, got {grid.height}x{grid.width}."
      )
    b, _, c = x.shape
    x = x.reshape(b, grid.height, grid.width, c)
    x = jnp.concatenate(
      [x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], -1
    )
    grid = TokenGrid(grid.height // 2, grid.width // 2)
    x = layer_norm(self.norm_eps, self.dtype, "norm")(x.reshape(b, grid.num_tokens, 4 * c))
    settings = (self.dtype, self.param_dtype, self.implementation)
    x = dense(2 * c, ("mlp", "embed"), "reduction", *settings, use_bias=False)(x)
    return x, grid


class SwinTransformer(SmallDataBackbone):
  """Swin Transformer mapping NHWC images to logits.

  Attributes:
    num_classes: classifier width (0 returns pooled features).
    patch_size, embed_dim, depths, num_heads, window_size, mlp_ratio, qkv_bias: sizes.
    attention: 'mhsa', 'gmm' or 'elm' in every window attention.
    attention_kwargs: per kind, the mask options, e.g. ``{'gmm': {'num_kernels': 5}}`` (the
      form the ViT uses).
    drop_rate, attn_drop_rate, drop_path_rate: dropout, attention dropout, stochastic depth
      (linear over all blocks).
  """

  patch_size: int = 2
  embed_dim: int = 96
  depths: Sequence[int] = (2, 6, 4)
  num_heads: Sequence[int] = (3, 6, 12)
  window_size: int = 4
  mlp_ratio: float = 2.0
  qkv_bias: bool = True
  attn_drop_rate: float = 0.0

  def check(self) -> None:
    """Validates the static configuration before tracing; raises ValueError naming the field and
    the valid choices (``create_model`` calls it)."""
    check_attention("Swin", self.attention, self.attention_kwargs, SWIN_ATTENTION)
    check_stages(self.depths, self.num_heads)

  @nn.compact
  def __call__(self, images: Array, *, train: bool = False) -> Array:
    self.check()
    x, grid = embed_patches(self, images)
    x = learned_position_embedding(self, layer_norm(self.norm_eps, self.dtype, "patch_norm")(x))
    x = nn.Dropout(self.drop_rate)(x, deterministic=not train)
    rates = np.linspace(0.0, self.drop_path_rate, sum(self.depths))
    block = 0
    for s, (depth, heads) in enumerate(zip(self.depths, self.num_heads)):
      for i, (window, shift) in enumerate(stage_windows(grid, self.window_size, depth)):
        x = SwinBlock(
          heads,
          window,
          shift,
          self.mlp_ratio,
          self.qkv_bias,
          drop_path=float(rates[block]),
          attn_drop=self.attn_drop_rate,
          name=f"stages_{s}_blocks_{i}",
          **block_settings(self),
        )(x, grid=grid, train=train)
        block += 1
      if s < len(self.depths) - 1:
        merge = PatchMerging(
          self.norm_eps,
          self.dtype,
          self.param_dtype,
          self.attention_implementation,
          name=f"merge_{s}",
        )
        x, grid = merge(x, grid)
    return classify(self, jnp.mean(layer_norm(self.norm_eps, self.dtype, "norm")(x), axis=1))


# Li & Zhang's Swin (GMM paper, Tables 1 and 2): patch 2 on 32x32, 4 on 64x64.
MODELS = smalldata_models(
  "swin",
  SwinTransformer,
  {"patch2_32": (32, {"patch_size": 2}), "patch4_64": (64, {"patch_size": 4})},
)
