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
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Literal

import flax.linen as nn
import jax
import jax.numpy as jnp

from locvit.attention import core, projections
from locvit.attention.core import Term, attend
from locvit.attention.geometry import TokenGrid
from locvit.attention.projections import output_projection, qkv_projection, trunc_normal
from locvit.ops import check_implementation

Array = jax.Array
Combine = Literal["add", "multiply", "replace"]
# The core's rules a layer's positional table can use; 'gate' belongs to GPSA's own layer.
COMBINE_RULES = tuple(rule for rule in core.COMBINE_RULES if rule != "gate")


class AttentionLayer(nn.Module):
  """Fields and call signature shared by every registered attention layer.

  Called as ``layer(x, grid=grid, num_prefix_tokens=0, train=train)`` on ``(B, N, C)`` tokens;
  a subclass implements ``_forward`` (projections, the core, the output projection) and this
  class validates the kernel setting and applies ``proj_drop``.

  Attributes:
    num_heads: number of heads H.
    head_dim: per-head width; ``None`` means the layer's default (``C // H`` for q/k/v layers).
    qkv_bias: bias on the query/key/value projections.
    attn_drop: dropout on the attention probabilities (forces the explicit path when training).
    proj_drop: dropout after the output projection.
    implementation: the model's kernel setting (``locvit.ops``): None (JAX's choice), 'xla',
      'cudnn' (GPU, bf16/fp16 only) or 'cpu_kernels' (the CPU code paths).
    dtype: computation dtype (bf16 for mixed precision); parameters stay ``param_dtype``.
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

  def __post_init__(self):
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

  def _forward(
    self, x: Array, grid: TokenGrid | None, num_prefix_tokens: int, train: bool
  ) -> Array:
    raise NotImplementedError

  def _prefix_token_error(self, num_prefix_tokens: int) -> str | None:
    """The error for a layer defined on patch tokens only; None where prefix tokens are fine."""
    del num_prefix_tokens
    return None

  @nn.compact
  def __call__(
    self,
    x: Array,
    *,
    grid: TokenGrid | None = None,
    num_prefix_tokens: int = 0,
    train: bool = False,
  ) -> Array:
    check_implementation(self.implementation)
    error = self._prefix_token_error(num_prefix_tokens) if num_prefix_tokens else None
    if error:
      raise ValueError(error)
    out = self._forward(x, grid, num_prefix_tokens, train)
    return nn.Dropout(self.proj_drop)(out, deterministic=not train)


class Attention(AttentionLayer):
  """Multi-head self-attention with an optional positional term.

  Without one: ``softmax(q k^T / sqrt(Dh)) v`` per head, heads merged by the output projection
  (ConViT Eqs. 1-3). With one, ``combine`` selects Cordonnier et al.'s relative logits
  ('add', Eq. 8), Li & Zhang's masks ('multiply', Eq. 9) or positional-only attention ('replace',
  Cordonnier et al. Secs. 4.2-4.3); see the module docstring. Fields of ``AttentionLayer``, and:

  Attributes:
    out_dim: width of the output projection; None means the input width.
    positional: optional Linen module called as ``positional(grid)`` returning an ``(H, N, N)``
      table over the patch tokens.
    combine: how the positional table enters (see module docstring).
  """

  out_dim: int | None = None
  positional: nn.Module | None = None
  combine: Combine = "add"
  choices: ClassVar[dict[str, tuple[Any, ...]]] = {"combine": COMBINE_RULES}

  def _positional_table(self, grid: TokenGrid | None) -> Array | None:
    if self.positional is None:
      return None
    if grid is None:
      raise ValueError("A positional attention term needs the token grid; pass grid=TokenGrid.")
    return self.positional(grid)

  def _forward(
    self, x: Array, grid: TokenGrid | None, num_prefix_tokens: int, train: bool
  ) -> Array:
    dim = x.shape[-1]
    head_dim = projections.head_dim(dim, self.num_heads, self.head_dim)
    qkv = qkv_projection(self.num_heads, head_dim, self.qkv_bias, **self._dense_kwargs())(x)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # each (B, N, H, Dh): BTNH layout
    table = self._positional_table(grid)
    y = attend(
      self,
      q,
      k,
      v,
      terms=() if table is None else (Term(table, self.combine),),
      num_prefix_tokens=num_prefix_tokens,
      attn_drop=self.attn_drop,
      train=train,
      implementation=self.implementation,
    )
    return output_projection(self.out_dim or dim, **self._dense_kwargs())(y)


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
