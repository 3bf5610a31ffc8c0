"""Pseudo inputs for the impulse solve (Sec. 4.1 "Pseudo input", Sec. 5.4, Tables 4 and 7).

The solver never sees data: it fits ``softmax(X Q K X^T / sqrt(hd))`` to impulse matrices on a
pseudo input ``X = LayerNorm(P)`` (no affine, eps 1e-5, Algorithm 1 line 3). ``P`` is one of

- ``'pe'``: the fixed 2-D sin-cos position embedding of the model (reference code 'P');
- ``'gaussian'``: trunc-normal, std sqrt(0.5), truncated at [-2, 2] (absolute; 'G'); the
  reference code's std, where Sec. 5.4's text says 0.5;
- ``'uniform'``: U(-1, 1) ('U');
- ``'pe+gaussian'`` ('B') and ``'pe+uniform'`` ('A'): the embedding plus that noise.

Random inputs are drawn once per solve and kept fixed during it, as in the paper.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from locvit.attention import TokenGrid
from locvit.configs.defaults import PSEUDO_INPUTS  # plain data, shared with the configs
from locvit.init.rng import truncated_normal
from locvit.models.layers import sincos_2d_position_embedding

# The reference code's one-letter names, accepted as aliases.
REFERENCE_CODES = {
  "P": "pe",
  "G": "gaussian",
  "U": "uniform",
  "B": "pe+gaussian",
  "A": "pe+uniform",
}
GAUSSIAN_STD = float(np.sqrt(0.5))
GAUSSIAN_BOUND = 2.0  # absolute truncation, as torch.nn.init.trunc_normal_(a=-2, b=2)
LAYER_NORM_EPS = 1e-5


def canonical_pseudo_input(kind: str) -> str:
  """Validates a pseudo-input name (or reference code) and returns its canonical name."""
  name = REFERENCE_CODES.get(kind, kind)
  if name not in PSEUDO_INPUTS:
    raise ValueError(
      f"Unknown pseudo input {kind!r}. Valid choices: {list(PSEUDO_INPUTS)} "
      f"(or the reference codes {sorted(REFERENCE_CODES)})."
    )
  return name


def raw_pseudo_input(
  kind: str, grid: TokenGrid, dim: int, rng: np.random.Generator | None = None
) -> np.ndarray:
  """``P`` of shape ``(N, dim)`` float32, before the layer norm (``rng`` for random kinds).

  The pseudo inputs of Zheng, Li, Lucey Sec. 4.1 / Sec. 5.4 (Tables 4 and 7). Raises ValueError
  for an unknown kind or a random kind without ``rng``.
  """
  kind = canonical_pseudo_input(kind)
  shape = (grid.num_tokens, dim)
  out = np.zeros(shape, np.float64)
  if kind.startswith("pe"):
    out += sincos_2d_position_embedding(grid, dim)
  if kind != "pe" and rng is None:
    raise ValueError(f"Pseudo input {kind!r} is random: pass a NumPy Generator.")
  if kind.endswith("gaussian"):
    out += truncated_normal(rng, GAUSSIAN_STD, GAUSSIAN_BOUND, shape)
  elif kind.endswith("uniform"):
    out += rng.uniform(-1.0, 1.0, shape)
  return out.astype(np.float32)


def layer_norm(x: np.ndarray | jax.Array, eps: float = LAYER_NORM_EPS) -> jax.Array:
  """LayerNorm over the last axis without affine parameters (torch's ``F.layer_norm``)."""
  x = jnp.asarray(x, jnp.float32)
  mean = jnp.mean(x, -1, keepdims=True)
  var = jnp.mean(jnp.square(x - mean), -1, keepdims=True)
  return (x - mean) * jax.lax.rsqrt(var + eps)


def layer_norm_np(x: np.ndarray, eps: float = LAYER_NORM_EPS) -> np.ndarray:
  """NumPy twin of ``layer_norm`` (float64 inside) for host-side set-up."""
  x = np.asarray(x, np.float64)
  centred = x - x.mean(-1, keepdims=True)
  return centred / np.sqrt(np.mean(centred**2, -1, keepdims=True) + eps)


def pseudo_input(
  kind: str, grid: TokenGrid, dim: int, rng: np.random.Generator | None = None
) -> np.ndarray:
  """The solver's ``X = LayerNorm(P)``, shape ``(N, dim)`` float32 (Zheng, Li, Lucey Algorithm 1,
  line 3; Eq. 8's ``X~``)."""
  return layer_norm_np(raw_pseudo_input(kind, grid, dim, rng)).astype(np.float32)
