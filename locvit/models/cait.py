"""CaiT for small datasets (Touvron et al. 2021), with GMM / ELM masks in its self-attention.

The configuration of Li & Zhang (GMM paper, Tables 1 and 4; official ``models/cait.py``): patch 4
on 32x32 (8 on 64x64), dim 192, 24 self-attention layers + 2 class-attention layers, 4 heads of 64
(inner width 256, Table 4's "hidden-dim 256"), MLP 384, talking heads, LayerScale, no qkv bias.
It has 9,020,618 parameters on CIFAR-10, Table 4's CaiT count.

- Self-attention (talking heads): ``softmax(mix_pre((q k^T / sqrt(d)) * M))``, then ``mix_post``;
  the mask ``M`` acts on the scaled logits before the pre-softmax head mixing.
  ``mix_pre`` and ``mix_post`` are ``(H, H)`` and start ``N(0, 1)`` as in the official code.
- LayerScale: init 0.1 for layers 1..18, 1e-5 for 19..24 and 1e-6 beyond, counted from 1 within
  each stack (the 2 class-attention layers get 0.1).
- Class attention: the class token attends to the patch tokens, with the query from
  ``LN(cls)`` and keys/values from the patch tokens as they leave the self-attention stack (not
  normalised and not including the class token -- the official code's form); unmasked.
- Drop path: the same rate in every layer (official).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from locvit.attention import projections
from locvit.attention.attention import Attention
from locvit.attention.core import LogitsHook, Term
from locvit.attention.geometry import TokenGrid
from locvit.attention.masks import MASK_KINDS, mask_terms
from locvit.attention.projections import partitioned
from locvit.models.layers import (
  BlockSettings,
  Mlp,
  block_settings,
  class_token,
  classify,
  embed_patches,
  layer_norm,
  learned_position_embedding,
  pre_norm_residual,
)
from locvit.models.smalldata import SmallDataBackbone, check_attention, smalldata_models
from locvit.platform.ops import cast_parameter, contract, cpu_kernels

Array = jax.Array
CAIT_ATTENTION = ("mhsa", *MASK_KINDS)


def layer_scale_init(layer: int) -> float:
  """The official LayerScale init for the ``layer``-th layer (1-based) of a stack."""
  if layer <= 18:
    return 0.1
  return 1e-5 if layer <= 24 else 1e-6


class TalkingHeadsAttention(Attention):
  """Talking-heads attention (Shazeer et al. 2020, as CaiT uses it): the shared ``Attention`` with
  CaiT's own projections and a ``LogitsHook``.

  Queries come from ``x`` through the kernel ``q`` ``(C, H, Dh)``, keys and values from
  ``context`` (default ``x``; the class attention's patch tokens) through ``kv``
  ``(C, 2, H, Dh)``, neither with a bias (the official layout, kept for checkpoints). The hook
  mixes heads before (``mix_pre``) and after (``mix_post``) the softmax. ``attention`` 'gmm' /
  'elm' multiplies (or adds) the mask into the scaled logits before the pre-softmax mixing; it
  needs ``context is None`` and the token ``grid``.
  """

  qkv_bias: bool = False
  attention: str = "mhsa"
  attention_kwargs: Mapping[str, Any] | None = None

  def __post_init__(self):
    if self.qkv_bias:
      raise ValueError("CaiT's q and kv kernels have no bias: qkv_bias must be False.")
    super().__post_init__()

  def _kernel(self, x: Array, shape: tuple[int, ...], names: tuple, name: str) -> Array:
    init = partitioned(self.kernel_init, ("embed", *names))
    kernel = self.param(name, init, (x.shape[-1], *shape), self.param_dtype)
    flatten = cpu_kernels(self.implementation)
    return contract(x.astype(self.dtype), cast_parameter(kernel, self.dtype), flatten=flatten)

  def _project(self, x: Array, context: Array | None) -> tuple[Array, Array, Array]:
    heads = self.num_heads
    head_dim = projections.head_dim(x.shape[-1], heads, self.head_dim)
    q = self._kernel(x, (heads, head_dim), ("heads", "kv"), "q")
    kv = self._kernel(
      x if context is None else context, (2, heads, head_dim), (None, "heads", "kv"), "kv"
    )
    return (q, *projections.split_projections(kv, self.implementation))

  def _terms(self, grid: TokenGrid | None) -> tuple[Term, ...]:
    if self.attention != "mhsa" and grid is None:
      raise ValueError("A CaiT mask applies to self-attention on a token grid only.")
    return mask_terms(
      self.attention, self.num_heads, grid, self.attention_kwargs, self.implementation
    )

  def _mix(self, name: str) -> Array:
    """An ``(H, H)`` head-mixing matrix, ``N(0, 1)`` at init as in the official code."""
    init = partitioned(nn.initializers.normal(1.0), ("heads", None))
    mix = self.param(name, init, (self.num_heads, self.num_heads), self.param_dtype)
    return mix.astype(jnp.float32)

  def _hook(self) -> LogitsHook:
    mix_pre, mix_post = self._mix("mix_pre"), self._mix("mix_post")
    return LogitsHook(
      before_softmax=lambda logits: jnp.einsum("bhnm,hg->bgnm", logits, mix_pre),
      after_softmax=lambda probs: jnp.einsum("bhnm,hg->bgnm", probs, mix_post),
    )


class CaiTLayer(BlockSettings):
  """``x + dp(gamma_1 * attn(LN(x), context))``, ``x + dp(gamma_2 * MLP(LN(x)))``."""

  num_heads: int
  head_dim: int
  mlp_dim: int
  layer: int  # 1-based index within its stack, for the LayerScale init

  def _scale(self, name: str, dim: int) -> Array:
    init = nn.initializers.constant(layer_scale_init(self.layer))
    return self.param(name, partitioned(init, ("embed",)), (dim,), self.param_dtype)

  @nn.compact
  def __call__(self, x: Array, context: Array | None = None, *, grid=None, train=False) -> Array:
    dim, rate = x.shape[-1], self.drop_path
    attn = TalkingHeadsAttention(
      self.num_heads,
      self.head_dim,
      attention=self.attention,
      attention_kwargs=self.attention_kwargs,
      **self.attention_fields(),
    )
    branch = lambda y: attn(y, context, grid=grid, train=train) * self._scale("gamma_1", dim)
    x = pre_norm_residual(self, x, "norm1", branch, rate=rate, train=train)
    mlp = Mlp(
      self.mlp_dim, self.drop, self.dtype, self.param_dtype, self.implementation, name="mlp"
    )
    branch = lambda y: mlp(y, train) * self._scale("gamma_2", dim)
    return pre_norm_residual(self, x, "norm2", branch, rate=rate, train=train)


class CaiT(SmallDataBackbone):
  """CaiT mapping NHWC images to logits.

  Attributes:
    num_classes: classifier width (0 returns the class token features).
    patch_size, embed_dim, depth, class_depth, num_heads, head_dim, mlp_dim: sizes.
    attention: 'mhsa', 'gmm' or 'elm' in the ``depth`` self-attention layers.
    attention_kwargs: per kind, the mask options, e.g. ``{'gmm': {'num_kernels': 5}}``.
    drop_rate, drop_path_rate: dropout and stochastic depth (same rate in every layer).
  """

  patch_size: int = 4
  embed_dim: int = 192
  depth: int = 24
  class_depth: int = 2
  num_heads: int = 4
  head_dim: int = 64
  mlp_dim: int = 384

  def check(self) -> None:
    """Validates the static configuration before tracing; raises ValueError naming the field and
    the valid choices (``create_model`` calls it)."""
    check_attention("CaiT", self.attention, self.attention_kwargs, CAIT_ATTENTION)

  def _layer(self, layer: int, name: str, attention: str = "mhsa") -> CaiTLayer:
    return CaiTLayer(
      self.num_heads,
      self.head_dim,
      self.mlp_dim,
      layer,
      drop_path=self.drop_path_rate,
      name=name,
      **block_settings(self, attention),
    )

  @nn.compact
  def __call__(self, images: Array, *, train: bool = False) -> Array:
    self.check()
    x, grid = embed_patches(self, images)
    x = learned_position_embedding(self, x)
    x = nn.Dropout(self.drop_rate)(x, deterministic=not train)
    for i in range(self.depth):
      x = self._layer(i + 1, f"blocks_{i}", self.attention)(x, grid=grid, train=train)
      self.sow("intermediates", f"block_{i}", x)
    cls = class_token(self, x.shape[0]).astype(x.dtype)
    for i in range(self.class_depth):
      cls = self._layer(i + 1, f"class_blocks_{i}")(cls, x, train=train)
    return classify(self, layer_norm(self.norm_eps, self.dtype, "norm")(cls[:, 0]))


# Li & Zhang's CaiT (GMM paper, Tables 1 and 4): patch 4 on 32x32, 8 on 64x64.
MODELS = smalldata_models(
  "cait", CaiT, {"patch4_32": (32, {"patch_size": 4}), "patch8_64": (64, {"patch_size": 8})}
)
