"""Relative positional attention of Cordonnier, Loukas & Jaggi (ICLR 2020).

"On the Relationship between Self-Attention and Convolutional Layers". Three positional terms, each
a Linen module called as ``term(grid)`` that returns ``(H, N, N)`` float32 logits with no batch
dimension (so they plug into ``Attention(positional=term, combine=...)``):

- ``QuadraticPositional`` (Sec. 3, Eq. 9; appendix E): per head an attention centre ``Delta``
  (``attention_centers``, (H, 2)) and an inverse spread (``attention_spreads``): isotropic ``s``
  (H,), or generalized ``S`` (H, 2, 2) read as ``Sigma^{-1/2}`` so ``Sigma^{-1} = S S^T``. With
  ``Sigma^{-1} = [[a, b], [b, c]]`` the logit of key ``k`` for query ``q`` is ``u . r(delta)``, with
  ``delta = k - q``, ``r(delta) = (d1, d2, d1^2, d2^2, d1 d2)`` and
  ``u = -1/2 (-2(a mu1 + b mu2), -2(c mu2 + b mu1), a, c, 2b)``, i.e.
  ``-1/2 (delta - Delta)^T Sigma^{-1} (delta - Delta) + const`` (Eq. 19). Isotropic:
  ``a = c = s^2``, ``b = 0`` and the paper's ``alpha = s^2 / 2`` (Eq. 9 / 14). No content term,
  no ``1/sqrt(d)``.
  ``d1`` is the row offset and ``d2`` the column offset (the reference's hidden states are NHWC, so
  its first spatial axis is the image row).
- ``LearnedRelativePositional`` (Sec. 4.3): ``row_embeddings`` and ``col_embeddings`` of shape
  ``(2M - 1, D_p)`` with ``M`` the grid side, projected to one logit per head by ``head_keys_row`` /
  ``head_keys_col`` (``D_p -> H``, no bias); logit = row term + column term. As in the reference
  (``Learned2DRelativeSelfAttention``), ``row_embeddings`` is looked up with the *column* offset
  ``dx + M - 1`` and ``col_embeddings`` with the *row* offset ``dy + M - 1`` (the reference names
  the tables after the axis of its ``(H, W, H, W)`` score layout they broadcast along); on the
  square grids it requires this only matters for checkpoint conversion. Non-square grids raise.

Init (faithful to epfml/attention-cnn): ``attention_centers ~ N(0, 2.0^2)`` -- the reference calls
``normal_(0.0, gaussian_init_mu_std=2.0)``, so 2.0 is the *standard deviation*; the paper writes
``N(0, 2 I_2)``, which read as a covariance would be a std of sqrt(2). Likewise
``attention_spreads = 1 + N(0, 0.01^2)`` (isotropic) or ``I + N(0, 0.01^2)`` (generalized): 0.01 is
the std (``gaussian_init_sigma_std``); the paper's ``N(0, 0.01 I)`` would be a std of 0.1. Both stds
are fields (``center_init_std``, ``spread_init_std``). Embedding tables use PyTorch's
``nn.Embedding`` default N(0, 1) and ``head_keys_*`` PyTorch's Linear default (kaiming-uniform).

Two ways to use a term in a layer (both registered as attention kinds, see the bottom of the file):

- ``layout='standard'``: the library's ``Attention`` module (q/k/v projections with ``head_dim``
  per head, output projection), with ``combine='replace'`` (positional only, ``softmax(P)``) or
  ``combine='add'`` (content + position, ``softmax(q k^T / sqrt(Dh) + P)``).
- ``layout='reference'``: ``RelativeAttention``, the reference code's parameterisation. The values
  are the raw inputs (``Dh = D_in``, "Dh = Dout" in the paper), the ``H`` head outputs are
  concatenated and one ``value`` projection ``(H, D_in, D_out)`` follows: that is the merged
  ``W^(h) = W_val^(h) W_out^(h)`` of Eq. 11 learned directly. Positional-only attention has no
  q/k parameters; with ``content=True`` it adds ``query``/``key`` projections ``D_in -> H x Dh``
  (``Dh = D_in`` by default) and ``q.k / sqrt(Dh)`` to the positional logits. This is the layout
  that reproduces the paper's parameter counts (12.1M / 12.3M / 29.6M, Tables 1 and 4).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, ClassVar, Literal

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from locvit.attention.attention import Attention, AttentionLayer, LayerCall, register_attention
from locvit.attention.core import Term, attend
from locvit.attention.geometry import TokenGrid, check_grid_tokens, relative_offsets
from locvit.attention.projections import (
  DenseGeneral,
  normal_init,
  partitioned,
  torch_linear_bias_init,
  torch_linear_kernel_init,
)

Array = jax.Array
Kind = Literal["quadratic", "quadratic_generalized", "learned_relative"]
KINDS = ("quadratic", "quadratic_generalized", "learned_relative")
Layout = Literal["standard", "reference"]
LAYOUTS = ("standard", "reference")
Parameterization = Literal["spreads", "alpha"]
PARAMETERIZATIONS = ("spreads", "alpha")


# ---------------------------------------------------------------------------------------------
# Geometry and the quadratic encoding


@functools.lru_cache(maxsize=64)
def quadratic_features(grid: TokenGrid) -> np.ndarray:
  """``(N, N, 5)`` float32 encoding ``r(delta) = (d1, d2, d1^2, d2^2, d1 d2)``, ``delta = k - q``:
  the relative encoding of Cordonnier et al. appendix E (below Eq. 19).

  ``d1`` is the row offset and ``d2`` the column offset of key ``k`` relative to query ``q``.
  """
  offsets = relative_offsets(grid).astype(np.float32)
  d1, d2 = offsets[..., 0], offsets[..., 1]
  out = np.stack([d1, d2, d1**2, d2**2, d1 * d2], axis=-1)
  out.setflags(write=False)
  return out


def inverse_covariance(spreads: Array) -> Array:
  """``Sigma^{-1}`` (H, 2, 2): ``s^2 I`` for isotropic ``s`` (H,), ``S S^T`` for ``S`` (H, 2, 2).

  ``S`` is the ``Sigma^{-1/2}`` parameter of Cordonnier et al. appendix E (Eq. 19). Raises
  ValueError for any other shape.
  """
  spreads = jnp.asarray(spreads)
  if spreads.ndim == 1:
    return (spreads**2)[:, None, None] * jnp.eye(2, dtype=spreads.dtype)
  if spreads.ndim == 3 and spreads.shape[1:] == (2, 2):
    return jnp.einsum("hij,hkj->hik", spreads, spreads)
  raise ValueError(f"attention_spreads must have shape (H,) or (H, 2, 2), got {spreads.shape}.")


def quadratic_target_vectors(centers: Array, spreads: Array) -> Array:
  """The per-head target vector ``u`` (H, 5) with ``u . r(delta)`` the logit (the reference's form).

  Cordonnier et al. appendix E: ``u . r(delta) = -1/2 (delta - Delta)^T Sigma^{-1} (delta - Delta)``
  up to a constant (Eq. 19); isotropic spreads give Eq. 9 with ``alpha = s^2 / 2``.
  """
  return target_vectors(centers, inverse_covariance(spreads))


def alpha_inverse_covariance(alpha: Array) -> Array:
  """``Sigma^{-1} = 2 alpha I`` (H, 2, 2) for Eq. 9's ``-alpha ||delta - Delta||^2`` logits."""
  alpha = jnp.asarray(alpha)
  return (2.0 * alpha)[:, None, None] * jnp.eye(2, dtype=alpha.dtype)


def target_vectors(centers: Array, inv: Array) -> Array:
  """``u`` (H, 5) from centres ``Delta`` (H, 2) and inverse covariances ``Sigma^{-1}`` (H, 2, 2)."""
  a, b, c = inv[:, 0, 0], inv[:, 0, 1], inv[:, 1, 1]
  mu1, mu2 = centers[:, 0], centers[:, 1]
  return -0.5 * jnp.stack(
    [-2 * (a * mu1 + b * mu2), -2 * (c * mu2 + b * mu1), a, c, 2 * b], axis=-1
  )


class QuadraticPositional(nn.Module):
  """Cordonnier et al.'s Gaussian (quadratic) positional logits ``(H, N, N)``: isotropic (Sec. 3,
  Eq. 9) or generalized (appendix E, Eq. 19). Parameters ``attention_centers`` and either
  ``attention_spreads`` (the reference's layout) or ``attention_alphas``; no content term.

  Attributes:
    num_heads: H.
    generalized: ``attention_spreads`` is ``(H, 2, 2)`` (``Sigma^{-1/2}``) instead of ``(H,)``.
    parameterization: 'spreads' (the reference's ``attention_spreads`` ``s``) or 'alpha' (Eq. 9's
      ``alpha`` (H,) directly: logits ``-alpha ||delta - Delta||^2``; ``alpha = s^2 / 2``, i.e.
      ``s = sqrt(2 alpha)``). 'alpha' is isotropic only.
    center_init_std: std of the centre init (2.0 in the reference; see the module docstring).
    spread_init_std: std of the noise on the spread init (0.01 in the reference); with 'alpha'
      the init is ``alpha = s^2 / 2`` of those spreads.
    param_dtype: dtype of the parameters; the logits are computed in float32.
  """

  num_heads: int
  generalized: bool = False
  parameterization: Parameterization = "spreads"
  center_init_std: float = 2.0
  spread_init_std: float = 0.01
  param_dtype: Any = jnp.float32

  def _inverse_covariance(self) -> Array:
    """``Sigma^{-1}`` (H, 2, 2) from this term's spread or alpha parameters."""
    heads = self.num_heads
    if self.parameterization not in PARAMETERIZATIONS:
      raise ValueError(
        f"parameterization={self.parameterization!r} is not one of {PARAMETERIZATIONS}."
      )
    if self.parameterization == "alpha":
      if self.generalized:
        raise ValueError("parameterization='alpha' is isotropic; use 'spreads' with generalized.")
      spread_init = normal_init(self.spread_init_std, 1.0)
      alpha_init = lambda key, shape, dtype: 0.5 * jnp.square(spread_init(key, shape, dtype))
      alpha = self.param(
        "attention_alphas", partitioned(alpha_init, ("heads",)), (heads,), self.param_dtype
      )
      return alpha_inverse_covariance(alpha.astype(jnp.float32))
    mean, shape = (np.eye(2), (heads, 2, 2)) if self.generalized else (1.0, (heads,))
    spreads = self.param(
      "attention_spreads",
      partitioned(normal_init(self.spread_init_std, mean), ("heads", None, None)[: len(shape)]),
      shape,
      self.param_dtype,
    )
    return inverse_covariance(spreads.astype(jnp.float32))

  @nn.compact
  def __call__(self, grid: TokenGrid) -> Array:
    centers = self.param(
      "attention_centers",
      partitioned(normal_init(self.center_init_std), ("heads", None)),
      (self.num_heads, 2),
      self.param_dtype,
    )
    u = target_vectors(centers.astype(jnp.float32), self._inverse_covariance())
    return jnp.einsum("nmd,hd->hnm", quadratic_features(grid), u)


def learned_relative_indices(grid: TokenGrid, max_position: int) -> tuple[np.ndarray, np.ndarray]:
  """``(row_table_index, col_table_index)``, each (N, N): ``dx + M - 1`` and ``dy + M - 1``.

  The embedding-table rows of every (query, key) shift, for Cordonnier et al. Sec. 4.3.
  """
  offsets = relative_offsets(grid)
  return offsets[..., 1] + max_position - 1, offsets[..., 0] + max_position - 1


class LearnedRelativePositional(nn.Module):
  """Cordonnier et al.'s learned 2-D relative positional logits (Sec. 4.3): the positional last
  term of Eq. 8, per head a projection of ``r_delta`` = (row-shift, column-shift) embeddings.

  Attributes:
    num_heads: H.
    embed_dim: ``D_p``, width of each embedding table (400 in the paper, = the model width).
    max_position: ``M``; tables have ``2M - 1`` rows. None: the grid side at init. A grid larger
      than ``M`` raises.
    param_dtype: dtype of the parameters; the logits are computed in float32.
  """

  num_heads: int
  embed_dim: int = 400
  max_position: int | None = None
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, grid: TokenGrid) -> Array:
    grid.require_square("Learned 2-D relative positional attention (as in the reference code)")
    side = grid.height
    max_position = self.max_position or side
    if side > max_position:
      raise ValueError(
        f"Learned relative positional attention was built for grids up to {max_position}x"
        f"{max_position} (max_position), got {side}x{side}."
      )
    table_shape = (2 * max_position - 1, self.embed_dim)
    row_embeddings = self.param(
      "row_embeddings", partitioned(normal_init(1.0), (None, None)), table_shape, self.param_dtype
    )
    col_embeddings = self.param(
      "col_embeddings", partitioned(normal_init(1.0), (None, None)), table_shape, self.param_dtype
    )
    dense = lambda name: nn.Dense(
      self.num_heads,
      use_bias=False,
      dtype=jnp.float32,
      param_dtype=self.param_dtype,
      kernel_init=partitioned(torch_linear_kernel_init, (None, "heads")),
      name=name,
    )
    # Project the (2M - 1) table rows once, then gather: same numbers as embedding every pair.
    row_scores = dense("head_keys_row")(row_embeddings.astype(jnp.float32))  # (2M - 1, H)
    col_scores = dense("head_keys_col")(col_embeddings.astype(jnp.float32))
    row_index, col_index = learned_relative_indices(grid, max_position)
    scores = row_scores[row_index] + col_scores[col_index]  # (N, N, H)
    return jnp.transpose(scores, (2, 0, 1))


def make_positional(
  kind: str,
  num_heads: int,
  *,
  center_init_std: float = 2.0,
  spread_init_std: float = 0.01,
  embed_dim: int | None = None,
  max_position: int | None = None,
  parameterization: Parameterization = "spreads",
  param_dtype: Any = jnp.float32,
  **module_kwargs: Any,
) -> nn.Module:
  """Builds the positional term of an attention kind ('quadratic', ...)."""
  if kind in ("quadratic", "quadratic_generalized"):
    return QuadraticPositional(
      num_heads,
      generalized=kind == "quadratic_generalized",
      parameterization=parameterization,
      center_init_std=center_init_std,
      spread_init_std=spread_init_std,
      param_dtype=param_dtype,
      **module_kwargs,
    )
  if kind == "learned_relative":
    return LearnedRelativePositional(
      num_heads,
      embed_dim=400 if embed_dim is None else embed_dim,
      max_position=max_position,
      param_dtype=param_dtype,
      **module_kwargs,
    )
  raise ValueError(f"Unknown relative positional kind {kind!r}. Valid kinds: {KINDS}.")


# ---------------------------------------------------------------------------------------------
# The reference code's attention layer


class RelativeAttention(AttentionLayer):
  """Relative positional self-attention in the reference code's parameterisation (Dh = D_in).

  Cordonnier et al. Eqs. 11-12: per head the merged ``W^(h) = W_val^(h) W_out^(h)`` is the
  ``value`` kernel, learned directly; positional logits from Eq. 9 / Eq. 19 / Sec. 4.3.

  ``out = sum_h softmax(A_h) X W_h + b`` with ``W`` the ``value`` kernel ``(H, D_in, D_out)``;
  ``A_h = P_h`` (positional only) or ``P_h + q_h k_h^T / sqrt(Dh)`` (``content=True``).
  Called as ``attn(x, grid=grid, train=train)`` on ``(B, N, D_in)`` patch tokens; ``grid=None``
  means the square grid of N tokens.

  Attributes:
    num_heads: H.
    kind: 'quadratic', 'quadratic_generalized' or 'learned_relative'.
    content: add content logits ``q.k / sqrt(Dh)`` (the "+ content" rows of Table 1).
    head_dim: q/k width per head when ``content``; None means D_in (the reference). The values
      are always the raw inputs.
    out_dim: D_out of the ``value`` projection; None means D_in.
    qkv_bias: bias on ``query``/``key`` (True in the reference).
    attn_drop: dropout on the attention probabilities. Positional-only probabilities have no batch
      dimension, so, as in the reference, one dropout mask is shared by the whole batch.
    proj_drop: dropout after ``value`` (0 in the Cordonnier network, whose layer applies dropout
      after its own ``dense``).
    implementation: the model's kernel setting (``locvit.platform.ops``) for the content path.
    center_init_std, spread_init_std, embed_dim, max_position: see the positional terms;
      ``embed_dim=None`` means D_in.
    fused: with content, use the fused kernel when no maps are collected and no attention
      dropout is active (only when ``head_dim == D_in``, which the kernel needs for raw values).

  Intermediates (``mutable=['intermediates']``): ``attention`` ``(B, H, N, N)``.
  """

  kernel_init: Callable = torch_linear_kernel_init
  kind: Kind = "quadratic"
  content: bool = False
  out_dim: int | None = None
  center_init_std: float = 2.0
  spread_init_std: float = 0.01
  embed_dim: int | None = None
  max_position: int | None = None
  fused: bool = True
  choices: ClassVar[dict[str, tuple[Any, ...]]] = {"kind": KINDS}

  def _dense(self, features, names, num_inputs: int, fan_in: int, use_bias: bool, name: str):
    """A PyTorch-Linear-initialised projection of the last ``num_inputs`` axes (``fan_in`` wide)."""
    bias_init = torch_linear_bias_init(fan_in)
    kwargs = self._dense_kwargs()
    return DenseGeneral(
      features, names, num_inputs, use_bias, bias_init=bias_init, name=name, **kwargs
    )

  def _prefix_token_error(self, num_prefix_tokens: int) -> str:
    return (
      "Relative positional attention in the reference layout is defined on patch tokens only "
      f"(no class token), got num_prefix_tokens={num_prefix_tokens}."
    )

  def _forward(self, call: LayerCall) -> Array:
    x, train, row_scale = call.x, call.train, call.row_scale
    dim = x.shape[-1]
    grid = check_grid_tokens(call.grid, x.shape[1])
    heads = self.num_heads
    table = make_positional(
      self.kind,
      heads,
      center_init_std=self.center_init_std,
      spread_init_std=self.spread_init_std,
      embed_dim=self.embed_dim or dim,
      max_position=self.max_position,
      param_dtype=self.param_dtype,
      name="positional",
    )(grid)  # (H, N, N) float32
    x = x.astype(self.dtype)
    q = k = x  # positional only: no query/key parameters
    if self.content:
      head_dim = self.head_dim or dim
      names = ("embed", "heads", "kv")
      q = self._dense((heads, head_dim), names, 1, dim, self.qkv_bias, "query")(x)
      k = self._dense((heads, head_dim), names, 1, dim, self.qkv_bias, "key")(x)
    y = attend(
      self,
      q,
      k,
      x,  # raw values shared by the heads (Dh = D_in)
      terms=(Term(table, "add" if self.content else "replace"),),
      attn_drop=self.attn_drop,
      train=train,
      implementation=self.implementation,
      fused=self.fused,
    )
    out_dim = (self.out_dim or dim,)
    value = self._dense(out_dim, ("heads", None, "embed"), 2, heads * dim, True, "value")
    return value(y, row_scale)


# ---------------------------------------------------------------------------------------------
# Attention kinds for per-layer specs (VisionTransformer's ``layer_attention``, the Cordonnier net)

_POSITIONAL_KWARGS = (
  "center_init_std",
  "spread_init_std",
  "embed_dim",
  "max_position",
  "parameterization",
)


def relative_attention(
  kind: str, *, num_heads: int, content: bool = False, layout: str = "standard", **kwargs: Any
) -> nn.Module:
  """An attention layer with the ``kind`` positional term (Cordonnier et al. Eq. 9, appendix E or
  Sec. 4.3).

  ``layout='standard'`` returns the library's ``Attention`` with ``positional=<term>`` and
  ``combine='add'`` (content) or ``'replace'`` (positional only); ``layout='reference'`` returns
  ``RelativeAttention``. Other keyword arguments are passed to the layer (``head_dim``,
  ``attn_drop``, ``dtype``, ``name``, ...) or, for ``center_init_std``, ``spread_init_std``,
  ``embed_dim`` and ``max_position``, to the positional term.
  """
  if layout not in LAYOUTS:
    raise ValueError(f"layout={layout!r} is not one of {LAYOUTS}.")
  if kind not in KINDS:
    raise ValueError(f"Unknown relative positional kind {kind!r}. Valid kinds: {KINDS}.")
  if layout == "reference":
    return RelativeAttention(num_heads=num_heads, kind=kind, content=content, **kwargs)
  term_kwargs = {k: kwargs.pop(k) for k in _POSITIONAL_KWARGS if k in kwargs}
  # parent=None: the term is adopted by the Attention module as its 'positional' child, even when
  # this factory runs inside another module's compact method.
  term = make_positional(
    kind,
    num_heads,
    param_dtype=kwargs.get("param_dtype", jnp.float32),
    parent=None,
    **term_kwargs,
  )
  return Attention(
    num_heads=num_heads, positional=term, combine="add" if content else "replace", **kwargs
  )


for _kind in KINDS:
  register_attention(_kind)(functools.partial(relative_attention, _kind))
