"""T2T-ViT for small datasets (Yuan et al. 2021), with GMM / ELM masks in every attention.

The configuration of Li & Zhang (GMM paper, Table 1; official ``models/t2t.py``):

- Tokens-to-token stem: soft split (unfold 3x3, stride 2, padding 1), then ``num_t2t`` token
  transformers each followed by another soft split, then a Linear to ``embed_dim``. At 32x32:
  32x32 -> 16x16 tokens of 27 -> token transformer -> 8x8 tokens of 64 * 9 -> 256. At 64x64 there
  are two token transformers (32x32 then 16x16 tokens).
- Token transformer (T2T's ``Token_transformer``): 1 head of ``token_dim`` = 64, no qkv bias,
  the logits scaled by ``in_dim ** -0.5`` of its *input* width (27 or 576, as the reference),
  a skip from ``v`` (the input and output widths differ), then ``x + MLP(LN(x))`` with MLP
  ratio 1. The mask acts here too (one head, 16x16 tokens at 32x32; with the faithful kernel the
  far entries of that grid are exactly 0, see ``locvit.attention.masks``).
- Backbone: 12 blocks, embed 256, 4 heads, MLP ratio 2, no qkv bias, the fixed 1-D sinusoid
  position table of the reference, no class token, mean pooling, drop path linear to 0.1.
  ``attention_skip`` (default True, the reference's behaviour): its attention also adds the
  normalised input, ``x + dp(attn(LN(x)) + LN(x))``.

Not reproduced: the reference's unused ``cls_token`` (256) and stem ``norm`` (2 x 576)
parameters. 6,484,672 parameters on CIFAR-10 (the paper's "6.5M").
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from locvit.attention.attention import Attention
from locvit.attention.geometry import TokenGrid
from locvit.attention.masks import mask_terms
from locvit.models.layers import (
  BlockSettings,
  Mlp,
  block_settings,
  classify,
  dense,
  layer_norm,
  mlp_residual,
  pre_norm_residual,
)
from locvit.models.smalldata import SmallDataBackbone, check_attention, smalldata_models

Array = jax.Array


def sinusoid_table(num_tokens: int, dim: int) -> np.ndarray:
  """The 1-D sinusoid table ``(N, dim)``: ``pos / 10000^(2 (j // 2) / dim)``, sin even, cos odd."""
  position = np.arange(num_tokens, dtype=np.float64)[:, None]
  j = np.arange(dim)
  angle = position / np.power(10000.0, 2 * (j // 2) / dim)[None]
  return np.where(j % 2 == 0, np.sin(angle), np.cos(angle)).astype(np.float32)


def soft_split(x: Array) -> tuple[Array, TokenGrid]:
  """Unfold 3x3 / stride 2 / padding 1: (B, H, W, C) -> (B, N, C * 9), channel-major features."""
  patches = jax.lax.conv_general_dilated_patches(
    x, (3, 3), (2, 2), ((1, 1), (1, 1)), dimension_numbers=("NHWC", "HWIO", "NHWC")
  )
  b, h, w, f = patches.shape
  return patches.reshape(b, h * w, f), TokenGrid(h, w)


class TokenTransformer(BlockSettings):
  """T2T's token transformer: 1-head attention with a ``v`` skip, then ``x + MLP(LN(x))``; no
  dropout (as the reference)."""

  token_dim: int = 64
  mlp_ratio: float = 1.0

  @nn.compact
  def __call__(self, x: Array, *, grid: TokenGrid, train: bool = False) -> Array:
    attn = Attention(
      1,
      head_dim=self.token_dim,
      qkv_bias=False,
      out_dim=self.token_dim,
      scale=x.shape[-1] ** -0.5,  # the reference scales by its input width, not token_dim
      value_skip=True,  # the widths differ, so the residual is v
      implementation=self.implementation,
      dtype=self.dtype,
      param_dtype=self.param_dtype,
    )
    nn.share_scope(self, attn)  # qkv / proj / mask stay t2t_i's parameters (checkpoints)
    terms = mask_terms(self.attention, 1, grid, self.attention_kwargs, self.implementation)
    x = attn(layer_norm(self.norm_eps, self.dtype, "norm1")(x), grid=grid, terms=terms, train=train)
    hidden = int(self.token_dim * self.mlp_ratio)
    mlp = Mlp(hidden, 0.0, self.dtype, self.param_dtype, self.implementation, name="mlp")
    # Written out: pre_norm_residual's (rate 0) Dropout would clash with attn's in the shared scope.
    return x + mlp(layer_norm(self.norm_eps, self.dtype, "norm2")(x), train)


class T2TBlock(BlockSettings):
  """Pre-norm block; with ``attention_skip`` the attention branch also adds ``LN(x)``."""

  num_heads: int
  mlp_ratio: float = 2.0
  attention_skip: bool = True

  @nn.compact
  def __call__(self, x: Array, *, grid: TokenGrid, train: bool = False) -> Array:
    attn = self.registered_attention(num_heads=self.num_heads, head_dim=None, qkv_bias=False)

    def branch(y: Array) -> Array:
      a = attn(y, grid=grid, num_prefix_tokens=0, train=train)
      return a + y if self.attention_skip else a

    x = pre_norm_residual(self, x, "norm1", branch, rate=self.drop_path, train=train)
    hidden = int(x.shape[-1] * self.mlp_ratio)
    return mlp_residual(self, x, hidden, rate=self.drop_path, train=train)


class T2TViT(SmallDataBackbone):
  """T2T-ViT mapping NHWC images to logits.

  Attributes:
    num_classes: classifier width (0 returns pooled features).
    embed_dim, depth, num_heads, mlp_ratio, token_dim: backbone and token-transformer sizes.
    num_t2t: token transformers in the stem (1 at 32x32, 2 at 64x64 in the reference).
    attention: attention kind of the backbone blocks ('mhsa', 'gmm', 'elm', ...); with 'gmm' or
      'elm' the token transformers get the same mask kind (one head each).
    attention_kwargs: per kind, extra options, e.g. ``{'gmm': {'num_kernels': 5}}``.
    attention_skip: the reference's extra ``LN(x)`` skip in the backbone attention.
    drop_rate, attn_drop_rate, drop_path_rate: dropout, attention dropout, stochastic depth.
  """

  embed_dim: int = 256
  depth: int = 12
  num_heads: int = 4
  mlp_ratio: float = 2.0
  token_dim: int = 64
  num_t2t: int = 1
  attention_skip: bool = True
  attn_drop_rate: float = 0.0

  def check(self) -> None:
    """Validates the static configuration before tracing; raises ValueError naming the field and
    the valid choices (``create_model`` calls it)."""
    check_attention("T2T", self.attention, self.attention_kwargs)
    if self.num_t2t < 0:
      raise ValueError(f"num_t2t={self.num_t2t} must be >= 0.")

  @nn.compact
  def __call__(self, images: Array, *, train: bool = False) -> Array:
    self.check()
    x, grid = soft_split(images.astype(self.dtype))
    for i in range(self.num_t2t):
      x = TokenTransformer(self.token_dim, name=f"t2t_{i}", **block_settings(self))(
        x, grid=grid, train=train
      )
      x, grid = soft_split(x.reshape(x.shape[0], grid.height, grid.width, self.token_dim))
    settings = (self.dtype, self.param_dtype, self.attention_implementation)
    x = dense(self.embed_dim, (None, "embed"), "project", *settings)(x)
    x = x + jnp.asarray(sinusoid_table(grid.num_tokens, self.embed_dim), x.dtype)
    x = nn.Dropout(self.drop_rate)(x, deterministic=not train)
    rates = np.linspace(0.0, self.drop_path_rate, self.depth)
    for i in range(self.depth):
      x = T2TBlock(
        self.num_heads,
        self.mlp_ratio,
        self.attention_skip,
        attn_drop=self.attn_drop_rate,
        drop_path=float(rates[i]),
        name=f"blocks_{i}",
        **block_settings(self),
      )(x, grid=grid, train=train)
      self.sow("intermediates", f"block_{i}", x)
    return classify(self, jnp.mean(layer_norm(self.norm_eps, self.dtype, "norm")(x), axis=1))


# Li & Zhang's T2T-ViT (GMM paper, Table 1): one token transformer at 32x32, two at 64x64.
MODELS = smalldata_models("t2t", T2TViT, {"32": (32, {"num_t2t": 1}), "64": (64, {"num_t2t": 2})})
