"""Locality of attention: nonlocality, gates and attention centres (ConViT, Sec. 4).

d'Ascoli et al. 2021, "ConViT". For every layer and head of a ``VisionTransformer``:

- **nonlocality** (Eq. 8): ``D^{l,h} = (1/N) sum_ij A^{l,h}_ij ||delta_ij||`` with ``A`` averaged
  over a batch of images and ``||delta_ij||`` the Euclidean distance between patches i and j, in
  patches. It is the mean distance, over query patches, from a query to what it attends to.
- **gate** ``sigmoid(lambda_h)`` of GPSA layers (Eq. 7): the weight of positional attention.
- **attention centre and span** of GPSA/PSA layers, read from ``pos_proj`` (columns dx, dy, d2 of
  timm's ``(H, 3)`` weight): ``span = -1 / w[:, 2]``, ``Delta = (w[:, 0] span / 2,
  w[:, 1] span / 2)``, since ``w . r = w_2 ||delta - Delta||^2 + const``. ``span = 1 / alpha``
  (Eq. 5) and ``||Delta||`` is the distance of the centre from the query.

Two ways to obtain the attention maps (``mode``):

- ``'per_layer'``: the real attention of each layer on its real input (``pos_embed`` added,
  pre-norm applied, every earlier block run), from ``apply_with_intermediates``. Rows and columns
  of a class token (MHSA layers once it is inserted) are dropped and each patch row is
  renormalised over the patch keys, so the metric is the expected distance to the patch attended
  to (identical to Eq. 8 for layers without a class token, whose rows already sum to 1).
- ``'faithful'``: what the official ConViT repository logs: ``patch_embed(x)`` alone (no
  ``pos_embed``, no LayerNorm, no earlier blocks) is fed to EVERY layer's attention module, so
  no layer sees its real input (not even the first: it lacks ``pos_embed`` and ``norm1``); the
  values describe each layer's weights applied to raw patch embeddings. Use it to compare with
  the paper's curves (Figs. 5, 10, 13).

Layers are indexed from 0, as the parameters (``blocks_i``); the paper counts from 1.

Usage in a training loop (compiled once, called at each evaluation)::

  locality_fn = make_locality_logger(config, model, mesh, eval_source)  # None unless enabled
  record.update(locality_fn(state.params))   # {'locality/nonlocality/layer_3': 1.7, ...}

or, by hand, ``make_locality_fn(model, mode)(params, images)`` with
``images = fixed_eval_images(config, 64)``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from locvit.attention import TokenGrid, get_attention, squared_distances

# Plain data beside the shipped configs (which must not import JAX); the library names stay.
from locvit.models import VisionTransformer, apply_with_intermediates, block_attention_maps
from locvit.models.layers import PatchEmbed

Array = jax.Array
MODES = ("per_layer", "faithful")
PREFIX = "locality"
# Per-layer statistics: name -> (H,) array (or (H, 2) for 'center').
LayerStats = dict[str, Array]


# ------------------------------------------------------------------------------------------------
# Per-head quantities


def distance_matrix(grid: TokenGrid) -> np.ndarray:
  """``(N, N)`` Euclidean distances ``||delta_ij||`` between patches, in patches (ConViT Eq. 8)."""
  return np.sqrt(squared_distances(grid))


def nonlocality(attention: Array, grid: TokenGrid, num_prefix_tokens: int = 0) -> Array:
  """ConViT's nonlocality (Eq. 8) per head: ``einsum('nm,hnm->h', dist, A.mean(batch)) / N``.

  Args:
    attention: ``(B, H, T, T)`` or ``(H, T, T)`` probabilities with ``T = prefix + N``.
    grid: the patch grid (``N = grid.num_tokens``).
    num_prefix_tokens: leading class-token rows/columns to drop; patch rows are then
      renormalised over patch keys.
  """
  p = num_prefix_tokens
  if attention.shape[-1] != grid.num_tokens + p:
    raise ValueError(
      f"Attention over {attention.shape[-1]} tokens does not match a {grid.height}x{grid.width} "
      f"grid plus {p} prefix tokens."
    )
  attn = attention[..., p:, p:].astype(jnp.float32)
  if p:
    attn = attn / jnp.sum(attn, axis=-1, keepdims=True)
  if attn.ndim == 4:
    attn = jnp.mean(attn, axis=0)
  return jnp.einsum("nm,hnm->h", distance_matrix(grid), attn) / grid.num_tokens


def attention_centres(pos_proj_kernel: Array) -> tuple[Array, Array]:
  """``(Delta (H, 2) as (dx, dy), span (H,))`` from a ``(3, H)`` Flax ``pos_proj`` kernel.

  Inverts ConViT Eq. 5: ``v_pos = -alpha (1, -2 Delta)`` gives ``span = 1 / alpha``.
  """
  w = jnp.asarray(pos_proj_kernel, jnp.float32).T  # timm's (H, 3) weight
  span = -1.0 / w[:, 2]
  return jnp.stack([w[:, 0] * span / 2, w[:, 1] * span / 2], axis=-1), span


def parameter_statistics(attn_params: Mapping[str, Any]) -> LayerStats:
  """Gate ``sigmoid(lambda_h)`` (ConViT Eq. 7), centre, centre distance and span (Eq. 5) of one
  layer's attention, where it has them."""
  stats: LayerStats = {}
  if "gating_param" in attn_params:
    stats["gate"] = jax.nn.sigmoid(jnp.asarray(attn_params["gating_param"], jnp.float32))
  if "pos_proj" in attn_params:
    centre, span = attention_centres(attn_params["pos_proj"]["kernel"])
    stats["center"] = centre
    stats["center_distance"] = jnp.linalg.norm(centre, axis=-1)
    stats["span"] = span
  return stats


# ------------------------------------------------------------------------------------------------
# Per-layer attention maps


def _check(model: nn.Module, mode: str) -> None:
  if not isinstance(model, VisionTransformer):
    raise ValueError(
      f"Locality analysis needs a VisionTransformer (ViT/DeiT/ConViT), got {type(model).__name__}."
    )
  if mode not in MODES:
    raise ValueError(f"mode={mode!r} is not one of {MODES}.")


def layer_kinds(model: VisionTransformer) -> tuple[str, ...]:
  """The attention kind of each layer ('gpsa', 'mhsa', ...)."""
  return tuple(model.layer_attention or ("mhsa",) * model.depth)


def prefix_tokens(model: VisionTransformer, layer: int) -> int:
  """Class (and distillation) tokens in the input of ``layer`` (ConViT inserts them at
  class_token_layer)."""
  if layer < model.class_token_layer:
    return 0
  return model.num_prefix_tokens


def token_grid(model: VisionTransformer, images: Array) -> TokenGrid:
  """The patch grid of ``model`` on NHWC ``images``: ``(height // patch, width // patch)``."""
  return TokenGrid(images.shape[1] // model.patch_size, images.shape[2] // model.patch_size)


def per_layer_attention(model: VisionTransformer, params: Any, images: Array) -> dict[int, Array]:
  """``{layer: (B, H, T, T)}``: each layer's real attention (class token included if present)."""
  return block_attention_maps(apply_with_intermediates(model, {"params": params}, images)[1])


def faithful_attention(model: VisionTransformer, params: Any, images: Array) -> dict[int, Array]:
  """``{layer: (B, H, N, N)}``: every layer's attention applied to ``patch_embed(images)``."""
  embed = PatchEmbed(model.patch_size, model.embed_dim, model.dtype, model.param_dtype)
  tokens, grid = embed.apply({"params": params["patch_embed"]}, images.astype(model.dtype))
  maps = {}
  for i, kind in enumerate(layer_kinds(model)):
    attn = get_attention(kind)(
      num_heads=model.num_heads,
      head_dim=model.head_dim,
      qkv_bias=model.qkv_bias,
      implementation=model.attention_implementation,
      dtype=model.dtype,
      param_dtype=model.param_dtype,
      **dict((model.attention_kwargs or {}).get(kind) or {}),
    )
    _, state = attn.apply(
      {"params": params[f"blocks_{i}"]["attn"]}, tokens, grid=grid, mutable=["intermediates"]
    )
    if "attention" in state.get("intermediates", {}):
      maps[i] = state["intermediates"]["attention"][0]
  return maps


def layer_statistics(
  model: VisionTransformer, params: Any, images: Array, mode: str = "per_layer"
) -> dict[int, LayerStats]:
  """``{layer: {'nonlocality': (H,), 'gate': (H,), 'center': (H, 2), ...}}``; traceable.

  Layers whose attention module records no map (none of the built-in kinds) get no
  'nonlocality'; layers without a gate or ``pos_proj`` (MHSA) get only 'nonlocality'.
  """
  _check(model, mode)
  params = nn.meta.unbox(params)
  grid = token_grid(model, images)
  if mode == "per_layer":
    maps = per_layer_attention(model, params, images)
    prefixes = {i: prefix_tokens(model, i) for i in maps}
  else:
    maps = faithful_attention(model, params, images)
    prefixes = dict.fromkeys(maps, 0)
  stats = {}
  for i in range(model.depth):
    layer = parameter_statistics(params[f"blocks_{i}"]["attn"])
    if i in maps:
      layer["nonlocality"] = nonlocality(maps[i], grid, prefixes[i])
    if layer:
      stats[i] = layer
  return stats


# ------------------------------------------------------------------------------------------------
# Flat scalar metrics for metrics.jsonl


def flatten(stats: Mapping[int, Mapping[str, Any]]) -> dict[str, float]:
  """``{'locality/<name>/layer_<i>': head mean, 'locality/<name>/layer_<i>/head_<h>': value}``.

  Names: nonlocality, gate, center_distance, span, and center_dx / center_dy per head.
  """
  out: dict[str, float] = {}
  for i, layer in sorted(stats.items()):
    for name, value in sorted(layer.items()):
      value = np.asarray(value, np.float64)
      if name == "center":
        for h, (dx, dy) in enumerate(value):
          out[f"{PREFIX}/center_dx/layer_{i}/head_{h}"] = float(dx)
          out[f"{PREFIX}/center_dy/layer_{i}/head_{h}"] = float(dy)
        continue
      out[f"{PREFIX}/{name}/layer_{i}"] = float(np.mean(value))
      for h, v in enumerate(value):
        out[f"{PREFIX}/{name}/layer_{i}/head_{h}"] = float(v)
  return out


def make_locality_fn(
  model: nn.Module, mode: str = "per_layer", *, out_shardings: Any = None
) -> Callable[[Any, Any], dict[str, float]]:
  """Compiles :func:`layer_statistics` once; returns ``fn(params, images) -> {key: float}``.

  ``params`` may be sharded (call it inside the trainer's mesh context); pass
  ``out_shardings=sharding.replicated(mesh)`` on multi-host runs so the small outputs are
  addressable by every process. ``images`` must be the same on every process.
  """
  _check(model, mode)
  stats_fn = jax.jit(
    lambda params, images: layer_statistics(model, params, images, mode),
    out_shardings=out_shardings,
  )
  return lambda params, images: flatten(jax.device_get(stats_fn(params, images)))


def locality_metrics(
  model: nn.Module, params: Any, images: Any, mode: str = "per_layer"
) -> dict[str, float]:
  """Flat locality metrics of ``params`` on ``images`` (compiles each call: for one-off use;
  loops should keep the function of :func:`make_locality_fn`)."""
  return make_locality_fn(model, mode)(params, images)


def fixed_eval_images(
  config: ml_collections.ConfigDict, num_images: int, source: Any = None
) -> np.ndarray:
  """The first ``num_images`` eval images, preprocessed as for evaluation (NHWC float32).

  Deterministic and identical on every process, so metrics logged over a run compare the same
  images (the official code uses the first validation batch). ``source``: the eval source if
  already built.
  """
  from locvit import data as data_lib

  if num_images < 1:
    raise ValueError(f"num_images={num_images} must be >= 1.")
  if source is None:
    source = data_lib.make_source(config.data, config.data.eval_split)
  num_images = min(num_images, len(source))
  batches = data_lib.make_eval_iterator(config.data, source, local_batch_size=num_images)
  images = next(iter(batches))["image"]  # uint8, as the eval step receives them
  return data_lib.augment.normalize(images, tuple(config.data.mean), tuple(config.data.std))


def make_locality_logger(
  config: ml_collections.ConfigDict, model: nn.Module, mesh: Any = None, eval_source: Any = None
) -> Callable[[Any], dict[str, float]] | None:
  """The trainer's hook: ``None`` unless ``config.analysis.locality``, else ``fn(params)``.

  ``fn`` returns the flat metrics of ``params`` on the first ``analysis.locality_num_images``
  eval images, in ``analysis.locality_mode``; compiled once. With a ``mesh`` the images are
  placed replicated on it (identical on every process) and so are the outputs, so ``params`` may
  be sharded any way.
  """
  analysis = config.analysis
  if analysis is None or not analysis.locality:
    return None
  mode = analysis.locality_mode
  _check(model, mode)
  images = fixed_eval_images(config, analysis.locality_num_images, eval_source)
  if mesh is None:
    fn = make_locality_fn(model, mode)
    return lambda params: fn(params, images)
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  placed = jax.make_array_from_callback(images.shape, replicated, lambda index: images[index])
  fn = make_locality_fn(model, mode, out_shardings=replicated)
  return lambda params: fn(params, placed)
