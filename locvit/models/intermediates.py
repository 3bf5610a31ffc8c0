"""Per-layer intermediates (token states, attention maps) for analysis, big_vision style."""

from __future__ import annotations

from typing import Any

import flax
import flax.linen as nn
import jax


def apply_with_intermediates(
  model: nn.Module, variables: Any, images: jax.Array, *, train: bool = False, rngs=None
) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Runs ``model`` and returns ``(logits, {path: value})``.

  Paths are slash-joined module paths, e.g. ``'blocks_3/attn/attention'`` holds the ``(B, H, N, N)``
  attention probabilities of layer 3 and ``'block_3'`` the tokens after it. Asking for
  intermediates makes attention layers materialise their probabilities (no fused kernel).
  """
  logits, state = model.apply(variables, images, train=train, rngs=rngs, mutable=["intermediates"])
  flat = flax.traverse_util.flatten_dict(state["intermediates"], sep="/")
  # sow() stores a tuple per call; every layer here is called once.
  return logits, {k: v[0] if isinstance(v, tuple) else v for k, v in flat.items()}
