"""Mimetic initialization (Trockman & Kolter 2023), as the structured-init reference applies it.

The "Mimetic" baseline of Zheng, Li, Lucey (Sec. 5.1; Tables 2, 3 and 6; Fig. 3).

Per layer and head, ``A = alpha * Z + beta * I`` with ``Z ~ U(-sqrt(3/D), sqrt(3/D))`` (D x D);
``A = U S V`` (SVD), ``L = U sqrt(S)``, ``R = sqrt(S) V``. The query kernel of the head is
``L[:, :hd]`` and the key kernel ``R^T[:, :hd]``, so ``W_q W_k^T`` is the best rank-``hd``
approximation of ``A`` (exactly ``A`` when ``hd = D``). The reference uses alpha = beta = 0.7.

Value / output projection, per layer: ``A_v = 0.4 * Z - 0.4 * I`` and its ``L, R``:

- ``vproj='reference'`` (default, faithful): the reference writes torch weights ``V = L``,
  ``Proj = R``, i.e. ``x -> x L^T R^T``, whose matrix is NOT ``A_v`` (about 0.95 relative error:
  ``L^T R^T = (R L)^T`` with ``R L = sqrt(S) V U sqrt(S)``).
- ``vproj='corrected'``: ``W_v W_proj = L R = A_v``, as the mimetic paper intends.
- ``vproj='none'``: value and output projection untouched.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from locvit.init.layout import (
  AttentionLayout,
  attention_dims,
  find_qk_kernels,
  flatten,
  set_qk,
  sibling,
  unflatten,
  value_path,
)
from locvit.init.rng import numpy_rng, single_threaded_blas

VPROJ_MODES = ("reference", "corrected", "none")


def mimetic_matrix(rng: np.random.Generator, dim: int, alpha: float, beta: float) -> np.ndarray:
  """``alpha * U(-sqrt(3/D), sqrt(3/D)) + beta * I`` (beta may be negative), float64."""
  bound = np.sqrt(3.0 / dim)
  return alpha * rng.uniform(-bound, bound, (dim, dim)) + beta * np.eye(dim)


def split_factors(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """``(L, R)`` with ``L = U sqrt(S)``, ``R = sqrt(S) V`` and ``L @ R = A``."""
  u, s, vt = np.linalg.svd(a)
  root = np.sqrt(s)
  return u * root, root[:, None] * vt


def mimetic_qk(
  rng: np.random.Generator, dim: int, head_dim: int, alpha: float, beta: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """One head: ``(W_q, W_k, A)`` with ``W_q, W_k: (D, hd)`` and ``W_q W_k^T ~ A``."""
  a = mimetic_matrix(rng, dim, alpha, beta)
  left, right = split_factors(a)
  return left[:, :head_dim], right.T[:, :head_dim], a


def mimetic_vproj(
  rng: np.random.Generator, dim: int, alpha: float, beta: float, vproj: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """One layer: flat ``(W_v, W_proj, A_v)``, both ``(D, D)``, applied as ``x W_v W_proj``."""
  a = mimetic_matrix(rng, dim, alpha, beta)
  left, right = split_factors(a)
  if vproj == "reference":
    return left.T, right.T, a  # torch weights (out, in) = (L, R): x L^T R^T
  return left, right, a


def apply_mimetic(
  params: Any,
  layout: AttentionLayout,
  *,
  seed: int = 0,
  alpha: float = 0.7,
  beta: float = 0.7,
  v_alpha: float = 0.4,
  v_beta: float = -0.4,
  vproj: str = "reference",
) -> Any:
  """Writes mimetic q/k (and value/output) kernels into every attention layer of ``params``
  (Trockman & Kolter's init, the "Mimetic" rows of Zheng, Li, Lucey Tables 2, 3 and 6)."""
  if vproj not in VPROJ_MODES:
    raise ValueError(f"vproj={vproj!r} is not one of {VPROJ_MODES}.")
  flat = {k: np.asarray(v) for k, v in flatten(params).items()}
  paths = find_qk_kernels(flat, layout)
  dim, heads, head_dim = attention_dims(flat, paths)
  if head_dim > dim:
    raise ValueError(f"Mimetic init needs head_dim <= dim, got head_dim={head_dim}, dim={dim}.")
  with single_threaded_blas():
    for layer, path in enumerate(paths):
      rng = numpy_rng(seed, "mimetic", layer)
      pairs = [mimetic_qk(rng, dim, head_dim, alpha, beta)[:2] for _ in range(heads)]
      q = np.stack([p[0] for p in pairs], axis=1)  # (C, H, Dh)
      k = np.stack([p[1] for p in pairs], axis=1)
      flat[path] = set_qk(flat[path], layout, q, k)
      if vproj != "none":
        _write_vproj(flat, path, layout, rng, v_alpha, v_beta, vproj, (dim, heads, head_dim))
  return unflatten(flat, params)


def _write_vproj(flat, path, layout, rng, alpha, beta, vproj, dims) -> None:
  dim, heads, head_dim = dims
  if heads * head_dim != dim:
    raise ValueError(
      f"Mimetic value/output init needs heads * head_dim == dim, got {heads} * {head_dim} != "
      f"{dim}; use vproj='none'."
    )
  if layout.proj_module is None:
    raise ValueError(f"Layout {layout.name!r} has no output projection; use vproj='none'.")
  proj_path = sibling(path, layout.proj_module)
  if proj_path not in flat or flat[proj_path].shape != (heads, head_dim, dim):
    raise ValueError(f"Expected an (H, Dh, C) output kernel at {'/'.join(proj_path)}.")
  v_flat, proj_flat, _ = mimetic_vproj(rng, dim, alpha, beta, vproj)
  vpath, stacked = value_path(flat, path, layout)
  v = v_flat.reshape(dim, heads, head_dim)
  if stacked:
    flat[vpath] = flat[vpath].copy()
    flat[vpath][:, layout.v_index] = v.astype(flat[vpath].dtype)
  else:
    flat[vpath] = v.astype(flat[vpath].dtype)
  flat[proj_path] = proj_flat.reshape(heads, head_dim, dim).astype(flat[proj_path].dtype)
