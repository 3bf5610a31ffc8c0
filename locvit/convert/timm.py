"""timm / official PyTorch state dicts -> Flax variables for locvit's ConViT and DeiT models.

The key mapping is derived from the locvit parameter tree itself (``jax.eval_shape`` of
``model.init``), so every registered ConViT / DeiT size, resolution and depth override converts
with the same rules:

- path: ``blocks_3/attn/qk/kernel`` <-> ``blocks.3.attn.qk.weight`` (``kernel`` and LayerNorm
  ``scale`` are PyTorch's ``weight``);
- Linear weights are ``(out, in)`` in PyTorch: transposed, then reshaped to locvit's
  ``DenseGeneral`` kernels, e.g. ``qkv`` ``(3C, C)`` -> ``(C, 3, H, Dh)`` (PyTorch output index
  ``t*C + h*Dh + d``) and ``attn.proj`` ``(C, C)`` -> ``(H, Dh, C)``;
- the patch-embedding conv ``(out, in, kh, kw)`` -> ``(kh, kw, in, out)``;
- everything else (``cls_token``, ``pos_embed``, ``gating_param``) keeps its shape.

Conversion is strict: missing, unexpected and mis-shaped keys are all reported in one error.
Torch is optional: NumPy arrays are accepted, torch tensors are converted when present.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Mapping
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np

from locvit.models import create_model, default_image_size, list_models
from locvit.models.vit import VisionTransformer

SUPPORTED_PREFIXES = ("convit_", "deit_")


class ConversionError(ValueError):
  """A state dict that does not match the target model; the message lists every problem."""


def supported_models() -> list[str]:
  """Registered names ``from_timm`` converts, timm's included (``deit_tiny_patch16_224``)."""
  return [n for n in list_models() if n.startswith(SUPPORTED_PREFIXES)]


def resolve_model_name(model_name: str) -> str:
  """Maps a timm name (optionally with a ``.pretrained_tag``) to a registered locvit name."""
  name = model_name.split(".", 1)[0]
  if name not in supported_models():
    close = difflib.get_close_matches(name, supported_models(), n=1)
    hint = f"; did you mean {close[0]}?" if close else "."
    raise ValueError(
      f"Cannot convert {model_name!r}: not a supported model{hint} Supported: {supported_models()}."
    )
  return name


DISTILLED = "_distilled"  # timm's deit_*_distilled_*: a distillation token and head_dist


def resolve_timm_name(model_name: str) -> tuple[str, dict[str, Any]]:
  """A timm name (optionally with a ``.pretrained_tag``) as ``(registered locvit name,
  overrides)``: timm's distilled DeiT, ``deit_tiny_distilled_patch16_224``, is
  ``('deit_tiny_patch16_224', {'distilled': True})``."""
  name = model_name.split(".", 1)[0]
  if DISTILLED not in name:
    return resolve_model_name(name), {}
  return resolve_model_name(name.replace(DISTILLED, "")), {"distilled": True}


def _torch_key(path: tuple[str, ...]) -> str:
  parts = []
  for part in path:
    block = re.fullmatch(r"blocks_(\d+)", part)
    if block:
      parts += ["blocks", block.group(1)]
    elif part in ("kernel", "scale"):
      parts.append("weight")
    else:
      parts.append(part)
  return ".".join(parts)


def _layout(path: tuple[str, ...], shape: tuple[int, ...]) -> str:
  """How a PyTorch tensor is laid out relative to the locvit parameter at ``path``."""
  if path[-1] == "kernel" and path[0] == "patch_embed":
    return "conv"
  if path[-1] == "kernel":
    # attn.proj reads (H, Dh) inputs; every other Dense reads one input axis.
    return "linear2" if path[-3:-1] == ("attn", "proj") else "linear1"
  if path[-1] == "bias":
    return "flat"
  return "same"


def _torch_shape(layout: str, shape: tuple[int, ...]) -> tuple[int, ...]:
  if layout == "conv":
    kh, kw, cin, cout = shape
    return (cout, cin, kh, kw)
  if layout.startswith("linear"):
    n_in = int(layout[-1])
    return (math.prod(shape[n_in:]), math.prod(shape[:n_in]))
  if layout == "flat":
    return (math.prod(shape),)
  return tuple(shape)


def _to_flax(layout: str, value: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
  if layout == "conv":
    return value.transpose(2, 3, 1, 0)
  if layout.startswith("linear"):
    return value.T.reshape(shape)
  return value.reshape(shape)


def to_numpy(value: Any) -> np.ndarray:
  """NumPy view of an array-like; torch tensors (incl. bfloat16) without importing torch."""
  if hasattr(value, "detach"):  # torch.Tensor
    value = value.detach().cpu()
    if str(value.dtype) == "torch.bfloat16":
      value = value.float()  # NumPy has no bfloat16
    return value.numpy()
  return np.asarray(value)


def expected_state_dict_shapes(
  model_name: str, *, image_size: int | None = None, **overrides: Any
) -> dict[str, tuple[int, ...]]:
  """timm key -> PyTorch shape expected for ``create_model(model_name, **overrides)`` on
  ``image_size`` inputs (default: the model's own)."""
  plan = _plan(model_name, overrides, image_size)
  return {key: torch_shape for key, (_, _, _, torch_shape) in plan.items()}


def _plan(
  model_name: str, overrides: Mapping[str, Any], image_size: int | None = None
) -> dict[str, tuple]:
  """timm key -> (locvit path, locvit shape, layout, torch shape)."""
  name, implied = resolve_timm_name(model_name)
  model = create_model(name, **implied, **overrides)
  if not isinstance(model, VisionTransformer) or (model.pos_embed, model.pool) != (
    "learn",
    "token",
  ):
    raise ValueError(f"{name!r} is not a class-token ViT with a learned pos_embed.")
  size = image_size or default_image_size(name)
  abstract = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, size, size, 3)))
  params = flax.linen.meta.unbox(abstract["params"])
  plan = {}
  for path, leaf in flax.traverse_util.flatten_dict(params).items():
    shape = tuple(leaf.shape)
    layout = _layout(path, shape)
    plan[_torch_key(path)] = (path, shape, layout, _torch_shape(layout, shape))
  return plan


def from_timm(
  model_name: str,
  state_dict: Mapping[str, Any],
  *,
  image_size: int | None = None,
  **overrides: Any,
) -> dict[str, dict[str, Any]]:
  """Converts a timm (or official ConViT/DeiT) state dict into Flax variables.

  Args:
    model_name: a registered ConViT/DeiT name (``supported_models()``, which include timm's
      ``convit_tiny`` and ``deit_tiny_patch16_224``), or timm's distilled DeiT name
      (``deit_tiny_distilled_patch16_224``: ``distilled=True``); a ``.pretrained_tag`` suffix is
      ignored.
    state_dict: timm key -> ``np.ndarray`` or ``torch.Tensor``.
    image_size: the input side the checkpoint's ``pos_embed`` covers (default: the model's own;
      ``locvit.convert.load_pretrained`` resamples it to another).
    **overrides: ``create_model`` overrides the checkpoint was trained with, e.g.
      ``num_classes=100`` for a fine-tuned head.

  Returns:
    ``{'params': ...}`` for ``create_model(name, **implied, **overrides).apply``, where
    ``name, implied = resolve_timm_name(model_name)``.

  Raises:
    ConversionError: listing every missing, unexpected and mis-shaped key.
  """
  plan = _plan(model_name, overrides, image_size)
  arrays = {key: to_numpy(value) for key, value in state_dict.items()}
  missing = [f"  {k}: expected {plan[k][3]}" for k in plan if k not in arrays]
  unexpected = [f"  {k}: shape {tuple(arrays[k].shape)}" for k in arrays if k not in plan]
  misshaped = [
    f"  {k}: expected {plan[k][3]}, got {tuple(arrays[k].shape)}"
    for k in plan
    if k in arrays and tuple(arrays[k].shape) != plan[k][3]
  ]
  if missing or unexpected or misshaped:
    sections = [
      (f"{len(lines)} {title} key(s):", lines)
      for title, lines in (
        ("missing", missing),
        ("unexpected", unexpected),
        ("mis-shaped", misshaped),
      )
      if lines
    ]
    hint = ""
    if any(line.startswith("  head.") for line in misshaped):
      hint = "\n(A different classifier width? Pass num_classes=... to from_timm.)"
    raise ConversionError(
      f"State dict does not match {model_name.split('.', 1)[0]!r}"
      f"{f' with overrides {dict(overrides)}' if overrides else ''}:\n"
      + "\n".join(header + "\n" + "\n".join(lines) for header, lines in sections)
      + hint
    )
  flat = {
    path: jnp.asarray(_to_flax(layout, arrays[key], shape), dtype=jnp.float32)
    for key, (path, shape, layout, _) in plan.items()
  }
  return {"params": flax.traverse_util.unflatten_dict(flat)}
