"""XLA's FLOP count of a jitted computation, from its cost analysis.

XLA:GPU counts nothing for a lowered (not yet compiled) computation, so the count then comes from
the compiled executable. The compiled count leaves out what runs as library calls (cuBLAS GEMMs,
cuDNN attention on GPU), so callers that need every FLOP lower with attention written out.
"""

from __future__ import annotations

from typing import Any


def _cost_flops(cost: Any) -> float | None:
  """The ``flops`` of a cost analysis: JAX returns a dict, a list of one dict per program (older
  versions), or None where the backend counts nothing."""
  if isinstance(cost, list | tuple):
    cost = cost[0] if cost else None
  if not cost or "flops" not in cost:
    return None
  return float(cost["flops"])


def xla_flops(stage: Any) -> float:
  """XLA's FLOP count of ``stage``, a ``jax.stages.Lowered`` or ``Compiled``: a lowered one's own
  count, else (XLA:GPU) its compiled executable's; NaN where XLA counts nothing."""
  flops = _cost_flops(stage.cost_analysis())
  if flops is None and hasattr(stage, "compile"):
    flops = _cost_flops(stage.compile().cost_analysis())
  return float("nan") if flops is None else flops
