"""PiT for small datasets (Heo et al. 2021), with GMM / ELM masks on patch-to-patch logits.

The configuration of Li & Zhang (GMM paper, Table 1): patch 2 on 32x32 (4 on 64x64), dim 96,
three stages of depth (2, 6, 4) with (2, 4, 8) heads of 48, MLP ratio 2, no qkv bias, a class
token kept throughout, learned position embedding, the same drop path rate in every layer.
Between stages a pooling layer doubles the width: a depthwise 3x3 stride-2 convolution
(groups = dim, dim -> 2 dim) and a 1x1 convolution on the patch tokens, a Linear on the class
token. 6,972,586 parameters on CIFAR-10 (the paper's "7.0M").

The mask covers patch-to-patch logits only (the class token's row and column are left as they
are), and each stage has its own grid (16x16, 8x8, 4x4 at 32x32): one base table per stage.
Blocks are the shared ``Block``, so ``attention`` may be any registered kind that accepts a
prefix token ('mhsa', 'gmm', 'elm', ...).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from locvit.attention.geometry import TokenGrid
from locvit.attention.projections import partitioned, trunc_normal, zeros
from locvit.models import layers
from locvit.models.smalldata import (
  SmallDataBackbone,
  check_attention,
  check_stages,
  smalldata_models,
)
from locvit.platform.ops import promote_parameters

Array = jax.Array


class Pool(nn.Module):
  """PiT pooling: depthwise 3x3 stride 2 (C -> 2C) + 1x1 conv on patches, Linear on the class."""

  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: Array, grid: TokenGrid) -> tuple[Array, TokenGrid]:
    b, _, c = x.shape
    conv = functools.partial(
      nn.Conv,
      2 * c,
      dtype=self.dtype,
      param_dtype=self.param_dtype,
      promote_dtype=promote_parameters,
      kernel_init=partitioned(nn.initializers.lecun_normal(), (None, None, None, "embed")),
      bias_init=partitioned(zeros, ("embed",)),
    )
    tokens = x[:, 1:].reshape(b, grid.height, grid.width, c)
    tokens = conv((3, 3), strides=2, padding=1, feature_group_count=c, name="depthwise")(tokens)
    tokens = conv((1, 1), name="pointwise")(tokens)
    grid = TokenGrid(tokens.shape[1], tokens.shape[2])
    cls = nn.Dense(
      2 * c,
      dtype=self.dtype,
      param_dtype=self.param_dtype,
      promote_dtype=promote_parameters,
      kernel_init=partitioned(trunc_normal, ("embed", "mlp")),
      bias_init=partitioned(zeros, ("mlp",)),
      name="cls_fc",
    )(x[:, :1])
    return jnp.concatenate([cls, tokens.reshape(b, grid.num_tokens, 2 * c)], axis=1), grid


class PiT(SmallDataBackbone):
  """Pooling-based vision transformer mapping NHWC images to logits.

  Attributes:
    num_classes: classifier width (0 returns the class token features).
    patch_size, embed_dim, depths, num_heads, head_dim, mlp_ratio, qkv_bias: sizes; the width
      doubles at each pooling, ``head_dim`` stays.
    attention: attention kind in every block ('mhsa', 'gmm', 'elm', ...).
    attention_kwargs: per kind, extra options, e.g. ``{'gmm': {'num_kernels': 5}}``.
    drop_rate, attn_drop_rate, drop_path_rate: dropout, attention dropout, stochastic depth
      (same rate in every block, as the official code).
  """

  patch_size: int = 2
  embed_dim: int = 96
  depths: Sequence[int] = (2, 6, 4)
  num_heads: Sequence[int] = (2, 4, 8)
  head_dim: int = 48
  mlp_ratio: float = 2.0
  qkv_bias: bool = False
  attn_drop_rate: float = 0.0

  def check(self) -> None:
    """Validates the static configuration before tracing; raises ValueError naming the field and
    the valid choices (``create_model`` calls it)."""
    check_attention("PiT", self.attention, self.attention_kwargs)
    check_stages(self.depths, self.num_heads)

  @nn.compact
  def __call__(self, images: Array, *, train: bool = False) -> Array:
    self.check()
    x, grid = layers.embed_patches(self, images)
    x = layers.learned_position_embedding(
      self, jnp.concatenate([layers.class_token(self, x.shape[0]), x], 1)
    )
    x = nn.Dropout(self.drop_rate)(x, deterministic=not train)
    for s, (depth, heads) in enumerate(zip(self.depths, self.num_heads)):
      if s:
        x, grid = Pool(self.dtype, self.param_dtype, name=f"pool_{s - 1}")(x, grid)
      for i in range(depth):
        x = layers.Block(
          heads,
          self.mlp_ratio,
          self.head_dim,
          self.qkv_bias,
          attn_drop=self.attn_drop_rate,
          drop_path=self.drop_path_rate,
          name=f"stages_{s}_blocks_{i}",
          **layers.block_settings(self),
        )(x, grid=grid, num_prefix_tokens=1, train=train)
    return layers.classify(self, layers.layer_norm(self.norm_eps, self.dtype, "norm")(x[:, 0]))


# Li & Zhang's PiT (GMM paper, Table 1): patch 2 on 32x32, 4 on 64x64.
MODELS = smalldata_models(
  "pit", PiT, {"patch2_32": (32, {"patch_size": 2}), "patch4_64": (64, {"patch_size": 4})}
)
