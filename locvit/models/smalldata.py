"""The small-data backbones of Li & Zhang's GMM paper (Swin, CaiT, PiT, T2T): shared registration
and attention validation.

Each backbone is registered plain and with the GMM mask in every attention layer
(``mask_attention_kwargs`` defaults, K = 5): ``{gmm_}{family}_smalldata_{variant}``, e.g.
``gmm_swin_smalldata_patch2_32``. ``create_model`` calls the backbone's ``check()``, which
validates the attention kind and its mask options with ``check_attention``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from locvit.attention import list_attention
from locvit.attention.masks import MASK_KINDS, mask_attention_kwargs, split_mask_options

MASKS = (None, "gmm")  # registered variants: plain attention and the GMM paper's masked model


class SmallDataBackbone(nn.Module):
  """Fields shared by the small-data backbones (each adds its sizes after these).

  Attributes:
    num_classes: classifier width (0 returns the pooled features).
    attention: attention kind of the blocks ('mhsa', 'gmm', 'elm', ...; see ``check``).
    attention_kwargs: per kind, the mask options, e.g. ``{'gmm': {'num_kernels': 5}}``.
    drop_rate, drop_path_rate: dropout and stochastic depth.
    norm_eps: LayerNorm epsilon (PyTorch's 1e-5, as the official code).
    attention_implementation: the kernel setting of every layer (``locvit.platform.ops``; None is
      resolved by ``create_model``).
  """

  num_classes: int
  attention: str = "mhsa"
  attention_kwargs: Mapping[str, Any] | None = None
  drop_rate: float = 0.0
  drop_path_rate: float = 0.1
  norm_eps: float = 1e-5
  dtype: Any = jnp.float32
  param_dtype: Any = jnp.float32
  attention_implementation: str | None = None

  def attention_options(self) -> Mapping[str, Any] | None:
    """``attention_kwargs[attention]``: the options of the blocks' attention kind, or None."""
    return (self.attention_kwargs or {}).get(self.attention)


def check_attention(
  backbone: str,
  attention: str,
  attention_kwargs: Mapping[str, Any] | None,
  valid: Sequence[str] | None = None,
) -> None:
  """Raises ValueError naming the valid choices when ``attention`` is not one of ``valid``
  (default: every registered kind) or its mask options in ``attention_kwargs`` are invalid."""
  valid = tuple(valid or list_attention())
  if attention not in valid:
    raise ValueError(f"{backbone} attention={attention!r} is not one of {valid}.")
  if attention in MASK_KINDS:
    split_mask_options(attention, (attention_kwargs or {}).get(attention))


def smalldata_model(
  backbone: type[nn.Module], num_classes: int, *, mask: str | None, **fields: Any
) -> nn.Module:
  """``backbone`` with ``mask`` (None: plain attention; 'gmm' / 'elm') in every attention layer."""
  return backbone(
    num_classes=num_classes,
    attention=mask or "mhsa",
    attention_kwargs=mask_attention_kwargs(mask) if mask else None,
    **fields,
  )


def smalldata_models(
  family: str, backbone: type[nn.Module], variants: Mapping[str, tuple[int, Mapping[str, Any]]]
) -> dict[str, tuple[Callable[[int], nn.Module], int]]:
  """The family's model table: ``{mask_}{family}_smalldata_{variant}`` for every mask in
  ``MASKS`` -> (build(num_classes), image size); ``variants`` maps a name suffix to
  ``(image size, backbone fields)``."""
  return {
    f"{mask + '_' if mask else ''}{family}_smalldata_{variant}": (
      functools.partial(smalldata_model, backbone, mask=mask, **fields),
      image_size,
    )
    for variant, (image_size, fields) in variants.items()
    for mask in MASKS
  }


def check_stages(depths: Sequence[int], num_heads: Sequence[int]) -> None:
  """Raises ValueError when a staged backbone's ``depths`` and ``num_heads`` differ in length."""
  if len(depths) != len(num_heads):
    raise ValueError(f"depths {tuple(depths)} and num_heads {tuple(num_heads)} differ.")
