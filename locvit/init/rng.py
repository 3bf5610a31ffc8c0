"""Host-side helpers for initializers: deterministic NumPy random streams, BLAS threading."""

from __future__ import annotations

import contextlib
import hashlib

import numpy as np


def numpy_rng(seed: int, *tags: object) -> np.random.Generator:
  """A generator determined by ``seed`` and any tags (e.g. a parameter path or a solve index)."""
  digest = hashlib.sha256(repr((int(seed), *map(str, tags))).encode()).digest()
  return np.random.default_rng(np.frombuffer(digest, np.uint32))


def truncated_normal(
  rng: np.random.Generator, std: float, bound: float, shape: tuple[int, ...]
) -> np.ndarray:
  """N(0, std^2) truncated to [-bound, bound] (absolute), like ``torch.nn.init.trunc_normal_``."""
  out = rng.normal(0.0, std, shape)
  bad = np.abs(out) > bound
  while bad.any():  # rejection: redraw the out-of-range entries
    out[bad] = rng.normal(0.0, std, int(bad.sum()))
    bad = np.abs(out) > bound
  return out


def single_threaded_blas():
  """Context limiting NumPy's BLAS/LAPACK to one thread.

  The initializers run many small SVDs; on a loaded host a multi-threaded OpenBLAS spends most of
  its time spinning (48 SVDs of 192 x 192 took 30 s instead of 1 s on the shared 2-core machine).
  """
  try:
    from threadpoolctl import threadpool_limits  # a dependency of scikit-learn
  except ImportError:  # pragma: no cover
    return contextlib.nullcontext()
  return threadpool_limits(limits=1, user_api="blas")
