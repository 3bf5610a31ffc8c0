"""Multi-head self-attention: the seam every paper's attention variant plugs into.

The four mechanisms differ only in how a positional table ``P`` of shape ``(H, N, N)`` (no batch
dimension) enters the attention; ``Attention(positional=term, combine=...)`` hands it to the core
(``core.py``, which has the full table of combine rules and kernels):

- ``combine='add'``: ``softmax(q k^T / sqrt(d) + P)`` -- relative positional logits
  (Cordonnier et al., Eq. 8 / 9), the GMM paper's "add" variant. Runs in the fused kernel.
- ``combine='multiply'``: ``softmax((q k^T / sqrt(d)) * P)`` -- the GMM / ELM masks as the
  official code applies them. No fused kernel can express this, so it runs explicitly.
- ``combine='replace'``: ``softmax(P)`` -- positional-only attention; ``P V`` is computed without
  materialising a per-example attention matrix.

GPSA's ``'gate'`` rule has its own layer (``gpsa.py``). ``P`` covers patch tokens only; prefix
tokens (the class token) get a neutral entry: 0 for ``add``, 1 for ``multiply``; ``replace``
attention does not support prefix tokens.

The backbones with attention of their own hand it to this layer too: Swin's window attention
passes its mask, relative bias and shift mask as ``terms=`` at call time, T2T's token transformer
sets ``scale`` and ``value_skip``, and CaiT's talking heads subclass it for their separate query
and key/value kernels and their ``LogitsHook``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from locvit.attention import projections
from locvit.attention.core import COMBINE_RULES, LogitsHook, Term, attend
from locvit.attention.geometry import TokenGrid, is_integer
from locvit.attention.projections import (
  output_projection,
  qkv_projection,
  split_projections,
  trunc_normal,
)
from locvit.platform.ops import check_implementation

Array = jax.Array


def check_layer_input(layer: str, x: Array, grid: TokenGrid | None, num_prefix_tokens: int) -> None:
  """One line naming the problem for tokens that are not ``(B, N, C)``, a ``grid`` that is not
  a ``TokenGrid`` and a ``num_prefix_tokens`` outside ``[0, N)``, before any projection is
  traced (else a transpose or broadcasting error from deep inside)."""
  if getattr(x, "ndim", None) != 3:
    raise ValueError(
      f"{layer} takes tokens of shape (batch, tokens, channels), got shape "
      f"{getattr(x, 'shape', type(x).__name__)}: flatten a (B, H, W, C) grid of patches with "
      "x.reshape(B, H * W, C) and pass grid=TokenGrid(H, W)."
    )
  if grid is not None and not isinstance(grid, TokenGrid):
    raise ValueError(
      f"{layer} got grid={grid!r}, not a TokenGrid: pass grid=TokenGrid(height, width) of the "
      "patch tokens."
    )
  tokens = x.shape[1]
  if not is_integer(num_prefix_tokens) or not 0 <= num_prefix_tokens < tokens:
    raise ValueError(
      f"{layer} got num_prefix_tokens={num_prefix_tokens!r} for {tokens} tokens: the number of "
      f"class / distillation tokens placed first, an integer in [0, {tokens - 1}]."
    )


class LayerCall(NamedTuple):
  """One call of an attention layer, as ``AttentionLayer.__call__`` checked it: the tokens, their
  grid, how many prefix tokens lead them, train or not, and ``row_scale``, the ``(B, 1, 1)`` factors
  of the output applied inside the output projection's matmul."""

  x: Array
  grid: TokenGrid | None
  num_prefix_tokens: int
  train: bool
  row_scale: Array | None


class AttentionLayer(nn.Module):
  """Fields and call signature shared by every registered attention layer.

  Called as ``layer(x, grid=grid, num_prefix_tokens=0, train=train)`` on ``(B, N, C)`` tokens;
  a subclass implements ``_forward`` (projections, the core, the output projection) and this
  class validates the kernel setting and applies ``proj_drop``. Layers with ``call_extras``
  (``Attention``) also take ``context`` (keys and values from other tokens) and extra positional
  ``terms``; the others build every term themselves and refuse both.

  Attributes:
    num_heads: number of heads H.
    head_dim: per-head width; ``None`` means the layer's default (``C // H`` for q/k/v layers).
    qkv_bias: bias on the query/key/value projections.
    attn_drop: dropout on the attention probabilities (forces the explicit path when training).
    proj_drop: dropout after the output projection.
    implementation: the model's kernel setting (``locvit.platform.ops``): None (JAX's choice),
    'xla',
      'cudnn' (GPU; the shapes of ``softmax_attention.cudnn_refusal``) or 'cpu_kernels' (the CPU
      code paths).
    dtype: computation dtype (bf16 for mixed precision); parameters stay ``param_dtype``.
    param_dtype: dtype of the parameters.
    kernel_init: initializer of the projection kernels.
  """

  num_heads: int
  head_dim: int | None = None
  qkv_bias: bool = True
  attn_drop: float = 0.0
  proj_drop: float = 0.0
  implementation: str | None = None
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  kernel_init: Callable = trunc_normal
  choices: ClassVar[dict[str, tuple[Any, ...]]] = {}  # field -> valid values, checked at build
  call_extras: ClassVar[bool] = False

  def __post_init__(self):
    if not is_integer(self.num_heads) or self.num_heads < 1:
      raise ValueError(f"num_heads={self.num_heads!r} must be a positive integer.")
    for field, valid in self.choices.items():
      if getattr(self, field) not in valid:
        raise ValueError(f"{field}={getattr(self, field)!r} is not one of {valid}.")
    super().__post_init__()

  def _dense_kwargs(self) -> dict[str, Any]:
    """Keyword arguments of this layer's ``DenseGeneral`` projections."""
    return dict(
      kernel_init=self.kernel_init,
      implementation=self.implementation,
      dtype=self.dtype,
      param_dtype=self.param_dtype,
    )

  def _forward(self, call: LayerCall, **extras: Any) -> Array:
    """The layer up to ``proj_drop``; ``extras``: ``context`` and ``terms`` (``call_extras``)."""
    raise NotImplementedError

  def _prefix_token_error(self, num_prefix_tokens: int) -> str | None:
    """The error for a layer defined on patch tokens only; None where prefix tokens are fine."""
    del num_prefix_tokens
    return None

  @nn.compact
  def __call__(
    self,
    x: Array,
    context: Array | None = None,
    *,
    grid: TokenGrid | None = None,
    num_prefix_tokens: int = 0,
    terms: Sequence[Term] = (),
    train: bool = False,
    row_scale: Array | None = None,
  ) -> Array:
    """``row_scale``: ``(B, 1, 1)`` factors of the output, applied inside the output
    projection's matmul (``ops.affine``; stochastic depth, ``layers.pre_norm_residual``)."""
    check_implementation(self.implementation)
    check_layer_input(type(self).__name__, x, grid, num_prefix_tokens)
    error = self._prefix_token_error(num_prefix_tokens) if num_prefix_tokens else None
    if error:
      raise ValueError(error)
    extras = {}
    if context is not None or terms:
      if not self.call_extras:
        raise ValueError(f"{type(self).__name__} takes no context= or terms= at call time.")
      extras = dict(context=context, terms=tuple(terms))
    out = self._forward(LayerCall(x, grid, num_prefix_tokens, train, row_scale), **extras)
    return nn.Dropout(self.proj_drop)(out, deterministic=not train)


class Attention(AttentionLayer):
  """Multi-head attention with optional positional terms: the one attention layer.

  Without a term: ``softmax(q k^T / sqrt(Dh)) v`` per head, heads merged by the output projection
  (ConViT Eqs. 1-3). With one, ``combine`` selects Cordonnier et al.'s relative logits
  ('add', Eq. 8), Li & Zhang's masks ('multiply', Eq. 9) or positional-only attention ('replace',
  Cordonnier et al. Secs. 4.2-4.3); see the module docstring. Fields of ``AttentionLayer``, and:

  Attributes:
    out_dim: width of the output projection; None means the input width.
    positional: optional Linen module called as ``positional(grid)`` returning an ``(H, N, N)``
      table over the patch tokens.
    combine: how the positional table enters: a rule of ``core.COMBINE_RULES`` other than
      'gate', whose term carries a per-head gate that only GPSA's layer has.
    scale: the logits' scale ``s``; None means ``1 / sqrt(Dh)``.
    value_skip: add the values, heads merged, to the output: ``v + proj(A v)`` (T2T's token
      transformer, whose input and output widths differ).

  Called as ``AttentionLayer`` is, plus ``context`` ``(B, M, C)`` (keys and values from other
  tokens: CaiT's class attention) and ``terms`` (``Term`` values applied after the layer's own,
  in order: Swin's mask, relative bias and shift mask). A subclass replaces one step: ``_project``
  (the q/k/v parameterisation), ``_terms`` (its own positional terms) or ``_hook`` (a
  ``LogitsHook``: CaiT's talking heads).
  """

  out_dim: int | None = None
  positional: nn.Module | None = None
  combine: str = "add"
  scale: float | None = None
  value_skip: bool = False
  choices: ClassVar[dict[str, tuple[Any, ...]]] = {"combine": COMBINE_RULES}
  call_extras: ClassVar[bool] = True

  def __post_init__(self):
    if self.combine == "gate":
      raise ValueError("combine='gate' is GPSA's rule (a gated term): use attention kind 'gpsa'.")
    super().__post_init__()

  def _positional_table(self, grid: TokenGrid | None) -> Array | None:
    if self.positional is None:
      return None
    if grid is None:
      raise ValueError("A positional attention term needs the token grid; pass grid=TokenGrid.")
    return self.positional(grid)

  def _terms(self, grid: TokenGrid | None) -> tuple[Term, ...]:
    """The layer's own positional terms (a subclass may build several)."""
    table = self._positional_table(grid)
    return () if table is None else (Term(table, self.combine),)

  def _project(self, x: Array, context: Array | None) -> tuple[Array, Array, Array]:
    """Queries, keys and values, each ``(B, N, H, Dh)`` (BTNH layout), from the fused ``qkv``."""
    if context is not None:
      raise ValueError(f"{type(self).__name__}'s fused qkv projection cannot read a context.")
    head_dim = projections.head_dim(x.shape[-1], self.num_heads, self.head_dim)
    qkv = qkv_projection(self.num_heads, head_dim, self.qkv_bias, **self._dense_kwargs())(x)
    return split_projections(qkv, self.implementation)

  def _hook(self) -> LogitsHook | None:
    return None

  def _forward(
    self, call: LayerCall, context: Array | None = None, terms: tuple[Term, ...] = ()
  ) -> Array:
    x, row_scale = call.x, call.row_scale
    q, k, v = self._project(x, context)
    terms = (*self._terms(call.grid), *terms)
    if terms and context is not None:
      raise ValueError("A positional term is a table over a grid's token pairs: no context=.")
    y = attend(
      self,
      q,
      k,
      v,
      terms=terms,
      num_prefix_tokens=call.num_prefix_tokens,
      scale=self.scale,
      hook=self._hook(),
      attn_drop=self.attn_drop,
      train=call.train,
      implementation=self.implementation,
    )
    out = output_projection(self.out_dim or x.shape[-1], **self._dense_kwargs())(y, row_scale)
    if not self.value_skip:
      return out
    skip = v.reshape(*v.shape[:2], -1)
    return (skip if row_scale is None else skip * row_scale.astype(skip.dtype)) + out


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
