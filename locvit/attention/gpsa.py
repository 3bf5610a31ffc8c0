"""Gated positional self-attention (GPSA) and positional self-attention (PSA) from ConViT.

d'Ascoli et al. 2021, "ConViT: Improving Vision Transformers with Soft Convolutional Inductive
Biases". With ``r_ij = (dx, dy, dx^2 + dy^2)`` (key minus query, see ``geometry.py``), per head h:

- GPSA (Eqs. 6-7): ``A = normalize[(1 - sigmoid(lambda_h)) softmax(Q K^T / sqrt(Dh))
  + sigmoid(lambda_h) softmax(v_pos^h . r)]``, output ``proj(A V)``.
- PSA (Eq. 4, the ungated layer of the paper's appendix A): ``softmax(Q K^T / sqrt(Dh)
  + v_pos^h . r)``.
- Convolutional ("local") init (Eq. 5): ``W_val = I`` and ``v_pos^h = -alpha (1, -2 Delta^h)``, so
  head h attends to the patch at offset ``Delta^h`` of a ``sqrt(H) x sqrt(H)`` kernel with
  locality strength ``alpha``.

The positional term ``softmax(v_pos . r)`` does not depend on the input: it is computed once per
call as an ``(H, N, N)`` table shared by the batch (the reference builds it per example) and
enters the attention core (``core.py``) with the ``'gate'`` combine rule (PSA: ``'add'``). The
fast path drops the renormalisation, an exact no-op. Then, by kernel setting:

- 'xla' / 'cudnn' / None (GPU, TPU): the exact identity ``GPSA = (1 - g) SDPA(q, k, v) + g (P v)``;
  the content part runs in ``jax.nn.dot_product_attention`` (cuDNN's flash kernel where it
  applies) and no ``(B, H, N, N)`` tensor is built.
- 'cpu_kernels' (the CPU code path): ``softmax_attention.gated_positional_attention``, the mixed map
  ``(1 - g) softmax(q k^T) + g P`` times ``v`` in one kernel with a hand-written backward pass
  (fewer matmuls than the decomposition when the map is materialised anyway).

Parameter names follow timm's ``GPSA`` (``qk``, ``v``, ``proj``, ``pos_proj``, ``gating_param``)
so checkpoint conversion is a reshape (see ``locvit.convert``).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any, ClassVar, Literal

import flax.linen as nn
import jax
import jax.numpy as jnp

from locvit.attention import projections
from locvit.attention.attention import AttentionLayer, LayerCall, register_attention
from locvit.attention.core import Term, attend
from locvit.attention.geometry import TokenGrid, check_grid_tokens, gpsa_relative_features
from locvit.attention.projections import (
  DenseGeneral,
  output_projection,
  partitioned,
  zeros,
)

Array = jax.Array
Variant = Literal["gpsa", "psa"]
VARIANTS = ("gpsa", "psa")


def kernel_centres(num_heads: int) -> list[tuple[int, float, float]]:
  """Returns ``(head, dx, dy)`` attention centres of the local init (ConViT Eq. 5, timm order).

  ``k = int(sqrt(H))``; head ``p = h1 + k * h2`` is centred at ``dx = h2 - c``, ``dy = h1 - c``
  with ``c = (k - 1) / 2`` for even ``k`` (half-integer centres) and ``k // 2`` for odd ``k``.
  Heads beyond ``k^2`` get no centre.
  """
  k = math.isqrt(num_heads)
  centre = (k - 1) / 2 if k % 2 == 0 else k // 2
  return [(h1 + k * h2, h2 - centre, h1 - centre) for h1 in range(k) for h2 in range(k)]


def local_pos_proj_init(num_heads: int, locality_strength: float, base: Callable) -> Callable:
  """Initializer for the ``(3, H)`` ``pos_proj`` kernel: ConViT Eq. 5 centres on top of ``base``.

  Column ``p`` (timm's row ``p``) becomes ``(2 dx_p, 2 dy_p, -1)`` so the logit is
  ``-||delta - Delta_p||^2 + const``; then the whole kernel is scaled by ``locality_strength``,
  including the random columns of heads beyond ``k^2`` (as the reference does).
  """
  centres = kernel_centres(num_heads)

  def init(key: Array, shape: tuple[int, ...], dtype: Any = jnp.float32) -> Array:
    kernel = base(key, shape, dtype)
    for p, dx, dy in centres:
      kernel = kernel.at[:, p].set(jnp.asarray([2 * dx, 2 * dy, -1.0], dtype))
    return kernel * jnp.asarray(locality_strength, dtype)

  return init


def warn_if_not_square(num_heads: int) -> None:
  """The local init only centres ``int(sqrt(H))^2`` heads; say so when that is not all of them."""
  side = math.isqrt(num_heads)
  if side * side != num_heads:
    warnings.warn(
      f"GPSA local init: num_heads={num_heads} is not a perfect square, so only {side * side} = "
      f"{side}^2 heads get a convolutional attention centre; the other {num_heads - side * side} "
      "keep random (trunc-normal) pos_proj weights, as in the reference implementation.",
      stacklevel=3,
    )


def identity_init(key: Array, shape: tuple[int, ...], dtype: Any = jnp.float32) -> Array:
  """``W_val = I`` (ConViT Eq. 5) for a ``(C, H, Dh)`` kernel; rectangular when ``H * Dh != C``."""
  del key
  return jnp.eye(shape[0], math.prod(shape[1:]), dtype=dtype).reshape(shape)


@register_attention("gpsa")
class GPSA(AttentionLayer):
  """ConViT's gated positional self-attention (d'Ascoli et al. 2021, Eqs. 6-7, Sec. 3), or ungated
  PSA (Eq. 4), with the convolutional init of Eq. 5.

  Called as ``attn(x, grid=grid, num_prefix_tokens=0, train=train)`` on ``(B, N, C)`` patch
  tokens (``grid=None``: the square grid of N tokens). The positional term is defined on patch
  tokens only: ConViT inserts the class token after the last GPSA layer, so
  ``num_prefix_tokens > 0`` is an error.

  Attributes:
    num_heads: number of heads H.
    head_dim: per-head width; ``None`` means ``C // H``.
    qkv_bias: bias on ``qk`` and ``v`` (False in ConViT).
    attn_drop: dropout on the mixed attention (forces the explicit path when training).
    proj_drop: dropout after ``proj``.
    implementation: the model's kernel setting (``locvit.platform.ops``): None (JAX's choice),
    'xla',
      'cudnn' or 'cpu_kernels' (see the module docstring).
    locality_strength: ``alpha`` of Eq. 5 (1.0 in ConViT).
    use_local_init: convolutional init (``v = I``, ``pos_proj`` centres) rather than plain
      trunc-normal. If H is not a perfect square only the first ``int(sqrt(H))^2`` heads get a
      centre; the rest keep random ``pos_proj`` weights (faithful to the reference) and a warning
      is emitted at init.
    gating_init: initial lambda of every head (1.0 in the reference; 0.0 with frozen gates gives
      ConViT Table 3's "equal attention to content and position").
    variant: 'gpsa' (gate after the softmaxes) or 'psa' (content + positional logits in one
      softmax, no gate; registered as attention kind 'psa').
    fused: use the batch-shared positional table and a fused kernel (module docstring) when
      no attention maps are collected and no attention dropout is active. False always runs the
      reference's explicit form.
    dtype, param_dtype: computation and parameter dtypes. Positional logits and softmaxes are
      computed in float32.

  Intermediates (with ``mutable=['intermediates']``): ``attention`` ``(B, H, N, N)`` (the mixed,
  renormalised map), ``pos_attention`` ``(H, N, N)`` and, for GPSA, ``gate`` ``(H,)`` =
  ``sigmoid(gating_param)``.
  """

  qkv_bias: bool = False
  locality_strength: float = 1.0
  use_local_init: bool = True
  gating_init: float = 1.0
  variant: Variant = "gpsa"
  fused: bool = True
  choices: ClassVar[dict[str, tuple[Any, ...]]] = {"variant": VARIANTS}

  def _dense(self, features, names, name, *, kernel_init=None):
    """A full-rank-kernel projection whose kernel axes are ``names`` (input, then outputs)."""
    kwargs = self._dense_kwargs()
    kwargs["kernel_init"] = kernel_init or self.kernel_init
    return DenseGeneral(features, names, use_bias=self.qkv_bias, name=name, **kwargs)

  def _pos_logits(self, grid: TokenGrid) -> Array:
    """``(H, N, N)`` float32 logits ``v_pos^h . r_ij``, shared by the whole batch."""
    kernel_init = self.kernel_init
    if self.use_local_init:
      kernel_init = local_pos_proj_init(self.num_heads, self.locality_strength, self.kernel_init)
    pos_proj = nn.Dense(
      self.num_heads,
      dtype=jnp.float32,  # large-alpha logits feed a softmax: keep them in float32
      param_dtype=self.param_dtype,
      kernel_init=partitioned(kernel_init, (None, "heads")),
      bias_init=partitioned(zeros, ("heads",)),
      name="pos_proj",
    )
    return jnp.transpose(pos_proj(gpsa_relative_features(grid, in_graph=True)), (2, 0, 1))

  def _prefix_token_error(self, num_prefix_tokens: int) -> str:
    return (
      f"{self.variant.upper()} attention is defined on patch tokens only, got "
      f"num_prefix_tokens={num_prefix_tokens}: apply it to the patch tokens x[:, "
      f"{num_prefix_tokens}:] and add the class token after it, as ConViT inserts its class token "
      "after the last GPSA layer (locvit's ConViT: class_token_layer >= the number of GPSA "
      "layers)."
    )

  def _forward(self, call: LayerCall) -> Array:
    x, train, row_scale = call.x, call.train, call.row_scale
    dim = x.shape[-1]
    grid = check_grid_tokens(call.grid, x.shape[1])
    heads, head_dim = self.num_heads, projections.head_dim(dim, self.num_heads, self.head_dim)

    qk = self._dense((2, heads, head_dim), ("embed", None, "heads", "kv"), "qk")(x)
    q, k = projections.split_projections(qk, self.implementation)  # (B, N, H, Dh): BTNH
    v = self._dense(
      (heads, head_dim),
      ("embed", "heads", "kv"),
      "v",
      kernel_init=identity_init if self.use_local_init else None,
    )(x)
    if self.use_local_init and self.is_initializing():
      warn_if_not_square(heads)
    pos_logits = self._pos_logits(grid)
    pos = jax.nn.softmax(pos_logits, axis=-1)
    self.sow("intermediates", "pos_attention", pos)
    if self.variant == "gpsa":
      gating_param = self.param(
        "gating_param",
        partitioned(nn.initializers.constant(self.gating_init), ("heads",)),
        (heads,),
        self.param_dtype,
      )
      gate = jax.nn.sigmoid(gating_param.astype(jnp.float32))
      self.sow("intermediates", "gate", gate)
      term = Term(pos, "gate", gate)
    else:  # PSA: positional logits are an additive bias of the content logits
      term = Term(pos_logits, "add")
    y = attend(
      self,
      q,
      k,
      v,
      terms=(term,),
      attn_drop=self.attn_drop,
      train=train,
      implementation=self.implementation,
      fused=self.fused,
    )
    return output_projection(dim, **self._dense_kwargs())(y, row_scale)


@register_attention("psa")
def psa(**kwargs: Any) -> GPSA:
  """Ungated positional self-attention (ConViT Eq. 4 / appendix A) with the Eq. 5 local init."""
  kwargs.setdefault("variant", "psa")
  return GPSA(**kwargs)
