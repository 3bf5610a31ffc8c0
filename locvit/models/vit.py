"""ViT / DeiT backbone with a per-layer attention spec.

Dosovitskiy et al. 2021 (ViT); Touvron et al. 2021 (DeiT).

ConViT (d'Ascoli et al. 2021) is this backbone with ``gpsa`` attention in the first layers and the
class token inserted later (``class_token_layer``); the structured-initialization ViT uses fixed
sin-cos positions and global average pooling. Both are configurations of this one module.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import flax.linen as nn
import jax
import jax.numpy as jnp

from locvit.attention import list_attention
from locvit.choices import Errors
from locvit.models.layers import (
  Block,
  class_token,
  classifier_head,
  classify,
  drop_path_masks,
  embed_patches,
  layer_norm,
  learned_position_embedding,
  sincos_2d_position_embedding,
)

Array = jax.Array
POS_EMBED = ("learn", "sincos2d", "none")
POOL = ("token", "gap")
DROP_PATH_SCHEDULES = ("linear", "constant")
DISTILLED_INFERENCE = ("logits", "softmax")


class VisionTransformer(nn.Module):
  """Vision transformer mapping NHWC float images to logits.

  Attributes:
    num_classes: classifier width (0 returns pre-logits features).
    patch_size, embed_dim, depth, num_heads, head_dim, mlp_ratio, qkv_bias: the usual sizes;
      ``head_dim=None`` means ``embed_dim // num_heads``.
    pos_embed: 'learn' (trunc-normal 0.02), 'sincos2d' (fixed) or 'none'.
    pool: 'token' (class token) or 'gap' (mean over patch tokens followed by ``fc_norm``,
      as timm does for global pooling).
    class_token_layer: index of the block before which the class token is concatenated
      (0 = at the input, as in DeiT; 10 in ConViT). A learned ``pos_embed`` covers the class token
      only when it is inserted at the input (timm's DeiT layout).
    layer_attention: per-layer attention kinds, length ``depth``; None means 'mhsa' everywhere.
    attention_kwargs: per kind, extra constructor arguments, e.g. ``{'gpsa': {...}}``.
    attention_implementation: the kernel setting of every layer (``locvit.platform.ops``): None
    (resolved
      by ``create_model``: 'cpu_kernels' on CPU, JAX's choice elsewhere), 'xla', 'cudnn' or
      'cpu_kernels'.
    drop_rate, attn_drop_rate, drop_path_rate: dropout, attention dropout and stochastic depth.
    drop_path_schedule: 'linear' (block i drops at ``drop_path_rate * i / (depth - 1)``, 0 in the
      first block: timm's rule) or 'constant' (every branch of every block at ``drop_path_rate``:
      the GMM paper's official ViT, one ``DropPath(sd)`` module shared by all blocks).
    dtype: computation dtype (``jnp.bfloat16`` for mixed precision); parameters are float32.
    remat: rematerialise each block in the backward pass to save memory.
    distilled: add DeiT's distillation token (inserted with the class token, right after it) and
      its head ``head_dist`` (Touvron et al. 2021, Sec. 5; ConViT appendix B). The output combines
      the two heads as ``distilled_inference`` says, in training too (timm's fine-tuning of a
      distilled DeiT), except in training with ``distilled_training``.
    distilled_training: with ``distilled``, training returns ``(class_logits,
      distillation_logits)`` for the distillation loss (DeiT Eq. 2, 3); ``build_model`` sets it
      when ``config.distillation`` is on (timm's ``set_distilled_training``).
    distilled_inference: how a distilled model's output combines its two heads. 'logits':
      ``(class_logits + distillation_logits) / 2``, as the official DeiT code and timm do (the
      published DeiT numbers); 'softmax': ``log((softmax(class) + softmax(distillation)) / 2)``,
      the averaged softmaxes that the DeiT paper's text describes ("we add the softmax output by
      the two classifiers"), whose argmax and cross-entropy are those of the averaged prediction.
  """

  num_classes: int
  patch_size: int = 16
  embed_dim: int = 192
  depth: int = 12
  num_heads: int = 3
  head_dim: int | None = None
  mlp_ratio: float = 4.0
  qkv_bias: bool = True
  pos_embed: Literal["learn", "sincos2d", "none"] = "learn"
  pool: Literal["token", "gap"] = "token"
  class_token_layer: int = 0
  layer_attention: Sequence[str] | None = None
  attention_kwargs: Mapping[str, Mapping[str, Any]] | None = None
  attention_implementation: str | None = None
  drop_rate: float = 0.0
  attn_drop_rate: float = 0.0
  drop_path_rate: float = 0.0
  drop_path_schedule: Literal["linear", "constant"] = "linear"
  norm_eps: float = 1e-6
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  remat: bool = False
  distilled: bool = False
  distilled_training: bool = False
  distilled_inference: Literal["logits", "softmax"] = "logits"

  def check(self) -> None:
    """Validates the static configuration; called before tracing so errors are immediate."""
    if self.pos_embed not in POS_EMBED:
      raise ValueError(f"pos_embed={self.pos_embed!r} is not one of {POS_EMBED}.")
    if self.pool not in POOL:
      raise ValueError(f"pool={self.pool!r} is not one of {POOL}.")
    if self.drop_path_schedule not in DROP_PATH_SCHEDULES:
      raise ValueError(
        f"drop_path_schedule={self.drop_path_schedule!r} is not one of {DROP_PATH_SCHEDULES}."
      )
    if self.distilled_inference not in DISTILLED_INFERENCE:
      raise ValueError(
        f"distilled_inference={self.distilled_inference!r} is not one of {DISTILLED_INFERENCE}."
      )
    if self.distilled and (self.pool != "token" or not self.num_classes):
      raise ValueError(
        f"distilled=True needs pool='token' and num_classes > 0 (got pool={self.pool!r}, "
        f"num_classes={self.num_classes}): the distillation token has its own classifier head."
      )
    if self.distilled_training and not self.distilled:
      raise ValueError(
        "distilled_training=True needs distilled=True: only a distillation token's head gives the "
        "second output."
      )
    depth_errors = Errors()  # a new depth alone: both lines at once, and what to set
    if not 0 <= self.class_token_layer <= self.depth:
      depth_errors.add(f"class_token_layer={self.class_token_layer} must be in [0, {self.depth}].")
    if self.layer_attention is not None and len(self.layer_attention) != self.depth:
      depth_errors.add(
        f"layer_attention has {len(self.layer_attention)} entries for depth={self.depth}."
      )
    if depth_errors.messages:
      if self.layer_attention is None:
        depth_errors.add(
          f"depth and class_token_layer go together: give class_token_layer in [0, {self.depth}]."
        )
      else:
        convit = "gpsa" in self.layer_attention
        depth_errors.add(
          "depth, layer_attention (a kind per block) and class_token_layer go together: give "
          f"all three for depth={self.depth}"
          + (
            f" (for a ConViT, locvit.models.convit_overrides(local_up_to_layer, {self.depth}) "
            "returns the other two)."
            if convit
            else self._depth_example()
          )
        )
      depth_errors.raise_all()
    if self.layer_attention is not None:
      unknown = sorted(set(self.layer_attention) - set(list_attention()))
      if unknown:
        raise ValueError(f"Unknown attention kinds {unknown}. Valid kinds: {list_attention()}.")
    if self.head_dim is None and self.embed_dim % self.num_heads:
      raise ValueError(
        f"embed_dim={self.embed_dim} is not divisible by num_heads={self.num_heads}; "
        "set head_dim explicitly."
      )

  def _depth_example(self) -> str:
    """For one attention kind in every block: the values to give, as the command line takes
    them (``--config.model.overrides.layer_attention="('gmm', 'gmm')"``)."""
    if len(set(self.layer_attention)) != 1:
      return "."
    kinds = tuple(self.layer_attention[:1]) * self.depth
    return (
      f', e.g. layer_attention="{kinds}" class_token_layer='
      f"{min(self.class_token_layer, self.depth)} (as --config.model.overrides.FIELD=VALUE)."
    )

  def drop_path_rates(self) -> list[float]:
    """Each block's stochastic-depth rate under ``drop_path_schedule``."""
    if self.drop_path_schedule == "constant":
      return [self.drop_path_rate] * self.depth
    return [self.drop_path_rate * i / max(self.depth - 1, 1) for i in range(self.depth)]

  @property
  def num_prefix_tokens(self) -> int:
    """Tokens before the patches once the class (and distillation) tokens are in."""
    return (self.pool == "token") * (1 + self.distilled)

  def _add_class_token(self, x: Array) -> Array:
    names = ("cls_token", "dist_token") if self.distilled else ("cls_token",)
    tokens = [class_token(self, x.shape[0], name).astype(x.dtype) for name in names]
    return jnp.concatenate([*tokens, x], axis=1)

  def _distilled_output(self, x: Array, train: bool) -> Array | tuple[Array, Array]:
    logits = classifier_head(self.num_classes, self.dtype, self.param_dtype)(x[:, 0])
    dist_head = classifier_head(self.num_classes, self.dtype, self.param_dtype, name="head_dist")
    dist_logits = dist_head(x[:, 1])
    logits, dist_logits = logits.astype(jnp.float32), dist_logits.astype(jnp.float32)
    if train and self.distilled_training:
      return logits, dist_logits
    if self.distilled_inference == "logits":
      return (logits + dist_logits) / 2
    log_probs = jnp.stack([jax.nn.log_softmax(logits), jax.nn.log_softmax(dist_logits)])
    return jax.nn.logsumexp(log_probs, axis=0) - jnp.log(2.0)

  @nn.compact
  def __call__(self, images: Array, *, train: bool = False) -> Array:
    self.check()
    x, grid = embed_patches(self, images)
    use_cls = self.pool == "token"
    num_prefix = 0
    if use_cls and self.class_token_layer == 0:
      x = self._add_class_token(x)
      num_prefix = self.num_prefix_tokens

    if self.pos_embed == "learn":
      x = learned_position_embedding(self, x)
    elif self.pos_embed == "sincos2d":
      x = x.at[:, num_prefix:].add(
        sincos_2d_position_embedding(grid, self.embed_dim).astype(x.dtype)
      )
    x = nn.Dropout(self.drop_rate)(x, deterministic=not train)
    x = nn.with_logical_constraint(x, ("batch", "seq", "embed"))
    self.sow("intermediates", "tokens", x)

    # The grid, prefix count and train flag are Python values: static under remat (0 is self).
    block_cls = nn.remat(Block, static_argnums=(2, 3, 4)) if self.remat else Block
    kinds = self.layer_attention or ("mhsa",) * self.depth
    rates = self.drop_path_rates()
    keep = drop_path_masks(self, rates, x.shape[0], train)
    for i in range(self.depth):
      if use_cls and i == self.class_token_layer and i > 0:
        x = self._add_class_token(x)
        num_prefix = self.num_prefix_tokens
      x = block_cls(
        num_heads=self.num_heads,
        mlp_ratio=self.mlp_ratio,
        head_dim=self.head_dim,
        qkv_bias=self.qkv_bias,
        attention=kinds[i],
        attention_kwargs=(self.attention_kwargs or {}).get(kinds[i]),
        implementation=self.attention_implementation,
        drop=self.drop_rate,
        attn_drop=self.attn_drop_rate,
        drop_path=rates[i],
        norm_eps=self.norm_eps,
        dtype=self.dtype,
        param_dtype=self.param_dtype,
        name=f"blocks_{i}",
      )(x, grid, num_prefix, train, None if keep is None else keep[i])
      self.sow("intermediates", f"block_{i}", x)

    if use_cls and self.class_token_layer == self.depth:
      x = self._add_class_token(x)
    if self.distilled:
      x = layer_norm(self.norm_eps, self.dtype, "norm")(x)
      self.sow("intermediates", "pre_logits", x[:, :2])
      return self._distilled_output(x, train)
    if self.pool == "token":
      x = layer_norm(self.norm_eps, self.dtype, "norm")(x)[:, 0]
    else:
      x = layer_norm(self.norm_eps, self.dtype, "fc_norm")(jnp.mean(x[:, num_prefix:], axis=1))
    return classify(self, x)
