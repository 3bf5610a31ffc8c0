"""Per-layer intermediates (token states, attention maps) for analysis, big_vision style."""

from __future__ import annotations

import re
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


def collect_attention_maps(intermediates: dict[str, jax.Array]) -> dict[str, jax.Array]:
  """The attention probabilities the attention core sows, ``{layer path: (B, H, T, T)}`` (e.g.
  ``'blocks_3/attn'``, ``'stages_1/blocks_0/attn'``), in layer order (``blocks_2`` before
  ``blocks_10``); ``intermediates`` is ``apply_with_intermediates``'s dict. Every analysis of
  attention maps starts here.
  """
  maps = {k.removesuffix("/attention"): v for k, v in intermediates.items()}
  maps = {path: v for path, v in maps.items() if f"{path}/attention" in intermediates}
  natural = lambda path: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path)]
  return {path: maps[path] for path in sorted(maps, key=natural)}


def block_attention_maps(intermediates: dict[str, jax.Array]) -> dict[int, jax.Array]:
  """``{block index: (B, H, T, T)}`` of a ``VisionTransformer`` (its ``blocks_i/attn`` layers)."""
  maps = collect_attention_maps(intermediates).items()
  return {int(m[1]): v for path, v in maps if (m := re.fullmatch(r"blocks_(\d+)/attn", path))}
