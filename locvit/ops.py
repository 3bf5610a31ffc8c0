"""Token-wise linear maps that XLA:CPU differentiates quickly.

A projection of ``(B, N, C)`` tokens is one matrix product, but XLA:CPU lowers the *weight
gradient* of the 3-D form (a contraction over both ``B`` and ``N``) and of full-rank attention
kernels such as ``(C, 3, H, Dh)`` far more slowly than the same product on 2-D operands: a
pre-norm MLP's forward + backward pass at 196 tokens is 1.23x faster and a fused qkv projection
1.6x faster with both operands reshaped to matrices first (``benchmarks/attention_kernels.py``).
On CPU these helpers therefore flatten to ``(B * N, C) @ (C, F)`` and reshape back; the reshapes
are free. ``locvit.models.layers.PatchProjection`` does the same for the patch embedding
(patchify + matmul instead of a strided convolution). On GPU and TPU they call ``dot_general`` on
the original shapes, which keeps the logical sharding of full-rank kernels (heads split over a
``model`` mesh axis) intact.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

Array = jax.Array


# None: flatten on XLA:CPU only. True / False force it (read when a function is traced), e.g.
# ``locvit.ops.FLATTEN_MATMULS = False`` for the before/after table of the ConViT benchmark.
FLATTEN_MATMULS: bool | None = None


def flatten_matmuls() -> bool:
  """True when projections are computed as 2-D matmuls (by default: the backend is XLA:CPU)."""
  if FLATTEN_MATMULS is not None:
    return FLATTEN_MATMULS
  return jax.default_backend() == "cpu"


def contract(x: Array, kernel: Array, num_contracting: int = 1) -> Array:
  """Contracts the last ``num_contracting`` axes of ``x`` with the first ones of ``kernel``.

  ``(..., *in) x (*in, *out) -> (..., *out)``, as ``jnp.tensordot(x, kernel, num_contracting)``.
  """
  if not flatten_matmuls():
    return jnp.tensordot(x, kernel, axes=num_contracting)
  lead = x.shape[: x.ndim - num_contracting]
  out = kernel.shape[num_contracting:]
  fan_in = math.prod(kernel.shape[:num_contracting])
  y = jnp.reshape(x, (-1, fan_in)) @ jnp.reshape(kernel, (fan_in, math.prod(out)))
  return jnp.reshape(y, (*lead, *out))


def dense_dot_general(
  lhs: Array,
  rhs: Array,
  dimension_numbers: Any,
  precision: Any = None,
  preferred_element_type: Any = None,
  **kwargs: Any,
) -> Array:
  """Drop-in ``lax.dot_general`` for ``nn.Dense(dot_general=...)``: flattens on CPU (see above).

  Only the ``nn.Dense`` pattern (last axis of ``lhs`` with axis 0 of a 2-D ``rhs``, no batch
  axes) is flattened; anything else goes to ``lax.dot_general`` unchanged.
  """
  (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers
  dense_pattern = (
    flatten_matmuls()
    and lhs.ndim > 2
    and rhs.ndim == 2
    and tuple(lhs_contract) == (lhs.ndim - 1,)
    and tuple(rhs_contract) == (0,)
    and not lhs_batch
    and not rhs_batch
  )
  if not dense_pattern:
    return lax.dot_general(
      lhs,
      rhs,
      dimension_numbers,
      precision=precision,
      preferred_element_type=preferred_element_type,
      **kwargs,
    )
  y = lax.dot_general(
    jnp.reshape(lhs, (-1, lhs.shape[-1])),
    rhs,
    (((1,), (0,)), ((), ())),
    precision=precision,
    preferred_element_type=preferred_element_type,
    **kwargs,
  )
  return jnp.reshape(y, (*lhs.shape[:-1], rhs.shape[1]))
