"""Exact top-1 / top-5 evaluation over a whole split, at any batch size and device count.

The eval pipeline pads the last batches and marks real examples with ``mask``; the step sums
correct predictions over masked examples only, so no example is dropped or counted twice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from locvit.platform import sharding


def eval_step(
  model: nn.Module,
  variables: Any,
  batch: dict[str, jax.Array],
  prepare: Callable[[jax.Array], jax.Array] | None = None,
) -> dict[str, jax.Array]:
  """Sums of correct top-1 / top-5, loss and example count over the real (masked) examples.

  ``variables`` is ``(params, model_state)``; model_state holds e.g. BatchNorm statistics.
  ``prepare`` maps the batch's images to the model's input (the training loop passes the uint8
  normalisation, ``device_augment.normalize``).
  """
  params, model_state = variables
  images = batch["image"] if prepare is None else prepare(batch["image"])
  logits = model.apply({"params": params, **model_state}, images, train=False)
  labels, mask = batch["label"], batch["mask"].astype(jnp.float32)
  top5 = jax.lax.top_k(logits, min(5, logits.shape[-1]))[1]
  loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  return {
    "top1": jnp.sum((top5[:, 0] == labels) * mask),
    "top5": jnp.sum(jnp.any(top5 == labels[:, None], axis=-1) * mask),
    "loss": jnp.sum(loss * mask),
    "count": jnp.sum(mask),
  }


def make_eval_step(model, mesh, rules, variable_shardings, prepare=None) -> Callable:
  """Jitted ``eval_step``; ``variable_shardings`` matches ``(params, model_state)``; ``prepare``
  as in ``eval_step``."""
  batch_sh = sharding.batch_sharding(mesh, rules)
  return jax.jit(
    lambda variables, batch: eval_step(model, variables, batch, prepare),
    in_shardings=(variable_shardings, batch_sh),
    out_shardings=sharding.replicated(mesh),
  )


def evaluate(
  step_fn: Callable,
  variables: Any,
  batches: Iterable[dict[str, np.ndarray]],
  batch_sharding,
  on_batch: Callable[[int], None] | None = None,
) -> dict[str, float]:
  """Runs ``step_fn`` over all batches; returns ``eval/top1``, ``eval/top5`` (fractions) etc.
  ``on_batch(batches_done)`` is called after each batch (progress lines)."""
  totals = None
  for done, local in enumerate(batches, 1):
    out = step_fn(variables, sharding.global_batch(local, batch_sharding))
    totals = out if totals is None else jax.tree.map(jnp.add, totals, out)
    if on_batch is not None:
      on_batch(done)
  if totals is None:
    raise ValueError("The evaluation split is empty.")
  totals = jax.device_get(totals)
  count = float(totals["count"])
  return {
    "eval/top1": float(totals["top1"]) / count,
    "eval/top5": float(totals["top5"]) / count,
    "eval/loss": float(totals["loss"]) / count,
    "eval/num_examples": round(count),
  }
