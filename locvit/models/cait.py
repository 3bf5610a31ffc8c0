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

import functools
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from locvit.attention.core import LogitsHook, attend
from locvit.attention.geometry import TokenGrid
from locvit.attention.masks import (
  MASK_KINDS,
  mask_attention_kwargs,
  mask_terms,
  split_mask_options,
)
from locvit.attention.projections import output_projection, partitioned, trunc_normal
from locvit.models.layers import Mlp, PatchEmbed, classifier_head, drop_path, layer_norm
from locvit.models.registry import register_model
from locvit.ops import contract, cpu_kernels

Array = jax.Array
CAIT_ATTENTION = ("mhsa", *MASK_KINDS)


def layer_scale_init(layer: int) -> float:
  """The official LayerScale init for the ``layer``-th layer (1-based) of a stack."""
  if layer <= 18:
    return 0.1
  return 1e-5 if layer <= 24 else 1e-6


class TalkingHeadsAttention(nn.Module):
  """Talking-heads attention; queries from ``x``, keys/values from ``context`` (default ``x``).

  The attention core with a ``LogitsHook`` that mixes heads before (``mix_pre``) and after
  (``mix_post``) the softmax. ``attention`` 'gmm' / 'elm' multiplies (or adds) the mask into the
  scaled logits before the pre-softmax mixing; it needs ``context is None`` and the token ``grid``.
  """

  num_heads: int
  head_dim: int
  attention: str = "mhsa"
  attention_kwargs: Mapping[str, Any] | None = None
  proj_drop: float = 0.0
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  implementation: str | None = None

  def _project(self, x: Array, shape: tuple[int, ...], names: tuple, name: str) -> Array:
    kernel = self.param(
      name, partitioned(trunc_normal, ("embed", *names)), (x.shape[-1], *shape), self.param_dtype
    )
    flatten = cpu_kernels(self.implementation)
    return contract(x.astype(self.dtype), kernel.astype(self.dtype), flatten=flatten)

  def _mix(self, name: str) -> Array:
    """An ``(H, H)`` head-mixing matrix, ``N(0, 1)`` at init as in the official code."""
    init = partitioned(nn.initializers.normal(1.0), ("heads", None))
    mix = self.param(name, init, (self.num_heads, self.num_heads), self.param_dtype)
    return mix.astype(jnp.float32)

  @nn.compact
  def __call__(
    self,
    x: Array,
    context: Array | None = None,
    *,
    grid: TokenGrid | None = None,
    train: bool = False,
  ) -> Array:
    heads, dim = self.num_heads, x.shape[-1]
    q = self._project(x, (heads, self.head_dim), ("heads", "kv"), "q")
    kv = self._project(
      x if context is None else context, (2, heads, self.head_dim), (None, "heads", "kv"), "kv"
    )
    k, v = kv[:, :, 0], kv[:, :, 1]
    terms = ()
    if self.attention != "mhsa":
      if context is not None or grid is None:
        raise ValueError("A CaiT mask applies to self-attention on a token grid only.")
      terms = mask_terms(self.attention, heads, grid, self.attention_kwargs)
    mix_pre, mix_post = self._mix("mix_pre"), self._mix("mix_post")
    hook = LogitsHook(
      before_softmax=lambda logits: jnp.einsum("bhnm,hg->bgnm", logits, mix_pre),
      after_softmax=lambda probs: jnp.einsum("bhnm,hg->bgnm", probs, mix_post),
    )
    y = attend(self, q, k, v, terms=terms, hook=hook, train=train)
    out = output_projection(
      dim, implementation=self.implementation, dtype=self.dtype, param_dtype=self.param_dtype
    )(y)
    return nn.Dropout(self.proj_drop)(out, deterministic=not train)


class CaiTLayer(nn.Module):
  """``x + dp(gamma_1 * attn(LN(x), context))``, ``x + dp(gamma_2 * MLP(LN(x)))``."""

  num_heads: int
  head_dim: int
  mlp_dim: int
  layer: int  # 1-based index within its stack, for the LayerScale init
  attention: str = "mhsa"
  attention_kwargs: Mapping[str, Any] | None = None
  drop: float = 0.0
  drop_path: float = 0.0
  norm_eps: float = 1e-5
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  implementation: str | None = None

  def _scale(self, name: str, dim: int) -> Array:
    init = nn.initializers.constant(layer_scale_init(self.layer))
    return self.param(name, partitioned(init, ("embed",)), (dim,), self.param_dtype)

  @nn.compact
  def __call__(
    self,
    x: Array,
    context: Array | None = None,
    *,
    grid: TokenGrid | None = None,
    train: bool = False,
  ) -> Array:
    dim = x.shape[-1]
    y = layer_norm(self.norm_eps, self.dtype, "norm1")(x)
    y = TalkingHeadsAttention(
      self.num_heads,
      self.head_dim,
      self.attention,
      self.attention_kwargs,
      self.drop,
      self.dtype,
      self.param_dtype,
      self.implementation,
      name="attn",
    )(y, context, grid=grid, train=train)
    x = x + drop_path(self.drop_path)(y * self._scale("gamma_1", dim), deterministic=not train)
    y = layer_norm(self.norm_eps, self.dtype, "norm2")(x)
    y = Mlp(self.mlp_dim, self.drop, self.dtype, self.param_dtype, self.implementation, name="mlp")(
      y, train
    )
    return x + drop_path(self.drop_path)(y * self._scale("gamma_2", dim), deterministic=not train)


class CaiT(nn.Module):
  """CaiT mapping NHWC images to logits.

  Attributes:
    num_classes: classifier width (0 returns the class token features).
    patch_size, embed_dim, depth, class_depth, num_heads, head_dim, mlp_dim: sizes.
    attention: 'mhsa', 'gmm' or 'elm' in the ``depth`` self-attention layers.
    attention_kwargs: per kind, the mask options, e.g. ``{'gmm': {'num_kernels': 5}}``.
    drop_rate, drop_path_rate: dropout and stochastic depth (same rate in every layer).
  """

  num_classes: int
  patch_size: int = 4
  embed_dim: int = 192
  depth: int = 24
  class_depth: int = 2
  num_heads: int = 4
  head_dim: int = 64
  mlp_dim: int = 384
  attention: str = "mhsa"
  attention_kwargs: Mapping[str, Any] | None = None
  drop_rate: float = 0.0
  drop_path_rate: float = 0.1
  norm_eps: float = 1e-5
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  attention_implementation: str | None = None

  def check(self) -> None:
    """Validates the static configuration before tracing; raises ValueError naming the field and
    the valid choices (``create_model`` calls it)."""
    if self.attention not in CAIT_ATTENTION:
      raise ValueError(f"CaiT attention={self.attention!r} is not one of {CAIT_ATTENTION}.")
    if self.attention != "mhsa":
      split_mask_options(self.attention, (self.attention_kwargs or {}).get(self.attention))

  def _layer(self, layer: int, name: str, attention: str = "mhsa") -> CaiTLayer:
    return CaiTLayer(
      self.num_heads,
      self.head_dim,
      self.mlp_dim,
      layer,
      attention,
      (self.attention_kwargs or {}).get(attention),
      self.drop_rate,
      self.drop_path_rate,
      self.norm_eps,
      self.dtype,
      self.param_dtype,
      self.attention_implementation,
      name=name,
    )

  @nn.compact
  def __call__(self, images: Array, *, train: bool = False) -> Array:
    self.check()
    x, grid = PatchEmbed(
      self.patch_size,
      self.embed_dim,
      self.dtype,
      self.param_dtype,
      self.attention_implementation,
      name="patch_embed",
    )(images.astype(self.dtype))
    pos = self.param(
      "pos_embed",
      partitioned(trunc_normal, (None, None, "embed")),
      (1, *x.shape[1:]),
      self.param_dtype,
    )
    x = nn.Dropout(self.drop_rate)(x + pos.astype(x.dtype), deterministic=not train)
    for i in range(self.depth):
      x = self._layer(i + 1, f"blocks_{i}", self.attention)(x, grid=grid, train=train)
      self.sow("intermediates", f"block_{i}", x)
    cls = self.param(
      "cls_token", partitioned(trunc_normal, (None, None, "embed")), (1, 1, self.embed_dim)
    )
    cls = jnp.broadcast_to(cls.astype(x.dtype), (x.shape[0], 1, self.embed_dim))
    for i in range(self.class_depth):
      cls = self._layer(i + 1, f"class_blocks_{i}")(cls, x, train=train)
    cls = layer_norm(self.norm_eps, self.dtype, "norm")(cls[:, 0])
    self.sow("intermediates", "pre_logits", cls)
    if not self.num_classes:
      return cls
    logits = classifier_head(self.num_classes, self.dtype, self.param_dtype)(cls)
    return logits.astype(jnp.float32)


def cait_smalldata(num_classes: int, *, patch_size: int, mask: str | None) -> CaiT:
  """Li & Zhang's CaiT (GMM paper, Tables 1 and 4): dim 192, 24 self-attention + 2 class-attention
  layers, 4 heads of 64, MLP 384, drop path 0.1; ``mask`` None (plain talking-heads attention) or
  'gmm' / 'elm' in every self-attention layer with ``mask_attention_kwargs`` defaults (K = 5).

  Registered as ``{gmm_}cait_smalldata_patch4_32`` and ``..._patch8_64``.
  """
  return CaiT(
    num_classes=num_classes,
    patch_size=patch_size,
    attention=mask or "mhsa",
    attention_kwargs=mask_attention_kwargs(mask) if mask else None,
  )


for _patch, _res in ((4, 32), (8, 64)):
  for _mask in (None, "gmm"):
    register_model(
      f"{_mask + '_' if _mask else ''}cait_smalldata_patch{_patch}_{_res}", image_size=_res
    )(functools.partial(cait_smalldata, patch_size=_patch, mask=_mask))
