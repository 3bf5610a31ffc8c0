"""The attention-only CIFAR network of Cordonnier, Loukas & Jaggi (ICLR 2020).

A reimplementation of ``BertImage`` from epfml/attention-cnn (see the shared notes, section 2):

- 2x2 space-to-depth ("invertible downsampling", Jacobsen et al. 2018): 32x32x3 -> 16x16x12 with
  channel index ``dr * (2 * 3) + dc * 3 + ch``; then ``embed = Linear(12 -> hidden)``. No positional
  encoding on the input and no class token.
- ``depth`` post-LN BERT layers (LayerNorm eps 1e-12, eps inside the square root):
  ``a = LN(dropout(dense(attn(x))) + x)``, ``out = LN(dropout(dense2(gelu(dense1(a)))) + a)``,
  exact (erf) GELU.
- mean over all positions, then ``head = Linear(hidden, classes)``.
- every Linear uses PyTorch's default init (kaiming-uniform weight, uniform bias), as the
  reference does.

``attn`` is a registered attention kind ('quadratic', 'quadratic_generalized', 'learned_relative',
or any other kind with the same call signature), built with ``layout='reference'`` by default:
values are the raw inputs, heads are concatenated and one ``value`` projection ``(H, D, D)``
follows (Dh = Dout). That layout gives the paper's sizes: 12.1M parameters for 'quadratic',
12.3M for 'learned_relative', 29.6M for learned + content (the paper prints 29.5M), 9.7M after
pruning 15 heads. ``layout='standard'`` uses the library's q/k/v ``Attention`` module instead.

Registered models (image size 32, 9 heads, hidden 400, MLP 512, depth 6, dropout 0.1):

  cordonnier_sa                   quadratic (isotropic Gaussian) positional attention, Table 1
  cordonnier_sa_generalized       generalized (non-isotropic) quadratic, Table 4
  cordonnier_sa_16heads           quadratic with 16 heads, appendix F
  cordonnier_sa_learned           learned 2-D relative encoding, positional only, Table 1
  cordonnier_sa_learned_content   learned 2-D relative encoding + content, Table 1

A pruned model (appendix E) is any of these with ``layer_heads=(...)`` (see
``locvit.analysis.pruning``).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import flax.linen as nn
import jax
import jax.numpy as jnp

from locvit.attention import TokenGrid, get_attention, list_attention
from locvit.attention.projections import (
  partitioned,
  torch_linear_bias_init,
  torch_linear_kernel_init,
  zeros,
)
from locvit.attention.relative import LAYOUTS
from locvit.models.layers import dense, gelu

Array = jax.Array


def space_to_depth(images: Array, block: int = 2) -> Array:
  """``(B, H, W, C) -> (B, H/b, W/b, b*b*C)`` with channel index ``dr * (b * C) + dc * C + ch``."""
  batch, height, width, channels = images.shape
  if height % block or width % block:
    raise ValueError(
      f"Space-to-depth with block {block} needs image sides divisible by {block}, got "
      f"{height}x{width}. Valid sizes are multiples of {block} "
      f"(e.g. {block * (height // block)} or {block * (height // block + 1)})."
    )
  x = images.reshape(batch, height // block, block, width // block, block, channels)
  x = jnp.transpose(x, (0, 1, 3, 2, 4, 5))  # (B, h, w, dr, dc, ch)
  return x.reshape(batch, height // block, width // block, block * block * channels)


def torch_dense(
  features: int,
  fan_in: int,
  names: tuple[str | None, str | None],
  name: str,
  dtype: Any,
  param_dtype: Any,
  implementation: str | None,
) -> nn.Dense:
  """``nn.Dense`` with PyTorch's default Linear init."""
  inits = dict(kernel_init=torch_linear_kernel_init, bias_init=torch_linear_bias_init(fan_in))
  return dense(features, names, name, dtype, param_dtype, implementation, **inits)


def bert_layer_norm(eps: float, dtype: Any, name: str) -> nn.LayerNorm:
  """BertLayerNorm: ``(x - mean) / sqrt(var + eps)`` with the two-pass variance (eps 1e-12)."""
  return nn.LayerNorm(
    epsilon=eps,
    dtype=dtype,
    use_fast_variance=False,
    scale_init=partitioned(nn.initializers.ones, ("embed",)),
    bias_init=partitioned(zeros, ("embed",)),
    name=name,
  )


class PostNormLayer(nn.Module):
  """One BERT layer: ``a = LN(drop(dense(attn(x))) + x)``; ``LN(drop(fc2(gelu(fc1(a)))) + a)``."""

  num_heads: int
  mlp_dim: int = 512
  attention: str = "quadratic"
  attention_kwargs: Mapping[str, Any] | None = None
  drop: float = 0.1
  attn_drop: float = 0.1
  norm_eps: float = 1e-12
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  implementation: str | None = None

  @nn.compact
  def __call__(self, x: Array, *, grid: TokenGrid, train: bool = False) -> Array:
    dim = x.shape[-1]
    settings = dict(dtype=self.dtype, param_dtype=self.param_dtype)
    dense = functools.partial(torch_dense, **settings, implementation=self.implementation)
    attn = get_attention(self.attention)(
      num_heads=self.num_heads,
      attn_drop=self.attn_drop,
      proj_drop=0.0,  # the reference's dropout comes after its own dense, below
      implementation=self.implementation,
      dtype=self.dtype,
      param_dtype=self.param_dtype,
      name="attn",
      **dict(self.attention_kwargs or {}),
    )
    a = attn(x, grid=grid, train=train)
    a = dense(dim, a.shape[-1], (None, "embed"), "attn_dense")(a)
    a = nn.Dropout(self.drop)(a, deterministic=not train)
    a = bert_layer_norm(self.norm_eps, self.dtype, "attn_norm")(a + x)
    h = dense(self.mlp_dim, dim, ("embed", "mlp"), "mlp_dense1")(a)
    h = gelu(h)
    h = dense(dim, self.mlp_dim, ("mlp", "embed"), "mlp_dense2")(h)
    h = nn.Dropout(self.drop)(h, deterministic=not train)
    out = bert_layer_norm(self.norm_eps, self.dtype, "mlp_norm")(h + a)
    return nn.with_logical_constraint(out, ("batch", "seq", "embed"))


class CordonnierNet(nn.Module):
  """Attention-only image classifier of Cordonnier et al. (``BertImage``), NHWC images -> logits.

  Attributes:
    num_classes: classifier width (0 returns the pooled features).
    hidden_dim: model width D (400).
    depth: number of layers (6).
    num_heads: heads per layer (9; 16 in appendix F).
    layer_heads: per-layer head counts, overriding ``num_heads`` (pruned models, appendix E).
    mlp_dim: intermediate width (512).
    downsample: space-to-depth block (2).
    attention: attention kind of every layer ('quadratic', 'quadratic_generalized',
      'learned_relative', or any registered kind).
    layer_attention: per-layer kinds, overriding ``attention``.
    content: add content-based logits to the positional ones (``learned + content``).
    layout: 'reference' (the paper code's parameterisation, default) or 'standard' (q/k/v
      ``Attention``); passed to the relative kinds only.
    attention_kwargs: per kind, extra constructor arguments, e.g.
      ``{'quadratic': {'center_init_std': 1.0}}``.
    drop_rate, attn_drop_rate: hidden and attention-probability dropout (0.1 and 0.1).
    norm_eps: LayerNorm epsilon (1e-12, BERT's).
    attention_implementation: the kernel setting of every layer (``locvit.platform.ops``; None is
      resolved by ``create_model``: 'cpu_kernels' on CPU, JAX's choice elsewhere).
    dtype: computation dtype; parameters are ``param_dtype``. Positional logits and softmaxes are
      float32.
  """

  num_classes: int
  hidden_dim: int = 400
  depth: int = 6
  num_heads: int = 9
  layer_heads: Sequence[int] | None = None
  mlp_dim: int = 512
  downsample: int = 2
  attention: str = "quadratic"
  layer_attention: Sequence[str] | None = None
  content: bool = False
  layout: Literal["reference", "standard"] = "reference"
  attention_kwargs: Mapping[str, Mapping[str, Any]] | None = None
  drop_rate: float = 0.1
  attn_drop_rate: float = 0.1
  norm_eps: float = 1e-12
  attention_implementation: str | None = None
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32

  def heads_per_layer(self) -> tuple[int, ...]:
    """Heads of each of the ``depth`` layers: ``layer_heads`` if set, else ``num_heads``."""
    if self.layer_heads is None:
      return (self.num_heads,) * self.depth
    return tuple(int(h) for h in self.layer_heads)

  def kinds(self) -> tuple[str, ...]:
    """Attention kind of each layer: ``layer_attention`` if set, else ``attention``."""
    return tuple(self.layer_attention or (self.attention,) * self.depth)

  def check(self) -> None:
    """Validates the static configuration before tracing."""
    if self.layer_heads is not None:
      if len(self.layer_heads) != self.depth:
        raise ValueError(
          f"layer_heads has {len(self.layer_heads)} entries for depth={self.depth}: "
          f"{tuple(self.layer_heads)}."
        )
      if any(int(h) < 1 for h in self.layer_heads):
        raise ValueError(f"layer_heads must all be >= 1, got {tuple(self.layer_heads)}.")
    if self.layer_attention is not None and len(self.layer_attention) != self.depth:
      raise ValueError(
        f"layer_attention has {len(self.layer_attention)} entries for depth={self.depth}."
      )
    unknown = sorted(set(self.kinds()) - set(list_attention()))
    if unknown:
      raise ValueError(f"Unknown attention kinds {unknown}. Valid kinds: {list_attention()}.")
    if self.layout not in LAYOUTS:
      raise ValueError(f"layout={self.layout!r} is not one of {LAYOUTS}.")
    if self.downsample < 1:
      raise ValueError(f"downsample={self.downsample} must be >= 1.")

  def _layer_kwargs(self, kind: str) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    if kind in ("quadratic", "quadratic_generalized", "learned_relative"):
      kwargs.update(layout=self.layout, content=self.content)
      if self.layout == "standard":
        kwargs["head_dim"] = self.hidden_dim  # Dh = Dout, as the paper advises
        if kind == "learned_relative":
          kwargs["embed_dim"] = self.hidden_dim  # D_p = D_out (the reference layout's default)
    kwargs.update(dict((self.attention_kwargs or {}).get(kind) or {}))
    return kwargs

  @nn.compact
  def __call__(self, images: Array, *, train: bool = False) -> Array:
    self.check()
    x = space_to_depth(images.astype(self.dtype), self.downsample)
    batch, height, width, channels = x.shape
    grid = TokenGrid(height, width)
    x = x.reshape(batch, grid.num_tokens, channels)
    settings = (self.dtype, self.param_dtype, self.attention_implementation)
    x = torch_dense(self.hidden_dim, channels, (None, "embed"), "embed", *settings)(x)
    x = nn.with_logical_constraint(x, ("batch", "seq", "embed"))
    self.sow("intermediates", "tokens", x)
    for i, (heads, kind) in enumerate(zip(self.heads_per_layer(), self.kinds())):
      x = PostNormLayer(
        num_heads=heads,
        mlp_dim=self.mlp_dim,
        attention=kind,
        attention_kwargs=self._layer_kwargs(kind),
        drop=self.drop_rate,
        attn_drop=self.attn_drop_rate,
        norm_eps=self.norm_eps,
        dtype=self.dtype,
        param_dtype=self.param_dtype,
        implementation=self.attention_implementation,
        name=f"layers_{i}",
      )(x, grid=grid, train=train)
      self.sow("intermediates", f"layer_{i}", x)
    x = jnp.mean(x, axis=1)
    self.sow("intermediates", "pre_logits", x)
    if not self.num_classes:
      return x
    names = ("embed", "classes")
    logits = torch_dense(self.num_classes, self.hidden_dim, names, "head", *settings)(x)
    return logits.astype(jnp.float32)


# name -> (attention kind, content, heads)
CORDONNIER_MODELS = {
  "cordonnier_sa": ("quadratic", False, 9),
  "cordonnier_sa_generalized": ("quadratic_generalized", False, 9),
  "cordonnier_sa_16heads": ("quadratic", False, 16),
  "cordonnier_sa_learned": ("learned_relative", False, 9),
  "cordonnier_sa_learned_content": ("learned_relative", True, 9),
}


def cordonnier(num_classes: int, *, attention: str, content: bool, heads: int) -> CordonnierNet:
  """Cordonnier et al.'s attention-only CIFAR network (Sec. 4.1; appendix B, Table 2): 6 layers,
  hidden 400, MLP 512, ``heads`` heads of the ``attention`` kind per layer (content logits if
  ``content``), 2x2 space-to-depth input, dropout 0.1, reference layout. ``CORDONNIER_MODELS``
  lists the registered names (Tables 1 and 4, appendix F).
  """
  return CordonnierNet(
    num_classes=num_classes, attention=attention, content=content, num_heads=heads
  )


# name -> (build(num_classes), image size); the Table 1 ResNet baseline is in ``resnet``.
MODELS = {
  name: (functools.partial(cordonnier, attention=kind, content=content, heads=heads), 32)
  for name, (kind, content, heads) in CORDONNIER_MODELS.items()
}
