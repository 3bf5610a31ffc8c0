"""Multi-head self-attention: the seam every paper's attention variant plugs into.

The four mechanisms differ only in how a positional table ``P`` of shape ``(H, N, N)`` (no batch
dimension) enters the attention:

- ``combine='add'``: ``softmax(q k^T / sqrt(d) + P)`` -- relative positional logits
  (Cordonnier et al., Eq. 8 / 9). Routed through ``dot_product_attention(bias=...)``.
- ``combine='multiply'``: ``softmax((q k^T / sqrt(d)) * P)`` -- the GMM / ELM masks as the
  official code applies them. No fused kernel can express this, so it runs explicitly.
- ``combine='replace'``: ``softmax(P)`` -- positional-only attention; ``P V`` is computed without
  materialising a per-example attention matrix.

``P`` covers patch tokens only. Prefix tokens (the class token) get a neutral entry: 0 for ``add``,
1 for ``multiply``; ``replace`` attention does not support prefix tokens.

Attention maps are materialised only when the caller asks for intermediates
(``model.apply(..., mutable=['intermediates'])``); otherwise ``dot_product_attention`` is used
(``softmax_attention.py``: JAX's kernel, or the explicit form with a hand-written backward pass).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal

import flax.linen as nn
import jax
import jax.numpy as jnp

from locvit.attention.geometry import TokenGrid
from locvit.attention.softmax_attention import IMPLEMENTATIONS, dot_product_attention
from locvit.ops import contract

Array = jax.Array
Combine = Literal["add", "multiply", "replace"]
COMBINE_RULES = ("add", "multiply", "replace")


# Inits shared across the library; timm's ViT uses trunc-normal(0.02) weights and zero biases.
trunc_normal = nn.initializers.truncated_normal(0.02)
zeros = nn.initializers.zeros


def partitioned(init: Callable, names: tuple[str | None, ...]) -> Callable:
  """Shorthand for ``nn.with_logical_partitioning``: names are logical axes, see sharding.py."""
  return nn.with_logical_partitioning(init, names)


def embed_prefix(table: Array, num_prefix_tokens: int, fill: float) -> Array:
  """Pads an ``(H, N, N)`` patch-token table with ``fill`` rows/columns for prefix tokens."""
  if num_prefix_tokens == 0:
    return table
  pad = ((0, 0), (num_prefix_tokens, 0), (num_prefix_tokens, 0))
  return jnp.pad(table, pad, constant_values=fill)


def record_attention(module: nn.Module, probs: Array) -> None:
  """Stores attention probabilities as an intermediate (only when the caller collects them)."""
  module.sow("intermediates", "attention", probs)


def wants_attention_maps(module: nn.Module) -> bool:
  """True when the caller collects intermediates, so attention maps must be materialised."""
  return module.is_mutable_collection("intermediates")


def flat_init(init: Callable, num_in_axes: int = 1) -> Callable:
  """Runs ``init`` on the flat ``(prod(in), prod(out))`` shape, as ``nn.DenseGeneral`` does, then
  reshapes: fan-in based and identity inits see the matrix a PyTorch Linear would."""

  def wrapped(key, shape, dtype=jnp.float32):
    flat = (math.prod(shape[:num_in_axes]), math.prod(shape[num_in_axes:]))
    return jnp.reshape(init(key, flat, dtype), shape)

  return wrapped


class DenseGeneral(nn.Module):
  """A projection from the last axis to ``features`` with the kernel stored at full rank.

  Unlike ``nn.DenseGeneral`` (whose kernel is created flat and reshaped), logical partitioning
  then also works when a model is initialised inside a mesh context.

  Attributes:
    features: output shape, e.g. ``(3, H, Dh)`` for a fused qkv projection.
    kernel_axes: logical axis names of the kernel ``(in, *features)``.
  """

  features: tuple[int, ...]
  kernel_axes: tuple[str | None, ...]
  use_bias: bool = True
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  kernel_init: Callable = trunc_normal

  @nn.compact
  def __call__(self, x: Array) -> Array:
    shape = (x.shape[-1], *self.features)
    kernel = self.param(
      "kernel",
      partitioned(flat_init(self.kernel_init), self.kernel_axes),
      shape,
      self.param_dtype,
    )
    y = contract(x.astype(self.dtype), kernel.astype(self.dtype))
    if self.use_bias:
      bias = self.param(
        "bias", partitioned(zeros, self.kernel_axes[1:]), self.features, self.param_dtype
      )
      y = y + bias.astype(self.dtype)
    return y


def QKVProjection(  # noqa: N802  (builds a module; reads like one at call sites)
  num_heads: int,
  head_dim: int,
  use_bias: bool = True,
  dtype: Any = jnp.float32,
  param_dtype: Any = jnp.float32,
  kernel_init: Callable = trunc_normal,
  name: str | None = None,
) -> DenseGeneral:
  """Fused query/key/value projection, kernel ``(C, 3, H, Dh)`` (timm's ``qkv``, reshaped)."""
  axes = ("embed", None, "heads", "kv")
  return DenseGeneral(
    (3, num_heads, head_dim), axes, use_bias, dtype, param_dtype, kernel_init, name=name
  )


class OutputProjection(nn.Module):
  """Merges heads: kernel ``(H, Dh, C)`` and bias ``(C,)``."""

  features: int
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  kernel_init: Callable = trunc_normal

  @nn.compact
  def __call__(self, y: Array) -> Array:
    kernel = self.param(
      "kernel",
      partitioned(flat_init(self.kernel_init, num_in_axes=2), ("heads", "kv", "embed")),
      (*y.shape[-2:], self.features),
      self.param_dtype,
    )
    bias = self.param("bias", partitioned(zeros, ("embed",)), (self.features,), self.param_dtype)
    out = contract(y.astype(self.dtype), kernel.astype(self.dtype), num_contracting=2)
    return out + bias.astype(self.dtype)


class Attention(nn.Module):
  """Multi-head self-attention with an optional positional term.

  Without one: ``softmax(q k^T / sqrt(Dh)) v`` per head, heads merged by the output projection
  (ConViT Eqs. 1-3). With one, ``combine`` selects Cordonnier et al.'s relative logits
  ('add', Eq. 8), Li & Zhang's masks ('multiply', Eq. 9) or positional-only attention ('replace',
  Cordonnier et al. Secs. 4.2-4.3); see the module docstring.

  Attributes:
    num_heads: number of heads H.
    head_dim: per-head width; ``None`` means ``dim // num_heads``. Cordonnier et al.'s exact
      reparametrisation uses ``head_dim = dim`` (Dh = Dout).
    qkv_bias: bias on the query/key/value projections.
    attn_drop: dropout on the attention probabilities (forces the explicit path when training).
    proj_drop: dropout after the output projection.
    positional: optional Linen module called as ``positional(grid)`` returning an ``(H, N, N)``
      table over the patch tokens.
    combine: how the positional table enters (see module docstring).
    implementation: attention backend (``softmax_attention.dot_product_attention``): None
      ('einsum' on CPU, JAX's choice elsewhere), 'xla', 'cudnn' (GPU, bf16/fp16 only) or 'einsum'.
    dtype: computation dtype (bf16 for mixed precision); parameters stay ``param_dtype``.
  """

  num_heads: int
  head_dim: int | None = None
  qkv_bias: bool = True
  attn_drop: float = 0.0
  proj_drop: float = 0.0
  positional: nn.Module | None = None
  combine: Combine = "add"
  implementation: str | None = None
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  kernel_init: Callable = trunc_normal

  def _head_dim(self, dim: int) -> int:
    if self.head_dim is not None:
      return self.head_dim
    if dim % self.num_heads:
      raise ValueError(f"dim={dim} is not divisible by num_heads={self.num_heads}.")
    return dim // self.num_heads

  def _qkv(self, x: Array) -> tuple[Array, Array, Array]:
    qkv = QKVProjection(
      self.num_heads,
      self._head_dim(x.shape[-1]),
      self.qkv_bias,
      self.dtype,
      self.param_dtype,
      self.kernel_init,
      name="qkv",
    )(x)
    return qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # each (B, N, H, Dh): BTNH layout

  def _project(self, y: Array, dim: int, train: bool) -> Array:
    out = OutputProjection(dim, self.dtype, self.param_dtype, self.kernel_init, name="proj")(y)
    return nn.Dropout(self.proj_drop)(out, deterministic=not train)

  def _positional_table(self, grid: TokenGrid | None) -> Array | None:
    if self.positional is None:
      return None
    if grid is None:
      raise ValueError("A positional attention term needs the token grid; pass grid=TokenGrid.")
    return self.positional(grid)

  @nn.compact
  def __call__(
    self,
    x: Array,
    *,
    grid: TokenGrid | None = None,
    num_prefix_tokens: int = 0,
    train: bool = False,
  ) -> Array:
    if self.combine not in COMBINE_RULES:
      raise ValueError(f"combine={self.combine!r} is not one of {COMBINE_RULES}.")
    if self.implementation not in IMPLEMENTATIONS:
      raise ValueError(f"implementation={self.implementation!r} is not one of {IMPLEMENTATIONS}.")
    dim = x.shape[-1]
    q, k, v = self._qkv(x)
    table = self._positional_table(grid)

    if table is not None and self.combine == "replace":
      if num_prefix_tokens:
        raise ValueError("combine='replace' (positional-only attention) has no prefix tokens.")
      # No batch dimension: softmax(P) is computed once and shared by all examples.
      probs = jax.nn.softmax(table.astype(jnp.float32), axis=-1).astype(self.dtype)
      if wants_attention_maps(self):
        record_attention(self, jnp.broadcast_to(probs, (x.shape[0], *probs.shape)))
      probs = nn.Dropout(self.attn_drop)(probs, deterministic=not train)
      y = jnp.einsum("hnm,bmhd->bnhd", probs, v)
      return self._project(y, dim, train)

    explicit = (
      wants_attention_maps(self)
      or (train and self.attn_drop > 0.0)
      or (table is not None and self.combine == "multiply")
    )
    if not explicit:
      bias = None
      if table is not None:  # combine == 'add'
        bias = embed_prefix(table, num_prefix_tokens, 0.0)[None].astype(q.dtype)
      y = dot_product_attention(q, k, v, bias=bias, implementation=self.implementation)
      return self._project(y, dim, train)

    scale = q.shape[-1] ** -0.5
    logits = jnp.einsum("bnhd,bmhd->bhnm", q, k).astype(jnp.float32) * scale
    if table is not None and self.combine == "add":
      logits = logits + embed_prefix(table, num_prefix_tokens, 0.0)
    elif table is not None:  # multiply
      logits = logits * embed_prefix(table, num_prefix_tokens, 1.0)
    probs = jax.nn.softmax(logits, axis=-1)
    record_attention(self, probs)
    probs = nn.Dropout(self.attn_drop)(probs, deterministic=not train).astype(self.dtype)
    y = jnp.einsum("bhnm,bmhd->bnhd", probs, v)
    return self._project(y, dim, train)


# ---------------------------------------------------------------------------------------------
# Registry of attention kinds. A backbone's per-layer attention spec names entries of this table;
# each entry builds a Linen module with the call signature of ``Attention``.

AttentionFactory = Callable[..., nn.Module]
_ATTENTION: dict[str, AttentionFactory] = {"mhsa": Attention}


def register_attention(name: str) -> Callable[[AttentionFactory], AttentionFactory]:
  """Decorator registering an attention kind under ``name`` (used by per-layer specs)."""

  def wrap(factory: AttentionFactory) -> AttentionFactory:
    if name in _ATTENTION:
      raise ValueError(f"Attention kind {name!r} is already registered.")
    _ATTENTION[name] = factory
    return factory

  return wrap


def list_attention() -> list[str]:
  """Registered attention kind names, sorted ('mhsa', 'gpsa', 'quadratic', 'gmm', ...)."""
  return sorted(_ATTENTION)


def get_attention(name: str) -> AttentionFactory:
  """The factory registered as ``name``; raises ValueError listing the valid kinds otherwise."""
  if name not in _ATTENTION:
    raise ValueError(f"Unknown attention kind {name!r}. Valid kinds: {list_attention()}.")
  return _ATTENTION[name]
