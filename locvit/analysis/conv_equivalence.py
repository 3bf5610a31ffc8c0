"""Theorem 1 of Cordonnier et al. (ICLR 2020), executable: a convolution as quadratic attention.

A multi-head self-attention layer with ``N_h >= K^2`` heads, ``Dh >= Dout`` and the quadratic
relative encoding can express any ``K x K`` convolution (Lemmas 1 and 2). The construction: head
``h`` gets the centre ``Delta_h`` = one of the ``K x K`` shifts and a large ``alpha``, so its
attention is (numerically) one-hot on the key at ``query + Delta_h``; its value/output matrices
``W^(h) = W_val^(h) W_out^(h)`` are the convolution tap at that shift; the output bias is the
convolution bias. ``alpha = 50`` is ample in float32 (the paper notes 46 suffices: the other keys
get ``exp(-alpha)`` relative weight).

Borders: attention normalises over the pixels that exist, so a head whose shifted key falls
outside the image puts its mass on the nearest existing pixels instead of reading a zero-padded
value. The layer therefore equals ``lax.conv_general_dilated(x, kernel, padding='SAME')`` on the
*interior* pixels (those whose whole ``K x K`` window is inside the image). Zero-padding the image
by the kernel's half-widths before the attention and cropping afterwards (the paper's remark on
padding) makes it equal everywhere: ``ConvAsAttention(images, pad=True)``.

  conv = conv_to_quadratic_attention(kernel, bias)         # kernel (K, K, Din, Dout), HWIO
  out = conv(images)                                       # (B, H, W, Dout), NHWC
  conv.module.apply(conv.variables, tokens, grid=grid)     # the attention layer itself
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from locvit.attention import Attention, TokenGrid
from locvit.attention.relative import LAYOUTS, QuadraticPositional, RelativeAttention

Array = jax.Array


def kernel_shifts(kernel_size: tuple[int, int]) -> list[tuple[int, int]]:
  """Shift ``(d_row, d_col)`` of every tap ``(a, b)`` (row-major) under 'SAME' padding.

  ``lax.conv_general_dilated(padding='SAME')`` pads ``(K - 1) // 2`` before, so tap ``a`` reads
  the input at ``row + a - (K - 1) // 2``.
  """
  k1, k2 = kernel_size
  return [(a - (k1 - 1) // 2, b - (k2 - 1) // 2) for a in range(k1) for b in range(k2)]


def same_padding(kernel_size: tuple[int, int]) -> tuple[tuple[int, int], tuple[int, int]]:
  """The ``((top, bottom), (left, right))`` zero padding of 'SAME' for stride 1."""
  return tuple(((k - 1) // 2, k // 2) for k in kernel_size)  # type: ignore[return-value]


def interior_mask(height: int, width: int, kernel_size: tuple[int, int]) -> np.ndarray:
  """``(H, W)`` bool: pixels whose whole kernel window lies inside the image."""
  (top, bottom), (left, right) = same_padding(kernel_size)
  mask = np.zeros((height, width), bool)
  mask[top : height - bottom, left : width - right] = True
  return mask


@dataclasses.dataclass(frozen=True)
class ConvAsAttention:
  """A quadratic-attention layer and its variables that compute a convolution (Cordonnier et al.
  Theorem 1).

  Attributes:
    module: the attention layer (``RelativeAttention`` or ``Attention``), called on ``(B, N, Din)``
      tokens with ``grid=TokenGrid(H, W)``.
    variables: ``{'params': ...}`` for ``module``.
    kernel_size: ``(K1, K2)``.
  """

  module: nn.Module
  variables: dict[str, Any]
  kernel_size: tuple[int, int]

  def __call__(self, images: Array, *, pad: bool = False) -> Array:
    """Applies the layer to NHWC ``images``; ``pad=True`` zero-pads first and crops after."""
    if pad:
      padding = same_padding(self.kernel_size)
      images = jnp.pad(images, ((0, 0), *padding, (0, 0)))
    batch, height, width, channels = images.shape
    grid = TokenGrid(height, width)
    tokens = images.reshape(batch, grid.num_tokens, channels)
    out = jax.jit(functools.partial(self.module.apply, grid=grid))(self.variables, tokens)
    out = out.reshape(batch, height, width, out.shape[-1])
    if pad:
      (top, bottom), (left, right) = same_padding(self.kernel_size)
      out = out[:, top : height - bottom, left : width - right]
    return out


def _checked(kernel, bias, num_heads, layout, alpha) -> tuple[Array, Array, int]:
  """The kernel and bias as float32 arrays and the head count, or a ValueError naming the
  argument that cannot give Theorem 1's layer."""
  kernel = jnp.asarray(kernel, jnp.float32)
  if kernel.ndim != 4:
    raise ValueError(f"kernel must be (K1, K2, Din, Dout) (HWIO), got shape {kernel.shape}.")
  k1, k2, _, dout = kernel.shape
  taps = k1 * k2
  heads = taps if num_heads is None else num_heads
  if heads < taps:
    raise ValueError(
      f"A {k1}x{k2} convolution needs at least {taps} attention heads (one per kernel shift, "
      f"Theorem 1), got num_heads={heads}."
    )
  if layout not in LAYOUTS:
    raise ValueError(f"layout={layout!r} is not one of {LAYOUTS}.")
  if alpha <= 0:
    raise ValueError(f"alpha={alpha} must be positive.")
  bias = jnp.zeros((dout,), jnp.float32) if bias is None else jnp.asarray(bias, jnp.float32)
  if bias.shape != (dout,):
    raise ValueError(f"bias must have shape ({dout},), got {bias.shape}.")
  return kernel, bias, heads


def conv_to_quadratic_attention(
  kernel: Array,
  bias: Array | None = None,
  *,
  num_heads: int | None = None,
  alpha: float = 50.0,
  layout: str = "reference",
  head_dim: int | None = None,
  generalized: bool = False,
) -> ConvAsAttention:
  """Parameters of a quadratic-attention layer equal to the convolution ``kernel`` (Cordonnier et
  al. Theorem 1: Lemma 1's heads, Lemma 2's Eq. 9 encoding).

  Args:
    kernel: ``(K1, K2, Din, Dout)`` (HWIO, as ``lax.conv_general_dilated`` with
      ``('NHWC', 'HWIO', 'NHWC')``). The theorem's ``K x K`` is ``K1 = K2``; rectangular kernels
      work the same way.
    bias: ``(Dout,)`` or None.
    num_heads: heads of the layer; None means ``K1 * K2``. Extra heads get zero value weights.
    alpha: attention sharpness, ``-alpha ||delta - Delta||^2`` (spread ``s = sqrt(2 alpha)``).
    layout: 'reference' (``RelativeAttention``: raw inputs as values and one merged value
      projection, any ``Dout``) or 'standard' (the library's ``Attention`` with q/k/v and output
      projections; it maps back to its input width, so it needs ``Dout == Din``).
    head_dim: per-head width ``Dh`` for the 'standard' layout; None means ``Dout``. Must be
      ``>= Dout`` (the theorem's condition).
    generalized: use the generalized (2x2 ``Sigma^{-1/2}``) parameterisation, set to
      ``sqrt(2 alpha) I``.

  Returns:
    ``ConvAsAttention`` with the module and its variables.
  """
  kernel, bias, heads = _checked(kernel, bias, num_heads, layout, alpha)
  k1, k2, din, dout = kernel.shape
  taps = k1 * k2
  centers = np.zeros((heads, 2), np.float32)
  centers[:taps] = np.asarray(kernel_shifts((k1, k2)), np.float32)
  spread = math.sqrt(2.0 * alpha)
  if generalized:
    spreads = jnp.broadcast_to(spread * jnp.eye(2, dtype=jnp.float32), (heads, 2, 2))
  else:
    spreads = jnp.full((heads,), spread, jnp.float32)
  taps_w = kernel.reshape(taps, din, dout)  # row-major taps, same order as kernel_shifts
  weights = jnp.zeros((heads, din, dout), jnp.float32).at[:taps].set(taps_w)
  positional = {"attention_centers": jnp.asarray(centers), "attention_spreads": spreads}

  if layout == "reference":
    module = RelativeAttention(
      num_heads=heads,
      kind="quadratic_generalized" if generalized else "quadratic",
      out_dim=dout,
    )
    params = {"positional": positional, "value": {"kernel": weights, "bias": bias}}
    return ConvAsAttention(module, {"params": params}, (k1, k2))

  if din != dout:
    raise ValueError(
      f"layout='standard' (the library's Attention) projects back to its input width, so it "
      f"needs Din == Dout; got Din={din}, Dout={dout}. Use layout='reference'."
    )
  dh = dout if head_dim is None else head_dim
  if dh < dout:
    raise ValueError(f"Theorem 1 needs head_dim >= Dout, got head_dim={dh} < Dout={dout}.")
  qkv_kernel = jnp.zeros((din, 3, heads, dh), jnp.float32)
  qkv_kernel = qkv_kernel.at[:, 2, :, :dout].set(jnp.transpose(weights, (1, 0, 2)))
  proj_kernel = jnp.zeros((heads, dh, dout), jnp.float32)
  proj_kernel = proj_kernel.at[:, :dout, :].set(jnp.eye(dout, dtype=jnp.float32))
  module = Attention(
    num_heads=heads,
    head_dim=dh,
    positional=QuadraticPositional(heads, generalized=generalized, parent=None),
    combine="replace",
  )
  params = {
    "positional": positional,
    "qkv": {"kernel": qkv_kernel, "bias": jnp.zeros((3, heads, dh), jnp.float32)},
    "proj": {"kernel": proj_kernel, "bias": bias},
  }
  return ConvAsAttention(module, {"params": params}, (k1, k2))
